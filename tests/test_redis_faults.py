"""Fault injection against a real redis-server: the Redis lanes never have two holders
(issue 9, "Never two holders", cases C20-C27). Each test starts a server of its own, so
freezing it (SIGSTOP), reconfiguring it or flushing it disturbs no other test.

The check behind "never two holders": every grant is checked, in the granted thread,
against every other hold still inside its block: each must read ``lost == True`` (its
holder knows it lost the key) at that instant. Expected: 0 violations.
"""

from __future__ import annotations

import asyncio
import enum
import gc
import logging
import signal
import socket
import threading
import time
from typing import Any

import pytest
import redis
import redis.asyncio
from redis_server import RedisServer

from lanequeue import (
    AsyncLaneQueue,
    AsyncSessionLane,
    LaneBackendError,
    LaneQueue,
    LeaseLostError,
    SessionLane,
)
from lanequeue.redis import (
    AsyncRedisLane,
    AsyncRedisSessionLane,
    RedisHold,
    RedisLane,
    RedisSessionLane,
)
from lanequeue.redis._keys import base
from lanequeue.redis._wire import run_sync


@pytest.fixture
def server(own_server: RedisServer) -> RedisServer:
    return own_server


def client_of(server: RedisServer, **kw: Any) -> redis.Redis:
    return redis.Redis(host=server.host, port=server.port, **kw)


