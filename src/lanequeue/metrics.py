"""Metrics exporters: Prometheus (extra ``[prometheus]``) and OpenTelemetry (extra ``[otel]``).

Both read the lanes at collection time (:meth:`lanequeue.Lane.metrics_snapshot`); nothing
calls a metrics library per acquisition. A target is a lane, or a queue (every lane it
has at collection time that offers ``metrics_snapshot``, so lanes added later are
included).

Names and labels (never the key: conversation ids would explode the cardinality):

==================================  =========  ==========================================
name                                type       meaning
==================================  =========  ==========================================
``lanequeue_wait_seconds``          histogram  wait of every acquisition: an immediate
                                               grant counts 0, a wait its length, also
                                               when it timed out, was cancelled or
                                               cleared. Label ``reason``: what a wait
                                               on the lane waits for, ``key_busy``
                                               (session lane) or ``lane_full``
                                               (counting); it follows ``kind``, so the
                                               0 s of an immediate grant carry it too
``lanequeue_hold_seconds``          histogram  hold times, observed at release from the
                                               moment an exporter is attached
``lanequeue_holders``               gauge      permits held now
``lanequeue_waiters``               gauge      callers waiting now
``lanequeue_sessions``              gauge      live per-key entries (session lanes only)
``lanequeue_oldest_wait_seconds``   gauge      the longest current wait (0: none)
``lanequeue_acquired_total``        counter    permits granted
``lanequeue_timeouts_total``        counter    waits that ran out
``lanequeue_rejected_total``        counter    non-blocking refusals
``lanequeue_cancelled_total``       counter    waits abandoned or ended (clear, drain)
``lanequeue_evicted_total``         counter    idle per-key entries evicted
``lanequeue_unmatched_releases...`` counter    releases that matched no hold
``lanequeue_leases_lost_total``     counter    Redis holds whose lease ran out
==================================  =========  ==========================================

(the unmatched one is ``lanequeue_unmatched_releases_total``). Every series has the labels
``lane`` (the lane's name) and ``kind`` (``session`` or ``counting``); lanes that report a
``scope`` (Redis: ``process`` or ``lane``) add that label.

A target may also be a dispatcher (:class:`~lanequeue.Dispatcher`,
:class:`~lanequeue.ThreadDispatcher`): its queue's lanes, as above, and the
dispatcher's own series, read from its ``stats`` and ``snapshot()`` (no labels but
``state``; one dispatcher per registry):

==============================================  =========  ==============================
name                                            type       meaning
==============================================  =========  ==============================
``lanequeue_dispatch_submitted_total``          counter    tickets submitted (a deduped
                                                           submit is not one)
``lanequeue_dispatch_ended_total``              counter    tickets ended; label
                                                           ``state``: ``done``,
                                                           ``failed``, ``cancelled``,
                                                           ``dropped``, ``rejected``,
                                                           ``timed_out``
``lanequeue_dispatch_deduped_total``            counter    submits answered by an earlier
                                                           ticket of their ``dedupe_id``
``lanequeue_dispatch_merged_total``             counter    tickets run in another's call
                                                           (``collect``)
``lanequeue_dispatch_steered_total``            counter    tickets taken from a running
                                                           turn's inbox (``steer``)
``lanequeue_dispatch_pending``                  gauge      tickets not started now
``lanequeue_dispatch_running``                  gauge      tickets running now
``lanequeue_dispatch_oldest_pending_seconds``   gauge      the oldest pending ticket's
                                                           wait so far (0: none)
==============================================  =========  ==============================

``submitted_total`` equals the sum of ``ended_total`` over its states plus ``pending``
and ``running`` (read at one instant: the counters and these gauges come from one
``stats``).

Cost: nothing per acquisition; attaching an exporter turns on hold-time observation
(:meth:`~lanequeue.Lane.track_holds`: a clock read and a list append per release, bucketed
in batches),
unless it is given ``hold_times=False`` (then ``lanequeue_hold_seconds`` is not
reported). ``benchmarks/run.py --only uncontended`` prints the figures with hold times on
and off.
"""

from __future__ import annotations

