"""A waiter whose poll runs late in its own process (its turn among the process's calls
in flight comes late: a backlog of polls, as in ``lanequeue replay --backend ... --speed
600``) keeps its place and takes its grant at once: against a real redis-server.

Two faults made a run of the replay collapse (makespan 3 to 20 times the ideal):

- a hand-off that reached a waiter while its poll waited for a permit of the process's
  bound on calls in flight was seen only once that permit came and the poll's reply
  (a confirm) returned, seconds later, while the key or permit sat idle;
- a waiter whose poll waited that long for its turn outlived its liveness window
  (3 polls + 1 s), was dropped from its line as dead and rejoined at its tail (a
  conversation's turns ran out of order; keys and permits idle until its next poll).

The interleavings are driven: the test holds every permit of the waiter's process
itself, and a hooked bounded wait sends the waiter to its poll at the moment chosen. The
only sleep lets the waiter's nominal liveness window run out on purpose.
"""

from __future__ import annotations

import asyncio
import threading
import time
from typing import Any

import pytest
import redis
import redis.asyncio

from lanequeue.redis import AsyncRedisSessionLane, RedisSessionLane
from lanequeue.redis._wake import AsyncSlots, Woken, async_waker, sync_waker

pytestmark = pytest.mark.timeout(30)


class ThreadWaiter(RedisSessionLane):
    """The waiter's first bounded wait ends (as if it ran out) when the test sets
    ``go_poll``, so it polls at the moment chosen; later waits are the lane's own.
    Records the replies of its acquire scripts."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.go_poll = threading.Event()
        self.replies: list[Any] = []
        self._first = True

    def _wait_wake(self, owner: str, block: float) -> int:
        if self._first:
            self._first = False
            assert self.go_poll.wait(10)
            return 0
        return super()._wait_wake(owner, block)

    def _run(self, op: str, key: str | None, call: Any) -> Any:
        reply = super()._run(op, key, call)
        if op == "acquire":
            self.replies.append(reply)
        return reply


class TaskWaiter(AsyncRedisSessionLane):
    """:class:`ThreadWaiter` for a task."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.go_poll = asyncio.Event()
        self.replies: list[Any] = []
        self._first = True

    async def _wait_wake(self, owner: str, block: float) -> int:
        if self._first:
            self._first = False
            await self.go_poll.wait()
            return 0
        return await super()._wait_wake(owner, block)

    async def _run(self, op: str, key: str | None, call: Any) -> Any:
        reply = await super()._run(op, key, call)
        if op == "acquire":
            self.replies.append(reply)
        return reply


def _hold_every_permit(slots: AsyncSlots) -> int:
    taken = 0
    while slots.try_take():
        taken += 1
    return taken


async def _in_line_for_a_permit(wk: Any) -> None:
    """Return once a waiter's poll waits in line for a permit of ``wk.slots``."""
    deadline = time.monotonic() + 5
    while not wk._polls:
        assert time.monotonic() < deadline
        await asyncio.sleep(0.001)


def test_task_poll_waiting_for_its_turn_takes_the_grant_at_once(
    redis_server: Any, redis_client: redis.Redis, redis_prefix: str
) -> None:
    """A task's poll waits for a permit (all in use); the key is handed to it meanwhile
    (a full lease, in the wake-up): it holds at once, while every permit is still in
    use, and its poll is never sent."""
    holder = RedisSessionLane(redis_client, prefix=redis_prefix)
    assert holder.try_acquire("k")

    async def main() -> None:
        r = redis.asyncio.Redis(host=redis_server.host, port=redis_server.port)
        try:
            lane = TaskWaiter(r, prefix=redis_prefix, timeout_s=20)
            task = asyncio.get_running_loop().create_task(lane.acquire_timeout("k", 20))
            while not lane.waiting:  # in line (its first script answered)
                await asyncio.sleep(0.001)
            assert await lane.waiting_for("k") == 1
            wk = async_waker(r)
            taken = _hold_every_permit(wk.slots)
            assert taken == wk.slots.n
            lane.go_poll.set()  # its wait "ran out": it polls, and waits for a permit
            await _in_line_for_a_permit(wk)
            # The holder releases from another client: the hand-off grants the waiter a
            # full lease and publishes it in the wake-up.
            await asyncio.to_thread(holder.manual_release, "k")
            assert await asyncio.wait_for(task, 5) is True  # permits still all in use
            assert wk.slots.free == 0
            assert isinstance(lane.replies[-1], Woken)  # the poll was not sent
            assert lane.active_count == 1 and lane.get_active().keys() == {"k"}
            for _ in range(taken):
                wk.slots.release()
            assert await lane.is_held("k") and await lane.waiting_for("k") == 0
            assert await lane.manual_release("k")
            assert not await lane.is_held("k")
        finally:
            await r.aclose()

    asyncio.run(main())


