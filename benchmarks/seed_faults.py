"""Demonstrate faults 1 and 2 of NOTES.md section 3 on the seed design (``seed_design.py``).

Run from the repository root (standard library only)::

    python benchmarks/seed_faults.py [--trials N] [--seed S]

Fault 1, two holders for one key: a ``SessionLane`` with ``max_sessions=4`` and
``idle_timeout_s=0`` is hammered by 16 threads, 3,000 acquisitions each, over 8 keys. Each
holder raises an occupancy counter for its key (under that key's own lock), checks that it is
1, yields the GIL with ``time.sleep(0)``, and lowers the counter. Any reading above 1 is a
mutual-exclusion violation: an entry that had a waiter but was not ``held`` was evicted, and
a later caller with the same key got a fresh ``Semaphore(1)``.

Fault 2, unchecked releases: releasing a key that is not held releases the semaphore anyway,
so a max-1 lane admits 2 concurrent holders. Shown on ``Lane.manual_release`` and on
``SessionLane._raw_release`` (the path ``LaneQueue.acquire_all`` uses).

Exits 0 in all cases; it reports, it does not assert.
"""

from __future__ import annotations

import argparse
import random
import threading
import time

from seed_design import Lane, SessionLane

N_KEYS = 8
N_THREADS = 16
ACQUISITIONS_PER_THREAD = 3_000


def fault1_trial(seed: int) -> dict[str, int | float]:
    """One run of the fault-1 workload. Returns violations, max occupancy and timings."""
    lane = SessionLane("session", max_sessions=4, idle_timeout_s=0)
    keys = [f"key-{i}" for i in range(N_KEYS)]
    occupancy = dict.fromkeys(keys, 0)
    occ_locks = {k: threading.Lock() for k in keys}
    violations = [0] * N_THREADS  # one slot per thread, so no shared counter is needed
    max_occ = [0] * N_THREADS
    start = threading.Barrier(N_THREADS)

    def worker(idx: int) -> None:
        rng = random.Random(seed * 1_000 + idx)
        start.wait()
        for _ in range(ACQUISITIONS_PER_THREAD):
            key = keys[rng.randrange(N_KEYS)]
            with lane.acquire(key):
                lock = occ_locks[key]
                with lock:
                    occupancy[key] += 1
                    seen = occupancy[key]
                if seen != 1:
                    violations[idx] += 1
                max_occ[idx] = max(max_occ[idx], seen)
                time.sleep(0)
                with lock:
                    occupancy[key] -= 1

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(N_THREADS)]
    t0 = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    elapsed = time.perf_counter() - t0
    stats = lane.stats.to_dict()
    return {
        "violations": sum(violations),
        "max_occupancy": max(max_occ),
        "acquired": stats["acquired"],
        "released": stats["released"],
        "timeouts": stats["timeouts"],
        "entries_left": lane.session_count,
        "seconds": elapsed,
    }


def fault2_lane() -> tuple[bool, bool, int]:
    """Over-release a max-1 Lane; return whether two holders then got in, and active count."""
    lane = Lane("scheduler", max_concurrent=1)
    assert lane.try_acquire("job-a")
    lane.manual_release("job-a")
    lane.manual_release("job-a")  # second release of a key that is no longer held
    first = lane.try_acquire("job-x")
    second = lane.try_acquire("job-y")
    return first, second, lane.active_count


def fault2_session_lane() -> tuple[bool, bool]:
    """Over-release one key of a SessionLane via _raw_release; two holders of that key follow."""
    lane = SessionLane("session")
    assert lane._raw_acquire("gateway:slack:c1:u1:t1")
    lane._raw_release("gateway:slack:c1:u1:t1")
    lane._raw_release("gateway:slack:c1:u1:t1")  # unchecked: the Semaphore(1) is now at 2
    first = lane.try_acquire("gateway:slack:c1:u1:t1")
    second = lane.try_acquire("gateway:slack:c1:u1:t1")
    return first, second


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=3, help="fault-1 runs (default 3)")
    parser.add_argument("--seed", type=int, default=0, help="base RNG seed (default 0)")
    args = parser.parse_args()

    total = N_THREADS * ACQUISITIONS_PER_THREAD
    print("Fault 1: two holders for one key (eviction of an entry that has a waiter)")
    print(
        f"  SessionLane(max_sessions=4, idle_timeout_s=0), {N_KEYS} keys, {N_THREADS} threads, "
        f"{ACQUISITIONS_PER_THREAD:,} acquisitions each ({total:,} total)"
    )
    all_violations: list[int] = []
    for trial in range(args.trials):
        r = fault1_trial(args.seed + trial)
        all_violations.append(int(r["violations"]))
        print(
            f"  trial {trial + 1}: {r['violations']:,} violations in {r['acquired']:,} "
            f"acquisitions (max occupancy {r['max_occupancy']}, "
            f"released {r['released']:,}, timeouts {r['timeouts']}, "
            f"entries left {r['entries_left']}, {r['seconds']:.1f} s)"
        )
    if all_violations:
        print(
            f"  violations: min {min(all_violations):,}, max {max(all_violations):,}, "
            f"mean {sum(all_violations) / len(all_violations):,.1f} per {total:,}"
        )

    print()
    print("Fault 2: unchecked releases")
    first, second, active = fault2_lane()
    print(
        "  Lane(max_concurrent=1): try_acquire, manual_release twice, then two try_acquire: "
        f"{first} and {second} -> {int(first) + int(second)} concurrent holders "
        f"(active_count reports {active})"
    )
    s_first, s_second = fault2_session_lane()
    print(
        "  SessionLane, one key: _raw_acquire, _raw_release twice, then two try_acquire on "
        f"the same key: {s_first} and {s_second} -> {int(s_first) + int(s_second)} "
        "concurrent holders of one session"
    )


if __name__ == "__main__":
    main()
