"""Thread holds attacked through stale references: a saved bound ``__exit__`` called
again, and blocks left by the cyclic garbage collector. A hold must never release or
report the permit of a later caller; a hold dropped while held returns its permit (C20),
and a block left after its hold's finalizer ran releases nothing more."""

from __future__ import annotations

import gc
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from lanequeue import Lane, LaneQueue, SessionLane

LANES = [lambda: Lane("l", max_concurrent=1), lambda: SessionLane()]

@pytest.mark.parametrize("make", LANES)
def test_saved_bound_exit_called_again_never_ends_the_next_callers_hold(
    make: Callable[[], Any],
) -> None:
    """Leaving twice through a kept bound ``__exit__`` (an idempotent cleanup) is a
    no-op: it never ends the hold of the caller that came next (holds are never reused,
    so the method reaches only its own, released hold)."""
    lane = make()
    leave = lane.acquire("k").__enter__().__exit__  # the only reference to the hold
    leave(None, None, None)
    assert lane.stats.holders == 0
    with lane.acquire("k", timeout_s=0) as other:  # the next caller
        leave(None, None, None)  # the first caller's cleanup, run once more
        assert other.held, "the first caller's __exit__ ended the next caller's hold"
        assert lane.stats.holders == 1
        assert not lane.try_acquire("k")  # the permit is still the next caller's


def test_saved_bound_exit_of_acquire_all_never_ends_the_next_callers_holds() -> None:
    queue = LaneQueue()
    session = queue.add_session_lane("session")
    glob = queue.add_lane("global", max_concurrent=1)
    leave = queue.acquire_all("k", ["session", "global"]).__enter__().__exit__
    leave(None, None, None)
    with queue.acquire_all("k", ["session", "global"], timeout_s=0):
        leave(None, None, None)
        assert session.is_held("k"), "the first caller's __exit__ ended the next one's"
        assert glob.active_count == 1
    assert session.stats.holders == glob.stats.holders == 0


def _left_by_the_cyclic_gc(cm: Callable[[], Any]) -> None:
    """Enter ``cm()`` inside a generator that sits in a reference cycle, and let the
    cyclic garbage collector end it: the generator's finalizer leaves the block (the
    hold's ``__exit__``), and the same collection runs the hold's own finalizer."""

    class Job:
        def __init__(self) -> None:
            self.steps = self.run()  # Job -> generator -> frame -> Job: a cycle

        def run(self) -> Iterator[None]:
            with cm():
                yield

    job = Job()
    next(job.steps)
    del job
    gc.collect()


@pytest.mark.filterwarnings("ignore::ResourceWarning")
@pytest.mark.parametrize("make", LANES)
def test_hold_dropped_after_a_block_left_by_the_cyclic_gc_returns_its_permit(
    make: Callable[[], Any],
) -> None:
    """A block left by the cyclic GC (a generator in a reference cycle), then a hold
    dropped while held: the first releases once, the second returns its permit (C20)."""
    lane = make()
    _left_by_the_cyclic_gc(lambda: lane.acquire("k"))
    assert lane.stats.holders == 0
    lane.acquire("k", timeout_s=0).__enter__()  # entered, then dropped while held
    gc.collect()
    assert lane.try_acquire("k"), "the dropped hold kept its permit"
    assert lane.manual_release("k")
    assert lane.stats.holders == 0


@pytest.mark.filterwarnings("ignore::ResourceWarning")
def test_multi_hold_dropped_after_a_block_left_by_the_cyclic_gc_returns_its_permit() -> None:
    """The same for an ``acquire_all`` multi-hold."""
    queue = LaneQueue()
    session = queue.add_session_lane("session")
    glob = queue.add_lane("global", max_concurrent=1)
    names = ["session", "global"]
    _left_by_the_cyclic_gc(lambda: queue.acquire_all("k", names))
    assert session.stats.holders == glob.stats.holders == 0
    queue.acquire_all("k", names, timeout_s=0).__enter__()  # dropped while held
    gc.collect()
    assert session.try_acquire("k") and glob.try_acquire("k"), "the permits were kept"
    assert session.manual_release("k") and glob.manual_release("k")


