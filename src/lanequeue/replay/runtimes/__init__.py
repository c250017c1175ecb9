"""Runtimes: the pluggable piece that drives a replay plan through real lanes.

- :mod:`~lanequeue.replay.runtimes.base`: the plan, the record, and what every runtime
  shares (lanes from a plan, the arrival gate, the record from an observer);
- :mod:`~lanequeue.replay.runtimes.threads`: ``threads``, one thread per request in flight
  blocking in :class:`~lanequeue.LaneQueue`;
- :mod:`~lanequeue.replay.runtimes.aio`: ``asyncio``, one task per request awaiting
  :class:`~lanequeue.AsyncLaneQueue` on one event loop;
- :mod:`~lanequeue.replay.runtimes.redis_processes`: worker processes, each running the
  asyncio driver (or, with ``--runtime threads``, the thread driver) over Redis lanes
  (``--backend redis://... --workers N``).

Another runtime plugs in by adding an entry to :data:`RUNTIMES`.
"""

from __future__ import annotations

from collections.abc import Callable

from lanequeue.replay.runtimes.aio import AsyncioRuntime
from lanequeue.replay.runtimes.base import ProgressFn, ReplayPlan, RunRecord, Runtime
from lanequeue.replay.runtimes.threads import ThreadRuntime

__all__ = [
    "RUNTIMES",
    "ProgressFn",
    "ReplayPlan",
    "RunRecord",
    "Runtime",
    "check_runtime",
    "get_runtime",
]

#: Runtime name -> factory. ``lanequeue replay --runtime NAME`` picks one. A runtime
#: decides how requests wait (threads blocking, tasks awaiting) and builds its own queue
#: of lanes from the plan (``build_thread_queue``, ``build_async_queue``).
RUNTIMES: dict[str, Callable[[], Runtime]] = {
    "threads": ThreadRuntime,
    "asyncio": AsyncioRuntime,
}


def get_runtime(name: str) -> Runtime:
    """The runtime called ``name``.

    Raises:
        ValueError: no such runtime (the message lists the available ones).
    """
    check_runtime(name)
    return RUNTIMES[name]()


def check_runtime(name: str) -> None:
    """Check that a runtime called ``name`` exists.

    Raises:
        ValueError: no such runtime (the message lists the available ones).
    """
    if name not in RUNTIMES:
        raise ValueError(f"unknown runtime {name!r}; available: {', '.join(sorted(RUNTIMES))}")
