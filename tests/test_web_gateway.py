"""examples/web_gateway.py as a real client of the asyncio lanes, end to end over HTTP.

The server runs as a subprocess (uvicorn, 127.0.0.1, a free port). Several conversations
post their messages concurrently with httpx; within a conversation, message n+1 is sent as
soon as message n has been SENT and accepted into its line (the response headers came),
not after it was answered, so messages really queue on the server. The server's own log
then must show: per conversation, processing in sending order and never two at once;
never more than the global cap at once; different conversations in parallel.

starlette, uvicorn and httpx are in the project's ``test`` extra: if one is missing this
test FAILS (it does not skip).
"""

from __future__ import annotations

import asyncio
import importlib
import itertools
import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

EXAMPLE = Path(__file__).resolve().parent.parent / "examples" / "web_gateway.py"
GLOBAL_CAP = 3
CONVERSATIONS = 5
MESSAGES = 4
MODEL_DELAY_S = 0.2


def _require(name: str) -> Any:
    try:
        return importlib.import_module(name)
    except ImportError as exc:
        pytest.fail(
            f"{name} is not installed ({exc}); the web gateway test needs starlette, uvicorn "
            "and httpx: pip install -e '.[test]'",
            pytrace=False,
        )


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Server:
    """The gateway in a subprocess; stopped (bounded) by :meth:`stop`."""

    def __init__(self, tmp: Path) -> None:
        self.log_path = tmp / "gateway.jsonl"
        self.out_path = tmp / "server.out"
        self.port = 0
        self.proc: subprocess.Popen[bytes] | None = None

    def output(self) -> str:
        return self.out_path.read_text(errors="replace") if self.out_path.exists() else ""

    def start(self, httpx: Any, attempts: int = 3, up_within_s: float = 20.0) -> None:
        for _ in range(attempts):
            self.port = _free_port()
            with open(self.out_path, "wb") as out:
                self.proc = subprocess.Popen(
                    [
                        sys.executable, str(EXAMPLE),
                        "--port", str(self.port),
                        "--global", str(GLOBAL_CAP),
                        "--log", str(self.log_path),
                        "--model-delay", str(MODEL_DELAY_S),
                    ],
                    stdout=out,
                    stderr=subprocess.STDOUT,
                    env={**os.environ, "PYTHONUNBUFFERED": "1"},
                )
            deadline = time.monotonic() + up_within_s
            while time.monotonic() < deadline:
                if self.proc.poll() is not None:
                    break  # exited: maybe the port was taken meanwhile; try another
                try:
                    r = httpx.get(f"http://127.0.0.1:{self.port}/health", timeout=0.5)
                    if r.status_code == 200 and r.json() == {"ok": True}:
                        return
                except httpx.HTTPError:
                    pass
                time.sleep(0.05)
            self.stop()
        pytest.fail(f"the gateway did not come up; its output:\n{self.output()}")

    def stop(self) -> None:
        proc, self.proc = self.proc, None
        if proc is None or proc.poll() is not None:
            return
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=10)


async def _post_in_order(client: Any, conv: str) -> list[dict[str, Any]]:
    """Send the messages of one conversation in order: each after the previous one was
    accepted (headers received), not answered. Returns the replies."""

    async def send(seq: int, accepted: asyncio.Event) -> dict[str, Any]:
        payload = {"conversation_id": conv, "text": f"{conv} says {seq}", "seq": seq}
        async with client.stream("POST", "/messages", json=payload) as resp:
            accepted.set()
            assert resp.status_code == 200, resp.status_code
            body = await resp.aread()
        reply: dict[str, Any] = json.loads(body)
        reply["position"] = int(resp.headers["x-queue-position"])
        return reply

    pending = []
    for seq in range(MESSAGES):
        accepted = asyncio.Event()
        task = asyncio.create_task(send(seq, accepted))
        pending.append(task)
        waiter = asyncio.create_task(accepted.wait())
        done, _ = await asyncio.wait({task, waiter}, timeout=15,
                                     return_when=asyncio.FIRST_COMPLETED)
        waiter.cancel()
        if not done:
            raise AssertionError(f"{conv} #{seq} was not accepted within 15 s")
        if task in done and not accepted.is_set():
            task.result()  # raises what went wrong
    return list(await asyncio.gather(*pending))


