"""Wake-ups for waiters, multiplexed: the waiters of one process share one connection (C28).

One job: deliver "you were handed the key" to the thread or task that waits for it,
without any waiter holding a connection while it waits.

The hand-off script publishes the granted waiter's owner id on its process's channel,
``lq:wake:<process token>`` (an owner id starts with the 10-character token of the process
that drew it: :func:`owner_id`). Each process subscribes to its channel ONCE per client
(thread face: one listener thread; asyncio face: one listener task per event loop), on a
connection of its own, and sets the local event of the waiter named in the message. The
listener is started (and subscribed) by the first call that may wait, before its acquire
script is sent (:meth:`SyncWaker.listen`): a hand-off published to a channel nobody
listens to yet would be lost. A
waiter registers its event once its first acquire script has put it in line; a wake-up
that arrives before that (the key was handed to it at once) is kept for it (the last
4096 such ids). A message lost (the listener reconnecting) costs one poll of
latency: every waiter re-checks at least every poll.

Classic pub/sub reaches every node of a Redis Cluster, so this also works there; a client
that cannot subscribe (no ``pubsub``) leaves its waiters polling.

The listener also owns the process's bound on concurrent script calls per client
(``slots``): however many threads or tasks wait, at most that many script calls run at
once, so 10,000 waiters fit redis-py's default pool of 100. Releases and withdrawals
have a bound of their own (``freeing``, :data:`FREEING_CALLS` calls, in both faces): a
call that frees a key or permit never waits behind the acquires and polls of the
waiters it would let in. The thread face runs its calls on connections of its own; the
asyncio face takes them from the client's pool, so there the two bounds together never
exceed the pool's ``max_connections`` (:func:`async_bounds`): any pool works, down to 1.
A waiter's poll that waits for its turn is overtaken by its own grant: when a wake-up
carrying a full lease reaches it first, the poll leaves the line unsent and the waiter
holds at once (:meth:`AsyncWaker.poll_turn`; the thread face sends nothing once its turn
comes, :meth:`SyncWaker.take_token`). How late the polls run is measured
(:class:`Lateness`) and lengthens the waiters' liveness windows.
"""

from __future__ import annotations

import asyncio
import gc
import logging
import os
import queue
import threading
import time
import weakref
from collections import deque
from collections.abc import Callable
from typing import Any, NamedTuple

from .._core import at_fork_in_child
from ._args import call_wait
from ._link import factory, sibling_async, sibling_sync

__all__ = [
    "AsyncSlots", "AsyncWaker", "Gate", "Lateness", "Signal", "Slots", "SyncWaker", "Woken",
    "async_bounds", "async_waker", "owner_id", "sync_waker",
]

log = logging.getLogger("lanequeue.redis")

_token = os.urandom(5).hex()
#: Script calls one process runs at once per client (at most; below the pool's size).
MAX_CALLS = 8
#: Releases and withdrawals (the calls that free a key or permit) run on this many
#: connections of their own, never waiting behind acquires and polls (both faces).
FREEING_CALLS = 4


def _new_token() -> None:
    global _token
    _token = os.urandom(5).hex()


def owner_id() -> str:
    """A fresh owner id for ONE acquisition: the process token (10 hex) + 60 random bits
    (10 hex); no ':' inside."""
    return _token + os.urandom(5).hex()


def channel() -> str:
    return f"lq:wake:{_token}"


def _pool_size(client: Any) -> int | None:
    """The ``max_connections`` of ``client``'s pool, or None (no pool, or no bound)."""
    pool = getattr(client, "connection_pool", None)
    n = getattr(pool, "max_connections", None)
    return n if isinstance(n, int) and n > 0 else None


def _calls(client: Any) -> int:
    n = _pool_size(client)
    return MAX_CALLS if n is None else max(1, min(MAX_CALLS, n))


