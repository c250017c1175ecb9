"""What the workers of a replay observe, independently of the lanes' own statistics.

The lanes are the thing under test, so the replay does not believe their counters: each
worker reports the moment its work starts and ends to an :class:`Observer`, which keeps,
under one small lock of its own,

- an occupancy counter per key (how many workers of one conversation are working now;
  its maximum is ``max_key_concurrency``, which must be 1),
- a global occupancy counter (its maximum is ``peak_global``, which must not exceed the
  global cap),
- the order in which work started (a conversation's requests must start in arrival order;
  each request that starts after a later request of its conversation is an
  ``order_violation``).

:class:`ArrivalGate` solves a problem of the harness, not of the lanes: a thread started
for a request may be scheduled later than a thread started after it, so two requests of
one conversation that arrive close together could *enter* the session lane in the wrong
order, and the lane would then rightly serve them in that wrong order. The gate lets a
request enter the first lane only once every earlier request of the same lane slot (its
key on a SessionLane, everyone on a shared Lane) that has not finished is already inside
that lane (holding or in line), as the lane's own ``is_held``/``waiting_for`` (or
``active_count``/``waiting``) report. The gate never decides who runs first: it only makes
"arrival order" well-defined for the lane; the lane's FIFO then decides, and the observer
checks it.

How many earlier requests have *finished* comes from a :class:`CompletionCounter`: an
in-process count (:class:`LocalCompletionCounter`, the default) for one process, or a
counter every process shares (the Redis runtime keeps one per conversation in Redis,
:mod:`lanequeue.replay.runtimes.redis_processes`), so the same gate orders requests of one
conversation that arrive at different processes.
"""

from __future__ import annotations

import asyncio
import heapq
import math
import threading
import time
from collections.abc import Awaitable, Callable, Hashable, Sequence
from fractions import Fraction
from typing import Protocol

__all__ = [
    "ArrivalGate",
    "AsyncArrivalGate",
    "AsyncCompletionCounter",
    "CompletionCounter",
    "LocalCompletionCounter",
    "Observer",
    "count_order_violations",
    "peak_concurrency",
]


def peak_concurrency(starts: Sequence[float | Fraction], ends: Sequence[float | Fraction]) -> int:
    """Most intervals ``[start, end)`` open at once (an end at t closes before a start at t)."""
    events = sorted([(float(e), 0) for e in ends] + [(float(s), 1) for s in starts])
    running = peak = 0
    for _, kind in events:
        running += 1 if kind else -1
        peak = max(peak, running)
    return peak


def count_order_violations(conversations: Sequence[Hashable], start_order: Sequence[int]) -> int:
    """Requests overtaken: those that started after a later-arriving request of the same
    conversation. This is the one definition of the replay's ``order_violations``.

    Args:
        conversations: the conversation of each request; requests are indexed in arrival
            order (index 0 arrived first).
        start_order: request indices in the order their work started.

    Returns:
        The number of requests overtaken by a later request of their own conversation
        (0 when every conversation's requests started in arrival order).

    Example: one conversation's requests 0, 1, 2 starting in the order 2, 0, 1 (2
    overtook both) count 2; in the order 1, 2, 0 (only 0 was overtaken) count 1:

    >>> count_order_violations(["c", "c", "c"], [2, 0, 1])
    2
    >>> count_order_violations(["c", "c", "c"], [1, 2, 0])
    1
    """
    latest: dict[Hashable, int] = {}
    violations = 0
    for rid in start_order:
        conv = conversations[rid]
        seen = latest.get(conv, -1)
        if rid < seen:
            violations += 1
        else:
            latest[conv] = rid
    return violations