def wait_until(pred: Any, timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while not pred():
        assert time.monotonic() < deadline, "condition not reached in time"
        time.sleep(0.005)


class Inside:
    """The holds now inside their blocks; ``granted(h)`` counts a violation when another
    one still reads ``lost == False``."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.holds: list[Any] = []
        self.grants = 0
        self.violations: list[str] = []

    def granted(self, hold: Any) -> None:
        with self.lock:
            self.grants += 1
            for other in self.holds:
                if not other.lost:
                    self.violations.append(f"{hold!r} granted while {other!r} held")
            self.holds.append(hold)

    def left(self, hold: Any) -> None:
        with self.lock:
            self.holds.remove(hold)


# -- C21: the holder knows its lease is gone before anyone else is granted -------------


def test_c21_starved_pool_never_two_holders(server: RedisServer) -> None:
    """C21, input 1: 12 threads share BlockingConnectionPool(max_connections=4), one key,
    lease_s=1.5, 2.5 s of work in each hold. Expected: 0 grants while the previous holder
    reads lost == False; renewals never starve (they have their own connection), so no
    lease is lost at all."""
    pool = redis.BlockingConnectionPool(host=server.host, port=server.port,
                                        max_connections=4, timeout=20)
    client = redis.Redis(connection_pool=pool)
    lane = RedisSessionLane(client, lease_s=1.5)
    inside = Inside()
    end = time.monotonic() + 5.5
    lost: list[Any] = []

    def worker() -> None:
        while (left := end - time.monotonic()) > 0.1:
            with lane.acquire("k", timeout_s=left) as hold:
                inside.granted(hold)
                time.sleep(min(2.5, max(0.0, end - time.monotonic())))
                if hold.lost:
                    lost.append(hold)
                inside.left(hold)

    threads = [threading.Thread(target=_quiet(worker)) for _ in range(12)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(15)
    assert inside.violations == []
    assert inside.grants >= 2
    assert lost == []
    client.close()


def _quiet(fn: Any) -> Any:
    """A worker body whose LaneTimeoutError at the end of the window is expected."""
    from lanequeue import LaneTimeoutError

    def body() -> None:
        try:
            fn()
        except LaneTimeoutError:
            pass

    return body


def test_c21_frozen_server_holder_learns_by_its_deadline(server: RedisServer) -> None:
    """C21, input 2: the server is frozen with SIGSTOP for 4 s while a holder with
    lease_s=1 works. Expected: ``hold.lost`` and ``on_lease_lost`` within the lease (while
    the server is still frozen), and the waiter granted after SIGCONT finds the holder
    already lost."""
    assert server.proc is not None
    lost_at: list[float] = []
    a = RedisSessionLane(client_of(server), lease_s=1.0,
                         on_lease_lost=lambda h: lost_at.append(time.monotonic()))
    b = RedisSessionLane(client_of(server, socket_timeout=10), lease_s=1.0)
    inside = Inside()
    hold = a.acquire("k").__enter__()
    inside.granted(hold)
    box: dict[str, Any] = {}

    def waiter() -> None:
        with b.acquire("k", timeout_s=15) as h2:
            box["at"] = time.monotonic()
            inside.granted(h2)
            # Its grant's reply came back seconds after it was asked for (the server was
            # frozen): the lease was extended before use, so the new holder holds.
            box["h2_lost"] = h2.lost

    t = threading.Thread(target=waiter)
    t.start()
    time.sleep(0.5)  # the waiter is in line; the holder renewed at least once
    assert not hold.lost
    stopped = time.monotonic()
    server.freeze()
    try:
        time.sleep(1.2)
        assert hold.lost  # within one lease of the freeze, server still frozen
        wait_until(lambda: bool(lost_at), timeout=0.5)
        assert lost_at[0] - stopped <= 1.0
        time.sleep(4.0 - (time.monotonic() - stopped))
    finally:
        server.thaw()
    t.join(15)
    assert "at" in box
    assert inside.violations == []
    assert lost_at[0] < box["at"]
    assert box["h2_lost"] is False


class Proxy:
    """A TCP proxy on 127.0.0.1 to the server; ``cut()`` silently stops forwarding in both
    directions (the connections stay open: a black hole, as a dead network path is)."""

    def __init__(self, port: int) -> None:
        self.target = port
        self.listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.listener.bind(("127.0.0.1", 0))
        self.listener.listen(64)
        self.port = self.listener.getsockname()[1]
        self.cutoff = threading.Event()
        self.closed = threading.Event()
        self.socks: list[socket.socket] = []
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while not self.closed.is_set():
            try:
                down, _ = self.listener.accept()
            except OSError:
                return
            try:
                up = socket.create_connection(("127.0.0.1", self.target))
            except OSError:  # the server is gone (the test is ending): refuse this one
                down.close()
                continue
            self.socks += [down, up]
            threading.Thread(target=self._pump, args=(down, up), daemon=True).start()
            threading.Thread(target=self._pump, args=(up, down), daemon=True).start()

    def _pump(self, src: socket.socket, dst: socket.socket) -> None:
        while True:
            try:
                data = src.recv(65536)
            except OSError:
                return
            if not data:
                return
            if not self.cutoff.is_set():
                try:
                    dst.sendall(data)
                except OSError:
                    return

    def cut(self) -> None:
        self.cutoff.set()

    def close(self) -> None:
        self.closed.set()
        self.listener.close()
        for s in self.socks:
            try:
                s.close()
            except OSError:
                pass


def test_c21_connection_cut_holder_learns_before_the_next_grant(server: RedisServer) -> None:
    """C21, input 3: the holder's connections go through a TCP proxy that is cut while the
    process runs on. Expected: the holder's ``on_lease_lost`` fires within the lease of the
    cut and before the server grants the key to the waiter (a direct client); at that
    grant the holder reads lost."""
    proxy = Proxy(server.port)
    try:
        lost_at: list[float] = []
        a = RedisSessionLane(redis.Redis(host="127.0.0.1", port=proxy.port), lease_s=1.0,
                             on_lease_lost=lambda h: lost_at.append(time.monotonic()))
        b = RedisSessionLane(client_of(server), lease_s=1.0)
        inside = Inside()
        hold = a.acquire("k").__enter__()
        inside.granted(hold)
        time.sleep(0.5)  # a renewal went through the proxy
        box: dict[str, Any] = {}

        def waiter() -> None:
            with b.acquire("k", timeout_s=5) as h2:
                box["at"] = time.monotonic()
                inside.granted(h2)

        t = threading.Thread(target=waiter)
        t.start()
        cut = time.monotonic()
        proxy.cut()
        t.join(10)
        assert "at" in box
        assert inside.violations == []
        assert lost_at and lost_at[0] <= box["at"]
        assert lost_at[0] - cut <= 1.0
    finally:
        proxy.close()


# -- C22: eviction ---------------------------------------------------------------------


@pytest.mark.parametrize("policy", ["allkeys-lru", "volatile-lru", "volatile-ttl",
                                    "allkeys-random", "volatile-lfu"])
def test_c22_evicting_server_is_refused(server: RedisServer, policy: str) -> None:
    """C22: under maxmemory with an evicting policy a lane refuses on first use with a
    LaneBackendError naming the setting; noeviction, or no maxmemory, is accepted."""
    r = client_of(server)
    r.config_set("maxmemory", "100mb")
    r.config_set("maxmemory-policy", policy)
    for lane in (RedisSessionLane(r), RedisLane(r, "g")):
        with pytest.raises(LaneBackendError, match=f"maxmemory-policy '{policy}'"):
            lane.try_acquire("k")
    assert r.dbsize() == 0  # nothing granted, no key written
    r.config_set("maxmemory", "0")
    assert RedisSessionLane(r).try_acquire("k")
    r.config_set("maxmemory", "100mb")
    r.config_set("maxmemory-policy", "noeviction")
    assert RedisLane(r, "g").try_acquire("k")


def test_c22_a_policy_set_after_first_use_is_refused_at_the_next_check(
    server: RedisServer,
) -> None:
    """An evicting policy set on the live server after a lane's first use is refused
    from the lane's next check on (with its version claim, every ``_version_ttl_s / 2``
    of use; made short here): it used to be checked on first use only, and a later
    evicted holder key let a second holder in."""

    class Quick(RedisSessionLane):
        _version_ttl_s = 0.4

    r = client_of(server)
    lane = Quick(r, "later")
    assert lane.try_acquire("a") and lane.manual_release("a")
    r.config_set("maxmemory", "100mb")
    r.config_set("maxmemory-policy", "allkeys-lru")
    try:
        time.sleep(0.25)  # past the next check's time
        with pytest.raises(LaneBackendError, match="maxmemory-policy 'allkeys-lru'"):
            lane.try_acquire("b")
    finally:
        r.config_set("maxmemory", "0")
        r.config_set("maxmemory-policy", "noeviction")
    assert lane.try_acquire("b") and lane.manual_release("b")


def test_c22_async_lane_checks_too(server: RedisServer) -> None:
    async def main() -> None:
        r = redis.asyncio.Redis(host=server.host, port=server.port)
        await r.config_set("maxmemory", "100mb")
        await r.config_set("maxmemory-policy", "allkeys-lru")
        with pytest.raises(LaneBackendError, match="noeviction"):
            await AsyncRedisSessionLane(r).try_acquire("k")
        await r.aclose()

    asyncio.run(main())


# -- C23 / C24: one key identity; lanes never share Redis keys -------------------------


class Room(str, enum.Enum):
    LOBBY = "lobby"


ODD_KEYS = ["{", "}", ":", "{x}:h", "a}:s:0", "clé 🔑", "x" * (1 << 20)]


def test_c23_str_enum_is_its_plain_value(server: RedisServer) -> None:
    """C23: a str Enum member is its plain string value: Room.LOBBY and "lobby" are one
    key, in both faces."""
    r = client_of(server)
    a, b = RedisSessionLane(r), RedisSessionLane(r)
    with a.acquire(Room.LOBBY) as hold:  # type: ignore[arg-type]
        assert hold.key == "lobby" and type(hold.key) is str
        assert b.try_acquire("lobby") is False
    assert b.try_acquire("lobby") is True
    assert a.try_acquire(Room.LOBBY) is False  # type: ignore[arg-type]

    async def main() -> None:
        ar = redis.asyncio.Redis(host=server.host, port=server.port)
        lane = AsyncRedisSessionLane(ar)
        assert await lane.try_acquire(Room.LOBBY) is False  # type: ignore[arg-type]
        await ar.aclose()

    asyncio.run(main())


def test_c23_odd_keys_work_and_stay_distinct(server: RedisServer) -> None:
    r = client_of(server)
    a, b = RedisSessionLane(r), RedisSessionLane(r)
    counting = RedisLane(r, "g", max_concurrent=len(ODD_KEYS))
    for key in ODD_KEYS:
        assert a.try_acquire(key), key[:20]
        assert counting.try_acquire(key), key[:20]
    for key in ODD_KEYS:
        assert b.try_acquire(key) is False, key[:20]  # held by a, not by another key
        assert b.is_held(key)
        assert counting.holds_of(key) == 1
    for key in ODD_KEYS:
        assert a.manual_release(key) and counting.manual_release(key)
    assert not any(b.is_held(k) for k in ODD_KEYS)


@pytest.mark.parametrize("lane_type", [RedisSessionLane, RedisLane])
def test_c23_lone_surrogate_is_a_value_error_at_the_call(
    server: RedisServer, lane_type: Any
) -> None:
    lane = lane_type(client_of(server), "g")
    with pytest.raises(ValueError, match="surrogate"):
        lane.acquire("a\ud800")
    with pytest.raises(ValueError, match="surrogate"):
        lane.try_acquire("a\ud800")
    assert lane.stats.cancelled == 0


def test_c23_a_queue_mixing_lanes_refuses_the_key_before_taking_anything(
    server: RedisServer,
) -> None:
    """README: in a queue mixing an in-process lane and a Redis lane, a key that cannot
    be sent as UTF-8 is refused at the call, before anything is taken: the in-process
    lane is neither taken and given back, nor waited for while its key is busy (the
    caller once waited out its timeout and never saw the ValueError). A dispatcher over
    such lanes refuses it at submit, naming the argument."""
    from lanequeue import LaneQueue, ThreadDispatcher
    from lanequeue.redis import RedisBackend

    q = LaneQueue()
    q.add_session_lane("session", timeout_s=5)
    q.add_lane("global", max_concurrent=2, backend=RedisBackend(client_of(server)))
    bad = "\ud800"
    with pytest.raises(ValueError, match="surrogate"):
        q.acquire_all(bad, ["session", "global"])
    assert q["session"].stats.acquired == 0
    assert q["session"].try_acquire(bad)  # the in-process lane alone takes any str
    t0 = time.monotonic()
    with pytest.raises(ValueError, match="surrogate"):
        q.acquire_all(bad, ["session", "global"])  # its key busy: refused, not waited
    assert time.monotonic() - t0 < 1.0
    assert q["session"].manual_release(bad)
    with q.acquire_all(bad, ["session"]):  # in-process lanes only: taken
        assert q["session"].is_held(bad)
    d = ThreadDispatcher(q)
    try:
        with pytest.raises(ValueError, match=r"^ThreadDispatcher\.submit\(\) argument "
                           r"'key' must be encodable as UTF-8"):
            d.submit(bad, lambda: None)
        assert d.stats.submitted == 0
    finally:
        d.close()


def test_c24_lanes_that_differ_never_share_keys(server: RedisServer) -> None:
    """C24: session lane (prefix "app", name "c", key "jobs") and counting lane (prefix
    "app:s", name "jobs") used to map to the same Redis keys (WRONGTYPE)."""
    r = client_of(server)
    session = RedisSessionLane(r, "c", prefix="app")
    counting = RedisLane(r, "jobs", prefix="app:s", max_concurrent=1)
    assert session.try_acquire("jobs")
    assert counting.try_acquire("jobs")
    assert session.manual_release("jobs") and counting.manual_release("jobs")
    # Keys with separators: prefix "a:b" name "c" and prefix "a" with the rest in the key.
    one = RedisSessionLane(r, "c", prefix="a:b")
    two = RedisSessionLane(r, "b", prefix="a")
    assert one.try_acquire("k") and two.try_acquire("c:k")


# -- C25: cancelled twice ----------------------------------------------------------------


class SlowReplies(AsyncRedisSessionLane):
    """Each reply comes back 1 ms after the script ran (a slow network on the way back),
    so the cancellations land while scripts have run but their callers wait."""

    async def _run(self, op: str, key: str | None, call: Any) -> Any:
        reply = await super()._run(op, key, call)
        await asyncio.sleep(0.001)
        return reply


def test_c25_cancelled_twice_leaves_no_orphan(server: RedisServer) -> None:
    """C25: an async acquire cancelled twice 1 ms apart, 400 times, the first cancellation
    at 0 to 4 ms (in the acquire, in its clean-up, in the block, in the release).
    Expected: 0 keys left held once the clean-ups ran."""

    async def main() -> int:
        r = redis.asyncio.Redis(host=server.host, port=server.port)
        lane = SlowReplies(r, lease_s=30)

        async def body(key: str) -> None:
            async with lane.acquire(key):
                await asyncio.sleep(0.001)

        for i in range(400):
            task = asyncio.get_running_loop().create_task(body(f"k{i}"))
            await asyncio.sleep(0.0005 * (i % 9))
            task.cancel()
            await asyncio.sleep(0.001)
            task.cancel()
            try:
                await task
            except asyncio.CancelledError:
                pass
        from lanequeue.redis._async import _CLEANUPS

        for _ in range(200):
            if not _CLEANUPS:
                break
            await asyncio.sleep(0.01)
        probe = AsyncRedisSessionLane(r)
        held = [i for i in range(400) if await probe.is_held(f"k{i}")]
        await r.aclose()
        return len(held)

    assert asyncio.run(main()) == 0


# -- C26: wrong client kind ------------------------------------------------------------


def test_c26_wrong_client_kind_is_a_type_error_at_construction(server: RedisServer) -> None:
    sync_client = client_of(server)
    async_client = redis.asyncio.Redis(host=server.host, port=server.port)
    for lane_type in (AsyncRedisSessionLane, AsyncRedisLane):
        with pytest.raises(TypeError, match=r"redis\.asyncio\.Redis"):
            lane_type(sync_client, "g")
    for lane_type in (RedisSessionLane, RedisLane):
        with pytest.raises(TypeError, match=r"redis\.Redis"):
            lane_type(async_client, "g")
    assert sync_client.dbsize() == 0  # no script ran


# -- C20: dropped holds ----------------------------------------------------------------


def test_c20_dropped_hold_lapses_with_a_resource_warning(server: RedisServer) -> None:
    """C20: a hold garbage-collected without a release is no longer renewed: a
    ResourceWarning names it, and the key reaches another client within lease_s."""
    r = client_of(server)
    lane = RedisSessionLane(r, lease_s=0.6)
    other = RedisSessionLane(r, lease_s=0.6)
    hold: RedisHold | None = lane.acquire("dropped").__enter__()
    assert lane.active_count == 1
    with pytest.warns(ResourceWarning, match="'dropped'"):
        hold = None  # noqa: F841
        gc.collect()
    dropped = time.monotonic()
    assert other.acquire_timeout("dropped", 2.0)
    assert time.monotonic() - dropped <= 0.6 + 0.3  # a lease, plus a poll of the waiter
    wait_until(lambda: lane.active_count == 0)  # (once the renewer counted its release)


@pytest.mark.parametrize("how", ["with", "acquire_all"])
def test_a_dropped_hold_is_released_by_the_renewer_before_its_lease(
    server: RedisServer, how: str
) -> None:
    """A hold garbage-collected without a release (also the holds of an ``acquire_all``
    whose ``__exit__`` never ran: an interrupt at its entry) is released by the lane
    object's renewer at its next round (every ``lease_s/3`` at most), not left to lapse:
    with ``lease_s=30`` another client gets the key within a few seconds."""
    r = client_of(server)
    lane = RedisSessionLane(r, "d", lease_s=3.0)
    other = RedisSessionLane(client_of(server), "d", lease_s=3.0)
    if how == "with":
        hold: Any = lane.acquire("k").__enter__()
    else:
        queue = LaneQueue()
        queue.add(lane)
        hold = queue.acquire_all("k", ["d"])
        hold.__enter__()
    with pytest.warns(ResourceWarning, match="'k'"):
        hold = None
        gc.collect()
    dropped = time.monotonic()
    assert other.acquire_timeout("k", 2.5)  # before the 3 s lease would lapse
    assert time.monotonic() - dropped < 2.5
    assert other.manual_release("k")
    wait_until(lambda: lane.active_count == 0)  # (once the renewer counted its release)


def _books(lane: Any) -> tuple[int, int]:
    st = lane.stats
    return st.holders, st.acquired - st.released - st.unmatched_releases


@pytest.mark.parametrize("face", ["thread", "asyncio"])
@pytest.mark.parametrize("kind", [RedisSessionLane, RedisLane])
def test_a_dropped_hold_counts_as_held_until_its_release_answers(
    server: RedisServer, face: str, kind: Any
) -> None:
    """A dropped hold is still held in Redis until the renewer's release of it answers:
    meanwhile it counts in ``holders`` (and ``available``, ``wait_idle``), so the books
    ``acquired == released + unmatched_releases + holders`` balance at every instant.
    The renewer's release is held at a gate to look inside that window."""
    entered, go = threading.Event(), threading.Event()

    def gate(real: Any) -> Any:
        def gated(calls: Any, wait: float) -> Any:
            entered.set()
            assert go.wait(10)
            return real(calls, wait)

        async def agated(calls: Any, wait: float) -> Any:
            entered.set()
            while not go.is_set():
                await asyncio.sleep(0.005)
            return await real(calls, wait)

        return agated if face == "asyncio" else gated

    def check(lane: Any, is_idle: Any) -> None:
        assert entered.wait(5)  # the renewer is releasing the dropped hold
        assert _books(lane) == (1, 1)
        assert lane.active_count == 1
        if kind is RedisLane:
            assert lane.available == 1
        assert not is_idle()
        go.set()

    if face == "thread":
        lane = kind(client_of(server), "d", lease_s=1.5, **(
            {"max_concurrent": 2} if kind is RedisLane else {}))
        hold: Any = lane.acquire("k").__enter__()
        lane._renew_many_io = gate(lane._renew_many_io)
        with pytest.warns(ResourceWarning, match="'k'"):
            del hold
            gc.collect()
        check(lane, lambda: lane.wait_idle(0))
        wait_until(lambda: _books(lane) == (0, 0))
        assert lane.stats.unmatched_releases == 0 and lane.wait_idle(0)
        return

    async def main() -> None:
        akind = AsyncRedisSessionLane if kind is RedisSessionLane else AsyncRedisLane
        ar = redis.asyncio.Redis(host=server.host, port=server.port)
        lane = akind(ar, "d", lease_s=1.5, **(
            {"max_concurrent": 2} if kind is RedisLane else {}))
        hold: Any = lane.acquire("k")
        await hold.__aenter__()
        lane._renew_many_io = gate(lane._renew_many_io)
        with pytest.warns(ResourceWarning, match="'k'"):
            hold = None
            gc.collect()
        await asyncio.sleep(0)
        idle = lane.wait_idle(0)
        entered_at = time.monotonic()
        while not entered.is_set():
            assert time.monotonic() - entered_at < 5
            await asyncio.sleep(0.005)
        assert _books(lane) == (1, 1) and lane.active_count == 1
        if kind is RedisLane:
            assert lane.available == 1
        assert not await idle
        go.set()
        deadline = time.monotonic() + 5
        while _books(lane) != (0, 0):
            assert time.monotonic() < deadline
            await asyncio.sleep(0.005)
        assert lane.stats.unmatched_releases == 0 and await lane.wait_idle(0)
        await ar.aclose()

    asyncio.run(main())


