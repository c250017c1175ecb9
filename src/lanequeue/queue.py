"""LaneQueue: named lanes composed per request, all-or-nothing, with roll-back.

``acquire_all(key, ["session", "global"])`` takes the named lanes for ``key`` one after
another and gives them back in reverse. Three rules make the composition safe:

- **One global order.** Lanes are always taken in the order they were registered with
  the queue, whatever order the caller lists them in. Two callers can then never each
  hold a lane the other waits for (no deadlock between ``["a", "b"]`` and ``["b", "a"]``).
- **One deadline.** The whole call waits at most ``timeout_s`` (else the smallest lane
  timeout) in total, not one timeout per lane.
- **All or nothing.** When a lane cannot be had in time, or the wait is interrupted,
  exactly the holds already taken are released, in reverse, before the error propagates.

The registry part (names, order, status) is shared with the asyncio queue
(:class:`lanequeue.AsyncLaneQueue`); the two differ only in how a lane is awaited.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Generator, Iterator, Sequence
from types import TracebackType
from typing import Any, Generic, TypeVar

from ._core import Clock
from ._errors import LaneTimeoutError
from ._face import (
    DEFAULT_GLOBAL_CONCURRENCY,
    DEFAULT_IDLE_TIMEOUT_S,
    DEFAULT_MAX_CONCURRENT,
    DEFAULT_MAX_SESSIONS,
    DEFAULT_TIMEOUT_S,
    CountingKind,
    Hold,
    SessionKind,
)
from ._validate import check_key, check_timeout
from .lanes import Lane, SessionLane, _ThreadFace, _ThreadWaiter

__all__ = ["LaneQueue", "MultiHold", "build_default_lanes"]

T = TypeVar("T")
CL = TypeVar("CL", bound=CountingKind)
SL = TypeVar("SL", bound=SessionKind)
M = TypeVar("M", bound="MultiHold")

# Distinct lane-name lists remembered with their resolved, ordered lanes.
_PLAN_CACHE_MAX = 512


class _SurfaceHold(Hold):
    """A hold on a foreign lane object that only has the public lane surface
    (``acquire_timeout`` / ``manual_release``), such as the source design's own lanes."""

    __slots__ = ()

    def release(self) -> bool:
        token = self._token
        if token <= 0:
            return False
        self._token = -token
        return bool(self.lane.manual_release(self.key))


# One step of a plan: the lane, and its in-process core when the queue may drive the core
# directly (the fast path); None for lanes reached through ``_hold`` (Redis, foreign).
Step = tuple[Any, Any]


class Plan:
    """How one list of lane names is acquired: the steps in registration order, the
    default budget (the smallest lane timeout, None: no limit), and, when every lane is
    an in-process lane of the queue's face, their cores (the fast path)."""

    __slots__ = ("steps", "budget_s", "cores")

    def __init__(self, steps: list[Step], budget_s: float | None) -> None:
        self.steps = steps
        self.budget_s = budget_s
        self.cores: tuple[Any, ...] | None = (
            tuple(core for _, core in steps) if all(c is not None for _, c in steps) else None
        )


_new = object.__new__


