"""The ``asyncio`` runtime: a replay plan driven through the asyncio lanes on one event loop.

The same job as the thread runtime (:class:`~lanequeue.replay.runtimes.threads.ThreadRuntime`),
measured the same way, with tasks instead of threads:

- one event loop, run by :meth:`AsyncioRuntime.run` in the calling thread;
- a dispatcher coroutine that sleeps until each arrival time and then creates one task
  per request (every request of a batch arriving at the same instant is created in one
  go, in arrival order);
- each task does ``async with queue.acquire_all(key, ["session", "global"])`` on an
  :class:`~lanequeue.AsyncLaneQueue` (:class:`~lanequeue.AsyncSessionLane`,
  :class:`~lanequeue.AsyncLane`), ``await asyncio.sleep(work_s)``, and releases;
- the tasks report the start and end of their work to the same
  :class:`~lanequeue.replay.observe.Observer` as the threads do, so the figures
  (order, per-key and global occupancy, waits, registry size) are the workers' own.

Why there is no ArrivalGate here
================================
The thread runtime needs :class:`~lanequeue.replay.observe.ArrivalGate` because the OS
may run a thread started later before one started earlier, so two requests of one
conversation could enter the session lane out of arrival order. Tasks of one loop cannot
overtake each other that way:

1. ``loop.create_task`` schedules the task's first step with ``call_soon``, and the loop
   runs ready callbacks in FIFO order; the dispatcher creates tasks in arrival order, so
   their first steps run in arrival order (an eager task factory would run each first step
   inside ``create_task``: the same order).
2. A task's first step runs synchronously until its first real suspension. The worker
   does nothing awaitable before ``acquire_all``, and ``acquire_all`` on in-process async
   lanes takes (or joins the line of) its first lane with a plain ``core.take`` before it
   awaits anything. So each request is in line in the first lane before the next request's
   task has run at all.

Hence requests enter the first lane in arrival order, which is all the gate ensures; from
there the lane's own FIFO decides, as for threads. The runtime still checks this rather
than trusting it: every task records its rank as it reaches ``acquire_all``, and a task
that finds it got there out of arrival order is reported as an error (so the run fails
its checks) instead of silently skewing the figures. ``RunRecord.held_back`` is 0.

This reasoning needs the first lane's take to happen before any await. A lane reached
through ``await lane._hold(...)`` (a Redis lane, say) may suspend on I/O before its
request is in line; such a backend needs an awaitable arrival gate in front of
``acquire_all``: :func:`drive_tasks` takes one
(:class:`~lanequeue.replay.observe.AsyncArrivalGate`), and the Redis runtime's worker
processes drive their share with it
(:mod:`~lanequeue.replay.runtimes.redis_processes`).

Timing: the loop's timers fire within the OS's sleep precision (tens of microseconds):
epoll counts in whole milliseconds and rounds up, so on Python 3.11+ the loop runs on
:class:`_FineTimerSelector`, which never waits past the next timer (on 3.10, the default
loop: up to a millisecond late). Arrivals are dispatched that much late at most
(``dispatch_lag_max_s``, plus the loop's own backlog), and waits, which run from the
arrival time, include that lag, as they include the scheduling delay of a thread for the
thread runtime. A request's work ends at its start plus its work time (the observer's
bookkeeping in between is part of it).
"""

from __future__ import annotations

import asyncio
import math
import selectors
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from lanequeue import AsyncLaneQueue
from lanequeue._errors import told
from lanequeue.replay.observe import AsyncArrivalGate, Observer
from lanequeue.replay.runtimes.base import (
    InProcessRuntime,
    ProgressFn,
    ReplayPlan,
    RunRecord,
    add_plan_lanes,
    elapsed_s,
    observed_record,
    registry_probe,
    settle_heap,
)

__all__ = ["AsyncioRuntime", "TaskDrive", "build_async_queue", "drive_tasks"]

#: The resolution of the OS poll behind the loop's selector (epoll: milliseconds).
_POLL_TICK_S = 0.001


