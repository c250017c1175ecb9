"""Chat-gateway pattern: one conversation's messages one after another, conversations in
parallel, all under a global cap.

Each incoming message is handled in its own thread. The handler holds two lanes for the
conversation's session key: "session" (one holder per key, served in arrival order) and
"global" (at most 8 model calls at once over all conversations).

Run: python examples/gateway.py
"""

from __future__ import annotations

import threading
import time

from lanequeue import build_default_lanes, build_gateway_session_key

lanes = build_default_lanes()
started = time.monotonic()
inside: dict[str, int] = {}
running = [0]
peak = [0]
problems: list[str] = []
guard = threading.Lock()


def handle(key: str, text: str) -> None:
    with lanes.acquire_all(key, ["session", "global"], timeout_s=10):
        with guard:
            inside[key] = inside.get(key, 0) + 1
            running[0] += 1
            peak[0] = max(peak[0], running[0])
            if inside[key] > 1:
                problems.append(f"two handlers inside {key}")
        print(f"{time.monotonic() - started:5.2f}s  start  {key:<45} {text!r}")
        time.sleep(0.1)  # the model call
        print(f"{time.monotonic() - started:5.2f}s  reply  {key:<45} {text!r}")
        with guard:
            inside[key] -= 1
            running[0] -= 1


messages = [
    ("slack", "C12345", "U789", "1234567890.123456", "hi"),
    ("slack", "C12345", "U111", "", "hello from another user"),
    ("slack", "C12345", "U789", "1234567890.123456", "what about tomorrow?"),
    ("discord", "G42", "U5", "", "ping"),
    ("slack", "C12345", "U789", "1234567890.123456", "thanks"),
    ("discord", "G42", "U5", "", "are you there?"),
]

handlers = []
for channel, channel_id, sender, thread, text in messages:
    key = build_gateway_session_key(channel, channel_id, sender, thread_id=thread)
    t = threading.Thread(target=handle, args=(key, text))
    t.start()
    handlers.append(t)
    time.sleep(0.01)  # messages arrive a little apart
for t in handlers:
    t.join()

session, glob = lanes["session"], lanes["global"]
print(f"conversations in parallel at most: {peak[0]} (global cap {glob.max_concurrent})")
print("session lane:", session.stats.to_dict())
print("global lane: ", glob.stats.to_dict())
assert not problems, problems
assert peak[0] <= glob.max_concurrent
assert session.stats.holders == glob.stats.holders == 0
assert session.stats.unmatched_releases == glob.stats.unmatched_releases == 0
print("ok")
