"""`lanequeue replay`: trace reader, exact simulation, the real runner and the CLI."""

from __future__ import annotations

import gzip
import importlib.metadata
import itertools
import json
import os
import subprocess
import sys
from collections.abc import Sequence
from fractions import Fraction
from pathlib import Path
from typing import Any

import pytest
from conftest import run_cli
from hypothesis import given, settings
from hypothesis import strategies as st

import lanequeue
from lanequeue import LaneQueue
from lanequeue.cli import MAX_LINE_MESSAGES, build_parser, main
from lanequeue.replay import (
    JSON_KEYS,
    ReplayConfig,
    Trace,
    TraceError,
    TraceRequest,
    parse_trace_lines,
    percentile,
    policy_lanes,
    read_trace,
    run_replay,
    session_key,
    simulate,
    simulate_trace,
)
from lanequeue.replay.observe import count_order_violations
from lanequeue.replay.runner import peak_concurrency
from lanequeue.replay.runtimes import threads as threads_mod


def fr(*values: int) -> tuple[Fraction, ...]:
    """Exact times, for comparing with a Schedule."""
    return tuple(Fraction(v) for v in values)


def lanes(policy: str, cap: int) -> Any:
    return policy_lanes(policy, cap)


def line(ts: int, out: int, conv: int, inp: int = 100) -> str:
    return json.dumps(
        {"timestamp": ts, "input_length": inp, "output_length": out, "hash_ids": [0, conv, 7]}
    )


def make_trace(rows: Sequence[tuple[int, int, int]]) -> Trace:
    """A trace from (timestamp_ms, output_length, conversation) rows."""
    return parse_trace_lines([line(ts, out, conv) for ts, out, conv in rows], source="test")


# --------------------------------------------------------------------------------------
# Simulation against hand-computed schedules


@pytest.mark.timeout(10)
def test_sim_conversation_of_three_turns_behind_a_cap_of_one() -> None:
    # One conversation, turns at 0, 1, 2, each working 5: strictly one after the other.
    s = simulate([0, 1, 2], ["a", "a", "a"], [5, 5, 5], lanes("session", 1))
    assert s.start == fr(0, 5, 10)
    assert s.end == fr(5, 10, 15)
    assert s.waits == fr(0, 4, 8)
    assert s.makespan == 15
    assert s.start_order == (0, 1, 2)
    # The session lane is granted at arrival for the first, at each predecessor's end after.
    assert [g[0] for g in s.grants] == [0, 5, 10]


@pytest.mark.timeout(10)
def test_sim_two_conversations_in_parallel() -> None:
    s = simulate([0, 1], ["a", "b"], [4, 4], lanes("session", 2))
    assert s.start == fr(0, 1)
    assert s.end == fr(4, 5)
    assert s.makespan == 5
    # The original single Lane("session", max_concurrent=1) serialises them.
    g = simulate([0, 1], ["a", "b"], [4, 4], lanes("global-serial", 2))
    assert g.start == fr(0, 4)
    assert g.end == fr(4, 8)


@pytest.mark.timeout(10)
def test_sim_cap_makes_the_third_wait() -> None:
    s = simulate([0, 1, 2], ["a", "b", "c"], [10, 10, 10], lanes("session", 2))
    assert s.start == fr(0, 1, 10)
    assert s.end == fr(10, 11, 20)
    assert s.waits == fr(0, 0, 8)
    # The third holds its session lane from its arrival while it waits for "global".
    assert s.grants[2] == fr(2, 10)


@pytest.mark.timeout(10)
def test_sim_session_first_then_global_fifo() -> None:
    # a1 works 0..10 holding "global" (cap 1). a2 (same conversation) arrives at 1 and waits
    # on the SESSION lane, holding nothing. b arrives at 2: its session is free, so it
    # queues on GLOBAL. At 10 a1 releases global first (hand-off to b, the only one queued
    # there), then its session (a2 takes it and queues on global behind b).
    s = simulate([0, 1, 2], ["a", "a", "b"], [10, 5, 5], lanes("session", 1))
    assert s.start == fr(0, 15, 10)
    assert s.end == fr(10, 20, 15)
    assert s.start_order == (0, 2, 1)
    assert s.grants[1] == fr(10, 15)  # session at a1's end, global at b's end
    assert s.grants[2] == fr(2, 10)


@pytest.mark.timeout(10)
def test_sim_completion_before_arrival_at_the_same_instant() -> None:
    # a1 ends at 10 exactly when c arrives. Completions come first: a2 (waiting on the
    # session lane since 5) takes the freed global permit at 10, c queues behind it.
    s = simulate([0, 5, 10], ["a", "a", "c"], [10, 1, 1], lanes("session", 1))
    assert s.start == fr(0, 10, 11)
    assert s.start_order == (0, 1, 2)


@pytest.mark.timeout(10)
def test_sim_simultaneous_arrivals_keep_index_order() -> None:
    s = simulate([3, 3, 3], ["a", "b", "c"], [2, 2, 2], lanes("session", 1))
    assert s.start == fr(3, 5, 7)
    assert s.start_order == (0, 1, 2)


@pytest.mark.timeout(10)
def test_sim_global_serial_orders_every_conversation_by_arrival() -> None:
    s = simulate([0, 0, 1, 1], ["a", "b", "a", "c"], [3, 1, 2, 1], lanes("global-serial", 64))
    assert s.start == fr(0, 3, 4, 6)
    assert s.end == fr(3, 4, 6, 7)


@pytest.mark.timeout(10)
def test_sim_zero_work_and_empty() -> None:
    s = simulate([0, 0], ["a", "a"], [0, 0], lanes("session", 1))
    assert s.start == fr(0, 0) and s.end == fr(0, 0)
    empty = simulate([], [], [], lanes("session", 1))
    assert empty.start == () and empty.makespan == 0


