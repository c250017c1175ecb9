"""Interrupts in the delivery of a loop timer: the asyncio faces' timers are
:class:`lanequeue._ops.LoopTimer`, which a ``KeyboardInterrupt`` landing anywhere in the
loop's call of it (``Handle._run``'s entry, the timer's own entry, the callee's entry, or
anywhere inside the callee) cannot lose. A plain ``loop.call_at`` handle is consumed by
such an interrupt, and the lane's waits then never timed out.

The injector raises ``KeyboardInterrupt`` at the N-th point (a Python function's entry or
return, a builtin's return) inside a timer's delivery, counted from ``Handle._run``'s
entry for a LoopTimer, for N = 1, 2, ... until the run completes with no injection left.
After each injection (injection off) the loop is run on, and every deadline must still
come: the waits end timed out, each counted once, each slow wait reported at most once.
"""

from __future__ import annotations

import asyncio
import inspect
from asyncio import events
from collections.abc import Callable
from types import FrameType
from typing import Any

import pytest
from conftest import FakeClockLoop
from dispatch_helpers import Stepped, Turns
from interrupt_points import Injector, inject_everywhere, library

from lanequeue import AsyncLane, AsyncSessionLane
from lanequeue._ops import LoopTimer

_HANDLE_RUN = events.Handle._run.__code__


def _ours(frame: FrameType) -> bool:
    """A Handle._run frame delivering one of our LoopTimers."""
    if frame.f_code is not _HANDLE_RUN:
        return False
    cb = frame.f_locals.get("self")
    cb = getattr(cb, "_callback", None)
    return isinstance(getattr(cb, "__self__", None), LoopTimer)


#: The points of a LoopTimer's delivery (see the module docstring).
_IN_DELIVERY: dict[str, Any] = {"traced": library(), "scope": _ours,
                                "points": {"call", "return", "c_return"}}


def _run(inj: Injector, step: Callable[[], None]) -> None:
    """Run ``step`` traced; an injected interrupt ends it (and is swallowed)."""
    if isinstance(inj.run(step, catch=KeyboardInterrupt), KeyboardInterrupt):
        assert inj.fired is not None  # ours, not the test's


def _sweep(case: Callable[[Injector], None], least: int) -> int:
    """Run ``case`` with an injection at point 1, 2, ... of a LoopTimer's delivery (see
    the module docstring) until none is left."""
    n = inject_everywhere(case, 1000, **_IN_DELIVERY)
    assert n >= least, f"the tracer saw only {n} points: it did not reach the timer"
    return n


def _lane_case(kind: str, inj: Injector) -> None:
    """A holder; waits a (timeout 3 s) and b (1 s), both slow past 0.5 s; the clock
    moves past each deadline with the injector on, then on without it."""
    loop = FakeClockLoop()
    warned: list[str] = []

    def on_wait(lane: Any, key: str, waited_s: float, ahead: int) -> None:
        warned.append(key)

    if kind == "session":
        lane: Any = AsyncSessionLane("s", timeout_s=None, warn_after_s=0.5, on_wait=on_wait)
        keys = ("k", "k", "k")
    else:
        lane = AsyncLane("g", max_concurrent=1, timeout_s=None, warn_after_s=0.5,
                         on_wait=on_wait)
        keys = ("h", "a", "b")
    try:
        holder = loop.create_task(lane.try_acquire(keys[0]))
        loop.settle()
        assert holder.result() is True
        a = loop.create_task(lane.acquire_timeout(keys[1], 3.0))
        b = loop.create_task(lane.acquire_timeout(keys[2], 1.0))
        loop.settle()
        assert lane.waiting == 2
        for to in (1000.6, 1001.1, 1003.1):
            loop.fake_now = to
            _run(inj, loop.settle)
            loop.settle()  # injection off: what the interrupt left runs on
        assert a.done() and b.done(), f"a wait outlived its deadline ({inj.fired})"
        assert a.result() is False and b.result() is False
        st = lane.stats
        assert (st.timeouts, st.waiters, st.holders) == (2, 0, 1), (st, inj.fired)
        assert len(warned) <= 2, (warned, inj.fired)  # one per wait at most
        if inj.fired is None:
            assert len(warned) == 2  # and, uninterrupted, exactly one
    finally:
        loop.shutdown()


@pytest.mark.timeout(120)
@pytest.mark.parametrize("kind", ["session", "counting"])
def test_an_interrupt_anywhere_in_a_lane_timers_delivery_never_loses_a_deadline(
        kind: str) -> None:
    n = _sweep(lambda inj: _lane_case(kind, inj), 10)
    print(f"{kind}: {n} injection points")


