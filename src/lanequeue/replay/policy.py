"""Lane policies that a replay can drive: which lanes a request takes, in which order.

A policy is described as data (a tuple of :class:`LaneSpec`) so that the same description
feeds the exact simulation (:mod:`lanequeue.replay.simulate`) and every runtime that builds
real lanes from it (:mod:`lanequeue.replay.runtimes`).
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = [
    "DEFAULT_POLICY",
    "LANE_NAMES",
    "POLICIES",
    "LaneSpec",
    "policy_lanes",
]

#: The lanes every replayed request takes, in this order (the gateway call pattern).
LANE_NAMES = ("session", "global")

#: Policy names accepted by :func:`policy_lanes` and ``lanequeue replay --policy``.
POLICIES = ("session", "global-serial")

DEFAULT_POLICY = "session"


@dataclass(frozen=True)
class LaneSpec:
    """One lane of a policy.

    Attributes:
        name: the lane's name in the LaneQueue.
        capacity: permits of the lane (per key when ``per_key``), >= 1.
        per_key: True for a SessionLane (one permit per key, keys independent), False for
            a counting Lane shared by all keys.
    """

    name: str
    capacity: int
    per_key: bool


def policy_lanes(policy: str, global_cap: int) -> tuple[LaneSpec, ...]:
    """The lanes of ``policy`` with a global cap of ``global_cap`` concurrent requests.

    - ``"session"``: a SessionLane "session" (per-conversation FIFO, one at a time per key),
      then a Lane "global" of ``global_cap``.
    - ``"global-serial"``: the design note's original ``Lane("session", max_concurrent=1)``,
      one permit for the whole system, then the same "global" lane: it serialises every
      conversation behind every other, which is the problem SessionLane solves.

    Raises:
        ValueError: unknown policy or ``global_cap < 1``.
    """
    if global_cap < 1:
        raise ValueError(f"the global cap must be >= 1, got {global_cap}")
    if policy == "session":
        session = LaneSpec("session", 1, per_key=True)
    elif policy == "global-serial":
        session = LaneSpec("session", 1, per_key=False)
    else:
        raise ValueError(f"unknown policy {policy!r}; choose from {', '.join(POLICIES)}")
    return (session, LaneSpec("global", global_cap, per_key=False))
