"""The README's Dispatcher section stays true: it comes right after the quick start, each
of its examples shown with its output (asyncio, threads, a drain on a signal) runs and
prints that output, and its policy table lists exactly the dispatcher's busy policies."""

from __future__ import annotations

import re
import subprocess
import sys
from itertools import pairwise
from pathlib import Path

from lanequeue.dispatch import BUSY_POLICIES

README = Path(__file__).resolve().parent.parent / "README.md"


def section() -> str:
    text = README.read_text()
    start = text.index("## Dispatcher")
    return text[start:text.index("\n## ", start + 1)]


def examples_with_output() -> list[tuple[str, str]]:
    """(code, output) of every ```python block of the section that is followed by
    "prints" and a plain block: the output the README shows for it."""
    text = section()
    blocks = list(re.finditer(r"^```(\w*)\n(.*?)^```$", text, re.S | re.M))
    return [(code.group(2), shown.group(2)) for code, shown in pairwise(blocks)
            if code.group(1) == "python" and shown.group(1) == ""
            and text[code.end():shown.start()] == "\n\nprints\n\n"]


def test_the_dispatcher_section_follows_the_quick_start() -> None:
    headings = re.findall(r"^## (.*)$", README.read_text(), re.M)
    at = headings.index("Quick start: the three call patterns")
    assert headings[at + 1].startswith("Dispatcher")
    assert headings[at + 2] == "The main job: `lanequeue replay`"


def test_the_readme_links_to_its_own_headings() -> None:
    """Every ``](#anchor)`` of the README names a heading of it (GitHub's anchors:
    lower case, punctuation other than ``-`` and ``_`` left out, spaces as ``-``)."""
    text = README.read_text()
    anchors = {re.sub(r"[^\w\- ]", "", h.strip().lower()).replace(" ", "-")
               for h in re.findall(r"^#+ (.*)$", text, re.M)}
    links = re.findall(r"\]\(#([^)]+)\)", text)
    assert links and all(link in anchors for link in links), set(links) - anchors


def test_readme_dispatcher_examples_print_what_they_say() -> None:
    examples = examples_with_output()
    # The asyncio example, the ThreadDispatcher example, the drain on Ctrl-C / SIGTERM.
    assert len(examples) == 3
    assert "ThreadDispatcher(" in examples[1][0] and "add_signal_handler" in examples[2][0]
    for code, shown in examples:
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                             timeout=60, check=True).stdout
        assert out == shown


def test_readme_policy_table_lists_every_busy_policy() -> None:
    # The first table of the section is the policy table; the states table follows it.
    rows = re.findall(r"^\| `(\w+)`(?: \(default\))? \|", section(), re.M)
    assert rows[: len(BUSY_POLICIES)] == list(BUSY_POLICIES)
    assert rows[len(BUSY_POLICIES):] == ["done", "failed", "cancelled", "dropped",
                                         "rejected", "timed_out", "deduped"]


def test_readme_says_when_a_turn_starts_and_what_interrupt_does_to_one_not_started() -> None:
    """The example's first submit said ``# runs at once``: on asyncio the turn is the
    key's at once but starts when the loop next runs, and an ``interrupt`` submitted
    before that drops it (``dropped``, "superseded"), not ``cancelled`` as the table
    said of every current turn. The README says so, and a real event loop agrees."""
    import asyncio

    from lanequeue import Dispatcher, TurnDroppedError, build_default_async_lanes

    text = section()
    flat = " ".join(text.split())
    assert "runs at once" not in text.split("```python", 1)[1].split("```", 1)[0]
    assert ("# An idle key: \"hi\" becomes its turn at once (nothing merges into it); the "
            "turn # starts when the loop next runs (here, at the first await).") in flat
    assert ("| `interrupt` | cancels the running turn, whose `fn` was called (`cancelled`, "
            "`\"superseded\"`), and drops every turn of the key that has not started "
            "(`dropped`, `\"superseded\"`): the pending ones, steered payloads not taken "
            "included, and the key's current turn when its `fn` has not been called yet (it "
            "waits at the gate or for its lanes: on asyncio, a turn submitted a moment "
            "earlier, which the loop has not run yet, ends so); then runs.") in flat

    started: list[str] = []

    async def reply(text: str) -> str:
        started.append(text)
        await asyncio.sleep(0.01)
        return text

    async def main() -> None:
        dispatcher = Dispatcher(build_default_async_lanes(), busy="interrupt")
        first = dispatcher.submit("conv-1", reply, "hi")
        assert (first.state, started) == ("pending", [])  # not running when submit returns
        await asyncio.sleep(0)  # the loop runs: the turn starts
        assert (first.state, started) == ("running", ["hi"])
        await first
        early = dispatcher.submit("conv-1", reply, "a")  # not started yet ...
        late = dispatcher.submit("conv-1", reply, "b")  # ... when this interrupts
        assert (early.state, early.reason) == ("dropped", "superseded")
        try:
            await early
        except TurnDroppedError:
            pass
        else:
            raise AssertionError("the turn that had not started was not dropped")
        assert await late == "b" and started == ["hi", "b"]
        s = dispatcher.stats
        assert (s.cancelled, s.dropped, s.done) == (0, 1, 2)
        assert await dispatcher.drain(timeout_s=5.0)

    asyncio.run(main())
