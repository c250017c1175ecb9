"""Reading request traces: the Mooncake conversation-trace format and a generic format.

Mooncake (the bundled trace): one JSON object per line
with the fields ``timestamp`` (arrival, milliseconds from the start of the trace),
``input_length`` and ``output_length`` (tokens) and ``hash_ids`` (prefix-block ids;
``hash_ids[1]`` identifies the conversation, see ``lanequeue/data/README.md``).

Generic (what an operator exports from gateway logs): JSON lines, or CSV with a header
line, with the fields

- ``timestamp``: arrival, in seconds (any origin, e.g. Unix time) or as an ISO 8601 date and
  time (``2025-01-31T09:00:00.250Z``; without a UTC offset it is taken as UTC);
- ``key``: the conversation (any string, or an integer in JSON);
- ``duration_s``: service time in seconds, from the start of work to its end (not the
  end-to-end latency, which includes the queueing), or ``output_tokens``, an integer that
  the planner multiplies by a time per output token. When a line has both, ``duration_s``
  is used; an empty CSV cell or a JSON ``null`` counts as absent.

Numbers written as text (every CSV cell, and JSON strings) are ASCII decimal notation
only: an optional sign, digits with an optional ``.`` fraction, an optional exponent
(``1700000000.25``, ``2.5e-1``). What Python's ``float()`` and ``int()`` also take is
refused: ``1_000``, ``nan``, ``inf``, digits of other scripts. ``output_tokens`` is an
integer (``12``, not ``12.0``).

The ISO 8601 forms accepted, the same on every Python version (parsed by
:func:`iso8601_us`, not by ``datetime.fromisoformat``, which accepts more on Python 3.11 and
later than on 3.10):

- a calendar date in the extended format, ``YYYY-MM-DD`` (years 0001-9999), alone (that
  day's midnight) or followed by ``T``, ``t`` or a space and a time;
- a time ``hh:mm``, ``hh:mm:ss`` or ``hh:mm:ss`` with a fraction of 1 to 9 digits after
  ``.`` or ``,`` (rounded to the microsecond): hours 00-23, minutes and seconds 00-59;
- after the time, an optional UTC offset ``Z`` (or ``z``), ``+hh:mm``, ``+hhmm`` or ``+hh``
  (or ``-``); without one the time is UTC.

Everything else is refused (the line is skipped): the basic format (``20250304T090000Z``),
week dates (``2025-W10-2``), ordinal dates (``2025-063``), ``24:00``, leap seconds
(``:60``), fractions of hours or minutes, more than 9 fraction digits.

Generic times are read to the microsecond and made relative to the earliest arrival. With
``trace_format="auto"`` (what ``lanequeue replay`` and ``lanequeue plan`` use) the format is
told from the content. The trace is CSV (generic) when its first non-blank line does not
start with ``{`` and holds a comma (a header) and none of its first 5 non-blank lines
(:data:`DETECT_LINES`) is a JSON object; else it is JSON lines, so that a first line cut
short by a log rotation (a fragment of JSON, commas and all) is one malformed line, not a
header. JSON lines are Mooncake or generic as the first JSON object with ``hash_ids`` or
with ``key`` says; lines that tell neither are passed over, and with no such line the trace
is read as Mooncake, so its bad lines are reported one by one. With
``trace_format="generic"`` CSV and JSON lines are told apart the same way.

Text from the trace that is printed (conversation keys, refused values in a skipped line's
reason) is escaped and cut short (:func:`printable`), so a key holding a newline or 200 kB
prints as one short line.

A line that is blank, is not valid JSON (or CSV), or lacks a field (or holds one of the
wrong type or out of range) is not fatal here: it is skipped and listed in ``Trace.skipped``
with its 1-based line number and reason, so one bad line in a production dump does not stop
a replay. The lines other than blank ones are ``Trace.malformed``: ``lanequeue replay`` and
``lanequeue plan`` refuse a trace with more of them than ``--max-bad-lines`` allows (1% of
the request lines by default), rather than replay or plan from a fraction of the traffic.
A gzip file cut short (copied while it was written) keeps its whole lines; where it ends
is one more malformed line (:data:`GZIP_CUT`). A gzip stream that is not gzip data, or
corrupt inside, cannot be read (``TraceError``).
"""

from __future__ import annotations

import csv
import dataclasses
import gzip
import itertools
import json
import re
import zlib
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from datetime import date
from fractions import Fraction
from importlib import resources
from pathlib import Path
from typing import IO

