"""A hypothesis state machine over the asyncio Dispatcher on a stepped fake-clock loop:
random submits (every busy policy, priorities, start and run timeouts, dedupe ids),
cancels, clears, drains, closes and clock advances. After every step: every ticket is in
one state and a terminal state never changes; the books balance; no key keeps more
pending turns than ``max_pending``; no key ever runs two turns at once; each key's turns
begin in submit order. At the end every ticket has ended exactly once (one done-callback
each)."""

from __future__ import annotations

import asyncio
from collections import defaultdict
from typing import Any

from conftest import FakeClockLoop
from dispatch_helpers import run_on_loop
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from lanequeue import (
    AsyncLaneQueue,
    Dispatcher,
    DispatcherDrainingError,
    Ticket,
    current_turn,
)
from lanequeue.dispatch._machine import TERMINAL

KEYS = ("a", "b", "c")
POLICIES = ("enqueue", "reject", "steer", "interrupt", "replace", "collect")


class DispatcherModel(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.loop = FakeClockLoop()
        queue = AsyncLaneQueue()
        queue.add_session_lane("session", timeout_s=None)
        queue.add_lane("global", max_concurrent=2, timeout_s=None)
        self.d = Dispatcher(queue, max_pending=3, overflow="drop_oldest",
                            dedupe_ttl_s=5.0, debounce_s=0.5, max_wait_s=2.0, ageing_s=1.0)
        self.tickets: list[Ticket] = []
        self.ids: set[int] = set()
        self.label_of: dict[int, int] = {}
        self.final: dict[int, str] = {}
        self.callbacks: dict[int, int] = defaultdict(int)
        self.active: dict[str, int] = defaultdict(int)
        self.overlaps: list[str] = []
        self.begun: dict[str, list[int]] = defaultdict(list)
        self.duration: dict[int, float] = {}
        self.take_inbox: dict[int, bool] = {}
        self.deduped = 0
        self.next_label = 0
        self.draining = False

    def on_loop(self, fn: Any, *args: Any, **kw: Any) -> Any:
        return run_on_loop(self.loop, fn, *args, **kw)

    async def work(self, payload: Any) -> list[int]:
        labels = list(payload) if isinstance(payload, list) else [payload]
        turn = current_turn()
        key = turn.key
        self.active[key] += 1
        if self.active[key] > 1:
            self.overlaps.append(key)
        self.begun[key].extend(labels)
        try:
            await asyncio.sleep(self.duration[labels[0]])
            if self.take_inbox[labels[0]]:
                taken = turn.inbox.take()
                self.begun[key].extend(taken)
                labels += taken
                await asyncio.sleep(0.1)
        finally:
            self.active[key] -= 1
        return labels

    def _submit(self, key: str, policy: str, priority: int, timeout: float | None,
                run_timeout: float | None, duration: float, take: bool,
                dedupe: str | None) -> None:
        label = self.next_label
        self.next_label += 1
        self.duration[label] = duration
        self.take_inbox[label] = take
        try:
            # (Ids are scoped per key, see test_dispatch_arguments; the model's ids
            # carry their key all the same, as README advises for ids unique per chat.)
            t = self.on_loop(self.d.submit, key, self.work, label, busy=policy,
                             priority=priority, timeout_s=timeout, run_timeout_s=run_timeout,
                             dedupe_id=None if dedupe is None else f"{key}:{dedupe}")
        except DispatcherDrainingError:
            assert self.draining
            return
        assert not self.draining
        if id(t) in self.ids:
            self.deduped += 1
            assert dedupe is not None and t.dedupe_id == f"{key}:{dedupe}"
            # An id whose turn ended before it ran is forgotten: it never answers a repeat.
            began = any(self.label_of[id(t)] in labels for labels in self.begun.values())
            assert began or t.state in ("pending", "running"), t
            return
        self.ids.add(id(t))
        self.tickets.append(t)
        self.label_of[id(t)] = label

        def count(ticket: Ticket) -> None:
            self.callbacks[id(ticket)] += 1

        t.add_done_callback(count)

    # One rule per policy, so that submits are most of the steps.
    for _policy in POLICIES:
        def _rule(self: DispatcherModel, key: str, priority: int, timeout: float | None,
                  run_timeout: float | None, duration: float, take: bool,
                  dedupe: str | None, _p: str = _policy) -> None:
            self._submit(key, _p, priority, timeout, run_timeout, duration, take, dedupe)

        _rule.__name__ = f"submit_{_policy}"
        locals()[_rule.__name__] = rule(
            key=st.sampled_from(KEYS), priority=st.integers(0, 3),
            timeout=st.sampled_from([None, None, 0.7, 3.0]),
            run_timeout=st.sampled_from([None, None, 1.5]),
            duration=st.sampled_from([0.2, 1.0, 4.0]), take=st.booleans(),
            dedupe=st.sampled_from([None] * 8 + ["m1", "m2"]),
        )(_rule)
    del _rule, _policy

    @precondition(lambda self: bool(self.tickets))
    @rule(i=st.integers(0, 10_000))
    def cancel(self, i: int) -> None:
        t = self.tickets[i % len(self.tickets)]
        was_done = t.done()
        assert self.on_loop(self.d.cancel, t) is (not was_done)

    @rule(key=st.sampled_from(KEYS))
    def clear(self, key: str) -> None:
        before = self.on_loop(self.d.pending, key)
        assert self.on_loop(self.d.clear, key) == before
        assert self.on_loop(self.d.pending, key) == 0

    @rule(dt=st.sampled_from([0.1, 0.5, 1.0, 3.0]))
    def advance(self, dt: float) -> None:
        self.loop.advance(dt)

    @precondition(lambda self: not self.draining and len(self.tickets) >= 30)
    @rule()
    def drain(self) -> None:
        task = self.loop.create_task(self.d.drain(0.0))
        self.loop.settle()
        self.draining = True
        s = self.d.stats
        assert task.result() is (s.pending + s.running == 0)

    @precondition(lambda self: self.draining)
    @rule()
    def close(self) -> None:
        self.on_loop(self.d.close)
        # Nothing pending is left; running turns end once their tasks unwind.
        assert self.d.stats.pending == 0

    @invariant()
    def one_state_each(self) -> None:
        for t in self.tickets:
            if t.state in TERMINAL:
                first = self.final.setdefault(id(t), t.state)
                assert first == t.state, (t, first)
            else:
                assert t.state in ("pending", "running"), t

    @invariant()
    def books_balance(self) -> None:
        s = self.d.stats
        assert s.submitted == len(self.tickets)
        assert s.deduped == self.deduped
        ended = sum(1 for t in self.tickets if t.done())
        assert s.done + s.failed + s.cancelled + s.dropped + s.rejected + s.timed_out == ended
        assert s.pending + s.running == len(self.tickets) - ended
        assert s.failed == 0  # work() never raises
        for t in self.tickets:
            assert self.callbacks[id(t)] == (1 if t.done() else 0)

    @invariant()
    def pending_turns_stay_within_max_pending(self) -> None:
        # The line and the steered payloads not taken (the current turn not counted).
        for k in self.d._machine._keys.values():
            steered = k.job.steered if k.job is not None else []
            assert len(k.line) + len(steered) <= 3, (list(k.line), steered)

    @invariant()
    def one_turn_per_key_in_submit_order(self) -> None:
        assert not self.overlaps
        for labels in self.begun.values():
            assert labels == sorted(labels), labels

    def teardown(self) -> None:
        try:
            if not self.loop.is_closed():
                self.on_loop(self.d.close)
                self.loop.advance(10.0)
                assert all(t.done() for t in self.tickets)
                assert all(self.callbacks[id(t)] == 1 for t in self.tickets)
                assert self.d.snapshot()["keys"] == {}
        finally:
            self.loop.shutdown()


DispatcherModel.TestCase.settings = settings(
    max_examples=100, stateful_step_count=80, deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
test_dispatcher_model = DispatcherModel.TestCase
