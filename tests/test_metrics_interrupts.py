"""Hold-time histograms under interrupts: :meth:`Histogram.fold` runs on the release
fast paths (inside a lane's critical section, "Interrupts" in ``lanequeue._core``), so a
KeyboardInterrupt may land at any of its eval-breaker checks; whatever the point, every
value appended is counted exactly once (never twice, never lost)."""

from __future__ import annotations

import pytest
from interrupt_points import Sweep

from lanequeue._obs import Histogram

BOUNDS = (0.01, 0.1, 1.0)


@pytest.mark.timeout(10)
@pytest.mark.parametrize("values", [[0.005, 0.006], [0.005, 0.5, 2.0]],
                         ids=["one-bucket", "many-buckets"])
def test_fold_interrupted_at_every_point_counts_each_value_once(values: list[float]) -> None:
    """Input: a histogram holding unfolded values, KeyboardInterrupt after the n-th
    builtin call of ``fold`` (n = 1, 2, ...), then the next fold. Observed before the
    fix: an interrupt after the buckets were added to (at ``sum(held)``) left the values
    in the list, so the next fold counted them twice. Expected: count and sum of the
    values once."""
    sweep = Sweep(100, traced=lambda code: code is Histogram.fold.__code__,
                  points={"c_return"})
    for inject in sweep:  # KeyboardInterrupt as the n-th builtin called by fold returns
        hist = Histogram(BOUNDS)
        hist.extend(values)
        inject.run(hist.fold, catch=KeyboardInterrupt)
        snap = hist.snapshot()
        assert snap.count == len(values), (inject.n, snap)
        assert snap.sum == pytest.approx(sum(values)), (inject.n, snap)
    assert len(sweep.fired) >= 3