# -- bounds ------------------------------------------------------------------------------


@pytest.mark.parametrize("lease", [3e10, 1e20, 7 * 86400 + 1])
def test_lease_too_large_is_a_value_error(server: RedisServer, lease: float) -> None:
    r = client_of(server)
    for lane_type in (RedisSessionLane, RedisLane):
        with pytest.raises(ValueError, match="lease_s"):
            lane_type(r, "g", lease_s=lease)
    RedisSessionLane(r, lease_s=7 * 86400)


# -- C27: acquire_all keeps the block's own exception ---------------------------------


def test_c27_acquire_all_block_error_propagates_after_a_lost_lease(
    server: RedisServer, caplog: pytest.LogCaptureFixture
) -> None:
    r = client_of(server)
    queue = LaneQueue()
    queue.add(RedisSessionLane(r, "remote", lease_s=0.2))
    queue.add(SessionLane("local"))
    with (
        caplog.at_level(logging.WARNING),
        pytest.raises(ValueError) as info,
        queue.acquire_all("k", ["remote", "local"]) as holds,
    ):
        holds["remote"]._suspend_renewal()
        time.sleep(0.4)
        assert holds["remote"].lost
        raise ValueError("the block's own error")
    assert str(info.value) == "the block's own error"
    assert "release failed" in caplog.text
    notes = getattr(info.value, "__notes__", [])
    assert any("lost" in n for n in notes) or not hasattr(info.value, "add_note")


