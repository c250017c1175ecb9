"""``run_replay``: a trace, a policy and a runtime in; a :class:`ReplayReport` out."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, replace
from fractions import Fraction
from typing import Any

from lanequeue import DEFAULT_IDLE_TIMEOUT_S, DEFAULT_MAX_SESSIONS, build_gateway_session_key
from lanequeue.replay._checks import (
    SettingError,
    check_count,
    check_seconds,
    check_speed,
    check_tpot_ms,
)
from lanequeue.replay.observe import count_order_violations, peak_concurrency
from lanequeue.replay.policy import DEFAULT_POLICY, POLICIES, LaneSpec, policy_lanes
from lanequeue.replay.report import ReplayReport, percentile
from lanequeue.replay.runtimes import (
    ProgressFn,
    ReplayPlan,
    RunRecord,
    Runtime,
    check_runtime,
    get_runtime,
)
from lanequeue.replay.runtimes.base import check_workers
from lanequeue.replay.runtimes.redis_processes import DRIVERS
from lanequeue.replay.runtimes.threads import ThreadRuntime
from lanequeue.replay.simulate import Schedule, simulate
from lanequeue.replay.trace import DEFAULT_TPOT_MS, Trace, service_times_us

__all__ = [
    "DEFAULT_GLOBAL_CAP",
    "DEFAULT_RUNTIME",
    "DEFAULT_SPEED",
    "DEFAULT_TPOT_MS",
    "ReplayConfig",
    "ReplayResult",
    "make_plan",
    "peak_concurrency",
    "run_replay",
    "session_key",
    "simulate_trace",
]

#: Permits of the replay's "global" lane: requests working at once.
DEFAULT_GLOBAL_CAP = 64
#: Trace time is divided by this: the bundled hour plays in a minute.
DEFAULT_SPEED = 60.0
#: The runtime used when none is named.
DEFAULT_RUNTIME = ThreadRuntime.name


@dataclass(frozen=True)
class ReplayConfig:
    """How to replay a trace.

    Attributes:
        policy: ``"session"`` or ``"global-serial"`` (see :func:`policy_lanes`).
        global_cap: permits of the "global" lane (requests working at once).
        speed: trace time is divided by this (60: an hour of trace plays in a minute).
        tpot_ms: work per output token in trace milliseconds (before dividing by speed),
            for the requests that give tokens; None: 30 for a Mooncake trace, and a generic
            trace whose lines give ``output_tokens`` must name it (as ``lanequeue plan``;
            see :func:`lanequeue.replay.trace.service_times_us`).
        runtime: name of the runtime (:data:`lanequeue.replay.runtimes.RUNTIMES`); None
            (the default): ``threads``, or ``asyncio`` with ``busy`` or a ``backend``.
            With a backend it names how each worker process drives its share
            (``asyncio`` or ``threads``). After construction it is always the runtime's
            name.
        max_sessions: soft cap of the session lane's registry, entries.
        idle_timeout_s: seconds of *trace* time an idle session entry is kept (divided by
            ``speed`` like every other duration); None keeps entries for ever.
        backend: None: in-process lanes; ``"redis://HOST[:PORT][/DB]"``: Redis lanes driven
            by ``workers`` processes, each running ``runtime``
            (:mod:`lanequeue.replay.runtimes.redis_processes`).
        workers: worker processes sharing the backend's lanes (> 1 needs a backend).
        limit: replay only the first ``limit`` requests in arrival order (None: all).
        busy: None: the requests take the lanes directly; else they are submitted to a
            Dispatcher (``replay --busy``): a busy policy, a comma-separated list of them,
            or ``"all"``. That replay runs one process on asyncio under the ``session``
            policy's lanes, so ``busy`` refuses (SettingError naming the other setting)
            a ``policy`` other than ``session``, a ``runtime`` other than ``asyncio``, a
            ``backend`` and ``workers > 1``.

    Every setting is checked here, once (the command line passes its options straight
    through): ``speed`` from 1e-6 to 1e6; ``tpot_ms`` from 0 to 60,000; ``global_cap``,
    ``max_sessions`` and ``limit`` integers from 1 to 10**9; ``workers`` from 1 to 1024;
    ``idle_timeout_s`` from 0 to 1e9 seconds (see :mod:`lanequeue.replay._checks`).

    Raises:
        TypeError: a setting of the wrong type.
        ValueError: a setting out of range (NaN and infinities included: a
            :class:`~lanequeue.replay._checks.SettingError` naming it), an unknown policy
            or runtime, ``workers > 1`` without a backend, a backend with a runtime other
            than ``asyncio`` or ``threads``, or a setting ``busy`` cannot honour (see
            ``busy``).
    """

    policy: str = DEFAULT_POLICY
    global_cap: int = DEFAULT_GLOBAL_CAP
    speed: float = DEFAULT_SPEED
    tpot_ms: float | None = None
    runtime: str | None = None
    max_sessions: int = DEFAULT_MAX_SESSIONS
    idle_timeout_s: float | None = DEFAULT_IDLE_TIMEOUT_S
    backend: str | None = None
    workers: int = 1
    limit: int | None = None
    busy: str | None = None

    @property
    def busy_policies(self) -> list[str]:
        """The busy policies ``busy`` names, in order (empty without ``busy``)."""
        from lanequeue.dispatch import BUSY_POLICIES

        if self.busy is None:
            return []
        return list(BUSY_POLICIES) if self.busy == "all" else self.busy.split(",")

    def __post_init__(self) -> None:
        if self.runtime is None:  # frozen: set once, here
            object.__setattr__(self, "runtime", "asyncio" if self.busy is not None
                               or self.backend is not None else DEFAULT_RUNTIME)
        check_speed(self.speed)
        check_tpot_ms(self.tpot_ms)
        check_count(self.global_cap, "global_cap")
        check_count(self.max_sessions, "max_sessions")
        if self.limit is not None:
            check_count(self.limit, "limit")
        if self.idle_timeout_s is not None:
            check_seconds(self.idle_timeout_s, "idle_timeout_s")
        check_workers(self.workers)
        try:
            check_runtime(str(self.runtime))
        except ValueError as exc:
            raise SettingError("runtime", str(exc)) from None
        if self.policy not in POLICIES:
            raise SettingError(
                "policy", f"unknown policy {self.policy!r}; choose from {', '.join(POLICIES)}"
            )
        self._check_busy()
        if self.backend is None and self.workers != 1:
            raise SettingError(
                "workers", "workers > 1 needs a shared backend: worker processes share "
                "lanes only through one (e.g. backend='redis://127.0.0.1:6379/0')"
            )
        if self.backend is not None and self.runtime not in DRIVERS:
            raise ValueError(
                f"runtime {self.runtime!r} cannot run on a backend: each worker process of "
                f"the Redis backend runs {' or '.join(DRIVERS)}"
            )

    def _check_busy(self) -> None:
        """The settings a dispatcher replay (``busy``) cannot honour are refused, each
        naming the setting: it runs one process on asyncio, under the session policy."""
        from lanequeue.dispatch import BUSY_POLICIES

        if self.busy is None:
            return
        if not isinstance(self.busy, str):
            raise TypeError(f"busy must be a str or None, got {self.busy!r}")
        for p in self.busy_policies:
            if p not in BUSY_POLICIES:
                raise SettingError("busy", f"unknown busy policy {p!r}; available: "
                                           f"{', '.join(BUSY_POLICIES)}, or all")
        refused = [  # (setting, refused, what, why)
            ("policy", self.policy != DEFAULT_POLICY, f"policy {self.policy!r}",
             f"a busy replay takes the {DEFAULT_POLICY} policy's lanes, not "
             f"{self.policy!r}"),
            ("runtime", self.runtime != "asyncio", f"runtime {self.runtime!r}",
             f"a busy replay runs the dispatcher on asyncio, not {self.runtime!r}"),
            ("backend", self.backend is not None, "a backend",
             "a busy replay runs one process, on in-process lanes"),
            ("workers", self.workers != 1, "workers",
             f"a busy replay runs one process, not {self.workers}"),
        ]
        for setting, bad, what, why in refused:
            if bad:
                raise SettingError(setting, f"busy cannot be combined with {what}: {why}",
                                   excluded_by="busy", reason=why)

    @property
    def lanes(self) -> tuple[LaneSpec, ...]:
        """The policy's lanes, in acquisition order."""
        return policy_lanes(self.policy, self.global_cap)


