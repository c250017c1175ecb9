"""A read-only picture of every lane in one Redis: what ``lanequeue status`` shows.

One job: find the lanes' keys with SCAN (never KEYS: it blocks the server for the whole
keyspace), read them (GET, PTTL, LRANGE, ZRANGE, HGETALL, TIME; nothing that writes) and
describe each lane: its kind, its holders (key, fencing token, lease left), its line per
key (live waiters) and its oldest wait. Keys follow the layout of :mod:`._keys`
(``{lq2:len(P):P:<kind>:len(N):N[:K]}:<suffix>``, kind ``s`` per-key or ``c`` counting)
and the lanes' version markers ``{lq:len(P):P:<kind>:len(N):N}:v``.

The oldest wait is measured from the server time each waiter joined the line, which the
acquire script records when it joins (hash ``Bj``, see :mod:`lanequeue.redis`): a waiter
that joined before the reader started shows its true wait at the first look. A waiter
without a join record (it joined under a client that did not record one) counts from
when this reader first saw it (a lower bound; 0 at the first look).

Whether each holder's process is still there (``present``) comes from the hold's
presence record (see :mod:`._presence` and the scripts in :mod:`._scripts`): on a
per-key lane the string ``<base>p``, ``"owner|channel|absent since"`` (it describes the
holder only when its owner is the holder key's owner), on a counting lane the hash
``<base>p``, hold id -> ``"channel|absent since"``. ``PUBSUB NUMSUB <channel>`` (one
call for every holder of a read, never a write) says whether the process's presence
connection is still subscribed: it drops at once when the process dies (its socket
closed), and a waiter ends such a hold once the channel has stayed empty for
:data:`._presence.GRACE_S`. Unknown (None) for a hold with no presence record (granted
without a presence connection, on Redis Cluster, by an older client) and for every hold
when the server refuses ``PUBSUB NUMSUB`` (a Redis user allowed only to read, SCAN and
TIME): the document's ``presence_unknown`` then says why, once.
"""

from __future__ import annotations

import re
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from redis.exceptions import (
    AuthenticationError,
    AuthorizationError,
    ClusterDownError,
    ResponseError,
    TryAgainError,
)
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

from .._errors import counted, install_hint, redact_url, told
from ._keys import LAYOUT, base, version_key

__all__ = ["StatusReader", "parse_lane_key"]

_KIND = {"s": "session", "c": "counting"}
_SUFFIX = re.compile(r"[a-z](:[0-9a-f]+)?\Z")
_GLOB = re.compile(r"([*?\[\]\\])")
#: A holder's ``present`` as the table's "process" column shows it.
_PROCESS = {True: "live", False: "gone", None: "?"}
#: Channels per ``PUBSUB NUMSUB`` call (its reply holds two items per channel).
_NUMSUB_BATCH = 500
#: Seconds ``lanequeue status`` waits for Redis to connect, and to answer one command,
#: unless the ``--backend`` URL sets ``socket_connect_timeout`` / ``socket_timeout``:
#: a frozen or unreachable server fails the read instead of holding it without a bound
#: (redis-py's own default depends on its version, and was no bound at all).
READ_TIMEOUT_S = 5.0
#: The errors of a read that ``lanequeue status --watch`` shows in place of the table
#: and retries at its interval, as they pass with time: the server unreachable or refusing
#: connections (restarting), not answering in time (frozen, overloaded), loading its
#: data set (``LOADING``, a BusyLoadingError, which is a ConnectionError), a replica cut
#: from its master (``MASTERDOWN``) or a cluster not serving (``CLUSTERDOWN``,
#: ``TRYAGAIN``). Except the :data:`_LASTING` ones.
_PASSING: tuple[type[Exception], ...] = (
    RedisConnectionError, RedisTimeoutError, ClusterDownError, TryAgainError)
