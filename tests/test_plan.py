"""`lanequeue plan`: capacity planning on the exact simulation, the generic trace format,
the search's proven bounds, the CLI (exit codes, JSON, plot) and `--verify` on real lanes."""

from __future__ import annotations

import json
import math
import re
from collections.abc import Sequence
from fractions import Fraction
from pathlib import Path

import conftest
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from lanequeue.cli import main
from lanequeue.replay import Trace, parse_trace_lines, policy_lanes, read_trace, simulate
from lanequeue.replay.plan import (
    TICKS_PER_S,
    PlanGoal,
    exact_percentile,
    plan_capacity,
    plan_inputs,
    verify_plan,
)
from lanequeue.replay.simulate import _simulate_ticks, simulate_ticks


def generic(rows: Sequence[tuple[float | str, str, float]]) -> Trace:
    """A generic JSON-lines trace from (timestamp_s, key, duration_s) rows."""
    lines = [json.dumps({"timestamp": t, "key": k, "duration_s": d}) for t, k, d in rows]
    return parse_trace_lines(lines, source="test", trace_format="auto")


# The hand-computed trace. Conversations a, b, c each send one request at t=0 working 10 s;
# a sends a second request at t=1 working 5 s, which must wait for a's first (until 10 s).
#
# cap 1: r0 0-10; r1 and r2 queue for the global lane; r3 queues on a's lane. At 10, r0's
#        global permit goes to r1 (10-20), then a's lane to r3, which queues behind r2
#        (20-30): r3 works 30-35. Waits 0, 10, 20, 29.
# cap 2: r0, r1 0-10; r2 queues. At 10 r0 completes first: its global permit goes to r2
#        (10-20), a's lane to r3, which finds the lane full (r1, r2) and queues; r1's
#        completion at 10 hands its permit to r3 (10-15). Waits 0, 0, 10, 9.
# cap 3: r0, r1, r2 0-10; r3 gets a's lane and a free permit at 10. Waits 0, 0, 0, 9. This
#        is the unlimited schedule: at most 3 work at once, so waits stop improving at 3.
# p99 of 4 sorted waits w: w[2] + 0.97 * (w[3] - w[2]).
HAND = [(0.0, "a", 10.0), (0.0, "b", 10.0), (0.0, "c", 10.0), (1.0, "a", 5.0)]
HAND_P99 = {1: 20 + Fraction(97, 100) * 9, 2: 9 + Fraction(97, 100), 3: Fraction(97, 100) * 9}
HAND_MAX = {1: 29, 2: 10, 3: 9}


@pytest.mark.timeout(10)
def test_hand_computed_trace_exact_answers() -> None:
    trace = generic(HAND)
    for bound in (False, True):
        # p99 <= 9.97 s exactly: cap 2 meets with no room to spare; cap 1 misses.
        plan = plan_capacity(trace, PlanGoal(Fraction("9.97")), bound=bound)
        assert plan.recommended_global == 2
        assert plan.saturation_global == 3
        # With the load bound, cap 1 is proven to miss without simulating it: 35 s of
        # work arrives within 1 s, and one slot serves at most 1 + 9.97 + 10 s of it.
        assert plan.proven_below == (2 if bound else 1)
        assert [r.global_cap for r in plan.table] == list(range(plan.proven_below, 4))
        for r in plan.table:
            assert r.wait_p99_s == float(HAND_P99[r.global_cap])
            assert r.wait_max_s == HAND_MAX[r.global_cap]
        assert [r.meets for r in plan.table] == [False, True, True][plan.proven_below - 1 :]
    one, two, three = plan_capacity(trace, PlanGoal(Fraction("9.97")), bound=False).table
    # Spans from the first arrival to the last completion: 35, 20 and 15 s; total work 35 s.
    assert one.throughput_rps == 4 / 35 and one.utilisation_mean == 1.0
    assert two.throughput_rps == 4 / 20 and two.utilisation_mean == 35 / 40
    assert three.throughput_rps == 4 / 15 and three.utilisation_mean == 35 / 45
    assert [r.utilisation_peak for r in (one, two, three)] == [1.0, 1.0, 1.0]
    assert [r.wait_p50_s for r in (one, two, three)] == [15.0, 4.5, 0.0]

    # 0.01 s less: cap 2 misses by that much, so cap 3.
    assert plan_capacity(trace, PlanGoal(Fraction("9.96"))).recommended_global == 3
    # A max goal below cap 2's longest wait (10 s) also needs cap 3.
    assert plan_capacity(trace, PlanGoal(10, max_wait_s=Fraction("9.5"))).recommended_global == 3
    # The range: from 3 on every cap is the unlimited schedule; up to 1 nothing meets.
    assert plan_capacity(trace, PlanGoal(10), min_global=5).recommended_global == 5
    capped = plan_capacity(trace, PlanGoal(Fraction("9.96")), max_global=2)
    assert capped.recommended_global is None and capped.floor_meets
    # Below the floor (r3 waits 9 s at every cap): no cap meets; a is the reason.
    floor = plan_capacity(trace, PlanGoal(Fraction("8.72")))
    assert floor.recommended_global is None and not floor.floor_meets
    assert [(o.key, o.requests, o.worst_wait_s) for o in floor.floor_offenders] == [("a", 1, 9.0)]


# A trace (found by search: about 1 random small trace in 20,000) whose waits rise from
# cap 2 to cap 3: max 11 s -> 12 s, p99 10.8 s -> 11.2 s. (timestamp, conversation, work).
NON_MONOTONE = [
    (0, 0, 9),
    (5, 0, 3),
    (6, 2, 8),
    (11, 2, 0),
    (12, 0, 8),
    (12, 6, 7),
    (14, 0, 0),
    (14, 4, 5),
    (16, 6, 8),
    (17, 2, 8),
    (18, 4, 6),
]


NON_MONOTONE_ROWS = list(NON_MONOTONE)


@pytest.mark.timeout(10)
def test_waits_are_not_monotone_in_the_cap_and_the_scan_finds_the_smallest() -> None:
    arr, keys, work = ([r[i] for r in NON_MONOTONE] for i in range(3))
    maxes = []
    for cap in (2, 3):
        sched = simulate(arr, keys, work, policy_lanes("session", cap))
        maxes.append(max(sched.waits))
    assert maxes == [11, 12]  # a larger cap, a longer wait
    trace = generic([(float(a), str(k), float(w)) for a, k, w in NON_MONOTONE])
    # max <= 11.5: 2 meets, 3 misses, 4 meets; the answer is 2, not "above the last miss".
    plan = plan_capacity(trace, PlanGoal(100, max_wait_s=Fraction(23, 2)), bound=False)
    assert plan.recommended_global == 2
    # p99 <= 11: the same shape on the p99.
    assert plan_capacity(trace, PlanGoal(11), bound=False).recommended_global == 2
    # p99 <= 10.7: caps 2 and 3 both miss, 4 meets.
    rows = plan_capacity(trace, PlanGoal(Fraction(107, 10)), bound=False)
    assert rows.recommended_global == 4
    assert [(r.global_cap, r.wait_p99_s) for r in rows.table][1:3] == [(2, 10.8), (3, 11.2)]


