"""Interrupts and cancellations that land between a piece of bookkeeping and the flag that
says it was done, against a real redis-server.

CPython runs a signal handler (a KeyboardInterrupt) at a Python function's entry and
where a generator resumes after a plain ``yield``, among other points. The thread-face
tests below raise KeyboardInterrupt at each such point of lanequeue's code in turn, one
point per run (a trace function: deterministic), and check after every run that the
lane object's counts stay true: every hold that left ``holders`` is counted once, in
``released`` or ``unmatched_releases``; ``waiting`` never goes negative nor keeps a
waiter that left. The asyncio test freezes its own server (SIGSTOP) under a task that
is cancelled inside its block: the task ends within ``CANCEL_WAIT_S`` (README, "A frozen
server and timeouts"), its release going on in the background.
"""

from __future__ import annotations

import asyncio
import gc
import logging
import time
from typing import Any

import pytest
import redis
import redis.asyncio
from interrupt_points import Sweep, library
from redis_server import RedisServer

from lanequeue import AsyncLaneQueue
from lanequeue.redis import (
    AsyncRedisLane,
    AsyncRedisSessionLane,
    RedisLane,
    RedisSessionLane,
    _args,
)
from lanequeue.redis._async import _CLEANUPS, CANCEL_WAIT_S
from lanequeue.redis._hold import HELD, RELEASING

#: Points swept at most per run of a sweep (a run that reaches none of them ends it).
MAX_POINTS = 400

# An interrupt injected before a hold's enter began leaves that hold never entered:
# dropped, it warns so (its message says an interrupt can be the cause). Expected here.
pytestmark = pytest.mark.filterwarnings(
    "ignore:.*garbage-collected without being entered:RuntimeWarning")

#: The signal points of lanequeue's own code: where CPython checks for a pending signal
#: as a frame starts or resumes (a RESUME with oparg 0 or 1; not after ``yield from`` or
#: ``await``). A finalizer the collector happens to run (not the call swept) is not
#: traced: an interrupt there is only reported by Python ("Exception ignored").
_ENTRIES: dict[str, Any] = {"traced": library(skip={"__del__"}), "points": {"entry"}}


def _lane(kind: Any, client: Any, prefix: str) -> Any:
    extra = {} if kind is RedisSessionLane else {"max_concurrent": 1}
    return kind(client, "ic", prefix=prefix, lease_s=30.0, **extra)


def _in_line(lane: Any, key: str) -> int:
    """Callers in line in Redis: for ``key`` (per-key lane), for the lane (counting)."""
    if isinstance(lane, RedisSessionLane):
        return int(lane.waiting_for(key))
    return int(lane.lane_status()["waiting"])


def _counted_once(lane: Any) -> str | None:
    """None when every hold that left ``holders`` is counted once; else the stats."""
    st = lane.stats
    if st.acquired == st.released + st.unmatched_releases + st.holders:
        return None
    return repr(st)


