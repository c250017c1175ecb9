"""The asyncio face: :class:`AsyncLane`, :class:`AsyncSessionLane`, :class:`AsyncLaneQueue`.

Same state machine as the thread face (:mod:`lanequeue._core`); only parking differs. A
task that must wait parks on a future of its event loop; the releaser that hands it the
permit sets the future's result (under the core's lock, after setting the waiter's token),
so the permit is the task's before it even resumes.

Cancellation, at every point:

- cancelled while in line (``task.cancel()``, ``asyncio.timeout()``, ``wait_for``): the
  cancelled future refuses any later grant (:meth:`_TaskWaiter.ready` returns False, the
  releaser moves on to the next waiter), and the task withdraws from the line as
  ``CancelledError`` unwinds. Nothing held, no ghost in line.
- cancelled after the permit was handed to it but before it resumed (the future already
  has its result, the task gets ``CancelledError`` anyway): ``withdraw`` reports the
  grant, and the task passes the permit on with a release before re-raising. The next
  waiter is granted within that same step.
- cancelled inside the body: ``async with`` releases on the way out.

Timeouts run on the loop's own clock, with ONE loop timer per lane (:class:`_Deadlines`)
armed for the earliest deadline of its waits: at a waiter's deadline it withdraws the
waiter and resolves its future with "no token", unless a grant got there first. No task,
``wait_for`` wrapper or timer is created per wait: a wait pushes its deadline on the
lane's heap, and a wait that ends before it leaves a dead entry there, skipped when
met and swept once dead entries outnumber the waiters.

A lane is bound to the first event loop that uses it; calls from another loop or another
thread raise RuntimeError (the lane's futures belong to one loop). Once that loop is
closed and the lane is quiet (no holder, no waiter), the next loop may take it over. In
a child made by ``os.fork()`` the lane is empty and binds the child's own loop.
"""

from __future__ import annotations

import asyncio
import heapq
import math
import os
import time
import weakref
from collections.abc import Callable, Sequence
from threading import get_ident
from types import TracebackType
from typing import Any, ClassVar, Literal, cast

from ._core import (
    MULTI_ENTERED,
    MULTI_LEAVING,
    Core,
    CountingCore,
    CountingHoldSteps,
    MultiHoldSteps,
    SessionHoldSteps,
    Waiter,
    ended_error,
    entered_twice,
    record,
    recorded,
)
from ._errors import LaneTimeoutError, told
from ._kinds import (
    DEFAULT_GLOBAL_CONCURRENCY,
    LANE_DEFAULT,
    CountingKind,
    Hold,
    SessionKind,
    _DropWatch,
)
from ._ops import (
    CANCEL_WAIT_S,
    LoopTimer,
    log,
    note_cancel_wait,
    noted_cancel_wait,
    poll_idle_async,
)
from ._validate import check_bool, check_key, check_timeout, function_copy, shown_as_public
from .contract import SyncLane, TaskHold, TaskLane, must_await
from .queue import MultiHold, QueueBase, Step, _MultiDropWatch, _send, end_last

__all__ = [
    "AsyncHold",
    "AsyncLane",
    "AsyncLaneQueue",
    "AsyncSessionLane",
    "build_default_async_lanes",
]


_ZERO = 0  # ``priority is _ZERO``: the default, checked by identity on the hot path
_new_hold = object.__new__  # an instance without its __init__ frame (hot paths)


class _TaskWaiter(Waiter):
    """A task in line: parks on a future of the lane's loop."""

    __slots__ = ("fut",)

    fut: asyncio.Future[None]

    def __init__(self, fut: asyncio.Future[None]) -> None:
        # (The face's _park makes its waiters with these same stores, without this frame,
        # and ``since`` on the lane's clock.)
        self.token = 0
        self.left = False
        self.fut = fut
        # The grant sets the token first, then resolves the future (builtins only):
        # ``wake(None)`` is ``fut.set_result(None)``.
        self.wake = fut.set_result
        self.since = fut.get_loop().time()  # parked now (see Waiter.since)

    def ready(self) -> bool:
        # A cancelled (or timed-out) waiter's future is done: refuse, so the releaser
        # hands the permit to the next waiter instead of to a task that will not use it.
        return not self.fut.done()


def _looks_busy(core: Any, key: str) -> bool:
    """True if ``key`` looks busy on ``core`` (its holder on a per-key lane, every permit
    held on a counting lane): read without the core's lock, so it may be stale. When
    it looks free, the core's ``seen_busy`` hint is cleared.

    Asked only while ``core.seen_busy`` is set (the face sets it when a take finds the
    lane busy), so an uncontended lane never pays for it. A face that sees a busy key
    goes straight to :meth:`_AsyncFace._park` (one take, with the waiter, instead of a
    take that fails and then that one); a stale answer only picks the slower of two
    correct paths, as ``_park`` grants a permit that is free by then, and a take
    without a waiter queues nobody. A draining lane never looks busy: its take refuses
    at once (LaneDrainingError), with no waiter made, so no wait is counted."""
    if core.draining:
        return False
    if core.per_key:
        entry = core._entries.get(key)
        busy = entry is not None and entry.token != 0
    else:
        busy = len(core._holds) >= core.capacity
    if not busy:
        core.seen_busy = False
    return busy


# What a deadline of the heap does when it comes: log the slow wait (then push the wait's
# real deadline), or end the wait.
_WARN, _EXPIRE = 0, 1


def _running_loop() -> asyncio.AbstractEventLoop | None:
    """The event loop running in this thread, or None."""
    try:
        return asyncio.get_running_loop()
    except RuntimeError:
        return None


