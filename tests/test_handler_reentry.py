"""Log handlers and finalizers that run inside a lane's own work.

A finalizer may run at any allocation, also while this thread is inside a lane's lock
or inside the decision of who logs a long hold; the warning it gives (a hold dropped
while held) goes to the user's warning or log handler, which may call a view of the
lane (``status()``, ``stuck()``). And a log handler may raise. None of it may hang a
thread, end a wait, or corrupt a lane's counts.
"""

from __future__ import annotations

import logging
import threading
import warnings
from collections import OrderedDict
from collections.abc import Iterator
from typing import Any

import pytest
from conftest import FakeClock

from lanequeue import Lane, SessionLane, _ops
from lanequeue._obs import HELD_BATCH, HOLD_BUCKETS, Histogram

pytestmark = pytest.mark.timeout(30)


@pytest.fixture
def quiet_lanequeue() -> Iterator[None]:
    """The lanequeue logger's records go nowhere else during the test."""
    logger = logging.getLogger("lanequeue")
    propagate = logger.propagate
    logger.propagate = False
    try:
        yield
    finally:
        logger.propagate = propagate


@pytest.fixture
def lines(quiet_lanequeue: None) -> Iterator[list[str]]:
    """The messages of the lanequeue logger's records during the test."""
    seen: list[str] = []
    handler = logging.Handler()
    handler.emit = lambda record: seen.append(record.getMessage())  # type: ignore[method-assign]
    logging.getLogger("lanequeue").addHandler(handler)
    try:
        yield seen
    finally:
        logging.getLogger("lanequeue").removeHandler(handler)


@pytest.mark.parametrize("make", [SessionLane, Lane])
def test_a_check_made_inside_the_decision_of_who_logs_does_not_hang(
    make: Any, lines: list[str]
) -> None:
    """A check (``status()``) made by a thread that is already inside the decision of
    who logs a long hold, as a finalizer's warning handler is when the collector runs at
    an allocation there (the reporter thread's ``_hold_ended``, a check's own
    ``_held_now``), returns and logs the hold once. The decision's lock was a plain
    Lock: that thread hung, and every check of every lane after it."""
    clock = FakeClock()
    lane = make("reentry", warn_hold_s=1.0, clock=clock, warn_after_s=None)
    done = threading.Event()

    def inside() -> None:
        with _ops._WARNED:  # as a finalizer run inside the decision finds it
            lane.status()
            lane.stuck(0)
        done.set()

    assert lane.try_acquire("k")
    clock.advance(2.0)
    worker = threading.Thread(target=inside, daemon=True)
    worker.start()
    assert done.wait(10), "a check inside the decision hung"
    held = [line for line in lines if "has held its permit" in line]
    assert len(held) == 1 and "'k'" in held[0]
    assert lane.manual_release("k")


class _FoldHook(Histogram):
    """The core's hold-time list, with a hook run at the start of each fold (where the
    collector may run a finalizer: the fold allocates)."""

    hook: Any = None

    def fold(self) -> None:
        hook, self.hook = self.hook, None
        if hook is not None:
            hook()
        super().fold()


