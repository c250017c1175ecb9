"""The dispatcher across processes on Redis: the shared dedupe window (``dedupe_redis``),
and two processes that each receive some of one conversation's turns (and every webhook
twice, one copy each) running them one at a time under Redis lanes, each id once, while
other conversations of both keep the global cap across the two.

Real redis-server (tests/redis_server.py), never a mock. Processes use ``spawn``; their
time stamps are ``time.monotonic()``, one system-wide clock on Linux."""

from __future__ import annotations

import asyncio
import itertools
import json
import multiprocessing as mp
import threading
import time
from pathlib import Path
from typing import Any

import pytest
import redis
from dispatch_helpers import claim_key

from lanequeue import (
    LaneBackendError,
    LaneQueue,
    ThreadDispatcher,
    TurnDedupedError,
    build_default_async_lanes,
    current_turn,
)
from lanequeue.redis import RedisLane, RedisSessionLane

WAIT = 10.0


def local_lanes() -> LaneQueue:
    q = LaneQueue()
    q.add_session_lane("session")
    q.add_lane("global", max_concurrent=4)
    return q


def test_C31_across_replicas_a_webhook_runs_once(redis_client: Any, redis_prefix: str) -> None:
    a = ThreadDispatcher(local_lanes(), dedupe_redis=redis_client, dedupe_prefix=redis_prefix)
    b = ThreadDispatcher(local_lanes(), dedupe_redis=redis_client, dedupe_prefix=redis_prefix)
    ran: list[str] = []
    go = threading.Event()

    def handle(event: str) -> str:
        ran.append(event)
        assert go.wait(WAIT)
        return f"handled {event}"

    try:
        first = a.submit("slack:c1", handle, "Ev1", dedupe_id="Ev1")
        dup = b.submit("slack:c1", handle, "Ev1", dedupe_id="Ev1")
        # The other replica owns Ev1: this one runs nothing and says so at once.
        assert (dup.state, dup.reason) == ("deduped", "duplicate")
        with pytest.raises(TurnDedupedError) as raised:
            dup.result(0)
        assert raised.value.reason == "duplicate"  # the word; the message says what it means
        assert str(raised.value) == (f"turn {dup.id} of key 'slack:c1' deduped: another "
                                     "dispatcher sharing the dedupe window owns its dedupe_id")
        assert b.submit("slack:c1", handle, "Ev1", dedupe_id="Ev1") is not dup
        assert a.submit("slack:c1", handle, "Ev1", dedupe_id="Ev1") is first  # local repeat
        go.set()
        assert first.result(WAIT) == "handled Ev1"
        assert ran == ["Ev1"]
        sa, sb = a.stats, b.stats
        assert (sa.submitted, sa.done, sa.deduped) == (1, 1, 1)
        assert (sb.submitted, sb.deduped) == (0, 2)
        key = claim_key(redis_prefix, "slack:c1", "Ev1")
        assert 0 < redis_client.pttl(key) <= 300_000  # the window has a TTL
    finally:
        go.set()
        a.close()
        b.close()


@pytest.mark.filterwarnings("ignore::DeprecationWarning")  # fork with threads (3.12+)
def test_a_forked_child_never_owns_its_parents_dedupe_claims(
    redis_client: Any, redis_prefix: str
) -> None:
    """A dispatcher's shared dedupe window in a forked child (a worker made by fork) is
    another claimant: an id its parent claimed is a duplicate there (else both processes
    would run the turn), and its give-back leaves the parent's claim alone."""
    import os

    from lanequeue.dispatch._redis import RedisDedupeWindow

    window = RedisDedupeWindow(redis_client, redis_prefix, 60.0)
    first = window.number()
    assert window.claim("Ev1", first)
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        out = "raised"
        try:
            window.give_back("Ev1", first)
            out = f"{window.claim('Ev1', first)} {window.claim('Ev2', window.number())}"
        finally:
            os.write(w, out.encode())
            os._exit(0)
    os.close(w)
    with os.fdopen(r, "rb") as f:
        got = f.read().decode()
    os.waitpid(pid, 0)
    assert got == "False True"
    assert window.claim("Ev1", first)  # still the parent's
    assert not window.claim("Ev2", window.number())  # the child's


