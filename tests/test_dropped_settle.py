"""A hold dropped while a lane's lock is taken still reaches the waiter already parked.

A dropped hold's finalizer must not take the core's lock (it may run inside an operation
of its own thread, under that lock). When the lock is taken, by this thread or another,
the settler thread ends the hold once the lock is free: the waiter in line gets the
permit when that operation ends, not at the lane's next operation (here there is none:
on the old code the waiter sat until its timeout).

Driven by holding the core's lock explicitly (what an operation in progress does) while
the hold is dropped; no view is called after the drop (a view would end it itself).
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import os
import subprocess
import sys
import threading
import time
import warnings
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from lanequeue import AsyncSessionLane, Lane, LaneQueue, LaneTimeoutError, SessionLane, _core

pytestmark = pytest.mark.timeout(30)

WAIT_S = 20.0  # the waiter's own timeout: far beyond what the hand-off may take
GRANT_S = 5.0  # the hand-off must come well within this once the lock is free


@pytest.fixture(autouse=True)
def _quiet_drops() -> Iterator[None]:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ResourceWarning)
        yield


def _waiter(enter: Callable[[], Any]) -> tuple[threading.Thread, threading.Event, list[Any]]:
    granted = threading.Event()
    errors: list[Any] = []

    def run() -> None:
        try:
            with enter():
                granted.set()
        except BaseException as exc:  # pragma: no cover - reported by the test
            errors.append(exc)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread, granted, errors


def _until(cond: Callable[[], bool]) -> None:
    deadline = time.monotonic() + GRANT_S
    while not cond():
        assert time.monotonic() < deadline, "the waiter never joined the line"
        time.sleep(0.005)


@contextlib.contextmanager
def _operating(core: Any) -> Iterator[None]:
    """Another thread's operation on ``core`` in progress (its lock taken) for the
    ``with`` block, then ended."""
    inside, leave = threading.Event(), threading.Event()

    def operate() -> None:
        with core._lock:
            inside.set()
            leave.wait(WAIT_S)

    other = threading.Thread(target=operate, daemon=True)
    other.start()
    try:
        assert inside.wait(GRANT_S)
        yield
    finally:
        leave.set()
        other.join(GRANT_S)


def _lanes() -> list[tuple[str, Callable[[], Any], Callable[[], Any], Any]]:
    """(name, enter for the holder, enter for the waiter, the core whose lock to take)."""
    session = SessionLane("s", timeout_s=WAIT_S)
    counting = Lane("g", max_concurrent=1, timeout_s=WAIT_S)
    queue = LaneQueue()
    queue.add(SessionLane("session", timeout_s=WAIT_S))
    global_lane = queue.add(Lane("global", max_concurrent=1, timeout_s=WAIT_S))
    return [
        ("SessionLane", lambda: session.acquire("k"), lambda: session.acquire("k"),
         session),
        ("Lane", lambda: counting.acquire("a"), lambda: counting.acquire("b"), counting),
        # Another key's session: the waiter waits for the global permit only.
        ("acquire_all", lambda: queue.acquire_all("k1", ["session", "global"]),
         lambda: queue.acquire_all("k2", ["session", "global"]),
         (global_lane, global_lane._core)),
    ]


def _case(index: int) -> tuple[Callable[[], Any], Callable[[], Any], Any, Any]:
    _, hold, wait, lane = _lanes()[index]
    if isinstance(lane, tuple):
        watched, core = lane
    else:
        watched, core = lane, lane._core
    return hold, wait, watched, core


CASES = [name for name, *_ in _lanes()]


def _parked_behind(index: int) -> tuple[Any, Any, tuple[threading.Thread, threading.Event,
                                                         list[Any]]]:
    """Case ``index``: a hold entered, and a waiter thread parked behind it. The hold,
    the core whose lock to take, and the waiter (see :func:`_waiter`)."""
    hold_of, wait_for, watched, core = _case(index)
    hold = hold_of()
    hold.__enter__()
    waiter = _waiter(wait_for)
    _until(lambda: watched.stats.waiters == 1)
    return hold, core, waiter


@pytest.mark.parametrize("index", range(len(CASES)), ids=CASES)
def test_dropped_inside_this_threads_operation(index: int) -> None:
    hold, core, (thread, granted, errors) = _parked_behind(index)
    with core._lock:  # an operation of this thread in progress
        del hold
        gc.collect()  # (no cycle: the drop came at the del; any cycle's too)
        assert not granted.wait(0.2)  # the lock is taken: nothing handed over yet
    assert granted.wait(GRANT_S), "the dropped hold's permit never reached the waiter"
    thread.join(GRANT_S)
    assert not errors


@pytest.mark.parametrize("index", range(len(CASES)), ids=CASES)
def test_dropped_while_another_thread_operates(index: int) -> None:
    hold, core, (thread, granted, errors) = _parked_behind(index)
    with _operating(core):
        del hold  # its finalizer finds the lock taken by the other thread
        assert not granted.wait(0.2)
    assert granted.wait(GRANT_S), "the dropped hold's permit never reached the waiter"
    thread.join(GRANT_S)
    assert not errors


@pytest.mark.skipif(not hasattr(os, "fork"), reason="the platform does not fork")
def test_a_forked_child_settles_with_its_own_thread() -> None:
    # The parent's settler runs (a waiter started it); the child has no such thread
    # and gets its own, serving the child's fresh queue.
    test_dropped_inside_this_threads_operation(0)
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child reports by its exit status
        code = 1
        try:
            test_dropped_inside_this_threads_operation(0)
            code = 0
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0


def test_a_start_reentered_on_its_own_thread_does_not_hang(
        monkeypatch: pytest.MonkeyPatch) -> None:
    # A finalizer may run while the settler's start holds its lock (a thread's start
    # allocates), and its warning's handler may wait on a lane, which starts the settler
    # again on the same thread. Driven by a Thread.start that re-enters first.
    settler = _core._Settler()
    original = threading.Thread.start
    reentered: list[bool] = []

    def start(thread: threading.Thread) -> None:
        if not reentered:
            reentered.append(True)
            settler.wait_begins(core)  # as the handler's wait would
        original(thread)

    core = SessionLane("s")._core
    monkeypatch.setattr(threading.Thread, "start", start)
    settler.wait_begins(core)
    monkeypatch.undo()
    assert reentered and settler.started and list(settler.watched) == [core]


def _settle_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == "lanequeue-settle"]


def test_the_settler_runs_only_while_a_thread_waits(monkeypatch: pytest.MonkeyPatch) -> None:
    """A process whose waits are over keeps no thread of the library's (a fork of a
    process with threads warns on Python 3.12+): the settler ends once no thread has
    waited for SETTLER_IDLE_S, and the next wait starts it again."""
    monkeypatch.setattr(_core, "SETTLER_IDLE_S", 0.05)
    for lane in (SessionLane("s", warn_after_s=None), SessionLane("t", warn_after_s=None)):
        _until(lambda: not _settle_threads())
        assert lane.try_acquire("k")
        waited = threading.Thread(target=lane.acquire_timeout, args=("k", 0.5))
        waited.start()
        _until(lambda: lane.stats.waiters == 1)  # noqa: B023  (called in this round)
        _until(lambda: bool(_settle_threads())
               and lane._core in _core._SETTLER.watched)  # noqa: B023
        time.sleep(0.2)  # (idle rounds pass: a waiter in line keeps it)
        assert _settle_threads()
        lane.manual_release("k")
        waited.join(GRANT_S)
    _until(lambda: not _settle_threads())
    assert not _core._SETTLER.started


def test_the_settler_ends_after_waits_an_interrupt_stopped(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """No count of waits that an interrupt could leave wrong: a wait stopped anywhere
    (here: the settler told of it, the wait gone) leaves no settler running once no
    waiter is in line."""
    monkeypatch.setattr(_core, "SETTLER_IDLE_S", 0.05)
    _until(lambda: not _settle_threads())
    lane = SessionLane("s", warn_after_s=None)
    for _ in range(3):
        _core._SETTLER.wait_begins(lane._core)  # as a wait interrupted right after
    assert _settle_threads()
    _until(lambda: not _settle_threads())
    assert not _core._SETTLER.started


def test_a_drop_the_finalizer_could_not_report_reaches_the_waiter(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A finalizer stopped by an interrupt right after it recorded the drop (before it
    asked anyone to end it): the settler, while a waiter is in line, finds it within
    about SETTLER_IDLE_S, and the waiter gets the permit, not a timeout."""
    monkeypatch.setattr(_core, "SETTLER_IDLE_S", 0.1)
    lane = SessionLane("s", timeout_s=WAIT_S, warn_after_s=None)
    assert lane.try_acquire("k")
    thread, granted, errors = _waiter(lambda: lane.acquire("k"))
    _until(lambda: lane.stats.waiters == 1)
    # What the stopped finalizer left:
    lane._core._dropped.append(("k", lane._core._entries["k"].token))
    assert granted.wait(GRANT_S), "left to the waiter's timeout"
    thread.join(GRANT_S)
    assert not errors and lane.stats.holders == 0


