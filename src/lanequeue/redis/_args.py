"""Argument checks and small reply helpers of the Redis lanes (either kind, either face).

One job: what a Redis lane accepts at construction (name, prefix, lease), and how the
procedures read a script's reply and size a wait.
"""

from __future__ import annotations

import math
from typing import Any

from .._errors import LaneBackendError
from .._validate import as_seconds, shown_number
from ._keys import plain_key

__all__ = [
    "MAX_LEASE_S",
    "MAX_POLL_S",
    "MAX_SCRIPT_INT",
    "MIN_BLOCK_S",
    "MIN_LEASE_S",
    "REFRESHES_PER_S",
    "check_callback",
    "check_lease",
    "check_name",
    "check_prefix",
    "check_script_int",
    "flag_reply",
    "grant_reply",
    "next_block",
    "socket_timeout",
    "text",
]

# A waiter re-checks at least this often (and at least 3 times per lease), so a lost
# signal or a lapsed holder costs at most this much latency.
MAX_POLL_S = 1.0
MIN_LEASE_S = 0.1
# Longest lease accepted (7 days): longer ones overflow the renewer's timers and Redis's
# expiry arithmetic.
MAX_LEASE_S = 7 * 86400.0
# Polls per second the waiters of one process make on one client, at most (about): with
# more waiters, each polls less often (see RedisLaneBase._poll_plan).
REFRESHES_PER_S = 500.0
# Shortest wait for a wake-up.
MIN_BLOCK_S = 0.002
# Largest integer sent to a script: Redis scripts hold numbers as doubles (Lua 5.1),
# exact up to 2**53 (2**53 + 1 reads as 2**53). The other integers the lanes send are
# bounded well below it (a lease of MAX_LEASE_S is 6.0e8 ms; a fencing token is the
# server time in microseconds, 1.8e15 today).
MAX_SCRIPT_INT = 2**53


def check_name(name: object, arg: str = "name") -> str:
    """A Redis lane's name; ``arg`` names the argument in the errors (a constructor
    passes ``"RedisLane() argument 'name'"``)."""
    n = plain_key(name, arg)
    if any(c in n for c in ":{}"):
        raise ValueError(f"{arg} must not contain ':', '{{' or '}}' (a Redis lane name): "
                         f"{n!r}")
    return n


def check_prefix(prefix: object, arg: str = "prefix") -> str:
    """A Redis key prefix; ``arg`` names the argument in the errors."""
    p = plain_key(prefix, arg)
    if "{" in p or "}" in p:
        raise ValueError(f"{arg} must not contain '{{' or '}}' (hash tags): {p!r}")
    return p


def check_lease(lease_s: object, arg: str = "lease_s") -> float:
    """A lease in seconds, from MIN_LEASE_S to MAX_LEASE_S; ``arg`` names the argument
    in the errors."""
    v = as_seconds(lease_s, arg)
    if not math.isfinite(v) or not MIN_LEASE_S <= v <= MAX_LEASE_S:
        raise ValueError(
            f"{arg} must be a number of seconds from {MIN_LEASE_S} to {MAX_LEASE_S:.0f} "
            f"(7 days), got {shown_number(lease_s)}"
        )
    return v


def check_script_int(value: int, arg: str) -> int:
    """``value`` (a positive int, already checked) if a Redis script holds it exactly,
    else a ValueError naming ``arg`` (see :data:`MAX_SCRIPT_INT`)."""
    if value > MAX_SCRIPT_INT:
        raise ValueError(
            f"{arg} must be at most 2**53 ({MAX_SCRIPT_INT}, the largest integer Redis "
            f"scripts hold exactly), got {value}"
        )
    return value


def check_callback(fn: object, arg: str) -> Any:
    """``fn`` if it is callable or None (``on_lease_lost``); TypeError naming ``arg``."""
    if fn is not None and not callable(fn):
        raise TypeError(f"{arg} must be callable or None, not {type(fn).__name__}")
    return fn


def socket_timeout(client: Any) -> float | None:
    """The client's socket timeout, if it has one: a blocking wait must stay below it."""
    try:
        v = client.connection_pool.connection_kwargs.get("socket_timeout")
    except AttributeError:
        return None
    return float(v) if isinstance(v, (int, float)) and v > 0 else None


#: A script call's longest wait for its reply (connecting included), in seconds, when the
#: client has no ``socket_timeout`` (redis-py's own default is 5 s).
CALL_WAIT_S = 5.0


def call_wait(client: Any) -> float:
    """The longest wait of one script call of the lanes for its reply, in seconds: the
    client's ``socket_timeout``, or :data:`CALL_WAIT_S` when it has none (a frozen server
    must not hold a caller, or a cancelled task's clean-up, forever)."""
    return socket_timeout(client) or CALL_WAIT_S


def grant_reply(reply: Any) -> tuple[bool, int]:
    """Parse an acquire/withdraw reply: ``(True, fencing token)`` when granted (the reply
    is the token), else ``(False, wake)`` (the reply is ``[0, wake]``; acquire: ms until
    the lease blocking a head-of-line caller runs out, or -1)."""
    if isinstance(reply, int) and not isinstance(reply, bool) and reply > 0:
        return True, reply
    if isinstance(reply, list) and len(reply) == 2 and reply[0] == 0 \
            and isinstance(reply[1], int):
        return False, reply[1]
    raise LaneBackendError(f"Redis answered an acquire with {reply!r:.80} (a protocol "
                           f"error); nothing was granted")


def flag_reply(reply: Any) -> int:
    """Parse a release/renew reply: 0 or 1 (anything else is a protocol error)."""
    if reply == 0 or reply == 1:
        return int(reply)
    raise LaneBackendError(f"Redis answered a release or renewal with {reply!r:.80} (a "
                           f"protocol error)")


def next_block(poll_s: float, wake_ms: int, deadline: float | None, now: float) -> float:
    """How long a waiter blocks on its signal before re-checking: at most ``poll_s``, no
    later than the blocking lease runs out (head of the line), nor past the deadline
    (then 0: stop waiting)."""
    block = poll_s
    if wake_ms >= 0:
        block = min(block, wake_ms / 1000 + MIN_BLOCK_S)
    if deadline is not None:
        left = deadline - now
        if left <= 0:
            return 0.0
        block = min(block, left)
    return max(block, MIN_BLOCK_S)


def text(v: Any) -> str:
    return v.decode() if isinstance(v, bytes) else str(v)