class Observer:
    """The workers' own record of a replay: occupancy per key and overall, start order.

    All times are seconds of ``clock`` minus ``epoch_s`` (the start of the replay). The
    registry is sampled as each request starts work (an entry is made by the request that
    takes a new key, which then starts work; a release adds none), and once more at the
    end by the runtime (``registry_final``). Call
    :meth:`work_started` right after the lanes are held, :meth:`work_ended` right before
    they are released (so a successor's start can never be counted while this worker still
    counts itself) and :meth:`completed` after the release. Thread-safe.
    """

    def __init__(
        self,
        keys: Sequence[str],
        *,
        epoch_s: float,
        clock: Callable[[], float] = time.monotonic,
        registry_size: Callable[[], int] | None = None,
    ) -> None:
        n = len(keys)
        self._keys = keys
        self._epoch = epoch_s
        self._clock = clock
        self._registry_size = registry_size
        self._lock = threading.Lock()
        self._occupancy: dict[str, int] = {}
        self._running = 0
        #: highest number of workers of one key working at once
        self.max_key_concurrency = 0
        #: highest number of workers working at once
        self.peak_global = 0
        #: highest registry size sampled (None without ``registry_size``)
        self.registry_peak: int | None = None
        self.start_s = [math.nan] * n
        self.end_work_s = [math.nan] * n
        self.complete_s = [math.nan] * n
        self.start_order: list[int] = []
        self.completed_count = 0

    def now(self) -> float:
        """Seconds since the epoch of the replay."""
        return self._clock() - self._epoch

    def sample_registry(self) -> int | None:
        """Sample the registry size now (also folded into ``registry_peak``); None if the
        policy has no registry."""
        if self._registry_size is None:
            return None
        size = self._registry_size()  # takes the lane's lock: never call it under ours
        with self._lock:
            self._fold_registry(size)
        return size

    def _fold_registry(self, size: int) -> None:
        # (under ``_lock``)
        if self.registry_peak is None or size > self.registry_peak:
            self.registry_peak = size

    def work_started(self, rid: int) -> float:
        """Request ``rid`` holds every lane and starts working now; returns that instant,
        seconds since the epoch (``start_s[rid]``): its work ends at this plus its work
        time, however long the bookkeeping after it takes. The registry is sampled right
        after that instant (before ``_lock`` is taken: the probe takes the lane's lock),
        and folded in the same hold of ``_lock`` as the start."""
        key = self._keys[rid]
        t = self._clock() - self._epoch
        probe = self._registry_size
        size = None if probe is None else probe()
        with self._lock:
            occ = self._occupancy.get(key, 0) + 1
            self._occupancy[key] = occ
            if occ > self.max_key_concurrency:
                self.max_key_concurrency = occ
            self._running += 1
            if self._running > self.peak_global:
                self.peak_global = self._running
            self.start_s[rid] = t
            self.start_order.append(rid)
            if size is not None:
                self._fold_registry(size)
        return t

    def work_ended(self, rid: int) -> None:
        """Request ``rid`` stops working now and is about to release its lanes."""
        key = self._keys[rid]
        with self._lock:
            self.end_work_s[rid] = self._clock() - self._epoch
            occ = self._occupancy[key] - 1
            if occ:
                self._occupancy[key] = occ
            else:
                del self._occupancy[key]
            self._running -= 1

    def completed(self, rid: int) -> None:
        """Request ``rid`` has released its lanes (its completion time is now)."""
        with self._lock:
            self.complete_s[rid] = self._clock() - self._epoch
            self.completed_count += 1


class CompletionCounter(Protocol):
    """How many requests of a lane slot have finished: what :class:`ArrivalGate` needs.

    ``finish(slot)`` must be called only after the request has left the lanes (released),
    and ``done(slot)`` must count every ``finish`` that returned before the call began,
    across everyone sharing the counter (threads of one process, or processes).
    """

    def done(self, slot: Hashable) -> int:
        """Requests of ``slot`` finished so far."""
        ...

    def finish(self, slot: Hashable) -> None:
        """One more request of ``slot`` has left the lanes."""
        ...


