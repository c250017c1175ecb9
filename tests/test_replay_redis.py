"""`lanequeue replay --backend redis://... --workers N`: the trace driven by several worker
processes sharing Redis lanes (the multi-replica gateway), measured from the workers' own
observations. Uses the session's real redis-server (``redis_server`` fixture), never a mock.
"""

from __future__ import annotations

import asyncio
import json
import math
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest
import redis
from redis_server import RedisServer, free_port

from lanequeue.cli import main
from lanequeue.replay import (
    ReplayConfig,
    Trace,
    parse_trace_lines,
    policy_lanes,
    read_trace,
    run_replay,
)
from lanequeue.replay.observe import ArrivalGate, AsyncArrivalGate
from lanequeue.replay.runtimes import ReplayPlan
from lanequeue.replay.runtimes.redis_processes import (
    BackendError,
    RedisProcessRuntime,
    check_backend,
    merge_observations,
    redact_url,
)


def line(ts: int, out: int, conv: int, inp: int = 100) -> str:
    return json.dumps(
        {"timestamp": ts, "input_length": inp, "output_length": out, "hash_ids": [0, conv, 7]}
    )


def make_trace(rows: Sequence[tuple[int, int, int]]) -> Trace:
    """A trace from (timestamp_ms, output_length, conversation) rows."""
    return parse_trace_lines([line(ts, out, conv) for ts, out, conv in rows], source="test")


def run_keys(client: redis.Redis, prefix: str) -> list[bytes]:
    return list(client.scan_iter(match=f"*{prefix}*", count=1000))


def split_conversations(keys: Sequence[str], worker_of: Sequence[int]) -> int:
    seen: dict[str, set[int]] = {}
    for key, wid in zip(keys, worker_of, strict=True):
        seen.setdefault(key, set()).add(wid)
    return sum(1 for s in seen.values() if len(s) >= 2)


# --------------------------------------------------------------------------------------
# The real trace across worker processes


@pytest.mark.timeout(60)
@pytest.mark.parametrize("runtime", [None, "threads"])
def test_trace_across_three_worker_processes(
    redis_server: RedisServer, redis_client: redis.Redis, runtime: str | None
) -> None:
    """Each worker drives its share on asyncio (the default with a backend) or threads."""
    trace = read_trace().head(300)
    config = ReplayConfig(global_cap=8, speed=600, backend=redis_server.url, workers=3,
                          runtime=runtime)
    result = run_replay(trace, config)
    rep, rec = result.report, result.record

    assert rep.requests == 300 and rep.errors == 0
    assert rep.order_violations == 0
    assert rep.max_key_concurrency == 1
    assert 1 <= rep.peak_global <= 8
    assert rep.failed_checks() == []
    assert rep.workers == 3 and rep.backend == redis_server.url
    assert rep.runtime == (runtime or "asyncio")
    assert rep.worker_threads == (0 if runtime is None else rec.threads) and (
        runtime is None or rec.threads > 0)
    assert rep.backend_info["driver"] == rep.runtime
    assert rep.backend_info["worker_cpu_ms_per_request"] > 0
    if runtime is None:
        from lanequeue.replay.runtimes.redis_processes import loop_name

        assert rep.backend_info["event_loop"] == loop_name()
    # Round-robin by request: some conversations really ran in several processes.
    assert rec.worker_of is not None
    assert sorted(set(rec.worker_of)) == [0, 1, 2]
    assert split_conversations(result.plan.keys, rec.worker_of) > 0
    info = rep.backend_info
    assert info["conversations_split_across_workers"] > 0
    assert info["requests_per_worker"] == [100, 100, 100]
    # Every request was observed; the waits are real measurements.
    assert not any(math.isnan(t) for t in rec.start_s)
    assert sorted(rec.start_order) == list(range(300))
    assert rep.makespan_ratio is not None and rep.makespan_ratio > 0
    # Both lanes saw every request, summed over the workers' lane objects.
    assert rep.lane_stats["session"]["acquired"] == 300
    assert rep.lane_stats["global"]["released"] == 300
    # After the run: nothing held or waited, no key without a TTL, the run's keys gone.
    assert rep.registry_final == 0 and rep.registry_peak is None
    assert info["redis_keys_without_ttl"] == 0
    assert info["redis_keys_deleted"] == info["redis_keys_at_end"]
    assert run_keys(redis_client, info["prefix"]) == []


