"""Cancellation of ``AsyncLaneQueue.acquire_all`` over two asyncio Redis lanes, against a
real redis-server: the task is cancelled at EVERY step of the call (each time it
suspends: a script call, a wait for a wake-up, the block's own await, each release),
once, or once and again at every step after (a caller that keeps cancelling while the
roll-back runs), uncontended and contended (both lanes handed over by another holder).
After each run nothing stays held, on Redis or in the lane objects, and the counters
add up (every grant released and counted so, nothing lost, nobody left waiting).

Also: a release that fails does not stop the releases after it (thread face and
asyncio face), and a cancellation during a release lets that release finish and count.
"""

from __future__ import annotations

import asyncio
import sys
import time
from collections.abc import Awaitable, Callable, Coroutine, Generator
from typing import Any

import pytest
import redis
import redis.asyncio as aredis

from lanequeue import LaneQueue, LeaseLostError
from lanequeue.aio import AsyncLaneQueue
from lanequeue.redis import AsyncRedisLane, AsyncRedisSessionLane, RedisLane, RedisSessionLane

pytestmark = pytest.mark.timeout(120)

LEASE_S = 5.0


class CancelAtStep:
    """Runs ``coro`` as the body of ``task`` and cancels that task when the body suspends
    for the ``at``-th time (``again``: and at every suspension after that). ``steps``
    counts the suspensions. The cancel is scheduled at the suspension itself, so it
    lands while the task waits there."""

    def __init__(self, coro: Coroutine[Any, Any, Any], at: int, again: bool) -> None:
        self.coro, self.at, self.again = coro, at, again
        self.steps = 0
        self.task: asyncio.Task[Any] | None = None

    def __await__(self) -> Generator[Any, Any, Any]:
        return self  # type: ignore[return-value]  # (a generator-like: send/throw)

    def __iter__(self) -> CancelAtStep:
        return self

    def __next__(self) -> Any:
        return self.send(None)

    def send(self, value: Any) -> Any:
        return self._step(self.coro.send, value)

    def throw(self, *exc: Any) -> Any:
        return self._step(self.coro.throw, *exc)

    def close(self) -> None:
        self.coro.close()

    def _step(self, fn: Callable[..., Any], *args: Any) -> Any:
        out = fn(*args)  # (StopIteration ends the body)
        self.steps += 1
        if self.steps == self.at or (self.again and self.steps > self.at):
            assert self.task is not None
            asyncio.get_running_loop().call_soon(self.task.cancel)
        return out


def start(coro: Coroutine[Any, Any, Any], at: int, again: bool) -> tuple[
        asyncio.Task[Any], CancelAtStep]:
    stepper = CancelAtStep(coro, at, again)

    async def body() -> Any:
        return await stepper

    task = asyncio.get_running_loop().create_task(body())
    stepper.task = task
    return task, stepper


