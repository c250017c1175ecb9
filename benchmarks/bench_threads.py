"""Thread-face sections of ``benchmarks/run.py``: uncontended cost, two-thread hand-off,
registry size and memory per idle entry. Each section compares our lanes with the source
design (``seed_design.py``) and with plain ``threading.Lock`` baselines in the same run.
"""

from __future__ import annotations

import gc
import threading
import time
import tracemalloc
from collections.abc import Callable
from typing import Any

import seed_design as seed
from bench_common import (
    Config,
    Row,
    gc_paused,
    interleave,
    median,
    per_round_ratio,
    spread,
    verdict,
)

import lanequeue
from lanequeue import build_gateway_session_key

__all__ = ["section_handoff", "section_memory", "section_uncontended"]

RATIO_GOAL = 0.30  # ours / seed, ns per uncontended acquire+release
BYTES_GOAL = 250  # bytes per idle SessionLane entry

# A realistic session key (what a gateway would pass), the same for every candidate.
KEY = build_gateway_session_key("slack", "C12345", "U789", thread_id="1234567890.123456")


# -- 1. uncontended acquire + release ----------------------------------------------------------


def _loop_lane(lane: Any, key: str) -> Callable[[int], None]:
    def run(n: int) -> None:
        for _ in range(n):
            with lane.acquire(key):
                pass

    return run


def _loop_queue(queue: Any, key: str, names: list[str]) -> Callable[[int], None]:
    def run(n: int) -> None:
        for _ in range(n):
            with queue.acquire_all(key, names):
                pass

    return run


