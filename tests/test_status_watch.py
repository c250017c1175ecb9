"""``lanequeue status --watch`` across a failed read, against a real redis-server of the
test's own (tests/redis_server.py): frozen with SIGSTOP (each read times out), or
stopped and started again on its port (each connection is refused). The watch shows the
error in place of the table, with the time it failed and that it retries, keeps reading
at its interval, and shows the table again once Redis answers; Ctrl-C ends it with
status 130. An error that retrying cannot heal (a wrong password, a command the Redis
user may not run) ends it at once with status 2, as without ``--watch``.

In-process runs count the waits of the watch between two reads (its private ``_nap``)
to act between two reads and to press Ctrl-C; the URL's ``socket_timeout`` keeps a
frozen read short.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import time
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import redis
from conftest import spawn_status_watch
from redis_server import RedisServer

from lanequeue.cli import main
from lanequeue.redis import RedisLane, _status

pytestmark = pytest.mark.timeout(30)

#: Seconds a read of a frozen server waits (the URL's socket_timeout) in these tests.
READ_WAIT = 0.5
#: The failure line of a watch, up to the error (``reading URL failed at HH:MM:SS: ``).
FAILED = re.compile(r"reading (\S+) failed at (\d\d:\d\d:\d\d): ")
HEADER = "keys seen (SCAN)"


def _url(server: RedisServer, auth: str = "") -> str:
    return f"redis://{auth}{server.host}:{server.port}/0?socket_timeout={READ_WAIT}"


@pytest.fixture
def a_lane(own_server: RedisServer, redis_prefix: str) -> Iterator[str]:
    """A counting lane of ``redis_prefix`` on ``own_server``, used once and released (its
    keys live on for one lease, 30 s): the heading its table shows."""
    client = redis.Redis(host=own_server.host, port=own_server.port)
    lane = RedisLane(client, "llm", max_concurrent=2, prefix=redis_prefix)
    with lane.acquire("a"):
        pass
    client.close()
    yield f"{redis_prefix}/llm (counting, max 2) holders 0, waiting 0"


def _watch(capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch,
           argv: list[str], at_nap: dict[int, Callable[[], None]],
           stop_at: int) -> tuple[int, str, str, list[float]]:
    """Run ``lanequeue status ARGV`` in this process; after the watch's wait number N
    (1, 2, ...) between two reads, run ``at_nap[N]``; Ctrl-C (KeyboardInterrupt) in
    wait ``stop_at``. The exit status, stdout, stderr and the waits taken. (The watch's
    own wait, not every ``time.sleep``: redis-py sleeps between its own retries.)"""
    real_nap = _status._nap
    naps: list[float] = []

    def nap(s: float) -> None:
        naps.append(s)
        if len(naps) == stop_at:
            raise KeyboardInterrupt
        real_nap(s)
        act = at_nap.get(len(naps))
        if act is not None:
            act()

    monkeypatch.setattr(_status, "_nap", nap)
    code = main(["status", *argv])
    cap = capsys.readouterr()
    return code, cap.out, cap.err, naps


def _frames(out: str) -> list[str]:
    """The frames of a watch whose output is not a terminal: whole, a blank line
    between two."""
    return out.rstrip("\n").split("\n\n")


def _assert_failed(frame: str, url: str, error: str, interval: str) -> None:
    """``frame`` is the failure the watch shows in place of the table: the URL, the
    time of the failure, the error, and that it retries (and nothing of a table)."""
    m = FAILED.search(frame)
    assert m is not None and m.group(1) == url, frame
    assert error in frame, frame
    assert f"retrying every {interval} s" in frame, frame
    assert HEADER not in frame and "│" not in frame, frame


def test_a_frozen_redis_is_shown_failing_then_the_table_again(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch,
    own_server: RedisServer, a_lane: str, redis_prefix: str,
) -> None:
    """Piped (each frame printed whole): the table; the server frozen for two reads,
    each a frame of its failure (a read timeout); thawed, the table again; Ctrl-C: 130."""
    url = _url(own_server)
    code, out, err, naps = _watch(
        capsys, monkeypatch,
        ["--backend", url, "--prefix", redis_prefix, "--watch", "--interval", "0.1"],
        {1: own_server.freeze, 3: own_server.thaw}, stop_at=4)
    assert code == 130, (out, err)
    assert naps == [0.1] * 4 and err == ""
    frames = _frames(out)
    assert len(frames) == 4, out
    for table in (frames[0], frames[3]):
        assert table.startswith("1 lane, ") and HEADER in table, table
        assert a_lane in table, table
    for failed in frames[1:3]:
        _assert_failed(failed, url, "TimeoutError", "0.1")
    # The second failure says since when the reads have failed: the first one's time.
    first = FAILED.search(frames[1])
    assert first is not None and "failed since" not in frames[1]
    assert f"retrying every 0.1 s; 2 reads failed since {first.group(2)}" in frames[2]


def test_a_restarting_redis_is_shown_failing_then_the_table_again(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch,
    own_server: RedisServer, a_lane: str,
) -> None:
    """The server stopped (connections refused) for two reads, then started again on
    its port (empty: no persistence): the failures, then the table of what it holds."""
    url = _url(own_server)
    code, out, _err, _ = _watch(
        capsys, monkeypatch, ["--backend", url, "--watch", "--interval", "0.1"],
        {1: own_server.stop, 3: own_server.start}, stop_at=4)
    assert code == 130, out
    frames = _frames(out)
    assert len(frames) == 4, out
    assert a_lane in frames[0]
    for failed in frames[1:3]:
        _assert_failed(failed, url, "ConnectionError", "0.1")
        assert "refused" in failed, failed
    assert frames[3].startswith("0 lanes, 0 keys seen (SCAN)"), frames[3]


def test_on_a_terminal_the_failure_is_drawn_in_place_of_the_table(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch,
    own_server: RedisServer, a_lane: str, redis_prefix: str,
) -> None:
    """On a terminal (rich's live display redraws in place) the same: the table, the
    failure drawn over it, the table drawn over the failure; Ctrl-C: 130."""
    monkeypatch.setenv("TTY_COMPATIBLE", "1")
    monkeypatch.setenv("TERM", "xterm-256color")
    monkeypatch.setenv("COLUMNS", "200")
    url = _url(own_server)
    code, out, err, _ = _watch(
        capsys, monkeypatch,
        ["--backend", url, "--prefix", redis_prefix, "--watch", "--interval", "0.1"],
        {1: own_server.freeze, 2: own_server.thaw}, stop_at=3)
    assert code == 130 and err == "", (out, err)
    assert "\x1b[" in out  # drawn in place, with cursor movements
    failed_at = out.find("failed at ")
    assert failed_at > out.find(a_lane) >= 0, out
    assert out.find(a_lane, failed_at) > failed_at, out
    assert FAILED.search(out) is not None and "TimeoutError" in out, out
    assert "retrying every 0.1 s" in out, out


@pytest.mark.parametrize("who", ["wrong password", "may not SCAN"])
def test_an_error_retrying_cannot_heal_ends_the_watch_at_once(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch,
    redis_server: RedisServer, redis_client: Any, who: str,
) -> None:
    """A wrong password, or a Redis user that may not SCAN, fails every read alike:
    ``--watch`` exits with status 2 at the first read, after today's one line naming the
    URL and the error, and shows no failure frame."""
    user = "watch" + uuid.uuid4().hex[:8]
    redis_client.execute_command("ACL", "SETUSER", user, "on", ">pw", "~*",
                                 "+@read", "+time", "+@connection", "-scan")
    try:
        password = "wrong" if who == "wrong password" else "pw"
        url = _url(redis_server, f"{user}:{password}@")
        code, out, err, naps = _watch(
            capsys, monkeypatch, ["--backend", url, "--watch", "--interval", "0.1"],
            {}, stop_at=3)
    finally:
        redis_client.execute_command("ACL", "DELUSER", user)
    assert code == 2 and out == "" and naps == [], (out, err)
    error = "AuthenticationError" if who == "wrong password" else "NoPermissionError"
    shown = _url(redis_server, f"{user}@")  # (its password taken out)
    assert err.startswith(f"lanequeue status: reading {shown}: {error}: "), err
    assert err.count("\n") == 1 and "pw" not in err.replace(shown, "")


def test_an_error_that_cannot_heal_after_frames_ends_the_watch_with_status_2(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch,
    redis_server: RedisServer, redis_client: Any,
) -> None:
    """The watch's Redis user deleted while it watches: the server closes its
    connection (a failure that passes, shown and retried), and connecting again is
    refused as a wrong password: exit 2 there, the authentication error named."""
    user = "watch" + uuid.uuid4().hex[:8]
    redis_client.execute_command("ACL", "SETUSER", user, "on", ">pw", "~*", "resetchannels",
                                 "+@read", "+scan", "+time", "+@connection", "-keys")

    def delete() -> None:
        redis_client.execute_command("ACL", "DELUSER", user)

    url = _url(redis_server, f"{user}:pw@")
    try:
        code, out, err, naps = _watch(
            capsys, monkeypatch, ["--backend", url, "--watch", "--interval", "0.1"],
            {1: delete}, stop_at=5)
    finally:
        delete()
    assert code == 2, (out, err)
    assert len(naps) < 5 and HEADER in _frames(out)[0], out
    shown = _url(redis_server, f"{user}@")  # (its password taken out)
    assert err.startswith(f"lanequeue status: reading {shown}: AuthenticationError: "), err


def _read_until(proc: subprocess.Popen[bytes], done: Callable[[bytes], bool],
                data: bytes, timeout: float = 15.0) -> bytes:
    """``data`` and what ``proc`` writes on stdout next, until ``done(all of it)``."""
    import selectors

    assert proc.stdout is not None
    deadline = time.monotonic() + timeout
    with selectors.DefaultSelector() as sel:
        sel.register(proc.stdout, selectors.EVENT_READ)
        while not done(data):
            left = deadline - time.monotonic()
            assert left > 0, f"not seen in time: {data.decode(errors='replace')}"
            if sel.select(left):
                chunk = os.read(proc.stdout.fileno(), 65536)
                assert chunk, f"the watch ended: {data.decode(errors='replace')}"
                data += chunk
    return data


def test_the_command_keeps_watching_a_redis_that_froze_until_ctrl_c(
    own_server: RedisServer, a_lane: str, redis_prefix: str,
) -> None:
    """``lanequeue status --watch | tee log`` as a process: the server frozen for about
    a second (several reads fail), then thawed: the failures, then the table again;
    SIGINT (Ctrl-C) ends it with status 130 and nothing on stderr."""
    url = _url(own_server)
    proc = spawn_status_watch(url, redis_prefix)
    try:
        data = _read_until(proc, lambda d: HEADER.encode() in d, b"")
        own_server.freeze()
        try:
            data = _read_until(proc, lambda d: d.count(b" failed at ") >= 2, data)
        finally:
            own_server.thaw()
        failed = data.rindex(b" failed at ")
        data = _read_until(proc, lambda d: HEADER.encode() in d[failed:], data)
        assert proc.poll() is None  # still watching
    finally:
        proc.send_signal(signal.SIGINT)
        rest, err = proc.communicate(timeout=20)
    assert proc.returncode == 130 and err == b"", err
    frames = _frames((data + rest).decode())
    kinds = ["table" if HEADER in f else "failed" for f in frames]
    first = kinds.index("failed")
    assert kinds[0] == "table" and kinds[first:first + 2] == ["failed", "failed"], frames
    assert "table" in kinds[first:], frames
    for frame in frames:
        if HEADER in frame:
            assert a_lane in frame, frame
        else:
            _assert_failed(frame, url, "Error", "0.1")


@pytest.mark.parametrize("error, passes", [
    (redis.exceptions.ConnectionError("Error 111 connecting. Connection refused."), True),
    (redis.exceptions.TimeoutError("Timeout reading from socket"), True),
    (redis.exceptions.BusyLoadingError("Redis is loading the dataset in memory"), True),
    (redis.exceptions.MasterDownError("Link with MASTER is down"), True),
    (redis.exceptions.ClusterDownError("The cluster is down"), True),
    (redis.exceptions.TryAgainError("Multiple keys request during rehashing"), True),
    (redis.exceptions.AuthenticationError("invalid username-password pair"), False),
    (redis.exceptions.AuthorizationError("not authorized"), False),
    (redis.exceptions.NoPermissionError("this user has no permissions"), False),
    (redis.exceptions.ResponseError("DB index is out of range"), False),
])
def test_which_errors_the_watch_retries(error: Exception, passes: bool) -> None:
    """The errors that pass (unreachable, refused, no answer in time, loading, a replica
    or cluster not serving) are retried; a refused password or user, a refused command,
    any other reply error ends the watch."""
    assert _status.passing(error) is passes


def test_the_readme_shows_the_failure_as_the_watch_does() -> None:
    """README, "A live view of a Redis": the failure shown in place of the table, from
    the second failed read of a run."""
    from pathlib import Path

    from rich.console import Console

    readme = (Path(__file__).resolve().parent.parent / "README.md").read_text("utf-8")
    console = Console(file=None, width=200, _environ={})
    with console.capture() as cap:
        console.print(_status.failure(
            "redis://127.0.0.1:6379/0", redis.exceptions.TimeoutError(
                "Timeout reading from socket"), "14:02:07", 1.0, 3, "14:02:01"))
    assert f"```\n{cap.get()}```\n" in readme, cap.get()


@pytest.mark.parametrize("watch", [False, True], ids=["once", "watch"])
def test_the_url_is_shown_without_its_password(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, watch: bool,
) -> None:
    """A dashboard left on screen, or a log of the exit line, shows the URL with its
    password taken out (in the user part or as a query argument)."""
    for secret_url, url in [
        ("redis://ops:s3cret@127.0.0.1:1/0", "redis://ops@127.0.0.1:1/0"),
        ("redis://127.0.0.1:1/0?password=s3cret&socket_timeout=0.5",
         "redis://127.0.0.1:1/0?socket_timeout=0.5"),
    ]:
        if watch:
            code, out, err, _ = _watch(
                capsys, monkeypatch, ["--backend", secret_url, "--watch", "--interval",
                                      "0.1"], {}, stop_at=1)
            assert code == 130 and err == "", (out, err)
            _assert_failed(_frames(out)[0], url, "ConnectionError", "0.1")
        else:
            code = main(["status", "--backend", secret_url, "--json"])
            cap = capsys.readouterr()
            out, err = cap.out, cap.err
            assert code == 2 and url in err, err
        assert "s3cret" not in out + err
