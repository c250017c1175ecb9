"""A failed turn whose exception nobody took is logged when its ticket is collected.

As asyncio does for a task's exception never retrieved: a ``failed`` ticket dropped while
its exception was never taken (``result()``, ``exception()``, an ``await`` ending with it,
or a done-callback called with the ended ticket) logs it once, an ERROR on the
``lanequeue`` logger with the key, the ticket id and the exception's traceback. A ticket
that ends otherwise logs nothing. Both dispatchers.

Determinism: a thread turn's exception refers back to its ticket through the traceback
(the runner's frame), so the ticket goes only in a collection of cycles, once the runner
returned. The thread dispatchers here have one worker: a second turn's result, waited
for, tells that the first runner returned (the worker runs one at a time). The asyncio
tests collect after ``asyncio.run`` returned (every task ended, the loop closed).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import gc
import logging
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from conftest import asyncio_wait_takes_objects

from lanequeue import (
    Dispatcher,
    ThreadDispatcher,
    Ticket,
    build_default_async_lanes,
    build_default_lanes,
)

pytestmark = pytest.mark.timeout(60)

WAIT = 5.0
NEVER = "never retrieved"


class Boom(Exception):
    pass


def boom() -> None:
    raise Boom("the turn failed")


async def aboom() -> None:
    raise Boom("the turn failed")


def logged(caplog: pytest.LogCaptureFixture) -> list[logging.LogRecord]:
    return [r for r in caplog.records if r.name == "lanequeue" and NEVER in r.getMessage()]


@pytest.fixture
def caplog_errors(caplog: pytest.LogCaptureFixture) -> pytest.LogCaptureFixture:
    caplog.set_level(logging.ERROR, logger="lanequeue")
    return caplog


@pytest.fixture
def threads() -> Iterator[ThreadDispatcher]:
    d = ThreadDispatcher(build_default_lanes(), max_workers=1)
    yield d
    d.close()
    d.wait_idle(WAIT)


def runner_returned(d: ThreadDispatcher) -> None:
    """The one worker has left every runner before this turn's (see the docstring)."""
    assert d.submit("settle", lambda: "ok").result(WAIT) == "ok"


def failed_ticket(d: ThreadDispatcher, key: str = "k") -> Ticket:
    t = d.submit(key, boom)
    assert d.wait_idle(WAIT)
    assert t.state == "failed"
    return t


def collect_and_check(caplog: pytest.LogCaptureFixture, n: int) -> list[logging.LogRecord]:
    gc.collect()
    gc.collect()  # (a second pass logs nothing more)
    records = logged(caplog)
    assert len(records) == n, [r.getMessage() for r in records]
    return records


def check_record(record: logging.LogRecord, key: str, tid: int) -> None:
    assert record.levelno == logging.ERROR
    message = record.getMessage()
    assert f"ticket {tid} of key {key!r}" in message, message
    assert record.exc_info is not None
    kind, exc, tb = record.exc_info
    assert kind is Boom and isinstance(exc, Boom) and tb is not None
    # The traceback reaches the turn's own frame.
    frames = []
    while tb is not None:
        frames.append(tb.tb_frame.f_code.co_name)
        tb = tb.tb_next
    assert frames[-1] in ("boom", "aboom"), frames


# -- ThreadDispatcher --------------------------------------------------------------------


def test_thread_failed_never_retrieved_logs_once_when_collected(
        threads: ThreadDispatcher, caplog_errors: pytest.LogCaptureFixture) -> None:
    t = failed_ticket(threads)
    tid = t.id
    runner_returned(threads)
    gc.collect()
    assert logged(caplog_errors) == []  # (still referenced: nothing yet)
    del t
    [record] = collect_and_check(caplog_errors, 1)
    check_record(record, "k", tid)


@pytest.mark.parametrize("take", ["result", "exception", "callback_before", "callback_after"])
def test_thread_failed_and_retrieved_does_not_log(
        threads: ThreadDispatcher, caplog_errors: pytest.LogCaptureFixture, take: str) -> None:
    go = threading.Event()
    seen: list[str] = []

    def turn() -> None:
        go.wait(WAIT)
        raise Boom("late")

    t = threads.submit("k", turn)
    if take == "callback_before":
        t.add_done_callback(lambda x: seen.append(x.state))
    go.set()
    assert threads.wait_idle(WAIT)
    if take == "result":
        with pytest.raises(Boom):
            t.result(WAIT)
    elif take == "exception":
        assert isinstance(t.exception(WAIT), Boom)
    else:
        if take == "callback_after":
            t.add_done_callback(lambda x: seen.append(x.state))
        assert seen == ["failed"]
    runner_returned(threads)
    del t
    collect_and_check(caplog_errors, 0)


