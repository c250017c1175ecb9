"""What both dispatchers share: arguments, checks, and the calls that only forward to the
state machine (:mod:`lanequeue.dispatch._machine`). The faces add how a turn is run."""

from __future__ import annotations

import difflib
import inspect
import math
import os
from abc import abstractmethod
from collections.abc import Callable, Sequence
from threading import TIMEOUT_MAX
from typing import Any, NoReturn

from .._kinds import LANE_DEFAULT
from .._ops import LoopWaitWarner
from .._validate import (
    as_int,
    check_ageing,
    check_bool,
    check_key,
    check_priority,
    check_seconds,
    check_timeout,
    check_utf8,
    own_signatures,
    shown_number,
)
from ._machine import (
    BUSY_POLICIES,
    OVERFLOW_POLICIES,
    DispatchStats,
    Job,
    Machine,
    Ticket,
    Timer,
    counting_lanes,
)

__all__ = ["DEFAULT_LANES", "DispatcherBase", "check_busy", "check_fn", "check_int"]

#: ``submit``'s own keyword arguments: a keyword close to one of them is named in the
#: error (``dedupeid`` -> ``dedupe_id``), not sent to ``functools.partial``.
_SUBMIT_OPTIONS = ("busy", "dedupe_id", "priority", "timeout_s", "run_timeout_s")

#: The lanes every turn takes when a dispatcher is made without ``lanes``.
DEFAULT_LANES: tuple[str, ...] = ("session", "global")


def check_busy(value: object, name: str) -> str:
    if not isinstance(value, str):
        raise TypeError(f"{name} must be a str, not {type(value).__name__}")
    if value not in BUSY_POLICIES:
        raise ValueError(f"{name} must be one of {BUSY_POLICIES}, got {value!r}")
    return value


def check_int(value: object, name: str, least: int) -> int:
    value = as_int(value, name)
    if value < least:
        raise ValueError(f"{name} must be >= {least}, got {value}")
    return value


def check_fn(fn: object, awaits: bool, name: str = "fn") -> None:
    """``fn`` must be callable; a dispatcher that does not await (``awaits`` False, the
    thread face) refuses a coroutine function (calling it would only make a coroutine
    that never runs), and neither face takes an async generator function. ``name``:
    how the errors name the argument (with the call, e.g. ``"X.submit() argument 'fn'"``)."""
    if not callable(fn):
        raise TypeError(f"{name} must be callable, not {fn!r}")
    call = getattr(fn, "__call__", None)  # noqa: B004 (an object with an async __call__)
    if inspect.isasyncgenfunction(fn) or inspect.isasyncgenfunction(call):
        raise TypeError(f"{name} must not be an async generator function: {fn!r}")
    if not awaits and (inspect.iscoroutinefunction(fn) or inspect.iscoroutinefunction(call)):
        raise TypeError(f"{name} must be a plain function on ThreadDispatcher, not the "
                        f"coroutine function {fn!r} (use Dispatcher on asyncio to await it)")


