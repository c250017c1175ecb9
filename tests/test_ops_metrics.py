"""Metrics of the in-process lanes: the wait and hold histograms kept as counters in the
lane, and the exporters of lanequeue.metrics (Prometheus through prometheus_client's own
text parser, OpenTelemetry through the SDK's in-memory reader).

A scripted run on a fake clock gives waits of known length: the test drives it with the
park hook (a waiter is in line when it parks) and moves the clock by hand.
"""

from __future__ import annotations

import asyncio
import gc
import logging
import sys
import threading
import weakref
from bisect import bisect_left
from typing import Any

import pytest
from conftest import FakeClock, ParkHooks, run_thread
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from lanequeue import (
    AsyncSessionLane,
    Lane,
    LaneQueue,
    SessionLane,
    ThreadDispatcher,
    build_default_lanes,
)
from lanequeue.metrics import PrometheusCollector, instrument_otel


def scripted_run(lane: Any, clock: FakeClock, park_hooks: ParkHooks) -> None:
    """On ``lane`` (one permit for key "k"): 2 immediate grants, one wait of 0.3 s that is
    granted, one wait that times out, one refusal. Holds last 0.2 s (the first) and 0.3 s
    (the one handed over), and 0 s (the second immediate one)."""
    with lane.acquire("k"):
        clock.advance(0.2)
    assert lane.try_acquire("k")  # held from now on by the main thread
    box: dict[str, Any] = {}

    def granted() -> bool:
        ok: bool = lane.acquire_timeout("k", 30)
        clock.advance(0.3)  # its hold lasts 0.3 s
        lane.manual_release("k")
        return ok

    t = run_thread("W", granted, box)
    assert park_hooks.parked("W").wait(10)
    clock.advance(0.3)  # the waiter has waited 0.3 s when the key is handed over
    lane.manual_release("k")
    t.join(10)
    assert box["W"] is True
    assert lane.try_acquire("k")
    assert lane.acquire_timeout("k", 0.01) is False  # a real wait that runs out
    assert lane.try_acquire("k") is False  # a refusal: not a wait, not a timeout
    lane.manual_release("k")


def make(kind: str, clock: FakeClock) -> Any:
    if kind == "session":
        return SessionLane("sess", clock=clock)
    return Lane("cnt", max_concurrent=1, clock=clock)


@pytest.mark.timeout(20)
@pytest.mark.parametrize("kind", ["session", "counting"])
def test_wait_histogram_counts_immediate_grants_and_waits(
    kind: str, fake_clock: FakeClock, park_hooks: ParkHooks
) -> None:
    lane = make(kind, fake_clock)
    lane.track_holds()
    scripted_run(lane, fake_clock, park_hooks)
    [m] = lane.metrics_snapshot()
    st = lane.stats
    assert (st.acquired, st.timeouts, st.rejected, st.cancelled) == (4, 1, 1, 0)
    assert m.stats == st and m.kind == kind and m.lane == lane.name
    # Every acquisition that was not refused: 3 immediate grants (0 s), the granted wait
    # (0.3 s) and the timed-out one (0 s on the fake clock).
    assert m.wait.count == st.acquired + st.timeouts == 5
    bounds = m.wait.bounds
    assert m.wait.counts[0] == 4  # 3 immediate grants + the timeout (0 s, fake clock)
    assert m.wait.counts[bounds.index(0.5)] == 1  # the 0.3 s wait: 0.25 < w <= 0.5
    assert m.wait.sum == pytest.approx(0.3)
    # Holds: 0.2 s, 0.3 s (handed over to W), 0.3 s (W's own), 0 s (the last one).
    assert m.hold is not None and m.hold.count == st.released == 4
    assert m.hold.sum == pytest.approx(0.8)
    assert m.sessions == (1 if kind == "session" else None)
    assert m.oldest_wait_s == 0.0


def test_hold_times_are_off_until_asked(fake_clock: FakeClock) -> None:
    lane = SessionLane(clock=fake_clock)
    with lane.acquire("k"):
        fake_clock.advance(1.0)
    assert lane.metrics_snapshot()[0].hold is None
    lane.track_holds()
    lane.track_holds()  # idempotent
    with lane.acquire("k"):
        fake_clock.advance(2.0)
    hold = lane.metrics_snapshot()[0].hold
    assert hold is not None and hold.count == 1 and hold.sum == pytest.approx(2.0)


@pytest.mark.timeout(10)
def test_oldest_wait_is_the_longest_current_wait(
    fake_clock: FakeClock, park_hooks: ParkHooks
) -> None:
    lane = SessionLane(clock=fake_clock, warn_after_s=None)
    assert lane.try_acquire("a") and lane.try_acquire("b")
    box: dict[str, Any] = {}
    ta = run_thread("A", lambda: lane.acquire_timeout("a", 30), box)
    assert park_hooks.parked("A").wait(10)
    fake_clock.advance(5.0)
    tb = run_thread("B", lambda: lane.acquire_timeout("b", 30), box)
    assert park_hooks.parked("B").wait(10)
    fake_clock.advance(1.0)
    assert lane.metrics_snapshot()[0].oldest_wait_s == pytest.approx(6.0)
    lane.manual_release("a")
    ta.join(10)
    assert lane.metrics_snapshot()[0].oldest_wait_s == pytest.approx(1.0)
    lane.manual_release("b")
    tb.join(10)
    assert lane.metrics_snapshot()[0].oldest_wait_s == 0.0


def samples(registry: CollectorRegistry) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """Every sample of the registry's text output, parsed by prometheus_client."""
    text = generate_latest(registry).decode()
    out: dict[tuple[str, tuple[tuple[str, str], ...]], float] = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


