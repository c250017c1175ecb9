"""``lanequeue replay --backend redis://...``: the worker processes end with their parent,
however it ends (a real SIGKILL of the parent), and SIGTERM of the parent stops the run
cleanly (exit status 130, "interrupted", no worker left, no key of the run left)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import redis
from redis_server import RedisServer


def _workers_of(parent: int) -> list[int]:
    """The replay worker processes (multiprocessing spawn children) of ``parent``."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
            cmdline = (entry / "cmdline").read_bytes()
        except OSError:
            continue
        ppid = int(stat.rsplit(")", 1)[1].split()[1])
        if ppid == parent and b"spawn_main" in cmdline:
            found.append(int(entry.name))
    return found


def _alive(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def _start_replay(server: RedisServer) -> tuple[subprocess.Popen[bytes], list[int]]:
    """A long replay (speed 1: hours of trace) with 2 workers; returns once both run."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "lanequeue", "replay", "--backend", server.url,
         "--workers", "2", "--speed", "1", "--no-progress"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE,
    )
    deadline = time.monotonic() + 60
    workers: list[int] = []
    while len(workers) < 2:
        assert proc.poll() is None, proc.communicate()
        assert time.monotonic() < deadline, "the workers never started"
        time.sleep(0.2)
        workers = _workers_of(proc.pid)
    time.sleep(2.0)  # past the start barrier: the workers replay
    assert all(_alive(w) for w in workers)
    return proc, workers


def _gone_within(pids: list[int], seconds: float) -> list[int]:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        left = [p for p in pids if _alive(p)]
        if not left:
            return []
        time.sleep(0.1)
    return [p for p in pids if _alive(p)]


def test_workers_end_when_the_parent_is_sigkilled(redis_server: RedisServer) -> None:
    proc, workers = _start_replay(redis_server)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait(10)
    left = _gone_within(workers, 5.0)
    for pid in left:  # do not leave them behind should the test fail
        os.kill(pid, signal.SIGKILL)
    assert left == []


def _run_keys(server: RedisServer) -> set[bytes]:
    client = redis.Redis(port=server.port)
    try:
        return set(client.scan_iter(match="*lanequeue-replay:*", count=1000))
    finally:
        client.close()


def test_sigterm_stops_the_run_cleanly(redis_server: RedisServer) -> None:
    before = _run_keys(redis_server)  # keys of earlier runs (a SIGKILLed one's lapse)
    proc, workers = _start_replay(redis_server)
    os.kill(proc.pid, signal.SIGTERM)
    _, err = proc.communicate(timeout=30)
    assert proc.returncode == 130
    assert b"interrupted" in err
    assert b"Traceback" not in err
    assert _gone_within(workers, 5.0) == []
    assert _run_keys(redis_server) - before == set()  # the run deleted its keys
