"""Priority with ageing on the counting lanes (Lane, AsyncLane, acquire_all).

The core's line is driven directly with a fake clock and waiters that record their
wake-up, so every order below is deterministic; the faces are then checked to hand the
priority through. The model test compares the core with a plain reference: serve the
waiter with the largest ``priority + waited / ageing_s``, ties by arrival.
"""

from __future__ import annotations

import asyncio
import math
import threading
import time
from typing import Any

import pytest
from conftest import FakeClock
from hypothesis import given, settings
from hypothesis import strategies as st

from lanequeue import (
    AsyncLane,
    AsyncLaneQueue,
    AsyncSessionLane,
    Dispatcher,
    Lane,
    LaneQueue,
    SessionLane,
    ThreadDispatcher,
    build_default_async_lanes,
    build_default_lanes,
)
from lanequeue._core import DEFAULT_AGEING_S, CountingCore, Waiter
from lanequeue._validate import AGEING_MAX, PRIORITY_MAX, PRIORITY_MIN, check_ageing

JOIN_S = 5.0


class Rec(Waiter):
    """A waiter that records when it is woken, and can refuse (a cancelled task)."""

    __slots__ = ("name", "woken", "refuse")

    def __init__(self, name: str) -> None:
        super().__init__()
        self.name = name
        self.woken = False
        self.refuse = False
        self.wake = self._woke

    def _woke(self, result: object) -> None:  # called as wake(None)
        self.woken = True

    def ready(self) -> bool:
        return not self.refuse


def full_core(clock: FakeClock, ageing_s: float = 10.0) -> tuple[CountingCore, int]:
    """A one-permit core whose permit is held by key "h"; returns it and the token."""
    core = CountingCore("g", 1, clock, ageing_s)
    token = core.take("h", True)
    assert token
    return core, token


def join(core: CountingCore, name: str, priority: int) -> Rec:
    w = Rec(name)
    assert core.take(name, True, w, priority=priority) == 0
    return w


def serve_all(core: CountingCore, token: int, key: str = "h") -> list[str]:
    """Release and re-release until the line is empty: the names in grant order."""
    order: list[str] = []
    holder_key = key
    while True:
        granted = [w for w in _line(core)]
        assert core.release(holder_key, token)
        woken = [w for w in granted if w.token > 0]
        if not woken:
            return order
        (w,) = woken
        assert w.woken
        order.append(w.name)
        holder_key, token = w.name, w.token


def _line(core: CountingCore) -> list[Rec]:
    return [w for w in (*core._line, *core._ranked) if isinstance(w, Rec)]


def test_higher_priority_is_served_first_fifo_among_equals(fake_clock: FakeClock) -> None:
    core, token = full_core(fake_clock)
    for name, p in [("a0", 0), ("b5", 5), ("c2", 2), ("d5", 5), ("e-1", -1), ("f0", 0)]:
        join(core, name, p)
        fake_clock.advance(0.001)  # joins 1 ms apart: negligible ageing (10 s a level)
    assert core.stats().waiters == 6
    assert serve_all(core, token) == ["b5", "d5", "c2", "a0", "f0", "e-1"]
    st_ = core.stats()
    assert (st_.waiters, st_.holders, st_.acquired, st_.released) == (0, 0, 7, 7)


def test_ahead_counts_every_waiter_in_line_whatever_its_priority(
    fake_clock: FakeClock,
) -> None:
    """What the slow-wait warning's ``ahead`` is documented to be on a lane with
    priorities: every waiter in line as it joined, even those it will be served
    before (counting only the ones ranked before it would cost O(line) per join)."""
    core, token = full_core(fake_clock)
    low1, low2, urgent = join(core, "low1", 0), join(core, "low2", 0), join(core, "u", 9)
    assert (low1.ahead, low2.ahead, urgent.ahead) == (0, 1, 2)
    assert (low1.behind, low2.behind, urgent.behind) == (fake_clock.now, None, None)
    assert serve_all(core, token) == ["u", "low1", "low2"]


def test_equal_priorities_at_the_same_instant_are_fifo(fake_clock: FakeClock) -> None:
    core, token = full_core(fake_clock)
    names = [f"w{i}" for i in range(8)]
    for name in names:
        join(core, name, 3)  # the clock does not move: equal ranks, join order decides
    assert serve_all(core, token) == names