def brute_force(
    arr: list[int], keys: list[int], work: list[int], cap: int, goal: PlanGoal
) -> tuple[bool, list[Fraction]]:
    """Whether ``cap`` meets ``goal``, from the public exact simulation (times in
    seconds), and the waits; the p99 interpolated with Fractions."""
    sched = simulate(arr, keys, work, policy_lanes("session", cap))
    waits = sorted(sched.waits)
    pos = Fraction((len(waits) - 1) * 99, 100)
    lo = math.floor(pos)
    hi = min(lo + 1, len(waits) - 1)
    p99 = waits[lo] + (waits[hi] - waits[lo]) * (pos - lo)
    ok = p99 <= Fraction(goal.p99_wait_s)
    if goal.max_wait_s is not None:
        ok = ok and waits[-1] <= Fraction(goal.max_wait_s)
    return ok, list(sched.waits)


@pytest.mark.timeout(90)
@settings(max_examples=250, deadline=None)
@given(
    rows=st.lists(
        st.tuples(st.integers(0, 12), st.integers(0, 3), st.integers(0, 9)),
        min_size=1,
        max_size=14,
    ),
    p99_pick=st.integers(0, 40),
    max_pick=st.one_of(st.none(), st.integers(0, 40)),
    nudge=st.sampled_from([Fraction(0), Fraction(-1, 100), Fraction(1, 100)]),
    min_global=st.integers(1, 3),
    max_global=st.one_of(st.none(), st.integers(1, 16)),
    bound=st.booleans(),
)
# The non-monotone trace: goals between its caps 2 and 3 (max <= 11; p99 <= 11).
@example(NON_MONOTONE_ROWS, 17, 9, Fraction(0), 1, None, False)
@example(NON_MONOTONE_ROWS, 9, None, Fraction(0), 1, None, True)
def test_recommendation_is_the_smallest_cap_that_meets_the_goal(
    rows: list[tuple[int, int, int]],
    p99_pick: int,
    max_pick: int | None,
    nudge: Fraction,
    min_global: int,
    max_global: int | None,
    bound: bool,
) -> None:
    """The property: the recommended cap meets the goal and every smaller cap in the
    range misses it, checked against a brute-force simulation of every cap; every cap
    shown as meeting or missing does so; caps from the saturation cap on all give the
    unlimited schedule, which no cap beats for any request."""
    if max_global is not None and max_global < min_global:
        max_global = None
    rows.sort(key=lambda r: r[0])
    arr, keys, work = ([r[i] for r in rows] for i in range(3))
    n = len(rows)
    brute = {cap: brute_force(arr, keys, work, cap, PlanGoal(0)) for cap in range(1, n + 1)}
    # Goals at (or 0.01 s around) waits that really occur, so boundaries are hit.
    occurring = sorted({w for _, waits in brute.values() for w in waits})
    s = max(Fraction(0), occurring[p99_pick % len(occurring)] + nudge)
    m = None if max_pick is None else occurring[max_pick % len(occurring)]
    goal = PlanGoal(s, m)
    meets = {cap: brute_force(arr, keys, work, cap, goal)[0] for cap in range(1, n + 1)}

    def meets_at(cap: int) -> bool:
        return meets[min(cap, n)]  # a cap of n never queues anyone

    trace = generic([(float(a), str(k), float(w)) for a, k, w in rows])
    plan = plan_capacity(
        trace, goal, min_global=min_global, max_global=max_global, jobs=1, bound=bound
    )
    top = max_global if max_global is not None else n + min_global
    expected = next((c for c in range(min_global, top + 1) if meets_at(c)), None)
    assert plan.recommended_global == expected
    if expected is not None:
        assert meets_at(expected)
        assert not any(meets_at(c) for c in range(min_global, expected))
    for row in plan.table:
        assert row.meets == meets_at(row.global_cap)
    # Caps proven to miss by the load bound do miss.
    assert not any(meets_at(c) for c in range(min_global, plan.proven_below))
    # Saturation: every cap >= P gives the unlimited schedule; none is better anywhere.
    free = brute[n][1]
    p = plan.saturation_global
    for cap in range(1, n + 1):
        waits = brute[cap][1]
        assert all(w >= f for w, f in zip(waits, free, strict=True))
        if cap >= p:
            assert waits == free
    assert plan.floor_meets == meets_at(n)


@pytest.mark.timeout(60)
@settings(max_examples=300, deadline=None)
@given(
    rows=st.lists(
        st.tuples(st.integers(0, 30), st.integers(0, 4), st.integers(0, 6)),
        max_size=25,
    ),
    cap=st.integers(1, 4),
    record=st.booleans(),
)
def test_session_loop_takes_the_general_loops_decisions(
    rows: list[tuple[int, int, int]], cap: int, record: bool
) -> None:
    """simulate_ticks runs the session policy on a specialised loop: it must give the
    general loop's schedule exactly (arrivals in any order, ties, zero work)."""
    arr, keys, work = ([r[i] for r in rows] for i in range(3))
    lanes = policy_lanes("session", cap)
    fast = _simulate_ticks(arr, keys, work, lanes, record_grants=record)
    general = _simulate_ticks(arr, keys, work, lanes, record_grants=record, general=True)
    assert fast == general


@pytest.mark.timeout(30)
def test_parallel_scan_agrees_with_the_serial_one() -> None:
    trace = read_trace().head(3000)
    goal = PlanGoal(Fraction(1, 2), 120)
    serial = plan_capacity(trace, goal, jobs=1, bound=False)
    parallel = plan_capacity(trace, goal, jobs=2, bound=False)
    assert serial.recommended_global is not None
    assert parallel.table == serial.table
    assert parallel.recommended_global == serial.recommended_global
    assert parallel.jobs == 2


@pytest.mark.timeout(30)
def test_bundled_trace_plan_matches_direct_simulation() -> None:
    """The bundled trace: the recommendation meets the goal in a direct simulation of
    that cap, the cap below it misses, and the load bound skips only missing caps."""
    trace = read_trace()
    goal = PlanGoal(2)
    plan = plan_capacity(trace, goal, bound=True)
    rec = plan.recommended_global
    assert rec is not None and plan.proven_below > 1
    inputs = plan_inputs(trace)
    for cap, should_meet in ((rec, True), (rec - 1, False), (plan.proven_below - 1, False)):
        sched = simulate_ticks(
            inputs.arrival, inputs.keys, inputs.work, policy_lanes("session", cap)
        )
        waits = sorted(s - a for s, a in zip(sched.start, inputs.arrival, strict=True))
        assert (exact_percentile(waits, 99) <= 2 * TICKS_PER_S) is should_meet


