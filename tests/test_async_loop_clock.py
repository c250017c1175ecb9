"""Timeouts of the asyncio lanes run on the loop's own clock, also when that clock is
replaced on the loop object itself (as virtual-clock test tools do), not only by a loop
class of its own (see ``FakeClockLoop`` in conftest)."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest

from lanequeue import AsyncLane, AsyncLaneQueue, AsyncSessionLane, LaneTimeoutError

#: The replaced clock runs this far behind time.monotonic (seconds).
BEHIND_S = 1000.0


def _loop_with_own_clock() -> asyncio.AbstractEventLoop:
    loop = asyncio.new_event_loop()
    loop.time = lambda: time.monotonic() - BEHIND_S  # type: ignore[method-assign]
    return loop


def _timeout_after(wait: Any) -> float:
    """Run ``wait()`` (a coroutine that must raise LaneTimeoutError within 0.2 s of its
    loop's clock) on a loop whose clock is replaced on the instance; the seconds it took."""
    loop = _loop_with_own_clock()

    async def main() -> float:
        start = loop.time()
        with pytest.raises(LaneTimeoutError):
            await wait()
        return loop.time() - start

    try:
        return loop.run_until_complete(asyncio.wait_for(main(), 2.0))
    finally:
        loop.close()


@pytest.mark.timeout(10)
@pytest.mark.parametrize("kind", ["session", "counting"])
def test_wait_times_out_on_an_instance_clock(kind: str) -> None:
    """Input: ``loop.time`` replaced on the loop instance (1000 s behind monotonic), a
    held key, ``acquire(key, timeout_s=0.2)``. Observed before the fix: the deadline was
    computed on time.monotonic and armed on the loop's clock, so the wait never ended
    (the other way round it ended at once). Expected: LaneTimeoutError after 0.2 s."""
    lane = AsyncSessionLane("s") if kind == "session" else AsyncLane("g", max_concurrent=1)

    async def wait() -> None:
        async with lane.acquire("k"), lane.acquire("k", timeout_s=0.2):
            pass

    assert 0.2 <= _timeout_after(wait) < 1.0


@pytest.mark.timeout(10)
def test_acquire_all_times_out_on_an_instance_clock() -> None:
    queue = AsyncLaneQueue()
    session = queue.add_session_lane("session")
    queue.add_lane("global", max_concurrent=1)

    async def wait() -> None:
        async with session.acquire("k"), queue.acquire_all(
            "k", ["session", "global"], timeout_s=0.2
        ):
            pass

    assert 0.2 <= _timeout_after(wait) < 1.0
