"""Replay a production request trace through real lanes: ``lanequeue replay``.

The pieces, each in its own module:

- :mod:`~lanequeue.replay.trace`: read a trace (the Mooncake conversation format, or the
  generic JSON-lines/CSV format of gateway logs; plain or gzip; the bundled one by
  default), reporting bad lines by number.
- :mod:`~lanequeue.replay._checks`: the range checks of every setting
  (:class:`SettingError` names the refused one).
- :mod:`~lanequeue.replay.policy`: which lanes a request takes (``session`` or the
  original ``global-serial``), as data.
- :mod:`~lanequeue.replay.simulate`: the exact discrete-event simulation of
  ``acquire_all`` over those lanes (the ideal schedule).
- :mod:`~lanequeue.replay.runtimes`: runtimes that drive the requests through real lanes
  (``threads``, ``asyncio``, and worker processes sharing Redis lanes), with
  :mod:`~lanequeue.replay.observe` recording what workers see.
- :mod:`~lanequeue.replay.runner`: :func:`run_replay`, tying them together;
  :mod:`~lanequeue.replay.report` and :mod:`~lanequeue.replay.plot` present the result.

Example: the first 500 requests of the bundled trace, 600 times faster than real time
(under a second):

    >>> from lanequeue.replay import ReplayConfig, read_trace, run_replay
    >>> trace = read_trace().head(500)
    >>> result = run_replay(trace, ReplayConfig(speed=600))
    >>> result.report.requests, result.report.failed_checks()
    (500, [])
    >>> print(result.report.table())  # doctest: +ELLIPSIS +NORMALIZE_WHITESPACE
    lanequeue replay: lanequeue/data/mooncake_conversation_trace.jsonl.gz (bundled)
    policy session, runtime threads, global cap 64, speed 600x, 30 ms per output token
    <BLANKLINE>
    metric replay ideal
    ...
    order_violations 0 0
    ...
"""

from lanequeue.replay._checks import SettingError
from lanequeue.replay.policy import DEFAULT_POLICY, POLICIES, LaneSpec, policy_lanes
from lanequeue.replay.report import JSON_KEYS, ReplayReport, percentile
from lanequeue.replay.runner import (
    ReplayConfig,
    ReplayResult,
    make_plan,
    run_replay,
    session_key,
    simulate_trace,
)
from lanequeue.replay.runtimes import RUNTIMES, ReplayPlan, RunRecord, Runtime, get_runtime
from lanequeue.replay.simulate import Schedule, simulate
from lanequeue.replay.trace import (
    SkippedLine,
    Trace,
    TraceError,
    TraceRequest,
    parse_trace_lines,
    read_trace,
)

__all__ = [
    "DEFAULT_POLICY",
    "JSON_KEYS",
    "POLICIES",
    "RUNTIMES",
    "LaneSpec",
    "ReplayConfig",
    "ReplayPlan",
    "ReplayReport",
    "ReplayResult",
    "RunRecord",
    "Runtime",
    "Schedule",
    "SettingError",
    "SkippedLine",
    "Trace",
    "TraceError",
    "TraceRequest",
    "get_runtime",
    "make_plan",
    "parse_trace_lines",
    "percentile",
    "policy_lanes",
    "read_trace",
    "run_replay",
    "session_key",
    "simulate",
    "simulate_trace",
]
