"""Reading request traces in the Mooncake conversation-trace format.

One JSON object per line with the fields ``timestamp`` (arrival, milliseconds from the start
of the trace), ``input_length`` and ``output_length`` (tokens) and ``hash_ids`` (prefix-block
ids; ``hash_ids[1]`` identifies the conversation, see ``lanequeue/data/README.md``).

A line that is blank, is not valid JSON, or lacks a field (or holds one of the wrong type) is
not fatal: it is skipped and reported with its 1-based line number, so one bad line in a
production dump does not stop a replay.
"""

from __future__ import annotations

import gzip
import json
import math
from collections.abc import Iterable
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import IO

__all__ = [
    "DEFAULT_TRACE_NAME",
    "REQUIRED_FIELDS",
    "SkippedLine",
    "Trace",
    "TraceError",
    "TraceRequest",
    "default_trace_source",
    "parse_trace_lines",
    "read_trace",
]

#: File name of the bundled trace inside the ``lanequeue.data`` directory.
DEFAULT_TRACE_NAME = "mooncake_conversation_trace.jsonl.gz"

#: Fields every line must carry.
REQUIRED_FIELDS = ("timestamp", "input_length", "output_length", "hash_ids")
#: Bounds that keep a replay's times finite and representable: about a year of trace
#: time, and far more tokens than any model generates for one request.
MAX_TIMESTAMP_MS = 3.2e10
MAX_LENGTH_TOKENS = 10_000_000

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
        conversation: the conversation id, ``hash_ids[1]``.
    """

    index: int
    line: int
    timestamp_ms: int | float
    input_length: int
    output_length: int
    conversation: int


@dataclass(frozen=True)
class SkippedLine:
    """A line that was not a valid request: its 1-based ``line`` number and the ``reason``."""

    line: int
    reason: str


@dataclass(frozen=True)
class Trace:
    """A parsed trace: the valid requests in arrival order and the skipped lines.

    Attributes:
        requests: valid requests sorted by arrival (stable: equal timestamps keep file order),
            re-indexed so that ``requests[i].index == i``.
        skipped: the lines that were skipped, in file order.
        source: a human-readable name of where the trace came from.
    """

    requests: tuple[TraceRequest, ...]
    skipped: tuple[SkippedLine, ...]
    source: str

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
        return Trace(self.requests[:n], self.skipped, self.source)


def _is_number(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _parse_line(text: str) -> tuple[int | float, int, int, int] | str:
    """Parse one line: ``(timestamp_ms, input_length, output_length, conversation)``.

    Returns the reason string instead when the line is not a valid request.
    """
    if not text.strip():
        return "blank line"
    try:
        obj = json.loads(text)
    except json.JSONDecodeError as exc:
        return f"invalid JSON: {exc.msg} (column {exc.colno})"
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
    if not _is_number(ts) or not math.isfinite(ts) or not 0 <= ts <= MAX_TIMESTAMP_MS:
        return (
            f"field 'timestamp' must be a number of milliseconds from 0 to "
            f"{MAX_TIMESTAMP_MS:.0e} (got {ts!r})"
        )
    for name in ("input_length", "output_length"):
        value = obj[name]
        if not _is_int(value) or not 0 <= value <= MAX_LENGTH_TOKENS:
            return (
                f"field {name!r} must be an integer from 0 to {MAX_LENGTH_TOKENS:,} "
                f"(got {value!r})"
            )
    hash_ids = obj["hash_ids"]
    if not isinstance(hash_ids, list):
        return f"field 'hash_ids' must be a list (got {type(hash_ids).__name__})"
    if len(hash_ids) < 2:
        return "field 'hash_ids' needs at least 2 block ids (hash_ids[1] is the conversation)"
    if not _is_int(hash_ids[1]):
        return f"field 'hash_ids' must hold integers (hash_ids[1] is {hash_ids[1]!r})"
    return ts, obj["input_length"], obj["output_length"], hash_ids[1]


def parse_trace_lines(lines: Iterable[str | bytes], *, source: str = "<lines>") -> Trace:
    """Parse trace lines (text or UTF-8 bytes, with or without line endings) into a Trace.

    Invalid lines are collected in ``Trace.skipped`` with their 1-based line numbers; nothing is
    printed here. Requests are sorted by ``timestamp`` (milliseconds), stably.
    """
    parsed: list[TraceRequest] = []
    skipped: list[SkippedLine] = []
    for lineno, raw in enumerate(lines, start=1):
        if isinstance(raw, bytes):
            try:
                text = raw.decode("utf-8")
            except UnicodeDecodeError as exc:
                skipped.append(SkippedLine(lineno, f"not valid UTF-8 ({exc.reason})"))
                continue
        else:
            text = raw
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
    return Trace(requests, tuple(skipped), source)


def default_trace_source() -> str:
    """A display name for the bundled trace (``lanequeue/data/<name>``)."""
    return f"lanequeue/data/{DEFAULT_TRACE_NAME} (bundled)"


def _parse_binary(stream: IO[bytes], *, gzipped: bool, source: str) -> Trace:
    try:
        if gzipped:
            with gzip.GzipFile(fileobj=stream, mode="rb") as gz:
                return parse_trace_lines(gz, source=source)
        return parse_trace_lines(stream, source=source)
    except (OSError, EOFError) as exc:  # gzip.BadGzipFile is an OSError
        raise TraceError(f"cannot read trace {source}: {exc}") from exc


def read_trace(path: str | Path | None = None) -> Trace:
    """Read a trace file (plain or gzip, detected from its first bytes) into a Trace.

    Args:
        path: the file to read; None reads the bundled Mooncake trace through
            ``importlib.resources`` so that no argument is needed on a fresh install.

    Raises:
        TraceError: the file cannot be opened or its gzip stream is corrupt. Bad *lines* do
            not raise; they are listed in ``Trace.skipped``.
    """
    if path is None:
        resource = resources.files("lanequeue") / "data" / DEFAULT_TRACE_NAME
        try:
            stream = resource.open("rb")
        except OSError as exc:
            raise TraceError(
                f"the bundled trace {DEFAULT_TRACE_NAME} is missing from the installed package"
            ) from exc
        with stream:
            return _parse_binary(stream, gzipped=True, source=default_trace_source())
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
        return _parse_binary(stream, gzipped=gzipped, source=source)