class _Deadlines:
    """The deadlines of one lane's waits on one loop, behind ONE loop timer.

    ``heap`` holds ``(when, seq, waiter, key, what, timeout, ahead)`` by loop time; the
    timer is armed for the earliest ``when`` (``armed``: that time; inf when no timer).
    A wait that ends early leaves its entry: :meth:`fire` skips entries whose future is
    done, and :meth:`add` sweeps them out once the heap is more than twice the lane's
    waiters (amortised O(1)). Runs on the loop only (adds from the waiting task, fires
    from the loop), so it needs no lock.
    """

    __slots__ = ("lane", "loop", "heap", "timer", "armed", "seq")

    def __init__(self, lane: _AsyncFace, loop: asyncio.AbstractEventLoop) -> None:
        self.lane = lane
        self.loop = loop
        self.heap: list[tuple[float, int, _TaskWaiter, str, int, float, int]] = []
        self.timer: LoopTimer | None = None
        self.armed = math.inf
        self.seq = 0

    def add(self, when: float, waiter: _TaskWaiter, key: str, what: int, timeout: float,
            ahead: int, now: float) -> None:
        """Push a deadline at ``when`` (loop time); ``now`` is the loop's time read in
        this same step of the loop (see :meth:`_timer_by`)."""
        heap = self.heap
        if len(heap) > 64 and len(heap) > 2 * self.lane._core._waiting:
            live = [e for e in heap if not e[2].fut.done()]
            heapq.heapify(live)
            self.heap = heap = live
        self.seq += 1
        self._timer_by(when, now)  # first: see _timer_by
        heapq.heappush(heap, (when, self.seq, waiter, key, what, timeout, ahead))

    def _timer_by(self, when: float, now: float) -> None:
        """Make sure a timer fires at ``when`` or before (Interrupts: "a KeyboardInterrupt
        anywhere"). The rule kept: while the heap holds a live entry, some live timer
        will call :meth:`fire` no later than its time. The timer is a
        :class:`~lanequeue._ops.LoopTimer`, which an interrupt in the loop's delivery
        of it cannot lose. A new timer is made before the old one is cancelled, and
        before the entry it is for is pushed: an interrupt between two steps leaves an
        extra timer (a spare :meth:`fire` changes nothing), never none; and a wait whose
        :meth:`add` was interrupted is withdrawn by its task's handler anyway. An armed
        time already past means the timer ran, or is due and not run yet (the loop was
        busy past it), or that its call was interrupted and its spare handle is to come:
        it is re-armed then too, for the earliest deadline in the heap when that comes
        before ``when`` (the deadlines due meanwhile are served at once, never pushed
        back to a later wait's). ``now`` is the loop's time read earlier in this
        same step of the loop (a waiter's ``since``; :meth:`fire`'s reading), which
        saves a clock read per wait and is exact here: timers run between steps, so a
        timer that ran, or a :meth:`fire` that was interrupted, did so before that
        reading, and a timer that came due after it has not run yet and will."""
        if when < self.armed or self.armed <= now:
            heap = self.heap
            if heap and heap[0][0] < when:
                when = heap[0][0]
            old = self.timer
            self.timer = LoopTimer(self.loop, when, self.fire)
            self.armed = when
            if old is not None:
                old.cancel()

    def fire(self, timer: LoopTimer) -> None:
        """The timer: act on every deadline that has come, then re-arm for the next.
        An entry is acted on before it leaves the heap (a slow-wait entry is swapped for
        its expiry in one step, ``heapreplace``), and the re-arming is in a ``finally``:
        an interrupt in the middle leaves the rest of the due entries to the next
        :meth:`fire`, armed right away. A late call of a timer already replaced (the
        spare of an interrupted call, see :class:`~lanequeue._ops.LoopTimer`) serves
        what is due and leaves the current timer alone."""
        if timer is self.timer:
            self.timer = None
            self.armed = math.inf
        heap, lane = self.heap, self.lane
        now = self.loop.time()
        try:
            if lane._core._dropped:
                # A dropped hold nobody has ended (its finalizer was stopped by an
                # interrupt before it asked the loop): its permit may be a due wait's.
                lane._core._settle()
            while heap and heap[0][0] <= now:
                _, _, waiter, key, what, timeout, ahead = heap[0]
                if waiter.fut.done():  # granted, cancelled or ended meanwhile
                    heapq.heappop(heap)
                elif what == _EXPIRE:
                    lane._expire(key, waiter)  # (idempotent: a withdraw)
                    heapq.heappop(heap)
                else:
                    self.seq += 1
                    heapq.heapreplace(heap, (waiter.since + timeout, self.seq, waiter, key,
                                             _EXPIRE, timeout, ahead))
                    lane._slow_wait(key, now - waiter.since, ahead)
            while heap and heap[0][2].fut.done():
                heapq.heappop(heap)
        finally:
            if heap:
                self._timer_by(heap[0][0], now)


def _settles_on(loop: asyncio.AbstractEventLoop, ref: weakref.ref[Any]) -> Callable[[], bool]:
    """The core's ``settles_elsewhere`` for a lane bound to ``loop``: a view from any
    thread but the one running the loop (a metrics scrape's thread, or the program
    between two runs of the loop) asks the loop to end the dropped holds and returns
    True: their hand-offs wake tasks, and asyncio's futures and ``call_soon`` are the
    running loop's only (a loop that is not running may start at any moment); on the
    loop, or once it is closed (nothing runs on it any more, and a request it had
    queued is gone), False: the view ends them itself. One request waits at a time (a
    hot reader queues no flood of callbacks): the flag is cleared by the callback before
    it settles, so a drop after that is asked for again. Holds the core by a weak
    reference (the lane keeps it; no cycle)."""
    asked = [False]

    def settle() -> None:
        asked[0] = False
        core = ref()
        if core is not None:
            core._settle()

    def elsewhere() -> bool:
        if _running_loop() is loop or loop.is_closed():
            return False
        if asked[0]:
            return True
        asked[0] = True
        try:
            loop.call_soon_threadsafe(settle)
        except RuntimeError:  # closed: nothing runs on it any more
            asked[0] = False
            return False
        return True

    return elsewhere


class AsyncHold(Hold):
    """A hold on an asyncio lane; an async context manager made by ``lane.acquire(key)``.

    ``async with lane.acquire(key) as hold:`` waits for the permit (up to the timeout
    given to ``acquire``), raises :class:`LaneTimeoutError` if it does not come, and
    releases it when the block ends, also on cancellation. Single use.

    A hold garbage-collected while held (entered but never left nor released) warns
    with a ``ResourceWarning`` naming the lane and the key, and its permit returns to
    the lane, to a waiter if there is one (see "Dropped holds" in
    :mod:`lanequeue._core`).
    """

    __slots__ = ("_priority",)

    lane: _AsyncFace
    _priority: int  # the acquire's priority (checked), for the wait if one is needed

    async def __aenter__(self) -> AsyncHold:
        lane = self.lane
        fast = lane._fast_loop  # lane._bind(), without its frame: before any take
        if fast is None or fast._thread_id != get_ident():
            self._parked = None  # entered (a hold never entered warns when dropped)
            lane._bind_loop()
        core = lane._core
        # The hold's own step first (an IDLE key, a free permit: see _AsyncHold), unless
        # the lane was seen busy: then the look below sends a busy key to the line.
        if not core.seen_busy and self._step_in() is not None:
            return self
        self._parked = None  # entered (a hold never entered warns when dropped: _DropWatch)
        # (a hold of the public class: one that ended, or whose enter timed out)
        if self._token or self.__class__ is AsyncHold:
            raise RuntimeError("this hold was already entered (a hold is single use, even after "
                               "it ended or timed out); call lane.acquire(key) again")
        key, timeout = self.key, self._timeout_s
        # (a busy look goes straight to the line: see _looks_busy) A grant is stored in
        # ``self._token`` by the core's commit, or by ``_park`` before its wait's handler
        # ends: an interrupt right after it leaves the permit to this hold.
        token = 0 if core.seen_busy and timeout != 0 and _looks_busy(core, key) else (
            core.take(key, timeout != 0, None, self))
        if not token:
            if timeout != 0:
                core.seen_busy = True
                token = await lane._park(key, timeout, self._priority, self)
            if not token:
                # Nothing granted (the wait withdrew): the hold ends, single use (its
                # class then enters by this general path, which refuses it).
                self.__class__ = lane._ended_hold
                raise LaneTimeoutError(lane.name, key, timeout, type(lane).__name__)
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        # The exit runs in the task that entered, so on the lane's loop: no check.
        self._step_out(exc_type, exc, tb)

    def _step_in(self) -> Any:
        """The hold's own take: self when taken, else None (the general path in
        :meth:`__aenter__`). Here none (the public class: a hold left already); the
        holds ``acquire`` makes take their kind's (:class:`_AsyncHold`)."""
        return None

    def _step_out(self, exc_type: object, exc: object, tb: object) -> None:
        """Leave: release the hold (unless released early inside the block) through the
        core; the holds ``acquire`` makes run their kind's step (:class:`_AsyncHold`)."""
        token = self._token
        if token > 0:  # not released early inside the block
            self._token = -token
            self.lane._core.release(self.key, token)
        self.__class__ = AsyncHold  # ended: no finalizer from here on (_DropWatch)

    @must_await
    async def release(self) -> bool:  # type: ignore[override]
        """A coroutine: end this hold; True. Raises NotOwnerError when the hold is not the
        caller's (any more): never granted, released already, or ended by someone else
        (``manual_release``); RuntimeError from another event loop or thread, changing
        nothing (the block still releases it). Plain twin: :meth:`release_nowait`."""
        return Hold.release(self)

    def release_nowait(self) -> bool:
        """:meth:`release` as a plain call (from the lane's loop; RuntimeError, changing
        nothing, from another thread)."""
        return Hold.release(self)


