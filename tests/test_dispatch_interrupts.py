"""Interrupts in the dispatcher: a ``KeyboardInterrupt`` (a signal handler's, Ctrl-C)
landing anywhere in ``submit``, ``cancel``, ``clear`` or a runner's report leaves the
dispatcher consistent (see "Interrupts" in ``lanequeue.dispatch._machine``).

The injector raises ``KeyboardInterrupt`` at the N-th point where CPython can deliver an
asynchronous exception inside the dispatcher's modules, for N = 1, 2, ... until the
operation completes with no injection left: at the entry of a function (``call``), after
a Python callee returns (``return``), after a builtin returns (``c_return``) and at a
backward jump. After each injection (injection paused) the dispatcher must reach
``drain() -> True``: every ticket the test can reach has ended or runs to its end, the
counters agree (``submitted`` = the terminal counts, nothing pending or running), no gate
slot is lost (a fresh turn runs), and the interrupted submit's ticket, if it was made, is
either the one a retry of its ``dedupe_id`` gets (and it ended: ``done``, or ``cancelled``
with reason ``"interrupted"``) or gone (the retry runs).
"""

from __future__ import annotations

import random
import signal
import threading
import time
from collections.abc import Callable
from pathlib import Path
from types import FrameType
from typing import Any

import interrupt_points
import pytest
from interrupt_points import DELIVERY, Injector, library
from interrupt_timer import sigalrm_interrupts

import lanequeue.dispatch as dispatch_pkg
from lanequeue import LaneQueue, ThreadDispatcher, TurnError, current_turn

WAIT = 10.0
_PKG = Path(dispatch_pkg.__file__).resolve().parent
_TRACED = {str(_PKG / f) for f in ("_machine.py", "_threads.py", "_base.py")}


def inject_everywhere(run_once: Callable[[Injector], None], **injector: Any) -> int:
    """``run_once(inj)`` with an injection at point n = 1, 2, ... of the dispatcher's
    modules (see the module docstring) until a run completes without one; how many
    injections were made."""
    return interrupt_points.inject_everywhere(
        run_once, 3000, traced=library(_TRACED), points=DELIVERY, **injector)


def _dispatcher(**kw: Any) -> ThreadDispatcher:
    q = LaneQueue()
    q.add_session_lane("session", timeout_s=None)
    q.add_lane("global", max_concurrent=1, timeout_s=None)  # one gate slot
    return ThreadDispatcher(q, **kw)


def _ended(t: Any) -> str:
    try:
        t.result(WAIT)
    except TurnError:
        pass
    assert t.done(), t
    return str(t.state)


def _check_whole(d: ThreadDispatcher, tickets: list[Any], inj: Injector) -> None:
    """The dispatcher reaches drain() -> True with every ticket ended and the counters
    whole, and a fresh turn still runs (no gate slot lost)."""
    for t in tickets:
        _ended(t)
    assert d.wait_idle(WAIT), (inj.fired, d.stats, d.snapshot())
    s = d.stats
    assert s.pending == 0 and s.running == 0, (inj.fired, s)
    assert s.submitted == (s.done + s.failed + s.cancelled + s.dropped + s.rejected
                           + s.timed_out), (inj.fired, s)
    assert d.snapshot()["admitted"] == 0, inj.fired
    if not d.draining:
        assert d.submit("fresh", lambda: "fresh").result(WAIT) == "fresh", inj.fired
    assert d.drain(WAIT), inj.fired
    d.close()


def _retry_outcome(d: ThreadDispatcher, key: str, fn: Any, dedupe_id: str) -> None:
    """The interrupted submit left its ticket ended or running to its end (a retry of
    its dedupe id gets it), or left nothing (the retry is a new turn, and runs)."""
    retry = d.submit(key, fn, dedupe_id=dedupe_id)
    state = _ended(retry)
    assert state == "done" or (state == "cancelled" and retry.reason == "interrupted"), (
        retry, retry.reason)


@pytest.mark.parametrize("case", ["idle_key", "busy_key", "busy_interrupt", "collect"])
def test_interrupt_at_every_point_of_submit_leaves_the_dispatcher_whole(case: str) -> None:
    """The attack's input: a Ctrl-C inside ``submit`` (at the entry of the machine's
    ``_after``, among every other point) once wedged the dispatcher for good."""

    def run_once(inj: Injector) -> None:
        d = _dispatcher(busy="interrupt" if case == "busy_interrupt" else "enqueue")
        go = threading.Event()
        tickets = []
        busy = case != "idle_key"
        if busy:
            tickets.append(d.submit("conv", go.wait, WAIT))  # running: the key is busy
            if case == "collect":
                tickets.append(d.submit("conv", len, [1], busy="collect"))

        def fn(*a: Any) -> str:
            return "reply"

        try:
            with inj.active():
                tickets.append(d.submit("conv", fn, busy="collect" if case == "collect"
                                        else None, dedupe_id="evt"))
        except KeyboardInterrupt:
            assert inj.fired is not None
        go.set()
        _retry_outcome(d, "conv", fn, "evt")
        _check_whole(d, tickets, inj)

    assert inject_everywhere(run_once) > 20


