"""Threads for the dispatchers that a KeyboardInterrupt in a caller cannot wedge.

:class:`Service` is one thread that runs timers and starts worker threads for the calls
handed to it (up to ``max_threads``; a worker stays for later calls). Its callers (any
thread, the main thread included) only put a message on a ``queue.SimpleQueue``: one C
call, so a KeyboardInterrupt (raised by a signal handler in the main thread, between two
bytecodes) lands before the put or after it, never inside, and nothing a caller leaves
half done can stop the service or its workers; a call repeated after an interrupt (see
"Interrupts" in :mod:`._machine`) only puts its message again. The standard library's
``ThreadPoolExecutor`` and ``threading.Condition`` run Python code under their locks: an
interrupt there can leave a lock held, and every later call waits for it for ever.

Everything else happens in the service thread, which is never interrupted (signal
handlers run in the main thread): the timer heap, and starting workers (``Thread.start``
waits for the new thread in Python code). A call goes to the workers' own SimpleQueue, and
a worker is started for it unless as many workers exist as calls handed out and not done
(or ``max_threads`` do). A worker reports each call done.

The ThreadDispatcher runs its turns and timers on one; the asyncio dispatchers of a
process run the shared dedupe window's blocking calls on another.
"""

from __future__ import annotations

import heapq
import itertools
import logging
import threading
import time
import weakref
from collections.abc import Callable
from queue import Empty, SimpleQueue
from typing import Any

__all__ = ["Handle", "Service"]

# What the inbox carries besides timers ((due, seq, handle) tuples) and calls ((fn, arg)).
_CANCELLED, _DONE, _STOP = object(), object(), object()


class Handle:
    """A timer of a :class:`Service`; :meth:`cancel` stops it (idempotent)."""

    __slots__ = ("fn", "cancelled", "_inbox")

    def __init__(self, fn: Callable[[], None], inbox: SimpleQueue[Any]) -> None:
        self.fn = fn
        self.cancelled = False
        self._inbox = inbox

    def cancel(self) -> None:
        if not self.cancelled:
            self.cancelled = True
            self.fn = _nothing  # what it would call is not kept alive by the heap
            self._inbox.put(_CANCELLED)  # (for the heap's clean-up only)


def _nothing() -> None:
    pass


