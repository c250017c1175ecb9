"""Capacity planning from a trace: the smallest global cap that meets a wait goal.

``lanequeue plan`` answers "how many model calls may run at once so that 99% of requests
wait less than S seconds" from the operator's own traffic. The policy is the replay's
``session`` policy: each request takes its conversation's SessionLane, then one global Lane
of ``cap`` permits (``acquire_all``), works for its service time, and releases. For each
cap tried, the exact discrete-event simulation of the replay
(:func:`lanequeue.replay.simulate.simulate_ticks`) gives every request's wait (start of
work minus arrival); the goal is ``p99 <= S`` (the percentile interpolated linearly
between closest ranks, as everywhere in the replay, computed exactly) and, when given,
``max <= M``.

Times are simulated in whole microseconds (``TICKS_PER_S``): the trace's arrivals and
service times are read to the microsecond, and a work time from tokens is ``output_tokens
* tpot_ms`` rounded to the microsecond.

The search
==========
Waits are not monotone in the cap (a request holds its conversation's lane while it waits
for the global one, and that can reorder the global line), so a binary search could skip
the answer. The planner scans the caps upwards and recommends the first one that meets the
goal; every smaller cap in the searched range is shown to miss it, either by its own
simulation or by bound (2) below. Caps are skipped only where one of these proven bounds
allows it:

(1) Saturation. Let ``P`` be the most requests working at once in the simulation with an
unlimited global lane (a cap of ``n``, the number of requests, never queues anyone). Every
cap ``c >= P`` gives exactly that schedule. Proof: run the simulations for ``c`` and for
``n`` side by side; they process the same events in the same order as long as every
request that asks for the global lane is answered alike. In the unlimited run nobody ever
queues on the global lane, and just before any grant fewer than ``P`` requests hold it
(after the grant at most ``P`` do). If the two runs agree up to that ask, the run with cap
``c`` also has an empty global line and fewer than ``P <= c`` holders, so it grants too; by
induction over the events the schedules are identical. So nothing above ``P`` needs
simulating, and ``P`` is where waits stop improving: from there on no request ever waits for
the global lane, only for its own conversation (at ``P - 1`` the ask that made ``P`` in the
unlimited run finds the lane full and queues).

    The unlimited run is also a floor for every request at every cap: there, request ``r``
    starts at ``max(arrival_r, end of its conversation's previous request)``; at any cap
    the session lane (FIFO per key, held until the end of work) makes ``r`` start no earlier
    than that, and by induction along the conversation that previous end is no earlier
    either. So if the unlimited run misses the goal, every cap misses it: no cap is
    feasible, and the requests whose floor wait exceeds the goal's threshold (``S``, or
    ``M`` if smaller) wait too long at every cap.

(2) Load. Take a set ``Q`` of requests all arriving within ``[t1, t2]``, with total work
``V`` and largest work ``w``, and a wait threshold ``T`` (whole ticks: starts are whole
ticks, so ``floor(T)`` may be used). At cap ``c``, the requests of ``Q`` that wait at most
``T`` start within ``[t1, t2 + T]`` and finish by ``t2 + T + w``; at most ``c`` requests
work at any instant, so their total work is at most ``c * (t2 - t1 + T + w)``. Hence the
requests of ``Q`` that wait more than ``T`` carry at least ``D = V - c * (t2 - t1 + T + w)``
of work, and there are at least ``k``, the least number of ``Q``'s largest works that sum
to ``D`` or more (0 when ``D <= 0``). Summed over disjoint sets (the requests arriving in
each window of a grid of equal windows, for several window lengths) this counts requests
that certainly wait more than ``T``. The exact p99 exceeds ``S`` as soon as at least
``n - floor((n - 1) * 99 / 100)`` waits exceed ``S`` (then the sorted wait at the lower
closest rank already does, and the interpolated value is no smaller); the max exceeds
``M`` as soon as one wait does. The count never grows with ``c``, so the caps it proves to
miss are ``1 .. L - 1`` for some ``L``: the scan starts at ``L``. By default
(``bound=None``) it is used only when it saves at least ``BOUND_MIN_SAVING``
request-simulations, so a small trace's table shows every cap from the first one searched.

The caps that remain (from ``max(L, min_global)`` up to ``min(P, max_global)``) are
simulated in order, on several processes for a large trace (each process simulates whole
caps; the result is the same as a serial scan).

Example::

    from lanequeue.replay import read_trace
    from lanequeue.replay.plan import PlanGoal, plan_capacity

    plan = plan_capacity(read_trace(), PlanGoal(p99_wait_s=2))
    print(plan.text())
    print(plan.recommended_global)
"""

from __future__ import annotations

import bisect
import itertools
import json
import math
import os
import time
from collections.abc import Sequence
from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, wait
from dataclasses import dataclass, field
from fractions import Fraction
from pathlib import Path
from typing import Any

from lanequeue._errors import counted
from lanequeue.replay._checks import (
    MAX_PROCESSES,
    above_setting,
    check_count,
    check_seconds,
    check_speed,
    check_tpot_ms,
)
from lanequeue.replay._figures import against, exact, exact_text
from lanequeue.replay.policy import policy_lanes
from lanequeue.replay.simulate import simulate_ticks
from lanequeue.replay.trace import (
    DEFAULT_TPOT_MS,
    MAX_SOURCE_CHARS,
    Trace,
    printable,
    service_times_us,
)

