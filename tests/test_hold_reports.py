"""``warn_hold_s`` as a hold ends (the contract suite runs the common case on all eight
classes): the in-process lanes' releases hand a hold that lasted that long to the
reporter thread (see "reports made off the lock" in lanequeue._core), on the lane's own
clock, from every release path; hold times are measured for it without showing in the
metrics; the setting can change on a live lane; a forked child reports too.
"""

from __future__ import annotations

import asyncio
import gc
import logging
import os
import select
import signal
import sys
import threading
import time
import weakref
from collections.abc import Iterator
from typing import Any

import pytest
from conftest import FakeClock

from lanequeue import AsyncLaneQueue, Lane, LaneQueue, SessionLane

pytestmark = pytest.mark.timeout(30)


class _Ends(logging.Handler):
    """The "has been released" records of the lanequeue logger, with a condition to
    wait for them (they come from the reporter thread)."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.lines: list[str] = []
        self.cond = threading.Condition()

        self.probes = 0

    def emit(self, record: logging.LogRecord) -> None:
        message = record.getMessage()
        if "has been released" in message:
            with self.cond:
                if message.startswith("lane 'probe'"):
                    self.probes += 1
                else:
                    self.lines.append(message)
                self.cond.notify_all()

    def wait_for(self, n: int) -> list[str]:
        with self.cond:
            assert self.cond.wait_for(lambda: len(self.lines) >= n, 10), self.lines
            return list(self.lines)

    def settle(self) -> list[str]:
        """The lines so far, after a report sent now has been through the thread (the
        reports are handled in order)."""
        probe = SessionLane("probe", warn_hold_s=0.0)
        n = self.probes
        with probe.acquire("probe"):
            pass
        with self.cond:
            assert self.cond.wait_for(lambda: self.probes > n, 10)
            return list(self.lines)


@pytest.fixture
def ends() -> Iterator[_Ends]:
    handler = _Ends()
    logger = logging.getLogger("lanequeue")
    logger.addHandler(handler)
    level = logger.level
    logger.setLevel(logging.WARNING)
    try:
        # Reports an earlier test left on the reporter's queue come first: not this one's.
        handler.settle()
        with handler.cond:
            handler.lines.clear()
        yield handler
    finally:
        logger.removeHandler(handler)
        logger.setLevel(level)


@pytest.mark.parametrize("cls", [Lane, SessionLane])
def test_a_long_hold_is_measured_on_the_lanes_clock(cls: Any, ends: _Ends) -> None:
    clock = FakeClock()
    lane = cls("l", clock=clock, warn_hold_s=5.0)
    with lane.acquire("k"):
        clock.advance(4.999)
    assert ends.settle() == []
    with lane.acquire("k") as hold:
        clock.advance(5.0)
    assert ends.wait_for(1) == [
        f"lane 'l': key 'k' held its permit for 5.000 s (token {hold.token}), past "
        "warn_hold_s; it has been released"]


def test_every_release_path_reports(ends: _Ends) -> None:
    """A hold's exit with nobody in line and with a waiter (the hand-off), a release by
    key, ``hold.release()``, ``acquire_all`` (each lane), and a dropped hold."""
    clock = FakeClock()
    lane = SessionLane("s", clock=clock, warn_hold_s=1.0)
    queue = LaneQueue(warn_hold_s=1.0)
    queue.add_session_lane("session", clock=clock)
    queue.add_lane("global", clock=clock)

    with lane.acquire("exit"):
        clock.advance(1)
    assert lane.try_acquire("by-key")
    clock.advance(1)
    assert lane.manual_release("by-key")
    with lane.acquire("early") as hold:
        clock.advance(1)
        hold.release()
    # a hand-off: the exit finds a waiter in line
    hold = lane.acquire("handoff")
    hold.__enter__()
    second = lane.acquire("handoff")  # (entered by the thread, left here)
    waiter = threading.Thread(target=second.__enter__)
    waiter.start()
    while lane.waiting_for("handoff") != 1:
        threading.Event().wait(0.001)
    clock.advance(1)
    hold.__exit__(None, None, None)
    waiter.join(10)
    assert second.held
    second.__exit__(None, None, None)  # (short: not reported)
    with queue.acquire_all("all", ["session", "global"]):
        clock.advance(1)
    dropped = lane.acquire("dropped")
    dropped.__enter__()
    clock.advance(1)
    with pytest.warns(ResourceWarning):
        del dropped
        gc.collect()
    assert lane.try_acquire("dropped")  # (the dropped hold ended before this take)
    assert lane.manual_release("dropped")
    lines = ends.settle()
    assert sorted(line.split()[1] + line.split()[3] for line in lines) == sorted([
        "'s':'exit'", "'s':'by-key'", "'s':'early'", "'s':'handoff'", "'s':'dropped'",
        "'session':'all'", "'global':'all'"])


def test_asyncio_acquire_all_reports(ends: _Ends) -> None:
    queue = AsyncLaneQueue(warn_hold_s=0.05)
    queue.add_session_lane("session")
    queue.add_lane("global")

    async def main() -> None:
        async with queue.acquire_all("k", ["session", "global"]):
            await asyncio.sleep(0.1)

    asyncio.run(main())
    assert sorted(line.split()[1] for line in ends.wait_for(2)) == ["'global':", "'session':"]


def test_hold_times_measured_for_it_do_not_show_in_the_metrics(ends: _Ends) -> None:
    lane = SessionLane("s", warn_hold_s=10.0)
    with lane.acquire("k"):
        pass
    assert lane.metrics_snapshot()[0].hold is None
    lane.track_holds()
    with lane.acquire("k"):
        pass
    hold = lane.metrics_snapshot()[0].hold
    assert hold is not None and hold.count == 2  # (measured since warn_hold_s)


def test_the_setting_changes_on_a_live_lane(ends: _Ends) -> None:
    clock = FakeClock()
    lane = Lane("g", clock=clock)
    assert lane.warn_hold_s is None
    with lane.acquire("off"):
        clock.advance(100)
    lane.warn_hold_s = 1.0
    with lane.acquire("on"):
        clock.advance(1)
    lane.warn_hold_s = None
    with lane.acquire("off-again"):
        clock.advance(100)
    assert [line.split()[3] for line in ends.settle()] == ["'on'"]
    with pytest.raises(ValueError, match="warn_hold_s"):
        lane.warn_hold_s = -1
    with pytest.raises(TypeError, match="warn_hold_s"):
        lane.warn_hold_s = "1"  # type: ignore[assignment]
    assert lane.warn_hold_s is None


@pytest.mark.parametrize("cls", [Lane, SessionLane])
def test_a_setting_interrupted_after_the_cores_watch_is_not_split(
    cls: Any, ends: _Ends, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An interrupt lands as the core's watch returns: the lane reports the limit the
    releases now use (the lane once kept a second record, set after the watch, which the
    interrupt left at the old value)."""
    clock = FakeClock()
    lane = cls("l", clock=clock)
    core = lane._core
    watch = type(core).watch_holds

    def then_interrupted(self: Any, *args: Any) -> None:
        watch(self, *args)
        raise KeyboardInterrupt

    with monkeypatch.context() as patched:  # (the probe's lane below needs the real one)
        patched.setattr(type(core), "watch_holds", then_interrupted)
        with pytest.raises(KeyboardInterrupt):
            lane.warn_hold_s = 1.0
    assert lane.warn_hold_s == core.hold_warn_s == 1.0
    with lane.acquire("k"):
        clock.advance(1)
    assert [line.split()[3] for line in ends.settle()] == ["'k'"]
    with monkeypatch.context() as patched:
        patched.setattr(type(core), "watch_holds", then_interrupted)
        with pytest.raises(KeyboardInterrupt):
            lane.warn_hold_s = None
    assert lane.warn_hold_s is None and core.hold_warn_s is None


