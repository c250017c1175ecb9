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
floating-point noise. :func:`simulate_ticks` is the simulation itself on those integer times
(what :func:`simulate` runs): one pass over the arrivals in order, merged with a heap of
completions, O(n log n) for n requests; callers that already have integer times (the
capacity planner) call it directly and skip the Fractions.
"""

from __future__ import annotations

import heapq
import itertools
import math
import operator
from collections import deque
from collections.abc import Hashable, Sequence
from dataclasses import dataclass
from fractions import Fraction
from typing import TypeAlias

from lanequeue.replay.policy import LaneSpec

__all__ = ["Schedule", "TickSchedule", "simulate", "simulate_ticks"]

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

    def ask(self, rid: int, key: Hashable) -> int:
        """Grant at once (return the permits of the slot now held, >= 1) or queue ``rid``
        at the tail (return 0)."""
        slot = key if self.per_key else None
        queue = self.queues.get(slot)
        held = self.held.get(slot, 0)
        if held < self.capacity and not queue:
            held += 1
            self.held[slot] = held
            return held
        if queue is None:
            queue = self.queues[slot] = deque()
        queue.append(rid)
        return 0

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


@dataclass(frozen=True)
class TickSchedule:
    """A simulated schedule in integer ticks (the output of :func:`simulate_ticks`).

    Attributes:
        start: when each request held every lane and started work, ticks.
        end: when each request finished work and released its lanes, ticks.
        start_order: request indices in the order they started.
        peak_held: per lane, the most permits held at once (for the last lane: the most
            requests working at once).
        grants: ``grants[r][i]`` is when request ``r`` was granted lane ``i``; None when
            not recorded.
    """

    start: list[int]
    end: list[int]
    start_order: list[int]
    peak_held: tuple[int, ...]
    grants: list[list[int]] | None


def simulate_ticks(
    arrivals: Sequence[int],
    keys: Sequence[Hashable],
    works: Sequence[int],
    lanes: Sequence[LaneSpec],
    *,
    record_grants: bool = False,
) -> TickSchedule:
    """The simulation itself, on integer times (ticks): what :func:`simulate` runs.

    Same model and tie-breaking as :func:`simulate`, whose inputs it takes already scaled to
    integers; it skips the exact conversion to and from Fractions, so a caller that has
    integer times (the capacity planner, :mod:`lanequeue.replay.plan`) simulates far
    faster. Arrivals already in non-decreasing order are not sorted again. The replay's
    ``session`` policy (a per-key lane of one permit, then a shared lane) runs on a loop
    specialised to those two lanes; it takes the same decisions as the general loop, which
    runs every other list of lanes (a test checks that they agree).

    Args:
        arrivals: arrival time of each request, integer ticks.
        keys: the session key of each request.
        works: work time of each request once it holds every lane, integer ticks >= 0.
        lanes: the lanes, in acquisition order.
        record_grants: also record when each lane was granted (``TickSchedule.grants``).

    Returns:
        The TickSchedule.

    Raises:
        ValueError: the sequences differ in length, or a lane's capacity is < 1.

    Example::

        >>> from lanequeue.replay.policy import policy_lanes
        >>> lanes = policy_lanes("session", 1)
        >>> simulate_ticks([0, 0, 1], ["a", "b", "a"], [10, 10, 5], lanes).start
        [0, 10, 20]
    """
    return _simulate_ticks(arrivals, keys, works, lanes, record_grants=record_grants)


def _simulate_ticks(
    arrivals: Sequence[int],
    keys: Sequence[Hashable],
    works: Sequence[int],
    lanes: Sequence[LaneSpec],
    *,
    record_grants: bool = False,
    general: bool = False,
) -> TickSchedule:
    """:func:`simulate_ticks`; ``general`` forces the general loop (for tests)."""
    n = len(arrivals)
    if len(keys) != n or len(works) != n:
        raise ValueError("arrivals, keys and works must have the same length")
    sim_lanes = [_SimLane(spec) for spec in lanes]  # validates the capacities
    if n == 0:
        return TickSchedule([], [], [], (0,) * len(sim_lanes), [] if record_grants else None)
    # Arrival order: by time, ties by index (sorted() is stable).
    order: Sequence[int] = range(n)
    if not all(map(operator.le, arrivals, itertools.islice(arrivals, 1, None))):
        order = sorted(range(n), key=arrivals.__getitem__)
    if (
        not general
        and len(lanes) == 2
        and lanes[0].per_key
        and lanes[0].capacity == 1
        and not lanes[1].per_key
    ):
        return _session_then_global(arrivals, keys, works, order, lanes[1].capacity, record_grants)
    return _general(arrivals, keys, works, order, sim_lanes, record_grants)


def _session_then_global(
    arrivals: Sequence[int],
    keys: Sequence[Hashable],
    works: Sequence[int],
    order: Sequence[int],
    cap: int,
    record_grants: bool,
) -> TickSchedule:
    """The general loop specialised to [a per-key lane of 1 permit, a shared lane of
    ``cap``]: the same events in the same order, with the two lanes inlined."""
    n = len(arrivals)
    start = [0] * n
    end = [0] * n
    session_grant = [0] * n if record_grants else None
    start_order: list[int] = []
    started = start_order.append
    # A key present in ``owners`` holds its lane; its value is its line of waiters (None
    # while nobody waits).
    owners: dict[Hashable, deque[int] | None] = {}
    line: deque[int] = deque()  # the shared lane's line
    held = peak = 0
    done: list[int] = []  # completions, ``end * n + start rank`` (see _general)
    push = heapq.heappush
    pop = heapq.heappop
    i = rid = now = 0
    while True:
        # Completions first: those ending up to the next arrival's instant (included),
        # then, past the last arrival, all of them.
        limit: float = math.inf
        if i < n:
            rid = order[i]
            now = arrivals[rid]
            limit = (now + 1) * n
        while done and done[0] < limit:
            t, rank = divmod(pop(done), n)
            r = start_order[rank]
            end[r] = t
            # Release the shared lane: hand-off to the head of its line, or free a permit.
            if line:
                w = line.popleft()
                start[w] = t
                push(done, (t + works[w]) * n + len(start_order))
                started(w)
            else:
                held -= 1
            # Release the key's lane: hand-off to its next waiter, who asks for the shared
            # lane at once; or free it.
            k = keys[r]
            waiting = owners[k]
            if waiting:
                w = waiting.popleft()
                if not waiting:
                    owners[k] = None
                if session_grant is not None:
                    session_grant[w] = t
                if held < cap and not line:
                    held += 1
                    if held > peak:
                        peak = held
                    start[w] = t
                    push(done, (t + works[w]) * n + len(start_order))
                    started(w)
                else:
                    line.append(w)
            else:
                del owners[k]
        if i >= n:
            break
        i += 1
        # The arrival asks for its key's lane, then (granted) for the shared lane.
        k = keys[rid]
        if k in owners:
            waiting = owners[k]
            if waiting is None:
                owners[k] = deque((rid,))
            else:
                waiting.append(rid)
            continue
        owners[k] = None
        if session_grant is not None:
            session_grant[rid] = now
        if held < cap and not line:
            held += 1
            if held > peak:
                peak = held
            start[rid] = now
            push(done, (now + works[rid]) * n + len(start_order))
            started(rid)
        else:
            line.append(rid)
    grants = (
        None
        if session_grant is None
        else [[g, s] for g, s in zip(session_grant, start, strict=True)]
    )
    return TickSchedule(start, end, start_order, (1, peak), grants)


def _general(
    arrivals: Sequence[int],
    keys: Sequence[Hashable],
    works: Sequence[int],
    order: Sequence[int],
    sim_lanes: list[_SimLane],
    record_grants: bool,
) -> TickSchedule:
    n = len(arrivals)
    n_lanes = len(sim_lanes)
    stage = [0] * n  # lanes held by each request
    grants: list[list[int]] | None = [[] for _ in range(n)] if record_grants else None
    start = [0] * n
    end = [0] * n
    start_order: list[int] = []
    peak = [0] * n_lanes

    # Completions wait in a heap of single integers ``end * n + rank``, rank = the start
    # rank (``start_order`` position): ordered by end time, ties by start rank.
    done: list[int] = []
    push = heapq.heappush
    pop = heapq.heappop

    def advance(rid: int, now: int) -> None:
        """``rid`` holds lanes[:stage[rid]]; ask for the next ones until blocked or done."""
        i = stage[rid]
        key = keys[rid]
        while i < n_lanes:
            held = sim_lanes[i].ask(rid, key)
            if not held:
                stage[rid] = i
                return
            if held > peak[i]:
                peak[i] = held
            if grants is not None:
                grants[rid].append(now)
            i += 1
        stage[rid] = i
        start[rid] = now
        push(done, (now + works[rid]) * n + len(start_order))
        start_order.append(rid)

    def complete(code: int) -> None:
        now, rank = divmod(code, n)
        rid = start_order[rank]
        end[rid] = now
        key = keys[rid]
        for lane in reversed(sim_lanes):
            waiter = lane.release(key)
            if waiter is not None:
                # The waiter asked for this lane, i.e. for lanes[stage[waiter]].
                if grants is not None:
                    grants[waiter].append(now)
                stage[waiter] += 1
                advance(waiter, now)

    # Merge the arrivals (in order) with the completions: at one instant completions come
    # first, including those of zero-work requests started at that instant.
    for rid in order:
        now = arrivals[rid]
        while done and done[0] < (now + 1) * n:  # end <= now
            complete(pop(done))
        advance(rid, now)
    while done:
        complete(pop(done))
    return TickSchedule(start, end, start_order, tuple(peak), grants)


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

    Raises:
        ValueError: the sequences differ in length, a time is not finite, a work time is
            negative, or a lane's capacity is < 1.
    """
    n = len(arrivals)
    if len(keys) != n or len(works) != n:
        raise ValueError("arrivals, keys and works must have the same length")
    arr_f = [_exact(a, "arrival") for a in arrivals]
    work_f = [_exact(w, "work") for w in works]
    if any(w < 0 for w in work_f):
        raise ValueError("work times must be >= 0")
    base = _time_base(arr_f + work_f)
    ticks = simulate_ticks(
        [int(a * base) for a in arr_f],
        keys,
        [int(w * base) for w in work_f],
        lanes,
        record_grants=True,
    )
    assert ticks.grants is not None

    def frac(t: int) -> Fraction:
        return Fraction(t, base)

    return Schedule(
        arrival=tuple(arr_f),
        start=tuple(frac(t) for t in ticks.start),
        end=tuple(frac(t) for t in ticks.end),
        grants=tuple(tuple(frac(t) for t in g) for g in ticks.grants),
        start_order=tuple(ticks.start_order),
    )
