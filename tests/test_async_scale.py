"""Scale on the asyncio face: 100,000 waiters on one key; 100,000 keys through a small
per-key lane; memory back near the idle level afterwards.

Measured on a 2-core machine: each test takes about 2-7 s (tracemalloc slows the memory
tests about 2x). Memory is asserted in bytes per operation (a memory figure, not timing).
"""

from __future__ import annotations

import asyncio
import gc
import tracemalloc
from typing import Any

import pytest

from lanequeue import AsyncLane, AsyncSessionLane

N = 100_000


class FakeClock:
    def __init__(self, start: float = 1000.0) -> None:
        self.now = start

    def __call__(self) -> float:
        return self.now


@pytest.mark.timeout(60)
@pytest.mark.parametrize("kind", ["session", "counting"])
def test_100k_waiters_on_one_key_complete_in_fifo_order(kind: str) -> None:
    async def main() -> None:
        lane: Any = (
            AsyncSessionLane("s", timeout_s=None)
            if kind == "session"
            else AsyncLane("c", max_concurrent=1, timeout_s=None)
        )
        assert lane.try_acquire_nowait("k")
        order: list[int] = []

        async def waiter(i: int) -> None:
            async with lane.acquire("k"):
                order.append(i)

        tasks = [asyncio.create_task(waiter(i)) for i in range(N)]
        # One turn: every task ran its first step, in creation order, and joined the line.
        await asyncio.sleep(0)
        assert lane.waiting == N
        if kind == "session":
            assert lane.waiting_for_nowait("k") == N
        assert lane.manual_release_nowait("k")
        await asyncio.gather(*tasks)
        assert order == list(range(N))
        st = lane.stats
        assert lane.waiting == 0 and st.waiters == 0
        assert st.holders == 0 and lane.active_count == 0
        assert st.acquired == st.released == N + 1
        assert st.timeouts == st.cancelled == st.unmatched_releases == 0

    asyncio.run(main())


def _traced_now() -> int:
    gc.collect()
    return tracemalloc.get_traced_memory()[0]


@pytest.mark.timeout(60)
def test_100k_keys_churn_through_small_session_lane() -> None:
    """100,000 keys, each held by one task (waves of 100 concurrent holders), through an
    AsyncSessionLane with max_sessions=16. The soft cap keeps the registry bounded during
    the run; after the idle window (fake clock) cleanup leaves 0 entries, and memory is
    back near the level before the run."""
    max_sessions, wave = 16, 100
    clock = FakeClock()

    async def main() -> None:
        lane = AsyncSessionLane(
            "s", max_sessions=max_sessions, idle_timeout_s=60.0, timeout_s=None, clock=clock
        )
        # Warm up the lane and asyncio's own lazily built state before measuring.
        async with lane.acquire("warm-up"):
            await asyncio.sleep(0)
        clock.now += 60.0
        lane.cleanup_idle()

        async def one(key: str) -> None:
            async with lane.acquire(key):
                await asyncio.sleep(0)  # hold across a loop turn: holders overlap

        tracemalloc.start()
        try:
            before = _traced_now()
            most = 0
            for base in range(0, N, wave):
                await asyncio.gather(*(one(f"conv:{i}") for i in range(base, base + wave)))
                # Held entries are never evicted (soft cap), so a wave of 100 concurrent
                # holders may exceed 16; idle ones from earlier waves make room.
                most = max(most, lane.session_count)
            assert most <= wave + max_sessions
            assert lane.session_count <= wave  # only the last wave's idle entries
            clock.now += 60.0  # past the idle window
            lane.cleanup_idle()
            assert lane.session_count == 0
            after = _traced_now()
        finally:
            tracemalloc.stop()
        st = lane.stats
        assert st.acquired == st.released == N + 1 and st.holders == 0 and st.waiters == 0
        assert st.evicted == N + 1
        per_op = (after - before) / N
        # Nothing per key may stay behind: allow 2 bytes per operation (200 kB in all)
        # for allocator and interpreter noise.
        assert per_op <= 2.0, f"{after - before} bytes kept after {N} keys ({per_op:.1f}/op)"

    asyncio.run(main())


@pytest.mark.timeout(60)
def test_100k_keys_held_at_once_then_released() -> None:
    """100,000 keys each with one holder at the same time on an AsyncSessionLane with
    max_sessions=16 (the soft cap is exceeded: held entries are never evicted), then all
    released: the idle entries over the cap go at the next view. After the idle window
    the registry is empty, every eviction is counted, and the lane's memory is back near
    its idle level."""
    max_sessions = 16
    clock = FakeClock()
    keys = [f"conv:{i}" for i in range(N)]  # the caller's keys exist before and after

    async def main() -> None:
        lane = AsyncSessionLane(
            "s", max_sessions=max_sessions, idle_timeout_s=60.0, timeout_s=None, clock=clock
        )
        assert lane.try_acquire_nowait("warm-up") and lane.manual_release_nowait("warm-up")
        clock.now += 60.0
        lane.cleanup_idle()

        tracemalloc.start()
        try:
            before = _traced_now()
            for key in keys:
                assert lane.try_acquire_nowait(key)
            assert lane.session_count == N and lane.active_count == N
            for key in keys:
                assert lane.manual_release_nowait(key)
            # Idle but not yet expired: kept up to the cap until the idle window passes
            # (the view drops the idle entries over the cap, oldest first).
            assert lane.session_count == max_sessions and lane.active_count == 0
            clock.now += 60.0
            assert lane.cleanup_idle() == max_sessions
            assert lane.session_count == 0
            after = _traced_now()
        finally:
            tracemalloc.stop()
        st = lane.stats
        assert st.evicted == N + 1 and st.holders == 0
        assert st.acquired == st.released == N + 1
        per_op = (after - before) / N
        # Near the idle level: at most 2 bytes per key that passed through (200 kB).
        assert per_op <= 2.0, (
            f"an empty lane keeps {after - before} bytes after a burst of {N} keys "
            f"({per_op:.1f} bytes per key): the registry's tables keep their high-water size"
        )

    asyncio.run(main())
