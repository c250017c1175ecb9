"""Runtimes: the pluggable piece that drives a replay plan through real lanes.

A runtime takes a :class:`ReplayPlan` (arrival and work times in scaled seconds, keys, the
policy's lanes), runs every request through real lanes, and returns a :class:`RunRecord`
of what its workers observed. Two exist: ``threads`` (here) and ``asyncio``
(:mod:`lanequeue.replay.runtime_asyncio`); another plugs in by adding an entry to
:data:`RUNTIMES`. With a backend (``--backend redis://...``), several worker processes
each run the thread driver (:func:`drive_threads`) on their share of the requests over
Redis lanes (:mod:`lanequeue.replay.runtime_redis`).

The thread runtime
==================
One dispatcher thread releases each request at its arrival time to a thread of its own;
that thread waits its turn at the :class:`~lanequeue.replay.observe.ArrivalGate`, blocks
in ``LaneQueue.acquire_all(key, ["session", "global"])``, sleeps for its work time, and
releases. Every waiting request is a thread blocked inside the real lanes, so the lanes'
own FIFO hand-off is what orders them: nothing in the harness queues requests on their
behalf.

Threads are reused: a thread whose request is done parks in an idle pool, and the
dispatcher hands the next arrival to an idle thread, starting a new one only when none is
idle. Starting a thread costs about 0.7 ms on a small VM, which would delay the arrivals of
a burst (the trace's arrivals come in batches of ten or so); handing over to a parked thread
costs a lock release. Threads alive = the most requests in flight at once (waiting or
working): about 100 for the default trace and cap; with ``global-serial`` the backlog, and
so the thread count, grows with the trace, so use ``--limit`` there.
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass, field
from itertools import pairwise
from typing import Any, Protocol, TypeVar

from lanequeue import Lane, LaneQueue, SessionLane
from lanequeue._face import SessionKind
from lanequeue.replay.observe import ArrivalGate, Observer
from lanequeue.replay.policy import LaneSpec

__all__ = [
    "RUNTIMES",
    "LaneRegistry",
    "ProgressFn",
    "ReplayPlan",
    "RunRecord",
    "Runtime",
    "ThreadDrive",
    "ThreadRuntime",
    "add_plan_lanes",
    "build_thread_queue",
    "drive_threads",
    "get_runtime",
]

#: ``progress(done, total)``: requests completed so far out of ``total``.
ProgressFn = Callable[[int, int], None]


@dataclass(frozen=True)
class ReplayPlan:
    """What to replay, in scaled seconds (trace time divided by the speed).

    Attributes:
        arrival_s: arrival time of each request, seconds after the start of the replay,
            non-decreasing (requests are in arrival order).
        work_s: how long each request works once it holds every lane, seconds.
        keys: the session key of each request.
        lanes: the lanes every request takes, in acquisition (= registration) order.
        max_sessions: soft cap of a per-key lane's registry (entries).
        idle_timeout_s: seconds an idle per-key entry is kept; None keeps it for ever.
    """

    arrival_s: Sequence[float]
    work_s: Sequence[float]
    keys: Sequence[str]
    lanes: Sequence[LaneSpec]
    max_sessions: int = 256
    idle_timeout_s: float | None = 3600.0

    def __post_init__(self) -> None:
        n = len(self.arrival_s)
        if len(self.work_s) != n or len(self.keys) != n:
            raise ValueError("arrival_s, work_s and keys must have the same length")
        if not self.lanes:
            raise ValueError("a plan needs at least one lane")
        if any(b < a for a, b in pairwise(self.arrival_s)):
            raise ValueError("arrival_s must be non-decreasing (requests in arrival order)")


@dataclass
class RunRecord:
    """What the workers of one run observed. Times are seconds after the replay's start.

    Attributes:
        dispatch_s: when the dispatcher actually released each request (>= its arrival).
        start_s: when each request started work (held every lane).
        complete_s: when each request had released its lanes.
        start_order: request indices in the order their work started.
        max_key_concurrency: most workers of one key working at once.
        peak_global: most workers working at once.
        registry_peak: largest per-key registry size sampled (None: no per-key lane).
        registry_final: registry size after the run (None: no per-key lane).
        wall_s: seconds from the replay's start to the last completion.
        held_back: requests that waited at the arrival gate for a predecessor.
        threads: worker threads the runtime started (0 for a runtime without threads).
        lane_stats: each lane's own counters after the run (informative only).
        errors: (request index, error text) for requests that failed.
        workers: worker processes that drove the requests (1 for an in-process runtime).
        backend: where the lanes live: None in process, else the backend's URL (without
            its password).
        worker_of: the worker process of each request (None for an in-process runtime).
        backend_info: the backend's own figures (JSON-ready; empty in process).
    """

    dispatch_s: list[float]
    start_s: list[float]
    complete_s: list[float]
    start_order: list[int]
    max_key_concurrency: int
    peak_global: int
    registry_peak: int | None
    registry_final: int | None
    wall_s: float
    held_back: int = 0
    threads: int = 0
    lane_stats: dict[str, dict[str, int]] = field(default_factory=dict)
    errors: list[tuple[int, str]] = field(default_factory=list)
    workers: int = 1
    backend: str | None = None
    worker_of: list[int] | None = None
    backend_info: dict[str, Any] = field(default_factory=dict)


class Runtime(Protocol):
    """A way to drive a plan through real lanes (threads or asyncio tasks)."""

    name: str

    def run(self, plan: ReplayPlan, progress: ProgressFn | None = None) -> RunRecord:
        """Replay ``plan`` in real time; call ``progress`` now and then; return the record."""
        ...


class LaneRegistry(Protocol):
    """What :func:`add_plan_lanes` needs of a queue: :class:`~lanequeue.LaneQueue` and
    :class:`~lanequeue.AsyncLaneQueue` both have it."""

    def add_lane(self, name: str, *, max_concurrent: int, timeout_s: float | None) -> object:
        """Register a counting lane."""
        ...

    def add_session_lane(
        self, name: str, *, max_sessions: int, idle_timeout_s: float, timeout_s: float | None
    ) -> object:
        """Register a per-key lane."""
        ...


Q = TypeVar("Q", bound=LaneRegistry)


def add_plan_lanes(
    queue: Q,
    lanes: Sequence[LaneSpec],
    *,
    max_sessions: int = 256,
    idle_timeout_s: float | None = 3600.0,
) -> Q:
    """Register ``lanes`` on ``queue`` in order (so they are taken in that order), all of
    them waiting without limit (``timeout_s=None``); return ``queue``.

    A per-key spec becomes a session lane (capacity must be 1), a counting spec a lane of
    ``capacity`` permits, of whichever face ``queue`` builds (threads or asyncio).
    """
    for spec in lanes:
        if spec.per_key:
            if spec.capacity != 1:
                raise ValueError(f"lane {spec.name!r}: a per-key lane has capacity 1")
            queue.add_session_lane(
                spec.name,
                max_sessions=max_sessions,
                idle_timeout_s=math.inf if idle_timeout_s is None else idle_timeout_s,
                timeout_s=None,
            )
        else:
            queue.add_lane(spec.name, max_concurrent=spec.capacity, timeout_s=None)
    return queue


def build_thread_queue(
    lanes: Sequence[LaneSpec], *, max_sessions: int = 256, idle_timeout_s: float | None = 3600.0
) -> LaneQueue:
    """A LaneQueue holding ``lanes`` (registered in order, so taken in order), all of them
    waiting without limit (``timeout_s=None``).

    A per-key spec becomes a :class:`~lanequeue.SessionLane` (capacity must be 1), a
    counting spec a :class:`~lanequeue.Lane` of ``capacity`` permits.
    """
    return add_plan_lanes(
        LaneQueue(), lanes, max_sessions=max_sessions, idle_timeout_s=idle_timeout_s
    )


def registry_probe(queue: Any, lane_names: Sequence[str]) -> Callable[[], int] | None:
    """A probe of the registry size (``session_count``) of the first per-key lane among
    ``lane_names`` (thread or asyncio face), or None when none is per-key."""
    for lane in map(queue.get_lane, lane_names):
        if isinstance(lane, SessionKind):
            found: SessionKind = lane
            return lambda: found.session_count
    return None


def _gate_for(
    queue: LaneQueue, spec: LaneSpec, keys: Sequence[str]
) -> tuple[list[Hashable], Callable[[Hashable], int]]:
    """Slots and the "how many are inside" probe of the first lane, for the ArrivalGate."""
    lane = queue[spec.name]
    if isinstance(lane, SessionLane):
        session = lane

        def inside_key(slot: Hashable) -> int:
            key = str(slot)
            # Holder first, then waiters (see ArrivalGate.wait_turn).
            return int(session.is_held(key)) + session.waiting_for(key)

        return list(keys), inside_key
    if isinstance(lane, Lane):
        counting = lane

        def inside_all(slot: Hashable) -> int:
            # Holders first, then waiters (see ArrivalGate.wait_turn).
            holders = counting.active_count
            return holders + counting.waiting

        return [None] * len(keys), inside_all
    raise TypeError(f"lane {spec.name!r}: unsupported lane type {type(lane).__name__}")


class _PooledThread:
    """A thread that runs one request after another, parking between two."""

    __slots__ = ("_next", "_wake")

    def __init__(self) -> None:
        self._next: int | None = None
        self._wake = threading.Lock()
        self._wake.acquire()  # held while idle; assign() releases it

    def assign(self, rid: int | None) -> None:
        """Give this parked thread request ``rid`` (None: exit)."""
        self._next = rid
        self._wake.release()

    def park(self) -> int | None:
        """Block until assigned; return the request (None: exit)."""
        self._wake.acquire()
        return self._next


class _ThreadPool:
    """Runs ``job(rid)`` on an idle parked thread, or on a new one if none is idle."""

    def __init__(self, job: Callable[[int], None]) -> None:
        self._job = job
        self._lock = threading.Lock()
        self._idle: list[_PooledThread] = []
        self._closed = False
        #: threads started so far (= most requests in flight at once)
        self.started = 0

    def submit(self, rid: int) -> None:
        """Run ``job(rid)`` on a thread of its own, now."""
        with self._lock:
            parked = self._idle.pop() if self._idle else None
        if parked is not None:
            parked.assign(rid)
            return
        self.started += 1  # only the dispatcher submits
        threading.Thread(
            target=self._loop,
            args=(_PooledThread(), rid),
            name=f"lanequeue-replay-{self.started}",
            daemon=True,
        ).start()

    def _loop(self, me: _PooledThread, rid: int | None) -> None:
        while rid is not None:
            self._job(rid)
            with self._lock:
                if self._closed:
                    return
                self._idle.append(me)
            rid = me.park()

    def close(self) -> None:
        """Let every parked thread exit; threads still busy exit when done."""
        with self._lock:
            self._closed = True
            idle, self._idle = self._idle, []
        for parked in idle:
            parked.assign(None)


@dataclass
class ThreadDrive:
    """What :func:`drive_threads` returns besides the observer's record.

    Attributes:
        dispatch_s: when each request was released, seconds after the epoch (NaN for the
            requests this driver did not drive).
        errors: (request index, error text) for requests that failed.
        threads: worker threads started.
        wall_s: seconds from the epoch to the last completion of the driven requests.
    """

    dispatch_s: list[float]
    errors: list[tuple[int, str]]
    threads: int
    wall_s: float


def drive_threads(
    plan: ReplayPlan,
    queue: LaneQueue,
    gate: ArrivalGate,
    observer: Observer,
    *,
    epoch: float,
    rids: Sequence[int] | None = None,
    clock: Callable[[], float] = time.monotonic,
    progress: ProgressFn | None = None,
    tick_s: float = 0.1,
) -> ThreadDrive:
    """Drive the requests ``rids`` of ``plan`` (default: all; in arrival order) on pooled
    threads through ``queue``, in real time from ``epoch`` (a ``clock`` reading).

    Each request is released at ``epoch + arrival``, waits its turn at ``gate``, holds
    every lane of the plan with ``acquire_all``, reports to ``observer``, sleeps its work
    time, releases, and tells ``gate`` it finished. ``progress(done, len(rids))`` is
    called every ``tick_s`` seconds. Returns once every driven request has finished.
    """
    n = len(plan.keys)
    mine = list(range(n)) if rids is None else list(rids)
    total = len(mine)
    keys = plan.keys
    work_s = plan.work_s
    lane_names = [spec.name for spec in plan.lanes]
    dispatch_s = [math.nan] * n
    errors: list[tuple[int, str]] = []
    done_lock = threading.Lock()
    done = [0]
    all_done = threading.Event()
    stop = threading.Event()
    if total == 0:
        all_done.set()

    def worker(rid: int) -> None:
        try:
            try:
                gate.wait_turn(rid)
                with queue.acquire_all(keys[rid], lane_names):
                    observer.work_started(rid)
                    try:
                        time.sleep(work_s[rid])
                    finally:
                        observer.work_ended(rid)
                observer.completed(rid)
            finally:
                gate.finished(rid)
        except BaseException as exc:  # reported, never silently lost
            with done_lock:
                errors.append((rid, f"{type(exc).__name__}: {exc}"))
        finally:
            with done_lock:
                done[0] += 1
                if done[0] == total:
                    all_done.set()

    def dispatcher() -> None:
        for rid in mine:
            delay = epoch + plan.arrival_s[rid] - clock()
            if delay > 0 and stop.wait(delay):
                return
            if stop.is_set():
                return
            dispatch_s[rid] = clock() - epoch
            pool.submit(rid)

    pool = _ThreadPool(worker)
    feeder = threading.Thread(target=dispatcher, name="lanequeue-replay-dispatch", daemon=True)
    feeder.start()
    try:
        while not all_done.wait(tick_s):
            if progress is not None:
                progress(done[0], total)
    except BaseException:
        stop.set()
        raise
    finally:
        pool.close()
    feeder.join()
    finished = [t for t in (observer.complete_s[rid] for rid in mine) if not math.isnan(t)]
    wall = max(finished) if len(finished) == total and total else max(0.0, clock() - epoch)
    if progress is not None:
        progress(total, total)
    return ThreadDrive(
        dispatch_s=dispatch_s, errors=sorted(errors), threads=pool.started, wall_s=wall
    )


class ThreadRuntime:
    """Real threads on real lanes: one thread per request in flight, from its arrival."""

    name = "threads"

    def __init__(self, *, lead_s: float = 0.02, tick_s: float = 0.1) -> None:
        """``lead_s``: seconds between setting up and the first arrival; ``tick_s``:
        seconds between two progress reports."""
        self._lead_s = lead_s
        self._tick_s = tick_s

    def run(self, plan: ReplayPlan, progress: ProgressFn | None = None) -> RunRecord:
        """Replay ``plan`` on threads in real time (see the module docstring)."""
        keys = plan.keys
        lane_names = [spec.name for spec in plan.lanes]
        queue = build_thread_queue(
            plan.lanes, max_sessions=plan.max_sessions, idle_timeout_s=plan.idle_timeout_s
        )
        registry = registry_probe(queue, lane_names)
        slots, inside = _gate_for(queue, plan.lanes[0], keys)
        gate = ArrivalGate(slots, inside)
        clock = time.monotonic
        epoch = clock() + self._lead_s
        observer = Observer(keys, epoch_s=epoch, clock=clock, registry_size=registry)
        drive = drive_threads(
            plan, queue, gate, observer,
            epoch=epoch, clock=clock, progress=progress, tick_s=self._tick_s,
        )
        registry_final = observer.sample_registry()
        return RunRecord(
            dispatch_s=drive.dispatch_s,
            start_s=observer.start_s,
            complete_s=observer.complete_s,
            start_order=observer.start_order,
            max_key_concurrency=observer.max_key_concurrency,
            peak_global=observer.peak_global,
            registry_peak=observer.registry_peak,
            registry_final=registry_final,
            wall_s=drive.wall_s,
            held_back=gate.held_back,
            threads=drive.threads,
            lane_stats={name: queue[name].stats.to_dict() for name in lane_names},
            errors=drive.errors,
        )


def _asyncio_runtime() -> Runtime:
    # Imported on use: that module builds on this one (plan, record, lane registration).
    from lanequeue.replay.runtime_asyncio import AsyncioRuntime

    return AsyncioRuntime()


#: Runtime name -> factory. ``lanequeue replay --runtime NAME`` picks one. A runtime
#: decides how requests wait (threads blocking, tasks awaiting); each builds its own
#: in-process queue (:func:`build_thread_queue`, ``build_async_queue``), which is the
#: seam for another lane backend.
RUNTIMES: dict[str, Callable[[], Runtime]] = {
    "threads": ThreadRuntime,
    "asyncio": _asyncio_runtime,
}


def get_runtime(name: str) -> Runtime:
    """The runtime called ``name``.

    Raises:
        ValueError: no such runtime (the message lists the available ones).
    """
    factory = RUNTIMES.get(name)
    if factory is None:
        raise ValueError(f"unknown runtime {name!r}; available: {', '.join(sorted(RUNTIMES))}")
    return factory()
