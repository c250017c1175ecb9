"""LaneQueue: named lanes composed per request, all-or-nothing, with roll-back.

``acquire_all(key, ["session", "global"])`` takes the named lanes for ``key`` one after
another and gives them back in reverse. Three rules make the composition safe:

- **One global order.** Lanes are always taken in the order they were registered with
  the queue, whatever order the caller lists them in. Two callers can then never each
  hold a lane the other waits for (no deadlock between ``["a", "b"]`` and ``["b", "a"]``).
- **One deadline.** The whole call waits at most ``timeout_s`` (omitted: the smallest
  lane timeout; None: no limit) in total, not one timeout per lane.
- **All or nothing.** When a lane cannot be had in time, or the wait is interrupted,
  exactly the holds already taken are released, in reverse, before the error propagates.

The registry part (names, order, status) is shared with the asyncio queue
(:class:`lanequeue.AsyncLaneQueue`); the two differ only in how a lane is awaited.
"""

from __future__ import annotations

import inspect
import logging
import sys
import time
import warnings
from collections.abc import Callable, Generator, Iterable, Iterator, Sequence
from functools import partial
from typing import Any, ClassVar, Generic, TypeVar, cast, overload

from ._core import (
    MULTI_LEAVING,
    MULTI_MADE,
    Clock,
    Core,
    CountingCore,
    MultiHoldSteps,
    end_marked,
    parked_grant,
)
from ._errors import LaneTimeoutError, shown
from ._kinds import (
    DEFAULT_GLOBAL_CONCURRENCY,
    DEFAULT_IDLE_TIMEOUT_S,
    DEFAULT_MAX_CONCURRENT,
    DEFAULT_MAX_SESSIONS,
    DEFAULT_TIMEOUT_S,
    DEFAULT_WARN_AFTER_S,
    LANE_DEFAULT,
    CountingKind,
    Hold,
    OnWait,
    SessionKind,
    warn_dropped,
    warn_unentered,
)
from ._obs import StuckHold
from ._ops import LaneOps, LoopWaitWarner, carry_cancel_wait, check_ops_arguments, poll_idle
from ._validate import (
    check_bool,
    check_key,
    check_priority,
    check_timeout,
    check_utf8,
    function_copy,
    made_by,
    own_signatures,
    shown_as_public,
)
from .contract import LaneBackend, SyncHold, SyncLane, TaskLane
from .lanes import Lane, SessionLane, _ThreadFace

__all__ = ["LaneQueue", "MultiHold", "build_default_lanes"]

T = TypeVar("T")
L = TypeVar("L", SyncLane, TaskLane)
CL = TypeVar("CL", bound=CountingKind)
SL = TypeVar("SL", bound=SessionKind)
M = TypeVar("M", bound="MultiHold")

# Distinct lane-name lists remembered with their resolved, ordered lanes.
_PLAN_CACHE_MAX = 512


# One step of a plan: the lane, and its in-process core when the queue may drive the core
# directly (the fast path); None for lanes reached through their public surface (Redis,
# foreign lanes: ``lane.acquire(key, timeout_s=...)``, entered).
Step = tuple["SyncLane | TaskLane", "Core | None"]


class Plan:
    """How one list of lane names is acquired: the steps in registration order, the
    default budget (the smallest lane timeout, None: no limit), and, when every lane is
    an in-process lane of the queue's face, their cores (the fast path)."""

    __slots__ = ("steps", "budget_s", "cores", "kinds", "ended")

    def __init__(self, steps: list[Step], budget_s: float | None, ended: type) -> None:
        self.steps = steps
        self.budget_s = budget_s
        # The class an acquire_all of this plan takes once left (the queue's face's: see
        # _MultiDropWatch), read by the fast path's exit from here: a slot load, where a
        # class attribute read through the slotted multi-hold is not specialised.
        self.ended = ended
        cores = tuple(core for _, core in steps if core is not None)
        self.cores: tuple[Core, ...] | None = cores if len(cores) == len(steps) else None
        # With the cores: ``(core.per_key, core)`` per step, for the fast path's steps
        # (:class:`lanequeue._core.MultiHoldSteps`), which branch on the kind first.
        self.kinds: tuple[tuple[bool, Any], ...] | None = (
            None if self.cores is None else tuple((cast(Any, c).per_key, c) for c in self.cores))


_ZERO = 0  # ``priority is _ZERO``: the default, checked by identity on the hot path


