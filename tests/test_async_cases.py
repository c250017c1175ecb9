"""C10-C14 of shared/cases/HANDED.md: cancellation and timeouts on the asyncio face.

Every interleaving is driven by the event loop's own ordering, not by sleeps:

- ``await asyncio.sleep(0)`` in the test's main task yields exactly once: every callback
  that was already ready (a woken task's step, a ``call_soon`` callback) runs before main
  resumes; callbacks scheduled by those run only after main's next ``sleep(0)``. One
  ``sleep(0)`` is therefore one "loop turn" as seen from main.
- "In one synchronous step" means plain code with no ``await`` between its statements
  (in main, or in a ``loop.call_soon`` callback).
"""

from __future__ import annotations

import asyncio
from collections import defaultdict
from collections.abc import Callable
from typing import Any

import pytest

from lanequeue import AsyncLane, AsyncSessionLane, LaneTimeoutError


class FakeClock:
    def __init__(self, start: float = 1000.0) -> None:
        self.now = start

    def __call__(self) -> float:
        return self.now


async def turns_until(pred: Callable[[], bool], max_turns: int) -> int:
    """Yield with ``sleep(0)`` until ``pred()`` holds; return how many turns it took.
    Fails if it does not hold within ``max_turns``."""
    for n in range(max_turns + 1):
        if pred():
            return n
        await asyncio.sleep(0)
    raise AssertionError(f"condition not reached within {max_turns} loop turns")


def books_balanced(lane: Any) -> None:
    st = lane.stats
    assert st.acquired - st.released == st.holders == lane.active_count
    assert st.waiters == lane.waiting
    assert st.unmatched_releases == 0


# -- C10 ---------------------------------------------------------------------------------


@pytest.mark.timeout(10)
@pytest.mark.parametrize("order", ["release_then_cancel", "cancel_then_release"])
def test_c10_woken_then_cancelled(order: str) -> None:
    """AL max 1: T0 holds; W1, W2 wait. In one synchronous step T0 releases and W1 is
    cancelled (both orders of the two statements). W1 raises CancelledError holding
    nothing; W2 acquires within one loop turn; afterwards the lane is fully available."""

    async def main() -> None:
        lane = AsyncLane("l", max_concurrent=1, timeout_s=None)
        assert lane.try_acquire_nowait("t0")  # T0 is main itself
        inside: list[str] = []
        gate = asyncio.Event()

        async def waiter(name: str) -> None:
            async with lane.acquire(name):
                inside.append(name)
                await gate.wait()

        w1 = asyncio.create_task(waiter("w1"))
        await asyncio.sleep(0)
        assert lane.waiting == 1
        w2 = asyncio.create_task(waiter("w2"))
        await asyncio.sleep(0)
        assert lane.waiting == 2

        # The synchronous step: no await between the two statements.
        if order == "release_then_cancel":
            assert lane.manual_release_nowait("t0")  # hands the permit to W1 ...
            w1.cancel()  # ... which is cancelled before it resumed
        else:
            w1.cancel()  # W1's future is cancelled: it refuses the grant ...
            assert lane.manual_release_nowait("t0")  # ... so the permit goes straight to W2

        # "Within one loop turn" for W2: we allow 2 sleep(0)s. Release-then-cancel needs
        # both: turn 1, W1 resumes with CancelledError and passes the permit it was handed
        # on to W2 (W2's wake-up is scheduled in that step); turn 2, W2 resumes. With
        # cancel-then-release W2 is granted inside the step itself and resumes in turn 1.
        await turns_until(lambda: inside == ["w2"], max_turns=2)
        assert w1.done() and w1.cancelled()
        assert lane.holds_of_nowait("w1") == 0
        assert lane.holds_of_nowait("w2") == 1
        assert lane.active_count == 1 and lane.waiting == 0
        books_balanced(lane)

        gate.set()
        await w2
        assert lane.available == 1 and lane.active_count == 0 and lane.waiting == 0
        assert lane.get_active() == {}
        books_balanced(lane)
        # Fully available: one permit, not more.
        assert lane.try_acquire_nowait("x")
        assert not lane.try_acquire_nowait("y")
        assert lane.manual_release_nowait("x")
        assert lane.available == 1

    asyncio.run(main())


