"""The one state machine behind every in-process lane: who holds, who waits, who is next.

Both in-process faces (threads in :mod:`lanequeue.lanes`, asyncio in :mod:`lanequeue.aio`)
drive the two cores below. A face only knows how a waiter *parks* (a thread blocks on a
private lock, a task awaits a future) and how it is *woken* (``Waiter.wake``). Who
holds, who waits, who is next, when an entry is born and when it dies, and the statistics
live here, once.

Rationale
=========
The source design kept one ``threading.Semaphore(1)`` per key in a dict guarded by a lock,
plus a ``held`` flag to keep eviction away from held entries. That leaves windows in which
a key has a waiter but no holder (between looking the entry up and blocking on it, and
between a release and the woken thread resuming); eviction can remove the entry in such a
window, and the next caller creates a second entry for the same key: two holders. It also
lets a newcomer overtake a waiter (a semaphore is not FIFO).

Here the whole state of a lane sits behind ONE short lock (``_lock``): the registry of
entries, each entry's holder and its FIFO queue of waiters, and the counters. Every
operation below is O(1) amortised and never blocks while holding that lock; waiting
happens outside it. A release does not "open the gate" for whoever comes first: it HANDS
the permit to the first waiter in line, under the lock, so there is no window in which a
newcomer can take it (trio's ParkingLot, Go's ``semaphore.Weighted``). Because the entry
always has a holder while it has waiters, an entry is never idle while someone is in line,
so eviction cannot race a waiter (moby/locker's refcount, with holder+waiters as the count).

Per-key core (:class:`SessionCore`), the life of one key::

                 take (free)                       release, no live waiter
      ABSENT ----------------> HELD --------------------------------------> IDLE
        ^                     |  ^                                          |  |
        |          take (busy)|  | release: hand-off to the next live       |  |
        |      -> waiter      v  | waiter (new token, still HELD)           |  |
        |               HELD + WAITERS                                      |  |
        |                                                                   |  |
        |        evicted: expired (idle >= idle_timeout_s), or the oldest   |  |
        +-------- idle entry when a NEW key needs room at max_sessions -----+  |
                                                                               |
                 take (key is IDLE): HELD again, no allocation  <--------------+

- ABSENT: no entry. Every other entry is in ``_entries``. IDLE: ``token == 0`` and no
  waiters. HELD: a holder token, maybe a FIFO line of waiters.
- ``_order`` lists the IDLE entries in the order they went idle (plus HELD entries the
  eviction scan has not met yet, which it drops as it meets them); eviction pops from its
  front. Only IDLE entries are evicted, so ``max_sessions`` is a soft cap: when every
  entry is held, it is exceeded. Going IDLE -> HELD reuses the entry (no allocation) and
  does not touch ``_order``; going HELD -> IDLE moves the entry to the end of it.
- A waiter leaves the line in exactly one of two ways, both under ``_lock``: a releaser
  pops it and grants it (its ``token`` becomes non-zero), or it withdraws itself (timeout,
  cancellation, interrupt) and is removed from the line. :meth:`withdraw` returns the
  token when the grant won the race, so the face can keep the permit or pass it on.

Counting core (:class:`CountingCore`): ``holders`` permits out of ``capacity``, one line
of waiters across all keys, FIFO while every waiter has priority 0, else served by
priority with ageing (see "Priority" in :class:`CountingCore`); while anyone waits,
``holders == capacity`` (a release hands its permit to the next waiter instead of
returning it). Every hold has its own token, so
the same key may hold several permits and each is tracked and released on its own.

Tokens: every grant takes the next integer of the lane, so a token identifies one hold
and grows with every grant (an in-process fencing token). A release names the token it
ends; a release naming no current hold changes nothing and returns ``False``.

Interrupts
==========
A ``KeyboardInterrupt`` raised by a signal handler, or any asynchronous exception, can
land in the middle of an operation. The rules that hold whatever instant it lands at:
the core's lock is never left held; the counters agree with the entries (``holders``
is the number of holds, ``waiters`` the length of the lines); at most the one hold being
entered or left by the interrupted call may stay held, and it is visible in
``get_active()`` and ended by ``manual_release``.

Where CPython delivers such an exception: only where the interpreter checks its "eval
breaker": at the entry of a Python function (``RESUME``), on a backward jump (a loop),
and right after a call returns (the ``CALL`` instructions), plus inside C functions that
wait and check for signals (a blocking ``lock.acquire``, ``time.sleep``). Python 3.10
checks it at one more place: a conditional jump that is taken (``POP_JUMP_IF_FALSE``,
``POP_JUMP_IF_TRUE``: an ``if`` whose body is skipped, a loop's test; not ``and``/``or``
inside an expression), so a run of stores meant to be uninterrupted has no ``if`` either.
A plain store (``x.a = v``, ``d[k] = v``, ``del d[k]`` on a dict of ``str`` or of waiters,
integer arithmetic, a comparison) never checks it. Two consequences shape every critical
section below:

- The lock (an ``RLock``) is taken either by ``with self._lock:`` or, on the hot paths
  (take, release), by ``lock.acquire()`` as the first statement INSIDE a ``try`` whose
  ``finally`` releases it. ``BEFORE_WITH`` calls ``__enter__`` without a check and the
  next instruction is already covered by the ``with`` block's handler; in the second
  form, the check after the ``acquire`` call falls inside the ``try``. Either way no
  exception can fall between "acquired" and "will be released". (``lock.acquire()``
  followed by ``try:`` has exactly that gap: the check after the call is outside the
  ``try``.) ``acquire`` itself can raise before it took the lock (a signal handler's
  exception during a contended wait); the ``finally`` then releases a lock it does not
  own, which an ``RLock`` refuses (RuntimeError, ignored there) where a plain ``Lock``
  would release another thread's hold. The second form exists for speed: a ``with``
  builds two bound methods and an argument tuple per call (about 100 ns on CPython
  3.11), the ``try`` costs nothing. The core never calls itself while holding the lock
  (finalizers only record, see below; a view that a finalizer's warning reaches, through
  a log handler, leaves the records to the next operation: ``_CoreBase._drain``),
  so the ``RLock`` is never re-entered by it. A
  signal handler must not call a lane either: it runs at one of the checks of the
  interrupted code, possibly inside a critical section of that lane.
- Inside the lock, a step first does everything that may run Python code or check the
  breaker (reading the clock, building an entry or a line, asking a waiter if it
  is ``ready()``, looking things up with calls), and only then changes state, with plain
  stores only. An interrupt before the first store changes nothing; after the stores
  there is nothing left to interrupt. The one call allowed after the stores is the
  step's last action, a builtin: the waiter's ``wake(None)`` (``Lock.__exit__``, which
  releases, for a thread; for a task, its future's ``set_result``, which also runs the
  loop's ``call_soon``) or
  ``OrderedDict.move_to_end``. Its check comes after it is done, with the state already
  consistent. Loops that
  change state (eviction, dropping refused waiters, draining dropped holds) are made of
  such steps, each consistent on its own.

The faces (thread and asyncio holds, ``acquire_all``) follow suit. A waiter is made by
the face before the call of :meth:`take` that puts it in line, and inside the ``try``
whose handler withdraws it (a grant made meanwhile is stored in ``waiter.token`` under
the lock, so the handler finds and passes it on): no interrupt can leave a waiter in
line that nobody will withdraw. A second interrupt, landing in that handler, can stop the
withdraw itself; so the handler's first statement, a plain store (a thread waiter's
``gone``) or a builtin call (a task waiter's ``fut.cancel()``), which nothing can
precede, makes the waiter refuse grants (``ready()`` False): a waiter left in line that
way is counted in ``waiters`` until the next release of its key drops it, and never
takes a permit. Ending many waiters (``clear``, a drain's ``cancel_waiting``,
``close``) is a loop of steps, one waiter each, out of its line and woken in one commit:
an interrupt between two steps leaves the others in line, waiting as before. A grant
is recorded where its owner will find it in the grant's own commit: ``take(key, wait,
None, hold)`` stores the token in the hold (``hold._token``, a plain store), ``take(key,
wait, None, None, taken)`` appends it to an ``acquire_all``'s list (the commit's one
last builtin); a parked waiter's face
records it before its wait's handler ends (that handler passes on a grant only if it
is not recorded yet). So an interrupt right after a grant leaves the permit to the hold
(its exit, its finalizer once dropped) or to the ``acquire_all``'s rollback, never to
nobody. A second interrupt may stop that handler before it records or passes on a grant
made to its parked waiter: so the hold (or the ``acquire_all``) keeps its parked waiter
from before it can be granted (``_parked``, a plain store), and its finalizer returns a
grant found there and recorded nowhere (:func:`parked_grant`). Only a grant to the
lane object itself (``try_acquire``, ``acquire_timeout``) is returned, its caller then
holding it by key. A hold is marked released right before the core releases it; an
interrupt between the two leaves that one hold held in the core, and nothing else:
``manual_release`` ends it, and so does the hold's finalizer when the hold is dropped
(:func:`end_marked`: the core still holding a token marked released means its release
never ran; tokens are never reused). An
``acquire_all`` records that a release pass began (``MULTI_LEAVING``), and empties its
list only once every token in it is released: after an interrupt, a second pass
(``release()``) and the finalizer end only the tokens the cores still hold.
tests/test_inprocess_faults.py raises an exception at every instruction of these
operations (C18). The holds of both faces run the two commonest steps of their core
themselves (:class:`SessionHoldSteps`, :class:`CountingHoldSteps`, in this module and under
its rules): there the token is stored in the hold in the same commit as the grant.

Dropped holds
=============
A hold that is garbage-collected while still held (entered, never left nor released)
warns with a ``ResourceWarning`` naming the lane and the key, and its permit comes back.
Its finalizer may run at any instruction of any code, including while this same thread
holds the core's lock (a collection can start inside a critical section), so it must not
take the lock: it only appends ``(key, token)`` to ``_dropped`` (``list.append`` is
atomic), as its first call, so an interrupt can lose the drop only at the finalizer's
very entry (and, for an ``acquire_all``, between the appends of its lanes). The
finalizer then asks the face to end them now, so a waiter already parked is not left
to its timeout: a thread lane does when its lock is free, and else hands the work to the
process's settler thread (:func:`settle_later`: the lock is taken, by this thread's own
operation or another thread's, and the settler tries again until it is free), an asyncio
lane in a callback on its loop. The settler runs while a thread waits on a thread lane
(:class:`_Settler`, started as a waiter joins a line), so a parked waiter never waits
for a dropped hold's permit until some later operation. Besides, the lane's next
operation that could need that permit ends them first, in any thread, as releases that
may hand the key to the next waiter: every call into the core's ``take`` and
``release`` (an acquire that finds the key held or the lane full, a new key, a release
with a line, a release by key) and every view (``get_active()``, ``stats``,
``active_count``, ``is_held``). The holds' fast steps (an IDLE key, a free
permit, a release with nobody in line) pay nothing for it: a permit taken by a dropped
hold is only needed by a caller that finds the key held or the lane full, and that
caller takes the general path (C20).

The finalizer itself costs a Python call when a hold is freed, which is 7% of an
uncontended cycle; only a hold still held needs it. So the classes ``acquire`` makes carry
it (:class:`lanequeue._kinds._DropWatch`), and leaving the block, as its last step, turns
the hold into its face's public hold class, which has none.

fork
====
A child made by ``os.fork()`` has only the thread that forked; the threads that held
permits or waited in the parent do not exist in it, and the core's lock may have been
held by one of them at that instant. Every live core (kept in a ``WeakSet``) is
therefore reset in the child (``os.register_at_fork``): a new lock, no holds, no waiters,
no entries. The child's lanes start empty; tokens continue from the parent's last one;
the counters keep the parent's history, and the holds the parent had at the fork count
as released, so ``acquired == released + holders`` (C19). Ending such a hold in the
child (leaving its block, ``release()``) is then an unmatched release by token: counted,
not logged, like any hold ended meanwhile (see :func:`_warn_unmatched`); a
``manual_release(key)`` of it is logged, as any release by key that matches no hold.

Time: a monotonic clock (``time.monotonic`` unless the lane is given another), read only
for idle ages, hold ages and, on a counting lane, the instant a waiter joins the line
(its ageing runs from there); deadlines of waiting belong to the faces.

Operations (drain, clear, metrics; see :mod:`lanequeue._obs`), kept off the hot path:
``take`` checks one flag (``draining``) and refuses while it is set (checked again
under the lock, before a grant or a join: a drain set between the two has ended the
waiters in line already; ``drain()`` / ``close()`` set the flag under that lock, so
no grant is made after they return); a release observes
the hold's length only once an exporter turned hold times on (``hold_hist``: one
append of ``now - since`` to a list, bucketed by :meth:`_CoreBase._fold_holds` once
the token released reaches ``hold_fold_at`` (about every :data:`~lanequeue._obs.HELD_BATCH`
releases) and at read time; on a per-key lane the release reads the clock anyway, for
the idle age, so hold times add no clock read there). A lane's ``warn_hold_s``
(:meth:`_CoreBase.watch_holds`) turns hold times on too, and makes every release call
``_fold_holds``, which hands a hold that lasted that long to a reporter thread (one
builtin call under the lock; the lane logs it off the lock). Waits are
observed by the faces' slow path (:meth:`_CoreBase.observe_wait`), or, for a face whose
waiters' ``since`` is on the core's clock (``waits_at_grant``), by the hand-off that ends
them (under the lock it holds anyway; the face observes the others); immediate grants are
counted at read time. ``clear``/``drain`` end waits through the same grant machinery as a
hand-off: the waiter is granted a negative outcome token (:data:`CLEARED`,
:data:`DRAINED`) instead of a permit, and its face raises the matching error.
"""