@pytest.mark.timeout(60)
def test_turns_arriving_together_at_different_processes_keep_their_order(
    redis_server: RedisServer,
) -> None:
    # 4 conversations x 12 turns, every turn at the same instant, interleaved: each
    # conversation's turns are dealt to all three workers, which race to Redis. Only the
    # cross-process arrival gate makes "arrival order" well defined here.
    rows = [(0, 20, conv) for _ in range(12) for conv in range(4)]
    trace = make_trace(rows)
    config = ReplayConfig(global_cap=3, speed=1000, backend=redis_server.url, workers=3)
    result = run_replay(trace, config)
    rep = result.report
    assert rep.errors == 0
    assert rep.order_violations == 0
    assert rep.max_key_concurrency == 1
    assert rep.peak_global <= 3
    assert rep.backend_info["conversations_split_across_workers"] == 4
    assert rep.gate_held_back > 0  # the gate had to hold requests back
    # Per conversation, the start order is the arrival order.
    for conv in range(4):
        mine = [rid for rid in result.record.start_order if rid % 4 == conv]
        assert mine == sorted(mine)


@pytest.mark.timeout(60)
def test_global_serial_policy_on_redis(redis_server: RedisServer) -> None:
    trace = make_trace([(t * 2, 10, t % 5) for t in range(40)])
    config = ReplayConfig(
        policy="global-serial", speed=1000, tpot_ms=5, backend=redis_server.url, workers=2
    )
    rep = run_replay(trace, config).report
    assert rep.errors == 0
    assert rep.peak_global == 1
    assert rep.order_violations == 0 and rep.max_key_concurrency == 1
    assert rep.registry_final is None and rep.registry_peak is None
    assert rep.backend_info["redis_keys_without_ttl"] == 0


