"""The thread face of the Redis lanes: :class:`RedisSessionLane` and :class:`RedisLane`.

A caller that must wait blocks on its wake-up from the process's listener thread
(:mod:`._wake`; bounded, then re-checks: see the package docstring), holding no
connection; a daemon thread per lane object renews the leases of the
holds that object has granted. Any thread may acquire and any thread may release.

Every decision is the core's (:mod:`._protocol`); this face only runs its procedures
with blocking I/O (:func:`drive`) and starts the renewer thread.
"""

from __future__ import annotations

import logging
import os
import sys
import threading
import time
import weakref
from _thread import allocate_lock
from asyncio.events import _get_running_loop
from collections.abc import Callable
from inspect import GEN_CLOSED, getgeneratorstate
from types import TracebackType
from typing import Any, Literal

import redis
from redis.cluster import RedisCluster

from .._core import at_fork_in_child
from .._errors import NotOwnerError
from .._kinds import LANE_DEFAULT
from .._ops import CANCEL_WAIT_S, note_cancel_wait, noted_cancel_wait, poll_idle
from .._validate import check_bool, check_timeout
from ..contract import not_held_error
from ..dispatch._workers import Service
from ._link import SyncLink
from ._ops import RedisOps
from ._protocol import (
    LATER_MAX,
    Call,
    RedisHoldBase,
    RedisLaneBase,
    Step,
    Steps,
    T,
    renewal,
)
from ._views import CountingLaneBase, SessionLaneBase
from ._wake import Gate, Slots, SyncWaker, Woken, _Slot, sync_waker
from ._wire import info_sync, publish_probe_sync, run_sync

__all__ = ["RedisHold", "RedisLane", "RedisSessionLane"]

log = logging.getLogger("lanequeue.redis")


def drive(steps: Steps[T]) -> T:
    """Run a core procedure to its end, doing each step's I/O (blocking) and sending back
    its reply, or throwing in what it raised. An exception that arrives anywhere while the
    procedure waits for its I/O (KeyboardInterrupt) is thrown in too, so it cleans up."""
    send: Callable[[Any], Step] = steps.send
    reply: Any = None
    while True:
        try:
            # The loop of steps is inside the try: its back-edge checks for signals, and
            # an interrupt there (after a step's I/O, its reply in hand) must be thrown
            # in too, not escape with the procedure left suspended (a grant it just got
            # would be nobody's until its lease ran out).
            while True:
                (fn, args), reply = send(reply), None
                reply, send = fn(*args), steps.send
        except StopIteration as stop:
            result: T = stop.value
            return result
        except BaseException as exc:
            if getgeneratorstate(steps) == GEN_CLOSED:
                raise  # the procedure itself raised it
            reply, send = exc, steps.throw


# -- clean-ups that a second interrupt cannot stop ------------------------------------------
# A clean-up after an interrupt (an interrupted acquire's withdraw, and the release of a
# grant it finds) runs in a thread of the process's clean-up service, which no signal
# handler interrupts (they run in the main thread), and its caller waits for it at most
# CANCEL_WAIT_S: a second Ctrl-C while it runs ends that wait, not the clean-up. Handing
# it over is one C call (the service's ``post``), so a second interrupt lands before it
# (within the few instructions from the first interrupt to the hand-over: that clean-up
# is then lost, its grant left to its lease) or after it (the clean-up runs in full).

_cleanups: Service | None = None


def _start_cleanups() -> None:
    """Make this process's clean-up service if there is none (a forked child makes its
    own). Called by a lane object's first call in the process (its wake-up listener is
    made then too), never on an interrupt's path: starting a thread waits until it runs
    (milliseconds on a busy machine), a window in which a second interrupt would stop
    the clean-up."""
    global _cleanups
    if _cleanups is None:
        try:
            # Its first worker now, in this call (a worker stays once started), not when
            # the first clean-up comes: a process out of threads by then would leave
            # that clean-up queued for a worker that never comes.
            service = Service(max_threads=2, name="lanequeue-redis-cleanup", min_threads=1)
        except RuntimeError:  # "can't start new thread": clean-ups run in their callers
            return
        _cleanups = service


