"""Contended and scaling sections of ``benchmarks/run.py`` (issue 12's rows).

contended: acquisitions per second with many threads or tasks, ours against the plain
baseline of the same shape, alternated in rounds in one run (the figure is the median of
the rounds, the ratio the median of per-round ratios):

- 2 / 8 / 64 threads on one key: ``SessionLane`` vs a dict of ``threading.Lock``;
- 2 / 8 / 64 tasks on one key: ``AsyncSessionLane`` vs a dict of ``asyncio.Lock``;
- 64 threads over 64 keys, a global lane of 8: ``acquire_all(key, [session, global])``
  vs a dict of Locks plus a ``threading.Semaphore(8)``;
- 1,000 tasks over 100 keys, a global lane of 8: the asyncio twin (vs ``asyncio.Lock``
  per key plus ``asyncio.Semaphore(8)``).

scaling: cost per unit as a size grows, each row against the smallest size of its series;
a unit cost more than twice the smallest one is flagged ``SUPER-LINEAR?``:

- ns per uncontended ``with SessionLane.acquire`` with 10^2 .. 10^6 live (idle) keys;
- ns per waiter to drain N waiters of one key (asyncio, N = 10 .. 10^5), vs
  ``asyncio.Lock`` with the same line;
- ns per lane of an uncontended ``acquire_all`` over 1 .. 16 lanes;
- bytes per waiting task (``tracemalloc``), ours vs ``asyncio.Lock``.

Rows are short (a few tenths of a second each); ``--quick`` shrinks them further.
"""

from __future__ import annotations

import asyncio
import threading
import time
import tracemalloc
from collections.abc import Awaitable, Callable

from bench_common import Config, Row, gc_paused, median, per_round_ratio, spread

import lanequeue
from lanequeue import AsyncSessionLane, LaneQueue, SessionLane

__all__ = ["section_contended", "section_scaling"]

FLAG = 2.0  # unit cost above FLAG x the smallest size's: flagged as super-linear


def _rounds(cfg: Config) -> int:
    return 2 if cfg.quick else 3


def _window(cfg: Config) -> float:
    return 0.08 if cfg.quick else 0.25


# -- contended: threads ------------------------------------------------------------------


def _threads_rate(n_threads: int, window_s: float, body: Callable[[int], None]) -> float:
    """Acquisitions per second of ``n_threads`` threads running ``body(i)`` in a loop for
    ``window_s`` seconds (``body`` does one acquire+release and returns)."""
    stop = threading.Event()
    counts = [0] * n_threads
    start = threading.Barrier(n_threads + 1)

    def run(i: int) -> None:
        start.wait()
        n = 0
        while not stop.is_set():
            body(i)
            n += 1
        counts[i] = n

    threads = [threading.Thread(target=run, args=(i,), daemon=True) for i in range(n_threads)]
    for t in threads:
        t.start()
    start.wait()
    t0 = time.perf_counter()
    time.sleep(window_s)
    stop.set()
    for t in threads:
        t.join()
    return sum(counts) / (time.perf_counter() - t0)


def _ours_one_key() -> Callable[[int], None]:
    lane = SessionLane(timeout_s=None, warn_after_s=None)

    def body(i: int) -> None:
        with lane.acquire("k"):
            pass

    return body


def _locks_one_key() -> Callable[[int], None]:
    guard = threading.Lock()
    locks: dict[str, threading.Lock] = {}

    def body(i: int) -> None:
        with guard:
            lock = locks.get("k")
            if lock is None:
                lock = locks["k"] = threading.Lock()
        with lock:
            pass

    return body


def _ours_keys_global() -> Callable[[int], None]:
    queue = LaneQueue(warn_after_s=None)
    queue.add_session_lane("session", timeout_s=None)
    queue.add_lane("global", max_concurrent=8, timeout_s=None)
    names = ["session", "global"]

    def body(i: int) -> None:
        with queue.acquire_all(f"k{i}", names):
            pass

    return body


def _locks_keys_global() -> Callable[[int], None]:
    guard = threading.Lock()
    locks: dict[str, threading.Lock] = {}
    sem = threading.Semaphore(8)

    def body(i: int) -> None:
        key = f"k{i}"
        with guard:
            lock = locks.get(key)
            if lock is None:
                lock = locks[key] = threading.Lock()
        with lock, sem:
            pass

    return body


def _ratio_rows(
    section: str, what: str, unit_rate: str, ours: list[float], base: list[float],
    base_name: str,
) -> list[Row]:
    ratio = median(per_round_ratio(ours, base))  # rates, round by round
    return [
        Row(section, f"ours  {what}", round(median(ours)), unit_rate,
            f"+-{spread(ours):.0%}; min {min(ours):,.0f}",
            data={"rounds": ours}),
        Row(section, f"{base_name}  {what}", round(median(base)), unit_rate,
            f"+-{spread(base):.0%}", data={"rounds": base}),
        Row(section, f"ratio ours/{base_name}  {what}", ratio, "x",
            "acquisitions per second, median of per-round ratios (>1: ours faster)"),
    ]