class _FineTimerSelector(selectors.BaseSelector):
    """The default selector, made to wake at the loop's timers to within the OS's sleep
    precision (tens of microseconds) instead of up to a millisecond late.

    The loop waits for its next timer with ``select(timeout)``, and epoll counts in whole
    milliseconds, rounding up: every ``asyncio.sleep`` of a request's work ended up to 1 ms
    late (0.6 ms at the median, measured), while the request held its permits, so at
    high speeds (works of a millisecond or two) the global lane served a quarter fewer
    requests than the simulation and a backlog grew. Here a wait is cut to whole
    milliseconds (rounded down, so the loop comes back early and asks again for the
    rest), and a wait shorter than a millisecond is a plain ``time.sleep`` followed by a
    poll that does not wait: I/O is seen at most that much later, which the replay's loop
    (no I/O of its own) does not mind.
    """

    def __init__(self) -> None:
        self._inner = selectors.DefaultSelector()

    def register(self, fileobj: Any, events: int, data: Any = None) -> selectors.SelectorKey:
        return self._inner.register(fileobj, events, data)

    def unregister(self, fileobj: Any) -> selectors.SelectorKey:
        return self._inner.unregister(fileobj)

    def modify(self, fileobj: Any, events: int, data: Any = None) -> selectors.SelectorKey:
        return self._inner.modify(fileobj, events, data)

    def select(
        self, timeout: float | None = None
    ) -> list[tuple[selectors.SelectorKey, int]]:
        if timeout is not None and timeout > 0:
            if timeout < _POLL_TICK_S:
                time.sleep(timeout)
                timeout = 0
            else:
                timeout = math.floor(timeout / _POLL_TICK_S) * _POLL_TICK_S
        return self._inner.select(timeout)

    def close(self) -> None:
        self._inner.close()

    def get_key(self, fileobj: Any) -> selectors.SelectorKey:
        return self._inner.get_key(fileobj)

    def get_map(self) -> Any:
        return self._inner.get_map()


def _replay_loop() -> asyncio.AbstractEventLoop:
    """A new event loop whose timers fire on time (:class:`_FineTimerSelector`)."""
    return asyncio.SelectorEventLoop(_FineTimerSelector())


def build_async_queue(plan: ReplayPlan) -> AsyncLaneQueue:
    """An AsyncLaneQueue holding the lanes of ``plan`` (registered in order, so taken in
    order), all of them waiting without limit (``timeout_s=None``).

    A per-key spec becomes an :class:`~lanequeue.AsyncSessionLane` (capacity must be 1), a
    counting spec an :class:`~lanequeue.AsyncLane` of ``capacity`` permits.
    """
    # Long waits are what a replay measures, not what it should log.
    return add_plan_lanes(AsyncLaneQueue(warn_after_s=None), plan)


class AsyncioRuntime(InProcessRuntime):
    """Real asyncio tasks on real async lanes, one event loop: one task per request, from
    its arrival (see the module docstring)."""

    name = "asyncio"

    def run(self, plan: ReplayPlan, progress: ProgressFn | None = None) -> RunRecord:
        """Replay ``plan`` on a new event loop in the calling thread, in real time.

        Raises:
            RuntimeError: called from a thread whose event loop is running (call it from
                a plain thread, e.g. with ``asyncio.to_thread``).
        """
        try:
            asyncio.get_running_loop()
        except RuntimeError:
            pass
        else:
            raise RuntimeError(
                "the asyncio replay runtime runs its own event loop; call it from a thread "
                "without a running loop (e.g. through asyncio.to_thread)"
            )
        if sys.version_info >= (3, 11):  # asyncio.run's handling, on a loop of our own
            with asyncio.Runner(loop_factory=_replay_loop) as runner:
                return runner.run(self._replay(plan, progress))
        return asyncio.run(self._replay(plan, progress))  # 3.10: the default loop

    async def _replay(self, plan: ReplayPlan, progress: ProgressFn | None) -> RunRecord:
        queue = build_async_queue(plan)
        registry = registry_probe(queue, plan.lanes)
        clock = asyncio.get_running_loop().time  # the clock of the loop's timers
        settle_heap()  # the set-up's garbage, collected before the epoch
        epoch = clock() + self._lead_s
        observer = Observer(plan.keys, epoch_s=epoch, clock=clock, registry_size=registry)
        drive = await drive_tasks(
            plan, queue, observer, epoch=epoch, clock=clock, progress=progress,
            tick_s=self._tick_s,
        )
        return observed_record(
            observer, queue, plan, dispatch_s=drive.dispatch_s, errors=drive.errors,
            wall_s=drive.wall_s,
        )


@dataclass
class TaskDrive:
    """What :func:`drive_tasks` returns besides the observer's record.

    Attributes:
        dispatch_s: when each request was released, seconds after the epoch (NaN for the
            requests this driver did not drive).
        errors: (request index, error text) for requests that failed or did not complete.
        wall_s: seconds from the epoch to the last completion of the driven requests.
    """

    dispatch_s: list[float]
    errors: list[tuple[int, str]]
    wall_s: float