#: ConnectionErrors that retrying cannot heal (the password or user refused, a
#: certificate not authorized): they end ``--watch`` at once, as every error not in
#: :data:`_PASSING` does (a command the Redis user may not run, a bad database number).
_LASTING: tuple[type[Exception], ...] = (AuthenticationError, AuthorizationError)


@dataclass(frozen=True)
class LaneKey:
    """One Redis key of a lane, parsed: ``layout`` (``lq2``; ``lq`` for a version
    marker), ``prefix``, ``kind`` (``s`` or ``c``), ``name``, ``key`` (the lane key of a
    per-key lane, else None) and ``suffix`` (``h``, ``q``, ``w``, ``f``, ``i``, ``m``,
    ``v``, ``x:<id>``)."""

    layout: str
    prefix: str
    kind: str
    name: str
    key: str | None
    suffix: str


def _take_len(s: str, at: int) -> tuple[str, int] | None:
    """At ``s[at:]``: ``<n>:<n chars>``; (the chars, index after them) or None."""
    colon = s.find(":", at)
    if colon <= at or not s[at:colon].isdigit():
        return None
    n = int(s[at:colon])
    end = colon + 1 + n
    if end > len(s):
        return None
    return s[colon + 1:end], end


def parse_lane_key(raw: str) -> LaneKey | None:
    """Parse a Redis key of a lane (see the module docstring); None if it is not one."""
    if raw.startswith("{" + LAYOUT + ":"):
        layout = LAYOUT
    elif raw.startswith("{lq:"):
        layout = "lq"
    else:
        return None
    got = _take_len(raw, len(layout) + 2)
    if got is None:
        return None
    prefix, at = got
    if raw[at:at + 1] != ":" or raw[at + 1:at + 2] not in _KIND or raw[at + 2:at + 3] != ":":
        return None
    kind = raw[at + 1]
    got = _take_len(raw, at + 3)
    if got is None:
        return None
    name, at = got
    # The suffix never contains "}", so the key (which may) ends at the last "}:".
    close = raw.rfind("}:")
    if close < at:
        return None
    suffix = raw[close + 2:]
    if not _SUFFIX.match(suffix):
        return None
    if close == at:
        key = None
    elif raw[at] == ":" and kind == "s" and layout == LAYOUT:
        key = raw[at + 1:close]
    else:
        return None
    return LaneKey(layout, prefix, kind, name, key, suffix)


def _text(v: Any) -> str:
    return v.decode("utf-8", "replace") if isinstance(v, bytes) else str(v)


def _joins(raw: dict[Any, Any]) -> dict[str, int]:
    """A join hash (``Bj``: waiter id -> server time in ms) as {id: ms}."""
    out: dict[str, int] = {}
    for k, v in raw.items():
        t = _text(v)
        if t.isdigit():
            out[_text(k)] = int(t)
    return out


def _channel(record: str) -> str | None:
    """The channel of a presence record's ``"channel|absent since"`` tail, or None."""
    channel, bar, since = record.rpartition("|")
    return channel if bar and channel and since.isdigit() else None


def _numsub_pairs(reply: Any) -> list[tuple[str, int]]:
    """``PUBSUB NUMSUB``'s reply, however redis-py shaped it (pairs, a flat list, a
    dict), as (channel, subscribers) pairs."""
    if isinstance(reply, dict):
        items: list[Any] = list(reply.items())
    elif reply and not isinstance(reply[0], (list, tuple)):
        items = list(zip(reply[0::2], reply[1::2], strict=False))
    else:
        items = list(reply or [])
    return [(_text(c), int(n)) for c, n in items]


@dataclass
class _Lane:
    prefix: str
    kind: str
    name: str
    keys: set[str | None] = field(default_factory=set)
    versions: set[str] = field(default_factory=set)


