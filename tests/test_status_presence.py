"""``lanequeue status``: whether each holder's process is still there (``present`` in
``--json``, the "process" column of the table), against the real server: a holder in a
child process killed with SIGKILL is "gone" at once (its presence subscription drops
with its socket), a live one "live", and a Redis user that may not run ``PUBSUB NUMSUB``
sees "?" (said once) and exit status 0."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
import uuid
from pathlib import Path
from typing import Any

import pytest

from lanequeue.cli import main
from lanequeue.redis import RedisLane, RedisSessionLane
from lanequeue.redis._status import StatusReader, render

pytestmark = pytest.mark.timeout(30)

_READER = ("+@read", "+scan", "+time", "+@connection", "-keys")


def _until(cond: Any, timeout: float = 8.0) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, "condition not reached in time"
        time.sleep(0.01)


def _user(redis_server: Any, redis_client: Any, *extra: str) -> Any:
    user = "status" + uuid.uuid4().hex[:8]
    redis_client.execute_command("ACL", "SETUSER", user, "on", ">pw", "~*", "resetchannels",
                                 *_READER, *extra)
    yield f"redis://{user}:pw@{redis_server.host}:{redis_server.port}/0"
    redis_client.execute_command("ACL", "DELUSER", user)


@pytest.fixture
def reader_url(redis_server: Any, redis_client: Any) -> Any:
    """A user that may read, SCAN and TIME, and nothing else (no PUBSUB)."""
    yield from _user(redis_server, redis_client)


@pytest.fixture
def numsub_url(redis_server: Any, redis_client: Any) -> Any:
    """The same, allowed ``PUBSUB NUMSUB`` too (still no write, no SUBSCRIBE)."""
    yield from _user(redis_server, redis_client, "+pubsub|numsub")


_CHILD = textwrap.dedent("""
    import sys, time
    import redis
    from lanequeue.redis import RedisLane, RedisSessionLane
    host, port, prefix = sys.argv[1], int(sys.argv[2]), sys.argv[3]
    client = redis.Redis(host=host, port=port)
    sessions = RedisSessionLane(client, prefix=prefix, lease_s=30)
    llm = RedisLane(client, "llm", max_concurrent=3, prefix=prefix, lease_s=30)
    sessions.acquire("dead").__enter__()
    llm.acquire("dead").__enter__()
    print("held", flush=True)
    time.sleep(60)
