"""The lane contract (lanequeue.contract), one body per behaviour, on all eight classes.

Each ``test_*`` below is ONE async body, run by :mod:`contract_face` against ``Lane``,
``SessionLane``, ``AsyncLane``, ``AsyncSessionLane``, ``RedisLane``, ``RedisSessionLane``,
``AsyncRedisLane`` and ``AsyncRedisSessionLane`` (the Redis ones on the real server of the
session). The faces differ only inside the driver's adapters (await or not, task or
thread); where the contract gives a face a documented alternative, the body asserts that
alternative, never skips. Kinds differ where the contract says they do (a counting lane
shares its permits over all keys; a per-key lane has one holder per key).
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import inspect
import logging
import math
import sys
import time
import tracemalloc
import warnings
from collections.abc import Callable, Iterator
from enum import Enum
from typing import Any

import pytest
from contract_face import BOUND_S, SPECS, Body, Face

from lanequeue import (
    AsyncLane,
    Lane,
    LaneClearedError,
    LaneDrainingError,
    LaneStats,
    LaneTimeoutError,
    NotOwnerError,
    SyncCountingLane,
    SyncHold,
    SyncLane,
    SyncSessionLane,
    TaskCountingLane,
    TaskHold,
    TaskLane,
    TaskSessionLane,
)

# One body drives every face from async test code: a thread lane's wait there is on
# purpose (another thread ends it), not the mistake its RuntimeWarning is for.
pytestmark = pytest.mark.filterwarnings(
    "ignore:.*a blocking wait from a thread that runs an asyncio event loop:RuntimeWarning")


@pytest.fixture(params=SPECS, ids=[s.cls for s in SPECS])
def f(request: pytest.FixtureRequest, redis_server: Any, redis_prefix: str) -> Face:
    return Face(request.param, redis_server.host, redis_server.port, redis_prefix)


def contract(body: Body) -> Callable[[Face], None]:
    """Make ``body`` a test run on every lane class (the ``f`` fixture)."""

    def test(f: Face) -> None:
        f.run(body)

    test.__name__ = body.__name__
    test.__doc__ = body.__doc__
    return pytest.mark.timeout(60)(test)


def _since(t0: float) -> float:
    return time.monotonic() - t0


def lane_logs(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name.startswith("lanequeue")]


# -- the surface ----------------------------------------------------------------------


@contract
async def test_surface(f: Face) -> None:
    """Every class has its face's surface (the Protocols of lanequeue.contract) and says
    which face it is; its holds have the hold surface."""
    lane = f.lane()
    if f.is_async:
        kind = TaskCountingLane if f.counting else TaskSessionLane
        assert isinstance(lane, TaskLane) and isinstance(lane, kind)
        assert lane.face == "asyncio"
        with _unentered():
            assert isinstance(lane.acquire("k"), TaskHold)
    else:
        kind = SyncCountingLane if f.counting else SyncSessionLane
        assert isinstance(lane, SyncLane) and isinstance(lane, kind)
        assert lane.face == "threads"
        with _unentered():
            assert isinstance(lane.acquire("k"), SyncHold)
    assert lane.name == "lane" and lane.timeout_s == 5.0


@contextlib.contextmanager
def _unentered() -> Iterator[None]:
    """A hold made in the block and never entered: its warning is expected (checked) once
    it is collected at the block's end."""
    with pytest.warns(RuntimeWarning, match="without being entered"):
        yield
        gc.collect()


# -- exclusion and order ---------------------------------------------------------------


@contract
async def test_exclusion(f: Face) -> None:
    """One permit: a second caller of the key waits until the holder leaves. Other keys:
    in parallel on a per-key lane, behind the same permit on a counting lane."""
    lane = f.lane(timeout_s=None)
    inside: list[str] = []

    async def second() -> None:
        async with f.hold(lane.acquire("k")):
            inside.append("second")

    async with f.hold(lane.acquire("k")) as hold:
        assert hold.held and hold.token > 0 and hold.fencing_token == hold.token
        assert await f.q(lane.try_acquire("k")) is False
        waiter = f.spawn(second)
        await f.until(lambda: lane.waiting == 1)
        assert inside == [] and not waiter.done
        other = await f.q(lane.try_acquire("other"))
        assert other is (not f.counting)
        if other:
            assert await f.q(lane.manual_release("other")) is True
        inside.append("first")
    await waiter.join()
    assert inside == ["first", "second"]
    assert lane.active_count == 0 and lane.waiting == 0


@contract
async def test_fifo(f: Face) -> None:
    """Waiters of one key are served in arrival order, and every grant has a larger
    token than the one before."""
    lane = f.lane(timeout_s=None)
    order: list[tuple[int, int]] = []

    def waiter(i: int) -> Callable[[], Any]:
        async def part() -> None:
            async with f.hold(lane.acquire("k")) as h:
                order.append((i, h.token))

        return part

    hold = await f.enter(lane.acquire("k"))
    parts = []
    for i in range(3):
        parts.append(f.spawn(waiter(i)))
        await f.until(lambda n=i + 1: lane.waiting == n)
    await f.leave(hold)
    for p in parts:
        await p.join()
    assert [i for i, _ in order] == [0, 1, 2]
    tokens = [hold.token] + [t for _, t in order]
    assert tokens == sorted(tokens) and len(set(tokens)) == 4


# -- timeouts: omitted / None / 0 / > 0 / negative / NaN ---------------------------------


@contract
async def test_timeout_omitted_is_the_lanes_default(f: Face) -> None:
    """``acquire`` and ``acquire_timeout`` without a timeout wait the lane's
    ``timeout_s``; the error names lane, key and that wait."""
    lane = f.lane(timeout_s=0.3)
    hold = await f.enter(lane.acquire("k"))
    t0 = time.monotonic()
    with pytest.raises(LaneTimeoutError) as info:
        await f.enter(lane.acquire("k"))
    assert 0.3 <= _since(t0) < 0.3 + 5
    assert (info.value.lane, info.value.key, info.value.timeout_s) == ("lane", "k", 0.3)
    t0 = time.monotonic()
    assert await f.q(lane.acquire_timeout("k")) is False
    assert 0.3 <= _since(t0) < 0.3 + 5
    assert lane.waiting == 0 and lane.stats.timeouts == 2
    assert await f.q(hold.release()) is True


