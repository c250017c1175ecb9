"""Bad input raises at the caller's line; timeouts None (no limit) and 0 (no wait)."""

from __future__ import annotations

import math
import threading
import time
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
