"""The asyncio face: :class:`AsyncLane`, :class:`AsyncSessionLane`, :class:`AsyncLaneQueue`.

Same state machine as the thread face (:mod:`lanequeue._core`); only parking differs. A
task that must wait parks on a future of its event loop; the releaser that hands it the
permit sets the future's result (under the core's lock, after setting the waiter's token),
so the permit is the task's before it even resumes.

Cancellation, at every point:

- cancelled while in line (``task.cancel()``, ``asyncio.timeout()``, ``wait_for``): the
  cancelled future refuses any later grant (:meth:`_TaskWaiter.grant` returns False, the
  releaser moves on to the next waiter), and the task withdraws from the line as
  ``CancelledError`` unwinds. Nothing held, no ghost in line.
- cancelled after the permit was handed to it but before it resumed (the future already
  has its result, the task gets ``CancelledError`` anyway): ``withdraw`` reports the
  grant, and the task passes the permit on with a release before re-raising. The next
  waiter is granted within that same step.
- cancelled inside the body: ``async with`` releases on the way out.

Timeouts are timers on the loop's own clock (``loop.call_later``): at the deadline the
timer withdraws the waiter and resolves its future with "no token", unless a grant got
there first. No task or ``wait_for`` wrapper is created per wait.

A lane is bound to the first event loop that uses it; calls from another loop or another
thread raise RuntimeError (the lane's futures belong to one loop). Once that loop is
closed and the lane is quiet (no holder, no waiter), the next loop may take it over.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from threading import get_ident
from types import TracebackType
from typing import Any

from ._core import Core, Waiter
from ._errors import LaneTimeoutError
from ._face import (
    DEFAULT_GLOBAL_CONCURRENCY,
    LANE_DEFAULT,
    CountingKind,
    Hold,
    SessionKind,
)
from ._validate import check_key, check_timeout
from .queue import MultiHold, QueueBase, Step, _send

__all__ = [
    "AsyncHold",
    "AsyncLane",
    "AsyncLaneQueue",
    "AsyncSessionLane",
    "build_default_async_lanes",
]


class _TaskWaiter(Waiter):
    """A task in line: parks on a future of the lane's loop."""

    __slots__ = ("fut",)

    def __init__(self, fut: asyncio.Future[None]) -> None:
        self.token = 0
        self.left = False
        self.fut = fut

    def grant(self, token: int) -> bool:
        # A cancelled (or timed-out) waiter's future is done: refuse, so the releaser
        # hands the permit to the next waiter instead of to a task that will not use it.
        if self.fut.done():
            return False
        self.token = token
        self.fut.set_result(None)
        return True


class AsyncHold(Hold):
    """A hold on an asyncio lane; an async context manager made by ``lane.acquire(key)``.

    ``async with lane.acquire(key) as hold:`` waits for the permit (up to the timeout
    given to ``acquire``), raises :class:`LaneTimeoutError` if it does not come, and
    releases it when the block ends, also on cancellation. Single use.
    """

    __slots__ = ()

    async def __aenter__(self) -> AsyncHold:
        if self._token:
            raise RuntimeError("this hold is already entered; call lane.acquire(key) again")
        lane, key, timeout = self.lane, self.key, self._timeout_s
        lane._bind()
        token = lane._core.take(key, lane._new_waiter if timeout != 0 else None)
        if type(token) is not int:
            token = await lane._park(key, token, timeout)
            if not token:
                raise LaneTimeoutError(lane.name, key, timeout)
        self._token = token
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        token = self._token
        if token > 0:  # not released early inside the block
            self._token = -token
            # The exit runs in the task that entered, so on the lane's loop: no check.
            self.lane._core.release(self.key, token)


