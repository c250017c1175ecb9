"""Minimal reproductions of defects found by trying the documented API as a user.

Each test states the documented behaviour; ``xfail(strict=True)`` marks the ones the
library does not meet yet, so a fix turns them into unexpected passes (remove the mark
then)."""

from __future__ import annotations

import asyncio
import threading
import time
from typing import Any

import pytest

from lanequeue import (
    Dispatcher,
    Lane,
    LaneQueue,
    ThreadDispatcher,
    build_default_async_lanes,
    build_default_lanes,
)

pytestmark = pytest.mark.timeout(60)


# --- lanequeue status -----------------------------------------------------------------


# --- dispatcher -------------------------------------------------------------------------


@pytest.mark.xfail(strict=True, reason="a refused drain() still leaves the dispatcher draining")
def test_async_dispatcher_drain_with_bad_timeout_changes_nothing() -> None:
    async def main_() -> Any:
        d = Dispatcher(build_default_async_lanes())
        with pytest.raises(ValueError):
            await d.drain(-1)
        return await d.submit("k", lambda: 1)  # DispatcherDrainingError today

    assert asyncio.run(main_()) == 1


@pytest.mark.xfail(strict=True, reason="a refused drain() still leaves the dispatcher draining")
def test_thread_dispatcher_drain_with_bad_timeout_changes_nothing() -> None:
    d = ThreadDispatcher(build_default_lanes())
    try:
        with pytest.raises(ValueError):
            d.drain(float("nan"))
        assert d.submit("k", lambda: 1).result(5) == 1
    finally:
        d.close()


@pytest.mark.xfail(strict=True, reason="Ticket.result() on the loop thread blocks the loop")
def test_async_ticket_result_on_its_loop_does_not_block() -> None:
    """On the loop's own thread, result() can never see the turn end (the loop is
    blocked): it should refuse at once instead of freezing the loop until ``timeout``
    (forever with the default ``None``)."""

    async def work() -> int:
        await asyncio.sleep(0.01)
        return 1

    async def main_() -> float:
        d = Dispatcher(build_default_async_lanes())
        ticket = d.submit("k", work)
        start = time.monotonic()
        with pytest.raises(RuntimeError):
            ticket.result(1.0)
        await ticket
        return time.monotonic() - start

    assert asyncio.run(main_()) < 0.5


# --- argument checks ------------------------------------------------------------------


@pytest.mark.xfail(strict=True, reason="LaneQueue() takes bad warn_after_s/on_wait/warn_hold_s")
@pytest.mark.parametrize("kwargs", [{"warn_after_s": -1}, {"on_wait": 5},
                                    {"warn_hold_s": float("nan")}])
def test_lane_queue_checks_its_operations_arguments(kwargs: dict[str, Any]) -> None:
    """README: bad input fails at the call, naming the argument (and the class)."""
    with pytest.raises((TypeError, ValueError), match="LaneQueue"):
        LaneQueue(**kwargs)


@pytest.mark.xfail(strict=True, reason="a huge finite ageing_s overflows the ranks")
def test_priority_order_with_a_large_finite_ageing() -> None:
    """``ageing_s=1e308`` is accepted as a finite number of seconds > 0; with it, a
    larger priority must still be served first."""
    lane = Lane("llm", max_concurrent=1, ageing_s=1e308)
    lane.acquire_timeout("holder", 0)
    order: list[str] = []

    def call(key: str, priority: int) -> None:
        if lane.acquire_timeout(key, 5, priority=priority):
            order.append(key)
            lane.manual_release(key)

    threads = []
    for key, priority in [("p2", 2), ("p5", 5)]:
        threads.append(threading.Thread(target=call, args=(key, priority)))
        threads[-1].start()
        while lane.waiting < len(threads):
            time.sleep(0.001)
    lane.manual_release("holder")
    for t in threads:
        t.join(10)
    assert order == ["p5", "p2"]
