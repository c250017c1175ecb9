"""The kinds of in-process lane, the hold, and the defaults: what every in-process lane
shows, whatever face it wears (threads or asyncio).

A face class is one of the two *kinds* below (counting or per-key) combined with one way of
parking waiters (:mod:`lanequeue.lanes` for threads, :mod:`lanequeue.aio` for tasks). The
kinds own construction, argument checks and the read-only views; the cores in
:mod:`lanequeue._core` own all state.
"""

from __future__ import annotations

import math
import sys
import time
import warnings
import weakref
from collections.abc import Callable
from typing import Any, ClassVar, Generic, TypeVar

from ._core import (
    DEFAULT_AGEING_S,
    Clock,
    CountingCore,
    LaneStats,
    SessionCore,
    parked_grant,
)
from ._errors import shown
from ._obs import LaneMetrics
from ._ops import DEFAULT_WARN_AFTER_S, RELEASED, LaneOps, OnWait
from ._validate import (
    argument_of,
    check_ageing,
    check_count,
    check_key,
    check_no_priority,
    check_priority,
    check_timeout,
    own_signatures,
)
from .contract import not_held_error

__all__ = [
    "DEFAULT_AGEING_S",
    "DEFAULT_WARN_AFTER_S",
    "DEFAULT_GLOBAL_CONCURRENCY",
    "DEFAULT_IDLE_TIMEOUT_S",
    "DEFAULT_MAX_CONCURRENT",
    "DEFAULT_MAX_SESSIONS",
    "DEFAULT_TIMEOUT_S",
    "CountingKind",
    "Hold",
    "LaneKind",
    "OnWait",
    "SessionKind",
    "warn_dropped",
]

#: Default wait of a lane, in seconds (the source design's value).
DEFAULT_TIMEOUT_S = 300.0
#: Default permits of a counting lane.
DEFAULT_MAX_CONCURRENT = 4
#: Permits of the "global" lane made by ``build_default_lanes()``.
DEFAULT_GLOBAL_CONCURRENCY = 8
#: Soft cap on the entries of a per-key lane.
DEFAULT_MAX_SESSIONS = 256
#: Seconds an idle per-key entry is kept.
DEFAULT_IDLE_TIMEOUT_S = 3600.0


class _Default:
    """Marker for "use the lane's own timeout"."""

    __slots__ = ()

    def __repr__(self) -> str:
        return "<lane default>"


LANE_DEFAULT: Any = _Default()

C = TypeVar("C", CountingCore, SessionCore)