@pytest.mark.timeout(10)
def test_sim_is_exact_with_fractional_times() -> None:
    # 0.1 + 0.2 != 0.3 in floats; the simulation converts exactly, so the tie is a tie.
    s = simulate(
        [Fraction(1, 10), Fraction(3, 10)], ["a", "b"], [Fraction(2, 10), 1], lanes("session", 1)
    )
    assert s.start == (Fraction(1, 10), Fraction(3, 10))


@pytest.mark.timeout(10)
def test_simulate_trace_scales_by_speed_exactly() -> None:
    trace = make_trace([(0, 100, 1), (1000, 50, 1), (1000, 10, 2), (2500, 30, 3)])
    slow = simulate_trace(trace, ReplayConfig(speed=1, tpot_ms=30, global_cap=1))
    fast = simulate_trace(trace, ReplayConfig(speed=60, tpot_ms=30, global_cap=1))
    assert [t / 60 for t in slow.start] == list(fast.start)
    assert slow.start[0] == 0 and slow.end[0] == 3  # 100 tokens * 30 ms = 3 s
    assert slow.start_order == fast.start_order


def _check_schedule(
    arr: list[int], keys: list[int], work: list[int], cap: int, policy: str
) -> None:
    s = simulate(arr, keys, work, lanes(policy, cap))
    n = len(arr)
    order = sorted(range(n), key=lambda r: (arr[r], r))  # arrival order
    # Lane 0 ("session"): FIFO with hand-off and no idling -> granted at arrival, or at the
    # end of the previous request of its slot (its key, or everyone for global-serial).
    prev_end: dict[object, Fraction] = {}
    for r in order:
        slot = keys[r] if policy == "session" else None
        expected = max(Fraction(arr[r]), prev_end.get(slot, Fraction(arr[r])))
        assert s.grants[r][0] == expected
        prev_end[slot] = s.end[r]
        assert s.end[r] == s.start[r] + work[r]
        assert s.start[r] == s.grants[r][1]
    # Lane 1 ("global"): never more than cap at once ...
    assert peak_concurrency(s.start, s.end) <= cap
    # ... FIFO by the moment a request asked for it ...
    for r in range(n):
        for q in range(n):
            if s.grants[r][0] < s.grants[q][0]:
                assert s.start[r] <= s.start[q]
    # ... and work-conserving: a request waiting for it waits only while it is full, and
    # gets it at the instant someone releases it.
    ends = set(s.end)
    points = sorted({*s.start, *s.end, *s.arrival})
    for r in range(n):
        g = s.grants[r][0]
        if s.start[r] > g:
            assert s.start[r] in ends
            for a, b in itertools.pairwise(points):
                if g <= a and b <= s.start[r]:
                    mid = (a + b) / 2
                    running = sum(1 for x in range(n) if s.start[x] <= mid < s.end[x])
                    assert running == cap
    # Both policies keep each conversation in arrival order, one at a time.
    assert count_order_violations(keys, s.start_order) == 0


@pytest.mark.timeout(60)
@settings(max_examples=150, deadline=None)
@given(
    st.lists(
        st.tuples(st.integers(0, 20), st.integers(0, 3), st.integers(0, 8)),
        min_size=0,
        max_size=12,
    ),
    st.integers(1, 3),
    st.sampled_from(["session", "global-serial"]),
)
def test_sim_properties(rows: list[tuple[int, int, int]], cap: int, policy: str) -> None:
    rows.sort(key=lambda r: r[0])
    _check_schedule([r[0] for r in rows], [r[1] for r in rows], [r[2] for r in rows], cap, policy)


# --------------------------------------------------------------------------------------
# Trace reader


@pytest.mark.timeout(10)
def test_reader_reports_malformed_lines_with_numbers() -> None:
    lines = [
        line(0, 10, 1),  # 1 ok
        "{not json",  # 2 bad JSON
        "",  # 3 blank
        json.dumps({"timestamp": 5, "input_length": 1, "hash_ids": [0, 2]}),  # 4 no output
        "   ",  # 5 blank (spaces)
        json.dumps([1, 2, 3]),  # 6 not an object
        json.dumps(
            {"timestamp": "x", "input_length": 1, "output_length": 2, "hash_ids": [0, 2]}
        ),  # 7 wrong type
        json.dumps(
            {"timestamp": 1, "input_length": 1, "output_length": 2, "hash_ids": [0]}
        ),  # 8 no conversation id
        line(3, 20, 2),  # 9 ok
    ]
    trace = parse_trace_lines(lines)
    assert [r.line for r in trace.requests] == [1, 9]
    skipped = {s.line: s.reason for s in trace.skipped}
    assert sorted(skipped) == [2, 3, 4, 5, 6, 7, 8]
    assert skipped[2].startswith("invalid JSON")
    assert skipped[3] == "blank line"
    assert "missing field 'output_length'" in skipped[4]
    assert "not a JSON object" in skipped[6]
    assert "timestamp" in skipped[7]
    assert "hash_ids" in skipped[8]
    # Blank lines are skipped, not malformed: no request is lost with them.
    assert [s.line for s in trace.skipped if s.blank] == [3, 5]
    assert [s.line for s in trace.malformed] == [2, 4, 6, 7, 8]


@pytest.mark.timeout(10)
def test_blank_lines_of_a_generic_trace_are_not_malformed() -> None:
    csv = parse_trace_lines(["timestamp,key,duration_s", "0,a,1", "", "x,a,1", " "],
                            trace_format="auto")
    json_lines = parse_trace_lines(
        ['{"timestamp": 0, "key": "a", "duration_s": 1}', "", "{bad", "\t"],
        trace_format="auto")
    for trace, blank, bad in ((csv, [3, 5], [4]), (json_lines, [2, 4], [3])):
        assert trace.format == "generic" and len(trace.requests) == 1
        assert [s.line for s in trace.skipped if s.blank] == blank
        assert [s.line for s in trace.malformed] == bad