def test_priority_zero_everywhere_is_plain_fifo_and_never_touches_the_heap(
    fake_clock: FakeClock,
) -> None:
    core, token = full_core(fake_clock)
    names = [f"w{i}" for i in range(5)]
    for name in names:
        join(core, name, 0)
        fake_clock.advance(1)
    assert core._heap == [] and core._ranked == {}
    assert serve_all(core, token) == names
    assert core._heap == []


def test_a_low_priority_waiter_overtakes_newcomers_after_ageing(fake_clock: FakeClock) -> None:
    """A priority-0 waiter meets a stream of priority-2 newcomers, one per second, with
    ageing_s = 10: a newcomer joined at t ranks t - 20 against the old waiter's 0, so
    newcomers go first until t = 20, where they tie and the old waiter (first to join)
    goes. It is not starved."""
    core, token = full_core(fake_clock, ageing_s=10.0)
    t0 = fake_clock.now
    old = join(core, "old", 0)
    holder = "h"
    served_at = None
    for step in range(1, 40):
        fake_clock.now = t0 + step
        new = join(core, f"new{step}", 2)
        assert core.release(holder, token)
        (winner,) = [w for w in (old, new) if w.token > 0]
        assert winner.woken
        holder, token = winner.name, winner.token
        if winner is old:
            served_at = step
            break
    assert served_at == 20
    # The newcomer of step 20 (equal effective priority, joined later) is next.
    assert core.stats().waiters == 1 and not new.token


def test_ageing_is_exact_between_prioritised_waiters(fake_clock: FakeClock) -> None:
    """p=3 joined at t=0 has 3 + 2.5 = 5.5 at t=25; p=5 joined at t=25 has 5: the
    older goes first. A p=6 joined at t=25 has 6 > 5.5: it goes before both."""
    core, token = full_core(fake_clock, ageing_s=10.0)
    join(core, "p3", 3)
    fake_clock.advance(25)
    join(core, "p5", 5)
    join(core, "p6", 6)
    fake_clock.advance(1000)  # time passing changes no order
    assert serve_all(core, token) == ["p6", "p3", "p5"]


def test_priority_zero_fifo_head_competes_with_the_heap_by_age(fake_clock: FakeClock) -> None:
    core, token = full_core(fake_clock, ageing_s=10.0)
    join(core, "z0", 0)  # t=0: rank 0
    fake_clock.advance(15)
    join(core, "p1", 1)  # rank 15 - 10 = 5: after z0
    join(core, "p2", 2)  # rank 15 - 20 = -5: before z0
    join(core, "z1", 0)  # rank 15: last
    assert serve_all(core, token) == ["p2", "z0", "p1", "z1"]


def test_withdrawal_keeps_counts_exact_and_is_skipped(fake_clock: FakeClock) -> None:
    core, token = full_core(fake_clock)
    a = join(core, "a", 5)
    join(core, "b", 1)
    c = join(core, "c", 0)
    assert core.withdraw("a", a, timed_out=True) == 0
    assert core.withdraw("c", c, timed_out=False) == 0
    assert core.withdraw("a", a, timed_out=True) == 0  # a second withdraw: no-op
    st_ = core.stats()
    assert (st_.waiters, st_.timeouts, st_.cancelled) == (1, 1, 1)
    assert serve_all(core, token) == ["b"]
    assert core._heap == [] and core.stats().waiters == 0


def test_withdraw_after_the_grant_returns_the_token(fake_clock: FakeClock) -> None:
    core, token = full_core(fake_clock)
    a = join(core, "a", 4)
    assert core.release("h", token)
    assert a.token > 0 and core.withdraw("a", a, timed_out=True) == a.token
    assert core.stats().timeouts == 0 and core.stats().holders == 1


def test_refusing_waiters_are_dropped_and_the_next_is_served(fake_clock: FakeClock) -> None:
    core, token = full_core(fake_clock)
    a = join(core, "a", 9)
    z = join(core, "z", 0)
    b = join(core, "b", 2)
    a.refuse = True
    z.refuse = True
    assert core.release("h", token)
    assert b.token > 0 and not a.token and not z.token
    # The refusers withdraw themselves (as a cancelled task does) and count as cancelled.
    assert core.withdraw("a", a, timed_out=False) == 0
    assert core.withdraw("z", z, timed_out=False) == 0
    st_ = core.stats()
    assert (st_.waiters, st_.cancelled, st_.holders) == (0, 2, 1)


