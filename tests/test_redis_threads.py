"""The Redis lanes in a process that cannot start a thread (out of threads or of memory
for a thread's stack: ``threading.Thread.start`` raises ``RuntimeError: can't start new
thread``), against a real redis-server.

The fault is real, not mocked: a child process asks for 256 MiB thread stacks under an
address-space limit that leaves 64 MiB free, so every thread start fails in the kernel's
``mmap``; setting the stack size back lets threads start again. What must hold:

- a grant whose renewer or lease watchdog cannot start is never kept unwatched: the
  acquire raises :class:`~lanequeue.LaneBackendError` (not a bare RuntimeError), the key
  is free in Redis at once, the counters balance, and once threads start again the next
  acquire works and its hold is renewed past its lease;
- a lane object made then works without its presence connection (holds rely on
  ``lease_s``, as on a cluster);
- a waiter whose wake-up listener cannot start polls instead: it gets the key once the
  holder releases it.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import redis

from lanequeue.redis import RedisSessionLane

pytestmark = pytest.mark.timeout(60)

CHILD = r'''
import asyncio, json, resource, sys, threading, time
import redis, redis.asyncio
from lanequeue import LaneBackendError
from lanequeue.redis import AsyncRedisSessionLane, RedisSessionLane

port, prefix = int(sys.argv[1]), sys.argv[2]
out = {}

def vm_bytes():
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmSize"):
                return int(line.split()[1]) * 1024

def no_threads():
    resource.setrlimit(resource.RLIMIT_AS, (vm_bytes() + 64 * 2**20, resource.RLIM_INFINITY))
    threading.stack_size(256 * 2**20)
    try:
        threading.Thread(target=lambda: None).start()
        raise SystemExit("a thread started: the fault is not in force")
    except RuntimeError:
        pass

def threads_again():
    threading.stack_size(0)
    resource.setrlimit(resource.RLIMIT_AS, (resource.RLIM_INFINITY, resource.RLIM_INFINITY))

def attempt(fn):
    try:
        return {"ok": repr(fn())}
    except BaseException as exc:
        return {"error": type(exc).__name__, "message": str(exc)}

checker = RedisSessionLane(redis.Redis(port=port), "t", prefix=prefix)
assert not checker.is_held("warm")  # its first call made (no thread needed later)

async def async_try():
    # (A numeric host: asyncio resolves a name in a thread of its executor.)
    client = redis.asyncio.Redis(host="127.0.0.1", port=port)
    alane = AsyncRedisSessionLane(client, "t", prefix=prefix, lease_s=1.5)
    try:
        return await alane.try_acquire("ak")
    finally:
        out["ak_held"] = checker.is_held("ak")

# The process's first grant: the lease watchdog's thread cannot start (an asyncio
# lane's renewer is a task).
no_threads()
out["async_try_acquire"] = attempt(lambda: asyncio.run(async_try()))
threads_again()

waiter = RedisSessionLane(redis.Redis(port=port), "t", prefix=prefix, lease_s=30.0)
# (The watchdog starts now; the waiter's renewer runs from now on.)
assert waiter.try_acquire("warm") and waiter.manual_release("warm")

no_threads()
# (A host spelled differently from the others': the first lane object of its server
# address, whose presence connection must start now.)
lane = RedisSessionLane(redis.Redis(host="127.0.0.1", port=port), "t", prefix=prefix,
                        lease_s=1.5)
out["presence_off"] = lane._presence is None
out["try_acquire"] = attempt(lambda: lane.try_acquire("k"))
out["k_held_after_try"] = checker.is_held("k")

def enter():
    with lane.acquire("k", timeout_s=2.0):
        return "entered"

out["with_acquire"] = attempt(enter)
out["k_held_after_with"] = checker.is_held("k")
st = lane.stats
out["books"] = [st.acquired, st.released, st.holders, lane.active_count]

# A waiter whose listener cannot start (its renewer already runs): it polls.
print("waiting", flush=True)
t0 = time.monotonic()
out["waiter"] = attempt(lambda: waiter.acquire_timeout("w", 15.0))
out["waited_s"] = time.monotonic() - t0
out["w_released"] = waiter.manual_release("w")

threads_again()
def renewed():
    with lane.acquire("k", timeout_s=2.0) as hold:
        time.sleep(2.2)  # past the 1.5 s lease: renewed by the renewer now running
        return hold.lost

out["lost_after_threads_again"] = attempt(renewed)
out["k_held_at_end"] = checker.is_held("k")
print(json.dumps(out), flush=True)
'''


def test_out_of_threads_never_keeps_a_grant_unrenewed_and_waiters_poll(
    redis_client: Any, redis_prefix: str, tmp_path: Path,
) -> None:
    port = redis_client.connection_pool.connection_kwargs["port"]
    holder = RedisSessionLane(redis.Redis(port=port), "t", prefix=redis_prefix, lease_s=30.0)
    assert holder.try_acquire("w")
    script = tmp_path / "child.py"
    script.write_text(CHILD)
    child = subprocess.Popen(
        [sys.executable, str(script), str(port), redis_prefix],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )
    try:
        assert child.stdout is not None
        line = child.stdout.readline()
        assert line.strip() == "waiting", line + child.stderr.read() if child.stderr else ""
        time.sleep(1.0)  # the child's waiter is in line, its listener not running
        assert holder.manual_release("w")
        stdout, stderr = child.communicate(timeout=45)
    finally:
        child.kill()
    assert child.returncode == 0, stderr
    out = json.loads(stdout.strip().splitlines()[-1])

    assert out["presence_off"]
    for step in ("try_acquire", "with_acquire", "async_try_acquire"):
        assert out[step].get("error") == "LaneBackendError", (step, out[step])
        assert "could not start a thread" in out[step]["message"]
        assert "nothing is held" in out[step]["message"]
    assert out["k_held_after_try"] is False and out["k_held_after_with"] is False
    assert out["ak_held"] is False
    acquired, released, holders, active = out["books"]
    assert acquired == released == 2 and holders == active == 0

    assert out["waiter"] == {"ok": "True"}, out["waiter"]
    assert out["w_released"] is True
    assert "wake-up listener could not start" in stderr
    # Logged once per client's listener (two: the lane's, whose ``with`` tried, and the
    # waiter's), not once per attempt (the waiter tried at every poll).
    assert stderr.count("wake-up listener could not start") == 2

    assert out["lost_after_threads_again"] == {"ok": "False"}
    assert out["k_held_at_end"] is False
    assert not holder.is_held("w")
