"""The holder's side of a lease: its own deadline, enforced without I/O, and the registry
entries that let a dropped hold be collected.

- :data:`watchdog`: one daemon thread per process with a heap of wake-up times, one
  pending entry per lane object (the earliest deadline among its holds). At that time it
  asks the lane object to mark every hold whose deadline has passed without a confirmed
  renewal as lost (and call ``on_lease_lost``), and to name its next earliest deadline.
  It never waits for Redis, a connection or an event loop, so a stalled renewer (a
  starved pool, a frozen server, a cut connection) cannot delay the loss past the
  deadline (C21). It holds weak references only, and its heap stays as small as the
  number of lane objects with holds. ``hold.lost`` itself reads the clock, so it is True
  from the deadline on, even before the watchdog thread gets to run.
- :class:`Kept` and :class:`Watched`: a lane object's registry entry for a hold. A hold the
  lane object owns (``try_acquire``, ``acquire_timeout``: the caller has no hold object,
  ``manual_release(key)`` ends it) is kept strongly. A hold its caller owns (``with
  lane.acquire(key)``, ``acquire_all``) is referenced weakly: if the caller drops it
  without a release, it is collected, renewal stops, its lease lapses within ``lease_s``
  and a ``ResourceWarning`` names it (C20).
"""

from __future__ import annotations

import heapq
import itertools
import logging
import math
import os
import threading
import time
import weakref
from typing import Any

from .._core import at_fork_in_child

__all__ = ["Kept", "Watched", "watchdog"]


class Kept:
    """Registry entry of a hold the lane object owns (strong)."""

    __slots__ = ("hold", "key", "token", "owner", "live", "sent")

    def __init__(self, hold: Any) -> None:
        self.hold = hold
        self.key: str = hold.key
        self.token: int = hold.token
        self.owner: str = hold.owner
        self.live = True  # counted among the lane object's live holds
        self.sent = False  # a release of it was sent (see Watched)

    def __call__(self) -> Any:
        return self.hold


class Watched(weakref.ref):  # type: ignore[type-arg]
    """Registry entry of a hold its caller owns (weak; see the module docstring)."""

    __slots__ = ("key", "token", "owner", "live", "sent", "since")

    def __new__(cls, hold: Any, on_drop: Any, since: float) -> Watched:
        return super().__new__(cls, hold, on_drop)

    def __init__(self, hold: Any, on_drop: Any, since: float) -> None:
        super().__init__(hold, on_drop)  # type: ignore[call-arg]
        self.key: str = hold.key
        self.token: int = hold.token
        self.owner: str = hold.owner  # what its release names, once the hold is gone
        # When its grant was asked for (the hold's ``_since``): the renewer's release of
        # the dropped hold reports how long it was held (``warn_hold_s``, hold times).
        self.since = since
        self.live = True
        # A release of it was sent (and stopped before its answer, if the hold is then
        # dropped): the renewer's release of the dropped hold finding it gone means that
        # release freed it (counted released, not unmatched).
        self.sent = False


class _Watchdog:
    """Deadlines of the holds of this process (see the module docstring)."""

    def __init__(self) -> None:
        self._cond = threading.Condition(threading.Lock())
        self._heap: list[tuple[float, int, weakref.ref[Any]]] = []
        self._seq = itertools.count()
        self._pid = 0

    def watch(self, lane: Any, at: float) -> None:
        """Call ``lane._deadlines_due(at)`` at monotonic time ``at``, unless an entry
        of ``lane`` as early is pending (``lane._watch_at``, kept under this watchdog's
        lock: set here once the entry is pushed, cleared when it fires, so a call that an
        interrupt stops leaves no claim without its entry and a later call pushes one).
        Raises RuntimeError when the watchdog's thread is not running yet and cannot be
        started (out of threads); nothing is then changed."""
        with self._cond:
            if self._pid != os.getpid():  # first use, or a forked child: a new thread
                # Started first: out of threads, this raises RuntimeError with nothing
                # changed, and the next call tries again. (The thread waits for the lock.)
                threading.Thread(target=self._run, name="lanequeue-lease-deadlines",
                                 daemon=True).start()
                self._pid = os.getpid()
                self._heap = []
            if at >= lane._watch_at:
                return
            entry = (at, next(self._seq), weakref.ref(lane))
            heapq.heappush(self._heap, entry)
            lane._watch_at = at  # -- after the push: a claim only once it is true --
            if self._heap[0] is entry:
                self._cond.notify()

    def _run(self) -> None:
        while True:
            with self._cond:
                while True:
                    now = time.monotonic()
                    if self._heap and self._heap[0][0] <= now:
                        at, _, ref = heapq.heappop(self._heap)
                        lane = ref()
                        if lane is not None and lane._watch_at == at:
                            lane._watch_at = math.inf  # (its pending entry fired)
                        del lane
                        break
                    self._cond.wait(self._heap[0][0] - now if self._heap else None)
            lane = ref()
            if lane is not None:
                try:
                    lane._deadlines_due(at)
                except Exception:  # never let the watchdog die
                    logging.getLogger("lanequeue.redis").exception("lease watchdog error")
            del lane


    def _after_fork(self) -> None:
        """In a forked child: a fresh lock (the parent's thread may have held it at the
        fork), and no heap: the child's first watch starts its own thread."""
        self._cond = threading.Condition(threading.Lock())
        self._heap = []
        self._pid = 0


#: The process's one watchdog.
watchdog = _Watchdog()
at_fork_in_child(watchdog._after_fork)
