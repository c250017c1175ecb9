"""The Redis runtime: a replay plan driven by several worker PROCESSES sharing Redis lanes.

This is the multi-replica gateway: ``lanequeue replay --backend redis://HOST:PORT/DB
--workers N`` starts N worker processes; request ``i`` (in arrival order) goes to worker
``i mod N``, so the messages of one conversation arrive at DIFFERENT processes, and the
lanes in Redis alone must still run them one at a time, in order, under one global cap.

Each worker process
===================
- opens its own Redis client and builds a queue with the policy's lanes on Redis, under a
  key prefix unique to the run (``lanequeue-replay:<uuid>``): the session lane then
  ``global`` (``max_concurrent=cap``) for the ``session`` policy; a counting ``session``
  lane of one permit then the same global lane for ``global-serial``. Every lane waits
  without limit (``timeout_s=None``);
- reports "ready" and waits for the go; once every worker is ready (a worker that dies
  or fails on the way stops the run at once), the parent fixes one start instant ``t0``
  on ``time.monotonic()`` (CLOCK_MONOTONIC: one clock for the whole host, so readings
  of different processes compare) and releases them all;
- drives its share of the requests with one of two drivers (:data:`DRIVERS`, the
  runtime's ``name``, chosen with ``--runtime``):

  * ``asyncio`` (the default): ONE event loop, a ``redis.asyncio.Redis`` client, an
    :class:`~lanequeue.AsyncLaneQueue` of ``AsyncRedisSessionLane``/``AsyncRedisLane``,
    and the asyncio runtime's driver (:func:`~lanequeue.replay.runtimes.aio.drive_tasks`):
    each request becomes a task at ``t0 + arrival`` that awaits the
    :class:`~lanequeue.replay.observe.AsyncArrivalGate`, then
    ``acquire_all(key, ["session", "global"])``, sleeps its work time, releases. A backlog
    costs tasks, not threads;
  * ``threads``: a ``redis.Redis`` client, a :class:`~lanequeue.LaneQueue` of
    ``RedisSessionLane``/``RedisLane``, and the thread runtime's driver
    (:func:`~lanequeue.replay.runtimes.threads.drive_threads`): a thread per request in
    flight, behind the :class:`~lanequeue.replay.observe.ArrivalGate`. It exercises the
    thread face across processes, and serves as the baseline of the asyncio driver;
- sends back what it observed, per request: dispatch, start of work, end of work,
  completion (all ``time.monotonic() - t0``), its worker id, and the CPU time the process
  used from the go to the end (summed over the workers, ``worker_cpu_s`` and
  ``worker_cpu_ms_per_request`` in the backend's figures).

The parent merges the observations and computes the figures exactly as for the
in-process runtimes, from the workers' intervals ``[start, end of work)``: per-key and
global occupancy (``max_key_concurrency``, ``peak_global``) by sweeping the intervals of
all workers together; the start order by sorting start times (two requests of one
conversation cannot start at once when the lane works, and both readings come from the
same clock); ``order_violations`` from that order; waits = start - arrival.

Ordering across processes: the arrival gate
============================================
Two turns of one conversation that arrive close together at different processes could
reach Redis in swapped order through scheduling (a task or thread run late, a process
descheduled): a harness artefact that the lane would then rightly serve in that order.
(In the bundled trace consecutive turns are >= 3 s of trace time apart, except one pair
at the same instant, so >= 5 ms apart at speed 600; the gate makes it rigorous anyway.)

The gate is shared across processes through Redis. Each conversation (lane slot) has a
completion counter ``<prefix>:done:<key>`` (``<prefix>:done:*`` for ``global-serial``,
whose first lane is one shared slot): a request INCRs it (with a TTL, in one MULTI) after
it has RELEASED its lanes, or failed (``acquire_all`` then released whatever it had
taken, or the request never entered); the last request of a conversation skips it, as
nobody waits for it. The request of rank ``r`` (``r`` earlier requests of its
conversation in the whole trace, whichever process they went to) enters the lanes only
once::

    holders(key) + waiters(key) >= r - done(key)

reading the counter first (t0), then the lane. The asyncio driver reads the lane in ONE
script, holder and live waiters at one instant t1 (two round trips per poll); the thread
driver reads ``is_held`` (t1) then ``waiting_for`` (t2 >= t1), one script each (three
round trips). It polls every ``poll_s`` (2 ms, doubling up to 50 ms) while the condition
is false. Why this is exact across processes:

1. Every request of the conversation passes the gate, so none of rank > r can enter the
   session lane (hence finish) before the request of rank r has entered: ``done(key)``
   read at t0 counts only requests of rank < r, and only ones that have left the lane
   (the INCR follows the release). So ``pending = r - done`` counts every earlier
   request not known to have finished, which includes every earlier request not yet
   inside.
2. Holders are read at t1 >= t0 and waiters at t2 >= t1 (t2 = t1 in one script), each by
   a script on the server (a holder = the holder key exists; waiters = live waiters in
   line). Anyone counted is inside at that instant, so it is an earlier request that has
   not finished, one of the ``pending``. A request seen holding at t1 cannot be waiting at
   t2 (it never joins the line again), so nobody is counted twice (a waiter at t1 that
   is granted before t2 may be counted zero times: an undercount, one more poll).
3. Hence ``inside >= pending`` means every unfinished earlier request is inside the
   lane (holding or in line), ahead of this one; the lane's FIFO does the rest. The
   gate never decides who runs first; it only makes "arrival order" well defined.

A request whose predecessor is inside at once costs one GET (rank 0 costs nothing); the
gate counts the requests it held back at least once (``gate_held_back``). Within one
process only the lowest-ranked held request of a conversation polls: the others of that
conversation could not pass before it anyway, and a burst of one slot (``global-serial``:
every request is one slot) would otherwise make every waiting request poll Redis,
hundreds of polls every 2 ms (asyncio: each request first awaits the previous request of
its slot in this process passing the gate, with no I/O; threads: ``one_poller``). A
predecessor that never enters (its worker died) would block its successors: the gate
gives up after ``gate_max_wait_s`` with an error, and the parent stops the run when a
worker dies.

Limits of the argument, all outside a healthy run and all visible in the report: a
waiter whose process freezes past its liveness window is no longer counted as inside
(more polls) and, per the lane's design, rejoins its line at the tail (the observer
would count the reordering); a release that fails on a backend error leaves a hold that
lapses with its lease while the request already counts as finished (the request is
reported as an error).

Connections: a task or thread waiting in a Redis lane holds no connection (wake-ups come
over one subscription per process); the lanes bound their own script calls per process
(releases on a bound of their own, never behind acquires). The thread driver's pool is
sized to its share of the requests, for the arrival gate's reads; the asyncio client's
pool (redis-py's default, 100) serves the lanes' calls (at most 12 at once) and the
completion counters' (at most :data:`COUNTER_CALLS` at once).

Lifetime: the workers end with the parent, however it ends (:func:`die_with_parent`);
SIGTERM or Ctrl-C of the parent stops the run cleanly, and a run in which nothing
finishes for ``stall_s`` stops with an error instead of hanging.

Registry figures and cleanup
============================
A Redis session lane keeps no idle entries, so ``registry_peak`` is None (not sampled:
a keyspace scan during the run would perturb it), and ``registry_final`` is the number of
the trace's conversation keys that Redis still reports held or waited for after every
worker has exited (asked per key with ``is_held``/``waiting_for``; it must be 0). The
parent then SCANs the run's keys (``*lanequeue-replay:<uuid>*``): it counts them and
those without a TTL (``redis_keys_without_ttl``, a failed check if not 0), then deletes
them all (the prefix belongs to this run and every worker has exited); the lanes' own
keys would expire by themselves (fence counters one lease after their last grant) and
the completion counters after ``counter_ttl_s``.
"""

