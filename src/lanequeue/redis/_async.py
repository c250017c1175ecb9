"""The asyncio face of the Redis lanes: :class:`AsyncRedisSessionLane`, :class:`AsyncRedisLane`.

Same scripts, keys and rules as the thread face (see the package docstring); a waiting task
awaits its wake-up from the loop's listener task (:mod:`._wake`), holding no connection,
and one renewer task per lane object (on the loop of the lane's latest grant) renews its holds.
Every decision is the core's (:mod:`._protocol`); this face only runs its procedures,
awaiting their I/O (:func:`drive`), and starts the renewer task.

As on every asyncio lane (see :mod:`lanequeue.contract`), the queries ``try_acquire``,
``acquire_timeout``, ``manual_release``, ``hold.release()``, and the lane-wide views
(``is_held``, ``waiting_for``, ``holds_of``, ``lane_status``) are coroutines. The plain
views (``active_count``, ``available``, ``waiting``, ``get_active()``, ``stats``,
``status()``) describe THIS lane object, so ``AsyncLaneQueue.status()`` never waits.

Cancellation: a task cancelled while waiting (or right after the server granted it) leaves
the line in one script and passes on a grant that reached it; a task cancelled inside
``async with`` releases on the way out; a task cancelled while its release script is on
its way lets that release finish (and count) before the CancelledError propagates. That
clean-up runs in a task of its own; the cancelled task waits for it at most
:data:`CANCEL_WAIT_S` and then ends, the clean-up going on in the background (a task
that refuses cancellation, which a closing loop waits for: see :class:`_Cleanup`). So does a
release that a task already cancelled begins: leaving ``async with`` by the
cancellation, a queue's ``acquire_all`` releasing its holds then (at most
:data:`CANCEL_WAIT_S` for them all), ``hold.release()`` or ``manual_release`` in a
``finally`` (see :func:`_drive_cancelled`).

A frozen server: every script call waits at most the client's ``socket_timeout`` (or
:data:`~._args.CALL_WAIT_S` when it has none) for its reply, connecting included, then
fails (``LaneBackendError``), its connection dropped. So no call, clean-up or cancellation
waits on the server without a bound.
"""

from __future__ import annotations

import asyncio
import logging
import os
import sys
import threading
import weakref
from collections.abc import Awaitable, Callable, Coroutine
from contextvars import ContextVar
from inspect import GEN_CLOSED, getgeneratorstate
from types import TracebackType
from typing import Any, Literal

import redis.asyncio
from redis.asyncio.cluster import RedisCluster
from redis.exceptions import TimeoutError as RedisTimeoutError

from .._core import at_fork_in_child
from .._errors import LaneBackendError
from .._kinds import LANE_DEFAULT
from .._ops import CANCEL_WAIT_S, LoopTimer, note_cancel_wait, noted_cancel_wait, poll_idle_async
from .._validate import check_bool, check_timeout
from ..contract import must_await
from ._link import AsyncLink, SyncLink, blocking_factory
from ._ops import RedisOps
from ._protocol import LATER_MAX, Call, RedisHoldBase, Step, Steps, T, _claims, renewal
from ._sync import drive as drive_blocking
from ._sync import not_held
from ._views import CountingLaneBase, SessionLaneBase
from ._wake import AsyncSlots, AsyncWaker, Woken, async_waker
from ._wire import PROBE_CHANNELS, run_async

__all__ = ["AsyncRedisHold", "AsyncRedisLane", "AsyncRedisSessionLane"]


#: Clean-ups running after a cancellation (strong references until they end).
_CLEANUPS: set[asyncio.Task[Any]] = set()
#: Longest wait, in seconds, of a closing loop's ``shutdown_asyncgens`` for the clean-ups
#: still running on it (each call of one is bounded on its own; see :func:`_loop_guard`).
SHUTDOWN_WAIT_S = 30.0


