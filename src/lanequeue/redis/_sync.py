"""The thread face of the Redis lanes: :class:`RedisSessionLane` and :class:`RedisLane`.

A caller that must wait blocks in BLPOP on its own signal list (bounded, then re-checks:
see the package docstring); a daemon thread per lane object renews the leases of the
holds that object has granted. Any thread may acquire and any thread may release.
"""

from __future__ import annotations

import math
import threading
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

__all__ = ["RedisHold", "RedisLane", "RedisSessionLane"]


class RedisHold(RedisHoldBase):
    """A hold on a thread Redis lane; a context manager made by ``lane.acquire(key)``.

    Entering waits for the grant (up to the ``timeout_s`` given to ``acquire``) and raises
    :class:`~lanequeue.LaneTimeoutError` if it does not come; leaving releases. Single use.

    ``release()`` returns True when it ended the hold and False when the hold had already
    ended (or was never granted). It raises :class:`~lanequeue.NotOwnerError` when the
    hold is no longer this acquisition's (its lease ran out and the key moved on), and
    :class:`~lanequeue.LeaseLostError` (a NotOwnerError) when that loss was already
    known; the real owner's hold is never touched. Leaving the ``with`` block raises the
    same, unless the block itself raised (then the release error is logged and the
    block's exception propagates).
    """

    __slots__ = ()

    lane: _SyncFace

    def __enter__(self) -> RedisHold:
        if self._state != PENDING:
            raise RuntimeError("this hold was already entered; call lane.acquire(key) again")
        if not self.lane._take(self, self._timeout_s):
            raise LaneTimeoutError(self.lane.name, self.key, self._timeout_s)
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if exc_type is None:
            self.release()
            return
        try:
            self.release()
        except LaneError as err:
            log.warning("lane %r: release of key %r after an error in the block: %s",
                        self.lane.name, self.key, err)

    def release(self) -> bool:
        """End this hold (see the class docstring for the return value and errors)."""
        return self.lane._release(self)


def _renew_loop(ref: weakref.ref[_SyncFace]) -> None:
    """The renewer of one lane object. Holds only a weak reference between rounds, so a
    lane object that is dropped lets its renewer end."""
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
                ok = int(script(keys=keys, args=args)) == 1
            except RedisError as exc:
                lane._renew_failed(hold, exc, time.monotonic())
                continue
            except Exception:  # never let the renewer die
                log.exception("lane %r: renewer error", lane.name)
                continue
            lane._renewed(hold, ok, t0)
        del lane, due
        time.sleep(sleep)


