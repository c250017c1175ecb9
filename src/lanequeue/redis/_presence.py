"""Presence: how Redis learns at once that a holder's process died (failover, C30).

One job: one connection per process and server whose mere existence on the server says
"this process is alive", and which the process watches so that it learns first when the
server may stop believing it.

- The connection subscribes to a channel of its own, ``lq:live:<process token>:<epoch>``
  (a fresh random epoch per connection). A hold records that channel in Redis with its
  grant; a waiter's script asks ``PUBSUB NUMSUB`` whether anyone still listens on it. When
  a process is killed (SIGKILL, OOM kill, crash), its kernel closes the socket and Redis
  drops the subscription at once; the head waiter sees the channel empty, and once it has
  stayed empty for :data:`GRACE_S` (measured on the server's clock, across the waiter's
  polls), it takes the hold over. A process that is only slow (a GC pause, SIGSTOP, a
  blocked event loop) keeps its socket, hence its subscription, and keeps its holds up to
  ``lease_s``.
- The holder learns its loss first. The process's presence thread pings on that
  connection every :data:`PING_S`; the moment the connection fails (an error, EOF, a
  reset), or a ping stays unanswered for :data:`PONG_TIMEOUT_S` while the thread runs
  (a connection silently dead: a partition, a failed-over master), the epoch is DEAD:
  every hold granted under it reads ``lost`` and ``on_lease_lost`` is called, before
  anything else is sent. The connection is never reconnected in place: a new connection
  is a new epoch, and holds of the old one stay lost. So the holder marks its holds lost
  at most ``PING_S + PONG_TIMEOUT_S`` (1 s) after the last moment its connection was
  known present on the server, while the server acts no earlier than ``GRACE_S`` (2 s)
  after it saw the connection absent, which is after that moment. Before declaring a ping
  unanswered the thread reads the socket once more without waiting, so a process that
  was frozen (its answer sitting in the socket buffer) does not lose its holds.
- A host that vanishes without closing its sockets (power loss, a cable) leaves its
  connections open on the server until TCP keepalive closes them: its holds fall back to
  ``lease_s``. So does a hold granted while the process had no presence connection (its
  first moments, a reconnect) and every hold on Redis Cluster (``PUBSUB NUMSUB`` counts
  only one node's subscribers, so presence is off there).

It is a daemon thread per process and server, for both faces (an event loop that blocks
must not make its connection look dead), with a plain socket connection made from the
client's connection settings.
"""

from __future__ import annotations

import inspect
import logging
import os
import threading
import time
import weakref
from typing import Any

from .._core import at_fork_in_child
from .._errors import told
from ._wake import Gate

__all__ = ["GRACE_S", "PING_S", "PONG_TIMEOUT_S", "Epoch", "Presence", "presence_for"]

log = logging.getLogger("lanequeue.redis")

#: How long a holder's presence channel must stay empty on the server before a waiter
#: takes the hold over (seconds, server clock).
GRACE_S = 2.0
#: The presence thread pings this often (seconds).
PING_S = 0.25
#: A ping unanswered this long (seconds, while the thread runs) kills the epoch.
PONG_TIMEOUT_S = 0.75


class Epoch:
    """One presence connection's life: its channel, and whether it died."""

    __slots__ = ("channel", "dead", "_lanes", "_lock")

    def __init__(self, channel: str) -> None:
        self.channel = channel
        self.dead = False
        self._lanes: weakref.WeakSet[Any] = weakref.WeakSet()
        self._lock = threading.Lock()

    def watch(self, lane: Any) -> None:
        """``lane._presence_lost(self)`` is called when this epoch dies."""
        with self._lock:
            self._lanes.add(lane)

    def _die(self) -> int:
        """Mark the epoch dead and its holds lost; return how many holds were lost."""
        with self._lock:
            if self.dead:
                return 0
            self.dead = True
            lanes = list(self._lanes)
        lost = 0
        for lane in lanes:
            try:
                lost += int(lane._presence_lost(self))
            except Exception:  # never let the presence thread die
                log.exception("presence: marking holds lost failed")
        return lost


def _sync_connection_maker(client: Any) -> Any:
    """A maker of plain (sync) connections to the client's server, or None (a cluster
    client, or settings we cannot map)."""
    import redis
    import redis.connection as rc

    pool = getattr(client, "connection_pool", None)
    cls = getattr(pool, "connection_class", None)
    kwargs = getattr(pool, "connection_kwargs", None)
    if cls is None or not isinstance(kwargs, dict):
        return None
    name = cls.__name__
    target: Any = {
        "Connection": redis.Connection,
        "SSLConnection": redis.SSLConnection,
        "UnixDomainSocketConnection": redis.UnixDomainSocketConnection,
    }.get(name)
    if target is None:
        return None
    allowed: set[str] = set()
    for klass in target.__mro__:
        init = klass.__dict__.get("__init__")
        if init is not None:
            allowed |= set(inspect.signature(init).parameters)
    skip = {"self", "retry", "retry_on_timeout", "retry_on_error", "health_check_interval",
            "maint_notifications_pool_handler", "maint_notifications_config",
            "redis_connect_func", "event_dispatcher", "protocol", "socket_timeout",
            "socket_connect_timeout"}
    kw = {k: v for k, v in kwargs.items() if k in allowed and k not in skip}
    kw["socket_timeout"] = PONG_TIMEOUT_S
    kw["socket_connect_timeout"] = PONG_TIMEOUT_S
    _ = rc  # the module is imported for its classes' registration only
    return lambda: target(**kw)