from __future__ import annotations

import heapq
import logging
import os
import queue
import threading
import time
import weakref
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any, ClassVar, Protocol, TypeVar

from ._errors import LaneClearedError, LaneDrainingError, shown
from ._obs import HELD_BATCH, HOLD_BUCKETS, WAIT_BUCKETS, Histogram, HistogramSnapshot

__all__ = [
    "CLEARED",
    "DEFAULT_AGEING_S",
    "DRAINED",
    "Core",
    "CountingCore",
    "CountingHoldSteps",
    "LaneStats",
    "MultiHoldSteps",
    "SessionCore",
    "SessionHoldSteps",
    "Waiter",
]

_R = TypeVar("_R")  # what a view reads (see _CoreBase._read_evicted)

log = logging.getLogger("lanequeue")

Clock = Callable[[], float]

# ``OrderedDict.move_to_end`` called as a function: ``od.move_to_end(key)`` is a method
# call the interpreter does not specialize for an OrderedDict (CPython 3.11), this is.
_to_end = OrderedDict.move_to_end

#: Outcome tokens handed to a waiter by :meth:`_CoreBase.end_waiters` instead of a
#: permit: its wait was ended by ``clear(key)``, or by a drain/close.
CLEARED = -1
DRAINED = -2

#: Seconds of waiting that raise a counting lane's waiter by one priority level.
DEFAULT_AGEING_S = 30.0


def ended_error(lane: str, key: str, outcome: int) -> LaneClearedError | LaneDrainingError:
    """The error a face raises for a wait ended with ``outcome`` (a negative token)."""
    if outcome == CLEARED:
        return LaneClearedError(lane, key)
    return LaneDrainingError(lane, key)


class Waiter:
    """One caller in line for a permit. Faces subclass it to say how a waiter is woken.

    ``token`` is 0 while the waiter waits and becomes the granted token when a releaser
    hands it the permit. A grant asks :meth:`ready` first (a call, before any change),
    then records the grant with plain stores (``token`` included), and calls ``wake``
    last, as ``wake(None)``. Both run with the core's lock held: they must not block and
    must not call back into the core. ``wake`` should be a builtin taking that one
    argument (a lock's ``__exit__``, which releases it; a future's ``set_result``): a
    call of a Python function could be interrupted before it woke anyone.
    """

    __slots__ = ("token", "left", "wake", "since", "rank", "ahead", "behind")

    wake: Callable[[None], object]
    # ``since``: when the face parked it (the face's clock); unset until then (set
    # before it joins a line whose core has ``waits_at_grant``).
    since: float
    # ``rank``: set by a counting core when the waiter joins its FIFO line, as
    # ``(join time, join number)`` (see CountingCore, "Priority"); unset until then.
    rank: tuple[float, int]
    # Set by the commit that puts it in a line (unset until then), for the slow-wait
    # warning: ``ahead``, the waiters in that line then (on a counting lane, all its
    # waiters); ``behind``, when nobody was, since when (core clock) the hold it waits
    # behind exists (a counting lane: its oldest hold), else None.
    ahead: int
    behind: float | None

    def __init__(self) -> None:
        self.token = 0
        self.left = False  # set once it has withdrawn: a second withdraw is a no-op

    def ready(self) -> bool:
        """False if this waiter can no longer take a permit (its task was cancelled);
        the releaser then drops it from the line and tries the next one."""
        return True


class Core(Protocol):
    """The contract both cores offer the faces (see the module docstring)."""

    name: str
    seen_busy: bool  # a face's hint (see _CoreBase)

    def take(self, key: str, wait: bool, waiter: Waiter | None = None,
             hold: Any = None, taken: list[Any] | None = None) -> int: ...

    def release(
        self, key: str, token: int = 0, dropped: tuple[str, int] | None = None
    ) -> bool: ...

    def withdraw(self, key: str, waiter: Waiter, *, timed_out: bool) -> int: ...

    def drop(self, key: str, token: int) -> None: ...

    def owns(self, key: str, token: int) -> bool: ...


@dataclass(frozen=True, slots=True)
class LaneStats:
    """A snapshot of a lane's counters, taken atomically.

    Attributes (all counts since the lane was created, except the last two):
        acquired: permits granted (immediately or by hand-off).
        released: holds ended: by a matching release, by the return of a dropped hold's
            permit, or (in a forked child) by the fork, which empties the lane.
        timeouts: waits that ran out (non-blocking refusals are not counted here).
        rejected: non-blocking refusals (``try_acquire``, or a zero timeout, on a busy
            key or a full lane); not counted in ``timeouts``.
        cancelled: waits abandoned by cancellation or an exception such as
            KeyboardInterrupt, or ended by ``clear()`` / ``drain(cancel_waiting=True)`` /
            ``close()`` (not counted in ``timeouts``).
        evicted: idle per-key entries removed (expired or to make room); 0 on a Lane.
        unmatched_releases: releases that matched no hold and changed nothing.
        holders: permits held now.
        waiters: callers waiting now.

    Always ``acquired == released + holders``.
    """

    acquired: int = 0
    released: int = 0
    timeouts: int = 0
    rejected: int = 0
    cancelled: int = 0
    evicted: int = 0
    unmatched_releases: int = 0
    holders: int = 0
    waiters: int = 0

    def to_dict(self) -> dict[str, int]:
        """The snapshot as a plain ``dict`` (for logs, JSON, metrics)."""
        return asdict(self)


# Every live core, so that a forked child can empty them all (see _after_fork_in_child).
_LIVE: weakref.WeakSet[_CoreBase] = weakref.WeakSet()