def test_a_claim_is_given_back_when_the_turn_never_ran(redis_client: Any,
                                                      redis_prefix: str) -> None:
    a = ThreadDispatcher(local_lanes(), busy="reject", dedupe_redis=redis_client,
                         dedupe_prefix=redis_prefix)
    b = ThreadDispatcher(local_lanes(), dedupe_redis=redis_client, dedupe_prefix=redis_prefix)
    go = threading.Event()
    try:
        a.submit("k", go.wait, WAIT)  # keeps k busy
        rejected = a.submit("k", go.wait, WAIT, dedupe_id="m1")
        assert rejected.state == "rejected"
        assert redis_client.exists(claim_key(redis_prefix, "k", "m1")) == 0
        retry = b.submit("k", lambda: "ran on b", dedupe_id="m1")  # a genuine retry runs
        assert retry.result(WAIT) == "ran on b"
    finally:
        go.set()
        a.close()
        b.close()


def test_a_second_submit_of_an_id_waits_for_the_claim_in_flight(
    redis_client: Any, redis_prefix: str
) -> None:
    """Two threads of one dispatcher submit the same id; the first is stopped just after
    its claim answered. The second used to claim as well (both "ours": one owner), make
    a ticket that ended unrun and give the id back, so another dispatcher ran it and
    then the first thread ran it again. The second now waits for the claim in flight
    and is deduped against its ticket: the id runs once, across both dispatchers."""
    a = ThreadDispatcher(local_lanes(), dedupe_redis=redis_client, dedupe_prefix=redis_prefix)
    b = ThreadDispatcher(local_lanes(), dedupe_redis=redis_client, dedupe_prefix=redis_prefix)
    window = b._machine.window
    real = window.claim
    claimed, go = threading.Event(), threading.Event()
    claims: list[str] = []

    def claim(dedupe_id: str, number: int) -> bool:
        claims.append(threading.current_thread().name)
        ours = bool(real(dedupe_id, number))
        if threading.current_thread().name == "first":
            claimed.set()
            assert go.wait(WAIT)  # the first thread stops here, its claim answered
        return ours

    window.claim = claim
    ran: list[str] = []
    got: dict[str, Any] = {}

    def submit(name: str) -> None:
        got[name] = b.submit("k1", ran.append, name, dedupe_id="X")

    first = threading.Thread(target=submit, args=("first",), name="first")
    second = threading.Thread(target=submit, args=("second",), name="second")
    try:
        first.start()
        assert claimed.wait(WAIT)
        second.start()
        second.join(0.3)
        assert second.is_alive() and claims == ["first"]  # waiting: no claim of its own
        go.set()
        first.join(WAIT)
        second.join(WAIT)
        assert got["second"] is got["first"]  # deduped against the first's ticket
        got["first"].result(WAIT)
        other = a.submit("k1", ran.append, "other replica", dedupe_id="X")
        assert (other.state, other.reason) == ("deduped", "duplicate")
        assert ran == ["first"] and claims == ["first"]
    finally:
        go.set()
        a.close()
        b.close()


def test_storm_of_retried_ids_over_two_dispatchers_runs_each_at_most_once(
    redis_client: Any, redis_prefix: str
) -> None:
    """Sixteen threads submit copies of 150 ids to two dispatchers sharing a window, and
    cancel about one copy in five (a cancelled copy that never ran gives its claim
    back, so a later copy may run): every id runs at most once."""
    import random

    ds = [ThreadDispatcher(local_lanes(), dedupe_redis=redis_client,
                           dedupe_prefix=redis_prefix) for _ in range(2)]
    ran: list[str] = []
    lock = threading.Lock()

    def fn(i: str) -> None:
        with lock:
            ran.append(i)
        time.sleep(0.001)

    def worker(seed: int) -> None:
        rng = random.Random(seed)
        for _ in range(120):
            n = rng.randrange(150)
            i = f"id{n}"  # a message of conversation k<n % 6> (ids are scoped per key)
            t = ds[rng.randrange(2)].submit(f"k{n % 6}", fn, i, dedupe_id=i)
            if rng.random() < 0.2:
                t.cancel()

    threads = [threading.Thread(target=worker, args=(s,)) for s in range(16)]
    try:
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        assert not any(t.is_alive() for t in threads)
        for d in ds:
            assert d.drain(timeout_s=WAIT)
        twice = sorted(i for i in set(ran) if ran.count(i) > 1)
        assert twice == []
    finally:
        for d in ds:
            d.close()


