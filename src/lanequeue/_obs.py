"""What a lane observes for operators: histograms kept as plain counters, the snapshot a
metrics exporter reads, and the stuck-hold record.

Nothing here calls a metrics library. A lane keeps its histograms as lists of integers
(one per bucket) that it bumps where the work already happens (the slow path of a wait; the
release of a hold, when hold metrics are on, appends the hold time to a short list that is
bucketed in batches and at read time); an exporter (:mod:`lanequeue.metrics`) reads
:meth:`MetricsSource.metrics_snapshot` at scrape time. Any lane that offers the two
methods of :class:`MetricsSource` (the in-process lanes do; a Redis lane can) plugs into
the exporters.
"""

from __future__ import annotations

from bisect import bisect_left, bisect_right
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol, runtime_checkable

if TYPE_CHECKING:
    from ._core import LaneStats

__all__ = [
    "HELD_BATCH",
    "HOLD_BUCKETS",
    "WAIT_BUCKETS",
    "Histogram",
    "HistogramSnapshot",
    "LaneMetrics",
    "MetricsSource",
    "StuckHold",
]

#: Upper bounds (seconds) of the wait-time buckets; a last bucket takes the rest (+Inf).
#: They reach the default lane timeout (300 s).
WAIT_BUCKETS: tuple[float, ...] = (
    0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0,
)
#: Upper bounds (seconds) of the hold-time buckets; a last bucket takes the rest (+Inf).
HOLD_BUCKETS: tuple[float, ...] = (
    0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1.0, 5.0, 10.0, 30.0, 60.0, 300.0, 900.0, 3600.0,
)
#: Values a histogram's hot path appends to it before they are bucketed (``fold``).
HELD_BATCH = 256


class Histogram(list[float]):
    """Observations counted per bucket: ``counts[i]`` holds the values ``<= bounds[i]``
    and ``> bounds[i-1]``; the last count holds the values above every bound. Not
    thread-safe by itself: its owner calls it under its own lock.

    Two ways in: :meth:`observe` buckets a value at once; a hot path (the release of a
    hold, the end of a wait) appends the value to the histogram itself, which is a list
    of the values not bucketed yet (one list append: no method call, no bucket search),
    and calls :meth:`fold` about every :data:`HELD_BATCH` values, which bounds its
    memory (a wait when the list holds that many; a release by its token, see
    ``_CoreBase._fold_holds`` in :mod:`lanequeue._core`). A snapshot folds what is left
    first, so both ways give the same histogram."""

    __slots__ = ("bounds", "counts", "sum")

    def __init__(self, bounds: tuple[float, ...]) -> None:
        self.bounds = bounds
        self.counts = [0] * (len(bounds) + 1)
        self.sum = 0.0
        super().__init__()

    def observe(self, value: float) -> None:
        """Count ``value`` (seconds) in its bucket and add it to the sum."""
        self.counts[bisect_left(self.bounds, value)] += 1
        self.sum += value

    def add(self, value: float) -> None:
        """Append ``value`` (seconds, >= 0) to the values not bucketed yet, folding them
        once there are :data:`HELD_BATCH` (the batched :meth:`observe`; the thread holds'
        fast steps and the cores' FIFO hand-offs inline these lines for speed)."""
        self.append(value)
        if len(self) >= HELD_BATCH:
            self.fold()

    def fold(self) -> None:
        """Bucket the values appended to the list and empty it. Interrupt-safe (it runs
        inside a lane's critical section, see "Interrupts" in :mod:`lanequeue._core`):
        the buckets and the sum are computed aside, then stored with plain stores and
        the list emptied by one last builtin, so a KeyboardInterrupt at any check leaves
        every value counted once (folded, or still in the list)."""
        held = self
        if not held:
            return
        bounds = self.bounds
        batch = sum(held)
        total = self.sum + batch
        counts = list(self.counts)  # a copy: storing it is the commit
        # All in one bucket (the usual batch)? The values are durations on a monotonic
        # clock (>= 0), so a batch whose SUM is within the first bound lies wholly in the
        # first bucket (no pass for the maximum: a fast lane's batch); else the maximum's
        # bucket holds them all if the minimum's is the same one.
        lo = 0 if batch <= bounds[0] else bisect_left(bounds, max(held))
        if lo == 0 or lo == bisect_left(bounds, min(held)):
            counts[lo] += len(held)
        else:
            # Sorted once (in C), then one search per bound instead of one per value.
            held.sort()
            below = 0
            for i, bound in enumerate(bounds):
                upto = bisect_right(held, bound)
                counts[i] += upto - below
                below = upto
            counts[-1] += len(held) - below
        # -- commit: plain stores, then one last builtin --
        self.counts = counts
        self.sum = total
        held.clear()

    def snapshot(self, zeros: int = 0) -> HistogramSnapshot:
        """A copy (after :meth:`fold`), with ``zeros`` more observations of 0 (counted in
        the first bucket)."""
        self.fold()
        counts = list(self.counts)
        counts[0] += zeros
        return HistogramSnapshot(self.bounds, tuple(counts), self.sum)


