"""An asyncio lane belongs to the first event loop that uses it.

Another running loop (in another thread) is refused with a clear RuntimeError; so are plain
calls from a thread with no running loop. Once the first loop is closed and the lane is
quiet, a new loop may take it over.
"""

from __future__ import annotations

import asyncio
import gc
import threading
from collections.abc import Callable
from typing import Any

import pytest

from lanequeue import AsyncLane, AsyncLaneQueue, AsyncSessionLane

BOUND = "bound to another event loop"
NO_LOOP = "no event loop is running"


def make(kind: str) -> Any:
    if kind == "session":
        return AsyncSessionLane("sess", timeout_s=None)
    return AsyncLane("cnt", max_concurrent=2, timeout_s=None)


def in_thread(fn: Callable[[], Any], timeout: float = 10.0) -> Any:
    """Run ``fn`` in a new thread; return its result or re-raise its exception here."""
    box: dict[str, Any] = {}

    def body() -> None:
        try:
            box["result"] = fn()
        except BaseException as exc:
            box["error"] = exc

    t = threading.Thread(target=body, daemon=True)
    t.start()
    t.join(timeout)
    assert not t.is_alive(), "thread did not finish"
    if "error" in box:
        raise box["error"]
    return box.get("result")


@pytest.mark.timeout(20)
@pytest.mark.parametrize("kind", ["session", "counting"])
def test_second_running_loop_is_refused_then_allowed_after_first_closes(kind: str) -> None:
    lane = make(kind)
    first_ready = threading.Event()
    second_done = threading.Event()

    async def first() -> None:
        assert lane.try_acquire_nowait("a")
        assert lane.manual_release_nowait("a")  # quiet, but this loop is still running
        first_ready.set()
        await asyncio.get_running_loop().run_in_executor(None, second_done.wait, 10)

    first_thread = threading.Thread(target=lambda: asyncio.run(first()), daemon=True)
    first_thread.start()
    try:
        assert first_ready.wait(10)

        async def second() -> list[str]:
            msgs = []
            with pytest.raises(RuntimeError, match=BOUND) as e1:
                lane.try_acquire_nowait("b")
            msgs.append(str(e1.value))
            with pytest.raises(RuntimeError, match=BOUND):
                async with lane.acquire("b"):
                    raise AssertionError("must not enter")
            with pytest.raises(RuntimeError, match=BOUND):
                await lane.acquire_timeout("b", 0)
            with pytest.raises(RuntimeError, match=BOUND):
                lane.manual_release_nowait("a")
            return msgs

        msgs = in_thread(lambda: asyncio.run(second()))
        # The message names the lane class and the lane, and says what to do instead.
        assert type(lane).__name__ in msgs[0] and repr(lane.name) in msgs[0]
        assert "one lane per loop" in msgs[0]
        st = lane.stats
        assert st.holders == 0 and st.waiters == 0 and st.acquired == 1
    finally:
        second_done.set()
        first_thread.join(10)
    assert not first_thread.is_alive()

    async def third() -> None:
        assert lane.try_acquire_nowait("c")
        async with lane.acquire("d", timeout_s=0):
            pass
        assert lane.manual_release_nowait("c")

    # First loop closed, lane quiet: a new loop (here, in yet another thread) takes over.
    in_thread(lambda: asyncio.run(third()))
    assert lane.stats.holders == 0


@pytest.mark.timeout(10)
@pytest.mark.parametrize("kind", ["session", "counting"])
def test_closed_loop_with_a_holder_left_is_not_taken_over(kind: str) -> None:
    lane = make(kind)

    async def leave_held() -> None:
        assert lane.try_acquire_nowait("a")

    asyncio.run(leave_held())  # closed, but "a" is still held

    async def other() -> None:
        with pytest.raises(RuntimeError, match=BOUND):
            lane.try_acquire_nowait("b")

    asyncio.run(other())
    assert lane.stats.holders == 1


@pytest.mark.timeout(10)
@pytest.mark.parametrize("kind", ["session", "counting"])
def test_plain_calls_without_a_running_loop_raise(kind: str) -> None:
    lane = make(kind)
    with pytest.raises(RuntimeError, match=NO_LOOP):
        lane.try_acquire_nowait("k")
    with pytest.raises(RuntimeError, match=NO_LOOP):
        lane.manual_release_nowait("k")

    async def bind_and_hold() -> None:
        assert lane.try_acquire_nowait("k")
        assert lane.manual_release_nowait("k")

    asyncio.run(bind_and_hold())

    def from_plain_thread() -> None:
        with pytest.raises(RuntimeError, match=NO_LOOP) as info:
            lane.try_acquire_nowait("k")
        assert type(lane).__name__ in str(info.value)
        with pytest.raises(RuntimeError, match=NO_LOOP):
            lane.manual_release_nowait("k")

    in_thread(from_plain_thread)
    st = lane.stats
    assert st.holders == 0 and st.unmatched_releases == 0 and st.acquired == 1


