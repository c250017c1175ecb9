"""Bad input raises at the caller's line; timeouts None (no limit) and 0 (no wait)."""

from __future__ import annotations

import math
import numbers
import threading
import time
from decimal import Decimal
from fractions import Fraction
from typing import Any

import pytest
from conftest import ParkHooks, run_thread

from lanequeue import Lane, LaneTimeoutError, SessionLane

LANES = [
    pytest.param(lambda: Lane("l", max_concurrent=1), id="lane"),
    pytest.param(lambda: SessionLane("s"), id="session"),
]


@pytest.mark.parametrize("make", LANES)
@pytest.mark.parametrize("key", [None, 1, b"k", ("k",)])
def test_non_str_key_is_a_type_error(make: Any, key: Any) -> None:
    lane = make()
    with pytest.raises(TypeError):
        lane.acquire(key)
    with pytest.raises(TypeError):
        lane.try_acquire(key)
    with pytest.raises(TypeError):
        lane.acquire_timeout(key, 0)
    with pytest.raises(TypeError):
        lane.manual_release(key)
    assert lane.stats.acquired == 0


@pytest.mark.parametrize("make", LANES)
def test_empty_key_is_a_value_error(make: Any) -> None:
    lane = make()
    with pytest.raises(ValueError):
        lane.acquire("")
    with pytest.raises(ValueError):
        lane.try_acquire("")
    with pytest.raises(ValueError):
        lane.acquire_timeout("", 0)
    with pytest.raises(ValueError):
        lane.manual_release("")
    assert lane.stats.acquired == 0
    assert lane.stats.unmatched_releases == 0


class _Channel(str):
    """A ``str`` subclass, as ``enum.StrEnum`` members and some web frameworks hand out."""


@pytest.mark.parametrize("make", LANES)
def test_non_empty_str_subclass_key_is_not_called_empty(make: Any) -> None:
    lane = make()
    key = _Channel("slack")
    try:
        ok = lane.try_acquire(key)
    except TypeError:
        return  # refusing str subclasses outright would be a consistent choice
    # A ValueError "key must be a non-empty string" for a non-empty string is wrong.
    assert ok is True
    assert lane.manual_release(key) is True


@pytest.mark.parametrize("value", [0, -1])
def test_counts_below_one_are_value_errors(value: int) -> None:
    with pytest.raises(ValueError, match="max_concurrent"):
        Lane("l", max_concurrent=value)
    with pytest.raises(ValueError, match="max_sessions"):
        SessionLane("s", max_sessions=value)


def test_counts_of_wrong_type_are_type_errors() -> None:
    with pytest.raises(TypeError):
        Lane("l", max_concurrent=2.0)  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        SessionLane("s", max_sessions=True)


@pytest.mark.parametrize("bad", [-0.001, -1, float("nan"), -math.inf])
def test_negative_or_nan_timeouts_are_value_errors(bad: float) -> None:
    with pytest.raises(ValueError):
        Lane("l", timeout_s=bad)
    with pytest.raises(ValueError):
        SessionLane("s", timeout_s=bad)
    with pytest.raises(ValueError):
        SessionLane("s", idle_timeout_s=bad)
    for lane in (Lane("l"), SessionLane("s")):
        with pytest.raises(ValueError):
            lane.acquire_timeout("k", bad)
        with pytest.raises(ValueError):
            lane.acquire("k", timeout_s=bad)
        assert lane.stats.acquired == 0


def test_timeout_of_wrong_type_is_a_type_error() -> None:
    with pytest.raises(TypeError):
        Lane("l", timeout_s="1")  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        SessionLane("s").acquire_timeout("k", True)


@pytest.mark.parametrize("name", ["", None, 3])
def test_bad_lane_names(name: Any) -> None:
    with pytest.raises((TypeError, ValueError)):
        Lane(name)
    with pytest.raises((TypeError, ValueError)):
        SessionLane(name)


@pytest.mark.timeout(10)
@pytest.mark.parametrize("make", LANES)
def test_zero_timeout_does_not_wait(make: Any) -> None:
    lane = make()
    lane.timeout_s = 30.0
    assert lane.try_acquire("k")
    t0 = time.monotonic()
    assert lane.acquire_timeout("k", 0) is False
    with pytest.raises(LaneTimeoutError) as info, lane.acquire("k", timeout_s=0):
        pass
    assert time.monotonic() - t0 < 1.0
    assert info.value.timeout_s == 0
    assert lane.stats.rejected == 2
    assert lane.waiting == 0