def test_the_same_id_for_two_conversations_on_two_replicas_runs_both(
    redis_client: Any, redis_prefix: str
) -> None:
    """Ids are scoped per key across replicas too: a Telegram ``message_id`` 42 of chat A
    on one replica and 42 of chat B on another are two turns, and both run (the second
    used to end ``deduped``: another replica cannot know the first one's key, and the
    claim was the id's alone). A copy of chat A's 42 on the second replica is still a
    duplicate."""
    a = ThreadDispatcher(local_lanes(), dedupe_redis=redis_client, dedupe_prefix=redis_prefix)
    b = ThreadDispatcher(local_lanes(), dedupe_redis=redis_client, dedupe_prefix=redis_prefix)
    try:
        first = a.submit("tg:chat-a", lambda: "a", dedupe_id="42")
        other = b.submit("tg:chat-b", lambda: "b", dedupe_id="42")
        copy = b.submit("tg:chat-a", lambda: "a again", dedupe_id="42")
        assert (first.result(WAIT), other.result(WAIT)) == ("a", "b")
        assert (copy.state, copy.reason) == ("deduped", "duplicate")
        for key in ("tg:chat-a", "tg:chat-b"):
            assert 0 < redis_client.pttl(claim_key(redis_prefix, key, "42")) <= 300_000
    finally:
        a.close()
        b.close()


def test_a_redis_failure_at_submit_is_a_backend_error() -> None:
    dead = redis.Redis(port=1, socket_connect_timeout=0.2)  # nothing listens there
    d = ThreadDispatcher(local_lanes(), dedupe_redis=dead)
    try:
        with pytest.raises(LaneBackendError, match=r"^dedupe window on Redis: claiming 'x' "
                           r"of key 'k:X' failed \("):  # (the id and its key, not the scope)
            d.submit("k:X", lambda: None, dedupe_id="x")
        assert d.stats.submitted == 0
        assert d.submit("k", lambda: "no id, no Redis").result(WAIT) == "no id, no Redis"
    finally:
        d.close()


def test_shared_window_arguments() -> None:
    with pytest.raises(TypeError, match="dedupe_redis"):
        ThreadDispatcher(local_lanes(), dedupe_redis=object())
    with pytest.raises(ValueError, match="dedupe_ttl_s"):
        ThreadDispatcher(local_lanes(), dedupe_redis=redis.Redis(), dedupe_ttl_s=None)


TURNS = 30


def _replica(port: int, prefix: str, idx: int, start_at: float, out: str) -> None:
    client = redis.Redis(port=port)
    queue = LaneQueue()
    queue.add(RedisSessionLane(client, "session", prefix=prefix, lease_s=10.0, timeout_s=60))
    queue.add(RedisLane(client, "global", max_concurrent=2, prefix=prefix, lease_s=10.0,
                        timeout_s=60))
    d = ThreadDispatcher(queue, dedupe_redis=client, dedupe_prefix=prefix, max_pending=1000)
    records: list[dict[str, Any]] = []

    def turn(n: int) -> int:
        t0 = time.monotonic()
        time.sleep(0.003)
        records.append({"n": n, "start": t0, "end": time.monotonic(), "proc": idx,
                        "key": current_turn().key})
        return n

    # Every webhook of the conversation reaches both replicas: first the one whose turn
    # it is (n % 2 == idx), 5 ms later the other (a redelivery). One conversation, one key.
    tickets = []
    for n in range(TURNS):
        at = start_at + 0.01 * n + (0.0 if n % 2 == idx else 0.005)
        while time.monotonic() < at:
            time.sleep(0.0005)
        tickets.append(d.submit("conv", turn, n, dedupe_id=f"ev{n}"))
        # Other conversations of this replica compete for the global lane meanwhile.
        d.submit(f"other-{idx}-{n % 3}", turn, -1)
    assert d.wait_idle(60)
    states = [t.state for t in tickets]
    Path(out).write_text(json.dumps({"records": records, "states": states,
                                     "stats": d.stats.to_dict()}))
    d.close()


