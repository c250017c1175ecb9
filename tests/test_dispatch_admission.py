"""Busy policies against the key's bound and the turn's contents, one test body over both
dispatchers (the asyncio ``Dispatcher`` on the manually stepped FakeClockLoop, the
``ThreadDispatcher`` on a fake clock with worker threads): admission is decided before a
policy drops or interrupts anything; steered turns not taken are pending turns (bounded by
``max_pending``, superseded by ``replace`` and ``interrupt``); a ``collect`` call carries
exactly the tickets left in it when it starts; a steered ticket's ``run_timeout_s`` bounds
the turn that takes it. Turn functions move only when the test opens their gates."""

from __future__ import annotations

import asyncio
import threading
import time
from collections import defaultdict
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from conftest import FakeClock
from dispatch_helpers import Stepped

from lanequeue import (
    LaneQueue,
    ThreadDispatcher,
    Ticket,
    TurnCancelledError,
    TurnDroppedError,
    TurnRejectedError,
    TurnTimedOutError,
    current_turn,
)

WAIT = 5.0
POLICIES = ("enqueue", "reject", "steer", "interrupt", "replace", "collect")


def label(payload: Any) -> str:
    """A payload as it appears in gate names: a merged call's payloads joined by ``+``."""
    return "+".join(payload) if isinstance(payload, list) else str(payload)


class Face:
    """A dispatcher and turn functions built from steps, the same for both faces.

    ``fn(*steps)`` makes a turn function of one payload that logs ("start", payload,
    ids of ``current_turn().tickets``), then runs each step: ``("gate", name)`` marks
    ``name`` reached and waits until :meth:`go` opens it (a ``*`` in ``name`` stands for
    the payload's :func:`label`);
    ``("take",)`` takes the inbox, logs ("took", payloads). It returns
    ``[payload, *payloads taken]``."""

    name = ""

    def __init__(self) -> None:
        self.log: list[tuple[Any, ...]] = []
        self.turns: dict[Any, Any] = {}  # payload -> its Turn (current_turn())
        self.d: Any = None

    # Each face implements these.
    def fn(self, *steps: tuple[Any, ...]) -> Callable[[Any], Any]:
        raise NotImplementedError

    def go(self, gate: str) -> None:
        raise NotImplementedError

    def reached(self, gate: str) -> None:
        """Return once some turn waits at ``gate`` (fails the test after WAIT s)."""
        raise NotImplementedError

    def outcome(self, t: Ticket) -> tuple[str, Any]:
        """Wait for ``t`` to end: ("ok", value) or ("err", exception)."""
        raise NotImplementedError

    def advance(self, seconds: float) -> None:
        """Move the dispatcher's clock; return once every timer due then has fired."""
        raise NotImplementedError

    def cancelled(self, payload: Any) -> None:
        """Return once the turn of ``payload`` was asked to end (fails after WAIT s)."""
        raise NotImplementedError

    def submit(self, key: str, fn: Any, payload: Any, **kw: Any) -> Ticket:
        raise NotImplementedError

    def cancel(self, t: Ticket) -> bool:
        raise NotImplementedError

    def idle(self) -> None:
        raise NotImplementedError

    def close(self) -> None:
        raise NotImplementedError

    def started(self) -> list[Any]:
        return [e[1] for e in self.log if e[0] == "start"]

    def books(self) -> None:
        s = self.d.stats
        assert s.submitted == (s.done + s.failed + s.cancelled + s.dropped + s.rejected
                               + s.timed_out + s.pending + s.running), s

    def _begin(self, payload: Any) -> Any:
        turn = current_turn()
        key = tuple(payload) if isinstance(payload, list) else payload
        self.turns[key] = turn
        self.log.append(("start", payload, [t.id for t in turn.tickets]))
        return turn

    def _take(self, turn: Any) -> list[Any]:
        taken: list[Any] = turn.inbox.take()
        self.log.append(("took", taken))
        return taken


