"""AsyncLaneQueue.acquire_all under cancellation and timeouts: all or nothing.

Loop turns are counted as in test_async_cases.py: one ``await asyncio.sleep(0)`` in main
lets every callback already ready run once.
"""

from __future__ import annotations

import asyncio
import sys
from typing import Any

import pytest
from conftest import FakeClockLoop

from lanequeue import AsyncLaneQueue, LaneTimeoutError


def make_queue(global_cap: int = 1) -> AsyncLaneQueue:
    q = AsyncLaneQueue()
    q.add_session_lane("session", timeout_s=None)
    q.add_lane("global", max_concurrent=global_cap, timeout_s=None)
    return q


def quiet(lane: Any) -> None:
    st = lane.stats
    assert st.holders == 0 and st.waiters == 0, st
    assert st.acquired == st.released, st
    assert st.unmatched_releases == 0, st
    assert lane.get_active() == {}


@pytest.mark.timeout(10)
def test_cancelled_waiting_on_second_lane_releases_first() -> None:
    async def main() -> None:
        q = make_queue()
        session, glob = q["session"], q["global"]
        assert glob.try_acquire_nowait("blocker")  # the only global permit

        async def request() -> None:
            async with q.acquire_all("conv", ["session", "global"]):
                raise AssertionError("must not enter")

        task = asyncio.create_task(request())
        await asyncio.sleep(0)
        assert session.is_held_nowait("conv")  # first lane taken ...
        assert glob.waiting == 1  # ... waiting on the second

        task.cancel()
        # One turn: the task unwinds, withdraws from "global", releases "session".
        await asyncio.sleep(0)
        assert task.cancelled()
        assert not session.is_held_nowait("conv")
        assert glob.waiting == 0
        # Another task can take the first lane at once (timeout 0: no waiting at all).
        async with session.acquire("conv", timeout_s=0):
            pass
        quiet(session)
        assert glob.stats.cancelled == 1 and glob.stats.holders == 1
        assert glob.manual_release_nowait("blocker")
        quiet(glob)

    asyncio.run(main())


@pytest.mark.timeout(10)
def test_cancelled_after_both_granted_inside_body_releases_both() -> None:
    async def main() -> None:
        q = make_queue()
        entered = asyncio.Event()

        async def request() -> None:
            async with q.acquire_all("conv", ["session", "global"]):
                entered.set()
                await asyncio.Event().wait()

        task = asyncio.create_task(request())
        await entered.wait()
        assert q["session"].is_held_nowait("conv") and q["global"].active_count == 1
        task.cancel()
        await asyncio.sleep(0)
        assert task.cancelled()
        quiet(q["session"])
        quiet(q["global"])

    asyncio.run(main())


@pytest.mark.timeout(10)
def test_cancelled_after_second_lane_handed_over_before_resuming_releases_both() -> None:
    """The second lane is handed to the waiting task (hand-off) and the task is cancelled
    in the same synchronous step, before it resumed: it must pass the handed permit on
    and release the first lane too."""

    async def main() -> None:
        q = make_queue()
        session, glob = q["session"], q["global"]
        assert glob.try_acquire_nowait("blocker")
        order: list[str] = []

        async def request(key: str) -> None:
            async with q.acquire_all(key, ["session", "global"]):
                order.append(key)

        victim = asyncio.create_task(request("a"))
        await asyncio.sleep(0)
        other = asyncio.create_task(request("b"))
        await asyncio.sleep(0)
        assert glob.waiting == 2

        assert glob.manual_release_nowait("blocker")  # hands "global" to victim ...
        victim.cancel()  # ... cancelled before it resumed
        await asyncio.gather(victim, other, return_exceptions=True)
        assert victim.cancelled()
        assert order == ["b"]  # the permit was passed on to the next in line
        quiet(session)
        quiet(glob)

    asyncio.run(main())


@pytest.mark.timeout(10)
def test_wait_for_around_acquire_is_cancellation() -> None:
    async def main() -> None:
        q = make_queue()
        session = q["session"]
        assert session.try_acquire_nowait("k")
        with pytest.raises(asyncio.TimeoutError):
            await asyncio.wait_for(session.acquire_timeout("k", None), 0.05)
        assert session.waiting == 0 and session.waiting_for_nowait("k") == 0
        assert session.stats.cancelled == 1 and session.stats.holders == 1

        async def use() -> None:
            async with session.acquire("k"):
                raise AssertionError("must not enter")

        with pytest.raises(asyncio.TimeoutError):
            await asyncio.wait_for(use(), 0.05)
        assert session.waiting == 0 and session.stats.holders == 1
        assert session.manual_release_nowait("k")
        quiet(session)

    asyncio.run(main())


@pytest.mark.timeout(10)
def test_wait_for_around_acquire_all_is_cancellation() -> None:
    async def main() -> None:
        q = make_queue()
        session, glob = q["session"], q["global"]
        assert glob.try_acquire_nowait("blocker")

        async def use() -> None:
            async with q.acquire_all("conv", ["global", "session"]):
                raise AssertionError("must not enter")

        with pytest.raises(asyncio.TimeoutError):
            await asyncio.wait_for(use(), 0.05)
        quiet(session)  # "session" was taken first (registration order), then given back
        assert session.stats.acquired == 1
        assert glob.waiting == 0 and glob.stats.holders == 1
        assert glob.manual_release_nowait("blocker")
        quiet(glob)

    asyncio.run(main())


