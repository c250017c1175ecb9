"""The reference limit of spare holds (``SPARE_REFS``) is measured once, at import: a
trace function active at that moment must not raise it (a tracer that reads a frame's
locals holds one more reference to ``self`` in every call it traces)."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

from lanequeue._core import SPARE_REFS

IMPORTED_UNDER_A_TRACER = textwrap.dedent(
    """
    import sys

    def tracer(frame, event, arg):
        frame.f_locals  # as a debugger or a call logger does
        return tracer

    sys.settrace(tracer)
    import lanequeue._core as core
    sys.settrace(None)
    from lanequeue import SessionLane

    lane = SessionLane("s")
    with lane.acquire("a") as mine:
        pass
    with lane.acquire("b"):  # another caller's acquire: must not get ``mine``
        print(core.SPARE_REFS, mine.key, mine.held, lane.is_held("b"))
    """
)


@pytest.mark.timeout(30)
def test_limit_measured_under_a_tracer_is_the_untraced_one() -> None:
    """Input: lanequeue imported while a trace function that reads ``frame.f_locals``
    runs; then ``with lane.acquire("a") as mine`` and another caller's
    ``lane.acquire("b")``. Observed before the fix: SPARE_REFS 4 instead of 3, ``mine``
    (still named) was put in spare and handed to the other caller: ``mine.key == "b"``,
    ``mine.held`` True, so ``mine.release()`` would end the other caller's hold.
    Expected: the limit of an untraced import; ``mine`` keeps its key, released."""
    out = subprocess.run(
        [sys.executable, "-c", IMPORTED_UNDER_A_TRACER],
        capture_output=True, text=True, timeout=25, check=True,
    ).stdout.split()
    assert out == [str(SPARE_REFS), "a", "False", "True"]
