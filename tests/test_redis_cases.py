"""Cases C15 and C17 of shared/cases/HANDED.md on the Redis thread lanes, with the expected
values given there (C16, the asyncio case, is in test_redis_async.py)."""

from __future__ import annotations

import logging
import threading
import time
from typing import Any

import pytest
import redis

from lanequeue import NotOwnerError
from lanequeue.redis import RedisHold, RedisLane, RedisSessionLane


def wait_until(pred: Any, timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while not pred():
        assert time.monotonic() < deadline, "condition not reached in time"
        time.sleep(0.005)


def test_c15_expired_holder_cannot_delete_the_next_holders_lock(
    redis_server: Any, redis_client: redis.Redis, redis_prefix: str
) -> None:
    """C15. One RSL object shared by two threads, lease 1 s: T1 acquires; T2 waits; the
    lease expires (T1's renewal is paused, as by a GC pause) and T2 acquires; T1 then
    releases. Expected: T1's release fails with a distinct not-owned error; "k" still
    belongs to T2; a third client cannot acquire."""
    lane = RedisSessionLane(redis_client, prefix=redis_prefix, lease_s=1.0)
    box: dict[str, Any] = {}
    t1_holds, t2_holds, t2_may_leave, t1_done = (threading.Event() for _ in range(4))

    def t1() -> None:
        hold = lane.acquire("k")
        hold.__enter__()
        hold._suspend_renewal()  # test hook: renewal stops, the lease runs out
        box["h1"] = hold
        t1_holds.set()
        t2_holds.wait(10)
        try:
            hold.release()
            box["t1"] = "released"
        except NotOwnerError as exc:
            box["t1"] = exc
        t1_done.set()

    def t2() -> None:
        t1_holds.wait(10)
        with lane.acquire("k", timeout_s=10) as hold:
            box["h2"] = hold
            box["t2_at"] = time.monotonic()
            t2_holds.set()
            t2_may_leave.wait(10)
        box["t2"] = "released"

    threads = [threading.Thread(target=t1), threading.Thread(target=t2)]
    start = time.monotonic()
    for t in threads:
        t.start()
    assert t2_holds.wait(5), "T2 never got the key after T1's lease expired"
    assert box["t2_at"] - start >= 0.9  # only once the 1 s lease ran out
    assert t1_done.wait(5)
    # T1's release: a distinct not-owned error, naming the key.
    assert isinstance(box["t1"], NotOwnerError)
    assert "'k'" in str(box["t1"])
    # "k" still belongs to T2 ...
    h1: RedisHold = box["h1"]
    h2: RedisHold = box["h2"]
    assert h2.held and not h1.held
    assert h2.fencing_token > h1.fencing_token
    assert lane.is_held("k")
    # ... and a third client (another connection) cannot acquire.
    other = redis.Redis(host=redis_server.host, port=redis_server.port)
    third = RedisSessionLane(other, prefix=redis_prefix, lease_s=1.0)
    assert third.try_acquire("k") is False
    time.sleep(1.2)  # longer than a lease: T2's hold is renewed, still T2's
    assert third.try_acquire("k") is False
    t2_may_leave.set()
    for t in threads:
        t.join(5)
    assert box["t2"] == "released"  # T2's own release succeeded
    assert third.try_acquire("k") is True
    assert third.manual_release("k")
    other.close()


@pytest.mark.parametrize("kind", ["session", "counting"])
def test_c17_releasing_another_clients_hold(
    redis_server: Any, redis_client: redis.Redis, redis_prefix: str, kind: str,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """C17. Client 1 acquires "job"; client 2 (another connection) calls
    manual_release("job"). Expected: a distinct not-owned result (False and a warning
    saying the key is not held by this client); the key keeps client 1's hold; client 1's
    own release later succeeds."""
    conn2 = redis.Redis(host=redis_server.host, port=redis_server.port)

    def make(client: redis.Redis) -> RedisSessionLane | RedisLane:
        if kind == "session":
            return RedisSessionLane(client, "scheduler", prefix=redis_prefix)
        return RedisLane(client, "scheduler", max_concurrent=1, prefix=redis_prefix)

    client1, client2 = make(redis_client), make(conn2)
    assert client1.try_acquire("job")
    with caplog.at_level(logging.WARNING, logger="lanequeue.redis"):
        assert client2.manual_release("job") is False
    assert "not held by this client" in caplog.text
    assert client2.stats.unmatched_releases == 1
    # Client 1's hold is intact: nobody else can take the key.
    assert client2.try_acquire("job") is False
    if isinstance(client1, RedisSessionLane):
        assert client1.is_held("job")
    else:
        assert client1.holds_of("job") == 1
    assert client1.manual_release("job") is True
    assert client2.try_acquire("job") is True
    assert client2.manual_release("job") is True
    conn2.close()