class _CoreBase:
    """State and bookkeeping common to both cores. All fields change under ``_lock``,
    except ``_dropped``, to which finalizers append without it."""

    __slots__ = (
        "name",
        "_lock",
        "_clock",
        "_token",
        "_waiting",
        "_dropped",
        "timeouts",
        "rejected",
        "cancelled",
        "evicted",
        "unmatched",
        "draining",
        "wait_hist",
        "waited",
        "hold_hist",
        "hold_fold_at",
        "hold_shown",
        "hold_warn_s",
        "hold_report",
        "reports_pending",
        "per_key",
        "waits_at_grant",
        "seen_busy",
        "settles_elsewhere",
        "settler_watches",
        "__weakref__",
    )

    def __init__(self, name: str, clock: Clock) -> None:
        self.name = name
        self._lock = threading.RLock()
        self._clock = clock
        # The last token granted. Tokens start at 1 (0 means "none") and every grant takes
        # the next one, so this is also the count of grants: acquired == _token and
        # released == _token - holders, with no counter to bump on the hot path.
        self._token = 0
        self._waiting = 0  # waiters in line, over all keys
        # (key, token) of holds dropped without release, appended by their finalizers
        # (list.append is atomic and takes no lock); drained by the next operation. Only
        # a release under the lock removes an item (the front one), in the same step
        # that ends its hold.
        self._dropped: list[tuple[str, int]] = []
        self.timeouts = 0
        self.rejected = 0
        self.cancelled = 0
        self.evicted = 0
        self.unmatched = 0
        # Operations (see lanequeue._obs). Set by drain()/close(): take refuses while set.
        self.draining = False
        # Waits that parked (grants after a wait, timeouts, cancellations), observed by
        # the faces' slow path. Immediate grants are added at read time as acquired -
        # waited (``waited``: the grants that parked), so the fast path pays nothing.
        self.wait_hist = Histogram(WAIT_BUCKETS)
        self.waited = 0
        # Set by a face whose waiters' ``since`` is read on this core's clock, and set
        # before they join the line: a hand-off then observes the wait it ends (one
        # append of ``now - since``, under the lock it holds anyway, before its stores;
        # its commit counts ``waited``), and the face observes only the waits that end
        # otherwise. An interrupt between the append and the commit leaves a wait
        # observed once more for each hand-off it stops (so may a hold time be, for each
        # release it stops); a grant is never left uncounted.
        self.waits_at_grant = False
        # A hint kept by the asyncio face (no lock, no rule): a take found the lane busy
        # lately, so its next acquire looks before taking (see aio._looks_busy).
        self.seen_busy = False
        # Set by the asyncio face to its loop's (see aio._settles_on): called by a view
        # that finds dropped holds, True when it asked the loop to end them instead (a
        # view from another thread than the running loop's: a hand-off wakes a task, which
        # only the loop's thread may do).
        self.settles_elsewhere: Callable[[], bool] | None = None
        # In the settler's ``watched`` (see _Settler): a waiter's check without its lock.
        self.settler_watches = False
        # Hold times, observed by release once an exporter turns them on, or a lane's
        # ``warn_hold_s`` (None: off); read by exporters only when ``hold_shown``.
        self.hold_hist: Histogram | None = None
        # The token from which a release folds the hold times (see _fold_holds).
        self.hold_fold_at = 0
        self.hold_shown = False  # track_holds() was called
        # A lane's ``warn_hold_s`` (None: off) and where a release reports a hold that
        # lasted that long (see watch_holds).
        self.hold_warn_s: float | None = None
        self.hold_report: Callable[[], Callable[[str, int, float], object] | None] | None = None
        # (key, token) of the holds whose reports wait for the reporter thread (added as
        # queued, discarded by the lane's report: see lanequeue._ops LaneOps._prune_warned).
        self.reports_pending: set[tuple[str, int]] = set()
        # True on a SessionCore: what the hot paths that serve both kinds
        # (MultiHoldSteps, through ``Plan.kinds``) branch on.
        self.per_key = False
        _LIVE.add(self)

    # Per core: end a hold; with ``dropped`` (the front item of ``_dropped``), end that
    # dropped hold and remove the item in the same step, quietly (see _drain).
    release: Callable[[str, int, tuple[str, int] | None], bool]
    # Per core, with the lock held: the line ``waiter`` (a waiter for ``key``) stands in,
    # or stood in (None if none): a table of waiters -> key.
    _line_of: Callable[[str, Waiter], dict[Waiter, str] | None]
    # Per core: forget every hold, waiter and entry (a forked child's fresh start).
    _clear: Callable[[], None]

    # Per core: True while the hold ``token`` of ``key`` exists (a plain lookup, no lock:
    # one dict read sees a consistent entry).
    owns: Callable[[str, int], bool]

    def count_unmatched(self) -> None:
        """Count a release that matched no hold and changed nothing (a hold released a
        second time)."""
        with self._lock:
            self.unmatched += 1

    def _next_waiter(self, line: OrderedDict[Waiter, str]) -> Waiter | None:
        """The first waiter of ``line`` able to take a permit, or None (lock held).

        Waiters that refuse (their task was cancelled) are dropped from the line on the
        way, each in a step of its own that leaves the state consistent; they count
        themselves as cancelled when they run :meth:`withdraw`. O(1) amortised.
        """
        while line:
            waiter = next(iter(line))
            if waiter.ready():
                return waiter
            del line[waiter]
            self._waiting -= 1
        return None

    def drop(self, key: str, token: int) -> None:
        """Give back the permit of a hold that was dropped without release: only record
        it (a finalizer may run while this thread holds the lock); the next operation
        that takes the lock ends it. The holds' finalizers make this same append inline,
        as their first call (see "Dropped holds")."""
        self._dropped.append((key, token))

    def _drain(self) -> None:
        """End the holds recorded by :meth:`drop`, oldest first (called WITHOUT the lock,
        at the start of an operation; each release takes it).

        A dropped hold that no longer exists (released by key meanwhile) is skipped
        without a warning or a count: its finalizer already warned. Two threads may
        drain at once: each release checks, under the lock, that its item is still the
        front one.

        Left to the next operation when this thread is inside the core: a finalizer may
        run in any allocation under the lock, and its warning's handler may call a view
        (``status()``, ``stuck()``), which drains first; a release there would run in
        the middle of the outer operation (the RLock lets it in).
        """
        if self._lock._is_owned():  # type: ignore[attr-defined]
            return
        dropped = self._dropped
        while dropped:
            item = dropped[0]
            self.release(item[0], item[1], item)

    def _settle(self) -> None:
        """Drain the dropped holds now, if there are any (before a view); on an asyncio
        lane's running loop only (from another thread the loop is asked to, and the view
        shows them held until it has: ``settles_elsewhere``)."""
        if self._dropped:
            elsewhere = self.settles_elsewhere
            if elsewhere is not None and elsewhere():
                return
            self._drain()

    def _still_dropped(self, item: tuple[str, int]) -> bool:
        """(lock held) True while ``item`` is the front item of ``_dropped``."""
        dropped = self._dropped
        return bool(dropped) and dropped[0] is item

    def withdraw(self, key: str, waiter: Waiter, *, timed_out: bool) -> int:
        """Take ``waiter`` out of line (its wait ran out, or it was cancelled/interrupted).

        Returns the waiter's token if a releaser granted it first: the caller then holds
        the permit and must keep it or release it. Returns 0 otherwise; the waiter then
        holds nothing and is no longer counted anywhere. A second call for the same waiter
        (a timer withdrew it, then its task was cancelled before resuming) changes nothing.
        """
        with self._lock:
            if waiter.token:
                return waiter.token
            if waiter.left:
                return 0
            line = self._line_of(key, waiter)
            # -- commit: plain stores only --
            waiter.left = True
            if line is not None and waiter in line:  # else a releaser dropped it already
                del line[waiter]
                self._waiting -= 1
            if timed_out:
                self.timeouts += 1
            else:
                self.cancelled += 1
            return 0

    # -- operations (off the hot path; see lanequeue._obs) ------------------------------

    # Each core: its waiters for ``key`` (None: all), each with the line it stands in, in
    # line order (nothing changed); the first waiter
    # of each line; since when the hold that blocks ``key`` exists (clock seconds); every
    # hold as (key, token, since); the length of the line ``key`` joins. Lock held.
    _in_line: Callable[[str | None], list[tuple[Waiter, dict[Waiter, str]]]]
    _line_heads: Callable[[], list[Waiter]]
    _blocker_since: Callable[[str], float | None]
    _hold_list: Callable[[], list[tuple[str, int, float]]]
    _line_len: Callable[[str], int]
    holders: Callable[[], int]

    def observe_wait(self, seconds: float, granted: bool) -> None:
        """Count a wait that parked and ended after ``seconds``; ``granted`` if it ended
        holding the permit. One list append (bucketed in batches, as hold times are):
        this runs once per wait, on the hot path of a contended lane."""
        hist = self.wait_hist
        lock = self._lock
        try:
            lock.acquire()  # inside the try: see "Interrupts" in the module docstring
            if len(hist) >= HELD_BATCH:
                hist.fold()
            # -- commit: plain stores, then one last builtin --
            if granted:
                self.waited += 1
            hist.append(seconds)
        finally:
            try:
                lock.release()
            except RuntimeError:  # acquire was interrupted before it took the lock
                pass

    def track_holds(self) -> None:
        """Start observing hold times for exporters (idempotent; see :meth:`_fold_holds`)."""
        with self._lock:
            if self.hold_hist is None:
                self.hold_fold_at = self._token + HELD_BATCH
                self.hold_hist = Histogram(HOLD_BUCKETS)
            self.hold_shown = True

    def watch_holds(
        self, limit: float | None,
        report: Callable[[], Callable[[str, int, float], object] | None] | None,
    ) -> None:
        """Report each hold that lasted ``limit`` seconds or more as it ends (None: stop):
        the release that ends it calls ``report()`` under the lock (a weak reference to
        the lane's method: the core does not keep its lane alive) and, when that gives a
        function, hands it and ``(key, token, seconds held)`` to the reporter thread,
        which calls it off the lock: a lane's ``warn_hold_s``. Hold times are then observed
        by every release (as for exporters, which see them only after
        :meth:`track_holds`), and each release calls :meth:`_fold_holds`, which checks
        the hold it ended."""
        if limit is not None:
            _REPORTER.start()  # (off the lock: it may start a thread)
        with self._lock:
            if limit is None:
                self.hold_warn_s = None
                self.hold_report = None
                self.hold_fold_at = self._token + HELD_BATCH
                if not self.hold_shown:  # measured only for the watch: no more
                    self.hold_hist = None
                return
            if self.hold_hist is None:
                self.hold_hist = Histogram(HOLD_BUCKETS)
            self.hold_report = report
            self.hold_warn_s = limit
            self.hold_fold_at = 0  # every release calls _fold_holds

    def _fold_holds(self, held: Histogram, key: str, token: int) -> None:
        """Bucket the hold times appended so far to ``held``, the core's ``hold_hist``
        (lock held); ``key`` and ``token``: the hold whose time was just appended. A
        release appends its hold time to it and calls this once the token
        it ends reaches ``hold_fold_at``: one compare of two small integers on the
        release's path, where a length check costs a builtin call. Bounded: after a
        fold, the releases that do not fold are those of the holds alive at the fold and
        of the next :data:`~lanequeue._obs.HELD_BATCH` grants, so the list never holds
        more values than that. Interrupt-safe: ``fold`` is (see :meth:`Histogram.fold`),
        and the threshold is a plain store after it (an interrupt between the two leaves
        the old threshold: the next release folds again).

        With ``hold_warn_s`` set (:meth:`watch_holds`), every release calls this
        (``hold_fold_at`` stays 0): a hold that lasted that long is handed to the
        reporter thread by one builtin call (``SimpleQueue.put``, no Python code: the
        lock is held, and this runs before the release's stores; an interrupt after it
        leaves the hold held and its report queued: the lane's report, made once it has
        the lock, finds the hold still held and says nothing, and the hold's real end
        reports it), and the list is folded once it holds
        :data:`~lanequeue._obs.HELD_BATCH` values."""
        limit = self.hold_warn_s
        if limit is None:
            held.fold()
            self.hold_fold_at = self._token + HELD_BATCH
            return
        age = held[-1]
        report = self.hold_report
        if age >= limit and report is not None:
            fn = report()  # (the lane's method, alive for as long as the report waits)
            if fn is not None and _report_later(fn, key, token, age):
                self.reports_pending.add((key, token))
        if len(held) >= HELD_BATCH:
            held.fold()

    def metrics_read(
        self,
    ) -> tuple[LaneStats, HistogramSnapshot, HistogramSnapshot | None, int | None]:
        """The counters, the wait histogram (its first bucket includes the immediate
        grants: ``acquired - waited``), the hold histogram (None: off) and the live
        per-key entries (None: a counting core), read together in one hold of the lock,
        the hold that evicts the last expired entries (so ``evicted`` counts every entry
        the live count no longer has: see :meth:`_read_evicted`)."""
        return self._read_evicted(self._metrics_now)

    def _metrics_now(
        self,
    ) -> tuple[LaneStats, HistogramSnapshot, HistogramSnapshot | None, int | None]:
        # (lock held: metrics_read)
        hold = self.hold_hist
        return (
            self._stats(self.holders()),
            self.wait_hist.snapshot(self._token - self.waited),
            None if hold is None or not self.hold_shown else hold.snapshot(),
            self._live_count(),
        )

    def view(self) -> tuple[LaneStats, int | None]:
        """The counters and the live per-key entries (None: a counting core), read
        together as :meth:`metrics_read` reads them (for ``status()``)."""
        return self._read_evicted(self._view_now)

    def _view_now(self) -> tuple[LaneStats, int | None]:
        # (lock held: view)
        return self._stats(self.holders()), self._live_count()

    def _read_evicted(self, read: Callable[[], _R]) -> _R:
        """(lock not held) What ``read()`` returns, called under the lock once the
        dropped holds are settled and every expired per-key entry is evicted: the
        eviction runs :data:`EVICT_STEPS` entries per hold of the lock (so callers of
        other keys wait for one such hold at most), and ``read`` runs in the hold of the
        last pass, the one that found nothing more due. Every view of the registry reads
        through here.

        Inside the core already (this thread holds the lock: a finalizer ran at an
        allocation of an operation, an eviction pass say, and its warning's handler
        called a view; the RLock lets it in), the view reads the registry as it is and
        evicts nothing, as :meth:`_drain` leaves the dropped holds: a pass here would
        evict, and maybe rebuild, the tables under the outer operation, which holds them
        in its locals (an eviction pass copying them for its rebuild brought back entries
        that were no longer in the eviction order, for good)."""
        self._settle()
        lock = self._lock
        inside = lock._is_owned()  # type: ignore[attr-defined]
        while True:
            with lock:
                if inside or not self._evict_pass():
                    return read()

    def _evict_pass(self) -> bool:
        """(lock held) One pass of :meth:`_read_evicted`'s eviction; True when more may
        be due. A counting core has no entries to evict."""
        return False

    def _live_count(self) -> int | None:
        """(lock held) The live per-key entries; None on a counting core, which has
        none."""
        return None

    def end_waiters(self, key: str | None, cleared: bool, only: Waiter | None = None) -> int:
        """End the waits of ``key`` (None: every key) through the grant machinery: each
        waiter able to take a grant is granted the outcome :data:`CLEARED` (``cleared``)
        or :data:`DRAINED` instead of a token, and its face raises the matching error.
        ``only``: end that one waiter, if it is still in line for ``key`` (its owner
        gave up on it), and no other. Returns how many waiters took it (they count as
        ``cancelled``; a cancelled task refuses it and counts itself when it withdraws).
        Holders are untouched. Each waiter is one step: asked if it is ``ready()``, then
        taken out of its line with plain stores, then woken; an interrupt between two
        steps leaves the waiters not reached yet in line, waiting as before."""
        outcome = CLEARED if cleared else DRAINED
        n = 0
        with self._lock:
            for waiter, line in self._in_line(key):
                if only is not None and waiter is not only:
                    continue
                ready = waiter.ready()
                # -- commit: plain stores only, then the wake-up --
                del line[waiter]
                self._waiting -= 1
                if ready:
                    waiter.token = outcome
                    self.cancelled += 1
                    n += 1
                    waiter.wake(None)
            self._tidy_lines()
        return n

    def _tidy_lines(self) -> None:
        """After :meth:`end_waiters` took waiters out of line (lock held): drop what
        only served the waiters now gone (interrupted before it, nothing is wrong, only
        untidy)."""

    def oldest_wait_since(self) -> float | None:
        """When the longest waiter now in line started waiting (face clock), or None."""
        with self._lock:
            starts = [getattr(w, "since", None) for w in self._line_heads()]
        known = [s for s in starts if s is not None]
        return min(known) if known else None

    def holder_age(self, key: str) -> float | None:
        """Seconds the hold that a waiter for ``key`` waits behind has lasted (the key's
        holder; on a counting lane the lane's oldest hold), None if there is none."""
        with self._lock:
            since = self._blocker_since(key)
            return None if since is None else self._clock() - since

    def queued(self, key: str) -> int:
        """Waiters in the line ``key`` joins (its key's line; the lane's on a counting
        lane)."""
        with self._lock:
            return self._line_len(key)

    def hold_list(self) -> list[tuple[str, int, float]]:
        """Every hold now as (key, token, seconds held)."""
        self._settle()
        with self._lock:
            now = self._clock()
            return [(k, t, now - s) for k, t, s in self._hold_list()]

    def _stats(self, holders: int) -> LaneStats:
        return LaneStats(
            acquired=self._token,
            released=self._token - holders,
            timeouts=self.timeouts,
            rejected=self.rejected,
            cancelled=self.cancelled,
            evicted=self.evicted,
            unmatched_releases=self.unmatched,
            holders=holders,
            waiters=self._waiting,
        )

    def _after_fork(self) -> None:
        """In a forked child: a new lock, no holds, no waiters, no entries (the threads
        that held or waited do not exist here). Tokens keep growing from the parent's
        last one, and the counters keep the parent's history: the holds the parent had
        count as released, so ``acquired == released + holders`` still holds (they
        never ended here, so they add no hold time)."""
        self._lock = threading.RLock()
        self._waiting = 0
        self._dropped = []
        self.reports_pending = set()  # (the parent's reports are not the child's)
        self._clear()

    @property
    def waiting(self) -> int:
        """Callers in line now, over all keys."""
        return self._waiting


