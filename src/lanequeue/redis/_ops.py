"""Operations of a Redis lane object for THIS process's waiters and holds: wait and hold
histograms, slow-wait and long-hold warnings, ``stuck``, drain, ``clear``, ``close``.

One job: the bookkeeping behind the operations surface, above the protocol. It wraps the
core's acquisition procedure (``_take``, :mod:`._protocol`) to refuse it while draining,
to know each waiter of this process (owner id -> key, start, how it must end) and to
observe its wait; the faces call :meth:`RedisOps._ops_block` before and
:meth:`RedisOps._ops_woke` after each bounded wait of a waiter, so a slow-wait warning
needs no timer of its own (the waiter wakes at the warning's instant, once) and a cleared
or drained waiter ends at once: the error raised there goes through the procedure's own
clean-up (it leaves the line and passes on a grant that reached it meanwhile).
What is written once for every lane (the warnings, ``stuck``, ``close``) is
:class:`lanequeue._ops.LaneOps`.
"""

from __future__ import annotations

import time
from abc import abstractmethod
from typing import Any

from .._core import LaneStats
from .._errors import LaneBackendError, LaneClearedError, LaneDrainingError
from .._obs import HOLD_BUCKETS, WAIT_BUCKETS, Histogram, LaneMetrics
from .._ops import DEFAULT_WARN_AFTER_S, RELEASED, LaneOps, OnWait
from .._validate import argument_of
from ._keys import plain_key
from ._protocol import H, RedisLaneBase, Steps, log

__all__ = ["RedisOps"]

_EMPTY_WAIT = Histogram(WAIT_BUCKETS)


class _Waiter:
    """One acquisition of this process in progress (from its first script to its end)."""

    __slots__ = ("key", "since", "ahead", "in_line", "end", "warned")

    def __init__(self, key: str, since: float, ahead: int) -> None:
        self.key = key
        self.since = since  # time.monotonic() at the call
        self.ahead = ahead  # this process's acquisitions of the key already under way
        self.in_line = False  # reached its first bounded wait
        self.end: BaseException | None = None  # cleared or drained: how it must end
        self.warned = False


