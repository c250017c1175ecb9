"""Lifecycle of a lane and a queue: drain, wait_idle, clear, close, on both faces.

Threads: waiters are known to be in line through the park hook. asyncio: the manually
stepped FakeClockLoop, whose clock also runs ``wait_idle``'s deadline.
"""

from __future__ import annotations

import asyncio
import threading
from typing import Any

import pytest
from conftest import FakeClockLoop, ParkHooks, run_thread

from lanequeue import (
    AsyncLane,
    AsyncLaneQueue,
    AsyncSessionLane,
    Lane,
    LaneClearedError,
    LaneDrainingError,
    LaneError,
    LaneQueue,
    SessionLane,
)


def thread_lane(kind: str) -> Any:
    if kind == "session":
        return SessionLane("s")
    return Lane("c", max_concurrent=1)


def test_errors_are_lane_errors_and_name_lane_and_key() -> None:
    import pickle

    for cls in (LaneDrainingError, LaneClearedError):
        err = cls("lane-x", "key-y")
        assert isinstance(err, LaneError)
        assert (err.lane, err.key) == ("lane-x", "key-y")
        assert "lane-x" in str(err) and "key-y" in str(err)
        again = pickle.loads(pickle.dumps(err))
        assert type(again) is cls and (again.lane, again.key) == ("lane-x", "key-y")


@pytest.mark.timeout(20)
@pytest.mark.parametrize("kind", ["session", "counting"])
def test_thread_drain_refuses_new_and_serves_the_line(kind: str, park_hooks: ParkHooks) -> None:
    lane = thread_lane(kind)
    assert lane.try_acquire("k")
    box: dict[str, Any] = {}

    def waiter() -> bool:
        ok: bool = lane.acquire_timeout("k", 30)
        lane.manual_release("k")
        return ok

    t = run_thread("W", waiter, box)
    assert park_hooks.parked("W").wait(10)
    assert lane.drain() is False  # default timeout 0: returns at once, not idle
    assert lane.draining
    with pytest.raises(LaneDrainingError) as info:
        lane.try_acquire("other")
    assert (info.value.lane, info.value.key) == (lane.name, "other")
    with pytest.raises(LaneDrainingError), lane.acquire("k2"):
        pass
    with pytest.raises(LaneDrainingError):
        lane.acquire_timeout("k", 1)
    assert lane.waiting == 1  # the waiter kept its place
    lane.manual_release("k")  # handed to the waiter, which then releases
    t.join(10)
    assert box["W"] is True
    assert lane.drain(timeout_s=5) is True and lane.wait_idle(0) is True
    st = lane.stats
    assert st.acquired == st.released == 2 and st.cancelled == 0 and st.rejected == 0


@pytest.mark.timeout(20)
@pytest.mark.parametrize("kind", ["session", "counting"])
def test_thread_drain_cancel_waiting_ends_waits_not_holds(
    kind: str, park_hooks: ParkHooks
) -> None:
    lane = thread_lane(kind)
    assert lane.try_acquire("k")
    box: dict[str, Any] = {}
    t = run_thread("W", lambda: lane.acquire_timeout("k", 30), box)
    assert park_hooks.parked("W").wait(10)
    assert lane.drain(cancel_waiting=True) is False  # the holder is still there
    t.join(10)
    assert isinstance(box["W"], LaneDrainingError)
    assert lane.waiting == 0 and lane.active_count == 1 and lane.stats.cancelled == 1
    assert lane.wait_idle(0.05) is False  # the timeout passes: still held
    lane.manual_release("k")
    assert lane.wait_idle(None) is True


@pytest.mark.timeout(20)
def test_thread_wait_idle_returns_when_the_last_holder_leaves() -> None:
    lane = Lane("c", max_concurrent=2)
    assert lane.try_acquire("a")
    release = threading.Timer(0.05, lane.manual_release, ("a",))
    release.start()
    assert lane.wait_idle(10) is True
    release.join()
    with pytest.raises(ValueError, match="timeout_s"):
        lane.wait_idle(-1)
    with pytest.raises(TypeError, match="timeout_s"):
        lane.drain("soon")  # type: ignore[arg-type]


