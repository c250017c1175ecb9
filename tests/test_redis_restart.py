"""Redis stopped mid-run and restarted on the same port: the lanes raise clear errors
(LaneBackendError; a hold that died with the server is reported lost / not owned), never
grant anything while the server is down, and work again once it is back."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
from redis.backoff import NoBackoff
from redis.retry import Retry
from redis_server import RedisServer

from lanequeue import LaneBackendError, LaneError, NotOwnerError
from lanequeue.redis import RedisLane, RedisSessionLane


@pytest.fixture
def own_server(tmp_path: Path) -> Iterator[RedisServer]:
    """A server of this test only: stopping it must not disturb the session server."""
    server = RedisServer(tmp_path)
    server.start()
    yield server
    server.stop()


def test_redis_stopped_and_restarted(own_server: RedisServer, redis_prefix: str) -> None:
    client = redis.Redis(
        host=own_server.host, port=own_server.port, socket_timeout=2,
        socket_connect_timeout=0.5, retry=Retry(NoBackoff(), 1),
    )
    lost: list[Any] = []
    session = RedisSessionLane(client, prefix=redis_prefix, lease_s=1.0, timeout_s=5,
                               on_lease_lost=lost.append)
    counting = RedisLane(client, "g", max_concurrent=2, prefix=redis_prefix, lease_s=1.0,
                         timeout_s=5, on_lease_lost=lost.append)
    stop = threading.Event()
    grants: list[float] = []  # monotonic time each acquire_all-like pair was granted
    errors: list[tuple[float, BaseException]] = []
    lock = threading.Lock()

    def worker(i: int) -> None:
        while not stop.is_set():
            try:
                with session.acquire(f"k{i % 2}"), counting.acquire(f"k{i % 2}"):
                    with lock:
                        grants.append(time.monotonic())
                    time.sleep(0.005)
            except LaneError as exc:
                with lock:
                    errors.append((time.monotonic(), exc))
                time.sleep(0.02)
            except BaseException as exc:  # anything else is a bug: record it
                with lock:
                    errors.append((time.monotonic(), exc))
                return

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    time.sleep(0.5)
    own_server.stop()
    down = time.monotonic()  # the server process is dead from here ...
    time.sleep(1.5)
    up = time.monotonic()  # ... until here
    own_server.start()
    time.sleep(2.5)
    stop.set()
    for t in threads:
        t.join(15)
    assert not any(t.is_alive() for t in threads)

    # Only the library's errors, and clear ones.
    assert all(isinstance(e, LaneError) for _, e in errors), errors
    backend = [e for at, e in errors if isinstance(e, LaneBackendError)]
    assert backend, "no LaneBackendError while Redis was down"
    assert all(isinstance(e.__cause__, redis.exceptions.RedisError) for e in backend)
    assert all(
        isinstance(e, (LaneBackendError, NotOwnerError)) for _, e in errors
    ), errors
    # Never a silent grant while the server was down.
    assert not [g for g in grants if down < g < up]
    # Work resumed: each worker got through many times after the restart.
    after = [g for g in grants if g > up]
    assert len(after) >= 20, len(after)
    # Holds that died with the server were reported lost to their owners' callbacks (or
    # their releases failed with LaneBackendError / NotOwnerError above).
    # Fresh acquisitions work on both lanes.
    with session.acquire("fresh") as h1, counting.acquire("fresh") as h2:
        assert h1.fencing_token > 0 and h2.fencing_token > 0
    client.close()