async def until(pred: Callable[[], Awaitable[bool]], what: str, timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while not await pred():
        assert time.monotonic() < deadline, what
        await asyncio.sleep(0.002)


def assert_counts_add_up(lane: Any) -> None:
    """Every grant of ``lane`` (this object) was released and counted so."""
    st = lane.stats
    assert (st.holders, st.waiters, lane.active_count, lane.waiting) == (0, 0, 0, 0), lane
    assert st.acquired == st.released, (lane, st)
    assert (lane.leases_lost, st.unmatched_releases) == (0, 0), (lane, st)


@pytest.mark.parametrize("socket_timeout", [None, 5.0], ids=["no-socket-timeout",
                                                           "socket-timeout"])
@pytest.mark.parametrize("again", [False, True], ids=["cancel-once", "cancel-every-step"])
@pytest.mark.parametrize("contended", [False, True], ids=["uncontended", "hand-off"])
@pytest.mark.parametrize("both", [True, False], ids=["acquire_all", "one-lane"])
def test_acquire_all_cancelled_at_every_step_leaves_nothing_held(
    redis_server: Any, redis_prefix: str, both: bool, contended: bool, again: bool,
    socket_timeout: float | None,
) -> None:
    """acquire_all(key, ["s", "g"]) over an AsyncRedisSessionLane and an AsyncRedisLane
    (one permit), cancelled at its n-th step for n = 1, 2, ... until a run finishes before
    its n-th step. Contended: another holder (lane objects of its own) has the key on "s"
    and the one permit of "g"; it releases "s" once the task waits for it, then "g" once
    the task waits for that, so the task gets both by hand-off. Each run: the task ends
    with CancelledError (or, in the last run, normally); then nobody holds the key or the
    permit on Redis, nobody waits, and each lane object's counters add up. ("one-lane":
    the same with ``async with s.acquire(key)`` alone.)

    Without a socket timeout every step of redis-py is a plain await, so the steps are
    the same in every run. With one (redis-py's default is 5 s), each send is wrapped in
    ``asyncio.wait_for``, which on Python < 3.12 drops a cancellation that arrives as
    the send completes; the lanes see that the task's count of cancellation requests
    grew and deliver it (Python 3.11+; on 3.10 such a run goes on uncancelled, and must
    leave nothing held either)."""

    async def main() -> None:
        client = aredis.Redis(host=redis_server.host, port=redis_server.port,
                              socket_timeout=socket_timeout)
        try:
            await sweep(client)
        finally:
            await client.aclose()

    async def sweep(client: aredis.Redis) -> None:
        def lanes() -> tuple[AsyncRedisSessionLane, AsyncRedisLane]:
            return (AsyncRedisSessionLane(client, "s", prefix=redis_prefix, lease_s=LEASE_S),
                    AsyncRedisLane(client, "g", max_concurrent=1, prefix=redis_prefix,
                                   lease_s=LEASE_S))

        s, g = lanes()
        other_s, other_g = lanes()  # the other holder's lane objects
        queue = AsyncLaneQueue()
        queue.add(s)
        queue.add(g)
        entered = 0
        # Warm up: first-use checks and the wake-up listener, so each run takes one path.
        async with queue.acquire_all("warm-up", ["s", "g"]):
            pass
        async with other_s.acquire("warm-up"), other_g.acquire("warm-up"):
            pass
        cancelled_runs = 0
        at = 1
        while True:
            key = f"k{at}"
            if contended:
                hs = other_s.acquire(key)
                await hs.__aenter__()
                hg = other_g.acquire(key)
                await hg.__aenter__()

            async def request(key: str = key) -> None:
                nonlocal entered
                async with (queue.acquire_all(key, ["s", "g"], timeout_s=30) if both
                            else s.acquire(key, timeout_s=30)):
                    entered += 1
                    await asyncio.sleep(0)

            task, stepper = start(request(), at, again)
            if contended:
                # Hand each lane over once the task waits for it (or has ended).
                await in_line_or_done(s, task)
                await hs.release()
                if both:
                    await in_line_or_done(g, task)
                await hg.release()
            try:
                await task
                finished = True
            except asyncio.CancelledError:
                finished = False
                cancelled_runs += 1
            assert task.done()

            async def free(key: str = key) -> bool:
                status = await g.lane_status()
                return (not await s.is_held(key) and await s.waiting_for(key) == 0
                        and status["active"] == 0 and status["waiting"] == 0)

            await until(free, f"cancelled at step {at} of {stepper.steps}: key still held")
            for lane in (s, g, other_s, other_g):
                assert_counts_add_up(lane)
            if finished and stepper.steps < at:
                break
            if finished:  # its cancel was dropped (see above)
                assert socket_timeout is not None and sys.version_info < (3, 11)
            at += 1
        # Every step was a cancel point, until the whole call (the grants, the block,
        # the releases) ran in fewer steps than the point of the cancel.
        steps = (7 if contended else 5) if both else (4 if contended else 3)
        if socket_timeout is None or sys.version_info >= (3, 11):
            assert cancelled_runs == at - 1 >= steps, cancelled_runs
        assert at - 1 >= steps and cancelled_runs >= 3
        assert entered >= 2  # the block itself was among the steps cancelled

    asyncio.run(main())


async def in_line_or_done(lane: Any, task: asyncio.Task[Any]) -> None:
    """Wait until ``task`` waits in line on ``lane`` (this lane object), or has ended."""
    deadline = time.monotonic() + 5.0
    while lane.waiting != 1 and not task.done():
        assert time.monotonic() < deadline, "the task neither waits nor ended"
        await asyncio.sleep(0.001)


@pytest.mark.parametrize("outer", ["acquire_all", "acquire"])
def test_a_slow_finally_between_blocks_does_not_spend_the_cancel_wait(
    redis_server: Any, redis_prefix: str, monkeypatch: pytest.MonkeyPatch, outer: str
) -> None:
    """A cancelled task leaves an inner Redis block (released at once: the server is
    healthy), then runs its own ``finally`` for longer than CANCEL_WAIT_S, then leaves
    the outer block (``acquire_all`` over two Redis lanes, or a Redis hold). Observed
    before: the inner release had started the cancellation's CANCEL_WAIT_S, so none was
    left for the outer releases, which went to the background unawaited: the task ended
    with its outer lanes still held. Expected: a clean-up that ended within its wait
    spends none of it; when the task ends, nothing is held."""
    from lanequeue import aio as aio_module
    from lanequeue.redis import _async as redis_async

    wait_s = 0.3
    monkeypatch.setattr(aio_module, "CANCEL_WAIT_S", wait_s)
    monkeypatch.setattr(redis_async, "CANCEL_WAIT_S", wait_s)

    async def main() -> None:
        client = aredis.Redis(host=redis_server.host, port=redis_server.port)
        try:
            queue = AsyncLaneQueue()
            queue.add(AsyncRedisSessionLane(client, "s", prefix=redis_prefix, lease_s=LEASE_S))
            queue.add(AsyncRedisLane(client, "g", max_concurrent=1, prefix=redis_prefix,
                                     lease_s=LEASE_S))
            h = AsyncRedisLane(client, "h", max_concurrent=1, prefix=redis_prefix,
                               lease_s=LEASE_S)
            inside = asyncio.Event()

            def outer_block() -> Any:
                if outer == "acquire_all":
                    return queue.acquire_all("k", ["s", "g"])
                return queue["g"].acquire("k")

            async def turn() -> None:
                async with outer_block():
                    try:
                        async with h.acquire("k"):
                            inside.set()
                            await asyncio.Event().wait()
                    finally:
                        await asyncio.sleep(2 * wait_s)  # the task's own clean-up

            task = asyncio.create_task(turn())
            await inside.wait()
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
            assert not await queue["s"].is_held("k")
            assert await queue["g"].try_acquire("other")  # its one permit is free
            await queue["g"].manual_release("other")
            assert await h.try_acquire("other")
            await h.manual_release("other")
        finally:
            await client.aclose()

    asyncio.run(main())


def test_cancelled_release_finishes_and_counts(redis_server: Any, redis_prefix: str) -> None:
    """A task cancelled while its hold's release script is on its way: the release runs
    to its end, the key is free, and it counts as released (not as a guess)."""

    async def main() -> None:
        client = aredis.Redis(host=redis_server.host, port=redis_server.port)
        try:
            lane = AsyncRedisSessionLane(client, "s", prefix=redis_prefix, lease_s=LEASE_S)
            hold = lane.acquire("k")
            await hold.__aenter__()
            release = asyncio.get_running_loop().create_task(hold.release())
            await asyncio.sleep(0)  # the release script is sent; its reply is not in
            assert not release.done()
            release.cancel()
            with pytest.raises(asyncio.CancelledError):
                await release
            assert not await lane.is_held("k")
            assert_counts_add_up(lane)
            assert lane.stats.released == 1
        finally:
            await client.aclose()

    asyncio.run(main())


def test_a_failed_release_does_not_stop_the_others_threads(
    redis_server: Any, redis_prefix: str
) -> None:
    """LaneQueue over two Redis lanes: the hold taken last lost its lease, so its release
    raises LeaseLostError on leaving the block; the hold taken first is still released."""
    client = redis.Redis(host=redis_server.host, port=redis_server.port)
    try:
        s = RedisSessionLane(client, "s", prefix=redis_prefix, lease_s=LEASE_S)
        g = RedisLane(client, "g", max_concurrent=2, prefix=redis_prefix, lease_s=0.5)
        queue = LaneQueue()
        queue.add(s)
        queue.add(g)
        with pytest.raises(LeaseLostError), queue.acquire_all("k", ["s", "g"]) as holds:
            holds["g"]._suspend_renewal()  # test hook: its lease runs out in the block
            time.sleep(0.6)
            assert holds["g"].lost
        assert not s.is_held("k")
        assert s.stats.released == 1 and s.active_count == 0
    finally:
        client.close()


def test_a_failed_release_does_not_stop_the_others_asyncio(
    redis_server: Any, redis_prefix: str
) -> None:
    """The same on AsyncLaneQueue over two asyncio Redis lanes."""

    async def main() -> None:
        client = aredis.Redis(host=redis_server.host, port=redis_server.port)
        try:
            s = AsyncRedisSessionLane(client, "s", prefix=redis_prefix, lease_s=LEASE_S)
            g = AsyncRedisLane(client, "g", max_concurrent=2, prefix=redis_prefix,
                               lease_s=0.5)
            queue = AsyncLaneQueue()
            queue.add(s)
            queue.add(g)
            with pytest.raises(LeaseLostError):
                async with queue.acquire_all("k", ["s", "g"]) as holds:
                    holds["g"]._suspend_renewal()
                    await asyncio.sleep(0.6)
                    assert holds["g"].lost
            assert not await s.is_held("k")
            assert s.stats.released == 1 and s.active_count == 0
        finally:
            await client.aclose()

    asyncio.run(main())


@pytest.mark.parametrize("kind", ["session", "counting"])
def test_asyncio_run_closing_its_loop_lets_a_slow_clean_up_finish(
    own_server: Any, kind: str
) -> None:
    """``asyncio.run`` cancels its tasks, waits for them, then closes the loop. A holder
    and a waiter are cancelled there while the server holds every write for 1.5 s
    (``CLIENT PAUSE ... WRITE``), so their release and withdraw outlast the tasks' own
    wait for them (``CANCEL_WAIT_S``). Those clean-ups were cancelled with the loop's
    tasks, or destroyed pending when it closed, leaving the key held in Redis for its
    whole lease; now ``asyncio.run`` returns once they are done: nothing held, nobody in
    line, as soon as it returns."""
    r = redis.Redis(host=own_server.host, port=own_server.port)
    prefix = f"close{time.monotonic_ns()}"

    async def main() -> None:
        client = aredis.Redis(host=own_server.host, port=own_server.port)
        lane: Any = (AsyncRedisSessionLane(client, "s", prefix=prefix, lease_s=30)
                     if kind == "session" else
                     AsyncRedisLane(client, "s", max_concurrent=1, prefix=prefix, lease_s=30))
        inside = asyncio.Event()

        async def holder() -> None:
            async with lane.acquire("k"):
                inside.set()
                await asyncio.Event().wait()  # until asyncio.run cancels it

        async def waiter() -> None:
            async with lane.acquire("k"):
                pass

        tasks = [asyncio.create_task(holder())]
        await asyncio.wait_for(inside.wait(), 5)
        tasks.append(asyncio.create_task(waiter()))
        deadline = time.monotonic() + 5
        while lane.waiting == 0:
            assert time.monotonic() < deadline
            await asyncio.sleep(0.01)
        await asyncio.sleep(0.1)  # (its join script answered: in line in Redis)
        r.execute_command("CLIENT", "PAUSE", 1500, "WRITE")
        # main returns: asyncio.run cancels the holder and the waiter

    asyncio.run(main())
    # Plain reads, which the pause lets through: what Redis holds right now.
    held = [k for k in r.scan_iter(match=f"*{prefix}*:h") if r.type(k) != b"none"]
    assert held == []
    if kind == "session":
        check = RedisSessionLane(r, "s", prefix=prefix)
        assert check.waiting_for("k") == 0 and not check.is_held("k")
    else:
        status = RedisLane(r, "s", max_concurrent=1, prefix=prefix).lane_status()
        assert (status["active"], status["waiting"]) == (0, 0)


def test_a_clean_up_failing_at_loop_shutdown_ends_within_its_bound_and_is_counted(
    own_server: Any, caplog: pytest.LogCaptureFixture
) -> None:
    """``asyncio.run`` cancels a holder while the server is frozen: its release (which
    refuses cancellation, and which the closing loop waits for) fails within the
    client's 0.5 s socket timeout, so ``asyncio.run`` returns within a few of those
    bounds, never hangs; the hold is counted once (in ``unmatched_releases``: its lease
    lapses), and asyncio reports no error of its own."""
    import logging

    lanes: list[Any] = []

    async def main() -> None:
        client = aredis.Redis(host=own_server.host, port=own_server.port, socket_timeout=0.5)
        lane = AsyncRedisSessionLane(client, "s", lease_s=30)
        lanes.append(lane)
        inside = asyncio.Event()

        async def holder() -> None:
            async with lane.acquire("k"):
                inside.set()
                await asyncio.Event().wait()  # until asyncio.run cancels it

        lanes.append(asyncio.create_task(holder()))  # (kept: asyncio.run cancels it)
        await asyncio.wait_for(inside.wait(), 5)
        own_server.freeze()

    try:
        with caplog.at_level(logging.DEBUG, logger="asyncio"):
            started = time.monotonic()
            asyncio.run(main())
            took = time.monotonic() - started
    finally:
        own_server.thaw()
    assert took < 5.0
    assert not [r for r in caplog.records if r.name == "asyncio" and r.levelno >= logging.ERROR]
    stats = lanes[0].stats
    assert (stats.acquired, stats.released + stats.unmatched_releases) == (1, 1)


def test_many_clean_ups_at_loop_shutdown_on_a_frozen_server_end_within_one_bound(
    own_server: Any,
) -> None:
    """40 holders of two lanes are cancelled by ``asyncio.run`` while the server is
    frozen: 80 releases queue behind a few freeing slots. Each release's bound covers its
    wait for a slot too, so all fail within about one 0.5 s socket timeout (they took
    one bound per slot's turn, 10 s here, and past 30 s the loop closed under the rest,
    which left their holds counted nowhere); every hold is counted once."""
    lanes: list[Any] = []
    n = 40

    async def main() -> None:
        client = aredis.Redis(host=own_server.host, port=own_server.port, socket_timeout=0.5)
        s = AsyncRedisSessionLane(client, "s", lease_s=30)
        g = AsyncRedisLane(client, "g", max_concurrent=n, lease_s=30)
        lanes.extend([s, g])
        inside = [0]

        async def holder(i: int) -> None:
            async with s.acquire(f"k{i}"), g.acquire(f"k{i}"):
                inside[0] += 1
                await asyncio.Event().wait()  # until asyncio.run cancels it

        lanes.extend(asyncio.create_task(holder(i)) for i in range(n))
        deadline = time.monotonic() + 10
        while inside[0] < n:
            assert time.monotonic() < deadline
            await asyncio.sleep(0.01)
        own_server.freeze()

    try:
        started = time.monotonic()
        asyncio.run(main())
        took = time.monotonic() - started
    finally:
        own_server.thaw()
    assert took < 5.0, took
    for lane in lanes[:2]:
        st = lane.stats
        assert (st.acquired, st.released + st.unmatched_releases, st.holders) == (n, n, 0)


def test_the_clean_up_guard_keeps_no_loop_alive() -> None:
    """Each loop that ran a clean-up gets a guard (an async generator that refers to its
    loop); kept in a table, it kept every such loop alive for good. The loop now keeps
    it: both go with the loop."""
    import gc
    import weakref

    from lanequeue.redis._async import _start_cleanup

    loops: list[weakref.ref[Any]] = []

    async def nothing() -> None:
        pass

    async def main() -> None:
        loops.append(weakref.ref(asyncio.get_running_loop()))
        await _start_cleanup(nothing())

    for _ in range(5):
        asyncio.run(main())
    gc.collect()
    assert [r for r in loops if r() is not None] == []


def test_a_hold_dropped_after_its_loop_closed_leaves_holders_at_once(
    redis_server: Any, redis_prefix: str
) -> None:
    """The renewer task ends with its loop; a hold dropped after that has nobody to
    release it. It leaves ``holders`` at once, counted in ``unmatched_releases`` (its
    lease lapses), so ``wait_idle`` is True; it stayed in ``holders`` for good."""
    import gc
    import warnings

    client = aredis.Redis(host=redis_server.host, port=redis_server.port)
    lane = AsyncRedisSessionLane(client, "s", prefix=redis_prefix, lease_s=3)

    async def main() -> Any:
        hold = lane.acquire("k")
        await hold.__aenter__()
        return hold

    hold = asyncio.run(main())
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ResourceWarning)
        del hold
        gc.collect()
    st = lane.stats
    assert (st.acquired, st.holders, st.unmatched_releases) == (1, 0, 1)
    assert asyncio.run(lane.wait_idle(0))