@pytest.mark.timeout(20)
@pytest.mark.parametrize("kind", ["session", "counting"])
def test_prometheus_output_matches_the_lane(
    kind: str, fake_clock: FakeClock, park_hooks: ParkHooks
) -> None:
    lane = make(kind, fake_clock)
    registry = CollectorRegistry()
    PrometheusCollector(lane, registry=registry)  # turns hold times on
    scripted_run(lane, fake_clock, park_hooks)
    got = samples(registry)
    st = lane.stats
    lab = (("kind", kind), ("lane", lane.name))
    assert got[("lanequeue_acquired_total", lab)] == st.acquired
    assert got[("lanequeue_timeouts_total", lab)] == st.timeouts
    assert got[("lanequeue_rejected_total", lab)] == st.rejected
    assert got[("lanequeue_cancelled_total", lab)] == st.cancelled
    assert got[("lanequeue_evicted_total", lab)] == st.evicted
    assert got[("lanequeue_unmatched_releases_total", lab)] == st.unmatched_releases
    assert got[("lanequeue_leases_lost_total", lab)] == 0
    assert got[("lanequeue_holders", lab)] == st.holders
    assert got[("lanequeue_waiters", lab)] == st.waiters
    assert got[("lanequeue_oldest_wait_seconds", lab)] == 0.0
    assert (("lanequeue_sessions", lab) in got) == (kind == "session")
    reason = "key_busy" if kind == "session" else "lane_full"
    wlab = tuple(sorted((*lab, ("reason", reason))))
    [m] = lane.metrics_snapshot()
    assert got[("lanequeue_wait_seconds_count", wlab)] == m.wait.count == 5
    assert got[("lanequeue_wait_seconds_sum", wlab)] == pytest.approx(m.wait.sum)
    for bound, n in m.wait.cumulative():
        le = "+Inf" if bound == float("inf") else str(float(bound))
        assert got[("lanequeue_wait_seconds_bucket", tuple(sorted((*wlab, ("le", le)))))] == n
    assert got[("lanequeue_wait_seconds_bucket", tuple(sorted((*wlab, ("le", "0.005")))))] == 4
    assert got[("lanequeue_hold_seconds_count", lab)] == st.released
    assert got[("lanequeue_hold_seconds_sum", lab)] == pytest.approx(0.8)
    # Never the key as a label.
    assert not any(dict(labels).get(name) == "k" for (_, labels) in got for name in dict(labels))


@pytest.mark.timeout(10)
@pytest.mark.parametrize("view", ["metrics_snapshot", "prometheus", "status", "stats"])
@pytest.mark.parametrize("face", ["thread", "asyncio"])
def test_every_view_evicts_the_expired_entries_before_it_reads(
    view: str, face: str, fake_clock: FakeClock
) -> None:
    # Entries that expired while nothing touched the lane: the first read of any view
    # already counts them evicted, and never shows them gone from the live count
    # without counting them (sessions + evicted is the entries ever made).
    cls = SessionLane if face == "thread" else AsyncSessionLane
    lane = cls("sess", idle_timeout_s=1.0, clock=fake_clock)
    core = lane._core  # the core's own steps: no loop needed for the asyncio face
    for key in ("old1", "old2"):
        core.release(key, core.take(key, False))
    core.take("live", False)  # held from here on: never evicted
    fake_clock.advance(5.0)  # the two idle entries expire; nothing touches the lane
    if view == "metrics_snapshot":
        [m] = lane.metrics_snapshot()
        sessions, evicted = m.sessions, m.stats.evicted
    elif view == "prometheus":
        registry = CollectorRegistry()
        PrometheusCollector(lane, registry=registry)
        got = samples(registry)
        lab = (("kind", "session"), ("lane", "sess"))
        sessions, evicted = got[("lanequeue_sessions", lab)], got[("lanequeue_evicted_total", lab)]
    elif view == "status":
        st = lane.status()
        sessions, evicted = st["sessions"], st["stats"]["evicted"]
    else:
        evicted = lane.stats.evicted
        sessions = len(lane._core._entries)
    assert (sessions, evicted) == (1, 2)


def _otel_collect(lane: Any) -> None:
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.metrics.export import InMemoryMetricReader

    reader = InMemoryMetricReader()
    instrument_otel(lane, meter_provider=MeterProvider(metric_readers=[reader]))
    reader.get_metrics_data()


async def _try_nowait(clock: FakeClock) -> tuple[int, int]:
    lane = AsyncSessionLane("sess", idle_timeout_s=1.0, clock=clock)
    core = lane._core
    for key in ("old1", "old2"):
        core.release(key, core.take(key, False))
    clock.advance(5.0)
    assert lane.try_acquire_nowait("new")
    return core.evicted, len(core._entries)


#: What ``SessionLane.idle_timeout_s`` names, and a call of it on a lane (and a queue of
#: it): the calls that evict the expired idle entries, then those that leave them.
_EVICTING: dict[str, Any] = {
    "``acquire``": lambda lane, q: _enter_and_leave(lane.acquire("new")),
    "``acquire_timeout``": lambda lane, q: lane.acquire_timeout("new", 0),
    "``try_acquire``": lambda lane, q: lane.try_acquire("new"),
    "queue's ``acquire_all``": lambda lane, q: _enter_and_leave(q.acquire_all("new", ["sess"])),
    "``cleanup_idle()``": lambda lane, q: lane.cleanup_idle(),
    "``session_count``": lambda lane, q: lane.session_count,
    "``stats``": lambda lane, q: lane.stats,
    "``statistics()``": lambda lane, q: lane.statistics(),
    "``status()``": lambda lane, q: lane.status(),
    "queue's ``status()``": lambda lane, q: q.status(),
    "``repr(lane)``": lambda lane, q: repr(lane),
    "``metrics_snapshot()``": lambda lane, q: lane.metrics_snapshot(),
    "Prometheus scrape": lambda lane, q: samples(_registry_of(lane)),
    "OpenTelemetry collection": lambda lane, q: _otel_collect(lane),
}
_NOT_EVICTING: dict[str, Any] = {
    "``is_held``": lambda lane, q: lane.is_held("old1"),
    "``waiting_for``": lambda lane, q: lane.waiting_for("old1"),
    "``get_active``": lambda lane, q: lane.get_active(),
    "``active_count``": lambda lane, q: lane.active_count,
    "``waiting``": lambda lane, q: lane.waiting,
    "``stuck()``": lambda lane, q: lane.stuck(0.0),
    "releases": lambda lane, q: lane.manual_release("live"),
}


def _enter_and_leave(hold: Any) -> None:
    with hold:
        pass


def _registry_of(lane: Any) -> CollectorRegistry:
    registry = CollectorRegistry()
    PrometheusCollector(lane, registry=registry)
    return registry


