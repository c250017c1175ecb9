"""Many waiters on few connections (C28), order inside a process (C29), and wake-ups on a
Redis Cluster: against a real redis-server."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
import redis.asyncio
from redis.cluster import RedisCluster
from redis_server import RedisServer

from lanequeue.redis import AsyncRedisLane, AsyncRedisSessionLane, RedisLane, RedisSessionLane
from lanequeue.redis._wake import FREEING_CALLS, MAX_CALLS


@pytest.fixture
def server(tmp_path: Path) -> Iterator[RedisServer]:
    s = RedisServer(tmp_path)
    s.start()
    yield s
    s.stop()


def connections(server: RedisServer) -> int:
    """Clients connected now, not counting the one asking."""
    with redis.Redis(host=server.host, port=server.port) as r:
        return len(r.client_list()) - 1


@pytest.mark.timeout(60)
def test_c28_ten_thousand_waiters_share_a_handful_of_connections(server: RedisServer) -> None:
    """C28: 10,000 waiters in one asyncio process on redis-py's default pool: no error
    (no MaxConnectionsError), and CLIENT LIST shows a handful of connections while they
    all wait: the lanes' calls in flight are bounded per process, and wake-ups come over
    one subscription."""

    async def main() -> tuple[list[Any], int]:
        r = redis.asyncio.Redis(host=server.host, port=server.port)
        lane = AsyncRedisSessionLane(r)
        assert await lane.try_acquire("k")
        # The first waiter in line outlasts any slow join (on a loaded machine joining
        # 10,000 can take longer than the others' 6 s), so the hand-off on release has
        # a waiter to go to whatever the load; the rest end by timing out.
        waiters = [asyncio.ensure_future(lane.acquire_timeout("k", 30.0))]
        first_in_line = time.monotonic() + 20
        while await lane.waiting_for("k") < 1:  # in the server's line
            assert time.monotonic() < first_in_line
            await asyncio.sleep(0.001)
        waiters += [asyncio.ensure_future(lane.acquire_timeout("k", 6.0))
                    for _ in range(9_999)]
        # Until every waiter is in line or already ended (on a slow machine the first
        # ones may time out before the last ones join: waiting alone might never reach
        # 10,000), with a bound.
        deadline = time.monotonic() + 40
        while lane.waiting + sum(w.done() for w in waiters) < 10_000:
            assert time.monotonic() < deadline, (lane.waiting, sum(w.done() for w in waiters))
            await asyncio.sleep(0.05)
        await asyncio.sleep(0.5)
        seen = await asyncio.to_thread(connections, server)
        assert await lane.manual_release("k")
        results = await asyncio.gather(*waiters, return_exceptions=True)
        await r.aclose()
        return results, seen

    results, seen = asyncio.run(main())
    errors = [x for x in results if isinstance(x, BaseException)]
    assert errors == []
    assert results[0] is True  # the hand-off went on while the rest waited
    # The design's bound, whatever the load: the calls in flight (MAX_CALLS, the
    # first-use checks among them), the releases and withdrawals (FREEING_CALLS: timed-out
    # waiters withdraw at once under load), the wake-up subscription, the lane object's
    # renewal connection (it holds k) and the presence connection. Not one per waiter.
    assert seen <= MAX_CALLS + FREEING_CALLS + 3, seen


class PeakConnections:
    """A sampler thread: the most connections the server had at once (CLIENT LIST every
    2 ms, not counting its own), while in use as a context manager."""

    def __init__(self, server: RedisServer) -> None:
        self._admin = redis.Redis(host=server.host, port=server.port)
        self._me = self._admin.client_id()
        self._stop = threading.Event()
        self.peak = 0
        self.at_peak: list[str] = []
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            clients = [c for c in self._admin.client_list() if int(c["id"]) != self._me]
            if len(clients) > self.peak:
                self.peak = len(clients)
                self.at_peak = sorted(str(c.get("cmd")) for c in clients)
            time.sleep(0.002)

    def __enter__(self) -> PeakConnections:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        time.sleep(0.05)
        self._stop.set()
        self._thread.join(5)
        self._admin.close()


@pytest.mark.timeout(60)
@pytest.mark.parametrize("cls", [RedisSessionLane, RedisLane])
def test_c28_threads_starting_at_once_stay_within_the_connection_bound(
    server: RedisServer, cls: Any
) -> None:
    """C28, thread face: 200 threads start at once on a fresh lane object (one client),
    so all of them run its first-use checks together, then take turns on 20 keys. The
    server never sees more connections than the README's bound: the script calls
    (MAX_CALLS + FREEING_CALLS, the first-use checks among them), one wake-up
    subscription, the lane object's renewal connection and the process's presence
    connection."""
    kw = {"max_concurrent": 4} if cls is RedisLane else {}
    lane = cls(redis.Redis(host=server.host, port=server.port), "burst", **kw)
    start = threading.Barrier(200)
    errors: list[BaseException] = []

    def worker(i: int) -> None:
        try:
            start.wait()
            for _ in range(3):
                with lane.acquire(f"k{i % 20}", timeout_s=30):
                    time.sleep(0.001)
        except BaseException as exc:
            errors.append(exc)

    with PeakConnections(server) as peak:
        threads = [threading.Thread(target=worker, args=(i,)) for i in range(200)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(50)
    assert errors == []
    assert lane.stats.acquired == 600
    assert peak.peak <= MAX_CALLS + FREEING_CALLS + 3, (peak.peak, peak.at_peak)


@pytest.mark.timeout(60)
def test_c28_tasks_starting_at_once_stay_within_the_connection_bound(
    server: RedisServer,
) -> None:
    """C28, asyncio face: as above with 200 tasks on one event loop (the script calls
    taken from the client's pool, within the same bound)."""

    async def main() -> int:
        r = redis.asyncio.Redis(host=server.host, port=server.port)
        lane = AsyncRedisSessionLane(r, "burst")

        async def worker(i: int) -> None:
            for _ in range(3):
                async with lane.acquire(f"k{i % 20}", timeout_s=30):
                    await asyncio.sleep(0.001)

        await asyncio.gather(*(worker(i) for i in range(200)))
        n = lane.stats.acquired
        await r.aclose()
        return n

    with PeakConnections(server) as peak:
        assert asyncio.run(main()) == 600
    assert peak.peak <= MAX_CALLS + FREEING_CALLS + 3, (peak.peak, peak.at_peak)


def test_c28_counting_lane_many_waiters_no_pool_error(server: RedisServer) -> None:
    """C28 input: 200 concurrent requests on one async replica with the default pool
    (observed: 100 MaxConnectionsErrors). Expected: none; all 200 granted in turn."""

    async def main() -> list[Any]:
        r = redis.asyncio.Redis(host=server.host, port=server.port)
        lane = AsyncRedisLane(r, "g", max_concurrent=4)

        async def one(i: int) -> bool:
            async with lane.acquire(f"k{i}", timeout_s=30):
                await asyncio.sleep(0.001)
            return True

        out = await asyncio.gather(*(one(i) for i in range(200)), return_exceptions=True)
        await r.aclose()
        return out

    assert asyncio.run(main()) == [True] * 200


def test_c29_same_key_requests_of_one_process_keep_arrival_order(server: RedisServer) -> None:
    """C29: same-key requests of one process, on a cold pool, arriving 0-3 ms apart, are
    granted in arrival order (each joins the Redis line once its predecessor's first
    script has answered)."""

    async def main() -> list[int]:
        r = redis.asyncio.Redis(host=server.host, port=server.port)
        lane = AsyncRedisSessionLane(r)
        order: list[int] = []

        async def one(i: int) -> None:
            async with lane.acquire("conv", timeout_s=20):
                order.append(i)
                await asyncio.sleep(0.002)

        tasks = []
        for i in range(40):
            tasks.append(asyncio.ensure_future(one(i)))
            await asyncio.sleep(0.001 * (i % 4))  # some arrive in the same loop turn
        await asyncio.gather(*tasks)
        await r.aclose()
        return order

    assert asyncio.run(main()) == list(range(40))


def test_c29_threads_same_key_arrival_order(
    server: RedisServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """C29 for threads: each thread calls acquire once the previous one has arrived
    (registered its request, before any I/O); they are granted in that order."""
    r = redis.Redis(host=server.host, port=server.port)
    lane = RedisSessionLane(r)
    assert lane.try_acquire("conv")
    arrived = threading.Semaphore(0)
    join_turn = lane._join_turn

    def hooked(key: str, mine: Any) -> Any:
        out = join_turn(key, mine)
        arrived.release()
        return out

    monkeypatch.setattr(lane, "_join_turn", hooked)
    order: list[int] = []
    threads = []
    for i in range(12):
        def run(i: int = i) -> None:
            with lane.acquire("conv", timeout_s=20):
                order.append(i)
        t = threading.Thread(target=run)
        t.start()
        threads.append(t)
        assert arrived.acquire(timeout=5)
    assert lane.manual_release("conv")
    for t in threads:
        t.join(20)
    assert order == list(range(12))


def test_wake_ups_work_on_redis_cluster(tmp_path: Path) -> None:
    """The one-node cluster: a waiter is woken by the hand-off (well before its next poll,
    1 s away with the default lease), not by polling."""
    srv = RedisServer(tmp_path, cluster=True)
    srv.start()
    try:
        client = RedisCluster(host=srv.host, port=srv.port)
        holder, waiter = RedisSessionLane(client), RedisSessionLane(client)
        assert holder.try_acquire("k")
        box: dict[str, float] = {}

        def run() -> None:
            if waiter.acquire_timeout("k", 10):
                box["at"] = time.monotonic()

        t = threading.Thread(target=run)
        t.start()
        while holder.waiting_for("k") == 0:
            time.sleep(0.005)
        time.sleep(0.1)
        released = time.monotonic()
        assert holder.manual_release("k")
        t.join(10)
        assert box["at"] - released < 0.5
        assert waiter.manual_release("k")
        client.close()
    finally:
        srv.stop()


def test_a_waiter_listens_for_its_wake_up_before_it_joins_the_line(
    server: RedisServer,
) -> None:
    """A hand-off published before the waiter's process subscribed to its wake-up channel
    would be lost (one poll of delay). So the first waiting acquire on a client whose
    listener has not started yet starts it, and waits until it is subscribed, BEFORE its
    acquire script can put it in line: thread and asyncio faces; a call that does not
    wait (try_acquire) starts nothing."""
    seen: list[bool] = []

    class Probe(RedisSessionLane):
        def _run(self, op: str, key: str | None, call: Any) -> Any:
            if op == "acquire":
                seen.append(self._wk().listening)
            return super()._run(op, key, call)

    admin = redis.Redis(host=server.host, port=server.port)
    holder = RedisSessionLane(admin)
    assert holder.try_acquire("k")
    fresh = redis.Redis(host=server.host, port=server.port)  # no listener yet
    lane = Probe(fresh)
    assert lane.try_acquire("k") is False
    assert seen == [False]  # a call that does not wait needs no listener
    got: list[bool] = []
    t = threading.Thread(target=lambda: got.append(lane.acquire_timeout("k", 10)))
    t.start()
    deadline = time.monotonic() + 8
    while lane.waiting_for("k") != 1:
        assert time.monotonic() < deadline
        time.sleep(0.005)
    assert holder.manual_release("k")
    t.join(10)
    assert got == [True] and seen[1] is True
    assert lane.manual_release("k")

    async_seen: list[bool] = []

    class AsyncProbe(AsyncRedisSessionLane):
        async def _run(self, op: str, key: str | None, call: Any) -> Any:
            if op == "acquire":
                async_seen.append(self._wk().listening)
            return await super()._run(op, key, call)

    async def main() -> bool:
        r = redis.asyncio.Redis(host=server.host, port=server.port)
        try:
            a = AsyncProbe(r)
            assert holder.try_acquire("k")
            waiter = asyncio.get_running_loop().create_task(a.acquire_timeout("k", 10))
            while not async_seen:
                await asyncio.sleep(0.005)
            assert holder.manual_release("k")
            ok = await asyncio.wait_for(waiter, 10)
            assert await a.manual_release("k")
            return ok
        finally:
            await r.aclose()

    assert asyncio.run(main()) is True
    assert async_seen[0] is True
    fresh.close()
    admin.close()


def _wake_threads() -> set[threading.Thread]:
    return {t for t in threading.enumerate() if t.name == "lanequeue-wake"}


def _ended(ref: Any, thread: threading.Thread, deadline_s: float = 5.0) -> tuple[bool, bool]:
    """Collect garbage until ``ref()`` dies and ``thread`` has ended, or ``deadline_s``
    passes; (client collected, thread still running)."""
    import gc

    end = time.monotonic() + deadline_s
    while True:
        gc.collect()
        if (ref() is None and not thread.is_alive()) or time.monotonic() > end:
            return ref() is None, thread.is_alive()
        time.sleep(0.05)


@pytest.mark.timeout(30)
def test_wake_up_listener_ends_with_its_client(server: RedisServer) -> None:
    """A client dropped by the application takes its wake-up listener thread and that
    thread's connection with it (a daemon that makes clients over weeks must not keep a
    thread and a connection per client it ever used). The listener is told apart by
    identity: listeners of clients that earlier tests dropped may end meanwhile."""
    import weakref

    before = _wake_threads()
    r = redis.Redis(host=server.host, port=server.port)
    lane = RedisSessionLane(r, lease_s=5.0)
    assert lane.try_acquire("k")
    assert not lane.acquire_timeout("k", 0.2)  # a wait: the listener starts
    [listener] = _wake_threads() - before
    assert lane.manual_release("k")
    ref = weakref.ref(r)
    r.close()
    del lane, r
    collected, running = _ended(ref, listener)
    assert collected and not running, (collected, running)


@pytest.mark.timeout(30)
def test_async_wake_up_listener_ends_with_its_client(server: RedisServer) -> None:
    """The asyncio twin: the listener task of a dropped client ends on its loop."""
    import gc
    import weakref

    async def main() -> tuple[bool, int]:
        r = redis.asyncio.Redis(host=server.host, port=server.port)
        lane = AsyncRedisSessionLane(r, lease_s=5.0)
        assert await lane.try_acquire("k")
        assert not await lane.acquire_timeout("k", 0.2)
        assert [t for t in asyncio.all_tasks() if t.get_name() == "lanequeue-wake"]
        assert await lane.manual_release("k")
        ref = weakref.ref(r)
        await r.aclose()
        del lane, r
        end = time.monotonic() + 5.0
        while time.monotonic() < end:
            gc.collect()
            left = [t for t in asyncio.all_tasks() if t.get_name() == "lanequeue-wake"]
            if ref() is None and not left:
                break
            await asyncio.sleep(0.05)
        return ref() is None, len(left)

    collected, left = asyncio.run(main())
    assert collected and left == 0, (collected, left)
