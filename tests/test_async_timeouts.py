"""Timeouts on the asyncio face: acquire_timeout, acquire(timeout_s=...), 0 and None.

Deterministic timing uses an event loop whose clock moves only when told to
(:class:`FakeClockLoop`), driven one iteration at a time: the lane's deadlines are timers
on the loop's own clock (one loop timer per lane for the earliest of them), so advancing
that clock is advancing time.
"""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from typing import Any

import pytest
from conftest import FakeClockLoop

from lanequeue import AsyncLane, AsyncSessionLane, LaneTimeoutError


def make_lane(kind: str, **kw: Any) -> Any:
    if kind == "session":
        return AsyncSessionLane("sess", **kw)
    return AsyncLane("cnt", max_concurrent=1, **kw)


LANE_KINDS = ["session", "counting"]


def waiting_on(lane: Any, key: str) -> int:
    return lane.waiting_for_nowait(key) if isinstance(lane, AsyncSessionLane) else lane.waiting


@pytest.mark.timeout(10)
@pytest.mark.parametrize("kind", LANE_KINDS)
def test_acquire_timeout_on_busy_key_returns_false(kind: str) -> None:
    async def main() -> None:
        lane = make_lane(kind, timeout_s=None)
        assert lane.try_acquire_nowait("k")
        before = lane.stats
        assert await lane.acquire_timeout("k", 0.05) is False
        after = lane.stats
        assert after.timeouts == before.timeouts + 1
        assert after.rejected == before.rejected  # a wait that ran out, not a refusal
        assert after.cancelled == 0
        assert lane.waiting == 0 and waiting_on(lane, "k") == 0
        assert after.holders == 1
        assert lane.manual_release_nowait("k")
        assert lane.stats.holders == 0

    asyncio.run(main())


@pytest.mark.timeout(10)
@pytest.mark.parametrize("kind", LANE_KINDS)
def test_acquire_with_timeout_raises_lane_timeout_error(kind: str) -> None:
    async def main() -> None:
        lane = make_lane(kind, timeout_s=None)
        assert lane.try_acquire_nowait("conv:1")
        with pytest.raises(LaneTimeoutError) as info:
            async with lane.acquire("conv:1", timeout_s=0.05):
                raise AssertionError("must not enter")
        err = info.value
        assert isinstance(err, TimeoutError)
        assert err.lane == lane.name and err.key == "conv:1" and err.timeout_s == 0.05
        assert repr(lane.name) in str(err) and "'conv:1'" in str(err)
        assert lane.waiting == 0 and lane.stats.timeouts == 1 and lane.stats.holders == 1
        # The lane's own default timeout applies when none is given.
        lane2 = make_lane(kind, timeout_s=0.02)
        assert lane2.try_acquire_nowait("k")
        with pytest.raises(LaneTimeoutError) as info2:
            async with lane2.acquire("k"):
                pass
        assert info2.value.timeout_s == 0.02
        assert lane2.waiting == 0

    asyncio.run(main())


def _completes_without_suspending(coro: Coroutine[Any, Any, Any]) -> Any:
    """Drive ``coro`` one step by hand; it must finish in that step (never await a
    future). Returns its result."""
    try:
        coro.send(None)
    except StopIteration as stop:
        return stop.value
    coro.close()
    raise AssertionError("the call suspended: it waited")


@pytest.mark.timeout(10)
@pytest.mark.parametrize("kind", LANE_KINDS)
def test_timeout_zero_never_waits(kind: str) -> None:
    async def main() -> None:
        lane = make_lane(kind, timeout_s=None)
        # Free: granted in the first step.
        assert _completes_without_suspending(lane.acquire_timeout("k", 0)) is True
        # Busy: refused in the first step, no waiter, counted as a refusal.
        assert _completes_without_suspending(lane.acquire_timeout("k", 0)) is False
        assert _completes_without_suspending(lane.acquire_timeout("k", 0.0)) is False
        hold = lane.acquire("k", timeout_s=0)
        with pytest.raises(LaneTimeoutError) as info:
            _completes_without_suspending(hold.__aenter__())
        assert info.value.timeout_s == 0
        st = lane.stats
        assert st.rejected == 3 and st.timeouts == 0 and st.waiters == 0  # refusals only
        assert lane.waiting == 0
        assert lane.manual_release_nowait("k")

    asyncio.run(main())


