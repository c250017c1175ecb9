"""The lane contract: what every lane and every hold offers, on every face, declared once.

lanequeue has eight lane classes: two kinds (counting, per-key) on four faces (threads,
asyncio, Redis for threads, Redis for asyncio). They share ONE surface, declared here as
typing :class:`~typing.Protocol` classes; ``tests/test_contract.py`` runs one test body per
behaviour against all eight. :class:`SyncLane` is the surface of a thread lane
(:class:`~lanequeue.Lane`, :class:`~lanequeue.SessionLane`,
:class:`~lanequeue.redis.RedisLane`, :class:`~lanequeue.redis.RedisSessionLane`),
:class:`TaskLane` the surface of an asyncio lane (:class:`~lanequeue.AsyncLane`,
:class:`~lanequeue.AsyncSessionLane`, :class:`~lanequeue.redis.AsyncRedisLane`,
:class:`~lanequeue.redis.AsyncRedisSessionLane`), :class:`SyncHold` / :class:`TaskHold` the
surface of what ``acquire`` returns. ``LaneQueue`` and ``AsyncLaneQueue`` accept any object
with that surface.

The table (member: meaning; per-face notes)
===========================================
Every name means the same on every face. "Query" members may need a round trip to Redis:
on the thread faces they are plain calls, on EVERY asyncio face they are coroutines (they
return a :class:`MustAwait`: ``if lane.try_acquire(k):`` without ``await`` raises
TypeError instead of reading as True). The in-process asyncio lanes also offer each query
as a plain call under ``<name>_nowait``.

Construction and identity:

- ``name``: the lane's name (a non-empty ``str``; on Redis also no ``:``, ``{``, ``}``).
- ``face``: ``"threads"`` or ``"asyncio"``: which queue the lane may join.
- ``timeout_s``: the lane's default wait in seconds (``None``: no limit).

Timeouts (``acquire``, ``acquire_timeout``, ``acquire_all``), one meaning everywhere:

- omitted: the lane's ``timeout_s`` (for ``acquire_all``: the smallest ``timeout_s`` of
  the lanes it takes);
- ``None`` (or ``math.inf``, or ``threading.TIMEOUT_MAX`` seconds or more, about 292
  years; also an ``int`` too large for a float): no limit;
- ``0``: do not wait (take it only if it is free now);
- ``> 0``: wait at most that many seconds;
- negative or NaN: ``ValueError``; not a number (or a ``bool``): ``TypeError``.

Acquiring:

- ``acquire(key, *, timeout_s=<lane's>)``: a hold, used as ``with`` (threads) or
  ``async with`` (asyncio); entering waits, raises :class:`~lanequeue.LaneTimeoutError`
  when no permit came in time, and yields the hold; leaving releases. Arguments are
  checked at the call on every face.
- ``try_acquire(key) -> bool`` (query): take a permit if one is free now. Release it with
  ``manual_release(key)``.
- ``acquire_timeout(key, timeout_s=<lane's>) -> bool`` (query): wait for a permit; False
  on timeout. Release it with ``manual_release(key)``.

Releasing:

- ``hold.release()`` (a coroutine on the asyncio faces, plain ``release_nowait()`` on the
  in-process asyncio holds): ends THIS hold and returns True. Raises
  :class:`~lanequeue.NotOwnerError` when the hold is no longer the caller's: released
  already, never granted, ended by someone else (``manual_release``), or its Redis lease
  ran out (:class:`~lanequeue.LeaseLostError`). The real owner's hold is never touched.
  A refused ``release()`` logs nothing (the error is the report) and counts once in
  ``stats.unmatched_releases`` when the hold had been granted (a never granted hold
  counts nothing). On the in-process asyncio lanes it raises RuntimeError from another
  event loop or thread and changes nothing: the hold stays held and the block still
  releases it.
- ``hold.held``: True while the hold is the caller's: from the grant until it is
  released, or ended by someone else (``manual_release(key)``, a lost Redis lease).
- leaving the ``with`` / ``async with`` block after an early ``release()`` is silent.
- ``manual_release(key) -> bool`` (query): ends the key's oldest hold (of THIS lane
  object, on Redis: another process's hold is never ended). Returns False, logs a warning
  and changes nothing when the key holds nothing here.

Views of this lane OBJECT (plain on every face, never a round trip; in-process the lane
object IS the lane, so they are lane-wide; on Redis they count this process's lane object):

- ``active_count``: holds granted through this lane object and not ended (a per-key lane:
  keys held).
- ``waiting``: callers of this lane object waiting now.
- ``get_active()``: key -> seconds held so far (oldest hold of the key).
- ``stats`` / ``statistics()``: a :class:`~lanequeue.LaneStats` of this object's counters.
- ``status()``: a JSON-ready dict: ``kind``, ``name``, ``timeout_s``, ``active``,
  ``waiting``, ``stats`` and the kind's limits.
- counting lanes: ``max_concurrent``, and ``available`` = ``max_concurrent -
  active_count`` (permits this object has not taken; lane-wide free permits:
  ``lane_status()["available"]``).
- per-key lanes: ``max_sessions``, ``idle_timeout_s``, ``session_count``,
  ``cleanup_idle()`` (Redis keeps nothing idle: its ``session_count`` is the keys this
  object holds, ``cleanup_idle()`` returns 0).

Lane-wide views (queries: every process sharing the lane on Redis):

- per-key lanes: ``is_held(key) -> bool``, ``waiting_for(key) -> int``.
- counting lanes: ``holds_of(key) -> int``; ``lane_status() -> dict`` with ``active``
  (holds), ``waiting`` (live waiters), ``available`` (free permits: what this object
  can take now), ``keys`` (key -> seconds its oldest hold has lasted) and
  ``max_concurrent`` (the cap in force: on Redis, the smallest cap a client of the lane
  used within its last lease, if smaller than this object's), all lane-wide. A per-key
  Redis lane has no lane-wide count (it would need a scan of the keyspace).

Several lanes at once (``LaneQueue.acquire_all(key, lane_names)`` /
``AsyncLaneQueue.acquire_all``): entering (``with`` / ``async with``) yields a
:class:`~lanequeue.MultiHold`:

- ``multi[name]``: the hold on that lane, of the lane's own hold type (a thread hold for
  a ``LaneQueue``, an asyncio hold with ``release()`` a coroutine and ``release_nowait()``
  for an ``AsyncLaneQueue``), with the hold surface above; releasing one early is
  allowed, and leaving the block then skips it.
- ``holds`` (in registration order), ``iter(multi)``, ``len(multi)``, ``key``.
- ``multi.release()``: release every hold still held, last taken first; safe to call
  twice. A plain call on threads; on asyncio a coroutine (``await multi.release()``,
  also spelled ``release_async()``), which raises RuntimeError and releases nothing from
  another event loop or thread.
- ``lane_names`` must be a list (any iterable but a ``str``) of registered names
  (TypeError naming ``lane_names`` otherwise, e.g. for None). A lane of the library's
  own classes is driven through its core; any other lane (Redis, a lane of your own, a
  subclass of ``Lane``) through its public ``acquire``.

Errors: a key that is not a ``str`` is a ``TypeError``, an empty key a ``ValueError``, at
the call (for a query on an asyncio face: when it is awaited).

Construction that reads the same everywhere: ``LaneQueue.add_lane(name, ...,
backend=None)`` and ``add_session_lane(name, ..., backend=None)`` make in-process lanes,
or, given a :class:`LaneBackend` such as :class:`lanequeue.redis.RedisBackend`, that
backend's lanes of the same name and arguments.
"""

