"""A waiter whose wait ends with a server error reply under OOM (``maxmemory`` with
``noeviction``) must not stay in the key's line: the server is reachable, and a ghost
left in line is handed the key by the next release and keeps it for a whole lease."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
from redis_server import RedisServer

from lanequeue import LaneBackendError
from lanequeue.redis import RedisLane, RedisSessionLane

LEASE_S = 5.0


@pytest.fixture
def server(tmp_path: Path) -> Iterator[RedisServer]:
    s = RedisServer(tmp_path)
    s.start()
    yield s
    s.stop()


def _make(kind: str, server: RedisServer) -> Any:
    client = redis.Redis(host=server.host, port=server.port)
    if kind == "session":
        return RedisSessionLane(client, lease_s=LEASE_S)
    return RedisLane(client, "g", max_concurrent=1, lease_s=LEASE_S)


@pytest.mark.timeout(30)
@pytest.mark.parametrize("kind", ["session", "counting"])
def test_waiter_failed_by_oom_leaves_the_line(server: RedisServer, kind: str) -> None:
    """Input: ``k`` held by lane object A; lane object B waits for ``k``; the server goes
    over ``maxmemory`` (noeviction); B's next poll fails (LaneBackendError, OOM); A
    releases; the OOM ends. Observed before the fix: B's line entry stayed, A's release
    handed ``k`` to it, and nobody could take ``k`` for a whole lease. Expected: ``k``
    free at once."""
    admin = redis.Redis(host=server.host, port=server.port)
    a, b = _make(kind, server), _make(kind, server)
    hold = a.acquire("k").__enter__()
    box: dict[str, Any] = {}

    def wait() -> None:
        try:
            box["granted"] = b.acquire_timeout("k", 10.0)
        except LaneBackendError as exc:
            box["error"] = exc

    waiter = threading.Thread(target=wait)
    waiter.start()
    deadline = time.monotonic() + 5.0
    while b.stats.waiters == 0 and time.monotonic() < deadline:
        time.sleep(0.01)
    try:
        for i in range(20):
            admin.set(f"fill:{i}", "x" * 100_000)
        admin.config_set("maxmemory-policy", "noeviction")
        admin.config_set("maxmemory", admin.info("memory")["used_memory"] - 500_000)
        waiter.join(8.0)  # its next poll (at most a poll period) meets the OOM
        assert "error" in box, box
        hold.release()
    finally:
        admin.config_set("maxmemory", 0)
    assert a.try_acquire("k"), "a waiter that failed still has the key"
    assert a.manual_release("k")
    admin.close()