class _SyncFace(RedisLaneBase[RedisHold]):
    """Acquire/release for threads over either kind of Redis lane."""

    def _run(self, op: str, key: str | None, call: Call) -> Any:
        script, keys, args = call
        try:
            return script(keys=keys, args=args)
        except RedisError as exc:
            raise self._backend(op, key, exc) from exc

    def _granted(self, hold: RedisHold, token: int, t0: float) -> bool:
        if self._register(hold, token, t0):
            threading.Thread(
                target=_renew_loop,
                args=(weakref.ref(self),),
                name=f"lanequeue-renew-{self.name}",
                daemon=True,
            ).start()
        return True

    def _take(self, hold: RedisHold, timeout: float | None) -> bool:
        """Wait up to ``timeout`` seconds (None: no limit, 0: no wait) for the grant of
        ``hold``; True once granted (the hold is registered and renewed)."""
        key = hold.key
        wait = timeout != 0
        t0 = time.monotonic()
        deadline = None if timeout is None else t0 + timeout
        in_line = False
        try:
            granted, value = grant_reply(self._run("acquire", key, self._acquire_call(hold, wait)))
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
                    self._client.blpop([signal], timeout=block)
                except RedisError as exc:
                    raise self._backend("wait", key, exc) from exc
                # Woken (or the bounded wait ran out): re-run acquire, which confirms a
                # hand-off, takes over a lapsed holder if we are first, or refreshes our
                # liveness in line.
                t0 = time.monotonic()
                call = self._acquire_call(hold, True)
                granted, value = grant_reply(self._run("acquire", key, call))
                if granted:
                    return self._granted(hold, value, t0)
                wake = value
            # Out of time. A hand-off may have reached us meanwhile: withdraw settles it.
            t0 = time.monotonic()
            granted, value = grant_reply(self._run("withdraw", key, self._withdraw_call(hold)))
            if granted:
                return self._granted(hold, value, t0)
            self._count_outcome(timed_out=True)
            return False
        except LaneBackendError:
            # Redis is unreachable: a clean-up call would fail the same way. Our line
            # entry dies with its liveness; a grant whose reply was lost, with its lease.
            raise
        except BaseException:
            # Interrupted (KeyboardInterrupt, an async exception) at any point, maybe
            # after the server queued or granted us: leave no ghost, pass on a grant.
            self._abandon(hold)
            raise
        finally:
            if in_line:
                self._wait_delta(-1)

    def _abandon(self, hold: RedisHold) -> None:
        """An interrupted wait: leave the line and pass on a grant that arrived
        meanwhile. Best effort: if Redis fails, the line entry dies with its liveness."""
        self._count_outcome(cancelled=True)
        try:
            granted, _ = grant_reply(self._run("withdraw", hold.key, self._withdraw_call(hold)))
            if granted:
                self._run("release", hold.key, self._release_call(hold))
        except Exception as exc:
            log.debug("lane %r: clean-up after an abandoned wait failed: %s", self.name, exc)

    def _release(self, hold: RedisHold) -> bool:
        if not self._detach(hold):
            return False
        return self._finish(hold)

    def _finish(self, hold: RedisHold) -> bool:
        """Release a hold already taken out of the registry (so no longer renewed: if
        this raises LaneBackendError, the lease lapses by itself within ``lease_s``)."""
        if hold._lost:
            return self._lost_release(hold)
        reply = self._run("release", hold.key, self._release_call(hold))
        return self._release_result(hold, int(reply) == 1)

    # -- the public surface --------------------------------------------------------------

    def _hold(self, key: str, timeout: float | None) -> RedisHold | None:
        """For ``LaneQueue.acquire_all``: the granted hold, or None on timeout."""
        hold = RedisHold(self, key, timeout)
        return hold if self._take(hold, timeout) else None

    def acquire(self, key: str, *, timeout_s: Any = LANE_DEFAULT) -> RedisHold:
        """A context manager that holds this lane for ``key`` (see :class:`RedisHold`).

        Args:
            key: non-empty ``str``.
            timeout_s: seconds to wait; default the lane's ``timeout_s``; ``None`` waits
                without limit; ``0`` does not wait.

        Raises:
            TypeError/ValueError: at the call, for a bad key or timeout.
            LaneTimeoutError: on entering, when no grant came in time.
            LaneBackendError: on entering, when Redis failed (nothing is held then).

        Example::

            with lane.acquire("gateway:slack:c1:u1") as hold:
                store.write(data, fence=hold.fencing_token)
        """
        if key.__class__ is not str or not key:
            bad_key(key)
        timeout = self.timeout_s if timeout_s is LANE_DEFAULT else check_timeout(timeout_s)
        return RedisHold(self, key, timeout)

    def try_acquire(self, key: str) -> bool:
        """Take ``key`` if it is free now, without waiting; True if taken (release it with
        :meth:`manual_release`). Raises LaneBackendError if Redis failed."""
        if key.__class__ is not str or not key:
            bad_key(key)
        return self._take(RedisHold(self, key, 0.0), 0.0)

    def acquire_timeout(self, key: str, timeout_s: float | None) -> bool:
        """Wait up to ``timeout_s`` seconds (None: no limit, 0: no wait); True if taken
        (release it with :meth:`manual_release`), False on timeout."""
        if key.__class__ is not str or not key:
            bad_key(key)
        timeout = check_timeout(timeout_s)
        return self._take(RedisHold(self, key, timeout), timeout)

    def manual_release(self, key: str) -> bool:
        """Release THIS lane object's oldest hold of ``key`` (taken with try_acquire,
        acquire_timeout or _raw_acquire). Any thread may call it.

        Returns True when the hold ended. Returns False and logs a warning, changing
        nothing in Redis, when this object holds nothing for ``key`` (another client's
        hold is never released: its owner id is not ours), or when the hold's lease had
        been lost (the key may be someone else's now). Raises LaneBackendError if Redis
        failed (the hold then lapses within ``lease_s``).
        """
        if key.__class__ is not str or not key:
            bad_key(key)
        hold = self._detach_oldest(key)
        if hold is None:
            return False
        try:
            return self._finish(hold)
        except NotOwnerError as err:
            log.warning("lane %r: manual_release(%r): %s", self.name, key, err)
            return False

    def _raw_acquire(self, key: str) -> bool:
        """The source design's internal acquire: wait the lane's ``timeout_s``."""
        return self.acquire_timeout(key, self.timeout_s)

    def _raw_release(self, key: str) -> None:
        """The source design's internal release (see :meth:`manual_release`)."""
        self.manual_release(key)


