"""``lanequeue replay --runtime asyncio``: the replay on asyncio tasks and the async lanes."""

from __future__ import annotations

import asyncio
import json
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

from lanequeue import AsyncLaneQueue
from lanequeue.cli import main
from lanequeue.replay import (
    RUNTIMES,
    ReplayConfig,
    Trace,
    get_runtime,
    make_plan,
    parse_trace_lines,
    read_trace,
    run_replay,
)
from lanequeue.replay.runtimes import aio as aio_mod
from lanequeue.replay.runtimes.aio import AsyncioRuntime, build_async_queue


def line(ts: int, out: int, conv: int, inp: int = 100) -> str:
    return json.dumps(
        {"timestamp": ts, "input_length": inp, "output_length": out, "hash_ids": [0, conv, 7]}
    )


def make_trace(rows: Sequence[tuple[int, int, int]]) -> Trace:
    """A trace from (timestamp_ms, output_length, conversation) rows."""
    return parse_trace_lines([line(ts, out, conv) for ts, out, conv in rows], source="test")


def asyncio_config(**kw: Any) -> ReplayConfig:
    return ReplayConfig(runtime="asyncio", **kw)


def test_asyncio_is_a_registered_runtime() -> None:
    assert sorted(RUNTIMES) == ["asyncio", "threads"]
    runtime = get_runtime("asyncio")
    assert isinstance(runtime, AsyncioRuntime) and runtime.name == "asyncio"


@pytest.mark.timeout(60)
def test_asyncio_replay_of_trace_head_keeps_order_and_caps() -> None:
    trace = read_trace().head(400)
    cap = 8
    # 400 requests span ~2 min of trace; at 3000x they arrive within ~40 ms and work ~1
    # ms per 100 tokens: the cap of 8 is saturated and many wait, in both lanes.
    result = run_replay(trace, asyncio_config(global_cap=cap, speed=3000, tpot_ms=300))
    rep = result.report
    assert rep.runtime == "asyncio"
    assert rep.requests == 400 and rep.errors == 0, result.record.errors[:5]
    assert rep.order_violations == 0
    assert rep.max_key_concurrency == 1
    assert 1 <= rep.peak_global <= cap
    assert rep.peak_global == cap  # the cap was reached: the test exercised it
    assert rep.wait_max_s > 0
    assert rep.failed_checks() == []
    assert rep.registry_peak is not None and rep.registry_final is not None
    assert rep.gate_held_back == 0 and rep.worker_threads == 0  # no gate, no threads
    assert rep.lane_stats["session"]["acquired"] == 400
    assert rep.lane_stats["global"]["released"] == 400
    rec = result.record
    assert all(not math.isnan(t) for t in rec.complete_s)
    assert sorted(rec.start_order) == list(range(400))
    # Dispatch never runs ahead of the trace (waits are measured from the arrival).
    assert all(d >= a for d, a in zip(rec.dispatch_s, result.plan.arrival_s, strict=True))
    # Every request worked at least its work time.
    assert all(
        c - s >= w - 1e-6
        for s, c, w in zip(rec.start_s, rec.complete_s, result.plan.work_s, strict=True)
    )


@pytest.mark.timeout(60)
def test_asyncio_replay_of_busy_conversations_keeps_their_order() -> None:
    # 6 conversations x 15 turns, all arriving within a few ms: deep lines behind every
    # session lane, and the global cap (4) binding too.
    rows = [(t, 20 + (t * 7) % 30, conv) for t in range(15) for conv in range(6)]
    result = run_replay(make_trace(rows), asyncio_config(global_cap=4, speed=1000, tpot_ms=50))
    rep = result.report
    assert rep.errors == 0
    assert rep.order_violations == 0
    assert rep.max_key_concurrency == 1
    assert rep.peak_global == 4
    assert rep.makespan_ratio is not None and rep.makespan_ratio >= 0.99


@pytest.mark.timeout(60)
def test_asyncio_batch_of_one_conversation_starts_in_arrival_order() -> None:
    # 50 turns of one conversation at the same instant: created in one dispatcher step,
    # they must join the session lane (and so start) in index order, without a gate.
    trace = make_trace([(0, 1, 7)] * 50)
    result = run_replay(trace, asyncio_config(speed=1000, tpot_ms=10))
    assert result.record.start_order == list(range(50))
    assert result.report.order_violations == 0 and result.report.errors == 0


