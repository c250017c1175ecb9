"""A release that an interrupt stops after its script was sent, against a real
redis-server.

A KeyboardInterrupt that lands once the release script has answered and before its
answer is read (the entry of ``flag_reply`` in ``_finish``, a point where CPython
delivers signals) leaves the hold HELD, as the README's "Interrupts" says, although the
script freed it. Ending it later (``manual_release(key)``, ``hold.release()``), or the
renewer finding it gone first, must count it as released by us: no lost lease.
"""

from __future__ import annotations

import asyncio
import logging
import sys
import time
from typing import Any

import pytest
import redis
import redis.asyncio
from redis_server import RedisServer

from lanequeue import LeaseLostError, NotOwnerError
from lanequeue.redis import (
    AsyncRedisLane,
    AsyncRedisSessionLane,
    RedisLane,
    RedisSessionLane,
    _protocol,
)
from lanequeue.redis._hold import ENDED, HELD

pytestmark = pytest.mark.timeout(60)

#: The words of the warning that the stopped release had released the hold.
FREED = "interrupt stopped"


def _lane(kind: Any, client: Any, prefix: str, lease_s: float, lost: list[Any]) -> Any:
    extra = {} if kind in (RedisSessionLane, AsyncRedisSessionLane) else {"max_concurrent": 2}
    return kind(client, "sr", prefix=prefix, lease_s=lease_s, on_lease_lost=lost.append,
                **extra)


def _interrupt_reading_the_release(monkeypatch: pytest.MonkeyPatch) -> dict[str, bool]:
    """Arm (``armed["on"] = True``) a KeyboardInterrupt at the entry of ``flag_reply``
    called by ``_finish``: the release script has run and answered, its answer is not
    read yet. Fires once; ``armed["fired"]`` says it did."""
    real = _protocol.flag_reply
    armed = {"on": False, "fired": False}

    def flag_reply(reply: Any) -> Any:
        if armed["on"] and sys._getframe(1).f_code.co_name == "_finish":
            armed["on"] = False
            armed["fired"] = True
            raise KeyboardInterrupt
        return real(reply)

    monkeypatch.setattr(_protocol, "flag_reply", flag_reply)
    return armed


def _held_in_redis(client: Any, prefix: str, kind: Any) -> bool:
    """Whether any key of the test lane is held in Redis (a fresh lane object asks)."""
    if kind in (RedisSessionLane, AsyncRedisSessionLane):
        return bool(RedisSessionLane(client, "sr", prefix=prefix).is_held("k"))
    return RedisLane(client, "sr", prefix=prefix, max_concurrent=2).holds_of("k") > 0


def _freed_not_lost(lane: Any, hold: Any, lost: list[Any], caplog: Any,
                    warned: bool = True) -> list[str]:
    """What is wrong with ``lane`` and ``hold`` once the hold its stopped release freed
    was ended: it must be counted released (never lost, never unmatched), with a warning
    saying that the stopped release had released it (``warned``; ``hold.release()`` says
    it in its NotOwnerError instead)."""
    st = lane.stats
    wrong = []
    if lost:
        wrong.append(f"on_lease_lost called: {lost}")
    if hold.lost or hold._lost:
        wrong.append("hold.lost is True")
    if lane.leases_lost:
        wrong.append(f"leases_lost {lane.leases_lost}")
    if (st.acquired, st.released, st.unmatched_releases, st.holders) != (1, 1, 0, 0):
        wrong.append(f"stats {st!r}")
    if hold._state != ENDED or hold.held or lane.get_active():
        wrong.append(f"still held here: {hold!r} {lane.get_active()}")
    texts = [r.getMessage() for r in caplog.records if r.name.startswith("lanequeue")]
    if warned and not any(FREED in t for t in texts):
        wrong.append(f"no warning that the stopped release freed it: {texts}")
    if any("lost" in t for t in texts):
        wrong.append(f"a lost lease logged: {texts}")
    return wrong


@pytest.mark.parametrize("kind", [RedisSessionLane, RedisLane])
@pytest.mark.parametrize("form", ["manual_release", "hold.release"])
def test_ending_a_hold_its_stopped_release_freed_is_no_lost_lease(
    redis_server: RedisServer, redis_prefix: str, monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture, kind: Any, form: str,
) -> None:
    """Leaving ``with``, a KeyboardInterrupt lands after the release script answered and
    before its answer was read: the hold stays HELD (README, "Interrupts"), the key free
    in Redis. Observed before: the follow-up ``manual_release(key)`` returned False but
    reported a lost lease (``on_lease_lost`` called, ``hold.lost`` True, ``leases_lost``
    1, "lease ... lost" logged) and counted the hold in ``unmatched_releases``.
    Expected: manual_release returns False (``hold.release()`` raises NotOwnerError, not
    LeaseLostError) with a warning that the stopped release had released it; the hold
    counted in ``released``; no lost lease."""
    caplog.set_level(logging.WARNING, logger="lanequeue")
    client = redis.Redis(host=redis_server.host, port=redis_server.port)
    lost: list[Any] = []
    lane = _lane(kind, client, redis_prefix, 30.0, lost)
    armed = _interrupt_reading_the_release(monkeypatch)
    hold = lane.acquire("k", timeout_s=5)
    hold.__enter__()
    armed["on"] = True
    with pytest.raises(KeyboardInterrupt):
        hold.__exit__(None, None, None)
    assert armed["fired"], "the interrupt was not injected"
    assert hold._state == HELD and "k" in lane.get_active()
    assert not _held_in_redis(client, redis_prefix, kind)  # the script did run
    if form == "manual_release":
        assert lane.manual_release("k") is False
    else:
        with pytest.raises(NotOwnerError) as err:
            hold.release()
        assert not isinstance(err.value, LeaseLostError)
        assert FREED in str(err.value)
    assert _freed_not_lost(lane, hold, lost, caplog, form == "manual_release") == []
    assert lane.manual_release("k") is False  # nothing left: a release of nothing
    client.close()


