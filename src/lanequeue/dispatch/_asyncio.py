"""The asyncio face of the dispatcher: each admitted turn is a task of the loop.

The task enters ``acquire_all(key, lanes)``, calls ``fn`` (a coroutine function, or a
plain function that then runs on the loop) and releases; cancelling the task is how a turn
is interrupted, before or after it holds the lanes (the lanes' own cancellation safety
gives back what was taken). Timers are the loop's (a :class:`~lanequeue._ops.LoopTimer`,
which an interrupt in its delivery cannot lose), so the loop's clock is the dispatcher's
clock.
"""

from __future__ import annotations

import asyncio
import inspect
import math
import os
from collections.abc import Callable, Sequence
from typing import Any

from .._ops import LoopTimer
from ..contract import must_await
from ._base import DEFAULT_LANES, DispatcherBase
from ._machine import _CURRENT, Job, Ticket, Timer
from ._workers import Service

__all__ = ["Dispatcher"]

#: The reason of the tickets ended by the event loop's shutdown.
LOOP_SHUT_DOWN = "loop shut down"


def _cancelled_from_outside() -> bool:
    """The current task was cancelled by a ``cancel()`` call (3.11+: ``cancelling()``),
    not by a CancelledError that ``fn`` raised itself. False on 3.10 (the watch task
    still sees the shutdown)."""
    task = asyncio.current_task()
    cancelling = getattr(task, "cancelling", None)
    return callable(cancelling) and bool(cancelling())


#: Threads that run the shared dedupe window's calls for the asyncio dispatchers of this
#: process (each call bounded, see :mod:`._redis`); made on first use, anew after fork.
_IO_THREADS = 8
_io: tuple[int, Service] | None = None


def _io_service() -> Service:
    global _io
    made = _io
    if made is None or made[0] != os.getpid():
        made = _io = (os.getpid(), Service(max_threads=_IO_THREADS, name="lanequeue-dedupe"))
    return made[1]