def test_thread_a_wait_that_timed_out_takes_nothing(
        threads: ThreadDispatcher, caplog_errors: pytest.LogCaptureFixture) -> None:
    """``result(0)`` / ``exception(0)`` on a ticket not ended yet take nothing, nor does
    a callback removed before the end: the failure that follows is logged."""
    go = threading.Event()

    def turn() -> None:
        go.wait(WAIT)
        raise Boom("late")

    def callback(_: Ticket) -> None:
        raise AssertionError("removed, never called")

    t = threads.submit("k", turn)
    with pytest.raises(concurrent.futures.TimeoutError):
        t.result(0)
    with pytest.raises(concurrent.futures.TimeoutError):
        t.exception(0)
    t.add_done_callback(callback)
    assert t.remove_done_callback(callback) == 1
    go.set()
    assert threads.wait_idle(WAIT)
    runner_returned(threads)
    del t
    collect_and_check(caplog_errors, 1)


def test_thread_turns_that_do_not_fail_do_not_log(
        threads: ThreadDispatcher, caplog_errors: pytest.LogCaptureFixture) -> None:
    go = threading.Event()
    busy = threads.submit("busy", go.wait, WAIT)
    tickets = [threads.submit("k", lambda: "fine"),
               threads.submit("busy", boom, busy="reject")]  # rejected: not failed
    cancelled = threads.submit("other", boom)
    assert cancelled.cancel()
    go.set()
    assert threads.wait_idle(WAIT)
    assert [t.state for t in tickets] == ["done", "rejected"]
    assert (busy.state, cancelled.state) == ("done", "cancelled")
    runner_returned(threads)
    del tickets, busy, cancelled
    collect_and_check(caplog_errors, 0)


def test_thread_the_log_takes_no_dispatcher_lock(
        threads: ThreadDispatcher, caplog_errors: pytest.LogCaptureFixture) -> None:
    """The garbage collector may run inside the dispatcher's locked sections, in any
    thread: the finaliser logs there without taking the dispatcher's lock (a plain
    ``threading.Lock``: taking it again would hang, bounded by the test's timeout)."""
    t = failed_ticket(threads)
    runner_returned(threads)
    del t
    with threads._machine._lock:
        gc.collect()
    collect_and_check(caplog_errors, 1)

    t = failed_ticket(threads)
    runner_returned(threads)
    del t
    other = threading.Thread(target=gc.collect)  # (from a thread of its own)
    other.start()
    other.join(WAIT)
    assert not other.is_alive()
    collect_and_check(caplog_errors, 2)


