"""Each busy policy, overflow, dedupe, timeouts, cancel/clear, drain/close and priority of
the asyncio Dispatcher, driven deterministically: the manually stepped FakeClockLoop (its
clock moves only on ``advance``) and turn functions that end only when the test says so."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from dispatch_helpers import Stepped, Turns

from lanequeue import (
    DispatcherDrainingError,
    LaneError,
    Ticket,
    TurnCancelledError,
    TurnDroppedError,
    TurnRejectedError,
    TurnTimedOutError,
    current_turn,
)


@pytest.fixture
def turns() -> Turns:
    return Turns()


def make(**kw: Any) -> Stepped:
    return Stepped(**kw)


def books(h: Stepped) -> None:
    s = h.d.stats
    assert s.submitted == (s.done + s.failed + s.cancelled + s.dropped + s.rejected
                           + s.timed_out + s.pending + s.running), s


def err(h: Stepped, t: Ticket) -> BaseException:
    kind, value = h.outcome(t)
    assert kind == "err", (t, value)
    assert isinstance(value, BaseException)
    return value


def test_enqueue_runs_each_key_in_submit_order_and_keys_in_parallel(turns: Turns) -> None:
    h = make()
    try:
        a = [h.submit("a", turns.turn, f"a{i}") for i in range(3)]
        b = h.submit("b", turns.turn, "b0")
        assert all(t.state in ("pending", "running") for t in a)
        # Different keys run in parallel; a key's second turn waits for its first.
        assert turns.started() == ["a0", "b0"]
        assert h.d.pending("a") == 2 and h.d.pending("b") == 0
        snap = h.d.snapshot()["keys"]
        assert snap["a"]["running"] and snap["a"]["pending"] == 2
        assert snap["a"]["blocked_by"] == "key"
        turns.finish("a1")  # finishing a later turn first changes nothing: it has not started
        h.settle()
        assert turns.started() == ["a0", "b0"]
        for label in ("a0", "a1", "a2", "b0"):
            turns.finish(label)
            h.settle()
        assert turns.started() == ["a0", "b0", "a1", "a2"]
        assert [h.outcome(t) for t in a] == [("ok", "r:a0"), ("ok", "r:a1"), ("ok", "r:a2")]
        assert h.outcome(b) == ("ok", "r:b0")
        s = h.d.stats
        assert (s.submitted, s.done, s.pending, s.running) == (4, 4, 0, 0)
        assert h.run(h.d.wait_idle(0)) is True
        assert h.d.snapshot()["keys"] == {}
    finally:
        h.close()


def test_reject_fails_a_busy_keys_submit_at_once(turns: Turns) -> None:
    h = make(busy="reject")
    try:
        first = h.submit("k", turns.turn, 1)
        second = h.submit("k", turns.turn, 2)
        assert second.state == "rejected" and second.reason == "busy"
        e = err(h, second)
        assert isinstance(e, TurnRejectedError) and isinstance(e, LaneError)
        assert (e.state, e.key, e.reason) == ("rejected", "k", "busy")
        other = h.submit("j", turns.turn, 3)  # another key is not busy
        assert other.state == "running"
        turns.finish(1)
        h.settle()
        third = h.submit("k", turns.turn, 4)  # free again
        assert third.state == "running"
        assert h.outcome(first) == ("ok", "r:1")
        assert h.d.stats.rejected == 1
    finally:
        h.close()


def test_steer_hands_payloads_to_the_running_turn_and_runs_the_rest_next() -> None:
    h = make(busy="steer")
    seen: list[Any] = []
    go: dict[str, asyncio.Event] = {"first": asyncio.Event(), "again": asyncio.Event()}

    async def chat(text: str) -> str:
        turn = current_turn()
        seen.append(("start", text, turn.key, turn.ticket.args))
        if text == "hi":
            await go["first"].wait()
            taken = turn.inbox.take()  # the steered payloads so far
            seen.append(("took", taken))
            await go["again"].wait()  # more arrive, but this turn never takes them
        return f"reply to {text}"

    try:
        t1 = h.submit("k", chat, "hi")
        t2 = h.submit("k", chat, "also this")
        t3 = h.submit("k", chat, "and this")
        assert h.d.pending("k") == 2 and t2.state == "pending"
        go["first"].set()
        h.settle()
        assert seen[-1] == ("took", ["also this", "and this"])
        assert t2.state == "running" and t3.state == "running"
        t4 = h.submit("k", chat, "late")  # steered, but never taken
        go["again"].set()
        h.settle()
        # t2 and t3 were taken: they end with the running turn's result.
        assert [h.outcome(t) for t in (t1, t2, t3)] == [("ok", "reply to hi")] * 3
        # t4 was not taken: it ran as a normal turn next, with its own payload.
        assert h.outcome(t4) == ("ok", "reply to late")
        assert [x[1] for x in seen if x[0] == "start"] == ["hi", "late"]
        assert h.d.stats.steered == 2
        books(h)
    finally:
        h.close()


def test_steer_with_another_fn_enqueues(turns: Turns) -> None:
    h = make(busy="steer")
    try:
        h.submit("k", turns.turn, 1)
        other = h.submit("k", turns.batch, [2])
        turns.finish(1)
        h.settle()
        assert turns.started() == [1, (2,)]
        turns.finish((2,))
        h.settle()
        assert h.outcome(other) == ("ok", "r:(2,)")
    finally:
        h.close()


def test_interrupt_cancels_the_running_turn_and_drops_the_pending(turns: Turns) -> None:
    dropped: list[list[Ticket]] = []
    h = make(busy="interrupt", on_drop=dropped.append)
    try:
        t1 = h.submit("k", turns.turn, 1)
        t2 = h.submit("k", turns.turn, 2, busy="enqueue")
        t3 = h.submit("k", turns.turn, 3, busy="enqueue")
        assert turns.started() == [1]
        t4 = h.submit("k", turns.turn, 4)
        # The running turn's task was cancelled, the pending ones dropped, 4 runs next.
        assert ("cancelled", 1) in turns.log
        assert t1.state == "cancelled" and t1.reason == "superseded"
        assert isinstance(err(h, t1), TurnCancelledError)
        for t in (t2, t3):
            assert (t.state, t.reason) == ("dropped", "superseded")
            assert isinstance(err(h, t), TurnDroppedError)
        assert dropped == [[t2, t3]]
        assert turns.started() == [1, 4]
        turns.finish(4)
        h.settle()
        assert h.outcome(t4) == ("ok", "r:4")
        s = h.d.stats
        assert (s.cancelled, s.dropped, s.done) == (1, 2, 1)
        books(h)
    finally:
        h.close()


def test_interrupt_drops_the_current_turn_that_has_not_started_yet(turns: Turns) -> None:
    """A turn submitted a moment earlier on an idle key is the key's current turn, but
    its ``fn`` is called only when the loop next runs: an interrupt submitted before that
    drops it (``dropped``, "superseded"), it does not cancel it, and runs next."""
    dropped: list[list[Ticket]] = []
    h = make(busy="interrupt", on_drop=dropped.append)
    try:
        def both() -> tuple[Ticket, Ticket]:
            first = h.d.submit("k", turns.turn, 1)
            assert (first.state, turns.started()) == ("pending", [])  # not running yet
            return first, h.d.submit("k", turns.turn, 2)

        first, second = h.call(both)
        assert (first.state, first.reason) == ("dropped", "superseded")
        assert isinstance(err(h, first), TurnDroppedError)
        assert dropped == [[first]]
        assert turns.started() == [2] and ("cancelled", 1) not in turns.log
        turns.finish(2)
        h.settle()
        assert h.outcome(second) == ("ok", "r:2")
        s = h.d.stats
        assert (s.cancelled, s.dropped, s.done) == (0, 1, 1)
        books(h)
    finally:
        h.close()


def test_replace_keeps_the_running_turn_and_only_the_newest_pending(turns: Turns) -> None:
    h = make(busy="replace")
    try:
        t1 = h.submit("k", turns.turn, 1)
        t2 = h.submit("k", turns.turn, 2)
        t3 = h.submit("k", turns.turn, 3)
        assert (t2.state, t2.reason) == ("dropped", "superseded")
        assert t3.state == "pending"
        turns.finish(1)
        h.settle()
        assert h.outcome(t1) == ("ok", "r:1")
        assert turns.started() == [1, 3]
        turns.finish(3)
        h.settle()
        assert h.outcome(t3) == ("ok", "r:3")
    finally:
        h.close()


def test_collect_merges_pending_turns_of_the_same_fn(turns: Turns) -> None:
    h = make(busy="collect")
    try:
        a = h.submit("k", turns.batch, "a")  # runs alone: a list of one
        b = h.submit("k", turns.batch, "b")
        c = h.submit("k", turns.batch, "c")

        async def other(labels: list[str]) -> str:  # another fn: a list of one as well
            return await turns.turn(("other", *labels))

        x = h.submit("k", other, "x")  # another fn: waits its turn, not merged
        d = h.submit("k", turns.batch, "d")
        assert turns.started() == [("a",)]
        turns.finish(("a",))
        h.settle()
        assert turns.started() == [("a",), ("b", "c")]
        turns.finish(("b", "c"))
        h.settle()
        assert turns.started()[-1] == ("other", "x")
        turns.finish(("other", "x"))
        h.settle()
        assert turns.started()[-1] == ("d",)
        turns.finish(("d",))
        h.settle()
        assert h.outcome(a) == ("ok", "r:('a',)")
        assert h.outcome(b) == h.outcome(c) == ("ok", "r:('b', 'c')")
        assert h.outcome(x) == ("ok", "r:('other', 'x')")
        assert h.outcome(d) == ("ok", "r:('d',)")
        assert h.d.stats.merged == 1
        books(h)
    finally:
        h.close()


def test_collect_debounce_waits_for_a_quiet_window(turns: Turns) -> None:
    h = make(busy="collect", debounce_s=0.5)
    try:
        a = h.submit("k", turns.batch, "a")
        h.advance(0.3)
        b = h.submit("k", turns.batch, "b")
        assert h.d.snapshot()["keys"]["k"]["blocked_by"] == "debounce"
        h.advance(0.4)  # 0.4 s after b: still quiet for less than 0.5 s
        assert turns.started() == []
        h.advance(0.1)
        assert turns.started() == [("a", "b")]
        turns.finish(("a", "b"))
        h.settle()
        assert h.outcome(a) == h.outcome(b) == ("ok", "r:('a', 'b')")
    finally:
        h.close()


def test_collect_max_wait_bounds_a_steady_stream(turns: Turns) -> None:
    h = make(busy="collect", debounce_s=0.5, max_wait_s=1.0)
    try:
        for i in range(4):  # one every 0.3 s: never quiet for 0.5 s
            h.submit("k", turns.batch, i)
            h.advance(0.3)
        # 1.2 s passed; the first turn's 1.0 s bound started the call at 1.0 s with what
        # had come by then (0, 1, 2, 3 came at 0, 0.3, 0.6, 0.9).
        assert turns.started() == [(0, 1, 2, 3)]
    finally:
        h.close()


@pytest.mark.parametrize("overflow", ["reject_new", "drop_oldest"])
def test_bounded_pending_per_key(turns: Turns, overflow: str) -> None:
    dropped: list[list[Ticket]] = []
    h = make(max_pending=2, overflow=overflow, on_drop=dropped.append)
    try:
        running = h.submit("k", turns.turn, 0)
        p1 = h.submit("k", turns.turn, 1)
        p2 = h.submit("k", turns.turn, 2)  # max_pending counts pending only: 2 fit
        p3 = h.submit("k", turns.turn, 3)
        assert running.state == "running" and h.d.pending("k") == 2
        if overflow == "reject_new":
            assert (p3.state, p3.reason) == ("rejected", "overflow")
            assert p1.state == p2.state == "pending"
            assert dropped == []
            assert isinstance(err(h, p3), TurnRejectedError)
        else:
            assert (p1.state, p1.reason) == ("dropped", "overflow")
            assert p2.state == p3.state == "pending"
            assert dropped == [[p1]]
        books(h)
    finally:
        h.close()


def test_C31_a_webhook_delivered_twice_runs_once_and_returns_the_same_ticket(
        turns: Turns) -> None:
    h = make(dedupe_ttl_s=300.0)
    try:
        first = h.submit("slack:c1", turns.turn, "evt", dedupe_id="Ev123")
        again = h.submit("slack:c1", turns.turn, "evt", dedupe_id="Ev123")
        assert again is first
        turns.finish("evt")
        h.settle()
        late = h.submit("slack:c1", turns.turn, "evt", dedupe_id="Ev123")  # after it ran
        assert late is first
        assert turns.started() == ["evt"]
        s = h.d.stats
        assert (s.submitted, s.deduped, s.done) == (1, 2, 1)
        # Past the window the id is new again.
        h.advance(300.0)
        assert h.d.snapshot()["dedupe_entries"] == 0
        fresh = h.submit("slack:c1", turns.turn, "evt2", dedupe_id="Ev123")
        assert fresh is not first
    finally:
        h.close()


def test_dedupe_forgets_a_turn_that_never_ran_and_is_bounded(turns: Turns) -> None:
    h = make(busy="reject", dedupe_max=3)
    try:
        h.submit("k", turns.turn, 0)
        rejected = h.submit("k", turns.turn, 1, dedupe_id="m1")
        assert rejected.state == "rejected"
        retry = h.submit("k", turns.turn, 1, dedupe_id="m1", busy="enqueue")
        assert retry is not rejected  # a genuine retry runs
        assert h.call(h.d.cancel, retry) is True
        again = h.submit("k", turns.turn, 1, dedupe_id="m1", busy="enqueue")
        assert again is not retry
        for i in range(2, 6):
            h.submit(f"x{i}", turns.turn, i, dedupe_id=f"m{i}")
        assert h.d.snapshot()["dedupe_entries"] == 3  # the oldest ids went first
        assert h.submit("k", turns.turn, 1, dedupe_id="m1", busy="enqueue") is not again
    finally:
        h.close()


def test_dedupe_max_zero_keeps_no_id_so_every_submit_runs(turns: Turns) -> None:
    """README: ``dedupe_max=0`` keeps none: every submit runs, dedupe is off."""
    h = make(dedupe_max=0)
    try:
        first = h.submit("k", turns.turn, 1, dedupe_id="m1")
        again = h.submit("k", turns.turn, 2, dedupe_id="m1")
        assert again is not first
        assert h.d.snapshot()["dedupe_entries"] == 0
        turns.finish(1)
        h.settle()
        turns.finish(2)
        h.settle()
        assert turns.started() == [1, 2]
        books(h)
    finally:
        h.close()


def test_start_timeout_counts_pending_time(turns: Turns) -> None:
    h = make()
    try:
        h.submit("k", turns.turn, 1)
        waiting = h.submit("k", turns.turn, 2, timeout_s=5.0)
        h.advance(4.9)
        assert waiting.state == "pending"
        h.advance(0.1)
        assert (waiting.state, waiting.reason) == ("timed_out", "start timeout")
        e = err(h, waiting)
        assert isinstance(e, TurnTimedOutError) and isinstance(e, TimeoutError)
        turns.finish(1)
        h.settle()
        assert turns.started() == [1]
        books(h)
    finally:
        h.close()


def test_start_timeout_while_waiting_for_the_lanes(turns: Turns) -> None:
    h = make(global_cap=1)
    try:
        h.submit("a", turns.turn, "a")
        b = h.submit("b", turns.turn, "b", timeout_s=2.0)
        assert h.d.snapshot()["keys"]["b"]["blocked_by"] == "global"
        h.advance(2.0)
        assert (b.state, b.reason) == ("timed_out", "start timeout")
        turns.finish("a")
        h.settle()
        assert turns.started() == ["a"] and h.run(h.d.wait_idle(0))
    finally:
        h.close()


def test_run_timeout_cancels_the_turn(turns: Turns) -> None:
    h = make()
    try:
        t = h.submit("k", turns.turn, 1, run_timeout_s=3.0)
        nxt = h.submit("k", turns.turn, 2)
        h.advance(3.0)
        assert ("cancelled", 1) in turns.log
        assert (t.state, t.reason) == ("timed_out", "run timeout")
        assert isinstance(err(h, t), TurnTimedOutError)
        assert turns.started() == [1, 2] and nxt.state == "running"
    finally:
        h.close()


def test_failed_reraises_the_functions_own_exception(turns: Turns) -> None:
    h = make()
    try:
        t = h.submit("k", turns.turn, 1)
        boom = KeyError("boom")
        turns.fail(1, boom)
        h.settle()
        assert t.state == "failed"
        assert err(h, t) is boom
        assert h.d.stats.failed == 1
    finally:
        h.close()


def test_cancel_pending_and_running_and_awaiter_cancel_does_not_cancel(turns: Turns) -> None:
    h = make()
    try:
        running = h.submit("k", turns.turn, 1)
        pending = h.submit("k", turns.turn, 2)
        # Cancelling a task that awaits the ticket does not cancel the turn.
        waiter = h.start(_await(running))
        waiter.cancel()
        h.settle()
        assert running.state == "running"
        assert h.call(h.d.cancel, pending) is True
        assert (pending.state, pending.reason) == ("cancelled", "cancelled")
        assert h.call(running.cancel) is True  # Ticket.cancel is dispatcher.cancel
        assert ("cancelled", 1) in turns.log and running.state == "cancelled"
        assert h.call(h.d.cancel, running) is False  # ended already
        e = err(h, running)
        assert isinstance(e, TurnCancelledError) and not isinstance(e, asyncio.CancelledError)
        books(h)
    finally:
        h.close()


async def _await(t: Ticket) -> Any:
    return await t


def test_clear_ends_pending_turns_and_returns_how_many(turns: Turns) -> None:
    h = make()
    try:
        running = h.submit("k", turns.turn, 1)
        rest = [h.submit("k", turns.turn, i) for i in (2, 3)]
        assert h.call(h.d.clear, "k") == 2
        assert [(t.state, t.reason) for t in rest] == [("cancelled", "cleared")] * 2
        assert running.state == "running"
        assert h.call(h.d.clear, "nobody") == 0
        turns.finish(1)
        h.settle()
        assert h.outcome(running) == ("ok", "r:1")
    finally:
        h.close()


def test_drain_refuses_new_work_and_waits_for_the_rest(turns: Turns) -> None:
    h = make()
    try:
        a = h.submit("k", turns.turn, 1)
        b = h.submit("k", turns.turn, 2)
        assert h.run(h.d.drain(0.0)) is False  # refuses at once, does not wait
        with pytest.raises(DispatcherDrainingError):
            h.call(h.d.submit, "k", turns.turn, 3)
        waiting = h.start(h.d.drain(10.0))
        turns.finish(1)
        h.settle()
        assert not waiting.done() and turns.started() == [1, 2]  # pending turns still run
        turns.finish(2)
        h.settle()
        assert waiting.done() and waiting.result() is True
        assert a.state == b.state == "done"
        late = h.start(h.d.drain(None))
        assert late.result() is True
    finally:
        h.close()


def test_drain_times_out_on_the_loop_clock(turns: Turns) -> None:
    h = make()
    try:
        h.submit("k", turns.turn, 1)
        waiting = h.start(h.d.drain(5.0))
        h.advance(5.0)
        assert waiting.done() and waiting.result() is False
    finally:
        h.close()


def test_close_cancels_running_and_pending(turns: Turns) -> None:
    h = make()
    try:
        a = h.submit("k", turns.turn, 1)
        b = h.submit("k", turns.turn, 2)
        h.call(h.d.close)
        assert (b.state, b.reason) == ("cancelled", "closed")
        assert (a.state, a.reason) == ("cancelled", "closed")
        assert ("cancelled", 1) in turns.log
        assert h.run(h.d.wait_idle(0)) is True
        with pytest.raises(DispatcherDrainingError):
            h.call(h.d.submit, "k", turns.turn, 3)
        books(h)
    finally:
        h.close()


def test_priority_orders_keys_at_a_counting_lane(turns: Turns) -> None:
    h = make(global_cap=1)
    try:
        h.submit("a", turns.turn, "a")
        low = h.submit("b", turns.turn, "b", priority=0)
        high = h.submit("c", turns.turn, "c", priority=5)
        assert h.d.snapshot()["ready"] == 2
        turns.finish("a")
        h.settle()
        assert turns.started() == ["a", "c"]
        turns.finish("c")
        h.settle()
        assert turns.started() == ["a", "c", "b"]
        assert high.state == "done" and low.state == "running"
    finally:
        h.close()


def test_priority_ages_so_no_key_starves(turns: Turns) -> None:
    h = make(global_cap=1, ageing_s=30.0)
    try:
        h.submit("a", turns.turn, "a")
        h.submit("old", turns.turn, "old", priority=0)
        h.advance(200.0)  # waited 200 s: worth 6 levels at one per 30 s
        h.submit("new", turns.turn, "new", priority=5)
        turns.finish("a")
        h.settle()
        assert turns.started() == ["a", "old"]
    finally:
        h.close()


def test_a_keys_own_turns_stay_fifo_whatever_their_priority(turns: Turns) -> None:
    h = make(global_cap=1)
    try:
        h.submit("k", turns.turn, 1, priority=0)
        h.submit("k", turns.turn, 2, priority=0)
        h.submit("k", turns.turn, 3, priority=9)
        for i in (1, 2, 3):
            turns.finish(i)
            h.settle()
        assert turns.started() == [1, 2, 3]
    finally:
        h.close()


def test_current_turn_outside_a_turn_raises() -> None:
    with pytest.raises(LookupError):
        current_turn()


@pytest.mark.parametrize(
    ("kw", "exc"),
    [
        ({"busy": "sometimes"}, ValueError),
        ({"busy": 3}, TypeError),
        ({"max_pending": -1}, ValueError),
        ({"overflow": "drop_newest"}, ValueError),
        ({"dedupe_ttl_s": -1}, ValueError),
        ({"dedupe_max": "9"}, TypeError),
        ({"ageing_s": 0}, ValueError),
        ({"lanes": "session"}, TypeError),
        ({"lanes": ("session", "nope")}, KeyError),
        ({"on_drop": 5}, TypeError),
    ],
)
def test_bad_constructor_arguments(kw: dict[str, Any], exc: type[Exception]) -> None:
    with pytest.raises(exc):
        Stepped(**kw)


def test_bad_submit_arguments(turns: Turns) -> None:
    h = make()
    try:
        with pytest.raises(TypeError, match="fn"):
            h.submit("k", 42)
        with pytest.raises(ValueError, match="key"):
            h.submit("", turns.turn, 1)
        with pytest.raises(TypeError, match="priority"):
            h.submit("k", turns.turn, 1, priority=1.5)
        with pytest.raises(ValueError, match="timeout_s"):
            h.submit("k", turns.turn, 1, timeout_s=-1)
        with pytest.raises(TypeError, match="dedupe_id"):
            h.submit("k", turns.turn, 1, dedupe_id=7)
        with pytest.raises(ValueError, match="busy"):
            h.submit("k", turns.turn, 1, busy="nope")
        assert h.d.stats.submitted == 0
    finally:
        h.close()


def test_submit_outside_the_loop_raises() -> None:
    h = make()
    try:
        with pytest.raises(RuntimeError, match="event loop"):
            h.d.submit("k", lambda: None)
    finally:
        h.close()


def test_ticket_cancel_off_the_loop_raises_and_changes_nothing(turns: Turns) -> None:
    h = make()
    try:
        t = h.submit("k", turns.turn, 1)
        with pytest.raises(RuntimeError, match="event loop"):
            t.cancel()  # called from outside the loop (this test's thread)
        assert t.state == "running"
    finally:
        h.close()


def test_start_timeout_defaults_to_the_smallest_lane_timeout(turns: Turns) -> None:
    h = Stepped(session_timeout_s=5.0)  # the global lane waits 300 s
    try:
        h.submit("k", turns.turn, 1)
        waiting = h.submit("k", turns.turn, 2)
        unlimited = h.submit("k", turns.turn, 3, timeout_s=None)
        h.advance(4.9)
        assert waiting.state == "pending"
        h.advance(0.1)
        assert (waiting.state, waiting.reason) == ("timed_out", "start timeout")
        h.advance(10_000.0)
        assert unlimited.state == "pending"
    finally:
        h.close()


def test_without_a_counting_lane_there_is_no_gate(turns: Turns) -> None:
    h = Stepped(lanes=("session",))
    try:
        for i in range(20):
            h.submit(f"k{i}", turns.turn, i, priority=i % 3)
        assert sorted(turns.started()) == list(range(20))  # all at once, in submit order
        assert turns.started() == list(range(20))
        assert h.d.snapshot()["slots"] is None
    finally:
        h.close()