@contract
async def test_timeout_none_waits_without_limit(f: Face) -> None:
    """``timeout_s=None`` waits past the lane's default until the permit comes."""
    lane = f.lane(timeout_s=0.05)
    got: list[str] = []

    async def by_acquire() -> None:
        async with f.hold(lane.acquire("k", timeout_s=None)):
            got.append("acquire")

    async def by_acquire_timeout() -> None:
        assert await f.q(lane.acquire_timeout("k", None)) is True
        got.append("acquire_timeout")
        assert await f.q(lane.manual_release("k")) is True

    hold = await f.enter(lane.acquire("k"))
    first = f.spawn(by_acquire)
    await f.until(lambda: lane.waiting == 1)
    second = f.spawn(by_acquire_timeout)
    await f.until(lambda: lane.waiting == 2)
    t0 = time.monotonic()
    while _since(t0) < 0.3:  # six times the lane's default
        assert lane.waiting == 2 and not first.done and not second.done
        await asyncio.sleep(0.02)
    await f.leave(hold)
    await first.join()
    await second.join()
    assert got == ["acquire", "acquire_timeout"] and lane.stats.timeouts == 0


@contract
async def test_timeout_zero_does_not_wait(f: Face) -> None:
    """``timeout_s=0`` takes a free permit, and refuses at once when it is busy (a
    refusal: counted in ``rejected``, not in ``timeouts``; nothing held, nobody in line)."""
    lane = f.lane(timeout_s=None)
    async with f.hold(lane.acquire("k", timeout_s=0)):
        t0 = time.monotonic()
        with pytest.raises(LaneTimeoutError) as info:
            await f.enter(lane.acquire("k", timeout_s=0))
        assert info.value.timeout_s == 0
        assert await f.q(lane.acquire_timeout("k", 0)) is False
        assert _since(t0) < 2.0  # no wait (a bound, far above two round trips)
        assert lane.waiting == 0 and lane.active_count == 1
        st = lane.stats
        assert (st.timeouts, st.rejected) == (0, 2)
    assert await f.q(lane.acquire_timeout("k", 0)) is True
    assert await f.q(lane.manual_release("k")) is True


@contract
async def test_a_hold_dropped_without_being_entered_warns(f: Face) -> None:
    """``lane.acquire(key)`` without ``with`` / ``async with`` holds nothing: the hold,
    once garbage-collected, warns with a RuntimeWarning naming the lane and the key (as
    Python warns of a coroutine never awaited). A hold entered and left, one whose
    enter timed out, and the holds ``try_acquire`` / ``acquire_timeout`` take do not."""
    lane = f.lane("unentered", timeout_s=None)
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        tracemalloc.start(50)
        try:
            lane.acquire("forgot")  # (the statement's value is dropped at once)
            made_at = sys._getframe().f_lineno - 1
            gc.collect()
            never = [w for w in seen if issubclass(w.category, RuntimeWarning)]
            assert len(never) == 1, [str(w.message) for w in seen]
            # The warning comes from a finalizer, with no caller's line: its source is
            # the hold, so that Python shows where it was made (-X tracemalloc).
            made = tracemalloc.get_object_traceback(never[0].source)
        finally:
            tracemalloc.stop()
        assert made is not None
        assert (__file__, made_at) in [(frame.filename, frame.lineno) for frame in made]
        text = str(never[0].message)
        assert "'unentered'" in text and "'forgot'" in text and "never held" in text
        assert lane.active_count == 0 and lane.waiting == 0
        seen.clear()
        async with f.hold(lane.acquire("k")):
            with pytest.raises(LaneTimeoutError):
                await f.enter(lane.acquire("k", timeout_s=0))
            assert await f.q(lane.acquire_timeout("k", 0)) is False
        assert await f.q(lane.try_acquire("k")) is True
        assert await f.q(lane.manual_release("k")) is True
        # The same for acquire_all over this lane class.
        queue = f.queue()
        queue.add(lane)
        async with f.hold(queue.acquire_all("k", ["unentered"])):
            pass
        gc.collect()
        assert [w for w in seen if issubclass(w.category, RuntimeWarning)] == []
        queue.acquire_all("forgot", ["unentered"])
        gc.collect()
        never = [w for w in seen if issubclass(w.category, RuntimeWarning)]
        assert len(never) == 1 and "'forgot'" in str(never[0].message), never
        assert "['unentered']" in str(never[0].message)


@contract
async def test_awaiting_a_hold_names_its_public_class_and_warns_what_to_write(
    f: Face,
) -> None:
    """``await lane.acquire(key)`` and ``await queue.acquire_all(...)`` raise Python's own
    TypeError, which names the hold's public class (``AsyncHold``, ``MultiHold``, ...),
    not an internal one; the hold, never entered, warns when dropped and says to write
    ``with`` / ``async with``. Holds are not awaitables: a type checker flags the
    ``await``, and ``inspect.isawaitable`` is False (a dispatcher's turn may return one)."""
    lane = f.lane("awaited", timeout_s=None)
    queue = f.queue()
    queue.add(lane)
    made = [lane.acquire("k"), queue.acquire_all("k", ["awaited"])]
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        for hold in made:
            assert not inspect.isawaitable(hold)
            with pytest.raises(TypeError, match="can't be used in 'await' expression") as info:
                await hold
            name = type(hold).__name__
            assert f"object {name} " in str(info.value) and not name.startswith("_")
        assert type(made[1]).__name__ == "MultiHold"
        assert lane.active_count == 0 and lane.waiting == 0
        async with f.hold(made[0]):  # left as it was: it still holds
            assert lane.active_count == 1
        del made[:], hold
        gc.collect()
        never = [str(w.message) for w in seen if issubclass(w.category, RuntimeWarning)]
        assert len(never) == 1 and "awaited" in never[0], never
        assert "'async with queue.acquire_all(key, names):' on asyncio" in never[0]


@contract
async def test_a_hold_is_single_use_even_after_its_enter_timed_out(f: Face) -> None:
    """A hold is single use: entered again after it ended, or after its enter timed out
    (nothing was granted), it raises RuntimeError and takes nothing, even once the key
    or permit is free; ``acquire`` makes a fresh hold for a new try."""
    lane = f.lane("single", timeout_s=None)
    late = lane.acquire("k", timeout_s=0)
    async with f.hold(lane.acquire("k")):
        with pytest.raises(LaneTimeoutError):
            await f.enter(late)
    assert lane.active_count == 0
    with pytest.raises(RuntimeError, match="already entered"):
        await f.enter(late)  # the key is free now: still refused
    assert lane.active_count == 0 and lane.stats.acquired == 1
    used = lane.acquire("k")
    async with f.hold(used):
        pass
    with pytest.raises(RuntimeError, match="already entered"):
        await f.enter(used)
    async with f.hold(lane.acquire("k")):  # a fresh hold
        assert lane.active_count == 1


