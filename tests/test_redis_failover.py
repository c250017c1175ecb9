"""C30 (failover): a killed replica's holds reach the next waiter within about 3 s with the
default ``lease_s=30``, while a replica that is only slow keeps them up to ``lease_s``, and
a holder learns its loss before anyone else is granted (see ``_presence.py``).

Holders run in real processes (``spawn``) that the tests SIGKILL or SIGSTOP; the waiter is
the test process, against the real redis-server.
"""

from __future__ import annotations

import json
import multiprocessing as mp
import os
import signal
import threading
import time
from pathlib import Path
from typing import Any

import redis

from lanequeue.redis import RedisLane, RedisSessionLane
from lanequeue.redis._presence import GRACE_S
from lanequeue.redis._status import StatusReader

KEY = "room-1"


def _holder(port: int, prefix: str, out: str, go: str) -> None:
    """Hold KEY on a per-key lane and the one permit of a counting lane (default
    lease_s=30), report, then wait for the file ``go`` and release both."""
    client = redis.Redis(port=port)
    session = RedisSessionLane(client, "s", prefix=prefix)
    counting = RedisLane(client, "c", max_concurrent=1, prefix=prefix)
    assert session.lease_s == 30.0
    with session.acquire(KEY) as s_hold, counting.acquire(KEY) as c_hold:
        Path(out).write_text(json.dumps({"pid": os.getpid(), "s": s_hold.fencing_token,
                                         "c": c_hold.fencing_token}))
        while not os.path.exists(go):
            time.sleep(0.02)
        report = {"s_lost": s_hold.lost, "c_lost": c_hold.lost}
    report["released"] = True
    Path(out + ".done").write_text(json.dumps(report))


def _start_holder(tmp_path: Path, port: int, prefix: str) -> tuple[Any, str, str]:
    out, go = str(tmp_path / "held.json"), str(tmp_path / "go")
    proc = mp.get_context("spawn").Process(target=_holder, args=(port, prefix, out, go))
    proc.start()
    deadline = time.monotonic() + 20
    while not os.path.exists(out):
        assert time.monotonic() < deadline, "the holder process never reported its holds"
        assert proc.is_alive(), "the holder process died before holding"
        time.sleep(0.02)
    time.sleep(0.05)  # the file is written; let it be complete
    return proc, out, go


def _wait_in_both(session: Any, counting: Any,
                  timeout_s: float) -> tuple[dict[str, tuple[float, int]], list[Any]]:
    """Two threads of this process that wait (up to ``timeout_s``) for KEY on ``session``
    and on ``counting``, started together; each records (when granted, fencing token)
    under "s" or "c" and releases at once. Returns that record and the threads."""
    got: dict[str, tuple[float, int]] = {}
    ready = threading.Barrier(3)

    def wait(lane: Any, name: str) -> None:
        ready.wait()
        with lane.acquire(KEY, timeout_s=timeout_s) as hold:
            got[name] = (time.monotonic(), hold.fencing_token)

    threads = [threading.Thread(target=wait, args=(session, "s")),
               threading.Thread(target=wait, args=(counting, "c"))]
    for t in threads:
        t.start()
    ready.wait()
    return got, threads


def test_c30_killed_holder_passes_key_and_permit_within_about_3_s(
    redis_server: Any, redis_client: Any, redis_prefix: str, tmp_path: Path
) -> None:
    """C30: SIGKILL of a holder process (lease_s=30): the waiter in another process gets
    the key and the counting permit within about GRACE_S + one poll, not 30 s."""
    proc, out, _ = _start_holder(tmp_path, redis_server.port, redis_prefix)
    held = json.loads(Path(out).read_text())
    session = RedisSessionLane(redis_client, "s", prefix=redis_prefix)
    counting = RedisLane(redis_client, "c", max_concurrent=1, prefix=redis_prefix)
    assert not session.try_acquire(KEY)
    got, threads = _wait_in_both(session, counting, 20)
    time.sleep(0.3)  # both wait in line now
    t0 = time.monotonic()
    os.kill(proc.pid, signal.SIGKILL)
    for t in threads:
        t.join(25)
    proc.join(5)
    s_after, c_after = got["s"][0] - t0, got["c"][0] - t0
    assert got["s"][1] > held["s"] and got["c"][1] > held["c"]
    print(f"C30: key after {s_after:.2f} s, permit after {c_after:.2f} s (lease_s=30)")
    # The bound of the rule (grace + one poll + a round trip), far below the 30 s lease.
    assert s_after < GRACE_S + 1.0 + 1.0
    assert c_after < GRACE_S + 1.0 + 1.0


