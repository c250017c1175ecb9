"""The Redis section of ``benchmarks/run.py``: our :class:`lanequeue.redis.RedisSessionLane`
against redis-py's own ``redis.lock.Lock``, on a private redis-server started for the run.

1. Uncontended: one client, one key, nobody else; acquire + release per second for
   ``with lane.acquire(key): pass`` and ``with client.lock(key, timeout=30,
   blocking_timeout=10): pass``, in interleaved rounds (:func:`bench_common.interleave`),
   medians, and the median of the per-round throughput ratios ours / redis-py (goal >= 1).
   A one-round-trip ``PING`` runs in the same rounds, for scale. Then, outside the timed
   rounds, a short diagnostic run of each candidate through a client that counts the
   commands it sends, with ``INFO commandstats`` reset before and read after: round trips
   per operation and server time per operation (script time included).
2. Fairness: N processes (32; 8 with ``--quick``), each with its own client and lock
   object, loop on ONE key for a window (10 s; 3 s with ``--quick``): ours with
   ``with lane.acquire(key): pass``, then redis-py's Lock with its default polling sleep
   (0.1 s). All processes start at one shared instant after a start barrier (every worker
   ready, then the parent sets the instant and lets them go) and stop at one
   shared deadline; a grant counts if it came before the deadline. Figures: total grants,
   grants/s, min and max grants per process, min/max (goal for ours >= 0.5).

3. Hot key: 16 processes on one key for 3 s (ours, redis-py's Lock, python-redis-lock's
   Lock): grants/s, fairness, the share of grants to the previous holder's process,
   round trips per grant, CPU per grant (clients + server), hand-off latency p50/p99;
   then the same at 2, 4 and 8 processes (ours and redis-py's Lock, 1.5 s each).

The server is our own: ``redis-server`` on 127.0.0.1, a free port, no persistence
(``--save '' --appendonly no``), in a temporary directory, stopped at the end (also on
error). Without ``redis-server`` (override with the environment variable
``REDIS_SERVER``) or without redis-py, the section prints a row saying so and skips.

The worker processes are started (``fork`` where available) before this process makes any
lane, so they inherit no renewer thread; both fairness runs use the same workers, and the
uncontended rounds run after they are gone.
"""

from __future__ import annotations

import itertools
import multiprocessing as mp
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bench_common import Config, Row, interleave, median, per_round_ratio, spread

from lanequeue import build_gateway_session_key

__all__ = ["redis_sizes", "section_redis"]

SEC = "redis"
UNCONTENDED_GOAL = 1.0  # ours / redis-py Lock, acquire+release per second: >= 1
FAIRNESS_GOAL = 0.5  # ours: min / max grants per process: >= 0.5

REDIS_SERVER = os.environ.get("REDIS_SERVER", "redis-server")
PREFIX = "lqbench"

# The same realistic session key as the other sections.
KEY = build_gateway_session_key("slack", "C12345", "U789", thread_id="1234567890.123456")
LOCK_KEY = "redispy-lock:" + KEY  # redis-py's Lock uses the name as the Redis key


# -- the private server ----------------------------------------------------------------------


def _find_server() -> str | None:
    found = shutil.which(REDIS_SERVER)
    if found:
        return found
    if os.path.isfile(REDIS_SERVER) and os.access(REDIS_SERVER, os.X_OK):
        return REDIS_SERVER
    return None


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _ping(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.5) as s:
            s.sendall(b"PING\r\n")
            return s.recv(16).startswith(b"+PONG")
    except OSError:
        return False


