"""Sub-agent pattern (asyncio): unique keys, capped by the "subagent" lane.

Every sub-agent task has its own key (``ip:<ip>:pipeline:subagent:<task>``), so it never
waits on the session lane; the "subagent" lane (max 5) caps how many run at once.
Run: ``python examples/async_subagent.py``.
"""

from __future__ import annotations

import asyncio
import time

from lanequeue import build_default_async_lanes, build_subagent_session_key


async def main() -> int:
    queue = build_default_async_lanes()
    session, subagent = queue["session"], queue["subagent"]
    t0 = time.monotonic()
    running = 0
    peak = 0
    session_waits = 0  # most callers ever seen waiting on the session lane
    queued_behind_cap = 0  # most callers ever seen waiting on the subagent lane

    async def sub_agent(task_id: str) -> str:
        nonlocal running, peak, session_waits, queued_behind_cap
        key = build_subagent_session_key("berserk", task_id)
        async with queue.acquire_all(key, ["session", "subagent"]):
            running += 1
            peak = max(peak, running)
            session_waits = max(session_waits, session.waiting)
            queued_behind_cap = max(queued_behind_cap, subagent.waiting)
            print(f"{time.monotonic() - t0:4.2f}s {key} starts ({running} running)")
            await asyncio.sleep(0.1)
            running -= 1
        return task_id

    names = [f"{topic}_analysis" for topic in
             ("reddit", "twitter", "news", "forum", "blog", "video",
              "podcast", "review", "wiki", "patent", "paper", "survey")]
    done = await asyncio.gather(*(sub_agent(n) for n in names))
    ok = (done == names and peak == subagent.max_concurrent
          and session.stats.waiters == 0 and session_waits == 0)
    print(f"{len(done)} sub-agents done; peak running {peak} (cap "
          f"{subagent.max_concurrent}); most waiting on the session lane: {session_waits}; "
          f"most queued behind the subagent cap: {queued_behind_cap}")
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(asyncio.run(main()))