def test_every_waiter_refusing_frees_the_permit(fake_clock: FakeClock) -> None:
    core, token = full_core(fake_clock)
    a = join(core, "a", 3)
    a.refuse = True
    assert core.release("h", token)
    assert core.stats().holders == 0 and core.stats().waiters == 0
    assert core.take("x", False)  # the permit is free again


def test_dead_heap_entries_stay_bounded(fake_clock: FakeClock) -> None:
    """Withdrawn waiters leave dead entries; a join rebuilds the heap once dead entries
    outnumber the live ones, so the heap stays O(live waiters)."""
    core, _ = full_core(fake_clock)
    keep = join(core, "keep", 1)
    for i in range(1000):
        w = join(core, f"t{i}", 2)
        assert core.withdraw(f"t{i}", w, timed_out=True) == 0
        assert len(core._heap) <= 2 * len(core._ranked) + 17
    assert core._ranked == {keep: "keep"} and core.stats().waiters == 1


def test_clear_and_drain_end_prioritised_waits(fake_clock: FakeClock) -> None:
    core, _ = full_core(fake_clock)
    a = join(core, "a", 2)
    b = join(core, "b", 0)
    c = join(core, "a", 7)
    assert core.end_waiters("a", cleared=True) == 2
    assert a.token < 0 and c.token < 0 and b.token == 0
    assert core.stats().waiters == 1
    assert core.end_waiters(None, cleared=False) == 1
    assert core.stats().waiters == 0 and core._heap == []


# -- the model ---------------------------------------------------------------------------

AGEING = 7  # integer seconds and times: the reference compares exact integers


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["join", "release", "withdraw", "tick"]),
                          st.integers(-3, 3), st.integers(0, 40)), max_size=60))
def test_model_priority_with_ageing(ops: list[tuple[str, int, int]]) -> None:
    """Random joins (priority -3..3), releases, withdrawals and clock steps: the core
    grants exactly the waiter the reference picks (largest ``p * A + waited``, ties by
    join order), and its counters match the reference at every step."""
    clock = FakeClock(0.0)
    core = CountingCore("m", 2, clock, float(AGEING))
    holds: list[tuple[str, int]] = []
    ref: list[tuple[int, int, int, Rec]] = []  # (priority, join time, join number, waiter)
    n = 0
    for op, p, x in ops:
        if op == "tick":
            clock.now += x
        elif op == "join":
            n += 1
            w = Rec(f"k{n}")
            got = core.take(w.name, True, w, priority=p)
            if got:
                assert len(holds) < 2 and not ref
                holds.append((w.name, got))
            else:
                ref.append((p, int(clock.now), n, w))
        elif op == "withdraw" and ref:
            w = ref.pop(x % len(ref))[3]
            assert core.withdraw(w.name, w, timed_out=True) == 0
        elif op == "release" and holds:
            key, token = holds.pop(x % len(holds))
            now = int(clock.now)
            expect = None
            if ref:
                expect = max(ref, key=lambda e: (e[0] * AGEING + now - e[1], -e[2]))
            assert core.release(key, token)
            granted = [e for e in ref if e[3].token]
            if expect is None:
                assert granted == []
            else:
                assert granted == [expect]
                ref.remove(expect)
                holds.append((expect[3].name, expect[3].token))
        s = core.stats()
        assert (s.waiters, s.holders) == (len(ref), len(holds))
        assert s.acquired == s.released + s.holders


# -- the faces ---------------------------------------------------------------------------


def _wait_for(cond: Any, timeout: float = JOIN_S) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, "timed out waiting for the condition"
        time.sleep(0.001)


def test_lane_threads_are_granted_by_priority(fake_clock: FakeClock) -> None:
    lane = Lane("g", max_concurrent=1, clock=fake_clock, ageing_s=10.0)
    assert lane.ageing_s == 10.0
    assert lane.try_acquire("holder")
    order: list[str] = []
    lock = threading.Lock()

    def turn(name: str, priority: int) -> None:
        with lane.acquire(name, timeout_s=JOIN_S, priority=priority), lock:
            order.append(name)

    threads = []
    for i, (name, p) in enumerate([("low", 0), ("high", 4), ("mid", 2), ("high2", 4)]):
        t = threading.Thread(target=turn, args=(name, p), daemon=True)
        t.start()
        threads.append(t)
        _wait_for(lambda i=i: lane.waiting == i + 1)  # type: ignore[misc]
    assert lane.manual_release("holder")
    for t in threads:
        t.join(JOIN_S)
        assert not t.is_alive()
    assert order == ["high", "high2", "mid", "low"]
    assert lane.stats.holders == 0 and lane.stats.waiters == 0


