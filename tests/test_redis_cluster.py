"""The Redis lanes on Redis Cluster (a real one-node cluster: ``cluster-enabled yes``, all
slots on one node, a ``RedisCluster`` client). The server refuses a script whose declared
keys span slots (CROSSSLOT), and the client routes each call by its keys, so this shows
the lanes run unchanged on a cluster. That the keys a script derives inside Lua (a
waiter's signal list) share the slot too is checked in test_redis_lanes.py
(``test_keys_of_one_session_key_share_a_slot``): a one-node cluster serves every slot, so
it could not catch a derived key in a foreign slot."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from redis.cluster import RedisCluster
from redis_server import RedisServer

from lanequeue.redis import RedisLane, RedisSessionLane


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[RedisCluster]:
    server = RedisServer(tmp_path, cluster=True)
    server.start()
    client = RedisCluster(host=server.host, port=server.port)
    yield client
    client.close()
    server.stop()


@pytest.mark.parametrize("kind", ["session", "counting"])
def test_lanes_on_redis_cluster(cluster: RedisCluster, redis_prefix: str, kind: str) -> None:
    def make() -> RedisSessionLane | RedisLane:
        if kind == "session":
            return RedisSessionLane(cluster, prefix=redis_prefix, lease_s=0.5)
        return RedisLane(cluster, "g", max_concurrent=1, prefix=redis_prefix, lease_s=0.5)

    holder = make()
    assert holder.try_acquire("gateway:slack:c1")
    order: list[tuple[int, int]] = []
    threads = []
    for i in range(3):
        lane = make()

        def run(i: int = i, lane: RedisSessionLane | RedisLane = lane) -> None:
            with lane.acquire("gateway:slack:c1", timeout_s=10) as hold:
                order.append((i, hold.fencing_token))
                time.sleep(0.01)

        t = threading.Thread(target=run)
        t.start()
        threads.append(t)
        time.sleep(0.1)
    time.sleep(0.8)  # longer than a lease: the holder's renewal runs on the cluster too
    assert holder.manual_release("gateway:slack:c1")  # hand-off: signal key made in Lua
    for t in threads:
        t.join(10)
    assert [i for i, _ in order] == [0, 1, 2]
    assert [f for _, f in order] == sorted(f for _, f in order)
    if isinstance(holder, RedisSessionLane):
        assert not holder.is_held("gateway:slack:c1")
    else:
        wide = holder.lane_status()
        assert wide["active"] == 0 and wide["available"] == 1