@pytest.mark.timeout(120)
def test_two_processes_one_conversation_run_each_turn_once_one_at_a_time(
        redis_server: Any, redis_prefix: str, tmp_path: Path) -> None:
    ctx = mp.get_context("spawn")
    start_at = time.monotonic() + 3.0  # both replicas start submitting together
    outs = [str(tmp_path / f"r{i}.json") for i in range(2)]
    procs = [ctx.Process(target=_replica, args=(redis_server.port, redis_prefix, i, start_at,
                                                outs[i])) for i in range(2)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(90)
        assert p.exitcode == 0
    results = [json.loads(Path(o).read_text()) for o in outs]
    records = sorted(itertools.chain.from_iterable(r["records"] for r in results),
                     key=lambda r: r["start"])
    conv = [r for r in records if r["key"] == "conv"]
    # Each webhook ran exactly once over both replicas.
    assert sorted(r["n"] for r in conv) == list(range(TURNS))
    # One conversation: never two turns at once, across processes.
    for before, after in itertools.pairwise(conv):
        assert before["end"] <= after["start"], (before, after)
    # Within each replica, its turns ran in its submit order.
    for i in range(2):
        mine = [r["n"] for r in conv if r["proc"] == i]
        assert mine == sorted(mine)
    # The global lane's cap (2) held across both replicas, and was reached.
    edges = sorted([(r["start"], 1) for r in records] + [(r["end"], -1) for r in records])
    level = peak = 0
    for _, step in edges:  # an end sorts before a start at the same instant
        level += step
        peak = max(peak, level)
    assert peak == 2
    # The books: every submit of each replica ran there or was deduped by the other.
    for r in results:
        s = r["stats"]
        assert s["submitted"] + s["deduped"] == 2 * TURNS  # conv (webhooks) + others
        assert s["submitted"] == s["done"]
        assert set(r["states"]) <= {"done", "deduped"}
    assert sum(r["stats"]["done"] for r in results) == 3 * TURNS  # webhooks once + others
    assert all(sum(1 for c in conv if c["proc"] == i) > 0 for i in range(2))
    print("\nwebhooks run per replica:",
          [sum(1 for c in conv if c["proc"] == i) for i in range(2)])


# -- the asyncio dispatcher: the window is asked off the loop -----------------------------




def test_async_shared_window_dedupes_across_dispatchers_in_submit_order(
    redis_client: Any, redis_prefix: str
) -> None:
    """Two asyncio Dispatchers share the window. ``submit`` returns at once (the claim is
    made in a thread); a's turns of one key run in submit order, with and without an id
    (a turn submitted after one whose claim is in flight waits for it); b's copy of m1 ends
    ``deduped`` and counts there, not in ``submitted``; a local repeat is the same ticket."""
    import asyncio

    from lanequeue import Dispatcher

    async def main() -> None:
        a = Dispatcher(build_default_async_lanes(),
                       dedupe_redis=redis_client, dedupe_prefix=redis_prefix)
        b = Dispatcher(build_default_async_lanes(),
                       dedupe_redis=redis_client, dedupe_prefix=redis_prefix)
        order: list[str] = []

        async def turn(name: str) -> str:
            order.append(name)
            return name

        t1 = a.submit("k", turn, "m1", dedupe_id="m1")
        t2 = a.submit("k", turn, "plain")
        t3 = a.submit("k", turn, "m2", dedupe_id="m2")
        assert a.submit("k", turn, "again", dedupe_id="m1") is t1
        assert a.pending("k") == 3 and a.snapshot()["keys"]["k"]["blocked_by"] == "dedupe"
        assert list(await asyncio.wait_for(asyncio.gather(t1, t2, t3), WAIT)) == [
            "m1", "plain", "m2"]
        assert order == ["m1", "plain", "m2"]
        copy = b.submit("k", turn, "copy", dedupe_id="m1")
        with pytest.raises(TurnDedupedError):
            await asyncio.wait_for(copy, WAIT)
        assert copy.state == "deduped" and order == ["m1", "plain", "m2"]
        assert b.stats.deduped == 1 and b.stats.submitted == 0 and b.stats.pending == 0
        assert a.stats.submitted == 3 and a.stats.done == 3 and a.stats.deduped == 1
        assert await a.wait_idle(WAIT) and await b.wait_idle(WAIT)
        assert a.snapshot()["keys"] == {} and b.snapshot()["keys"] == {}

    asyncio.run(main())


def test_async_claim_cancelled_in_flight_is_given_back(
    redis_client: Any, redis_prefix: str
) -> None:
    """A ticket cancelled while its claim is in flight ends ``cancelled`` at once; the
    claim, once it answers, is given back (the id's key is gone), so another dispatcher's
    copy runs."""
    import asyncio

    from lanequeue import Dispatcher
    from lanequeue.dispatch._machine import CLAIMING

    async def main() -> None:
        a = Dispatcher(build_default_async_lanes(),
                       dedupe_redis=redis_client, dedupe_prefix=redis_prefix)
        b = Dispatcher(build_default_async_lanes(),
                       dedupe_redis=redis_client, dedupe_prefix=redis_prefix)
        t = a.submit("k", lambda: "a ran", dedupe_id="m1")
        assert t.cancel() and t.state == "cancelled"
        key = claim_key(redis_prefix, "k", "m1")
        deadline = time.monotonic() + WAIT
        while t._claim is CLAIMING and time.monotonic() < deadline:  # the claim answers
            await asyncio.sleep(0.005)
        assert t._claim is True  # ours: the SET landed, the key is ours ...
        while redis_client.exists(key) and time.monotonic() < deadline:  # ... given back
            await asyncio.sleep(0.01)
        assert await asyncio.wait_for(b.submit("k", lambda: "b ran", dedupe_id="m1"),
                                      WAIT) == "b ran"
        assert await a.wait_idle(WAIT) and a.snapshot()["keys"] == {}

    asyncio.run(main())


@pytest.mark.parametrize("face", ["threads", "asyncio"])
def test_a_turn_is_told_at_once_when_the_lease_of_its_redis_lane_is_lost(
    own_server: Any, face: str
) -> None:
    """The server freezes while a turn runs under a Redis session lane (lease 1 s): the
    holder's deadline passes, so the key may be another replica's. The turn used to
    run on, untold (its cancel event never set, its task never cancelled), and its
    ticket ended ``failed`` only once it returned. Now the loss reaches the turn at the
    holder's deadline: a thread turn's cancel event is set, an asyncio turn's task is
    cancelled, and the ticket ends ``failed`` with LeaseLostError, reason
    ``"lease lost"``."""
    from lanequeue import AsyncLaneQueue, Dispatcher, LeaseLostError
    from lanequeue.redis import AsyncRedisSessionLane

    told: list[float] = []
    inside = threading.Event()
    frozen_at: list[float] = []
    try:
        if face == "threads":
            q = LaneQueue()
            q.add(RedisSessionLane(redis.Redis(host=own_server.host, port=own_server.port,
                                               socket_timeout=0.5),
                                   "session", lease_s=1.0))
            d = ThreadDispatcher(q, lanes=("session",))

            def turn() -> str:
                inside.set()
                assert current_turn().cancel_event.wait(WAIT)
                told.append(time.monotonic())
                return "went on"

            t = d.submit("conv", turn)
            assert inside.wait(WAIT)
            own_server.freeze()
            frozen_at.append(time.monotonic())
            with pytest.raises(LeaseLostError):
                t.result(WAIT)
            own_server.thaw()
            assert d.drain(timeout_s=WAIT)
        else:
            async def main() -> Any:
                import redis.asyncio as aredis

                q = AsyncLaneQueue()
                client = aredis.Redis(host=own_server.host, port=own_server.port,
                                      socket_timeout=0.5)
                q.add(AsyncRedisSessionLane(client, "session", lease_s=1.0))
                d = Dispatcher(q, lanes=("session",))

                async def turn() -> str:
                    inside.set()
                    try:
                        await asyncio.sleep(WAIT)
                    except asyncio.CancelledError:
                        told.append(time.monotonic())
                        raise
                    return "went on"

                t = d.submit("conv", turn)
                while not inside.is_set():
                    await asyncio.sleep(0.01)
                own_server.freeze()
                frozen_at.append(time.monotonic())
                try:
                    with pytest.raises(LeaseLostError):
                        await asyncio.wait_for(t, WAIT)
                finally:
                    own_server.thaw()
                assert await d.drain(timeout_s=WAIT)
                await client.aclose()
                return t

            t = asyncio.run(main())
        assert (t.state, t.reason) == ("failed", "lease lost")
        assert isinstance(t.exception(0), LeaseLostError)
        # Told at the holder's deadline: within its 1 s lease of the freeze (plus the
        # watchdog's and a busy machine's slack), not when the turn returned.
        assert told and told[0] - frozen_at[0] < 2.0, told[0] - frozen_at[0]
    finally:
        own_server.thaw()
