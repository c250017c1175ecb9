"""The numbers of the command line, read, refused and echoed alike by every option of
``lanequeue replay``, ``plan`` and ``status``: the same spellings taken (ASCII decimal
notation), every refusal in one form (``argument --X: ... must be ..., got TYPED``, the value
as it was typed), and every value echoed short (never thousands of digits)."""

from __future__ import annotations

import json
from fractions import Fraction
from pathlib import Path
from typing import Any

import pytest
from conftest import run_cli

from lanequeue.cli import build_parser

#: Every numeric option, with the arguments its command needs besides it and a valid value.
NUMBER_OPTIONS = [
    ("replay", "--speed", "2"), ("replay", "--tpot-ms", "3"), ("replay", "--global", "4"),
    ("replay", "--limit", "5"), ("replay", "--workers", "1"),
    ("replay", "--max-sessions", "6"), ("replay", "--idle-timeout", "7"),
    ("replay", "--metrics-port", "9"), ("replay", "--max-bad-lines", "2"),
    ("plan", "--p99-wait-s", "2"), ("plan", "--max-wait-s", "3"), ("plan", "--tpot-ms", "3"),
    ("plan", "--min-global", "2"), ("plan", "--max-global", "8"), ("plan", "--speed", "2"),
    ("plan", "--jobs", "2"), ("plan", "--max-bad-lines", "2"),
    ("status", "--interval", "2"),
]
IDS = [f"{c}{o}" for c, o, _ in NUMBER_OPTIONS]

#: Spellings Python's int(), float() or Fraction() take but the command line does not:
#: underscores, other scripts' digits (Arabic-Indic, fullwidth, Devanagari), fractions.
NOT_ASCII_DECIMAL = ["1_0", "\u0661\u0660", "1\u0660", "\uff11", "\u0968", "2/3", "0x10"]


def _argv(command: str, option: str, value: str) -> list[str]:
    extra = {"replay": ["--no-progress"], "plan": ["--p99-wait-s", "1"],
             "status": ["--backend", "redis://127.0.0.1:1/0", "--watch"]}[command]
    return [command, *extra, f"{option}={value}"]


@pytest.fixture
def no_work(monkeypatch: pytest.MonkeyPatch) -> None:
    """Fail the test if a command reads a trace, replays or simulates anything."""

    def boom(*args: object, **kwargs: object) -> None:
        raise AssertionError("the command did work before refusing its settings")

    for target in ("read_trace", "run_replay"):
        monkeypatch.setattr(f"lanequeue.replay.{target}", boom)
    monkeypatch.setattr("lanequeue.replay.trace.read_trace", boom)
    monkeypatch.setattr("lanequeue.replay.plan.simulate_ticks", boom)


def _refusal(command: str, option: str, err: str) -> str:
    last = err.splitlines()[-1]
    assert last.startswith(f"lanequeue {command}: error: argument {option}: "), err
    return last


# --------------------------------------------------------------------------------------
# 1. min above max: the typed text, in the form of every refusal


@pytest.mark.timeout(10)
def test_min_global_above_max_global_is_shown_as_typed(
    no_work: None, capsys: pytest.CaptureFixture[str]
) -> None:
    """``--min-global 09 --max-global 3`` said ``min-global (9) > max-global (3)``: the
    parsed numbers, in a form of its own."""
    code, out, err = run_cli(["plan", "--p99-wait-s", "1", "--min-global", "09",
                           "--max-global", "+3"], capsys)
    assert (code, out) == (2, "")
    assert err.splitlines()[-1] == (
        "lanequeue plan: error: argument --min-global: min-global must be at most "
        "max-global (+3), got 09")
    from lanequeue.replay.plan import check_plan_arguments

    # The API, which has no text, says it in the same form with the values.
    with pytest.raises(ValueError, match=r"^min_global must be at most max_global \(2\), "
                                         r"got 5$"):
        check_plan_arguments(min_global=5, max_global=2)


# --------------------------------------------------------------------------------------
# 2. one form for every refusal


