"""A dispatcher's blocking wait from a thread that runs an asyncio event loop warns.

``ticket.result(timeout)`` / ``exception(timeout)`` that has to wait, and a
``ThreadDispatcher``'s ``drain`` / ``wait_idle`` that has to wait, block the calling
thread: on a thread that runs an event loop they stop the loop. As the thread lanes do
(``LoopWaitWarner`` in ``lanequeue._ops``), the first such call of a dispatcher warns, a
``RuntimeWarning`` pointing at the caller's line; a call that does not block (an ended
ticket, a timeout of 0, an idle dispatcher) does not, nor does a wait from a thread that
runs no loop (``asyncio.to_thread``'s workers, plain threads). On the thread of the
asyncio ``Dispatcher``'s own loop, a wait for its ticket raises RuntimeError instead (the
turn runs on that loop: it could never end in time).

Every turn here waits for an event the test sets; a wait meant to block times out after
0.01 s (its turn cannot end before the test lets it).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
import warnings
from collections.abc import Iterator

import pytest

from lanequeue import (
    Dispatcher,
    ThreadDispatcher,
    Ticket,
    build_default_async_lanes,
    build_default_lanes,
)

pytestmark = pytest.mark.timeout(60)

WAIT = 5.0
SHORT = 0.01  # a wait that must time out (its turn waits for the test)


def runtime_warnings(seen: list[warnings.WarningMessage]) -> list[warnings.WarningMessage]:
    return [w for w in seen if issubclass(w.category, RuntimeWarning)]


@pytest.fixture
def recorded() -> Iterator[list[warnings.WarningMessage]]:
    """Every warning of the test, from any thread, each one shown."""
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        yield seen


@pytest.fixture
def blocked() -> Iterator[tuple[ThreadDispatcher, threading.Event, Ticket, Ticket]]:
    """A ThreadDispatcher with one ticket ended (``ended``) and one whose turn runs until
    the test sets ``go`` (``running``)."""
    d = ThreadDispatcher(build_default_lanes())
    go = threading.Event()
    ended = d.submit("ended", lambda: "ended")
    assert ended.result(WAIT) == "ended"
    running = d.submit("k", lambda: "ok" if go.wait(WAIT) else "no go")
    yield d, go, ended, running
    go.set()
    d.close()
    assert d.wait_idle(WAIT)


def test_thread_ticket_wait_on_a_loop_thread_warns_once_when_it_blocks(
        blocked: tuple[ThreadDispatcher, threading.Event, Ticket, Ticket],
        recorded: list[warnings.WarningMessage]) -> None:
    d, go, ended, running = blocked
    lines: list[int] = []

    async def main() -> None:
        # None of these blocks: no warning.
        assert ended.result(WAIT) == "ended"
        assert ended.exception(WAIT) is None
        for wait in (running.result, running.exception):
            with pytest.raises(concurrent.futures.TimeoutError):
                wait(0)
        assert runtime_warnings(recorded) == []
        # A wait that blocks the loop: one warning, at this line.
        with pytest.raises(concurrent.futures.TimeoutError):
            lines.append(_line()); running.result(SHORT)  # noqa: E702
        # Once per dispatcher: the next blocking waits say nothing.
        with pytest.raises(concurrent.futures.TimeoutError):
            running.exception(SHORT)
        assert d.wait_idle(SHORT) is False

    asyncio.run(main())
    [w] = runtime_warnings(recorded)
    assert (w.filename, w.lineno) == (__file__, lines[0])
    message = str(w.message)
    assert message.startswith("ThreadDispatcher: a blocking ticket.result() from a thread "
                              "that runs an asyncio event loop"), message
    assert "await ticket" in message and "asyncio.to_thread" in message
    go.set()
    assert running.result(WAIT) == "ok"


def _line() -> int:
    """The caller's line number."""
    import sys

    return sys._getframe(1).f_lineno


def test_thread_ticket_wait_off_the_loop_thread_does_not_warn(
        blocked: tuple[ThreadDispatcher, threading.Event, Ticket, Ticket],
        recorded: list[warnings.WarningMessage]) -> None:
    """A blocking wait in ``asyncio.to_thread``'s worker or a plain thread, while a loop
    runs in another thread, blocks no loop: no warning. The loop thread's own wait then
    is the dispatcher's first, and warns."""
    running = blocked[3]

    def wait_short() -> str:
        try:
            running.result(SHORT)
        except concurrent.futures.TimeoutError:
            return "timed out"
        return "ended"

    async def main() -> None:
        assert await asyncio.to_thread(wait_short) == "timed out"
        plain = concurrent.futures.Future[str]()
        thread = threading.Thread(target=lambda: plain.set_result(wait_short()))
        thread.start()
        assert await asyncio.wrap_future(plain) == "timed out"
        thread.join(WAIT)
        assert runtime_warnings(recorded) == []
        with pytest.raises(concurrent.futures.TimeoutError):
            running.result(SHORT)

    asyncio.run(main())
    [w] = runtime_warnings(recorded)
    assert w.filename == __file__


def test_await_of_a_thread_dispatcher_ticket_works_from_an_event_loop(
        blocked: tuple[ThreadDispatcher, threading.Event, Ticket, Ticket],
        recorded: list[warnings.WarningMessage]) -> None:
    """What the warning advises: ``await ticket`` works for a ThreadDispatcher's ticket
    (the worker thread that ends it wakes the awaiting task through its loop), and
    blocks nothing."""
    _, go, _, running = blocked

    async def main() -> str:
        entered = asyncio.Event()

        async def await_it() -> str:
            entered.set()
            got: str = await running
            return got

        task = asyncio.create_task(await_it())
        await entered.wait()  # (await_it is now suspended inside ``await running``)
        assert not running.done() and running._callbacks  # (it ends only after go)
        go.set()
        return await task

    assert asyncio.run(main()) == "ok"
    assert runtime_warnings(recorded) == []