class RedisSessionLane(_SyncFace):
    """A per-key lane on Redis for threads: one holder per key across every process and
    host sharing the Redis, in arrival order; keys in parallel.

    Twin of :class:`lanequeue.SessionLane`. Each key has its own hash tag, so the keys of
    one lane spread over a Redis Cluster. A key's state exists in Redis only while it is
    held or waited for; ``max_sessions`` and ``idle_timeout_s`` are accepted for drop-in
    compatibility and reported, but there is nothing idle to evict.

    Args:
        client: a ``redis.Redis`` (or ``redis.cluster.RedisCluster``) client.
        name: the lane's name (no ``:``, ``{``, ``}``); default ``"session"``.
        max_sessions, idle_timeout_s: as on ``SessionLane`` (see above).
        timeout_s: default wait of ``acquire`` in seconds; None waits without limit.
        lease_s: lease of every grant, renewed every ``lease_s/3`` while held (>= 0.1).
        prefix: prefix of every Redis key of the lane (no ``{`` or ``}``).
        on_lease_lost: called as ``on_lease_lost(hold)`` (from the renewer thread, or the
            releasing thread) once when a hold's lease is found lost.

    Views: ``is_held(key)`` and ``waiting_for(key)`` ask Redis; ``active_count``,
    ``waiting``, ``get_active()``, ``session_count`` and ``stats`` describe THIS lane
    object's holds and waiters (a lane-wide count would need a scan of the keyspace).

    Example::

        sessions = RedisSessionLane(redis.Redis(), lease_s=30)
        with sessions.acquire("gateway:slack:c1:u1:t1") as hold:
            ...   # every replica's next message of this thread waits here
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
        """Accepted for compatibility with SessionLane (nothing idle is kept in Redis)."""
        return self._max_sessions

    @property
    def idle_timeout_s(self) -> float:
        """Accepted for compatibility with SessionLane (nothing idle is kept in Redis)."""
        return self._idle_timeout_s

    @property
    def active_count(self) -> int:
        """Keys held now through THIS lane object (not lost)."""
        return self._n_live

    @property
    def waiting(self) -> int:
        """Callers of THIS lane object waiting now."""
        return self._waiting

    @property
    def session_count(self) -> int:
        """Keys with a hold of THIS lane object now (Redis keeps no idle entries)."""
        return len(self._local_active())

    def get_active(self) -> dict[str, float]:
        """Each key held through THIS lane object -> seconds held so far."""
        return self._local_active()

    def cleanup_idle(self) -> int:
        """Nothing idle is kept (keys expire in Redis by themselves): returns 0."""
        return 0

    def _key_info(self, key: str) -> tuple[bool, int]:
        key = check_key(key)
        reply = self._run("read", key, self._info_call(key))
        return bool(int(reply[0])), int(reply[1])

    def is_held(self, key: str) -> bool:
        """True while ``key`` has a holder in any process (asks Redis)."""
        return self._key_info(key)[0]

    def waiting_for(self, key: str) -> int:
        """Callers in line for ``key`` now, in every process (asks Redis)."""
        return self._key_info(key)[1]

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

    def _limits(self) -> dict[str, Any]:
        return {"max_sessions": self._max_sessions}


class RedisLane(_SyncFace):
    """A counting lane on Redis for threads: at most ``max_concurrent`` holds over all
    keys, across every process and host sharing the Redis, served first come first served.

    Twin of :class:`lanequeue.Lane`. The whole lane has one hash tag (one slot).
    Every client of the lane must use the same ``max_concurrent``.

    Args:
        client: a ``redis.Redis`` (or ``redis.cluster.RedisCluster``) client.
        name: the lane's name (no ``:``, ``{``, ``}``).
        max_concurrent: permits, >= 1.
        timeout_s, lease_s, prefix, on_lease_lost: as on :class:`RedisSessionLane`.

    Views: ``active_count``, ``available``, ``waiting``, ``get_active()`` and
    ``holds_of(key)`` ask Redis (lane-wide, every process); ``stats`` counts THIS lane
    object's operations.

    Example::

        llm = RedisLane(redis.Redis(), "global", max_concurrent=8)
        with llm.acquire(session_key):
            reply = call_model(...)
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

    def _info(self) -> tuple[int, int, int, list[tuple[int, str]]]:
        return self._parse_counting_info(self._run("read", None, self._info_call(None)))

    @property
    def active_count(self) -> int:
        """Permits held now, lane-wide (asks Redis; expired leases do not count)."""
        return self._info()[1]

    @property
    def available(self) -> int:
        """Permits free now, lane-wide (asks Redis)."""
        return max(0, self._cap - self._info()[1])

    @property
    def waiting(self) -> int:
        """Live callers in line now, lane-wide (asks Redis)."""
        return self._info()[2]

    def get_active(self) -> dict[str, float]:
        """Each key held now, lane-wide -> seconds its oldest hold has lasted (server
        time; asks Redis)."""
        now, _, _, active = self._info()
        return self._active_by_key(now, active)

    def holds_of(self, key: str) -> int:
        """Permits held now by ``key``, lane-wide (asks Redis)."""
        key = check_key(key)
        return sum(1 for _, k in self._info()[3] if k == key)

    def status(self) -> dict[str, Any]:
        """A JSON-ready picture: lane-wide holders and waiters (one Redis round trip),
        this object's counters."""
        now, holds, waiters, active = self._info()
        return {
            "kind": type(self).__name__,
            "name": self.name,
            "prefix": self.prefix,
            "timeout_s": self.timeout_s,
            "lease_s": self.lease_s,
            "active": holds,
            "waiting": waiters,
            "available": max(0, self._cap - holds),
            "keys": self._active_by_key(now, active),
            "stats": self.stats.to_dict(),
            "max_concurrent": self._cap,
        }

    def _limits(self) -> dict[str, Any]:
        return {"max_concurrent": self._cap}
