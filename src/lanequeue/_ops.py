"""The operations every lane offers, written once for the in-process and the Redis lanes:
slow-wait warnings, long-hold warnings, ``stuck``, ``close`` and ``draining``.

:class:`LaneOps` is a mixin over a small interface that each lane fills in:

- ``name`` (the lane's name), ``_hold_list()`` (this lane's holds as ``(key, fencing
  token, seconds held)``), ``_holder_age(key)`` (seconds the hold a waiter of ``key``
  waits behind has lasted, None when unknown);
- ``_start_drain(cancel_waiting)`` (refuse acquisitions; end the waits too when asked)
  and ``_idle()`` (no holder and no waiter), which a queue also calls over its lanes;
- ``clear(key)`` and ``draining`` (a property).

The in-process lanes (:mod:`lanequeue._face`) see the whole lane; a Redis lane sees this
process's holders and waiters (:mod:`lanequeue.redis._ops`).
"""

from __future__ import annotations

import asyncio
import logging
import os
import sys
import threading
import time
import warnings
from abc import abstractmethod
from collections.abc import Callable
from typing import Any, TypedDict, cast

from ._core import at_fork_in_child
from ._errors import shown
from ._obs import StuckHold
from ._validate import check_timeout

#: Ends of holds a lane remembers having handled (see LaneOps._hold_ended): a second
#: report of one end, or a check that read the holds just before it, finds it there.
ENDS_KEPT = 1024

__all__ = ["DEFAULT_WARN_AFTER_S", "LaneOps", "LoopWaitWarner", "OnWait", "log"]

log = logging.getLogger("lanequeue")

#: Seconds a wait may last before it is logged as slow (``warn_after_s``).
DEFAULT_WARN_AFTER_S = 2.0

#: ``on_wait(lane, key, waited_s, ahead)``: called once per wait that passes warn_after_s.
OnWait = Callable[[Any, str, float, int], object]

#: A cancelled task waits this long (seconds) for its clean-up (leaving a line, passing on
#: a grant, releases) before it ends; the clean-up goes on in the background (on Redis,
#: each of its calls bounded like any other).
CANCEL_WAIT_S = 0.5

_WAIT_SPENT = "_lanequeue_wait_spent"  # (the attribute; see noted_cancel_wait)


def note_cancel_wait(exc: BaseException, began: float, now: float) -> BaseException:
    """Record on ``exc`` (a CancelledError a lane raises after waiting for its clean-up,
    or the KeyboardInterrupt whose clean-up a thread waits for) how long the clean-up
    waits of its cancellation or interrupt have taken so far: until ``now``, from
    ``began`` (both of one clock: the loop's time on asyncio, ``time.monotonic()`` on
    threads; ``began`` as :func:`noted_cancel_wait` gave it, when it gave one). What the
    same cancellation or interrupt goes on to clean up (an enclosing block, an
    ``acquire_all`` giving back the lanes it took) then waits only what is left of
    :data:`CANCEL_WAIT_S`, not a new one; the time its own code runs between two
    clean-ups is not counted. Returns ``exc``."""
    setattr(exc, _WAIT_SPENT, max(0.0, now - began))
    return exc


def noted_cancel_wait(exc: BaseException | None, now: float) -> float | None:
    """When the clean-up waits recorded on ``exc`` (:func:`note_cancel_wait`) would have
    begun, had they run in one go up to ``now`` (same clock): a wait that begins at
    ``now`` waits until ``CANCEL_WAIT_S`` after it. None: nothing was recorded."""
    spent = getattr(exc, _WAIT_SPENT, None)
    return now - spent if isinstance(spent, float) else None


def carry_cancel_wait(src: BaseException | None, dst: BaseException) -> BaseException:
    """Record on ``dst`` the time waited that ``src`` records (:func:`note_cancel_wait`),
    when it is more than ``dst`` records: two exceptions of one interrupt (a second
    Ctrl-C during the clean-up of the first). Returns ``dst``."""
    spent = getattr(src, _WAIT_SPENT, None)
    if isinstance(spent, float) and spent > getattr(dst, _WAIT_SPENT, -1.0):
        setattr(dst, _WAIT_SPENT, spent)
    return dst


class OpsArguments(TypedDict):
    warn_after_s: float | None
    on_wait: OnWait | None
    warn_hold_s: float | None


