"""In-process holds and queues: refused calls change nothing, holds of ``acquire_all`` are
the face's holds, ``held`` follows the lane, errors name the argument, subclasses are taken
through their public surface, and ``idle_timeout_s`` means what its docstring says."""

from __future__ import annotations

import asyncio
import logging
import threading
from typing import Any

import pytest
from conftest import FakeClock

from lanequeue import (
    AsyncHold,
    AsyncLane,
    AsyncLaneQueue,
    AsyncSessionLane,
    Lane,
    LaneQueue,
    NotOwnerError,
    SessionLane,
    ThreadHold,
)

pytestmark = pytest.mark.timeout(10)


def _in_thread(fn: Any) -> Any:
    """Run ``fn()`` in a new thread; return what it returned or raise what it raised."""
    box: dict[str, Any] = {}

    def run() -> None:
        try:
            box["result"] = fn()
        except BaseException as exc:
            box["error"] = exc

    t = threading.Thread(target=run)
    t.start()
    t.join(5)
    assert not t.is_alive()
    if "error" in box:
        raise box["error"]
    return box.get("result")


def _clean(lane: Any) -> None:
    st = lane.stats
    assert st.holders == 0 and st.acquired == st.released, st
    assert st.unmatched_releases == 0, st


# -- a refused release changes nothing (1a) ------------------------------------------------