def at_fork_in_child(fn: Callable[[], object]) -> None:
    """Have ``fn`` called in the child of every ``os.fork()`` from now on (where the
    platform forks: nothing where ``os.register_at_fork`` does not exist)."""
    if hasattr(os, "register_at_fork"):
        os.register_at_fork(after_in_child=fn)


def _after_fork_in_child() -> None:
    for core in list(_LIVE):
        core._after_fork()


at_fork_in_child(_after_fork_in_child)


# -- work done off the lock, by daemon threads --------------------------------------------------
class _Daemon:
    """A daemon thread of this process that serves one queue (the reporter's), started
    on demand (:meth:`start`: idempotent, thread-safe; an interrupt that stops it before the
    thread starts leaves the next call to start it). ``queue`` is read anew by every
    caller, so that a forked child's fresh queue is seen by every core: in a child the
    parent's thread does not exist, and :meth:`after_fork` makes a new queue, and a new
    thread if the parent had started one. ``started``: True once a thread was started
    (a daemon ends only with the interpreter), read by finalizers as one attribute
    load. The lock is an RLock: a finalizer may run while ``start`` holds it (a thread's
    start allocates), and its warning's handler may set a lane's ``warn_hold_s``, which
    starts the reporter: that start begins a second thread on the same queue (harmless:
    each report is handled once), where a plain lock would hang the thread."""

    __slots__ = ("name", "_target", "queue", "started", "_thread", "_lock")

    def __init__(self, name: str, target: Callable[[queue.SimpleQueue[Any]], None]) -> None:
        self.name = name
        self._target = target
        self.queue: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self.started = False
        self._thread: threading.Thread | None = None
        self._lock = threading.RLock()
        at_fork_in_child(self.after_fork)

    def start(self) -> None:
        with self._lock:
            thread = self._thread
            if thread is None or not thread.is_alive():
                thread = threading.Thread(target=self._target, args=(self.queue,),
                                          name=self.name, daemon=True)
                thread.start()
                self._thread = thread
                self.started = True

    def after_fork(self) -> None:
        self._lock = threading.RLock()
        had = self.started
        self._thread = None
        self.started = False
        self.queue = queue.SimpleQueue()
        if had:
            self.start()


# A release that ends a hold that lasted a lane's ``warn_hold_s`` runs under the core's lock,
# where no observer's code may run (a log handler may block, or call into the lane): it
# puts ``(report, key, token, seconds)`` on the reporter's queue with one builtin call
# (``report``: the lane's method, from the weak reference the core keeps), and the reporter
# thread, started by ``watch_holds``, calls ``report(key, token, seconds)``. At most
# :data:`REPORTS_MAX` wait (a handler slower than the long holds come, or a limit so low
# that every hold passes it): the others are counted, not queued, and the thread logs
# how many it missed.
#: Reports of long holds that may wait for the reporter thread at once.
REPORTS_MAX = 1000
_missed = [0]  # reports not queued (the queue was full), not yet logged


def _report_later(fn: Callable[[str, int, float], object], key: str, token: int,
                  seconds: float) -> bool:
    """Queue a report for the reporter thread (lock held: builtins only) and return
    True, or count it missed when :data:`REPORTS_MAX` wait already (False)."""
    reports = _REPORTER.queue
    if reports.qsize() < REPORTS_MAX:
        reports.put((fn, key, token, seconds))
        return True
    _missed[0] += 1
    return False


def _run_reports(reports: queue.SimpleQueue[Any]) -> None:
    """The reporter thread: call each report; never dies of one (a log handler that
    raises, even a BaseException, loses that report only). The reports missed meanwhile
    are counted in one line once the waiting reports are logged (the queue is empty): a
    report is missed only while the queue is full, so a report always comes after it.
    (Logged after each report, a slow handler gave one count line per report.)"""
    while True:
        try:
            fn, key, token, seconds = reports.get()
            try:
                fn(key, token, seconds)
            finally:
                del fn  # (not kept alive until the next report)
            if not _missed[0] or not reports.empty():
                continue
            missed, _missed[0] = _missed[0], 0
            if missed:
                log.warning("%d reports of holds past warn_hold_s were not logged: more "
                            "than %d waited for the log at once", missed, REPORTS_MAX)
        except BaseException:  # (a broken log handler: nothing to tell it with)
            pass


def _missed_after_fork() -> None:
    _missed[0] = 0


at_fork_in_child(_missed_after_fork)
_REPORTER = _Daemon("lanequeue-reports", _run_reports)


#: Seconds the settler thread stays with no thread waiting on a thread lane and nothing to
#: do, before it ends.
SETTLER_IDLE_S = 1.0
#: Seconds between two tries of a lane whose lock stays taken: the first, and the most.
SETTLE_RETRY_S = (0.001, 0.05)


class _Settler:
    """The settler thread: ends dropped holds whose finalizer found a thread lane's lock
    taken (see "Dropped holds"), once that lock is free (:func:`settle_later` queues a
    weak reference to the core). Its own thread, not the reporter's: a slow log handler
    must not hold a permit back from a parked waiter. It never blocks on one lane's lock
    while others wait: a lane whose lock is taken is tried again a moment later (a log
    handler may run for seconds under a lane's lock, when a finalizer's warning reaches
    it there), and the requests for one lane merge into one.

    It runs only while a thread waits on a thread lane: a waiter of the thread face,
    once in line, calls :meth:`wait_begins` with its core, which starts the thread if
    none runs and adds the core to ``watched`` (weakly). Every :data:`SETTLER_IDLE_S`,
    whatever else it is doing, the thread looks at the watched cores: it ends if none has
    a waiter in line (a process whose waits are over has no thread of the library's:
    ``os.fork()`` of a process with threads warns on Python 3.12+, and is unsafe; a
    forked child starts with none), and else ends the dropped holds it finds there that
    nobody asked it for (a finalizer stopped by an interrupt before it could ask: the
    waiter then gets the permit within about that time, not at its timeout). No count
    is kept that an interrupt could leave wrong: the cores' own lines are the truth. A
    thread that cannot start (a limit on threads) fails no wait: the dropped holds then
    wait for the lane's next operation, as they would with no waiter.

    Why after joining the line: the thread decides to end under ``_lock`` after
    reading the lines, and :meth:`wait_begins` reads ``started`` under it too, so a
    waiter already in line is either seen by that decision or starts a new settler. A
    hold dropped between the join and that call, with no settler running, is ended by
    the waiter itself (``_park``: the core's dropped holds, right after this call).

    ``_lock`` is an RLock: a finalizer's handler may wait on a lane while this thread
    starts the settler; the inner start makes a second settler on the same queue
    (harmless: each request is served once, and each ends on its own)."""

    __slots__ = ("queue", "started", "watched", "_lock")

    def __init__(self) -> None:
        self.queue: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self.started = False  # a settler runs (read by finalizers: one attribute load)
        self.watched: weakref.WeakSet[_CoreBase] = weakref.WeakSet()
        self._lock = threading.RLock()
        at_fork_in_child(self.after_fork)

    def wait_begins(self, core: _CoreBase) -> None:
        """A thread waiter of ``core`` is in line (see the class). The waiter calls this
        unless the settler runs and watches ``core`` already (``started`` and the core's
        ``settler_watches``, read without the lock: the settler ends, and stops watching
        a core, only under the lock and only when the core has no waiter, and this one
        is in line before it reads them)."""
        with self._lock:
            self.watched.add(core)
            core.settler_watches = True
            if not self.started:
                thread = threading.Thread(target=self._run, args=(self.queue,),
                                          name="lanequeue-settle", daemon=True)
                try:
                    thread.start()
                except RuntimeError:  # no thread can start now: see the class
                    return
                self.started = True

    def after_fork(self) -> None:
        self._lock = threading.RLock()
        self.started = False
        for core in list(self.watched):
            core.settler_watches = False
        self.watched = weakref.WeakSet()
        self.queue = queue.SimpleQueue()

    def _scan(self, requests: queue.SimpleQueue[Any],
              pending: dict[weakref.ref[_CoreBase], None]) -> bool:
        """Every :data:`SETTLER_IDLE_S`: True to end (no watched core has a waiter, nothing
        queued: requests for cores nobody waits on are left to their next operation);
        else the watched cores' dropped holds nobody asked for go to ``pending``, and the
        cores with neither waiters nor dropped holds stop being watched."""
        with self._lock:
            watched = list(self.watched)
            if not any(core._waiting for core in watched) and requests.empty():
                self.started = False
                return True
        for core in watched:
            if core._dropped:
                pending[weakref.ref(core)] = None
            elif not core._waiting:
                with self._lock:
                    if not core._waiting:  # (a later waiter adds it again)
                        core.settler_watches = False
                        self.watched.discard(core)
        return False

    def _run(self, requests: queue.SimpleQueue[Any]) -> None:
        try:
            self._serve(requests)  # (returns once _scan has recorded the end, under _lock)
        except BaseException:  # killed by an exception delivered to this thread
            self.started = False
            raise

    def _serve(self, requests: queue.SimpleQueue[Any]) -> None:
        pending: dict[weakref.ref[_CoreBase], None] = {}  # (one per core: refs compare so)
        retry = SETTLE_RETRY_S[0]
        scanned = time.monotonic()
        while True:
            try:
                if not pending:
                    left = scanned + SETTLER_IDLE_S - time.monotonic()
                    try:
                        pending[requests.get(timeout=max(left, 0.0))] = None
                    except queue.Empty:
                        pass
                while not requests.empty():
                    pending[requests.get()] = None
                # The scan comes every SETTLER_IDLE_S whatever else keeps it busy (a
                # stream of requests, a lock that stays taken).
                if time.monotonic() - scanned >= SETTLER_IDLE_S:
                    scanned = time.monotonic()
                    if self._scan(requests, pending):
                        return
                for ref in list(pending):
                    core = ref()
                    if core is None:
                        del pending[ref]
                        continue
                    lock = core._lock
                    if lock.acquire(False):
                        lock.release()
                        del pending[ref]
                        core._settle()  # (may wait, if another thread took it meanwhile)
                    del core  # (not kept alive while others are tried)
                if pending:  # a lock still taken: again in a moment, less often in time
                    time.sleep(retry)
                    retry = min(retry * 2, SETTLE_RETRY_S[1])
                else:
                    retry = SETTLE_RETRY_S[0]
            except BaseException:  # (a release's log handler that raised: nothing to tell)
                pass