class StatusReader:
    """Reads the lanes of one Redis (a ``redis.Redis`` client) with SCAN and plain reads.

    ``prefix``: only the lanes of that prefix (None: every prefix). :meth:`read` returns
    one JSON-ready document per call; the reader remembers when it first saw each waiter
    without a join record (for ``oldest_wait_s``). Not thread-safe. Raises redis-py's
    errors as they come.

    Example::

        reader = StatusReader(redis.Redis(), prefix="lanequeue")
        doc = reader.read()
        doc["keys_seen"], [lane["name"] for lane in doc["lanes"]]

    Besides plain reads it sends ``PUBSUB NUMSUB`` (for ``present``); a server that
    refuses it (NOPERM, or renamed away) leaves ``present`` unknown, never an error.
    """

    def __init__(self, client: Any, prefix: str | None = None, *, count: int = 1000) -> None:
        self.client = client
        self.prefix = prefix
        self.count = count
        self._first_seen: dict[tuple[str, str, str, str], int] = {}

    def _patterns(self) -> list[str]:
        if self.prefix is None:
            return ["{lq*"]
        p = _GLOB.sub(r"\\\1", self.prefix)
        return [f"{{{LAYOUT}:{len(self.prefix)}:{p}:*", f"{{lq:{len(self.prefix)}:{p}:*"]

    def read(self) -> dict[str, Any]:
        """One picture: ``keys_seen`` (keys SCAN returned), ``server_time_ms``,
        ``prefix`` and ``lanes`` (sorted by prefix, name, kind), each with ``prefix``,
        ``name``, ``kind`` (``session``/``counting``), ``versions`` (protocol versions
        with a live marker), ``holders`` (``key``, ``token``, ``lease_left_s``,
        ``present``: whether the holder's process is still there, True / False / None
        when unknown, see the module docstring; a counting lane adds ``held_s``),
        ``lines`` (key -> live waiters in line),
        ``waiting`` (their sum), ``oldest_wait_s`` (see the module docstring), and on a
        counting lane ``max_concurrent`` (the cap in use, when known). A lane whose keys
        hold data of another type (not written by lanequeue) has ``error`` (the server's
        message) instead of the holders and lines. ``presence_unknown``: None, or why
        no holder's presence could be asked (the server refused ``PUBSUB NUMSUB``)."""
        lanes: dict[tuple[str, str, str], _Lane] = {}
        seen = 0
        for pattern in self._patterns():
            for raw in self.client.scan_iter(match=pattern, count=self.count):
                seen += 1
                parsed = parse_lane_key(_text(raw))
                if parsed is None:
                    continue
                if self.prefix is not None and parsed.prefix != self.prefix:
                    continue
                ident = (parsed.prefix, parsed.kind, parsed.name)
                lane = lanes.get(ident)
                if lane is None:
                    lane = lanes[ident] = _Lane(*ident)
                if parsed.layout == LAYOUT:
                    lane.keys.add(parsed.key)
                else:
                    lane.versions.add(parsed.suffix)
        sec, usec = self.client.time()
        now_ms = int(sec) * 1000 + int(usec) // 1000
        out = []
        alive: set[tuple[str, str, str, str]] = set()
        probes: list[tuple[dict[str, Any], str]] = []
        for ident in sorted(lanes):
            lane = lanes[ident]
            try:
                doc = self._read_lane(lane, now_ms, alive, probes)
            except ResponseError as exc:
                # Foreign data under a lane's key names (WRONGTYPE): this lane only is
                # unreadable; the others are shown.
                doc = {"prefix": lane.prefix, "name": lane.name, "kind": _KIND[lane.kind],
                       "error": str(exc)}
            out.append(doc)
        for gone in set(self._first_seen) - alive:
            del self._first_seen[gone]
        return {
            "prefix": self.prefix,
            "keys_seen": seen,
            "server_time_ms": now_ms,
            "presence_unknown": self._presence(probes),
            "lanes": out,
        }

    def _presence(self, probes: list[tuple[dict[str, Any], str]]) -> str | None:
        """Set ``present`` of each probed holder (holder, its presence channel) from
        ``PUBSUB NUMSUB``; None, or why it stays unknown (the server refused the
        command: the Redis user may not run it, or it was renamed away)."""
        channels = sorted({c for _, c in probes})
        counts: dict[str, int] = {}
        try:
            for at in range(0, len(channels), _NUMSUB_BATCH):
                counts.update(_numsub_pairs(
                    self.client.pubsub_numsub(*channels[at:at + _NUMSUB_BATCH])))
        except ResponseError as exc:
            return f"PUBSUB NUMSUB refused: {told(exc)}"
        for holder, channel in probes:
            if channel in counts:
                holder["present"] = counts[channel] > 0
        return None

    def _versions(self, lane: _Lane) -> list[str]:
        if not lane.versions:
            return []
        v = self.client.get(version_key(lane.prefix, lane.kind, lane.name))
        return [] if v is None else [_text(v)]

    def _base(self, lane: _Lane, key: str | None) -> str:
        return base(lane.prefix, lane.kind, lane.name, key)

    def _read_lane(self, lane: _Lane, now_ms: int, alive: set[tuple[str, str, str, str]],
                   probes: list[tuple[dict[str, Any], str]]) -> dict[str, Any]:
        """One lane's document (see :meth:`read`); appends (holder, presence channel)
        to ``probes`` for each holder with a presence record."""
        holders: list[dict[str, Any]] = []
        lines: dict[str, int] = {}
        waiters: list[tuple[str, str]] = []  # (waiter id, key) of live waiters in line
        joined: dict[str, int] = {}  # waiter id -> server time it joined (ms)
        doc: dict[str, Any] = {
            "prefix": lane.prefix,
            "name": lane.name,
            "kind": _KIND[lane.kind],
            "versions": self._versions(lane),
        }
        if lane.kind == "s":
            for key in sorted(k for k in lane.keys if k is not None):
                b = self._base(lane, key)
                pipe = self.client.pipeline(transaction=False)
                pipe.get(b + "h")
                pipe.pttl(b + "h")
                pipe.lrange(b + "q", 0, -1)
                pipe.zrange(b + "w", 0, -1, withscores=True)
                pipe.hgetall(b + "j")
                pipe.get(b + "p")
                holder, pttl, line, live, joins, record = pipe.execute()
                if holder is not None:
                    parts = _text(holder).split(":")
                    token = int(parts[1]) if len(parts) > 1 and parts[1].isdigit() else 0
                    held = {
                        "key": key,
                        "token": token,
                        "lease_left_s": max(0, int(pttl)) / 1000.0,
                        "present": None,
                    }
                    holders.append(held)
                    # "owner|channel|absent since": the holder's only if the owner is.
                    owner, bar, rest = ("" if record is None else _text(record)).partition("|")
                    channel = _channel(rest) if bar and owner == parts[0] else None
                    if channel is not None:
                        probes.append((held, channel))
                deadlines = {_text(m): s for m, s in live}
                joined.update(_joins(joins))
                for wid in map(_text, line):
                    if deadlines.get(wid, 0) > now_ms:
                        waiters.append((wid, key))
        else:
            b = self._base(lane, None)
            pipe = self.client.pipeline(transaction=False)
            pipe.zrange(b + "h", 0, -1, withscores=True)
            pipe.hgetall(b + "i")
            pipe.lrange(b + "q", 0, -1)
            pipe.zrange(b + "w", 0, -1, withscores=True)
            pipe.get(b + "m")
            pipe.hgetall(b + "j")
            pipe.hgetall(b + "p")
            holds, info, line, live, cap, joins, records = pipe.execute()
            joined.update(_joins(joins))
            infos = {_text(k): _text(v) for k, v in info.items()}
            channels = {_text(k): _channel(_text(v)) for k, v in records.items()}
            for hid, deadline in holds:
                hid = _text(hid)
                if deadline <= now_ms or hid not in infos:
                    continue  # lapsed: the next script purges it
                fence, since, key = infos[hid].split(":", 2)
                held = {
                    "key": key,
                    "token": int(fence),
                    "lease_left_s": (deadline - now_ms) / 1000.0,
                    "present": None,
                    "held_s": max(0, now_ms - int(since)) / 1000.0,
                }
                holders.append(held)
                channel = channels.get(hid)
                if channel is not None:
                    probes.append((held, channel))
            deadlines = {_text(m): s for m, s in live}
            for item in map(_text, line):
                wid, _, key = item.partition(":")
                if deadlines.get(wid, 0) > now_ms:
                    waiters.append((wid, key))
            doc["max_concurrent"] = None if cap is None else int(cap)
        holders.sort(key=lambda h: (h["key"], h["token"]))
        oldest = now_ms
        for wid, key in waiters:
            lines[key] = lines.get(key, 0) + 1
            ident = (lane.prefix, lane.kind, lane.name, wid)
            alive.add(ident)
            first = joined.get(wid)
            if first is None:
                first = self._first_seen.setdefault(ident, now_ms)
            oldest = min(oldest, first)
        doc.update(
            holders=holders,
            lines=dict(sorted(lines.items())),
            waiting=len(waiters),
            oldest_wait_s=(now_ms - oldest) / 1000.0,
        )
        return doc