@pytest.mark.parametrize("call", ["wait_idle", "drain"])
def test_thread_drain_and_wait_idle_on_a_loop_thread_warn_once_when_they_block(
        recorded: list[warnings.WarningMessage], call: str) -> None:
    d = ThreadDispatcher(build_default_lanes())
    go = threading.Event()
    lines: list[int] = []
    try:
        async def main() -> None:
            # Idle: neither blocks, whatever the timeout.
            assert d.wait_idle(WAIT) is True
            running = d.submit("k", go.wait, WAIT)
            assert d.wait_idle(0) is False  # (0: does not wait)
            assert runtime_warnings(recorded) == []
            wait = getattr(d, call)
            lines.append(_line()); assert wait(SHORT) is False  # noqa: E702
            assert d.wait_idle(SHORT) is False  # (once per dispatcher)
            with pytest.raises(concurrent.futures.TimeoutError):
                running.result(SHORT)
            go.set()
            assert running.result(WAIT) is True  # (ended meanwhile or not: warned already)

        asyncio.run(main())
    finally:
        go.set()
        d.close()
    [w] = runtime_warnings(recorded)
    assert (w.filename, w.lineno) == (__file__, lines[0])
    assert str(w.message).startswith(f"ThreadDispatcher: a blocking {call}() from a thread "
                                     "that runs an asyncio event loop")


def test_thread_drain_of_an_idle_dispatcher_on_a_loop_thread_does_not_warn(
        recorded: list[warnings.WarningMessage]) -> None:
    d = ThreadDispatcher(build_default_lanes())
    assert d.submit("k", int).result(WAIT) == 0  # (here, off the loop: it may wait)

    async def main() -> None:
        assert d.drain(WAIT) is True
        assert d.wait_idle(None) is True

    asyncio.run(main())
    d.close()
    assert runtime_warnings(recorded) == []


def test_async_dispatcher_ticket_wait_on_another_loop_thread_warns_once(
        recorded: list[warnings.WarningMessage]) -> None:
    """A ``Dispatcher`` runs on loop A (a thread of its own); a wait for its ticket from
    the thread of loop B blocks loop B: it warns once (the turn, on loop A, goes on).
    On loop A's own thread the wait raises RuntimeError, without a warning."""
    loop_a = asyncio.new_event_loop()
    thread_a = threading.Thread(target=loop_a.run_forever)
    thread_a.start()
    lines: list[int] = []
    try:
        async def setup() -> tuple[Dispatcher, asyncio.Event, Ticket, Ticket]:
            d = Dispatcher(build_default_async_lanes())
            go = asyncio.Event()

            async def turn() -> str:
                await go.wait()
                return "ok"

            async def fine() -> str:
                return "ended"

            ended = d.submit("ended", fine)
            assert await ended == "ended"
            running = d.submit("k", turn)
            with pytest.raises(RuntimeError, match="would block the event loop"):
                running.result(SHORT)  # (loop A's own thread)
            return d, go, ended, running

        d, go, ended, running = asyncio.run_coroutine_threadsafe(
            setup(), loop_a).result(WAIT)
        assert runtime_warnings(recorded) == []

        async def main() -> str:  # loop B, this thread
            assert ended.result(WAIT) == "ended"
            with pytest.raises(concurrent.futures.TimeoutError):
                running.result(0)
            assert runtime_warnings(recorded) == []
            with pytest.raises(concurrent.futures.TimeoutError):
                lines.append(_line()); running.exception(SHORT)  # noqa: E702
            with pytest.raises(concurrent.futures.TimeoutError):
                running.result(SHORT)
            loop_a.call_soon_threadsafe(go.set)
            got: str = await running  # (what the warning advises: from any loop)
            return got

        assert asyncio.run(main()) == "ok"
        assert asyncio.run_coroutine_threadsafe(d.drain(WAIT), loop_a).result(WAIT)
    finally:
        loop_a.call_soon_threadsafe(loop_a.stop)
        thread_a.join(WAIT)
        loop_a.close()
    [w] = runtime_warnings(recorded)
    assert (w.filename, w.lineno) == (__file__, lines[0])
    assert str(w.message).startswith("Dispatcher: a blocking ticket.exception() from a "
                                     "thread that runs an asyncio event loop")


def test_async_dispatcher_wait_on_its_own_loop_raises_also_for_a_failed_ticket(
        recorded: list[warnings.WarningMessage]) -> None:
    """On the ``Dispatcher``'s own loop thread, ``exception(timeout)`` with a timeout
    other than 0 raises the RuntimeError, as ``result`` does, also once the ticket
    failed: it used to return that RuntimeError as if it were the turn's exception.
    ``exception(0)`` returns the turn's own exception; no warning either way."""

    class Boom(Exception):
        pass

    async def main() -> None:
        d = Dispatcher(build_default_async_lanes())

        async def boom() -> None:
            raise Boom("the turn's own")

        t = d.submit("k", boom)
        assert await d.wait_idle(WAIT)
        assert t.state == "failed"
        for wait in (t.exception, t.result):
            with pytest.raises(RuntimeError, match="would block the event loop"):
                wait(WAIT)
        assert isinstance(t.exception(0), Boom)
        with pytest.raises(Boom):
            t.result(0)

    asyncio.run(main())
    assert runtime_warnings(recorded) == []