class MultiHold:
    """The holds taken by one ``acquire_all`` call, in registration order.

    ``multi[name]`` is the hold on the lane called ``name``: the lane's own hold type
    (:class:`~lanequeue.ThreadHold` for a ``LaneQueue``, :class:`~lanequeue.AsyncHold` for
    an ``AsyncLaneQueue``, a Redis hold for a Redis lane), with the contract's hold surface
    (``key``, ``token``, ``held``, ``release()``; on asyncio ``release()`` is a coroutine
    and ``release_nowait()`` its plain twin). Releasing one hold early is allowed: leaving
    the block then skips it. ``holds`` lists them, iterating yields them, ``len()`` counts
    them, ``key`` is the request's key. Like a hold, it is single use: entering it again
    (inside its block, or after it) raises RuntimeError; call ``acquire_all`` again.
    Leaving the ``with`` block releases them in reverse; so does ``release()`` (threads) /
    ``await release()`` (asyncio, also spelled ``release_async()``), which is safe to call
    twice.

    Garbage-collected while still holding in-process lanes (entered, never left nor
    released), it warns with a ``ResourceWarning`` per lane naming the lane and the key,
    and those permits return to each lane (see "Dropped holds" in
    :mod:`lanequeue._core`).
    """

    __slots__ = ("_key", "_plan", "_taken", "_budget_s", "_priority", "_stage", "_parked",
                 "_aborted")

    _is_multi: ClassVar[bool] = True  # (see lanequeue._core.record)

    # Made by the queues as cls() and slot stores (no __init__ frame on the hot path):
    # _key: str; _plan: Plan; _budget_s: the whole call's budget in seconds (None: none);
    # _taken: per step taken so far, its token (in-process core) or its Hold (others);
    # _priority: the priority its waits on in-process counting lanes have (checked);
    # _stage: MULTI_MADE, MULTI_ENTERED from the first __enter__ on (single use, as a
    # hold), MULTI_LEAVING once a release pass began (see lanequeue._core.end_marked);
    # _parked: (its waiter, steps taken) once a wait parked (see parked_grant), None once
    # an asyncio enter was refused by its loop check; unset before. _aborted: True once
    # its owner gave up on it (_MultiAcquire._end_wait); unset before.
    _key: str
    _plan: Plan
    _taken: list[Any]
    _budget_s: float | None
    _priority: int
    _parked: tuple[Any, int] | None
    _stage: int

    def _rank_for(self, core: Core) -> int:
        """The priority of a wait on ``core``: the call's on a counting lane, else 0 (a
        per-key lane's waiters stay in arrival order)."""
        return self._priority if core.__class__ is CountingCore else 0

    def _rank_of(self, lane: Any) -> int:
        """The priority of a lane taken through its own ``acquire``: the call's on an
        in-process counting lane (a subclass of :class:`Lane` or :class:`AsyncLane`)
        whose ``acquire`` takes a ``priority``, else 0 (a per-key lane, a Redis lane, an
        override without it: FIFO)."""
        return self._priority if (self._priority and isinstance(lane, CountingKind)
                                  and _takes_priority(type(lane))) else 0

    def _view(self, i: int) -> Hold:
        got = self._taken[i]
        if type(got) is int:
            # An in-process token: made into a Hold on first look, and kept in its place,
            # so a release through the view is seen when the block ends.
            # The lane's own hold class (a plan drives by its core only the library's own
            # lane classes, which all name it).
            lane: Any = self._plan.steps[i][0]
            hold = lane._hold_class()  # made as acquire() makes it (see _DropWatch)
            hold.lane = lane
            hold.key = self._key
            hold._timeout_s = None
            hold._token = got
            got = self._taken[i] = hold
        view: Hold = got
        return view

    @property
    def key(self) -> str:
        """The request's key."""
        return self._key

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
        self, clock: Callable[[], float], prepare: Callable[[Any], Any], pending: Any
    ) -> Generator[tuple[Any, Any, Any, float | None], Any, None]:
        """The all-or-nothing loop of ``acquire_all``, written once for both faces.

        Takes the steps not taken yet, in registration order, appending each token or hold
        to ``_taken``. Where a step must wait it yields ``(lane, core, got, remaining)``:
        ``got`` is 0 (``core.take`` found the in-process lane busy: the face parks with
        ``lane._park``, which records a grant in ``_taken`` itself, as ``core.take``
        does), None for a lane reached through ``_hold``; ``remaining`` is what is left
        of the ONE budget (seconds, None: no limit), which runs from the first wait. The
        face waits in its own way (blocking or awaiting) and sends back the token or
        hold, or a falsy value if none came: then this raises LaneTimeoutError naming
        the lane and the key. ``pending`` is 0 when the face's fast path found the first
        step busy (None: take it here). ``prepare(lane)`` runs before
        an in-process lane is taken (the asyncio face checks the loop there). Releasing
        on failure is the face's job.
        """
        key, budget, taken = self._key, self._budget_s, self._taken
        deadline: float | None = None
        started = False
        for lane, core in self._plan.steps[len(taken):]:
            got = None
            if core is not None:
                if pending is None:
                    prepare(lane)
                    # A grant is appended to ``taken`` in its own commit.
                    got = core.take(key, budget != 0, None, None, taken)
                    if got:
                        continue
                else:
                    got, pending = pending, None  # (0: the face's take found it busy)
                if budget == 0:  # refused (and counted as such by the core)
                    raise LaneTimeoutError(lane.name, key, budget, type(lane).__name__)
            now = clock()
            if not started:
                deadline = None if budget is None else now + budget
                started = True
            result = yield lane, core, got, _remaining(deadline, now)
            if not result:
                raise LaneTimeoutError(lane.name, key, budget, type(lane).__name__)
            if core is None:  # (an in-process lane's grant: recorded by the face's wait)
                taken.append(result)

    def _releasing(
        self, block_error: BaseException | None = None
    ) -> Generator[Any, BaseException | None, None]:
        """The release loop of ``acquire_all``, written once for both faces.

        Pops what was taken, last first: ends in-process tokens itself, and yields every
        other hold still held for the face to release (blocking or awaiting); the face
        sends back the exception that release raised, or None. Every hold is released
        even when one release raises; the first error is raised at the end, unless
        another exception ``block_error`` propagates (the block's own, leaving a ``with``
        block, or what ended an ``acquire_all`` before it had every lane): then that
        exception propagates and the release error is logged and attached to it as a
        note (C27: a lost lease never replaces the block's own exception).
        """
        key, steps, taken = self._key, self._plan.steps, self._taken
        error: BaseException | None = None
        # A pass after one an interrupt stopped releases only what the cores still hold.
        again = self._stage == MULTI_LEAVING
        self._stage = MULTI_LEAVING
        failed_at = -1  # where an in-process release raised (tried again once, see below)
        while taken:
            got = taken[-1]
            n = len(taken)
            core = steps[n - 1][1]
            try:
                if core is not None:  # an in-process lane: its token, or a view of it
                    end_last(taken, core, key, again or failed_at == n)
                    continue
                if _release_due(got):  # a lane's own hold (Redis, foreign)
                    # (yield first, then combine: ``error or (yield got)`` would skip
                    # the yield, and so the release, of every hold after a failed one)
                    failed = yield got
                    error = error or failed
                    if _release_due(got) and failed is not None and not isinstance(
                            failed, Exception):
                        # An interrupt stopped its release before it ended the hold:
                        # the pass ends here, the hold still listed (last), with those
                        # taken before it, for ``release()`` again (as an in-process
                        # release stopped twice, below).
                        break
                # Popped once its release was tried, not before: a face stopped between
                # the yield and the release (an interrupt) closes these steps and leaves
                # the hold listed, for ``release()`` again (it is skipped there once it
                # is no longer held).
                taken.pop()
            except GeneratorExit:  # the face stopped driving this pass: see just above
                raise
            except BaseException as exc:
                error = error or exc
                # An in-process release stopped (an interrupt) before its pop stays last:
                # the next turn ends it unless its release was done. Once: stopped again
                # there, the pass ends with it and those taken before it still listed,
                # for a later release() or the finalizer to end (never popped unreleased:
                # then nobody would).
                if len(taken) == n and core is not None:
                    if failed_at == n:
                        break
                    failed_at = n
        if error is not None:
            # An interrupt (KeyboardInterrupt, a cancellation: not an Exception) is never
            # swallowed: it propagates once every hold is released. A release error (a
            # lost lease) never replaces the block's own exception (C27).
            if block_error is None or not isinstance(error, Exception):
                raise error
            _report_release_error(self._key, error, block_error)

    def __repr__(self) -> str:
        return f"<MultiHold key={shown(self._key)} {self.holds!r}>"


