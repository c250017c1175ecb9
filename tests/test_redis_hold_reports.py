"""``warn_hold_s`` on the Redis lanes (README, "Stuck holders"): each hold that lasts
longer is logged once, by a check while it is held or as it ends, whatever happens in
between, against a real redis-server. The interleavings are driven by a gate on the
point where a release reports its hold (``RedisOps._hold_end``)."""

from __future__ import annotations

import collections
import gc
import logging
import threading
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import redis
from interrupt_points import Sweep
from test_redis_cleanup_interrupts import MAX_POINTS, POINTS, _no_renewer

from lanequeue import LaneBackendError, LeaseLostError
from lanequeue.redis import RedisSessionLane
from lanequeue.redis._ops import RedisOps
from lanequeue.redis._sync import drive

pytestmark = pytest.mark.timeout(60)


class _Gate:
    """Holds up every report of a hold's end (``RedisOps._hold_end``) until
    ``open`` is set; ``reached`` is set once one is held up."""

    def __init__(self) -> None:
        self.reached = threading.Event()
        self.open = threading.Event()


@pytest.fixture
def gate(monkeypatch: pytest.MonkeyPatch) -> Iterator[_Gate]:
    g = _Gate()
    original = RedisOps._hold_end

    def held_up(self: Any, *args: Any) -> Any:
        g.reached.set()
        assert g.open.wait(20)
        return original(self, *args)

    monkeypatch.setattr(RedisOps, "_hold_end", held_up)
    try:
        yield g
    finally:
        g.open.set()


def _lines(caplog: pytest.LogCaptureFixture, key: str) -> tuple[int, int]:
    """How many times ``key`` was logged as held too long, and as ended so."""
    messages = [r.getMessage() for r in caplog.records]
    held = sum(1 for m in messages if f"key '{key}' has held its permit" in m)
    ended = sum(1 for m in messages if f"key '{key}' held its permit" in m
                and "past warn_hold_s" in m)
    return held, ended


def _in_thread(fn: Callable[[], object]) -> threading.Thread:
    t = threading.Thread(target=fn, daemon=True)
    t.start()
    return t


@pytest.mark.parametrize("end", ["release", "stopped release"])
def test_a_hold_a_check_logged_is_not_logged_again_when_prunes_pass_before_its_report(
    redis_client: Any, redis_prefix: str, gate: _Gate, caplog: pytest.LogCaptureFixture,
    end: str,
) -> None:
    """A check logs a hold as held; its end takes it out of the registry and is held up
    before its report; two prunes of the marks run in that gap. Observed before: the
    second prune dropped the check's mark (the hold was neither held nor among the
    ends on their way: a Redis lane had none), and the report logged the hold a second
    time ("... it has been released"). Expected: logged once. ``end``: leaving the
    block, or the renewer finding the hold freed by its release that an interrupt
    stopped before its answer."""
    caplog.set_level(logging.WARNING, logger="lanequeue")
    lane = RedisSessionLane(redis_client, "hr", prefix=redis_prefix, warn_hold_s=0.0,
                            warn_after_s=None)
    hold = lane.acquire("H")
    hold.__enter__()
    lane.status()  # the check logs it as held
    assert _lines(caplog, "H") == (1, 0)
    if end == "release":
        t = _in_thread(lambda: hold.__exit__(None, None, None))
    else:
        # Its release ran in Redis, and its answer never came (an interrupt).
        assert drive(lane._script("release", "H", lane._release_call(hold))) is not None
        t = _in_thread(lambda: lane._freed_by_stopped_release(hold))
    assert gate.reached.wait(10)
    assert lane.get_active() == {}  # out of the registry, its report not made yet
    lane._prune_warned()
    lane._prune_warned()
    gate.open.set()
    t.join(10)
    assert not t.is_alive()
    assert _lines(caplog, "H") == (1, 0)
    assert lane._ending == {}  # (the release is done with it)
    assert lane._warned_holds == set() and lane.stats.holders == 0


