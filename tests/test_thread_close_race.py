"""``close()`` racing a waiter that is joining the line: a caller that passed the
``draining`` check just before a close, and joins the line just after it, must not be
left waiting behind the close (nor be granted a permit after it)."""

from __future__ import annotations

import sys
import threading
import time
from collections.abc import Callable
from typing import Any

import pytest

from lanequeue import Lane, LaneDrainingError, SessionLane


class _CloseBeforeJoining:
    """The core's lock, wrapped: the first time ``take`` takes it with a waiter (after
    its ``draining`` check, before it joins the line), ``lane.close()`` runs first."""

    def __init__(self, lane: Any) -> None:
        self.lane = lane
        self.inner = lane._core._lock
        self.fired = False

    def acquire(self, *args: Any) -> bool:
        caller = sys._getframe(1)
        if (not self.fired and caller.f_code.co_name == "take"
                and caller.f_locals.get("waiter") is not None):
            self.fired = True
            self.lane.close()  # another thread's close, landing in this window
        return bool(self.inner.acquire(*args))

    def release(self) -> None:
        self.inner.release()

    def _is_owned(self) -> bool:  # (the views ask it: see _CoreBase._read_evicted)
        return bool(self.inner._is_owned())

    def __enter__(self) -> bool:
        return bool(self.inner.acquire())

    def __exit__(self, *exc: object) -> None:
        self.inner.release()


@pytest.mark.timeout(10)
@pytest.mark.parametrize(
    "make", [lambda: SessionLane("s"), lambda: Lane("g", max_concurrent=1)],
    ids=["SessionLane", "Lane"],
)
def test_waiter_joining_during_close_is_ended_not_granted(make: Callable[[], Any]) -> None:
    """Input: ``k`` held; a thread's ``acquire_timeout("k", 3)`` passes ``take``'s
    ``draining`` check, then ``close()`` runs (ending every wait), then the take joins
    the line. Observed before the fix: the waiter stayed in line after ``close()``
    returned, and the holder's release handed it the permit (a grant after close).
    Expected: its wait ends with LaneDrainingError; nobody holds after the release."""
    lane = make()
    assert lane.try_acquire("k")
    hooked = _CloseBeforeJoining(lane)
    lane._core._lock = hooked
    box: dict[str, Any] = {}

    def wait() -> None:
        try:
            box["granted"] = lane.acquire_timeout("k", 3.0)
        except LaneDrainingError as exc:
            box["error"] = exc

    waiter = threading.Thread(target=wait)
    waiter.start()
    deadline = time.monotonic() + 3.0
    while not box and lane.stats.waiters == 0 and time.monotonic() < deadline:
        time.sleep(0.005)
    assert hooked.fired
    assert lane.manual_release("k")  # the holder finishes
    waiter.join(5.0)
    assert not waiter.is_alive()
    assert "error" in box, f"a grant after close: {box}"
    assert lane.stats.holders == 0 and lane.stats.waiters == 0


class _CloseBeforeGranting(_CloseBeforeJoining):
    """The first time ``take`` takes the lock with no waiter (a free permit or an idle
    key: the grant path), after its ``draining`` check, ``lane.close()`` runs first."""

    def acquire(self, *args: Any) -> bool:
        caller = sys._getframe(1)
        if (not self.fired and caller.f_code.co_name == "take"
                and caller.f_locals.get("waiter", 0) is None):
            self.fired = True
            self.lane.close()
        return bool(self.inner.acquire(*args))


@pytest.mark.timeout(10)
@pytest.mark.parametrize(
    "make", [lambda: SessionLane("s"), lambda: Lane("g", max_concurrent=1)],
    ids=["SessionLane", "Lane"],
)
def test_no_grant_after_close_returned(make: Callable[[], Any]) -> None:
    """Input: ``try_acquire("k")`` on a free lane passes ``take``'s ``draining`` check,
    then ``close()`` runs and returns. Was: the take then granted ``k``, a holder that
    started after close() returned (a shutdown's ``wait_idle`` may have seen the lane
    idle already). Expected: LaneDrainingError (the flag is checked again under the
    lock, which close() takes to set it)."""
    lane = make()
    lane.try_acquire("warm")  # the key's entry exists on a per-key lane
    lane.manual_release("warm")
    lane._core._lock = _CloseBeforeGranting(lane)
    with pytest.raises(LaneDrainingError):
        lane.try_acquire("warm")
    assert lane.stats.holders == 0