def test_lane_acquire_timeout_with_priority_times_out_and_leaves_no_waiter(
    fake_clock: FakeClock,
) -> None:
    lane = Lane("g", max_concurrent=1, clock=fake_clock)
    assert lane.try_acquire("holder")
    assert lane.acquire_timeout("x", 0.01, priority=5) is False
    st_ = lane.stats
    assert (st_.waiters, st_.timeouts) == (0, 1)
    assert lane._core._ranked == {}


def test_async_lane_tasks_are_granted_by_priority() -> None:
    async def main() -> list[str]:
        lane = AsyncLane("g", max_concurrent=1)
        assert await lane.try_acquire("holder")
        order: list[str] = []

        async def turn(name: str, priority: int) -> None:
            async with lane.acquire(name, timeout_s=JOIN_S, priority=priority):
                order.append(name)

        tasks = []
        for name, p in [("low", -1), ("mid", 0), ("high", 3)]:
            tasks.append(asyncio.ensure_future(turn(name, p)))
            await asyncio.sleep(0)
        assert lane.waiting == 3
        assert await lane.acquire_timeout("t", 0, priority=1) is False  # no wait
        assert await lane.manual_release("holder")
        await asyncio.wait_for(asyncio.gather(*tasks), JOIN_S)
        return order

    assert asyncio.run(main()) == ["high", "mid", "low"]


def test_cancelled_prioritised_task_is_skipped() -> None:
    async def main() -> None:
        lane = AsyncLane("g", max_concurrent=1)
        assert await lane.try_acquire("holder")
        vip = asyncio.ensure_future(lane.acquire_timeout("vip", JOIN_S, priority=9))
        other = asyncio.ensure_future(lane.acquire_timeout("other", JOIN_S, priority=1))
        await asyncio.sleep(0)
        vip.cancel()
        assert await lane.manual_release("holder")
        assert await asyncio.wait_for(other, JOIN_S) is True
        with pytest.raises(asyncio.CancelledError):
            await vip
        st_ = lane.stats
        assert (st_.holders, st_.waiters, st_.cancelled) == (1, 0, 1)

    asyncio.run(main())


class _MyLane(Lane):
    """A subclass of Lane, no override: a queue takes it through its own acquire."""


class _MyAsyncLane(AsyncLane):
    """A subclass of AsyncLane, no override."""


class _NoPriorityLane(Lane):
    """A subclass whose acquire takes no priority: served FIFO, never a TypeError."""

    def acquire(self, key: str, *, timeout_s: Any = None) -> Any:  # type: ignore[override]
        return super().acquire(key, timeout_s=timeout_s)


class _NoPriorityAsyncLane(AsyncLane):
    def acquire(self, key: str, *, timeout_s: Any = None) -> Any:  # type: ignore[override]
        return super().acquire(key, timeout_s=timeout_s)


def test_acquire_all_serves_fifo_a_subclass_whose_acquire_takes_no_priority() -> None:
    """``acquire_all(priority=p)`` on a subclass whose ``acquire`` has no ``priority``
    parameter: the lane serves its waits FIFO, as documented; the priority used to be
    passed anyway, and every such call raised TypeError."""
    queue = LaneQueue()
    glob = queue.add(_NoPriorityLane("global", max_concurrent=1, timeout_s=JOIN_S))
    with queue.acquire_all("k", ["global"], priority=3):
        assert glob.active_count == 1

    async def main() -> int:
        aqueue = AsyncLaneQueue()
        alane = aqueue.add(_NoPriorityAsyncLane("global", max_concurrent=1, timeout_s=JOIN_S))
        async with aqueue.acquire_all("k", ["global"], priority=3):
            return alane.active_count

    assert asyncio.run(main()) == 1


