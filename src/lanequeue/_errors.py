"""Exceptions raised by lanequeue.

Every exception of the library derives from :class:`LaneError`, so a caller can catch the
whole family in one ``except`` clause; each also derives from the built-in it refines
(``LaneTimeoutError`` is a ``TimeoutError``), so code written against the source design,
which caught ``TimeoutError``, keeps working.
"""

from __future__ import annotations

__all__ = [
    "LaneBackendError",
    "LaneError",
    "LaneTimeoutError",
    "LeaseLostError",
    "NotOwnerError",
]


class LaneError(Exception):
    """Base class of every error raised by lanequeue."""


class LaneTimeoutError(LaneError, TimeoutError):
    """A permit was not granted before the deadline.

    The message keeps the source design's wording and adds the wait, e.g.
    ``SessionLane 'session' timeout for key 'k' after 0.5 s``.

    Attributes:
        lane: name of the lane that could not be acquired.
        key: the key the caller asked for.
        timeout_s: the wait that ran out, in seconds (``0.0`` for a non-blocking attempt).
        lane_class: the public class of that lane (``"SessionLane"``, ``"AsyncLane"``...).

    Picklable (it crosses process boundaries intact).
    """

    def __init__(
        self, lane: str, key: str, timeout_s: float | None, lane_class: str = "Lane"
    ) -> None:
        self.lane = lane
        self.key = key
        self.timeout_s = timeout_s
        self.lane_class = lane_class
        waited = "without limit" if timeout_s is None else f"after {timeout_s:g} s"
        super().__init__(f"{lane_class} '{lane}' timeout for key '{key}' {waited}")

    def __reduce__(
        self,
    ) -> tuple[type[LaneTimeoutError], tuple[str, str, float | None, str]]:
        return (type(self), (self.lane, self.key, self.timeout_s, self.lane_class))


class NotOwnerError(LaneError):
    """A release named a hold that the caller does not own (any more).

    Raised by the Redis lanes when the token presented on release is not the current
    holder's: the hold expired and passed to someone else, or was never this caller's.
    The hold of the real owner is left untouched.
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