@pytest.mark.timeout(60)
def test_asyncio_lanes_follow_the_simulated_order() -> None:
    # a2 waits on its session lane, b on the global lane (cap 1); b must go first.
    trace = make_trace([(0, 20, 1), (20, 5, 1), (40, 5, 2)])
    result = run_replay(trace, asyncio_config(global_cap=1, speed=1, tpot_ms=10))
    assert result.ideal.start_order == (0, 2, 1)
    assert tuple(result.record.start_order) == (0, 2, 1)
    assert result.report.makespan_s == pytest.approx(result.report.ideal_makespan_s, abs=0.05)


@pytest.mark.timeout(60)
def test_asyncio_replay_global_serial() -> None:
    trace = make_trace([(t, 10, t % 3) for t in range(40)])
    rep = run_replay(trace, asyncio_config(policy="global-serial", speed=1000, tpot_ms=5)).report
    assert rep.peak_global == 1
    assert rep.order_violations == 0 and rep.max_key_concurrency == 1 and rep.errors == 0
    assert rep.registry_peak is None  # no per-key lane in that policy
    assert rep.ideal_makespan_s == pytest.approx(40 * 10 * 5 / 1000 / 1000)


@pytest.mark.timeout(60)
def test_asyncio_measurements_come_from_the_workers(monkeypatch: pytest.MonkeyPatch) -> None:
    # A counting lane of 3 instead of the session lane: the tasks' own counters see it.
    def broken(plan: Any) -> AsyncLaneQueue:
        q = AsyncLaneQueue()
        q.add_lane("session", max_concurrent=3, timeout_s=None)
        q.add_lane("global", max_concurrent=8, timeout_s=None)
        return q

    monkeypatch.setattr(aio_mod, "build_async_queue", broken)
    trace = make_trace([(0, 200, 1)] * 6)
    rep = run_replay(trace, asyncio_config(global_cap=8, speed=1000, tpot_ms=5)).report
    assert rep.max_key_concurrency == 3
    assert "max_key_concurrency = 3 (expected <= 1)" in rep.failed_checks()


@pytest.mark.timeout(60)
def test_asyncio_progress_is_reported() -> None:
    trace = read_trace().head(100)
    seen: list[tuple[int, int]] = []
    runtime = AsyncioRuntime(tick_s=0.005)
    plan = make_plan(trace, asyncio_config(speed=3000))
    record = runtime.run(plan, lambda done, total: seen.append((done, total)))
    assert not record.errors
    assert seen[-1] == (100, 100)
    assert all(total == 100 for _, total in seen)
    done = [d for d, _ in seen]
    assert done == sorted(done) and len(seen) > 2


def test_asyncio_empty_plan() -> None:
    plan = make_plan(make_trace([]), asyncio_config())
    record = AsyncioRuntime().run(plan)
    assert record.start_order == [] and record.errors == [] and record.wall_s >= 0


def test_asyncio_runtime_refuses_a_running_loop() -> None:
    plan = make_plan(make_trace([(0, 1, 1)]), asyncio_config())

    async def inside() -> None:
        AsyncioRuntime().run(plan)

    with pytest.raises(RuntimeError, match="runs its own event loop"):
        asyncio.run(inside())


def test_build_async_queue_registers_the_policy_lanes_in_order() -> None:
    plan = make_plan(
        make_trace([(0, 1, 1)]),
        asyncio_config(global_cap=5, max_sessions=7, idle_timeout_s=None),
    )
    q = build_async_queue(plan)
    assert q.list_lanes() == ["session", "global"]
    assert q["global"].max_concurrent == 5
    assert q["session"].max_sessions == 7 and math.isinf(q["session"].idle_timeout_s)


@pytest.mark.timeout(60)
def test_cli_runtime_asyncio(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "r.json"
    args = ["replay", "--runtime", "asyncio", "--limit", "300", "--speed", "3000"]
    code = main([*args, "--global", "16", "--json", str(out), "--no-progress"])
    printed = capsys.readouterr().out
    assert code == 0, printed
    assert "runtime asyncio" in printed and "checks passed" in printed
    data = json.loads(out.read_text())
    assert data["runtime"] == "asyncio" and data["requests"] == 300
    assert data["order_violations"] == 0
    assert data["max_key_concurrency"] == 1
    assert 1 <= data["peak_global"] <= 16
    assert data["ideal_makespan_s"] > 0 and data["makespan_ratio"] > 0


def test_cli_rejects_an_unknown_runtime(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["replay", "--runtime", "trio", "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert (
        "lanequeue replay: error: argument --runtime: unknown runtime 'trio'; available: "
        "asyncio, threads"
    ) in err