from lanequeue.replay._checks import SettingError, check_tpot_ms, decimal_text

__all__ = [
    "DEFAULT_TPOT_MS",
    "DEFAULT_TRACE_NAME",
    "GENERIC_FIELDS",
    "REQUIRED_FIELDS",
    "TRACE_FORMATS",
    "SkippedLine",
    "Trace",
    "TraceError",
    "TraceRequest",
    "default_trace_source",
    "iso8601_us",
    "parse_trace_lines",
    "printable",
    "read_trace",
    "service_times_us",
]

#: Work per output token of a Mooncake trace when none is given, milliseconds.
DEFAULT_TPOT_MS = 30.0
#: File name of the bundled trace inside the ``lanequeue.data`` directory.
DEFAULT_TRACE_NAME = "mooncake_conversation_trace.jsonl.gz"

#: Fields every line must carry.
REQUIRED_FIELDS = ("timestamp", "input_length", "output_length", "hash_ids")
#: Bounds that keep a replay's times finite and representable: about a year of trace
#: time, and far more tokens than any model generates for one request.
MAX_TIMESTAMP_MS = 3.2e10
MAX_LENGTH_TOKENS = 10_000_000
#: Generic format: fields every line must carry, and the work fields (one is needed).
GENERIC_FIELDS = ("timestamp", "key")
GENERIC_WORK_FIELDS = ("duration_s", "output_tokens")
#: Generic format: largest absolute timestamp in seconds (beyond the year 5000) and longest
#: service time (about a year, the same bound as a Mooncake timestamp).
MAX_GENERIC_TIMESTAMP_S = 1e11
MAX_DURATION_S = MAX_TIMESTAMP_MS / 1000
#: Values of ``trace_format`` accepted by :func:`parse_trace_lines` and :func:`read_trace`.
TRACE_FORMATS = ("mooncake", "generic", "auto")
#: Non-blank lines looked at to tell CSV from JSON lines: a first line that looks like a
#: CSV header is one only when none of the first ``DETECT_LINES`` is a JSON object;
#: otherwise it is a line of JSON cut short (by a log rotation), malformed like any other.
DETECT_LINES = 5

#: Printed conversation keys are cut to this many characters; a trace's name to
#: ``MAX_SOURCE_CHARS``; a refused value quoted in a skipped line's reason to
#: ``MAX_VALUE_CHARS``.
MAX_KEY_CHARS = 60
MAX_SOURCE_CHARS = 200
MAX_VALUE_CHARS = 80

_EPOCH_DAY = date(1970, 1, 1).toordinal()
_US_PER_S = 1_000_000
# Integers in text (see decimal_text for other numbers): ASCII digits only.
_INTEGER = re.compile(r"[+-]?[0-9]{1,20}")
# The accepted ISO 8601 forms (see the module docstring), parsed here rather than by
# datetime.fromisoformat, whose accepted set differs between Python versions.
_ISO_8601 = re.compile(
    r"(?P<year>[0-9]{4})-(?P<month>[0-9]{2})-(?P<day>[0-9]{2})"
    r"(?:[Tt ](?P<hour>[0-9]{2}):(?P<minute>[0-9]{2})"
    r"(?::(?P<second>[0-9]{2})(?:[.,](?P<fraction>[0-9]{1,9}))?)?"
    r"(?P<offset>[Zz]|(?P<sign>[+-])(?P<oh>[0-9]{2})(?::?(?P<om>[0-9]{2}))?)?)?"
)

_GZIP_MAGIC = b"\x1f\x8b"


class TraceError(Exception):
    """The trace as a whole cannot be read (missing file, corrupt gzip stream)."""


@dataclass(frozen=True)
class TraceRequest:
    """One request of a trace.

    Attributes:
        index: position in arrival order, 0-based (ties in ``timestamp_ms`` keep file order).
        line: 1-based line number in the source file.
        timestamp_ms: arrival time in milliseconds from the start of the trace.
        input_length: prompt length in tokens.
        output_length: generated length in tokens; the replay's work time is proportional.
            In a generic trace: ``output_tokens``, or 0 for a line with ``duration_s``.
        conversation: the conversation id, ``hash_ids[1]``; in a generic trace, a number
            per distinct ``key`` (0, 1, ... in order of first appearance in the file).
        key: the conversation's ``key`` in a generic trace; None for Mooncake.
        duration_us: the service time (``duration_s``) of a generic line in whole
            microseconds; None when the work comes from the tokens.
    """

    index: int
    line: int
    timestamp_ms: int | float
    input_length: int
    output_length: int
    conversation: int
    key: str | None = None
    duration_us: int | None = None

    @property
    def label(self) -> str:
        """The conversation as the operator knows it: ``key``, else the conversation id."""
        return self.key if self.key is not None else str(self.conversation)