@pytest.mark.timeout(10)
@pytest.mark.parametrize("kind", LANE_KINDS)
def test_timeout_none_waits_without_limit(kind: str) -> None:
    loop = FakeClockLoop()
    try:
        lane = make_lane(kind, timeout_s=None)  # lane default: no limit
        results: list[Any] = []

        async def holder() -> None:
            assert lane.try_acquire_nowait("k")

        async def explicit_none() -> None:
            results.append(await lane.acquire_timeout("k", None))

        async def lane_default() -> None:
            async with lane.acquire("k"):
                results.append("entered")

        loop.run_until_complete(holder())
        t1 = loop.create_task(explicit_none())
        t2 = loop.create_task(lane_default())
        loop.settle()
        assert lane.waiting == 2
        loop.advance(10**9)  # a billion seconds later, both still wait
        assert lane.waiting == 2 and results == [] and not t1.done() and not t2.done()
        loop.call_soon(lane.manual_release_nowait, "k")
        loop.settle()
        assert results == [True] and t1.done()  # FIFO: the first waiter got it
        loop.call_soon(lane.manual_release_nowait, "k")
        loop.settle()
        assert results == [True, "entered"] and t2.done()
        assert lane.stats.timeouts == 0 and lane.stats.holders == 0 and lane.waiting == 0
    finally:
        loop.shutdown()


@pytest.mark.timeout(10)
@pytest.mark.parametrize("kind", LANE_KINDS)
def test_deadline_and_release_in_the_same_iteration(kind: str) -> None:
    """The deadline timer and a release fall in one loop iteration. Ready callbacks run
    before the timers that come due in that iteration, so the release hands the permit
    over first and the timer then finds the waiter granted: it keeps the permit."""
    loop = FakeClockLoop()
    try:
        lane = make_lane(kind, timeout_s=None)
        out: list[bool] = []

        async def hold() -> None:
            assert lane.try_acquire_nowait("k")

        async def waiter() -> None:
            out.append(await lane.acquire_timeout("k", 1.0))

        loop.run_until_complete(hold())
        loop.create_task(waiter())
        loop.settle()
        loop.call_soon(lane.manual_release_nowait, "k")
        loop.fake_now += 1.0  # the waiter's deadline is due in the same iteration
        loop.settle()
        assert out == [True]
        st = lane.stats
        assert st.timeouts == 0 and st.holders == 1 and st.waiters == 0
        loop.call_soon(lane.manual_release_nowait, "k")
        loop.settle()
        assert lane.stats.holders == 0

        # The other order: the deadline passes (timer fires) first, release comes after.
        out.clear()
        loop.run_until_complete(hold())
        loop.create_task(waiter())
        loop.settle()
        loop.advance(1.0)
        assert out == [False] and lane.waiting == 0
        loop.call_soon(lane.manual_release_nowait, "k")
        loop.settle()
        st = lane.stats
        assert st.timeouts == 1 and st.holders == 0 and st.waiters == 0
        assert st.acquired == st.released
    finally:
        loop.shutdown()


@pytest.mark.timeout(10)
@pytest.mark.parametrize("kind", LANE_KINDS)
def test_timed_out_then_cancelled_before_resuming_counts_once(kind: str) -> None:
    """A waiter's deadline passes (its timer withdraws it), and the task is cancelled
    before it resumed. It raises CancelledError, holds nothing, and the one failed wait
    is counted once: LaneStats documents ``cancelled`` as "not counted in timeouts"."""
    loop = FakeClockLoop()
    try:
        lane = make_lane(kind, timeout_s=None)

        async def hold() -> None:
            assert lane.try_acquire_nowait("k")

        async def waiter() -> bool:
            got: bool = await lane.acquire_timeout("k", 1.0)
            return got

        loop.run_until_complete(hold())
        task = loop.create_task(waiter())
        loop.settle()
        loop.fake_now += 1.0
        loop.run_once()  # the deadline timer fires: waiter withdrawn, its future resolved
        assert lane.waiting == 0
        task.cancel()  # before the task resumed
        loop.settle()
        assert task.cancelled()
        st = lane.stats
        assert st.holders == 1 and st.waiters == 0
        assert st.timeouts + st.cancelled == 1, st
    finally:
        loop.shutdown()