from __future__ import annotations

import asyncio
import importlib
import math
import multiprocessing as mp
import os
import queue as queue_mod
import signal
import sys
import threading
import time
import traceback
import uuid
from collections.abc import Callable, Container, Coroutine, Hashable, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar
from urllib.parse import urlsplit

from lanequeue import AsyncLaneQueue, LaneQueue
from lanequeue._errors import install_hint, redact_url, told
from lanequeue.replay.observe import Observer, peak_concurrency
from lanequeue.replay.runtimes.aio import drive_tasks
from lanequeue.replay.runtimes.base import (
    ProgressFn,
    ReplayPlan,
    RunRecord,
    add_plan_lanes,
    arrival_gate,
    async_arrival_gate,
    check_workers,
    lane_stats,
)
from lanequeue.replay.runtimes.threads import drive_threads

__all__ = [
    "DRIVERS",
    "AsyncRedisCompletionCounter",
    "BackendError",
    "RedisCompletionCounter",
    "RedisProcessRuntime",
    "build_async_redis_queue",
    "build_redis_queue",
    "check_backend",
    "connect",
    "redact_url",
]

T = TypeVar("T")

#: URL schemes redis-py's ``from_url`` understands.
_SCHEMES = ("redis", "rediss", "unix")
#: The run's key prefix starts with this.
PREFIX_BASE = "lanequeue-replay"
#: The arrival gate's poll interval doubles from ``poll_s`` up to this (seconds): each
#: poll costs two or three round trips, and a backlog of held requests polling every 2 ms took
#: the script connections the lanes' own calls needed.
GATE_MAX_POLL_S = 0.05
#: How a worker process drives its share: ``asyncio`` (the default) or ``threads``.
DRIVERS = ("asyncio", "threads")
#: Calls of an asyncio worker's completion counters in flight at once (the lanes use at
#: most 12 connections of the client's pool of 100; see AsyncRedisCompletionCounter).
COUNTER_CALLS = 16


class BackendError(Exception):
    """The backend cannot be used: a bad URL, an unreachable server, redis-py missing, a
    worker process that failed to start or died."""


def _redis_module() -> Any:
    try:
        import redis
    except ImportError:
        raise BackendError(
            f"the Redis backend needs redis-py: {install_hint('redis')}"
        ) from None
    return redis


