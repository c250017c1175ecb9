"""Session-key builders: one conversation, one key.

Every part is normalised the same way: first to Unicode NFC (so ``"é"`` typed as one
character, U+00E9, and as ``"e"`` plus a combining accent, ``"e\u0301"``, give one key),
then stripped, lower-cased, and each character that is not a letter, a combining mark or a
digit (Unicode categories L, M, N, so ``"Иван"``, ``"张三"`` and ``"é"`` are kept) nor
``_`` turned into ``_``; parts are joined with ``:``. Normalising keeps keys stable across
the spellings a platform hands out (``"C12345"`` vs ``"c12345"``, Slack's
``"1234567890.123456"`` thread stamps, one text in either Unicode form) and keeps ``:``
free as the separator.

Only the builders normalise: a key passed to a lane directly is used as it is, its plain
string value (``"e\u0301"`` and ``"\u00e9"`` are two keys of a lane, on every face).

Normalising is lossy in case and in every character that is not a letter, mark or digit:
ids that differ only in case or in such characters (``"U:1"`` and ``"U_1"``, ``"a b"`` and
``"a-b"``, two different emoji) give the same key, so those conversations are serialised
together (safe, but not parallel). If a platform's ids differ that way, hash them into the
part first. Two ids that differ in a letter or digit (other than by case, or by the
Unicode form of the same text) always give different keys. What is a letter is what the
running Python's Unicode tables say (``unicodedata``): a letter newer than them counts as
not a letter, so hosts on different Python versions sharing one Redis may build different
keys for such ids.
"""

from __future__ import annotations

import unicodedata

__all__ = [
    "build_gateway_session_key",
    "build_scheduler_session_key",
    "build_subagent_session_key",
    "normalize_key_part",
]

_KEPT_CATEGORIES = frozenset("LMN")  # letters, combining marks, digits and numbers


def _keep(ch: str) -> str:
    return ch if ch == "_" or unicodedata.category(ch)[0] in _KEPT_CATEGORIES else "_"


def normalize_key_part(part: str, name: str = "part") -> str:
    """Normalise to Unicode NFC, then strip, lower-case and replace each character that
    is not a Unicode letter, mark or digit (categories L, M, N) nor ``_`` by ``_``.

    Raises TypeError (naming ``name``) if ``part`` is not a ``str``.

    >>> normalize_key_part(" 1234567890.123456 ")
    '1234567890_123456'
    >>> normalize_key_part("Иван Петров")
    'иван_петров'
    >>> normalize_key_part("Ce\u0301line") == normalize_key_part("C\u00e9line") == "c\u00e9line"
    True
    """
    if not isinstance(part, str):
        raise TypeError(f"{name} must be a str, not {type(part).__name__}")
    return "".join(map(_keep, unicodedata.normalize("NFC", part).strip().lower()))


def _required(part: str, name: str) -> str:
    out = normalize_key_part(part, name)
    if not out:
        raise ValueError(f"{name} must not be empty")
    return out


def build_gateway_session_key(
    channel: str, channel_id: str, sender_id: str = "", thread_id: str = ""
) -> str:
    """The session key of a chat-gateway conversation.

    ``gateway:<channel>:<channel_id>[:<sender_id>[:<thread_id>]]``: an empty sender or
    thread is dropped from the end, but a thread without a sender keeps an empty sender
    part, so it never equals a sender-only key.

    Args:
        channel: platform name ("slack", "discord", ...); must not be empty.
        channel_id: the channel's id on that platform; must not be empty.
        sender_id: the user's id, or "" for a channel-wide conversation.
        thread_id: the thread's id, or "" outside threads.

    Raises:
        TypeError: a part is not a ``str``. ValueError: channel or channel_id is empty.

    >>> build_gateway_session_key("slack", "C12345", "U789", thread_id="1234567890.123456")
    'gateway:slack:c12345:u789:1234567890_123456'
    >>> build_gateway_session_key("slack", "C12345", thread_id="t1")
    'gateway:slack:c12345::t1'
    """
    parts = ["gateway", _required(channel, "channel"), _required(channel_id, "channel_id")]
    sender = normalize_key_part(sender_id, "sender_id")
    thread = normalize_key_part(thread_id, "thread_id")
    if sender or thread:
        parts.append(sender)
    if thread:
        parts.append(thread)
    return ":".join(parts)


def build_subagent_session_key(ip_name: str, task_id: str, phase: str = "pipeline") -> str:
    """The session key of a sub-agent task: ``ip:<ip_name>:<phase>:subagent:<task_id>``.

    Task ids are unique, so sub-agents never wait on the session lane; cap them with a
    counting lane ("subagent" in :func:`build_default_lanes`).

    Raises:
        TypeError: a part is not a ``str``. ValueError: a part is empty.

    >>> build_subagent_session_key("berserk", "reddit_analysis")
    'ip:berserk:pipeline:subagent:reddit_analysis'
    """
    return (
        f"ip:{_required(ip_name, 'ip_name')}:{_required(phase, 'phase')}"
        f":subagent:{_required(task_id, 'task_id')}"
    )


def build_scheduler_session_key(job_id: str) -> str:
    """The session key of a scheduled job: ``sched:<job_id>`` (normalised).

    Raises TypeError if ``job_id`` is not a ``str``, ValueError if it is empty.

    >>> build_scheduler_session_key("Nightly-Report")
    'sched:nightly_report'
    """
    return f"sched:{_required(job_id, 'job_id')}"
