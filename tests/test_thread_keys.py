"""Session-key builders: exact values of the source design and normalisation of every part."""

from __future__ import annotations

import unicodedata

import pytest
from hypothesis import given
from hypothesis import strategies as st

from lanequeue import (
    build_gateway_session_key,
    build_scheduler_session_key,
    build_subagent_session_key,
    normalize_key_part,
)


def test_gateway_key_of_the_source_design() -> None:
    key = build_gateway_session_key("slack", "C12345", "U789", thread_id="1234567890.123456")
    assert key == "gateway:slack:c12345:u789:1234567890_123456"


def test_subagent_key_of_the_source_design() -> None:
    assert build_subagent_session_key("berserk", "reddit_analysis") == (
        "ip:berserk:pipeline:subagent:reddit_analysis"
    )


def test_scheduler_key() -> None:
    assert build_scheduler_session_key("Nightly-Report") == "sched:nightly_report"
    assert build_scheduler_session_key("job_7") == "sched:job_7"


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        ("  Slack ", "slack"),
        ("C12345", "c12345"),
        ("1234567890.123456", "1234567890_123456"),
        ("a:b", "a_b"),
        ("x y-z/w", "x_y_z_w"),
        ("ÄB", "äb"),
        ("Иван", "иван"),
        ("张三", "张三"),
        ("e\u0301", "\u00e9"),  # NFC first: one character
        ("E\u0301", "\u00e9"),
        ("٣4", "٣4"),
        ("a\u200bb", "a_b"),
        ("under_score", "under_score"),
        ("\tTAB\n", "tab"),
        ("", ""),
    ],
)
def test_normalize_key_part(raw: str, expected: str) -> None:
    assert normalize_key_part(raw) == expected


def test_non_latin_ids_of_the_same_length_give_different_keys() -> None:
    assert build_gateway_session_key("telegram", "Иван") != build_gateway_session_key(
        "telegram", "Петр"
    )
    assert build_gateway_session_key("wechat", "c", "张三") != build_gateway_session_key(
        "wechat", "c", "李四"
    )
    assert build_scheduler_session_key("задача") == "sched:задача"


# Letters, marks and digits that lower-casing leaves as they are: two of them that differ
# are two different ids whatever the case rule.
_KEPT = st.characters(categories=("L", "M", "N")).filter(lambda c: c.lower() == c)


@given(st.text(), _KEPT, _KEPT, st.text())
def test_ids_differing_in_a_letter_or_digit_give_different_keys(
    before: str, a: str, b: str, after: str
) -> None:
    """Whatever surrounds it, changing one letter/mark/digit changes every built key,
    unless the two ids are one text in two Unicode forms (``"\u1f71"`` and ``"\u03ac"``,
    both "ά"; ``"e\u0301"`` and ``"é"``): then every built key is the same."""
    if a == b:
        return
    one, two = before + a + after, before + b + after
    if unicodedata.normalize("NFC", one) == unicodedata.normalize("NFC", two):
        assert normalize_key_part(one) == normalize_key_part(two)
        assert build_gateway_session_key("t", "c", one, one) == build_gateway_session_key(
            "t", "c", two, two)
        return
    assert normalize_key_part(one) != normalize_key_part(two)
    assert build_gateway_session_key("t", one) != build_gateway_session_key("t", two)
    assert build_gateway_session_key("t", "c", one, one) != build_gateway_session_key(
        "t", "c", two, two
    )
    assert build_subagent_session_key(one, one, one) != build_subagent_session_key(
        two, two, two
    )
    assert build_scheduler_session_key(one) != build_scheduler_session_key(two)


@given(st.text())
def test_normalised_parts_never_hold_the_separator(raw: str) -> None:
    out = normalize_key_part(raw)
    assert ":" not in out
    assert out == normalize_key_part(out)


def test_every_gateway_part_is_normalised() -> None:
    assert build_gateway_session_key(" SLACK ", " C-1 ", " U.7 ", " T:1 ") == (
        "gateway:slack:c_1:u_7:t_1"
    )
    # No part can smuggle in the separator.
    assert build_gateway_session_key("a:b", "c", "d").count(":") == 3


def test_every_subagent_part_is_normalised() -> None:
    assert build_subagent_session_key(" Berserk ", "Reddit.Analysis", phase="Post-Process") == (
        "ip:berserk:post_process:subagent:reddit_analysis"
    )


def test_gateway_drops_empty_sender_and_thread() -> None:
    assert build_gateway_session_key("slack", "C1") == "gateway:slack:c1"
    assert build_gateway_session_key("slack", "C1", "U1") == "gateway:slack:c1:u1"
    assert build_gateway_session_key("slack", "C1", "   ") == "gateway:slack:c1"
    assert build_gateway_session_key("slack", "C1", "U1", "") == "gateway:slack:c1:u1"


def test_thread_without_sender_keeps_an_empty_sender_part() -> None:
    key = build_gateway_session_key("slack", "C1", thread_id="t1")
    assert key == "gateway:slack:c1::t1"
    # ... so it never equals the key of a sender called like the thread.
    assert key != build_gateway_session_key("slack", "C1", "t1")
    assert build_gateway_session_key("slack", "C1", " ", "t1") == key