def _renewer(ref: weakref.ref[_SyncFace]) -> None:
    """The renewer thread of one lane object (``ref``: weak). It claims the renewer's
    place first (:meth:`RedisLaneBase._claim_renewer`; another renewer of this process
    has it: this one ends at once), so a start that an interrupt stopped claims nothing
    and the next grant starts one; it renews until the object is gone or idle for a
    lease, and gives its place up however it ends."""
    lane = ref()
    claim = 0 if lane is None else lane._claim_renewer()
    del lane
    if not claim:
        return
    try:
        drive(renewal(ref, time.sleep))
    finally:
        lane = ref()
        if lane is not None:
            lane._renewer_stopped(claim)


# Background clean-ups nobody waits for (a failed acquire's withdraw: see
# RedisLaneBase._later), on a service of their own (one thread), so that a burst of them
# in an outage, each up to a call's bound, never delays an interrupt's clean-ups.
_later_service: Service | None = None
_later_lock = threading.Lock()
_later_running = 0  # posted and not finished (at most LATER_MAX)


def _run_later(steps: Steps[None]) -> None:
    """(In the background service) drive ``steps`` to its end, best effort."""
    global _later_running
    try:
        drive(steps)
    except BaseException as exc:  # (the procedure catches its own; this is a last net)
        log.debug("a background clean-up ended with %r", exc)
    finally:
        with _later_lock:
            _later_running -= 1


def _post_later(steps: Steps[None]) -> None:
    """Post ``steps`` to the background service (started on first use), unless it runs
    LATER_MAX already or no thread can be started: then ``steps`` is closed unrun."""
    global _later_service, _later_running
    with _later_lock:
        if _later_running >= LATER_MAX:
            steps.close()
            return
        if _later_service is None:
            try:
                _later_service = Service(max_threads=1, name="lanequeue-redis-later")
            except RuntimeError:  # out of threads: best effort, so nothing
                steps.close()
                return
        _later_running += 1
    _later_service.post((_run_later, steps))


def _forget_cleanups() -> None:
    global _cleanups, _later_service, _later_lock, _later_running
    _cleanups = None  # the parent's service thread does not exist in a forked child
    _later_service = None
    _later_lock = threading.Lock()
    _later_running = 0


at_fork_in_child(_forget_cleanups)


def _finish_aside(box: list[Any]) -> None:
    """(In a clean-up thread) drive ``box[0]`` to its end, then mark the box done
    (``box[0] = None``) and wake the callers waiting on the locks after it."""
    try:
        drive(box[0])
    except BaseException as exc:  # (its caller stopped waiting, or sees its own error)
        log.debug("a clean-up after an interrupt ended with %r", exc)
    finally:
        box[0] = None
        for done in box[1:]:
            try:
                done.release()
            except RuntimeError:  # its caller was interrupted before it locked it
                pass


def _run_aside(steps: Steps[None], interrupt: BaseException | None = None) -> None:
    """Run the clean-up ``steps`` in the clean-up service and wait for it at most
    :data:`~lanequeue._ops.CANCEL_WAIT_S` (an interrupt ends the wait; the clean-up goes
    on). Without a service (none could be started), in the caller.

    ``interrupt``: the interrupt being handled. A clean-up of an interrupt notes on it
    how long its wait took (:func:`~lanequeue._ops.note_cancel_wait`); a later one of
    the same interrupt (the
    lanes an ``acquire_all`` gives back after its wait was interrupted, an enclosing
    ``with`` block) waits only what is left of that CANCEL_WAIT_S. A new interrupt that
    ends the wait carries the same time on."""
    service = _cleanups
    if service is None:
        drive(steps)
        return
    now = time.monotonic()
    began = noted_cancel_wait(interrupt, now)
    if began is None:
        began = now
    wait = max(0.0, CANCEL_WAIT_S - (now - began))
    post = service.post
    box: list[Any] = [steps]
    post((_finish_aside, box))  # -- the hand-over: one C call --
    done = allocate_lock()
    done.acquire()
    box.append(done)
    if box[0] is not None:  # not finished yet (a finisher that got here first woke nobody)
        try:
            done.acquire(timeout=wait)
        except BaseException as again:  # a new interrupt ends the wait: it says how
            note_cancel_wait(again, began, time.monotonic())  # long, for the next block
            if interrupt is not None:
                note_cancel_wait(interrupt, began, time.monotonic())
            raise
    if interrupt is not None:
        note_cancel_wait(interrupt, began, time.monotonic())