_SETTLER = _Settler()


def settle_later(core: _CoreBase) -> None:
    """Ask the settler thread to end ``core``'s dropped holds: a finalizer could not,
    the core's lock being taken (by this thread's operation, inside which the finalizer
    runs, or by another thread's). The permit then reaches a parked waiter once that
    operation ends, not at the lane's next one. Builtins only (a finalizer, maybe under
    the lock): one ``SimpleQueue.put``, which is reentrant. Nothing is queued when no
    settler runs: then no thread waits on a thread lane, and the lane's next operation
    that needs the permit ends the dropped holds first (a request queued just as the
    settler ends is served by the next one)."""
    if _SETTLER.started:
        _SETTLER.queue.put(weakref.ref(core))


#: The stages of an ``acquire_all`` (``MultiHold._stage``): made, entered, and a release
#: pass begun (see "Interrupts": a later pass releases only what the cores still hold).
MULTI_MADE, MULTI_ENTERED, MULTI_LEAVING = 0, 1, 2


def record(into: Any, token: int) -> int:
    """A face's record of the grant ``token`` made to its parked waiter, in ``into``
    (None: nothing to record in; an ``acquire_all``'s MultiHold: appended to its
    ``_taken``; else a hold: its ``_token``), as ``take`` records a grant made at once;
    returns ``token``; 0 (no grant) is not recorded. Called inside the wait's ``try``,
    whose handler keeps a grant that :func:`recorded` finds for ``into``'s owner instead
    of passing it on (see "Interrupts")."""
    if into is not None and token:
        if into._is_multi:
            into._taken.append(token)
        else:
            into._token = token
    return token


def recorded(into: Any, n: int) -> bool:
    """True if a grant was recorded in ``into`` since its ``_taken`` had ``n`` entries
    (a MultiHold) or since its ``_token`` was 0 (a hold); False for None."""
    if into is None:
        return False
    return len(into._taken) > n if into._is_multi else into._token > 0


def parked_grant(into: Any, n: int) -> int:
    """The token of a grant made to the last waiter that ``into`` (a hold or a
    MultiHold) parked, if it may never have been recorded in ``into`` (its wait's
    handler stopped by a second interrupt): a hold's ``_token`` is still 0 (``n`` 0), or
    a MultiHold's ``_taken`` has ``n`` entries, no more than it had when the waiter
    parked (a release pass may have popped some since); else 0. The waiter's core may
    have that token no more (the handler passed it on, a rollback released it): the
    finalizers ask ``owns`` before they warn, and recording a token the core no longer
    holds is harmless (see "Dropped holds"). No lock, no call but attribute reads."""
    try:
        waiter, at = into._parked
    except (AttributeError, TypeError):  # never parked (the slot is unset, or None)
        return 0
    token: int = waiter.token
    if token <= 0 or at < n:
        return 0
    return token


def entered_twice() -> RuntimeError:
    """The error of an ``acquire_all`` entered a second time (single use)."""
    return RuntimeError(
        "this acquire_all(...) was entered already (single use, even after a timeout); "
        "call acquire_all again")


def end_marked(core: Core, key: str, token: int) -> None:
    """End the hold ``token`` of ``key`` whose release may not have run: a hold marked
    released (its token negated) before an interrupt stopped its release, or a token
    still listed by an ``acquire_all`` whose release pass an interrupt stopped. The core
    still holding ``token`` (no other hold ever has it: tokens are never reused) means
    the release did not run: released now. Else nothing (0: never granted)."""
    if token and core.owns(key, token):
        core.release(key, token)


def _warn_unmatched(lane: str, key: str, token: int) -> None:
    """Log a release by key (``manual_release``) that matched no hold. A release naming a
    token comes from a hold, whose owner learns it from the hold (``release()`` raises
    NotOwnerError; leaving a block after someone else ended the hold is silent): it is
    counted, not logged."""
    if not token:
        log.warning("lane %r: release of key %s, which is not held; ignored", lane, shown(key))


# Registries smaller than this are never rebuilt: their tables are small anyway.
_COMPACT_MIN = 1024
#: Most steps (an entry looked at) one hold of the lock spends evicting: an acquisition
#: of a new key evicts up to this many entries due (expired, or idle over
#: ``max_sessions``), more than the one it adds, so a backlog of them (after a burst of
#: keys) only shrinks, while no caller holds the lock for more than these steps; the
#: views and ``cleanup_idle()`` evict every entry due, this many per hold of the lock.
EVICT_STEPS = 64


class _Nowhere:
    """Where :meth:`SessionCore.take` records a grant that has no waiter, hold or list
    to go to (its commit makes the same call either way)."""

    __slots__ = ("token",)


_NOWHERE = _Nowhere()
_NO_CUT = slice(0, 0)  # ``del dropped[cut]``: nothing (made once: no allocation in a commit)
_CUT_FIRST = slice(0, 1)  # the front record


class _Entry:
    """A key's entry: its holder's token (0 while IDLE), since when it is held or idle
    (clock seconds), and its line of waiters (None when nobody waits)."""

    __slots__ = ("token", "since", "line")

    def __init__(self, token: int, since: float) -> None:
        self.token = token
        self.since = since
        self.line: OrderedDict[Waiter, str] | None = None


