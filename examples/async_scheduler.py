"""Scheduler pattern (asyncio): non-blocking admission with roll-back.

A job is admitted only if BOTH a "scheduler" slot (max 2) and its own session key
``sched:<job_id>`` are free right now: ``try_acquire`` on the scheduler lane, then on the
session lane, rolling the first back with ``manual_release`` if the second fails. The job
then runs elsewhere (its own task) and releases both with ``manual_release`` when done.
On every asyncio lane ``try_acquire`` and ``manual_release`` are coroutines: ``await``
them (``if scheduler.try_acquire(key):`` without ``await`` raises TypeError).
Run: ``python examples/async_scheduler.py``.
"""

from __future__ import annotations

import asyncio

from lanequeue import build_default_async_lanes, build_scheduler_session_key


async def main() -> int:
    queue = build_default_async_lanes()
    scheduler, session = queue["scheduler"], queue["session"]
    running: list[asyncio.Task[None]] = []

    async def run_job(job_id: str, key: str) -> None:
        try:
            print(f"  job {job_id}: running")
            await asyncio.sleep(0.2)
            print(f"  job {job_id}: done")
        finally:
            await session.manual_release(key)
            await scheduler.manual_release(key)

    async def admit(job_id: str) -> str:
        key = build_scheduler_session_key(job_id)
        if not await scheduler.try_acquire(key):
            return "skipped: scheduler full"
        if not await session.try_acquire(key):
            await scheduler.manual_release(key)  # roll back the first lane
            return "skipped: this job is already running (rolled back the scheduler slot)"
        running.append(asyncio.create_task(run_job(job_id, key)))
        return "admitted"

    outcomes: dict[str, list[str]] = {}
    for job_id in ["nightly-report", "nightly-report", "sync-crm", "reindex"]:
        outcome = await admit(job_id)
        outcomes.setdefault(job_id, []).append(outcome)
        print(f"tick: {job_id}: {outcome} (scheduler available={scheduler.available})")
    await asyncio.gather(*running)
    print(f"after the jobs: scheduler available={scheduler.available}, "
          f"session active={session.active_count}")
    retry = await admit("reindex")
    print(f"tick: reindex: {retry}")
    await asyncio.gather(*running)
    ok = (
        outcomes["nightly-report"][0] == "admitted"
        and outcomes["nightly-report"][1].startswith("skipped: this job")
        and outcomes["sync-crm"] == ["admitted"]
        and outcomes["reindex"] == ["skipped: scheduler full"]
        and retry == "admitted"
        and scheduler.available == 2
        and session.active_count == 0
    )
    print(f"books: scheduler {scheduler.stats.to_dict()}")
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(asyncio.run(main()))
