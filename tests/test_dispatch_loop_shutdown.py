"""The asyncio Dispatcher when its event loop shuts down with work left: every ticket
still pending or running ends ``cancelled`` with reason ``"loop shut down"``, and no turn
starts any more (README, "Shutdown"). ``asyncio.run`` cancels every task of the loop when
its main coroutine returns or raises (Ctrl-C included); the dispatcher's own watch task
and the turns' tasks are among them, in an order the test chooses here."""

from __future__ import annotations

import asyncio
import signal
import threading
from collections.abc import Callable
from typing import Any

import pytest

from lanequeue import AsyncLaneQueue, Dispatcher, TurnCancelledError

WAIT = 5.0


def _queue() -> AsyncLaneQueue:
    q = AsyncLaneQueue()
    q.add_session_lane("session")
    q.add_lane("global", max_concurrent=4)
    return q


async def _reply(x: Any) -> Any:
    await asyncio.Event().wait()  # never returns by itself
    return x


def _check_ended(d: Dispatcher, tickets: list[Any]) -> None:
    assert [(t.state, t.reason) for t in tickets] == [("cancelled", "loop shut down")] * len(
        tickets)
    s = d.stats
    assert s.pending == 0 and s.running == 0 and s.cancelled == len(tickets)
    # A thread waiting for a ticket gets its end (the attack's sync caller hung here).
    got: list[Any] = []

    def wait() -> None:
        try:
            tickets[-1].result(WAIT)
        except TurnCancelledError as exc:
            got.append(exc.reason)

    th = threading.Thread(target=wait)
    th.start()
    th.join(WAIT)
    assert got == ["loop shut down"]


def test_asyncio_run_returning_with_turns_left_ends_every_ticket() -> None:
    """The attack's input: main returns without drain while a key has a running turn and
    three pending ones."""
    tickets: list[Any] = []
    holder: dict[str, Dispatcher] = {}

    async def main() -> None:
        d = holder["d"] = Dispatcher(_queue())
        tickets.extend(d.submit("conv", _reply, i) for i in range(4))
        tickets.append(d.submit("other", _reply, "x"))
        while not tickets[0].running():
            await asyncio.sleep(0)

    asyncio.run(main())
    _check_ended(holder["d"], tickets)


def test_ctrl_c_under_asyncio_run_ends_every_ticket() -> None:
    """Ctrl-C: asyncio.run cancels the main task, then every task, and raises
    KeyboardInterrupt; the tickets have ended by then."""
    tickets: list[Any] = []
    holder: dict[str, Dispatcher] = {}

    async def main() -> None:
        d = holder["d"] = Dispatcher(_queue())
        tickets.extend(d.submit("conv", _reply, i) for i in range(3))
        while not tickets[0].running():
            await asyncio.sleep(0)
        signal.raise_signal(signal.SIGINT)  # asyncio.run's handler cancels main
        await asyncio.Event().wait()

    # asyncio.run takes SIGINT over only from Python's default handler, which a process
    # started in the background by a shell does not have (SIGINT ignored): set it here.
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        with pytest.raises(KeyboardInterrupt):
            asyncio.run(main())
    finally:
        signal.signal(signal.SIGINT, previous)
    _check_ended(holder["d"], tickets)


def _shut_down_in_order(loop: asyncio.AbstractEventLoop,
                        submit: Callable[[Dispatcher], list[Any]],
                        watch_first: bool) -> tuple[Dispatcher, list[Any]]:
    """asyncio.run's shutdown, step by step, in a chosen order: a Dispatcher on ``loop``
    gets ``submit``'s tickets and runs the first; then every task of the loop is
    cancelled (the dispatcher's watch task first, or the running turn's), the loop runs
    until they are done, and no task is left pending (no turn started after it)."""
    async def setup() -> tuple[Dispatcher, list[Any]]:
        d = Dispatcher(_queue())
        ts = submit(d)
        while not ts[0].running():
            await asyncio.sleep(0)
        return d, ts

    d, tickets = loop.run_until_complete(setup())
    tasks = list(asyncio.all_tasks(loop))
    watch = [t for t in tasks if t.get_name() == "lanequeue-dispatch-watch"]
    turns = [t for t in tasks if t not in watch]
    assert len(watch) == 1 and len(turns) == 1
    for task in (watch + turns if watch_first else turns + watch):
        task.cancel()
    loop.run_until_complete(asyncio.gather(*tasks, return_exceptions=True))
    assert not [t for t in asyncio.all_tasks(loop) if not t.done()]  # none started
    return d, tickets


