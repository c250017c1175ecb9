"""A SIGALRM timer whose handler raises ``KeyboardInterrupt`` in the main thread: the
random-timer interrupt tests' one frame (the handler, pytest's hooks and alarm set aside
and restored)."""

from __future__ import annotations

import signal
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any


@contextmanager
def sigalrm_interrupts(again_s: float | None = None) -> Iterator[list[bool]]:
    """While the block runs, SIGALRM raises KeyboardInterrupt, but only while
    ``armed[0]`` (the yielded list) is True; the caller arms it and sets the timer
    (``signal.setitimer``), and clears it as the first statement of its handler (a plain
    store: no signal can land before it). ``again_s``: the handler also sets the timer
    again that soon, in case this interrupt lands in a finalizer (which only reports it).
    Reports of exceptions in finalizers go to a list meanwhile (one may land in pytest's
    own hook); pytest-timeout's alarm, if set, is put back afterwards. Main thread only."""
    armed = [False]

    def interrupt(signum: int, frame: Any) -> None:
        if armed[0]:
            if again_s is not None:
                signal.setitimer(signal.ITIMER_REAL, again_s)
            raise KeyboardInterrupt

    assert threading.current_thread() is threading.main_thread()
    swallowed: list[Any] = []
    previous_hook, sys.unraisablehook = sys.unraisablehook, swallowed.append
    previous = signal.signal(signal.SIGALRM, interrupt)
    outer = signal.setitimer(signal.ITIMER_REAL, 0)  # pytest-timeout's own alarm, if any
    try:
        yield armed
    finally:
        armed[0] = False
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
        sys.unraisablehook = previous_hook
        if outer[0] > 0:
            signal.setitimer(signal.ITIMER_REAL, *outer)