def test_c27_async_queue_block_error_propagates(server: RedisServer) -> None:
    async def main() -> BaseException:
        r = redis.asyncio.Redis(host=server.host, port=server.port)
        queue = AsyncLaneQueue()
        queue.add(AsyncRedisSessionLane(r, "remote", lease_s=0.2))
        queue.add(AsyncSessionLane("local"))
        try:
            async with queue.acquire_all("k", ["remote", "local"]) as holds:
                holds["remote"]._suspend_renewal()
                await asyncio.sleep(0.4)
                raise ValueError("the block's own error")
        except BaseException as exc:
            await r.aclose()
            return exc
        raise AssertionError("no error")

    err = asyncio.run(main())
    assert isinstance(err, ValueError) and not isinstance(err, LeaseLostError)


# -- item 11: FLUSHALL ---------------------------------------------------------------


def test_flushall_holder_learns_within_one_renewal_interval(server: RedisServer) -> None:
    """After FLUSHALL (or a restart without persistence) a newcomer can be granted at once:
    that is the documented limit (fencing tokens protect the resource: the newcomer's
    token is larger). The old holder learns within one renewal interval (lease_s/3)."""
    r = client_of(server)
    lost_at: list[float] = []
    lane = RedisSessionLane(r, lease_s=0.9,
                            on_lease_lost=lambda h: lost_at.append(time.monotonic()))
    hold = lane.acquire("k").__enter__()
    time.sleep(0.1)
    r.flushall()
    flushed = time.monotonic()
    newcomer = RedisSessionLane(r, lease_s=0.9).acquire("k").__enter__()
    assert newcomer.fencing_token > hold.fencing_token
    wait_until(lambda: bool(lost_at), timeout=2)
    assert lost_at[0] - flushed <= 0.3 + 0.1  # one renewal interval, plus scheduling
    assert hold.lost
    # Its release names the cause: neither its deadline nor its presence, the server.
    with pytest.raises(LeaseLostError, match="the server no longer had it"):
        hold.release()
    assert newcomer.release()


# -- fork: a child neither renews nor releases its parent's holds ---------------------