__all__ = [
    "DEFAULT_TPOT_MS",
    "TICKS_PER_S",
    "CapRow",
    "CapacityPlan",
    "FloorOffender",
    "PlanGoal",
    "PlanInputs",
    "Verification",
    "check_plan_arguments",
    "exact_percentile",
    "plan_capacity",
    "plan_inputs",
    "verify_plan",
    "write_plan_plot",
]

#: Simulation ticks per second: times are simulated in whole microseconds.
TICKS_PER_S = 1_000_000
#: A trace at least this long is scanned on several processes (when there are cores).
PARALLEL_MIN_REQUESTS = 50_000
#: ``bound=None`` uses the load bound when it saves at least this many request-simulations.
BOUND_MIN_SAVING = 100_000
#: The most floor offenders kept (the conversations with the longest floor waits).
MAX_OFFENDERS = 50


@dataclass(frozen=True)
class PlanGoal:
    """What the waits must meet.

    Attributes:
        p99_wait_s: the 99th percentile of the waits must be at most this, seconds (0 to
            1e9; an int, float or Fraction, kept exact).
        max_wait_s: when not None, every wait must be at most this, seconds (0 to 1e9).

    A goal above 1e9 s (about 31 years) is refused rather than read as "no goal": no wait
    of a trace comes near it, and the goal must stay a finite float in the ``--json``
    document.

    Raises:
        TypeError: a value that is not a number.
        ValueError: a negative, NaN, infinite or larger value
            (:class:`~lanequeue.replay._checks.SettingError` naming the attribute).

    Example::

        >>> PlanGoal(2, max_wait_s=30).describe()
        'p99 wait <= 2 s and max wait <= 30 s'
    """

    p99_wait_s: float | Fraction
    max_wait_s: float | Fraction | None = None

    def __post_init__(self) -> None:
        check_seconds(self.p99_wait_s, "p99_wait_s")
        if self.max_wait_s is not None:
            check_seconds(self.max_wait_s, "max_wait_s")

    @property
    def threshold_s(self) -> Fraction:
        """The wait above which a single request is over the goal: ``min(S, M)``."""
        s = Fraction(self.p99_wait_s)
        return s if self.max_wait_s is None else min(s, Fraction(self.max_wait_s))

    def to_dict(self) -> dict[str, float | None]:
        """``{"p99_wait_s": S, "max_wait_s": M or None}``, as floats."""
        return {
            "p99_wait_s": float(self.p99_wait_s),
            "max_wait_s": None if self.max_wait_s is None else float(self.max_wait_s),
        }

    def describe(self) -> str:
        """E.g. ``"p99 wait <= 2 s and max wait <= 10 s"``: the goal as it was given,
        never rounded (``--p99-wait-s 1.0000001`` is not shown as ``1``)."""
        text = f"p99 wait <= {exact_text(self.p99_wait_s)} s"
        if self.max_wait_s is not None:
            text += f" and max wait <= {exact_text(self.max_wait_s)} s"
        return text


@dataclass(frozen=True)
class PlanInputs:
    """A trace as the planner simulates it, in ticks (microseconds), in arrival order.

    Attributes:
        arrival: arrival of each request, ticks after the first arrival.
        keys: the conversation id of each request.
        work: service time of each request, ticks.
        labels: the conversation's name for each conversation id (its generic ``key``).
        tpot_ms: the work per output token used, or None when no request needed it.
    """

    arrival: list[int]
    keys: list[int]
    work: list[int]
    labels: dict[int, str]
    tpot_ms: float | None


def plan_inputs(trace: Trace, tpot_ms: float | None = None) -> PlanInputs:
    """The planner's inputs from ``trace``: arrival and service times in microseconds.

    A request's service time is its ``duration_s`` (generic format), else
    ``output_tokens * tpot_ms`` rounded to the microsecond
    (:func:`~lanequeue.replay.trace.service_times_us`, as ``lanequeue replay``).

    Args:
        trace: the requests (any format :func:`~lanequeue.replay.read_trace` reads).
        tpot_ms: milliseconds of work per output token (0 to 60,000). None: 30 for a
            Mooncake trace; a generic trace whose lines give ``output_tokens`` must name it.

    Raises:
        TypeError: ``tpot_ms`` not a number.
        ValueError: ``tpot_ms`` out of range (NaN and infinities included), or missing
            where it is needed.
    """
    work, used = service_times_us(trace, tpot_ms)
    reqs = trace.requests
    # Whole microseconds: exact for integer milliseconds, and for a generic trace's
    # microseconds (kept as milliseconds with three decimals, which round back exactly).
    arrival = [round(r.timestamp_ms * 1000) for r in reqs]
    if arrival and arrival[0]:
        t0 = arrival[0]
        arrival = [a - t0 for a in arrival]
    labels = {r.conversation: r.label for r in reqs}
    return PlanInputs(arrival, [r.conversation for r in reqs], work, labels, used)


def exact_percentile(sorted_values: Sequence[int], q: int) -> Fraction:
    """The ``q``-th percentile (integer 0..100) of ``sorted_values`` (ascending), exactly:
    linear interpolation between closest ranks, as :func:`lanequeue.replay.percentile`.

    Raises:
        ValueError: no values, or ``q`` outside 0..100.
    """
    if not sorted_values:
        raise ValueError("no values")
    if not 0 <= q <= 100:
        raise ValueError(f"q must be within 0..100, got {q}")
    lo, rem = divmod((len(sorted_values) - 1) * q, 100)
    low = sorted_values[lo]
    if not rem:
        return Fraction(low)
    return low + (sorted_values[lo + 1] - low) * Fraction(rem, 100)


def _p99_need(n: int) -> int:
    """Waits over S that prove the exact p99 is over S (see the module docstring)."""
    return n - (n - 1) * 99 // 100


