"""The one dispatcher state machine: what happens to each turn of a busy conversation.

Both dispatchers (asyncio tasks in :mod:`lanequeue.dispatch._asyncio`, a thread pool in
:mod:`lanequeue.dispatch._threads`) drive the :class:`Machine` below. A face only knows
how a turn is *run* (a task or a worker thread that enters ``acquire_all``, calls ``fn`` and
releases), how it is *interrupted* (cancel the task; a thread only sees the cancel event),
how a *timer* is set, and how a caller *waits*. Every decision (which turn runs next for a
key, which policy applies, what is dropped, merged, steered, deduplicated, timed out, and
which terminal state each ticket ends in) is made here, once.

Words
=====
- A **ticket** is one ``submit``. It ends exactly once, in one terminal state.
- A **job** is one call of ``fn``: one ticket, or several merged by ``collect``, plus the
  tickets steered into its inbox and taken by it. A merged ticket may end before the job
  starts (cancel, start timeout): the call's arguments, its priority at the gate and the
  ``merged`` count follow the tickets still in the job when it starts.
- Per key the machine keeps ``line`` (pending tickets, in submit order) and ``job`` (the
  key's current job, if any). A face that asks the shared dedupe window off its thread
  (``Face._offload``: asyncio) also keeps ``arrivals``: a ticket whose claim is in flight
  and every later submit of the key, placed in submit order as the claims answer. A
  key's next job is formed only when ``job`` is None: per key, at most one job exists,
  so turns of a key run one at a time in submit order.
- The **gate**: with counting lanes among the dispatcher's lanes, at most ``slots`` jobs
  (the smallest ``max_concurrent`` of those lanes; on threads also at most the pool's
  workers) are admitted to the lanes at once. A job that finds the gate full waits in the
  dispatcher's ``ready`` heap, ordered by priority with ageing, and is admitted when an
  admitted job ends. So the dispatcher's own jobs never queue behind each other in a
  counting lane's FIFO line; they queue here, in priority order.

A ticket's life::

                        submit
                           |                 dedupe hit: the original ticket is returned
                           v
        +------------- PENDING (in the key's line, or steered into a job's inbox) ------+
        |                  |                                                           |
        | job formed       | cancel/clear/close: CANCELLED; overflow/interrupt/replace: |
        v                  |  DROPPED; deadline (timeout_s): TIMED_OUT; busy reject or   |
     in a job, READY       |  full line: REJECTED (at submit)                          |
     (gate heap) or        |                                                           |
     ADMITTING (in         v                                                           |
     acquire_all) ----> ended before start (the same states as above; a job left with  |
        |               no ticket is abandoned: it never calls fn)                    |
        | lanes held, start()                                                          |
        v                                                                              |
     RUNNING (fn called) --- fn returns / raises / is interrupted; lanes released --->  |
        |                    DONE, FAILED, or the end asked for (CANCELLED, TIMED_OUT)   |
        +--- a steered ticket taken from the inbox follows its job's end <--------------+

The job's phases: READY -> ADMITTING -> RUNNING -> ENDED (the runner returned), or
abandoned in READY/ADMITTING (all its tickets ended before it started: the runner, if one
was launched, releases whatever it took and never calls ``fn``).

Locking
=======
All state (keys, lines, jobs, the gate, the dedupe table, the counters, every ticket's
state) changes under ONE ``threading.Lock`` (``_lock``), held for short O(1) or O(line)
work and never while waiting, running ``fn``, acquiring lanes or calling user code. Each
operation collects its *effects* under the lock (tickets to notify, ``on_drop`` batches,
jobs to launch or interrupt, timers to cancel) and runs them after releasing it, so user
callbacks may call back into the dispatcher. On asyncio the lock is only ever taken by the
loop's thread (uncontended); on threads any thread may call in.

A ticket's terminal state is written under the lock by :meth:`Machine._end`, which refuses
a ticket already ended: every ticket ends exactly once, and the counters (``stats``) are
bumped at that one place, so ``submitted`` always equals the sum of the six terminal
counts plus the tickets still pending or running.

Interrupts
==========
A ``KeyboardInterrupt`` raised by a signal handler (Ctrl-C), or any asynchronous
exception, may land anywhere in ``submit``, ``cancel``, ``clear``, ``close`` or a runner's
report (``finish``), at any point where CPython checks for one (see "Interrupts" in
``lanequeue._core``). Whatever the point, the dispatcher stays whole: a ticket that was
made either ends (``cancelled``, reason ``"interrupted"`` for a new ticket taken out of
its line and put nowhere, or ``timed_out``, ``"start timeout"``, when its start deadline
had passed; the cancel asked for, for a ticket being cancelled) or runs to its end; no
gate slot or runner count is lost; the counters agree; ``drain`` can reach True. The
interrupted call itself raises the exception. How:

- A locked block runs inside a ``try`` whose handler calls :meth:`Machine._repair` (one
  frame, :meth:`Machine._step`, serves every operation but ``submit``): under the lock it
  ends the work a report was ending (the job's outcome is stored with the counters in one
  run of plain stores), clears stale job links of tickets in a line, abandons a job left
  without tickets, puts back a job popped from the gate's heap and never admitted, ends
  every live ticket (``_live``: registered by a plain store as it is made) that is pending
  but in no line, arrival list or job, and forms each free key's next job and fills the
  gate. A ticket is counted in ``submitted`` and registered by plain stores right after it
  is made, and :meth:`_end` does its one lookup first, then plain stores with no branch
  between them (on Python 3.10 a taken conditional jump checks for an interrupt too),
  then ``fx.ended.append`` (its end will be told).
- The effects run in a ``finally``, and once more if ``_after`` was interrupted (``fx.open``
  is still True): each effect is marked done only once it returned, so an interrupted run
  leaves the rest to the second. A repeated effect changes nothing: a launch is refused
  by :meth:`enter` (the first runner has the job), a give-back carries its claim's own
  value, a timer or task cancelled twice stays cancelled. A done-callback is dropped only
  once it returned: under an interrupt it may be called twice, never not at all
  (``await ticket`` copes). ``on_drop`` is called at most once per batch.
- A runner whose report was interrupted at its very entry reports again (``job.reported``).
- The locks that threads wait on are never entered through Python code (see
  ``lanequeue._core``): a ticket's wait, the wait for another submit's claim of the
  same id and a turn's ``cancel_event`` (:class:`_Signal`: a ``threading.Event``, the
  cancel event's documented type, whose lock is not taken in Python code, as
  ``Event``'s ``set`` and ``wait`` do through a ``Condition``), and the thread face's
  idle notice. So a ``fn`` blocked in ``cancel_event.wait()`` is told even when an
  interrupt landed inside the ``set`` that tells it (the effect sets it again). Turns,
  timers, the shared window's calls and its give-backs after failed claims go to the
  faces' or the window's threads by one put on a ``SimpleQueue`` (:mod:`._workers`),
  never through a lock taken in Python code.

Ending, and who decides
=======================
- A ticket that never started ends at once (its waiters are woken at once).
- A started job ends when its runner returns, after ``fn`` returned and the lanes were
  released: an interrupted thread turn keeps its lanes until ``fn`` returns, so per-key
  exclusion is never broken. An end asked for while running (cancel, interrupt,
  run timeout, close) is recorded on the job and wins over ``fn``'s own outcome.
- Per key, the next job is formed only after the current job ended or was abandoned.

Timers and memory
=================
The face gives one primitive, ``call_later`` (the loop's timers on asyncio, one timer
thread on threads), on the dispatcher's clock. On asyncio an interrupt in the loop's
delivery of a timer cannot lose it (:class:`~lanequeue._ops.LoopTimer`), and a timer's
call may then come twice: each timer's call carries the time it was set for, so a
repeat leaves alone a timer set since, and acts only on what is due (a due ticket's
deadline entry leaves the heap once the ticket ended, so an interrupted step leaves it
to the repeat; see :meth:`Machine._deadlines_due_locked`). An end asked of a running turn
(cancel, interrupt, run timeout) is recorded before the turn is signalled, and the
signal is sent again with the face's interrupt, so an interrupt in between loses
neither. The machine keeps at most one timer for all
start deadlines (a heap of pending tickets by deadline; entries of tickets that started or
ended are dropped lazily and the heap is rebuilt once they are most of it; the gate's heap
of jobs likewise drops the jobs abandoned before admission), one per key
waiting for a collect window, one per running job with a ``run_timeout_s``, and one that
sweeps the dedupe table when its oldest id expires. A key with no job and no pending turn
is forgotten, and the tables are rebuilt after a burst, so once the work is done and the
dedupe window has passed the dispatcher holds no ticket, job or key.

Priority, precisely
===================
A job's priority is the largest ``priority`` of its tickets. It orders jobs of different
keys in two places; it never orders the jobs of one key (FIFO: a key's next job is formed
only when its current one ended).

- At the gate: the job with the largest priority is admitted first; a waiting job ranks
  as if it had arrived ``priority * ageing_s`` seconds earlier (one level per
  ``ageing_s`` of waiting), ties by arrival at the gate.
- In the lines of the in-process counting lanes (:class:`~lanequeue.Lane`,
  :class:`~lanequeue.AsyncLane`): the runner's ``acquire_all`` carries the job's priority
  plus the whole levels it gained at the gate (:meth:`Machine.lane_priority`), so there
  it competes by priority with ageing (the lane's ``ageing_s``) against the other users
  of the lane: another dispatcher, a direct ``acquire_all`` or ``acquire`` with a
  priority. Redis lanes serve their line FIFO (a documented limit): there it changes
  nothing, and this dispatcher's jobs meet the others in arrival order.

Without a counting lane among the lanes there is no gate and no counting line, and
priority changes nothing.
"""

from __future__ import annotations

import functools
import heapq
import itertools
import logging
import math
import os
import threading
import weakref
from asyncio.events import _get_running_loop
from collections import OrderedDict, deque
from collections.abc import Callable, Iterable
from contextvars import ContextVar
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

from .._core import at_fork_in_child
from .._errors import (
    DispatcherDrainingError,
    LaneBackendError,
    LeaseLostError,
    TurnCancelledError,
    TurnDedupedError,
    TurnDroppedError,
    TurnError,
    TurnRejectedError,
    TurnTimedOutError,
    shown,
)
from .._validate import PRIORITY_MAX, PRIORITY_MIN, check_key, check_timeout

if TYPE_CHECKING:  # (typing has them from 3.11; only the type checker needs them)
    from typing_extensions import TypeVarTuple, Unpack

    _Args = TypeVarTuple("_Args")

_R = TypeVar("_R")

#: The dispatcher's logger (a callback that raised, a failed turn never looked at).
log = logging.getLogger("lanequeue")

__all__ = [
    "BUSY_POLICIES",
    "DispatchStats",
    "Inbox",
    "Job",
    "Machine",
    "OVERFLOW_POLICIES",
    "Ticket",
    "Turn",
    "current_turn",
]

#: The busy policies, in the order of the README's table.
BUSY_POLICIES = ("enqueue", "reject", "steer", "interrupt", "replace", "collect")
#: What a submit beyond ``max_pending`` does.
OVERFLOW_POLICIES = ("reject_new", "drop_oldest")

PENDING, RUNNING = "pending", "running"
DONE, FAILED, CANCELLED, DROPPED, REJECTED, TIMED_OUT, DEDUPED = (
    "done", "failed", "cancelled", "dropped", "rejected", "timed_out", "deduped"
)
TERMINAL = (DONE, FAILED, CANCELLED, DROPPED, REJECTED, TIMED_OUT, DEDUPED)

_ERRORS: dict[str, type[TurnError]] = {
    CANCELLED: TurnCancelledError,
    DROPPED: TurnDroppedError,
    REJECTED: TurnRejectedError,
    TIMED_OUT: TurnTimedOutError,
    DEDUPED: TurnDedupedError,
}

# Job phases.
READY, ADMITTING, STARTED, ENDED = "ready", "admitting", "running", "ended"


class Timer(Protocol):
    def cancel(self) -> Any: ...


class Face(Protocol):
    """What the machine asks of a dispatcher face. Called without the machine's lock."""

    def _now(self) -> float: ...

    def _call_later(self, delay: float, fn: Callable[[], None]) -> Timer: ...

    def _launch(self, job: Job) -> None: ...

    def _interrupt(self, job: Job) -> None: ...

    def _idle(self) -> None: ...

    def cancel(self, ticket: Ticket) -> bool: ...

    #: A blocking wait from a thread that runs an event loop was warned of (once).
    _warned_loop: bool

    def _warn_loop(self, call: str = ...) -> None: ...

    #: Runs blocking I/O (the shared dedupe window's calls) off the caller's thread:
    #: ``offload(fn, done)`` calls ``fn()`` elsewhere and then ``done(its result or the
    #: exception it raised)`` on the face's own thread (the event loop). None: the I/O runs
    #: inline, in the caller's thread (threads: ``submit`` waits for the window's answer).
    _offload: Callable[[Callable[[], Any], Callable[[Any], None]], None] | None


