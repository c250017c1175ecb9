"""LaneQueue.acquire_all mixing in-process and Redis lanes."""

from __future__ import annotations

import asyncio
import threading
import time
from typing import Any

import pytest
import redis

from lanequeue import Lane, LaneQueue, LaneTimeoutError, SessionLane
from lanequeue.redis import RedisHold, RedisLane, RedisSessionLane


def test_mixed_session_lane_and_redis_lane(redis_client: redis.Redis, redis_prefix: str) -> None:
    queue = LaneQueue()
    session = queue.add(SessionLane("session"))
    glob = queue.add(RedisLane(redis_client, "global", max_concurrent=2, prefix=redis_prefix))
    inside: dict[str, int] = {}
    total = 0
    peak = 0
    worst = 0
    lock = threading.Lock()
    errors: list[BaseException] = []

    def worker(i: int) -> None:
        nonlocal total, peak, worst
        try:
            for j in range(30):
                key = f"conv{(i + j) % 3}"
                with queue.acquire_all(key, ["global", "session"], timeout_s=30) as holds:
                    assert isinstance(holds["global"], RedisHold)
                    assert holds["global"].fencing_token > 0
                    with lock:
                        inside[key] = inside.get(key, 0) + 1
                        total += 1
                        peak = max(peak, total)
                        worst = max(worst, inside[key])
                    time.sleep(0.001)
                    with lock:
                        inside[key] -= 1
                        total -= 1
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not errors
    assert worst == 1  # one holder per conversation (in-process SessionLane)
    assert peak <= 2  # global cap (Redis)
    assert glob.active_count == 0 and session.active_count == 0
    assert glob.stats.acquired == glob.stats.released == 180


def test_mixed_rollback_when_the_redis_lane_is_full(
    redis_client: redis.Redis, redis_prefix: str
) -> None:
    queue = LaneQueue()
    session = queue.add(SessionLane("session"))
    queue.add(RedisLane(redis_client, "global", max_concurrent=1, prefix=redis_prefix))
    elsewhere = RedisLane(redis_client, "global", max_concurrent=1, prefix=redis_prefix)
    assert elsewhere.try_acquire("other")  # another process fills the global lane
    with (
        pytest.raises(LaneTimeoutError) as info,
        queue.acquire_all("k", ["session", "global"], timeout_s=0.1),
    ):
        pass
    assert info.value.lane == "global" and info.value.key == "k"
    assert session.active_count == 0 and not session.is_held("k")
    assert elsewhere.manual_release("other")
    with queue.acquire_all("k", ["session", "global"]) as holds:
        assert session.is_held("k") and holds["global"].token > 0
    assert session.active_count == 0 and elsewhere.lane_status()["available"] == 1


def test_redis_session_lane_with_in_process_lane(
    redis_client: redis.Redis, redis_prefix: str
) -> None:
    queue = LaneQueue()
    sessions = queue.add(RedisSessionLane(redis_client, prefix=redis_prefix))
    queue.add(Lane("global", max_concurrent=4))
    with queue.acquire_all("c1", ["session", "global"]) as holds:
        assert sessions.is_held("c1")
        other = RedisSessionLane(redis_client, prefix=redis_prefix)
        assert not other.try_acquire("c1")
        assert holds["session"].fencing_token > 0
    assert not sessions.is_held("c1")
    assert queue.status()["session"]["kind"] == "RedisSessionLane"


@pytest.mark.timeout(30)
def test_lost_redis_lease_still_releases_the_in_process_lanes(
    redis_client: redis.Redis, redis_prefix: str
) -> None:
    # The Redis hold's lease runs out inside the block (renewal paused, as a long GC pause
    # would): leaving the block reports it (NotOwnerError), and the in-process lane taken
    # before it is released all the same, not left held for ever.
    from lanequeue import NotOwnerError

    queue = LaneQueue()
    local = queue.add(SessionLane("local"))
    queue.add(RedisSessionLane(redis_client, "shared", prefix=redis_prefix, lease_s=0.5))
    with pytest.raises(NotOwnerError), queue.acquire_all("k", ["local", "shared"]) as holds:
        holds["shared"]._suspend_renewal()
        deadline = time.monotonic() + 10
        while redis_client.keys(f"*{redis_prefix}*shared*:h") and time.monotonic() < deadline:
            time.sleep(0.05)
    assert not local.is_held("k")
    assert local.stats.holders == 0
    assert local.stats.unmatched_releases == 0
    assert local.try_acquire("k")