@pytest.mark.timeout(120)
def test_an_interrupt_at_any_point_of_a_release_leaves_no_end_pending(
    redis_client: Any, redis_prefix: str, caplog: pytest.LogCaptureFixture,
) -> None:
    """A release of a hold a check logged is interrupted at each point in turn (see
    ``test_redis_cleanup_interrupts``); ``manual_release`` then ends what it left.
    Expected at every point: the release's record of an end on its way is gone once it
    returned or raised (else the check's mark of that hold were kept for good), and the
    hold is logged once (by the check)."""
    caplog.set_level(logging.WARNING, logger="lanequeue")
    lane = RedisSessionLane(redis_client, "hi", prefix=redis_prefix, warn_hold_s=0.0,
                            warn_after_s=None)
    wrong: list[str] = []
    sweep = Sweep(MAX_POINTS, **POINTS)
    for inject in sweep:
        hold = lane.acquire("k")
        hold.__enter__()
        lane.status()
        inject.run(lambda: hold.__exit__(None, None, None), catch=BaseException)  # noqa: B023
        where = inject.fired or "no point"
        if lane._ending:
            wrong.append(f"interrupted at {where}: {lane._ending}")
            lane._ending.clear()
        if hold._release_due():
            lane.manual_release("k")
        messages = [r.getMessage() for r in caplog.records]
        token = f"(token {hold.token})"
        logged = [m for m in messages if "key 'k'" in m and token in m and "held" in m]
        if len(logged) != 1:
            wrong.append(f"interrupted at {where}: {logged}")
        caplog.clear()
    assert wrong == [], "\n".join(wrong)
    assert len(sweep.fired) >= 10, sweep.fired
    assert lane.stats.holders == 0


def _dropped_lane(client: Any, prefix: str, monkeypatch: pytest.MonkeyPatch) -> Any:
    """A lane whose renewer's rounds the test runs (``drive(lane._renew_round())``)."""
    _no_renewer(monkeypatch)
    lane = RedisSessionLane(client, "dh", prefix=prefix, lease_s=30.0, warn_hold_s=0.0,
                            warn_after_s=None)
    lane.track_holds()
    return lane