class AsyncFace(Face):
    name = "asyncio"

    def __init__(self, global_cap: int, **kw: Any) -> None:
        super().__init__()
        self.h = Stepped(global_cap, **kw)
        self.d = self.h.d
        self.gates: dict[str, asyncio.Event] = defaultdict(asyncio.Event)
        self.at: set[str] = set()

    def fn(self, *steps: tuple[Any, ...]) -> Callable[[Any], Any]:
        async def turn_fn(payload: Any) -> list[Any]:
            turn = self._begin(payload)
            out = [payload]
            for step in steps:
                if step[0] == "gate":
                    gate = step[1].replace("*", label(payload))
                    self.at.add(gate)
                    await self.gates[gate].wait()
                else:
                    out += self._take(turn)
            return out

        return turn_fn

    def go(self, gate: str) -> None:
        self.gates[gate].set()
        self.h.settle()

    def reached(self, gate: str) -> None:
        self.h.settle()
        assert gate in self.at, (gate, self.at)

    def outcome(self, t: Ticket) -> tuple[str, Any]:
        self.h.settle()
        result: tuple[str, Any] = self.h.outcome(t)
        return result

    def advance(self, seconds: float) -> None:
        self.h.advance(seconds)

    def cancelled(self, payload: Any) -> None:
        self.h.settle()
        assert self.turns[payload].cancelled

    def submit(self, key: str, fn: Any, payload: Any, **kw: Any) -> Ticket:
        return self.h.submit(key, fn, payload, **kw)

    def cancel(self, t: Ticket) -> bool:
        done: bool = self.h.call(t.cancel)
        return done

    def idle(self) -> None:
        assert self.h.run(self.d.wait_idle(0)) is True

    def close(self) -> None:
        self.h.close()


class ThreadFace(Face):
    name = "threads"

    def __init__(self, global_cap: int, **kw: Any) -> None:
        super().__init__()
        self.clock = FakeClock()
        q = LaneQueue()
        q.add_session_lane("session")
        q.add_lane("global", max_concurrent=global_cap)
        self.d = ThreadDispatcher(q, clock=self.clock, **kw)
        self.lock = threading.Lock()
        self.gates: dict[str, threading.Event] = defaultdict(threading.Event)
        self.at: dict[str, threading.Event] = defaultdict(threading.Event)

    def _events(self, gate: str) -> tuple[threading.Event, threading.Event]:
        with self.lock:
            return self.gates[gate], self.at[gate]

    def fn(self, *steps: tuple[Any, ...]) -> Callable[[Any], Any]:
        def turn_fn(payload: Any) -> list[Any]:
            with self.lock:
                turn = self._begin(payload)
            out = [payload]
            for step in steps:
                if step[0] == "gate":
                    gate = step[1].replace("*", label(payload))
                    go, at = self._events(gate)
                    at.set()
                    assert go.wait(WAIT), f"gate {gate} never opened"
                else:
                    with self.lock:
                        out += self._take(turn)
            return out

        return turn_fn

    def go(self, gate: str) -> None:
        self._events(gate)[0].set()

    def reached(self, gate: str) -> None:
        assert self._events(gate)[1].wait(WAIT), f"no turn reached gate {gate}"

    def outcome(self, t: Ticket) -> tuple[str, Any]:
        try:
            return ("ok", t.result(WAIT))
        except BaseException as exc:
            return ("err", exc)

    def advance(self, seconds: float) -> None:
        self.clock.advance(seconds)
        # The dispatcher's one timer thread runs its timers in due order: one due now
        # fires after every timer that came due with this advance.
        fence = threading.Event()
        self.d._call_later(0.0, fence.set)
        assert fence.wait(WAIT)

    def cancelled(self, payload: Any) -> None:
        with self.lock:
            turn = self.turns[payload]
        assert turn.cancel_event.wait(WAIT)

    def submit(self, key: str, fn: Any, payload: Any, **kw: Any) -> Ticket:
        t: Ticket = self.d.submit(key, fn, payload, **kw)
        return t

    def cancel(self, t: Ticket) -> bool:
        return t.cancel()

    def idle(self) -> None:
        assert self.d.wait_idle(WAIT) is True

    def close(self) -> None:
        self.d.close()  # no turn starts after this; the running ones are let go
        with self.lock:
            gates = list(self.gates.values())
        for go in gates:
            go.set()
        assert self.d.wait_idle(WAIT)