@contract
async def test_timeout_positive_waits_that_long(f: Face) -> None:
    """``timeout_s > 0`` waits at most that long: LaneTimeoutError (acquire) or False
    (acquire_timeout) when nothing came, the permit when it came in time."""
    lane = f.lane(timeout_s=None)
    hold = await f.enter(lane.acquire("k"))
    t0 = time.monotonic()
    with pytest.raises(LaneTimeoutError) as info:
        await f.enter(lane.acquire("k", timeout_s=0.2))
    assert 0.2 <= _since(t0) < 0.2 + 5 and info.value.timeout_s == 0.2
    t0 = time.monotonic()
    assert await f.q(lane.acquire_timeout("k", 0.2)) is False
    assert 0.2 <= _since(t0) < 0.2 + 5
    assert lane.waiting == 0 and lane.stats.timeouts == 2 and lane.stats.rejected == 0

    async def waiter() -> bool:
        ok: bool = await f.q(lane.acquire_timeout("k", BOUND))
        return ok

    w = f.spawn(waiter)
    await f.until(lambda: lane.waiting == 1)
    await f.leave(hold)
    assert await w.join() is True
    assert await f.q(lane.manual_release("k")) is True


BOUND = 5.0


@contract
async def test_timeout_negative_nan_or_not_a_number_is_refused(f: Face) -> None:
    """Negative or NaN: ValueError; not a number (or a bool): TypeError; nothing taken."""
    lane = f.lane()
    for bad, error in [(-1, ValueError), (-0.001, ValueError), (math.nan, ValueError),
                       ("1", TypeError), (True, TypeError)]:
        with pytest.raises(error, match="timeout_s"):
            lane.acquire("k", timeout_s=bad)  # at the call, on every face
        with pytest.raises(error, match="timeout_s"):
            await f.q(lane.acquire_timeout("k", bad))
    assert lane.active_count == 0 and lane.stats.acquired == 0


# -- releases ------------------------------------------------------------------------------


@contract
async def test_release_own(f: Face) -> None:
    """``hold.release()`` ends the caller's hold (True) and the next caller gets in;
    leaving the block afterwards is silent and counts nothing."""
    lane = f.lane()
    with _captured() as caplog:
        async with f.hold(lane.acquire("k")) as hold:
            assert await f.q(hold.release()) is True
            assert not hold.held and lane.active_count == 0
            assert await f.q(lane.try_acquire("k")) is True  # someone else now
        assert lane.active_count == 1  # leaving the block did not end theirs
        assert await f.q(lane.manual_release("k")) is True
        st = lane.stats
        assert (st.acquired, st.released, st.unmatched_releases) == (2, 2, 0)
    assert lane_logs(caplog) == []


@contract
async def test_release_twice(f: Face) -> None:
    """A second ``hold.release()`` raises NotOwnerError and never ends the next
    holder's hold."""
    lane = f.lane()
    hold = await f.enter(lane.acquire("k"))
    assert await f.q(hold.release()) is True
    assert await f.q(lane.try_acquire("k")) is True
    with pytest.raises(NotOwnerError):
        await f.q(hold.release())
    assert lane.active_count == 1 and await f.q(lane.try_acquire("k")) is False
    assert await f.q(lane.manual_release("k")) is True
    with _unentered():
        never = lane.acquire("k")
        with pytest.raises(NotOwnerError):  # never granted: not the caller's either
            await f.q(never.release())
        del never


@contract
async def test_release_foreign(f: Face) -> None:
    """A hold ended by someone else (``manual_release(key)``) is not the caller's any
    more: its ``release()`` raises NotOwnerError. ``manual_release`` of a key that holds
    nothing returns False, logs a warning and changes nothing."""
    lane = f.lane()
    hold = await f.enter(lane.acquire("k"))
    assert await f.q(lane.manual_release("k")) is True  # the foreign release
    assert await f.q(lane.try_acquire("k")) is True  # the key moved on
    with pytest.raises(NotOwnerError):
        await f.q(hold.release())
    assert lane.active_count == 1
    assert await f.q(lane.manual_release("k")) is True
    with _captured() as caplog:
        assert await f.q(lane.manual_release("k")) is False
        assert await f.q(lane.manual_release("never")) is False
    logs = lane_logs(caplog)
    assert len(logs) == 2 and "'k'" in logs[0] and "'never'" in logs[1]
    assert lane.active_count == 0 and lane.stats.unmatched_releases == 3


@contract
async def test_refused_release_counts_once_and_logs_nothing(f: Face) -> None:
    """A refused ``hold.release()`` (released already, or ended by someone else) raises
    NotOwnerError, logs nothing and counts once in ``unmatched_releases``; a hold never
    granted counts nothing. The lane is left as it was."""
    lane = f.lane()
    with _captured() as caplog:
        hold = await f.enter(lane.acquire("k"))
        assert await f.q(hold.release()) is True
        for _ in range(2):
            with pytest.raises(NotOwnerError):
                await f.q(hold.release())
        with _unentered(), pytest.raises(NotOwnerError):
            await f.q(lane.acquire("k").release())
        assert lane.stats.unmatched_releases == 2
        assert lane.active_count == 0 and await f.q(lane.try_acquire("k")) is True
        assert await f.q(lane.manual_release("k")) is True
    assert lane_logs(caplog) == []


@contract
async def test_held_follows_the_lane(f: Face) -> None:
    """``hold.held`` says whether the hold is still the caller's: False once someone else
    ended it with ``manual_release(key)``, while the lane shows the key free."""
    lane = f.lane()
    async with f.hold(lane.acquire("k")) as hold:
        assert hold.held
        assert await f.q(lane.manual_release("k")) is True
        assert hold.held is False
        assert lane.active_count == 0
        if not f.counting:
            assert await f.q(lane.is_held("k")) is False
        with pytest.raises(NotOwnerError):
            await f.q(hold.release())
    assert lane.active_count == 0 and await f.q(lane.try_acquire("k")) is True
    assert await f.q(lane.manual_release("k")) is True


@contract
async def test_multi_hold(f: Face) -> None:
    """What ``acquire_all`` yields: ``multi[name]`` is the lane's own hold type with the
    hold surface (``release()`` a coroutine on asyncio); one released early is skipped by
    leaving; ``multi.release()`` releases the rest, last first, and is safe twice."""
    queue = await _mixed_queue(f, x_timeout=5.0, y_timeout=5.0)
    x, y = queue["x"], queue["y"]
    surface = TaskHold if f.is_async else SyncHold
    async with f.hold(queue.acquire_all("k", ["x", "y"])) as multi:
        assert multi.key == "k" and len(multi) == 2 and list(multi) == multi.holds
        for name in ("x", "y"):
            h = multi[name]
            assert isinstance(h, surface)
            with pytest.warns(RuntimeWarning, match="without being entered"):
                other = queue[name].acquire("other")
                assert type(h) is type(other)
                del other  # (a hold made and never entered warns)
                gc.collect()
            assert h.key == "k" and h.held and h.token > 0
        assert await f.q(multi["x"].release()) is True
        assert multi["x"].held is False and x.active_count == 0
        with pytest.raises(NotOwnerError):
            await f.q(multi["x"].release())
        assert y.active_count == 1
    assert x.active_count == 0 and y.active_count == 0
    multi = await f.enter(queue.acquire_all("k", ["x", "y"]))
    assert await f.q(multi.release()) is None
    assert await f.q(multi.release()) is None  # safe twice
    assert x.active_count == 0 and y.active_count == 0
    assert not any(h.held for h in multi)
    if f.is_async:
        multi = await f.enter(queue.acquire_all("k", ["x", "y"]))
        await multi.release_async()
        assert x.active_count == 0 and y.active_count == 0
    assert x.stats.unmatched_releases == 1 and y.stats.unmatched_releases == 0