@dataclass(frozen=True, slots=True)
class DispatchStats:
    """The dispatcher's counters, taken atomically.

    ``submitted`` counts new tickets; each ended ticket adds one to exactly one of
    ``done``, ``failed``, ``cancelled``, ``dropped``, ``rejected``, ``timed_out``, so
    ``submitted == done + failed + cancelled + dropped + rejected + timed_out + pending +
    running``. ``deduped`` counts submits answered without a new turn (a repeated
    ``dedupe_id``), which are not in ``submitted``. ``merged`` counts tickets that ran in
    a call of another ticket (collect), ``steered`` tickets taken from a running turn's
    inbox; both end as ``done``/``failed``/... with that call. ``pending`` and ``running``
    are tickets now.
    """

    submitted: int = 0
    done: int = 0
    failed: int = 0
    cancelled: int = 0
    dropped: int = 0
    rejected: int = 0
    timed_out: int = 0
    deduped: int = 0
    merged: int = 0
    steered: int = 0
    pending: int = 0
    running: int = 0

    def to_dict(self) -> dict[str, int]:
        """The counters as a plain ``dict``."""
        return asdict(self)


class Ticket:
    """One submitted turn, from ``submit`` to its one terminal state.

    ``state`` is ``"pending"``, ``"running"``, or one of the terminal states ``"done"``,
    ``"failed"``, ``"cancelled"``, ``"dropped"``, ``"rejected"``, ``"timed_out"``,
    ``"deduped"``; ``reason`` says why a non-done state was reached (``"busy"``,
    ``"overflow"``, ``"superseded"``, ``"cancelled"``, ``"cleared"``, ``"closed"``,
    ``"start timeout"``, ``"run timeout"``, ``"interrupted"`` (an interrupt, in ``submit``
    say, left it in no line before its start deadline), ``"loop shut down"`` (asyncio:
    the event loop shut down), ...),
    None otherwise.

    Waiting: ``await ticket`` (from any event loop, for the tickets of both dispatchers)
    or ``ticket.result(timeout)`` (any thread; see there for event loops' threads) returns
    ``fn``'s value for ``done``, re-raises ``fn``'s exception for ``failed``, and raises the
    state's :class:`~lanequeue.TurnError` subclass otherwise. Cancelling a task that awaits
    a ticket does not cancel the turn; :meth:`cancel` does. Thread-safe.

    A ``failed`` ticket whose exception nobody took logs it when the ticket is
    garbage-collected (as asyncio does for a task's exception never retrieved): one ERROR
    on the ``lanequeue`` logger naming the key and the ticket id, with the exception and
    its traceback. It is taken by :meth:`result` or :meth:`exception` returning or raising
    it, by an ``await ticket`` that ends with it, or by a done-callback
    (:meth:`add_done_callback`) called with the ended ticket: the callback's owner took
    charge of the outcome, whether it reads it or not. A callback removed before the end
    does not count, nor does asyncio's own (``asyncio.wait``'s: read the done tickets'
    results), nor a wait that timed out or an ``await`` cancelled before the end. The log
    comes from the garbage collector, so from any thread, at any point (a turn's
    exception usually refers back to its ticket through its traceback: the ticket goes in
    a collection of cycles, not when the last name of it goes); it takes no lock of the
    dispatcher. Only failed tickets carry what it takes: a ticket that ends otherwise
    costs nothing more.
    """

    __slots__ = (
        "id", "key", "fn", "args", "busy", "priority", "dedupe_id", "submitted_at",
        "deadline", "run_timeout_s", "state", "reason", "_value", "_error", "_event",
        "_callbacks", "_machine", "_armed", "_started", "_end_req", "_job", "_claim",
        "_number", "_forget", "_unseen", "_scope", "__weakref__",
    )

    def __init__(self, machine: Machine, tid: int, key: str, fn: Any, args: tuple[Any, ...],
                 busy: str, priority: int, dedupe_id: str | None, scope: str | None,
                 now: float, deadline: float | None, run_timeout_s: float | None) -> None:
        self.id = tid
        self.key = key
        self.fn = fn
        self.args = args
        self.busy = busy
        self.priority = priority
        self.dedupe_id = dedupe_id
        self._scope = scope  # the id's identity in the dedupe tables: dedupe_scope(key, id)
        self.submitted_at = now
        self.deadline = deadline
        self.run_timeout_s = run_timeout_s
        self.state = PENDING
        self.reason: str | None = None
        self._value: Any = None
        self._error: BaseException | None = None
        # Made on first wait (most tickets are awaited through a callback, or not at all).
        self._event: _Signal | None = None
        self._callbacks: list[Callable[[Ticket], Any]] | None = []
        self._machine = machine
        self._armed = False  # in the machine's deadline heap, not started or ended yet
        self._started = False
        self._end_req: tuple[str, str] | None = None
        self._job: Job | None = None
        # The shared dedupe window's answer for this ticket (offloaded faces): CLAIMING
        # until it came, then True (ours), False (another process's) or the error.
        self._claim: Any = True
        # The number of its claim in the shared window (its give-back carries it).
        self._number = 0
        self._forget = False  # its claim is to be given back (when its end is told)
        # Failed and not taken yet: logs the exception when dropped (see _Unretrieved).
        self._unseen: _Unretrieved | None = None

    @property
    def payload(self) -> Any:
        """What ``collect`` and ``steer`` hand on: the one argument, or the tuple of them."""
        return self.args[0] if len(self.args) == 1 else self.args

    def done(self) -> bool:
        """True once the ticket is in a terminal state."""
        return self.state in TERMINAL

    def running(self) -> bool:
        return self.state == RUNNING

    def cancelled(self) -> bool:
        return self.state == CANCELLED

    def cancel(self) -> bool:
        """Same as ``dispatcher.cancel(ticket)`` (on asyncio: from the dispatcher's loop)."""
        return self._machine.face.cancel(self)

    def add_done_callback(self, fn: Callable[[Ticket], Any]) -> None:
        """Call ``fn(ticket)`` once the ticket ends (at once if it has), from the thread
        that ends it. Exceptions from ``fn`` are logged and ignored. If an interrupt (a
        ``KeyboardInterrupt``) lands in the dispatcher right after ``fn`` returned, ``fn``
        may be called a second time (never not at all). Called with a ``failed`` ticket,
        ``fn`` takes charge of its exception: the ticket does not log it when collected
        (see :class:`Ticket`).

        asyncio's own callbacks (``asyncio.wait``'s, ``as_completed``'s, which set the
        loop's futures) are the exception: added from an event loop's thread, they are
        called on that loop (from another thread, through ``call_soon_threadsafe``), so
        ``asyncio.wait`` of a :class:`~lanequeue.ThreadDispatcher`'s tickets wakes.

        Raises:
            TypeError: ``fn`` is not callable (checked here, not when the ticket ends)."""
        if not callable(fn):
            raise TypeError(f"fn must be callable, not {fn!r}")
        if not isinstance(fn, _OnLoop) and not _takes_outcome(fn):  # asyncio's own
            loop = _get_running_loop()
            if loop is not None:
                fn = _OnLoop(loop, fn)
        with self._machine._lock:
            callbacks = self._callbacks
            if callbacks is not None:
                n = len(callbacks)
                if n >= 8 and not n & (n - 1):  # (at 8, 16, 32...: amortised O(1))
                    # the inert ones left by remove_done_callback go
                    callbacks[:] = [c for c in callbacks
                                    if not (isinstance(c, _OnLoop) and c.dead)]
                callbacks.append(fn)
                return
        if self._unseen is not None and _takes_outcome(fn):
            self._taken()
        _call(fn, self)

    def remove_done_callback(self, fn: Callable[[Ticket], Any]) -> int:
        """Remove every registration of ``fn`` made by :meth:`add_done_callback` that has
        not been called yet; returns how many (as ``asyncio.Future``'s, so that
        ``asyncio.wait`` takes tickets). Thread-safe.

        asyncio's own callbacks (and an ``await``'s wake-up) are not taken out of the
        list but made inert, without the dispatcher's lock: asyncio removes them in the
        ``finally`` of a coroutine that the garbage collector may close in any thread,
        also one inside a section of the dispatcher that holds that lock."""
        gone = 0
        plain = False  # fn is also in the list unwrapped (added with no loop running)
        if not _takes_outcome(fn):  # (asyncio's own, or a wrapper: _OnLoop, _Wake)
            for c in list(self._callbacks or ()):  # (a copy: builtins, no lock)
                if isinstance(c, _OnLoop):
                    if not c.dead and (c is fn or c.fn is fn or c.fn == fn):
                        c.dead = True
                        gone += 1
                elif c is fn or c == fn:
                    plain = True
            if not plain:
                return gone
        with self._machine._lock:
            callbacks = self._callbacks
            if callbacks is None:
                return gone
            # (asyncio's wrapped callbacks are never removed by another's equality: a
            # callback equal to everything must not take away an await's wake-up)
            kept = [c for c in callbacks if isinstance(c, _OnLoop) or not (c is fn or c == fn)]
            removed = len(callbacks) - len(kept)
            if removed:
                callbacks[:] = kept
            return gone + removed

    def _outcome(self) -> Any:
        state = self.state
        if state == DONE:
            return self._value
        if state == FAILED:
            assert self._error is not None
            if self._unseen is not None and not _ASYNCIO_OWN.get():
                self._taken()  # (not when asyncio's own callback reads it: see _OnLoop)
            raise self._error
        raise _ERRORS[state](state, self.key, self.reason or state, self.id)

    def result(self, timeout: float | None = None) -> Any:
        """Wait up to ``timeout`` seconds for the end; return ``fn``'s value.

        ``timeout``: seconds; None, ``math.inf`` or ``threading.TIMEOUT_MAX`` and more
        (``10**400`` too): no limit; 0: do not wait. Checked at every call, ended ticket
        or not: negative, NaN -> ValueError; a non-number -> TypeError (both naming
        ``timeout``).

        Raises ``fn``'s exception (``failed``), the state's TurnError subclass
        (``cancelled``, ``dropped``, ``rejected``, ``timed_out``, ``deduped``), or
        ``concurrent.futures.TimeoutError`` when ``timeout`` passes first.

        On the thread running an asyncio :class:`~lanequeue.Dispatcher`'s event loop, a
        call that may wait (``timeout`` other than 0) raises RuntimeError at once: the
        turn runs on that loop, which a blocking wait would freeze, so it could never end
        in time. Use ``await ticket`` there (``result(0)`` still polls). On a thread that
        runs another event loop (a ``ThreadDispatcher``'s ticket, or a ``Dispatcher``'s
        on another loop), a call that has to wait (the ticket has not ended, ``timeout``
        other than 0) blocks that loop: the first such wait of the dispatcher's tickets
        warns (``RuntimeWarning``, pointing at the caller's line); ``await ticket``
        works from any event loop."""
        self._wait(check_timeout(timeout, "Ticket.result() argument 'timeout'"), "result()")
        return self._outcome()

    def _wait(self, timeout: float | None, call: str) -> None:
        """Wait for the end (``result`` and ``exception``; ``call`` names the call in the
        loop-thread warning). Raises RuntimeError on the asyncio dispatcher's loop thread
        (any ``timeout`` but 0), ``concurrent.futures.TimeoutError`` when ``timeout``
        passes first."""
        # (asyncio's own callback reads an ended ticket: asyncio.wait FIRST_EXCEPTION)
        if timeout != 0 and not (self.state in TERMINAL and _ASYNCIO_OWN.get()):
            face = self._machine.face
            if _on_loop(getattr(face, "_loop", None)):
                raise RuntimeError(
                    f"ticket {self.id} of key {shown(self.key)}: result() and exception() "
                    "would block the event loop that runs the turn; use await ticket")
            if (self.state not in TERMINAL and not face._warned_loop
                    and _get_running_loop() is not None):
                face._warn_loop(f"ticket.{call}")  # (see LoopWaitWarner in lanequeue._ops)
        if not self._wait_event().wait(timeout):
            import concurrent.futures

            raise concurrent.futures.TimeoutError(
                f"ticket {self.id} of key {shown(self.key)} still {self.state} after {timeout} s")

    def _taken(self) -> None:
        """The failed outcome was taken (see the class docstring): no log when dropped.
        Any thread; no lock (plain stores: the log is disarmed before it is let go)."""
        unseen = self._unseen
        if unseen is not None:
            unseen.exc = None
            self._unseen = None

    def _wait_event(self) -> _Signal:
        with self._machine._lock:
            if self._event is None:
                self._event = _Signal()
                if self.state in TERMINAL:  # ended already (its end may be being told)
                    self._event.set()
            return self._event

    def exception(self, timeout: float | None = None) -> BaseException | None:
        """Like :meth:`result`, but returns the exception instead of raising it (None for
        ``done``). ``timeout`` as for :meth:`result` (checked first: a bad value raises,
        it is never returned as the ticket's exception; on the dispatcher's loop thread a
        wait raises RuntimeError, and on another loop's thread a wait warns, as for
        :meth:`result`)."""
        wait = check_timeout(timeout, "Ticket.exception() argument 'timeout'")
        # (The wait's own errors, RuntimeError on the loop's thread and TimeoutError, are
        # raised: never returned as the ticket's exception, also for a failed ticket.)
        self._wait(wait, "exception()")
        try:
            self._outcome()
        except BaseException as exc:
            if exc is self._error or isinstance(exc, TurnError):  # (not an interrupt's)
                return exc
            raise
        return None

    @property
    def _condition(self) -> Any:
        """What ``concurrent.futures.wait``/``as_completed`` take first from a future: a
        ticket is not one, so they fail here with a TypeError that says what to use."""
        raise TypeError(
            "a Ticket is not a concurrent.futures.Future: wait for it with "
            "ticket.result(timeout) (any thread), or asyncio.wait / asyncio.as_completed "
            "(async code)")

    def __await__(self) -> Any:
        if self._callbacks is not None:  # not ended (or not notified) yet
            import asyncio

            loop = asyncio.get_running_loop()
            fut: asyncio.Future[None] = loop.create_future()
            wake = _Wake(loop, fut)
            self.add_done_callback(wake)
            try:
                # A private future: cancelling the awaiting task cancels only this wait.
                yield from fut.__await__()
            except GeneratorExit:
                # Closed unfinished (its loop closed, the coroutine collected as garbage,
                # maybe in a thread that holds the dispatcher's lock): take no lock. The
                # callback stays until the ticket ends, and does nothing then.
                raise
            except BaseException:
                # Cancelled: its callback goes with it (a caller polling a long ticket
                # with ``asyncio.wait_for(ticket, t)`` must not pile one up per poll).
                self.remove_done_callback(wake)
                raise
        return self._outcome()

    def __repr__(self) -> str:
        extra = f" reason={self.reason!r}" if self.reason else ""
        return f"<Ticket {self.id} key={shown(self.key)} {self.state}{extra}>"


