"""lanequeue: run one conversation's work strictly in order, different conversations in
parallel, under global caps: for threads, asyncio and several processes (Redis).

- :class:`Lane`: a counting lane (at most ``max_concurrent`` holders, FIFO).
- :class:`SessionLane`: per-key mutual exclusion (same key serial in arrival order,
  different keys parallel), entries created lazily, evicted when idle, soft-capped.
- :class:`LaneQueue`: named lanes composed per request with ``acquire_all``.
- :class:`AsyncLane`, :class:`AsyncSessionLane`, :class:`AsyncLaneQueue`: the same for
  asyncio tasks; ``lanequeue.redis`` has the same lanes shared through Redis.

Example::

    from lanequeue import build_default_lanes, build_gateway_session_key

    lanes = build_default_lanes()
    key = build_gateway_session_key("slack", "C12345", "U789", thread_id="1234567890.123456")
    with lanes.acquire_all(key, ["session", "global"]):
        reply = handle(message)
"""

from ._core import LaneStats
from ._errors import (
    DispatcherDrainingError,
    LaneBackendError,
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
from ._face import (
    DEFAULT_GLOBAL_CONCURRENCY,
    DEFAULT_IDLE_TIMEOUT_S,
    DEFAULT_MAX_CONCURRENT,
    DEFAULT_MAX_SESSIONS,
    DEFAULT_TIMEOUT_S,
    Hold,
)
from .aio import (
    AsyncHold,
    AsyncLane,
    AsyncLaneQueue,
    AsyncSessionLane,
    build_default_async_lanes,
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

__version__ = "0.1.0"

__all__ = [
    "AsyncHold",
    "AsyncLane",
    "AsyncLaneQueue",
    "AsyncSessionLane",
    "build_default_async_lanes",
    "DEFAULT_GLOBAL_CONCURRENCY",
    "DEFAULT_IDLE_TIMEOUT_S",
    "DEFAULT_MAX_CONCURRENT",
    "DEFAULT_MAX_SESSIONS",
    "DEFAULT_TIMEOUT_S",
    "Hold",
    "Lane",
    "LaneBackendError",
    "LaneError",
    "LaneQueue",
    "LaneStats",
    "LaneTimeoutError",
    "LeaseLostError",
    "MultiHold",
    "NotOwnerError",
    "SessionLane",
    "ThreadHold",
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
