"""The two kinds of Redis lane (either face): their arguments, limits and views.

One job: what differs between the per-key and the counting lane above the wire (the
wire format is the kind object's, :mod:`._kinds`): constructor arguments, ``_limits``,
and the views that ask Redis.
"""

from __future__ import annotations

import math
from typing import Any

from .._errors import LaneBackendError
from .._kinds import (
    DEFAULT_IDLE_TIMEOUT_S,
    DEFAULT_MAX_CONCURRENT,
    DEFAULT_MAX_SESSIONS,
    DEFAULT_TIMEOUT_S,
)
from .._obs import LaneMetrics
from .._ops import DEFAULT_WARN_AFTER_S, OnWait
from .._validate import argument_of, check_count, check_timeout
from ._args import text
from ._keys import plain_key
from ._kinds import CountingKind, SessionKind
from ._ops import RedisOps
from ._protocol import DEFAULT_LEASE_S, DEFAULT_PREFIX, H, OnLeaseLost, Steps

__all__ = ["CountingLaneBase", "SessionLaneBase"]


class SessionLaneBase(RedisOps[H]):
    """The per-key kind (either face): its arguments, limits and per-key views."""

    _kind_class = SessionKind
    _kind_label = "session"
    _internal_base = True

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
        warn_after_s: float | None = DEFAULT_WARN_AFTER_S,
        on_wait: OnWait | None = None,
        warn_hold_s: float | None = None,
    ) -> None:
        super().__init__(
            client, name, max_concurrent=1, timeout_s=timeout_s, lease_s=lease_s,
            prefix=prefix, on_lease_lost=on_lease_lost,
        )
        self._ops_setup(warn_after_s, on_wait, warn_hold_s)
        where = argument_of(f"{type(self).__name__}()")
        self._max_sessions = check_count(max_sessions, f"{where} 'max_sessions'")
        idle = check_timeout(idle_timeout_s, f"{where} 'idle_timeout_s'")
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
    def session_count(self) -> int:
        """Keys with a hold of THIS lane object now (Redis keeps no idle entries)."""
        return len(self._local_active())

    def cleanup_idle(self) -> int:
        """Nothing idle is kept (keys expire in Redis by themselves): returns 0."""
        return 0

    def _key_info(self, key: str) -> Steps[tuple[bool, int]]:
        """(``key`` has a holder, live callers in line for it), from Redis."""
        key = plain_key(key)
        reply = yield from self._script("read", key, self._info_call(key))
        return bool(int(reply[0])), int(reply[1])

    def _limits(self) -> dict[str, Any]:
        return {"max_sessions": self._max_sessions}

    def _object_counts(self) -> dict[str, Any]:
        return {"sessions": self.session_count}


class CountingLaneBase(RedisOps[H]):
    """The counting kind (either face): its arguments, limits and lane-wide views."""

    _kind_class = CountingKind
    _kind_label = "counting"
    _internal_base = True

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
        warn_after_s: float | None = DEFAULT_WARN_AFTER_S,
        on_wait: OnWait | None = None,
        warn_hold_s: float | None = None,
    ) -> None:
        super().__init__(
            client, name, max_concurrent=max_concurrent, timeout_s=timeout_s,
            lease_s=lease_s, prefix=prefix, on_lease_lost=on_lease_lost,
        )
        self._ops_setup(warn_after_s, on_wait, warn_hold_s)

    @property
    def max_concurrent(self) -> int:
        """The lane's number of permits."""
        return self._cap

    def _info(self, run: Any = None
              ) -> Steps[tuple[int, int, int, int, int, list[tuple[int, str]]]]:
        """(now_ms, holds, live waiters, join time in ms of the longest live waiter or 0,
        the cap in force for this lane object, [(since_ms, key), ...]), lane-wide, from
        Redis (server time). The cap in force is the smaller of this object's
        ``max_concurrent`` and the smallest cap another client used within its last lease
        (key ``Bm``; see :mod:`lanequeue.redis`): the permits this object can take.
        ``run``: the script call to use instead of the face's ``_run`` (see
        :meth:`_lane_metrics`)."""
        reply = yield from self._ask("read", None, run or self._run, "read", None,
                                     self._info_call(None))
        now, holds, waiters = int(reply[0]), int(reply[1]), int(reply[2])
        joined, seen = int(reply[3]), int(reply[4])
        cap = min(self._cap, seen) if seen > 0 else self._cap
        active: list[tuple[int, str]] = []
        for v in reply[5:]:
            _fence, since, key = text(v).split(":", 2)
            active.append((int(since), key))
        return now, holds, waiters, joined, cap, active

    def _lane_wide(self, run: Any = None) -> Steps[dict[str, Any]]:
        """Lane-wide ``active`` holds, live ``waiting`` callers, ``available`` permits
        (free under the cap in force: what this object can take now), ``keys`` (key ->
        seconds its oldest hold has lasted, server time), ``oldest_wait_s`` (seconds the
        longest live waiter has been in line, from the server time it joined; 0.0 when
        nobody waits) and ``max_concurrent`` (the cap in force, see :meth:`_info`): one
        round trip."""
        now, holds, waiters, joined, cap, active = yield from self._info(run)
        keys: dict[str, float] = {}
        for since, key in active:
            age = max(0.0, (now - since) / 1000.0)
            if age > keys.get(key, -1.0):
                keys[key] = age
        return {
            "active": holds,
            "waiting": waiters,
            "available": max(0, cap - holds),
            "keys": keys,
            "oldest_wait_s": max(0.0, (now - joined) / 1000.0) if joined else 0.0,
            "max_concurrent": cap,
        }

    def _holds_of(self, key: str) -> Steps[int]:
        """Permits held now by ``key``, lane-wide, from Redis."""
        key = plain_key(key)
        info = yield from self._info()
        return sum(1 for _, k in info[5] if k == key)

    def _lane_metrics(self) -> LaneMetrics | None:
        """The ``scope="lane"`` entry of :meth:`metrics_snapshot`: lane-wide holders,
        live waiters and oldest wait (:meth:`_lane_wide`, one blocking round trip through
        the face's :meth:`_read_blocking`); None, with a log line, if Redis failed or the
        face cannot read without its event loop."""
        try:
            return self._lane_entry(self._read_blocking(self._lane_wide))
        except LaneBackendError as exc:
            self._lane_failed(exc)
            return None

    def _read_blocking(self, proc: Any) -> Any:
        """Run the read procedure ``proc(run)`` to its end with blocking I/O from any
        thread (the face's)."""
        raise LaneBackendError(f"lane {self.name!r}: no blocking read on this face")

    def _limits(self) -> dict[str, Any]:
        return {"max_concurrent": self._cap}

    def _object_counts(self) -> dict[str, Any]:
        return {"available": max(0, self._cap - self._n_live)}
