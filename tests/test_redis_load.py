"""The Redis lanes under load, against a real redis-server: a renewer that is slow per
round trip (network latency, or a process whose threads wait long for the CPU) must still
renew every hold before its deadline.

The replay at ``--speed 600 --workers 4`` lost 5-36 leases (up to hundreds) per run: its
renewer sent one round trip per hold, one after another, so the holds at the end of a batch
were renewed after their deadline (a renewal of one hold was measured at 20 s of wall time
while its wait was bounded at 7.5 s: the thread waited that long for the interpreter).
Here the renewer's connection goes through a proxy that adds a fixed latency to every
request, the same lateness made exact: a batch of 16 holds renewed one round trip at a
time needs 16 x 0.3 s, past their deadline; in one round trip, 0.3 s.
"""

from __future__ import annotations

import asyncio
import heapq
import socket
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
import redis
import redis.asyncio
from redis_server import RedisServer

from lanequeue.redis import AsyncRedisSessionLane, RedisLane, RedisSessionLane


@pytest.fixture
def server(own_server: RedisServer) -> RedisServer:
    return own_server


class LatencyProxy:
    """A TCP proxy on 127.0.0.1 to the server that delivers every chunk a client sends
    ``delay_s`` seconds after it arrived (a latency, not a bandwidth limit: chunks sent
    together stay together, chunks sent apart each wait ``delay_s``). Replies pass at
    once. ``delay_s`` may be changed at any time; it applies to chunks arriving after."""

    def __init__(self, port: int) -> None:
        self.target = port
        self.delay_s = 0.0
        self.listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.listener.bind(("127.0.0.1", 0))
        self.listener.listen(64)
        self.port = self.listener.getsockname()[1]
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
            except OSError:
                down.close()
                continue
            self.socks += [down, up]
            line: list[tuple[float, int, bytes]] = []
            cond = threading.Condition()
            threading.Thread(target=self._late, args=(down, up, line, cond), daemon=True).start()
            threading.Thread(target=self._send, args=(up, line, cond), daemon=True).start()
            threading.Thread(target=self._pump, args=(up, down), daemon=True).start()

    def _late(self, src: socket.socket, dst: socket.socket,
              line: list[tuple[float, int, bytes]], cond: threading.Condition) -> None:
        seq = 0
        while True:
            try:
                data = src.recv(65536)
            except OSError:
                data = b""
            with cond:
                seq += 1
                heapq.heappush(line, (time.monotonic() + self.delay_s, seq, data))
                cond.notify()
            if not data:
                return

    def _send(self, dst: socket.socket, line: list[tuple[float, int, bytes]],
              cond: threading.Condition) -> None:
        while True:
            with cond:
                while not line or line[0][0] > time.monotonic():
                    cond.wait(None if not line else line[0][0] - time.monotonic())
                _, _, data = heapq.heappop(line)
            if not data:
                try:
                    dst.shutdown(socket.SHUT_WR)
                except OSError:
                    pass
                return
            try:
                dst.sendall(data)
            except OSError:
                return

    @staticmethod
    def _pump(src: socket.socket, dst: socket.socket) -> None:
        while True:
            try:
                data = src.recv(65536)
                if not data:
                    return
                dst.sendall(data)
            except OSError:
                return

    def close(self) -> None:
        self.closed.set()
        self.listener.close()
        for s in self.socks:
            try:
                s.close()
            except OSError:
                pass


@pytest.fixture
def proxy(server: RedisServer) -> Iterator[LatencyProxy]:
    p = LatencyProxy(server.port)
    yield p
    p.close()


HOLDS = 16
DELAY_S = 0.3
# Renewed every 1 s; a deadline is 2.85 s after the renewal before; 16 renewals one
# after another would take 4.8 s.
LEASE_S = 3.0


@pytest.mark.timeout(30)
@pytest.mark.parametrize("kind", ["session", "counting"])
def test_slow_renewer_round_trips_renew_every_hold_in_time(
    server: RedisServer, proxy: LatencyProxy, kind: str
) -> None:
    """16 holds of one lane object fall due together; from their second renewal on every
    request to Redis takes 0.3 s: all of them are renewed before their deadline (0 leases
    lost, every hold still held in Redis past the deadlines the first renewal set)."""
    client = redis.Redis(host="127.0.0.1", port=proxy.port)
    lane: Any = (RedisSessionLane(client, lease_s=LEASE_S) if kind == "session"
                 else RedisLane(client, "g", max_concurrent=HOLDS, lease_s=LEASE_S))
    keys = [f"k{i}" for i in range(HOLDS)]
    for key in keys:
        assert lane.try_acquire(key)
    time.sleep(LEASE_S / 3 + 0.2)  # the first round connected the renewer and renewed
    proxy.delay_s = DELAY_S
    time.sleep(LEASE_S)  # past the deadlines set by the first round: two more rounds ran
    assert lane.leases_lost == 0
    assert lane.active_count == HOLDS
    direct = redis.Redis(host=server.host, port=server.port)
    if kind == "session":
        check: Any = RedisSessionLane(direct)
        assert all(check.is_held(key) for key in keys)
    else:
        check = RedisLane(direct, "g", max_concurrent=HOLDS)
        assert check.lane_status()["active"] == HOLDS
    proxy.delay_s = 0.0
    for key in keys:
        assert lane.manual_release(key)