import math
import threading
import weakref
from collections.abc import Callable, Iterable, Iterator
from typing import Any, cast

from ._core import at_fork_in_child
from ._errors import install_hint
from ._obs import HistogramSnapshot, LaneMetrics, MetricsSource
from ._validate import check_bool

__all__ = ["PrometheusCollector", "instrument_otel", "lane_sources"]

_REASON = {"session": "key_busy", "counting": "lane_full"}

# (name without _total, LaneStats field or LaneMetrics attribute, help)
_COUNTERS = (
    ("lanequeue_acquired", "acquired", "Permits granted."),
    ("lanequeue_timeouts", "timeouts", "Waits that ran out."),
    ("lanequeue_rejected", "rejected", "Non-blocking refusals (not counted as timeouts)."),
    ("lanequeue_cancelled", "cancelled",
     "Waits abandoned (cancellation, an exception) or ended by clear/drain/close."),
    ("lanequeue_evicted", "evicted", "Idle per-key entries evicted."),
    ("lanequeue_unmatched_releases", "unmatched_releases",
     "Releases that matched no hold and changed nothing."),
    ("lanequeue_leases_lost", "leases_lost", "Holds whose lease ran out (Redis lanes)."),
)
_GAUGES = (
    ("lanequeue_holders", "Permits held now."),
    ("lanequeue_waiters", "Callers waiting now."),
    ("lanequeue_sessions", "Live per-key entries, held or idle (session lanes)."),
    ("lanequeue_oldest_wait_seconds", "Seconds the longest current wait has lasted."),
)
#: The dispatcher's series (see the module docstring).
_DISPATCH_ENDED = ("done", "failed", "cancelled", "dropped", "rejected", "timed_out")
_DISPATCH_ENDED_HELP = ("Tickets ended, by state (done, failed, cancelled, dropped, "
                        "rejected, timed_out).")
_DISPATCH_COUNTERS = (
    ("lanequeue_dispatch_submitted", "submitted",
     "Tickets submitted (a deduped submit is not one)."),
    ("lanequeue_dispatch_deduped", "deduped",
     "Submits answered by an earlier ticket of their dedupe_id."),
    ("lanequeue_dispatch_merged", "merged", "Tickets run in another ticket's call (collect)."),
    ("lanequeue_dispatch_steered", "steered",
     "Tickets taken from a running turn's inbox (steer)."),
)
_DISPATCH_GAUGES = (
    ("lanequeue_dispatch_pending", "Tickets not started now."),
    ("lanequeue_dispatch_running", "Tickets running now."),
    ("lanequeue_dispatch_oldest_pending_seconds",
     "Seconds the oldest pending ticket has waited so far (0: none)."),
)
_WAIT_HELP = ("Wait of each acquisition in seconds (0 for an immediate grant); reason: "
              "what a wait on the lane waits for, key_busy (session lane) or lane_full "
              "(counting lane), on every observation of the lane.")
_HOLD_HELP = "Hold times in seconds, observed at release."


def _need(module: str, extra: str, user: str) -> None:
    """Import ``module`` for ``user``; ImportError naming the extra that installs it."""
    import importlib

    try:
        importlib.import_module(module)
    except ImportError as exc:
        raise ImportError(
            f"{user} needs {module.split('.')[0]}, which is not installed: "
            f"{install_hint(extra)}") from exc


def _dispatcher(target: Any) -> Any:
    """``target`` if it is a dispatcher, else None."""
    from .dispatch._base import DispatcherBase

    return target if isinstance(target, DispatcherBase) else None


def lane_sources(target: Any, name: str = "target") -> list[Any]:
    """The lanes behind ``target``: ``[target]`` for a lane, every lane with
    ``metrics_snapshot`` for a queue (in registration order), its queue's for a
    dispatcher. Raises TypeError for anything else, naming ``name`` (an exporter passes
    its call and argument: ``"PrometheusCollector() argument 'target'"``)."""
    if isinstance(target, MetricsSource):
        return [target]
    dispatcher = _dispatcher(target)
    if dispatcher is not None:
        target = dispatcher._queue
    lanes = getattr(target, "list_lanes", None)
    if callable(lanes):
        return [lane for lane in (target[n] for n in lanes()) if isinstance(lane, MetricsSource)]
    raise TypeError(
        f"{name} must be a lane, a queue of lanes or a dispatcher, not {type(target).__name__}"
    )