def test_forked_child_cannot_renew_or_release_inherited_holds(server: RedisServer) -> None:
    """A hold belongs to the process that acquired it. In a forked child, releasing an
    inherited hold raises RuntimeError (hold.release() and manual_release), and the
    child's own renewer (started by a grant of its own) never renews the parent's hold:
    once the parent stops renewing, the key lapses within lease_s."""
    import os

    r = client_of(server)
    lane = RedisSessionLane(r, lease_s=0.6)
    hold = lane.acquire("parent").__enter__()
    assert lane.try_acquire("parent-manual")
    pid = os.fork()
    if pid == 0:  # the child
        code = 0
        try:
            try:
                hold.release()
                code |= 1
            except RuntimeError as exc:
                code |= 0 if "forked child" in str(exc) else 2
            try:
                lane.manual_release("parent-manual")
                code |= 4
            except RuntimeError:
                pass
            with lane.acquire("child"):  # starts the child's renewer
                time.sleep(1.5)
        except BaseException:
            code |= 8
        os._exit(code)
    hold._suspend_renewal()
    other = RedisSessionLane(client_of(server), lease_s=0.6)
    assert other.acquire_timeout("parent", 1.5)  # the child did not keep it alive
    _, status = os.waitpid(pid, 0)
    assert os.WEXITSTATUS(status) == 0
    assert lane.is_held("parent-manual")  # the child did not release it
    assert lane.manual_release("parent-manual")


# -- a release answered after the lease ran out: LeaseLostError, whatever the timing ----


def _frozen(server: RedisServer, seconds: float) -> threading.Thread:
    """Freeze the server now (SIGSTOP); a thread resumes it after ``seconds``."""
    assert server.proc is not None
    proc = server.proc
    proc.send_signal(signal.SIGSTOP)

    def resume() -> None:
        time.sleep(seconds)
        proc.send_signal(signal.SIGCONT)

    t = threading.Thread(target=resume)
    t.start()
    return t


@pytest.mark.parametrize("how", ["session", "counting", "acquire_all"])
@pytest.mark.parametrize("face", ["threads", "asyncio"])
def test_release_answered_after_the_lease_ran_out_raises_lease_lost(
    server: RedisServer, face: str, how: str
) -> None:
    """A release sent while the hold still reads held, to a server frozen past the lease:
    the server's answer says the hold is gone, and the release raises LeaseLostError
    (the class README gives "its Redis lease ran out"), as when the loss is noticed
    before the release is sent; the hold reads lost, the loss is counted once, and the
    refused release once. Both faces, both kinds, and a queue's acquire_all (whose
    release goes on to release every hold after the one that failed)."""
    lease = 0.5

    def lanes(client: Any, session_cls: Any, counting_cls: Any) -> list[Any]:
        out = []
        if how != "counting":
            out.append(session_cls(client, "fz-s", lease_s=lease))
        if how != "session":
            out.append(counting_cls(client, "fz-c", max_concurrent=2, lease_s=lease))
        return out

    def check(held: list[Any], err: BaseException, lanes_: list[Any]) -> None:
        assert isinstance(err, LeaseLostError), repr(err)
        assert "was lost" in str(err) and "nothing was released" in str(err)
        # The cause: the server kept it past the holder's own deadline.
        assert "it ran out before a renewal was confirmed" in str(err), str(err)
        assert all(h.lost for h in held)
        # Every hold was released, also those after the first that failed (acquire_all).
        assert not any(h.held for h in held)
        assert [ln.active_count for ln in lanes_] == [0] * len(lanes_)
        assert [ln.leases_lost for ln in lanes_] == [1] * len(lanes_)
        assert [ln.stats.unmatched_releases for ln in lanes_] == [1] * len(lanes_)

    if face == "threads":
        ls = lanes(client_of(server), RedisSessionLane, RedisLane)
        if how == "acquire_all":
            queue = LaneQueue()
            for ln in ls:
                queue.add(ln)
            multi = queue.acquire_all("k", [ln.name for ln in ls], timeout_s=2)
            got = multi.__enter__()
            held = [got[ln.name] for ln in ls]
            release: Any = multi.release
        else:
            held = [ls[0].acquire("k", timeout_s=2).__enter__()]
            release = held[0].release
        assert not any(h.lost for h in held)  # sent before any loss is known
        resumer = _frozen(server, 2 * lease)
        with pytest.raises(LeaseLostError) as info:
            release()
        resumer.join()
        check(held, info.value, ls)
        return

    async def body() -> None:
        ls = lanes(redis.asyncio.Redis(host=server.host, port=server.port),
                   AsyncRedisSessionLane, AsyncRedisLane)
        if how == "acquire_all":
            queue = AsyncLaneQueue()
            for ln in ls:
                queue.add(ln)
            multi = queue.acquire_all("k", [ln.name for ln in ls], timeout_s=2)
            got = await multi.__aenter__()
            held = [got[ln.name] for ln in ls]
            release: Any = multi.release
        else:
            held = [await ls[0].acquire("k", timeout_s=2).__aenter__()]
            release = held[0].release
        assert not any(h.lost for h in held)
        resumer = _frozen(server, 2 * lease)
        with pytest.raises(LeaseLostError) as info:
            await release()
        resumer.join()
        check(held, info.value, ls)

    asyncio.run(body())


def _in_child(check: Any) -> list[str]:
    """Fork; run ``check()`` in the child; what it found wrong (the names of its failed
    checks, or the error it raised)."""
    import os

    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        try:
            os.close(r)
            try:
                out = "\n".join(check())
            except BaseException as exc:  # reported to the parent
                out = f"raised {type(exc).__name__}: {exc}"
            os.write(w, out.encode())
        finally:
            os._exit(0)
    os.close(w)
    with os.fdopen(r, "rb") as f:
        got = f.read().decode()
    os.waitpid(pid, 0)
    return got.splitlines()


def _view_not_empty(lane: Any) -> list[str]:
    """What a forked child's own view of a Redis lane shows of its parent (a list of
    faults; [] when it starts empty): counts, get_active/stuck, stats and status, and
    stats that disagree (the parent's holds count as released)."""
    bad = []
    if (lane.active_count, lane.waiting) != (0, 0):
        bad.append(f"counts {lane.active_count}, {lane.waiting}")
    if lane.get_active() != {} or lane.stuck(0) != []:
        bad.append("get_active/stuck")
    st, status = lane.stats, lane.status()
    if (st.holders, st.waiters, status["active"], status["waiting"]) != (0, 0, 0, 0):
        bad.append("stats/status")
    if st.acquired != st.released + st.holders:  # the parent's holds count as released
        bad.append(f"stats disagree: {st}")
    return bad