@pytest.mark.timeout(30)
def test_slow_renewer_round_trips_async(server: RedisServer, proxy: LatencyProxy) -> None:
    """The asyncio renewer, same input: 0 leases lost."""

    async def main() -> None:
        client = redis.asyncio.Redis(host="127.0.0.1", port=proxy.port)
        lane = AsyncRedisSessionLane(client, lease_s=LEASE_S)
        keys = [f"k{i}" for i in range(HOLDS)]
        for key in keys:
            assert await lane.try_acquire(key)
        await asyncio.sleep(LEASE_S / 3 + 0.2)
        proxy.delay_s = DELAY_S
        await asyncio.sleep(LEASE_S)
        assert lane.leases_lost == 0
        assert lane.active_count == HOLDS
        check = RedisSessionLane(redis.Redis(host=server.host, port=server.port))
        assert all(check.is_held(key) for key in keys)
        proxy.delay_s = 0.0
        for key in keys:
            assert await lane.manual_release(key)
        await client.aclose()

    asyncio.run(main())


# -- the bound on script calls in flight (thread face) -----------------------------------


@pytest.mark.timeout(30)
@pytest.mark.parametrize("kind", ["session", "counting"])
def test_release_never_waits_behind_acquires_for_a_script_connection(
    server: RedisServer, kind: str
) -> None:
    """Every script connection that acquires and polls use is taken (as by hundreds of
    waiting threads' polls): a release still runs at once, on the connections kept for
    releases and withdrawals, and the waiter it hands the key to is granted. (In the
    replay at --speed 600 a release waited up to 82 s for a connection, holding the key
    or permit it was freeing.) Then the key is free in Redis."""
    client = redis.Redis(host=server.host, port=server.port)
    lane: Any = (RedisSessionLane(client, lease_s=5.0) if kind == "session"
                 else RedisLane(client, "g", max_concurrent=1, lease_s=5.0))
    assert lane.try_acquire("k")
    slots = lane._wk().slots
    taken = [slots.take() for _ in range(slots.n)]  # the general bound is exhausted
    try:
        done = threading.Event()
        result: list[bool] = []

        def release() -> None:
            result.append(lane.manual_release("k"))
            done.set()

        threading.Thread(target=release, daemon=True).start()
        assert done.wait(5.0), "the release waited for a connection held by acquires"
        assert result == [True]
    finally:
        for slot in taken:
            slots.give(slot)
    other = RedisSessionLane(client) if kind == "session" else RedisLane(
        client, "g", max_concurrent=1)
    assert not (other.is_held("k") if kind == "session" else other.holds_of("k"))


@pytest.mark.timeout(30)
@pytest.mark.parametrize("kind", ["session", "counting"])
def test_async_release_never_waits_behind_acquires_for_a_script_call(
    server: RedisServer, kind: str
) -> None:
    """The asyncio face: every permit of the general bound on script calls is taken (as
    by a backlog of waiting tasks' acquires and polls); a release still runs at once, on
    the bound kept for releases and withdrawals. Then the key is free in Redis."""
    from lanequeue.redis import AsyncRedisLane

    async def main() -> None:
        client = redis.asyncio.Redis(host=server.host, port=server.port)
        lane: Any = (AsyncRedisSessionLane(client, lease_s=5.0) if kind == "session"
                     else AsyncRedisLane(client, "g", max_concurrent=1, lease_s=5.0))
        assert await lane.try_acquire("k")
        slots = lane._wk().slots
        taken = 0
        while not slots.locked():  # the general bound is exhausted
            await slots.acquire()
            taken += 1
        try:
            released = await asyncio.wait_for(lane.manual_release("k"), 5.0)
        except (asyncio.TimeoutError, TimeoutError):
            raise AssertionError("the release waited behind acquires") from None
        finally:
            for _ in range(taken):
                slots.release()
        assert released is True
        if kind == "session":
            assert not await lane.is_held("k")
        else:
            assert await lane.holds_of("k") == 0
        await client.aclose()

    asyncio.run(main())


