"""The shared dedupe window (``dedupe_redis``) under a ``KeyboardInterrupt`` that lands
inside the standard library code the window's waits and hand-offs run, not only in the
dispatcher's own modules: no ``submit`` is then left blocked for ever (the README's
"Interrupts": an interrupt at any point of ``submit`` leaves the dispatcher whole).

- A second submit of an id waits for the claim of it in flight in this dispatcher; the
  claim's submit signals it once done. Both ends are swept: an interrupt at every point
  of the wait (in the waiting submit) and of the signal (in the claiming one). With a
  ``threading.Event`` there, an interrupt inside its ``Condition.__enter__`` left the
  Condition's lock held, and the other submit blocked for ever.
- A claim that failed is given back in the background (it may land later). Scheduling
  that give-back once entered a ``threading.Condition`` and started a thread in the
  caller; an interrupt there wedged every later failed claim.

The injector raises KeyboardInterrupt at the N-th point where CPython can deliver an
asynchronous exception (a function's entry, a Python or builtin callee's return) inside
the traced call, in ``threading`` too, for N = 1, 2, ... until none is left.

Real redis-server (tests/redis_server.py)."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

import pytest
import redis
from interrupt_points import Injector, inject_everywhere

from lanequeue import LaneBackendError, ThreadDispatcher, build_default_lanes

WAIT = 10.0
BOUND_S = 3.0 * 1.0 + 2.0  # the claim wait's bound (2 x socket_timeout + 1 s), plus slack


def _sweep(run_once: Callable[[Injector], None], scope: Callable[..., Any]) -> int:
    """``run_once(inj)`` with an injection at point n = 1, 2, ... inside the calls of
    ``scope`` (a function) until a run completes without one; how many injections were
    made."""
    code = scope.__code__
    return inject_everywhere(run_once, 400, points={"call", "return", "c_return"},
                             scope=lambda frame: frame.f_code is code)


@pytest.mark.timeout(300)
@pytest.mark.parametrize("where", ["wait", "signal"])
def test_an_interrupt_in_the_wait_for_a_claim_in_flight_blocks_no_submit(
    redis_server: Any, redis_prefix: str, where: str
) -> None:
    """Submit A claims id X (its claim held in flight 0.15 s); submit B of X waits for
    it. An interrupt lands at every point of B's wait (``wait``) or of A's signal that
    its claim is done (``signal``): both submits return within the claim wait's bound,
    X runs once, and the dispatcher drains."""
    from lanequeue.dispatch import _machine

    def run_once(inj: Injector) -> None:
        client = redis.Redis(host=redis_server.host, port=redis_server.port,
                             socket_timeout=1.0)
        d = ThreadDispatcher(build_default_lanes(), dedupe_redis=client,
                             dedupe_prefix=f"{redis_prefix}:{where}:{inj.n}")
        window = d._machine.window
        real = window.claim

        def slow_claim(dedupe_id: str, number: int) -> bool:
            time.sleep(0.15)
            return bool(real(dedupe_id, number))

        window.claim = slow_claim
        ran: list[str] = []
        out: dict[str, Any] = {}

        def submit(name: str) -> None:
            def go() -> Any:
                return d.submit("k", ran.append, name, dedupe_id="X")
            try:
                out[name] = inj.run(go) if (name == "B") == (where == "wait") else go()
            except KeyboardInterrupt as exc:
                out[name] = exc

        a = threading.Thread(target=submit, args=("A",), daemon=True)
        b = threading.Thread(target=submit, args=("B",), daemon=True)
        try:
            a.start()
            time.sleep(0.05)
            b.start()
            a.join(BOUND_S)
            b.join(BOUND_S)
            assert not a.is_alive() and not b.is_alive(), (
                f"a submit is blocked after an interrupt at {inj.fired}")
            assert d.drain(WAIT), (inj.fired, d.stats)
            assert len(ran) <= 1 and ran in ([], ["A"]), (inj.fired, ran)
        finally:
            d.close()
            client.close()

    assert _sweep(run_once, _machine._Signal.wait if where == "wait"
                  else _machine._Signal.set) > 5


@pytest.mark.timeout(300)
def test_an_interrupt_while_a_failed_claim_is_given_back_blocks_no_later_claim(
    redis_prefix: str,
) -> None:
    """The window's server is gone (every claim fails). An interrupt lands at every point
    of scheduling the failed claim's give-back, in the caller's thread; every later
    submit of another id still fails at once with LaneBackendError."""
    import socket

    from lanequeue.dispatch import _redis

    with socket.socket() as s:  # a port where nothing listens
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]

    def run_once(inj: Injector) -> None:
        client = redis.Redis(host="127.0.0.1", port=port, socket_timeout=0.5,
                             socket_connect_timeout=0.5)
        d = ThreadDispatcher(build_default_lanes(), dedupe_redis=client,
                             dedupe_prefix=redis_prefix)
        try:
            with pytest.raises((LaneBackendError, KeyboardInterrupt)):
                inj.run(lambda: d.submit("k", len, [], dedupe_id="X"))
            done = threading.Event()
            errors: list[BaseException] = []

            def later() -> None:
                try:
                    d.submit("k", len, [], dedupe_id="Y")
                except BaseException as exc:
                    errors.append(exc)
                done.set()

            threading.Thread(target=later, daemon=True).start()
            assert done.wait(BOUND_S), f"a later claim is blocked after {inj.fired}"
            assert [type(e) for e in errors] == [LaneBackendError], (inj.fired, errors)
        finally:
            d.close()
            client.close()

    assert _sweep(run_once, _redis.RedisDedupeWindow.give_back_later) > 3