@dataclass(frozen=True)
class CapRow:
    """The simulated figures of one global cap. Seconds are trace seconds.

    Attributes:
        global_cap: the cap.
        wait_p50_s / wait_p95_s / wait_p99_s / wait_max_s: the waits' percentiles, seconds.
        throughput_rps: requests per second from the first arrival to the last completion
            (None when that span is 0).
        utilisation_mean: total work / (cap * that span), 0..1 (None when the span is 0).
        utilisation_peak: most requests working at once / cap, 0..1.
        meets: whether the waits meet the goal (computed exactly, not from the floats).
        over_threshold: requests waiting more than the goal's threshold (``min(S, M)``).
    """

    global_cap: int
    wait_p50_s: float
    wait_p95_s: float
    wait_p99_s: float
    wait_max_s: float
    throughput_rps: float | None
    utilisation_mean: float | None
    utilisation_peak: float
    meets: bool
    over_threshold: int

    def to_dict(self) -> dict[str, Any]:
        """The row of the ``--json`` table."""
        return {
            "global": self.global_cap,
            "wait_p50_s": self.wait_p50_s,
            "wait_p95_s": self.wait_p95_s,
            "wait_p99_s": self.wait_p99_s,
            "wait_max_s": self.wait_max_s,
            "throughput_rps": self.throughput_rps,
            "utilisation_mean": self.utilisation_mean,
            "utilisation_peak": self.utilisation_peak,
        }


@dataclass(frozen=True)
class _GoalTicks:
    p99: Fraction
    max: Fraction | None
    threshold: Fraction

    @classmethod
    def of(cls, goal: PlanGoal) -> _GoalTicks:
        return cls(
            Fraction(goal.p99_wait_s) * TICKS_PER_S,
            None if goal.max_wait_s is None else Fraction(goal.max_wait_s) * TICKS_PER_S,
            goal.threshold_s * TICKS_PER_S,
        )


def _row(
    inputs: PlanInputs,
    cap: int,
    start: Sequence[int],
    end: Sequence[int],
    peak: int,
    goal: _GoalTicks,
) -> tuple[CapRow, list[int]]:
    """The figures of one simulated schedule (and its waits, in request order)."""
    arrival = inputs.arrival
    waits = [s - a for s, a in zip(start, arrival, strict=True)]
    # Waits are >= 0 and mostly 0 near a good cap: sort only the others.
    others = sorted(filter(None, waits))
    ordered = [0] * (len(waits) - len(others)) + others
    p99 = exact_percentile(ordered, 99)
    top = ordered[-1]
    meets = p99 <= goal.p99 and (goal.max is None or top <= goal.max)
    over = len(ordered) - bisect.bisect_right(ordered, math.floor(goal.threshold))
    span = max(end) - arrival[0]
    total_work = sum(inputs.work)
    row = CapRow(
        global_cap=cap,
        wait_p50_s=float(exact_percentile(ordered, 50) / TICKS_PER_S),
        wait_p95_s=float(exact_percentile(ordered, 95) / TICKS_PER_S),
        wait_p99_s=float(p99 / TICKS_PER_S),
        wait_max_s=top / TICKS_PER_S,
        throughput_rps=len(waits) * TICKS_PER_S / span if span > 0 else None,
        utilisation_mean=total_work / (cap * span) if span > 0 else None,
        utilisation_peak=peak / cap,
        meets=meets,
        over_threshold=over,
    )
    return row, waits


def _simulate_cap(inputs: PlanInputs, cap: int, goal: _GoalTicks) -> CapRow:
    sched = simulate_ticks(inputs.arrival, inputs.keys, inputs.work, policy_lanes("session", cap))
    return _row(inputs, cap, sched.start, sched.end, sched.peak_held[-1], goal)[0]


# Worker processes keep the inputs they were started with.
_worker_state: tuple[PlanInputs, _GoalTicks] | None = None


def _worker_init(inputs: PlanInputs, goal: _GoalTicks) -> None:
    global _worker_state
    _worker_state = (inputs, goal)


def _worker_cap(cap: int) -> CapRow:
    assert _worker_state is not None
    return _simulate_cap(_worker_state[0], cap, _worker_state[1])