def test_a_view_a_dropped_holds_warning_calls_inside_a_release_changes_nothing_there(
    quiet_lanequeue: None,
) -> None:
    """A hold dropped while held, finalized inside another hold's release (under the
    core's lock), warns; the warning's handler calls ``status()``, which ends the
    dropped holds first. That ending ran a release inside the outer release (the core's
    lock is an RLock): the two folds of the hold times ran into each other, and the
    outer release raised ``ValueError: max() arg is an empty sequence`` with its hold
    still held. Now the view leaves the dropped hold to the next operation: the outer
    release ends its hold, the next operation ends the dropped one, and every hold time
    is counted once."""
    clock = FakeClock()
    lane = SessionLane("fold", warn_hold_s=1000.0, clock=clock, warn_after_s=None)
    core: Any = lane._core
    hooked = _FoldHook(HOLD_BUCKETS)
    hooked.extend(core.hold_hist)
    core.hold_hist = hooked
    for i in range(HELD_BATCH - 1):  # hold times waiting: the outer release folds
        with lane.acquire(f"k{i}"):
            clock.advance(0.001 * 10 ** (i % 5))  # (spread over buckets)
    box: dict[str, Any] = {"dropped": lane.acquire("dropped")}
    box["dropped"].__enter__()
    clock.advance(0.5)
    outer = lane.acquire("outer")
    outer.__enter__()
    clock.advance(0.25)
    views: list[dict[str, Any]] = []

    def finalize_inside() -> None:  # the collector, at the fold's first allocation
        del box["dropped"]  # its finalizer runs now, inside the outer release

    with warnings.catch_warnings():
        warnings.simplefilter("always")
        warnings.showwarning = lambda *a, **k: views.append(lane.status())
        hooked.hook = finalize_inside
        outer.release()  # raised ValueError; the nested release ended 'dropped' here
    assert len(views) == 1  # the warning came, inside the release
    assert len(core._dropped) == 1  # 'dropped': left to the next operation
    assert core._entries["dropped"].token  # still held
    assert not core.owns("outer", outer.token)
    assert lane.active_count == 0  # an operation: it ends the dropped hold
    assert not core._dropped and not lane.is_held("dropped")
    snap = core.hold_hist.snapshot()
    assert sum(snap.counts) == HELD_BATCH + 1  # each hold time once, 'dropped' included
    spread = sum(0.001 * 10 ** (i % 5) for i in range(HELD_BATCH - 1))
    assert snap.sum == pytest.approx(spread + 0.75 + 0.25)


@pytest.mark.parametrize("make", [SessionLane, Lane])
def test_a_check_run_inside_another_checks_decision_logs_a_hold_once(
    make: Any, lines: list[str]
) -> None:
    """The collector may run a finalizer at any object a check makes while it decides
    whether to log a hold (its ``(key, token)``, a list copy); the finalizer's warning
    handler may run a check of its own on the same thread, which logs the hold first.
    The outer check had passed its test already and logged the hold a second time.
    Driven: the decision's first look at the ends seen runs the inner check."""
    clock = FakeClock()
    lane = make("twice", warn_hold_s=1.0, clock=clock, warn_after_s=None)
    inner: list[int] = []

    class Seen(dict):  # type: ignore[type-arg]
        def __contains__(self, mark: object) -> bool:
            if not inner:
                inner.append(1)
                lane.status()  # the finalizer's handler: a check inside the decision
            return super().__contains__(mark)

    lane._ends_seen = Seen()
    assert lane.try_acquire("k")
    clock.advance(5.0)
    lane.stuck(0)
    assert inner == [1]
    assert [line for line in lines if "has held its permit" in line] == [
        "lane 'twice': key 'k' has held its permit for 5.000 s (token 1)"]
    assert lane.manual_release("k")


@pytest.mark.parametrize("make", [SessionLane, Lane])
@pytest.mark.parametrize("breaks", ["the long-hold line", "every line and on_wait"])
def test_a_handler_that_raises_does_not_end_a_wait(
    make: Any, breaks: str, quiet_lanequeue: None
) -> None:
    """A slow wait's warning checks the long holds. A log handler that raised on the
    long-hold line made the waiting ``acquire`` raise its error (the wait given up) and
    skipped ``on_wait``; one that raised on every line, with an ``on_wait`` that raises
    too, did the same from the line that reports ``on_wait``'s error. Now the wait goes
    on, ``on_wait`` is called, and the permit comes when the holder releases."""
    called = threading.Event()
    every = breaks != "the long-hold line"

    def on_wait(*args: Any) -> None:
        called.set()
        if every:
            raise ValueError("on_wait broke")

    lane = make("broken", warn_after_s=0.05, warn_hold_s=0.01, on_wait=on_wait,
                **({"max_concurrent": 1} if make is Lane else {}))

    class Broken(logging.Handler):
        def handle(self, record: logging.LogRecord) -> bool:
            if every or "has held its permit" in record.getMessage():
                raise RuntimeError("log sink down")
            return True

    broken = Broken()
    logging.getLogger("lanequeue").addHandler(broken)
    got: list[Any] = []

    def waiter() -> None:
        try:
            with lane.acquire("k", timeout_s=20):
                got.append("granted")
        except BaseException as exc:  # (reported below)
            got.append(exc)

    try:
        assert lane.try_acquire("k")
        worker = threading.Thread(target=waiter, daemon=True)
        worker.start()
        assert called.wait(10), f"on_wait was not called: {got}"
        assert lane.manual_release("k")
        worker.join(10)
        assert got == ["granted"]
    finally:
        logging.getLogger("lanequeue").removeHandler(broken)


