"""The thread face: :class:`Lane` and :class:`SessionLane`.

A thread that must wait parks on a private, already-locked ``threading.Lock``; the
releaser that hands it the permit unlocks it (under the core's lock, after setting the
waiter's token). The permit is therefore the waiter's before it even wakes: no newcomer can
take it in between, and no wake-up can be lost (the waiter may block after the hand-off and
still returns at once). Everything else (who holds, who is next, eviction, counters) is the
shared state machine of :mod:`lanequeue._core`.
"""

from __future__ import annotations

import threading
from asyncio.events import _get_running_loop
from time import monotonic as _monotonic
from types import TracebackType
from typing import Any, ClassVar, Literal

from ._core import (
    _SETTLER,
    CLEARED,
    Core,
    CountingCore,
    CountingHoldSteps,
    SessionHoldSteps,
    Waiter,
    ended_error,
    record,
    recorded,
    settle_later,
)
from ._errors import LaneTimeoutError
from ._kinds import (
    LANE_DEFAULT,
    CountingKind,
    Hold,
    SessionKind,
    _DropWatch,
)
from ._ops import poll_idle
from ._validate import check_bool, check_key, check_timeout, function_copy, shown_as_public

__all__ = ["Lane", "SessionLane", "ThreadHold"]

_TIMEOUT_MAX = threading.TIMEOUT_MAX
_ZERO = 0  # ``priority is _ZERO``: the default, checked by identity on the hot path


class _ThreadWaiter(Waiter):
    """A thread in line: parks on its own lock, which the granting releaser unlocks.

    ``gone`` is set by the waiting thread, as the first store of its clean-up, when
    its wait ends by an exception (an interrupt, a clear, a drain): from then on it
    refuses grants (:meth:`ready` is False), so if a second interrupt stops the
    clean-up before it withdraws, the next releaser drops it from the line instead of
    handing the permit to a thread that no longer waits."""

    __slots__ = ("_parking", "gone")

    def __init__(self) -> None:
        self.token = 0
        self.left = False
        self.gone = False
        parking = threading.Lock()
        parking.acquire()
        self._parking = parking
        # The grant sets the token first, then unlocks: the unlock publishes the token
        # to the parked thread. A builtin, so the call cannot stop before it unlocks
        # (``__exit__``: ``release`` that accepts, and ignores, the argument of
        # ``wake(None)``; typeshed names three parameters, CPython takes any).
        self.wake = parking.__exit__  # type: ignore[assignment]

    def ready(self) -> bool:
        return not self.gone

    def park(self, timeout: float | None) -> bool:
        """Block until granted (True) or until ``timeout`` seconds pass (False).
        Interruptible by signals (KeyboardInterrupt) on POSIX."""
        if timeout is None or timeout > _TIMEOUT_MAX:
            return self._parking.acquire()
        return self._parking.acquire(True, timeout)


class ThreadHold(Hold):
    """A hold on a thread lane; a context manager made by ``lane.acquire(key)``.

    ``with lane.acquire(key) as hold:`` waits for the permit (up to the timeout given to
    ``acquire``), raises :class:`LaneTimeoutError` if it does not come, and releases it
    when the block ends, whether by return, exception or KeyboardInterrupt. Single use.

    A hold garbage-collected while held (entered but never left nor released) warns
    with a ``ResourceWarning`` naming the lane and the key, and its permit returns to
    the lane, to a waiter if there is one (see "Dropped holds" in
    :mod:`lanequeue._core`).
    """

    __slots__ = ("_priority",)

    lane: _ThreadFace
    _priority: int  # the acquire's priority (checked), for the wait if one is needed
    _ended_class: ClassVar[type]  # what a hold left through its block becomes: this class

    def __enter__(self) -> ThreadHold:
        self._parked = None  # entered (a hold never entered warns when dropped: _DropWatch)
        # (a hold of the public class: one that ended, or whose enter timed out)
        if self._token or self.__class__ is ThreadHold:
            raise RuntimeError("this hold was already entered (a hold is single use, even after "
                               "it ended or timed out); call lane.acquire(key) again")
        lane, key, timeout = self.lane, self.key, self._timeout_s
        # A grant is stored in ``self._token`` by the core's commit, or by ``_park``
        # before its wait's handler ends: an interrupt right after it leaves the permit
        # to this hold (its finalizer), not to nobody.
        if not lane._core.take(key, timeout != 0, None, self) and (
                timeout == 0 or not lane._park(key, timeout, self._priority, self)):
            # Nothing granted (the wait withdrew): the hold ends, single use (its class
            # then enters by this general path, which refuses it; no finalizer).
            self.__class__ = lane._ended_hold
            raise LaneTimeoutError(lane.name, key, timeout, type(lane).__name__)
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        token = self._token
        if token > 0:  # not released early inside the block
            self._token = -token
            self.lane._core.release(self.key, token)



