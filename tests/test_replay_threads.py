"""How the in-process replay runtimes keep time: the thread runtime's pool never holds an
arrival back for a thread that is still starting (on a busy machine a start takes
milliseconds, and a burst with no idle thread used to fall seconds behind the trace); a
request's work ends at its start plus its work time; the asyncio runtime's loop fires its
timers on time."""

from __future__ import annotations

import asyncio
import threading
import time
from typing import Any

import pytest

from lanequeue.replay.observe import ArrivalGate, Observer
from lanequeue.replay.policy import policy_lanes
from lanequeue.replay.runtimes import aio as aio_mod
from lanequeue.replay.runtimes.aio import AsyncioRuntime
from lanequeue.replay.runtimes.base import ReplayPlan, arrival_gate
from lanequeue.replay.runtimes.threads import _ThreadPool, build_thread_queue, drive_threads


class HeldStarts:
    """``start_thread`` for the pool that holds every start until ``release`` is set,
    as a machine with no free CPU does."""

    def __init__(self) -> None:
        self.release = threading.Event()
        self.asked = threading.Event()  # a start has been asked for
        self.count = 0

    def __call__(self, thread: threading.Thread) -> None:
        self.count += 1
        self.asked.set()
        assert self.release.wait(10), "start never released"
        thread.start()


@pytest.mark.timeout(10)
def test_submit_returns_while_the_thread_for_it_is_still_starting() -> None:
    starts = HeldStarts()
    ran: list[int] = []
    done = threading.Semaphore(0)

    def job(rid: int) -> None:
        ran.append(rid)
        done.release()

    pool = _ThreadPool(job, start_thread=starts)
    submitter = threading.Thread(target=lambda: [pool.submit(rid) for rid in range(3)])
    submitter.start()
    submitter.join(5)
    try:
        # Every submit returned although no thread could start yet: nothing waited.
        assert not submitter.is_alive()
        assert starts.asked.wait(5)
        assert ran == []
    finally:
        starts.release.set()
    for _ in range(3):
        assert done.acquire(timeout=5)
    assert ran == [0, 1, 2]  # pending requests are taken up in arrival order
    pool.close()


@pytest.mark.timeout(10)
def test_a_thread_that_is_done_takes_the_pending_request_while_a_start_is_held() -> None:
    starts = HeldStarts()
    first_started = threading.Event()
    finish_first = threading.Event()
    ran_on: dict[int, str] = {}
    second_done = threading.Event()

    def job(rid: int) -> None:
        ran_on[rid] = threading.current_thread().name
        if rid == 0:
            first_started.set()
            assert finish_first.wait(5)
        else:
            second_done.set()

    pool = _ThreadPool(job, start_thread=starts)
    pool.submit(0)
    starts.release.set()  # the thread for request 0 starts
    assert first_started.wait(5)
    starts.release.clear()  # from now on every start is held
    starts.asked.clear()
    pool.submit(1)  # no idle thread: pending, and a start is asked for
    assert starts.asked.wait(5)
    finish_first.set()  # request 0's thread is free: it takes request 1
    assert second_done.wait(5)
    assert ran_on[1] == ran_on[0]
    pool.close()
    starts.release.set()  # the held start goes on, and its thread exits at once
    assert pool.started == 2


@pytest.mark.timeout(10)
def test_close_lets_parked_threads_exit() -> None:
    done = threading.Event()
    pool = _ThreadPool(lambda rid: done.set())
    pool.submit(0)
    assert done.wait(5)
    pool.close()
    for t in threading.enumerate():
        if t.name.startswith("lanequeue-replay-"):
            t.join(5)
            assert not t.is_alive()


# --------------------------------------------------------------------------------------
# A request's work ends at its start + its work time: the bookkeeping after the start (the
# observer samples the registry, which can be slow) is part of the work, not added to it.

WORK_S = 1.0
PROBE_S = 0.8  # a registry probe this slow after the start used to make the work 1.8 s


