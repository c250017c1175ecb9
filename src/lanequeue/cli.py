"""The ``lanequeue`` command line (also ``python -m lanequeue``).

``lanequeue replay`` drives a real production trace through the lanes and reports what
happened: per-conversation order kept, conversations in parallel, the global cap respected,
waits measured against an exact simulation. Run ``lanequeue replay --help`` for options.

Exit status: 0 when the replay ran and every check held; 1 when a check failed (order
violated, two requests of one conversation at once, the global cap exceeded, a request
failed); 2 for bad arguments, a trace that cannot be used, or a backend that cannot be used
(bad URL, server unreachable, a worker process that failed).

A trace cannot be used when it cannot be read, has no valid request, or has more malformed
lines (invalid JSON or CSV, a field missing or out of range; blank lines are not counted)
than ``--max-bad-lines`` allows: a share of its request lines (``1%``, the default) or a
number of lines. Malformed lines are reported on stderr either way (the first
:data:`MAX_LINE_MESSAGES` with their numbers and reasons, then a count), so a file of
another format, or one mostly damaged, is not replayed or planned from the few lines that
happen to parse.

``lanequeue plan`` finds the smallest global cap whose simulated waits meet a goal
(``--p99-wait-s S``, optionally ``--max-wait-s M``) from a trace; see
:mod:`lanequeue.replay.plan`. Exit status: 0 with a recommendation; 3 when no cap (in the
range searched) meets the goal; 2 for bad arguments or a trace that cannot be used (as
for ``replay``, with the same ``--max-bad-lines``); 1 when the ``--verify`` replay broke a
lane invariant.

``lanequeue status`` shows the lanes in a Redis (see README, "A live view of a Redis").
A usage error exits with status 2 after the usage line, as argparse does: ``--prefix ""``
(or a prefix with ``{`` or ``}``, which no lane has), ``--interval`` outside 0.1 to 3600
seconds, ``--interval`` without ``--watch``, ``--json`` with ``--watch``.
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import re
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from fractions import Fraction
from pathlib import Path
from typing import Any, TextIO

from ._errors import install_hint

__all__ = ["BadLineLimit", "build_parser", "main"]

#: Skipped trace lines (and failed requests) reported one by one on stderr; the rest are
#: counted in one line.
MAX_LINE_MESSAGES = 20
#: Default of ``--max-bad-lines`` (``replay`` and ``plan``): a trace with more than 1% of
#: its request lines malformed is refused. A few broken lines of a production dump (a
#: line cut by a log rotation) pass; a file of another format, or one mostly damaged, is
#: not planned from the fraction of its traffic that happens to parse.
DEFAULT_MAX_BAD_LINES = "1%"
#: Bounds of ``lanequeue status --watch --interval`` (seconds). Each redraw SCANs the
#: lanes' keys of the whole Redis: more than 10 a second would load a busy server for a
#: view no one reads faster; beyond an hour ``--watch`` is no longer a live view.
STATUS_MIN_INTERVAL_S = 0.1
STATUS_MAX_INTERVAL_S = 3600.0
#: Seconds between redraws of ``lanequeue status --watch`` without ``--interval``.
STATUS_DEFAULT_INTERVAL_S = 1.0


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of the ``lanequeue`` command.

    The replay's options are only parsed here: :class:`~lanequeue.replay.ReplayConfig`
    checks them (once, for the command line and the Python API alike), and their defaults
    are the config's.
    """
    from lanequeue import __version__
    from lanequeue.replay.policy import POLICIES
    from lanequeue.replay.runner import ReplayConfig
    from lanequeue.replay.runtimes import RUNTIMES

    defaults = ReplayConfig()
    parser = argparse.ArgumentParser(
        prog="lanequeue",
        description="Per-key FIFO lanes with global caps: tools around the lanequeue library.",
    )
    parser.add_argument("--version", action="version", version=f"lanequeue {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    rp = sub.add_parser(
        "replay",
        help="drive a production request trace through real lanes and measure it",
        description=(
            "Replay a request trace through real lanes, on real threads or asyncio tasks. "
            "Each request arrives at its trace time / SPEED, takes the lanes "
            "['session', 'global'] with acquire_all under its conversation's key, works for "
            "its service time / SPEED (duration_s, or output tokens * TPOT_MS), then "
            "releases. Reports waits, "
            "order and concurrency as the workers observed them, next to an exact "
            "simulation of the same policy. Exit status 1 when a check failed; 2 for bad "
            "arguments, an unusable backend, or a trace that cannot be used (unreadable, "
            "no valid request, or more malformed lines than --max-bad-lines allows)."
        ),
    )
    rp.add_argument(
        "trace",
        nargs="?",
        default=None,
        metavar="TRACE",
        help="trace file, plain or gzip: the Mooncake format (JSON lines: timestamp in "
        "milliseconds, input_length, output_length, hash_ids), or the generic format (JSON "
        "lines or CSV with timestamp in seconds, key, duration_s or output_tokens), told "
        "from the "
        "content as by 'lanequeue plan' (default: the bundled Mooncake trace, 12,031 "
        "requests from one hour of a production LLM chat service)",
    )
    rp.add_argument(
        "--speed",
        **_number(_float),
        default=defaults.speed,
        help=f"divide trace time by this, 1e-06 to 1e+06 (default {defaults.speed:g}: the "
        "hour plays in a minute)",
    )
    rp.add_argument(
        "--tpot-ms",
        **_number(_float),
        default=defaults.tpot_ms,
        metavar="MS",
        help="work per output token, trace milliseconds, for lines that give tokens "
        "(default 30 for a Mooncake trace; required for generic output_tokens lines)",
    )
    rp.add_argument(
        "--global",
        dest="global_cap",
        **_number(_int),
        default=defaults.global_cap,
        metavar="N",
        help=f"permits of the global lane, 1 to 10**9 (default {defaults.global_cap})",
    )
    rp.add_argument(
        "--policy",
        default=defaults.policy,
        metavar="NAME",
        help=f"{' or '.join(POLICIES)}; session: SessionLane per conversation (default "
        f"{defaults.policy}); global-serial: the original Lane('session', "
        "max_concurrent=1), which serialises everything (slow: combine with --limit)",
    )
    rp.add_argument(
        "--limit",
        **_number(_int),
        default=None,
        metavar="N",
        help="replay only the first N requests (in arrival order)",
    )
    rp.add_argument(
        "--runtime",
        default=None,
        metavar="NAME",
        help=f"how requests run: {', '.join(sorted(RUNTIMES))} (default {defaults.runtime}; "
        "asyncio with --busy or --backend): "
        "threads block in LaneQueue, asyncio tasks await AsyncLaneQueue on one event loop",
    )
    rp.add_argument(
        "--backend",
        default=None,
        metavar="URL",
        help="put the lanes in Redis (redis://HOST[:PORT][/DB]) and drive the requests "
        "from --workers processes sharing them: the multi-replica gateway (default: "
        "in-process lanes)",
    )
    rp.add_argument(
        "--workers",
        **_number(_int),
        default=defaults.workers,
        metavar="N",
        help="with --backend: worker processes, each running --runtime (asyncio or threads); "
        "request i goes to worker i mod N, so a conversation's messages reach different "
        f"processes (default {defaults.workers})",
    )
    rp.add_argument(
        "--max-sessions",
        **_number(_int),
        default=defaults.max_sessions,
        metavar="N",
        help=f"soft cap of the session lane's registry (default {defaults.max_sessions})",
    )
    rp.add_argument(
        "--idle-timeout",
        dest="idle_timeout_s",
        **_number(_float),
        default=defaults.idle_timeout_s,
        metavar="S",
        help="seconds of trace time an idle session entry is kept, scaled by "
        f"--speed like every duration (default {defaults.idle_timeout_s:g})",
    )
    rp.add_argument(
        "--json",
        dest="json_path",
        type=Path,
        default=None,
        metavar="PATH",
        help="also write the figures as JSON to PATH",
    )
    rp.add_argument(
        "--plot",
        dest="plot_path",
        type=Path,
        default=None,
        metavar="PATH",
        help="write a PNG of concurrency over time, the wait distribution, in-flight "
        "requests against the cap and the lanes' own wait histograms "
        f"(needs matplotlib: {install_hint('plot')})",
    )
    rp.add_argument(
        "--metrics-port",
        **_number(_int),
        default=None,
        metavar="N",
        help="serve the lanes' Prometheus metrics on http://127.0.0.1:N/metrics while the "
        "replay runs (0: any free port; in-process runtimes only; needs prometheus_client: "
        f"{install_hint('prometheus')})",
    )
    rp.add_argument(
        "--busy",
        default=None,
        metavar="POLICY",
        help="submit the requests to a Dispatcher with this busy policy instead of taking "
        "the lanes directly (enqueue, reject, steer, interrupt, replace, collect, or "
        "'all' for one run each; asyncio); reports calls made, requests merged, "
        "dropped, rejected and cancelled, and wait percentiles per policy",
    )
    rp.add_argument(
        "--no-progress",
        action="store_true",
        help="no progress bar (it is shown only on a terminal, with tqdm)",
    )
    _add_max_bad_lines(rp, "replaying")
    rp.set_defaults(options=_option_names(rp), usage_error=rp.error,
                    usage_text=rp.format_usage)
    _take_negative_values(rp)
    _add_plan_parser(sub)
    _add_status_parser(sub)
    return parser