@pytest.mark.timeout(20)
@pytest.mark.parametrize("make", LANES)
@pytest.mark.parametrize("how", ["acquire_timeout", "acquire"])
def test_none_timeout_waits_without_limit(park_hooks: ParkHooks, make: Any, how: str) -> None:
    lane = make()
    lane.timeout_s = 0.01  # the lane default must not apply
    lane.warn_after_s = None  # one park, not two (the slow-wait warning's split)
    assert lane.try_acquire("k")
    seen: list[float | None] = []
    park_hooks.on("W", lambda waiter, timeout: seen.append(timeout))
    box: dict[str, Any] = {}

    def waiter() -> bool:
        if how == "acquire":
            with lane.acquire("k", timeout_s=None):
                return True
        ok: bool = lane.acquire_timeout("k", None)
        if ok:
            lane.manual_release("k")
        return ok

    t = run_thread("W", waiter, box)
    assert park_hooks.parked("W").wait(10)
    assert seen == [None]  # parks with no limit
    assert lane.waiting == 1
    assert lane.manual_release("k")
    t.join(10)
    assert not t.is_alive()
    assert box["W"] is True
    assert lane.stats.holders == 0


@pytest.mark.timeout(10)
def test_positive_timeout_runs_out() -> None:
    lane = SessionLane()
    assert lane.try_acquire("k")
    box: dict[str, Any] = {}
    t = threading.Thread(target=lambda: box.setdefault("r", lane.acquire_timeout("k", 0.05)))
    t.start()
    t.join(10)
    assert box["r"] is False
    st = lane.stats
    assert st.timeouts == 1
    assert st.rejected == 0
    assert st.waiters == 0
    assert lane.waiting_for("k") == 0


@pytest.mark.timeout(10)
@pytest.mark.parametrize("make", [lambda c: Lane("l", clock=c), lambda c: SessionLane(clock=c)])
def test_clock_must_be_callable(make: Any) -> None:
    with pytest.raises(TypeError, match="clock"):
        make(None)
    with pytest.raises(TypeError, match="clock"):
        make(3.0)


def test_operation_argument_errors_name_the_public_class() -> None:
    """An argument error of an operation every lane and dispatcher inherits (close,
    drain, ...) names the public class, not the internal base it is written in."""
    from lanequeue import (
        AsyncLane,
        AsyncSessionLane,
        Dispatcher,
        ThreadDispatcher,
        build_default_async_lanes,
        build_default_lanes,
    )

    objects: list[Any] = [Lane("g"), SessionLane(), AsyncLane("a"), AsyncSessionLane(),
                          ThreadDispatcher(build_default_lanes()),
                          Dispatcher(build_default_async_lanes())]
    for obj in objects:
        name = type(obj).__name__
        with pytest.raises(TypeError, match=rf"^{name}\.close\(\) takes 1 positional"):
            obj.close(1)


QUEUE_ERRORS = [
    # (method, arguments, error, the argument the message names)
    ("add_lane", {"max_concurrent": 0}, ValueError, "max_concurrent"),
    ("add_lane", {"max_concurrent": 2.0}, TypeError, "max_concurrent"),
    ("add_lane", {"max_concurrent": True}, TypeError, "max_concurrent"),
    ("add_lane", {"timeout_s": -1}, ValueError, "timeout_s"),
    ("add_lane", {"timeout_s": "1"}, TypeError, "timeout_s"),
    ("add_lane", {"clock": 3.0}, TypeError, "clock"),
    ("add_lane", {"name": ""}, ValueError, "name"),
    ("add_lane", {"name": None}, TypeError, "name"),
    ("add_lane", {"name": ["z"]}, TypeError, "name"),  # (unhashable: once a bare TypeError)
    ("add_lane", {"backend": object()}, TypeError, "backend"),
    ("add_session_lane", {"max_sessions": 0}, ValueError, "max_sessions"),
    ("add_session_lane", {"max_sessions": None}, TypeError, "max_sessions"),
    ("add_session_lane", {"idle_timeout_s": -1}, ValueError, "idle_timeout_s"),
    ("add_session_lane", {"timeout_s": math.nan}, ValueError, "timeout_s"),
    ("add_session_lane", {"name": 3}, TypeError, "name"),
    ("add_session_lane", {"backend": "redis://"}, TypeError, "backend"),
]


