"""Chat gateway pattern (asyncio): one conversation strictly in order, conversations in
parallel, all under a global cap on model calls.

Each incoming message is handled under ``acquire_all(key, ["session", "global"])``: the
session lane serialises one conversation (per-key FIFO), the global lane caps how many
model calls run at once. Run: ``python examples/async_gateway.py``.
"""

from __future__ import annotations

import asyncio
import time

from lanequeue import AsyncLaneQueue, build_gateway_session_key

GLOBAL_CAP = 2
MODEL_CALL_S = 0.1


async def main() -> int:
    queue = AsyncLaneQueue()
    queue.add_session_lane("session")
    queue.add_lane("global", max_concurrent=GLOBAL_CAP)
    t0 = time.monotonic()
    running = 0
    peak = 0
    done: dict[str, list[int]] = {}

    def stamp() -> str:
        return f"{time.monotonic() - t0:5.2f}s"

    async def handle(user: str, thread: str, seq: int, text: str) -> None:
        nonlocal running, peak
        key = build_gateway_session_key("slack", "C12345", user, thread_id=thread)
        async with queue.acquire_all(key, ["session", "global"]):
            running += 1
            peak = max(peak, running)
            print(f"{stamp()} start {key} #{seq} {text!r} (model calls running: {running})")
            await asyncio.sleep(MODEL_CALL_S)  # the model call
            running -= 1
            done.setdefault(key, []).append(seq)
            print(f"{stamp()} end   {key} #{seq}")

    conversations = [("U1", "1700000000.000100"), ("U2", "1700000000.000200"),
                     ("U3", "1700000000.000300")]
    tasks = []
    for seq in range(3):  # messages arrive interleaved across conversations
        for user, thread in conversations:
            tasks.append(asyncio.create_task(handle(user, thread, seq, f"message {seq}")))
            await asyncio.sleep(0)  # arrival order: this message joined its line
    await asyncio.gather(*tasks)

    in_order = all(seqs == [0, 1, 2] for seqs in done.values())
    print(f"{stamp()} every conversation in order: {in_order}; "
          f"peak model calls: {peak} (cap {GLOBAL_CAP})")
    status = queue.status()
    print(f"lanes idle: session active={status['session']['active']}, "
          f"global active={status['global']['active']}")
    return 0 if in_order and peak <= GLOBAL_CAP else 1


if __name__ == "__main__":
    raise SystemExit(asyncio.run(main()))