@pytest.mark.parametrize("cls", [Lane, _MyLane])
def test_acquire_all_orders_counting_lane_waits_by_priority(cls: type[Lane]) -> None:
    """Also on a subclass of Lane, which the queue takes through its own ``acquire``:
    the call's priority used to be dropped there (served a, b, c)."""
    queue = LaneQueue()
    queue.add_session_lane("session", timeout_s=JOIN_S)
    glob = queue.add(cls("global", max_concurrent=1, timeout_s=JOIN_S))
    assert glob.try_acquire("holder")
    order: list[str] = []

    def turn(key: str, priority: int) -> None:
        with queue.acquire_all(key, ["session", "global"], priority=priority):
            order.append(key)

    threads = []
    for i, (key, p) in enumerate([("a", 0), ("b", 2), ("c", 1)]):
        t = threading.Thread(target=turn, args=(key, p), daemon=True)
        t.start()
        threads.append(t)
        _wait_for(lambda i=i: glob.waiting == i + 1)  # type: ignore[misc]
    assert glob.manual_release("holder")
    for t in threads:
        t.join(JOIN_S)
        assert not t.is_alive()
    assert order == ["b", "c", "a"]


@pytest.mark.parametrize("cls", [AsyncLane, _MyAsyncLane])
def test_async_acquire_all_passes_priority(cls: type[AsyncLane]) -> None:
    async def main() -> list[str]:
        queue = AsyncLaneQueue()
        queue.add_session_lane("session", timeout_s=JOIN_S)
        glob = queue.add(cls("global", max_concurrent=1, timeout_s=JOIN_S))
        assert await glob.try_acquire("holder")
        order: list[str] = []

        async def turn(key: str, priority: int) -> None:
            async with queue.acquire_all(key, ["session", "global"], priority=priority):
                order.append(key)

        tasks = [asyncio.ensure_future(turn(k, p)) for k, p in [("a", 0), ("b", 5)]]
        while glob.waiting < 2:
            await asyncio.sleep(0)
        assert await glob.manual_release("holder")
        await asyncio.wait_for(asyncio.gather(*tasks), JOIN_S)
        return order

    assert asyncio.run(main()) == ["b", "a"]


def test_session_lanes_refuse_a_priority_and_accept_zero() -> None:
    lane = SessionLane("s")
    with pytest.raises(ValueError, match="SessionLane takes no priority"):
        lane.acquire("k", priority=1)
    with pytest.raises(ValueError, match="no priority"):
        lane.acquire_timeout("k", 1, priority=-2)
    with lane.acquire("k", priority=0):
        pass
    alane = AsyncSessionLane("s")
    with pytest.raises(ValueError, match="AsyncSessionLane takes no priority"):
        alane.acquire("k", priority=3)


@pytest.mark.parametrize(("bad", "error"), [
    ("1", TypeError), (1.0, TypeError), (True, TypeError), (None, TypeError),
    (2**31, ValueError), (-(2**31) - 1, ValueError),
])
def test_bad_priority_is_refused_at_the_call(bad: object, error: type[Exception]) -> None:
    lane = Lane("g")
    with pytest.raises(error, match="priority"):
        lane.acquire("k", priority=bad)  # type: ignore[arg-type]
    with pytest.raises(error, match="priority"):
        lane.acquire_timeout("k", 0, priority=bad)  # type: ignore[arg-type]
    with pytest.raises(error, match="priority"):
        SessionLane("s").acquire("k", priority=bad)  # type: ignore[arg-type]
    queue = LaneQueue()
    queue.add_lane("g")
    with pytest.raises(error, match="priority"):
        queue.acquire_all("k", ["g"], priority=bad)  # type: ignore[arg-type]
    assert lane.stats.acquired == 0


@pytest.mark.parametrize(("bad", "error"), [
    (0, ValueError), (-1.0, ValueError), (float("inf"), ValueError),
    (None, TypeError), ("30", TypeError), (True, TypeError),  # not a number: TypeError
])
def test_bad_ageing_is_refused(bad: object, error: type[Exception]) -> None:
    with pytest.raises(error, match="ageing_s"):
        Lane("g", ageing_s=bad)  # type: ignore[arg-type]
    assert Lane("g").ageing_s == DEFAULT_AGEING_S == 30.0


