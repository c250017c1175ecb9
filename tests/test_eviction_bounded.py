"""Evicting idle entries never holds a per-key lane's lock for long: one hold of the lock
evicts at most ``EVICT_STEPS`` entries, whatever the backlog (README, "Different keys
never wait for each other"; ``SessionLane.idle_timeout_s``). Each test counts the
evictions made inside every hold of the lane's lock through a wrapper around it."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from conftest import FakeClock

from lanequeue import AsyncSessionLane, SessionLane
from lanequeue._core import EVICT_STEPS

N = 20 * EVICT_STEPS + 7  # a backlog of many holds' worth, not a multiple of one


class _CountingLock:
    """The core's lock, noting how many entries each outermost hold evicted."""

    def __init__(self, core: Any) -> None:
        self.core = core
        self.inner = core._lock
        self.depth = 0
        self.at = 0
        self.per_hold: list[int] = []

    def acquire(self, *args: Any) -> bool:
        got = bool(self.inner.acquire(*args))
        if got:
            if not self.depth:
                self.at = self.core.evicted
            self.depth += 1
        return got

    def release(self) -> None:
        self.depth -= 1
        if not self.depth:
            self.per_hold.append(self.core.evicted - self.at)
        self.inner.release()

    def _is_owned(self) -> bool:  # (the views ask it: see _CoreBase._read_evicted)
        return bool(self.inner._is_owned())

    def __enter__(self) -> bool:
        return self.acquire()

    def __exit__(self, *exc: object) -> None:
        self.release()


def _lane(face: str, clock: FakeClock, max_sessions: int) -> Any:
    cls = SessionLane if face == "threads" else AsyncSessionLane
    return cls(max_sessions=max_sessions, idle_timeout_s=60, clock=clock)


def _take(lane: Any, key: str) -> None:
    if isinstance(lane, AsyncSessionLane):
        assert lane.try_acquire_nowait(key)
        assert lane.manual_release_nowait(key)
    else:
        assert lane.try_acquire(key)
        assert lane.manual_release(key)


def _backlog(face: str, clock: FakeClock, how: str) -> tuple[Any, _CountingLock]:
    """A lane with ``N`` idle entries due for eviction (``how``: all expired, or all
    over a cap of 1 after a burst of held keys), and its lock counted from then on."""
    lane = _lane(face, clock, 1 if how == "cap" else 10 * N)
    if how == "cap":
        if isinstance(lane, AsyncSessionLane):
            for i in range(N + 1):
                assert lane.try_acquire_nowait(f"k{i}")
            for i in range(N + 1):
                assert lane.manual_release_nowait(f"k{i}")
        else:
            for i in range(N + 1):
                assert lane.try_acquire(f"k{i}")
            for i in range(N + 1):
                assert lane.manual_release(f"k{i}")
    else:
        for i in range(N):
            _take(lane, f"k{i}")
        clock.advance(61)
    counted = _CountingLock(lane._core)
    lane._core._lock = counted
    return lane, counted


@pytest.mark.timeout(30)
@pytest.mark.parametrize("how", ["expired", "cap"])
@pytest.mark.parametrize("face", ["threads", "asyncio"])
def test_a_new_key_evicts_a_bounded_number_and_the_backlog_only_shrinks(
    face: str, how: str
) -> None:
    """Input: ``N`` idle entries due (expired, or over ``max_sessions`` after a burst
    of held keys), then new keys one at a time. Observed before: the first new key
    evicted all ``N`` in one hold of the lock (with 500,000 entries, 0.6 s in which every
    other key's caller waited). Expected: each acquisition evicts at most EVICT_STEPS,
    more than the one entry it adds, so the backlog is gone after about N/EVICT_STEPS
    new keys."""

    def run() -> None:
        clock = FakeClock()
        lane, counted = _backlog(face, clock, how)
        new_keys = 0
        while lane._core.evicted < N:
            _take(lane, f"new{new_keys}")
            new_keys += 1
            assert new_keys <= N // (EVICT_STEPS - 1) + 1, "the backlog does not shrink"
        assert max(counted.per_hold) == EVICT_STEPS
        assert new_keys >= N // EVICT_STEPS

    async def on_a_loop() -> None:  # (the asyncio lane's calls, on its loop)
        run()

    if face == "threads":
        run()
    else:
        asyncio.run(on_a_loop())


@pytest.mark.timeout(30)
@pytest.mark.parametrize(
    "view", ["session_count", "stats", "metrics_snapshot", "status", "cleanup_idle"])
@pytest.mark.parametrize("how", ["expired", "cap"])
def test_views_evict_every_entry_due_a_bounded_number_per_hold(view: str, how: str) -> None:
    """Input: ``N`` idle entries due, then a view (or ``cleanup_idle()``). Observed
    before: one hold of the lock evicted all ``N`` (and an idle entry over the cap was
    left to the next new key). Expected: the view evicts every entry due, letting the
    lock go after each EVICT_STEPS of them, and counts what is left."""
    clock = FakeClock()
    lane, counted = _backlog("threads", clock, how)
    left = 0 if how == "expired" else 1
    if view == "session_count":
        assert lane.session_count == left
    elif view == "stats":
        assert lane.stats.evicted == N
    elif view == "metrics_snapshot":
        [m] = lane.metrics_snapshot()
        assert (m.sessions, m.stats.evicted) == (left, N)
    elif view == "status":
        assert lane.status()["stats"]["evicted"] == N
    else:
        assert lane.cleanup_idle() == N
    assert max(counted.per_hold) <= EVICT_STEPS
    assert len(counted.per_hold) >= N // EVICT_STEPS
    assert lane.session_count == left


@pytest.mark.timeout(30)
def test_other_keys_are_served_between_the_holds_of_a_view() -> None:
    """Input: a lane with ``N`` expired entries; while ``session_count`` evicts them,
    another key's caller releases and takes its hold again each time the view lets the
    lock go (driven from the lock's wrapper, at the first three). Expected: each goes
    through between two of the view's holds, and the view's count is right."""
    clock = FakeClock()
    lane, counted = _backlog("threads", clock, "expired")
    assert lane.try_acquire("other")  # held through the view, released in turn
    served = 0
    serving = False
    inner_release = counted.release

    def release_then_serve() -> None:
        nonlocal served, serving
        inner_release()
        if not counted.depth and not serving and served < 3:
            serving = True
            served += 1
            # Another key's caller, between two holds of the view: not held up.
            assert lane.manual_release("other")
            assert lane.try_acquire("other")
            serving = False

    counted.release = release_then_serve  # type: ignore[method-assign]
    assert lane.session_count == 1  # "other"
    assert served == 3
    assert len(counted.per_hold) >= N // EVICT_STEPS
    assert lane.manual_release("other")


def test_the_docs_name_the_bound() -> None:
    """The bound the docstrings and the README give is EVICT_STEPS."""
    from pathlib import Path

    doc = " ".join((SessionLane.idle_timeout_s.__doc__ or "").split())
    assert f"evicts up to {EVICT_STEPS} entries due" in doc
    readme = " ".join(
        (Path(__file__).resolve().parent.parent / "README.md").read_text().split())
    assert f"a call evicts at most {EVICT_STEPS} entries per hold of the lock" in readme
