"""Slow waits (``warn_after_s``, ``on_wait``) and long holds (``stuck``, ``warn_hold_s``).

Threads: a fake lane clock, and a replaced ``_ThreadWaiter.park`` that plays the first
park step (up to ``warn_after_s``) as "ran out after 2.5 s" by moving the clock. asyncio:
the manually stepped ``FakeClockLoop`` (its clock is also the lane's clock).
"""

from __future__ import annotations

import logging
import threading
from typing import Any

import pytest
from conftest import FakeClock, FakeClockLoop, run_thread

from lanequeue import (
    AsyncLane,
    AsyncLaneQueue,
    AsyncSessionLane,
    Lane,
    LaneClearedError,
    LaneDrainingError,
    LaneQueue,
    SessionLane,
)
from lanequeue._ops import LoopTimer
from lanequeue.lanes import _ThreadWaiter


def slow_waits(caplog: pytest.LogCaptureFixture) -> list[logging.LogRecord]:
    return [r for r in caplog.records if "has waited" in r.getMessage()]


class Parks:
    """Replaces ``_ThreadWaiter.park``: the thread named "slow" runs out of its first step
    after 2.5 s of lane clock; every other park blocks until granted. Records each call."""

    def __init__(self, clock: FakeClock) -> None:
        self.clock = clock
        self.original = _ThreadWaiter.park
        self.calls: list[tuple[str, float | None]] = []
        self.parked: dict[str, threading.Event] = {"first": threading.Event(),
                                                   "slow": threading.Event()}

    def park(self, waiter: Any, timeout: float | None) -> bool:
        name = threading.current_thread().name
        self.calls.append((name, timeout))
        if name == "slow" and len([c for c in self.calls if c[0] == "slow"]) == 1:
            self.clock.advance(2.5)
            return False
        self.parked[name].set()
        return bool(self.original(waiter, None))


