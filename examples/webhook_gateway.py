"""A chat webhook gateway on the asyncio Dispatcher: Starlette app, served by uvicorn.

What a gateway does with the turns of a busy conversation, in about 200 lines:

- ``POST /slack/events`` with a Slack-style event ``{"event_id": "Ev1", "channel": "C1",
  "user": "U1", "text": "hi"}`` is acknowledged at once (Slack wants an answer within
  3 s) with ``{"ticket": 7, "duplicate": false}``; the turn runs in the dispatcher.
  Slack redelivers an event it thinks was lost (header ``X-Slack-Retry-Num``): the event
  id is the ``dedupe_id``, so a redelivery gets the same ticket and runs nothing new
  (``"duplicate": true``).
- The dispatcher's busy policy is ``collect`` with a short ``debounce_s``: messages a user
  double-texts into one conversation within the window are answered by ONE model call
  that sees them all, and every merged ticket gets that reply.
- ``POST /chat`` (``{"conversation_id": "c1", "text": "hi"}``) waits for the reply; a
  client that hangs up before it comes cancels its ticket (``dispatcher.cancel``).
- ``GET /tickets/{id}`` shows a ticket's state, reason and reply; ``GET /status`` the
  dispatcher's snapshot and stats.
- On shutdown (SIGTERM, Ctrl-C) the gateway drains: it refuses new turns, lets the running
  and pending ones finish (up to ``--drain-timeout`` seconds), then closes.

One JSON line per event goes to ``--log PATH`` (``submit``, ``start``, ``end``, ``ticket``,
``drain``), each with ``time.monotonic()`` of the server (``t``).

Run::

    python examples/webhook_gateway.py --port 8000 --debounce 0.3 --log /tmp/hooks.jsonl
    curl -s localhost:8000/slack/events \
         -d '{"event_id": "Ev1", "channel": "C1", "user": "U1", "text": "hi"}'
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import time
from collections import OrderedDict
from collections.abc import AsyncIterator
from typing import IO, Any

import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from lanequeue import (
    AsyncLaneQueue,
    Dispatcher,
    DispatcherDrainingError,
    LaneError,
    Ticket,
    build_gateway_session_key,
    current_turn,
)

KEEP_TICKETS = 10_000  # tickets GET /tickets/{id} can still show


class Gateway:
    def __init__(self, global_cap: int, debounce_s: float, model_delay_s: float,
                 drain_timeout_s: float, log_path: str | None) -> None:
        self.queue = AsyncLaneQueue()
        self.queue.add_session_lane("session")
        self.queue.add_lane("global", max_concurrent=global_cap)
        self.dispatcher = Dispatcher(self.queue, busy="collect", debounce_s=debounce_s,
                                     max_wait_s=5 * debounce_s + 1.0)
        self.model_delay_s = model_delay_s
        self.drain_timeout_s = drain_timeout_s
        self.log_path = log_path
        self._log: IO[str] | None = None
        self.tickets: OrderedDict[int, Ticket] = OrderedDict()

    @contextlib.asynccontextmanager
    async def lifespan(self, app: Starlette) -> AsyncIterator[None]:
        with contextlib.ExitStack() as stack:
            if self.log_path is not None:
                self._log = stack.enter_context(
                    open(self.log_path, "a", buffering=1, encoding="utf-8"))
            yield
            # Shutdown: no new turns; the running and pending ones may finish.
            drained = await self.dispatcher.drain(self.drain_timeout_s)
            self.dispatcher.close()  # ends whatever is left as cancelled ("closed")
            await self.dispatcher.wait_idle(5.0)
            self.log("drain", drained=drained, stats=self.dispatcher.stats.to_dict())
            self._log = None

    def log(self, event: str, **fields: Any) -> None:
        if self._log is not None:
            self._log.write(json.dumps({"event": event, "t": time.monotonic(), **fields}) + "\n")

    async def reply(self, messages: list[dict[str, Any]]) -> str:
        """One model call for the merged messages of a conversation (collect)."""
        turn = current_turn()
        texts = [m["text"] for m in messages]
        ids = [t.id for t in turn.tickets]
        self.log("start", key=turn.key, texts=texts, tickets=ids)
        try:
            delay = max(float(m.get("delay", self.model_delay_s)) for m in messages)
            await asyncio.sleep(delay)  # stands for the LLM round trip
        finally:
            self.log("end", key=turn.key, tickets=ids, cancelled=turn.cancelled)
        return "echo: " + " | ".join(texts)

    def submit(self, key: str, message: dict[str, Any], dedupe_id: str | None) -> Ticket:
        ticket = self.dispatcher.submit(key, self.reply, message, dedupe_id=dedupe_id)
        if ticket.id not in self.tickets:
            self.tickets[ticket.id] = ticket
            while len(self.tickets) > KEEP_TICKETS:
                self.tickets.popitem(last=False)
            ticket.add_done_callback(self._ended)
        return ticket

    def _ended(self, ticket: Ticket) -> None:
        self.log("ticket", ticket=ticket.id, key=ticket.key, state=ticket.state,
                 reason=ticket.reason)

    async def slack_events(self, request: Request) -> Response:
        body = await _json(request)
        if body is None or not all(isinstance(body.get(f), str) and body.get(f)
                                   for f in ("event_id", "channel", "text")):
            return JSONResponse({"error": "need event_id, channel and text"}, status_code=400)
        key = build_gateway_session_key("slack", body["channel"], str(body.get("user", "")))
        before = self.dispatcher.stats.deduped
        try:
            ticket = self.submit(key, body, body["event_id"])
        except DispatcherDrainingError:
            return JSONResponse({"error": "shutting down"}, status_code=503)
        duplicate = self.dispatcher.stats.deduped > before  # one loop: no submit between
        self.log("submit", event_id=body["event_id"], ticket=ticket.id, duplicate=duplicate,
                 retry=request.headers.get("x-slack-retry-num"))
        return JSONResponse({"ticket": ticket.id, "duplicate": duplicate})

    async def chat(self, request: Request) -> Response:
        body = await _json(request)
        if body is None or not isinstance(body.get("conversation_id"), str) \
                or not isinstance(body.get("text"), str):
            return JSONResponse({"error": "need conversation_id and text"}, status_code=400)
        key = build_gateway_session_key("web", body["conversation_id"])
        try:
            ticket = self.submit(key, body, None)
        except DispatcherDrainingError:
            return JSONResponse({"error": "shutting down"}, status_code=503)
        self.log("submit", ticket=ticket.id, key=key)
        answer = asyncio.ensure_future(_outcome(ticket))
        hangup = asyncio.ensure_future(_disconnected(request))
        done, _ = await asyncio.wait({answer, hangup}, return_when=asyncio.FIRST_COMPLETED)
        if answer not in done:
            # The client hung up: nobody wants this reply any more.
            self.dispatcher.cancel(ticket)
            answer.cancel()  # only stops our wait; the cancel above ended the turn
            return Response(status_code=499)
        hangup.cancel()
        return JSONResponse({"ticket": ticket.id, **answer.result()})

    async def ticket(self, request: Request) -> Response:
        ticket = self.tickets.get(int(request.path_params["tid"]))
        if ticket is None:
            return JSONResponse({"error": "unknown ticket"}, status_code=404)
        out: dict[str, Any] = {"ticket": ticket.id, "state": ticket.state,
                               "reason": ticket.reason}
        if ticket.state == "done":
            out["reply"] = await ticket
        return JSONResponse(out)

    async def status(self, request: Request) -> Response:
        return JSONResponse({"snapshot": self.dispatcher.snapshot(),
                             "stats": self.dispatcher.stats.to_dict()})


async def _json(request: Request) -> dict[str, Any] | None:
    try:
        body = await request.json()
    except ValueError:
        return None
    return body if isinstance(body, dict) else None


async def _outcome(ticket: Ticket) -> dict[str, Any]:
    try:
        return {"state": "done", "reply": await ticket}
    except LaneError as exc:
        return {"state": ticket.state, "reason": ticket.reason, "error": str(exc)}


async def _disconnected(request: Request) -> None:
    """Return when the client hangs up (the body was read: the next message says so)."""
    while (await request.receive())["type"] != "http.disconnect":
        pass


def create_app(global_cap: int = 4, debounce_s: float = 0.3, model_delay_s: float = 0.2,
               drain_timeout_s: float = 10.0, log_path: str | None = None) -> Starlette:
    gw = Gateway(global_cap, debounce_s, model_delay_s, drain_timeout_s, log_path)
    app = Starlette(
        routes=[
            Route("/slack/events", gw.slack_events, methods=["POST"]),
            Route("/chat", gw.chat, methods=["POST"]),
            Route("/tickets/{tid:int}", gw.ticket, methods=["GET"]),
            Route("/status", gw.status, methods=["GET"]),
            Route("/health", lambda r: JSONResponse({"ok": True}), methods=["GET"]),
        ],
        lifespan=gw.lifespan,
    )
    app.state.gateway = gw
    return app


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument("--global", dest="global_cap", type=int, default=4,
                        help="model calls at once over all conversations (default 4)")
    parser.add_argument("--debounce", type=float, default=0.3,
                        help="collect window in seconds (default 0.3)")
    parser.add_argument("--model-delay", type=float, default=0.2,
                        help="seconds a simulated model call takes (default 0.2)")
    parser.add_argument("--drain-timeout", type=float, default=10.0,
                        help="seconds shutdown waits for running and pending turns")
    parser.add_argument("--log", default=None, help="append one JSON line per event here")
    args = parser.parse_args(argv)
    if args.global_cap < 1:
        parser.error("--global must be >= 1")
    app = create_app(args.global_cap, args.debounce, args.model_delay, args.drain_timeout,
                     args.log)
    uvicorn.run(app, host=args.host, port=args.port, log_level="warning")


if __name__ == "__main__":
    main()