@pytest.mark.parametrize("first", ["turn", "watch", "turn_as_on_3.10"])
def test_loop_shutdown_in_either_order_starts_nothing_and_ends_everything(
        first: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """asyncio.run's shutdown, step by step: every task of the loop is cancelled (the
    running turn's task first, or the dispatcher's watch first), the loop runs until they
    are done, and is closed without running again: the key's next turn is never started
    (its task would be destroyed pending) and every ticket has ended, reason "loop shut
    down". On Python 3.10 (no ``Task.cancelling()``: a turn's task cannot tell an outside
    cancel from fn's own CancelledError) the running turn handled its cancellation first
    ended ``"cancelled"`` and the key's next turn got a task; it now tells the shutdown
    by the watch's cancelled wait. ``turn_as_on_3.10`` answers as 3.10 does on any
    Python."""
    if first == "turn_as_on_3.10":
        import lanequeue.dispatch._asyncio as face

        monkeypatch.setattr(face, "_cancelled_from_outside", lambda: False)
    loop = asyncio.new_event_loop()
    try:
        d, tickets = _shut_down_in_order(
            loop, lambda d: [d.submit("conv", _reply, i) for i in range(3)],
            watch_first=first == "watch")
        assert d.snapshot()["keys"] == {} and d._machine.is_idle()
    finally:
        loop.close()
    _check_ended(d, tickets)


@pytest.mark.timeout(30)
@pytest.mark.parametrize("how", ["own_task", "from_outside"])
def test_one_turn_task_cancelled_alone_is_not_the_loop_shutting_down(how: str) -> None:
    """A turn whose task alone is cancelled (``fn`` cancelling its own task, or code
    cancelling that one task) ends ``cancelled``, ``"cancelled"``; the turn of another
    conversation runs on, and later submits are taken. (It used to be taken for the
    loop's shutdown: the whole dispatcher closed, every other ticket ended "loop shut
    down" and every later submit raised DispatcherDrainingError.)"""
    async def main() -> None:
        d = Dispatcher(_queue())
        other_go = asyncio.Event()
        started = asyncio.Event()

        async def other() -> str:
            await other_go.wait()
            return "other"

        tasks: list[asyncio.Task[Any] | None] = []

        async def victim() -> str:
            tasks.append(asyncio.current_task())
            started.set()
            if how == "own_task":
                assert tasks[0] is not None
                tasks[0].cancel()
            await asyncio.Event().wait()  # the cancel lands here
            return "never"

        t_other = d.submit("b", other)
        t_victim = d.submit("a", victim)
        await started.wait()
        if how == "from_outside":
            assert tasks[0] is not None
            tasks[0].cancel()
        with pytest.raises(TurnCancelledError):
            await t_victim
        assert (t_victim.state, t_victim.reason) == ("cancelled", "cancelled")
        assert t_other.state == "running" and not d.draining
        other_go.set()
        assert await t_other == "other"
        assert await d.submit("a", _echo, "again") == "again"
        assert await d.drain(WAIT)

    asyncio.run(main())



@pytest.mark.timeout(30)
def test_a_turn_that_cancels_its_own_task_and_returns_does_not_close_an_idle_dispatcher(
) -> None:
    """``fn`` cancels its own task and returns without awaiting again, the dispatcher's
    only work: the cancel reaches the task only after ``fn``'s value was reported (the
    ticket ends ``done``: nothing was interrupted), and the dispatcher, idle by then,
    stays open. It used to take the task's end for the loop's shutdown, since no watch
    task was left to ask: closed for good, every later submit refused."""
    async def main() -> None:
        d = Dispatcher(_queue())

        async def gives_up(text: str) -> str:
            task = asyncio.current_task()
            assert task is not None
            task.cancel()
            return f"re: {text}"

        t1 = d.submit("a", gives_up, "stop")
        assert await t1 == "re: stop" and t1.state == "done"
        await asyncio.sleep(0)  # the task's own end (cancelled) is reaped
        await asyncio.sleep(0)
        assert not d.draining and not d.snapshot()["closed"]
        assert await d.submit("b", _echo, "again") == "again"
        assert await d.drain(WAIT)

    asyncio.run(main())


async def _echo(x: Any) -> Any:
    return x


def test_after_the_loop_shut_down_the_dispatcher_takes_no_turn() -> None:
    holder: dict[str, Any] = {}

    async def main() -> None:
        d = holder["d"] = Dispatcher(_queue())
        holder["t"] = d.submit("conv", _reply, 0)
        await asyncio.sleep(0)

    asyncio.run(main())
    d = holder["d"]
    assert d.draining and d.snapshot()["closed"]
    assert holder["t"].reason == "loop shut down"


def test_an_idle_dispatcher_leaves_no_task_behind() -> None:
    """The watch lives only while work is left: a loop closed without cancelling its
    tasks (no asyncio.run) finds none of the dispatcher's pending."""
    loop = asyncio.new_event_loop()
    try:
        async def main() -> Any:
            d = Dispatcher(_queue())

            async def quick(x: int) -> int:
                return x

            assert await d.submit("k", quick, 1) == 1
            assert await d.wait_idle(WAIT)
            await asyncio.sleep(0)  # the watch's last step
            return [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]

        assert loop.run_until_complete(main()) == []
    finally:
        loop.close()


def test_a_dispatcher_used_by_a_second_asyncio_run_says_why_and_what_to_do() -> None:
    """A Dispatcher belongs to the first event loop that submits: a second asyncio.run
    gets a RuntimeError that says its loop is closed and to make one per loop."""
    d = Dispatcher(_queue())

    async def echo(x: Any) -> Any:
        return x

    async def once() -> Any:
        return await d.submit("k", echo, 1)

    asyncio.run(once())
    with pytest.raises(RuntimeError, match=r"bound to another event loop \(closed now\), "
                       r"the first that called submit.*one per asyncio\.run"):
        asyncio.run(once())


@pytest.mark.timeout(30)
def test_a_shutdown_before_the_watch_task_ran_ends_a_ticket_that_has_no_task() -> None:
    """The loop shuts down before the dispatcher's watch task ran its first step (the
    submit came from a callback in the loop's last pass), and the ticket has no task of
    its own (it waits in a collect window): its coroutine never ran, so it could not see
    the shutdown, and the ticket stayed pending for good (a thread in ``result()`` timed
    out). The watch task's end tells it now, cancelled before its first step as well."""
    box: dict[str, Any] = {}

    async def main() -> None:
        d = box["d"] = Dispatcher(_queue(), busy="collect", debounce_s=10.0)
        asyncio.get_running_loop().call_soon(
            lambda: box.setdefault("t", d.submit("conv", _reply, "a")))

    asyncio.run(main())
    _check_ended(box["d"], [box["t"]])


async def _saving(log: list[str], tag: str, how: str) -> str:
    """A turn that catches its cancellation and returns (``swallow``) or raises another
    error (``convert``): a turn that saves its work when cancelled."""
    log.append(tag)
    try:
        await asyncio.Event().wait()
    except asyncio.CancelledError:
        if how == "swallow":
            return "saved"
        raise RuntimeError("cancelled while saving") from None
    return tag


@pytest.mark.timeout(30)
@pytest.mark.parametrize("factory", ["plain", "eager"])
@pytest.mark.parametrize("how", ["swallow", "convert"])
def test_a_turn_that_catches_the_shutdowns_cancel_ends_as_the_shutdown_says(
        how: str, factory: str) -> None:
    """The running turn's task is cancelled before the watch task (asyncio.run's order is
    a set's) and its fn catches the cancellation, then returns or raises another error:
    its ticket ended ``done`` or ``failed`` (about half of the runs), the key's next turn
    was launched, and with an eager task factory its fn ran during the shutdown. Now the
    turn tells the shutdown by the watch's cancelled wait: ``cancelled``, "loop shut
    down", and the next turn never starts."""
    if factory == "eager" and not hasattr(asyncio, "eager_task_factory"):
        pytest.skip("asyncio.eager_task_factory is Python 3.12+")
    started: list[str] = []
    loop = asyncio.new_event_loop()
    if factory == "eager":
        loop.set_task_factory(asyncio.eager_task_factory)  # type: ignore[attr-defined]
    try:
        d, tickets = _shut_down_in_order(
            loop, lambda d: [d.submit("conv", _saving, started, tag, how)
                             for tag in ("t1", "t2")], watch_first=False)
        assert started == ["t1"]  # t2's fn never ran
    finally:
        loop.close()
    _check_ended(d, tickets)