class LaneKind(LaneOps, Generic[C]):
    """Name, timeout, read-only views and operations shared by every in-process lane.

    Every error of a constructor names the public class and the argument
    (``Lane() argument 'max_concurrent' must be >= 1, got 0``), or, for a lane a queue
    builds, the queue's call (``LaneQueue.add_lane() argument 'max_concurrent' ...``: see
    :func:`lanequeue._validate.made_by`). Python's own errors for a missing or unknown
    argument name the public class too (``Lane.__init__() missing 1 required
    positional argument: 'name'``): each public class gets its own copy of the methods
    it inherits from the internal bases (:func:`lanequeue._validate.own_signatures`).
    """

    _core: C
    _kind = ""  # the ``kind`` label of the metrics: "counting" or "session"

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if cls.__module__ != __name__:  # the kinds below are internal themselves
            own_signatures(cls, LaneKind, CountingKind, SessionKind, LaneOps)

    def __init__(
        self,
        name: str,
        timeout_s: float | None,
        clock: Clock,
        warn_after_s: float | None = DEFAULT_WARN_AFTER_S,
        on_wait: OnWait | None = None,
        warn_hold_s: float | None = None,
    ) -> None:
        where = argument_of(f"{type(self).__name__}()")
        self.name = check_key(name, f"{where} 'name'")
        self.timeout_s: float | None = check_timeout(timeout_s, f"{where} 'timeout_s'")
        if not callable(clock):
            raise TypeError(
                f"{where} 'clock' must be a callable returning seconds, not {clock!r}"
            )
        self._ops_init(where, warn_after_s, on_wait, warn_hold_s)
        # What ``acquire`` makes (the face's ``_hold_class``), read from the instance: an
        # instance attribute is a specialised load on CPython 3.11, a class one is not.
        self._new_hold: type[Any] = type(self)._hold_class  # type: ignore[attr-defined]
        # The class a hold of it takes once left (its ``_ended_class``, see _DropWatch),
        # loaded by the holds' exits from here for the same reason.
        self._ended_hold: type[Any] = self._new_hold._ended_class

    #: The core's ``waits_at_grant`` from the start: True for a face whose waiters'
    #: ``since`` is on the core's clock (threads); the asyncio faces set it when they
    #: bind a loop (its clock may be another).
    _waits_at_grant = False

    # -- operations: slow waits, stuck holds, metrics, lifecycle -------------------------

    def _wait_clock(self) -> float:
        """Now, on the clock the face measures waits with."""
        return self._core._clock()

    def _hold_list(self) -> list[tuple[str, int, float]]:
        return self._core.hold_list()

    def _hold_limit(self) -> float | None:
        core = getattr(self, "_core", None)
        return self._warn_hold_s if core is None else core.hold_warn_s

    def _watch_holds(self, limit: float | None) -> None:
        core = getattr(self, "_core", None)
        if core is None:  # (the constructor: its core, made next, watches this)
            self._warn_hold_s = limit
            return
        core.watch_holds(limit, None if limit is None else weakref.WeakMethod(
            self._hold_ended))

    def _hold_ended(self, key: str, token: int, held_s: float,
                    ending: str = RELEASED) -> None:
        try:
            super()._hold_ended(key, token, held_s, ending)
        finally:  # (the report is handled: see _pending_ends)
            self._core.reports_pending.discard((key, token))

    def _pending_ends(self) -> set[tuple[str, int]]:
        return set(self._core.reports_pending)

    def _held_now(self, key: str, token: int) -> bool:
        return self._core.owns(key, token)  # (no lock: one read of the entry)

    def _still_held(self, key: str, token: int) -> bool:
        # From the reporter thread. The release that queued this report held the core's
        # lock while it did, and commits before it lets go of it: a hold still held once
        # the lock is ours was not released (an interrupt stopped that release after the
        # report was queued; see "Interrupts" in lanequeue._core). Its real end, a
        # release or the drop of its hold, reports it then; logged now, "it has been
        # released" would be false.
        with self._core._lock:
            return self._held_now(key, token)

    def _holder_age(self, key: str) -> float | None:
        return self._core.holder_age(key)

    def metrics_snapshot(self) -> list[LaneMetrics]:
        """The lane's metrics now (one :class:`lanequeue.LaneMetrics`), for an exporter
        (:mod:`lanequeue.metrics`); read under the lane's lock, O(keys with waiters).
        Also logs the holds past ``warn_hold_s`` not logged yet. Thread-safe."""
        core = self._core
        stats, wait, hold, sessions = core.metrics_read()
        oldest = self._oldest_wait_s()
        if self.warn_hold_s is not None:
            self._check_holds(core.hold_list())
        return [LaneMetrics(
            lane=self.name,
            kind=self._kind,
            stats=stats,
            wait=wait,
            hold=hold,
            sessions=sessions,
            oldest_wait_s=oldest,
        )]

    def _oldest_wait_s(self) -> float:
        """Seconds the longest current waiter has waited (0.0: nobody waits)."""
        oldest = self._core.oldest_wait_since()
        return 0.0 if oldest is None else max(0.0, self._wait_clock() - oldest)

    def track_holds(self) -> None:
        """Start observing hold times for ``lanequeue_hold_seconds`` (idempotent).

        Off until an exporter calls it, since it costs an append per release, and on a
        counting lane a clock read per release too.
        """
        self._core.track_holds()

    @property
    def draining(self) -> bool:
        """True once :meth:`drain` or :meth:`close` was called: acquisitions are refused."""
        return self._core.draining

    def _idle(self) -> bool:
        return self._core.holders() == 0 and self._core.waiting == 0

    def _start_drain(self, cancel_waiting: bool) -> None:
        if cancel_waiting:
            self._check_waker()
        core = self._core
        with core._lock:  # a take that checked the flag under the lock has granted by now
            core.draining = True
        if cancel_waiting:
            core.end_waiters(None, cleared=False)

    def clear(self, key: str) -> int:
        """End every wait for ``key``: each waiter raises :class:`LaneClearedError`.

        On a counting lane, the waiters that asked for ``key``. A holder is never torn
        away: the key's current hold lasts until it is released. Returns how many waits
        were ended. Never waits; thread-safe. Raises TypeError/ValueError for a bad key;
        on an asyncio lane, RuntimeError when not called from the lane's event loop.

        Example: a conversation is abandoned; its queued turns go.

            >>> import threading, time
            >>> from lanequeue import LaneClearedError, SessionLane
            >>> sessions = SessionLane()
            >>> sessions.try_acquire("gateway:web:42")
            True
            >>> def queued_turn():
            ...     try:
            ...         sessions.acquire_timeout("gateway:web:42", 30)
            ...     except LaneClearedError:
            ...         print("cleared")
            >>> turn = threading.Thread(target=queued_turn)
            >>> turn.start()
            >>> while sessions.waiting_for("gateway:web:42") == 0:
            ...     time.sleep(0.001)
            >>> sessions.clear("gateway:web:42")
            1
            >>> turn.join()
            cleared
            >>> sessions.is_held("gateway:web:42")  # the holder keeps its permit
            True
        """
        key = check_key(key)
        self._check_waker()
        return self._core.end_waiters(key, cleared=True)

    @property
    def active_count(self) -> int:
        """Permits held now (for a per-key lane: keys held now)."""
        return self._core.holders()

    @property
    def waiting(self) -> int:
        """Callers waiting now, over all keys."""
        return self._core.waiting

    @property
    def stats(self) -> LaneStats:
        """An atomic snapshot of the counters (:class:`LaneStats`). A per-key lane first
        evicts its expired idle entries, as every view does (``status()``,
        ``metrics_snapshot()``, ``session_count``), so ``evicted`` counts them."""
        return self._core.stats()

    def statistics(self) -> LaneStats:
        """Same as :attr:`stats` (the trio/anyio spelling)."""
        return self._core.stats()

    def get_active(self) -> dict[str, float]:
        """Each key held now -> seconds held so far (oldest hold of the key, on a
        counting lane). A new ``dict``; thread-safe."""
        return self._core.held_since()

    def status(self) -> dict[str, Any]:
        """A JSON-ready picture of the lane: kind, limits, holders, waiters, counters.
        Also logs the holds past ``warn_hold_s`` not logged yet."""
        if self.warn_hold_s is not None:
            self._check_holds(self._core.hold_list())
        stats, sessions = self._core.view()  # one instant (see Core.metrics_read)
        return {
            "kind": type(self).__name__,
            "name": self.name,
            "timeout_s": self.timeout_s,
            "active": stats.holders,
            "waiting": stats.waiters,
            "stats": stats.to_dict(),
            **self._limits(sessions),
        }

    def _limits(self, sessions: int | None = None) -> dict[str, Any]:
        """The kind's limits and sizes for ``status()`` and ``repr`` (``sessions``: the
        live entries read with the counters, else read now)."""
        return {}

    def __repr__(self) -> str:
        extra = " ".join(f"{k}={v}" for k, v in self._limits().items())
        return (
            f"<{type(self).__name__} {self.name!r} {extra} active={self._core.holders()} "
            f"waiting={self._core.waiting}>"
        )