def test_a_wait_goes_on_when_no_thread_can_start(monkeypatch: pytest.MonkeyPatch) -> None:
    """The settler only helps: a process at its thread limit still waits (its dropped
    holds then wait for the lane's next operation)."""
    _until(lambda: not _core._SETTLER.started)

    def refuse(thread: threading.Thread) -> None:
        if thread.name == "lanequeue-settle":
            raise RuntimeError("can't start new thread")
        original(thread)

    original = threading.Thread.start
    lane = SessionLane("s", timeout_s=WAIT_S, warn_after_s=None)
    assert lane.try_acquire("k")
    monkeypatch.setattr(threading.Thread, "start", refuse)
    got: list[bool] = []
    waiter = threading.Thread(target=lambda: got.append(lane.acquire_timeout("k", WAIT_S)))
    original(waiter)
    _until(lambda: lane.stats.waiters == 1)
    assert not _core._SETTLER.started
    lane.manual_release("k")
    waiter.join(GRANT_S)
    assert got == [True]
    assert lane.manual_release("k")


def test_one_lane_whose_lock_stays_taken_holds_back_no_other(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Lane A's lock stays taken (a log handler running under it for seconds) while its
    settle is asked for; lane B's dropped hold still reaches B's waiter once B's own
    operation ends."""
    a, b = SessionLane("a", warn_after_s=None), SessionLane("b", timeout_s=WAIT_S,
                                                           warn_after_s=None)
    hold_a, hold_b = a.acquire("k"), b.acquire("k")
    hold_a.__enter__()
    hold_b.__enter__()
    thread, granted, errors = _waiter(lambda: b.acquire("k"))
    _until(lambda: b.stats.waiters == 1)
    with _operating(a._core):
        del hold_a  # A's settle is asked for, and A's lock stays taken
        time.sleep(0.05)  # (the settler meets A's lock first)
        with b._core._lock:
            del hold_b  # B's, while B's operation is in progress
        assert granted.wait(GRANT_S), "B's waiter was held back by A's lock"
    thread.join(GRANT_S)
    assert not errors
    _until(lambda: a.stats.holders == 0)


def test_an_interrupted_settle_in_the_finalizer_leaves_the_rest_to_the_settler(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The finalizer ends the dropped hold itself when the lock is free; an interrupt in
    that release (swallowed: a finalizer's exception is only printed) leaves it to the
    settler, not to the lane's next operation."""
    lane = SessionLane("s", timeout_s=WAIT_S, warn_after_s=None)
    hold = lane.acquire("k")
    hold.__enter__()
    thread, granted, errors = _waiter(lambda: lane.acquire("k"))
    _until(lambda: lane.stats.waiters == 1)
    release = type(lane._core).release
    fired: list[bool] = []

    def interrupted(core: Any, *args: Any) -> Any:
        if not fired and threading.current_thread() is threading.main_thread():
            fired.append(True)
            raise KeyboardInterrupt
        return release(core, *args)

    monkeypatch.setattr(type(lane._core), "release", interrupted)
    unraisable: list[Any] = []
    monkeypatch.setattr("sys.unraisablehook", unraisable.append)
    del hold
    assert fired and unraisable and unraisable[0].exc_type is KeyboardInterrupt
    assert granted.wait(GRANT_S), "left to the lane's next operation"
    thread.join(GRANT_S)
    assert not errors


def test_a_thread_waits_timeout_counts_the_time_its_slow_wait_warning_took() -> None:
    """An ``on_wait`` (or a log handler) that takes long does not push the timeout
    back: the wait ends at its timeout, or as soon as the warning returns past it."""
    lane = SessionLane("s", timeout_s=1.0, warn_after_s=0.2,
                       on_wait=lambda *args: time.sleep(1.5))
    assert lane.try_acquire("k")
    start = time.monotonic()
    with pytest.raises(LaneTimeoutError), lane.acquire("k"):
        pass
    took = time.monotonic() - start
    # 0.2 s, then 1.5 s in on_wait, then nothing left; the old wait parked 0.8 s more.
    assert 1.6 < took < 2.4, took


@pytest.mark.timeout(30)
def test_an_asyncio_view_from_another_thread_leaves_the_hand_off_to_the_loop() -> None:
    """A metrics scrape's thread reads an asyncio lane that has a dropped hold: the
    hand-off wakes a task, which only the loop's thread may do (in debug mode asyncio
    refused it from the scrape's thread and the wake-up was lost: the task never
    resumed). The loop ends the hold; the view shows it held until then."""
    lane = AsyncSessionLane("s", warn_after_s=None)
    scrape: dict[str, Any] = {}

    class Cycle:
        me: Any
        hold: Any

    async def main() -> str:
        gc.disable()  # (the cycle is collected in the scraper's thread only)
        try:
            return await run()
        finally:
            gc.enable()

    async def run() -> str:
        c = Cycle()
        c.me, c.hold = c, lane.acquire("k")
        await c.hold.__aenter__()
        del c  # dropped, in a cycle: collected where the scraper collects

        async def waiter() -> str:
            async with lane.acquire("k", timeout_s=WAIT_S):
                return "granted"

        task = asyncio.create_task(waiter())
        await asyncio.sleep(0.05)

        def scraper() -> None:
            gc.collect()
            try:
                scrape["stats"] = lane.metrics_snapshot()[0].stats
            except BaseException as exc:  # (reported below)
                scrape["error"] = exc

        reader = threading.Thread(target=scraper)
        reader.start()
        while reader.is_alive():
            await asyncio.sleep(0.01)
        return await asyncio.wait_for(task, GRANT_S)

    assert asyncio.run(main(), debug=True) == "granted"
    assert "error" not in scrape, scrape
    assert lane.stats.holders == 0 and lane.stats.released == 2


def test_holds_finalized_at_interpreter_exit_print_nothing(tmp_path: Any) -> None:
    """Holds kept by a module torn down after lanequeue's are finalized once its globals
    are gone: nothing to return them to, and nothing printed."""
    (tmp_path / "holder.py").write_text("HOLDS = []\n")
    (tmp_path / "main.py").write_text(
        "import threading, time\n"
        "import holder\n"
        "from lanequeue import Lane, LaneQueue, SessionLane\n"
        "s = SessionLane('s', timeout_s=None, warn_after_s=None)\n"
        "g = Lane('g', max_concurrent=1, timeout_s=None, warn_after_s=None)\n"
        "q = LaneQueue(warn_after_s=None)\n"
        "q.add(SessionLane('session'))\n"
        "for made in (s.acquire('k'), g.acquire('a'), q.acquire_all('m', ['session'])):\n"
        "    made.__enter__()\n"
        "    holder.HOLDS.append(made)\n"
        "def wait():\n"
        "    with s.acquire('k'):\n"
        "        pass\n"
        "threading.Thread(target=wait, daemon=True).start()\n"
        "time.sleep(0.2)\n"
        "print('exit', flush=True)\n")
    proc = subprocess.run([sys.executable, "main.py"], cwd=tmp_path,
                          capture_output=True, text=True, timeout=20)
    assert proc.returncode == 0 and proc.stdout == "exit\n", proc
    assert "Exception ignored" not in proc.stderr and "Error" not in proc.stderr, proc.stderr


def test_an_asyncio_view_off_a_stopped_loop_leaves_the_hand_off_to_the_loop() -> None:
    """Between two runs of its loop (the loop may start at any moment, from another
    thread too), a view asks the loop to end a dropped hold, once however often it is
    read, and shows it held until the loop runs."""
    lane = AsyncSessionLane("s", warn_after_s=None)
    loop = asyncio.new_event_loop()

    class Cycle:
        me: Any
        hold: Any

    async def setup() -> asyncio.Task[str]:
        c = Cycle()
        c.me, c.hold = c, lane.acquire("k")
        await c.hold.__aenter__()
        del c

        async def waiter() -> str:
            async with lane.acquire("k", timeout_s=WAIT_S):
                return "granted"

        task = asyncio.create_task(waiter())
        await asyncio.sleep(0.05)
        return task

    gc.disable()
    try:
        task = loop.run_until_complete(setup())
        ready = len(loop._ready)  # type: ignore[attr-defined]
        seen: list[Any] = []

        def scrape() -> None:
            gc.collect()
            seen.extend(lane.stats for _ in range(100))

        reader = threading.Thread(target=scrape)
        reader.start()
        reader.join(GRANT_S)
        assert len(seen) == 100, seen
        assert all(s.released == 0 and s.waiters == 1 for s in seen), seen[-1]
        # The finalizer's request, and the views' one (however many views).
        assert len(loop._ready) == ready + 2  # type: ignore[attr-defined]
        assert loop.run_until_complete(asyncio.wait_for(task, GRANT_S)) == "granted"
    finally:
        gc.enable()
        loop.close()
    assert lane.stats.holders == 0 and lane.stats.released == 2


def test_a_view_after_the_loop_closed_ends_the_dropped_hold_itself() -> None:
    """A view between two runs asks the loop; the loop then closed without running (its
    queued request gone): the next view ends the hold itself, and a new loop may bind."""
    lane = AsyncSessionLane("s", warn_after_s=None)
    loop = asyncio.new_event_loop()

    class Cycle:
        me: Any
        hold: Any

    async def drop() -> None:
        c = Cycle()
        c.me, c.hold = c, lane.acquire("k")
        await c.hold.__aenter__()

    gc.disable()
    try:
        loop.run_until_complete(drop())
        gc.collect()
        assert lane.stats.holders == 1  # asked the loop, which does not run
        loop.close()
        assert lane.stats.holders == 0 and lane.stats.released == 1
    finally:
        gc.enable()

    async def again() -> str:
        async with lane.acquire("k", timeout_s=0):
            return "granted on a new loop"

    assert asyncio.run(again()) == "granted on a new loop"


def test_the_settlers_look_at_its_waiters_comes_whatever_keeps_it_busy(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Lane B keeps the settler busy (its lock stays taken with a request pending); lane
    A's waiter is behind a drop nobody asked for (a finalizer stopped by an interrupt):
    the settler's periodic look still finds it."""
    monkeypatch.setattr(_core, "SETTLER_IDLE_S", 0.1)
    a = SessionLane("a", timeout_s=WAIT_S, warn_after_s=None)
    b = SessionLane("b", warn_after_s=None)
    assert a.try_acquire("k")
    thread, granted, errors = _waiter(lambda: a.acquire("k"))
    _until(lambda: a.stats.waiters == 1)
    with _operating(b._core):
        # (A's waiter, in line, starts it and is watched)
        _until(lambda: _core._SETTLER.started and a._core in _core._SETTLER.watched)
        _core.settle_later(b._core)  # pending, B's lock taken: tried again and again
        _until(_core._SETTLER.queue.empty)
        a._core._dropped.append(("k", a._core._entries["k"].token))  # nobody asked
        assert granted.wait(GRANT_S), "A's waiter was left to its timeout"
    thread.join(GRANT_S)
    assert not errors


def test_a_wait_out_of_time_ends_a_dropped_hold_nobody_ended(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """No settler (none could start) and a drop nobody asked to end: the waiter whose
    timeout comes ends it itself and gets the permit instead of a timeout, on both
    faces."""
    def refuse(thread: threading.Thread) -> None:
        if thread.name == "lanequeue-settle":
            raise RuntimeError("can't start new thread")
        original(thread)

    original = threading.Thread.start
    _until(lambda: not _core._SETTLER.started)
    lane = SessionLane("s", warn_after_s=None)
    assert lane.try_acquire("k")
    monkeypatch.setattr(threading.Thread, "start", refuse)
    got: list[bool] = []
    waiter = threading.Thread(target=lambda: got.append(lane.acquire_timeout("k", 0.5)))
    original(waiter)
    _until(lambda: lane.stats.waiters == 1)
    lane._core._dropped.append(("k", lane._core._entries["k"].token))
    waiter.join(GRANT_S)
    assert got == [True] and lane.stats.timeouts == 0

    alane = AsyncSessionLane("a", warn_after_s=None)

    async def main() -> bool:
        assert await alane.try_acquire("k")

        async def wait() -> bool:
            return await alane.acquire_timeout("k", 0.3)

        task = asyncio.create_task(wait())
        await asyncio.sleep(0.05)
        alane._core._dropped.append(("k", alane._core._entries["k"].token))
        return await task

    assert asyncio.run(main()) is True and alane.stats.timeouts == 0
