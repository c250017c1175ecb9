"""The ``threads`` runtime: a replay plan driven through the thread lanes.

One dispatcher thread releases each request at its arrival time to a thread of its own;
that thread waits its turn at the :class:`~lanequeue.replay.observe.ArrivalGate`, blocks
in ``LaneQueue.acquire_all(key, ["session", "global"])``, sleeps for its work time, and
releases. Every waiting request is a thread blocked inside the real lanes, so the lanes'
own FIFO hand-off is what orders them: nothing in the harness queues requests on their
behalf.

Threads are reused: a thread whose request is done parks in an idle pool, and the
dispatcher hands the next arrival to an idle thread (a lock release). When none is idle,
the arrival joins the pool's pending requests and a starter thread of the pool starts a
new thread for it; whichever thread is free first (the new one, or one whose request is
done) takes the oldest pending request. The dispatcher never waits for a thread to start:
``Thread.start`` returns only once the new thread runs, about 0.7 ms on a small VM but
milliseconds on a busy machine (the new thread waits for a CPU, then for the GIL), and on
the dispatcher's path each start held back every later arrival, so a burst with no idle
thread fell seconds behind the trace. A request counts as released (``dispatch_s``) when a
thread takes it up. Threads alive <= the most requests in flight at once (waiting or
working): about 100 for the default trace and cap; with ``global-serial`` the backlog, and
so the thread count, grows with the trace, so use ``--limit`` there.

With a backend (``--backend redis://...``), several worker processes each run this
module's driver (:func:`drive_threads`) on their share of the requests over Redis lanes
(:mod:`lanequeue.replay.runtimes.redis_processes`).
"""

from __future__ import annotations

import math
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from lanequeue import LaneQueue
from lanequeue._errors import told
from lanequeue.replay.observe import ArrivalGate, Observer
from lanequeue.replay.runtimes.base import (
    InProcessRuntime,
    ProgressFn,
    ReplayPlan,
    RunRecord,
    add_plan_lanes,
    arrival_gate,
    elapsed_s,
    observed_record,
    registry_probe,
    settle_heap,
)

__all__ = [
    "ThreadDrive",
    "ThreadRuntime",
    "build_thread_queue",
    "drive_threads",
]


def build_thread_queue(plan: ReplayPlan) -> LaneQueue:
    """A LaneQueue holding the lanes of ``plan`` (registered in order, so taken in order),
    all of them waiting without limit (``timeout_s=None``).

    A per-key spec becomes a :class:`~lanequeue.SessionLane` (capacity must be 1), a
    counting spec a :class:`~lanequeue.Lane` of ``capacity`` permits.
    """
    # Long waits are what a replay measures, not what it should log.
    return add_plan_lanes(LaneQueue(warn_after_s=None), plan)


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
    """Runs ``job(rid)`` on pooled threads; :meth:`submit` never waits for a thread to
    start.

    A request submitted while a thread is idle goes to that thread at once. Otherwise it
    joins ``pending`` (arrival order), and the pool's own starter thread starts a new
    thread for it; the first thread free (a new one, or one whose request is done) takes
    the oldest pending request. ``Thread.start`` blocks until the new thread runs, which on
    a busy machine takes milliseconds (the new thread waits for a CPU, then for the GIL):
    on the submitter's path, each start would hold back every later arrival, and a burst
    with no idle thread would fall seconds behind the trace.

    Args:
        job: run with each submitted request, on a pooled thread.
        start_thread: starts a thread (``threading.Thread.start``); called by the starter
            thread only.
    """

    def __init__(
        self,
        job: Callable[[int], None],
        *,
        start_thread: Callable[[threading.Thread], None] = threading.Thread.start,
    ) -> None:
        self._job = job
        self._start_thread = start_thread
        self._lock = threading.Lock()
        self._idle: list[_PooledThread] = []
        self._pending: deque[int] = deque()
        self._starting = 0  # threads started for pending requests, not yet running
        self._closed = False
        self._wanted = threading.Event()  # set: pending requests may need new threads
        #: threads started so far (<= the most requests in flight at once: a thread is
        #: started only for a request no thread is free for)
        self.started = 0
        self._starter = threading.Thread(
            target=self._start_loop, name="lanequeue-replay-starter", daemon=True
        )
        self._starter.start()

    def submit(self, rid: int) -> None:
        """Run ``job(rid)`` now on an idle thread, else as soon as a thread is free (a
        new one is started for it). Returns without waiting for any thread."""
        with self._lock:
            if self._idle:
                parked = self._idle.pop()
            else:
                self._pending.append(rid)
                parked = None
        if parked is not None:
            parked.assign(rid)
        else:
            self._wanted.set()

    def _start_loop(self) -> None:
        """The starter thread: a new thread for each pending request no thread is
        already starting for."""
        while True:
            self._wanted.wait()
            self._wanted.clear()  # before looking: a later submit sets it again
            while True:
                with self._lock:
                    if self._closed:
                        return
                    if len(self._pending) <= self._starting:
                        break
                    self._starting += 1
                    self.started += 1
                    name = f"lanequeue-replay-{self.started}"
                self._start_thread(
                    threading.Thread(target=self._loop, args=(_PooledThread(),), name=name,
                                     daemon=True)
                )

    def _loop(self, me: _PooledThread) -> None:
        with self._lock:
            self._starting -= 1
        while True:
            with self._lock:
                if self._closed:
                    return
                if self._pending:
                    rid: int | None = self._pending.popleft()
                else:
                    self._idle.append(me)
                    rid = None
            if rid is None:
                rid = me.park()
                if rid is None:
                    return
            self._job(rid)

    def close(self) -> None:
        """Let every parked thread and the starter exit; threads still busy exit when
        done; pending requests are dropped."""
        with self._lock:
            self._closed = True
            self._pending.clear()
            idle, self._idle = self._idle, []
        for parked in idle:
            parked.assign(None)
        self._wanted.set()


