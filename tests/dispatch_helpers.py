"""Helpers for the dispatcher tests: a stepped asyncio harness on :class:`FakeClockLoop`,
and turn functions whose start and end the test controls with events."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

from conftest import FakeClockLoop

from lanequeue import AsyncLaneQueue, Dispatcher, Ticket


class Stepped:
    """A Dispatcher on a FakeClockLoop: every call runs on the loop, then the loop settles
    (timers in the future stay pending until :meth:`advance`)."""

    def __init__(self, global_cap: int = 8, *, session_timeout_s: float | None = 300.0,
                 lanes: tuple[str, ...] = ("session", "global"), **kw: Any) -> None:
        self.loop = FakeClockLoop()
        self.queue = AsyncLaneQueue()
        self.queue.add_session_lane("session", timeout_s=session_timeout_s)
        self.queue.add_lane("global", max_concurrent=global_cap, timeout_s=300.0)
        self.d = Dispatcher(self.queue, lanes=lanes, **kw)

    def call(self, fn: Callable[..., Any], *args: Any, **kw: Any) -> Any:
        """Run ``fn(*args, **kw)`` on the loop (from a task), settle, return its result."""
        return run_on_loop(self.loop, fn, *args, **kw)

    def submit(self, key: str, fn: Any, *args: Any, **kw: Any) -> Ticket:
        t: Ticket = self.call(self.d.submit, key, fn, *args, **kw)
        return t

    def run(self, coro: Any) -> Any:
        """Run a coroutine to completion on the loop (it may wait for timers that
        :meth:`advance` must fire: then use :meth:`start` instead)."""
        task = self.loop.create_task(coro)
        self.loop.settle()
        assert task.done(), "the coroutine is still waiting"
        return task.result()

    def start(self, coro: Any) -> asyncio.Task[Any]:
        task = self.loop.create_task(coro)
        self.loop.settle()
        return task

    def settle(self) -> None:
        self.loop.settle()

    def advance(self, seconds: float) -> None:
        self.loop.advance(seconds)

    def outcome(self, ticket: Ticket) -> Any:
        """What awaiting the (ended) ticket gives: ("ok", value) or ("err", exception)."""
        assert ticket.done(), ticket

        async def get() -> Any:
            try:
                return ("ok", await ticket)
            except BaseException as exc:
                return ("err", exc)

        return self.run(get())

    def close(self) -> None:
        """Close the dispatcher (cancelling what is left), let it unwind, close the loop."""
        if not self.loop.is_closed():
            self.call(self.d.close)
            self.loop.shutdown()


class Turns:
    """Turn functions that log their start and end and wait for the test's go-ahead.

    ``turn(label)`` (async) logs ("start", label), waits until :meth:`finish` (or
    :meth:`fail`), logs ("end", label) and returns "r:<label>"; cancelled, it logs
    ("cancelled", label) and re-raises. ``batch(labels)`` is the same for collect: its
    label is the tuple of payloads.
    """

    def __init__(self) -> None:
        self.log: list[tuple[str, Any]] = []
        self.gates: dict[Any, asyncio.Event] = {}
        self.errors: dict[Any, BaseException] = {}

    def _gate(self, label: Any) -> asyncio.Event:
        return self.gates.setdefault(label, asyncio.Event())

    async def turn(self, label: Any) -> str:
        self.log.append(("start", label))
        try:
            await self._gate(label).wait()
        except asyncio.CancelledError:
            self.log.append(("cancelled", label))
            raise
        self.log.append(("end", label))
        if label in self.errors:
            raise self.errors[label]
        return f"r:{label}"

    async def batch(self, labels: list[Any]) -> str:
        return await self.turn(tuple(labels))

    def finish(self, label: Any) -> None:
        self._gate(label).set()

    def fail(self, label: Any, exc: BaseException) -> None:
        self.errors[label] = exc
        self._gate(label).set()

    def started(self) -> list[Any]:
        return [label for ev, label in self.log if ev == "start"]


def run_on_loop(loop: FakeClockLoop, fn: Callable[..., Any], *args: Any, **kw: Any) -> Any:
    """Run ``fn(*args, **kw)`` on ``loop`` from a task, settle the loop, and return what it
    returned (or raise what it raised)."""
    box: dict[str, Any] = {}

    async def go() -> None:
        try:
            box["r"] = fn(*args, **kw)
        except BaseException as exc:
            box["e"] = exc

    loop.create_task(go())
    loop.settle()
    if "e" in box:
        raise box["e"]
    return box["r"]


def claim_key(prefix: str, key: str, dedupe_id: str) -> str:
    """The Redis key of the shared dedupe window's claim of ``dedupe_id`` submitted for
    ``key``, as README "Across processes" spells it: ``{<prefix>:d:<scope>}``, the scope
    being the key's length, the key and the id (ids are scoped per key)."""
    return f"{{{prefix}:d:{len(key)}:{key}:{dedupe_id}}}"