async def drive_tasks(
    plan: ReplayPlan,
    queue: AsyncLaneQueue,
    observer: Observer,
    *,
    epoch: float,
    clock: Callable[[], float],
    rids: Sequence[int] | None = None,
    gate: AsyncArrivalGate | None = None,
    progress: ProgressFn | None = None,
    tick_s: float = 0.1,
) -> TaskDrive:
    """Drive the requests ``rids`` of ``plan`` (default: all; in arrival order) as tasks
    of the running loop through ``queue``, in real time from ``epoch`` (a ``clock``
    reading; ``clock`` must be the loop's time or the clock it runs on).

    Each request's task is created at ``epoch + arrival``; it waits its turn at ``gate``
    (if any: needed when the first lane suspends on I/O before its request is in line,
    see the module docstring), holds every lane of the plan with ``acquire_all``, reports
    to ``observer``, sleeps its work time, releases, and tells ``gate`` it finished.
    Without a gate, a request that reaches ``acquire_all`` out of arrival order is
    reported as an error. ``progress(done, len(rids))`` is called every ``tick_s``
    seconds. Returns once every driven request has finished; cancelling it cancels them.
    """
    n = len(plan.keys)
    mine = list(range(n)) if rids is None else list(rids)
    total = len(mine)
    keys = plan.keys
    work_s = plan.work_s
    arrival_s = plan.arrival_s
    lane_names = [spec.name for spec in plan.lanes]
    loop = asyncio.get_running_loop()
    dispatch_s = [math.nan] * n
    errors: list[tuple[int, str]] = []
    done = 0
    entered = 0  # requests that have reached acquire_all (see the module docstring)
    # The loop keeps only weak references to tasks: each is kept here until its worker
    # ends (its own last step drops it: no done-callback to schedule).
    in_flight: dict[int, asyncio.Task[None]] = {}
    all_done = asyncio.Event()
    if total == 0:
        all_done.set()

    async def hold_and_work(rid: int) -> None:
        # No await before acquire_all: the first lane is joined in this very step.
        async with queue.acquire_all(keys[rid], lane_names):
            # The work ends at its start + its work time: the observer's bookkeeping
            # since the start is part of it, not added to it.
            left = observer.work_started(rid) + work_s[rid] - observer.now()
            try:
                if left > 0:
                    await asyncio.sleep(left)
            finally:
                observer.work_ended(rid)
        observer.completed(rid)

    async def worker(rid: int) -> None:
        nonlocal done, entered
        try:
            if gate is not None:
                # Its first step runs before any await, so requests join its line in
                # arrival order.
                try:
                    await gate.wait_turn(rid)
                    await hold_and_work(rid)
                finally:
                    await gate.finished(rid)
            else:
                if rid != mine[entered]:  # reached the lanes out of order: a harness bug
                    errors.append(
                        (rid, f"reached acquire_all as number {entered}, not {mine.index(rid)}")
                    )
                entered += 1
                await hold_and_work(rid)  # its first step runs in this step (no await first)
        except Exception as exc:  # reported, never silently lost
            errors.append((rid, told(exc)))
        finally:  # also on cancellation (an interrupted run), which propagates
            in_flight.pop(rid, None)
            done += 1
            if done == total:
                all_done.set()

    async def dispatcher() -> None:
        for rid in mine:
            # Loop: a timer may fire up to the loop's clock resolution early.
            while (delay := epoch + arrival_s[rid] - clock()) > 0:
                await asyncio.sleep(delay)
            dispatch_s[rid] = clock() - epoch
            task = loop.create_task(worker(rid))
            if not task.done():  # (an eager task may have run to its end already)
                in_flight[rid] = task

    async def ticker(report: ProgressFn) -> None:
        while True:
            report(done, total)
            await asyncio.sleep(tick_s)

    feeder = loop.create_task(dispatcher())

    def feeder_done(task: asyncio.Task[None]) -> None:
        # A dispatcher that failed stops the wait (``await feeder`` then re-raises).
        if not task.cancelled() and task.exception() is not None:
            all_done.set()

    feeder.add_done_callback(feeder_done)
    bar = None if progress is None else loop.create_task(ticker(progress))
    try:
        await all_done.wait()
        await feeder  # done by now; re-raises if the dispatcher failed
    finally:
        if bar is not None:
            bar.cancel()
        feeder.cancel()  # on an interrupt
        for task in list(in_flight.values()):
            task.cancel()
    failed = {rid for rid, _ in errors}
    errors += [
        (rid, "did not complete")
        for rid in mine
        if math.isnan(observer.complete_s[rid]) and rid not in failed
    ]
    wall = elapsed_s(observer.complete_s, mine, clock() - epoch)
    if progress is not None:
        progress(total, total)
    return TaskDrive(dispatch_s=dispatch_s, errors=sorted(errors), wall_s=wall)
