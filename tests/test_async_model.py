"""A model of the asyncio lanes, checked by hypothesis over random interleavings.

One event loop with a fake clock is driven by hand (:class:`FakeClockLoop`): a rule does
one synchronous thing (start a task, cancel one, move time, run one plain loop callback)
and then lets the loop run until nothing is ready. The model says, from the rules alone,
who must hold, who must wait (in which order), who timed out or was cancelled, and what
every counter of ``lane.stats`` must read; after every rule the real lane and tasks must
match it exactly. That checks, over every interleaving hypothesis finds:

- at most one holder per key (session lane), at most ``capacity`` (counting lane), also
  counted from inside the tasks' bodies;
- FIFO among the waiters that were not cancelled or timed out (exact grant order);
- balanced books: ``acquired - released == holders``, ``waiters`` equal to the line;
- no waiter and no holder left once every task has settled (teardown).
"""

from __future__ import annotations

import asyncio
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any

import pytest
from conftest import FakeClockLoop
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
)

from lanequeue import AsyncLane, AsyncSessionLane, LaneTimeoutError

KEYS = ["a", "b", "c"]
TIMEOUTS = [None, 0, 0.5, 1.0, 2.0]  # fake-clock seconds; dyadic, so sums are exact
STEPS = [0.25, 0.5, 1.0, 3.0]
COUNTING_CAPACITY = 2


@dataclass
class Group:
    """What contends for one set of permits: a key (session lane) or the whole lane."""

    capacity: int
    holders: list[int] = field(default_factory=list)
    line: list[int] = field(default_factory=list)


@dataclass
class Counters:
    acquired: int = 0
    released: int = 0
    timeouts: int = 0
    rejected: int = 0
    cancelled: int = 0


class LaneMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.loop = FakeClockLoop()
        self.lane: Any = None
        self.kind = ""
        # real side
        self.tasks: dict[int, asyncio.Task[None]] = {}
        self.gates: dict[int, asyncio.Future[None]] = {}
        self.holds: dict[int, Any] = {}
        self.outcome: dict[int, str] = {}
        self.released_early: set[int] = set()
        self.inside: dict[str, int] = defaultdict(int)
        self.inside_total = 0
        self.max_inside_key = 0
        self.max_inside_total = 0
        self.grant_order: list[int] = []
        # model side
        self.groups: dict[str, Group] = {}
        self.key_of: dict[int, str] = {}
        self.deadline: dict[int, float | None] = {}
        self.status: dict[int, str] = {}  # waiting / holding / done / timeout / cancelled
        self.model_grants: list[int] = []
        self.counts = Counters()
        self.next_id = 0

    # -- helpers -------------------------------------------------------------------------

    def group_of(self, key: str) -> Group:
        gk = key if self.kind == "session" else "*"
        cap = 1 if self.kind == "session" else COUNTING_CAPACITY
        return self.groups.setdefault(gk, Group(cap))

    def model_grant(self, g: Group, i: int) -> None:
        g.holders.append(i)
        self.status[i] = "holding"
        self.model_grants.append(i)
        self.counts.acquired += 1

    def model_release(self, i: int) -> None:
        g = self.group_of(self.key_of[i])
        g.holders.remove(i)
        self.counts.released += 1
        if g.line:
            self.model_grant(g, g.line.pop(0))

    def model_expire(self) -> None:
        now = self.loop.fake_now
        for g in self.groups.values():
            for i in list(g.line):
                d = self.deadline[i]
                if d is not None and d <= now:
                    g.line.remove(i)
                    self.status[i] = "timeout"
                    self.counts.timeouts += 1

    def ids(self, state: str) -> list[int]:
        return sorted(i for i, s in self.status.items() if s == state)

    def holders_with_line(self) -> list[int]:
        out = []
        for g in self.groups.values():
            if g.line:
                out.extend(g.holders)
        return sorted(out)

    async def worker(self, i: int, key: str, timeout: float | None) -> None:
        hold = self.lane.acquire(key, timeout_s=timeout)
        try:
            await hold.__aenter__()
        except LaneTimeoutError:
            self.outcome[i] = "timeout"
            return
        except asyncio.CancelledError:
            self.outcome[i] = "cancelled"
            raise
        self.holds[i] = hold
        self.grant_order.append(i)
        self.inside[key] += 1
        self.inside_total += 1
        self.max_inside_key = max(self.max_inside_key, self.inside[key])
        self.max_inside_total = max(self.max_inside_total, self.inside_total)
        try:
            await self.gates[i]
            self.outcome[i] = "done"
        except asyncio.CancelledError:
            self.outcome[i] = "cancelled"
            raise
        finally:
            if i not in self.released_early:
                self.leave(i)
                hold.release_nowait()

    def leave(self, i: int) -> None:
        self.inside[self.key_of[i]] -= 1
        self.inside_total -= 1

    def release_early(self, i: int) -> None:
        """Inside a loop callback: end holder ``i``'s hold now (its task resumes later)."""
        self.released_early.add(i)
        self.leave(i)
        assert self.holds[i].release_nowait()
        self.gates[i].set_result(None)

    # -- rules ---------------------------------------------------------------------------

    @initialize(kind=st.sampled_from(["session", "counting"]))
    def setup(self, kind: str) -> None:
        self.kind = kind
        if kind == "session":
            self.lane = AsyncSessionLane("s", timeout_s=None)
        else:
            self.lane = AsyncLane("c", max_concurrent=COUNTING_CAPACITY, timeout_s=None)

    @rule(key=st.sampled_from(KEYS), timeout=st.sampled_from(TIMEOUTS))
    def start(self, key: str, timeout: float | None) -> None:
        i = self.next_id
        self.next_id += 1
        self.key_of[i] = key
        self.deadline[i] = None if timeout is None else self.loop.fake_now + timeout
        self.gates[i] = self.loop.create_future()
        self.tasks[i] = self.loop.create_task(self.worker(i, key, timeout))
        g = self.group_of(key)
        if len(g.holders) < g.capacity:
            assert not g.line
            self.model_grant(g, i)
        elif timeout == 0:
            self.status[i] = "timeout"
            self.counts.rejected += 1  # a refusal: counted apart from timeouts
        else:
            g.line.append(i)
            self.status[i] = "waiting"
        self.loop.settle()

    @precondition(lambda self: self.ids("waiting"))
    @rule(data=st.data())
    def cancel_waiter(self, data: st.DataObject) -> None:
        i = data.draw(st.sampled_from(self.ids("waiting")))
        self.tasks[i].cancel()
        self.group_of(self.key_of[i]).line.remove(i)
        self.status[i] = "cancelled"
        self.counts.cancelled += 1
        self.loop.settle()

    @precondition(lambda self: self.ids("holding"))
    @rule(data=st.data())
    def finish_holder(self, data: st.DataObject) -> None:
        i = data.draw(st.sampled_from(self.ids("holding")))
        self.gates[i].set_result(None)
        self.status[i] = "done"
        self.model_release(i)
        self.loop.settle()

    @precondition(lambda self: self.ids("holding"))
    @rule(data=st.data())
    def cancel_holder(self, data: st.DataObject) -> None:
        i = data.draw(st.sampled_from(self.ids("holding")))
        self.tasks[i].cancel()
        self.status[i] = "cancelled"
        self.model_release(i)
        self.loop.settle()

    @rule(dt=st.sampled_from(STEPS))
    def advance(self, dt: float) -> None:
        self.loop.fake_now += dt
        self.model_expire()
        self.loop.settle()

    @precondition(lambda self: self.holders_with_line())
    @rule(data=st.data(), cancel_first=st.booleans())
    def cancel_and_release_in_one_callback(self, data: st.DataObject, cancel_first: bool) -> None:
        """C10/C11/C12 kind: one plain loop callback cancels a waiter and ends a hold on
        the same key (or lane), in either order."""
        h = data.draw(st.sampled_from(self.holders_with_line()))
        g = self.group_of(self.key_of[h])
        j = data.draw(st.sampled_from(list(g.line)))

        def callback() -> None:
            if cancel_first:
                self.tasks[j].cancel()
                self.release_early(h)
            else:
                self.release_early(h)
                self.tasks[j].cancel()

        self.loop.call_soon(callback)
        self.status[h] = "done"
        self.status[j] = "cancelled"
        if not cancel_first and g.line[0] == j:
            # j is handed the permit, then cancelled before it resumes: it passes the
            # permit on as it unwinds (a grant and a release, not a cancelled wait).
            g.line.remove(j)
            g.holders.remove(h)
            self.counts.released += 1
            g.holders.append(j)  # granted in the core; j's body never runs
            self.counts.acquired += 1
            self.model_release(j)
        else:
            g.line.remove(j)
            self.counts.cancelled += 1
            self.model_release(h)
        self.loop.settle()

    @precondition(lambda self: self.holders_with_line())
    @rule(data=st.data(), dt=st.sampled_from(STEPS))
    def release_as_deadlines_pass(self, data: st.DataObject, dt: float) -> None:
        """A release and waiters' deadlines in the same loop iteration: the release (a
        ready callback) runs before the due timers, so the first in line gets the permit
        even if its own deadline is due; the timers then expire only the others."""
        h = data.draw(st.sampled_from(self.holders_with_line()))
        self.loop.call_soon(self.release_early, h)
        self.loop.fake_now += dt
        self.status[h] = "done"
        self.model_release(h)
        self.model_expire()
        self.loop.settle()

    # -- checks --------------------------------------------------------------------------

    @invariant()
    def matches_model(self) -> None:
        if self.lane is None:
            return
        lane = self.lane
        assert self.max_inside_key <= (1 if self.kind == "session" else 10**9)
        assert self.max_inside_total <= (
            len(KEYS) if self.kind == "session" else COUNTING_CAPACITY
        )
        assert self.grant_order == self.model_grants
        for i, state in self.status.items():
            task = self.tasks[i]
            if state in ("waiting", "holding"):
                assert not task.done(), (i, state)
                assert (i in self.holds) == (state == "holding"), (i, state)
            elif state == "cancelled":
                assert task.cancelled() and self.outcome[i] == "cancelled", (i, state)
            else:
                assert task.done() and not task.cancelled(), (i, state)
                assert self.outcome[i] == state, (i, state, self.outcome.get(i))
        line_total = sum(len(g.line) for g in self.groups.values())
        holders_total = sum(len(g.holders) for g in self.groups.values())
        s = lane.stats
        c = self.counts
        assert (s.acquired, s.released, s.timeouts, s.rejected, s.cancelled) == (
            c.acquired, c.released, c.timeouts, c.rejected, c.cancelled
        ), (s, c)
        assert s.unmatched_releases == 0
        assert s.acquired - s.released == s.holders == holders_total == lane.active_count
        assert s.waiters == lane.waiting == line_total
        if self.kind == "session":
            for key in KEYS:
                g = self.group_of(key)
                assert lane.waiting_for_nowait(key) == len(g.line), key
                assert lane.is_held_nowait(key) == bool(g.holders), key
        else:
            for key in KEYS:
                held = sum(1 for i in self.group_of(key).holders if self.key_of[i] == key)
                assert lane.holds_of_nowait(key) == held, key

    def teardown(self) -> None:
        try:
            if self.lane is not None:
                for task in self.tasks.values():
                    task.cancel()
                self.loop.settle()
                assert all(t.done() for t in self.tasks.values())
                s = self.lane.stats
                assert s.holders == 0 and s.waiters == 0 and self.lane.waiting == 0, s
                assert s.acquired == s.released, s
                assert self.inside_total == 0
        finally:
            self.loop.close()


LaneMachine.TestCase.settings = settings(
    max_examples=300,
    stateful_step_count=40,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
TestAsyncLaneModel = pytest.mark.timeout(110)(LaneMachine.TestCase)