# -- views -----------------------------------------------------------------------------


@contract
async def test_views(f: Face) -> None:
    """The plain views describe this lane object; the queries are lane-wide."""
    lane = f.lane(timeout_s=None, cap=2)
    idle = lane.status()
    assert {"kind", "name", "timeout_s", "active", "waiting", "stats"} <= set(idle)
    assert (idle["kind"], idle["name"], idle["active"], idle["waiting"]) == (
        f.spec.cls, "lane", 0, 0)
    hold = await f.enter(lane.acquire("a"))
    assert await f.q(lane.try_acquire("b")) is True
    assert lane.active_count == 2 and set(lane.get_active()) == {"a", "b"}
    assert all(age >= 0 for age in lane.get_active().values())
    st = lane.stats
    assert isinstance(st, LaneStats) and st == lane.statistics()
    assert (st.acquired, st.holders, st.waiters) == (2, 2, 0)
    status = lane.status()
    assert (status["active"], status["waiting"]) == (2, 0)
    assert status["stats"] == st.to_dict()
    # The kind's keys, with this object's counts, on every face.
    if f.counting:
        assert (status["max_concurrent"], status["available"]) == (2, 0)
    else:
        assert status["sessions"] == lane.session_count == 2 and "max_sessions" in status
    if f.counting:  # full now (2 permits): a third caller waits
        assert lane.max_concurrent == 2 and lane.available == 0
        assert await f.q(lane.holds_of("a")) == 1 and await f.q(lane.holds_of("z")) == 0
        wide = await f.q(lane.lane_status())
        assert (wide["active"], wide["waiting"], wide["available"]) == (2, 0, 0)
        assert set(wide["keys"]) == {"a", "b"} and wide["max_concurrent"] == 2
        assert wide["oldest_wait_s"] == 0.0  # nobody waits
        key = "c"
    else:
        assert lane.session_count == 2
        assert await f.q(lane.is_held("a")) is True
        assert await f.q(lane.is_held("c")) is False
        key = "a"
    waiter = f.spawn(lambda: f.q(lane.acquire_timeout(key, BOUND)))
    await f.until(lambda: lane.waiting == 1)
    assert lane.stats.waiters == 1 and lane.status()["waiting"] == 1
    if f.counting:
        wide = await f.q(lane.lane_status())
        assert wide["waiting"] == 1 and 0.0 <= wide["oldest_wait_s"] < BOUND
    else:
        assert await f.q(lane.waiting_for("a")) == 1
        assert await f.q(lane.waiting_for("b")) == 0
    await f.leave(hold)
    assert await waiter.join() is True
    assert lane.waiting == 0 and lane.active_count == 2
    assert await f.q(lane.manual_release(key)) is True
    assert await f.q(lane.manual_release("b")) is True
    assert lane.active_count == 0 and lane.get_active() == {}
    if f.counting:
        assert lane.available == 2 and (await f.q(lane.lane_status()))["active"] == 0


# -- errors ----------------------------------------------------------------------------


@contract
async def test_bad_keys(f: Face) -> None:
    """A key that is not a str is a TypeError, an empty key a ValueError (at the call;
    for a query of an asyncio lane, when it is awaited); nothing is taken."""
    lane = f.lane()
    for bad, error in [(1, TypeError), (None, TypeError), (b"k", TypeError),
                       ("", ValueError)]:
        with pytest.raises(error, match="key"):
            lane.acquire(bad)
        calls = [lambda b=bad: lane.try_acquire(b),
                 lambda b=bad: lane.acquire_timeout(b, 0),
                 lambda b=bad: lane.manual_release(b)]
        if f.counting:
            calls.append(lambda b=bad: lane.holds_of(b))
        else:
            calls += [lambda b=bad: lane.is_held(b), lambda b=bad: lane.waiting_for(b)]
        for call in calls:
            with pytest.raises(error, match="key"):
                await f.q(call())
    assert lane.active_count == 0 and lane.stats.acquired == 0


class StrKey(str, Enum):
    """A ``str`` subclass key (C23) whose repr and format differ from its value."""

    A = "odd:a"
    B = "odd:b"


def _plain(values: Any) -> bool:
    return all(v.__class__ is str for v in values)


@contract
async def test_str_subclass_key_is_its_plain_value_in_every_view(f: Face) -> None:
    """A ``str`` subclass key (a ``str`` Enum member) is its plain string value wherever
    a key enters (acquire, try_acquire, acquire_timeout, the queries, manual_release,
    clear, acquire_all) and in every view that returns keys: hold.key, get_active(),
    stuck(), lane_status()["keys"], the multi-hold's key; the same on every face."""
    lane = f.lane(cap=2, timeout_s=None)
    hold = await f.enter(lane.acquire(StrKey.A))
    assert hold.key == "odd:a" and hold.key.__class__ is str
    assert await f.q(lane.try_acquire(StrKey.B)) is True
    assert set(lane.get_active()) == {"odd:a", "odd:b"} and _plain(lane.get_active())
    assert {s.key for s in lane.stuck(0)} == {"odd:a", "odd:b"}
    assert _plain(s.key for s in lane.stuck(0))
    if f.counting:
        assert await f.q(lane.holds_of(StrKey.A)) == await f.q(lane.holds_of("odd:a")) == 1
        keys = (await f.q(lane.lane_status()))["keys"]
        assert set(keys) == {"odd:a", "odd:b"} and _plain(keys)
    else:
        assert await f.q(lane.is_held(StrKey.A)) is True
        assert await f.q(lane.waiting_for(StrKey.A)) == 0
        # One key, whichever spelling: the plain value waits for the Enum's holder.
        assert await f.q(lane.acquire_timeout("odd:a", 0)) is False
    assert lane.clear(StrKey.A) == 0
    assert await f.q(lane.manual_release(StrKey.B)) is True
    await f.leave(hold)
    assert lane.get_active() == {}
    queue = f.queue()
    queue.add(f.lane(name="other", cap=1))
    multi = await f.enter(queue.acquire_all(StrKey.A, ["other"]))
    assert multi.key == "odd:a" and multi.key.__class__ is str
    assert multi["other"].key.__class__ is str
    assert _plain(queue["other"].get_active())
    await f.leave(multi)


