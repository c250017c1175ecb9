"""Shared machinery of ``benchmarks/run.py``: rows, the table, the machine, the harness.

A section is a function ``section(cfg) -> list[Row]``; ``run.py`` registers sections by name
and prints every row in one table. Timings are taken by :func:`interleave`: all candidates
of a section run in rounds, one batch each per round, in a rotating order, and each figure
is the median of its rounds, so that a burst of load from another job on a shared machine
hits every candidate alike and ratios taken inside one run stay meaningful.
"""

from __future__ import annotations

import gc
import os
import platform
import statistics
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

__all__ = [
    "Config",
    "Row",
    "format_table_header",
    "format_row",
    "gc_paused",
    "interleave",
    "machine_info",
    "median",
    "per_round_ratio",
    "spread",
    "verdict",
]


@dataclass
class Config:
    """Sizes of one run; ``quick`` shrinks everything for a smoke test."""

    quick: bool
    rounds: int  # rounds of the interleaved timings (uncontended section)
    batch_s: float  # target seconds per batch of one candidate in one round
    handoff_rounds: int  # rounds of the two-thread hand-off section
    handoff_window_s: float  # seconds each candidate contends per round
    churn_keys: int  # distinct keys pushed through a SessionLane (registry size)
    mem_entries: int  # idle entries filled for bytes per idle entry (ours, lock dict)
    mem_entries_seed: int  # the same for the seed (slow under tracemalloc: ~90 us/entry)

    @classmethod
    def make(cls, quick: bool) -> Config:
        if quick:
            return cls(True, rounds=7, batch_s=0.008, handoff_rounds=3,
                       handoff_window_s=0.1, churn_keys=10_000, mem_entries=50_000,
                       mem_entries_seed=10_000)
        return cls(False, rounds=25, batch_s=0.025, handoff_rounds=7,
                   handoff_window_s=0.4, churn_keys=100_000, mem_entries=100_000,
                   mem_entries_seed=100_000)


@dataclass
class Row:
    """One figure of the table (and one object of the JSON ``rows`` list)."""

    section: str
    name: str
    value: float | int | None
    unit: str
    note: str = ""
    goal: str | None = None  # e.g. "<= 0.300"
    status: str | None = None  # "PASS" / "MISS" / "ERROR" / None (no goal)
    data: dict[str, Any] = field(default_factory=dict)  # raw rounds and the like (JSON only)


# -- the table -------------------------------------------------------------------------------

_W_SECTION, _W_NAME, _W_VALUE, _W_UNIT = 11, 52, 12, 10


def _fmt_value(v: float | int | None) -> str:
    if v is None:
        return "-"
    if isinstance(v, int):
        return f"{v:,}"
    a = abs(v)
    if a >= 1000:
        return f"{v:,.0f}"
    if a >= 100:
        return f"{v:.0f}"
    if a >= 10:
        return f"{v:.1f}"
    if a >= 1:
        return f"{v:.2f}"
    return f"{v:.3f}"


def format_table_header() -> str:
    head = (f"{'section':<{_W_SECTION}}  {'figure':<{_W_NAME}}  {'value':>{_W_VALUE}}  "
            f"{'unit':<{_W_UNIT}}  note")
    rule = (f"{'-' * _W_SECTION}  {'-' * _W_NAME}  {'-' * _W_VALUE}  {'-' * _W_UNIT}  "
            f"{'-' * 30}")
    return head + "\n" + rule


def format_row(r: Row) -> str:
    note = r.note
    if r.status:
        goal = f"goal {r.goal} " if r.goal else ""
        note = f"{goal}{r.status}" + (f"; {note}" if note else "")
    return (f"{r.section:<{_W_SECTION}}  {r.name:<{_W_NAME}}  {_fmt_value(r.value):>{_W_VALUE}}  "
            f"{r.unit:<{_W_UNIT}}  {note}").rstrip()


def verdict(value: float, limit: float) -> str:
    """PASS when ``value <= limit``; never raises."""
    return "PASS" if value <= limit else "MISS"


# -- the machine -----------------------------------------------------------------------------


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "?"


def machine_info() -> dict[str, Any]:
    try:
        usable = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        usable = None
    try:
        load = [round(x, 2) for x in os.getloadavg()]
    except (AttributeError, OSError):
        load = None
    import lanequeue

    return {
        "cpu_count": os.cpu_count(),
        "cpus_usable": usable,
        "cpu_model": _cpu_model(),
        "python": platform.python_implementation() + " " + platform.python_version(),
        "python_build": " ".join(platform.python_build()),
        "platform": platform.platform(),
        "switch_interval_s": sys.getswitchinterval(),
        "loadavg_at_start": load,
        "lanequeue_version": lanequeue.__version__,
    }


# -- statistics ------------------------------------------------------------------------------


def median(xs: list[float]) -> float:
    return float(statistics.median(xs))


def spread(xs: list[float]) -> float:
    """Half the inter-quartile range, relative to the median (0.05 = +-5%)."""
    if len(xs) < 4:
        return (max(xs) - min(xs)) / 2 / median(xs) if xs and median(xs) else 0.0
    q = statistics.quantiles(xs, n=4)
    return (q[2] - q[0]) / 2 / median(xs)


def per_round_ratio(num: list[float], den: list[float]) -> list[float]:
    """Ratios of two candidates measured in the same rounds (adjacent in time)."""
    return [a / b for a, b in zip(num, den, strict=True)]


# -- the harness -----------------------------------------------------------------------------


@contextmanager
def gc_paused() -> Iterator[None]:
    """Pause the cyclic GC during a timed stretch (as ``timeit`` does)."""
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()


def _time_batch(run: Callable[[int], None], n: int) -> float:
    with gc_paused():
        t0 = time.perf_counter()
        run(n)
        return time.perf_counter() - t0


def interleave(
    candidates: dict[str, Callable[[int], None]],
    rounds: int,
    batch_s: float,
    groups: list[list[str]] | None = None,
) -> dict[str, list[float]]:
    """Time each candidate's ``run(n)`` (n operations) in ``rounds`` rounds, alternating.

    Each candidate first gets a batch size calibrated to about ``batch_s`` seconds (this
    also warms it up). Then every round runs one batch of every candidate. Candidates that
    will be compared (``groups``, e.g. ours and the seed's) run back to back, so a burst
    of outside load hits both alike; the groups' order rotates from round to round and
    the order inside a group flips, so no candidate always runs first or last.
    Returns ns per operation, per round.
    """
    sizes: dict[str, int] = {}
    for name, run in candidates.items():
        n = 100
        while True:
            t = _time_batch(run, n)
            if t >= batch_s / 5 or n >= 1 << 24:
                break
            n *= 5
        sizes[name] = max(100, int(n * batch_s / max(t, 1e-9)))
        gc.collect()
    if groups is None:
        groups = [[name] for name in candidates]
    grouped = {name for g in groups for name in g}
    groups = groups + [[name] for name in candidates if name not in grouped]
    out: dict[str, list[float]] = {name: [] for name in candidates}
    for r in range(rounds):
        k = r % len(groups)
        for group in groups[k:] + groups[:k]:
            for name in (reversed(group) if r % 2 else group):
                n = sizes[name]
                out[name].append(_time_batch(candidates[name], n) / n * 1e9)
        gc.collect()
    return out
