"""The asyncio section of ``benchmarks/run.py``: uncontended cost and two-task hand-off.

Our :class:`lanequeue.AsyncSessionLane` (and ``acquire_all`` on
:func:`lanequeue.build_default_async_lanes`) against the per-key locks people write or
install for asyncio: a dict of ``asyncio.Lock`` (get-or-create, then ``async with``) and the
``asyncio-keyed-lock`` package from PyPI (``async with lock(key)``). That package is a
benchmark-only dependency (``pip install asyncio-keyed-lock``); without it the section says
so in a row and still measures the rest.

Every candidate runs in ONE ``asyncio.run``: the same event loop, interleaved rounds (one
batch of n operations per candidate per round, timed inside one coroutine with
``perf_counter``, the cyclic GC paused), each figure the median of its rounds and each ratio
the median of the per-round ratios, as in :func:`bench_common.interleave`.
"""

from __future__ import annotations

import asyncio
import gc
import time
from collections.abc import Awaitable, Callable
from typing import Any

from bench_common import Config, Row, gc_paused, median, per_round_ratio, spread, verdict

import lanequeue
from lanequeue import build_gateway_session_key

__all__ = ["section_asyncio"]

DICT_GOAL = 1.5  # ours / dict of asyncio.Lock, ns per uncontended acquire+release: <= 1.5
KEYED_GOAL = 1.0  # ours / asyncio-keyed-lock: < 1 (strictly faster)

KEYED_PACKAGE = "asyncio-keyed-lock"  # the PyPI name; imported as asyncio_keyed_lock
KEYED_INSTALL = f"to compare, pip install {KEYED_PACKAGE} (or lanequeue[bench])"

# The same realistic session key as the thread sections.
KEY = build_gateway_session_key("slack", "C12345", "U789", thread_id="1234567890.123456")

# A batch: run(n) does n operations and may return extra figures of that batch (a dict).
Batch = Callable[[int], Awaitable[Any]]


def _keyed_lock_factory() -> tuple[Callable[[], Any] | None, str]:
    """(class of the keyed lock, its version) or (None, why it is missing)."""
    try:
        from asyncio_keyed_lock import AsyncioKeyedLock
    except ImportError as exc:
        return None, f"{type(exc).__name__}: {exc}"
    try:
        from importlib.metadata import version

        ver = version(KEYED_PACKAGE)
    except Exception:  # importable but not installed as a distribution (vendored, path)
        ver = "?"
    return AsyncioKeyedLock, ver


# -- the harness (the asyncio twin of bench_common.interleave) -------------------------------


async def _time_batch(run: Batch, n: int) -> tuple[float, Any]:
    with gc_paused():
        t0 = time.perf_counter()
        extra = await run(n)
        dt = time.perf_counter() - t0
    return dt, extra