class _Cleanup(asyncio.Task[T]):
    """A clean-up's task (a release, a withdraw, the rest of a procedure after a
    cancellation): it refuses cancellation. Nobody else holds it, and each of its calls
    is bounded, so it always ends; but ``asyncio.run`` cancels every task of the loop
    before closing it, and a clean-up cut short there left its grant or line entry in
    Redis for a whole lease. Since ``asyncio.run`` waits for the tasks it cancelled, a
    clean-up running then finishes first; one started after that is waited for by the
    loop's guard (:func:`_loop_guard`)."""

    def cancel(self, msg: Any = None) -> bool:
        return False

    async def within(self, aw: Awaitable[T], wait: float) -> T:
        """``await aw`` in this task for at most ``wait`` seconds (the bound of
        :func:`_within`, which ``asyncio.timeout`` cannot keep here: it cancels the task
        through :meth:`cancel`). Past it, ``aw`` is cancelled and redis-py's
        TimeoutError raised."""
        expired = False

        def expire(_timer: LoopTimer) -> None:
            nonlocal expired
            if expired:
                return  # a repeat (see LoopTimer): the task takes one cancellation
            expired = True
            asyncio.Task.cancel(self)  # (the one cancellation this task takes)

        loop = self.get_loop()
        handle = LoopTimer(loop, loop.time() + wait, expire)
        try:
            return await aw
        except asyncio.CancelledError as exc:
            if not expired:
                raise
            uncancel = getattr(self, "uncancel", None)  # (Python 3.11+)
            if uncancel is not None:
                uncancel()
            raise RedisTimeoutError(
                f"no reply from Redis within {wait:g} s (the wait for a free connection of "
                f"the client's pool included)") from exc
        finally:
            handle.cancel()


def _start_cleanup(coro: Coroutine[Any, Any, T]) -> asyncio.Task[T]:
    """Run ``coro``, a clean-up, in a task of its own that refuses cancellation (see
    :class:`_Cleanup`), held in ``_CLEANUPS`` until it ends; its loop gets its guard."""
    loop = asyncio.get_running_loop()
    task: asyncio.Task[T] = _Cleanup(coro, loop=loop)
    _CLEANUPS.add(task)
    task.add_done_callback(_cleanup_done)
    _guard(loop)
    return task


#: The attribute of an event loop that keeps its guard (see :func:`_guard`).
_GUARD_ATTR = "_lanequeue_cleanup_guard"


async def _loop_guard() -> Any:
    """An async generator parked at its ``yield`` for the life of its loop: the loop's
    ``shutdown_asyncgens`` (``asyncio.run`` calls it after cancelling the tasks, before
    closing the loop) closes it, and its ``finally`` waits for the clean-ups still
    running on that loop (at most :data:`SHUTDOWN_WAIT_S`), so none is destroyed
    pending with the loop."""
    try:
        yield
    finally:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + SHUTDOWN_WAIT_S
        while True:
            pending = [t for t in _CLEANUPS if not t.done() and t.get_loop() is loop]
            left = deadline - loop.time()
            if not pending or left <= 0:
                break
            await asyncio.wait(pending, timeout=left)


def _guard(loop: asyncio.AbstractEventLoop) -> None:
    """Give ``loop`` its guard (once; not after its ``shutdown_asyncgens``): started
    here, on the loop's thread, so the loop's first-iteration hook tracks it. The loop
    keeps it in an attribute: the guard refers to its loop (its finalizer hook), so the
    two are a cycle the collector frees with the loop, and nothing else keeps either."""
    if getattr(loop, "_asyncgens_shutdown_called", False):
        return
    if getattr(loop, _GUARD_ATTR, None) is not None:
        return
    agen = _loop_guard()
    try:
        setattr(loop, _GUARD_ATTR, agen)
    except AttributeError:  # a loop that takes no attribute: no guard
        return
    try:
        agen.__anext__().send(None)  # to its yield
    except StopIteration:
        pass


def _cleanup_done(task: asyncio.Task[Any]) -> None:
    """A clean-up ended: forget it, and take its outcome (nobody else may: its caller
    stopped waiting after CANCEL_WAIT_S), so asyncio does not report "Task exception was
    never retrieved" for a clean-up that failed in the background (a frozen server)."""
    _CLEANUPS.discard(task)
    if not task.cancelled() and task.exception() is not None:
        logging.getLogger("lanequeue").debug(
            "a clean-up after a cancellation ended with %r", task.exception())
#: Serialises the lane-wide reads made off the event loop (scrapes: rare and short).
_READ_LOCK = threading.Lock()
#: Longest wait of one such read, in seconds.
READ_WAIT_S = 2.0


def _after_fork() -> None:
    """In a forked child: a fresh lock (a parent thread may have held it at the fork);
    the parent's clean-up tasks are not the child's."""
    global _READ_LOCK
    _READ_LOCK = threading.Lock()
    _CLEANUPS.clear()


at_fork_in_child(_after_fork)