def test_release_nowait_from_another_thread_is_refused_and_changes_nothing(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """``hold.release_nowait`` from a thread that is not the loop's raises RuntimeError;
    the hold stays held, leaving the block releases it, and the key is free after."""
    caplog.set_level(logging.WARNING, logger="lanequeue")
    lane = AsyncSessionLane()

    async def main() -> None:
        loop = asyncio.get_running_loop()
        async with lane.acquire("chat:1") as hold:
            with pytest.raises(RuntimeError, match="event loop"):
                await loop.run_in_executor(None, hold.release_nowait)
            assert hold.held and lane.is_held_nowait("chat:1")
        assert not lane.is_held_nowait("chat:1")
        assert lane.try_acquire_nowait("chat:1")
        assert lane.manual_release_nowait("chat:1")

    asyncio.run(main())
    _clean(lane)
    assert [r for r in caplog.records if r.name == "lanequeue"] == []


def test_release_from_a_second_loop_is_refused_and_changes_nothing() -> None:
    """``await hold.release()`` on another event loop (another thread) raises
    RuntimeError and changes nothing; a later release on the lane's loop works."""
    lane = AsyncLane("global", max_concurrent=1)

    async def main() -> None:
        hold = await lane.acquire("chat:1").__aenter__()

        async def elsewhere() -> bool:
            return await hold.release()

        with pytest.raises(RuntimeError, match="event loop"):
            await asyncio.to_thread(asyncio.run, elsewhere())
        assert hold.held and lane.active_count == 1
        assert await hold.release() is True  # the legitimate release: no NotOwnerError
        assert lane.active_count == 0

    asyncio.run(main())
    _clean(lane)


def test_acquire_all_hold_release_from_a_thread_changes_nothing() -> None:
    """Inside ``AsyncLaneQueue.acquire_all``: a hold's release, and the multi-hold's,
    from another thread (its own loop) are refused; nothing is released, the block
    releases everything."""
    queue = AsyncLaneQueue()
    session = queue.add_session_lane("session")
    llm = queue.add_lane("global", max_concurrent=2)

    async def main() -> None:
        async with queue.acquire_all("chat:1", ["session", "global"]) as holds:
            with pytest.raises(RuntimeError):
                await asyncio.to_thread(asyncio.run, holds["session"].release())
            with pytest.raises(RuntimeError):
                await asyncio.to_thread(holds["global"].release_nowait)
            with pytest.raises(RuntimeError):
                await asyncio.to_thread(asyncio.run, holds.release())
            assert holds["session"].held and holds["global"].held
            assert session.is_held_nowait("chat:1") and llm.active_count == 1
        assert not session.is_held_nowait("chat:1") and llm.active_count == 0
        async with queue.acquire_all("chat:1", ["session", "global"]):
            pass

    asyncio.run(main())
    _clean(session)
    _clean(llm)


def test_queue_close_refused_on_one_lane_changes_no_lane() -> None:
    """``AsyncLaneQueue.close()`` checks every lane's loop before it changes any: when a
    lane is bound to another running loop, no lane drains."""
    queue = AsyncLaneQueue()
    first = queue.add_lane("first", max_concurrent=1)
    second = queue.add_lane("second", max_concurrent=1)
    other = asyncio.new_event_loop()
    runner = threading.Thread(target=other.run_forever)
    runner.start()
    try:
        # "second" is bound to the other loop (and held there, so it stays bound).
        bound = asyncio.run_coroutine_threadsafe(second.try_acquire("k"), other)
        assert bound.result(5) is True

        async def main() -> None:
            assert await first.try_acquire("k")  # "first" is bound to this loop
            with pytest.raises(RuntimeError):
                queue.close()
            with pytest.raises(RuntimeError):
                queue.clear("k")
            assert not first.draining and not second.draining
            assert await first.manual_release("k")

        asyncio.run(main())
        done = asyncio.run_coroutine_threadsafe(second.manual_release("k"), other)
        assert done.result(5) is True
    finally:
        other.call_soon_threadsafe(other.stop)
        runner.join(5)
        other.close()


# -- acquire_all's holds are the face's holds (1b) ----------------------------------------


def test_acquire_all_holds_are_face_holds() -> None:
    queue = LaneQueue()
    queue.add_session_lane("session")
    with queue.acquire_all("k", ["session"]) as holds:
        assert isinstance(holds["session"], ThreadHold)
    aqueue = AsyncLaneQueue()
    aqueue.add_session_lane("session")

    async def main() -> None:
        async with aqueue.acquire_all("k", ["session"]) as holds:
            hold = holds["session"]
            assert isinstance(hold, AsyncHold)
            assert await hold.release() is True  # a coroutine, as on every asyncio hold
            with pytest.raises(NotOwnerError):
                hold.release_nowait()

    asyncio.run(main())
    st = aqueue["session"].stats
    assert (st.holders, st.released, st.unmatched_releases) == (0, 1, 1)  # the refused one


# -- held follows the lane (1c) -----------------------------------------------------------


def test_held_is_false_after_manual_release() -> None:
    lane = SessionLane()
    with lane.acquire("chat:1") as hold:
        assert lane.manual_release("chat:1")
        assert hold.held is False and lane.is_held("chat:1") is False
        assert "released" in repr(hold)
    queue = LaneQueue()
    g = queue.add_lane("global", max_concurrent=2)
    with queue.acquire_all("chat:1", ["global"]) as holds:
        assert g.manual_release("chat:1")
        assert holds["global"].held is False


# -- errors name the argument (1d) --------------------------------------------------------


@pytest.mark.parametrize("bad", [None, 3, "session"])
def test_acquire_all_bad_lane_names(bad: Any) -> None:
    for queue in (LaneQueue(), AsyncLaneQueue()):
        queue.add_session_lane("session")
        with pytest.raises(TypeError, match="lane_names"):
            queue.acquire_all("k", bad)


@pytest.mark.parametrize(
    "huge", [10**400, 1e300, float(threading.TIMEOUT_MAX)], ids=["10**400", "1e300", "max"]
)
def test_huge_timeouts_mean_no_limit(huge: Any) -> None:
    """A timeout of ``threading.TIMEOUT_MAX`` seconds or more (or an int too large for a
    float) waits without limit: the waiter is served when the holder releases."""
    lane = SessionLane()
    assert lane.acquire_timeout("k", huge)
    got: list[bool] = []
    waiter = threading.Thread(target=lambda: got.append(lane.acquire_timeout("k", huge)))
    waiter.start()
    while lane.waiting_for("k") == 0:
        waiter.join(0.001)
    assert lane.manual_release("k")
    waiter.join(5)
    assert got == [True]
    assert lane.manual_release("k")  # the waiter's grant
    with lane.acquire("k", timeout_s=huge):
        pass
    queue = LaneQueue()
    queue.add(lane)
    with queue.acquire_all("k", ["session"], timeout_s=huge):
        pass
    _clean(lane)

    async def main() -> None:
        alane = AsyncLane("global", max_concurrent=1)
        async with alane.acquire("k", timeout_s=huge):
            task = asyncio.create_task(alane.acquire_timeout("k", huge))
            await asyncio.sleep(0)
            assert alane.waiting == 1
        assert await task is True

    asyncio.run(main())


def test_backend_that_is_not_a_backend() -> None:
    for queue in (LaneQueue(), AsyncLaneQueue()):
        with pytest.raises(TypeError, match="backend"):
            queue.add_lane("x", backend=object())  # type: ignore[call-overload]
        with pytest.raises(TypeError, match="backend"):
            queue.add_session_lane("y", backend=object())  # type: ignore[call-overload]
        assert len(queue) == 0


# -- subclasses go through their public surface (1e) --------------------------------------


class CountedLane(Lane):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.calls: list[str] = []

    def acquire(self, key: str, *, timeout_s: Any = None) -> ThreadHold:  # type: ignore[override]
        self.calls.append(key)
        return super().acquire(key, timeout_s=timeout_s)


class CountedAsyncSessionLane(AsyncSessionLane):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.calls: list[str] = []

    def acquire(self, key: str, *, timeout_s: Any = None) -> AsyncHold:  # type: ignore[override]
        self.calls.append(key)
        return super().acquire(key, timeout_s=timeout_s)


def test_acquire_all_uses_a_subclass_acquire() -> None:
    queue = LaneQueue()
    queue.add_session_lane("session")
    sub = queue.add(CountedLane("global", max_concurrent=1))
    with queue.acquire_all("k", ["session", "global"]) as holds:
        assert sub.calls == ["k"] and sub.active_count == 1 and holds["global"].held
    assert sub.active_count == 0
    aqueue = AsyncLaneQueue()
    asub = aqueue.add(CountedAsyncSessionLane())
    aqueue.add_lane("global")

    async def main() -> None:
        async with aqueue.acquire_all("k", ["session", "global"]) as holds:
            assert asub.calls == ["k"] and asub.is_held_nowait("k")
            assert isinstance(holds["session"], AsyncHold)
        assert not asub.is_held_nowait("k")

    asyncio.run(main())
    _clean(sub)
    _clean(asub)


# -- idle_timeout_s means what it says (1f) ------------------------------------------------


def test_idle_timeout_zero_drops_an_entry_as_soon_as_it_is_idle() -> None:
    clock = FakeClock()
    lane = SessionLane(idle_timeout_s=0, clock=clock)
    with lane.acquire("a"):
        assert lane.session_count == 1
    assert lane.session_count == 0  # no new key, no cap reached: gone at once
    assert lane.stats.evicted == 1


def test_idle_timeout_none_keeps_entries_until_room_is_needed() -> None:
    clock = FakeClock()
    lane = SessionLane(idle_timeout_s=None, max_sessions=2, clock=clock)
    for key in ("a", "b"):
        with lane.acquire(key):
            pass
        clock.advance(10**6)
    assert lane.session_count == 2 and lane.cleanup_idle() == 0
    with lane.acquire("c"):  # needs room: the oldest idle entry goes
        assert lane.session_count == 2
    assert lane.stats.evicted == 1
