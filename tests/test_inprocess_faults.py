"""In-process faults: interrupts (C18), fork (C19), dropped holds (C20), error messages.

C18 is tested in two ways. The deterministic one raises ``KeyboardInterrupt`` at the
N-th injection point of an operation, for N = 1, 2, ... until the operation completes
with no injection left, and after each injection checks the three rules (the core's
lock is free; the counters agree with the entries; at most the one hold being entered
or left is still held, visible in ``get_active()`` and ended by ``manual_release``),
then proves that the lane still works (a fresh acquire and release, from another thread
for a thread lane, from a fresh task for an asyncio lane, each under a timeout).

Which frames are traced, and where an exception is injected:

- Only frames of the package's in-process modules (``lanes.py``, ``aio.py``,
  ``queue.py``, ``_kinds.py``, ``_validate.py``, ``_errors.py`` and ``_core.py``). The
  test's own code, the clock and asyncio's own machinery are not traced: an interrupt
  there is not the library's to survive (asyncio.run turns SIGINT into a cancellation
  of the main task; an exception inside the event loop's own code stops the loop).
  The holds' finalizers (``__del__``) are not traced either: Python reports and drops
  an exception raised in a finalizer, so the most it can do is stop that finalizer
  (the one dropped hold then stays held, as rule 3 allows); and raising from a trace
  function inside a finalizer crashes CPython 3.11 in this harness. The random-timer
  test below does interrupt finalizers.
- In the face modules: at EVERY instruction (trace ``opcode`` events with
  ``f_trace_opcodes``), at every entry or resumption of a frame (``call``), at every
  return (``return``: as if the exception were raised at the caller's check that
  follows a call), and after every call of a builtin (``c_return`` profile events: the
  call has happened, and the exception is raised at its ``CALL`` instruction, which is
  where CPython checks). This is more than CPython can do, and the faces must cope.
- In ``_core.py``: only where CPython itself can deliver an asynchronous exception
  (signal handlers and ``PyThreadState_SetAsyncExc`` run at the eval breaker): at the
  entry of a function (``call``), at a backward jump (``opcode`` events of jumps to a
  lower offset), after a call returns (``c_return`` of builtins,
  ``return`` of Python callees). Plain stores, arithmetic, comparisons and forward jumps
  never check the eval breaker, so an exception can never land between two of them;
  the core relies on that (see "Interrupts" in ``lanequeue/_core.py``) and they are not
  injection points. Everything that CAN be interrupted in the core is.

The random one is the issue's failing input: a ``signal.setitimer`` timer raising
``KeyboardInterrupt`` every 10-300 us while a thread loops ``with lane.acquire("k"):``.
"""

from __future__ import annotations

import asyncio
import gc
import inspect
import logging
import os
import pickle
import random
import signal
import subprocess
import sys
import threading
import time
import warnings
from collections.abc import Callable
from pathlib import Path
from types import FrameType
from typing import Any

import interrupt_points
import pytest
from interrupt_points import DELIVERY, EVERY_INSTRUCTION, Injector, library
from interrupt_timer import sigalrm_interrupts

import lanequeue
from lanequeue import (
    AsyncHold,
    AsyncLane,
    AsyncLaneQueue,
    AsyncSessionLane,
    Lane,
    LaneQueue,
    LaneTimeoutError,
    NotOwnerError,
    SessionLane,
    ThreadHold,
)
from lanequeue._core import CountingCore, SessionCore
from lanequeue._kinds import LANE_DEFAULT
from lanequeue.aio import _TaskWaiter
from lanequeue.lanes import _ThreadWaiter

KEY = "k"
JOIN_S = 5.0

# An interrupt injected before a hold's enter began leaves that hold never entered:
# dropped, it warns so (its message says an interrupt can be the cause). Expected here.
pytestmark = pytest.mark.filterwarnings(
    "ignore:.*garbage-collected without being entered:RuntimeWarning")

# -- the injector ----------------------------------------------------------------------

_PKG = Path(lanequeue.__file__).resolve().parent
_CORE = str(_PKG / "_core.py")
_FACES = {str(_PKG / f) for f in ("lanes.py", "aio.py", "queue.py", "_kinds.py",
                                  "_validate.py", "_errors.py")}
_TRACED = _FACES | {_CORE}


def inject_everywhere(run_once: Callable[[Injector], None], limit: int = 5000,
                      real_points: bool = False, finalizers: bool = False) -> int:
    """Call ``run_once(inj)`` with an injection at point n = 1, 2, ... (see the module
    docstring) until a run completes without one; return how many injections were made.
    ``real_points``: in the face modules too, only where CPython can deliver an
    asynchronous exception (as in ``_core.py``), not at every instruction.
    ``finalizers``: finalizers traced too (only where CPython can deliver one), except
    the one point no Python code can guard: the very entry of ``__del__``, before its
    first call records the drop (README, "Dropped holds")."""
    if finalizers:
        return interrupt_points.inject_everywhere(
            run_once, limit, traced=library(_TRACED),
            points=lambda code: (DELIVERY - {"call"} if code.co_name == "__del__"
                                 else DELIVERY))
    return interrupt_points.inject_everywhere(
        run_once, limit, traced=library(_TRACED, skip={"__del__"}),
        points=lambda code: (DELIVERY if real_points or code.co_filename == _CORE
                             else EVERY_INSTRUCTION))


# -- the three rules ---------------------------------------------------------------------


def in_thread(fn: Callable[[], Any], timeout: float = JOIN_S) -> Any:
    """Run ``fn`` in another thread; its result (fails if it blocks past ``timeout``)."""
    box: dict[str, Any] = {}

    def body() -> None:
        try:
            box["r"] = fn()
        except BaseException as exc:
            box["r"] = exc

    t = threading.Thread(target=body, daemon=True)
    t.start()
    t.join(timeout)
    assert not t.is_alive(), "blocked: the lane is stuck"
    if isinstance(box["r"], BaseException):
        raise box["r"]
    return box["r"]


def check_consistent(core: Any) -> None:
    """Rule 2: the counters agree with the entries (read without the lock: the caller
    has checked that nobody else uses the lane). Holds dropped by an interrupted
    operation (their finalizer ran) are ended first, as the next operation would."""
    core._settle()
    lines: list[Any]
    if isinstance(core, SessionCore):
        held = [e.token for e in core._entries.values() if e.token]
        assert core._held == len(held)
        assert all(e.token for e in core._entries.values() if e.line), "waiter, no holder"
        lines = [e.line for e in core._entries.values() if e.line]
    else:
        assert isinstance(core, CountingCore)
        held = list(core._holds)
        assert len(held) <= core.capacity
        lines = [line for line in (core._line, core._ranked) if line]
        if lines:
            assert len(held) == core.capacity, "a waiter while a permit is free"
        # Every prioritised waiter has its heap entry (the heap may hold dead ones too).
        assert set(core._ranked) <= {e[2] for e in core._heap}, "a ranked waiter off the heap"
    assert len(set(held)) == len(held) and all(0 < t <= core._token for t in held)
    waiters = [w for line in lines for w in line]
    assert core._waiting == len(waiters)
    assert all(w.token == 0 and not w.left for w in waiters), "a granted or gone waiter in line"
    st = core.stats()
    assert (st.holders, st.waiters) == (len(held), len(waiters))
    assert st.acquired == core._token == st.released + st.holders


def check_rules(
    lane: Any, known: list[int], fired: str | None,
    manual_release: Callable[[], bool] | None = None,
) -> None:
    """Rules 1-3 after an injection (``known``: tokens the test itself still holds;
    ``manual_release``: how to call ``lane.manual_release(KEY)``, by default from
    another thread)."""
    if manual_release is None:
        manual_release = lambda: in_thread(lambda: lane.manual_release(KEY))  # noqa: E731
    core = lane._core
    where = f"after an interrupt at {fired}"
    # 1. The core's lock is free: not held by this thread, and another can take it.
    assert not core._lock._is_owned(), where
    assert in_thread(lambda: core._lock.acquire(timeout=JOIN_S) and not core._lock.release())
    # 2. Counters and entries agree.
    check_consistent(core)
    # 3. At most the one hold of the operation is left, visible and releasable.
    for token in known:
        core.release(KEY, token)  # False if the operation's own release ended it
    active = in_thread(lane.get_active)
    assert set(active) <= {KEY}, where
    stray = core.stats().holders
    assert stray <= 1, where
    if stray:
        assert KEY in active and manual_release(), where
    check_consistent(core)
    st = core.stats()
    assert (st.holders, st.waiters) == (0, 0), where


def check_thread_lane_works(lane: Any) -> None:
    assert in_thread(lambda: lane.acquire_timeout(KEY, JOIN_S) and lane.manual_release(KEY))
    assert lane.stats.holders == 0