@pytest.mark.filterwarnings("ignore::DeprecationWarning")  # fork with threads (3.12+)
@pytest.mark.parametrize("cls", [RedisSessionLane, RedisLane])
def test_forked_child_starts_with_no_holder_and_no_waiter_of_its_parent(
    server: RedisServer, cls: Any
) -> None:
    """A Redis lane object in a forked child counts none of the parent's holds and none
    of the parent's waiting threads (which do not exist in the child): active_count,
    waiting, get_active(), stuck(), stats and status() start at 0, wait_idle() and
    drain() finish once the child's own work is done, its own grants are recorded under
    the child's own presence connection (not the parent's), its watchdog never reports
    the parent's holds lost, and an inherited hold dropped there warns of nothing. The
    lane-wide view (from Redis) still shows the parent's hold, which is real."""
    import warnings

    lost: list[Any] = []
    kw = {"max_concurrent": 1} if cls is RedisLane else {}
    lane = cls(client_of(server), "forked", lease_s=0.6, on_lease_lost=lost.append, **kw)
    assert lane.acquire_timeout("k", 1)  # the parent holds k (the only permit)
    owned = lane.acquire("k2", timeout_s=0) if cls is RedisSessionLane else None
    if owned is not None:
        owned.__enter__()
    granted = threading.Event()

    def parent_waiter() -> None:
        if lane.acquire_timeout("k", 20):
            granted.set()
            lane.manual_release("k")

    t = threading.Thread(target=parent_waiter)
    t.start()
    wait_until(lambda: lane.waiting == 1, timeout=5)
    parent_pres = lane._pres()
    assert parent_pres is not None
    parent_epoch = parent_pres.current()
    assert parent_epoch is not None

    def check() -> list[str]:
        nonlocal owned
        bad = _view_not_empty(lane)
        if not lane.wait_idle(0):
            bad.append("wait_idle at fork")
        if cls is RedisLane:
            if lane.available != 1 or lane.lane_status()["active"] != 1:
                bad.append("available / lane-wide active")
            # The only permit is the parent's: the child's own waiter gives up.
            if lane.acquire_timeout("own", 0.3) or lane.waiting != 0:
                bad.append("own wait")
        else:
            if not lane.is_held("k"):  # lane-wide: the parent's hold is real
                bad.append("is_held")
            with lane.acquire("own", timeout_s=5) as mine:
                if lane.active_count != 1 or mine._presence is None \
                        or mine._presence.channel == parent_epoch.channel:
                    bad.append("own hold / presence")
            with warnings.catch_warnings():
                warnings.simplefilter("error")
                owned = None  # the parent's hold object, dropped here: no warning
                gc.collect()
        if (lane.active_count, lane.waiting) != (0, 0) or not lane.drain(3):
            bad.append("idle after own work")
        try:
            lane.manual_release("k")  # the parent's: a clear error, as before
            bad.append("released an inherited hold")
        except RuntimeError:
            pass
        time.sleep(0.8)  # past the lease: the child's watchdog never reports it lost
        if lost or lane.leases_lost:
            bad.append("parent's hold reported lost")
        return bad

    assert _in_child(check) == []
    assert lane.active_count == 1 + (owned is not None) and lane.waiting == 1
    lane.manual_release("k")
    t.join(5)
    assert granted.is_set()
    assert not lost


@pytest.mark.filterwarnings("ignore::DeprecationWarning")  # fork with threads (3.12+)
def test_forked_child_of_an_asyncio_process_counts_no_parent_task(server: RedisServer) -> None:
    """The asyncio face too: forked while a task of the parent waits and the lane object
    holds a key, the child's lane object has no holder and no waiter (``waiting``,
    ``active_count``, ``get_active()``, ``stuck()``, ``stats``, ``status()``, and the
    predicate ``wait_idle()``/``drain()`` wait for); the parent's are untouched."""

    def check(lane: Any) -> list[str]:
        bad = _view_not_empty(lane)
        if not lane._idle():
            bad.append("not idle")
        return bad

    async def main() -> None:
        r = redis.asyncio.Redis(host=server.host, port=server.port)
        lane = AsyncRedisSessionLane(r, "forked-a", lease_s=2)
        assert await lane.try_acquire("k")
        waiter = asyncio.ensure_future(lane.acquire_timeout("k", 20))
        while lane.waiting != 1:
            await asyncio.sleep(0.01)
        assert _in_child(lambda: check(lane)) == []
        assert (lane.active_count, lane.waiting) == (1, 1)
        assert await lane.manual_release("k")
        assert await waiter
        assert await lane.manual_release("k")
        await r.aclose()

    asyncio.run(main())


@pytest.mark.filterwarnings("ignore::DeprecationWarning")  # fork with threads (3.12+)
def test_forked_child_refuses_the_parents_asyncio_client_and_the_parent_goes_on(
    server: RedisServer,
) -> None:
    """A forked child that uses the parent's redis.asyncio client (through an inherited
    lane object, or a new one) gets a clear RuntimeError before any I/O: the client's
    connections are shared with the parent, whose next release once waited 5 s for a
    reply the child had taken, leaving the key held for its lease. The parent's release
    works at once; a client made in the child works."""

    async def child_use(lane: Any, made: Any) -> str:
        out = []
        for what in (lambda: lane.try_acquire("other"),
                     lambda: AsyncRedisSessionLane(made, "forked-c").try_acquire("x")):
            try:
                await what()
                out.append("no error")
            except RuntimeError as exc:
                out.append("refused" if "make the client and its lanes in the child"
                           in str(exc) else f"other: {exc}")
        fresh = redis.asyncio.Redis(host=server.host, port=server.port)
        own = AsyncRedisSessionLane(fresh, "forked-c")
        out.append(f"own client: {await own.try_acquire('y')}")
        await own.manual_release("y")
        await fresh.aclose()
        return " ".join(out)

    async def main() -> None:
        r = redis.asyncio.Redis(host=server.host, port=server.port)
        lane = AsyncRedisSessionLane(r, "forked-c", lease_s=30)
        assert await lane.try_acquire("k")
        assert _in_child(lambda: [asyncio.run(child_use(lane, r))]) == [
            "refused refused own client: True"]
        t0 = time.monotonic()
        assert await lane.manual_release("k")
        assert time.monotonic() - t0 < 2.0
        assert not await lane.is_held("k")
        await r.aclose()

    asyncio.run(main())


# -- protocol versions -----------------------------------------------------------------


class NextVersionSessionLane(RedisSessionLane):
    """A client of another protocol version: another key layout (and marker value)."""

    _layout = "lq3"
    _version_ttl_s = 1.0


class NextVersionLane(RedisLane):
    _layout = "lq3"
    _version_ttl_s = 1.0


class ShortMarkerSessionLane(RedisSessionLane):
    _version_ttl_s = 1.0


def test_two_protocol_versions_on_one_lane_are_refused_never_double_granted(
    server: RedisServer,
) -> None:
    """A rolling deploy: clients of the current version hold a key; a client of the next
    version (another key layout, so it cannot see their holds) is refused with a clear
    LaneBackendError instead of granting next to them, also while the holds live on with
    renewals only. Once the old version is gone (its marker ran out), the new one works,
    and then the old one is refused."""
    r = client_of(server)
    old = ShortMarkerSessionLane(r, lease_s=0.6)
    new = NextVersionSessionLane(client_of(server), lease_s=0.6)
    hold = old.acquire("k").__enter__()
    with pytest.raises(LaneBackendError, match=r"protocol version 'lq2'.*speaks 'lq3'"):
        new.try_acquire("k")
    time.sleep(1.3)  # longer than the marker: only the renewer keeps it claimed
    with pytest.raises(LaneBackendError, match="protocol version 'lq2'"):
        new.try_acquire("k")
    hold.release()
    time.sleep(1.1)  # the old version is idle: its marker runs out
    assert new.try_acquire("k")
    with pytest.raises(LaneBackendError, match="protocol version 'lq3'"):
        RedisSessionLane(r).try_acquire("other")
    # The counting kind, same rule (its own marker).
    assert RedisLane(r, "g").try_acquire("a")
    with pytest.raises(LaneBackendError, match="protocol version 'lq2'"):
        NextVersionLane(r, "g").try_acquire("a")


