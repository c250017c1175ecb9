"""Minimal reproductions of defects found by trying the documented API as a user.

Each test states the documented behaviour; ``xfail(strict=True)`` marks the ones the
library does not meet yet, so a fix turns them into unexpected passes (remove the mark
then)."""

from __future__ import annotations

from typing import Any

import pytest

from lanequeue.cli import main
from lanequeue.redis import RedisLane, RedisSessionLane

pytestmark = pytest.mark.timeout(60)


# --- lanequeue status -----------------------------------------------------------------


@pytest.mark.xfail(strict=True, reason="a key with rich markup crashes the status table")
def test_status_table_survives_a_key_with_brackets(
    capsys: pytest.CaptureFixture[str], redis_server: Any, redis_client: Any,
    redis_prefix: str,
) -> None:
    """A conversation key is user data: ``[/]`` must be shown, not parsed as markup."""
    lane = RedisSessionLane(redis_client, prefix=redis_prefix, lease_s=30)
    hold = lane.acquire("[/]")
    hold.__enter__()
    try:
        url = f"redis://{redis_server.host}:{redis_server.port}/0"
        code = main(["status", "--backend", url, "--prefix", redis_prefix])
        out = capsys.readouterr().out
        assert code == 0
        assert "[/]" in out
    finally:
        hold.release()


@pytest.mark.xfail(strict=True, reason="--interval inf / 1e300 ends in OverflowError")
def test_status_interval_too_large_is_an_argument_error(
    capsys: pytest.CaptureFixture[str], redis_server: Any, redis_prefix: str,
) -> None:
    """Bad option values exit with status 2 and a message, not a traceback."""
    url = f"redis://{redis_server.host}:{redis_server.port}/0"
    code = main(["status", "--backend", url, "--prefix", redis_prefix,
                 "--watch", "--interval", "inf"])
    assert code == 2


# --- dispatcher -------------------------------------------------------------------------


# --- argument checks ------------------------------------------------------------------


@pytest.mark.xfail(strict=True, reason="Redis lane constructors do not name their class")
def test_redis_constructor_errors_name_the_public_class(redis_client: Any) -> None:
    """README: "A constructor's error also names the public class"."""
    with pytest.raises(ValueError, match=r"RedisLane\(\)"):
        RedisLane(redis_client, "x", max_concurrent=0)


# --- Redis counting lanes with different caps -----------------------------------------


@pytest.mark.xfail(strict=True, reason="lane_status() reports permits a client cannot take")
def test_lane_status_available_matches_what_can_be_taken(
    redis_client: Any, redis_prefix: str,
) -> None:
    """Clients that disagree on max_concurrent get the smallest cap; lane_status()
    ["available"] ("lane-wide free permits") must not promise more."""
    wide = RedisLane(redis_client, "cap", max_concurrent=3, prefix=redis_prefix)
    narrow = RedisLane(redis_client, "cap", max_concurrent=1, prefix=redis_prefix)
    assert narrow.try_acquire("n")
    assert narrow.manual_release("n")
    assert wide.try_acquire("a")
    try:
        said = wide.lane_status()["available"]
        took = wide.try_acquire("b")
        if took:
            wide.manual_release("b")
        assert (said > 0) == took, (said, took)
    finally:
        wide.manual_release("a")
