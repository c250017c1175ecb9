"""Interrupts (KeyboardInterrupt, async exceptions) and stale replies against a real
redis-server: an interrupted call never hands another call its reply, never leaks a
permit of the process's bound on calls in flight, and never leaves a lock held that
another thread waits for. Each interrupt is injected at a chosen point by a hook."""

from __future__ import annotations

import gc
import threading
import time
import warnings
from typing import Any

import pytest
import redis
from redis.connection import Connection

from lanequeue import LaneBackendError, LeaseLostError
from lanequeue.redis import RedisLane, RedisSessionLane, _wire
from lanequeue.redis._sync import _Turn
from lanequeue.redis._wake import Slots
from lanequeue.redis._wire import StaleReply, run_sync, unwrap, wrap

pytestmark = pytest.mark.timeout(30)


def test_a_reply_without_the_requests_nonce_is_refused(redis_client: Any) -> None:
    """A reply is this request's only if it carries this request's nonce: a bare integer
    (a release's 1) or another call's reply is a protocol error, never a grant."""
    script = redis_client.register_script(wrap("return tonumber(ARGV[1]) + 1"))
    assert run_sync(redis_client, script, [], [41]) == 42
    reply = script(keys=[], args=[1, "nonce-of-another-call"])
    with pytest.raises(StaleReply):
        unwrap(reply, "nonce-of-this-call")
    for stale in (1, 7, [0, -1], b"OK", None, [b"x", 1, 2]):
        with pytest.raises(StaleReply):
            unwrap(stale, "n")


@pytest.mark.parametrize("kind", [RedisSessionLane, RedisLane])
def test_a_pending_stale_reply_is_a_backend_error_and_grants_nothing(
    redis_client: Any, redis_prefix: str, monkeypatch: pytest.MonkeyPatch, kind: Any
) -> None:
    """An acquire that reads the unread reply of an earlier request on its connection (the
    crosstalk an interrupt between send and read leaves) raises LaneBackendError, holds
    nothing, and drops that connection; the next call works."""
    lane = kind(redis_client, "stale", prefix=redis_prefix, lease_s=2.0)
    assert lane.try_acquire("warm")
    assert lane.manual_release("warm")
    slots = lane._wk().slots
    conns = []
    for _ in range(slots.n):
        slot = slots.take()
        conns.append((slot, slot.conn))
    poisoned = conns[0][1]
    poisoned.send_command("INCR", f"{redis_prefix}:stray")  # reply ":1", never read
    while not poisoned.can_read(timeout=1.0):
        pass
    for slot, _ in conns:  # the poisoned connection is the next one used
        slots.give(slot)
    # Without the health check before a send, the stale reply is read by the next call.
    monkeypatch.setattr(_wire, "_ready", lambda conn: None)
    with pytest.raises(LaneBackendError, match="not this request"):
        lane.try_acquire("k")
    assert lane.active_count == 0
    assert poisoned._sock is None  # the connection was dropped
    # The grant the server made was passed on.
    assert (lane.holds_of("k") if kind is RedisLane else int(lane.is_held("k"))) == 0
    monkeypatch.undo()
    assert lane.try_acquire("k")  # the next call works
    assert lane.manual_release("k")


