"""The driver of the contract suite (tests/test_contract.py): one test body per behaviour,
run against all eight lane classes.

A body is an ``async def body(f: Face)``. It makes its lanes with ``f.lane(...)`` and
calls every member through four adapters that are the ONLY place where the faces differ:

- ``await f.q(lane.try_acquire(key))``: the result of a query, awaited on an asyncio face
  (where it is a coroutine), taken as it is on a thread face (where it is a plain value);
- ``async with f.hold(lane.acquire(key)) as h`` / ``await f.enter(...)`` /
  ``await f.leave(h)``: a hold entered with ``async with`` or ``with``;
- ``f.spawn(part)``: run ``part()`` concurrently, as a task on an asyncio face, in a thread
  (with its own event loop, which the blocking calls never need) on a thread face;
- ``await f.until(cond)``: poll a plain condition, bounded in time.

Thread lanes block the loop thread while they wait; nothing else runs on that loop then,
so that is harmless. Redis lanes run against the real server of the session
(tests/redis_server.py), each test under a prefix of its own, made by a
:class:`lanequeue.redis.RedisBackend`.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import redis
import redis.asyncio as aredis

from lanequeue import (
    AsyncLane,
    AsyncLaneQueue,
    AsyncSessionLane,
    Lane,
    LaneQueue,
    SessionLane,
)
from lanequeue.redis import RedisBackend

Body = Callable[["Face"], Awaitable[None]]

#: Seconds a bounded wait of the suite may take before it counts as a hang.
BOUND_S = 8.0


@dataclass(frozen=True)
class Spec:
    """One of the eight lane classes: its face, backend and kind."""

    cls: str
    is_async: bool
    redis: bool
    counting: bool


SPECS = [
    Spec("Lane", False, False, True),
    Spec("SessionLane", False, False, False),
    Spec("AsyncLane", True, False, True),
    Spec("AsyncSessionLane", True, False, False),
    Spec("RedisLane", False, True, True),
    Spec("RedisSessionLane", False, True, False),
    Spec("AsyncRedisLane", True, True, True),
    Spec("AsyncRedisSessionLane", True, True, False),
]


class Spawned:
    """A concurrent part of a body: a task or a thread; ``await join()`` for its result."""

    def __init__(self, face: Face, part: Callable[[], Awaitable[Any]]) -> None:
        self._task: asyncio.Task[Any] | None = None
        self._thread: threading.Thread | None = None
        self._box: dict[str, Any] = {}
        if face.spec.is_async:
            self._task = asyncio.get_running_loop().create_task(part())
        else:
            def run() -> None:
                try:
                    self._box["result"] = asyncio.run(part())  # type: ignore[arg-type]
                except BaseException as exc:  # handed to join()
                    self._box["error"] = exc

            self._thread = threading.Thread(target=run, daemon=True)
            self._thread.start()

    @property
    def done(self) -> bool:
        if self._task is not None:
            return self._task.done()
        assert self._thread is not None
        return not self._thread.is_alive()

    async def join(self, timeout: float = BOUND_S) -> Any:
        if self._task is not None:
            return await asyncio.wait_for(self._task, timeout)
        deadline = time.monotonic() + timeout
        while not self.done:
            assert time.monotonic() < deadline, "a spawned part did not finish in time"
            await asyncio.sleep(0.005)
        if "error" in self._box:
            raise self._box["error"]
        return self._box.get("result")


class Face:
    """One lane class under test and the adapters the bodies use (see the module doc)."""

    def __init__(self, spec: Spec, host: str, port: int, prefix: str) -> None:
        self.spec = spec
        self.is_async = spec.is_async
        self.counting = spec.counting
        self._host, self._port, self._prefix = host, port, prefix
        self._clients: list[Any] = []
        self._backend: RedisBackend | None = None

    # -- running a body ------------------------------------------------------------------

    def run(self, body: Body) -> None:
        asyncio.run(self._main(body))

    async def _main(self, body: Body) -> None:
        try:
            await asyncio.wait_for(body(self), 3 * BOUND_S)
        finally:
            for client in self._clients:
                if isinstance(client, aredis.Redis):
                    await client.aclose()
                else:
                    client.close()

    def backend(self, *, is_async: bool | None = None) -> RedisBackend:
        """The Redis backend of this test (asyncio client on an asyncio face)."""
        want_async = self.is_async if is_async is None else is_async
        if self._backend is not None and (self._backend.face == "asyncio") == want_async:
            return self._backend
        client: Any
        if want_async:
            client = aredis.Redis(host=self._host, port=self._port)
        else:
            client = redis.Redis(host=self._host, port=self._port)
        self._clients.append(client)
        self._backend = RedisBackend(client, prefix=self._prefix, lease_s=5.0)
        return self._backend

    # -- making lanes --------------------------------------------------------------------

    def lane(
        self, name: str = "lane", *, timeout_s: float | None = 5.0, cap: int = 1, **ops: Any
    ) -> Any:
        """A lane of the class under test: ``cap`` permits (counting) or a per-key lane;
        ``ops``: ``warn_after_s``, ``on_wait``, ``warn_hold_s``."""
        spec = self.spec
        if spec.redis:
            b = self.backend()
            if spec.counting:
                return b.lane(name, max_concurrent=cap, timeout_s=timeout_s, **ops)
            return b.session_lane(name, timeout_s=timeout_s, **ops)
        if spec.counting:
            cls: Any = AsyncLane if spec.is_async else Lane
            return cls(name, max_concurrent=cap, timeout_s=timeout_s, **ops)
        cls = AsyncSessionLane if spec.is_async else SessionLane
        return cls(name, timeout_s=timeout_s, **ops)

    def queue(self) -> Any:
        """An empty queue of this face."""
        return AsyncLaneQueue() if self.is_async else LaneQueue()

    # -- the adapters --------------------------------------------------------------------

    async def q(self, result: Any) -> Any:
        """A query's value: awaited on an asyncio face, as it is on a thread face."""
        if self.is_async:
            return await result
        return result

    async def enter(self, cm: Any) -> Any:
        if self.is_async:
            return await cm.__aenter__()
        return cm.__enter__()

    async def leave(self, cm: Any, exc: BaseException | None = None) -> None:
        args = (type(exc), exc, None) if exc is not None else (None, None, None)
        if self.is_async:
            await cm.__aexit__(*args)
        else:
            cm.__exit__(*args)

    @contextlib.asynccontextmanager
    async def hold(self, cm: Any) -> AsyncIterator[Any]:
        """``async with`` / ``with`` the hold (or acquire_all) ``cm``."""
        entered = await self.enter(cm)
        try:
            yield entered
        except BaseException as exc:
            await self.leave(cm, exc)
            raise
        await self.leave(cm)

    def spawn(self, part: Callable[[], Awaitable[Any]]) -> Spawned:
        return Spawned(self, part)

    async def until(self, cond: Callable[[], bool], timeout: float = BOUND_S) -> None:
        deadline = time.monotonic() + timeout
        while not cond():
            assert time.monotonic() < deadline, "condition not reached in time"
            await asyncio.sleep(0.005)
