"""``--plot``: a PNG of concurrency over time, the wait distribution, in-flight requests
against the cap, and the lanes' own wait histograms (matplotlib)."""

from __future__ import annotations

import importlib
import math
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from lanequeue._errors import counted, install_hint
from lanequeue.replay._figures import exact_text

if TYPE_CHECKING:
    from lanequeue._obs import LaneMetrics
    from lanequeue.replay.runner import ReplayResult

__all__ = ["PlotUnavailableError", "require_matplotlib", "write_plot"]


class PlotUnavailableError(RuntimeError):
    """matplotlib is not installed (the ``plot`` extra)."""


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
            f"install it with: {install_hint('plot')}"
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


def in_flight(result: ReplayResult) -> tuple[list[float], list[int]]:
    """In-flight requests over time: +1 when a request arrives, -1 when it has released
    its lanes (a request that never completed stays in flight)."""
    return _step_counts(list(result.plan.arrival_s), result.record.complete_s)


def write_plot(
    result: ReplayResult, path: str | Path, *, lane_metrics: Sequence[LaneMetrics] | None = None
) -> None:
    """Write a PNG to ``path`` with four panels: requests working and waiting over time
    (seconds of the replay) with the ideal schedule's working count and the global cap;
    the distribution of per-request waits (seconds), real and ideal; in-flight requests
    (arrived, not yet completed) over time against the global cap; and, from
    ``lane_metrics`` (each lane's :meth:`~lanequeue.Lane.metrics_snapshot`), each lane's
    own wait histogram (``lanequeue_wait_seconds``: a busy key on the session lane, a full
    lane on the global lane). Without ``lane_metrics`` (Redis backend) the last panel
    says so.

    Raises:
        PlotUnavailableError: matplotlib is missing.
    """
    plt = require_matplotlib()
    rep, plan, rec, ideal = result.report, result.plan, result.record, result.ideal

    fig, (ax1, ax2, ax3, ax4) = plt.subplots(4, 1, figsize=(11, 15), constrained_layout=True)

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
        f"lanequeue replay: policy {rep.policy}, {counted(rep.requests, 'request')}, "
        f"speed {exact_text(rep.speed)}x, runtime {rep.runtime}"
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

    fx, fy = in_flight(result)
    ax3.step(fx, fy, where="post", lw=0.8, label="in flight (arrived, not completed)")
    ax3.axhline(rep.global_cap, color="red", lw=0.8, ls=":", label=f"global cap {rep.global_cap}")
    ax3.set_xlabel("replay time (s)")
    ax3.set_ylabel("requests")
    ax3.set_title(f"in-flight requests against the cap (peak {max(fy)})")
    ax3.legend(loc="upper right", fontsize="small")

    if lane_metrics:
        width = 0.8 / len(lane_metrics)
        for i, m in enumerate(lane_metrics):
            labels = [f"<={b:g}" for b in m.wait.bounds] + ["more"]
            xs = [j + i * width for j in range(len(labels))]
            reason = "key busy" if m.kind == "session" else "lane full"
            ax4.bar(xs, m.wait.counts, width=width, label=f"{m.lane} ({reason})")
        ax4.set_xticks([j + 0.4 - width / 2 for j in range(len(labels))], labels,
                       rotation=45, fontsize="small")
        ax4.set_yscale("log")
        ax4.legend(loc="upper right", fontsize="small")
    else:
        ax4.text(0.5, 0.5, "lane histograms: in-process runtimes only", ha="center",
                 va="center", transform=ax4.transAxes)
    ax4.set_xlabel("wait (s), lanequeue_wait_seconds buckets")
    ax4.set_ylabel("acquisitions (log)")
    ax4.set_title("each lane's own wait-time distribution")
    fig.savefig(str(path), dpi=110)
    plt.close(fig)