@pytest.mark.parametrize("queue_type", ["LaneQueue", "AsyncLaneQueue"])
@pytest.mark.parametrize(("method", "kw", "error", "arg"), QUEUE_ERRORS)
def test_queue_argument_errors_name_the_call_the_user_made(
        queue_type: str, method: str, kw: dict[str, Any], error: type[Exception],
        arg: str) -> None:
    """``LaneQueue().add_lane("z", max_concurrent=0)`` names ``LaneQueue.add_lane()``,
    the call made, not the ``Lane()`` it builds; so do the asyncio twins. Nothing is
    registered, and a lane built directly afterwards names its own class again."""
    import lanequeue

    queue = getattr(lanequeue, queue_type)()
    with pytest.raises(error) as info:
        getattr(queue, method)(**{"name": "z", **kw})
    assert str(info.value).startswith(f"{queue_type}.{method}() argument '{arg}' "), info.value
    assert queue.list_lanes() == []
    with pytest.raises(ValueError, match=r"^Lane\(\) argument 'max_concurrent' "):
        Lane("z", max_concurrent=0)


@pytest.mark.parametrize("queue_type", ["LaneQueue", "AsyncLaneQueue"])
def test_queue_name_taken_and_clock_with_backend_name_the_call(queue_type: str) -> None:
    import lanequeue

    queue = getattr(lanequeue, queue_type)()
    queue.add_lane("z")
    with pytest.raises(ValueError, match=rf"^{queue_type}\.add_session_lane\(\) argument "
                                         r"'name': a lane named 'z' is already registered"):
        queue.add_session_lane("z")

    class Backend:  # a lane backend the clock check comes before
        def lane(self, *args: Any, **kwargs: Any) -> Any:
            raise AssertionError("not reached")

    with pytest.raises(ValueError, match=rf"^{queue_type}\.add_lane\(\) argument 'clock' "):
        queue.add_lane("y", clock=time.monotonic, backend=Backend())
    assert queue.list_lanes() == ["z"]


BAD_AGEING = [(None, TypeError), ("30", TypeError), (True, TypeError), (b"1", TypeError),
              (0, ValueError), (-1.0, ValueError), (math.inf, ValueError),
              (math.nan, ValueError), (1e308, ValueError)]


@pytest.mark.parametrize(("bad", "error"), BAD_AGEING)
def test_ageing_s_wrong_type_is_a_type_error_bad_value_a_value_error(
        bad: Any, error: type[Exception]) -> None:
    """``Lane("g", ageing_s=None)`` was a ValueError: a value of the wrong type (None, a
    str, a bool) is a TypeError, a number out of range a ValueError, both naming it."""
    from lanequeue import AsyncLane

    for cls in (Lane, AsyncLane):
        with pytest.raises(error, match=rf"^{cls.__name__}\(\) argument 'ageing_s' must be"):
            cls("g", ageing_s=bad)


def _number_checks() -> list[Any]:
    from lanequeue import _validate as v
    from lanequeue.dispatch._base import check_int
    from lanequeue.redis._args import check_lease

    return [
        pytest.param(lambda x: v.check_timeout(x, "arg"), True, id="check_timeout"),
        pytest.param(lambda x: v.check_seconds(x, "arg"), False, id="check_seconds"),
        pytest.param(lambda x: v.check_ageing(x, "arg"), False, id="check_ageing"),
        pytest.param(lambda x: v.check_count(x, "arg"), False, id="check_count"),
        pytest.param(lambda x: v.check_priority(x, "arg"), False, id="check_priority"),
        pytest.param(lambda x: check_int(x, "arg", 0), False, id="dispatch.check_int"),
        pytest.param(lambda x: check_lease(x, "arg"), False, id="redis.check_lease"),
    ]