@pytest.mark.timeout(10)
@pytest.mark.parametrize("kind", LANE_KINDS)
def test_deadlines_of_mixed_timeouts_each_come_on_time(kind: str) -> None:
    """The lane's one timer is re-armed for an earlier deadline: a wait of 5 s that
    joins after a wait of 10 s ends at 5 s, the other at 10 s, and a wait of 20 s that
    was granted meanwhile never times out."""
    loop = FakeClockLoop()
    try:
        lane = make_lane(kind, timeout_s=None, warn_after_s=None)
        ended: dict[str, float] = {}

        async def hold() -> None:
            assert lane.try_acquire_nowait("k")

        async def wait(name: str, timeout: float) -> None:
            got = await lane.acquire_timeout("k", timeout)
            ended[name] = loop.time() - 1000.0 if not got else -1.0

        loop.run_until_complete(hold())
        for name, timeout in (("long", 10.0), ("short", 5.0)):
            loop.create_task(wait(name, timeout))
            loop.settle()
        assert lane.waiting == 2
        loop.advance(4.9)
        assert ended == {}
        loop.advance(0.1)
        assert ended == {"short": 5.0}
        loop.advance(4.9)
        assert ended == {"short": 5.0}
        loop.advance(0.1)
        assert ended == {"short": 5.0, "long": 10.0}
        assert lane.stats.timeouts == 2 and lane.waiting == 0
        async def release() -> None:
            assert lane.manual_release_nowait("k")

        loop.create_task(wait("granted", 20.0))
        loop.settle()
        loop.run_until_complete(release())
        loop.settle()
        assert ended["granted"] == -1.0  # granted, not timed out
        loop.run_until_complete(release())
        loop.advance(30.0)
        assert lane.stats.timeouts == 2
    finally:
        loop.shutdown()


@pytest.mark.timeout(10)
@pytest.mark.parametrize("kind", LANE_KINDS)
def test_a_deadline_due_but_not_yet_served_is_not_pushed_back_by_a_later_wait(
    kind: str,
) -> None:
    """The lane's timer is due (the loop was busy past a wait's deadline) but has not
    run yet when a wait with a later deadline joins: the timer it arms must still come
    at the due deadline. It once came at the NEW wait's deadline (the due timer was
    cancelled), so a loaded loop let 10 ms waits run on for the length of 1 s ones and
    end granted, with no timeout counted for a whole run."""
    loop = FakeClockLoop()
    try:
        lane = make_lane(kind, timeout_s=None, warn_after_s=None)
        ended: dict[str, float] = {}

        async def hold(key: str) -> None:
            if kind == "session" or key == "a":
                assert lane.try_acquire_nowait(key)

        async def wait(name: str, key: str, timeout: float) -> None:
            got = await lane.acquire_timeout(key, timeout)
            ended[name] = loop.time() - 1000.0 if not got else -1.0

        for key in ("a", "b"):
            loop.run_until_complete(hold(key))
        loop.create_task(wait("short", "a", 5.0))
        loop.settle()
        loop.fake_now += 6.0  # past its deadline, its timer due but not run yet:
        loop.create_task(wait("long", "b", 100.0))  # this joins first, in one iteration
        loop.settle()
        loop.advance(0.0)  # the next iterations: the timers due now run
        assert ended == {"short": 6.0}, "the due deadline was pushed back"
        loop.advance(100.0)
        assert ended == {"short": 6.0, "long": 106.0}
        assert lane.stats.timeouts == 2 and lane.waiting == 0
    finally:
        loop.shutdown()


@pytest.mark.timeout(10)
def test_deadlines_of_granted_waits_do_not_pile_up() -> None:
    """Waits granted long before their deadline leave dead entries in the lane's
    deadline heap; they are swept once they outnumber the waiters, so the heap stays
    within twice the waiters (plus a small floor) however many waits come and go."""

    async def main() -> None:
        lane = AsyncSessionLane(timeout_s=300.0)
        sizes: list[int] = []

        async def turn() -> None:
            async with lane.acquire("k"):
                await asyncio.sleep(0)

        for _ in range(20):
            await asyncio.gather(*(turn() for _ in range(50)))
            dl = lane._deadlines
            assert dl is not None
            sizes.append(len(dl.heap))
        assert max(sizes) <= 2 * 50 + 65, sizes
        assert lane.stats.timeouts == 0 and lane.stats.acquired == 1000

    asyncio.run(main())
