"""The thread face of the dispatcher: each admitted turn runs in a worker thread.

The worker enters ``acquire_all(key, lanes)`` (blocking), calls ``fn`` and releases. A
thread cannot be interrupted from outside: a cancelled, interrupted or timed-out turn sees
its ``cancel_event`` set and should return soon; until it does, it keeps its lanes, so
per-key exclusion and the caps are never broken. Timers run, and the workers are started,
on the dispatcher's service thread (:class:`~._workers.Service`).
"""

from __future__ import annotations

import inspect
import time
from asyncio.events import _get_running_loop
from collections.abc import Callable, Sequence
from typing import Any

from .._validate import check_timeout
from ._base import DEFAULT_LANES, DispatcherBase, check_int
from ._machine import _CURRENT, Job, Notice, Ticket
from ._workers import Handle, Service

__all__ = ["ThreadDispatcher"]

#: Workers of the pool when no counting lane bounds the turns.
DEFAULT_WORKERS = 32


def _discard(value: Any) -> None:
    close = getattr(value, "close", None)  # a coroutine: no "never awaited" warning
    if callable(close):
        close()


class ThreadDispatcher(DispatcherBase):
    """Runs the turns of busy conversations in a pool of threads, under a LaneQueue.

    Same arguments, policies, states and errors as :class:`~lanequeue.Dispatcher`, plus:

    ``fn`` must be a plain function: ``submit`` raises TypeError for a coroutine function
    (an ``async def``, or an object whose ``__call__`` is one), since a thread cannot
    await it; a plain ``fn`` that returns an awaitable anyway ends ``failed`` with
    TypeError (the awaitable is closed, never run).

    Args:
        queue: the :class:`~lanequeue.LaneQueue` whose lanes every turn takes.
        max_workers: worker threads (default: the smallest ``max_concurrent`` of the
            counting lanes among ``lanes``, else 32). At most this many turns hold or
            wait for the lanes at once; the rest wait in the dispatcher, in priority
            order.
        clock: the monotonic clock of deadlines, debounce and the dedupe window
            (seconds); tests pass a fake clock.

    Every method is a plain call, safe from any thread of the process that made the
    dispatcher (in a forked child, ``submit``, ``cancel``, ``clear``, ``close`` and
    ``drain`` raise RuntimeError: make a new dispatcher there). ``drain`` and
    ``wait_idle`` block. Tickets are waited for with ``ticket.result(timeout)``.

    Example::

        lanes = build_default_lanes()
        dispatcher = ThreadDispatcher(lanes, busy="interrupt")

        def reply(text: str) -> str:
            turn = current_turn()
            for chunk in model.stream(text):
                if turn.cancel_event.is_set():
                    return "interrupted"
                ...
            return answer

        print(dispatcher.submit(conversation_key, reply, "hello").result(timeout=60))
    """

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
        max_workers: int | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        from ..queue import LaneQueue

        where = f"{type(self).__name__}() argument"
        if not isinstance(queue, LaneQueue):
            raise TypeError(f"{where} 'queue' must be a LaneQueue (ThreadDispatcher runs on "
                            f"threads; Dispatcher takes an AsyncLaneQueue), not {queue!r}")
        if not callable(clock):
            raise TypeError(f"{where} 'clock' must be a callable returning seconds, not "
                            f"{clock!r}")
        self._clock = clock
        if max_workers is not None:
            check_int(max_workers, f"{where} 'max_workers'", 1)
        super().__init__(queue, lanes=lanes, busy=busy, max_pending=max_pending,
                         overflow=overflow, on_drop=on_drop, dedupe_ttl_s=dedupe_ttl_s,
                         dedupe_max=dedupe_max, debounce_s=debounce_s, max_wait_s=max_wait_s,
                         ageing_s=ageing_s,
                         workers=max_workers if max_workers is not None else DEFAULT_WORKERS,
                         dedupe_redis=dedupe_redis, dedupe_prefix=dedupe_prefix)
        slots = self._machine.slots
        assert slots is not None
        # Its turns run in the service's workers and its timers in the service thread,
        # which a KeyboardInterrupt in a caller cannot wedge (see ._workers).
        self._service = Service(max_threads=slots, name="lanequeue-dispatch", clock=clock,
                                poll_s=None if clock is time.monotonic else 0.005)
        self._service.stop_with(self)  # dropped without close()
        # The idle notice: a condition an interrupt cannot wedge (see Notice).
        self._idle_notice = Notice()

    # -- the face -----------------------------------------------------------------------

    _loop_instead = ("In async code await the ticket (await ticket works from any event "
                     "loop), and call drain() or wait_idle() in a thread "
                     "(await asyncio.to_thread(dispatcher.drain, timeout_s))")

    def _now(self) -> float:
        return self._clock()

    def _call_later(self, delay: float, fn: Callable[[], None]) -> Handle:
        return self._service.call_later(delay, fn)

    def _launch(self, job: Job) -> None:
        self._service.submit(self._run, job)

    def _interrupt(self, job: Job) -> None:
        """A job abandoned while its runner waits for its lanes (all its tickets ended
        before it started): end that wait (its ``acquire_all`` raises, gives back what
        it took, and the runner reports), so the runner and its gate slot are free at
        once, not when the wait's timeout passes. A started job's turn sees its cancel
        event (set by the machine)."""
        multi = job.entering
        if multi is not None and job.abandoned:
            end_wait = getattr(multi, "_end_wait", None)  # (a LaneQueue's acquire_all)
            if end_wait is not None:
                end_wait()

    def _idle(self) -> None:
        self._idle_notice.notify_all()
        if self._machine.closed:
            self._service.stop()

    def _run(self, job: Job) -> None:
        """One turn in a worker: hold the lanes, call ``fn``, release; report.

        Everything between the launch and the report is inside the ``try``: whatever
        raises, the runner reports (``finish``), or the machine would count it running
        for ever (a pool swallows a worker's exception). Its tickets may all end between
        the launch and any instant here (the job is abandoned): an abandoned job does not
        go to the lanes, and one abandoned later is refused by ``start``."""
        machine = self._machine
        if not machine.enter(job, object()):
            return  # a launch repeated after an interrupt: the first runner has it
        ok, value = False, None
        try:
            if not job.abandoned:
                budget = machine.budget(job)
                priority = machine.lane_priority(job)
                # Passed only when set: a queue of another kind may not take it.
                extra = {"priority": priority} if priority else {}
                multi = self._queue.acquire_all(
                    job.key, self._lanes,
                    timeout_s=float("inf") if budget is None else budget, **extra)
                job.entering = multi  # (its wait ends if the job is abandoned)
                if job.abandoned:
                    # Abandoned since the look above, maybe before _interrupt could see
                    # ``entering``: the runner ends its own wait (any that comes).
                    self._interrupt(job)
                with multi:
                    job.entering = None
                    if machine.start(job):
                        self._run_under(job, multi)
                        token = _CURRENT.set(job.turn)
                        try:
                            value = job.fn(*job.args)
                            if inspect.isawaitable(value):
                                # A plain function that returned a coroutine (a lambda
                                # around an async def): nothing here can run it.
                                _discard(value)
                                raise TypeError(
                                    f"fn returned an awaitable ({type(value).__name__}) on "
                                    "ThreadDispatcher, which never awaits: use Dispatcher")
                            ok = True
                        finally:
                            _CURRENT.reset(token)
        except BaseException as exc:  # fn's error, or a lane timeout
            ok, value = False, exc
        try:
            machine.finish(job, ok, value)
        finally:
            if not job.reported:  # interrupted at its entry (see "Interrupts")
                machine.finish(job, ok, value)

    # -- waiting ------------------------------------------------------------------------

    def wait_idle(self, timeout_s: float | None = None) -> bool:
        """Block up to ``timeout_s`` seconds (None: no limit; 0: do not wait) until no
        turn is running or pending. Returns True when idle, False when time ran out.

        Called from a thread that runs an asyncio event loop, a call that has to wait
        (not idle, ``timeout_s`` other than 0) blocks that loop: the first such call of
        the dispatcher warns (``RuntimeWarning``); so does :meth:`drain`."""
        timeout = check_timeout(
            timeout_s, f"{type(self).__name__}.wait_idle() argument 'timeout_s'")
        return self._wait_idle(timeout, "wait_idle()")

    def _wait_idle(self, timeout: float | None, call: str) -> bool:
        if (timeout != 0 and not self._warned_loop and _get_running_loop() is not None
                and not self._machine.is_idle()):
            self._warn_loop(call)  # (see LoopWaitWarner in lanequeue._ops)
        return self._idle_notice.wait_for(self._machine.is_idle, timeout)

    def drain(self, timeout_s: float | None = 0.0) -> bool:
        """Refuse new turns at once (a later ``submit`` raises DispatcherDrainingError),
        then block up to ``timeout_s`` seconds (None: no limit; 0: do not wait) for the
        running and pending turns to end. Returns True when nothing is left."""
        # (checked before draining: a refused call changes nothing)
        timeout = check_timeout(
            timeout_s, f"{type(self).__name__}.drain() argument 'timeout_s'")
        self._check_process()
        self._machine.drain()
        return self._wait_idle(timeout, "drain()")

    def close(self, *, cancel_pending: bool = True) -> None:
        super().close(cancel_pending=cancel_pending)
        if self._machine.is_idle():
            self._idle()