@contract
async def test_keys_are_not_unicode_normalised(f: Face) -> None:
    """A key given to a lane is used as it is: ``"\u00e9"`` and ``"e\u0301"`` (one text
    in two Unicode forms) are two keys on every face; only the key builders normalise
    (README, lanequeue.keys)."""
    composed, decomposed = "\u00e9", "e\u0301"
    lane = f.lane(cap=2)
    assert await f.q(lane.try_acquire(composed)) is True
    assert await f.q(lane.try_acquire(decomposed)) is True  # not the same key's turn
    assert sorted(lane.get_active()) == sorted([composed, decomposed])
    if f.counting:
        assert await f.q(lane.holds_of(decomposed)) == 1
        assert set((await f.q(lane.lane_status()))["keys"]) == {composed, decomposed}
    else:
        assert await f.q(lane.is_held(decomposed)) is True
    assert await f.q(lane.manual_release(decomposed)) is True
    assert list(lane.get_active()) == [composed]
    assert await f.q(lane.manual_release(composed)) is True


# -- a missing await ---------------------------------------------------------------------


@contract
async def test_unawaited_query_fails_loudly(f: Face) -> None:
    """On an asyncio lane a query's result, tested for truth without ``await``, raises
    TypeError (it never reads as True), never runs, and adds no "never awaited"
    warning; the error names the public class and the method. Dropped untested,
    Python's own warning still names it. On a thread lane
    (the documented alternative) the same calls return plain values at once."""
    lane = f.lane()
    hold = await f.enter(lane.acquire("h"))
    queries: list[Callable[[], Any]] = [
        lambda: lane.try_acquire("k"),
        lambda: lane.acquire_timeout("k", 0),
        lambda: lane.manual_release("h"),
        lambda: hold.release(),
        lambda: lane.wait_idle(0),  # (``if lane.wait_idle(5):`` read as always True)
    ]
    if f.counting:
        queries += [lambda: lane.holds_of("h"), lambda: lane.lane_status()]
    else:
        queries += [lambda: lane.is_held("h"), lambda: lane.waiting_for("h")]
    if not f.is_async:  # plain values, and each call took effect at once
        for query in queries[:2] + queries[4:]:  # those that leave "h" alone
            assert not inspect.isawaitable(query())
        assert queries[2]() is True and lane.active_count in (0, 1)
        with pytest.raises(NotOwnerError):  # the manual_release above ended it already
            queries[3]()
        await f.q(lane.manual_release("k"))  # "k" if try_acquire took it (per-key lane)
        assert lane.active_count == 0
        return
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for i, query in enumerate(queries):
            result = query()
            # The error names the public class of the object called and the method
            # (``AsyncLane.try_acquire()``, ``AsyncHold.release()``), never an internal
            # base nor the holds' step mixins (it named ``SessionHoldSteps.release``).
            owner = next(c.__name__ for c in type(hold if i == 3 else lane).__mro__
                         if not c.__name__.startswith("_")
                         and not c.__name__.endswith("Steps"))
            with pytest.raises(TypeError, match=rf"^{owner}\.[a-z_]+\(\) must be awaited"):
                if result:
                    pass
            del result
        gc.collect()
    with pytest.raises(TypeError, match=r"\.drain\(\) must be awaited"):
        if lane.drain():
            pass
    assert [str(w.message) for w in caught if "never awaited" in str(w.message)] == []
    assert lane.active_count == 1 and hold.held  # nothing ran
    assert not lane.draining  # the drain never ran
    # Still a coroutine for asyncio itself (create_task, gather) to run.
    assert await asyncio.create_task(lane.acquire_timeout("h", 0)) is False
    with pytest.warns(RuntimeWarning, match="never awaited"):
        lane.try_acquire("k")  # dropped: the coroutine's own warning
        gc.collect()
    with pytest.warns(RuntimeWarning, match=r"coroutine '[A-Za-z]*Hold\.release' was "
                      "never awaited"):
        hold.release()  # dropped: named after the hold's public class
        gc.collect()
    assert lane.active_count == 1
    assert await f.q(hold.release()) is True


@contract
async def test_priority_zero_is_accepted_by_every_lane(f: Face) -> None:
    """Code written against every lane may pass ``priority=0`` (the default) to
    ``acquire`` and ``acquire_timeout``: all eight classes accept it (the Redis lanes
    once raised TypeError). A lane that serves its waiters in arrival order only (a
    per-key lane, a Redis lane) refuses any other priority with a ValueError naming its
    class; a bool or a str is a TypeError on every lane."""
    lane = f.lane()
    async with f.hold(lane.acquire("k", priority=0)) as hold:
        assert hold.held
    assert await f.q(lane.acquire_timeout("k", 0, priority=0)) is True
    assert await f.q(lane.manual_release("k")) is True
    owner = next(c.__name__ for c in type(lane).__mro__ if not c.__name__.startswith("_"))
    for bad in (True, "1"):
        with pytest.raises(TypeError, match="priority"):
            lane.acquire("k", priority=bad)
    if f.counting and not f.spec.redis:  # ordered by priority
        async with f.hold(lane.acquire("k", priority=5)) as hold:
            assert hold.held
        return
    with pytest.raises(ValueError, match=rf"^{owner} takes no priority \(got 5\)"):
        lane.acquire("k", priority=5)
    with pytest.raises(ValueError, match=rf"^{owner} takes no priority \(got -1\)"):
        await f.q(lane.acquire_timeout("k", 0, priority=-1))
    assert lane.active_count == 0


# -- acquire_all: in-process and Redis lanes in one queue ---------------------------------


async def _mixed_queue(f: Face, *, x_timeout: float | None, y_timeout: float | None) -> Any:
    """A queue of this face: "x" a lane of the class under test, "y" one of the other
    backend (Redis when "x" is in-process, in-process when "x" is Redis), registered in
    that order; both one permit per key."""
    queue = f.queue()
    queue.add(f.lane("x", timeout_s=x_timeout))
    if f.spec.redis:
        y: Any = (AsyncLane if f.is_async else Lane)("y", max_concurrent=1, timeout_s=y_timeout)
        queue.add(y)
    else:
        queue.add_lane("y", max_concurrent=1, timeout_s=y_timeout, backend=f.backend())
    return queue


