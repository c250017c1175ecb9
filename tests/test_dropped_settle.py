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

import gc
import os
import threading
import time
import warnings
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from lanequeue import Lane, LaneQueue, SessionLane, _core

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


@pytest.mark.parametrize("index", range(len(CASES)), ids=CASES)
def test_dropped_inside_this_threads_operation(index: int) -> None:
    hold_of, wait_for, watched, core = _case(index)
    hold = hold_of()
    hold.__enter__()
    thread, granted, errors = _waiter(wait_for)
    _until(lambda: watched.stats.waiters == 1)
    with core._lock:  # an operation of this thread in progress
        del hold
        gc.collect()  # (no cycle: the drop came at the del; any cycle's too)
        assert not granted.wait(0.2)  # the lock is taken: nothing handed over yet
    assert granted.wait(GRANT_S), "the dropped hold's permit never reached the waiter"
    thread.join(GRANT_S)
    assert not errors


@pytest.mark.parametrize("index", range(len(CASES)), ids=CASES)
def test_dropped_while_another_thread_operates(index: int) -> None:
    hold_of, wait_for, watched, core = _case(index)
    hold = hold_of()
    hold.__enter__()
    thread, granted, errors = _waiter(wait_for)
    _until(lambda: watched.stats.waiters == 1)
    inside, leave = threading.Event(), threading.Event()

    def operate() -> None:  # another thread's operation, held open until told
        with core._lock:
            inside.set()
            leave.wait(GRANT_S * 2)

    other = threading.Thread(target=operate, daemon=True)
    other.start()
    assert inside.wait(GRANT_S)
    del hold  # its finalizer finds the lock taken by the other thread
    assert not granted.wait(0.2)
    leave.set()
    other.join(GRANT_S)
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
    # A finalizer may run while _Daemon.start holds its lock (a thread's start
    # allocates), and its warning's handler may wait on a lane, which starts the settler
    # again on the same thread. Driven by a Thread.start that re-enters first.
    served: list[int] = []
    done = threading.Event()

    def serve(requests: Any) -> None:
        while True:
            served.append(requests.get())
            done.set()

    daemon = _core._Daemon("lanequeue-test", serve)
    original = threading.Thread.start
    reentered: list[bool] = []

    def start(thread: threading.Thread) -> None:
        if not reentered:
            reentered.append(True)
            daemon.start()  # as the handler's wait would
        original(thread)

    monkeypatch.setattr(threading.Thread, "start", start)
    daemon.start()
    monkeypatch.undo()
    assert reentered and daemon.started
    daemon.queue.put(7)
    assert done.wait(GRANT_S) and served == [7]  # each request served once
    daemon.started = False  # (a forked child of a later test starts nothing for it)