def _dispatch_read(dispatcher: Any) -> tuple[Any, float]:
    """A dispatcher's ``stats`` and the wait so far of its oldest pending ticket."""
    keys = dispatcher.snapshot()["keys"]
    oldest = max((float(k["oldest_wait_s"]) for k in keys.values()), default=0.0)
    return dispatcher.stats, oldest


def _dispatch_gauge(stats: Any, oldest: float, name: str) -> float:
    if name == "lanequeue_dispatch_pending":
        return float(stats.pending)
    if name == "lanequeue_dispatch_running":
        return float(stats.running)
    return oldest


def _snapshots(target: Any, hold_times: bool) -> list[LaneMetrics]:
    out: list[LaneMetrics] = []
    for lane in lane_sources(target):
        if hold_times:
            lane.track_holds()  # idempotent; lanes added to a queue later join here
        out.extend(lane.metrics_snapshot())
    return out


def _gauge_value(m: LaneMetrics, name: str) -> float | None:
    if name == "lanequeue_holders":
        return m.stats.holders
    if name == "lanequeue_waiters":
        return m.stats.waiters
    if name == "lanequeue_sessions":
        return m.sessions
    return m.oldest_wait_s


def _counter_value(m: LaneMetrics, field: str) -> int:
    if field == "leases_lost":
        return m.leases_lost
    value: int = getattr(m.stats, field)
    return value


def _le(bound: float) -> str:
    return "+Inf" if math.isinf(bound) else repr(float(bound))