class _AsyncFace:
    """Acquire/release for tasks of one event loop, over either core."""

    _async_face = True
    _core: Any  # CountingCore or SessionCore: same take/release/withdraw contract
    name: str
    timeout_s: float | None
    _loop: asyncio.AbstractEventLoop | None = None
    _fast_loop: Any = None  # the bound loop, when it records its thread (see _bind)

    def _bind(self) -> None:
        """Check that the caller runs on the lane's event loop (binding it on first use).

        The hot path compares the running thread with the thread the bound loop records
        while it runs (``BaseEventLoop._thread_id``, None once it stops): equal only on
        the loop's own thread while it runs, and a thread runs one loop at a time. This
        avoids ``asyncio.get_running_loop()``, which costs a system call on Python 3.11.
        Loops without that attribute take the full check every time.
        """
        loop = self._fast_loop
        if loop is None or loop._thread_id != get_ident():
            self._bind_loop()

    def _bind_loop(self) -> asyncio.AbstractEventLoop:
        """The running loop, after checking it is this lane's (binding it on first use)."""
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            raise RuntimeError(
                f"{type(self).__name__} {self.name!r} must be used from its event loop "
                "(no event loop is running in this thread)"
            ) from None
        if loop is not self._loop:
            self._rebind(loop)
            self._fast_loop = loop if hasattr(loop, "_thread_id") else None
        return loop

    def _rebind(self, loop: asyncio.AbstractEventLoop) -> None:
        old = self._loop
        if old is not None and not (
            old.is_closed() and self._core.holders() == 0 and self._core.waiting == 0
        ):
            raise RuntimeError(
                f"{type(self).__name__} {self.name!r} is bound to another event loop; "
                "a lane serves the tasks of one loop (use one lane per loop, or a Redis "
                "lane across loops and processes)"
            )
        self._loop = loop

    def _new_waiter(self) -> _TaskWaiter:
        return _TaskWaiter(self._bind_loop().create_future())

    async def _take(self, key: str, timeout: float | None) -> int:
        """Wait up to ``timeout`` seconds (None: no limit, 0: no wait) for a permit.
        Returns the grant's token, or 0 if none came. Key already checked."""
        self._bind()
        core: Core = self._core
        got = core.take(key, self._new_waiter if timeout != 0 else None)
        if type(got) is int:
            return got
        return await self._park(key, got, timeout)

    async def _park(self, key: str, waiter: object, timeout: float | None) -> int:
        """The slow half of :meth:`_take`: ``waiter`` is what ``core.take`` returned when
        it did not grant (a waiter now in line, or None for a refusal)."""
        if waiter is None:
            return 0
        assert isinstance(waiter, _TaskWaiter)
        core: Core = self._core
        loop = waiter.fut.get_loop()
        timer = None if timeout is None else loop.call_later(timeout, self._expire, key, waiter)
        try:
            await waiter.fut
        except BaseException:
            # Cancelled in line, or after the grant but before resuming: withdraw tells
            # which; a permit already ours is passed on at once.
            token = core.withdraw(key, waiter, timed_out=False)
            if token:
                core.release(key, token)
            raise
        finally:
            if timer is not None:
                timer.cancel()
        return waiter.token

    def _expire(self, key: str, waiter: _TaskWaiter) -> None:
        """Timer callback at a waiter's deadline (on the loop, so no grant can race it)."""
        if not waiter.fut.done() and not self._core.withdraw(key, waiter, timed_out=True):
            waiter.fut.set_result(None)  # resumes the task with token 0: timed out

    def _release(self, key: str, token: int) -> bool:
        """End the hold ``token`` of ``key`` (0: the key's hold), from the lane's loop."""
        self._bind()
        ok: bool = self._core.release(key, token)
        return ok

    async def _hold(self, key: str, timeout: float | None) -> AsyncHold | None:
        token = await self._take(key, timeout)
        return AsyncHold(self, key, timeout, token) if token else None

    def acquire(self, key: str, *, timeout_s: Any = LANE_DEFAULT) -> AsyncHold:
        """An async context manager that holds a permit of this lane for ``key``.

        Args:
            key: non-empty ``str``; on a session lane, the unit of mutual exclusion.
            timeout_s: seconds to wait (loop clock); default the lane's ``timeout_s``;
                ``None`` waits without limit; ``0`` does not wait.

        Returns:
            an :class:`AsyncHold`; ``async with`` waits and yields it, leaving releases.

        Raises:
            TypeError/ValueError: at the call, for a bad key or timeout.
            LaneTimeoutError: on entering, when no permit came in time.
            RuntimeError: on entering, from a loop other than the lane's.
            asyncio.CancelledError: when the task is cancelled while waiting (it then
                holds nothing).

        Example::

            async with lane.acquire(session_key):
                reply = await client.chat(...)
        """
        if key.__class__ is not str or not key:
            key = check_key(key)
        timeout = self.timeout_s if timeout_s is LANE_DEFAULT else check_timeout(timeout_s)
        return AsyncHold(self, key, timeout)

    async def acquire_timeout(self, key: str, timeout_s: float | None) -> bool:
        """Wait up to ``timeout_s`` seconds (None: no limit, 0: no wait) for a permit.

        Returns True if taken (release it with :meth:`manual_release`), False on timeout.
        Raises TypeError / ValueError for a bad key or timeout, RuntimeError from a foreign
        loop, CancelledError if cancelled (holding nothing).
        """
        if key.__class__ is not str or not key:
            key = check_key(key)
        return await self._take(key, check_timeout(timeout_s)) != 0

    def try_acquire(self, key: str) -> bool:
        """Take a permit for ``key`` if one is free now; never waits (a plain call).

        Returns True if taken (release with :meth:`manual_release`), False otherwise.
        Raises TypeError/ValueError for a bad key, RuntimeError outside the lane's loop.
        """
        if key.__class__ is not str or not key:
            key = check_key(key)
        self._bind()
        return self._core.take(key, None) is not None

    def manual_release(self, key: str) -> bool:
        """Release a permit taken with try_acquire / acquire_timeout (a plain call).

        Same contract as the thread face: False, a logged warning and no change when
        ``key`` holds nothing. Raises RuntimeError outside the lane's loop (use
        ``loop.call_soon_threadsafe(lane.manual_release, key)`` from other threads).
        """
        if key.__class__ is not str or not key:
            key = check_key(key)
        return self._release(key, 0)

    async def _raw_acquire(self, key: str) -> bool:
        """The source design's internal acquire: wait the lane's ``timeout_s``."""
        return await self.acquire_timeout(key, self.timeout_s)

    def _raw_release(self, key: str) -> None:
        """The source design's internal release (see :meth:`manual_release`)."""
        self.manual_release(key)