def test_interrupt_between_send_and_read_drops_the_connection(
    redis_client: Any, redis_prefix: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A KeyboardInterrupt after the acquire was sent and before its reply was read: the
    KeyboardInterrupt propagates, the connection is disconnected (its reply is never read
    by another call), the grant the server may have made is passed on, and another
    thread's release then reads its own reply (True), not the acquire's."""
    lane = RedisSessionLane(redis_client, prefix=redis_prefix, lease_s=2.0)
    other = RedisSessionLane(redis_client, prefix=redis_prefix, lease_s=2.0)
    assert other.try_acquire("held")
    assert lane.try_acquire("warm")  # first use checks the server: done before the hook
    assert lane.manual_release("warm")
    real = Connection.read_response
    armed = {"on": True}
    seen: list[Any] = []

    def read_response(self: Any, *a: Any, **kw: Any) -> Any:
        if armed["on"]:
            armed["on"] = False
            seen.append(self)
            raise KeyboardInterrupt  # the reply is on its way, unread
        return real(self, *a, **kw)

    monkeypatch.setattr(Connection, "read_response", read_response)
    with pytest.raises(KeyboardInterrupt):
        lane.try_acquire("k")
    assert seen and seen[0]._sock is None  # dropped, not reused
    box: dict[str, Any] = {}
    t = threading.Thread(target=lambda: box.update(ok=other.manual_release("held")))
    t.start()
    t.join(10)
    assert box == {"ok": True}
    assert not lane.is_held("k")  # the interrupted acquire left no holder behind
    assert lane.try_acquire("k")
    token = lane._holds["k"][0]().token
    assert token > 10**15  # a real fencing token (server µs), not a stray reply
    assert lane.manual_release("k")


def test_slots_heal_a_permit_lost_to_an_interrupt() -> None:
    """A permit dropped between take and give (an interrupt) is replaced once a caller has
    waited for one: also when a reference cycle (a traceback) keeps it alive."""
    slots = Slots(2)
    a = slots.take()
    b = slots.take()
    slots.give(a)
    del b  # lost: never given back
    got = [slots.take()]
    t0 = time.monotonic()
    got.append(slots.take())  # waits, then heals
    assert time.monotonic() - t0 < 5
    assert slots.free == 0
    for s in got:
        slots.give(s)
    assert slots.free == 2
    # Lost inside a cycle.
    slots = Slots(2)
    c = slots.take()
    d = slots.take()
    cycle: list[Any] = [d]
    cycle.append(cycle)
    del d, cycle
    slots.give(c)
    gc.disable()
    try:
        x = slots.take()
        y = slots.take()  # the heal runs the collector
    finally:
        gc.enable()
    slots.give(x)
    slots.give(y)
    assert slots.free == 2


def test_slots_bound_calls_in_flight() -> None:
    slots = Slots(1)
    s = slots.take()
    box: list[Any] = []
    t = threading.Thread(target=lambda: box.append(slots.take()))
    t.start()
    t.join(0.6)
    assert not box  # waits while the one permit is in use (and is not healed away)
    slots.give(s)
    t.join(5)
    assert len(box) == 1


def test_turn_set_twice_and_set_cut_short() -> None:
    """The same-key sequencer's event: a second set() does nothing (no 'release unlocked
    lock'), a set cut short after its flag still lets the successor on, and a wait
    honours its timeout."""
    t = _Turn()
    assert not t.wait(0.05)
    t.set()
    t.set()
    assert t.wait(0.05)
    assert t.wait(None)
    cut = _Turn()
    cut._set = True  # an interrupt between the flag and the lock's release
    assert cut.wait(1.0)


def test_sequencer_wait_honours_the_timeout(redis_client: Any, redis_prefix: str) -> None:
    """A same-key request whose predecessor's first script never answers (a frozen
    server) gives up at its own deadline, counted as a timeout, and joins no line."""
    lane = RedisSessionLane(redis_client, prefix=redis_prefix, lease_s=2.0)
    assert lane.try_acquire("warm")
    assert lane.manual_release("warm")
    stuck = lane._new_event()
    lane._join_turn("k", stuck)  # a predecessor that never answers
    t0 = time.monotonic()
    assert lane.acquire_timeout("k", 0.3) is False
    assert time.monotonic() - t0 < 3
    assert lane.stats.timeouts == 1
    assert lane.waiting_for("k") == 0
    lane._turn_done("k", stuck)
    assert lane.acquire_timeout("k", 1.0)
    assert lane.manual_release("k")


def test_client_with_redis_py_path_still_checks_the_nonce(redis_server: Any) -> None:
    """A single-connection client (no pool path of ours) still refuses a stale reply."""
    r = redis.Redis(host=redis_server.host, port=redis_server.port, single_connection_client=True)
    try:
        script = r.register_script(wrap("return 5"))
        assert run_sync(r, script, [], []) == 5
    finally:
        r.close()


@pytest.fixture
def own_server(tmp_path: Any) -> Any:
    from redis_server import RedisServer

    s = RedisServer(tmp_path)
    s.start()
    yield s
    s.stop()


def test_release_and_renew_work_under_oom(own_server: Any) -> None:
    """Under OOM (noeviction, used memory over maxmemory) the scripts that free or keep
    what is there (release, renewal) of both kinds still work; an acquire is refused
    with LaneBackendError."""
    r = redis.Redis(host=own_server.host, port=own_server.port)
    try:
        counting = RedisLane(r, "g", max_concurrent=2, lease_s=3.0)
        per_key = RedisSessionLane(r, lease_s=3.0)
        assert counting.try_acquire("a")
        assert per_key.try_acquire("a")
        for i in range(20):
            r.set(f"fill:{i}", "x" * 100_000)
        r.config_set("maxmemory-policy", "noeviction")
        r.config_set("maxmemory", r.info("memory")["used_memory"] - 500_000)
        with pytest.raises(LaneBackendError):
            counting.try_acquire("b")  # a new hold grows memory: refused
        for lane in (counting, per_key):
            hold = lane._holds["a"][0]()
            # A renewal now (the renewer's script, on its own connection).
            ok = lane._renew_io(lane._renew_call(hold), 2.0)
            assert ok == 1
            assert lane.manual_release("a")
            assert lane.leases_lost == 0
        assert r.zcard(counting._k._keys[0]) == 0
        assert not per_key.is_held("a")
    finally:
        r.config_set("maxmemory", 0)
        r.close()


def test_thread_face_runs_scripts_on_at_most_the_bound_of_own_connections(
    redis_server: Any, redis_prefix: str
) -> None:
    """The thread face's scripts run on at most min(8, pool size) connections of its own,
    whatever the number of threads, even on a pool that small."""
    pool = redis.ConnectionPool(host=redis_server.host, port=redis_server.port,
                                max_connections=3)
    r = redis.Redis(connection_pool=pool)
    try:
        lane = RedisSessionLane(r, prefix=redis_prefix, lease_s=2.0)
        errors: list[BaseException] = []

        def work(n: int) -> None:
            try:
                for i in range(5):
                    with lane.acquire(f"k{n}:{i}", timeout_s=5):
                        pass
            except BaseException as exc:  # pragma: no cover - reported below
                errors.append(exc)

        threads = [threading.Thread(target=work, args=(n,)) for n in range(12)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(20)
        assert errors == []
        slots = lane._wk().slots
        assert slots.n == 3
        conns = {id(ref().conn) for ref in slots._refs if ref() is not None}
        assert len(conns) <= 3
    finally:
        r.close()


def test_signal_wake_ups_are_taken_once() -> None:
    """A waiter's wake-up: taken once; a second set() before it is taken does nothing
    (no 'release unlocked lock'); take honours its timeout."""
    from lanequeue.redis._wake import Signal

    sig = Signal()
    assert not sig.take(0.01)
    sig.set()
    sig.set()
    assert sig.take(0.01)
    assert not sig.take(0.01)


@pytest.mark.parametrize("kind", [RedisSessionLane, RedisLane])
@pytest.mark.parametrize("when", ["before the send", "after the send"])
@pytest.mark.parametrize("form", ["with", "manual_release"])
def test_an_interrupted_release_keeps_the_hold_visible_and_releasable(
    redis_client: Any, redis_prefix: str, monkeypatch: pytest.MonkeyPatch,
    kind: Any, when: str, form: str,
) -> None:
    """A KeyboardInterrupt while a release is on the wire (before its script was sent, or
    after, with the reply unread): the KeyboardInterrupt propagates and the hold stays
    in the lane object, as an interrupted in-process release leaves it: shown by
    ``get_active()`` and ended by ``manual_release(key)``, never left held in Redis,
    unseen, for a whole lease. (Sent already, the server may have run the script: the
    ``manual_release`` then finds the hold gone: False, and the key is free all the
    same.)"""
    extra = {} if kind is RedisSessionLane else {"max_concurrent": 1}
    lane = kind(redis_client, "r", prefix=redis_prefix, lease_s=30.0, **extra)
    other = kind(redis.Redis(port=redis_client.connection_pool.connection_kwargs["port"]),
                 "r", prefix=redis_prefix, lease_s=30.0, **extra)
    real_send, real_read = Connection.send_command, Connection.read_response
    armed = {"on": False, "read": False}

    def send_command(self: Any, *args: Any, **kw: Any) -> Any:
        if armed["on"] and args[:1] in (("EVALSHA",), ("EVAL",)):  # the release script
            armed["on"] = False
            if when == "before the send":
                raise KeyboardInterrupt
            real_send(self, *args, **kw)
            armed["read"] = True  # its reply is the next read on this thread
            return None
        return real_send(self, *args, **kw)

    def read_response(self: Any, *a: Any, **kw: Any) -> Any:
        if armed["read"]:
            armed["read"] = False
            raise KeyboardInterrupt
        return real_read(self, *a, **kw)

    monkeypatch.setattr(Connection, "send_command", send_command)
    monkeypatch.setattr(Connection, "read_response", read_response)
    hold = lane.acquire("k")
    hold.__enter__()
    armed["on"] = True
    with pytest.raises(KeyboardInterrupt):
        if form == "with":
            hold.__exit__(None, None, None)
        else:
            lane.manual_release("k")
    assert not armed["on"] and not armed["read"], "the interrupt was not injected"
    assert "k" in lane.get_active() and hold.held
    if when == "before the send":
        assert lane.manual_release("k")
    else:
        # Sent, then the connection dropped unread: the server may have run the script
        # (the release then finds the hold gone: False, with a warning) or not (True).
        assert lane.manual_release("k") in (True, False)
    assert "k" not in lane.get_active() and not hold.held
    assert other.try_acquire("k")  # free lane-wide at once, not after the lease
    assert other.manual_release("k")


@pytest.mark.parametrize("kind", [RedisSessionLane, RedisLane])
def test_a_dropped_hold_freed_by_its_stopped_release_counts_as_released(
    redis_client: Any, redis_prefix: str, monkeypatch: pytest.MonkeyPatch, kind: Any,
) -> None:
    """A release stopped after its script ran (the reply unread: the server freed the
    key), then the hold object dropped: the renewer's release of the dropped hold finds
    it gone, and counts it in ``released`` (that stopped release freed it), never in
    ``unmatched_releases``: the books read ``acquired == released`` once the renewer has
    answered. It was counted unmatched (13 of 3,354 holds under a Ctrl-C storm)."""
    lane, other = _lanes(kind, redis_client, redis_prefix, "dr", lease_s=1.5)
    real_send, real_read = Connection.send_command, Connection.read_response
    armed = {"on": False, "read": False}
    me = threading.get_ident()  # (the renewer's thread reads replies too)

    def send_command(self: Any, *args: Any, **kw: Any) -> Any:
        if armed["on"] and threading.get_ident() == me and args[:1] in (
                ("EVALSHA",), ("EVAL",)):  # the release script
            armed["on"] = False
            real_send(self, *args, **kw)  # (connecting first: HELLO and its reply)
            armed["read"] = True  # its reply is the next read on this thread
            return None
        return real_send(self, *args, **kw)

    def read_response(self: Any, *a: Any, **kw: Any) -> Any:
        if armed["read"] and threading.get_ident() == me:
            armed["read"] = False
            real_read(self, *a, **kw)  # the script ran and answered: the key is free
            raise KeyboardInterrupt
        return real_read(self, *a, **kw)

    assert lane.try_acquire("warm") and lane.manual_release("warm")  # (scripts loaded)
    monkeypatch.setattr(Connection, "send_command", send_command)
    monkeypatch.setattr(Connection, "read_response", read_response)
    hold = lane.acquire("k")
    hold.__enter__()
    armed["on"] = True
    with pytest.warns(ResourceWarning, match="'k'"):
        with pytest.raises(KeyboardInterrupt):
            hold.__exit__(None, None, None)
        monkeypatch.undo()
        assert not armed["on"] and not armed["read"], "the interrupt was not injected"
        assert other.try_acquire("k")  # free: taken by another client meanwhile
        del hold
        gc.collect()
    deadline = time.monotonic() + 3.0
    while lane.stats.released + lane.stats.unmatched_releases < 2:
        assert time.monotonic() < deadline, "the renewer never answered for the hold"
        time.sleep(0.02)
    st = lane.stats
    assert (st.acquired, st.released, st.unmatched_releases, st.holders) == (2, 2, 0, 0)
    assert other.manual_release("k")  # the other client's hold was never touched


def _in_redis(lane: Any, key: str) -> bool:
    """``key`` held lane-wide (any process)."""
    return bool(lane.is_held(key)) if isinstance(lane, RedisSessionLane) else lane.holds_of(key) > 0


def _lanes(kind: Any, client: Any, prefix: str, name: str = "r",
           lease_s: float = 30.0) -> tuple[Any, Any]:
    """A lane of ``kind`` (one permit) on ``client`` with ``lease_s``, and the same lane
    through another client (another process's view; a 30 s lease)."""
    extra = {} if kind is RedisSessionLane else {"max_concurrent": 1}
    port = client.connection_pool.connection_kwargs["port"]
    return (kind(client, name, prefix=prefix, lease_s=lease_s, **extra),
            kind(redis.Redis(port=port), name, prefix=prefix, lease_s=30.0, **extra))


@pytest.mark.parametrize("kind", [RedisSessionLane, RedisLane])
@pytest.mark.parametrize("form", ["hold.release", "manual_release"])
def test_a_release_stopped_before_it_began_is_taken_over_by_the_next(
    redis_client: Any, redis_prefix: str, monkeypatch: pytest.MonkeyPatch,
    kind: Any, form: str,
) -> None:
    """A KeyboardInterrupt that lands after a release marked its hold RELEASING and
    before the release's own clean-up could run (the first instruction of ``_finish``, a
    point where CPython delivers signals): the hold is still shown by ``get_active()``,
    and ``manual_release(key)`` takes the stopped release over and ends it (it was
    renewed for ever, and no release could end it)."""
    from lanequeue.redis._protocol import RedisLaneBase

    lane, other = _lanes(kind, redis_client, redis_prefix)
    hold = lane.acquire("k")
    hold.__enter__()

    def stopped(self: Any, hold: Any, me: object) -> Any:
        raise KeyboardInterrupt  # as at the generator's first instruction
        yield  # (a generator, as _finish is)

    monkeypatch.setattr(RedisLaneBase, "_finish", stopped)
    with pytest.raises(KeyboardInterrupt):
        if form == "hold.release":
            hold.release()
        else:
            lane.manual_release("k")
    monkeypatch.undo()
    assert "k" in lane.get_active() and _in_redis(other, "k")
    assert lane.manual_release("k")
    assert "k" not in lane.get_active() and not hold.held
    assert other.try_acquire("k") and other.manual_release("k")  # free at once


@pytest.mark.parametrize("kind", [RedisSessionLane, RedisLane])
def test_an_interrupt_while_a_grant_is_recorded_passes_it_on(
    redis_client: Any, redis_prefix: str, monkeypatch: pytest.MonkeyPatch, kind: Any,
) -> None:
    """A KeyboardInterrupt inside the recording of a grant (making its registry entry):
    the hold is not HELD, nowhere in the registry, and the acquire's clean-up passes the
    grant on, so the key is free at once (it stayed held in Redis, unseen, for a lease)."""
    from lanequeue.redis import _lease

    lane, other = _lanes(kind, redis_client, redis_prefix)
    assert lane.try_acquire("warm") and lane.manual_release("warm")
    real = _lease.Kept.__init__
    armed = {"on": True}

    def init(self: Any, hold: Any) -> None:
        if armed["on"]:
            armed["on"] = False
            raise KeyboardInterrupt
        real(self, hold)

    monkeypatch.setattr(_lease.Kept, "__init__", init)
    with pytest.raises(KeyboardInterrupt):
        lane.try_acquire("k")
    monkeypatch.undo()
    assert not armed["on"]
    assert lane.get_active() == {} and lane.stats.holders == 0
    assert not _in_redis(other, "k")
    assert other.try_acquire("k") and other.manual_release("k")


def test_a_hold_lost_through_its_presence_is_still_released_in_redis(
    redis_client: Any, redis_prefix: str,
) -> None:
    """The presence connection dies (CLIENT KILL TYPE pubsub): the hold reads lost at
    once, by our own side, while the server still has it under its owner id. Leaving
    the block raises LeaseLostError and still sends the release (the script checks the
    owner), so the key is free at once, not after the presence grace."""
    from lanequeue import LeaseLostError

    lane, other = _lanes(RedisSessionLane, redis_client, redis_prefix)
    assert lane.try_acquire("warm") and lane.manual_release("warm")  # presence is up
    hold = lane.acquire("k")
    hold.__enter__()
    assert hold._presence is not None  # granted under the presence connection
    redis_client.client_kill_filter(_type="pubsub")
    deadline = time.monotonic() + 5
    while not hold.lost and time.monotonic() < deadline:
        time.sleep(0.01)
    assert hold.lost
    with pytest.raises(LeaseLostError, match="the server still had it, and this release "
                       "freed it there") as lost:  # (it used to say "nothing was released")
        hold.__exit__(None, None, None)
    assert "presence connection to the server died" in str(lost.value)  # the cause
    assert other.try_acquire("k"), "the key was not released in Redis"
    assert other.manual_release("k")


@pytest.mark.parametrize("kind", [RedisSessionLane, RedisLane])
def test_an_interrupt_after_the_grant_before_it_is_recorded_passes_it_on(
    redis_client: Any, redis_prefix: str, monkeypatch: pytest.MonkeyPatch, kind: Any,
) -> None:
    """A KeyboardInterrupt after the acquire script granted and before the grant was
    recorded (the hold still has token 0): the clean-up's withdraw answers the grant's
    token and the release goes out under that token, so the key is free at once and
    nothing is left in this lane object."""
    from lanequeue.redis._protocol import RedisLaneBase

    lane, other = _lanes(kind, redis_client, redis_prefix)
    assert lane.try_acquire("warm") and lane.manual_release("warm")

    def granted(self: Any, hold: Any, token: int, t0: float, kept: bool) -> bool:
        raise KeyboardInterrupt  # the grant came back; nothing recorded yet

    monkeypatch.setattr(RedisLaneBase, "_granted", granted)
    with pytest.raises(KeyboardInterrupt):
        lane.try_acquire("k")
    monkeypatch.undo()
    assert lane.get_active() == {} and lane.stats.holders == 0
    assert not _in_redis(other, "k")
    assert other.try_acquire("k") and other.manual_release("k")


def _interrupt_after_the_grant(monkeypatch: pytest.MonkeyPatch, kind: Any, where: str) -> None:
    """Arm one KeyboardInterrupt after an acquire's grant is recorded: ``"in take"`` as
    its renewer is started (inside ``_take``), ``"after take"`` once ``_take`` returned
    True (in ``_enter``, before ``__enter__`` returns)."""
    from lanequeue.redis._protocol import RedisLaneBase

    if where == "in take":
        def start_renewer(self: Any, needed: bool) -> None:
            monkeypatch.undo()
            raise KeyboardInterrupt  # the grant is recorded: HELD, in the registry

        monkeypatch.setattr(kind, "_start_renewer", start_renewer)
        return
    real = RedisLaneBase._enter

    def enter(self: Any, hold: Any) -> Any:
        monkeypatch.undo()
        yield from real(self, hold)
        assert hold.held
        raise KeyboardInterrupt  # _take returned True; __enter__ has not returned

    monkeypatch.setattr(RedisLaneBase, "_enter", enter)


@pytest.mark.parametrize("kind", [RedisSessionLane, RedisLane])
@pytest.mark.parametrize("where", ["in take", "after take"])
def test_an_acquire_interrupted_after_its_grant_leaves_the_hold_as_in_process(
    redis_client: Any, redis_prefix: str, monkeypatch: pytest.MonkeyPatch,
    kind: Any, where: str,
) -> None:
    """A KeyboardInterrupt after the grant of a ``with lane.acquire(key)`` was recorded
    (inside the acquire, or after it, before ``__enter__`` returns): as in process, the
    hold stays held while its object lives (the interrupt's traceback has it):
    ``get_active()`` shows it and ``manual_release(key)`` ends it."""
    lane, other = _lanes(kind, redis_client, redis_prefix)
    assert lane.try_acquire("warm") and lane.manual_release("warm")
    _interrupt_after_the_grant(monkeypatch, kind, where)
    try:
        with lane.acquire("k"):
            pytest.fail("the block ran")
    except KeyboardInterrupt as exc:
        interrupted: BaseException | None = exc
    assert "k" in lane.get_active() and lane.active_count == 1
    assert _in_redis(other, "k")
    assert lane.manual_release("k")
    assert lane.get_active() == {} and not _in_redis(other, "k")
    assert lane.stats.holders == 0 and lane.stats.unmatched_releases == 0
    del interrupted  # the traceback, and the hold object in it
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # released: dropping it now warns of nothing
        gc.collect()


@pytest.mark.parametrize("kind", [RedisSessionLane, RedisLane])
@pytest.mark.parametrize("where", ["in take", "after take"])
def test_an_interrupted_acquires_dropped_hold_is_released_by_the_renewer(
    redis_client: Any, redis_prefix: str, monkeypatch: pytest.MonkeyPatch,
    kind: Any, where: str,
) -> None:
    """The same interrupt, and the caller lets the hold object go (it never had it): as
    a dropped in-process hold returns its permit, a ``ResourceWarning`` names it and the
    lane object's renewer releases it at its next round (``lease_s/3``), not renewing it
    for a holder that is gone: another client gets the key long before the lease."""
    extra = {} if kind is RedisSessionLane else {"max_concurrent": 1}
    port = redis_client.connection_pool.connection_kwargs["port"]
    lane = kind(redis_client, "d", prefix=redis_prefix, lease_s=3.0, **extra)
    other = kind(redis.Redis(port=port), "d", prefix=redis_prefix, lease_s=3.0, **extra)
    assert lane.try_acquire("warm") and lane.manual_release("warm")
    _interrupt_after_the_grant(monkeypatch, kind, where)
    with pytest.warns(ResourceWarning, match="'k'"):
        with pytest.raises(KeyboardInterrupt), lane.acquire("k"):
            pytest.fail("the block ran")
        gc.collect()  # the hold object, kept by the traceback until now, is gone
    dropped = time.monotonic()
    assert other.acquire_timeout("k", 2.5)  # the 3 s lease would still run
    assert time.monotonic() - dropped < 2.5
    assert other.manual_release("k")
    assert lane.get_active() == {} and lane.stats.holders == 0


@pytest.mark.parametrize("kind", [RedisSessionLane, RedisLane])
@pytest.mark.parametrize("where", ["the watchdog told", "the renewer started"])
def test_an_interrupt_before_a_grants_duties_leaves_them_to_be_done(
    redis_client: Any, redis_prefix: str, monkeypatch: pytest.MonkeyPatch,
    kind: Any, where: str, caplog: pytest.LogCaptureFixture,
) -> None:
    """A KeyboardInterrupt after a grant was recorded, as the watchdog is told of its
    deadline or its renewer is started (the two duties that follow the record), leaves
    neither claimed and undone: the lane object's next hold is renewed past its lease
    (another client is refused its key), and its deadline is watched (its
    ``on_lease_lost`` is called at the deadline when its renewals stall, before the loss
    is logged). Both once failed for the object's whole life: the record claimed them
    before they were done."""
    from lanequeue.redis._lease import watchdog

    extra = {} if kind is RedisSessionLane else {"max_concurrent": 1}
    port = redis_client.connection_pool.connection_kwargs["port"]
    lost: list[str] = []
    logged_first: list[bool] = []

    def on_lost(hold: Any) -> None:
        logged_first.append(any("lost" in r.getMessage() for r in caplog.records))
        lost.append(hold.key)

    lane = kind(redis_client, "duty", prefix=redis_prefix, lease_s=1.0,
                on_lease_lost=on_lost, **extra)
    other = kind(redis.Redis(port=port), "duty", prefix=redis_prefix, lease_s=1.0, **extra)
    assert lane.try_acquire("warm") and lane.manual_release("warm")
    # Its renewer ends once idle for a lease; then the next grant must start one.
    deadline = time.monotonic() + 5.0
    while any(t.name == "lanequeue-renew-duty" for t in threading.enumerate()):
        assert time.monotonic() < deadline
        time.sleep(0.05)
    if where == "the watchdog told":
        def watch(lane: Any, at: float) -> None:
            monkeypatch.undo()
            raise KeyboardInterrupt

        monkeypatch.setattr(watchdog, "watch", watch)
    else:
        def start_renewer(self: Any, needed: bool) -> None:
            monkeypatch.undo()
            raise KeyboardInterrupt

        monkeypatch.setattr(kind, "_start_renewer", start_renewer)
    with pytest.raises(KeyboardInterrupt) as interrupted, lane.acquire("first"):
        pytest.fail("the block ran")
    assert lane.manual_release("first")  # (held while the traceback has the hold)
    del interrupted
    with lane.acquire("A") as hold:
        time.sleep(1.6)  # past the 1 s lease: only renewals keep it
        assert not hold.lost and lost == []
        assert not other.try_acquire("A")
    stalled = threading.Event()

    def stall(self: Any, calls: Any, wait: float) -> Any:
        stalled.wait(5.0)  # a renewer stuck on I/O: only the watchdog sees the deadline
        raise TimeoutError

    monkeypatch.setattr(kind, "_renew_many_io", stall)
    try:
        with pytest.raises(LeaseLostError), lane.acquire("B"):
            granted = time.monotonic()
            while not lost and time.monotonic() - granted < 3.0:
                time.sleep(0.01)
            assert lost == ["B"] and time.monotonic() - granted < 1.5
            assert logged_first == [False]
    finally:
        stalled.set()


@pytest.mark.parametrize("kind", [RedisSessionLane, RedisLane])
def test_an_owned_acquire_interrupted_after_its_grant_stays_with_the_lane(
    redis_client: Any, redis_prefix: str, monkeypatch: pytest.MonkeyPatch, kind: Any,
) -> None:
    """``acquire_timeout`` (the lane object owns the hold: no hold object to drop)
    interrupted after its grant was recorded: the hold stays held, renewed, shown by
    ``get_active()``, until ``manual_release(key)`` ends it."""
    lane, other = _lanes(kind, redis_client, redis_prefix)
    assert lane.try_acquire("warm") and lane.manual_release("warm")
    _interrupt_after_the_grant(monkeypatch, kind, "in take")
    with pytest.raises(KeyboardInterrupt):
        lane.acquire_timeout("k", 5.0)
    gc.collect()
    assert "k" in lane.get_active() and _in_redis(other, "k")
    assert lane.manual_release("k")
    assert lane.get_active() == {} and not _in_redis(other, "k")


class _SecondInterrupt(BaseException):
    """What the test's SIGINT handler raises: a second Ctrl-C (not an Exception, as
    KeyboardInterrupt is not; one of our own, so that one arriving late cannot end the
    test session)."""


@pytest.mark.parametrize("kind", [RedisSessionLane, RedisLane])
def test_a_second_interrupt_during_the_clean_up_leaves_no_grant_in_redis(
    redis_client: Any, redis_prefix: str, monkeypatch: pytest.MonkeyPatch, kind: Any,
) -> None:
    """Ctrl-C twice: a first KeyboardInterrupt after the acquire script granted, before
    the grant was recorded (its clean-up must withdraw and pass the grant on), and a
    second one (a real SIGINT) while that clean-up's withdraw is on its way. The second
    ends the caller's wait for the clean-up, not the clean-up: the key is free in Redis
    soon after, not held for the whole lease by nobody (the clean-up ran in the caller,
    and the second interrupt cut it short: key held 30 s, ``get_active()`` empty,
    ``manual_release`` False)."""
    import signal

    from lanequeue.redis._protocol import RedisLaneBase

    main = threading.main_thread()
    assert threading.current_thread() is main  # (the SIGINT goes to this thread)
    lane, other = _lanes(kind, redis_client, redis_prefix)
    assert lane.try_acquire("warm") and lane.manual_release("warm")
    real_withdraw = RedisLaneBase._withdraw_call
    sent = threading.Event()

    def granted(self: Any, hold: Any, token: int, t0: float, kept: bool) -> bool:
        raise KeyboardInterrupt  # the first: the grant came back, nothing recorded yet

    def withdraw_call(self: Any, hold: Any, *owner: Any) -> Any:
        if threading.current_thread() is main:  # the clean-up runs in the caller: the
            sent.set()  # second Ctrl-C lands in it
            raise _SecondInterrupt
        if not sent.is_set():  # in a clean-up thread: the second Ctrl-C reaches the
            sent.set()  # caller now, while it waits for the clean-up
            signal.pthread_kill(main.ident or 0, signal.SIGINT)
            time.sleep(0.1)  # the withdraw goes out after the caller was interrupted
        return real_withdraw(self, hold, *owner)

    def on_sigint(signum: int, frame: Any) -> None:
        raise _SecondInterrupt

    previous = signal.signal(signal.SIGINT, on_sigint)
    try:
        monkeypatch.setattr(RedisLaneBase, "_granted", granted)
        monkeypatch.setattr(RedisLaneBase, "_withdraw_call", withdraw_call)
        with pytest.raises(_SecondInterrupt):
            lane.try_acquire("k")
        assert sent.is_set()  # the second interrupt came while the clean-up ran
    finally:
        signal.signal(signal.SIGINT, previous)
    deadline = time.monotonic() + 5.0
    while _in_redis(other, "k") and time.monotonic() < deadline:
        time.sleep(0.01)
    monkeypatch.undo()
    assert not _in_redis(other, "k")  # passed on by the clean-up, not left for 30 s
    assert lane.get_active() == {} and lane.stats.holders == 0
    assert lane.stats.cancelled == 1  # counted once, although its wait was cut short
    assert other.try_acquire("k") and other.manual_release("k")


@pytest.mark.parametrize("kind", [RedisSessionLane, RedisLane])
def test_the_clean_up_service_is_started_before_an_interrupt_needs_it(
    redis_client: Any, redis_prefix: str, monkeypatch: pytest.MonkeyPatch, kind: Any,
) -> None:
    """The clean-up service is made by a lane object's first call, never on an
    interrupt's path: starting a thread waits until it runs (milliseconds on a busy
    machine), and a second Ctrl-C in that wait stopped the clean-up (made lazily there,
    it left the grant in Redis for a whole lease)."""
    from lanequeue.redis import _sync
    from lanequeue.redis._protocol import RedisLaneBase

    monkeypatch.setattr(_sync, "_cleanups", None)  # a process that has made none yet
    lane, other = _lanes(kind, redis_client, redis_prefix)
    before = {t.ident for t in threading.enumerate()}
    assert lane.try_acquire("warm") and lane.manual_release("warm")  # its first call
    assert _sync._cleanups is not None
    # Its first worker too: a process out of threads when a clean-up comes would leave
    # it queued, and the grant in Redis for a lease.
    deadline = time.monotonic() + 5.0
    while not any(t.name == "lanequeue-redis-cleanup_0" and t.ident not in before
                  for t in threading.enumerate()) and time.monotonic() < deadline:
        time.sleep(0.01)
    assert any(t.name == "lanequeue-redis-cleanup_0" and t.ident not in before
               for t in threading.enumerate())
    started: list[str] = []

    caller = threading.current_thread()

    def start(self: threading.Thread) -> None:
        if threading.current_thread() is not caller:  # (the service starts its workers)
            return _REAL_START(self)
        started.append(self.name)
        raise _SecondInterrupt  # a second Ctrl-C while a thread starts

    def granted(self: Any, hold: Any, token: int, t0: float, kept: bool) -> bool:
        raise KeyboardInterrupt  # the first: the grant came back, nothing recorded yet

    monkeypatch.setattr(RedisLaneBase, "_granted", granted)
    monkeypatch.setattr(threading.Thread, "start", start)
    with pytest.raises(KeyboardInterrupt):
        lane.try_acquire("k")
    monkeypatch.setattr(threading.Thread, "start", _REAL_START)
    assert started == []  # no thread was started on the interrupt's path
    deadline = time.monotonic() + 5.0
    while _in_redis(other, "k") and time.monotonic() < deadline:
        time.sleep(0.01)
    assert not _in_redis(other, "k") and lane.get_active() == {}


_REAL_START = threading.Thread.start


@pytest.mark.parametrize("stop", ["before_the_release", "steps_closed", "as_the_release_starts",
                                  "in_the_release"])
def test_an_acquire_all_stopped_while_it_releases_keeps_its_holds_listed(
    redis_client: Any, redis_prefix: str, monkeypatch: pytest.MonkeyPatch, stop: str,
) -> None:
    """``acquire_all`` over two Redis lanes: its release pass is stopped between handing
    a hold to the face and the face's release of it (a KeyboardInterrupt there; or the
    pass's steps closed, as when the interrupt drops them). Both holds stay listed and
    held, and ``release()`` again ends them (the hold handed out used to be off the
    list already: no release could end it, and it was renewed for as long as its holder
    kept it; the closed steps went on, and Python reported "generator ignored
    GeneratorExit")."""
    import sys

    from lanequeue import LaneQueue
    from lanequeue import queue as queue_module
    from lanequeue.redis import RedisBackend

    queue = LaneQueue()
    backend = RedisBackend(redis_client, prefix=redis_prefix, lease_s=30.0)
    session = queue.add_session_lane("s", backend=backend)
    permits = queue.add_lane("g", max_concurrent=1, backend=backend)
    multi = queue.acquire_all("k", ["s", "g"], timeout_s=5)
    multi.__enter__()
    unraisable: list[Any] = []
    monkeypatch.setattr(sys, "unraisablehook", unraisable.append)
    if stop == "before_the_release":
        def interrupted(release: Any) -> None:
            raise KeyboardInterrupt  # (at the call's check, before the release began)

        with monkeypatch.context() as patched:
            patched.setattr(queue_module, "_caught", interrupted)
            with pytest.raises(KeyboardInterrupt):
                multi.__exit__(None, None, None)
    elif stop == "in_the_release":
        from lanequeue.redis._protocol import RedisLaneBase

        def stopped(self: Any, hold: Any, me: object) -> Any:
            raise KeyboardInterrupt  # marked RELEASING, its clean-up not begun
            yield  # (a generator, as _finish is)

        with monkeypatch.context() as patched:
            patched.setattr(RedisLaneBase, "_finish", stopped)
            with pytest.raises(KeyboardInterrupt):
                multi.__exit__(None, None, None)
        assert not multi.holds[-1].held  # RELEASING: not held, not ended either
    elif stop == "as_the_release_starts":
        from lanequeue.redis._sync import RedisHold

        def release(self: Any) -> bool:
            raise KeyboardInterrupt  # (at the call's first instruction: nothing done)

        with monkeypatch.context() as patched:
            patched.setattr(RedisHold, "release", release)
            with pytest.raises(KeyboardInterrupt):
                multi.__exit__(None, None, None)
    else:
        steps = multi._releasing(None)
        handed = next(steps)
        assert handed.held
        steps.close()
    gc.collect()
    assert unraisable == []
    assert [h.lane.name for h in multi.holds] == ["s", "g"]
    assert session.is_held("k") and permits.holds_of("k") == 1
    multi.release()
    assert multi.holds == [] and not session.is_held("k") and permits.holds_of("k") == 0
