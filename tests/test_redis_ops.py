"""Operations of the Redis lanes for THIS process (lane objects stand in for processes):
``clear`` and ``drain`` reach only their own object's waiters and leave the line in Redis;
lost leases are counted for ``lanequeue_leases_lost_total``; the Prometheus collector
labels a Redis lane's series with ``scope``. Real server (tests/redis_server.py)."""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from lanequeue import LaneClearedError, LaneQueue
from lanequeue.metrics import PrometheusCollector
from lanequeue.redis import RedisBackend, RedisLane, RedisSessionLane

pytestmark = pytest.mark.timeout(30)


def _until(cond: Any, timeout: float = 8.0) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, "condition not reached in time"
        time.sleep(0.005)


def _samples(registry: CollectorRegistry) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    text = generate_latest(registry).decode()
    out = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def test_clear_ends_only_this_objects_waiters_and_leaves_the_line(
    redis_client: Any, redis_prefix: str
) -> None:
    """Two lane objects stand for two processes: ``clear`` on one ends its own waiter
    (LaneClearedError, out of the Redis line at once); the other's waiter keeps its
    place and is served next."""
    here = RedisSessionLane(redis_client, prefix=redis_prefix, timeout_s=None)
    there = RedisSessionLane(redis_client, prefix=redis_prefix, timeout_s=None)
    assert here.try_acquire("k")
    outcome: dict[str, Any] = {}

    def wait(lane: RedisSessionLane, name: str) -> None:
        try:
            with lane.acquire("k") as h:
                outcome[name] = h.token
        except LaneClearedError as exc:
            outcome[name] = exc

    t_here = threading.Thread(target=wait, args=(here, "here"))
    t_here.start()
    _until(lambda: here.waiting == 1)
    t_there = threading.Thread(target=wait, args=(there, "there"))
    t_there.start()
    _until(lambda: there.waiting == 1)
    assert here.waiting_for("k") == 2
    assert here.clear("k") == 1
    t_here.join(8)
    assert isinstance(outcome["here"], LaneClearedError)
    assert here.waiting_for("k") == 1  # left the line in Redis, not by liveness
    assert here.manual_release("k")
    t_there.join(8)
    assert outcome["there"] > 0
    assert here.is_held("k") is False and here.waiting_for("k") == 0


def test_leases_lost_are_counted_and_exported_with_scopes(
    redis_client: Any, redis_prefix: str
) -> None:
    """A hold whose key vanished from Redis is found lost by its renewal: the lane counts
    it (``leases_lost``), and the collector exports it as
    ``lanequeue_leases_lost_total{scope="process"}``; the thread counting lane adds the
    lane-wide holders under ``scope="lane"``."""
    lost: list[Any] = []
    lane = RedisLane(redis_client, "llm", max_concurrent=3, prefix=redis_prefix,
                     lease_s=0.3, on_lease_lost=lost.append)
    other = RedisLane(redis_client, "llm", max_concurrent=3, prefix=redis_prefix, lease_s=5)
    queue = LaneQueue()
    queue.add(lane)
    registry = CollectorRegistry()
    PrometheusCollector(queue, registry=registry)
    assert lane.try_acquire("a") and other.try_acquire("b")
    samples = _samples(registry)
    base = (("kind", "counting"), ("lane", "llm"))
    assert samples[("lanequeue_holders", (*base, ("scope", "lane")))] == 2
    assert samples[("lanequeue_holders", (*base, ("scope", "process")))] == 1
    # Take "a"'s hold out of Redis behind its back: its next renewal finds it gone.
    holds_key = next(k for k in redis_client.scan_iter(match="{lq2:*", count=1000)
                     if k.endswith(b"}:h") and redis_prefix.encode() in k)
    info = redis_client.hgetall(holds_key[:-1] + b"i")  # hold id -> "fence:since:key"
    assert sorted(v.rsplit(b":", 1)[1] for v in info.values()) == [b"a", b"b"]
    a_id = next(i for i, v in info.items() if v.endswith(b":a"))
    redis_client.zrem(holds_key, a_id)
    _until(lambda: lane.leases_lost == 1 and len(lost) == 1)  # counted, then called back
    assert len(lost) == 1 and lost[0].key == "a"
    assert lane.metrics_snapshot()[0].leases_lost == 1
    samples = _samples(registry)
    assert samples[("lanequeue_leases_lost_total", (*base, ("scope", "process")))] == 1
    assert samples[("lanequeue_holders", (*base, ("scope", "lane")))] == 1
    assert other.manual_release("b")