class _Releasing(asyncio.CancelledError):
    """The caller was cancelled while its release script was on its way (that call runs
    to its end in a task of its own, see :meth:`_AsyncFace._run`): the procedure's
    clean-up (:func:`_rest`) is sent that call's reply, not the cancellation, so the
    hold ends as the script says (counted released, or not ours) instead of as a guess."""

    def __init__(self, call: asyncio.Task[Any], *args: Any) -> None:
        super().__init__(*args)
        self.call = call


async def drive(steps: Steps[T]) -> T:
    """Run a core procedure to its end, awaiting each step's I/O and sending back its
    reply, or throwing in what it raised.

    A cancellation is thrown in too, so the procedure cleans up (leaves the line, passes
    on a grant) before it propagates; a cancellation during a release lets the release
    run to its end instead (:class:`_Releasing`). That clean-up runs in a task of its
    own, which a second cancellation (C25) cannot stop half way, so it never leaves an
    orphaned grant. The caller waits for it at most :data:`CANCEL_WAIT_S` (a second
    cancellation ends that wait at once) and sees the CancelledError, whatever the
    clean-up returned or raised; past that wait the clean-up goes on in the background
    (a frozen server: its calls fail within their bound; a line entry it could not
    withdraw lapses with its liveness, a grant with its lease).

    A cancellation dropped below us is delivered too (Python 3.11+): before Python 3.12,
    ``asyncio.wait_for`` (which redis-py wraps a send in when the client has a socket
    timeout, its default) returns normally when a cancellation arrives as what it waits
    for completes. A step that returns while the task's count of cancellation requests
    grew is treated as cancelled."""
    send: Callable[[Any], Step] = steps.send
    reply: Any = None
    cancelling = getattr(asyncio.current_task(), "cancelling", None)  # (Python 3.11+)
    while True:
        try:
            (fn, args), reply = send(reply), None
            if cancelling is None:
                reply, send = await fn(*args), steps.send
            else:
                asked = cancelling()
                reply, send = await fn(*args), steps.send
                if cancelling() > asked:  # a cancellation came, and was dropped
                    reply = None
                    raise asyncio.CancelledError
        except StopIteration as stop:
            result: T = stop.value
            return result
        except asyncio.CancelledError as exc:
            if getgeneratorstate(steps) == GEN_CLOSED:
                raise
            task = _start_cleanup(_rest(steps, exc))
            # (How long the wait took goes with every CancelledError raised from here,
            # also the one of a cancellation that ends the wait: see note_cancel_wait.)
            time = asyncio.get_running_loop().time
            began = time()
            try:
                await asyncio.wait((task,), timeout=CANCEL_WAIT_S)
            except asyncio.CancelledError as again:  # cancelled again: the wait ends
                note_cancel_wait(again, began, time())
                raise
            if not task.done():  # the clean-up goes on in the background
                raise note_cancel_wait(asyncio.CancelledError(*exc.args), began,
                                       time()) from None
            try:
                task.result()
            except asyncio.CancelledError as err:  # (the clean-up itself was cancelled)
                note_cancel_wait(err, began, time())
                raise
            except BaseException as err:  # (a release that found the hold not ours)
                raise note_cancel_wait(asyncio.CancelledError(*exc.args), began,
                                       time()) from err
            raise note_cancel_wait(asyncio.CancelledError(*exc.args), began,
                                   time()) from None
        except BaseException as exc:
            if getgeneratorstate(steps) == GEN_CLOSED:
                raise  # the procedure itself raised it
            reply, send = exc, steps.throw


def _being_cancelled(exc: BaseException | None = None) -> bool:
    """True when the current task is being cancelled: ``exc`` (what leaves a block) is a
    CancelledError, or the task's count of cancellation requests is not 0 (a
    cancellation came and was not withdrawn with ``uncancel()``); on Python 3.10, which
    does not count them, when a CancelledError is being handled (a queue's
    ``acquire_all`` releasing its holds as the cancellation leaves its block)."""
    if isinstance(exc, asyncio.CancelledError):
        return True
    cancelling = getattr(asyncio.current_task(), "cancelling", None)
    if cancelling is None:  # (Python 3.10)
        return isinstance(sys.exc_info()[1], asyncio.CancelledError)
    return bool(cancelling() > 0)


