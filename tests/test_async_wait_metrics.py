"""The asyncio face's contended path: who observes a wait, and the look before a take.

A wait is observed once (``lanequeue_wait_seconds``, and ``waited`` for the grants that
parked): when the loop's clock is the lane's own clock (the stock loop and lanes: both
``time.monotonic``), by the hand-off that grants it, at the grant, under the lock the
hand-off holds anyway; else by the face, when the task resumes. A wait that ends any other
way (timeout, cancellation, clear, drain) is observed by the face.

The runs are scripted on ``FakeClockLoop`` (conftest) stepped by hand. For the first
case its ``time`` is replaced on the instance by a ``FakeClock`` that is also the lane's
clock, so the face sees one clock for both (as with the stock loop and lanes), and
every wait has a known length.

The look: while a take found the lane busy lately (the core's ``seen_busy`` hint), an
acquire looks at the key without the lock first and, when it looks busy, goes straight
to the line with one take (the one with the waiter). A stale look only picks the slower
of two correct paths.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from conftest import FakeClock, FakeClockLoop

from lanequeue import AsyncLane, AsyncSessionLane, LaneDrainingError, LaneTimeoutError, aio

KINDS = ["session", "counting", "counting+priority"]


def _lane(kind: str, clock: Callable[[], float]) -> Any:
    if kind == "session":
        return AsyncSessionLane("s", clock=clock, timeout_s=None, warn_after_s=None)
    return AsyncLane("g", max_concurrent=1, clock=clock, timeout_s=None, warn_after_s=None)


def _priority(kind: str) -> int:
    # A priority above 0 puts the waiter in the counting core's prioritised line, served
    # by its own hand-off (_release_ranked).
    return 3 if kind == "counting+priority" else 0


@pytest.fixture
def one_clock() -> Iterator[tuple[FakeClockLoop, FakeClock]]:
    """A stepped loop whose ``time`` is a FakeClock, to be given to the lane too."""
    loop = FakeClockLoop()
    clock = FakeClock()
    loop.time = clock  # type: ignore[method-assign]
    try:
        yield loop, clock
    finally:
        loop.shutdown()


def _hold_now(loop: FakeClockLoop, lane: Any, key: str = "k") -> None:
    async def take() -> None:
        assert await lane.try_acquire(key)

    loop.run_until_complete(take())


def _waiter(loop: FakeClockLoop, lane: Any, kind: str, timeout: float | None = None
            ) -> asyncio.Task[None]:
    """A task that waits for "k" and leaves at once; parked when this returns."""

    async def wait() -> None:
        async with lane.acquire("k", timeout_s=timeout, priority=_priority(kind)):
            pass

    task = loop.create_task(wait())
    loop.settle()
    assert lane._core.waiting == 1
    return task


@pytest.mark.timeout(10)
@pytest.mark.parametrize("kind", KINDS)
def test_hand_off_observes_the_wait_it_ends_once(
    kind: str, one_clock: tuple[FakeClockLoop, FakeClock]
) -> None:
    """A wait of 0.3 s, granted by a hand-off, then 5 s more before the task resumes:
    observed once, as 0.3 s (to the grant), by the hand-off."""
    loop, clock = one_clock
    lane = _lane(kind, clock)
    _hold_now(loop, lane)
    assert lane._core.waits_at_grant  # one clock for the loop and the lane
    task = _waiter(loop, lane, kind)
    clock.advance(0.3)

    def release() -> None:
        assert lane.manual_release_nowait("k")  # hands "k" to the waiting task
        clock.advance(5.0)  # before the task resumes

    loop.call_soon(release)
    loop.settle()
    assert task.done() and task.exception() is None
    [m] = lane.metrics_snapshot()
    st = lane.stats
    assert (st.acquired, st.released, st.holders, st.waiters) == (2, 2, 0, 0)
    # The immediate grant (0 s) and the wait (0.3 s): two observations, not three.
    assert lane._core.waited == 1
    assert m.wait.count == 2
    assert m.wait.sum == pytest.approx(0.3)
    assert m.wait.counts[m.wait.bounds.index(0.5)] == 1  # 0.25 < 0.3 <= 0.5


@pytest.mark.timeout(10)
@pytest.mark.parametrize("kind", KINDS)
def test_cancelled_after_its_grant_the_wait_is_observed_once(
    kind: str, one_clock: tuple[FakeClockLoop, FakeClock]
) -> None:
    """The key is handed to the waiting task, which is cancelled before it resumes: it
    passes the permit on, and its wait counts once, as a grant (by the hand-off)."""
    loop, clock = one_clock
    lane = _lane(kind, clock)
    _hold_now(loop, lane)
    task = _waiter(loop, lane, kind)
    clock.advance(0.3)

    def release_then_cancel() -> None:
        assert lane.manual_release_nowait("k")
        task.cancel()

    loop.call_soon(release_then_cancel)
    loop.settle()
    assert task.cancelled()
    st = lane.stats
    assert (st.acquired, st.released, st.holders, st.waiters) == (2, 2, 0, 0)
    [m] = lane.metrics_snapshot()
    assert lane._core.waited == 1
    assert m.wait.count == 2
    assert m.wait.sum == pytest.approx(0.3)


@pytest.mark.timeout(10)
@pytest.mark.parametrize("kind", KINDS)
def test_a_wait_that_times_out_is_observed_by_the_face(
    kind: str, one_clock: tuple[FakeClockLoop, FakeClock]
) -> None:
    loop, clock = one_clock
    lane = _lane(kind, clock)
    _hold_now(loop, lane)
    task = _waiter(loop, lane, kind, timeout=1.0)
    clock.advance(1.0)
    loop.settle()  # the lane's deadline timer comes due on the loop's clock
    assert isinstance(task.exception(), LaneTimeoutError)
    st = lane.stats
    assert (st.acquired, st.timeouts, st.holders, st.waiters) == (1, 1, 1, 0)
    [m] = lane.metrics_snapshot()
    assert lane._core.waited == 0
    assert m.wait.count == 2  # the holder's immediate grant and the timed-out wait
    assert m.wait.sum == pytest.approx(1.0)


@pytest.mark.timeout(10)
@pytest.mark.parametrize("kind", KINDS)
def test_with_a_clock_of_its_own_the_loop_observes_waits_in_the_face(kind: str) -> None:
    """The loop's clock (FakeClockLoop's) is not the lane's (a FakeClock): the hand-off
    cannot measure the wait, the face does, on the loop's clock, when the task resumes."""
    loop = FakeClockLoop()
    try:
        lane = _lane(kind, FakeClock())
        _hold_now(loop, lane)
        assert not lane._core.waits_at_grant
        task = _waiter(loop, lane, kind)
        loop.fake_now += 0.3

        def release() -> None:
            assert lane.manual_release_nowait("k")
            loop.fake_now += 0.1  # before the task resumes: part of the wait here

        loop.call_soon(release)
        loop.settle()
        assert task.done() and task.exception() is None
        [m] = lane.metrics_snapshot()
        assert lane._core.waited == 1
        assert m.wait.count == 2
        assert m.wait.sum == pytest.approx(0.4)
    finally:
        loop.shutdown()