class SessionCore(_CoreBase):
    """Per-key mutual exclusion with FIFO hand-off, idle eviction and a soft cap.

    Thread-safe: every method takes the core's lock for O(1) amortised work and never
    blocks inside it.
    """

    __slots__ = ("max_sessions", "idle_timeout_s", "_entries", "_order", "_held", "_high")

    def __init__(
        self,
        name: str,
        max_sessions: int,
        idle_timeout_s: float,
        clock: Clock = time.monotonic,
    ) -> None:
        super().__init__(name, clock)
        self.per_key = True
        self.max_sessions = max_sessions
        self.idle_timeout_s = idle_timeout_s
        # Every live entry, HELD (token != 0) or IDLE (token == 0).
        self._entries: dict[str, _Entry] = {}
        # The eviction order: every IDLE entry, in the order it went idle (a release
        # moves its entry to the end), plus HELD entries not yet noticed. A HELD entry
        # keeps its place when taken (no work on the hot path); the eviction scan drops
        # it from the order when it reaches the front (paid once per hold), and its
        # release puts it back at the end. So the first IDLE entry in the order is the
        # oldest idle one, and expiry and cap eviction pop from the front.
        self._order: OrderedDict[str, _Entry] = OrderedDict()
        self._held = 0  # HELD entries
        # Most entries alive at once since the tables were last rebuilt. Python dicts
        # never shrink, so after a burst the tables are rebuilt once the registry falls
        # to a quarter of this (amortised O(1)): memory returns to the idle level.
        self._high = 0

    def _clear(self) -> None:
        self._entries = {}
        self._order = OrderedDict()
        self._held = 0
        self._high = 0

    # -- transitions -------------------------------------------------------------------

    def take(self, key: str, wait: bool, waiter: Waiter | None = None,
             hold: Any = None, taken: list[Any] | None = None) -> int:
        """Grant ``key`` now if nobody holds it: return the token (also stored in
        ``waiter.token`` when a waiter is given, else recorded in the grant's commit: in
        ``hold._token``, or appended to ``taken``, an ``acquire_all``'s list). Else return 0:
        with ``waiter``, after putting it at the end of the key's line (the caller then
        parks on it); without, counting a refusal unless ``wait`` (the caller will make
        a waiter and call again with it: a waiter is made outside the lock, and only on
        this slow path)."""
        if self.draining:
            raise LaneDrainingError(self.name, key)
        if self._dropped:
            self._drain()
        lock = self._lock
        try:
            lock.acquire()  # inside the try: see "Interrupts" in the module docstring
            if self.draining:  # set since the check above: see "Operations"
                raise LaneDrainingError(self.name, key)
            entry = self._entries.get(key)
            if entry is not None:
                if not entry.token:
                    # IDLE: nobody holds the key, so nobody waits for it either (waiters
                    # exist only behind a holder): granting here cannot overtake anyone.
                    now = self._clock()
                    # -- commit: plain stores only --
                    self._token = token = self._token + 1
                    entry.token = token
                    entry.since = now
                    self._held += 1
                    if waiter is not None:
                        waiter.token = token
                    elif hold is not None:  # recorded in the commit (see "Interrupts")
                        hold._token = token
                    elif taken is not None:
                        taken.append(token)  # (its one last builtin)
                    return token
                if waiter is None:
                    if not wait:
                        self.rejected += 1
                    return 0
                line = entry.line
                if line is None:
                    line = OrderedDict()
                ahead = len(line)
                # -- commit: plain stores only --
                # Joined under the same lock hold that saw the holder: the holder's
                # release must take this lock too, so it will find this waiter in line
                # (no lost wake-up), and the entry cannot go IDLE while it waits.
                waiter.ahead = ahead
                waiter.behind = None if ahead else entry.since
                entry.line = line
                line[waiter] = key
                self._waiting += 1
                return 0
            # ABSENT: a new entry, after making room for it.
            now = self._clock()
            new = _Entry(0, now)
            if len(self._entries) > self._held:
                self._evict(now, room=True)
            entries = self._entries  # read after _evict: it may rebuild the tables
            size = len(entries) + 1
            high = size if size > self._high else self._high
            token = self._token + 1
            # Where the grant is recorded, chosen before the commit, which has no branch
            # (CPython 3.10 also delivers an interrupt at a taken jump): the waiter's
            # token, the hold's, or the end of an acquire_all's list, through one
            # builtin call, the commit's last.
            record: Callable[[Any, Any, int], None]
            into: Any
            slot: Any
            if waiter is not None:
                record, into, slot = setattr, waiter, "token"
            elif hold is not None:  # recorded in the commit (see "Interrupts")
                record, into, slot = setattr, hold, "_token"
            elif taken is not None:
                record, into, slot = list.insert, taken, len(taken)
            else:
                record, into, slot = setattr, _NOWHERE, "token"
            # -- commit: plain stores only, then one last builtin --
            self._token = token
            new.token = token
            entries[key] = self._order[key] = new
            self._held += 1
            self._high = high
            record(into, slot, token)
            return token
        finally:
            try:
                lock.release()
            except RuntimeError:  # acquire was interrupted before it took the lock
                pass

    def release(
        self, key: str, token: int = 0, dropped: tuple[str, int] | None = None
    ) -> bool:
        """End the hold on ``key`` (the one with ``token``, or whichever hold it has when
        ``token`` is 0) and hand the key to the first waiter that takes it. Returns False
        and changes nothing but ``unmatched`` when no such hold exists (logged when
        ``token`` is 0: see :func:`_warn_unmatched`). (``dropped``: see
        :meth:`_drain`.)"""
        if self._dropped and dropped is None:
            self._drain()
        lock = self._lock
        try:
            lock.acquire()  # inside the try: see "Interrupts" in the module docstring
            if dropped is not None and not self._still_dropped(dropped):
                return False  # another thread's drain ended it
            entry = self._entries.get(key)
            if entry is not None and (entry.token == token if token else entry.token):
                self._end(entry, key, dropped)
                return True
            if dropped is not None:
                del self._dropped[0]
                return False
            self.unmatched += 1
        finally:
            try:
                lock.release()
            except RuntimeError:  # acquire was interrupted before it took the lock
                pass
        _warn_unmatched(self.name, key, token)
        return False

    def owns(self, key: str, token: int) -> bool:
        entry = self._entries.get(key)
        return entry is not None and entry.token == token

    def _end(self, entry: _Entry, key: str, dropped: tuple[str, int] | None = None) -> None:
        """The commit of :meth:`release` (lock held; the hold found: ``entry`` of ``key``
        is HELD by it): end the hold and hand the key to the first waiter that takes
        it, else make the entry IDLE. Also called by the holds' own exit step
        (:class:`SessionHoldSteps`) in its lock hold, when a line waits (a hand-off).
        ``dropped``: see :meth:`_drain`. Same rules as :meth:`release` ("Interrupts"):
        calls before stores, plain stores, one last builtin."""
        line = entry.line
        waiter = None
        if line:  # its head, unless it refuses (_next_waiter then drops those)
            waiter = next(iter(line))
            if not waiter.ready():
                waiter = self._next_waiter(line)
        now = self._clock()
        held = self.hold_hist
        if held is not None:  # hold times: one append, bucketed in batches
            held.append(now - entry.since)
            if entry.token >= self.hold_fold_at:
                self._fold_holds(held, key, entry.token)
        observe = False
        if waiter is not None and self.waits_at_grant:
            # The wait this hand-off ends: one append, as hold times (see
            # ``waits_at_grant``; Histogram.add, inline); its commit counts ``waited``.
            observe = True
            waits = self.wait_hist
            waits.append(now - waiter.since)
            if len(waits) >= HELD_BATCH:
                waits.fold()
        # Decided before the commit, which has no branch (see take): the dropped hold's
        # record goes (a cut of one, or of none), and the line left after the hand-off.
        cut = _NO_CUT if dropped is None else _CUT_FIRST
        if waiter is None or line is None:
            # -- commit: plain stores only, then one last builtin --
            del self._dropped[cut]
            entry.token = 0
            entry.since = now
            entry.line = None
            self._held -= 1
            # Last, and a builtin that runs no Python code: it cannot be stopped
            # before it is done, and nothing is left to do after it.
            try:
                _to_end(self._order, key)
            except KeyError:  # the eviction scan dropped it while it was held
                self._order[key] = entry
            return
        # Hand-off: the entry stays HELD; no instant exists in which it is free,
        # so no newcomer can overtake the line.
        left = line if len(line) > 1 else None  # (the waiter is still in it)
        waited = self.waited + observe
        # -- commit: plain stores only, then one last call --
        del self._dropped[cut]
        del line[waiter]
        self._waiting -= 1
        self._token = granted = self._token + 1
        waiter.token = granted
        entry.token = granted
        entry.since = now
        entry.line = left
        self.waited = waited
        waiter.wake(None)  # last: the grant is recorded whether or not this returns

    def _line_of(self, key: str, waiter: Waiter) -> OrderedDict[Waiter, str] | None:
        entry = self._entries.get(key)
        return None if entry is None else entry.line

    def _in_line(self, key: str | None) -> list[tuple[Waiter, dict[Waiter, str]]]:
        entries = self._entries.values() if key is None else [self._entries.get(key)]
        return [(w, e.line) for e in entries if e is not None and e.line for w in e.line]

    def _line_heads(self) -> list[Waiter]:
        return [next(iter(e.line)) for e in self._entries.values() if e.line]

    def _blocker_since(self, key: str) -> float | None:
        entry = self._entries.get(key)
        return entry.since if entry is not None and entry.token else None

    def _line_len(self, key: str) -> int:
        entry = self._entries.get(key)
        return len(entry.line) if entry is not None and entry.line else 0

    def _hold_list(self) -> list[tuple[str, int, float]]:
        return [(k, e.token, e.since) for k, e in self._entries.items() if e.token]

    # -- eviction ------------------------------------------------------------------------

    def _evict(self, now: float, *, room: bool) -> bool:
        """Evict from the front of the order (lock held): expired IDLE entries, and the
        oldest IDLE entries while the registry is over ``max_sessions`` (at it, with
        ``room``: room for a new entry), in at most :data:`EVICT_STEPS` steps. Returns
        True when it stopped for want of steps (more may be due), False when it reached
        an entry to keep or the end.

        HELD entries met at the front leave the order (their release re-inserts them), so
        each step is paid once: O(1) amortised. HELD entries are never evicted: when
        every entry is held, the cap is exceeded (soft cap). Each step (one entry) reads
        first and then only stores, so an interrupt between steps leaves a consistent
        registry.
        """
        order, entries = self._order, self._entries
        limit = now - self.idle_timeout_s
        # At the cap, room is made for a new entry; a view drops those over it.
        cap = self.max_sessions if room else self.max_sessions + 1
        n = 0
        steps = EVICT_STEPS
        while order:
            if not steps:
                break
            steps -= 1
            key, entry = next(iter(order.items()))
            if entry.token:
                del order[key]
            elif entry.since <= limit or len(entries) >= cap:
                del order[key]
                del entries[key]
                self.evicted += 1
                n += 1
            else:
                break
        if n and len(entries) < self._high >> 2 and self._high > _COMPACT_MIN:
            # Rebuild the tables at their current size: copies first, then the stores.
            new_entries, new_order = dict(entries), OrderedDict(order)
            self._entries = new_entries
            self._order = new_order
            self._high = len(new_entries)
        return not steps

    def _evict_pass(self) -> bool:
        return self._evict(self._clock(), room=False)

    def cleanup_idle(self) -> int:
        """Evict expired idle entries, and idle entries over ``max_sessions``, now, as
        :meth:`_read_evicted` does (:data:`EVICT_STEPS` per hold of the lock); return how
        many this call evicted (none when this thread is inside the core already: see
        :meth:`_read_evicted`)."""
        self._settle()
        lock = self._lock
        n = 0
        more = not lock._is_owned()  # type: ignore[attr-defined]
        while more:
            with lock:
                before = self.evicted
                more = self._evict(self._clock(), room=False)
                n += self.evicted - before
        return n

    # -- views ---------------------------------------------------------------------------

    def session_count(self) -> int:
        """Live entries (held or idle), after dropping the expired ones."""
        return self._read_evicted(self._live_count)

    def _live_count(self) -> int:
        return len(self._entries)

    def holders(self) -> int:
        self._settle()
        return self._held

    def held_since(self) -> dict[str, float]:
        """Each held key -> seconds it has been held by its current holder."""
        self._settle()
        with self._lock:
            now = self._clock()
            return {k: now - e.since for k, e in self._entries.items() if e.token}

    def is_held(self, key: str) -> bool:
        self._settle()
        entry = self._entries.get(key)
        return entry is not None and entry.token != 0

    def waiting_for(self, key: str) -> int:
        with self._lock:
            entry = self._entries.get(key)
            return len(entry.line) if entry is not None and entry.line else 0

    def stats(self) -> LaneStats:
        return self._read_evicted(self._held_stats)

    def _held_stats(self) -> LaneStats:
        # (lock held: stats)
        return self._stats(self._held)


class SessionHoldSteps:
    """The two commonest steps of :class:`SessionCore`, run by a per-key lane's hold
    itself (a mixin of the thread and the asyncio hold: the thread hold's ``__enter__`` /
    ``__exit__`` ARE :meth:`_step_in` / :meth:`_step_out`, the asyncio hold's
    ``__aenter__`` / ``__aexit__`` call them) to save the core's general path on the hot
    path: taking an IDLE entry (nobody holds the key, so nobody waits for
    it), and releasing a HELD entry with nobody in line (observing its hold time when
    hold times are on, as :meth:`SessionCore.release` does). A release with a line to
    hand over to runs the release's commit (:meth:`SessionCore._end`) in the step's own
    lock hold. Everything else (a new key, a busy key, a drain, dropped holds to end
    first) goes to the hold's general path (``_enter_slow``: its result is what entering
    returns, on asyncio an awaitable) or to :meth:`SessionCore.release`.

    They live here, next to :meth:`SessionCore.take` and :meth:`SessionCore.release`,
    because they are those methods' steps and follow the same rules ("Interrupts" in the
    module docstring): the lock taken inside the ``try``, calls before stores, plain
    stores, one last builtin. The hold's token is stored in the same commit as the grant.

    """

    __slots__ = ()
    _mixin: ClassVar[bool] = True  # (never the public name: see public_name)

    lane: Any
    key: str
    _token: int
    _enter_slow: ClassVar[Callable[[Any], Any]]

    def _step_in(self) -> Any:
        if not self._token:
            core = self.lane._core
            lock = core._lock
            try:
                lock.acquire()  # inside the try: see "Interrupts" in the module docstring
                entry = core._entries[self.key]  # (no call; a new key: KeyError)
                # IDLE (nobody holds or waits), and the lane is not draining
                if not entry.token and not core.draining:
                    clock = core._clock
                    now = clock()
                    # -- commit: plain stores only --
                    core._token = token = core._token + 1
                    entry.token = token
                    entry.since = now
                    core._held += 1
                    self._token = token  # type: ignore[misc]
                    return self
            except KeyError:  # a new key: the general path makes its entry
                pass
            finally:
                try:
                    lock.release()
                except RuntimeError:  # acquire was interrupted before it took the lock
                    pass
        return self._enter_slow()

    def _step_out(self, exc_type: object, exc: object, tb: object) -> None:
        token = self._token
        # Released early inside the block? Tested first, so that the compare's jump is
        # short: CPython 3.11 does not specialise a compare whose jump needs an
        # EXTENDED_ARG (about 100 instructions per exit).
        if token <= 0:
            self.__class__ = self.lane._ended_hold
            return
        core = self.lane._core
        key = self.key
        self._token = -token  # type: ignore[misc]  # marked released, then released
        lock = core._lock
        try:
            lock.acquire()  # inside the try: see "Interrupts"
            entry = core._entries[key]  # (a KeyError: ended by someone, evicted)
            if entry.token == token:
                if entry.line is None:
                    clock = core._clock
                    now = clock()
                    held = core.hold_hist
                    if held is not None:  # hold times: as SessionCore.release
                        held.append(now - entry.since)
                        if token >= core.hold_fold_at:
                            core._fold_holds(held, key, token)
                    # -- commit: plain stores only, then one last builtin call --
                    entry.token = 0
                    entry.since = now
                    core._held -= 1
                    try:
                        _to_end(core._order, key)
                    except KeyError:  # the eviction scan dropped it while held
                        core._order[key] = entry
                    token = 0  # released here
                elif not core._dropped:  # a line: the release's commit, in this lock hold
                    core._end(entry, key)
                    token = 0  # released here
        except KeyError:  # no entry: the general release counts it unmatched
            pass
        finally:
            try:
                lock.release()
            except RuntimeError:  # acquire was interrupted before it took it
                pass
        if token:
            core.release(key, token)
        self.__class__ = self.lane._ended_hold  # ended: no finalizer from here on (_DropWatch)