def check_ops_arguments(
    where: str, warn_after_s: object, on_wait: object, warn_hold_s: object
) -> OpsArguments:
    """The one check of the operations' arguments, for every lane and queue: seconds as
    for a timeout (None or inf: never), ``on_wait`` callable or None. ``where`` names the
    call in errors (``"LaneQueue() argument"``)."""
    if on_wait is not None and not callable(on_wait):
        raise TypeError(f"{where} 'on_wait' must be callable or None, not {on_wait!r}")
    return {
        "warn_after_s": check_timeout(warn_after_s, f"{where} 'warn_after_s'"),
        "on_wait": cast("OnWait | None", on_wait),
        "warn_hold_s": check_timeout(warn_hold_s, f"{where} 'warn_hold_s'"),
    }


_PACKAGE = os.path.dirname(os.path.abspath(__file__))

#: How a long hold's end line ends for a hold its release freed (see LaneOps._hold_ended).
RELEASED = "it has been released"

# Held while a lane's ``warn_hold_s`` changes (rare: one lock for every lane).
_SETTING = threading.RLock()
# Held while a check or a hold's end decides whether it logs a long hold (rare: one lock
# for every lane): a hold is logged once, by whichever decides first (see _hold_ended).
# Both are RLocks: a finalizer may run at any allocation inside them, and its warning's
# log handler may run a check (``status()``) or a release on this same thread; a plain
# Lock would hang that thread, and every check of every lane after it. Each decision
# under ``_WARNED`` stays right when another runs inside it: an end is recorded in
# ``_ends_seen`` before it logs, and a check logs only a hold still held.
_WARNED = threading.RLock()
# Held by the one prune of marks that runs at a time (see LaneOps._prune_warned).
_PRUNING = threading.Lock()
# Marks of logged holds a lane keeps before it prunes them (see LaneOps._prune_warned):
# more than the reports that may wait for the reporter thread at once.
_PRUNE_FLOOR = 2048


def _new_locks_after_fork() -> None:
    """In a forked child: new locks (a thread of the parent may have held one at the
    fork, and it does not exist here to release it)."""
    global _SETTING, _WARNED, _PRUNING
    _SETTING = threading.RLock()
    _WARNED = threading.RLock()
    _PRUNING = threading.Lock()


at_fork_in_child(_new_locks_after_fork)


def outside_level() -> int:
    """The ``stacklevel`` of a warning issued by this function's caller that points at
    the first frame outside this package (the user's call)."""
    frame = sys._getframe(1)
    level = 1
    while frame.f_back is not None and frame.f_code.co_filename.startswith(_PACKAGE):
        frame = frame.f_back
        level += 1
    return level


class LoopWaitWarner:
    """The ONE warning of a blocking call made from a thread that runs an asyncio event
    loop, issued once per object: a thread lane's wait (:class:`LaneOps`), a dispatcher's
    ``drain``/``wait_idle`` on threads or a wait for one of its tickets
    (:class:`lanequeue.dispatch._base.DispatcherBase`). The loop (its other tasks, maybe
    the one whose work would end the wait) stops until the call returns, often for the
    call's whole timeout.

    A caller checks, where the call is about to block, ``not self._warned_loop and
    asyncio.events._get_running_loop() is not None`` (a plain attribute and a C call: no
    cost on the path that does not block), then calls :meth:`_warn_loop`. The object
    says what it is (:meth:`_loop_subject`), what else may stop (``_loop_stops``) and
    what to use instead (``_loop_instead``)."""

    _warned_loop = False  # a blocking call from an event loop's thread was warned of
    #: What else stops with the loop (the words in parentheses).
    _loop_stops: str = ""
    #: What to use instead in async code.
    _loop_instead: str = ""

    def _loop_subject(self) -> str:
        """How the warning names the object."""
        return type(self).__name__

    def _warn_loop(self, call: str = "wait") -> None:
        """Warn (a ``RuntimeWarning`` pointing at the caller's line outside the package)
        of a blocking ``call`` from a thread that runs an asyncio event loop; only the
        first time for this object."""
        self._warned_loop = True
        warnings.warn(
            f"{self._loop_subject()}: a blocking {call} from a thread that runs an asyncio "
            f"event loop: the loop and its other tasks ({self._loop_stops}) stop until it "
            f"ends. {self._loop_instead}",
            RuntimeWarning, stacklevel=outside_level())


