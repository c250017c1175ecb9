"""AsyncHold: releasing early inside ``async with``, releasing twice."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import pytest

from lanequeue import AsyncLane, AsyncLaneQueue, AsyncSessionLane, NotOwnerError


def make(kind: str) -> Any:
    if kind == "session":
        return AsyncSessionLane("sess", timeout_s=None)
    return AsyncLane("cnt", max_concurrent=1, timeout_s=None)


@pytest.mark.timeout(10)
@pytest.mark.parametrize("kind", ["session", "counting"])
def test_second_release_raises_not_owner_and_never_frees_another_hold(kind: str) -> None:
    async def main() -> None:
        lane = make(kind)
        hold = lane.acquire("k")
        await hold.__aenter__()
        assert await hold.release() is True
        assert lane.try_acquire_nowait("k")  # someone else holds "k" now
        with pytest.raises(NotOwnerError):
            await hold.release()  # the stale hold must not end theirs
        with pytest.raises(NotOwnerError):
            hold.release_nowait()
        assert lane.active_count == 1 and not lane.try_acquire_nowait("k")
        assert lane.manual_release_nowait("k")
        assert lane.stats.holders == 0

    asyncio.run(main())


@pytest.mark.timeout(10)
@pytest.mark.parametrize("kind", ["session", "counting"])
def test_early_release_inside_async_with_exits_cleanly(
    kind: str, caplog: pytest.LogCaptureFixture
) -> None:
    """Releasing the hold before the block ends (e.g. free the conversation before
    posting the reply) is a normal use: the next holder gets in at once, and leaving the
    block afterwards is not a stray release (no warning, not counted as unmatched)."""

    async def main() -> None:
        lane = make(kind)
        order: list[str] = []

        async def second() -> None:
            async with lane.acquire("k"):
                order.append("second")

        async with lane.acquire("k") as hold:
            task = asyncio.create_task(second())
            await asyncio.sleep(0)
            assert lane.waiting == 1
            assert await hold.release() is True
            await task  # the next holder got in while this block still runs
            order.append("first block ends")
        assert order == ["second", "first block ends"]
        st = lane.stats
        assert st.holders == 0 and st.acquired == st.released == 2
        assert st.unmatched_releases == 0, st

    with caplog.at_level(logging.WARNING, logger="lanequeue"):
        asyncio.run(main())
    assert not [r for r in caplog.records if r.name == "lanequeue"], caplog.text


def test_an_async_multi_hold_is_single_use_like_a_hold() -> None:
    """As on threads: entering an ``acquire_all`` again, inside its block or after it,
    raises RuntimeError and takes nothing."""

    async def main() -> None:
        queue = AsyncLaneQueue()
        s = queue.add_session_lane("session")
        queue.add_lane("global", max_concurrent=2)
        multi = queue.acquire_all("k", ["session", "global"])
        async with multi:
            with pytest.raises(RuntimeError, match="single use"):
                await multi.__aenter__()
        with pytest.raises(RuntimeError, match="single use"):
            async with multi:
                pass
        assert s.active_count == 0 and s.stats.acquired == 1
        await multi.release()  # still safe after the block

    asyncio.run(main())