def test_thread_poll_that_gets_its_permit_after_its_grant_sends_nothing(
    redis_server: Any, redis_client: redis.Redis, redis_prefix: str
) -> None:
    """The thread face: a poll that waited for its permit while the key was handed to
    its waiter sends no acquire once the permit comes: the grant is taken from the
    wake-up."""
    holder = RedisSessionLane(redis_client, prefix=redis_prefix)
    assert holder.try_acquire("k")
    r = redis.Redis(host=redis_server.host, port=redis_server.port)
    try:
        lane = ThreadWaiter(r, prefix=redis_prefix, timeout_s=20)
        box: dict[str, bool] = {}
        t = threading.Thread(target=lambda: box.setdefault("ok", lane.acquire_timeout("k", 20)))
        t.start()
        deadline = time.monotonic() + 5
        while not lane.waiting:
            assert time.monotonic() < deadline
            time.sleep(0.001)
        wk = sync_waker(r)
        permits = [wk.slots.take() for _ in range(wk.slots.n)]
        lane.go_poll.set()
        assert holder.manual_release("k")  # handed to the waiter, token in its wake-up
        deadline = time.monotonic() + 5
        while not wk._tokens:  # the listener has the wake-up
            assert time.monotonic() < deadline
            time.sleep(0.001)
        for p in permits:
            wk.slots.give(p)
        t.join(5)
        assert box == {"ok": True}
        assert isinstance(lane.replies[-1], Woken)
        assert lane.is_held("k") and lane.manual_release("k")
    finally:
        r.close()


def test_waiter_whose_polls_run_late_keeps_its_place_in_line(
    redis_server: Any, redis_client: redis.Redis, redis_prefix: str
) -> None:
    """A waiter whose process runs its polls late (measured: they waited for a turn
    among the calls in flight) gets a liveness window that counts it: held back in its
    process longer than its nominal window (3 polls + 1 s = 1.3 s at lease_s=0.3), it is
    still first in line when the key is handed on, ahead of a waiter of another client
    that polled all along; it holds, then the other."""
    holder = RedisSessionLane(redis_client, prefix=redis_prefix, lease_s=0.3)
    assert holder.try_acquire("k")
    other = RedisSessionLane(redis_client, prefix=redis_prefix, lease_s=0.3, timeout_s=20)
    other_box: dict[str, float] = {}

    def other_waits() -> None:
        if other.acquire_timeout("k", 20):
            other_box["at"] = time.monotonic()

    async def main() -> None:
        r = redis.asyncio.Redis(host=redis_server.host, port=redis_server.port)
        try:
            lane = TaskWaiter(r, prefix=redis_prefix, lease_s=0.3, timeout_s=20)
            nominal_s = lane._live_ms / 1000
            assert nominal_s == pytest.approx(1.3)
            wk = async_waker(r)
            # This process's polls ran 2 s late a moment ago (a backlog of polls).
            wk.lateness.note(2.0, time.monotonic())
            task = asyncio.get_running_loop().create_task(lane.acquire_timeout("k", 20))
            while not lane.waiting:
                await asyncio.sleep(0.001)
            t = threading.Thread(target=other_waits)
            t.start()
            while await lane.waiting_for("k") != 2:  # the other waiter is behind it
                await asyncio.sleep(0.001)
            taken = _hold_every_permit(wk.slots)
            lane.go_poll.set()
            await _in_line_for_a_permit(wk)
            await asyncio.sleep(nominal_s + 0.3)  # its nominal window has run out
            await asyncio.to_thread(holder.manual_release, "k")
            for _ in range(taken):  # (a grant as old as this one is renewed first)
                wk.slots.release()
            assert await asyncio.wait_for(task, 5) is True
            assert "at" not in other_box  # still waiting behind it
            assert await lane.manual_release("k")
            await asyncio.to_thread(t.join, 5)
            assert "at" in other_box
        finally:
            await r.aclose()

    asyncio.run(main())
    assert other.manual_release("k")


def test_lateness_lengthens_the_liveness_window_and_fades(
    redis_client: redis.Redis, redis_prefix: str
) -> None:
    """The liveness window a poll sends is 3 polls + 1 s with each poll counted as long
    as this process's polls lately took; the lateness halves every HALF_LIFE_S."""
    lane = RedisSessionLane(redis_client, prefix=redis_prefix, lease_s=3.0)
    wk = lane._wk()
    poll, live_ms = lane._poll_plan()
    assert (poll, live_ms) == (1.0, 4000)
    now = time.monotonic()
    wk.lateness.note(2.0, now)
    assert wk.lateness.value(now) == 2.0
    poll, live_ms = lane._poll_plan()
    assert poll == 1.0 and 9000 < live_ms <= 10000  # 3 * (1 + ~2) + 1 s
    assert wk.lateness.value(now + wk.lateness.HALF_LIFE_S) == pytest.approx(1.0)
    wk.lateness.note(0.5, now)  # smaller than the recent one: kept
    assert wk.lateness.value(now) == 2.0


def test_every_wait_for_a_permit_is_noted_as_lateness() -> None:
    """A call that waited for a permit of the process's bound (any call, not only a
    poll) notes its wait as the process's lateness as it ends, so the next polls send
    longer windows before any of them has run late."""
    from lanequeue.redis._wake import Lateness

    async def main() -> float:
        lateness = Lateness()
        slots = AsyncSlots(1, lateness)
        assert slots.try_take() and slots.locked()
        waiter = asyncio.get_running_loop().create_task(slots.acquire())
        held_s = 0.05
        await asyncio.sleep(held_s)  # the waiter waits this long for the permit
        slots.release()
        assert await waiter is True
        slots.release()
        assert slots.free == 1
        return lateness.value(time.monotonic()) / held_s

    assert asyncio.run(main()) >= 0.99