@pytest.mark.parametrize("bad", [("", "C1"), ("slack", ""), (" ", "C1"), ("slack", "  ")])
def test_gateway_requires_channel_and_channel_id(bad: tuple[str, str]) -> None:
    with pytest.raises(ValueError):
        build_gateway_session_key(*bad)


def test_builders_reject_empty_required_parts() -> None:
    with pytest.raises(ValueError):
        build_subagent_session_key("", "t")
    with pytest.raises(ValueError):
        build_subagent_session_key("ip", " ")
    with pytest.raises(ValueError):
        build_subagent_session_key("ip", "t", phase="")
    with pytest.raises(ValueError):
        build_scheduler_session_key("")


@pytest.mark.parametrize(
    "call",
    [
        lambda: build_gateway_session_key(1, "C1"),  # type: ignore[arg-type]
        lambda: build_gateway_session_key("slack", None),  # type: ignore[arg-type]
        lambda: build_gateway_session_key("slack", "C1", 5),  # type: ignore[arg-type]
        lambda: build_gateway_session_key("slack", "C1", "U", 1.5),  # type: ignore[arg-type]
        lambda: build_subagent_session_key("ip", 3),  # type: ignore[arg-type]
        lambda: build_scheduler_session_key(7),  # type: ignore[arg-type]
        lambda: normalize_key_part(b"x"),  # type: ignore[arg-type]
    ],
)
def test_builders_reject_non_str_parts(call: object) -> None:
    with pytest.raises(TypeError):
        call()  # type: ignore[operator]


def test_keys_are_lossy_in_symbols_as_documented() -> None:
    """README: characters that are not letters, marks or digits (emoji, symbols) become
    ``_``, so ids differing only in them share a key; letters and digits are kept."""
    from lanequeue import build_gateway_session_key as gw

    assert gw("slack", "c", "😀") == gw("slack", "c", "😁") == "gateway:slack:c:_"
    assert gw("slack", "c", "$1") == gw("slack", "c", "€1")
    assert gw("telegram", "Иван") != gw("telegram", "Петр")


# One text, two Unicode forms: composed (NFC) and decomposed (NFD).
_FORMS = [("\u00e9", "e\u0301"), ("Chlo\u00e9 A\u030a", "Chloe\u0301 \u00c5"),
          ("\u1e69", "s\u0323\u0307"), ("\u1e69", "s\u0307\u0323"),
          ("\uac00", "\u1100\u1161")]  # (Hangul syllable and its jamo)


@pytest.mark.parametrize(("composed", "decomposed"), _FORMS)
def test_builders_give_one_key_for_either_unicode_form(composed: str, decomposed: str) -> None:
    """The builders apply NFC before the rest of their normalisation (README, keys.py):
    ``"é"`` typed as U+00E9 and as ``"e"`` + U+0301 is one conversation, one key."""
    assert normalize_key_part(composed) == normalize_key_part(decomposed)
    assert normalize_key_part(decomposed) == unicodedata.normalize(
        "NFC", normalize_key_part(decomposed))  # the key is in NFC itself
    assert build_gateway_session_key("slack", composed, composed, composed) == (
        build_gateway_session_key("slack", decomposed, decomposed, decomposed))
    assert build_subagent_session_key(composed, composed, composed) == (
        build_subagent_session_key(decomposed, decomposed, decomposed))
    assert build_scheduler_session_key(composed) == build_scheduler_session_key(decomposed)


@given(st.text())
def test_built_keys_depend_only_on_the_nfc_form(raw: str) -> None:
    for form in ("NFC", "NFD"):
        assert normalize_key_part(unicodedata.normalize(form, raw)) == normalize_key_part(raw)


def test_keys_passed_to_a_lane_are_not_normalised() -> None:
    """A lane key is its plain string value in every face: only the builders normalise,
    so ``"\u00e9"`` and ``"e\u0301"`` are two keys of a per-key lane (both held at once)
    and two holders of a counting lane."""
    from lanequeue import Lane, SessionLane

    composed, decomposed = "\u00e9", "e\u0301"
    sessions = SessionLane()
    assert sessions.try_acquire(composed) and sessions.try_acquire(decomposed)
    assert sorted(sessions.get_active()) == sorted([composed, decomposed])
    assert sessions.is_held(decomposed) and sessions.manual_release(decomposed)
    assert sessions.is_held(composed) and not sessions.is_held(decomposed)
    lane = Lane("g", max_concurrent=2)
    assert lane.try_acquire(composed) and lane.try_acquire(decomposed)
    assert lane.holds_of(composed) == lane.holds_of(decomposed) == 1


def test_the_quick_starts_note_on_keys_holds() -> None:
    """README, after the gateway example: the builder folds case and punctuation (one
    conversation for "aBc" and "abc", for "U:1" and "U_1") and takes ``str`` ids only."""
    from lanequeue import build_gateway_session_key as gw

    assert gw("web", "aBc") == gw("web", "abc")
    assert gw("web", "U:1") == gw("web", "U_1")
    with pytest.raises(TypeError, match="channel_id must be a str, not int"):
        gw("telegram", 123456)  # type: ignore[arg-type]
    assert gw("telegram", str(123456)) == "gateway:telegram:123456"
