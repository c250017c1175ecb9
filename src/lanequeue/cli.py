"""The ``lanequeue`` command line (also ``python -m lanequeue``).

``lanequeue replay`` drives a real production trace through the lanes and reports what
happened: per-conversation order kept, conversations in parallel, the global cap respected,
waits measured against an exact simulation. Run ``lanequeue replay --help`` for options.

Exit status: 0 when the replay ran and every check held; 1 when a check failed (order
violated, two requests of one conversation at once, the global cap exceeded, a request
failed); 2 for bad arguments, an unreadable trace, or a backend that cannot be used (bad
URL, server unreachable, a worker process that failed).
"""

from __future__ import annotations

import argparse
import importlib
import math
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, TextIO

__all__ = ["build_parser", "main"]

_MAX_SKIP_MESSAGES = 20


def _positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if not (value > 0 and math.isfinite(value)):
        raise argparse.ArgumentTypeError(f"must be a finite number > 0, got {text}")
    return value


def _nonneg_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if not (value >= 0 and math.isfinite(value)):
        raise argparse.ArgumentTypeError(f"must be a finite number >= 0, got {text}")
    return value


def _int_at_least(low: int) -> Callable[[str], int]:
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"not an integer: {text!r}") from None
        if value < low:
            raise argparse.ArgumentTypeError(f"must be >= {low}, got {value}")
        return value

    return parse


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of the ``lanequeue`` command."""
    from lanequeue.replay.policy import DEFAULT_POLICY, POLICIES
    from lanequeue.replay.runtime import RUNTIMES

    parser = argparse.ArgumentParser(
        prog="lanequeue",
        description="Per-key FIFO lanes with global caps: tools around the lanequeue library.",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    rp = sub.add_parser(
        "replay",
        help="drive a production request trace through real lanes and measure it",
        description=(
            "Replay a request trace through real lanes, on real threads or asyncio tasks. "
            "Each request arrives at its trace time / SPEED, takes the lanes "
            "['session', 'global'] with acquire_all under its conversation's key, works for "
            "output_length * TPOT_MS / SPEED milliseconds, then releases. Reports waits, "
            "order and concurrency as the workers observed them, next to an exact "
            "simulation of the same policy."
        ),
    )
    rp.add_argument(
        "trace",
        nargs="?",
        default=None,
        metavar="TRACE",
        help="trace file, JSON lines, plain or gzip (default: the bundled Mooncake trace, "
        "12,031 requests from one hour of a production LLM chat service)",
    )
    rp.add_argument(
        "--speed",
        type=_positive_float,
        default=60.0,
        help="divide trace time by this (default 60: the hour plays in a minute)",
    )
    rp.add_argument(
        "--tpot-ms",
        type=_nonneg_float,
        default=30.0,
        metavar="MS",
        help="work per output token, trace milliseconds (default 30)",
    )
    rp.add_argument(
        "--global",
        dest="global_cap",
        type=_int_at_least(1),
        default=64,
        metavar="N",
        help="permits of the global lane (default 64)",
    )
    rp.add_argument(
        "--policy",
        choices=POLICIES,
        default=DEFAULT_POLICY,
        help="session: SessionLane per conversation (default); global-serial: "
        "the original Lane('session', max_concurrent=1), which serialises "
        "everything (slow: combine with --limit)",
    )
    rp.add_argument(
        "--limit",
        type=_int_at_least(0),
        default=None,
        metavar="N",
        help="replay only the first N requests (in arrival order)",
    )
    rp.add_argument(
        "--runtime",
        default="threads",
        metavar="NAME",
        help=f"how requests run: {', '.join(sorted(RUNTIMES))} (default threads): "
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
        type=_int_at_least(1),
        default=None,
        metavar="N",
        help="with --backend: worker processes, each running the threads runtime; "
        "request i goes to worker i mod N, so a conversation's messages reach different "
        "processes (default 1)",
    )
    rp.add_argument(
        "--max-sessions",
        type=_int_at_least(1),
        default=256,
        metavar="N",
        help="soft cap of the session lane's registry (default 256)",
    )
    rp.add_argument(
        "--idle-timeout",
        type=_nonneg_float,
        default=3600.0,
        metavar="S",
        help="seconds of trace time an idle session entry is kept, scaled by "
        "--speed like every duration (default 3600)",
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
        help="write a PNG of concurrency over time and the wait distribution "
        "(needs matplotlib: pip install 'lanequeue[plot]')",
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
    return parser


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


def _report_skipped(skipped: Sequence[Any], source: str, err: TextIO) -> None:
    for s in skipped[:_MAX_SKIP_MESSAGES]:
        print(f"lanequeue replay: {source}: line {s.line}: {s.reason}; skipped", file=err)
    if len(skipped) > _MAX_SKIP_MESSAGES:
        print(
            f"lanequeue replay: ... and {len(skipped) - _MAX_SKIP_MESSAGES} more "
            "invalid lines skipped",
            file=err,
        )
    if skipped:
        print(f"lanequeue replay: {len(skipped)} invalid lines skipped", file=err)


def _replay_busy(args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    """``replay --busy``: the trace through a Dispatcher, one run per policy."""
    from lanequeue.dispatch import BUSY_POLICIES
    from lanequeue.replay import TraceError, read_trace
    from lanequeue.replay.busy import busy_table, ideal_waits, run_busy

    def fail(message: str) -> int:
        print(f"lanequeue replay: error: {message}", file=err)
        return 2

    policies = list(BUSY_POLICIES) if args.busy == "all" else args.busy.split(",")
    for p in policies:
        if p not in BUSY_POLICIES:
            return fail(f"unknown busy policy {p!r}; available: {', '.join(BUSY_POLICIES)}"
                        ", or all")
    if args.backend is not None or args.workers is not None:
        return fail("--busy runs one process on asyncio: it cannot be combined with "
                    "--backend or --workers")
    for path in (args.json_path, args.plot_path):
        if path is not None:
            return fail(f"--busy prints a table only: {path} would not be written")
    try:
        trace = read_trace(args.trace)
    except (ValueError, TraceError) as exc:
        return fail(str(exc))
    _report_skipped(trace.skipped, trace.source, err)
    trace = trace.head(args.limit)
    if not trace.requests:
        return fail(f"no valid request to replay in {trace.source}")
    results = []
    for p in policies:
        results.append(run_busy(trace, p, speed=args.speed, tpot_ms=args.tpot_ms,
                                global_cap=args.global_cap, max_sessions=args.max_sessions))
    ideal = None
    if "enqueue" in policies:
        ideal = ideal_waits(trace, speed=args.speed, tpot_ms=args.tpot_ms,
                            global_cap=args.global_cap)
    print(busy_table(results, ideal), file=out)
    bad = [r.policy for r in results if r.overlaps or r.order_violations]
    if bad:
        print(f"\nchecks FAILED for: {', '.join(bad)}", file=out)
        return 1
    print("\nchecks passed: one call per conversation at a time, each conversation's "
          "requests begun in arrival order", file=out)
    return 0


def _replay(args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    if getattr(args, "busy", None) is not None:
        return _replay_busy(args, out, err)
    from lanequeue.replay import ReplayConfig, TraceError, read_trace, run_replay
    from lanequeue.replay.plot import PlotUnavailableError, require_matplotlib, write_plot
    from lanequeue.replay.runtime import RUNTIMES
    from lanequeue.replay.runtime_redis import BackendError, check_backend

    def fail(message: str) -> int:
        print(f"lanequeue replay: error: {message}", file=err)
        return 2

    if args.runtime not in RUNTIMES:
        return fail(f"unknown runtime {args.runtime!r}; available: {', '.join(sorted(RUNTIMES))}")
    if args.workers is not None and args.backend is None:
        return fail(
            "--workers needs --backend: worker processes share lanes only through a "
            "backend (e.g. --backend redis://127.0.0.1:6379/0)"
        )
    if args.backend is not None and args.runtime != "threads":
        return fail(
            f"--runtime {args.runtime} cannot be used with --backend: each worker process "
            "runs the threads runtime on the Redis lanes"
        )
    # Check everything that can fail before spending a minute on the replay.
    if args.plot_path is not None:
        try:
            require_matplotlib()
        except PlotUnavailableError as exc:
            return fail(str(exc))
    for path in (args.json_path, args.plot_path):
        if path is None:
            continue
        if path.is_dir():
            return fail(f"cannot write {path}: it is a directory; give a file name")
        if not path.resolve().parent.is_dir():
            return fail(f"cannot write {path}: directory {path.parent} does not exist")
    if args.plot_path is not None and args.plot_path.suffix.lower() != ".png":
        return fail(f"--plot writes a PNG: give a file name ending in .png, not {args.plot_path}")
    try:
        config = ReplayConfig(
            policy=args.policy,
            global_cap=args.global_cap,
            speed=args.speed,
            tpot_ms=args.tpot_ms,
            runtime=args.runtime,
            max_sessions=args.max_sessions,
            idle_timeout_s=args.idle_timeout,
            backend=args.backend,
            workers=1 if args.workers is None else args.workers,
        )
        trace = read_trace(args.trace)
    except (ValueError, TraceError) as exc:
        return fail(str(exc))
    if args.backend is not None:
        try:
            check_backend(args.backend)
        except BackendError as exc:
            return fail(str(exc))
    _report_skipped(trace.skipped, trace.source, err)
    trace = trace.head(args.limit)
    if not trace.requests:
        return fail(f"no valid request to replay in {trace.source}")

    bar = _progress_bar(len(trace.requests), not args.no_progress, err)
    try:
        if bar is not None:

            def progress(done: int, total: int) -> None:
                bar.update(done - bar.n)
        else:
            progress = None  # type: ignore[assignment]
        result = run_replay(trace, config, progress=progress)
    except BackendError as exc:
        return fail(str(exc))
    finally:
        if bar is not None:
            bar.close()

    report = result.report
    print(report.table(), file=out)
    if args.json_path is not None:
        report.write_json(args.json_path)
        print(f"\nwrote {args.json_path}", file=out)
    if args.plot_path is not None:
        write_plot(result, args.plot_path)
        print(f"wrote {args.plot_path}", file=out)
    for rid, error in result.record.errors[:_MAX_SKIP_MESSAGES]:
        print(f"lanequeue replay: request {rid} failed: {error}", file=err)
    failed = report.failed_checks()
    if failed:
        print("\nchecks FAILED: " + "; ".join(failed), file=out)
        return 1
    print(
        f"\nchecks passed: order kept in every conversation, at most one request per "
        f"conversation at a time, at most {report.global_cap} at once",
        file=out,
    )
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """Run the ``lanequeue`` command with ``argv`` (default ``sys.argv[1:]``); return the
    exit status (0 success, 1 a replay check failed, 2 bad arguments or input)."""
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command == "replay":
        try:
            return _replay(args, sys.stdout, sys.stderr)
        except KeyboardInterrupt:
            print("lanequeue replay: interrupted", file=sys.stderr)
            return 130
    parser.print_help(sys.stderr)
    return 2
