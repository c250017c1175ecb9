"""Sub-agent pattern: unique keys never wait on the session lane; a counting lane caps them.

An orchestrator fans out 12 sub-agent tasks. Each has its own session key, so the session
lane never makes one wait for another; the "subagent" lane lets at most 5 run at once.

Run: python examples/subagent.py
"""

from __future__ import annotations

import threading
import time

from lanequeue import build_default_lanes, build_subagent_session_key

lanes = build_default_lanes()
session, subagent = lanes["session"], lanes["subagent"]
running = [0]
peak = [0]
guard = threading.Lock()
started = time.monotonic()


def sub_agent(task_id: str) -> None:
    key = build_subagent_session_key("berserk", task_id)
    with lanes.acquire_all(key, ["session", "subagent"], timeout_s=10):
        with guard:
            running[0] += 1
            peak[0] = max(peak[0], running[0])
            now = running[0]
        print(f"{time.monotonic() - started:5.2f}s  {key:<45} running now: {now}")
        time.sleep(0.1)  # the sub-agent's work
        with guard:
            running[0] -= 1


tasks = [threading.Thread(target=sub_agent, args=(f"task_{i:02d}",)) for i in range(12)]
for t in tasks:
    t.start()
for t in tasks:
    t.join()

print(f"at most {peak[0]} sub-agents at once (cap {subagent.max_concurrent})")
print("session lane: ", session.stats.to_dict())
print("subagent lane:", subagent.stats.to_dict())
assert peak[0] <= subagent.max_concurrent
assert session.stats.acquired == subagent.stats.acquired == 12
assert session.stats.timeouts == subagent.stats.timeouts == 0
assert session.stats.holders == subagent.stats.holders == 0
print("ok")
