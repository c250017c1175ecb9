"""An interrupt (KeyboardInterrupt) at every point where CPython can deliver one in the
clean-ups of the Redis lanes, against a real redis-server: a ``finally`` (or callback)
that makes a call before its first store loses that store to an interrupt landing right
after the call. Swept: an acquire's end, whatever its path (granted at once, granted after
a wait, timed out, refused), which must leave no waiter of the lane object behind; the
renewer's release of dropped holds and its stop (the asyncio renewer task's too), which
must count each hold once; and a dropped hold's callback stopped at its entry.

The points (see "Interrupts" in ``lanequeue/_core.py``): the entry of a Python function
and a generator's resumption after a plain ``yield`` (a ``RESUME`` with oparg 0 or 1),
the return of a builtin called from the library's code (``c_return``: its ``CALL``
checks for a pending signal), and a backward jump. One point per run, counted from the
first call of ``start_at`` (each run goes the same way up to it); the sweep ends with
the first run that reaches no point. Only the calling thread is traced.
"""

from __future__ import annotations

import asyncio
import gc
import logging
import os
import sys
from collections.abc import Callable
from typing import Any

import pytest
import redis
from interrupt_points import Sweep, library
from redis_server import RedisServer

from lanequeue.redis import RedisLane, RedisSessionLane
from lanequeue.redis._protocol import RedisLaneBase
from lanequeue.redis._sync import _SyncFace, drive

MAX_POINTS = 2000

# An interrupt injected before a hold's enter began leaves that hold never entered.
pytestmark = pytest.mark.filterwarnings(
    "ignore:.*garbage-collected without being entered:RuntimeWarning")

#: The points (see the module docstring). Frames never interrupted: finalizers and a weak
#: reference's callback run where the collector happens to run (Python only reports
#: what they raise).
POINTS: dict[str, Any] = {"traced": library(skip={"__del__", "_on_drop"}),
                          "points": {"entry", "backward jump", "c_return"}}


def _lane(kind: Any, client: Any, prefix: str) -> Any:
    extra = {} if kind is RedisSessionLane else {"max_concurrent": 1}
    return kind(client, "ae", prefix=prefix, lease_s=30.0, warn_after_s=None, **extra)


def _left_behind(lane: Any) -> dict[str, Any]:
    """What an acquire that ended may not leave in its lane object."""
    seen = {
        "operations waiters": dict(lane._ops_waiters),
        "operations lines": dict(lane._ops_per_key),
        "waiting": lane.waiting,
        "wake-up registrations": lane._wk().count,
        "wake-up tokens": dict(lane._wk()._tokens),
        "same-key turns": dict(lane._joins),
    }
    return {k: v for k, v in seen.items() if v}


def _reset(lane: Any) -> None:
    lane._ops_waiters.clear()
    lane._ops_per_key.clear()
    lane._waiting = 0
    lane._wk()._events.clear()
    lane._wk()._tokens.clear()
    lane._joins.clear()


@pytest.mark.timeout(300)
@pytest.mark.parametrize("kind", [RedisSessionLane, RedisLane])
@pytest.mark.parametrize("path", ["granted at once", "granted after a wait", "timed out",
                                  "refused"])
def test_an_interrupt_at_any_point_of_an_acquires_end_leaves_no_waiter(
    redis_server: RedisServer, redis_prefix: str, kind: Any, path: str,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Observed before: an interrupt right after the clock read that opened the
    operations layer's clean-up (``RedisOps._take``'s ``finally``) left the waiter's
    record there: ``wait_idle()`` and ``drain()`` never true again, and the key granted
    meanwhile hidden from ``get_active()`` and ``manual_release`` until the renewer
    released it as dropped. Expected at every point: nothing of the acquire left in the
    lane object; a hold it left is this object's (``get_active()``) and
    ``manual_release(key)`` ends it; then the lane object is idle and the key free in
    Redis."""
    caplog.set_level(logging.ERROR, logger="lanequeue")  # (manual_release's warnings)
    client = redis.Redis(host=redis_server.host, port=redis_server.port)
    other = redis.Redis(host=redis_server.host, port=redis_server.port)
    lane = _lane(kind, client, redis_prefix)
    holder = _lane(kind, other, redis_prefix)
    assert lane.try_acquire("warm") and lane.manual_release("warm")  # (first use done)
    start_at: str | None = None
    on_start: Callable[[], object] | None = None
    if path == "granted at once":
        def call() -> Any:
            return lane.acquire_timeout("k", 5.0)
    elif path == "refused":
        def call() -> Any:
            return lane.try_acquire("k")
    elif path == "timed out":
        start_at = "_withdraw_call"

        def call() -> Any:
            return lane.acquire_timeout("k", 0.01)
    else:  # the holder lets go as the waiter first waits
        start_at = "_wait_wake"

        def on_start() -> None:
            assert holder.manual_release("k")

        def call() -> Any:
            return lane.acquire_timeout("k", 5.0)
    held_by_holder = path != "granted at once"
    wrong: list[str] = []
    sweep = Sweep(MAX_POINTS, start_at=start_at, on_start=on_start, **POINTS)
    for inject in sweep:
        if held_by_holder and not holder.get_active():
            assert holder.try_acquire("k")
        got = inject.run(call, catch=BaseException)
        where = inject.fired or "no point"
        if isinstance(got, BaseException) and not isinstance(got, KeyboardInterrupt):
            wrong.append(f"{where}: raised {got!r}")
        if left := _left_behind(lane):
            wrong.append(f"interrupted at {where}: {left}")
            _reset(lane)  # (so that each point's finding is its own)
        if "k" in lane.get_active():
            lane.manual_release("k")
        if not lane.wait_idle(1.0):
            wrong.append(f"interrupted at {where}: not idle ({lane.stats})")
        if holder.get_active():
            assert holder.manual_release("k")
        if not holder.try_acquire("k"):
            wrong.append(f"interrupted at {where}: the key is still held in Redis")
        elif not held_by_holder:
            assert holder.manual_release("k")
    assert wrong == [], "\n".join(wrong)
    assert len(sweep.fired) >= 10, sweep.fired
    assert lane.drain(1.0)
    client.close()
    other.close()


def _no_renewer(monkeypatch: pytest.MonkeyPatch) -> None:
    """Grants claim the renewer's place and start none: the test runs its rounds."""
    def claim(self: Any, needed: bool) -> None:
        with self._lock:
            self._renewing = 99
            self._renewer_pid = os.getpid()

    monkeypatch.setattr(_SyncFace, "_start_renewer", claim)