@dataclass
class ReplayResult:
    """A replay's report with the material it was computed from.

    Attributes:
        report: the figures.
        plan: what was replayed (scaled seconds).
        record: what the workers observed.
        ideal: the exact simulation, in scaled seconds.
    """

    report: ReplayReport
    plan: ReplayPlan
    record: RunRecord
    ideal: Schedule


def session_key(conversation: int) -> str:
    """The session key of a trace conversation, as a gateway would build it:
    ``build_gateway_session_key("trace", str(conversation))``, e.g. ``"gateway:trace:42"``."""
    return build_gateway_session_key("trace", str(conversation))


def make_plan(trace: Trace, config: ReplayConfig) -> ReplayPlan:
    """The trace in scaled seconds: arrival = (timestamp - first timestamp) / 1000 / speed,
    work = service time (:func:`~lanequeue.replay.trace.service_times_us`) / speed.

    Raises:
        ValueError: the trace gives ``output_tokens`` in the generic format and
            ``config.tpot_ms`` is None.
    """
    reqs = trace.requests
    t0 = reqs[0].timestamp_ms if reqs else 0
    scale = 1000.0 * config.speed
    work_us, _ = service_times_us(trace, config.tpot_ms)
    return ReplayPlan(
        arrival_s=[(r.timestamp_ms - t0) / scale for r in reqs],
        work_s=[w / 1e6 / config.speed for w in work_us],
        keys=[session_key(r.conversation) for r in reqs],
        lanes=config.lanes,
        max_sessions=config.max_sessions,
        idle_timeout_s=None
        if config.idle_timeout_s is None
        else config.idle_timeout_s / config.speed,
    )


