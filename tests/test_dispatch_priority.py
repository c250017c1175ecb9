"""The dispatcher's priority reaches the counting lanes' lines, and ``blocked_by`` says
``"draining"`` when a lane the turns need is draining (asyncio, stepped fake clock)."""

from __future__ import annotations

import threading
import time

import pytest
from dispatch_helpers import Stepped, Turns

from lanequeue import LaneDrainingError, LaneQueue, ThreadDispatcher

JOIN_S = 5.0


@pytest.fixture
def turns() -> Turns:
    return Turns()


def test_turn_priority_orders_the_counting_lane_against_other_users(turns: Turns) -> None:
    """A direct acquire_all (priority 0) waits in the global lane's line first; a
    dispatcher turn submitted later with priority 5 waits there too and is served first
    when the permit comes back. A key's own turns stay FIFO whatever their priority."""
    h = Stepped(global_cap=1)
    glob = h.queue["global"]
    order: list[str] = []
    try:
        assert h.call(glob.try_acquire_nowait, "holder")

        async def direct() -> None:
            async with h.queue.acquire_all("direct", ["global"], timeout_s=JOIN_S):
                order.append("direct")

        task = h.start(direct())
        assert glob.waiting == 1

        def urgent(label: str) -> str:
            order.append(label)
            return label

        first = h.submit("k", urgent, "k1", priority=5)
        assert glob.waiting == 2  # the turn's runner is in the lane's line
        assert h.d.snapshot()["keys"]["k"]["blocked_by"] == "lanes"
        assert h.call(glob.manual_release_nowait, "holder")
        h.settle()
        assert order == ["k1", "direct"]
        assert first.done() and h.outcome(first) == ("ok", "k1") and task.done()
    finally:
        h.close()


def test_lane_priority_adds_the_levels_gained_at_the_gate(turns: Turns) -> None:
    h = Stepped(global_cap=1, ageing_s=10.0)
    try:
        h.submit("a", turns.turn, "a")  # holds the only slot
        h.submit("b", turns.turn, "b", priority=3)
        machine = h.d._machine
        job = machine._keys["b"].job
        assert job is not None and job.phase == "ready"
        assert machine.lane_priority(job) == 3
        h.advance(25.0)
        assert machine.lane_priority(job) == 5  # two whole levels of 10 s
        turns.finish("a")
        h.settle()
        turns.finish("b")
        h.settle()
    finally:
        h.close()


def test_blocked_by_draining_when_a_lane_drains(turns: Turns) -> None:
    """Turns not yet inside acquire_all that need a draining lane say "draining" (the
    lane will refuse them: they end failed with LaneDrainingError); a turn already in a
    draining lane's line stays "lanes" and is served."""
    h = Stepped(global_cap=2)
    glob = h.queue["global"]
    try:
        assert h.call(glob.try_acquire_nowait, "holder")
        h.submit("a", turns.turn, "a1")  # takes the last permit and runs
        a2 = h.submit("a", turns.turn, "a2")  # behind its key's running turn
        c = h.submit("c", turns.turn, "c")  # admitted: waits in the global lane's line
        b = h.submit("b", turns.turn, "b")  # the gate is full (2 slots): waits there
        snap = h.d.snapshot()["keys"]
        assert (snap["a"]["blocked_by"], snap["b"]["blocked_by"], snap["c"]["blocked_by"]) \
            == ("key", "global", "lanes")
        # The dispatcher's own drain blocks nothing: its pending turns still run.
        assert h.run(h.d.drain(0)) is False
        assert h.d.snapshot()["draining"] is True
        snap = h.d.snapshot()["keys"]
        assert (snap["a"]["blocked_by"], snap["b"]["blocked_by"]) == ("key", "global")

        assert h.run(glob.drain(0)) is False  # holders remain
        snap = h.d.snapshot()["keys"]
        assert (snap["a"]["blocked_by"], snap["b"]["blocked_by"], snap["c"]["blocked_by"]) \
            == ("draining", "draining", "lanes")

        # c, already in the lane's line, is served by the draining lane.
        assert h.call(glob.manual_release_nowait, "holder")
        assert turns.started() == ["a1", "c"]
        turns.finish("c")
        h.settle()
        assert h.outcome(c) == ("ok", "r:c")
        # b is admitted now and refused by the lane; a2 likewise once a1 ends.
        assert b.state == "failed" and isinstance(h.outcome(b)[1], LaneDrainingError)
        turns.finish("a1")
        h.settle()
        assert a2.state == "failed" and isinstance(h.outcome(a2)[1], LaneDrainingError)
        assert h.d.snapshot()["keys"] == {}
    finally:
        h.close()


def test_thread_dispatcher_passes_priority_to_the_lane() -> None:
    queue = LaneQueue()
    queue.add_session_lane("session", timeout_s=JOIN_S)
    glob = queue.add_lane("global", max_concurrent=1, timeout_s=JOIN_S)
    assert glob.try_acquire("holder")
    order: list[str] = []

    def direct() -> None:
        with queue.acquire_all("direct", ["global"], timeout_s=JOIN_S):
            order.append("direct")

    t = threading.Thread(target=direct, daemon=True)
    t.start()
    deadline = time.monotonic() + JOIN_S
    while glob.waiting < 1:
        assert time.monotonic() < deadline
        time.sleep(0.001)
    d = ThreadDispatcher(queue, lanes=["session", "global"], max_workers=2)
    try:
        ticket = d.submit("k", order.append, "k", priority=1)
        while glob.waiting < 2:
            assert time.monotonic() < deadline
            time.sleep(0.001)
        assert glob.manual_release("holder")
        ticket.result(JOIN_S)
        t.join(JOIN_S)
        assert not t.is_alive()
        assert order == ["k", "direct"]
    finally:
        d.close()