# -- deterministic injection: thread face ------------------------------------------------

class _RankedLane(Lane):
    """A Lane whose acquires wait with priority 3 (the core's prioritised line)."""

    test_priority = 3

    def acquire(self, key: str, *, timeout_s: Any = LANE_DEFAULT,
                priority: int = 3) -> Any:
        return super().acquire(key, timeout_s=timeout_s, priority=priority)


THREAD_LANES: dict[str, Callable[[], Any]] = {
    "SessionLane": lambda: SessionLane("s", timeout_s=JOIN_S),
    "Lane": lambda: Lane("g", max_concurrent=1, timeout_s=JOIN_S),
    "Lane+priority": lambda: _RankedLane("p", max_concurrent=1, timeout_s=JOIN_S),
}


def _grant_on_park(monkeypatch: pytest.MonkeyPatch, release: Callable[[], None]) -> None:
    """Make the next thread that parks release the holder first (injection paused), so
    the wait ends by a hand-off in this same thread, deterministically."""
    original = _ThreadWaiter.park

    def park(waiter: _ThreadWaiter, timeout: float | None) -> bool:
        release()
        return original(waiter, timeout)

    monkeypatch.setattr(_ThreadWaiter, "park", park)


def _run_thread_case(lane_factory: Callable[[], Any], case: str,
                     monkeypatch: pytest.MonkeyPatch) -> int:
    def run_once(inj: Injector) -> None:
        lane = lane_factory()
        core = lane._core
        known: list[int] = []
        waiter: _ThreadWaiter | None = None
        op: Callable[[], Any]
        if case == "enter_free":
            def op() -> None:
                with lane.acquire(KEY):
                    pass
        elif case == "hot_metrics":
            # The holds' own fast steps with hold times on: the key IDLE on a per-key
            # lane (held and released before), a free permit on a counting lane.
            lane.track_holds()
            assert core.release(KEY, core.take(KEY, True))

            def op() -> None:
                with lane.acquire(KEY):
                    pass
        elif case in ("enter_handoff", "enter_timeout", "refuse"):
            holder = core.take(KEY, True)
            known.append(holder)
            if case == "enter_handoff":
                def release() -> None:
                    with inj.pause():
                        core.release(KEY, holder)
                _grant_on_park(monkeypatch, release)

                def op() -> None:
                    with lane.acquire(KEY, timeout_s=JOIN_S):
                        pass
            elif case == "enter_timeout":
                def op() -> None:
                    with pytest.raises(LaneTimeoutError), lane.acquire(KEY, timeout_s=0.001):
                        pass
            else:
                def op() -> None:
                    assert not lane.try_acquire(KEY)
        elif case == "exit_handoff":
            hold = lane.acquire(KEY)
            hold.__enter__()
            known.append(hold.token)
            waiter = _ThreadWaiter()  # another caller in line (no thread behind it)
            waiter.since = core._clock()  # as the face parks it
            rank = getattr(lane, "test_priority", 0)
            assert (core.take(KEY, True, waiter, priority=rank) if rank
                    else core.take(KEY, True, waiter)) == 0

            def op() -> None:
                hold.__exit__(None, None, None)
        elif case == "drain":
            # A dropped hold of another key, returned by the next operation.
            dropped = core.take("d", True)
            core.drop("d", dropped)

            def op() -> None:
                with lane.acquire(KEY):
                    pass
        else:
            raise AssertionError(case)
        try:
            with inj.active():
                op()
        except KeyboardInterrupt:
            assert inj.fired is not None
        monkeypatch.undo()
        if waiter is not None and (
            waiter.token or core.withdraw(KEY, waiter, timed_out=False)
        ):
            known.append(waiter.token)
        if case == "drain":
            core.stats()  # the next operation ends the dropped hold, whatever happened
            assert not in_thread(lane.get_active).get("d"), "a dropped hold was lost"
        check_rules(lane, known, inj.fired)
        check_thread_lane_works(lane)

    return inject_everywhere(run_once)