class PrometheusCollector:
    """A prometheus_client collector of one lane, one queue's lanes, or one dispatcher
    and its queue's lanes (extra ``[prometheus]``).

    Args:
        target: a lane, a queue (its lanes at each scrape), or a dispatcher (its own
            series, and its queue's lanes: see the module docstring).
        registry: the ``CollectorRegistry`` to register on; None: prometheus_client's
            default ``REGISTRY``.
        hold_times: observe hold times for ``lanequeue_hold_seconds`` (a clock read per
            release); False leaves the release path as it is and omits that histogram.

    Registers itself at construction and (``hold_times``) turns on hold-time observation
    of the lanes.
    Each scrape reads :meth:`metrics_snapshot` of every lane (under each lane's lock,
    briefly). One collector per registry: a second one (of any lanes) has the same metric
    names, and the registry refuses it (since :meth:`describe` names them), which raises
    ValueError; pass one target holding all the lanes (a queue, or a dispatcher), or
    give each collector its own registry. :meth:`unregister` removes it.

    Raises:
        ImportError: prometheus_client is not installed (the message names the extra,
            ``lanequeue[prometheus]``).
        TypeError: ``target`` is not a lane, a queue or a dispatcher; ``registry`` is not a
            registry (has no ``register``/``unregister``) nor None; ``hold_times`` is
            not a bool.
        ValueError: the registry (the default ``REGISTRY`` when ``registry`` is None)
            already has these names (another PrometheusCollector on it): the message says
            what to do instead, and prometheus_client's ``Duplicated timeseries`` error is
            its ``__cause__``; nothing is registered or turned on then.

    Example:

        >>> from prometheus_client import CollectorRegistry, generate_latest
        >>> from lanequeue import Lane
        >>> lane = Lane("global", max_concurrent=2)
        >>> registry = CollectorRegistry()
        >>> collector = PrometheusCollector(lane, registry=registry)
        >>> with lane.acquire("job-1"):
        ...     pass
        >>> text = generate_latest(registry).decode()
        >>> 'lanequeue_acquired_total{kind="counting",lane="global"} 1.0' in text
        True
    """

    def __init__(self, target: Any, *, registry: Any = None, hold_times: bool = True) -> None:
        _need("prometheus_client", "prometheus", "PrometheusCollector")
        from prometheus_client import REGISTRY

        where = f"{type(self).__name__}() argument"
        self._target = target
        self._hold_times = check_bool(hold_times, f"{where} 'hold_times'")
        # (TypeError for a target of another kind)
        lanes = lane_sources(target, f"{where} 'target'")
        if registry is not None and not (callable(getattr(registry, "register", None))
                                         and callable(getattr(registry, "unregister", None))):
            raise TypeError(
                f"{where} 'registry' must be a prometheus_client CollectorRegistry or None, "
                f"not {type(registry).__name__}")
        self._registry = REGISTRY if registry is None else registry
        try:
            # Refused before it records anything (prometheus_client checks every name
            # first): nothing is registered or turned on.
            self._registry.register(self)
        except ValueError as exc:
            if not str(exc).startswith("Duplicated timeseries"):
                raise
            which = ("is None, and the default REGISTRY" if registry is None
                     else f"({type(registry).__name__})")
            raise ValueError(
                f"{where} 'registry' {which} already has the series of another "
                "PrometheusCollector, and prometheus_client refuses the same names twice: "
                "pass one target holding all the lanes (a queue, or a dispatcher), or pass "
                "another registry") from exc
        for lane in lanes:
            if hold_times:
                lane.track_holds()

    def unregister(self) -> None:
        """Remove this collector from its registry."""
        self._registry.unregister(self)

    def describe(self) -> Iterator[Any]:
        """The metric families, without samples (called by prometheus_client when the
        collector is registered): every registry, the default one or one made with
        ``auto_describe=False``, then refuses a second collector of these names (the
        ValueError the constructor raises) instead of reporting every series twice.
        Reads no lane."""
        return self._families([])

    def collect(self) -> Iterator[Any]:
        """The metric families now (called by prometheus_client at each scrape)."""
        dispatcher = _dispatcher(self._target)
        read = None if dispatcher is None else _dispatch_read(dispatcher)
        return self._families(_snapshots(self._target, self._hold_times), read)

    def _families(self, snaps: list[LaneMetrics],
                  dispatch: tuple[Any, float] | None = None) -> Iterator[Any]:
        from prometheus_client.core import (
            CounterMetricFamily,
            GaugeMetricFamily,
            HistogramMetricFamily,
        )

        if _dispatcher(self._target) is not None:
            yield from self._dispatch_families(dispatch)

        scoped = any(m.scope is not None for m in snaps)
        labels = ["lane", "kind", "scope"] if scoped else ["lane", "kind"]

        def values(m: LaneMetrics) -> list[str]:
            base = [m.lane, m.kind]
            return [*base, m.scope or ""] if scoped else base

        wait = HistogramMetricFamily("lanequeue_wait_seconds", _WAIT_HELP,
                                     labels=[*labels, "reason"])
        hold = HistogramMetricFamily("lanequeue_hold_seconds", _HOLD_HELP, labels=labels)
        for m in snaps:
            wait.add_metric([*values(m), _REASON.get(m.kind, m.kind)], _buckets(m.wait),
                            m.wait.sum)
            if m.hold is not None and self._hold_times:
                hold.add_metric(values(m), _buckets(m.hold), m.hold.sum)
        yield wait
        yield hold
        for name, help_text in _GAUGES:
            gauge = GaugeMetricFamily(name, help_text, labels=labels)
            for m in snaps:
                v = _gauge_value(m, name)
                if v is not None:
                    gauge.add_metric(values(m), v)
            yield gauge
        for name, field, help_text in _COUNTERS:
            counter = CounterMetricFamily(name, help_text, labels=labels)
            for m in snaps:
                counter.add_metric(values(m), _counter_value(m, field))
            yield counter


    @staticmethod
    def _dispatch_families(read: tuple[Any, float] | None) -> Iterator[Any]:
        """The dispatcher's families (``read``: its stats and oldest wait; None: the
        families without samples, for :meth:`describe`)."""
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

        for name, field, help_text in _DISPATCH_COUNTERS:
            counter = CounterMetricFamily(name, help_text, labels=[])
            if read is not None:
                counter.add_metric([], getattr(read[0], field))
            yield counter
        ended = CounterMetricFamily("lanequeue_dispatch_ended", _DISPATCH_ENDED_HELP,
                                    labels=["state"])
        if read is not None:
            for state in _DISPATCH_ENDED:
                ended.add_metric([state], getattr(read[0], state))
        yield ended
        for name, help_text in _DISPATCH_GAUGES:
            gauge = GaugeMetricFamily(name, help_text, labels=[])
            if read is not None:
                gauge.add_metric([], _dispatch_gauge(read[0], read[1], name))
            yield gauge