@pytest.mark.timeout(20)
def test_thread_clear_ends_the_waiters_of_one_key(park_hooks: ParkHooks) -> None:
    lane = SessionLane()
    assert lane.try_acquire("k") and lane.try_acquire("j")
    box: dict[str, Any] = {}
    threads = []
    for name, key in (("W1", "k"), ("W2", "k"), ("J", "j")):
        threads.append(run_thread(name, lambda key=key: lane.acquire_timeout(key, 30), box))
        assert park_hooks.parked(name).wait(10)
    assert lane.clear("k") == 2
    for t in threads[:2]:
        t.join(10)
    assert isinstance(box["W1"], LaneClearedError) and isinstance(box["W2"], LaneClearedError)
    assert box["W1"].key == "k"
    assert lane.is_held("k") and lane.waiting_for("k") == 0  # the holder stays
    assert lane.waiting_for("j") == 1 and "J" not in box
    assert lane.clear("k") == 0
    lane.manual_release("j")
    threads[2].join(10)
    assert box["J"] is True
    # The key can be used as usual afterwards.
    lane.manual_release("k")
    assert lane.try_acquire("k")
    assert lane.stats.cancelled == 2
    # The cleared waits are observed too: 3 immediate grants, J's wait, W1's and W2's.
    assert lane.metrics_snapshot()[0].wait.count == 6


@pytest.mark.timeout(20)
def test_thread_clear_on_a_counting_lane_ends_only_that_keys_waiters(
    park_hooks: ParkHooks,
) -> None:
    lane = Lane("c", max_concurrent=1)
    assert lane.try_acquire("x")
    box: dict[str, Any] = {}
    ta = run_thread("A", lambda: lane.acquire_timeout("a", 30), box)
    assert park_hooks.parked("A").wait(10)
    tb = run_thread("B", lambda: lane.acquire_timeout("b", 30), box)
    assert park_hooks.parked("B").wait(10)
    assert lane.clear("a") == 1
    ta.join(10)
    assert isinstance(box["A"], LaneClearedError) and lane.waiting == 1
    lane.manual_release("x")
    tb.join(10)
    assert box["B"] is True and lane.holds_of("b") == 1


@pytest.mark.timeout(20)
def test_thread_close_ends_waits_and_refuses_new(park_hooks: ParkHooks) -> None:
    lane = SessionLane()
    assert lane.try_acquire("k")
    box: dict[str, Any] = {}
    t = run_thread("W", lambda: lane.acquire_timeout("k", 30), box)
    assert park_hooks.parked("W").wait(10)
    lane.close()
    lane.close()  # idempotent
    t.join(10)
    assert isinstance(box["W"], LaneDrainingError)
    with pytest.raises(LaneDrainingError):
        lane.try_acquire("k")
    assert lane.manual_release("k") is True  # the holder finishes as usual
    assert lane.wait_idle(0) is True


@pytest.mark.timeout(20)
def test_queue_drain_and_clear_over_all_lanes(park_hooks: ParkHooks) -> None:
    queue = LaneQueue()
    session = queue.add_session_lane("session")
    glob = queue.add_lane("global", max_concurrent=1)
    assert glob.try_acquire("other")  # the global lane is full
    box: dict[str, Any] = {}

    def turn() -> str:
        with queue.acquire_all("k", ["session", "global"], timeout_s=30):
            return "ran"

    t = run_thread("W", turn, box)
    assert park_hooks.parked("W").wait(10)  # holds session, waits for global
    assert session.is_held("k")
    assert queue.clear("k") == 1
    t.join(10)
    assert isinstance(box["W"], LaneClearedError)
    assert not session.is_held("k")  # all or nothing: what it took was given back
    assert queue.drain() is False
    with pytest.raises(LaneDrainingError):
        queue.acquire_all("k", ["session"]).__enter__()
    assert session.stats.holders == 0
    glob.manual_release("other")
    assert queue.wait_idle(5) is True and queue.drain(None) is True


@pytest.mark.timeout(20)
def test_queue_close_closes_every_lane() -> None:
    queue = LaneQueue()
    queue.add_session_lane("session")
    queue.add_lane("global")
    queue.close()
    assert all(queue[n].draining for n in queue.list_lanes())


# -- asyncio -------------------------------------------------------------------------


def async_lane(kind: str) -> Any:
    if kind == "session":
        return AsyncSessionLane("s")
    return AsyncLane("c", max_concurrent=1)


@pytest.mark.timeout(10)
@pytest.mark.parametrize("kind", ["session", "counting"])
def test_async_drain_clear_wait_idle(kind: str) -> None:
    loop = FakeClockLoop()
    try:
        lane = async_lane(kind)
        out: dict[str, Any] = {}

        async def hold() -> None:
            assert await lane.try_acquire("k")

        async def wait(name: str) -> None:
            try:
                out[name] = await lane.acquire_timeout("k", 30)
                await lane.manual_release("k")
            except LaneError as exc:
                out[name] = exc

        loop.run_until_complete(hold())
        for name in ("A", "B", "C"):
            loop.create_task(wait(name))
        loop.settle()
        assert lane.waiting == 3
        # clear: every waiter of "k" ends with LaneClearedError.
        loop.call_soon(lambda: out.setdefault("cleared", lane.clear("k")))
        loop.settle()
        assert out["cleared"] == 3 and all(isinstance(out[n], LaneClearedError) for n in "ABC")
        assert lane.active_count == 1 and lane.waiting == 0
        # drain: waiters keep their place; new ones are refused.
        loop.create_task(wait("D"))
        loop.settle()
        drained = loop.create_task(lane.drain())
        loop.settle()
        assert drained.result() is False
        loop.create_task(wait("E"))
        loop.settle()
        assert isinstance(out["E"], LaneDrainingError) and lane.waiting == 1
        idle = loop.create_task(lane.wait_idle(1.0))
        loop.settle()
        loop.advance(1.0)  # the timeout passes, still held
        assert idle.result() is False
        idle = loop.create_task(lane.wait_idle(None))
        loop.settle()
        loop.call_soon(lane.manual_release_nowait, "k")  # to D, which releases
        loop.settle()
        loop.advance(0.01)
        assert out["D"] is True and idle.result() is True
    finally:
        loop.shutdown()