def connect(url: str, *, timeout_s: float = 3.0, max_connections: int | None = None) -> Any:
    """A ``redis.Redis`` client for ``url``, checked with a PING; ``max_connections``
    sizes its connection pool (None: redis-py's default).

    Raises:
        BackendError: redis-py missing, a URL it cannot use, or no answer from the server
            (the message names the URL without its password).
    """
    redis = _redis_module()
    shown = redact_url(url)
    scheme = url.split("://", 1)[0].lower() if "://" in url else ""
    if scheme not in _SCHEMES:
        raise BackendError(
            f"bad backend URL {shown!r}: expected redis://HOST[:PORT][/DB], rediss://... "
            "or unix://PATH"
        )
    if scheme != "unix":
        path = urlsplit(url).path
        if path not in ("", "/") and not path[1:].isdigit():
            raise BackendError(
                f"bad backend URL {shown!r}: the path must be a database number (/0), "
                f"not {path!r}"
            )
    try:
        extra = {} if max_connections is None else {"max_connections": max_connections}
        client = redis.Redis.from_url(
            url, socket_connect_timeout=timeout_s, health_check_interval=0, **extra
        )
    except (ValueError, TypeError) as exc:
        raise BackendError(f"bad backend URL {shown!r}: {exc}") from None
    try:
        client.ping()
    except redis.exceptions.RedisError as exc:
        client.close()
        raise BackendError(f"cannot reach Redis at {shown}: {exc}") from None
    return client


async def connect_async(url: str, *, timeout_s: float = 3.0) -> Any:
    """A ``redis.asyncio.Redis`` client for ``url`` (checked by :func:`connect` first,
    then with a PING of its own).

    Raises:
        BackendError: as :func:`connect`.
    """
    connect(url, timeout_s=timeout_s, max_connections=1).close()  # the URL and the server
    import redis.asyncio

    client = redis.asyncio.Redis.from_url(
        url, socket_connect_timeout=timeout_s, health_check_interval=0
    )
    try:
        await client.ping()
    except redis.exceptions.RedisError as exc:
        await client.aclose()
        raise BackendError(f"cannot reach Redis at {redact_url(url)}: {exc}") from None
    return client


def check_backend(url: str) -> str:
    """Check that ``url`` names a Redis server that answers; return it without password.

    Raises:
        BackendError: see :func:`connect`.
    """
    connect(url).close()
    return redact_url(url)


class _CounterKeys:
    """Where the completion counters of a run live (either face's client)."""

    def __init__(self, client: Any, prefix: str, *, ttl_s: float) -> None:
        self._client = client
        self._prefix = prefix
        self._ttl_ms = max(1, math.ceil(ttl_s * 1000))

    def key(self, slot: Hashable) -> str:
        """The Redis key of ``slot``'s counter."""
        return f"{self._prefix}:done:{'*' if slot is None else slot}"


class RedisCompletionCounter(_CounterKeys):
    """A :class:`~lanequeue.replay.observe.CompletionCounter` in Redis, shared by every
    process of a run: ``<prefix>:done:<slot>`` (``*`` for the shared slot None), on a
    ``redis.Redis`` client.

    ``finish`` INCRs and sets the TTL in one MULTI, so the key never exists without one.
    """

    def done(self, slot: Hashable) -> int:
        value = self._client.get(self.key(slot))
        return 0 if value is None else int(value)

    def finish(self, slot: Hashable) -> None:
        # Not retried: a MULTI whose EXEC raised may have run, and counting a request
        # twice could let a successor skip the gate. A lost INCR fails this request (an
        # error in the report) and holds its successor at the gate until its max wait
        # (another error): visible, never a silent reordering.
        key = self.key(slot)
        pipe = self._client.pipeline(transaction=True)
        pipe.incr(key)
        pipe.pexpire(key, self._ttl_ms)
        pipe.execute()


class AsyncRedisCompletionCounter(_CounterKeys):
    """:class:`RedisCompletionCounter` for a ``redis.asyncio.Redis`` client (the same
    keys, so both faces share the counts): an
    :class:`~lanequeue.replay.observe.AsyncCompletionCounter`.

    At most :data:`COUNTER_CALLS` of its calls are in flight at once: every task of a
    backlog reads or bumps a counter, and unbounded they took every connection of the
    client's pool (100), so the lanes' own calls failed with MaxConnectionsError (a
    release that failed so left its key held until its lease ran out)."""

    def __init__(self, client: Any, prefix: str, *, ttl_s: float) -> None:
        super().__init__(client, prefix, ttl_s=ttl_s)
        self._calls = asyncio.Semaphore(COUNTER_CALLS)

    async def done(self, slot: Hashable) -> int:
        async with self._calls:
            value = await self._client.get(self.key(slot))
        return 0 if value is None else int(value)

    async def finish(self, slot: Hashable) -> None:
        # Not retried, for the reason given in RedisCompletionCounter.finish.
        key = self.key(slot)
        async with self._calls, self._client.pipeline(transaction=True) as pipe:
            pipe.incr(key)
            pipe.pexpire(key, self._ttl_ms)
            await pipe.execute()


