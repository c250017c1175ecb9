"""A small asyncio chat gateway over HTTP: Starlette app, served by uvicorn.

``POST /messages`` with JSON ``{"conversation_id": "...", "text": "...", "seq": 0}`` (``seq``
is the client's own sequence number, optional) queues the message behind the earlier
messages of its conversation and answers with the simulated model's reply. Each message
is processed under ``acquire_all(key, ["session", "global"])`` of an AsyncLaneQueue: one
conversation strictly in arrival order, different conversations in parallel, at most
``--global`` model calls at once.

The answer is streamed in two steps, as a chat gateway acknowledges a message before the
model replies: the response HEADERS are sent as soon as the message holds its place in
its conversation's line (header ``x-queue-position``: messages of the conversation ahead
of it), the BODY (one JSON line, the reply) when it has been processed. A client that
waits for the headers of message n before sending message n+1 therefore fixes the order
of its messages without waiting for the replies.

One JSON line per event goes to ``--log PATH``: ``accepted`` (in line), ``start`` (lanes
held, model call begins), ``end`` (model call done, lanes about to be released), with the
conversation id, the client's ``seq``, the session key and ``time.monotonic()`` of the
server process (``t``).

Run::

    python examples/web_gateway.py --port 8000 --global 3 --log /tmp/gateway.jsonl
    curl -s localhost:8000/messages -d '{"conversation_id": "c1", "text": "hi", "seq": 0}'

Options may also come from the environment: LANEQUEUE_GLOBAL, LANEQUEUE_LOG,
LANEQUEUE_MODEL_DELAY (seconds). ``GET /health`` answers ``{"ok": true}``; ``GET /status``
shows the lanes.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import time
from collections.abc import AsyncIterator
from typing import IO, Any

import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from lanequeue import AsyncLaneQueue, LaneError, build_gateway_session_key


class Gateway:
    """The lanes, the event log and the simulated model of one server process."""

    def __init__(self, global_cap: int, log_path: str | None, model_delay_s: float) -> None:
        self.queue = AsyncLaneQueue()
        self.session = self.queue.add_session_lane("session")
        self.glob = self.queue.add_lane("global", max_concurrent=global_cap)
        self.model_delay_s = model_delay_s
        self.log_path = log_path
        self._log: IO[str] | None = None
        self._jobs: set[asyncio.Task[dict[str, Any]]] = set()
        self.in_flight = 0

    @contextlib.asynccontextmanager
    async def lifespan(self, app: Starlette) -> AsyncIterator[None]:
        """The server's life: the log file is open while it serves."""
        if self.log_path is None:
            yield
            return
        with open(self.log_path, "a", buffering=1, encoding="utf-8") as self._log:
            yield
        self._log = None

    def log(self, event: str, **fields: Any) -> None:
        if self._log is not None:
            record = {"event": event, "t": time.monotonic(), **fields}
            self._log.write(json.dumps(record) + "\n")

    async def model_call(self, text: str) -> str:
        await asyncio.sleep(self.model_delay_s)  # stands for the LLM round trip
        return f"echo: {text}"

    async def process(self, key: str, conv: str, seq: Any, text: str) -> dict[str, Any]:
        async with self.queue.acquire_all(key, ["session", "global"]):
            self.in_flight += 1
            self.log("start", conversation_id=conv, seq=seq, key=key, in_flight=self.in_flight)
            try:
                reply = await self.model_call(text)
            finally:
                self.log("end", conversation_id=conv, seq=seq, key=key)
                self.in_flight -= 1
        return {"conversation_id": conv, "seq": seq, "reply": reply}

    async def post_message(self, request: Request) -> Response:
        try:
            data = await request.json()
        except ValueError:
            return JSONResponse({"error": "the body must be JSON"}, status_code=400)
        conv = data.get("conversation_id") if isinstance(data, dict) else None
        text = data.get("text") if isinstance(data, dict) else None
        if not isinstance(conv, str) or not conv.strip() or not isinstance(text, str):
            return JSONResponse(
                {"error": "need a non-empty 'conversation_id' and a 'text' string"},
                status_code=400,
            )
        seq = data.get("seq")
        key = build_gateway_session_key("web", conv)
        job = asyncio.create_task(self.process(key, conv, seq, text))
        self._jobs.add(job)  # keep a reference: the job outlives a client that hangs up
        job.add_done_callback(self._jobs.discard)
        # One loop turn: the job's first step runs before this handler resumes, and in
        # that step it takes its place in the conversation's line (or the lanes). Only
        # then do the headers go out, so the client's next message comes after this one.
        await asyncio.sleep(0)
        position = await self.session.waiting_for(key)
        self.log("accepted", conversation_id=conv, seq=seq, key=key, position=position)

        async def body() -> AsyncIterator[bytes]:
            try:
                result = await asyncio.shield(job)
            except LaneError as exc:
                result = {"conversation_id": conv, "seq": seq, "error": str(exc)}
            yield (json.dumps(result) + "\n").encode()

        return StreamingResponse(
            body(),
            media_type="application/x-ndjson",
            headers={"x-queue-position": str(position)},
        )

    async def health(self, request: Request) -> Response:
        return JSONResponse({"ok": True})

    async def status(self, request: Request) -> Response:
        return JSONResponse(self.queue.status())


def create_app(global_cap: int = 3, log_path: str | None = None,
               model_delay_s: float = 0.2) -> Starlette:
    gw = Gateway(global_cap, log_path, model_delay_s)
    app = Starlette(
        routes=[
            Route("/messages", gw.post_message, methods=["POST"]),
            Route("/health", gw.health, methods=["GET"]),
            Route("/status", gw.status, methods=["GET"]),
        ],
        lifespan=gw.lifespan,
    )
    app.state.gateway = gw
    return app


def create_app_from_env() -> Starlette:
    """For ``uvicorn --factory web_gateway:create_app_from_env``."""
    return create_app(
        int(os.environ.get("LANEQUEUE_GLOBAL", "3")),
        os.environ.get("LANEQUEUE_LOG") or None,
        float(os.environ.get("LANEQUEUE_MODEL_DELAY", "0.2")),
    )


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument("--global", dest="global_cap", type=int,
                        default=int(os.environ.get("LANEQUEUE_GLOBAL", "3")),
                        help="model calls at once over all conversations (default 3)")
    parser.add_argument("--log", default=os.environ.get("LANEQUEUE_LOG"),
                        help="append one JSON line per request start/end to this file")
    parser.add_argument("--model-delay", type=float,
                        default=float(os.environ.get("LANEQUEUE_MODEL_DELAY", "0.2")),
                        help="seconds a simulated model call takes (default 0.2)")
    args = parser.parse_args(argv)
    if args.global_cap < 1:
        parser.error("--global must be >= 1")
    app = create_app(args.global_cap, args.log, args.model_delay)
    uvicorn.run(app, host=args.host, port=args.port, log_level="warning")


if __name__ == "__main__":
    main()