def test_interrupt_at_every_point_of_cancel_leaves_the_dispatcher_whole() -> None:
    def run_once(inj: Injector) -> None:
        d = _dispatcher()
        go = threading.Event()
        first = d.submit("conv", go.wait, WAIT)
        victim = d.submit("conv", str, "victim")
        after = d.submit("conv", str, "after")
        told: list[Any] = []
        victim.add_done_callback(told.append)
        try:
            with inj.active():
                d.cancel(victim)
        except KeyboardInterrupt:
            assert inj.fired is not None
        go.set()
        assert _ended(after) == "done", inj.fired
        assert _ended(victim) in ("cancelled", "done"), inj.fired
        if victim.state == "cancelled":
            assert victim.reason == "cancelled"
        assert told and told[0] is victim, inj.fired  # its callback ran (maybe twice)
        _check_whole(d, [first, victim, after], inj)

    assert inject_everywhere(run_once) > 10


def test_interrupt_at_every_point_of_a_cancel_of_a_running_turn_still_tells_the_turn() -> None:
    """A cancel of a RUNNING thread turn interrupted anywhere still sets the turn's
    cancel event (the end is recorded before the turn is signalled, and the signal is
    sent again with the face's interrupt): a turn that waits for it ends, cancelled."""

    def run_once(inj: Injector) -> None:
        d = _dispatcher()
        started = threading.Event()
        told: list[bool] = []

        def turn() -> None:
            started.set()
            told.append(current_turn().cancel_event.wait(WAIT))

        running = d.submit("conv", turn)
        assert started.wait(WAIT)
        try:
            with inj.active():
                d.cancel(running)
        except KeyboardInterrupt:
            assert inj.fired is not None
        # Asked again (the first ask wins: a no-op if the interrupted one was recorded,
        # so its own signal must have reached the turn).
        d.cancel(running)
        assert _ended(running) == "cancelled" and running.reason == "cancelled", inj.fired
        assert told == [True], inj.fired  # told at once, not after waiting WAIT out
        _check_whole(d, [running], inj)

    assert inject_everywhere(run_once) > 10


@pytest.mark.parametrize("op", ["clear", "close"])
def test_interrupt_at_every_point_of_clear_or_close_leaves_the_dispatcher_whole(
        op: str) -> None:
    def run_once(inj: Injector) -> None:
        d = _dispatcher()
        go = threading.Event()
        first = d.submit("conv", go.wait, WAIT)
        rest = [d.submit("conv", str, i) for i in range(3)]
        try:
            with inj.active():
                if op == "clear":
                    d.clear("conv")
                else:
                    d.close()
        except KeyboardInterrupt:
            assert inj.fired is not None
        go.set()
        for t in rest:
            assert _ended(t) in ("cancelled", "done"), inj.fired
        _check_whole(d, [first, *rest], inj)

    assert inject_everywhere(run_once) > 10


def test_interrupt_at_every_point_of_a_runners_report_leaves_the_dispatcher_whole() -> None:
    """The report (``finish``) that ends a turn and launches the key's next one, in the
    runner's thread (traced from inside ``fn``)."""

    def run_once(inj: Injector) -> None:
        d = _dispatcher()
        reported = threading.Event()

        def traced() -> str:
            inj.install()  # this worker thread, inside its report only (the scope)
            return "first"

        first = d.submit("conv", traced)
        nxt = d.submit("conv", str, "next")
        other = d.submit("other", str, "other")
        first.add_done_callback(lambda _: reported.set())
        assert _ended(nxt) == "done", inj.fired
        assert _ended(other) == "done", inj.fired
        assert reported.wait(WAIT)
        assert _ended(first) == "done", inj.fired
        _check_whole(d, [first, nxt, other], inj)

    def report(frame: FrameType) -> bool:
        return frame.f_code.co_name == "finish" and frame.f_code.co_filename in _TRACED

    assert inject_everywhere(run_once, scope=report, scope_return=True) > 10


