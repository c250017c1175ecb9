"""lanequeue: run one conversation's work strictly in order, different conversations in
parallel, under global caps: for threads, asyncio and several processes (Redis).

- :class:`Lane`: a counting lane (at most ``max_concurrent`` holders, FIFO).
- :class:`SessionLane`: per-key mutual exclusion (same key serial in arrival order,
  different keys parallel), entries created lazily, evicted when idle, soft-capped.
- :class:`LaneQueue`: named lanes composed per request with ``acquire_all``.
- :class:`AsyncLane`, :class:`AsyncSessionLane`, :class:`AsyncLaneQueue`: the same for
  asyncio tasks; ``lanequeue.redis`` has the same lanes shared through Redis.
- :mod:`lanequeue.contract`: the one surface of every lane and hold on every face
  (:class:`SyncLane`, :class:`TaskLane`, :class:`SyncHold`, :class:`TaskHold`).

Example:

    >>> from lanequeue import build_default_lanes, build_gateway_session_key
    >>> lanes = build_default_lanes()
    >>> key = build_gateway_session_key("slack", "C12345", "U789", thread_id="1234567890.123456")
    >>> key
    'gateway:slack:c12345:u789:1234567890_123456'
    >>> with lanes.acquire_all(key, ["session", "global"]):
    ...     lanes["session"].is_held(key)   # the reply to this message is made here
    True
"""

from ._core import LaneStats
from ._errors import (
    DispatcherDrainingError,
    LaneBackendError,
    LaneClearedError,
    LaneDrainingError,
    LaneError,
    LaneTimeoutError,
    LeaseLostError,
    NotOwnerError,
    TurnCancelledError,
    TurnDedupedError,
    TurnDroppedError,
    TurnError,
    TurnRejectedError,
    TurnTimedOutError,
)
from ._kinds import (
    DEFAULT_GLOBAL_CONCURRENCY,
    DEFAULT_IDLE_TIMEOUT_S,
    DEFAULT_MAX_CONCURRENT,
    DEFAULT_MAX_SESSIONS,
    DEFAULT_TIMEOUT_S,
    DEFAULT_WARN_AFTER_S,
    Hold,
)
from ._obs import HistogramSnapshot, LaneMetrics, StuckHold
from .aio import (
    AsyncHold,
    AsyncLane,
    AsyncLaneQueue,
    AsyncSessionLane,
    build_default_async_lanes,
)
from .contract import (
    LaneBackend,
    LaneHold,
    LaneView,
    MustAwait,
    SyncCountingLane,
    SyncHold,
    SyncLane,
    SyncSessionLane,
    TaskCountingLane,
    TaskHold,
    TaskLane,
    TaskSessionLane,
)
from .dispatch import (
    Dispatcher,
    DispatchStats,
    ThreadDispatcher,
    Ticket,
    Turn,
    current_turn,
)
from .keys import (
    build_gateway_session_key,
    build_scheduler_session_key,
    build_subagent_session_key,
    normalize_key_part,
)
from .lanes import Lane, SessionLane, ThreadHold
from .queue import LaneQueue, MultiHold, build_default_lanes


def _version() -> str:
    """The installed distribution's version; ``"0+unknown"`` when lanequeue is imported
    from a source tree that was never installed."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("lanequeue")
    except PackageNotFoundError:
        return "0+unknown"


#: The version of the installed distribution (from its metadata, so it is the one
#: ``pyproject.toml`` declares); ``"0+unknown"`` when not installed.
__version__ = _version()

__all__ = [
    "AsyncHold",
    "AsyncLane",
    "AsyncLaneQueue",
    "AsyncSessionLane",
    "DEFAULT_GLOBAL_CONCURRENCY",
    "DEFAULT_IDLE_TIMEOUT_S",
    "DEFAULT_MAX_CONCURRENT",
    "DEFAULT_MAX_SESSIONS",
    "DEFAULT_TIMEOUT_S",
    "DEFAULT_WARN_AFTER_S",
    "HistogramSnapshot",
    "Hold",
    "Lane",
    "LaneBackend",
    "LaneBackendError",
    "LaneClearedError",
    "LaneDrainingError",
    "LaneError",
    "LaneHold",
    "LaneMetrics",
    "LaneQueue",
    "LaneStats",
    "LaneTimeoutError",
    "LaneView",
    "LeaseLostError",
    "MultiHold",
    "MustAwait",
    "NotOwnerError",
    "SessionLane",
    "StuckHold",
    "SyncCountingLane",
    "SyncHold",
    "SyncLane",
    "SyncSessionLane",
    "TaskCountingLane",
    "TaskHold",
    "TaskLane",
    "TaskSessionLane",
    "ThreadHold",
    "build_default_async_lanes",
    "build_default_lanes",
    "build_gateway_session_key",
    "build_scheduler_session_key",
    "build_subagent_session_key",
    "normalize_key_part",
    # the dispatcher
    "DispatchStats",
    "Dispatcher",
    "DispatcherDrainingError",
    "ThreadDispatcher",
    "Ticket",
    "Turn",
    "TurnCancelledError",
    "TurnDedupedError",
    "TurnDroppedError",
    "TurnError",
    "TurnRejectedError",
    "TurnTimedOutError",
    "current_turn",
]