def test_a_failed_ticket_left_at_interpreter_exit_exits_cleanly() -> None:
    """At interpreter shutdown the finaliser may run with the logging torn down: it
    never raises (no "Exception ignored" on stderr), the process exits 0, and what it
    could still log says so."""
    code = (
        "import logging, sys\n"
        "logging.basicConfig(stream=sys.stderr, format='%(name)s %(levelname)s %(message)s')\n"
        "from lanequeue import ThreadDispatcher, build_default_lanes\n"
        "d = ThreadDispatcher(build_default_lanes(), max_workers=1)\n"
        "def boom():\n"
        "    raise ValueError('left at exit')\n"
        "T = d.submit('k', boom)\n"
        "assert d.wait_idle(5) and T.state == 'failed'\n"
        "assert d.submit('s', int).result(5) == 0\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=60)
    assert out.returncode == 0, out.stderr
    assert "Exception ignored" not in out.stderr, out.stderr
    assert "lanequeue ERROR ticket 1 of key 'k' failed" in out.stderr, out.stderr
    assert "ValueError: left at exit" in out.stderr


# -- Dispatcher (asyncio) ----------------------------------------------------------------


def run_async(main: Callable[[Dispatcher], Any]) -> None:
    """Run ``main(dispatcher)`` to its end; the caller collects afterwards."""

    async def outer() -> None:
        d = Dispatcher(build_default_async_lanes())
        await main(d)
        assert await d.drain(WAIT)

    asyncio.run(outer())


def test_async_failed_never_retrieved_logs_once_when_collected(
        caplog_errors: pytest.LogCaptureFixture) -> None:
    tids: list[int] = []

    async def main(d: Dispatcher) -> None:
        t = d.submit("k", aboom)
        tids.append(t.id)
        assert await d.wait_idle(WAIT)
        assert t.state == "failed"

    run_async(main)
    [record] = collect_and_check(caplog_errors, 1)
    check_record(record, "k", tids[0])


@pytest.mark.parametrize("take", ["await", "result", "exception", "callback_before",
                                  "callback_after", "gather"])
def test_async_failed_and_retrieved_does_not_log(
        caplog_errors: pytest.LogCaptureFixture, take: str) -> None:
    async def main(d: Dispatcher) -> None:
        go = asyncio.Event()
        seen: list[str] = []

        async def turn() -> None:
            await go.wait()
            raise Boom("late")

        t = d.submit("k", turn)
        if take == "callback_before":
            t.add_done_callback(lambda x: seen.append(x.state))
        go.set()
        if take == "await":
            with pytest.raises(Boom):
                await t
        elif take == "gather":
            [got] = await asyncio.gather(t, return_exceptions=True)
            assert isinstance(got, Boom)
        else:
            assert await d.wait_idle(WAIT)
            if take == "result":
                with pytest.raises(Boom):
                    t.result(0)
            elif take == "exception":
                assert isinstance(t.exception(0), Boom)
            else:
                if take == "callback_after":
                    t.add_done_callback(lambda x: seen.append(x.state))
                assert seen == ["failed"]

    run_async(main)
    collect_and_check(caplog_errors, 0)


def test_async_an_await_cancelled_before_the_end_takes_nothing(
        caplog_errors: pytest.LogCaptureFixture) -> None:
    """An ``await ticket`` ended before the ticket (``wait_for``'s timeout) takes nothing:
    its wake-up callback goes with it, and the failure that follows is logged."""

    async def main(d: Dispatcher) -> None:
        go = asyncio.Event()

        async def turn() -> None:
            await go.wait()
            raise Boom("late")

        t = d.submit("k", turn)
        with pytest.raises(asyncio.TimeoutError):
            await asyncio.wait_for(t, 0.01)  # (the turn waits for go: it cannot end)
        assert t._callbacks is not None and all(c.dead for c in t._callbacks)
        go.set()
        assert await d.wait_idle(WAIT)
        assert t.state == "failed"

    run_async(main)
    collect_and_check(caplog_errors, 1)


@asyncio_wait_takes_objects
@pytest.mark.parametrize("read", [False, True])
def test_async_asyncio_wait_is_not_a_taking(
        caplog_errors: pytest.LogCaptureFixture, read: bool) -> None:
    """``asyncio.wait`` attaches a done-callback of its own, which only collects the done
    tickets: the failure is taken when its caller reads it, and logged otherwise."""

    async def main(d: Dispatcher) -> None:
        t = d.submit("k", aboom)
        done, pending = await asyncio.wait([t])
        assert done == {t} and not pending
        if read:
            assert isinstance(t.exception(0), Boom)

    run_async(main)
    collect_and_check(caplog_errors, 0 if read else 1)


def test_async_turns_that_do_not_fail_do_not_log(
        caplog_errors: pytest.LogCaptureFixture) -> None:
    async def main(d: Dispatcher) -> None:
        async def fine() -> str:
            return "fine"

        tickets = [d.submit("k", fine), d.submit("k", aboom, busy="reject")]
        assert await d.wait_idle(WAIT)
        assert [t.state for t in tickets] == ["done", "rejected"]

    run_async(main)
    collect_and_check(caplog_errors, 0)


@pytest.mark.timeout(30)
def test_an_abandoned_asyncio_wait_collected_inside_a_dispatcher_lock_does_not_deadlock(
    threads: ThreadDispatcher,
) -> None:
    """``asyncio.wait`` over a ticket on a loop closed with the wait pending: its
    coroutine stays in a garbage cycle; the collector may close it in a thread inside a
    section that holds the dispatcher's lock, and its ``finally`` removes its callback:
    that removal takes no lock (it took it: the thread hung for good)."""
    go = threading.Event()
    t = threads.submit("k", go.wait, WAIT)
    loop = asyncio.new_event_loop()
    task = loop.create_task(asyncio.wait([t]))
    loop.run_until_complete(asyncio.sleep(0))  # the wait's callback is on the ticket
    loop.close()  # abandoned, pending
    del task
    go.set()
    assert threads.wait_idle(WAIT)

    def collect_in_lock() -> None:
        with threads._machine._lock:
            gc.collect()

    th = threading.Thread(target=collect_in_lock, daemon=True)
    th.start()
    th.join(WAIT)
    assert not th.is_alive(), "a collection inside the dispatcher's lock hung"
    assert threads._machine._lock.acquire(timeout=WAIT)
    threads._machine._lock.release()


@asyncio_wait_takes_objects
@pytest.mark.timeout(30)
def test_asyncio_wait_first_exception_returns_at_the_first_failure_and_takes_nothing(
    caplog_errors: pytest.LogCaptureFixture,
) -> None:
    """``asyncio.wait(..., return_when=FIRST_EXCEPTION)`` calls ``exception()`` of an
    ended ticket on the loop: it returns at the first failure (``exception()`` refused
    on the loop's thread, as if the ended ticket could block), and that read is not the
    caller's (a failed ThreadDispatcher ticket never read still logs; read, it does
    not)."""

    async def main() -> None:
        queue = build_default_async_lanes()
        d = Dispatcher(queue)
        gate = asyncio.Event()

        async def slow() -> str:
            await gate.wait()
            return "late"

        fast = d.submit("a", boom)
        late = d.submit("b", slow)
        done, pending = await asyncio.wait([fast, late], timeout=WAIT,
                                           return_when=asyncio.FIRST_EXCEPTION)
        assert done == {fast} and pending == {late}
        assert isinstance(fast.exception(0), Boom)  # (a poll: on the loop, no wait)
        gate.set()
        assert await late == "late"
        assert await d.drain(WAIT)

    asyncio.run(main())
    assert [r for r in caplog_errors.records if r.levelno >= logging.ERROR] == []

    d = ThreadDispatcher(build_default_lanes())
    try:
        async def waits() -> None:
            t = d.submit("k", boom)
            done, _ = await asyncio.wait([t], timeout=WAIT,
                                         return_when=asyncio.FIRST_EXCEPTION)
            assert done == {t}

        asyncio.run(waits())
        assert d.wait_idle(WAIT)
    finally:
        d.close()
    collect_and_check(caplog_errors, 1)


def test_a_public_asyncio_function_as_a_callback_takes_the_outcome(
    threads: ThreadDispatcher, caplog_errors: pytest.LogCaptureFixture,
) -> None:
    """A callback the caller hands over takes charge of a failed ticket, also a public
    function of asyncio (``queue.put_nowait``): only asyncio's private callbacks (its
    ``asyncio.wait``'s) do not."""
    got: asyncio.Queue[Ticket] = asyncio.Queue()
    t = failed_ticket(threads)
    t.add_done_callback(got.put_nowait)
    assert got.get_nowait() is t
    del t
    collect_and_check(caplog_errors, 0)


@pytest.mark.skipif(not hasattr(__import__("os"), "fork"), reason="POSIX only")
def test_a_forked_child_does_not_log_its_parents_tickets(
    threads: ThreadDispatcher, caplog_errors: pytest.LogCaptureFixture,
) -> None:
    """A child made by fork has copies of the parent's failed tickets: they are the
    parent's to read, and the child does not log them when it collects them."""
    import os

    t = failed_ticket(threads)
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            records: list[str] = []

            class Catch(logging.Handler):
                def emit(self, record: logging.LogRecord) -> None:
                    records.append(record.getMessage())

            logging.getLogger("lanequeue").addHandler(Catch())
            del t  # (the child's copy of the parent's ticket, dropped here)
            gc.collect()
            os.write(write, repr(records).encode())
            code = 0
        finally:
            os._exit(code)
    os.close(write)
    with os.fdopen(read, "rb") as pipe:
        out = pipe.read().decode()
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    assert NEVER not in out, out
    assert isinstance(t.exception(), Boom)
