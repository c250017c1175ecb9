"""The asyncio Redis lanes against a real redis-server: C16, surface, FIFO, cancellation,
leases, and AsyncLaneQueue mixing in-process and Redis lanes."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import pytest
import redis.asyncio as aredis

from lanequeue import LaneTimeoutError, LeaseLostError, NotOwnerError
from lanequeue.aio import AsyncLaneQueue, AsyncSessionLane
from lanequeue.redis import (
    AsyncRedisHold,
    AsyncRedisLane,
    AsyncRedisSessionLane,
    RedisSessionLane,
)

T = TypeVar("T")


def run(server: Any, body: Callable[[aredis.Redis], Awaitable[T]]) -> T:
    """Run ``body(client)`` on a fresh loop with a fresh asyncio client of ``server``."""

    async def main() -> T:
        client = aredis.Redis(host=server.host, port=server.port)
        try:
            return await body(client)
        finally:
            await client.aclose()

    return asyncio.run(main())


async def until(pred: Callable[[], Awaitable[bool]], timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while not await pred():
        assert time.monotonic() < deadline, "condition not reached in time"
        await asyncio.sleep(0.005)


def test_c16_tokens_are_per_acquisition_not_per_task_or_lane(
    redis_server: Any, redis_prefix: str
) -> None:
    """C16. Two tasks on one event loop share one async Redis lane object, lease 1 s: A
    acquires; B waits; A's lease expires (renewal paused) and B acquires; A releases
    late. Expected: each acquisition has its own token; A's late release fails as
    not-owned; B still holds."""

    async def body(client: aredis.Redis) -> None:
        lane = AsyncRedisSessionLane(client, prefix=redis_prefix, lease_s=1.0)
        a_holds, b_holds, b_may_leave = asyncio.Event(), asyncio.Event(), asyncio.Event()
        box: dict[str, Any] = {}

        async def task_a() -> None:
            hold = lane.acquire("k")
            await hold.__aenter__()
            hold._suspend_renewal()  # test hook: the lease runs out while A lives
            box["a"] = hold
            a_holds.set()
            await b_holds.wait()
            try:
                await hold.release()
                box["a_release"] = "released"
            except NotOwnerError as exc:
                box["a_release"] = exc

        async def task_b() -> None:
            await a_holds.wait()
            async with lane.acquire("k", timeout_s=10) as hold:
                box["b"] = hold
                b_holds.set()
                await b_may_leave.wait()
            box["b_release"] = "released"

        ta, tb = asyncio.create_task(task_a()), asyncio.create_task(task_b())
        await asyncio.wait_for(b_holds.wait(), 5)
        await ta
        a: AsyncRedisHold = box["a"]
        b: AsyncRedisHold = box["b"]
        assert a.owner != b.owner  # one token per acquisition
        assert b.fencing_token > a.fencing_token
        assert isinstance(box["a_release"], NotOwnerError)
        assert b.held and await lane.is_held("k")
        other = AsyncRedisSessionLane(client, prefix=redis_prefix)
        assert await other.try_acquire("k") is False  # B still holds
        b_may_leave.set()
        await tb
        assert box["b_release"] == "released"
        assert await other.try_acquire("k") is True
        assert await other.manual_release("k") is True

    run(redis_server, body)


def test_async_surface(redis_server: Any, redis_prefix: str,
                       caplog: pytest.LogCaptureFixture) -> None:
    async def body(client: aredis.Redis) -> None:
        s = AsyncRedisSessionLane(client, prefix=redis_prefix, timeout_s=0.05)
        c = AsyncRedisLane(client, "g", max_concurrent=2, prefix=redis_prefix)
        assert s.face == c.face == "asyncio"
        async with s.acquire("k") as hold:
            assert hold.fencing_token > 0 and s.active_count == 1
            assert await s.is_held("k")
            assert await s.try_acquire("k") is False
            with pytest.raises(LaneTimeoutError):
                async with s.acquire("k"):
                    pass
            assert await s.acquire_timeout("k", 0.05) is False
        with pytest.raises(NotOwnerError):
            await hold.release()
        st = s.stats
        assert (st.timeouts, st.rejected, st.acquired, st.released) == (2, 1, 1, 1)
        with caplog.at_level(logging.WARNING, logger="lanequeue.redis"):
            assert await s.manual_release("k") is False
        assert "not held by this client" in caplog.text
        assert await c.try_acquire("x") and await c.try_acquire("x")
        assert not await c.try_acquire("y")
        st = await c.lane_status()
        assert st["active"] == 2 and st["available"] == 0 and set(st["keys"]) == {"x"}
        assert await c.holds_of("x") == 2 and c.active_count == 2
        assert await c.manual_release("x") and await c.manual_release("x")
        assert not await c.manual_release("x")
        assert (await c.lane_status())["available"] == 2
        assert c.status()["max_concurrent"] == 2

    run(redis_server, body)


def test_async_fifo_and_hand_off(redis_server: Any, redis_prefix: str) -> None:
    async def body(client: aredis.Redis) -> None:
        lane = AsyncRedisSessionLane(client, prefix=redis_prefix)
        assert await lane.try_acquire("k")
        order: list[int] = []

        async def waiter(i: int) -> None:
            async with lane.acquire("k", timeout_s=10):
                order.append(i)

        tasks = []
        for i in range(4):
            tasks.append(asyncio.create_task(waiter(i)))
            await until(_waiting(lane, "k", i + 1))
        assert await lane.manual_release("k")
        await asyncio.wait_for(asyncio.gather(*tasks), 10)
        assert order == [0, 1, 2, 3]

    run(redis_server, body)


async def _eq(aw: Awaitable[int], n: int) -> bool:
    return await aw == n


def _waiting(lane: AsyncRedisSessionLane, key: str, n: int) -> Callable[[], Awaitable[bool]]:
    return lambda: _eq(lane.waiting_for(key), n)


def test_async_cancelled_waiter_holds_nothing(redis_server: Any, redis_prefix: str) -> None:
    """C10/C12 on Redis: T0 holds, W1 and W2 wait; T0 releases and W1 is cancelled in one
    step. W1 raises CancelledError and holds nothing; W2 acquires; the key is free after."""

    async def body(client: aredis.Redis) -> None:
        lane = AsyncRedisSessionLane(client, prefix=redis_prefix)
        assert await lane.try_acquire("k")
        got: list[str] = []

        async def waiter(name: str) -> None:
            async with lane.acquire("k", timeout_s=10):
                got.append(name)

        w1 = asyncio.create_task(waiter("w1"))
        await until(lambda: _eq(lane.waiting_for("k"), 1))
        w2 = asyncio.create_task(waiter("w2"))
        await until(lambda: _eq(lane.waiting_for("k"), 2))
        release = asyncio.create_task(lane.manual_release("k"))
        w1.cancel()
        assert await release
        with pytest.raises(asyncio.CancelledError):
            await w1
        await asyncio.wait_for(w2, 5)
        assert got == ["w2"]
        assert lane.active_count == 0 and lane.waiting == 0
        assert not await lane.is_held("k") and await lane.waiting_for("k") == 0
        assert lane.stats.cancelled == 1

    run(redis_server, body)


def test_async_task_cancelled_in_body_frees_the_key(
    redis_server: Any, redis_prefix: str
) -> None:
    """C14 on Redis: the holder is cancelled mid-work with 3 requests queued; they run in
    arrival order and no hold remains."""

    async def body(client: aredis.Redis) -> None:
        lane = AsyncRedisSessionLane(client, prefix=redis_prefix)
        started = asyncio.Event()
        order: list[int] = []

        async def holder() -> None:
            async with lane.acquire("s"):
                started.set()
                await asyncio.sleep(60)

        async def request(i: int) -> None:
            async with lane.acquire("s", timeout_s=10):
                order.append(i)

        h = asyncio.create_task(holder())
        await started.wait()
        reqs = []
        for i in range(3):
            reqs.append(asyncio.create_task(request(i)))
            await until(_waiting(lane, "s", i + 1))
        h.cancel()
        await asyncio.wait_for(asyncio.gather(*reqs), 5)
        assert order == [0, 1, 2]
        assert not await lane.is_held("s") and lane.active_count == 0

    run(redis_server, body)


def test_async_lease_renewed_and_lost(redis_server: Any, redis_prefix: str) -> None:
    async def body(client: aredis.Redis) -> None:
        lost: list[Any] = []
        lane = AsyncRedisLane(client, "g", max_concurrent=1, prefix=redis_prefix,
                              lease_s=0.5, on_lease_lost=lost.append)
        other = AsyncRedisLane(client, "g", max_concurrent=1, prefix=redis_prefix,
                               lease_s=0.5)
        async with lane.acquire("k") as hold:
            await asyncio.sleep(1.5)  # three leases: renewed by the renewer task
            assert hold.held and not await other.try_acquire("k")
        hold2 = await lane.acquire("k", timeout_s=1.0).__aenter__()
        hold2._suspend_renewal()
        await asyncio.sleep(1.2)  # lease 0.5 s; room for a renewal already in flight
        hold2._suspend_renewal(False)
        await until(lambda: _true(hold2.lost), timeout=2)
        assert lost == [hold2]
        with pytest.raises(LeaseLostError):
            await hold2.release()
        assert await other.try_acquire("k") and await other.manual_release("k")

    run(redis_server, body)


async def _true(v: bool) -> bool:
    return v


def test_async_queue_mixes_in_process_and_redis_lanes(
    redis_server: Any, redis_prefix: str
) -> None:
    async def body(client: aredis.Redis) -> None:
        queue = AsyncLaneQueue()
        queue.add(AsyncSessionLane("session"))
        glob = queue.add(AsyncRedisLane(client, "global", max_concurrent=2,
                                        prefix=redis_prefix))
        with pytest.raises(TypeError):
            queue.add(RedisSessionLane(redis_sync_client(redis_server), "x"))
        inside = 0
        peak = 0
        per_key: dict[str, int] = {}
        worst = 0

        async def worker(i: int) -> None:
            nonlocal inside, peak, worst
            for j in range(15):
                key = f"c{(i + j) % 3}"
                async with queue.acquire_all(key, ["session", "global"]) as holds:
                    assert holds["global"].fencing_token > 0
                    inside += 1
                    per_key[key] = per_key.get(key, 0) + 1
                    peak, worst = max(peak, inside), max(worst, per_key[key])
                    await asyncio.sleep(0.001)
                    inside -= 1
                    per_key[key] -= 1

        await asyncio.wait_for(asyncio.gather(*(worker(i) for i in range(6))), 60)
        assert peak <= 2 and worst == 1
        assert glob.stats.acquired == glob.stats.released == 90
        assert (await glob.lane_status())["active"] == 0
        # Roll-back: the Redis lane is full elsewhere; the session hold is released.
        elsewhere = AsyncRedisLane(client, "global", max_concurrent=2, prefix=redis_prefix)
        assert await elsewhere.try_acquire("a") and await elsewhere.try_acquire("b")
        with pytest.raises(LaneTimeoutError) as info:
            async with queue.acquire_all("k", ["session", "global"], timeout_s=0.1):
                pass
        assert info.value.lane == "global"
        assert queue["session"].active_count == 0

    run(redis_server, body)


def redis_sync_client(server: Any) -> Any:
    import redis

    return redis.Redis(host=server.host, port=server.port)


def test_a_client_used_on_a_closed_event_loop_is_refused_clearly(
    redis_server: Any, redis_prefix: str
) -> None:
    """A redis.asyncio client (and its lanes) used in one ``asyncio.run`` and again in
    a second one: its pooled connections belong to the first loop, now closed. The
    second use raises a RuntimeError that says so and what to do (redis-py alone failed
    with a bare "Event loop is closed"); a client made in the second run works."""
    made: dict[str, Any] = {}

    async def first() -> None:
        made["lane"] = AsyncRedisLane(aredis.Redis(port=redis_server.port), "loopy",
                                      prefix=redis_prefix)
        assert await made["lane"].try_acquire("a")
        assert await made["lane"].manual_release("a")

    async def again() -> bool:
        return bool(await made["lane"].try_acquire("b"))

    async def fresh() -> bool:
        lane = AsyncRedisLane(aredis.Redis(port=redis_server.port), "loopy",
                              prefix=redis_prefix)
        return bool(await lane.try_acquire("b")) and bool(await lane.manual_release("b"))

    asyncio.run(first())
    with pytest.raises(RuntimeError, match="used by a lane on another event loop that is "
                       "closed now; its connections belong to that loop: make the client"):
        asyncio.run(again())
    assert asyncio.run(fresh())


def test_a_client_used_on_a_second_open_loop_is_refused_and_its_own_loop_goes_on(
    redis_server: Any, redis_prefix: str
) -> None:
    """A lane (and its client) used on loop A, then from a second loop B (another
    thread's) while A is still open: B's call raises a clear RuntimeError before any I/O,
    and A's next release and acquire work (redis-py alone failed in B with "attached to a
    different loop", and A's next call then failed with "Event loop is closed")."""
    import threading

    async def main() -> list[str]:
        lane = AsyncRedisSessionLane(aredis.Redis(port=redis_server.port), "two-loops",
                                     prefix=redis_prefix)
        assert await lane.try_acquire("a")
        seen: list[str] = []

        def other_loop() -> None:
            try:
                asyncio.run(lane.try_acquire("b"))
                seen.append("no error")
            except RuntimeError as exc:
                seen.append(str(exc))

        t = threading.Thread(target=other_loop)
        t.start()
        await asyncio.to_thread(t.join, 10)
        assert await lane.manual_release("a")  # loop A unharmed
        assert await lane.try_acquire("b")
        assert await lane.manual_release("b")
        return seen

    seen = asyncio.run(main())
    assert len(seen) == 1 and "used by a lane on another event loop that is still open" in (
        seen[0]), seen


@pytest.mark.filterwarnings("ignore::ResourceWarning")
@pytest.mark.timeout(30)
def test_a_hold_dropped_after_its_loop_closed_uncancelled_is_counted_unmatched(
    redis_server: Any, redis_prefix: str
) -> None:
    """A loop closed with ``loop.close()`` after ``run_until_complete`` never runs its
    renewer task's ``finally``, which gives the renewer's place up. A hold dropped
    after that was queued for good for a renewer that never came: counted among the
    holders, ``wait_idle()`` never true. README ("Dropped holds"): with no renewer left,
    it is counted in ``unmatched_releases`` at once, and its lease lapses."""
    import gc

    loop = asyncio.new_event_loop()
    client = aredis.Redis(host=redis_server.host, port=redis_server.port)
    lane = AsyncRedisSessionLane(client, "closed", prefix=redis_prefix, lease_s=1.0)
    box: dict[str, Any] = {}

    async def hold() -> None:
        box["hold"] = lane.acquire("k")
        await box["hold"].__aenter__()

    try:
        loop.run_until_complete(hold())
    finally:
        loop.close()  # (its tasks not cancelled: the renewer's never ends)
    assert lane.stats.holders == 1
    box.clear()
    gc.collect()
    st = lane.stats
    assert (st.acquired, st.released, st.unmatched_releases, st.holders) == (1, 0, 1, 0), st
    assert lane._to_release == {}
