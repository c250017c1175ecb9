"""Lane and SessionLane against simple models.

A hypothesis state machine drives both lanes single-threaded (nothing ever waits) and
compares every view with a model after every step. FIFO service of real waiting threads is
checked by deterministic tests below, driven by the park hook.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from typing import Any

import hypothesis.strategies as st
import pytest
from conftest import FakeClock, ParkHooks, run_thread
from hypothesis import given, settings
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from lanequeue import Lane, LaneTimeoutError, NotOwnerError, SessionLane

KEYS = st.sampled_from(["a", "b", "c", "d", "e", "f"])
CAPACITY = 3
MAX_SESSIONS = 3
IDLE_S = 1.0


class SessionModel:
    """Documented behaviour of a SessionLane: one holder per key; an idle entry expires
    after IDLE_S; a NEW key first drops expired entries, then, while the registry is at
    the cap, the entry idle the longest; held entries are never evicted; session_count
    and cleanup_idle() drop expired entries first, then the entries idle the longest
    while the registry is over the cap."""

    def __init__(self, clock: FakeClock) -> None:
        self.clock = clock
        self.held: dict[str, object] = {}  # key -> hold identity
        self.idle: OrderedDict[str, float] = OrderedDict()  # key -> idle since
        self.evicted = 0

    def purge(self) -> int:
        n = 0
        for key, since in list(self.idle.items()):
            if since > self.clock() - IDLE_S:
                break
            del self.idle[key]
            n += 1
        while self.idle and len(self.held) + len(self.idle) > MAX_SESSIONS:
            self.idle.popitem(last=False)
            n += 1
        self.evicted += n
        return n

    def take(self, key: str, ident: object) -> bool:
        if key in self.held:
            return False
        if key in self.idle:
            del self.idle[key]
        else:
            if self.idle:
                self.purge()
                while self.idle and len(self.held) + len(self.idle) >= MAX_SESSIONS:
                    self.idle.popitem(last=False)
                    self.evicted += 1
        self.held[key] = ident
        return True

    def release(self, key: str, ident: object | None) -> bool:
        if key not in self.held or (ident is not None and self.held[key] is not ident):
            return False
        del self.held[key]
        self.idle[key] = self.clock()
        return True


class CountingModel:
    """Documented behaviour of a Lane: at most CAPACITY holds; a key may hold several; a
    key-only release ends that key's oldest hold."""

    def __init__(self) -> None:
        self.holds: list[tuple[str, object]] = []  # grant order

    def take(self, key: str, ident: object) -> bool:
        if len(self.holds) >= CAPACITY:
            return False
        self.holds.append((key, ident))
        return True

    def release(self, key: str, ident: object | None) -> bool:
        for i, (k, h) in enumerate(self.holds):
            if k == key and (ident is None or h is ident):
                del self.holds[i]
                return True
        return False


class LanesMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.clock = FakeClock()
        self.session = SessionLane(
            "s", max_sessions=MAX_SESSIONS, idle_timeout_s=IDLE_S, clock=self.clock
        )
        self.counting = Lane("l", max_concurrent=CAPACITY, clock=self.clock)
        self.smodel = SessionModel(self.clock)
        self.cmodel = CountingModel()
        self.holds: list[tuple[Any, Any, Any]] = []  # (lane, model, Hold); may be stale
        self.unmatched = {"s": 0, "l": 0}
        self.rejected = {"s": 0, "l": 0}

    def pairs(self) -> list[tuple[Any, Any]]:
        return [(self.session, self.smodel), (self.counting, self.cmodel)]

    @rule(key=KEYS)
    def try_acquire(self, key: str) -> None:
        for lane, model in self.pairs():
            expected = model.take(key, object())
            assert lane.try_acquire(key) == expected
            if not expected:
                self.rejected[lane.name] += 1

    @rule(key=KEYS)
    def acquire_timeout_zero(self, key: str) -> None:
        for lane, model in self.pairs():
            expected = model.take(key, object())
            assert lane.acquire_timeout(key, 0) == expected
            if not expected:
                self.rejected[lane.name] += 1

    @rule(key=KEYS)
    def acquire_hold(self, key: str) -> None:
        for lane, model in self.pairs():
            hold = lane.acquire(key, timeout_s=0)
            try:
                hold.__enter__()
            except LaneTimeoutError as err:
                assert err.lane == lane.name
                assert err.key == key
                assert not model.take(key, object())
                self.rejected[lane.name] += 1
                continue
            assert model.take(key, hold)
            assert hold.token > 0
            self.holds.append((lane, model, hold))

    @rule(key=KEYS)
    def manual_release(self, key: str) -> None:
        for lane, model in self.pairs():
            expected = model.release(key, None)
            got = lane.manual_release(key)
            assert got == expected
            if not got:
                self.unmatched[lane.name] += 1

    @precondition(lambda self: bool(self.holds))
    @rule(data=st.data())
    def release_hold(self, data: st.DataObject) -> None:
        i = data.draw(st.integers(0, len(self.holds) - 1))
        lane, model, hold = self.holds[i]
        expected = model.release(hold.key, hold)
        if expected:
            assert hold.release() is True
        else:  # not this hold's any more: refused, and counted when it reached the lane
            with pytest.raises(NotOwnerError):
                hold.release()
            if hold.token:
                self.unmatched[lane.name] += 1
        if len(self.holds) > 20:
            del self.holds[i]

    @rule(dt=st.sampled_from([0.0, 0.25, 0.5, 0.999, 1.0, 1.5, 5.0]))
    def advance(self, dt: float) -> None:
        self.clock.advance(dt)

    @rule()
    def cleanup_idle(self) -> None:
        assert self.session.cleanup_idle() == self.smodel.purge()

    @rule()
    def idle_window_passes(self) -> None:
        self.clock.advance(IDLE_S)
        assert self.session.cleanup_idle() == self.smodel.purge()
        assert self.session.session_count == len(self.smodel.held)

    @invariant()
    def session_views(self) -> None:
        lane, model = self.session, self.smodel
        assert lane.active_count == len(model.held)
        assert set(lane.get_active()) == set(model.held)
        for key in "abcdef":
            assert lane.is_held(key) == (key in model.held)
        model.purge()  # session_count drops expired entries first
        count = lane.session_count
        assert count == len(model.held) + len(model.idle)
        # Soft cap: only held entries go over the cap (a view drops the idle ones over
        # it).
        assert count <= max(MAX_SESSIONS, len(model.held))
        s = lane.stats
        assert s.acquired - s.released == s.holders == len(model.held)
        assert s.evicted == model.evicted
        assert s.unmatched_releases == self.unmatched["s"]
        assert s.rejected == self.rejected["s"] and s.timeouts == 0  # refusals: not timeouts
        assert s.waiters == lane.waiting == 0

    @invariant()
    def counting_views(self) -> None:
        lane, model = self.counting, self.cmodel
        assert lane.active_count == len(model.holds)
        assert lane.available == CAPACITY - len(model.holds)
        keys = {k for k, _ in model.holds}
        assert set(lane.get_active()) == keys
        for key in "abcdef":
            assert lane.holds_of(key) == sum(1 for k, _ in model.holds if k == key)
        s = lane.stats
        assert s.acquired - s.released == s.holders == len(model.holds)
        assert s.unmatched_releases == self.unmatched["l"]
        assert s.rejected == self.rejected["l"] and s.timeouts == 0  # refusals: not timeouts
        assert s.evicted == 0
        assert s.waiters == 0