def _drop_one(lane: Any, key: str, purge: bool = True) -> None:
    """A hold of ``key`` garbage-collected while held, queued for the renewer (with
    ``purge``; else still in the registry, its entry dead)."""
    hold = lane.acquire(key, timeout_s=5)
    hold.__enter__()
    del hold
    gc.collect()
    if purge:
        assert lane.active_count == 1 and len(lane._to_release) == 1


@pytest.mark.timeout(120)
@pytest.mark.filterwarnings("ignore::ResourceWarning")
@pytest.mark.parametrize("step", ["purge", "renewal round", "renewer's stop"])
def test_an_interrupt_at_any_point_of_the_release_of_dropped_holds_counts_each_once(
    redis_client: Any, redis_prefix: str, monkeypatch: pytest.MonkeyPatch, step: str,
) -> None:
    """A dropped hold waits for the renewer's release; the purge that takes it out of
    the registry (any view, in any thread), the renewer's round or its stop (where such
    holds lapse) is interrupted at each point in turn (an asyncio renewer is a task of
    the loop's thread, where Ctrl-C lands). Observed before: landing after the round
    took the batch (its lock's exit) or after the stop's ``len``, or after the purge
    took the entry out of the registry (its ``remove``), the hold was counted nowhere:
    ``holders`` 1 for good, ``wait_idle()`` and ``drain()`` never true again. Expected
    at every point: once a round runs to its end, the hold has left ``holders``,
    counted once (released or, lapsing, unmatched), and no batch is left recorded as on
    its way to its report (``warn_hold_s`` set: the report is swept too)."""
    _no_renewer(monkeypatch)
    lane = RedisSessionLane(redis_client, "dr", prefix=redis_prefix, lease_s=30.0,
                            warn_after_s=None, warn_hold_s=0.0)
    wrong: list[str] = []
    sweep = Sweep(MAX_POINTS, **POINTS)
    for inject in sweep:
        _drop_one(lane, f"k{inject.n}", purge=step != "purge")
        if step == "purge":
            inject.run(lambda: lane.active_count, catch=BaseException)
        elif step == "renewal round":
            inject.run(lambda: drive(lane._renew_round()), catch=BaseException)
        else:
            inject.run(lambda: lane._renewer_stopped(None), catch=BaseException)
            lane._renewing = 99
        drive(lane._renew_round())  # (a round that runs to its end)
        if lane._releasing:  # (a batch kept as on its way to its report, for good)
            wrong.append(f"interrupted at {inject.fired or 'no point'}: {lane._releasing}")
            lane._releasing.clear()
        st = lane.stats
        if st.holders or st.acquired != st.released + st.unmatched_releases:
            wrong.append(f"interrupted at {inject.fired or 'no point'}: {st}")
            lane._n_live = 0  # (so that each point's finding is its own)
            lane.unmatched = lane.acquired - lane.released
    assert wrong == [], "\n".join(wrong)
    assert len(sweep.fired) >= 3, sweep.fired