def _release_due(hold: Any) -> bool:
    """Whether a release pass of ``acquire_all`` releases this lane's own hold (Redis,
    foreign): ``held``, or, on a hold that tells it (``_release_due``), also one whose
    release an interrupt stopped before its end, which a later release takes over."""
    due = getattr(hold, "_release_due", None)
    return bool(hold.held if due is None else due())


def end_last(taken: list[Any], core: Core, key: str, again: bool) -> None:
    """A release pass of ``acquire_all``: end the in-process hold last in ``taken`` (its
    token, or a view of it), then drop it from the list. ``again``: an earlier try may
    have released it (an interrupt stopped that pass before the token left the list):
    then it is released only if the core still has it (:func:`end_marked`). A view is
    marked released before its release, as a hold is; one released through itself is
    skipped (silent, as leaving ``with lane.acquire(key)``)."""
    got = taken[-1]
    if type(got) is int:
        if again:
            end_marked(core, key, got)
        else:
            core.release(key, got)
    else:
        token = got._token
        if token > 0:
            got._token = -token
            core.release(key, token)
        else:
            end_marked(core, key, -token)
    taken.pop()


def _report_release_error(key: str, error: BaseException, block_error: BaseException) -> None:
    """A release failed while the block's own exception propagates: log it, and attach it
    to that exception as a note (Python 3.11+)."""
    text = (f"acquire_all({shown(key)}): a release failed while "
            f"{type(block_error).__name__} propagated: {error}")
    logging.getLogger("lanequeue").warning("%s", text)
    add_note = getattr(block_error, "add_note", None)
    if add_note is not None:
        add_note(text)


def _names(lane_names: object) -> tuple[str, ...]:
    """``lane_names`` as a tuple; TypeError naming the argument if it is not a sequence of
    names (a ``str`` is refused: it would read as one lane per character)."""
    if isinstance(lane_names, (str, bytes)) or not isinstance(lane_names, Iterable):
        raise TypeError(
            "lane_names must be a list of lane names, not "
            f"{type(lane_names).__name__}"
        )
    return tuple(lane_names)


def _remaining(deadline: float | None, now: float) -> float | None:
    return None if deadline is None else max(0.0, deadline - now)


def _send(steps: Generator[Any, Any, None], result: Any) -> Any:
    """Resume ``steps`` with ``result``; its next yield, or None once it has finished."""
    try:
        return steps.send(result)
    except StopIteration:
        return None


def _interrupt(exc: BaseException | None) -> BaseException | None:
    """``exc`` if it is an interrupt (not an ``Exception``: a KeyboardInterrupt, say)."""
    return None if exc is None or isinstance(exc, Exception) else exc


def _caught(release: Callable[[], Any]) -> BaseException | None:
    """Call ``release``; return what it raised, or None."""
    try:
        release()
    except BaseException as exc:
        return exc
    return None


def _no_prepare(lane: object) -> None:
    """Threads need no check before taking a lane."""


