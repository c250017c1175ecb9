"""Hold-time histograms under interrupts: :meth:`Histogram.fold` runs on the release
fast paths (inside a lane's critical section, "Interrupts" in ``lanequeue._core``), so a
KeyboardInterrupt may land at any of its eval-breaker checks; whatever the point, every
value appended is counted exactly once (never twice, never lost)."""

from __future__ import annotations

import sys
from types import FrameType
from typing import Any

import pytest

from lanequeue._obs import Histogram

BOUNDS = (0.01, 0.1, 1.0)


class _NthBuiltinReturn:
    """A profile function raising KeyboardInterrupt when the ``n``-th builtin called by
    ``Histogram.fold`` itself returns (the check after a ``CALL``: where CPython can
    deliver a signal handler's exception)."""

    def __init__(self, n: int) -> None:
        self.n = n
        self.seen = 0
        self.fired = False

    def __call__(self, frame: FrameType, event: str, arg: Any) -> None:
        if event == "c_return" and frame.f_code is Histogram.fold.__code__:
            self.seen += 1
            if self.seen == self.n:
                self.fired = True
                raise KeyboardInterrupt


@pytest.mark.timeout(10)
@pytest.mark.parametrize("values", [[0.005, 0.006], [0.005, 0.5, 2.0]],
                         ids=["one-bucket", "many-buckets"])
def test_fold_interrupted_at_every_point_counts_each_value_once(values: list[float]) -> None:
    """Input: a histogram holding unfolded values, KeyboardInterrupt after the n-th
    builtin call of ``fold`` (n = 1, 2, ...), then the next fold. Observed before the
    fix: an interrupt after the buckets were added to (at ``sum(held)``) left the values
    in the list, so the next fold counted them twice. Expected: count and sum of the
    values once."""
    n = 0
    while True:
        n += 1
        hist = Histogram(BOUNDS)
        hist.extend(values)
        inject = _NthBuiltinReturn(n)
        sys.setprofile(inject)
        try:
            hist.fold()
        except KeyboardInterrupt:
            pass
        finally:
            sys.setprofile(None)
        snap = hist.snapshot()
        assert snap.count == len(values), (n, snap)
        assert snap.sum == pytest.approx(sum(values)), (n, snap)
        if not inject.fired:
            break
    assert n > 3