def simulate_trace(trace: Trace, config: ReplayConfig) -> Schedule:
    """The exact ideal schedule of ``trace`` under ``config``'s policy, in scaled seconds.

    Simulated in trace milliseconds with exact arithmetic, then divided by
    ``1000 * speed`` (dividing every time by one constant changes no decision).
    """
    reqs = trace.requests
    t0 = Fraction(reqs[0].timestamp_ms) if reqs else Fraction(0)
    work_us, _ = service_times_us(trace, config.tpot_ms)
    sched = simulate(
        [Fraction(r.timestamp_ms) - t0 for r in reqs],
        [r.conversation for r in reqs],
        [Fraction(w, 1000) for w in work_us],
        config.lanes,
    )
    scale = 1000 * Fraction(config.speed)
    return Schedule(
        arrival=tuple(t / scale for t in sched.arrival),
        start=tuple(t / scale for t in sched.start),
        end=tuple(t / scale for t in sched.end),
        grants=tuple(tuple(t / scale for t in g) for g in sched.grants),
        start_order=sched.start_order,
    )


def run_replay(
    trace: Trace,
    config: ReplayConfig | None = None,
    *,
    progress: ProgressFn | None = None,
    on_queue: Callable[[Any], object] | None = None,
) -> ReplayResult:
    """Replay ``trace`` through real lanes in real time and measure it.

    Each request arrives at its trace time divided by ``config.speed``, takes the lanes
    ``["session", "global"]`` with ``acquire_all`` under its conversation's key, works for
    its service time / ``speed`` (``duration_s``, or ``output_tokens * tpot_ms``), then
    releases. Only the first ``config.limit`` requests are replayed when it is set. The
    same requests are also simulated exactly (:func:`simulate_trace`) for the ``ideal_*``
    figures.

    Args:
        trace: the requests (see :func:`lanequeue.replay.read_trace`).
        config: the settings; defaults to :class:`ReplayConfig()`.
        progress: called now and then with (completed, total).
        on_queue: called with the queue of in-process lanes once it is built, before the
            first request (``lanequeue replay --metrics-port`` attaches its Prometheus
            collector there). In-process runtimes only.

    Returns:
        The report and the data behind it. Takes about the trace's duration / speed.

    Raises:
        ValueError: an unknown runtime or policy, bad settings, ``on_queue`` with a
            backend, or a generic trace giving ``output_tokens`` with ``tpot_ms`` None.
        lanequeue.replay.runtimes.redis_processes.BackendError: with a backend: the server cannot be
            reached, or a worker process failed.
    """
    config = config or ReplayConfig()
    trace = trace.head(config.limit)
    _, tpot_ms = service_times_us(trace, config.tpot_ms)
    if on_queue is not None and config.backend is not None:
        raise ValueError("on_queue: the lanes of a backend live in the worker processes")
    runtime: Runtime
    if config.backend is not None:
        from lanequeue.replay.runtimes.redis_processes import RedisProcessRuntime

        assert config.runtime is not None  # set by __post_init__
        runtime = RedisProcessRuntime(config.backend, config.workers, driver=config.runtime)
    else:
        assert config.runtime is not None  # set by __post_init__
        runtime = get_runtime(config.runtime)
    plan = make_plan(trace, config)
    if on_queue is not None:
        plan = replace(plan, on_queue=on_queue)
    ideal = simulate_trace(trace, config)
    record = runtime.run(plan, progress)

    n = len(trace.requests)
    pairs = zip(record.start_s, plan.arrival_s, strict=True)
    waits = [s - a for s, a in pairs if not math.isnan(s)]
    done = [t for t in record.complete_s if not math.isnan(t)]
    makespan = (max(done) - plan.arrival_s[0]) if done else 0.0
    ideal_waits = [float(w) for w in ideal.waits]
    ideal_makespan = float(ideal.makespan)
    pairs = zip(record.dispatch_s, plan.arrival_s, strict=True)
    lags = [d - a for d, a in pairs if not math.isnan(d)]
    report = ReplayReport(
        requests=n,
        conversations=trace.conversations,
        skipped_lines=len(trace.skipped),
        wall_s=record.wall_s,
        throughput_rps=n / record.wall_s if record.wall_s > 0 else 0.0,
        wait_p50_s=percentile(waits, 50),
        wait_p95_s=percentile(waits, 95),
        wait_p99_s=percentile(waits, 99),
        wait_max_s=max(waits) if waits else math.nan,
        order_violations=count_order_violations(
            [r.conversation for r in trace.requests], record.start_order
        ),
        max_key_concurrency=record.max_key_concurrency,
        peak_global=record.peak_global,
        registry_peak=record.registry_peak,
        registry_final=record.registry_final,
        ideal_makespan_s=ideal_makespan,
        makespan_ratio=makespan / ideal_makespan if ideal_makespan > 0 else None,
        makespan_s=makespan,
        ideal_wait_p50_s=percentile(ideal_waits, 50),
        ideal_wait_p95_s=percentile(ideal_waits, 95),
        ideal_wait_p99_s=percentile(ideal_waits, 99),
        ideal_wait_max_s=max(ideal_waits) if ideal_waits else math.nan,
        ideal_peak_global=peak_concurrency(ideal.start, ideal.end),
        dispatch_lag_max_s=max(lags) if lags else 0.0,
        gate_held_back=record.held_back,
        worker_threads=record.threads,
        policy=config.policy,
        runtime=runtime.name,
        global_cap=config.global_cap,
        speed=config.speed,
        tpot_ms=tpot_ms,
        source=trace.source,
        errors=len(record.errors),
        lane_stats=record.lane_stats,
        workers=record.workers,
        backend=record.backend,
        backend_info=record.backend_info,
    )
    return ReplayResult(report=report, plan=plan, record=record, ideal=ideal)