@pytest.fixture(params=["asyncio", "threads"])
def make(request: pytest.FixtureRequest) -> Iterator[Callable[..., Face]]:
    made: list[Face] = []

    def build(global_cap: int = 8, **kw: Any) -> Face:
        face: Face = (AsyncFace if request.param == "asyncio" else ThreadFace)(global_cap, **kw)
        made.append(face)
        return face

    yield build
    for face in made:
        face.close()


def kind(face: Face, t: Ticket) -> tuple[str, str | None]:
    face.outcome(t)
    return (t.state, t.reason)


# -- 1. collect: the call carries the tickets left in it when it starts ---------------------


def test_collect_call_passes_only_the_tickets_still_in_it_when_it_starts(
        make: Callable[..., Face]) -> None:
    """A merged job waits at the gate (one slot, taken by another key); one of its
    tickets is cancelled, another's start deadline passes: the call gets the payloads of
    the others, ``current_turn().tickets`` lists exactly them, ``merged`` counts them."""
    h = make(global_cap=1, busy="collect")
    work = h.fn(("gate", "work"))
    first = h.submit("k", work, "p0", busy="enqueue")
    h.reached("work")
    other = h.submit("other", h.fn(("gate", "other")), "o", busy="enqueue")
    a = h.submit("k", work, "a")
    b = h.submit("k", work, "b", timeout_s=5.0)
    c = h.submit("k", work, "c")
    d = h.submit("k", work, "d")
    # p0 ends; "other" was at the gate first: it runs, k's merged job [a, b, c, d] waits.
    h.go("work")
    assert h.outcome(first) == ("ok", ["p0"])
    h.reached("other")
    assert h.d.snapshot()["keys"]["k"]["blocked_by"] == "global"
    assert h.d.pending("k") == 4
    assert h.cancel(c) is True
    assert (c.state, c.reason) == ("cancelled", "cancelled")
    h.advance(5.0)
    assert kind(h, b) == ("timed_out", "start timeout")
    assert h.d.pending("k") == 2
    assert h.d.stats.merged == 0  # nothing merged has run yet
    h.go("other")
    assert h.outcome(other) == ("ok", ["o"])
    assert h.outcome(a) == h.outcome(d) == ("ok", [["a", "d"]])
    assert isinstance(h.outcome(c)[1], TurnCancelledError)
    assert isinstance(h.outcome(b)[1], TurnTimedOutError)
    starts = [e for e in h.log if e[0] == "start" and isinstance(e[1], list)]
    assert starts == [("start", ["a", "d"], [a.id, d.id])]
    s = h.d.stats
    assert (s.merged, s.done, s.cancelled, s.timed_out) == (1, 4, 1, 1)
    h.books()
    h.idle()


def test_collect_call_without_its_first_ticket_is_led_by_the_next(
        make: Callable[..., Face]) -> None:
    """The merged job's first ticket ends before the start: the call carries the rest,
    ``current_turn().ticket`` is the next one."""
    h = make(global_cap=1, busy="collect")
    work = h.fn(("gate", "work"))
    h.submit("k", work, "p0", busy="enqueue")
    h.reached("work")
    other = h.submit("other", h.fn(("gate", "other")), "o", busy="enqueue")
    a = h.submit("k", work, "a")
    b = h.submit("k", work, "b")
    h.go("work")
    h.reached("other")
    assert h.cancel(a) is True
    h.go("other")
    assert h.outcome(other) == ("ok", ["o"])
    assert h.outcome(b) == ("ok", [["b"]])
    assert h.turns[("b",)].ticket is b
    assert h.d.stats.merged == 0
    h.books()