# Set while asyncio's own done-callback runs (_OnLoop._run): a read of the outcome then is
# not its taking (see Ticket).
_ASYNCIO_OWN: ContextVar[bool] = ContextVar("lanequeue_asyncio_own", default=False)


class _OnLoop:
    """One of asyncio's own done-callbacks (see :meth:`Ticket.add_done_callback`), called
    on the loop it was added from, whichever thread ends the ticket. Equal to the
    callback it wraps, so ``remove_done_callback`` of that callback removes it."""

    __slots__ = ("loop", "fn", "dead")

    def __init__(self, loop: Any, fn: Callable[[Ticket], Any]) -> None:
        self.loop = loop
        self.fn = fn
        self.dead = False  # removed (remove_done_callback): does nothing when called

    def __call__(self, ticket: Ticket) -> None:
        loop = self.loop
        if self.dead or loop.is_closed():
            return
        if _on_loop(loop):
            self._run(ticket)
        else:
            loop.call_soon_threadsafe(self._run, ticket)

    def _run(self, ticket: Ticket) -> None:
        """Call the callback, unless removed meanwhile; what it reads of a failed ticket
        (``asyncio.wait(..., FIRST_EXCEPTION)`` calls ``exception()``) is not a taking
        of its outcome (``_ASYNCIO_OWN``): its caller is still to read it."""
        if self.dead:
            return
        token = _ASYNCIO_OWN.set(True)
        try:
            self.fn(ticket)
        finally:
            _ASYNCIO_OWN.reset(token)

    def __eq__(self, other: object) -> bool:
        return self is other or bool(self.fn == other)

    __hash__ = None  # type: ignore[assignment]


class _Wake(_OnLoop):
    """The done-callback of one ``await ticket``: wakes the awaiting task, on its loop
    (from the thread that ends the ticket, through ``call_soon_threadsafe``). Not a
    taking of the outcome (see :class:`Ticket`): the await takes it when it ends with
    it, and one cancelled before the end takes nothing."""

    __slots__ = ()

    def __init__(self, loop: Any, fut: Any) -> None:
        super().__init__(loop, functools.partial(_settle_for, fut))

    __eq__ = object.__eq__  # (itself only: remove_done_callback(wake))
    __hash__ = None


def dedupe_scope(key: str, dedupe_id: str) -> str:
    """The identity of ``dedupe_id`` submitted for ``key``: the id within its key, as one
    string that no other (key, id) pair gives (the key's length first, so neither part's
    characters can shift the border between them). Ids are scoped per key, as a channel's
    message ids are per chat: the same id under two keys names two turns. This is the
    dedupe table's key and, with a shared window, the claim's (``{P:d:<scope>}``)."""
    return f"{len(key)}:{key}:{dedupe_id}"


def _settle_for(fut: Any, _: Ticket) -> None:
    _settle(fut)


def _settle(fut: Any) -> None:
    if not fut.done():
        fut.set_result(None)


def _takes_outcome(fn: Any) -> bool:
    """Whether a done-callback ``fn`` called with a failed ticket takes its outcome (see
    :class:`Ticket`): not an ``await``'s wake-up, nor asyncio's own callbacks (``asyncio.wait``
    only collects the done tickets; its caller is to read them)."""
    if isinstance(fn, _OnLoop):  # (an await's _Wake too)
        return False
    # asyncio's own: its private functions (asyncio.wait's ``_on_completion``), not a
    # public one a caller hands over (``queue.put_nowait``: the caller's choice).
    module = getattr(fn, "__module__", None)
    name = getattr(fn, "__name__", "")
    return not (isinstance(module, str) and module.startswith("asyncio.")
                and isinstance(name, str) and name.startswith("_"))


class _Unretrieved:
    """Carried by a ``failed`` ticket until its exception is taken (``Ticket._unseen``):
    dropped with the ticket while it still holds the exception, it logs it (asyncio's
    ``_TracebackLogger`` did the same for futures). Only failed tickets make one, so a
    ticket has no finaliser of its own and a turn that succeeds costs nothing.

    ``__del__`` may run in any thread, at any point where the garbage collector runs
    (inside the dispatcher's locked sections too) and at interpreter shutdown: it reads
    only its own fields, takes no dispatcher lock, and never raises. Made inert (``exc``
    None) in :meth:`Machine._end` before it is armed, and disarmed before it is let go
    (:meth:`Ticket._taken`)."""

    __slots__ = ("key", "tid", "exc", "pid")

    key: str
    tid: int
    pid: int  # the process that made it (a forked child's copy does not log)
    exc: BaseException | None  # (unset until armed)

    def __del__(self) -> None:
        exc = getattr(self, "exc", None)  # (unset: made, never armed)
        if exc is None or getattr(self, "pid", None) != os.getpid():  # (a forked child's
            # copy: the ticket is the parent's, which may still read it)
            return
        self.exc = None
        try:
            log.error(
                "ticket %d of key %s failed and its exception was never retrieved "
                "(result(), exception(), await ticket, or a done-callback)", self.tid,
                shown(self.key), exc_info=(type(exc), exc, exc.__traceback__))
        except Exception:  # (at interpreter shutdown the logging may be gone)
            pass


#: What :meth:`Machine._end` arms for a ticket that carries no log (its commit has no
#: branch): inert for good, as it never belongs to this process (``pid``).
_INERT = _Unretrieved()
_INERT.pid = -1


class Notice:
    """A condition threads wait on, whose lock an interrupt cannot leave held:
    ``threading.Condition`` is entered through its Python-level ``__enter__`` (an
    interrupt there leaves the lock taken, and every later notify or wait blocks for
    ever). Here the lock is an ``RLock`` taken as the first statement inside a ``try``
    whose ``finally`` releases it (see "Interrupts" in ``lanequeue._core``); an
    interrupt inside ``Condition.wait`` that left it released already makes that
    release refuse (an ``RLock`` is not released for another thread; a plain ``Lock``
    would be, whichever thread held it), and the interrupt goes on. Used by
    :class:`_Signal` and by the ThreadDispatcher's idle notice."""

    __slots__ = ("lock", "cond")

    def __init__(self) -> None:
        self.lock = threading.RLock()
        self.cond = threading.Condition(self.lock)

    def notify_all(self) -> None:
        """Wake every waiter (to look at its predicate again)."""
        lock = self.lock
        try:
            lock.acquire()  # inside the try
            self.cond.notify_all()
        finally:
            try:  # (the release's own call first: no frame of ours before it)
                lock.release()
            except RuntimeError:  # not held: interrupted before the acquire
                pass

    def wait_for(self, predicate: Callable[[], bool], timeout: float | None) -> bool:
        """Block until ``predicate()`` is true or ``timeout`` seconds (None: no limit)
        passed; returns its last value (``Condition.wait_for``)."""
        lock = self.lock
        try:
            lock.acquire()  # inside the try
            return self.cond.wait_for(predicate, timeout)
        finally:
            try:
                lock.release()
            except RuntimeError:  # not held: interrupted before the acquire, or in a wait
                pass


class _Signal(threading.Event):
    """A flag threads wait for: a ``threading.Event`` (``Turn.cancel_event``'s documented
    type) whose lock an interrupt cannot leave held (a :class:`Notice`; ``Event`` enters
    its ``Condition`` through Python code). The flag is stored before the notice, which
    wakes the waiters under the notice's lock, so a waiter that read it false is
    waiting by then: none misses it. A :meth:`set` cut short is made whole by setting it
    again (see "Interrupts"). Used for a ticket's wait, a claim in flight and a turn's
    cancel event."""

    def __init__(self) -> None:  # (no super().__init__: its Condition has a plain Lock)
        self._notice = Notice()
        self._cond = self._notice.cond  # (Event's own helpers, _at_fork_reinit, use it)
        self._flag = False

    def set(self) -> None:
        self._flag = True
        self._notice.notify_all()

    def clear(self) -> None:
        self._flag = False

    def is_set(self) -> bool:
        return self._flag

    def wait(self, timeout: float | None = None) -> bool:
        if self._flag:
            return True
        return self._notice.wait_for(self.is_set, timeout)


def _on_loop(loop: Any) -> bool:
    import asyncio

    try:
        return asyncio.get_running_loop() is loop
    except RuntimeError:
        return False


def _call(fn: Callable[..., Any], *args: Any) -> None:
    try:
        fn(*args)
    except Exception:
        log.exception("dispatcher callback %r raised", fn)


class Inbox:
    """The payloads steered into a running turn (busy policy ``steer``).

    ``take()`` returns the payloads not taken yet, in submit order, and binds their tickets
    to this turn: they end with the turn's result, and a taken ticket's ``run_timeout_s``
    (counted from the take) may shorten the turn's run bound, never lengthen it. Payloads
    never taken when the turn ends run as normal turns next. Until taken they are pending
    turns of the key (``pending(key)``, ``max_pending``). ``len(inbox)`` counts payloads
    waiting. Thread-safe.
    """

    __slots__ = ("_job",)

    def __init__(self, job: Job) -> None:
        self._job = job

    def take(self) -> list[Any]:
        return self._job.machine._take_inbox(self._job)

    def __len__(self) -> int:
        return len(self._job.steered)

    def __bool__(self) -> bool:
        return bool(self._job.steered)

    def __repr__(self) -> str:
        return f"<Inbox waiting={len(self._job.steered)}>"