class MultiHold:
    """The holds taken by one ``acquire_all`` call, in registration order.

    ``multi[name]`` is the hold on the lane called ``name`` (with its ``token``);
    iterating yields the holds. Leaving the ``with`` block releases them in reverse.
    """

    __slots__ = ("_key", "_plan", "_taken", "_budget_s")

    # Made by the queues with _new() and slot stores (no __init__ frame on the hot path):
    # _key: str; _plan: Plan; _budget_s: the whole call's budget in seconds (None: none);
    # _taken: per step taken so far, its token (in-process core) or its Hold (others).
    _key: str
    _plan: Plan
    _taken: list[Any]
    _budget_s: float | None

    def _view(self, i: int) -> Hold:
        got = self._taken[i]
        if type(got) is int:
            # An in-process token: made into a Hold on first look, and kept in its place,
            # so a release through the view is seen when the block ends.
            got = self._taken[i] = Hold(self._plan.steps[i][0], self._key, None, got)
        hold: Hold = got
        return hold

    @property
    def holds(self) -> list[Hold]:
        """The holds taken, in the order they were taken."""
        return [self._view(i) for i in range(len(self._taken))]

    def __getitem__(self, name: str) -> Hold:
        steps = self._plan.steps
        for i in range(len(self._taken)):
            if steps[i][0].name == name:
                return self._view(i)
        raise KeyError(name)

    def __iter__(self) -> Iterator[Hold]:
        return iter(self.holds)

    def __len__(self) -> int:
        return len(self._taken)

    def _acquiring(
        self, clock: Callable[[], float], waiter_for: Callable[[Any], Any], pending: Any
    ) -> Generator[tuple[Any, Any, Any, float | None], Any, None]:
        """The all-or-nothing loop of ``acquire_all``, written once for both faces.

        Takes the steps not taken yet, in registration order, appending each token or hold
        to ``_taken``. Where a step must wait it yields ``(lane, core, got, remaining)``:
        ``got`` is what ``core.take`` returned (the waiter it put in line, or None when
        refused) for an in-process lane, None for a lane reached through ``_hold``;
        ``remaining`` is what is left of the ONE budget (seconds, None: no limit), which
        runs from the first wait. The face waits in its own way (blocking or awaiting) and
        sends back the token or hold, or a falsy value if none came: then this raises
        LaneTimeoutError naming the lane and the key. ``pending`` is what the first step's
        ``core.take`` already returned, if the face's fast path called it. ``waiter_for``
        gives the waiter factory for a lane. Releasing on failure is the face's job.
        """
        key, budget, taken = self._key, self._budget_s, self._taken
        deadline: float | None = None
        started = False
        for lane, core in self._plan.steps[len(taken):]:
            got = None
            if core is not None:
                if pending is None:
                    got = core.take(key, None if budget == 0 else waiter_for(lane))
                else:
                    got, pending = pending, None
                if type(got) is int:
                    taken.append(got)
                    continue
            now = clock()
            if not started:
                deadline = None if budget is None else now + budget
                started = True
            result = yield lane, core, got, _remaining(deadline, now)
            if not result:
                raise LaneTimeoutError(lane.name, key, budget)
            taken.append(result)

    def _releasing(
        self, block_error: BaseException | None = None
    ) -> Generator[Any, BaseException | None, None]:
        """The release loop of ``acquire_all``, written once for both faces.

        Pops what was taken, last first: ends in-process tokens itself, and yields every
        other hold still held for the face to release (blocking or awaiting); the face
        sends back the exception that release raised, or None. Every hold is released
        even when one release raises; the first error is raised at the end, unless the
        block itself raised ``block_error`` (leaving a ``with`` block): then the block's
        exception propagates and the release error is logged and attached to it as a
        note (C27: a lost lease never replaces the block's own exception).
        """
        key, steps, taken = self._key, self._plan.steps, self._taken
        error: BaseException | None = None
        while taken:
            got = taken.pop()
            try:
                if type(got) is int:
                    steps[len(taken)][1].release(key, got)
                elif got.held:  # a lane's own hold, or a viewed token not released yet
                    error = error or (yield got)
            except BaseException as exc:
                error = error or exc
        if error is not None:
            if block_error is None:
                raise error
            _report_release_error(self._key, error, block_error)

    def __repr__(self) -> str:
        return f"<MultiHold key={self._key!r} {self.holds!r}>"


def _report_release_error(key: str, error: BaseException, block_error: BaseException) -> None:
    """A release failed while the block's own exception propagates: log it, and attach it
    to that exception as a note (Python 3.11+)."""
    text = f"acquire_all({key!r}): release failed on leaving the block: {error}"
    logging.getLogger("lanequeue").warning("%s", text)
    add_note = getattr(block_error, "add_note", None)
    if add_note is not None:
        add_note(text)


def _remaining(deadline: float | None, now: float) -> float | None:
    return None if deadline is None else max(0.0, deadline - now)