def _buckets(h: HistogramSnapshot) -> list[tuple[str, float]]:
    return [(_le(bound), float(n)) for bound, n in h.cumulative()]


#: What the instruments of one :func:`instrument_otel` call report from: the
#: dispatcher's read (None without a dispatcher) and the lanes' snapshots.
_Read = tuple[tuple[Any, float] | None, list[LaneMetrics]]


class _PerCollection:
    """One read of the target per OpenTelemetry collection, shared by the callbacks of
    all the instruments of one :func:`instrument_otel` call, so that the series of one
    collection come from one instant, as those of one Prometheus scrape do (the
    sessions beside the evictions, a dispatcher's counters beside its gauges).

    An SDK collection calls the callback of every instrument once (the SDK's, one
    collection at a time under its meter provider's lock; each reader collects on its
    own). So a callback that has not yet had the current read reports it; one that
    already has begins a new collection, and reads anew; the last callback of a
    collection lets the read go. A read that raises is the read of its collection all
    the same: the callback that made it raises, the others of that collection report
    nothing, and the next collection reads anew. Neither the order of the calls nor
    their timing matters, and a collection cut short (a callback past its deadline, a
    read that raised an exception the SDK does not catch) leaves the next one reading
    anew at its first callback that the short one called."""

    def __init__(self, read: Callable[[], _Read]) -> None:
        self._read = read
        self._lock = threading.Lock()
        self._seats = 0  # the callbacks sharing the reads
        self._begun = False  # a collection is under way: ``_value`` is its read
        self._value: _Read | None = None  # (None while begun: its read raised)
        self._served: set[int] = set()  # the callbacks of the collection under way

    def seat(self) -> int:
        """A new callback's number, for :meth:`get`."""
        self._seats += 1
        return self._seats

    def get(self, seat: int) -> _Read | None:
        """The read of the current collection, for the callback numbered ``seat``; None
        if that read raised (the callback that made it got the exception)."""
        with self._lock:
            fresh = not self._begun or seat in self._served
            if fresh:  # a new collection: forget the last one's read, or its failure
                self._begun, self._value, self._served = True, None, set()
            self._served.add(seat)
            try:
                if fresh:
                    self._value = self._read()  # raises: the collection's read failed
                return self._value
            finally:
                if len(self._served) >= self._seats:  # the collection's last callback
                    self._begun, self._value = False, None


#: The meter providers that have the instruments of an :func:`instrument_otel` call,
#: held weakly (a provider may be collected; one that takes no weak reference is held).
_otel_providers: list[Callable[[], Any]] = []
_otel_providers_lock = threading.Lock()


def _new_lock_after_fork() -> None:
    """In a forked child: a new lock (a parent's thread may have held it at the fork)."""
    global _otel_providers_lock
    _otel_providers_lock = threading.Lock()


at_fork_in_child(_new_lock_after_fork)


def _claim_provider(provider: Any) -> bool:
    """Note that ``provider`` gets the instruments of an :func:`instrument_otel` call;
    False (noting nothing) if an earlier call's are there."""
    with _otel_providers_lock:
        alive = [ref for ref in _otel_providers if ref() is not None]
        if any(ref() is provider for ref in alive):
            return False
        try:
            ref: Callable[[], Any] = weakref.ref(provider)
        except TypeError:
            ref = lambda: provider  # noqa: E731
        _otel_providers[:] = [*alive, ref]
        return True


def _release_provider(provider: Any) -> None:
    """Undo :func:`_claim_provider` (for a call that created no instrument)."""
    with _otel_providers_lock:
        _otel_providers[:] = [ref for ref in _otel_providers
                              if ref() is not None and ref() is not provider]