def _loop_alternating(first: Any, second: Any, key: str) -> Callable[[int], None]:
    """n acquisitions, alternating between two lanes (n // 2 rounds of both)."""

    def run(n: int) -> None:
        for _ in range(n // 2):
            with first.acquire(key):
                pass
            with second.acquire(key):
                pass

    return run


def _loop_lock() -> Callable[[int], None]:
    lock = threading.Lock()

    def run(n: int) -> None:
        for _ in range(n):
            with lock:
                pass

    return run


def _loop_lock_dict(key: str) -> Callable[[int], None]:
    guard = threading.Lock()
    locks: dict[str, threading.Lock] = {}

    def run(n: int) -> None:
        for _ in range(n):
            with guard:
                lk = locks.get(key)
                if lk is None:
                    lk = locks[key] = threading.Lock()
            with lk:
                pass

    return run


# (id, label, kind) in print order; kind groups ours/seed pairs for the ratios.
_UNCONTENDED = [
    ("lock", "threading.Lock  (with lock:)", None),
    ("lock_dict", "dict of Locks behind a guard Lock (per-key)", None),
    ("ours_session", "ours  SessionLane.acquire(key)", "session"),
    ("seed_session", "seed  SessionLane.acquire(key)", "session"),
    ("obs_session", "ours  SessionLane.acquire(key), metrics on", "session"),
    ("ours_lane", "ours  Lane.acquire(key)", "lane"),
    ("seed_lane", "seed  Lane.acquire(key)", "lane"),
    ("obs_lane", "ours  Lane.acquire(key), metrics on", "lane"),
    ("mixed", "ours  SessionLane and Lane alternating, per acquire", None),
    ("ours_all", "ours  acquire_all(key, [session, global])", "all"),
    ("seed_all", "seed  acquire_all(key, [session, global])", "all"),
]
_RATIO_LABELS = {
    "session": "ratio ours/seed  SessionLane.acquire",
    "lane": "ratio ours/seed  Lane.acquire",
    "all": "ratio ours/seed  acquire_all",
}
# Metrics on (what a PrometheusCollector or instrument_otel turns on: hold times observed
# at release) against off, per kind.
_OBS_LABELS = {
    "session": "ratio metrics on/off  SessionLane.acquire",
    "lane": "ratio metrics on/off  Lane.acquire",
}
OBS_GOAL = 1.10


def _observed(lane: Any) -> Any:
    lane.track_holds()
    return lane


def section_uncontended(cfg: Config) -> list[Row]:
    """ns per ``with ...acquire(key): pass`` on one thread, one key, nobody else."""
    names = ["session", "global"]
    cands: dict[str, Callable[[int], None]] = {
        "lock": _loop_lock(),
        "lock_dict": _loop_lock_dict(KEY),
        "ours_session": _loop_lane(lanequeue.SessionLane(), KEY),
        "seed_session": _loop_lane(seed.SessionLane("session"), KEY),
        "ours_lane": _loop_lane(lanequeue.Lane("global", max_concurrent=8), KEY),
        "seed_lane": _loop_lane(seed.Lane("global", max_concurrent=8), KEY),
        "obs_session": _loop_lane(_observed(lanequeue.SessionLane()), KEY),
        "obs_lane": _loop_lane(_observed(lanequeue.Lane("global", max_concurrent=8)), KEY),
        "mixed": _loop_alternating(
            lanequeue.SessionLane(), lanequeue.Lane("global", max_concurrent=8), KEY
        ),
        "ours_all": _loop_queue(lanequeue.build_default_lanes(), KEY, names),
        "seed_all": _loop_queue(seed.build_default_lanes(), KEY, names),
    }
    groups = [["lock", "lock_dict"]] + [
        [f"ours_{k}", f"seed_{k}"] + ([f"obs_{k}"] if k in _OBS_LABELS else [])
        for k in _RATIO_LABELS
    ]
    res = interleave(cands, cfg.rounds, cfg.batch_s, groups)
    lock_ns = median(res["lock"])
    rows: list[Row] = []
    for cid, label, _ in _UNCONTENDED:
        ns = median(res[cid])
        note = f"+-{spread(res[cid]) * 100:.0f}%"
        if cid != "lock":
            note += f", {ns / lock_ns:.1f}x Lock"
        rows.append(Row("uncontended", label, ns, "ns/op", note, data={"rounds_ns": res[cid]}))
    for kind, label in _RATIO_LABELS.items():
        ratios = per_round_ratio(res[f"ours_{kind}"], res[f"seed_{kind}"])
        r = median(ratios)
        rows.append(Row(
            "uncontended", label, r, "x",
            f"median of {len(ratios)} per-round ratios, +-{spread(ratios) * 100:.0f}%",
            goal=f"<= {RATIO_GOAL:.3f}", status=verdict(r, RATIO_GOAL),
            data={"rounds_ratio": ratios},
        ))
    # Alternating lane classes against each class alone, in the same round: each class
    # runs its own copy of the shared code (lanequeue._validate.function_copy), so the
    # sites CPython specialises see one class each.
    ratios = [
        m / ((a + b) / 2)
        for m, a, b in zip(res["mixed"], res["ours_session"], res["ours_lane"], strict=True)
    ]
    rows.append(Row(
        "uncontended", "ratio alternating / alone  SessionLane and Lane", median(ratios), "x",
        f"no goal; the alternating row against the mean of the two rows alone, median of "
        f"{len(ratios)} per-round ratios, +-{spread(ratios) * 100:.0f}%",
        data={"rounds_ratio": ratios},
    ))
    for kind, label in _OBS_LABELS.items():
        ratios = per_round_ratio(res[f"obs_{kind}"], res[f"ours_{kind}"])
        r = median(ratios)
        rows.append(Row(
            "uncontended", label, r, "x",
            f"median of {len(ratios)} per-round ratios, +-{spread(ratios) * 100:.0f}%",
            goal=f"<= {OBS_GOAL:.2f}", status=verdict(r, OBS_GOAL),
            data={"rounds_ratio": ratios},
        ))
    return rows


# -- 2. two threads handing one key back and forth -------------------------------------------


def _contend(acquire: Callable[[str], Any], window_s: float) -> dict[str, float]:
    """Two threads loop ``with acquire(KEY): count`` for ``window_s`` seconds.

    Counts are kept inside the critical section (so the lane itself protects them); an
    acquisition is a hand-off when the previous one was made by the other thread.
    """
    counts = [0, 0]
    last = [-1]
    switches = [0]
    stop = threading.Event()
    start = threading.Barrier(3)

    def worker(me: int) -> None:
        start.wait()
        while not stop.is_set():
            with acquire(KEY):
                counts[me] += 1
                if last[0] != me:
                    last[0] = me
                    switches[0] += 1

    threads = [threading.Thread(target=worker, args=(i,), daemon=True) for i in (0, 1)]
    for t in threads:
        t.start()
    with gc_paused():
        start.wait()
        # Measure only while both contend: the first thread through the barrier runs alone
        # until the other gets the GIL (up to a switch interval), so wait until both have
        # acquired, plus a short warm-up.
        give_up = time.perf_counter() + 10
        while min(counts) == 0 and time.perf_counter() < give_up:
            time.sleep(0.001)
        time.sleep(min(0.02, window_s / 10))
        first, s0, t0 = list(counts), switches[0], time.perf_counter()
        time.sleep(window_s)
        snap, s1, t1 = list(counts), switches[0], time.perf_counter()
        stop.set()
        for t in threads:
            t.join(timeout=30)
    if any(t.is_alive() for t in threads):
        raise RuntimeError("a contending thread did not stop within 30 s")
    done = [b - a for a, b in zip(first, snap, strict=True)]
    acq = sum(done)
    return {
        "acq_per_s": acq / (t1 - t0),
        "handoff_frac": (s1 - s0) / acq if acq else 0.0,
        "min_share": min(done) / acq if acq else 0.0,
    }


class _PingPong:
    """The floor of strict alternation: two Locks passed back and forth as a baton.

    The first thread to call ``acquire`` takes turn 0, the other turn 1; each waits for its
    own Lock and, on leaving, unlocks the other's, so every acquisition is a hand-off
    (the cost of waking the other thread, with nothing of a lane around it).
    """

    def __init__(self) -> None:
        self.turn = [threading.Lock(), threading.Lock()]
        self.turn[1].acquire()
        self.mine = threading.local()
        self.seats = iter((0, 1))
        self.seat_lock = threading.Lock()

    def acquire(self, _key: str) -> _PingPong:
        return self

    def __enter__(self) -> None:
        seat = getattr(self.mine, "seat", None)
        if seat is None:
            with self.seat_lock:
                seat = self.mine.seat = next(self.seats)
        self.turn[seat].acquire()

    def __exit__(self, *exc: object) -> None:
        self.turn[1 - self.mine.seat].release()


def section_handoff(cfg: Config) -> list[Row]:
    """Two threads contend for one key: acquisitions/s and the share that were hand-offs."""
    def plain_lock() -> Callable[[str], Any]:
        lock = threading.Lock()
        return lambda _key: lock

    # (id, label, factory of a fresh ``acquire(key)`` for each round)
    cands: list[tuple[str, str, Callable[[], Callable[[str], Any]]]] = [
        ("ours", "ours  SessionLane, 2 threads, 1 key",
         lambda: lanequeue.SessionLane().acquire),
        ("seed", "seed  SessionLane, 2 threads, 1 key",
         lambda: seed.SessionLane("session").acquire),
        ("lock", "threading.Lock, 2 threads", plain_lock),
        ("pingpong", "two Locks as a baton (strict-alternation floor)",
         lambda: _PingPong().acquire),
    ]
    res: dict[str, list[dict[str, float]]] = {cid: [] for cid, _, _ in cands}
    for r in range(cfg.handoff_rounds):
        order = cands[r % len(cands):] + cands[:r % len(cands)]
        for cid, _, make in order:
            res[cid].append(_contend(make(), cfg.handoff_window_s))
        gc.collect()
    rows: list[Row] = []
    for cid, label, _ in cands:
        rates = [x["acq_per_s"] for x in res[cid]]
        hof = median([x["handoff_frac"] for x in res[cid]])
        share = median([x["min_share"] for x in res[cid]])
        note = (f"+-{spread(rates) * 100:.0f}%; hand-offs {hof * 100:.1f}% of acquisitions "
                f"({hof * median(rates):,.0f}/s); slower thread's share {share * 100:.0f}%")
        if cid == "ours":
            floor = [x["acq_per_s"] for x in res["pingpong"]]
            note += f"; {median(per_round_ratio(rates, floor)):.2f}x the baton floor's rate"
        rows.append(Row("handoff", label, median(rates), "acq/s", note,
                        data={"rounds": res[cid]}))
    return rows


# -- 3. registry size and memory ---------------------------------------------------------------


def _keys(n: int, tag: str) -> list[str]:
    return [build_gateway_session_key("slack", f"C{tag}{i}", f"U{i}", thread_id=f"{i}.000001")
            for i in range(n)]


def _churn(lane: Any, keys: list[str]) -> tuple[int, int, float]:
    """Push every key once through ``lane``; return (peak, final) ``session_count`` and
    microseconds per key (including one ``session_count`` read per key)."""
    peak = 0
    with gc_paused():
        t0 = time.perf_counter()
        for k in keys:
            with lane.acquire(k):
                c = lane.session_count
                if c > peak:
                    peak = c
        dt = time.perf_counter() - t0
    return peak, lane.session_count, dt / len(keys) * 1e6


def _bytes_per_idle(make_lane: Callable[[int], Any], keys: list[str]) -> tuple[float, int]:
    """Traced bytes added by filling a fresh lane with ``len(keys)`` idle entries, per
    entry. The keys exist before tracing starts, so their strings are not counted."""
    n = len(keys)
    lane = make_lane(n)
    gc.collect()
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        for k in keys:
            with lane.acquire(k):
                pass
        gc.collect()
        after = tracemalloc.get_traced_memory()[0]
    finally:
        tracemalloc.stop()
    return (after - before) / n, lane.session_count


def _lock_dict_filler(n: int) -> Any:
    class LockDict:
        """The per-key baseline of section 1, with a lane-like surface for the fill."""

        def __init__(self) -> None:
            self.guard = threading.Lock()
            self.locks: dict[str, threading.Lock] = {}

        def acquire(self, key: str) -> threading.Lock:
            with self.guard:
                lk = self.locks.get(key)
                if lk is None:
                    lk = self.locks[key] = threading.Lock()
            return lk

        @property
        def session_count(self) -> int:
            return len(self.locks)

    return LockDict()


def section_memory(cfg: Config) -> list[Row]:
    """Registry size under many distinct keys, and traced bytes per idle entry."""
    rows: list[Row] = []
    n = cfg.churn_keys
    # Made before any measurement, and shared by both parts (never traced).
    keys = _keys(max(n, cfg.mem_entries, cfg.mem_entries_seed), "k")
    churns: list[tuple[str, str, Any, int]] = [
        ("ours", "idle 3600 s", lanequeue.SessionLane(), 256),
        ("ours", "idle 0 s", lanequeue.SessionLane(idle_timeout_s=0), 256),
        ("seed", "idle 3600 s", seed.SessionLane("session"), 256),
        ("seed", "idle 0 s", seed.SessionLane("session", idle_timeout_s=0), 256),
    ]
    for who, idle, lane, cap in churns:
        peak, final, us = _churn(lane, keys[:n])
        label = f"{who}  {n:,} keys, max_sessions {cap}, {idle}: peak"
        rows.append(Row(
            "memory", label, peak, "entries",
            f"final {final:,}; {'within' if peak <= cap else 'ABOVE'} the cap; "
            f"{us:.1f} us/key incl. a session_count read",
            data={"peak": peak, "final": final, "us_per_key": us},
        ))
    gc.collect()

    del churns, lane
    gc.collect()
    fillers: list[tuple[str, str, int, Callable[[int], Any]]] = [
        ("ours", "ours  bytes per idle SessionLane entry", cfg.mem_entries,
         lambda k: lanequeue.SessionLane(max_sessions=k, idle_timeout_s=3600)),
        ("seed", "seed  bytes per idle SessionLane entry", cfg.mem_entries_seed,
         lambda k: seed.SessionLane("session", max_sessions=k, idle_timeout_s=3600)),
        ("lock_dict", "dict of Locks: bytes per entry (reference)", cfg.mem_entries,
         _lock_dict_filler),
    ]
    for who, label, m, make in fillers:
        b, count = _bytes_per_idle(make, keys[:m])
        extra = f"{m:,} entries (count {count:,}); key strings excluded"
        if who == "ours":
            rows.append(Row("memory", label, b, "B/entry", extra,
                            goal=f"<= {BYTES_GOAL}", status=verdict(b, BYTES_GOAL),
                            data={"entries": m, "session_count": count}))
        else:
            rows.append(Row("memory", label, b, "B/entry", extra,
                            data={"entries": m, "session_count": count}))
        gc.collect()
    return rows