#: The same-key sequencer's one-shot event (see :class:`~._wake.Gate`).
_Turn = Gate


class RedisHold(RedisHoldBase):
    """A hold on a thread Redis lane; a context manager made by ``lane.acquire(key)``.

    Entering waits for the grant (up to the ``timeout_s`` given to ``acquire``) and raises
    :class:`~lanequeue.LaneTimeoutError` if it does not come; leaving releases. Single use.

    ``release()`` returns True when it ended the hold. It raises
    :class:`~lanequeue.NotOwnerError` when the hold is not this acquisition's (any more):
    never granted, released already, ended by ``manual_release(key)``, or its lease ran
    out and the key may have moved on (:class:`~lanequeue.LeaseLostError`, a
    NotOwnerError, whether the loss was known before the release was sent or learnt from
    the server's answer); the real owner's hold is never touched. Leaving the
    ``with`` block after an early release is silent; otherwise it raises the same errors,
    unless the block itself raised (then the release error is logged and the block's
    exception propagates).
    """

    __slots__ = ()

    lane: _SyncFace

    def __enter__(self) -> RedisHold:
        drive(self.lane._enter(self))
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        steps = self.lane._exit(self, exc_type is not None)
        if exc_type is not None and not issubclass(exc_type, Exception):
            # Left by an interrupt (Ctrl-C): the release runs aside, waited for at most
            # CANCEL_WAIT_S (its error, if any, is logged: the interrupt propagates).
            _run_aside(steps, exc)
        else:
            drive(steps)

    def release(self) -> bool:
        """End this hold (see the class docstring for the return value and errors).

        Called while an interrupt is being handled (in an ``except KeyboardInterrupt``
        block, or by ``acquire_all`` giving back its lanes as one propagates), it waits
        for the server at most :data:`~lanequeue._ops.CANCEL_WAIT_S` and returns True:
        the release goes on in the background if it has not ended (what it raises
        then is logged; a hold it could not release lapses with its lease)."""
        return self._release_during(_interrupt_handled())

    def _release_during(self, interrupt: BaseException | None) -> bool:
        """:meth:`release` while ``interrupt`` (not an ``Exception``) propagates, or
        None: as when it is being handled (``acquire_all`` giving back its lanes passes
        the interrupt that left its block, which ``sys.exc_info()`` does not show when
        ``contextlib.ExitStack`` calls it)."""
        if interrupt is not None:
            # (its errors logged, as leaving does)
            _run_aside(self.lane._exit(self, True), interrupt)
            return True
        if not drive(self.lane._release(self)):
            raise not_held(self)
        return True


def _interrupt_handled() -> BaseException | None:
    """The exception this thread handles if it is not an ``Exception`` (a
    KeyboardInterrupt, a SystemExit), else None: a release then must not keep it for a
    frozen server's whole bound."""
    handled = sys.exc_info()[1]
    return None if handled is None or isinstance(handled, Exception) else handled


def not_held(hold: RedisHoldBase) -> NotOwnerError:
    """``hold.release()`` found the hold not held: count it, and the error to raise."""
    lane: RedisLaneBase[Any] = hold.lane
    if not hold.token:
        return not_held_error(lane.name, hold.key, 0, "it was never granted")
    with lane._lock:
        lane.unmatched += 1
    return not_held_error(
        lane.name, hold.key, hold.token, "it was released already (or by manual_release)"
    )