class CountingKind(LaneKind[CountingCore]):
    """A counting lane: at most ``max_concurrent`` holders over all keys; waiters served
    by priority with ageing, FIFO among equals (all FIFO while every priority is 0)."""

    _kind = "counting"

    def __init__(
        self,
        name: str,
        *,
        max_concurrent: int = DEFAULT_MAX_CONCURRENT,
        timeout_s: float | None = DEFAULT_TIMEOUT_S,
        clock: Clock = time.monotonic,
        warn_after_s: float | None = DEFAULT_WARN_AFTER_S,
        on_wait: OnWait | None = None,
        warn_hold_s: float | None = None,
        ageing_s: float = DEFAULT_AGEING_S,
    ) -> None:
        super().__init__(name, timeout_s, clock, warn_after_s, on_wait, warn_hold_s)
        where = argument_of(f"{type(self).__name__}()")
        ageing = check_ageing(ageing_s, f"{where} 'ageing_s'")
        self._core = CountingCore(
            self.name, check_count(max_concurrent, f"{where} 'max_concurrent'"), clock,
            ageing,
        )
        self._core.waits_at_grant = self._waits_at_grant
        self._watch_holds(self._warn_hold_s)  # (the core exists from here)

    @property
    def ageing_s(self) -> float:
        """Seconds of waiting that raise a waiter by one priority level."""
        return self._core.ageing_s

    def _rank(self, priority: object) -> int:
        """``priority`` checked for an acquire (TypeError/ValueError naming it)."""
        return check_priority(priority)

    @property
    def max_concurrent(self) -> int:
        """The lane's number of permits."""
        return self._core.capacity

    @property
    def available(self) -> int:
        """Permits free now (``max_concurrent - active_count``; see the contract)."""
        return self._core.capacity - self._core.holders()

    def _holds_of(self, key: str) -> int:
        """Permits held now by ``key`` (the face publishes it as ``holds_of``)."""
        return self._core.holds_of(check_key(key))

    def _lane_status(self) -> dict[str, Any]:
        """The lane-wide figures (the face publishes them as ``lane_status``): ``active``,
        ``waiting``, ``available``, ``keys`` (key -> seconds its oldest hold has lasted),
        ``oldest_wait_s`` (seconds the longest current waiter has waited; 0.0: none),
        ``max_concurrent``. In-process the lane object is the whole lane."""
        return {
            "active": self._core.holders(),
            "waiting": self._core.waiting,
            "available": self.available,
            "keys": self._core.held_since(),
            "oldest_wait_s": self._oldest_wait_s(),
            "max_concurrent": self._core.capacity,
        }

    def _limits(self, sessions: int | None = None) -> dict[str, Any]:
        return {"max_concurrent": self._core.capacity, "available": self.available}