@pytest.mark.parametrize("kind", [RedisSessionLane, RedisLane])
def test_the_renewer_ends_a_hold_its_stopped_release_freed_as_released(
    redis_server: RedisServer, redis_prefix: str, monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture, kind: Any,
) -> None:
    """As above, but the renewer (every ``lease_s/3``) finds the hold gone before anyone
    ends it. Observed before: a lost lease (``on_lease_lost``, ``hold.lost``,
    ``leases_lost`` 1). Expected: the renewer ends the hold counted in ``released``,
    with a warning that the stopped release had released it; no lost lease;
    ``manual_release(key)`` then returns False."""
    caplog.set_level(logging.WARNING, logger="lanequeue")
    client = redis.Redis(host=redis_server.host, port=redis_server.port)
    lost: list[Any] = []
    lane = _lane(kind, client, redis_prefix, 3.0, lost)
    armed = _interrupt_reading_the_release(monkeypatch)
    hold = lane.acquire("k", timeout_s=5)
    hold.__enter__()
    armed["on"] = True
    with pytest.raises(KeyboardInterrupt):
        hold.__exit__(None, None, None)
    assert armed["fired"], "the interrupt was not injected"
    assert hold._state == HELD and not _held_in_redis(client, redis_prefix, kind)
    deadline = time.monotonic() + 5.0
    while hold._state == HELD and not hold._lost and time.monotonic() < deadline:
        time.sleep(0.02)  # the renewer's round, lease_s/3 after the grant
    assert _freed_not_lost(lane, hold, lost, caplog) == []
    assert lane.manual_release("k") is False
    client.close()


@pytest.mark.parametrize("kind", [RedisSessionLane, RedisLane])
def test_a_stopped_release_past_the_holds_deadline_is_still_a_lost_lease(
    redis_server: RedisServer, redis_prefix: str, monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture, kind: Any,
) -> None:
    """The other side: a hold whose release was stopped unanswered and whose own
    deadline then passed (renewal suspended) is lost by its own clock: reported lost
    (``on_lease_lost``, ``leases_lost``), and manual_release returns False."""
    caplog.set_level(logging.ERROR, logger="lanequeue")
    client = redis.Redis(host=redis_server.host, port=redis_server.port)
    lost: list[Any] = []
    lane = _lane(kind, client, redis_prefix, 1.0, lost)
    armed = _interrupt_reading_the_release(monkeypatch)
    hold = lane.acquire("k", timeout_s=5)
    hold.__enter__()
    hold._suspend_renewal()
    armed["on"] = True
    with pytest.raises(KeyboardInterrupt):
        hold.__exit__(None, None, None)
    assert armed["fired"]
    deadline = time.monotonic() + 5.0
    while not lost and time.monotonic() < deadline:
        time.sleep(0.02)
    assert lost == [hold] and hold.lost and lane.leases_lost == 1
    assert lane.manual_release("k") is False
    assert lane.leases_lost == 1 and lane.stats.holders == 0
    client.close()


@pytest.mark.parametrize("kind", [AsyncRedisSessionLane, AsyncRedisLane])
@pytest.mark.parametrize("path", ["manual_release", "hold.release", "renewer"])
def test_asyncio_a_hold_its_stopped_release_freed_is_no_lost_lease(
    redis_server: RedisServer, redis_prefix: str, monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture, kind: Any, path: str,
) -> None:
    """The asyncio face (same core): leaving ``async with``, a KeyboardInterrupt lands
    after the release script answered and before its answer was read; then the hold is
    ended by ``manual_release(key)``, by ``hold.release()`` or by the renewer finding it
    gone. Observed before: a lost lease each time. Expected: counted released, a warning
    that the stopped release had released it, no lost lease."""
    caplog.set_level(logging.WARNING, logger="lanequeue")
    sync_client = redis.Redis(host=redis_server.host, port=redis_server.port)
    lost: list[Any] = []

    async def main() -> list[str]:
        client = redis.asyncio.Redis(host=redis_server.host, port=redis_server.port)
        lane = _lane(kind, client, redis_prefix, 3.0, lost)
        armed = _interrupt_reading_the_release(monkeypatch)
        hold = lane.acquire("k", timeout_s=5)
        await hold.__aenter__()
        armed["on"] = True
        try:
            await hold.__aexit__(None, None, None)
        except KeyboardInterrupt:
            pass
        else:
            raise AssertionError("the release was not interrupted")
        assert armed["fired"]
        assert hold._state == HELD and "k" in lane.get_active()
        assert not _held_in_redis(sync_client, redis_prefix, kind)
        if path == "manual_release":
            assert await lane.manual_release("k") is False
        elif path == "hold.release":
            try:
                await hold.release()
            except NotOwnerError as err:
                assert not isinstance(err, LeaseLostError)
                assert FREED in str(err)
            else:
                raise AssertionError("hold.release() did not raise")
        else:
            deadline = time.monotonic() + 5.0
            while hold._state == HELD and not hold._lost and time.monotonic() < deadline:
                await asyncio.sleep(0.02)
        await asyncio.sleep(0)  # (an on_lease_lost handed to the loop)
        wrong = _freed_not_lost(lane, hold, lost, caplog, path != "hold.release")
        assert await lane.manual_release("k") is False
        await client.aclose()
        return wrong

    assert asyncio.run(main()) == []
    sync_client.close()
