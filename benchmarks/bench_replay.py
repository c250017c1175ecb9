"""``replay`` section: how fast the bundled trace replays on real lanes, and what the
library costs per replayed request.

Figures:

- for each in-process runtime (``threads``, ``asyncio``): the highest ``--speed`` at which
  the replay of the bundled trace (12,031 requests) keeps ``makespan_ratio <= 1.05`` in 2
  runs out of 2. A bounded search over a ladder of speeds: it starts at 4,000, climbs
  while both runs pass and stops at the first speed that misses (it goes down instead when
  4,000 misses). The goal speed (threads 8,000, asyncio 16,000) is always run, and its two
  ratios are printed: a ratio far above 1 there means a stall, not a shortfall.
- the reference for each runtime: the same search, on the same harness, with the standard
  library's primitives in place of the lanes (:class:`_AsyncReference`: a dict of
  ``asyncio.Lock`` per key and one ``asyncio.Semaphore`` of the global cap;
  :class:`_ThreadReference`: ``threading.Lock`` and ``threading.Semaphore``, with no
  arrival gate, since those locks keep no order to gate). Neither keeps FIFO order under
  contention, a token, a metric or an interrupt-safe commit, so the reference is what the
  machine and the harness allow, not a like-for-like rival: a goal the reference misses
  is out of this machine's reach for any lane.
- the CPU per replayed request, split in two, for each runtime at speed 2,000 (a pace
  both runtimes keep): the library's (every step of ``acquire_all``'s enter and exit,
  timed with ``time.thread_time`` on the thread that runs it; for asyncio each step of the
  awaitable is timed, so the loop's own work between two steps is not counted) and the
  rest (the process's CPU per request in a plain run, minus the library's): the runtime,
  the arrival gate, the observer, the event loop or the threads' wake-ups.

Each replay is ``runtime.run(plan)`` on the plan ``lanequeue replay`` builds
(``make_plan``); the ideal makespan is simulated once, exactly, and scaled by the speed
(dividing every time by a constant changes no decision), so a run costs the trace's
duration / speed plus setting up. The whole section takes about a minute; with
``--quick`` it measures only the CPU split on the first 3,000 requests.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import sys
import threading
import time
from collections.abc import AsyncIterator, Callable, Generator, Iterator
from pathlib import Path
from typing import Any

_HERE = Path(__file__).resolve().parent
if str(_HERE) not in sys.path:
    sys.path.insert(0, str(_HERE))
try:
    import lanequeue  # noqa: F401
except ImportError:  # not installed: use the source tree
    sys.path.insert(0, str(_HERE.parent / "src"))

from bench_common import Config, Row, median  # noqa: E402

from lanequeue.replay import read_trace  # noqa: E402
from lanequeue.replay.observe import Observer  # noqa: E402
from lanequeue.replay.runner import ReplayConfig, make_plan, simulate_trace  # noqa: E402
from lanequeue.replay.runtimes import aio as aio_runtime  # noqa: E402
from lanequeue.replay.runtimes import get_runtime  # noqa: E402
from lanequeue.replay.runtimes import threads as thread_runtime  # noqa: E402
from lanequeue.replay.runtimes.base import ReplayPlan, settle_heap  # noqa: E402
from lanequeue.replay.trace import Trace  # noqa: E402

RATIO_LIMIT = 1.05
GOAL_SPEED = {"threads": 8_000.0, "asyncio": 16_000.0}
LADDER = [1_000.0, 2_000.0, 3_000.0, 4_000.0, 6_000.0, 8_000.0, 12_000.0, 16_000.0,
          24_000.0, 32_000.0]
START_SPEED = 4_000.0
CPU_SPEED = 2_000.0
RUNS = 2


# -- one replay -------------------------------------------------------------------------


def replay_once(runtime: str, trace: Trace, speed: float, ideal_1x_s: float) -> float:
    """One replay of ``trace`` at ``speed`` on ``runtime``: its makespan ratio (inf when a
    request failed or did not complete)."""
    plan = make_plan(trace, ReplayConfig(speed=speed, runtime=runtime))
    record = get_runtime(runtime).run(plan)
    return _ratio(plan, record.complete_s, record.errors, speed, ideal_1x_s)


def _ratio(plan: ReplayPlan, complete_s: list[float], errors: list[Any], speed: float,
           ideal_1x_s: float) -> float:
    done = [t for t in complete_s if not math.isnan(t)]
    if errors or len(done) != len(plan.keys):
        return math.inf
    return (max(done) - plan.arrival_s[0]) / (ideal_1x_s / speed)


# -- the reference: the standard library's locks on the same harness ----------------------


def _global_cap(plan: ReplayPlan) -> int:
    """The plan's one counting lane's capacity (the reference knows the session policy's
    two lanes only)."""
    caps = [spec.capacity for spec in plan.lanes if not spec.per_key]
    if len(caps) != 1 or len(plan.lanes) != 2:
        raise ValueError("the reference replays the session policy: one per-key lane, "
                         "one counting lane")
    return caps[0]


class _AsyncReference:
    """``acquire_all`` for the asyncio harness: the key's ``asyncio.Lock``, then the global
    ``asyncio.Semaphore``; the registry is the dict of locks (never evicted)."""

    def __init__(self, cap: int) -> None:
        self.locks: dict[str, asyncio.Lock] = {}
        self.cap = asyncio.Semaphore(cap)

    @contextlib.asynccontextmanager
    async def acquire_all(self, key: str, names: Any) -> AsyncIterator[None]:
        lock = self.locks.get(key)
        if lock is None:
            lock = self.locks[key] = asyncio.Lock()
        async with lock, self.cap:
            yield


class _ThreadReference:
    """``acquire_all`` for the thread harness: the key's ``threading.Lock`` (the dict behind
    a lock of its own), then the global ``threading.Semaphore``."""

    def __init__(self, cap: int) -> None:
        self.locks: dict[str, threading.Lock] = {}
        self.cap = threading.Semaphore(cap)
        self._dict_lock = threading.Lock()

    @contextlib.contextmanager
    def acquire_all(self, key: str, names: Any) -> Iterator[None]:
        with self._dict_lock:
            lock = self.locks.get(key)
            if lock is None:
                lock = self.locks[key] = threading.Lock()
        with lock, self.cap:
            yield


class _NoGate:
    """The thread harness's arrival gate, open: the reference's locks keep no order."""

    def wait_turn(self, rid: int) -> None:
        pass

    def finished(self, rid: int) -> None:
        pass


def reference_once(runtime: str, trace: Trace, speed: float, ideal_1x_s: float) -> float:
    """:func:`replay_once` with the reference's locks in place of the lanes (see the module
    docstring), driven by the runtime's own ``drive_tasks`` / ``drive_threads`` with the
    same observer (its registry probe: the dict's size)."""
    plan = make_plan(trace, ReplayConfig(speed=speed, runtime=runtime))
    cap = _global_cap(plan)
    lead_s = 0.02  # as the runtimes (InProcessRuntime): the epoch a little ahead
    if runtime == "asyncio":
        async def drive() -> tuple[Observer, list[Any]]:
            clock = asyncio.get_running_loop().time
            queue = _AsyncReference(cap)
            settle_heap()  # as the runtimes do
            epoch = clock() + lead_s
            observer = Observer(plan.keys, epoch_s=epoch, clock=clock,
                                registry_size=lambda: len(queue.locks))
            drove = await aio_runtime.drive_tasks(plan, queue, observer,  # type: ignore[arg-type]
                                                  epoch=epoch, clock=clock)
            return observer, drove.errors

        if sys.version_info >= (3, 11):  # the runtime's own loop (AsyncioRuntime.run)
            with asyncio.Runner(loop_factory=aio_runtime._replay_loop) as runner:
                observer, errors = runner.run(drive())
        else:
            observer, errors = asyncio.run(drive())
    else:
        clock = time.monotonic
        queue = _ThreadReference(cap)
        settle_heap()  # as the runtimes do
        epoch = clock() + lead_s
        observer = Observer(plan.keys, epoch_s=epoch, clock=clock,
                            registry_size=lambda: len(queue.locks))
        errors = thread_runtime.drive_threads(
            plan, queue, _NoGate(), observer, epoch=epoch, clock=clock,  # type: ignore[arg-type]
        ).errors
    return _ratio(plan, observer.complete_s, errors, speed, ideal_1x_s)


def search(runtime: str, trace: Trace, ideal_1x_s: float,
           once: Callable[[str, Trace, float, float], float] = replay_once,
           ) -> tuple[float | None, dict[float, list[float]]]:
    """The highest speed of :data:`LADDER` where :data:`RUNS` runs of ``once`` all keep the
    ratio, and every speed's ratios (see the module docstring)."""
    ratios: dict[float, list[float]] = {}

    def passes(speed: float) -> bool:
        got = ratios.setdefault(speed, [])
        while len(got) < RUNS:
            got.append(once(runtime, trace, speed, ideal_1x_s))
            if got[-1] > RATIO_LIMIT:
                break  # one miss decides
        return len(got) == RUNS and max(got) <= RATIO_LIMIT

    i = LADDER.index(START_SPEED)
    best: float | None = None
    if passes(LADDER[i]):
        best = LADDER[i]
        for speed in LADDER[i + 1:]:
            if not passes(speed):
                break
            best = speed
    else:
        for speed in reversed(LADDER[:i]):
            if passes(speed):
                best = speed
                break
    goal = GOAL_SPEED[runtime]
    got = ratios.setdefault(goal, [])
    while len(got) < RUNS:  # the goal speed's two ratios, always
        got.append(once(runtime, trace, goal, ideal_1x_s))
    return best, ratios


# -- CPU per request ----------------------------------------------------------------------


def _thread_cpu() -> float:
    return time.thread_time()


class _TimedHold:
    """Wraps a thread-face ``acquire_all`` context manager: the thread CPU of its enter and
    exit goes to ``spent``."""

    __slots__ = ("_cm", "_spent")

    def __init__(self, cm: Any, spent: list[float]) -> None:
        self._cm = cm
        self._spent = spent

    def __enter__(self) -> Any:
        t = _thread_cpu()
        try:
            return self._cm.__enter__()
        finally:
            self._spent.append(_thread_cpu() - t)

    def __exit__(self, *exc: Any) -> Any:
        t = _thread_cpu()
        try:
            return self._cm.__exit__(*exc)
        finally:
            self._spent.append(_thread_cpu() - t)


def _timed_steps(awaitable: Any, spent: list[float]) -> Generator[Any, Any, Any]:
    """Drive ``awaitable`` step by step, adding the CPU of each step (not the loop's work
    between two steps) to ``spent``."""
    gen = awaitable.__await__()
    value: Any = None
    error: BaseException | None = None
    total = 0.0
    try:
        while True:
            t = _thread_cpu()
            try:
                step = gen.send(value) if error is None else gen.throw(error)
            except StopIteration as stop:
                total += _thread_cpu() - t
                return stop.value
            total += _thread_cpu() - t
            value, error = None, None
            try:
                value = yield step
            except BaseException as exc:  # cancellation: handed to the awaitable
                error = exc
    finally:
        spent.append(total)


class _TimedAsyncHold:
    """Wraps an asyncio-face ``acquire_all`` context manager: the CPU of every step of its
    enter and exit goes to ``spent``."""

    __slots__ = ("_cm", "_spent")

    def __init__(self, cm: Any, spent: list[float]) -> None:
        self._cm = cm
        self._spent = spent

    def __aenter__(self) -> Any:
        return _Steps(self._cm.__aenter__(), self._spent)

    def __aexit__(self, *exc: Any) -> Any:
        return _Steps(self._cm.__aexit__(*exc), self._spent)


class _Steps:
    __slots__ = ("_aw", "_spent")

    def __init__(self, aw: Any, spent: list[float]) -> None:
        self._aw = aw
        self._spent = spent

    def __await__(self) -> Generator[Any, Any, Any]:
        return _timed_steps(self._aw, self._spent)


def _timed_queue_builder(build: Callable[[ReplayPlan], Any], wrap: Callable[[Any, list[float]],
                         Any], spent: list[float]) -> Callable[[ReplayPlan], Any]:
    def timed_build(plan: ReplayPlan) -> Any:
        queue = build(plan)
        acquire_all = queue.acquire_all
        queue.acquire_all = lambda key, names, **kw: wrap(acquire_all(key, names, **kw), spent)
        return queue

    return timed_build


def _process_cpu() -> float:
    return time.process_time()  # user + system, every thread of the process


def cpu_split(runtime: str, trace: Trace, rounds: int) -> tuple[float, float, float]:
    """(process CPU per request of a plain run, library CPU per request, calibration: the
    CPU of one empty timed interval), microseconds, medians of ``rounds`` interleaved
    plain and timed runs at :data:`CPU_SPEED`."""
    plan = make_plan(trace, ReplayConfig(speed=CPU_SPEED, runtime=runtime))
    n = len(plan.keys)
    module: Any = thread_runtime if runtime == "threads" else aio_runtime
    attr = "build_thread_queue" if runtime == "threads" else "build_async_queue"
    wrap: Callable[[Any, list[float]], Any] = (
        _TimedHold if runtime == "threads" else _TimedAsyncHold
    )
    build = getattr(module, attr)
    empty = []
    for _ in range(1000):
        t = _thread_cpu()
        empty.append(_thread_cpu() - t)
    floor = median(empty)
    totals: list[float] = []
    libs: list[float] = []
    for _ in range(rounds):
        c0 = _process_cpu()
        get_runtime(runtime).run(plan)
        totals.append((_process_cpu() - c0) / n * 1e6)
        spent: list[float] = []
        setattr(module, attr, _timed_queue_builder(build, wrap, spent))
        try:
            get_runtime(runtime).run(plan)
        finally:
            setattr(module, attr, build)
        libs.append((sum(spent) - floor * len(spent)) / n * 1e6)
    return median(totals), median(libs), floor * 1e6


# -- the section --------------------------------------------------------------------------


_REFERENCE = {
    "threads": "threading.Lock per key + threading.Semaphore, no arrival gate, no FIFO",
    "asyncio": "asyncio.Lock per key + asyncio.Semaphore",
}


def _tried(ratios: dict[float, list[float]]) -> str:
    return "; ".join(
        f"{s:,.0f}: {'/'.join(f'{r:.2f}' for r in rs)}" for s, rs in sorted(ratios.items())
    )


def section_replay(cfg: Config) -> list[Row]:
    """The replay section (see the module docstring)."""
    trace = read_trace()
    rows: list[Row] = []
    if not cfg.quick:
        ideal_1x_s = float(simulate_trace(trace, ReplayConfig(speed=1.0)).makespan)
        for runtime in ("threads", "asyncio"):
            goal = GOAL_SPEED[runtime]
            best, ratios = search(runtime, trace, ideal_1x_s)
            rows.append(Row(
                "replay", f"{runtime}: highest speed, makespan_ratio <= {RATIO_LIMIT} x{RUNS}",
                best if best is not None else 0.0, "speed", f"ratios by speed: {_tried(ratios)}",
                goal=f">= {goal:,.0f}",
                status="PASS" if best is not None and best >= goal else "MISS",
                data={"ratios": {str(s): rs for s, rs in ratios.items()}},
            ))
            at_goal = ratios[goal]
            rows.append(Row(
                "replay", f"{runtime}: worst makespan_ratio of {RUNS} runs at {goal:,.0f}",
                max(at_goal), "ratio",
                "a ratio of several means a stall, not a shortfall",
            ))
            ref_best, ref_ratios = search(runtime, trace, ideal_1x_s, reference_once)
            rows.append(Row(
                "replay", f"{runtime}: the reference's highest speed (stdlib locks, same "
                "harness)", ref_best if ref_best is not None else 0.0, "speed",
                f"{_REFERENCE[runtime]}; ratios by speed: {_tried(ref_ratios)}",
                data={"ratios": {str(s): rs for s, rs in ref_ratios.items()}},
            ))
    sub = trace.head(3_000) if cfg.quick else trace
    rounds = 1 if cfg.quick else 2
    for runtime in ("threads", "asyncio"):
        total, lib, floor = cpu_split(runtime, sub, rounds)
        rows.append(Row(
            "replay", f"{runtime}: library CPU per replayed request", lib, "us/req",
            f"acquire_all enter + exit, thread CPU of its steps (minus {floor:.2f} us per "
            f"timed step); {len(sub.requests):,} req at speed {CPU_SPEED:,.0f}",
        ))
        rows.append(Row(
            "replay", f"{runtime}: process CPU per replayed request", total, "us/req",
            f"the rest (runtime, gate, observer, loop or wake-ups): {total - lib:.1f} us/req; "
            f"library share {lib / total:.0%}" if total > 0 else "",
        ))
    return rows


def main() -> int:
    from bench_common import format_row, format_table_header

    quick = "--quick" in sys.argv[1:]
    print(format_table_header(), flush=True)
    for row in section_replay(Config.make(quick)):
        print(format_row(row), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