class _Server:
    """One redis-server on 127.0.0.1, a free port, no persistence, in a temp dir."""

    host = "127.0.0.1"

    def __init__(self, binary: str) -> None:
        self.binary = binary
        self.tmp = tempfile.TemporaryDirectory(prefix="lanequeue-bench-redis-")
        self.dir = Path(self.tmp.name)
        self.port = 0
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self, timeout: float = 10.0) -> None:
        last = ""
        for _ in range(3):  # the free port may be taken between our check and the bind
            self.port = _free_port()
            log_path = self.dir / f"redis-{self.port}.log"
            with open(log_path, "ab") as log:
                self.proc = subprocess.Popen(
                    [self.binary, "--port", str(self.port), "--bind", self.host,
                     "--save", "", "--appendonly", "no", "--dir", str(self.dir),
                     "--protected-mode", "no", "--maxclients", "1000"],
                    stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                    cwd=self.dir,
                )
            deadline = time.monotonic() + timeout
            while self.proc.poll() is None and time.monotonic() < deadline:
                if _ping(self.port):
                    return
                time.sleep(0.02)
            last = log_path.read_text(errors="replace")[-1000:]
            self.stop()
        raise RuntimeError(f"redis-server did not start:\n{last}")

    def stop(self) -> None:
        proc, self.proc = self.proc, None
        if proc is None:
            return
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)  # no persistence: exits at once
            try:
                proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=5)

    def close(self) -> None:
        try:
            self.stop()
        finally:
            self.tmp.cleanup()


# -- 2. fairness: N processes on one key -----------------------------------------------------

PHASES = ("ours", "redispy")


def _worker(idx: int, host: str, port: int, window_s: float, ready: list[Any],
            go: list[Any], start: Any, grants: list[Any], errors: Any) -> None:
    """One contending process: its own client and lock objects. For each phase: report
    ready, wait for the parent's go (the start barrier), start at the shared instant,
    count grants until the shared deadline."""
    import redis
    from redis.exceptions import LockError

    from lanequeue import LaneTimeoutError
    from lanequeue.redis import RedisSessionLane

    client = redis.Redis(host=host, port=port, socket_connect_timeout=5)
    try:
        lane = RedisSessionLane(client, "bench", prefix=PREFIX, lease_s=30, timeout_s=30)
        client.ping()
        for p, phase in enumerate(PHASES):
            with ready[p].get_lock():
                ready[p].value += 1
            if not go[p].wait(timeout=120) or start[p] <= 0:
                return  # the parent gave up (another worker failed)
            t0 = start[p]
            deadline = t0 + window_s
            time.sleep(max(0.0, t0 - time.monotonic()))
            n = 0
            if phase == "ours":
                while True:
                    left = deadline - time.monotonic()
                    if left <= 0:
                        break
                    try:
                        with lane.acquire(KEY, timeout_s=left):
                            if time.monotonic() <= deadline:
                                n += 1
                    except LaneTimeoutError:
                        break
            else:
                while True:
                    left = deadline - time.monotonic()
                    if left <= 0:
                        break
                    try:
                        # redis-py's default polling sleep (0.1 s); give up at the deadline.
                        with client.lock(LOCK_KEY, timeout=30, blocking_timeout=left):
                            if time.monotonic() <= deadline:
                                n += 1
                    except LockError:
                        continue  # blocking_timeout ran out: the loop checks the deadline
            grants[p][idx] = n
    except BaseException:
        with errors.get_lock():
            errors.value += 1
        traceback.print_exc()
    finally:
        client.close()


