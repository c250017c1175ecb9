"""``--plot``: a PNG of concurrency over time and of the wait distribution (matplotlib)."""

from __future__ import annotations

import importlib
import math
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from lanequeue.replay.runner import ReplayResult

__all__ = ["PlotUnavailableError", "require_matplotlib", "write_plot"]


class PlotUnavailableError(RuntimeError):
    """matplotlib is not installed (``pip install 'lanequeue[plot]'``)."""


def require_matplotlib() -> Any:
    """Import matplotlib's ``pyplot`` with the non-interactive Agg backend.

    Raises:
        PlotUnavailableError: matplotlib is missing; the message says how to install it.
    """
    try:
        matplotlib = importlib.import_module("matplotlib")
    except ImportError as exc:
        raise PlotUnavailableError(
            "--plot needs matplotlib, which is not installed; "
            "install it with: pip install 'lanequeue[plot]'"
        ) from exc
    matplotlib.use("Agg")
    return importlib.import_module("matplotlib.pyplot")


def _step_counts(ups: Sequence[float], downs: Sequence[float]) -> tuple[list[float], list[int]]:
    """Times and counts of a step function: +1 at each ``ups``, -1 at each ``downs``."""
    events = sorted(
        [(t, -1) for t in downs if not math.isnan(t)] + [(t, 1) for t in ups if not math.isnan(t)]
    )
    xs: list[float] = [0.0]
    ys: list[int] = [0]
    level = 0
    for t, d in events:
        level += d
        xs.append(t)
        ys.append(level)
    return xs, ys


def write_plot(result: ReplayResult, path: str | Path) -> None:
    """Write a PNG to ``path``: top, requests working and waiting over time (seconds of
    the replay) with the ideal schedule's working count and the global cap; bottom, the
    distribution of per-request waits (seconds), real and ideal.

    Raises:
        PlotUnavailableError: matplotlib is missing.
    """
    plt = require_matplotlib()
    rep, plan, rec, ideal = result.report, result.plan, result.record, result.ideal

    fig, (ax1, ax2) = plt.subplots(2, 1, figsize=(11, 8), constrained_layout=True)

    xs, ys = _step_counts(rec.start_s, rec.complete_s)
    ax1.step(xs, ys, where="post", lw=0.8, label="working (replay)")
    wx, wy = _step_counts(list(plan.arrival_s), rec.start_s)
    ax1.step(wx, wy, where="post", lw=0.8, label="waiting (replay)")
    ix, iy = _step_counts([float(t) for t in ideal.start], [float(t) for t in ideal.end])
    ax1.step(ix, iy, where="post", lw=0.8, ls="--", alpha=0.7, label="working (ideal)")
    ax1.axhline(rep.global_cap, color="red", lw=0.8, ls=":", label=f"global cap {rep.global_cap}")
    ax1.set_xlabel("replay time (s)")
    ax1.set_ylabel("requests")
    ax1.set_title(
        f"lanequeue replay: policy {rep.policy}, {rep.requests} requests, "
        f"speed {rep.speed:g}x, runtime {rep.runtime}"
    )
    ax1.legend(loc="upper right", fontsize="small")

    waits = [s - a for s, a in zip(rec.start_s, plan.arrival_s, strict=True) if not math.isnan(s)]
    ideal_waits = [float(w) for w in ideal.waits]
    top = max([*waits, *ideal_waits, 1e-6])
    bins = [top * i / 60 for i in range(61)]
    ax2.hist(waits, bins=bins, alpha=0.6, label="replay")
    ax2.hist(ideal_waits, bins=bins, histtype="step", lw=1.2, label="ideal")
    ax2.set_yscale("log")
    ax2.set_xlabel("wait: start of work - arrival (s)")
    ax2.set_ylabel("requests (log)")
    ax2.set_title(
        f"wait p50 {rep.wait_p50_s:.4f} s, p95 {rep.wait_p95_s:.4f} s, "
        f"p99 {rep.wait_p99_s:.4f} s, max {rep.wait_max_s:.4f} s"
    )
    ax2.legend(loc="upper right", fontsize="small")
    fig.savefig(str(path), dpi=110)
    plt.close(fig)
