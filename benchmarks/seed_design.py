"""The seed design of lanequeue, reproduced as-is: a benchmark baseline and fault demonstrator.

THIS MODULE IS NOT PART OF THE LIBRARY AND MUST NOT BE "FIXED". It reproduces, faults
included, the design lanequeue started from, so that benchmarks have a baseline to measure
against and ``seed_faults.py`` has something to demonstrate the known faults on (see
``/work/shared/design/NOTES.md`` section 3). Only the standard library is used.

Where each piece came from
--------------------------
Two sources, referred to below as "the note" and "the public file":

* The note: the design note "SessionLane: per-key serialisation design for agent systems"
  (geode-team, 2026-03-30; ``/work/shared/seed/sessionlane-design-note.txt``, in Korean,
  summarised in English in NOTES.md section 2).
* The public file: ``core/orchestration/lane_queue.py`` of the public repository
  mangowhoiscloud/geode, at commit 306574326e3853a41f3ec16f7404cbb9308229e6 (the version
  whose ``DEFAULT_MAX_CONCURRENT`` is 4; later versions raised it to 50 and added asyncio
  faces, which are not reproduced here). ``DEFAULT_GLOBAL_CONCURRENCY = 8`` comes from
  ``core/runtime_wiring/infra.py`` of the same repository.

Rule applied: where the note shows code, the note wins for ``SessionLane``, ``LaneQueue`` and
the two ``Lane`` methods it shows; the public file supplies everything the note leaves out.

=====================================  ==================================================
Piece                                  Source
=====================================  ==================================================
``DEFAULT_TIMEOUT_S`` (300 s),         public file
``DEFAULT_MAX_CONCURRENT`` (4)
``DEFAULT_GLOBAL_CONCURRENCY`` (8)     public repository, ``core/runtime_wiring/infra.py``
``_LaneStats``                         public file (verbatim)
``Lane.__init__``, ``stats``,          public file (verbatim; the note's section 1 shows
``active_count``, ``available``,       only the ``_semaphore`` / ``_active`` lines of
``acquire``, ``acquire_timeout``,      ``__init__``)
``try_acquire``, ``manual_release``,
``get_active``
``Lane._raw_acquire``,                 note section 6. The public file's ``_raw_release``
``Lane._raw_release``                  differs only in order: it releases the semaphore
                                       BEFORE popping ``_active``, so a new holder's entry
                                       for the same key can be popped by the old holder.
``_SessionEntry``                      note section 4.1 (``__slots__`` class; the public
                                       file has an equivalent dataclass)
``SessionLane.__init__``, class        note section 4.2 (takes ``name``; the public file
constants, ``_get_or_create``          hard-codes ``name="session"``, defaults
                                       ``idle_timeout_s`` to 300 and raises
                                       ``RuntimeError`` at the cap, i.e. a hard cap)
``_evict_idle_locked``,                note section 4.3 (soft cap: if every entry is held,
``_evict_oldest_idle_locked``          the new entry is created anyway)
``SessionLane.acquire``,               note section 5 (unlike the public file, ``acquire``
``try_acquire``, ``manual_release``,   does not refresh ``last_used`` after the semaphore
``acquire_timeout``                    is taken; ``manual_release`` returns ``bool``)
``SessionLane._raw_acquire``,          note section 6 (``_raw_release`` counts a release
``_raw_release``                       even when the key has no entry)
``SessionLane.stats``,                 public file (not in the note; adapted only to the
``active_count``, ``session_count``,   note's attribute names ``_max_sessions`` /
``get_active``, ``cleanup_idle``       ``_idle_timeout_s``)
``LaneQueue.__init__``,                note section 6 (one ``_lanes`` dict holding both
``add_session_lane``, ``acquire_all``  kinds; no special-casing of the name "session")
``LaneQueue.add_lane``, ``get_lane``   public file (``get_lane`` return type widened to
                                       the note's ``Lane | SessionLane``)
``LaneQueue.list_lanes``, ``status``   public file, adapted to the note's single dict
``build_default_lanes``                note section 1, with the "session" lane turned into
                                       the note's ``SessionLane`` (256 sessions, 3600 s
                                       idle) as sections 4-7 intend; "global" is a
                                       ``Lane`` of ``DEFAULT_GLOBAL_CONCURRENCY``
=====================================  ==================================================

Known faults kept on purpose (numbers refer to NOTES.md section 3)
-----------------------------------------------------------------
1. ``held`` protects an entry only while it is held: an entry with a waiter can be evicted,
   after which two holders run under one key.
2. Releases are not checked: ``Lane.manual_release`` / ``_raw_release`` and
   ``SessionLane._raw_release`` release the semaphore even if nothing was held, raising a
   max-1 lane to 2.
3. ``Lane._active`` is keyed by key: two holders with the same key overwrite each other.
4. ``threading.Semaphore`` is not FIFO: a newcomer can overtake a waiter.
5. At the cap every new key scans all entries, twice (O(n) eviction).
6. Idle ages use ``time.time()`` (wall clock), not a monotonic clock.
7. ``acquire_all`` takes lanes in the caller's order (deadlock with opposite orders) and
   applies each lane's own timeout in turn, so the caller's worst wait is their SUM.

Also kept: ``entry.held`` is written outside the registry lock while eviction reads it under
the lock; ``SessionLane.active_count`` / ``get_active`` are O(n) scans.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Generator
from contextlib import contextmanager
from typing import Any

log = logging.getLogger(__name__)

# Public file.
DEFAULT_MAX_CONCURRENT = 4
DEFAULT_TIMEOUT_S = 300.0  # 5 minutes
# Public repository, core/runtime_wiring/infra.py.
DEFAULT_GLOBAL_CONCURRENCY = 8


# ---------------------------------------------------------------------------
# _LaneStats (public file, verbatim)
# ---------------------------------------------------------------------------


class _LaneStats:
    """Track lane statistics."""

    def __init__(self) -> None:
        self.acquired: int = 0
        self.released: int = 0
        self.timeouts: int = 0
        self._lock = threading.Lock()

    def inc_acquired(self) -> None:
        with self._lock:
            self.acquired += 1

    def inc_released(self) -> None:
        with self._lock:
            self.released += 1

    def inc_timeouts(self) -> None:
        with self._lock:
            self.timeouts += 1

    def to_dict(self) -> dict[str, int]:
        with self._lock:
            return {
                "acquired": self.acquired,
                "released": self.released,
                "timeouts": self.timeouts,
            }


# ---------------------------------------------------------------------------
# Lane (public file, plus the note's section 6 _raw_acquire / _raw_release)
# ---------------------------------------------------------------------------


class Lane:
    """A single concurrency lane with semaphore-based limiting.

    Usage:
        lane = Lane("global", max_concurrent=8)
        with lane.acquire("ip:berserk:analysis"):
            # ... do work ...
    """

    def __init__(
        self,
        name: str,
        *,
        max_concurrent: int = DEFAULT_MAX_CONCURRENT,
        timeout_s: float = DEFAULT_TIMEOUT_S,
    ) -> None:
        self.name = name
        self.max_concurrent = max_concurrent
        self.timeout_s = timeout_s
        # Fault 4: threading.Semaphore has no FIFO order among waiters.
        self._semaphore = threading.Semaphore(max_concurrent)
        # Fault 3: keyed by key, so two holders with the same key share one slot here.
        # Fault 6: values are time.time() (wall clock).
        self._active: dict[str, float] = {}
        self._lock = threading.Lock()
        self._stats = _LaneStats()

    @property
    def stats(self) -> _LaneStats:
        return self._stats

    @property
    def active_count(self) -> int:
        with self._lock:
            return len(self._active)

    @property
    def available(self) -> int:
        return self.max_concurrent - self.active_count

    @contextmanager
    def acquire(self, key: str) -> Generator[None, None, None]:
        """Acquire a slot in this lane. Blocks if at capacity.

        Args:
            key: Identifier for the work item.

        Raises:
            TimeoutError: If slot not acquired within timeout.
        """
        acquired = self._semaphore.acquire(timeout=self.timeout_s)
        if not acquired:
            self._stats.inc_timeouts()
            raise TimeoutError(
                f"Lane '{self.name}' timeout after {self.timeout_s}s "
                f"(max_concurrent={self.max_concurrent})"
            )

        with self._lock:
            self._active[key] = time.time()
        self._stats.inc_acquired()

        log.debug(
            "Lane '%s' acquired by %s (%d/%d active)",
            self.name,
            key,
            self.active_count,
            self.max_concurrent,
        )

        try:
            yield
        finally:
            with self._lock:
                self._active.pop(key, None)
            self._stats.inc_released()
            self._semaphore.release()
            log.debug("Lane '%s' released by %s", self.name, key)

    def acquire_timeout(self, key: str, timeout_s: float) -> bool:
        """Blocking acquire with explicit timeout (for IsolatedRunner).

        Returns True if a slot was acquired within *timeout_s*.
        Caller must call :meth:`manual_release` when done.
        """
        acquired = self._semaphore.acquire(timeout=timeout_s)
        if not acquired:
            self._stats.inc_timeouts()
            return False
        with self._lock:
            self._active[key] = time.time()
        self._stats.inc_acquired()
        log.debug(
            "Lane '%s' acquire_timeout(%.1fs) by %s (%d/%d active)",
            self.name,
            timeout_s,
            key,
            self.active_count,
            self.max_concurrent,
        )
        return True

    def try_acquire(self, key: str) -> bool:
        """Non-blocking acquire for async patterns (e.g. scheduler).

        Returns True if a slot was acquired, False if lane is full.
        Caller must call :meth:`manual_release` when done.
        """
        acquired = self._semaphore.acquire(timeout=0)
        if not acquired:
            self._stats.inc_timeouts()
            return False
        with self._lock:
            self._active[key] = time.time()
        self._stats.inc_acquired()
        log.debug(
            "Lane '%s' try_acquire by %s (%d/%d active)",
            self.name,
            key,
            self.active_count,
            self.max_concurrent,
        )
        return True

    def manual_release(self, key: str) -> None:
        """Release a slot acquired via :meth:`try_acquire`."""
        # Fault 2: no check that *key* holds a slot; the semaphore is released regardless.
        with self._lock:
            self._active.pop(key, None)
        self._stats.inc_released()
        self._semaphore.release()
        log.debug("Lane '%s' manual_release by %s", self.name, key)

    def get_active(self) -> dict[str, float]:
        """Get active work items with elapsed time."""
        now = time.time()
        with self._lock:
            return {k: now - v for k, v in self._active.items()}

    # --- Internal: for LaneQueue.acquire_all() duck-typing (note, section 6) ---

    def _raw_acquire(self, key: str) -> bool:
        """Internal: semaphore acquire + active tracking.

        Used by LaneQueue.acquire_all(). Not a context manager.
        Returns True on success, False on timeout.
        """
        acquired = self._semaphore.acquire(timeout=self.timeout_s)
        if not acquired:
            self._stats.inc_timeouts()
            return False
        with self._lock:
            self._active[key] = time.time()
        self._stats.inc_acquired()
        return True

    def _raw_release(self, key: str) -> None:
        """Internal: semaphore release + active tracking removal."""
        # Fault 2: unchecked, like manual_release.
        with self._lock:
            self._active.pop(key, None)
        self._stats.inc_released()
        self._semaphore.release()


# ---------------------------------------------------------------------------
# SessionLane (note, sections 4-6; observability from the public file)
# ---------------------------------------------------------------------------


class _SessionEntry:
    """Encapsulates a per-key Semaphore and its metadata."""

    # __slots__: there may be hundreds of entries, so drop the per-instance __dict__.
    __slots__ = ("semaphore", "last_used", "held")

    def __init__(self) -> None:
        self.semaphore = threading.Semaphore(1)
        self.last_used: float = time.time()  # fault 6: wall clock
        # Fault 1: only "held" protects an entry from eviction; waiters are not counted.
        self.held: bool = False  # whether the entry is currently acquired


class SessionLane:
    """Per-key serialization lane.

    Same key -> serial (one Semaphore(1) per key).
    Different keys -> parallel (independent Semaphores).
    """

    _DEFAULT_MAX_SESSIONS = 256
    _DEFAULT_IDLE_TIMEOUT_S = 3600.0  # 1 hour

    def __init__(
        self,
        name: str,
        *,
        max_sessions: int = _DEFAULT_MAX_SESSIONS,
        idle_timeout_s: float = _DEFAULT_IDLE_TIMEOUT_S,
        timeout_s: float = DEFAULT_TIMEOUT_S,
    ) -> None:
        self.name = name
        self.timeout_s = timeout_s
        self._max_sessions = max_sessions
        self._idle_timeout_s = idle_timeout_s
        self._sessions: dict[str, _SessionEntry] = {}
        self._lock = threading.Lock()  # guards the dict only
        self._stats = _LaneStats()

    # --- Observability (public file, not in the note) ---

    @property
    def stats(self) -> _LaneStats:
        return self._stats

    @property
    def active_count(self) -> int:
        with self._lock:
            return sum(1 for e in self._sessions.values() if e.held)

    @property
    def session_count(self) -> int:
        with self._lock:
            return len(self._sessions)

    def get_active(self) -> dict[str, float]:
        """Return held sessions with elapsed time since last use."""
        now = time.time()
        with self._lock:
            return {k: now - e.last_used for k, e in self._sessions.items() if e.held}

    def cleanup_idle(self) -> int:
        """Evict sessions idle beyond *idle_timeout_s*. Returns count evicted."""
        with self._lock:
            return self._evict_idle_locked()

    # --- Registry (note, sections 4.2 and 4.3) ---

    def _get_or_create(self, key: str) -> _SessionEntry:
        """Return the entry for *key*, creating it if missing."""
        with self._lock:
            entry = self._sessions.get(key)
            if entry is None:
                # At capacity: evict idle entries.
                if len(self._sessions) >= self._max_sessions:
                    self._evict_idle_locked()
                # Still at capacity: evict the oldest idle entry.
                if len(self._sessions) >= self._max_sessions:
                    self._evict_oldest_idle_locked()
                entry = _SessionEntry()
                self._sessions[key] = entry
            entry.last_used = time.time()
            # Fault 1: the lock is dropped here, before the caller waits on the semaphore.
            # Until the caller sets held=True the entry is evictable, and a later caller
            # with the same key then gets a fresh entry with a fresh Semaphore(1).
            return entry

    def _evict_idle_locked(self) -> int:
        """Evict idle entries. Entries with held=True are protected.

        Must be called with _lock held.
        """
        now = time.time()
        threshold = now - self._idle_timeout_s
        # Fault 5: O(n) scan of every entry.
        to_remove = [
            k
            for k, entry in self._sessions.items()
            if entry.last_used < threshold and not entry.held
        ]
        for k in to_remove:
            del self._sessions[k]
        if to_remove:
            log.debug(
                "SessionLane '%s' evicted %d idle entries (%d remaining)",
                self.name,
                len(to_remove),
                len(self._sessions),
            )
        return len(to_remove)

    def _evict_oldest_idle_locked(self) -> bool:
        """Force-evict the single oldest idle entry.

        Called when still over capacity after _evict_idle_locked.
        """
        oldest_key: str | None = None
        oldest_time = float("inf")
        # Fault 5: a second O(n) scan.
        for k, entry in self._sessions.items():
            if not entry.held and entry.last_used < oldest_time:
                oldest_key = k
                oldest_time = entry.last_used
        if oldest_key is not None:
            del self._sessions[oldest_key]
            log.debug(
                "SessionLane '%s' force-evicted oldest idle entry '%s'",
                self.name,
                oldest_key,
            )
            return True
        return False

    # --- Lane-compatible surface (note, section 5) ---

    @contextmanager
    def acquire(self, key: str) -> Generator[None, None, None]:
        """Context-manager acquire: same signature as Lane.acquire()."""
        entry = self._get_or_create(key)
        acquired = entry.semaphore.acquire(timeout=self.timeout_s)
        if not acquired:
            self._stats.inc_timeouts()
            raise TimeoutError(f"SessionLane '{self.name}' timeout for key '{key}'")
        entry.held = True
        self._stats.inc_acquired()
        try:
            yield
        finally:
            entry.held = False
            entry.last_used = time.time()
            entry.semaphore.release()
            self._stats.inc_released()

    def try_acquire(self, key: str) -> bool:
        """Non-blocking acquire: same signature as Lane.try_acquire()."""
        entry = self._get_or_create(key)
        acquired = entry.semaphore.acquire(timeout=0)
        if not acquired:
            self._stats.inc_timeouts()
            return False
        entry.held = True
        self._stats.inc_acquired()
        return True

    def manual_release(self, key: str) -> bool:
        """Manual release: same signature as Lane.manual_release()."""
        with self._lock:
            entry = self._sessions.get(key)
            if entry is None or not entry.held:
                log.warning(
                    "SessionLane '%s' manual_release for inactive key '%s'",
                    self.name,
                    key,
                )
                return False
            entry.held = False
            entry.last_used = time.time()
        entry.semaphore.release()
        self._stats.inc_released()
        return True

    def acquire_timeout(self, key: str, timeout_s: float) -> bool:
        """Blocking acquire with custom timeout."""
        entry = self._get_or_create(key)
        acquired = entry.semaphore.acquire(timeout=timeout_s)
        if not acquired:
            self._stats.inc_timeouts()
            return False
        entry.held = True
        self._stats.inc_acquired()
        return True

    # --- Internal: for LaneQueue.acquire_all() duck-typing (note, section 6) ---

    def _raw_acquire(self, key: str) -> bool:
        entry = self._get_or_create(key)
        acquired = entry.semaphore.acquire(timeout=self.timeout_s)
        if not acquired:
            self._stats.inc_timeouts()
            return False
        entry.held = True
        self._stats.inc_acquired()
        return True

    def _raw_release(self, key: str) -> None:
        with self._lock:
            entry = self._sessions.get(key)
        # Fault 2: no "held" check; a second release raises the key's semaphore to 2.
        if entry is not None:
            entry.held = False
            entry.last_used = time.time()
            entry.semaphore.release()
        self._stats.inc_released()


# ---------------------------------------------------------------------------
# LaneQueue (note, section 6; add_lane / get_lane / list_lanes / status from the public file)
# ---------------------------------------------------------------------------


class LaneQueue:
    """Registry of named lanes (Lane or SessionLane) with multi-lane acquire."""

    def __init__(self) -> None:
        self._lanes: dict[str, Lane | SessionLane] = {}

    def add_lane(
        self,
        name: str,
        *,
        max_concurrent: int = DEFAULT_MAX_CONCURRENT,
        timeout_s: float = DEFAULT_TIMEOUT_S,
    ) -> Lane:
        """Add a named lane."""
        lane = Lane(name, max_concurrent=max_concurrent, timeout_s=timeout_s)
        self._lanes[name] = lane
        return lane

    def add_session_lane(
        self,
        name: str,
        *,
        max_sessions: int = 256,
        idle_timeout_s: float = 3600.0,
        timeout_s: float = DEFAULT_TIMEOUT_S,
    ) -> SessionLane:
        """Add a per-key serialization lane."""
        lane = SessionLane(
            name,
            max_sessions=max_sessions,
            idle_timeout_s=idle_timeout_s,
            timeout_s=timeout_s,
        )
        self._lanes[name] = lane
        return lane

    def get_lane(self, name: str) -> Lane | SessionLane | None:
        return self._lanes.get(name)

    def list_lanes(self) -> list[str]:
        return list(self._lanes.keys())

    @contextmanager
    def acquire_all(
        self,
        key: str,
        lane_names: list[str],
    ) -> Generator[None, None, None]:
        """Polymorphic acquire supporting both Lane and SessionLane."""
        # Fault 7: lanes are taken in the caller's order (opposite orders can deadlock) and
        # each _raw_acquire waits up to that lane's own timeout_s, so the worst-case wait is
        # the SUM of the lanes' timeouts.
        acquired: list[tuple[Lane | SessionLane, str]] = []
        try:
            for name in lane_names:
                lane = self._lanes.get(name)
                if lane is None:
                    raise KeyError(f"Lane '{name}' not found")
                # Duck typing: both Lane and SessionLane support _raw_acquire.
                if not lane._raw_acquire(key):
                    raise TimeoutError(f"Lane '{name}' timeout for key '{key}'")
                acquired.append((lane, key))
            yield
        finally:
            for lane, k in reversed(acquired):
                lane._raw_release(k)

    def status(self) -> dict[str, Any]:
        """Get status of all lanes."""
        result: dict[str, Any] = {}
        for name, lane in self._lanes.items():
            if isinstance(lane, SessionLane):
                result[name] = {
                    "active": lane.active_count,
                    "sessions": lane.session_count,
                    "max_sessions": lane._max_sessions,
                }
            else:
                result[name] = {
                    "active": lane.active_count,
                    "max": lane.max_concurrent,
                    "available": lane.available,
                }
        return result


def build_default_lanes() -> LaneQueue:
    """Build the default LaneQueue: a "session" SessionLane and a "global" Lane.

    The note's section 1 shows the faulty original (``add_lane("session",
    max_concurrent=1)``); its sections 4-7 replace that lane with a SessionLane.
    """
    queue = LaneQueue()
    queue.add_session_lane("session", max_sessions=256, idle_timeout_s=3600.0)  # serial per key
    queue.add_lane("global", max_concurrent=DEFAULT_GLOBAL_CONCURRENCY)
    return queue