@shown_as_public
class _AsyncHold(_DropWatch, AsyncHold):
    """What an asyncio lane's ``acquire`` makes (with its kind's steps mixed in:
    :class:`_AsyncSessionHold`, :class:`_AsyncCountingHold`): an :class:`AsyncHold` with
    the finalizer of a dropped hold, an :class:`AsyncHold` once left
    (:class:`lanequeue._kinds._DropWatch`). Entering and leaving run the core's
    commonest steps (an IDLE key or a free permit; a release with nobody in line) in the
    hold itself, with the code the thread holds run
    (:class:`lanequeue._core.SessionHoldSteps`,
    :class:`lanequeue._core.CountingHoldSteps`), and the general path
    (:meth:`AsyncHold.__aenter__`, the core's ``release``) otherwise."""

    __slots__ = ()

    _ended_class: ClassVar[type] = AsyncHold
    _enter_slow = AsyncHold._step_in  # (a step not taken: None, the general path)


@shown_as_public
class _AsyncSessionHold(SessionHoldSteps, _AsyncHold):
    """An :class:`_AsyncHold` of an :class:`AsyncSessionLane`."""

    __slots__ = ()

    # Copies (own code objects: see function_copy), as every hold class.
    __aenter__ = function_copy(AsyncHold.__aenter__)
    __aexit__ = function_copy(AsyncHold.__aexit__)
    _step_in = function_copy(SessionHoldSteps._step_in)
    _step_out = function_copy(SessionHoldSteps._step_out)


@shown_as_public
class _AsyncCountingHold(CountingHoldSteps, _AsyncHold):
    """An :class:`_AsyncHold` of an :class:`AsyncLane`."""

    __slots__ = ()

    __aenter__ = function_copy(AsyncHold.__aenter__)
    __aexit__ = function_copy(AsyncHold.__aexit__)
    _step_in = function_copy(CountingHoldSteps._step_in)
    _step_out = function_copy(CountingHoldSteps._step_out)


