"""The three call patterns of the source design (gateway, scheduler, sub-agent), and the
runnable examples that show them."""

from __future__ import annotations

import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import pytest
from conftest import ParkHooks, run_thread

from lanequeue import (
    LaneQueue,
    build_default_lanes,
    build_gateway_session_key,
    build_scheduler_session_key,
    build_subagent_session_key,
)

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"
JOIN_S = 10.0


@pytest.mark.timeout(30)
def test_gateway_pattern(park_hooks: ParkHooks) -> None:
    queue = LaneQueue()
    session = queue.add_session_lane("session")
    glob = queue.add_lane("global", max_concurrent=2)
    thread_a = build_gateway_session_key("slack", "C12345", "U789", thread_id="1.1")
    thread_b = build_gateway_session_key("slack", "C12345", "U789", thread_id="2.2")
    dm = build_gateway_session_key("discord", "G1", "U5")
    gates: dict[str, threading.Event] = {}
    entered: dict[str, threading.Event] = {}
    order: list[str] = []
    box: dict[str, Any] = {}

    def handler(name: str, key: str) -> bool:
        with queue.acquire_all(key, ["session", "global"], timeout_s=JOIN_S):
            order.append(name)
            entered[name].set()
            assert gates[name].wait(JOIN_S)
        return True

    def arrive(name: str, key: str) -> threading.Thread:
        gates[name] = threading.Event()
        entered[name] = threading.Event()
        return run_thread(name, lambda: handler(name, key), box)

    threads = [arrive("a1", thread_a)]
    assert entered["a1"].wait(JOIN_S)
    # Another conversation runs in parallel: it does not wait for thread A.
    threads.append(arrive("b1", thread_b))
    assert entered["b1"].wait(JOIN_S)
    # The same conversation waits, in arrival order, on the session lane.
    for name in ("a2", "a3"):
        threads.append(arrive(name, thread_a))
        assert park_hooks.parked(name).wait(JOIN_S)
    assert session.waiting_for(thread_a) == 2
    # A third conversation finds the global lane full (2) and waits there.
    threads.append(arrive("dm", dm))
    assert park_hooks.parked("dm").wait(JOIN_S)
    assert glob.waiting == 1
    assert session.is_held(dm)
    assert glob.active_count == 2

    gates["b1"].set()  # b1 done: its global permit goes to dm
    assert entered["dm"].wait(JOIN_S)
    for name in ("a1", "a2", "a3", "dm"):
        gates[name].set()
    for t in threads:
        t.join(JOIN_S)
        assert not t.is_alive()
    assert all(box[n] is True for n in ("a1", "a2", "a3", "b1", "dm"))
    assert [n for n in order if n.startswith("a")] == ["a1", "a2", "a3"]
    assert order.index("b1") < order.index("a2")
    assert session.stats.holders == glob.stats.holders == 0


@pytest.mark.timeout(30)
def test_scheduler_pattern_rolls_back_and_releases_from_job_thread() -> None:
    lanes = build_default_lanes()
    scheduler, session = lanes["scheduler"], lanes["session"]
    finish: dict[str, threading.Event] = {}
    jobs: dict[str, threading.Thread] = {}

    def run_job(job_id: str, key: str) -> None:
        try:
            assert finish[job_id].wait(JOIN_S)
        finally:
            session.manual_release(key)
            scheduler.manual_release(key)

    def try_start(job_id: str) -> str:
        key = build_scheduler_session_key(job_id)
        if not scheduler.try_acquire(key):
            return "full"
        if not session.try_acquire(key):
            assert scheduler.manual_release(key)  # roll back the first lane
            return "running"
        finish[job_id] = threading.Event()
        jobs[job_id] = threading.Thread(target=run_job, args=(job_id, key), daemon=True)
        jobs[job_id].start()
        return "started"

    def complete(job_id: str) -> None:
        finish[job_id].set()
        jobs[job_id].join(JOIN_S)
        assert not jobs[job_id].is_alive()

    assert [try_start(j) for j in ("report", "backup", "cleanup")] == ["started", "started", "full"]
    assert scheduler.available == 0
    complete("backup")
    assert scheduler.available == 1
    assert try_start("report") == "running"
    assert scheduler.available == 1  # rolled back: the slot is free again
    assert scheduler.holds_of("sched:report") == 1
    complete("report")
    assert [try_start(j) for j in ("report", "cleanup")] == ["started", "started"]
    complete("report")
    complete("cleanup")
    assert scheduler.active_count == session.active_count == 0
    assert scheduler.available == 2
    assert scheduler.stats.unmatched_releases == session.stats.unmatched_releases == 0
    assert scheduler.stats.acquired == scheduler.stats.released == 5


@pytest.mark.timeout(30)
def test_subagent_pattern_unique_keys_wait_only_on_the_cap(park_hooks: ParkHooks) -> None:
    lanes = build_default_lanes()
    session, subagent = lanes["session"], lanes["subagent"]
    go = threading.Event()
    box: dict[str, Any] = {}
    inside = [0]
    peak = [0]
    guard = threading.Lock()

    def sub_agent(task_id: str) -> bool:
        key = build_subagent_session_key("berserk", task_id)
        with lanes.acquire_all(key, ["subagent", "session"], timeout_s=JOIN_S):
            with guard:
                inside[0] += 1
                peak[0] = max(peak[0], inside[0])
            assert go.wait(JOIN_S)
            with guard:
                inside[0] -= 1
        return True

    names = [f"task_{i}" for i in range(10)]
    in_line = threading.Semaphore(0)
    for n in names:
        park_hooks.on(n, lambda waiter, timeout: in_line.release())
    threads = [run_thread(n, lambda n=n: sub_agent(n), box) for n in names]
    # Five run, five wait; nobody ever waits on the session lane.
    for _ in range(5):
        assert in_line.acquire(timeout=JOIN_S)
    assert subagent.active_count == 5
    assert subagent.waiting == 5
    assert session.waiting == 0
    assert session.active_count == 10  # each holds its own key while waiting for the cap
    go.set()
    for t in threads:
        t.join(JOIN_S)
        assert not t.is_alive()
    assert all(box[n] is True for n in names)
    assert peak[0] == 5
    assert session.stats.timeouts == session.stats.cancelled == 0
    assert session.stats.acquired == subagent.stats.acquired == 10
    assert subagent.stats.holders == session.stats.holders == 0


@pytest.mark.timeout(60)
@pytest.mark.parametrize("name", ["gateway.py", "scheduler.py", "subagent.py"])
def test_example_runs(name: str) -> None:
    proc = subprocess.run(
        [sys.executable, str(EXAMPLES / name)],
        capture_output=True,
        text=True,
        timeout=50,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stdout.rstrip().endswith("ok")


@pytest.mark.timeout(30)
def test_a_key_asked_for_again_under_itself_waits_for_its_timeout() -> None:
    """README, after the gateway example: a lane is not re-entrant. Code that runs
    under a key and acquires it again waits for itself until its timeout, 300 s by
    default on the default lanes (here a short one, to see it end)."""
    import time

    from lanequeue import LaneTimeoutError

    lanes = build_default_lanes()
    assert lanes["session"].timeout_s == 300.0
    with lanes.acquire_all("k", ["session", "global"]):
        t0 = time.monotonic()
        with pytest.raises(LaneTimeoutError), \
                lanes.acquire_all("k", ["session", "global"], timeout_s=0.2):
            pass
        assert time.monotonic() - t0 >= 0.2
    assert lanes["session"].stats.timeouts == 1