def _add_max_bad_lines(parser: argparse.ArgumentParser, using: str) -> None:
    parser.add_argument(
        "--max-bad-lines",
        type=_bad_line_limit,
        default=DEFAULT_MAX_BAD_LINES,
        metavar="LIMIT",
        help="malformed trace lines (invalid JSON or CSV, a field missing or out of range) "
        "allowed: a share of the request lines such as 1%% (0%% allows none), or a "
        f"number of lines such as 10 (default {DEFAULT_MAX_BAD_LINES.replace('%', '%%')})."
        f" Each is reported on stderr (the first {MAX_LINE_MESSAGES} with their line "
        "numbers and reasons, then a count); with more than LIMIT, or no valid line, the "
        "command exits with "
        f"status 2 instead of {using} the valid lines alone (100%% uses whatever lines "
        "are valid). Blank lines are passed over and not counted",
    )


#: What argparse takes for a negative number (a value, not an option): a minus sign then
#: a digit, or ``.`` and a digit, as Python 3.13's argparse does (any script's digit, which
#: the option's own reader then refuses in the one form of a refusal); or then ``inf`` or
#: ``nan`` in any case (``-inf``, ``-Infinity``, ``-nan%``), which ``float()`` reads or
#: a share is written with (the option's own check refuses them, naming its range). No
#: option of these commands starts so.
_NEGATIVE_VALUE = re.compile(r"-(\.?\d|(?i:inf|nan))")