class _AsyncFace:
    """Acquire/release for tasks of one event loop, over either core."""

    face: Literal["asyncio"] = "asyncio"
    _core: Any  # CountingCore or SessionCore (the kind's): same take/release/withdraw
    _hold_class: ClassVar[type[AsyncHold]]  # what acquire() makes, as cls() (_DropWatch)
    _new_hold: type[AsyncHold]  # the same, read from the instance (see LaneKind.__init__)
    _ended_hold: type[AsyncHold]  # what its holds become once ended (LaneKind.__init__)
    name: str
    timeout_s: float | None
    warn_after_s: float | None
    _slow_wait: Any
    _idle: Any
    _start_drain: Any
    _rank: Any
    _loop: asyncio.AbstractEventLoop | None = None
    _loop_pid = 0  # the process that bound _loop (a forked child may bind its own)
    _deadlines: _Deadlines | None = None  # the deadlines of the waits, on the bound loop
    _fast_loop: Any = None  # the bound loop, when it records its thread (see _bind)
    _loop_clock: Any = None  # the bound loop's ``time`` (see _bind_loop)

    def _bind(self) -> None:
        """Check that the caller runs on the lane's event loop (binding it on first use).

        The hot path compares the running thread with the thread the bound loop records
        while it runs (``BaseEventLoop._thread_id``, None once it stops): equal only on
        the loop's own thread while it runs, and a thread runs one loop at a time. This
        avoids ``asyncio.get_running_loop()``, which costs a system call on Python 3.11.
        Loops without that attribute take the full check every time.
        """
        loop = self._fast_loop
        if loop is None or loop._thread_id != get_ident():
            self._bind_loop()

    def _dropped_hold(self) -> None:
        """A hold of this lane was dropped while held (see ``_kinds._DropWatch``): end it on the
        lane's loop, soon (a task waiter is woken on its loop only; the finalizer may
        run in any thread), unless no loop is bound or it is closed (then the next
        operation ends it)."""
        loop = self._loop
        if loop is not None and not loop.is_closed():
            try:
                loop.call_soon_threadsafe(self._core._settle)
            except RuntimeError:  # closed meanwhile
                pass

    def _loop_refusal(self) -> RuntimeError | None:
        """The RuntimeError :meth:`_bind_loop` would raise now, or None when the caller
        runs on the lane's loop or on one it may bind (first use; its old loop closed
        while the lane is quiet; a forked child). Changes nothing: an operation over
        several lanes asks each one before it binds any (a refusal changes nothing)."""
        loop = self._fast_loop
        if loop is not None and loop._thread_id == get_ident():
            return None
        return self._refusal_on(_running_loop())

    _waker_refusal = _loop_refusal

    def _refusal_on(self, running: asyncio.AbstractEventLoop | None) -> RuntimeError | None:
        """:meth:`_loop_refusal` for the loop running now (None: no loop runs)."""
        if running is None:
            return RuntimeError(
                f"{type(self).__name__} {self.name!r} must be used from its event loop "
                "(no event loop is running in this thread)")
        if running is self._loop:
            return None
        old = self._loop
        # A loop of the parent process is not this process's: after os.fork() the lane
        # is empty (see "fork" in lanequeue._core) and the child binds its own loop.
        if old is not None and self._loop_pid == os.getpid() and not (
            old.is_closed() and self._core.holders() == 0 and self._core.waiting == 0
        ):
            return RuntimeError(
                f"{type(self).__name__} {self.name!r} is bound to another event loop; "
                "a lane serves the tasks of one loop (use one lane per loop, or a Redis "
                "lane across loops and processes)")
        return None

    def _bind_loop(self) -> asyncio.AbstractEventLoop:
        """The running loop, after checking it is this lane's (binding it on first use)."""
        loop = _running_loop()
        refusal = self._refusal_on(loop)
        if refusal is not None:
            raise refusal
        assert loop is not None  # (no loop is a refusal)
        if loop is not self._loop:
            self._loop = loop
            self._loop_pid = os.getpid()
            self._fast_loop = loop if hasattr(loop, "_thread_id") else None
            # The loop's clock without a Python frame when it is the stock one (the
            # loop's own ``time``, as the timers use, when a loop class or the loop
            # object itself replaces it: a virtual clock set on the instance).
            stock = getattr(loop.time, "__func__", None) is asyncio.BaseEventLoop.time
            self._loop_clock = clock = time.monotonic if stock else loop.time
            # The waits' ``since`` on the core's own clock: its hand-offs observe the
            # waits they end (see _park). Set while the lane is quiet (_refusal_on).
            self._core.waits_at_grant = clock is self._core._clock
            self._core.settles_elsewhere = _settles_on(loop, weakref.ref(self._core))
        return loop

    async def _take(self, key: str, timeout: float | None, priority: int = 0) -> int:
        """Wait up to ``timeout`` seconds (None: no limit, 0: no wait) for a permit.
        Returns the grant's token, or 0 if none came. Key and priority already checked."""
        self._bind()
        core: Core = self._core
        got = core.take(key, timeout != 0)
        if got or timeout == 0:
            return got
        return await self._park(key, timeout, priority)

    async def _park(self, key: str, timeout: float | None, priority: int = 0,
                    into: Any = None) -> int:
        """The slow half of :meth:`_take`, after ``core.take`` found the lane busy (or
        :func:`_looks_busy` did): join the line with a new waiter (with ``priority``:
        checked, and 0 on a per-key lane) and wait up to ``timeout`` seconds (None: no
        limit). Returns the grant's token (at once if the permit is free by now), or 0
        if none came (counted as a timeout). A grant is recorded in ``into`` (a hold, or
        an ``acquire_all``'s MultiHold) before this method's handler ends, as the thread
        face's ``_park`` does.

        The wait is observed (``lanequeue_wait_seconds``, loop clock) when it ends: by
        the hand-off that grants it when the loop's clock is the core's (the stock loop
        and lane clocks: ``waits_at_grant``, see :meth:`_bind_loop`), else here. A
        wait with a timeout pushes one deadline on the lane's :class:`_Deadlines` (no
        timer of its own): ``warn_after_s`` first when it is shorter, where the slow wait
        is logged and the real deadline pushed; a wait without a timeout is logged when
        it ends, if it lasted ``warn_after_s`` or more. The warning gives the waiters that were
        ahead when it joined. Raises LaneClearedError / LaneDrainingError when ``clear``
        or a drain ended the wait.
        """
        core: Core = self._core
        # The caller checked the loop (``_bind``): ``_loop`` is the running loop.
        loop: Any = self._loop
        clock = self._loop_clock
        fut = loop.create_future()
        # The waiter, as ``_TaskWaiter(fut)`` does, without its frames (once per wait).
        waiter: _TaskWaiter = _new_hold(_TaskWaiter)
        waiter.token = 0
        waiter.left = False
        waiter.fut = fut
        waiter.wake = fut.set_result
        waiter.since = start = clock()
        ahead = -1
        behind: float | None = None  # since when the hold ahead at the join exists
        observed = False
        n = 0 if into is None or not into._is_multi else len(into._taken)
        try:
            # The waiter exists before the take that may put it in line, and this try
            # covers that call: whatever instant an interrupt or a cancellation lands
            # at, the handler below finds the waiter (and its token, if granted).
            # ``into`` has it too (see the thread face's ``_park``).
            if into is not None:
                into._parked = (waiter, n)
            if priority:
                counting: CountingCore = self._core
                token = counting.take(key, True, waiter, None, None, priority)
            else:
                token = core.take(key, True, waiter)
            if token:  # free by now: granted at once (not a wait)
                return record(into, token)
            if timeout is not None or self.warn_after_s is not None:
                ahead, behind = self._arm(key, waiter, start, timeout)
            await fut
            # Granted, ended by clear/drain (a negative outcome), or resumed by the timer
            # (then withdrawn already, and this is 0).
            token = waiter.token or core.withdraw(key, waiter, timed_out=True)
            if token <= 0 or not self._core.waits_at_grant:  # else the hand-off did
                self._core.observe_wait(clock() - start, token > 0)
            observed = True
            if ahead >= 0 and timeout is None:
                was_ahead, ahead = ahead, -1  # (logged here or not: not by the handler)
                self._ended_wait(key, clock() - start, was_ahead, token > 0, behind)
            if token < 0:
                raise ended_error(self.name, key, token)
            return record(into, token)
        except BaseException as exc:
            # Cancelled in line, or after the grant but before resuming: withdraw tells
            # which; a permit already ours is passed on at once. First, refuse grants
            # (``ready()`` is False once the future is done; a future already done, the
            # usual case, is left as it is): if an interrupt (KeyboardInterrupt) stops
            # the withdraw below, the next releaser drops this waiter instead of handing
            # it the permit. The call's own check comes after it is done.
            fut.cancel()
            kept = recorded(into, n)  # the grant is its owner's (in no line any more)
            if not kept:
                token = core.withdraw(key, waiter, timed_out=False)
                if token > 0:
                    core.release(key, token)
                # (A grant's wait was observed by its hand-off, with ``waits_at_grant``;
                # a grant at once, in the take above, is no wait.)
                if not observed and (token <= 0 or not self._core.waits_at_grant):
                    self._core.observe_wait(clock() - start, False)
            if ahead >= 0 and timeout is None:  # (cancelled or interrupted: as above)
                try:
                    self._ended_wait(key, clock() - start, ahead, kept, None,
                                     type(exc).__name__)
                except Exception:  # (a broken log handler must not replace ``exc``)
                    pass
            raise

    def _ended_wait(self, key: str, waited: float, ahead: int, granted: bool,
                    behind: float | None, ending: str | None = None) -> None:
        """For :meth:`_park`: a wait without a timeout has no deadline that logs it while
        it waits, so it is logged as it ends (granted, ended by clear or drain, or by the
        exception named ``ending``), if it lasted ``warn_after_s``. Granted with nobody
        ahead, the log gives how long the hold it waited behind (held since ``behind``,
        core clock) had lasted when it was handed over, maybe to this waiter."""
        warn = self.warn_after_s
        if warn is not None and waited >= warn:
            self._slow_wait(key, waited, ahead, ended=True, granted=granted, ending=ending,
                            behind_s=(self._core._clock() - behind
                                      if ahead == 0 and behind is not None and granted
                                      and ending is None else None))

    def _arm(self, key: str, waiter: _TaskWaiter, start: float, timeout: float | None
             ) -> tuple[int, float | None]:
        """For :meth:`_park`, a waiter just in line with a timeout or a slow-wait warning
        (or both): push its first deadline (``warn_after_s`` when it comes first, else
        the timeout) on the lane's :class:`_Deadlines`. Returns the waiters ahead of it
        when a slow wait may be logged, else -1, and since when the hold it waits behind
        exists (core clock; None: not asked, or none)."""
        warn = self.warn_after_s
        ahead = -1
        behind = None
        first = timeout
        what = _EXPIRE
        if warn is not None and (timeout is None or timeout > warn):
            ahead, behind = waiter.ahead, waiter.behind  # (stored as it joined)
            first = warn
            what = _WARN
        if timeout is not None and first is not None:
            loop = self._loop
            dl = self._deadlines  # _deadlines_of(loop), without its frame
            if dl is None or dl.loop is not loop:
                dl = self._deadlines_of(cast(asyncio.AbstractEventLoop, loop))
            dl.add(start + first, waiter, key, what, timeout, ahead, start)
        return ahead, behind

    def _deadlines_of(self, loop: asyncio.AbstractEventLoop) -> _Deadlines:
        """The lane's deadlines on ``loop`` (new after the lane moved to another loop)."""
        dl = self._deadlines
        if dl is None or dl.loop is not loop:
            dl = self._deadlines = _Deadlines(self, loop)
        return dl

    def _expire(self, key: str, waiter: _TaskWaiter) -> None:
        """At a waiter's deadline (from the loop's timer, so no grant can race it).
        The future first: the task resumes even if the withdraw is interrupted (the task
        then withdraws itself)."""
        if not waiter.fut.done():
            waiter.fut.set_result(None)  # resumes the task with token 0: timed out
            self._core.withdraw(key, waiter, timed_out=True)

    def _release(self, key: str, token: int) -> bool:
        """End the hold ``token`` of ``key`` (0: the key's hold), from the lane's loop."""
        self._bind()
        ok: bool = self._core.release(key, token)
        return ok

    def acquire(
        self, key: str, *, timeout_s: Any = LANE_DEFAULT, priority: int = 0
    ) -> AsyncHold:
        """An async context manager that holds a permit of this lane for ``key``.

        Args:
            key: non-empty ``str``; on a session lane, the unit of mutual exclusion.
            timeout_s: seconds to wait (loop clock); default the lane's ``timeout_s``;
                ``None`` waits without limit; ``0`` does not wait.
            priority: (AsyncLane only) as :meth:`lanequeue.Lane.acquire`: a waiter with
                a larger priority is served first, gaining one level per ``ageing_s``
                seconds of waiting (the lane's ``clock``); an AsyncSessionLane refuses
                any priority but 0 (ValueError).

        Returns:
            an :class:`AsyncHold`; ``async with`` waits and yields it, leaving releases.

        Raises:
            TypeError/ValueError: at the call, for a bad key, timeout or priority.
            LaneTimeoutError: on entering, when no permit came in time.
            RuntimeError: on entering, from a loop other than the lane's.
            asyncio.CancelledError: when the task is cancelled while waiting (it then
                holds nothing).

        Example:

            >>> import asyncio
            >>> lane = AsyncLane("global", max_concurrent=2)
            >>> async def reply():
            ...     async with lane.acquire("gateway:web:42"):
            ...         return lane.active_count
            >>> asyncio.run(reply())
            1
        """
        if key.__class__ is not str or not key:
            key = check_key(key)
        # (a made class: object.__init__, no frame; see _DropWatch): the hot path
        # The arguments checked before the hold is made: a hold made and dropped unused
        # warns (see _DropWatch), and this one was never the caller's.
        timeout = self.timeout_s if timeout_s is LANE_DEFAULT else check_timeout(timeout_s)
        rank = priority if priority is _ZERO else self._rank(priority)
        new = self._new_hold
        hold = new()  # type: ignore[call-arg]
        hold.lane = self
        hold.key = key
        hold._token = 0
        hold._timeout_s = timeout
        hold._priority = rank
        return hold

    @must_await
    async def acquire_timeout(
        self, key: str, timeout_s: Any = LANE_DEFAULT, *, priority: int = 0
    ) -> bool:
        """A coroutine: wait up to ``timeout_s`` seconds for a permit (omitted: the lane's
        ``timeout_s``; None: no limit; 0: no wait). ``priority``: as :meth:`acquire`.

        Returns True if taken (release it with :meth:`manual_release`), False on timeout.
        Raises TypeError / ValueError for a bad key, timeout or priority, RuntimeError
        from a foreign loop, CancelledError if cancelled (holding nothing).
        """
        if key.__class__ is not str or not key:
            key = check_key(key)
        timeout = self.timeout_s if timeout_s is LANE_DEFAULT else check_timeout(timeout_s)
        if priority is not _ZERO:
            priority = self._rank(priority)
        return await self._take(key, timeout, priority) != 0

    @must_await
    async def try_acquire(self, key: str) -> bool:
        """A coroutine: take a permit for ``key`` if one is free now; never waits.

        Returns True if taken (release with :meth:`manual_release`), False otherwise (a
        refusal counts in ``stats.rejected``). Raises TypeError/ValueError for a bad key,
        RuntimeError outside the lane's loop, LaneDrainingError once the lane drains.
        Plain twin: :meth:`try_acquire_nowait`.
        """
        return self.try_acquire_nowait(key)

    def try_acquire_nowait(self, key: str) -> bool:
        """:meth:`try_acquire` as a plain call (from the lane's loop)."""
        if key.__class__ is not str or not key:
            key = check_key(key)
        self._bind()
        token: int = self._core.take(key, False)
        return token != 0

    @must_await
    async def manual_release(self, key: str) -> bool:
        """A coroutine: release a permit taken with try_acquire / acquire_timeout.

        Same contract as the thread face: False, a logged warning and no change when
        ``key`` holds nothing. Raises RuntimeError outside the lane's loop. Plain twin:
        :meth:`manual_release_nowait` (from other threads:
        ``loop.call_soon_threadsafe(lane.manual_release_nowait, key)``).
        """
        return self.manual_release_nowait(key)

    def manual_release_nowait(self, key: str) -> bool:
        """:meth:`manual_release` as a plain call (from the lane's loop)."""
        if key.__class__ is not str or not key:
            key = check_key(key)
        return self._release(key, 0)

    async def _raw_acquire(self, key: str) -> bool:
        """The source design's internal acquire: wait the lane's ``timeout_s``."""
        return await self.acquire_timeout(key, self.timeout_s)

    async def _raw_release(self, key: str) -> None:
        """The source design's internal release (see :meth:`manual_release`)."""
        self.manual_release_nowait(key)

    def _check_waker(self) -> None:
        # Waiters' futures belong to the lane's loop: only that loop may resolve them.
        self._bind()

    def _wait_clock(self) -> float:
        loop = self._loop
        return loop.time() if loop is not None else float(self._core._clock())

    @must_await
    async def drain(self, timeout_s: float | None = 0.0, *, cancel_waiting: bool = False
                    ) -> bool:
        """Stop taking new acquisitions, then wait up to ``timeout_s`` (loop clock) for
        the lane to go idle. A coroutine; same contract as :meth:`lanequeue.Lane.drain`.

        Returns True if the lane is idle (no holder, no waiter) on return. Raises
        TypeError/ValueError for a bad timeout; RuntimeError from a foreign loop.

        Example:

            >>> import asyncio
            >>> lane = AsyncLane("global", max_concurrent=2)
            >>> async def shutdown():
            ...     async with lane.acquire("job-1"):
            ...         idle_inside = await lane.drain()
            ...     return idle_inside, await lane.drain()
            >>> asyncio.run(shutdown())
            (False, True)
        """
        timeout = check_timeout(timeout_s)
        cancel_waiting = check_bool(cancel_waiting, "cancel_waiting")
        self._bind_loop()
        self._start_drain(cancel_waiting)
        return await self.wait_idle(timeout)

    @must_await
    async def wait_idle(self, timeout_s: float | None) -> bool:
        """Wait up to ``timeout_s`` seconds (loop clock; None: no limit) until the lane
        has no holder and no waiter; True if idle on return, False when the timeout
        passed first. A coroutine; looks every 10 ms (``asyncio.sleep``). Raises
        TypeError/ValueError for a bad timeout; RuntimeError from a foreign loop."""
        timeout = check_timeout(timeout_s)
        self._bind_loop()
        return await poll_idle_async(self._idle, timeout)