class _SyncFace(RedisOps[RedisHold]):
    """Acquire/release for threads over either kind of Redis lane: the core's procedures,
    run with blocking I/O; one daemon renewer thread per lane object."""

    _hold_class = RedisHold
    face: Literal["threads"] = "threads"
    _client_types = (redis.Redis, RedisCluster)
    _client_hint = "a redis.Redis (or redis.cluster.RedisCluster) client"
    _link: SyncLink | None = None
    _waker: SyncWaker | None = None

    def _wk(self) -> SyncWaker:
        w = self._waker
        if w is None or w.pid != os.getpid():
            # A lane object's first call in this process: before any clean-up can be
            # needed, the clean-up service exists (see _start_cleanups).
            _start_cleanups()
            w = self._waker = sync_waker(self._client)
        return w

    def _run(self, op: str, key: str | None, call: Call) -> Any:
        script, keys, args = call
        wk = self._wk()
        # The process's bound on calls in flight per client; releases and withdrawals
        # have their own, so they never queue behind acquires and polls (see _wake).
        slots = wk.freeing if op == "release" or op == "withdraw" else wk.slots
        slot = self._take_slot(wk, slots)
        try:
            if op == "acquire":
                # A waiter's poll: a grant that reached it while it waited for the permit
                # leaves nothing to send.
                token = wk.take_token(args[0])
                if token:
                    return Woken(token)
            return run_sync(self._client, script, keys, args, slot.conn)
        finally:
            slots.give(slot)

    @staticmethod
    def _take_slot(wk: SyncWaker, slots: Slots) -> _Slot:
        """A permit of ``slots``; a wait for a permit of the general bound is noted as
        lateness (see :class:`~._wake.Lateness`)."""
        if slots is not wk.slots:
            return slots.take()
        since = time.monotonic()
        slot = slots.take()
        now = time.monotonic()
        if now - since > 0.001:
            wk.lateness.note(now - since, now)
        return slot

    def _on_slot(self, call: Callable[[Any, Any], Any]) -> Any:
        """``call(client, conn)`` on one of the bounded calls in flight (its slot's
        connection), as the server checks make theirs."""
        wk = self._wk()
        slots = wk.slots
        slot = self._take_slot(wk, slots)
        try:
            return call(self._client, slot.conn)
        finally:
            slots.give(slot)

    def _memory_info(self) -> Any:
        return self._on_slot(lambda client, conn: info_sync(client, "memory", conn))

    def _publish_probe(self) -> Any:
        return self._on_slot(publish_probe_sync)

    def _expect(self, owner: str) -> None:
        self._wk().expect(owner)

    def _forgets(self) -> tuple[Callable[[str, None], object], ...]:
        return self._wk().forgets()

    def _wait_wake(self, owner: str, block: float) -> int:
        if not self._warned_loop and _get_running_loop() is not None:
            self._warn_loop()  # (see LoopWaitWarner in lanequeue._ops)
        token = self._wk().wait(owner, self._ops_block(owner, block))
        self._ops_woke(owner)  # raises when clear/drain ended this wait
        return token

    def _ops_wake(self, owner: str) -> None:
        self._wk()._woken(owner, 0)  # no grant: clear/drain ended the wait

    def _local_waiters(self) -> int:
        return self._wk().count

    def _aside(self, steps: Steps[None], interrupt: BaseException | None = None) -> None:
        _run_aside(steps, interrupt)

    def _later(self, steps: Steps[None]) -> None:
        _post_later(steps)

    def _new_event(self) -> _Turn:
        return _Turn()

    def _wait_turn(self, prev: _Turn, timeout: float | None) -> bool:
        return prev.wait(timeout)

    def _renew_io(self, call: Call, wait: float) -> Any:
        link = self._link
        if link is None:
            link = self._link = SyncLink(self._client)
        script, keys, args = call
        return link.call(script, keys, args, wait)

    def _renew_many_io(self, calls: list[Call], wait: float) -> list[Any]:
        link = self._link
        if link is None:
            link = self._link = SyncLink(self._client)
        return link.call_many(calls, wait)

    def _forked(self) -> None:
        super()._forked()
        self._link = None
        self._waker = None

    def _read_blocking(self, proc: Callable[..., Steps[T]]) -> T:
        return drive(proc())

    def _start_renewer(self, needed: bool) -> None:
        if needed:
            threading.Thread(
                target=_renewer, args=(weakref.ref(self),),
                name=f"lanequeue-renew-{self.name}", daemon=True,
            ).start()

    # -- the public surface --------------------------------------------------------------

    def acquire(
        self, key: str, *, timeout_s: Any = LANE_DEFAULT, priority: int = 0
    ) -> RedisHold:
        """A context manager that holds this lane for ``key`` (see :class:`RedisHold`).

        Args:
            key: non-empty ``str``.
            timeout_s: seconds to wait; default the lane's ``timeout_s``; ``None`` waits
                without limit; ``0`` does not wait.
            priority: 0 only (accepted for code written against every lane): a Redis
                lane serves its line in arrival order; another priority is a ValueError.

        Raises:
            TypeError/ValueError: at the call, for a bad key, timeout or priority.
            LaneTimeoutError: on entering, when no grant came in time.
            LaneBackendError: on entering, when Redis failed (nothing is held then).

        Example::

            with lane.acquire("gateway:slack:c1:u1") as hold:
                store.write(data, fence=hold.fencing_token)
        """
        if priority.__class__ is not int or priority:
            self._no_priority(priority)
        return self._new_hold(key, timeout_s)

    def try_acquire(self, key: str) -> bool:
        """Take ``key`` if it is free now, without waiting; True if taken (release it with
        :meth:`manual_release`). Raises LaneBackendError if Redis failed."""
        return drive(self._try_acquire(key))

    def acquire_timeout(
        self, key: str, timeout_s: Any = LANE_DEFAULT, *, priority: int = 0
    ) -> bool:
        """Wait up to ``timeout_s`` seconds (omitted: the lane's ``timeout_s``; None: no
        limit; 0: no wait); True if taken (release it with :meth:`manual_release`), False
        on timeout. ``priority``: as :meth:`acquire` (0 only)."""
        if priority.__class__ is not int or priority:
            self._no_priority(priority)
        timeout = self.timeout_s if timeout_s is LANE_DEFAULT else timeout_s
        return drive(self._acquire_timeout(key, timeout))

    def manual_release(self, key: str) -> bool:
        """Release THIS lane object's oldest hold of ``key`` (taken with try_acquire,
        acquire_timeout or _raw_acquire). Any thread may call it.

        Returns True when the hold ended. Returns False and logs a warning, changing
        nothing in Redis, when this object holds nothing for ``key`` (another client's
        hold is never released: its owner id is not ours), when the hold's lease had
        been lost (the key may be someone else's now), or when its release that an
        interrupt stopped had released it after all. Raises LaneBackendError if Redis
        failed (the hold then lapses within ``lease_s``).
        """
        return drive(self._manual_release(key))

    def _raw_acquire(self, key: str) -> bool:
        """The source design's internal acquire: wait the lane's ``timeout_s``."""
        return self.acquire_timeout(key, self.timeout_s)

    def _raw_release(self, key: str) -> None:
        """The source design's internal release (see :meth:`manual_release`)."""
        self.manual_release(key)

    def drain(self, timeout_s: float | None = 0.0, *, cancel_waiting: bool = False) -> bool:
        """Refuse new acquisitions of THIS lane object at once (``acquire``,
        ``try_acquire``, ``acquire_timeout`` and a queue's ``acquire_all`` raise
        :class:`~lanequeue.LaneDrainingError`); its holders finish; its waiters keep
        their place, unless ``cancel_waiting`` ends them with that error (each leaves the
        line in Redis). Then wait up to ``timeout_s`` seconds (0: not at all; None: no
        limit) until this lane object has no holder and no waiter.

        Other processes' clients of the lane are untouched. Returns True if idle on
        return. Raises TypeError/ValueError for a bad timeout.

        Example::

            lane.drain(timeout_s=30)   # on shutdown: let this replica's holders finish
        """
        timeout = check_timeout(timeout_s)
        cancel_waiting = check_bool(cancel_waiting, "cancel_waiting")
        self._start_drain(cancel_waiting)
        return self.wait_idle(timeout)

    def wait_idle(self, timeout_s: float | None) -> bool:
        """Wait up to ``timeout_s`` seconds (None: no limit) until THIS lane object has
        no holder and no waiter; True then, False when the timeout passed first. Looks
        every 10 ms. Raises TypeError/ValueError for a bad timeout."""
        timeout = check_timeout(timeout_s)
        return poll_idle(self._idle, timeout, self)


