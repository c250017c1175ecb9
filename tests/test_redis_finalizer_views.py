"""A dropped Redis hold's finalizer run while this thread is inside the lane object's
lock, its warning's handler calling the lane's views on that same thread.

A finalizer may run at any allocation (the collector), also inside the lane's registry
(a view's read, the purge of dropped holds, a release's registry update); the warning
it gives (``ResourceWarning`` for a hold dropped while held, ``RuntimeWarning`` for one
never entered) goes to the user's ``warnings.showwarning`` (or, with
``logging.captureWarnings(True)``, a log handler), which may call ``status()``,
``stuck()``, ``get_active()`` or ``stats``. The lane's lock was a plain ``Lock``: that
thread hung for good, and with it every thread that then used the lane object (its
renewer included). Each case runs in a thread joined with a timeout, so the old code
fails here rather than hangs.
"""

from __future__ import annotations

import gc
import threading
import warnings
from typing import Any

import pytest

from lanequeue.redis import RedisSessionLane

pytestmark = pytest.mark.timeout(60)


class _Registry(dict):  # type: ignore[type-arg]
    """A lane object's registry of holds that runs ``hook`` (once) at its first read of
    the kind given, with the lane's lock held by the reader."""

    hook: Any = None
    on: str = ""

    def _fire(self, on: str) -> None:
        if self.on == on and self.hook is not None:
            hook, self.hook = self.hook, None
            hook()

    def items(self) -> Any:
        self._fire("items")
        return super().items()

    def __getitem__(self, key: Any) -> Any:
        self._fire("getitem")
        return super().__getitem__(key)


@pytest.mark.parametrize("dropped", ["held", "never entered"])
@pytest.mark.parametrize("inside", ["stuck()", "stats (the purge)", "get_active()",
                                   "a release"])
def test_views_a_dropped_holds_warning_calls_inside_the_lanes_lock_return(
    redis_client: Any, redis_prefix: str, inside: str, dropped: str,
) -> None:
    """Inside the lane's lock (a registry read of ``stuck()``, the purge ``stats`` runs,
    ``get_active()``'s read, or a release's registry update), a Redis hold is dropped
    and its finalizer runs there; the warning's handler calls ``status()``,
    ``stuck(0)``, ``stats``, ``get_active()`` and ``active_count``. Observed before: the
    first view hung that thread for good, the lane's lock held. Expected: every view
    returns, the outer operation ends as it would have, and the dropped hold is left to
    the next operation (a view inside the lock purges nothing): the renewer releases
    it in Redis, and every hold is counted once."""
    lane = RedisSessionLane(redis_client, "fin", prefix=redis_prefix, lease_s=1.5,
                            warn_after_s=None, warn_hold_s=3600.0)
    other = RedisSessionLane(redis_client, "fin", prefix=redis_prefix, lease_s=30.0)
    box: dict[str, Any] = {}
    if dropped == "held":
        box["hold"] = lane.acquire("d")
        box["hold"].__enter__()
    else:
        box["hold"] = lane.acquire("d")  # (never entered)
    outer = lane.acquire("o")
    outer.__enter__()
    registry = _Registry(lane._holds)
    lane._holds = registry
    views: list[Any] = []
    errors: list[BaseException] = []
    purged_inside: list[int] = []

    def drop() -> None:  # the collector, inside the lane's lock
        box.clear()
        gc.collect()

    def handler(message: Any, category: Any, *args: Any, **kwargs: Any) -> None:
        if "'fin'" not in str(message):
            return
        try:
            views.append((category, lane.status(), lane.stuck(0), lane.stats,
                          lane.get_active(), lane.active_count))
            purged_inside.append(len(lane._dropped))
        except BaseException as exc:  # (reported by the test)
            errors.append(exc)

    def run() -> None:
        try:
            if inside == "stuck()":
                registry.on, registry.hook = "items", drop
                lane.stuck(0)
            elif inside == "get_active()":
                registry.on, registry.hook = "items", drop
                lane.get_active()
            elif inside == "a release":
                registry.on, registry.hook = "getitem", drop
                outer.release()
            else:
                purge = lane._purge_dropped

                def hooked() -> None:
                    del lane._purge_dropped  # (once)
                    drop()
                    purge()

                lane._purge_dropped = hooked
                lane.stats  # noqa: B018
        except BaseException as exc:
            errors.append(exc)

    with warnings.catch_warnings():
        warnings.simplefilter("always")
        warnings.showwarning = handler
        worker = threading.Thread(target=run, daemon=True)
        worker.start()
        worker.join(10)
        hung = worker.is_alive()
    assert not hung, f"a view called inside the lane's lock ({inside}) hung its thread"
    assert errors == []
    assert len(views) == 1
    category, status, stuck, stats, active, count = views[0]
    assert category is (ResourceWarning if dropped == "held" else RuntimeWarning)
    assert status["name"] == "fin" and "o" in active and count >= 1 and stats.acquired >= 1
    if inside != "a release":
        assert {s.key for s in stuck} >= {"o"}
    if dropped == "held" and inside != "stats (the purge)":
        assert purged_inside == [1]  # left to the next operation
    if inside != "a release":
        outer.release()
    assert lane.wait_idle(5.0), lane.stats  # (the renewer's round: within lease_s/3)
    st = lane.stats
    assert st.holders == 0 and st.acquired == st.released + st.unmatched_releases, st
    assert st.acquired == (2 if dropped == "held" else 1)
    assert other.try_acquire("d") and other.try_acquire("o")
    assert other.manual_release("d") and other.manual_release("o")
