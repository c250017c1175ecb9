"""The server time a waiter joined the Redis line (hash ``Bj``), and the views built on it:
``lanequeue status`` (:class:`~lanequeue.redis._status.StatusReader`) and the lane-wide
``oldest_wait_s`` of the counting lanes (``lane_status()`` and the ``scope="lane"``
metrics entry, thread and asyncio). Real server (tests/redis_server.py)."""

from __future__ import annotations

import asyncio
import threading
import time
from typing import Any

import pytest
import redis.asyncio as aredis
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from lanequeue.metrics import PrometheusCollector
from lanequeue.redis import AsyncRedisLane, RedisLane, RedisSessionLane
from lanequeue.redis._keys import base
from lanequeue.redis._status import StatusReader

pytestmark = pytest.mark.timeout(30)

#: How long the waiters of these tests wait before anyone looks (seconds).
WAITED_S = 1.0


def _until(cond: Any, timeout: float = 8.0) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, "condition not reached in time"
        time.sleep(0.005)


def _lane(doc: dict[str, Any], name: str) -> dict[str, Any]:
    return next(lane for lane in doc["lanes"] if lane["name"] == name)


def test_status_shows_the_true_wait_of_a_waiter_that_joined_before_the_viewer(
    redis_client: Any, redis_prefix: str
) -> None:
    """A waiter (per-key lane and counting lane) joins the line, waits WAITED_S, and
    only then does a viewer start: its first look shows the wait counted from the join
    (server time), not 0; once the waiter is served, its join record is gone."""
    sessions = RedisSessionLane(redis_client, prefix=redis_prefix, lease_s=30)
    llm = RedisLane(redis_client, "llm", max_concurrent=1, prefix=redis_prefix, lease_s=30)
    assert sessions.try_acquire("k1") and llm.try_acquire("a")
    served: dict[str, int] = {}

    def waiter(lane: Any, key: str, name: str) -> None:
        with lane.acquire(key, timeout_s=20) as hold:
            served[name] = hold.token

    threads = [threading.Thread(target=waiter, args=(sessions, "k1", "s"), daemon=True),
               threading.Thread(target=waiter, args=(llm, "b", "c"), daemon=True)]
    for t in threads:
        t.start()
    _until(lambda: sessions.waiting_for("k1") == 1 and llm.lane_status()["waiting"] == 1)
    time.sleep(WAITED_S)
    doc = StatusReader(redis_client, redis_prefix).read()  # a viewer that starts now
    s, c = _lane(doc, "session"), _lane(doc, "llm")
    assert s["lines"] == {"k1": 1} and c["lines"] == {"b": 1}
    assert WAITED_S - 0.05 <= s["oldest_wait_s"] < 15
    assert WAITED_S - 0.05 <= c["oldest_wait_s"] < 15
    # The join records of the per-key lane's key and of the counting lane.
    s_joins = base(redis_prefix, "s", "session", "k1") + "j"
    c_joins = base(redis_prefix, "c", "llm", None) + "j"
    assert redis_client.hlen(s_joins) == 1 and redis_client.hlen(c_joins) == 1
    assert sessions.manual_release("k1") and llm.manual_release("a")
    for t in threads:
        t.join(10)
    assert served["s"] > 0 and served["c"] > 0
    # Served through the hand-off: its join record left with it.
    assert redis_client.hlen(s_joins) == 0 and redis_client.hlen(c_joins) == 0
    doc = StatusReader(redis_client, redis_prefix).read()
    assert _lane(doc, "session")["oldest_wait_s"] == 0.0
    assert _lane(doc, "llm")["oldest_wait_s"] == 0.0


def test_a_withdrawn_waiter_leaves_no_join_record(
    redis_client: Any, redis_prefix: str
) -> None:
    """A waiter that times out leaves the line and its join record in one script."""
    sessions = RedisSessionLane(redis_client, prefix=redis_prefix, lease_s=30)
    llm = RedisLane(redis_client, "llm", max_concurrent=1, prefix=redis_prefix, lease_s=30)
    assert sessions.try_acquire("k") and llm.try_acquire("a")
    assert sessions.acquire_timeout("k", 0.2) is False
    assert llm.acquire_timeout("b", 0.2) is False
    assert redis_client.hlen(base(redis_prefix, "s", "session", "k") + "j") == 0
    assert redis_client.hlen(base(redis_prefix, "c", "llm", None) + "j") == 0
    assert sessions.manual_release("k") and llm.manual_release("a")


