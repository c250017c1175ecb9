"""``plan`` section: how long capacity planning takes, and the simulation's cost per request.

Figures:

- a full ``lanequeue plan`` of the bundled trace (12,031 requests; goal p99 <= 2 s):
  reading the trace plus planning, seconds (goal: under 5 s);
- a plan over a synthetic trace of ``--requests`` requests in ``requests / 10``
  conversations, written as a generic JSON-lines file (gzip) and read back like an
  operator's export: reading and planning, seconds, on the usable cores (goal for
  1,000,000 requests: under 5 minutes);
- the simulation's cost per request: one simulation of the synthetic trace at the
  recommended cap, in microseconds per request, on the integer-tick core
  (``simulate_ticks``) and on the exact Fraction interface (``simulate``) of the same
  schedule (the Fraction figure from the first 100,000 requests).

The synthetic trace: conversations start uniformly over the horizon; each sends a
Poisson number of messages (mean 10), spaced by exponential think times (mean 60 s);
service times are log-normal (median 5 s, mean about 7.5 s, at most 120 s); the horizon
is chosen for an offered load of about 100 requests working at once.

The default size keeps ``run.py`` short (100,000 requests; 20,000 with ``--quick``). For
the 1,000,000-request figure (a few minutes)::

    python benchmarks/bench_plan.py --requests 1000000
    LANEQUEUE_BENCH_PLAN_REQUESTS=1000000 python benchmarks/run.py --only plan
"""

from __future__ import annotations

import argparse
import gzip
import json
import math
import os
import random
import sys
import tempfile
import time
from pathlib import Path

_HERE = Path(__file__).resolve().parent
if str(_HERE) not in sys.path:
    sys.path.insert(0, str(_HERE))
try:
    import lanequeue  # noqa: F401
except ImportError:  # not installed: use the source tree
    sys.path.insert(0, str(_HERE.parent / "src"))

from bench_common import Config, Row, verdict  # noqa: E402

from lanequeue.replay import policy_lanes, read_trace, simulate  # noqa: E402
from lanequeue.replay.plan import PlanGoal, plan_capacity, plan_inputs  # noqa: E402
from lanequeue.replay.simulate import simulate_ticks  # noqa: E402

BUNDLED_GOAL_S = 5.0
MILLION_GOAL_S = 300.0
ENV_SIZE = "LANEQUEUE_BENCH_PLAN_REQUESTS"
OFFERED_LOAD = 100  # requests working at once, on average
MEAN_WORK_S = 5.0 * math.exp(0.9**2 / 2)  # log-normal, median 5 s, sigma 0.9