class RedisOps(LaneOps, RedisLaneBase[H]):
    """The operations surface of a Redis lane object (either kind, either face)."""

    _kind_label = ""
    _internal_base = True
    _ahead_of = " of this process"  # (other processes' waiters are not counted)
    _no_holder_age = ("the current holder is not this lane object's, so how long it has "
                      "held is not known here")

    def _ops_setup(
        self,
        warn_after_s: float | None = DEFAULT_WARN_AFTER_S,
        on_wait: OnWait | None = None,
        warn_hold_s: float | None = None,
    ) -> None:
        self._ops_init(argument_of(f"{type(self).__name__}()"), warn_after_s, on_wait, warn_hold_s)
        self._draining = False
        self._ops_waiters: dict[str, _Waiter] = {}
        # Per line, this object's acquisitions under way (the ``ahead`` of a newcomer):
        # a key's line on a per-key lane, the lane's one line ("") on a counting lane.
        self._ops_per_key: dict[str, int] = {}
        self._one_line = self._kind_class.letter == "c"
        self._wait_hist = Histogram(WAIT_BUCKETS)
        self._wait_zeros = 0
        self._hold_hist: Histogram | None = None

    def _forked(self) -> None:
        """In a forked child: no waiter of this process (the parent's do not exist here)."""
        super()._forked()
        self._ops_waiters = {}
        self._ops_per_key = {}

    # -- the acquisition procedure, wrapped ----------------------------------------------

    def _take(self, hold: H, timeout: float | None, kept: bool = False) -> Steps[bool]:
        hold._parked = None  # taken (refused or not: a hold never entered warns if dropped)
        if self._draining:
            raise LaneDrainingError(self.name, hold.key)
        owner = hold.owner
        key = hold.key
        line = "" if self._one_line else key
        per_key = self._ops_per_key
        w = _Waiter(key, time.monotonic(), 0)
        granted = failed = False
        try:
            # Registered inside the try, in one commit (plain stores after the last
            # call), and unregistered only if registered: an interrupt anywhere leaves
            # no waiter behind (``_idle`` would never be true again).
            with self._lock:
                n = per_key.get(line, 0)
                # -- commit: plain stores --
                w.ahead = n
                per_key[line] = n + 1
                self._ops_waiters[owner] = w
            granted = yield from super()._take(hold, timeout, kept)
            if granted and w.end is not None:
                # Cleared or drained while its grant was on its way: it ends as told,
                # holding nothing.
                try:
                    yield from self._release(hold)
                except Exception as exc:
                    log.debug("lane %r: release after clear failed: %s", self.name, exc)
                granted = False
                raise w.end
            return granted
        except BaseException:
            failed = True
            raise
        finally:
            with self._lock:
                # Unregistered first, in plain stores, before any call: an interrupt can
                # land right after a call returns (a clock read included), and one that
                # landed before these stores left the waiter here for good.
                if owner in self._ops_waiters:  # (owner ids are unique: it is w)
                    del self._ops_waiters[owner]
                    n = per_key[line] - 1
                    if n:
                        per_key[line] = n
                    else:
                        del per_key[line]
                now = time.monotonic()
                if granted and not w.in_line:
                    self._wait_zeros += 1
                elif w.in_line or (not failed and timeout != 0):
                    self._wait_hist.observe(now - w.since)
            if (w.in_line and not w.warned and self.warn_after_s is not None
                    and now - w.since >= self.warn_after_s):
                # The warning comes no later than the end of the wait.
                w.warned = True
                self._slow_wait(w.key, now - w.since, w.ahead)

    def _ops_block(self, owner: str, block: float) -> float:
        """Before a bounded wait of ``owner`` (up to ``block`` s): how long to wait. Raises
        the waiter's end (cleared, drained) at once; shortens the wait to the instant its
        slow-wait warning is due, once."""
        w = self._ops_waiters.get(owner)
        if w is None:
            return block
        w.in_line = True
        if w.end is not None:
            raise w.end
        limit = self.warn_after_s
        if limit is not None and not w.warned:
            due = w.since + limit - time.monotonic()
            if due <= 0:
                self._ops_woke(owner)
            elif due < block:
                return due
        return block

    def _ops_woke(self, owner: str) -> None:
        """After a bounded wait of ``owner``: raise its end, or log its slow wait once."""
        w = self._ops_waiters.get(owner)
        if w is None:
            return
        if w.end is not None:
            raise w.end
        limit = self.warn_after_s
        if limit is not None and not w.warned:
            waited = time.monotonic() - w.since
            if waited >= limit:
                w.warned = True
                self._slow_wait(w.key, waited, w.ahead)

    @abstractmethod
    def _ops_wake(self, owner: str) -> None:
        """Wake ``owner``'s bounded wait now (the face's)."""
        ...

    def _hold_end(self, key: str, token: int, since: float, freed: bool) -> None:
        """A hold ended (once per hold, after its count; see ``RedisLaneBase._hold_end``):
        log it if it lasted ``warn_hold_s`` (unless a check logged it while it was
        held), however it ended (its lease lost included); observe its time when its
        release ``freed`` it (when ``track_holds()`` was called). A dropped hold's
        release is the renewer's (see ``RedisLaneBase._renew_round``)."""
        hist = self._hold_hist if freed else None
        limit = self.warn_hold_s
        if hist is not None or limit is not None:
            held = time.monotonic() - since
            if hist is not None:
                with self._lock:
                    hist.observe(held)
            if limit is not None and held >= limit:
                self._hold_ended(key, token, held, RELEASED if freed else
                                 "it has ended: its lease was lost, or its release did "
                                 "not free it")

    # -- the LaneOps interface -------------------------------------------------------------

    def _hold_list(self) -> list[tuple[str, int, float]]:
        """This object's holds, those whose lease was lost included: such a hold is
        held until its holder releases it (``hold.held``), so ``stuck()`` lists it and
        a check logs it past ``warn_hold_s`` (``holders``, ``get_active()`` and the
        ``sessions`` count leave it out: its key may be another's)."""
        now = time.monotonic()
        out: list[tuple[str, int, float]] = []
        with self._lock:
            for key, entries in self._holds.items():
                for entry in entries:
                    h = entry()
                    if h is not None:
                        out.append((key, h.token, now - h._since))
        return out

    def _pending_ends(self) -> set[tuple[str, int]]:
        """The holds a release has taken out of the registry whose end has not been
        through :meth:`_hold_end` yet (see ``RedisLaneBase._ending``), and the
        dropped holds (garbage-collected while held) until the renewer's release of them
        has reported them: a prune of the marks (``_prune_warned``) keeps theirs, so
        that a hold a check logged as held is not logged again as it ends, however late
        its end gets there (before, two prunes in that gap dropped its mark)."""
        with self._lock:
            out = set(self._ending)
            # Dropped holds: the dead entries not purged yet, those waiting for the
            # renewer, and the renewer's batches not reported yet.
            for key, entries in self._holds.items():
                for entry in entries:
                    if entry() is None:
                        out.add((key, entry.token))
            for batch in (self._to_release, *self._releasing.values()):
                for _, token, key, *_ in batch.values():
                    out.add((key, token))
            return out

    def _held_now(self, key: str, token: int) -> bool:
        # (one read of the registry's list for the key, copied: no lock needed)
        for entry in list(self._holds.get(key, ())):
            hold = entry()
            if hold is not None and hold.token == token:
                return bool(hold.held)
        return False

    def _holder_age(self, key: str) -> float | None:
        """Seconds this object's oldest live hold that a waiter of ``key`` waits behind
        has lasted (per-key lane: of ``key``; counting lane: of any key); None: none."""
        now = time.monotonic()
        oldest: float | None = None
        with self._lock:
            groups = [self._holds.get(key, [])] if self._kind_label == "session" \
                else list(self._holds.values())
            for entries in groups:
                for entry in entries:
                    h = entry()
                    if h is not None and not h.lost:
                        oldest = h._since if oldest is None else min(oldest, h._since)
                        break
        return None if oldest is None else now - oldest

    def _end_waiters(self, key: str | None, err: type[LaneClearedError | LaneDrainingError]
                     ) -> int:
        with self._lock:
            ended = [(o, w) for o, w in self._ops_waiters.items()
                     if w.end is None and (key is None or w.key == key)]
            for _, w in ended:
                w.end = err(self.name, w.key)
        for owner, _ in ended:
            self._ops_wake(owner)
        return len(ended)

    def _start_drain(self, cancel_waiting: bool) -> None:
        self._draining = True
        if cancel_waiting:
            self._end_waiters(None, LaneDrainingError)

    def _idle(self) -> bool:
        return self._n_live == 0 and self._waiting == 0 and not self._ops_waiters

    # -- the public surface -----------------------------------------------------------------

    @property
    def draining(self) -> bool:
        """True once ``drain`` or ``close`` was called on this lane object: its
        acquisitions are refused with :class:`LaneDrainingError`."""
        return self._draining

    def clear(self, key: str) -> int:
        """End every wait of THIS process (this lane object) for ``key``: each waiter
        raises :class:`LaneClearedError`, leaving the line in Redis (a grant that reached
        it meanwhile is passed on). Waiters of other processes and every holder are
        untouched. Returns how many waits were ended. Never waits for Redis.
        Raises TypeError/ValueError for a bad key; on an asyncio lane, call it from the
        event loop of the waiters.

        Example::

            sessions.clear("gateway:web:42")   # this replica's queued turns go
        """
        return self._end_waiters(plain_key(key), LaneClearedError)

    def status(self) -> dict[str, Any]:
        """A JSON-ready picture of this lane object (no Redis round trip). Also logs the
        holds past ``warn_hold_s`` not logged yet."""
        if self.warn_hold_s is not None:
            self._check_holds(self._hold_list())
        return super().status()

    def track_holds(self) -> None:
        """Start observing hold times for ``lanequeue_hold_seconds`` (idempotent): a
        clock read per release of this lane object's holds."""
        with self._lock:
            if self._hold_hist is None:
                self._hold_hist = Histogram(HOLD_BUCKETS)

    def metrics_snapshot(self) -> list[LaneMetrics]:
        """This lane's metrics now for an exporter (:mod:`lanequeue.metrics`): one
        :class:`lanequeue.LaneMetrics` with ``scope="process"`` (this lane object:
        counters, wait and hold times, holders, waiters, leases lost), plus, on a
        counting lane (thread or asyncio), one with ``scope="lane"`` (lane-wide holders and live
        waiters and the oldest wait from the server time each waiter joined, as in
        :meth:`lane_status`, one round trip; skipped with a log line if Redis fails).
        Also logs the holds past ``warn_hold_s`` not logged yet.
        Thread-safe."""
        holds = self._hold_list()
        if self.warn_hold_s is not None:
            self._check_holds(holds)
        now = time.monotonic()
        with self._lock:
            wait = self._wait_hist.snapshot(self._wait_zeros)
            hold = None if self._hold_hist is None else self._hold_hist.snapshot()
            starts = [w.since for w in self._ops_waiters.values() if w.in_line]
        out = [LaneMetrics(
            lane=self.name,
            kind=self._kind_label,
            stats=self.stats,
            wait=wait,
            hold=hold,
            sessions=len(self._local_active()) if self._kind_label == "session" else None,
            oldest_wait_s=max(0.0, now - min(starts)) if starts else 0.0,
            leases_lost=self.leases_lost,
            scope="process",
        )]
        wide = self._lane_metrics()
        if wide is not None:
            out.append(wide)
        return out

    def _lane_metrics(self) -> LaneMetrics | None:
        """The lane-wide entry, where it is cheap (the counting lanes)."""
        return None

    def _lane_entry(self, wide: dict[str, Any]) -> LaneMetrics:
        """A ``scope="lane"`` entry from ``lane_status()``'s figures (gauges only: the
        counters and histograms are each process's)."""
        return LaneMetrics(
            lane=self.name,
            kind=self._kind_label,
            stats=LaneStats(holders=int(wide["active"]), waiters=int(wide["waiting"])),
            wait=_EMPTY_WAIT.snapshot(),
            hold=None,
            sessions=None,
            oldest_wait_s=float(wide["oldest_wait_s"]),
            scope="lane",
        )

    def _lane_failed(self, exc: LaneBackendError) -> None:
        log.warning("lane %r: lane-wide metrics skipped: %s", self.name, exc)