class _MultiDropWatch:
    """The finalizer of an ``acquire_all`` garbage-collected while holding in-process
    lanes (a mixin of the classes the queues' ``acquire_all`` make): each such permit
    ends as a dropped hold does (:class:`~lanequeue._kinds._DropWatch`) and warns. Leaving the block
    changes the class to the same class without this mixin, as a hold does
    (:class:`lanequeue._kinds._DropWatch`)."""

    __slots__ = ()

    _key: str
    _plan: Plan
    _taken: list[Any]
    _parked: tuple[Any, int] | None
    _stage: int

    def __del__(self, _finalizing: Callable[[], bool] = sys.is_finalizing) -> None:
        try:
            taken = self._taken
        except AttributeError:  # interrupted while being made: it never held anything
            return
        if taken:
            # Each token recorded with its core first (one C call each, no call before
            # the first: see _DropWatch), then the rest of the work. A token a release
            # pass an interrupt stopped had released already (see end_marked) is
            # recorded too and skipped quietly by the core; a viewed token is its
            # view's, which has its own finalizer.
            steps: Any = self._plan.steps  # (in-process steps: (lane, core))
            key = self._key
            i = 0
            for got in taken:  # (no enumerate(): a call, checked for signals after it)
                if got.__class__ is int:
                    steps[i][1]._dropped.append((key, got))
                i += 1  # noqa: SIM113
        if _finalizing():  # the interpreter ends: as _DropWatch
            return
        # A grant to the waiter it parked, recorded nowhere: the wait's handler was
        # stopped by a second interrupt (see parked_grant).
        parked = parked_grant(self, len(taken))
        if parked:
            at = cast(tuple[Any, int], self._parked)[1]  # (set: a grant was found there)
            cast(Any, self._plan.steps[at][1])._dropped.append((self._key, parked))
            self._drop(taken, (at, parked))
        elif taken:
            self._drop(taken, None)
        elif (self._stage == MULTI_MADE and not hasattr(self, "_parked")
              and hasattr(self, "_budget_s")):  # (made whole: its last store is in)
            # never entered (acquire_all() without with), nor refused at its enter
            names = [lane.name for lane, _ in self._plan.steps]
            warn_unentered(f"acquire_all over {names}", self._key,
                           "queue.acquire_all(key, names)", self)

    def _drop(self, taken: list[Any], parked: tuple[int, int] | None) -> None:
        """The finalizer's work after the records, out of ``__del__`` (whose frame, made
        at every drop, stays small: no cells for a comprehension): warn of the tokens the
        cores still hold (``parked``: also (step, token) of the parked waiter's grant),
        and ask each lane to end them now."""
        steps, key = self._plan.steps, self._key
        tokens = [(i, got) for i, got in enumerate(taken) if type(got) is int]
        if parked is not None:
            tokens.append(parked)
        dropped = [(i, got) for i, got in tokens if cast(Core, steps[i][1]).owns(key, got)]
        self._taken = []  # type: ignore[misc]  # ended (see _DropWatch)
        for i, _ in tokens:
            cast(Any, steps[i][0])._dropped_hold()
        for i, got in dropped:
            warn_dropped(steps[i][0], key, got, self)


@shown_as_public
class _MultiAcquire(MultiHoldSteps, MultiHold):
    """What ``LaneQueue.acquire_all`` returns: entering takes every lane, in order;
    leaving releases them, last first. With in-process lanes only, entering and leaving
    run the cores' common steps themselves (:class:`lanequeue._core.MultiHoldSteps`)."""

    __slots__ = ()

    # Copies (own code objects: see function_copy), as every hold class.
    __enter__ = function_copy(MultiHoldSteps._steps_in)
    __exit__ = function_copy(MultiHoldSteps._steps_out)

    def _take_rest(self, pending: Any) -> MultiHold:
        """The general loop (:meth:`MultiHold._acquiring`), waiting by blocking."""
        steps = self._acquiring(time.monotonic, _no_prepare, pending)
        try:
            wait = next(steps, None)
            while wait is not None:
                wait = _send(steps, self._wait(*wait))
        except BaseException as exc:  # give back all; ``exc`` propagates
            self._release_all(exc)
            raise
        return self

    def _end_wait(self) -> None:
        """End the wait this ``acquire_all`` is parked in, if it still waits in the line
        of an in-process lane: that wait raises LaneClearedError, and the call gives back
        what it took, as any failed ``acquire_all`` (a dispatcher's runner whose turn
        ended before it started). A wait for a Redis lane is left to its timeout. Any
        thread; a no-op once the wait ended (its waiter is in no line). The mark comes
        first: a wait that joins a line after the look below sees it and ends itself."""
        self._aborted = True
        parked = getattr(self, "_parked", None)
        if parked is None:
            return
        waiter, at = parked
        steps = self._plan.steps
        core = steps[at][1] if at < len(steps) else None
        if core is not None:
            core.end_waiters(self._key, True, only=waiter)

    def _wait(
        self, lane: SyncLane | TaskLane, core: Core | None, got: Any, remaining: float | None
    ) -> int | SyncHold | None:
        # A LaneQueue admits thread lanes only (``add``), and drives by their core the
        # in-process ones (``_step``).
        if core is not None:
            return cast(_ThreadFace, lane)._park(self._key, remaining, self._rank_for(core),
                                                 self)
        return _hold(cast(SyncLane, lane), self._key, remaining, self._rank_of(lane))

    def release(self) -> None:
        """Release every hold not released yet, last taken first. Safe to call twice.

        Every hold is released even when one release raises (a Redis hold whose lease was
        lost raises LeaseLostError, a NotOwnerError); the first such error is raised after
        the loop.
        """
        self._release_all(None)

    def _release_all(self, block_error: BaseException | None) -> None:
        steps = self._releasing(block_error)
        hold = next(steps, None)
        # An interrupt under way (the one that left the block, or one a release raised):
        # a Redis hold's release then waits for the server only what is left of one
        # CANCEL_WAIT_S (``_release_during``), whatever ``sys.exc_info()`` shows.
        interrupt = _interrupt(block_error)
        while hold is not None:
            during = None if interrupt is None else getattr(hold, "_release_during", None)
            failed = _caught(hold.release if during is None else partial(during, interrupt))
            newer = _interrupt(failed)
            if newer is not None:  # (a new one carries the time already waited on)
                interrupt = carry_cancel_wait(interrupt, newer)
            try:
                hold = _send(steps, failed)
            except BaseException as exc:  # what propagates: the time waited goes with it
                carry_cancel_wait(interrupt, exc)
                raise