def test_a_merged_job_ranks_by_the_tickets_left_in_it(make: Callable[..., Face]) -> None:
    """A job's priority is the largest of its tickets: when the high-priority ticket of a
    merged job waiting at the gate is cancelled, the job ranks by the ones left."""
    h = make(global_cap=1, busy="collect", ageing_s=None)
    work = h.fn(("gate", "go-*"))
    k0 = h.submit("k", work, "k0", busy="enqueue")
    h.reached("go-k0")
    z = h.submit("z", work, "z", busy="enqueue", priority=9)
    j = h.submit("j", work, "j", busy="enqueue", priority=3)
    hi = h.submit("k", work, "hi", priority=5)
    lo = h.submit("k", work, "lo")
    h.go("go-k0")
    h.reached("go-z")  # z went first; k's merged job [hi, lo] (priority 5) and j wait
    assert h.cancel(hi) is True  # [lo]: priority 0, now behind j
    h.go("go-z")
    h.reached("go-j")
    assert h.started() == ["k0", "z", "j"]
    h.go("go-j")
    h.reached("go-lo")
    h.go("go-lo")
    assert h.outcome(lo) == ("ok", [["lo"]])
    assert [h.outcome(t)[0] for t in (k0, z, j)] == ["ok"] * 3
    h.books()


# -- 2. replace and interrupt supersede steered turns not taken -----------------------------


@pytest.mark.parametrize("policy", ["replace", "interrupt"])
def test_replace_and_interrupt_drop_steered_turns_not_taken(
        make: Callable[..., Face], policy: str) -> None:
    dropped: list[list[Ticket]] = []
    h = make(busy="steer", on_drop=dropped.append)
    reply = h.fn(("gate", "reply"))
    m0 = h.submit("conv", reply, "m0")
    h.reached("reply")
    old = [h.submit("conv", reply, m) for m in ("m1", "m2")]
    assert [t.state for t in old] == ["pending", "pending"] and h.d.pending("conv") == 2
    m3 = h.submit("conv", reply, "m3", busy=policy)
    for t in old:
        assert (t.state, t.reason) == ("dropped", "superseded")
        assert isinstance(h.outcome(t)[1], TurnDroppedError)
    assert dropped == [old]
    if policy == "replace":
        assert h.d.pending("conv") == 1 and m3.state == "pending"
    else:  # (an asyncio turn is cancelled as a task: m3 may be running already)
        h.cancelled("m0")
        assert h.d.pending("conv") <= 1 and m3.state in ("pending", "running")
    h.go("reply")
    if policy == "replace":
        assert h.outcome(m0) == ("ok", ["m0"])  # the running turn goes on
    else:
        assert kind(h, m0) == ("cancelled", "superseded")
    assert h.outcome(m3) == ("ok", ["m3"])
    assert h.started() == ["m0", "m3"]
    assert h.d.stats.dropped == 2
    h.books()
    h.idle()


# -- 3. steered turns are pending turns: max_pending and overflow apply ---------------------


@pytest.mark.parametrize("overflow", ["reject_new", "drop_oldest"])
def test_steered_turns_count_against_max_pending(
        make: Callable[..., Face], overflow: str) -> None:
    dropped: list[list[Ticket]] = []
    h = make(busy="steer", max_pending=2, overflow=overflow, on_drop=dropped.append)
    reply = h.fn(("gate", "reply"), ("take",))
    m0 = h.submit("conv", reply, "m0")
    h.reached("reply")
    steered = [h.submit("conv", reply, f"m{i}") for i in range(1, 6)]
    assert h.d.pending("conv") == 2
    if overflow == "reject_new":
        kept, gone = steered[:2], steered[2:]
        for t in gone:
            assert kind(h, t) == ("rejected", "overflow")
            assert isinstance(h.outcome(t)[1], TurnRejectedError)
        assert dropped == []
    else:
        kept, gone = steered[3:], steered[:3]  # the oldest go, the newest stay
        for t in gone:
            assert kind(h, t) == ("dropped", "overflow")
        assert dropped == [[t] for t in gone]
    assert all(t.state == "pending" for t in kept)
    h.go("reply")
    payloads = ["m0", *(t.args[0] for t in kept)]
    assert h.outcome(m0) == ("ok", payloads)
    assert all(h.outcome(t) == ("ok", payloads) for t in kept)
    assert h.d.stats.steered == 2
    h.books()
    h.idle()