@pytest.mark.parametrize(("check", "none_ok"), _number_checks())
@pytest.mark.parametrize("bad", [None, "1", b"1", True, False, [1], 1j])
def test_every_number_check_refuses_a_wrong_type_with_a_type_error(
        check: Any, none_ok: bool, bad: Any) -> None:
    """Where a number is expected, a value of another type is a TypeError naming the
    argument, never a ValueError: None (unless it means "no limit", as for a timeout), a
    str, bytes, and a bool (an int subclass, but True is not 1 second nor 1 permit:
    refused by every check alike)."""
    if bad is None and none_ok:
        assert check(bad) is None
        return
    with pytest.raises(TypeError, match=r"^arg must be "):
        check(bad)


def test_queue_add_errors_name_the_call_and_the_argument() -> None:
    """``add(lane)`` errors say ``LaneQueue.add() argument 'lane'`` as ``add_lane``'s say
    theirs; a lane of the other face says what to use."""
    from lanequeue import AsyncLane, AsyncLaneQueue, LaneQueue

    q = LaneQueue()
    with pytest.raises(TypeError, match=r"^LaneQueue\.add\(\) argument 'lane': 5 lacks"):
        q.add(5)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match=r"^LaneQueue\.add\(\) argument 'lane': AsyncLane "
                       r"is a lane of the 'asyncio' face.*use AsyncLaneQueue"):
        q.add(AsyncLane("a"))  # type: ignore[arg-type]
    q.add(Lane("g"))
    with pytest.raises(ValueError, match=r"^LaneQueue\.add\(\) argument 'lane': a lane "
                       r"named 'g' is already registered"):
        q.add(Lane("g"))
    with pytest.raises(TypeError, match=r"^AsyncLaneQueue\.add\(\) argument 'lane': Lane "
                       r"is a lane of the 'threads' face.*use LaneQueue"):
        AsyncLaneQueue().add(Lane("t"))  # type: ignore[arg-type]


class _Int64:
    """An integer of another integral type (as NumPy's ``int64``): not an ``int``."""

    def __init__(self, v: int) -> None:
        self.v = v

    def __index__(self) -> int:
        return self.v


numbers.Integral.register(_Int64)


@pytest.mark.parametrize(("check", "none_ok"), _number_checks())
def test_every_number_check_takes_real_numbers_of_other_types(
        check: Any, none_ok: bool) -> None:
    """A number of seconds may be any real number (``Fraction``, ``Decimal``, NumPy's
    scalars), read as a float; a count or a priority any integral number (NumPy's
    ``int64``), read as its ``int``. A float is still no count (TypeError)."""
    integral = check(_Int64(3))
    assert integral == 3 and type(integral) in (int, float)
    name = check.__code__.co_names + check.__code__.co_freevars  # which check it calls
    if "check_count" in name or "check_priority" in name or "check_int" in name:
        with pytest.raises(TypeError, match=r"^arg must be an int, not Fraction"):
            check(Fraction(3, 1))
        return
    for real, want in ((Fraction(1, 4), 0.25), (Decimal("2.5"), 2.5)):
        got = check(real)
        assert got == want and type(got) is float, (real, got)
    for nan in (Decimal("NaN"), Decimal("sNaN")):  # float() refuses the signalling one
        with pytest.raises(ValueError, match=r"^arg must "):
            check(nan)
    # Too large for a float, as 10**400 is: "no limit" for a timeout, else a ValueError.
    huge = Fraction(10**400, 3)
    if none_ok:
        assert check(huge) is None
    else:
        with pytest.raises(ValueError, match=r"^arg must "):
            check(huge)
    with pytest.raises(ValueError, match=r"^arg must ") as info:
        check(-huge)
    assert len(str(info.value)) < 200  # the huge value is shown shortened


@pytest.mark.parametrize("bad", [None, "yes", 1, 0])
def test_check_bool_refuses_what_is_not_a_bool(bad: Any) -> None:
    from lanequeue._validate import check_bool

    with pytest.raises(TypeError, match=r"^arg must be a bool"):
        check_bool(bad, "arg")


@pytest.mark.parametrize("bad", [None, 1, True, b"k"])
def test_check_key_refuses_what_is_not_a_str(bad: Any) -> None:
    from lanequeue._validate import check_key

    with pytest.raises(TypeError, match=r"^arg must be a str"):
        check_key(bad, "arg")