@dataclass
class ThreadDrive:
    """What :func:`drive_threads` returns besides the observer's record.

    Attributes:
        dispatch_s: when a thread took each request up, seconds after the epoch (NaN
            for the requests this driver did not drive).
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
        dispatch_s[rid] = clock() - epoch  # taken up by a thread: released
        try:
            try:
                gate.wait_turn(rid)
                with queue.acquire_all(keys[rid], lane_names):
                    # The work ends at its start + its work time: the observer's
                    # bookkeeping since the start is part of it, not added to it.
                    left = observer.work_started(rid) + work_s[rid] - observer.now()
                    try:
                        if left > 0:
                            time.sleep(left)
                    finally:
                        observer.work_ended(rid)
                observer.completed(rid)
            finally:
                gate.finished(rid)
        except BaseException as exc:  # reported, never silently lost
            with done_lock:
                errors.append((rid, told(exc)))
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
    wall = elapsed_s(observer.complete_s, mine, clock() - epoch)
    if progress is not None:
        progress(total, total)
    return ThreadDrive(
        dispatch_s=dispatch_s, errors=sorted(errors), threads=pool.started, wall_s=wall
    )


class ThreadRuntime(InProcessRuntime):
    """Real threads on real lanes: one thread per request in flight, from its arrival."""

    name = "threads"

    def run(self, plan: ReplayPlan, progress: ProgressFn | None = None) -> RunRecord:
        """Replay ``plan`` on threads in real time (see the module docstring)."""
        queue = build_thread_queue(plan)
        gate = arrival_gate(queue, plan.lanes[0], plan.keys)
        clock = time.monotonic
        settle_heap()  # the set-up's garbage, collected before the epoch
        epoch = clock() + self._lead_s
        observer = Observer(
            plan.keys, epoch_s=epoch, clock=clock, registry_size=registry_probe(queue, plan.lanes)
        )
        drive = drive_threads(
            plan, queue, gate, observer,
            epoch=epoch, clock=clock, progress=progress, tick_s=self._tick_s,
        )
        return observed_record(
            observer, queue, plan,
            dispatch_s=drive.dispatch_s, errors=drive.errors, wall_s=drive.wall_s,
            held_back=gate.held_back, threads=drive.threads,
        )