@pytest.mark.timeout(10)
@pytest.mark.parametrize("call", [*_EVICTING, *_NOT_EVICTING, "``try_acquire_nowait``"])
def test_idle_timeout_doc_names_exactly_the_calls_that_evict(
    call: str, fake_clock: FakeClock
) -> None:
    """``SessionLane.idle_timeout_s`` says which calls drop the expired idle entries:
    each call it names as evicting does (two entries expired while nothing touched the
    lane: after the call they are gone and counted), and each it names as leaving them
    does not."""
    doc = " ".join((SessionLane.idle_timeout_s.__doc__ or "").split())
    assert call in doc
    if call == "``try_acquire_nowait``":  # (the asyncio face's)
        assert asyncio.run(_try_nowait(fake_clock)) == (2, 1)
        return
    lane = SessionLane("sess", idle_timeout_s=1.0, clock=fake_clock)
    queue = LaneQueue()
    queue.add(lane)
    assert lane.try_acquire("live")  # held from here on: never evicted
    core = lane._core
    for key in ("old1", "old2"):
        core.release(key, core.take(key, False))
    fake_clock.advance(5.0)  # the two idle entries expire; nothing touches the lane
    evicting = call in _EVICTING
    (_EVICTING if evicting else _NOT_EVICTING)[call](lane, queue)
    left = {"old1", "old2"} & set(core._entries)
    assert (core.evicted, left) == ((2, set()) if evicting else (0, {"old1", "old2"}))


def _dispatcher_run(clock: FakeClock) -> tuple[Any, threading.Event, list[Any]]:
    """A ThreadDispatcher on the fake clock with one ticket in each state: running (its
    turn waits for the event returned), pending behind it (for 2.5 s), done, failed,
    rejected, cancelled, and a deduped submit."""
    d = ThreadDispatcher(build_default_lanes(), clock=clock)
    go, started = threading.Event(), threading.Event()

    def held() -> str:
        started.set()
        assert go.wait(10)
        return "held"

    def boom() -> None:
        raise ValueError("boom")

    running = d.submit("a", held)
    assert started.wait(10)
    pending = d.submit("a", str, "x")
    clock.advance(2.5)
    done = d.submit("c", str, "y", dedupe_id="e1")
    assert done.result(10) == "y"
    assert d.submit("c", str, "y", dedupe_id="e1") is done  # deduped: the same ticket
    failed = d.submit("b", boom)
    with pytest.raises(ValueError):
        failed.result(10)
    rejected = d.submit("a", str, "z", busy="reject")
    cancelled = d.submit("a", str, "w")
    d.cancel(cancelled)
    states = [t.state for t in (running, pending, done, failed, rejected, cancelled)]
    assert states == ["running", "pending", "done", "failed", "rejected", "cancelled"]
    return d, go, [running, pending]


@pytest.mark.timeout(30)
def test_a_dispatcher_exports_its_own_series_and_its_lanes(fake_clock: FakeClock) -> None:
    """A dispatcher as the target: its counters by state, pending and running, the
    oldest pending ticket's wait, all equal to its stats (and submitted equal to the
    ended tickets plus pending and running), with its queue's lanes beside them; the
    same through OpenTelemetry."""
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.metrics.export import InMemoryMetricReader

    d, go, left = _dispatcher_run(fake_clock)
    try:
        registry = CollectorRegistry()
        PrometheusCollector(d, registry=registry)
        got = samples(registry)
        reader = InMemoryMetricReader()
        instrument_otel(d, meter_provider=MeterProvider(metric_readers=[reader]))
        points = _otel_points(reader)
        st = d.stats
        assert (st.submitted, st.done, st.failed, st.rejected, st.cancelled, st.deduped,
                st.pending, st.running) == (6, 1, 1, 1, 1, 1, 1, 1)
        for figures in (got, points):
            assert figures[("lanequeue_dispatch_submitted_total", ())] == st.submitted
            ended = {state: figures[("lanequeue_dispatch_ended_total", (("state", state),))]
                     for state in ("done", "failed", "cancelled", "dropped", "rejected",
                                   "timed_out")}
            assert ended == {"done": 1, "failed": 1, "cancelled": 1, "dropped": 0,
                             "rejected": 1, "timed_out": 0}
            assert figures[("lanequeue_dispatch_deduped_total", ())] == 1
            assert figures[("lanequeue_dispatch_merged_total", ())] == 0
            assert figures[("lanequeue_dispatch_steered_total", ())] == 0
            assert figures[("lanequeue_dispatch_pending", ())] == 1
            assert figures[("lanequeue_dispatch_running", ())] == 1
            assert figures[("lanequeue_dispatch_oldest_pending_seconds", ())] == 2.5
            assert (sum(ended.values()) + figures[("lanequeue_dispatch_pending", ())]
                    + figures[("lanequeue_dispatch_running", ())]
                    == figures[("lanequeue_dispatch_submitted_total", ())])
            # The queue's lanes are there too (the running turn holds both).
            assert figures[("lanequeue_holders", (("kind", "session"),
                                                  ("lane", "session")))] == 1
            assert figures[("lanequeue_holders", (("kind", "counting"),
                                                  ("lane", "global")))] == 1
    finally:
        go.set()
        assert [t.result(10) for t in left] == ["held", "x"]
        d.close()


def _otel_points(reader: Any) -> dict[tuple[str, tuple[tuple[str, Any], ...]], float]:
    """The data points of one collection of ``reader``, by name and attributes (none:
    the SDK's ``get_metrics_data()`` gives None when no instrument reported)."""
    points: dict[tuple[str, tuple[tuple[str, Any], ...]], float] = {}
    data = reader.get_metrics_data()
    for rm in [] if data is None else data.resource_metrics:
        for sm in rm.scope_metrics:
            for metric in sm.metrics:
                for p in metric.data.data_points:
                    points[(metric.name, tuple(sorted(p.attributes.items())))] = p.value
    return points


class TickingClock(FakeClock):
    """A fake clock that moves 10 ms at every read: whatever reads the lane twice sees
    it at two instants."""

    def __call__(self) -> float:
        self.now += 0.01
        return self.now


@pytest.mark.timeout(20)
def test_otel_reports_one_read_of_the_lanes_per_collection() -> None:
    """The instruments of one collection report one snapshot, as one Prometheus scrape
    does: while idle entries expire between reads (a clock that moves at each read),
    ``lanequeue_sessions`` plus ``lanequeue_evicted_total`` is the number of entries ever
    made in every collection (before, each instrument read the lane anew, so the two came
    from different instants). Each collection reads anew: two readers of one provider,
    and the same reader again, each see the entries that expired since."""
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.metrics.export import InMemoryMetricReader

    clock = TickingClock()
    lane = SessionLane("sess", idle_timeout_s=0.3, clock=clock)
    made = 40
    for i in range(made):
        with lane.acquire(f"k{i}"):
            pass
    readers = [InMemoryMetricReader(), InMemoryMetricReader()]
    instrument_otel(lane, meter_provider=MeterProvider(metric_readers=readers))
    lab = (("kind", "session"), ("lane", "sess"))
    seen: list[tuple[float, float]] = []
    for reader in (*readers, readers[0]):
        points = _otel_points(reader)
        sessions = points[("lanequeue_sessions", lab)]
        evicted = points[("lanequeue_evicted_total", lab)]
        assert sessions + evicted == made, (sessions, evicted)
        seen.append((sessions, evicted))
        clock.advance(0.1)  # more entries expire before the next collection
    evictions = [evicted for _, evicted in seen]
    assert 0 < evictions[0] < evictions[1] < evictions[2] < made, seen