class RedisSessionLane(_SyncFace, SessionLaneBase[RedisHold]):
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
        warn_after_s, on_wait, warn_hold_s: as on ``SessionLane``, for this process's
            waiters and holds (default 2.0, None, None): a wait past ``warn_after_s`` is
            logged once, with the waiters of this process ahead of it and this
            process's hold of the key (if any); no timer is added per wait.

    Operations (this lane object, i.e. this process): ``metrics_snapshot()``,
    ``track_holds()``, ``stuck(older_than_s)``, ``drain()``, ``wait_idle()``,
    ``clear(key)``, ``close()``, ``draining``.

    Views: ``is_held(key)`` and ``waiting_for(key)`` ask Redis; ``active_count``,
    ``waiting``, ``get_active()``, ``session_count`` and ``stats`` describe THIS lane
    object's holds and waiters (a lane-wide count would need a scan of the keyspace).

    Example::

        sessions = RedisSessionLane(redis.Redis(), lease_s=30)
        with sessions.acquire("gateway:slack:c1:u1:t1") as hold:
            ...   # every replica's next message of this thread waits here
    """

    def is_held(self, key: str) -> bool:
        """True while ``key`` has a holder in any process (asks Redis)."""
        return drive(self._key_info(key))[0]

    def waiting_for(self, key: str) -> int:
        """Callers in line for ``key`` now, in every process (asks Redis)."""
        return drive(self._key_info(key))[1]


class RedisLane(_SyncFace, CountingLaneBase[RedisHold]):
    """A counting lane on Redis for threads: at most ``max_concurrent`` holds over all
    keys, across every process and host sharing the Redis, served first come first served.

    Twin of :class:`lanequeue.Lane`. The whole lane has one hash tag (one slot).
    Every client of the lane must use the same ``max_concurrent``.

    Args:
        client: a ``redis.Redis`` (or ``redis.cluster.RedisCluster``) client.
        name: the lane's name (no ``:``, ``{``, ``}``).
        max_concurrent: permits, from 1 to 2**53 (Redis scripts hold numbers as doubles,
            exact up to 2**53; a larger cap raises ValueError).
        timeout_s, lease_s, prefix, on_lease_lost, warn_after_s, on_wait, warn_hold_s:
            as on :class:`RedisSessionLane`.

    Views: ``active_count``, ``available``, ``waiting``, ``get_active()``, ``stats`` and
    ``status()`` describe THIS lane object (no round trip); ``holds_of(key)`` and
    ``lane_status()`` ask Redis (lane-wide, every process).

    Example::

        llm = RedisLane(redis.Redis(), "global", max_concurrent=8)
        with llm.acquire(session_key):
            reply = call_model(...)
    """

    @property
    def available(self) -> int:
        """``max_concurrent - active_count``: permits this lane object has not taken (the
        lane-wide free permits: ``lane_status()["available"]``)."""
        return max(0, self._cap - self._n_live)

    def lane_status(self) -> dict[str, Any]:
        """Lane-wide, every process (one round trip): ``active`` holds, live ``waiting``
        callers, ``available`` permits (free under the cap in force: what this lane
        object can take now), ``keys`` (key -> seconds its oldest hold has lasted, server
        time), ``oldest_wait_s`` (seconds the longest live waiter has been in line, from
        the server time it joined; 0.0 when nobody waits), ``max_concurrent`` (the cap in
        force: this object's, or a smaller one another client used within its last lease,
        see "mixed caps" in :mod:`lanequeue.redis`). Raises LaneBackendError if Redis
        failed."""
        return drive(self._lane_wide())

    def holds_of(self, key: str) -> int:
        """Permits held now by ``key``, lane-wide (asks Redis)."""
        return drive(self._holds_of(key))
