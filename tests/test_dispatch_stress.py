"""100,000 turns over 1,000 keys under ``interrupt`` and ``collect`` on the asyncio
Dispatcher, on a stepped fake-clock loop: no key ever runs two turns at once, the books
balance (submitted = the sum of the terminal states), and once the dedupe window has
passed on the fake clock the dispatcher's memory is back to its baseline (no ticket, job,
turn or key record alive, every table back to its size after a warm-up, no task or timer
left)."""

from __future__ import annotations

import asyncio
import gc
import random
import sys
from collections import Counter

import pytest
from conftest import FakeClockLoop, asyncio_wait_takes_objects

from lanequeue import AsyncLaneQueue, Dispatcher, Ticket, Turn, current_turn
from lanequeue.dispatch._machine import Job, _Key

TURNS = 100_000
KEYS = 1_000
BATCH = 2_000
TTL_S = 60.0


@pytest.mark.timeout(60)
def test_stress_100k_turns_1k_keys_interrupt_and_collect() -> None:
    loop = FakeClockLoop()
    try:
        queue = AsyncLaneQueue()
        queue.add_session_lane("session", max_sessions=2 * KEYS)
        queue.add_lane("global", max_concurrent=64)
        d = Dispatcher(queue, dedupe_ttl_s=TTL_S, dedupe_max=TURNS)
        active: set[str] = set()
        overlaps = 0
        calls = 0

        async def work(payload: object) -> None:
            nonlocal overlaps, calls
            key = current_turn().key
            if key in active:
                overlaps += 1
            active.add(key)
            calls += 1
            try:
                await asyncio.sleep(0)  # one loop step: interrupts land here
                await asyncio.sleep(0)
            finally:
                active.discard(key)

        rng = random.Random(11)
        keys = [f"conv-{i}" for i in range(KEYS)]

        key_of: dict[int, str] = {}

        async def submit_batch(start: int, n: int) -> None:
            for i in range(start, start + n):
                key = keys[rng.randrange(KEYS)]
                busy = "interrupt" if i % 2 else "collect"
                dedupe = f"m{i}"
                if i and i % 10 == 0:
                    # One submit in ten repeats an earlier id (a redelivered webhook, to
                    # its own conversation: an id names one turn of the dispatcher).
                    j = rng.randrange(i)
                    dedupe, key = f"m{j}", key_of[j]
                key_of[i] = key
                d.submit(key, work, i, busy=busy, dedupe_id=dedupe)
                if i % 50 == 0:
                    await asyncio.sleep(0)  # let turns start and run between submits

        def run_all(start: int, total: int) -> None:
            for b in range(start, start + total, BATCH):
                loop.create_task(submit_batch(b, BATCH))
                loop.settle()
            for _ in range(100):
                if d.snapshot()["keys"] == {}:
                    break
                loop.advance(0.001)

        def footprint() -> dict[str, int]:
            """The dispatcher's memory: its live objects by type, and its tables' sizes."""
            m = d._machine
            # This dispatcher's own objects (another test's leftovers, alive until their
            # threads end or a collection runs, are not this one's footprint).
            mine = {id(k) for k in m._keys.values()}
            live = Counter(type(o).__name__ for o in gc.get_objects()
                           if (isinstance(o, Ticket) and o._machine is m)
                           or (isinstance(o, Job) and o.machine is m)
                           or (isinstance(o, Turn) and o._job.machine is m)
                           or (isinstance(o, _Key) and id(o) in mine))
            return {
                **{f"live {name}": live[name] for name in ("Ticket", "Job", "Turn", "_Key")},
                "keys table B": sys.getsizeof(m._keys),
                "dedupe table B": sys.getsizeof(m._dedupe),
                "deadline heap B": sys.getsizeof(m._deadlines),
                "ready heap B": sys.getsizeof(m._ready),
                "tasks": len(d._tasks),
                "loop timers": sum(1 for h in loop._scheduled  # type: ignore[attr-defined]
                                   if not h.cancelled()),
            }

        # Warm-up: every key and every structure touched once, then the baseline.
        run_all(0, 2 * KEYS)
        loop.advance(TTL_S + 1)
        gc.collect()
        base = footprint()

        run_all(2 * KEYS, TURNS)
        s = d.stats
        assert overlaps == 0
        assert s.pending == 0 and s.running == 0
        assert s.submitted + s.deduped == TURNS + 2 * KEYS
        assert s.submitted == s.done + s.failed + s.cancelled + s.dropped + s.rejected \
            + s.timed_out
        assert s.failed == 0 and s.rejected == 0 and s.timed_out == 0
        # Interrupts hit running turns (cancelled) and pending ones (dropped); collect merged.
        assert s.done > 0 and s.cancelled > 0 and s.dropped > 0 and s.merged > 0
        assert calls < s.submitted  # merged and dropped turns made fewer calls
        assert d.snapshot()["dedupe_entries"] > 0

        loop.advance(TTL_S + 1)  # the dedupe window passes on the fake clock
        gc.collect()
        after = footprint()
        snap = d.snapshot()
        assert snap["keys"] == {} and snap["dedupe_entries"] == 0
        assert after == base, (base, after)
        assert base["live Ticket"] == base["live Job"] == base["tasks"] == 0
        print(f"\n{s}\nfootprint after the window: {after}")
    finally:
        loop.shutdown()