@dataclass(frozen=True, slots=True)
class HistogramSnapshot:
    """A histogram read at one instant.

    Attributes:
        bounds: bucket upper bounds in seconds, increasing (the ``+Inf`` bucket is implied).
        counts: observations per bucket, NOT cumulative; one more entry than ``bounds``
            (the last one counts the values above every bound).
        sum: the sum of the observed values, in seconds.
    """

    bounds: tuple[float, ...]
    counts: tuple[int, ...]
    sum: float

    @property
    def count(self) -> int:
        """Observations in all."""
        return sum(self.counts)

    def cumulative(self) -> list[tuple[float, int]]:
        """``(upper bound, observations <= it)`` per bucket, ending with ``(inf, count)``:
        the Prometheus ``le`` buckets."""
        out: list[tuple[float, int]] = []
        total = 0
        for bound, n in zip((*self.bounds, float("inf")), self.counts, strict=True):
            total += n
            out.append((bound, total))
        return out


@dataclass(frozen=True, slots=True)
class LaneMetrics:
    """What an exporter reads from one lane at scrape time.

    Attributes:
        lane: the lane's name (the ``lane`` label).
        kind: ``"session"`` (per-key) or ``"counting"`` (the ``kind`` label). A wait on a
            session lane waited for a busy key, on a counting lane for a full lane: the
            ``reason`` label of ``lanequeue_wait_seconds``.
        stats: the lane's counters (:class:`lanequeue.LaneStats`).
        wait: wait times of the acquisitions, in seconds: an immediate grant counts as 0,
            a wait as its length, whether it ended granted, timed out, cancelled or
            cleared. Non-blocking refusals are not waits (they are ``stats.rejected``).
        hold: hold times in seconds, observed at release; None while hold metrics are off
            (an exporter turns them on with :meth:`MetricsSource.track_holds`).
        sessions: live per-key entries (held or idle); None on a counting lane.
        oldest_wait_s: seconds the longest waiter now in line has waited (0 when none).
        leases_lost: holds whose lease ran out (Redis lanes; 0 in-process).
        scope: None for an in-process lane; for a Redis lane ``"process"`` (this
            process's view) or ``"lane"`` (the lane-wide view).
    """

    lane: str
    kind: str
    stats: LaneStats
    wait: HistogramSnapshot
    hold: HistogramSnapshot | None
    sessions: int | None
    oldest_wait_s: float
    leases_lost: int = 0
    scope: str | None = None


@runtime_checkable
class MetricsSource(Protocol):
    """What an exporter needs from a lane (every in-process lane has both)."""

    def metrics_snapshot(self) -> list[LaneMetrics]:
        """The lane's metrics now: one entry per scope (in-process lanes: one)."""
        ...

    def track_holds(self) -> None:
        """Start observing hold times (idempotent). Off until an exporter asks: it costs
        work per release (in-process: an append, and a clock read on a counting lane)."""
        ...


@dataclass(frozen=True, slots=True)
class StuckHold:
    """A hold older than the threshold given to ``stuck()``.

    Attributes:
        key: the key held.
        age_s: seconds since the hold was granted.
        token: the hold's fencing token.
    """

    key: str
    age_s: float
    token: int