# --------------------------------------------------------------------------------------
# Generic trace format


@pytest.mark.timeout(10)
def test_generic_json_lines_iso_timestamps_and_malformed_lines() -> None:
    lines = [
        json.dumps({"timestamp": "2025-01-31T09:00:00.250Z", "key": "c1", "duration_s": 2}),
        json.dumps(  # both work fields: the duration is used
            {
                "timestamp": "2025-01-31T10:00:01+01:00",
                "key": "c2",
                "duration_s": 1.5,
                "output_tokens": 99,
            }
        ),
        "{not json",
        json.dumps({"timestamp": "2025-01-31T09:00:00", "key": 7, "output_tokens": 40}),
        json.dumps({"timestamp": "yesterday", "key": "c1", "duration_s": 1}),
        json.dumps({"timestamp": "2025-01-31T09:00:02Z", "key": "c1"}),
        "",
        json.dumps({"timestamp": "2025-01-31T09:00:03Z", "key": "c1", "duration_s": -1}),
        json.dumps({"timestamp": "2025-01-31T09:00:03Z", "key": ["x"], "duration_s": 1}),
        json.dumps(
            {
                "timestamp": "2025-01-31T09:00:03.5Z",
                "key": "c3",
                "duration_s": None,
                "output_tokens": 10,
            }
        ),
    ]
    trace = parse_trace_lines(lines, trace_format="auto")
    assert trace.format == "generic"
    # Sorted by time: 09:00:00 (naive = UTC), 09:00:00.250, 09:00:01 (10:00:01+01:00).
    got = [(r.line, r.timestamp_ms, r.key, r.duration_us, r.output_length) for r in trace.requests]
    assert got == [
        (4, 0, "7", None, 40),
        (1, 250, "c1", 2_000_000, 0),
        (2, 1000, "c2", 1_500_000, 0),
        (10, 3500, "c3", None, 10),
    ]
    assert [r.conversation for r in trace.requests] == [2, 0, 1, 3]  # by first appearance
    reasons = {s.line: s.reason for s in trace.skipped}
    assert sorted(reasons) == [3, 5, 6, 7, 8, 9]
    assert reasons[3].startswith("invalid JSON")
    assert "ISO 8601" in reasons[5]
    assert "'duration_s' or 'output_tokens'" in reasons[6]
    assert reasons[7] == "blank line"
    assert "duration_s" in reasons[8]
    assert "key" in reasons[9]
    # Tokens need a time per token for a generic trace; durations do not.
    with pytest.raises(ValueError, match=r"the trace gives output_tokens, not durations, "
                       r"for some requests: say how much work one output token is, in "
                       r"milliseconds \(--tpot-ms MS\)"):
        plan_inputs(trace)
    inputs = plan_inputs(trace, tpot_ms=12.5)
    assert inputs.arrival == [0, 250_000, 1_000_000, 3_500_000]
    assert inputs.work == [500_000, 2_000_000, 1_500_000, 125_000]


@pytest.mark.timeout(10)
def test_generic_csv_with_seconds_and_bad_rows(tmp_path: Path) -> None:
    path = tmp_path / "gateway.csv"
    path.write_text(
        "timestamp,key,duration_s\n"
        "1700000000.5,conv-a,1.25\n"
        "1700000001,conv-b,0.5\n"
        "1700000001,conv-a\n"  # a column short
        "soon,conv-c,1\n"
        '1700000002.000001,"conv,c",2\n'
    )
    trace = read_trace(path, trace_format="auto")
    assert [(r.timestamp_ms, r.key, r.duration_us) for r in trace.requests] == [
        (0, "conv-a", 1_250_000),
        (500, "conv-b", 500_000),
        (1500.001, "conv,c", 2_000_000),
    ]
    assert [s.line for s in trace.skipped] == [4, 5]
    assert "CSV columns" in trace.skipped[0].reason
    assert plan_inputs(trace).arrival == [0, 500_000, 1_500_001]
    # A spreadsheet's export: byte-order mark, CRLF line ends.
    excel = tmp_path / "excel.csv"
    excel.write_bytes(b"\xef\xbb\xbftimestamp,key,duration_s\r\n5,a,1\r\n6,b,2\r\n")
    assert [(r.key, r.timestamp_ms) for r in read_trace(excel, trace_format="auto").requests] == [
        ("a", 0),
        ("b", 1000),
    ]
    bad_header = tmp_path / "h.csv"
    bad_header.write_text("time,conversation,duration_s\n1,a,1\n")
    from lanequeue.replay import TraceError

    with pytest.raises(TraceError, match="header"):
        read_trace(bad_header, trace_format="auto")
    # Seconds from 0 and ISO dates in one file: the error names both lines and the cause.
    mixed = tmp_path / "mixed.csv"
    mixed.write_text("timestamp,key,duration_s\n0.25,a,1\n2025-03-04T09:00:00Z,b,1\n")
    with pytest.raises(TraceError, match=r"earliest timestamp is on line 2, its latest on "
                       r"line 3; are two kinds of timestamps mixed"):
        read_trace(mixed, trace_format="auto")
    # The Mooncake format is still told apart, and is still the default reader.
    assert read_trace(trace_format="auto").format == "mooncake"


# --------------------------------------------------------------------------------------
# CLI


def write_generic(path: Path, rows: list[tuple[float, str, float]]) -> Path:
    path.write_text(
        "".join(json.dumps({"timestamp": t, "key": k, "duration_s": d}) + "\n" for t, k, d in rows)
    )
    return path