# -- contended: tasks --------------------------------------------------------------------


async def _tasks_rate(n_tasks: int, window_s: float,
                      body: Callable[[int], Awaitable[None]]) -> float:
    stop = False
    counts = [0] * n_tasks

    async def run(i: int) -> None:
        n = 0
        while not stop:
            await body(i)
            n += 1
        counts[i] = n

    tasks = [asyncio.create_task(run(i)) for i in range(n_tasks)]
    await asyncio.sleep(0)
    t0 = time.perf_counter()
    await asyncio.sleep(window_s)
    stop = True
    await asyncio.gather(*tasks)
    return sum(counts) / (time.perf_counter() - t0)


def _aours_one_key() -> Callable[[int], Awaitable[None]]:
    lane = AsyncSessionLane(timeout_s=None, warn_after_s=None)

    async def body(i: int) -> None:
        async with lane.acquire("k"):
            await asyncio.sleep(0)

    return body


def _alocks_one_key() -> Callable[[int], Awaitable[None]]:
    locks: dict[str, asyncio.Lock] = {}

    async def body(i: int) -> None:
        lock = locks.get("k")
        if lock is None:
            lock = locks["k"] = asyncio.Lock()
        async with lock:
            await asyncio.sleep(0)

    return body


def _aours_keys_global() -> Callable[[int], Awaitable[None]]:
    queue = lanequeue.AsyncLaneQueue(warn_after_s=None)
    queue.add_session_lane("session", timeout_s=None)
    queue.add_lane("global", max_concurrent=8, timeout_s=None)
    names = ["session", "global"]

    async def body(i: int) -> None:
        async with queue.acquire_all(f"k{i % 100}", names):
            await asyncio.sleep(0)

    return body


def _alocks_keys_global() -> Callable[[int], Awaitable[None]]:
    locks: dict[str, asyncio.Lock] = {}
    sem = asyncio.Semaphore(8)

    async def body(i: int) -> None:
        key = f"k{i % 100}"
        lock = locks.get(key)
        if lock is None:
            lock = locks[key] = asyncio.Lock()
        async with lock, sem:
            await asyncio.sleep(0)

    return body


def section_contended(cfg: Config) -> list[Row]:
    rows: list[Row] = []
    window = _window(cfg)
    with gc_paused():
        for n in (2, 8, 64):
            ours: list[float] = []
            base: list[float] = []
            for _ in range(_rounds(cfg)):
                ours.append(_threads_rate(n, window, _ours_one_key()))
                base.append(_threads_rate(n, window, _locks_one_key()))
            rows += _ratio_rows("contended", f"{n} threads, 1 key", "acq/s", ours, base,
                                "dict of Lock")
        ours, base = [], []
        for _ in range(_rounds(cfg)):
            ours.append(_threads_rate(64, window, _ours_keys_global()))
            base.append(_threads_rate(64, window, _locks_keys_global()))
        rows += _ratio_rows("contended", "64 threads, 64 keys, global 8", "acq/s", ours,
                            base, "Locks+Semaphore")

        async def tasks() -> None:
            nonlocal rows
            for n in (2, 8, 64):
                a: list[float] = []
                b: list[float] = []
                for _ in range(_rounds(cfg)):
                    a.append(await _tasks_rate(n, window, _aours_one_key()))
                    b.append(await _tasks_rate(n, window, _alocks_one_key()))
                rows += _ratio_rows("contended", f"{n} tasks, 1 key", "acq/s", a, b,
                                    "dict of asyncio.Lock")
            a, b = [], []
            for _ in range(_rounds(cfg)):
                a.append(await _tasks_rate(1000, window, _aours_keys_global()))
                b.append(await _tasks_rate(1000, window, _alocks_keys_global()))
            rows += _ratio_rows("contended", "1,000 tasks, 100 keys, global 8", "acq/s", a,
                                b, "asyncio Lock+Semaphore")

        asyncio.run(tasks())
    return rows


# -- scaling -----------------------------------------------------------------------------


def _flagged(unit: float, smallest: float) -> str:
    growth = unit / smallest
    flag = f"  SUPER-LINEAR? (> {FLAG:g}x)" if growth > FLAG else ""
    return f"{growth:.2f}x the smallest size's unit cost{flag}"


