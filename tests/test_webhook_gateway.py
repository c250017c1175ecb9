"""examples/webhook_gateway.py end to end over real HTTP (uvicorn subprocess on a free
127.0.0.1 port, httpx client): Slack-style retries deduplicated by event id (C31 over
HTTP), double-texts merged by collect with a debounce, a client hang-up cancelling its
ticket, and a drain on shutdown that lets running and pending turns finish.

starlette, uvicorn and httpx are in the project's ``test`` extra: if one is missing this
test FAILS (it does not skip)."""

from __future__ import annotations

import asyncio
import json
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from test_web_gateway import _free_port, _require

EXAMPLE = Path(__file__).resolve().parent.parent / "examples" / "webhook_gateway.py"
DEBOUNCE_S = 1.0  # wide enough for three sequential posts on a loaded machine


class Gateway:
    def __init__(self, tmp: Path, httpx: Any) -> None:
        self.httpx = httpx
        self.log_path = tmp / "hooks.jsonl"
        self.out_path = tmp / "server.out"
        self.proc: subprocess.Popen[bytes] | None = None
        self.port = 0

    def start(self) -> None:
        for _ in range(3):
            self.port = _free_port()
            with open(self.out_path, "wb") as out:
                self.proc = subprocess.Popen(
                    [sys.executable, str(EXAMPLE), "--port", str(self.port),
                     "--debounce", str(DEBOUNCE_S), "--model-delay", "0.1",
                     "--log", str(self.log_path)],
                    stdout=out, stderr=subprocess.STDOUT)
            deadline = time.monotonic() + 20
            while time.monotonic() < deadline and self.proc.poll() is None:
                try:
                    if self.httpx.get(self.url("/health"), timeout=0.5).status_code == 200:
                        return
                except self.httpx.HTTPError:
                    pass
                time.sleep(0.05)
            self.kill()
        pytest.fail(f"the gateway did not come up:\n{self.out_path.read_text()}")

    def url(self, path: str) -> str:
        return f"http://127.0.0.1:{self.port}{path}"

    def events(self) -> list[dict[str, Any]]:
        if not self.log_path.exists():
            return []
        return [json.loads(x) for x in self.log_path.read_text().splitlines() if x.strip()]

    def wait_for(self, pred: Any, what: str, within_s: float = 10.0) -> dict[str, Any]:
        deadline = time.monotonic() + within_s
        while time.monotonic() < deadline:
            for e in self.events():
                if pred(e):
                    return e
            time.sleep(0.02)
        raise AssertionError(f"no log event for {what}: {self.events()}")

    def ticket(self, tid: int) -> dict[str, Any]:
        r: dict[str, Any] = self.httpx.get(self.url(f"/tickets/{tid}"), timeout=5).json()
        return r

    def wait_ticket(self, tid: int, within_s: float = 10.0) -> dict[str, Any]:
        deadline = time.monotonic() + within_s
        while time.monotonic() < deadline:
            t = self.ticket(tid)
            if t["state"] not in ("pending", "running"):
                return t
            time.sleep(0.02)
        raise AssertionError(f"ticket {tid} did not end: {self.ticket(tid)}")

    def kill(self) -> None:
        proc, self.proc = self.proc, None
        if proc is not None and proc.poll() is None:
            proc.kill()
            proc.wait(timeout=10)


def slack(gw: Gateway, event_id: str, channel: str, text: str, retry: int | None = None,
          **extra: Any) -> dict[str, Any]:
    headers = {} if retry is None else {"X-Slack-Retry-Num": str(retry)}
    r = gw.httpx.post(gw.url("/slack/events"), headers=headers, timeout=5, json={
        "event_id": event_id, "channel": channel, "user": "U1", "text": text, **extra})
    assert r.status_code == 200, r.text
    out: dict[str, Any] = r.json()
    return out