def test_random_timer_interrupts_in_submit_and_cancel_never_wedge_the_dispatcher() -> None:
    """The attack's fuzz: a timer raises KeyboardInterrupt after 10-300 us, over and over,
    while the main thread submits (with dedupe ids) and cancels on five keys behind a
    global lane of one. Afterwards the dispatcher drains to True, its counters are
    whole, and a fresh turn runs."""
    d = _dispatcher()
    rng = random.Random(3)
    interrupts = completed = 0
    deadline = time.monotonic() + 3.0
    with sigalrm_interrupts() as armed:
        n = 0
        while interrupts < 300 and time.monotonic() < deadline:
            try:
                armed[0] = True
                signal.setitimer(signal.ITIMER_REAL, rng.uniform(10e-6, 300e-6))
                for _ in range(50):
                    n += 1
                    t = d.submit(f"k{n % 5}", str, n, dedupe_id=f"e{n % 40}")
                    if n % 3 == 0:
                        d.cancel(t)
                    completed += 1
                armed[0] = False
            except KeyboardInterrupt:
                armed[0] = False  # first: no call (no check for signals) before it
                interrupts += 1
    assert interrupts >= 50 and completed > 0, (interrupts, completed)
    # The timer thread still serves (an interrupt in call_later once left its lock held).
    go = threading.Event()
    blocker = d.submit("t", go.wait, WAIT)
    late = d.submit("t", str, "late", timeout_s=0.01)
    assert _ended(late) == "timed_out" and late.reason == "start timeout"
    go.set()
    _check_whole(d, [blocker], Injector(0))


def test_random_timer_interrupts_while_turns_launch_never_wedge_the_workers() -> None:
    """Every submit launches a turn (four keys, four worker threads, turns that end at
    once), while a timer raises KeyboardInterrupt after 5-300 us, over and over: the
    launch path must hold up too, not only the dispatcher's own code. (Launched through
    the standard library's ThreadPoolExecutor, an interrupt inside its submit once left
    its idle semaphore's lock held: the next launch, and drain, waited for ever.)"""
    q = LaneQueue()
    q.add_session_lane("session", timeout_s=None)
    q.add_lane("global", max_concurrent=4, timeout_s=None)
    rng = random.Random(5)
    interrupts = rounds = 0
    deadline = time.monotonic() + 3.0
    with sigalrm_interrupts() as armed:
        while time.monotonic() < deadline:
            d = ThreadDispatcher(q, max_workers=4)
            rounds += 1
            for i in range(100):
                try:
                    armed[0] = True
                    signal.setitimer(signal.ITIMER_REAL, rng.uniform(5e-6, 300e-6))
                    d.submit(f"k{i % 4}", str, i)
                    armed[0] = False
                except KeyboardInterrupt:
                    armed[0] = False  # first: no call (no check for signals) before it
                    interrupts += 1
            signal.setitimer(signal.ITIMER_REAL, 0)
            _check_whole(d, [], Injector(0))
    assert interrupts >= 50 and rounds > 1, (interrupts, rounds)


def test_interrupt_at_every_point_of_clear_of_a_job_waiting_at_the_gate() -> None:
    """``clear`` of a key whose turn is formed and waits for the gate (another key holds
    the one slot) and carries three merged tickets: an interrupt in the middle of
    ending them once left the job holding tickets already ended, which its later start
    ran again (``stats.cancelled`` too high, ``stats.pending`` below zero)."""

    def run_once(inj: Injector) -> None:
        d = _dispatcher()
        go = threading.Event()
        first = d.submit("other", go.wait, WAIT)  # holds the one gate slot
        merged = [d.submit("conv", len, [i], busy="collect") for i in range(3)]
        try:
            with inj.active():
                d.clear("conv")
        except KeyboardInterrupt:
            assert inj.fired is not None
        go.set()
        states = [_ended(t) for t in merged]
        assert all(s in ("cancelled", "done") for s in states), (inj.fired, states)
        _check_whole(d, [first, *merged], inj)
        s = d.stats
        assert s.cancelled == states.count("cancelled"), (inj.fired, s, states)

    assert inject_everywhere(run_once) > 10