class SessionKind(LaneKind[SessionCore]):
    """A per-key lane: one holder per key, FIFO per key, keys independent."""

    _kind = "session"

    def __init__(
        self,
        name: str = "session",
        *,
        max_sessions: int = DEFAULT_MAX_SESSIONS,
        idle_timeout_s: float | None = DEFAULT_IDLE_TIMEOUT_S,
        timeout_s: float | None = DEFAULT_TIMEOUT_S,
        clock: Clock = time.monotonic,
        warn_after_s: float | None = DEFAULT_WARN_AFTER_S,
        on_wait: OnWait | None = None,
        warn_hold_s: float | None = None,
    ) -> None:
        super().__init__(name, timeout_s, clock, warn_after_s, on_wait, warn_hold_s)
        where = argument_of(f"{type(self).__name__}()")
        idle = check_timeout(idle_timeout_s, f"{where} 'idle_timeout_s'")
        self._core = SessionCore(
            self.name,
            check_count(max_sessions, f"{where} 'max_sessions'"),
            math.inf if idle is None else idle,
            clock,
        )
        self._core.waits_at_grant = self._waits_at_grant
        self._watch_holds(self._warn_hold_s)  # (the core exists from here)

    def _rank(self, priority: object) -> int:
        """A per-key lane has no priority: its waiters are one key's turns, FIFO."""
        return check_no_priority(
            priority, type(self).__name__, "a key's waiters are served in arrival order; "
            "priority orders the waiters of a counting lane")

    @property
    def max_sessions(self) -> int:
        """The soft cap on entries: held entries are never evicted to honour it, and idle
        entries over it (after a burst of held keys ends) go oldest first at the calls
        that evict (see :attr:`idle_timeout_s`)."""
        return self._core.max_sessions

    @property
    def idle_timeout_s(self) -> float:
        """Seconds an entry with no holder and no waiter is kept (``math.inf`` when the
        lane was made with None).

        No timer drops an entry past it: the next calls that evict do (counted in
        ``stats.evicted``). They evict the entries due: idle entries past
        ``idle_timeout_s``, and the oldest idle entries while more than ``max_sessions``
        are alive (at ``max_sessions``, an acquisition also makes room for its new
        entry). These calls are the acquisition of a key that has no entry
        (``acquire``, ``acquire_timeout``, ``try_acquire``, ``try_acquire_nowait``, a
        queue's ``acquire_all``), which evicts up to 64 entries due (more than the one
        it adds, so a backlog after a burst of keys only shrinks, and no call holds the
        lane's lock for longer), and ``cleanup_idle()`` and every view that counts
        entries or evictions, before it reads, which evict every entry due, 64 per hold
        of the lock: ``session_count``, ``stats`` and ``statistics()``, ``status()`` (and
        so a queue's ``status()`` and ``repr(lane)``) and ``metrics_snapshot()`` (and so
        each Prometheus scrape and OpenTelemetry collection). Expired entries go whether
        or not the registry is at ``max_sessions``. Other calls (``is_held``,
        ``waiting_for``, ``get_active``, ``active_count``, ``waiting``, ``stuck()``,
        releases) leave expired entries in place, unseen. With 0 an entry expires as
        soon as it goes idle, so no view counts it from then on. With None it is kept
        until a new key needs its room at ``max_sessions`` (the oldest idle entry goes
        first)."""
        return self._core.idle_timeout_s

    @property
    def session_count(self) -> int:
        """Entries alive now, held or idle (expired idle entries are dropped first)."""
        return self._core.session_count()

    def cleanup_idle(self) -> int:
        """Evict the idle entries older than ``idle_timeout_s``, and the oldest idle
        entries over ``max_sessions``, now; return how many. Takes the lane's lock for
        64 entries at a time, so other keys' callers are not held up by a long backlog.

        Not needed for bounded memory (new keys evict expired entries as they come), but
        handy for a periodic housekeeping call or a test.
        """
        return self._core.cleanup_idle()

    def _is_held(self, key: str) -> bool:
        """True while ``key`` has a holder (the face publishes it as ``is_held``)."""
        return self._core.is_held(check_key(key))

    def _waiting_for(self, key: str) -> int:
        """Callers in line for ``key`` now (the face publishes it as ``waiting_for``)."""
        return self._core.waiting_for(check_key(key))

    def _limits(self, sessions: int | None = None) -> dict[str, Any]:
        return {
            "max_sessions": self._core.max_sessions,
            "sessions": self._core.session_count() if sessions is None else sessions,
        }