# An interrupted enter or exit drops its hold: its finalizer warns (C20), expectedly; an
# interrupt between making a coroutine and awaiting it leaves it "never awaited".
@pytest.mark.filterwarnings("ignore::ResourceWarning")
@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")
@pytest.mark.filterwarnings("ignore:coroutine .* was never awaited:RuntimeWarning")
@pytest.mark.parametrize("kind", list(THREAD_LANES))
@pytest.mark.parametrize(
    "case", ["enter_free", "hot_metrics", "enter_handoff", "enter_timeout", "refuse",
             "exit_handoff", "drain"]
)
def test_c18_interrupt_at_every_point_thread_lanes(
    kind: str, case: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """C18: KeyboardInterrupt at every injection point of take, release, hold enter and
    hold exit (free, the holds' fast steps with hold times on, hand-off, timeout,
    refusal, drain of a dropped hold)."""
    points = _run_thread_case(THREAD_LANES[kind], case, monkeypatch)
    assert points >= 10


_ENDERS: dict[str, Callable[[Any], Any]] = {
    "clear": lambda lane: lane.clear(KEY),
    "drain": lambda lane: lane.drain(cancel_waiting=True),
    "close": lambda lane: lane.close(),
}


@pytest.mark.parametrize("kind", list(THREAD_LANES))
@pytest.mark.parametrize("ender", list(_ENDERS))
def test_c18_interrupt_while_ending_waiters_strands_none(kind: str, ender: str) -> None:
    """C18: KeyboardInterrupt at every injection point of ``clear(key)``,
    ``drain(cancel_waiting=True)`` and ``close()`` with three waiters in line. Each
    waiter ends up either ended (its outcome token, out of line) or still in line and
    counted, never out of line unended (it would wait for ever): once the holder
    releases, the ones still in line are served in turn, and the lane ends idle."""

    def run_once(inj: Injector) -> None:
        lane = THREAD_LANES[kind]()
        core = lane._core
        holder = core.take(KEY, True)
        rank = getattr(lane, "test_priority", 0)
        waiters = [_ThreadWaiter() for _ in range(3)]
        for w in waiters:
            w.since = core._clock()  # as the face parks it
            assert (core.take(KEY, True, w, priority=rank) if rank
                    else core.take(KEY, True, w)) == 0
        try:
            with inj.active():
                _ENDERS[ender](lane)
        except KeyboardInterrupt:
            assert inj.fired is not None
        check_consistent(core)
        ended = [w for w in waiters if w.token < 0]
        assert all(w.token == 0 for w in waiters if w not in ended)
        if inj.fired is None:
            assert len(ended) == 3, "not interrupted: every waiter ended"
        # The holder leaves: each waiter still in line gets the key in its turn.
        token = holder
        for w in waiters:
            if w in ended:
                continue
            assert core.release(KEY, token) and w.token > 0, f"{w} not served ({inj.fired})"
            token = w.token
        assert core.release(KEY, token)
        st = core.stats()
        assert (st.holders, st.waiters) == (0, 0), inj.fired

    assert inject_everywhere(run_once) >= 3


@pytest.mark.filterwarnings("ignore::ResourceWarning")
@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")
@pytest.mark.parametrize("kind", list(THREAD_LANES))
def test_c18_second_interrupt_during_the_clean_up_leaves_no_ghost_waiter(
    kind: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """C18, two interrupts: the first ends a parked wait, the second lands at every
    point of the clean-up that follows (its withdraw included) where CPython can deliver
    one (a signal's exception cannot land between entering a handler and its first
    plain store, which is what the clean-up relies on). A waiter whose withdraw was
    stopped may stay in line (counted) until the next release, which drops it: the
    permit never goes to the thread that left, the holder's release leaves the lane
    idle, and the next caller gets the key."""

    def run_once(inj: Injector) -> None:
        lane = THREAD_LANES[kind]()
        core = lane._core
        holder = core.take(KEY, True)

        def park(waiter: _ThreadWaiter, timeout: float | None) -> bool:
            inj.paused = False  # count injection points from the first interrupt on
            raise KeyboardInterrupt("the first interrupt, while parked")

        monkeypatch.setattr(_ThreadWaiter, "park", park)
        inj.paused = True
        with pytest.raises(KeyboardInterrupt), inj.active(), lane.acquire(
            KEY, timeout_s=JOIN_S
        ):
            pass
        monkeypatch.undo()
        check_consistent(core)
        assert core.release(KEY, holder)
        st = core.stats()
        assert (st.holders, st.waiters) == (0, 0), f"a ghost after {inj.fired}"
        check_thread_lane_works(lane)

    assert inject_everywhere(run_once, real_points=True) >= 3


def _queue() -> LaneQueue:
    queue = LaneQueue()
    queue.add_session_lane("session", timeout_s=JOIN_S)
    queue.add_lane("global", max_concurrent=1, timeout_s=JOIN_S)
    return queue


@pytest.mark.filterwarnings("ignore::ResourceWarning")
@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")
@pytest.mark.filterwarnings("ignore:coroutine .* was never awaited:RuntimeWarning")
@pytest.mark.parametrize("case", ["free", "idle", "wait", "timeout"])
def test_c18_interrupt_at_every_point_acquire_all(
    case: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """C18: KeyboardInterrupt at every injection point of ``acquire_all`` (enter and
    exit): both lanes free (the key new to the per-key lane, or IDLE there: held and
    released before); the second lane held by another key and handed over while
    parked; the second lane held until the deadline."""

    def run_once(inj: Injector) -> None:
        queue = _queue()
        session, glob = queue["session"], queue["global"]
        if case == "idle":
            assert session._core.release(KEY, session._core.take(KEY, True))
        other = 0
        if case in ("wait", "timeout"):
            other = glob._core.take("other", True)
        if case == "wait":
            def release() -> None:
                with inj.pause():
                    glob._core.release("other", other)
            _grant_on_park(monkeypatch, release)

        def op() -> None:
            if case == "timeout":
                with pytest.raises(LaneTimeoutError), queue.acquire_all(
                    KEY, ["session", "global"], timeout_s=0.001
                ):
                    pass
            else:
                with queue.acquire_all(KEY, ["session", "global"]):
                    pass

        try:
            with inj.active():
                op()
        except KeyboardInterrupt:
            assert inj.fired is not None
        monkeypatch.undo()
        if other:
            glob._core.release("other", other)  # False if the hand-off ended it already
        for lane in (session, glob):
            check_rules(lane, [], inj.fired)
            check_thread_lane_works(lane)

    assert inject_everywhere(run_once) >= 20


# -- deterministic injection: asyncio face -----------------------------------------------

class _RankedAsyncLane(AsyncLane):
    """An AsyncLane whose acquires wait with priority 3 (the core's prioritised line)."""

    test_priority = 3

    def acquire(self, key: str, *, timeout_s: Any = LANE_DEFAULT,
                priority: int = 3) -> Any:
        return super().acquire(key, timeout_s=timeout_s, priority=priority)


ASYNC_LANES: dict[str, Callable[[], Any]] = {
    "AsyncSessionLane": lambda: AsyncSessionLane("s", timeout_s=JOIN_S),
    "AsyncLane": lambda: AsyncLane("g", max_concurrent=1, timeout_s=JOIN_S),
    "AsyncLane+priority": lambda: _RankedAsyncLane("p", max_concurrent=1, timeout_s=JOIN_S),
}


def _finish(loop: asyncio.AbstractEventLoop) -> None:
    """Cancel what an injected KeyboardInterrupt left pending, and let it unwind."""
    tasks = [t for t in asyncio.all_tasks(loop) if not t.done()]
    for t in tasks:
        t.cancel()
    if tasks:
        loop.run_until_complete(asyncio.gather(*tasks, return_exceptions=True))


def async_manual_release(loop: asyncio.AbstractEventLoop, lane: Any) -> Callable[[], bool]:
    """``lane.manual_release(KEY)`` on the lane's loop (awaited if it is a coroutine)."""

    async def call() -> bool:
        result = lane.manual_release(KEY)
        if inspect.isawaitable(result):
            result = await result
        return bool(result)

    return lambda: loop.run_until_complete(call())


def check_async_lane_works(loop: asyncio.AbstractEventLoop, lane: Any) -> None:
    async def fresh() -> None:
        async with lane.acquire(KEY, timeout_s=JOIN_S):
            pass

    loop.run_until_complete(asyncio.wait_for(fresh(), JOIN_S))
    assert lane.stats.holders == 0


@pytest.mark.filterwarnings("ignore::ResourceWarning")
@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")
@pytest.mark.filterwarnings("ignore:coroutine .* was never awaited:RuntimeWarning")
@pytest.mark.parametrize("kind", list(ASYNC_LANES))
@pytest.mark.parametrize(
    "case", ["enter_free", "enter_handoff", "enter_look", "enter_timeout", "exit_handoff"]
)
def test_c18_interrupt_at_every_point_async_lanes(kind: str, case: str) -> None:
    """C18 on the asyncio face: every injection point of ``async with`` enter and exit
    (free, hand-off while parked, the same entered through the look at a busy key,
    timeout, exit handing over to a task in line)."""

    def run_once(inj: Injector) -> None:
        loop = asyncio.new_event_loop()
        try:
            lane = ASYNC_LANES[kind]()
            core = lane._core
            known: list[int] = []
            waiter: _TaskWaiter | None = None
            hold: Any = None

            async def setup() -> None:
                nonlocal waiter, hold
                if case in ("enter_handoff", "enter_look", "enter_timeout"):
                    known.append(core.take(KEY, True))
                if case == "enter_look":
                    core.seen_busy = True  # a take found the lane busy: look first
                if case == "exit_handoff":
                    hold = lane.acquire(KEY)
                    await hold.__aenter__()
                    known.append(hold.token)
                    waiter = _TaskWaiter(loop.create_future())
                    rank = getattr(lane, "test_priority", 0)
                    assert (core.take(KEY, True, waiter, priority=rank) if rank
                            else core.take(KEY, True, waiter)) == 0

            loop.run_until_complete(setup())

            def release_holder() -> None:
                with inj.pause():
                    core.release(KEY, known[0])

            async def op() -> None:
                if case == "enter_free":
                    async with lane.acquire(KEY):
                        pass
                elif case in ("enter_handoff", "enter_look"):
                    loop.call_soon(release_holder)  # runs once this task has parked
                    async with lane.acquire(KEY, timeout_s=JOIN_S):
                        pass
                elif case == "enter_timeout":
                    with pytest.raises(LaneTimeoutError):
                        async with lane.acquire(KEY, timeout_s=0.001):
                            pass
                else:
                    await hold.__aexit__(None, None, None)

            try:
                with inj.active():
                    loop.run_until_complete(op())
            except KeyboardInterrupt:
                assert inj.fired is not None
            _finish(loop)
            if waiter is not None and (
                waiter.token or core.withdraw(KEY, waiter, timed_out=False)
            ):
                known.append(waiter.token)
            check_rules(lane, known, inj.fired, async_manual_release(loop, lane))
            check_async_lane_works(loop, lane)
        finally:
            _finish(loop)
            loop.close()

    assert inject_everywhere(run_once) >= 10


@pytest.mark.filterwarnings("ignore::ResourceWarning")
@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")
@pytest.mark.filterwarnings("ignore:coroutine .* was never awaited:RuntimeWarning")
@pytest.mark.parametrize("kind", list(ASYNC_LANES))
def test_c18_interrupt_while_the_lanes_timer_is_rearmed_keeps_every_timeout(kind: str) -> None:
    """An asyncio lane has ONE loop timer for its waits' deadlines. Waiter A (0.06 s) is
    in line; B joins with an earlier deadline (0.01 s), so B's acquire re-arms the timer,
    which then fires for B (and later for A). An interrupt at any point where CPython
    can deliver one, in B's acquire or in the timer's callback, leaves every deadline
    served: A times out, and so does a later caller C (an interrupt right after the old
    timer's cancel once left no timer at all: no timeout of the lane ever fired again)."""

    def run_once(inj: Injector) -> None:
        loop = asyncio.new_event_loop()
        try:
            lane = ASYNC_LANES[kind]()
            known = [lane._core.take(KEY, True)]  # held for the whole test
            a = loop.create_task(lane.acquire_timeout(KEY, 0.06))

            async def a_in_line() -> None:
                while lane.waiting < 1:
                    await asyncio.sleep(0)

            loop.run_until_complete(a_in_line())

            async def b() -> bool:
                return bool(await lane.acquire_timeout(KEY, 0.01))

            try:
                with inj.active():
                    assert loop.run_until_complete(b()) is False
            except KeyboardInterrupt:
                assert inj.fired is not None

            async def check() -> tuple[bool, bool]:
                c = await asyncio.wait_for(lane.acquire_timeout(KEY, 0.02), JOIN_S)
                return bool(await asyncio.wait_for(a, JOIN_S)), bool(c)

            try:
                outcome = loop.run_until_complete(check())
            except asyncio.TimeoutError:  # a deadline never served
                outcome = ("waited", JOIN_S)
            assert outcome == (False, False), inj.fired
            _finish(loop)
            check_rules(lane, known, inj.fired, async_manual_release(loop, lane))
        finally:
            _finish(loop)
            loop.close()

    assert inject_everywhere(run_once, real_points=True) >= 3


@pytest.mark.filterwarnings("ignore::ResourceWarning")
@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")
@pytest.mark.filterwarnings("ignore:coroutine .* was never awaited:RuntimeWarning")
@pytest.mark.parametrize("kind", list(ASYNC_LANES))
def test_c18_second_interrupt_during_an_async_clean_up_leaves_no_ghost_waiter(
    kind: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """C18, two interrupts on the asyncio face: the first lands in a task that has just
    joined the line (before it awaits its future), the second at every point of the
    clean-up where CPython can deliver one. The waiter refuses grants before its
    withdraw can be stopped: the holder's release leaves the lane idle."""

    def run_once(inj: Injector) -> None:
        loop = asyncio.new_event_loop()
        try:
            lane = ASYNC_LANES[kind]()
            core = lane._core
            holder = loop.run_until_complete(_take_now(core))

            def arm(*args: Any) -> int:
                inj.paused = False  # count injection points from the first interrupt on
                raise KeyboardInterrupt("the first interrupt, in line")

            monkeypatch.setattr(type(lane), "_arm", arm)
            inj.paused = True

            async def op() -> None:
                async with lane.acquire(KEY, timeout_s=JOIN_S):
                    pass

            with pytest.raises(KeyboardInterrupt), inj.active():
                loop.run_until_complete(op())
            monkeypatch.undo()
            _finish(loop)
            check_consistent(core)
            assert core.release(KEY, holder)
            st = core.stats()
            assert (st.holders, st.waiters) == (0, 0), f"a ghost after {inj.fired}"
            check_async_lane_works(loop, lane)
        finally:
            loop.close()

    assert inject_everywhere(run_once, real_points=True) >= 3


async def _take_now(core: Any) -> int:
    return int(core.take(KEY, True))


@pytest.mark.filterwarnings("ignore::ResourceWarning")
@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")
@pytest.mark.filterwarnings("ignore:coroutine .* was never awaited:RuntimeWarning")
def test_c18_interrupt_at_every_point_async_acquire_all() -> None:
    """C18 on ``AsyncLaneQueue.acquire_all``: every injection point, both lanes free."""

    def run_once(inj: Injector) -> None:
        loop = asyncio.new_event_loop()
        try:
            queue = AsyncLaneQueue()
            queue.add_session_lane("session", timeout_s=JOIN_S)
            queue.add_lane("global", max_concurrent=1, timeout_s=JOIN_S)

            async def op() -> None:
                async with queue.acquire_all(KEY, ["session", "global"]):
                    pass

            try:
                with inj.active():
                    loop.run_until_complete(op())
            except KeyboardInterrupt:
                assert inj.fired is not None
            _finish(loop)
            for name in ("session", "global"):
                lane = queue[name]
                check_rules(lane, [], inj.fired, async_manual_release(loop, lane))
                check_async_lane_works(loop, lane)
        finally:
            _finish(loop)
            loop.close()

    assert inject_everywhere(run_once) >= 20


def _check_nothing_held(loop: asyncio.AbstractEventLoop, lanes: list[Any], is_async: bool,
                        fired: str | None) -> None:
    """After an interrupted enter or exit and the hold object dropped (collected here):
    every lane consistent, nothing held, no unmatched release, and each lane works. An
    asyncio lane's dropped holds are ended on its loop (a view between two runs asks the
    loop): one turn of it first."""
    gc.collect()
    if is_async and not loop.is_closed():
        loop.run_until_complete(asyncio.sleep(0))
    for lane in lanes:
        check_consistent(lane._core)
        st = lane.stats
        assert (st.holders, st.unmatched_releases) == (0, 0), (lane.name, fired)
        if is_async:
            check_async_lane_works(loop, lane)
        else:
            check_thread_lane_works(lane)


_LEAVERS = ["SessionLane", "Lane", "Lane+priority", "acquire_all", "AsyncSessionLane",
            "AsyncLane", "async acquire_all", "acquire_all+view", "async acquire_all+view"]


@pytest.mark.filterwarnings("ignore::ResourceWarning")
@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")
@pytest.mark.filterwarnings("ignore:coroutine .* was never awaited:RuntimeWarning")
@pytest.mark.parametrize(
    ("what", "again"),
    [(w, False) for w in _LEAVERS] + [(w, True) for w in _LEAVERS if "acquire_all" in w],
)
def test_c18_interrupt_while_leaving_then_dropping_leaves_nothing_held(
    what: str, again: bool
) -> None:
    """C18 + C20: KeyboardInterrupt at every injection point of leaving a hold (or an
    ``acquire_all``, with or without a view of its holds), then the hold object
    dropped: nothing stays held, and no unmatched release is counted. A leave marks
    the hold released before releasing it; one stopped between the two once left the
    permit held for good, the finalizer seeing only the mark. Or, instead of the drop,
    an ``acquire_all`` released again (``release()``, safe twice), which ends it too."""

    def run_once(inj: Injector) -> None:
        loop = asyncio.new_event_loop()
        try:
            lanes: list[Any]
            if "acquire_all" in what:
                queue: Any = AsyncLaneQueue() if what.startswith("async") else LaneQueue()
                queue.add_session_lane("session", timeout_s=JOIN_S)
                queue.add_lane("global", max_concurrent=1, timeout_s=JOIN_S)
                lanes = [queue["session"], queue["global"]]
                hold: Any = queue.acquire_all(KEY, ["session", "global"])
            else:
                lane = (ASYNC_LANES if what.startswith("Async") else THREAD_LANES)[what]()
                lanes = [lane]
                hold = lane.acquire(KEY)
            is_async = what.startswith(("Async", "async"))
            if is_async:
                loop.run_until_complete(hold.__aenter__())
            else:
                hold.__enter__()
            if what.endswith("+view"):
                assert hold["session"].held  # the session lane's token, seen as a hold
            try:
                with inj.active():
                    if is_async:
                        loop.run_until_complete(hold.__aexit__(None, None, None))
                    else:
                        hold.__exit__(None, None, None)
            except KeyboardInterrupt:
                assert inj.fired is not None
            _finish(loop)
            # One more turn of the loop: it runs the done callbacks of the interrupted
            # task, whose exception's traceback still references the hold until then.
            loop.run_until_complete(asyncio.sleep(0))
            if again:
                done = hold.release()
                if is_async:
                    loop.run_until_complete(done)
            del hold
            _check_nothing_held(loop, lanes, is_async, inj.fired)
        finally:
            _finish(loop)
            loop.close()

    assert inject_everywhere(run_once) >= 2


_ENTERERS = ["SessionLane", "Lane", "Lane+priority", "acquire_all", "AsyncSessionLane",
             "AsyncLane", "AsyncLane+priority", "async acquire_all"]


@pytest.mark.filterwarnings("ignore::ResourceWarning")
@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")
@pytest.mark.filterwarnings("ignore:coroutine .* was never awaited:RuntimeWarning")
@pytest.mark.parametrize("how", ["free", "new key", "handoff"])
@pytest.mark.parametrize("what", _ENTERERS)
def test_c18_interrupt_while_entering_then_dropping_leaves_nothing_held(
    what: str, how: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """C18 + C20: KeyboardInterrupt at every injection point of entering a hold (or an
    ``acquire_all``), then the hold object dropped: nothing stays held, and no unmatched
    release is counted. Entering on the holds' own steps (the key IDLE, a permit free),
    through the core's take (a key new to the lane), or by a hand-off while parked (for
    ``acquire_all``, on its second lane). A grant is recorded in the hold (the
    ``acquire_all``) in the same commit or before the wait's handler ends, so an interrupt
    just after the grant leaves the permit to the hold's finalizer (or the
    ``acquire_all``'s rollback): it once stayed held, by nobody, until
    ``manual_release``."""
    is_async = what.startswith(("Async", "async"))

    def run_once(inj: Injector) -> None:
        loop = asyncio.new_event_loop()
        try:
            if "acquire_all" in what:
                queue: Any = AsyncLaneQueue() if is_async else LaneQueue()
                queue.add_session_lane("session", timeout_s=JOIN_S)
                queue.add_lane("global", max_concurrent=1, timeout_s=JOIN_S)
                lanes: list[Any] = [queue["session"], queue["global"]]
                hold: Any = queue.acquire_all(KEY, ["session", "global"])
            else:
                lanes = [(ASYNC_LANES if is_async else THREAD_LANES)[what]()]
                hold = lanes[0].acquire(KEY)
            core = lanes[-1]._core
            if how != "new key":  # the key IDLE on a per-key lane
                for lane in lanes:
                    assert lane._core.release(KEY, lane._core.take(KEY, True))
            other = holder = 0
            if how == "handoff" and core.per_key:
                holder = core.take(KEY, True)  # the key held: the enter parks on it
            elif how == "handoff":
                other = core.take("other", True)  # a counting lane of 1, full: parks

            freed: list[bool] = []

            def release() -> None:
                if freed:  # once: a second release would count as unmatched
                    return
                freed.append(True)
                with inj.pause():
                    if other:
                        core.release("other", other)
                    else:
                        core.release(KEY, holder)

            if how == "handoff" and not is_async:
                _grant_on_park(monkeypatch, release)
            try:
                with inj.active():
                    if is_async:
                        if how == "handoff":
                            loop.call_soon(release)  # runs once the task has parked
                        loop.run_until_complete(hold.__aenter__())
                    else:
                        hold.__enter__()
            except KeyboardInterrupt:
                assert inj.fired is not None
            monkeypatch.undo()
            _finish(loop)
            loop.run_until_complete(asyncio.sleep(0))  # (see the leaving test)
            if how == "handoff":
                release()  # unless the enter's wait did
            del hold
            _check_nothing_held(loop, lanes, is_async, inj.fired)
        finally:
            _finish(loop)
            loop.close()

    assert inject_everywhere(run_once) >= 2


def test_c18_injector_catches_acquire_then_try() -> None:
    """The injector finds the original fault: a critical section written as
    ``lock.acquire()`` then ``try:`` leaves the lock held when the exception lands at
    the check after the ``acquire`` call (a ``c_return`` point here)."""

    class Broken:
        def __init__(self) -> None:
            self.lock = threading.Lock()

        def take(self) -> None:
            lock = self.lock
            lock.acquire()
            try:
                pass
            finally:
                lock.release()

    leaked = []

    def run_once(inj: Injector) -> None:
        b = Broken()
        # Trace this test module's Broken.take as if it were in the core.
        _TRACED.add(__file__)
        try:
            with inj.active():
                b.take()
        except KeyboardInterrupt:
            pass
        finally:
            _TRACED.discard(__file__)
        if b.lock.locked():
            leaked.append(inj.fired)
            b.lock.release()

    inject_everywhere(run_once)
    assert any("after" in str(f) and "acquire" in str(f) for f in leaked), leaked


# -- random timer: the failing input ---------------------------------------------


@pytest.mark.skipif(not hasattr(signal, "setitimer"), reason="POSIX timers")
def test_c18_random_timer_interrupts_never_wedge_the_lane() -> None:
    """C18 failing input: ``SessionLane("s", timeout_s=0.5)``, ``with lane.acquire("k"):
    pass`` in a loop while a timer raises KeyboardInterrupt after 10-300 us, over and
    over. Expected: ``get_active()`` returns, the counters agree, and the lane works."""
    lane = SessionLane("s", timeout_s=0.5)
    rng = random.Random(18)
    interrupts = completed = 0
    deadline = time.monotonic() + 3.0
    with sigalrm_interrupts(again_s=1e-3) as armed:
        while interrupts < 500 and time.monotonic() < deadline:
            try:
                armed[0] = True
                signal.setitimer(signal.ITIMER_REAL, rng.uniform(10e-6, 300e-6))
                while True:  # until the interrupt lands, wherever it lands
                    with lane.acquire(KEY):
                        pass
                    completed += 1
            except KeyboardInterrupt:
                armed[0] = False  # first: no call (no check for signals) before it
                interrupts += 1
                # An interrupt inside the hold's enter or exit may leave that one hold.
                if KEY in in_thread(lane.get_active):
                    assert in_thread(lambda: lane.manual_release(KEY))
    assert interrupts >= 100 and completed > 0, (interrupts, completed)
    assert in_thread(lane.get_active) == {}
    check_consistent(lane._core)
    check_thread_lane_works(lane)


# -- C19: fork ---------------------------------------------------------------------------


@pytest.mark.skipif(not hasattr(os, "fork"), reason="os.fork")
@pytest.mark.filterwarnings("ignore::DeprecationWarning")  # fork with threads (3.12+)
def test_c19_forked_children_get_empty_usable_lanes() -> None:
    """C19: fork 20 children while 4 threads hammer a SessionLane. Each child's lane is
    empty and usable: ``try_acquire`` of an unrelated key succeeds, and so does a wait
    for a key the parent's threads were holding (those threads do not exist here)."""
    lane = SessionLane("s", timeout_s=5)
    stop = threading.Event()

    def hammer(i: int) -> None:
        while not stop.is_set():
            with lane.acquire(f"hot{i % 2}"):
                pass

    threads = [threading.Thread(target=hammer, args=(i,), daemon=True) for i in range(4)]
    for t in threads:
        t.start()
    children = []
    try:
        for _ in range(20):
            time.sleep(0.002)
            pid = os.fork()
            if pid == 0:  # the child: report by exit status only
                code = 1
                try:
                    st = lane.stats
                    ok = (
                        lane.try_acquire("unrelated")
                        and lane.acquire_timeout("hot0", 1.0)
                        and lane.active_count == 2
                        and lane.waiting == 0
                        and st.holders == 0
                        and st.acquired == st.released
                    )
                    code = 0 if ok else 3
                finally:
                    os._exit(code)
            children.append(pid)
    finally:
        stop.set()
        for t in threads:
            t.join(JOIN_S)
    statuses = {}
    deadline = time.monotonic() + 10.0
    pending = set(children)
    while pending and time.monotonic() < deadline:
        for pid in list(pending):
            done, status = os.waitpid(pid, os.WNOHANG)
            if done:
                statuses[pid] = os.waitstatus_to_exitcode(status)
                pending.discard(pid)
        time.sleep(0.01)
    for pid in pending:  # deadlocked: the fault
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
        statuses[pid] = "deadlocked"
    assert list(statuses.values()) == [0] * 20, statuses
    assert lane.stats.holders == 0  # the parent is untouched


def _in_child(check: Callable[[], bool]) -> Any:
    """Fork; run ``check`` in the child; its exit code (0: True), or "deadlocked"."""
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            code = 0 if check() else 3
        finally:
            os._exit(code)
    deadline = time.monotonic() + 10.0
    while time.monotonic() < deadline:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            return os.waitstatus_to_exitcode(status)
        time.sleep(0.01)
    os.kill(pid, signal.SIGKILL)
    os.waitpid(pid, 0)
    return "deadlocked"


@pytest.mark.skipif(not hasattr(os, "fork"), reason="os.fork")
@pytest.mark.filterwarnings("ignore::DeprecationWarning")  # fork with threads (3.12+)
def test_c19_fork_contract_holds_tokens_counters_and_asyncio() -> None:
    """What README says of fork: a hold taken before the fork is not held in the child
    (leaving it there is an unmatched release, counted and not logged; a manual_release
    of its key is logged); tokens keep growing; the counters keep
    the parent's history with ``acquired == released + holders``; an asyncio lane bound
    to a parent's loop binds the child's own loop."""
    lane = SessionLane("s")
    hold = lane.acquire("p")
    hold.__enter__()
    parent_token = hold.token
    alane = AsyncSessionLane("a")
    parent_loop = asyncio.new_event_loop()

    async def use() -> bool:
        async with alane.acquire(KEY, timeout_s=1):
            return alane.stats.holders == 1

    async def keep() -> Any:
        kept = alane.acquire(KEY)
        await kept.__aenter__()
        return kept

    try:
        assert parent_loop.run_until_complete(use())
        kept = parent_loop.run_until_complete(keep())  # held in the parent at the fork

        def child() -> bool:
            st = lane.stats
            fresh = lane.acquire("q")
            fresh.__enter__()
            ok = (
                not lane.is_held("p")
                and (st.acquired, st.released, st.holders) == (1, 1, 0)
                and fresh.token > parent_token
            )
            fresh.__exit__(None, None, None)
            records: list[logging.LogRecord] = []
            catch = logging.Handler(logging.WARNING)
            catch.emit = records.append  # type: ignore[method-assign]
            logging.getLogger("lanequeue").addHandler(catch)
            hold.__exit__(None, None, None)  # the parent's hold: nothing to end here
            # Counted, not logged (a release by token, as for any hold ended meanwhile)...
            ok = ok and lane.stats.unmatched_releases == 1 and lane.stats.holders == 0
            ok = ok and records == []
            # ... while a release by key that matches no hold is logged.
            ok = ok and lane.manual_release("p") is False and len(records) == 1
            ok = ok and "not held" in records[0].getMessage()
            ok = ok and lane.stats.unmatched_releases == 2
            return ok and asyncio.run(use()) and alane.stats.holders == 0

        assert _in_child(child) == 0
        assert lane.is_held("p") and alane.stats.holders == 1  # the parent is untouched
        parent_loop.run_until_complete(kept.__aexit__(None, None, None))
    finally:
        hold.__exit__(None, None, None)
        parent_loop.close()


# -- C20: dropped holds ------------------------------------------------------------------


@pytest.mark.parametrize("kind", list(THREAD_LANES))
def test_c20_dropped_thread_hold_warns_and_returns_its_permit(kind: str) -> None:
    """C20: a hold entered and garbage-collected without release warns (ResourceWarning
    naming lane and key) and its permit returns to the lane (a view sees it back)."""
    lane = THREAD_LANES[kind]()
    hold = lane.acquire(KEY)
    hold.__enter__()
    with pytest.warns(ResourceWarning, match=rf"{type(lane).__name__} '{lane.name}'.*key '{KEY}'"):
        del hold
        gc.collect()
    assert lane.active_count == 0  # a view is an operation: the permit is back
    assert lane.get_active() == {}
    assert lane.try_acquire(KEY)
    assert lane.manual_release(KEY)
    st = lane.stats
    assert (st.acquired, st.released, st.holders, st.unmatched_releases) == (2, 2, 0, 0)


def test_c20_dropped_hold_hands_over_to_a_waiter(park_hooks: Any) -> None:
    """The returned permit is a release: it hands the key to the thread in line."""
    lane = SessionLane("s", timeout_s=JOIN_S)
    hold = lane.acquire(KEY)
    hold.__enter__()
    box: dict[str, Any] = {}

    def waiter() -> bool:
        with lane.acquire(KEY):
            return True

    t = threading.Thread(target=lambda: box.setdefault("w", waiter()), name="W", daemon=True)
    t.start()
    assert park_hooks.parked("W").wait(JOIN_S)
    with pytest.warns(ResourceWarning):
        del hold
        gc.collect()
    assert lane.stats.holders in (0, 1)  # drained: handed to W (who may be done already)
    t.join(JOIN_S)
    assert box == {"w": True}
    assert lane.stats.holders == 0 and lane.stats.waiters == 0


def test_c20_dropped_hold_reaches_a_parked_waiter_with_no_other_operation() -> None:
    """A waiter already parked (a long timeout) gets a dropped hold's permit as the hold
    is collected, on both faces: nothing else has to touch the lane first (it once got
    it only at its own timeout, which then reported False)."""
    lane = SessionLane("s", warn_after_s=None)
    hold = lane.acquire(KEY)
    hold.__enter__()
    got: list[bool] = []
    t = threading.Thread(target=lambda: got.append(lane.acquire_timeout(KEY, 60.0)),
                         daemon=True)
    t.start()
    deadline = time.monotonic() + JOIN_S
    while lane.waiting < 1:
        assert time.monotonic() < deadline
        time.sleep(0.001)
    with pytest.warns(ResourceWarning):
        del hold
        gc.collect()
    t.join(JOIN_S)  # far below the waiter's 60 s
    assert got == [True]
    assert lane.manual_release(KEY) and lane.stats.holders == 0

    async def main() -> None:
        alane = AsyncLane("g", max_concurrent=1, warn_after_s=None)
        box = {"hold": alane.acquire(KEY)}
        await box["hold"].__aenter__()
        waiter = asyncio.ensure_future(alane.acquire_timeout(KEY, 60.0))
        while alane.waiting < 1:
            await asyncio.sleep(0)
        with pytest.warns(ResourceWarning):
            box.clear()
            gc.collect()
        assert await asyncio.wait_for(waiter, JOIN_S) is True
        assert await alane.manual_release(KEY) and alane.stats.holders == 0

    asyncio.run(main())


def test_c20_finalizer_inside_the_core_lock_is_deferred() -> None:
    """A finalizer may run while its thread holds the core's lock (a collection started
    inside a critical section): it must neither deadlock nor touch the state then."""
    lane = SessionLane("s")
    core = lane._core
    hold = lane.acquire(KEY)
    hold.__enter__()
    with pytest.warns(ResourceWarning), core._lock:  # as if inside take/release
        del hold
        gc.collect()
        assert core._entries[KEY].token != 0 and core._dropped  # only recorded
    assert not lane.is_held(KEY)
    check_consistent(core)


@pytest.mark.parametrize("kind", list(THREAD_LANES))
def test_c20_a_deferred_drop_is_ended_by_the_acquire_that_needs_its_permit(kind: str) -> None:
    """A drop recorded inside the core's lock (deferred) is ended by the first acquire
    that needs its permit, although the holds' fast steps (another key taken and
    released with nobody in line) do not look for it: the key's (or the full lane's)
    next acquire gets the permit without waiting."""
    lane = THREAD_LANES[kind]()
    other = Lane("o", max_concurrent=1) if kind != "SessionLane" else lane
    hold = lane.acquire(KEY)
    hold.__enter__()
    with pytest.warns(ResourceWarning), lane._core._lock:  # deferred: only recorded
        del hold
        gc.collect()
    for _ in range(3):  # fast steps of another key (on a per-key lane, this same lane)
        with other.acquire("another"):
            pass
    with lane.acquire(KEY, timeout_s=0) as again:  # no wait: the drop was ended first
        assert again.held
    st = lane.stats
    assert (st.holders, st.unmatched_releases, st.timeouts) == (0, 0, 0)
    check_consistent(lane._core)


def test_c20_holds_left_through_their_block_shed_their_finalizer() -> None:
    """The finalizer of a dropped hold is a Python call at every hold's end: only a hold
    still held needs it. A hold left through its block (fast or general path, released
    early or not) is an instance of its face's public class, which has no finalizer,
    and behaves as an ended hold; one still held keeps it (and warns when dropped)."""
    lanes = [SessionLane("s"), Lane("g", max_concurrent=1)]
    for lane in lanes:
        with lane.acquire(KEY) as hold:
            assert hasattr(type(hold), "__del__")  # held: watched
        assert type(hold) is ThreadHold and not hasattr(ThreadHold, "__del__")
        assert not hold.held and hold.token > 0 and "released" in repr(hold)
        with pytest.raises(NotOwnerError):
            hold.release()
        with pytest.raises(RuntimeError, match="already entered"):
            hold.__enter__()
        with lane.acquire(KEY) as hold:
            hold.release()  # released early: leaving the block ends the watch too
        assert type(hold) is ThreadHold
        hold = lane.acquire(KEY)
        with hold:  # the general path: another thread waits behind it
            t = threading.Thread(target=lambda lane=lane: lane.acquire_timeout(KEY, JOIN_S)
                                 and lane.manual_release(KEY), daemon=True)
            t.start()
            deadline = time.monotonic() + JOIN_S
            while lane.waiting < 1:
                assert time.monotonic() < deadline
                time.sleep(0.001)
        t.join(JOIN_S)
        assert type(hold) is ThreadHold and lane.stats.holders == 0
    queue = LaneQueue()
    queue.add_session_lane("session")
    queue.add_lane("global", max_concurrent=2)
    with queue.acquire_all(KEY, ["session", "global"]) as multi:
        assert hasattr(type(multi), "__del__")
    assert not hasattr(type(multi), "__del__") and isinstance(multi, lanequeue.MultiHold)
    multi.release()  # safe twice, as before

    async def main() -> None:
        alane = AsyncSessionLane("a")
        async with alane.acquire(KEY) as ahold:
            assert hasattr(type(ahold), "__del__")
        assert type(ahold) is AsyncHold and not hasattr(AsyncHold, "__del__")
        aqueue = AsyncLaneQueue()
        aqueue.add_session_lane("session")
        async with aqueue.acquire_all(KEY, ["session"]) as amulti:
            assert hasattr(type(amulti), "__del__")
        assert not hasattr(type(amulti), "__del__")
        await amulti.release()

    asyncio.run(main())


def test_c20_dropped_async_hold_warns_and_returns_its_permit() -> None:
    async def main() -> None:
        for lane in (AsyncSessionLane("s"), AsyncLane("g", max_concurrent=1)):
            hold = lane.acquire(KEY)
            await hold.__aenter__()
            with pytest.warns(ResourceWarning, match=rf"{type(lane).__name__} '{lane.name}'"):
                del hold
                gc.collect()
            async with lane.acquire(KEY, timeout_s=0):  # free again
                pass
            assert lane.stats.holders == 0

    asyncio.run(main())


@pytest.mark.parametrize("view", [False, True])
def test_c20_dropped_acquire_all_returns_every_permit(view: bool) -> None:
    queue = _queue()
    multi = queue.acquire_all(KEY, ["session", "global"])
    entered = multi.__enter__()
    if view:
        assert entered["session"].held  # the session token, seen as a Hold
    del entered
    with pytest.warns(ResourceWarning) as record:
        del multi
        gc.collect()
    text = " ".join(str(w.message) for w in record)
    assert "SessionLane 'session'" in text and "Lane 'global'" in text
    for name in ("session", "global"):
        assert queue[name].get_active() == {}
        assert queue[name].stats.holders == 0
    with queue.acquire_all(KEY, ["session", "global"], timeout_s=0):
        pass


# -- errors ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("make", "error", "message"),
    [
        (lambda: Lane(), TypeError, r"^Lane\.__init__\(\) missing 1 required positional "
                                    r"argument: 'name'$"),
        (lambda: AsyncLane(), TypeError, r"^AsyncLane\.__init__\(\) missing"),
        (lambda: SessionLane(bogus=1), TypeError,
         r"^SessionLane\.__init__\(\) got an unexpected keyword argument 'bogus'$"),
        (lambda: AsyncSessionLane("s", 3), TypeError, r"^AsyncSessionLane\.__init__\(\) takes"),
        (lambda: Lane(3), TypeError, r"^Lane\(\) argument 'name' must be a str, not int$"),
        (lambda: SessionLane(""), ValueError, r"^SessionLane\(\) argument 'name' must be a "
                                              r"non-empty string$"),
        (lambda: Lane("g", max_concurrent=0), ValueError,
         r"^Lane\(\) argument 'max_concurrent' must be >= 1, got 0$"),
        (lambda: AsyncSessionLane(max_sessions="3"), TypeError,
         r"^AsyncSessionLane\(\) argument 'max_sessions' must be an int, not str$"),
        (lambda: SessionLane(idle_timeout_s=-1), ValueError,
         r"^SessionLane\(\) argument 'idle_timeout_s' must be >= 0 seconds"),
        (lambda: AsyncLane("g", timeout_s=float("nan")), ValueError,
         r"^AsyncLane\(\) argument 'timeout_s' must not be NaN$"),
        (lambda: Lane("g", clock=5), TypeError, r"^Lane\(\) argument 'clock' must be a callable"),
        (lambda: LaneQueue().add_lane(), TypeError,
         r"^LaneQueue\.add_lane\(\) missing 1 required positional argument: 'name'$"),
        (lambda: AsyncLaneQueue().add_session_lane("s", bogus=1), TypeError,
         r"^AsyncLaneQueue\.add_session_lane\(\) got an unexpected keyword argument"),
        # A lane the queue builds names the call made, not the lane class (README).
        (lambda: LaneQueue().add_lane("g", max_concurrent=0), ValueError,
         r"^LaneQueue\.add_lane\(\) argument 'max_concurrent' must be >= 1"),
        (lambda: AsyncLaneQueue().add_session_lane(max_sessions=0), ValueError,
         r"^AsyncLaneQueue\.add_session_lane\(\) argument 'max_sessions' must be >= 1"),
    ],
)
def test_constructor_errors_name_the_public_class_and_argument(
    make: Callable[[], Any], error: type[Exception], message: str
) -> None:
    """``Lane()`` used to report ``CountingKind.__init__() missing ...``: every
    constructor error names the public class and the argument."""
    with pytest.raises(error, match=message) as info:
        make()
    assert "Kind" not in str(info.value) and "QueueBase" not in str(info.value)


def test_timeout_message_keeps_the_source_wording_and_adds_the_wait() -> None:
    """``<Class> '<name>' timeout for key '<key>'`` (the source design's wording, which
    callers match on) plus the seconds waited; picklable, attributes kept."""
    lane = SessionLane("session", timeout_s=0.05)
    assert lane.try_acquire(KEY)
    with pytest.raises(LaneTimeoutError) as info, lane.acquire(KEY):
        pass
    err = info.value
    assert str(err) == "SessionLane 'session' timeout for key 'k' after 0.05 s"
    assert (err.lane, err.key, err.timeout_s, err.lane_class) == ("session", KEY, 0.05,
                                                                  "SessionLane")
    assert isinstance(err, TimeoutError)
    back = pickle.loads(pickle.dumps(err))
    assert type(back) is LaneTimeoutError and str(back) == str(err)
    assert (back.lane, back.key, back.timeout_s, back.lane_class) == (
        err.lane, err.key, err.timeout_s, err.lane_class)

    queue = _queue()
    assert queue["global"].try_acquire("other")
    with pytest.raises(
        LaneTimeoutError, match=r"^Lane 'global' timeout for key 'k' after 0 s$"
    ), queue.acquire_all(KEY, ["session", "global"], timeout_s=0):
        pass

    async def main() -> None:
        alane = AsyncLane("g", max_concurrent=1)
        async with alane.acquire("x"):
            with pytest.raises(LaneTimeoutError,
                               match=r"^AsyncLane 'g' timeout for key 'k' after 0\.01 s$"):
                async with alane.acquire(KEY, timeout_s=0.01):
                    pass

    asyncio.run(main())


# -- interrupts inside a dropped hold's finalizer ----------------------------------------

@pytest.mark.parametrize("what", ["SessionLane", "Lane", "acquire_all"])
def test_c20_interrupt_inside_a_dropped_holds_finalizer_keeps_the_lane_whole(
    what: str,
) -> None:
    """C18 + C20: a KeyboardInterrupt at every point of the finalizer of a hold dropped
    while held (and of what it calls) after its record: the core's lock is never left
    held (an interrupt right after the finalizer's ``acquire(False)`` left it held by
    this thread for good, and every other thread blocked), and the permit comes back
    (an interrupt before the old ``drop_hold``/``drop`` calls had recorded it lost it); for
    an ``acquire_all``, one landing between the records of its lanes leaves the lanes not
    recorded yet held, visible and ended by ``manual_release``."""

    def run_once(inj: Injector) -> None:
        if what == "acquire_all":
            queue = LaneQueue()
            queue.add_session_lane("session", timeout_s=JOIN_S)
            queue.add_lane("global", max_concurrent=1, timeout_s=JOIN_S)
            lanes: list[Any] = [queue["session"], queue["global"]]
            holds: list[Any] = [queue.acquire_all(KEY, ["session", "global"])]
        else:
            lanes = [THREAD_LANES[what]()]
            holds = [lanes[0].acquire(KEY)]
        holds[0].__enter__()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", ResourceWarning)
            with inj.active():
                holds.clear()  # the only reference: finalized right here
        where = f"after an interrupt at {inj.fired}"
        for lane in lanes:
            core = lane._core
            assert not core._lock._is_owned(), where
            assert in_thread(lambda c=core: c._lock.acquire(timeout=JOIN_S)
                             and not c._lock.release()), where
            check_consistent(core)  # (ends the recorded drop, as the next operation would)
            if (lane.stats.holders and what == "acquire_all"
                    and inj.fired_code is not None and inj.fired_code.co_name == "__del__"):
                # Between the records of its lanes (one C call each): the lanes not
                # recorded yet keep their permit, shown and ended by manual_release
                # (README, "Dropped holds").
                assert KEY in lane.get_active() and lane.manual_release(KEY), where
            assert lane.stats.holders == 0, where
            check_thread_lane_works(lane)

    assert inject_everywhere(run_once, finalizers=True) >= 3


def test_an_interrupt_during_acquire_alls_rollback_is_not_swallowed() -> None:
    """A KeyboardInterrupt that lands while a failing ``acquire_all`` gives back what it
    took propagates (it was logged and attached as a note to the LaneTimeoutError, which
    the caller saw instead: Ctrl-C lost), once every hold is released."""
    queue = LaneQueue()
    session = queue.add_session_lane("session")
    cap = queue.add_lane("global", max_concurrent=1)
    assert cap.try_acquire("other")  # the global lane is full: the call times out
    fired: list[str] = []

    def tracer(frame: FrameType, event: str, arg: Any) -> Any:
        code = frame.f_code
        if event == "call" and code.co_name == "release" and code.co_filename == _CORE:
            sys.settrace(None)
            fired.append(f"{code.co_qualname}")
            raise KeyboardInterrupt
        return None

    sys.settrace(tracer)
    try:
        with pytest.raises(KeyboardInterrupt), queue.acquire_all(
                KEY, ["session", "global"], timeout_s=0.01):
            pass
    finally:
        sys.settrace(None)
    assert fired  # it landed in the rollback's release of the session lane
    check_consistent(session._core)  # nothing lost: the interrupted release is whole
    assert cap.manual_release("other")
    assert session.stats.holders in (0, 1)
    if session.stats.holders:  # the one hold being left, as the rules allow
        assert session.manual_release(KEY)
    check_thread_lane_works(session)


@pytest.mark.filterwarnings("ignore::ResourceWarning")
@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")
@pytest.mark.parametrize("what", [*THREAD_LANES, "acquire_all"])
def test_c18_second_interrupt_after_a_hand_off_leaves_nothing_held_once_dropped(
    what: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """C18 + C20, Ctrl-C twice: the first interrupt lands just after a parked waiter was
    handed the permit (its park returned; nothing recorded in the hold yet), the second
    at every point of the clean-up that follows where CPython can deliver one. Then the
    hold (the ``acquire_all``) is dropped: nothing stays held. The clean-up stopped
    before it recorded or passed on the grant once left the permit held by nobody for
    good; the hold keeps its parked waiter, and its finalizer returns such a grant."""

    def run_once(inj: Injector) -> None:
        if what == "acquire_all":
            queue = _queue()
            lanes: list[Any] = [queue["session"], queue["global"]]
            hold: Any = queue.acquire_all(KEY, ["session", "global"])
        else:
            lanes = [THREAD_LANES[what]()]
            hold = lanes[0].acquire(KEY, timeout_s=JOIN_S)
        core = lanes[-1]._core
        holder = core.take(KEY, True)  # (the last lane: a counting lane of 1 is full)
        original = _ThreadWaiter.park

        def park(waiter: _ThreadWaiter, timeout: float | None) -> bool:
            monkeypatch.undo()
            assert core.release(KEY, holder) and waiter.token > 0  # handed over
            inj.paused = False  # count injection points from the first interrupt on
            raise KeyboardInterrupt("the first interrupt, just after the hand-off")

        monkeypatch.setattr(_ThreadWaiter, "park", park)
        inj.paused = True
        with pytest.raises(KeyboardInterrupt), inj.active():
            hold.__enter__()
        monkeypatch.setattr(_ThreadWaiter, "park", original)
        monkeypatch.undo()
        del hold
        _check_nothing_held(None, lanes, False, inj.fired)  # type: ignore[arg-type]

    assert inject_everywhere(run_once, real_points=True) >= 3


@pytest.mark.filterwarnings("ignore::ResourceWarning")
@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")
def test_c18_second_interrupt_in_acquire_alls_rollback_leaves_nothing_held_once_dropped(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """C18 + C20, Ctrl-C twice in a failing ``acquire_all``'s rollback: the first
    interrupt at the entry of the session lane's release, the second at every point of
    the retry that follows where CPython can deliver one. Once the ``acquire_all`` is
    dropped, nothing stays held. A second stop at the same hold once dropped it from the
    list unreleased (held by nobody for good); now the pass ends with it still listed,
    for the finalizer (or a later ``release()``)."""

    def run_once(inj: Injector) -> None:
        queue = _queue()
        session, cap = queue["session"], queue["global"]
        assert cap.try_acquire("other")  # the global lane is full: the call times out
        multi = queue.acquire_all(KEY, ["session", "global"], timeout_s=0.01)
        first: list[str] = []
        real_release = SessionCore.release

        def release(self: Any, key: str, token: int = 0) -> bool:
            monkeypatch.setattr(SessionCore, "release", real_release)
            first.append(key)
            inj.paused = False  # the second interrupt: at every point from here on
            raise KeyboardInterrupt("the first interrupt, in the rollback")

        monkeypatch.setattr(SessionCore, "release", release)
        inj.paused = True
        with pytest.raises(KeyboardInterrupt), inj.active():
            multi.__enter__()
        monkeypatch.undo()
        assert first
        del multi
        assert cap.manual_release("other")
        _check_nothing_held(None, [session, cap], False, inj.fired)  # type: ignore[arg-type]

    assert inject_everywhere(run_once, real_points=True) >= 2


@pytest.mark.filterwarnings("ignore::ResourceWarning")
@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")
@pytest.mark.filterwarnings("ignore:coroutine .* was never awaited:RuntimeWarning")
@pytest.mark.parametrize("what", [*ASYNC_LANES, "async acquire_all"])
def test_c18_second_interrupt_after_an_async_hand_off_leaves_nothing_held_once_dropped(
    what: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The asyncio face of the test above: a parked task is handed the permit and
    resumes; the first interrupt lands as it records the grant, the second at every
    point of the clean-up that follows where CPython can deliver one. Then the hold
    (the ``acquire_all``) is dropped: nothing stays held, nothing is released twice."""
    import lanequeue.aio as aio

    def run_once(inj: Injector) -> None:
        loop = asyncio.new_event_loop()
        try:
            if what == "async acquire_all":
                queue = AsyncLaneQueue()
                queue.add_session_lane("session", timeout_s=JOIN_S)
                queue.add_lane("global", max_concurrent=1, timeout_s=JOIN_S)
                lanes: list[Any] = [queue["session"], queue["global"]]
                hold: Any = queue.acquire_all(KEY, ["session", "global"])
            else:
                lanes = [ASYNC_LANES[what]()]
                hold = lanes[0].acquire(KEY, timeout_s=JOIN_S)
            core = lanes[-1]._core
            holder = loop.run_until_complete(_take_now(core))
            real_record = aio.record
            handed: list[int] = []

            def record(into: Any, token: int) -> int:
                monkeypatch.setattr(aio, "record", real_record)
                handed.append(token)
                inj.paused = False  # count injection points from the first interrupt on
                raise KeyboardInterrupt("the first interrupt, as the grant is recorded")

            async def op(hold: Any) -> None:
                task = asyncio.ensure_future(hold.__aenter__())
                await asyncio.sleep(0)  # parked behind the holder
                assert core.release(KEY, holder)  # handed over to the parked task
                await task

            monkeypatch.setattr(aio, "record", record)
            inj.paused = True
            with pytest.raises(KeyboardInterrupt), inj.active():
                loop.run_until_complete(op(hold))
            monkeypatch.undo()
            assert handed and handed[0] > 0  # the first interrupt came after the hand-off
            _finish(loop)
            del hold
            _check_nothing_held(loop, lanes, True, inj.fired)
        finally:
            _finish(loop)
            loop.close()

    assert inject_everywhere(run_once, real_points=True) >= 3


def test_each_lane_and_hold_class_runs_its_own_copy_of_the_shared_code() -> None:
    """CPython keeps the specialised sites of a function in its code object: a class
    that runs shared code on its own instances has its own copy of that code, so a
    process that uses several lane kinds or both faces keeps every site specialised.
    The copies are the same code (same bytecode, names, defaults) under their own
    code object."""
    import itertools

    from lanequeue import AsyncLane, AsyncSessionLane
    from lanequeue.aio import _AsyncMultiAcquire
    from lanequeue.queue import _MultiAcquire

    def hot(cls: type) -> dict[str, Any]:
        names = ("acquire", "try_acquire", "__enter__", "__exit__", "__aenter__",
                 "__aexit__", "_step_in", "_step_out", "_steps_in", "_steps_out")
        return {n: getattr(cls, n) for n in names if callable(getattr(cls, n, None))}

    lanes: list[Any] = [Lane, SessionLane, AsyncLane, AsyncSessionLane]
    holds = [lane._hold_class for lane in lanes]
    multis = [_MultiAcquire, _AsyncMultiAcquire]
    classes = lanes + holds + multis
    assert len(set(holds)) == 4
    seen: dict[int, str] = {}
    for cls in classes:
        for name, fn in hot(cls).items():
            code = fn.__code__
            where = f"{cls.__name__}.{name}"
            assert id(code) not in seen, f"{where} shares its code with {seen[id(code)]}"
            seen[id(code)] = where
    # the same code, as copies: SessionLane's and Lane's acquire, the holds' steps
    for a, b in itertools.combinations([Lane.acquire, SessionLane.acquire], 2):
        assert a.__code__.co_code == b.__code__.co_code and a.__defaults__ == b.__defaults__
    assert (holds[1].__dict__["__enter__"].__code__.co_code
            == holds[3].__dict__["_step_in"].__code__.co_code)
    # Private methods are not copied: patching an internal base's reaches every class.
    from lanequeue._kinds import LaneKind

    for lane in lanes:
        assert lane.__repr__ is LaneKind.__repr__ and lane._hold_list is LaneKind._hold_list


def test_every_module_imports_where_the_platform_does_not_fork() -> None:
    """Where ``os.fork`` and ``os.register_at_fork`` do not exist (Windows), every module
    still imports and a lane works: the fork hooks are registered only where processes
    fork."""
    code = (
        "import os, pkgutil, importlib\n"
        "del os.register_at_fork, os.fork\n"
        "import lanequeue\n"
        "names = [m.name for m in pkgutil.walk_packages(lanequeue.__path__, 'lanequeue.')\n"
        "         if not m.name.endswith('__main__')]\n"
        "for name in names:\n"
        "    importlib.import_module(name)\n"
        "lane = lanequeue.SessionLane()\n"
        "with lane.acquire('k'):\n"
        "    pass\n"
        "print(len(names))\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 0, done.stderr
    assert int(done.stdout) > 40  # (the package's modules, the optional ones included)