def _send(steps: Generator[Any, Any, None], result: Any) -> Any:
    """Resume ``steps`` with ``result``; its next yield, or None once it has finished."""
    try:
        return steps.send(result)
    except StopIteration:
        return None


def _caught(release: Callable[[], Any]) -> BaseException | None:
    """Call ``release``; return what it raised, or None."""
    try:
        release()
    except BaseException as exc:
        return exc
    return None


def _thread_waiter(lane: Any) -> type[_ThreadWaiter]:
    return _ThreadWaiter


class _MultiAcquire(MultiHold):
    """What ``LaneQueue.acquire_all`` returns: entering takes every lane, in order."""

    __slots__ = ()

    def __enter__(self) -> MultiHold:
        if self._taken:
            raise RuntimeError("acquire_all(...) context entered twice")
        cores = self._plan.cores
        if cores is not None and self._budget_s != 0:
            # Fast path: in-process lanes only; take each core in turn until one makes us
            # wait, then hand over to the general loop with that waiter already in line.
            key, taken = self._key, self._taken
            try:
                for core in cores:
                    got = core.take(key, _ThreadWaiter)
                    if type(got) is not int:
                        return self._take_rest(got)
                    taken.append(got)
            except BaseException:  # an interrupt between two takes: give back what we took
                self.release()
                raise
            return self
        return self._take_rest(None)

    def _take_rest(self, pending: Any) -> MultiHold:
        """The general loop (:meth:`MultiHold._acquiring`), waiting by blocking."""
        steps = self._acquiring(time.monotonic, _thread_waiter, pending)
        try:
            wait = next(steps, None)
            while wait is not None:
                wait = _send(steps, self._wait(*wait))
        except BaseException:
            self.release()
            raise
        return self

    def _wait(self, lane: Any, core: Any, got: Any, remaining: float | None) -> Any:
        if core is not None:
            return lane._park(self._key, got, remaining)
        return _hold(lane, self._key, remaining)

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        cores, taken = self._plan.cores, self._taken
        if cores is None:
            self._release_all(exc)
            return
        key = self._key
        while taken:  # last taken first
            token = taken.pop()
            if type(token) is int:
                cores[len(taken)].release(key, token)
            elif token.held:  # viewed as a Hold, and not released through it yet
                token.release()

    def release(self) -> None:
        """Release every hold not released yet, last taken first. Safe to call twice.

        Every hold is released even when one release raises (a Redis hold whose lease was
        lost raises NotOwnerError); the first such error is raised after the loop.
        """
        self._release_all(None)

    def _release_all(self, block_error: BaseException | None) -> None:
        steps = self._releasing(block_error)
        hold = next(steps, None)
        while hold is not None:
            hold = _send(steps, _caught(hold.release))


def _hold(lane: Any, key: str, timeout: float | None) -> Hold | None:
    take = getattr(lane, "_hold", None)
    if take is not None:
        h: Hold | None = take(key, timeout)
        return h
    if lane.acquire_timeout(key, timeout):
        return _SurfaceHold(lane, key, timeout, 1)
    return None