def _take_negative_values(parser: argparse.ArgumentParser) -> None:
    """Make ``parser`` take every argument that starts like a negative number (``-1%``,
    ``-1e3``, ``-0.5``) as a value, as Python 3.13 does: before 3.13, argparse took
    only ``-N`` and ``-N.N`` as values, and ``--max-bad-lines -1%`` or ``--speed -1e3``
    was refused with "expected one argument" instead of the option's own check, which
    says what range it takes. No option of these commands looks like a number."""
    parser._negative_number_matcher = _NEGATIVE_VALUE


def _option_names(parser: argparse.ArgumentParser) -> dict[str, str]:
    """Each option's setting name (its ``dest``, the name the checks use) -> the option."""
    return {a.dest: "/".join(a.option_strings) for a in parser._actions if a.option_strings}


def _failing(command: str, args: argparse.Namespace, err: TextIO) -> Callable[..., int]:
    """The ``fail(message, usage=False)`` of a command: it prints ``lanequeue <command>:
    error: <message>`` on ``err`` and returns 2; a bad argument (``usage=True``) gets the
    command's usage line first, as argparse's own refusals do."""

    def fail(message: str, usage: bool = False) -> int:
        if usage:
            err.write(args.usage_text())
        print(f"lanequeue {command}: error: {message}", file=err)
        return 2

    return fail


def _refused(exc: Exception, args: argparse.Namespace) -> str:
    """The message of a refused setting, naming its option when it names one; the
    settings the message names (the Python API's names, such as ``global_cap``) are
    given as their options' names there (``global``, for ``--global``). A value out of
    range is shown as it was typed (``got 1e400``, not ``got inf``), in the form of
    :func:`_refusal`, and so is the other setting's value it was compared with
    (``min-global must be at most max-global (3), got 09``); a setting another option
    excludes is said in the form of :func:`_not_allowed`."""
    options: dict[str, str] = args.options
    setting = getattr(exc, "setting", "")
    option = options.get(setting)
    excluded_by = options.get(getattr(exc, "excluded_by", None) or "")
    expected = getattr(exc, "expected", None)
    every_typed: dict[str, str] = getattr(args, "typed", {})
    typed = every_typed.get(setting)
    if option and excluded_by:
        return _not_allowed(option, excluded_by, getattr(exc, "reason", None))
    compared_with = getattr(exc, "compared_with", None)
    if expected is not None and compared_with is not None:  # min_global above max_global
        other = every_typed.get(compared_with)
        expected = None if other is None else f"{expected} ({_as_typed(other)})"
    text = str(exc) if expected is None or typed is None else expected
    for name, given in options.items():
        text = re.sub(rf"\b{re.escape(name)}\b", given.split("/")[-1].lstrip("-"), text)
    if expected is not None and typed is not None:
        text = _refusal(text, typed)
    return f"argument {option}: {text}" if option else text


def _not_allowed(option: str, other: str, reason: str | None = None) -> str:
    """The one form of the command line for two options that do not go together,
    argparse's own (its mutually exclusive options say it): ``argument --json: not
    allowed with argument --busy``, then why in parentheses."""
    return f"argument {option}: not allowed with argument {other}" + (
        f" ({reason})" if reason else "")


@dataclass(frozen=True)
class _Typed:
    """A number option's value with the text it was typed as."""

    value: Any
    text: str


def _number(convert: Any) -> dict[str, Any]:
    """``add_argument``'s ``type`` and ``action`` for a number option read by ``convert``
    (:func:`_float`, :func:`_int` or :func:`_seconds`): the value is stored as usual, and
    the text it was typed as in ``args.typed`` (by the option's ``dest``), for an error to
    show the value as the user wrote it (``1e400``, not what ``float`` made of it,
    ``inf``)."""

    def read(text: str) -> _Typed:
        return _Typed(convert(text), text)

    read.__name__ = convert.__name__
    return {"type": read, "action": _KeepText}


# The numbers of every option are read alike: ASCII decimal notation only (blanks around
# them ignored), so that what Python's int(), float() and Fraction() also take (``1_000``,
# other scripts' digits such as '\u0661\u0660', ``2/3``) is refused by every option, as
# by the trace reader. An option that takes a fraction also takes ``nan`` and
# ``inf``/``infinity`` with a sign, in any case, as float() reads them, for its range check
# to refuse them (``speed must be a number from 1e-06 to 1e+06, got nan``).
_INTEGER = re.compile(r"[+-]?[0-9]+")
_NOT_FINITE = re.compile(r"[+-]?(?:inf(?:inity)?|nan)", re.IGNORECASE)
#: What a number option takes, for the refusal of a text that is not such a number.
_DECIMAL_NOTATION = ("in decimal notation (such as 2, 0.5 or 1e3; an exponent of at most 4 "
                     "digits)")


def _refusal(expected: str, typed: str) -> str:
    """The one form of every refused value of the command line: what the option takes,
    then the value as it was typed (:func:`_as_typed`), e.g. ``must be from 0.1 to 3600
    seconds, got 0``. Range checks, syntax checks and ``--max-bad-lines`` all say it so."""
    return f"{expected}, got {_as_typed(typed)}"