@pytest.mark.timeout(10)
@pytest.mark.parametrize(("command", "option", "valid"), NUMBER_OPTIONS, ids=IDS)
@pytest.mark.parametrize("bad", ["x", "-1e400", "101%", "1e99999", ""])
def test_every_refusal_of_a_number_ends_with_got_and_the_typed_value(
    command: str, option: str, valid: str, bad: str, no_work: None,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """``--max-bad-lines 101%`` ended ``not '101%'``, ``--speed x`` said ``invalid float
    value: 'x'`` and ``--p99-wait-s x`` ``not a number of seconds: 'x'``, where a value out
    of range said ``got ...``: every option says ``got`` and the value as typed now."""
    code, out, err = run_cli(_argv(command, option, bad), capsys)
    assert (code, out) == (2, "")
    last = _refusal(command, option, err)
    assert last.endswith(f", got {bad or repr('')}"), err
    assert " must be " in last and "not '" not in last and "invalid" not in last, err


# --------------------------------------------------------------------------------------
# 3. the same spellings for every option


@pytest.mark.timeout(10)
@pytest.mark.parametrize(("command", "option", "valid"), NUMBER_OPTIONS, ids=IDS)
@pytest.mark.parametrize("bad", NOT_ASCII_DECIMAL)
def test_every_numeric_option_refuses_what_is_not_ascii_decimal(
    command: str, option: str, valid: str, bad: str, no_work: None,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """``--jobs 1_000`` started 1,000 processes and ``--global \u0661\u0660`` made ten
    permits (int() and float() take both), while ``--p99-wait-s`` refused them."""
    text = bad + ("%" if option == "--max-bad-lines" else "")
    code, out, err = run_cli(_argv(command, option, text), capsys)
    assert (code, out) == (2, "")
    assert _refusal(command, option, err).endswith(f", got {text}"), err


@pytest.mark.parametrize(("command", "option", "valid"), NUMBER_OPTIONS, ids=IDS)
def test_every_numeric_option_takes_ascii_decimals_with_blanks_and_sign(
    command: str, option: str, valid: str
) -> None:
    parser = build_parser()
    plain = parser.parse_args(_argv(command, option, valid))
    dest = option.lstrip("-").replace("-", "_")
    dest = {"global": "global_cap", "idle_timeout": "idle_timeout_s"}.get(dest, dest)
    def value(args: object) -> object:
        got = getattr(args, dest)
        return (got.count, got.share) if dest == "max_bad_lines" else got

    for spelled in (f" {valid} ", f"+{valid}", f"0{valid}", f"{valid}\t"):
        assert value(parser.parse_args(_argv(command, option, spelled))) == value(plain)


@pytest.mark.timeout(10)
@pytest.mark.parametrize(("command", "option", "valid"), NUMBER_OPTIONS, ids=IDS)
def test_a_huge_spelling_is_refused_in_the_one_form_and_cut(
    command: str, option: str, valid: str, no_work: None,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """5,000 digits (beyond what int() and Fraction() convert from text) are read like
    any other number, and refused by the option's range, shown cut."""
    huge = "9" * 5000 + ("%" if option == "--max-bad-lines" else "")
    code, out, err = run_cli(_argv(command, option, huge), capsys)
    assert (code, out) == (2, "")
    last = _refusal(command, option, err)
    assert "must be" in last and f"({len(huge):,} characters)" in last and len(last) < 500, last


@pytest.mark.timeout(10)
def test_seconds_options_refuse_nan_and_inf_by_their_range(
    no_work: None, capsys: pytest.CaptureFixture[str]
) -> None:
    """``nan`` and ``inf`` are spelled alike for every option that takes a fraction: the
    option's range refuses them, as ``--speed nan`` is."""
    for option in ("--p99-wait-s", "--max-wait-s"):
        for value in ("nan", "-Infinity", "inf"):
            code, _, err = run_cli(_argv("plan", option, value), capsys)
            assert code == 2
            assert err.splitlines()[-1] == (
                f"lanequeue plan: error: argument {option}: {option[2:]} must be a number "
                f"of seconds from 0 to 1e+09, got {value}")


# --------------------------------------------------------------------------------------
# 4. values echoed short


@pytest.fixture
def trace(tmp_path: Path) -> Path:
    """Conversation a's second request waits 1 s behind its first, at every cap."""
    path = tmp_path / "t.jsonl"
    rows = [(0, "a", 2), (0, "b", 1), (1, "a", 1)]
    path.write_text("".join(json.dumps({"timestamp": t, "key": k, "duration_s": d}) + "\n"
                            for t, k, d in rows))
    return path


@pytest.mark.timeout(30)
def test_tiny_goals_are_echoed_short(trace: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """``--p99-wait-s 1e-9999`` was printed in full, 10,000 digits, in the goal line (and
    in the line of the waits that miss it)."""
    code, out, err = run_cli(["plan", str(trace), "--p99-wait-s", "1e-9999",
                           "--max-wait-s", "1e-300"], capsys)
    assert code == 3, err
    assert max(len(line) for line in out.splitlines()) < 200, out
    assert "goal: p99 wait <= 1e-9999 s and max wait <= 1e-300 s\n" in out
    assert "waits more than 1e-9999 s at every cap" in out
    digits = "0." + "0" * 5000 + "1"
    code, out, err = run_cli(["plan", str(trace), "--p99-wait-s", digits], capsys)
    assert code == 3, err
    assert "goal: p99 wait <= 1e-5001 s\n" in out


@pytest.mark.timeout(30)
def test_a_tiny_tpot_is_echoed_short(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "tokens.jsonl"
    path.write_text(json.dumps({"timestamp": 0, "key": "a", "output_tokens": 10}) + "\n")
    code, out, err = run_cli(["plan", str(path), "--p99-wait-s", "1", "--tpot-ms", "5e-324"],
                          capsys)
    assert code == 0, err
    assert "; 5e-324 ms per output token\n" in out
    code, out, err = run_cli(["plan", str(path), "--p99-wait-s", "1", "--tpot-ms",
                           "30.0000001"], capsys)
    assert "; 30.0000001 ms per output token\n" in out  # not rounded to 30 either


@pytest.mark.timeout(30)
def test_a_long_bad_line_limit_is_echoed_cut(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "t.jsonl"
    path.write_text("{bad\n" + json.dumps({"timestamp": 0, "key": "a", "duration_s": 1})
                    + "\n")
    limit = "100." + "0" * 5000 + "%"
    code, _, err = run_cli(["plan", str(path), "--p99-wait-s", "1", "--max-bad-lines", limit],
                          capsys)
    assert code == 0, err
    assert max(len(line) for line in err.splitlines()) < 500, err
    assert "within --max-bad-lines 100.000" in err


def test_exact_text_is_short_and_exact() -> None:
    from lanequeue.replay._figures import exact_text

    cases = [
        (2, "2"), (1e-05, "0.00001"), (Fraction("1.0000001"), "1.0000001"),
        (Fraction(1, 10**9999), "1e-9999"), (5e300, "5e+300"), (5e-324, "5e-324"),
        (-1.5e-7, "-1.5e-07"), (10**9, "1000000000"), (Fraction("123.456"), "123.456"),
        (1e21, "1e+21"), (Fraction(10**5000 + 1), "about 1e+5000"),
        (Fraction("1." + "0" * 30 + "1"), "about 1"), (Fraction(2, 3), "0.666666666667"),
        (Fraction(1, 3 * 10**300), "3.33333333333e-301"), (0, "0"), (0.0, "0"),
        (Fraction("1.2345678901234567891"), "1.2345678901234567891"),
        (Fraction("1.23456789012345678915"), "about 1.2345678901234567892"),
    ]
    for value, shown in cases:
        assert exact_text(value) == shown, value


@pytest.mark.parametrize(("option", "value", "read"), [
    ("--max-bad-lines", "00000000003", 3),  # a count with leading zeros, as --jobs takes
    ("--speed", "1e0002", 100.0),  # an exponent's leading zeros
    ("--speed", "1E+003", 1000.0),
])
def test_leading_zeros_are_read_as_every_option_reads_them(
    option: str, value: str, read: Any
) -> None:
    args = build_parser().parse_args(["replay", f"{option}={value}"])
    got = args.max_bad_lines.count if option == "--max-bad-lines" else args.speed
    assert got == read


def test_an_exponent_of_more_than_four_digits_is_refused_saying_so(
    capsys: pytest.CaptureFixture[str],
) -> None:
    code, _, err = run_cli(["replay", "--speed=1e10000"], capsys)
    assert code == 2
    assert "an exponent of at most 4 digits), got 1e10000" in err
