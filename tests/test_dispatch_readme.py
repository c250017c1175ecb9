"""The README's Dispatcher section stays true: its example runs and prints what the README
says, and its policy table lists exactly the dispatcher's busy policies."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

from lanequeue.dispatch import BUSY_POLICIES

README = Path(__file__).resolve().parent.parent / "README.md"


def section() -> str:
    text = README.read_text()
    start = text.index("## Dispatcher")
    return text[start:text.index("\n## ", start + 1)]


def test_readme_dispatcher_example_prints_what_it_says() -> None:
    blocks = re.findall(r"```(\w*)\n(.*?)```", section(), re.S)
    code = next(body for lang, body in blocks if lang == "python")
    shown = blocks[[b for _, b in blocks].index(code) + 1][1]
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=60, check=True).stdout
    assert out == shown


def test_readme_policy_table_lists_every_busy_policy() -> None:
    # The first table of the section is the policy table; the states table follows it.
    rows = re.findall(r"^\| `(\w+)`(?: \(default\))? \|", section(), re.M)
    assert rows[: len(BUSY_POLICIES)] == list(BUSY_POLICIES)
    assert rows[len(BUSY_POLICIES):] == ["done", "failed", "cancelled", "dropped",
                                         "rejected", "timed_out", "deduped"]