def shown(value: str) -> str:
    """``value`` (a key, lane name or prefix read from Redis) as the table shows it: as
    is when every character is printable, else its Python ``repr`` (quoted, control
    characters as escapes such as ``\\n`` or ``\\x1b``), so that no value can move the
    cursor, colour the terminal or split a row. The table puts it in a ``rich.text.Text``,
    never parsed as markup."""
    return value if value.isprintable() else repr(value)


def render(doc: dict[str, Any]) -> Any:
    """A rich renderable (a table per lane, and a header) of a :meth:`StatusReader.read`
    document. Every value read from Redis (prefixes, lane names, keys) is shown
    literally: never parsed as rich markup, non-printable characters as escapes (see
    :func:`shown`). Needs rich (extra ``[cli]``); ImportError without it."""
    from rich.console import Group
    from rich.table import Table
    from rich.text import Text

    parts: list[Any] = [Text(
        f"{counted(len(doc['lanes']), 'lane')}, {counted(doc['keys_seen'], 'key')} seen (SCAN)"
        + (f", prefix {doc['prefix']!r}" if doc["prefix"] is not None else "")
    )]
    why = doc.get("presence_unknown")
    if why is not None:
        parts.append(Text(f"process: ? for every holder ({shown(why)}; allow the "
                          "Redis user +pubsub|numsub to see live or gone)"))
    for lane in doc["lanes"]:
        if "error" in lane:
            parts.append(Text(f"{shown(lane['prefix'])}/{shown(lane['name'])} "
                              f"({lane['kind']}): unreadable: {shown(lane['error'])}"))
            continue
        cap = lane.get("max_concurrent")
        # The lane's heading is a line of its own, not the table's title: rich wraps a
        # title to the table's width, which is often narrower than the heading.
        parts.append(Text(f"{shown(lane['prefix'])}/{shown(lane['name'])} ({lane['kind']}"
                          + (f", max {cap}" if cap is not None else "")
                          + f") holders {len(lane['holders'])}, waiting {lane['waiting']}, "
                          f"oldest wait {lane['oldest_wait_s']:.1f} s"))
        table = Table()
        # A cell wider than its column (on a terminal narrower than the table, or
        # COLUMNS) is folded over several lines, never cut: every character is shown.
        table.add_column("key", overflow="fold")
        table.add_column("fencing token", justify="right", overflow="fold")
        table.add_column("lease left (s)", justify="right", overflow="fold")
        # (a per-key lane's holder records no start in Redis: no such column there)
        timed = lane["kind"] == "counting"
        if timed:
            table.add_column("held (s)", justify="right", overflow="fold")
        # Whether the holder's process is still there (see StatusReader.read).
        table.add_column("process", overflow="fold")
        table.add_column("in line", justify="right", overflow="fold")
        keys = sorted({h["key"] for h in lane["holders"]} | set(lane["lines"]))
        for key in keys:
            mine = [h for h in lane["holders"] if h["key"] == key] or [None]
            for h in mine:
                cells: list[Any] = [
                    Text(shown(key)),
                    "-" if h is None else str(h["token"]),
                    "-" if h is None else f"{h['lease_left_s']:.1f}",
                ]
                if timed:
                    cells.append("-" if h is None else f"{h['held_s']:.1f}")
                cells.append("-" if h is None else _PROCESS[h.get("present")])
                cells.append(str(lane["lines"].get(key, 0)))
                table.add_row(*cells)
        parts.append(table)
    return Group(*parts)