def one_request_plan() -> ReplayPlan:
    return ReplayPlan(arrival_s=[0.0], work_s=[WORK_S], keys=["k"],
                      lanes=policy_lanes("session", 1))


def slow_probe() -> int:
    time.sleep(PROBE_S)
    return 1


@pytest.mark.timeout(20)
def test_thread_work_ends_at_its_start_plus_its_work_time() -> None:
    plan = one_request_plan()
    queue = build_thread_queue(plan)
    gate = arrival_gate(queue, plan.lanes[0], plan.keys)
    epoch = time.monotonic() + 0.01
    observer = Observer(plan.keys, epoch_s=epoch, registry_size=slow_probe)
    drive = drive_threads(plan, queue, gate, observer, epoch=epoch)
    assert drive.errors == []
    worked = observer.end_work_s[0] - observer.start_s[0]
    assert WORK_S <= worked < WORK_S + PROBE_S / 2


@pytest.mark.timeout(20)
def test_asyncio_work_ends_at_its_start_plus_its_work_time(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    seen: list[Observer] = []

    class Recording(Observer):
        def __init__(self, *args: Any, **kw: Any) -> None:
            super().__init__(*args, **kw)
            seen.append(self)

    monkeypatch.setattr(aio_mod, "Observer", Recording)
    monkeypatch.setattr(aio_mod, "registry_probe", lambda queue, lanes: slow_probe)
    record = AsyncioRuntime().run(one_request_plan())
    assert record.errors == []
    worked = seen[0].end_work_s[0] - seen[0].start_s[0]
    assert WORK_S <= worked < WORK_S + PROBE_S / 2


# --------------------------------------------------------------------------------------
# The asyncio runtime's selector: the loop's timers fire on time, not up to 1 ms late.


class RecordingSelector:
    def __init__(self) -> None:
        self.timeouts: list[float | None] = []

    def select(self, timeout: float | None = None) -> list[Any]:
        self.timeouts.append(timeout)
        return []


@pytest.mark.parametrize(
    ("timeout", "slept", "polled"),
    [
        (None, None, None),  # no timer: wait for I/O without limit
        (0, None, 0),  # something ready: only look
        (0.0017, None, 0.001),  # whole milliseconds, rounded down: the loop asks again
        (0.25, None, 0.25),
        (0.0003, 0.0003, 0),  # under a millisecond: a precise sleep, then only look
    ],
)
def test_fine_timer_selector_never_waits_past_the_timer(
    monkeypatch: pytest.MonkeyPatch, timeout: float | None, slept: float | None,
    polled: float | None,
) -> None:
    sleeps: list[float] = []
    me, real_sleep = threading.get_ident(), time.sleep

    def sleep(s: float) -> None:
        # ``time.sleep`` is replaced for the whole process: only this thread's naps are
        # the selector's (a thread another test left, a listener reconnecting, say, may
        # sleep meanwhile).
        if threading.get_ident() == me:
            sleeps.append(s)
        else:
            real_sleep(s)

    monkeypatch.setattr(aio_mod.time, "sleep", sleep)
    selector = aio_mod._FineTimerSelector()
    inner = RecordingSelector()
    real_inner, selector._inner = selector._inner, inner  # type: ignore[assignment]
    try:
        assert selector.select(timeout) == []
    finally:
        real_inner.close()
    assert sleeps == ([] if slept is None else [slept])
    assert inner.timeouts == [pytest.approx(polled) if polled else polled]


@pytest.mark.timeout(20)
def test_the_replay_loop_serves_io_and_timers() -> None:
    async def main() -> bytes:
        reader, writer = await asyncio.open_connection(*server_address)
        writer.write(b"ping")
        await asyncio.sleep(0.0004)  # a sub-millisecond timer
        data = await reader.readexactly(4)
        writer.close()
        await writer.wait_closed()
        return data

    import socket

    srv = socket.create_server(("127.0.0.1", 0))
    server_address = srv.getsockname()[:2]

    def echo() -> None:
        conn, _ = srv.accept()
        with conn:
            conn.sendall(conn.recv(4))

    t = threading.Thread(target=echo)
    t.start()
    loop = aio_mod._replay_loop()
    try:
        assert loop.run_until_complete(main()) == b"ping"
    finally:
        loop.close()
        t.join(5)
        srv.close()


# --------------------------------------------------------------------------------------
# The in-process arrival gate: a request whose predecessor has not passed the gate yet
# waits for it without polling (pollers used to take the CPU that predecessor needed).


def wait_until(cond: Any, timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, "condition not reached"
        time.sleep(0.001)


@pytest.mark.timeout(10)
def test_gate_does_not_poll_while_the_predecessor_has_not_passed() -> None:
    checks: list[object] = []
    entered: list[int] = []

    def inside(slot: object) -> int:
        checks.append(slot)
        return len(entered)

    gate = ArrivalGate(["a", "a"], inside, poll_s=0.0005)

    def second() -> None:
        gate.wait_turn(1)
        entered.append(1)

    t = threading.Thread(target=second, daemon=True)
    t.start()
    wait_until(lambda: gate.held_back == 1)  # request 1 is held back...
    assert checks == []  # ...and has not looked at the lane: it waits for request 0
    gate.wait_turn(0)  # request 0 passes (rank 0: nothing to wait for) and enters
    entered.append(0)
    t.join(5)
    assert entered == [0, 1]
    assert checks  # request 1 checked that request 0 is inside before going in
    assert gate.held_back == 1  # counted once, though it may have polled after the wait


@pytest.mark.timeout(10)
def test_gate_lets_the_successor_of_a_request_that_failed_at_the_gate_go() -> None:
    gate = ArrivalGate(["a", "a"], lambda slot: 0)
    passed = threading.Event()

    def second() -> None:
        gate.wait_turn(1)
        passed.set()

    t = threading.Thread(target=second, daemon=True)
    t.start()
    wait_until(lambda: gate.held_back == 1)
    assert not passed.is_set()
    gate.finished(0)  # request 0 failed before entering: its successor must not hang
    assert passed.wait(5)
    t.join(5)


@pytest.mark.timeout(10)
def test_gate_wait_for_the_predecessor_gives_up_after_max_wait() -> None:
    gate = ArrivalGate(["a", "a"], lambda slot: 0, max_wait_s=0.05)
    with pytest.raises(TimeoutError, match=r"request 1 waited over 0\.05 s"):
        gate.wait_turn(1)
    gate.finished(0)  # a late pass wakes nobody and raises nothing


@pytest.mark.timeout(60)
@pytest.mark.parametrize("runtime", ["threads", "asyncio"])
def test_the_set_up_is_collected_once_between_building_and_the_first_arrival(
    runtime: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # settle_heap's place: after the lanes are built, before the epoch (so before any
    # request is driven), once per run.
    from lanequeue.replay import ReplayConfig, make_plan, read_trace
    from lanequeue.replay.runtimes import get_runtime
    from lanequeue.replay.runtimes import threads as threads_mod

    module: Any = threads_mod if runtime == "threads" else aio_mod
    build_name = "build_thread_queue" if runtime == "threads" else "build_async_queue"
    drive_name = "drive_threads" if runtime == "threads" else "drive_tasks"
    seen: list[str] = []
    build, drive = getattr(module, build_name), getattr(module, drive_name)

    def built(plan: Any) -> Any:
        seen.append("build")
        return build(plan)

    def driven(*args: Any, **kw: Any) -> Any:
        seen.append("drive")
        return drive(*args, **kw)

    monkeypatch.setattr(module, build_name, built)
    monkeypatch.setattr(module, drive_name, driven)
    monkeypatch.setattr(module, "settle_heap", lambda: seen.append("collect"))
    plan = make_plan(read_trace().head(50), ReplayConfig(speed=5000, runtime=runtime))
    record = get_runtime(runtime).run(plan)
    assert not record.errors
    assert seen == ["build", "collect", "drive"]