@dataclass(frozen=True)
class SkippedLine:
    """A line that was not a valid request: its 1-based ``line`` number and the ``reason``;
    ``blank`` when the line holds nothing but white space (no request is lost by passing
    over it, so it is not malformed: see :attr:`Trace.malformed`)."""

    line: int
    reason: str
    blank: bool = False


@dataclass(frozen=True)
class Trace:
    """A parsed trace: the valid requests in arrival order and the skipped lines.

    Attributes:
        requests: valid requests sorted by arrival (stable: equal timestamps keep file order),
            re-indexed so that ``requests[i].index == i``.
        skipped: the lines that were skipped, in file order.
        source: a human-readable name of where the trace came from.
        format: ``"mooncake"`` or ``"generic"``.
    """

    requests: tuple[TraceRequest, ...]
    skipped: tuple[SkippedLine, ...]
    source: str
    format: str = "mooncake"

    @property
    def malformed(self) -> tuple[SkippedLine, ...]:
        """The skipped lines that are not blank: lines that held something other than a
        valid request (invalid JSON or CSV, a missing field, a value of the wrong type or
        out of range), each a request of the traffic that the trace no longer gives."""
        return tuple(s for s in self.skipped if not s.blank)

    @property
    def conversations(self) -> int:
        """Number of distinct conversations among ``requests``."""
        return len({r.conversation for r in self.requests})

    def head(self, n: int | None) -> Trace:
        """The first ``n`` requests in arrival order (all when ``n`` is None); same ``skipped``."""
        if n is None or n >= len(self.requests):
            return self
        if n < 0:
            raise ValueError(f"limit must be >= 0, got {n}")
        return Trace(self.requests[:n], self.skipped, self.source, self.format)


