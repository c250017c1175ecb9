"""Stress: many threads, few keys, immediate eviction. Counts holders with a separate
lock-protected counter; any reading above the limit is a violation."""

from __future__ import annotations

import random
import threading
import time
from typing import Any

import pytest

from lanequeue import LaneQueue, SessionLane

N_THREADS = 16


def _run(n_threads: int, work: Any) -> list[BaseException]:
    errors: list[BaseException] = []
    start = threading.Barrier(n_threads)

    def body(idx: int) -> None:
        try:
            start.wait()
            work(idx)
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=body, args=(i,), daemon=True) for i in range(n_threads)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(110)
        assert not t.is_alive(), "a worker is stuck"
    return errors


@pytest.mark.timeout(120)
def test_stress_session_lane_mutual_exclusion() -> None:
    per_thread = 12_500  # 16 x 12,500 = 200,000 acquisitions
    keys = [f"conv-{i}" for i in range(16)]
    lane = SessionLane(max_sessions=4, idle_timeout_s=0)
    inside = dict.fromkeys(keys, 0)
    guard = threading.Lock()
    violations = [0]
    done = [0] * N_THREADS

    def work(idx: int) -> None:
        rng = random.Random(idx)
        for n in range(per_thread):
            key = keys[rng.randrange(len(keys))]
            with lane.acquire(key, timeout_s=60):
                with guard:
                    inside[key] += 1
                    if inside[key] != 1:
                        violations[0] += 1
                if n % 4 == 0:
                    time.sleep(0)  # let another thread run while this one holds
                with guard:
                    inside[key] -= 1
            done[idx] += 1

    t0 = time.perf_counter()
    errors = _run(N_THREADS, work)
    elapsed = time.perf_counter() - t0
    assert errors == []
    assert sum(done) == 200_000
    assert violations[0] == 0
    st = lane.stats
    assert st.acquired == st.released == 200_000
    assert st.holders == 0
    assert st.waiters == 0
    assert st.timeouts == st.cancelled == st.unmatched_releases == 0
    assert st.evicted > 0  # eviction really ran during the storm
    assert lane.session_count <= 4
    print(f"200,000 acquisitions in {elapsed:.1f} s")


@pytest.mark.timeout(120)
def test_stress_queue_session_and_global_cap() -> None:
    per_thread = 2_500  # 16 x 2,500 = 40,000 acquire_all calls
    global_cap = 3
    queue = LaneQueue()
    session = queue.add_session_lane("session", max_sessions=4, idle_timeout_s=0, timeout_s=60)
    glob = queue.add_lane("global", max_concurrent=global_cap, timeout_s=60)
    keys = [f"conv-{i}" for i in range(12)]
    inside = dict.fromkeys(keys, 0)
    total = [0]
    peak = [0]
    violations = [0]
    guard = threading.Lock()

    def work(idx: int) -> None:
        rng = random.Random(1_000 + idx)
        for n in range(per_thread):
            key = keys[rng.randrange(len(keys))]
            names = ["global", "session"] if n % 2 else ["session", "global"]
            with queue.acquire_all(key, names):
                with guard:
                    inside[key] += 1
                    total[0] += 1
                    peak[0] = max(peak[0], total[0])
                    if inside[key] != 1 or total[0] > global_cap:
                        violations[0] += 1
                time.sleep(0)
                with guard:
                    inside[key] -= 1
                    total[0] -= 1

    errors = _run(N_THREADS, work)
    assert errors == []
    assert violations[0] == 0
    assert peak[0] == global_cap  # the cap was reached, never exceeded
    for lane in (session, glob):
        st = lane.stats
        assert st.acquired == st.released == 40_000
        assert st.holders == st.waiters == 0
        assert st.unmatched_releases == 0
    assert glob.available == global_cap