def _warn_key_lane_late(queue: str, lanes: Sequence[Any]) -> None:
    """A RuntimeWarning when a per-key lane (one with ``is_held``) comes after another
    lane in ``lanes`` (an ``acquire_all``'s, in registration order, the order it takes
    them): a request then holds the earlier lane's permit while it waits for its key,
    and the other keys wait for those permits (head-of-line blocking). Once per plan
    built (plans are cached), never for a dispatcher's (see ``QueueBase._plan``);
    Python's warning filters show each message once by default."""
    for i, lane in enumerate(lanes):
        if i and hasattr(lane, "is_held") and not hasattr(lanes[i - 1], "is_held"):
            warnings.warn(
                f"{queue}.acquire_all(): the per-key lane {lane.name!r} was registered "
                f"after {lanes[i - 1].name!r}, and acquire_all takes lanes in registration "
                f"order: a request holds its {lanes[i - 1].name!r} permit while it waits "
                "for its key, and other keys wait for those permits. Register per-key "
                "lanes first (as build_default_lanes() does)",
                RuntimeWarning, stacklevel=5)
            return


def _check_backend(backend: object, maker: str, call: str) -> None:
    """TypeError naming ``call``'s argument ``backend`` unless it can make lanes (a
    :class:`LaneBackend`)."""
    if not callable(getattr(backend, maker, None)):
        raise TypeError(
            f"{call} argument 'backend' must be a lane backend (such as "
            f"lanequeue.redis.RedisBackend) with a {maker}() method, or None, not "
            f"{type(backend).__name__}"
        )


#: Lane class -> whether its ``acquire`` takes a ``priority`` (see _takes_priority).
_TAKES_PRIORITY: dict[type, bool] = {}


def _takes_priority(cls: type) -> bool:
    """Whether ``cls.acquire`` takes a ``priority`` argument (looked up once per class)."""
    got = _TAKES_PRIORITY.get(cls)
    if got is None:
        try:
            params = inspect.signature(cls.acquire).parameters  # type: ignore[attr-defined]
            got = "priority" in params or any(
                p.kind is p.VAR_KEYWORD for p in params.values())
        except (TypeError, ValueError):
            got = False
        _TAKES_PRIORITY[cls] = got
    return got


def _hold(lane: SyncLane, key: str, timeout: float | None, priority: int = 0
          ) -> SyncHold | None:
    """Take ``lane`` for ``key`` through its public surface (a lane the queue does not
    drive through its core), with ``priority`` when not 0 (see ``MultiHold._rank_of``):
    the entered hold, or None when none came in time."""
    hold = (lane.acquire(key, timeout_s=timeout, priority=priority) if priority  # type: ignore[call-arg]
            else lane.acquire(key, timeout_s=timeout))
    try:
        hold.__enter__()
    except LaneTimeoutError:
        return None
    return hold



@shown_as_public
class _WatchedMultiAcquire(_MultiDropWatch, _MultiAcquire):
    """A :class:`_MultiAcquire` with the finalizer of a dropped ``acquire_all``, until
    its block is left."""

    __slots__ = ()


_MultiAcquire._ended_class = _MultiAcquire

