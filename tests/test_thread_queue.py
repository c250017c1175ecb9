"""LaneQueue on the thread face: registration order, one deadline, all-or-nothing, registry."""

from __future__ import annotations

import asyncio
import math
import threading
import time
import warnings
from typing import Any

import pytest
from conftest import ParkHooks, run_thread

from lanequeue import (
    DEFAULT_GLOBAL_CONCURRENCY,
    AsyncLaneQueue,
    Dispatcher,
    Lane,
    LaneQueue,
    LaneStats,
    LaneTimeoutError,
    NotOwnerError,
    SessionLane,
    SyncLane,
    ThreadDispatcher,
    build_default_async_lanes,
    build_default_lanes,
)
from lanequeue._kinds import LANE_DEFAULT

JOIN_S = 10.0


class RecordingHold:
    """The hold of a :class:`RecordingLane`."""

    def __init__(self, lane: RecordingLane, key: str, timeout_s: float | None) -> None:
        self.lane, self.key, self.timeout_s = lane, key, timeout_s
        self.token = self.fencing_token = 0
        self.held = False

    def __enter__(self) -> RecordingHold:
        if not self.lane.acquire_timeout(self.key, self.timeout_s):
            raise LaneTimeoutError(self.lane.name, self.key, self.timeout_s)
        self.token = self.fencing_token = 1
        self.held = True
        return self

    def __exit__(self, *exc: object) -> None:
        if self.held:
            self.release()

    def release(self) -> bool:
        if not self.held:
            raise NotOwnerError("not held")
        self.held = False
        return self.lane.manual_release(self.key)


class RecordingLane:
    """A foreign lane with only the public lane surface (:class:`lanequeue.SyncLane`);
    records every acquire and release in ``log``."""

    face = "threads"
    active_count = waiting = 0
    stats = LaneStats()

    def __init__(
        self,
        name: str,
        log: list[tuple[str, str, str]],
        *,
        grant: bool = True,
        timeout_s: float | None = 1.0,
        delay_s: float = 0.0,
    ) -> None:
        self.name = name
        self.delay_s = delay_s
        self.timeout_s = timeout_s
        self.log = log
        self.grant = grant
        self.timeouts: list[float | None] = []

    def acquire(self, key: str, *, timeout_s: Any = LANE_DEFAULT) -> RecordingHold:
        return RecordingHold(self, key, self.timeout_s if timeout_s is LANE_DEFAULT else timeout_s)

    def try_acquire(self, key: str) -> bool:
        return self.acquire_timeout(key, 0)

    def acquire_timeout(self, key: str, timeout_s: Any = LANE_DEFAULT) -> bool:
        self.log.append(("acquire", self.name, key))
        self.timeouts.append(timeout_s)
        if self.delay_s:
            time.sleep(self.delay_s)  # stands for time spent waiting on this lane
        return self.grant

    def manual_release(self, key: str) -> bool:
        self.log.append(("release", self.name, key))
        return True

    def statistics(self) -> LaneStats:
        return self.stats

    def get_active(self) -> dict[str, float]:
        return {}

    def status(self) -> dict[str, Any]:
        return {"kind": "RecordingLane", "name": self.name}


def test_acquire_all_takes_lanes_in_registration_order() -> None:
    log: list[tuple[str, str, str]] = []
    queue = LaneQueue()
    for name in ("x", "y", "z"):
        lane = RecordingLane(name, log)
        assert isinstance(lane, SyncLane)  # the surface a foreign lane must have
        queue.add(lane)
    assert queue.list_lanes() == ["x", "y", "z"]
    with queue.acquire_all("k", ["z", "x", "y"]) as multi:
        assert [e[1] for e in log] == ["x", "y", "z"]
        assert len(multi) == 3
        assert multi["z"].key == "k"
    assert log == [
        ("acquire", "x", "k"),
        ("acquire", "y", "k"),
        ("acquire", "z", "k"),
        ("release", "z", "k"),
        ("release", "y", "k"),
        ("release", "x", "k"),
    ]
    log.clear()
    with queue.acquire_all("k", ["y", "x"]):
        pass
    assert log == [
        ("acquire", "x", "k"),
        ("acquire", "y", "k"),
        ("release", "y", "k"),
        ("release", "x", "k"),
    ]


