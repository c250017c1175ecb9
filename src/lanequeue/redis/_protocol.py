"""The core of the Redis lanes, shared by both kinds and both faces: this lane object's
registry of holds, the loss of a lease, counters, the procedures (acquire and wait,
release, withdraw, renew) and the renewal bookkeeping.

The other jobs live in their own modules: the key layout and key identity
(:mod:`._keys`), each kind's keys and script calls (:mod:`._kinds`, one object per kind),
the scripts (:mod:`._scripts`), the hold object (:mod:`._hold`), argument checks
(:mod:`._args`), the holder's deadline and the registry entries (:mod:`._lease`),
wake-ups (:mod:`._wake`), the renewer's connection (:mod:`._link`), and each kind's
arguments and views (:mod:`._views`).

Nothing here talks to Redis. Each procedure is a generator (sans-I/O): it yields the one
piece of I/O it needs next as a :data:`Step` ``(fn, args)`` (call a script, wait for a
wake-up), receives the reply, and decides what follows (interpreting the reply,
changing the hold's state, mapping errors, choosing the next step). A face runs it with
its ``drive``: the thread face calls ``fn(*args)``, the asyncio face awaits it, and each
sends the reply back or throws in what the I/O raised. So the faces (:mod:`._sync`,
:mod:`._async`) differ only in how they do I/O and how they run the renewer (a daemon
thread, a task). The registry is guarded by one short ``threading.RLock`` (never held
across I/O), which is also safe on an event loop. A finalizer may run at any allocation,
also inside it: a dropped hold's only records (:meth:`RedisLaneBase._on_drop`), and the
views that its warning's handler may call on that thread get in (the RLock) and leave
the purge of dropped holds to the next operation (:meth:`RedisLaneBase._outermost`).
"""

from __future__ import annotations

import itertools
import logging
import math
import os
import threading
import time
import warnings
import weakref
from abc import ABC, abstractmethod
from collections import deque
from collections.abc import Callable, Generator
from typing import Any, ClassVar, Generic, TypeVar

from redis.exceptions import NoPermissionError, RedisError, ResponseError

from .._core import LaneStats, at_fork_in_child
from .._errors import (
    LaneBackendError,
    LaneError,
    LaneTimeoutError,
    LeaseLostError,
    NotOwnerError,
    shown,
    told,
)
from .._kinds import DEFAULT_MAX_CONCURRENT, DEFAULT_TIMEOUT_S, LANE_DEFAULT
from .._ops import LaneOps
from .._validate import (
    argument_of,
    check_count,
    check_no_priority,
    check_timeout,
    own_signatures,
    public_name,
    shown_number,
)
from . import _scripts as lua
from ._args import (
    MAX_POLL_S,
    REFRESHES_PER_S,
    check_callback,
    check_lease,
    check_name,
    check_prefix,
    check_script_int,
    flag_reply,
    grant_reply,
    next_block,
    socket_timeout,
    text,
)
from ._hold import ENDED, HELD, PENDING, RELEASING, RedisHoldBase
from ._keys import LAYOUT, plain_key, version_key
from ._kinds import Call, Kind
from ._lease import Kept, Watched, watchdog
from ._presence import PONG_TIMEOUT_S, Epoch, Presence, presence_for
from ._wake import Woken, owner_id
from ._wire import StaleReply, wrap

#: Claim numbers of thread renewers (see RedisLaneBase._claim_renewer).
_claims = itertools.count(1)

__all__ = [
    "Call",
    "DEFAULT_LEASE_S",
    "DEFAULT_PREFIX",
    "H",
    "OnLeaseLost",
    "RedisHoldBase",
    "RedisLaneBase",
    "Step",
    "Steps",
    "T",
    "log",
    "renewal",
]

log = logging.getLogger("lanequeue.redis")

#: Default lease of a Redis hold, in seconds.
DEFAULT_LEASE_S = 30.0
#: Default prefix of every Redis key of a lane.
DEFAULT_PREFIX = "lanequeue"

OnLeaseLost = Callable[[Any], object]

#: A dropped hold the renewer is to release: (owner, token, key, a release of it was
#: sent, when its grant was asked for, counted live: not known lost).
Dropped = tuple[str, int, str, bool, float, bool]

#: Numbers of the renewer's batches of dropped holds (see RedisLaneBase._renew_round).
_batches = itertools.count(1)


#: Every lane object of this process, so a forked child can reset what it cannot share.
_LANES: weakref.WeakSet[RedisLaneBase[Any]] = weakref.WeakSet()


def _after_fork_in_child() -> None:
    """A forked child has only the thread that forked: the threads that held or waited
    through a lane object in the parent do not exist in it. Each lane object resets its
    process-local state (see ``RedisLaneBase._forked``)."""
    for lane in list(_LANES):
        lane._forked()


at_fork_in_child(_after_fork_in_child)




H = TypeVar("H", bound=RedisHoldBase)

T = TypeVar("T")
L = TypeVar("L", bound="RedisLaneBase[Any]")

#: What is plainly not a client (a value, not an object that could stand for one).
_NOT_CLIENTS = (str, bytes, bytearray, int, float, complex)


#: One piece of I/O a procedure asks its face for: ``fn(*args)``, called by the thread
#: face and awaited by the asyncio face (a script call, a wait for a wake-up).
Step = tuple[Callable[..., Any], tuple[Any, ...]]
#: A procedure: yields steps, is sent each step's reply (or thrown its error), returns T.
Steps = Generator[Step, Any, T]


#: The most background clean-ups (:meth:`RedisLaneBase._later`) a process runs at once.
LATER_MAX = 16


