"""The hold object of the Redis lanes (either face): one acquisition, from grant to release.

One job: the hold's state as its holder sees it (owner id, fencing token, its own
deadline, lost or not). The lane object's procedures change it (:mod:`._protocol`).
"""

from __future__ import annotations

import time
from typing import Any

from .._errors import shown
from .._kinds import Hold, warn_unentered
from ._wake import owner_id

__all__ = ["ENDED", "HELD", "PENDING", "RELEASING", "RedisHoldBase"]

# A hold's states. RELEASING: its release script is on its way (it may wait for a pool
# connection): still renewed and watched, so a slow release never turns into a lapse.
PENDING, HELD, RELEASING, ENDED = 0, 1, 2, 3


class RedisHoldBase(Hold):
    """One acquisition of a Redis lane for one key, from grant to release.

    Attributes:
        key: the key.
        token / fencing_token: the grant's fencing token (0 before the grant): an integer
            that grows with every grant of the key (per-key lane) or of the lane (counting
            lane), across processes, idle gaps and server restarts. Pass it to the store
            you write to, so it can refuse writes carrying an older token.
        owner: this acquisition's random owner id (what the scripts check on release).
        held: True from the grant until ``release()``, also once the lease is lost.
        lost: True once the lease is known to be lost (a renewal found the hold gone, or
            Redis stayed unreachable until the lease must have run out); the key may
            belong to someone else: stop working under it.

    Test hook: ``hold._suspend_renewal()`` stops renewing this hold (as a long GC pause or
    a frozen process would), so its lease runs out while the holder still runs;
    ``hold._suspend_renewal(False)`` resumes. Used by the C15/C16 tests.
    """

    __slots__ = (
        "owner", "_state", "_lost", "_since", "_expires", "_renew_at", "_paused", "_entry",
        "_pid", "_presence", "_releaser", "_sent", "_on_loss", "_tried", "__weakref__",
    )

    def __init__(self, lane: Any, key: str, timeout_s: float | None) -> None:
        super().__init__(lane, key, timeout_s, 0)
        self.owner = owner_id()
        self._state = PENDING
        # The release call that set RELEASING (an object of its own): only it finishes
        # the release; a release interrupted before its end leaves the hold RELEASING,
        # and a later release of it takes it over (see RedisLaneBase._detach).
        self._releaser: object = None
        # A release script of this hold was sent and an interrupt stopped the release
        # before its answer was known: the server may have run it, so a later release or
        # renewal that finds the hold gone finds it released by us, not lost (unless its
        # own deadline had passed).
        self._sent = False
        self._tried = False  # an acquisition was asked under ``owner`` (see _take)
        # '' while not known lost; once noticed lost, why, in words (for LeaseLostError).
        self._lost = ""
        self._since = 0.0  # monotonic time the grant was asked for
        # The holder's own deadline (monotonic): the lease counted from BEFORE the request
        # that granted (or last renewed) it was sent, less a guard. The server's expiry
        # can only come later, so the hold reads as lost no later than anyone else can
        # be granted the key.
        self._expires = 0.0
        self._renew_at = 0.0
        self._paused = False
        self._entry: Any = None  # this hold's entry in its lane object's registry
        self._pid = 0  # the process the hold was granted in
        # The presence epoch the grant was asked under (None: none); once it is dead, the
        # hold is lost (see _presence.py).
        self._presence: Any = None
        # Called (no argument) once the loss of this hold's lease is noticed: the
        # dispatcher's, for the turn that runs under it (see _watch_loss).
        self._on_loss: Any = None

    def __del__(self) -> None:
        # A hold made by acquire() and dropped without being entered (``with`` forgotten)
        # warns, as an in-process one does (see lanequeue._kinds._DropWatch); every take
        # marks the hold first (_take), also the holds try_acquire and acquire_timeout make.
        try:
            self._parked  # noqa: B018
        except AttributeError:
            try:
                lane, key = self.lane, self.key
            except AttributeError:  # interrupted while being made
                return
            warn_unentered(f"{type(lane).__name__} {lane.name!r}", key, source=self)

    @property
    def lost(self) -> bool:
        """True once the lease is lost or may be: a renewal found the hold gone, or the
        holder's own deadline passed without a confirmed renewal. Read from the clock,
        not from I/O: it turns True at or before the moment Redis could grant the key to
        anyone else, even while the renewer waits on a stalled server or connection."""
        if self._lost:
            return True
        if not HELD <= self._state <= RELEASING:
            return False
        p = self._presence
        return time.monotonic() >= self._expires or (p is not None and p.dead)

    @property
    def held(self) -> bool:
        """True from the grant until :meth:`release` (also after the lease was lost:
        see :attr:`lost`), as on every hold; a queue releases what is ``held``."""
        return self._state == HELD

    def _release_due(self) -> bool:
        """Held, or its release begun and stopped before its end (an interrupt): a
        queue's release pass releases it (again: a later release takes a stopped one
        over, see RedisLaneBase._detach)."""
        return HELD <= self._state <= RELEASING

    def _watch_loss(self, fn: Any) -> None:
        """Call ``fn()`` when the loss of this hold's lease is noticed (by the lane's
        deadline watchdog, its renewer or its presence connection, on their thread),
        or at once if it is known already; ``fn`` must be safe to call twice."""
        self._on_loss = fn
        if self._lost:
            fn()

    def _suspend_renewal(self, suspended: bool = True) -> None:
        """Test hook: stop (or resume) renewing this hold's lease. See the class doc."""
        self._paused = suspended

    def __repr__(self) -> str:
        state = ("pending", "held", "releasing", "released")[self._state]
        if self.lost:
            state = "lost"
        return (
            f"<{type(self).__name__} lane={self.lane.name!r} key={shown(self.key)} "
            f"token={self.token} {state}>"
        )