def test_the_core_does_not_keep_its_lane_alive() -> None:
    lane = SessionLane("s", warn_hold_s=1.0)
    ref = weakref.ref(lane)
    del lane
    gc.collect()
    assert ref() is None


@pytest.mark.skipif(not hasattr(os, "fork"), reason="os.fork is POSIX only")
def test_a_forked_child_reports_its_long_holds() -> None:
    """The parent's reporter thread does not exist in a child made by fork: the child
    gets its own (a hold of the child that lasted long is logged there)."""
    clock = FakeClock()
    lane = SessionLane("s", clock=clock, warn_hold_s=1.0)
    with lane.acquire("parent"):  # the parent's reporter thread runs
        clock.advance(1)
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: report what it logged through the pipe, then leave
        code = 1
        try:
            handler = _Ends()
            logger = logging.getLogger("lanequeue")
            logger.addHandler(handler)
            logger.setLevel(logging.WARNING)
            with lane.acquire("child"):
                clock.advance(1)
            lines = handler.wait_for(1)
            os.write(write, "\n".join(lines).encode())
            code = 0
        finally:
            sys.stderr.flush()
            os._exit(code)
    os.close(write)
    with os.fdopen(read, "rb") as pipe:
        out = pipe.read().decode()
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0, out
    assert "key 'child' held its permit for 1.000 s" in out