async def _drive_cancelled(steps: Steps[T], exc: BaseException | None = None) -> T:
    """:func:`drive` for a task being cancelled (see :func:`_being_cancelled`): a release
    (leaving ``async with``, ``hold.release()``, ``manual_release``) whose task was
    cancelled before it began. No new cancellation would come to end its wait on a
    frozen server, so it runs in a task of its own, which the caller waits for at most
    :data:`CANCEL_WAIT_S` (a new cancellation ends that wait at once); past that the
    caller gets a CancelledError (with the args of ``exc``, when it is one) and the
    release goes on in the background (held in ``_CLEANUPS`` until it ends; its outcome
    is taken there, see :func:`_cleanup_done`). Ended within the wait: its result, or
    what it raised, as :func:`drive` gives them.

    One CANCEL_WAIT_S per cancellation, however many releases it runs: when ``exc``
    carries the time an earlier clean-up of the same cancellation began to wait (an
    inner ``async with`` left first, see :func:`~lanequeue._ops.note_cancel_wait`),
    this one waits only what is left of it; ``exc`` and what is raised from here carry
    the time waited on to the next block out (not the time the task's own code runs
    between two blocks)."""
    loop = asyncio.get_running_loop()
    began = noted_cancel_wait(exc, loop.time())
    if began is None:
        began = loop.time()

    def spent(err: BaseException) -> BaseException:
        if exc is not None:
            note_cancel_wait(exc, began, loop.time())
        return note_cancel_wait(err, began, loop.time())

    task = _start_cleanup(drive(steps))
    try:
        await asyncio.wait((task,), timeout=max(0.0, began + CANCEL_WAIT_S - loop.time()))
    except asyncio.CancelledError as again:  # cancelled again: the wait ends
        spent(again)
        raise
    if not task.done():  # the release goes on in the background
        raise spent(asyncio.CancelledError(
            *(exc.args if isinstance(exc, asyncio.CancelledError) else ()))) from None
    try:
        result = task.result()
    except BaseException as err:  # (what the release raised, or its cancellation)
        spent(err)
        raise
    if exc is not None:
        spent(exc)
    return result


async def _call(slots: asyncio.Semaphore | AsyncSlots, client: Any, script: Any,
                keys: list[str], args: list[Any], wait: float) -> Any:
    async with slots:
        return await _within(run_async(client, script, keys, args), wait)


async def _freeing_call(slots: asyncio.Semaphore | AsyncSlots, client: Any, script: Any,
                        keys: list[str], args: list[Any], wait: float) -> Any:
    """A release's or withdraw's :func:`_call` whose ``wait`` bounds the wait for a free
    slot too: on a frozen server, many clean-ups queued behind the few freeing slots
    (a loop shutting down with many holders) all fail within one bound, each counted,
    instead of one bound per slot's turn (past the closing loop's wait for them)."""

    async def slotted() -> Any:
        async with slots:
            return await run_async(client, script, keys, args)

    return await _within(slotted(), wait)


async def _within(aw: Awaitable[T], wait: float) -> T:
    """``await aw`` for at most ``wait`` seconds; past that it is cancelled (a script
    call drops its connection, see :func:`run_async`) and redis-py's TimeoutError is
    raised (a RedisError: the procedure sees a failed round trip). On Python 3.11+ in the
    caller's own task (``asyncio.timeout``: one timer, no task per call; in a clean-up's
    task, its own timer: see :meth:`_Cleanup.within`)."""
    task = asyncio.current_task()
    if isinstance(task, _Cleanup):
        result: T = await task.within(aw, wait)
        return result
    try:
        if _timeout is not None:
            async with _timeout(wait):
                return await aw
        return await asyncio.wait_for(aw, wait)
    except (asyncio.TimeoutError, TimeoutError) as exc:
        raise RedisTimeoutError(
            f"no reply from Redis within {wait:g} s (the wait for a free connection of "
            f"the client's pool included)") from exc


_timeout: Callable[[float], Any] | None = getattr(asyncio, "timeout", None)

# Background clean-ups nobody waits for (see RedisLaneBase._later): the loop keeps only
# weak references to its tasks.
_LATER: set[asyncio.Task[Any]] = set()
#: True in a background clean-up's task (:func:`_run_later`).
_BEST_EFFORT: ContextVar[bool] = ContextVar("lanequeue_best_effort", default=False)
at_fork_in_child(_LATER.clear)  # (the parent's tasks are not the child's)


