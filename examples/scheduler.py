"""Scheduler pattern: non-blocking admission with roll-back, release from the job's thread.

A scheduler tick must never block. For each due job it tries the "scheduler" lane (at most
2 jobs at once), then the job's session key (a job never runs twice at once); if the second
fails, the first is rolled back. The job runs in its own thread and releases both lanes
with manual_release when it is done.

Run: python examples/scheduler.py
"""

from __future__ import annotations

import threading

from lanequeue import build_default_lanes, build_scheduler_session_key

lanes = build_default_lanes()
scheduler, session = lanes["scheduler"], lanes["session"]
finish: dict[str, threading.Event] = {}
jobs: dict[str, threading.Thread] = {}


def run_job(job_id: str, key: str) -> None:
    try:
        finish[job_id].wait(10)  # the job's work
        print(f"    job {job_id} done")
    finally:
        session.manual_release(key)
        scheduler.manual_release(key)


def try_start(job_id: str) -> str:
    key = build_scheduler_session_key(job_id)
    if not scheduler.try_acquire(key):
        return "skipped: scheduler lane full"
    if not session.try_acquire(key):
        scheduler.manual_release(key)  # roll back the first lane
        return "skipped: already running (scheduler slot rolled back)"
    finish[job_id] = threading.Event()
    jobs[job_id] = threading.Thread(target=run_job, args=(job_id, key))
    jobs[job_id].start()
    return "started"


def tick(n: int, due: list[str]) -> list[str]:
    print(f"tick {n}: due {due}")
    results = []
    for job_id in due:
        result = try_start(job_id)
        results.append(result)
        print(f"    {job_id}: {result}")
    print(f"    scheduler lane: {scheduler.active_count} running, {scheduler.available} free")
    return results


def complete(job_id: str) -> None:
    finish[job_id].set()
    jobs[job_id].join()


r1 = tick(1, ["report", "backup", "cleanup"])
complete("backup")
r2 = tick(2, ["report"])
complete("report")
r3 = tick(3, ["report", "cleanup"])
complete("report")
complete("cleanup")

assert r1 == ["started", "started", "skipped: scheduler lane full"]
assert r2 == ["skipped: already running (scheduler slot rolled back)"]
assert r3 == ["started", "started"]
assert scheduler.active_count == session.active_count == 0
assert scheduler.stats.unmatched_releases == session.stats.unmatched_releases == 0
print("scheduler lane:", scheduler.stats.to_dict())
print("ok")