@pytest.mark.timeout(10)
@pytest.mark.parametrize("face", ["thread", "asyncio"])
def test_acquire_all_warns_when_a_per_key_lane_comes_after_another(face: str) -> None:
    """Registered after the counting lane, the session lane is taken second: a request
    would hold a global permit while it waits for its key. acquire_all says so (once per
    plan: its plan is cached), naming both lanes; the default order says nothing."""
    queue: Any = LaneQueue() if face == "thread" else AsyncLaneQueue()
    queue.add_lane("global", max_concurrent=2)
    queue.add_session_lane("session")
    good: Any = build_default_lanes() if face == "thread" else build_default_async_lanes()

    async def use(q: Any) -> None:
        for _ in range(2):
            if face == "thread":
                with q.acquire_all("k", ["session", "global"]):
                    pass
            else:
                async with q.acquire_all("k", ["session", "global"]):
                    pass

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        asyncio.run(use(queue))
        asyncio.run(use(good))
    [w] = caught
    assert w.category is RuntimeWarning and w.filename == __file__
    assert "per-key lane 'session' was registered after 'global'" in str(w.message)
    assert "Register per-key lanes first" in str(w.message)


@pytest.mark.timeout(20)
def test_a_dispatcher_over_a_late_per_key_lane_does_not_warn() -> None:
    """A dispatcher runs one turn per key at a time, so none of its turns waits for its
    key while it holds a global permit: building a ThreadDispatcher or an asyncio
    Dispatcher over such a queue, and running their turns (also after a lane added
    later empties the queue's cache of plans), says nothing. acquire_all called directly
    with another list of the same lanes still warns, as it does on a queue without a
    dispatcher."""

    def late(q: Any) -> Any:
        q.add_lane("global", max_concurrent=2)
        q.add_session_lane("session")
        return q

    def order_warnings(caught: list[warnings.WarningMessage]) -> list[str]:
        return [str(w.message).split(":")[0] for w in caught
                if issubclass(w.category, RuntimeWarning) and "registered after" in
                str(w.message)]

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        queue = late(LaneQueue())
        d = ThreadDispatcher(queue, lanes=["session", "global"])
        try:
            assert d.submit("a", lambda: "ran").result(JOIN_S) == "ran"
            queue.add_lane("other")  # (the queue's plans are built anew)
            assert d.submit("b", lambda: "ran").result(JOIN_S) == "ran"
        finally:
            d.close()

        async def on_loop() -> None:
            aqueue = late(AsyncLaneQueue())
            ad = Dispatcher(aqueue, lanes=["session", "global"])

            async def ok() -> str:
                return "ran"

            assert await ad.submit("a", ok) == "ran"
            aqueue.add_lane("other")
            assert await ad.submit("b", ok) == "ran"
            ad.close()

        asyncio.run(on_loop())
        assert order_warnings(caught) == []
        with queue.acquire_all("k", ["global", "session"]):  # another list: it warns
            pass
        with late(LaneQueue()).acquire_all("k", ["session", "global"]):
            pass
    assert order_warnings(caught) == ["LaneQueue.acquire_all()"] * 2


def test_acquire_all_rolls_back_foreign_lanes_in_reverse() -> None:
    log: list[tuple[str, str, str]] = []
    queue = LaneQueue()
    queue.add(RecordingLane("x", log))
    queue.add(RecordingLane("y", log))
    queue.add(RecordingLane("z", log, grant=False))
    multi = queue.acquire_all("k", ["x", "y", "z"], timeout_s=0.1)
    with pytest.raises(LaneTimeoutError) as info:
        multi.__enter__()
    assert info.value.lane == "z"
    assert log == [
        ("acquire", "x", "k"),
        ("acquire", "y", "k"),
        ("acquire", "z", "k"),
        ("release", "y", "k"),
        ("release", "x", "k"),
    ]