class CountingHoldSteps:
    """The two commonest steps of :class:`CountingCore`, run by a counting lane's hold
    itself (a mixin of the thread and the asyncio hold), as :class:`SessionHoldSteps`
    does for the per-key lane: taking a free permit (a free
    permit means nobody waits, so taking it overtakes no one, whatever the priority),
    and releasing a hold with nobody in line (neither in the FIFO ``_line`` nor among
    the prioritised ``_ranked``; observing its hold time when hold times are on, as
    :meth:`CountingCore.release` does). A release with a waiter to hand the permit to
    runs the release's commit (:meth:`CountingCore._end`) in the step's own lock hold.
    Everything else (a full lane, a drain, dropped holds to end first) goes to the hold's
    general path (``_enter_slow``) or to :meth:`CountingCore.release`. Same rules ("Interrupts"
    in the module docstring); the hold's token is stored in the same commit as the grant.
    """

    __slots__ = ()
    _mixin: ClassVar[bool] = True  # (never the public name: see public_name)

    lane: Any
    key: str
    _token: int
    _enter_slow: ClassVar[Callable[[Any], Any]]

    def _step_in(self) -> Any:
        if not self._token:
            core = self.lane._core
            lock = core._lock
            try:
                lock.acquire()  # inside the try: see "Interrupts" in the module docstring
                holds = core._holds
                # a free permit (nobody is in line), and the lane is not draining
                if len(holds) < core.capacity and not core.draining:
                    clock = core._clock
                    now = clock()
                    # -- commit: plain stores only --
                    core._token = token = core._token + 1
                    holds[token] = (self.key, now)
                    self._token = token  # type: ignore[misc]
                    return self
            finally:
                try:
                    lock.release()
                except RuntimeError:  # acquire was interrupted before it took the lock
                    pass
        return self._enter_slow()

    def _step_out(self, exc_type: object, exc: object, tb: object) -> None:
        token = self._token
        # Released early inside the block? Tested first, so that the compare's jump is
        # short: CPython 3.11 does not specialise a compare whose jump needs an
        # EXTENDED_ARG (about 100 instructions per exit).
        if token <= 0:
            self.__class__ = self.lane._ended_hold
            return
        core = self.lane._core
        key = self.key
        self._token = -token  # type: ignore[misc]  # marked released, then released
        lock = core._lock
        try:
            lock.acquire()  # inside the try: see "Interrupts"
            holds = core._holds
            hold = holds[token]  # (a KeyError: ended by someone else)
            if hold[0] == key:
                if not core._line and not core._ranked:
                    held = core.hold_hist
                    if held is not None:  # hold times: as CountingCore.release
                        clock = core._clock
                        held.append(clock() - hold[1])
                        if token >= core.hold_fold_at:
                            core._fold_holds(held, key, token)
                    # -- commit: plain stores only --
                    del holds[token]
                    token = 0  # released here
                elif not core._dropped:  # waiters: the release's commit, in this lock hold
                    core._end(token)
                    token = 0  # released here
        except KeyError:  # no such hold: the general release counts it unmatched
            pass
        finally:
            try:
                lock.release()
            except RuntimeError:  # acquire was interrupted before it took it
                pass
        if token:
            core.release(key, token)
        self.__class__ = self.lane._ended_hold  # ended: no finalizer from here on (_DropWatch)


class MultiHoldSteps:
    """The entry and exit of ``acquire_all`` (a mixin of both queues' multi-holds) when
    every lane is in-process: for each core in turn, the same steps the thread holds run
    (:class:`SessionHoldSteps`, :class:`CountingHoldSteps`: an IDLE key or a free permit;
    a release with nobody in line, observing the hold time when hold times are on; a
    release with a line, through the core's commit ``_end`` in the same lock hold), with
    no other call into the core. Any other case of a step goes to the core's ``take`` /
    ``release``. A step that must wait goes to the face's ``_take_rest`` (threads: the
    general loop, with the waiter made there; asyncio: back to ``__aenter__``, which
    parks); an interrupt between two takes gives back what was taken through the face's
    ``_release_all``, which is plain (no coroutine) on both faces. The thread multi-hold's
    ``__enter__`` / ``__exit__`` ARE :meth:`_steps_in` / :meth:`_steps_out`; the asyncio
    one's ``__aenter__`` / ``__aexit__`` call them. Same rules ("Interrupts" in the module
    docstring): a grant's token is appended to ``_taken`` as the commit's one last builtin
    call, here and in the core's ``take`` (its ``taken``) (an interrupt after it finds the
    token there, and the ``except`` gives back everything taken); a token is popped from
    ``_taken`` (marked released) right before its release, as a hold is.
    """

    __slots__ = ()
    _mixin: ClassVar[bool] = True  # (never the public name: see public_name)

    _key: str
    _plan: Any
    _taken: list[Any]
    _budget_s: float | None
    _stage: int
    _take_rest: Callable[[Any], Any]
    _release_all: Callable[[BaseException | None], None]
    _ended_class: ClassVar[type]  # the class a host takes once left (see _DropWatch)

    def _steps_in(self) -> Any:
        if self._stage:
            raise entered_twice()
        self._stage = MULTI_ENTERED  # type: ignore[misc]  # (a slot of MultiHold, the host)
        taken = self._taken
        cores = self._plan.cores
        if cores is None or self._budget_s == 0.0:  # (a float or None: a float compare)
            return self._take_rest(None)
        key = self._key
        # One clock reading serves the cores that share its clock (the default): read
        # under the first one's lock, it is the instant of this acquire_all's grants.
        last: Any = None
        now = 0.0
        try:
            # Each attribute of a core is loaded at a site of its kind's own: a load
            # site that sees two classes is not specialised (CPython 3.11), which cost
            # about 5% of an acquire_all of two lanes.
            for per_key, core in self._plan.kinds:
                lock = core._lock if per_key else core._lock  # noqa: RUF034 (a site per kind)
                try:
                    lock.acquire()  # inside the try: see "Interrupts"
                    if per_key:  # a SessionCore
                        entry = core._entries[key]  # (no call; a new key: KeyError)
                        # IDLE, and not draining (the core's take raises
                        # LaneDrainingError)
                        if not entry.token and not core.draining:
                            clock = core._clock
                            if clock is not last:
                                now = clock()
                                last = clock
                            # -- commit: plain stores, then one last builtin --
                            core._token = token = core._token + 1
                            entry.token = token
                            entry.since = now
                            core._held += 1
                            taken.append(token)
                            continue
                    else:  # a CountingCore (a plan drives no other core)
                        holds = core._holds
                        # a free permit (nobody waits), and not draining
                        if len(holds) < core.capacity and not core.draining:
                            clock = core._clock
                            if clock is not last:
                                now = clock()
                                last = clock
                            # -- commit: plain stores, then one last builtin --
                            core._token = token = core._token + 1
                            holds[token] = (key, now)
                            taken.append(token)
                            continue
                except KeyError:  # a new key: the core's take makes its entry
                    pass
                finally:
                    try:
                        lock.release()
                    except RuntimeError:  # acquire was interrupted before it took it
                        pass
                # (a grant is appended to ``taken`` in its own commit)
                if not core.take(key, True, None, None, taken):
                    return self._take_rest(0)  # busy: the general loop puts a waiter in line
        except BaseException:  # an interrupt between two takes: give back what we took
            self._release_all(None)
            raise
        return self

    def _steps_out(self, exc_type: object, exc: Any, tb: object) -> None:
        plan = self._plan
        kinds, taken = plan.kinds, self._taken
        if kinds is None:
            self._release_all(exc)
            self.__class__ = plan.ended  # ended: no finalizer from here on
            return
        key = self._key
        if self._stage == MULTI_LEAVING:  # a pass after one an interrupt stopped: the
            self._release_all(exc)  # general loop releases what the cores still hold
            self.__class__ = plan.ended
            return
        self._stage = MULTI_LEAVING  # type: ignore[misc]
        n = len(taken)
        while n:  # last taken first; the list is emptied once all are released
            n -= 1
            token = taken[n]
            per_key, core = kinds[n]
            if token.__class__ is not int:  # viewed as a hold: ended here unless released
                view, token = token, token._token  # through it (silent, as a hold is)
                if token <= 0:  # (or marked by an exit an interrupt stopped: end_marked)
                    end_marked(core, key, -token)
                    continue
                view._token = -token
            lock = core._lock if per_key else core._lock  # noqa: RUF034 (see above)
            try:
                lock.acquire()  # inside the try: see "Interrupts"
                if per_key:  # a SessionCore
                    entry = core._entries[key]  # (a KeyError: ended by someone, evicted)
                    if entry.token != token:
                        pass  # not this hold's any more: the general release
                    elif entry.line is None:
                        clock = core._clock
                        now = clock()
                        held = core.hold_hist
                        if held is not None:  # hold times: as SessionCore.release
                            held.append(now - entry.since)
                            if token >= core.hold_fold_at:
                                core._fold_holds(held, key, token)
                        # -- commit: plain stores only, then one last builtin call --
                        entry.token = 0
                        entry.since = now
                        core._held -= 1
                        try:
                            _to_end(core._order, key)
                        except KeyError:  # the eviction scan dropped it while held
                            core._order[key] = entry
                        token = 0  # released here
                    elif not core._dropped:  # a line: the release's commit, in this hold
                        core._end(entry, key)
                        token = 0  # released here
                else:  # a CountingCore
                    holds = core._holds
                    hold = holds[token]  # (a KeyError: ended by someone else)
                    if hold[0] != key:
                        pass  # not this hold's: the general release
                    elif not core._line and not core._ranked:
                        held = core.hold_hist
                        if held is not None:  # hold times: as CountingCore.release
                            clock = core._clock
                            held.append(clock() - hold[1])
                            if token >= core.hold_fold_at:
                                core._fold_holds(held, key, token)
                        # -- commit: plain stores only --
                        del holds[token]
                        token = 0  # released here
                    elif not core._dropped:  # waiters: the release's commit, in this hold
                        core._end(token)
                        token = 0  # released here
            except KeyError:  # no such hold: the general release counts it unmatched
                pass
            finally:
                try:
                    lock.release()
                except RuntimeError:  # acquire was interrupted before it took it
                    pass
            if token:
                core.release(key, token)
        taken.clear()
        self.__class__ = plan.ended  # ended: no finalizer from here on (_DropWatch)