# -- C11 ---------------------------------------------------------------------------------


@pytest.mark.timeout(10)
@pytest.mark.parametrize("order", ["cancel_then_release", "release_then_cancel"])
def test_c11_cancel_and_release_in_one_callback(order: str) -> None:
    """ASL "k": T0 holds; T1, T2, T3 wait; a plain loop callback cancels T1 then releases
    "k" (the case), and the same kind with the two statements swapped. Never two tasks
    inside "k"; T2 then T3 acquire; T1 ends cancelled."""

    async def main() -> None:
        lane = AsyncSessionLane("s", timeout_s=None)
        loop = asyncio.get_running_loop()
        assert lane.try_acquire_nowait("k")  # T0
        inside = 0
        max_inside = 0
        entered: list[str] = []

        async def waiter(name: str) -> None:
            nonlocal inside, max_inside
            async with lane.acquire("k"):
                inside += 1
                max_inside = max(max_inside, inside)
                entered.append(name)
                for _ in range(3):  # stay inside across a few loop turns
                    await asyncio.sleep(0)
                inside -= 1

        tasks = {}
        for name in ("t1", "t2", "t3"):
            tasks[name] = asyncio.create_task(waiter(name))
            await asyncio.sleep(0)
        assert lane.waiting_for_nowait("k") == 3

        seen: dict[str, Any] = {}

        def callback() -> None:
            if order == "cancel_then_release":
                tasks["t1"].cancel()
                assert lane.manual_release_nowait("k")
            else:
                assert lane.manual_release_nowait("k")
                tasks["t1"].cancel()
            seen["held"] = lane.is_held_nowait("k")
            seen["waiting"] = lane.waiting_for_nowait("k")

        loop.call_soon(callback)
        await asyncio.gather(*tasks.values(), return_exceptions=True)

        assert seen["held"] is True  # "k" never went free: it was handed on
        # cancel-then-release: T1 refused the grant, T2 holds, T3 waits.
        # release-then-cancel: T1 was granted, T2 and T3 still in line until T1 unwinds.
        assert seen["waiting"] == (1 if order == "cancel_then_release" else 2)
        assert tasks["t1"].cancelled()
        assert entered == ["t2", "t3"]
        assert max_inside == 1
        assert not lane.is_held_nowait("k") and lane.waiting == 0 and lane.active_count == 0
        books_balanced(lane)

    asyncio.run(main())


# -- C12 ---------------------------------------------------------------------------------


@pytest.mark.timeout(10)
def test_c12_hand_off_to_cancelled_waiter() -> None:
    """ASL: T0 holds "k", W waits. T0 cancels W then releases, no await between. W exits
    cancelled; "k" is free; a fresh acquire succeeds at once; idle eviction can later
    remove "k"."""
    clock = FakeClock()

    async def main() -> None:
        lane = AsyncSessionLane("s", idle_timeout_s=10.0, timeout_s=None, clock=clock)
        assert lane.try_acquire_nowait("k")  # T0

        async def w() -> None:
            async with lane.acquire("k"):
                raise AssertionError("W must never get 'k'")

        task = asyncio.create_task(w())
        await asyncio.sleep(0)
        assert lane.waiting_for_nowait("k") == 1

        task.cancel()
        assert lane.manual_release_nowait("k")
        # Same synchronous step, before W even unwound: "k" is free and nobody waits.
        assert not lane.is_held_nowait("k")
        assert lane.waiting_for_nowait("k") == 0 and lane.waiting == 0
        # A fresh acquire succeeds at once, even before W has run again ...
        assert lane.try_acquire_nowait("k")
        assert lane.manual_release_nowait("k")

        with pytest.raises(asyncio.CancelledError):
            await task
        assert task.cancelled()
        # ... and after W unwound (timeout 0: it must not wait at all).
        async with lane.acquire("k", timeout_s=0):
            assert lane.is_held_nowait("k")
        assert not lane.is_held_nowait("k")
        st = lane.stats
        assert st.cancelled == 1 and st.timeouts == 0 and st.holders == 0 and st.waiters == 0
        books_balanced(lane)

        # Idle eviction later removes "k".
        assert lane.session_count == 1
        clock.now += 10.0
        assert lane.cleanup_idle() == 1
        assert lane.session_count == 0
        assert lane.stats.evicted == 1

    asyncio.run(main())