def synthetic_rows(requests: int, seed: int = 7) -> list[tuple[float, str, float]]:
    """``requests`` rows (timestamp_s, key, duration_s) in ``requests // 10``
    conversations (see the module docstring), in no particular order."""
    rng = random.Random(seed)
    conversations = max(1, requests // 10)
    horizon = requests * MEAN_WORK_S / OFFERED_LOAD
    rows: list[tuple[float, str, float]] = []
    left = requests
    for c in range(conversations):
        turns = left if c == conversations - 1 else min(left, _poisson(rng, 10))
        left -= turns
        t = rng.uniform(0, horizon)
        for _ in range(turns):
            work = min(120.0, rng.lognormvariate(math.log(5.0), 0.9))
            rows.append((round(t, 3), f"conv-{c}", round(work, 3)))
            t += work + rng.expovariate(1 / 60)
        if left == 0:
            break
    return rows


def _poisson(rng: random.Random, mean: float) -> int:
    limit, k, p = math.exp(-mean), 0, 1.0
    while True:
        p *= rng.random()
        if p <= limit:
            return k
        k += 1


def write_generic(path: Path, rows: list[tuple[float, str, float]]) -> None:
    with gzip.open(path, "wt", encoding="utf-8", compresslevel=1) as f:
        for t, key, d in rows:
            f.write(json.dumps({"timestamp": t, "key": key, "duration_s": d}) + "\n")


def _size(cfg: Config) -> int:
    env = os.environ.get(ENV_SIZE)
    if env:
        return int(env)
    return 20_000 if cfg.quick else 100_000


def measure(requests: int) -> list[Row]:
    rows: list[Row] = []

    t0 = time.perf_counter()
    trace = read_trace()
    plan = plan_capacity(trace, PlanGoal(2))
    took = time.perf_counter() - t0
    rows.append(Row(
        "plan", "bundled trace (12,031 req): read + plan, p99 <= 2 s", took, "s",
        f"recommended {plan.recommended_global}, {plan.simulations} simulations, "
        f"{plan.jobs} process(es)",
        goal=f"<= {BUNDLED_GOAL_S:g}", status=verdict(took, BUNDLED_GOAL_S),
        data={"simulations": plan.simulations, "recommended": plan.recommended_global},
    ))

    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "synthetic.jsonl.gz"
        t0 = time.perf_counter()
        write_generic(path, synthetic_rows(requests))
        made = time.perf_counter() - t0
        t0 = time.perf_counter()
        big = read_trace(path, trace_format="auto")
        read_s = time.perf_counter() - t0
    goal = PlanGoal(5)
    t0 = time.perf_counter()
    plan = plan_capacity(big, goal)
    plan_s = time.perf_counter() - t0
    total = read_s + plan_s
    is_million = requests >= 1_000_000
    rows.append(Row(
        "plan", f"synthetic {requests:,} req / {big.conversations:,} conv: read + plan", total,
        "s",
        f"read {read_s:.1f} s, plan {plan_s:.1f} s ({plan.simulations} simulations, "
        f"{plan.jobs} process{'es' if plan.jobs != 1 else ''}; caps below "
        f"{plan.proven_below} by bound); recommended "
        f"{plan.recommended_global}, saturation {plan.saturation_global}; trace written in "
        f"{made:.0f} s",
        goal=f"<= {MILLION_GOAL_S:g}" if is_million else None,
        status=verdict(total, MILLION_GOAL_S) if is_million else None,
        data={"read_s": read_s, "plan_s": plan_s, "simulations": plan.simulations,
              "proven_below": plan.proven_below, "recommended": plan.recommended_global,
              "saturation": plan.saturation_global, "jobs": plan.jobs},
    ))

    inputs = plan_inputs(big)
    cap = plan.recommended_global or plan.saturation_global
    lanes = policy_lanes("session", cap)
    t0 = time.perf_counter()
    simulate_ticks(inputs.arrival, inputs.keys, inputs.work, lanes)
    ticks_us = (time.perf_counter() - t0) / len(inputs.arrival) * 1e6
    m = min(100_000, len(inputs.arrival))
    t0 = time.perf_counter()
    simulate(inputs.arrival[:m], inputs.keys[:m], inputs.work[:m], lanes)
    exact_us = (time.perf_counter() - t0) / m * 1e6
    rows.append(Row(
        "plan", f"one simulation, integer ticks ({len(inputs.arrival):,} req)", ticks_us,
        "us/req", f"{ticks_us * len(inputs.arrival) / 1e6:.1f} s for the whole trace",
    ))
    rows.append(Row(
        "plan", f"one simulation, exact Fractions ({m:,} req)", exact_us, "us/req",
        f"x{exact_us / ticks_us:.1f} the integer-tick cost",
    ))
    return rows


def section_plan(cfg: Config) -> list[Row]:
    """The plan section at the configured size (see the module docstring)."""
    return measure(_size(cfg))


def main(argv: list[str] | None = None) -> int:
    from bench_common import format_row, format_table_header

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--requests", type=int, default=1_000_000,
                    help="size of the synthetic trace (default 1,000,000)")
    args = ap.parse_args(argv)
    print(format_table_header(), flush=True)
    for row in measure(args.requests):
        print(format_row(row), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
