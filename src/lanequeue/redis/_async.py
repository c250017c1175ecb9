"""The asyncio face of the Redis lanes: :class:`AsyncRedisSessionLane`, :class:`AsyncRedisLane`.

Same scripts, keys and rules as the thread face (see the package docstring); a waiting task
awaits BLPOP on its own signal list through a ``redis.asyncio.Redis`` client, and one
renewer task per lane object (on the loop of the lane's latest grant) renews its holds.

Differences from the in-process asyncio lanes, forced by the round trip to Redis:
``try_acquire``, ``manual_release``, ``hold.release()``, ``_raw_release``, and the
lane-wide views (``is_held``, ``waiting_for``, ``holds_of``, ``lane_status``) are
coroutines. The synchronous views (``active_count``, ``waiting``, ``get_active()``,
``stats``, ``status()``) describe THIS lane object, so ``AsyncLaneQueue.status()`` never
waits.

Cancellation: a task cancelled while waiting (or right after the server granted it) leaves
the line in one script and passes on a grant that reached it; a task cancelled inside
``async with`` releases on the way out.
"""

from __future__ import annotations

import asyncio
import math
import time
import weakref
from types import TracebackType
from typing import Any

from redis.exceptions import RedisError

from .._errors import LaneBackendError, LaneError, LaneTimeoutError, NotOwnerError
from .._face import (
    DEFAULT_IDLE_TIMEOUT_S,
    DEFAULT_MAX_CONCURRENT,
    DEFAULT_MAX_SESSIONS,
    DEFAULT_TIMEOUT_S,
    LANE_DEFAULT,
)
from .._validate import bad_key, check_count, check_key, check_timeout
from ._protocol import (
    DEFAULT_LEASE_S,
    DEFAULT_PREFIX,
    PENDING,
    Call,
    OnLeaseLost,
    RedisHoldBase,
    RedisLaneBase,
    grant_reply,
    log,
    next_block,
)

__all__ = ["AsyncRedisHold", "AsyncRedisLane", "AsyncRedisSessionLane"]


class AsyncRedisHold(RedisHoldBase):
    """A hold on an asyncio Redis lane; an async context manager made by
    ``lane.acquire(key)``.

    ``async with`` waits for the grant (LaneTimeoutError if it does not come in time) and
    releases on the way out, also on cancellation. ``await hold.release()`` returns True
    when it ended the hold, False when it had already ended; it raises NotOwnerError when
    the hold is no longer this acquisition's, LeaseLostError when that loss was already
    known. Leaving the block raises the same unless the block itself raised (then the
    release error is logged and the block's exception propagates).
    """

    __slots__ = ()

    lane: _AsyncFace

    async def __aenter__(self) -> AsyncRedisHold:
        if self._state != PENDING:
            raise RuntimeError("this hold was already entered; call lane.acquire(key) again")
        if not await self.lane._take(self, self._timeout_s):
            raise LaneTimeoutError(self.lane.name, self.key, self._timeout_s)
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if exc_type is None:
            await self.release()
            return
        try:
            await self.release()
        except LaneError as err:
            log.warning("lane %r: release of key %r after an error in the block: %s",
                        self.lane.name, self.key, err)

    async def release(self) -> bool:  # type: ignore[override]
        """End this hold (see the class docstring for the return value and errors)."""
        return await self.lane._release(self)

    async def _release_async(self) -> bool:
        """For ``AsyncLaneQueue``: same as :meth:`release`."""
        return await self.lane._release(self)


async def _renew_loop(ref: weakref.ref[_AsyncFace]) -> None:
    """The renewer task of one lane object (weak reference between rounds)."""
    try:
        while True:
            lane = ref()
            if lane is None:
                return
            plan = lane._renewal_due(time.monotonic())
            if plan is None:
                return
            due, sleep = plan
            for hold in due:
                script, keys, args = lane._renew_call(hold)
                t0 = time.monotonic()
                try:
                    ok = int(await script(keys=keys, args=args)) == 1
                except RedisError as exc:
                    lane._renew_failed(hold, exc, time.monotonic())
                    continue
                except Exception:  # never let the renewer die
                    log.exception("lane %r: renewer error", lane.name)
                    continue
                lane._renewed(hold, ok, t0)
            del lane, due
            await asyncio.sleep(sleep)
    finally:
        lane = ref()
        if lane is not None and lane._renew_task is asyncio.current_task():
            # Cancelled with its loop, or exited idle: the next grant starts a new one.
            with lane._lock:
                lane._renewing = False