class AsyncLane(_AsyncFace, CountingKind):
    """A counting lane for asyncio tasks: at most ``max_concurrent`` holders, FIFO.

    Same arguments, properties, counters and errors as :class:`lanequeue.Lane`; waiting
    is ``await``-ed and cancellable. Use it from one event loop.

    Example::

        llm = AsyncLane("global", max_concurrent=8)
        async with llm.acquire("any-key"):
            await call_model()
    """



class AsyncSessionLane(_AsyncFace, SessionKind):
    """A per-key lane for asyncio tasks: one holder per key, in arrival order.

    Same arguments, properties, counters, eviction and errors as
    :class:`lanequeue.SessionLane`; waiting is ``await``-ed and cancellable. Use it from
    one event loop.

    Example::

        sessions = AsyncSessionLane()
        async with sessions.acquire(conversation_key):
            await call_model()
    """



class _AsyncSurfaceHold(Hold):
    """A hold on a foreign asyncio lane with only the public surface."""

    __slots__ = ()

    async def _release_async(self) -> bool:
        token = self._token
        if token <= 0:
            return False
        self._token = -token
        return bool(self.lane.manual_release(self.key))


async def _hold(lane: Any, key: str, timeout: float | None) -> Any:
    take = getattr(lane, "_hold", None)
    if take is not None:
        return await take(key, timeout)
    if await lane.acquire_timeout(key, timeout):
        return _AsyncSurfaceHold(lane, key, timeout, 1)
    return None


