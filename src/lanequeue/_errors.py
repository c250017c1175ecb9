"""Exceptions raised by lanequeue.

Every exception of the library derives from :class:`LaneError`, so a caller can catch the
whole family in one ``except`` clause; each also derives from the built-in it refines
(``LaneTimeoutError`` is a ``TimeoutError``), so code written against the source design,
which caught ``TimeoutError``, keeps working.
"""

from __future__ import annotations

import reprlib
from urllib.parse import parse_qsl, urlencode, urlsplit

__all__ = [
    "DispatcherDrainingError",
    "LaneBackendError",
    "LaneClearedError",
    "LaneDrainingError",
    "LaneError",
    "LaneTimeoutError",
    "LeaseLostError",
    "NotOwnerError",
    "TurnCancelledError",
    "TurnDedupedError",
    "TurnDroppedError",
    "TurnError",
    "TurnRejectedError",
    "TurnTimedOutError",
]


#: Characters of a key (or of any value) that a message shows at most: a key may be any
#: length (a user-supplied id, megabytes), a log line or an exception text should not be.
#: The exceptions' ``key`` attributes keep the whole key.
SHOWN_MAX = 200

_shown = reprlib.Repr()
_shown.maxstring = SHOWN_MAX
_shown.maxother = SHOWN_MAX
_shown.maxlist = _shown.maxtuple = _shown.maxset = _shown.maxdict = 8


def shown(value: object) -> str:
    """``repr(value)`` for a message, cut to about :data:`SHOWN_MAX` characters (the
    middle of a longer string is replaced by ``...``, and its length follows, as
    :func:`cut` gives it)."""
    text = _shown.repr(value)
    if isinstance(value, str) and len(value) > SHOWN_MAX:
        return f"{text} ({len(value):,} characters)"
    return text


def told(exc: BaseException) -> str:
    """An exception for a person: its class and its message (``ConnectionError: Error
    111 connecting``); its class alone when it has no message (an ``asyncio`` or
    socket ``TimeoutError`` has none, and ``TimeoutError: `` tells nothing)."""
    text = str(exc)
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


def install_hint(extra: str) -> str:
    """How to install the optional part ``extra`` (a name of ``pyproject.toml``'s
    optional dependencies), for a message: from an index, and from a source checkout,
    where ``lanequeue[...]`` names no package pip can find."""
    return f"pip install 'lanequeue[{extra}]' (in a source checkout: pip install '.[{extra}]')"


def counted(n: int, noun: str) -> str:
    """``n`` (thousands separated) and ``noun``, plural unless ``n`` is 1: ``1 lane``,
    ``12,031 requests``."""
    return f"{n:,} {noun}" + ("" if n == 1 else "s")


def cut(key: str) -> str:
    """``key`` as is for a message, or, past :data:`SHOWN_MAX` characters, its start and
    end around ``...`` and its length."""
    if len(key) <= SHOWN_MAX:
        return key
    half = SHOWN_MAX // 2
    return f"{key[:half]}...{key[-half:]} ({len(key):,} characters)"


class LaneError(Exception):
    """Base class of every error raised by lanequeue."""


class LaneTimeoutError(LaneError, TimeoutError):
    """A permit was not granted before the deadline.

    The message keeps the source design's wording and adds the wait, e.g.
    ``SessionLane 'session' timeout for key 'k' after 0.5 s``. A key longer than
    :data:`SHOWN_MAX` characters is cut in the message (its start and end, and its
    length); ``key`` keeps it whole. So in every message and log line of the library.

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
        super().__init__(f"{lane_class} '{lane}' timeout for key '{cut(key)}' {waited}")

    def __reduce__(
        self,
    ) -> tuple[type[LaneTimeoutError], tuple[str, str, float | None, str]]:
        return (type(self), (self.lane, self.key, self.timeout_s, self.lane_class))


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
        super().__init__(f"lane {lane!r} is draining: no permit for key {shown(key)}")

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
        super().__init__(f"lane {lane!r}: the wait for key {shown(key)} was cleared")

    def __reduce__(self) -> tuple[type[LaneClearedError], tuple[str, str]]:
        return (type(self), (self.lane, self.key))
# -- the dispatcher's errors (lanequeue.Dispatcher, lanequeue.ThreadDispatcher) -----------


#: How a reason reads in a TurnError's message where its one word would only repeat the
#: state ("deduped: duplicate").
_REASONS_SAID = {
    "duplicate": "another dispatcher sharing the dedupe window owns its dedupe_id",
}


class TurnError(LaneError):
    """A dispatcher turn ended in a state other than ``done`` or ``failed``.

    Raised when a ticket is awaited (``await ticket``, ``ticket.result()``); each terminal
    state has its own subclass.

    Attributes:
        state: the ticket's terminal state (``"cancelled"``, ``"dropped"``, ...).
        key: the turn's key.
        reason: why it ended so (``"busy"``, ``"overflow"``, ``"superseded"``,
            ``"cancelled"``, ``"cleared"``, ``"closed"``, ``"start timeout"``,
            ``"run timeout"``, ``"duplicate"``).
        ticket_id: the ticket's number in its dispatcher.
    """

    def __init__(self, state: str, key: str, reason: str, ticket_id: int = 0) -> None:
        self.state = state
        self.key = key
        self.reason = reason
        self.ticket_id = ticket_id
        said = _REASONS_SAID.get(reason, reason)
        super().__init__(f"turn {ticket_id} of key {shown(key)} {state}: {said}")

    def __reduce__(self) -> tuple[type[TurnError], tuple[str, str, str, int]]:
        return (type(self), (self.state, self.key, self.reason, self.ticket_id))


class TurnCancelledError(TurnError):
    """The turn was ended by ``cancel()``, ``clear()`` or ``close()`` (before or while
    running), or its task was cancelled from outside the dispatcher."""


class TurnDroppedError(TurnError):
    """A busy policy or the line's bound ended the turn before it started
    (``"superseded"`` by interrupt/replace, ``"overflow"`` by drop_oldest)."""


class TurnRejectedError(TurnError):
    """The submit was refused at once: ``"busy"`` (busy policy reject) or ``"overflow"``
    (the key's line was full under reject_new)."""


class TurnTimedOutError(TurnError, TimeoutError):
    """The turn did not start within ``timeout_s`` (``"start timeout"``) or ran longer than
    ``run_timeout_s`` (``"run timeout"``)."""


class TurnDedupedError(TurnError):
    """The submit repeated a ``dedupe_id`` that another process already owns (shared
    dedupe window over Redis): this process runs nothing for it."""


class DispatcherDrainingError(LaneError):
    """``submit`` was called after ``drain()`` or ``close()``: the dispatcher takes no new
    turns."""


def redact_url(url: str) -> str:
    """``url`` without its password (user name, host, port, database kept)."""
    try:
        parts = urlsplit(url)
    except ValueError:
        return "<unparsable URL>"
    netloc = parts.netloc
    if "@" in netloc:
        auth, host = netloc.rsplit("@", 1)
        user = auth.split(":", 1)[0]
        netloc = f"{user}@{host}" if user else host
    pairs = parse_qsl(parts.query, keep_blank_values=True)
    query = urlencode([(k, v) for k, v in pairs if k.lower() != "password"])
    if netloc == parts.netloc and len(pairs) == len(parse_qsl(query, keep_blank_values=True)):
        return url  # nothing secret in it
    return f"{parts.scheme}://{netloc}{parts.path}" + (f"?{query}" if query else "")