class LaneOps(LoopWaitWarner):
    """Slow waits, long holds, ``stuck`` and ``close``, over the interface in the module
    docstring. Thread-safe as far as the interface is.

    A thread lane's wait that is about to block in a thread that runs an asyncio event
    loop warns once per lane (:meth:`LoopWaitWarner._warn_loop`)."""

    _loop_stops = "maybe the holder, whose release would end this wait"
    _loop_instead = ("Use the asyncio face in async code (AsyncSessionLane, AsyncLane, "
                     "AsyncRedisSessionLane, AsyncRedisLane, build_default_async_lanes())")

    def _loop_subject(self) -> str:
        return f"{type(self).__name__} {self.name!r}"

    name: str
    warn_after_s: float | None
    on_wait: OnWait | None
    _warn_hold_s: float | None
    # Holds a check logged while held, not ended yet (key, token: a Redis lane's tokens
    # are per key); and the last ENDS_KEPT ends handled (see _hold_ended).
    _warned_holds: set[tuple[str, int]]
    _ends_seen: dict[tuple[str, int], None]
    _ended_marks: set[tuple[str, int]]
    _prune_warned_at: int

    def _ops_init(
        self,
        where: str,
        warn_after_s: float | None,
        on_wait: OnWait | None,
        warn_hold_s: float | None,
    ) -> None:
        """Check and keep the operations' arguments (``where`` names the call in errors)."""
        checked = check_ops_arguments(where, warn_after_s, on_wait, warn_hold_s)
        #: Seconds after which a wait is logged once as slow (None: never).
        self.warn_after_s = checked["warn_after_s"]
        #: Called as ``on_wait(lane, key, waited_s, ahead)`` once per slow wait.
        self.on_wait = checked["on_wait"]
        self._warned_holds = set()
        self._ends_seen: dict[tuple[str, int], None] = {}
        self._ended_marks: set[tuple[str, int]] = set()  # (see _prune_warned)
        self._prune_warned_at = _PRUNE_FLOOR
        self.warn_hold_s = checked["warn_hold_s"]

    @property
    def warn_hold_s(self) -> float | None:
        """Seconds after which a hold is logged once as long (None: never): while it is
        held, at ``stuck()``, ``status()``, a metrics scrape or a slow-wait warning; and
        as it ends, if no check logged it before (an in-process lane's release hands it
        to a reporter thread, so the line comes a moment after the release; a Redis lane
        logs it in its release). Settable; checked as the constructor's argument."""
        return self._hold_limit()

    @warn_hold_s.setter
    def warn_hold_s(self, value: float | None) -> None:
        limit = check_timeout(value, f"{type(self).__name__}.warn_hold_s")
        with _SETTING:  # (one setting at a time; the marks stay: see _hold_ended)
            self._watch_holds(limit)

    def _hold_limit(self) -> float | None:
        """The setting, from its one record: one, so that no interrupt can split a
        setting between two (the lane's own here; an in-process lane's core's watch)."""
        return self._warn_hold_s

    def _watch_holds(self, limit: float | None) -> None:
        """Record ``limit`` and have the releases of this lane's holds call
        :meth:`_hold_ended` for a hold that lasted that long or more (None: stop). Here
        the lane's own record, one plain store: a Redis lane checks in its release. The
        in-process faces record it in their core's watch, which reports the holds."""
        self._warn_hold_s = limit

    def _hold_ended(self, key: str, token: int, held_s: float,
                    ending: str = RELEASED) -> None:
        """Log a hold that lasted ``warn_hold_s`` or more as it ended (``ending``: how,
        for the line), unless it was
        logged already: by a check while it was held, or by an earlier report of its end
        (an in-process release stopped by an interrupt after its report was queued, then
        ended for real, reports twice). Any thread. A broken log handler's exception is
        dropped: this runs in a release, or in the reporter.

        Who logs a hold is decided under one lock (``_WARNED``), by a check and by the
        end alike: a check marks the holds it logs (``_warned_holds``); an end takes its
        hold's mark away, and is remembered among the last :data:`ENDS_KEPT` ends
        (``_ends_seen``), which a second report of the same end, and a check that read
        the holds just before it, find there."""
        if self._still_held(key, token):
            return
        mark = (key, token)
        with _WARNED:
            seen = self._ends_seen
            if mark in seen:
                return
            seen[mark] = None
            if len(seen) > ENDS_KEPT:
                del seen[next(iter(seen))]
            if mark in self._warned_holds:
                self._warned_holds.discard(mark)
                return
        try:
            log.warning("lane %r: key %s held its permit for %.3f s (token %d), past "
                        "warn_hold_s; %s", self.name, shown(key), held_s, token, ending)
        except Exception:  # (a broken handler: its error would replace the release's)
            pass

    # -- the interface --------------------------------------------------------------------

    @abstractmethod
    def _hold_list(self) -> list[tuple[str, int, float]]:
        """This lane's holds: ``(key, fencing token, seconds held)``."""
        ...

    @abstractmethod
    def _holder_age(self, key: str) -> float | None:
        """Seconds the hold a waiter of ``key`` waits behind has lasted; None if unknown."""
        ...

    @abstractmethod
    def _start_drain(self, cancel_waiting: bool) -> None:
        """Refuse new acquisitions; with ``cancel_waiting``, end every wait too."""
        ...

    @abstractmethod
    def _idle(self) -> bool:
        """True when no holder and no waiter is left."""
        ...

    def _check_waker(self) -> None:
        """Check that this caller may wake the lane's waiters (an in-process asyncio lane:
        only from its loop, which binds it on first use); the default lets any caller."""

    def _waker_refusal(self) -> Exception | None:
        """What :meth:`_check_waker` would raise now, without binding anything (None: it
        would pass), so that an operation over several lanes refuses before it changes
        any of them; the default lets any caller."""
        return None

    @abstractmethod
    def clear(self, key: str) -> int:
        """End every wait for ``key`` with LaneClearedError; return how many."""
        ...

    #: Whose waiters the slow-wait warning counts as ahead ("" here: the lane's own,
    #: all of them; a Redis lane object counts its process's only).
    _ahead_of = ""

    #: The slow-wait warning's words when :meth:`_holder_age` is None.
    _no_holder_age = "no hold is current"

    # -- written once -----------------------------------------------------------------------

    def _slow_wait(self, key: str, waited_s: float, ahead: int, *, ended: bool = False,
                   behind_s: float | None = None, granted: bool = True,
                   ending: str | None = None) -> None:
        """Log the ONE warning of a wait that passed ``warn_after_s`` and call ``on_wait``.
        ``ahead``: the waiters that were ahead of it in line when it joined (on a
        counting lane with priorities: all the waiters then in line, whatever their
        priority; counting only those ranked before it costs O(line) per join). ``ended``:
        logged as the wait ended (an asyncio wait without a timeout, which has no timer):
        the current holder may be this very waiter, so the log gives ``behind_s``, how
        long the hold it waited behind had lasted when that hold was handed to it (None:
        not known, as when other waiters were ahead); ``granted`` False: it ended without
        the permit (cleared, drained or closed), and the holds ahead may still hold;
        ``ending``: the name of the exception that ended it (a cancellation, an
        interrupt), if one did.

        This runs inside a wait (or as it ends): a log handler that raises, on this
        line or on the long holds it checks, does not end the wait or skip ``on_wait``;
        its error is dropped."""
        if ended:
            holder = ("logged as the wait ended; " + (
                f"it was ended by {ending}" + ("" if granted else ", without the permit")
                if ending is not None
                else "it ended without the permit (cleared, drained or closed)" if not granted
                else "the holds ahead of it have ended" if behind_s is None
                else f"the hold it waited behind had lasted {behind_s:.3f} s"))
        else:
            holder_age = self._holder_age(key)
            holder = (self._no_holder_age if holder_age is None
                      else f"the current holder has held for {holder_age:.3f} s")
        try:
            log.warning(
                "lane %r: key %s has waited %.3f s for a permit (%d %s ahead when it "
                "joined; %s)", self.name, shown(key), waited_s, ahead,
                ("waiter" if ahead == 1 else "waiters") + self._ahead_of
                + (" was" if ahead == 1 else " were"), holder,
            )
            if self.warn_hold_s is not None:
                self._check_holds(self._hold_list())
        except Exception:  # (a broken handler: see above)
            pass
        if self.on_wait is not None:
            try:
                self.on_wait(self, key, waited_s, ahead)
            except Exception:
                try:
                    log.exception("lane %r: on_wait callback failed", self.name)
                except Exception:  # (a broken handler: see above)
                    pass

    def _check_holds(self, holds: list[tuple[str, int, float]]) -> None:
        """Log, once per hold, the holds older than ``warn_hold_s`` (see
        :meth:`_hold_ended`: who logs a hold is decided under one lock). A log handler
        that raises does not keep the other holds unlogged: each is logged, and the
        first error raised after them."""
        limit = self.warn_hold_s
        if limit is None:
            return
        warned, seen = self._warned_holds, self._ends_seen
        failed: Exception | None = None
        for key, token, age in holds:
            if age < limit:
                continue
            # Marked one at a time, right before its line: an interrupt leaves at most
            # the hold being logged marked and not logged (not every one after it). The
            # mark is made before the decision, and the decision asked again after
            # ``_held_now``: the collector runs only where an object is made (a tuple, a
            # list copy), and a finalizer it runs there may make a check of its own on
            # this thread (the lock lets it in), which may log this hold first.
            mark = (key, token)
            with _WARNED:
                if mark in warned or mark in seen or not self._held_now(key, token) or \
                        mark in warned or mark in seen:
                    continue  # (logged, or ended since the read: its end logs it)
                warned.add(mark)
            try:
                log.warning("lane %r: key %s has held its permit for %.3f s (token %d)",
                            self.name, shown(key), age, token)
            except Exception as exc:
                failed = failed or exc
        if len(warned) > self._prune_warned_at:
            self._prune_warned()
        if failed is not None:
            raise failed

    def _prune_warned(self) -> None:
        """Drop the marks of holds no longer held whose end never came to
        :meth:`_hold_ended` (a report that waited behind :data:`~lanequeue._core.REPORTS_MAX`
        others is counted, not made; a lost Redis hold). Every end takes its mark away,
        so the marks outgrow the live holds only by the reports still waiting (kept:
        :meth:`_pending_ends`) and the missed ends. Pruned against the holds read now
        (an old read would drop the marks of newer holds); a mark of an ended hold goes
        at the second prune that finds it (a Redis lane logs an end right after the
        release that the read no longer shows). The next prune comes once the marks
        have grown by the live holds or :data:`_PRUNE_FLOOR`, whichever is more: the
        marks stay within the live holds, the waiting reports and twice that growth,
        and a prune costs O(1) per mark added, amortised."""
        if not _PRUNING.acquire(False):
            return  # (one prune at a time: another, with an older read, would drop
            # the mark of a hold taken and logged between the two reads)
        try:
            holds = self._hold_list()
            live = {(k, t) for k, t, _ in holds}
            pending = self._pending_ends()
            with _WARNED:
                warned = self._warned_holds
                ended = warned - live - pending
                gone = ended & self._ended_marks  # ended at the last prune too: missed
                warned -= gone
                self._ended_marks = ended - gone
                self._prune_warned_at = len(warned) + max(_PRUNE_FLOOR, len(live))
        finally:
            _PRUNING.release()

    def _held_now(self, key: str, token: int) -> bool:
        """For a check, right before it logs a hold it read: whether that hold is still
        held (a hold that ended since the read is its end's to log). Here (a lane that
        cannot tell cheaply): assumed so."""
        return True

    def _pending_ends(self) -> set[tuple[str, int]]:
        """The holds whose end is on its way to :meth:`_hold_ended` (an in-process
        lane's reports waiting for the reporter thread); a Redis lane: none."""
        return set()

    def _still_held(self, key: str, token: int) -> bool:
        """For :meth:`_hold_ended`: whether the hold is still held, its end not done
        (an in-process lane's release stopped by an interrupt after it queued its
        report). A Redis lane logs in its release, after it: never."""
        return False

    def stuck(self, older_than_s: float) -> list[StuckHold]:
        """The holds older than ``older_than_s`` seconds, oldest first.

        Each is a :class:`lanequeue.StuckHold` (``key``, ``age_s``, ``token``: the hold's
        fencing token). On a Redis lane, the holds of this lane object (this process).
        Also logs the holds past ``warn_hold_s`` not logged yet. O(holds). Thread-safe.
        Raises TypeError/ValueError for a bad threshold.

        Example:

            >>> from lanequeue import Lane
            >>> lane = Lane("global", max_concurrent=2)
            >>> lane.try_acquire("job-1")
            True
            >>> [h.key for h in lane.stuck(0)]
            ['job-1']
            >>> lane.stuck(3600)
            []
        """
        limit = check_timeout(older_than_s, "older_than_s")
        holds = self._hold_list()
        self._check_holds(holds)
        if limit is None:
            return []
        out = [StuckHold(k, age, t) for k, t, age in holds if age >= limit]
        out.sort(key=lambda h: -h.age_s)
        return out

    def close(self) -> None:
        """Refuse new acquisitions (:class:`LaneDrainingError`) and end every wait with
        that error, at once; holders keep their permits until they release. Idempotent;
        the same as ``drain(0, cancel_waiting=True)`` without looking whether the lane
        is idle. Never waits. On an asyncio lane, RuntimeError when not called from the
        lane's event loop. On a Redis lane: this lane object's waiters (this process)."""
        self._start_drain(True)


