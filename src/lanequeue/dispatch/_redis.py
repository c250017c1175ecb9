"""The dedupe window shared by dispatchers of several processes, on Redis.

Each ``dedupe_id`` claims the key ``{P:d:<scope>}`` (``P`` the prefix, by default the
Redis lanes' ``"lanequeue"``; the scope is the id within its key,
``<len(key)>:<key>:<dedupe_id>``, see :func:`lanequeue.dispatch._machine.dedupe_scope`,
so the same id of two conversations is two claims; one hash tag per id, so ids spread
over a cluster; "id" below means this scoped id) with
``SET key value NX PX ttl``: the first dispatcher to claim it owns it for
``dedupe_ttl_s``; every other dispatcher that receives the same id within the window
answers with a ticket that has already ended as ``deduped``. Each claim carries a value
of its own, ``<owner>:<n>`` (``n`` a number that grows with every claim this dispatcher
makes), and a turn that ends before it ran gives back exactly
its own claim (a compare-and-delete script: only that value is deleted), so a genuine
retry runs. A claim finding a claim of the same dispatcher answers "ours" and replaces it
only when this dispatcher knows that claim was returned (its ticket ended before it ran,
or the claim failed: :meth:`RedisDedupeWindow.returning`; the claim sends their numbers),
since its give-back may still be on its way; any other claim of ours found there is a
turn that may have run, also one this dispatcher no longer remembers locally (pushed
out of its table by ``dedupe_max``), so the id is a duplicate, as on another dispatcher.
So a give-back and a retry's claim of the same id may reach Redis in either order: the
give-back never removes the retry's claim (it deletes only the value of the ticket
that ended, which no live ticket relies on), and an id runs once while the window holds
it.

Both calls are scripts (a claim is one round trip: ``SET NX PX``, else ``GET``, atomic)
run like the Redis lanes' own: at most 8 at once per window, each on a connection of its
own made like the client's, without retries, waiting at most the client's
``socket_timeout`` (5 s when it has none, see :func:`lanequeue.redis._args.call_wait`) for
its reply; that bound is the whole wait, a free slot's included. A failure is a
:class:`~lanequeue.LaneBackendError`: ``submit`` raises it on threads, the ticket ends
``failed`` with it on asyncio (see the dispatchers).

A claim that failed may still land (its command was sent, and a frozen server runs it
once it thaws): so after a failed claim the dispatcher gives that claim's value back in the
background, on a few threads of the window, at once, after ``call_wait_s`` and after twice
that (each attempt bounded like any call, a failed last attempt logged). Since each value
is one claim's, these give-backs never remove another claim, this dispatcher's or
another's.
"""

from __future__ import annotations

import functools
import itertools
import logging
import os
import threading
import time
import uuid
from typing import Any

from .._errors import LaneBackendError, shown, told
from .._validate import check_key
from ..redis._status import _take_len
from ._workers import Service

__all__ = ["RedisDedupeWindow"]

log = logging.getLogger("lanequeue")


def shown_scope(scope: str) -> str:
    """A claim's scope (``dedupe_scope(key, id)``: the key as ``<len>:<key>``, then
    ``:<id>``, as the lanes' Redis keys spell a name) for messages: the id and its key;
    any other string as it is."""
    head = _take_len(scope, 0)
    if head is None or scope[head[1]:head[1] + 1] != ":":
        return shown(scope)
    return f"{shown(scope[head[1] + 1:])} of key {shown(head[0])}"

# KEYS[1]: the id's key; ARGV[1]: the owner's prefix ("<owner>:"); ARGV[2]: the window in
# ms; ARGV[3]: the claim's number n; ARGV[4]: the numbers of the owner's returned claims of
# the id, each followed by a space. Claims the id with the value "<owner>:<n>" if nobody
# holds it, or if a returned claim of the owner does (replaced). Returns 1 if the owner
# holds it now with this claim, else 0 (another owner's claim, or an earlier claim of the
# owner whose turn may have run).
_CLAIM = """
local value = ARGV[1] .. ARGV[3]
if redis.call('SET', KEYS[1], value, 'NX', 'PX', ARGV[2]) then
  return 1
end
local held = redis.call('GET', KEYS[1])
if held == value then
  return 1
end
if held and string.sub(held, 1, #ARGV[1]) == ARGV[1] then
  local n = string.sub(held, #ARGV[1] + 1)
  if string.find(' ' .. ARGV[4], ' ' .. n .. ' ', 1, true) then
    redis.call('SET', KEYS[1], value, 'PX', ARGV[2])
    return 1
  end
end
return 0
"""

# KEYS[1]: the id's key; ARGV[1]: the claim's value ("<owner>:<n>"). Deletes the key only
# if that very claim still holds it. Returns 1 if deleted, else 0.
_GIVE_BACK = """
if redis.call('GET', KEYS[1]) == ARGV[1] then
  return redis.call('DEL', KEYS[1])
end
return 0
"""