class _AsyncFace(RedisLaneBase[AsyncRedisHold]):
    """Acquire/release for asyncio tasks over either kind of Redis lane."""

    _async_face = True
    _renew_task: asyncio.Task[None] | None = None

    async def _run(self, op: str, key: str | None, call: Call) -> Any:
        script, keys, args = call
        try:
            return await script(keys=keys, args=args)
        except RedisError as exc:
            raise self._backend(op, key, exc) from exc

    def _granted(self, hold: AsyncRedisHold, token: int, t0: float) -> bool:
        start = self._register(hold, token, t0)
        loop = asyncio.get_running_loop()
        task = self._renew_task
        if start or task is None or task.done() or task.get_loop() is not loop:
            with self._lock:
                self._renewing = True
            self._renew_task = loop.create_task(
                _renew_loop(weakref.ref(self)), name=f"lanequeue-renew-{self.name}"
            )
        return True

    async def _take(self, hold: AsyncRedisHold, timeout: float | None) -> bool:
        """As the thread face's ``_take``, awaiting instead of blocking."""
        key = hold.key
        wait = timeout != 0
        t0 = time.monotonic()
        deadline = None if timeout is None else t0 + timeout
        in_line = False
        try:
            call = self._acquire_call(hold, wait)
            granted, value = grant_reply(await self._run("acquire", key, call))
            if granted:
                return self._granted(hold, value, t0)
            if not wait:
                self._count_outcome(rejected=True)
                return False
            signal = self._signal_key(hold)
            in_line = True
            self._wait_delta(1)
            wake = value
            while True:
                block = next_block(self._poll_s, wake, deadline, time.monotonic())
                if not block:
                    break
                try:
                    await self._client.blpop([signal], timeout=block)
                except RedisError as exc:
                    raise self._backend("wait", key, exc) from exc
                t0 = time.monotonic()
                call = self._acquire_call(hold, True)
                granted, value = grant_reply(await self._run("acquire", key, call))
                if granted:
                    return self._granted(hold, value, t0)
                wake = value
            t0 = time.monotonic()
            call = self._withdraw_call(hold)
            granted, value = grant_reply(await self._run("withdraw", key, call))
            if granted:
                return self._granted(hold, value, t0)
            self._count_outcome(timed_out=True)
            return False
        except LaneBackendError:
            raise  # see the thread face: a clean-up call would fail the same way
        except BaseException:
            # Cancelled (or another exception) at any point, maybe after the server
            # queued or granted us: leave no ghost in line, pass on a grant.
            await self._abandon(hold)
            raise
        finally:
            if in_line:
                self._wait_delta(-1)

    async def _abandon(self, hold: AsyncRedisHold) -> None:
        self._count_outcome(cancelled=True)
        try:
            call = self._withdraw_call(hold)
            granted, _ = grant_reply(await self._run("withdraw", hold.key, call))
            if granted:
                await self._run("release", hold.key, self._release_call(hold))
        except Exception as exc:
            log.debug("lane %r: clean-up after an abandoned wait failed: %s", self.name, exc)

    async def _release(self, hold: AsyncRedisHold) -> bool:
        if not self._detach(hold):
            return False
        return await self._finish(hold)

    async def _finish(self, hold: AsyncRedisHold) -> bool:
        if hold._lost:
            return self._lost_release(hold)
        reply = await self._run("release", hold.key, self._release_call(hold))
        return self._release_result(hold, int(reply) == 1)

    # -- the public surface --------------------------------------------------------------

    async def _hold(self, key: str, timeout: float | None) -> AsyncRedisHold | None:
        """For ``AsyncLaneQueue.acquire_all``: the granted hold, or None on timeout."""
        hold = AsyncRedisHold(self, key, timeout)
        return hold if await self._take(hold, timeout) else None

    def acquire(self, key: str, *, timeout_s: Any = LANE_DEFAULT) -> AsyncRedisHold:
        """An async context manager that holds this lane for ``key``.

        Args and errors as the thread face's ``acquire``; ``asyncio.CancelledError``
        when the task is cancelled while waiting (it then holds nothing).

        Example::

            async with lane.acquire(session_key) as hold:
                await store.write(data, fence=hold.fencing_token)
        """
        if key.__class__ is not str or not key:
            bad_key(key)
        timeout = self.timeout_s if timeout_s is LANE_DEFAULT else check_timeout(timeout_s)
        return AsyncRedisHold(self, key, timeout)

    async def try_acquire(self, key: str) -> bool:
        """Take ``key`` if it is free now, without waiting (a coroutine: one round trip);
        True if taken (release with :meth:`manual_release`)."""
        if key.__class__ is not str or not key:
            bad_key(key)
        return await self._take(AsyncRedisHold(self, key, 0.0), 0.0)

    async def acquire_timeout(self, key: str, timeout_s: float | None) -> bool:
        """Wait up to ``timeout_s`` seconds (None: no limit, 0: no wait); True if taken
        (release with :meth:`manual_release`), False on timeout."""
        if key.__class__ is not str or not key:
            bad_key(key)
        timeout = check_timeout(timeout_s)
        return await self._take(AsyncRedisHold(self, key, timeout), timeout)

    async def manual_release(self, key: str) -> bool:
        """Release THIS lane object's oldest hold of ``key`` (a coroutine). Same contract
        as the thread face: False and a warning when this object holds nothing for
        ``key`` or its lease was lost; another client's hold is never released."""
        if key.__class__ is not str or not key:
            bad_key(key)
        hold = self._detach_oldest(key)
        if hold is None:
            return False
        try:
            return await self._finish(hold)
        except NotOwnerError as err:
            log.warning("lane %r: manual_release(%r): %s", self.name, key, err)
            return False

    async def _raw_acquire(self, key: str) -> bool:
        """The source design's internal acquire: wait the lane's ``timeout_s``."""
        return await self.acquire_timeout(key, self.timeout_s)

    async def _raw_release(self, key: str) -> None:
        """The source design's internal release (see :meth:`manual_release`)."""
        await self.manual_release(key)

    # -- views of this lane object -------------------------------------------------------

    @property
    def active_count(self) -> int:
        """Holds of THIS lane object now (not lost)."""
        return self._n_live

    @property
    def waiting(self) -> int:
        """Tasks of THIS lane object waiting now."""
        return self._waiting

    def get_active(self) -> dict[str, float]:
        """Each key held through THIS lane object -> seconds held so far."""
        return self._local_active()

    def status(self) -> dict[str, Any]:
        """A JSON-ready picture of this lane object (no Redis round trip)."""
        return {
            "kind": type(self).__name__,
            "name": self.name,
            "prefix": self.prefix,
            "timeout_s": self.timeout_s,
            "lease_s": self.lease_s,
            "active": self._n_live,
            "waiting": self._waiting,
            "stats": self.stats.to_dict(),
            **self._limits(),
        }