@pytest.mark.parametrize("overflow", ["reject_new", "drop_oldest"])
def test_steered_and_queued_turns_share_the_bound(
        make: Callable[..., Face], overflow: str) -> None:
    """One steered turn and one queued turn fill ``max_pending=2``; a third is rejected
    (``reject_new``) or the oldest pending one, the steered turn, is dropped."""
    h = make(busy="steer", max_pending=2, overflow=overflow)
    reply = h.fn(("gate", "reply"))
    m0 = h.submit("conv", reply, "m0")
    h.reached("reply")
    s1 = h.submit("conv", reply, "s1")  # steered
    q2 = h.submit("conv", reply, "q2", busy="enqueue")  # queued
    q3 = h.submit("conv", reply, "q3", busy="enqueue")
    assert h.d.pending("conv") == 2
    if overflow == "reject_new":
        assert kind(h, q3) == ("rejected", "overflow")
        order = ["m0", "s1", "q2"]
    else:
        assert kind(h, s1) == ("dropped", "overflow")
        order = ["m0", "q2", "q3"]
    h.go("reply")
    assert h.outcome(m0) == ("ok", ["m0"])
    h.idle()
    assert h.started() == order  # a steered turn never taken runs next, in submit order
    assert h.outcome(q2) == ("ok", ["q2"])
    h.books()


# -- 4. admission before any destructive step ---------------------------------------------


@pytest.mark.parametrize("overflow", ["reject_new", "drop_oldest"])
@pytest.mark.parametrize("policy", POLICIES)
def test_a_rejected_turn_changes_nothing(make: Callable[..., Face], policy: str,
                                         overflow: str) -> None:
    """``max_pending=0``: no turn may wait. Whatever the policy and the overflow rule
    (none pending: nothing to drop), a busy key's new turn is rejected at once and the
    running turn goes on untouched (interrupt cancels nothing, replace drops nothing)."""
    dropped: list[list[Ticket]] = []
    h = make(max_pending=0, overflow=overflow, on_drop=dropped.append)
    reply = h.fn(("gate", "reply"))
    old = h.submit("conv", reply, "old", busy="enqueue")
    h.reached("reply")
    new = h.submit("conv", reply, "new", busy=policy)
    assert kind(h, new) == ("rejected", "busy" if policy == "reject" else "overflow")
    assert old.state == "running" and not h.turns["old"].cancelled
    h.go("reply")
    assert h.outcome(old) == ("ok", ["old"])
    s = h.d.stats
    assert (s.done, s.rejected, s.cancelled, s.dropped) == (1, 1, 0, 0)
    assert dropped == [] and h.started() == ["old"]
    h.books()


@pytest.mark.parametrize("policy", ["interrupt", "replace"])
def test_interrupt_and_replace_need_one_pending_place(
        make: Callable[..., Face], policy: str) -> None:
    """With ``max_pending=1`` the new turn of interrupt/replace is admitted (it is the only
    pending turn left), whatever the line held before."""
    h = make(max_pending=1)
    reply = h.fn(("gate", "reply"))
    old = h.submit("conv", reply, "old", busy="enqueue")
    h.reached("reply")
    queued = h.submit("conv", reply, "queued", busy="enqueue")
    new = h.submit("conv", reply, "new", busy=policy)
    assert kind(h, queued) == ("dropped", "superseded")
    assert h.d.pending("conv") <= 1 and new.state in ("pending", "running")
    h.go("reply")
    if policy == "interrupt":
        assert kind(h, old) == ("cancelled", "superseded")
    else:
        assert h.outcome(old) == ("ok", ["old"])
    assert h.outcome(new) == ("ok", ["new"])
    h.books()


# -- 5. a steered ticket's run_timeout_s bounds the turn that takes it ----------------------