class RedisLaneBase(ABC, Generic[H]):
    """State, bookkeeping and procedures of one Redis lane object (either kind, either face).

    ``_kind_class`` (:class:`~._kinds.SessionKind` or :class:`~._kinds.CountingKind`,
    set by :class:`SessionLaneBase` and :class:`CountingLaneBase`) makes the kind object
    ``_k`` that knows the kind's keys and script calls, so nothing here switches on the
    kind. The arguments are the counting lane's (the per-key
    lane passes ``max_concurrent=1``). A face supplies the I/O: ``_hold_class`` (the hold
    objects it makes), ``_run`` (one script call, plain or a coroutine) and
    ``_start_renewer``; it runs the procedures (the methods returning :data:`Steps`).
    """

    #: The kind object's class (SessionKind or CountingKind): keys and script calls.
    _kind_class: ClassVar[type[Kind]]
    _async_face: ClassVar[bool] = False
    _hold_class: type[H]
    #: The redis-py client classes this face accepts (the face sets them).
    _client_types: ClassVar[tuple[type, ...]] = ()
    _client_hint: ClassVar[str] = ""
    #: The protocol version this lane speaks (its key layout and scripts).
    _layout: ClassVar[str] = LAYOUT
    #: Life of the lane's version marker; every lane object in use re-claims it at least
    #: every half of this, so it never runs out while a client of its version is active.
    _version_ttl_s: ClassVar[float] = 60.0

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
        where = argument_of(f"{type(self).__name__}()")
        self.name = check_name(name, f"{where} 'name'")
        self.timeout_s: float | None = check_timeout(timeout_s, f"{where} 'timeout_s'")
        self.lease_s = check_lease(lease_s, f"{where} 'lease_s'")
        self.prefix = check_prefix(prefix, f"{where} 'prefix'")
        self.on_lease_lost = check_callback(on_lease_lost, f"{where} 'on_lease_lost'")
        self._cap = check_script_int(check_count(max_concurrent, f"{where} 'max_concurrent'"),
                                     f"{where} 'max_concurrent'")
        self._client: Any = self._check_client(client)  # (also by __new__, see there)
        self._lease_ms = max(1, round(self.lease_s * 1000))
        poll = min(MAX_POLL_S, self.lease_s / 3)
        st = socket_timeout(client)
        if st is not None:
            poll = min(poll, st / 2)
        self._poll_s = poll
        # A waiter refreshes its liveness at every poll; three missed polls (plus 1 s for
        # scheduling and network jitter) and it counts as dead, is skipped by the grant,
        # and rejoins at the tail if it comes back.
        self._live_ms = round((3 * poll + 1.0) * 1000)
        self._renew_s = self.lease_s / 3
        # The holder's deadline is the lease less this guard (see RedisHoldBase._expires).
        self._guard_s = min(0.05 * self.lease_s, 0.25)
        # Longest wait of one renewal (its own connection's socket timeout): a renewal
        # sent at lease/3 has its answer, or has failed, by 7/12 of the lease.
        self._renew_timeout_s = max(0.02, self.lease_s / 4)
        self._fence_ttl_ms = self._lease_ms
        self._server_checked = False
        self._version_due = 0.0  # monotonic time the version marker must be re-claimed
        self._watch_at = math.inf  # when the watchdog's pending entry for us fires
        self._version_key = version_key(self.prefix, self._kind_class.letter, self.name)
        self._s_version = client.register_script(wrap(lua.VERSION_CLAIM))
        # This process's presence connection to the server (failover: see _presence.py);
        # None on Redis Cluster, where holds fall back to lease_s.
        self._presence = presence_for(client)
        self._k: Kind = self._kind_class(
            client, self.prefix, self.name, self._layout, self._lease_ms,
            self._fence_ttl_ms, self._cap,
        )
        # Guards the registry and counters; never held across I/O, so it is also safe on
        # an event loop. An RLock: a finalizer may run at any allocation under it, and
        # the handler of its warning (a dropped hold's) may call a view on this thread
        # (see _outermost).
        self._lock = threading.RLock()
        # This object's holds not yet released (lost ones included), per key, oldest
        # first: manual_release(key) ends the oldest.
        self._holds: dict[str, list[Kept | Watched]] = {}
        self._n_live = 0  # held and not known lost
        self._waiting = 0  # this object's callers waiting now
        # A renewer of this process runs: its claim number (thread face: see
        # _claim_renewer; asyncio face: 1), 0 when none; set by the renewer's start.
        self._renewing = 0
        self._renewer_pid = 0
        self._idle_since: float | None = None
        # Registry entries of caller-owned holds that were garbage-collected unreleased
        # (appended by the weak reference's callback; purged under the lock).
        self._dropped: deque[Watched] = deque()
        # Dropped holds to release (see Dropped), by owner id: the renewer sends them.
        # A dict, so that the purge queues one by a plain store (see _purge_dropped);
        # ``_queued_live``: how many of them are counted in ``_n_live`` (not lost).
        self._to_release: dict[str, Dropped] = {}
        self._queued_live = 0
        # The batches of them the renewer has taken and not reported yet, by number
        # (see _renew_round and _pending_ends).
        self._releasing: dict[int, dict[str, Dropped]] = {}
        # In a forked child: the parent's holds, per key (see _forked); never in _holds.
        self._inherited: dict[str, list[Kept | Watched]] = {}
        # Per key, the event of this object's latest same-key request still joining.
        self._joins: dict[str, Any] = {}
        # (key, token) of the holds a release has taken out of the registry (or is about
        # to) whose end has not been through _hold_end yet: recorded by plain
        # stores before the unlink, removed once the release returns or raises. The
        # operations layer keeps the marks of these holds (_pending_ends): a hold a
        # check logged as held is then never logged again as it ends, however long
        # the releasing thread takes to get there.
        self._ending: dict[tuple[str, int], None] = {}
        _LANES.add(self)
        self.acquired = 0
        self.released = 0
        self.timeouts = 0
        self.rejected = 0
        self.cancelled = 0
        self.unmatched = 0
        self.leases_lost = 0

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        # A public lane class gets its own copy of the methods it inherits from the
        # internal bases, so Python's own argument errors name it (``RedisLane.__init__()
        # missing 1 required positional argument: 'name'``), as the in-process lanes do.
        if not cls.__name__.startswith("_") and not cls.__dict__.get("_internal_base"):
            own_signatures(cls, LaneOps,
                           *(b for b in cls.__mro__ if b.__dict__.get("_internal_base")))

    _internal_base: ClassVar[bool] = True

    def __new__(cls: type[L], *args: Any, **kwargs: Any) -> L:
        # Runs before Python binds the arguments to __init__, so a lane made without its
        # client (``RedisLane("global", max_concurrent=2)``) is told about the client, not
        # that ``name`` is missing; and before any other argument is checked. Only for
        # the library's own constructors (client first): a subclass with a constructor
        # of its own is checked when it calls this class's ``__init__``.
        if getattr(cls.__init__, "__module__", "").startswith("lanequeue."):
            if args:
                cls._check_client(args[0])
            elif "client" in kwargs:
                cls._check_client(kwargs["client"])
        return super().__new__(cls)

    @classmethod
    def _check_client(cls, client: Any) -> Any:
        """``client`` if it is of this face's kind (C26: a sync client given to an asyncio
        lane, or the reverse, is refused here, before any script runs); a TypeError naming
        the class and ``client`` otherwise. A plain value (None, a str, a number) is shown
        with the call's shape: it is most often the client left out, and the lane's name
        in its place."""
        if isinstance(client, cls._client_types):
            return client
        where = argument_of(f"{cls.__name__}()")
        if client is None:
            given = "None"
        elif isinstance(client, _NOT_CLIENTS):
            given = f"{shown_number(client)} ({type(client).__name__})"
        else:
            raise TypeError(
                f"{where} 'client' must be {cls._client_hint}, not "
                f"{type(client).__module__}.{type(client).__name__}"
            )
        raise TypeError(f"{where} 'client' must be {cls._client_hint}, not {given}: "
                        f"{cls.__name__}(client, name, ...)")

    # -- key layout and script calls (the kind object's) ------------------------------

    def _base(self, key: str) -> str:
        return self._k.base(key)

    def _acquire_call(self, hold: RedisHoldBase, wait: bool, live_ms: int = 0) -> Call:
        # The presence epoch of this request (sent with it, recorded by a grant): if it
        # dies, a grant made under it reads lost at once (see _presence.py).
        pres = self._pres()
        epoch = pres.current() if pres is not None else None
        hold._presence = epoch
        return self._k.acquire(hold.owner, hold.key, wait, live_ms or self._live_ms,
                               epoch.channel if epoch is not None else "")

    def _release_call(self, hold: RedisHoldBase) -> Call:
        return self._k.release(hold.owner, hold.token, hold.key)

    def _renew_call(self, hold: RedisHoldBase) -> Call:
        return self._k.renew(hold.owner, hold.key)

    def _withdraw_call(self, hold: RedisHoldBase, owner: str | None = None) -> Call:
        """The withdraw of ``hold``'s wait asked under ``owner`` (None: its owner id)."""
        return self._k.withdraw(hold.owner if owner is None else owner, hold.key)

    def _info_call(self, key: str | None) -> Call:
        return self._k.info(key)

    def _pres(self) -> Presence | None:
        """This process's presence connection to the server (a forked child's own, made
        on its first use: the parent's connection and thread are not the child's, and a
        grant recorded under the parent's channel would outlive the child)."""
        p = self._presence
        if p is not None and p.pid != os.getpid():
            p = self._presence = presence_for(self._client)
        return p

    # -- the face's I/O, and the procedures' one way to ask for it -----------------------

    @abstractmethod
    def _run(self, op: str, key: str | None, call: Call) -> Any:
        """The face's script call: ``script(keys=KEYS, args=ARGV)``, called or awaited;
        ``op`` (acquire, withdraw, release, read, renew) and ``key`` name it, for
        subclasses that trace calls. Errors pass through: :meth:`_ask` maps them, the
        renewer handles its own. An acquire of a waiter (its poll) answers
        :class:`~._wake.Woken` instead, sending nothing, when a wake-up carrying a grant
        reached the waiter while the call waited for its turn among the process's calls
        in flight."""

    @abstractmethod
    def _expect(self, owner: str) -> None:
        """Register a waiter with the process's wake-up listener (before its first
        script: see :mod:`._wake`)."""

    @abstractmethod
    def _forgets(self) -> tuple[Callable[[str, None], object], ...]:
        """What undoes :meth:`_expect` once the waiter is done (granted, timed out or
        gone): C-level calls, each ``fn(owner, None)`` (the pops of the listener's
        records of a waiter), taken before the waiter is registered, so that its
        clean-up makes each store in a call of its own, with no Python call before it
        where an interrupt could land (see :meth:`_take`)."""

    @abstractmethod
    def _wait_wake(self, owner: str, block: float) -> Any:
        """Step: wait up to ``block`` seconds for ``owner``'s wake-up (no connection is
        held meanwhile)."""

    @abstractmethod
    def _memory_info(self) -> Any:
        """Step: the server's ``INFO memory`` (a dict of its fields; a cluster client's
        is per node), as one of the process's bounded calls in flight per client, on that
        bound's connections (see :mod:`._wake`: the first-use check of many callers at
        once opens no connection beyond the bound), within the bound on one call's wait
        (:func:`._args.call_wait`)."""

    @abstractmethod
    def _publish_probe(self) -> Any:
        """Step: ``PUBLISH`` an empty message on each of the library's probe channels
        (:data:`~._wire.PROBE_CHANNELS`), as :meth:`_memory_info` makes its call."""

    @abstractmethod
    def _wk(self) -> Any:
        """This process's wake-up listener for the client (:mod:`._wake`): ``listening``
        and ``listen`` (a step: called or awaited)."""

    @abstractmethod
    def _local_waiters(self) -> int:
        """Waiters of this process registered with this client's wake-up listener."""

    @abstractmethod
    def _aside(self, steps: Steps[None], interrupt: BaseException | None = None) -> Any:
        """Step: run the clean-up procedure ``steps`` to its end where no interrupt of
        the caller can stop it half way (see :meth:`_abandon`); the caller waits for it
        at most :data:`~lanequeue._ops.CANCEL_WAIT_S`, and an interrupt of that wait
        leaves it running. ``interrupt``: what stopped the caller (the thread face notes
        on it when its wait began, so that what the same interrupt cleans up next waits
        only what is left of that CANCEL_WAIT_S)."""

    @abstractmethod
    def _later(self, steps: Steps[None]) -> None:
        """Run the clean-up ``steps`` in the background, best effort, without waiting
        for it (a failed acquire's withdraw: see :meth:`_take`). Dropped (closed unrun)
        while the process already runs :data:`LATER_MAX` of them: the line entry then
        dies with its liveness, a grant made to it with its lease."""

    @abstractmethod
    def _new_event(self) -> Any:
        """An event of the face's kind (threading or asyncio): ``set()``."""

    @abstractmethod
    def _wait_turn(self, prev: Any, timeout: float | None) -> Any:
        """Step: wait until the predecessor's event ``prev`` is set, at most ``timeout``
        seconds (None: no limit); True if it was set."""

    @abstractmethod
    def _renew_io(self, call: Call, wait: float) -> Any:
        """The face's renewal call: the script over the renewer's own connection,
        waiting at most ``wait`` seconds (a RedisError or TimeoutError past that)."""

    @abstractmethod
    def _renew_many_io(self, calls: list[Call], wait: float) -> Any:
        """The face's batch of renewal calls in ONE round trip (pipelined on the
        renewer's own connection; one by one on a cluster client): the list of replies,
        an exception object in place of a reply whose call failed alone (a server error
        reply). A failure of the connection itself (timeout after ``wait`` seconds,
        reset) raises."""

    @abstractmethod
    def _start_renewer(self, needed: bool) -> None:
        """After a grant: the face starts its renewer (a thread or a task) if ``needed``
        (see :meth:`_register`), or if its own renewer cannot serve this grant."""

    def _ask(self, op: str, key: str | None, fn: Callable[..., Any], *args: Any) -> Steps[Any]:
        """One round trip to Redis, ``fn(*args)``, done by the face. A RedisError
        becomes :class:`~lanequeue.LaneBackendError` (``op`` and ``key`` name what
        failed), chained."""
        try:
            return (yield fn, args)
        except RedisError as exc:
            raise self._backend(op, key, exc) from exc

    def _script(self, op: str, key: str | None, call: Call) -> Steps[Any]:
        """One script call (``op``: acquire, withdraw, release or read)."""
        return self._ask(op, key, self._run, op, key, call)

    def _backend(self, op: str, key: str | None, exc: BaseException) -> LaneBackendError:
        where = f" for key {shown(key)}" if key is not None else ""
        if op == "release":
            what = f"; the hold is no longer renewed and lapses within {self.lease_s} s"
        elif op == "read":
            what = ""
        else:
            what = "; nothing was granted"
        return LaneBackendError(
            f"lane {self.name!r}: Redis {op}{where} failed ({told(exc)}){what}"
        )

    # -- the registry of this object's holds -------------------------------------------

    def _register(self, hold: H, token: int, t0: float, kept: bool) -> bool:
        """Record a grant asked for at ``t0``; return whether the caller must start a
        renewer (none of this process runs). ``kept``: the lane object owns the hold
        (strong registry entry), else its caller does (weak entry: see :mod:`._lease`).

        Nothing is claimed here for the duties that follow (a renewer, the watchdog's
        entry): whoever performs a duty marks it done, after it is done (the renewer
        thread its ``_renewing``, :meth:`._lease._Watchdog.watch` our ``_watch_at``), so
        an interrupt between this and them leaves them undone and unclaimed, to be done
        by the acquire's handler (:meth:`_see_to`) or by the next grant, never claimed and
        undone for the rest of the object's life."""
        with self._lock:
            self._purge_dropped()
            # Calls first (an interrupt among them leaves the hold PENDING, unrecorded:
            # the acquire's handler then passes the grant on), then plain stores, the
            # hold HELD last but one and the registry's append, a builtin, last: a hold
            # is HELD only once it is in the registry, shown and releasable.
            pid = os.getpid()
            expires = t0 + self.lease_s - self._guard_s
            hold._token = token  # (read by the entry)
            entry: Kept | Watched = (Kept(hold) if kept
                                     else Watched(hold, self._on_drop, t0))
            entries = self._holds.get(hold.key)
            start = not self._renewer_runs(pid)
            # -- commit: plain stores, then one last builtin --
            hold._since = t0
            hold._expires = expires
            hold._renew_at = t0 + self._renew_s
            hold._pid = pid
            hold._entry = entry
            self._n_live += 1
            self.acquired += 1
            self._idle_since = None
            hold._state = HELD
            if entries is None:
                self._holds[hold.key] = [entry]
            else:
                entries.append(entry)
        return start

    def _unrecord(self, hold: H) -> None:
        """Undo :meth:`_register` of ``hold`` (counted as released: the acquire's
        handler passes its grant on in Redis) when a thread it needs could not be
        started; the next grant tries again."""
        with self._lock:
            if hold._entry is not None and hold._state == HELD:
                self._unlink(hold, True)

    def _see_to(self, hold: H) -> None:
        """The duties of a recorded grant, once more (both are idempotent): its deadline
        watched and a renewer running. The acquire's handler calls it when an interrupt
        stopped :meth:`_granted` after the record (the hold stays its caller's, see
        :meth:`_take`); out of threads, the hold keeps its deadline through ``hold.lost``
        reading the clock, and its lease lapses."""
        try:
            watchdog.watch(self, hold._expires)
            with self._lock:
                start = not self._renewer_runs(os.getpid())
            self._start_renewer(start)
        except RuntimeError:  # out of threads
            pass

    def _renewer_runs(self, pid: int) -> bool:
        """Whether a renewer of process ``pid`` has the renewer's place (under
        ``self._lock``; a forked child sees its parent's claim and starts its own)."""
        return bool(self._renewing) and self._renewer_pid == pid

    def _claim_renewer(self) -> int:
        """The thread face's renewer, first thing in its thread: take the renewer's
        place; its claim number (the renewer then runs), or 0 when another renewer of
        this process has it (this one exits)."""
        with self._lock:
            if self._renewer_runs(os.getpid()):
                return 0
            claim = self._renewing = next(_claims)
            self._renewer_pid = os.getpid()
            return claim

    def _presence_lost(self, epoch: Epoch) -> int:
        """The presence connection ``epoch`` died (called by its thread): every hold
        granted under it is lost now, before the server may give it to a waiter. Returns
        how many."""
        due: list[H] = []
        with self._lock:
            for entries in self._holds.values():
                for entry in entries:
                    h = entry()
                    if h is not None and h._presence is epoch and not h._lost \
                            and HELD <= h._state <= RELEASING:
                        due.append(h)
        for h in due:
            self._notice_lost(h)
        return len(due)

    def _on_drop(self, entry: Watched) -> None:
        """A caller-owned hold was garbage-collected while still registered (never
        released): it is no longer renewed, so its lease lapses (C20). Runs inside the
        garbage collector: no lock taken here; the entry is purged later. A hold
        inherited through fork is the parent's (it renews it): forgotten here, silently.

        Queued first, in one C call, before any other call: an interrupt can land in a
        callback the collector runs (Python then only reports it), and one that landed
        before the queueing left the entry in the registry for good, counted among the
        holders (``wait_idle()`` and ``drain()`` never true again). One at the entry of
        this callback leaves it to the renewer's next round, which finds the entry dead
        (:meth:`_renewal_due`). An inherited entry is in no registry of this process:
        the purge passes it over."""
        self._dropped.append(entry)
        inherited = self._inherited.get(entry.key)
        if inherited is not None and any(e is entry for e in inherited):
            inherited[:] = [e for e in inherited if e is not entry]
            return
        warnings.warn(
            f"lane {self.name!r}: a hold of key {shown(entry.key)} (fencing token {entry.token}) "
            f"was garbage-collected without release; it is no longer renewed, and it is "
            f"released by this lane object's renewer (else it lapses within {self.lease_s} s)",
            ResourceWarning,
            stacklevel=2,
        )

    def _outermost(self) -> bool:
        """Before taking ``self._lock``: whether this thread is outside it (else a view
        was called from inside the lane's own work: a finalizer ran at an allocation
        under the lock, and its warning's handler called the view). A view inside
        reads, and leaves the purge of dropped holds to the next operation: a purge
        there would change the registry under the operation it interrupted."""
        return not self._lock._is_owned()  # type: ignore[attr-defined]

    def _purge_dropped(self) -> None:
        """Lock held: forget the entries of dropped holds; they are released by the
        renewer's next round (:meth:`_renew_round`), so their keys come free before
        their leases would lapse (one whose lease was lost too: the server may still
        have it, as a lost hold's release finds). Until that release has answered, a
        live one stays in ``_n_live`` (``holders``, ``available``, idle): it is still
        held in Redis, and ``acquired == released + unmatched_releases + holders`` once
        its release is counted. With no renewer of this process running (an asyncio
        renewer ends with its loop), or once it stops, nobody will release it: it is
        counted in ``unmatched_releases`` at once, and its lease lapses.

        Each entry leaves in one commit: the calls first (its lookups), then plain
        stores (its queueing a dict store), the registry's ``remove`` last; an interrupt
        after the ``popleft`` leaves the entry dead in the registry, for the renewer's
        next look (:meth:`_renewal_due`)."""
        runs = self._renewer_runs(os.getpid())
        if not runs and self._to_release:
            # Queued for a renewer whose stop an interrupt cut short (its record made,
            # the lapse not: see _renewer_stopped): they lapse now.
            self._lapse_queued()
        while self._dropped:
            entry = self._dropped.popleft()
            entries = self._holds.get(entry.key)
            if entries is None or entry not in entries:
                continue
            last = len(entries) == 1
            # -- commit: plain stores, then one last builtin --
            live = entry.live  # (False: its lease was lost, out of _n_live since)
            entry.live = False
            if runs:
                # A live one stays in _n_live: held in Redis until the renewer's release
                # answers.
                self._to_release[entry.owner] = (
                    entry.owner, entry.token, entry.key, entry.sent, entry.since, live)
                if live:
                    self._queued_live += 1
            else:  # no renewer to release it (its loop closed): it lapses
                if live:
                    self._n_live -= 1
                self.unmatched += 1
            if last:
                del self._holds[entry.key]
            else:
                entries.remove(entry)

    def _unlink(self, hold: H, freed: bool) -> None:
        """Lock held: drop ``hold`` from the registry, mark it ENDED and count its release
        (``freed``: in ``released``, else in ``unmatched_releases``), as one commit. The
        one call (``len``) comes before the stores and the list's ``remove``, a builtin,
        last, so an interrupt leaves the hold either as it was (a holder, uncounted) or
        fully unlinked and counted once."""
        entry = hold._entry
        entries = self._holds[hold.key]
        last = len(entries) == 1
        # -- commit: plain stores, then one last builtin --
        if freed:
            self.released += 1
        else:
            self.unmatched += 1
        hold._state = ENDED
        hold._entry = None
        if entry.live:
            entry.live = False
            self._n_live -= 1
        if last:
            del self._holds[hold.key]
        else:
            entries.remove(entry)

    def _detach(self, hold: H) -> object:
        """Mark ``hold`` RELEASING before releasing it; return this release's mark (what
        :meth:`_finish` is given), or None if it is not held (never granted, or released
        already). A hold left RELEASING by a release that an interrupt stopped before its
        end (nobody finishes it) is taken over: the mark is this call's from now on."""
        me = object()
        with self._lock:
            if not HELD <= hold._state <= RELEASING:
                return None
            # -- commit: plain stores --
            hold._state = RELEASING
            hold._releaser = me
            return me

    def _detach_oldest(self, key: str) -> tuple[H, object] | None:
        """:meth:`_detach` for ``manual_release(key)``: this object's oldest hold of
        ``key`` and this release's mark, or None (logged) when there is none."""
        hold: H | None = None
        me = object()
        with self._lock:
            self._purge_dropped()
            # This process's holds first; then one inherited through fork (a clear error);
            # a hold left RELEASING by a stopped release (see _detach) only when no hold
            # of the key is HELD.
            found = [h for h in (e() for e in (*self._holds.get(key, ()),
                                               *self._inherited.get(key, ())))
                     if h is not None and HELD <= h._state <= RELEASING]
            held = [h for h in found if h._state == HELD]
            hold = (held or found or [None])[0]
            if hold is not None and hold._pid == os.getpid():
                # -- commit: plain stores --
                hold._state = RELEASING
                hold._releaser = me
            elif hold is None:
                self.unmatched += 1
        if hold is not None:
            self._foreign(hold)  # a hold inherited through fork: a clear error
            return hold, me
        log.warning(
            "lane %r: manual_release(%s): key is not held by this client (this lane "
            "object holds nothing for it); nothing released",
            self.name, shown(key),
        )
        return None

    def _foreign(self, hold: RedisHoldBase) -> None:
        """Raise if ``hold`` was granted in another process (we are a forked child)."""
        if hold._pid != os.getpid():
            raise RuntimeError(
                f"lane {self.name!r}: the hold of key {shown(hold.key)} was granted in process "
                f"{hold._pid}; it cannot be renewed or released from process {os.getpid()} "
                f"(a forked child): release it in the process that acquired it"
            )

    def _lost_error(self, hold: RedisHoldBase, freed: bool = False) -> LeaseLostError:
        """The error of releasing a hold whose lease is gone: the same class whether the
        loss was noticed before the release was sent or learnt from its answer. ``freed``:
        the release found the hold still in Redis (lost by this process's own clock or
        presence check, not by the server) and freed it there."""
        return LeaseLostError(
            f"lane {self.name!r}: the lease of key {shown(hold.key)} (fencing token "
            f"{hold.token}) was lost: {hold._lost}; "
            + ("the server still had it, and this release freed it there"
               if freed else "the key may belong to another holder; nothing was released")
        )

    def _freed_error(self, hold: RedisHoldBase) -> NotOwnerError:
        """The error of releasing a hold that the release an interrupt stopped had
        released after all (its script ran; its answer never came)."""
        return NotOwnerError(
            f"lane {self.name!r}: the hold of key {shown(hold.key)} (fencing token "
            f"{hold.token}) was released already, by its release that an interrupt "
            f"stopped before the answer; nothing more was released"
        )

    def _freed_by_stopped_release(self, hold: H) -> None:
        """The renewer found gone a HELD hold whose release was sent and stopped before
        its answer, its own deadline not passed: that release freed it. Counted in
        ``released`` and ended, with a warning; not a lost lease."""
        ending = False
        mark = (hold.key, hold._token)
        try:
            with self._lock:
                if hold._state != HELD or hold._lost:
                    return  # (a release took it over meanwhile: its answer decides)
                # -- before the unlink, plain stores: see _ending --
                ending = True
                self._ending[mark] = None
                self._unlink(hold, True)
            log.warning(
                "lane %r: the hold of key %s (fencing token %d) was released by its "
                "release that an interrupt stopped before the answer; it is ended here, "
                "and manual_release(key) has nothing left to release", self.name,
                shown(hold.key), hold.token,
            )
            self._hold_end(hold.key, hold._token, hold._since, True)
        finally:
            if ending:
                with self._lock:
                    self._ending.pop(mark, None)

    def _hold_end(self, key: str, token: int, since: float, freed: bool) -> None:
        """The hold of ``key`` (fencing ``token``, granted as asked for at ``since``)
        has ended: it left this object's registry and was counted (in ``released`` or
        ``unmatched_releases``). A hook (the operations layer logs a long hold), called
        once per hold, after the count, however it ended: released, released with its
        lease lost, a release that failed, or dropped and released by the renewer.
        ``freed``: its release (or its release that an interrupt stopped, or the
        renewer's) freed it, not known lost when it was sent (the operations layer
        observes its time). Not called for an end that an interrupt stopped after its
        count, nor for a dropped hold that lapses unreleased (no renewer runs)."""

    def _notice_lost(self, hold: H) -> None:
        """Mark ``hold`` lost (once), call ``on_lease_lost`` and the hold's loss
        listener (see ``_watch_loss``)."""
        with self._lock:
            if hold._lost:
                return
            hold._lost = _loss_cause(hold)  # (read at the first notice)
            self.leases_lost += 1
            entry = hold._entry
            if entry is not None and entry.live:
                entry.live = False
                self._n_live -= 1
        # The holder's callback before the log line: a logging lock left held by an
        # interrupted thread (CPython's logging takes its module lock outside a try)
        # would stop this thread in the log call, and the holder must hear first.
        if self.on_lease_lost is not None:
            self._call_lost(hold)
        told = hold._on_loss
        if told is not None:
            try:
                told()
            except Exception:
                log.exception("lane %r: telling a turn of its lost lease failed", self.name)
        log.warning(
            "lane %r: lease of key %s (fencing token %d) lost: %s", self.name,
            shown(hold.key), hold.token, hold._lost,
        )

    def _call_lost(self, hold: H) -> None:
        """Call ``on_lease_lost(hold)`` (the asyncio face hands it to the hold's loop)."""
        cb = self.on_lease_lost
        if cb is None:
            return
        try:
            cb(hold)
        except Exception:
            log.exception("lane %r: on_lease_lost callback failed", self.name)

    def _deadlines_due(self, at: float) -> None:
        """The watchdog, at ``at``: every hold whose deadline has passed without a
        confirmed renewal is lost; then the watchdog is told this object's next earliest
        deadline (one pending entry per lane object; a superseded entry only checks)."""
        now = time.monotonic()
        due: list[H] = []
        with self._lock:
            nxt = math.inf
            for entries in self._holds.values():
                for entry in entries:
                    h = entry()
                    if h is None or h._lost or not HELD <= h._state <= RELEASING:
                        continue
                    if h._expires <= now:
                        due.append(h)
                    elif h._expires < nxt:
                        nxt = h._expires
        for h in due:
            self._notice_lost(h)
        if nxt < math.inf:
            watchdog.watch(self, nxt)  # (nothing pushed when an entry as early is pending)

    # -- procedures: acquire, wait, withdraw, release ------------------------------------

    def _granted(self, hold: H, token: int, t0: float, kept: bool) -> bool:
        """Record a grant asked for at ``t0`` and see that it is renewed and its deadline
        watched; True. Raises LaneBackendError when a thread it needs could not be
        started (the process is out of threads: the renewer's, the watchdog's): the
        grant is unrecorded, and the acquire's handler passes it on."""
        start = self._register(hold, token, t0, kept)
        try:
            watchdog.watch(self, hold._expires)
            self._start_renewer(start)
        except RuntimeError as exc:  # "can't start new thread"
            self._unrecord(hold)
            raise LaneBackendError(
                f"lane {self.name!r}: could not start a thread for the hold of key "
                f"{shown(hold.key)} ({exc}: the process is out of threads); its grant is "
                f"passed on, nothing is held"
            ) from exc
        epoch = hold._presence
        if epoch is not None:
            epoch.watch(self)
            if epoch.dead:  # died between the request and its answer
                self._notice_lost(hold)
        return True

    def _forked(self) -> None:
        """In a forked child: this object's process-local view starts empty, as an
        in-process lane's does. A fresh lock (a parent thread may have held it at the
        fork); no holder and no waiter (``active_count``, ``waiting``, ``get_active()``,
        ``stuck()``, ``wait_idle()`` see only the child's own); no renewer, no watchdog
        entry, no same-key line; the first use checks the server again and awaits the
        child's own presence connection, as a new lane object's does. The parent's
        holds stay the parent's (it renews them): they are kept aside only so that
        releasing one here raises a clear RuntimeError (see :meth:`_foreign`), and they
        are never renewed, watched or reported lost here. The counters keep the
        parent's history, and the holds the parent had at the fork count as released
        (``acquired == released + holders`` holds in the child, as in-process). A face
        extends this (its renewal link, its listener)."""
        self._lock = threading.RLock()
        for entries in self._holds.values():
            for entry in entries:
                entry.live = False
                self._inherited.setdefault(entry.key, []).append(entry)
                self.released += 1
        self._holds = {}
        # The parent's dropped holds not released yet are the parent's to release; in
        # the child they count as released, as the parent's other holds.
        self.released += len(self._to_release)
        self._n_live = 0
        self._waiting = 0
        self._dropped = deque()
        self._to_release = {}
        self._queued_live = 0
        self._releasing = {}
        self._renewing = 0
        self._renewer_pid = 0
        self._idle_since = None
        self._joins = {}
        self._ending = {}
        self._watch_at = math.inf
        self._server_checked = False

    def _check_server(self) -> Steps[None]:
        """First use of this lane object (and again every ``_version_ttl_s / 2`` of use,
        with the version's claim): refuse a server that may evict lane keys (C22).
        Under ``maxmemory`` with any policy but ``noeviction``, Redis deletes keys to make
        room, lane keys included (they all have a TTL, so every ``volatile-*`` policy picks
        them too), and a deleted holder key lets a waiter in next to the live holder."""
        info = yield from self._ask("check", None, self._memory_info)
        # A cluster client answers per node: {node: {field: value}}.
        nodes = info.values() if info and all(isinstance(v, dict) for v in info.values()) \
            else [info]
        for node in nodes:
            policy = str(node.get("maxmemory_policy", "noeviction"))
            limit = int(node.get("maxmemory", 0) or 0)
            if limit and policy != "noeviction":
                raise LaneBackendError(
                    f"lane {self.name!r}: the Redis server has maxmemory {limit} bytes with "
                    f"maxmemory-policy {policy!r}: it may evict lane keys, and an evicted "
                    f"holder key would let a second holder in. Set maxmemory-policy "
                    f"noeviction (or maxmemory 0) on the server used for lanes"
                )
        try:
            yield from self._ask("check", None, self._publish_probe)
        except LaneBackendError as exc:
            if isinstance(exc.__cause__, NoPermissionError):
                # Refused now, not later: its scripts could not publish their hand-offs
                # (a release would fail after handing the key on), nor its presence
                # subscribe (a killed holder's keys would wait for their leases).
                raise LaneBackendError(
                    f"lane {self.name!r}: the Redis user may not use the lanes' pub/sub "
                    f"channels ({exc.__cause__}). Grant it the channels 'lq:*' (ACL "
                    f"SETUSER <user> '&lq:*'; Redis 7 gives a new user no channel unless "
                    f"acl-pubsub-default is allchannels)"
                ) from exc.__cause__
            raise
        self._server_checked = True

    def _version_call(self) -> Call:
        return self._s_version, [self._version_key], [
            self._layout, round(self._version_ttl_s * 1000)
        ]

    def _version_claimed(self, reply: Any, t0: float) -> None:
        """Interpret the marker's answer (claimed at ``t0``); raise if another version
        uses the lane."""
        seen = text(reply)
        if seen != self._layout:
            raise LaneBackendError(
                f"lane {self.name!r} (prefix {self.prefix!r}) is in use by clients of "
                f"protocol version {seen!r}; this client speaks {self._layout!r}. Clients "
                f"of two versions never share a lane: stop the others (their marker runs "
                f"out {self._version_ttl_s:.0f} s after their last use) or use another "
                f"prefix for the new version"
            )
        self._version_due = t0 + self._version_ttl_s / 2

    def _check_version(self) -> Steps[None]:
        """Claim the lane for our protocol version (see :mod:`._keys`)."""
        t0 = time.monotonic()
        reply = yield from self._script("check", None, self._version_call())
        self._version_claimed(reply, t0)

    def _take(self, hold: H, timeout: float | None, kept: bool = False) -> Steps[bool]:
        """Wait up to ``timeout`` seconds (None: no limit, 0: no wait) for the grant of
        ``hold``; True once granted (the hold is registered and renewed; ``kept``: owned
        by this lane object, see :meth:`_register`)."""
        hold._parked = None  # taken (a hold never entered warns when dropped)
        if hold._tried:
            # An earlier attempt of this hold (stopped, or failed) may have a clean-up
            # still to run under its owner id (in the background: _abandon's, _later's):
            # this one asks under a new one, which that clean-up cannot touch.
            hold.owner = owner_id()
        hold._tried = True
        key = hold.key
        wait = timeout != 0
        t0 = time.monotonic()
        deadline = None if timeout is None else t0 + timeout
        in_line = expecting = asked = False
        turn = None
        forgets: tuple[Callable[[str, None], object], ...] = ()
        owner = hold.owner
        try:
            prev = None
            if wait:
                # Same-key requests of this process join the line in arrival order (C29):
                # each sends its first script once its predecessor's has answered. Our
                # event is in ``turn`` before it is registered, so the finally sets it
                # wherever an interrupt lands (an event registered and never set would
                # hold the next same-key request up for its whole timeout).
                turn = self._new_event()
                prev = self._join_turn(key, turn)
            if not self._server_checked:
                pres = self._pres()
                if pres is not None and not self._async_face:
                    # First use: let the presence connection come up (a few ms), so the
                    # first grants are covered too (see _presence.py).
                    pres.ready.wait(1.0)
                yield from self._check_server()
            elif time.monotonic() >= self._version_due:
                # Again with each claim of the version (every _version_ttl_s / 2 of use):
                # a policy or an ACL changed on a live server (or a restart with another
                # configuration) is refused from then on, not only at first use.
                yield from self._check_server()
            if time.monotonic() >= self._version_due:
                yield from self._check_version()
            if wait:
                waker = self._wk()
                if not waker.listening:
                    # Subscribed before our first script can put us in line: a
                    # hand-off published earlier would be lost (a whole poll).
                    yield waker.listen, ()
            if prev is not None:
                left = None if deadline is None else max(0.0, deadline - time.monotonic())
                if not (yield self._wait_turn, (prev, left)):
                    # The predecessor's first script has not answered within our
                    # timeout (a frozen server): we never joined the line.
                    self._count_outcome(timed_out=True)
                    return False
            poll, live_ms = self._poll_plan()
            call = self._acquire_call(hold, wait, live_ms)
            asked = True  # (from here on the server may have queued us)
            try:
                granted, value = grant_reply((yield from self._script("acquire", key, call)))
            finally:
                if turn is not None:
                    self._turn_done(key, turn)
                    turn = None
            if granted:
                granted, value, t0 = yield from self._fresh(hold, value, t0)
            if granted:
                return self._granted(hold, value, t0, kept)
            if not wait:
                self._count_outcome(rejected=True)
                return False
            with self._lock:
                # -- commit: plain stores -- counted in ``waiting`` and flagged for the
                # uncount below together: an interrupt lands before both or after both
                # (a flag set before a call that counts would let the finally uncount a
                # waiter never counted, and ``waiting`` would stay negative).
                self._waiting += 1
                in_line = True
            # Flagged first: forgetting an owner never expected is harmless, while an
            # expectation registered unflagged would never be forgotten (and would count
            # as a waiter of this process for ever, see _poll_plan).
            forgets = self._forgets()
            expecting = True
            # A wake-up that came before this (the key was handed to us right after our
            # first script) was kept by the listener for us.
            self._expect(owner)
            wake = value
            lateness = self._wk().lateness
            # Set once a poll (an acquire re-run while in line) answered "not granted":
            # from then on a wake-up's grant may be older than that answer (made before
            # it, read only after it: a process frozen in line whose grant lapsed and
            # went to the next waiter), so it is confirmed with the server first.
            polled = False
            while True:
                start = time.monotonic()
                block = next_block(poll, wake, deadline, start)
                if not block:
                    break
                token = yield self._wait_wake, (owner, block)
                if token:
                    # The wake-up carried a grant of a full lease, made by a script that
                    # ran after our first acquire was sent (at t0): ours at once, unless
                    # a poll said otherwise since (then confirmed: see ``polled``).
                    granted, value, t0 = yield from self._fresh(
                        hold, int(token), -math.inf if polled else t0)
                    if granted:
                        return self._granted(hold, value, t0, kept)
                # Woken (or the bounded wait ran out): re-run acquire, which confirms a
                # hand-off, takes over a lapsed holder if we are first, or refreshes our
                # liveness in line.
                sent, ready = t0, time.monotonic()
                t0 = ready
                poll, live_ms = self._poll_plan()
                call = self._acquire_call(hold, True, live_ms)
                reply = yield from self._script("acquire", key, call)
                if isinstance(reply, Woken):
                    # Handed a full lease while the poll waited for its turn among this
                    # process's calls in flight: nothing was sent, so the grant ran
                    # after the last acquire that was (at ``sent``).
                    t0 = sent
                    granted, value, t0 = yield from self._fresh(
                        hold, reply.token, -math.inf if polled else t0)
                    if granted:
                        return self._granted(hold, value, t0, kept)
                    wake = -1
                    continue
                now = time.monotonic()
                # How late this poll ran: its wait for a turn, a slow reply, and a wait
                # that overran (a busy loop). Liveness windows count it (_poll_plan).
                lateness.note(now - ready + max(0.0, ready - start - block), now)
                granted, value = grant_reply(reply)
                if granted:
                    granted, value, t0 = yield from self._fresh(hold, value, t0)
                if granted:
                    return self._granted(hold, value, t0, kept)
                polled = True
                wake = value
            # Out of time. A hand-off may have reached us meanwhile: withdraw settles it.
            t0 = time.monotonic()
            call = self._withdraw_call(hold)
            granted, value = grant_reply((yield from self._script("withdraw", key, call)))
            if granted:
                granted, value, t0 = yield from self._fresh(hold, value, t0)
            if granted:
                return self._granted(hold, value, t0, kept)
            self._count_outcome(timed_out=True)
            return False
        except LaneBackendError as exc:
            # A reply that was not ours (a protocol error), or an error reply (OOM),
            # came from a reachable server, which may have queued or granted us: leave,
            # pass a grant on (else a release hands the key to this ghost for a lease).
            # So is a grant that came and could not be kept (no thread to renew it:
            # RuntimeError, see _granted).
            if isinstance(exc.__cause__, (StaleReply, ResponseError, RuntimeError)):
                yield from self._abandon(hold, count=False)
            elif wait and asked and hold._state != HELD:
                # Unreachable (a lost connection, no reply in time): the server may
                # have queued us, and while our line entry lives a release hands it the
                # key, for a whole lease nobody uses. The same clean-up, in the
                # background (the caller hears the error now): it lands once the server
                # answers again (a cut connection, a pause); failing, the entry dies
                # with its liveness.
                self._later(self._withdraw_and_pass(hold, owner))
            raise
        except GeneratorExit:
            raise  # closed without running to its end: no more I/O to be had
        except BaseException as exc:
            # Interrupted (KeyboardInterrupt, an async exception, a cancelled task) at
            # any point, maybe after the server queued or granted us: leave no ghost in
            # line, pass on a grant. A grant already recorded (HELD: in the registry)
            # stays as an interrupted in-process acquire leaves its hold: shown by
            # get_active() and ended by manual_release while its owner has it (a
            # caller-owned hold object lives on in the interrupt's traceback), released
            # by the renewer once a caller-owned one is dropped (its registry entry is
            # weak: see _lease). The same after _take returned, up to the caller's
            # ``with`` block: nothing there needs handling.
            if hold._state != HELD:
                yield from self._abandon(hold, interrupt=exc)
            else:  # (the interrupt may have stopped _granted before its duties)
                self._see_to(hold)
            raise
        finally:
            # The finally of an acquire that ends without an interrupt is where a single
            # interrupt can stop a clean-up: each clean-up below runs even when one lands
            # in the one before it (nested), and none makes a call before its first
            # store (the uncount; the pops, C calls that store before CPython can
            # deliver an interrupt; the same-key turn, idempotent, is done again when
            # stopped at its entry), so what an acquire registered never outlives it.
            try:
                if in_line:
                    with self._lock:
                        self._waiting -= 1
            finally:
                try:
                    if turn is not None:
                        try:
                            self._turn_done(key, turn)
                        except BaseException:
                            self._turn_done(key, turn)
                            raise
                finally:
                    if expecting:
                        try:
                            forgets[0](owner, None)
                        finally:
                            forgets[1](owner, None)

    def _poll_plan(self) -> tuple[float, int]:
        """(seconds until this waiter's next poll, its liveness window in ms, sent with
        the call that refreshes it). A poll refreshes the waiter's liveness; the process's
        waiters on one client together poll at most about ``REFRESHES_PER_S`` times a
        second, so 10,000 waiters do not flood Redis: each polls less often, with a
        liveness window to match (3 polls + 1 s). A poll lasts as long as this process's
        polls have lately taken to run (:class:`~._wake.Lateness`: their wait for a turn
        among the calls in flight, a busy event loop): 3 polls + 1 s counts that too, so a
        waiter is never dropped from its line (and sent to its tail, with the key or
        permit it was due left idle meanwhile) because its own process runs its polls
        late."""
        poll = max(self._poll_s, self._local_waiters() / REFRESHES_PER_S)
        late = self._wk().lateness.value(time.monotonic())
        if poll == self._poll_s and late == 0.0:
            return poll, self._live_ms
        return poll, round((3 * (poll + late) + 1.0) * 1000)

    def _fresh(self, hold: H, token: int, t0: float) -> Steps[tuple[bool, int, float]]:
        """A grant whose reply took more than half a lease (asked for at ``t0``: a frozen
        server, a stalled connection) would leave its holder little or nothing of its
        deadline, which counts from ``t0``: extend it first (the renew script, only if
        it is still ours). Returns (still granted, token, the ``t0`` to count from)."""
        while time.monotonic() - t0 > self.lease_s / 2:
            t0 = time.monotonic()
            reply = yield from self._script("renew", hold.key, self._renew_call(hold))
            if flag_reply(reply) != 1:
                return False, -1, t0
        # The presence connection the grant was asked under died before the grant was
        # answered (the server froze, a reconnect): the server would take the hold over
        # from its empty channel, so move the record to the current connection (or drop
        # it: the hold then lives by its lease only) before the hold is ours.
        while hold._presence is not None and hold._presence.dead:
            pres = self._pres()
            epoch = pres.current() if pres is not None else None
            hold._presence = epoch
            t0 = time.monotonic()
            call = self._k.renew(hold.owner, hold.key,
                                 epoch.channel if epoch is not None else "")
            reply = yield from self._script("renew", hold.key, call)
            if flag_reply(reply) != 1:
                return False, -1, t0
        return True, token, t0

    def _join_turn(self, key: str, mine: Any) -> Any:
        """Register a same-key request of this process, ``mine`` its event (set once its
        first script has answered, by :meth:`_turn_done`; the caller holds it before
        this call, so an interrupt anywhere here or after leaves it to be set): its
        predecessor's event, or None."""
        with self._lock:
            prev = self._joins.get(key)
            # -- commit: one store --
            self._joins[key] = mine
        return prev

    def _turn_done(self, key: str, mine: Any) -> None:
        mine.set()
        with self._lock:
            if self._joins.get(key) is mine:
                del self._joins[key]

    def _abandon(self, hold: H, count: bool = True,
                 interrupt: BaseException | None = None) -> Steps[None]:
        """An interrupted wait: leave the line and pass on a grant that arrived
        meanwhile (``count``: as a cancelled wait). Best effort: if Redis fails, the
        line entry dies with its liveness.

        Its calls run where a second interrupt cannot cut them short (:meth:`_aside`: on
        the thread face a clean-up thread, which no signal handler interrupts; on asyncio
        the clean-up task a cancellation already runs in): a second Ctrl-C while they
        run ends the caller's wait for them, not the clean-up, which would otherwise
        leave a grant it had been handed in Redis, nobody's, for a whole lease."""
        try:
            yield self._aside, (self._withdraw_and_pass(hold, hold.owner), interrupt)
        finally:
            if count:
                self._count_outcome(cancelled=True)

    def _withdraw_and_pass(self, hold: H, owner: str) -> Steps[None]:
        """:meth:`_abandon`'s calls: the withdraw, and the release of a grant it finds,
        for the attempt that asked under ``owner`` (read by the caller: these calls may
        run later, in the background, when the hold asks again under a new owner id,
        see :meth:`_take`)."""
        try:
            call = self._withdraw_call(hold, owner)
            granted, token = grant_reply((yield from self._script("withdraw", hold.key, call)))
            if granted:
                # Released under the token the withdraw answered: the hold itself may not
                # have recorded it (interrupted before the grant was registered: token 0,
                # which the release script would not match).
                yield from self._script("release", hold.key,
                                        self._k.release(owner, token, hold.key))
        except Exception as exc:
            log.debug("lane %r: clean-up after an abandoned wait failed: %s", self.name, exc)

    def _release(self, hold: H) -> Steps[bool]:
        """``hold.release()``: False if it is not held, else see :meth:`_finish`."""
        if hold._state == HELD:
            self._foreign(hold)
        me = self._detach(hold)
        if me is None:
            return False
        return (yield from self._finish(hold, me))

    def _finish(self, hold: H, me: object) -> Steps[bool]:
        """Release a hold marked RELEASING (renewed until the script answers; then out of
        the registry: if this raises LaneBackendError, the lease lapses by itself within
        ``lease_s``). Stopped by an interrupt (KeyboardInterrupt, any exception that is
        not an ``Exception``) before the answer, the hold goes back to HELD: still
        renewed, shown by ``get_active()`` and ended by ``manual_release(key)`` or
        ``hold.release()``, as an interrupted in-process release leaves it. If the
        script had run, the release that ends it, or the renewal that first finds it
        gone, counts it in ``released`` (its own release freed it: not a lost lease,
        unless its own deadline had passed); that release raises NotOwnerError
        (``manual_release`` returns False, with a warning).

        The answer is kept as a plain store the moment it is known; the hold then leaves
        the registry and is counted (``released`` if the script freed it, else
        ``unmatched_releases``: not ours any more, or no answer) in one commit under the
        lock (:meth:`_unlink`), so an interrupt anywhere never ends a hold uncounted nor
        counts one still held. A refusal (the server no longer has the hold: its lease
        ran out, or it was taken over) marks the hold lost, and every release of a hold
        that is lost raises :class:`~lanequeue.LeaseLostError`, after that commit. The
        hold's end is then reported (:meth:`_hold_end`: ``warn_hold_s``), however it
        ended, unless an interrupt propagates."""
        # The script's answer: True (freed), False (not ours, or no answer to a release
        # of a hold known lost), None (none yet).
        freed: bool | None = None
        was_lost = interrupted = sent = ours = False
        committed = False  # counted released here
        # This release unlinks the hold: its end is on its way to the operations layer
        # (see _ending) until this returns or raises.
        ending = stopped = False
        mark = (hold.key, hold._token)
        try:
            try:
                was_lost = hold.lost
                sent = hold._sent  # an earlier release of it was sent, and stopped unanswered
                if was_lost:
                    self._notice_lost(hold)
                    # Lost by our own clock or presence, the server may still have it (the
                    # release script checks the owner): free the key now rather than after
                    # the server's expiry. What it answers, the holder hears LeaseLostError.
                    try:
                        reply = yield from self._script("release", hold.key,
                                                        self._release_call(hold))
                        freed = flag_reply(reply) == 1
                    except LaneBackendError:
                        freed = False
                else:
                    hold._sent = True  # (stopped before its answer: see the finally)
                    entry = hold._entry
                    if entry is not None:
                        entry.sent = True  # (for the renewer, should the hold be dropped)
                    reply = yield from self._script("release", hold.key,
                                                    self._release_call(hold))
                    freed = flag_reply(reply) == 1
            except BaseException as exc:
                interrupted = not isinstance(exc, Exception)
                raise
            finally:
                with self._lock:
                    # (Not ours any more: a later release took it over, see _detach; that
                    # one counts it.)
                    if hold._state == RELEASING and hold._releaser is me:
                        if interrupted and freed is None:
                            hold._state = HELD  # maybe still held: kept, as in process
                        else:
                            # Refused after a release of ours was sent unanswered, the hold
                            # not lost by its own clock: that release freed it (released).
                            ours = freed is False and sent and not was_lost
                            # No answer (LaneBackendError): unmatched, the lease lapses.
                            committed = freed is True or ours
                            # -- before the unlink, plain stores: see _ending --
                            ending = True
                            self._ending[mark] = None
                            self._unlink(hold, committed)
            if ours:
                raise self._freed_error(hold)
            if was_lost or not freed:
                if not was_lost:
                    self._notice_lost(hold)  # refused: the server no longer has it
                raise self._lost_error(hold, freed is True)
            return True
        except BaseException as exc:
            stopped = not isinstance(exc, Exception)
            raise
        finally:
            if ending:
                # This release ended the hold: reported however it ended (freed, lost,
                # refused, no answer), once, after its count; not while an interrupt
                # propagates (no log handler runs then).
                try:
                    if not stopped:
                        self._hold_end(hold.key, hold._token, hold._since,
                                       committed and not was_lost)
                finally:
                    with self._lock:
                        self._ending.pop(mark, None)

    def _enter(self, hold: H) -> Steps[None]:
        """Entering ``with lane.acquire(key)``: wait for the grant or raise."""
        if hold._state != PENDING:
            raise RuntimeError("this hold was already entered (a hold is single use, even after "
                               "it ended or timed out); call lane.acquire(key) again")
        if not (yield from self._take(hold, hold._timeout_s)):
            hold._state = ENDED  # nothing granted: single use all the same
            raise LaneTimeoutError(self.name, hold.key, hold._timeout_s, type(self).__name__)

    def _exit(self, hold: H, failed: bool) -> Steps[None]:
        """Leaving the block: release; when the block itself ``failed``, a release error
        is logged instead of raised (the block's exception propagates)."""
        try:
            yield from self._release(hold)
        except LaneError as err:
            if not failed:
                raise
            log.warning("lane %r: release of key %s after an error in the block: %s",
                        self.name, shown(hold.key), err)

    # -- procedures and checks behind the public surface ---------------------------------

    def _no_priority(self, priority: object) -> None:
        """An acquire's ``priority`` on a Redis lane: 0 only (ValueError naming the class
        for another, TypeError/ValueError for a bad one): its line is served in arrival
        order, across processes."""
        check_no_priority(priority, public_name(type(self)),
                          "a Redis lane serves its line in arrival order")

    def _new_hold(self, key: str, timeout_s: Any = LANE_DEFAULT) -> H:
        """``acquire(key, timeout_s=...)``: check the arguments, make the hold."""
        if key.__class__ is not str or not key or not key.isascii():
            key = plain_key(key)
        timeout = self.timeout_s if timeout_s is LANE_DEFAULT else check_timeout(timeout_s)
        return self._hold_class(self, key, timeout)

    def _hold_steps(self, key: str, timeout: float | None) -> Steps[H | None]:
        """For a queue's ``acquire_all``: the granted hold, or None on timeout."""
        if key.__class__ is not str or not key or not key.isascii():
            key = plain_key(key)
        hold = self._hold_class(self, key, timeout)
        return hold if (yield from self._take(hold, timeout)) else None

    def _try_acquire(self, key: str) -> Steps[bool]:
        if key.__class__ is not str or not key or not key.isascii():
            key = plain_key(key)
        return (yield from self._take(self._hold_class(self, key, 0.0), 0.0, kept=True))

    def _acquire_timeout(self, key: str, timeout_s: float | None) -> Steps[bool]:
        if key.__class__ is not str or not key or not key.isascii():
            key = plain_key(key)
        timeout = check_timeout(timeout_s)
        return (yield from self._take(self._hold_class(self, key, timeout), timeout, kept=True))

    def _manual_release(self, key: str) -> Steps[bool]:
        """Release this object's oldest hold of ``key``; False (and a warning) when there
        is none or it is not ours any more."""
        if key.__class__ is not str or not key or not key.isascii():
            key = plain_key(key)
        found = self._detach_oldest(key)
        if found is None:
            return False
        try:
            return (yield from self._finish(*found))
        except NotOwnerError as err:
            log.warning("lane %r: manual_release(%s): %s", self.name, shown(key), err)
            return False

    # -- renewal bookkeeping -------------------------------------------------------------

    def _renewal_due(self, now: float) -> tuple[list[H], float] | None:
        """The holds to renew now and how long the renewer may sleep after renewing them;
        None when the renewer should exit (no live hold for a whole lease).

        The sleep never exceeds ``lease_s/3``, and a new hold is first due ``lease_s/3``
        after its grant was asked for, so registration needs no wake-up call. Holds
        granted in another process (inherited through fork) are never renewed here.
        """
        pid = os.getpid()
        with self._lock:
            self._purge_dropped()
            if self._n_live == 0:
                if self._idle_since is None:
                    self._idle_since = now
                elif now - self._idle_since >= self.lease_s and not self._to_release:
                    # (Never with dropped holds queued: this round releases them, and
                    # a purge that finds no renewer lapses those queued.)
                    self._renewing = 0
                    return None
                return [], self._renew_s
            self._idle_since = None
            # When a hold is due, the holds due within the next quarter period are
            # renewed with it: one wake-up serves many holds.
            soon = now + self._renew_s / 4
            batch: list[H] = []
            first = nxt = now + self._renew_s
            dead: list[Watched] = []
            for entries in self._holds.values():
                for entry in entries:
                    h = entry()
                    if h is None:
                        if isinstance(entry, Watched):  # (a Kept entry never dies)
                            dead.append(entry)
                        continue
                    if not HELD <= h._state <= RELEASING or h._lost or h._paused \
                            or h._pid != pid:
                        continue
                    if h._renew_at <= soon:
                        batch.append(h)
                        first = min(first, h._renew_at)
                    elif h._renew_at < nxt:
                        nxt = h._renew_at
            if dead:
                # Dropped holds still registered: their callback (_on_drop) was stopped
                # before it queued them (an interrupt at its entry), or has yet to run.
                # Purged now, and released with this round (a second queueing of one
                # is passed over by the purge).
                self._dropped.extend(dead)
                self._purge_dropped()
            if batch and first <= now:
                return batch, max(0.001, nxt - now)
            return [], max(0.001, min(first, nxt) - now)

    def _renewed(self, hold: H, ok: bool, t0: float) -> None:
        if not ok:
            # A hold whose release is on its way may have been released by it already
            # (the release and this renewal race on two connections): the release's own
            # answer says whether it was still ours, so only a HELD hold is lost here;
            # and not one whose release an interrupt stopped after it was sent: that
            # release freed it, unless the hold's own deadline had passed.
            if hold._state == HELD:
                if hold._sent and not hold.lost:
                    self._freed_by_stopped_release(hold)
                else:
                    self._notice_lost(hold)
            return
        with self._lock:
            # Too late: the deadline passed before the answer came, and the hold has read
            # as lost since; it stays lost (never lost, then held again).
            late = hold._lost or time.monotonic() >= hold._expires
            if not late:
                # The lease was extended by a script that ran after t0: counting from t0
                # keeps our deadline at or before the server's.
                hold._expires = t0 + self.lease_s - self._guard_s
                hold._renew_at = t0 + self._renew_s
        if late and HELD <= hold._state <= RELEASING:
            self._notice_lost(hold)

    def _renew_failed(self, holds: list[H], exc: BaseException, now: float) -> None:
        keys = ", ".join(shown(h.key) for h in holds[:5]) + (" ..." if len(holds) > 5 else "")
        log.warning(
            "lane %r: renewing the lease of %d hold(s) (keys %s) failed: %s",
            self.name, len(holds), keys, told(exc),
        )
        with self._lock:
            for hold in holds:
                hold._renew_at = now + min(self._renew_s, 0.25)

    def _renew_round(self) -> Steps[float | None]:
        """One round of the renewer: renew the holds due now; return how long to sleep,
        or None when the renewer should exit (see :meth:`_renewal_due`).

        The renewals due go over the renewer's own connection (never waiting for a pool
        shared with waiters), all in one round trip, which waits at most
        ``min(lease_s/4, time left before the latest of their deadlines)``; a hold too
        close to its deadline is not renewed (the watchdog ends it), and a renewal
        answered after its hold's deadline does not revive it. The holder's deadline
        never depends on this I/O."""
        plan = self._renewal_due(time.monotonic())
        # Holds garbage-collected without release (their finalizer could not do I/O):
        # released now, each only if still its owner's, in one round trip.
        # One whose release was sent before (stopped before its answer) and is not
        # ours any more was freed by that release: released, as _finish counts it.
        # Counted however this round ends (a renewer task cancelled with its loop, an
        # interrupt in the task): each leaves holders once, in released or, lapsing, in
        # unmatched_releases. Taken inside the try, their number first (a call), then
        # plain stores; counted in the finally by plain stores only.
        # A dropped hold whose lease was lost (not live) is released as a lost hold's
        # release is: freed only if the server still had it. Then each is reported as
        # any release's hold is (_hold_end: warn_hold_s, and the time of one freed),
        # once; until then the batch stays in _releasing (its holds' marks are kept:
        # see _pending_ends).
        dropped: dict[str, Dropped] = {}
        done: list[tuple[Dropped, bool]] = []
        n = n_live = freed = 0
        no = next(_batches)
        try:
            try:
                with self._lock:
                    n = len(self._to_release)
                    # -- commit: plain stores --
                    n_live = self._queued_live
                    self._queued_live = 0
                    dropped, self._to_release = self._to_release, {}
                    self._releasing[no] = dropped
                if dropped:
                    gone = list(dropped.values())
                    try:
                        replies = yield self._renew_many_io, (
                            [self._k.release(o, t, k) for o, t, k, *_ in gone],
                            self._renew_timeout_s)
                        done = [(d, r == 1 or (d[3] and d[5]
                                               and not isinstance(r, BaseException)))
                                for r, d in zip(replies, gone, strict=True)]
                    except Exception as exc:  # they lapse with their leases
                        log.warning("lane %r: releasing %d dropped hold(s) failed: %s",
                                    self.name, n, told(exc))
                        done = [(d, False) for d in gone]
                    freed = sum(1 for _, ok in done if ok)
            finally:
                if dropped:
                    with self._lock:
                        self.released += freed
                        self.unmatched += n - freed
                        self._n_live -= n_live
            for (_, token, key, _, since, live), ok in done:
                self._hold_end(key, token, since, ok and live)
        finally:
            with self._lock:
                self._releasing.pop(no, None)
        if plan is None:
            return None
        due, sleep = plan
        if due and time.monotonic() >= self._version_due:
            # Holds live on without acquires: keep the version marker claimed meanwhile.
            t0 = time.monotonic()
            try:
                reply = yield self._renew_io, (self._version_call(), self._renew_timeout_s)
                self._version_claimed(reply, t0)
            except Exception as exc:
                log.warning("lane %r: claiming its version marker failed: %s", self.name,
                            told(exc))
        # Every hold due is renewed in ONE round trip (pipelined): a renewer that sent
        # its renewals one after another needed a round trip, and the interpreter twice,
        # per hold, so under load (many threads, a busy CPU) the last holds of a long
        # batch were renewed after their deadline and lost (replay at --speed 600).
        t0 = time.monotonic()
        todo = [h for h in due if h._expires - t0 >= 0.005]  # else the watchdog ends it
        if not todo:
            return sleep
        wait = min(self._renew_timeout_s, max(h._expires for h in todo) - t0)
        try:  # not through _ask: a failed renewal is not an error of any caller
            replies = yield self._renew_many_io, ([self._renew_call(h) for h in todo], wait)
        except (RedisError, OSError, TimeoutError) as exc:
            self._renew_failed(todo, exc, time.monotonic())
            return sleep
        except Exception:  # never let the renewer die
            log.exception("lane %r: renewer error", self.name)
            return sleep
        for hold, reply in zip(todo, replies, strict=True):
            try:
                if isinstance(reply, BaseException):
                    raise reply
                ok = flag_reply(reply) == 1
            except (RedisError, LaneBackendError) as exc:
                self._renew_failed([hold], exc, time.monotonic())
                continue
            self._renewed(hold, ok, t0)
        return sleep

    def _renewer_stopped(self, claim: int | None = None) -> None:
        """The face's renewer ended (cancelled with its loop, exited idle, or by an
        error: ``claim`` is its claim number, and a later renewer's claim is kept): the
        next grant starts a new one. The dropped holds it was to release lapse (see
        :meth:`_purge_dropped`). The asyncio face's renewer records its stop itself
        first (``_renewing`` 0, a plain store) and then calls this; if an interrupt
        stops it in between, the next purge lapses them."""
        with self._lock:
            if claim is None or self._renewing == claim:
                self._renewing = 0  # -- first: a plain store (this runs in a finally) --
            if not self._renewer_runs(os.getpid()):
                self._lapse_queued()

    def _lapse_queued(self) -> None:
        """Lock held, no renewer of this process running: the dropped holds queued for
        its release lapse (counted in ``unmatched_releases``). Their number first (a
        call), then plain stores only (this runs in a finally)."""
        n = len(self._to_release)
        # -- commit: plain stores --
        self._to_release = {}
        self._n_live -= self._queued_live
        self._queued_live = 0
        self.unmatched += n

    # -- views of this lane object -------------------------------------------------------

    @property
    def active_count(self) -> int:
        """Holds of THIS lane object now (not lost): on a per-key lane, the keys it
        holds."""
        outermost = self._outermost()
        with self._lock:
            if outermost:
                self._purge_dropped()
            return self._n_live

    @property
    def waiting(self) -> int:
        """Callers (threads or tasks) of THIS lane object waiting now."""
        return self._waiting

    def get_active(self) -> dict[str, float]:
        """Each key held through THIS lane object -> seconds held so far."""
        return self._local_active()

    def status(self) -> dict[str, Any]:
        """A JSON-ready picture of this lane object (no Redis round trip)."""
        return self._status()

    def _status(self, lane_wide: dict[str, Any] | None = None) -> dict[str, Any]:
        """The lane object, then ``lane_wide`` (from Redis) or this object's holders and
        waiters, then its counters and limits."""
        if lane_wide is None:  # this object: the same keys as an in-process lane's status()
            lane_wide = {"active": self._n_live, "waiting": self._waiting,
                         **self._object_counts()}
        return {
            "kind": type(self).__name__,
            "name": self.name,
            "prefix": self.prefix,
            "timeout_s": self.timeout_s,
            "lease_s": self.lease_s,
            **lane_wide,
            "stats": self.stats.to_dict(),
            **self._limits(),
        }

    @property
    def stats(self) -> LaneStats:
        """Counters of THIS lane object (this process), as a :class:`LaneStats`.
        ``holders``/``waiters`` are this object's; ``unmatched_releases`` counts
        releases that ended nothing (not owned, lease lost, or nothing held) and
        releases whose answer never came (``LaneBackendError``: the hold is no longer
        renewed and its lease lapses), so every hold that leaves ``holders`` is counted
        once, in ``released`` or in ``unmatched_releases``: ``acquired == released +
        unmatched_releases + holders`` at every instant, except while a hold whose lease
        was lost is still held by its caller (it leaves ``holders`` when the loss is
        noticed, and is counted when it is released, or dropped and released by the
        renewer). A hold garbage-collected without
        release stays in ``holders`` (it is still held in Redis) until its renewer's
        release of it has answered, within ``lease_s/3``."""
        outermost = self._outermost()
        with self._lock:
            if outermost:
                self._purge_dropped()
            return LaneStats(
                acquired=self.acquired,
                released=self.released,
                timeouts=self.timeouts,
                rejected=self.rejected,
                cancelled=self.cancelled,
                evicted=0,
                unmatched_releases=self.unmatched,
                holders=self._n_live,
                waiters=self._waiting,
            )

    def statistics(self) -> LaneStats:
        """Same as :attr:`stats` (the trio/anyio spelling)."""
        return self.stats

    def _local_active(self) -> dict[str, float]:
        now = time.monotonic()
        outermost = self._outermost()
        with self._lock:
            if outermost:
                self._purge_dropped()
            out: dict[str, float] = {}
            for key, entries in self._holds.items():
                for entry in entries:
                    h = entry()
                    if h is not None and not h.lost:
                        out[key] = now - h._since
                        break
            return out

    def _count_outcome(self, *, timed_out: bool = False, rejected: bool = False,
                       cancelled: bool = False) -> None:
        with self._lock:
            if rejected:  # a refusal is not a timeout (LaneStats)
                self.rejected += 1
            elif timed_out:
                self.timeouts += 1
            elif cancelled:
                self.cancelled += 1

    def _limits(self) -> dict[str, Any]:
        return {}

    def _object_counts(self) -> dict[str, Any]:
        """The kind's counts of THIS object in ``status()`` (``sessions``/``available``,
        as the in-process lanes' ``status()`` has them)."""
        return {}

    def __repr__(self) -> str:
        extra = "".join(f" {k}={v}" for k, v in self._limits().items())
        return (
            f"<{type(self).__name__} {self.name!r} prefix={self.prefix!r}{extra} "
            f"lease_s={self.lease_s} held_here={self._n_live} waiting_here={self._waiting}>"
        )


