"""The renewer's own connection (one job: renewals that never starve and never hang).

Renewals must not wait behind the callers of the client's pool: with a
``BlockingConnectionPool`` of 4 and 12 waiting threads, a renewal that needs a pool
connection may wait past its lease (C21). So the renewer of a lane object calls its script
over a connection of its own, made with the client's connection settings (host, auth, TLS,
database), with no retries and a socket timeout per call (the face passes the time left
before the holder's deadline). Not counted in the client's pool.

A cluster client (``RedisCluster``) has no single pool: its renewals go through the client
itself (its per-node pools are unbounded by default). The holder's deadline holds either
way: it is enforced by the watchdog (:mod:`._lease`), not by this I/O.
"""

from __future__ import annotations

import asyncio
from typing import Any

from redis.exceptions import NoScriptError, RedisError, ResponseError

from ._wire import Call, new_nonce, unwrap

__all__ = ["AsyncLink", "SyncLink", "blocking_factory"]


def factory(client: Any, wait: float | None = None) -> Any:
    """A maker of bare connections like the client's, or None (a cluster client);
    ``wait``: their socket timeout in seconds (also their connect timeout when the
    client has none), else the client's."""
    pool = getattr(client, "connection_pool", None)
    cls = getattr(pool, "connection_class", None)
    kwargs = getattr(pool, "connection_kwargs", None)
    if cls is None or not isinstance(kwargs, dict):
        return None
    kwargs = dict(kwargs)
    for k in ("maint_notifications_pool_handler", "retry"):
        kwargs.pop(k, None)
    if wait is not None:
        kwargs["socket_timeout"] = wait
        if kwargs.get("socket_connect_timeout") is None:
            kwargs["socket_connect_timeout"] = wait
    return lambda: cls(**kwargs)


def blocking_factory(client: Any) -> Any:
    """A maker of BLOCKING bare connections like ``client``'s, for a plain or an asyncio
    client (its connection class's blocking twin of the same name in
    ``redis.connection``), or None (a cluster client, or no such twin)."""
    import redis.connection

    make = _own_pool_kwargs(client)
    if make is None:
        return None
    cls, kwargs = make
    if cls.__module__.startswith("redis.asyncio"):
        cls = getattr(redis.connection, cls.__name__, None)
        if cls is None:
            return None
    kwargs.pop("retry", None)
    return lambda: cls(**kwargs)