class _Gate(logging.Handler):
    """Blocks the reporter thread in its report of key 'gate' until ``open`` is set."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.inside = threading.Event()
        self.open = threading.Event()

    def handle(self, record: logging.LogRecord) -> bool:  # (without the handler's lock,
        self.emit(record)  # which a blocked emit would hold against every other record)
        return True

    def emit(self, record: logging.LogRecord) -> None:
        if "key 'gate'" in record.getMessage() and "has been released" in record.getMessage():
            self.inside.set()
            assert self.open.wait(20)

    def hold_up(self, lane: Any, clock: FakeClock) -> None:
        """Hold the reporter thread up: a long hold of key 'gate' on ``lane`` ends, and
        its report waits in this handler until ``open`` is set."""
        with lane.acquire("gate"):
            clock.advance(lane.warn_hold_s)
        assert self.inside.wait(10)


@pytest.fixture
def gate() -> Iterator[_Gate]:
    handler = _Gate()
    logger = logging.getLogger("lanequeue")
    logger.addHandler(handler)
    try:
        yield handler
    finally:
        handler.open.set()
        logger.removeHandler(handler)


def test_a_check_between_a_release_and_its_report_does_not_log_it_twice(
    ends: _Ends, gate: _Gate, caplog: pytest.LogCaptureFixture
) -> None:
    """A check logs a long hold; the hold ends, its report waits behind another one in
    the reporter thread; a check runs meanwhile: the hold is not logged again (a check
    used to forget the warned hold once it was no longer held, and the report then
    logged it a second time)."""
    caplog.set_level(logging.WARNING, logger="lanequeue")
    clock = FakeClock()
    lane = SessionLane("s", clock=clock, warn_hold_s=1.0)
    gate.hold_up(lane, clock)
    with lane.acquire("k"):
        clock.advance(2)
        assert [s.key for s in lane.stuck(1)] == ["k"]  # a check logs it, held
    lane.stuck(0)  # a check after its end, before its report: it must not forget it
    lane.metrics_snapshot()
    gate.open.set()
    lines = ends.settle()
    assert [line.split()[3] for line in lines] == ["'gate'"]  # not 'k': logged already
    held = [r.getMessage() for r in caplog.records if "'k' has held" in r.getMessage()]
    assert len(held) == 1


def test_a_forked_child_makes_and_sets_lanes_while_a_parents_thread_sets_one() -> None:
    """A thread of the parent is inside a ``warn_hold_s`` setting (or OTel's instrument
    registry) at the fork: the child's locks are new, so the child makes lanes and sets
    them (the child hung: the lock the parent's thread held was never released there)."""
    from lanequeue import _ops, metrics

    read, write = os.pipe()
    inside, leave = threading.Event(), threading.Event()

    def setter() -> None:  # another thread of the parent: inside the three at the fork
        with _ops._SETTING, _ops._WARNED, metrics._otel_providers_lock:
            inside.set()
            leave.wait(30)

    other = threading.Thread(target=setter)
    other.start()
    assert inside.wait(30)
    try:
        pid = os.fork()
        if pid == 0:  # the child
            code = 1
            try:
                lane = SessionLane("child", warn_hold_s=5.0)
                lane.warn_hold_s = 1.0
                lane.stuck(0)
                with metrics._otel_providers_lock:
                    pass
                os.write(write, b"ok")
                code = 0
            finally:
                os._exit(code)
    finally:
        leave.set()
        other.join(30)
    os.close(write)
    ready, _, _ = select.select([read], [], [], 10)
    if not ready:  # the child hangs: end it, and fail here rather than at the timeout
        os.kill(pid, signal.SIGKILL)
    with os.fdopen(read, "rb") as pipe:
        out = pipe.read() if ready else b""
    _, status = os.waitpid(pid, 0)
    assert ready, "the child hung on a lock a thread of the parent held at the fork"
    assert os.waitstatus_to_exitcode(status) == 0 and out == b"ok"


def _report_then_interrupt() -> tuple[Any, list[bool]]:
    """A stand-in for ``_core._report_later`` that queues the report, then raises
    KeyboardInterrupt the first time (as a signal landing as the call returns), and the
    flag that says it has not fired yet."""
    from lanequeue import _core

    queued = _core._report_later
    interrupt = [True]

    def then_interrupted(*args: Any) -> bool:
        got: bool = queued(*args)
        if interrupt[0]:
            interrupt[0] = False
            raise KeyboardInterrupt
        return got

    return then_interrupted, interrupt


def test_an_interrupted_release_ended_before_its_report_came_is_logged_once(
    ends: _Ends, gate: _Gate, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The interrupt lands after the release queued its report; the hold then ends for
    real (its drop, a manual release) before the reporter reaches the first report, which
    so finds it ended: two reports of one end, logged once."""
    from lanequeue import _core

    then_interrupted, interrupt = _report_then_interrupt()

    clock = FakeClock()
    lane = SessionLane("l", clock=clock, warn_hold_s=1.0)
    gate.hold_up(lane, clock)
    hold = lane.acquire("k")
    hold.__enter__()
    token = hold.token
    clock.advance(2)
    with monkeypatch.context() as patched:
        patched.setattr(_core, "_report_later", then_interrupted)
        with pytest.raises(KeyboardInterrupt):
            hold.__exit__(None, None, None)
    assert not interrupt[0] and _core._REPORTER.queue.qsize() == 1
    assert lane.manual_release("k")  # its real end: a second report of it
    assert _core._REPORTER.queue.qsize() == 2
    gate.open.set()
    assert [line for line in ends.settle() if "'k'" in line] == [
        f"lane 'l': key 'k' held its permit for 2.000 s (token {token}), past "
        "warn_hold_s; it has been released"]


@pytest.mark.parametrize("kind", ["in-process", "redis"])
def test_a_check_that_read_the_holds_before_one_ended_does_not_log_it_again(
    ends: _Ends, caplog: pytest.LogCaptureFixture, kind: str, request: pytest.FixtureRequest,
) -> None:
    """A check reads the holds; one of them ends and its end is logged before the check
    goes through what it read: the check does not log it ("has held", as if still
    held) after its end was logged (a Redis lane, which logs an end in its release,
    did, as an in-process one did when its report came first)."""
    caplog.set_level(logging.WARNING, logger="lanequeue")
    if kind == "redis":
        from lanequeue.redis import RedisSessionLane

        lane: Any = RedisSessionLane(request.getfixturevalue("redis_client"), "l",
                                     prefix=request.getfixturevalue("redis_prefix"),
                                     warn_hold_s=0.05)
        hold = lane.acquire("k")
        hold.__enter__()
        time.sleep(0.06)
    else:
        clock = FakeClock()
        lane = SessionLane("l", clock=clock, warn_hold_s=1.0)
        hold = lane.acquire("k")
        hold.__enter__()
        clock.advance(2)
    read = lane._hold_list()  # what a check read while it was held
    hold.__exit__(None, None, None)
    assert len([line for line in ends.settle() if "'k'" in line]) == 1  # its end, logged
    lane._check_holds(read)  # the check goes on with what it read
    assert [r.getMessage() for r in caplog.records if "'k' has held" in r.getMessage()] == []


def test_holds_a_check_logged_are_not_logged_again_while_their_reports_wait(
    ends: _Ends, gate: _Gate, caplog: pytest.LogCaptureFixture,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A check logs 1,100 long holds; they end while the reporter is held up by a slow
    handler, so their reports wait; checks run meanwhile, with none of them held any
    more: the marks of what the checks logged are kept for the reports (a prune dropped
    them, and each report then logged its hold a second time)."""
    from lanequeue import _core

    monkeypatch.setattr(_core, "REPORTS_MAX", 2000)  # (every report waits: none missed)
    caplog.set_level(logging.WARNING, logger="lanequeue")
    clock = FakeClock()
    lane = SessionLane("s", clock=clock, warn_hold_s=1.0)
    gate.hold_up(lane, clock)
    holds = [lane.acquire(f"k{i}") for i in range(1100)]
    for hold in holds:
        hold.__enter__()
    clock.advance(2)
    assert len(lane.stuck(1)) == 1100  # the check logs every one as held
    for hold in holds:
        hold.__exit__(None, None, None)  # their reports wait behind the gate
    for _ in range(3):
        lane.stuck(0)  # checks with nothing held
    gate.open.set()
    ended = [line for line in ends.settle() if "'k" in line]
    assert ended == []  # each was logged by the check, once
    held = [r.getMessage() for r in caplog.records if "has held its permit" in r.getMessage()]
    assert len(held) == 1100


def test_a_check_with_an_old_read_of_the_holds_keeps_the_marks_of_newer_ones(
    ends: _Ends, gate: _Gate, caplog: pytest.LogCaptureFixture,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Marks pile up past a prune: 2,100 holds logged by checks have ended and their
    reports wait (a slow handler). A check that read the holds a while ago (its thread
    switched out: nothing was held then) prunes: it must keep the marks of the holds
    taken since and logged by another check (the next check logged them again), and
    those of the ended holds whose reports still wait (each report logged its hold
    again)."""
    from lanequeue import _core

    monkeypatch.setattr(_core, "REPORTS_MAX", 5000)  # (every report waits: none missed)
    caplog.set_level(logging.WARNING, logger="lanequeue")
    clock = FakeClock()
    lane = Lane("g", clock=clock, warn_hold_s=1.0, max_concurrent=5000)
    gate.hold_up(lane, clock)
    old = lane._hold_list()  # an old read: nothing held
    for i in range(2100):
        with lane.acquire(f"e{i}"):
            clock.advance(1)
            lane.stuck(0)  # logged as held; its report will wait
    live = [lane.acquire(f"live{i}") for i in range(6)]
    for hold in live:
        hold.__enter__()
    clock.advance(2)
    lane.stuck(0)  # logs the six live holds
    lane._check_holds(old)  # the old read: a prune, which must keep those marks
    lane.stuck(0)
    gate.open.set()
    assert [line for line in ends.settle() if "'e" in line] == []  # logged by the checks
    held = [r.getMessage() for r in caplog.records if "has held" in r.getMessage()]
    assert len([m for m in held if "'live" in m]) == 6
    assert len([m for m in held if "'e" in m]) == 2100
    for hold in live:
        hold.__exit__(None, None, None)


@pytest.mark.parametrize("n", [10_000])
def test_marks_stay_bounded_and_waiting_reports_keep_theirs_when_reports_are_missed(
    ends: _Ends, gate: _Gate, caplog: pytest.LogCaptureFixture, n: int,
) -> None:
    """The reporter is held up while 10,000 long holds are each logged by a check and
    end: 1,000 reports wait, the others are missed (their ends never come). The marks
    stay bounded (they grew with every missed end), and the waiting reports find their
    marks however many prunes ran meanwhile (each logged its hold a second time)."""
    from lanequeue import _core, _ops

    caplog.set_level(logging.WARNING, logger="lanequeue")
    clock = FakeClock()
    lane = Lane("g", clock=clock, warn_hold_s=1.0, max_concurrent=10)
    gate.hold_up(lane, clock)
    peak = 0
    for i in range(n):
        with lane.acquire(f"k{i}"):
            clock.advance(2)
            lane.stuck(0)
        peak = max(peak, len(lane._warned_holds))
    assert peak <= _core.REPORTS_MAX + 3 * _ops._PRUNE_FLOOR, peak
    gate.open.set()
    deadline = time.monotonic() + 20
    while _core._REPORTER.queue.qsize() and time.monotonic() < deadline:  # (room for settle's)
        time.sleep(0.01)
    assert [line for line in ends.settle() if "'k" in line] == []  # logged by the checks
    held = [r.getMessage() for r in caplog.records if "has held its permit" in r.getMessage()]
    assert len(held) == n


def test_an_interrupt_in_a_check_leaves_at_most_the_hold_it_was_logging_unlogged(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Ctrl-C as a check logs its first line: the check's other holds are not marked
    yet, so the next check logs them (they were marked all at once, first, and nobody
    logged them then)."""
    caplog.set_level(logging.WARNING, logger="lanequeue")
    clock = FakeClock()
    lane = SessionLane("s", clock=clock, warn_hold_s=1.0)
    holds = [lane.acquire(f"k{i}") for i in range(3)]
    for hold in holds:
        hold.__enter__()
    clock.advance(2)

    class CtrlC(logging.Handler):
        def handle(self, record: logging.LogRecord) -> bool:
            raise KeyboardInterrupt

    handler = CtrlC()
    logger = logging.getLogger("lanequeue")
    logger.addHandler(handler)
    try:
        with pytest.raises(KeyboardInterrupt):
            lane.stuck(0)
    finally:
        logger.removeHandler(handler)
    caplog.clear()
    lane.stuck(0)
    assert sorted(r.getMessage().split()[3] for r in caplog.records) == ["'k1'", "'k2'"]
    for hold in holds:
        hold.__exit__(None, None, None)


def test_a_check_that_reads_a_hold_ended_long_before_it_logs_does_not_log_it(
    ends: _Ends, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A check read H; before it gets to H's line (a slow handler), H ended and was
    logged, and 1,100 more ends pushed it out of the ends the lane remembers: the check
    finds H no longer held and leaves it to its end (it logged H a second time, as held)."""
    from lanequeue import _core

    monkeypatch.setattr(_core, "REPORTS_MAX", 5000)  # (every report waits: none missed)
    caplog.set_level(logging.WARNING, logger="lanequeue")
    clock = FakeClock()
    lane = Lane("g", clock=clock, warn_hold_s=1.0, max_concurrent=10)
    hold = lane.acquire("H")
    hold.__enter__()
    clock.advance(2)
    read = lane._hold_list()  # the check's read
    hold.__exit__(None, None, None)
    for i in range(1100):
        with lane.acquire(f"e{i}"):
            clock.advance(2)
    assert len([line for line in ends.settle() if "'H'" in line]) == 1  # its end
    lane._check_holds(read)  # the check gets to H's line now
    assert [r.getMessage() for r in caplog.records if "'H' has held" in r.getMessage()] == []


def test_one_prune_of_marks_at_a_time(monkeypatch: pytest.MonkeyPatch) -> None:
    """Two prunes read the holds before H was taken and are held up after their reads;
    H is taken and logged (marked); then both go on: the first took H for ended, and
    the second, finding it so twice, dropped H's mark (the next check logged H again).
    Now one prune runs at a time: the second finds the first under way and leaves."""
    from lanequeue._ops import LaneOps

    clock = FakeClock()
    lane = Lane("g", clock=clock, warn_hold_s=1.0, max_concurrent=10)
    inside, go = threading.Semaphore(0), threading.Event()
    pending = LaneOps._pending_ends

    def held_up(self: Any) -> set[tuple[str, int]]:
        inside.release()
        assert go.wait(10)
        return pending(self)

    monkeypatch.setattr(type(lane), "_pending_ends", held_up)
    prunes = [threading.Thread(target=lane._prune_warned) for _ in range(2)]
    prunes[0].start()
    assert inside.acquire(timeout=10)  # the first read the holds: none
    prunes[1].start()
    inside.acquire(timeout=0.5)  # (the second too, unless it left at once)
    monkeypatch.setattr(type(lane), "_pending_ends", pending)
    hold = lane.acquire("H")
    hold.__enter__()
    clock.advance(2)
    assert [s.key for s in lane.stuck(1)] == ["H"]  # logged: marked
    go.set()
    for prune in prunes:
        prune.join(10)
    assert ("H", hold.token) in lane._warned_holds
    hold.__exit__(None, None, None)


def test_a_log_handler_that_raises_leaves_no_hold_of_the_check_unlogged() -> None:
    """A handler that fails on the check's first line: the check's other holds are
    logged still (they were marked, then never logged by anyone), and the handler's
    error comes out of the check after them."""
    clock = FakeClock()
    lane = SessionLane("s", clock=clock, warn_hold_s=1.0)
    lines: list[str] = []

    class Flaky(logging.Handler):
        def handle(self, record: logging.LogRecord) -> bool:
            if not lines:
                lines.append("")
                raise OSError("log server hiccup")
            lines.append(record.getMessage())
            return True

    holds = [lane.acquire(f"k{i}") for i in range(5)]
    for hold in holds:
        hold.__enter__()
    clock.advance(2)
    handler = Flaky()
    logger = logging.getLogger("lanequeue")
    logger.addHandler(handler)
    try:
        with pytest.raises(OSError, match="hiccup"):
            lane.stuck(0)
    finally:
        logger.removeHandler(handler)
    assert sorted(line.split()[3] for line in lines[1:]) == ["'k1'", "'k2'", "'k3'", "'k4'"]
    for hold in holds:
        hold.__exit__(None, None, None)


@pytest.mark.parametrize("cls", [Lane, SessionLane])
@pytest.mark.parametrize("how", ["exit", "manual_release"])
def test_a_release_interrupted_after_its_report_is_not_logged_as_released(
    cls: Any, how: str, ends: _Ends, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An interrupt lands right after a release queued its report, before its commit:
    the hold is still held, so the report is not logged ("it has been released" would
    be false); the hold's real end logs it, once."""
    from lanequeue import _core

    then_interrupted, interrupt = _report_then_interrupt()

    monkeypatch.setattr(_core, "_report_later", then_interrupted)
    clock = FakeClock()
    lane = cls("l", clock=clock, warn_hold_s=1.0)
    hold = lane.acquire("k")
    hold.__enter__()
    token = hold.token
    clock.advance(2)
    with pytest.raises(KeyboardInterrupt):
        if how == "exit":
            hold.__exit__(None, None, None)
        else:
            lane.manual_release("k")
    assert not interrupt[0]  # (the interrupt did land there)
    assert list(lane.get_active()) == ["k"] and lane._core.owns("k", token)  # still held
    assert ends.settle() == []  # its report came and said nothing
    clock.advance(1)
    assert lane.manual_release("k")  # its real end
    assert ends.settle() == [
        f"lane 'l': key 'k' held its permit for 3.000 s (token {token}), past "
        "warn_hold_s; it has been released"]


def _twenty_behind_the_gate(lane: Any, gate: _Gate) -> None:
    """The reporter held up at key 'gate' of ``lane``, then 20 long holds 'k0'..'k19' end
    (``warn_hold_s`` 0): their reports wait behind it, or are missed."""
    with lane.acquire("gate"):
        pass
    assert gate.inside.wait(10)
    for i in range(20):
        with lane.acquire(f"k{i}"):
            pass


def test_reports_waiting_are_bounded_and_the_missed_ones_counted(
    ends: _Ends, gate: _Gate, caplog: pytest.LogCaptureFixture,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A log handler slower than the long holds come: at most REPORTS_MAX reports wait
    (each keeps its lane alive); the others are counted, and logged as a count."""
    from lanequeue import _core

    monkeypatch.setattr(_core, "REPORTS_MAX", 5)
    caplog.set_level(logging.WARNING, logger="lanequeue")
    lane = SessionLane("s", warn_hold_s=0.0)
    _twenty_behind_the_gate(lane, gate)
    assert _core._REPORTER.queue.qsize() <= 5
    gate.open.set()
    # the five queued are logged, then the count of the others (15, and the gate's own
    # report was taken before: 20 - 5)
    lines = ends.wait_for(6)
    assert [line.split()[3] for line in lines[1:]] == ["'k0'", "'k1'", "'k2'", "'k3'", "'k4'"]
    # The count comes after the last of them, from the reporter thread: wait for it.
    deadline = time.monotonic() + 10
    while not (missed := [r.getMessage() for r in caplog.records
                          if "were not logged" in r.getMessage()]):
        assert time.monotonic() < deadline
        time.sleep(0.001)
    assert [int(m.split()[0]) for m in missed] == [15]


def test_reports_missed_while_the_waiting_ones_are_logged_are_counted_in_one_line(
    ends: _Ends, gate: _Gate, caplog: pytest.LogCaptureFixture,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Reports keep being missed while the reporter logs the waiting ones (a slow
    handler, long holds still ending): the count was logged after every report that
    found misses, one line each. README: the others are counted in one line. Driven: the
    handler ends three more batches of long holds while it logs the first reports."""
    from lanequeue import _core

    monkeypatch.setattr(_core, "REPORTS_MAX", 5)
    caplog.set_level(logging.WARNING, logger="lanequeue")
    lane = SessionLane("s", warn_hold_s=0.0)
    more = SessionLane("more", warn_hold_s=0.0)
    batches: list[int] = []

    class EndsMore(logging.Handler):  # (on the reporter thread, as each line is logged)
        def emit(self, record: logging.LogRecord) -> None:
            if record.getMessage().startswith("lane 's': key 'k") and len(batches) < 3:
                batches.append(1)
                for i in range(10):
                    with more.acquire(f"m{len(batches)}-{i}"):
                        pass

    ending = EndsMore(logging.WARNING)
    logging.getLogger("lanequeue").addHandler(ending)
    try:
        _twenty_behind_the_gate(lane, gate)
        gate.open.set()
        deadline = time.monotonic() + 10
        while len(batches) < 3 or not _core._REPORTER.queue.empty():  # (then a probe can wait)
            assert time.monotonic() < deadline, (batches, _core._REPORTER.queue.qsize())
            time.sleep(0.001)
        ends.settle()
    finally:
        logging.getLogger("lanequeue").removeHandler(ending)
    assert len(batches) == 3
    missed = [r.getMessage() for r in caplog.records if "were not logged" in r.getMessage()]
    assert len(missed) == 1, missed
    logged = [r for r in caplog.records if "past warn_hold_s; it has been released" in
              r.getMessage() and not r.getMessage().startswith("lane 'probe'")]
    # Every report made is logged or counted: the gate's, 20 of 's', 30 of 'more'.
    assert len(logged) + int(missed[0].split()[0]) == 1 + 20 + 30


def test_turning_it_off_stops_measuring(ends: _Ends) -> None:
    lane = Lane("g", warn_hold_s=1.0)
    assert lane._core.hold_hist is not None
    lane.warn_hold_s = None
    assert lane._core.hold_hist is None and lane._core.hold_warn_s is None
    lane.track_holds()
    lane.warn_hold_s = 1.0
    lane.warn_hold_s = None
    assert lane._core.hold_hist is not None  # (shown to exporters: kept)


def test_a_queues_wait_idle_on_an_event_loops_thread_warns_once() -> None:
    import warnings

    queue = LaneQueue()
    queue.add_lane("global")
    assert queue["global"].try_acquire("x")

    async def main() -> None:
        with warnings.catch_warnings(record=True) as seen:
            warnings.simplefilter("always")
            assert queue.wait_idle(0.02) is False
            assert queue.drain(0.02) is False
        assert [str(w.message).split(":")[0] for w in seen] == ["LaneQueue"]
        assert seen[0].filename == __file__

    asyncio.run(main())
    assert queue["global"].manual_release("x")


def test_a_broken_handler_does_not_replace_a_cancellation(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """An asyncio wait without a timeout, cancelled past warn_after_s, logs as it ends:
    a log handler that raises there must not replace the CancelledError."""
    from lanequeue import AsyncSessionLane

    class Broken(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            raise RuntimeError("handler broken")

    logger = logging.getLogger("lanequeue")
    broken = Broken()

    async def main() -> None:
        lane = AsyncSessionLane(warn_after_s=0.01)
        assert await lane.try_acquire("k")

        async def wait() -> None:
            async with lane.acquire("k", timeout_s=None):
                pass

        task = asyncio.ensure_future(wait())
        await asyncio.sleep(0.05)
        logger.addHandler(broken)
        try:
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
        finally:
            logger.removeHandler(broken)
        assert task.cancelled() and lane.waiting == 0

    asyncio.run(main())