def build_async_redis_queue(
    client: Any, plan: ReplayPlan, *, prefix: str, lease_s: float
) -> AsyncLaneQueue:
    """:func:`build_redis_queue` for asyncio: an AsyncLaneQueue of
    ``AsyncRedisSessionLane``/``AsyncRedisLane`` on a ``redis.asyncio.Redis`` client.

    Raises:
        ValueError: a per-key spec whose capacity is not 1.
    """
    from lanequeue.redis import RedisBackend

    backend = RedisBackend(client, prefix=prefix, lease_s=lease_s)
    # Long waits are what a replay measures, not what it should log.
    return add_plan_lanes(AsyncLaneQueue(warn_after_s=None), plan, backend=backend)


def build_redis_queue(client: Any, plan: ReplayPlan, *, prefix: str, lease_s: float) -> LaneQueue:
    """A LaneQueue holding the lanes of ``plan`` on Redis under ``prefix`` (registered in
    order, so taken in order), all waiting without limit, made by one
    :class:`~lanequeue.redis.RedisBackend` through
    :func:`~lanequeue.replay.runtimes.base.add_plan_lanes`: a per-key spec becomes a
    ``RedisSessionLane`` with the plan's ``max_sessions`` (capacity must be 1), a counting
    spec a ``RedisLane``.

    Raises:
        ValueError: a per-key spec whose capacity is not 1.
    """
    from lanequeue.redis import RedisBackend

    backend = RedisBackend(client, prefix=prefix, lease_s=lease_s)
    return add_plan_lanes(LaneQueue(warn_after_s=None), plan, backend=backend)


@dataclass(frozen=True)
class _WorkerSpec:
    """Everything a worker process needs (pickled to it)."""

    wid: int
    workers: int
    url: str
    prefix: str
    plan: ReplayPlan
    lease_s: float
    poll_s: float
    gate_max_wait_s: float | None
    counter_ttl_s: float
    tick_s: float
    start_timeout_s: float
    parent_pid: int = 0
    pdeathsig: bool = False
    driver: str = "asyncio"


#: Linux prctl option: a signal the kernel sends this process when its parent dies.
_PR_SET_PDEATHSIG = 1


def die_with_parent(parent_pid: int, *, pdeathsig: bool = True, every_s: float = 0.25) -> None:
    """Make this (worker) process end when process ``parent_pid`` dies, however it dies
    (SIGKILL included): on Linux the kernel sends it SIGKILL (``PR_SET_PDEATHSIG``, set
    only when ``pdeathsig``: the kernel ties it to the parent THREAD that started us, so
    the parent asks for it only from its main thread); everywhere, a daemon thread checks
    every ``every_s`` seconds that the parent is still its parent and ends the process
    (``os._exit(1)``) once it is not. A parent already gone ends it at once."""
    if pdeathsig and sys.platform.startswith("linux"):
        try:
            import ctypes

            libc = ctypes.CDLL(None, use_errno=True)
            libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
        except (OSError, AttributeError):  # pragma: no cover - no prctl: the thread does it
            pass
    if os.getppid() != parent_pid:  # the parent died before the prctl took effect
        os._exit(1)

    def watch() -> None:
        while os.getppid() == parent_pid:
            time.sleep(every_s)
        os._exit(1)

    threading.Thread(target=watch, name="lanequeue-replay-parent-watch", daemon=True).start()


def _worker_main(spec: _WorkerSpec, go: Any, epoch: Any, out: Any) -> None:
    """The body of worker process ``spec.wid`` (see the module docstring)."""
    # The parent alone handles Ctrl-C (it goes to the whole process group) and stops us.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    die_with_parent(spec.parent_pid, pdeathsig=spec.pdeathsig)
    if spec.driver == "threads":
        _thread_worker(spec, go, epoch, out)
    else:
        run_loop(_async_worker(spec, go, epoch, out))


def run_loop(main: Coroutine[Any, Any, T]) -> T:
    """Run ``main`` on a new event loop: uvloop's when it is installed (``pip install
    'lanequeue[fast]'``: about a sixth less CPU per Redis call), else asyncio's own;
    return its result."""
    uvloop = _uvloop()
    if uvloop is None:
        return asyncio.run(main)
    result: T = uvloop.run(main)
    return result


def loop_name() -> str:
    """The event loop :func:`run_loop` uses here: ``"uvloop"`` or ``"asyncio"``."""
    return "asyncio" if _uvloop() is None else "uvloop"


def _uvloop() -> Any:
    """The uvloop module, or None when it is not installed (an optional extra)."""
    try:
        return importlib.import_module("uvloop")
    except ImportError:
        return None