@pytest.mark.timeout(30)
def test_callers_waiting_for_a_permit_do_not_wake_while_they_wait() -> None:
    """50 threads wait for the one permit of a bound for 1 s: only the one at the door
    wakes (every HEAL_S, to heal lost permits); the others sleep until it is their turn.
    (Each waiter waking every HEAL_S made 900 waiting threads of one replay worker wake
    3,600 times a second.) Then each gets the permit in turn."""
    from lanequeue.redis._wake import Slots

    slots = Slots(1)
    held = slots.take()
    heals = [0]
    heal = slots._heal

    def counting_heal() -> None:
        heals[0] += 1
        heal()

    slots._heal = counting_heal  # type: ignore[method-assign]
    got: list[int] = []
    lock = threading.Lock()

    def taker(i: int) -> None:
        s = slots.take()
        with lock:
            got.append(i)
        slots.give(s)

    threads = [threading.Thread(target=taker, args=(i,), daemon=True) for i in range(50)]
    for t in threads:
        t.start()
    time.sleep(1.0)
    waking = heals[0]
    slots.give(held)
    for t in threads:
        t.join(10)
    assert sorted(got) == list(range(50))
    assert slots.free == 1
    # One waiter at a time wakes: about 1.0 / HEAL_S = 4 wake-ups, not 50 x 4.
    assert waking <= 2 * (1.0 / Slots.HEAL_S) + 2, waking


@pytest.mark.timeout(30)
def test_presence_ping_answered_during_a_late_wake_up_keeps_the_connection(
    server: RedisServer,
) -> None:
    """The presence thread's wait for a PONG times out, but the thread only runs again
    after the PONG arrived (it waited for the interpreter in a busy process): the PONG is
    read, the connection is not declared dead (declaring it so would end every hold
    granted under it: 40-51 holds at once in the replay at --speed 600). A connection that
    really stays silent is still declared dead."""
    from lanequeue.redis import _presence

    conn = redis.Connection(host=server.host, port=server.port)
    conn.connect()
    real = conn.can_read

    def late(timeout: float = 0) -> bool:
        if timeout > 0:  # the wait "times out"; the PONG arrives meanwhile
            time.sleep(timeout + 0.05)
            return False
        return bool(real(timeout=0))

    conn.can_read = late  # type: ignore[method-assign]
    _presence.Presence._ping(conn)  # no TimeoutError
    conn.can_read = real  # type: ignore[method-assign]
    assert conn.send_command("PING") is None and conn.read_response() in (b"PONG", "PONG")
    # A server that does not answer (frozen): declared dead after PONG_TIMEOUT_S.
    server.freeze()
    try:
        with pytest.raises(TimeoutError):
            _presence.Presence._ping(conn)
    finally:
        server.thaw()
    conn.disconnect()


# -- wire format and protocol version -------------------------------------------------


@pytest.mark.timeout(30)
@pytest.mark.parametrize("kind", ["session", "counting"])
def test_previous_wire_format_and_current_one_share_a_lane_safely(
    server: RedisServer, kind: str
) -> None:
    """The per-call reply envelope (a nonce in, ``{nonce, reply}`` out) changed the wire
    format, not the state kept in Redis: a client of the previous format runs the same
    script bodies, unwrapped, on the same keys. Meeting the current client on one lane,
    it never gets a key (or the last permit) the current one holds, and the reverse: no
    double grant, so the layout version (``lq2``) did not need a bump."""
    from lanequeue.redis._args import flag_reply, grant_reply
    from lanequeue.redis._wire import wrap

    client = redis.Redis(host=server.host, port=server.port)
    lane: Any = (RedisSessionLane(client, lease_s=5.0) if kind == "session"
                 else RedisLane(client, "g", max_concurrent=1, lease_s=5.0))
    k = lane._k
    bodies = {wrap(src): src for src in k._sources}

    def previous(call: Any) -> Any:  # the previous client: the body itself, no nonce
        script, keys, args = call
        return client.register_script(bodies[script.script])(keys=keys, args=args)

    assert lane.try_acquire("k")  # the current client holds
    old = "0123456789" + "ab" * 5  # an owner id of the previous client
    granted, _ = grant_reply(previous(k.acquire(old, "k", False, 4000, "")))
    assert not granted
    assert lane.manual_release("k")
    granted, token = grant_reply(previous(k.acquire(old, "k", False, 4000, "")))
    assert granted and token > 0  # the previous client holds now
    assert not lane.try_acquire("k")  # the current one is refused
    assert flag_reply(previous(k.release(old, token, "k"))) == 1
    assert lane.try_acquire("k")
    assert lane.manual_release("k")
