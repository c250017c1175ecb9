"""Messages about a key stay short whatever the key's length: a key may be any length (a
user-supplied id, megabytes), a log line or an exception text must not copy it whole.
The exceptions' ``key`` attributes keep the whole key; short keys appear whole (the
source design's timeout wording is kept)."""

from __future__ import annotations

import logging
import warnings
from typing import Any

import pytest

from lanequeue import (
    Lane,
    LaneClearedError,
    LaneDrainingError,
    LaneTimeoutError,
    NotOwnerError,
    SessionLane,
    TurnRejectedError,
)
from lanequeue._errors import SHOWN_MAX, cut, shown
from lanequeue.redis import RedisSessionLane

HUGE = "u" * (1 << 20)
LIMIT = 4 * SHOWN_MAX  # a message's own words plus one cut key


def test_cut_and_shown_keep_short_keys_whole_and_cut_long_ones() -> None:
    assert cut("gateway:slack:c1") == "gateway:slack:c1"
    assert shown("gateway:slack:c1") == repr("gateway:slack:c1")
    long = "a" * 150 + "b" * 150
    assert cut(long).startswith("a" * (SHOWN_MAX // 2) + "...")
    assert cut(long).endswith("b" * (SHOWN_MAX // 2) + " (300 characters)")
    assert shown(long).endswith("' (300 characters)") and "..." in shown(long)
    assert len(shown(long)) <= SHOWN_MAX + len("'' (300 characters)")
    assert shown(HUGE).endswith("' (1,048,576 characters)")
    assert len(shown(HUGE)) <= SHOWN_MAX + len("'' (1,048,576 characters)")


def test_timeout_message_keeps_the_source_wording_and_cuts_a_huge_key() -> None:
    assert str(LaneTimeoutError("s", "k", 0.5, "SessionLane")) == (
        "SessionLane 's' timeout for key 'k' after 0.5 s")
    err = LaneTimeoutError("s", HUGE, 0.5, "SessionLane")
    assert len(str(err)) < LIMIT and err.key == HUGE
    assert str(err).startswith("SessionLane 's' timeout for key 'uuu")
    assert "(1,048,576 characters)" in str(err)


@pytest.mark.parametrize("err", [
    LaneDrainingError("s", HUGE), LaneClearedError("s", HUGE),
    TurnRejectedError("rejected", HUGE, "busy", 1),
])
def test_error_texts_cut_a_huge_key_and_keep_it_whole_as_attribute(err: Any) -> None:
    assert len(str(err)) < LIMIT and err.key == HUGE


@pytest.mark.parametrize("cls", [SessionLane, Lane])
def test_thread_lane_messages_about_a_huge_key_are_short(
    cls: Any, caplog: pytest.LogCaptureFixture
) -> None:
    """Input: a 1 MB key through the unheld-release warning, a refused and a timed-out
    acquire, the slow-wait warning, a hold's repr and its NotOwnerError, a dropped hold's
    ResourceWarning. Observed before: 1 MB log lines and exception texts. Expected: each
    under LIMIT characters."""
    lane = cls("s", warn_after_s=0.01) if cls is SessionLane else cls(
        "s", max_concurrent=1, warn_after_s=0.01)
    with caplog.at_level(logging.WARNING, logger="lanequeue"):
        assert lane.manual_release(HUGE) is False
        assert lane.try_acquire(HUGE)
        with pytest.raises(LaneTimeoutError) as info, lane.acquire(HUGE, timeout_s=0.05):
            pass
        assert lane.manual_release(HUGE)
    assert len(str(info.value)) < LIMIT
    assert caplog.records and all(len(r.getMessage()) < LIMIT for r in caplog.records)
    # Each cut key in a log line gives its length, as the exception texts do.
    assert all("(1,048,576 characters)" in r.getMessage() for r in caplog.records)
    hold = lane.acquire(HUGE)
    with hold:
        assert len(repr(hold)) < LIMIT
    with pytest.raises(NotOwnerError) as not_owner:
        hold.release()
    assert len(str(not_owner.value)) < LIMIT
    dropped = lane.acquire(HUGE)
    dropped.__enter__()
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        del dropped
    assert seen and all(len(str(w.message)) < LIMIT for w in seen)
    assert lane.active_count == 0


def test_redis_lane_messages_about_a_huge_key_are_short(
    redis_client: Any, redis_prefix: str, caplog: pytest.LogCaptureFixture
) -> None:
    """The same on the Redis face: a refused wait's timeout text, the unheld
    manual_release warning, a hold's repr and its NotOwnerError after release."""
    lane = RedisSessionLane(redis_client, "s", prefix=redis_prefix, lease_s=5)
    other = RedisSessionLane(redis_client, "s", prefix=redis_prefix, lease_s=5)
    with caplog.at_level(logging.WARNING, logger="lanequeue"):
        assert lane.manual_release(HUGE) is False
        with lane.acquire(HUGE) as hold:
            assert len(repr(hold)) < LIMIT
            with pytest.raises(LaneTimeoutError) as info, other.acquire(HUGE, timeout_s=0.05):
                pass
    assert len(str(info.value)) < LIMIT
    with pytest.raises(NotOwnerError) as not_owner:
        hold.release()
    assert len(str(not_owner.value)) < LIMIT
    assert caplog.records and all(len(r.getMessage()) < LIMIT for r in caplog.records)