def _float(text: str) -> float:
    """A number option's value (a float): ASCII decimal notation (``-1.5``, ``.5``,
    ``2e3``), ``nan`` or ``inf``; more than a float holds is ``inf``, for the option's
    range to refuse (shown as typed)."""
    from lanequeue.replay._checks import decimal_text

    decimal = decimal_text(text)
    if decimal is not None:
        return float(decimal)
    if _NOT_FINITE.fullmatch(text.strip()):
        return float(text)
    raise argparse.ArgumentTypeError(_refusal(f"must be a number {_DECIMAL_NOTATION}", text))


def _int(text: str) -> int:
    """An integer option's value: ASCII digits with an optional sign, however many (the
    option's range refuses a huge one, shown as typed)."""
    from decimal import Decimal

    stripped = text.strip()
    if not _INTEGER.fullmatch(stripped):
        raise argparse.ArgumentTypeError(
            _refusal("must be an integer in decimal digits (such as 8)", text))
    return int(Decimal(stripped))  # int() reads at most 4,300 digits


class _KeepText(argparse.Action):
    """Store a :func:`_number` option's value; keep its text in ``namespace.typed``."""

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace,
                 values: Any, option_string: str | None = None) -> None:
        setattr(namespace, self.dest, values.value)
        typed = getattr(namespace, "typed", None)
        if typed is None:
            typed = {}
            namespace.typed = typed
        typed[self.dest] = values.text


def _as_typed(text: str) -> str:
    """An option's value for a message, as it was typed: without surrounding blanks,
    non-printable characters escaped, cut when very long (its start and end, and its
    length); ``''`` when empty."""
    from lanequeue._errors import cut
    from lanequeue.replay.trace import printable

    stripped = text.strip()
    return cut(printable(stripped, len(stripped))) if stripped else "''"


def _seconds(text: str) -> Fraction | float:
    """A number of seconds, read as by :func:`_float` but kept exact (``0.1`` is one
    tenth, ``1e-9999`` is not 0); :class:`PlanGoal` checks its range (``nan`` and ``inf``
    included)."""
    from lanequeue.replay._checks import decimal_value

    value = decimal_value(text)
    if value is not None:
        return value
    if _NOT_FINITE.fullmatch(text.strip()):
        return float(text)
    raise argparse.ArgumentTypeError(
        _refusal(f"must be a number of seconds {_DECIMAL_NOTATION}", text))


def _add_plan_parser(sub: Any) -> None:
    pp = sub.add_parser(
        "plan",
        help="find the smallest global cap whose waits meet a goal, from a trace",
        description=(
            "Capacity planning: simulate the trace exactly under the session policy "
            "(each request takes its conversation's lane, then one global lane) for the "
            "global caps that matter, and recommend the smallest cap whose waits meet "
            "the goal (p99 <= S, and max <= M when given), every smaller cap shown to "
            "miss it. Exit status 3 when no cap meets the goal; 2 for bad arguments or a "
            "trace that cannot be used (unreadable, no valid request, or more malformed "
            "lines than --max-bad-lines allows)."
        ),
    )
    pp.add_argument(
        "trace",
        nargs="?",
        default=None,
        metavar="TRACE",
        help="trace file, plain or gzip: the Mooncake format (JSON lines: timestamp in "
        "milliseconds, input_length, output_length, hash_ids), or the generic format "
        "(JSON lines or CSV with timestamp in seconds, key, duration_s or output_tokens); "
        "default: "
        "the bundled Mooncake trace",
    )
    pp.add_argument(
        "--p99-wait-s",
        **_number(_seconds),
        required=True,
        metavar="S",
        help="goal: the 99th percentile of the waits (start of work - arrival), seconds",
    )
    pp.add_argument(
        "--max-wait-s",
        **_number(_seconds),
        default=None,
        metavar="M",
        help="goal: also every wait at most M seconds",
    )
    pp.add_argument(
        "--tpot-ms",
        **_number(_float),
        default=None,
        metavar="MS",
        help="work per output token, milliseconds, for lines that give tokens "
        "(default 30 for a Mooncake trace; required for generic output_tokens lines)",
    )
    pp.add_argument(
        "--min-global",
        **_number(_int),
        default=1,
        metavar="A",
        help="smallest global cap to consider (default 1)",
    )
    pp.add_argument(
        "--max-global",
        **_number(_int),
        default=None,
        metavar="B",
        help="largest global cap to consider (default: no limit)",
    )
    pp.add_argument(
        "--json",
        dest="json_path",
        type=Path,
        default=None,
        metavar="PATH",
        help="also write the recommendation, goal and table as JSON to PATH",
    )
    pp.add_argument(
        "--plot",
        dest="plot_path",
        type=Path,
        default=None,
        metavar="PATH",
        help="write a PNG of the p99 and max wait against the cap "
        f"(needs matplotlib: {install_hint('plot')})",
    )
    pp.add_argument(
        "--verify",
        action="store_true",
        help="replay the trace at the recommended cap through real lanes and print the "
        "measured waits next to the simulated ones (takes the trace's duration / --speed)",
    )
    pp.add_argument(
        "--speed",
        **_number(_float),
        default=60.0,
        help="with --verify: divide trace time by this, 1e-06 to 1e+06 (default 60)",
    )
    pp.add_argument(
        "--jobs",
        **_number(_int),
        default=None,
        metavar="N",
        help="processes simulating caps, 1 to 1024 (default: the usable cores for a trace "
        "of 50,000 requests or more, else 1)",
    )
    _add_max_bad_lines(pp, "planning from")
    pp.set_defaults(options=_option_names(pp), usage_error=pp.error,
                    usage_text=pp.format_usage)
    _take_negative_values(pp)