LanesMachine.TestCase.settings = settings(max_examples=150, stateful_step_count=60, deadline=None)
TestLanesModel = pytest.mark.timeout(110)(LanesMachine.TestCase)


# -- FIFO with real waiting threads ----------------------------------------------------


def _line_up(
    lane: Any, park_hooks: ParkHooks, keys: list[str], body: Any, box: dict[str, Any]
) -> list[threading.Thread]:
    """Start one waiter per key, each after the previous one is known to be in line."""
    threads = []
    for i, key in enumerate(keys):
        name = f"W{i}"
        threads.append(run_thread(name, lambda i=i, key=key: body(i, key), box))
        assert park_hooks.parked(name).wait(10)
        assert lane.waiting == i + 1
    return threads


@pytest.mark.timeout(60)
@settings(max_examples=25, deadline=None)
@given(keys=st.lists(st.sampled_from(["a", "b", "c"]), min_size=1, max_size=8))
def test_session_lane_serves_each_key_fifo(keys: list[str]) -> None:
    mp = pytest.MonkeyPatch()
    try:
        from lanequeue.lanes import _ThreadWaiter

        hooks = ParkHooks(_ThreadWaiter.park)
        mp.setattr(_ThreadWaiter, "park", lambda self, timeout: hooks.park(self, timeout))
        lane = SessionLane()
        for key in set(keys):
            assert lane.try_acquire(key)
        served: list[tuple[str, int]] = []
        box: dict[str, Any] = {}

        def body(i: int, key: str) -> bool:
            with lane.acquire(key, timeout_s=10):
                served.append((key, i))
            return True

        threads = _line_up(lane, hooks, keys, body, box)
        for key in sorted(set(keys)):
            assert lane.manual_release(key)
        for t in threads:
            t.join(10)
            assert not t.is_alive()
        for key in set(keys):
            expected = [i for i, k in enumerate(keys) if k == key]
            assert [i for k, i in served if k == key] == expected
        assert lane.stats.holders == lane.stats.waiters == 0
    finally:
        mp.undo()


@pytest.mark.timeout(60)
@pytest.mark.parametrize("capacity", [1, 2, 3])
def test_counting_lane_grants_fifo_across_keys(park_hooks: ParkHooks, capacity: int) -> None:
    lane = Lane("l", max_concurrent=capacity)
    for i in range(capacity):
        assert lane.try_acquire(f"main-{i}")
    keys = ["x", "y", "x", "z", "y", "x", "z", "w"]
    granted: list[int] = []
    grant_seen = threading.Semaphore(0)
    release_evt = [threading.Event() for _ in keys]
    box: dict[str, Any] = {}

    def body(i: int, key: str) -> bool:
        with lane.acquire(key, timeout_s=10):
            granted.append(i)
            grant_seen.release()
            assert release_evt[i].wait(10)
        return True

    threads = _line_up(lane, park_hooks, keys, body, box)
    # Free one permit at a time and wait for its grant: grant order == arrival order.
    for i in range(capacity):
        assert lane.manual_release(f"main-{i}")
        assert grant_seen.acquire(timeout=10)
    for i in range(len(keys)):
        release_evt[i].set()  # W{i} leaves; its permit goes to W{i + capacity}
        if i + capacity < len(keys):
            assert grant_seen.acquire(timeout=10)
    for t in threads:
        t.join(10)
        assert not t.is_alive()
    assert granted == list(range(len(keys)))
    assert lane.stats.holders == lane.stats.waiters == 0
    assert lane.available == capacity
