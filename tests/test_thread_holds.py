"""Holds on the thread face: tokens, early release, single use; holds of acquire_all."""

from __future__ import annotations

import logging

import pytest

from lanequeue import Lane, LaneQueue, SessionLane


@pytest.mark.parametrize("make", [lambda: Lane("l", max_concurrent=2), lambda: SessionLane()])
def test_tokens_grow_with_every_grant(make: object) -> None:
    lane = make()  # type: ignore[operator]
    tokens = []
    for _ in range(3):
        with lane.acquire("k", timeout_s=0) as hold:
            assert hold.held
            assert hold.fencing_token == hold.token > 0
            tokens.append(hold.token)
        assert not hold.held
        assert hold.token == tokens[-1]  # still readable after the release
    assert tokens == sorted(set(tokens))


@pytest.mark.parametrize("make", [lambda: Lane("l", max_concurrent=1), lambda: SessionLane()])
def test_early_release_then_leaving_the_block_changes_nothing(
    make: object, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="lanequeue")
    lane = make()  # type: ignore[operator]
    with lane.acquire("k", timeout_s=0) as hold:
        assert hold.release() is True
        assert not hold.held
        assert lane.try_acquire("k")  # someone else takes it meanwhile
    assert lane.active_count == 1  # leaving the block did not end the other hold
    assert lane.stats.unmatched_releases == 0
    assert [r for r in caplog.records if r.name == "lanequeue"] == []
    assert lane.manual_release("k")


def test_a_hold_is_single_use() -> None:
    lane = SessionLane()
    hold = lane.acquire("k", timeout_s=0)
    with hold, pytest.raises(RuntimeError):
        hold.__enter__()
    with pytest.raises(RuntimeError), hold:
        pass
    assert lane.active_count == 0
    assert "k" in repr(hold)


def test_a_multi_hold_is_single_use_like_a_hold() -> None:
    """Entering an ``acquire_all`` again, inside its block or after it, raises (as a
    hold does) and takes nothing."""
    queue = LaneQueue()
    s = queue.add_session_lane("session")
    g = queue.add_lane("global", max_concurrent=2)
    for names in (["session", "global"], ["global"]):
        multi = queue.acquire_all("k", names)
        with multi:
            with pytest.raises(RuntimeError, match="single use"):
                multi.__enter__()
            assert s.stats.acquired + g.stats.acquired == len(names) + (
                0 if names == ["session", "global"] else 2)
        with pytest.raises(RuntimeError, match="single use"), multi:
            pass
        assert s.active_count == g.active_count == 0
        multi.release()  # still safe after the block
    # A multi-hold released through release() is used up too.
    multi = queue.acquire_all("k", ["session"])
    multi.__enter__()
    multi.release()
    with pytest.raises(RuntimeError, match="single use"):
        multi.__enter__()
    assert s.active_count == 0 and s.stats.acquired == 2


def test_multi_hold_views() -> None:
    queue = LaneQueue()
    s = queue.add_session_lane("session")
    g = queue.add_lane("global", max_concurrent=2)
    with queue.acquire_all("k", ["global", "session"]) as multi:
        assert len(multi) == 2
        assert [h.lane for h in multi] == [s, g]
        assert multi["session"].key == "k"
        assert multi["global"].token > 0
        with pytest.raises(KeyError):
            multi["nope"]
    assert s.active_count == g.active_count == 0


def test_multi_hold_early_release_then_exit_changes_nothing(
    caplog: pytest.LogCaptureFixture,
) -> None:
    # Giving the global slot back early (the session stays held) is a fair use of the
    # hold that multi["global"] returns; leaving the block must not then release it a
    # second time (a warning and an unmatched release), as with a lane's own hold.
    caplog.set_level(logging.WARNING, logger="lanequeue")
    queue = LaneQueue()
    s = queue.add_session_lane("session")
    g = queue.add_lane("global", max_concurrent=1)
    with queue.acquire_all("k", ["session", "global"]) as multi:
        assert multi["global"].release() is True
        assert g.available == 1
        assert s.is_held("k")
        assert not multi["global"].held
    assert not s.is_held("k")
    assert g.stats.unmatched_releases == 0
    assert [r.getMessage() for r in caplog.records if r.name == "lanequeue"] == []



@pytest.mark.parametrize("make", [lambda: Lane("l", max_concurrent=2),
                                  lambda: SessionLane(idle_timeout_s=0)])
def test_leaving_a_block_whose_hold_someone_else_ended(
    make: object, caplog: pytest.LogCaptureFixture
) -> None:
    """``manual_release(key)`` ends the block's hold from outside (and on a per-key lane
    the idle entry is then evicted by a new key): leaving the block ends nothing more,
    counts one unmatched release and logs nothing; the lane goes on working."""
    caplog.set_level(logging.WARNING, logger="lanequeue")
    lane = make()  # type: ignore[operator]
    with lane.acquire("k") as hold:
        assert lane.manual_release("k")
        assert not hold.held
        with lane.acquire("other"):  # a new key: the idle "k" entry is evicted
            if isinstance(lane, SessionLane):
                assert lane.session_count == 1
    st = lane.stats
    assert (st.unmatched_releases, st.holders, st.acquired, st.released) == (1, 0, 2, 2)
    assert [r for r in caplog.records if r.name == "lanequeue"] == []
    with lane.acquire("k"):
        assert lane.stats.holders == 1


def test_leaving_acquire_all_whose_holds_someone_else_ended() -> None:
    """The same for ``acquire_all``: both holds ended from outside (the per-key entry
    evicted meanwhile); leaving the block counts one unmatched release per lane."""
    queue = LaneQueue()
    session = queue.add_session_lane("session", idle_timeout_s=0)
    glob = queue.add_lane("global", max_concurrent=2)
    with queue.acquire_all("k", ["session", "global"]):
        assert session.manual_release("k") and glob.manual_release("k")
        with session.acquire("other"):
            assert session.session_count == 1
    for lane in (session, glob):
        st = lane.stats
        assert (st.unmatched_releases, st.holders) == (1, 0)
    with queue.acquire_all("k", ["session", "global"]):
        assert session.is_held("k") and glob.active_count == 1