class AsyncLane(_AsyncFace, CountingKind):
    """A counting lane for asyncio tasks: at most ``max_concurrent`` holders; waiters FIFO,
    or by ``priority`` with ageing (as :class:`lanequeue.Lane`).

    Same arguments (``ageing_s`` included), properties, counters and errors as
    :class:`lanequeue.Lane`; waiting
    is ``await``-ed and cancellable. Use it from one event loop. In a child made by
    ``os.fork()`` it starts empty and binds the child's loop.

    Example:

        >>> import asyncio
        >>> llm = AsyncLane("global", max_concurrent=8)
        >>> async def call_model():
        ...     async with llm.acquire("any-key"):
        ...         return llm.available
        >>> asyncio.run(call_model())
        7
    """

    _hold_class = _AsyncCountingHold

    @must_await
    async def holds_of(self, key: str) -> int:
        """A coroutine: permits held now by ``key``. Plain twin: :meth:`holds_of_nowait`."""
        return self._holds_of(key)

    def holds_of_nowait(self, key: str) -> int:
        """:meth:`holds_of` as a plain call."""
        return self._holds_of(key)

    @must_await
    async def lane_status(self) -> dict[str, Any]:
        """A coroutine: the lane-wide figures (``active``, ``waiting``, ``available``,
        ``keys``, ``max_concurrent``). Plain twin: :meth:`lane_status_nowait`."""
        return self._lane_status()

    def lane_status_nowait(self) -> dict[str, Any]:
        """:meth:`lane_status` as a plain call."""
        return self._lane_status()