def unbounded(out: Any, environ: Any = None) -> bool:
    """Whether the table written to ``out`` has no width to fit: ``out`` is not a
    terminal (a pipe, a file) and ``COLUMNS`` does not name a width. Rich would lay such
    output out for the width of whatever terminal the process has elsewhere (or 80
    columns), folding long headings and cutting long keys; a pipe has no width, so each
    line is as long as its data (see :func:`fit`). On a terminal, or with ``COLUMNS`` set
    to a number, rich's own width is used (the terminal's, or ``COLUMNS``, as rich
    documents)."""
    import os

    columns = (os.environ if environ is None else environ).get("COLUMNS", "")
    if columns.isdigit() and int(columns) > 0:  # (0 would print nothing)
        return False
    try:
        terminal = bool(out.isatty())
    except (AttributeError, OSError, ValueError):  # no isatty, or a closed file
        terminal = False
    return not terminal


def fit(console: Any, renderable: Any) -> Any:
    """Set the width of ``console`` (a rich console with no width of its own to fit:
    see :func:`unbounded`) to what ``renderable`` needs to show every line whole: the
    longest heading, the widest table with each cell on one line. Returns
    ``renderable``."""
    from rich.measure import Measurement

    options = console.options.update_width(sys.maxsize)
    console.width = max(1, Measurement.get(console, options, renderable).maximum)
    return renderable