def _payload(
    rids: Sequence[int], drive: Any, observer: Observer, *, held_back: int, threads: int,
    lanes: dict[str, dict[str, int]], cpu_s: float,
) -> dict[str, Any]:
    """What a worker sends back: its observations per request and its own figures."""
    return {
        "rids": list(rids),
        "dispatch_s": [drive.dispatch_s[r] for r in rids],
        "start_s": [observer.start_s[r] for r in rids],
        "end_s": [observer.end_work_s[r] for r in rids],
        "complete_s": [observer.complete_s[r] for r in rids],
        "errors": drive.errors,
        "held_back": held_back,
        "threads": threads,
        "wall_s": drive.wall_s,
        "lane_stats": lanes,
        "cpu_s": cpu_s,
    }


async def _async_worker(spec: _WorkerSpec, go: Any, epoch: Any, out: Any) -> None:
    """A worker that drives its share as tasks of one event loop on the asyncio Redis
    lanes (:func:`~lanequeue.replay.runtimes.aio.drive_tasks`), behind the
    :class:`~lanequeue.replay.observe.AsyncArrivalGate`."""
    wid = spec.wid
    client: Any = None
    try:
        plan = spec.plan
        rids = range(wid, len(plan.keys), spec.workers)
        client = await connect_async(spec.url)
        queue = build_async_redis_queue(client, plan, prefix=spec.prefix, lease_s=spec.lease_s)
        counter = AsyncRedisCompletionCounter(client, spec.prefix, ttl_s=spec.counter_ttl_s)
        gate = async_arrival_gate(
            queue, plan.lanes[0], plan.keys, counter=counter, poll_s=spec.poll_s,
            max_poll_s=GATE_MAX_POLL_S, max_wait_s=spec.gate_max_wait_s,
        )
    except BaseException as exc:
        out.put(("error", wid, f"worker {wid} failed to start: {told(exc)}"))
        if client is not None:
            await client.aclose()
        return
    try:
        out.put(("ready", wid, None))
        # Nothing else runs on this loop yet: waiting for the go in place blocks nobody.
        if not go.wait(spec.start_timeout_s):  # the parent gave up (or died)
            return
        t0 = float(epoch.value)
        cpu0 = time.process_time()
        try:
            observer = Observer(plan.keys, epoch_s=t0)

            def progress(done: int, total: int) -> None:
                out.put(("progress", wid, done))

            # The loop's clock is time.monotonic, the clock of t0.
            drive = await drive_tasks(
                plan, queue, observer, epoch=t0, clock=time.monotonic, rids=rids,
                gate=gate, progress=progress, tick_s=spec.tick_s,
            )
            out.put(("done", wid, _payload(
                rids, drive, observer, held_back=gate.held_back, threads=0,
                lanes=lane_stats(queue, plan.lanes), cpu_s=time.process_time() - cpu0,
            )))
        except BaseException as exc:
            out.put(("error", wid, f"worker {wid}: {told(exc)}\n"
                     + traceback.format_exc()))
    finally:
        await client.aclose()


def _thread_worker(spec: _WorkerSpec, go: Any, epoch: Any, out: Any) -> None:
    """A worker that drives its share on threads on the thread-face Redis lanes
    (:func:`~lanequeue.replay.runtimes.threads.drive_threads`), behind the
    :class:`~lanequeue.replay.observe.ArrivalGate`."""
    wid = spec.wid
    try:
        plan = spec.plan
        rids = range(wid, len(plan.keys), spec.workers)
        # Up to all of this worker's requests may be in the gate or the lanes at once: a
        # pool that could run dry would fail requests (redis-py's default pool holds 100).
        client = connect(spec.url, max_connections=len(rids) + 16)
        queue = build_redis_queue(client, plan, prefix=spec.prefix, lease_s=spec.lease_s)
        counter = RedisCompletionCounter(client, spec.prefix, ttl_s=spec.counter_ttl_s)
        gate = arrival_gate(
            queue, plan.lanes[0], plan.keys, counter=counter, poll_s=spec.poll_s,
            max_poll_s=GATE_MAX_POLL_S,
            max_wait_s=spec.gate_max_wait_s, one_poller=True,
        )
    except BaseException as exc:
        out.put(("error", wid, f"worker {wid} failed to start: {told(exc)}"))
        return
    out.put(("ready", wid, None))
    if not go.wait(spec.start_timeout_s):  # the parent gave up (or died)
        client.close()
        return
    t0 = float(epoch.value)
    cpu0 = time.process_time()
    try:
        observer = Observer(plan.keys, epoch_s=t0)

        def progress(done: int, total: int) -> None:
            out.put(("progress", wid, done))

        drive = drive_threads(
            plan, queue, gate, observer,
            epoch=t0, rids=rids, progress=progress, tick_s=spec.tick_s,
        )
        out.put(("done", wid, _payload(
            rids, drive, observer, held_back=gate.held_back, threads=drive.threads,
            lanes=lane_stats(queue, plan.lanes), cpu_s=time.process_time() - cpu0,
        )))
    except BaseException as exc:
        out.put(("error", wid, f"worker {wid}: {told(exc)}\n"
                 + traceback.format_exc()))
    finally:
        client.close()


