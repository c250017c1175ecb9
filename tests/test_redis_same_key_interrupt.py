"""A same-key request interrupted just after it joined this process's same-key line,
against a real redis-server: its event must still be set, so the next same-key request
is not held up for its whole timeout (or for ever, with no timeout)."""

from __future__ import annotations

import asyncio
import sys
import threading
import time
from typing import Any

import pytest
import redis
import redis.asyncio
from redis_server import RedisServer

from lanequeue.redis import AsyncRedisLane, AsyncRedisSessionLane, RedisLane, RedisSessionLane

pytestmark = pytest.mark.timeout(60)


def _lane(kind: Any, client: Any, prefix: str) -> Any:
    extra = {} if kind in (RedisSessionLane, AsyncRedisSessionLane) else {"max_concurrent": 2}
    return kind(client, "sk", prefix=prefix, lease_s=30.0, **extra)


class _InterruptedLock:
    """A lane's lock that raises KeyboardInterrupt once, just after it is released by
    ``_join_turn`` (armed), as a signal landing on the way out of its ``with`` block."""

    def __init__(self, real: Any) -> None:
        self.real = real
        self.armed = False
        self.fired = False

    def __enter__(self) -> bool:
        return bool(self.real.__enter__())

    def __exit__(self, *exc: Any) -> None:
        self.real.__exit__(*exc)
        if self.armed and sys._getframe(1).f_code.co_name == "_join_turn":
            self.armed = False
            self.fired = True
            raise KeyboardInterrupt

    def acquire(self, *a: Any, **kw: Any) -> bool:
        return bool(self.real.acquire(*a, **kw))

    def release(self) -> None:
        self.real.release()

    def _is_owned(self) -> bool:  # (the lane asks whether its thread is inside it)
        return bool(self.real._is_owned())


@pytest.mark.parametrize("kind", [RedisSessionLane, RedisLane])
def test_an_interrupt_just_after_joining_the_same_key_line_holds_up_no_successor(
    redis_server: RedisServer, redis_prefix: str, kind: Any,
) -> None:
    """A same-key request is interrupted just after ``_join_turn`` registered its event
    (the lock released, the event not yet stored where the request's clean-up finds it).
    Observed before: the event was never set, so the next same-key request of the lane
    object waited for it its whole timeout and ended timed out, the key free. Expected:
    the interrupted request's clean-up sets it; the next request is granted at once."""
    client = redis.Redis(host=redis_server.host, port=redis_server.port)
    lane = _lane(kind, client, redis_prefix)
    assert lane.acquire_timeout("warm", 1.0) and lane.manual_release("warm")  # first use
    lock = lane._lock = _InterruptedLock(lane._lock)
    lock.armed = True
    with pytest.raises(KeyboardInterrupt):
        lane.acquire_timeout("k", 5.0)
    assert lock.fired, "the interrupt was not injected"
    assert lane.waiting == 0 and lane.stats.holders == 0
    t0 = time.monotonic()
    got: dict[str, Any] = {}
    t = threading.Thread(target=lambda: got.update(ok=lane.acquire_timeout("k", 2.0)))
    t.start()
    t.join(10)
    took = time.monotonic() - t0
    assert got == {"ok": True} and took < 1.0, (got, took)
    assert lane.manual_release("k")
    assert lane._joins == {}
    client.close()


@pytest.mark.parametrize("kind", [AsyncRedisSessionLane, AsyncRedisLane])
def test_asyncio_an_interrupt_just_after_joining_the_same_key_line_holds_up_no_successor(
    redis_server: RedisServer, redis_prefix: str, kind: Any,
) -> None:
    """The asyncio face of the test above."""

    async def main() -> tuple[bool, float]:
        client = redis.asyncio.Redis(host=redis_server.host, port=redis_server.port)
        lane = _lane(kind, client, redis_prefix)
        assert await lane.acquire_timeout("warm", 1.0)
        assert await lane.manual_release("warm")
        lock = lane._lock = _InterruptedLock(lane._lock)
        lock.armed = True
        try:
            await lane.acquire_timeout("k", 5.0)
        except KeyboardInterrupt:
            pass
        assert lock.fired, "the interrupt was not injected"
        t0 = time.monotonic()
        ok = await lane.acquire_timeout("k", 2.0)
        took = time.monotonic() - t0
        if ok:
            assert await lane.manual_release("k")
        assert lane._joins == {}
        await client.aclose()
        return ok, took

    ok, took = asyncio.run(main())
    assert ok and took < 1.0, (ok, took)