async def _run_later(steps: Steps[None]) -> None:
    """Drive the background clean-up ``steps`` (see RedisLaneBase._later), awaiting
    each step's I/O and throwing in what it raised, as :func:`drive` does, except that
    a cancellation (its loop shutting down) drops it at once: it is best effort, and a
    shutdown should neither wait for it nor report it (its releases and withdraws run
    in this task, not in clean-up tasks of their own: see ``_BEST_EFFORT``)."""
    _BEST_EFFORT.set(True)  # (this task's own context)
    send: Callable[[Any], Step] = steps.send
    reply: Any = None
    while True:
        try:
            fn, args = send(reply)
        except StopIteration:
            return
        except Exception as exc:  # (the procedure catches its own; a last net)
            logging.getLogger("lanequeue.redis").debug(
                "a background clean-up ended with %r", exc)
            return
        try:
            reply, send = await fn(*args), steps.send
        except asyncio.CancelledError:
            steps.close()
            return
        except Exception as exc:
            reply, send = exc, steps.throw


async def _rest(steps: Steps[T], exc: BaseException) -> T:
    """The rest of a procedure after ``exc`` (its clean-up), in a task of its own; after
    :class:`_Releasing`, the rest after its release's reply."""
    reply: Any = exc
    send: Callable[[Any], Step] = steps.throw
    if isinstance(exc, _Releasing):
        try:
            reply, send = await exc.call, steps.send
        except BaseException as err:
            reply = err
    while True:
        try:
            (fn, args), reply = send(reply), None
            reply, send = await fn(*args), steps.send
        except StopIteration as stop:
            result: T = stop.value
            return result
        except BaseException as err:
            if getgeneratorstate(steps) == GEN_CLOSED:
                raise
            reply, send = err, steps.throw


class AsyncRedisHold(RedisHoldBase):
    """A hold on an asyncio Redis lane; an async context manager made by
    ``lane.acquire(key)``.

    ``async with`` waits for the grant (LaneTimeoutError if it does not come in time) and
    releases on the way out, also on cancellation (left by a cancellation, it waits for
    that release at most ``CANCEL_WAIT_S``, 0.5 s; past that the release goes on in the
    background). ``await hold.release()`` returns True when it ended the hold; it raises
    NotOwnerError when the hold is not this acquisition's (any more: never granted,
    released already, ended by ``manual_release``), and its subclass LeaseLostError when
    the lease ran out (whether that was known before the release was sent or learnt
    from the server's answer). Leaving the block after an early release is silent;
    otherwise it raises the same errors unless the block itself raised (then the
    release error is logged and the block's exception propagates).
    """

    __slots__ = ()

    lane: _AsyncFace

    async def __aenter__(self) -> AsyncRedisHold:
        await drive(self.lane._enter(self))
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        steps = self.lane._exit(self, exc_type is not None)
        if _being_cancelled(exc):  # left by a cancellation: waits at most CANCEL_WAIT_S
            await _drive_cancelled(steps, exc)
        else:
            await drive(steps)

    @must_await
    async def release(self) -> bool:  # type: ignore[override]
        """A coroutine: end this hold (see the class docstring for the result and errors)."""
        steps = self.lane._release(self)
        if not await (_drive_cancelled(steps) if _being_cancelled() else drive(steps)):
            raise not_held(self)
        return True


async def _renew_loop(ref: weakref.ref[_AsyncFace], here: _AsyncFace, claim: int) -> None:
    """The renewer task of one lane object (``ref``: a weak reference between rounds;
    ``here``: a weak proxy of it; ``claim``: its claim number, see ``_start_renewer``).

    Its stop is recorded first, by a plain store through the proxy (no call before it):
    a lookup first (``ref()``, ``current_task()``) let an interrupt there leave the
    renewer's place taken with no renewer, so the holds dropped meanwhile were queued
    for a release nobody sent, counted among the holders until the next grant. The
    dropped holds queued for it then lapse (``_renewer_stopped``; the next purge, if an
    interrupt stops it first, or if this runs in a finalizer inside the lane's lock: a
    pending task collected closes its coroutine)."""
    try:
        await drive(renewal(ref, asyncio.sleep))
    finally:
        try:
            if here._renewing == claim:
                here._renewing = 0  # -- the stop's record first: a plain store --
            if here._outermost():
                here._renewer_stopped(claim)
        except ReferenceError:  # (the lane object is gone)
            pass