class AsyncSessionLane(_AsyncFace, SessionKind):
    """A per-key lane for asyncio tasks: one holder per key, in arrival order.

    Same arguments, properties, counters, eviction and errors as
    :class:`lanequeue.SessionLane`; waiting is ``await``-ed and cancellable. Use it from
    one event loop. In a child made by ``os.fork()`` it starts empty and binds the
    child's loop.

    Example: two turns of one conversation run one after the other, in arrival order.

        >>> import asyncio
        >>> sessions = AsyncSessionLane()
        >>> order = []
        >>> async def turn(n):
        ...     async with sessions.acquire("gateway:web:42"):
        ...         order.append(f"start {n}")
        ...         await asyncio.sleep(0.01)
        ...         order.append(f"end {n}")
        >>> async def main():
        ...     await asyncio.gather(turn(1), turn(2))
        >>> asyncio.run(main())
        >>> order
        ['start 1', 'end 1', 'start 2', 'end 2']
    """

    _hold_class = _AsyncSessionHold

    @must_await
    async def is_held(self, key: str) -> bool:
        """A coroutine: True while ``key`` has a holder. Plain twin: :meth:`is_held_nowait`."""
        return self._is_held(key)

    def is_held_nowait(self, key: str) -> bool:
        """:meth:`is_held` as a plain call."""
        return self._is_held(key)

    @must_await
    async def waiting_for(self, key: str) -> int:
        """A coroutine: callers in line for ``key`` now. Plain twin:
        :meth:`waiting_for_nowait`."""
        return self._waiting_for(key)

    def waiting_for_nowait(self, key: str) -> int:
        """:meth:`waiting_for` as a plain call."""
        return self._waiting_for(key)


async def _hold(lane: TaskLane, key: str, timeout: float | None, priority: int = 0
                ) -> TaskHold | None:
    """Take ``lane`` for ``key`` through its public surface (a lane the queue does not
    drive through its core), with ``priority`` when not 0 (see ``MultiHold._rank_of``):
    the entered hold, or None when none came in time."""
    hold = (lane.acquire(key, timeout_s=timeout, priority=priority) if priority  # type: ignore[call-arg]
            else lane.acquire(key, timeout_s=timeout))
    try:
        await hold.__aenter__()
    except LaneTimeoutError:
        return None
    return hold


def _no_prepare(lane: object) -> None:
    """Every in-process lane was checked (bound) before the first take."""