def redraws_in_place(console: Any) -> bool:
    """Whether rich's live display can redraw on ``console``: a terminal that is not a
    dumb one. Elsewhere (a pipe, a file, ``TERM=dumb``) the live display would write
    nothing until it stops, so ``--watch`` prints each frame after the last instead."""
    return bool(console.is_terminal and not console.is_dumb_terminal)


def passing(exc: BaseException) -> bool:
    """Whether ``lanequeue status --watch`` retries a read that failed with ``exc``
    (see :data:`_PASSING`), showing :func:`failure` in place of the table, rather
    than exiting with status 2."""
    return isinstance(exc, _PASSING) and not isinstance(exc, _LASTING)


def failure(backend: str, exc: BaseException, at: str, interval: float,
            failed: int = 1, since: str | None = None) -> Any:
    """What ``--watch`` shows in place of the table when the read at ``at`` (a local
    ``HH:MM:SS``) failed with ``exc`` (see :func:`passing`): the URL, the time and the
    error, then that it retries every ``interval`` seconds, and, from the second failed
    read of a run (``failed`` reads, the first at ``since``), since when. A rich
    ``Text``, never parsed as markup, the URL and the error shown as :func:`shown`
    does. Needs rich."""
    from rich.text import Text

    retrying = f"retrying every {interval:g} s"
    if failed > 1:
        retrying += f"; {counted(failed, 'read')} failed since {since}"
    return Text(f"reading {shown(backend)} failed at {at}: {shown(told(exc))}\n{retrying}")


def _nap(seconds: float) -> None:
    """The wait of ``--watch`` between two reads."""
    time.sleep(seconds)


def _quiet_stdout(out: Any) -> None:
    """The reader of ``out`` went away (``lanequeue status --json | head -1``): point
    its file descriptor at /dev/null so that the interpreter's flush at exit writes
    nowhere instead of printing a BrokenPipeError: the command ends quietly with exit
    status 1, as rich's table does on its own (and as Python's documentation advises)."""
    import os

    try:
        fd = out.fileno()
    except (AttributeError, OSError, ValueError):
        return
    devnull = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(devnull, fd)
    finally:
        os.close(devnull)