def _waiter(port: int, prefix: str) -> None:
    """Wait (lease_s=30, default liveness) for KEY on the per-key lane and for the permit
    of the counting lane, each in a thread of its own, until killed."""
    client = redis.Redis(port=port)
    session = RedisSessionLane(client, "s", prefix=prefix)
    counting = RedisLane(client, "c", max_concurrent=1, prefix=prefix)
    threads = [threading.Thread(target=lambda lane=lane: lane.acquire_timeout(KEY, 60))
               for lane in (session, counting)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()


def test_c30_killed_holder_whose_first_waiter_died_too_reaches_the_next_waiter(
    redis_server: Any, redis_client: Any, redis_prefix: str, tmp_path: Path
) -> None:
    """C30, a killed holder and its head waiter killed too, before the takeover: the next
    waiter (this process) is not held up for the holder's whole lease (30 s) behind a dead
    head: it drops the head once its liveness window has passed, becomes the head, and
    takes the hold over (about 6 s after the kill; it took 30 s)."""
    proc, out, _ = _start_holder(tmp_path, redis_server.port, redis_prefix)
    held = json.loads(Path(out).read_text())
    session = RedisSessionLane(redis_client, "s", prefix=redis_prefix)
    counting = RedisLane(redis_client, "c", max_concurrent=1, prefix=redis_prefix)
    first = mp.get_context("spawn").Process(target=_waiter,
                                            args=(redis_server.port, redis_prefix))
    first.start()
    deadline = time.monotonic() + 20
    while session.waiting_for(KEY) < 1 or counting.lane_status()["waiting"] < 1:
        assert time.monotonic() < deadline, "the first waiter never joined both lines"
        time.sleep(0.02)
    got, threads = _wait_in_both(session, counting, 40)
    deadline = time.monotonic() + 10
    while session.waiting_for(KEY) < 2 or counting.lane_status()["waiting"] < 2:
        assert time.monotonic() < deadline, "this process's waiters never joined"
        time.sleep(0.02)
    t0 = time.monotonic()
    os.kill(proc.pid, signal.SIGKILL)
    os.kill(first.pid, signal.SIGKILL)  # the head of both lines, before the takeover
    for t in threads:
        t.join(45)
    proc.join(5)
    first.join(5)
    s_after, c_after = got["s"][0] - t0, got["c"][0] - t0
    assert got["s"][1] > held["s"] and got["c"][1] > held["c"]
    print(f"C30, dead head: key after {s_after:.2f} s, permit after {c_after:.2f} s")
    # The dead head's liveness window (3 polls + 1 s) and the grace, far below 30 s.
    assert s_after < 12.0 and c_after < 12.0


def test_c30_killed_holder_is_taken_over_by_try_acquire_too(
    redis_server: Any, redis_client: Any, redis_prefix: str, tmp_path: Path
) -> None:
    """C30 without a waiter in line: after a SIGKILL of the holder process (lease_s=30),
    a caller that only polls with try_acquire (the scheduler pattern) gets the key and
    the counting permit within about GRACE_S of its first try after the kill (the first
    caller to find the holder's process gone starts the grace), not 30 s. Until then a
    try is refused, and a try never overtakes a waiter in line."""
    proc, out, _ = _start_holder(tmp_path, redis_server.port, redis_prefix)
    held = json.loads(Path(out).read_text())
    session = RedisSessionLane(redis_client, "s", prefix=redis_prefix)
    counting = RedisLane(redis_client, "c", max_concurrent=1, prefix=redis_prefix)
    assert not session.try_acquire(KEY) and not counting.try_acquire(KEY)
    os.kill(proc.pid, signal.SIGKILL)
    proc.join(5)
    t0 = time.monotonic()
    got: dict[str, float] = {}
    while len(got) < 2 and time.monotonic() - t0 < 15:
        for name, lane in (("s", session), ("c", counting)):
            if name not in got and lane.try_acquire(KEY):
                got[name] = time.monotonic() - t0
        time.sleep(0.1)
    print(f"C30 try_acquire: key after {got.get('s')} s, permit after {got.get('c')} s")
    assert set(got) == {"s", "c"}, got
    # Refused at first (the grace starts at the first try), granted within the grace
    # plus a poll and a round trip: far below the 30 s lease.
    assert GRACE_S - 0.5 < got["s"] < GRACE_S + 1.5 and GRACE_S - 0.5 < got["c"] < GRACE_S + 1.5
    (s_hold,), (c_hold,) = session.stuck(0.0), counting.stuck(0.0)
    assert s_hold.token > held["s"] and c_hold.token > held["c"]
    assert session.manual_release(KEY) and counting.manual_release(KEY)


def test_c30_frozen_holder_keeps_its_holds_then_releases(
    redis_server: Any, redis_client: Any, redis_prefix: str, tmp_path: Path
) -> None:
    """C30: a holder process frozen with SIGSTOP for 5 s (longer than the grace) keeps its
    holds: no waiter is granted meanwhile; after SIGCONT it reads lost == False and
    releases normally, and the waiter gets the key then."""
    proc, out, go = _start_holder(tmp_path, redis_server.port, redis_prefix)
    session = RedisSessionLane(redis_client, "s", prefix=redis_prefix)
    counting = RedisLane(redis_client, "c", max_concurrent=1, prefix=redis_prefix)
    os.kill(proc.pid, signal.SIGSTOP)
    try:
        # Both waits poll, take the head of the line and ask about the holder's presence
        # for 5 s: the frozen process's connection is open, so nothing is taken over.
        got = {}
        t = threading.Thread(target=lambda: got.setdefault(
            "c", counting.acquire_timeout(KEY, 5.0)))
        t.start()
        assert session.acquire_timeout(KEY, 5.0) is False
        t.join()
        assert got["c"] is False
    finally:
        os.kill(proc.pid, signal.SIGCONT)
    Path(go).write_text("1")
    proc.join(10)
    assert proc.exitcode == 0
    done = json.loads(Path(out + ".done").read_text())
    assert done == {"s_lost": False, "c_lost": False, "released": True}
    with session.acquire(KEY, timeout_s=5), counting.acquire(KEY, timeout_s=5):
        pass


def test_c30_holder_learns_before_the_takeover_when_its_connection_is_cut(
    redis_server: Any, redis_client: Any, redis_prefix: str
) -> None:
    """C30: the server closes the holder process's presence connection (as a cut or a
    failover would): the holder's hold reads lost at once, and only later (after the
    grace) is the key granted to the waiter. Never lost == False after another grant."""
    admin = redis.Redis(port=redis_server.port)
    lost_at: list[float] = []
    holder_lane = RedisSessionLane(redis.Redis(port=redis_server.port), "s",
                                   prefix=redis_prefix,
                                   on_lease_lost=lambda h: lost_at.append(time.monotonic()))
    waiter_lane = RedisSessionLane(redis_client, "s", prefix=redis_prefix)
    hold = holder_lane.acquire(KEY)
    hold.__enter__()
    try:
        presence = holder_lane._presence
        assert presence is not None and presence.client_id
        epoch = hold._presence
        assert epoch is not None and not hold.lost
        granted: list[tuple[float, bool]] = []

        def wait() -> None:
            with waiter_lane.acquire(KEY, timeout_s=10):
                granted.append((time.monotonic(), hold.lost))

        t = threading.Thread(target=wait)
        t.start()
        time.sleep(0.3)
        cut = time.monotonic()
        admin.client_kill_filter(_id=presence.client_id)
        t.join(15)
        assert granted, "the waiter was never granted"
        at, lost_then = granted[0]
        assert lost_then is True
        assert lost_at and lost_at[0] < at
        # At once: well within the grace (a CI run under load once took 0.61 s: the
        # presence reader waited for a CPU), not at the end of the lease.
        assert lost_at[0] - cut < GRACE_S / 2
        assert at - cut >= GRACE_S * 0.9  # the server waited out the grace
    finally:
        try:
            hold.__exit__(None, None, None)
        except Exception:
            pass
        admin.close()


class _CountingCalls:
    """Counts the acquire scripts a lane object sends, per owner id."""

    def __init__(self) -> None:
        self.acquires: dict[str, int] = {}

    def record(self, op: str, call: Any) -> None:
        if op == "acquire":
            owner = call[2][0]
            self.acquires[owner] = self.acquires.get(owner, 0) + 1


def test_hand_off_carries_the_grant_no_confirm_round_trip(
    redis_client: Any, redis_prefix: str
) -> None:
    """A waiter whose process is present is handed a full lease in its wake-up: it holds
    after ONE acquire script (the one that put it in line), with a full lease and a
    larger fencing token, for both kinds of lane."""
    calls = _CountingCalls()

    class Session(RedisSessionLane):
        def _run(self, op: str, key: str | None, call: Any) -> Any:
            calls.record(op, call)
            return super()._run(op, key, call)

    class Counting(RedisLane):
        def _run(self, op: str, key: str | None, call: Any) -> Any:
            calls.record(op, call)
            return super()._run(op, key, call)

    for lane in (Session(redis_client, "s", prefix=redis_prefix, lease_s=30),
                 Counting(redis_client, "c", max_concurrent=1, prefix=redis_prefix,
                          lease_s=30)):
        first = lane.acquire(KEY)
        first.__enter__()
        got: dict[str, Any] = {}
        joined = threading.Event()

        def wait(lane: Any = lane, got: dict[str, Any] = got,
                 joined: threading.Event = joined) -> None:
            hold = lane.acquire(KEY, timeout_s=10)
            joined.set()
            with hold:
                got["owner"], got["token"] = hold.owner, hold.fencing_token
                got["left"] = hold._expires - time.monotonic()

        t = threading.Thread(target=wait)
        t.start()
        joined.wait(5)
        deadline = time.monotonic() + 5
        while lane.waiting == 0 and time.monotonic() < deadline:
            time.sleep(0.01)
        time.sleep(0.05)  # its first script has put it in line
        first.__exit__(None, None, None)
        t.join(10)
        assert got["token"] > first.fencing_token
        assert calls.acquires[got["owner"]] == 1  # no confirm round trip
        assert got["left"] > 25  # a full lease of 30 s, not a claim of a few seconds


def _frozen_waiter(port: int, prefix: str, out: str) -> None:
    """Wait for KEY (lease_s=2); once in, record the time, token and ``lost`` at entry.
    The wake-up listener hands each wake-up on 0.5 s late, so that on resuming from a
    freeze the waiting thread's poll (due by then) runs before the old grant is read."""
    from lanequeue.redis._wake import SyncWaker

    woken = SyncWaker._woken

    def late(self: Any, owner: str, token: int) -> None:
        time.sleep(0.5)
        woken(self, owner, token)

    SyncWaker._woken = late  # type: ignore[method-assign]
    lane = RedisSessionLane(redis.Redis(port=port), "w", prefix=prefix, lease_s=2.0)
    with lane.acquire(KEY, timeout_s=60) as hold:
        entered = time.time()
        Path(out).write_text(json.dumps({"at": entered, "lost": hold.lost,
                                         "token": hold.fencing_token}))


def test_a_waiter_frozen_while_its_grant_lapses_does_not_enter_over_the_next_holder(
    redis_server: Any, redis_client: Any, redis_prefix: str, tmp_path: Path
) -> None:
    """A process frozen (SIGSTOP) while in line is handed the key (its connections are
    alive), its lease runs out while it is frozen, and the next waiter is granted. Once
    resumed it must not enter on that old grant (which it reads only after a poll of its
    own said the key is not its): it waits its turn again, and enters after the next
    holder has released, with a newer fencing token."""
    port = redis_server.port
    first = RedisSessionLane(redis_client, "w", prefix=redis_prefix, lease_s=2.0)
    assert first.try_acquire(KEY)
    out = str(tmp_path / "entered.json")
    proc = mp.get_context("spawn").Process(target=_frozen_waiter,
                                           args=(port, redis_prefix, out))
    proc.start()
    try:
        reader = StatusReader(redis_client, redis_prefix)
        deadline = time.monotonic() + 20
        while reader.read()["lanes"][0]["lines"].get(KEY, 0) < 1:  # in line in Redis
            assert time.monotonic() < deadline, "the waiter never joined the line"
            time.sleep(0.02)
        os.kill(proc.pid, signal.SIGSTOP)
        try:
            time.sleep(2.5)  # longer than lease_s: the waiter's poll is due when it wakes
            assert first.manual_release(KEY)  # handed to the frozen waiter
            nxt = RedisSessionLane(redis.Redis(port=port), "w", prefix=redis_prefix,
                                   lease_s=2.0)
            t = time.monotonic()
            with nxt.acquire(KEY, timeout_s=20) as hold:  # after the frozen one's lease
                assert time.monotonic() - t < 10
                os.kill(proc.pid, signal.SIGCONT)
                time.sleep(2.0)  # the resumed process wakes, polls, reads its old grant
                assert not os.path.exists(out), "entered while the next holder held"
                assert not hold.lost
                mine, released = hold.fencing_token, time.time()
        finally:
            os.kill(proc.pid, signal.SIGCONT)
        proc.join(20)
        got = json.loads(Path(out).read_text())
        assert got["at"] >= released and got["token"] > mine and got["lost"] is False
    finally:
        if proc.is_alive():
            proc.kill()