@contract
async def test_acquire_all_mixes_backends(f: Face) -> None:
    """``acquire_all`` takes an in-process and a Redis lane for one key, in registration
    order, and gives both back; when the second cannot be had it releases the first
    and names the lane and key."""
    queue = await _mixed_queue(f, x_timeout=5.0, y_timeout=5.0)
    x, y = queue["x"], queue["y"]
    assert queue.list_lanes() == ["x", "y"]
    async with f.hold(queue.acquire_all("k", ["y", "x"])) as holds:
        assert [h.lane for h in holds] == [x, y]
        assert holds["x"].held and holds["y"].token > 0
        assert x.active_count == 1 and y.active_count == 1
    assert x.active_count == 0 and y.active_count == 0
    assert await f.q(y.try_acquire("k")) is True  # y busy for "k"
    with pytest.raises(LaneTimeoutError) as info:
        async with f.hold(queue.acquire_all("k", ["x", "y"], timeout_s=0.1)):
            pass
    assert (info.value.lane, info.value.key) == ("y", "k")
    assert x.active_count == 0 and x.waiting == 0  # x given back
    assert await f.q(y.manual_release("k")) is True
    assert set(queue.status()) == {"x", "y"}


@contract
async def test_acquire_all_timeouts(f: Face) -> None:
    """``acquire_all``: omitted, the smallest default of its lanes; None, no limit;
    0, no wait; negative or NaN, ValueError at the call."""
    queue = await _mixed_queue(f, x_timeout=0.05, y_timeout=0.3)
    y = queue["y"]
    hold = await f.enter(y.acquire("k"))
    t0 = time.monotonic()
    with pytest.raises(LaneTimeoutError) as info:
        await f.enter(queue.acquire_all("k", ["x", "y"]))
    assert 0.05 <= _since(t0) < 0.05 + 5 and info.value.timeout_s == 0.05
    with pytest.raises(LaneTimeoutError):
        await f.enter(queue.acquire_all("k", ["x", "y"], timeout_s=0))
    for bad in (-1, math.nan):
        with pytest.raises(ValueError, match="timeout_s"):
            queue.acquire_all("k", ["x", "y"], timeout_s=bad)

    async def unlimited() -> int:
        async with f.hold(queue.acquire_all("k", ["x", "y"], timeout_s=None)) as holds:
            return len(holds)

    waiter = f.spawn(unlimited)
    await f.until(lambda: y.waiting == 1)
    await asyncio.sleep(0.5)  # past both lanes' defaults
    assert not waiter.done
    await f.leave(hold)
    assert await waiter.join() == 2
    assert queue["x"].active_count == 0 and y.active_count == 0


class _captured:
    """Capture the library's log records (a context manager yielding a handler with
    ``records``), without pytest's caplog fixture (the bodies take only ``f``)."""

    def __enter__(self) -> Any:
        self.handler = _Records()
        self.logger = logging.getLogger("lanequeue")
        self.level = self.logger.level
        self.logger.setLevel(logging.WARNING)
        self.logger.addHandler(self.handler)
        return self.handler

    def __exit__(self, *exc: object) -> None:
        self.logger.removeHandler(self.handler)
        self.logger.setLevel(self.level)


