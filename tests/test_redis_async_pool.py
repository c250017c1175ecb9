"""The asyncio Redis lanes on a small redis-py pool, against a real redis-server: the
lanes' script calls (acquires, polls, reads, releases and withdrawals) take their
connections from the client's pool, and together never more than its
``max_connections``, so a small pool only means fewer calls at once: no
MaxConnectionsError, no release lost to pool exhaustion (README, "Pool size")."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
import redis.asyncio as aredis

from lanequeue import LaneTimeoutError
from lanequeue.aio import AsyncLaneQueue
from lanequeue.redis import AsyncRedisLane, AsyncRedisSessionLane
from lanequeue.redis._wake import FREEING_CALLS, MAX_CALLS, async_bounds

pytestmark = pytest.mark.timeout(60)


def test_bounds_fit_the_pool() -> None:
    """Calls and releases together fit any pool; with room for both, the full bounds."""
    assert async_bounds(None) == (MAX_CALLS, FREEING_CALLS)
    assert async_bounds(100) == (MAX_CALLS, FREEING_CALLS)
    assert async_bounds(MAX_CALLS + FREEING_CALLS) == (MAX_CALLS, FREEING_CALLS)
    assert async_bounds(1) == (1, 0)  # one bound for every call (releases share it)
    for n in range(2, MAX_CALLS + FREEING_CALLS):
        calls, freeing = async_bounds(n)
        assert calls + freeing == n and 1 <= freeing <= calls, (n, calls, freeing)


@pytest.mark.parametrize("pool_size", [1, 4, 10])
def test_many_turns_on_a_small_pool_never_fail(
    redis_server: Any, redis_prefix: str, pool_size: int
) -> None:
    """300 concurrent turns on 3 keys, each taking a session lane then a counting lane of
    3 through acquire_all (every 10th with a timeout too short to get in, so it withdraws;
    every 7th cancelled a moment in), on ``ConnectionPool(max_connections=pool_size)``.
    Expected: every other turn runs; the only errors are the short timeouts; nothing is
    held afterwards, and every grant was released and counted so."""

    async def main() -> None:
        pool = aredis.ConnectionPool(host=redis_server.host, port=redis_server.port,
                                     max_connections=pool_size)
        client = aredis.Redis(connection_pool=pool)
        try:
            await turns(client)
        finally:
            await client.aclose()
            await pool.disconnect()

    async def turns(client: aredis.Redis) -> None:
        s = AsyncRedisSessionLane(client, "s", prefix=redis_prefix, lease_s=5.0)
        g = AsyncRedisLane(client, "g", max_concurrent=3, prefix=redis_prefix, lease_s=5.0)
        queue = AsyncLaneQueue()
        queue.add(s)
        queue.add(g)
        ran = 0

        async def turn(i: int) -> None:
            nonlocal ran
            timeout = 0.0005 if i % 10 == 0 else 30.0
            async with queue.acquire_all(f"k{i % 3}", ["s", "g"], timeout_s=timeout):
                await asyncio.sleep(0.002)
                ran += 1

        tasks = [asyncio.ensure_future(turn(i)) for i in range(300)]
        loop = asyncio.get_running_loop()
        for i in range(0, 300, 7):
            loop.call_later(0.001 * i, tasks[i].cancel)
        results = await asyncio.gather(*tasks, return_exceptions=True)
        errors = [r for r in results
                  if isinstance(r, BaseException)
                  and not isinstance(r, (LaneTimeoutError, asyncio.CancelledError))]
        assert errors == []
        timed_out = sum(isinstance(r, LaneTimeoutError) for r in results)
        cancelled = sum(isinstance(r, asyncio.CancelledError) for r in results)
        finished = sum(r is None for r in results)
        assert finished + timed_out + cancelled == 300
        # A task cancelled as it leaves its block has run too (counted in ``ran`` and
        # ended cancelled): ``ran`` may exceed ``finished``, never the other way.
        assert finished <= ran and ran >= 200, (ran, finished, timed_out, cancelled)
        for key in ("k0", "k1", "k2"):
            assert not await s.is_held(key)
        status = await g.lane_status()
        assert (status["active"], status["waiting"]) == (0, 0)
        for lane in (s, g):
            st = lane.stats
            assert (st.holders, st.waiters) == (0, 0)
            assert st.acquired == st.released and st.unmatched_releases == 0, st
            assert lane.leases_lost == 0

    asyncio.run(main())