class Turn:
    """The turn being run, as seen from inside ``fn`` through :func:`current_turn`.

    Attributes:
        key: the turn's key.
        ticket: the (first) ticket it serves; ``tickets`` lists every merged one.
        cancel_event: a ``threading.Event`` set when the turn is cancelled, interrupted,
            runs out of ``run_timeout_s``, or loses the lease of one of its Redis lanes
            (the key may be another replica's then: its tickets end ``failed`` with
            LeaseLostError); thread turns poll it (asyncio turns are also cancelled as
            tasks).
        inbox: the :class:`Inbox` of payloads steered into the turn.
        fencing_tokens: the fencing token of each lane the turn holds, by lane name.
    """

    __slots__ = ("_job", "_event", "_cancelled", "inbox", "_multi")

    def __init__(self, job: Job) -> None:
        self._job = job
        self._event: threading.Event | None = None  # made on first look
        self._cancelled = False
        self.inbox = Inbox(job)
        self._multi: Any = None  # the acquire_all it runs under, once started (the face)

    @property
    def cancel_event(self) -> threading.Event:
        with self._job.machine._lock:
            if self._event is None:
                self._event = _Signal()
                if self._cancelled:
                    self._event.set()
            return self._event

    def _signal(self) -> None:
        """Set the cancel event (any thread; idempotent; Event.set never blocks)."""
        self._cancelled = True
        if self._event is not None:
            self._event.set()

    @property
    def key(self) -> str:
        return self._job.key

    @property
    def ticket(self) -> Ticket:
        return self._job.tickets[0]

    @property
    def tickets(self) -> list[Ticket]:
        return list(self._job.tickets)

    @property
    def cancelled(self) -> bool:
        """True once the turn was asked to end (same as ``cancel_event.is_set()``)."""
        return self._cancelled

    @property
    def fencing_tokens(self) -> dict[str, int]:
        """The fencing token of each lane the turn holds, by lane name, in the order
        they were taken (``{"session": 41, "global": 907}``): hand them to the store
        ``fn`` writes to, so it can refuse a write that carries a token smaller than one
        it has seen (a turn whose Redis lease was lost, see "Redis" in the README).
        Each grows with every grant of its lane (a per-key lane: also with every turn
        of the key). Read it inside ``fn``: it is ``{}`` before the turn holds its lanes
        and once they are released. Never waits; no round trip.

        Example:

            >>> from lanequeue import ThreadDispatcher, build_default_lanes, current_turn
            >>> dispatcher = ThreadDispatcher(build_default_lanes())
            >>> ticket = dispatcher.submit("web:42", lambda: current_turn().fencing_tokens)
            >>> sorted(ticket.result(5))
            ['global', 'session']
            >>> dispatcher.close()
        """
        multi = self._multi
        if multi is None:
            return {}
        steps = multi._plan.steps
        # An in-process lane's token, or a hold (a Redis lane's, or a view of a token).
        return {steps[i][0].name: got if type(got) is int else got.fencing_token
                for i, got in enumerate(list(multi._taken))}

    def __repr__(self) -> str:
        return f"<Turn key={shown(self.key)} tickets={len(self._job.tickets)}>"


_CURRENT: ContextVar[Turn | None] = ContextVar("lanequeue_turn", default=None)


def current_turn() -> Turn:
    """The :class:`Turn` whose ``fn`` is running in this task or thread.

    Raises LookupError when called outside a dispatcher's turn.
    """
    turn = _CURRENT.get()
    if turn is None:
        raise LookupError("current_turn() called outside a dispatcher turn")
    return turn


class Job:
    """One call of ``fn`` for one key (see the module docstring). Faces read ``key``,
    ``fn``, ``args`` (set by :meth:`Machine.start`), ``turn`` and keep their run handle
    in ``handle``."""

    __slots__ = (
        "machine", "key", "fn", "args", "tickets", "steered", "taken", "phase", "turn",
        "handle", "abandoned", "rank", "run_timer", "started_at", "end_req", "seq",
        "reported", "formed_at", "run_due", "runner", "outcome", "entering",
    )

    def __init__(self, machine: Machine, key: str, tickets: list[Ticket], seq: int) -> None:
        self.machine = machine
        self.key = key
        self.tickets = tickets
        self.fn = tickets[0].fn
        # The call's arguments, made by Machine.start from the tickets still in the job
        # then (a merged ticket may end before the call starts: its payload is not passed).
        self.args: tuple[Any, ...] = ()
        self.steered: list[Ticket] = []
        self.taken: list[Ticket] = []
        self.phase = READY
        self.turn = Turn(self)
        self.handle: Any = None
        self.abandoned = False
        self.rank: tuple[float, int] = (0.0, seq)
        self.run_timer: Timer | None = None
        self.started_at = 0.0
        self.end_req: tuple[str, str] | None = None
        self.seq = seq
        self.reported = False  # finish() was called for it
        # The acquire_all its runner is entering (a face's: the thread face ends its
        # wait when the job is abandoned, see ThreadDispatcher._interrupt), else None.
        self.entering: Any = None
        self.formed_at = 0.0  # when the job was formed (the dispatcher's clock)
        self.run_due = math.inf  # when the run timer fires (the dispatcher's clock)
        self.runner: Any = None  # the runner that entered it (Machine.enter)
        self.outcome: tuple[bool, Any, bool] | None = None  # finish's (ok, value, started)

    def __lt__(self, other: Job) -> bool:
        return self.rank < other.rank


#: A ticket's shared dedupe claim is in flight (see ``Ticket._claim``).
CLAIMING: Any = object()


class _Key:
    __slots__ = ("arrivals", "line", "job", "timer", "timer_due", "advancing")

    def __init__(self) -> None:
        # Submits not placed yet (in submit order): one whose shared dedupe claim is in
        # flight, and every later submit of the key, placed in order as claims answer.
        self.arrivals: deque[Ticket] = deque()
        self.line: deque[Ticket] = deque()
        self.job: Job | None = None
        # The head tickets being moved from the line into the key's next job (None when
        # no move is under way): see Machine._advance and _repair.
        self.advancing: list[Ticket] | None = None
        self.timer: Timer | None = None
        self.timer_due = 0.0


class _Effects:
    """What an operation does after releasing the lock."""

    __slots__ = ("ended", "dropped", "launch", "interrupt", "timers", "claims", "open",
                 "n_ended", "n_launched", "n_claims")

    def __init__(self) -> None:
        self.open = True  # not all run yet (see Machine._after)
        self.claims: list[Ticket] = []  # tickets whose shared claim is to be sent (offload)
        self.n_claims = self.n_ended = self.n_launched = 0  # how many of each were run
        self.ended: list[Ticket] = []
        self.dropped: list[Ticket] = []
        self.launch: list[Job] = []
        self.interrupt: list[Job] = []
        self.timers: list[Timer] = []


#: Every machine of this process, for :func:`_after_fork`.
_MACHINES: weakref.WeakSet[Machine] = weakref.WeakSet()


def _after_fork() -> None:
    """In a forked child: each machine gets a fresh lock. Another thread of the parent
    may have held it at the fork, and that thread does not exist here: without this, the
    read-only views (``pending``, ``snapshot``, ``stats``) the child may still call would
    block for ever (its mutating calls refuse: see ``_check_process``)."""
    for machine in list(_MACHINES):
        machine._lock = threading.Lock()
        machine._claiming = {}  # (the parent's claims in flight are its threads')


at_fork_in_child(_after_fork)


def _sweep_if_alive(ref: weakref.ref[Machine], due: float) -> None:
    """The dedupe sweep timer's call: the machine's sweep, unless it was collected."""
    machine = ref()
    if machine is not None:
        machine._sweep(due)


