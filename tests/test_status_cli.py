"""``lanequeue status --backend redis://...``: every lane in a Redis, against the real
server (tests/redis_server.py), with holders and waiters made here. The command runs as
a Redis user that may only read and SCAN (KEYS denied), so a write or a KEYS would fail
the test."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path
from typing import Any

import pytest
from conftest import spawn_status_watch

from lanequeue.cli import main
from lanequeue.redis import RedisLane, RedisSessionLane
from lanequeue.redis._keys import base
from lanequeue.redis._status import StatusReader, parse_lane_key, unbounded

pytestmark = pytest.mark.timeout(30)


def _until(cond: Any, timeout: float = 8.0) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, "condition not reached in time"
        time.sleep(0.005)


@pytest.fixture
def reader_url(redis_server: Any, redis_client: Any) -> Any:
    """A redis:// URL of a user that may read, SCAN and TIME, and nothing else."""
    user = "status" + uuid.uuid4().hex[:8]
    redis_client.execute_command(
        "ACL", "SETUSER", user, "on", ">pw", "~*", "resetchannels",
        "+@read", "+scan", "+time", "+@connection", "-keys",
    )
    yield f"redis://{user}:pw@{redis_server.host}:{redis_server.port}/0"
    redis_client.execute_command("ACL", "DELUSER", user)


@pytest.fixture
def busy_lanes(redis_client: Any, redis_prefix: str) -> Any:
    """A per-key lane with key "k1" held and one waiter; a counting lane (2 permits)
    with "a" and "b" held and one waiter for "c"; the holds' tokens by key."""
    sessions = RedisSessionLane(redis_client, prefix=redis_prefix, lease_s=30)
    llm = RedisLane(redis_client, "llm", max_concurrent=2, prefix=redis_prefix, lease_s=30)
    holds = {"k1": sessions.acquire("k1"), "a": llm.acquire("a"), "b": llm.acquire("b")}
    for h in holds.values():
        h.__enter__()
    done = threading.Event()

    def waiter(lane: Any, key: str) -> None:
        with lane.acquire(key, timeout_s=20):
            done.wait(20)

    threads = [threading.Thread(target=waiter, args=(sessions, "k1"), daemon=True),
               threading.Thread(target=waiter, args=(llm, "c"), daemon=True)]
    for t in threads:
        t.start()
    _until(lambda: sessions.waiting_for("k1") == 1 and llm.lane_status()["waiting"] == 1)
    yield {k: h.token for k, h in holds.items()}
    done.set()
    for h in holds.values():
        h.release()
    for t in threads:
        t.join(10)


def _run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(["status", *argv])
    cap = capsys.readouterr()
    return code, cap.out, cap.err