def test_backend_makes_lanes_by_name(redis_server: object, redis_prefix: str) -> None:
    """RedisBackend: one client and its settings; lanes by name, like add_lane; the face
    follows the client; queue.add_lane/add_session_lane(backend=...) use it."""
    import asyncio

    import redis.asyncio as aredis

    from lanequeue import AsyncLaneQueue
    from lanequeue.redis import AsyncRedisLane, AsyncRedisSessionLane, RedisBackend

    host, port = redis_server.host, redis_server.port  # type: ignore[attr-defined]
    client = redis.Redis(host=host, port=port)
    lost: list[object] = []
    backend = RedisBackend(client, prefix=redis_prefix, lease_s=2.0, on_lease_lost=lost.append)
    assert backend.face == "threads"
    queue = LaneQueue()
    s = queue.add_session_lane("session", max_sessions=9, timeout_s=1.5, backend=backend)
    g = queue.add_lane("global", max_concurrent=3, timeout_s=2.5, backend=backend)
    assert isinstance(s, RedisSessionLane) and isinstance(g, RedisLane)
    assert (s.prefix, s.lease_s, s.timeout_s, s.max_sessions) == (redis_prefix, 2.0, 1.5, 9)
    assert (g.prefix, g.lease_s, g.timeout_s, g.max_concurrent) == (redis_prefix, 2.0, 2.5, 3)
    assert s.on_lease_lost == g.on_lease_lost == lost.append
    with queue.acquire_all("k", ["session", "global"]) as holds:
        assert s.is_held("k") and g.lane_status()["active"] == 1
        assert isinstance(holds["session"], RedisHold)
    assert not s.is_held("k")
    with pytest.raises(ValueError, match="clock"):
        queue.add_lane("other", backend=backend, clock=time.monotonic)
    with pytest.raises(ValueError, match="already registered"):
        queue.add_lane("global", backend=backend)
    with pytest.raises(ValueError, match="prefix"):
        RedisBackend(client, prefix="a{b}")
    with pytest.raises(ValueError, match="lease_s"):
        RedisBackend(client, lease_s=0)
    with pytest.raises(TypeError, match="on_lease_lost"):
        RedisBackend(client, on_lease_lost=1)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match=r"redis\.Redis"):
        RedisBackend(object()).lane("x")
    client.close()

    async def main() -> None:
        aclient = aredis.Redis(host=host, port=port)
        abackend = RedisBackend(aclient, prefix=redis_prefix)
        assert abackend.face == "asyncio"
        with pytest.raises(TypeError, match="AsyncLaneQueue"):
            LaneQueue().add_lane("g", backend=abackend)
        aq = AsyncLaneQueue()
        sl = aq.add_session_lane("session", backend=abackend)
        gl = aq.add_lane("global", max_concurrent=2, backend=abackend)
        assert isinstance(sl, AsyncRedisSessionLane) and isinstance(gl, AsyncRedisLane)
        with pytest.raises(TypeError, match="use LaneQueue"):
            aq.add(RedisLane(redis.Redis(host=host, port=port), "t", prefix=redis_prefix))
        async with aq.acquire_all("k", ["global", "session"]):
            assert await sl.is_held("k") and await gl.holds_of("k") == 1
        assert not await sl.is_held("k") and gl.active_count == 0
        await aclient.aclose()

    asyncio.run(main())


BACKEND_ERRORS = [
    # (method, arguments, error, the argument the message names)
    ("lane", {"max_concurrent": 0}, ValueError, "max_concurrent"),
    ("lane", {"max_concurrent": "2"}, TypeError, "max_concurrent"),
    ("lane", {"timeout_s": -1}, ValueError, "timeout_s"),
    ("lane", {"name": "a:b"}, ValueError, "name"),  # a Redis lane's own rule
    ("session_lane", {"max_sessions": 0}, ValueError, "max_sessions"),
    ("session_lane", {"idle_timeout_s": -1}, ValueError, "idle_timeout_s"),
    ("session_lane", {"name": "{s}"}, ValueError, "name"),
]


@pytest.mark.parametrize("face", ["threads", "asyncio"])
@pytest.mark.parametrize(("method", "kw", "error", "arg"), BACKEND_ERRORS)
def test_backend_lane_argument_errors_name_the_call_the_user_made(
        redis_server: Any, redis_prefix: str, face: str, method: str, kw: dict[str, Any],
        error: type[Exception], arg: str) -> None:
    """Through ``add_lane(..., backend=...)`` an argument error names the queue's call,
    not the ``RedisLane()`` the backend builds; through the backend directly, the
    backend's call (``RedisBackend.lane()``)."""
    import redis.asyncio as aredis

    from lanequeue import AsyncLaneQueue
    from lanequeue.redis import RedisBackend

    host, port = redis_server.host, redis_server.port
    client: Any = (aredis.Redis(host=host, port=port) if face == "asyncio"
                   else redis.Redis(host=host, port=port))
    backend = RedisBackend(client, prefix=redis_prefix)
    queue: Any = AsyncLaneQueue() if face == "asyncio" else LaneQueue()
    kw = {"name": "z", **kw}
    add = "add_lane" if method == "lane" else "add_session_lane"
    try:
        with pytest.raises(error) as info:
            getattr(queue, add)(backend=backend, **kw)
        call = f"{type(queue).__name__}.{add}()"
        assert str(info.value).startswith(f"{call} argument '{arg}' "), info.value
        assert queue.list_lanes() == []
        with pytest.raises(error) as info:
            getattr(backend, method)(**kw)
        assert str(info.value).startswith(f"RedisBackend.{method}() argument '{arg}' "), \
            info.value
    finally:
        if face == "asyncio":
            asyncio.run(client.aclose())
        else:
            client.close()


def test_backend_refuses_a_client_that_is_not_redis_py_at_the_call() -> None:
    """A client that is not redis-py's is refused by ``RedisBackend()`` itself, naming
    ``client`` (it used to pass, and the first lane made named ``RedisLane()``)."""
    from lanequeue.redis import RedisBackend

    for bad in (None, object(), "redis://localhost"):
        with pytest.raises(TypeError, match=r"^RedisBackend\(\) argument 'client' must be "
                                            r"a redis-py client"):
            RedisBackend(bad)