class _AsyncFace(RedisOps[AsyncRedisHold]):
    """Acquire/release for asyncio tasks over either kind of Redis lane: the core's
    procedures, run with awaited I/O; one renewer task per lane object."""

    _async_face = True
    _hold_class = AsyncRedisHold
    face: Literal["asyncio"] = "asyncio"
    _client_types = (redis.asyncio.Redis, RedisCluster)
    _client_hint = "a redis.asyncio.Redis (or redis.asyncio.cluster.RedisCluster) client"
    _renew_task: asyncio.Task[None] | None = None
    _link: AsyncLink | None = None
    _reader: SyncLink | None = None

    def _wk(self) -> AsyncWaker:
        return async_waker(self._client)

    async def _run(self, op: str, key: str | None, call: Call) -> Any:
        script, keys, args = call
        wk = self._wk()  # the process's bound on calls in flight per client
        if (op == "release" or op == "withdraw") and _BEST_EFFORT.get():
            # A background clean-up's call (_run_later): best effort, dropped with it
            # when its loop shuts down (no task of its own that the shutdown would wait
            # for and report).
            return await _freeing_call(wk.freeing, self._client, script, keys, args,
                                       wk.call_wait_s)
        if op == "release" or op == "withdraw":
            # Runs to its end even if the caller is cancelled while it waits (C25): a
            # release or withdraw cut short would leave a grant nobody owns. Its bound
            # is its own: it never waits behind the acquires it would let in.
            task = _start_cleanup(
                _freeing_call(wk.freeing, self._client, script, keys, args, wk.call_wait_s))
            try:
                return await asyncio.shield(task)
            except asyncio.CancelledError as exc:
                if op == "release" and not task.cancelled():
                    raise _Releasing(task, *exc.args) from None
                raise
        if op == "acquire":
            # A waiter's poll leaves the line for its turn when its grant overtakes it.
            token = await wk.poll_turn(args[0])
            if token:
                return Woken(token)
            try:
                return await _within(run_async(self._client, script, keys, args),
                                     wk.call_wait_s)
            finally:
                wk.slots.release()
        return await _call(wk.slots, self._client, script, keys, args, wk.call_wait_s)

    async def _memory_info(self) -> Any:
        wk = self._wk()
        async with wk.slots:  # on a connection of the pool, as the scripts
            return await _within(self._client.info("memory"), wk.call_wait_s)

    async def _publish_probe(self) -> Any:
        wk = self._wk()
        async with wk.slots:
            return [await _within(self._client.publish(channel, ""), wk.call_wait_s)
                    for channel in PROBE_CHANNELS]

    def _expect(self, owner: str) -> None:
        self._wk().expect(owner)

    def _forgets(self) -> tuple[Callable[[str, None], object], ...]:
        return self._wk().forgets()

    async def _wait_wake(self, owner: str, block: float) -> int:
        token = await self._wk().wait(owner, self._ops_block(owner, block))
        self._ops_woke(owner)  # raises when clear/drain ended this wait
        return token

    def _ops_wake(self, owner: str) -> None:
        try:
            ev = self._wk()._events.get(owner)
        except RuntimeError:  # no running loop: the waiter sees its end at its next poll
            return
        if ev is not None:
            ev.set()

    def _local_waiters(self) -> int:
        return self._wk().count

    def _later(self, steps: Steps[None]) -> None:
        # A task of the running loop (the failed acquire's), kept in _LATER until done;
        # tasks of loops closed meanwhile (never run to their end) are forgotten first.
        for task in [t for t in _LATER if t.get_loop().is_closed()]:
            _LATER.discard(task)
        if len(_LATER) >= LATER_MAX:
            steps.close()
            return
        task = asyncio.get_running_loop().create_task(_run_later(steps))
        _LATER.add(task)
        task.add_done_callback(_LATER.discard)

    async def _aside(self, steps: Steps[None], interrupt: BaseException | None = None) -> None:
        # A clean-up runs in the task a cancellation moved it to (see drive), which a
        # second cancellation cannot stop; reached otherwise, its own drive moves it to a
        # task of its own at the first cancellation.
        await drive(steps)

    def _new_event(self) -> asyncio.Event:
        return asyncio.Event()

    async def _wait_turn(self, prev: asyncio.Event, timeout: float | None) -> bool:
        if prev.is_set():
            return True
        try:
            await asyncio.wait_for(prev.wait(), timeout)
        except (asyncio.TimeoutError, TimeoutError):
            return prev.is_set()
        return True

    async def _renew_io(self, call: Call, wait: float) -> Any:
        link = self._link
        if link is None:
            link = self._link = AsyncLink(self._client)
        script, keys, args = call
        return await link.call(script, keys, args, wait)

    async def _renew_many_io(self, calls: list[Call], wait: float) -> list[Any]:
        link = self._link
        if link is None:
            link = self._link = AsyncLink(self._client)
        return await link.call_many(calls, wait)

    def _call_lost(self, hold: AsyncRedisHold) -> None:
        """``on_lease_lost`` runs on the loop of the lane's renewer when the loss is
        found off that loop (by the deadline watchdog thread)."""
        task = self._renew_task
        loop = None if task is None else task.get_loop()
        if (
            loop is None or loop.is_closed()
            or threading.get_ident() == getattr(loop, "_thread_id", None)
        ):
            super()._call_lost(hold)
            return
        try:
            loop.call_soon_threadsafe(super()._call_lost, hold)
        except RuntimeError:  # the loop closed meanwhile
            super()._call_lost(hold)

    def _forked(self) -> None:
        super()._forked()
        self._link = None
        self._renew_task = None
        self._reader = None

    def _read_blocking(self, proc: Callable[..., Steps[T]]) -> T:
        """A read from any thread, off the event loop (a scrape): the script over a
        blocking connection of this lane object's own, made like the client's (one
        round trip, at most ``READ_WAIT_S``; reads are serialised per process)."""
        with _READ_LOCK:
            link = self._reader
            if link is None:
                make = blocking_factory(self._client)
                if make is None:
                    raise LaneBackendError(
                        f"lane {self.name!r}: a lane-wide read off the event loop needs a "
                        f"redis.asyncio.Redis client (not a cluster client)")
                link = self._reader = SyncLink(self._client, make)

            def run(op: str, key: str | None, call: Call) -> Any:
                script, keys, args = call
                return link.call(script, keys, args, READ_WAIT_S)

            return drive_blocking(proc(run))

    def _renewer_runs(self, pid: int) -> bool:
        """As the base's, and the renewer task can still run: its loop is not closed. A
        loop closed without cancelling its tasks (``loop.close()`` after
        ``run_until_complete``) never runs the task's ``finally``, which gives the place
        up: its claim stayed, and a hold dropped later was queued for good for a renewer
        that never came (counted among the holders, ``wait_idle()`` never true)."""
        if not super()._renewer_runs(pid):
            return False
        task = self._renew_task
        return task is None or not (task.done() or task.get_loop().is_closed())

    def _start_renewer(self, needed: bool) -> None:
        # Also when the renewer task ended, or runs on another loop than this grant's.
        loop = asyncio.get_running_loop()
        task = self._renew_task
        if needed or task is None or task.done() or task.get_loop() is not loop:
            claim = next(_claims)
            with self._lock:
                self._renewing = claim
                self._renewer_pid = os.getpid()
            self._renew_task = loop.create_task(
                _renew_loop(weakref.ref(self), weakref.proxy(self), claim),
                name=f"lanequeue-renew-{self.name}",
            )

    # -- the public surface --------------------------------------------------------------

    def acquire(
        self, key: str, *, timeout_s: Any = LANE_DEFAULT, priority: int = 0
    ) -> AsyncRedisHold:
        """An async context manager that holds this lane for ``key``.

        Args and errors as the thread face's ``acquire`` (``priority``: 0 only);
        ``asyncio.CancelledError`` when the task is cancelled while waiting (it then
        holds nothing).

        Example::

            async with lane.acquire(session_key) as hold:
                await store.write(data, fence=hold.fencing_token)
        """
        if priority.__class__ is not int or priority:
            self._no_priority(priority)
        return self._new_hold(key, timeout_s)

    @must_await
    async def try_acquire(self, key: str) -> bool:
        """Take ``key`` if it is free now, without waiting (a coroutine: one round trip);
        True if taken (release with :meth:`manual_release`)."""
        return await drive(self._try_acquire(key))

    @must_await
    async def acquire_timeout(
        self, key: str, timeout_s: Any = LANE_DEFAULT, *, priority: int = 0
    ) -> bool:
        """A coroutine: wait up to ``timeout_s`` seconds (omitted: the lane's
        ``timeout_s``; None: no limit; 0: no wait); True if taken (release with
        :meth:`manual_release`), False on timeout. ``priority``: 0 only (ValueError
        otherwise: see the thread face)."""
        if priority.__class__ is not int or priority:
            self._no_priority(priority)
        timeout = self.timeout_s if timeout_s is LANE_DEFAULT else timeout_s
        return await drive(self._acquire_timeout(key, timeout))

    @must_await
    async def manual_release(self, key: str) -> bool:
        """Release THIS lane object's oldest hold of ``key`` (a coroutine). Same contract
        as the thread face: False and a warning when this object holds nothing for
        ``key`` or its lease was lost; another client's hold is never released. In a
        task being cancelled it waits for the release at most 0.5 s (then
        CancelledError; the release goes on in the background)."""
        steps = self._manual_release(key)
        return await (_drive_cancelled(steps) if _being_cancelled() else drive(steps))

    @must_await
    async def drain(self, timeout_s: float | None = 0.0, *, cancel_waiting: bool = False
                    ) -> bool:
        """A coroutine: refuse new acquisitions of THIS lane object, then wait up to
        ``timeout_s`` seconds (0: not at all; None: no limit) until it has no holder and
        no waiter; same contract as :meth:`lanequeue.redis.RedisLane.drain`. Call it
        from the event loop of the lane's waiters. Returns True if idle on return; raises
        TypeError/ValueError for a bad timeout.

        Example::

            await lane.drain(timeout_s=30)
        """
        timeout = check_timeout(timeout_s)
        cancel_waiting = check_bool(cancel_waiting, "cancel_waiting")
        self._start_drain(cancel_waiting)
        return await self.wait_idle(timeout)

    @must_await
    async def wait_idle(self, timeout_s: float | None) -> bool:
        """A coroutine: wait up to ``timeout_s`` seconds (None: no limit) until THIS lane
        object has no holder and no waiter; True then, False when the timeout passed
        first. Looks every 10 ms. Raises TypeError/ValueError for a bad timeout."""
        timeout = check_timeout(timeout_s)
        return await poll_idle_async(self._idle, timeout)

    async def _raw_acquire(self, key: str) -> bool:
        """The source design's internal acquire: wait the lane's ``timeout_s``."""
        return await self.acquire_timeout(key, self.timeout_s)

    async def _raw_release(self, key: str) -> None:
        """The source design's internal release (see :meth:`manual_release`)."""
        await self.manual_release(key)