class DispatcherBase(LoopWaitWarner):
    """The surface common to :class:`~lanequeue.Dispatcher` and
    :class:`~lanequeue.ThreadDispatcher` (see their docstrings).

    A blocking wait of the dispatcher's (a ticket's ``result``/``exception`` that has to
    wait; on threads ``drain``/``wait_idle``) from a thread that runs an asyncio event
    loop warns once per dispatcher (:class:`~lanequeue._ops.LoopWaitWarner`)."""

    _loop_stops = "maybe one that the turn needs"
    _loop_instead = "In async code await the ticket (await ticket works from any event loop)"

    _machine: Machine
    #: Whether a turn's awaitable result is awaited (asyncio) or refused (threads).
    _awaits: bool = False
    #: See ``Face._offload``: None, the shared dedupe window is asked inline (threads).
    _offload: Callable[[Callable[[], Any], Callable[[Any], None]], None] | None = None

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        # Argument errors name the public class (``Dispatcher.close()``), not this base.
        own_signatures(cls, DispatcherBase)

    def __init__(
        self,
        queue: Any,
        *,
        lanes: Sequence[str],
        busy: str,
        max_pending: int,
        overflow: str,
        on_drop: Callable[[list[Ticket]], Any] | None,
        dedupe_ttl_s: float,
        dedupe_max: int,
        debounce_s: float,
        max_wait_s: float | None,
        ageing_s: float | None,
        workers: int | None,
        dedupe_redis: Any = None,
        dedupe_prefix: str = "lanequeue",
    ) -> None:
        where = f"{type(self).__name__}() argument"  # every error below names the call
        if not callable(getattr(queue, "acquire_all", None)):
            raise TypeError(f"{where} 'queue' must be a lane queue with acquire_all(), "
                            f"not {queue!r}")
        if isinstance(lanes, (str, bytes)) or not isinstance(lanes, Sequence):
            raise TypeError(f"{where} 'lanes' must be a sequence of lane names, not {lanes!r}")
        names = tuple(lanes)
        try:  # the queue's own check of lane names (acquire_all's): what it would refuse
            # (no warning of the lanes' order: turns of one key never overlap, so none
            # waits for its key while holding another lane's permit)
            plan = queue._plan(names, warn=False)
        except KeyError as exc:
            given = " (the default: the lanes every turn takes)" if names == DEFAULT_LANES else ""
            raise KeyError(f"{where} 'lanes' {list(names)!r}{given}: {exc.args[0]}") from None
        except (TypeError, ValueError) as exc:
            raise type(exc)(f"{where} 'lanes': {exc}") from None
        objs = [queue[n] for n in names]
        # Every argument of the dispatcher is checked here, once, for both faces.
        busy = check_busy(busy, f"{where} 'busy'")
        max_pending = check_int(max_pending, f"{where} 'max_pending'", 0)
        if not isinstance(overflow, str):
            raise TypeError(f"{where} 'overflow' must be a str, not {type(overflow).__name__}")
        if overflow not in OVERFLOW_POLICIES:
            raise ValueError(f"{where} 'overflow' must be one of {OVERFLOW_POLICIES}, got "
                             f"{overflow!r}")
        if on_drop is not None and not callable(on_drop):
            raise TypeError(f"{where} 'on_drop' must be callable or None, not {on_drop!r}")
        # None, inf (or TIMEOUT_MAX and more): ids are remembered until dedupe_max pushes
        # them out.
        ttl_s = check_timeout(dedupe_ttl_s, f"{where} 'dedupe_ttl_s'")
        dedupe_max = check_int(dedupe_max, f"{where} 'dedupe_max'", 0)
        # A window must close: finite, and short enough for a timer.
        debounce = check_seconds(debounce_s, f"{where} 'debounce_s'", limit=TIMEOUT_MAX)
        max_wait = check_timeout(max_wait_s, f"{where} 'max_wait_s'")  # None, inf: no bound
        ageing = None if ageing_s is None else check_ageing(ageing_s, f"{where} 'ageing_s'")
        check_key(dedupe_prefix, f"{where} 'dedupe_prefix'")  # (used with dedupe_redis)
        self._pid = os.getpid()  # the process the dispatcher belongs to (see _check_process)
        self._queue = queue
        self._lanes = names
        self._lane_objs = objs
        from ..queue import QueueBase

        # A turn's acquire_all refuses a key a Redis lane cannot send: so does submit.
        self._utf8_keys = isinstance(queue, QueueBase) and plan.cores is None
        counting = counting_lanes(objs)
        slots: int | None = min((cap for _, cap in counting), default=None)
        gate = min(counting, key=lambda c: c[1])[0] if counting else None
        if workers is not None and (slots is None or workers < slots):
            slots, gate = workers, "workers"
        timeouts = [t for t in (getattr(x, "timeout_s", None) for x in objs) if t is not None]
        window = None
        if dedupe_redis is not None:
            from ._redis import RedisDedupeWindow

            if not ttl_s:  # 0, or None (no limit: None, inf, or past TIMEOUT_MAX)
                raise ValueError(
                    f"{where} 'dedupe_ttl_s' must be > 0 and at most {TIMEOUT_MAX:.0f} "
                    "seconds (threading.TIMEOUT_MAX) with dedupe_redis: a shared dedupe "
                    "window keeps each id in Redis for that long, so it has no 'no limit'; "
                    f"got {shown_number(dedupe_ttl_s)}")
            window = RedisDedupeWindow(dedupe_redis, dedupe_prefix, ttl_s, where)
        self._machine = Machine(
            self,
            slots=slots,
            gate_lane=gate,
            default_timeout_s=min(timeouts) if timeouts else None,
            busy=busy,
            max_pending=max_pending,
            overflow=overflow,
            on_drop=on_drop,
            dedupe_ttl_s=math.inf if ttl_s is None else ttl_s,
            dedupe_max=dedupe_max,
            debounce_s=debounce,
            max_wait_s=max_wait,
            ageing_s=ageing,
            window=window,
        )

    # -- the face's part (overridden) ------------------------------------------------------

    @abstractmethod
    def _now(self) -> float:
        ...

    @abstractmethod
    def _call_later(self, delay: float, fn: Callable[[], None]) -> Timer:
        ...

    @abstractmethod
    def _launch(self, job: Job) -> None:
        ...

    def _interrupt(self, job: Job) -> None:
        """Threads only see the turn's cancel event (set by the machine)."""

    def _run_under(self, job: Job, multi: Any) -> None:
        """The turn of ``job`` runs under ``multi`` (its ``acquire_all``, entered): the
        turn reads its fencing tokens there (:attr:`Turn.fencing_tokens`), and each
        Redis hold in it tells the machine when its lease is lost (:meth:`_lease_lost`)."""
        job.turn._multi = multi
        for got in multi._taken:
            if type(got) is not int:  # (an in-process lane's token: no lease)
                watch = getattr(got, "_watch_loss", None)
                if watch is not None:
                    watch(lambda: self._lease_lost(job))

    def _lease_lost(self, job: Job) -> None:
        """A lease of ``job``'s turn was lost (called on the thread that noticed it)."""
        self._machine.lease_lost(job)

    @abstractmethod
    def _idle(self) -> None:
        ...

    def _check_caller(self) -> None:
        """Face-specific check of the calling thread/loop (RuntimeError if wrong)."""

    def _check_process(self) -> None:
        """RuntimeError in a forked child: the dispatcher's turns, tickets, threads and
        tasks are its parent's, and its dedupe table speaks for the parent's turns."""
        if self._pid != os.getpid():
            raise RuntimeError(
                f"this {type(self).__name__} was made in process {self._pid}, not in this "
                f"forked child ({os.getpid()}): a dispatcher belongs to the process that "
                "made it; make a new one in the child")

    # -- the common surface -----------------------------------------------------------------

    def submit(
        self,
        key: str,
        fn: Callable[..., Any],
        *args: Any,
        busy: str | None = None,
        dedupe_id: str | None = None,
        priority: int = 0,
        timeout_s: Any = LANE_DEFAULT,
        run_timeout_s: float | None = None,
        **fn_kwargs: NoReturn,
    ) -> Ticket:
        """Submit one turn of ``key``: ``fn(*args)``, run under the dispatcher's lanes.

        A plain (non-async) call that returns the :class:`Ticket` at once (on
        ``ThreadDispatcher`` with ``dedupe_redis``, after one round trip to the shared
        window for a new ``dedupe_id``).

        Args:
            key: the conversation's key (non-empty ``str``).
            fn: the turn's function; under ``collect`` it is called with the list of the
                merged turns' payloads (one payload per submit), in submit order. On
                ``ThreadDispatcher`` a plain function (a coroutine function is a
                TypeError here); on ``Dispatcher`` a coroutine function (awaited) or a
                plain function (run on the loop). An async generator function is refused.
            args: its arguments (the payload, for ``collect`` and ``steer``). ``fn``
                takes no keyword arguments from ``submit``: any other keyword is a
                TypeError that says so (bind them with ``functools.partial``; a type
                checker flags them too).
            busy: this submit's busy policy (default: the dispatcher's): ``"enqueue"``,
                ``"reject"``, ``"steer"``, ``"interrupt"``, ``"replace"``, ``"collect"``.
            dedupe_id: an idempotency id, scoped per key (the same id under another
                key is another turn, as a chat's message ids are per chat): a repeat for
                the same key within ``dedupe_ttl_s`` returns the same ``Ticket`` object
                and runs nothing. With ``dedupe_redis``, a submit
                that the busy policy or ``max_pending`` rejects at once (``"reject"`` on
                a busy key, a full line under ``"reject_new"``) ends ``rejected`` without
                claiming the id in the shared window, and a submit that raises leaves no
                claim (a failed claim is given back in the background, see
                :mod:`lanequeue.dispatch._redis`). Race: if the key becomes busy while
                the claim is in flight, the turn is rejected and its claim given back; a
                copy another dispatcher received meanwhile has ended ``deduped``.
            priority: an ``int`` in ``[-2**31, 2**31 - 1]`` (``acquire_all``'s range and
                check); a larger value goes first among waiting turns of
                different keys: at the dispatcher's gate, and in the line of every
                in-process counting lane the turn waits for (README, "Priority"); a
                key's own turns stay FIFO.
            timeout_s: seconds from submit to start, pending time included (default: the
                smallest ``timeout_s`` of the lanes; None or ``math.inf``: no limit).
                Past it the ticket ends ``timed_out`` ("start timeout").
            run_timeout_s: seconds the turn may run (None: no limit); past it the turn
                is cancelled (its cancel event set; an asyncio turn's task cancelled) and
                the ticket ends ``timed_out`` ("run timeout") once ``fn`` returns. A turn
                carrying several tickets (merged, or steered and taken) ends at the
                earliest of their bounds, a steered ticket's counted from when the turn
                took it from its inbox.

        Returns:
            the new :class:`Ticket`, or the original one for a repeated ``dedupe_id``.

        Raises:
            TypeError/ValueError: for a bad argument, naming it.
            DispatcherDrainingError: after ``drain()`` or ``close()``.
            RuntimeError: in a forked child of the process that made the dispatcher
                (also ``cancel``, ``clear``, ``close`` and ``drain``): make a new one
                there.
            LaneBackendError: (``ThreadDispatcher``) the shared dedupe window
                (``dedupe_redis``) failed or did not answer within its bound (the
                client's ``socket_timeout``, 5 s without one); nothing was submitted. On
                ``Dispatcher`` the window is asked off the loop after ``submit``
                returned: such a failure ends that ticket ``failed`` with the
                LaneBackendError.
            RuntimeError: (asyncio) outside the dispatcher's event loop.
        """
        where = f"{type(self).__name__}.submit() argument"
        if fn_kwargs:
            name = next(iter(fn_kwargs))
            close = difflib.get_close_matches(name, _SUBMIT_OPTIONS, n=1)
            raise TypeError(
                f"{type(self).__name__}.submit() got an unexpected keyword argument "
                f"{name!r}: " + (
                    f"did you mean {close[0]!r}?" if close else
                    "submit passes fn only positional arguments, fn(*args); bind keyword "
                    f"arguments first, as submit(key, functools.partial(fn, {name}=...), "
                    "*args)"))
        key = check_key(key, f"{where} 'key'")
        if self._utf8_keys and not key.isascii():
            check_utf8(key, f"{where} 'key'")
        check_fn(fn, self._awaits, f"{where} 'fn'")
        if busy is not None:
            busy = check_busy(busy, f"{where} 'busy'")
        if dedupe_id is not None:
            dedupe_id = self._check_dedupe_id(dedupe_id, f"{where} 'dedupe_id'")
            if (self._machine.window is not None and not self._utf8_keys
                    and not key.isascii()):
                # The shared window's claim names the key too (ids are scoped per key).
                check_utf8(key, f"{where} 'key'")
        priority = check_priority(priority, f"{where} 'priority'")
        if timeout_s is not LANE_DEFAULT:
            timeout_s = check_timeout(timeout_s, f"{where} 'timeout_s'")
        run_timeout = check_timeout(run_timeout_s, f"{where} 'run_timeout_s'")
        self._check_process()
        self._check_caller()
        ticket = self._machine.submit(key, fn, args, busy, dedupe_id, priority, timeout_s,
                                      run_timeout, LANE_DEFAULT)
        self._submitted(ticket)
        return ticket

    def _check_dedupe_id(self, dedupe_id: object, name: str) -> str:
        """``dedupe_id`` as a plain ``str``: TypeError if it is not a ``str``, ValueError if
        it is empty or, with a shared window (``dedupe_redis``), cannot be sent as UTF-8
        (a lone surrogate), at the call, as a Redis lane refuses such a key."""
        if self._machine.window is not None:  # (redis-py is installed: it made the window)
            from ..redis._keys import plain_key  # the Redis lanes' own check of a key

            return plain_key(dedupe_id, name)
        return check_key(dedupe_id, name)

    def _submitted(self, ticket: Ticket) -> None:
        """The face's look at a new ticket (asyncio: watch the loop's shutdown)."""

    def cancel(self, ticket: Ticket) -> bool:
        """End ``ticket`` as ``cancelled``: at once if it has not started; if it runs, its
        turn is cancelled (cancel event; an asyncio task is cancelled too) and the ticket
        ends when ``fn`` returns. Returns False if the ticket had already ended."""
        if not isinstance(ticket, Ticket) or ticket._machine is not self._machine:
            raise TypeError(f"{type(self).__name__}.cancel() argument 'ticket' must be a "
                            f"Ticket of this dispatcher, not {ticket!r}")
        self._check_process()
        self._check_caller()
        return self._machine.cancel(ticket)

    def clear(self, key: str) -> int:
        """End every turn of ``key`` that has not started as ``cancelled`` ("cleared");
        the running turn goes on. Returns how many ended."""
        key = check_key(key, f"{type(self).__name__}.clear() argument 'key'")
        self._check_process()
        self._check_caller()
        return self._machine.clear(key)

    def pending(self, key: str) -> int:
        """Turns of ``key`` not started yet (the running turn is not counted)."""
        key = check_key(key, f"{type(self).__name__}.pending() argument 'key'")
        return self._machine.pending(key)

    def close(self, *, cancel_pending: bool = True) -> None:
        """Refuse new turns (submit raises DispatcherDrainingError). With
        ``cancel_pending`` (default), end every turn not started as ``cancelled``
        ("closed") and cancel the running turns likewise (they end when ``fn``
        returns); else let them run. Does not wait: use ``wait_idle`` for that."""
        cancel_pending = check_bool(cancel_pending, "cancel_pending")
        self._check_process()
        self._check_caller()
        self._machine.close(cancel_pending)

    def snapshot(self) -> dict[str, Any]:
        """A JSON-ready picture: ``keys`` maps each key with work to ``running`` (bool),
        ``running_s`` (seconds its turn has run, or None), ``pending`` (turns not started),
        ``oldest_wait_s`` (seconds the oldest of them has waited) and ``blocked_by``
        (why they wait: ``"draining"``: one of the dispatcher's lanes is draining
        (``lane.drain()``, ``lane.close()``, the queue's ``drain``) and the key's next
        turn has not entered ``acquire_all`` yet, so the lane will refuse it (its ticket
        ends ``failed`` with LaneDrainingError); ``"key"``: the key's own turn runs;
        the gate's name (the smallest counting lane, or ``"workers"``): waiting for the
        dispatcher's turn at the counting lanes; ``"lanes"``: waiting inside
        ``acquire_all`` (a draining lane still serves the waiters already in its line);
        ``"debounce"``: a collect window; ``"dedupe"``: the shared dedupe window has
        not answered yet; None: nothing waits); plus ``draining``, ``closed``,
        ``slots`` (turns that may be past the gate at once; None: no gate),
        ``admitted`` (past it now), ``ready`` (waiting at it) and ``dedupe_entries``
        (ids remembered). The
        dispatcher's own ``drain()`` / ``close(cancel_pending=False)`` block nothing:
        its pending turns still run (see ``draining`` at the top level)."""
        return self._machine.snapshot(
            any(getattr(lane, "draining", False) is True for lane in self._lane_objs))

    @property
    def stats(self) -> DispatchStats:
        """An atomic snapshot of the counters (:class:`DispatchStats`)."""
        return self._machine.stats()

    @property
    def draining(self) -> bool:
        """True once ``drain()`` or ``close()`` was called."""
        return self._machine.draining

    def __repr__(self) -> str:
        s = self._machine.stats()
        return (f"<{type(self).__name__} lanes={list(self._lanes)} busy={self._machine.busy!r}"
                f" pending={s.pending} running={s.running}>")