class QueueBase(Generic[CL, SL]):
    """The registry of a queue: names, registration order, plans, status.

    Thread-safe for lookups and acquisitions; add lanes before sharing the queue.
    """

    # The lane classes add_lane / add_session_lane make (the queue's face).
    _counting: type[CL]
    _session: type[SL]

    def __init__(self) -> None:
        self._lanes: dict[str, Any] = {}
        self._rank: dict[str, int] = {}
        self._plans: dict[tuple[str, ...], Plan] = {}

    def add_lane(
        self,
        name: str,
        *,
        max_concurrent: int = DEFAULT_MAX_CONCURRENT,
        timeout_s: float | None = DEFAULT_TIMEOUT_S,
        clock: Clock = time.monotonic,
    ) -> CL:
        """Create and register a counting lane of this queue's face (``Lane`` or
        ``AsyncLane``) with these arguments; return it. ValueError if the name is taken,
        and the lane's own errors for bad arguments."""
        if name in self._lanes:
            raise ValueError(f"a lane named {name!r} is already registered")
        return self.add(
            self._counting(name, max_concurrent=max_concurrent, timeout_s=timeout_s, clock=clock)
        )

    def add_session_lane(
        self,
        name: str = "session",
        *,
        max_sessions: int = DEFAULT_MAX_SESSIONS,
        idle_timeout_s: float | None = DEFAULT_IDLE_TIMEOUT_S,
        timeout_s: float | None = DEFAULT_TIMEOUT_S,
        clock: Clock = time.monotonic,
    ) -> SL:
        """Create and register a per-key lane of this queue's face (``SessionLane`` or
        ``AsyncSessionLane``) with these arguments; return it. ValueError if the name is
        taken, and the lane's own errors for bad arguments."""
        if name in self._lanes:
            raise ValueError(f"a lane named {name!r} is already registered")
        return self.add(
            self._session(
                name,
                max_sessions=max_sessions,
                idle_timeout_s=idle_timeout_s,
                timeout_s=timeout_s,
                clock=clock,
            )
        )

    def _admit(self, lane: Any) -> None:
        """Face-specific check that ``lane`` can join this queue (TypeError if not)."""

    def add(self, lane: T) -> T:
        """Register ``lane`` under its ``name``; lanes are taken in registration order.

        Any object with the lane surface is accepted (``name``, ``timeout_s``,
        ``acquire_timeout(key, timeout_s)``, ``manual_release(key)``).

        Returns ``lane``. Raises ValueError if the name is taken, TypeError if ``lane``
        lacks the surface or belongs to the other face (threads vs asyncio).
        """
        name = getattr(lane, "name", None)
        if not isinstance(name, str) or not name:
            raise TypeError(f"lane must have a non-empty str 'name', got {lane!r}")
        self._admit(lane)
        if name in self._lanes:
            raise ValueError(f"a lane named {name!r} is already registered")
        self._lanes[name] = lane
        self._rank[name] = len(self._rank)
        self._plans.clear()
        return lane

    def get_lane(self, name: str) -> Any:
        """The lane called ``name``, or None."""
        return self._lanes.get(name)

    def __getitem__(self, name: str) -> Any:
        try:
            return self._lanes[name]
        except KeyError:
            raise KeyError(f"lane {name!r} not found") from None

    def __contains__(self, name: object) -> bool:
        return name in self._lanes

    def __len__(self) -> int:
        return len(self._lanes)

    def __iter__(self) -> Iterator[str]:
        return iter(list(self._lanes))

    def list_lanes(self) -> list[str]:
        """Lane names in registration order (the order ``acquire_all`` takes them)."""
        return list(self._lanes)

    def status(self) -> dict[str, Any]:
        """Each lane's ``status()`` by name (for foreign lanes: name and timeout)."""
        out: dict[str, Any] = {}
        for name, lane in self._lanes.items():
            st = getattr(lane, "status", None)
            out[name] = st() if callable(st) else {"name": name, "kind": type(lane).__name__}
        return out

    def _step(self, lane: Any) -> Step:
        """How this queue drives ``lane``: (lane, its core) for an in-process lane of the
        queue's own face, (lane, None) for lanes reached through their ``_hold``."""
        return (lane, None)

    def _plan(self, names: tuple[str, ...]) -> Plan:
        """The :class:`Plan` of a tuple of lane names (checked, then cached)."""
        plan = self._plans.get(names)
        if plan is not None:
            return plan
        for n in names:
            if n not in self._lanes:
                check_key(n, "lane name")
                raise KeyError(f"lane {n!r} not found")
        if len(set(names)) != len(names):
            raise ValueError(f"lane_names lists a lane twice: {list(names)!r}")
        if not names:
            raise ValueError("lane_names must name at least one lane")
        lanes = [self._lanes[n] for n in sorted(names, key=self._rank.__getitem__)]
        timeouts = [t for t in (getattr(x, "timeout_s", None) for x in lanes) if t is not None]
        plan = Plan([self._step(x) for x in lanes], min(timeouts) if timeouts else None)
        if len(self._plans) >= _PLAN_CACHE_MAX:
            self._plans.clear()
        self._plans[names] = plan
        return plan

    def _multi(self, cls: type[M], key: str, lane_names: Sequence[str], timeout_s: Any) -> M:
        """A new, not yet entered ``acquire_all`` of class ``cls`` (arguments checked)."""
        if key.__class__ is not str or not key:
            key = check_key(key)
        names = tuple(lane_names)
        plan = self._plans.get(names)
        if plan is None:
            if isinstance(lane_names, str):
                raise TypeError("lane_names must be a list of lane names, not a str")
            plan = self._plan(names)
        multi = _new(cls)
        multi._key = key
        multi._plan = plan
        multi._taken = []
        multi._budget_s = plan.budget_s if timeout_s is None else check_timeout(timeout_s)
        return multi


