"""The Redis lanes across real processes: mutual exclusion, FIFO per key, balanced books and
no leftover keys under load (8 processes x 2,000 acquisitions over 16 keys), and a holder
killed with SIGKILL whose key passes to the next waiter within ``lease_s`` + 1 s.

Processes are started with the ``spawn`` method (fresh interpreters, their own clients).
Time stamps are ``time.monotonic()``, which is one system-wide clock on Linux, so the
records of different processes can be compared.
"""

from __future__ import annotations

import itertools
import json
import multiprocessing as mp
import os
import random
import signal
import threading
import time
from pathlib import Path
from typing import Any

import pytest
import redis

from lanequeue.redis import RedisLane, RedisSessionLane

N_PROCS = 8
N_ACQ = 2_000
N_KEYS = 16
LEASE_S = 2.0


class TracingSessionLane(RedisSessionLane):
    """Records when each acquisition's FIRST acquire script was sent and answered: its
    arrival in line happened between the two, on the server."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.first: dict[str, tuple[float, float]] = {}

    def _run(self, op: str, key: str | None, call: Any) -> Any:
        t0 = time.monotonic()
        reply = super()._run(op, key, call)
        if op == "acquire":
            self.first.setdefault(call[2][0], (t0, time.monotonic()))
        return reply


def _stress_worker(port: int, prefix: str, idx: int, occ: Any, out: str) -> None:
    client = redis.Redis(port=port)
    lane = TracingSessionLane(client, prefix=prefix, lease_s=LEASE_S, timeout_s=60)
    rng = random.Random(idx)
    records = []
    violations = 0
    for _ in range(N_ACQ):
        k = rng.randrange(N_KEYS)
        with lane.acquire(f"key:{k}") as hold:
            start = time.monotonic()
            with occ.get_lock():
                occ[k] += 1
                seen = occ[k]
            if seen != 1:
                violations += 1
            with occ.get_lock():
                occ[k] -= 1
            end = time.monotonic()
        send, recv = lane.first.pop(hold.owner)
        records.append((k, hold.fencing_token, send, recv, start, end))
    st = lane.stats
    Path(out).write_text(json.dumps({
        "records": records,
        "violations": violations,
        "acquired": st.acquired,
        "released": st.released,
        "unmatched": st.unmatched_releases,
        "lost": lane.leases_lost,
    }))


def test_eight_processes_exclusion_fifo_books_and_no_keys_left(
    redis_server: Any, redis_client: redis.Redis, redis_prefix: str, tmp_path: Path
) -> None:
    ctx = mp.get_context("spawn")
    occ = ctx.Array("i", N_KEYS)
    outs = [str(tmp_path / f"w{i}.json") for i in range(N_PROCS)]
    procs = [
        ctx.Process(target=_stress_worker, args=(redis_server.port, redis_prefix, i, occ, outs[i]))
        for i in range(N_PROCS)
    ]
    t0 = time.monotonic()
    for p in procs:
        p.start()
    for p in procs:
        p.join(120)
    elapsed = time.monotonic() - t0
    assert all(p.exitcode == 0 for p in procs), [p.exitcode for p in procs]
    results = [json.loads(Path(o).read_text()) for o in outs]

    # Mutual exclusion: the occupancy counter outside the lane never saw two holders ...
    assert sum(r["violations"] for r in results) == 0
    by_key: dict[int, list[list[float]]] = {}
    for r in results:
        for k, fence, send, recv, start, end in r["records"]:
            by_key.setdefault(k, []).append([fence, send, recv, start, end])
    overlaps = 0
    fifo_breaks = 0
    for recs in by_key.values():
        recs.sort()
        fences = [x[0] for x in recs]
        assert len(set(fences)) == len(fences)  # one token per grant
        # ... and, in grant (fence) order, each hold started after the previous ended.
        for prev, cur in itertools.pairwise(recs):
            if cur[3] < prev[4]:
                overlaps += 1
        # FIFO: if A arrived surely before B (A's first acquire was answered before B's
        # was sent), A was granted first. In fence order, no later grant may have an
        # arrival answered before an earlier grant's arrival was even sent.
        max_send = float("-inf")
        for _, send, recv, _, _ in recs:
            if max_send > recv:
                fifo_breaks += 1
            max_send = max(max_send, send)
    assert overlaps == 0
    assert fifo_breaks == 0
    # Books balanced.
    total = N_PROCS * N_ACQ
    assert sum(len(v) for v in by_key.values()) == total
    assert sum(r["acquired"] for r in results) == total
    assert sum(r["released"] for r in results) == total
    assert sum(r["unmatched"] for r in results) == 0
    assert sum(r["lost"] for r in results) == 0
    # Nothing leaks: what is left has a TTL, and vanishes once the leases run out.
    left = list(redis_client.scan_iter(match=f"{{lq2:*:{redis_prefix}:*"))
    assert all(redis_client.pttl(k) > 0 for k in left), left
    deadline = time.monotonic() + LEASE_S + 5
    while list(redis_client.scan_iter(match=f"{{lq2:*:{redis_prefix}:*")):
        assert time.monotonic() < deadline, "keys of the lane outlived their TTLs"
        time.sleep(0.1)
    assert elapsed < 60, f"took {elapsed:.1f} s"
    print(f"\n{total} acquisitions by {N_PROCS} processes in {elapsed:.1f} s")


def _holder(port: int, prefix: str, kind: str, lease_s: float, ready: Any) -> None:
    client = redis.Redis(port=port)
    lane: RedisSessionLane | RedisLane
    if kind == "session":
        lane = RedisSessionLane(client, prefix=prefix, lease_s=lease_s)
    else:
        lane = RedisLane(client, "g", max_concurrent=1, prefix=prefix, lease_s=lease_s)
    assert lane.try_acquire("k")
    ready.set()
    while True:  # holds (and renews) until killed
        time.sleep(1)


@pytest.mark.parametrize("kind", ["session", "counting"])
def test_sigkilled_holder_key_goes_to_next_waiter_within_lease_plus_1s(
    redis_server: Any, redis_client: redis.Redis, redis_prefix: str, kind: str
) -> None:
    lease_s = 2.0
    ctx = mp.get_context("spawn")
    ready = ctx.Event()
    proc = ctx.Process(target=_holder, args=(redis_server.port, redis_prefix, kind, lease_s,
                                             ready))
    proc.start()
    try:
        assert ready.wait(30)
        lane: RedisSessionLane | RedisLane
        if kind == "session":
            lane = RedisSessionLane(redis_client, prefix=redis_prefix, lease_s=lease_s)
        else:
            lane = RedisLane(redis_client, "g", max_concurrent=1, prefix=redis_prefix,
                             lease_s=lease_s)
        time.sleep(lease_s)  # the holder has renewed its lease meanwhile: still held
        assert not lane.try_acquire("k")
        box: dict[str, float] = {}

        def wait() -> None:
            if lane.acquire_timeout("k", 20):
                box["granted"] = time.monotonic()

        t = threading.Thread(target=wait)
        t.start()
        if kind == "session":
            deadline = time.monotonic() + 5
            while lane.waiting_for("k") != 1:  # type: ignore[union-attr]
                assert time.monotonic() < deadline
                time.sleep(0.005)
        killed = time.monotonic()
        assert proc.pid is not None
        os.kill(proc.pid, signal.SIGKILL)
        t.join(20)
        assert "granted" in box
        delay = box["granted"] - killed
        print(f"\n{kind}: key granted {delay:.3f} s after SIGKILL (lease {lease_s} s)")
        assert delay <= lease_s + 1.0, delay
        assert lane.manual_release("k")
    finally:
        if proc.is_alive():
            proc.kill()
        proc.join(5)


def _forking_holder(port: int, prefix: str, ready: Any, child_pid: Any) -> None:
    client = redis.Redis(port=port)
    lane = RedisSessionLane(client, prefix=prefix, lease_s=30.0, warn_after_s=None)
    assert lane.try_acquire("k")
    pid = os.fork()  # a worker forked after the grant (as multiprocessing's 'fork' does)
    if pid == 0:
        time.sleep(60)  # unrelated work; it never touches Redis
        os._exit(0)
    child_pid.value = pid
    ready.set()
    while True:  # holds (and renews) until killed
        time.sleep(1)


@pytest.mark.timeout(60)
def test_a_killed_holder_that_forked_a_child_loses_its_keys_in_seconds(
    redis_server: Any, redis_client: redis.Redis, redis_prefix: str
) -> None:
    """The holder forked a child (that never uses Redis) after its grant, then is
    SIGKILLed: its key moves on in seconds (about 3 s), as without the child. The child
    used to keep its copy of the holder's presence socket open, so the server saw the
    holder present until the child ended, and the waiter got the key only once the
    lease ran out (30 s)."""
    ctx = mp.get_context("spawn")
    ready = ctx.Event()
    child_pid = ctx.Value("i", 0)
    proc = ctx.Process(target=_forking_holder,
                       args=(redis_server.port, redis_prefix, ready, child_pid))
    proc.start()
    try:
        assert ready.wait(30)
        lane = RedisSessionLane(redis_client, prefix=redis_prefix, lease_s=30.0,
                                warn_after_s=None)
        assert not lane.try_acquire("k")
        box: dict[str, float] = {}

        def wait() -> None:
            if lane.acquire_timeout("k", 40):
                box["granted"] = time.monotonic()

        t = threading.Thread(target=wait)
        t.start()
        deadline = time.monotonic() + 5
        while lane.waiting_for("k") != 1:
            assert time.monotonic() < deadline
            time.sleep(0.005)
        killed = time.monotonic()
        assert proc.pid is not None
        os.kill(proc.pid, signal.SIGKILL)
        t.join(45)
        assert "granted" in box
        delay = box["granted"] - killed
        print(f"\nkey granted {delay:.3f} s after SIGKILL of a holder with a forked child")
        assert delay <= 8.0, delay
        assert lane.manual_release("k")
    finally:
        if proc.is_alive():
            proc.kill()
        proc.join(5)
        if child_pid.value:
            try:
                os.kill(child_pid.value, signal.SIGKILL)
            except ProcessLookupError:
                pass