def _usage_error(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    """Run a command line that must be refused as argparse refuses one: exit status 2,
    nothing on stdout, the usage line and ``lanequeue status: error: ...`` on stderr."""
    with pytest.raises(SystemExit) as info:
        main(["status", *argv])
    cap = capsys.readouterr()
    assert info.value.code == 2 and cap.out == ""
    assert cap.err.startswith("usage: lanequeue status ")
    assert "lanequeue status: error: " in cap.err
    return 2, cap.out, cap.err


def test_json_shows_holders_tokens_leases_and_lines(
    capsys: pytest.CaptureFixture[str], reader_url: str, busy_lanes: dict[str, int],
    redis_client: Any, redis_prefix: str,
) -> None:
    code, out, err = _run(capsys, "--backend", reader_url, "--prefix", redis_prefix, "--json")
    assert code == 0, err
    doc = json.loads(out)
    assert doc["prefix"] == redis_prefix
    ours = [k for k in redis_client.scan_iter(match="*", count=1000)
            if redis_prefix.encode() in k]
    assert doc["keys_seen"] == len(ours) > 0
    by_name = {lane["name"]: lane for lane in doc["lanes"]}
    assert sorted(by_name) == ["llm", "session"]
    s, c = by_name["session"], by_name["llm"]
    assert s["kind"] == "session" and c["kind"] == "counting"
    assert [(h["key"], h["token"]) for h in s["holders"]] == [("k1", busy_lanes["k1"])]
    assert sorted((h["key"], h["token"]) for h in c["holders"]) == [
        ("a", busy_lanes["a"]), ("b", busy_lanes["b"])]
    for h in s["holders"] + c["holders"]:
        assert 0 < h["lease_left_s"] <= 30
    assert all(0 <= h["held_s"] < 30 for h in c["holders"])
    assert s["lines"] == {"k1": 1} and c["lines"] == {"c": 1}
    assert s["waiting"] == 1 and c["waiting"] == 1
    assert c["max_concurrent"] == 2
    assert s["versions"] == ["lq2"] and c["versions"] == ["lq2"]


def test_without_prefix_every_lane_is_listed(
    capsys: pytest.CaptureFixture[str], reader_url: str, busy_lanes: dict[str, int],
    redis_prefix: str,
) -> None:
    code, out, err = _run(capsys, "--backend", reader_url, "--json")
    assert code == 0, err
    doc = json.loads(out)
    mine = {lane["name"] for lane in doc["lanes"] if lane["prefix"] == redis_prefix}
    assert mine == {"llm", "session"}
    assert doc["prefix"] is None and doc["keys_seen"] >= 4


def test_table_shows_every_lane(
    capsys: pytest.CaptureFixture[str], reader_url: str, busy_lanes: dict[str, int],
    redis_prefix: str,
) -> None:
    code, out, err = _run(capsys, "--backend", reader_url, "--prefix", redis_prefix)
    assert code == 0, err
    assert "2 lanes" in out and "keys seen (SCAN)" in out
    assert f"{redis_prefix}/llm (counting, max 2)" in out
    assert f"{redis_prefix}/session (session)" in out
    for token in busy_lanes.values():
        assert str(token) in out
    # How long a holder has held: a counting lane's column; a per-key lane's holder
    # records no start in Redis, so its table has no such column (not one of dashes).
    counting, session = out.split(f"{redis_prefix}/session (session)")
    assert "held (s)" in counting and "lease left (s)" in session
    assert "held (s)" not in session


def test_watch_refreshes_until_interrupted(
    capsys: pytest.CaptureFixture[str], reader_url: str, busy_lanes: dict[str, int],
    redis_prefix: str, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """``--watch`` redraws the table every ``--interval`` until Ctrl-C (exit 130)."""
    real_sleep = time.sleep
    main_thread = threading.current_thread()
    naps: list[float] = []

    def sleep(s: float) -> None:
        if threading.current_thread() is main_thread:
            naps.append(s)
            if len(naps) == 3:
                raise KeyboardInterrupt
        real_sleep(s)

    reads: list[int] = []
    real_read = StatusReader.read

    def read(self: StatusReader) -> dict[str, Any]:
        doc = real_read(self)
        reads.append(len(doc["lanes"]))
        return doc

    monkeypatch.setattr(time, "sleep", sleep)
    monkeypatch.setattr(StatusReader, "read", read)
    code, out, _err = _run(capsys, "--backend", reader_url, "--prefix", redis_prefix,
                          "--watch", "--interval", "0.1")
    assert code == 130 and naps == [0.1, 0.1, 0.1]
    assert reads == [2, 2, 2]  # drawn, then redrawn after each of the first two naps
    assert f"{redis_prefix}/llm (counting, max 2)" in out
    # Each lane's heading on one line, in the live display too.
    assert re.search(rf"^{redis_prefix}/llm \(counting, max 2\) holders 2, waiting 1, "
                     r"oldest wait [0-9.]+ s$", out, re.MULTILINE), out


def test_oldest_wait_grows_while_the_waiter_stays(
    redis_client: Any, redis_prefix: str, busy_lanes: dict[str, int]
) -> None:
    """The oldest wait counts from the server time the waiter joined (already above 0
    at the first look), and grows while that waiter stays in line. A waiter without a
    join record (its record deleted here, as for a client that kept none) counts from
    when the reader first saw it: 0 at the first look."""
    time.sleep(0.1)  # the waiters joined before the reader starts
    reader = StatusReader(redis_client, redis_prefix)
    first = {lane["name"]: lane["oldest_wait_s"] for lane in reader.read()["lanes"]}
    assert 0.09 <= first["llm"] < 10 and 0.09 <= first["session"] < 10
    time.sleep(0.2)
    later = {lane["name"]: lane["oldest_wait_s"] for lane in reader.read()["lanes"]}
    assert later["llm"] >= first["llm"] + 0.15 and later["session"] >= first["session"] + 0.15
    for name, kind, key in (("session", "s", "k1"), ("llm", "c", None)):
        assert redis_client.delete(base(redis_prefix, kind, name, key) + "j") == 1
    fresh = StatusReader(redis_client, redis_prefix)
    first = {lane["name"]: lane["oldest_wait_s"] for lane in fresh.read()["lanes"]}
    assert first == {"llm": 0.0, "session": 0.0}
    time.sleep(0.2)
    later = {lane["name"]: lane["oldest_wait_s"] for lane in fresh.read()["lanes"]}
    assert later["llm"] >= 0.15 and later["session"] >= 0.15


def test_bad_backend_and_options(capsys: pytest.CaptureFixture[str], redis_server: Any) -> None:
    code, _, err = _run(capsys, "--backend", "nonsense://x", "--json")
    assert code == 2 and "--backend" in err
    code, _, err = _run(capsys, "--backend", "redis://127.0.0.1:1/0", "--json")
    assert code == 2 and "ConnectionError" in err
    code, _, err = _usage_error(capsys, "--backend", "redis://127.0.0.1:1/0", "--json",
                                "--watch")
    assert "argument --watch: not allowed with argument --json" in err


def test_parse_keys_whatever_they_contain() -> None:
    """Lengths make the parse exact: a key with ':', '{', '}' or '}:h' in it (C24)."""
    for key in ["plain", "a:b", "x}:h", "{tag}", "é:}"]:
        got = parse_lane_key(base("p:x", "s", "sess", key) + "q")
        assert got is not None and (got.prefix, got.kind, got.name, got.key, got.suffix) == (
            "p:x", "s", "sess", key, "q")
    got = parse_lane_key(base("p", "c", "n") + "x:0a1b")
    assert got is not None and got.key is None and got.suffix == "x:0a1b"
    assert parse_lane_key("{lq:1:p:c:1:n}:v") is not None
    for junk in ["other", "{lq2:9:p:c:1:n}:h", "{lq2:1:p:z:1:n}:h", "{lq2:1:p:c:1:n}:H"]:
        assert parse_lane_key(junk) is None


def test_json_needs_no_rich_the_table_does(
    capsys: pytest.CaptureFixture[str], reader_url: str, busy_lanes: dict[str, int],
    redis_prefix: str, monkeypatch: pytest.MonkeyPatch,
) -> None:
    import sys

    for name in [m for m in sys.modules if m == "rich" or m.startswith("rich.")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, "rich", None)  # import rich -> ImportError
    code, out, err = _run(capsys, "--backend", reader_url, "--prefix", redis_prefix, "--json")
    assert code == 0 and len(json.loads(out)["lanes"]) == 2
    code, out, err = _run(capsys, "--backend", reader_url, "--prefix", redis_prefix)
    assert code == 2 and "lanequeue[cli]" in err and out == ""


def test_without_redis_py_status_says_so_and_usage_errors_stay_usage_errors(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Installed without the ``[redis]`` extra (``pip install '.[cli]'``): ``status`` exits
    with status 2 and one line naming the extra, not a traceback; a usage error is still
    refused with the usage line first, and ``--prefix`` is read without redis-py."""
    import sys

    for name in [m for m in sys.modules
                 if m == "redis" or m.startswith(("redis.", "lanequeue.redis"))]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, "redis", None)  # import redis -> ImportError
    code, out, err = _run(capsys, "--backend", "redis://127.0.0.1:1/0", "--json",
                          "--prefix", "app")
    assert (code, out) == (2, "")
    assert err == ("lanequeue status: lanequeue.redis needs redis-py: "
                   "pip install 'lanequeue[redis]' (in a source checkout: "
                   "pip install '.[redis]')\n")
    _, _, err = _usage_error(capsys, "--backend", "redis://127.0.0.1:1/0", "--interval", "1")
    assert "argument --interval: only with --watch" in err


def test_table_shows_values_from_redis_literally(
    capsys: pytest.CaptureFixture[str], redis_server: Any, redis_client: Any,
    redis_prefix: str,
) -> None:
    """Keys, lane names and prefixes are user data: the table never parses them as rich
    markup (``[/]`` crashed it, ``[bold]b[/bold]`` showed a bold ``b``) and shows control
    characters as escapes (an escape code reached the terminal, a newline split a row)."""
    keys = ["[/]", "[bold]b[/bold]", "\x1b[31mRED", "line1\nline2"]
    sessions = RedisSessionLane(redis_client, "[red]s", prefix=redis_prefix, lease_s=30)
    holds = [sessions.acquire(k) for k in keys]
    for h in holds:
        h.__enter__()
    try:
        url = f"redis://{redis_server.host}:{redis_server.port}/0"
        code, out, err = _run(capsys, "--backend", url, "--prefix", redis_prefix)
    finally:
        for h in holds:
            h.release()
    assert code == 0, err
    assert f"{redis_prefix}/[red]s (session" in out
    assert "[/]" in out and "[bold]b[/bold]" in out
    assert "'\\x1b[31mRED'" in out and "\x1b" not in out
    assert "'line1\\nline2'" in out and "line1\n" not in out


@pytest.mark.parametrize(
    "interval", ["inf", "1e300", "3600.5", "0", "-1", "nan", "1e-9", "0.099", "x", ""])
def test_watch_interval_out_of_range_is_a_usage_error(
    capsys: pytest.CaptureFixture[str], redis_server: Any, redis_prefix: str,
    interval: str,
) -> None:
    """``--interval`` must be from 0.1 to 3600 s (``inf`` or ``1e300`` drew once, then
    ended in an OverflowError in ``time.sleep``; ``1e-9`` was taken and SCANned the Redis
    without pause): a usage error, exit status 2, before anything is read."""
    url = f"redis://{redis_server.host}:{redis_server.port}/0"
    _, _, err = _usage_error(capsys, "--backend", url, "--prefix", redis_prefix,
                             "--watch", "--interval", interval)
    assert "argument --interval: " in err


@pytest.mark.parametrize("interval", ["0.1", "3600", "2.5"])
def test_watch_interval_bounds_are_taken(interval: str) -> None:
    from lanequeue.cli import STATUS_MAX_INTERVAL_S, STATUS_MIN_INTERVAL_S, build_parser

    assert (STATUS_MIN_INTERVAL_S, STATUS_MAX_INTERVAL_S) == (0.1, 3600.0)  # (README)
    args = build_parser().parse_args(
        ["status", "--backend", "redis://h/0", "--watch", "--interval", interval])
    assert args.interval == float(interval)


@pytest.mark.parametrize("form", [["--json"], []])
def test_interval_without_watch_is_a_usage_error(
    capsys: pytest.CaptureFixture[str], form: list[str],
) -> None:
    """``--interval`` without ``--watch`` was silently ignored: now refused, before any
    connection is made (the backend here has no server)."""
    _, _, err = _usage_error(capsys, "--backend", "redis://127.0.0.1:1/0", *form,
                             "--interval", "2")
    assert "argument --interval: only with --watch" in err


def test_watch_without_interval_redraws_every_second(
    capsys: pytest.CaptureFixture[str], redis_server: Any, redis_prefix: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    real_sleep = time.sleep
    main_thread = threading.current_thread()
    naps: list[float] = []

    def sleep(s: float) -> None:
        # Only the command's own naps: a wake-up listener thread left by an earlier
        # test (reconnecting to a server that test stopped) sleeps through here too.
        if threading.current_thread() is not main_thread:
            real_sleep(s)
            return
        naps.append(s)
        raise KeyboardInterrupt

    monkeypatch.setattr(time, "sleep", sleep)
    url = f"redis://{redis_server.host}:{redis_server.port}/0"
    code, _, _ = _run(capsys, "--backend", url, "--prefix", redis_prefix, "--watch")
    assert code == 130 and naps == [1.0]


@pytest.mark.parametrize("prefix", ["", "a{b", "}"])
def test_a_prefix_no_lane_can_have_is_a_usage_error(
    capsys: pytest.CaptureFixture[str], prefix: str,
) -> None:
    """``--prefix ""`` was taken and showed 0 lanes (no lane has an empty prefix, nor one
    with a brace): a usage error naming ``--prefix``, before any connection is made."""
    _, _, err = _usage_error(capsys, "--backend", "redis://127.0.0.1:1/0", "--json",
                             "--prefix", prefix)
    assert "argument --prefix: a lane prefix must " in err


@pytest.mark.parametrize("form", [["--json"], []])
def test_output_into_a_closed_pipe_ends_quietly(
    redis_server: Any, busy_lanes: dict[str, int], redis_prefix: str, form: list[str],
) -> None:
    """``lanequeue status --json | head -1`` (or the table): the reader goes away early;
    the command ends quietly (exit status 1, nothing on stderr), not with a
    BrokenPipeError traceback."""
    import subprocess
    import sys

    url = f"redis://{redis_server.host}:{redis_server.port}/0"
    proc = subprocess.Popen(
        [sys.executable, "-m", "lanequeue", "status", "--backend", url,
         "--prefix", redis_prefix, *form],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE,
    )
    assert proc.stdout is not None and proc.stderr is not None
    proc.stdout.close()  # the reader is gone before the first byte is written
    err = proc.stderr.read()
    assert proc.wait(20) == 1 and err == b""


def test_a_redis_that_cannot_be_read_exits_2_naming_the_url(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """README: a Redis that cannot be read exits with status 2 after one line naming the
    URL and the error (not a usage error: no usage line)."""
    code, out, err = _run(capsys, "--backend", "redis://127.0.0.1:1/0", "--json")
    assert code == 2 and out == ""
    assert "redis://127.0.0.1:1/0" in err and "usage:" not in err


def test_a_lane_with_foreign_data_is_reported_and_the_others_shown(
    capsys: pytest.CaptureFixture[str], reader_url: str, busy_lanes: dict[str, int],
    redis_client: Any, redis_prefix: str,
) -> None:
    """A key under a lane's names that holds another type (not written by lanequeue)
    makes that one lane unreadable (WRONGTYPE): it is listed with the server's message,
    and every other lane is shown as before (the whole command once failed, exit 2)."""
    b = base(redis_prefix, "s", "foreign", "x")
    redis_client.rpush(b + "h", "not a holder")  # a list where a string belongs
    try:
        code, out, err = _run(capsys, "--backend", reader_url, "--prefix", redis_prefix,
                              "--json")
        assert code == 0, err
        lanes = {lane["name"]: lane for lane in json.loads(out)["lanes"]}
        assert "WRONGTYPE" in lanes["foreign"]["error"]
        assert lanes["session"]["holders"] and lanes["llm"]["holders"]
        code, out, err = _run(capsys, "--backend", reader_url, "--prefix", redis_prefix)
        assert code == 0, err
        flat = " ".join(out.split())  # (the table wraps long lines)
        assert f"{redis_prefix}/foreign (session): unreadable: " in flat
        assert "WRONGTYPE Operation against a key holding the wrong kind" in flat
        assert f"{redis_prefix}/llm (counting, max 2)" in out
    finally:
        redis_client.delete(b + "h")


@pytest.mark.parametrize("command, argv", [
    ("status", ["--backend", "redis://127.0.0.1:1/0"]),
    ("plan", ["--p99-wait-s", "1"]),
    ("replay", []),
])
def test_an_unknown_option_of_a_command_is_refused_by_that_command(
    capsys: pytest.CaptureFixture[str], command: str, argv: list[str],
) -> None:
    """An option a command does not know was refused with the top-level usage line and
    ``lanequeue: error:``; it is the command's usage error, as every other one is."""
    with pytest.raises(SystemExit) as info:
        main([command, *argv, "--bogus"])
    cap = capsys.readouterr()
    assert info.value.code == 2 and cap.out == ""
    assert cap.err.startswith(f"usage: lanequeue {command} ")
    assert f"lanequeue {command}: error: unrecognized arguments: --bogus" in cap.err


def _heading(prefix: str, name: str, kind: str, holders: int, waiting: int) -> re.Pattern[str]:
    """A lane's heading as one whole line of the table's output."""
    return re.compile(rf"^{re.escape(prefix)}/{name} \({kind}\) holders {holders}, "
                      rf"waiting {waiting}, oldest wait [0-9]+\.[0-9] s$", re.MULTILINE)


def test_table_headings_stay_on_one_line_when_not_on_a_terminal(
    capsys: pytest.CaptureFixture[str], reader_url: str, busy_lanes: dict[str, int],
    redis_prefix: str,
) -> None:
    """A lane's heading was the table's title, which rich wraps to the table's width:
    ``.../llm (counting, max 2) holders 2, waiting 1,`` then ``oldest wait 0.1 s`` on a
    line of its own, padded with blanks."""
    code, out, err = _run(capsys, "--backend", reader_url, "--prefix", redis_prefix)
    assert code == 0, err
    assert _heading(redis_prefix, "llm", "counting, max 2", 2, 1).search(out), out
    assert _heading(redis_prefix, "session", "session", 1, 1).search(out), out
    assert all(line == line.rstrip() for line in out.splitlines())


def _piped_and_narrow(redis_server: Any, redis_client: Any, prefix: str, key: str
                      ) -> tuple[subprocess.CompletedProcess[str], ...]:
    """``lanequeue status`` run twice while ``key`` is held on a session lane of
    ``prefix``: piped with no width asked for, and with ``COLUMNS=60``."""
    lane = RedisSessionLane(redis_client, prefix=prefix, lease_s=30)
    url = f"redis://{redis_server.host}:{redis_server.port}/0"
    argv = [sys.executable, "-m", "lanequeue", "status", "--backend", url, "--prefix", prefix]
    env = {k: v for k, v in os.environ.items()
           if k not in ("COLUMNS", "LINES", "FORCE_COLOR", "TTY_COMPATIBLE")}
    with lane.acquire(key):
        return tuple(subprocess.run(argv, capture_output=True, text=True, timeout=20,
                                    env={**env, **extra}, stdin=subprocess.DEVNULL)
                     for extra in ({}, {"COLUMNS": "60"}))


def test_piped_table_is_not_laid_out_for_80_columns_unless_columns_says_so(
    redis_server: Any, redis_client: Any, redis_prefix: str,
) -> None:
    """``lanequeue status | cat``: a pipe is not a terminal, and rich would lay the table
    out for 80 columns, folding a long heading and a long key over several lines. Piped,
    each heading and each row is one line; ``COLUMNS`` still sets a width."""
    prefix = redis_prefix + "-" + "p" * 70
    key = "conversation-" + "k" * 90
    piped, narrow = _piped_and_narrow(redis_server, redis_client, prefix, key)
    assert piped.returncode == 0, piped.stderr
    assert _heading(prefix, "session", "session", 1, 0).search(piped.stdout), piped.stdout
    assert [line for line in piped.stdout.splitlines() if key in line] != []
    assert narrow.returncode == 0, narrow.stderr
    assert max(len(line) for line in narrow.stdout.splitlines()) <= 60
    assert not _heading(prefix, "session", "session", 1, 0).search(narrow.stdout)
    readme = Path(__file__).resolve().parent.parent / "README.md"
    assert ("piped or redirected (`| grep`, `> status.txt`) it has no width to fit: each "
            "heading and each row stays on one line, however long, unless `COLUMNS` sets "
            "a width."
            ) in " ".join(readme.read_text(encoding="utf-8").split())


def test_the_width_is_rich_s_own_on_a_terminal_or_with_columns() -> None:
    class Out:
        def __init__(self, tty: bool) -> None:
            self.tty = tty

        def isatty(self) -> bool:
            return self.tty

    assert not unbounded(Out(True), {})
    assert not unbounded(Out(False), {"COLUMNS": "132"})
    assert unbounded(Out(False), {})
    assert unbounded(Out(False), {"COLUMNS": "0"})  # (rich: no output)
    assert unbounded(Out(False), {"COLUMNS": "wide"})
    assert unbounded(object(), {})


def _read_until(stream: Any, done: Any, timeout: float = 10.0) -> bytes:
    """Bytes read from ``stream`` (a pipe) until ``done(data)`` or ``timeout`` seconds,
    without waiting for the writer to end."""
    import selectors

    data = b""
    deadline = time.monotonic() + timeout
    with selectors.DefaultSelector() as sel:
        sel.register(stream, selectors.EVENT_READ)
        while not done(data) and time.monotonic() < deadline:
            if sel.select(max(0.0, deadline - time.monotonic())):
                chunk = os.read(stream.fileno(), 65536)
                if not chunk:
                    break
                data += chunk
    return data


def test_piped_watch_writes_each_frame_as_it_is_made(
    redis_server: Any, busy_lanes: dict[str, int], redis_prefix: str,
) -> None:
    """``lanequeue status --watch | tee log``: rich's live display writes nothing to a
    pipe until it stops, so the reader saw nothing until Ctrl-C. Piped, each refresh is
    printed plainly as it is made (and flushed): whole frames one after another, a blank
    line between two, no cursor movements."""
    import signal

    url = f"redis://{redis_server.host}:{redis_server.port}/0"
    proc = spawn_status_watch(url, redis_prefix)
    assert proc.stdout is not None and proc.stderr is not None
    try:
        data = _read_until(proc.stdout, lambda d: d.count(b"keys seen (SCAN)") >= 3)
        assert proc.poll() is None  # still watching: the frames came while it runs
    finally:
        proc.send_signal(signal.SIGINT)
        rest, err = proc.communicate(timeout=20)
    assert proc.returncode == 130, err
    text = (data + rest).decode()
    assert "\x1b" not in text
    frames = text.rstrip("\n").split("\n\n")
    assert len(frames) >= 3, text
    for frame in frames:
        assert frame.startswith("2 lanes, "), frame
        assert _heading(redis_prefix, "llm", "counting, max 2", 2, 1).search(frame), frame
        assert _heading(redis_prefix, "session", "session", 1, 1).search(frame), frame


def test_piped_table_shows_every_key_and_heading_whole_however_long(
    redis_server: Any, redis_client: Any, redis_prefix: str,
) -> None:
    """Piped, the table was laid out for 1,000 columns: a longer heading was folded over
    two lines and a longer key cut with an ellipsis. Piped output has no width: every
    heading and every key is shown whole, on one line. With ``COLUMNS`` (a width asked
    for) a key too long for it is folded over several lines, never cut."""
    prefix = redis_prefix + "-" + "p" * 1100
    key = "conversation-" + "k" * 1500
    piped, narrow = _piped_and_narrow(redis_server, redis_client, prefix, key)
    assert piped.returncode == 0, piped.stderr
    assert _heading(prefix, "session", "session", 1, 0).search(piped.stdout), piped.stdout
    rows = [line for line in piped.stdout.splitlines() if key in line]
    assert len(rows) == 1 and "…" not in piped.stdout
    assert rows[0].startswith(f"│ {key} │")
    assert narrow.returncode == 0, narrow.stderr
    assert max(len(line) for line in narrow.stdout.splitlines()) <= 60
    assert "…" not in narrow.stdout
    cells = [line.split("│")[1].strip() for line in narrow.stdout.splitlines()
             if line.startswith("│") and line.split("│")[1].strip() not in ("", "key")]
    assert "".join(cells) == key


def test_watch_redraws_in_place_only_where_rich_can_redraw() -> None:
    """On a dumb terminal (``TERM=dumb``) rich's live display, like on a pipe, showed
    nothing until it stopped: ``--watch`` prints frame after frame there too."""
    import io

    from rich.console import Console

    from lanequeue.redis._status import redraws_in_place

    assert not redraws_in_place(Console(file=io.StringIO(), _environ={}))
    tty = {"file": io.StringIO(), "force_terminal": True}
    assert redraws_in_place(Console(**tty, _environ={"TERM": "xterm-256color"}))
    assert not redraws_in_place(Console(**tty, _environ={"TERM": "dumb"}))


class _ShortMarkerLane(RedisLane):
    _version_ttl_s = 3.0


class _ShortMarkerSessionLane(RedisSessionLane):
    _version_ttl_s = 3.0


def _ttls(client: Any, prefix: str) -> dict[str, int]:
    """PTTL (ms) of each Redis key of ``prefix``'s lanes, by kind and suffix (``c:m``)."""
    out = {}
    for raw in client.scan_iter(match="{lq*", count=1000):
        parsed = parse_lane_key(raw.decode())
        if parsed is not None and parsed.prefix == prefix:
            out[f"{parsed.kind}:{parsed.suffix}"] = int(client.pttl(raw))
    return out


def test_an_idle_lane_is_listed_until_its_keys_expire_as_the_readme_says(
    capsys: pytest.CaptureFixture[str], reader_url: str, redis_client: Any, redis_prefix: str,
) -> None:
    """README, "A live view of a Redis": a lane with nothing left in it stays listed
    until its keys expire (``:f``, ``:p`` one lease after the last grant or renewal,
    ``:v`` 60 s after its last claim, claimed at most every 30 s of use), and a counting
    lane's heading drops ``max N`` once its cap record (``:m``, one lease) has lapsed."""
    from lanequeue.redis._protocol import DEFAULT_LEASE_S

    readme = " ".join((Path(__file__).resolve().parent.parent / "README.md")
                      .read_text(encoding="utf-8").split())
    marker_s = RedisLane._version_ttl_s
    assert (DEFAULT_LEASE_S, marker_s) == (30.0, 60.0)
    assert ("A lane with nothing left in it (no holder, nobody waiting) stays listed until "
            "its keys expire: its fencing counters and presence records (`:f`, `:p`) one "
            f"lease (`lease_s`, {DEFAULT_LEASE_S:g} s by default) after their last grant or "
            f"renewal, and its version marker (`:v`) {marker_s:g} s after it was last "
            f"claimed, which a lane in use does at most every {marker_s / 2:g} s (so "
            f"{marker_s / 2:g} to {marker_s:g} s after the last use). A counting lane's "
            "heading shows its cap (`max N`) only while its cap record (`:m`) lives, one "
            "lease after the lane's last acquire, renewal or release; then it drops `max N` "
            "until the lane is used again.") in readme

    # The default figures, as a real server has them right after one use of each kind.
    sessions = RedisSessionLane(redis_client, prefix=redis_prefix)
    llm = RedisLane(redis_client, "llm", max_concurrent=3, prefix=redis_prefix)
    with sessions.acquire("k1"), llm.acquire("a"):
        pass
    ttls = _ttls(redis_client, redis_prefix)
    assert sorted(ttls) == ["c:f", "c:m", "c:v", "s:f", "s:p", "s:v"], ttls
    for suffix, ms in ttls.items():
        life = marker_s if suffix.endswith("v") else DEFAULT_LEASE_S
        assert life * 1000 - 2000 < ms <= life * 1000, (suffix, ms)
    code, out, err = _run(capsys, "--backend", reader_url, "--prefix", redis_prefix)
    assert code == 0, err
    assert _heading(redis_prefix, "llm", "counting, max 3", 0, 0).search(out), out
    assert _heading(redis_prefix, "session", "session", 0, 0).search(out), out

    # The same with a short lease and marker: each key expires on its own.
    prefix = redis_prefix + "short"
    lease_s, marker_s = 0.2, _ShortMarkerLane._version_ttl_s
    sessions = _ShortMarkerSessionLane(redis_client, prefix=prefix, lease_s=lease_s)
    llm = _ShortMarkerLane(redis_client, "llm", max_concurrent=3, prefix=prefix,
                           lease_s=lease_s)

    def use() -> dict[str, int]:
        with sessions.acquire("k1"), llm.acquire("a"):
            pass
        return _ttls(redis_client, prefix)

    use()
    claimed = time.monotonic()
    time.sleep(0.3)
    ttls = use()  # before the marker's next claim is due: it runs on from the last one
    for kind in "sc":
        assert ttls[f"{kind}:v"] <= (claimed + marker_s - time.monotonic()) * 1000 + 50, ttls
    time.sleep(max(0.0, claimed + marker_s / 2 + 0.1 - time.monotonic()))
    ttls = use()  # half its life on: claimed again
    for kind in "sc":
        assert ttls[f"{kind}:v"] > (marker_s - 0.5) * 1000, ttls
    reader = StatusReader(redis_client, prefix)
    _until(lambda: "c:m" not in _ttls(redis_client, prefix), timeout=5)
    code, out, err = _run(capsys, "--backend", reader_url, "--prefix", prefix)
    assert code == 0, err
    assert _heading(prefix, "llm", "counting", 0, 0).search(out), out  # no "max 3"
    assert _heading(prefix, "session", "session", 0, 0).search(out), out
    doc = reader.read()
    assert [(lane["name"], lane.get("max_concurrent", "-"),
             lane["holders"], lane["waiting"]) for lane in doc["lanes"]] == [
        ("llm", None, [], 0), ("session", "-", [], 0)]
    assert set(_ttls(redis_client, prefix)) == {"c:v", "s:v"}  # all that lists them now
    _until(lambda: not _ttls(redis_client, prefix), timeout=marker_s + 2)
    assert reader.read()["lanes"] == []


def test_every_install_hint_names_an_extra_of_the_package() -> None:
    """The hints a missing optional part gives (``install_hint``) name extras that
    ``pyproject.toml`` declares, in both forms: from an index and from a checkout."""
    import re
    from pathlib import Path

    from lanequeue._errors import install_hint

    root = Path(__file__).resolve().parents[1]
    table = (root / "pyproject.toml").read_text().split("[project.optional-dependencies]")[1]
    extras = set(re.findall(r"^(\w+) = \[", table.split("\n[")[0], re.M))
    source = "\n".join(p.read_text() for p in (root / "src").rglob("*.py"))
    named = set(re.findall(r"install_hint\('(\w+)'\)", source))
    named |= set(re.findall(r"_need\(\s*\"[\w.]+\",\s*\"(\w+)\"", source))
    assert {"cli", "plot", "prometheus", "redis", "otel"} <= named
    assert named <= extras
    assert install_hint("plot") == ("pip install 'lanequeue[plot]' "
                                    "(in a source checkout: pip install '.[plot]')")