from __future__ import annotations

import functools
from collections.abc import Awaitable, Callable, Coroutine, Generator
from types import TracebackType
from typing import Any, Literal, ParamSpec, Protocol, TypeVar, runtime_checkable

from ._core import LaneStats
from ._errors import NotOwnerError, shown
from ._validate import public_name

__all__ = [
    "LaneBackend",
    "LaneHold",
    "LaneView",
    "MustAwait",
    "SyncCountingLane",
    "SyncHold",
    "SyncLane",
    "SyncSessionLane",
    "TaskCountingLane",
    "TaskHold",
    "TaskLane",
    "TaskSessionLane",
    "must_await",
    "not_held_error",
]

P = ParamSpec("P")
T = TypeVar("T")
T_co = TypeVar("T_co", covariant=True)

Face = Literal["threads", "asyncio"]


class MustAwait(Coroutine[Any, Any, T_co]):
    """What an asyncio lane's query returns: a coroutine that refuses to be read unawaited.

    ``await`` it (or hand it to ``asyncio.create_task``: it is a
    :class:`collections.abc.Coroutine`) to get the result. Testing it for truth without
    ``await`` (``if lane.try_acquire(key):``) raises TypeError naming the call, instead of
    reading as True; the coroutine is then closed, so it never runs (nothing is taken or
    released) and Python does not add a second "never awaited" warning to the error.
    Dropped without ``await`` and without a truth test, the coroutine is left alone, so
    Python's own "coroutine ... was never awaited" RuntimeWarning still names it.
    """

    __slots__ = ("_coro",)

    def __init__(self, coro: Coroutine[Any, Any, T_co]) -> None:
        self._coro = coro

    def __await__(self) -> Generator[Any, None, T_co]:
        return self._coro.__await__()

    def send(self, value: Any) -> Any:
        return self._coro.send(value)

    def throw(self, typ: Any, val: Any = None, tb: Any = None) -> Any:
        if val is None and tb is None:
            return self._coro.throw(typ)
        return self._coro.throw(typ, val, tb)  # pragma: no cover - old-style throw

    def close(self) -> None:
        self._coro.close()

    def __bool__(self) -> bool:
        name = getattr(self._coro, "__qualname__", "this call")
        short = name.rsplit(".", 1)[-1]
        self._coro.close()
        raise TypeError(
            f"{name}() must be awaited: on the asyncio face it is a coroutine, and its "
            f"result without await is not a bool (write `await ....{short}(...)`)"
        )

    def __repr__(self) -> str:
        return f"<MustAwait {self._coro!r}>"


