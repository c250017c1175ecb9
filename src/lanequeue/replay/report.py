"""The figures of a replay: the table printed at the end and the ``--json`` document."""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from lanequeue._errors import counted
from lanequeue.replay._figures import exact_text
from lanequeue.replay.policy import policy_lanes
from lanequeue.replay.trace import MAX_SOURCE_CHARS, printable

__all__ = ["JSON_KEYS", "ReplayReport", "percentile"]

#: Keys every ``--json`` document has (more may follow them).
JSON_KEYS = (
    "requests",
    "conversations",
    "skipped_lines",
    "wall_s",
    "throughput_rps",
    "wait_p50_s",
    "wait_p95_s",
    "wait_p99_s",
    "wait_max_s",
    "order_violations",
    "max_key_concurrency",
    "peak_global",
    "registry_peak",
    "registry_final",
    "ideal_makespan_s",
    "makespan_ratio",
)


def percentile(values: Sequence[float], q: float) -> float:
    """The ``q``-th percentile (0..100) of ``values``, interpolating linearly between
    closest ranks (numpy's default); NaN for no values."""
    if not 0 <= q <= 100:
        raise ValueError(f"q must be within 0..100, got {q}")
    data = sorted(values)
    if not data:
        return math.nan
    pos = (len(data) - 1) * q / 100
    lo = math.floor(pos)
    hi = min(lo + 1, len(data) - 1)
    return data[lo] + (data[hi] - data[lo]) * (pos - lo)


def _finite(x: float | None) -> float | None:
    return None if x is None or math.isnan(x) or math.isinf(x) else x