async def _client(port: int, httpx: Any) -> dict[str, list[dict[str, Any]]]:
    async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=30.0) as client:
        convs = [f"conv-{c}" for c in range(CONVERSATIONS)]
        results = await asyncio.gather(*(_post_in_order(client, c) for c in convs))
        return dict(zip(convs, results, strict=True))


@pytest.mark.timeout(90)
def test_web_gateway_orders_conversations_and_caps_globally(tmp_path: Path) -> None:
    httpx = _require("httpx")
    _require("starlette")
    _require("uvicorn")

    server = Server(tmp_path)
    server.start(httpx)
    try:
        replies = asyncio.run(_client(server.port, httpx))
        status = httpx.get(f"http://127.0.0.1:{server.port}/status", timeout=5).json()
    finally:
        server.stop()

    # Every message was answered, with its own reply.
    for conv, rs in replies.items():
        assert [r["seq"] for r in rs] == list(range(MESSAGES))
        for r in rs:
            assert r["conversation_id"] == conv
            assert r["reply"] == f"echo: {conv} says {r['seq']}"
    # Messages really queued behind earlier ones of their conversation (not answered yet).
    assert sum(1 for rs in replies.values() for r in rs if r["position"] > 0) >= 1
    for name in ("session", "global"):
        st = status[name]["stats"]
        assert st["holders"] == 0 and st["waiters"] == 0, status
        assert st["acquired"] == st["released"] == CONVERSATIONS * MESSAGES, status

    events = [json.loads(line) for line in server.log_path.read_text().splitlines()]
    times = [e["t"] for e in events]
    assert times == sorted(times), "log times must be monotonic in log order"
    run_events = [e for e in events if e["event"] in ("start", "end")]
    assert len(run_events) == 2 * CONVERSATIONS * MESSAGES

    accepted: dict[str, list[int]] = {}
    started: dict[str, list[int]] = {}
    for e in events:
        if e["event"] == "accepted":
            accepted.setdefault(e["conversation_id"], []).append(e["seq"])
        elif e["event"] == "start":
            started.setdefault(e["conversation_id"], []).append(e["seq"])
    for conv in replies:
        # Sent in order, accepted in order, processed in that order.
        assert accepted[conv] == list(range(MESSAGES)), (conv, accepted[conv])
        assert started[conv] == list(range(MESSAGES)), (conv, started[conv])

    # Sweep the server's events in the order they happened (one event loop, one log).
    active: dict[str, int] = {}
    in_flight = 0
    peak = 0
    overlapping: set[frozenset[str]] = set()
    intervals: dict[str, list[tuple[float, float]]] = {}
    open_at: dict[str, float] = {}
    for e in run_events:
        conv = e["conversation_id"]
        if e["event"] == "start":
            assert conv not in active, f"two messages of {conv} at once: {e}"
            for other in active:
                overlapping.add(frozenset((conv, other)))
            active[conv] = e["seq"]
            open_at[conv] = e["t"]
            in_flight += 1
            peak = max(peak, in_flight)
            assert in_flight <= GLOBAL_CAP, f"{in_flight} model calls at once: {e}"
        else:
            assert active.pop(conv) == e["seq"]
            intervals.setdefault(conv, []).append((open_at.pop(conv), e["t"]))
            in_flight -= 1
    assert not active and in_flight == 0
    # Per conversation, by the clock too: each message ends before the next starts.
    for ivs in intervals.values():
        for (_, end), (start, _) in itertools.pairwise(ivs):
            assert end <= start
    # Parallelism: different conversations overlapped, up to the cap.
    assert overlapping, "no two conversations were ever processed at the same time"
    assert peak == GLOBAL_CAP