def must_await(fn: Callable[P, Coroutine[Any, Any, T]]) -> Callable[P, MustAwait[T]]:
    """Decorate an ``async def`` method so that calling it returns a :class:`MustAwait`."""

    name = fn.__name__

    @functools.wraps(fn)
    def call(*args: P.args, **kwargs: P.kwargs) -> MustAwait[T]:
        coro = fn(*args, **kwargs)
        # Named after the caller's public class (``AsyncLane.try_acquire``, not the
        # internal base defining it), in this error and in Python's "never awaited".
        coro.__qualname__ = f"{public_name(type(args[0]))}.{name}"  # type: ignore[attr-defined]
        return MustAwait(coro)

    return call


def not_held_error(lane: str, key: str, token: int, why: str) -> NotOwnerError:
    """The :class:`~lanequeue.NotOwnerError` of ``hold.release()`` on a hold that is not
    the caller's (any more): ``why`` says what happened to it."""
    return NotOwnerError(
        f"lane {lane!r}: the hold of key {shown(key)} (token {token}) is not this caller's: "
        f"{why}; nothing was released"
    )


@runtime_checkable
class LaneHold(Protocol):
    """What every hold shows (see the module docstring for ``release``)."""

    @property
    def key(self) -> str:
        """The key held."""

    @property
    def token(self) -> int:
        """The grant's fencing token; 0 before the grant. Grows with every grant (of the
        key on a per-key lane, of the lane on a counting lane)."""

    @property
    def fencing_token(self) -> int:
        """Same as :attr:`token`."""

    @property
    def held(self) -> bool:
        """True while this hold is the caller's: from the grant until it is released, or
        ended by someone else (``manual_release``, a lost Redis lease)."""


@runtime_checkable
class SyncHold(LaneHold, Protocol):
    """A hold of a thread lane: ``with lane.acquire(key) as hold:``."""

    def release(self) -> bool:
        """End this hold: True; NotOwnerError if it is not the caller's (any more)."""

    def __enter__(self) -> SyncHold: ...

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None: ...