class Dispatcher(DispatcherBase):
    """Runs the turns of busy conversations on asyncio tasks, under an AsyncLaneQueue.

    Args:
        queue: the :class:`~lanequeue.AsyncLaneQueue` (or any asyncio queue with
            ``acquire_all``) whose lanes every turn takes.
        lanes: the lane names every turn takes (default ``("session", "global")``).
        busy: what a submit does when its key has a running or pending turn:
            ``"enqueue"`` (default), ``"reject"``, ``"steer"``, ``"interrupt"``,
            ``"replace"`` or ``"collect"`` (see the README's policy table).
        max_pending: pending turns kept per key, >= 0: those in the key's line and those
            steered into its current turn and not taken; the current turn (running, or
            formed and waiting at the gate or for the lanes) is not counted. Admission is decided
            before the busy policy acts (a rejected turn drops and cancels nothing);
            ``interrupt`` and ``replace`` leave their new turn the one pending turn, so
            only ``max_pending=0`` rejects them.
        overflow: a submit beyond ``max_pending``: ``"reject_new"`` (the new ticket ends
            ``rejected``, reason "overflow") or ``"drop_oldest"`` (the oldest pending,
            a steered one first, ends ``dropped``, reason "overflow"; with none pending
            the new ticket is rejected).
        on_drop: called with the list of tickets a submit dropped (overflow, interrupt,
            replace), after they ended; exceptions are logged.
        dedupe_ttl_s: seconds a ``dedupe_id`` is remembered from its submit.
        dedupe_max: ids remembered at most (the oldest is forgotten first); 0 keeps
            none, which turns dedupe off.
        debounce_s: under ``collect``, the quiet window in seconds: a merged call starts
            once no new turn of the key came for this long (0: merge whatever is
            pending when the key frees up). The window counts against each ticket's
            ``timeout_s`` (one that runs out in it ends ``timed_out``); a ticket with
            ``timeout_s=0`` on an idle key does not wait for it.
        max_wait_s: under ``collect``, the longest the first pending turn waits for the
            window (None: no bound).
        ageing_s: a turn waiting in the dispatcher gains one priority level per
            ``ageing_s`` seconds (None: strict priority); the levels it gained go with it
            into the counting lanes' lines, where it ages by each lane's own
            ``ageing_s`` (see "Priority, precisely" in ``lanequeue.dispatch._machine``).
        dedupe_redis: a synchronous ``redis.Redis`` client: the dedupe window is then
            shared with every dispatcher using the same Redis and ``dedupe_prefix``
            (``SET NX PX`` on ``{prefix:d:<len(key)>:<key>:<dedupe_id>}``, one round trip
            per submit with a new ``dedupe_id``, made in a thread of a small pool, never on
            the loop:
            ``submit`` returns at once). Until the window answers, the ticket and every
            later submit of its key wait (pending, ``blocked_by`` ``"dedupe"`` in
            :meth:`snapshot`), so a key's turns stay in submit order; then a repeat owned
            by another process ends ``deduped`` (and moves from ``submitted`` to
            ``deduped`` in ``stats``), a failure of the window (or no answer within the
            client's ``socket_timeout``, 5 s without one) ends it ``failed`` with
            LaneBackendError (the claim, which may land later, is given back in the
            background), and an id of ours is placed with its busy policy. A submit its
            busy policy or ``max_pending`` rejects at once (no claim of its key in
            flight) ends ``rejected`` without asking the window.
        dedupe_prefix: the Redis key prefix (default the Redis lanes' ``"lanequeue"``).

    ``fn`` (``submit``) may be a coroutine function, awaited in the turn's task, or a plain
    function, called on the loop (it must not block); an awaitable it returns is awaited.
    An async generator function is refused (TypeError), on both dispatchers.

    Durations: ``debounce_s`` is a finite number of seconds >= 0 (``inf``, NaN, negative:
    ValueError); ``max_wait_s`` and ``dedupe_ttl_s`` take None or ``math.inf`` for no
    bound (negative, NaN: ValueError); ``ageing_s`` is a finite number > 0, or None.

    Raises TypeError/ValueError for a bad argument, naming the call and the argument
    (``Dispatcher() argument 'ageing_s' must be ...``; ``ThreadDispatcher()`` on threads;
    not a number, ``None`` for a duration that has no "no limit" meaning: TypeError); for
    ``lanes``, the
    queue's own check of lane names (``acquire_all``'s): KeyError for an unknown lane,
    ValueError for a lane named twice or none, TypeError for a name not a ``str``.

    Use it from one event loop (the first that calls ``submit``), in the process that
    made it (in a forked child, ``submit``, ``cancel``, ``clear``, ``close`` and ``drain``
    raise RuntimeError); every method is a plain call except :meth:`drain` and
    :meth:`wait_idle`.

    When the loop shuts down with work left (its tasks cancelled: ``asyncio.run``'s end,
    Ctrl-C included), the dispatcher closes itself: every ticket still pending or running
    ends at once as ``cancelled``, reason ``"loop shut down"``, and no turn starts any
    more. While it has work, one task of its own (``"lanequeue-dispatch-watch"``) waits
    for that; it ends when the dispatcher is idle. A turn whose task alone is cancelled
    (``asyncio.current_task().cancel()`` in ``fn``) ends ``cancelled`` (``done`` when
    ``fn`` returns before the cancel lands) and the others go on (see
    :meth:`_shutting_down`). A loop closed without cancelling its tasks tells it
    nothing: call :meth:`close` first there.

    Example::

        queue = build_default_async_lanes()
        dispatcher = Dispatcher(queue, busy="collect", debounce_s=0.5)

        async def reply(messages: list[str]) -> str:
            return await model.chat(messages)

        ticket = dispatcher.submit(conversation_key, reply, "hello")
        answer = await ticket
    """

    _awaits = True

    def __init__(
        self,
        queue: Any,
        *,
        lanes: Sequence[str] = DEFAULT_LANES,
        busy: str = "enqueue",
        max_pending: int = 20,
        overflow: str = "reject_new",
        on_drop: Callable[[list[Ticket]], Any] | None = None,
        dedupe_ttl_s: float = 300.0,
        dedupe_max: int = 10_000,
        debounce_s: float = 0.0,
        max_wait_s: float | None = None,
        ageing_s: float | None = 30.0,
        dedupe_redis: Any = None,
        dedupe_prefix: str = "lanequeue",
    ) -> None:
        from ..aio import AsyncLaneQueue

        if not isinstance(queue, AsyncLaneQueue):
            raise TypeError(f"{type(self).__name__}() argument 'queue' must be an "
                            "AsyncLaneQueue (Dispatcher runs on asyncio; ThreadDispatcher "
                            f"takes a LaneQueue), not {queue!r}")
        super().__init__(queue, lanes=lanes, busy=busy, max_pending=max_pending,
                         overflow=overflow, on_drop=on_drop, dedupe_ttl_s=dedupe_ttl_s,
                         dedupe_max=dedupe_max, debounce_s=debounce_s, max_wait_s=max_wait_s,
                         ageing_s=ageing_s, workers=None,
                         dedupe_redis=dedupe_redis, dedupe_prefix=dedupe_prefix)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        self._idle_waiters: set[asyncio.Future[None]] = set()
        # The watch over the loop's shutdown: a task of the loop while work is left
        # (see _watch), and the future that ends it when the dispatcher is idle.
        self._watch_end: asyncio.Future[None] | None = None
        self._watch_task: asyncio.Task[None] | None = None
        self._shut = False  # the loop shut down: every ticket ended, nothing starts

    def _submitted(self, ticket: Ticket) -> None:
        if not ticket.done():
            self._watch_loop()

    def _check_caller(self) -> None:
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            raise RuntimeError("Dispatcher must be used from its event loop "
                               "(no event loop is running in this thread)") from None
        if self._loop is None:
            self._loop = loop
        elif loop is not self._loop:
            closed = " (closed now)" if self._loop.is_closed() else ""
            raise RuntimeError(
                f"Dispatcher is bound to another event loop{closed}, the first that "
                "called submit: its tickets, timers and tasks live there; make a "
                "Dispatcher in each event loop that submits (one per asyncio.run)")

    # -- the face -----------------------------------------------------------------------

    def _now(self) -> float:
        loop = self._loop
        return 0.0 if loop is None else loop.time()

    def _call_later(self, delay: float, fn: Callable[[], None]) -> Timer:
        loop = self._loop
        assert loop is not None
        # (a timer an interrupt in its delivery cannot lose; the machine's timers take
        # the repeat it may make, see LoopTimer)
        return LoopTimer(loop, loop.time() + delay, lambda _timer: fn())

    def _launch(self, job: Job) -> None:
        assert self._loop is not None
        if self._shut or self._loop.is_closed():
            # The loop shuts down or is gone: nothing may start (its tickets ended).
            self._machine.finish(job, False, asyncio.CancelledError())
            return
        task = self._loop.create_task(self._run(job))
        if job.handle is None:  # (a launch repeated after an interrupt: the first task's)
            job.handle = task
        self._tasks.add(task)
        task.add_done_callback(lambda t: self._reap(t, job))

    def _reap(self, task: asyncio.Task[None], job: Job) -> None:
        self._tasks.discard(task)
        # (A job reported already ended on its own: a cancel that reached its task only
        # after that, e.g. fn cancelling its own task and returning, ended nothing; with
        # the dispatcher idle by then, no watch task is left to tell a shutdown by.)
        if (task.cancelled() and not job.abandoned and job.end_req is None
                and not job.reported and self._shutting_down()):
            self._loop_shut_down()  # cancelled by nobody here: the loop's shutdown
        if not job.reported and job.runner in (None, task):
            # Cancelled before its first step (an abandoned job, or the loop shutting
            # down): the coroutine never ran, so report the end here.
            self._machine.finish(job, False, asyncio.CancelledError())

    def _offload(self, fn: Callable[[], Any], done: Callable[[Any], None]) -> None:
        """Call ``fn()`` (the shared dedupe window's blocking I/O) in a thread of the
        process's small pool, never on the loop; then ``done(its result or exception)``
        on the loop (not at all once the loop is closed: nobody waits for it then). The
        hand-over to the pool is one put (see :mod:`._workers`): a KeyboardInterrupt on
        the loop's thread cannot wedge it."""
        loop = self._loop
        assert loop is not None

        def call(_: None) -> None:
            try:
                answer = fn()
            except BaseException as exc:
                answer = exc
            try:
                loop.call_soon_threadsafe(done, answer)
            except RuntimeError:  # the loop is closed
                pass

        _io_service().submit(call, None)

    def _lease_lost(self, job: Job) -> None:
        # Noticed on the lane's watchdog or renewer thread, or on the loop: the machine
        # is told on the loop, where the turn's task is cancelled.
        loop = self._loop
        if loop is None or loop.is_closed():
            return
        try:
            here = asyncio.get_running_loop() is loop
        except RuntimeError:  # (a thread with no running loop)
            here = False
        if here:
            self._machine.lease_lost(job)
            return
        try:
            loop.call_soon_threadsafe(self._machine.lease_lost, job)
        except RuntimeError:  # the loop closed meanwhile: nothing runs the turn now
            pass

    def _interrupt(self, job: Job) -> None:
        # The task that runs the job (Machine.enter), else the first launched: a launch
        # repeated after an interrupt makes a task that returns at once.
        task = job.runner if job.runner is not None else job.handle
        if task is not None and task is not asyncio.current_task():
            task.cancel()

    # -- the loop's shutdown --------------------------------------------------------------

    def _watch_loop(self) -> None:
        """Make sure a watch task runs while the dispatcher has work (loop thread)."""
        if self._watch_end is None and not self._shut:
            assert self._loop is not None
            end = self._watch_end = self._loop.create_future()
            task = self._watch_task = self._loop.create_task(
                self._watch(end), name="lanequeue-dispatch-watch")
            # Also when it is cancelled before its first step (its coroutine never runs,
            # so _watch cannot tell): a shutdown right after the submit that made it.
            task.add_done_callback(self._watch_done)

    def _watch_done(self, task: asyncio.Task[None]) -> None:
        """The watch task ended: cancelled, the loop shuts down (nothing else cancels
        it); ended by :meth:`_idle`, nothing to do."""
        if task.cancelled():
            self._loop_shut_down()

    def _shutting_down(self) -> bool:
        """Whether a task of this dispatcher that was cancelled from outside is the
        loop's shutdown. ``asyncio.run`` (Ctrl-C included) cancels every task of the
        loop at once, before any of them runs again, so the watch task, which nothing
        else cancels, is being cancelled too. A turn that cancels its own task (or code
        that cancels one turn's task) is not a shutdown: that turn ends ``cancelled``
        and the others go on. True where it cannot be told (Python 3.10, which has no
        ``Task.cancelling()``; no live watch task)."""
        watch = self._watch_task
        if watch is None or watch.done():
            return True
        cancelling = getattr(watch, "cancelling", None)
        return not callable(cancelling) or bool(cancelling())

    def _watch_cancelled(self) -> bool:
        """Whether the watch task was cancelled: the loop's shutdown, told on every
        Python. ``Task.cancel()`` on a task that waits cancels the future it waits for at
        once, and a shutdown cancels every task before any of them runs again: so a
        turn's task that handles its cancellation before the watch task has handled its
        own (their order is the loop's) already finds the watch's future cancelled. (On
        3.10, with no ``Task.cancelling()``, this is how a running turn tells the
        shutdown.) False when no watch waits, or it has not started its wait yet."""
        end = self._watch_end
        return end is not None and end.cancelled()

    async def _watch(self, end: asyncio.Future[None]) -> None:
        """Wait until the dispatcher is idle (``idle`` ends the wait). Cancelled first,
        the loop shuts down (``asyncio.run`` cancels every task when its main coroutine
        returns or raises, Ctrl-C included): see :meth:`_loop_shut_down`."""
        try:
            await end
        except asyncio.CancelledError:
            if end.cancelled():  # (ended by idle: set_result; so this is a task cancel)
                self._loop_shut_down()
            raise
        finally:
            if self._watch_end is end:
                self._watch_end = None

    def _loop_shut_down(self) -> None:
        """The loop's tasks are being cancelled: every ticket still pending or running
        ends now as ``cancelled`` (reason "loop shut down"), and no turn starts any more
        (a turn's task that was not cancelled with the others is cancelled now)."""
        if self._shut:
            return
        self._shut = True
        self._machine.close(True, reason=LOOP_SHUT_DOWN, at_once=True)

    def _idle(self) -> None:
        end = self._watch_end
        if end is not None:
            self._watch_end = None
            if not end.done():
                end.set_result(None)
        for fut in self._idle_waiters:
            if not fut.done():
                fut.set_result(None)

    async def _run(self, job: Job) -> None:
        """One turn: hold the lanes, call ``fn``, release; report to the machine."""
        machine = self._machine
        if not machine.enter(job, asyncio.current_task()):
            return  # a launch repeated after an interrupt: the first runner has it
        ok, value = False, None
        try:
            # All inside the try, as on threads (see ThreadDispatcher._run): whatever
            # raises is reported by finish below, and an abandoned job takes no lane.
            if not job.abandoned:
                budget = machine.budget(job)
                priority = machine.lane_priority(job)
                # Passed only when set: a queue of another kind may not take it.
                extra = {"priority": priority} if priority else {}
                async with self._queue.acquire_all(
                    job.key, self._lanes, timeout_s=math.inf if budget is None else budget,
                    **extra,
                ) as multi:
                    if machine.start(job):
                        self._run_under(job, multi)
                        token = _CURRENT.set(job.turn)
                        try:
                            value = job.fn(*job.args)
                            if inspect.isawaitable(value):
                                value = await value
                            ok = True
                        finally:
                            _CURRENT.reset(token)
        except BaseException as exc:  # fn's error, a lane timeout, or a cancellation
            ok, value = False, exc
            if (isinstance(exc, asyncio.CancelledError) and not job.abandoned
                    and job.end_req is None and _cancelled_from_outside()
                    and self._shutting_down()):
                # Nobody here cancelled the task (that leaves end_req or abandoned),
                # and every task of the loop is being cancelled: its shutdown.
                self._loop_shut_down()
        if self._watch_cancelled():
            # The loop shuts down, whatever the turn made of its cancellation (fn may
            # have caught it and returned, or raised another error): the ticket ends
            # as the watch task would end it, and the key's next turn is not launched
            # (an eager task factory would run its fn at once).
            self._loop_shut_down()
        try:
            machine.finish(job, ok, value)
        finally:
            if not job.reported:  # interrupted at its entry (see "Interrupts")
                machine.finish(job, ok, value)
        if isinstance(value, (KeyboardInterrupt, SystemExit)):
            raise value

    # -- waiting ------------------------------------------------------------------------

    @must_await
    async def wait_idle(self, timeout_s: float | None = None) -> bool:
        """Wait up to ``timeout_s`` seconds (None: no limit; 0: do not wait) until no turn
        is running or pending. Returns True when idle, False when the time ran out."""
        from .._validate import check_timeout

        timeout = check_timeout(
            timeout_s, f"{type(self).__name__}.wait_idle() argument 'timeout_s'")
        self._check_caller()
        if self._machine.is_idle():
            return True
        if timeout == 0:
            return False
        assert self._loop is not None
        fut = self._loop.create_future()
        self._idle_waiters.add(fut)
        try:
            await asyncio.wait_for(asyncio.shield(fut), timeout)
        except asyncio.TimeoutError:
            return self._machine.is_idle()
        finally:
            self._idle_waiters.discard(fut)
        return True

    @must_await
    async def drain(self, timeout_s: float | None = 0.0) -> bool:
        """Refuse new turns at once (a later ``submit`` raises DispatcherDrainingError),
        then wait up to ``timeout_s`` seconds (None: no limit; 0: do not wait) for the
        running and pending turns to end. Returns True when nothing is left."""
        from .._validate import check_timeout

        # (checked before draining: a refused call changes nothing)
        timeout = check_timeout(
            timeout_s, f"{type(self).__name__}.drain() argument 'timeout_s'")
        self._check_process()
        self._check_caller()
        self._machine.drain()
        return await self.wait_idle(timeout)