def test_acquire_all_default_budget_is_smallest_lane_timeout() -> None:
    log: list[tuple[str, str, str]] = []
    queue = LaneQueue()
    x = queue.add(RecordingLane("x", log, timeout_s=7.0, delay_s=0.1))
    y = queue.add(RecordingLane("y", log, timeout_s=3.0))
    with queue.acquire_all("k", ["x", "y"]):
        pass
    # One budget of 3 s (the smallest lane timeout) for the whole call: the second lane
    # gets what the first left, not its own 3 s.
    assert x.timeouts[0] is not None and 2.5 < x.timeouts[0] <= 3.0
    assert y.timeouts[0] is not None and y.timeouts[0] <= x.timeouts[0] - 0.1
    log.clear()
    with queue.acquire_all("k", ["x", "y"], timeout_s=1.0):
        pass
    assert x.timeouts[1] is not None and 0.5 < x.timeouts[1] <= 1.0
    assert y.timeouts[1] is not None and y.timeouts[1] <= x.timeouts[1] - 0.1


@pytest.mark.timeout(20)
def test_acquire_all_applies_one_deadline() -> None:
    queue = LaneQueue()
    p = queue.add_lane("p", max_concurrent=1, timeout_s=1.0)
    queue.add_lane("q", max_concurrent=1, timeout_s=1.0)
    assert p.try_acquire("blocker-p")
    assert queue["q"].try_acquire("blocker-q")

    def free_p_later() -> None:
        while p.waiting == 0:  # until the caller is in line on p
            time.sleep(0.001)
        time.sleep(0.3)
        p.manual_release("blocker-p")

    freer = threading.Thread(target=free_p_later, daemon=True)
    freer.start()
    t0 = time.monotonic()
    multi = queue.acquire_all("k", ["p", "q"], timeout_s=0.6)
    with pytest.raises(LaneTimeoutError) as info:
        multi.__enter__()
    elapsed = time.monotonic() - t0
    freer.join(JOIN_S)
    assert info.value.lane == "q"  # p was had after ~0.3 s; q then got what was left
    # One deadline: ~0.6 s in all. Each lane's own timeout in turn would take ~0.3 + 1.0,
    # a fresh 0.6 s per lane ~0.3 + 0.6. Generous margins: not a speed figure.
    assert 0.55 <= elapsed < 0.85
    assert p.active_count == 0  # p given back
    assert p.stats.unmatched_releases == 0


@pytest.mark.timeout(10)
def test_acquire_all_zero_budget_does_not_wait() -> None:
    queue = LaneQueue()
    a = queue.add_lane("a", max_concurrent=1, timeout_s=5)
    b = queue.add_lane("b", max_concurrent=1, timeout_s=5)
    assert b.try_acquire("other")
    t0 = time.monotonic()
    with pytest.raises(LaneTimeoutError), queue.acquire_all("k", ["a", "b"], timeout_s=0):
        pass
    assert time.monotonic() - t0 < 1.0
    assert b.stats.rejected == 1
    assert a.active_count == 0
    with queue.acquire_all("k", ["a"], timeout_s=0) as multi:
        assert multi["a"].token > 0
        assert a.active_count == 1


@pytest.mark.timeout(20)
def test_acquire_all_without_limit_waits_until_released(park_hooks: ParkHooks) -> None:
    queue = LaneQueue()
    queue.add_session_lane("session", timeout_s=0.01)
    g = queue.add_lane("global", max_concurrent=1, timeout_s=0.01)
    assert g.try_acquire("busy")
    box: dict[str, Any] = {}

    def caller() -> int:
        with queue.acquire_all("k", ["session", "global"], timeout_s=math.inf) as multi:
            return multi["global"].token

    t = run_thread("caller", caller, box)
    assert park_hooks.parked("caller").wait(JOIN_S)
    assert g.waiting == 1
    assert queue["session"].is_held("k")  # session taken first, held while waiting
    assert g.manual_release("busy")
    t.join(JOIN_S)
    assert not t.is_alive()
    assert box["caller"] > 0
    assert g.active_count == 0
    assert not queue["session"].is_held("k")