def test_queue_with_a_backend_gives_its_lanes_the_operations_arguments(
    redis_client: Any, redis_prefix: str
) -> None:
    """``warn_after_s``, ``on_wait`` and ``warn_hold_s`` of a queue reach the Redis lanes
    its ``add_lane``/``add_session_lane`` make through a backend."""
    seen: list[Any] = []
    queue = LaneQueue(warn_after_s=0.5, on_wait=lambda *a: seen.append(a), warn_hold_s=7.0)
    backend = RedisBackend(redis_client, prefix=redis_prefix)
    for lane in (queue.add_lane("g", max_concurrent=2, backend=backend),
                 queue.add_session_lane("s", backend=backend)):
        assert lane.warn_after_s == 0.5 and lane.warn_hold_s == 7.0
        assert lane.on_wait is not None


def test_slow_wait_names_this_process_waiters_ahead_and_its_holder(
    redis_client: Any, redis_prefix: str, caplog: pytest.LogCaptureFixture
) -> None:
    """The slow-wait report of a Redis waiter counts the waiters of this lane object that
    came before it for the key, and gives the age of this object's hold of the key."""
    calls: list[tuple[Any, ...]] = []
    lane = RedisSessionLane(redis_client, prefix=redis_prefix, timeout_s=8,
                            warn_after_s=0.1, on_wait=lambda *a: calls.append(a),
                            warn_hold_s=0.05)
    assert lane.try_acquire("k")
    first = threading.Thread(target=lambda: lane.acquire_timeout("k", 8) and None)
    first.start()
    _until(lambda: lane.waiting == 1)
    second = threading.Thread(target=lambda: lane.acquire_timeout("k", 8) and None)
    with caplog.at_level("WARNING", logger="lanequeue"):
        second.start()
        _until(lambda: len(calls) == 2)
        assert lane.status()["waiting"] == 2
    assert sorted(c[3] for c in calls) == [0, 1]
    assert all(c[0] is lane and c[1] == "k" and c[2] >= 0.1 for c in calls)
    slow = [r.getMessage() for r in caplog.records if "has waited" in r.getMessage()]
    assert len(slow) == 2 and all("current holder has held for " in m for m in slow)
    # The count is this process's waiters, and the line says so (another process's
    # waiters ahead are not counted).
    assert sorted(m.split("(")[1].split(" ahead")[0] for m in slow) == [
        "0 waiters of this process were", "1 waiter of this process was"]
    held = [r.getMessage() for r in caplog.records if "has held its permit" in r.getMessage()]
    assert len(held) == 1  # the long hold, logged once
    assert lane.manual_release("k")  # to the first waiter, then to the second
    _until(lambda: lane.active_count == 1 and lane.waiting == 1)
    assert lane.manual_release("k")
    _until(lambda: lane.active_count == 1 and lane.waiting == 0)
    assert lane.manual_release("k")
    first.join(8)
    second.join(8)
    assert lane.active_count == 0 and lane.waiting == 0


def test_slow_wait_behind_another_objects_holder_says_its_age_is_unknown(
    redis_client: Any, redis_prefix: str, caplog: pytest.LogCaptureFixture
) -> None:
    """The holder is another lane object's (another process's): the warning says its
    age is not known here, in words, instead of "held for - s"."""
    holder = RedisLane(redis_client, "llm", max_concurrent=1, prefix=redis_prefix)
    lane = RedisLane(redis_client, "llm", max_concurrent=1, prefix=redis_prefix,
                     warn_after_s=0.05)
    assert holder.try_acquire("a")
    with caplog.at_level("WARNING", logger="lanequeue"):
        assert lane.acquire_timeout("b", 0.3) is False
    assert holder.manual_release("a")
    slow = [r.getMessage() for r in caplog.records if "has waited" in r.getMessage()]
    assert len(slow) == 1
    assert slow[0].endswith("joined; the current holder is not this lane object's, so how "
                            "long it has held is not known here)"), slow[0]