def test_a_steered_tickets_run_timeout_counts_from_when_it_is_taken(
        make: Callable[..., Face]) -> None:
    h = make(busy="steer")
    reply = h.fn(("gate", "read"), ("take",), ("gate", "write"))
    a = h.submit("c", reply, "a")  # no run timeout of its own
    h.reached("read")
    b = h.submit("c", reply, "b", run_timeout_s=10.0)
    h.advance(3.0)  # b waits in the inbox: its run timeout has not begun
    h.go("read")
    h.reached("write")  # b taken at +3: the turn may run until +13
    h.advance(9.5)
    assert not h.turns["a"].cancelled and a.state == b.state == "running"
    h.advance(0.5)
    h.cancelled("a")
    h.go("write")
    assert kind(h, a) == ("timed_out", "run timeout")
    assert kind(h, b) == ("timed_out", "run timeout")
    assert isinstance(h.outcome(b)[1], TurnTimedOutError)
    h.books()


def test_a_steered_ticket_never_lengthens_the_turns_run_timeout(
        make: Callable[..., Face]) -> None:
    h = make(busy="steer")
    reply = h.fn(("gate", "read"), ("take",), ("gate", "write"))
    a = h.submit("c", reply, "a", run_timeout_s=5.0)
    h.reached("read")
    b = h.submit("c", reply, "b", run_timeout_s=100.0)
    h.advance(1.0)
    h.go("read")
    h.reached("write")
    h.advance(4.0)  # a's own bound, from the start
    h.cancelled("a")
    h.go("write")
    assert kind(h, a) == ("timed_out", "run timeout")
    assert kind(h, b) == ("timed_out", "run timeout")


def test_a_steered_ticket_not_taken_runs_under_its_own_run_timeout(
        make: Callable[..., Face]) -> None:
    h = make(busy="steer")
    reply = h.fn(("gate", "reply-*"))
    a = h.submit("c", reply, "a")
    h.reached("reply-a")
    b = h.submit("c", reply, "b", run_timeout_s=2.0)
    h.advance(50.0)  # not taken: b's bound has not begun, a runs on
    assert not h.turns["a"].cancelled
    h.go("reply-a")
    assert h.outcome(a) == ("ok", ["a"])
    h.reached("reply-b")  # b runs as its own turn next, under its own bound
    h.advance(1.5)
    assert not h.turns["b"].cancelled
    h.advance(0.5)
    h.cancelled("b")
    h.go("reply-b")
    assert kind(h, b) == ("timed_out", "run timeout")
    assert h.started() == ["a", "b"]


def test_a_merged_call_runs_under_the_smallest_run_timeout_of_its_tickets(
        make: Callable[..., Face]) -> None:
    h = make(busy="collect")
    work = h.fn(("gate", "go-*"))
    h.submit("k", work, "k0", busy="enqueue")
    h.reached("go-k0")
    a = h.submit("k", work, "a", run_timeout_s=10.0)
    b = h.submit("k", work, "b", run_timeout_s=4.0)
    h.go("go-k0")
    h.reached("go-a+b")  # one call for a and b, from now
    h.advance(3.5)
    assert not h.turns[("a", "b")].cancelled
    h.advance(0.5)
    h.cancelled(("a", "b"))
    h.go("go-a+b")
    assert kind(h, a) == kind(h, b) == ("timed_out", "run timeout")
    h.books()


def test_pending_counts_the_turn_admitted_and_waiting_for_its_lanes() -> None:
    """As the README's Views say: ``pending(key)`` counts the turns not started, the one
    admitted and waiting for its lanes included, which ``max_pending`` does not count."""
    q = LaneQueue()
    q.add_session_lane("session", timeout_s=None)
    glob = q.add_lane("global", max_concurrent=1, timeout_s=None)
    assert glob.try_acquire("elsewhere")  # the lanes are busy: the turn waits for them
    d = ThreadDispatcher(q, max_pending=0)
    try:
        first = d.submit("k", lambda: "first")
        deadline = time.monotonic() + WAIT
        while d.snapshot()["keys"]["k"]["blocked_by"] != "lanes":
            assert time.monotonic() < deadline
            time.sleep(0.005)
        assert d.pending("k") == 1
        assert isinstance(d.submit("k", lambda: "second").exception(WAIT), TurnRejectedError)
        assert glob.manual_release("elsewhere")
        assert first.result(WAIT) == "first"
        assert d.pending("k") == 0
    finally:
        d.close()