@dataclass
class ReplayReport:
    """Everything a replay measured. Seconds are scaled seconds (trace time / speed), which
    for a real run are also wall-clock seconds.

    Attributes:
        requests: requests replayed.
        conversations: distinct conversations among them.
        skipped_lines: input lines skipped as invalid.
        wall_s: seconds from the start of the replay to the last completion (real run).
        throughput_rps: ``requests / wall_s``, requests per second.
        wait_p50_s / wait_p95_s / wait_p99_s / wait_max_s: per-request wait, start of work
            minus arrival, in seconds (real run).
        order_violations: requests overtaken: those that started after a later-arrived
            request of their own conversation (must be 0), from the workers' start order
            (:func:`~lanequeue.replay.observe.count_order_violations`).
        max_key_concurrency: most requests of one conversation working at once (must be 1).
        peak_global: most requests working at once (must not exceed :attr:`cap_at_once`).
        registry_peak / registry_final: entries of the session lane's registry, largest
            sampled and after the run; None for a policy without a per-key lane. Not
            bounded by ``max_sessions`` (a soft cap): held entries are never evicted, and
            idle ones only when a new key needs room or they expire.
        makespan_s: first arrival to last completion, seconds (real run).
        ideal_makespan_s: the same in the exact simulation of the policy, seconds.
        makespan_ratio: ``makespan_s / ideal_makespan_s`` (None when the ideal is 0).
        ideal_wait_*: the wait percentiles of the simulation, seconds.
        dispatch_lag_max_s: most a request was released after its arrival time, seconds.
        gate_held_back: requests that waited at the arrival gate for a predecessor.
        worker_threads: threads the runtime started (at most the most requests in flight
            at once; summed over the worker processes).
        workers: worker processes that drove the requests (1 in process).
        backend: where the lanes lived: None in process, else the backend URL without
            its password.
        backend_info: the backend's own figures (Redis: key prefix, conversations split
            across workers, keys left at the end and without a TTL, ...).
    """

    requests: int
    conversations: int
    skipped_lines: int
    wall_s: float
    throughput_rps: float
    wait_p50_s: float
    wait_p95_s: float
    wait_p99_s: float
    wait_max_s: float
    order_violations: int
    max_key_concurrency: int
    peak_global: int
    registry_peak: int | None
    registry_final: int | None
    ideal_makespan_s: float
    makespan_ratio: float | None
    makespan_s: float
    ideal_wait_p50_s: float
    ideal_wait_p95_s: float
    ideal_wait_p99_s: float
    ideal_wait_max_s: float
    ideal_peak_global: int
    dispatch_lag_max_s: float
    gate_held_back: int
    worker_threads: int
    policy: str
    runtime: str
    global_cap: int
    speed: float
    tpot_ms: float | None
    source: str
    errors: int = 0
    lane_stats: dict[str, dict[str, int]] = field(default_factory=dict)
    workers: int = 1
    backend: str | None = None
    backend_info: dict[str, Any] = field(default_factory=dict)

    @property
    def cap_at_once(self) -> int:
        """The most requests the policy lets work at once: the smallest capacity of its
        shared lanes (``global_cap`` for ``session``; 1 for ``global-serial``, whose single
        permit serialises everything)."""
        return min(
            lane.capacity
            for lane in policy_lanes(self.policy, self.global_cap)
            if not lane.per_key
        )

    def failed_checks(self) -> list[str]:
        """The invariants this run broke (empty when all hold): order within a
        conversation, one request per conversation at a time, the global cap, no errors."""
        failed = []
        if self.order_violations:
            failed.append(f"order_violations = {self.order_violations} (expected 0)")
        if self.max_key_concurrency > 1:
            failed.append(f"max_key_concurrency = {self.max_key_concurrency} (expected <= 1)")
        if self.peak_global > self.cap_at_once:
            failed.append(f"peak_global = {self.peak_global} (cap {self.cap_at_once})")
        if self.errors:
            failed.append(f"{counted(self.errors, 'request')} failed")
        no_ttl = self.backend_info.get("redis_keys_without_ttl")
        if no_ttl:
            failed.append(f"{no_ttl} Redis keys of the run had no TTL (expected 0)")
        return failed

    def to_dict(self) -> dict[str, Any]:
        """The report as JSON-ready data: the keys of :data:`JSON_KEYS` first, then the
        extra figures and the run's settings. NaN and infinities become None."""
        out: dict[str, Any] = {}
        for name, value in self.__dict__.items():
            out[name] = _finite(value) if isinstance(value, float) else value
        ordered = {k: out.pop(k) for k in JSON_KEYS}
        ordered.update(out)
        return ordered

    def write_json(self, path: str | Path) -> None:
        """Write :meth:`to_dict` to ``path`` as indented JSON (UTF-8)."""
        Path(path).write_text(json.dumps(self.to_dict(), indent=2) + "\n", encoding="utf-8")

    def table(self) -> str:
        """The human-readable summary: one row per figure, the simulation alongside."""

        def num(x: float | None, digits: int = 3) -> str:
            return "n/a" if x is None or math.isnan(x) else f"{x:.{digits}f}"

        def opt(x: int | None) -> str:
            return "n/a" if x is None else str(x)

        rows: list[tuple[str, str, str]] = [
            ("requests", str(self.requests), ""),
            ("conversations", str(self.conversations), ""),
            ("skipped_lines", str(self.skipped_lines), ""),
            ("wall_s", num(self.wall_s), ""),
            ("throughput_rps", num(self.throughput_rps, 1), ""),
            ("wait_p50_s", num(self.wait_p50_s, 4), num(self.ideal_wait_p50_s, 4)),
            ("wait_p95_s", num(self.wait_p95_s, 4), num(self.ideal_wait_p95_s, 4)),
            ("wait_p99_s", num(self.wait_p99_s, 4), num(self.ideal_wait_p99_s, 4)),
            ("wait_max_s", num(self.wait_max_s, 4), num(self.ideal_wait_max_s, 4)),
            ("order_violations", str(self.order_violations), "0"),
            ("max_key_concurrency", str(self.max_key_concurrency), "1" if self.requests else "0"),
            ("peak_global", str(self.peak_global), str(self.ideal_peak_global)),
            ("registry_peak", opt(self.registry_peak), ""),
            ("registry_final", opt(self.registry_final), ""),
            ("makespan_s", num(self.makespan_s), num(self.ideal_makespan_s)),
            ("ideal_makespan_s", num(self.ideal_makespan_s), ""),
            ("makespan_ratio", num(self.makespan_ratio, 4), ""),
            ("dispatch_lag_max_s", num(self.dispatch_lag_max_s, 4), ""),
        ]
        info = self.backend_info
        if self.backend is not None:
            rows += [
                ("gate_held_back", str(self.gate_held_back), ""),
                ("worker_threads", str(self.worker_threads), ""),
            ]
            if info.get("worker_cpu_ms_per_request") is not None:
                rows.append(
                    ("worker_cpu_ms_per_request", f"{info['worker_cpu_ms_per_request']:.3f}", "")
                )
            if "conversations_split_across_workers" in info:
                split = info["conversations_split_across_workers"]
                multi = info.get("conversations_with_several_requests", "?")
                rows.append(("split_conversations", f"{split} of {multi}", ""))
            if "redis_keys_at_end" in info:
                rows.append(
                    (
                        "redis_keys_at_end",
                        f"{info['redis_keys_at_end']} "
                        f"({info.get('redis_keys_without_ttl', '?')} without TTL)",
                        "",
                    )
                )
        w0 = max(len(r[0]) for r in rows)
        w1 = max(len("replay"), *(len(r[1]) for r in rows))
        w2 = max(len("ideal"), *(len(r[2]) for r in rows))
        speed = exact_text(self.speed)
        lines = [
            f"lanequeue replay: {printable(self.source, MAX_SOURCE_CHARS)}",
            f"policy {self.policy}, runtime {self.runtime}, global cap {self.global_cap}"
            + ("" if self.cap_at_once == self.global_cap
               else f" (at most {self.cap_at_once} at once under this policy)")
            + f", speed {speed}x, "
            + (
                "service times from the trace"
                if self.tpot_ms is None
                else f"{exact_text(self.tpot_ms)} ms per output token"
            ),
        ]
        if self.backend is not None:
            lines.append(
                f"backend {self.backend}: {self.workers} worker processes, requests dealt "
                "round-robin"
            )
        lines += [
            "",
            f"{'metric':<{w0}}  {'replay':>{w1}}  {'ideal':>{w2}}",
            f"{'-' * w0}  {'-' * w1}  {'-' * w2}",
        ]
        lines += [f"{a:<{w0}}  {b:>{w1}}  {c:>{w2}}".rstrip() for a, b, c in rows]
        return "\n".join(lines)