class CountingCore(_CoreBase):
    """A counting lane: at most ``capacity`` holders, one line across all keys, served by
    priority with ageing, first come first served among equals.

    Thread-safe: every method takes the core's lock and never blocks inside it. Take and
    release with a token are O(1) while every waiter has priority 0, O(log n) with n
    prioritised waiters; a release by key alone, and the views, are O(holders) (at most
    ``capacity``) plus, for the views of the line, O(waiters).

    Priority
    ========
    A waiter that joins at time ``j`` (the core's clock, read under the lock) with
    priority ``p`` has, at time ``t >= j``, the *effective priority*
    ``e(t) = p + (t - j) / ageing_s``: it gains one level per ``ageing_s`` seconds of
    waiting, continuously. A hand-off serves the waiter with the largest ``e(now)``;
    among equal ones, the one that joined first.

    Each waiter gets the *rank* ``r = j - p * ageing_s`` once, when it joins. For two
    waiters ``a`` and ``b`` and any instant ``t`` at which both wait::

        e_a(t) > e_b(t)  <=>  p_a + (t - j_a)/A > p_b + (t - j_b)/A
                         <=>  p_a - j_a/A > p_b - j_b/A        (t cancels)
                         <=>  j_a - p_a*A < j_b - p_b*A        (times -A < 0)
                         <=>  r_a < r_b

    and ``e_a(t) == e_b(t) <=> r_a == r_b``. The order of two waiters therefore never
    changes while they wait, and the waiter with the largest effective priority NOW is the
    one with the smallest rank, whatever "now" is: a min-heap keyed on ``(r, join number)``
    gives exact ageing with no rescan (the join number breaks ties by arrival: FIFO among
    equals). A waiter of priority ``p`` that has waited ``k * ageing_s`` ranks equal with
    a newcomer of priority ``p + k``, and goes first.

    The line is two structures: ``_line``, a FIFO (``OrderedDict``) of the waiters of
    priority 0, and ``_heap`` + ``_ranked``, the others. A priority-0 waiter's rank is its
    join time, and joins read the clock in join order under the lock, so ``_line`` is
    already sorted by rank: its head is its best waiter, and a hand-off compares that head
    with the heap's top (O(log n)). With no prioritised waiter (``_ranked`` empty) a
    hand-off is the O(1) pop of the FIFO head, and a free permit is taken without
    looking at the line at all (a free permit means nobody waits).

    ``_ranked`` (waiter -> key) holds the live prioritised waiters and is the truth;
    ``_heap`` holds ``(rank, join number, waiter)`` entries, some of them dead (their
    waiter was granted, withdrew, or was dropped): withdrawal is an O(1) ``del`` from
    ``_ranked``, and dead entries are popped when they reach the top, or skipped when a
    join rebuilds the heap once dead entries outnumber live ones (amortised O(1) per
    withdrawal). Every count (``waiters``, ``stats``) reads ``_line`` and ``_ranked``
    only, so it is exact at every instant.

    Interrupts: a join first pushes the heap entry (a call; a pushed entry whose waiter
    is not in ``_ranked`` is dead, so an interrupt right after it changes nothing), then
    stores. A hand-off picks its waiter first (popping dead tops and dropping refusing
    waiters, each a step of its own), then stores, then wakes; the granted waiter's heap
    entry is left dead rather than popped, so the wake-up stays the last call.
    """

    __slots__ = ("capacity", "ageing_s", "_holds", "_line", "_ranked", "_heap", "_joins")

    def __init__(
        self,
        name: str,
        capacity: int,
        clock: Clock = time.monotonic,
        ageing_s: float = DEFAULT_AGEING_S,
    ) -> None:
        super().__init__(name, clock)
        self.capacity = capacity
        #: Seconds of waiting worth one priority level (> 0).
        self.ageing_s = ageing_s
        # token -> (key, since); insertion order is grant order, so the first hold of a
        # key found in it is that key's oldest (the one a key-only release ends).
        self._holds: dict[int, tuple[str, float]] = {}
        self._line: OrderedDict[Waiter, str] = OrderedDict()
        self._ranked: dict[Waiter, str] = {}
        self._heap: list[tuple[float, int, Waiter]] = []
        self._joins = 0  # waiters that joined the line: the join number of the last one

    def _clear(self) -> None:
        self._holds = {}
        self._line = OrderedDict()
        self._ranked = {}
        self._heap = []

    def take(
        self, key: str, wait: bool, waiter: Waiter | None = None, hold: Any = None,
        taken: list[Any] | None = None, priority: int = 0,
    ) -> int:
        """Grant a permit now if one is free: return the token (also stored in
        ``waiter.token`` when a waiter is given, else recorded in ``hold`` or ``taken``,
        as by :meth:`SessionCore.take`). Else return 0: with ``waiter``, after
        putting it in line with ``priority`` (see "Priority" above; the faces check
        it); without, counting a refusal unless ``wait`` (see :meth:`SessionCore.take`)."""
        if self.draining:
            raise LaneDrainingError(self.name, key)
        if self._dropped:
            self._drain()
        lock = self._lock
        try:
            lock.acquire()  # inside the try: see "Interrupts" in the module docstring
            if self.draining:  # set since the check above: see "Operations"
                raise LaneDrainingError(self.name, key)
            holds = self._holds
            if len(holds) < self.capacity:
                # A free permit means nobody is in line (releases hand permits to waiters
                # while there are any), so taking it cannot overtake anyone.
                now = self._clock()
                # -- commit: plain stores only --
                self._token = token = self._token + 1
                holds[token] = (key, now)
                if waiter is not None:
                    waiter.token = token
                elif hold is not None:  # recorded in the commit (see "Interrupts")
                    hold._token = token
                elif taken is not None:
                    taken.append(token)  # (its one last builtin)
                return token
            if waiter is None:
                if not wait:
                    self.rejected += 1
                return 0
            now = self._clock()
            seq = self._joins + 1
            ahead = len(self._line) + len(self._ranked)
            # (the waiter's own fields, stored before any join: see Waiter)
            waiter.ahead = ahead
            waiter.behind = None if ahead else self._blocker_since(key)
            if priority:
                self._join_ranked(key, waiter, now - priority * self.ageing_s, seq)
                return 0
            # -- commit: plain stores only --
            waiter.rank = (now, seq)
            self._joins = seq
            self._line[waiter] = key
            self._waiting += 1
            return 0
        finally:
            try:
                lock.release()
            except RuntimeError:  # acquire was interrupted before it took the lock
                pass

    def _join_ranked(self, key: str, waiter: Waiter, rank: float, seq: int) -> None:
        """Put a prioritised ``waiter`` in line with ``rank`` (lock held)."""
        ranked, heap = self._ranked, self._heap
        entry = (rank, seq, waiter)
        if len(heap) > 2 * len(ranked) + 16:
            # Mostly dead entries: rebuild from the live ones (a new list, stored below).
            heap = [e for e in heap if e[2] in ranked]
            heap.append(entry)
            heapq.heapify(heap)
        else:
            # Pushed before the stores: until ``ranked`` names it, the entry is dead.
            heapq.heappush(heap, entry)
        # -- commit: plain stores only --
        self._heap = heap
        self._joins = seq
        ranked[waiter] = key
        self._waiting += 1

    def _next_ranked(self) -> Waiter | None:
        """The waiter a hand-off serves now (lock held, some prioritised waiter live):
        the head of the priority-0 FIFO or the heap's top, whichever has the smaller
        rank. Pops dead heap entries and drops waiters that refuse (as
        :meth:`_next_waiter` does), each a step that leaves the state consistent."""
        line, ranked, heap = self._line, self._ranked, self._heap
        while True:
            while heap and heap[0][2] not in ranked:
                heapq.heappop(heap)  # a dead entry: no count names it
            front = self._next_waiter(line) if line else None
            if not heap:
                return front
            top = heap[0]
            if front is not None and front.rank < top[:2]:
                return front
            waiter = top[2]
            if waiter.ready():
                return waiter
            # -- commit: plain stores only (its entry is now dead) --
            del ranked[waiter]
            self._waiting -= 1

    def release(
        self, key: str, token: int = 0, dropped: tuple[str, int] | None = None
    ) -> bool:
        """End the hold of ``key`` with ``token`` (or the key's oldest hold when ``token``
        is 0) and hand the permit to the waiter served next (see "Priority"). Returns
        False and changes nothing but ``unmatched`` when no such hold exists (logged
        when ``token`` is 0: see :func:`_warn_unmatched`). (``dropped``: see
        :meth:`_drain`.)"""
        if self._dropped and dropped is None:
            self._drain()
        lock = self._lock
        try:
            lock.acquire()  # inside the try: see "Interrupts" in the module docstring
            if dropped is not None and not self._still_dropped(dropped):
                return False  # another thread's drain ended it
            holds = self._holds
            if token:
                hold = holds.get(token)
                found = hold is not None and hold[0] == key
            else:
                token = next((t for t, h in holds.items() if h[0] == key), 0)
                found = token != 0
            if found:
                self._end(token, dropped)
                return True
            if dropped is not None:
                del self._dropped[0]
                return False
            self.unmatched += 1
        finally:
            try:
                lock.release()
            except RuntimeError:  # acquire was interrupted before it took the lock
                pass
        _warn_unmatched(self.name, key, token)
        return False

    def _end(self, token: int, dropped: tuple[str, int] | None = None) -> None:
        """The commit of :meth:`release` (lock held; the hold ``token`` found, of the key
        it was asked for): end it and hand its permit to the waiter served next, if
        any. Also called by the holds' own exit step (:class:`CountingHoldSteps`) in
        its lock hold, when waiters wait (a hand-off). ``dropped``: see :meth:`_drain`.
        Same rules as :meth:`release` ("Interrupts"): calls before stores, plain stores,
        one last builtin."""
        holds = self._holds
        held = self.hold_hist
        if held is not None:  # hold times: one append, bucketed in batches
            since = holds[token]
            held.append(self._clock() - since[1])
            if token >= self.hold_fold_at:
                self._fold_holds(held, since[0], token)
        if self._ranked and self._release_ranked(token, dropped):
            return
        line = self._line
        waiter = None
        if line:  # its head, unless it refuses (_next_waiter then drops those)
            waiter = next(iter(line))
            if not waiter.ready():
                waiter = self._next_waiter(line)
        # A fresh table once the last waiter leaves: drop the table a long line
        # grew (made here, before the stores).
        fresh: OrderedDict[Waiter, str] | None = None
        now = 0.0
        observe = False
        if waiter is not None:
            now = self._clock()
            if len(line) == 1:
                fresh = OrderedDict()
            observe = self.waits_at_grant
            if observe:  # the wait it ends (as in SessionCore._end: Histogram.add, inline)
                waits = self.wait_hist
                waits.append(now - waiter.since)
                if len(waits) >= HELD_BATCH:
                    waits.fold()
        # -- commit: plain stores only, then the wake-up --
        if dropped is not None:
            del self._dropped[0]
        del holds[token]
        if waiter is None:
            return
        # Hand-off: the permit goes to the first waiter; the holder count never
        # dips, so no newcomer can take it first.
        holds[self._token + 1] = (line[waiter], now)
        del line[waiter]
        self._waiting -= 1
        self._token = granted = self._token + 1
        waiter.token = granted
        if fresh is not None:
            self._line = fresh
        if observe:
            self.waited += 1
        waiter.wake(None)  # last: the grant is recorded whether or not this returns

    def _release_ranked(self, token: int, dropped: tuple[str, int] | None) -> bool:
        """The hand-off of :meth:`release` while prioritised waiters exist (lock held,
        the hold ``token`` found): end the hold and grant its permit to the waiter served
        next. Returns False, having ended nothing, when no waiter is left to take it
        (every one refused): the caller then ends the hold alone."""
        waiter = self._next_ranked()
        if waiter is None:
            return False
        ranked, line = self._ranked, self._line
        in_heap = waiter in ranked
        table: dict[Waiter, str] = ranked if in_heap else line
        wkey = table[waiter]
        now = self._clock()
        empty = in_heap and len(ranked) == 1
        observe = self.waits_at_grant
        if observe:  # the wait it ends (as in SessionCore.release)
            self.wait_hist.add(now - waiter.since)
        # -- commit: plain stores only, then the wake-up --
        if dropped is not None:
            del self._dropped[0]
        holds = self._holds
        del holds[token]
        holds[self._token + 1] = (wkey, now)
        del table[waiter]  # a heap entry is left dead, popped later
        self._waiting -= 1
        self._token = granted = self._token + 1
        waiter.token = granted
        if empty:
            self._heap = []  # no live entry left: drop the dead ones at once
        if observe:
            self.waited += 1
        waiter.wake(None)  # last: the grant is recorded whether or not this returns
        return True

    def _line_of(self, key: str, waiter: Waiter) -> dict[Waiter, str] | None:
        return self._ranked if waiter in self._ranked else self._line

    def _in_line(self, key: str | None) -> list[tuple[Waiter, dict[Waiter, str]]]:
        # (A prioritised waiter taken out of ``_ranked`` leaves a dead heap entry.)
        return [(w, line) for line in (self._line, self._ranked)
                for w, k in line.items() if key is None or k == key]

    def _tidy_lines(self) -> None:
        if not self._ranked:
            self._heap = []  # no live entry left: drop the dead ones at once

    def _line_heads(self) -> list[Waiter]:
        # The FIFO's head is its longest waiter; any prioritised waiter may be older.
        return ([next(iter(self._line))] if self._line else []) + list(self._ranked)

    def _blocker_since(self, key: str) -> float | None:
        # The oldest hold of the lane: the first permit a release is likely to free.
        return next(iter(self._holds.values()))[1] if self._holds else None

    def _line_len(self, key: str) -> int:
        return len(self._line) + len(self._ranked)

    def _hold_list(self) -> list[tuple[str, int, float]]:
        return [(k, t, s) for t, (k, s) in self._holds.items()]

    def holders(self) -> int:
        self._settle()
        return len(self._holds)

    def held_since(self) -> dict[str, float]:
        """Each key with at least one hold -> seconds its oldest hold has lasted."""
        self._settle()
        with self._lock:
            now = self._clock()
            out: dict[str, float] = {}
            for key, since in self._holds.values():
                out.setdefault(key, now - since)
            return out

    def holds_of(self, key: str) -> int:
        self._settle()
        with self._lock:
            return sum(1 for k, _ in self._holds.values() if k == key)

    def stats(self) -> LaneStats:
        self._settle()
        with self._lock:
            return self._stats(len(self._holds))

    def owns(self, key: str, token: int) -> bool:
        hold = self._holds.get(token)
        return hold is not None and hold[0] == key
