"""Exceptions raised by lanequeue.

Every exception of the library derives from :class:`LaneError`, so a caller can catch the
whole family in one ``except`` clause; each also derives from the built-in it refines
(``LaneTimeoutError`` is a ``TimeoutError``), so code written against the source design,
which caught ``TimeoutError``, keeps working.
"""

from __future__ import annotations

__all__ = [
    "LaneBackendError",
    "LaneClearedError",
    "LaneDrainingError",
    "LaneError",
    "LaneTimeoutError",
    "LeaseLostError",
    "NotOwnerError",
]


class LaneError(Exception):
    """Base class of every error raised by lanequeue."""


class LaneTimeoutError(LaneError, TimeoutError):
    """A permit was not granted before the deadline.

    Attributes:
        lane: name of the lane that could not be acquired.
        key: the key the caller asked for.
        timeout_s: the wait that ran out, in seconds (``0.0`` for a non-blocking attempt).
    """

    def __init__(self, lane: str, key: str, timeout_s: float | None) -> None:
        self.lane = lane
        self.key = key
        self.timeout_s = timeout_s
        super().__init__(f"lane {lane!r}: no permit for key {key!r} within {timeout_s} s")

    def __reduce__(self) -> tuple[type[LaneTimeoutError], tuple[str, str, float | None]]:
        return (type(self), (self.lane, self.key, self.timeout_s))


class NotOwnerError(LaneError):
    """A release named a hold that the caller does not own (any more).

    Raised by ``hold.release()`` on every face when the hold is not the caller's: never
    granted, released already, ended by someone else (``manual_release(key)``), or, on
    Redis, its lease ran out and the key passed to someone else. The hold of the real
    owner is left untouched.
    """


class LeaseLostError(NotOwnerError):
    """The lease of a Redis hold ran out (renewal failed or came too late).

    A subclass of :class:`NotOwnerError`: once the lease is lost, the caller no longer owns
    the hold, and the key may already belong to the next waiter.
    """


class LaneBackendError(LaneError):
    """The shared backend (Redis) could not be reached or answered wrongly.

    Never means "granted": when this is raised, the caller holds nothing new.
    """


class LaneDrainingError(LaneError):
    """The lane is draining or closed: it takes no new acquisitions.

    Raised by ``acquire``, ``try_acquire``, ``acquire_timeout`` and a queue's
    ``acquire_all`` once :meth:`drain` or :meth:`close` was called on the lane (or its
    queue), and by the waits that ``drain(cancel_waiting=True)`` or ``close()`` ended. The
    caller holds nothing new.

    Attributes:
        lane: name of the lane.
        key: the key the caller asked for.
    """

    def __init__(self, lane: str, key: str) -> None:
        self.lane = lane
        self.key = key
        super().__init__(f"lane {lane!r} is draining: no permit for key {key!r}")

    def __reduce__(self) -> tuple[type[LaneDrainingError], tuple[str, str]]:
        return (type(self), (self.lane, self.key))


class LaneClearedError(LaneError):
    """The wait for a permit was ended by ``lane.clear(key)``. The caller holds nothing.

    Attributes:
        lane: name of the lane.
        key: the key whose waiters were cleared.
    """

    def __init__(self, lane: str, key: str) -> None:
        self.lane = lane
        self.key = key
        super().__init__(f"lane {lane!r}: the wait for key {key!r} was cleared")

    def __reduce__(self) -> tuple[type[LaneClearedError], tuple[str, str]]:
        return (type(self), (self.lane, self.key))