#: Seconds between two looks of ``wait_idle`` (the release path carries no idle signal).
IDLE_POLL_S = 0.01


def poll_idle(idle: Callable[[], bool], timeout_s: float | None,
              warner: Any = None) -> bool:
    """Block until ``idle()`` is True, looking every :data:`IDLE_POLL_S` seconds, for at
    most ``timeout_s`` seconds (None: no limit; already checked). True if idle on return,
    False when the time ran out first. What every face's thread ``wait_idle`` does; a
    wait that has to block, in a thread that runs an asyncio event loop, warns once per
    ``warner`` (the lane or queue: a :class:`LoopWaitWarner`)."""
    if (warner is not None and timeout_s != 0 and not warner._warned_loop
            and asyncio.events._get_running_loop() is not None and not idle()):
        warner._warn_loop()
    deadline = None if timeout_s is None else time.monotonic() + timeout_s
    while not idle():
        left = None if deadline is None else deadline - time.monotonic()
        if left is not None and left <= 0:
            return False
        time.sleep(IDLE_POLL_S if left is None else min(IDLE_POLL_S, left))
    return True


async def poll_idle_async(idle: Callable[[], bool], timeout_s: float | None) -> bool:
    """:func:`poll_idle` for asyncio, on the running loop's clock."""
    loop = asyncio.get_running_loop()
    deadline = None if timeout_s is None else loop.time() + timeout_s
    while not idle():
        left = None if deadline is None else deadline - loop.time()
        if left is not None and left <= 0:
            return False
        await asyncio.sleep(IDLE_POLL_S if left is None else min(IDLE_POLL_S, left))
    return True