def _output_refused(args: argparse.Namespace) -> str | None:
    """Why ``--json`` or ``--plot`` cannot be written (checked before any work: matplotlib
    importable for ``--plot``, writable file names), or None."""
    if args.plot_path is not None:
        from lanequeue.replay.plot import PlotUnavailableError, require_matplotlib

        try:
            require_matplotlib()
        except PlotUnavailableError as exc:
            return str(exc)
    for option, path in (("--json", args.json_path), ("--plot", args.plot_path)):
        if path is None:
            continue
        if path.is_dir():
            return f"argument {option}: cannot write {path}: it is a directory; give a file name"
        if not path.resolve().parent.is_dir():
            return (
                f"argument {option}: cannot write {path}: directory {path.parent} does not "
                "exist"
            )
    if args.plot_path is not None and args.plot_path.suffix.lower() != ".png":
        return (
            "argument --plot: a PNG is written: give a file name ending in .png, not "
            f"{args.plot_path}"
        )
    return None


def _progress_bar(total: int, enabled: bool, stream: TextIO) -> Any:
    """A tqdm bar on ``stream`` if wanted, possible (tqdm importable) and ``stream`` is a
    terminal; else None."""
    if not enabled or not total or not stream.isatty():
        return None
    try:
        tqdm = importlib.import_module("tqdm").tqdm
    except (ImportError, AttributeError):
        return None
    return tqdm(total=total, file=stream, unit="req", desc="replay", dynamic_ncols=True)


@dataclass(frozen=True)
class BadLineLimit:
    """``--max-bad-lines``: how many malformed lines (:attr:`Trace.malformed
    <lanequeue.replay.Trace.malformed>`) a trace may have before ``replay`` and ``plan``
    refuse it: a share of its request lines (``share``, from ``P%``) or a number of
    lines (``count``), as the option was written (``text``)."""

    text: str
    count: int | None = None
    share: Fraction | None = None

    def allows(self, bad: int, lines: int) -> bool:
        """Whether ``bad`` malformed lines of ``lines`` request lines are within the limit
        (as many as it allows are within it)."""
        if self.count is not None:
            return bad <= self.count
        assert self.share is not None
        return bad <= self.share * lines


def _bad_line_limit(text: str) -> BadLineLimit:
    """``--max-bad-lines``: ``P%`` (a share of the request lines, 0 to 100) or ``N`` (a
    number of lines, 0 to 10**9); either with an optional sign (``+2`` as ``+2%``; a
    negative one is out of range)."""
    from lanequeue.replay._checks import MAX_COUNT, decimal_value

    stripped = text.strip()
    if stripped.endswith("%"):
        share = decimal_value(stripped[:-1])
        if share is not None and 0 <= share <= 100:
            return BadLineLimit(stripped, share=share / 100)
    elif re.fullmatch(r"[+-]?0*[0-9]{1,10}", stripped) and 0 <= int(stripped) <= MAX_COUNT:
        return BadLineLimit(stripped, count=int(stripped))
    raise argparse.ArgumentTypeError(_refusal(
        "must be a share of the request lines from 0% to 100% (such as 1%) or a number "
        f"of lines from 0 to {MAX_COUNT:,} (such as 10)", text))


def _percent(part: int, whole: int, limit: Fraction | None = None) -> str:
    """``part / whole`` as a percentage of 3 significant digits, computed exactly (no
    float noise), with more digits where 3 would put it on the other side of ``limit``
    (a share of 1): a share above the limit is shown above it (``1.0001%``, not ``1%``),
    one within it never rounded up past it (``0.6667%`` within ``0.6667%``, not
    ``0.667%``). See :func:`lanequeue.replay._figures.against`."""
    from lanequeue.replay._figures import against

    return against(Fraction(100 * part, whole), None if limit is None else limit * 100, 3,
                   significant=True) + "%"


#: What each command does with a trace, for its messages: (infinitive, participle).
_TRACE_USE = {"replay": ("replay", "replaying"), "plan": ("plan with", "planning from")}