@pytest.mark.timeout(120)
@pytest.mark.parametrize("kind", [RedisSessionLane, RedisLane])
def test_an_interrupt_at_any_point_of_a_release_counts_the_hold_once(
    redis_server: RedisServer, redis_prefix: str, kind: Any,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Leaving ``with lane.acquire(key)``, a KeyboardInterrupt lands at each signal point
    of the release in turn (one per run). Observed before: landing at the entry of
    ``flag_reply`` or of ``_release_result`` (the calls that read and counted the
    answer, made after ``counted = True`` was set), the hold was unlinked and counted
    nowhere: acquired 1, released 0, unmatched 0, holders 0. Expected at every point:
    counted once (the hold is either still a holder, uncounted, or gone and counted);
    once a ``manual_release(key)`` ends what the interrupt left, holders is 0, counted
    once, the key free in Redis, and hold times observed for no more holds than were
    counted released."""
    caplog.set_level(logging.ERROR, logger="lanequeue")  # (manual_release's warnings)
    client = redis.Redis(host=redis_server.host, port=redis_server.port)
    lane = _lane(kind, client, redis_prefix)
    other = _lane(kind, redis.Redis(host=redis_server.host, port=redis_server.port),
                  redis_prefix)
    lane.track_holds()
    wrong: list[str] = []
    sweep = Sweep(MAX_POINTS, **_ENTRIES)
    for inject in sweep:
        hold = lane.acquire("k", timeout_s=2)
        hold.__enter__()
        inject.run(lambda: hold.__exit__(None, None, None),  # noqa: B023
                   catch=KeyboardInterrupt)
        if (bad := _counted_once(lane)) is not None:
            wrong.append(f"interrupted at {inject.fired}: {bad}")
        if inject.fired is None:
            continue  # this run had fewer points: every point was tried
        if "k" in lane.get_active() or hold._state in (HELD, RELEASING):
            lane.manual_release("k")  # (False when the script had run: counted released)
        st = lane.stats
        if st.holders or (bad := _counted_once(lane)) is not None:
            wrong.append(f"after {inject.fired} and manual_release: {st!r}")
        if not other.try_acquire("k"):
            wrong.append(f"after {inject.fired}: the key is still held in Redis")
        else:
            other.manual_release("k")
    assert wrong == []
    # The sweep went through the whole release (about 30 points on CPython 3.11).
    assert len(sweep.fired) >= 10, sweep.fired
    st = lane.stats
    hold_count = sum(lane.metrics_snapshot()[0].hold.counts)
    assert 1 <= hold_count <= st.released, (hold_count, st)
    client.close()


@pytest.mark.timeout(120)
@pytest.mark.parametrize("kind", [RedisSessionLane, RedisLane])
def test_an_interrupt_at_any_point_of_joining_the_line_leaves_no_waiter(
    redis_server: RedisServer, redis_prefix: str, kind: Any,
) -> None:
    """A waiting acquire (the key held by another lane object) is interrupted at each
    signal point in turn, from its call to its first wait for a wake-up. Observed before:
    landing at the entry of the call that counts the waiter (``_wait_delta(1)``, after
    ``in_line = True`` was set), the clean-up uncounted a waiter never counted:
    ``waiting`` -1 for ever, and ``wait_idle()``/``drain()`` never true again. Expected
    at every point: no waiter left in this lane object (``waiting``, ``stats.waiters``,
    the wake-up registrations, the operations layer's waiters) nor in Redis, and the lane
    object idle."""
    client = redis.Redis(host=redis_server.host, port=redis_server.port)
    lane = _lane(kind, client, redis_prefix)
    holder = _lane(kind, redis.Redis(host=redis_server.host, port=redis_server.port),
                   redis_prefix)
    # First use done (server check, wake-up listener): each run goes the same way.
    assert not lane.acquire_timeout("warm", 0.05) or lane.manual_release("warm")
    assert holder.try_acquire("k")
    wrong: list[str] = []
    sweep = Sweep(MAX_POINTS, stop_at="_wait_wake", **_ENTRIES)
    try:
        for inject in sweep:
            got = inject.run(lambda: lane.acquire_timeout("k", 0.05), catch=KeyboardInterrupt)
            where = inject.fired or "no point"
            if got is True:
                wrong.append(f"{where}: granted a held key")
            seen = {
                "waiting": lane.waiting,
                "stats.waiters": lane.stats.waiters,
                "wake-up registrations": lane._wk().count,
                "operations waiters": len(lane._ops_waiters),
                "same-key turns": len(lane._joins),
                "in line in Redis": _in_line(lane, "k"),
            }
            if any(seen.values()) or not lane.wait_idle(0):
                wrong.append(f"interrupted at {where}: {seen}")
            if inject.fired is None:
                assert inject.stopped, "the acquire never waited"
    finally:
        holder.manual_release("k")
    assert wrong == []
    assert len(sweep.fired) >= 10, sweep.fired
    assert lane.drain(1.0)
    client.close()


@pytest.mark.timeout(60)
@pytest.mark.parametrize("how", ["async with", "acquire_all"])
def test_a_task_cancelled_inside_its_block_on_a_frozen_server_ends_within_the_cancel_wait(
    own_server: RedisServer, redis_prefix: str, monkeypatch: pytest.MonkeyPatch, how: str,
) -> None:
    """A task holding (``async with lane.acquire(key)``, or ``acquire_all`` over two
    Redis lanes) is cancelled inside its block while its server is frozen; no new
    cancellation follows. Observed before: the release in the block's exit waited for
    each release's whole call bound (here 3 s per lane: 3 s, 6 s), since only a new
    cancellation ended its wait. Expected: the task ends with CancelledError within
    CANCEL_WAIT_S (README, "A frozen server and timeouts"); the releases go on in the
    background and, once the server answers again, every hold is released and counted
    once, with nothing reported as a never-retrieved task exception."""
    monkeypatch.setattr(_args, "CALL_WAIT_S", 3.0)
    server = own_server
    reported: list[str] = []

    async def main() -> tuple[str, float, list[Any]]:
        asyncio.get_running_loop().set_exception_handler(
            lambda loop, ctx: reported.append(str(ctx.get("message"))))
        client = redis.asyncio.Redis(host=server.host, port=server.port, socket_timeout=None)
        session = AsyncRedisSessionLane(client, prefix=redis_prefix, lease_s=30.0)
        counting = AsyncRedisLane(client, "g", max_concurrent=2, prefix=redis_prefix,
                                  lease_s=30.0)
        lanes: list[Any] = [session, counting] if how == "acquire_all" else [session]
        queue = AsyncLaneQueue()
        for lane in lanes:
            queue.add(lane)
        inside = asyncio.Event()

        async def turn() -> None:
            if how == "acquire_all":
                async with queue.acquire_all("k", [ln.name for ln in lanes], timeout_s=5):
                    inside.set()
                    await asyncio.sleep(60)
            else:
                async with session.acquire("k", timeout_s=5):
                    inside.set()
                    await asyncio.sleep(60)

        task = asyncio.create_task(turn())
        await inside.wait()
        server.freeze()
        try:
            await asyncio.sleep(0.2)
            t0 = time.monotonic()
            task.cancel()
            done, _ = await asyncio.wait([task], timeout=3.0 * len(lanes) + 2.0)
            took = time.monotonic() - t0
        finally:
            server.thaw()
        outcome = ("pending" if not done else
                   "cancelled" if task.cancelled() else repr(task.exception()))
        # The releases end in the background once the server answers.
        deadline = time.monotonic() + 3.0 * len(lanes) + 2.0
        while _CLEANUPS and time.monotonic() < deadline:
            await asyncio.sleep(0.01)
        await asyncio.sleep(0.05)  # (acquire_all's own background release task)
        stats = [ln.stats for ln in lanes]
        free = [not await session.is_held("k")]
        if how == "acquire_all":
            free.append(await counting.holds_of("k") == 0)
        await client.aclose()
        return outcome, took, [stats, free]

    try:
        outcome, took, (stats, free) = asyncio.run(main())
    finally:
        server.thaw()
    gc.collect()
    assert outcome == "cancelled", outcome
    assert took < CANCEL_WAIT_S + 0.7, took
    assert all(free), free
    for st in stats:
        assert st.acquired == 1 and st.holders == 0 and st.released == 1, st
    assert not [m for m in reported if "never retrieved" in m], reported