@pytest.mark.filterwarnings("ignore::ResourceWarning")
def test_a_dropped_long_hold_is_logged_by_the_renewers_release_of_it(
    redis_client: Any, redis_prefix: str, monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A hold past ``warn_hold_s`` is garbage-collected while held, no check having run.
    Observed before: never logged (its dead weak reference left the checks' list at
    once, and the renewer's release of it reported nothing), while an in-process lane
    logs it ("... it has been released"). Expected: the renewer's release of it logs it,
    once, and observes its time, as any release does."""
    caplog.set_level(logging.WARNING, logger="lanequeue")
    lane = _dropped_lane(redis_client, redis_prefix, monkeypatch)
    hold = lane.acquire("D")
    hold.__enter__()
    token = hold.token
    del hold
    gc.collect()
    lane.status()  # a check: the dropped hold is not held any more, so not logged here
    assert _lines(caplog, "D") == (0, 0)
    drive(lane._renew_round())
    assert _lines(caplog, "D") == (0, 1)
    assert f"(token {token}), past warn_hold_s; it has been released" in caplog.text
    st = lane.stats
    assert (st.acquired, st.released, st.holders) == (1, 1, 0), st
    assert sum(lane.metrics_snapshot()[0].hold.counts) == 1
    drive(lane._renew_round())
    lane.status()
    assert _lines(caplog, "D") == (0, 1)
    assert lane._warned_holds == set() and lane._releasing == {}


@pytest.mark.filterwarnings("ignore::ResourceWarning")
def test_a_dropped_hold_a_check_logged_is_not_logged_again_whatever_prunes_pass(
    redis_client: Any, redis_prefix: str, monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A check logs a hold as held; the hold is dropped; two prunes of the marks run at
    each stage of its way to the renewer's report (dead in the registry, queued for the
    renewer, in the renewer's release). Expected: the report finds the check's mark
    and says nothing: logged once."""
    caplog.set_level(logging.WARNING, logger="lanequeue")
    lane = _dropped_lane(redis_client, redis_prefix, monkeypatch)
    hold = lane.acquire("D")
    hold.__enter__()
    lane.status()
    assert _lines(caplog, "D") == (1, 0)
    lane._dropped = _NotQueued()  # (its callback queues nothing: dead in the registry)
    del hold
    gc.collect()
    assert any(e() is None for e in lane._holds["D"])
    lane._prune_warned()
    lane._prune_warned()
    lane._dropped = collections.deque(lane._holds["D"])
    assert lane.active_count == 1 and len(lane._to_release) == 1  # queued
    lane._prune_warned()
    lane._prune_warned()
    io = lane._renew_many_io

    def pruned_meanwhile(calls: Any, wait: float) -> Any:
        lane._prune_warned()
        lane._prune_warned()
        return io(calls, wait)

    monkeypatch.setattr(lane, "_renew_many_io", pruned_meanwhile)
    drive(lane._renew_round())
    assert lane.stats.released == 1
    assert _lines(caplog, "D") == (1, 0)
    assert lane._warned_holds == set()


class _NotQueued(collections.deque):  # type: ignore[type-arg]
    def append(self, entry: Any) -> None:
        pass


def _lost(lane: Any, hold: Any) -> None:
    """``hold``'s lease is lost by this process's own clock, as the watchdog finds it
    at its deadline (the server still has the hold)."""
    hold._expires = 0.0
    lane._deadlines_due(0.0)
    assert hold.lost and hold.held


@pytest.mark.parametrize("check", [True, False])
def test_a_long_hold_whose_lease_was_lost_is_logged_once(
    redis_client: Any, redis_prefix: str, caplog: pytest.LogCaptureFixture, check: bool,
) -> None:
    """A hold past ``warn_hold_s`` whose lease is then lost, released by its holder
    (``LeaseLostError``). Observed before: never logged as a long hold (the checks left
    lost holds out, and the release of a lost hold reported nothing), and ``stuck()``
    did not list it, though its holder still held it. Expected (README, "Stuck
    holders"): held until released, so ``stuck()`` lists it and a check logs it; else
    its release logs it; once."""
    caplog.set_level(logging.WARNING, logger="lanequeue")
    lane = RedisSessionLane(redis_client, "lh", prefix=redis_prefix, warn_hold_s=0.0,
                            warn_after_s=None)
    lane.track_holds()
    hold = lane.acquire("L")
    hold.__enter__()
    _lost(lane, hold)
    assert lane.get_active() == {} and lane.stats.holders == 0  # (its key may be another's)
    if check:
        assert [s.key for s in lane.stuck(0)] == ["L"]
        lane.status()
        lane.metrics_snapshot()
        assert _lines(caplog, "L") == (1, 0)
    with pytest.raises(LeaseLostError):
        hold.__exit__(None, None, None)
    assert _lines(caplog, "L") == ((1, 0) if check else (0, 1))
    assert ("its lease was lost" in caplog.text) is not check  # (its end's line)
    assert lane.stuck(0) == []
    lane.status()
    assert _lines(caplog, "L") == ((1, 0) if check else (0, 1))
    st = lane.stats
    assert (st.acquired, st.released, st.holders) == (1, 1, 0), st  # (freed in Redis)
    assert sum(lane.metrics_snapshot()[0].hold.counts) == 0  # (a lost hold's time: not)
    assert lane._warned_holds == set()


def test_a_long_hold_whose_release_failed_is_logged_once(
    redis_client: Any, redis_prefix: str, monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A hold past ``warn_hold_s`` whose release gets no answer (``LaneBackendError``:
    it lapses with its lease). Observed before: never logged. Expected: its release
    logs it, once."""
    caplog.set_level(logging.WARNING, logger="lanequeue")
    lane = RedisSessionLane(redis_client, "fh", prefix=redis_prefix, warn_hold_s=0.0,
                            warn_after_s=None)
    hold = lane.acquire("F")
    hold.__enter__()
    run = lane._run

    def no_answer(op: str, key: Any, call: Any) -> Any:
        if op == "release":
            raise redis.ConnectionError("no answer")
        return run(op, key, call)

    monkeypatch.setattr(lane, "_run", no_answer)
    with pytest.raises(LaneBackendError):
        hold.__exit__(None, None, None)
    assert _lines(caplog, "F") == (0, 1)
    assert "; it has ended: its lease was lost, or its release did not free it" in caplog.text
    st = lane.stats
    assert (st.acquired, st.unmatched_releases, st.holders) == (1, 1, 0), st


@pytest.mark.filterwarnings("ignore::ResourceWarning")
def test_a_dropped_hold_whose_lease_was_lost_is_released_counted_and_logged(
    redis_client: Any, redis_prefix: str, monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A hold past ``warn_hold_s`` whose lease was lost by this process's clock is
    dropped while held. Observed before: counted nowhere (``acquired`` 1, ``released``
    and ``unmatched_releases`` 0, ``holders`` 0, for good), left in Redis until the
    server's expiry, and never logged. Expected: the renewer releases it in Redis (the
    server still had it: ``released``) and logs it, once."""
    caplog.set_level(logging.WARNING, logger="lanequeue")
    lane = _dropped_lane(redis_client, redis_prefix, monkeypatch)
    other = RedisSessionLane(redis_client, "dh", prefix=redis_prefix, lease_s=30.0)
    hold = lane.acquire("X")
    hold.__enter__()
    _lost(lane, hold)
    del hold
    gc.collect()
    assert lane.active_count == 0 and len(lane._to_release) == 1
    drive(lane._renew_round())
    st = lane.stats
    assert (st.acquired, st.released, st.unmatched_releases, st.holders) == (1, 1, 0, 0), st
    assert _lines(caplog, "X") == (0, 1)
    assert sum(lane.metrics_snapshot()[0].hold.counts) == 0
    assert other.try_acquire("X")  # (freed in Redis, not left to its lease)
    assert other.manual_release("X")