def test_a_ticket_ended_in_a_job_waiting_for_its_lanes_is_never_run_or_counted_twice() -> None:
    """An interrupted stop of a key's job (``busy="interrupt"``, ``cancel``) may end the
    job's tickets and be stopped before it abandons the job; its ``_repair`` finishes
    that, but the job's runner (another thread) may take the lock first and start the
    job. The start then skips the ended tickets (a job left with none is abandoned): once
    it ran them, and they ended twice in the counters (``stats.pending`` below zero, seen
    under load with a SIGALRM fuzz of ``submit``)."""
    from lanequeue.dispatch._machine import CANCELLED, _Effects

    q = LaneQueue()
    q.add_session_lane("session", timeout_s=None)
    q.add_lane("global", max_concurrent=1, timeout_s=None)
    d = ThreadDispatcher(q)
    m = d._machine
    assert q["session"].try_acquire("k")  # the turn's runner waits for its lanes
    ran: list[int] = []
    t = d.submit("k", ran.append, 1)
    deadline = time.monotonic() + WAIT
    while q["session"].waiting_for("k") < 1:  # the runner is in line for the lane
        assert time.monotonic() < deadline
        time.sleep(0.001)
    fx = _Effects()
    with m._lock:  # what an interrupted _stop_job leaves: ended, still in its job
        m._end(t, CANCELLED, "superseded", fx)
    m._after(fx)
    assert q["session"].manual_release("k")  # the runner gets the lanes and starts
    assert d.wait_idle(WAIT)
    assert ran == [] and t.state == "cancelled"
    s = d.stats
    assert (s.submitted, s.cancelled, s.done, s.pending, s.running) == (1, 1, 0, 0, 0), s
    assert d.submit("k", str, "next").result(WAIT) == "next"  # the key goes on
    d.close()


@pytest.mark.timeout(60)
def test_an_interrupt_anywhere_in_a_cancel_event_set_never_leaves_its_lock_held() -> None:
    """``Turn.cancel_event`` (a threading.Event) set while a thread waits on it, with an
    interrupt at every point of the ``set`` where CPython can deliver one (the standard
    library's Condition code included): a second ``set`` never blocks, and the waiter is
    told. A plain ``threading.Event`` could leave its lock held there, and both would
    block for good."""
    from lanequeue.dispatch._machine import _Signal

    def run_once(inj: Injector) -> None:
        ev = _Signal()
        assert isinstance(ev, threading.Event)
        told: list[bool] = []
        waiter = threading.Thread(target=lambda: told.append(ev.wait(WAIT)))
        waiter.start()
        time.sleep(0.005)  # (the waiter parks; if not yet, its wait sees the flag)
        try:
            with inj.active():
                ev.set()
        except KeyboardInterrupt:
            assert inj.fired is not None
        setter = threading.Thread(target=ev.set, daemon=True)
        setter.start()
        setter.join(5.0)
        assert not setter.is_alive(), f"a second set blocked ({inj.fired})"
        waiter.join(5.0)
        assert told == [True], inj.fired

    _TRACED.add(threading.__file__)
    try:
        assert inject_everywhere(run_once) > 5
    finally:
        _TRACED.discard(threading.__file__)


@pytest.mark.timeout(120)
@pytest.mark.parametrize("call", ["wait_idle", "drain"])
def test_an_interrupt_anywhere_in_waiting_for_idle_raises_it_and_leaves_the_notice_usable(
    call: str,
) -> None:
    """Ctrl-C while a thread waits in ``wait_idle`` or ``drain`` (the standard library's
    Condition code included, at every point where CPython can deliver one): the call
    raises the KeyboardInterrupt, or returns False when its wait had ended, and the idle
    notice's lock is free afterwards (a worker's notice never blocks). The notice was a
    Condition over a plain Lock: an interrupt inside ``Condition.wait`` left the lock
    released, and leaving the ``with`` block then raised ``RuntimeError: release unlocked
    lock`` instead, or released the lock a worker held."""
    release = threading.Event()
    d = _dispatcher()
    busy = d.submit("long", release.wait, WAIT)
    try:
        for _ in range(1000):
            if busy.state == "running":
                break
            time.sleep(0.005)
        assert busy.state == "running"

        def run_once(inj: Injector) -> None:
            try:
                with inj.active():
                    got = getattr(d, call)(0.001)
                assert got is False
            except KeyboardInterrupt:
                assert inj.fired is not None
            lock = d._idle_notice.lock
            assert lock.acquire(blocking=False), f"left held ({inj.fired})"
            lock.release()
            notice = threading.Thread(target=d._idle, daemon=True)
            notice.start()
            notice.join(5.0)
            assert not notice.is_alive(), f"a notice blocked ({inj.fired})"

        _TRACED.add(threading.__file__)
        try:
            assert inject_everywhere(run_once) > 5
        finally:
            _TRACED.discard(threading.__file__)
    finally:
        release.set()
        assert busy.result(WAIT) is True
        assert d.drain(WAIT)
        d.close()