# -- item 10: the timing promises of the package docstring -----------------------------


@pytest.mark.filterwarnings(  # the ghost's hold: made by hand, never entered
    "ignore:.*garbage-collected without being entered:RuntimeWarning")
def test_dead_waiter_handed_the_key_blocks_it_at_most_its_liveness_window(
    server: RedisServer,
) -> None:
    """A waiter that died after its last refresh, then was handed the key (a claim until
    its liveness deadline), blocks the key for at most its liveness window,
    ``3 * min(1, lease_s/3) + 1`` s, counted from its last refresh; with lease_s=1 that is
    2 s, longer than the lease (the docstring says so)."""
    r = client_of(server)
    holder = RedisSessionLane(r, lease_s=1.0)
    ghost = RedisSessionLane(r, lease_s=1.0)
    nxt = RedisSessionLane(r, lease_s=1.0)
    window = 3 * min(1.0, 1.0 / 3) + 1
    assert ghost._live_ms == round(window * 1000)
    assert holder.try_acquire("k")
    h = RedisHold(ghost, "k", 5.0)
    script, keys, args = ghost._acquire_call(h, True)
    refreshed = time.monotonic()
    assert run_sync(r, script, keys, args)[0] == 0  # in line; never polls again
    box: dict[str, float] = {}

    def run() -> None:
        if nxt.acquire_timeout("k", 10):
            box["at"] = time.monotonic()

    t = threading.Thread(target=run)
    t.start()
    wait_until(lambda: holder.waiting_for("k") == 2)
    assert holder.manual_release("k")  # handed to the ghost: a claim
    t.join(10)
    blocked = box["at"] - refreshed
    assert 1.0 < blocked <= window + 0.35  # more than a lease, at most the window
    assert nxt.manual_release("k")


# -- an ACL user without the lanes' pub/sub channels ------------------------------------


@pytest.mark.parametrize("face", ["threads", "asyncio"])
def test_a_user_without_the_lanes_channels_is_refused_at_first_use(
    server: RedisServer, face: str
) -> None:
    """A Redis 7 ACL user with every key and command but no pub/sub channel (a new
    user's default) is refused at the lane's first use with a LaneBackendError that
    names the channels to grant, and nothing is taken. Such a user used to be taken on:
    each release that handed a key on then raised (its hand-off could not be published,
    after the key had moved on) and presence failed silently, so a killed holder's
    keys waited for their leases. Granted ``&lq:*``, the same user works."""
    admin = client_of(server)
    user = f"app{face}"
    admin.execute_command("ACL", "SETUSER", user, "on", ">pw", "~*", "+@all", "resetchannels")

    def client(aio: bool) -> Any:
        if aio:
            return redis.asyncio.Redis(host=server.host, port=server.port, username=user,
                                       password="pw")
        return redis.Redis(host=server.host, port=server.port, username=user, password="pw")

    def check_threads() -> None:
        lane = RedisSessionLane(client(False), "acl-s", lease_s=5)
        with pytest.raises(LaneBackendError, match="channels 'lq:\\*'"):
            lane.try_acquire("k")
        assert lane.active_count == 0

    async def check_asyncio() -> None:
        lane = AsyncRedisSessionLane(client(True), "acl-s", lease_s=5)
        with pytest.raises(LaneBackendError, match="channels 'lq:\\*'"):
            await lane.try_acquire("k")
        assert lane.active_count == 0

    def works() -> None:
        if face == "threads":
            lane = RedisSessionLane(client(False), "acl-s", lease_s=5)
            assert lane.try_acquire("k") and lane.manual_release("k")
        else:
            async def body() -> None:
                lane = AsyncRedisSessionLane(client(True), "acl-s", lease_s=5)
                assert await lane.try_acquire("k") and await lane.manual_release("k")
            asyncio.run(body())

    if face == "threads":
        check_threads()
    else:
        asyncio.run(check_asyncio())
    assert admin.keys("lanequeue:*acl-s*") == []  # refused before any lane key was made
    # The wake-up channels alone are not enough: presence subscribes 'lq:live:...'.
    admin.execute_command("ACL", "SETUSER", user, "&lq:wake:*")
    if face == "threads":
        check_threads()
    else:
        asyncio.run(check_asyncio())
    admin.execute_command("ACL", "SETUSER", user, "resetchannels", "&lq:*")
    works()


# -- a waiter whose acquire fails while it is in line ------------------------------------


@pytest.mark.timeout(60)
@pytest.mark.parametrize("face", ["threads", "asyncio"])
def test_a_waiter_whose_poll_connection_is_cut_leaves_no_entry_for_a_lease(
    server: RedisServer, face: str
) -> None:
    """A holds K; W, then X, wait. During a pause of writes (CLIENT PAUSE WRITE, as a
    failover issues) W's poll in flight has its connection cut: W's acquire raises
    LaneBackendError. A then releases: X gets K at once. W's line entry used to stay
    until its liveness ran out, and A's release handed it K for a whole lease that
    nobody used (X waited lease_s). Now W's withdraw runs in the background and lands
    once the server answers again."""
    lease = 20.0
    admin = client_of(server)

    def lane(name: str) -> RedisSessionLane:
        return RedisSessionLane(client_of(server, client_name=name), "cut", lease_s=lease,
                                warn_after_s=None)

    a, x = lane("A"), lane("X")
    hold = a.acquire("K").__enter__()
    outcome: dict[str, Any] = {}

    def w_threads() -> None:
        try:
            with lane("W").acquire("K", timeout_s=30):
                outcome["W"] = "held"
        except LaneBackendError as exc:
            outcome["W"] = exc

    def w_asyncio() -> None:
        async def body() -> None:
            client = redis.asyncio.Redis(host=server.host, port=server.port,
                                         client_name="W")
            w = AsyncRedisSessionLane(client, "cut", lease_s=lease, warn_after_s=None)
            try:
                async with w.acquire("K", timeout_s=30):
                    outcome["W"] = "held"
            except LaneBackendError as exc:
                outcome["W"] = exc
            await asyncio.sleep(1.0)  # (the loop lives on while its clean-up runs)
        asyncio.run(body())

    def x_waits() -> None:
        with x.acquire("K", timeout_s=50):
            outcome["X"] = time.monotonic()

    tw = threading.Thread(target=w_threads if face == "threads" else w_asyncio)
    tw.start()
    line = base("lanequeue", "s", "cut", "K") + "q"
    wait_until(lambda: admin.llen(line) == 1, timeout=5)  # W in line
    tx = threading.Thread(target=x_waits)
    tx.start()
    wait_until(lambda: admin.llen(line) == 2, timeout=5)  # X behind it
    admin.execute_command("CLIENT", "PAUSE", 3000, "WRITE")
    try:
        time.sleep(1.2)  # W's next poll (within a second) waits for the pause
        for c in admin.client_list():
            if c.get("name") == "W" and c.get("cmd", "").startswith("evalsha"):
                admin.execute_command("CLIENT", "KILL", "ID", c["id"])
    finally:
        admin.execute_command("CLIENT", "UNPAUSE")
    tw.join(10)
    assert isinstance(outcome.get("W"), LaneBackendError), outcome
    time.sleep(0.5)  # the background withdraw lands
    released = time.monotonic()
    hold.__exit__(None, None, None)
    tx.join(lease + 10)
    assert "X" in outcome
    waited = outcome["X"] - released
    assert waited < 5.0, waited  # not lease_s


