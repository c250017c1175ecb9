"""One script call on the wire, safe against stale replies and interrupts.

One job: run a script so that its caller only ever sees THE reply to ITS request.

Two faults make a pooled connection deliver another request's reply: an interrupt
(KeyboardInterrupt, an async exception, a cancelled task) after a command was sent and
before its reply was read leaves the reply unread on a connection that goes back to the
pool, and the next script on it (any thread) reads it. Two defences, each enough alone:

- Every script is wrapped (:func:`wrap`) to answer ``{nonce, reply}``, where ``nonce`` is
  a random string sent as the call's last argument (:func:`new_nonce`). A reply without
  this call's nonce is not this call's: :func:`unwrap` raises :class:`StaleReply` (a
  RedisError, so the caller gets a LaneBackendError; nothing is granted on its word).
- :func:`run_sync` runs the script on a connection of its caller's own (a permit of
  :class:`~._wake.Slots` carries one) and disconnects it when anything but a clean reply
  ends the call (an interrupt, a timeout, a stale reply): a connection with bytes pending
  is never used again, and no pool's bookkeeping can be cut in half by an interrupt.
"""

from __future__ import annotations

import os
from typing import Any

from redis.exceptions import NoScriptError, RedisError, ResponseError

__all__ = [
    "Call", "StaleReply", "info_sync", "new_nonce", "parse_info", "run_async", "run_sync", "unwrap",
    "wrap",
]


#: One script call: (script, KEYS, ARGV).
Call = tuple[Any, list[str], list[Any]]


class StaleReply(RedisError):
    """A reply that is not provably the reply to this request (a protocol error)."""


def wrap(src: str) -> str:
    """``src`` as a script that takes one more last argument, a nonce, and answers
    ``{nonce, <src's reply>}`` (``{nonce}`` when ``src`` answers nil)."""
    return (
        "local lq_nonce = ARGV[#ARGV]\nARGV[#ARGV] = nil\n"
        "local function lq_body()\n" + src + "\nend\nreturn {lq_nonce, lq_body()}\n"
    )


def new_nonce() -> str:
    return os.urandom(8).hex()


def unwrap(reply: Any, nonce: str) -> Any:
    """The reply of the wrapped script called with ``nonce``; StaleReply if ``reply`` is
    not that call's."""
    if isinstance(reply, list) and 1 <= len(reply) <= 2:
        head = reply[0]
        if isinstance(head, bytes):
            head = head.decode("ascii", "replace")
        if head == nonce:
            return reply[1] if len(reply) == 2 else None
    raise StaleReply(f"a reply that is not this request's: {reply!r:.80}")


def _clean(exc: BaseException) -> bool:
    """True if ``exc`` is a server error reply read in full (the connection is clean)."""
    return isinstance(exc, ResponseError) and not isinstance(exc, StaleReply)


def _ready(conn: Any) -> None:
    """Drop ``conn``'s socket if it is not clean (closed by the server, or bytes
    pending): the next send connects anew."""
    if getattr(conn, "_sock", None) is None:
        return
    try:
        dirty = conn.can_read()
    except Exception:
        dirty = True
    if dirty:
        conn.disconnect()


def run_sync(client: Any, script: Any, keys: list[str], args: list[Any],
             conn: Any = None) -> Any:
    """Call the wrapped ``script`` with ``keys`` and ``args`` (a nonce is appended) and
    return its reply, over ``conn`` (a bare connection this caller owns alone, see
    :class:`~._wake.Slots`) or, without one, redis-py's own path (a cluster client).
    Raises what redis-py raises, or StaleReply. ``conn`` is disconnected unless the call
    ended with a clean reply (its reply or a server error)."""
    nonce = new_nonce()
    argv = [*args, nonce]
    if conn is None:
        return unwrap(script(keys=keys, args=argv), nonce)
    try:
        _ready(conn)
        try:
            conn.send_command("EVALSHA", script.sha, len(keys), *keys, *argv)
            reply = conn.read_response()
        except NoScriptError:
            conn.send_command("EVAL", script.script, len(keys), *keys, *argv)
            reply = conn.read_response()
        return unwrap(reply, nonce)
    except BaseException as exc:
        if not _clean(exc):
            conn.disconnect()
        raise


def parse_info(reply: Any) -> dict[str, str]:
    """The ``field: value`` lines of an ``INFO`` reply (bytes or text), as text."""
    text = reply.decode() if isinstance(reply, bytes) else str(reply)
    out: dict[str, str] = {}
    for line in text.splitlines():
        name, sep, value = line.partition(":")
        if sep and not line.startswith("#"):
            out[name.strip()] = value.strip()
    return out


#: The channels the server check publishes an empty message on, listened to by nobody:
#: one of each family the lanes use (wake-ups, presence), as an ACL user's channel
#: permissions are the same for PUBLISH and SUBSCRIBE.
PROBE_CHANNELS = ("lq:wake:probe", "lq:live:probe")


def publish_probe_sync(client: Any, conn: Any = None) -> Any:
    """``PUBLISH`` an empty message on each of :data:`PROBE_CHANNELS` over ``conn`` (as
    :func:`info_sync`), to learn whether the client's user may use the library's
    channels (an ACL user without them: NoPermissionError)."""
    if conn is None:
        return [client.publish(channel, "") for channel in PROBE_CHANNELS]
    try:
        _ready(conn)
        replies = []
        for channel in PROBE_CHANNELS:
            conn.send_command("PUBLISH", channel, "")
            replies.append(conn.read_response())
        return replies
    except BaseException as exc:
        if not _clean(exc):
            conn.disconnect()
        raise


def info_sync(client: Any, section: str, conn: Any = None) -> Any:
    """``INFO section`` over ``conn`` (a bare connection this caller owns alone, as in
    :func:`run_sync`): its fields as text; without one, redis-py's ``client.info`` (a
    cluster client: one dict per node). ``conn`` is disconnected unless the call ended
    with a clean reply."""
    if conn is None:
        return client.info(section)
    try:
        _ready(conn)
        conn.send_command("INFO", section)
        return parse_info(conn.read_response())
    except BaseException as exc:
        if not _clean(exc):
            conn.disconnect()
        raise


async def run_async(client: Any, script: Any, keys: list[str], args: list[Any]) -> Any:
    """:func:`run_sync` for a ``redis.asyncio`` client (a cancelled task disconnects the
    connection it was using)."""
    nonce = new_nonce()
    argv = [*args, nonce]
    pool = getattr(client, "connection_pool", None)
    if pool is None or getattr(client, "connection", None) is not None:
        return unwrap(await script(keys=keys, args=argv), nonce)
    conn = await pool.get_connection()
    try:
        try:
            await conn.send_command("EVALSHA", script.sha, len(keys), *keys, *argv)
            reply = await conn.read_response()
        except NoScriptError:
            await conn.send_command("EVAL", script.script, len(keys), *keys, *argv)
            reply = await conn.read_response()
        return unwrap(reply, nonce)
    except BaseException as exc:
        if not _clean(exc):
            await conn.disconnect()
        raise
    finally:
        await pool.release(conn)
