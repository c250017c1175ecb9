"""MkDocs hook: ``<!-- README: API -->`` in a page becomes the README's API section.

The README keeps the contract table (one place); the site shows that same section. The
build fails when the README has no such section, so the page cannot silently go empty.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

_MARKER = "<!-- README: API -->"
_README = Path(__file__).resolve().parent.parent / "README.md"


def readme_section(text: str, title: str) -> str:
    """The body of the README's ``## <title>`` section (up to the next ``## `` heading),
    its own headings moved one level down."""
    match = re.search(rf"^## {re.escape(title)}\n(.*?)(?=^## |\Z)", text, re.M | re.S)
    if match is None:
        raise ValueError(f"README.md has no '## {title}' section")
    return re.sub(r"^(#+) ", r"#\1 ", match.group(1), flags=re.M).strip() + "\n"


def on_page_markdown(markdown: str, **_: Any) -> str:
    """Put the README's API section where the page has the marker."""
    if _MARKER not in markdown:
        return markdown
    return markdown.replace(_MARKER, readme_section(_README.read_text(encoding="utf-8"), "API"))