def instrument_otel(
    target: Any, *, meter_provider: Any = None, hold_times: bool = True
) -> list[Any]:
    """Report one lane's, one queue's or one dispatcher's metrics through OpenTelemetry
    (extra ``[otel]``).

    Args:
        target: a lane, a queue (its lanes at each collection), or a dispatcher (its own
            series, and its queue's lanes).
        meter_provider: the ``MeterProvider`` to use; None: the global one
            (``opentelemetry.metrics.get_meter_provider()``).
        hold_times: as for :class:`PrometheusCollector`.

    Creates asynchronous instruments on the meter ``"lanequeue"`` whose callbacks read
    the lanes at collection time, with the names and attributes of the module docstring:
    one read per collection (at its first callback), which all of them report, so that
    the series of one collection agree as those of one Prometheus scrape do. A read
    that raises is the read of its collection: the callback that made it raises (the
    SDK logs the exception as that instrument's callback failure), the others report
    nothing, so that collection has none of these series; the next one reads anew.
    The OpenTelemetry API has no asynchronous histogram, so each histogram is exported
    Prometheus-style as three observable counters: ``<name>_bucket`` (attribute ``le``,
    cumulative), ``<name>_sum`` and ``<name>_count``. Turns on hold-time observation
    (``hold_times``).

    One call per meter provider: the meter ``"lanequeue"`` has one instrument of each
    name, so the SDK would answer a second call's instruments with the first call's and
    report the first target only; a second call on the same provider (of any target)
    is refused. Instrument a queue holding all the lanes, or a dispatcher, or give each
    target its own ``MeterProvider``.

    Returns:
        the instruments created.

    Raises:
        ImportError: opentelemetry-api is not installed (the message names the extra,
            ``lanequeue[otel]``).
        TypeError: ``target`` is not a lane, a queue or a dispatcher; ``hold_times`` is
            not a bool.
        ValueError: an earlier call instrumented the same meter provider
            (``meter_provider``, or when it is None the global provider, the object
            ``get_meter_provider()`` returns now); nothing is created or turned on then.
    """
    _need("opentelemetry.metrics", "otel", "instrument_otel")
    from opentelemetry import metrics as otel
    from opentelemetry.metrics import CallbackOptions, Observation

    check_bool(hold_times, "instrument_otel() argument 'hold_times'")
    lanes = lane_sources(target, "instrument_otel() argument 'target'")
    provider = otel.get_meter_provider() if meter_provider is None else meter_provider
    if not _claim_provider(provider):
        which = ("is None, and the global MeterProvider" if meter_provider is None
                 else f"({type(provider).__name__})")
        raise ValueError(
            f"instrument_otel() argument 'meter_provider' {which} already has the "
            "instruments of an earlier instrument_otel() call, and its meter 'lanequeue' "
            "would report that call's target only: instrument one queue holding all the "
            "lanes (or a dispatcher), or pass another MeterProvider")

    def attrs(m: LaneMetrics) -> dict[str, str]:
        out = {"lane": m.lane, "kind": m.kind}
        if m.scope is not None:
            out["scope"] = m.scope
        return out

    def hist_parts(m: LaneMetrics, name: str) -> tuple[HistogramSnapshot | None, dict[str, str]]:
        if name == "lanequeue_wait_seconds":
            return m.wait, {**attrs(m), "reason": _REASON.get(m.kind, m.kind)}
        return m.hold, attrs(m)

    dispatcher = _dispatcher(target)

    def read() -> _Read:  # (in the order of a Prometheus scrape)
        dispatch = None if dispatcher is None else _dispatch_read(dispatcher)
        return dispatch, _snapshots(target, hold_times)

    shared = _PerCollection(read)

    def lanes_of(seat: int) -> list[LaneMetrics]:
        """The lanes' snapshots of the collection (none: its read raised)."""
        got = shared.get(seat)
        return [] if got is None else got[1]

    def gauge_cb(name: str) -> Any:
        seat = shared.seat()

        def cb(options: CallbackOptions) -> Iterable[Observation]:
            for m in lanes_of(seat):
                v = _gauge_value(m, name)
                if v is not None:
                    yield Observation(v, attrs(m))
        return cb

    def counter_cb(field: str) -> Any:
        seat = shared.seat()

        def cb(options: CallbackOptions) -> Iterable[Observation]:
            for m in lanes_of(seat):
                yield Observation(_counter_value(m, field), attrs(m))
        return cb

    def hist_cb(name: str, part: str) -> Any:
        seat = shared.seat()

        def cb(options: CallbackOptions) -> Iterable[Observation]:
            for m in lanes_of(seat):
                h, a = hist_parts(m, name)
                if h is None:
                    continue
                if part == "sum":
                    yield Observation(h.sum, a)
                elif part == "count":
                    yield Observation(h.count, a)
                else:
                    for bound, n in h.cumulative():
                        yield Observation(n, {**a, "le": _le(bound)})
        return cb

    instruments: list[Any] = []
    histograms = [("lanequeue_wait_seconds", _WAIT_HELP)]
    if hold_times:
        histograms.append(("lanequeue_hold_seconds", _HOLD_HELP))
    try:
        meter = provider.get_meter("lanequeue")
        if dispatcher is not None:
            _otel_dispatch(meter, shared, instruments)
        for name, help_text in _GAUGES:
            unit = "s" if name.endswith("_seconds") else "1"
            instruments.append(meter.create_observable_gauge(
                name, callbacks=[gauge_cb(name)], unit=unit, description=help_text))
        for name, field, help_text in _COUNTERS:
            instruments.append(meter.create_observable_counter(
                f"{name}_total", callbacks=[counter_cb(field)], unit="1",
                description=help_text))
        for name, help_text in histograms:
            for part, unit in (("bucket", "1"), ("sum", "s"), ("count", "1")):
                instruments.append(meter.create_observable_counter(
                    f"{name}_{part}", callbacks=[hist_cb(name, part)], unit=unit,
                    description=help_text))
    except BaseException:
        if not instruments:  # nothing on the provider: a later call may use it
            _release_provider(provider)
        raise
    if hold_times:
        for lane in lanes:
            lane.track_holds()
    return instruments


