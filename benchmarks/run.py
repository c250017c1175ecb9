"""lanequeue benchmarks: one command, one table.

    python benchmarks/run.py                  # full run (about a minute and a half)
    python benchmarks/run.py --quick          # short run (smoke test)
    python benchmarks/run.py --only redis     # ours vs redis-py's Lock (own redis-server)
    python benchmarks/run.py --only handoff   # one section (repeat --only for more)
    python benchmarks/run.py --only contended --only scaling   # issue 12's rows
    python benchmarks/run.py --only replay    # replay speed per runtime, library CPU
    python benchmarks/run.py --json out.json  # also write the figures as JSON

Every figure of a run is measured in the same process, interleaved with its baselines, so
ratios stay meaningful on a shared, noisy machine. Goals are printed as PASS/MISS and never
asserted: the exit status is 0 unless a section crashed. See benchmarks/README.md.

To add a section: write ``def section_x(cfg: Config) -> list[Row]`` in a
``bench_*.py`` module and register it in :data:`SECTIONS`.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
import traceback
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path

_HERE = Path(__file__).resolve().parent
if str(_HERE) not in sys.path:
    sys.path.insert(0, str(_HERE))
try:
    import lanequeue  # noqa: F401
except ImportError:  # not installed: use the source tree
    sys.path.insert(0, str(_HERE.parent / "src"))

from bench_async import section_asyncio  # noqa: E402
from bench_common import Config, Row, format_row, format_table_header, machine_info  # noqa: E402
from bench_plan import section_plan  # noqa: E402
from bench_redis import redis_sizes, section_redis  # noqa: E402
from bench_replay import section_replay  # noqa: E402
from bench_scale import section_contended, section_scaling  # noqa: E402
from bench_threads import (  # noqa: E402
    section_handoff,
    section_memory,
    section_uncontended,
)

#: name -> (what it measures, function). Printed in this order.
SECTIONS: dict[str, tuple[str, Callable[[Config], list[Row]]]] = {
    "uncontended": ("threads: ns per uncontended acquire+release, vs Lock and seed",
                    section_uncontended),
    "handoff": ("threads: two threads handing one key back and forth", section_handoff),
    "memory": ("threads: registry size under 100k keys, bytes per idle entry",
               section_memory),
    "asyncio": ("asyncio: ns per uncontended async with, and two tasks handing one key over",
                section_asyncio),
    "contended": ("threads and tasks contending: acq/s vs locks, one key and many keys "
                  "with a global lane", section_contended),
    "scaling": ("cost per unit as live keys, waiters and lanes grow (super-linear growth "
                "flagged)", section_scaling),
    "redis": ("redis: acquire+release per second vs redis-py's Lock, and fairness of many "
              "processes on one key (private redis-server)", section_redis),
    "plan": ("plan: lanequeue plan on the bundled trace and a synthetic one "
             "(LANEQUEUE_BENCH_PLAN_REQUESTS=1000000 for the 1M figure)", section_plan),
    "replay": ("replay: highest --speed keeping makespan_ratio <= 1.05 (2 of 2 runs) per "
               "runtime, and the library's CPU per replayed request", section_replay),
}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter,
                                 epilog="sections: " + ", ".join(SECTIONS))
    ap.add_argument("--quick", action="store_true", help="short run (smoke test, ~10 s)")
    ap.add_argument("--json", metavar="PATH", help="also write the figures as JSON to PATH")
    ap.add_argument("--only", metavar="SECTION", action="append", choices=list(SECTIONS),
                    help="run only this section (repeatable)")
    args = ap.parse_args(argv)

    cfg = Config.make(args.quick)
    chosen = args.only or list(SECTIONS)
    chosen = [s for s in SECTIONS if s in chosen]
    machine = machine_info()
    t_start = time.perf_counter()
    rs = redis_sizes(cfg)

    print("lanequeue benchmarks" + ("  (--quick)" if cfg.quick else ""))
    print(f"machine: {machine['cpu_count']} CPUs ({machine['cpus_usable']} usable), "
          f"{machine['cpu_model']}")
    print(f"python:  {machine['python']} ({machine['platform']}); "
          f"lanequeue {machine['lanequeue_version']}; load avg {machine['loadavg_at_start']}")
    print(f"method:  candidates interleaved in rounds, medians of rounds; uncontended "
          f"{cfg.rounds} rounds x ~{cfg.batch_s * 1000:.0f} ms, hand-off "
          f"{cfg.handoff_rounds} rounds x {cfg.handoff_window_s:.1f} s; cyclic GC paused "
          f"while timing"
          + (f"; asyncio: {cfg.rounds} rounds x ~{cfg.batch_s * 1000:.0f} ms (hand-off "
             f"~{cfg.batch_s * 2000:.0f} ms), all in one event loop run"
             if "asyncio" in chosen else "")
          + (f"; redis: own redis-server, uncontended {rs[0]} rounds x ~{rs[1] * 1000:.0f} "
             f"ms, fairness {rs[2]} processes x {rs[3]:g} s per candidate"
             if "redis" in chosen else ""))
    print()
    print(format_table_header(), flush=True)

    rows: list[Row] = []
    failed = False
    timings: dict[str, float] = {}
    for name in chosen:
        _, fn = SECTIONS[name]
        t0 = time.perf_counter()
        try:
            got = fn(cfg)
        except Exception as exc:  # report and go on with the other sections
            traceback.print_exc()
            got = [Row(name, "section crashed", None, "", f"{type(exc).__name__}: {exc}",
                       status="ERROR")]
            failed = True
        timings[name] = time.perf_counter() - t0
        for r in got:
            print(format_row(r), flush=True)
        rows.extend(got)

    elapsed = time.perf_counter() - t_start
    goals = [r for r in rows if r.status in ("PASS", "MISS")]
    print()
    print(f"goals: {sum(r.status == 'PASS' for r in goals)} PASS, "
          f"{sum(r.status == 'MISS' for r in goals)} MISS"
          + "".join(f"\n  {r.status}  {r.name.strip()}: {r.value:.3g} (goal {r.goal})"
                    for r in goals))
    try:
        load_end = [round(x, 2) for x in os.getloadavg()]
    except (AttributeError, OSError):
        load_end = None
    print(f"elapsed {elapsed:.1f} s; load avg at end {load_end}")

    if args.json:
        machine["loadavg_at_end"] = load_end
        doc = {
            "schema": 1,
            "machine": machine,
            "config": asdict(cfg),
            "sections": {n: {"about": SECTIONS[n][0], "elapsed_s": round(timings[n], 3)}
                         for n in chosen},
            "rows": [asdict(r) for r in rows],
            "goals": [{"name": r.name.strip(), "value": r.value, "goal": r.goal,
                       "status": r.status} for r in goals],
            "elapsed_s": round(elapsed, 3),
        }
        Path(args.json).write_text(json.dumps(doc, indent=2) + "\n", encoding="utf-8")
        print(f"wrote {args.json}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