def _split_conversations(keys: Sequence[str], worker_of: Sequence[int]) -> tuple[int, int]:
    """(conversations with >= 2 requests, those whose requests ran in >= 2 workers)."""
    seen: dict[str, set[int]] = {}
    counts: dict[str, int] = {}
    for key, wid in zip(keys, worker_of, strict=True):
        seen.setdefault(key, set()).add(wid)
        counts[key] = counts.get(key, 0) + 1
    multi = sum(1 for c in counts.values() if c >= 2)
    split = sum(1 for s in seen.values() if len(s) >= 2)
    return multi, split


def merge_observations(
    plan: ReplayPlan, payloads: Sequence[dict[str, Any]], workers: int
) -> RunRecord:
    """One :class:`RunRecord` from the workers' payloads: intervals swept together for the
    occupancy figures, start order by start time (one host-wide clock)."""
    n = len(plan.keys)
    dispatch_s = [math.nan] * n
    start_s = [math.nan] * n
    end_s = [math.nan] * n
    complete_s = [math.nan] * n
    worker_of = [-1] * n
    errors: list[tuple[int, str]] = []
    lane_stats: dict[str, dict[str, int]] = {}
    held_back = threads = 0
    for wid, payload in enumerate(payloads):
        for i, rid in enumerate(payload["rids"]):
            dispatch_s[rid] = payload["dispatch_s"][i]
            start_s[rid] = payload["start_s"][i]
            end_s[rid] = payload["end_s"][i]
            complete_s[rid] = payload["complete_s"][i]
            worker_of[rid] = wid
        errors += [(int(r), str(e)) for r, e in payload["errors"]]
        held_back += int(payload["held_back"])
        threads += int(payload["threads"])
        for name, stats in payload["lane_stats"].items():
            total = lane_stats.setdefault(name, {})
            for k, v in stats.items():
                total[k] = total.get(k, 0) + int(v)
    started = [rid for rid in range(n) if not math.isnan(start_s[rid])]
    start_order = sorted(started, key=lambda rid: (start_s[rid], rid))
    by_key: dict[str, tuple[list[float], list[float]]] = {}
    for rid in started:
        starts, ends = by_key.setdefault(plan.keys[rid], ([], []))
        starts.append(start_s[rid])
        ends.append(end_s[rid] if not math.isnan(end_s[rid]) else math.inf)
    max_key = max((peak_concurrency(s, e) for s, e in by_key.values()), default=0)
    all_starts = [start_s[rid] for rid in started]
    all_ends = [end_s[rid] if not math.isnan(end_s[rid]) else math.inf for rid in started]
    finished = [t for t in complete_s if not math.isnan(t)]
    wall = max(finished) if finished else 0.0
    return RunRecord(
        dispatch_s=dispatch_s,
        start_s=start_s,
        complete_s=complete_s,
        start_order=start_order,
        max_key_concurrency=max_key,
        peak_global=peak_concurrency(all_starts, all_ends),
        registry_peak=None,
        registry_final=None,
        wall_s=wall,
        held_back=held_back,
        threads=threads,
        lane_stats=lane_stats,
        errors=sorted(errors),
        workers=workers,
        worker_of=worker_of,
    )