def _otel_dispatch(meter: Any, shared: _PerCollection, out: list[Any]) -> None:
    """Create the dispatcher's instruments (see the module docstring), reporting the
    read of the collection (``shared``, whose dispatcher's read is not None), each
    appended to ``out`` once made."""
    from opentelemetry.metrics import CallbackOptions, Observation

    def stats_of(seat: int) -> list[tuple[Any, float]]:
        """The dispatcher's read of the collection, in a list (empty: the collection's
        read raised)."""
        got = shared.get(seat)
        return [] if got is None else [cast("tuple[Any, float]", got[0])]

    def counter_cb(field: str) -> Any:
        seat = shared.seat()

        def cb(options: CallbackOptions) -> Iterable[Observation]:
            for stats, _ in stats_of(seat):
                yield Observation(getattr(stats, field))
        return cb

    ended_seat = shared.seat()

    def ended_cb(options: CallbackOptions) -> Iterable[Observation]:
        for stats, _ in stats_of(ended_seat):
            for state in _DISPATCH_ENDED:
                yield Observation(getattr(stats, state), {"state": state})

    def gauge_cb(name: str) -> Any:
        seat = shared.seat()

        def cb(options: CallbackOptions) -> Iterable[Observation]:
            for stats, oldest in stats_of(seat):
                yield Observation(_dispatch_gauge(stats, oldest, name))
        return cb

    for name, field, help_text in _DISPATCH_COUNTERS:
        out.append(meter.create_observable_counter(
            f"{name}_total", callbacks=[counter_cb(field)], unit="1", description=help_text))
    out.append(meter.create_observable_counter(
        "lanequeue_dispatch_ended_total", callbacks=[ended_cb], unit="1",
        description=_DISPATCH_ENDED_HELP))
    for name, help_text in _DISPATCH_GAUGES:
        unit = "s" if name.endswith("_seconds") else "1"
        out.append(meter.create_observable_gauge(
            name, callbacks=[gauge_cb(name)], unit=unit, description=help_text))
