"""The key layout of the Redis lanes and the one identity of a lane key.

One job: turn (prefix, kind, name, key) into the base of every Redis key of that lane or
that key, and turn what a caller passes as a key into the plain string it stands for.

Layout (protocol version :data:`LAYOUT`)::

    {lq2:<len(P)>:<P>:<kind>:<len(N)>:<N>[:<K>]}:<suffix>

``P`` (prefix) and ``N`` (name) are length-prefixed and the kind is one letter at a fixed
place, so distinct (prefix, kind, name, key) tuples never map to the same Redis key, whatever
characters they contain (a ``:`` in the prefix, ``{``, ``}`` or ``:`` in the key: C24). The
key comes last; the suffixes are one letter, or ``s:`` plus a hex owner id, so a key that
ends in something suffix-like cannot reach another key's names either. Every Redis key of
one base shares its hash tag (from the first ``{`` to the first ``}``), hence its slot,
also when the key itself contains ``}`` (the tag is then a prefix of the base).

Versions. The layout names its protocol version, so clients of two versions never read
each other's keys; they meet at one marker per lane (:func:`version_key`), which holds the
version in use (see ``RedisLaneBase._check_version``): a client of another version is
refused with a LaneBackendError instead of granting next to the first version's holders.
"""

from __future__ import annotations

from .._validate import bad_key, check_utf8

__all__ = ["LAYOUT", "base", "plain_key", "version_key"]

#: Protocol version of the key layout and scripts (part of every key's name).
LAYOUT = "lq2"


def plain_key(key: object, name: str = "key") -> str:
    """The plain ``str`` value a lane key stands for (C23): a ``str`` subclass (a ``str``
    Enum member) is its string value, as ``str.__str__`` gives it, never its ``repr`` or
    ``format``. Raises TypeError for a non-str, ValueError for an empty string or one
    that cannot be encoded as UTF-8 (a lone surrogate), at the caller's line."""
    if key.__class__ is not str:
        if not isinstance(key, str):
            bad_key(key, name)
        key = str.__str__(key)
    if not key:
        bad_key(key, name)
    return check_utf8(key, name)


def base(prefix: str, kind: str, name: str, key: str | None = None, layout: str = LAYOUT) -> str:
    """The base ``{...}:`` of every Redis key of a counting lane (``key`` None) or of
    one key of a per-key lane, in protocol version ``layout``."""
    tail = "" if key is None else f":{key}"
    return f"{{{layout}:{len(prefix)}:{prefix}:{kind}:{len(name)}:{name}{tail}}}:"


def version_key(prefix: str, kind: str, name: str) -> str:
    """The lane's protocol-version marker: a name that no version's layout changes
    (``{lq:...}:v``), so clients of every version meet there."""
    return f"{{lq:{len(prefix)}:{prefix}:{kind}:{len(name)}:{name}}}:v"