def _is_number(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def printable(text: str, limit: int = MAX_KEY_CHARS) -> str:
    """``text`` made safe for one line of output: backslashes and non-printable characters
    (newlines, control characters, ...) escaped as in a Python string literal, and cut to
    ``limit`` characters, followed by ``...`` and the full length, when longer.

    Example::

        >>> printable("conv-22"), printable("a\\nb"), printable("x" * 100, 5)
        ('conv-22', 'a\\\\nb', 'xxxxx... (100 characters)')
    """
    shown = "".join(
        c if c.isprintable() and c != "\\" else repr(c)[1:-1] for c in text[:limit]
    )
    return shown if len(text) <= limit else f"{shown}... ({len(text):,} characters)"


def _shown(value: object) -> str:
    """A refused value for a skipped line's reason: its repr, cut to ``MAX_VALUE_CHARS``."""
    if isinstance(value, int) and value.bit_length() > 64:
        return f"an integer of about {int(value.bit_length() * 0.30103) + 1} digits"
    if isinstance(value, str) and len(value) > MAX_VALUE_CHARS:
        text = repr(value[:MAX_VALUE_CHARS])
        return f"{text}... ({len(value):,} characters)"
    text = repr(value)
    if len(text) > MAX_VALUE_CHARS:
        return f"{text[:MAX_VALUE_CHARS]}... ({len(text):,} characters)"
    return text


def _json(text: str) -> object | SkippedLine:
    """``text`` parsed as JSON, or a SkippedLine (line 0) with the reason it is not."""
    try:
        obj: object = json.loads(text)
    except json.JSONDecodeError as exc:
        return SkippedLine(0, f"invalid JSON: {exc.msg} (column {exc.colno})")
    except (ValueError, RecursionError) as exc:  # an integer too long, nesting too deep
        return SkippedLine(0, f"invalid JSON: {printable(str(exc), MAX_VALUE_CHARS)}")
    return obj


def _text_number(text: str) -> float | None:
    """A number written in ASCII decimal notation (``-1.5``, ``2e3``), else None."""
    decimal = decimal_text(text)
    return None if decimal is None else float(decimal)


def iso8601_us(text: str) -> int | None:
    """Microseconds since 1970-01-01T00:00:00Z of an ISO 8601 date and time in one of the
    accepted forms (module docstring), rounded to the microsecond; None for any other text.

    The same forms are accepted on every Python version (this does not use
    ``datetime.fromisoformat``, which accepts more since Python 3.11).

    Example::

        >>> iso8601_us("1970-01-01T00:00:01.5Z"), iso8601_us("1970-01-01 01:00:00+01:00")
        (1500000, 0)
        >>> iso8601_us("19700101T000000Z") is None
        True
    """
    m = _ISO_8601.fullmatch(text.strip())
    if m is None:
        return None
    year, month, day = int(m["year"]), int(m["month"]), int(m["day"])
    try:
        days = date(year, month, day).toordinal() - _EPOCH_DAY
    except ValueError:  # year 0, month 13, February 30, ...
        return None
    hour = int(m["hour"] or 0)
    minute = int(m["minute"] or 0)
    second = int(m["second"] or 0)
    if hour > 23 or minute > 59 or second > 59:
        return None
    us = (((days * 24 + hour) * 60 + minute) * 60 + second) * _US_PER_S
    fraction = m["fraction"]
    if fraction:
        us += round(Fraction(int(fraction) * _US_PER_S, 10 ** len(fraction)))
    if m["sign"]:
        oh, om = int(m["oh"]), int(m["om"] or 0)
        if oh > 23 or om > 59:
            return None
        us -= (1 if m["sign"] == "+" else -1) * (oh * 60 + om) * 60 * _US_PER_S
    return us


def _parse_line(text: str) -> tuple[int | float, int, int, int] | str:
    """Parse one line: ``(timestamp_ms, input_length, output_length, conversation)``.

    Returns the reason string instead when the line is not a valid request.
    """
    if not text.strip():
        return "blank line"
    obj = _json(text)
    if isinstance(obj, SkippedLine):
        return obj.reason
    if not isinstance(obj, dict):
        return f"not a JSON object (got {type(obj).__name__})"
    missing = [f for f in REQUIRED_FIELDS if f not in obj]
    if missing:
        return (
            "missing field"
            + ("s " if len(missing) > 1 else " ")
            + ", ".join(repr(f) for f in missing)
        )
    ts = obj["timestamp"]
    if not _is_number(ts) or not 0 <= ts <= MAX_TIMESTAMP_MS:  # NaN fails the range
        return (
            f"field 'timestamp' must be a number of milliseconds from 0 to "
            f"{MAX_TIMESTAMP_MS:.0e} (got {_shown(ts)})"
        )
    for name in ("input_length", "output_length"):
        value = obj[name]
        if not _is_int(value) or not 0 <= value <= MAX_LENGTH_TOKENS:
            return (
                f"field {name!r} must be an integer from 0 to {MAX_LENGTH_TOKENS:,} "
                f"(got {_shown(value)})"
            )
    hash_ids = obj["hash_ids"]
    if not isinstance(hash_ids, list):
        return f"field 'hash_ids' must be a list (got {type(hash_ids).__name__})"
    if len(hash_ids) < 2:
        return "field 'hash_ids' needs at least 2 block ids (hash_ids[1] is the conversation)"
    if not _is_int(hash_ids[1]):
        return f"field 'hash_ids' must hold integers (hash_ids[1] is {_shown(hash_ids[1])})"
    return ts, obj["input_length"], obj["output_length"], hash_ids[1]


def _decoded(lines: Iterable[str | bytes]) -> Iterator[tuple[int, str | SkippedLine]]:
    """Number the lines from 1 and decode bytes as UTF-8, dropping a byte-order mark at the
    start of the file (a line that is not valid UTF-8 comes out as its SkippedLine)."""
    for lineno, raw in enumerate(lines, start=1):
        if isinstance(raw, bytes):
            try:
                text = raw.decode("utf-8")
            except UnicodeDecodeError as exc:
                yield lineno, SkippedLine(lineno, f"not valid UTF-8 ({exc.reason})")
                continue
        else:
            text = raw
        yield lineno, text[1:] if lineno == 1 and text[:1] == "\ufeff" else text


def _detect(text: str) -> str | None:
    """What a line shows: ``"csv"`` (not a JSON object, with a comma: a CSV header if it
    is the first), ``"mooncake"`` or ``"generic"`` (a JSON object with ``hash_ids`` /
    with ``key``), ``"object"`` (a JSON object with neither), or None (nothing)."""
    stripped = text.strip()
    if not stripped:
        return None
    if not stripped.startswith("{"):
        return "csv" if "," in stripped else None
    obj = _json(stripped)
    if not isinstance(obj, dict):
        return None
    if "hash_ids" in obj:
        return "mooncake"
    if "key" in obj:
        return "generic"
    return "object"


def _sniff(
    numbered: Iterator[tuple[int, str | SkippedLine]], *, tell: bool
) -> tuple[str, str | None, Iterator[tuple[int, str | SkippedLine]]]:
    """Look at the start of a trace: ``(layout, told, lines)``.

    ``layout`` is ``"csv"`` when the first non-blank line looks like a CSV header (not a
    JSON object, with a comma) and none of the first :data:`DETECT_LINES` non-blank lines
    is a JSON object; else ``"json"`` (a first line cut short by a log rotation, whose
    fragment has commas, is then one malformed line, not a header). With ``tell``, and
    JSON lines, ``told`` is the format of the first JSON object with ``hash_ids``
    (``"mooncake"``) or ``key`` (``"generic"``), looked for as far as it takes; None when
    there is none (or not ``tell``). ``lines`` gives every line again, from the first."""
    seen: list[tuple[int, str | SkippedLine]] = []
    layout: str | None = None
    told: str | None = None
    nonblank = 0
    for item in numbered:
        seen.append(item)
        text = item[1]
        if isinstance(text, SkippedLine) or not text.strip():
            continue
        nonblank += 1
        kind = _detect(text)
        if told is None and kind in ("mooncake", "generic"):
            told = kind
        if layout is None:
            if (nonblank == 1 and kind != "csv") or kind in ("mooncake", "generic", "object"):
                layout = "json"
            elif nonblank == DETECT_LINES:
                layout = "csv"
        if layout == "csv" or (layout == "json" and (told is not None or not tell)):
            break
    if layout is None:  # the lines ended first: a CSV header and no JSON object, or none
        layout = "csv" if nonblank else "json"
    told = told if layout == "json" and tell else None
    return layout, told, itertools.chain(seen, numbered)


def _parse_mooncake(numbered: Iterable[tuple[int, str | SkippedLine]]) -> Trace:
    parsed: list[TraceRequest] = []
    skipped: list[SkippedLine] = []
    for lineno, text in numbered:
        if isinstance(text, SkippedLine):
            skipped.append(text)
            continue
        if not text.strip():
            skipped.append(SkippedLine(lineno, "blank line", blank=True))
            continue
        result = _parse_line(text)
        if isinstance(result, str):
            skipped.append(SkippedLine(lineno, result))
            continue
        ts, input_length, output_length, conversation = result
        parsed.append(TraceRequest(0, lineno, ts, input_length, output_length, conversation))
    parsed.sort(key=lambda r: (r.timestamp_ms, r.line))
    requests = tuple(
        TraceRequest(i, r.line, r.timestamp_ms, r.input_length, r.output_length, r.conversation)
        for i, r in enumerate(parsed)
    )
    return Trace(requests, tuple(skipped), "", "mooncake")


def _absent(value: object) -> bool:
    return value is None or (isinstance(value, str) and not value.strip())


def _generic_timestamp_us(value: object) -> int | str:
    """A generic ``timestamp`` (seconds, or ISO 8601 text) in whole microseconds, or the
    reason it is not valid."""
    seconds: float | None = None
    if _is_number(value):
        seconds = value  # type: ignore[assignment]
    elif isinstance(value, str):
        seconds = _text_number(value)
        if seconds is None:
            us = iso8601_us(value)
            if us is None:
                return (
                    "field 'timestamp' must be seconds or an ISO 8601 date and time such as "
                    f"2025-03-04T09:00:00.120Z (got {_shown(value)})"
                )
            return us
    if seconds is None or not -MAX_GENERIC_TIMESTAMP_S <= seconds <= MAX_GENERIC_TIMESTAMP_S:
        return (
            f"field 'timestamp' must be a number of seconds within "
            f"+-{MAX_GENERIC_TIMESTAMP_S:.0e} or an ISO 8601 date and time (got {_shown(value)})"
        )
    return round(seconds * _US_PER_S)


def _parse_generic_record(
    record: dict[str, object],
) -> tuple[int, str, int | None, int] | str:
    """One generic record: ``(timestamp_us, key, duration_us or None, output_tokens)``, or
    the reason it is not a valid request. CSV cells arrive as strings."""
    missing = [repr(f) for f in GENERIC_FIELDS if _absent(record.get(f))]
    if all(_absent(record.get(f)) for f in GENERIC_WORK_FIELDS):
        missing.append(" or ".join(repr(f) for f in GENERIC_WORK_FIELDS))
    if missing:
        return "missing field" + ("s " if len(missing) > 1 else " ") + ", ".join(missing)
    ts = _generic_timestamp_us(record["timestamp"])
    if isinstance(ts, str):
        return ts
    key = record["key"]
    if _is_int(key):
        key = str(key)
    if not isinstance(key, str):
        return f"field 'key' must be a string (got {_shown(key)})"
    duration = record.get("duration_s")
    if not _absent(duration):
        seconds: float | None = None
        if _is_number(duration):
            seconds = duration  # type: ignore[assignment]
        elif isinstance(duration, str):
            seconds = _text_number(duration)
        if seconds is None or not 0 <= seconds <= MAX_DURATION_S:  # NaN fails the range
            return (
                f"field 'duration_s' must be a number of seconds from 0 to "
                f"{MAX_DURATION_S:.1e} (got {_shown(duration)})"
            )
        return ts, key, round(seconds * _US_PER_S), 0
    tokens = record["output_tokens"]
    if isinstance(tokens, str) and _INTEGER.fullmatch(tokens.strip()):
        tokens = int(tokens.strip())
    if not _is_int(tokens) or not 0 <= tokens <= MAX_LENGTH_TOKENS:  # type: ignore[operator]
        return (
            f"field 'output_tokens' must be an integer from 0 to {MAX_LENGTH_TOKENS:,} "
            f"(got {_shown(record['output_tokens'])})"
        )
    return ts, key, None, tokens  # type: ignore[return-value]


def _generic_records(
    numbered: Iterable[tuple[int, str | SkippedLine]], layout: str
) -> Iterator[tuple[int, dict[str, object] | SkippedLine]]:
    """The records of a generic trace, ``layout`` ``"json"`` (JSON lines) or ``"csv"``
    (its first non-blank line the header), with their line numbers; lines that are not
    records come out as SkippedLine.

    Raises:
        TraceError: a CSV header without the required columns.
    """
    header: list[str] | None = None
    mode: str | None = None if layout == "csv" else "json"
    for lineno, text in numbered:
        if isinstance(text, SkippedLine):
            yield lineno, text
            continue
        if not text.strip():
            yield lineno, SkippedLine(lineno, "blank line", blank=True)
            continue
        if mode is None:  # the header of a CSV trace
            mode = "csv"
            header = [h.strip() for h in next(csv.reader([text]))]
            absent = [f for f in GENERIC_FIELDS if f not in header]
            if absent or not any(f in header for f in GENERIC_WORK_FIELDS):
                raise TraceError(
                    f"line {lineno}: a CSV trace needs a header line with the columns "
                    "timestamp, key and duration_s or output_tokens (got "
                    f"{', '.join(header) or 'nothing'})"
                )
            continue
        if mode == "json":
            obj = _json(text)
            if isinstance(obj, SkippedLine):
                yield lineno, SkippedLine(lineno, obj.reason)
                continue
            if not isinstance(obj, dict):
                yield lineno, SkippedLine(
                    lineno, f"not a JSON object (got {type(obj).__name__})"
                )
                continue
            yield lineno, obj
            continue
        assert header is not None
        try:
            cells = next(csv.reader([text]))
        except csv.Error as exc:
            yield lineno, SkippedLine(lineno, f"invalid CSV: {exc}")
            continue
        if len(cells) != len(header):
            yield lineno, SkippedLine(
                lineno, f"expected {len(header)} CSV columns, got {len(cells)}"
            )
            continue
        yield lineno, dict(zip(header, cells, strict=True))


def _parse_generic(numbered: Iterable[tuple[int, str | SkippedLine]], layout: str) -> Trace:
    parsed: list[tuple[int, int, str, int | None, int]] = []
    skipped: list[SkippedLine] = []
    for lineno, record in _generic_records(numbered, layout):
        if isinstance(record, SkippedLine):
            skipped.append(record)
            continue
        result = _parse_generic_record(record)
        if isinstance(result, str):
            skipped.append(SkippedLine(lineno, result))
            continue
        ts, key, duration_us, tokens = result
        parsed.append((ts, lineno, key, duration_us, tokens))
    if parsed:
        first, last = min(parsed), max(parsed)
        t0 = first[0]
        span = last[0] - t0
        if span > MAX_TIMESTAMP_MS * 1000:
            # Usually two kinds of timestamps in one file (seconds from 0 and ISO 8601
            # dates, say): name the two lines, the reader can see which is which.
            raise TraceError(
                f"the trace spans {span / 1e6:.3g} s, more than {MAX_TIMESTAMP_MS / 1000:.3g} "
                f"s (about a year): its earliest timestamp is on line {first[1]}, its "
                f"latest on line {last[1]}; are two kinds of timestamps mixed (numbers of "
                f"seconds and dates)?"
            )
    ids: dict[str, int] = {}
    for p in sorted(parsed, key=lambda p: p[1]):  # ids in order of first appearance
        ids.setdefault(p[2], len(ids))
    parsed.sort(key=lambda p: (p[0], p[1]))
    requests = tuple(
        TraceRequest(
            i,
            lineno,
            (ts - t0) // 1000 if (ts - t0) % 1000 == 0 else (ts - t0) / 1000,
            0,
            tokens,
            ids[key],
            key,
            duration_us,
        )
        for i, (ts, lineno, key, duration_us, tokens) in enumerate(parsed)
    )
    return Trace(requests, tuple(skipped), "", "generic")


def service_times_us(trace: Trace, tpot_ms: float | None = None) -> tuple[list[int], float | None]:
    """Each request's service time in whole microseconds, in ``trace.requests`` order, and
    the work per output token used (None when no request needed one): the one rule of
    ``lanequeue replay`` and ``lanequeue plan``.

    A request's service time is its ``duration_s`` (generic format), else
    ``output_tokens * tpot_ms`` rounded to the microsecond.

    Args:
        trace: the requests.
        tpot_ms: milliseconds of work per output token (0 to 60,000). None: 30
            (:data:`DEFAULT_TPOT_MS`) for a Mooncake trace; a generic trace whose lines
            give ``output_tokens`` must name it, since only the operator knows their model's
            speed.

    Raises:
        TypeError: ``tpot_ms`` not a number.
        ValueError: ``tpot_ms`` out of range, or missing where it is needed.

    Example::

        >>> t = parse_trace_lines(["timestamp,key,duration_s,output_tokens", "0,a,1.5,",
        ...                        "1,b,,10"], trace_format="auto")
        >>> service_times_us(t, tpot_ms=20)
        ([1500000, 200000], 20.0)
    """
    tpot_ms = check_tpot_ms(tpot_ms)
    reqs = trace.requests
    needs_tpot = any(r.duration_us is None for r in reqs)
    if needs_tpot and tpot_ms is None:
        if trace.format != "mooncake":
            raise SettingError(
                "tpot_ms",
                "the trace gives output_tokens, not durations, for some requests: say "
                "how much work one output token is, in milliseconds (--tpot-ms MS)",
            )
        tpot_ms = DEFAULT_TPOT_MS
    tpot_us = Fraction(tpot_ms if tpot_ms is not None else 0) * 1000
    if tpot_us.denominator == 1:
        per_token = int(tpot_us)
        work = [
            r.duration_us if r.duration_us is not None else r.output_length * per_token
            for r in reqs
        ]
    else:
        work = [
            r.duration_us if r.duration_us is not None else round(r.output_length * tpot_us)
            for r in reqs
        ]
    return work, tpot_ms if needs_tpot else None


def parse_trace_lines(
    lines: Iterable[str | bytes], *, source: str = "<lines>", trace_format: str = "mooncake"
) -> Trace:
    """Parse trace lines (text or UTF-8 bytes, with or without line endings) into a Trace.

    Invalid lines are collected in ``Trace.skipped`` with their 1-based line numbers; nothing is
    printed here. Requests are sorted by arrival, stably.

    Args:
        lines: the lines of the file.
        source: a name for the trace, kept in ``Trace.source``.
        trace_format: ``"mooncake"`` (the default), ``"generic"`` (JSON lines or CSV, see
            the module docstring) or ``"auto"`` (told from the first lines: see the module
            docstring).

    Raises:
        ValueError: an unknown ``trace_format``.
        TraceError: a generic CSV trace whose header lacks a required column, or a
            generic trace spanning more than about a year.

    Example::

        >>> t = parse_trace_lines(["timestamp,key,duration_s", "0.5,a,2", "1,b,x"],
        ...                       trace_format="auto")
        >>> [(r.timestamp_ms, r.key, r.duration_us) for r in t.requests], t.skipped[0].line
        ([(0, 'a', 2000000)], 3)
    """
    if trace_format not in TRACE_FORMATS:
        raise ValueError(
            f"unknown trace_format {trace_format!r}; choose from {', '.join(TRACE_FORMATS)}"
        )
    numbered: Iterator[tuple[int, str | SkippedLine]] = _decoded(lines)
    if trace_format == "mooncake":
        trace = _parse_mooncake(numbered)
    else:
        layout, told, numbered = _sniff(numbered, tell=trace_format == "auto")
        if trace_format == "auto" and layout == "json" and told != "generic":
            trace = _parse_mooncake(numbered)
        else:
            trace = _parse_generic(numbered, layout)
    return Trace(trace.requests, trace.skipped, source, trace.format)


def default_trace_source() -> str:
    """A display name for the bundled trace (``lanequeue/data/<name>``)."""
    return f"lanequeue/data/{DEFAULT_TRACE_NAME} (bundled)"


#: The reason of the skipped line that stands for the end of a gzip stream cut short.
GZIP_CUT = "the gzip stream ends short (the file was cut): what followed is lost"


def _until_cut(lines: Iterable[bytes], cut: list[int]) -> Iterator[bytes]:
    """The lines of a gzip stream up to where it ends short, if it does: then the number
    the next line would have is appended to ``cut``."""
    n = 0
    it = iter(lines)
    while True:
        try:
            line = next(it)
        except StopIteration:
            return
        except EOFError:  # "Compressed file ended before the end-of-stream marker"
            cut.append(n + 1)
            return
        n += 1
        yield line


def _parse_binary(
    stream: IO[bytes], *, gzipped: bool, source: str, trace_format: str = "mooncake"
) -> Trace:
    try:
        if gzipped:
            with gzip.GzipFile(fileobj=stream, mode="rb") as gz:
                cut: list[int] = []
                trace = parse_trace_lines(_until_cut(gz, cut), source=source,
                                          trace_format=trace_format)
                if cut:
                    trace = dataclasses.replace(
                        trace, skipped=(*trace.skipped, SkippedLine(cut[0], GZIP_CUT)))
                return trace
        return parse_trace_lines(stream, source=source, trace_format=trace_format)
    except (OSError, EOFError, zlib.error) as exc:  # gzip.BadGzipFile is an OSError;
        # corrupt deflate data inside a good header is a zlib.error
        raise TraceError(f"cannot read trace {source}: {exc}") from exc


def read_trace(path: str | Path | None = None, *, trace_format: str = "mooncake") -> Trace:
    """Read a trace file (plain or gzip, detected from its first bytes) into a Trace.

    Args:
        path: the file to read; None reads the bundled Mooncake trace through
            ``importlib.resources`` so that no argument is needed on a fresh install.
        trace_format: ``"mooncake"`` (the default), ``"generic"`` or ``"auto"``, as for
            :func:`parse_trace_lines`.

    Raises:
        ValueError: an unknown ``trace_format``.
        TraceError: the file cannot be opened or its gzip stream is corrupt (one cut
            short is read up to the cut, which is one malformed line), or (generic
            format) a CSV header lacks a required column. Bad *lines* do not raise; they are
            listed in ``Trace.skipped``.
    """
    if trace_format not in TRACE_FORMATS:
        raise ValueError(
            f"unknown trace_format {trace_format!r}; choose from {', '.join(TRACE_FORMATS)}"
        )
    if path is None:
        resource = resources.files("lanequeue") / "data" / DEFAULT_TRACE_NAME
        try:
            stream = resource.open("rb")
        except OSError as exc:
            raise TraceError(
                f"the bundled trace {DEFAULT_TRACE_NAME} is missing from the installed package"
            ) from exc
        with stream:
            return _parse_binary(
                stream, gzipped=True, source=default_trace_source(), trace_format=trace_format
            )
    source = str(path)
    try:
        stream = open(path, "rb")  # noqa: SIM115 - closed by the with below
    except OSError as exc:
        raise TraceError(f"cannot open trace {source}: {exc.strerror or exc}") from exc
    with stream:
        try:
            gzipped = stream.read(2) == _GZIP_MAGIC
            stream.seek(0)
        except OSError as exc:
            raise TraceError(f"cannot read trace {source}: {exc.strerror or exc}") from exc
        return _parse_binary(stream, gzipped=gzipped, source=source, trace_format=trace_format)
