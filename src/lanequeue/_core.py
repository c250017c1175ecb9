"""The one state machine behind every in-process lane: who holds, who waits, who is next.

Both in-process faces (threads in :mod:`lanequeue.lanes`, asyncio in :mod:`lanequeue.aio`)
drive the two cores below. A face only knows how a waiter *parks* (a thread blocks on a
private lock, a task awaits a future) and how it is *woken* (:meth:`Waiter.grant`). Who
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

- ABSENT: no entry. Every other entry is in ``_entries``. IDLE: ``token == 0``, no
  waiters, and also in ``_idle`` (ordered by the moment it went idle). HELD: a holder
  token, maybe a FIFO line of waiters, and not in ``_idle``.
- Only IDLE entries are evicted, so ``max_sessions`` is a soft cap: when every entry is
  held, it is exceeded. Going IDLE -> HELD reuses the entry (no allocation).
- A waiter leaves the line in exactly one of two ways, both under ``_lock``: a releaser
  pops it and grants it (its ``token`` becomes non-zero), or it withdraws itself (timeout,
  cancellation, interrupt) and is removed from the line. :meth:`withdraw` returns the
  token when the grant won the race, so the face can keep the permit or pass it on.

Counting core (:class:`CountingCore`): ``holders`` permits out of ``capacity``, one FIFO
of waiters across all keys; while anyone waits, ``holders == capacity`` (a release hands
its permit to the next waiter instead of returning it). Every hold has its own token, so
the same key may hold several permits and each is tracked and released on its own.

Tokens: every grant takes the next integer of the lane, so a token identifies one hold
and grows with every grant (an in-process fencing token). A release names the token it
ends; a release naming no current hold changes nothing and returns ``False``.

Time: a monotonic clock (``time.monotonic`` unless the lane is given another), read only
for idle ages and hold ages; deadlines of waiting belong to the faces.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Protocol, TypeVar

__all__ = ["Core", "CountingCore", "LaneStats", "SessionCore", "Waiter"]

log = logging.getLogger("lanequeue")

Clock = Callable[[], float]
W = TypeVar("W", bound="Waiter")


class Waiter:
    """One caller in line for a permit. Faces subclass it to say how a waiter is woken.

    ``token`` is 0 while the waiter waits and becomes the granted token when a releaser
    hands it the permit. :meth:`grant` is called with the core's lock held; it must not
    block and must not call back into the core.
    """

    __slots__ = ("token",)

    def __init__(self) -> None:
        self.token = 0

    def grant(self, token: int) -> bool:
        """Hand the permit over; return False if this waiter can no longer take it
        (its task was cancelled in the meantime), and the releaser tries the next one."""
        self.token = token
        return True


class Core(Protocol):
    """The contract both cores offer the faces (see the module docstring)."""

    name: str

    def take(self, key: str, make_waiter: Callable[[], W] | None) -> int | W | None: ...

    def release(self, key: str, token: int = 0) -> bool: ...

    def withdraw(self, key: str, waiter: Waiter, *, timed_out: bool) -> int: ...


@dataclass(frozen=True, slots=True)
class LaneStats:
    """A snapshot of a lane's counters, taken atomically.

    Attributes (all counts since the lane was created, except the last two):
        acquired: permits granted (immediately or by hand-off).
        released: holds ended by a matching release.
        timeouts: failed acquisitions: waits that ran out plus non-blocking refusals
            (the source design's meaning).
        rejected: the non-blocking refusals among ``timeouts`` (``try_acquire`` or a
            zero timeout on a busy lane).
        cancelled: waits abandoned by cancellation or an exception such as
            KeyboardInterrupt (not counted in ``timeouts``).
        evicted: idle per-key entries removed (expired or to make room); 0 on a Lane.
        unmatched_releases: releases that matched no hold and changed nothing.
        holders: permits held now.
        waiters: callers waiting now.
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


class _CoreBase:
    """State and bookkeeping common to both cores. All fields change under ``_lock``."""

    __slots__ = (
        "name",
        "_lock",
        "_clock",
        "_token",
        "_waiting",
        "acquired",
        "released",
        "timeouts",
        "rejected",
        "cancelled",
        "evicted",
        "unmatched",
    )

    def __init__(self, name: str, clock: Clock) -> None:
        self.name = name
        self._lock = threading.Lock()
        self._clock = clock
        self._token = 0  # last token granted; tokens start at 1, 0 means "none"
        self._waiting = 0  # waiters in line, over all keys
        self.acquired = 0
        self.released = 0
        self.timeouts = 0
        self.rejected = 0
        self.cancelled = 0
        self.evicted = 0
        self.unmatched = 0

    def _hand_off(self, line: OrderedDict[Waiter, str]) -> tuple[int, str] | None:
        """Pop waiters from the front of ``line`` until one takes the permit.

        Called with ``_lock`` held by a releaser. Returns (new token, the waiter's key), or
        None when the line held no waiter able to take it. A waiter that refuses (its
        task was cancelled) is dropped from the line here; it counts itself as cancelled
        when it runs :meth:`withdraw`. Each waiter is popped once: O(1) amortised.
        """
        while line:
            waiter, key = line.popitem(last=False)
            self._waiting -= 1
            self._token += 1
            if waiter.grant(self._token):
                self.acquired += 1
                return self._token, key
        return None

    def _stats(self, holders: int, evicted: int) -> LaneStats:
        return LaneStats(
            acquired=self.acquired,
            released=self.released,
            timeouts=self.timeouts,
            rejected=self.rejected,
            cancelled=self.cancelled,
            evicted=evicted,
            unmatched_releases=self.unmatched,
            holders=holders,
            waiters=self._waiting,
        )

    @property
    def waiting(self) -> int:
        """Callers in line now, over all keys."""
        return self._waiting


def _warn_unmatched(lane: str, key: str, token: int) -> None:
    if token:
        log.warning("lane %r: release of key %r with token %d matches no hold; ignored",
                    lane, key, token)
    else:
        log.warning("lane %r: release of key %r, which is not held; ignored", lane, key)


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

    __slots__ = ("max_sessions", "idle_timeout_s", "_entries", "_idle")

    def __init__(
        self,
        name: str,
        max_sessions: int,
        idle_timeout_s: float,
        clock: Clock = time.monotonic,
    ) -> None:
        super().__init__(name, clock)
        self.max_sessions = max_sessions
        self.idle_timeout_s = idle_timeout_s
        # Every live entry, HELD (token != 0) or IDLE (token == 0).
        self._entries: dict[str, _Entry] = {}
        # The IDLE entries, in the order they went idle (an entry is re-inserted at the
        # end each time), so the front is always the oldest: expiry and cap eviction pop
        # from the front in O(1).
        self._idle: OrderedDict[str, _Entry] = OrderedDict()

    # -- transitions -------------------------------------------------------------------

    def take(self, key: str, make_waiter: Callable[[], W] | None) -> int | W | None:
        """Grant ``key`` now if nobody holds it (returns the token); else put a new waiter
        from ``make_waiter`` at the end of the key's line and return it (the caller parks
        on it); with ``make_waiter=None`` refuse instead (returns None)."""
        lock = self._lock
        lock.acquire()
        try:
            entry = self._entries.get(key)
            if entry is None:
                now = self._clock()
                if self._idle:
                    self._make_room(now)
                self._token = token = self._token + 1
                self._entries[key] = _Entry(token, now)
                self.acquired += 1
                return token
            if not entry.token:
                # IDLE: nobody holds the key, so nobody waits for it either (waiters
                # exist only behind a holder): granting here cannot overtake anyone.
                del self._idle[key]
                self._token = token = self._token + 1
                entry.token = token
                entry.since = self._clock()
                self.acquired += 1
                return token
            if make_waiter is None:
                self.rejected += 1
                self.timeouts += 1
                return None
            waiter = make_waiter()
            if entry.line is None:
                entry.line = OrderedDict()
            # Joined under the same lock hold that saw the holder: the holder's release
            # must take this lock too, so it will find this waiter in line (no lost wake-up).
            entry.line[waiter] = key
            self._waiting += 1
            return waiter
        finally:
            lock.release()

    def release(self, key: str, token: int = 0) -> bool:
        """End the hold on ``key`` (the one with ``token``, or whichever hold it has when
        ``token`` is 0) and hand the key to the first waiter that takes it. Returns False,
        logs a warning and changes nothing when no such hold exists."""
        lock = self._lock
        lock.acquire()
        try:
            entry = self._entries.get(key)
            if entry is None or not entry.token or (token and entry.token != token):
                self.unmatched += 1
                ok = False
            else:
                ok = True
                self.released += 1
                line = entry.line
                granted = self._hand_off(line) if line else None
                if granted is not None:
                    # Hand-off: the entry stays HELD; no instant exists in which it is free.
                    entry.token = granted[0]
                    entry.since = self._clock()
                else:
                    entry.line = None
                    entry.token = 0
                    entry.since = self._clock()
                    self._idle[key] = entry
        finally:
            lock.release()
        if not ok:
            _warn_unmatched(self.name, key, token)
        return ok

    def withdraw(self, key: str, waiter: Waiter, *, timed_out: bool) -> int:
        """Take ``waiter`` out of line (its wait ran out, or it was cancelled/interrupted).

        Returns the waiter's token if a releaser granted it first: the caller then holds
        the key and must keep it or release it. Returns 0 otherwise; the waiter then holds
        nothing and is no longer counted anywhere.
        """
        with self._lock:
            if waiter.token:
                return waiter.token
            entry = self._entries.get(key)
            if entry is not None and entry.line is not None:
                if entry.line.pop(waiter, None) is not None:
                    self._waiting -= 1
                if not entry.line:
                    entry.line = None
            if timed_out:
                self.timeouts += 1
            else:
                self.cancelled += 1
            return 0

    # -- eviction ------------------------------------------------------------------------

    def _purge_expired(self, now: float) -> int:
        """Drop idle entries idle for ``idle_timeout_s`` or longer. Lock held. Pops only
        expired entries from the front, so the cost is paid once per entry."""
        idle = self._idle
        limit = now - self.idle_timeout_s
        n = 0
        while idle:
            key, entry = next(iter(idle.items()))
            if entry.since > limit:
                break
            del idle[key]
            del self._entries[key]
            n += 1
        self.evicted += n
        return n

    def _make_room(self, now: float) -> None:
        """Called with the lock held before a NEW entry is created: expired entries go,
        then, if the registry is still at the cap, the oldest idle entry. Held entries
        are never touched: if all are held, the cap is exceeded (soft cap)."""
        self._purge_expired(now)
        if self._idle and len(self._entries) >= self.max_sessions:
            key, _ = self._idle.popitem(last=False)
            del self._entries[key]
            self.evicted += 1

    def cleanup_idle(self) -> int:
        """Evict expired idle entries now; return how many went."""
        with self._lock:
            return self._purge_expired(self._clock())

    # -- views ---------------------------------------------------------------------------

    def session_count(self) -> int:
        """Live entries (held or idle), after dropping the expired ones."""
        with self._lock:
            self._purge_expired(self._clock())
            return len(self._entries)

    def holders(self) -> int:
        return len(self._entries) - len(self._idle)

    def held_since(self) -> dict[str, float]:
        """Each held key -> seconds it has been held by its current holder."""
        with self._lock:
            now = self._clock()
            return {k: now - e.since for k, e in self._entries.items() if e.token}

    def is_held(self, key: str) -> bool:
        entry = self._entries.get(key)
        return entry is not None and entry.token != 0

    def waiting_for(self, key: str) -> int:
        with self._lock:
            entry = self._entries.get(key)
            return len(entry.line) if entry is not None and entry.line else 0

    def stats(self) -> LaneStats:
        with self._lock:
            return self._stats(len(self._entries) - len(self._idle), self.evicted)

    def idle_count(self) -> int:
        return len(self._idle)


class CountingCore(_CoreBase):
    """A counting lane: at most ``capacity`` holders, one FIFO line across all keys.

    Thread-safe: every method takes the core's lock for O(1) amortised work (per key,
    O(holds of that key)) and never blocks inside it.
    """

    __slots__ = ("capacity", "_holders", "_active", "_line")

    def __init__(self, name: str, capacity: int, clock: Clock = time.monotonic) -> None:
        super().__init__(name, clock)
        self.capacity = capacity
        self._holders = 0
        # key -> {token: since}; insertion order is grant order, so the first item of a
        # key's dict is its oldest hold (the one a key-only release ends).
        self._active: dict[str, dict[int, float]] = {}
        self._line: OrderedDict[Waiter, str] = OrderedDict()

    def _add_hold(self, key: str, token: int, now: float) -> None:
        holds = self._active.get(key)
        if holds is None:
            self._active[key] = {token: now}
        else:
            holds[token] = now

    def take(self, key: str, make_waiter: Callable[[], W] | None) -> int | W | None:
        """Grant a permit now if one is free (returns the token); else put a new waiter
        from ``make_waiter`` at the end of the line (returned), or refuse (None)."""
        lock = self._lock
        lock.acquire()
        try:
            if self._holders < self.capacity:
                # A free permit means nobody is in line (releases hand permits to waiters
                # while there are any), so taking it cannot overtake anyone.
                self._holders += 1
                self._token = token = self._token + 1
                holds = self._active.get(key)
                if holds is None:
                    self._active[key] = {token: self._clock()}
                else:
                    holds[token] = self._clock()
                self.acquired += 1
                return token
            if make_waiter is None:
                self.rejected += 1
                self.timeouts += 1
                return None
            waiter = make_waiter()
            self._line[waiter] = key
            self._waiting += 1
            return waiter
        finally:
            lock.release()

    def release(self, key: str, token: int = 0) -> bool:
        """End the hold of ``key`` with ``token`` (or the key's oldest hold when ``token``
        is 0) and hand the permit to the first waiter that takes it. Returns False, logs a
        warning and changes nothing when no such hold exists."""
        lock = self._lock
        lock.acquire()
        try:
            holds = self._active.get(key)
            if holds is None or (token and token not in holds):
                self.unmatched += 1
                ok = False
            else:
                ok = True
                del holds[token or next(iter(holds))]
                if not holds:
                    del self._active[key]
                self.released += 1
                granted = self._hand_off(self._line) if self._line else None
                if granted is not None:
                    self._add_hold(granted[1], granted[0], self._clock())
                else:
                    self._holders -= 1
        finally:
            lock.release()
        if not ok:
            _warn_unmatched(self.name, key, token)
        return ok

    def withdraw(self, key: str, waiter: Waiter, *, timed_out: bool) -> int:
        """As :meth:`SessionCore.withdraw`."""
        with self._lock:
            if waiter.token:
                return waiter.token
            if self._line.pop(waiter, None) is not None:
                self._waiting -= 1
            if timed_out:
                self.timeouts += 1
            else:
                self.cancelled += 1
            return 0

    def holders(self) -> int:
        return self._holders

    def held_since(self) -> dict[str, float]:
        """Each key with at least one hold -> seconds its oldest hold has lasted."""
        with self._lock:
            now = self._clock()
            return {k: now - next(iter(h.values())) for k, h in self._active.items()}

    def holds_of(self, key: str) -> int:
        with self._lock:
            holds = self._active.get(key)
            return len(holds) if holds else 0

    def stats(self) -> LaneStats:
        with self._lock:
            return self._stats(self._holders, 0)