ThreadHold._ended_class = ThreadHold


@shown_as_public
class _SessionThreadHold(SessionHoldSteps, _DropWatch, ThreadHold):
    """A :class:`ThreadHold` of a :class:`SessionLane`: entering and leaving run the
    core's common steps themselves (:class:`lanequeue._core.SessionHoldSteps`); a
    :class:`ThreadHold` once left (:class:`lanequeue._kinds._DropWatch`)."""

    __slots__ = ()

    # Copies of the steps (own code objects: see function_copy), as every hold class.
    _enter_slow = ThreadHold.__enter__
    __enter__ = function_copy(SessionHoldSteps._step_in)
    __exit__ = function_copy(SessionHoldSteps._step_out)


@shown_as_public
class _CountingThreadHold(CountingHoldSteps, _DropWatch, ThreadHold):
    """A :class:`ThreadHold` of a :class:`Lane`: entering and leaving run the core's
    common steps themselves (:class:`lanequeue._core.CountingHoldSteps`); a
    :class:`ThreadHold` once left (:class:`lanequeue._kinds._DropWatch`)."""

    __slots__ = ()

    _enter_slow = ThreadHold.__enter__
    __enter__ = function_copy(CountingHoldSteps._step_in)
    __exit__ = function_copy(CountingHoldSteps._step_out)