class Hold:
    """One permit of one lane for one key, from grant to release.

    ``token`` (also ``fencing_token``) is the grant's number: it grows with every grant of
    the lane, so a downstream store can refuse writes carrying an older token. ``held`` is
    True while the lane still grants this hold to its caller: from the grant until it is
    released, or ended by someone else (``manual_release(key)``). ``release()`` ends the
    hold once and raises NotOwnerError when the hold is not the caller's (any more);
    leaving the ``with`` block after an early ``release()`` is silent, and a hold never
    ends anyone else's hold. Holds are made by ``lane.acquire(key)`` and by a queue's
    ``acquire_all``; do not build them yourself.
    """

    __slots__ = ("lane", "key", "_token", "_timeout_s", "_parked")

    lane: Any
    _is_multi: ClassVar[bool] = False  # (a MultiHold: see lanequeue._core.record)
    # ``_parked``: (its waiter, 0) once its acquire parked (see parked_grant); None once
    # its enter took the general path; unset before (never entered, or taken by the
    # enter's own step, which stores the token).
    _parked: tuple[Any, int] | None

    def __init__(self, lane: Any, key: str, timeout_s: float | None, token: int = 0) -> None:
        self.lane = lane
        self.key = key
        # The grant's token while held; its negation once released; 0 before the grant.
        self._token = token
        self._timeout_s = timeout_s

    @property
    def token(self) -> int:
        """The grant's number; 0 before the hold is granted."""
        return abs(self._token)

    @token.setter
    def token(self, value: int) -> None:
        self._token = value

    @property
    def fencing_token(self) -> int:
        """Same as :attr:`token`: an integer that grows with every grant of the lane (for
        a per-key lane: with every grant, so also with every grant of this key)."""
        return abs(self._token)

    @property
    def held(self) -> bool:
        """True while this hold is the caller's: granted, not released through the hold,
        and not ended by someone else (``manual_release(key)``). Read from the lane, which
        knows the token of every hold; O(1), never waits."""
        token = self._token
        return token > 0 and self.lane._core.owns(self.key, token)

    def release(self) -> bool:
        """End this hold; return True. Never waits.

        Raises:
            NotOwnerError: the hold is not the caller's (any more): never granted,
                released already, or ended by someone else (``manual_release(key)``).
                Nothing is released then, and nothing is logged (the error is the
                report); a hold that was granted counts once in
                ``stats.unmatched_releases`` (a release that matched no hold), one never
                granted counts nothing.
            RuntimeError: (asyncio lanes) not called from the lane's event loop; the
                hold is left exactly as it was (still held, released by leaving the
                block).
        """
        token = self._token
        lane = self.lane
        if token > 0:
            lane._check_waker()  # may refuse: before any change
            self._token = -token
            if lane._core.release(self.key, token):
                return True
            why = "it was ended by someone else (manual_release)"
        elif token < 0:
            lane._check_waker()
            lane._core.count_unmatched()
            why = "it was released already"
        else:
            why = "it was never granted"
        raise not_held_error(lane.name, self.key, abs(token), why)

    def __repr__(self) -> str:
        # The public class (ThreadHold for the per-key lane's own internal subclass).
        kind = next(c.__name__ for c in type(self).__mro__
                    if issubclass(c, Hold) and not c.__name__.startswith("_"))
        state = "held" if self.held else ("released" if self._token else "not granted")
        return f"<{kind} lane={self.lane.name!r} key={shown(self.key)} token={self.token} {state}>"