#: Threads (per window) making the give-backs after failed claims.
_LATER_THREADS = 4


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
        from ..redis._args import call_wait
        from ..redis._link import factory
        from ..redis._wake import MAX_CALLS, Slots
        from ..redis._wire import wrap

        self.client = client
        self.prefix = check_key(prefix, f"{where} 'dedupe_prefix'")
        self.ttl_ms = max(1, int(ttl_s * 1000))
        self._owner = uuid.uuid4().hex
        self._pid = os.getpid()
        #: A call's longest wait for its reply, in seconds (see the module docstring).
        self.call_wait_s = call_wait(client)
        self._slots = Slots(MAX_CALLS, factory(client, self.call_wait_s))
        self._claim = client.register_script(wrap(_CLAIM))
        # Give-backs after failed claims: made on a service of the window's own (handed
        # over by one put, see give_back_later); (dedupe_id, claim number) -> attempts
        # left, while any is.
        self._backs = _back_service(self)
        self._later: dict[tuple[str, int], int] = {}
        self._numbers = itertools.count(1)  # claim numbers (see the module docstring)
        # Claims of ours returned (see returning): id -> {claim number: until when}.
        self._returned: dict[str, dict[int, float]] = {}
        self._returned_lock = threading.Lock()
        self._returned_high = 64  # ids kept at the last sweep of the table (at least 64)
        self._give_back = client.register_script(wrap(_GIVE_BACK))

    @property
    def owner(self) -> str:
        """This dispatcher's value in the keys it claims; a new one in a forked child, so
        the child never takes its parent's claims for its own (both would run the turn),
        with connections of its own (the parent's sockets are not the child's)."""
        if self._pid != os.getpid():
            from ..redis._link import factory
            from ..redis._wake import MAX_CALLS, Slots

            self._owner, self._pid = uuid.uuid4().hex, os.getpid()
            self._slots = Slots(MAX_CALLS, factory(self.client, self.call_wait_s))
            # The parent's give-backs are the parent's (its owner, its threads).
            self._backs, self._later = _back_service(self), {}
            self._returned, self._returned_lock = {}, threading.Lock()
        return self._owner

    def key(self, dedupe_id: str) -> str:
        return f"{{{self.prefix}:d:{dedupe_id}}}"

    def number(self) -> int:
        """A new claim number: each claim (and its give-back) carries one of its own."""
        return next(self._numbers)

    def _call(self, script: Any, dedupe_id: str, args: list[Any]) -> Any:
        from ..redis._wire import run_sync

        owner = self.owner + ":"  # first: in a forked child, new slots come with it
        # One bound for the whole call, the wait for a free slot included.
        deadline = time.monotonic() + self.call_wait_s
        slot = self._slots.take_by(deadline)
        if slot is None:
            raise TimeoutError(f"no call slot of the window was free within "
                               f"{self.call_wait_s:g} s")
        try:
            conn = slot.conn
            if conn is not None:
                _bound(conn, deadline - time.monotonic())
            # A give-back sends the claim's whole value; a claim, the owner's prefix.
            args = ([owner + str(args[0])] if script is self._give_back
                    else [owner, *args])
            return run_sync(self.client, script, [self.key(dedupe_id)], args, conn)
        finally:
            self._slots.give(slot)

    def returning(self, dedupe_id: str) -> tuple[dict[int, float], float]:
        """Where to record that a claim of ``dedupe_id`` is returned (its ticket ended
        before it ran, or the claim failed), and until when: the caller stores
        ``table[number] = until`` (a plain store, for a caller in a commit). A later claim
        of the id by this dispatcher may then replace that claim in Redis, its give-back
        being on its way; any other claim of ours found there is a duplicate (see the
        module docstring). A record lasts the window, plus the time a failed claim may
        take to land, or until its give-back has answered."""
        until = time.monotonic() + self.ttl_ms / 1000 + 3 * self.call_wait_s
        with self._returned_lock:
            table = self._returned.get(dedupe_id)
            if table is None:
                if len(self._returned) >= 2 * self._returned_high:
                    self._sweep_returned()
                table = self._returned[dedupe_id] = {}
            return table, until

    def _returned_numbers(self, dedupe_id: str) -> str:
        """The numbers of the id's returned claims still recorded, each followed by a
        space (the claim script's ARGV[4])."""
        now = time.monotonic()
        with self._returned_lock:
            table = self._returned.get(dedupe_id)
            if not table:
                return ""
            for n, until in list(table.items()):
                if until <= now:
                    del table[n]
            return "".join(f"{n} " for n in table)

    def forget_returned(self, dedupe_id: str, number: int) -> None:
        """Drop the record of a returned claim: its give-back answered (the claim is gone
        from Redis), or it never held the id (it answered 'not ours')."""
        with self._returned_lock:
            table = self._returned.get(dedupe_id)
            if table is not None:
                table.pop(number, None)
                if not table:
                    del self._returned[dedupe_id]

    def _sweep_returned(self) -> None:
        """Drop the expired records and the ids left with none (lock held): amortised
        O(1) per id recorded."""
        now = time.monotonic()
        kept: dict[str, dict[int, float]] = {}
        for dedupe_id, table in self._returned.items():
            live = {n: until for n, until in table.items() if until > now}
            if live:
                kept[dedupe_id] = live
        self._returned = kept
        self._returned_high = max(64, len(kept))

    def claim(self, dedupe_id: str, number: int) -> bool:
        """Claim ``dedupe_id`` with the value of claim ``number`` (from :meth:`number`).
        True if this dispatcher owns the id now with this claim (nobody held it, or a
        claim of ours that was returned did); False if another dispatcher owns it, or an
        earlier claim of ours whose turn may have run. One round trip, at most
        ``call_wait_s`` seconds; raises LaneBackendError if Redis fails or does not
        answer in time."""
        try:
            returned = self._returned_numbers(dedupe_id)
            return bool(self._call(self._claim, dedupe_id,
                                   [self.ttl_ms, number, returned]) == 1)
        except Exception as exc:
            raise LaneBackendError(
                f"dedupe window on Redis: claiming {shown_scope(dedupe_id)} failed "
                f"({told(exc)})") from exc

    def give_back(self, dedupe_id: str, number: int) -> None:
        """Release claim ``number`` of ``dedupe_id`` (a turn that never ran) if it still
        holds the id (a later claim of the id is left alone); failures are logged, and the
        claim then lasts until its TTL (recorded as returned meanwhile)."""
        table, until = self.returning(dedupe_id)
        table[number] = until
        try:
            self._call(self._give_back, dedupe_id, [number])
            self.forget_returned(dedupe_id, number)
        except Exception as exc:
            log.warning("dedupe window on Redis: could not give back %s (%s); it "
                        "lasts until its TTL", shown_scope(dedupe_id), told(exc))

    def give_back_later(self, dedupe_id: str, number: int) -> None:
        """After claim ``number`` of ``dedupe_id`` failed (it may land later): give it
        back on the window's threads at once, after ``call_wait_s`` and after twice that.
        Returns at once; a failed last attempt is logged.

        Called in a submit's clean-up, where an interrupt may land anywhere: the work is
        handed over by one put on the service's queue (one C call; ``threading``'s
        ``Condition`` and ``Thread.start`` run Python code under their locks, and an
        interrupt there wedged every later give-back)."""
        self.owner  # noqa: B018 (in a forked child: a new owner, a new service)
        table, until = self.returning(dedupe_id)
        table[number] = until  # (a plain store)
        self._later[(dedupe_id, number)] = _ATTEMPTS  # (a plain store)
        self._backs.post((self._give_back_attempt, (dedupe_id, number)))

    def _give_back_attempt(self, claim: tuple[str, int]) -> None:
        """One attempt of :meth:`give_back_later`'s, in a worker of the window's service;
        the next one is due ``call_wait_s`` after it."""
        left = self._later.get(claim, 1) - 1
        try:
            self._call(self._give_back, claim[0], [claim[1]])
            if left == 0:  # (a claim may land until the last attempt)
                self.forget_returned(*claim)
        except Exception as exc:
            (log.warning if left == 0 else log.debug)(
                "dedupe window on Redis: could not give back %s after a failed claim "
                "(%s)%s", shown_scope(claim[0]), told(exc),
                "; if the claim landed, it lasts until its TTL" if left == 0 else "")
        if left > 0:
            self._later[claim] = left
            backs = self._backs
            backs.call_later(self.call_wait_s,
                             functools.partial(backs.submit, self._give_back_attempt, claim))
        else:
            self._later.pop(claim, None)

    def pending_give_backs(self) -> int:
        """Give-backs after failed claims with attempts still to make."""
        return len(self._later)


#: Attempts of each give-back after a failed claim (at once, then ``call_wait_s`` apart).
_ATTEMPTS = 3


def _back_service(window: RedisDedupeWindow) -> Service:
    """The service that makes a window's give-backs after failed claims (its threads
    end once the window is garbage-collected)."""
    service = Service(max_threads=_LATER_THREADS, name="lanequeue-dedupe-back")
    service.stop_with(window)
    return service


def _bound(conn: Any, left: float) -> None:
    """Make ``conn``'s next call wait at most ``left`` seconds (connect and reply)."""
    left = max(0.001, left)
    conn.socket_timeout = left
    conn.socket_connect_timeout = left
    sock = getattr(conn, "_sock", None)
    if sock is not None:
        sock.settimeout(left)