@pytest.mark.timeout(30)
def test_cli_plan_json_and_plot(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    trace = write_generic(tmp_path / "t.jsonl", HAND)
    out, png = tmp_path / "plan.json", tmp_path / "plan.png"
    code = main(
        ["plan", str(trace), "--p99-wait-s", "9.97", "--json", str(out), "--plot", str(png)]
    )
    assert code == 0
    data = json.loads(out.read_text())
    assert list(data) == ["recommended_global", "goal", "table"]
    assert data["recommended_global"] == 2
    assert data["goal"] == {"p99_wait_s": 9.97, "max_wait_s": None}
    assert [row["global"] for row in data["table"]] == [1, 2, 3]
    assert list(data["table"][0]) == [
        "global",
        "wait_p50_s",
        "wait_p95_s",
        "wait_p99_s",
        "wait_max_s",
        "throughput_rps",
        "utilisation_mean",
        "utilisation_peak",
    ]
    assert data["table"][1]["wait_max_s"] == 10.0
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    printed = capsys.readouterr().out
    assert "recommended global cap: 2" in printed
    assert "waits stop improving at global cap 3" in printed


@pytest.mark.timeout(30)
def test_cli_no_feasible_cap_exits_3(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    trace = write_generic(tmp_path / "t.jsonl", HAND)
    out = tmp_path / "plan.json"
    assert main(["plan", str(trace), "--p99-wait-s", "8.72", "--json", str(out)]) == 3
    printed = capsys.readouterr().out
    assert "no cap meets the goal" in printed
    assert "conversation a: 1 request over, longest wait 9.000 s" in printed
    assert json.loads(out.read_text())["recommended_global"] is None
    # A max goal below a's 9 s serialisation wait: also infeasible.
    assert main(["plan", str(trace), "--p99-wait-s", "100", "--max-wait-s", "8"]) == 3
    # Feasible, but not within --max-global: 3 too.
    # Every cap up to 2 was simulated: cap 3 (saturation) is proven the smallest that meets.
    assert main(["plan", str(trace), "--p99-wait-s", "9.96", "--max-global", "2"]) == 3
    assert (
        "no cap in 1-2 meets the goal: cap 3 is the smallest that meets it (from 3 on, every "
        "cap does)" in capsys.readouterr().out
    )


@pytest.mark.timeout(30)
def test_cli_plan_bad_arguments_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    tokens = tmp_path / "tokens.jsonl"
    tokens.write_text(json.dumps({"timestamp": 0, "key": "a", "output_tokens": 10}) + "\n")
    assert main(["plan", str(tokens), "--p99-wait-s", "1"]) == 2
    assert "--tpot-ms" in capsys.readouterr().err
    assert main(["plan", str(tokens), "--p99-wait-s", "1", "--tpot-ms", "20"]) == 0
    assert main(["plan", str(tmp_path / "missing"), "--p99-wait-s", "1"]) == 2
    assert (
        main(["plan", str(tokens), "--p99-wait-s", "1", "--min-global", "5", "--max-global", "2"])
        == 2
    )
    assert ("argument --min-global: min-global must be at most max-global (2), got 5"
            in capsys.readouterr().err)
    assert main(["plan", str(tokens), "--p99-wait-s", "-1"]) == 2
    assert (
        "argument --p99-wait-s: p99-wait-s must be a number of seconds from 0 to 1e+09, got -1"
        in capsys.readouterr().err
    )
    empty = tmp_path / "empty.jsonl"
    empty.write_text("{bad\n")
    assert main(["plan", str(empty), "--p99-wait-s", "1"]) == 2
    err = capsys.readouterr().err
    assert "lanequeue plan:" in err and "line 1: invalid JSON" in err


@pytest.mark.timeout(30)
def test_cli_reports_malformed_lines_with_numbers(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "t.csv"
    path.write_text(
        "timestamp,key,duration_s\n2025-01-31T09:00:00Z,a,1\nnope,a,1\n\n"
        "2025-01-31T09:00:01Z,b,x\n2025-01-31T09:00:02Z,b,1\n"
    )
    assert main(["plan", str(path), "--p99-wait-s", "0", "--max-bad-lines", "50%"]) == 0
    err = capsys.readouterr().err
    assert "line 3: field 'timestamp'" in err
    assert "line 5: field 'duration_s'" in err
    assert "line 4" not in err  # blank: passed over, counted apart
    assert "lanequeue plan: 1 blank line passed over" in err
    assert ("lanequeue plan: 2 malformed lines skipped (50% of 4 request lines, within "
            "--max-bad-lines 50%); planning from the other 2") in err
    assert "most lines were not requests" not in err  # half of them were


# --------------------------------------------------------------------------------------
# --verify: the recommendation replayed through real lanes

# Three conversations over 2 s of trace time, work 0.3-0.8 s; at cap 2 several requests
# wait for the global lane and some for their own conversation.
VERIFY_ROWS = [
    (0.0, "a", 0.6),
    (0.05, "b", 0.5),
    (0.1, "c", 0.8),
    (0.3, "a", 0.3),
    (0.5, "b", 0.4),
    (0.7, "c", 0.3),
    (0.9, "a", 0.5),
    (1.2, "b", 0.6),
    (1.4, "c", 0.4),
    (1.6, "a", 0.3),
    (1.8, "b", 0.3),
    (2.0, "c", 0.5),
]
#: Measured waits may differ from the simulated ones by scheduling latency and sleep
#: overshoot; on a loaded 2-core machine 0.25 s of trace time (speed 1) is generous.
VERIFY_TOLERANCE_S = 0.25


@pytest.mark.timeout(30)
def test_verify_real_waits_match_simulated_ones() -> None:
    trace = generic(VERIFY_ROWS)
    check = verify_plan(trace, 2, speed=1.0)
    sim = check.simulated
    assert sim.wait_max_s > 0.3  # the cap really makes requests wait
    assert check.failed_checks() == []
    assert check.peak_global <= 2
    for measured, simulated in (
        (check.wait_p50_s, sim.wait_p50_s),
        (check.wait_p95_s, sim.wait_p95_s),
        (check.wait_p99_s, sim.wait_p99_s),
        (check.wait_max_s, sim.wait_max_s),
    ):
        assert abs(measured - simulated) <= VERIFY_TOLERANCE_S, (measured, simulated)


@pytest.mark.timeout(30)
def test_cli_verify(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    trace = write_generic(tmp_path / "t.jsonl", VERIFY_ROWS)
    assert main(["plan", str(trace), "--p99-wait-s", "0.5", "--verify", "--speed", "2"]) == 0
    printed = capsys.readouterr().out
    assert "verify: replayed at global cap" in printed
    assert "measured" in printed and "simulated" in printed


def test_verify_report_says_whether_the_measured_waits_meet_the_goal() -> None:
    """The measured waits are not a lane invariant (no exit status), but the report
    says plainly when they miss the goal the cap was planned for."""
    import dataclasses

    check = verify_plan(generic(VERIFY_ROWS), 2, speed=50.0, goal=PlanGoal(5, max_wait_s=9))
    met = dataclasses.replace(check, wait_p99_s=2.0, wait_max_s=3.0)
    assert met.measured_meets_goal() is True
    assert "goal (p99 wait <= 5 s and max wait <= 9 s): the measured waits meet it" in met.text()
    for p99, most in ((6.0, 7.0), (2.0, 9.5)):  # the p99 misses; the max misses
        missed = dataclasses.replace(check, wait_p99_s=p99, wait_max_s=most)
        assert missed.measured_meets_goal() is False
        assert "the measured waits MISS it" in missed.text()
        assert "50 times over" in missed.text() and "lower --speed" in missed.text()
        assert missed.failed_checks() == []  # not an invariant
    # At speed 1, a lower speed is no advice: the replay's own delays remain.
    slow = dataclasses.replace(check, speed=1.0, wait_p99_s=6.0)
    assert "no speed removes" in slow.text() and "lower --speed" not in slow.text()
    no_goal = dataclasses.replace(check, goal=None)
    assert no_goal.measured_meets_goal() is None and "goal (" not in no_goal.text()


# --------------------------------------------------------------------------------------
# The README's section, kept true

README = Path(__file__).resolve().parent.parent / "README.md"


def readme_blocks() -> list[str]:
    text = README.read_text(encoding="utf-8")
    section = text.split("## Capacity planning: `lanequeue plan`", 1)[1].split("\n## ", 1)[0]
    return section.split("```")[1::2]


@pytest.mark.timeout(30)
def test_readme_run_on_the_bundled_trace_is_what_plan_prints() -> None:
    block = next(b for b in readme_blocks() if "$ lanequeue plan" in b)
    shown = block.strip().splitlines()
    assert shown[0] == "$ lanequeue plan --p99-wait-s 2 --max-wait-s 60"
    printed = plan_capacity(read_trace(), PlanGoal(2, 60)).text().splitlines()
    # Everything but the last line (the time taken) is the same.
    assert shown[1:-1] == printed[:-1]
    assert shown[-1].split(" in ")[0] == printed[-1].split(" in ")[0]


@pytest.mark.timeout(30)
def test_readme_generic_example(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    block = next(b for b in readme_blocks() if b.lstrip().startswith("timestamp,key"))
    lines = block.strip().splitlines()
    assert len(lines) == 10
    path = tmp_path / "example.csv"
    path.write_text("\n".join(lines) + "\n")
    trace = read_trace(path, trace_format="auto")
    assert len(trace.requests) == 9 and trace.skipped == ()
    assert main(["plan", str(path), "--tpot-ms", "20", "--p99-wait-s", "0.5"]) == 3
    printed = capsys.readouterr().out
    assert "conversation conv-22: 2 requests over, longest wait 3.905 s" in printed
    # conv-22's first request: 310 tokens x 20 ms.
    assert plan_inputs(trace, tpot_ms=20).work[1] == 6_200_000
    assert main(["plan", str(path), "--p99-wait-s", "0.5"]) == 2


# --------------------------------------------------------------------------------------
# Settings: every bad value refused at once (exit 2, naming the option), before any work


def run_cli(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    """The exit status and stderr of ``lanequeue ARGV`` (argparse's own refusals too)."""
    code, _, err = conftest.run_cli(argv, capsys)
    return code, err


@pytest.fixture
def no_work(monkeypatch: pytest.MonkeyPatch) -> None:
    """Fail the test if the command reads a trace or simulates anything."""

    def boom(*args: object, **kwargs: object) -> None:
        raise AssertionError("the command did work before refusing its settings")

    monkeypatch.setattr("lanequeue.replay.trace.read_trace", boom)
    monkeypatch.setattr("lanequeue.replay.plan.simulate_ticks", boom)
    monkeypatch.setattr("lanequeue.replay.plan.verify_plan", boom)


HUGE = str(10**30)
BAD_PLAN_SETTINGS = [
    *(("--speed", v) for v in ("0", "-1", "nan", "inf", "1e400", "1e7", HUGE)),
    *(("--tpot-ms", v) for v in ("-1", "nan", "inf", "1e400", "60001", HUGE)),
    *(("--min-global", v) for v in ("0", "-1", "nan", "1e400", HUGE)),
    *(("--max-global", v) for v in ("0", "-1", "inf", HUGE)),
    *(("--jobs", v) for v in ("0", "-1", "nan", "1025", HUGE)),
    *(("--p99-wait-s", v) for v in ("-1", "nan", "inf", "1e400", "1e10", HUGE)),
    # Not ASCII decimals (Fraction() takes "1_000" from Python 3.11 only):
    *(("--p99-wait-s", v) for v in ("1_000", "2/3", "\u0661")),
    *(("--max-wait-s", v) for v in ("-1", "nan", "-inf", "1e400", HUGE)),
]


@pytest.mark.timeout(10)
@pytest.mark.parametrize(("option", "value"), BAD_PLAN_SETTINGS)
def test_cli_plan_refuses_a_bad_setting_at_once(
    option: str, value: str, no_work: None, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["plan", "--verify", "--p99-wait-s", "2", option, value]
    code, err = run_cli(argv, capsys)
    assert code == 2
    assert f"argument {option}" in err
    assert "Traceback" not in err


@pytest.mark.timeout(10)
def test_cli_plan_names_the_range_of_a_refused_setting(
    no_work: None, capsys: pytest.CaptureFixture[str]
) -> None:
    # As argparse's own refusals: the usage line, then the error naming the option.
    code, err = run_cli(["plan", "--verify", "--p99-wait-s", "2", "--speed", "nan"], capsys)
    assert code == 2 and err.startswith("usage: lanequeue plan [-h] --p99-wait-s S")
    assert err.splitlines()[-1] == (
        "lanequeue plan: error: argument --speed: speed must be a number from 1e-06 to "
        "1e+06, got nan"
    )
    for argv in (["plan", "--p99-wait-s", "2", "--min-global", "0"],  # range (the check)
                 ["plan", "--p99-wait-s", "2", "--min-global", "1.5"]):  # type (argparse)
        code, err = run_cli(argv, capsys)
        assert code == 2 and err.startswith("usage: lanequeue plan"), argv
        assert err.splitlines()[-1].startswith(
            "lanequeue plan: error: argument --min-global: "), argv
    # 1e400 seconds is refused (a goal must stay a finite float in --json), not overflowed,
    # and shown as it was typed.
    code, err = run_cli(["plan", "--p99-wait-s", "1e400"], capsys)
    assert code == 2
    assert ("argument --p99-wait-s: p99-wait-s must be a number of seconds from 0 to 1e+09, "
            "got 1e400\n") in err
    code, err = run_cli(["plan", "--p99-wait-s", "1", "--max-wait-s", "1.5e400"], capsys)
    assert code == 2
    assert ("argument --max-wait-s: max-wait-s must be a number of seconds from 0 to 1e+09, "
            "got 1.5e400\n") in err
    code, err = run_cli(["plan", "--p99-wait-s", "1", "--jobs", HUGE], capsys)
    assert f"jobs must be an integer from 1 to 1,024, got {HUGE}\n" in err
    from lanequeue.replay.plan import check_plan_arguments

    # The API, which has no text, shows a huge value in scientific notation, not its digits.
    for value, shown in ((10**30, "1e+30"), (10**30 + 7, "about 1e+30")):
        with pytest.raises(ValueError, match=re.escape(
                f"jobs must be an integer from 1 to 1,024, got {shown}") + "$"):
            check_plan_arguments(jobs=value)
    with pytest.raises(ValueError, match=r"got 1e\+400$"):
        PlanGoal(Fraction(10**400))


@pytest.mark.timeout(10)
def test_plan_settings_are_checked_in_one_place() -> None:
    from lanequeue.replay._checks import SettingError
    from lanequeue.replay.plan import check_plan_arguments

    for kwargs, setting in (
        ({"speed": 0.0}, "speed"),
        ({"speed": math.inf}, "speed"),
        ({"tpot_ms": math.nan}, "tpot_ms"),
        ({"min_global": 0}, "min_global"),
        ({"max_global": 10**30}, "max_global"),
        ({"jobs": 0}, "jobs"),
    ):
        with pytest.raises(SettingError) as info:
            check_plan_arguments(**kwargs)  # type: ignore[arg-type]
        assert info.value.setting == setting
        with pytest.raises(SettingError):  # the same check behind the API
            if setting == "speed":
                verify_plan(generic(HAND), 1, **kwargs)  # type: ignore[arg-type]
            else:
                plan_capacity(generic(HAND), PlanGoal(1), **kwargs)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"min_global must be at most max_global \(2\), got 5"):
        check_plan_arguments(min_global=5, max_global=2)
    with pytest.raises(TypeError, match="min_global must be an integer"):
        check_plan_arguments(min_global=1.0)  # type: ignore[arg-type]
    for bad in (-1, math.nan, math.inf, 1e400, 10**10, Fraction(10**400)):
        with pytest.raises(SettingError):
            PlanGoal(bad)
        with pytest.raises(SettingError):
            PlanGoal(1, bad)
    # The largest goal accepted stays a finite float in the JSON document.
    assert PlanGoal(10**9, 10**9).to_dict() == {"p99_wait_s": 1e9, "max_wait_s": 1e9}


# --------------------------------------------------------------------------------------
# What the plan says: true hints, empty ranges, keys printed safely


@pytest.mark.timeout(60)
def test_max_global_hint_says_only_what_was_simulated() -> None:
    trace = read_trace()
    full = plan_capacity(trace, PlanGoal(2))
    sat, best = full.saturation_global, full.recommended_global
    assert best is not None and 41 <= best < sat - 1  # caps between 40 and sat also meet
    capped = plan_capacity(trace, PlanGoal(2), max_global=40)
    assert capped.recommended_global is None
    text = capped.text()
    assert (
        f"no cap in 1-40 meets the goal: every cap from {sat} on meets it; caps 41-{sat - 1} "
        "were not simulated, so the smallest that does is not known (raise --max-global to "
        "find it)"
    ) in text
    assert f"caps >= {sat}" not in text
    # (When every cap up to sat - 1 misses, sat is proven the smallest: see
    # test_cli_no_feasible_cap_exits_3.)


@pytest.mark.timeout(10)
def test_recommendation_line_for_every_range() -> None:
    trace = generic(HAND)  # p99: cap 1 29.73, cap 2 9.97, cap 3 8.73

    def line(plan_text: str) -> str:
        return next(x for x in plan_text.splitlines() if x.startswith("recommended"))

    assert line(plan_capacity(trace, PlanGoal(30)).text()) == (
        "recommended global cap: 1 (the smallest cap meets the goal)"
    )
    assert line(plan_capacity(trace, PlanGoal(Fraction("9.97"))).text()) == (
        "recommended global cap: 2 (the smallest cap that meets the goal; cap 1 misses it)"
    )
    assert line(plan_capacity(trace, PlanGoal(Fraction("8.73"))).text()) == (
        "recommended global cap: 3 (the smallest cap that meets the goal; every cap in 1-2 "
        "misses it)"
    )
    # The range starts at the recommendation: nothing smaller was searched, and it says so.
    assert line(plan_capacity(trace, PlanGoal(30), min_global=2, max_global=3).text()) == (
        "recommended global cap: 2 (the smallest cap searched meets the goal; caps below 2 "
        "were not searched)"
    )
    assert line(plan_capacity(trace, PlanGoal(Fraction("8.73")), min_global=2).text()) == (
        "recommended global cap: 3 (the smallest cap that meets the goal; cap 2 misses it; "
        "caps below 2 were not searched)"
    )
    assert "from 60" not in plan_capacity(read_trace().head(2000), PlanGoal(2), min_global=60,
                                          max_global=70).text()


@pytest.mark.timeout(10)
def test_keys_are_escaped_and_cut_when_printed(tmp_path: Path) -> None:
    long_key = "k" * 200_000
    rows = [
        (0.0, "evil\nrecommended global cap: 1", 10.0),
        (1.0, "evil\nrecommended global cap: 1", 1.0),
        (0.0, long_key, 10.0),
        (1.0, long_key, 1.0),
    ]
    text = plan_capacity(generic(rows), PlanGoal(1)).text()
    assert "no cap meets the goal" in text
    lines = text.splitlines()
    assert not any(x.startswith("recommended") for x in lines)  # no injected line
    assert any(
        x.startswith("  conversation evil\\nrecommended global cap: 1: 1 request over")
        for x in lines
    )
    long_line = next(x for x in lines if "kkkk" in x)
    assert f"conversation {'k' * 60}... (200,000 characters): 1 request over" in long_line
    assert len(long_line) < 200


# --------------------------------------------------------------------------------------
# ISO 8601: one accepted set on every Python version


def utc_us(*args: int) -> int:
    from datetime import datetime, timezone

    delta = datetime(*args, tzinfo=timezone.utc) - datetime(1970, 1, 1, tzinfo=timezone.utc)
    return delta.days * 86_400_000_000 + delta.seconds * 1_000_000 + delta.microseconds


ISO_ACCEPTED = [
    ("2025-03-04T09:00:00Z", utc_us(2025, 3, 4, 9)),
    ("2025-03-04t09:00:00z", utc_us(2025, 3, 4, 9)),
    ("2025-03-04 09:00:00", utc_us(2025, 3, 4, 9)),  # no offset: UTC
    ("2025-03-04T09:00", utc_us(2025, 3, 4, 9)),
    ("2025-03-04", utc_us(2025, 3, 4)),
    ("2025-03-04T09:00:00.120Z", utc_us(2025, 3, 4, 9, 0, 0, 120_000)),
    ("2025-03-04T09:00:00,120Z", utc_us(2025, 3, 4, 9, 0, 0, 120_000)),  # comma decimal
    ("2025-03-04T09:00:00.1234565Z", utc_us(2025, 3, 4, 9, 0, 0, 123_456)),  # half to even
    ("2025-03-04T09:00:00.123456789Z", utc_us(2025, 3, 4, 9, 0, 0, 123_457)),
    ("2025-03-04T23:59:59.9999999Z", utc_us(2025, 3, 5)),  # rounds into the next day
    ("2025-03-04T10:00:00+01:00", utc_us(2025, 3, 4, 9)),
    ("2025-03-04T10:00:00+0100", utc_us(2025, 3, 4, 9)),
    ("2025-03-04T10:00:00+01", utc_us(2025, 3, 4, 9)),
    ("2025-03-04T04:30:00-04:30", utc_us(2025, 3, 4, 9)),
    ("2024-02-29T00:00:00Z", utc_us(2024, 2, 29)),
]
ISO_REFUSED = [
    "20250304T090000Z",  # basic format
    "2025-W10-2T09:00:00Z",  # week date
    "2025-063T09:00:00Z",  # ordinal date
    "2025-03-04T24:00:00Z",
    "2025-03-04T09:60:00Z",
    "2025-03-04T09:00:60Z",  # leap second
    "2025-02-29T09:00:00Z",
    "0000-01-01T00:00:00Z",
    "2025-3-4T09:00:00Z",
    "+2025-03-04T09:00:00Z",
    "2025-03-04T09Z",
    "2025-03-04T09:00.5Z",  # fraction of a minute
    "2025-03-04T09:00:00.1234567890Z",  # 10 fraction digits
    "2025-03-04T09:00:00+24:00",
    "2025-03-04T09:00:00+01:60",
    "2025-03-04T09:00:00 +01:00",
    "2025-03-04T09:00:00+01:00:00",
    "2025-03-04Z",
    "\uff12\uff10\uff12\uff15-03-04T09:00:00Z",  # fullwidth digits
    "2025-03-04T09:00:00Zjunk",
]


@pytest.mark.timeout(10)
@pytest.mark.parametrize(("text", "expected"), ISO_ACCEPTED)
def test_iso8601_accepted_forms(text: str, expected: int) -> None:
    from lanequeue.replay.trace import iso8601_us

    assert iso8601_us(text) == expected
    csv_cell = f'"{text}"' if "," in text else text
    trace = parse_trace_lines(
        ["timestamp,key,duration_s", "2024-06-01T00:00:00Z,a,1", f"{csv_cell},b,1"],
        trace_format="auto",
    )
    assert trace.skipped == ()
    at = dict(zip([r.key for r in trace.requests], plan_inputs(trace).arrival, strict=True))
    assert at["b"] - at["a"] == expected - utc_us(2024, 6, 1)


@pytest.mark.timeout(10)
@pytest.mark.parametrize("text", ISO_REFUSED)
def test_iso8601_refused_forms(text: str) -> None:
    from lanequeue.replay.trace import iso8601_us

    assert iso8601_us(text) is None
    line = json.dumps({"timestamp": text, "key": "a", "duration_s": 1})
    trace = parse_trace_lines([line], trace_format="auto")
    assert trace.requests == ()
    assert "ISO 8601" in trace.skipped[0].reason


# --------------------------------------------------------------------------------------
# Numbers in text, and values no reader may crash on


@pytest.mark.timeout(10)
def test_csv_numbers_are_ascii_decimal_only() -> None:
    lines = [
        "timestamp,key,duration_s,output_tokens",
        "1,a,1_000,",  # float() takes underscores: refused here
        "2,a,nan,",
        "3,a,inf,",
        "4,a,١٢,",  # float() takes other scripts' digits
        "5,a,0x10,",
        "1_000,a,1,",
        "6,a,,1_0",
        "7,a,,12.0",
        "8,a, 2.5e-1 ,",
        "9,a,,+7",
        " 10 ,a,.5,",
    ]
    trace = parse_trace_lines(lines, trace_format="auto")
    assert [s.line for s in trace.skipped] == [2, 3, 4, 5, 6, 7, 8, 9]
    assert [(r.line, r.duration_us, r.output_length) for r in trace.requests] == [
        (10, 250_000, 0),
        (11, None, 7),
        (12, 500_000, 0),
    ]
    assert "field 'duration_s'" in trace.skipped[0].reason
    assert "field 'output_tokens'" in trace.skipped[6].reason


@pytest.mark.timeout(10)
def test_huge_and_deep_json_values_are_skipped_not_crashing() -> None:
    big = "9" * 400
    bigger = "9" * 5000  # past Python's digit limit for int()
    deep = "[" * 100_000 + "]" * 100_000
    long_text = "x" * 200_000
    generic_lines = [
        f'{{"timestamp": {big}, "key": "a", "duration_s": 1}}',
        f'{{"timestamp": 1, "key": "a", "duration_s": {big}}}',
        f'{{"timestamp": 1, "key": "a", "output_tokens": {big}}}',
        f'{{"timestamp": 1, "key": "a", "duration_s": {bigger}}}',
        f'{{"timestamp": 1, "key": {deep}, "duration_s": 1}}',
        json.dumps({"timestamp": long_text, "key": "a", "duration_s": 1}),
        '{"timestamp": NaN, "key": "a", "duration_s": 1}',
        '{"timestamp": 1, "key": "a", "duration_s": Infinity}',
        json.dumps({"timestamp": 2, "key": "a", "duration_s": 1}),
    ]
    trace = parse_trace_lines(generic_lines, trace_format="generic")
    assert [r.line for r in trace.requests] == [9]
    assert [s.line for s in trace.skipped] == list(range(1, 9))
    assert all(len(s.reason) < 300 for s in trace.skipped)
    assert "(200,000 characters)" in trace.skipped[5].reason
    mooncake_lines = [
        f'{{"timestamp": {big}, "input_length": 1, "output_length": 1, "hash_ids": [0, 1]}}',
        f'{{"timestamp": 1, "input_length": 1, "output_length": {bigger}, "hash_ids": [0, 1]}}',
        f'{{"timestamp": 1, "input_length": 1, "output_length": 1, "hash_ids": {deep}}}',
        '{"timestamp": 1, "input_length": 1, "output_length": 1, "hash_ids": [0, 1]}',
    ]
    trace = parse_trace_lines(mooncake_lines, trace_format="auto")
    assert trace.format == "mooncake"
    assert [r.line for r in trace.requests] == [4]
    assert [s.line for s in trace.skipped] == [1, 2, 3]


@pytest.mark.timeout(60)
def test_readme_max_global_hint_and_error_example_are_what_is_printed(
    capsys: pytest.CaptureFixture[str],
) -> None:
    text = " ".join(README.read_text(encoding="utf-8").split())
    shown = text.split("`lanequeue plan --p99-wait-s 2 --max-global 40` prints `", 1)[1]
    shown = shown.split("`", 1)[0]
    trace = read_trace()
    assert shown in plan_capacity(trace, PlanGoal(2), max_global=40).text().splitlines()
    assert "(without the limit, 53 is recommended)" in text
    assert plan_capacity(trace, PlanGoal(2)).recommended_global == 53
    example = text.split("a message naming the option, e.g. `", 1)[1].split("`", 1)[0]
    code, err = run_cli(["replay", "--speed", "nan"], capsys)
    assert code == 2 and err.startswith("usage: lanequeue replay [-h]")
    assert err.splitlines()[-1] == example


@pytest.mark.timeout(30)
def test_trace_names_are_escaped_when_printed(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "gateway\nrecommended global cap: 1.csv"
    path.write_text("timestamp,key,duration_s\n0,a,1\nbad,a,1\n")
    assert main(["plan", str(path), "--p99-wait-s", "1", "--max-bad-lines", "100%"]) == 0
    captured = capsys.readouterr()
    shown = str(path).replace("\n", "\\n")
    assert captured.out.splitlines()[0] == f"lanequeue plan: {shown}"
    assert captured.err.splitlines()[0].startswith(f"lanequeue plan: {shown}: line 3:")
    assert main(["replay", str(path), "--speed", "1000", "--max-bad-lines", "1"]) == 0
    captured = capsys.readouterr()
    assert captured.out.splitlines()[0] == f"lanequeue replay: {shown}"
    assert captured.err.splitlines()[0].startswith(f"lanequeue replay: {shown}: line 3:")


@pytest.mark.timeout(10)
def test_cli_output_paths_refused_at_once_naming_the_option(
    tmp_path: Path, no_work: None, capsys: pytest.CaptureFixture[str]
) -> None:
    for option, value, reason in (
        ("--json", str(tmp_path), "it is a directory"),
        ("--json", str(tmp_path / "no" / "p.json"), "does not exist"),
        ("--plot", str(tmp_path / "p.txt"), "ending in .png"),
    ):
        code, err = run_cli(["plan", "--p99-wait-s", "2", option, value], capsys)
        assert code == 2
        assert f"lanequeue plan: error: argument {option}: " in err and reason in err


# --------------------------------------------------------------------------------------
# Figures next to the goal: shown on the side of it they are on


def _row_cells(printed: str, cap: int) -> list[str]:
    """The cells of global cap ``cap``'s row of the printed table."""
    return next(line.split() for line in printed.splitlines()
                if line.split()[:1] == [str(cap)] and "s," not in line)


@pytest.mark.timeout(30)
def test_a_cap_that_misses_shows_waits_visibly_over_the_goal(
    tmp_path: Path, capsys: pytest.CaptureFixture[str],
) -> None:
    """The table printed waits to 3 decimals next to a goal compared exactly: cap 1 below
    misses p99 <= 1.98 s and max <= 2 s with a p99 of 1.980396 s and a max of 2.0004 s,
    and showed ``1.980  2.000  miss``. A wait on the other side of the goal from its
    rounding gets the digits that show it there (and one within the goal is never rounded
    up past it); the goal is shown as given."""
    trace = write_generic(tmp_path / "t.jsonl", [(0.0, "a", 2.0004), (0.0, "b", 2.0004)])
    code = main(["plan", str(trace), "--p99-wait-s", "1.98", "--max-wait-s", "2"])
    printed = capsys.readouterr().out
    assert code == 0, printed
    assert "goal: p99 wait <= 1.98 s and max wait <= 2 s" in printed
    assert _row_cells(printed, 1)[3:5] == ["1.9804", "2.0004"]
    assert _row_cells(printed, 1)[-1] == "miss"
    assert _row_cells(printed, 2)[3:5] == ["0.000", "0.000"]
    # Within the goal, a wait is never rounded up past it: a max of 1.9996 s meets
    # max <= 1.9997 s, and is not shown as 2.000.
    near = write_generic(tmp_path / "u.jsonl", [(0.0, "a", 1.9996), (0.0, "b", 1.9996)])
    assert main(["plan", str(near), "--p99-wait-s", "10", "--max-wait-s", "1.9997"]) == 0
    printed = capsys.readouterr().out
    assert _row_cells(printed, 1)[4] == "1.9996"
    assert "MEETS <- recommended" in " ".join(_row_cells(printed, 1))
    # A goal is shown as given, not to 6 significant digits.
    assert main(["plan", str(trace), "--p99-wait-s", "1.0000001"]) == 0
    assert "goal: p99 wait <= 1.0000001 s" in capsys.readouterr().out


@pytest.mark.timeout(30)
def test_waits_over_the_goal_at_every_cap_are_shown_over_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str],
) -> None:
    """Conversation a's second request waits 2.0004 s behind its first at every cap:
    ``wait more than 2 s at every cap ... longest wait 2.000 s`` is now ``2.0004 s``."""
    trace = write_generic(tmp_path / "t.jsonl", [(0.0, "a", 2.0004), (0.0, "a", 1.0)])
    assert main(["plan", str(trace), "--p99-wait-s", "10", "--max-wait-s", "2"]) == 3
    printed = capsys.readouterr().out
    # (counted in the singular: "1 requests of 1 conversations wait" before)
    assert "1 request of 1 conversation waits more than 2 s at every cap; the longest:" in printed
    assert "conversation a: 1 request over, longest wait 2.0004 s" in printed


@pytest.mark.timeout(30)
def test_verify_shows_measured_waits_on_their_side_of_the_goal() -> None:
    import dataclasses

    check = verify_plan(generic(VERIFY_ROWS), 2, speed=50.0,
                        goal=PlanGoal(Fraction("0.1"), max_wait_s=Fraction("2")))
    over = dataclasses.replace(check, wait_p99_s=0.05, wait_max_s=2.0000004)
    assert over.measured_meets_goal() is False
    text = over.text()
    assert "goal (p99 wait <= 0.1 s and max wait <= 2 s): the measured waits MISS it" in text
    assert any(line.split()[:2] == ["wait_max_s", "2.0000004"] for line in text.splitlines())
    # 0.1 s measured meets a goal of 0.1 s (the float 0.1 is a hair above one tenth).
    at = dataclasses.replace(check, wait_p99_s=0.1, wait_max_s=2.0)
    assert at.measured_meets_goal() is True
    assert any(line.split()[:2] == ["wait_p99_s", "0.100"] for line in at.text().splitlines())