class LaneQueue(QueueBase[Lane, SessionLane]):
    """A registry of named lanes for threads, composed per request by :meth:`acquire_all`.

    ``add_lane`` makes a :class:`Lane`, ``add_session_lane`` a :class:`SessionLane`;
    ``add`` registers any lane of the thread face (Redis lanes included).

    Example::

        queue = LaneQueue()
        queue.add_session_lane("session")
        queue.add_lane("global", max_concurrent=8)
        with queue.acquire_all(session_key, ["session", "global"]):
            reply = call_model(...)

    Thread-safe once its lanes are registered.
    """

    _counting = Lane
    _session = SessionLane

    def _step(self, lane: Any) -> Step:
        return (lane, lane._core if isinstance(lane, _ThreadFace) else None)

    def _admit(self, lane: Any) -> None:
        if getattr(lane, "_async_face", False):
            raise TypeError(f"{type(lane).__name__} is an asyncio lane; use AsyncLaneQueue")
        for attr in ("acquire_timeout", "manual_release"):
            if not callable(getattr(lane, attr, None)):
                raise TypeError(f"lane {lane!r} lacks the lane surface: no {attr}()")

    def acquire_all(
        self, key: str, lane_names: Sequence[str], *, timeout_s: float | None = None
    ) -> _MultiAcquire:
        """Hold every named lane for ``key``: a context manager, all or nothing.

        Args:
            key: the request's key (a session key); non-empty ``str``.
            lane_names: names of registered lanes, in any order; they are taken in
                registration order.
            timeout_s: seconds for the WHOLE call; None: the smallest timeout of the named
                lanes; ``math.inf``: no limit; 0: take them only if all are free now.

        Returns:
            a context manager; entering waits and yields a :class:`MultiHold`
            (``holds[name].token``); leaving releases every lane in reverse order.

        Raises:
            TypeError/ValueError: at the call, for a bad key, list or timeout.
            KeyError: at the call, for an unknown lane name.
            LaneTimeoutError: on entering, naming the lane that was not had in time and
                the key; the lanes taken before it are released first, in reverse.

        Thread-safe. Not re-entrant: a thread that already holds ``key`` on a per-key
        lane and asks for it again waits for itself until the deadline.

        Example::

            with queue.acquire_all(session_key, ["session", "global"], timeout_s=30) as h:
                reply = call_model(..., fence=h["session"].fencing_token)
        """
        return self._multi(_MultiAcquire, key, lane_names, timeout_s)


def build_default_lanes() -> LaneQueue:
    """The source design's default queue, ready for its three call patterns.

    Lanes, in this order: ``"session"`` (:class:`SessionLane`, 256 sessions, 3600 s idle),
    ``"global"`` (:class:`Lane`, ``DEFAULT_GLOBAL_CONCURRENCY`` = 8), ``"scheduler"``
    (:class:`Lane`, 2) and ``"subagent"`` (:class:`Lane`, 5); every lane waits up to
    ``DEFAULT_TIMEOUT_S`` (300 s).
    """
    queue = LaneQueue()
    queue.add_session_lane("session")
    queue.add_lane("global", max_concurrent=DEFAULT_GLOBAL_CONCURRENCY)
    queue.add_lane("scheduler", max_concurrent=2)
    queue.add_lane("subagent", max_concurrent=5)
    return queue