async def ainterleave(
    candidates: dict[str, Batch],
    rounds: int,
    batch_s: float,
    groups: list[list[str]] | None = None,
) -> tuple[dict[str, list[float]], dict[str, list[Any]]]:
    """Time each candidate's ``await run(n)`` in ``rounds`` rounds, alternating, inside the
    running loop. Calibration, groups and rotation as :func:`bench_common.interleave`,
    except that the order inside a group rotates too (groups here may have three members).
    Returns (ns per operation per round, what each batch returned per round)."""
    sizes: dict[str, int] = {}
    for name, run in candidates.items():
        n = 100
        while True:
            t, _ = await _time_batch(run, n)
            if t >= batch_s / 5 or n >= 1 << 24:
                break
            n *= 5
        sizes[name] = max(100, int(n * batch_s / max(t, 1e-9)))
        gc.collect()
    if groups is None:
        groups = [[name] for name in candidates]
    grouped = {name for g in groups for name in g}
    groups = groups + [[name] for name in candidates if name not in grouped]
    ns: dict[str, list[float]] = {name: [] for name in candidates}
    extras: dict[str, list[Any]] = {name: [] for name in candidates}
    for r in range(rounds):
        k = r % len(groups)
        for group in groups[k:] + groups[:k]:
            j = r % len(group)
            inner = group[j:] + group[:j]
            for name in (reversed(inner) if (r // len(group)) % 2 else inner):
                n = sizes[name]
                dt, extra = await _time_batch(candidates[name], n)
                ns[name].append(dt / n * 1e9)
                extras[name].append(extra)
        gc.collect()
    return ns, extras


# -- 1. uncontended acquire + release ----------------------------------------------------------


def _loop_lane(lane: Any, key: str) -> Batch:
    async def run(n: int) -> None:
        for _ in range(n):
            async with lane.acquire(key):
                pass

    return run


def _loop_queue(queue: Any, key: str, names: list[str]) -> Batch:
    async def run(n: int) -> None:
        for _ in range(n):
            async with queue.acquire_all(key, names):
                pass

    return run


def _loop_lock() -> Batch:
    lock = asyncio.Lock()

    async def run(n: int) -> None:
        for _ in range(n):
            async with lock:
                pass

    return run


def _loop_lock_dict(key: str) -> Batch:
    # One event loop, one thread: no guard is needed around the get-or-create.
    locks: dict[str, asyncio.Lock] = {}

    async def run(n: int) -> None:
        for _ in range(n):
            lk = locks.get(key)
            if lk is None:
                lk = locks[key] = asyncio.Lock()
            async with lk:
                pass

    return run


def _loop_keyed(keyed: Any, key: str) -> Batch:
    async def run(n: int) -> None:
        for _ in range(n):
            async with keyed(key):
                pass

    return run


# -- 2. two tasks handing one key back and forth ---------------------------------------------


class _NoLock:
    """No lock at all: what two tasks yielding to each other cost (the loop's floor)."""

    __slots__ = ()

    async def __aenter__(self) -> None:
        return None

    async def __aexit__(self, *exc: object) -> None:
        return None


def _handoff(acquire: Callable[[str], Any]) -> Batch:
    """Two tasks loop ``async with acquire(KEY): count; await asyncio.sleep(0)`` until
    together they have made ``n`` acquisitions.

    The ``sleep(0)`` is inside the hold: the holder yields while holding, so the other task
    runs, finds the key held and queues behind it; the holder's release then finds a waiter.
    Counts are kept inside the critical section; an acquisition is a hand-off when the
    previous one was made by the other task.
    """

    async def run(n: int) -> dict[str, float]:
        counts = [0, 0]
        last = [-1]
        switches = [0]
        sleep = asyncio.sleep

        async def worker(me: int) -> None:
            while True:
                async with acquire(KEY):
                    if counts[0] + counts[1] >= n:
                        return
                    counts[me] += 1
                    if last[0] != me:
                        last[0] = me
                        switches[0] += 1
                    await sleep(0)

        await asyncio.gather(worker(0), worker(1))
        acq = counts[0] + counts[1]
        return {
            "handoff_frac": switches[0] / acq if acq else 0.0,
            "min_share": min(counts) / acq if acq else 0.0,
        }

    return run


# -- the section -------------------------------------------------------------------------------


async def _measure(cfg: Config, keyed_cls: Callable[[], Any] | None) -> dict[str, Any]:
    names = ["session", "global"]
    unc: dict[str, Batch] = {
        "lock": _loop_lock(),
        "lock_dict": _loop_lock_dict(KEY),
        "ours_session": _loop_lane(lanequeue.AsyncSessionLane(), KEY),
        "ours_all": _loop_queue(lanequeue.build_default_async_lanes(), KEY, names),
    }
    trio = ["ours_session", "lock_dict"]
    if keyed_cls is not None:
        unc["keyed"] = _loop_keyed(keyed_cls(), KEY)
        trio.append("keyed")
    unc_ns, _ = await ainterleave(unc, cfg.rounds, cfg.batch_s,
                                  [["lock"], trio, ["ours_all"]])

    locks: dict[str, asyncio.Lock] = {}

    def lock_dict_acquire(key: str) -> asyncio.Lock:
        lk = locks.get(key)
        if lk is None:
            lk = locks[key] = asyncio.Lock()
        return lk

    nolock = _NoLock()
    ho: dict[str, Batch] = {
        "ours": _handoff(lanequeue.AsyncSessionLane().acquire),
        # The default lane waits up to 300 s, so each wait arms and cancels a loop timer;
        # asyncio.Lock has no timeout. This one shows what the timer costs.
        "ours_notimeout": _handoff(lanequeue.AsyncSessionLane(timeout_s=None).acquire),
        "lock_dict": _handoff(lock_dict_acquire),
        "floor": _handoff(lambda _key: nolock),
    }
    if keyed_cls is not None:
        ho["keyed"] = _handoff(keyed_cls())
    # Hand-off batches are longer: each acquisition costs a few loop iterations.
    ho_ns, ho_extra = await ainterleave(ho, cfg.rounds, cfg.batch_s * 2,
                                        [[k for k in ho if k != "floor"], ["floor"]])
    return {"unc": unc_ns, "ho": ho_ns, "ho_extra": ho_extra,
            "loop": type(asyncio.get_running_loop()).__name__}


def section_asyncio(cfg: Config) -> list[Row]:
    """asyncio: ns per uncontended ``async with``, and two tasks handing one key over."""
    keyed_cls, keyed_ver = _keyed_lock_factory()
    have_keyed = keyed_cls is not None
    got = asyncio.run(_measure(cfg, keyed_cls), debug=False)
    unc, ho, ho_extra = got["unc"], got["ho"], got["ho_extra"]
    sec = "asyncio"
    rows: list[Row] = []

    # -- uncontended --
    lock_ns = median(unc["lock"])
    labels = [
        ("lock", "asyncio.Lock  (async with lock:)"),
        ("lock_dict", "dict of asyncio.Lock (get-or-create, async with)"),
        ("keyed", f"asyncio-keyed-lock {keyed_ver}  async with lock(key)"),
        ("ours_session", "ours  AsyncSessionLane.acquire(key)"),
        ("ours_all", "ours  async acquire_all(key, [session, global])"),
    ]
    for cid, label in labels:
        if cid == "keyed" and not have_keyed:
            rows.append(Row(sec, f"{KEYED_PACKAGE}  async with lock(key)", None, "",
                            f"not importable ({keyed_ver}); {KEYED_INSTALL}",
                            data={"missing": keyed_ver}))
            continue
        ns = median(unc[cid])
        note = f"+-{spread(unc[cid]) * 100:.0f}%"
        if cid != "lock":
            note += f", {ns / lock_ns:.1f}x asyncio.Lock"
        rows.append(Row(sec, label, ns, "ns/op", note,
                        data={"rounds_ns": unc[cid], "event_loop": got["loop"]}))

    r_dict = per_round_ratio(unc["ours_session"], unc["lock_dict"])
    v = median(r_dict)
    rows.append(Row(
        sec, "ratio ours/dict of asyncio.Lock  AsyncSessionLane", v, "x",
        f"median of {len(r_dict)} per-round ratios, +-{spread(r_dict) * 100:.0f}%",
        goal=f"<= {DICT_GOAL}", status=verdict(v, DICT_GOAL), data={"rounds_ratio": r_dict},
    ))
    if have_keyed:
        r_keyed = per_round_ratio(unc["ours_session"], unc["keyed"])
        v = median(r_keyed)
        rows.append(Row(
            sec, "ratio ours/asyncio-keyed-lock  AsyncSessionLane", v, "x",
            f"median of {len(r_keyed)} per-round ratios, +-{spread(r_keyed) * 100:.0f}%",
            goal=f"< {KEYED_GOAL:g}", status="PASS" if v < KEYED_GOAL else "MISS",
            data={"rounds_ratio": r_keyed},
        ))
    else:
        rows.append(Row(sec, "ratio ours/asyncio-keyed-lock  AsyncSessionLane", None, "x",
                        f"goal < {KEYED_GOAL:g} not checked: {KEYED_PACKAGE} missing; "
                        f"{KEYED_INSTALL}"))
    r_all = per_round_ratio(unc["ours_all"], unc["lock_dict"])
    rows.append(Row(
        sec, "ratio ours/dict of asyncio.Lock  acquire_all", median(r_all), "x",
        f"no goal (two lanes vs one lock); +-{spread(r_all) * 100:.0f}%",
        data={"rounds_ratio": r_all},
    ))

    # -- hand-off --
    ho_labels = [
        ("ours", "ours  AsyncSessionLane, 2 tasks, 1 key"),
        ("ours_notimeout", "ours  AsyncSessionLane(timeout_s=None), same"),
        ("lock_dict", "dict of asyncio.Lock, 2 tasks, 1 key"),
        ("keyed", f"asyncio-keyed-lock {keyed_ver}, 2 tasks, 1 key"),
        ("floor", "no lock, sleep(0) only (the loop's floor)"),
    ]
    rates = {cid: [1e9 / x for x in ns] for cid, ns in ho.items()}
    for cid, label in ho_labels:
        if cid == "keyed" and not have_keyed:
            rows.append(Row(sec, f"{KEYED_PACKAGE}, 2 tasks, 1 key", None, "",
                            f"not importable; {KEYED_INSTALL}"))
            continue
        rate = median(rates[cid])
        hof = median([x["handoff_frac"] for x in ho_extra[cid]])
        share = median([x["min_share"] for x in ho_extra[cid]])
        note = (f"+-{spread(rates[cid]) * 100:.0f}%; hand-offs {hof * 100:.1f}% "
                f"({hof * rate:,.0f}/s); slower task's share {share * 100:.0f}%")
        if cid in ("ours", "ours_notimeout", "keyed"):
            note += (f"; {median(per_round_ratio(rates[cid], rates['lock_dict'])):.2f}x "
                     "dict of Lock's rate")
        rows.append(Row(sec, label, rate, "acq/s", note,
                        data={"rounds_acq_per_s": rates[cid], "rounds": ho_extra[cid]}))
    return rows