class LocalCompletionCounter:
    """A :class:`CompletionCounter` for the threads of one process (a dict under a lock)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._finished: dict[Hashable, int] = {}

    def done(self, slot: Hashable) -> int:
        with self._lock:
            return self._finished.get(slot, 0)

    def finish(self, slot: Hashable) -> None:
        with self._lock:
            self._finished[slot] = self._finished.get(slot, 0) + 1


def _ranks(slots: Sequence[Hashable]) -> tuple[list[int], list[bool]]:
    """Per request: how many requests of its slot arrived before it, and whether it is
    the last of its slot (nobody waits for it to finish)."""
    seen: dict[Hashable, int] = {}
    rank: list[int] = []
    for slot in slots:
        r = seen.get(slot, 0)
        rank.append(r)
        seen[slot] = r + 1
    last = [r == seen[slot] - 1 for r, slot in zip(rank, slots, strict=True)]
    return rank, last


class ArrivalGate:
    """Makes requests enter the first lane in arrival order within each lane slot.

    Args:
        slots: the slot of each request, indexed in arrival order (its key for a per-key
            lane; one shared value for a counting lane). With several processes, every
            process passes the slots of ALL requests (ranks are global), and drives only
            its own share.
        inside: ``inside(slot)`` returns how many requests of ``slot`` are inside the lane
            now (holding or waiting). It must read holders *before* waiters, which is what
            makes the check below safe (see :meth:`wait_turn`).
        poll_s: seconds between the first two checks while a predecessor is not yet
            inside.
        max_poll_s: the interval doubles after each check up to this (default
            ``poll_s``: a fixed interval). For an ``inside`` that costs round trips
            (Redis), so that a backlog of held requests does not crowd out the lanes'
            own calls.
        counter: where finished requests are counted (default: in this process only);
            share one across processes that drive requests of the same slots.
        max_wait_s: give up (TimeoutError) after waiting this long for predecessors to
            enter; None waits without limit. A predecessor that never enters means the
            harness is broken (a worker died), so this only turns a hang into an error.
        one_poller: only the lowest-ranked request of a slot waiting at this gate polls
            ``inside``; the others of the slot wait (without polling) until it has passed,
            which they would have to anyway (their condition includes it being inside).
            For an ``inside`` that costs round trips (Redis): a burst of one slot then
            makes one poller per process, not one per request.

    With the default in-process counter, every request of every slot goes through this
    gate, so a request first waits, without polling, until its predecessor in the slot has
    passed the gate (or finished); only then does it check ``inside``, by which time the
    predecessor is in the lane or about to be (it passed the gate just before taking its
    first lane), so it polls at most for that instant. Polling from the start, as before,
    a request whose predecessor had no thread to run on yet (a burst on a busy machine)
    polled every ``poll_s`` until it had one, and many such pollers took the CPU that
    predecessor needed: a backlog that fed itself.
    """

    def __init__(
        self,
        slots: Sequence[Hashable],
        inside: Callable[[Hashable], int],
        *,
        poll_s: float = 0.0002,
        max_poll_s: float | None = None,
        counter: CompletionCounter | None = None,
        max_wait_s: float | None = None,
        one_poller: bool = False,
    ) -> None:
        self._slots = slots
        self._inside = inside
        self._poll_s = poll_s
        self._max_poll_s = poll_s if max_poll_s is None else max(poll_s, max_poll_s)
        self._counter: CompletionCounter = (
            LocalCompletionCounter() if counter is None else counter
        )
        self._max_wait_s = max_wait_s
        self._one_poller = one_poller
        self._lock = threading.Lock()
        # In process (default counter): per slot, the highest rank that has passed the
        # gate or finished, and the wake-up event of the next rank if it waits for it.
        self._in_process = counter is None
        self._passed: dict[Hashable, int] = {}
        self._next_up: dict[tuple[Hashable, int], threading.Event] = {}
        # one_poller: per slot, a heap of (rank, wake-up event) of the requests waiting
        # here; the lowest rank polls, and is woken when it becomes the lowest.
        self._lines: dict[Hashable, list[tuple[int, threading.Event]]] = {}
        self._rank, self._last = _ranks(slots)
        #: how many times a request found a predecessor not yet inside and had to wait
        self.held_back = 0

    def rank(self, rid: int) -> int:
        """How many requests of ``rid``'s slot arrived before it."""
        return self._rank[rid]

    def wait_turn(self, rid: int) -> None:
        """Block until every unfinished earlier request of ``rid``'s slot is inside the lane.

        Why this is safe: no later request of the slot can enter (hence finish) before this
        one enters, so ``rank - finished`` counts exactly the earlier requests still
        unfinished (``pending``), read at t0 (``finished`` counts only requests that have
        left the lane, so it never includes one still inside). Everyone inside the lane at
        t1 >= t0 (holders) or t2 >= t1 (waiters) is one of them, and a holder at t1 cannot
        be a waiter at t2, so ``inside >= pending`` proves they are all inside; an
        undercount (a hand-off or a release between the reads, or a request that has
        released but not yet been counted) only means one more poll.

        Raises:
            TimeoutError: still waiting after ``max_wait_s``.
        """
        slot = self._slots[rid]
        rank = self._rank[rid]
        if rank == 0:
            self._pass(slot, 0)
            return
        waited = self._in_process and self._wait_predecessor(rid, slot, rank)
        if not self._one_poller:
            self._poll(rid, slot, rank, waited=waited)
            self._pass(slot, rank)
            return
        wake = threading.Event()
        with self._lock:
            line = self._lines.setdefault(slot, [])
            heapq.heappush(line, (rank, wake))
        try:
            self._poll(rid, slot, rank, (line, wake), waited=waited)
        finally:
            with self._lock:
                line.remove((rank, wake))
                heapq.heapify(line)
                if line:
                    line[0][1].set()
                else:
                    del self._lines[slot]
        self._pass(slot, rank)

    def _pass(self, slot: Hashable, rank: int) -> None:
        """In process: request ``rank`` of ``slot`` has passed the gate (or finished);
        wake its successor if it waits for that."""
        if not self._in_process:
            return
        with self._lock:
            if self._passed.get(slot, -1) < rank:
                self._passed[slot] = rank
            wake = self._next_up.pop((slot, rank + 1), None)
        if wake is not None:
            wake.set()

    def _wait_predecessor(self, rid: int, slot: Hashable, rank: int) -> bool:
        """In process: block, without polling, until request ``rank - 1`` of ``slot`` has
        passed the gate or finished; return whether it had to wait. (Only an economy:
        :meth:`_poll` still checks that every predecessor is inside.)

        Raises:
            TimeoutError: still waiting after ``max_wait_s``.
        """
        with self._lock:
            if self._passed.get(slot, -1) >= rank - 1:
                return False
            wake = threading.Event()
            self._next_up[(slot, rank)] = wake
            self.held_back += 1
        if not wake.wait(self._max_wait_s):
            with self._lock:
                self._next_up.pop((slot, rank), None)
            raise TimeoutError(
                f"arrival gate: request {rid} waited over {self._max_wait_s:g} s for "
                "the earlier requests of its slot to enter the lane"
            )
        return True

    def _poll(
        self,
        rid: int,
        slot: Hashable,
        rank: int,
        turn: tuple[list[tuple[int, threading.Event]], threading.Event] | None = None,
        *,
        waited: bool = False,
    ) -> None:
        """The wait of :meth:`wait_turn`; ``turn``: (this slot's line, this request's
        wake-up event) when only the lowest-ranked waiter polls; ``waited``: it has
        already waited (and been counted in ``held_back``)."""
        deadline: float | None = None
        if waited and self._max_wait_s is not None:
            deadline = time.monotonic() + self._max_wait_s
        lowest = True
        pause = self._poll_s
        while True:
            if turn is not None:
                line, wake = turn
                with self._lock:
                    lowest = line[0][0] == rank
                    if not lowest:
                        wake.clear()  # set again (under the lock) when we become lowest
            if turn is None or lowest:
                pending = rank - self._counter.done(slot)
                if pending <= 0 or self._inside(slot) >= pending:
                    return
            if not waited:
                waited = True
                with self._lock:
                    self.held_back += 1
                if self._max_wait_s is not None:
                    deadline = time.monotonic() + self._max_wait_s
            elif deadline is not None and time.monotonic() > deadline:
                raise TimeoutError(
                    f"arrival gate: request {rid} waited over {self._max_wait_s:g} s for "
                    "the earlier requests of its slot to enter the lane"
                )
            if turn is not None and not lowest:
                turn[1].wait(None if deadline is None else max(0.0, deadline - time.monotonic()))
            else:
                time.sleep(pause)
                pause = min(2 * pause, self._max_poll_s)

    def finished(self, rid: int) -> None:
        """Request ``rid`` has left the lanes (call after the release; also when it failed,
        even at the gate). The last request of its slot is not counted: no later request
        waits for it."""
        if not self._last[rid]:
            slot = self._slots[rid]
            self._counter.finish(slot)
            self._pass(slot, self._rank[rid])