class _ThreadFace:
    """Acquire/release for threads over either core. Thread-safe: any thread may acquire
    and any thread may release (the scheduler pattern releases from the job's thread)."""

    face: Literal["threads"] = "threads"
    _waits_at_grant = True  # a waiter's ``since`` is on the core's clock (see _park)
    _core: Any  # CountingCore or SessionCore (the kind's): same take/release/withdraw
    _hold_class: ClassVar[type[ThreadHold]]  # what acquire() makes, as cls() (_DropWatch)
    _new_hold: type[ThreadHold]  # the same, read from the instance (see LaneKind.__init__)
    _ended_hold: type[ThreadHold]  # what its holds become once ended (LaneKind.__init__)
    name: str
    timeout_s: float | None
    warn_after_s: float | None
    _slow_wait: Any
    _idle: Any
    _start_drain: Any
    _rank: Any
    _warned_loop: bool  # (LaneOps)
    _warn_loop: Any

    def _take(self, key: str, timeout: float | None, priority: int = 0) -> int:
        """Wait up to ``timeout`` seconds (None: no limit, 0: no wait) for a permit.
        Returns the grant's token, or 0 if none came. Key and priority already checked."""
        core: Core = self._core
        got = core.take(key, timeout != 0)
        if got or timeout == 0:
            return got
        return self._park(key, timeout, priority)

    def _dropped_hold(self) -> None:
        """A hold of this lane was dropped while held (see ``_kinds._DropWatch``): end it now,
        handing its permit to a waiter already parked; when the core's lock is taken
        (maybe by this very thread, whose finalizer runs inside the core, or by another
        thread), the settler thread ends it once the lock is free
        (:func:`lanequeue._core.settle_later`). Any thread may do this: a hand-off wakes
        a thread waiter by releasing its lock. (The lock is an RLock: ``_is_owned``
        tells whether this thread is inside it, which ``acquire(False)`` alone would
        not.)"""
        core = self._core
        lock = core._lock
        if lock._is_owned():  # inside the core: the settler ends it after this operation
            settle_later(core)
            return
        free = False
        try:
            free = lock.acquire(False)  # inside the try: see "Interrupts" in _core
        finally:
            try:
                lock.release()
            except RuntimeError:  # not taken: another thread holds it
                pass
        if not free:
            settle_later(core)
            return
        try:
            core._settle()
        finally:
            if core._dropped:  # an interrupt stopped it (or more came): the settler ends them
                settle_later(core)

    def _park(self, key: str, timeout: float | None, priority: int = 0,
              into: Any = None) -> int:
        """The slow half of :meth:`_take`, after ``core.take`` found the lane busy: join
        the line with a new waiter (with ``priority``: checked, and 0 on a per-key lane)
        and wait up to ``timeout`` seconds (None: no limit).
        Returns the grant's token, or 0 if none came (counted as a timeout). A grant is
        recorded in ``into`` (as ``core.take`` records it: a hold, or an
        ``acquire_all``'s MultiHold, its ``_taken``) before this method's handler ends:
        an interrupt after that keeps the grant for ``into``'s owner instead of passing
        it on. ``into`` also keeps the waiter (``_parked``) from before it can be
        granted, for its finalizer (:func:`lanequeue._core.parked_grant`).

        The wait is observed (``lanequeue_wait_seconds``) when it ends: by the hand-off
        that grants it (the core's ``waits_at_grant``: under the lock the releaser holds
        anyway, so a scrape never sees the grant counted before its wait), else here. With
        ``warn_after_s`` set and shorter than ``timeout``, the thread parks in two steps:
        up to ``warn_after_s``, then (not granted yet) it logs the slow wait once, with
        the waiters that were ahead when it joined, and parks for the rest. Raises
        LaneClearedError / LaneDrainingError when ``clear`` or a drain ended the wait.
        """
        core: Core = self._core
        clock = self._core._clock
        waiter = _ThreadWaiter()
        waiter.since = start = clock()
        observed = False
        n = 0 if into is None or not into._is_multi else len(into._taken)
        try:
            # The waiter exists before the take that may put it in line, and this try
            # covers that call: whatever instant an interrupt lands at, the handler
            # below finds the waiter (and its token, if granted meanwhile). ``into``
            # has it too (a plain store, before it can be granted): should a second
            # interrupt stop the handler, ``into``'s finalizer returns the grant.
            if into is not None:
                into._parked = (waiter, n)
            if priority:
                counting: CountingCore = self._core
                token = counting.take(key, True, waiter, None, None, priority)
            else:
                token = core.take(key, True, waiter)
            if token:  # freed since the first look: granted at once
                return record(into, token)
            # In line: the settler watches this core from now on (started if none runs),
            # so a hold dropped under a taken lock still reaches this waiter; one dropped
            # before, while no settler ran, is ended here (lanequeue._core._Settler).
            watched = self._core
            if not (_SETTLER.started and watched.settler_watches):
                _SETTLER.wait_begins(watched)
            if watched._dropped:
                watched._settle()
            if into is not None and getattr(into, "_aborted", False):
                # Its owner gave up on it (see _MultiAcquire._end_wait), maybe before
                # this wait joined the line: it ends as cleared (the handler withdraws).
                raise ended_error(self.name, key, CLEARED)
            if not self._warned_loop and _get_running_loop() is not None:
                self._warn_loop()  # (see LoopWaitWarner in lanequeue._ops)
            warn = self.warn_after_s
            if warn is not None and (timeout is None or timeout > warn):
                ahead = waiter.ahead  # (stored as it joined)
                parked = _monotonic()
                granted = waiter.park(warn)
                if not granted:
                    self._slow_wait(key, clock() - start, ahead)
                    # The rest of the timeout: the warning's handlers (a log handler,
                    # ``on_wait``) took time too, and a wait ends at its timeout.
                    granted = waiter.park(None if timeout is None else
                                          max(0.0, timeout - (_monotonic() - parked)))
            else:
                granted = waiter.park(timeout)
            if not granted and self._core._dropped:
                # Out of time, and a dropped hold nobody has ended yet (its finalizer was
                # stopped by an interrupt before it asked): its permit may be this wait's.
                self._core._settle()
                granted = bool(waiter.token)
            # Ran out of time? The releaser may still have granted us just now: withdraw
            # settles that race under the core's lock and returns the token if so.
            token = waiter.token if granted else core.withdraw(key, waiter, timed_out=True)
            if token <= 0:  # (a grant's wait was observed by its hand-off)
                observed = True
                self._core.observe_wait(clock() - start, False)
            if token < 0:
                raise ended_error(self.name, key, token)
            return record(into, token)
        except BaseException:
            # Interrupted (KeyboardInterrupt, an async exception), or ended by clear or a
            # drain: leave no ghost in line; if the permit was handed over meanwhile, pass
            # it on. First a plain store, which no interrupt can precede here (entering a
            # handler checks nothing): refuse grants from now on, so that a second
            # interrupt stopping the withdraw below leaves a waiter the next releaser
            # drops, not one it hands the permit to.
            waiter.gone = True
            if recorded(into, n):
                raise  # the grant is its owner's (granted: in no line any more)
            token = core.withdraw(key, waiter, timed_out=False)
            if token > 0:
                core.release(key, token)
            if not observed and token <= 0:  # (a grant's wait: see above)
                self._core.observe_wait(clock() - start, False)
            raise

    def _release(self, key: str, token: int) -> bool:
        """End the hold ``token`` of ``key`` (0: the key's hold); any thread may call it."""
        core: Core = self._core
        return core.release(key, token)

    def acquire(
        self, key: str, *, timeout_s: Any = LANE_DEFAULT, priority: int = 0
    ) -> ThreadHold:
        """A context manager that holds a permit of this lane for ``key``.

        Args:
            key: non-empty ``str``; on a SessionLane, the unit of mutual exclusion.
            timeout_s: seconds to wait; default the lane's ``timeout_s``; ``None`` waits
                without limit; ``0`` does not wait.
            priority: (Lane only) an ``int`` in ``[-2**31, 2**31 - 1]``: if this call
                must wait, a waiter with a larger priority is served first; a waiter
                gains one level per ``ageing_s`` seconds of waiting; equal ones are
                served in arrival order (see README, "Priority"). A free permit is taken
                at once whatever the priority. A SessionLane refuses any priority but 0
                (ValueError): a key's waiters stay in arrival order.

        Returns:
            a :class:`ThreadHold`; entering it waits and yields the hold (with its
            ``token``), leaving it releases.

        Raises:
            TypeError/ValueError: at the call, for a bad key, timeout or priority.
            LaneTimeoutError: on entering, when no permit came in time (names lane and key).

        Example:

            >>> lane = Lane("global", max_concurrent=2)
            >>> with lane.acquire("gateway:slack:c1:u1") as hold:
            ...     print(lane.active_count, hold.key)
            1 gateway:slack:c1:u1
            >>> lane.active_count
            0
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

    def try_acquire(self, key: str) -> bool:
        """Take a permit for ``key`` if one is free now; never waits.

        Returns True if taken (release it with :meth:`manual_release`), False if not (the
        refusal counts in ``stats.rejected``, not in ``stats.timeouts``). Raises TypeError
        / ValueError for a bad key, LaneDrainingError once the lane drains.
        """
        if key.__class__ is not str or not key:
            key = check_key(key)
        return self._take(key, 0) != 0

    def acquire_timeout(
        self, key: str, timeout_s: Any = LANE_DEFAULT, *, priority: int = 0
    ) -> bool:
        """Wait up to ``timeout_s`` seconds for a permit: omitted, the lane's
        ``timeout_s``; None: no limit; 0: no wait. ``priority``: as :meth:`acquire`.

        Returns True if taken (release it with :meth:`manual_release`), False on timeout.
        Raises TypeError / ValueError for a bad key, timeout or priority.
        """
        if key.__class__ is not str or not key:
            key = check_key(key)
        timeout = self.timeout_s if timeout_s is LANE_DEFAULT else check_timeout(timeout_s)
        if priority is not _ZERO:
            priority = self._rank(priority)
        return self._take(key, timeout, priority) != 0

    def manual_release(self, key: str) -> bool:
        """Release a permit taken with try_acquire / acquire_timeout / _raw_acquire.

        On a SessionLane it ends the key's hold; on a Lane, the key's oldest hold. Any
        thread may call it. Returns False, logs a warning and changes nothing when ``key``
        holds nothing (a second release, or a key never acquired): capacity is never
        raised by a stray release. Never waits.
        """
        if key.__class__ is not str or not key:
            key = check_key(key)
        return self._release(key, 0)

    def _raw_acquire(self, key: str) -> bool:
        """The source design's internal acquire: wait the lane's ``timeout_s``."""
        return self.acquire_timeout(key, self.timeout_s)

    def _raw_release(self, key: str) -> None:
        """The source design's internal release (see :meth:`manual_release`)."""
        self.manual_release(key)

    def drain(self, timeout_s: float | None = 0.0, *, cancel_waiting: bool = False) -> bool:
        """Stop taking new acquisitions, then wait up to ``timeout_s`` for the lane to go
        idle.

        At once, every new ``acquire`` / ``acquire_timeout`` / ``try_acquire`` (and a
        queue's ``acquire_all`` naming this lane) raises :class:`LaneDrainingError`.
        Holders finish and release as usual; waiters keep their place and are served,
        unless ``cancel_waiting`` ends their waits with :class:`LaneDrainingError`.
        Draining cannot be undone: make a new lane.

        Args:
            timeout_s: seconds to wait for idle; 0 (default) returns at once; None: no
                limit.
            cancel_waiting: end every wait now instead of serving it.

        Returns:
            True if the lane is idle (no holder, no waiter) on return, else False.

        Raises TypeError/ValueError for a bad timeout. Thread-safe.

        Example:

            >>> lane = Lane("global", max_concurrent=2)
            >>> lane.try_acquire("job-1")
            True
            >>> lane.drain()
            False
            >>> lane.manual_release("job-1")
            True
            >>> lane.drain()
            True
        """
        timeout = check_timeout(timeout_s)
        cancel_waiting = check_bool(cancel_waiting, "cancel_waiting")
        self._start_drain(cancel_waiting)
        return self.wait_idle(timeout)

    def wait_idle(self, timeout_s: float | None) -> bool:
        """Wait up to ``timeout_s`` seconds (None: no limit) until the lane has no holder
        and no waiter; True if it is idle on return, False when the timeout passed first.

        It looks every 10 ms (``time.sleep``), so the release path carries no idle
        notification. Does not refuse anything by itself (see :meth:`drain`). Raises
        TypeError/ValueError for a bad timeout. Thread-safe.
        """
        timeout = check_timeout(timeout_s)
        return poll_idle(self._idle, timeout, self)