class _Records(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


@contract
async def test_raw_pair(f: Face) -> None:
    """The source design's internal pair: ``_raw_acquire`` waits the lane's timeout,
    ``_raw_release`` is ``manual_release`` (queries: coroutines on asyncio lanes)."""
    lane = f.lane(timeout_s=0.1)
    assert await f.q(lane._raw_acquire("k")) is True
    assert await f.q(lane._raw_acquire("k")) is False  # waited 0.1 s: busy
    assert lane.stats.timeouts == 1
    assert await f.q(lane._raw_release("k")) is None
    assert lane.active_count == 0


# -- operations: lifecycle, stuck holds, slow waits, metrics (Redis lanes: this process) --


@contract
async def test_drain_refuses_new_acquisitions_and_waits_for_holders(f: Face) -> None:
    """``drain()`` refuses every new acquisition at once (``acquire``, ``try_acquire``,
    ``acquire_timeout``) with LaneDrainingError; the holder finishes; with the default
    timeout it returns at once (False while held); ``wait_idle`` returns False when its
    timeout passes and True once the holder left."""
    lane = f.lane()
    hold = await f.enter(lane.acquire("k"))
    assert lane.draining is False
    assert await f.q(lane.drain()) is False
    assert lane.draining is True
    with pytest.raises(LaneDrainingError):
        await f.q(lane.try_acquire("other"))
    with pytest.raises(LaneDrainingError):
        await f.q(lane.acquire_timeout("other", 0.1))
    with pytest.raises(LaneDrainingError):
        await f.enter(lane.acquire("other"))
    assert await f.q(lane.wait_idle(0.05)) is False
    assert hold.held
    await f.leave(hold)
    assert await f.q(lane.wait_idle(BOUND_S)) is True
    assert await f.q(lane.drain(1.0)) is True
    assert lane.stats.acquired == 1 and lane.active_count == 0


@contract
async def test_drain_keeps_waiters_unless_cancel_waiting(f: Face) -> None:
    """A waiter keeps its place through ``drain()`` and is granted when the holder leaves;
    ``drain(cancel_waiting=True)`` ends the waits with LaneDrainingError, holders keep
    their permits."""
    lane = f.lane(timeout_s=None)

    async def wait_for_k() -> int:
        async with f.hold(lane.acquire("k")) as h:
            return int(h.token)

    hold = await f.enter(lane.acquire("k"))
    kept = f.spawn(wait_for_k)
    await f.until(lambda: lane.waiting == 1)
    assert await f.q(lane.drain(0.0)) is False
    await asyncio.sleep(0.05)
    assert not kept.done  # still in line
    await f.leave(hold)
    assert await kept.join() > hold.token  # served after the drain began
    assert await f.q(lane.wait_idle(BOUND_S)) is True

    lane2 = f.lane("lane2", timeout_s=None)
    hold2 = await f.enter(lane2.acquire("k"))
    ended = f.spawn(lambda: _acquire_and_return(f, lane2, "k"))
    await f.until(lambda: lane2.waiting == 1)
    assert await f.q(lane2.drain(0.0, cancel_waiting=True)) is False
    with pytest.raises(LaneDrainingError):
        await ended.join()
    assert hold2.held and lane2.active_count == 1 and lane2.waiting == 0
    await f.leave(hold2)
    assert await f.q(lane2.wait_idle(BOUND_S)) is True


async def _acquire_and_return(f: Face, lane: Any, key: str) -> int:
    async with f.hold(lane.acquire(key)) as h:
        return int(h.token)


@contract
async def test_clear_ends_the_waits_of_one_key(f: Face) -> None:
    """``clear(key)`` ends every wait for ``key`` with LaneClearedError and returns how
    many; the holder keeps its permit; the lane serves new callers afterwards."""
    lane = f.lane(timeout_s=None)
    hold = await f.enter(lane.acquire("k"))
    waiters = [f.spawn(lambda: _acquire_and_return(f, lane, "k")) for _ in range(2)]
    await f.until(lambda: lane.waiting == 2)
    assert lane.clear("other") == 0
    assert lane.clear("k") == 2
    for w in waiters:
        with pytest.raises(LaneClearedError):
            await w.join()
    assert lane.clear("k") == 0
    assert hold.held and lane.active_count == 1
    await f.until(lambda: lane.waiting == 0)
    await f.leave(hold)
    assert await _acquire_and_return(f, lane, "k") > hold.token
    with pytest.raises((TypeError, ValueError)):
        lane.clear("")


@contract
async def test_close_ends_waits_and_refuses_new_ones(f: Face) -> None:
    """``close()``: every wait ends with LaneDrainingError at once, new acquisitions are
    refused, the holder releases as usual; idempotent."""
    lane = f.lane(timeout_s=None)
    hold = await f.enter(lane.acquire("k"))
    waiter = f.spawn(lambda: _acquire_and_return(f, lane, "k"))
    await f.until(lambda: lane.waiting == 1)
    lane.close()
    with pytest.raises(LaneDrainingError):
        await waiter.join()
    assert lane.draining
    with pytest.raises(LaneDrainingError):
        await f.q(lane.try_acquire("k"))
    await f.leave(hold)
    lane.close()
    assert await f.q(lane.wait_idle(BOUND_S)) is True


@contract
async def test_queue_operations_apply_to_every_lane(f: Face) -> None:
    """A queue's ``drain``/``clear``/``stuck``/``close`` reach its lanes of every class."""
    queue = f.queue()
    lane = queue.add(f.lane("x", timeout_s=None))
    hold = await f.enter(lane.acquire("k"))
    assert [s.key for s in queue.stuck(0)["x"]] == ["k"]
    waiter = f.spawn(lambda: _acquire_and_return(f, lane, "k"))
    await f.until(lambda: lane.waiting == 1)
    assert queue.clear("k") == 1
    with pytest.raises(LaneClearedError):
        await waiter.join()
    assert await f.q(queue.drain(0.0)) is False
    assert lane.draining
    await f.leave(hold)
    assert await f.q(queue.wait_idle(BOUND_S)) is True


@contract
async def test_stuck_lists_old_holds_with_their_tokens(f: Face) -> None:
    """``stuck(s)`` lists the holds older than ``s`` seconds (key, age, fencing token),
    oldest first; ``warn_hold_s`` logs a long hold once."""
    lane = f.lane(cap=2, warn_hold_s=0.05)
    with _captured() as logs:
        first = await f.enter(lane.acquire("a"))
        await asyncio.sleep(0.1)
        second = await f.enter(lane.acquire("b"))
        found = lane.stuck(0)
        assert [(s.key, s.token) for s in found] == [("a", first.token), ("b", second.token)]
        assert found[0].age_s >= 0.1 > found[1].age_s
        assert [s.key for s in lane.stuck(0.05)] == ["a"]
        assert lane.stuck(3600) == []
        lane.stuck(0)
        long_holds = [r.getMessage() for r in logs.records if "has held" in r.getMessage()]
        assert len(long_holds) == 1 and "'a'" in long_holds[0]
        await f.leave(second)
        await f.leave(first)
    assert lane.stuck(0) == []
    with pytest.raises((TypeError, ValueError)):
        lane.stuck(-1)


@contract
async def test_a_long_hold_is_logged_once_even_if_nothing_checks_while_it_is_held(
        f: Face) -> None:
    """``warn_hold_s``: a hold that lasted longer and that no check saw while it was
    held is logged as it ends ("held its permit ... it has been released"); one a check
    logged while it was held is not logged again as it ends; a short one never. Two
    long holds of different keys are both logged (a Redis per-key lane's fencing tokens
    are per key: two keys may have the same one)."""
    lane = f.lane(cap=2, warn_hold_s=0.1)

    def lines(logs: Any, words: str) -> list[str]:
        return [r.getMessage() for r in logs.records if words in r.getMessage()]

    with _captured() as logs:
        async with f.hold(lane.acquire("short")):
            pass
        async with f.hold(lane.acquire("quiet")) as quiet:
            await asyncio.sleep(0.15)
        await f.until(lambda: lines(logs, "has been released") != [])
        [ended] = lines(logs, "has been released")
        assert ended.startswith("lane 'lane': key 'quiet' held its permit for ")
        assert f"(token {quiet.token}), past warn_hold_s" in ended
        seen = await f.enter(lane.acquire("seen"))
        also = await f.enter(lane.acquire("also"))
        await asyncio.sleep(0.15)
        lane.stuck(0)  # a check while they are held: logged now, not again at the end
        assert sorted(m.split()[3] for m in lines(logs, "has held")) == ["'also'", "'seen'"]
        await f.leave(also)
        await f.leave(seen)
        async with f.hold(lane.acquire("short")):  # (its report follows the others')
            pass
        quiet2 = await f.enter(lane.acquire("quiet2"))
        await asyncio.sleep(0.15)
        await f.leave(quiet2)
        await f.until(lambda: len(lines(logs, "has been released")) == 2)
        await asyncio.sleep(0.05)
    assert [m.split()[3] for m in lines(logs, "has been released")] == ["'quiet'",
                                                                       "'quiet2'"]
    assert len(lines(logs, "has held")) == 2
    assert not [m for m in lines(logs, "held") if "'short'" in m]


@contract
async def test_a_broken_log_handler_never_replaces_a_releases_outcome(f: Face) -> None:
    """A log handler that raises: a long hold's end (logged in the release on Redis, by
    the reporter thread in process) neither raises from the block's exit nor stops
    later reports (the reporter thread lives on)."""

    class Broken(logging.Handler):
        calls = 0

        def emit(self, record: logging.LogRecord) -> None:
            self.calls += 1
            raise RuntimeError("handler broken")

    lane = f.lane(cap=2, warn_hold_s=0.0)
    logger = logging.getLogger("lanequeue")
    broken = Broken()
    logger.addHandler(broken)
    try:
        for _ in range(2):
            async with f.hold(lane.acquire("k")):
                pass
        with pytest.raises(ValueError, match="mine"):
            async with f.hold(lane.acquire("k")):
                raise ValueError("mine")
        await f.until(lambda: broken.calls >= 3)  # (each end reached the handler)
    finally:
        logger.removeHandler(broken)
    with _captured() as logs:
        async with f.hold(lane.acquire("after")):
            pass
        await f.until(lambda: any("'after' held" in r.getMessage() for r in logs.records))
    assert lane.active_count == 0


@contract
async def test_slow_wait_is_reported_once_during_the_wait(f: Face) -> None:
    """A wait past ``warn_after_s`` is logged ONCE and ``on_wait(lane, key, waited_s,
    ahead)`` called once; a wait with a timeout is reported while it still waits (a wait
    without one may be reported when it ends, never later)."""
    calls: list[tuple[Any, str, float, int]] = []
    lane = f.lane(timeout_s=BOUND_S, warn_after_s=0.1,
                  on_wait=lambda *a: calls.append(a))
    with _captured() as logs:
        hold = await f.enter(lane.acquire("k"))
        waiter = f.spawn(lambda: _acquire_and_return(f, lane, "k"))
        await f.until(lambda: len(calls) == 1)
        assert not waiter.done  # reported during the wait
        await asyncio.sleep(0.3)
        await f.leave(hold)
        await waiter.join()
    assert len(calls) == 1
    who, key, waited, ahead = calls[0]
    assert who is lane and key == "k" and waited >= 0.1 and ahead == 0
    slow = [r.getMessage() for r in logs.records if "has waited" in r.getMessage()]
    assert len(slow) == 1 and "'k'" in slow[0]


@contract
async def test_a_wait_from_an_event_loops_thread(f: Face) -> None:
    """A thread lane's wait that parks, from a thread that runs an asyncio event loop (as
    this body does), stops that loop (maybe the holder's task) until it ends: it warns,
    once per lane, with a RuntimeWarning that names the lane and the asyncio classes and
    points at the caller's line (outside the package). A wait that need not park does not
    warn. An asyncio lane's wait parks the task, not the loop: no warning."""
    import contract_face

    lane = f.lane(timeout_s=BOUND_S, warn_after_s=None)
    other = f.lane("other", timeout_s=BOUND_S, warn_after_s=None)
    third = f.lane("third", timeout_s=BOUND_S, warn_after_s=None)
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        async with f.hold(lane.acquire("free")):  # no park: no warning
            pass
        assert await f.q(lane.try_acquire("busy"))
        for _ in range(2):
            with pytest.raises(LaneTimeoutError):
                async with f.hold(lane.acquire("busy", timeout_s=0.2)):
                    pass
        assert await f.q(other.try_acquire("busy"))
        with pytest.raises(LaneTimeoutError):  # once per lane: the other lane warns too
            async with f.hold(other.acquire("busy", timeout_s=0.2)):
                pass
        # ``wait_idle`` (and ``drain``, which waits with it) blocks too, when not idle
        assert await f.q(third.wait_idle(0.05)) is True  # idle: no wait, no warning
        assert await f.q(third.try_acquire("busy"))
        assert await f.q(third.wait_idle(0.05)) is False
    mine = [w for w in seen if issubclass(w.category, RuntimeWarning)]
    if f.is_async:
        assert mine == [], [str(w.message) for w in mine]
    else:
        assert len(mine) == 3, [str(w.message) for w in mine]
        name = type(lane).__name__
        assert [str(w.message).split(": ")[0] for w in mine] == [
            f"{name} 'lane'", f"{name} 'other'", f"{name} 'third'"]
        assert all(": a blocking wait from a thread" in str(w.message) for w in mine)
        assert f"Async{name}" in str(mine[0].message)
        # the caller's line: the adapter that entered the hold (this suite's driver),
        # and this body's own call of wait_idle
        assert [w.filename for w in mine] == [contract_face.__file__] * 2 + [__file__]
    for each in (lane, other, third):
        assert await f.q(each.manual_release("busy"))


@contract
async def test_slow_waits_count_the_waiters_ahead_in_their_line(f: Face) -> None:
    """``on_wait``'s ``ahead`` counts the waiters (of this process, on Redis) ahead in
    the line the wait is in: a key's line on a per-key lane, the lane's one line on a
    counting lane whatever their keys. Three waiters behind a holder: 0, 1, 2 (a Redis
    counting lane once said 0 for each: it counted per key)."""
    calls: list[tuple[Any, str, float, int]] = []
    lane = f.lane(timeout_s=BOUND_S, warn_after_s=0.2,
                  on_wait=lambda *a: calls.append(a))
    hold = await f.enter(lane.acquire("h"))
    keys = ["w1", "w2", "w3"] if f.counting else ["h", "h", "h"]
    waiters = []
    for i, key in enumerate(keys):
        waiters.append(f.spawn(lambda key=key: _acquire_and_return(f, lane, key)))
        await f.until(lambda i=i: lane.waiting == i + 1)
    await f.until(lambda: len(calls) == 3)
    await f.leave(hold)
    for waiter in waiters:
        await waiter.join()
    # Each waiter reports its own wait (on threads, from its own thread): the reports
    # may come in any order, so they are matched by key where the keys differ.
    assert sorted(ahead for *_, ahead in calls) == [0, 1, 2]
    if f.counting:
        assert {key: ahead for _, key, _, ahead in calls} == {"w1": 0, "w2": 1, "w3": 2}


@contract
async def test_metrics_snapshot_counts_waits_and_holds(f: Face) -> None:
    """``metrics_snapshot()`` after a scripted run: counters match ``stats``, every
    acquisition observed its wait (immediate grants as 0), every release its hold time
    (after ``track_holds``); Redis lanes label it ``scope="process"``."""
    lane = f.lane(timeout_s=None)
    lane.track_holds()
    async with f.hold(lane.acquire("k")):
        await asyncio.sleep(0.02)
    hold = await f.enter(lane.acquire("k"))
    waiter = f.spawn(lambda: _acquire_and_return(f, lane, "k"))
    await f.until(lambda: lane.waiting == 1)
    await asyncio.sleep(0.05)
    assert await f.q(lane.try_acquire("k")) is False
    snaps = lane.metrics_snapshot()
    mine = snaps[0]
    assert mine.lane == "lane" and mine.kind == ("counting" if f.counting else "session")
    assert mine.scope == ("process" if f.spec.redis else None)
    assert mine.stats.waiters == 1 and mine.stats.holders == 1
    assert mine.oldest_wait_s >= 0.05
    await f.leave(hold)
    await waiter.join()
    m = lane.metrics_snapshot()[0]
    assert m.stats == lane.stats
    assert m.stats.acquired == 3 and m.stats.rejected == 1
    assert m.wait.count == 3 and m.wait.counts[0] >= 2  # two immediate grants
    assert m.wait.sum >= 0.05
    assert m.hold is not None and m.hold.count == 3 and m.hold.sum >= 0.02
    assert m.leases_lost == 0 and m.oldest_wait_s == 0.0
    if f.spec.redis and f.counting and not f.is_async:
        wide = lane.metrics_snapshot()[1]
        assert wide.scope == "lane" and wide.stats.holders == 0
    # A timeout is observed with its length (not as 0, nor left out).
    before = m.wait.sum
    async with f.hold(lane.acquire("k")):
        with pytest.raises(LaneTimeoutError):
            await f.enter(lane.acquire("k", timeout_s=0.2))
    m = lane.metrics_snapshot()[0]
    assert m.stats.timeouts == 1 and m.wait.count == 5
    assert 0.19 <= m.wait.sum - before < 0.2 + BOUND_S