class _HookedOrder(OrderedDict):  # type: ignore[type-arg]
    """A session core's eviction order that runs ``hook`` once, when the eviction reads
    it through ``method`` (``items``: a step of a pass; ``keys``: the rebuild's copy), as
    the collector may at that read's allocation."""

    hook: Any = None
    method = "items"

    def _maybe(self, name: str) -> None:
        hook = type(self).hook
        if hook is not None and name == type(self).method:
            type(self).hook = None
            hook()

    def items(self) -> Any:
        self._maybe("items")
        return super().items()

    def keys(self) -> Any:
        self._maybe("keys")
        return super().keys()


@pytest.mark.parametrize("where", ["items", "keys"])
def test_a_view_a_dropped_holds_warning_calls_inside_an_eviction_pass_evicts_nothing_there(
    where: str, quiet_lanequeue: None,
) -> None:
    """A hold dropped while held, finalized inside an eviction pass (a view's, under the
    core's lock), warns; the warning's handler calls ``session_count``. That view ran
    eviction passes of its own inside the outer one, which holds the tables in its
    locals: the entries both evicted were counted twice in ``evicted``, and when the
    nested view came during the outer pass's rebuild (between its copies of the two
    tables), 64 entries evicted by the nested view came back with the copy, missing from
    the eviction order: never evicted again, counted live for good. Now the nested view
    counts the registry as it is and evicts nothing. Driven: the outer pass's read of
    the order (``items``: its first step; ``keys``: the rebuild's copy) runs the
    finalizer."""
    clock = FakeClock()
    lane = SessionLane("evict", max_sessions=100_000, idle_timeout_s=10.0, clock=clock,
                       warn_after_s=None)
    core: Any = lane._core
    made = 5000  # over 4 x the rebuild's minimum: the tables are rebuilt as they empty
    for i in range(made):
        with lane.acquire(f"k{i}"):
            pass
    box: dict[str, Any] = {"dropped": lane.acquire("dropped")}
    box["dropped"].__enter__()
    clock.advance(11.0)  # every idle entry has expired
    views: list[int] = []

    def finalize_inside() -> None:  # the collector, at the pass's read
        del box["dropped"]  # its finalizer runs now, inside the outer pass

    _HookedOrder.method = where
    _HookedOrder.hook = finalize_inside
    core._order = _HookedOrder(core._order)
    with warnings.catch_warnings():
        warnings.simplefilter("always")
        warnings.showwarning = lambda *a, **k: views.append(lane.session_count)
        outer = lane.session_count
    assert _HookedOrder.hook is None  # the read came
    assert len(views) == 1 and views[0] > 1  # the nested view counted, evicting nothing
    assert outer == 1  # 'dropped', still held: left to the next operation
    assert lane.stats.evicted == made
    assert lane.active_count == 0  # an operation: it ends the dropped hold
    clock.advance(11.0)
    assert lane.session_count == 0
    assert not core._entries and not core._order
    assert lane.stats.evicted == made + 1  # each entry once