class Lane(_ThreadFace, CountingKind):
    """A counting lane for threads: at most ``max_concurrent`` holders over all keys.

    Waiters are served first come, first served across all keys, unless they asked for
    a ``priority`` (``acquire(key, priority=...)``): then the waiter with the largest
    priority goes first, each waiter gaining one level per ``ageing_s`` seconds of
    waiting, equal ones in arrival order. A release hands its permit straight to the
    waiter served next. The same key may hold several permits; each is
    tracked (``active_count``, ``get_active()``) and released on its own.

    Args:
        name: the lane's name (non-empty ``str``).
        max_concurrent: permits, >= 1.
        timeout_s: default wait of ``acquire`` in seconds; None waits without limit.
        clock: monotonic clock in seconds for hold ages and waits (replaceable in tests).
        warn_after_s: a wait longer than this many seconds is logged once (lane, key,
            seconds waited, waiters ahead when it joined (with priorities: all the
            waiters then in line, whatever their priority), age of the hold it waits
            behind); None: never. Default 2.0.
        on_wait: called as ``on_wait(lane, key, waited_s, ahead)`` with that warning;
            its exceptions are logged, not raised.
        warn_hold_s: a hold longer than this many seconds is logged once: while it
            is held, by the checks at ``stuck()``, ``status()``, each metrics snapshot
            and each slow-wait warning; else as it ends (a moment after its release,
            from a reporter thread). None (default): never. Hold times are then
            observed by every release (a little more work each).
        ageing_s: seconds of waiting that raise a waiter by one priority level
            (finite, > 0 and below ``threading.TIMEOUT_MAX``, about 292 years;
            default 30.0), on ``clock``.

    Raises:
        TypeError: an argument of the wrong type (``None``, a ``str`` or a ``bool``
            where a number is expected; ``ageing_s=None`` too), naming it and the class.
        ValueError: a value of the right type out of range (``max_concurrent=0``,
            ``ageing_s=0``), naming it and the class. Built by ``LaneQueue.add_lane()``,
            the errors name that call instead.

    Thread-safe, and safe against KeyboardInterrupt at any instant (see README,
    Guarantees). In a child made by ``os.fork()`` the lane starts empty.

    Example:

        >>> llm = Lane("global", max_concurrent=8)
        >>> with llm.acquire("any-key"):
        ...     llm.available
        7
    """

    _hold_class = _CountingThreadHold

    def holds_of(self, key: str) -> int:
        """Permits held now by ``key``."""
        return self._holds_of(key)

    def lane_status(self) -> dict[str, Any]:
        """The lane-wide figures: ``active``, ``waiting``, ``available``, ``keys`` (key ->
        seconds its oldest hold has lasted), ``max_concurrent``."""
        return self._lane_status()


