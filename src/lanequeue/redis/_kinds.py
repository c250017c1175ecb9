"""One object per lane kind: its Redis keys and the calls of its scripts.

One job: everything that differs between the per-key lane and the counting lane on the
wire (which keys a script gets, which arguments, which script), so the procedures in
:mod:`._protocol` never switch on the kind. Each method returns a :data:`Call`:
``(script, KEYS, ARGV)``; the scripts and the reasons for their arguments are in
:mod:`._scripts`.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any, ClassVar

from . import _scripts as lua
from ._keys import base as key_base
from ._presence import GRACE_S
from ._wire import Call, wrap

__all__ = ["Call", "CountingKind", "Kind", "SessionKind"]


#: The presence grace period in ms (see :mod:`._presence`), sent with every acquire.
GRACE_MS = round(GRACE_S * 1000)


class Kind(ABC):
    """The wire format of one lane object's kind (see the module docstring)."""

    letter: ClassVar[str]
    _sources: ClassVar[tuple[str, str, str, str, str]]

    def __init__(self, client: Any, prefix: str, name: str, layout: str, lease_ms: int,
                 fence_ttl_ms: int, cap: int) -> None:
        self.prefix, self.name, self.layout = prefix, name, layout
        self.lease_ms, self.fence_ttl_ms, self.cap = lease_ms, fence_ttl_ms, cap
        reg = client.register_script
        self.s_acquire, self.s_release, self.s_renew, self.s_withdraw, self.s_info = (
            reg(wrap(src)) for src in self._sources
        )

    @abstractmethod
    def base(self, key: str) -> str:
        """The base ``{...}:`` of the Redis keys that ``key`` uses."""

    @abstractmethod
    def acquire(self, owner: str, key: str, wait: bool, live_ms: int,
                chan: str = "") -> Call:
        """``chan``: the presence channel of the caller's process ('' for none)."""

    @abstractmethod
    def release(self, owner: str, token: int, key: str) -> Call: ...

    @abstractmethod
    def renew(self, owner: str, key: str, chan: str | None = None) -> Call:
        """``chan``: None keeps the hold's presence record; a channel replaces it; ''
        removes it (the hold then lives by its lease only)."""

    @abstractmethod
    def withdraw(self, owner: str, key: str) -> Call: ...

    @abstractmethod
    def info(self, key: str | None) -> Call: ...


class SessionKind(Kind):
    """Per-key lane: one hash tag per key; every script gets the holder key only and
    derives the others from it (same tag, same slot)."""

    letter = "s"
    _sources = (lua.SESSION_ACQUIRE, lua.SESSION_RELEASE, lua.SESSION_RENEW,
                lua.SESSION_WITHDRAW, lua.SESSION_INFO)

    def base(self, key: str) -> str:
        return key_base(self.prefix, "s", self.name, key, layout=self.layout)

    def acquire(self, owner: str, key: str, wait: bool, live_ms: int,
                chan: str = "") -> Call:
        return self.s_acquire, [self.base(key) + "h"], [
            owner, self.lease_ms, live_ms if wait else 0, chan, GRACE_MS
        ]

    def release(self, owner: str, token: int, key: str) -> Call:
        # The holder value of our grant (owner:token): the script's one-call fast path.
        return self.s_release, [self.base(key) + "h"], [f"{owner}:{token}", self.lease_ms]

    def renew(self, owner: str, key: str, chan: str | None = None) -> Call:
        args: list[Any] = [owner, self.lease_ms]
        if chan is not None:
            args.append(chan)
        return self.s_renew, [self.base(key) + "h"], args

    def withdraw(self, owner: str, key: str) -> Call:
        return self.s_withdraw, [self.base(key) + "h"], [owner, self.lease_ms]

    def info(self, key: str | None) -> Call:
        b = self.base(key or "")
        return self.s_info, [b + "h", b + "w"], []


class CountingKind(Kind):
    """Counting lane: one hash tag for the whole lane; scripts get all its keys."""

    letter = "c"
    _sources = (lua.COUNTING_ACQUIRE, lua.COUNTING_RELEASE, lua.COUNTING_RENEW,
                lua.COUNTING_WITHDRAW, lua.COUNTING_INFO)

    def __init__(self, *args: Any) -> None:
        super().__init__(*args)
        b = key_base(self.prefix, "c", self.name, layout=self.layout)
        self._base = b
        self._keys = [b + "h", b + "i", b + "q", b + "w", b + "f"]

    def base(self, key: str) -> str:
        return self._base

    def acquire(self, owner: str, key: str, wait: bool, live_ms: int,
                chan: str = "") -> Call:
        return self.s_acquire, self._keys, [
            owner, self.lease_ms, live_ms, 1 if wait else 0, self.fence_ttl_ms, self.cap, key,
            chan, GRACE_MS,
        ]

    def release(self, owner: str, token: int, key: str) -> Call:
        return self.s_release, self._keys, [owner, self.fence_ttl_ms, self.cap]

    def renew(self, owner: str, key: str, chan: str | None = None) -> Call:
        args: list[Any] = [owner, self.lease_ms, self.fence_ttl_ms, self.cap]
        if chan is not None:
            args.append(chan)
        return self.s_renew, self._keys, args

    def withdraw(self, owner: str, key: str) -> Call:
        return self.s_withdraw, self._keys, [
            owner, self.lease_ms, self.fence_ttl_ms, self.cap, key
        ]

    def info(self, key: str | None) -> Call:
        b = self._base
        return self.s_info, [b + "h", b + "i", b + "w"], []