@pytest.mark.timeout(30)
@pytest.mark.parametrize("session_first", [True, False])
def test_registration_order_decides_what_a_queued_turn_holds_while_it_waits(
    park_hooks: ParkHooks, session_first: bool
) -> None:
    """What the README says of the order: a busy conversation's queued turn holds
    nothing while it waits for its own turn when the session lane is registered first;
    registered after the counting lane, it holds a global permit meanwhile, and another
    conversation is refused for want of one."""
    queue = LaneQueue()
    if session_first:
        session = queue.add_session_lane("session")
        g = queue.add_lane("global", max_concurrent=2)
    else:
        g = queue.add_lane("global", max_concurrent=2)
        session = queue.add_session_lane("session")
    names = ["session", "global"]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        first = queue.acquire_all("A", names)
    assert [str(w.message).split(":")[0] for w in caught] == (
        [] if session_first else ["LaneQueue.acquire_all()"])  # the warning of the order
    first.__enter__()
    box: dict[str, Any] = {}

    def queued_turn() -> bool:
        with queue.acquire_all("A", names, timeout_s=math.inf):
            return True

    t = run_thread("turn", queued_turn, box)
    assert park_hooks.parked("turn").wait(JOIN_S)
    assert session.waiting_for("A") == 1
    assert g.active_count == (1 if session_first else 2)
    if session_first:
        with queue.acquire_all("B", names, timeout_s=0):
            pass
    else:
        with pytest.raises(LaneTimeoutError), queue.acquire_all("B", names, timeout_s=0):
            pass
    first.__exit__(None, None, None)
    t.join(JOIN_S)
    assert box["turn"] is True and g.active_count == 0