class RedisProcessRuntime:
    """``workers`` processes drive a plan through Redis lanes (see the module docstring).

    Args:
        url: the Redis server, ``redis://HOST[:PORT][/DB]`` (``rediss://``, ``unix://``).
        workers: worker processes, >= 1; request ``i`` goes to worker ``i mod workers``.
        lease_s: lease of every grant, seconds (renewed while held); None: the Redis
            lanes' own default, :data:`lanequeue.redis.DEFAULT_LEASE_S`.
        poll_s: the arrival gate's poll interval while a predecessor is not inside yet.
        gate_max_wait_s: the gate gives up (error) after waiting this long.
        lead_s: seconds between releasing the workers and the first arrival.
        tick_s: seconds between two progress reports of a worker.
        start_timeout_s: seconds the workers may take to start and connect.
        stall_s: the run stops with BackendError when no request finished for this many
            seconds while some are left (None: 60 s plus twice the longest work time
            plus twice the lease).
        driver: how each worker process drives its share (:data:`DRIVERS`): ``"asyncio"``
            (the default: tasks of one event loop on the asyncio Redis lanes) or
            ``"threads"`` (a thread per request in flight on the thread-face Redis
            lanes). It is the runtime's ``name``.

    Raises:
        ValueError: ``driver`` is not one of :data:`DRIVERS`.
        TypeError, ValueError: ``workers`` is not an integer from 1 to 1024.

    Worker processes end with their parent, however it ends (``PR_SET_PDEATHSIG`` on
    Linux and a parent watch in each worker: :func:`die_with_parent`); SIGTERM and Ctrl-C
    of the parent stop the run (workers terminated, the run's keys deleted) and raise
    KeyboardInterrupt.
    """

    name = "asyncio"

    def __init__(
        self,
        url: str,
        workers: int = 1,
        *,
        lease_s: float | None = None,
        poll_s: float = 0.002,
        gate_max_wait_s: float | None = 120.0,
        lead_s: float = 0.1,
        tick_s: float = 0.25,
        start_timeout_s: float = 60.0,
        stall_s: float | None = None,
        driver: str = "asyncio",
    ) -> None:
        check_workers(workers)
        if driver not in DRIVERS:
            raise ValueError(f"driver must be one of {', '.join(DRIVERS)}, got {driver!r}")
        self.name = driver
        self.url = url
        self.workers = workers
        self._lease_s = lease_s
        self._poll_s = poll_s
        self._gate_max_wait_s = gate_max_wait_s
        self._lead_s = lead_s
        self._tick_s = tick_s
        self._start_timeout_s = start_timeout_s
        self._stall_s_arg = stall_s
        self._stall_s = 0.0

    def run(self, plan: ReplayPlan, progress: ProgressFn | None = None) -> RunRecord:
        """Replay ``plan`` across the worker processes in real time; merge what they saw.

        Raises:
            BackendError: the server cannot be reached, or a worker failed or died.
        """
        client = connect(self.url)  # redis-py is importable from here on
        if self._lease_s is None:
            from lanequeue.redis import DEFAULT_LEASE_S

            self._lease_s = DEFAULT_LEASE_S
        # SIGTERM stops the run like Ctrl-C: workers terminated, the run's keys deleted,
        # KeyboardInterrupt raised to the caller (the command prints "interrupted").
        previous = None
        if threading.current_thread() is threading.main_thread():
            previous = signal.signal(signal.SIGTERM, _interrupt)
        try:
            return self._run(client, plan, progress)
        finally:
            if previous is not None:
                signal.signal(signal.SIGTERM, previous)
            client.close()

    def _run(self, client: Any, plan: ReplayPlan, progress: ProgressFn | None) -> RunRecord:
        assert self._lease_s is not None  # set by run()
        n = len(plan.keys)
        self._stall_s = self._stall_s_arg if self._stall_s_arg is not None else (
            60.0 + 2.0 * max(plan.work_s, default=0.0) + 2.0 * self._lease_s
        )
        w = self.workers
        prefix = f"{PREFIX_BASE}:{uuid.uuid4().hex}"
        # Long enough that no counter can expire while a successor may still look at it:
        # twice the longest the run could last if everything ran one after the other.
        span = (plan.arrival_s[-1] if n else 0.0) + math.fsum(plan.work_s)
        counter_ttl_s = 600.0 + 2.0 * span
        ctx = mp.get_context("spawn")
        go = ctx.Event()
        epoch = ctx.Value("d", 0.0)
        out = ctx.Queue()
        procs: list[Any] = []
        payloads: dict[int, dict[str, Any]] = {}
        try:
            for wid in range(w):
                spec = _WorkerSpec(
                    wid=wid, workers=w, url=self.url, prefix=prefix, plan=plan,
                    lease_s=self._lease_s, poll_s=self._poll_s,
                    gate_max_wait_s=self._gate_max_wait_s, counter_ttl_s=counter_ttl_s,
                    tick_s=self._tick_s, start_timeout_s=self._start_timeout_s + 30.0,
                    parent_pid=os.getpid(),
                    pdeathsig=threading.current_thread() is threading.main_thread(),
                    driver=self.name,
                )
                proc = ctx.Process(
                    target=_worker_main, args=(spec, go, epoch, out),
                    name=f"lanequeue-replay-worker-{wid}", daemon=True,
                )
                proc.start()
                procs.append(proc)
            self._await_ready(out, procs)
            epoch.value = time.monotonic() + self._lead_s
            go.set()
            payloads = self._collect(out, procs, n, progress)
        except BaseException:
            for proc in procs:
                if proc.is_alive():
                    proc.terminate()
            for proc in procs:
                proc.join(10)
            try:  # best effort: the run's keys would expire anyway (all have a TTL)
                _delete_keys(client, _run_keys(client, prefix))
            except Exception:
                pass
            raise
        for proc in procs:
            proc.join(10)
        record = merge_observations(plan, [payloads[wid] for wid in range(w)], w)
        record.backend = redact_url(self.url)
        record.backend_info = self._finish(client, plan, prefix, record)
        cpu_s = math.fsum(float(payloads[wid].get("cpu_s", 0.0)) for wid in range(w))
        record.backend_info["driver"] = self.name
        if self.name == "asyncio":
            record.backend_info["event_loop"] = loop_name()
        record.backend_info["worker_cpu_s"] = round(cpu_s, 3)
        record.backend_info["worker_cpu_ms_per_request"] = (
            round(1000.0 * cpu_s / n, 4) if n else None
        )
        if plan.lanes[0].per_key:
            record.registry_final = record.backend_info["keys_held_or_waited_at_end"]
        if progress is not None:
            progress(n, n)
        return record

    def _await_ready(self, out: Any, procs: Sequence[Any]) -> None:
        """Wait until every worker has connected and built its lanes."""
        ready: set[int] = set()

        def handle(kind: str, wid: int, body: Any) -> None:
            if kind != "ready":
                raise BackendError(str(body))
            ready.add(wid)

        deadline = time.monotonic() + self._start_timeout_s
        while len(ready) < len(procs):
            _pump(out, procs, ready, handle)
            if len(ready) < len(procs) and time.monotonic() > deadline:
                raise BackendError(
                    f"the worker processes did not start within {self._start_timeout_s:g} s"
                )

    def _collect(
        self, out: Any, procs: Sequence[Any], n: int, progress: ProgressFn | None
    ) -> dict[int, dict[str, Any]]:
        """Read the workers' messages until every one has sent its observations."""
        payloads: dict[int, dict[str, Any]] = {}
        done = [0] * len(procs)

        def handle(kind: str, wid: int, body: Any) -> None:
            if kind == "progress":
                done[wid] = int(body)
            elif kind == "done":
                payloads[wid] = body
                done[wid] = len(body["rids"])
            else:
                raise BackendError(str(body))
            if progress is not None:
                progress(sum(done), n)

        # Never hang: a run in which no request finishes for ``stall_s`` seconds (while
        # some are left) stops with an error naming what is left.
        last, moved = -1, time.monotonic()
        while len(payloads) < len(procs):
            _pump(out, procs, payloads, handle)
            now, total = time.monotonic(), sum(done)
            if total != last:
                last, moved = total, now
            elif now - moved > self._stall_s:
                raise BackendError(
                    f"no request finished for {self._stall_s:g} s ({total} of {n} done; "
                    f"workers still running: "
                    f"{[wid for wid in range(len(procs)) if wid not in payloads]}): "
                    f"stopping the run"
                )
        return payloads

    def _finish(
        self, client: Any, plan: ReplayPlan, prefix: str, record: RunRecord
    ) -> dict[str, Any]:
        """The backend's figures after the run; then delete the run's keys."""
        from lanequeue.redis import RedisSessionLane

        info: dict[str, Any] = {
            "prefix": prefix,
            "lease_s": self._lease_s,
            "gate_poll_s": self._poll_s,
        }
        assert record.worker_of is not None
        multi, split = _split_conversations(plan.keys, record.worker_of)
        info["conversations_with_several_requests"] = multi
        info["conversations_split_across_workers"] = split
        info["requests_per_worker"] = [
            sum(1 for x in record.worker_of if x == wid) for wid in range(self.workers)
        ]
        first = plan.lanes[0]
        if first.per_key:
            lane = RedisSessionLane(client, first.name, prefix=prefix, timeout_s=None)
            left = 0
            for key in dict.fromkeys(plan.keys):
                if lane.is_held(key) or lane.waiting_for(key):
                    left += 1
            info["keys_held_or_waited_at_end"] = left
        # Every key of the run: count, check TTLs, delete (every worker has exited).
        names = _run_keys(client, prefix)
        no_ttl = 0
        for start in range(0, len(names), 500):
            pipe = client.pipeline(transaction=False)
            for name in names[start : start + 500]:
                pipe.pttl(name)
            no_ttl += sum(1 for ttl in pipe.execute() if ttl == -1)
        counters = sum(1 for name in names if _text(name).startswith(f"{prefix}:done:"))
        info["redis_keys_at_end"] = len(names)
        info["redis_counter_keys_at_end"] = counters
        info["redis_keys_without_ttl"] = no_ttl
        info["redis_keys_deleted"] = _delete_keys(client, names)
        return info