def async_bounds(pool_size: int | None) -> tuple[int, int]:
    """(calls, freeing): the asyncio face's bounds on script calls in flight per client,
    which take their connections from a pool of ``pool_size`` (None: unbounded). Both
    together never exceed ``pool_size``: :data:`MAX_CALLS` and :data:`FREEING_CALLS`
    when it has room for both, else the pool split between them (releases and
    withdrawals at most half); a pool of 1 has one bound for every call (``freeing`` 0:
    releases share ``calls``)."""
    if pool_size is None or pool_size >= MAX_CALLS + FREEING_CALLS:
        return MAX_CALLS, FREEING_CALLS
    freeing = min(FREEING_CALLS, pool_size // 2)
    return pool_size - freeing, freeing


def _keep_early(early: dict[str, int], owner: str, token: int) -> None:
    """Keep a wake-up whose waiter has not registered yet (the latest 4096)."""
    early[owner] = token
    if len(early) > 4096:
        del early[next(iter(early))]


class Woken(NamedTuple):
    """What a waiter's poll returns instead of the acquire script's reply when a wake-up
    carrying a grant (a full lease, fencing token ``token``) reached the waiter while the
    poll waited for its turn among the process's calls in flight: nothing was sent, the
    waiter holds."""

    token: int


class Lateness:
    """How late this process's waiters' polls run, in seconds: the largest lateness seen
    recently, halving every :attr:`HALF_LIFE_S` seconds.

    A poll is late by the time from the instant its waiter meant to send it (its wait
    ended) to its reply, plus the time that wait overran its planned length: the wait for
    a turn among the process's calls in flight (:class:`Slots`, :class:`AsyncSlots`), a
    busy event loop or interpreter, a slow server. Every call's wait for that turn is
    noted too, as it ends, so a queue that grows lengthens the windows of the polls sent
    next, before any poll has run late. A waiter's liveness window counts it
    (see ``RedisLaneBase._poll_plan``), so a live waiter whose polls queue behind its own
    process's calls keeps its place in line. Safe from any thread (one tuple, replaced
    whole)."""

    HALF_LIFE_S = 10.0

    __slots__ = ("_last",)

    def __init__(self) -> None:
        self._last = (0.0, 0.0)  # (lateness in s, monotonic time it was seen)

    def note(self, late_s: float, now: float) -> None:
        """A poll ran ``late_s`` seconds late, as seen at ``now`` (monotonic)."""
        if late_s > self.value(now):
            self._last = (late_s, now)

    def value(self, now: float) -> float:
        """The recent lateness at ``now`` (monotonic), seconds (0.0: none seen)."""
        late, at = self._last
        if late <= 0.0:
            return 0.0
        return float(late * 0.5 ** (max(0.0, now - at) / self.HALF_LIFE_S))


def parse(message: str) -> tuple[str, int]:
    """A wake-up message: ``owner`` (handed a claim: confirm it with an acquire) or
    ``owner:token`` (handed a full lease with that fencing token: held at once, no
    confirm round trip). Returns (owner, token or 0)."""
    owner, _, token = message.partition(":")
    return owner, int(token) if token.isdigit() else 0


def _text(v: Any) -> str:
    return v.decode() if isinstance(v, bytes) else str(v)


def _wake_reply(reply: Any) -> tuple[str, int] | None:
    """A reply read off the subscribed connection: the wake-up it carries (see
    :func:`parse`), or None for anything else (a subscribe confirmation, a pong)."""
    if isinstance(reply, list) and len(reply) == 3 and _text(reply[0]) == "message":
        return parse(_text(reply[2]))
    return None


class Gate:
    """A one-shot event (set once, never cleared) safe against an interrupt
    (KeyboardInterrupt) at any point in any of its users, unlike ``threading.Event``
    (an interrupt inside its Condition's wait can leave the Condition's lock released
    twice or held): a lock held until ``set()``, which releases it at most once, and a
    flag. A waiter only takes the lock to look and gives it back; were it interrupted in
    between, the others still see the flag within 50 ms."""

    __slots__ = ("_lock", "_set")

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._lock.acquire()
        self._set = False

    def set(self) -> None:
        if not self._set:
            self._set = True
            self._lock.release()

    def is_set(self) -> bool:
        return self._set

    def wait(self, timeout: float | None = None) -> bool:
        """Wait up to ``timeout`` seconds (None: no limit); True once set."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while not self._set:
            left = 0.05 if deadline is None else min(0.05, deadline - time.monotonic())
            if left <= 0:
                return False
            if self._lock.acquire(timeout=left):
                self._lock.release()
                return True
        return True


class Signal:
    """A waiter's wake-up, safe against an interrupt at any point: a lock that is held
    while no wake-up is pending; ``set()`` releases it (a second ``set()`` before the
    wake-up is taken does nothing), ``take(timeout)`` acquires it (takes the wake-up).
    Both are single C calls: an interrupt can at worst lose one wake-up (one poll of
    latency), never leave a lock that someone else needs."""

    __slots__ = ("_lock",)

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._lock.acquire()

    def set(self) -> None:
        try:
            self._lock.release()
        except RuntimeError:
            pass  # a wake-up is pending already

    def take(self, timeout: float) -> bool:
        return self._lock.acquire(timeout=max(0.0, timeout))


class _Slot:
    """One permit of :class:`Slots` (an object, so a lost one can be seen to be gone),
    with the bare connection its holder runs scripts on (None: use the client's path)."""

    __slots__ = ("__weakref__", "conn")

    def __init__(self, conn: Any) -> None:
        self.conn = conn


class Slots:
    """The thread face's bound on script calls in flight per client, safe against an
    interrupt (KeyboardInterrupt) at any point, unlike ``threading.Semaphore`` (whose
    Python-level acquire/release can leave its lock held or leak a permit).

    The ``n`` permits are objects passed through a C-level queue (``queue.SimpleQueue``:
    its ``get`` and ``put`` are atomic). A permit that an interrupt drops on the floor
    (between ``take`` and ``give``) is freed by the garbage collector; a caller that has
    waited ``HEAL_S`` for a permit (and, at most every ``GC_S``, has run the cyclic
    garbage collector) counts the live ones (weak references) and mints
    replacements for the lost ones, so a lost permit costs a short wait, never a hang.
    Use::

        slot = slots.take()
        try:
            ...
        finally:
            slots.give(slot)
    """

    HEAL_S = 0.25
    #: A caller at the door (see :meth:`take`) wakes this often to heal lost permits and
    #: look for a free one: a door lost to an interrupt costs a delay, never a hang.
    DOOR_S = 5.0
    #: At most one cyclic garbage collection per this many seconds (see :meth:`_heal`).
    GC_S = 5.0

    def __init__(self, n: int, make: Any = None) -> None:
        self.n = n
        self._make = make  # maker of a permit's connection (made on its first use)
        self._free: queue.SimpleQueue[_Slot] = queue.SimpleQueue()
        self._refs: list[weakref.ref[_Slot]] = []
        self._heal_lock = threading.Lock()
        self._door = threading.Lock()
        self._gc_due = 0.0
        for _ in range(n):
            self._mint()

    def _mint(self) -> None:
        slot = _Slot(None)
        self._refs.append(weakref.ref(slot))
        self._free.put(slot)

    def take(self) -> _Slot:
        """A permit; waits as long as all ``n`` are in use (see :meth:`take_by`)."""
        slot = self.take_by(None)
        assert slot is not None
        return slot

    def take_by(self, deadline: float | None) -> _Slot | None:
        """A permit, or None once ``time.monotonic()`` passes ``deadline`` (None: no
        deadline) with all ``n`` still in use.

        When none is free, callers line up at a door (a lock) and only the one inside
        waits for a permit, waking every ``HEAL_S`` to heal lost ones; the others sleep
        on the door without waking. (With every caller waking every ``HEAL_S``, 900
        waiting threads of one process woke 3,600 times a second, and the calls holding
        the permits waited for the interpreter: 8 permits served about 600 calls a
        second, 13 ms a call against 0.1 ms unloaded, in the replay at --speed 600.)"""
        while True:
            try:
                slot = self._free.get_nowait()
                break
            except queue.Empty:
                pass
            door = self.DOOR_S
            if deadline is not None:
                door = min(door, deadline - time.monotonic())
                if door <= 0:
                    return None
            if self._door.acquire(timeout=door):
                try:
                    got = self._wait(deadline)
                finally:
                    self._door.release()
                if got is None:
                    return None
                slot = got
                break
            # A long wait at the door (a long backlog, or a door lost to an interrupt):
            # heal lost permits, look for a free one, and line up again.
            self._heal()
        if slot.conn is None and self._make is not None:
            slot.conn = self._make()
        return slot

    def _wait(self, deadline: float | None) -> _Slot | None:
        while True:
            wait = self.HEAL_S
            if deadline is not None:
                wait = min(wait, deadline - time.monotonic())
                if wait <= 0:
                    return None
            try:
                return self._free.get(timeout=wait)
            except queue.Empty:
                self._heal()

    def give(self, slot: _Slot) -> None:
        self._free.put(slot)

    @property
    def free(self) -> int:
        """Permits not in use now."""
        return self._free.qsize()

    def _heal(self) -> None:
        """Replace the permits that were lost (freed without being given back)."""
        if not self._heal_lock.acquire(blocking=False):
            return
        try:
            self._refs = [r for r in self._refs if r() is not None]
            now = time.monotonic()
            if len(self._refs) == self.n and now >= self._gc_due:
                # A dropped permit may sit in a reference cycle (an interrupt's traceback
                # holds the frame that held it): collect it. At most every GC_S: a full
                # collection in a process with thousands of threads costs tens of ms of
                # the interpreter, which the calls holding the permits wait for.
                self._gc_due = now + self.GC_S
                gc.collect()
                self._refs = [r for r in self._refs if r() is not None]
            for _ in range(self.n - len(self._refs)):
                self._mint()
        finally:
            self._heal_lock.release()


class SyncWaker:
    """The thread face's listener for one client (see the module docstring)."""

    def __init__(self, client: Any) -> None:
        self.pid = os.getpid()
        # Every script call waits at most ``call_wait`` for its reply, also when the
        # client has no socket timeout: a frozen server fails the call, never hangs it.
        wait = call_wait(client)
        self.slots = Slots(_calls(client), factory(client, wait))
        # Releases and withdrawals have permits of their own: behind hundreds of waiters'
        # polls in ``slots`` a release waited up to 82 s (replay at --speed 600), keeping
        # the key or permit it was freeing, so every waiter behind it waited too.
        self.freeing = Slots(FREEING_CALLS, factory(client, wait))
        self.lateness = Lateness()
        self._events: dict[str, Signal] = {}
        self._early: dict[str, int] = {}  # wake-ups that came before their waiter
        self._tokens: dict[str, int] = {}  # grants carried by wake-ups, not yet taken
        self._sibling = sibling_sync(client)
        self._ready = Gate()
        self._started = False
        self._start_failed = False
        self._lock = threading.Lock()

    def expect(self, owner: str) -> None:
        ev = Signal()
        with self._lock:
            self._events[owner] = ev
            token = self._early.pop(owner, None)
            if token is not None:
                if token:
                    self._tokens[owner] = token
                ev.set()

    def _woken(self, owner: str, token: int) -> None:
        with self._lock:
            ev = self._events.get(owner)
            if ev is None:
                _keep_early(self._early, owner, token)
            elif token:
                self._tokens[owner] = token
        if ev is not None:
            ev.set()

    @property
    def count(self) -> int:
        """Waiters registered now."""
        return len(self._events)

    def forgets(self) -> tuple[Callable[[str, None], object], ...]:
        """The calls that forget a waiter, each ``fn(owner, None)``: its event, then a
        grant a wake-up carried to it and nobody took (C calls: see
        ``RedisLaneBase._forgets``)."""
        return self._events.pop, self._tokens.pop

    def take_token(self, owner: str) -> int:
        """The fencing token of a grant a wake-up carried to ``owner`` and nobody has
        taken yet (0: none); taken by this call."""
        with self._lock:
            return self._tokens.pop(owner, 0)

    @property
    def listening(self) -> bool:
        """True once the listener was started (see :meth:`listen`)."""
        return self._started

    def listen(self) -> None:
        """Start the listener and wait (at most 2 s) until it is subscribed. A waiter
        calls it BEFORE its first acquire script: a hand-off published before the
        subscription would be lost and cost the waiter a whole poll."""
        if not self._started:
            self._start()

    def wait(self, owner: str, block: float) -> int:
        """Block until ``owner`` is woken or ``block`` seconds have passed; the fencing
        token of a grant the wake-up carried (a full lease: see :func:`parse`), else 0."""
        if not self._started:
            self._start()
        ev = self._events.get(owner)
        if ev is None or self._sibling is None:
            time.sleep(block)
            return 0
        ev.take(block)
        with self._lock:
            return self._tokens.pop(owner, 0)

    def _start(self) -> None:
        with self._lock:
            if self._started:
                return
            self._started = True
        if self._sibling is None:
            return
        try:
            threading.Thread(target=self._listen, args=(weakref.ref(self),),
                             name="lanequeue-wake", daemon=True).start()
        except RuntimeError as exc:  # "can't start new thread": out of threads
            # Waiters poll meanwhile (their bounded waits); the next one tries again.
            self._started = False
            if not self._start_failed:  # logged once until a start succeeds
                self._start_failed = True
                log.warning("the Redis wake-up listener could not start (%s); waiters "
                            "poll until it can", exc)
            return
        self._start_failed = False
        self._ready.wait(2.0)  # subscribed (or gave up for now: waiters poll)

    @staticmethod
    def _listen(ref: weakref.ref[SyncWaker]) -> None:
        me = ref()
        if me is None:
            return
        # Only ``ref`` reaches the waker (no bound method of it is kept here): when its
        # client is dropped, the waker goes and this thread ends within a read timeout,
        # closing its connection. (A cluster client is its own sibling, which this
        # thread holds: such a client and its listener last as long as the process.)
        sibling, ready = me._sibling, me._ready
        del me
        while ref() is not None:
            ps = None
            try:
                ps = sibling.pubsub(ignore_subscribe_messages=True)
                ps.subscribe(channel())
                while ps.get_message(timeout=0.5) is None and not ps.subscribed:
                    pass
                ready.set()
                conn = ps.connection
                while ref() is not None:
                    # The subscribed connection read directly (RESP2 or RESP3): PubSub's
                    # get_message adds a health check, a retry wrapper and a message
                    # dict per wake-up, a third of the listener's CPU per hand-off. An
                    # error (a dropped connection) ends this subscription: resubscribe.
                    if not conn.can_read(timeout=1.0):
                        continue
                    got = _wake_reply(conn.read_response(
                        disconnect_on_error=False, push_request=True))
                    if got is not None:
                        me = ref()
                        if me is None:
                            break
                        me._woken(*got)
                        del me
            except Exception as exc:
                ready.set()
                log.debug("wake-up listener: %s; reconnecting", exc)
                time.sleep(0.2)
            finally:
                if ps is not None:
                    try:
                        ps.close()
                    except Exception:  # pragma: no cover - closing a broken socket
                        pass


class AsyncSlots:
    """The asyncio face's bound on script calls in flight per client: ``n`` permits,
    handed out in the order they were asked for (``async with slots``), where a waiter's
    poll may leave the line when its own grant overtakes it (:meth:`AsyncWaker.poll_turn`).
    Every call from the event loop's thread."""

    __slots__ = ("n", "_free", "_line", "_lateness")

    #: What a place in line is given: a permit (a waiter's poll may be given a fencing
    #: token instead, see :meth:`AsyncWaker.poll_turn`).
    HANDED = 0

    def __init__(self, n: int, lateness: Lateness | None = None) -> None:
        self.n = n
        self._free = n
        self._line: deque[asyncio.Future[int]] = deque()
        self._lateness = lateness  # told how long each call waited for its permit

    @property
    def free(self) -> int:
        """Permits not in use now."""
        return self._free

    def locked(self) -> bool:
        """True when no permit is free (a call would wait), as ``asyncio.Semaphore``."""
        return self._free == 0

    def try_take(self) -> bool:
        """Take a permit if one is free now (True); never waits."""
        if self._free > 0:
            self._free -= 1
            return True
        return False

    async def acquire(self) -> bool:
        """Take a permit, waiting in line for it; True (as ``asyncio.Semaphore``)."""
        if not self.try_take():
            await self.wait(asyncio.get_running_loop().create_future())
        return True

    async def wait(self, place: asyncio.Future[int]) -> int:
        """Wait in line with the future ``place`` until it is given a permit (returns
        :attr:`HANDED`: the caller releases it) or set by someone else (returns what it
        was set to; no permit taken). Cancelled after a permit was handed: passed on.
        The wait for a permit is noted as lateness (see :class:`Lateness`)."""
        self._line.append(place)
        since = time.monotonic()
        try:
            got = await place
        except asyncio.CancelledError:
            if place.done() and not place.cancelled() and place.result() == self.HANDED:
                self.release()
            raise
        if got == self.HANDED and self._lateness is not None:
            now = time.monotonic()
            self._lateness.note(now - since, now)
        return got

    def release(self) -> None:
        """Give a permit back: to the first in line still waiting, else free."""
        line = self._line
        while line:
            place = line.popleft()
            if not place.done():
                place.set_result(self.HANDED)
                return
        self._free += 1

    async def __aenter__(self) -> None:
        await self.acquire()

    async def __aexit__(self, *exc: object) -> None:
        self.release()


class AsyncWaker:
    """The asyncio face's listener for one client on one event loop."""

    def __init__(self, client: Any) -> None:
        self.lateness = Lateness()
        # Both bounds take their connections from the client's pool: together they stay
        # within its max_connections (else the pool raises MaxConnectionsError).
        calls, freeing = async_bounds(_pool_size(client))
        self.slots = AsyncSlots(calls, self.lateness)
        # Per waiter whose poll waits in ``slots``' line: its place, which a wake-up
        # carrying a grant fills with the fencing token (see poll_turn).
        self._polls: dict[str, asyncio.Future[int]] = {}
        #: A script call's longest wait for its reply (connecting included), in seconds.
        self.call_wait_s = call_wait(client)
        # Releases and withdrawals: a bound of their own, as in the thread face (behind
        # a backlog of acquires in ``slots``, a release kept the key it was freeing);
        # on a pool of one connection, the same bound.
        self.freeing = asyncio.Semaphore(freeing) if freeing else self.slots
        self._events: dict[str, asyncio.Event] = {}
        self._early: dict[str, int] = {}  # wake-ups that came before their waiter
        self._tokens: dict[str, int] = {}  # grants carried by wake-ups, not yet taken
        self._sibling = sibling_async(client)
        self._task: asyncio.Task[None] | None = None
        self._ready: asyncio.Event | None = None

    def expect(self, owner: str) -> None:
        ev = self._events[owner] = asyncio.Event()
        token = self._early.pop(owner, None)
        if token is not None:
            if token:
                self._tokens[owner] = token
            ev.set()

    @property
    def count(self) -> int:
        """Waiters registered now."""
        return len(self._events)

    def forgets(self) -> tuple[Callable[[str, None], object], ...]:
        """The calls that forget a waiter, each ``fn(owner, None)``: its event, then a
        grant a wake-up carried to it and nobody took (C calls: see
        ``RedisLaneBase._forgets``)."""
        return self._events.pop, self._tokens.pop

    async def poll_turn(self, owner: str) -> int:
        """Wait for the turn of ``owner``'s poll among the calls in flight: 0 once a permit
        of ``slots`` is taken (the caller releases it); or, when a wake-up carrying a grant
        reaches ``owner`` first (or had already), that grant's fencing token, with no
        permit taken: the poll leaves the line at once. A poll that waited for a permit
        while its waiter was handed the key would otherwise keep the key (or permit) idle
        until the permit came: seconds, with a backlog of polls (replay at --speed 600)."""
        token = self._tokens.pop(owner, 0)
        if token:
            return token
        if self.slots.try_take():
            return 0
        place: asyncio.Future[int] = asyncio.get_running_loop().create_future()
        self._polls[owner] = place
        try:
            got = await self.slots.wait(place)
        finally:
            # (One C call that stores: a lookup before it was a point where an interrupt
            # left the place here. The owner's polls come one at a time: it is ours.)
            self._polls.pop(owner, None)
        if got:
            self._tokens.pop(owner, None)
        return got

    @property
    def listening(self) -> bool:
        """True while the listener task runs and is subscribed (or gave up for now)."""
        task, ready = self._task, self._ready
        return (self._sibling is None or (task is not None and not task.done()
                and ready is not None and ready.is_set()))

    async def listen(self) -> None:
        """Start the listener task if it is not running and wait (at most 2 s) until it
        is subscribed (see :meth:`SyncWaker.listen`)."""
        if self._task is None or self._task.done():
            self._start()
        ready = self._ready
        if ready is not None and not ready.is_set():
            try:
                await asyncio.wait_for(ready.wait(), 2.0)
            except (asyncio.TimeoutError, TimeoutError):
                pass

    async def wait(self, owner: str, block: float) -> int:
        """Wait until ``owner`` is woken or ``block`` seconds have passed; the token of
        a grant the wake-up carried, else 0 (see :meth:`SyncWaker.wait`)."""
        await self.listen()
        ev = self._events.get(owner)
        if ev is None or self._sibling is None:
            await asyncio.sleep(block)
            return 0
        try:
            await asyncio.wait_for(ev.wait(), block)
        except (asyncio.TimeoutError, TimeoutError):
            pass
        ev.clear()
        return self._tokens.pop(owner, 0)

    def _start(self) -> None:
        if self._sibling is None:
            return
        self._ready = asyncio.Event()
        self._task = asyncio.get_running_loop().create_task(
            AsyncWaker._listen(weakref.ref(self)), name="lanequeue-wake"
        )

    @staticmethod
    async def _listen(ref: weakref.ref[AsyncWaker]) -> None:
        # As SyncWaker._listen: the task keeps no reference to the waker, so a dropped
        # client's waker goes and this task ends within a read timeout.
        me = ref()
        if me is None:
            return
        sibling, events, early, tokens, polls, ready = (
            me._sibling, me._events, me._early, me._tokens, me._polls, me._ready
        )
        del me
        assert ready is not None
        while ref() is not None:
            ps = None
            try:
                ps = sibling.pubsub(ignore_subscribe_messages=True)
                await ps.subscribe(channel())
                while await ps.get_message(timeout=0.5) is None and not ps.subscribed:
                    pass
                ready.set()
                while ref() is not None:
                    msg = await ps.get_message(timeout=1.0)
                    if msg is not None and msg.get("type") == "message":
                        owner, token = parse(_text(msg["data"]))
                        ev = events.get(owner)
                        if ev is not None:
                            if token:
                                tokens[owner] = token
                                # Its poll waiting for a permit leaves the line: it holds.
                                place = polls.get(owner)
                                if place is not None and not place.done():
                                    place.set_result(token)
                            ev.set()
                        else:
                            _keep_early(early, owner, token)
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                ready.set()
                log.debug("wake-up listener: %s; reconnecting", exc)
                await asyncio.sleep(0.2)
            finally:
                if ps is not None:
                    try:
                        await ps.aclose()
                    except BaseException:  # pragma: no cover - closing a broken socket
                        pass


_sync: weakref.WeakKeyDictionary[Any, SyncWaker] = weakref.WeakKeyDictionary()
_sync_lock = threading.Lock()
_async: weakref.WeakKeyDictionary[
    asyncio.AbstractEventLoop, weakref.WeakKeyDictionary[Any, AsyncWaker]
] = weakref.WeakKeyDictionary()


def _after_fork() -> None:
    """In a forked child: a new process token (its own wake-up channel), a fresh lock (a
    parent thread may have held it at the fork), and no listener of the parent's (their
    threads, tasks, connections and registered waiters are not the child's)."""
    global _sync_lock
    _new_token()
    _sync_lock = threading.Lock()
    _sync.clear()
    _async.clear()


at_fork_in_child(_after_fork)


def sync_waker(client: Any) -> SyncWaker:
    """This process's listener for ``client`` (made on first use; anew after fork)."""
    w = _sync.get(client)
    if w is None or w.pid != os.getpid():
        with _sync_lock:
            w = _sync.get(client)
            if w is None or w.pid != os.getpid():
                w = _sync[client] = SyncWaker(client)
    return w


#: The event loop and process each redis.asyncio client was first used in by a lane (see
#: async_waker). Kept across a fork: the child must not use the parent's client.
_client_loop: weakref.WeakKeyDictionary[
    Any, tuple[weakref.ref[asyncio.AbstractEventLoop], int]] = weakref.WeakKeyDictionary()


def async_waker(client: Any) -> AsyncWaker:
    """The running loop's listener for ``client`` (made on first use). Every script call
    of an asyncio Redis lane asks for it first, so this is where a client is bound to
    the event loop and the process of its first use. Raises RuntimeError, before any I/O,
    when ``client`` was used by a lane on another event loop (its pooled connections
    belong to that loop: redis-py would fail with "attached to a different loop" or
    "Event loop is closed", and could leave the other loop's calls broken), or in the
    parent of this forked process (its connections are shared with the parent: a call
    here could take the reply of the parent's)."""
    loop = asyncio.get_running_loop()
    per_loop = _async.get(loop)
    if per_loop is None:
        per_loop = _async[loop] = weakref.WeakKeyDictionary()
    w = per_loop.get(client)
    if w is None:
        pid = os.getpid()
        seen = _client_loop.get(client)
        if seen is not None:
            old = seen[0]()
            if seen[1] != pid:
                raise RuntimeError(
                    f"this redis.asyncio client was used by a lane in process {seen[1]}, "
                    f"not in this forked child ({pid}): its connections are shared with "
                    f"that process; make the client and its lanes in the child")
            if old is not None and old is not loop:
                raise RuntimeError(
                    "this redis.asyncio client was used by a lane on another event loop"
                    + (" that is closed now" if old.is_closed() else " that is still open")
                    + "; its connections belong to that loop: make the client and its "
                    "lanes in the event loop that uses them (one per loop, one per "
                    "asyncio.run)")
        _client_loop[client] = (weakref.ref(loop), pid)
        w = per_loop[client] = AsyncWaker(client)
    return w