""")


@pytest.fixture
def mixed_holders(redis_server: Any, redis_client: Any, redis_prefix: str) -> Any:
    """On a per-key lane and a counting lane of ``redis_prefix``: key "dead" held by a
    child process killed with SIGKILL (its holds' leases still run), key "live" held
    here."""
    child = subprocess.Popen(
        [sys.executable, "-c", _CHILD, redis_server.host, str(redis_server.port),
         redis_prefix],
        stdout=subprocess.PIPE, text=True, stdin=subprocess.DEVNULL)
    try:
        assert child.stdout is not None and child.stdout.readline() == "held\n"
        sessions = RedisSessionLane(redis_client, prefix=redis_prefix, lease_s=30)
        llm = RedisLane(redis_client, "llm", max_concurrent=3, prefix=redis_prefix,
                        lease_s=30)
        with sessions.acquire("live"), llm.acquire("live"):
            os.kill(child.pid, signal.SIGKILL)
            child.wait(10)
            reader = StatusReader(redis_client, redis_prefix)
            # Redis drops the dead process's subscription when its socket closes.
            _until(lambda: all(h["present"] is (h["key"] == "live")
                               for lane in reader.read()["lanes"] for h in lane["holders"]))
            yield
    finally:
        if child.poll() is None:
            child.kill()
            child.wait(10)
        if child.stdout is not None:
            child.stdout.close()


def _run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(["status", *argv])
    cap = capsys.readouterr()
    return code, cap.out, cap.err


def _rows(out: str) -> list[tuple[str, str]]:
    """(key, process) of each row of the tables in ``out``."""
    return [(cells[0], cells[-2]) for line in out.splitlines() if line.startswith("│")
            for cells in [[c.strip() for c in line.strip("│").split("│")]]]


def _holders(doc: dict[str, Any]) -> dict[tuple[str, str], dict[str, Any]]:
    return {(lane["name"], h["key"]): h for lane in doc["lanes"] for h in lane["holders"]}


def test_json_tells_a_killed_holder_from_a_live_one(
    capsys: pytest.CaptureFixture[str], numsub_url: str, mixed_holders: None,
    redis_prefix: str,
) -> None:
    code, out, err = _run(capsys, "--backend", numsub_url, "--prefix", redis_prefix, "--json")
    assert code == 0, err
    doc = json.loads(out)
    assert doc["presence_unknown"] is None
    holders = _holders(doc)
    assert {k: h["present"] for k, h in holders.items()} == {
        ("session", "dead"): False, ("session", "live"): True,
        ("llm", "dead"): False, ("llm", "live"): True}
    # The dead holds are still there, their leases counting down: only presence tells.
    assert all(0 < h["lease_left_s"] <= 30 for h in holders.values())


def test_table_shows_live_and_gone(
    capsys: pytest.CaptureFixture[str], numsub_url: str, mixed_holders: None,
    redis_prefix: str,
) -> None:
    code, out, err = _run(capsys, "--backend", numsub_url, "--prefix", redis_prefix)
    assert code == 0, err
    assert "process" in out and "?" not in out
    rows = _rows(out)
    assert sorted(rows) == [("dead", "gone")] * 2 + [("live", "live")] * 2, out


def test_a_user_without_pubsub_sees_unknown_said_once_and_exit_0(
    capsys: pytest.CaptureFixture[str], reader_url: str, mixed_holders: None,
    redis_prefix: str,
) -> None:
    code, out, err = _run(capsys, "--backend", reader_url, "--prefix", redis_prefix, "--json")
    assert code == 0, err
    doc = json.loads(out)
    assert "PUBSUB NUMSUB" in doc["presence_unknown"]
    assert "no permissions" in doc["presence_unknown"]
    holders = _holders(doc)
    assert len(holders) == 4 and all(h["present"] is None for h in holders.values())
    code, out, err = _run(capsys, "--backend", reader_url, "--prefix", redis_prefix)
    assert code == 0 and err == "", err
    assert out.count("PUBSUB NUMSUB") == 1, out
    assert sorted(_rows(out)) == [("dead", "?")] * 2 + [("live", "?")] * 2, out


def test_a_hold_without_a_presence_record_is_unknown(
    redis_client: Any, redis_prefix: str,
) -> None:
    """A hold whose presence record is gone (granted without a presence connection: on
    Redis Cluster, by a client with none) reads as unknown, not as gone; a record naming
    another owner (stale) is not the holder's."""
    sessions = RedisSessionLane(redis_client, prefix=redis_prefix, lease_s=30)
    reader = StatusReader(redis_client, redis_prefix)
    with sessions.acquire("k"):
        p = next(k for k in redis_client.scan_iter(match=f"*{redis_prefix}*", count=1000)
                 if k.endswith(b"}:p"))
        _, _, rest = redis_client.get(p).decode().partition("|")
        assert [h["present"] for h in _holders(reader.read()).values()] == [True]
        redis_client.set(p, "other|" + rest, keepttl=True)
        assert [h["present"] for h in _holders(reader.read()).values()] == [None]
        redis_client.delete(p)
        doc = reader.read()
        assert [h["present"] for h in _holders(doc).values()] == [None]
        assert doc["presence_unknown"] is None  # nothing to ask: no note
        import io

        from rich.console import Console

        console = Console(width=200, file=io.StringIO())
        console.print(render(doc))
        text = console.file.getvalue()
        assert _rows(text) == [("k", "?")] and "PUBSUB" not in text, text


def test_readme_says_what_the_process_column_means() -> None:
    readme = " ".join((Path(__file__).resolve().parent.parent / "README.md")
                      .read_text(encoding="utf-8").split())
    for said in ("The `process` column (`present` in `--json`: `true`, `false`, `null`) "
                 "reads `live` while the holder's process keeps its presence connection "
                 "subscribed (`PUBSUB NUMSUB`",
                 "It reads `?` (unknown) for a hold with no presence record",
                 "when the Redis user may not run `PUBSUB NUMSUB` (a user allowed only to "
                 "read, `SCAN` and `TIME`): the command then says so once, above the tables "
                 "(`presence_unknown` in `--json`), and still exits with status 0; allow the "
                 "user `+pubsub|numsub`"):
        assert said in readme, said