@runtime_checkable
class TaskHold(LaneHold, Protocol):
    """A hold of an asyncio lane: ``async with lane.acquire(key) as hold:``."""

    def release(self) -> Awaitable[bool]:
        """A coroutine: end this hold (as :meth:`SyncHold.release`)."""

    async def __aenter__(self) -> TaskHold: ...

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None: ...


@runtime_checkable
class LaneView(Protocol):
    """Identity and the plain views of this lane object, the same on every face."""

    @property
    def name(self) -> str:
        """The lane's name."""

    @property
    def face(self) -> Face:
        """``"threads"`` or ``"asyncio"``."""

    @property
    def timeout_s(self) -> float | None:
        """The lane's default wait in seconds; None: no limit."""

    @property
    def active_count(self) -> int:
        """Holds of this lane object now."""

    @property
    def waiting(self) -> int:
        """Callers of this lane object waiting now."""

    @property
    def stats(self) -> LaneStats:
        """This lane object's counters."""

    def statistics(self) -> LaneStats:
        """Same as :attr:`stats`."""

    def get_active(self) -> dict[str, float]:
        """Key held through this lane object -> seconds held so far."""

    def status(self) -> dict[str, Any]:
        """A JSON-ready picture of this lane object."""


@runtime_checkable
class SyncLane(LaneView, Protocol):
    """The surface of a thread lane (see the module docstring for each member)."""

    def acquire(self, key: str, *, timeout_s: Any = ...) -> SyncHold: ...

    def try_acquire(self, key: str) -> bool: ...

    def acquire_timeout(self, key: str, timeout_s: Any = ...) -> bool: ...

    def manual_release(self, key: str) -> bool: ...


@runtime_checkable
class SyncCountingLane(SyncLane, Protocol):
    """A counting thread lane (``Lane``, ``RedisLane``)."""

    @property
    def max_concurrent(self) -> int: ...

    @property
    def available(self) -> int: ...

    def holds_of(self, key: str) -> int: ...

    def lane_status(self) -> dict[str, Any]: ...


@runtime_checkable
class SyncSessionLane(SyncLane, Protocol):
    """A per-key thread lane (``SessionLane``, ``RedisSessionLane``)."""

    @property
    def session_count(self) -> int: ...

    def is_held(self, key: str) -> bool: ...

    def waiting_for(self, key: str) -> int: ...


@runtime_checkable
class TaskLane(LaneView, Protocol):
    """The surface of an asyncio lane: the queries are coroutines (see the module
    docstring for each member)."""

    def acquire(self, key: str, *, timeout_s: Any = ...) -> TaskHold: ...

    def try_acquire(self, key: str) -> Awaitable[bool]: ...

    def acquire_timeout(self, key: str, timeout_s: Any = ...) -> Awaitable[bool]: ...

    def manual_release(self, key: str) -> Awaitable[bool]: ...


@runtime_checkable
class TaskCountingLane(TaskLane, Protocol):
    """A counting asyncio lane (``AsyncLane``, ``AsyncRedisLane``)."""

    @property
    def max_concurrent(self) -> int: ...

    @property
    def available(self) -> int: ...

    def holds_of(self, key: str) -> Awaitable[int]: ...

    def lane_status(self) -> Awaitable[dict[str, Any]]: ...


@runtime_checkable
class TaskSessionLane(TaskLane, Protocol):
    """A per-key asyncio lane (``AsyncSessionLane``, ``AsyncRedisSessionLane``)."""

    @property
    def session_count(self) -> int: ...

    def is_held(self, key: str) -> Awaitable[bool]: ...

    def waiting_for(self, key: str) -> Awaitable[int]: ...


class LaneBackend(Protocol):
    """Makes lanes by name, like a queue's ``add_lane`` / ``add_session_lane``
    (:class:`lanequeue.redis.RedisBackend` is one)."""

    def lane(
        self, name: str, *, max_concurrent: int = ..., timeout_s: float | None = ...
    ) -> SyncLane | TaskLane: ...

    def session_lane(
        self,
        name: str = ...,
        *,
        max_sessions: int = ...,
        idle_timeout_s: float | None = ...,
        timeout_s: float | None = ...,
    ) -> SyncLane | TaskLane: ...
