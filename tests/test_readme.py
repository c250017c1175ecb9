"""Every ```python block of README.md and of the documentation pages (docs/*.md) runs as
written, each in a fresh interpreter.

A block is complete: nothing is added before or after it. The only input from outside is
what a block itself says it reads: a block that imports ``redis`` reads the server's
address from ``REDIS_HOST``/``REDIS_PORT`` (the README says so above it), and runs against
the real redis-server the tests start.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
_FENCE = re.compile(r"^```python\n(.*?)^```$", re.DOTALL | re.MULTILINE)


def python_blocks(text: str) -> list[tuple[int, str]]:
    """(line number of the opening fence, code) of every ```python block."""
    return [(text.count("\n", 0, m.start()) + 1, m.group(1)) for m in _FENCE.finditer(text)]


BLOCKS = [
    (f"{page.relative_to(ROOT)}:{line}", code)
    for page in PAGES
    for line, code in python_blocks(page.read_text(encoding="utf-8"))
]


def _needs_redis(code: str) -> bool:
    return re.search(r"^\s*(import redis\b|from redis\b)", code, re.MULTILINE) is not None


def test_the_pages_have_python_blocks() -> None:
    readme = [where for where, _ in BLOCKS if where.startswith("README.md:")]
    assert len(readme) >= 5  # gateway, scheduler, sub-agent, asyncio, Redis
    assert len(BLOCKS) > len(readme)  # and the guides


def test_block_extraction() -> None:
    text = "intro\n```python\nx = 1\n```\n```bash\nls\n```\n```python\ny = 2\nz = 3\n```\n"
    assert python_blocks(text) == [(2, "x = 1\n"), (8, "y = 2\nz = 3\n")]


@pytest.mark.timeout(60)
@pytest.mark.parametrize(("where", "code"), BLOCKS, ids=[where for where, _ in BLOCKS])
def test_python_block_runs_as_written(
    where: str, code: str, request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    env = {k: v for k, v in os.environ.items() if k not in ("REDIS_HOST", "REDIS_PORT")}
    if _needs_redis(code):
        server = request.getfixturevalue("redis_server")
        env["REDIS_HOST"], env["REDIS_PORT"] = server.host, str(server.port)
    done = subprocess.run(
        [sys.executable, "-c", code],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=50,
        check=False,
    )
    assert done.returncode == 0, f"{where}:\n{done.stderr}"


def test_the_redis_guide_agrees_with_the_readme_and_the_code() -> None:
    """docs/redis.md says what the README says (and what the tests measure) about a
    killed holder (its keys reach a caller 2 s after one first finds its process gone,
    2 to 3 s after the kill when callers already wait or poll, C30 in
    tests/test_redis_failover.py, not after ``lease_s``), the pool (a waiter holds no
    connection: C21 in tests/test_redis_faults.py runs 12 waiters on a pool of 4) and
    the call limits (the constants of lanequeue.redis._wake)."""
    from lanequeue.redis._wake import FREEING_CALLS, MAX_CALLS

    guide = " ".join((ROOT / "docs" / "redis.md").read_text(encoding="utf-8").split())
    readme = " ".join((ROOT / "README.md").read_text(encoding="utf-8").split())
    for text in (guide, readme):
        assert "2 s after a caller first finds" in text
        assert "2 to 3 s after the kill when callers already wait or poll" in text
        assert "holds no connection" in text
    assert f"at most {MAX_CALLS} script calls at once per client" in guide
    assert f"at once per client and {FREEING_CALLS} more for releases" in guide
    assert "never more than its `max_connections` at once" in guide
    assert f"at most {MAX_CALLS + FREEING_CALLS} script connections" in readme
    assert "down to `max_connections=1`" in readme
    assert "after `lease_s` seconds" not in guide
    assert "blocks one connection" not in guide