class AsyncRedisSessionLane(_AsyncFace):
    """A per-key lane on Redis for asyncio tasks: one holder per key across every process
    and host, in arrival order. Arguments as :class:`RedisSessionLane`, with a
    ``redis.asyncio.Redis`` client.

    Example::

        sessions = AsyncRedisSessionLane(redis.asyncio.Redis())
        async with sessions.acquire(conversation_key):
            await call_model()
    """

    _kind = "s"

    def __init__(
        self,
        client: Any,
        name: str = "session",
        *,
        max_sessions: int = DEFAULT_MAX_SESSIONS,
        idle_timeout_s: float = DEFAULT_IDLE_TIMEOUT_S,
        timeout_s: float | None = DEFAULT_TIMEOUT_S,
        lease_s: float = DEFAULT_LEASE_S,
        prefix: str = DEFAULT_PREFIX,
        on_lease_lost: OnLeaseLost | None = None,
    ) -> None:
        super().__init__(
            client, name, timeout_s=timeout_s, lease_s=lease_s, prefix=prefix,
            on_lease_lost=on_lease_lost,
        )
        self._max_sessions = check_count(max_sessions, "max_sessions")
        idle = check_timeout(idle_timeout_s, "idle_timeout_s")
        self._idle_timeout_s = math.inf if idle is None else idle

    @property
    def max_sessions(self) -> int:
        """Accepted for compatibility (nothing idle is kept in Redis)."""
        return self._max_sessions

    @property
    def idle_timeout_s(self) -> float:
        """Accepted for compatibility (nothing idle is kept in Redis)."""
        return self._idle_timeout_s

    @property
    def session_count(self) -> int:
        """Keys with a hold of THIS lane object now."""
        return len(self._local_active())

    def cleanup_idle(self) -> int:
        """Nothing idle is kept (keys expire in Redis by themselves): returns 0."""
        return 0

    async def _key_info(self, key: str) -> tuple[bool, int]:
        key = check_key(key)
        reply = await self._run("read", key, self._info_call(key))
        return bool(int(reply[0])), int(reply[1])

    async def is_held(self, key: str) -> bool:
        """True while ``key`` has a holder in any process (a coroutine: asks Redis)."""
        return (await self._key_info(key))[0]

    async def waiting_for(self, key: str) -> int:
        """Callers in line for ``key`` in every process (a coroutine: asks Redis)."""
        return (await self._key_info(key))[1]

    def _limits(self) -> dict[str, Any]:
        return {"max_sessions": self._max_sessions}