def _task_waiter(lane: Any) -> Any:
    lane._bind()
    return lane._new_waiter


class _AsyncMultiAcquire(MultiHold):
    """What ``AsyncLaneQueue.acquire_all`` returns: entering takes every lane, in order."""

    __slots__ = ()

    async def __aenter__(self) -> MultiHold:
        if self._taken:
            raise RuntimeError("acquire_all(...) context entered twice")
        # The loop's clock, like the timers that end the waits.
        steps = self._acquiring(asyncio.get_running_loop().time, _task_waiter, None)
        try:
            wait = next(steps, None)
            while wait is not None:
                wait = _send(steps, await self._wait(*wait))
        except BaseException:
            await self.release_async()
            raise
        return self

    async def _wait(self, lane: Any, core: Any, got: Any, remaining: float | None) -> Any:
        if core is not None:
            return await lane._park(self._key, got, remaining)
        return await _hold(lane, self._key, remaining)

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self._release_all_async(exc)

    async def release_async(self) -> None:
        """Release every hold, last taken first. Safe to call twice.

        Every hold is released even when one release raises (a Redis hold whose lease was
        lost raises NotOwnerError); the first such error is raised after the loop.
        """
        await self._release_all_async(None)

    async def _release_all_async(self, block_error: BaseException | None) -> None:
        steps = self._releasing(block_error)
        hold = next(steps, None)
        while hold is not None:
            try:
                await hold._release_async()
            except BaseException as exc:
                hold = _send(steps, exc)
            else:
                hold = _send(steps, None)


class AsyncLaneQueue(QueueBase[AsyncLane, AsyncSessionLane]):
    """A registry of named asyncio lanes, composed per request by :meth:`acquire_all`.

    Same rules as :class:`lanequeue.LaneQueue` (registration order, one deadline, all or
    nothing); accepts :class:`AsyncLane`, :class:`AsyncSessionLane`, the asyncio Redis
    lanes and any object with the async lane surface.

    Example::

        queue = build_default_async_lanes()
        async with queue.acquire_all(session_key, ["session", "global"]):
            reply = await client.chat(...)
    """

    _counting = AsyncLane
    _session = AsyncSessionLane

    def _step(self, lane: Any) -> Step:
        return (lane, lane._core if isinstance(lane, _AsyncFace) else None)

    def _admit(self, lane: Any) -> None:
        if not getattr(lane, "_async_face", False):
            raise TypeError(f"{type(lane).__name__} is not an asyncio lane; use LaneQueue")

    def acquire_all(
        self, key: str, lane_names: Sequence[str], *, timeout_s: float | None = None
    ) -> _AsyncMultiAcquire:
        """Hold every named lane for ``key``: an async context manager, all or nothing.

        Arguments, order, deadline and errors as :meth:`lanequeue.LaneQueue.acquire_all`;
        the deadline runs on the loop's clock. Cancelled while waiting for a later lane,
        it releases the lanes already taken, in reverse, then re-raises CancelledError.
        """
        return self._multi(_AsyncMultiAcquire, key, lane_names, timeout_s)


def build_default_async_lanes() -> AsyncLaneQueue:
    """The asyncio twin of :func:`lanequeue.build_default_lanes`: ``"session"``
    (256 sessions, 3600 s idle), ``"global"`` (8), ``"scheduler"`` (2), ``"subagent"`` (5)."""
    queue = AsyncLaneQueue()
    queue.add_session_lane("session")
    queue.add_lane("global", max_concurrent=DEFAULT_GLOBAL_CONCURRENCY)
    queue.add_lane("scheduler", max_concurrent=2)
    queue.add_lane("subagent", max_concurrent=5)
    return queue