def _interrupt(signum: int, frame: Any) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


def _pump(
    out: Any,
    procs: Sequence[Any],
    answered: Container[int],
    handle: Callable[[str, int, Any], None],
    *,
    window_s: float = 0.5,
) -> None:
    """Hand the workers' messages to ``handle`` for about ``window_s`` seconds, then check
    that every worker that has not ``answered`` is alive: one that is gone raises
    BackendError (after its last messages, which may still be in the pipe, are read)."""

    def drain(seconds: float) -> None:
        end = time.monotonic() + seconds
        while (left := end - time.monotonic()) > 0:
            try:
                kind, wid, body = out.get(timeout=left)
            except queue_mod.Empty:
                break
            handle(kind, wid, body)

    drain(window_s)
    gone = [wid for wid, proc in enumerate(procs) if wid not in answered and not proc.is_alive()]
    if not gone:
        return
    drain(1.0)  # what a worker sent just before exiting
    for wid in gone:
        if wid not in answered:
            raise BackendError(f"worker {wid} died (exit code {procs[wid].exitcode})")


def _run_keys(client: Any, prefix: str) -> list[Any]:
    """Every key of the run (the lanes' ``{prefix:...}`` keys and the counters)."""
    return list(client.scan_iter(match=f"*{prefix}*", count=1000))


def _delete_keys(client: Any, names: Sequence[Any]) -> int:
    """Delete ``names``; return how many existed."""
    deleted = 0
    for start in range(0, len(names), 500):
        deleted += int(client.delete(*names[start : start + 500]))
    return deleted


def _text(name: bytes | str) -> str:
    return name.decode("utf-8", "replace") if isinstance(name, bytes) else name