@pytest.mark.timeout(10)
def test_reader_sorts_by_time_stably_and_keys_conversations() -> None:
    trace = make_trace([(50, 1, 9), (10, 2, 8), (50, 3, 7), (10, 4, 9)])
    assert [(r.timestamp_ms, r.output_length) for r in trace.requests] == [
        (10, 2),
        (10, 4),
        (50, 1),
        (50, 3),
    ]
    assert [r.index for r in trace.requests] == [0, 1, 2, 3]
    assert trace.conversations == 3
    assert trace.head(2).requests == trace.requests[:2]
    assert session_key(42) == "gateway:trace:42"


@pytest.mark.timeout(10)
def test_reader_files_plain_and_gzip(tmp_path: Path) -> None:
    text = "\n".join([line(0, 1, 1), "oops", line(5, 2, 2)]) + "\n"
    plain = tmp_path / "t.jsonl"
    plain.write_text(text)
    packed = tmp_path / "t.data"  # gzip detected from the content, not the name
    packed.write_bytes(gzip.compress(text.encode()))
    for path in (plain, packed):
        trace = read_trace(path)
        assert len(trace.requests) == 2
        assert [(s.line, s.reason.split(":")[0]) for s in trace.skipped] == [(2, "invalid JSON")]
    bad_utf8 = tmp_path / "u.jsonl"
    bad_utf8.write_bytes(line(0, 1, 1).encode() + b"\n\xff\xfe\n")
    assert [s.line for s in read_trace(bad_utf8).skipped] == [2]


@pytest.mark.timeout(10)
def test_reader_errors_for_unreadable_files(tmp_path: Path) -> None:
    with pytest.raises(TraceError, match="cannot open"):
        read_trace(tmp_path / "missing.jsonl")
    packed = bytearray(gzip.compress(("\n".join(line(i, 1, i) for i in range(500))).encode()))
    for i in range(100, 160):  # corrupt inside a good header: a zlib error, not a crash
        packed[i] ^= 0xFF
    corrupt = tmp_path / "c.gz"
    corrupt.write_bytes(bytes(packed))
    with pytest.raises(TraceError, match="cannot read trace"):
        read_trace(corrupt)
    not_gzip = tmp_path / "n.gz"
    not_gzip.write_bytes(b"\x1f\x8b" + os.urandom(200))  # the magic, then no gzip header
    with pytest.raises(TraceError, match="cannot read trace"):
        read_trace(not_gzip)


