"""``current_turn().fencing_tokens``: inside ``fn``, the fencing token of each lane the
turn holds, by lane name, so a turn can hand them to the store it writes to (the
README's remedy for a lost Redis lease). Both faces, in-process lanes and the real
Redis lanes (tests/redis_server.py): each token is the one the lane shows for the
turn's hold at that instant, the per-key lane's grows from turn to turn of a key, and
the mapping is empty once the turn's lanes are released."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from lanequeue import (
    AsyncLaneQueue,
    Dispatcher,
    LaneQueue,
    ThreadDispatcher,
    Turn,
    build_default_async_lanes,
    current_turn,
)
from lanequeue.redis import AsyncRedisLane, AsyncRedisSessionLane, RedisLane, RedisSessionLane

WAIT = 10.0


def _shown(queue: Any, key: str) -> dict[str, int]:
    """What the lanes a turn takes show for ``key``'s hold now (``stuck(0)``: every
    hold, with its fencing token), by lane name."""
    out = {}
    for name in ("session", "global"):
        [hold] = [h for h in queue[name].stuck(0) if h.key == key]
        out[name] = hold.token
    return out


def _check(seen: list[tuple[Turn, dict[str, int], dict[str, int]]]) -> None:
    (t1, first, shown1), (t2, second, shown2) = seen
    assert list(first) == ["session", "global"]  # in the order they were taken
    assert first == shown1 and second == shown2  # the lanes' own tokens for the turn
    assert all(v > 0 for v in first.values())
    assert second["session"] > first["session"]  # grows with every turn of the key
    assert t1.fencing_tokens == {} and t2.fencing_tokens == {}  # released by now


@pytest.mark.timeout(60)
@pytest.mark.parametrize("where", ["in-process", "redis"])
def test_a_thread_turn_reads_its_fencing_tokens(where: str, request: Any) -> None:
    q = LaneQueue()
    if where == "redis":
        client, prefix = (request.getfixturevalue(f) for f in ("redis_client", "redis_prefix"))
        q.add(RedisSessionLane(client, "session", prefix=prefix, lease_s=10.0))
        q.add(RedisLane(client, "global", max_concurrent=2, prefix=prefix, lease_s=10.0))
    else:
        q.add_session_lane("session")
        q.add_lane("global", max_concurrent=4)
    seen: list[Any] = []

    def fn() -> None:
        turn = current_turn()
        seen.append((turn, turn.fencing_tokens, _shown(q, turn.key)))

    d = ThreadDispatcher(q)
    try:
        for _ in range(2):
            d.submit("web:42", fn).result(WAIT)
        _check(seen)
    finally:
        d.close()


@pytest.mark.timeout(60)
@pytest.mark.parametrize("where", ["in-process", "redis"])
def test_an_asyncio_turn_reads_its_fencing_tokens(where: str, request: Any) -> None:
    async def main() -> list[Any]:
        import redis.asyncio as aredis

        client = None
        if where == "redis":
            server, prefix = (request.getfixturevalue(f) for f in ("redis_server",
                                                                   "redis_prefix"))
            client = aredis.Redis(host=server.host, port=server.port)
            q = AsyncLaneQueue()
            q.add(AsyncRedisSessionLane(client, "session", prefix=prefix, lease_s=10.0))
            q.add(AsyncRedisLane(client, "global", max_concurrent=2, prefix=prefix,
                                 lease_s=10.0))
        else:
            q = build_default_async_lanes()
        seen: list[Any] = []
        d = Dispatcher(q)

        async def fn() -> None:
            turn = current_turn()
            await asyncio.sleep(0)
            seen.append((turn, turn.fencing_tokens, _shown(q, turn.key)))

        try:
            for _ in range(2):
                await d.submit("web:42", fn)
            assert await d.drain(timeout_s=WAIT)
        finally:
            if client is not None:
                await client.aclose()
        return seen

    _check(asyncio.run(main()))