def _check_lines(trace: Any, limit: BadLineLimit, err: TextIO, command: str) -> str | None:
    """Report the malformed lines of ``trace`` on ``err`` and say why the trace cannot be
    used (the error message), or None when it can.

    Reported: the first :data:`MAX_LINE_MESSAGES` malformed lines with their numbers and
    reasons, then how many more; the number of blank lines passed over (not malformed: no
    request is lost with them); when more than half of the request lines were malformed,
    a hint that the file may not be a trace of a format read here; and, when the
    malformed lines are within ``limit``, how many were skipped, of how many request
    lines. Refused: a trace without a valid request, and one with more malformed lines
    than ``limit`` allows (rather than a replay or plan of a fraction of the traffic).
    Request lines are every line but blank ones and a CSV header."""
    from lanequeue.replay.trace import MAX_SOURCE_CHARS, printable

    use, using = _TRACE_USE[command]
    malformed = trace.malformed
    bad = len(malformed)
    blank = len(trace.skipped) - bad
    lines = bad + len(trace.requests)
    source = printable(trace.source, MAX_SOURCE_CHARS)
    for s in malformed[:MAX_LINE_MESSAGES]:
        print(f"lanequeue {command}: {source}: line {s.line}: {s.reason}; skipped", file=err)
    if bad > MAX_LINE_MESSAGES:
        print(f"lanequeue {command}: ... and {bad - MAX_LINE_MESSAGES:,} more malformed "
              "lines skipped", file=err)
    if blank:
        print(f"lanequeue {command}: {blank:,} blank line{'s' if blank > 1 else ''} passed "
              "over", file=err)
    if bad * 2 > lines:
        print(f"lanequeue {command}: most lines were not requests: is this a Mooncake or "
              "generic trace (see --help)?", file=err)
    if not trace.requests:
        why = ("it has no request line (the file is empty, or a header only)"
               if not trace.skipped
               else "it has only blank lines" if not bad
               else f"all {lines:,} of its request lines are malformed")
        return f"no valid request to {use} in {source}: {why}"
    if not bad:
        return None
    if not limit.allows(bad, lines):
        return (
            f"{bad:,} of {lines:,} request lines are malformed "
            f"({_percent(bad, lines, limit.share)}), more than --max-bad-lines "
            f"{_as_typed(limit.text)} "
            f"allows: not {using} the other {len(trace.requests):,} (fix the trace, or "
            "raise the limit: --max-bad-lines 100% uses whatever lines are valid)"
        )
    print(f"lanequeue {command}: {bad:,} malformed line{'s' if bad > 1 else ''} skipped "
          f"({_percent(bad, lines, limit.share)} of {lines:,} request lines, within "
          f"--max-bad-lines {_as_typed(limit.text)}); {using} the other "
          f"{len(trace.requests):,}",
          file=err)
    return None


def _lanes_of(queues: list[Any]) -> list[Any]:
    return [q[name] for q in queues for name in q.list_lanes()]


def _serve_metrics(port: int, queues: list[Any], err: TextIO) -> tuple[Any, Any]:
    """Start a Prometheus endpoint on 127.0.0.1:``port`` (0: any free port) with its own
    registry; return the server and the ``on_queue`` hook that attaches the replay's queue
    to it (and remembers the queue in ``queues``)."""
    from prometheus_client import CollectorRegistry, start_http_server

    from lanequeue.metrics import PrometheusCollector

    registry = CollectorRegistry()
    server, _thread = start_http_server(port, addr="127.0.0.1", registry=registry)
    print(f"serving Prometheus metrics on http://127.0.0.1:{server.server_port}/metrics",
          file=err, flush=True)

    def attach(queue: Any) -> None:
        queues.append(queue)
        PrometheusCollector(queue, registry=registry)

    return server, attach