@pytest.mark.timeout(30)
def test_a_plain_loop_handle_would_be_lost_where_a_loop_timer_is_not() -> None:
    """The fault this guards against, shown on the loop itself: an interrupt at
    ``Handle._run``'s entry consumes a ``call_at`` handle for good; a LoopTimer's call
    comes anyway, once."""
    loop = FakeClockLoop()
    plain: list[int] = []
    ours: list[LoopTimer] = []
    try:
        def due() -> None:
            plain.append(1)

        loop.call_at(1001.0, due)
        first = Injector(1, traced=lambda code: False, scope=lambda frame: (
            frame.f_code is _HANDLE_RUN
            and getattr(frame.f_locals["self"], "_callback", None) is due))
        loop.fake_now = 1001.0
        first.run(loop.settle, catch=KeyboardInterrupt)
        loop.settle()
        assert first.fired is not None and plain == []  # lost

        timer = LoopTimer(loop, 1002.0, ours.append)
        inj = Injector(1, **_IN_DELIVERY)
        loop.fake_now = 1002.0
        _run(inj, loop.settle)
        assert inj.fired is not None and "Handle._run" in inj.fired
        loop.settle()
        assert ours == [timer]  # it came, once
        assert timer.ran
    finally:
        loop.shutdown()


@pytest.mark.timeout(30)
def test_a_cancelled_loop_timer_never_calls() -> None:
    loop = FakeClockLoop()
    calls: list[LoopTimer] = []
    try:
        timer = LoopTimer(loop, 1001.0, calls.append)
        assert timer.when() == 1001.0
        timer.cancel()
        timer.cancel()  # idempotent
        loop.advance(5.0)
        assert calls == []
        done = LoopTimer(loop, 1010.0, calls.append)
        loop.advance(5.0)
        assert calls == [done]
        done.cancel()  # after its call: nothing more
        loop.advance(5.0)
        assert calls == [done]
    finally:
        loop.shutdown()


@pytest.mark.timeout(120)
def test_an_interrupt_anywhere_in_a_dispatchers_start_deadline_timer_never_loses_it() -> None:
    """The asyncio Dispatcher's start deadline: a pending turn whose deadline timer is
    interrupted anywhere (in its delivery, or inside the machine's step) still ends
    timed out, and never runs."""

    def case(inj: Injector) -> None:
        s = Stepped(global_cap=4)
        turns = Turns()
        try:
            first = s.submit("k", turns.turn, "first")
            late = s.submit("k", turns.turn, "late", timeout_s=1.0)
            assert not late.done()
            s.loop.fake_now += 1.5
            _run(inj, s.loop.settle)
            s.settle()
            assert late.done(), f"the start deadline was lost ({inj.fired})"
            assert (late.state, late.reason) == ("timed_out", "start timeout"), (
                late, inj.fired)
            turns.finish("first")
            s.settle()
            assert first.done() and turns.started() == ["first"]
            st_ = s.d.stats
            assert (st_.pending, st_.running, st_.timed_out, st_.done) == (0, 0, 1, 1)
        finally:
            s.close()

    _sweep(case, 10)


@pytest.mark.timeout(180)
def test_an_interrupt_in_the_deadline_step_keeps_the_stale_count_and_later_deadlines() -> None:
    """The deadline step pops stale entries (tickets that left their line) as well: an
    interrupt anywhere in it must not leave the count of stale entries too high, which
    would let a later ordinary cancel drop the heap with a live deadline in it."""

    def case(inj: Injector) -> None:
        s = Stepped(global_cap=4)
        turns = Turns()
        try:
            first = s.submit("k", turns.turn, "first")
            gone = s.submit("k", turns.turn, "gone", timeout_s=0.5)
            late = s.submit("k", turns.turn, "late", timeout_s=1.0)
            later = s.submit("k", turns.turn, "later", timeout_s=3.0)
            other = s.submit("k", turns.turn, "other", timeout_s=5.0)
            s.call(s.d.cancel, gone)  # its deadline entry is stale now
            s.loop.fake_now += 1.5
            _run(inj, s.loop.settle)
            s.settle()
            assert late.state == "timed_out", (late, inj.fired)
            s.call(s.d.cancel, other)  # an ordinary cancel: must not drop "later"'s entry
            s.advance(2.0)  # 3.5 s: past "later"'s deadline
            assert (later.state, later.reason) == ("timed_out", "start timeout"), (
                later, inj.fired, s.d._machine._deadlines, s.d._machine._stale)
            turns.finish("first")
            s.settle()
            assert first.done() and turns.started() == ["first"], inj.fired
        finally:
            s.close()

    _sweep(case, 10)