class _DropWatch:
    """The finalizer of an in-process hold (a mixin of the classes ``acquire`` makes):
    a hold garbage-collected while held is recorded with the lane's core
    (``_dropped.append``, one C call and the finalizer's first: an interrupt lands before
    it or after it), which ends it at the lane's next operation; the lane is asked to
    run that operation now if it can (``_dropped_hold``: a thread lane when its core's
    lock is free, since a finalizer may run while this thread holds it, else the
    settler thread once the lock is free; an asyncio lane on its loop), so a waiter
    already parked gets the permit at once instead of at its timeout. The hold is
    then marked ended (a block left later, by a generator collected in the same
    reference cycle after it, releases nothing and counts no
    unmatched release), and :func:`warn_dropped` warns: recorded first, so the permit
    comes back even when warnings are turned into errors (an error in a finalizer is
    only reported). Recording a token the core no longer holds is harmless: the lane's
    next operation skips it quietly. ``acquire_all``'s finalizer does the same per lane
    (:class:`lanequeue.queue._MultiDropWatch`).

    A hold that ends by leaving its block changes its class to its face's public hold
    class (``_ended_class``: :class:`lanequeue.ThreadHold`, :class:`lanequeue.AsyncHold`,
    :class:`lanequeue.MultiHold`'s plain twin), the same class without this finalizer:
    from then on nothing can drop it, and a finalizer is a Python call at every hold's
    end (about 7% of an uncontended cycle), paid now only by the holds that are never
    left. The store is the exit's last step: an interrupt before it leaves the
    finalizer, which then finds the hold ended and does nothing.
    """

    __slots__ = ()

    # Made by ``acquire`` as ``cls()`` and filled with slot stores: ``object.__init__``
    # (a C slot, no frame) instead of Hold's, and no ``object.__new__(cls)`` call, whose
    # wrapper checks its argument and slices a tuple (about 20% of the cost of making one).
    __init__ = object.__init__

    lane: Any
    key: str
    _token: int
    _parked: tuple[Any, int] | None

    def __del__(self, _finalizing: Callable[[], bool] = sys.is_finalizing) -> None:
        try:
            token = self._token
        except AttributeError:  # interrupted while acquire() was making it
            return
        if token > 0:
            # Held: recorded by this frame's first call (one C call; see the class), so
            # an interrupt can lose the drop only at this frame's very entry.
            self.lane._core._dropped.append((self.key, token))
        elif token < 0:
            # Marked released. Its release may not have run: an interrupt that stopped
            # the exit between the mark and the release leaves the core holding this
            # token, which no other hold ever has (tokens are never reused). The core's
            # ``owns`` reads without its lock (a finalizer must not take it).
            token = -token
            if not self.lane._core.owns(self.key, token):
                return
            self.lane._core._dropped.append((self.key, token))
        else:
            if _finalizing():  # the interpreter ends (see below)
                return
            # Never granted, or granted to its parked waiter and recorded nowhere: the
            # wait's handler was stopped by a second interrupt (see parked_grant).
            token = parked_grant(self, 0)
            if not token:
                try:
                    self._parked  # noqa: B018  (set by the general path of every enter)
                except AttributeError:  # never entered: acquire() without with
                    warn_unentered(f"{type(self.lane).__name__} {self.lane.name!r}", self.key,
                                   source=self)
                return
            if not self.lane._core.owns(self.key, token):
                return
            self.lane._core._dropped.append((self.key, token))
        self._token = -token  # type: ignore[misc]  # ended (see the class)
        if _finalizing():
            # The interpreter ends (a hold kept by a module cleared after this one): no
            # thread will wait for the permit, and this module's globals may be gone.
            return
        self.lane._dropped_hold()
        warn_dropped(self.lane, self.key, token, self)