# -- C13 ---------------------------------------------------------------------------------


@pytest.mark.timeout(10)
def test_c13_timed_out_waiters_do_not_return_permits() -> None:
    """AL max 2: take both permits; 5 acquirers with timeout_s=0.01 time out; release
    both. available == 2, not more; then at most 2 of 10 concurrent workers are inside."""

    async def main() -> None:
        lane = AsyncLane("l", max_concurrent=2, timeout_s=None)
        assert lane.try_acquire_nowait("a") and lane.try_acquire_nowait("b")

        async def timed(i: int) -> str:
            try:
                async with lane.acquire(f"w{i}", timeout_s=0.01):
                    return "entered"
            except LaneTimeoutError as exc:
                assert exc.lane == "l" and exc.key == f"w{i}"
                return "timeout"

        results = await asyncio.gather(*(timed(i) for i in range(5)))
        assert results == ["timeout"] * 5
        assert lane.stats.timeouts == 5 and lane.waiting == 0
        assert lane.manual_release_nowait("a") and lane.manual_release_nowait("b")
        assert lane.available == 2
        assert lane.active_count == 0
        books_balanced(lane)

        inside = 0
        max_inside = 0

        async def worker(i: int) -> None:
            nonlocal inside, max_inside
            async with lane.acquire(f"k{i}"):
                inside += 1
                max_inside = max(max_inside, inside)
                for _ in range(3):
                    await asyncio.sleep(0)
                inside -= 1

        await asyncio.gather(*(worker(i) for i in range(10)))
        assert max_inside == 2
        assert lane.available == 2
        # Capacity is exactly 2, not raised by the five timeouts.
        assert lane.try_acquire_nowait("x") and lane.try_acquire_nowait("y")
        assert not lane.try_acquire_nowait("z")
        assert lane.manual_release_nowait("x") and lane.manual_release_nowait("y")
        books_balanced(lane)

    asyncio.run(main())


# -- C14 ---------------------------------------------------------------------------------


@pytest.mark.timeout(10)
def test_c14_aborted_run_frees_its_session() -> None:
    """ASL: the task holding "s" is cancelled mid-work while 3 requests are queued on "s".
    "s" is free of that holder within one loop turn; the 3 run in arrival order and
    complete; no active key remains."""

    async def main() -> None:
        lane = AsyncSessionLane("sess", timeout_s=None)
        events: list[tuple[str, str]] = []
        per_key_inside: dict[str, int] = defaultdict(int)

        async def request(name: str, work_turns: int) -> str:
            async with lane.acquire("s"):
                per_key_inside["s"] += 1
                assert per_key_inside["s"] == 1
                events.append(("start", name))
                try:
                    for _ in range(work_turns):
                        await asyncio.sleep(0)
                finally:
                    per_key_inside["s"] -= 1
                events.append(("end", name))
                return name

        holder = asyncio.create_task(request("h", 10**9))  # "mid-work" forever
        await asyncio.sleep(0)
        assert lane.is_held_nowait("s")
        queued = []
        for name in ("q1", "q2", "q3"):
            queued.append(asyncio.create_task(request(name, 2)))
            await asyncio.sleep(0)
        assert lane.waiting_for_nowait("s") == 3

        holder.cancel()
        # One loop turn (one sleep(0)): the holder wakes with CancelledError inside its
        # body, `async with` releases on the way out and hands "s" to q1 in that same step.
        await asyncio.sleep(0)
        assert holder.cancelled()
        assert lane.waiting_for_nowait("s") == 2  # q1 was handed "s"; q2, q3 still in line
        assert lane.active_count == 1

        done = await asyncio.gather(*queued)
        assert done == ["q1", "q2", "q3"]
        assert events == [
            ("start", "h"),
            ("start", "q1"), ("end", "q1"),
            ("start", "q2"), ("end", "q2"),
            ("start", "q3"), ("end", "q3"),
        ]
        assert lane.get_active() == {}
        assert lane.active_count == 0 and lane.waiting == 0 and not lane.is_held_nowait("s")
        books_balanced(lane)

    asyncio.run(main())