def renewal(
    ref: Callable[[], RedisLaneBase[Any] | None], sleep: Callable[[float], Any]
) -> Steps[None]:
    """The renewer of one lane object (``ref``: a weak reference to it), as steps: a round
    of renewals, then ``sleep`` (the face's), until the lane object is gone or has had no
    live hold for a whole lease. Holds only the weak reference between rounds, so a lane
    object that is dropped lets its renewer end."""
    while True:
        lane = ref()
        if lane is None:
            return
        pause = yield from lane._renew_round()
        del lane
        if pause is None:
            return
        yield sleep, (pause,)


def _loss_cause(hold: RedisHoldBase) -> str:
    """Why ``hold``'s lease reads lost now, in words (stored as ``hold._lost`` when the
    loss is first noticed, for its LeaseLostError): its own deadline passed without a
    confirmed renewal; else its process's presence connection died (see _presence.py);
    else the server refused it (no longer had it)."""
    if time.monotonic() >= hold._expires:
        return "it ran out before a renewal was confirmed (a renewal failed or came too late)"
    p = hold._presence
    if p is not None and p.dead:
        return ("this process's presence connection to the server died (it failed, or a "
                f"ping went unanswered for {PONG_TIMEOUT_S:g} s), so the server may give the "
                "key to a waiter at once")
    return ("the server no longer had it (its lease ran out there, or the key was removed "
            "from Redis)")