class Service:
    """One service thread: timers, and worker threads for the calls handed to it.

    Args:
        max_threads: the most worker threads (>= 1).
        name: the threads' name (workers get ``_0``, ``_1``, ... after it).
        clock: the clock of the timers (seconds).
        poll_s: with a clock other than ``time.monotonic`` (a test's fake clock), the
            service re-reads the clock at least this often (seconds), since it cannot
            know when the clock moves; None: never (a real clock).
        min_threads: workers started at once, in the constructor (<= ``max_threads``);
            others start when calls come.

    Raises RuntimeError when a thread cannot be started (the process is out of
    threads): the service thread's, or one of the first ``min_threads`` workers';
    ValueError when ``max_threads`` < 1 or ``min_threads`` is not in 0..``max_threads``.

    Every method is one put on a SimpleQueue: safe from any thread, and an interrupt in
    the caller cannot leave the service half updated (see the module docstring).
    """

    def __init__(self, *, max_threads: int, name: str,
                 clock: Callable[[], float] = time.monotonic,
                 poll_s: float | None = None, min_threads: int = 0) -> None:
        if max_threads < 1:
            raise ValueError(f"max_threads must be >= 1, got {max_threads!r}")
        if not 0 <= min_threads <= max_threads:
            raise ValueError(
                f"min_threads must be in 0..max_threads ({max_threads}), got {min_threads!r}"
            )
        self._clock = clock
        self._poll_s = poll_s
        self._max = max_threads
        self._name = name
        self._inbox: SimpleQueue[Any] = SimpleQueue()
        #: ``post((fn, arg))``: :meth:`submit` as the one C call itself (no frame of
        #: ours before the put), for a caller in an interrupt's clean-up.
        self.post: Callable[[tuple[Callable[[Any], Any], Any]], None] = self._inbox.put
        self._work: SimpleQueue[Any] = SimpleQueue()
        self._seq = itertools.count()
        # The first ``min_threads`` workers now, in the caller (RuntimeError when out of
        # threads: then there is no service): a call handed over later never waits for
        # a worker that cannot be started.
        self._min = 0
        try:
            while self._min < min_threads:
                threading.Thread(target=self._worker, daemon=True,
                                 name=f"{name}_{self._min}").start()
                self._min += 1
            threading.Thread(target=self._loop, daemon=True, name=name).start()
        except BaseException:
            for _ in range(self._min):  # (the workers started end)
                self._work.put(_STOP)
            raise

    def call_later(self, delay: float, fn: Callable[[], None]) -> Handle:
        """Call ``fn()`` in the service thread ``delay`` seconds from now (on ``clock``).
        It must return quickly; an exception it raises is logged."""
        handle = Handle(fn, self._inbox)
        self._inbox.put((self._clock() + delay, next(self._seq), handle))
        return handle

    def submit(self, fn: Callable[[Any], Any], arg: Any) -> None:
        """Call ``fn(arg)`` in a worker thread. An exception it raises is logged at
        debug level: a caller that must know the outcome reports it from ``fn``."""
        self._inbox.put((fn, arg))

    def stop(self) -> None:
        """End the service and its workers once the messages put before are handled:
        calls submitted before run; timers not due yet never fire."""
        self._inbox.put(_STOP)

    def stop_with(self, owner: object) -> None:
        """Stop the service once ``owner`` is garbage-collected: its finalizer puts
        :meth:`stop`'s message with one C call (no frame of ours runs wherever the
        collector happens to run)."""
        weakref.finalize(owner, self._inbox.put, _STOP)

    # -- the service thread -----------------------------------------------------------------

    def _loop(self) -> None:
        inbox, work = self._inbox, self._work
        heap: list[tuple[float, int, Handle]] = []
        dead = 0  # cancelled handles still in the heap (as counted by their messages)
        workers, busy = self._min, 0  # workers started; calls handed to them, not done
        while True:
            # (No message or timer is kept in a local while the thread blocks: a
            # dispatcher dropped without close() must be collectable, see stop_with.)
            try:
                msg = inbox.get(timeout=self._fire_due(heap))
            except Empty:
                continue
            while True:  # this message, then whatever else came meanwhile
                if msg is _DONE:
                    busy -= 1
                elif msg is _CANCELLED:
                    dead += 1
                    # Like asyncio: rebuild once most of the heap is cancelled (amortised
                    # O(1)), so cancelled far-off timers do not pile up.
                    if dead > 64 and dead * 2 > len(heap):
                        heap[:] = [e for e in heap if not e[2].cancelled]
                        heapq.heapify(heap)
                        dead = 0
                elif msg is _STOP:
                    for _ in range(workers):
                        work.put(_STOP)
                    return
                elif len(msg) == 3:  # a timer
                    heapq.heappush(heap, msg)
                else:  # a call
                    busy += 1
                    if workers < min(busy, self._max):
                        try:
                            threading.Thread(target=self._worker, daemon=True,
                                             name=f"{self._name}_{workers}").start()
                            workers += 1
                        except RuntimeError:  # "can't start new thread": out of threads
                            # The call waits for a worker that exists (none: the next
                            # call tries again); the service itself must not die.
                            logging.getLogger("lanequeue").exception(
                                "dispatcher could not start a worker thread")
                    work.put(msg)
                try:
                    msg = inbox.get_nowait()
                except Empty:
                    msg = None
                    break

    def _fire_due(self, heap: list[tuple[float, int, Handle]]) -> float | None:
        """Run the timers that are due; return the seconds until the next one (None:
        none left)."""
        clock, poll = self._clock, self._poll_s
        while heap:
            due, _, handle = heap[0]
            if handle.cancelled:
                heapq.heappop(heap)
                continue
            wait = due - clock()
            if wait > 0:
                return wait if poll is None else min(wait, poll)
            heapq.heappop(heap)
            handle.cancelled = True  # fired: a later cancel() is a no-op
            try:
                handle.fn()
            except BaseException:  # the service thread must outlive any timer
                logging.getLogger("lanequeue").exception("dispatcher timer raised")
        return None

    def _worker(self) -> None:
        work, inbox = self._work, self._inbox
        while True:
            msg = work.get()
            if msg is _STOP:
                return
            try:
                fn, arg = msg
                del msg
                fn(arg)
            except BaseException:
                # Logged, and the worker stays (else the service would count a dead one):
                # an asynchronous exception in a ThreadDispatcher's report gets here too,
                # after the report made the dispatcher whole.
                logging.getLogger("lanequeue").debug("dispatcher worker call raised",
                                                     exc_info=True)
            finally:
                fn = arg = None
                inbox.put(_DONE)
