"""``lanequeue replay --busy POLICY``: the trace driven through a :class:`~lanequeue.Dispatcher`.

Each request arrives at its trace time / ``speed`` (one asyncio loop, as the asyncio
runtime) and is SUBMITTED to a dispatcher under its conversation's key, with the busy
policy under test, instead of taking the lanes itself. The dispatcher takes
``["session", "global"]`` of an :class:`~lanequeue.AsyncLaneQueue` for each turn it runs.
A turn works for its service time / ``speed`` (``duration_s``, or ``output_tokens x
tpot_ms``: :func:`~lanequeue.replay.trace.service_times_us`); a merged call (``collect``) works as
long as its longest message (one reply to them all); a running turn takes the payloads
steered into it when its work is done (``steer``), and its reply covers them.

Per policy the report counts the requests, the model calls made, the requests answered
(``done``: by their own call, merged into one, or steered into a running one), and those
dropped, rejected, cancelled and timed out, with the wait percentiles (a request's wait:
from its arrival to the start of the call that answers it; requests never answered have
no wait). Two checks must hold for every policy: no conversation ever runs two calls at
once, and each conversation's requests begin in arrival order.

For ``enqueue`` the exact simulation of the same lanes (:func:`simulate_trace`) is the
ideal: its waits are printed beside the real ones.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

from lanequeue import DEFAULT_IDLE_TIMEOUT_S, AsyncLaneQueue, Dispatcher, current_turn
from lanequeue.dispatch import BUSY_POLICIES
from lanequeue.replay.report import percentile
from lanequeue.replay.runner import ReplayConfig, make_plan, simulate_trace
from lanequeue.replay.trace import Trace

__all__ = ["BusyResult", "busy_table", "run_busy"]


@dataclass(frozen=True)
class BusyResult:
    """The figures of one policy (see the module docstring); waits in seconds."""

    policy: str
    requests: int
    calls: int
    done: int
    merged: int
    steered: int
    dropped: int
    rejected: int
    cancelled: int
    timed_out: int
    wait_p50_s: float
    wait_p95_s: float
    wait_p99_s: float
    wait_max_s: float
    overlaps: int
    order_violations: int
    wall_s: float

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def run_busy(trace: Trace, policy: str, *, speed: float = 60.0, tpot_ms: float | None = None,
             global_cap: int = 64, max_sessions: int = 256,
             idle_timeout_s: float | None = DEFAULT_IDLE_TIMEOUT_S) -> BusyResult:
    """Replay ``trace`` through a Dispatcher with busy policy ``policy`` (real time, on a
    new event loop). ``idle_timeout_s``: seconds of trace time an idle session entry is
    kept (divided by ``speed``), as in :class:`~lanequeue.replay.ReplayConfig`. Raises
    ValueError for an unknown policy or a setting out of range (ReplayConfig's checks)."""
    if policy not in BUSY_POLICIES:  # one policy here ("all" and lists are the CLI's)
        raise ValueError(f"busy policy must be one of {BUSY_POLICIES}, got {policy!r}")
    plan = make_plan(trace, ReplayConfig(speed=speed, tpot_ms=tpot_ms, global_cap=global_cap,
                                         max_sessions=max_sessions,
                                         idle_timeout_s=idle_timeout_s, busy=policy))
    return asyncio.run(_run(plan, policy, global_cap, max_sessions))


async def _run(plan: Any, policy: str, global_cap: int, max_sessions: int) -> BusyResult:
    queue = AsyncLaneQueue()
    queue.add_session_lane("session", max_sessions=max_sessions, timeout_s=None,
                           idle_timeout_s=plan.idle_timeout_s)
    queue.add_lane("global", max_concurrent=global_cap, timeout_s=None)
    # A long line per key, so that only the policy under test drops or rejects.
    dispatcher = Dispatcher(queue, busy=policy, max_pending=10_000)
    n = len(plan.keys)
    began = [-1.0] * n  # when the call answering each request started
    running: set[str] = set()
    seen: dict[str, int] = {}  # per key, the last request index that began
    overlaps = order_violations = calls = 0
    loop = asyncio.get_running_loop()
    t0 = loop.time()

    def begin(key: str, indices: Sequence[int], at: float) -> None:
        nonlocal order_violations
        for i in indices:
            began[i] = at
            if i < seen.get(key, -1):
                order_violations += 1
            seen[key] = max(seen.get(key, -1), i)

    async def work(payload: Any) -> None:
        nonlocal overlaps, calls
        turn = current_turn()
        key = turn.key
        indices = list(payload) if isinstance(payload, list) else [payload]
        if key in running:
            overlaps += 1
        running.add(key)
        calls += 1
        begin(key, indices, loop.time() - t0)
        try:
            await asyncio.sleep(max(plan.work_s[i] for i in indices))
            steered = turn.inbox.take()
            if steered:
                begin(key, steered, loop.time() - t0)
        finally:
            running.discard(key)

    start_wall = time.monotonic()
    tickets = []
    for i in range(n):
        delay = t0 + plan.arrival_s[i] - loop.time()
        if delay > 0:
            await asyncio.sleep(delay)
        tickets.append(dispatcher.submit(plan.keys[i], work, i))
    await dispatcher.drain(None)
    wall = time.monotonic() - start_wall
    s = dispatcher.stats
    waits = [began[i] - plan.arrival_s[i] for i, t in enumerate(tickets) if t.state == "done"]
    return BusyResult(
        policy=policy, requests=n, calls=calls, done=s.done, merged=s.merged,
        steered=s.steered, dropped=s.dropped, rejected=s.rejected, cancelled=s.cancelled,
        timed_out=s.timed_out, wait_p50_s=percentile(waits, 50),
        wait_p95_s=percentile(waits, 95), wait_p99_s=percentile(waits, 99),
        wait_max_s=max(waits, default=float("nan")), overlaps=overlaps,
        order_violations=order_violations, wall_s=wall,
    )


def ideal_waits(trace: Trace, *, speed: float, tpot_ms: float | None,
                global_cap: int) -> tuple[float, float, float, float]:
    """p50, p95, p99 and max wait of the exact simulation (the ideal of ``enqueue``)."""
    sched = simulate_trace(trace, ReplayConfig(speed=speed, tpot_ms=tpot_ms,
                                               global_cap=global_cap))
    waits = [float(w) for w in sched.waits]
    return (percentile(waits, 50), percentile(waits, 95), percentile(waits, 99),
            max(waits, default=float("nan")))


def busy_table(results: Sequence[BusyResult],
               ideal: tuple[float, float, float, float] | None = None) -> str:
    """The results as a text table, one row per policy (plus the ideal of enqueue)."""
    head = ("policy", "requests", "calls", "done", "merged", "steered", "dropped",
            "rejected", "cancelled", "timed_out", "wait_p50_s", "wait_p95_s", "wait_p99_s",
            "wait_max_s", "overlaps", "order_viol")
    rows = [[r.policy, r.requests, r.calls, r.done, r.merged, r.steered, r.dropped,
             r.rejected, r.cancelled, r.timed_out, f"{r.wait_p50_s:.4f}",
             f"{r.wait_p95_s:.4f}", f"{r.wait_p99_s:.4f}", f"{r.wait_max_s:.4f}",
             r.overlaps, r.order_violations] for r in results]
    if ideal is not None:
        rows.append(["ideal(enqueue)", "", "", "", "", "", "", "", "", "",
                     *(f"{w:.4f}" for w in ideal), "", ""])
    cells = [list(map(str, head))] + [list(map(str, row)) for row in rows]
    widths = [max(len(c[i]) for c in cells) for i in range(len(head))]
    lines = ["  ".join(c[i].rjust(widths[i]) if i else c[i].ljust(widths[i])
                       for i in range(len(head))) for c in cells]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)