@pytest.mark.timeout(60)
def test_cli_replay_on_redis_with_two_workers(
    redis_server: RedisServer, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "r.json"
    code = main(
        [
            "replay", "--backend", redis_server.url, "--workers", "2", "--limit", "200",
            "--speed", "1000", "--global", "16", "--json", str(out), "--no-progress",
        ]
    )
    printed = capsys.readouterr().out
    assert code == 0, printed
    data = json.loads(out.read_text())
    assert data["requests"] == 200
    assert data["order_violations"] == 0
    assert data["max_key_concurrency"] == 1
    assert data["peak_global"] <= 16
    assert data["workers"] == 2
    assert data["backend"] == redis_server.url
    assert data["backend_info"]["conversations_split_across_workers"] > 0
    assert data["registry_final"] == 0
    assert "2 worker processes" in printed and "checks passed" in printed


# --------------------------------------------------------------------------------------
# Errors


def test_cli_backend_errors(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["replay", "--workers", "2"]) == 2
    assert "argument --workers: workers > 1 needs a shared backend" in capsys.readouterr().err

    assert main(["replay", "--backend", "redis://127.0.0.1:1/0", "--workers", "0"]) == 2
    assert "workers must be an integer from 1 to 1,024, got 0" in capsys.readouterr().err

    assert main(["replay", "--backend", "http://127.0.0.1:6379/0"]) == 2
    assert "bad backend URL" in capsys.readouterr().err
    # Refused before the trace is read.
    assert main(["replay", "/nonexistent/t.jsonl", "--backend", "http://127.0.0.1:1/0"]) == 2
    assert "argument --backend: bad backend URL" in capsys.readouterr().err

    assert main(["replay", "--backend", "redis://127.0.0.1:6379/notadb"]) == 2
    assert "bad backend URL" in capsys.readouterr().err

    port = free_port()  # nothing listens there
    assert main(["replay", "--backend", f"redis://:hunter2@127.0.0.1:{port}/0"]) == 2
    err = capsys.readouterr().err
    assert f"cannot reach Redis at redis://127.0.0.1:{port}/0" in err
    assert "hunter2" not in err


def test_a_runtime_that_is_no_worker_driver_with_a_backend_is_a_clear_error(
    monkeypatch: pytest.MonkeyPatch
) -> None:
    """A runtime the worker processes cannot run (any beyond asyncio and threads) is
    refused with a backend, naming the ones they can; it is accepted in process."""
    from lanequeue.replay import runtimes

    monkeypatch.setitem(runtimes.RUNTIMES, "other", runtimes.RUNTIMES["threads"])
    assert ReplayConfig(runtime="other").runtime == "other"
    with pytest.raises(ValueError, match="runtime 'other' cannot run on a backend: each "
                       "worker process of the Redis backend runs asyncio or threads"):
        ReplayConfig(backend="redis://127.0.0.1:6379/0", runtime="other")
    assert ReplayConfig(backend="redis://127.0.0.1:6379/0").runtime == "asyncio"
    assert ReplayConfig(backend="redis://127.0.0.1:6379/0", runtime="threads").runtime == (
        "threads")


def test_config_and_runtime_validation() -> None:
    with pytest.raises(ValueError, match="workers > 1 needs a shared backend"):
        ReplayConfig(workers=2)
    with pytest.raises(ValueError, match="workers must be an integer from 1 to 1,024"):
        ReplayConfig(backend="redis://127.0.0.1:6379/0", workers=0)
    with pytest.raises(ValueError, match="workers must be an integer from 1 to 1,024"):
        RedisProcessRuntime("redis://127.0.0.1:6379/0", 0)
    with pytest.raises(ValueError, match="driver must be one of asyncio, threads, got 'trio'"):
        RedisProcessRuntime("redis://127.0.0.1:6379/0", 1, driver="trio")
    with pytest.raises(BackendError, match="cannot reach Redis"):
        check_backend(f"redis://127.0.0.1:{free_port()}/0")


def test_redact_url() -> None:
    assert redact_url("redis://u:pw@h:1/0") == "redis://u@h:1/0"
    assert redact_url("redis://:pw@h:1/0") == "redis://h:1/0"
    assert redact_url("redis://h/0?password=pw&db=1") == "redis://h/0?db=1"
    assert redact_url("unix:///tmp/r.sock?db=2") == "unix:///tmp/r.sock?db=2"


# --------------------------------------------------------------------------------------
# The parent's merge: figures from the workers' intervals, not from the lanes


def test_merge_measures_overlap_and_order_from_worker_intervals() -> None:
    plan = ReplayPlan(
        arrival_s=[0.0, 0.0, 0.0, 0.0],
        work_s=[1.0] * 4,
        keys=["a", "a", "b", "a"],
        lanes=policy_lanes("session", 2),
    )

    def payload(rids: list[int], starts: list[float], ends: list[float]) -> dict[str, Any]:
        return {
            "rids": rids,
            "dispatch_s": [0.0] * len(rids),
            "start_s": starts,
            "end_s": ends,
            "complete_s": ends,
            "errors": [],
            "held_back": 1,
            "threads": len(rids),
            "lane_stats": {"session": {"acquired": len(rids)}},
        }

    # Worker 0 ran requests 0 and 2, worker 1 requests 1 and 3. Requests 0 and 1 (key a)
    # overlap across the two processes; request 3 started before request 1.
    rec = merge_observations(
        plan,
        [payload([0, 2], [0.0, 0.5], [1.0, 1.5]), payload([1, 3], [0.9, 0.2], [2.0, 0.8])],
        2,
    )
    assert rec.max_key_concurrency == 2
    assert rec.peak_global == 3  # 0, 3 and 2 all working at 0.5
    assert rec.start_order == [0, 3, 2, 1]
    assert rec.worker_of == [0, 1, 0, 1]
    assert rec.held_back == 2 and rec.threads == 4
    assert rec.lane_stats == {"session": {"acquired": 4}}
    assert rec.wall_s == 2.0
    # An end at t closes before a start at t: back-to-back is not overlap.
    rec = merge_observations(plan, [payload([0, 1], [0.0, 1.0], [1.0, 2.0]),
                                    payload([2, 3], [5.0, 2.0], [6.0, 3.0])], 2)
    assert rec.max_key_concurrency == 1 and rec.peak_global == 1


def test_gate_counts_only_requests_with_a_successor() -> None:
    finished: list[object] = []

    class Counter:
        def done(self, slot: object) -> int:
            return finished.count(slot)

        def finish(self, slot: object) -> None:
            finished.append(slot)

    gate = ArrivalGate(["a", "b", "a"], lambda slot: 0, counter=Counter())
    gate.wait_turn(0)
    gate.finished(0)
    gate.wait_turn(1)
    gate.finished(1)
    gate.wait_turn(2)  # its only predecessor has finished: no wait although none is inside
    gate.finished(2)
    assert finished == ["a"]  # b and the last a have no successor to count them
    assert gate.held_back == 0


@pytest.mark.timeout(20)
def test_gate_with_one_poller_lets_a_burst_in_in_order_polling_once_at_a_time() -> None:
    n = 30
    lock = threading.Lock()
    entered: list[int] = []
    calls = [0]

    def inside(slot: object) -> int:
        with lock:
            calls[0] += 1
        time.sleep(0.0005)  # a round trip
        with lock:
            return len(entered)

    gate = ArrivalGate(["a"] * n, inside, poll_s=0.001, one_poller=True, max_wait_s=10)

    def request(rid: int) -> None:
        gate.wait_turn(rid)
        with lock:
            entered.append(rid)  # joins the lane right after passing the gate

    # Threads started in reverse arrival order: the gate must still let them in in order.
    threads = [threading.Thread(target=request, args=(rid,)) for rid in reversed(range(n))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(10)
    assert entered == list(range(n))
    assert calls[0] <= 4 * n  # about one or two polls per request, not one per waiter
    assert gate.held_back >= 1


@pytest.mark.timeout(60)
def test_a_worker_that_dies_stops_the_run_with_a_clear_error(
    redis_server: RedisServer, redis_client: redis.Redis
) -> None:
    import multiprocessing
    import os
    import signal

    # 10 s of arrivals: the run is still going when worker 1 is killed.
    trace = make_trace([(t * 100, 10, t % 9) for t in range(100)])
    config = ReplayConfig(speed=1, tpot_ms=1, backend=redis_server.url, workers=2)
    box: dict[str, BaseException | None] = {}

    def run() -> None:
        try:
            run_replay(trace, config)
            box["exc"] = None
        except BaseException as exc:
            box["exc"] = exc

    t = threading.Thread(target=run, daemon=True)
    t.start()
    victim = None
    deadline = time.monotonic() + 20
    while victim is None and time.monotonic() < deadline:
        for child in multiprocessing.active_children():
            if child.name == "lanequeue-replay-worker-1":
                victim = child
        time.sleep(0.05)
    assert victim is not None and victim.pid is not None
    time.sleep(1.5)  # well into the run
    os.kill(victim.pid, signal.SIGKILL)
    t0 = time.monotonic()
    t.join(15)
    assert not t.is_alive()
    assert time.monotonic() - t0 < 5
    exc = box["exc"]
    assert isinstance(exc, BackendError)
    assert "worker 1 died" in str(exc)
    assert not [c for c in multiprocessing.active_children() if c.name.startswith("lanequeue")]
    # The run's keys were deleted on the way out (all of them had a TTL anyway).
    assert run_keys(redis_client, "lanequeue-replay:") == []


# -- the asyncio arrival gate (AsyncArrivalGate) ------------------------------------------


class _AsyncCounter:
    """An in-memory AsyncCompletionCounter (what the Redis one does, without Redis)."""

    def __init__(self) -> None:
        self.finished: list[object] = []

    async def done(self, slot: object) -> int:
        await asyncio.sleep(0)  # a round trip
        return self.finished.count(slot)

    async def finish(self, slot: object) -> None:
        await asyncio.sleep(0)
        self.finished.append(slot)


@pytest.mark.timeout(20)
def test_async_gate_lets_a_burst_in_in_order_with_one_poller_at_a_time() -> None:
    """30 requests of one slot reach the gate at once; each joins the lane only after a
    round trip of its own (as a Redis acquire does). They pass in arrival order, none
    before every unfinished predecessor is inside, and only one polls at a time."""
    n = 30
    entered: list[int] = []
    polling = [0]
    most = [0]

    async def inside(slot: object) -> int:
        polling[0] += 1
        most[0] = max(most[0], polling[0])
        await asyncio.sleep(0.0005)  # a round trip
        polling[0] -= 1
        return len(entered)

    async def main() -> None:
        gate = AsyncArrivalGate(["a"] * n, inside, counter=_AsyncCounter(), poll_s=0.001,
                                max_wait_s=10)

        async def request(rid: int) -> None:
            await gate.wait_turn(rid)
            assert len(entered) == rid  # every predecessor is inside already
            await asyncio.sleep(0.001)  # the acquire script's round trip
            entered.append(rid)

        await asyncio.gather(*(request(rid) for rid in range(n)))
        # Most are held back (how many depends on how late the loop runs their polls).
        assert 1 <= gate.held_back <= n - 1

    asyncio.run(main())
    assert entered == list(range(n))
    assert most[0] == 1


@pytest.mark.timeout(20)
def test_async_gate_counts_finished_predecessors_and_gives_up_after_max_wait() -> None:
    """A predecessor that has finished lets its successor in although nobody is inside;
    the last request of a slot is not counted; a predecessor that never enters makes its
    successor (and the one waiting behind it) fail after max_wait_s."""
    counter = _AsyncCounter()

    async def nobody(slot: object) -> int:
        return 0

    async def main() -> None:
        gate = AsyncArrivalGate(["a", "b", "a"], nobody, counter=counter, max_wait_s=5)
        for rid in range(3):
            await gate.wait_turn(rid)
            await gate.finished(rid)
        assert counter.finished == ["a"] and gate.held_back == 0

        stuck = AsyncArrivalGate(["c"] * 3, nobody, counter=_AsyncCounter(), poll_s=0.005,
                                 max_wait_s=0.1)
        t0 = time.monotonic()
        results = await asyncio.gather(stuck.wait_turn(1), stuck.wait_turn(2),
                                       return_exceptions=True)
        assert [type(r) for r in results] == [TimeoutError, TimeoutError]
        assert "request 1 waited over 0.1 s" in str(results[0])
        assert time.monotonic() - t0 < 2.0

    asyncio.run(main())


def test_run_loop_uses_uvloop_when_installed_else_asyncio(
    monkeypatch: pytest.MonkeyPatch
) -> None:
    """The asyncio workers' event loop: uvloop's when it can be imported (the ``fast``
    extra, installed with the test extra where uvloop builds), else asyncio's own."""
    from lanequeue.replay.runtimes import redis_processes as rp

    async def loop_module() -> str:
        return type(asyncio.get_running_loop()).__module__

    try:
        import uvloop  # noqa: F401

        assert rp.loop_name() == "uvloop"
        assert rp.run_loop(loop_module()).startswith("uvloop")
    except ImportError:
        assert rp.loop_name() == "asyncio"

    def missing(name: str) -> object:
        raise ImportError(name)

    monkeypatch.setattr(rp.importlib, "import_module", missing)
    assert rp.loop_name() == "asyncio"
    assert rp.run_loop(loop_module()).startswith("asyncio")


def test_async_completion_counters_never_take_the_whole_pool(redis_server: RedisServer) -> None:
    """A backlog of tasks all reading and bumping completion counters at once (500 here)
    on a client whose pool holds 20 connections: at most COUNTER_CALLS calls are in
    flight, so none fails with MaxConnectionsError and the pool keeps room for the lanes'
    own calls."""
    import redis.asyncio

    from lanequeue.replay.runtimes.redis_processes import (
        COUNTER_CALLS,
        AsyncRedisCompletionCounter,
    )

    assert COUNTER_CALLS < 20

    async def main() -> list[int]:
        client = redis.asyncio.Redis(
            host=redis_server.host, port=redis_server.port, max_connections=20
        )
        try:
            counter = AsyncRedisCompletionCounter(client, "cnt-" + str(time.time_ns()),
                                                  ttl_s=60)
            await asyncio.gather(*(counter.finish(i % 5) for i in range(500)))
            return list(await asyncio.gather(*(counter.done(i) for i in range(5))))
        finally:
            await client.aclose()

    assert asyncio.run(main()) == [100] * 5
