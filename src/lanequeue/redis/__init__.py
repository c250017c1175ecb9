"""The lanes on Redis (or Valkey): per-key FIFO and global caps across processes and hosts.

Install with ``pip install lanequeue[redis]``. Four lanes, each the twin of an in-process
lane, with its surface, defaults and errors, plus leases and fencing tokens:

- :class:`RedisSessionLane` (twin of ``SessionLane``) and :class:`RedisLane` (twin of
  ``Lane``) take a ``redis.Redis`` client;
- :class:`AsyncRedisSessionLane` and :class:`AsyncRedisLane` take a
  ``redis.asyncio.Redis`` client (twins of the asyncio lanes).

``LaneQueue.add(...)`` (and ``AsyncLaneQueue.add(...)``) accept them, and
``add_lane`` / ``add_session_lane`` make them given a :class:`RedisBackend`, so one
``acquire_all`` can mix in-process and Redis lanes. Example::

    import redis
    from lanequeue import LaneQueue
    from lanequeue.redis import RedisBackend

    backend = RedisBackend(redis.Redis(), lease_s=30)
    queue = LaneQueue()
    queue.add_session_lane("session", backend=backend)
    queue.add_lane("global", max_concurrent=8, backend=backend)
    with queue.acquire_all(session_key, ["session", "global"]) as holds:
        reply = call_model(..., fence=holds["session"].fencing_token)

Design
======
Every operation is ONE Lua script, so it is atomic on the server and costs one round trip
on the fast path. Time is the server's (``TIME`` inside the script), never a client clock.
Every script answers with a random nonce its request carried, and a reply without it is
refused (LaneBackendError): an interrupt (KeyboardInterrupt, a cancelled task) between a
request and its reply can never hand that reply to another call; the connection of an
interrupted call is dropped (see :mod:`._wire`).
All keys one script touches share one hash tag, so the lanes work on Redis Cluster. Needs
Redis >= 6.2 (``SET ... GET``) or Valkey, with ``maxmemory-policy noeviction`` (or no
``maxmemory``): an evicted holder key would let a second holder in, so a lane checks the
policy (``INFO memory``) on first use and refuses any other with a LaneBackendError.

Keys (``P`` = ``prefix``, default ``"lanequeue"``; ``N`` = lane name; ``K`` = key; the
base ``B`` is ``{lq2:len(P):P:s:len(N):N:K}:`` for one key of a per-key lane and
``{lq2:len(P):P:c:len(N):N}:`` for a counting lane, see :mod:`._keys`: ``lq2`` is the
protocol version, and the lengths make distinct lanes and keys never share a Redis key,
whatever ``:``, ``{`` or ``}`` they contain)::

    per-key lane, one tag per key:  Bh   holder: string "owner:fence", + ":w"
                                         once someone joined the line behind it
                                    Bq   line: list of waiter ids, FIFO
                                    Bw   liveness: zset waiter id -> deadline (ms)
                                    Bf   last fencing token
                                    Bx:<id>  a withdrawn acquisition (lives one lease)
                                    Bp   presence: "owner|channel|absent since ms"
                                    Bn   waiter id -> "channel|lease_ms" (its last poll)
                                    Bj   waiter id -> server time it joined the line (ms)
    counting lane, one tag per lane: Bh  holds: zset hold id -> lease deadline (ms)
                                    Bi   hold id -> "fence:since:key"
                                    Bq   line: list of "id:key", FIFO
                                    Bw, Bf, Bx:<id>  as above
                                    Bp   presence: hold id -> "channel|absent since"
                                    Bn, Bj   as above

Protocol versions. Clients of two protocol versions never share a lane: each lane has a
version marker ``{lq:len(P):P:<kind>:len(N):N}:v`` (a name no version changes) holding the
version in use, claimed by a lane object on its first acquire and re-claimed every 30 s
while it acquires or holds (the marker lives 60 s). A client of another version meets it
and gets a LaneBackendError naming both versions, instead of granting next to holders it
cannot see; once the old version has been idle for 60 s, the new one takes the lane over.
(The layout before ``lq2`` had no marker: stop its clients before starting ``lq2`` ones.)

A key is its plain string value in every face: a ``str`` subclass (a ``str`` Enum member)
is the string it stands for, so ``Room.LOBBY`` and ``"lobby"`` are one key; a key that
cannot be encoded as UTF-8 (a lone surrogate) is a ValueError at the call.

Every key has a TTL: the holder key and the holds zset live as long as the longest lease
in them, the line and liveness keys as long as the longest waiter liveness, the fence
counter one lease after the last grant, a tombstone one lease. When
the work ends and the leases run out, no key of the lane is left but its version marker,
which runs out 60 s after the lane's last use. The same key of a
per-key lane always lands in the same slot; different keys spread over the cluster.

Owner ids. Every acquisition draws its own random id (kept in its hold object, never in
a thread-local or in the lane object): two threads or tasks sharing one lane object can
never release each other's hold, and a hold that outlived its lease can never end its
successor's (the bug of shared lock objects, NOTES §4; cases C15-C17).

States of one key K (per-key lane; the counting lane is the same with ``max_concurrent``
holds in a zset instead of one holder)::

    FREE --acquire--> HELD(owner, lease) --release: line empty----------------> FREE
                        |   ^      |
       acquire (busy):  |   |      +--release / lease ran out + line not empty:
       join the line    v   |         hand the key to the first LIVE waiter as a CLAIM
                  HELD + LINE  <------(expires at that waiter's liveness deadline); the
                                       waiter confirms it into a full lease

- Acquire. If K has no holder, the line goes first (promote): the first live waiter gets
  it. If nobody live waits, the caller gets K at once with a lease of ``lease_s``. If K
  is held, the caller joins the tail of the line (RPUSH) and its liveness deadline is
  set to now + ``live`` (3 polls + 1 s). Waiting order is the order in which the
  acquire scripts ran: FIFO across processes and hosts. Inside one process, same-key
  requests of one lane object join the line in their arrival order: each sends its
  first script once its predecessor's first script has answered (C29); it never waits
  outside the line for anything else.
- Waiting. A waiter holds no connection while it waits. The hand-off publishes the
  granted waiter's id on its process's channel ``lq:wake:<process token>``; each
  process subscribes once per client (one listener thread, or one listener task per
  event loop, on a connection of its own) and wakes the waiting thread or task
  (:mod:`._wake`); a waiting call makes sure that subscription is in place before its
  first acquire script can put it in line, so no hand-off to it is published unheard.
  Only the granted waiter is woken (no herd). A waiter re-runs acquire
  at least every poll, ``min(remaining, 1 s, lease_s/3)`` (longer when one process
  has many waiters on one client: together they poll about 500 times a second at
  most, each with a liveness window of 3 of its polls + 1 s); a lost wake-up costs one
  poll of latency, never a hang; each poll refreshes the waiter's liveness and also
  moves a key whose holder lapsed. A poll lasts, in that window, as long as the
  process's polls have lately taken to run (their wait for a turn among the process's
  calls in flight, a busy event loop; :class:`~._wake.Lateness`): a live waiter whose
  own process runs its polls late keeps its place, never dropped as dead and sent to
  the tail (a backlog of polls once did that, reordering a key's waiters and leaving
  keys idle). A wake-up carrying a grant that reaches a waiter while its poll still
  waits for that turn ends the poll unsent: the waiter holds at once (asyncio face; the
  thread face sends nothing once the turn comes), instead of leaving the key idle
  until the turn comes. The waiter at the head of the line is told (in the
  acquire reply) when the lease blocking it runs out, and polls right then. The lanes'
  calls in flight are bounded per process and client (8, or the pool's size if
  smaller, the first-use server check included; releases and withdrawals have a bound
  of 4 of their own, so they never wait behind acquires and polls: in the thread face on
  connections of its own, in the asyncio face from the client's pool, both bounds
  together never more than its ``max_connections``, see :func:`._wake.async_bounds`), so
  any number of waiters fits the client's pool, down to a pool of one connection.
- Hand-off. Release deletes the holder and, in the same script, pops waiters from the
  head (skipped when the holder carries no ``:w`` mark: a waiter marks the holder it
  joins the line behind, and a hand-off's holder is marked from the start, so an
  unmarked holder means an empty line): a waiter whose liveness ran out (crashed, or
  frozen too long) is dropped; the first live one becomes holder with a claim that
  lasts until its liveness deadline, and it is woken. The woken waiter's
  acquire sees itself as holder and confirms (full lease). A waiter that died after its
  last refresh therefore blocks K for at most its liveness window (3 polls + 1 s, i.e.
  ``3 * min(1, lease_s/3) + 1`` s: more than a lease when ``lease_s`` is under 3 s);
  the next poll of anyone moves K on. The fast hand-off (2 round trips per grant on the
  critical path: the release, then the woken waiter works): a waiter sends its process's
  presence channel and its lease with each poll (``Bn``); when that channel has its
  subscriber at the hand-off, the waiter gets a FULL lease of its own length, with its
  presence recorded, and the wake-up message carries the fencing token (``id:token``):
  the woken waiter holds at once, counting its deadline from before its last poll was
  sent (the hand-off ran after it). A waiter that died since its last poll is then
  ended by presence (its process was killed: about 3 s) or, if its host vanished, by
  its lease; a wake-up that is lost costs one poll, whose acquire confirms the grant.
  No instant exists in which K is free while a live waiter is in line, so a newcomer
  cannot overtake.
- Leases. Every grant is a lease (a PEXPIRE on the holder key; a deadline score in the
  counting lane's zset). A background renewer (one daemon thread per sync lane object,
  one task per async lane object) renews each hold every ``lease_s/3`` with one script
  that extends the lease only if the owner id still matches; the holds due at once are
  renewed in one pipelined round trip. It uses a connection of its
  own (never waiting behind the callers of the client's pool), no retries, and waits at
  most ``lease_s/4`` and never past the holder's deadline. A hold whose release is on
  its way (waiting for a pool connection) is still renewed. A holder that stops
  renewing (its host vanished; a killed process's holds are taken over sooner, see
  Failover) keeps them until its lease runs out, and the head waiter, which polls at
  the moment the lease ends, takes K over: the key reaches the next waiter within
  ``lease_s`` (counted from the holder's last renewal) plus a round trip, plus the
  lateness of the server's blocking-wait timer (up to ``1/hz`` s: 100 ms at the default ``hz 10``).
- Failover (C30; :mod:`._presence`). Each process keeps one presence connection per
  server, subscribed to a channel of its own (``lq:live:<random>:<epoch>``; a new
  connection is a new epoch), and each grant records the channel it was asked under
  (``Bp``). The head waiter, at each of its polls, asks ``PUBSUB NUMSUB`` whether the
  holder's channel still has its subscriber; once it has been empty for ``GRACE_S``
  (2 s, on the server's clock, the first empty reading starts it), the waiter's script
  ends that hold and takes the key (or permit) through the line; with nobody in line, a
  ``try_acquire`` does the same and takes it. A killed process's kernel closes its
  sockets at once, so its holds move on within 2 s plus one poll (about 3 s) when
  callers already wait or poll, whatever ``lease_s`` is; a caller that comes later
  starts the 2 s at its first attempt. A process that is only slow (a GC pause,
  SIGSTOP, a blocked event loop) keeps its sockets open and its holds up to ``lease_s``.
  The rule "the holder learns of a loss no later than the server acts on it" holds
  because the holder's presence thread pings every 0.25 s and declares the epoch DEAD,
  marking every hold granted under it lost (flag and ``on_lease_lost``), the moment the
  connection fails (error, EOF, reset; redis-py is never allowed to reconnect it in
  place) or a ping stays unanswered for 0.75 s while the thread runs (a connection that
  is silently dead, e.g. to a master that was failed over). So the holder's loss comes
  at most 1 s after the last moment its connection was known present on the server; the
  server cannot see the connection absent before that moment, and acts 2 s after it
  does. After a Sentinel failover the new master has no subscribers at all: holders
  connected to the old one detect the dead connection within that 1 s (the failover
  itself takes longer), and their new presence connection is a new epoch, so the holds
  of the old one stay lost. The price: a failover, a server restart, or a server that
  stops answering for more than 0.75 s (a long script, a slow fork) ends every hold
  granted under the connections it affects; the holders learn it within a ping, about
  0.25 s (``lost``,
  ``on_lease_lost``) and acquire again. A slow CLIENT process keeps its holds: a frozen
  process is not mistaken for a dead connection, since the thread reads the socket once
  more without waiting before it declares a ping unanswered, and the answer to a ping
  sent before a freeze waits in the socket buffer.
  Falls back to ``lease_s``: a host that vanishes without closing its sockets (they stay
  open on the server until TCP keepalive), a hold granted while its process had no
  presence connection, a hold confirmed by a withdraw, and Redis Cluster (``NUMSUB``
  counts one node's subscribers only, so presence is off there).
- The holder's own deadline. A hold's deadline is its lease counted from BEFORE the
  request that granted or last renewed it was sent, less a guard
  (``min(lease_s/20, 0.25)`` s); the server's expiry can only come later. ``hold.lost``
  reads the clock, so it is True from that deadline on without any I/O, and a watchdog
  thread (one per process) marks the hold lost and calls ``on_lease_lost(hold)`` then
  (for the asyncio lanes, on the renewer's loop). A stalled renewer (a starved pool, a
  frozen server, a cut connection) therefore never leaves a holder believing it holds a
  key Redis may already have granted to someone else. A renewal answered after the
  deadline does not revive the hold.
- Lease lost. When a renewal finds the hold gone, or the holder's deadline passes without
  a confirmed renewal, the hold is marked lost and ``on_lease_lost(hold)`` is called
  once. Its release then raises :class:`~lanequeue.LeaseLostError` (``manual_release``
  returns False and logs). Not lost: a hold gone after its release was sent and an
  interrupt stopped that release before the answer (the script ran): counted released,
  with a warning, unless its own deadline had passed.
- Dropped holds. The registry refers weakly to the holds a caller owns (``with
  lane.acquire(key)``, ``acquire_all``): a hold garbage-collected without a release is
  no longer renewed, the lane object's renewer releases it at its next round (within
  ``lease_s/3``; else its lease lapses within ``lease_s``), and a ``ResourceWarning``
  names it. An acquire interrupted after its grant was recorded leaves its hold to its
  owner, as in process: a caller-owned hold stays held while its object lives (in the
  interrupt's traceback) and is released as above once dropped. Holds taken with
  ``try_acquire``/``acquire_timeout`` belong to the lane object until
  ``manual_release(key)``.
- Interrupts (threads). The clean-up of an interrupted acquire (withdraw, pass on a
  grant) runs in a thread of the process's clean-up service, which no signal handler
  interrupts; the interrupted caller waits for it at most 0.5 s, so a second
  KeyboardInterrupt while it runs ends that wait, not the clean-up.
- Cancellation (asyncio). The clean-up of a cancelled acquire (withdraw, pass on a grant)
  and every release run to their end in tasks of their own, so a second cancellation
  cannot cut them short; a withdraw leaves a tombstone (``Bx:<id>``) so that the
  acquisition's own acquire script, should it reach Redis after the withdraw (sent first
  on a connection the cancellation closed), grants nothing. The cancelled task waits for
  its clean-up at most 0.5 s (``_async.CANCEL_WAIT_S``), then ends while the clean-up
  goes on in the background.
- A frozen server. Every script call (both faces, connecting included) waits for its
  reply at most the client's ``socket_timeout``, or 5 s when it has none
  (``_args.CALL_WAIT_S``; the thread face's connections are its own, the asyncio face
  bounds the call itself), then fails (LaneBackendError) and drops its connection: no
  caller, clean-up or cancellation waits on a frozen server without a bound. A clean-up
  that failed so is not retried: the line entry lapses with its liveness, a grant with
  its lease (or its presence channel).
- Fork. A hold belongs to the process that acquired it: a forked child never renews the
  holds it inherited (nor uses the parent's renewal connection or locks), and releasing
  one there (``hold.release()``, ``manual_release``) raises RuntimeError. A lane
  object's view of this process starts empty in the child (``active_count``,
  ``waiting``, ``get_active()``, ``stuck()``, ``wait_idle()``, ``drain()``: the parent's
  holders and waiting threads are not the child's); the lane-wide views, read from
  Redis, still show the parent's holds. The child makes its own presence connection,
  wake-up listener and renewer.
- Release. The script ends the hold only if the owner id matches (counting lane: after
  purging expired holds). A stale or foreign release changes nothing: ``hold.release()``
  raises :class:`~lanequeue.LeaseLostError` (a NotOwnerError) when the lease is gone,
  whether that was known before the release was sent or learnt from the script's answer,
  and plain NotOwnerError when the hold was released already, or ended by
  ``manual_release``;
  ``manual_release(key)`` releases this lane OBJECT's own oldest hold of key and returns
  False with a warning when it has none (another client's hold is untouched).
- Withdraw. A waiter that times out, is interrupted or cancelled leaves the line in one
  script; if a hand-off reached it first, it holds K (the script confirms the lease and
  returns the token): a timed-out waiter keeps it, an interrupted one releases it.
- Fencing tokens. Each grant takes ``max(last + 1, server time in µs)``: tokens of a key
  (per-key lane) or of the lane (counting lane) grow with every grant, also after all
  keys expired or the server restarted (as long as the server clock does not step back
  by more than one lease). ``hold.fencing_token`` is that integer.
- Errors. Any ``redis.exceptions.RedisError`` (connection refused, timeout, a reply of
  the wrong kind) becomes :class:`~lanequeue.LaneBackendError`, chained. An acquire that
  raises it holds nothing: the waiter leaves its line (and passes on a grant made to it
  meanwhile) through a withdraw sent in the background, which lands once the server
  answers again (a cut connection, a paused server); if it cannot, the line entry dies
  with its liveness, and a grant whose reply was lost is never renewed and lapses with
  its lease. A release that
  raises it stops renewing, so the hold lapses within ``lease_s``. Scripts are idempotent
  per owner id, so redis-py retrying a call whose reply was lost is harmless (except that
  a retried release may then report LeaseLostError, as the script cannot tell its own
  earlier release from a lease that ran out). After a restart without persistence,
  or a FLUSHALL, all holds are gone: a newcomer can be granted at once, and the old
  holders learn it at their next renewal (within ``lease_s/3``). That window is a limit
  of any lock kept in Redis: protect the resource with the fencing token (the newcomer's
  is larger), and see the README on persistence.

Why each interleaving is safe, in one place: (1) all state of K changes only inside
scripts, which Redis runs one at a time; (2) a grant happens only when the holder key is
absent (released, or its lease ran out on the server clock) and only to the head of the
live line, or to the caller when the line holds no live waiter; (3) a release, renewal or
confirm names an owner id drawn for one acquisition, so it acts only on that acquisition's
hold; (4) a holder's deadline is conservative (counted from before the request was sent)
and read from its own clock, so ``hold.lost`` is True no later than the server can grant
the key to anyone else, whatever the I/O does; a process that is itself frozen cannot act
on it, and then fencing tokens protect the data (NOTES §4); (5) a takeover by presence
needs the holder's presence channel empty for 2 s of server time, and the holder's hold
reads lost within 1 s of the last moment that channel was known present (see Failover).

Caveats: all clients of one lane must use the same ``prefix`` and name. Clients of a
counting lane that disagree on ``max_concurrent`` (a rolling deploy) are safe ("mixed
caps"): the lane keeps the smallest cap in use (key ``Bm``) and admits no more than that.
Every script call of a client with that smallest cap (an acquire, each poll of its
waiters, each renewal of its holds, a release) keeps it in force for that client's
``lease_s`` more; so a larger cap applies ``lease_s`` (the smaller-cap client's) after
that client's last call, i.e. one lease after it released its last hold or stopped
waiting (while it holds or waits, its renewals and polls keep the smaller cap).
``lane_status()`` reports the cap in force as ``max_concurrent`` and its ``available``
permits under it; ``lease_s`` may differ per process. The plain views (``active_count``,
``available``, ``waiting``, ``get_active()``, ``stats``, ``status()``, and a per-key lane's
``session_count``) describe THIS lane object, as on every face (see
:mod:`lanequeue.contract`): a lane-wide count of a per-key lane would need a scan of the
keyspace. The lane-wide views ask Redis: ``is_held(key)`` and ``waiting_for(key)`` on a
per-key lane, ``holds_of(key)`` and ``lane_status()`` (holds, live waiters, free permits,
keys) on a counting lane. On the asyncio lanes every call that needs Redis is a coroutine
(``try_acquire``, ``acquire_timeout``, ``manual_release``, ``hold.release()``,
``is_held``, ``waiting_for``, ``holds_of``, ``lane_status``), as on every asyncio lane.

Operations (:mod:`._ops`, over :class:`lanequeue._ops.LaneOps`, as on the in-process
lanes) act on THIS lane object's waiters and holds: ``drain``, ``wait_idle`` (coroutines
on the asyncio lanes), ``clear(key)``, ``close()``, ``draining``, ``stuck(older_than_s)``
(with fencing tokens), ``warn_after_s``/``on_wait``/``warn_hold_s``,
``metrics_snapshot()`` (``scope="process"``; plus ``scope="lane"`` on :class:`RedisLane`
from ``lane_status()``) and ``track_holds()``; ``leases_lost`` counts lost leases. A
cleared or drained waiter leaves the Redis line at once through the same clean-up as an
interrupted one; other processes' waiters keep their place. ``lanequeue status
--backend redis://...`` shows every lane of a Redis (:mod:`._status`: SCAN and reads).

:class:`RedisBackend` holds a client with the ``prefix``, ``lease_s`` and
``on_lease_lost`` its lanes share and makes them by name, so a queue builds them like its
in-process lanes: ``queue.add_lane("global", max_concurrent=8, backend=backend)``.
"""

from __future__ import annotations

from .._errors import install_hint

try:
    import redis as _redis_py  # noqa: F401
except ImportError as exc:  # pragma: no cover - exercised only without the extra
    raise ImportError(
        f"lanequeue.redis needs redis-py: {install_hint('redis')}"
    ) from exc

from ._async import AsyncRedisHold, AsyncRedisLane, AsyncRedisSessionLane
from ._backend import RedisBackend
from ._protocol import DEFAULT_LEASE_S, DEFAULT_PREFIX, RedisHoldBase
from ._sync import RedisHold, RedisLane, RedisSessionLane

__all__ = [
    "DEFAULT_LEASE_S",
    "DEFAULT_PREFIX",
    "AsyncRedisHold",
    "AsyncRedisLane",
    "AsyncRedisSessionLane",
    "RedisBackend",
    "RedisHold",
    "RedisHoldBase",
    "RedisLane",
    "RedisSessionLane",
]