@shown_as_public
class _AsyncMultiAcquire(MultiHoldSteps, MultiHold):
    """What ``AsyncLaneQueue.acquire_all`` returns: entering takes every lane, in order.
    With in-process lanes only, entering and leaving run the cores' common steps
    themselves (:class:`lanequeue._core.MultiHoldSteps`, plain calls: no lane needs an
    ``await`` unless it must wait)."""

    __slots__ = ()

    # Copies (own code objects: see function_copy), as every hold class.
    _steps_in = function_copy(MultiHoldSteps._steps_in)
    _steps_out = function_copy(MultiHoldSteps._steps_out)

    def _check_loops(self) -> bool:
        """Check that the caller runs on the loop of every in-process lane of the plan
        (binding them on first use), before anything is taken or released: a refusal
        (RuntimeError) changes nothing. (Each lane's ``_bind``, without its frames.)
        Returns True when a core of the plan was seen busy (its ``seen_busy`` hint)."""
        ident = get_ident()
        busy = False
        to_bind: list[Any] | None = None
        lane: Any  # an _AsyncFace wherever core is not None (no cast: it is a call)
        for lane, core in self._plan.steps:
            if core is not None:
                fast = lane._fast_loop
                if fast is None or fast._thread_id != ident:
                    refusal = lane._loop_refusal()  # every lane asked before any is bound
                    if refusal is not None:
                        raise refusal
                    if to_bind is None:  # (no list made on the hot path)
                        to_bind = []
                    to_bind.append(lane)
                if core.seen_busy:
                    busy = True
        if to_bind is not None:
            for lane in to_bind:
                lane._bind_loop()
        return busy

    def _take_rest(self, pending: Any) -> None:
        """A take of :meth:`_steps_in` must wait: back to ``__aenter__``, which parks."""
        return None

    def _release_all(self, block_error: BaseException | None) -> None:
        """Give back every in-process hold taken, last first: the plain release pass of
        :meth:`_steps_in` (an interrupt between two takes) and :meth:`_steps_out` (a pass
        after one an interrupt stopped: only what the cores still hold)."""
        cores, taken, key = self._plan.cores, self._taken, self._key
        assert cores is not None  # (the steps run for in-process plans only)
        again = self._stage == MULTI_LEAVING
        self._stage = MULTI_LEAVING
        while taken:  # last taken first
            end_last(taken, cores[len(taken) - 1], key, again)

    async def __aenter__(self) -> MultiHold:
        if self._stage:
            raise entered_twice()
        try:
            busy = self._check_loops()
        except BaseException:
            # Refused, not forgotten: no warning when dropped (its own loop may still
            # enter it: a refusal changes nothing, see _check_loops).
            self._parked = None
            raise
        plan = self._plan
        cores = plan.cores
        budget = self._budget_s
        if cores is not None and budget != 0:
            # In-process lanes only (all bound to this loop, checked above). Unless one
            # was seen busy, the steps take every free one; where a take must wait, park
            # on that lane, as the general loop (``MultiHold._acquiring``) does, without
            # its generator: the ONE budget runs from the first wait, on the loop's clock.
            key, taken = self._key, self._taken
            deadline: float | None = None
            try:
                if busy:
                    self._stage = MULTI_ENTERED
                elif self._steps_in() is not None:  # (it sets the stage)
                    return self
                for core in cores[len(taken):]:
                    # (a busy look goes straight to the line: see _looks_busy)
                    # (a grant is appended to ``taken`` in its own commit, here and
                    # by ``_park``)
                    got = 0 if core.seen_busy and _looks_busy(core, key) else core.take(
                        key, True, None, None, taken)
                    if not got:
                        core.seen_busy = True
                        lane: Any = plan.steps[len(taken)][0]  # an _AsyncFace
                        remaining = None
                        if budget is not None:
                            now = lane._loop_clock()
                            if deadline is None:
                                deadline = now + budget
                            remaining = max(0.0, deadline - now)
                        rank = self._priority  # (0: no call to _rank_for)
                        got = await lane._park(key, remaining,
                                               rank and self._rank_for(core), self)
                        if not got:
                            raise LaneTimeoutError(lane.name, key, budget,
                                                   type(lane).__name__)
                return self
            except BaseException as exc:  # timed out, cancelled or interrupted: give
                await self._release_all_async(exc)  # back all (``exc`` propagates)
                raise
        self._stage = MULTI_ENTERED
        # The loop's clock, like the timers that end the waits.
        steps = self._acquiring(asyncio.get_running_loop().time, _no_prepare, None)
        try:
            wait = next(steps, None)
            while wait is not None:
                wait = _send(steps, await self._wait(*wait))
        except BaseException as exc:  # give back all; ``exc`` propagates
            await self._release_all_async(exc)
            raise
        return self

    async def _wait(
        self, lane: SyncLane | TaskLane, core: Core | None, got: Any, remaining: float | None
    ) -> int | TaskHold | None:
        # An AsyncLaneQueue admits asyncio lanes only (``add``), and drives by their core
        # the in-process ones (``_step``).
        if core is not None:
            return await cast(_AsyncFace, lane)._park(self._key, remaining,
                                                      self._rank_for(core), self)
        return await _hold(cast(TaskLane, lane), self._key, remaining, self._rank_of(lane))

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if self._plan.cores is None:
            await self._release_all_async(exc)
            self.__class__ = self._ended_class  # ended: no finalizer from here on
        else:
            # In-process lanes only (the exit runs in the task that entered: on their
            # loop): the plain steps, which end it (no finalizer from here on).
            self._steps_out(exc_type, exc, tb)

    @must_await
    async def release(self) -> None:
        """A coroutine: release every hold, last taken first. Safe to call twice.

        Every hold is released even when one release raises (a Redis hold whose lease was
        lost raises LeaseLostError, a NotOwnerError); the first such error is raised after
        the loop. Raises RuntimeError, releasing nothing, when not called from the lanes'
        event loop.
        """
        self._check_loops()
        await self._release_all_async(None)

    async def release_async(self) -> None:
        """Same as :meth:`release` (the earlier spelling)."""
        self._check_loops()
        await self._release_all_async(None)

    async def _release_all_async(self, block_error: BaseException | None) -> None:
        """Release every hold, last taken first (see ``MultiHold._releasing``). A
        cancellation during one release does not stop the others: they are released in
        a task of their own (a Redis lane's release also runs on to its end), which the
        cancelled task waits for at most :data:`~lanequeue._ops.CANCEL_WAIT_S` in all,
        counted from the start of the release that was cancelled (a frozen server must
        not keep it for each release's bound; a second cancellation ends the wait at
        once); then the CancelledError is raised, in place of ``block_error`` or a
        release error: a cancelled task sees its CancelledError. What the background task
        cannot release is logged.

        Giving back the lanes of an enter that a cancellation stopped while a lane was
        cleaning up after it (a Redis lane waits up to CANCEL_WAIT_S for that, and says
        when it began: see :func:`~lanequeue._ops.note_cancel_wait`), the releases run
        in the background from the start, waited for only what is left of that same
        CANCEL_WAIT_S: a cancelled ``acquire_all`` ends within it, as a cancelled
        acquire does."""
        steps = self._releasing(block_error)
        hold = next(steps, None)
        clock = asyncio.get_running_loop().time
        began = noted_cancel_wait(block_error, clock())
        if hold is not None and (began is not None
                                 or isinstance(block_error, asyncio.CancelledError)):
            # Left by a cancellation: the releases to await run aside from the start,
            # waited for one CANCEL_WAIT_S in all (what is left of it, when a clean-up
            # of the same cancellation began it), noted on the CancelledError.
            await _release_rest_aside(steps, hold, clock() if began is None else began,
                                      block_error)
            return
        while hold is not None:
            started = clock()
            try:
                await hold.release()
            except asyncio.CancelledError as cancelled:
                try:
                    hold = _send(steps, None)  # (the steps' end may raise an earlier error)
                except BaseException as exc:
                    raise cancelled from exc
                if hold is not None:
                    # The cancelled release may have waited for its own clean-up already:
                    # CANCEL_WAIT_S counts from when that wait began (noted on its
                    # CancelledError), else from the start of that release, whose wait
                    # began after the cancellation came.
                    began = noted_cancel_wait(cancelled, clock())
                    await _release_rest_aside(steps, hold, started if began is None else
                                              began, cancelled)
                raise
            except BaseException as exc:
                hold = _send(steps, exc)
                began = noted_cancel_wait(exc, clock())
                if began is not None and hold is not None:
                    # A release of a task being cancelled failed within its clean-up wait
                    # (a Redis error on a frozen server, say): the rest of that same wait
                    # for the others, and the time goes on with what propagates.
                    await _release_rest_aside(steps, hold, began, exc)
                    if block_error is None:
                        raise
                    note_cancel_wait(block_error, began, clock())
                    return
            else:
                hold = _send(steps, None)