def run_status(args: Any, out: Any, err: Any) -> int:
    """``lanequeue status`` (see :mod:`lanequeue.cli`) with ``args`` as its parser
    checked them (``--interval`` in range, with ``--watch`` only; not ``--json`` with
    ``--watch``): 0 on success, 1 (quietly) when the reader of the output went away (a
    closed pipe), 2 for a bad ``--backend`` URL, a missing rich, or a Redis that cannot
    be read; 130 when interrupted. With ``--watch`` a read that fails with an error
    that passes (see :func:`passing`: unreachable, refused, not answering in time,
    loading) does not end the command: :func:`failure` is shown in place of the
    table, the read is made again every ``--interval`` seconds, and the table comes
    back once Redis answers; any other error (a wrong password, a command the user may
    not run) exits with status 2 at whichever read meets it, as without ``--watch``.
    A watch ends only when interrupted (130), its output pipe closed (1) or such an
    error (2)."""
    import json

    import redis

    if not args.json:
        try:
            import rich  # noqa: F401
        except ImportError:
            print(f"lanequeue status: the table needs rich: {install_hint('cli')} "
                  "(or use --json)", file=err)
            return 2
    try:
        # (the URL's own socket_timeout / socket_connect_timeout, if any, win)
        client = redis.Redis.from_url(args.backend, socket_timeout=READ_TIMEOUT_S,
                                      socket_connect_timeout=READ_TIMEOUT_S)
    except ValueError as exc:
        print(f"lanequeue status: bad --backend {redact_url(args.backend)!r}: {exc}",
              file=err)
        return 2
    reader = StatusReader(client, args.prefix)
    try:
        if args.json:
            print(json.dumps(reader.read(), indent=2), file=out)
            out.flush()
            return 0
        from rich.console import Console
        from rich.live import Live

        console = Console(file=out)
        wide = unbounded(out)

        def fitted(shown: Any) -> Any:
            return fit(console, shown) if wide else shown

        def frame() -> Any:
            return fitted(render(reader.read()))

        if not args.watch:
            console.print(frame())
            out.flush()
            return 0
        watched = _watched(frame, redact_url(args.backend), args.interval, fitted)
        if not redraws_in_place(console):
            # Each frame as it is made, flushed, a blank line between two: what a
            # reader of the pipe (``| tee log``) sees at once, one after another.
            console.print(watched())
            out.flush()
            while True:
                _nap(args.interval)
                shown = watched()
                console.print()
                console.print(shown)
                out.flush()
        with Live(watched(), console=console, auto_refresh=False) as live:
            while True:
                _nap(args.interval)
                live.update(watched(), refresh=True)
    except BrokenPipeError:  # the reader of the output went away (``| head -1``)
        _quiet_stdout(out)
        return 1
    except redis.RedisError as exc:
        print(f"lanequeue status: reading {redact_url(args.backend)}: {told(exc)}",
              file=err)
        return 2
    except KeyboardInterrupt:
        return 130
    finally:
        client.close()


def _watched(frame: Callable[[], Any], backend: str, interval: float,
             fitted: Callable[[Any], Any]) -> Callable[[], Any]:
    """The frames of ``--watch``: ``frame()`` (the table of one read), or when that
    read fails with an error that passes (:func:`passing`), :func:`failure` in its
    place (through ``fitted``); any other error is raised."""
    failed = 0  # reads failed since the last table
    since = ""  # the local time of the first of them

    def watched() -> Any:
        nonlocal failed, since
        try:
            shown = frame()
        except _PASSING as exc:
            if not passing(exc):
                raise
            at = time.strftime("%H:%M:%S")
            failed += 1
            if failed == 1:
                since = at
            return fitted(failure(backend, exc, at, interval, failed, since))
        failed = 0
        return shown

    return watched