def test_redis_lanes_are_fifo_only(redis_client: Any, redis_prefix: str) -> None:
    """The documented limit: a Redis lane takes priority 0 only (another is a ValueError
    naming the class), and acquire_all applies a priority to in-process counting lanes
    only, waiting FIFO on a Redis lane: it still works there."""
    from lanequeue.redis import RedisBackend

    backend = RedisBackend(redis_client, prefix=redis_prefix)
    queue = LaneQueue()
    queue.add_session_lane("session", timeout_s=JOIN_S)
    glob = queue.add_lane("global", max_concurrent=1, timeout_s=JOIN_S, backend=backend)
    with pytest.raises(ValueError, match=r"^RedisLane takes no priority \(got 1\)"):
        glob.acquire("k", priority=1)
    with pytest.raises(ValueError, match=r"^RedisLane takes no priority \(got 1\)"):
        glob.acquire_timeout("k", 1, priority=1)
    assert glob.acquire_timeout("k", 0, priority=0) and glob.manual_release("k")
    with queue.acquire_all("k", ["session", "global"], priority=7) as holds:
        assert holds["global"].held and glob.active_count == 1
    assert glob.active_count == 0


@pytest.mark.parametrize("bad", [1e308, AGEING_MAX, float("inf"), 10**400])
def test_ageing_beyond_its_range_is_refused_everywhere(bad: Any) -> None:
    """``ageing_s`` stays below AGEING_MAX (about 292 years): ``priority * ageing_s``
    then never overflows a rank (1e308 made p2 rank before p5: both -inf)."""
    async def aio() -> None:
        with pytest.raises(ValueError, match="ageing_s"):
            AsyncLane("g", ageing_s=bad)
        with pytest.raises(ValueError, match="ageing_s"):
            Dispatcher(build_default_async_lanes(), ageing_s=bad)

    for make in (lambda: Lane("g", ageing_s=bad),
                 lambda: ThreadDispatcher(build_default_lanes(), ageing_s=bad)):
        with pytest.raises(ValueError, match="ageing_s"):
            make()
    asyncio.run(aio())


def test_the_largest_ageing_keeps_every_priority_in_order(fake_clock: FakeClock) -> None:
    """With the largest accepted ``ageing_s`` and the extreme priorities, ranks stay
    finite and distinct: larger priorities first, FIFO among equals."""
    ageing = math.nextafter(AGEING_MAX, 0)
    core, token = full_core(fake_clock, ageing_s=check_ageing(ageing))
    for name, p in [("min", PRIORITY_MIN), ("p2", 2), ("p5", 5), ("a0", 0), ("max-1",
                    PRIORITY_MAX - 1), ("max", PRIORITY_MAX), ("b0", 0), ("p2b", 2)]:
        join(core, name, p)
        fake_clock.advance(1.0)
    assert serve_all(core, token) == ["max", "max-1", "p5", "p2", "p2b", "a0", "b0", "min"]


@pytest.mark.timeout(20)
def test_lane_threads_with_the_largest_ageing_serve_the_larger_priority_first() -> None:
    lane = Lane("llm", max_concurrent=1, ageing_s=math.nextafter(AGEING_MAX, 0))
    lane.acquire_timeout("holder", 0)
    order: list[str] = []

    def call(key: str, priority: int) -> None:
        if lane.acquire_timeout(key, 10, priority=priority):
            order.append(key)
            lane.manual_release(key)

    threads = []
    for key, priority in [("p2", 2), ("p5", 5)]:
        threads.append(threading.Thread(target=call, args=(key, priority)))
        threads[-1].start()
        while lane.waiting < len(threads):
            time.sleep(0.001)
    lane.manual_release("holder")
    for t in threads:
        t.join(10)
    assert order == ["p5", "p2"]


def test_dispatcher_ageing_of_the_smallest_float_does_not_overflow() -> None:
    """One level per 5e-324 s: a job's levels are inf at once; its lane priority is
    capped at the lanes' bound instead of failing in int(inf)."""
    clock = FakeClock()
    queue = LaneQueue()
    queue.add_lane("global", max_concurrent=1)
    d = ThreadDispatcher(queue, lanes=("global",), ageing_s=5e-324, clock=clock)
    assert queue["global"].try_acquire("other")  # the job stays formed, not started
    try:
        ticket = d.submit("k", lambda: 1)
        job = ticket._job
        assert job is not None
        clock.advance(1.0)
        assert d._machine.lane_priority(job) == PRIORITY_MAX
        queue["global"].manual_release("other")
        assert ticket.result(5) == 1
    finally:
        d.close()
