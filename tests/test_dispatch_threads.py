"""The thread-pool dispatcher: the same state machine, turns in worker threads. Driven by
events (a turn runs until the test sets its event) and a fake clock (deadlines, run
timeouts); every wait is bounded."""

from __future__ import annotations

import asyncio
import concurrent.futures
import gc
import random
import threading
import time
from collections import defaultdict
from typing import Any

import pytest
from conftest import FakeClock

from lanequeue import (
    AsyncLaneQueue,
    Dispatcher,
    DispatcherDrainingError,
    LaneQueue,
    ThreadDispatcher,
    TurnCancelledError,
    TurnTimedOutError,
    build_default_async_lanes,
    current_turn,
)

WAIT = 5.0


def lanes(global_cap: int = 8) -> LaneQueue:
    q = LaneQueue()
    q.add_session_lane("session")
    q.add_lane("global", max_concurrent=global_cap)
    return q


class _Events(defaultdict[Any, threading.Event]):
    """A label's event, made once under a lock: a plain defaultdict read from two threads
    at once may make two events for one label (its factory is Python code, so the GIL
    can switch between the miss and the store), and each thread then waits on its own."""

    def __init__(self, lock: threading.Lock) -> None:
        super().__init__(threading.Event)
        self._lock = lock

    def __missing__(self, label: Any) -> threading.Event:
        with self._lock:
            if label not in self:
                self[label] = threading.Event()
            return self[label]


