"""The three call patterns of the source design (NOTES.md section 2), asyncio form.

- gateway: ``acquire_all(key, ["session", "global"])`` per message;
- scheduler: non-blocking ``try_acquire`` on "scheduler" then on the session lane, rolled
  back with ``manual_release`` when the second fails; the job releases both when done;
- sub-agent: unique keys under the "subagent" lane (max 5), never waiting on "session".

Plus the runnable examples (examples/async_*.py), each run as a subprocess.
"""

from __future__ import annotations

import asyncio
import subprocess
import sys
from collections import defaultdict
from pathlib import Path

import pytest

from lanequeue import (
    AsyncLaneQueue,
    build_default_async_lanes,
    build_gateway_session_key,
    build_scheduler_session_key,
    build_subagent_session_key,
)

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"


@pytest.mark.timeout(20)
def test_gateway_pattern_orders_each_conversation_and_caps_globally() -> None:
    cap = 3
    conversations = 6
    messages = 5

    async def main() -> None:
        queue = AsyncLaneQueue()
        queue.add_session_lane("session", timeout_s=None)
        queue.add_lane("global", max_concurrent=cap, timeout_s=None)
        inside_conv: dict[str, int] = defaultdict(int)
        inside = 0
        peak = 0
        processed: dict[str, list[int]] = defaultdict(list)
        overlap_pairs: set[frozenset[str]] = set()
        current: set[str] = set()

        async def handle(user: str, seq: int) -> None:
            nonlocal inside, peak
            key = build_gateway_session_key("slack", "C12345", user, thread_id="1700.1")
            async with queue.acquire_all(key, ["session", "global"]) as multi:
                assert multi["session"].token and multi["global"].token
                inside_conv[key] += 1
                assert inside_conv[key] == 1, "two messages of one conversation at once"
                inside += 1
                peak = max(peak, inside)
                for other in current:
                    overlap_pairs.add(frozenset((key, other)))
                current.add(key)
                processed[key].append(seq)
                for _ in range(3):  # the model call, a few loop turns long
                    await asyncio.sleep(0)
                current.discard(key)
                inside -= 1
                inside_conv[key] -= 1

        tasks = []
        for seq in range(messages):
            for c in range(conversations):
                tasks.append(asyncio.create_task(handle(f"U{c}", seq)))
                await asyncio.sleep(0)  # arrival order == creation order
        await asyncio.gather(*tasks)
        assert len(processed) == conversations
        assert all(seqs == list(range(messages)) for seqs in processed.values())
        assert peak == cap
        assert overlap_pairs  # different conversations ran in parallel
        for name in ("session", "global"):
            st = queue[name].stats
            assert st.holders == 0 and st.waiters == 0
            assert st.acquired == st.released == conversations * messages

    asyncio.run(main())


@pytest.mark.timeout(20)
def test_scheduler_pattern_try_acquire_with_roll_back() -> None:
    async def main() -> None:
        queue = build_default_async_lanes()
        scheduler, session = queue["scheduler"], queue["session"]
        assert scheduler.max_concurrent == 2
        finish: dict[str, asyncio.Event] = {}
        jobs: list[asyncio.Task[None]] = []

        async def run_job(key: str) -> None:
            try:
                await finish[key].wait()
            finally:
                assert session.manual_release_nowait(key)
                assert scheduler.manual_release_nowait(key)

        def admit(job_id: str) -> str:
            key = build_scheduler_session_key(job_id)
            if not scheduler.try_acquire_nowait(key):
                return "scheduler-full"
            if not session.try_acquire_nowait(key):
                assert scheduler.manual_release_nowait(key)  # roll back
                return "already-running"
            finish[key] = asyncio.Event()
            jobs.append(asyncio.create_task(run_job(key)))
            return "admitted"

        assert admit("Nightly-Report") == "admitted"
        assert scheduler.available == 1
        # Same job again while it runs: the session lane refuses, the scheduler slot is
        # rolled back (available stays 1, not 0).
        assert admit("nightly-report") == "already-running"
        assert scheduler.available == 1
        assert scheduler.holds_of_nowait("sched:nightly_report") == 1
        assert admit("sync-crm") == "admitted"
        assert scheduler.available == 0
        assert admit("reindex") == "scheduler-full"
        assert not session.is_held_nowait("sched:reindex")  # never taken: nothing to roll back

        finish["sched:nightly_report"].set()
        await asyncio.sleep(0)  # the job's task ran its finally: both released
        assert scheduler.available == 1 and not session.is_held_nowait("sched:nightly_report")
        assert admit("reindex") == "admitted"
        for event in finish.values():
            event.set()
        await asyncio.gather(*jobs)
        assert scheduler.available == 2 and session.active_count == 0
        for lane in (scheduler, session):
            st = lane.stats
            assert st.holders == 0 and st.acquired == st.released
            assert st.unmatched_releases == 0
        assert scheduler.stats.rejected == 1 and session.stats.rejected == 1

    asyncio.run(main())


@pytest.mark.timeout(20)
def test_subagent_pattern_unique_keys_never_wait_on_session() -> None:
    async def main() -> None:
        queue = build_default_async_lanes()
        session, subagent = queue["session"], queue["subagent"]
        assert subagent.max_concurrent == 5
        inside = 0
        peak = 0
        most_waiting_on_session = 0

        async def sub_agent(i: int) -> str:
            nonlocal inside, peak, most_waiting_on_session
            key = build_subagent_session_key("berserk", f"task_{i}")
            async with queue.acquire_all(key, ["session", "subagent"]):
                inside += 1
                peak = max(peak, inside)
                most_waiting_on_session = max(most_waiting_on_session, session.waiting)
                for _ in range(3):
                    await asyncio.sleep(0)
                inside -= 1
            return key

        keys = await asyncio.gather(*(sub_agent(i) for i in range(17)))
        assert keys[0] == "ip:berserk:pipeline:subagent:task_0"
        assert len(set(keys)) == 17
        assert peak == 5
        assert most_waiting_on_session == 0
        st = session.stats
        assert st.acquired == 17 and st.timeouts == 0 and st.waiters == 0
        assert subagent.available == 5 and subagent.stats.acquired == 17

    asyncio.run(main())


@pytest.mark.timeout(60)
@pytest.mark.parametrize(
    ("script", "expect"),
    [
        ("async_gateway.py", "every conversation in order: True"),
        ("async_scheduler.py", "tick: reindex: admitted"),
        ("async_subagent.py", "peak running 5 (cap 5)"),
    ],
)
def test_example_runs(script: str, expect: str) -> None:
    proc = subprocess.run(
        [sys.executable, str(EXAMPLES / script)],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert expect in proc.stdout, proc.stdout