@pytest.mark.timeout(30)
def test_a_gzip_trace_cut_short_keeps_its_whole_lines(
    tmp_path: Path, capsys: pytest.CaptureFixture[str],
) -> None:
    """A gzip trace copied while it was written ends short: its whole lines are read,
    and where it ends is one malformed line (it was refused whole, "cannot read trace");
    the CLI then counts that line under --max-bad-lines."""
    from lanequeue.cli import main
    from lanequeue.replay.trace import GZIP_CUT

    text = "".join(line(i * 1000, 1, i + 1) + "\n" for i in range(3000))
    packed = gzip.compress(text.encode())
    cut = tmp_path / "cut.jsonl.gz"
    cut.write_bytes(packed[: len(packed) * 2 // 3])
    trace = read_trace(cut)
    assert 0 < len(trace.requests) < 3000
    assert [s.reason for s in trace.skipped] == [GZIP_CUT]
    assert trace.skipped[0].line == len(trace.requests) + 1
    whole = parse_trace_lines(text.splitlines()).requests[: len(trace.requests)]
    assert [(r.timestamp_ms, r.key) for r in trace.requests] == [
        (r.timestamp_ms, r.key) for r in whole]
    assert main(["plan", str(cut), "--p99-wait-s", "1000"]) == 0
    capsys.readouterr()
    assert main(["plan", str(cut), "--p99-wait-s", "1000", "--max-bad-lines", "0"]) == 2
    err = capsys.readouterr().err
    assert f"line {len(trace.requests) + 1}: {GZIP_CUT}" in err, err


@pytest.mark.timeout(30)
def test_bundled_trace_is_the_default() -> None:
    trace = read_trace()
    assert len(trace.requests) == 12031
    assert trace.conversations == 7373
    assert trace.skipped == ()
    assert "bundled" in trace.source
    first = trace.requests[0]
    assert isinstance(first, TraceRequest) and first.timestamp_ms == 0
    assert all(
        a.timestamp_ms <= b.timestamp_ms
        for a, b in zip(trace.requests, trace.requests[1:], strict=False)
    )


# --------------------------------------------------------------------------------------
# Measuring helpers


README = Path(__file__).resolve().parent.parent / "README.md"


def test_count_order_violations() -> None:
    convs = ["a", "b", "a", "a"]
    assert count_order_violations(convs, [0, 1, 2, 3]) == 0
    assert count_order_violations(convs, [1, 0, 3, 2]) == 1  # 2 overtaken by 3
    assert count_order_violations(convs, [3, 2, 0, 1]) == 2


def test_order_violations_count_the_overtaken_requests_as_the_readme_says() -> None:
    # One definition: a request counts when a later-arrived request of its conversation
    # started before it. [2, 0, 1]: 0 and 1 were overtaken (by 2); [1, 2, 0]: only 0.
    one = ["c", "c", "c"]
    assert count_order_violations(one, [2, 0, 1]) == 2
    assert count_order_violations(one, [1, 2, 0]) == 1
    text = " ".join(README.read_text().split())
    assert (
        "`order_violations` | requests overtaken: requests that started after a "
        "later-arrived request of their own conversation (must be 0); one conversation "
        "whose requests 0, 1, 2 start in the order 2, 0, 1 counts 2, in the order 1, 2, 0 "
        "counts 1 |"
    ) in text


@pytest.mark.timeout(60)
def test_registry_figures_exceed_the_soft_cap_as_the_readme_says() -> None:
    # 6 conversations arrive at once and work 0.3 s each, all at once (global cap 8):
    # 6 held entries, none evictable, with max_sessions=2. Nothing new comes afterwards:
    # the count read at the end drops the idle entries over the cap.
    burst = [(0, 30, conv) for conv in range(6)]
    config = ReplayConfig(global_cap=8, speed=3, tpot_ms=30, max_sessions=2)
    rep = run_replay(make_trace(burst), config).report
    assert rep.peak_global == 6 and rep.errors == 0  # all six held the session lane at once
    assert rep.registry_peak == 6 and rep.registry_final == 2
    # One new conversation after the burst: it needs room, so idle entries are evicted
    # down to the cap before it enters.
    rep = run_replay(make_trace([*burst, (3000, 10, 99)]), config).report
    assert rep.registry_peak == 6 and rep.registry_final == 2
    text = " ".join(README.read_text().split())
    assert "`--max-sessions` is a soft cap" in text
    assert "never beyond the most conversations holding it at once" in text
    assert "`registry_final` is back at the cap" in text


def test_percentile() -> None:
    assert percentile([3, 1, 2], 50) == 2
    assert percentile([0, 10], 95) == pytest.approx(9.5)
    assert percentile([5], 99) == 5


# --------------------------------------------------------------------------------------
# The real runner: real threads, real lanes


@pytest.mark.timeout(60)
def test_real_replay_of_trace_head_keeps_order_and_caps() -> None:
    trace = read_trace().head(300)
    cap = 8
    # 300 requests span ~90 s of trace; at 3000x they arrive within ~30 ms and work ~0.3
    # ms per 100 tokens * 10: the cap of 8 is saturated and many wait.
    result = run_replay(trace, ReplayConfig(global_cap=cap, speed=3000, tpot_ms=300))
    rep = result.report
    assert rep.requests == 300 and rep.errors == 0
    assert rep.order_violations == 0
    assert rep.max_key_concurrency == 1
    assert 1 <= rep.peak_global <= cap
    assert rep.peak_global == cap  # the cap was reached: the test exercised it
    assert rep.wait_max_s > 0
    assert rep.failed_checks() == []
    assert rep.registry_peak is not None and rep.registry_final is not None
    assert all(
        rec == 300
        for rec in (
            result.report.lane_stats["session"]["acquired"],
            result.report.lane_stats["global"]["released"],
        )
    )


@pytest.mark.timeout(60)
def test_real_replay_of_busy_conversations_keeps_their_order() -> None:
    # 6 conversations x 15 turns, arriving interleaved within a few ms: deep per-key
    # lines behind every session, and the global cap (4) binding too.
    rows = [(t, 20 + (t * 7) % 30, conv) for t in range(15) for conv in range(6)]
    trace = make_trace(rows)
    result = run_replay(trace, ReplayConfig(global_cap=4, speed=1000, tpot_ms=50))
    rep = result.report
    assert rep.errors == 0
    assert rep.order_violations == 0
    assert rep.max_key_concurrency == 1
    assert rep.peak_global <= 4
    assert rep.makespan_ratio is not None and rep.makespan_ratio >= 0.99


@pytest.mark.timeout(60)
def test_real_lanes_follow_the_simulated_order() -> None:
    # The scenario of test_sim_session_first_then_global_fifo in real time (tens of ms
    # apart): a2 waits on its session lane, b on the global lane; b must go first.
    trace = make_trace([(0, 20, 1), (20, 5, 1), (40, 5, 2)])
    result = run_replay(trace, ReplayConfig(global_cap=1, speed=1, tpot_ms=10))
    assert result.ideal.start_order == (0, 2, 1)
    assert tuple(result.record.start_order) == (0, 2, 1)
    # Wall time on a shared machine: a loaded scheduler may start a thread late (0.13 s
    # was seen under load); the order above is what this test is about.
    ideal = result.report.ideal_makespan_s
    assert ideal - 0.05 <= result.report.makespan_s <= ideal + 1.0


@pytest.mark.timeout(60)
def test_real_replay_global_serial() -> None:
    trace = make_trace([(t, 10, t % 3) for t in range(40)])
    rep = run_replay(trace, ReplayConfig(policy="global-serial", speed=1000, tpot_ms=5)).report
    assert rep.peak_global == 1
    assert rep.order_violations == 0 and rep.max_key_concurrency == 1
    assert rep.registry_peak is None  # no per-key lane in that policy
    assert rep.ideal_makespan_s == pytest.approx(40 * 10 * 5 / 1000 / 1000)


@pytest.mark.timeout(60)
def test_measurements_come_from_the_workers(monkeypatch: pytest.MonkeyPatch) -> None:
    # Swap the session lane for a counting Lane of 3: no per-key exclusion any more. The
    # workers' own counters must see it (the lanes' stats would look perfectly healthy).
    def broken(plan: Any) -> LaneQueue:
        q = LaneQueue()
        q.add_lane("session", max_concurrent=3, timeout_s=None)
        q.add_lane("global", max_concurrent=8, timeout_s=None)
        return q

    monkeypatch.setattr(threads_mod, "build_thread_queue", broken)
    trace = make_trace([(0, 200, 1)] * 6)
    # Each request works 200 ms (200 tokens x 5 ms / speed 5): three threads started at
    # once overlap even on a loaded machine (at 1 ms each, they did not always).
    rep = run_replay(trace, ReplayConfig(global_cap=8, speed=5, tpot_ms=5)).report
    assert rep.max_key_concurrency == 3
    assert "max_key_concurrency = 3 (expected <= 1)" in rep.failed_checks()


def test_unknown_runtime_is_a_clear_error() -> None:
    with pytest.raises(ValueError, match="unknown runtime 'fibers'; available: asyncio, threads"):
        run_replay(make_trace([(0, 1, 1)]), ReplayConfig(runtime="fibers"))


# --------------------------------------------------------------------------------------
# CLI


@pytest.mark.timeout(60)
def test_cli_json_has_the_documented_keys(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "r.json"
    code = main(
        [
            "replay",
            "--limit",
            "200",
            "--speed",
            "3000",
            "--global",
            "16",
            "--json",
            str(out),
            "--no-progress",
        ]
    )
    assert code == 0
    data = json.loads(out.read_text())
    assert list(data)[: len(JSON_KEYS)] == list(JSON_KEYS)
    assert data["requests"] == 200
    assert data["skipped_lines"] == 0
    assert data["order_violations"] == 0
    assert data["max_key_concurrency"] == 1
    assert data["peak_global"] <= 16
    assert data["ideal_makespan_s"] > 0 and data["makespan_ratio"] > 0
    printed = capsys.readouterr().out
    for key in ("order_violations", "max_key_concurrency", "peak_global", "makespan_ratio"):
        assert key in printed
    assert "checks passed" in printed


@pytest.mark.timeout(60)
def test_cli_reports_skipped_lines(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    trace = tmp_path / "t.jsonl"
    trace.write_text("\n".join([line(0, 10, 1), "{bad", "", line(100, 10, 2)]) + "\n")
    out = tmp_path / "r.json"
    assert main(["replay", str(trace), "--speed", "1000", "--json", str(out),
                 "--max-bad-lines", "1"]) == 0
    err = capsys.readouterr().err
    assert "line 2: invalid JSON" in err
    assert "line 3" not in err and "lanequeue replay: 1 blank line passed over" in err
    assert ("lanequeue replay: 1 malformed line skipped (33.3% of 3 request lines, within "
            "--max-bad-lines 1); replaying the other 2") in err
    assert "most lines were not requests" not in err
    data = json.loads(out.read_text())
    assert data["skipped_lines"] == 2 and data["requests"] == 2  # malformed and blank


@pytest.mark.timeout(60)
def test_cli_reports_the_first_skipped_lines_then_counts_the_rest_as_the_readme_says(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # 25 malformed lines (2..26) between two good ones: the first 20 by number, then a
    # count of the other 5, then the total.
    trace = tmp_path / "t.jsonl"
    trace.write_text("\n".join([line(0, 10, 1), *["{bad"] * 25, line(100, 10, 2)]) + "\n")
    out = tmp_path / "r.json"
    assert main(["replay", str(trace), "--speed", "1000", "--json", str(out),
                 "--max-bad-lines", "100%"]) == 0
    err = capsys.readouterr().err.splitlines()
    listed = [ln for ln in err if ": line " in ln]
    assert [int(ln.split(": line ")[1].split(":")[0]) for ln in listed] == list(range(2, 22))
    assert "lanequeue replay: ... and 5 more malformed lines skipped" in err
    assert ("lanequeue replay: most lines were not requests: is this a Mooncake or "
            "generic trace (see --help)?") in err
    assert ("lanequeue replay: 25 malformed lines skipped (92.6% of 27 request lines, "
            "within --max-bad-lines 100%); replaying the other 2") in err
    assert json.loads(out.read_text())["skipped_lines"] == 25
    assert MAX_LINE_MESSAGES == 20
    text = " ".join(README.read_text().split())
    assert 'input lines skipped, malformed or blank (see "Malformed lines" below)' in text
    assert (
        "is skipped and reported on stderr: the first 20 with their line numbers and "
        "reasons, then a count of the rest."
    ) in text
    assert (
        "When more than half of the request lines (every line but blank ones and a CSV "
        "header) are malformed, a hint says the file may not be a trace of either format."
    ) in text


def test_cli_defaults_are_the_configs() -> None:
    args = build_parser().parse_args(["replay"])
    config = ReplayConfig()
    assert (args.policy, args.global_cap, args.speed, args.tpot_ms) == (
        config.policy, config.global_cap, config.speed, config.tpot_ms
    )
    # --runtime's default is the config's: None, resolved by the config (threads; asyncio
    # with --busy).
    assert args.runtime is None and ReplayConfig.__dataclass_fields__["runtime"].default is None
    assert config.runtime == "threads"
    assert (args.max_sessions, args.idle_timeout_s, args.backend, args.workers, args.limit) == (
        config.max_sessions, config.idle_timeout_s, config.backend, config.workers, config.limit
    )
    assert (config.max_sessions, config.idle_timeout_s) == (
        lanequeue.DEFAULT_MAX_SESSIONS, lanequeue.DEFAULT_IDLE_TIMEOUT_S
    )


def test_cli_version(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        main(["--version"])
    assert exc.value.code == 0
    assert capsys.readouterr().out.strip() == f"lanequeue {lanequeue.__version__}"
    assert lanequeue.__version__ == importlib.metadata.version("lanequeue")


def test_cli_errors(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["replay", "--runtime", "fibers"]) == 2
    assert "unknown runtime 'fibers'; available: asyncio, threads" in capsys.readouterr().err
    assert main(["replay", str(tmp_path / "nope.jsonl")]) == 2
    assert "cannot open trace" in capsys.readouterr().err
    assert main(["replay", "--json", str(tmp_path / "no" / "dir.json")]) == 2
    assert "does not exist" in capsys.readouterr().err
    assert main(["replay", "--speed", "0"]) == 2
    assert (
        "argument --speed: speed must be a number from 1e-06 to 1e+06, got 0\n"
        in capsys.readouterr().err
    )
    # The message names the option, not the Python API's setting (global_cap).
    assert main(["replay", "--global", "0"]) == 2
    assert (
        "argument --global: global must be an integer from 1 to 1,000,000,000, got 0"
        in capsys.readouterr().err
    )
    assert main(["replay", "--idle-timeout", "-1"]) == 2
    assert "argument --idle-timeout: idle-timeout must be a number of seconds" in (
        capsys.readouterr().err)
    assert main([]) == 2
    # Checked before the replay starts, not after a minute of it.
    assert main(["replay", "--json", str(tmp_path)]) == 2
    assert "is a directory" in capsys.readouterr().err
    assert main(["replay", "--plot", str(tmp_path / "p.txt")]) == 2
    assert "ending in .png" in capsys.readouterr().err
    empty = tmp_path / "empty.jsonl"
    empty.write_text("not json\n")
    assert main(["replay", str(empty)]) == 2
    assert "no valid request to replay" in capsys.readouterr().err


def test_out_of_range_numbers_are_skipped_not_replayed(tmp_path: Path) -> None:
    # A timestamp of 1e300 ms (or an output of 1e20 tokens) would overflow the replay's
    # clocks: such lines are reported and skipped like any malformed line.
    path = tmp_path / "huge.jsonl"
    good = '{"timestamp": 0, "input_length": 1, "output_length": 1, "hash_ids": [0, 1]}'
    path.write_text(
        good + "\n"
        '{"timestamp": 1e300, "input_length": 1, "output_length": 1, "hash_ids": [0, 2]}\n'
        '{"timestamp": 5, "input_length": 1, "output_length": 100000000000000000000, '
        '"hash_ids": [0, 3]}\n'
    )
    trace = read_trace(path)
    assert len(trace.requests) == 1
    assert [s.line for s in trace.skipped] == [2, 3]


def test_cli_plot_without_matplotlib(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    import importlib

    real = importlib.import_module

    def no_matplotlib(name: str, package: str | None = None) -> Any:
        if name.startswith("matplotlib"):
            raise ImportError("No module named 'matplotlib'")
        return real(name, package)

    monkeypatch.setattr(importlib, "import_module", no_matplotlib)
    assert main(["replay", "--limit", "5", "--plot", str(tmp_path / "p.png")]) == 2
    err = capsys.readouterr().err
    assert "pip install 'lanequeue[plot]'" in err
    assert "(in a source checkout: pip install '.[plot]')" in err


@pytest.mark.timeout(60)
def test_cli_plot(tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    png = tmp_path / "p.png"
    assert (
        main(["replay", "--limit", "100", "--speed", "3000", "--plot", str(png), "--no-progress"])
        == 0
    )
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.timeout(60)
def test_python_dash_m(tmp_path: Path) -> None:
    out = tmp_path / "r.json"
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "lanequeue",
            "replay",
            "--limit",
            "50",
            "--speed",
            "3000",
            "--json",
            str(out),
        ],
        capture_output=True,
        text=True,
        timeout=50,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    assert json.loads(out.read_text())["requests"] == 50


# --------------------------------------------------------------------------------------
# Settings refused at once; the generic format; the checks line of global-serial


HUGE = str(10**30)
BAD_REPLAY_SETTINGS = [
    *(("--speed", v) for v in ("0", "-1", "nan", "inf", "1e400", "1e7", HUGE)),
    *(("--tpot-ms", v) for v in ("-1", "nan", "inf", "1e400", "60001", HUGE)),
    *(("--global", v) for v in ("0", "-1", "nan", "1e400", HUGE)),
    *(("--max-sessions", v) for v in ("0", "-1", "inf", HUGE)),
    *(("--idle-timeout", v) for v in ("-1", "nan", "inf", "1e400", "1e10", HUGE)),
    *(("--limit", v) for v in ("0", "-1", "nan", HUGE)),
    *(("--workers", v) for v in ("0", "-1", "1025", HUGE)),
    *(("--metrics-port", v) for v in ("-1", "65536", "nan", HUGE)),
]


@pytest.mark.parametrize(
    ("option", "value", "busy"),
    [
        (option, value, busy)
        for busy in (False, True)
        for option, value in BAD_REPLAY_SETTINGS
        if not (busy and option == "--metrics-port")  # --busy serves no metrics
    ],
)
def test_cli_replay_refuses_a_bad_setting_at_once(
    option: str,
    value: str,
    busy: bool,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    def boom(*args: object, **kwargs: object) -> None:
        raise AssertionError("the replay did work before refusing its settings")

    for target in ("read_trace", "run_replay"):
        monkeypatch.setattr(f"lanequeue.replay.{target}", boom)
    monkeypatch.setattr("lanequeue.replay.busy.run_busy", boom)
    argv = ["replay", option, value] + (["--busy", "enqueue"] if busy else [])
    code, _, err = run_cli(argv, capsys)
    assert code == 2
    assert option in err and "Traceback" not in err
    if option != "--metrics-port":
        assert f"argument {option}" in err


def test_replay_settings_are_checked_in_the_config() -> None:
    from lanequeue.replay._checks import SettingError

    for kwargs, setting in (
        ({"speed": float("nan")}, "speed"),
        ({"speed": 0}, "speed"),
        ({"tpot_ms": float("inf")}, "tpot_ms"),
        ({"global_cap": 10**30}, "global_cap"),
        ({"max_sessions": 0}, "max_sessions"),
        ({"idle_timeout_s": float("nan")}, "idle_timeout_s"),
        ({"limit": 0}, "limit"),
        ({"policy": "fifo"}, "policy"),
        ({"runtime": "fibers"}, "runtime"),
    ):
        with pytest.raises(SettingError) as info:
            ReplayConfig(**kwargs)  # type: ignore[arg-type]
        assert info.value.setting == setting
    with pytest.raises(TypeError, match="global_cap must be an integer"):
        ReplayConfig(global_cap=2.0)  # type: ignore[arg-type]


TEN_LINES = Path(__file__).resolve().parent.parent / "README.md"


def readme_generic_example(tmp_path: Path) -> Path:
    text = TEN_LINES.read_text(encoding="utf-8")
    section = text.split("## Capacity planning: `lanequeue plan`", 1)[1].split("\n## ", 1)[0]
    block = next(b for b in section.split("```")[1::2] if b.lstrip().startswith("timestamp"))
    path = tmp_path / "ten.csv"
    path.write_text(block.strip() + "\n")
    return path


def test_cli_replay_reads_the_generic_format_as_plan_does(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from lanequeue.replay.plan import PlanGoal, plan_capacity

    ten = readme_generic_example(tmp_path)
    # Its output_tokens lines need a time per token, as for plan.
    code, _, err = run_cli(["replay", str(ten), "--speed", "50"], capsys)
    assert code == 2
    assert "argument --tpot-ms: the trace gives output_tokens" in err
    code, out, err = run_cli(["replay", str(ten), "--tpot-ms", "20", "--speed", "50"], capsys)
    assert (code, err) == (0, "")
    assert "20 ms per output token" in out
    assert [x.split()[1] for x in out.splitlines() if x.startswith("requests ")] == ["9"]
    # Only durations: no time per token needed; the same reader and the same service times.
    durations = tmp_path / "durations.jsonl"
    rows = [(0.0, "a", 0.6), (0.05, "b", 0.5), (0.1, "a", 0.3), (0.2, "c", 0.4)]
    durations.write_text(
        "".join(
            json.dumps({"timestamp": t, "key": k, "duration_s": d}) + "\n" for t, k, d in rows
        )
    )
    code, out, _ = run_cli(["replay", str(durations), "--global", "1", "--speed", "5"], capsys)
    assert code == 0
    assert "service times from the trace" in out
    trace = read_trace(durations, trace_format="auto")
    ideal = simulate_trace(trace, ReplayConfig(global_cap=1, speed=1))
    planned = plan_capacity(trace, PlanGoal(100), max_global=1).row_by_cap[1]
    assert float(max(ideal.waits)) == planned.wait_max_s
    # Cap 1: a0 works 0-0.6; b (0.05) and c (0.2) queue for the global lane, a1 (0.1) for
    # a's lane, which it gets at 0.6 and then queues behind c: b 0.6-1.1, c 1.1-1.5, a1 1.5.
    assert [float(w) for w in ideal.waits] == [0.0, 0.55, 1.4, 0.9]


def test_cli_global_serial_checks_line_states_its_single_permit(
    capsys: pytest.CaptureFixture[str],
) -> None:
    code, out, _ = run_cli(
        ["replay", "--policy", "global-serial", "--limit", "20", "--speed", "5000"], capsys
    )
    assert code == 0
    assert out.rstrip().splitlines()[-1] == (
        "checks passed: order kept in every conversation, at most one request per "
        "conversation at a time, at most 1 at once (the policy's single permit)"
    )
    code, out, _ = run_cli(["replay", "--limit", "20", "--speed", "5000"], capsys)
    assert out.rstrip().endswith("at most 64 at once")


def test_report_checks_the_policys_real_cap() -> None:
    import dataclasses

    result = run_replay(read_trace().head(20), ReplayConfig(policy="global-serial", speed=5000))
    report = result.report
    assert report.cap_at_once == 1 and report.peak_global == 1
    assert report.failed_checks() == []
    broken = dataclasses.replace(report, peak_global=2)
    assert broken.failed_checks() == ["peak_global = 2 (cap 1)"]


def test_config_limit_replays_the_first_requests() -> None:
    result = run_replay(read_trace(), ReplayConfig(speed=5000, limit=25))
    assert result.report.requests == 25


@pytest.mark.timeout(60)
def test_cli_header_says_how_many_run_at_once_under_global_serial(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The header's "global cap 64" alone read as 64 at once; under ``global-serial``
    the session lane's one permit lets one request work at a time, and the header says
    so (under ``session`` it is the cap itself, and the header adds nothing)."""
    trace = tmp_path / "t.jsonl"
    trace.write_text("\n".join([line(0, 10, 1), line(100, 10, 2)]) + "\n")
    assert main(["replay", str(trace), "--speed", "1000", "--policy", "global-serial"]) == 0
    out = capsys.readouterr().out
    assert "global cap 64 (at most 1 at once under this policy), speed 1000x" in out
    assert main(["replay", str(trace), "--speed", "1000"]) == 0
    out = capsys.readouterr().out
    assert "global cap 64, speed 1000x" in out


def test_readme_states_the_replays_default_global_cap() -> None:
    """README, replay options: ``--global N`` defaults to 64 (not the library's 8)."""
    from lanequeue.queue import DEFAULT_GLOBAL_CONCURRENCY
    from lanequeue.replay import ReplayConfig

    readme = (Path(__file__).resolve().parents[1] / "README.md").read_text()
    assert ReplayConfig().global_cap == 64 and DEFAULT_GLOBAL_CONCURRENCY == 8
    assert ("`--global N` (the replay's global lane's permits; default 64, where the "
            "library's\n`build_default_lanes()` uses 8)") in readme


#: Every numeric option of the three commands, with a valid value: written with a plus
#: sign it is taken; made negative it is refused by the option's own check.
NUMERIC_OPTIONS = [
    ("replay", "--speed", "2", 2.0), ("replay", "--tpot-ms", "3", 3.0),
    ("replay", "--global", "4", 4), ("replay", "--limit", "5", 5),
    ("replay", "--workers", "2", 2), ("replay", "--max-sessions", "6", 6),
    ("replay", "--idle-timeout", "7", 7.0), ("replay", "--metrics-port", "9", 9),
    ("plan", "--p99-wait-s", "2", Fraction(2)), ("plan", "--max-wait-s", "3", Fraction(3)),
    ("plan", "--tpot-ms", "3", 3.0), ("plan", "--min-global", "2", 2),
    ("plan", "--max-global", "8", 8), ("plan", "--speed", "2", 2.0),
    ("plan", "--jobs", "2", 2), ("status", "--interval", "2", 2.0),
]


def _numeric_argv(command: str, option: str, value: str) -> list[str]:
    extra = {"replay": ["--no-progress"], "plan": ["--p99-wait-s", "1"],
             "status": ["--backend", "redis://127.0.0.1:1/0", "--watch"]}[command]
    return [command, *extra, option, value]


@pytest.mark.timeout(10)
@pytest.mark.parametrize(("command", "option", "text", "value"), NUMERIC_OPTIONS)
def test_every_numeric_option_shows_a_refused_value_as_it_was_typed(
    command: str, option: str, text: str, value: object,
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
) -> None:
    """A value out of range is shown as the user typed it, by every command alike:
    ``--speed 1e400`` said ``got inf`` (what float() made of it) where ``plan
    --p99-wait-s 1e400`` said ``got 1e+400``, and a count's leading zeros and sign were
    lost."""
    def boom(*args: object, **kwargs: object) -> None:
        raise AssertionError("the command did work before refusing its settings")

    for target in ("read_trace", "run_replay"):
        monkeypatch.setattr(f"lanequeue.replay.{target}", boom)
    monkeypatch.setattr("lanequeue.replay.trace.read_trace", boom)
    typed = "1e400" if isinstance(value, (float, Fraction)) else "+00" + "9" * 30
    code, out, err = run_cli(_numeric_argv(command, option, typed), capsys)
    assert (code, out) == (2, "")
    last = err.splitlines()[-1]
    assert last.startswith(f"lanequeue {command}: error: argument {option}: "), err
    assert last.endswith(f", got {typed}"), err


#: Options that do not go together, and the two the refusal names (the refused one, then
#: the one it is not allowed with).
CONFLICTS = [
    (["replay", "--busy", "enqueue", "--metrics-port", "0"], "--metrics-port", "--busy"),
    (["replay", "--busy", "enqueue", "--json", "r.json"], "--json", "--busy"),
    (["replay", "--busy", "enqueue", "--plot", "r.png"], "--plot", "--busy"),
    (["replay", "--busy", "enqueue", "--policy", "global-serial"], "--policy", "--busy"),
    (["replay", "--busy", "enqueue", "--runtime", "threads"], "--runtime", "--busy"),
    (["replay", "--busy", "enqueue", "--backend", "redis://127.0.0.1:1/0"], "--backend",
     "--busy"),
    (["replay", "--busy", "enqueue", "--workers", "2"], "--workers", "--busy"),
    (["replay", "--metrics-port", "0", "--backend", "redis://127.0.0.1:1/0"],
     "--metrics-port", "--backend"),
    (["status", "--backend", "redis://127.0.0.1:1/0", "--json", "--watch"], "--watch",
     "--json"),
]


@pytest.mark.timeout(10)
@pytest.mark.parametrize(("argv", "refused", "other"), CONFLICTS)
def test_options_that_do_not_go_together_are_refused_in_one_form(
    argv: list[str], refused: str, other: str, tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
) -> None:
    """Every refusal of two options together says it as argparse does for its mutually
    exclusive options (``argument --watch: not allowed with argument --json``), then
    why: ``--busy`` with ``--metrics-port`` said "--busy cannot be combined with
    --metrics-port" and a busy replay's ``--policy`` "busy cannot be combined with"."""
    import re

    def boom(*args: object, **kwargs: object) -> None:
        raise AssertionError("the command did work before refusing its settings")

    for target in ("read_trace", "run_replay"):
        monkeypatch.setattr(f"lanequeue.replay.{target}", boom)
    monkeypatch.setattr("lanequeue.replay.busy.run_busy", boom)
    monkeypatch.chdir(tmp_path)
    code, out, err = run_cli(argv, capsys)
    assert (code, out) == (2, "")
    last = err.splitlines()[-1]
    form = re.fullmatch(r"lanequeue (\w+): error: argument (\S+): not allowed with "
                        r"argument (\S+)(?: \((.+)\))?", last)
    assert form is not None, err
    assert form.groups()[:3] == (argv[0], refused, other), err
    assert "combined" not in err


@pytest.mark.parametrize(("command", "option", "text", "value"), NUMERIC_OPTIONS)
def test_every_numeric_option_takes_a_plus_sign(
    command: str, option: str, text: str, value: object
) -> None:
    from lanequeue.cli import build_parser

    args = build_parser().parse_args(_numeric_argv(command, option, "+" + text))
    dest = next(a.dest for a in build_parser()._subparsers._group_actions[0]  # type: ignore[union-attr]
                .choices[command]._actions if option in a.option_strings)
    got = getattr(args, dest)
    assert got == value and type(got) is type(value)


@pytest.mark.parametrize("negative", ["-{}", "-{}e0", "-{}.5", "-inf", "-nan", "-Infinity"])
@pytest.mark.parametrize(("command", "option", "text", "value"), NUMERIC_OPTIONS)
def test_every_numeric_option_refuses_a_negative_value_naming_the_option(
    command: str, option: str, text: str, value: object, negative: str,
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
) -> None:
    """A negative value is refused before any work, by a message naming the option;
    ``-2e0`` too, which argparse took for an unknown option before Python 3.13
    (``expected one argument``), and ``-inf``, ``-nan``, ``-Infinity`` (which it takes
    for one on every version)."""
    def boom(*args: object, **kwargs: object) -> None:
        raise AssertionError("the command did work before refusing its settings")

    for target in ("read_trace", "run_replay"):
        monkeypatch.setattr(f"lanequeue.replay.{target}", boom)
    monkeypatch.setattr("lanequeue.replay.trace.read_trace", boom)
    code, out, err = run_cli(_numeric_argv(command, option, negative.format(text)), capsys)
    assert (code, out) == (2, "")
    assert f"argument {option}: " in err and "expected one argument" not in err, err
    assert "Traceback" not in err