def _address(client: Any) -> Any:
    kwargs = getattr(getattr(client, "connection_pool", None), "connection_kwargs", None)
    if not isinstance(kwargs, dict):
        return None
    return (kwargs.get("host"), kwargs.get("port"), kwargs.get("path"),
            kwargs.get("username"))


class Presence:
    """This process's presence connection to one server (see the module docstring)."""

    def __init__(self, make: Any) -> None:
        self._make = make
        self.epoch: Epoch | None = None
        #: The server's id of the current presence connection (0: none), e.g. for
        #: ``CLIENT KILL ID`` in fault tests.
        self.client_id = 0
        self.ready = Gate()
        self.pid = os.getpid()
        #: The connection in use (None between two): a forked child closes its copy of
        #: the socket (see _after_fork).
        self.conn: Any = None
        threading.Thread(target=self._run, name="lanequeue-presence", daemon=True).start()

    def current(self) -> Epoch | None:
        """The live epoch to record with a grant asked for now, or None (no presence)."""
        e = self.epoch
        return e if e is not None and not e.dead else None

    def _run(self) -> None:
        pause = 0.2  # between attempts; doubles up to 2 s while the server is unreachable
        while True:
            conn = None
            epoch: Epoch | None = None
            try:
                conn = self.conn = self._make()
                conn.connect()
                conn.send_command("CLIENT", "ID")
                self.client_id = int(conn.read_response())
                chan = f"lq:live:{os.urandom(5).hex()}:{os.urandom(4).hex()}"
                conn.send_command("SUBSCRIBE", chan)
                conn.read_response(push_request=True)
                epoch = self.epoch = Epoch(chan)
                self.ready.set()
                pause = 0.2
                while True:
                    self._ping(conn)
                    time.sleep(PING_S)
            except Exception as exc:
                self.epoch = None
                lost = epoch._die() if epoch is not None else 0
                if lost:
                    log.warning("presence connection to Redis lost (%s): the %d holds "
                                "granted under it are lost; a new one follows",
                                told(exc), lost)
                else:
                    log.debug("presence connection: %s; a new one follows", exc)
            finally:
                self.epoch = None
                self.client_id = 0
                self.conn = None
                if epoch is not None:
                    epoch._die()
                if conn is not None:
                    try:
                        conn.disconnect()
                    except Exception:  # pragma: no cover - closing a broken socket
                        pass
            self.ready.set()
            time.sleep(pause)
            pause = min(2.0, pause * 2)

    @staticmethod
    def _ping(conn: Any) -> None:
        """One ping, answered within PONG_TIMEOUT_S of running time, or raise."""
        conn.send_command("PING")
        deadline = time.monotonic() + PONG_TIMEOUT_S
        while True:
            left = deadline - time.monotonic()
            # After a freeze ``left`` is negative: can_read(0) still sees an answer that
            # waits in the socket buffer, so a frozen process keeps its epoch.
            if conn.can_read(timeout=max(0.0, left)):
                reply = conn.read_response(push_request=True)
                first = reply[0] if isinstance(reply, list) and reply else reply
                if isinstance(first, bytes):
                    first = first.decode()
                if str(first).lower() == "pong":
                    return
                continue
            # A thread that waited long for the interpreter (a busy process) may come
            # back from a wait that timed out after the answer arrived: look once more,
            # without waiting, before declaring the connection dead.
            if time.monotonic() >= deadline and not conn.can_read(timeout=0):
                raise TimeoutError(f"presence ping unanswered for {PONG_TIMEOUT_S} s")


_registry: dict[Any, Presence] = {}
_lock = threading.Lock()


def presence_for(client: Any) -> Presence | None:
    """This process's presence for ``client``'s server (started on first use; anew in a
    forked child), or None when presence is off (a cluster client, unknown settings) or
    its thread cannot be started (out of threads)."""
    addr = _address(client)
    if addr is None:
        return None
    p = _registry.get(addr)
    if p is not None and p.pid == os.getpid():
        return p
    with _lock:
        p = _registry.get(addr)
        if p is None or p.pid != os.getpid():
            make = _sync_connection_maker(client)
            if make is None:
                return None
            try:
                p = Presence(make)
            except RuntimeError as exc:  # "can't start new thread": out of threads
                # Holds fall back to lease_s, as without presence; the next lane object
                # made for this server tries again.
                log.warning("the Redis presence connection could not start (%s); holds "
                            "of lanes made now rely on lease_s alone", exc)
                return None
            _registry[addr] = p
    return p


def _after_fork() -> None:
    """In a forked child: no presence of the parent's. Its connections' sockets are
    closed here, in the child only (redis-py's ``disconnect`` shuts a socket down only
    in the process that opened it): a child that kept a copy open would keep the
    parent's presence subscription alive on the server after the parent died (killed),
    and its holds would wait for their leases instead of moving on in seconds."""
    global _lock
    _lock = threading.Lock()
    for p in list(_registry.values()):
        conn = p.conn
        if conn is not None:
            try:
                conn.disconnect()
            except Exception:  # pragma: no cover - closing a copy of a socket
                pass
    _registry.clear()


at_fork_in_child(_after_fork)