#: Releases going on after their task was cancelled (strong references until they end).
_RELEASING: set[asyncio.Task[None]] = set()


async def _release_rest_aside(steps: Any, hold: Any, since: float,
                              going: BaseException | None = None) -> None:
    """Release ``hold`` and the rest of ``steps`` in a task of their own, and wait for
    it until :data:`~lanequeue._ops.CANCEL_WAIT_S` after ``since`` (loop time; a new
    cancellation ends the wait at once); the releases go on after that. The time
    waited since ``since`` is noted (:func:`~lanequeue._ops.note_cancel_wait`) on
    ``going``, the exception the caller goes on to raise, and on a new cancellation's,
    so that an enclosing block's clean-up waits only what is left of the same
    CANCEL_WAIT_S."""
    loop = asyncio.get_running_loop()
    rest = loop.create_task(_release_rest(steps, hold))
    _RELEASING.add(rest)
    rest.add_done_callback(_RELEASING.discard)
    left = CANCEL_WAIT_S - (loop.time() - since)
    try:
        # (At least one turn of the loop: releases that need no answer end in it.)
        await asyncio.wait((rest,), timeout=max(0.0, left))
    except asyncio.CancelledError as again:  # cancelled again: the wait ends
        note_cancel_wait(again, since, loop.time())
        raise
    finally:
        if going is not None:
            note_cancel_wait(going, since, loop.time())


async def _release_rest(steps: Any, hold: Any) -> None:
    """Release ``hold`` and the rest of ``steps`` (``MultiHold._releasing``), after the
    task that left the block was cancelled; what fails is logged (nobody is left to
    raise it to)."""
    try:
        while hold is not None:
            try:
                await hold.release()
            except BaseException as exc:
                hold = _send(steps, exc)
            else:
                hold = _send(steps, None)
    except asyncio.CancelledError:
        # (This task was cancelled too: the event loop is shutting down, say.)
        log.warning("acquire_all: the releases after a cancellation were cancelled in "
                    "turn (the event loop shutting down?); a hold they did not release "
                    "is ended by its lane's own clean-up, or lapses with its lease")
    except BaseException as exc:  # the first release error, raised by the steps' end
        log.warning("acquire_all: a release after a cancellation failed: %s", told(exc))



@shown_as_public
class _WatchedAsyncMultiAcquire(_MultiDropWatch, _AsyncMultiAcquire):
    """An :class:`_AsyncMultiAcquire` with the finalizer of a dropped ``acquire_all``,
    until its block is left."""

    __slots__ = ()


_AsyncMultiAcquire._ended_class = _AsyncMultiAcquire

class AsyncLaneQueue(QueueBase[TaskLane, AsyncLane, AsyncSessionLane]):
    """A registry of named asyncio lanes, composed per request by :meth:`acquire_all`.

    Same rules as :class:`lanequeue.LaneQueue` (registration order, one deadline, all or
    nothing); accepts :class:`AsyncLane`, :class:`AsyncSessionLane`, the asyncio Redis
    lanes and any object with the asyncio lane surface (:class:`lanequeue.TaskLane`).

    Example:

        >>> import asyncio
        >>> queue = build_default_async_lanes()
        >>> async def reply():
        ...     async with queue.acquire_all("gateway:web:42", ["session", "global"]):
        ...         return queue["global"].active_count
        >>> asyncio.run(reply())
        1
    """

    _counting = AsyncLane
    _session = AsyncSessionLane
    _face = "asyncio"
    _surface = TaskLane
    _multi_ended = _AsyncMultiAcquire

    def _step(self, lane: TaskLane) -> Step:
        # The core only for the library's own classes: a subclass may override acquire,
        # so it is taken through its public surface.
        in_process = type(lane) in (AsyncLane, AsyncSessionLane)
        return (lane, cast(AsyncLane, lane)._core if in_process else None)

    def acquire_all(
        self, key: str, lane_names: Sequence[str], *, timeout_s: Any = LANE_DEFAULT,
        priority: int = 0,
    ) -> _AsyncMultiAcquire:
        """Hold every named lane for ``key``: an async context manager, all or nothing.

        Arguments (``priority`` included: it orders the waits on the :class:`AsyncLane`
        counting lanes), order, deadline and errors as
        :meth:`lanequeue.LaneQueue.acquire_all`;
        the deadline runs on the loop's clock. Cancelled while waiting for a later lane,
        it releases the lanes already taken, in reverse, then re-raises CancelledError.
        """
        return self._multi(_WatchedAsyncMultiAcquire, key, lane_names, timeout_s, priority)

    @must_await
    async def drain(self, timeout_s: float | None = 0.0, *, cancel_waiting: bool = False
                    ) -> bool:
        """:meth:`lanequeue.LaneQueue.drain` for asyncio: every lane refuses
        new acquisitions at once, then this waits up to ``timeout_s`` (loop clock) for all
        to be idle. A coroutine; True if every lane is idle on return."""
        timeout = check_timeout(timeout_s)
        cancel_waiting = check_bool(cancel_waiting, "cancel_waiting")
        self._start_drain(cancel_waiting)
        return await self.wait_idle(timeout)

    @must_await
    async def wait_idle(self, timeout_s: float | None) -> bool:
        """Wait up to ``timeout_s`` seconds (loop clock; None: no limit) until no
        lane has a holder or a waiter; False when the timeout passed first.
        A coroutine; looks every 10 ms."""
        timeout = check_timeout(timeout_s)
        return await poll_idle_async(self._idle, timeout)


def build_default_async_lanes() -> AsyncLaneQueue:
    """The asyncio twin of :func:`lanequeue.build_default_lanes`: ``"session"``
    (256 sessions, 3600 s idle), ``"global"`` (8), ``"scheduler"`` (2), ``"subagent"`` (5)."""
    queue = AsyncLaneQueue()
    queue.add_session_lane("session")
    queue.add_lane("global", max_concurrent=DEFAULT_GLOBAL_CONCURRENCY)
    queue.add_lane("scheduler", max_concurrent=2)
    queue.add_lane("subagent", max_concurrent=5)
    return queue
