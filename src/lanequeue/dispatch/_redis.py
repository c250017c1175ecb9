"""The dedupe window shared by dispatchers of several processes, on Redis.

Each ``dedupe_id`` claims the key ``{P:d:<dedupe_id>}`` (``P`` the prefix, by default the
Redis lanes' ``"lanequeue"``; one hash tag per id, so ids spread over a cluster) with
``SET key owner NX PX ttl``: the first dispatcher to claim it owns it for
``dedupe_ttl_s``; every other dispatcher that receives the same id within the window
answers with a ticket that has already ended as ``deduped``. A turn that ends before it
ran gives its claim back (a compare-and-delete script: only the owner's value is
deleted), so a genuine retry runs. Only the public redis-py client is used; its errors
become :class:`~lanequeue.LaneBackendError` at ``submit``.
"""

from __future__ import annotations

import logging
import os
import uuid
from typing import Any

from .._errors import LaneBackendError, shown
from .._validate import check_key

__all__ = ["RedisDedupeWindow"]

log = logging.getLogger("lanequeue")

# KEYS[1]: the id's key; ARGV[1]: the owner's value. Deletes the key only if the owner
# still holds it. Returns 1 if deleted, else 0.
_GIVE_BACK = """
if redis.call('GET', KEYS[1]) == ARGV[1] then
  return redis.call('DEL', KEYS[1])
end
return 0
"""


class RedisDedupeWindow:
    """One dispatcher's view of the shared window (thread-safe: redis-py clients are)."""

    def __init__(self, client: Any, prefix: str, ttl_s: float,
                 where: str = "argument") -> None:
        # ``where`` starts each error: the dispatcher's "Dispatcher() argument".
        if not callable(getattr(client, "set", None)) or not callable(
                getattr(client, "eval", None)):
            raise TypeError(f"{where} 'dedupe_redis' must be a redis.Redis client, not "
                            f"{client!r}")
        if getattr(client, "connection_pool", None) is not None and callable(
                getattr(client, "aclose", None)):
            raise TypeError(f"{where} 'dedupe_redis' must be a synchronous redis.Redis "
                            "client (submit is a plain call), not a redis.asyncio client")
        self.client = client
        self.prefix = check_key(prefix, f"{where} 'dedupe_prefix'")
        self.ttl_ms = max(1, int(ttl_s * 1000))
        self._owner = uuid.uuid4().hex
        self._pid = os.getpid()

    @property
    def owner(self) -> str:
        """This dispatcher's value in the keys it claims; a new one in a forked child, so
        the child never takes its parent's claims for its own (both would run the turn)."""
        if self._pid != os.getpid():
            self._owner, self._pid = uuid.uuid4().hex, os.getpid()
        return self._owner

    def key(self, dedupe_id: str) -> str:
        return f"{{{self.prefix}:d:{dedupe_id}}}"

    def claim(self, dedupe_id: str) -> bool:
        """True if this dispatcher owns the id now (claimed it, or had claimed it);
        False if another dispatcher owns it. Raises LaneBackendError if Redis fails."""
        key = self.key(dedupe_id)
        try:
            if self.client.set(key, self.owner, nx=True, px=self.ttl_ms):
                return True
            held = self.client.get(key)
        except Exception as exc:
            raise LaneBackendError(f"dedupe window on Redis: {exc!r}") from exc
        if held is None:  # expired between the two calls: try once more
            return self.claim(dedupe_id)
        if isinstance(held, bytes):
            held = held.decode()
        return bool(held == self.owner)

    def give_back(self, dedupe_id: str) -> None:
        """Release the claim (a turn that never ran); failures are logged, and the claim
        then lasts until its TTL."""
        try:
            self.client.eval(_GIVE_BACK, 1, self.key(dedupe_id), self.owner)
        except Exception:
            log.exception("dedupe window on Redis: could not give back %s", shown(dedupe_id))