class SessionLane(_ThreadFace, SessionKind):
    """A per-key lane for threads: one holder per key, in arrival order; keys in parallel.

    An entry per key is created on first use and lives while the key has a holder or a
    waiter; then it stays idle for ``idle_timeout_s`` seconds and is evicted (expired
    entries are dropped when a new key arrives, by :meth:`cleanup_idle`, and by every
    view that counts entries or evictions before it reads: see :attr:`idle_timeout_s`).
    When a new key arrives with ``max_sessions`` entries alive, the oldest idle entry
    goes (and idle entries over the cap, after a burst of held keys, go oldest first,
    64 per call that evicts); held entries are never evicted, so the cap is soft.

    Args:
        name: the lane's name (default ``"session"``).
        max_sessions: soft cap on entries, >= 1.
        idle_timeout_s: seconds an idle entry is kept (see :attr:`idle_timeout_s`: 0
            drops an entry as soon as it is idle; None keeps it until a new key needs
            its room).
        timeout_s: default wait of ``acquire`` in seconds; None waits without limit.
        clock: monotonic clock in seconds for idle and hold ages and for measuring waits
            (replaceable in tests; deadlines always run on ``threading``'s own clock).
        warn_after_s: a wait longer than this many seconds is logged once (lane, key,
            seconds waited, waiters ahead when it joined, age of the hold it waits
            behind); None: never. Default 2.0.
        on_wait: called as ``on_wait(lane, key, waited_s, ahead)`` with that warning;
            its exceptions are logged, not raised.
        warn_hold_s: a hold longer than this many seconds is logged once: while it
            is held, by the checks at ``stuck()``, ``status()``, each metrics snapshot
            and each slow-wait warning; else as it ends (a moment after its release,
            from a reporter thread). None (default): never. Hold times are then
            observed by every release (a little more work each).

    Not re-entrant: a thread holding a key that acquires it again waits for itself
    until its timeout (use one hold per request).

    Raises:
        TypeError/ValueError: for a bad argument (TypeError for a wrong type, ValueError
            for a value out of range), naming it and the class (built by
            ``LaneQueue.add_session_lane()``: that call).

    Thread-safe, and safe against KeyboardInterrupt at any instant (see README,
    Guarantees). In a child made by ``os.fork()`` the lane starts empty: no holder, no
    waiter, no entry.

    Example: while a key is held, the next request of that key waits (here: is refused by
    ``try_acquire``, which never waits); another key goes ahead.

        >>> sessions = SessionLane()
        >>> with sessions.acquire("gateway:slack:c1:u1:t1"):
        ...     sessions.try_acquire("gateway:slack:c1:u1:t1")
        ...     sessions.try_acquire("gateway:slack:c2:u2:t2")
        False
        True
        >>> sessions.manual_release("gateway:slack:c2:u2:t2")
        True
    """

    _hold_class = _SessionThreadHold

    def is_held(self, key: str) -> bool:
        """True while ``key`` has a holder."""
        return self._is_held(key)

    def waiting_for(self, key: str) -> int:
        """Callers in line for ``key`` now."""
        return self._waiting_for(key)