def _live_keys_cost(n_keys: int, cycles: int) -> float:
    """ns per uncontended ``with lane.acquire(key)`` cycling over ``n_keys`` live idle
    keys (the registry holds them all: no eviction, no expiry)."""
    lane = SessionLane(max_sessions=n_keys, idle_timeout_s=None, warn_after_s=None)
    keys = [f"gateway:web:{i}" for i in range(n_keys)]
    for key in keys:
        with lane.acquire(key):
            pass
    seq = (keys * (cycles // n_keys + 1))[:cycles]  # every key in turn
    acquire = lane.acquire
    best = float("inf")
    for _ in range(3):
        t0 = time.perf_counter()
        for key in seq:
            with acquire(key):
                pass
        best = min(best, (time.perf_counter() - t0) / cycles)
    assert lane.session_count == n_keys
    return best * 1e9


async def _drain_cost(n_waiters: int, ours: bool) -> float:
    """ns per waiter from the holder's release to the last of ``n_waiters`` waiters of
    one key having taken and released it."""
    if ours:
        lane = AsyncSessionLane(timeout_s=None, warn_after_s=None)
        hold = lane.acquire("k")
        await hold.__aenter__()

        async def waiter() -> None:
            async with lane.acquire("k"):
                pass
    else:
        lock = asyncio.Lock()
        await lock.acquire()

        async def waiter() -> None:
            async with lock:
                pass

    tasks = [asyncio.create_task(waiter()) for _ in range(n_waiters)]
    await asyncio.sleep(0)  # every waiter in line
    t0 = time.perf_counter()
    if ours:
        await hold.__aexit__(None, None, None)
    else:
        lock.release()
    await asyncio.gather(*tasks)
    return (time.perf_counter() - t0) / n_waiters * 1e9


async def _bytes_per_waiter(n_waiters: int, ours: bool) -> float:
    """Python heap bytes (tracemalloc) per task waiting for one held key: the task, its
    coroutine and what the lock keeps for it (our waiter, its future, its line entry and
    deadline; ``asyncio.Lock``'s future and deque slot)."""
    lane = AsyncSessionLane(timeout_s=300.0, warn_after_s=None)
    lock = asyncio.Lock()
    if ours:
        assert lane.try_acquire_nowait("k")
    else:
        await lock.acquire()

    async def waiter() -> None:
        if ours:
            async with lane.acquire("k"):
                pass
        else:
            async with lock:
                pass

    tracemalloc.start()
    before = tracemalloc.get_traced_memory()[0]
    tasks = [asyncio.create_task(waiter()) for _ in range(n_waiters)]
    await asyncio.sleep(0)  # every waiter in line
    used = tracemalloc.get_traced_memory()[0] - before
    tracemalloc.stop()
    if ours:
        assert lane.manual_release_nowait("k")
    else:
        lock.release()
    await asyncio.gather(*tasks)
    return used / n_waiters


def _acquire_all_cost(n_lanes: int, cycles: int) -> float:
    queue = LaneQueue(warn_after_s=None)
    names = [f"lane{i}" for i in range(n_lanes)]
    for name in names:
        queue.add_lane(name, max_concurrent=8)
    best = float("inf")
    for _ in range(3):
        t0 = time.perf_counter()
        for _ in range(cycles):
            with queue.acquire_all("k", names):
                pass
        best = min(best, (time.perf_counter() - t0) / cycles)
    return best * 1e9 / n_lanes


def section_scaling(cfg: Config) -> list[Row]:
    rows: list[Row] = []
    sizes = [10**2, 10**3, 10**4, 10**5] + ([] if cfg.quick else [10**6])
    cycles = 20_000 if cfg.quick else 100_000
    with gc_paused():
        costs = []
        for n in sizes:
            cost = _live_keys_cost(n, cycles)
            costs.append(cost)
            rows.append(Row("scaling", f"ours  SessionLane cycle, {n:,} live keys", cost,
                            "ns/op", _flagged(cost, costs[0]), data={"keys": n}))
        waiters = [10, 100, 1000, 10_000] + ([] if cfg.quick else [100_000])

        async def drains() -> None:
            first_ours = first_lock = 0.0
            for n in waiters:
                ours = median([await _drain_cost(n, True) for _ in range(_rounds(cfg))])
                lock = median([await _drain_cost(n, False) for _ in range(_rounds(cfg))])
                first_ours = first_ours or ours
                first_lock = first_lock or lock
                rows.append(Row("scaling", f"ours  drain {n:,} waiters of one key", ours,
                                "ns/waiter", _flagged(ours, first_ours)))
                rows.append(Row("scaling", f"asyncio.Lock  drain {n:,} waiters", lock,
                                "ns/waiter", _flagged(lock, first_lock)))
                rows.append(Row("scaling", f"ratio ours/asyncio.Lock  drain {n:,}",
                                ours / lock, "x", "median of rounds"))

            n = 1000 if cfg.quick else 10_000
            ours_b = await _bytes_per_waiter(n, True)
            lock_b = await _bytes_per_waiter(n, False)
            rows.append(Row("scaling", f"ours  bytes per waiting task ({n:,} waiting)",
                            round(ours_b), "B", "task and coroutine included"))
            rows.append(Row("scaling", f"asyncio.Lock  bytes per waiting task ({n:,})",
                            round(lock_b), "B", f"ours/asyncio.Lock {ours_b / lock_b:.2f}x"))

        asyncio.run(drains())
        per_lane: list[float] = []
        for n in (1, 2, 4, 8, 16):
            cost = _acquire_all_cost(n, cycles // 10)
            per_lane.append(cost)
            rows.append(Row("scaling", f"ours  acquire_all over {n} lanes, per lane", cost,
                            "ns/lane", _flagged(cost, per_lane[0])))
    return rows