@pytest.mark.timeout(60)
@pytest.mark.parametrize("how", ["timeout 0", "cancelled", "low priority"])
def test_turns_ended_before_the_gate_admits_them_are_not_kept_while_it_is_busy(
    how: str,
) -> None:
    """While one long turn holds the gate (a global lane of one permit), 20,000 turns of
    new keys end before admission: their start timeout is 0, they are cancelled, or
    (with ``ageing_s=None``) they wait behind a priority-0 turn and are cancelled. Each
    left an abandoned job in the gate's heap, kept until the gate popped it: memory grew
    by one job per such turn for as long as the gate stayed busy. Now the heap is
    rebuilt once abandoned jobs are most of it, so it stays within twice its live jobs
    plus 65, and no abandoned job outlives the rebuild."""
    import threading

    from lanequeue import LaneQueue, ThreadDispatcher

    queue = LaneQueue(warn_after_s=None)
    queue.add_session_lane("session")
    queue.add_lane("global", max_concurrent=1)
    d = ThreadDispatcher(queue, ageing_s=None)
    release = threading.Event()
    try:
        long_turn = d.submit("long", release.wait, 30)
        for _ in range(3000):  # (3 s at most)
            if long_turn.state == "running":
                break
            release.wait(0.001)
        assert long_turn.state == "running"
        m = d._machine
        queued = d.submit("queued", release.wait, 30)  # a live job at the gate
        high = 0
        for i in range(20_000):
            if how == "timeout 0":
                t = d.submit(f"conv-{i}", print, timeout_s=0)
            else:
                t = d.submit(f"conv-{i}", print, priority=-1 if how == "low priority" else 0)
                assert t.cancel()
            assert t.state in ("timed_out", "cancelled")
            high = max(high, len(m._ready))
        assert queued.state == "pending"
        assert high <= 2 * 1 + 65, high
        gc.collect()
        abandoned = [o for o in gc.get_objects()
                     if isinstance(o, Job) and o.machine is m and o.abandoned]
        assert len(abandoned) <= 65, len(abandoned)
        assert d.snapshot()["ready"] == 1
    finally:
        release.set()
        assert d.drain(10)
        d.close()


@pytest.mark.timeout(60)
def test_awaits_of_a_ticket_that_are_cancelled_leave_nothing_on_it() -> None:
    """A client polls a long turn's ticket (``asyncio.wait_for(ticket, t)`` timing out,
    500 times) while another task awaits it to its end: no poll leaves its wake-up on
    the ticket (each used to, until the ticket ended: memory grew with every poll), and
    the awaiting task still gets the value."""

    async def main() -> None:
        d = _session_dispatcher()
        gate = asyncio.Event()

        async def long_turn() -> str:
            await gate.wait()
            return "done"

        ticket = d.submit("conv", long_turn, timeout_s=None)
        waiter = asyncio.ensure_future(_awaited(ticket))
        await asyncio.sleep(0)
        for _ in range(500):
            with pytest.raises(asyncio.TimeoutError):
                await asyncio.wait_for(ticket, 0.0001)
        # one live callback (the waiter's); the polls' are inert (removed without the
        # dispatcher's lock) and purged as callbacks are added: a bounded few remain
        assert ticket._callbacks is not None and len(ticket._callbacks) <= 9
        assert [c for c in ticket._callbacks if not c.dead] == [ticket._callbacks[0]]
        gate.set()
        assert await waiter == "done"
        assert await d.drain(5)

    asyncio.run(main())


def _session_dispatcher() -> Dispatcher:
    """An asyncio dispatcher over one session lane."""
    queue = AsyncLaneQueue()
    queue.add_session_lane("session")
    return Dispatcher(queue, lanes=["session"])


async def _awaited(ticket: Ticket) -> object:
    return await ticket


@asyncio_wait_takes_objects
@pytest.mark.timeout(30)
def test_asyncio_wait_takes_tickets_and_leaves_no_callback() -> None:
    """``asyncio.wait`` takes tickets, as ``gather`` and ``wait_for`` do (it used to
    fail with AttributeError: no ``remove_done_callback``): with a timeout that passes
    first it returns them pending and takes its callbacks off them; once they end, all
    done."""

    async def main() -> None:
        d = _session_dispatcher()
        gate = asyncio.Event()

        async def turn(x: int) -> int:
            await gate.wait()
            return x

        tickets = [d.submit(f"k{i}", turn, i) for i in range(3)]
        done, pending = await asyncio.wait(tickets, timeout=0.01)
        assert not done and pending == set(tickets)
        assert all(t._callbacks is not None and all(c.dead for c in t._callbacks)
                   for t in tickets)  # (inert: removed without the dispatcher's lock)
        gate.set()
        done, pending = await asyncio.wait(tickets)
        assert done == set(tickets) and not pending
        assert sorted([await t for t in tickets]) == [0, 1, 2]
        assert await d.drain(5)

    asyncio.run(main())