def _lane_scope(registry: CollectorRegistry) -> dict[str, float]:
    """The ``scope="lane"`` gauges of lane "llm": name -> value."""
    out: dict[str, float] = {}
    for fam in text_string_to_metric_families(generate_latest(registry).decode()):
        for s in fam.samples:
            if s.labels.get("scope") == "lane" and s.labels.get("lane") == "llm":
                out[s.name] = s.value
    return out


def test_thread_counting_lane_reports_the_lane_wide_oldest_wait(
    redis_client: Any, redis_prefix: str
) -> None:
    """``lane_status()["oldest_wait_s"]`` and the ``scope="lane"`` gauge
    ``lanequeue_oldest_wait_seconds`` count from the server time the longest live waiter
    joined: a waiter of ANOTHER lane object (another process) shows its wait."""
    lane = RedisLane(redis_client, "llm", max_concurrent=1, prefix=redis_prefix, lease_s=30)
    other = RedisLane(redis_client, "llm", max_concurrent=1, prefix=redis_prefix, lease_s=30)
    registry = CollectorRegistry()
    PrometheusCollector(lane, registry=registry)
    assert lane.lane_status()["oldest_wait_s"] == 0.0
    assert lane.try_acquire("a")
    t = threading.Thread(target=lambda: other.acquire_timeout("b", 20), daemon=True)
    t.start()
    _until(lambda: lane.lane_status()["waiting"] == 1)
    time.sleep(WAITED_S)
    wide = lane.lane_status()
    assert WAITED_S - 0.05 <= wide["oldest_wait_s"] < 15
    got = _lane_scope(registry)
    assert got["lanequeue_waiters"] == 1 and got["lanequeue_holders"] == 1
    assert WAITED_S - 0.05 <= got["lanequeue_oldest_wait_seconds"] < 15
    # This object's own view has no waiter: the process scope says 0.
    assert lane.metrics_snapshot()[0].oldest_wait_s == 0.0
    assert lane.manual_release("a")
    t.join(10)
    assert other.manual_release("b")


def test_async_counting_lane_has_the_lane_wide_metrics_entry(
    redis_server: Any, redis_prefix: str
) -> None:
    """AsyncRedisLane's ``metrics_snapshot()``, called from a scrape thread while its
    event loop runs a holder and a waiter, has the ``scope="lane"`` entry of the thread
    lane: lane-wide holders, live waiters and the oldest wait from the join."""
    registry = CollectorRegistry()
    seen: dict[str, Any] = {}

    async def main() -> None:
        client = aredis.Redis(host=redis_server.host, port=redis_server.port)
        try:
            lane = AsyncRedisLane(client, "llm", max_concurrent=1, prefix=redis_prefix,
                                  lease_s=30)
            PrometheusCollector(lane, registry=registry)
            assert await lane.try_acquire("a")
            waiter = asyncio.get_running_loop().create_task(lane.acquire_timeout("b", 20))
            while (await lane.lane_status())["waiting"] != 1:
                await asyncio.sleep(0.005)
            await asyncio.sleep(WAITED_S)
            # The scrape runs in another thread while the loop keeps running.
            scrape = threading.Thread(target=lambda: seen.update(_lane_scope(registry)))
            scrape.start()
            while scrape.is_alive():
                await asyncio.sleep(0.01)
            seen["status"] = await lane.lane_status()
            assert await lane.manual_release("a")
            assert await asyncio.wait_for(waiter, 10)
            assert await lane.manual_release("b")
        finally:
            await client.aclose()

    asyncio.run(main())
    assert seen["lanequeue_holders"] == 1 and seen["lanequeue_waiters"] == 1
    assert WAITED_S - 0.05 <= seen["lanequeue_oldest_wait_seconds"] < 15
    assert WAITED_S - 0.05 <= seen["status"]["oldest_wait_s"] < 15
