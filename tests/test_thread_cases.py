"""Cases C01-C09 of /work/shared/cases/HANDED.md on the thread face, each with the expected
value given there. Precise interleavings are driven by the park hook (conftest), not sleeps."""

from __future__ import annotations

import logging
import random
import threading
import time
from typing import Any

import pytest
from conftest import FakeClock, ParkHooks, run_thread

from lanequeue import Lane, LaneQueue, LaneTimeoutError, NotOwnerError, SessionLane
from lanequeue._core import CountingCore
from lanequeue.lanes import _ThreadWaiter

JOIN_S = 10.0


def join(*threads: threading.Thread) -> None:
    for t in threads:
        t.join(JOIN_S)
        assert not t.is_alive(), f"thread {t.name} is stuck"


# -- C01 -------------------------------------------------------------------------------


def c01_violations(
    lane: Any, n_keys: int = 8, n_threads: int = 16, per_thread: int = 3_000, seed: int = 1
) -> tuple[int, int]:
    """The seed-fault workload: every holder raises its key's occupancy counter, checks it,
    yields the GIL and lowers it. Returns (violations, acquisitions done)."""
    keys = [f"key-{i}" for i in range(n_keys)]
    occupancy = dict.fromkeys(keys, 0)
    occ_locks = {k: threading.Lock() for k in keys}
    violations = [0] * n_threads
    done = [0] * n_threads
    start = threading.Barrier(n_threads)

    def worker(idx: int) -> None:
        rng = random.Random(seed * 1_000 + idx)
        start.wait()
        for _ in range(per_thread):
            key = keys[rng.randrange(n_keys)]
            with lane.acquire(key):
                lock = occ_locks[key]
                with lock:
                    occupancy[key] += 1
                    seen = occupancy[key]
                if seen != 1:
                    violations[idx] += 1
                time.sleep(0)  # yield the GIL inside the hold, as the seed benchmark does
                with lock:
                    occupancy[key] -= 1
            done[idx] += 1

    threads = [threading.Thread(target=worker, args=(i,), daemon=True) for i in range(n_threads)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(100)
        assert not t.is_alive()
    return sum(violations), sum(done)


@pytest.mark.timeout(100)
def test_c01_never_two_holders_in_one_key() -> None:
    lane = SessionLane("session", max_sessions=4, idle_timeout_s=0)
    violations, done = c01_violations(lane)
    assert done == 48_000
    assert violations == 0
    st = lane.stats
    assert st.acquired == st.released == 48_000
    assert st.holders == 0
    assert st.waiters == 0
    assert st.unmatched_releases == 0
    assert lane.session_count <= 4


# -- C02 -------------------------------------------------------------------------------


@pytest.mark.timeout(30)
def test_c02_waiter_paused_before_blocking_is_not_evicted(park_hooks: ParkHooks) -> None:
    lane = SessionLane(max_sessions=1, idle_timeout_s=0)
    inside: list[str] = []
    entered: list[str] = []
    together: list[list[str]] = []
    guard = threading.Lock()

    def holder(name: str) -> bool:
        with lane.acquire("k", timeout_s=JOIN_S):
            with guard:
                inside.append(name)
                entered.append(name)
                if len(inside) > 1:
                    together.append(list(inside))
            with guard:
                inside.remove(name)
        return True

    box: dict[str, Any] = {}
    resume_b = threading.Event()
    park_hooks.on("B", lambda waiter, timeout: resume_b.wait(JOIN_S) or None)

    a = lane.acquire("k", timeout_s=0)
    a.__enter__()  # A holds "k"
    tb = run_thread("B", lambda: holder("B"), box)
    assert park_hooks.parked("B").wait(JOIN_S)  # B is in line, paused before it blocks
    assert lane.waiting_for("k") == 1

    a.__exit__(None, None, None)  # A releases while B has not blocked yet
    # Eviction runs: new keys ask the cap (1) for room, then expiry runs on its own.
    for i in range(5):
        with lane.acquire(f"other-{i}", timeout_s=0):
            pass
    lane.cleanup_idle()
    for i in range(5, 10):
        with lane.acquire(f"other-{i}", timeout_s=0):
            pass
    # "k" went straight to B: still held, not evicted, not free for anyone else.
    assert lane.is_held("k")
    assert "k" in lane.get_active()
    assert lane.try_acquire("k") is False

    tc = run_thread("C", lambda: holder("C"), box)
    assert park_hooks.parked("C").wait(JOIN_S)  # C found B's entry and lines up behind it
    assert lane.waiting_for("k") == 1
    assert lane.stats.holders == 1  # one live holder of "k", so one live entry for it

    resume_b.set()
    join(tb, tc)
    assert box == {"B": True, "C": True}  # B did not wait forever
    assert entered == ["B", "C"]
    assert together == []
    st = lane.stats
    assert st.holders == 0
    assert st.waiters == 0
    assert st.acquired - st.released == 0
    assert lane.session_count <= 1


# -- C03 -------------------------------------------------------------------------------


def test_c03_cap_eviction_never_takes_a_held_entry(fake_clock: FakeClock) -> None:
    lane = SessionLane(max_sessions=2, idle_timeout_s=3600, clock=fake_clock)
    hold_a = lane.acquire("a", timeout_s=0)
    hold_a.__enter__()
    for key in ("b", "c", "d"):
        with lane.acquire(key, timeout_s=0):
            fake_clock.advance(1)
    assert lane.is_held("a")
    assert "a" in lane.get_active()
    box: dict[str, Any] = {}
    join(run_thread("other", lambda: lane.try_acquire("a"), box))
    assert box["other"] is False
    assert lane.stats.evicted == 2  # b and c went, to make room; a stayed
    assert lane.session_count == 2  # a (held) and d (idle)

    # Everyone busy: the soft cap is exceeded rather than a held entry evicted.
    assert lane.try_acquire("b")  # evicts idle d to make room
    assert lane.try_acquire("c")  # nothing idle: created over the cap
    assert lane.session_count == 3
    assert set(lane.get_active()) == {"a", "b", "c"}
    assert lane.stats.evicted == 3

    # Once A releases, "a" may go.
    assert hold_a.release()
    assert lane.try_acquire("e")
    assert not lane.is_held("a")
    assert lane.stats.evicted == 4
    assert lane.session_count == 3  # b, c, e: all held
    assert lane.try_acquire("a")  # a fresh entry, free
    for key in ("a", "b", "c", "e"):
        assert lane.manual_release(key)


# -- C04 -------------------------------------------------------------------------------


@pytest.mark.timeout(60)
@pytest.mark.parametrize(
    ("max_sessions", "step_s", "bound"),
    [(256, 0.0, 256), (1_000_000, 0.001, 1_002)],
    ids=["cap", "expiry"],
)
def test_c04_per_key_map_stays_bounded(
    fake_clock: FakeClock, max_sessions: int, step_s: float, bound: int
) -> None:
    idle_s = 1.0
    lane = SessionLane(max_sessions=max_sessions, idle_timeout_s=idle_s, clock=fake_clock)
    peak = 0
    for i in range(100_000):
        key = f"conv-{i}"
        assert lane.try_acquire(key)
        assert lane.manual_release(key)
        fake_clock.advance(step_s)
        if i % 997 == 0:
            # Every key is new, so entries alive == acquired - evicted. Read from stats,
            # which evicts nothing itself: new keys alone must keep the registry bounded.
            st = lane.stats
            peak = max(peak, st.acquired - st.evicted)
    assert peak <= bound
    assert lane.session_count <= bound
    fake_clock.advance(idle_s)  # the idle window passes
    lane.cleanup_idle()
    assert lane.session_count == 0
    st = lane.stats
    assert st.evicted == 100_000
    assert st.acquired == st.released == 100_000
    assert lane.status()["stats"]["evicted"] == 100_000


@pytest.mark.timeout(30)
@pytest.mark.parametrize("how", ["expiry", "cap"])
def test_c04_registry_shrinking_after_a_burst_keeps_every_hold(
    fake_clock: FakeClock, how: str
) -> None:
    # A burst of 2,000 conversations at once, then quiet: the registry may shrink its
    # tables, but the hold taken at that moment must stay in the registry.
    lane = SessionLane(max_sessions=256, idle_timeout_s=60, clock=fake_clock)
    burst = [f"burst-{i}" for i in range(2_000)]
    for key in burst:
        assert lane.try_acquire(key)
    for key in burst:
        assert lane.manual_release(key)
    if how == "expiry":
        fake_clock.advance(61)  # every idle entry expires; the next new key evicts them
    assert lane.try_acquire("new")
    assert lane.is_held("new")
    assert "new" in lane.get_active()
    assert lane.try_acquire("new") is False  # one holder per key
    assert lane.stats.holders == 1
    assert lane.session_count <= 256
    assert lane.manual_release("new")
    assert lane.manual_release("new") is False


@pytest.mark.timeout(30)
@pytest.mark.parametrize("kind", ["lane", "session"])
def test_timeout_racing_a_hand_off_keeps_the_grant(
    monkeypatch: pytest.MonkeyPatch, kind: str
) -> None:
    # W's wait runs out at the very moment the holder hands it the permit: the park
    # reports a timeout although the grant has landed. W must come out holding the key
    # (or pass it on), never drop a permit nobody holds.
    lane: Lane | SessionLane
    lane = Lane("l", max_concurrent=1) if kind == "lane" else SessionLane()
    in_line = threading.Event()
    granted = threading.Event()

    def park(self: _ThreadWaiter, timeout: float | None) -> bool:
        in_line.set()
        assert granted.wait(JOIN_S)
        return False  # "timed out"

    monkeypatch.setattr(_ThreadWaiter, "park", park)
    assert lane.try_acquire("k")
    box: dict[str, Any] = {}
    t = run_thread("W", lambda: lane.acquire_timeout("k", 5), box)
    assert in_line.wait(JOIN_S)
    assert lane.manual_release("k")  # hands the permit to W
    granted.set()
    join(t)
    assert box["W"] is True  # the grant won the race
    assert lane.active_count == 1
    assert lane.manual_release("k")
    st = lane.stats
    assert st.holders == st.waiters == 0
    assert st.timeouts == 0
    assert lane.try_acquire("k")


# -- C05 -------------------------------------------------------------------------------


def _warnings(caplog: pytest.LogCaptureFixture, key: str) -> list[logging.LogRecord]:
    return [
        r
        for r in caplog.records
        if r.name == "lanequeue" and r.levelno == logging.WARNING and repr(key) in r.getMessage()
    ]


@pytest.mark.timeout(10)
def test_c05_over_release_counting_lane(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, logger="lanequeue")
    lane = Lane("l", max_concurrent=2)
    assert lane.manual_release("never") is False
    assert len(_warnings(caplog, "never")) == 1
    assert lane.try_acquire("x")
    assert lane.manual_release("x") is True
    assert lane.manual_release("x") is False
    assert len(_warnings(caplog, "x")) == 1
    # A hold released twice: the second release is refused by NotOwnerError (the report:
    # nothing is logged) and counted once as unmatched.
    with lane.acquire("h", timeout_s=0) as hold:
        pass
    with pytest.raises(NotOwnerError):
        hold.release()
    assert _warnings(caplog, "h") == []
    assert lane.available == 2
    # Exactly 2 admitted, not 3 or more.
    assert lane.try_acquire("p")
    # A stray release while someone else holds ends nobody's hold.
    assert lane.manual_release("x") is False
    assert lane.holds_of("p") == 1
    assert lane.available == 1
    assert lane.try_acquire("q")
    assert lane.try_acquire("r") is False
    assert lane.available == 0
    assert lane.stats.unmatched_releases == 4
    assert lane.stats.holders == 2


@pytest.mark.timeout(10)
def test_c05_over_release_session_lane(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, logger="lanequeue")
    lane = SessionLane()
    assert lane.manual_release("never") is False
    assert len(_warnings(caplog, "never")) == 1
    assert lane.try_acquire("k")
    assert lane.manual_release("k") is True
    assert lane.manual_release("k") is False
    assert len(_warnings(caplog, "k")) == 1
    # A stale hold never ends the next holder's hold.
    with lane.acquire("s", timeout_s=0) as old:
        pass
    assert lane.try_acquire("s")
    with pytest.raises(NotOwnerError):
        old.release()
    assert lane.is_held("s")
    assert _warnings(caplog, "s") == []  # refused by the error, counted, not logged
    assert lane.manual_release("s")
    # Still exactly 1 per key.
    assert lane.try_acquire("k")
    assert lane.try_acquire("k") is False
    assert lane.stats.unmatched_releases == 3
    assert lane.stats.holders == 1


# -- C06 -------------------------------------------------------------------------------


def test_c06_same_key_twice_on_a_counting_lane() -> None:
    lane = Lane("l", max_concurrent=3)
    first = lane.acquire("k", timeout_s=0)
    second = lane.acquire("k", timeout_s=0)
    first.__enter__()
    second.__enter__()
    assert first.token != second.token
    assert lane.active_count == 2
    assert lane.holds_of("k") == 2
    assert lane.available == 1
    second.__exit__(None, None, None)
    assert lane.active_count == 1
    assert "k" in lane.get_active()
    assert lane.holds_of("k") == 1
    with pytest.raises(NotOwnerError):
        second.release()  # already ended: does not end first's hold
    assert lane.active_count == 1
    first.__exit__(None, None, None)
    assert lane.active_count == 0
    assert "k" not in lane.get_active()
    assert lane.available == 3


# -- C07 -------------------------------------------------------------------------------


@pytest.mark.timeout(10)
def test_c07_multi_lane_acquire_fails_midway(monkeypatch: pytest.MonkeyPatch) -> None:
    queue = LaneQueue()
    a = queue.add_lane("a", max_concurrent=1)
    b = queue.add_lane("b", max_concurrent=1)
    c = queue.add_lane("c", max_concurrent=1)
    assert c.try_acquire("someone-else")  # c is full
    released: list[tuple[str, str]] = []
    original = CountingCore.release

    def recording_release(self: CountingCore, key: str, token: int = 0) -> bool:
        released.append((self.name, key))
        return original(self, key, token)

    monkeypatch.setattr(CountingCore, "release", recording_release)
    k = "gateway:slack:c1:u1"
    multi = queue.acquire_all(k, ["a", "b", "c"], timeout_s=0.05)
    with pytest.raises(LaneTimeoutError) as info:
        multi.__enter__()
    err = info.value
    assert isinstance(err, TimeoutError)
    assert err.lane == "c"
    assert err.key == k
    assert "'c'" in str(err)
    assert k in str(err)
    assert released == [("b", k), ("a", k)]  # b then a; c never
    for lane in (a, b, c):
        assert lane.stats.unmatched_releases == 0
        assert k not in lane.get_active()
    assert a.active_count == b.active_count == 0
    assert c.active_count == 1
    assert c.stats.timeouts == 1
    assert c.waiting == 0


# -- C08 -------------------------------------------------------------------------------


@pytest.mark.timeout(30)
@pytest.mark.parametrize("kind", ["lane", "session"])
@pytest.mark.parametrize("when", ["in_line", "after_grant"])
def test_c08_interrupted_waiter_leaves_nothing_behind(
    park_hooks: ParkHooks, kind: str, when: str
) -> None:
    lane: Lane | SessionLane
    lane = Lane("l", max_concurrent=1) if kind == "lane" else SessionLane()

    def key(name: str) -> str:
        return name if kind == "lane" else "k"

    interrupt = threading.Event()

    def hook(waiter: Any, timeout: float | None) -> None:
        assert interrupt.wait(JOIN_S)
        raise KeyboardInterrupt

    park_hooks.on("T1", hook)
    t0 = lane.acquire(key("T0"), timeout_s=0)
    t0.__enter__()
    box: dict[str, Any] = {}

    def t1_body() -> str:
        with lane.acquire(key("T1"), timeout_s=None):
            return "T1 entered"

    t1 = run_thread("T1", t1_body, box)
    assert park_hooks.parked("T1").wait(JOIN_S)
    assert lane.waiting == 1
    if when == "in_line":
        interrupt.set()
        join(t1)
        assert lane.waiting == 0
        assert lane.stats.cancelled == 1
        t0.__exit__(None, None, None)
    else:
        t0.__exit__(None, None, None)  # hands the permit to T1, which has not woken yet
        interrupt.set()  # ... and is interrupted before it returns
        join(t1)
    assert isinstance(box["T1"], KeyboardInterrupt)
    assert lane.waiting == 0
    assert lane.active_count == 0
    assert key("T1") not in lane.get_active()
    assert lane.try_acquire(key("T2"))  # T2 acquires at once
    assert lane.manual_release(key("T2"))
    st = lane.stats
    assert st.acquired - st.released == st.holders == 0
    assert st.unmatched_releases == 0


@pytest.mark.timeout(30)
@pytest.mark.parametrize("kind", ["lane", "session"])
def test_c08_interrupted_after_grant_passes_permit_to_next_waiter(
    park_hooks: ParkHooks, kind: str
) -> None:
    lane: Lane | SessionLane
    lane = Lane("l", max_concurrent=1) if kind == "lane" else SessionLane()
    interrupt = threading.Event()

    def hook(waiter: Any, timeout: float | None) -> None:
        assert interrupt.wait(JOIN_S)
        raise KeyboardInterrupt

    park_hooks.on("T1", hook)
    assert lane.try_acquire("k")
    box: dict[str, Any] = {}

    def holder() -> bool:
        with lane.acquire("k", timeout_s=JOIN_S):
            return True

    t1 = run_thread("T1", holder, box)
    assert park_hooks.parked("T1").wait(JOIN_S)
    t2 = run_thread("T2", holder, box)
    assert park_hooks.parked("T2").wait(JOIN_S)
    assert lane.waiting == 2
    assert lane.manual_release("k")  # T1 is granted, then interrupted before waking
    interrupt.set()
    join(t1, t2)
    assert isinstance(box["T1"], KeyboardInterrupt)
    assert box["T2"] is True
    st = lane.stats
    assert st.holders == st.waiters == 0
    assert st.acquired == st.released
    assert st.unmatched_releases == 0


# -- C09 -------------------------------------------------------------------------------


@pytest.mark.timeout(30)
@pytest.mark.parametrize("moment", ["newcomer_in_line", "back_to_back", "newcomer_parking"])
def test_c09_order_within_a_key(park_hooks: ParkHooks, moment: str) -> None:
    lane = SessionLane()
    order: list[str] = []
    box: dict[str, Any] = {}

    def holder(name: str) -> bool:
        with lane.acquire("k", timeout_s=JOIN_S):
            order.append(name)
        return True

    t0 = lane.acquire("k", timeout_s=0)
    t0.__enter__()
    threads = []
    for i, name in enumerate(("W1", "W2", "W3"), start=1):
        threads.append(run_thread(name, lambda n=name: holder(n), box))
        assert park_hooks.parked(name).wait(JOIN_S)
        assert lane.waiting_for("k") == i

    if moment == "newcomer_in_line":
        threads.append(run_thread("N", lambda: holder("N"), box))
        assert park_hooks.parked("N").wait(JOIN_S)
        assert lane.waiting_for("k") == 4
        t0.__exit__(None, None, None)
    elif moment == "back_to_back":
        # T0's release and N's acquire run back to back in one thread: the waiters have
        # had no chance to wake, so a lane that lets newcomers barge would serve N first.
        def release_then_acquire() -> bool:
            t0.__exit__(None, None, None)
            return holder("N")

        threads.append(run_thread("N", release_then_acquire, box))
    else:
        # N has joined the line and is about to block at the moment T0 releases.
        park_hooks.on("N", lambda waiter, timeout: t0.__exit__(None, None, None))
        threads.append(run_thread("N", lambda: holder("N"), box))
    join(*threads)
    assert order == ["W1", "W2", "W3", "N"]
    assert all(box[n] is True for n in ("W1", "W2", "W3", "N"))
    st = lane.stats
    assert st.acquired == st.released == 5
    assert st.holders == st.waiters == 0
