"""Exact discrete-event simulation of ``LaneQueue.acquire_all`` over a list of lanes.

No threads and no sleeping: the schedule that ideal lanes with zero overhead would produce,
used as the yardstick for a real replay (``ideal_makespan_s``, ``makespan_ratio``).

The model is the semantics of ``acquire_all(key, [lane_0, lane_1, ...])``:

- A request asks for ``lane_0`` at its arrival. It asks for ``lane_{i+1}`` at the instant it
  is granted ``lane_i`` (it holds ``lane_i`` while it waits for the next one). When it holds
  every lane it works for its work time, then releases the lanes in reverse order.
- Each lane is a FIFO with hand-off. A counting lane has ``capacity`` permits shared by all
  keys; a per-key lane (SessionLane) has ``capacity`` permits per key, keys independent. An
  asker is granted at once only if a permit is free *and nobody is queued* on it (no
  barging); otherwise it joins the tail. A release hands the permit straight to the head of
  the queue (it is never free in between), else returns it.

Simultaneous events are ordered so the result is deterministic: at one instant, completions
(in the order the requests started) come before arrivals (in arrival order, ties by index).
A release cascades at once: the waiter handed a permit immediately asks for its next lane,
before the releasing request releases its next lane. Times are kept exact (any mix of ints,
floats and Fractions is converted to one integer time base), so ties are real ties and not
floating-point noise.
"""

from __future__ import annotations

import heapq
import math
from collections import deque
from collections.abc import Hashable, Sequence
from dataclasses import dataclass
from fractions import Fraction
from typing import TypeAlias

from lanequeue.replay.policy import LaneSpec

__all__ = ["Schedule", "simulate"]

Time: TypeAlias = "int | float | Fraction"


@dataclass(frozen=True)
class Schedule:
    """The simulated schedule, in the time unit of the inputs, exactly.

    Attributes:
        arrival: arrival time of each request (the input, as Fractions).
        start: when each request held every lane and started work.
        end: when each request finished work and released its lanes.
        grants: ``grants[r][i]`` is when request ``r`` was granted lane ``i``.
        start_order: request indices in the order they started (ties broken as the
            simulation processed them).
    """

    arrival: tuple[Fraction, ...]
    start: tuple[Fraction, ...]
    end: tuple[Fraction, ...]
    grants: tuple[tuple[Fraction, ...], ...]
    start_order: tuple[int, ...]

    @property
    def waits(self) -> tuple[Fraction, ...]:
        """Per request: start of work minus arrival."""
        return tuple(s - a for s, a in zip(self.start, self.arrival, strict=True))

    @property
    def makespan(self) -> Fraction:
        """From the first arrival to the last completion (0 for an empty schedule)."""
        if not self.arrival:
            return Fraction(0)
        return max(self.end) - min(self.arrival)


class _SimLane:
    """A FIFO hand-off lane: ``capacity`` permits per slot; slot = key or one shared slot."""

    __slots__ = ("capacity", "held", "per_key", "queues")

    def __init__(self, spec: LaneSpec) -> None:
        if spec.capacity < 1:
            raise ValueError(f"lane {spec.name!r}: capacity must be >= 1, got {spec.capacity}")
        self.capacity = spec.capacity
        self.per_key = spec.per_key
        self.held: dict[Hashable, int] = {}
        self.queues: dict[Hashable, deque[int]] = {}

    def ask(self, rid: int, key: Hashable) -> bool:
        """Grant at once (True) or queue ``rid`` at the tail (False)."""
        slot = key if self.per_key else None
        queue = self.queues.get(slot)
        held = self.held.get(slot, 0)
        if held < self.capacity and not queue:
            self.held[slot] = held + 1
            return True
        if queue is None:
            queue = self.queues[slot] = deque()
        queue.append(rid)
        return False

    def release(self, key: Hashable) -> int | None:
        """Release one permit: hand it to the queue's head (returned) or free it (None)."""
        slot = key if self.per_key else None
        queue = self.queues.get(slot)
        if queue:
            waiter = queue.popleft()
            if not queue:
                del self.queues[slot]
            return waiter  # hand-off: the permit count is unchanged
        held = self.held[slot] - 1
        if held:
            self.held[slot] = held
        else:
            del self.held[slot]
        return None


def _time_base(values: Sequence[Fraction]) -> int:
    """Least common denominator of ``values``: every value times it is an integer."""
    base = 1
    for v in values:
        base = base * v.denominator // math.gcd(base, v.denominator)
    return base


def _exact(value: Time, what: str) -> Fraction:
    if isinstance(value, float) and not math.isfinite(value):
        raise ValueError(f"{what} must be finite, got {value!r}")
    return Fraction(value)


def simulate(
    arrivals: Sequence[Time],
    keys: Sequence[Hashable],
    works: Sequence[Time],
    lanes: Sequence[LaneSpec],
) -> Schedule:
    """Simulate requests taking ``lanes`` in order with ``acquire_all`` semantics, exactly.

    Args:
        arrivals: arrival time of each request (any unit; the outputs use the same unit).
        keys: the session key of each request.
        works: how long each request works once it holds every lane (same unit, >= 0).
        lanes: the lanes, in acquisition order.

    Returns:
        The Schedule. Arrival order is by time, ties by position in ``arrivals``.
    """
    n = len(arrivals)
    if len(keys) != n or len(works) != n:
        raise ValueError("arrivals, keys and works must have the same length")
    arr_f = [_exact(a, "arrival") for a in arrivals]
    work_f = [_exact(w, "work") for w in works]
    if any(w < 0 for w in work_f):
        raise ValueError("work times must be >= 0")
    base = _time_base(arr_f + work_f)
    arr = [int(a * base) for a in arr_f]
    work = [int(w * base) for w in work_f]

    sim_lanes = [_SimLane(spec) for spec in lanes]
    n_lanes = len(sim_lanes)
    stage = [0] * n  # lanes held by each request
    grants: list[list[int]] = [[] for _ in range(n)]
    start = [0] * n
    end = [0] * n
    start_order: list[int] = []

    # (time, phase, seq, rid): phase 0 = completion (seq = start rank), 1 = arrival (seq = rid)
    events: list[tuple[int, int, int, int]] = [(arr[r], 1, r, r) for r in range(n)]
    heapq.heapify(events)

    def advance(rid: int, now: int) -> None:
        """``rid`` holds lanes[:stage[rid]]; ask for the next ones until blocked or done."""
        while stage[rid] < n_lanes:
            if not sim_lanes[stage[rid]].ask(rid, keys[rid]):
                return
            grants[rid].append(now)
            stage[rid] += 1
        start[rid] = now
        heapq.heappush(events, (now + work[rid], 0, len(start_order), rid))
        start_order.append(rid)

    while events:
        now, phase, _, rid = heapq.heappop(events)
        if phase == 1:
            advance(rid, now)
            continue
        end[rid] = now
        for lane in reversed(sim_lanes):
            waiter = lane.release(keys[rid])
            if waiter is not None:
                # The waiter asked for this lane, i.e. for lanes[stage[waiter]].
                grants[waiter].append(now)
                stage[waiter] += 1
                advance(waiter, now)

    def frac(t: int) -> Fraction:
        return Fraction(t, base)

    return Schedule(
        arrival=tuple(arr_f),
        start=tuple(frac(t) for t in start),
        end=tuple(frac(t) for t in end),
        grants=tuple(tuple(frac(t) for t in g) for g in grants),
        start_order=tuple(start_order),
    )