@pytest.mark.timeout(20)
@pytest.mark.parametrize("kind", ["session", "counting"])
def test_thread_wait_past_warn_after_logs_once_with_details(
    kind: str, fake_clock: FakeClock, monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    parks = Parks(fake_clock)
    monkeypatch.setattr(_ThreadWaiter, "park", lambda self, t: parks.park(self, t))
    seen: list[tuple[Any, str, float, int]] = []
    common: dict[str, Any] = {"clock": fake_clock, "warn_after_s": 2.0,
                              "on_wait": lambda *a: seen.append(a)}
    lane: Any = (SessionLane("s", **common) if kind == "session"
                 else Lane("c", max_concurrent=1, **common))
    caplog.set_level(logging.WARNING, logger="lanequeue")
    assert lane.try_acquire("k")  # the holder, since t=1000
    fake_clock.advance(1.0)

    def take_and_release() -> bool:
        ok: bool = lane.acquire_timeout("k", 60)
        lane.manual_release("k")
        return ok

    box: dict[str, Any] = {}
    first = run_thread("first", take_and_release, box)
    assert parks.parked["first"].wait(10)
    slow = run_thread("slow", take_and_release, box)
    assert parks.parked["slow"].wait(10)  # past its first step, now in its second
    assert seen == [(lane, "k", 2.5, 1)]  # one waiter (first) was ahead of it
    [rec] = slow_waits(caplog)
    msg = rec.getMessage()
    assert repr(lane.name) in msg and "'k'" in msg and "2.500 s" in msg
    assert "1 waiter was ahead" in msg and "held for 3.500 s" in msg  # holder since t=1000
    # Two steps: warn_after_s, then the rest of the 60 s, in real time (the parks are
    # real waits; the warning's handlers count too): the first fake step took none.
    first_step, rest = [t for n, t in parks.calls if n == "slow"]
    assert first_step == 2.0 and 59.0 < rest <= 60.0
    lane.manual_release("k")
    first.join(10)
    slow.join(10)
    assert box == {"first": True, "slow": True}
    assert len(slow_waits(caplog)) == 1 and len(seen) == 1


@pytest.mark.timeout(20)
def test_thread_short_waits_and_warn_off_park_once(
    fake_clock: FakeClock, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    parks = Parks(fake_clock)
    parks.parked["W"] = threading.Event()
    monkeypatch.setattr(_ThreadWaiter, "park", lambda self, t: parks.park(self, t))
    caplog.set_level(logging.WARNING, logger="lanequeue")
    for warn, timeout, expect in ((None, 60.0, [60.0]), (2.0, 1.5, [1.5])):
        lane = SessionLane(clock=fake_clock, warn_after_s=warn)
        parks.calls.clear()
        parks.parked["W"].clear()
        assert lane.try_acquire("k")
        box: dict[str, Any] = {}
        t = run_thread("W", lambda lane=lane, timeout=timeout: lane.acquire_timeout(
            "k", timeout), box)
        assert parks.parked["W"].wait(10)
        lane.manual_release("k")
        t.join(10)
        assert box["W"] is True and [c for _, c in parks.calls] == expect
    assert slow_waits(caplog) == []


def test_warn_arguments_are_checked() -> None:
    with pytest.raises(ValueError, match="warn_after_s"):
        Lane("x", warn_after_s=-1)
    with pytest.raises(TypeError, match="on_wait"):
        SessionLane(on_wait=3)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="warn_hold_s"):
        SessionLane(warn_hold_s=float("nan"))
    assert Lane("x").warn_after_s == 2.0 and Lane("x").warn_hold_s is None


@pytest.mark.parametrize("cls", [LaneQueue, AsyncLaneQueue])
@pytest.mark.parametrize(("kwargs", "error"), [
    ({"warn_after_s": -1}, ValueError), ({"on_wait": 5}, TypeError),
    ({"warn_hold_s": float("nan")}, ValueError), ({"warn_after_s": "2"}, TypeError),
])
def test_queue_checks_its_operations_arguments_at_construction(
    cls: Any, kwargs: dict[str, Any], error: type[Exception]
) -> None:
    """The queue checks them itself (with the lanes' check), naming the queue class and
    the argument, not the first ``add_lane`` later."""
    (name,) = kwargs
    with pytest.raises(error, match=rf"{cls.__name__}\(\) argument '{name}'"):
        cls(**kwargs)
    # The lanes' message is the same apart from the class.
    with pytest.raises(error, match=rf"Lane\(\) argument '{name}'"):
        Lane("x", **kwargs)


def test_queue_passes_its_checked_operations_arguments_to_its_lanes() -> None:
    seen: list[Any] = []
    queue = LaneQueue(warn_after_s=float("inf"), on_wait=seen.append, warn_hold_s=3)
    lane = queue.add_lane("global")
    assert (lane.warn_after_s, lane.on_wait, lane.warn_hold_s) == (None, seen.append, 3.0)


def loop_timers(loop: Any) -> int:
    """The live timers scheduled on ``loop``: a LoopTimer counts once (it arms two loop
    handles for its one call), any other handle once."""
    timers: set[object] = set()
    for h in loop._scheduled:
        if not h.cancelled():
            owner = getattr(h._callback, "__self__", None)
            timers.add(owner if isinstance(owner, LoopTimer) else h)
    return len(timers)


@pytest.mark.timeout(10)
@pytest.mark.parametrize("kind", ["session", "counting"])
def test_asyncio_timed_wait_reuses_its_one_timer(
    kind: str, caplog: pytest.LogCaptureFixture
) -> None:
    loop = FakeClockLoop()
    caplog.set_level(logging.WARNING, logger="lanequeue")
    try:
        seen: list[tuple[Any, str, float, int]] = []
        common: dict[str, Any] = {"clock": loop.time, "on_wait": lambda *a: seen.append(a)}
        lane: Any = (AsyncSessionLane("s", **common) if kind == "session"
                     else AsyncLane("c", max_concurrent=1, **common))
        out: list[bool] = []

        async def hold() -> None:
            assert await lane.try_acquire("k")

        async def wait() -> None:
            out.append(await lane.acquire_timeout("k", 10))

        loop.run_until_complete(hold())
        loop.create_task(wait())
        loop.settle()
        assert loop_timers(loop) == 1  # one timer
        loop.advance(1.9)
        assert seen == [] and slow_waits(caplog) == []
        loop.advance(0.6)  # 2.5 s: the timer set for warn_after_s (2.0) fires now
        assert seen == [(lane, "k", 2.5, 0)]
        assert loop_timers(loop) == 1  # re-armed, not added
        loop.advance(7.4)
        assert out == []  # 9.9 s: the deadline (10 s) is still ahead
        loop.advance(0.2)
        assert out == [False] and lane.stats.timeouts == 1
        [rec] = slow_waits(caplog)
        assert "held for 2.500 s" in rec.getMessage()
        assert len(seen) == 1
    finally:
        loop.shutdown()


@pytest.mark.timeout(10)
def test_asyncio_wait_without_timeout_is_logged_when_it_ends(
    caplog: pytest.LogCaptureFixture,
) -> None:
    loop = FakeClockLoop()
    caplog.set_level(logging.WARNING, logger="lanequeue")
    try:
        seen: list[tuple[Any, str, float, int]] = []
        lane = AsyncSessionLane(clock=loop.time, on_wait=lambda *a: seen.append(a))
        out: list[bool] = []

        async def hold() -> None:
            assert await lane.try_acquire("k")

        async def wait() -> None:
            out.append(await lane.acquire_timeout("k", None))

        loop.run_until_complete(hold())
        loop.create_task(wait())
        loop.create_task(wait())
        loop.settle()
        assert not loop._scheduled  # type: ignore[attr-defined]  # no timer at all
        loop.advance(3.0)
        assert seen == []  # logged only when the wait ends
        loop.call_soon(lane.manual_release_nowait, "k")
        loop.settle()
        assert out == [True] and seen == [(lane, "k", 3.0, 0)]
        loop.advance(0.5)
        loop.call_soon(lane.manual_release_nowait, "k")
        loop.settle()
        assert out == [True, True] and seen[1] == (lane, "k", 3.5, 1)  # 1 was ahead
        logged = slow_waits(caplog)
        assert len(logged) == 2
        # Logged at the end: the age of the hold it waited behind, not of its own grant
        # (the first was first in line, behind the hold taken at 0 and handed over at
        # 3.0; the second had a waiter ahead of it).
        first, second = (r.getMessage() for r in logged)
        assert first.endswith("(0 waiters were ahead when it joined; logged as the wait "
                              "ended; the hold it waited behind had lasted 3.000 s)")
        assert second.endswith("(1 waiter was ahead when it joined; logged as the wait "
                               "ended; the holds ahead of it have ended)")
    finally:
        loop.shutdown()


@pytest.mark.parametrize("end", ["clear", "drain"])
def test_asyncio_wait_without_timeout_ended_without_the_permit_says_so(
    caplog: pytest.LogCaptureFixture, end: str
) -> None:
    """A wait past warn_after_s with no timeout, ended by clear (or a drain that ends the
    waiters) rather than by a grant, is logged as ended without the permit: the hold
    ahead of it has not ended."""
    loop = FakeClockLoop()
    caplog.set_level(logging.WARNING, logger="lanequeue")
    try:
        lane = AsyncSessionLane(clock=loop.time)
        out: list[BaseException] = []

        async def hold() -> None:
            assert await lane.try_acquire("k")

        async def wait() -> None:
            try:
                await lane.acquire_timeout("k", None)
            except (LaneClearedError, LaneDrainingError) as exc:
                out.append(exc)

        async def ending() -> None:
            if end == "clear":
                assert lane.clear("k") == 1
            else:
                assert await lane.drain(cancel_waiting=True) is False

        loop.run_until_complete(hold())
        loop.create_task(wait())
        loop.settle()
        loop.advance(3.0)
        loop.run_until_complete(ending())
        loop.settle()
        assert len(out) == 1 and lane.is_held_nowait("k")
        [record] = slow_waits(caplog)
        assert record.getMessage().endswith(
            "(0 waiters were ahead when it joined; logged as the wait ended; it ended "
            "without the permit (cleared, drained or closed))")
    finally:
        loop.shutdown()


@pytest.mark.timeout(10)
@pytest.mark.parametrize("how", ["session", "counting", "acquire_all"])
def test_asyncio_wait_without_timeout_cancelled_is_logged_as_it_ends(
    caplog: pytest.LogCaptureFixture, how: str
) -> None:
    """A wait with no timeout has no deadline that logs it while it waits: cancelled
    (``asyncio.wait_for`` around it, say) past ``warn_after_s``, it is logged ONCE as it
    ends, naming the cancellation, and ``on_wait`` is called; one cancelled before
    ``warn_after_s`` is not logged."""
    loop = FakeClockLoop()
    caplog.set_level(logging.WARNING, logger="lanequeue")
    try:
        seen: list[tuple[Any, str, float, int]] = []
        on_wait = seen.append
        queue = AsyncLaneQueue(on_wait=lambda *a: on_wait(a))
        if how == "session":
            lane: Any = AsyncSessionLane(clock=loop.time, on_wait=lambda *a: on_wait(a))
        elif how == "counting":
            lane = AsyncLane("global", max_concurrent=1, clock=loop.time,
                             on_wait=lambda *a: on_wait(a))
        else:
            lane = queue.add_session_lane("session", clock=loop.time)
            queue.add_lane("global", max_concurrent=4, clock=loop.time)

        async def hold() -> None:
            assert await lane.try_acquire("k")

        async def wait() -> None:
            if how == "acquire_all":
                async with queue.acquire_all("k", ["session", "global"], timeout_s=None):
                    pass
            else:
                async with lane.acquire("k", timeout_s=None):
                    pass

        loop.run_until_complete(hold())
        early = loop.create_task(wait())
        late = loop.create_task(wait())
        loop.settle()
        loop.advance(1.0)
        early.cancel()  # before warn_after_s (2.0): not logged
        loop.settle()
        loop.advance(2.0)
        assert seen == [] and lane.waiting == 1
        late.cancel()
        loop.settle()
        assert early.cancelled() and late.cancelled()
        assert seen == [(lane, "k", 3.0, 1)]  # the early one was ahead when it joined
        [record] = slow_waits(caplog)
        assert record.getMessage().endswith(
            "(1 waiter was ahead when it joined; logged as the wait ended; it was ended "
            "by CancelledError, without the permit)")
        assert lane.waiting == 0 and lane.is_held_nowait("k") if how != "counting" else (
            lane.waiting == 0 and lane.active_count == 1)
    finally:
        loop.shutdown()


def test_on_wait_errors_are_logged_not_raised(caplog: pytest.LogCaptureFixture) -> None:
    loop = FakeClockLoop()
    caplog.set_level(logging.WARNING, logger="lanequeue")
    try:
        def boom(*a: Any) -> None:
            raise RuntimeError("callback bug")

        lane = AsyncSessionLane(clock=loop.time, on_wait=boom)
        out: list[bool] = []

        async def wait() -> None:
            out.append(await lane.acquire_timeout("k", 5))

        async def hold() -> None:
            assert await lane.try_acquire("k")

        loop.run_until_complete(hold())
        loop.create_task(wait())
        loop.settle()
        loop.advance(3.0)
        assert any("on_wait callback failed" in r.getMessage() for r in caplog.records)
        loop.call_soon(lane.manual_release_nowait, "k")
        loop.settle()
        assert out == [True]
    finally:
        loop.shutdown()


def test_stuck_lists_old_holds_and_warn_hold_logs_each_once(
    fake_clock: FakeClock, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="lanequeue")
    lane = Lane("jobs", max_concurrent=3, clock=fake_clock, warn_hold_s=10.0)
    assert lane.try_acquire("a")
    fake_clock.advance(8.0)
    assert lane.try_acquire("b")
    fake_clock.advance(4.0)  # a: 12 s, b: 4 s
    stuck = lane.stuck(5.0)
    assert [(h.key, h.age_s, h.token) for h in stuck] == [("a", 12.0, 1)]
    assert [h.key for h in lane.stuck(0)] == ["a", "b"]  # oldest first
    long_holds = [r for r in caplog.records if "has held its permit" in r.getMessage()]
    assert len(long_holds) == 1 and "'a'" in long_holds[0].getMessage()
    lane.metrics_snapshot()
    lane.status()
    lane.stuck(0)
    assert len([r for r in caplog.records if "has held its permit" in r.getMessage()]) == 1
    fake_clock.advance(7.0)  # b: 11 s
    lane.metrics_snapshot()
    long_holds = [r for r in caplog.records if "has held its permit" in r.getMessage()]
    assert len(long_holds) == 2 and "'b'" in long_holds[1].getMessage()
    with pytest.raises(ValueError, match="older_than_s"):
        lane.stuck(-1)


def test_warn_hold_off_by_default(fake_clock: FakeClock, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, logger="lanequeue")
    lane = SessionLane(clock=fake_clock)
    assert lane.try_acquire("a")
    fake_clock.advance(10**6)
    assert [h.key for h in lane.stuck(60)] == ["a"]
    assert not [r for r in caplog.records if "has held its permit" in r.getMessage()]


def test_queue_passes_warnings_to_its_lanes_and_lists_stuck_holds(
    fake_clock: FakeClock,
) -> None:
    calls: list[Any] = []
    queue = LaneQueue(warn_after_s=0.5, on_wait=calls.append, warn_hold_s=30.0)
    s = queue.add_session_lane("session", clock=fake_clock)
    g = queue.add_lane("global", max_concurrent=2, clock=fake_clock)
    assert (s.warn_after_s, s.on_wait, s.warn_hold_s) == (0.5, calls.append, 30.0)
    assert (g.warn_after_s, g.warn_hold_s) == (0.5, 30.0)
    with queue.acquire_all("k", ["session", "global"]):
        fake_clock.advance(40.0)
        stuck = queue.stuck(30.0)
        assert sorted(stuck) == ["global", "session"]
        assert stuck["session"][0].key == "k" and stuck["session"][0].age_s == 40.0
    assert queue.stuck(0) == {}