class QueueBase(Generic[L, CL, SL]):
    """The registry of a queue: names, registration order, plans, status.

    Thread-safe for lookups and acquisitions; add lanes before sharing the queue.
    """

    # The lane classes add_lane / add_session_lane make (the queue's face), the face's
    # name and its surface (a Protocol of lanequeue.contract).
    _counting: type[CL]
    _session: type[SL]
    _face: str
    _surface: type[L]
    _multi_ended: type  # the class an acquire_all takes once left (its Plan's ``ended``)

    def __init_subclass__(cls, **kwargs: Any) -> None:
        # Python's own argument errors then name LaneQueue / AsyncLaneQueue, not this base.
        super().__init_subclass__(**kwargs)
        own_signatures(cls, QueueBase)

    def __init__(
        self,
        *,
        warn_after_s: float | None = DEFAULT_WARN_AFTER_S,
        on_wait: OnWait | None = None,
        warn_hold_s: float | None = None,
    ) -> None:
        # Given to every lane add_lane / add_session_lane make; checked here, at the call.
        self._ops: dict[str, Any] = dict(check_ops_arguments(
            f"{type(self).__name__}() argument", warn_after_s, on_wait, warn_hold_s))
        self._lanes: dict[str, L] = {}
        self._rank: dict[str, int] = {}
        self._plans: dict[tuple[str, ...], Plan] = {}
        # Lists of names whose plans never warn of their order (see _plan's ``warn``).
        self._unwarned: set[tuple[str, ...]] = set()

    @overload
    def add_lane(
        self,
        name: str,
        *,
        max_concurrent: int = ...,
        timeout_s: float | None = ...,
        clock: Clock | None = ...,
        backend: None = ...,
    ) -> CL: ...

    @overload
    def add_lane(
        self,
        name: str,
        *,
        max_concurrent: int = ...,
        timeout_s: float | None = ...,
        clock: Clock | None = ...,
        backend: LaneBackend,
    ) -> L: ...

    def add_lane(
        self,
        name: str,
        *,
        max_concurrent: int = DEFAULT_MAX_CONCURRENT,
        timeout_s: float | None = DEFAULT_TIMEOUT_S,
        clock: Clock | None = None,
        backend: LaneBackend | None = None,
    ) -> CL | L:
        """Create and register a counting lane; return it.

        Args:
            name, max_concurrent, timeout_s: as on ``Lane``.
            clock: the in-process lane's clock (default ``time.monotonic``); not with a
                backend (Redis lanes run on the server's clock).
            backend: None for an in-process lane of this queue's face (``Lane`` or
                ``AsyncLane``), or a backend (:class:`lanequeue.redis.RedisBackend`) whose
                ``lane(name, max_concurrent=..., timeout_s=...)`` makes it.

        Raises:
            ValueError: the name is empty or taken; ``clock`` given with a backend.
            TypeError: the name is not a ``str``; ``backend`` is not a lane backend; the
                backend's lane belongs to the other face (threads vs asyncio).
            TypeError/ValueError: the lane's own errors for bad arguments. Every argument
                error names this call and the argument
                (``LaneQueue.add_lane() argument 'max_concurrent' must be >= 1, got 0``),
                with or without a backend, not the lane class it makes.
        """
        return cast("CL | L", self._add_made(
            "add_lane", "lane", name, clock, backend,
            {"max_concurrent": max_concurrent, "timeout_s": timeout_s},
        ))

    @overload
    def add_session_lane(
        self,
        name: str = ...,
        *,
        max_sessions: int = ...,
        idle_timeout_s: float | None = ...,
        timeout_s: float | None = ...,
        clock: Clock | None = ...,
        backend: None = ...,
    ) -> SL: ...

    @overload
    def add_session_lane(
        self,
        name: str = ...,
        *,
        max_sessions: int = ...,
        idle_timeout_s: float | None = ...,
        timeout_s: float | None = ...,
        clock: Clock | None = ...,
        backend: LaneBackend,
    ) -> L: ...

    def add_session_lane(
        self,
        name: str = "session",
        *,
        max_sessions: int = DEFAULT_MAX_SESSIONS,
        idle_timeout_s: float | None = DEFAULT_IDLE_TIMEOUT_S,
        timeout_s: float | None = DEFAULT_TIMEOUT_S,
        clock: Clock | None = None,
        backend: LaneBackend | None = None,
    ) -> SL | L:
        """Create and register a per-key lane; return it.

        Args:
            name, max_sessions, idle_timeout_s, timeout_s: as on ``SessionLane``.
            clock: the in-process lane's clock (default ``time.monotonic``); not with a
                backend.
            backend: None for an in-process lane of this queue's face (``SessionLane`` or
                ``AsyncSessionLane``), or a backend whose ``session_lane(name, ...)``
                makes it.

        Raises:
            ValueError: the name is empty or taken; ``clock`` given with a backend.
            TypeError: the name is not a ``str``; ``backend`` is not a lane backend; the
                backend's lane belongs to the other face.
            TypeError/ValueError: the lane's own errors for bad arguments, naming this
                call and the argument (``LaneQueue.add_session_lane() argument
                'max_sessions' ...``), as ``add_lane`` does.
        """
        return cast("SL | L", self._add_made(
            "add_session_lane", "session_lane", name, clock, backend,
            {"max_sessions": max_sessions, "idle_timeout_s": idle_timeout_s,
             "timeout_s": timeout_s},
        ))

    def _add_made(
        self, method: str, maker: str, name: object, clock: Clock | None,
        backend: LaneBackend | None, args: dict[str, Any],
    ) -> L:
        """What :meth:`add_lane` (``maker`` "lane") and :meth:`add_session_lane`
        ("session_lane") do: check the name, make the lane with ``args`` (in process, or
        by ``backend``'s ``maker``), register it and return it. Argument errors name the
        public ``method`` called."""
        call = f"{type(self).__name__}.{method}()"
        name = self._new_name(name, call)
        with made_by(call):  # the lane's own argument errors name this call
            if backend is None:
                kind: Any = self._counting if maker == "lane" else self._session
                made_here: L = kind(
                    name, clock=time.monotonic if clock is None else clock, **args,
                    **self._ops,
                )
                return self.add(made_here)
            self._no_clock(clock, call)
            _check_backend(backend, maker, call)
            made = backend.lane if maker == "lane" else backend.session_lane
            lane = made(name, **args, **self._ops)
        return self._add(cast(L, lane), f"{call} argument 'backend'")  # checks the face

    def _new_name(self, name: object, call: str) -> str:
        """``name`` for a new lane of this queue, as a plain ``str``: TypeError/ValueError
        naming ``call``'s argument if it is not a non-empty ``str`` or is taken."""
        checked = check_key(name, f"{call} argument 'name'")
        if checked in self._lanes:
            raise ValueError(
                f"{call} argument 'name': a lane named {checked!r} is already registered")
        return checked

    @staticmethod
    def _no_clock(clock: Clock | None, call: str) -> None:
        if clock is not None:
            raise ValueError(f"{call} argument 'clock' applies to in-process lanes only, "
                             "not with a backend")

    def add(self, lane: T) -> T:
        """Register ``lane`` under its ``name``; lanes are taken in registration order.

        Any object with this queue's lane surface is accepted (:class:`lanequeue.SyncLane`
        for ``LaneQueue``, :class:`lanequeue.TaskLane` for ``AsyncLaneQueue``), whose
        ``face`` is the queue's.

        Returns ``lane``. Raises ValueError if the name is taken, TypeError if ``lane``
        lacks the surface or belongs to the other face (threads vs asyncio); the errors
        name the call and the argument.
        """
        return self._add(lane, f"{type(self).__name__}.add() argument 'lane'")

    def _add(self, lane: T, where: str) -> T:
        """:meth:`add`, its errors starting with ``where`` (the call and argument the
        user gave: ``add()``'s lane, ``add_lane()``'s backend)."""
        if not isinstance(lane, self._surface):
            raise TypeError(
                f"{where}: {lane!r} lacks the lane surface ({self._surface.__name__} of "
                "lanequeue.contract)"
            )
        name = lane.name
        if not isinstance(name, str) or not name:
            raise TypeError(f"{where} must have a non-empty str 'name', got {lane!r}")
        if lane.face != self._face:
            other = "AsyncLaneQueue" if lane.face == "asyncio" else "LaneQueue"
            raise TypeError(
                f"{where}: {type(lane).__name__} is a lane of the {lane.face!r} face, and "
                f"this queue's is {self._face!r}: use {other}, or a lane (a backend's "
                f"client) of the {self._face!r} face"
            )
        if name in self._lanes:
            raise ValueError(f"{where}: a lane named {name!r} is already registered")
        self._lanes[name] = lane
        self._rank[name] = len(self._rank)
        self._plans.clear()
        return lane

    def get_lane(self, name: str) -> L | None:
        """The lane called ``name``, or None. Raises TypeError when ``name`` is not a
        ``str``. Thread-safe (a read)."""
        if not isinstance(name, str):
            raise TypeError(
                f"{type(self).__name__}.get_lane() argument 'name' must be a str, "
                f"not {type(name).__name__}"
            )
        return self._lanes.get(name)

    def __getitem__(self, name: str) -> L:
        try:
            return self._lanes[name]
        except KeyError:
            raise KeyError(f"lane {name!r} not found ({self._named()})") from None

    def _named(self) -> str:
        """The queue's lanes, for an error that names a lane it does not have."""
        names = list(self._lanes)
        return f"the queue's lanes: {names!r}" if names else "the queue has no lane yet"

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
        """Each lane's ``status()`` by name (never a round trip to Redis)."""
        return {name: lane.status() for name, lane in self._lanes.items()}

    # -- operations over every lane (Redis lanes: this process's waiters and holds)

    def _ops_lanes(self) -> list[LaneOps]:
        return [x for x in self._lanes.values() if isinstance(x, LaneOps)]

    def stuck(self, older_than_s: float) -> dict[str, list[StuckHold]]:
        """Each lane's :meth:`~lanequeue.Lane.stuck` holds (a Redis lane: this process's),
        by lane name (lanes with none left out). Raises TypeError/ValueError for a bad threshold."""
        out: dict[str, list[StuckHold]] = {}
        for lane in self._ops_lanes():
            holds = lane.stuck(older_than_s)
            if holds:
                out[lane.name] = holds
        return out

    def clear(self, key: str) -> int:
        """End every wait for ``key`` on every lane (a Redis lane: this process's waits;
        each waiter raises :class:`LaneClearedError`; an ``acquire_all`` waiting for
        ``key`` gives back what it took first). Holders keep their permits. Returns how
        many waits were ended.
        Raises TypeError/ValueError for a bad key."""
        key = check_key(key)
        lanes = self._checked_wakers()
        return sum(lane.clear(key) for lane in lanes)

    def close(self) -> None:
        """:meth:`~lanequeue.Lane.close` every lane (a Redis lane: this lane object):
        refuse new acquisitions and end every wait with :class:`LaneDrainingError`;
        holders finish. Idempotent. On an ``AsyncLaneQueue``, RuntimeError (and no lane
        changed) when a lane is bound to another event loop than the caller's."""
        self._start_drain(True)

    def _checked_wakers(self) -> list[LaneOps]:
        """The lanes, after checking that the caller may wake the waiters of every one of
        them (asyncio: on each lane's loop): a refusal changes nothing."""
        lanes = self._ops_lanes()
        for lane in lanes:  # every lane checked before any is bound (a refusal changes
            refusal = lane._waker_refusal()  # nothing, not even a binding)
            if refusal is not None:
                raise refusal
        for lane in lanes:
            lane._check_waker()
        return lanes

    def _start_drain(self, cancel_waiting: bool) -> None:
        lanes = self._checked_wakers() if cancel_waiting else self._ops_lanes()
        for lane in lanes:
            lane._start_drain(cancel_waiting)

    def _idle(self) -> bool:
        return all(lane._idle() for lane in self._ops_lanes())

    def _step(self, lane: L) -> Step:
        """How this queue drives ``lane``: (lane, its core) for an in-process lane of the
        queue's own face whose class is exactly the library's, (lane, None) for every
        other lane (Redis, foreign, subclasses), taken through its public ``acquire``
        (``_hold``)."""
        return (lane, None)

    def _plan(self, names: tuple[str, ...], warn: bool = True) -> Plan:
        """The :class:`Plan` of a tuple of lane names (checked, then cached). Building
        it warns when a per-key lane comes after another lane (``_warn_key_lane_late``),
        unless a call with ``warn`` False was made for the same tuple before, or is this
        one: a dispatcher's, whose turns (``acquire_all`` with that tuple) it runs one
        per key at a time, so none waits for its key while it holds another lane."""
        plan = self._plans.get(names)
        if plan is not None:
            if not warn:
                self._unwarned.add(names)
            return plan
        for n in names:
            if n not in self._lanes:
                check_key(n, "lane name")
                raise KeyError(f"lane {n!r} not found ({self._named()})")
        if len(set(names)) != len(names):
            raise ValueError(f"lane_names lists a lane twice: {list(names)!r}")
        if not names:
            raise ValueError("lane_names must name at least one lane")
        lanes = [self._lanes[n] for n in sorted(names, key=self._rank.__getitem__)]
        if not warn:
            self._unwarned.add(names)
        elif names not in self._unwarned:
            _warn_key_lane_late(type(self).__name__, lanes)
        timeouts = [x.timeout_s for x in lanes if x.timeout_s is not None]
        plan = Plan([self._step(x) for x in lanes], min(timeouts) if timeouts else None,
                    self._multi_ended)
        if len(self._plans) >= _PLAN_CACHE_MAX:
            self._plans.clear()
        self._plans[names] = plan
        return plan

    def _multi(self, cls: type[M], key: str, lane_names: Sequence[str], timeout_s: Any,
               priority: Any = 0) -> M:
        """A new, not yet entered ``acquire_all`` of class ``cls`` (arguments checked)."""
        if key.__class__ is not str or not key:
            key = check_key(key)
        if lane_names.__class__ is list or lane_names.__class__ is tuple:
            names = tuple(lane_names)
        else:
            names = _names(lane_names)
        plan = self._plans.get(names)
        if plan is None:
            plan = self._plan(names)
        if plan.cores is None and not key.isascii():
            # A lane other than the queue's own in-process ones (a Redis lane) may refuse
            # a key it cannot send: refused here, before anything is taken or waited for.
            check_utf8(key)
        # (checked before it is made: one made and dropped unused warns, _MultiDropWatch)
        budget = plan.budget_s if timeout_s is LANE_DEFAULT else check_timeout(timeout_s)
        rank = priority if priority is _ZERO else check_priority(priority)
        multi = cls()  # no __init__ frame: the made classes have object's
        multi._stage = MULTI_MADE  # (first: the finalizer reads it once _taken is set)
        multi._plan = plan
        multi._taken = []
        multi._key = key
        multi._budget_s = budget
        multi._priority = rank
        return multi