@pytest.mark.timeout(30)
def test_a_dropped_holds_callback_stopped_at_its_entry_leaves_it_to_the_renewer(
    redis_server: RedisServer, redis_prefix: str, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The weak reference's callback of a dropped hold (``_on_drop``) is stopped by an
    interrupt at its entry (a callback the collector runs is a point like any other;
    Python only reports what it raises). Observed before: the entry stayed in the
    registry, among the holders, for good: the key was released only when its lease
    ran out, and ``wait_idle()``/``drain()`` were never true again. Expected: the
    renewer's next round finds the dead entry, releases the hold in Redis and counts it
    released."""
    def interrupted(self: Any, entry: Any) -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr(RedisLaneBase, "_on_drop", interrupted)
    client = redis.Redis(host=redis_server.host, port=redis_server.port)
    lane = RedisSessionLane(client, "od", prefix=redis_prefix, lease_s=1.5,
                            warn_after_s=None)
    other = RedisSessionLane(client, "od", prefix=redis_prefix, lease_s=30.0)
    reports: list[Any] = []
    hook, sys.unraisablehook = sys.unraisablehook, reports.append
    try:
        hold = lane.acquire("k")
        hold.__enter__()
        del hold
        gc.collect()
    finally:
        sys.unraisablehook = hook
    assert [type(r.exc_value) for r in reports] == [KeyboardInterrupt]
    assert lane.wait_idle(5.0), lane.stats  # (the renewer's next round: within lease_s/3)
    st = lane.stats
    assert (st.acquired, st.released, st.unmatched_releases) == (1, 1, 0), st
    assert other.try_acquire("k")
    assert other.manual_release("k")
    client.close()


def _not_renewing(ref: Any, sleep: Any) -> Any:
    """A renewer's rounds that end at once (the test sweeps its stop)."""
    return
    yield


@pytest.mark.timeout(120)
@pytest.mark.filterwarnings("ignore::ResourceWarning")
def test_an_interrupt_at_any_point_of_the_asyncio_renewers_stop_leaves_no_dropped_hold_waiting(
    redis_server: RedisServer, redis_prefix: str, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The asyncio renewer task ends (its ``finally``) with a dropped hold queued for
    it; its stop is interrupted at each point in turn, then another hold is dropped.
    Observed before: the stop made calls (its lookups, ``_renewer_stopped``) before it
    recorded anything, so an interrupt at ``_renewer_stopped``'s entry or after its
    ``len`` left the renewer's place taken (``_renewing`` set) with no renewer: the
    hold dropped after it was queued for a release nobody would send, both counted
    among the holders (``wait_idle()`` false) until the next grant started a renewer.
    Expected at every point: the renewer's place is free, and the next view counts both
    holds as lapsing (``unmatched_releases``), none left among the holders or queued."""
    from lanequeue.redis import AsyncRedisSessionLane, _async

    monkeypatch.setattr(_async, "renewal", _not_renewing)
    wrong: list[str] = []
    # (counted from its try: the coroutine's entry, before it, is another case)
    sweep = Sweep(MAX_POINTS, start_at="drive", **POINTS)

    async def main() -> None:
        client = redis.asyncio.Redis(host=redis_server.host, port=redis_server.port)
        lane = AsyncRedisSessionLane(client, "rs", prefix=redis_prefix, lease_s=30.0,
                                     warn_after_s=None)
        loop = asyncio.get_running_loop()
        create = loop.create_task
        made: list[Any] = []

        def capture(coro: Any, **kwargs: Any) -> Any:
            if getattr(coro, "__name__", "") != "_renew_loop":
                return create(coro, **kwargs)
            made.append(coro)  # (the test runs it; the task it stands for: this one)
            return asyncio.current_task()

        loop.create_task = capture  # type: ignore[method-assign]
        try:
            for inject in sweep:
                lane._renewing, lane._renew_task = 0, None  # (each point on its own)
                made.clear()
                hold = lane.acquire(f"q{inject.n}")  # its grant starts a renewer
                await hold.__aenter__()
                after = lane.acquire(f"a{inject.n}")  # (dropped after the stop)
                await after.__aenter__()
                del hold
                gc.collect()
                assert len(made) == 1 and lane.active_count == 2 and lane._to_release
                coro = made[0]

                def stop(coro: Any = coro) -> None:
                    try:
                        coro.send(None)  # (its rounds end at once: its finally runs)
                    except StopIteration:
                        pass

                inject.run(stop, catch=BaseException)
                for made_coro in made:
                    made_coro.close()
                del after
                gc.collect()
                st = lane.stats
                if lane._renewing or lane._to_release or st.holders \
                        or st.acquired != st.released + st.unmatched_releases:
                    wrong.append(f"interrupted at {inject.fired or 'no point'}: "
                                 f"renewing {lane._renewing}, queued "
                                 f"{sorted(d[2] for d in lane._to_release.values())}, {st}")
                    lane._to_release, lane._queued_live = {}, 0
                    lane._n_live = 0
                    lane.unmatched = lane.acquired - lane.released
        finally:
            del loop.create_task
            await client.aclose()

    asyncio.run(main())
    assert wrong == [], "\n".join(wrong)
    assert len(sweep.fired) >= 3, sweep.fired
