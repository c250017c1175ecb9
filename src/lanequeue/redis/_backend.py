"""One Redis connection, many lanes made by name: :class:`RedisBackend`."""

from __future__ import annotations

import math
from typing import Any

import redis.asyncio

from .._kinds import (
    DEFAULT_IDLE_TIMEOUT_S,
    DEFAULT_MAX_CONCURRENT,
    DEFAULT_MAX_SESSIONS,
    DEFAULT_TIMEOUT_S,
)
from .._ops import DEFAULT_WARN_AFTER_S, OnWait
from .._validate import made_by
from ._args import check_callback, check_lease, check_prefix
from ._async import AsyncRedisLane, AsyncRedisSessionLane
from ._protocol import DEFAULT_LEASE_S, DEFAULT_PREFIX, OnLeaseLost
from ._sync import RedisLane, RedisSessionLane

__all__ = ["RedisBackend"]

_ASYNC_CLIENTS: tuple[type[Any], ...] = (redis.asyncio.Redis, redis.asyncio.RedisCluster)
_CLIENTS = RedisLane._client_types + AsyncRedisLane._client_types

CountingLane = RedisLane | AsyncRedisLane
SessionLane = RedisSessionLane | AsyncRedisSessionLane


class RedisBackend:
    """A Redis client and the settings its lanes share; makes lanes by name, like a
    queue's ``add_lane`` / ``add_session_lane``.

    Args:
        client: a ``redis.Redis`` / ``redis.cluster.RedisCluster`` (its lanes are thread
            lanes: :class:`RedisLane`, :class:`RedisSessionLane`) or a
            ``redis.asyncio.Redis`` / ``redis.asyncio.RedisCluster`` (asyncio lanes:
            :class:`AsyncRedisLane`, :class:`AsyncRedisSessionLane`).
        prefix: prefix of every Redis key of its lanes (no ``{`` or ``}``).
        lease_s: lease of every grant in seconds (>= 0.1), renewed every ``lease_s/3``.
        on_lease_lost: called as ``on_lease_lost(hold)`` when a hold's lease is found lost.

    Raises:
        TypeError/ValueError: for a bad argument, naming it (a client that is not
            redis-py's is a TypeError naming ``client``).

    Example::

        backend = RedisBackend(redis.Redis(), prefix="gw", lease_s=30)
        queue = LaneQueue()
        queue.add_session_lane("session", backend=backend)
        queue.add_lane("global", max_concurrent=8, backend=backend)
    """

    __slots__ = ("client", "prefix", "lease_s", "on_lease_lost", "face")

    def __init__(
        self,
        client: Any,
        *,
        prefix: str = DEFAULT_PREFIX,
        lease_s: float = DEFAULT_LEASE_S,
        on_lease_lost: OnLeaseLost | None = None,
    ) -> None:
        where = f"{type(self).__name__}() argument"
        if not isinstance(client, _CLIENTS):
            raise TypeError(
                f"{where} 'client' must be a redis-py client ({RedisLane._client_hint}; or "
                f"{AsyncRedisLane._client_hint}), not "
                f"{type(client).__module__}.{type(client).__name__}"
            )
        self.client = client
        self.prefix = check_prefix(prefix, f"{where} 'prefix'")
        self.lease_s = check_lease(lease_s, f"{where} 'lease_s'")
        self.on_lease_lost = check_callback(on_lease_lost, f"{where} 'on_lease_lost'")
        #: ``"asyncio"`` for an asyncio client, else ``"threads"``: the face of its lanes.
        self.face = "asyncio" if isinstance(client, _ASYNC_CLIENTS) else "threads"

    def lane(
        self,
        name: str,
        *,
        max_concurrent: int = DEFAULT_MAX_CONCURRENT,
        timeout_s: float | None = DEFAULT_TIMEOUT_S,
        warn_after_s: float | None = DEFAULT_WARN_AFTER_S,
        on_wait: OnWait | None = None,
        warn_hold_s: float | None = None,
    ) -> CountingLane:
        """A counting lane on this backend (``RedisLane`` or ``AsyncRedisLane``, by the
        client), with the backend's prefix, lease and callback. An argument error names
        this call (``RedisBackend.lane() argument 'max_concurrent' ...``; through a
        queue's ``add_lane(backend=...)``, that call)."""
        cls = AsyncRedisLane if self.face == "asyncio" else RedisLane
        with made_by(f"{type(self).__name__}.lane()"):
            return cls(
                self.client, name, max_concurrent=max_concurrent, timeout_s=timeout_s,
                lease_s=self.lease_s, prefix=self.prefix, on_lease_lost=self.on_lease_lost,
                warn_after_s=warn_after_s, on_wait=on_wait, warn_hold_s=warn_hold_s,
            )

    def session_lane(
        self,
        name: str = "session",
        *,
        max_sessions: int = DEFAULT_MAX_SESSIONS,
        idle_timeout_s: float | None = DEFAULT_IDLE_TIMEOUT_S,
        timeout_s: float | None = DEFAULT_TIMEOUT_S,
        warn_after_s: float | None = DEFAULT_WARN_AFTER_S,
        on_wait: OnWait | None = None,
        warn_hold_s: float | None = None,
    ) -> SessionLane:
        """A per-key lane on this backend (``RedisSessionLane`` or
        ``AsyncRedisSessionLane``, by the client), with the backend's prefix, lease and
        callback. An argument error names this call (or the queue's
        ``add_session_lane``), as :meth:`lane` does."""
        cls = AsyncRedisSessionLane if self.face == "asyncio" else RedisSessionLane
        with made_by(f"{type(self).__name__}.session_lane()"):
            return cls(
                self.client, name, max_sessions=max_sessions,
                idle_timeout_s=math.inf if idle_timeout_s is None else idle_timeout_s,
                timeout_s=timeout_s,
                lease_s=self.lease_s, prefix=self.prefix, on_lease_lost=self.on_lease_lost,
                warn_after_s=warn_after_s, on_wait=on_wait, warn_hold_s=warn_hold_s,
            )

    def __repr__(self) -> str:
        return (
            f"<RedisBackend {self.face} prefix={self.prefix!r} lease_s={self.lease_s} "
            f"client={self.client!r}>"
        )