@pytest.mark.timeout(60)
def test_opposite_lane_orders_never_deadlock() -> None:
    queue = LaneQueue()
    a = queue.add_lane("a", max_concurrent=1, timeout_s=30)
    b = queue.add_lane("b", max_concurrent=1, timeout_s=30)
    inside = [0]
    worst = [0]
    guard = threading.Lock()
    start = threading.Barrier(8)

    def worker(i: int) -> None:
        names = ["a", "b"] if i % 2 else ["b", "a"]
        start.wait()
        for _ in range(1_000):
            with queue.acquire_all(f"k{i}", names):
                with guard:
                    inside[0] += 1
                    worst[0] = max(worst[0], inside[0])
                time.sleep(0)
                with guard:
                    inside[0] -= 1

    threads = [threading.Thread(target=worker, args=(i,), daemon=True) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(50)
        assert not t.is_alive(), "deadlock"
    assert worst[0] == 1
    for lane in (a, b):
        st = lane.stats
        assert st.acquired == st.released == 8_000
        assert st.timeouts == 0


@pytest.mark.timeout(20)
def test_interrupt_while_waiting_on_second_lane_releases_first(park_hooks: ParkHooks) -> None:
    queue = LaneQueue()
    s = queue.add_session_lane("session")
    g = queue.add_lane("global", max_concurrent=1)
    assert g.try_acquire("busy")

    def hook(waiter: Any, timeout: float | None) -> None:
        raise KeyboardInterrupt

    park_hooks.on("caller", hook)
    box: dict[str, Any] = {}

    def caller() -> None:
        with queue.acquire_all("k", ["session", "global"], timeout_s=5):
            pass

    t = run_thread("caller", caller, box)
    t.join(JOIN_S)
    assert isinstance(box["caller"], KeyboardInterrupt)
    assert not s.is_held("k")
    assert s.stats.holders == 0
    assert g.waiting == 0
    assert g.active_count == 1  # only "busy"
    assert g.stats.cancelled == 1
    assert s.stats.unmatched_releases == g.stats.unmatched_releases == 0


@pytest.mark.parametrize("exc", [RuntimeError("boom"), KeyboardInterrupt()])
def test_exception_in_body_leaves_no_permit_taken(exc: BaseException) -> None:
    queue = LaneQueue()
    s = queue.add_session_lane("session")
    g = queue.add_lane("global", max_concurrent=2)
    with pytest.raises(type(exc)), queue.acquire_all("k", ["session", "global"]):
        assert s.is_held("k")
        raise exc
    assert not s.is_held("k")
    assert g.active_count == 0
    with pytest.raises(type(exc)), s.acquire("k"):
        raise exc
    with pytest.raises(type(exc)), g.acquire("k"):
        raise exc
    assert s.stats.holders == g.stats.holders == 0
    assert s.try_acquire("k")
    assert g.available == 2


def test_registry_surface() -> None:
    queue = LaneQueue()
    s = queue.add_session_lane("session", max_sessions=8)
    g = queue.add_lane("global", max_concurrent=3)
    assert isinstance(s, SessionLane)
    assert isinstance(g, Lane)
    assert queue.get_lane("session") is s
    assert queue.get_lane("nope") is None
    assert queue["global"] is g
    with pytest.raises(KeyError, match=r"lane 'x' not found \(the queue's lanes: "
                       r"\['session', 'global'\]\)"):
        queue["x"]
    assert "global" in queue
    assert "x" not in queue
    assert len(queue) == 2
    assert list(queue) == ["session", "global"]
    with pytest.raises(ValueError):
        queue.add_lane("global")
    with pytest.raises(ValueError):
        queue.add_session_lane("session")
    with pytest.raises(ValueError):
        queue.add(Lane("global"))
    with pytest.raises(TypeError):
        queue.add(object())  # type: ignore[arg-type]
    status = queue.status()
    assert status["global"]["max_concurrent"] == 3
    assert status["session"]["max_sessions"] == 8
    assert status["global"]["stats"]["acquired"] == 0


def test_acquire_all_argument_errors() -> None:
    queue = LaneQueue()
    queue.add_lane("a")
    queue.add_lane("b")
    with pytest.raises(KeyError, match=r"lane 'nope' not found \(the queue's lanes: "
                       r"\['a', 'b'\]\)"):
        queue.acquire_all("k", ["a", "nope"])
    with pytest.raises(KeyError, match=r"lane 'a' not found \(the queue has no lane yet\)"):
        LaneQueue().acquire_all("k", ["a"])
    with pytest.raises(TypeError):
        queue.acquire_all("k", "a")
    with pytest.raises(ValueError):
        queue.acquire_all("k", ["a", "a"])
    with pytest.raises(ValueError):
        queue.acquire_all("k", [])
    with pytest.raises(TypeError):
        queue.acquire_all(1, ["a"])  # type: ignore[arg-type]
    with pytest.raises(ValueError):
        queue.acquire_all("", ["a"])
    with pytest.raises(ValueError):
        queue.acquire_all("k", ["a"], timeout_s=-1)
    with pytest.raises(ValueError):
        queue.acquire_all("k", ["a"], timeout_s=float("nan"))


def test_build_default_lanes() -> None:
    queue = build_default_lanes()
    assert queue.list_lanes() == ["session", "global", "scheduler", "subagent"]
    assert isinstance(queue["session"], SessionLane)
    assert queue["session"].max_sessions == 256
    assert queue["session"].idle_timeout_s == 3600.0
    assert queue["global"].max_concurrent == DEFAULT_GLOBAL_CONCURRENCY == 8
    assert queue["scheduler"].max_concurrent == 2
    assert queue["subagent"].max_concurrent == 5
    assert all(queue[n].timeout_s == 300.0 for n in queue)


def test_get_lane_refuses_a_name_that_is_not_a_str() -> None:
    """``get_lane(name)``: None for an unknown name, TypeError naming the argument for a
    name that is not a ``str`` (as every other lane-name argument)."""
    from lanequeue import AsyncLaneQueue

    for queue in (LaneQueue(), AsyncLaneQueue()):
        queue.add_session_lane("session")
        assert queue.get_lane("nope") is None
        assert queue.get_lane("session") is not None
        with pytest.raises(TypeError, match=r"get_lane\(\) argument 'name' must be a str, not int"):
            queue.get_lane(1)  # type: ignore[arg-type]


@pytest.mark.timeout(10)
def test_acquire_all_whose_entry_timed_out_is_used_up() -> None:
    """README: a MultiHold whose entry timed out raises RuntimeError when entered again
    (call acquire_all again), and the failed entry took nothing."""
    queue = LaneQueue()
    session = queue.add_session_lane("session")
    queue.add_lane("global", max_concurrent=1)
    assert session.try_acquire("k")
    multi = queue.acquire_all("k", ["session", "global"], timeout_s=0.01)
    with pytest.raises(LaneTimeoutError), multi:
        pass
    assert session.manual_release("k")
    with pytest.raises(RuntimeError, match="single use"), multi:
        pass
    with queue.acquire_all("k", ["session", "global"], timeout_s=0.01):
        assert session.is_held("k")
    assert session.stats.holders == 0


@pytest.mark.timeout(10)
@pytest.mark.parametrize("lanes", [["session"], ["session", "global"]])
def test_a_timed_out_wait_never_ends_another_callers_hold(lanes: list[str]) -> None:
    """``acquire_all`` waits on a key another caller holds and times out: the wait's
    "no grant" (0) is never taken for a token (a release of token 0 is a release by key:
    it would end the other caller's hold), so the other hold stays, and nothing counts
    as an unmatched release."""
    queue = LaneQueue()
    s = queue.add_session_lane("session", timeout_s=5)
    g = queue.add_lane("global", max_concurrent=2, timeout_s=5)
    with s.acquire("k") as other:
        with pytest.raises(LaneTimeoutError), queue.acquire_all("k", lanes, timeout_s=0.05):
            pass
        assert s.is_held("k") and other.held
    assert s.stats.unmatched_releases == g.stats.unmatched_releases == 0
    assert s.stats.holders == g.stats.holders == 0


@pytest.mark.timeout(10)
def test_acquire_all_with_timeout_zero_counts_a_refusal_as_rejected() -> None:
    """README (stats): an ``acquire_all`` with ``timeout_s=0`` that finds a lane busy
    raises LaneTimeoutError and counts in that lane's ``rejected``, not ``timeouts`` (it
    never waited), on both faces; the lane taken before it is given back."""
    import asyncio

    from lanequeue import AsyncLaneQueue, LaneTimeoutError

    queue = LaneQueue()
    s = queue.add_session_lane("session")
    g = queue.add_lane("global", max_concurrent=2)
    with (g.acquire("other"), g.acquire("other2"),
          pytest.raises(LaneTimeoutError, match="'global'"),
          queue.acquire_all("k", ["session", "global"], timeout_s=0)):
        pass
    assert (g.stats.rejected, g.stats.timeouts, s.active_count) == (1, 0, 0)

    async def main() -> None:
        aqueue = AsyncLaneQueue()
        a_s = aqueue.add_session_lane("session")
        aqueue.add_lane("global")
        async with a_s.acquire("k"):
            with pytest.raises(LaneTimeoutError, match="'session'"):
                async with aqueue.acquire_all("k", ["session", "global"], timeout_s=0):
                    pass
        assert (a_s.stats.rejected, a_s.stats.timeouts) == (1, 0)
        assert aqueue["global"].active_count == 0

    asyncio.run(main())


def test_acquire_all_reads_a_clock_its_lanes_share_once_per_grant() -> None:
    """The fast path of ``acquire_all`` reads a clock that its lanes share once for all
    their grants (the instant of the call's grants), and each lane's own clock when they
    differ: the hold ages it records are each lane's clock's."""
    reads: list[str] = []

    def clock_of(name: str, at: float) -> Any:
        def clock() -> float:
            reads.append(name)
            return at
        return clock

    shared = clock_of("shared", 100.0)
    q = LaneQueue()
    q.add(SessionLane("session", clock=shared))
    q.add(Lane("global", max_concurrent=2, clock=shared))
    with q.acquire_all("k", ["session", "global"]):
        pass  # (a new key takes the general path, which reads the clock itself)
    reads.clear()
    with q.acquire_all("k", ["session", "global"]):
        assert reads == ["shared"]  # one read, for both grants
        assert q["session"]._core.held_since() == {"k": 0.0}
    reads.clear()
    q2 = LaneQueue()
    q2.add(SessionLane("session", clock=clock_of("own-session", 5.0)))
    q2.add(Lane("global", max_concurrent=2, clock=clock_of("own-global", 7.0)))
    with q2.acquire_all("k", ["session", "global"]):
        pass
    reads.clear()
    with q2.acquire_all("k", ["session", "global"]):
        assert reads == ["own-session", "own-global"]  # each lane's own clock