class AsyncCompletionCounter(Protocol):
    """:class:`CompletionCounter` with coroutines (what :class:`AsyncArrivalGate` needs);
    the same rules: ``finish`` only after the release, ``done`` counts every ``finish``
    that returned before it began, across everyone sharing the counter."""

    async def done(self, slot: Hashable) -> int:
        """Requests of ``slot`` finished so far."""
        ...

    async def finish(self, slot: Hashable) -> None:
        """One more request of ``slot`` has left the lanes."""
        ...


class AsyncArrivalGate:
    """:class:`ArrivalGate` for the tasks of ONE event loop, whose lane calls suspend on
    I/O before the request is in line (Redis lanes): the same condition, the same
    exactness argument (see :meth:`ArrivalGate.wait_turn`), awaited instead of blocking.

    Args:
        slots: the slot of each request, indexed in arrival order (ranks are global: with
            several processes, every process passes the slots of ALL requests).
        inside: a coroutine function: ``await inside(slot)`` is how many requests of
            ``slot`` are inside the lane now, holders read before waiters (or both read
            at one instant, by one script on the server).
        counter: where finished requests are counted, shared by every process driving
            requests of the same slots.
        poll_s: seconds between the first two checks while a predecessor is not inside.
        max_poll_s: the interval doubles after each check up to this (default ``poll_s``).
        max_wait_s: give up (TimeoutError) after waiting this long; None: no limit.
        clock: the clock of the deadline (the loop's, ``time.monotonic``).

    Only one request of a slot polls per event loop: each request first waits (without
    any I/O) until the previous request of its slot that reached this gate has passed it
    (or failed), which it would have to anyway, since its own condition needs that one
    inside. Requests must call :meth:`wait_turn` in arrival order (the first step of a
    task created in arrival order does: it runs before any await), so that line is in
    rank order and the lowest-ranked request is the one that polls. Not thread-safe:
    every call from the loop's thread.
    """

    def __init__(
        self,
        slots: Sequence[Hashable],
        inside: Callable[[Hashable], Awaitable[int]],
        *,
        counter: AsyncCompletionCounter,
        poll_s: float = 0.002,
        max_poll_s: float | None = None,
        max_wait_s: float | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._slots = slots
        self._inside = inside
        self._counter = counter
        self._poll_s = poll_s
        self._max_poll_s = poll_s if max_poll_s is None else max(poll_s, max_poll_s)
        self._max_wait_s = max_wait_s
        self._clock = clock
        self._rank, self._last = _ranks(slots)
        # Per slot: the "passed" event of the latest request of the slot that reached
        # this gate (the next one waits for it before polling).
        self._tail: dict[Hashable, asyncio.Event] = {}
        #: how many requests found a predecessor not yet inside and had to wait
        self.held_back = 0
        #: how many times ``inside`` was asked (each poll: one ``done``, one ``inside``)
        self.polls = 0

    def rank(self, rid: int) -> int:
        """How many requests of ``rid``'s slot arrived before it."""
        return self._rank[rid]

    async def wait_turn(self, rid: int) -> None:
        """Return once every unfinished earlier request of ``rid``'s slot is inside the
        lane (see :meth:`ArrivalGate.wait_turn` for why the check is exact).

        Raises:
            TimeoutError: still waiting after ``max_wait_s``.
        """
        slot = self._slots[rid]
        rank = self._rank[rid]
        if rank == 0:
            return
        previous = self._tail.get(slot)
        passed = self._tail[slot] = asyncio.Event()
        deadline = None if self._max_wait_s is None else self._clock() + self._max_wait_s
        waited = False
        try:
            if previous is not None and not previous.is_set():
                waited = True
                self.held_back += 1
                left = None if deadline is None else max(0.0, deadline - self._clock())
                try:
                    await asyncio.wait_for(previous.wait(), left)
                except (asyncio.TimeoutError, TimeoutError):
                    raise self._late(rid) from None
            pause = self._poll_s
            while True:
                pending = rank - await self._counter.done(slot)  # t0: before the lane reads
                if pending <= 0:
                    return
                self.polls += 1
                if await self._inside(slot) >= pending:
                    return
                if not waited:
                    waited = True
                    self.held_back += 1
                if deadline is not None and self._clock() > deadline:
                    raise self._late(rid)
                await asyncio.sleep(pause)
                pause = min(2 * pause, self._max_poll_s)
        finally:
            passed.set()
            if self._tail.get(slot) is passed:
                del self._tail[slot]

    def _late(self, rid: int) -> TimeoutError:
        return TimeoutError(
            f"arrival gate: request {rid} waited over {self._max_wait_s:g} s for the "
            "earlier requests of its slot to enter the lane"
        )

    async def finished(self, rid: int) -> None:
        """Request ``rid`` has left the lanes (call after the release). The last request
        of its slot is not counted: no later request waits for it."""
        if not self._last[rid]:
            await self._counter.finish(self._slots[rid])