@pytest.mark.timeout(20)
def test_acquire_all_from_a_foreign_loop_leaves_nothing_held() -> None:
    q = AsyncLaneQueue()
    q.add_session_lane("session", timeout_s=None)
    q.add_lane("global", max_concurrent=2, timeout_s=None)
    release_first = threading.Event()
    first_ready = threading.Event()

    async def first() -> None:
        async with q.acquire_all("k1", ["session", "global"]):
            first_ready.set()
            await asyncio.get_running_loop().run_in_executor(None, release_first.wait, 10)

    t = threading.Thread(target=lambda: asyncio.run(first()), daemon=True)
    t.start()
    try:
        assert first_ready.wait(10)

        async def second() -> None:
            with pytest.raises(RuntimeError, match=BOUND):
                async with q.acquire_all("k2", ["session", "global"]):
                    raise AssertionError("must not enter")

        in_thread(lambda: asyncio.run(second()))
        assert q["session"].stats.acquired == 1 and q["global"].stats.acquired == 1
        assert not q["session"].is_held_nowait("k2") and q["global"].holds_of_nowait("k2") == 0
    finally:
        release_first.set()
        t.join(10)
    assert q["session"].stats.holders == 0 and q["global"].stats.holders == 0


@pytest.mark.timeout(10)
@pytest.mark.filterwarnings(  # the acquire_all made for "release" is never entered
    "ignore:.*garbage-collected without being entered:RuntimeWarning")
@pytest.mark.parametrize("op", ["acquire_all", "release", "clear", "close", "drain"])
def test_an_operation_refused_from_a_foreign_loop_binds_no_lane(op: str) -> None:
    """An operation over several lanes refused from a foreign loop changes nothing, not
    even a binding: "global" is bound to loop A (open, its lane quiet but the loop
    alive), "session" to no loop yet. From loop B each operation raises RuntimeError,
    and "session" stays unbound, so loop A keeps using both. (It once bound "session" to
    B on the way to the refusal of "global", and A was refused from then on.)"""
    q = AsyncLaneQueue()
    session = q.add_session_lane("session", timeout_s=1)
    q.add_lane("global", max_concurrent=1, timeout_s=1)
    loop_a, loop_b = asyncio.new_event_loop(), asyncio.new_event_loop()
    try:
        async def bind_global() -> Any:
            async with q["global"].acquire("x"):
                pass
            # (made on A, so that release() from B has something to refuse)
            multi = q.acquire_all("m", ["session", "global"])
            return multi

        multi = loop_a.run_until_complete(bind_global())
        assert session._loop is None  # type: ignore[attr-defined]

        async def foreign() -> None:
            with pytest.raises(RuntimeError, match=BOUND):
                if op == "acquire_all":
                    async with q.acquire_all("k", ["session", "global"]):
                        raise AssertionError("must not enter")
                elif op == "release":
                    await multi.release()
                elif op == "clear":
                    await q.clear("k")
                elif op == "close":
                    await q.close()
                else:
                    await q.drain(cancel_waiting=True)

        loop_b.run_until_complete(foreign())
        assert session._loop is None  # type: ignore[attr-defined]

        async def rightful() -> int:
            async with q.acquire_all("k", ["session", "global"]) as held:
                return held["session"].token

        assert loop_a.run_until_complete(rightful()) > 0
        assert session._loop is loop_a  # type: ignore[attr-defined]
        multi = None
        gc.collect()  # (its warning comes here, under this test's filter)
    finally:
        loop_a.close()
        loop_b.close()


@pytest.mark.timeout(10)
@pytest.mark.parametrize("kind", ["session", "counting"])
def test_asyncio_run_ending_with_pending_tasks_leaves_lane_quiet(kind: str) -> None:
    """asyncio.run cancels the tasks still pending when main returns: a task inside
    ``async with`` releases, a task in line withdraws, so the lane is quiet after the
    loop closed and the next loop may use it."""
    lane = make(kind)
    cap = 1 if kind == "session" else 2

    async def first() -> None:
        async def user(key: str) -> None:
            async with lane.acquire(key):
                await asyncio.Event().wait()

        # cap holders and two waiters, left pending (asyncio.run keeps them referenced)
        tasks = [asyncio.create_task(user("k")) for _ in range(cap + 2)]
        await asyncio.sleep(0)
        assert not any(t.done() for t in tasks)
        assert lane.active_count == cap and lane.waiting == 2

    asyncio.run(first())
    st = lane.stats
    assert st.holders == 0 and st.waiters == 0 and st.cancelled == 2
    assert st.acquired == st.released == cap

    async def second() -> None:
        async with lane.acquire("k", timeout_s=0):
            pass

    asyncio.run(second())