@pytest.mark.timeout(30)
def test_otel_reports_one_read_of_a_dispatcher_per_collection(
    fake_clock: FakeClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A dispatcher's series of one collection come from one ``stats``: submitted equals
    the ended tickets plus pending and running even when a ticket is submitted between
    two reads (here, at every read of ``stats``; before, each instrument read it anew,
    and the gauges counted tickets the counter had not). The next collection reads anew
    (once: one ticket more)."""
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.metrics.export import InMemoryMetricReader

    d, go, left = _dispatcher_run(fake_clock)
    real = ThreadDispatcher.stats

    def stats_then_submit(self: Any) -> Any:
        figures = real.fget(self)  # type: ignore[attr-defined]
        left.append(self.submit("a", str, "later"))  # pending behind the running turn
        return figures

    try:
        reader = InMemoryMetricReader()
        instrument_otel(d, meter_provider=MeterProvider(metric_readers=[reader]))
        monkeypatch.setattr(ThreadDispatcher, "stats", property(stats_then_submit))
        submitted = []
        for _ in range(2):
            points = _otel_points(reader)
            ended = sum(points[("lanequeue_dispatch_ended_total", (("state", state),))]
                        for state in ("done", "failed", "cancelled", "dropped", "rejected",
                                      "timed_out"))
            assert (ended + points[("lanequeue_dispatch_pending", ())]
                    + points[("lanequeue_dispatch_running", ())]
                    == points[("lanequeue_dispatch_submitted_total", ())]), points
            submitted.append(points[("lanequeue_dispatch_submitted_total", ())])
        assert submitted == [6, 7]
    finally:
        monkeypatch.undo()
        go.set()
        assert [t.result(10) for t in left] == ["held", "x"] + ["later"] * (len(left) - 2)
        d.close()


def test_otel_shared_read_follows_the_calls_not_their_order() -> None:
    """The read shared by one collection's callbacks: a callback that already reported
    the current read begins the next collection, whatever order the callbacks come in;
    a collection cut short is followed by a fresh read all the same."""
    from lanequeue.metrics import _PerCollection

    reads = iter(range(1, 100))
    shared = _PerCollection(lambda: (None, [next(reads)]))  # type: ignore[list-item]
    a, b, c = shared.seat(), shared.seat(), shared.seat()

    def collect(*seats: int) -> list[Any]:
        return [shared.get(seat)[1][0] for seat in seats]

    assert collect(a, b, c) == [1, 1, 1]
    assert collect(c, a, b) == [2, 2, 2]
    assert collect(b, a) == [3, 3]  # cut short: c was not called
    assert collect(b, c, a) == [4, 4, 4]
    assert collect(a) + collect(a) == [5, 6]


@pytest.mark.timeout(30)
@pytest.mark.parametrize("failing", [{1}, {2}, {2, 3}, {1, 2, 3}, {3, 5, 6}])
@pytest.mark.parametrize("kind", ["queue", "dispatcher"])
def test_otel_a_failed_read_is_the_read_of_its_collection(
    failing: set[int], kind: str, caplog: pytest.LogCaptureFixture
) -> None:
    """A read that raises (here the ``global`` lane's ``metrics_snapshot``, at the reads
    numbered ``failing``) is the read of its collection: that collection has none of the
    target's series, the SDK logging the one callback that read, and the next one, of
    either reader, reads anew for every instrument, once. So every collection's series
    agree with the lanes at that collection (before, the instruments that had not had
    the failed read reported a read of their own, and in the next collection the one
    whose read had failed reported the earlier read beside the others' new one)."""
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.metrics.export import InMemoryMetricReader

    queue = LaneQueue()
    queue.add_session_lane("session")
    queue.add_lane("global", max_concurrent=10)
    real = queue["global"].metrics_snapshot
    reads = 0

    def snapshot() -> Any:
        nonlocal reads
        reads += 1
        if reads in failing:
            raise ConnectionError(f"read {reads} failed")
        return real()

    queue["global"].metrics_snapshot = snapshot  # type: ignore[method-assign]
    d = ThreadDispatcher(queue, lanes=("session", "global")) if kind == "dispatcher" else None
    try:
        readers = [InMemoryMetricReader(), InMemoryMetricReader()]
        instrument_otel(queue if d is None else d,
                        meter_provider=MeterProvider(metric_readers=readers))
        for n in range(1, 8):
            for name in ("session", "global"):
                assert queue[name].acquire_timeout(f"k{n}", 0)  # held: n holders each
            caplog.clear()
            with caplog.at_level(logging.ERROR):
                points = _otel_points(readers[n % 2])
            failed = [r for r in caplog.records if "Callback failed" in r.getMessage()]
            if n in failing:
                assert points == {}, (n, points)
                assert len(failed) == 1, [r.getMessage() for r in failed]
                assert failed[0].exc_info is not None
                assert isinstance(failed[0].exc_info[1], ConnectionError)
                assert reads == n  # one read per collection
                continue
            assert failed == [], (n, [r.getMessage() for r in failed])
            for name, lane_kind in (("session", "session"), ("global", "counting")):
                lab = (("kind", lane_kind), ("lane", name))
                reason = "key_busy" if lane_kind == "session" else "lane_full"
                wlab = tuple(sorted((*lab, ("reason", reason))))
                got = (points[("lanequeue_holders", lab)],
                       points[("lanequeue_acquired_total", lab)],
                       points[("lanequeue_wait_seconds_count", wlab)],
                       points[("lanequeue_hold_seconds_count", lab)])
                assert got == (n, n, n, 0), (n, name, got)
            assert points[("lanequeue_sessions", (("kind", "session"), ("lane", "session")))] == n
            if d is not None:
                assert points[("lanequeue_dispatch_submitted_total", ())] == 0
                assert points[("lanequeue_dispatch_pending", ())] == 0
            assert reads == n  # one read per collection, also after a failed one
    finally:
        if d is not None:
            d.close()


def test_otel_shared_read_that_raises_is_the_read_of_its_collection() -> None:
    """A read that raises is the read of its collection wherever it fails, in whatever
    order the callbacks come: the callback that read gets the exception, the others of
    that collection nothing (None), and the next collection reads anew for all of them;
    consecutive failures, a collection of one callback, and a collection cut short by
    an exception the SDK does not catch, alike."""
    from lanequeue.metrics import _PerCollection

    count = 0
    fail: dict[int, type[BaseException]] = {1: ConnectionError, 3: ConnectionError,
                                             4: ConnectionError, 6: KeyboardInterrupt}

    def read() -> Any:
        nonlocal count
        count += 1
        if count in fail:
            raise fail[count](f"read {count}")
        return (None, [count])

    shared = _PerCollection(read)
    a, b, c = shared.seat(), shared.seat(), shared.seat()

    def collect(*seats: int) -> list[Any]:
        out: list[Any] = []
        for seat in seats:
            try:
                got = shared.get(seat)
            except ConnectionError as exc:
                out.append(str(exc))
            else:
                out.append(None if got is None else got[1][0])
        return out

    assert collect(b, a, c) == ["read 1", None, None]  # fails at its first callback
    assert collect(c, a, b) == [2, 2, 2]
    assert collect(a, c, b) == ["read 3", None, None]  # two in a row
    assert collect(c, b, a) == ["read 4", None, None]
    assert collect(b, c, a) == [5, 5, 5]
    with pytest.raises(KeyboardInterrupt):  # the SDK's collection ends there
        shared.get(a)
    assert collect(a, b, c) == [7, 7, 7]
    assert collect(a, b) == [8, 8]  # cut short: c was not called
    assert count == 8
    fail[9] = ConnectionError
    assert collect(a, b, c) == ["read 9", None, None]  # a begins the next one
    assert collect(a, b, c) == [10, 10, 10]

    alone = _PerCollection(read)
    only = alone.seat()
    fail[11] = ConnectionError
    with pytest.raises(ConnectionError, match="read 11"):
        alone.get(only)
    assert alone.get(only) == (None, [12])


def _acquired(points: dict[tuple[str, tuple[tuple[str, Any], ...]], float]) -> dict[str, float]:
    """``lanequeue_acquired_total`` of each lane in ``points``."""
    return {dict(attrs)["lane"]: value for (name, attrs), value in points.items()
            if name == "lanequeue_acquired_total"}


def test_otel_refuses_a_second_call_on_one_meter_provider() -> None:
    """The SDK answers a second call's instruments with the first's (one instrument of a
    name per meter), so a second target's series were silently missing: the second call
    on one provider, of another lane or of the same one, raises ValueError naming the
    argument, creates nothing and turns nothing on; the first target's series stay
    exact. Another provider takes the same lane or another one."""
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.metrics.export import InMemoryMetricReader

    first, other = Lane("a", max_concurrent=3), SessionLane("b")
    assert first.acquire_timeout("x", 0)
    for key in ("y", "z"):
        assert other.acquire_timeout(key, 0)
    reader = InMemoryMetricReader()
    provider = MeterProvider(metric_readers=[reader])
    assert len(instrument_otel(first, meter_provider=provider)) == 4 + 7 + 6
    for target in (other, first):
        with pytest.raises(ValueError, match=r"^instrument_otel\(\) argument 'meter_provider' "
                                             r"\(MeterProvider\) already has the instruments"
                                             r".*pass another MeterProvider"):
            instrument_otel(target, meter_provider=provider)
    assert other.metrics_snapshot()[0].hold is None  # not turned on
    points = _otel_points(reader)
    assert _acquired(points) == {"a": 1}
    lab = (("kind", "counting"), ("lane", "a"))
    assert points[("lanequeue_holders", lab)] == 1
    assert points[("lanequeue_hold_seconds_count", lab)] == 0
    first.manual_release("x")
    points = _otel_points(reader)
    assert (points[("lanequeue_holders", lab)],
            points[("lanequeue_hold_seconds_count", lab)]) == (0, 1)

    readers = [InMemoryMetricReader(), InMemoryMetricReader()]
    instrument_otel(other, meter_provider=MeterProvider(metric_readers=[readers[0]]))
    instrument_otel(first, meter_provider=MeterProvider(metric_readers=[readers[1]]))
    assert _acquired(_otel_points(readers[0])) == {"b": 2}
    assert _acquired(_otel_points(readers[1])) == {"a": 1}
    assert _acquired(_otel_points(reader)) == {"a": 1}


def test_otel_refuses_a_second_call_on_the_global_meter_provider(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """``meter_provider=None`` is the global provider: a second call with None, or with
    that provider itself, is refused as on any provider."""
    import opentelemetry.metrics
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.metrics.export import InMemoryMetricReader

    reader = InMemoryMetricReader()
    provider = MeterProvider(metric_readers=[reader])
    monkeypatch.setattr(opentelemetry.metrics, "get_meter_provider", lambda: provider)
    first, other = Lane("a"), Lane("b")
    assert first.acquire_timeout("x", 0)
    instrument_otel(first)
    with pytest.raises(ValueError, match=r"^instrument_otel\(\) argument 'meter_provider' is "
                                         "None, and the global MeterProvider already has"):
        instrument_otel(other)
    with pytest.raises(ValueError, match=r"argument 'meter_provider' \(MeterProvider\)"):
        instrument_otel(other, meter_provider=provider)
    assert other.metrics_snapshot()[0].hold is None
    assert _acquired(_otel_points(reader)) == {"a": 1}


def test_otel_holds_its_meter_providers_weakly() -> None:
    """A provider once instrumented can still be collected; one whose meter could not be
    made has nothing of the call and takes a later one."""
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.metrics.export import InMemoryMetricReader

    provider = MeterProvider(shutdown_on_exit=False)
    instrument_otel(Lane("a"), meter_provider=provider)
    gone = weakref.ref(provider)
    del provider
    gc.collect()
    assert gone() is None

    class Flaky:
        """A provider whose first get_meter fails."""

        def __init__(self) -> None:
            self.reader = InMemoryMetricReader()
            self.real = MeterProvider(metric_readers=[self.reader], shutdown_on_exit=False)
            self.calls = 0

        def get_meter(self, name: str) -> Any:
            self.calls += 1
            if self.calls == 1:
                raise RuntimeError("no meter yet")
            return self.real.get_meter(name)

    flaky, lane = Flaky(), Lane("b")
    with pytest.raises(RuntimeError, match="no meter yet"):
        instrument_otel(lane, meter_provider=flaky)
    assert lane.metrics_snapshot()[0].hold is None  # nothing turned on
    instrument_otel(lane, meter_provider=flaky)
    assert _acquired(_otel_points(flaky.reader)) == {"b": 0}
    with pytest.raises(ValueError, match="already has the instruments"):
        instrument_otel(lane, meter_provider=flaky)


def test_prometheus_queue_reports_each_lane_and_lanes_added_later() -> None:
    queue = LaneQueue()
    queue.add_session_lane("session")
    registry = CollectorRegistry()
    collector = PrometheusCollector(queue, registry=registry)
    queue.add_lane("global", max_concurrent=2)
    with queue.acquire_all("k", ["session", "global"]):
        got = samples(registry)
        assert got[("lanequeue_holders", (("kind", "session"), ("lane", "session")))] == 1
        assert got[("lanequeue_holders", (("kind", "counting"), ("lane", "global")))] == 1
    got = samples(registry)
    assert got[("lanequeue_hold_seconds_count", (("kind", "counting"), ("lane", "global")))] == 1
    collector.unregister()
    assert not any(name.startswith("lanequeue_") for name, _ in samples(registry))


def test_prometheus_registers_on_the_default_registry() -> None:
    from prometheus_client import REGISTRY

    lane = Lane("default-registry-probe", max_concurrent=1)
    collector = PrometheusCollector(lane)
    try:
        assert REGISTRY.get_sample_value(
            "lanequeue_acquired_total", {"lane": lane.name, "kind": "counting"}) == 0
    finally:
        collector.unregister()


_REFUSED = (r"already has the series of another PrometheusCollector, and prometheus_client "
            r"refuses the same names twice: pass one target holding all the lanes \(a "
            r"queue, or a dispatcher\), or pass another registry$")


def _series(registry: CollectorRegistry) -> list[tuple[str, tuple[tuple[str, str], ...]]]:
    """Every sample's name and labels in the registry's text output, duplicates kept."""
    text = generate_latest(registry).decode()
    return [(s.name, tuple(sorted(s.labels.items())))
            for family in text_string_to_metric_families(text) for s in family.samples]


@pytest.mark.parametrize("auto_describe", [False, True])
def test_prometheus_registry_refuses_a_second_collector(auto_describe: bool) -> None:
    """Two collectors of lanes with the same names on one registry used to duplicate
    every series silently: describe() names the families, so the registry refuses the
    second one (of other lanes, or of the same queue), and the constructor raises
    ValueError naming the argument and what to do instead, prometheus_client's own
    error chained; nothing is registered or turned on. The first collector's series
    stay exact; another registry takes the refused target."""
    registry = CollectorRegistry(auto_describe=auto_describe)
    first, second = LaneQueue(), LaneQueue()
    for q in (first, second):
        q.add_session_lane("session")
        q.add_lane("global", max_concurrent=2)
    second.add_lane("extra")
    PrometheusCollector(first, registry=registry)
    before = samples(registry)
    for target in (second, Lane("other"), first):
        with pytest.raises(ValueError, match=r"^PrometheusCollector\(\) argument 'registry' "
                                             rf"\(CollectorRegistry\) {_REFUSED}") as info:
            PrometheusCollector(target, registry=registry)
        assert str(info.value.__cause__).startswith("Duplicated timeseries")
    assert all(m.hold is None for m in second["global"].metrics_snapshot())  # not turned on
    assert samples(registry) == before
    with first.acquire_all("k", ["session", "global"]):
        pass
    text = generate_latest(registry).decode()
    series = [ln for ln in text.splitlines()
              if ln.startswith('lanequeue_acquired_total{kind="counting",lane="global"}')]
    assert series == ['lanequeue_acquired_total{kind="counting",lane="global"} 1.0']
    names = _series(registry)
    assert len(names) == len(set(names))
    assert {dict(labels)["lane"] for _, labels in names} == {"session", "global"}
    got = samples(registry)
    alone = CollectorRegistry()
    PrometheusCollector(first, registry=alone)
    assert got == samples(alone)
    for lane, kind in (("session", "session"), ("global", "counting")):
        lab = (("kind", kind), ("lane", lane))
        assert (got[("lanequeue_acquired_total", lab)], got[("lanequeue_holders", lab)],
                got[("lanequeue_hold_seconds_count", lab)]) == (1, 0, 1)

    other = CollectorRegistry(auto_describe=auto_describe)
    PrometheusCollector(second, registry=other)
    assert second["extra"].acquire_timeout("k", 0)
    theirs = samples(other)
    assert theirs[("lanequeue_acquired_total", (("kind", "counting"), ("lane", "extra")))] == 1
    assert theirs[("lanequeue_holders", (("kind", "counting"), ("lane", "extra")))] == 1
    assert {dict(labels)["lane"] for _, labels in _series(other)} == {
        "session", "global", "extra"}
    assert samples(registry) == got


def test_prometheus_default_registry_refuses_a_second_collector() -> None:
    """With ``registry=None`` the message names the default REGISTRY; a ValueError of a
    registry that is not a duplicate passes as it is."""
    lane = Lane("default-registry-twice")
    collector = PrometheusCollector(lane)
    try:
        with pytest.raises(ValueError, match=r"^PrometheusCollector\(\) argument 'registry' "
                                             rf"is None, and the default REGISTRY {_REFUSED}"):
            PrometheusCollector(Lane("another"))
    finally:
        collector.unregister()

    class Picky(CollectorRegistry):
        def register(self, collector: Any) -> None:
            raise ValueError("not today")

    with pytest.raises(ValueError, match=r"^not today$"):
        PrometheusCollector(lane, registry=Picky())


def test_exporters_refuse_a_target_that_is_not_a_lane() -> None:
    """The error names the call and the argument, as a lane constructor's does."""
    with pytest.raises(TypeError, match=r"^PrometheusCollector\(\) argument 'target' must "
                                        "be a lane, a queue of lanes or a dispatcher"):
        PrometheusCollector(object(), registry=CollectorRegistry())
    with pytest.raises(TypeError, match=r"^instrument_otel\(\) argument 'target' must be a "
                                        "lane, a queue of lanes or a dispatcher"):
        instrument_otel(42)


@pytest.mark.parametrize(("kwargs", "name"), [
    ({"registry": 5}, "registry"), ({"registry": "default"}, "registry"),
    ({"hold_times": "no"}, "hold_times"), ({"hold_times": 0}, "hold_times"),
])
def test_exporters_check_their_arguments_before_anything(
    kwargs: dict[str, Any], name: str
) -> None:
    """A TypeError naming the call and the argument; no lane starts observing hold
    times."""
    lane = Lane("global")
    with pytest.raises(TypeError, match=rf"^PrometheusCollector\(\) argument '{name}' "):
        PrometheusCollector(lane, **kwargs)
    if name == "hold_times":
        with pytest.raises(TypeError, match=rf"^instrument_otel\(\) argument '{name}' "):
            instrument_otel(lane, **kwargs)
    assert lane.metrics_snapshot()[0].hold is None


@pytest.mark.timeout(20)
def test_otel_reads_the_same_figures(fake_clock: FakeClock, park_hooks: ParkHooks) -> None:
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.metrics.export import InMemoryMetricReader

    reader = InMemoryMetricReader()
    provider = MeterProvider(metric_readers=[reader])
    lane = make("session", fake_clock)
    instruments = instrument_otel(lane, meter_provider=provider)
    assert len(instruments) == 4 + 7 + 6
    scripted_run(lane, fake_clock, park_hooks)
    data = reader.get_metrics_data()
    points: dict[tuple[str, tuple[tuple[str, Any], ...]], float] = {}
    for rm in data.resource_metrics:
        for sm in rm.scope_metrics:
            assert sm.scope.name == "lanequeue"
            for metric in sm.metrics:
                for p in metric.data.data_points:
                    points[(metric.name, tuple(sorted(p.attributes.items())))] = p.value
    st = lane.stats
    lab = (("kind", "session"), ("lane", "sess"))
    assert points[("lanequeue_acquired_total", lab)] == st.acquired == 4
    assert points[("lanequeue_timeouts_total", lab)] == st.timeouts == 1
    assert points[("lanequeue_rejected_total", lab)] == st.rejected == 1
    assert points[("lanequeue_holders", lab)] == 0
    assert points[("lanequeue_sessions", lab)] == 1
    wlab = tuple(sorted((*lab, ("reason", "key_busy"))))
    assert points[("lanequeue_wait_seconds_count", wlab)] == 5
    assert points[("lanequeue_wait_seconds_sum", wlab)] == pytest.approx(0.3)
    assert points[("lanequeue_wait_seconds_bucket", tuple(sorted((*wlab, ("le", "+Inf")))))] == 5
    assert points[("lanequeue_wait_seconds_bucket", tuple(sorted((*wlab, ("le", "0.25")))))] == 4
    assert points[("lanequeue_hold_seconds_count", lab)] == st.released


@pytest.mark.timeout(20)
def test_waits_ended_by_an_interrupt_are_observed(park_hooks: ParkHooks) -> None:
    lane = SessionLane(warn_after_s=None)
    assert lane.try_acquire("k")
    park_hooks.on("W", lambda waiter, timeout: (_ for _ in ()).throw(KeyboardInterrupt()))
    box: dict[str, Any] = {}
    t = run_thread("W", lambda: lane.acquire_timeout("k", 30), box)
    t.join(10)
    assert isinstance(box["W"], KeyboardInterrupt)
    [m] = lane.metrics_snapshot()
    assert m.stats.cancelled == 1 and m.wait.count == 2  # the grant (0) and the interrupt


@pytest.mark.timeout(20)
@pytest.mark.parametrize("kind", ["session", "counting"])
@pytest.mark.parametrize("after_grant", ["scrape", "interrupt"])
def test_a_handed_over_wait_is_counted_once_at_its_grant(
    kind: str, after_grant: str, fake_clock: FakeClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Thread lanes: the hand-off counts the wait it ends, under the lock it holds. A
    scrape made after the grant and before the granted thread runs again sees the wait
    with its length, never as an immediate grant that later moves to another bucket
    (a cumulative bucket going down, which Prometheus reads as a counter reset); an
    interrupt landing in the granted thread right after its grant does not count the
    wait a second time (the wait count stays acquired + timeouts + cancelled)."""
    from lanequeue.lanes import _ThreadWaiter

    lane = make(kind, fake_clock)
    granted, go = threading.Event(), threading.Event()
    original = _ThreadWaiter.park

    def park(self: Any, timeout: float | None) -> bool:
        ok = original(self, timeout)
        granted.set()  # the grant is in; the thread has not gone on yet
        assert go.wait(10)
        if after_grant == "interrupt":
            raise KeyboardInterrupt
        return ok

    monkeypatch.setattr(_ThreadWaiter, "park", park)
    assert lane.try_acquire("k")
    box: dict[str, Any] = {}
    t = run_thread("W", lambda: lane.acquire_timeout("k", 30), box)
    while lane.waiting < 1:
        threading.Event().wait(0.001)
    fake_clock.advance(1.0)
    assert lane.manual_release("k")  # hands the key to W after a 1 s wait
    assert granted.wait(10)
    [first] = lane.metrics_snapshot()
    go.set()
    t.join(10)
    [then] = lane.metrics_snapshot()
    one = first.wait.bounds.index(1.0)
    assert (first.wait.counts[0], first.wait.counts[one]) == (1, 1)  # try_acquire; W
    assert then.wait.counts == first.wait.counts and then.wait.sum == pytest.approx(1.0)
    st = then.stats
    assert then.wait.count == st.acquired + st.timeouts + st.cancelled == 2
    if after_grant == "interrupt":
        assert isinstance(box["W"], KeyboardInterrupt)
        assert st.holders == 0 and st.released == 2  # W's permit was passed on
    else:
        assert box["W"] is True and lane.manual_release("k")


def test_hold_times_can_be_left_off(fake_clock: FakeClock) -> None:
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.metrics.export import InMemoryMetricReader

    lane = SessionLane(clock=fake_clock)
    registry = CollectorRegistry()
    PrometheusCollector(lane, registry=registry, hold_times=False)
    instruments = instrument_otel(lane, meter_provider=MeterProvider(
        metric_readers=[InMemoryMetricReader()]), hold_times=False)
    assert len(instruments) == 4 + 7 + 3  # no hold histogram
    with lane.acquire("k"):
        fake_clock.advance(1.0)
    assert lane.metrics_snapshot()[0].hold is None  # the release path was left alone
    got = samples(registry)
    assert not any(name.startswith("lanequeue_hold_seconds") for name, _ in got)
    assert got[("lanequeue_acquired_total", (("kind", "session"), ("lane", "session")))] == 1


@pytest.mark.timeout(10)
def test_asyncio_waits_are_observed_on_the_loop_clock() -> None:
    from conftest import FakeClockLoop

    from lanequeue import AsyncLane

    loop = FakeClockLoop()
    try:
        lane = AsyncLane("cnt", max_concurrent=1, clock=loop.time, warn_after_s=None)
        out: list[bool] = []

        async def hold() -> None:
            assert await lane.try_acquire("k")

        async def wait(timeout: float | None) -> None:
            out.append(await lane.acquire_timeout("k", timeout))

        loop.run_until_complete(hold())
        granted = loop.create_task(wait(None))
        cancelled = loop.create_task(wait(None))
        loop.settle()
        loop.advance(0.2)
        assert lane.metrics_snapshot()[0].oldest_wait_s == pytest.approx(0.2)
        cancelled.cancel()
        loop.settle()
        loop.advance(0.5)
        loop.call_soon(lane.manual_release_nowait, "k")  # 0.7 s after the waiters joined
        loop.settle()
        assert granted.done() and out == [True]
        [m] = lane.metrics_snapshot()
        assert m.stats.cancelled == 1 and m.wait.count == 3
        assert m.wait.sum == pytest.approx(0.2 + 0.7)
        assert m.wait.counts[m.wait.bounds.index(0.25)] == 1  # the cancelled one: 0.2 s
        assert m.wait.counts[m.wait.bounds.index(1.0)] == 1  # the granted one: 0.7 s
    finally:
        loop.shutdown()


@pytest.mark.parametrize("cls", [Lane, SessionLane])
def test_hold_times_appended_then_bucketed_in_batches_match_bucket_by_bucket(
    cls: Any, fake_clock: FakeClock
) -> None:
    """A release appends its hold time; the lane buckets them every HELD_BATCH releases
    and at read time. Across several batches the histogram equals one built value by
    value, and the appended list never grows past a batch."""
    from lanequeue._obs import HELD_BATCH, HOLD_BUCKETS, Histogram

    lane = cls(clock=fake_clock) if cls is SessionLane else cls("g", clock=fake_clock)
    lane.track_holds()
    expected = Histogram(HOLD_BUCKETS)
    # Lengths in most buckets, and past the last bound (none ON a bound: the fake
    # clock's sums are floats).
    lengths = [0.0, 0.0005, 0.0011, 0.04, 0.4, 0.9, 7.0, 3000.0, 4000.0]
    for i in range(2 * HELD_BATCH + 7):
        length = lengths[i % len(lengths)]
        with lane.acquire(f"k{i % 3}"):
            fake_clock.advance(length)
        expected.observe(length)
        assert len(lane._core.hold_hist) < HELD_BATCH
    hold = lane.metrics_snapshot()[0].hold
    want = expected.snapshot()
    assert hold is not None and hold.counts == want.counts
    assert hold.count == 2 * HELD_BATCH + 7 and hold.sum == pytest.approx(want.sum)


@pytest.mark.parametrize("way", ["hold", "release", "acquire_all"])
@pytest.mark.parametrize("cls", [Lane, SessionLane])
def test_hold_times_stay_bounded_under_a_long_hold(
    cls: Any, way: str, fake_clock: FakeClock
) -> None:
    """A release folds the appended hold times once its token reaches the lane's
    threshold (a batch past the last fold). A hold kept across many batches (its token
    below every later threshold) does not stop the folds: the list never holds more than
    a batch plus the holds alive at the last fold, on every path a release takes (a
    hold's exit, an early ``release()``, ``acquire_all``'s exit), and every hold time
    is counted once."""
    from lanequeue._obs import HELD_BATCH

    queue = LaneQueue()
    lane = (queue.add_lane("g", max_concurrent=4, clock=fake_clock) if cls is Lane
            else queue.add_session_lane("s", clock=fake_clock))
    lane.track_holds()
    hist = lane._core.hold_hist
    long = lane.acquire("long")
    long.__enter__()  # token 1, held across every batch below
    cycles = 5 * HELD_BATCH + 3
    most = 0
    for i in range(cycles):
        if way == "acquire_all":
            with queue.acquire_all(f"k{i % 3}", [lane.name]):
                fake_clock.advance(0.002)
        else:
            with lane.acquire(f"k{i % 3}") as hold:
                fake_clock.advance(0.002)
                if way == "release":
                    assert hold.release()
        most = max(most, len(hist))
    assert most <= HELD_BATCH + 1  # a batch, and the long hold alive at each fold
    long.__exit__(None, None, None)
    snap = lane.metrics_snapshot()[0].hold
    assert snap is not None and snap.count == cycles + 1
    assert snap.counts[snap.bounds.index(0.005)] == cycles  # 2 ms each


def test_fold_buckets_values_on_the_bounds_as_observe_does() -> None:
    """``counts[i]`` holds the values ``<= bounds[i]``: a value ON a bound goes to that
    bound's bucket, whether observed at once or appended and folded."""
    from lanequeue._obs import HOLD_BUCKETS, Histogram

    values = [0.0, *HOLD_BUCKETS, *(b * 1.5 for b in HOLD_BUCKETS), 1e9]
    one, batch = Histogram(HOLD_BUCKETS), Histogram(HOLD_BUCKETS)
    for v in values:
        one.observe(v)
        batch.append(v)
    assert batch.snapshot() == one.snapshot()
    assert batch.snapshot().counts[0] == 2  # 0.0 and the first bound itself
    assert len(batch) == 0


def test_fold_of_a_batch_within_one_bucket() -> None:
    """A batch whose values all fall in one bucket (the usual one: a busy lane's holds
    are alike) is counted there at once, the same as value by value."""
    from lanequeue._obs import HOLD_BUCKETS, Histogram

    for values in ([0.0, 0.0004, 0.001], [0.0005, 0.0005], [0.0009] * 5, [0.0009, 0.0011],
                   [0.02, 0.05, 0.03], [4000.0, 1e6]):
        one, batch = Histogram(HOLD_BUCKETS), Histogram(HOLD_BUCKETS)
        for v in values:
            one.observe(v)
            batch.append(v)
        batch.fold()
        assert batch.counts == one.counts and batch.sum == pytest.approx(one.sum)
        assert sum(1 for n in batch.counts if n) == len({bisect_left(HOLD_BUCKETS, v)
                                                         for v in values})


@pytest.mark.parametrize(
    ("module", "extra", "make"),
    [
        ("prometheus_client", "prometheus", lambda lane: PrometheusCollector(lane)),
        ("opentelemetry.metrics", "otel", lambda lane: instrument_otel(lane)),
    ],
)
def test_an_exporter_without_its_extra_names_the_extra(
    monkeypatch: pytest.MonkeyPatch, module: str, extra: str, make: Any
) -> None:
    """Without its library, an exporter's ImportError says which extra installs it (it
    was a bare ModuleNotFoundError), as the command line's does."""
    monkeypatch.setitem(sys.modules, module, None)  # importing it now raises ImportError
    with pytest.raises(ImportError, match=rf"pip install 'lanequeue\[{extra}\]'"):
        make(Lane("g"))