class LaneQueue(LoopWaitWarner, QueueBase[SyncLane, Lane, SessionLane]):
    """A registry of named lanes for threads, composed per request by :meth:`acquire_all`.

    ``add_lane`` makes a :class:`Lane`, ``add_session_lane`` a :class:`SessionLane` (or,
    with ``backend=RedisBackend(client)``, their Redis twins); ``add`` registers any lane
    of the thread face (:class:`lanequeue.SyncLane`).

    ``warn_after_s``, ``on_wait`` and ``warn_hold_s`` (keyword arguments, see
    :class:`Lane`) are given to every lane ``add_lane`` / ``add_session_lane`` make;
    they are checked here, at construction, as a lane checks them (TypeError/ValueError
    naming the queue class and the argument).
    ``drain``, ``wait_idle``, ``clear``, ``close`` and ``stuck`` apply to every lane of
    the queue (a Redis lane: this process's holders and waiters).

    Example:

        >>> queue = LaneQueue()
        >>> session = queue.add_session_lane("session")
        >>> llm = queue.add_lane("global", max_concurrent=8)
        >>> with queue.acquire_all("gateway:web:42", ["session", "global"]):
        ...     session.is_held("gateway:web:42"), llm.available
        (True, 7)

    Thread-safe once its lanes are registered.
    """

    _loop_stops = "maybe the holders, whose releases would end this wait"
    _loop_instead = "Use AsyncLaneQueue (build_default_async_lanes()) in async code"

    _counting = Lane
    _session = SessionLane
    _face = "threads"
    _surface = SyncLane
    _multi_ended = _MultiAcquire

    def _step(self, lane: SyncLane) -> Step:
        # The core only for the library's own classes: a subclass may override acquire,
        # so it is taken through its public surface.
        return (lane, cast(Lane, lane)._core if type(lane) in (Lane, SessionLane) else None)

    def acquire_all(
        self, key: str, lane_names: Sequence[str], *, timeout_s: Any = LANE_DEFAULT,
        priority: int = 0,
    ) -> _MultiAcquire:
        """Hold every named lane for ``key``: a context manager, all or nothing.

        Args:
            key: the request's key (a session key); non-empty ``str``.
            lane_names: names of registered lanes, in any order; they are taken in
                registration order (a per-key lane registered after another lane warns:
                a RuntimeWarning, once per list of names, as a request would hold the
                other lane's permit while it waits for its key; not for the list of a
                dispatcher built over this queue, which runs one turn per key at a
                time).
            timeout_s: seconds for the WHOLE call; omitted: the smallest ``timeout_s`` of
                the named lanes; None (or ``math.inf``): no limit; 0: take them only if
                all are free now.
            priority: an ``int`` in ``[-2**31, 2**31 - 1]``, the priority of the waits
                on the in-process counting lanes (:class:`Lane`; see
                :meth:`Lane.acquire`; a subclass of :class:`Lane` gets it through its
                own ``acquire``, if that takes a ``priority``). Per-key lanes keep their
                arrival order, and Redis lanes and lanes of other kinds serve FIFO:
                there it changes nothing.

        Returns:
            a context manager; entering waits and yields a :class:`MultiHold`
            (``holds[name].token``); leaving releases every lane in reverse order.

        Raises:
            TypeError/ValueError: at the call, for a bad key, list, timeout or priority.
            KeyError: at the call, for an unknown lane name.
            LaneTimeoutError: on entering, naming the lane that was not had in time and
                the key; the lanes taken before it are released first, in reverse.

        Thread-safe. Not re-entrant: a thread that already holds ``key`` on a per-key
        lane and asks for it again waits for itself until the deadline.

        Example: the holds are taken in registration order, whatever the order given.

            >>> queue = build_default_lanes()
            >>> with queue.acquire_all("gateway:web:42", ["global", "session"], timeout_s=30) as h:
            ...     h["session"].fencing_token > 0, queue["global"].active_count
            (True, 1)
        """
        return self._multi(_WatchedMultiAcquire, key, lane_names, timeout_s, priority)

    def drain(self, timeout_s: float | None = 0.0, *, cancel_waiting: bool = False) -> bool:
        """:meth:`lanequeue.Lane.drain` for every lane at once, with ONE wait:
        every lane refuses new acquisitions (an ``acquire_all`` naming any of them raises
        :class:`LaneDrainingError`, holding nothing), then this waits up to
        ``timeout_s`` seconds (0: not at all; None: no limit) for all of them to be idle.

        Returns True if every lane is idle on return. Raises TypeError/ValueError for a
        bad timeout. A Redis lane drains this lane object (this process's holders and waiters).

        Example:

            >>> queue = build_default_lanes()
            >>> queue.drain(timeout_s=1.0)
            True
        """
        timeout = check_timeout(timeout_s)
        cancel_waiting = check_bool(cancel_waiting, "cancel_waiting")
        self._start_drain(cancel_waiting)
        return self.wait_idle(timeout)

    def wait_idle(self, timeout_s: float | None) -> bool:
        """Wait up to ``timeout_s`` seconds (None: no limit) until no lane of
        the queue has a holder or a waiter; False when the timeout passed first. Looks
        every 10 ms. Raises TypeError/ValueError for a bad timeout."""
        timeout = check_timeout(timeout_s)
        return poll_idle(self._idle, timeout, self)


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