@pytest.mark.timeout(90)
def test_a_hold_entered_again_after_failed_entries_is_not_released_by_their_clean_ups(
    server: RedisServer,
) -> None:
    """The server freezes; W's entries of one hold fail (LaneBackendError) and W enters
    the same hold again and again (allowed: an entry refused this way may be retried).
    Each failed entry leaves a clean-up (its withdraw, in the background) queued under
    the hold's owner id. Once the server is back W is granted; the clean-ups that run
    after that must not release W's grant: T, waiting for the key, gets it only once W
    left its block. (The retried entry asked under the same owner id, so a late
    clean-up found "its" grant and released it: T got in next to W.)"""
    lane_w = RedisSessionLane(client_of(server, socket_timeout=1), "again", lease_s=9,
                              warn_after_s=None)
    assert lane_w.try_acquire("warm") and lane_w.manual_release("warm")  # first use done
    hold = lane_w.acquire("k", timeout_s=60)
    events: list[tuple[str, float]] = []
    t0 = time.monotonic()

    def w() -> None:
        while time.monotonic() - t0 < 40:
            try:
                with hold:
                    events.append(("W in", time.monotonic()))
                    time.sleep(4)
                    events.append(("W out", time.monotonic()))
                return
            except LaneBackendError:
                time.sleep(0.2)

    resumer = _frozen(server, 4.0)
    tw = threading.Thread(target=w)
    tw.start()
    resumer.join()
    wait_until(lambda: any(e[0] == "W in" for e in events), timeout=20)
    t = RedisSessionLane(client_of(server), "again", lease_s=9, warn_after_s=None)
    with t.acquire("k", timeout_s=30):
        events.append(("T in", time.monotonic()))
    tw.join(30)
    at = dict(events)
    assert at["W in"] < at["W out"] <= at["T in"], sorted(events, key=lambda e: e[1])


@pytest.mark.timeout(60)
def test_an_asyncio_shutdown_during_an_outage_neither_waits_for_nor_reports_clean_ups(
    server: RedisServer, caplog: pytest.LogCaptureFixture
) -> None:
    """Waiters whose polls fail on a frozen server leave background withdraws (tasks);
    the program's ``asyncio.run`` then ends: the shutdown drops them at once, with no
    "unhandled exception during asyncio.run() shutdown" reported (their calls used to
    run in clean-up tasks of their own, which the shutdown waited for, a call bound
    each, and reported when they failed)."""
    import logging

    ended: list[float] = []

    async def main() -> None:
        holder = AsyncRedisSessionLane(redis.asyncio.Redis(host=server.host,
                                                           port=server.port), "down")
        held = await holder.acquire("k", timeout_s=5).__aenter__()  # (kept: held)
        client = redis.asyncio.Redis(host=server.host, port=server.port, socket_timeout=1)

        async def waiter() -> str:
            lane = AsyncRedisSessionLane(client, "down", warn_after_s=None)
            try:
                async with lane.acquire("k", timeout_s=30):
                    return "granted"
            except LaneBackendError:
                return "failed"

        tasks = [asyncio.create_task(waiter()) for _ in range(3)]
        await asyncio.sleep(0.5)  # all three in line
        proc.send_signal(signal.SIGSTOP)  # frozen until the program has ended
        try:
            assert await asyncio.gather(*tasks) == ["failed"] * 3
            assert held.held
        finally:
            ended.append(time.monotonic())

    assert server.proc is not None
    proc = server.proc
    try:
        with caplog.at_level(logging.ERROR, logger="asyncio"):
            asyncio.run(main())
        shutdown = time.monotonic() - ended[0]
    finally:
        proc.send_signal(signal.SIGCONT)
    assert shutdown < 0.5, shutdown
    assert "unhandled exception during asyncio.run() shutdown" not in caplog.text


def test_background_withdraws_of_a_closed_loop_do_not_use_up_the_bound() -> None:
    """A loop closed without running its pending tasks never ends them: its background
    withdraws (``_LATER``) are forgotten at the next one, so they neither keep the loop
    alive nor use up ``LATER_MAX`` for every later loop of the process."""
    from lanequeue.redis import _async
    from lanequeue.redis._protocol import LATER_MAX

    before = set(_async._LATER)
    for _ in range(LATER_MAX):
        loop = asyncio.new_event_loop()
        task = loop.create_task(asyncio.sleep(10))
        _async._LATER.add(task)
        loop.close()
        task._log_destroy_pending = False  # (closed unrun on purpose)
        task.get_coro().close()  # (nor its coroutine's "never awaited")
    ran: list[bool] = []

    def steps() -> Any:
        ran.append(True)
        return
        yield  # (a procedure of no step)

    async def main() -> None:
        lane = AsyncRedisSessionLane(redis.asyncio.Redis(port=1), "closed")
        lane._later(steps())
        await asyncio.sleep(0)
        await asyncio.sleep(0)

    asyncio.run(main())
    assert ran == [True]
    assert not any(t.get_loop().is_closed() for t in _async._LATER - before)


def test_a_failure_without_a_message_is_logged_by_its_class(
    redis_client: Any, redis_prefix: str, caplog: pytest.LogCaptureFixture,
) -> None:
    """An ``asyncio`` or socket ``TimeoutError`` has no message: a renewal that failed
    with one is logged as ``failed: TimeoutError``, not ``failed: TimeoutError: `` (nor,
    as the version marker's line was, with nothing at all after the colon)."""
    from lanequeue._errors import told

    assert told(asyncio.TimeoutError()) == "TimeoutError"
    assert told(ConnectionError("Error 111")) == "ConnectionError: Error 111"
    lane = RedisSessionLane(redis_client, "r", prefix=redis_prefix, lease_s=30.0)
    caplog.set_level(logging.WARNING, logger="lanequeue")
    with lane.acquire("k") as hold:
        lane._renew_failed([hold], asyncio.TimeoutError(), time.monotonic())
        assert hold.held and not hold.lost  # (well within its lease: not lost)
    [line] = [r.getMessage() for r in caplog.records if "renewing the lease" in r.getMessage()]
    assert line.endswith("(keys 'k') failed: TimeoutError"), line