class Machine:
    """The dispatcher's state (see the module docstring). Thread-safe."""

    def __init__(
        self,
        face: Face,
        *,
        slots: int | None,
        gate_lane: str | None,
        default_timeout_s: float | None,
        busy: str,
        max_pending: int,
        overflow: str,
        on_drop: Callable[[list[Ticket]], Any] | None,
        dedupe_ttl_s: float,
        dedupe_max: int,
        debounce_s: float,
        max_wait_s: float | None,
        ageing_s: float | None,
        window: Any = None,
    ) -> None:
        self.face = face
        self.window = window  # a RedisDedupeWindow shared with other processes, or None
        self.slots = slots
        self.gate_lane = gate_lane
        self.default_timeout_s = default_timeout_s
        # Every argument was checked by the caller (DispatcherBase, the one place).
        self.busy = busy
        self.max_pending = max_pending
        self.overflow = overflow
        self.on_drop = on_drop
        self.dedupe_ttl_s = dedupe_ttl_s
        self.dedupe_max = dedupe_max
        self.debounce_s = debounce_s
        self.max_wait_s = max_wait_s
        self.ageing_s = ageing_s
        self._lock = threading.Lock()
        _MACHINES.add(self)  # (a forked child gets a fresh lock: _after_fork)
        self._keys: dict[str, _Key] = {}
        self._keys_high = 0  # most keys alive at once since the table was last rebuilt
        self._ready: list[Job] = []  # the gate's heap (abandoned jobs skipped when popped)
        # Abandoned jobs in it, at most (a hint: see _abandon); it is rebuilt once they
        # are most of it.
        self._dead_ready = 0
        self._admitted = 0  # jobs past the gate whose runner has not returned
        self._runners = 0  # runners launched and not returned (gated or not)
        self._dedupe: OrderedDict[str, tuple[Ticket, float]] = OrderedDict()
        self._dedupe_timer: Timer | None = None
        self._dedupe_due = 0.0  # when the dedupe sweep timer is set for
        # Shared window claimed on the caller's thread: id -> the signal of the one claim
        # of it in flight here, set once that claim's submit is done (a _Signal, not a
        # threading.Event: an interrupt in its wait or set cannot leave a lock held).
        # Another submit of the id waits for it, then finds its ticket in the table. So
        # no claim of an id is in flight while another is, or while a ticket of it is in
        # the table, and a give-back (a claim's own value, see the window) never deletes
        # the claim a ticket of this dispatcher runs under.
        self._claiming: dict[str, _Signal] = {}
        # Every ticket not ended yet, by id (see _repair).
        self._live: dict[int, Ticket] = {}
        # Where the commit of _end (which has no branch) deletes or stores what it skips.
        self._spare: dict[Any, Any] = {}
        # Start deadlines of pending tickets: (deadline, id, ticket), one timer for the top.
        self._deadlines: list[tuple[float, int, Ticket]] = []
        self._deadline_timer: Timer | None = None
        self._deadline_due = 0.0
        self._stale = 0  # entries of tickets no longer pending
        self._ids = itertools.count(1)
        self._seq = itertools.count()
        self.draining = False
        self.closed = False
        self._c = dict.fromkeys(
            ("submitted", *TERMINAL[:-1], "deduped", "merged", "steered", "running"), 0)

    # -- submit ---------------------------------------------------------------------------

    def submit(self, key: str, fn: Any, args: tuple[Any, ...], busy: str | None,
               dedupe_id: str | None, priority: int, timeout_s: Any,
               run_timeout_s: float | None, lane_default: Any) -> Ticket:
        # Every argument was checked by the caller (DispatcherBase.submit).
        policy = self.busy if busy is None else busy
        timeout = self.default_timeout_s if timeout_s is lane_default else timeout_s
        run_timeout = run_timeout_s
        fx = _Effects()
        # The identity of a dedupe id: the id within its key (see dedupe_scope).
        scope = None if dedupe_id is None else dedupe_scope(key, dedupe_id)
        shared = self.window is not None and scope is not None
        offload = self.face._offload if shared else None
        ours = True
        claimed = False  # a claim of ours that no ticket uses yet (given back on exit)
        number = 0  # its number
        mine: _Signal | None = None  # our claim's place in _claiming
        other: _Signal | None = None  # another claim of the id, in flight
        waited: _Signal | None = None  # one we waited for in vain
        try:
            attempts = [0, 1] if shared and offload is None else [1]
            while attempts:
                attempt = attempts.pop(0)
                if other is not None:
                    # Wait for that claim's submit (bounded: one that was stopped before
                    # it cleared its place is taken over after this wait).
                    assert self.window is not None
                    if not other.wait(2 * self.window.call_wait_s + 1.0):
                        waited = other
                    other = None
                if attempt == 1 and shared and offload is None:
                    # Not in this process's table: ask the shared window (outside the
                    # lock: one round trip). Another thread may claim the same id
                    # meanwhile; the table is looked at again below. (Offloaded: asked
                    # after, see _arrive.)
                    assert scope is not None
                    number = self.window.number()
                    try:
                        ours = self.window.claim(scope, number)
                    except BaseException:
                        # It may land all the same (sent, not answered).
                        self.window.give_back_later(scope, number)
                        raise
                    claimed = ours
                with self._lock:
                    if self.draining:
                        raise DispatcherDrainingError(
                            "the dispatcher is draining or closed: it takes no new turns")
                    now = self.face._now()
                    if scope is not None:
                        self._expire_dedupe(now)
                        seen = self._dedupe.get(scope)
                        if seen is not None:
                            if claimed:
                                # Another thread's ticket of the id came first here, but
                                # ours is the value Redis holds now: that ticket's
                                # give-back must carry ours.
                                seen[0]._number = number
                            claimed = False  # the claim is that ticket's now
                            self._c["deduped"] += 1
                            return seen[0]
                    k = self._keys.get(key)
                    early = (self._rejects(k, policy)
                             if shared and (k is None or not k.arrivals) else None)
                    if attempt == 0 and early is None:
                        assert scope is not None
                        other = self._claiming.get(scope)
                        if other is None or other is waited:
                            other = None
                            # -- plain stores: the claim's place, then ours to clear --
                            self._claiming[scope] = mine = _Signal()
                        else:
                            attempts.insert(0, 0)  # look again once that one is done
                        continue
                    rejected = early is not None and not (attempt == 1 and offload is None
                                                          and shared)
                    if offload is not None and not rejected:
                        number = self.window.number()
                    t = Ticket(self, next(self._ids), key, fn, args, policy, priority,
                               dedupe_id, scope, now,
                               None if timeout is None else now + timeout, run_timeout)
                    # Counted and registered with plain stores right away: an interrupt
                    # from here on finds it (see _repair).
                    self._c["submitted"] += 1
                    self._live[t.id] = t
                    t._number = number
                    if rejected:
                        # Rejected here whatever the window says: nothing is claimed,
                        # so another dispatcher's copy of the id still runs.
                        t._started = True  # nothing to give back
                        self._end(t, REJECTED, early, fx)
                    else:
                        if offload is not None:
                            # The window is asked off this thread (the event loop), once
                            # the lock is released: the ticket waits among the key's
                            # arrivals until it answers (see _settle).
                            t._claim = CLAIMING
                            fx.claims.append(t)
                        if not ours:
                            # Another process owns this id within the window: nothing
                            # runs here.
                            t._started = True  # nothing to give back
                            self._end(t, DEDUPED, "duplicate", fx)
                        else:
                            if scope is not None:
                                self._remember(scope, t, now, fx)
                            claimed = False  # the ticket's now: _end gives it back
                            self._arrive(t, now, fx)
                    break
        except BaseException as exc:
            try:
                if not isinstance(exc, (DispatcherDrainingError, LaneBackendError)):
                    # Interrupted (those two leave nothing changed): see _repair.
                    self._repair(fx)
            finally:
                if claimed and scope is not None:
                    # Nothing was submitted (draining, or interrupted): the claim goes
                    # back.
                    self.window.give_back(scope, number)
            raise
        finally:
            try:
                if mine is not None:  # our claim is done: the next one of the id may go
                    assert scope is not None
                    with self._lock:
                        if self._claiming.get(scope) is mine:
                            del self._claiming[scope]
                    mine.set()
            finally:
                try:
                    self._after(fx)
                finally:
                    if fx.open:  # interrupted at its entry: see "Interrupts"
                        self._after(fx)
        return t

    def _rejects(self, k: _Key | None, policy: str) -> str | None:
        """The reason (``"busy"``, ``"overflow"``) a new turn of key ``k`` under
        ``policy`` is rejected, else None (lock held). Decided before anything is dropped
        or interrupted, so a rejected turn changes nothing.

        ``max_pending`` bounds the key's pending turns (:meth:`_waiting`) once the new
        one is placed: it is rejected when the turns that stay pending already fill the
        bound and none may go for it (``reject_new``, or ``drop_oldest`` with none
        pending). ``interrupt`` and ``replace`` keep none of the pending turns: only
        ``max_pending=0`` rejects them."""
        if k is None or (k.job is None and not k.line):
            return None
        if policy == "reject":
            return "busy"
        kept = 0 if policy in ("interrupt", "replace") else self._waiting(k)
        if kept >= self.max_pending and (self.overflow == "reject_new" or kept == 0):
            return "overflow"
        return None

    @staticmethod
    def _waiting(k: _Key) -> int:
        """The key's pending turns that ``max_pending`` bounds: its line and the
        payloads steered into its current job and not taken (the current job itself,
        running or not started, is not counted; arrivals are placed after) (lock held)."""
        return len(k.line) + (len(k.job.steered) if k.job is not None else 0)

    def _arrive(self, t: Ticket, now: float, fx: _Effects) -> None:
        """A new ticket: placed at once, unless its claim is in flight or the key has
        arrivals waiting (then it waits after them: per key, submit order) (lock held)."""
        k = self._keys.get(t.key)
        if t._claim is CLAIMING or (k is not None and k.arrivals):
            if k is None:
                k = self._keys[t.key] = _Key()
                if len(self._keys) > self._keys_high:
                    self._keys_high = len(self._keys)
            k.arrivals.append(t)
            if t.deadline is None or t.deadline > now:  # (else decided when placed)
                self._arm_deadline(t, now, fx)
            return
        self._place(t, now, fx)

    def _claimed(self, t: Ticket, ours: Any) -> None:
        """The shared window answered ``t``'s claim (offloaded): True, False, or the
        error it raised. The key's arrivals are placed up to the next claim in flight."""
        if isinstance(ours, BaseException) and t._scope is not None:
            # A failed claim may land all the same (sent, not answered).
            self.window.give_back_later(t._scope, t._number)
        self._step(self._claimed_locked, t, ours)

    def _claimed_locked(self, fx: _Effects, t: Ticket, ours: Any) -> None:
        """The locked step of :meth:`_claimed` (see :meth:`_step`)."""
        t._claim = ours
        if t.state in TERMINAL:
            # Ended while asking (cancelled, cleared, timed out): give its claim
            # back. Its value is its own, so a retry's claim of the id is never taken
            # with it. (After an error the claim may land later: give_back_later, in
            # _claimed, sees to it and keeps it recorded as returned meanwhile.)
            if t._scope is None or isinstance(ours, BaseException):
                pass
            elif ours is not False:
                t._forget = True
                fx.ended.append(t)  # (told again: only the give-back is left)
            elif self.window is not None:
                # Never held: nothing to give back, nor to remember as returned.
                self.window.forget_returned(t._scope, t._number)
        else:
            self._settle(t.key, fx)

    def _settle(self, key: str, fx: _Effects) -> None:
        """Place the key's arrivals whose claims answered, in order, up to the first one
        still asking (lock held): another process's id ends ``deduped`` (not counted in
        ``submitted``), a failed claim ends ``failed`` with its LaneBackendError, ours
        is placed with its busy policy."""
        k = self._keys.get(key)
        if k is None:
            return
        now = self.face._now()
        arrivals = k.arrivals
        while arrivals and arrivals[0]._claim is not CLAIMING:
            t = arrivals.popleft()
            claim = t._claim
            if claim is False:
                if t._scope is not None and self._dedupe.get(t._scope, (None,))[0] is t:
                    del self._dedupe[t._scope]
                t._started = True  # nothing to give back
                self._end(t, DEDUPED, "duplicate", fx)
            elif isinstance(claim, BaseException):
                self._end(t, FAILED, type(claim).__name__, fx, error=claim)
            else:
                self._place(t, now, fx)
        self._tidy(key, k)

    def _place(self, t: Ticket, now: float, fx: _Effects) -> None:
        """Apply the busy policy and the line's bound to a new ticket (lock held)."""
        k = self._keys.get(t.key)
        if k is None:
            k = self._keys[t.key] = _Key()
            if len(self._keys) > self._keys_high:
                self._keys_high = len(self._keys)
        busy = k.job is not None or bool(k.line)
        policy = t.busy
        if busy:
            # Admission first: a rejected turn drops, interrupts and steers nothing.
            reason = self._rejects(k, policy)  # (also asked before claiming)
            if reason is not None:
                self._end(t, REJECTED, reason, fx)
                self._tidy(t.key, k)
                return
            if t.deadline is not None and t.deadline <= now and not self._now_after(
                    k, policy):
                # Now or never (timeout_s=0), and not now whatever its policy does: it
                # ends before the policy acts, so it drops, interrupts and steers nothing.
                self._end(t, TIMED_OUT, "start timeout", fx)
                self._tidy(t.key, k)
                return
            job = k.job
            if policy in ("interrupt", "replace"):
                # Every pending turn goes: the line and what was steered, not taken.
                self._drop_line(k, DROPPED, "superseded", fx)
                if job is not None:
                    self._drop_steered(job, DROPPED, "superseded", fx)
                    if policy == "interrupt":
                        self._stop_job(k, job, DROPPED, CANCELLED, "superseded", fx)
            elif self._waiting(k) >= self.max_pending:
                # drop_oldest (reject_new was rejected above). Steered tickets are older
                # than every ticket in the line (steering needs an empty line).
                steered = job.steered if job is not None else None
                old = steered.pop(0) if steered else k.line.popleft()
                self._end(old, DROPPED, "overflow", fx)
                fx.dropped.append(old)
            job = k.job
            # Steer only past an empty line: a payload steered past pending turns would be
            # seen before them, and per-key submit order would break.
            if (policy == "steer" and job is not None and not k.line
                    and job.end_req is None and not job.abandoned and job.fn == t.fn):
                job.steered.append(t)
                t._job = job
                self._arm_deadline(t, now, fx)
                return
        k.line.append(t)
        if t.deadline is not None and t.deadline <= now:
            self._now_or_never(t, k, now, fx)
            return
        self._arm_deadline(t, now, fx)
        if k.job is None:
            self._advance(t.key, k, now, fx)

    def _now_after(self, k: _Key, policy: str) -> bool:
        """Whether a new turn of the busy key ``k`` under ``policy`` may start at once
        once its policy has acted (lock held; admission decided already): the key has
        no job (a running turn, or one formed and not started, ends only later), no
        pending turn is left ahead of it (``interrupt`` and ``replace`` drop them all,
        ``drop_oldest`` one when the line is full), and the gate has a free slot. A
        False answer may be wrong only the safe way: the turn then ends timed out
        without its policy acting."""
        if k.job is not None:
            return False
        ahead = 0 if policy in ("interrupt", "replace") else len(k.line)
        if ahead and ahead >= self.max_pending and self.overflow == "drop_oldest":
            ahead -= 1
        if ahead:
            return False
        return self.slots is None or (self._admitted < self.slots
                                      and len(self._ready) <= self._dead_ready)

    def _now_or_never(self, t: Ticket, k: _Key, now: float, fx: _Effects) -> None:
        """A ticket in line that may not wait (``timeout_s=0``, or a deadline that passed
        while its claim was asked): it starts only if its turn is formed and admitted now,
        and its runner then takes the lanes without waiting (its budget is 0: lanes not
        free end it ``timed_out``, "start timeout"). Else it ends so at once. No timer: a
        timer due at once raced the runner, which a thread dispatcher's timer often won,
        ending turns that would have started on an idle key. Alone in its key's line (an
        idle key), it does not wait for a collect window (``debounce_s``): it runs now,
        a batch of one; behind other pending turns the key is busy (lock held)."""
        if k.job is None:
            self._advance(t.key, k, now, fx, close=len(k.line) == 1)
        job = t._job
        if job is None or job.phase != ADMITTING:
            self._detach(t, fx)
            self._end(t, TIMED_OUT, "start timeout", fx)
            self._tidy(t.key, self._keys.get(t.key))

    def _arm_deadline(self, t: Ticket, now: float, fx: _Effects) -> None:
        """Put a pending ticket's start deadline in the heap; one face timer serves the
        earliest deadline of all (cheaper than a timer per ticket) (lock held)."""
        if t.deadline is None or t.state != PENDING or t._armed:
            return
        t._armed = True
        heapq.heappush(self._deadlines, (t.deadline, t.id, t))
        if self._deadline_timer is None or t.deadline < self._deadline_due:
            if self._deadline_timer is not None:
                fx.timers.append(self._deadline_timer)
            self._arm_deadline_timer(t.deadline, now)

    def _arm_deadline_timer(self, due: float, now: float) -> None:
        """The one deadline timer, set for ``due`` (lock held; the caller cancels any
        timer it replaces). Its call carries ``due``: see :meth:`_deadlines_due_locked`."""
        self._deadline_due = due
        self._deadline_timer = self.face._call_later(max(0.0, due - now),
                                                    lambda: self._deadlines_due(due))

    def _disarm(self, t: Ticket) -> None:
        """``t`` left PENDING: its heap entry is now stale (lock held). Once most of the
        heap is stale it is rebuilt (amortised O(1)), so ended tickets are not kept.
        ``_stale`` must never count more entries than are stale: once it equals the
        heap's length the heap is dropped, with any live entry in it. So every change
        lowers it before the entry goes and raises it after the entry is marked, and
        :meth:`_repair` counts it again."""
        if t._armed:
            t._armed = False
            self._stale += 1
            heap = self._deadlines
            if self._stale == len(heap):  # every entry stale: drop them, and the timer
                self._deadlines = []
                self._stale = 0
                if self._deadline_timer is not None:
                    self._deadline_timer.cancel()
                    self._deadline_timer = None
            elif self._stale > 64 and self._stale * 2 > len(heap):
                live = [e for e in heap if e[2]._armed]
                heapq.heapify(live)
                # -- commit: plain stores --
                self._stale = 0
                self._deadlines = live

    def _deadlines_due(self, due: float) -> None:
        """The deadline timer set for ``due`` fired: end every pending ticket whose
        deadline passed."""
        self._step(self._deadlines_due_locked, due)

    def _deadlines_due_locked(self, fx: _Effects, due: float) -> None:
        """The locked step of :meth:`_deadlines_due` (see :meth:`_step`). A repeated
        call (an interrupt may make one, see "Timers and memory") is told by its
        ``due``: a timer set since is left alone. A due ticket is ended first and its
        entry popped when met again, ended: an interrupt in between leaves the entry
        for the repeat, and a ticket it left out of its line ends by :meth:`_repair`,
        timed out as well."""
        if due == self._deadline_due:
            self._deadline_timer = None  # this timer's call (or a repeat of it)
        now = self.face._now()
        while True:
            heap = self._deadlines  # (re-read: an end may rebuild it, see _disarm)
            if not heap:
                break
            deadline, _, t = heap[0]
            if not t._armed or t.state in TERMINAL:
                # The count first, then the pop: an interrupt between them leaves the
                # count low (a rebuild comes later), never high (see _disarm).
                if t._armed:  # ended, its entry not yet marked stale: never counted
                    t._armed = False
                else:
                    self._stale -= 1
                heapq.heappop(heap)
                continue
            if deadline > now:
                break
            self._detach(t, fx)
            self._end(t, TIMED_OUT, "start timeout", fx)
            self._tidy(t.key, self._keys.get(t.key))
        heap = self._deadlines
        if heap and self._deadline_timer is None:
            self._arm_deadline_timer(heap[0][0], now)

    # -- forming and admitting jobs -------------------------------------------------------

    def _advance(self, key: str, k: _Key, now: float, fx: _Effects, *,
                 close: bool = False) -> None:
        """Form the key's next job if it has none (lock held); ``close``: at once, even
        when a collect window (``debounce_s``) would hold it back."""
        if k.job is not None:
            return
        line = k.line
        if not line:
            self._tidy(key, k)
            return
        head = line[0]
        if head.busy == "collect":
            n = 1
            while n < len(line) and line[n].fn == head.fn and line[n].busy == "collect":
                n += 1
            if self.debounce_s > 0 and not close:
                due = line[n - 1].submitted_at + self.debounce_s
                if self.max_wait_s is not None:
                    due = min(due, head.submitted_at + self.max_wait_s)
                if now < due:
                    if k.timer is None or k.timer_due != due:
                        if k.timer is not None:
                            fx.timers.append(k.timer)
                        k.timer_due = due
                        k.timer = self.face._call_later(
                            due - now, lambda: self._wake(key, due))
                    return
        else:
            n = 1
        # Recorded before the line is touched (a copy, one plain store): an interrupt
        # between the pops and the job's link leaves these tickets in no line and no
        # job, and _repair puts them back at the head of the line, where they were.
        k.advancing = tickets = list(itertools.islice(line, n))
        for _ in tickets:
            line.popleft()
        if k.timer is not None:
            fx.timers.append(k.timer)
            k.timer = None
        job = Job(self, key, tickets, next(self._seq))
        job.formed_at = now
        for t in tickets:
            t._job = job
        k.job = job
        k.advancing = None
        if self.slots is None:
            self._admit(job, fx)
            return
        self._rank(job)
        heapq.heappush(self._ready, job)
        self._fill_gate(fx)

    def _rank(self, job: Job) -> None:
        """Set the job's place at the gate from the priority of the tickets it carries
        (the largest) and when it was formed (lock held)."""
        prio = max(t.priority for t in job.tickets)
        if self.ageing_s is None:
            job.rank = (-float(prio), job.seq)
        else:
            job.rank = (job.formed_at - prio * self.ageing_s, job.seq)

    def _admit(self, job: Job, fx: _Effects) -> None:
        job.phase = ADMITTING
        if self.slots is not None:
            self._admitted += 1
        self._runners += 1
        fx.launch.append(job)

    def _wake(self, key: str, due: float) -> None:
        self._step(self._wake_locked, key, due)

    def _wake_locked(self, fx: _Effects, key: str, due: float) -> None:
        """The locked step of :meth:`_wake` (see :meth:`_step`): the collect window set
        to end at ``due`` ended. A repeated call (see "Timers and memory") leaves a
        timer set since alone."""
        k = self._keys.get(key)
        if k is not None:
            if k.timer_due == due:
                k.timer = None
            self._advance(key, k, self.face._now(), fx)

    def budget(self, job: Job) -> float | None:
        """Seconds the job's runner may wait for the lanes: up to the latest deadline of
        its tickets (None: a ticket has no limit). Tickets whose own deadline passes
        earlier end by their own timers. 0 for a job abandoned meanwhile (no ticket left:
        its runner may still be on its way to the lanes, see :meth:`start`)."""
        with self._lock:
            now = self.face._now()
            latest = 0.0
            for t in job.tickets:
                if t.deadline is None:
                    return None
                latest = max(latest, t.deadline - now)
            return max(0.0, latest)

    def lane_priority(self, job: Job) -> int:
        """The priority the job's runner waits with in the counting lanes' lines: the
        largest priority of its tickets, plus one level per whole ``ageing_s`` since the
        job was formed (none without ageing), within the lanes' bounds. In a lane's line
        it then ages by that lane's own ``ageing_s``. A job abandoned meanwhile (its
        tickets all ended after its runner was launched: any instant before
        :meth:`start`) has no ticket left and gets 0: its runner goes on to ``start``,
        which refuses it, and reports."""
        with self._lock:
            prio = max((t.priority for t in job.tickets), default=0)
            if self.ageing_s is not None:
                # (a tiny ageing_s makes the levels inf: capped before int())
                levels = (self.face._now() - job.formed_at) // self.ageing_s
                prio += int(min(levels, PRIORITY_MAX - PRIORITY_MIN))
        return min(max(prio, PRIORITY_MIN), PRIORITY_MAX)

    def start(self, job: Job) -> bool:
        """The runner holds the lanes: start the job. False if it was abandoned meanwhile
        (the runner then releases and never calls ``fn``)."""
        return self._step(self._start_locked, job)

    def _start_locked(self, fx: _Effects, job: Job) -> bool:
        """The locked step of :meth:`start` (see :meth:`_step`)."""
        if job.abandoned:
            return False
        now = self.face._now()
        # Tickets that ended while the job waited for its lanes are not run (nor
        # counted running again). An interrupted stop (_stop_job) leaves them in
        # the job until its _repair, and this runner's thread may take the lock
        # in between: without this, it ran them, and they ended twice in the
        # counters (``stats.pending`` below zero).
        tickets = [t for t in job.tickets if t.state not in TERMINAL]
        if len(tickets) != len(job.tickets):
            job.tickets = tickets
            if not tickets:
                k = self._keys.get(job.key)
                if k is not None:
                    self._abandon(k, job, fx)
                    if k.job is None:
                        self._advance(job.key, k, now, fx)
                return False
        job.phase = STARTED
        job.started_at = now
        head = tickets[0]
        if head.busy == "collect":
            # The payloads of the tickets the call carries now: a merged ticket
            # that ended before the start (cancelled, timed out) is not in it.
            job.args = ([t.payload for t in tickets],)
            self._c["merged"] += len(tickets) - 1
        else:
            job.args = head.args
        for t in tickets:
            t.state = RUNNING
            t._started = True
            self._c["running"] += 1
            self._disarm(t)
        self._bound_run(job, tickets, now, fx)
        return True

    def _bound_run(self, job: Job, tickets: list[Ticket], now: float, fx: _Effects) -> None:
        """``tickets`` join the running job (at its start, or taken from its inbox at
        ``now``): the job's run timer fires at the earliest ``now + run_timeout_s`` of
        every ticket it carries (lock held)."""
        due = min((now + t.run_timeout_s for t in tickets if t.run_timeout_s is not None),
                  default=math.inf)
        if due >= job.run_due:
            return
        if job.run_timer is not None:
            fx.timers.append(job.run_timer)
        job.run_due = due
        job.run_timer = self.face._call_later(due - now, lambda: self._run_timeout(job, due))

    def finish(self, job: Job, ok: bool, value: Any) -> None:
        """The runner returned (lanes released): ``ok`` with ``fn``'s value, or not ok with
        the exception raised (by ``fn``, by the lanes while admitting, or a cancellation)."""
        self._step(self._finish_locked, job, ok, value, job=job)

    def _finish_locked(self, fx: _Effects, job: Job, ok: bool, value: Any) -> None:
        """The locked step of :meth:`finish` (see :meth:`_step`)."""
        if job.reported:
            return
        # -- commit: plain stores (the counters and the outcome together) --
        job.outcome = (ok, value, job.phase == STARTED)
        job.reported = True
        self._runners -= 1
        if self.slots is not None and job.phase != READY:
            self._admitted -= 1
        job.phase = ENDED
        self._conclude(job, fx)

    def _conclude(self, job: Job, fx: _Effects) -> None:
        """End a reported job's tickets with its outcome, free its key and the gate
        (lock held). Repeatable: what is done already is skipped (see _repair)."""
        assert job.outcome is not None
        ok, value, started = job.outcome
        if job.run_timer is not None:
            fx.timers.append(job.run_timer)
            job.run_timer = None
        if not job.abandoned:
            for t in job.tickets + job.taken:
                end = t._end_req or job.end_req
                if end is not None:
                    lost = None
                    if end[0] == FAILED:  # (only a lost lease asks for it: lease_lost)
                        lost = value if isinstance(value, LeaseLostError) else LeaseLostError(
                            f"key {shown(job.key)}: the lease of a Redis lane of the turn "
                            f"was lost while it ran")
                    self._end(t, end[0], end[1], fx, error=lost)
                elif ok:
                    self._end(t, DONE, None, fx, value=value)
                elif not started and isinstance(value, TimeoutError):
                    self._end(t, TIMED_OUT, "start timeout", fx)
                elif _is_cancel(value):
                    self._end(t, CANCELLED, "cancelled", fx)
                else:
                    self._end(t, FAILED, type(value).__name__, fx, error=value)
            self._release_key(job, fx)
        self._fill_gate(fx)

    def _release_key(self, job: Job, fx: _Effects) -> None:
        """The key's job is over: steered payloads never taken go first in line; the key
        forms its next job (lock held)."""
        k = self._keys.get(job.key)
        if k is None or k.job is not job:
            return
        steered = job.steered
        line = k.line
        if steered:
            line = deque(steered)
            line.extend(k.line)
        # -- commit: plain stores --
        k.line = line
        job.steered = []
        k.job = None
        for t in steered:
            t._job = None
        self._advance(job.key, k, self.face._now(), fx)

    def enter(self, job: Job, runner: Any) -> bool:
        """A runner of ``job`` begins: True for the first (it runs the job and reports),
        False for another (a launch repeated after an interrupt: it returns at once)."""
        with self._lock:
            if job.runner is not None or job.reported:
                return False
            job.runner = runner
            return True

    def _repair(self, fx: _Effects, cancelled: Ticket | None = None,
                job: Job | None = None) -> None:
        """Make the state whole again after an exception interrupted a locked block (a
        ``KeyboardInterrupt`` from a signal handler, say): see "Interrupts". ``cancelled``:
        the ticket a cancel was ending; ``job``: the job a runner was reporting."""
        with self._lock:
            now = self.face._now()
            if cancelled is not None and cancelled.state == PENDING:
                self._detach(cancelled, fx)
                self._end(cancelled, CANCELLED, "cancelled", fx)
            if job is not None and job.outcome is not None:
                self._conclude(job, fx)  # the report's rest
            for k in list(self._keys.values()):
                moving, k.advancing = k.advancing, None
                if moving is not None and (k.job is None or k.job.tickets is not moving):
                    # An advance stopped between its pops and its job's link: the tickets
                    # it took go back to the head of the line, in order.
                    k.line.extendleft(reversed(
                        [t for t in moving if t.state == PENDING and t not in k.line]))
            placed: set[int] = set()
            queued = {id(j) for j in self._ready}
            for k in list(self._keys.values()):
                for t in k.line:
                    t._job = None
                    placed.add(t.id)
                placed.update(t.id for t in k.arrivals)
                j = k.job
                if j is not None:
                    if j.phase in (READY, ADMITTING):
                        # An interrupted stop may have ended some of a job's tickets
                        # without taking them out of it: a job not started carries
                        # only live tickets (start would run them again).
                        j.tickets = [t for t in j.tickets if t.state not in TERMINAL]
                        j.steered = [t for t in j.steered if t.state not in TERMINAL]
                    placed.update(t.id for t in j.tickets + j.steered + j.taken)
                    if j.outcome is not None:
                        self._conclude(j, fx)
                    elif j.phase in (READY, ADMITTING) and not j.tickets:
                        self._abandon(k, j, fx)
                    elif j.phase == READY and id(j) not in queued and not j.abandoned:
                        heapq.heappush(self._ready, j)  # popped, never admitted
            for t in list(self._live.values()):
                if t.state == RUNNING and t._job is not None and t._job.outcome is not None:
                    self._conclude(t._job, fx)
                elif t.state == PENDING and t.id not in placed:
                    # Taken out of its line and not put anywhere: it cannot run. (Its
                    # start deadline passed: it was being timed out, see _deadlines_due.)
                    if t.deadline is not None and t.deadline <= now:
                        self._end(t, TIMED_OUT, "start timeout", fx)
                    else:
                        self._end(t, CANCELLED, "interrupted", fx)
            for key, k in list(self._keys.items()):
                if k.job is None:
                    if k.arrivals and k.arrivals[0]._claim is not CLAIMING:
                        self._settle(key, fx)
                    self._advance(key, k, now, fx)
            self._fill_gate(fx)
            # The stale deadline entries, counted again (see _disarm); and a timer for
            # the live ones, in case the interrupt stopped the step that re-arms it.
            self._dead_ready = sum(1 for j in self._ready if j.abandoned)
            heap = self._deadlines
            self._stale = sum(1 for e in heap if not e[2]._armed)
            if heap and self._stale < len(heap) and self._deadline_timer is None:
                self._arm_deadline_timer(min(e[0] for e in heap if e[2]._armed), now)

    def _fill_gate(self, fx: _Effects) -> None:
        ready = self._ready
        while ready and self.slots is not None and self._admitted < self.slots:
            job = heapq.heappop(ready)
            if not job.abandoned:
                self._admit(job, fx)
            elif self._dead_ready:
                self._dead_ready -= 1

    # -- ending tickets -------------------------------------------------------------------

    def _end(self, t: Ticket, state: str, reason: str | None, fx: _Effects,
             value: Any = None, error: BaseException | None = None) -> bool:
        """The ONE place a ticket ends (lock held). False if it had ended already.

        Interrupt-safe (see "Interrupts"): the one lookup first (and, for ``failed``, the
        inert :class:`_Unretrieved` it arms), then plain stores, then ``fx.ended.append``
        (a builtin: once it returned the end will be told); the deadline heap's entry is
        marked stale last (left unmarked, it is dropped when due)."""
        if t.state in TERMINAL:
            return False
        mine = False
        returned: dict[int, float] | None = None
        until = 0.0
        unseen: _Unretrieved | None = None
        if state == FAILED and error is not None:
            # Inert until the commit arms it (a plain store of its exc): dropped by an
            # interrupt before that, it logs nothing.
            unseen = _Unretrieved()
            unseen.key = t.key
            unseen.tid = t.id
            unseen.pid = os.getpid()
        if not t._started and t._scope is not None:
            # A turn that never ran is forgotten, so a genuine retry runs.
            seen = self._dedupe.get(t._scope)
            mine = seen is not None and seen[0] is t
            if self.window is not None:
                # Its claim (its own value: no other ticket runs under it) is returned,
                # also when the table no longer has it (dedupe_max): a retry's claim may
                # replace it in Redis, the give-back being on its way. Recorded in the
                # commit.
                returned, until = self.window.returning(t._scope)
        # The commit has no branch: on Python 3.10 a conditional jump that is taken checks
        # for a pending signal too (see "Interrupts"). What it leaves out is chosen here:
        # a delete or a store it skips goes to the spare dict instead.
        running = t.state == RUNNING
        spare = self._spare
        spare.clear()  # (what an interrupted commit left there)
        spare[t.id] = spare[t._scope] = None
        live = self._live if t.id in self._live else spare
        table = self._dedupe if mine else spare
        forget = False
        if returned is None:
            returned = spare
        else:
            # (A claim in flight is given back when it answers: _claimed; a claim that
            # failed, by the window's give_back_later, which keeps the record until its
            # last attempt, as the claim may still land.)
            forget = t._claim is not CLAIMING and not isinstance(t._claim, BaseException)
        # (the inert stand-in of a ticket with no log to arm: it stays inert)
        armed, arming = (_INERT, None) if unseen is None else (unseen, error)
        # -- commit: plain stores, then one builtin --
        self._c["running"] -= running
        t.state = state
        t.reason = reason
        t._value = value
        t._error = error
        armed.exc = arming
        t._unseen = unseen
        t._job = None
        self._c[state] += 1
        self._c["submitted"] -= state == DEDUPED  # a duplicate is counted in deduped only
        del live[t.id]
        del table[t._scope]  # type: ignore[arg-type]
        returned[t._number] = until
        t._forget = forget
        fx.ended.append(t)
        self._disarm(t)
        return True

    def _drop_line(self, k: _Key, state: str, reason: str, fx: _Effects) -> int:
        n = 0
        while k.line:
            t = k.line.popleft()
            self._end(t, state, reason, fx)
            if state == DROPPED:
                fx.dropped.append(t)
            n += 1
        return n

    def _drop_arrivals(self, k: _Key, state: str, reason: str, fx: _Effects) -> int:
        """End the key's arrivals (not placed yet) as ``state`` (lock held)."""
        n = len(k.arrivals)
        while k.arrivals:
            self._end(k.arrivals.popleft(), state, reason, fx)
        return n

    def _stop_job(self, k: _Key, job: Job, before: str, running: str, reason: str,
                  fx: _Effects) -> int:
        """End the key's current job: its tickets end as ``before`` if it has not started
        (the job is abandoned), else the job is asked to end as ``running`` (it ends when
        its runner returns). Steered tickets not taken end as ``before``. Returns how
        many tickets that had not started were ended (lock held)."""
        n = self._drop_steered(job, before, reason, fx)
        if job.phase == STARTED:
            self._ask_end(job, running, reason, fx)
            return n
        for t in job.tickets:
            self._end(t, before, reason, fx)
            if before == DROPPED:
                fx.dropped.append(t)
            n += 1
        self._abandon(k, job, fx)
        return n

    def _ask_end(self, job: Job, state: str, reason: str, fx: _Effects) -> None:
        """Ask the running ``job`` to end as ``state`` (first ask wins): its turn is told
        (cancel event; the face interrupts it) and its tickets end so when its runner
        returns (lock held)."""
        if job.end_req is None:
            job.end_req = (state, reason)
            fx.interrupt.append(job)  # (first: see _after)
            job.turn._signal()

    def _drop_steered(self, job: Job, state: str, reason: str, fx: _Effects) -> int:
        """End the tickets steered into ``job`` and not taken as ``state``; returns how
        many (lock held)."""
        steered, job.steered = job.steered, []
        for t in steered:
            self._end(t, state, reason, fx)
            if state == DROPPED:
                fx.dropped.append(t)
        return len(steered)

    def _abandon(self, k: _Key, job: Job, fx: _Effects) -> None:
        """A job left without tickets before it started: it never calls ``fn``. A READY
        job is skipped when the heap reaches it; an ADMITTING job's runner is interrupted
        (asyncio) or finds it abandoned once it holds the lanes (threads)."""
        job.abandoned = True
        if job.phase == ADMITTING:
            fx.interrupt.append(job)  # (first: see _after)
        elif job.phase == READY:  # left in the gate's heap: dropped once most of it
            self._dead_ready += 1
            ready = self._ready
            if self._dead_ready > 64 and self._dead_ready * 2 > len(ready):
                live = [j for j in ready if not j.abandoned]
                heapq.heapify(live)
                # -- commit: one builtin (in place: _fill_gate may hold the list), then
                # the count (stopped between them, it counts more than are left: the
                # next rebuild comes early, which is harmless) --
                ready[:] = live
                self._dead_ready = 0
        job.turn._signal()
        if k.job is job:
            k.job = None
            for t in reversed(job.steered):
                t._job = None
                k.line.appendleft(t)
            job.steered = []
        # The caller forms the key's next job (``_advance``) once it is done with the key.

    def _detach(self, t: Ticket, fx: _Effects) -> None:
        """Take a ticket that has not started out of its line or job (lock held)."""
        k = self._keys.get(t.key)
        if k is None:
            return
        job = t._job
        if job is None and t in k.arrivals:
            k.arrivals.remove(t)
            self._settle(t.key, fx)  # the arrivals after it may be placed now
            return
        if job is None:
            try:
                k.line.remove(t)
            except ValueError:
                return
            self._advance(t.key, k, self.face._now(), fx)  # a debounce may be due now
            return
        if t in job.steered:
            job.steered.remove(t)
            return
        if t in job.tickets and job.phase != STARTED:
            # (The call's arguments are made at the start from the tickets left then.)
            job.tickets.remove(t)
            if not job.tickets:
                self._abandon(k, job, fx)
                self._advance(t.key, k, self.face._now(), fx)
            elif job.phase == READY:
                rank = job.rank
                self._rank(job)  # the job's priority is that of the tickets left
                if job.rank != rank:
                    heapq.heapify(self._ready)

    def lease_lost(self, job: Job) -> None:
        """A lease the running ``job`` holds on a Redis lane was lost (called by the face
        from the hold's loss listener; repeatable): the turn is told at once, as by an
        interrupt (its cancel event set; on asyncio its task cancelled), since the key
        may be another replica's now; its tickets end ``failed`` with a
        LeaseLostError, reason ``"lease lost"``, when its runner returns."""
        self._step(self._lease_lost_locked, job)

    def _lease_lost_locked(self, fx: _Effects, job: Job) -> None:
        """The locked step of :meth:`lease_lost` (see :meth:`_step`)."""
        if job.phase == STARTED:
            self._ask_end(job, FAILED, "lease lost", fx)

    def _run_timeout(self, job: Job, due: float) -> None:
        self._step(self._run_timeout_locked, job, due)

    def _run_timeout_locked(self, fx: _Effects, job: Job, due: float) -> None:
        """The locked step of :meth:`_run_timeout` (see :meth:`_step`)."""
        if due != job.run_due:
            return  # a timer replaced by an earlier one (cancelled too late)
        job.run_timer = None
        if job.phase == STARTED:
            self._ask_end(job, TIMED_OUT, "run timeout", fx)

    def _take_inbox(self, job: Job) -> list[Any]:
        return self._step(self._take_inbox_locked, job)

    def _take_inbox_locked(self, fx: _Effects, job: Job) -> list[Any]:
        """The locked step of :meth:`_take_inbox` (see :meth:`_step`)."""
        if job.phase != STARTED or job.end_req is not None:
            return []
        taken, job.steered = job.steered, []
        job.taken.extend(taken)  # (first: finish ends what it took)
        for t in taken:
            t.state = RUNNING
            t._started = True
            self._c["running"] += 1
            self._c["steered"] += 1
            self._disarm(t)
        self._bound_run(job, taken, self.face._now(), fx)
        return [t.payload for t in taken]

    # -- control --------------------------------------------------------------------------

    def cancel(self, t: Ticket) -> bool:
        """End ``t`` as cancelled: at once if it has not started; if it runs, ask its job
        to end (when every ticket of the call asked, the call is interrupted; the ticket
        ends when ``fn`` returns). False if it had ended already."""
        return self._step(self._cancel_locked, t, cancelled=t)

    def _cancel_locked(self, fx: _Effects, t: Ticket) -> bool:
        """The locked step of :meth:`cancel` (see :meth:`_step`)."""
        if t.state in TERMINAL:
            return False
        if t.state == PENDING:
            self._detach(t, fx)
            self._end(t, CANCELLED, "cancelled", fx)
            self._tidy(t.key, self._keys.get(t.key))
        else:
            job = t._job
            t._end_req = (CANCELLED, "cancelled")
            if job is not None and job.end_req is None and all(
                    x._end_req is not None for x in job.tickets + job.taken):
                job.end_req = (CANCELLED, "cancelled")
                fx.interrupt.append(job)  # (first: see _after)
                job.turn._signal()
        return True

    def clear(self, key: str) -> int:
        """End every turn of ``key`` that has not started as cancelled ("cleared");
        the running turn goes on. Returns how many ended."""
        key = check_key(key)
        return self._step(self._clear_locked, key)

    def _clear_locked(self, fx: _Effects, key: str) -> int:
        """The locked step of :meth:`clear` (see :meth:`_step`)."""
        k = self._keys.get(key)
        if k is None:
            return 0
        n = self._drop_line(k, CANCELLED, "cleared", fx)
        n += self._drop_arrivals(k, CANCELLED, "cleared", fx)
        if k.job is not None:
            job = k.job
            n += self._drop_steered(job, CANCELLED, "cleared", fx)
            if job.phase != STARTED:
                n += self._stop_job(k, job, CANCELLED, CANCELLED, "cleared", fx)
        self._advance(key, k, self.face._now(), fx)
        return n

    def pending(self, key: str) -> int:
        """Turns of ``key`` not started yet (in line, steered and not taken, or waiting
        for the lanes); the running turn is not counted."""
        key = check_key(key)
        with self._lock:
            k = self._keys.get(key)
            if k is None:
                return 0
            n = len(k.line) + len(k.arrivals)
            if k.job is not None:
                n += len(k.job.steered)
                if k.job.phase != STARTED:
                    n += len(k.job.tickets)
            return n

    def drain(self) -> None:
        with self._lock:
            self.draining = True

    def close(self, cancel_pending: bool, reason: str = "closed",
              at_once: bool = False) -> None:
        """Refuse new turns; with ``cancel_pending`` end every turn not started as
        cancelled (``reason``) and ask the running ones to end likewise. ``at_once``
        (the event loop shuts down, so a running turn may never report): the running
        turns' tickets end now too, and their runners' reports change nothing."""
        self._step(self._close_locked, cancel_pending, reason, at_once)

    def _close_locked(self, fx: _Effects, cancel_pending: bool, reason: str,
                      at_once: bool) -> None:
        """The locked step of :meth:`close` (see :meth:`_step`)."""
        self.draining = True
        self.closed = True
        if cancel_pending:
            for key, k in list(self._keys.items()):
                self._drop_line(k, CANCELLED, reason, fx)
                self._drop_arrivals(k, CANCELLED, reason, fx)
                job = k.job
                if job is not None:
                    self._stop_job(k, job, CANCELLED, CANCELLED, reason, fx)
                    if at_once and job.phase == STARTED:
                        for t in job.tickets + job.taken:
                            self._end(t, CANCELLED, reason, fx)
                self._advance(key, k, self.face._now(), fx)

    def is_idle(self) -> bool:
        """No key has work, and every runner launched has returned."""
        with self._lock:
            return not self._keys and self._runners == 0

    # -- dedupe ---------------------------------------------------------------------------

    def _remember(self, dedupe_id: str, t: Ticket, now: float, fx: _Effects) -> None:
        table = self._dedupe
        table[dedupe_id] = (t, now + self.dedupe_ttl_s)
        while len(table) > self.dedupe_max:
            table.popitem(last=False)
        if self._dedupe_timer is None and table and self.dedupe_ttl_s != math.inf:
            self._arm_sweep(now)

    def _arm_sweep(self, now: float) -> None:
        due = next(iter(self._dedupe.values()))[1]
        # Through a weak reference: the sweep is the one timer that outlives the work, so
        # a dispatcher dropped without close() must not be kept alive by it (for up to
        # dedupe_ttl_s) with its threads.
        me = weakref.ref(self)
        self._dedupe_due = due
        self._dedupe_timer = self.face._call_later(max(0.0, due - now),
                                                   lambda: _sweep_if_alive(me, due))

    def _expire_dedupe(self, now: float) -> None:
        # The table is in insertion order and every entry lives dedupe_ttl_s: the front
        # is always the first to expire, so expiry pops from the front (O(1) amortised).
        table = self._dedupe
        while table:
            _, (_, expires) = next(iter(table.items()))
            if expires > now:
                break
            table.popitem(last=False)

    def _sweep(self, due: float) -> None:
        """The dedupe sweep timer set for ``due`` fired. A repeated call (see "Timers
        and memory") leaves a timer set since alone."""
        with self._lock:
            now = self.face._now()
            if due == self._dedupe_due:
                self._dedupe_timer = None
            self._expire_dedupe(now)
            if self._dedupe and self._dedupe_timer is None:
                self._arm_sweep(now)
            elif len(self._dedupe) == 0:
                self._dedupe = OrderedDict()  # drop the table a burst grew

    def dedupe_size(self) -> int:
        with self._lock:
            return len(self._dedupe)

    # -- views ----------------------------------------------------------------------------

    def stats(self) -> DispatchStats:
        with self._lock:
            c = self._c
            pending = c["submitted"] - sum(c[s] for s in TERMINAL[:-1]) - c["running"]
            return DispatchStats(pending=pending, **c)

    def snapshot(self, lanes_draining: bool = False) -> dict[str, Any]:
        """Per key: whether a turn runs and for how long, pending count, oldest wait,
        and what blocks it; plus the gate and the dispatcher's own state.
        ``lanes_draining``: a lane every turn takes is draining (see "Priority,
        precisely" and the README for ``blocked_by``)."""
        with self._lock:
            now = self.face._now()
            keys: dict[str, Any] = {}
            for key, k in self._keys.items():
                job = k.job
                waiting = list(k.line) + list(k.arrivals)
                if job is not None:
                    waiting += job.steered
                    if job.phase != STARTED:
                        waiting += job.tickets
                blocked: str | None = None
                if lanes_draining and waiting and (job is None or job.phase != ADMITTING):
                    # Not inside acquire_all yet: the lanes will refuse it when it gets
                    # there. (A job already inside may be in a draining lane's line,
                    # which still serves it: that stays "lanes".)
                    blocked = "draining"
                elif job is not None and job.phase == STARTED:
                    blocked = "key" if waiting else None
                elif job is not None:
                    blocked = self.gate_lane if job.phase == READY else "lanes"
                elif k.line:
                    blocked = "debounce"
                elif k.arrivals:
                    blocked = "dedupe"
                keys[key] = {
                    "running": job is not None and job.phase == STARTED,
                    "running_s": now - job.started_at if job and job.phase == STARTED
                    else None,
                    "pending": len(waiting),
                    "oldest_wait_s": max((now - t.submitted_at for t in waiting),
                                         default=0.0),
                    "blocked_by": blocked,
                }
            return {
                "keys": keys,
                "draining": self.draining,
                "closed": self.closed,
                "admitted": self._admitted,
                "slots": self.slots,
                "ready": sum(1 for j in self._ready if not j.abandoned),
                "dedupe_entries": len(self._dedupe),
            }

    # -- plumbing -------------------------------------------------------------------------

    def _tidy(self, key: str, k: _Key | None) -> None:
        # A key with no job, no line and no timer is forgotten: memory follows the work.
        if k is not None and k.job is None and not k.line and not k.arrivals:
            if k.timer is not None:
                k.timer.cancel()
                k.timer = None
            keys = self._keys
            if keys.get(key) is k:
                del keys[key]
                if not keys and self._keys_high > 64:
                    # Dicts never shrink: drop the table a burst of keys grew.
                    self._keys = {}
                    self._keys_high = 0
                    if not self._live:
                        self._live = {}

    def _step(self, body: Callable[[_Effects, Unpack[_Args]], _R], *args: Unpack[_Args],
              cancelled: Ticket | None = None, job: Job | None = None) -> _R:
        """Run ``body(fx, *args)`` as one locked step and return what it returns: the
        ONE interrupt-safe frame of every operation that changes state in one locked
        block (see "Interrupts"; ``submit`` keeps its own, as it takes the lock more than
        once, waits and calls the shared window in between). ``body`` runs under the
        lock and only collects effects in ``fx``; if anything is raised from ``body``'s
        entry to the lock's release (``body`` raises, or is interrupted anywhere),
        :meth:`_repair` (given ``cancelled`` and ``job``) makes the state whole; the
        effects run once the lock is released, and once more if ``_after`` was
        interrupted at its entry (``fx.open`` still True).

        Why it is as safe as the same block written out in each operation: every point
        where an interrupt may land falls on the same side of the same handlers.

        - Before the ``try`` (this method's entry, ``_Effects()``): nothing changed yet,
          the operation raises having done nothing, as one interrupted at its
          ``_Effects()`` did.
        - ``with self._lock`` enters through a C-level ``__enter__`` (no check), and the
          next point, ``body``'s entry (its ``RESUME``), is already inside the ``with``
          and the ``try``: an interrupt there releases the lock and runs ``_repair``,
          as at the first statement of a block written in place. So do the checks after
          ``body`` returns and after the lock's ``__exit__`` is called.
        - The handler and the ``finally`` are this frame's own code, not a function
          that could be interrupted at its entry: a context manager written in Python
          (a class, or ``@contextmanager``) would not do, since an interrupt at the
          entry of its ``__exit__`` (or of the generator's resumption) skips both the
          repair and the effects.

        It costs one more Python call per operation (``body``)."""
        fx = _Effects()
        try:
            with self._lock:
                return body(fx, *args)
        except BaseException:
            self._repair(fx, cancelled, job)
            raise
        finally:
            try:
                self._after(fx)
            finally:
                if fx.open:  # interrupted at its entry: see "Interrupts"
                    self._after(fx)

    def _after(self, fx: _Effects) -> None:
        """Run an operation's effects, lock released. Each effect is marked done only
        once it returned and may run again (see "Interrupts"): a caller whose call of
        ``_after`` was interrupted calls it again while ``fx.open``, and the rest runs.
        A repeated launch is refused by :meth:`enter`; a give-back, a timer's cancel or
        a task's cancel repeated changes nothing."""
        face = self.face
        timers = fx.timers
        while timers:
            timers[-1].cancel()
            timers.pop()
        while fx.interrupt:
            job = fx.interrupt[-1]
            # The turn's signal again: the step records the interrupt before it signals
            # (a plain store, then this builtin append), so an interrupt at the entry
            # of the step's own _signal call loses neither.
            job.turn._signal()
            face._interrupt(job)
            fx.interrupt.pop()
        while fx.n_launched < len(fx.launch):
            face._launch(fx.launch[fx.n_launched])
            fx.n_launched += 1
        if fx.claims:
            offload, window = face._offload, self.window
            assert offload is not None
            while fx.n_claims < len(fx.claims):
                t = fx.claims[fx.n_claims]
                offload(functools.partial(window.claim, t._scope, t._number),
                        functools.partial(self._claimed, t))
                fx.n_claims += 1
        if fx.dropped and self.on_drop is not None:
            dropped, fx.dropped = fx.dropped, []
            _call(self.on_drop, dropped)
        while fx.n_ended < len(fx.ended):
            self._tell(fx.ended[fx.n_ended])
            fx.n_ended += 1
        with self._lock:
            idle = not self._keys and self._runners == 0
        if idle:
            face._idle()
        fx.open = False

    def _tell(self, t: Ticket) -> None:
        """Tell an ended ticket's end: give its claim back, wake its waiters, call its
        callbacks (each is dropped once it returned; see _after)."""
        if t._forget:
            assert t._scope is not None
            if self.face._offload is None:
                self.window.give_back(t._scope, t._number)
            else:
                self.face._offload(functools.partial(self.window.give_back, t._scope,
                                                    t._number), _ignore)
            t._forget = False
        with self._lock:
            event = t._event
            callbacks = t._callbacks
            if not callbacks:
                t._callbacks = None
        if event is not None:
            event.set()
        while callbacks:
            cb = callbacks[0]
            if t._unseen is not None and _takes_outcome(cb):
                t._taken()
            _call(cb, t)
            with self._lock:
                if callbacks and callbacks[0] is cb:
                    del callbacks[0]
                if not callbacks:
                    t._callbacks = None


def _ignore(_: Any) -> None:
    """The ``done`` of an offloaded call whose answer nobody needs."""


def _is_cancel(exc: Any) -> bool:
    import asyncio

    return isinstance(exc, asyncio.CancelledError)


def counting_lanes(lanes: Iterable[Any]) -> list[tuple[str, int]]:
    """(name, max_concurrent) of each counting lane among ``lanes``."""
    out = []
    for lane in lanes:
        cap = getattr(lane, "max_concurrent", None)
        if isinstance(cap, int) and not isinstance(cap, bool):
            out.append((lane.name, cap))
    return out