needs_timeout_cm = pytest.mark.skipif(
    sys.version_info < (3, 11), reason="asyncio.timeout() is new in Python 3.11"
)


@needs_timeout_cm
@pytest.mark.timeout(10)
def test_asyncio_timeout_around_acquire_is_cancellation() -> None:
    async def main() -> None:
        q = make_queue(global_cap=2)
        glob = q["global"]
        assert glob.try_acquire_nowait("x") and glob.try_acquire_nowait("y")
        with pytest.raises(TimeoutError):
            async with asyncio.timeout(0.05), glob.acquire("z"):  # type: ignore[attr-defined]
                raise AssertionError("must not enter")
        assert glob.waiting == 0 and glob.holds_of_nowait("z") == 0
        assert glob.stats.cancelled == 1
        assert glob.manual_release_nowait("x") and glob.manual_release_nowait("y")
        quiet(glob)

    asyncio.run(main())


@needs_timeout_cm
@pytest.mark.timeout(10)
def test_asyncio_timeout_around_acquire_all_is_cancellation() -> None:
    async def main() -> None:
        q = make_queue()
        session, glob = q["session"], q["global"]
        assert glob.try_acquire_nowait("blocker")
        with pytest.raises(TimeoutError) as info:
            async with asyncio.timeout(0.05), q.acquire_all(  # type: ignore[attr-defined]
                "conv", ["session", "global"]
            ):
                raise AssertionError("must not enter")
        # asyncio's own TimeoutError (cancellation), not the lane's timeout error.
        assert not isinstance(info.value, LaneTimeoutError)
        quiet(session)
        assert glob.waiting == 0 and glob.stats.holders == 1
        assert glob.manual_release_nowait("blocker")
        quiet(glob)
        # Both lanes work normally afterwards.
        async with q.acquire_all("conv", ["session", "global"], timeout_s=0):
            assert session.is_held_nowait("conv") and glob.active_count == 1
        quiet(session)
        quiet(glob)

    asyncio.run(main())


@pytest.mark.timeout(10)
def test_acquire_all_own_timeout_names_lane_and_key() -> None:
    async def main() -> None:
        q = make_queue()
        session, glob = q["session"], q["global"]
        assert glob.try_acquire_nowait("blocker")
        with pytest.raises(LaneTimeoutError) as info:
            async with q.acquire_all("conv", ["session", "global"], timeout_s=0.05):
                raise AssertionError("must not enter")
        assert info.value.lane == "global" and info.value.key == "conv"
        quiet(session)
        assert glob.waiting == 0 and glob.stats.timeouts == 1
        assert glob.manual_release_nowait("blocker")
        quiet(glob)

    asyncio.run(main())


@pytest.mark.timeout(10)
def test_acquire_all_one_deadline_across_waits() -> None:
    """One budget for the whole call, on the loop's clock, running from the first wait:
    the second lane's wait gets what the first left (the in-process path parks on each
    lane itself). Driven by a loop whose clock moves only when told to."""
    loop = FakeClockLoop()
    try:
        q = make_queue()
        session, glob = q["session"], q["global"]
        out: list[Any] = []

        async def block() -> None:
            assert session.try_acquire_nowait("conv")
            assert glob.try_acquire_nowait("other")

        async def caller() -> None:
            try:
                async with q.acquire_all("conv", ["session", "global"], timeout_s=1.0):
                    out.append("entered")
            except LaneTimeoutError as exc:
                out.append((exc.lane, exc.timeout_s))

        loop.run_until_complete(block())
        loop.create_task(caller())
        loop.settle()
        assert session.waiting == 1  # in line on the first lane
        loop.advance(0.6)
        loop.call_soon(session.manual_release_nowait, "conv")  # the session comes at 0.6 s
        loop.settle()
        assert glob.waiting == 1 and out == []  # now in line on the second lane
        loop.advance(0.39)
        assert out == []  # 0.99 s into the budget: still waiting
        loop.advance(0.01)  # 1.0 s after the first wait began: the one budget is spent
        assert out == [("global", 1.0)]
        quiet(session)  # the session lane was given back
        assert glob.waiting == 0 and glob.stats.timeouts == 1
        loop.call_soon(glob.manual_release_nowait, "other")
        loop.settle()
        quiet(glob)
    finally:
        loop.shutdown()


@pytest.mark.timeout(10)
@pytest.mark.parametrize("lanes", [["session"], ["session", "global"]])
def test_a_timed_out_wait_never_ends_another_callers_hold(lanes: list[str]) -> None:
    """As on threads: a timed-out wait's 0 is never released as a token (a release by
    key, which would end the other caller's hold)."""

    async def main() -> None:
        q = make_queue(global_cap=2)
        session, glob = q["session"], q["global"]
        async with session.acquire("k") as other:
            with pytest.raises(LaneTimeoutError):
                async with q.acquire_all("k", lanes, timeout_s=0.05):
                    pass
            assert await session.is_held("k") and other.held
        quiet(session)
        quiet(glob)

    asyncio.run(main())