def _replay_busy(args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    """``replay --busy``: the trace through a Dispatcher, one run per policy."""
    from lanequeue.replay import TraceError, read_trace
    from lanequeue.replay.busy import busy_table, ideal_waits, run_busy
    from lanequeue.replay.trace import service_times_us

    fail = _failing("replay", args, err)

    try:
        config = _replay_config(args)
    except ValueError as exc:
        return fail(_refused(exc, args), usage=True)
    policies = config.busy_policies  # checked by ReplayConfig, with what busy excludes
    for option, path in (("--json", args.json_path), ("--plot", args.plot_path)):
        if path is not None:
            return fail(_not_allowed(option, "--busy", "a busy replay prints a table only: "
                                     f"{path} would not be written"), usage=True)
    if args.metrics_port is not None:
        return fail(_not_allowed("--metrics-port", "--busy", "a busy replay serves no "
                                 "metrics"), usage=True)
    try:
        trace = read_trace(args.trace, trace_format="auto")
    except (ValueError, TraceError) as exc:
        return fail(str(exc))
    refused = _check_lines(trace, args.max_bad_lines, err, "replay")
    if refused:
        return fail(refused)
    trace = trace.head(config.limit)
    try:
        service_times_us(trace, config.tpot_ms)
    except ValueError as exc:
        return fail(_refused(exc, args), usage=True)
    results = []
    for p in policies:
        results.append(run_busy(trace, p, speed=config.speed, tpot_ms=config.tpot_ms,
                                global_cap=config.global_cap, max_sessions=config.max_sessions,
                                idle_timeout_s=config.idle_timeout_s))
    ideal = None
    if "enqueue" in policies:
        ideal = ideal_waits(trace, speed=config.speed, tpot_ms=config.tpot_ms,
                            global_cap=config.global_cap)
    print(busy_table(results, ideal), file=out)
    bad = [r.policy for r in results if r.overlaps or r.order_violations]
    if bad:
        print(f"\nchecks FAILED for: {', '.join(bad)}", file=out)
        return 1
    print("\nchecks passed: one call per conversation at a time, each conversation's "
          "requests begun in arrival order", file=out)
    return 0


def _replay_config(args: argparse.Namespace) -> Any:
    """The replay's options as a :class:`ReplayConfig`, which checks them all (ValueError)."""
    from lanequeue.replay import ReplayConfig

    return ReplayConfig(
        policy=args.policy,
        global_cap=args.global_cap,
        speed=args.speed,
        tpot_ms=args.tpot_ms,
        runtime=args.runtime,
        max_sessions=args.max_sessions,
        idle_timeout_s=args.idle_timeout_s,
        backend=args.backend,
        workers=args.workers,
        limit=args.limit,
        busy=getattr(args, "busy", None),
    )


def _replay(args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    if getattr(args, "busy", None) is not None:
        return _replay_busy(args, out, err)
    from lanequeue.replay import TraceError, read_trace, run_replay
    from lanequeue.replay.plot import write_plot
    from lanequeue.replay.runtimes.redis_processes import BackendError, check_backend
    from lanequeue.replay.trace import service_times_us

    fail = _failing("replay", args, err)

    # Check everything that can fail before spending a minute on the replay.
    try:
        config = _replay_config(args)
    except ValueError as exc:
        return fail(_refused(exc, args), usage=True)
    refused = _output_refused(args)
    if refused:
        return fail(refused, usage=True)
    if args.metrics_port is not None:
        if not 0 <= args.metrics_port <= 65535:
            typed = getattr(args, "typed", {}).get("metrics_port") or str(args.metrics_port)
            return fail(_refusal("argument --metrics-port: must be a port number from 0 to "
                                 "65535", typed), usage=True)
        if args.backend is not None:
            return fail(_not_allowed("--metrics-port", "--backend", "it serves in-process "
                                     "lanes; the lanes of --backend live in the worker "
                                     "processes"), usage=True)
        if importlib.util.find_spec("prometheus_client") is None:
            return fail("--metrics-port needs prometheus_client, which is not installed; "
                        f"install it with: {install_hint('prometheus')}")
    if args.backend is not None:
        try:
            check_backend(args.backend)
        except BackendError as exc:
            return fail(f"argument --backend: {exc}")
    try:
        trace = read_trace(args.trace, trace_format="auto")
    except (ValueError, TraceError) as exc:
        return fail(str(exc))
    refused = _check_lines(trace, args.max_bad_lines, err, "replay")
    if refused:
        return fail(refused)
    trace = trace.head(config.limit)
    try:
        service_times_us(trace, config.tpot_ms)  # a generic trace's tokens need tpot_ms
    except ValueError as exc:
        return fail(_refused(exc, args), usage=True)

    queues: list[Any] = []  # the in-process queue, once the runtime has built it
    on_queue = queues.append if args.backend is None else None
    server = None
    if args.metrics_port is not None:
        try:
            server, on_queue = _serve_metrics(args.metrics_port, queues, err)
        except OSError as exc:  # the port is taken, or not ours to listen on
            return fail(f"argument --metrics-port: cannot listen on 127.0.0.1:"
                        f"{args.metrics_port}: {exc.strerror or exc}")
    bar = _progress_bar(len(trace.requests), not args.no_progress, err)
    try:
        if bar is not None:

            def progress(done: int, total: int) -> None:
                bar.update(done - bar.n)
        else:
            progress = None  # type: ignore[assignment]
        result = run_replay(trace, config, progress=progress, on_queue=on_queue)
    except BackendError as exc:
        return fail(str(exc))
    finally:
        if bar is not None:
            bar.close()
        if server is not None:
            server.shutdown()
            server.server_close()

    report = result.report
    print(report.table(), file=out)
    if args.json_path is not None:
        report.write_json(args.json_path)
        print(f"\nwrote {args.json_path}", file=out)
    if args.plot_path is not None:
        lanes = [m for lane in _lanes_of(queues) for m in lane.metrics_snapshot()]
        write_plot(result, args.plot_path, lane_metrics=lanes or None)
        print(f"wrote {args.plot_path}", file=out)
    for rid, error in result.record.errors[:MAX_LINE_MESSAGES]:
        print(f"lanequeue replay: request {rid} failed: {error}", file=err)
    failed = report.failed_checks()
    if failed:
        print("\nchecks FAILED: " + "; ".join(failed), file=out)
        return 1
    print(
        f"\nchecks passed: order kept in every conversation, at most one request per "
        f"conversation at a time, at most {report.cap_at_once} at once"
        + (" (the policy's single permit)" if report.cap_at_once < report.global_cap else ""),
        file=out,
    )
    return 0


def _plan(args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    from lanequeue._errors import counted
    from lanequeue.replay._figures import exact_text
    from lanequeue.replay.plan import (
        PlanGoal,
        check_plan_arguments,
        plan_capacity,
        verify_plan,
        write_plan_plot,
    )
    from lanequeue.replay.trace import TraceError, read_trace

    fail = _failing("plan", args, err)

    # Every setting is checked before the trace is read (and --speed before a simulation).
    try:
        goal = PlanGoal(args.p99_wait_s, args.max_wait_s)
        check_plan_arguments(
            tpot_ms=args.tpot_ms,
            min_global=args.min_global,
            max_global=args.max_global,
            jobs=args.jobs,
            speed=args.speed,
        )
    except ValueError as exc:
        return fail(_refused(exc, args), usage=True)

    refused = _output_refused(args)
    if refused:
        return fail(refused, usage=True)
    try:
        trace = read_trace(args.trace, trace_format="auto")
    except (ValueError, TraceError) as exc:
        return fail(str(exc))
    refused = _check_lines(trace, args.max_bad_lines, err, "plan")
    if refused:
        return fail(refused)
    try:
        plan = plan_capacity(
            trace,
            goal,
            tpot_ms=args.tpot_ms,
            min_global=args.min_global,
            max_global=args.max_global,
            jobs=args.jobs,
        )
    except ValueError as exc:
        return fail(_refused(exc, args), usage=True)
    print(plan.text(), file=out)
    if args.json_path is not None:
        plan.write_json(args.json_path)
        print(f"\nwrote {args.json_path}", file=out)
    if args.plot_path is not None:
        write_plan_plot(plan, args.plot_path)
        print(f"wrote {args.plot_path}", file=out)
    if plan.recommended_global is None:
        return 3
    if args.verify:
        last = trace.requests[-1].timestamp_ms - trace.requests[0].timestamp_ms
        print(
            f"\nverify: replaying {counted(plan.requests, 'request')} at global cap "
            f"{plan.recommended_global}, speed {exact_text(args.speed)}x (arrivals over "
            f"{last / 1000 / args.speed:.1f} s) ...",
            file=out,
            flush=True,
        )
        check = verify_plan(
            trace, plan.recommended_global, tpot_ms=args.tpot_ms, speed=args.speed, goal=goal
        )
        print(check.text(), file=out)
        failed = check.failed_checks()
        if failed:
            print("checks FAILED: " + "; ".join(failed), file=out)
            return 1
    return 0


def _add_status_parser(sub: Any) -> None:
    sp = sub.add_parser(
        "status",
        help="show every lane in a Redis: holders, leases, fencing tokens, lines",
        description=(
            "A live view of the lanes in one Redis: per lane its kind, holders (key, "
            "fencing token, lease left), live waiters in line per key, and the oldest wait "
            "seen. Finds the keys with SCAN (never KEYS) and only reads. --json prints one "
            "document (no extra needed); the table and --watch need rich "
            f"({install_hint('cli')})."
        ),
    )
    sp.add_argument("--backend", required=True, metavar="redis://HOST:PORT/DB",
                    help="the Redis to read (a redis:// or rediss:// URL)")
    sp.add_argument("--prefix", type=_status_prefix, default=None, metavar="P",
                    help="only the lanes of this key prefix, a non-empty one as the lanes "
                         "were given (default: every prefix)")
    form = sp.add_mutually_exclusive_group()
    form.add_argument("--watch", action="store_true",
                      help="refresh the table every --interval seconds until "
                           "interrupted: in place on a terminal; piped or redirected, "
                           "each refresh printed whole after the last. A read that "
                           "fails for a while (Redis unreachable, restarting, not "
                           "answering) is shown in the table's place and retried; one "
                           "that cannot heal (a wrong password) exits with status 2")
    form.add_argument("--json", action="store_true", help="print one JSON document")
    sp.add_argument("--interval", type=_status_interval, default=None, metavar="S",
                    help="seconds between refreshes, only with --watch (default 1.0; from "
                         "0.1 to 3600)")
    sp.set_defaults(usage_error=sp.error)
    _take_negative_values(sp)


def _status_prefix(text: str) -> str:
    """``--prefix``: a prefix a Redis lane can have (non-empty, no ``{`` or ``}``): one
    no lane can have would only show an empty table."""
    try:
        from lanequeue.redis._args import check_prefix
    except ImportError:  # no redis-py: the command says so once the arguments are read
        return text
    try:
        return check_prefix(text, "a lane prefix")
    except ValueError as exc:
        raise argparse.ArgumentTypeError(
            f"{exc} (omit --prefix for the lanes of every prefix)") from None


def _status_interval(text: str) -> float:
    """``--interval``: seconds from ``STATUS_MIN_INTERVAL_S`` to ``STATUS_MAX_INTERVAL_S``,
    read as every number option (:func:`_float`)."""
    value = _float(text)
    if not STATUS_MIN_INTERVAL_S <= value <= STATUS_MAX_INTERVAL_S:  # (NaN fails too)
        raise argparse.ArgumentTypeError(_refusal(
            f"must be from {STATUS_MIN_INTERVAL_S:g} to {STATUS_MAX_INTERVAL_S:g} seconds",
            text))
    return value


def _status_usage(args: argparse.Namespace) -> str | None:
    """What no single option's check sees: ``--interval`` given without ``--watch``
    (nothing would use it)."""
    if args.interval is not None and not args.watch:
        return "argument --interval: only with --watch (the seconds between its redraws)"
    return None


def main(argv: Sequence[str] | None = None) -> int:
    """Run the ``lanequeue`` command with ``argv`` (default ``sys.argv[1:]``); return the
    exit status (0 success, 1 a replay check failed or ``status``'s output pipe was
    closed, 2 bad arguments or input, 3 no cap meets a ``plan`` goal)."""
    parser = build_parser()
    args, extra = parser.parse_known_args(argv)
    if extra:  # said by the command's own parser: its usage line, its name
        error = getattr(args, "usage_error", parser.error)
        error(f"unrecognized arguments: {' '.join(extra)}")
    if args.command == "replay":
        try:
            return _replay(args, sys.stdout, sys.stderr)
        except KeyboardInterrupt:
            print("lanequeue replay: interrupted", file=sys.stderr)
            return 130
    if args.command == "plan":
        try:
            return _plan(args, sys.stdout, sys.stderr)
        except KeyboardInterrupt:
            print("lanequeue plan: interrupted", file=sys.stderr)
            return 130
    if args.command == "status":
        refused = _status_usage(args)
        if refused:
            args.usage_error(refused)  # exits with status 2, after the usage line
        try:
            from lanequeue.redis._status import run_status
        except ImportError as exc:  # redis-py is not installed
            print(f"lanequeue status: {exc}", file=sys.stderr)
            return 2
        if args.interval is None:
            args.interval = STATUS_DEFAULT_INTERVAL_S
        return run_status(args, sys.stdout, sys.stderr)
    parser.print_help(sys.stderr)
    return 2