@pytest.mark.filterwarnings("ignore::ResourceWarning")
@pytest.mark.parametrize("make", LANES)
def test_block_left_by_the_cyclic_gc_counts_no_unmatched_release(
    make: Callable[[], Any],
) -> None:
    """Input: a hold made before a generator that enters it, both in a reference cycle
    collected by the cyclic GC (so the hold's finalizer runs first, and the block is
    left after it). Expected: the permit returns once and no unmatched release is
    counted (the finalizer marks the hold ended before the block's exit runs)."""
    lane = make()

    class Job:
        def __init__(self, hold: Any) -> None:
            self.hold = hold
            self.steps = self.run()  # Job -> generator -> frame -> Job: a cycle

        def run(self) -> Iterator[None]:
            hold, self.hold = self.hold, None
            with hold:
                yield

    job = Job(lane.acquire("k"))  # the hold is older than the generator
    next(job.steps)
    del job
    gc.collect()
    st = lane.stats
    assert (st.holders, st.released) == (0, 1)
    assert st.unmatched_releases == 0


@pytest.mark.parametrize("held", [False, True], ids=["released", "dropped-held"])
@pytest.mark.parametrize("kind", ["session", "lane", "acquire_all"])
def test_interrupt_at_a_finalizers_start_is_swallowed_by_cpython_and_changes_nothing(
    kind: str, held: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The README's one limit of "Interrupts": a KeyboardInterrupt landing at the start
    of a hold's ``__del__`` (a trace function stands in for the signal) goes to CPython's
    unraisable hook ("Exception ignored"), not to the program. The lane is as it would be
    without the finalizer: a released hold leaves nothing held; a hold dropped while held
    (its finalizer stopped before returning the permit) stays visible in ``get_active()``
    and ``manual_release`` ends it; the counters agree with the holds."""
    import sys

    queue = LaneQueue()
    session = queue.add_session_lane("s")
    counting = queue.add_lane("g", max_concurrent=2)
    target = {"session": [session], "lane": [counting],
              "acquire_all": [session, counting]}[kind]
    unraisable: list[Any] = []
    monkeypatch.setattr(sys, "unraisablehook", unraisable.append)

    def tracer(frame: Any, event: str, arg: Any) -> Any:
        if event == "call" and frame.f_code.co_name == "__del__":
            sys.settrace(None)
            raise KeyboardInterrupt
        return None

    hold: Any = (queue.acquire_all("k", ["s", "g"]) if kind == "acquire_all"
                 else target[0].acquire("k"))
    hold.__enter__()
    if not held:  # released, not left: leaving its block would shed the finalizer
        hold.release()
    sys.settrace(tracer)
    try:
        del hold  # freed here: its __del__ starts, and the interrupt lands there
    finally:
        sys.settrace(None)
    assert [u.exc_type for u in unraisable] == [KeyboardInterrupt]
    for lane in target:
        stats = lane.stats
        assert stats.holders == lane.active_count == (1 if held else 0)
        assert stats.acquired == stats.released + stats.holders
        if held:
            assert "k" in lane.get_active()
            assert lane.manual_release("k")
        assert lane.stats.holders == 0


def test_a_dropped_holds_warning_shows_where_the_hold_was_made() -> None:
    """The ResourceWarning of a hold dropped while held comes from the garbage
    collector; its source is the hold, so that ``-X tracemalloc`` shows where it was
    made: a lane's hold and an ``acquire_all``'s, thread and asyncio."""
    import asyncio
    import sys
    import tracemalloc
    import warnings

    from lanequeue import AsyncSessionLane

    queue = LaneQueue()
    queue.add_session_lane("session")
    lines: list[int] = []

    def drop_thread_holds() -> None:
        SessionLane().acquire("k").__enter__()
        lines.append(sys._getframe().f_lineno - 1)
        queue.acquire_all("k", ["session"]).__enter__()
        lines.append(sys._getframe().f_lineno - 1)

    async def drop_async_hold() -> None:
        await AsyncSessionLane().acquire("k").__aenter__()
        lines.append(sys._getframe().f_lineno - 1)

    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        tracemalloc.start(50)
        try:
            drop_thread_holds()
            asyncio.run(drop_async_hold())
            gc.collect()
            dropped = [w for w in seen if issubclass(w.category, ResourceWarning)
                       and "without release" in str(w.message)]
            made = [tracemalloc.get_object_traceback(w.source) for w in dropped]
        finally:
            tracemalloc.stop()
    assert len(made) == 3, [str(w.message) for w in seen]
    where = [{(frame.filename, frame.lineno) for frame in tb or ()} for tb in made]
    assert all(any((__file__, line) in w for w in where) for line in lines), (lines, where)