@pytest.mark.timeout(10)
@pytest.mark.parametrize("kind", ["session", "counting"])
def test_the_look_goes_straight_to_the_line_only_while_the_lane_is_busy(
    kind: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A take that finds the lane busy sets the hint; the next acquire of a busy key
    then makes its waiter without a first take; a look that finds the key free clears
    the hint and takes at once, with no waiter."""
    takes: list[bool] = []  # per take: was a waiter given?
    loop = FakeClockLoop()
    try:
        lane = _lane(kind, FakeClock())
        core = lane._core
        take = type(core).take

        def counting_take(self: Any, key: str, wait: bool, waiter: Any = None,
                          *rest: Any, **kw: Any) -> int:
            takes.append(waiter is not None)
            got: int = take(self, key, wait, waiter, *rest, **kw)
            return got

        monkeypatch.setattr(type(core), "take", counting_take)
        _hold_now(loop, lane)
        assert not core.seen_busy and takes == [False]
        first = _waiter(loop, lane, kind)  # a take without a waiter fails, then one with
        assert core.seen_busy and takes == [False, False, True]
        second = loop.create_task(_enter_and_leave(lane))
        loop.settle()
        assert core.waiting == 2
        assert takes == [False, False, True, True]  # looked busy: one take, in line
        loop.call_soon(lane.manual_release_nowait, "k")
        loop.settle()  # first, then second, in their order
        assert first.done() and second.done() and core.stats().holders == 0
        assert core.seen_busy  # no look has found the key free yet
        _hold_now(loop, lane)  # try_acquire: a take (it never waits, so never looks)
        loop.call_soon(lane.manual_release_nowait, "k")
        loop.settle()
        del takes[:]
        loop.run_until_complete(_enter_and_leave(lane))
        assert takes == [False] and not core.seen_busy  # looked free: took at once
        [m] = lane.metrics_snapshot()
        assert core.waited == 2 and m.wait.count == core.stats().acquired
    finally:
        loop.shutdown()


async def _enter_and_leave(lane: Any) -> None:
    async with lane.acquire("k"):
        pass


@pytest.mark.timeout(10)
@pytest.mark.parametrize("kind", ["session", "counting"])
def test_a_stale_busy_look_still_takes_a_free_key_at_once(
    kind: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A look that says busy although the key is free (it was freed after the look)
    sends the acquire to the line's take, which grants the free key at once: the hold
    is taken, no wait is observed, nobody is left in line."""
    loop = FakeClockLoop()
    try:
        lane = _lane(kind, FakeClock())
        core = lane._core
        core.seen_busy = True
        monkeypatch.setattr(aio, "_looks_busy", lambda core, key: True)
        loop.run_until_complete(_enter_and_leave(lane))
        st = core.stats()
        assert (st.acquired, st.released, st.waiters) == (1, 1, 0)
        [m] = lane.metrics_snapshot()
        assert core.waited == 0 and m.wait.count == 1  # an immediate grant
    finally:
        loop.shutdown()


@pytest.mark.timeout(10)
@pytest.mark.parametrize("kind", ["session", "counting"])
def test_a_draining_lane_refuses_a_busy_key_without_counting_a_wait(kind: str) -> None:
    """With the hint set and the key busy, an acquire on a draining lane is refused as
    on an idle one: LaneDrainingError, nothing cancelled, no wait observed."""
    loop = FakeClockLoop()
    try:
        lane = _lane(kind, FakeClock())
        core = lane._core
        _hold_now(loop, lane)
        core.seen_busy = True
        loop.run_until_complete(lane.drain(0))  # holders stay; new acquires are refused
        with pytest.raises(LaneDrainingError):
            loop.run_until_complete(_enter_and_leave(lane))
        st = core.stats()
        assert (st.acquired, st.cancelled, st.timeouts, st.waiters) == (1, 0, 0, 0)
        [m] = lane.metrics_snapshot()
        assert m.wait.count == 1  # the holder's immediate grant only
    finally:
        loop.shutdown()