class LoopTimer:
    """Call ``fn(timer)`` at loop time ``when`` (seconds, on ``loop.time()``'s clock), on
    the loop, where an interrupt in the loop's delivery of the call cannot lose it.

    Why: asyncio's loop delivers a timer through Python code (``_run_once`` moves the due
    handle to its ready queue, ``Handle._run`` calls it). A ``KeyboardInterrupt`` raised
    by a signal handler in that stretch, before ``fn``'s first statement (see
    "Interrupts" in :mod:`lanequeue._core`), ends the loop's run with the handle gone
    and ``fn`` never called; a loop run again afterwards would then never call it. So
    this arms TWO handles for the one call: the first to run calls ``fn``, and the other
    is cancelled once ``fn`` returned. One interrupt stops at most one of them; the
    other calls ``fn`` (later, when the loop runs again).

    ``fn`` is called at least once, and is called a second time only when its first
    call raised (an interrupt, or any exception: logged by the loop, as any callback's)
    or an interrupt landed right after it returned: it must take a repeat
    (the timers here act on what is due when they run, so a repeat finds nothing more
    to do, or finishes what the interrupt stopped). ``timer`` is this object, so that
    ``fn`` can tell a call of its current timer from a late one. :meth:`cancel` before
    the call means it never comes. Runs on the loop's thread only (not thread-safe,
    like the loop's own handles).

    Example::

        timer = LoopTimer(loop, loop.time() + 0.5, lambda t: print("due"))
        timer.cancel()  # if it is no longer wanted
    """

    __slots__ = ("fn", "ran", "first", "spare", "_when")

    def __init__(self, loop: asyncio.AbstractEventLoop, when: float,
                 fn: Callable[[LoopTimer], object]) -> None:
        self.fn = fn
        self.ran = False  # True once fn returned (or the timer was cancelled)
        self._when = when
        # (None first: a handle armed by a constructor an interrupt stopped still runs)
        self.first: asyncio.TimerHandle | None = None
        self.spare: asyncio.TimerHandle | None = None
        self.first = loop.call_at(when, self._run)
        self.spare = loop.call_at(when, self._run)

    def _run(self) -> None:
        if self.ran:
            return  # the other handle's call returned already
        self.fn(self)
        self.ran = True
        self.cancel()  # the other handle (cancelling a spent one is a no-op)

    def cancel(self) -> None:
        """Call ``fn`` no more (idempotent)."""
        self.ran = True
        first, spare = self.first, self.spare
        if first is not None:
            first.cancel()
        if spare is not None:
            spare.cancel()

    def when(self) -> float:
        """The loop time the call is due at (seconds), as given."""
        return self._when