@pytest.mark.timeout(10)
def test_async_drain_cancel_waiting_and_close() -> None:
    loop = FakeClockLoop()
    try:
        lane = AsyncSessionLane()
        out: dict[str, Any] = {}

        async def hold() -> None:
            assert await lane.try_acquire("k")

        async def wait(name: str) -> None:
            try:
                out[name] = await lane.acquire_timeout("k", None)
            except LaneError as exc:
                out[name] = exc

        loop.run_until_complete(hold())
        loop.create_task(wait("A"))
        loop.settle()
        drained = loop.create_task(lane.drain(cancel_waiting=True))
        loop.settle()
        assert drained.result() is False and isinstance(out["A"], LaneDrainingError)
        assert lane.stats.cancelled == 1 and lane.active_count == 1
        loop.call_soon(lane.close)
        loop.call_soon(lane.manual_release_nowait, "k")
        loop.settle()
        assert loop.run_until_complete(lane.drain(0)) is True
    finally:
        loop.shutdown()


@pytest.mark.timeout(10)
def test_async_queue_drain_clear() -> None:
    loop = FakeClockLoop()
    try:
        queue = AsyncLaneQueue()
        session = queue.add_session_lane("session")
        glob = queue.add_lane("global", max_concurrent=1)
        out: dict[str, Any] = {}

        async def block() -> None:
            assert await glob.try_acquire("other")

        async def turn() -> None:
            try:
                async with queue.acquire_all("k", ["session", "global"], timeout_s=30):
                    out["turn"] = "ran"
            except LaneError as exc:
                out["turn"] = exc

        loop.run_until_complete(block())
        loop.create_task(turn())
        loop.settle()
        assert session.is_held_nowait("k") and glob.waiting == 1
        loop.call_soon(lambda: out.setdefault("n", queue.clear("k")))
        loop.settle()
        assert out["n"] == 1 and isinstance(out["turn"], LaneClearedError)
        assert not session.is_held_nowait("k")
        drained = loop.create_task(queue.drain(5.0))
        loop.settle()
        assert not drained.done()
        loop.call_soon(glob.manual_release_nowait, "other")
        loop.settle()
        loop.advance(0.01)
        assert drained.result() is True
        loop.create_task(turn())
        loop.settle()
        assert isinstance(out["turn"], LaneDrainingError)
        assert loop.run_until_complete(queue.wait_idle(0)) is True
    finally:
        loop.shutdown()


def test_async_clear_and_close_come_from_the_lanes_loop() -> None:
    lane = AsyncSessionLane()
    with pytest.raises(RuntimeError, match="event loop"):
        lane.clear("k")
    with pytest.raises(RuntimeError, match="event loop"):
        lane.close()
    assert not lane.draining


@pytest.mark.parametrize("bad", [{"timeout_s": -1}, {"timeout_s": float("nan")},
                                 {"timeout_s": "x"}, {"cancel_waiting": "yes"},
                                 {"cancel_waiting": 1}])
def test_a_refused_drain_changes_nothing_on_lanes_and_queues(bad: dict[str, Any]) -> None:
    """Every argument of drain() is checked before the lane (or queue) starts draining."""
    queue = LaneQueue()
    queue.add_lane("global", max_concurrent=1)
    targets: list[Any] = [Lane("c"), SessionLane(), queue]
    for target in targets:
        with pytest.raises((TypeError, ValueError), match=next(iter(bad))):
            target.drain(**bad)
        assert not getattr(target, "draining", False)
    assert not queue["global"].draining and queue["global"].try_acquire("k")

    async def aio() -> None:
        aqueue = AsyncLaneQueue()
        aqueue.add_lane("global", max_concurrent=1)
        for target in (AsyncLane("c"), AsyncSessionLane(), aqueue):
            with pytest.raises((TypeError, ValueError), match=next(iter(bad))):
                await target.drain(**bad)
        assert not aqueue["global"].draining and await aqueue["global"].try_acquire("k")

    asyncio.run(aio())