@pytest.mark.timeout(60)
def test_a_repeated_launch_leaves_the_run_timeout_to_the_task_that_runs_the_turn() -> None:
    """A launch repeated after an interrupt (its effect ran twice) makes a second task
    that returns at once: the turn's interrupt still reaches the task that runs it."""
    s = Stepped(global_cap=4)
    turns = Turns()
    try:
        t = s.submit("k", turns.turn, "slow", run_timeout_s=1.0)
        assert turns.started() == ["slow"]
        job = t._job
        runner = job.runner
        s.call(s.d._launch, job)  # the repeat: refused by enter, returns at once
        s.settle()
        assert job.runner is runner and job.handle is runner
        s.advance(1.5)
        assert (t.state, t.reason) == ("timed_out", "run timeout") and (
            ("cancelled", "slow") in turns.log)
    finally:
        s.close()


@pytest.mark.timeout(120)
def test_an_interrupt_anywhere_in_a_dispatchers_run_timeout_timer_still_ends_the_turn() -> None:
    """A run timeout whose timer is interrupted anywhere still cancels the running turn
    (the end is recorded before the turn is signalled, and signalled again with the
    face's interrupt), and the ticket ends timed out."""

    def case(inj: Injector) -> None:
        s = Stepped(global_cap=4)
        turns = Turns()
        try:
            t = s.submit("k", turns.turn, "slow", run_timeout_s=1.0)
            assert turns.started() == ["slow"]
            s.loop.fake_now += 1.5
            _run(inj, s.loop.settle)
            s.settle()
            assert t.done(), f"the run timeout was lost ({inj.fired}): {t}"
            assert (t.state, t.reason) == ("timed_out", "run timeout"), (t, inj.fired)
            assert ("cancelled", "slow") in turns.log
        finally:
            s.close()

    _sweep(case, 10)


@pytest.mark.timeout(60)
def test_a_repeated_deadline_call_leaves_one_deadline_timer() -> None:
    """An interrupt right after a deadline timer's call returned makes the call come
    again (its spare); the repeat leaves the timer set since alone, so the machine
    still keeps one deadline timer, and each later deadline is served by one call."""
    from lanequeue.dispatch import _machine

    calls: list[float] = []
    orig = _machine.Machine._deadlines_due

    def counted(self: Any, due: float) -> None:
        calls.append(due)
        orig(self, due)

    def deadline_timers(loop: Any) -> int:
        owners = {getattr(h._callback, "__self__", None) for h in loop._scheduled
                  if not h.cancelled()}
        return sum(1 for o in owners if isinstance(o, LoopTimer) and not o.ran)

    _machine.Machine._deadlines_due = counted  # type: ignore[method-assign]
    s = Stepped(global_cap=4)
    turns = Turns()
    try:
        s.submit("k", turns.turn, "first")
        late = [s.submit("k", turns.turn, f"t{i}", timeout_s=1.0 + i) for i in range(5)]
        assert deadline_timers(s.loop) == 1
        lines, first_line = inspect.getsourcelines(LoopTimer._run)
        ran_line = first_line + next(
            i for i, line in enumerate(lines) if line.strip() == "self.ran = True")
        returned = Injector(  # right after fn returned
            1, traced=lambda code: code is LoopTimer._run.__code__, points={"line"},
            only=lambda frame: frame.f_lineno == ran_line)
        s.loop.fake_now += 1.5
        returned.run(s.loop.settle, catch=KeyboardInterrupt)
        assert returned.fired is not None
        s.settle()
        assert late[0].state == "timed_out" and not late[1].done()
        assert len(calls) == 2  # the call, and its repeat
        assert deadline_timers(s.loop) == 1
        for i in range(1, 5):
            s.advance(1.0)
            assert late[i].state == "timed_out"
            assert deadline_timers(s.loop) == (1 if i < 4 else 0)
        assert len(calls) == 2 + 4  # one call per later deadline
    finally:
        _machine.Machine._deadlines_due = orig  # type: ignore[method-assign]
        s.close()


@pytest.mark.timeout(30)
def test_a_loop_timer_on_uvloop_calls_once_and_knows_its_time() -> None:
    """On uvloop (a test dependency), whose ``call_at`` for a time already due gives a
    plain handle without ``when()``: the timer still calls once and tells its time."""
    uvloop = pytest.importorskip("uvloop")
    loop = uvloop.new_event_loop()
    calls: list[LoopTimer] = []
    try:
        past = LoopTimer(loop, loop.time() - 1.0, calls.append)
        soon = LoopTimer(loop, loop.time() + 0.01, calls.append)
        assert past.when() < soon.when()
        loop.run_until_complete(asyncio.sleep(0.05))
        assert calls == [past, soon]
    finally:
        loop.close()