def _load_bound(inputs: PlanInputs, goal: _GoalTicks, lo: int, hi: int) -> tuple[int, str]:
    """The least cap ``L`` in ``lo .. hi + 1`` such that bound (2) of the module docstring
    proves every cap in ``lo .. L - 1`` misses the goal; with a one-line reason."""
    arrival, work = inputs.arrival, inputs.work
    n = len(arrival)
    if n == 0 or lo > hi:
        return lo, ""
    need = _p99_need(n)
    thr_s = math.floor(goal.p99)
    thr_m = None if goal.max is None else math.floor(goal.max)
    horizon = arrival[-1] - arrival[0] + 1
    best, best_reason = lo, ""
    length = horizon
    min_length = max(1, min(horizon, sorted(work)[n // 2] if n else 1))
    while length >= min_length:
        # The windows of this length: per window (span, largest work, prefix sums of the
        # works in descending order).
        windows: list[tuple[int, int, list[int]]] = []
        i = 0
        while i < n:
            edge = arrival[0] + ((arrival[i] - arrival[0]) // length + 1) * length
            j = bisect.bisect_left(arrival, edge, i)
            chunk = sorted(work[i:j], reverse=True)
            windows.append(
                (arrival[j - 1] - arrival[i], chunk[0], [0, *itertools.accumulate(chunk)])
            )
            i = j

        def count(cap: int, thr: int, windows: list[tuple[int, int, list[int]]] = windows) -> int:
            total = 0
            for span, wmax, prefix in windows:
                deficit = prefix[-1] - cap * (span + thr + wmax)
                if deficit > 0:
                    total += bisect.bisect_left(prefix, deficit)
            return total

        def misses(cap: int) -> bool:
            if count(cap, thr_s) >= need:
                return True
            return thr_m is not None and count(cap, thr_m) >= 1

        # Largest cap in best..hi proven to miss (the proof is monotone in the cap).
        if misses(best):
            a, b = best, hi + 1  # misses(a) holds; b: past the range
            while b - a > 1:
                mid = (a + b) // 2
                if misses(mid):
                    a = mid
                else:
                    b = mid
            best = a + 1
            best_reason = (
                f"work arriving in windows of {length / TICKS_PER_S:.4g} s exceeds what "
                f"{a} slots can serve within the goal"
            )
        length //= 2
    return best, best_reason


@dataclass(frozen=True)
class FloorOffender:
    """A conversation with requests over the goal at every cap (serialisation floor).

    Attributes:
        key: the conversation (generic ``key``, or the Mooncake conversation id).
        requests: its requests whose floor wait exceeds the goal's threshold.
        worst_wait_s: its longest floor wait, seconds.
    """

    key: str
    requests: int
    worst_wait_s: float


@dataclass(frozen=True)
class CapacityPlan:
    """The outcome of :func:`plan_capacity`.

    Attributes:
        source: where the trace came from.
        requests / conversations / skipped_lines: of the trace.
        tpot_ms: the work per output token used (None: every request gave a duration).
        goal: the goal.
        min_global / max_global: the searched range (``max_global`` None: unbounded).
        table: the simulated caps, ascending (the saturation cap ``P`` is always there).
        recommended_global: the smallest cap in the range whose waits meet the goal, every
            smaller cap in the range missing it; None when no cap in the range does.
        saturation_global: ``P``, the cap from which waits stop improving (bound (1)).
        proven_below: caps ``min_global .. proven_below - 1`` were proven to miss by the
            load bound (2) without simulating them (``proven_below == min_global``: none).
        bound_reason: how the load bound proved them (empty when it did not).
        floor_meets: whether the unlimited schedule meets the goal (False: no cap does).
        floor_offenders: when it does not, the conversations with requests over the goal
            at every cap, longest floor wait first (at most ``MAX_OFFENDERS``).
        floor_offending_conversations: how many conversations that is in all.
        floor_offending_requests: how many requests wait over the goal at every cap.
        simulations: simulations run (each over the whole trace).
        elapsed_s: wall-clock seconds of the planning.
        jobs: processes used for the scan.
        row_by_cap: the rows of ``table`` by cap.
    """

    source: str
    requests: int
    conversations: int
    skipped_lines: int
    tpot_ms: float | None
    goal: PlanGoal
    min_global: int
    max_global: int | None
    table: tuple[CapRow, ...]
    recommended_global: int | None
    saturation_global: int
    proven_below: int
    bound_reason: str
    floor_meets: bool
    floor_offenders: tuple[FloorOffender, ...] = ()
    floor_offending_conversations: int = 0
    floor_offending_requests: int = 0
    simulations: int = 0
    elapsed_s: float = 0.0
    jobs: int = 1
    row_by_cap: dict[int, CapRow] = field(default_factory=dict, repr=False, compare=False)

    def to_dict(self) -> dict[str, Any]:
        """The ``--json`` document: ``{"recommended_global", "goal", "table"}``."""
        return {
            "recommended_global": self.recommended_global,
            "goal": self.goal.to_dict(),
            "table": [row.to_dict() for row in self.table],
        }

    def write_json(self, path: str | Path) -> None:
        """Write :meth:`to_dict` to ``path`` as indented JSON (UTF-8)."""
        Path(path).write_text(json.dumps(self.to_dict(), indent=2) + "\n", encoding="utf-8")

    def text(self) -> str:
        """The human-readable plan: the table, the recommendation, the saturation cap."""

        def num(x: float | None, digits: int = 3) -> str:
            return "n/a" if x is None else f"{x:.{digits}f}"

        work = (
            "service times from the trace"
            if self.tpot_ms is None
            else f"{exact_text(self.tpot_ms)} ms per output token"
        )
        lines = [
            f"lanequeue plan: {printable(self.source, MAX_SOURCE_CHARS)}",
            f"{counted(self.requests, 'request')}, "
            f"{counted(self.conversations, 'conversation')}; policy session (one lane per "
            f"conversation, then the global lane); {work}",
            f"goal: {self.goal.describe()}",
            "",
        ]
        head = (
            "global",
            "p50_s",
            "p95_s",
            "p99_s",
            "max_s",
            "req/s",
            "util_mean",
            "util_peak",
            "goal",
        )
        rows: list[tuple[str, ...]] = []
        if self.proven_below > self.min_global:
            first, last = self.min_global, self.proven_below - 1
            rows.append(
                (
                    f"{first}-{last}" if last > first else str(first),
                    "",
                    "",
                    "",
                    "",
                    "",
                    "",
                    "",
                    "miss (bound)",
                )
            )
        for r in self.table:
            tag = "meets" if r.meets else "miss"
            if r.global_cap == self.recommended_global:
                tag = "MEETS <- recommended"
            if r.global_cap == self.saturation_global:
                tag += " (saturation)"
            rows.append(
                (
                    str(r.global_cap),
                    num(r.wait_p50_s),
                    num(r.wait_p95_s),
                    against(r.wait_p99_s, self.goal.p99_wait_s, 3),
                    against(r.wait_max_s, self.goal.max_wait_s, 3),
                    num(r.throughput_rps, 2),
                    num(r.utilisation_mean),
                    num(r.utilisation_peak),
                    tag,
                )
            )
        widths = [max(len(h), *(len(row[i]) for row in rows)) for i, h in enumerate(head)]

        def fmt(cells: Sequence[str]) -> str:
            parts = [cells[0].rjust(widths[0])]
            parts += [c.rjust(w) for c, w in zip(cells[1:-1], widths[1:-1], strict=True)]
            parts.append(cells[-1])
            return "  ".join(parts).rstrip()

        lines.append(fmt(head))
        lines.append(fmt(["-" * w for w in widths]))
        lines += [fmt(row) for row in rows]
        lines.append("")
        if self.proven_below > self.min_global:
            lines.append(
                f"caps {self.min_global}-{self.proven_below - 1} miss by the load bound: "
                f"{self.bound_reason}."
            )
        rec, low, sat = self.recommended_global, self.min_global, self.saturation_global
        not_searched = "" if low == 1 else f"; caps below {low} were not searched"
        if rec is not None:
            if rec == low:
                why = (
                    "the smallest cap meets the goal"
                    if low == 1
                    else f"the smallest cap searched meets the goal{not_searched}"
                )
            else:
                smaller = (
                    f"cap {low} misses"
                    if rec - 1 == low
                    else f"every cap in {low}-{rec - 1} misses"
                )
                why = f"the smallest cap that meets the goal; {smaller} it{not_searched}"
            lines.append(f"recommended global cap: {rec} ({why})")
        elif self.floor_meets:
            assert self.max_global is not None  # else the saturation cap is recommended
            top = self.max_global
            rng = str(low) if top == low else f"{low}-{top}"
            if top == sat - 1:
                known = (
                    f"cap {sat} is the smallest that meets it (from {sat} on, every cap "
                    "does)"
                )
            else:
                gap = (
                    f"cap {top + 1} was"
                    if top + 1 == sat - 1
                    else f"caps {top + 1}-{sat - 1} were"
                )
                known = (
                    f"every cap from {sat} on meets it; {gap} not simulated, so the "
                    "smallest that does is not known (raise --max-global to find it)"
                )
            lines.append(f"no cap in {rng} meets the goal: {known}")
        else:
            lines.append(
                "no cap meets the goal: even with no global limit, the waits behind each "
                "conversation's own earlier requests miss it"
            )
            lines.append(
                f"{counted(self.floor_offending_requests, 'request')} of "
                f"{counted(self.floor_offending_conversations, 'conversation')} "
                f"{'waits' if self.floor_offending_requests == 1 else 'wait'} more than "
                f"{exact_text(self.goal.threshold_s)} s at every cap; the longest:"
            )
            for o in self.floor_offenders[:20]:
                lines.append(
                    f"  conversation {printable(o.key)}: {counted(o.requests, 'request')} over, "
                    f"longest wait {against(o.worst_wait_s, self.goal.threshold_s, 3)} s"
                )
            more = self.floor_offending_conversations - min(20, len(self.floor_offenders))
            if more > 0:
                lines.append(f"  ... and {counted(more, 'more conversation')}")
        lines.append(
            f"waits stop improving at global cap {self.saturation_global}: from there on no "
            "request waits for the global lane, only for its own conversation's earlier "
            "requests"
        )
        lines.append(
            f"{counted(self.simulations, 'simulation')} of {counted(self.requests, 'request')} in "
            f"{self.elapsed_s:.2f} s ({self.jobs} process{'es' if self.jobs > 1 else ''})"
        )
        return "\n".join(lines)


def _usable_cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def _scan(
    inputs: PlanInputs, goal: _GoalTicks, caps: range, jobs: int
) -> tuple[dict[int, CapRow], int | None]:
    """Simulate ``caps`` in order until one meets the goal; every cap before it is
    simulated too. Returns the rows and the first meeting cap (None: none did)."""
    rows: dict[int, CapRow] = {}
    if jobs <= 1 or len(caps) <= 1:
        for cap in caps:
            rows[cap] = _simulate_cap(inputs, cap, goal)
            if rows[cap].meets:
                return rows, cap
        return rows, None
    found: int | None = None
    with ProcessPoolExecutor(
        max_workers=min(jobs, len(caps)), initializer=_worker_init, initargs=(inputs, goal)
    ) as pool:
        todo = iter(caps)
        running: dict[Future[CapRow], int] = {}

        def submit() -> None:
            cap = next(todo, None)
            if cap is not None and (found is None or cap < found):
                running[pool.submit(_worker_cap, cap)] = cap

        for _ in range(min(jobs, len(caps))):
            submit()
        while running:
            done, _ = wait(running, return_when=FIRST_COMPLETED)
            for fut in done:
                cap = running.pop(fut)
                rows[cap] = fut.result()
                if rows[cap].meets and (found is None or cap < found):
                    found = cap
                submit()
    if found is not None:
        rows = {c: r for c, r in rows.items() if c <= found}
    return rows, found


def check_plan_arguments(
    *,
    tpot_ms: float | None = None,
    min_global: int = 1,
    max_global: int | None = None,
    jobs: int | None = None,
    speed: float | None = None,
) -> None:
    """Check the settings of :func:`plan_capacity` (and ``speed``, of :func:`verify_plan`)
    before any work: the one place they are checked (``lanequeue plan`` calls it first).

    Ranges: ``tpot_ms`` None or 0 to 60,000 ms; ``min_global`` and ``max_global`` integers
    from 1 to 10**9 (``max_global`` None: no limit), ``min_global <= max_global``;
    ``jobs`` None or 1 to 1024; ``speed`` None or 1e-6 to 1e6.

    Raises:
        TypeError: a setting of the wrong type.
        ValueError: a setting out of range, NaN and infinities included
            (:class:`~lanequeue.replay._checks.SettingError` naming it), or
            ``min_global > max_global``.
    """
    check_tpot_ms(tpot_ms)
    check_count(min_global, "min_global")
    if max_global is not None:
        check_count(max_global, "max_global")
        if min_global > max_global:
            raise above_setting("min_global", min_global, "max_global", max_global)
    if jobs is not None:
        check_count(jobs, "jobs", maximum=MAX_PROCESSES)
    if speed is not None:
        check_speed(speed)


def plan_capacity(
    trace: Trace,
    goal: PlanGoal,
    *,
    tpot_ms: float | None = None,
    min_global: int = 1,
    max_global: int | None = None,
    jobs: int | None = None,
    bound: bool | None = None,
) -> CapacityPlan:
    """Find the smallest global cap whose simulated waits meet ``goal`` (module docstring).

    Args:
        trace: the requests.
        goal: the wait goal.
        tpot_ms: work per output token, milliseconds (see :func:`plan_inputs`).
        min_global / max_global: search caps in ``min_global .. max_global`` only
            (``max_global`` None: no upper limit; caps above the saturation cap all behave
            alike, so the search ends there).
        jobs: processes for the scan; None: the usable cores for a trace of at least
            ``PARALLEL_MIN_REQUESTS`` requests, else 1.
        bound: skip the caps that the load bound proves to miss: True always, False never,
            None when that saves at least ``BOUND_MIN_SAVING`` request-simulations.

    Returns:
        The CapacityPlan. Its ``recommended_global`` is None when no cap in the range meets
        the goal (``floor_meets`` False: none at all; the offenders list why).

    Raises:
        TypeError: ``goal`` is not a PlanGoal, or a cap is not an integer.
        ValueError: no requests, a setting out of range (:func:`check_plan_arguments`),
            or ``tpot_ms`` missing where the trace needs it (see :func:`plan_inputs`).

    Thread safety: pure computation over its arguments; safe to call from several threads.

    Example::

        >>> from lanequeue.replay import parse_trace_lines
        >>> trace = parse_trace_lines(
        ...     ["timestamp,key,duration_s", "0,a,10", "0,b,10", "0,c,10", "1,a,5"],
        ...     trace_format="auto",
        ... )
        >>> plan = plan_capacity(trace, PlanGoal(10))
        >>> plan.recommended_global, plan.saturation_global
        (2, 3)
    """
    started = time.perf_counter()
    if not isinstance(goal, PlanGoal):
        raise TypeError(f"goal must be a PlanGoal, got {goal!r}")
    check_plan_arguments(tpot_ms=tpot_ms, min_global=min_global, max_global=max_global, jobs=jobs)
    if not trace.requests:
        raise ValueError(f"no valid request to plan with in {trace.source}")
    inputs = plan_inputs(trace, tpot_ms)
    n = len(inputs.arrival)
    g = _GoalTicks.of(goal)
    if jobs is None:
        jobs = _usable_cores() if n >= PARALLEL_MIN_REQUESTS else 1

    # Bound (1): the unlimited schedule, its peak P and its floor waits.
    free = simulate_ticks(inputs.arrival, inputs.keys, inputs.work, policy_lanes("session", n))
    saturation = max(1, free.peak_held[-1])
    floor_row, floor_waits = _row(inputs, saturation, free.start, free.end, saturation, g)
    simulations = 1
    rows: dict[int, CapRow] = {saturation: floor_row}
    recommended: int | None = None
    proven_below, reason = min_global, ""
    offenders: list[FloorOffender] = []
    n_conv_over = n_req_over = 0
    if not floor_row.meets:
        threshold = g.threshold
        worst: dict[int, tuple[int, int]] = {}
        for key, w in zip(inputs.keys, floor_waits, strict=True):
            if w > threshold:
                count, top = worst.get(key, (0, 0))
                worst[key] = (count + 1, max(top, w))
        n_conv_over = len(worst)
        n_req_over = sum(c for c, _ in worst.values())
        ranked = sorted(worst.items(), key=lambda kv: (-kv[1][1], kv[0]))[:MAX_OFFENDERS]
        offenders = [
            FloorOffender(inputs.labels[k], c, top / TICKS_PER_S) for k, (c, top) in ranked
        ]
    elif min_global >= saturation:
        # Every cap from saturation on gives the unlimited schedule (bound (1)).
        recommended = min_global
        if min_global != saturation:
            rows[min_global] = _row(inputs, min_global, free.start, free.end, saturation, g)[0]
    else:
        hi = saturation - 1 if max_global is None else min(saturation - 1, max_global)
        lo = min_global
        if bound is not False and lo <= hi:
            proven, why = _load_bound(inputs, g, lo, hi)
            if bound or (proven - lo) * n >= BOUND_MIN_SAVING:
                proven_below, reason, lo = proven, why, proven
        scanned, recommended = _scan(inputs, g, range(lo, hi + 1), jobs)
        simulations += len(scanned)
        rows.update(scanned)
        if recommended is None and (max_global is None or max_global >= saturation):
            recommended = saturation
    return CapacityPlan(
        source=trace.source,
        requests=n,
        conversations=trace.conversations,
        skipped_lines=len(trace.skipped),
        tpot_ms=inputs.tpot_ms,
        goal=goal,
        min_global=min_global,
        max_global=max_global,
        table=tuple(rows[c] for c in sorted(rows)),
        recommended_global=recommended,
        saturation_global=saturation,
        proven_below=proven_below,
        bound_reason=reason,
        floor_meets=floor_row.meets,
        floor_offenders=tuple(offenders),
        floor_offending_conversations=n_conv_over,
        floor_offending_requests=n_req_over,
        simulations=simulations,
        elapsed_s=time.perf_counter() - started,
        jobs=jobs,
        row_by_cap=rows,
    )


@dataclass(frozen=True)
class Verification:
    """A real replay of the trace at one cap, next to its simulation. Waits are in trace
    seconds (measured seconds times ``speed``).

    Attributes:
        global_cap: the cap replayed.
        speed: trace time was divided by this for the real run.
        runtime: the runtime that drove the real lanes (``threads`` or ``asyncio``).
        simulated: the simulation's figures at that cap.
        wait_p50_s / wait_p95_s / wait_p99_s / wait_max_s: measured waits, trace seconds.
        peak_global: most requests working at once, as the workers saw it.
        order_violations: requests that started after a later one of their conversation.
        max_key_concurrency: most requests of one conversation working at once.
        errors: requests that failed.
        wall_s: wall-clock seconds of the real run.
        goal: the goal the cap was planned for (None: not given); :meth:`text` says
            whether the measured waits meet it.
    """

    global_cap: int
    speed: float
    runtime: str
    simulated: CapRow
    wait_p50_s: float
    wait_p95_s: float
    wait_p99_s: float
    wait_max_s: float
    peak_global: int
    order_violations: int
    max_key_concurrency: int
    errors: int
    wall_s: float
    goal: PlanGoal | None = None

    def measured_meets_goal(self) -> bool | None:
        """Whether the measured p99 (and max, when the goal has one) wait meet
        :attr:`goal` (None: no goal). Not a lane invariant: real delays count ``speed``
        times over in trace seconds, so a miss at a high speed may be the machine's."""
        goal = self.goal
        if goal is None:
            return None
        # The measured floats as the decimals they print as (0.1 s is one tenth, as
        # --p99-wait-s 0.1 is), so that the verdict is the one the figures shown give.
        return exact(self.wait_p99_s) <= exact(goal.p99_wait_s) and (
            goal.max_wait_s is None or exact(self.wait_max_s) <= exact(goal.max_wait_s))

    def failed_checks(self) -> list[str]:
        """The lane invariants the real run broke (empty when all held)."""
        failed = []
        if self.order_violations:
            failed.append(f"order_violations = {self.order_violations} (expected 0)")
        if self.max_key_concurrency > 1:
            failed.append(f"max_key_concurrency = {self.max_key_concurrency} (expected <= 1)")
        if self.peak_global > self.global_cap:
            failed.append(f"peak_global = {self.peak_global} (cap {self.global_cap})")
        if self.errors:
            failed.append(f"{counted(self.errors, 'request')} failed")
        return failed

    def text(self) -> str:
        """The measured waits next to the simulated ones, in trace seconds."""
        sim = self.simulated
        goal = self.goal
        p99_goal = None if goal is None else goal.p99_wait_s
        max_goal = None if goal is None else goal.max_wait_s
        # The waits the goal bounds are shown on the side of it they are on.
        rows = [
            ("wait_p50_s", self.wait_p50_s, sim.wait_p50_s, None),
            ("wait_p95_s", self.wait_p95_s, sim.wait_p95_s, None),
            ("wait_p99_s", self.wait_p99_s, sim.wait_p99_s, p99_goal),
            ("wait_max_s", self.wait_max_s, sim.wait_max_s, max_goal),
        ]
        lines = [
            f"verify: replayed at global cap {self.global_cap} through real lanes "
            f"({self.runtime}, speed {exact_text(self.speed)}x, {self.wall_s:.1f} s); waits in "
            "trace seconds",
            f"{'metric':<11}  {'measured':>10}  {'simulated':>10}",
        ]
        lines += [f"{name:<11}  {against(m, limit, 3):>10}  {against(s, limit, 3):>10}"
                  for name, m, s, limit in rows]
        lines.append(
            f"peak_global {self.peak_global} (cap {self.global_cap}), order_violations "
            f"{self.order_violations}, errors {self.errors}"
        )
        met = self.measured_meets_goal()
        if met is not None and self.goal is not None:
            if met:
                lines.append(f"goal ({self.goal.describe()}): the measured waits meet it")
            else:
                lines.append(
                    f"goal ({self.goal.describe()}): the measured waits MISS it (the "
                    f"simulation {'meets' if sim.meets else 'misses'} it at this cap). The "
                    "measured waits include the replay's own delays (wake-ups, a busy "
                    f"machine), counted {exact_text(self.speed)} times over in trace seconds"
                    + (": verify again at a lower --speed before trusting either"
                       if self.speed > 1 else ", which no speed removes")
                )
        return "\n".join(lines)


def verify_plan(
    trace: Trace,
    global_cap: int,
    *,
    tpot_ms: float | None = None,
    speed: float = 60.0,
    runtime: str = "threads",
    goal: PlanGoal | None = None,
) -> Verification:
    """Replay ``trace`` at ``global_cap`` through real lanes (the replay's runtime) and
    measure the waits, next to the simulation of the same inputs.

    Each request arrives at its trace time / ``speed``, takes its conversation's
    SessionLane and the global Lane with ``acquire_all``, works for its service time /
    ``speed``, and releases. Takes about the trace's duration / ``speed``.

    Args:
        trace: the requests.
        global_cap: the cap to replay (>= 1).
        tpot_ms: work per output token (see :func:`plan_inputs`).
        speed: divide trace time by this (> 0).
        runtime: ``"threads"`` or ``"asyncio"``.
        goal: marks the simulated row (default: p99 of 0 s), and, when given, the
            report says whether the measured waits meet it.

    Returns:
        The Verification: measured and simulated waits in trace seconds, and the lane
        invariants as the workers observed them.

    Example::

        check = verify_plan(read_trace().head(500), 53, speed=600)
        print(check.text())

    Raises:
        TypeError: a setting of the wrong type.
        ValueError: no requests, a cap out of 1 .. 10**9, ``speed`` out of 1e-6 .. 1e6,
            an unknown runtime, or ``tpot_ms`` bad or missing.
    """
    from lanequeue.replay import ReplayPlan, get_runtime, session_key
    from lanequeue.replay.observe import count_order_violations

    speed = check_speed(speed)
    check_count(global_cap, "global_cap")
    if not trace.requests:
        raise ValueError(f"no valid request to replay in {trace.source}")
    lanes = policy_lanes("session", global_cap)
    driver = get_runtime(runtime)
    inputs = plan_inputs(trace, tpot_ms)
    simulated = _simulate_cap(inputs, global_cap, _GoalTicks.of(goal or PlanGoal(0)))
    scale = TICKS_PER_S * speed
    plan = ReplayPlan(
        arrival_s=[a / scale for a in inputs.arrival],
        work_s=[w / scale for w in inputs.work],
        keys=[session_key(k) for k in inputs.keys],
        lanes=lanes,
        max_sessions=256,
        idle_timeout_s=3600.0 / speed,
    )
    record = driver.run(plan)
    waits = sorted(
        (s - a) * speed
        for s, a in zip(record.start_s, plan.arrival_s, strict=True)
        if not math.isnan(s)
    )
    from lanequeue.replay.report import percentile

    return Verification(
        global_cap=global_cap,
        speed=speed,
        runtime=driver.name,
        simulated=simulated,
        wait_p50_s=percentile(waits, 50),
        wait_p95_s=percentile(waits, 95),
        wait_p99_s=percentile(waits, 99),
        wait_max_s=waits[-1] if waits else math.nan,
        peak_global=record.peak_global,
        order_violations=count_order_violations(inputs.keys, record.start_order),
        max_key_concurrency=record.max_key_concurrency,
        errors=len(record.errors),
        wall_s=record.wall_s,
        goal=goal,
    )


def write_plan_plot(plan: CapacityPlan, path: str | Path) -> None:
    """Write a PNG to ``path``: the simulated p99 and max wait (seconds, symlog scale)
    against the global cap, the goal lines, the caps proven to miss by the load bound
    (shaded), the recommendation and the saturation cap.

    Raises:
        PlotUnavailableError: matplotlib is missing.
    """
    from lanequeue.replay.plot import require_matplotlib

    plt = require_matplotlib()
    fig, ax = plt.subplots(figsize=(10, 5.5), constrained_layout=True)
    # The scanned caps are joined by lines; the saturation row (standing for every cap
    # from there on) is drawn apart when caps between were not simulated.
    scanned = [r for r in plan.table if r.global_cap != plan.saturation_global]
    sat = plan.row_by_cap.get(plan.saturation_global)
    if sat is not None and (not scanned or scanned[-1].global_cap == plan.saturation_global - 1):
        scanned.append(sat)
        sat = None
    caps = [r.global_cap for r in scanned]
    ax.plot(caps, [r.wait_p99_s for r in scanned], "o-", ms=3, lw=1, color="C0", label="p99 wait")
    ax.plot(caps, [r.wait_max_s for r in scanned], "s-", ms=3, lw=1, color="C1", label="max wait")
    if sat is not None:
        ax.plot([sat.global_cap], [sat.wait_p99_s], "o", ms=5, color="C0")
        ax.plot([sat.global_cap], [sat.wait_max_s], "s", ms=5, color="C1")
    s = float(plan.goal.p99_wait_s)
    ax.axhline(s, color="C0", ls=":", lw=1,
               label=f"goal p99 <= {exact_text(plan.goal.p99_wait_s)} s")
    if plan.goal.max_wait_s is not None:
        ax.axhline(float(plan.goal.max_wait_s), color="C1", ls=":", lw=1,
                   label=f"goal max <= {exact_text(plan.goal.max_wait_s)} s")
    if plan.proven_below > plan.min_global:
        ax.axvspan(
            plan.min_global - 0.5,
            plan.proven_below - 0.5,
            color="grey",
            alpha=0.2,
            label="proven to miss (load bound)",
        )
    if plan.recommended_global is not None:
        ax.axvline(
            plan.recommended_global,
            color="green",
            lw=1.2,
            label=f"recommended {plan.recommended_global}",
        )
    ax.axvline(
        plan.saturation_global,
        color="grey",
        ls="--",
        lw=1,
        label=f"waits stop improving {plan.saturation_global}",
    )
    ax.set_yscale("symlog", linthresh=max(s / 10, 1e-3))
    ax.set_ylim(bottom=0)
    ax.set_xlabel("global cap (requests working at once)")
    ax.set_ylabel("simulated wait (s)")
    ax.set_title(
        f"lanequeue plan: {counted(plan.requests, 'request')}, "
        f"{counted(plan.conversations, 'conversation')}; "
        f"{plan.goal.describe()}"
    )
    ax.legend(loc="upper right", fontsize="small")
    fig.savefig(str(path), dpi=110)
    plt.close(fig)