def warn_unentered(made: str, key: str, usage: str = "lane.acquire(key)",
                   source: object = None) -> None:
    """The ``RuntimeWarning`` of a hold that was made and dropped without being entered
    (``lane.acquire(key)`` without ``with``: it never waited and never held), as
    Python's own for a coroutine never awaited. ``made``: what made it (``SessionLane
    's'``). ``source``: the hold. The warning comes from its finalizer, so no line of
    the caller's is at hand; with :mod:`tracemalloc` on (``python -X tracemalloc``),
    Python shows where the hold was made, as for its own ``ResourceWarning``."""
    warnings.warn(
        f"{made}: the hold made for key {shown(key)} was garbage-collected without being "
        f"entered (or an interrupt stopped its enter before it began, or it was awaited or "
        f"used with the other face's statement, which raised TypeError), so it never held "
        f"anything: "
        f"use it as 'with {usage}:' on thread lanes, 'async with {usage}:' on asyncio",
        RuntimeWarning,
        stacklevel=2,
        source=source,
    )


def warn_dropped(lane: Any, key: str, token: int, source: object = None) -> None:
    """The ``ResourceWarning`` of a hold dropped while held, naming the lane and key;
    ``source``: the hold (see :func:`warn_unentered`)."""
    warnings.warn(
        f"{type(lane).__name__} {lane.name!r}: a hold on key {shown(key)} (token {token}) was "
        "garbage-collected without release; its permit returns to the lane",
        ResourceWarning,
        stacklevel=2,
        source=source,
    )
