"""LaneQueue.acquire_all mixing in-process and Redis lanes."""

from __future__ import annotations

import threading
import time

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