class SyncLink:
    """The thread renewer's connection (used by one renewer thread at a time); ``make``:
    its maker (default: like ``client``'s, see :func:`factory`)."""

    def __init__(self, client: Any, make: Any = None) -> None:
        self._make = factory(client) if make is None else make
        self._conn: Any = None

    def _ready(self, wait: float) -> Any:
        """This link's connection (made on first use), every wait on it bounded by
        ``wait`` seconds."""
        conn = self._conn
        if conn is None:
            conn = self._conn = self._make()
        conn.socket_timeout = conn.socket_connect_timeout = wait
        sock = getattr(conn, "_sock", None)
        if sock is not None:
            sock.settimeout(wait)
        return conn

    def call(self, script: Any, keys: list[str], args: list[Any], wait: float) -> Any:
        if self._make is None:
            nonce = new_nonce()
            return unwrap(script(keys=keys, args=[*args, nonce]), nonce)
        try:
            conn = self._ready(wait)  # (a failure here drops the connection too)
            nonce = new_nonce()
            argv = [*args, nonce]
            try:
                conn.send_command("EVALSHA", script.sha, len(keys), *keys, *argv)
                reply = conn.read_response(timeout=wait)
            except NoScriptError:
                conn.send_command("EVAL", script.script, len(keys), *keys, *argv)
                reply = conn.read_response(timeout=wait)
            return unwrap(reply, nonce)
        except BaseException:
            self.close()
            raise

    def call_many(self, calls: list[Call], wait: float) -> list[Any]:
        """Every call of ``calls`` (script, keys, args) in ONE round trip, pipelined on
        this link's connection (one by one on a cluster client); the replies in order,
        an exception object in place of the reply of a call that failed alone (a server
        error reply: the connection stays clean). Waits at most ``wait`` seconds per
        read; a failure of the connection raises (and drops it)."""
        if self._make is None:
            return [_one(lambda c=c: self._cluster_call(c)) for c in calls]
        try:
            conn = self._ready(wait)
            nonces = [new_nonce() for _ in calls]
            replies: list[Any] = [None] * len(calls)
            todo = list(range(len(calls)))
            for command in ("EVALSHA", "EVAL"):  # EVAL: scripts the server did not know
                if not todo:
                    break
                conn.send_packed_command(conn.pack_commands(
                    [_command(command, calls[i], nonces[i]) for i in todo]))
                missing = []
                for i in todo:
                    try:
                        replies[i] = unwrap(conn.read_response(timeout=wait), nonces[i])
                    except NoScriptError as exc:
                        missing.append(i)
                        replies[i] = exc
                    except ResponseError as exc:  # read in full: the connection is clean
                        replies[i] = exc
                todo = missing
            return replies
        except BaseException:
            self.close()
            raise

    @staticmethod
    def _cluster_call(call: Call) -> Any:
        script, keys, args = call
        nonce = new_nonce()
        return unwrap(script(keys=keys, args=[*args, nonce]), nonce)

    def close(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            try:
                conn.disconnect()
            except Exception:  # pragma: no cover - closing a broken socket
                pass


def _command(command: str, call: Call, nonce: str) -> tuple[Any, ...]:
    script, keys, args = call
    body = script.sha if command == "EVALSHA" else script.script
    return (command, body, len(keys), *keys, *args, nonce)


def _one(fn: Any) -> Any:
    """``fn()``, or the RedisError it raised (one call of a batch failing alone)."""
    try:
        return fn()
    except RedisError as exc:
        return exc


class AsyncLink:
    """The asyncio renewer's connection (one renewer task at a time)."""

    def __init__(self, client: Any) -> None:
        self._make = factory(client)
        self._conn: Any = None

    async def call(self, script: Any, keys: list[str], args: list[Any], wait: float) -> Any:
        if self._make is None:
            nonce = new_nonce()
            reply = await asyncio.wait_for(script(keys=keys, args=[*args, nonce]), wait)
            return unwrap(reply, nonce)
        conn = self._conn
        if conn is None:
            conn = self._conn = self._make()
        conn.socket_timeout = conn.socket_connect_timeout = wait
        try:
            return await asyncio.wait_for(self._eval(conn, script, keys, args), wait)
        except BaseException:
            await self.close()
            raise

    @staticmethod
    async def _eval(conn: Any, script: Any, keys: list[str], args: list[Any]) -> Any:
        nonce = new_nonce()
        argv = [*args, nonce]
        try:
            await conn.send_command("EVALSHA", script.sha, len(keys), *keys, *argv)
            reply = await conn.read_response()
        except NoScriptError:
            await conn.send_command("EVAL", script.script, len(keys), *keys, *argv)
            reply = await conn.read_response()
        return unwrap(reply, nonce)

    async def call_many(self, calls: list[Call], wait: float) -> list[Any]:
        """:meth:`SyncLink.call_many` for the asyncio renewer (``wait`` bounds the whole
        round trip)."""
        if self._make is None:
            out = []
            for script, keys, args in calls:
                nonce = new_nonce()
                try:
                    reply = await asyncio.wait_for(script(keys=keys, args=[*args, nonce]), wait)
                    out.append(unwrap(reply, nonce))
                except RedisError as exc:
                    out.append(exc)
            return out
        conn = self._conn
        if conn is None:
            conn = self._conn = self._make()
        conn.socket_timeout = conn.socket_connect_timeout = wait
        try:
            return await asyncio.wait_for(self._eval_many(conn, calls), wait)
        except BaseException:
            await self.close()
            raise

    @staticmethod
    async def _eval_many(conn: Any, calls: list[Call]) -> list[Any]:
        nonces = [new_nonce() for _ in calls]
        replies: list[Any] = [None] * len(calls)
        todo = list(range(len(calls)))
        for command in ("EVALSHA", "EVAL"):
            if not todo:
                break
            await conn.send_packed_command(conn.pack_commands(
                [_command(command, calls[i], nonces[i]) for i in todo]))
            missing = []
            for i in todo:
                try:
                    replies[i] = unwrap(await conn.read_response(), nonces[i])
                except NoScriptError as exc:
                    missing.append(i)
                    replies[i] = exc
                except ResponseError as exc:
                    replies[i] = exc
            todo = missing
        return replies

    async def close(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            try:
                await conn.disconnect()
            except Exception:  # pragma: no cover - closing a broken socket
                pass


def _own_pool_kwargs(client: Any) -> tuple[Any, dict[str, Any]] | None:
    pool = getattr(client, "connection_pool", None)
    cls = getattr(pool, "connection_class", None)
    kwargs = getattr(pool, "connection_kwargs", None)
    if cls is None or not isinstance(kwargs, dict):
        return None
    kwargs = dict(kwargs)
    kwargs.pop("maint_notifications_pool_handler", None)
    return cls, kwargs


def sibling_sync(client: Any) -> Any:
    """A client like ``client`` on a small pool of its own (for the wake-up listener: it
    must not take a connection of the callers' pool); a cluster client itself; None if
    neither can subscribe."""
    import redis

    made = _own_pool_kwargs(client)
    if made is not None:
        cls, kwargs = made
        kwargs["socket_timeout"] = None  # a subscriber waits for messages
        return redis.Redis(connection_pool=redis.ConnectionPool(
            connection_class=cls, max_connections=2, **kwargs))
    return client if callable(getattr(client, "pubsub", None)) else None


def sibling_async(client: Any) -> Any:
    """The asyncio twin of :func:`sibling_sync`."""
    import redis.asyncio

    made = _own_pool_kwargs(client)
    if made is not None:
        cls, kwargs = made
        kwargs["socket_timeout"] = None
        return redis.asyncio.Redis(connection_pool=redis.asyncio.ConnectionPool(
            connection_class=cls, max_connections=2, **kwargs))
    return client if callable(getattr(client, "pubsub", None)) else None
