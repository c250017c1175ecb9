"""The Redis thread lanes against a real redis-server: surface, defaults, errors, FIFO,
caps, leases, fencing tokens, clean-up of every key.

Interleavings are driven by what Redis says (``waiting_for``, ``holds_of``) and by events,
not by sleeps; the only sleeps wait for leases or liveness windows to run out on purpose.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import re
import threading
import time
from typing import Any

import pytest
import redis
import redis.asyncio
from redis.backoff import NoBackoff
from redis.crc import key_slot
from redis.retry import Retry

import lanequeue.redis
from lanequeue import (
    DEFAULT_MAX_CONCURRENT,
    DEFAULT_MAX_SESSIONS,
    DEFAULT_TIMEOUT_S,
    LaneBackendError,
    LaneTimeoutError,
    LeaseLostError,
    NotOwnerError,
)
from lanequeue.redis import RedisBackend, RedisHold, RedisLane, RedisSessionLane
from lanequeue.redis._wire import run_sync


def wait_until(pred: Any, timeout: float = 5.0, step: float = 0.005) -> None:
    deadline = time.monotonic() + timeout
    while not pred():
        if time.monotonic() > deadline:
            raise AssertionError("condition not reached in time")
        time.sleep(step)


def lane_keys(client: redis.Redis, prefix: str) -> list[bytes]:
    return sorted(client.scan_iter(match=f"{{lq2:*:{prefix}:*"))


# -- surface and defaults ------------------------------------------------------------------


def test_defaults_mirror_the_in_process_twins(redis_client: redis.Redis) -> None:
    s = RedisSessionLane(redis_client)
    c = RedisLane(redis_client, "global")
    assert s.name == "session" and s.timeout_s == DEFAULT_TIMEOUT_S
    assert s.max_sessions == DEFAULT_MAX_SESSIONS and s.lease_s == 30.0
    assert s.prefix == "lanequeue" and c.prefix == "lanequeue"
    assert c.max_concurrent == DEFAULT_MAX_CONCURRENT and c.timeout_s == DEFAULT_TIMEOUT_S
    for lane in (s, c):
        for attr in ("acquire", "try_acquire", "acquire_timeout", "manual_release",
                     "_raw_acquire", "_raw_release", "get_active", "status", "statistics"):
            assert callable(getattr(lane, attr)), attr
        assert lane.stats.acquired == 0
    assert s.session_count == 0 and s.cleanup_idle() == 0


@pytest.mark.parametrize(
    ("kwargs", "exc"),
    [
        ({"name": "a:b"}, ValueError),
        ({"name": "a{b"}, ValueError),
        ({"name": ""}, ValueError),
        ({"prefix": "x{"}, ValueError),
        ({"prefix": 3}, TypeError),
        ({"lease_s": 0}, ValueError),
        ({"lease_s": float("inf")}, ValueError),
        ({"lease_s": "1"}, TypeError),
        ({"timeout_s": -1}, ValueError),
        ({"on_lease_lost": 5}, TypeError),
    ],
)
def test_bad_arguments_raise_at_construction(
    redis_client: redis.Redis, kwargs: dict[str, Any], exc: type[Exception]
) -> None:
    """Every error of a constructor names the public class and the argument (README)."""
    (arg,) = kwargs
    for lane_type in (RedisSessionLane, RedisLane):
        with pytest.raises(exc, match=rf"^{lane_type.__name__}\(\) argument '{arg}' "):
            lane_type(redis_client, **{"name": "x", **kwargs})
    if arg in ("prefix", "lease_s", "on_lease_lost"):
        with pytest.raises(exc, match=rf"^RedisBackend\(\) argument '{arg}' "):
            RedisBackend(redis_client, **kwargs)


@pytest.mark.parametrize(("lane_type", "kwargs", "arg"), [
    ("RedisLane", {"max_concurrent": 0}, "max_concurrent"),
    ("AsyncRedisLane", {"max_concurrent": "2"}, "max_concurrent"),
    ("RedisSessionLane", {"max_sessions": 0}, "max_sessions"),
    ("AsyncRedisSessionLane", {"idle_timeout_s": -1}, "idle_timeout_s"),
    ("AsyncRedisLane", {"warn_after_s": float("nan")}, "warn_after_s"),
    ("RedisSessionLane", {"on_wait": 5}, "on_wait"),
])
def test_constructor_errors_name_the_public_class(
    redis_client: redis.Redis, lane_type: str, kwargs: dict[str, Any], arg: str,
) -> None:
    """A Redis lane's constructor error names the public class and the
    argument, as the in-process lanes' do; so do Python's own errors for a missing or
    unknown argument (each public class has its own copy of the inherited methods)."""
    cls = getattr(lanequeue.redis, lane_type)
    client: Any = redis.asyncio.Redis() if lane_type.startswith("Async") else redis_client
    with pytest.raises((TypeError, ValueError), match=rf"^{lane_type}\(\) argument '{arg}' "):
        cls(client, "x", **kwargs)
    with pytest.raises(TypeError, match=rf"^{lane_type}\(\) argument 'client' must be"):
        cls(None, "x")
    with pytest.raises(TypeError, match=rf"^{lane_type}\.__init__\(\) got an unexpected "):
        cls(client, "x", bogus=1)
    if lane_type == "RedisLane":
        with pytest.raises(TypeError, match=r"^RedisLane\.__init__\(\) missing 1 required "
                                            r"positional argument: 'name'"):
            cls(client)
        with pytest.raises(TypeError, match=r"^RedisLane\.acquire_timeout\(\) got an "
                                            r"unexpected keyword argument 'bogus'"):
            cls(client, "x").acquire_timeout("k", 0, bogus=0)


@pytest.mark.parametrize("cap", [2**53 + 1, 2**60 + 1, 10**30])
def test_a_cap_redis_scripts_cannot_hold_exactly_is_refused(
    redis_client: redis.Redis, cap: int
) -> None:
    """Redis scripts hold numbers as doubles, exact up to 2**53: a larger
    ``max_concurrent`` would be reported (and enforced) as another cap. It is refused at
    the call with a ValueError naming the argument, on both faces and through a backend;
    nothing is sent to Redis."""
    before = redis_client.dbsize()
    with pytest.raises(ValueError, match=r"^RedisLane\(\) argument 'max_concurrent' must be "
                                         r"at most 2\*\*53"):
        RedisLane(redis_client, "x", max_concurrent=cap)
    with pytest.raises(ValueError, match=r"^AsyncRedisLane\(\) argument 'max_concurrent'"):
        lanequeue.redis.AsyncRedisLane(redis.asyncio.Redis(), "x", max_concurrent=cap)
    with pytest.raises(ValueError, match=r"^LaneQueue\.add_lane\(\) argument 'max_concurrent'"):
        lanequeue.LaneQueue().add_lane("x", max_concurrent=cap,
                                       backend=RedisBackend(redis_client))
    assert redis_client.dbsize() == before


def test_the_largest_cap_redis_scripts_hold_is_exact(
    redis_client: redis.Redis, redis_prefix: str
) -> None:
    """At 2**53, the largest accepted cap, the lane-wide figures read back exactly."""
    cap = 2**53
    lane = RedisLane(redis_client, "huge", max_concurrent=cap, prefix=redis_prefix)
    assert lane.try_acquire("a") and lane.try_acquire("b")
    st = lane.lane_status()
    assert (st["max_concurrent"], st["available"], st["active"]) == (cap, cap - 2, 2)
    assert lane.available == cap - 2
    assert lane.manual_release("a") and lane.manual_release("b")


def test_bad_keys_raise_at_the_call(redis_client: redis.Redis, redis_prefix: str) -> None:
    lane = RedisSessionLane(redis_client, prefix=redis_prefix)
    with pytest.raises(TypeError):
        lane.acquire(3)  # type: ignore[arg-type]
    with pytest.raises(ValueError):
        lane.try_acquire("")
    with pytest.raises(ValueError):
        lane.acquire_timeout("k", -1)


# -- per-key lane --------------------------------------------------------------------------


def test_session_acquire_release_and_no_key_left(
    redis_client: redis.Redis, redis_prefix: str
) -> None:
    lane = RedisSessionLane(redis_client, prefix=redis_prefix, lease_s=0.5)
    other = RedisSessionLane(redis_client, prefix=redis_prefix, lease_s=0.5)
    with lane.acquire("k") as hold:
        assert isinstance(hold, RedisHold) and hold.held
        assert hold.fencing_token == hold.token > 0
        assert lane.is_held("k") and not lane.is_held("other")
        assert not other.try_acquire("k")  # held in "another process"
        assert other.try_acquire("k2")  # other keys run in parallel
        assert other.manual_release("k2")
        assert lane.active_count == 1 and lane.get_active().keys() == {"k"}
        # Every key of the lane carries a TTL.
        keys = lane_keys(redis_client, redis_prefix)
        assert keys and all(redis_client.pttl(k) > 0 for k in keys)
    assert not hold.held
    with pytest.raises(NotOwnerError):
        hold.release()  # second release: not this caller's any more
    assert not lane.is_held("k") and lane.active_count == 0
    # After the leases (and the fence counter's TTL) run out, nothing of the lane is left.
    wait_until(lambda: not lane_keys(redis_client, redis_prefix), timeout=3)
    assert lane.stats.acquired == 1 and lane.stats.released == 1


def test_session_timeout_raises_and_leaves_no_waiter(
    redis_client: redis.Redis, redis_prefix: str
) -> None:
    a = RedisSessionLane(redis_client, prefix=redis_prefix)
    b = RedisSessionLane(redis_client, prefix=redis_prefix, timeout_s=0.05)
    assert a.try_acquire("k")
    with pytest.raises(LaneTimeoutError) as info, b.acquire("k"):
        pass
    assert isinstance(info.value, TimeoutError)
    assert info.value.lane == "session" and info.value.key == "k"
    assert not b.acquire_timeout("k", 0.05)
    assert not b.try_acquire("k")
    assert b.waiting_for("k") == 0 and b.waiting == 0
    st = b.stats
    assert st.timeouts == 2 and st.rejected == 1 and st.acquired == 0
    assert a.manual_release("k")
    assert b.try_acquire("k") and b.manual_release("k")


def test_session_fifo_across_lane_objects(redis_client: redis.Redis, redis_prefix: str) -> None:
    """C09 on Redis: W1..W5 queue in that order (each known to be in line before the
    next arrives), each with its own lane object (its own 'process'); they get the key in
    that order, and fencing tokens grow in that order."""
    holder = RedisSessionLane(redis_client, prefix=redis_prefix)
    assert holder.try_acquire("k")
    order: list[tuple[int, int]] = []
    threads = []
    for i in range(5):
        lane = RedisSessionLane(redis_client, prefix=redis_prefix)

        def run(i: int = i, lane: RedisSessionLane = lane) -> None:
            with lane.acquire("k", timeout_s=10) as h:
                order.append((i, h.fencing_token))

        t = threading.Thread(target=run)
        t.start()
        threads.append(t)
        wait_until(lambda n=i + 1: holder.waiting_for("k") == n)
    assert holder.manual_release("k")
    for t in threads:
        t.join(10)
    assert [i for i, _ in order] == [0, 1, 2, 3, 4]
    fences = [f for _, f in order]
    assert fences == sorted(fences) and len(set(fences)) == 5


def test_newcomer_never_overtakes_the_line(redis_client: redis.Redis, redis_prefix: str) -> None:
    """A release hands the key to the head waiter in the same script: a try_acquire right
    after the release finds the key held (by the waiter), never free."""
    a = RedisSessionLane(redis_client, prefix=redis_prefix)
    w = RedisSessionLane(redis_client, prefix=redis_prefix)
    n = RedisSessionLane(redis_client, prefix=redis_prefix)
    for _ in range(20):
        assert a.try_acquire("k")
        got, leave = threading.Event(), threading.Event()

        def run(got: threading.Event = got, leave: threading.Event = leave) -> None:
            with w.acquire("k", timeout_s=10):
                got.set()
                leave.wait(10)  # hold until the newcomer has tried

        t = threading.Thread(target=run)
        t.start()
        wait_until(lambda: a.waiting_for("k") == 1)
        assert a.manual_release("k")
        assert not n.try_acquire("k")  # the waiter's claim (or hold), never a free key
        leave.set()
        t.join(10)
        assert got.is_set()
    assert n.stats.acquired == 0 and n.stats.rejected == 20


def test_fencing_tokens_grow_across_grants_and_expiry(
    redis_client: redis.Redis, redis_prefix: str
) -> None:
    lane = RedisSessionLane(redis_client, prefix=redis_prefix, lease_s=0.2)
    tokens = []
    for _ in range(5):
        with lane.acquire("k") as h:
            tokens.append(h.fencing_token)
    # Let every key of the lane expire, fence counter included; tokens still grow.
    wait_until(lambda: not lane_keys(redis_client, redis_prefix), timeout=3)
    with lane.acquire("k") as h:
        tokens.append(h.fencing_token)
    assert tokens == sorted(tokens) and len(set(tokens)) == len(tokens)


def test_interrupted_waiter_leaves_no_ghost(
    redis_client: redis.Redis, redis_prefix: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """C08 on Redis: T1's wait is interrupted (KeyboardInterrupt in its blocking wait);
    T1 holds nothing, the line is empty, and T2 acquires at once after T0 releases."""
    t0 = RedisSessionLane(redis_client, prefix=redis_prefix)
    t1 = RedisSessionLane(redis_client, prefix=redis_prefix)
    assert t0.try_acquire("k")

    def interrupted_wait(*args: Any, **kwargs: Any) -> Any:
        raise KeyboardInterrupt

    monkeypatch.setattr(t1, "_wait_wake", interrupted_wait)
    with pytest.raises(KeyboardInterrupt):
        t1.acquire_timeout("k", 5)
    assert t0.waiting_for("k") == 0 and t1.waiting == 0 and t1.active_count == 0
    assert t1.stats.cancelled == 1
    assert t0.manual_release("k")
    t2 = RedisSessionLane(redis_client, prefix=redis_prefix)
    assert t2.try_acquire("k")
    assert t2.manual_release("k")


@pytest.mark.filterwarnings(  # the ghost's hold: made by hand, never entered
    "ignore:.*garbage-collected without being entered:RuntimeWarning")
def test_dead_waiter_is_skipped(redis_client: redis.Redis, redis_prefix: str) -> None:
    """A waiter that stops refreshing its liveness (its process died) is skipped by the
    hand-off once its liveness window has passed: it costs the next waiter nothing."""
    holder = RedisSessionLane(redis_client, prefix=redis_prefix, lease_s=0.3)
    ghost = RedisSessionLane(redis_client, prefix=redis_prefix, lease_s=0.3)
    assert holder.try_acquire("k")
    # The ghost joins the line once and never polls again (a crashed waiter).
    h = RedisHold(ghost, "k", 5.0)
    script, keys, args = ghost._acquire_call(h, True)
    assert run_sync(redis_client, script, keys, args)[0] == 0  # in line, not granted
    assert holder.waiting_for("k") == 1
    time.sleep(ghost._live_ms / 1000 + 0.05)  # its liveness ran out
    assert holder.waiting_for("k") == 0
    assert holder.manual_release("k")
    live = RedisSessionLane(redis_client, prefix=redis_prefix, lease_s=0.3)
    t = time.monotonic()
    assert live.acquire_timeout("k", 5)
    assert time.monotonic() - t < 0.5  # not the ghost's claim window (1.3 s)
    assert live.manual_release("k")


def test_keys_of_one_session_key_share_a_slot(
    redis_client: redis.Redis, redis_prefix: str
) -> None:
    holder = RedisSessionLane(redis_client, prefix=redis_prefix)
    waiter = RedisSessionLane(redis_client, prefix=redis_prefix)
    assert holder.try_acquire("gateway:slack:c1:u1")
    box: dict[str, bool] = {}
    t = threading.Thread(
        target=lambda: box.setdefault("ok", waiter.acquire_timeout("gateway:slack:c1:u1", 5))
    )
    t.start()
    wait_until(lambda: holder.waiting_for("gateway:slack:c1:u1") == 1)
    # Hand-off pushes a signal key derived inside the script: same slot as the rest.
    assert holder.manual_release("gateway:slack:c1:u1")
    t.join(5)
    assert box["ok"]
    keys = lane_keys(redis_client, redis_prefix)
    assert len(keys) >= 2
    assert len({key_slot(k) for k in keys}) == 1
    assert waiter.manual_release("gateway:slack:c1:u1")


# -- counting lane -------------------------------------------------------------------------


def test_counting_lane_cap_and_lane_wide_views(
    redis_client: redis.Redis, redis_prefix: str
) -> None:
    a = RedisLane(redis_client, "g", max_concurrent=2, prefix=redis_prefix)
    b = RedisLane(redis_client, "g", max_concurrent=2, prefix=redis_prefix)
    assert a.try_acquire("x") and b.try_acquire("x")
    assert not a.try_acquire("y")  # full, lane-wide
    # C06: same key twice on a counting lane: both tracked, lane-wide.
    wide = a.lane_status()
    assert wide["active"] == 2 and wide["available"] == 0 and a.holds_of("x") == 2
    assert set(wide["keys"]) == {"x"}
    # The plain views describe each lane object (each holds one).
    assert a.active_count == b.active_count == 1 and a.available == 1
    assert b.manual_release("x")
    assert a.lane_status()["active"] == 1 and a.holds_of("x") == 1
    assert "x" in a.get_active() and b.get_active() == {}
    # C05: a release of nothing is refused and never raises capacity.
    assert not b.manual_release("x")
    assert a.lane_status()["available"] == 1
    assert b.try_acquire("z")
    assert not b.try_acquire("z2")
    wide = a.lane_status()
    assert wide["active"] == 2 and wide["available"] == 0 and wide["max_concurrent"] == 2
    assert a.status()["active"] == 1 and a.status()["max_concurrent"] == 2
    assert a.manual_release("x") and b.manual_release("z")
    assert a.lane_status()["available"] == 2


def test_counting_lane_never_over_cap_and_fifo(
    redis_client: redis.Redis, redis_prefix: str
) -> None:
    cap = 3
    lanes = [RedisLane(redis_client, "g", max_concurrent=cap, prefix=redis_prefix)
             for _ in range(4)]
    inside = 0
    peak = 0
    lock = threading.Lock()
    errors: list[BaseException] = []

    def worker(i: int) -> None:
        lane = lanes[i % len(lanes)]
        nonlocal inside, peak
        try:
            for j in range(40):
                with lane.acquire(f"k{i}-{j % 3}", timeout_s=20):
                    with lock:
                        inside += 1
                        peak = max(peak, inside)
                    time.sleep(0.005)  # longer than a hand-off, so the cap fills
                    with lock:
                        inside -= 1
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(10)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not errors
    assert peak == cap
    assert sum(x.stats.acquired for x in lanes) == 400
    assert sum(x.stats.released for x in lanes) == 400
    assert lanes[0].active_count == 0 and lanes[0].waiting == 0


def test_counting_lane_fifo_order(redis_client: redis.Redis, redis_prefix: str) -> None:
    holder = RedisLane(redis_client, "g", max_concurrent=1, prefix=redis_prefix)
    assert holder.try_acquire("h")
    order: list[int] = []
    threads = []
    for i in range(4):
        lane = RedisLane(redis_client, "g", max_concurrent=1, prefix=redis_prefix)

        def run(i: int = i, lane: RedisLane = lane) -> None:
            with lane.acquire(f"key{i}", timeout_s=10):
                order.append(i)

        t = threading.Thread(target=run)
        t.start()
        threads.append(t)
        wait_until(lambda n=i + 1: holder.lane_status()["waiting"] == n)
    assert holder.manual_release("h")
    for t in threads:
        t.join(10)
    assert order == [0, 1, 2, 3]


# -- leases --------------------------------------------------------------------------------


@pytest.mark.parametrize("kind", ["session", "counting"])
def test_renewal_keeps_a_long_hold(redis_client: redis.Redis, redis_prefix: str,
                                   kind: str) -> None:
    def make() -> RedisSessionLane | RedisLane:
        if kind == "session":
            return RedisSessionLane(redis_client, prefix=redis_prefix, lease_s=0.5)
        return RedisLane(redis_client, "g", max_concurrent=1, prefix=redis_prefix,
                         lease_s=0.5)

    lane, other = make(), make()
    with lane.acquire("k") as hold:
        end = time.monotonic() + 1.5  # three leases
        while time.monotonic() < end:
            assert not other.try_acquire("k")
            time.sleep(0.05)
        assert hold.held
    assert other.try_acquire("k") and other.manual_release("k")


@pytest.mark.parametrize("kind", ["session", "counting"])
def test_lost_lease_is_told(redis_client: redis.Redis, redis_prefix: str, kind: str,
                            caplog: pytest.LogCaptureFixture) -> None:
    lost: list[Any] = []
    kw: dict[str, Any] = {"prefix": redis_prefix, "lease_s": 0.3, "on_lease_lost": lost.append}
    lane: RedisSessionLane | RedisLane
    if kind == "session":
        lane = RedisSessionLane(redis_client, **kw)
    else:
        lane = RedisLane(redis_client, "g", max_concurrent=1, **kw)
    hold = lane.acquire("k")
    hold.__enter__()
    hold._suspend_renewal()  # test hook: a GC pause longer than the lease
    time.sleep(0.9)  # lease 0.3 s; room for a renewal already in flight
    hold._suspend_renewal(False)
    wait_until(lambda: hold.lost, timeout=2)  # the renewer noticed
    assert lost == [hold] and lane.leases_lost == 1
    with pytest.raises(LeaseLostError):
        hold.release()
    with pytest.raises(NotOwnerError):
        hold.release()
    # manual_release of a lost hold: False and a warning.
    assert lane.try_acquire("k")
    lane._holds["k"][0]()._suspend_renewal()
    time.sleep(0.9)  # lease 0.3 s; room for a renewal already in flight
    lane._holds["k"][0]()._suspend_renewal(False)
    wait_until(lambda: len(lost) == 2, timeout=2)
    with caplog.at_level(logging.WARNING, logger="lanequeue.redis"):
        assert lane.manual_release("k") is False
    assert "lost" in caplog.text


def test_release_after_expiry_known_by_the_holders_deadline(
    redis_client: redis.Redis, redis_prefix: str
) -> None:
    """C21. The lease ran out while renewal was paused: the holder knows it by its own
    deadline, without any I/O (``lost`` is True, the callback fired); the release raises
    LeaseLostError (a NotOwnerError) and sends nothing."""
    lost: list[Any] = []
    lane = RedisSessionLane(redis_client, prefix=redis_prefix, lease_s=0.2,
                            on_lease_lost=lost.append)
    hold = lane.acquire("k").__enter__()
    hold._suspend_renewal()
    time.sleep(0.3)
    assert hold.lost
    wait_until(lambda: lost == [hold], timeout=2)
    with pytest.raises(LeaseLostError) as info:
        hold.release()
    assert isinstance(info.value, NotOwnerError)
    assert lost == [hold]


def test_with_block_error_is_not_masked_by_release_error(
    redis_client: redis.Redis, redis_prefix: str
) -> None:
    lane = RedisSessionLane(redis_client, prefix=redis_prefix, lease_s=0.2)
    with pytest.raises(ZeroDivisionError), lane.acquire("k") as hold:
        hold._suspend_renewal()
        time.sleep(0.6)
        1 / 0  # noqa: B018


# -- backend errors ------------------------------------------------------------------------


def test_unreachable_redis_raises_backend_error(redis_prefix: str) -> None:
    from redis_server import free_port

    client = redis.Redis(port=free_port(), socket_connect_timeout=0.2,
                         retry=Retry(NoBackoff(), 0))
    for lane in (RedisSessionLane(client, prefix=redis_prefix),
                 RedisLane(client, "g", prefix=redis_prefix)):
        with pytest.raises(LaneBackendError) as info:
            lane.try_acquire("k")
        assert isinstance(info.value.__cause__, redis.exceptions.ConnectionError)
        assert "nothing was granted" in str(info.value)
        with pytest.raises(LaneBackendError), lane.acquire("k"):
            pass
        assert lane.stats.acquired == 0 and lane.stats.holders == 0
    with pytest.raises(LaneBackendError):
        lane.lane_status()  # the counting lane's lane-wide view asks Redis


@pytest.mark.parametrize("kind", ["session", "counting"])
def test_lost_signal_costs_one_poll_never_a_hang(
    redis_client: redis.Redis, redis_prefix: str, monkeypatch: pytest.MonkeyPatch, kind: str
) -> None:
    """The waiter's wake-ups never reach it (every wake-up signal is lost): it
    still gets the key, within one bounded poll (lease_s/3) of the release."""
    lane: RedisSessionLane | RedisLane
    holder: RedisSessionLane | RedisLane
    if kind == "session":
        holder = RedisSessionLane(redis_client, prefix=redis_prefix, lease_s=0.6)
        lane = RedisSessionLane(redis_client, prefix=redis_prefix, lease_s=0.6)
    else:
        holder = RedisLane(redis_client, "g", max_concurrent=1, prefix=redis_prefix,
                           lease_s=0.6)
        lane = RedisLane(redis_client, "g", max_concurrent=1, prefix=redis_prefix,
                         lease_s=0.6)
    assert lane._poll_s == pytest.approx(0.2)
    # The process's wake-up listener never hears of this waiter: every signal is lost.
    monkeypatch.setattr(lane, "_expect", lambda owner: None)
    assert holder.try_acquire("k")
    box: dict[str, float] = {}

    def run() -> None:
        if lane.acquire_timeout("k", 10):
            box["at"] = time.monotonic()

    t = threading.Thread(target=run)
    t.start()
    time.sleep(0.5)  # the waiter is in line, polling
    released = time.monotonic()
    assert holder.manual_release("k")
    t.join(10)
    assert box["at"] - released < 0.2 + 0.3
    assert lane.manual_release("k")


@pytest.mark.timeout(30)
def test_clients_disagreeing_on_the_cap_never_exceed_the_smallest(
    redis_client: redis.Redis, redis_prefix: str
) -> None:
    # A rolling deploy: one client still says max_concurrent=2, a new one says 5. The lane
    # admits no more than 2 while the old client is active; once it has been quiet for a
    # lease, the raised cap applies.
    old = RedisLane(redis_client, "cap", max_concurrent=2, prefix=redis_prefix, lease_s=0.5)
    new = RedisLane(redis_client, "cap", max_concurrent=5, prefix=redis_prefix, lease_s=0.5)
    assert old.try_acquire("a") and old.try_acquire("b")
    assert new.try_acquire("c") is False
    assert old.manual_release("a")
    assert new.try_acquire("c")  # one of the 2 permits, not one of 3 extra
    assert new.try_acquire("d") is False
    assert old.manual_release("b") and new.manual_release("c")
    time.sleep(1.0)  # the old client's cap is not refreshed for a lease: it lapses
    held = [new.try_acquire(f"k{i}") for i in range(6)]
    assert held == [True] * 5 + [False]
    for i in range(5):
        assert new.manual_release(f"k{i}")


def _said_matches_taken(lane: RedisLane, key: str) -> bool:
    """lane_status()["available"] > 0 exactly when ``lane`` can take a permit now; the
    permit taken for ``key``, if any, is kept (returned True)."""
    said = lane.lane_status()["available"]
    took = lane.try_acquire(key)
    assert (said > 0) == took, (said, took)
    return took


@pytest.mark.timeout(30)
def test_lane_status_reports_the_cap_in_force_and_how_long_it_stays(
    redis_client: redis.Redis, redis_prefix: str
) -> None:
    """Mixed caps (lanequeue.redis): lane_status()["max_concurrent"] is the cap in force
    and ["available"] the permits that can really be taken under it (a client with cap
    3 was promised 2 permits it could not take for a lease after a cap-1 client's call).
    The smaller cap stays while its client holds (its renewals keep it) and for that
    client's lease_s after its last call (here 0.6 s; the larger-cap client's lease_s, 30,
    plays no part); then the larger cap applies."""
    wide = RedisLane(redis_client, "cap", max_concurrent=3, prefix=redis_prefix, lease_s=30)
    narrow = RedisLane(redis_client, "cap", max_concurrent=1, prefix=redis_prefix,
                       lease_s=0.6)
    assert narrow.try_acquire("n")
    time.sleep(1.0)  # longer than narrow's lease: its renewals keep the cap 1 in force
    status = wide.lane_status()
    assert (status["max_concurrent"], status["available"], status["active"]) == (1, 0, 1)
    assert not _said_matches_taken(wide, "w0")
    before = time.monotonic()
    assert narrow.manual_release("n")
    after = time.monotonic()
    assert wide.lane_status()["max_concurrent"] == 1
    assert _said_matches_taken(wide, "w1")  # the one permit of cap 1
    assert not _said_matches_taken(wide, "w2")
    while wide.lane_status()["max_concurrent"] == 1:
        assert time.monotonic() - after < 5, "the smaller cap never lapsed"
        time.sleep(0.01)
    lapsed = time.monotonic()
    assert lapsed - before >= 0.55  # narrow's lease_s (0.6 s, less clock granularity)
    assert lapsed - after < 0.6 + 1.0  # not wide's lease_s (30 s)
    status = wide.lane_status()
    assert (status["max_concurrent"], status["available"]) == (3, 2)
    assert [_said_matches_taken(wide, f"w{i}") for i in (3, 4, 5)] == [True, True, False]
    for key in ("w1", "w3", "w4"):
        assert wide.manual_release(key)


def test_a_client_that_is_not_redis_py_is_a_clear_type_error() -> None:
    for lane_type in (RedisLane, RedisSessionLane):
        with pytest.raises(TypeError, match=r"argument 'client' must be a redis\.Redis"):
            lane_type(None, "x")  # type: ignore[arg-type]


_SYNC_HINT = "a redis.Redis (or redis.cluster.RedisCluster) client"
_ASYNC_HINT = "a redis.asyncio.Redis (or redis.asyncio.cluster.RedisCluster) client"


@pytest.mark.parametrize("lane_type", [
    "RedisLane", "RedisSessionLane", "AsyncRedisLane", "AsyncRedisSessionLane",
])
def test_a_lane_made_without_its_client_says_so_first(
    redis_server: Any, redis_prefix: str, lane_type: str,
) -> None:
    """The client left out (``RedisLane("global", max_concurrent=2)``) or given as None
    is a TypeError naming the class, ``client``, what was given and the call's shape, not
    Python's "missing 'name'"; the client is checked before any other argument, by
    position or keyword. A client of the other face is refused as before; a real client
    of the lane's face makes a working lane, with the constructor's own signature."""
    cls = getattr(lanequeue.redis, lane_type)
    is_async = lane_type.startswith("Async")
    hint = _ASYNC_HINT if is_async else _SYNC_HINT

    def refused(given: str) -> str:
        return re.escape(f"{lane_type}() argument 'client' must be {hint}, not {given}: "
                         f"{lane_type}(client, name, ...)")

    with pytest.raises(TypeError, match=rf"^{refused(repr('global') + ' (str)')}$"):
        cls("global", max_concurrent=2) if "Session" not in lane_type else cls("global")
    with pytest.raises(TypeError, match=rf"^{refused('None')}$"):
        cls(None, "x")
    with pytest.raises(TypeError, match=rf"^{refused('None')}$"):
        cls(None, 5, timeout_s=-1)  # the client first: not the bad name or timeout
    with pytest.raises(TypeError, match=rf"^{refused(repr(b'x') + ' (bytes)')}$"):
        cls(client=b"x", name="x")
    with pytest.raises(TypeError, match=rf"^{refused('2 (int)')}$"):
        cls(2, "x")
    other = (redis.Redis(host=redis_server.host, port=redis_server.port) if is_async
             else redis.asyncio.Redis(host=redis_server.host, port=redis_server.port))
    with pytest.raises(TypeError, match=rf"^{re.escape(lane_type)}\(\) argument 'client' "
                                        rf"must be {re.escape(hint)}, not redis\."):
        cls(other, "x")
    assert list(inspect.signature(cls).parameters)[:2] == ["client", "name"]

    async def use(client: Any) -> None:
        lane = cls(client, "made", prefix=redis_prefix)
        async with lane.acquire("k") as hold:
            assert hold.held
        lane.close()
        await client.aclose()

    if is_async:
        asyncio.run(use(redis.asyncio.Redis(host=redis_server.host, port=redis_server.port)))
    else:
        client = redis.Redis(host=redis_server.host, port=redis_server.port)
        lane = cls(client, "made", prefix=redis_prefix)
        with lane.acquire("k") as hold:
            assert hold.held
        lane.close()
        client.close()


def test_a_lost_hold_stays_held_until_released_and_says_it_is_lost(
    redis_client: redis.Redis, redis_prefix: str
) -> None:
    """As the README says of ``hold.held``: a Redis hold whose lease was lost stays
    ``held`` (a queue releases what is held, and that release reports the loss) while
    ``hold.lost`` is True; its release raises LeaseLostError, and then it is not held."""
    lane = RedisSessionLane(redis_client, "lost", prefix=redis_prefix, lease_s=1.0)
    hold = lane.acquire("k")
    with pytest.raises(LeaseLostError), hold:
        hold._suspend_renewal()  # test hook: the lease runs out inside the block
        deadline = time.monotonic() + 3.0
        while not hold.lost:
            assert time.monotonic() < deadline
            time.sleep(0.01)
        assert hold.held and hold.lost
    assert not hold.held


def test_a_subclass_with_its_own_constructor_is_checked_by_the_base_constructor(
    redis_server: Any, redis_prefix: str,
) -> None:
    """A subclass whose constructor takes its arguments in another order (or by keyword
    only) is made as before: the client check before Python binds the arguments applies
    to the library's own constructors only. The base constructor still checks the
    client it is given, so a wrong one is refused before any script runs."""
    import redis.asyncio as aredis

    from lanequeue.redis import RedisLane

    class Reordered(RedisLane):
        def __init__(self, name: str, client: Any, **kw: Any) -> None:
            super().__init__(client, name, **kw)

    client = redis.Redis(host=redis_server.host, port=redis_server.port)
    try:
        lane = Reordered("g", client, max_concurrent=1, prefix=redis_prefix)
        assert lane.try_acquire("k")
        assert lane.manual_release("k")
        for wrong in (None, "localhost", aredis.Redis()):
            with pytest.raises(TypeError, match="'client' must be"):
                Reordered("g", wrong, prefix=redis_prefix)
    finally:
        client.close()
