"""``lanequeue replay --metrics-port`` and the plot's panels built from the lanes' metrics."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from lanequeue.cli import main
from lanequeue.replay import ReplayConfig, run_replay
from lanequeue.replay.plot import in_flight, require_matplotlib, write_plot
from lanequeue.replay.trace import parse_trace_lines


def trace_lines(rows: list[tuple[int, int, int]]) -> list[str]:
    """JSONL lines from (timestamp_ms, output_length, conversation) rows."""
    return [
        json.dumps({"timestamp": ts, "input_length": 10, "output_length": out,
                    "hash_ids": [0, conv, 7]})
        for ts, out, conv in rows
    ]


@pytest.mark.timeout(60)
@pytest.mark.parametrize("runtime", ["threads", "asyncio"])
def test_run_replay_hands_its_queue_to_on_queue(
    runtime: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    rows = [(i * 10, 5, i % 3) for i in range(30)]
    trace = parse_trace_lines(trace_lines(rows), source="test")
    queues: list[Any] = []
    result = run_replay(trace, ReplayConfig(speed=50, tpot_ms=10, runtime=runtime,
                                            global_cap=2), on_queue=queues.append)
    [queue] = queues
    assert queue.list_lanes() == ["session", "global"]
    [g] = queue["global"].metrics_snapshot()
    assert g.stats.acquired == 30 and g.wait.count == 30 and g.kind == "counting"
    assert g.stats.to_dict() == result.record.lane_stats["global"]
    assert queue["global"].warn_after_s is None  # a replay measures long waits, not logs
    # The plot's extra panels: in-flight requests end at 0; the lanes' histograms drawn.
    xs, ys = in_flight(result)
    assert ys[-1] == 0 and max(ys) >= result.report.peak_global and len(xs) == 61
    png = tmp_path / "p.png"
    lanes = [m for name in queue.list_lanes() for m in queue[name].metrics_snapshot()]
    plt = require_matplotlib()
    figures: list[Any] = []
    close = plt.close
    monkeypatch.setattr(plt, "close", lambda fig: (figures.append(fig), close(fig)))
    write_plot(result, png, lane_metrics=lanes)
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    # The panels drawn: the wait distribution (every request's wait, replay and ideal),
    # in-flight requests over time against the cap, and each lane's wait histogram.
    [fig] = figures
    _, waits, flight, lanes_panel = fig.axes
    assert waits.get_title().startswith("wait p50 ")
    replay_bars = [p.get_height() for p in waits.containers[0]]
    assert sum(replay_bars) == 30
    assert flight.get_title() == f"in-flight requests against the cap (peak {max(ys)})"
    step, cap = flight.get_lines()
    assert list(step.get_xdata()) == xs and list(step.get_ydata()) == ys
    assert list(cap.get_ydata()) == [2, 2]
    assert [t.get_text() for t in lanes_panel.get_legend().get_texts()] == [
        "session (key busy)", "global (lane full)"]
    bars = [[p.get_height() for p in c] for c in lanes_panel.containers]
    assert bars == [list(m.wait.counts) for m in lanes]


def test_on_queue_with_a_backend_is_refused() -> None:
    trace = parse_trace_lines(trace_lines([(0, 1, 1)]), source="test")
    with pytest.raises(ValueError, match="on_queue"):
        run_replay(trace, ReplayConfig(backend="redis://127.0.0.1:1/0"), on_queue=print)


def test_cli_metrics_port_errors(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["replay", "--limit", "5", "--metrics-port", "70000"]) == 2
    assert "argument --metrics-port: must be a port number" in capsys.readouterr().err
    assert main(["replay", "--limit", "5", "--metrics-port", "0",
                 "--backend", "redis://127.0.0.1:1/0"]) == 2
    assert "in-process lanes" in capsys.readouterr().err
    # A port another process listens on: exit 2 naming the option, no traceback.
    import socket

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        assert main(["replay", "--limit", "5", "--metrics-port", str(port)]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"lanequeue replay: error: argument --metrics-port: cannot listen "
                          f"on 127.0.0.1:{port}: ") and "Traceback" not in err


@pytest.mark.timeout(60)
def test_cli_serves_the_metrics_while_the_replay_runs(tmp_path: Path) -> None:
    # 20 requests of 3 conversations, one every 100 ms at speed 1: about 2 s of replay.
    rows = [(i * 100, 2, i % 3) for i in range(20)]
    path = tmp_path / "t.jsonl"
    path.write_text("\n".join(trace_lines(rows)) + "\n")
    proc = subprocess.Popen(
        [sys.executable, "-m", "lanequeue", "replay", str(path), "--speed", "1",
         "--tpot-ms", "20", "--metrics-port", "0", "--no-progress"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )
    try:
        assert proc.stderr is not None
        first = proc.stderr.readline()
        m = re.search(r"http://127\.0\.0\.1:(\d+)/metrics", first)
        assert m, first
        url = m.group(0)
        seen = 0.0
        deadline = time.monotonic() + 30
        while seen == 0 and time.monotonic() < deadline:
            with urllib.request.urlopen(url, timeout=5) as resp:
                text = resp.read().decode()
            for family in text_string_to_metric_families(text):
                for s in family.samples:
                    if s.name == "lanequeue_acquired_total" and s.labels["lane"] == "global":
                        seen = s.value
            time.sleep(0.05)
        assert 0 < seen <= 20  # scraped while it ran
        out, err = proc.communicate(timeout=40)
        assert proc.returncode == 0, err
        assert "checks passed" in out
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