class AsyncRedisLane(_AsyncFace):
    """A counting lane on Redis for asyncio tasks: at most ``max_concurrent`` holds over
    all keys and processes, FIFO. Arguments as :class:`RedisLane`, with a
    ``redis.asyncio.Redis`` client.

    Lane-wide views are coroutines: ``await lane.lane_status()`` (holders, waiters,
    available, keys), ``await lane.holds_of(key)``.

    Example::

        llm = AsyncRedisLane(redis.asyncio.Redis(), "global", max_concurrent=8)
        async with llm.acquire(session_key):
            await call_model()
    """

    _kind = "c"

    def __init__(
        self,
        client: Any,
        name: str,
        *,
        max_concurrent: int = DEFAULT_MAX_CONCURRENT,
        timeout_s: float | None = DEFAULT_TIMEOUT_S,
        lease_s: float = DEFAULT_LEASE_S,
        prefix: str = DEFAULT_PREFIX,
        on_lease_lost: OnLeaseLost | None = None,
    ) -> None:
        super().__init__(
            client, name, timeout_s=timeout_s, lease_s=lease_s, prefix=prefix,
            on_lease_lost=on_lease_lost, max_concurrent=max_concurrent,
        )

    @property
    def max_concurrent(self) -> int:
        """The lane's number of permits."""
        return self._cap

    async def _info(self) -> tuple[int, int, int, list[tuple[int, str]]]:
        return self._parse_counting_info(await self._run("read", None, self._info_call(None)))

    async def lane_status(self) -> dict[str, Any]:
        """Lane-wide: ``active`` holds, live ``waiting`` callers, ``available`` permits,
        ``keys`` (key -> seconds its oldest hold has lasted), in one round trip."""
        now, holds, waiters, active = await self._info()
        return {
            "active": holds,
            "waiting": waiters,
            "available": max(0, self._cap - holds),
            "keys": self._active_by_key(now, active),
            "max_concurrent": self._cap,
        }

    async def holds_of(self, key: str) -> int:
        """Permits held now by ``key``, lane-wide (a coroutine: asks Redis)."""
        key = check_key(key)
        return sum(1 for _, k in (await self._info())[3] if k == key)

    def _limits(self) -> dict[str, Any]:
        return {"max_concurrent": self._cap}
