"""``lanequeue replay --busy``: the trace through a Dispatcher, per busy policy.

A small trace whose outcome each policy fixes (one conversation's three messages arrive
at the same instant, a fourth conversation alone), then the command line end to end on
the first requests of the bundled trace."""

from __future__ import annotations

import io
import json

import pytest

from lanequeue.cli import main
from lanequeue.replay.busy import run_busy
from lanequeue.replay.trace import Trace, parse_trace_lines


def trace_of(rows: list[tuple[int, int, int]]) -> Trace:
    lines = [json.dumps({"timestamp": ts, "input_length": 1, "output_length": out,
                         "hash_ids": [0, conv]}) for ts, conv, out in rows]
    return parse_trace_lines(lines)


# Conversation 7 sends three messages at once while conversation 9 sends one.
BURST = [(0, 7, 100), (0, 7, 100), (0, 7, 100), (0, 9, 100)]

EXPECTED = {  # policy: (calls, done, merged, steered, dropped, rejected)
    "enqueue": (4, 4, 0, 0, 0, 0),
    "reject": (2, 2, 0, 0, 0, 2),
    # The first turn of 7 already holds its place when the others come: they are steered
    # into it and its reply covers them.
    "steer": (2, 4, 0, 2, 0, 0),
    # Each newcomer supersedes the one before it before it started: one call for 7.
    "interrupt": (2, 2, 0, 0, 2, 0),
    "replace": (3, 3, 0, 0, 1, 0),
    "collect": (3, 4, 1, 0, 0, 0),
}


@pytest.mark.parametrize("policy", list(EXPECTED))
def test_each_policy_on_a_burst(policy: str) -> None:
    r = run_busy(trace_of(BURST), policy, speed=1000.0, tpot_ms=1.0, global_cap=4)
    assert (r.calls, r.done, r.merged, r.steered, r.dropped, r.rejected) == EXPECTED[policy]
    assert r.requests == 4 and r.cancelled == 0 and r.timed_out == 0
    assert r.overlaps == 0 and r.order_violations == 0
    assert r.done + r.dropped + r.rejected + r.cancelled + r.timed_out == r.requests


def test_replay_busy_all_on_the_bundled_trace() -> None:
    out, err = io.StringIO(), io.StringIO()
    code = main_with(["replay", "--busy", "all", "--limit", "300", "--speed", "6000",
                      "--tpot-ms", "300", "--no-progress"], out, err)
    assert code == 0, err.getvalue()
    text = out.getvalue()
    rows = {line.split()[0]: line.split() for line in text.splitlines()[2:8]}
    assert list(rows) == ["enqueue", "reject", "steer", "interrupt", "replace", "collect"]
    assert all(r[1] == "300" for r in rows.values())
    assert "ideal(enqueue)" in text and "checks passed" in text
    assert rows["enqueue"][2] == "300"  # enqueue: one call per request


def test_replay_busy_rejects_a_bad_policy() -> None:
    out, err = io.StringIO(), io.StringIO()
    assert main_with(["replay", "--busy", "sometimes", "--limit", "5"], out, err) == 2
    assert "unknown busy policy" in err.getvalue()


@pytest.mark.parametrize(("extra", "option", "names"), [
    (["--policy", "global-serial"], "argument --policy", "not 'global-serial'"),
    (["--runtime", "threads"], "argument --runtime", "not 'threads'"),
    (["--backend", "redis://127.0.0.1:1/0"], "--backend", "backend"),
    (["--metrics-port", "0"], "--metrics-port", "--metrics-port"),
    (["--json", "out.json"], "argument --json", "out.json would not be written"),
    (["--plot", "out.png"], "argument --plot", "out.png would not be written"),
])
def test_replay_busy_refuses_what_it_would_ignore(
        extra: list[str], option: str, names: str) -> None:
    """--busy runs the dispatcher on asyncio, one process, session policy: an option it
    cannot honour is refused (exit 2, naming it), never silently ignored."""
    out, err = io.StringIO(), io.StringIO()
    assert main_with(["replay", "--busy", "enqueue", "--limit", "5", *extra], out, err) == 2
    assert option in err.getvalue() and names in err.getvalue()
    assert "busy" in err.getvalue() and out.getvalue() == ""


def test_busy_config_is_checked_in_replay_config() -> None:
    from lanequeue.replay import ReplayConfig
    from lanequeue.replay._checks import SettingError

    assert ReplayConfig(busy="enqueue").runtime == "asyncio"
    assert ReplayConfig().runtime == "threads"
    assert ReplayConfig(busy="all").busy_policies == [
        "enqueue", "reject", "steer", "interrupt", "replace", "collect"]
    assert ReplayConfig(busy="steer,collect", runtime="asyncio",
                        policy="session").busy_policies == ["steer", "collect"]
    for kw, setting in [({"policy": "global-serial"}, "policy"),
                        ({"runtime": "threads"}, "runtime"),
                        ({"backend": "redis://127.0.0.1:1/0"}, "backend")]:
        with pytest.raises(SettingError) as info:
            ReplayConfig(busy="enqueue", **kw)  # type: ignore[arg-type]
        assert info.value.setting == setting
    with pytest.raises(SettingError, match="unknown busy policy 'nope'"):
        ReplayConfig(busy="enqueue,nope")
    with pytest.raises(ValueError, match="busy policy"):
        run_busy(trace_of(BURST), "all")


def test_busy_replay_honours_idle_timeout() -> None:
    r = run_busy(trace_of(BURST), "enqueue", speed=1000.0, tpot_ms=1.0, global_cap=4,
                 idle_timeout_s=0)
    assert (r.calls, r.done, r.overlaps, r.order_violations) == (4, 4, 0, 0)
    with pytest.raises(ValueError, match="idle_timeout_s"):
        run_busy(trace_of(BURST), "enqueue", idle_timeout_s=-1)


def main_with(argv: list[str], out: io.StringIO, err: io.StringIO) -> int:
    import sys

    old = sys.stdout, sys.stderr
    sys.stdout, sys.stderr = out, err
    try:
        return main(argv)
    finally:
        sys.stdout, sys.stderr = old