@pytest.mark.timeout(90)
def test_webhook_gateway_dedupes_collects_cancels_and_drains(tmp_path: Path) -> None:
    httpx = _require("httpx")
    _require("starlette")
    _require("uvicorn")
    gw = Gateway(tmp_path, httpx)
    gw.start()
    try:
        # C31 over HTTP: an event delivered three times runs once, one ticket.
        acks = [slack(gw, "Ev1", "C1", "hello", retry) for retry in (None, 1, 2)]
        assert len({a["ticket"] for a in acks}) == 1
        assert [a["duplicate"] for a in acks] == [False, True, True]
        t1 = gw.wait_ticket(acks[0]["ticket"])
        assert t1 == {"ticket": acks[0]["ticket"], "state": "done", "reason": None,
                      "reply": "echo: hello"}

        # Collect: three messages inside the debounce window, one model call.
        async def burst() -> list[dict[str, Any]]:
            async with httpx.AsyncClient(timeout=5) as client:
                out = []
                for i, text in enumerate(("one", "two", "three")):
                    r = await client.post(gw.url("/slack/events"), json={
                        "event_id": f"Ev-c{i}", "channel": "C2", "user": "U1",
                        "text": text})
                    out.append(r.json())
                return out

        burst_acks = asyncio.run(burst())
        replies = [gw.wait_ticket(a["ticket"]) for a in burst_acks]
        assert {r["reply"] for r in replies} == {"echo: one | two | three"}
        starts = [e for e in gw.events() if e["event"] == "start" and "c2" in e["key"]]
        assert [s["texts"] for s in starts] == [["one", "two", "three"]]

        # A client that hangs up cancels its ticket: here once its turn runs (a 30 s model
        # call), the client goes away (its request task is cancelled, the connection closes).
        async def hang_up() -> None:
            async with httpx.AsyncClient(timeout=60) as client:
                post = asyncio.ensure_future(client.post(gw.url("/chat"), json={
                    "conversation_id": "hangup", "text": "slow", "delay": 30}))
                deadline = time.monotonic() + 20
                while not any(e["event"] == "start" and "hangup" in e["key"]
                              for e in gw.events()):
                    assert time.monotonic() < deadline and not post.done()
                    await asyncio.sleep(0.02)
                post.cancel()
                with pytest.raises(asyncio.CancelledError):
                    await post

        asyncio.run(hang_up())
        sub = gw.wait_for(lambda e: e["event"] == "submit" and "hangup" in e.get("key", ""),
                          "the hang-up's submit")
        gone = gw.wait_for(lambda e: e["event"] == "ticket" and e["ticket"] == sub["ticket"],
                           "the hang-up's ticket end")
        assert (gone["state"], gone["reason"]) == ("cancelled", "cancelled")
        assert gw.wait_for(lambda e: e["event"] == "end" and sub["ticket"] in e["tickets"],
                           "the cancelled turn's end")["cancelled"] is True

        # Drain on shutdown: a running turn and a pending one both finish.
        running = slack(gw, "Ev-d1", "C3", "long", delay=1.0)
        gw.wait_for(lambda e: e["event"] == "start" and e["tickets"] == [running["ticket"]],
                    "the long turn's start")
        pending = slack(gw, "Ev-d2", "C3", "after")
        assert gw.proc is not None
        gw.proc.send_signal(signal.SIGTERM)
        # uvicorn shuts down gracefully, then re-raises the signal it caught (-SIGTERM).
        assert gw.proc.wait(timeout=20) in (0, -signal.SIGTERM), gw.out_path.read_text()
        events = gw.events()
        ended = {e["ticket"]: e for e in events if e["event"] == "ticket"}
        assert ended[running["ticket"]]["state"] == "done"
        assert ended[pending["ticket"]]["state"] == "done"
        drain = [e for e in events if e["event"] == "drain"]
        assert len(drain) == 1 and drain[0]["drained"] is True
        stats = drain[0]["stats"]
        assert stats["deduped"] == 2 and stats["merged"] == 2 and stats["cancelled"] == 1
        assert stats["submitted"] == stats["done"] + stats["cancelled"]
        assert events.index(drain[0]) > max(events.index(ended[t["ticket"]])
                                            for t in (running, pending))
    finally:
        gw.kill()
