"""The shared dedupe window (``dedupe_redis``) leaves no claim behind a submit that
submitted nothing: not when the dispatcher drains or closes while the claim is in flight,
not after a claim that failed on a frozen server (it lands when the server thaws: the
dispatcher gives it back in the background), and a turn the dispatcher rejects by its own
policy claims nothing at all. A dispatcher belongs to the process that made it: in a
forked child its mutating calls raise RuntimeError.

Real redis-server (tests/redis_server.py); a private one (``own_server``) where the test
freezes it."""

from __future__ import annotations

import asyncio
import os
import signal
import threading
import time
from typing import Any

import pytest
import redis
from dispatch_helpers import claim_key

from lanequeue import (
    Dispatcher,
    DispatcherDrainingError,
    LaneBackendError,
    ThreadDispatcher,
    build_default_async_lanes,
    build_default_lanes,
)

WAIT = 10.0
ST = 0.5  # the frozen tests' socket_timeout, seconds






def gone_within(client: Any, keys: list[str], seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if client.exists(*keys) == 0:
            return True
        time.sleep(0.02)
    return client.exists(*keys) == 0


@pytest.mark.parametrize("stop", ["drain", "close"])
def test_drain_while_a_claim_is_in_flight_gives_the_claim_back(
    redis_client: Any, redis_prefix: str, stop: str
) -> None:
    """The claim lands; the dispatcher drains (or closes) before the submit places the
    ticket: the submit raises DispatcherDrainingError and the claim is gone from Redis, so
    another dispatcher's copy of the id runs."""
    a = ThreadDispatcher(build_default_lanes(),
                         dedupe_redis=redis_client, dedupe_prefix=redis_prefix)
    b = ThreadDispatcher(build_default_lanes(),
                         dedupe_redis=redis_client, dedupe_prefix=redis_prefix)
    window = a._machine.window
    real = window.claim
    landed, stopped = threading.Event(), threading.Event()

    def claim(dedupe_id: str, number: int) -> bool:
        ours = real(dedupe_id, number)  # the real SET NX PX, on the real server
        landed.set()
        assert stopped.wait(WAIT)
        return ours

    window.claim = claim
    out: dict[str, BaseException] = {}

    def submit() -> None:
        try:
            a.submit("k", lambda: "a ran", dedupe_id="m1")
        except BaseException as exc:
            out["error"] = exc

    th = threading.Thread(target=submit)
    th.start()
    try:
        assert landed.wait(WAIT)
        key = claim_key(redis_prefix, "k", "m1")
        assert redis_client.exists(key) == 1  # claimed, in flight
        a.drain() if stop == "drain" else a.close()
        stopped.set()
        th.join(WAIT)
        assert isinstance(out.get("error"), DispatcherDrainingError)
        assert redis_client.exists(key) == 0
        assert b.submit("k", lambda: "b ran", dedupe_id="m1").result(WAIT) == "b ran"
        assert a.stats.submitted == 0
    finally:
        stopped.set()
        a.close()
        b.close()


def test_failed_claims_that_land_after_a_thaw_are_given_back(own_server: Any) -> None:
    """On a frozen server, 12 concurrent submits (more than the window's 8 call slots)
    each raise LaneBackendError within one call bound (slot wait included, so less than
    twice socket_timeout). Their claims land when the server thaws; the dispatcher gives
    them back in the background, except the one its own retry uses now."""
    client = redis.Redis(port=own_server.port, socket_timeout=ST)
    a = ThreadDispatcher(build_default_lanes(), dedupe_redis=client, dedupe_prefix="p")
    b = ThreadDispatcher(build_default_lanes(), dedupe_redis=redis.Redis(port=own_server.port),
                         dedupe_prefix="p")
    go = threading.Event()
    try:
        a.submit("w", lambda: None, dedupe_id="warm").result(WAIT)  # connections made
        own_server.freeze()
        took: dict[int, tuple[str, float]] = {}

        def submit(i: int) -> None:
            t0 = time.monotonic()
            try:
                a.submit(f"k{i}", lambda: None, dedupe_id=f"id{i}")
                took[i] = ("submitted", time.monotonic() - t0)
            except LaneBackendError:
                took[i] = ("LaneBackendError", time.monotonic() - t0)

        threads = [threading.Thread(target=submit, args=(i,)) for i in range(12)]
        for th in threads:
            th.start()
        for th in threads:
            th.join(WAIT)
        failed_at = time.monotonic()
        assert {v[0] for v in took.values()} == {"LaneBackendError"} and len(took) == 12
        assert max(v[1] for v in took.values()) < 2 * ST  # one bound, not slot + call
        own_server.thaw()
        # The retry of id0 here owns id0 now: the background give-back leaves it.
        retry = a.submit("k0", go.wait, WAIT, dedupe_id="id0")
        keys = [claim_key("p", f"k{i}", f"id{i}") for i in range(1, 12)]
        assert gone_within(client, keys, 4 * ST + 2.0)
        for i in range(1, 12):
            assert b.submit(f"k{i}", lambda: "ran on b", dedupe_id=f"id{i}").result(
                WAIT) == "ran on b"
        while time.monotonic() < failed_at + 2 * ST + 0.3:  # past the last attempt
            time.sleep(0.05)
        assert client.exists(claim_key("p", "k0", "id0")) == 1
        assert b.submit("k0", lambda: "b ran", dedupe_id="id0").state == "deduped"
        go.set()
        assert retry.result(WAIT) is True
    finally:
        go.set()
        own_server.thaw()
        a.close()
        b.close()


def test_async_failed_claim_that_lands_after_a_thaw_is_given_back(own_server: Any) -> None:
    """The asyncio face: the ticket ends ``failed`` (LaneBackendError); the claim, landed
    at the thaw, is given back, so another dispatcher's copy runs."""
    client = redis.Redis(port=own_server.port, socket_timeout=ST)

    async def main() -> None:
        a = Dispatcher(build_default_async_lanes(), dedupe_redis=client, dedupe_prefix="p")
        b = Dispatcher(build_default_async_lanes(), dedupe_redis=redis.Redis(port=own_server.port),
                       dedupe_prefix="p")
        assert await asyncio.wait_for(a.submit("w", lambda: 1, dedupe_id="warm"), WAIT) == 1
        own_server.freeze()
        try:
            t = a.submit("k", lambda: "a ran", dedupe_id="m1")
            with pytest.raises(LaneBackendError):
                await asyncio.wait_for(t, WAIT)
            assert t.state == "failed"
        finally:
            own_server.thaw()
        assert await asyncio.to_thread(gone_within, client, [claim_key("p", "k", "m1")],
                                       4 * ST + 2.0)
        assert await asyncio.wait_for(b.submit("k", lambda: "b ran", dedupe_id="m1"),
                                      WAIT) == "b ran"
        assert await a.wait_idle(WAIT) and await b.wait_idle(WAIT)

    asyncio.run(main())


@pytest.mark.parametrize("case", ["busy", "overflow"])
def test_a_turn_rejected_by_local_policy_claims_nothing(own_server: Any, case: str) -> None:
    """A submit the dispatcher rejects by its own policy (busy="reject" on a busy key; a
    full line under overflow "reject_new") does not claim the id: it answers ``rejected``
    without asking Redis (here frozen: a claim would fail), so another dispatcher's copy
    of the id is never told ``deduped`` for a turn that runs nowhere."""
    client = redis.Redis(port=own_server.port, socket_timeout=ST)
    kwargs: dict[str, Any] = ({"busy": "reject"} if case == "busy"
                              else {"max_pending": 1, "overflow": "reject_new"})
    a = ThreadDispatcher(build_default_lanes(), dedupe_redis=client, dedupe_prefix="p", **kwargs)
    go = threading.Event()
    try:
        a.submit("k", go.wait, WAIT)  # k runs
        if case == "overflow":
            a.submit("k", go.wait, WAIT)  # and its line is full
        own_server.freeze()
        t = a.submit("k", lambda: None, dedupe_id="m1")
        assert (t.state, t.reason) == ("rejected", case)
    finally:
        own_server.thaw()
        go.set()
    assert client.exists(claim_key("p", "k", "m1")) == 0
    a.close()


def test_async_turn_rejected_by_local_policy_claims_nothing(own_server: Any) -> None:
    client = redis.Redis(port=own_server.port, socket_timeout=ST)

    async def main() -> None:
        a = Dispatcher(build_default_async_lanes(),
                       busy="reject", dedupe_redis=client, dedupe_prefix="p")
        go = asyncio.Event()
        first = a.submit("k", go.wait)
        await asyncio.sleep(0)
        own_server.freeze()
        try:
            t = a.submit("k", lambda: None, dedupe_id="m1")
            assert (t.state, t.reason) == ("rejected", "busy")
        finally:
            own_server.thaw()
        go.set()
        assert await asyncio.wait_for(first, WAIT) is True
        assert client.exists(claim_key("p", "k", "m1")) == 0

    asyncio.run(main())


@pytest.mark.filterwarnings("ignore::DeprecationWarning")  # fork with threads (3.12+)
def test_a_dispatcher_refuses_use_in_a_forked_child() -> None:
    """A dispatcher belongs to the process that made it: in a forked child, submit,
    cancel, clear, close and drain raise RuntimeError (make a new dispatcher there), while
    the read-only views answer with the parent's figures as of the fork; the parent's
    dispatcher goes on."""
    td = ThreadDispatcher(build_default_lanes())
    ad = Dispatcher(build_default_async_lanes())
    go, started = threading.Event(), threading.Event()

    def first() -> bool:
        started.set()
        return go.wait(WAIT)

    ticket = td.submit("k", first)
    assert started.wait(WAIT)  # running
    assert td.submit("k", lambda: None) is not None  # a second turn, pending
    parent_snapshot, parent_stats = td.snapshot(), td.stats
    # Another thread holds the dispatcher's lock at the fork (as a worker may): in the
    # child that thread does not exist, and the views must not wait for it.
    held, release = threading.Event(), threading.Event()

    def hold_the_lock() -> None:
        with td._machine._lock:
            held.set()
            release.wait(WAIT)

    holder = threading.Thread(target=hold_the_lock)
    holder.start()
    assert held.wait(WAIT)
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        signal.alarm(10)  # a child stuck on the parent's lock dies, and the test fails
        lines = []
        try:
            calls = [
                ("submit", lambda: td.submit("k", lambda: None)),
                ("cancel", lambda: td.cancel(ticket)),
                ("clear", lambda: td.clear("k")),
                ("close", lambda: td.close()),
                ("drain", lambda: td.drain()),
                ("async submit", lambda: ad.submit("k", lambda: None)),
                ("async close", lambda: ad.close()),
            ]
            for name, call in calls:
                try:
                    call()
                    lines.append(f"{name}: no error")
                except RuntimeError as exc:
                    lines.append(f"{name}: {'make a new one in the child' in str(exc)}")
            # Read-only views answer, with the parent's figures as of the fork.
            snap = td.snapshot()
            lines.append(f"views: {td.pending('k')} {td.draining} "
                         f"{snap['keys']['k']['pending']} {snap['keys']['k']['running']} "
                         f"{snap['admitted'] == parent_snapshot['admitted']} "
                         f"{td.stats == parent_stats}")
            fresh = ThreadDispatcher(build_default_lanes())
            lines.append(f"fresh: {fresh.submit('k', lambda: 'child ran').result(WAIT)}")
        finally:
            os.write(w, "\n".join(lines).encode())
            os._exit(0)
    release.set()
    holder.join(WAIT)
    os.close(w)
    with os.fdopen(r, "rb") as f:
        got = f.read().decode().splitlines()
    os.waitpid(pid, 0)
    names = ["submit", "cancel", "clear", "close", "drain", "async submit", "async close"]
    assert got == [f"{n}: True" for n in names] + ["views: 1 False 1 True True True",
                                                   "fresh: child ran"]
    go.set()
    assert ticket.result(WAIT) is True  # the parent's turn ran, in the parent
    assert td.submit("k", lambda: "parent").result(WAIT) == "parent"
    td.close()


def test_give_back_later_removes_a_claim_that_lands_late_and_only_that_claim(
    redis_server: Any, redis_prefix: str
) -> None:
    """``give_back_later`` tries again after ``call_wait_s`` and twice that: a claim that
    lands after the first attempt (a frozen server's late SET) is still given back;
    another owner's claim, and a later claim of ours of the same id (a retry: another
    claim number), are left."""
    from lanequeue.dispatch._redis import RedisDedupeWindow

    client = redis.Redis(port=redis_server.port, socket_timeout=ST)
    window = RedisDedupeWindow(client, redis_prefix, 60.0)
    failed = {i: window.number() for i in ("late", "retried", "other")}
    for dedupe_id, number in failed.items():
        window.give_back_later(dedupe_id, number)
    late, retried, other = (window.key(i) for i in ("late", "retried", "other"))
    deadline = time.monotonic() + WAIT
    while any(window._later.get((i, n), 3) == 3 for i, n in failed.items()) and (
            time.monotonic() < deadline):  # the first round (at once) was made
        time.sleep(0.01)
    # A late claim lands now; a retry of ours claimed "retried" anew; another owner
    # claimed "other".
    assert window.claim("late", failed["late"])
    assert window.claim("retried", failed["retried"])
    assert window.claim("retried", window.number())  # replaces the older claim
    client.set(other, "another dispatcher")
    assert gone_within(client, [late], 2 * ST + 2.0)
    deadline = time.monotonic() + WAIT
    while window.pending_give_backs() and time.monotonic() < deadline:
        time.sleep(0.01)  # every attempt made
    assert client.get(retried) is not None  # the retry's claim stays
    assert client.get(other) == b"another dispatcher"


class _HeldGiveBacks:
    """Wraps a window's ``give_back`` so each one waits for ``release`` before it goes
    to Redis (it runs on the thread that sends it: the window's pool on asyncio, the
    cancelling thread on threads); ``sent`` is set once one has been answered."""

    def __init__(self, window: Any) -> None:
        self.real = window.give_back
        self.entered, self.release, self.sent = (threading.Event(), threading.Event(),
                                                 threading.Event())
        window.give_back = self

    def __call__(self, dedupe_id: str, number: int) -> None:
        self.entered.set()
        assert self.release.wait(WAIT)
        self.real(dedupe_id, number)
        self.sent.set()


@pytest.mark.parametrize("order", ["claim_first", "give_back_first"])
def test_async_give_back_of_a_cancelled_ticket_never_removes_its_retrys_claim(
    redis_client: Any, redis_prefix: str, order: str
) -> None:
    """A cancelled ticket's give-back and its retry's claim (same dispatcher, same
    ``dedupe_id``) reach Redis in either order: the retry keeps the id, so another
    dispatcher's copy ends ``deduped`` (README: "a duplicate owned by another process
    ends as ``deduped``")."""
    from lanequeue.dispatch._machine import CLAIMING

    async def answered(t: Any) -> None:
        # The claim's answer comes back to the loop through the thread pool.
        deadline = time.monotonic() + WAIT
        while t._claim is CLAIMING and time.monotonic() < deadline:
            await asyncio.sleep(0)
        assert t._claim is True

    async def main() -> None:
        a = Dispatcher(build_default_async_lanes(), dedupe_redis=redis_client,
                       dedupe_prefix=redis_prefix)
        b = Dispatcher(build_default_async_lanes(), dedupe_redis=redis_client,
                       dedupe_prefix=redis_prefix)
        held = _HeldGiveBacks(a._machine.window)
        gate = asyncio.Event()

        async def handle(evt: str) -> str:
            return evt

        a.submit("conv", gate.wait)  # the key is busy: the tickets below stay pending
        first = a.submit("conv", handle, "e", dedupe_id="e")
        await answered(first)
        assert first.cancel()  # its give-back is held
        assert await asyncio.to_thread(held.entered.wait, WAIT)
        if order == "give_back_first":
            held.release.set()
            assert await asyncio.to_thread(held.sent.wait, WAIT)
        retry = a.submit("conv", handle, "e", dedupe_id="e")
        assert retry is not first
        await answered(retry)
        held.release.set()
        assert await asyncio.to_thread(held.sent.wait, WAIT)
        assert redis_client.get(claim_key(redis_prefix, "conv", "e")) is not None
        copy = b.submit("conv", handle, "e", dedupe_id="e")  # a copy on another replica
        await answered_or_ended(copy)
        assert copy.state == "deduped" and retry.state == "pending"
        gate.set()
        assert await asyncio.wait_for(retry, WAIT) == "e"
        assert await a.drain(WAIT) and await b.drain(WAIT)

    async def answered_or_ended(t: Any) -> None:
        deadline = time.monotonic() + WAIT
        while not t.done() and time.monotonic() < deadline:
            await asyncio.sleep(0)

    asyncio.run(asyncio.wait_for(main(), 3 * WAIT))


@pytest.mark.parametrize("order", ["claim_first", "give_back_first"])
def test_thread_give_back_of_a_cancelled_ticket_never_removes_its_retrys_claim(
    redis_client: Any, redis_prefix: str, order: str
) -> None:
    """The same on ThreadDispatcher: the give-back runs in the cancelling thread, the
    retry's claim in the submitting one, in either order."""
    a = ThreadDispatcher(build_default_lanes(), dedupe_redis=redis_client,
                         dedupe_prefix=redis_prefix)
    b = ThreadDispatcher(build_default_lanes(), dedupe_redis=redis_client,
                         dedupe_prefix=redis_prefix)
    held = _HeldGiveBacks(a._machine.window)
    gate = threading.Event()
    a.submit("conv", gate.wait, WAIT)
    first = a.submit("conv", str, "e", dedupe_id="e")
    canceller = threading.Thread(target=first.cancel)
    canceller.start()
    assert held.entered.wait(WAIT)
    if order == "give_back_first":
        held.release.set()
        assert held.sent.wait(WAIT)
    retry = a.submit("conv", str, "e", dedupe_id="e")
    assert retry is not first and retry.state == "pending"
    held.release.set()
    canceller.join(WAIT)
    assert held.sent.is_set() and first.state == "cancelled"
    assert redis_client.get(claim_key(redis_prefix, "conv", "e")) is not None
    copy = b.submit("conv", str, "e", dedupe_id="e")  # a copy on another replica
    assert copy.state == "deduped" and retry.state == "pending"
    gate.set()
    assert retry.result(WAIT) == "e"
    assert a.drain(WAIT) and b.drain(WAIT)
    a.close()
    b.close()


def test_two_threads_submitting_one_id_make_one_claim_the_ticket_gives_back(
    redis_client: Any, redis_prefix: str
) -> None:
    """Two threads submit the same new id at once: the second waits for the first's
    claim (held in flight until both submits began) and is deduped against its ticket,
    so only one claim is made; the ticket's give-back (it never ran) frees the id for
    another dispatcher."""
    a = ThreadDispatcher(build_default_lanes(), dedupe_redis=redis_client,
                         dedupe_prefix=redis_prefix)
    b = ThreadDispatcher(build_default_lanes(), dedupe_redis=redis_client,
                         dedupe_prefix=redis_prefix)
    window = a._machine.window
    real = window.claim
    started = threading.Barrier(3, timeout=WAIT)
    claims: list[int] = []

    def claim(dedupe_id: str, number: int) -> bool:
        claims.append(number)
        ours = real(dedupe_id, number)
        time.sleep(0.2)  # in flight while the other submit runs (it waits for this one)
        return ours

    window.claim = claim
    gate = threading.Event()
    a.submit("conv", gate.wait, WAIT)
    got: list[Any] = []

    def submit() -> None:
        started.wait()
        got.append(a.submit("conv", str, "e", dedupe_id="e"))

    threads = [threading.Thread(target=submit) for _ in range(2)]
    for th in threads:
        th.start()
    started.wait()
    for th in threads:
        th.join(WAIT)
    assert len(got) == 2 and got[0] is got[1]
    assert len(claims) == 1
    window.claim = real
    assert got[0].cancel()
    assert gone_within(redis_client, [claim_key(redis_prefix, "conv", "e")], WAIT)
    gate.set()
    assert b.submit("conv", str, "b ran", dedupe_id="e").result(WAIT) == "b ran"
    assert a.drain(WAIT) and b.drain(WAIT)
    a.close()
    b.close()


@pytest.mark.parametrize("dedupe_max", [1, 0])
def test_an_id_out_of_the_local_table_runs_once_while_the_window_holds_it(
    redis_client: Any, redis_prefix: str, dedupe_max: int
) -> None:
    """``dedupe_max`` bounds the local table; the shared window still holds an id pushed
    out of it. A repeat of that id on the same dispatcher used to claim it again (an
    older claim of its own was taken for a returned one) and ran it a second time while
    another replica's copy ended deduped; now both copies end deduped: the id ran once.
    A claim that was really returned (its turn cancelled before it ran) is still
    replaced by a retry, which runs."""
    runs: list[str] = []
    d1 = ThreadDispatcher(build_default_lanes(), dedupe_redis=redis_client,
                          dedupe_prefix=redis_prefix, dedupe_max=dedupe_max)
    d2 = ThreadDispatcher(build_default_lanes(), dedupe_redis=redis_client,
                          dedupe_prefix=redis_prefix)
    try:
        assert d1.submit("k1", runs.append, "X#1", dedupe_id="X").result(WAIT) is None
        d1.submit("k2", runs.append, "Y", dedupe_id="Y").result(WAIT)  # X out of the table
        assert d1._machine.dedupe_size() == dedupe_max
        assert redis_client.get(claim_key(redis_prefix, "k1", "X")) is not None
        copy = d2.submit("k1", runs.append, "X@d2", dedupe_id="X")
        repeat = d1.submit("k1", runs.append, "X#2", dedupe_id="X")
        assert (copy.state, repeat.state) == ("deduped", "deduped")
        assert [r for r in runs if r.startswith("X")] == ["X#1"]
        gate = threading.Event()
        d1.submit("k4", gate.wait, WAIT)  # keeps k4 busy
        cancelled = d1.submit("k4", runs.append, "Z#1", dedupe_id="Z")
        assert cancelled.cancel()
        retry = d1.submit("k4", runs.append, "Z#2", dedupe_id="Z")
        gate.set()
        retry.result(WAIT)
        assert retry.state == "done" and "Z#2" in runs and "Z#1" not in runs
        assert d1.drain(WAIT) and d2.drain(WAIT)
    finally:
        d1.close()
        d2.close()


def test_async_retry_after_a_failed_claim_that_lands_late_runs(
    redis_client: Any, redis_prefix: str
) -> None:
    """An asyncio ticket's claim fails (no answer in time) but lands later; a genuine
    retry of the id on the same dispatcher then finds that claim in Redis. The failed
    claim stays recorded as returned until give_back_later's last attempt, so the retry
    replaces it and runs (the failed ticket's end also ran a plain give-back, whose
    answer dropped the record before the claim landed: the retry ended deduped)."""
    from lanequeue.dispatch._redis import RedisDedupeWindow

    async def main() -> tuple[str, str]:
        d = Dispatcher(build_default_async_lanes(), dedupe_redis=redis_client,
                       dedupe_prefix=redis_prefix)
        window = d._machine.window
        landed = threading.Event()

        def claim(dedupe_id: str, number: int) -> bool:
            if number == 1:  # the first claim: sent, its answer never came
                def land() -> None:
                    time.sleep(0.3)
                    window._call(window._claim, dedupe_id, [window.ttl_ms, number, ""])
                    landed.set()
                threading.Thread(target=land, daemon=True).start()
                raise LaneBackendError("claiming 'X' failed (no answer in time)")
            return RedisDedupeWindow.claim(window, dedupe_id, number)

        window.claim = claim
        first = d.submit("k", str, "first", dedupe_id="X")
        with pytest.raises(LaneBackendError):
            await asyncio.wait_for(first, WAIT)
        assert await asyncio.to_thread(landed.wait, WAIT)
        assert redis_client.get(claim_key(redis_prefix, "k", "X")) == (
            f"{window.owner}:1".encode())
        retry = d.submit("k", str, "retry", dedupe_id="X")
        try:
            assert await asyncio.wait_for(retry, WAIT) == "retry"
        finally:
            assert await d.drain(WAIT)
            d.close()
        return first.state, retry.state

    assert asyncio.run(main()) == ("failed", "done")


def test_async_records_of_claims_that_never_held_are_dropped(
    redis_client: Any, redis_prefix: str
) -> None:
    """Tickets cancelled while their claim is in flight, whose claims then answer 'not
    ours' (another replica owns the ids): nothing to give back, and nothing is kept as
    returned (a record per id stayed for the window, 5 minutes by default)."""
    b = ThreadDispatcher(build_default_lanes(), dedupe_redis=redis_client,
                         dedupe_prefix=redis_prefix)
    for i in range(20):  # the other replica owns every id
        b.submit("kb", str, i, dedupe_id=f"u{i}").result(WAIT)

    async def main() -> int:
        a = Dispatcher(build_default_async_lanes(), dedupe_redis=redis_client,
                       dedupe_prefix=redis_prefix)
        window = a._machine.window
        tickets = [a.submit(f"k{i}", str, i, dedupe_id=f"u{i}") for i in range(20)]
        assert all(t.cancel() for t in tickets)  # cancelled while their claims fly
        deadline = time.monotonic() + WAIT
        while window._returned and time.monotonic() < deadline:
            await asyncio.sleep(0.02)
        assert await a.drain(WAIT)
        a.close()
        return len(window._returned)

    try:
        assert asyncio.run(main()) == 0
    finally:
        b.close()