def _all_ready(ready: Any, n: int, procs: list[Any], timeout: float) -> bool:
    """The parent's side of the start barrier: True once ``n`` workers are ready; False
    as soon as one has exited (crashed) or after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while ready.value < n:
        if any(p.exitcode is not None for p in procs) or time.monotonic() > deadline:
            return False
        time.sleep(0.01)
    return True


def _fairness(host: str, port: int, nprocs: int, window_s: float) -> dict[str, Any]:
    """Run both fairness phases on one pool of worker processes; per-process grants."""
    methods = mp.get_all_start_methods()
    ctx = mp.get_context("fork" if "fork" in methods else "spawn")
    ready = [ctx.Value("i", 0) for _ in PHASES]
    go = [ctx.Event() for _ in PHASES]
    start = ctx.Array("d", len(PHASES), lock=False)  # shared start instants (monotonic)
    grants = [ctx.Array("q", nprocs, lock=False) for _ in PHASES]
    for g in grants:
        for i in range(nprocs):
            g[i] = -1  # -1: this process reported nothing (crashed, stuck)
    errors = ctx.Value("i", 0)
    procs = [
        ctx.Process(target=_worker, name=f"lanequeue-bench-redis-{i}",
                    args=(i, host, port, window_s, ready, go, start, grants, errors),
                    daemon=True)
        for i in range(nprocs)
    ]
    out: dict[str, Any] = {"start_method": ctx.get_start_method()}
    try:
        t_spawn = time.perf_counter()
        for p in procs:
            p.start()
        for i, phase in enumerate(PHASES):
            # Phase 0: every worker is connected; phase 1: every worker is done with 0.
            if not _all_ready(ready[i], nprocs, procs, 60 if i == 0 else window_s + 30):
                out["aborted_before"] = phase
                for ev in go:  # the workers waiting to start see start <= 0 and return
                    ev.set()
                break
            if i == 0:
                out["setup_s"] = time.perf_counter() - t_spawn
            start[i] = time.monotonic() + 0.2  # a shared instant a little ahead
            go[i].set()
            time.sleep(0.2 + window_s)
        # Waiters of the last phase stop at the deadline; the last grants finish soon after.
        t_end = time.monotonic() + 15
        for p in procs:
            p.join(timeout=max(0.1, t_end - time.monotonic()))
        out["stragglers"] = sum(p.is_alive() for p in procs)
    finally:
        for ev in go:  # frees any worker still waiting to start (start <= 0: it returns)
            ev.set()
        for p in procs:
            p.join(timeout=0.5)
        for p in procs:
            if p.is_alive():
                p.terminate()
        for p in procs:
            p.join(timeout=2)
            if p.is_alive():
                p.kill()
                p.join(timeout=2)
    out["errors"] = errors.value
    out["died"] = sum(p.exitcode not in (0, None) for p in procs)
    out["grants"] = {phase: list(grants[i]) for i, phase in enumerate(PHASES)}
    return out


# -- 3. hot key: 16 processes on one key, hand-off latency and commands per grant ----------

HOT_PHASES = ("ours", "redispy", "prl")
HOT_LABELS = {"ours": "ours  RedisSessionLane", "redispy": "redis-py  Lock",
              "prl": "python-redis-lock  Lock"}


def _hot_worker(idx: int, host: str, port: int, window_s: float, ready: list[Any],
                go: list[Any], start: Any, out_dir: str, errors: Any,
                phases: tuple[str, ...] = HOT_PHASES) -> None:
    """One process on the hot key: for each phase, loop acquire/release until the shared
    deadline, stamping each grant (time granted, time its release began), and measuring
    the CPU time this process used over the window (every thread of it: the caller, the
    wake-up listener, the renewer)."""
    import json

    import redis
    from redis.exceptions import LockError

    from lanequeue import LaneTimeoutError
    from lanequeue.redis import RedisSessionLane

    try:
        import redis_lock
    except ImportError:
        redis_lock = None
    client = redis.Redis(host=host, port=port, socket_connect_timeout=5)
    try:
        lane = RedisSessionLane(client, "hot", prefix=PREFIX, lease_s=30, timeout_s=30)
        client.ping()
        # Warm up on a key of our own (untimed): connections, scripts, the lane's
        # first-use checks, its presence and wake-up connections; redis-py's Lock too.
        with lane.acquire(f"{KEY}:warm:{idx}"):
            pass
        with client.lock(f"{LOCK_KEY}:warm:{idx}", timeout=30, blocking_timeout=10):
            pass
        for p, phase in enumerate(phases):
            with ready[p].get_lock():
                ready[p].value += 1
            if not go[p].wait(timeout=120) or start[p] <= 0:
                return
            deadline = start[p] + window_s
            time.sleep(max(0.0, start[p] - time.monotonic()))
            cpu0 = time.process_time()
            stamps: list[tuple[float, float]] = []
            while True:
                left = deadline - time.monotonic()
                if left <= 0 or (phase == "prl" and redis_lock is None):
                    break
                try:
                    if phase == "ours":
                        with lane.acquire(KEY, timeout_s=left):
                            t_g = time.monotonic()
                            t_r = time.monotonic()
                    elif phase == "redispy":
                        with client.lock(LOCK_KEY, timeout=30, blocking_timeout=left):
                            t_g = time.monotonic()
                            t_r = time.monotonic()
                    else:
                        lk = redis_lock.Lock(client, "prl:" + KEY, expire=30)
                        if not lk.acquire(blocking=True, timeout=max(0.001, left)):
                            continue
                        t_g = time.monotonic()
                        t_r = time.monotonic()
                        lk.release()
                except (LaneTimeoutError, LockError):
                    continue
                if t_g <= deadline:
                    stamps.append((t_g, t_r))
            cpu = time.process_time() - cpu0
            Path(out_dir, f"{phase}-{idx}.json").write_text(
                json.dumps({"stamps": stamps, "cpu_s": cpu}))
    except BaseException:
        with errors.get_lock():
            errors.value += 1
        traceback.print_exc()
    finally:
        client.close()


_OWN_COMMANDS = ("ping", "subscribe", "client|id", "config|resetstat", "info")
#: The commands each candidate's clients send (one round trip each); every other command
#: in INFO commandstats ran inside a script.
_SENT = {"ours": ("evalsha", "eval"), "redispy": ("set", "evalsha", "eval"),
         "prl": ("set", "blpop", "evalsha", "eval")}


def _server_cpu(admin: Any) -> float:
    """CPU seconds the server has used so far (user + system, all its threads)."""
    cpu = admin.info("cpu")
    return float(cpu["used_cpu_user"]) + float(cpu["used_cpu_sys"])


def _hot_key(host: str, port: int, nprocs: int, window_s: float,
             phases: tuple[str, ...] = HOT_PHASES) -> dict[str, Any]:
    """Run the hot-key ``phases`` on one pool of workers; per phase: grants per
    process, hand-off latencies (a release begun -> the next grant, any process), the
    commands the server ran per grant (INFO commandstats delta over the window), and the
    CPU time of the clients (the workers' own measure) and of the server (INFO cpu) over
    the window."""
    import json

    import redis

    methods = mp.get_all_start_methods()
    ctx = mp.get_context("fork" if "fork" in methods else "spawn")
    ready = [ctx.Value("i", 0) for _ in phases]
    go = [ctx.Event() for _ in phases]
    start = ctx.Array("d", len(phases), lock=False)
    errors = ctx.Value("i", 0)
    admin = redis.Redis(host=host, port=port)
    out: dict[str, Any] = {"phases": {}}
    with tempfile.TemporaryDirectory(prefix="lanequeue-bench-hot-") as out_dir:
        procs = [ctx.Process(target=_hot_worker, name=f"lanequeue-bench-hot-{i}",
                             args=(i, host, port, window_s, ready, go, start, out_dir,
                                   errors, phases), daemon=True) for i in range(nprocs)]
        try:
            for p in procs:
                p.start()
            # PING round trip, for scale (median of 200, from this process).
            rtts = []
            for _ in range(200):
                t = time.perf_counter()
                admin.ping()
                rtts.append(time.perf_counter() - t)
            out["ping_rtt_s"] = median(rtts)
            for i, phase in enumerate(phases):
                if not _all_ready(ready[i], nprocs, procs, 60 if i == 0 else window_s + 30):
                    out["aborted_before"] = phase
                    break
                admin.config_resetstat()
                start[i] = time.monotonic() + 0.2
                go[i].set()
                time.sleep(max(0.0, start[i] - time.monotonic()))
                cpu0 = _server_cpu(admin)
                time.sleep(window_s)
                server_cpu = _server_cpu(admin) - cpu0
                stats = admin.info("commandstats")
                out["phases"][phase] = {"commands": {
                    k.removeprefix("cmdstat_"): int(v["calls"]) for k, v in stats.items()
                }, "server_cpu_s": server_cpu}
            for p in procs:
                p.join(timeout=20)
        finally:
            for ev in go:
                ev.set()
            for p in procs:
                p.join(timeout=0.5)
                if p.is_alive():
                    p.kill()
                    p.join(timeout=2)
            admin.close()
        for phase, got in out["phases"].items():
            per: list[int] = []
            stamps: list[tuple[float, float]] = []
            client_cpu = 0.0
            for i in range(nprocs):
                f = Path(out_dir, f"{phase}-{i}.json")
                mine = json.loads(f.read_text()) if f.exists() else None
                per.append(-1 if mine is None else len(mine["stamps"]))
                if mine is not None:
                    stamps.extend((g, r, i) for g, r in mine["stamps"])
                    client_cpu += mine["cpu_s"]
            stamps.sort()
            got["per_process"] = per
            got["client_cpu_s"] = client_cpu
            got["handoff_s"] = [b[0] - a[1] for a, b in itertools.pairwise(stamps)
                                if b[0] >= a[1]]
            # Grants that went to the process that held just before (barging: the
            # releaser taking it straight back), as a share of all hand-offs.
            pairs = list(itertools.pairwise(stamps))
            got["same_process"] = (sum(a[2] == b[2] for a, b in pairs) / len(pairs)
                                   if pairs else float("nan"))
    out["errors"] = errors.value
    return out


def _pct(xs: list[float], q: float) -> float:
    ys = sorted(xs)
    return ys[min(len(ys) - 1, int(q * len(ys)))] if ys else float("nan")


def _hot_rows(hot: dict[str, Any], nprocs: int, window_s: float) -> list[Row]:
    rows: list[Row] = []
    rtt = hot.get("ping_rtt_s", float("nan"))
    rows.append(Row(SEC, f"hot key: {nprocs} processes on one key, {window_s:g} s each",
                    None, "", f"PING round trip {rtt * 1e6:.0f} us (median); "
                    f"{hot['errors']} worker errors"
                    + (f", stopped before {hot['aborted_before']}"
                       if "aborted_before" in hot else "")))
    rates: dict[str, float] = {}
    for phase in HOT_PHASES:
        got = hot["phases"].get(phase)
        if got is None:
            continue
        per = [c for c in got["per_process"] if c >= 0]
        total = sum(per)
        if phase == "prl" and total == 0:
            rows.append(Row(SEC, f"{HOT_LABELS[phase]}: not run", None, "",
                            "pip install python-redis-lock (the bench extra)"))
            continue
        rates[phase] = total / window_s
        cmds = {k: v for k, v in got["commands"].items() if k not in _OWN_COMMANDS}
        sent = {k: v for k, v in cmds.items() if k in _SENT[phase]}
        per_grant = sum(sent.values()) / total if total else float("nan")
        inner = (sum(cmds.values()) - sum(sent.values())) / total if total else float("nan")
        top = " + ".join(f"{v / total:.2f} {k.upper()}" for k, v in
                         sorted(sent.items(), key=lambda kv: -kv[1])) if total else ""
        lo, hi = (min(per), max(per)) if per else (0, 0)
        ho = got["handoff_s"]
        p50, p99 = _pct(ho, 0.5), _pct(ho, 0.99)
        rows.append(Row(SEC, f"{HOT_LABELS[phase]}  grants/s", total / window_s, "grants/s",
                        f"min/max per process {lo}/{hi} = {lo / hi if hi else 0:.2f}; "
                        f"{got['same_process'] * 100:.0f}% of grants to the previous "
                        f"holder's process; "
                        f"{per_grant:.2f} round trips per grant ({top}), {inner:.1f} "
                        f"calls in scripts (INFO commandstats over the window)",
                        data={"per_process": got["per_process"], "commands": got["commands"]}))
        if total:
            c_us, s_us = (got["client_cpu_s"] / total * 1e6, got["server_cpu_s"] / total * 1e6)
            rows.append(Row(SEC, f"{HOT_LABELS[phase]}  CPU per grant", c_us + s_us, "us",
                            f"clients {c_us:.0f} us (every thread of the {nprocs} processes) "
                            f"+ server {s_us:.0f} us (INFO cpu); at 100% of "
                            f"{os.cpu_count()} cores that is at most "
                            f"{(os.cpu_count() or 1) / (c_us + s_us) * 1e6:,.0f} grants/s"))
        rows.append(Row(SEC, f"{HOT_LABELS[phase]}  hand-off p50/p99", p50 * 1e6, "us",
                        f"p99 {p99 * 1e6:.0f} us; p50 = {p50 / rtt:.1f} PING round trips "
                        f"(release begun -> next grant, any process)"))
    if "ours" in rates and "redispy" in rates and rates["redispy"]:
        r = rates["ours"] / rates["redispy"]
        rows.append(Row(SEC, "hot key ratio ours/redis-py Lock  grants/s", r, "x",
                        "one run, same workers and server; ours is FIFO (every grant "
                        "wakes another process), redis-py's Lock barges (see the share "
                        "of grants to the previous holder's process)", goal=">= 1",
                        status="PASS" if r >= 1 else "MISS"))
    return rows


#: Process counts of the hot-key scaling rows, and their window (seconds).
HOT_SCALING = (2, 4, 8)
HOT_SCALING_S = 1.5


def _hot_scaling_rows(host: str, port: int) -> list[Row]:
    """The hot key at 2, 4 and 8 processes (ours and redis-py's Lock, short windows):
    grants/s, their ratio, fairness and CPU per grant of each, to show where the gap
    of the 16-process row comes from (a machine with few cores runs out of CPU)."""
    rows: list[Row] = []
    for n in HOT_SCALING:
        hot = _hot_key(host, port, n, HOT_SCALING_S, phases=("ours", "redispy"))
        figs: dict[str, tuple[float, float, float, float]] = {}
        for phase in ("ours", "redispy"):
            got = hot["phases"].get(phase)
            if got is None:
                continue
            per = [c for c in got["per_process"] if c >= 0]
            total = sum(per)
            if not total:
                continue
            fair = min(per) / max(per)
            cpu = (got["client_cpu_s"] + got["server_cpu_s"]) / total * 1e6
            figs[phase] = (total / HOT_SCALING_S, fair, cpu, got["same_process"])
        if len(figs) < 2:
            rows.append(Row(SEC, f"hot key, {n} processes: not measured", None, "",
                            f"{hot['errors']} worker errors", status="ERROR"))
            continue
        (o_r, o_f, o_c, o_s), (p_r, p_f, p_c, p_s) = figs["ours"], figs["redispy"]
        rows.append(Row(
            SEC, f"hot key, {n} processes: ours/redis-py grants/s", o_r / p_r, "x",
            f"ours {o_r:,.0f}/s min/max {o_f:.2f}, CPU {o_c:.0f} us/grant, {o_s * 100:.0f}% "
            f"to the same process; redis-py {p_r:,.0f}/s min/max {p_f:.2f}, CPU "
            f"{p_c:.0f} us/grant, {p_s * 100:.0f}% to the same process; "
            f"{HOT_SCALING_S:g} s each",
            data={"ours": figs["ours"], "redispy": figs["redispy"]}))
    return rows


# -- 1. uncontended ----------------------------------------------------------------------------


def _loop_ours(lane: Any) -> Callable[[int], None]:
    def run(n: int) -> None:
        for _ in range(n):
            with lane.acquire(KEY):
                pass

    return run


def _loop_redispy(client: Any) -> Callable[[int], None]:
    def run(n: int) -> None:
        for _ in range(n):
            with client.lock(LOCK_KEY, timeout=30, blocking_timeout=10):
                pass

    return run


def _loop_ping(client: Any) -> Callable[[int], None]:
    def run(n: int) -> None:
        for _ in range(n):
            client.ping()

    return run


def _counting_client_class(redis: Any) -> Any:
    class CountingRedis(redis.Redis):  # type: ignore[misc, name-defined]
        """Counts the commands it sends (one round trip each: no pipelines here)."""

        def __init__(self, *a: Any, **kw: Any) -> None:
            super().__init__(*a, **kw)
            self.sent: dict[str, int] = {}

        def execute_command(self, *args: Any, **options: Any) -> Any:
            name = str(args[0]).lower()
            self.sent[name] = self.sent.get(name, 0) + 1
            return super().execute_command(*args, **options)

    return CountingRedis


def _server_cost(counting: Any, admin: Any, run: Callable[[int], None], n: int
                 ) -> dict[str, Any]:
    """Round trips per op (counted by the client) and server time per op (INFO
    commandstats: the sent commands' time, which includes the commands their scripts ran)."""
    run(20)  # scripts loaded, connection open
    admin.config_resetstat()
    counting.sent.clear()
    run(n)
    sent = dict(counting.sent)
    stats = admin.info("commandstats")
    # Our lanes send their scripts on connections of their own (not through the
    # client's execute_command): count those from the server. A script is always a
    # command sent by a client (Lua cannot run EVAL).
    for name in ("evalsha", "eval"):
        calls = int(stats.get(f"cmdstat_{name}", {}).get("calls", 0))
        if calls > sent.get(name, 0):
            sent[name] = calls
    top_usec = 0
    inner = 0
    for k, v in stats.items():
        name = k.removeprefix("cmdstat_")
        if name in sent:
            top_usec += int(v["usec"])
        elif name not in ("config|resetstat", "info"):
            inner += int(v["calls"])
    return {
        "round_trips_per_op": sum(sent.values()) / n,
        "sent_per_op": {k: v / n for k, v in sent.items()},
        "inner_calls_per_op": inner / n,
        "server_us_per_op": top_usec / n,
    }


# -- the section -------------------------------------------------------------------------------


def redis_sizes(cfg: Config) -> tuple[int, float, int, float]:
    """(uncontended rounds, seconds per batch, fairness processes, fairness window s).
    A batch is longer than in the thread sections: one operation costs two round trips."""
    if cfg.quick:
        return 7, 0.03, 8, 3.0
    return cfg.rounds, 0.04, 32, 10.0


def section_redis(cfg: Config) -> list[Row]:
    """Redis: ours vs redis-py's Lock, uncontended and 32 processes on one key."""
    try:
        import redis
    except ImportError as exc:
        return [Row(SEC, "redis section skipped: redis-py not importable", None, "",
                    f"{type(exc).__name__}: {exc}; pip install redis (or lanequeue[redis])")]
    try:
        from lanequeue.redis import RedisSessionLane
    except ImportError as exc:
        return [Row(SEC, "redis section skipped: lanequeue.redis not importable", None, "",
                    f"{type(exc).__name__}: {exc}")]
    binary = _find_server()
    if binary is None:
        return [Row(SEC, "redis section skipped: redis-server not found", None, "",
                    f"{REDIS_SERVER!r} is not on PATH; apt-get install redis-server, or set "
                    f"REDIS_SERVER to its path")]

    rounds, batch_s, nprocs, window_s = redis_sizes(cfg)
    server = _Server(binary)
    try:
        server.start()
        admin = redis.Redis(host=server.host, port=server.port)
        ver = admin.info("server")["redis_version"]

        # 2. fairness first, so the workers fork from a process with no lane (no renewer
        # thread) and the uncontended rounds run with the workers gone.
        fair = _fairness(server.host, server.port, nprocs, window_s)

        # 3. hot key, also before this process makes a lane (workers fork from it)
        hot_n, hot_s = (16, 3.0)
        hot = _hot_key(server.host, server.port, hot_n, hot_s)
        scaling = _hot_scaling_rows(server.host, server.port)

        # 1. uncontended
        client = redis.Redis(host=server.host, port=server.port)
        lane = RedisSessionLane(client, "bench", prefix=PREFIX, lease_s=30)
        cands = {"ping": _loop_ping(client), "ours": _loop_ours(lane),
                 "redispy": _loop_redispy(client)}
        res = interleave(cands, rounds, batch_s, [["ours", "redispy"], ["ping"]])

        counting = _counting_client_class(redis)(host=server.host, port=server.port)
        n_diag = 200 if cfg.quick else 1000
        cost = {
            "ours": _server_cost(counting, admin, _loop_ours(
                RedisSessionLane(counting, "diag", prefix=PREFIX, lease_s=30)), n_diag),
            "redispy": _server_cost(counting, admin, _loop_redispy(counting), n_diag),
        }
        counting.close()
        client.close()
        admin.close()
    finally:
        server.close()

    rows: list[Row] = [Row(
        SEC, f"redis-server {ver} (own, 127.0.0.1, no persistence)", None, "",
        f"redis-py {redis.__version__}; one client per process, default pool",
        data={"redis_version": ver, "redis_py": redis.__version__},
    )]

    # -- uncontended rows --
    ping_ops = 1e9 / median(res["ping"])
    labels = [
        ("ping", "PING (one round trip), for scale"),
        ("ours", "ours  RedisSessionLane  with lane.acquire(key)"),
        ("redispy", "redis-py  Lock  with client.lock(key, timeout=30)"),
    ]
    for cid, label in labels:
        ops = 1e9 / median(res[cid])
        note = f"+-{spread(res[cid]) * 100:.0f}%, {median(res[cid]) / 1000:.0f} us/op"
        if cid != "ping":
            c = cost[cid]
            sent = " + ".join(f"{v:g} {k.upper()}" for k, v in c["sent_per_op"].items())
            note += (f", {c['round_trips_per_op']:g} round trips ({sent}), "
                     f"{c['inner_calls_per_op']:g} calls in scripts, server "
                     f"{c['server_us_per_op']:.1f} us/op; {ops / ping_ops:.2f}x PING")
        rows.append(Row(SEC, label, ops, "ops/s", note,
                        data={"rounds_ns": res[cid], **cost.get(cid, {})}))
    ratios = per_round_ratio(res["redispy"], res["ours"])  # throughput ours / redis-py
    r = median(ratios)
    rows.append(Row(
        SEC, "ratio ours/redis-py  acquire+release per second", r, "x",
        f"median of {len(ratios)} per-round ratios, +-{spread(ratios) * 100:.0f}%",
        goal=f">= {UNCONTENDED_GOAL:g}", status="PASS" if r >= UNCONTENDED_GOAL else "MISS",
        data={"rounds_ratio": ratios},
    ))

    rows.extend(_hot_rows(hot, hot_n, hot_s))
    rows.extend(scaling)

    # -- fairness rows --
    setup = fair.get("setup_s")
    trouble = ""
    if fair["errors"] or fair["died"] or fair.get("stragglers") or "aborted_before" in fair:
        trouble = (f"; {fair['errors']} worker errors, {fair['died']} workers died, "
                   f"{fair.get('stragglers', 0)} terminated"
                   + (f", stopped before phase {fair['aborted_before']}"
                      if "aborted_before" in fair else ""))
    head = (f"{nprocs} processes ({fair['start_method']}), one key, {window_s:g} s")
    rows.append(Row(SEC, f"fairness: {head}", None, "",
                    (f"workers ready in {setup:.1f} s" if setup is not None else "")
                    + trouble, data={k: v for k, v in fair.items() if k != "grants"}))
    for phase, who in (("ours", "ours    "), ("redispy", "redis-py")):
        counts = fair["grants"][phase]
        got = [c for c in counts if c >= 0]
        data = {"per_process": counts}
        if len(got) < len(counts) or not got:
            rows.append(Row(SEC, f"{who}  fairness", None, "",
                            f"{len(counts) - len(got)} of {len(counts)} processes reported "
                            f"nothing", status="ERROR", data=data))
            continue
        total, lo, hi = sum(got), min(got), max(got)
        ratio = lo / hi if hi else 0.0
        starved = sum(c == 0 for c in got)
        note = f"{total / window_s:,.0f} grants/s"
        if phase == "redispy" and total:
            # A waiter polls at most every 0.1 s, so at most nprocs * window / 0.1 grants
            # came from a poll; every other grant was a process's first try right after
            # its own release: the releaser taking the lock straight back.
            retake = max(0.0, 1 - nprocs * window_s / 0.1 / total)
            note += f"; >= {retake * 100:.0f}% were the releaser re-taking it"
        rows.append(Row(SEC, f"{who}  grants in total", total, "grants", note, data=data))
        rows.append(Row(SEC, f"{who}  min grants per process", lo, "grants",
                        f"{starved} of {len(got)} processes got none" if starved
                        else f"fair share {total / len(got):,.0f}"))
        rows.append(Row(SEC, f"{who}  max grants per process", hi, "grants",
                        f"{hi / total * 100:.0f}% of all grants" if total else ""))
        if phase == "ours":
            rows.append(Row(SEC, f"{who}  min/max grants per process", ratio, "x", "",
                            goal=f">= {FAIRNESS_GOAL:g}",
                            status="PASS" if ratio >= FAIRNESS_GOAL else "MISS"))
        else:
            rows.append(Row(SEC, f"{who}  min/max grants per process", ratio, "x",
                            "no goal (baseline): a waiter polls every 0.1 s"))
    return rows