class AsyncRedisSessionLane(_AsyncFace, SessionLaneBase[AsyncRedisHold]):
    """A per-key lane on Redis for asyncio tasks: one holder per key across every process
    and host, in arrival order. Arguments as :class:`RedisSessionLane`, with a
    ``redis.asyncio.Redis`` client.

    Example::

        sessions = AsyncRedisSessionLane(redis.asyncio.Redis())
        async with sessions.acquire(conversation_key):
            await call_model()
    """

    @must_await
    async def is_held(self, key: str) -> bool:
        """True while ``key`` has a holder in any process (a coroutine: asks Redis)."""
        return (await drive(self._key_info(key)))[0]

    @must_await
    async def waiting_for(self, key: str) -> int:
        """Callers in line for ``key`` in every process (a coroutine: asks Redis)."""
        return (await drive(self._key_info(key)))[1]


class AsyncRedisLane(_AsyncFace, CountingLaneBase[AsyncRedisHold]):
    """A counting lane on Redis for asyncio tasks: at most ``max_concurrent`` holds over
    all keys and processes, FIFO. Arguments as :class:`RedisLane`, with a
    ``redis.asyncio.Redis`` client.

    Lane-wide views are coroutines: ``await lane.lane_status()`` (holders, waiters,
    available, keys, oldest wait), ``await lane.holds_of(key)``; ``active_count``,
    ``available``, ``waiting``, ``get_active()`` describe THIS lane object (plain, no
    round trip). ``metrics_snapshot()`` (plain, for a scrape thread) adds the
    ``scope="lane"`` entry as on :class:`~lanequeue.redis.RedisLane`, read over a
    blocking connection of the lane object's own (made like the client's; not on a
    cluster client), so it does not need the event loop; calling it ON the loop blocks
    the loop for that round trip.

    Example::

        llm = AsyncRedisLane(redis.asyncio.Redis(), "global", max_concurrent=8)
        async with llm.acquire(session_key):
            await call_model()
    """

    @property
    def available(self) -> int:
        """``max_concurrent - active_count``: permits this lane object has not taken (the
        lane-wide free permits: ``(await lane_status())["available"]``)."""
        return max(0, self._cap - self._n_live)

    @must_await
    async def lane_status(self) -> dict[str, Any]:
        """Lane-wide: ``active`` holds, live ``waiting`` callers, ``available`` permits
        (free under the cap in force), ``keys`` (key -> seconds its oldest hold has
        lasted), ``oldest_wait_s`` (from the server time the longest live waiter
        joined), ``max_concurrent`` (the cap in force), in one round trip; as
        :meth:`lanequeue.redis.RedisLane.lane_status`."""
        return await drive(self._lane_wide())

    @must_await
    async def holds_of(self, key: str) -> int:
        """Permits held now by ``key``, lane-wide (a coroutine: asks Redis)."""
        return await drive(self._holds_of(key))