class Gates:
    """Thread turn functions: ``turn(label)`` sets started[label], waits for go[label]."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.started: dict[Any, threading.Event] = _Events(threading.Lock())
        self.go: dict[Any, threading.Event] = _Events(threading.Lock())
        self.order: list[Any] = []

    def turn(self, label: Any) -> str:
        with self.lock:
            self.order.append(label)
            started, go = self.started[label], self.go[label]
        started.set()
        assert go.wait(WAIT), f"turn {label} was never let go"
        return f"r:{label}"


def test_interrupt_keeps_the_lanes_until_the_thread_returns() -> None:
    q = lanes()
    d = ThreadDispatcher(q, busy="interrupt")
    saw_cancel = threading.Event()
    may_return = threading.Event()
    second_started = threading.Event()
    first_started = threading.Event()

    def first() -> str:
        turn = current_turn()
        first_started.set()
        assert turn.cancel_event.wait(WAIT)  # a thread turn polls its cancel event
        saw_cancel.set()
        assert may_return.wait(WAIT)
        return "finished anyway"

    def second() -> str:
        second_started.set()
        return "second"

    try:
        t1 = d.submit("k", first)
        assert first_started.wait(WAIT)  # running: the second turn interrupts it
        t2 = d.submit("k", second)
        assert saw_cancel.wait(WAIT)
        # The interrupted thread still runs: it keeps the key's lane, the next waits.
        assert q["session"].is_held("k")
        assert not second_started.is_set() and t1.state == "running"
        may_return.set()
        assert t2.result(WAIT) == "second"
        with pytest.raises(TurnCancelledError) as info:
            t1.result(WAIT)
        assert info.value.reason == "superseded"
    finally:
        may_return.set()
        d.close()


@pytest.mark.timeout(30)
def test_timeout_zero_runs_on_an_idle_key_and_never_waits() -> None:
    """``timeout_s=0`` is "start now or not at all", as on the lanes, on both
    dispatchers: a turn for an idle key with free lanes runs (the thread dispatcher
    once timed out 20 of 20: its start timer, due at once, won the race with the
    runner); one that would wait, behind its key's turn or for a full lane, ends
    ``timed_out`` ("start timeout") at once, its function never called."""
    gates = Gates()
    d = ThreadDispatcher(lanes(global_cap=2))
    try:
        for i in range(20):
            assert d.submit(f"idle-{i}", str, i, timeout_s=0).result(WAIT) == str(i)
        running = d.submit("busy", gates.turn, "busy")
        assert gates.started["busy"].wait(WAIT)
        behind = d.submit("busy", gates.turn, "never", timeout_s=0)
        assert behind.state == "timed_out" and behind.reason == "start timeout"
        other = d.submit("other", gates.turn, "other")  # the global lane is now full
        assert gates.started["other"].wait(WAIT)
        full = d.submit("third", gates.turn, "never", timeout_s=0)
        with pytest.raises(TurnTimedOutError):
            full.result(WAIT)
        assert full.reason == "start timeout"
        gates.go["busy"].set()
        gates.go["other"].set()
        assert running.result(WAIT) == "r:busy" and other.result(WAIT) == "r:other"
        assert "never" not in gates.order
    finally:
        d.close()

    async def main() -> None:
        q = AsyncLaneQueue()
        q.add_session_lane("session")
        q.add_lane("global", max_concurrent=2)
        ad = Dispatcher(q)
        go = asyncio.Event()

        async def hold() -> str:
            await go.wait()
            return "held"

        async def never() -> str:
            raise AssertionError("a turn that may not wait ran")

        async def ok() -> str:
            return "ran"

        assert await ad.submit("idle", ok, timeout_s=0) == "ran"
        first = ad.submit("busy", hold)
        await asyncio.sleep(0.01)
        behind = ad.submit("busy", never, timeout_s=0)
        assert behind.state == "timed_out" and behind.reason == "start timeout"
        go.set()
        assert await first == "held"
        ad.close()

    asyncio.run(main())


@pytest.mark.timeout(30)
def test_timeout_zero_does_not_wait_for_a_collect_window() -> None:
    """``timeout_s=0`` under ``collect`` with a ``debounce_s``: on an idle key the turn
    runs at once, a batch of one (the window used to hold it back past its deadline, so
    it always ended ``timed_out`` and never ran); behind a batch pending in its window
    the key is busy, and it ends ``timed_out`` at once, the batch untouched."""
    window = 60.0  # longer than the test's bound: a turn held by it would never run
    d = ThreadDispatcher(lanes(), busy="collect", debounce_s=window)
    try:
        assert d.submit("idle", list, "x", timeout_s=0).result(WAIT) == ["x"]
        pending = d.submit("open", list, "a")  # its window is open for 60 s
        behind = d.submit("open", list, "b", timeout_s=0)
        assert behind.state == "timed_out" and behind.reason == "start timeout"
        assert pending.state == "pending" and d.pending("open") == 1
    finally:
        d.close()

    async def main() -> None:
        ad = Dispatcher(build_default_async_lanes(), busy="collect", debounce_s=window)

        async def batch(texts: list[str]) -> list[str]:
            return texts

        assert await ad.submit("idle", batch, "x", timeout_s=0) == ["x"]
        pending = ad.submit("open", batch, "a")
        behind = ad.submit("open", batch, "b", timeout_s=0)
        assert behind.state == "timed_out" and behind.reason == "start timeout"
        assert pending.state == "pending" and ad.pending("open") == 1
        ad.close()

    asyncio.run(main())



@pytest.mark.timeout(30)
@pytest.mark.parametrize("how", ["interrupt", "replace", "drop_oldest"])
def test_timeout_zero_on_a_busy_key_ends_before_its_policy_acts(how: str) -> None:
    """A turn with ``timeout_s=0`` ("start now or not at all") for a key whose turn runs
    cannot start now, whatever its policy: it ends ``timed_out`` at once, and its policy
    never acts (the running turn is not cancelled, the pending ones are not dropped).
    It used to act first and then time out: the key lost its running and pending turns
    to a turn that never ran. Where the policy does let it start now (``replace`` over
    turns that wait for a collect window, with no turn formed), it acts, and the turn
    runs. Both dispatchers."""
    kw: dict[str, Any] = {"max_pending": 1, "overflow": "drop_oldest"} \
        if how == "drop_oldest" else {}
    busy = None if how == "drop_oldest" else how
    gates = Gates()
    d = ThreadDispatcher(lanes(), **kw)
    try:
        running = d.submit("k", gates.turn, "a")
        assert gates.started["a"].wait(WAIT)
        pending = d.submit("k", gates.turn, "b")
        late = d.submit("k", gates.turn, "never", busy=busy, timeout_s=0)
        assert (late.state, late.reason) == ("timed_out", "start timeout")
        assert running.state == "running" and pending.state == "pending"
        gates.go["a"].set()
        gates.go["b"].set()
        assert running.result(WAIT) == "r:a" and pending.result(WAIT) == "r:b"
        assert "never" not in gates.order
    finally:
        d.close()

    async def main() -> None:
        ad = Dispatcher(build_default_async_lanes(), **kw)
        go = asyncio.Event()

        async def work(x: str) -> str:
            assert x != "never", "a turn that may not wait ran"
            await go.wait()
            return x

        first = ad.submit("k", work, "a")
        await asyncio.sleep(0.01)
        second = ad.submit("k", work, "b")
        late = ad.submit("k", work, "never", busy=busy, timeout_s=0)
        assert (late.state, late.reason) == ("timed_out", "start timeout")
        assert first.state == "running" and second.state == "pending"
        go.set()
        assert await first == "a" and await second == "b"
        await ad.drain(WAIT)
        ad.close()

    asyncio.run(main())
    if how != "replace":
        return
    d = ThreadDispatcher(lanes(), busy="collect", debounce_s=60.0)
    try:
        waiting = d.submit("w", list, "a")  # its window is open for 60 s: no turn formed
        now = d.submit("w", list, "b", busy="replace", timeout_s=0)
        assert now.result(WAIT) == ["b"]
        assert (waiting.state, waiting.reason) == ("dropped", "superseded")
    finally:
        d.close()


def test_steer_in_threads() -> None:
    d = ThreadDispatcher(lanes(), busy="steer")
    arrived = threading.Event()
    first_in = threading.Event()

    def chat(text: str) -> list[str]:
        if text == "a":
            first_in.set()
            assert arrived.wait(WAIT)
            return [text, *current_turn().inbox.take()]
        return [text]

    try:
        t1 = d.submit("k", chat, "a")
        assert first_in.wait(WAIT)
        t2 = d.submit("k", chat, "b")
        arrived.set()
        assert t1.result(WAIT) == t2.result(WAIT) == ["a", "b"]
        assert d.stats.steered == 1
    finally:
        d.close()


def test_run_timeout_signals_the_thread_and_ends_timed_out(fake_clock: FakeClock) -> None:
    d = ThreadDispatcher(lanes(), clock=fake_clock)
    inside = threading.Event()

    def work() -> str:
        inside.set()
        assert current_turn().cancel_event.wait(WAIT)
        return "stopped"

    try:
        t = d.submit("k", work, run_timeout_s=10.0)
        assert inside.wait(WAIT)
        fake_clock.advance(10.0)
        with pytest.raises(TurnTimedOutError) as info:
            t.result(WAIT)
        assert info.value.reason == "run timeout"
    finally:
        d.close()


def test_start_timeout_on_a_fake_clock(fake_clock: FakeClock) -> None:
    g = Gates()
    d = ThreadDispatcher(lanes(), clock=fake_clock)
    try:
        first = d.submit("k", g.turn, 1)
        late = d.submit("k", g.turn, 2, timeout_s=3.0)
        assert g.started[1].wait(WAIT)
        fake_clock.advance(3.0)
        with pytest.raises(TurnTimedOutError):
            late.result(WAIT)
        with pytest.raises(concurrent.futures.TimeoutError):
            first.result(0.01)  # still running: result(timeout) gives up like a Future
        g.go[1].set()
        assert first.result(WAIT) == "r:1"
        assert g.order == [1]
    finally:
        d.close()


def test_cancel_while_waiting_for_a_key_held_elsewhere_never_calls_fn() -> None:
    q = lanes()
    d = ThreadDispatcher(q)
    called = threading.Event()
    try:
        with q.acquire_all("k", ["session"]):  # another user of the lane holds the key
            t = d.submit("k", called.set)
            deadline = time.monotonic() + WAIT
            while q["session"].waiting_for("k") == 0:  # the worker is in line for it
                assert time.monotonic() < deadline
                time.sleep(0.001)
            assert d.snapshot()["keys"]["k"]["blocked_by"] == "lanes"
            assert d.cancel(t) is True
            assert t.state == "cancelled"  # ended at once: it had not started
        assert d.wait_idle(WAIT)
        assert not called.is_set()
        assert q["global"].stats.holders == 0 and not q["session"].is_held("k")
    finally:
        d.close()


def test_priority_at_the_worker_gate() -> None:
    g = Gates()
    d = ThreadDispatcher(lanes(), max_workers=1)
    try:
        d.submit("a", g.turn, "a")
        assert g.started["a"].wait(WAIT)
        d.submit("b", g.turn, "b", priority=0)
        d.submit("c", g.turn, "c", priority=3)
        assert d.snapshot()["keys"]["b"]["blocked_by"] == "workers"
        for label in ("a", "c", "b"):
            g.go[label].set()
        assert d.wait_idle(WAIT)
        assert g.order == ["a", "c", "b"]
    finally:
        d.close()


def test_drain_blocks_until_idle_and_refuses_new_work() -> None:
    g = Gates()
    d = ThreadDispatcher(lanes())
    try:
        t = d.submit("k", g.turn, 1)
        assert d.drain(0.0) is False
        with pytest.raises(DispatcherDrainingError):
            d.submit("k", g.turn, 2)
        threading.Timer(0.05, g.go[1].set).start()
        assert d.drain(WAIT) is True
        assert t.result(0) == "r:1"
    finally:
        d.close()


def test_many_threads_keep_per_key_order_and_exclusion() -> None:
    d = ThreadDispatcher(lanes(global_cap=4), max_pending=10_000)
    active: dict[str, int] = defaultdict(int)
    seen: dict[str, list[int]] = defaultdict(list)
    overlaps = []
    guard = threading.Lock()

    def work(key: str, n: int) -> int:
        with guard:
            active[key] += 1
            if active[key] > 1:
                overlaps.append(key)
            seen[key].append(n)
        time.sleep(random.random() * 0.0002)
        with guard:
            active[key] -= 1
        return n

    submitted: dict[str, list[int]] = defaultdict(list)
    sub_lock = threading.Lock()

    def producer(p: int) -> None:
        for i in range(300):
            key = f"k{(p * 7 + i) % 12}"
            with sub_lock:  # the submit order of a key is the order of this lock
                n = len(submitted[key])
                submitted[key].append(n)
                d.submit(key, work, key, n)

    threads = [threading.Thread(target=producer, args=(p,)) for p in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(WAIT * 6)
    try:
        assert d.wait_idle(60)
        assert not overlaps
        assert dict(seen) == dict(submitted)
        s = d.stats
        assert s.submitted == s.done == 1800
    finally:
        d.close()


def test_each_dispatcher_takes_its_own_kind_of_queue() -> None:
    with pytest.raises(TypeError, match="LaneQueue"):
        ThreadDispatcher(AsyncLaneQueue())
    with pytest.raises(TypeError, match="AsyncLaneQueue"):
        Dispatcher(lanes())
    with pytest.raises(ValueError, match="max_workers"):
        ThreadDispatcher(lanes(), max_workers=0)


# The same policies as tests/test_dispatch_policies.py, on the thread face: a first turn
# holds the key until the test lets it go; what the later submits become is the policy's.
POLICY_OUTCOMES = {
    "enqueue": (["done", "done", "done"], [[0], [1], [2]]),
    "reject": (["done", "rejected", "rejected"], [[0]]),
    "interrupt": (["cancelled", "dropped", "done"], [[0], [2]]),
    "replace": (["done", "dropped", "done"], [[0], [2]]),
    "collect": (["done", "done", "done"], [[0], [1, 2]]),
    "steer": (["done", "done", "done"], [[0, 1, 2]]),
}


@pytest.mark.parametrize("policy", list(POLICY_OUTCOMES))
def test_each_policy_on_threads(policy: str) -> None:
    d = ThreadDispatcher(lanes(), busy=policy)
    first_in = threading.Event()
    let_go = threading.Event()
    calls: list[list[int]] = []

    def turn(payload: Any) -> list[int]:
        got = list(payload) if isinstance(payload, list) else [payload]
        if got[0] == 0:
            first_in.set()
            if policy == "interrupt":  # it sees the interrupt, and returns once let go
                assert current_turn().cancel_event.wait(WAIT)
            assert let_go.wait(WAIT)
            got += current_turn().inbox.take()
        calls.append(got)
        return got

    try:
        tickets = [d.submit("k", turn, 0)]
        assert first_in.wait(WAIT)
        tickets += [d.submit("k", turn, i) for i in (1, 2)]
        let_go.set()
        assert d.wait_idle(WAIT)
        states, expected_calls = POLICY_OUTCOMES[policy]
        assert [t.state for t in tickets] == states
        assert calls == expected_calls
        s = d.stats
        assert s.submitted == 3 == s.done + s.cancelled + s.dropped + s.rejected
    finally:
        let_go.set()
        d.close()


def _end_the_only_ticket(d: ThreadDispatcher, t: Any, how: str,
                         clock: FakeClock | None = None) -> None:
    """End ``t`` (pending, its job launched) the way ``how`` names: every way ends the
    job's only ticket before the job starts, so the machine abandons the job. "cancel"
    and "start timeout" also take the ticket out of the job (``Machine._detach``): the
    job is left with no ticket at all."""
    if how == "cancel":
        assert d.cancel(t)
    elif how == "clear":
        assert d.clear("k") == 1
    elif how == "start timeout":
        assert clock is not None
        clock.advance(2.0)  # past the ticket's 1 s start deadline: the timer ends it
        assert isinstance(t.exception(WAIT), TurnTimedOutError)
    else:  # a newer turn interrupts it: the job is dropped, a new job is formed
        d.submit("k", lambda: "newer", busy=how)
    assert t.done() and not t.running()


def _assert_settled(d: ThreadDispatcher, q: LaneQueue) -> None:
    assert d.drain(WAIT), "a launched runner never reported"
    s = d.stats
    assert s.pending == 0 and s.running == 0
    assert s.submitted == (s.done + s.failed + s.cancelled + s.dropped + s.rejected
                           + s.timed_out)
    assert d.snapshot()["admitted"] == 0
    for name in ("session", "global"):
        st = q[name].stats
        assert st.holders == 0 and st.waiters == 0


@pytest.mark.parametrize("how", ["cancel", "start timeout", "clear", "interrupt"])
def test_ticket_ended_while_its_runner_reads_the_lane_priority(
        how: str, fake_clock: FakeClock) -> None:
    """The job's only ticket ends after its runner was launched and before the runner
    reads the job's lane priority (the job is abandoned). The runner must still report.
    Cancel and start timeout leave the job with no ticket at all: ``max()`` of no
    priorities used to raise in the pool worker, which a pool swallows, and the machine
    counted the runner for ever (``drain`` never returned True; about 1 run in 60 of the
    random test below, under load)."""
    q = lanes(global_cap=3)
    d = ThreadDispatcher(q, clock=fake_clock)
    machine = d._machine
    inside, go = threading.Event(), threading.Event()
    original = machine.lane_priority
    first = [True]

    def hooked(job: Any) -> int:
        if first[0]:  # the first runner only (a superseding turn launches another)
            first[0] = False
            inside.set()
            assert go.wait(WAIT)
        return original(job)

    machine.lane_priority = hooked  # type: ignore[method-assign]
    try:
        t = d.submit("k", lambda: "ran", timeout_s=1.0)
        assert inside.wait(WAIT), "the runner never came"
        _end_the_only_ticket(d, t, how, fake_clock)
        go.set()
        _assert_settled(d, q)
        assert t.state == {"interrupt": "dropped", "start timeout": "timed_out"}.get(
            how, "cancelled")
    finally:
        go.set()
        d.close()


@pytest.mark.parametrize("how", ["cancel", "clear", "interrupt"])
def test_ticket_ended_before_its_runner_begins_takes_no_lane(how: str) -> None:
    """The job's only ticket ends between the job's launch and the runner's first step:
    the runner finds the job abandoned, reports, and never goes to the lanes (no take,
    so no refusal or grant is counted there)."""
    q = lanes(global_cap=3)
    d = ThreadDispatcher(q, max_workers=3)
    launched, go = threading.Event(), threading.Event()
    original = d._launch
    first = [True]

    def hooked(job: Any) -> None:
        if first[0]:
            first[0] = False
            launched.set()
            assert go.wait(WAIT)
        original(job)

    d._launch = hooked  # type: ignore[method-assign]
    box: dict[str, Any] = {}
    submitter = threading.Thread(target=lambda: box.setdefault("t", d.submit("k", work)))

    def work() -> str:
        return "ran"

    try:
        submitter.start()
        assert launched.wait(WAIT), "the job was never launched"
        # The submit's effects run after the machine's lock is let go: the ticket is
        # pending in a job that is admitted but whose runner does not exist yet.
        (t,) = [t for t in _pending_tickets(d)]
        _end_the_only_ticket(d, t, how)
        go.set()
        submitter.join(WAIT)
        assert box["t"] is t
        _assert_settled(d, q)
        acquired = q["session"].stats.acquired
        # Only the superseding turn (interrupt) ran, and took the lanes once.
        assert acquired == (1 if how == "interrupt" else 0)
        assert q["global"].stats.acquired == acquired
        assert q["global"].stats.rejected == 0 and q["session"].stats.rejected == 0
    finally:
        go.set()
        d.close()


def _pending_tickets(d: ThreadDispatcher) -> list[Any]:
    machine = d._machine
    with machine._lock:
        return [t for k in machine._keys.values() if k.job is not None
                for t in k.job.tickets]


def test_random_concurrent_operations_on_threads() -> None:
    """Four threads submit with every policy, cancel, clear and steer at random over six
    keys: every ticket ends exactly once, the books balance, no key runs two turns at
    once, and each key's turns begin in submit order."""
    d = ThreadDispatcher(lanes(global_cap=3), max_pending=5, overflow="drop_oldest",
                         debounce_s=0.0)
    guard = threading.Lock()
    active: dict[str, int] = defaultdict(int)
    begun: dict[str, list[int]] = defaultdict(list)
    overlaps: list[str] = []
    ends: dict[int, int] = defaultdict(int)
    tickets: list[Any] = []
    order = threading.Lock()  # the submit order of a key is the order of this lock
    seq = iter(range(10**9))

    def work(payload: Any) -> int:
        turn = current_turn()
        labels = list(payload) if isinstance(payload, list) else [payload]
        with guard:
            active[turn.key] += 1
            if active[turn.key] > 1:
                overlaps.append(turn.key)
            begun[turn.key].extend(labels)
        try:
            turn.cancel_event.wait(random.random() * 0.002)
            taken = turn.inbox.take()
            with guard:
                begun[turn.key].extend(taken)
        finally:
            with guard:
                active[turn.key] -= 1
        return len(labels)

    def count_end(t: Any) -> None:
        with guard:
            ends[id(t)] += 1

    def actor(seed: int) -> None:
        rng = random.Random(seed)
        for _ in range(300):
            op = rng.random()
            key = f"k{rng.randrange(6)}"
            if op < 0.75:
                with order:
                    t = d.submit(key, work, next(seq), busy=rng.choice(
                        ["enqueue", "reject", "steer", "interrupt", "replace", "collect"]))
                t.add_done_callback(count_end)
                with guard:
                    tickets.append(t)
            elif op < 0.9:
                with guard:
                    victim = rng.choice(tickets) if tickets else None
                if victim is not None:
                    d.cancel(victim)
            else:
                d.clear(key)

    threads = [threading.Thread(target=actor, args=(s,)) for s in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    try:
        assert d.drain(30)
        assert not overlaps
        for labels in begun.values():
            assert labels == sorted(labels)
        assert all(t.done() for t in tickets)
        assert all(ends[id(t)] == 1 for t in tickets)
        s = d.stats
        assert s.submitted == len(tickets)
        assert s.submitted == (s.done + s.failed + s.cancelled + s.dropped + s.rejected
                               + s.timed_out)
        assert s.failed == 0 and s.pending == 0 and s.running == 0
    finally:
        d.close()


def test_a_dispatcher_dropped_without_close_ends_its_threads() -> None:
    """The service thread and the workers of a ThreadDispatcher that is dropped without
    close() end once it is collected: cancelled timers keep nothing alive, nor does the
    dedupe table's expiry timer (it once kept the dispatcher for dedupe_ttl_s)."""
    def ours() -> list[threading.Thread]:
        return [t for t in threading.enumerate() if t.name.startswith("lanequeue-dispatch")]

    before = set(ours())
    d = ThreadDispatcher(lanes(), max_workers=2)
    assert d.submit("k", str, "a", dedupe_id="evt-1").result(WAIT) == "a"
    later = d.submit("k", str, "b", timeout_s=60.0)  # its start timer is cancelled
    assert later.result(WAIT) == "b"
    assert len(set(ours()) - before) >= 2  # the service thread and a worker
    del d, later
    gc.collect()
    deadline = time.monotonic() + WAIT
    while set(ours()) - before:
        assert time.monotonic() < deadline, sorted(t.name for t in set(ours()) - before)
        time.sleep(0.01)


@pytest.mark.timeout(30)
@pytest.mark.parametrize("end", ["cancel", "clear", "close"])
def test_a_turn_ended_while_its_runner_waits_for_a_lane_frees_the_runner_at_once(
    end: str,
) -> None:
    """Two turns whose runners wait in ``acquire_all`` for session lanes that another
    part of the program holds (the scheduler pattern's lanes) are ended before they
    start: their runners leave the lanes' lines at once and give back their gate
    slots, so a third, idle conversation runs under the cap of 2 and the dispatcher
    is idle. The runners used to wait on for the tickets' whole ``timeout_s`` (for ever
    with None), each holding a gate slot: every other conversation waited at the gate
    with the global lane free."""
    q = LaneQueue(warn_after_s=None)
    session = q.add_session_lane("session")
    q.add_lane("global", max_concurrent=2)
    d = ThreadDispatcher(q)
    try:
        assert session.try_acquire("c1") and session.try_acquire("c2")
        t1 = d.submit("c1", str, 1, timeout_s=None)
        t2 = d.submit("c2", str, 2, timeout_s=None)
        for _ in range(2000):  # both runners wait in the session lane's lines
            if session.waiting == 2:
                break
            time.sleep(0.001)
        assert session.waiting == 2
        if end == "cancel":
            assert t1.cancel() and t2.cancel()
        elif end == "clear":
            assert d.clear("c1") == 1 and d.clear("c2") == 1
        else:
            d.close()
        assert t1.state == t2.state == "cancelled"
        for _ in range(2000):
            if session.waiting == 0:
                break
            time.sleep(0.001)
        assert session.waiting == 0 and q["global"].active_count == 0
        if end != "close":
            assert d.submit("c3", str, 3).result(WAIT) == "3"
        assert d.wait_idle(WAIT)
        assert session.active_count == 2  # the other part's holds are untouched
    finally:
        session.manual_release("c1")
        session.manual_release("c2")
        d.close()


def test_an_acquire_all_given_up_before_it_parks_ends_instead_of_waiting() -> None:
    """``_end_wait`` on an ``acquire_all`` that has not parked yet (its owner gave up
    first): its wait, once it joins the line, sees the mark and ends with
    LaneClearedError at once, leaving nothing in line and nothing taken."""
    from lanequeue import LaneClearedError

    q = LaneQueue(warn_after_s=None)
    session = q.add_session_lane("session")
    glob = q.add_lane("global", max_concurrent=2)
    assert session.try_acquire("k")
    multi: Any = q.acquire_all("k", ["session", "global"], timeout_s=WAIT)
    multi._end_wait()
    started = time.monotonic()
    with pytest.raises(LaneClearedError):
        multi.__enter__()
    assert time.monotonic() - started < WAIT / 2
    assert session.waiting == 0 and glob.active_count == 0
    assert session.manual_release("k")


@pytest.mark.timeout(30)
def test_a_turn_ended_just_before_its_runner_records_its_entry_still_frees_the_runner(
) -> None:
    """The race the end of a runner's wait must close: the runner has looked at its job
    (not abandoned yet) and not yet recorded the ``acquire_all`` it enters, when the
    turn is cancelled. The runner is held at that point (a line tracer on its thread)
    until the cancel is done; then it must not wait in the busy key's line: it sees the
    job abandoned and ends its own wait, and the dispatcher is idle at once. (The
    cancel's end of the wait found nothing recorded, and the runner waited for the key
    for ever.)"""
    import inspect
    import sys

    import lanequeue.dispatch._threads as threads_face

    run_code = threads_face.ThreadDispatcher._run.__code__
    src, first = inspect.getsourcelines(threads_face.ThreadDispatcher._run)
    line = first + next(i for i, text in enumerate(src) if "job.entering = multi" in text)
    at_window, go = threading.Event(), threading.Event()

    def tracer(frame: Any, event: str, arg: Any) -> Any:
        if frame.f_code is not run_code:
            return None

        def local(f: Any, e: str, a: Any) -> Any:
            if e == "line" and f.f_lineno == line and not go.is_set():
                at_window.set()
                go.wait(5)  # the runner is preempted right here
            return local
        return local

    q = LaneQueue(warn_after_s=None)
    session = q.add_session_lane("session")
    q.add_lane("global", max_concurrent=4)
    threading.settrace(tracer)
    try:
        d = ThreadDispatcher(q)
        assert session.try_acquire("k")  # the key is busy
        t = d.submit("k", str, 1, timeout_s=None)
        assert at_window.wait(5)
        assert t.cancel()
        go.set()
        assert d.wait_idle(3.0)
        assert session.waiting == 0
    finally:
        threading.settrace(None)  # type: ignore[arg-type]
        sys.settrace(None)
        go.set()
        session.manual_release("k")
        d.close()