@asyncio_wait_takes_objects
@pytest.mark.timeout(30)
def test_asyncio_wait_and_as_completed_wake_for_a_thread_dispatchers_tickets() -> None:
    """A ThreadDispatcher's ticket ends in a worker thread: asyncio's own callbacks on it
    (``asyncio.wait``'s, ``as_completed``'s) run on their loop, which wakes. They used to
    run in the worker and set a loop future without waking the loop: ``asyncio.wait``
    hung until something else woke the loop (here, its 20 s timeout)."""
    import threading
    import time

    from lanequeue import LaneQueue, ThreadDispatcher

    queue = LaneQueue()
    queue.add_session_lane("session")
    d = ThreadDispatcher(queue, lanes=["session"])
    gate = threading.Event()
    try:
        async def main() -> None:
            loop = asyncio.get_running_loop()
            t1 = d.submit("a", gate.wait, 20)
            t2 = d.submit("b", gate.wait, 20)
            loop.call_later(0.05, gate.set)  # (the loop's timer; the wait has begun)
            began = time.monotonic()
            done, pending = await asyncio.wait([t1], timeout=20)
            assert done == {t1} and not pending
            assert time.monotonic() - began < 10
            for next_done in asyncio.as_completed([t2], timeout=20):
                assert await next_done is True
            assert time.monotonic() - began < 10
            for _ in range(2000):  # (the worker drops a called callback just after)
                if t1._callbacks is None and t2._callbacks is None:
                    break
                await asyncio.sleep(0.001)
            assert t1._callbacks is None and t2._callbacks is None  # none left behind

        asyncio.run(main())
    finally:
        gate.set()
        assert d.drain(10)
        d.close()


@pytest.mark.timeout(30)
def test_an_await_of_a_ticket_closed_unfinished_takes_no_lock() -> None:
    """An ``await ticket`` closed unfinished (its loop closed; the garbage collector
    finalizing the coroutine, in any thread, maybe one inside a dispatcher step that
    holds the dispatcher's lock) takes no lock: it used to take it to remove its
    callback, and a thread that held it deadlocked for good."""
    import threading

    async def main() -> None:
        d = _session_dispatcher()
        gate = asyncio.Event()

        async def turn() -> str:
            await gate.wait()
            return "done"

        ticket = d.submit("k", turn)
        coro = _awaited(ticket)
        coro.send(None)  # suspended inside ``await ticket``
        lock = d._machine._lock
        lock.acquire()  # as a dispatcher step in this thread would
        try:
            closer = threading.Thread(target=coro.close, daemon=True)
            closer.start()
            closer.join(2.0)
            assert not closer.is_alive(), "closing the await waited for the lock"
        finally:
            lock.release()
        closer.join(2.0)
        gate.set()
        assert await ticket == "done"
        assert await d.drain(5)

    asyncio.run(main())


@asyncio_wait_takes_objects
@pytest.mark.timeout(30)
def test_remove_done_callback_edges() -> None:
    """A private asyncio callback added with no loop running (not wrapped) is removed
    like any other; a callback that compares equal to everything removes neither
    asyncio's callbacks nor an await's wake-up."""
    import threading
    import time

    from lanequeue import LaneQueue, ThreadDispatcher

    queue = LaneQueue()
    queue.add_session_lane("session")
    d = ThreadDispatcher(queue, lanes=["session"])
    gate = threading.Event()
    try:
        t = d.submit("k", gate.wait, 20)
        ran: list[str] = []

        def _on_completion(_: Ticket) -> None:  # (named as asyncio's own)
            ran.append("ran")

        _on_completion.__module__ = "asyncio.tasks"
        t.add_done_callback(_on_completion)  # no running loop: not wrapped
        assert t.remove_done_callback(_on_completion) == 1

        class Greedy:
            def __eq__(self, other: object) -> bool:
                return True

            __hash__ = None  # type: ignore[assignment]

            def __call__(self, _: Ticket) -> None:
                ran.append("greedy")

        async def main() -> None:
            loop = asyncio.get_running_loop()
            waiting = asyncio.ensure_future(asyncio.wait([t], timeout=20))
            awaited = asyncio.ensure_future(_awaited(t))
            await asyncio.sleep(0)
            greedy = Greedy()
            t.add_done_callback(greedy)
            assert t.remove_done_callback(greedy) == 1  # itself only
            loop.call_later(0.05, gate.set)
            began = time.monotonic()
            done, _ = await waiting
            assert done == {t} and await awaited is True
            assert time.monotonic() - began < 10

        asyncio.run(main())
        assert ran == []

        t2 = d.submit("k2", gate.wait, 20)  # (gate is set: it ends at once)
        assert t2.result(10) is True
    finally:
        gate.set()
        assert d.drain(10)
        d.close()
