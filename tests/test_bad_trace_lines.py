"""Malformed trace lines on the command line: ``lanequeue replay`` and ``lanequeue plan``
report them, go on within ``--max-bad-lines`` (1% of the request lines by default) and
refuse a trace beyond it, or one without a valid request, with exit status 2 (README,
"Malformed lines")."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from lanequeue import cli
from lanequeue.cli import build_parser, main
from lanequeue.replay import read_trace

pytestmark = pytest.mark.timeout(60)

README = Path(__file__).resolve().parent.parent / "README.md"
# Each command with the arguments that make it quick on a small trace.
COMMANDS = {
    "plan": ["--p99-wait-s", "1"],
    "replay": ["--speed", "1000", "--no-progress"],
}


def good(i: int) -> str:
    """Request ``i``: 100 ms after the previous one, 10 output tokens, one of 7
    conversations."""
    return json.dumps(
        {"timestamp": i * 100, "input_length": 10, "output_length": 10, "hash_ids": [0, i % 7]}
    )


def write(path: Path, lines: list[str]) -> Path:
    path.write_text("".join(line + "\n" for line in lines))
    return path


def run(
    command: str, path: Path | str, capsys: pytest.CaptureFixture[str], *extra: str
) -> tuple[int, str, str]:
    code = main([command, str(path), *COMMANDS[command], *extra])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def readme_text() -> str:
    return " ".join(README.read_text(encoding="utf-8").split())


@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_all_good_lines_are_used_without_a_word_even_with_no_bad_line_allowed(
    command: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = write(tmp_path / "t.jsonl", [good(i) for i in range(50)])
    for limit in ("0", "0%"):
        code, out, err = run(command, path, capsys, "--max-bad-lines", limit)
        assert code == 0, err
        assert err == ""
        assert "50 requests" in out or "requests                 50" in out


def test_the_bundled_trace_has_no_malformed_line_and_plans_as_before(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert read_trace().malformed == ()
    assert main(["plan", "--p99-wait-s", "2", "--max-wait-s", "60", "--max-bad-lines", "0"]) == 0
    captured = capsys.readouterr()
    assert captured.err == ""
    assert "recommended global cap: 53" in captured.out
    assert "The bundled trace has no malformed line." in readme_text()


@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_a_few_bad_lines_within_the_limit_are_reported_and_the_rest_is_used(
    command: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # 300 request lines, 2 malformed (0.667%, within the default 1%), a blank line too.
    lines = [good(i) for i in range(300)]
    lines[10] = "{bad"
    lines[200] = '{"timestamp": 5}'
    path = write(tmp_path / "t.jsonl", [*lines, ""])
    code, out, err = run(command, path, capsys)
    assert code == 0, err
    using = "planning from" if command == "plan" else "replaying"
    assert err.splitlines() == [
        f"lanequeue {command}: {path}: line 11: invalid JSON: Expecting property name "
        "enclosed in double quotes (column 2); skipped",
        f"lanequeue {command}: {path}: line 201: missing fields 'input_length', "
        "'output_length', 'hash_ids'; skipped",
        f"lanequeue {command}: 1 blank line passed over",
        f"lanequeue {command}: 2 malformed lines skipped (0.667% of 300 request lines, "
        f"within --max-bad-lines 1%); {using} the other 298",
    ]
    assert "298 requests" in out or "requests                298" in out


@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_mostly_bad_lines_fail_with_status_2_instead_of_using_the_rest(
    command: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # One good line among 100: the old behaviour planned a cap from that one request.
    path = write(tmp_path / "t.jsonl", [good(0), *["{bad"] * 50, *['{"timestamp": 5}'] * 49])
    code, out, err = run(command, path, capsys)
    assert code == 2
    assert out == ""  # no plan, no replay
    lines = err.splitlines()
    assert len([ln for ln in lines if ": line " in ln]) == 20  # the first 20, then a count
    assert f"lanequeue {command}: ... and 79 more malformed lines skipped" in lines
    assert (f"lanequeue {command}: most lines were not requests: is this a Mooncake or "
            "generic trace (see --help)?") in lines
    using = "planning from" if command == "plan" else "replaying"
    assert lines[-1] == (
        f"lanequeue {command}: error: 99 of 100 request lines are malformed (99%), more "
        f"than --max-bad-lines 1% allows: not {using} the other 1 (fix the trace, or raise "
        "the limit: --max-bad-lines 100% uses whatever lines are valid)"
    )
    # The limit raised, the valid line is used.
    code, out, err = run(command, path, capsys, "--max-bad-lines", "100%")
    assert code == 0, err
    assert "within --max-bad-lines 100%" in err


@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_a_trace_without_a_valid_request_fails_clearly_whatever_the_limit(
    command: str, tmp_path: Path, capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.chdir(tmp_path)
    use = "plan with" if command == "plan" else "replay"
    cases = [
        ([], "it has no request line (the file is empty, or a header only)"),
        (["timestamp,key,duration_s"], "it has no request line (the file is empty, or a "
                                       "header only)"),
        (["", "  ", ""], "it has only blank lines"),
        (["{bad", "", '{"timestamp": 1}'], "all 2 of its request lines are malformed"),
    ]
    for lines, why in cases:
        write(tmp_path / "t.jsonl", lines)
        code, out, err = run(command, "t.jsonl", capsys, "--max-bad-lines", "100%")
        assert (code, out) == (2, "")
        assert err.splitlines()[-1] == (
            f"lanequeue {command}: error: no valid request to {use} in t.jsonl: {why}"
        )


def test_the_limit_as_a_count_and_as_a_share_at_its_boundaries(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # 3 malformed lines of 300 request lines: exactly 1%.
    lines = [good(i) for i in range(300)]
    for i in (5, 50, 150):
        lines[i] = "not json"
    path = write(tmp_path / "t.jsonl", lines)
    for limit, code in (("1%", 0), ("0.99%", 2), ("3", 0), ("2", 2), ("0", 2), ("100%", 0)):
        assert run("plan", path, capsys, "--max-bad-lines", limit)[0] == code, limit
    # A share just above the limit is never shown rounded down to it.
    # 101 of 10,099: 1.000099%, "1%" to 3 significant digits.
    lines = [good(i) for i in range(10_099)]
    for i in range(101):
        lines[i * 10] = "not json"
    path = write(tmp_path / "u.jsonl", lines)
    code, _, err = run("plan", path, capsys)
    assert code == 2
    assert "101 of 10,099 request lines are malformed (1.0001%), more than" in err


@pytest.mark.parametrize("bad", ["", "x", "-1", "1.5", "101%", "-1%", "nan%", "1e400%",
                                 "1_0", "1000000001"])
def test_a_bad_limit_is_a_usage_error(bad: str, capsys: pytest.CaptureFixture[str]) -> None:
    for command in COMMANDS:
        with pytest.raises(SystemExit) as info:
            main([command, f"--max-bad-lines={bad}", *COMMANDS[command]])
        assert info.value.code == 2
        err = capsys.readouterr().err
        assert f"lanequeue {command}: error: argument --max-bad-lines: must be a share" in err


def test_the_default_and_the_help_say_what_the_readme_says() -> None:
    assert cli.DEFAULT_MAX_BAD_LINES == "1%"
    parser = build_parser()
    for command in COMMANDS:
        args = parser.parse_args([command, *COMMANDS[command]])
        assert args.max_bad_lines.text == "1%"
        sub = parser._subparsers._group_actions[0].choices[command]  # type: ignore[union-attr]
        text = " ".join(sub.format_help().split())
        assert "(default 1%)" in text and "exits with status 2" in text
    text = readme_text()
    assert ("`--max-bad-lines LIMIT` (of `replay` and `plan`) bounds the malformed lines: a "
            "share of the request lines (`1%`, the default; `0%` allows none, `100%` any "
            "number) or a number of lines (`10`).") in text
    assert "then a count of the rest. Blank lines are passed over and only counted" in text


def test_the_readme_examples_are_what_is_printed(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    text = readme_text()
    section = text.split("**Malformed lines.**", 1)[1].split("**", 1)[0]
    examples = section.split("`")[1::2]
    within = next(e for e in examples if "within --max-bad-lines" in e)
    beyond = next(e for e in examples if "error: 99 of 100" in e)
    empty = next(e for e in examples if "the file is empty, or a header only" in e)

    lines = [good(i) for i in range(300)]
    lines[3] = lines[4] = "{bad"
    code, _, err = run("plan", write(tmp_path / "a.jsonl", lines), capsys)
    assert code == 0 and within in err.splitlines()
    code, _, err = run("plan", write(tmp_path / "b.jsonl", [good(0), *["x"] * 99]), capsys)
    assert code == 2 and beyond in err.splitlines()
    monkeypatch.chdir(tmp_path)
    write(tmp_path / "t.jsonl", [])
    code, _, err = run("replay", "t.jsonl", capsys)
    assert code == 2 and err.splitlines() == [empty]


def test_replay_busy_reads_the_trace_under_the_same_limit(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = write(tmp_path / "t.jsonl", [good(0), *["{bad"] * 9])
    assert main(["replay", str(path), "--busy", "enqueue", "--speed", "1000"]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err.splitlines()[-1].startswith(
        "lanequeue replay: error: 9 of 10 request lines are malformed (90%), more than "
        "--max-bad-lines 1% allows: not replaying the other 1")


@pytest.mark.parametrize("limit, bad, lines, shown", [
    ("33.333333333333333%", 1, 3, "33.3333333333333333%"),  # float: 33.3333333333333
    ("1%", 101, 10_099, "1.0001%"),
    ("0.1%", 1, 999, "0.1001%"),
])
def test_a_share_refused_is_shown_above_its_limit_without_float_noise(
    limit: str, bad: int, lines: int, shown: str, tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """A share over ``--max-bad-lines`` was printed from a float to at most 15 digits:
    1 of 3 lines over a limit of 33.333333333333333% showed ``(33.3333333333333%), more
    than --max-bad-lines 33.333333333333333%``, below the limit it exceeds. The share is
    now computed exactly, rounded to 3 significant digits, with only as many more as it
    takes to show it above the limit."""
    from fractions import Fraction

    rows = [good(i) for i in range(lines)]
    for i in range(bad):
        rows[i * (lines // bad)] = "{bad"
    path = write(tmp_path / "t.jsonl", rows)
    code, _, err = run("plan", path, capsys, "--max-bad-lines", limit)
    assert code == 2
    message = err.splitlines()[-1]
    assert (f"{bad:,} of {lines:,} request lines are malformed ({shown}), more than "
            f"--max-bad-lines {limit} allows") in message, message
    assert Fraction(shown[:-1]) > Fraction(limit[:-1])


@pytest.mark.parametrize("limit, shown", [("0.6667%", "0.6667%"), ("0.667%", "0.667%"),
                                          ("1%", "0.667%"), ("2", "0.667%")])
def test_a_share_within_the_limit_is_never_shown_above_it(
    limit: str, shown: str, tmp_path: Path, capsys: pytest.CaptureFixture[str],
) -> None:
    """2 of 300 lines (0.6666...%) are within a limit of 0.6667%: they were reported as
    ``0.667% of 300 request lines, within --max-bad-lines 0.6667%``, above it."""
    rows = [good(i) for i in range(300)]
    rows[3] = rows[4] = "{bad"
    code, _, err = run("plan", write(tmp_path / "t.jsonl", rows), capsys,
                       "--max-bad-lines", limit)
    assert code == 0, err
    assert err.splitlines()[-1] == (
        f"lanequeue plan: 2 malformed lines skipped ({shown} of 300 request lines, within "
        f"--max-bad-lines {limit}); planning from the other 298")


def generic_line(i: int) -> str:
    return json.dumps({"timestamp": i * 0.1, "key": f"c{i % 7}", "duration_s": 0.01})


@pytest.mark.parametrize("command", sorted(COMMANDS))
@pytest.mark.parametrize("line", [good, generic_line])
def test_a_first_line_cut_by_log_rotation_is_one_malformed_line(
    command: str, line: object, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A JSON-lines trace whose first line lost its start (the file was rotated while
    the line was written): a fragment with commas, which was taken for a CSV header and
    the whole file refused (``a CSV trace needs a header line ...``). The format is told
    from the first few lines: the fragment is one malformed line, within the default
    1% of 300 lines."""
    assert callable(line)
    lines = [line(i) for i in range(300)]
    lines[0] = lines[0][len(lines[0]) // 2:]  # e.g. 'ut_length": 10, "hash_ids": [0, 0]}'
    assert "," in lines[0] and not lines[0].startswith("{")
    path = write(tmp_path / "t.jsonl", lines)
    code, out, err = run(command, path, capsys)
    assert code == 0, err
    using = "planning from" if command == "plan" else "replaying"
    messages = err.splitlines()
    assert messages[0].startswith(f"lanequeue {command}: {path}: line 1: invalid JSON: ")
    assert messages[-1] == (
        f"lanequeue {command}: 1 malformed line skipped (0.333% of 300 request lines, "
        f"within --max-bad-lines 1%); {using} the other 299")
    assert ("A first line cut short by a log rotation (the end of a JSON line, commas and "
            "all) is one malformed line too, not a CSV header: a trace is read as CSV only "
            "when none of its first 5 non-blank lines is a JSON object.") in readme_text()
    # Beyond the limit, refused as any other malformed line is, not as a bad CSV header.
    code, out, err = run(command, path, capsys, "--max-bad-lines", "0")
    assert (code, out) == (2, "")
    assert "1 of 300 request lines are malformed (0.333%), more than --max-bad-lines 0 " in err


@pytest.mark.parametrize("trace_format", ["auto", "generic"])
def test_the_format_is_told_from_the_first_lines_not_the_first_line_alone(
    trace_format: str,
) -> None:
    from lanequeue.replay import TraceError, parse_trace_lines
    from lanequeue.replay.trace import DETECT_LINES

    assert DETECT_LINES == 5  # (README)
    cut = 'key": "c1", "duration_s": 0.5}'
    rows = [cut, "", *(generic_line(i) for i in range(1, 6))]
    trace = parse_trace_lines(rows, trace_format=trace_format)
    assert trace.format == "generic" and len(trace.requests) == 5
    assert [(s.line, s.reason.split(":")[0]) for s in trace.malformed] == [(1, "invalid JSON")]
    # A cut fragment among the first 5 non-blank lines, then JSON lines: the same.
    late = [cut, "also, not JSON", "x, y", "p, q", generic_line(1)]
    assert parse_trace_lines(late, trace_format=trace_format).format == "generic"
    # A CSV trace is still one: its header first, no JSON object near it.
    csv_rows = ["timestamp,key,duration_s", "0.5,a,2", "1,b,x", "", "2,c,1"]
    trace = parse_trace_lines(csv_rows, trace_format=trace_format)
    assert [r.key for r in trace.requests] == ["a", "c"]
    # And a header without the columns is still refused as one.
    with pytest.raises(TraceError, match="a CSV trace needs a header line"):
        parse_trace_lines(["time,conv,dur", "1,a,2", "2,b,3"], trace_format=trace_format)
    if trace_format == "auto":
        mooncake = [good(i) for i in range(6)]
        mooncake[0] = mooncake[0][30:]
        trace = parse_trace_lines(mooncake, trace_format="auto")
        assert trace.format == "mooncake" and len(trace.requests) == 5
        assert [s.line for s in trace.malformed] == [1]


@pytest.mark.parametrize("limit, count, share", [
    ("+2", 2, None), ("+2%", None, 2), ("2", 2, None), ("2%", None, 2),
    ("-0", 0, None), ("-0%", None, 0), (" +10 ", 10, None),
])
def test_a_limit_takes_a_sign_as_a_count_and_as_a_share(
    limit: str, count: int | None, share: int | None,
) -> None:
    """``--max-bad-lines +2%`` was taken and ``+2`` refused: both take a sign now."""
    from fractions import Fraction

    for command in COMMANDS:
        args = build_parser().parse_args([command, "--max-bad-lines", limit,
                                          *COMMANDS[command]])
        got = args.max_bad_lines
        assert got.count == count
        assert got.share == (None if share is None else Fraction(share, 100))


@pytest.mark.parametrize("bad", ["-1", "-1%", "-0.5%", "-1e3%", "-10", "-inf%", "-nan%",
                                 "-Infinity%", "-inf"])
def test_a_negative_limit_is_refused_naming_the_option(
    bad: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """Written as two arguments (``--max-bad-lines -1%``), a negative share was refused
    by argparse as ``expected one argument``, which says nothing of the limit's range."""
    for command in COMMANDS:
        with pytest.raises(SystemExit) as info:
            main([command, "--max-bad-lines", bad, *COMMANDS[command]])
        assert info.value.code == 2
        err = capsys.readouterr().err
        assert (f"lanequeue {command}: error: argument --max-bad-lines: must be a share of "
                "the request lines from 0% to 100%") in err
        assert err.endswith(f", got {bad}\n")  # (shown as typed)
