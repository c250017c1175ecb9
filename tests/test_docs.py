"""The documentation is code that runs: every docstring example of every lanequeue module
(doctest), the documentation site (``mkdocs build --strict``), and the version.
"""

from __future__ import annotations

import doctest
import importlib
import importlib.metadata
import importlib.util
import pkgutil
import shutil
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest

import lanequeue

ROOT = Path(__file__).resolve().parent.parent
FLAGS = doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE

#: Modules never imported here: ``__main__`` runs the command line when imported.
NOT_IMPORTED = {"lanequeue.__main__"}


def module_names() -> list[str]:
    """Every module of the package. Without redis-py (the ``redis`` extra) the
    ``lanequeue.redis`` modules cannot be imported, so they are left out then (and only
    then): the test environment installs the extra, so there they are all run."""
    have_redis = importlib.util.find_spec("redis") is not None
    names = ["lanequeue"]
    for info in pkgutil.walk_packages(lanequeue.__path__, "lanequeue.", onerror=lambda _: None):
        if info.name in NOT_IMPORTED:
            continue
        if info.name.startswith("lanequeue.redis") and not have_redis:
            continue
        names.append(info.name)
    return sorted(names)


MODULES = module_names()


def run_doctests(module: ModuleType) -> tuple[int, list[str]]:
    """(examples run, failure reports) for the docstrings of ``module``."""
    finder = doctest.DocTestFinder(exclude_empty=True)
    runner = doctest.DocTestRunner(optionflags=FLAGS)
    reports: list[str] = []
    attempted = 0
    for test in finder.find(module, module.__name__):
        out: list[str] = []
        result = runner.run(test, out=out.append, clear_globs=True)
        attempted += result.attempted
        if result.failed:
            reports.append("".join(out))
    return attempted, reports


@pytest.mark.timeout(60)
@pytest.mark.parametrize("name", MODULES)
def test_docstring_examples_run(name: str) -> None:
    _, reports = run_doctests(importlib.import_module(name))
    assert not reports, "\n".join(reports)


def test_the_package_modules_are_all_found() -> None:
    for name in (
        "lanequeue",
        "lanequeue.lanes",
        "lanequeue.aio",
        "lanequeue.queue",
        "lanequeue.keys",
        "lanequeue.cli",
        "lanequeue.redis",
        "lanequeue.replay.observe",
        "lanequeue.replay.runtimes.threads",
    ):
        assert name in MODULES


@pytest.mark.parametrize(
    "name",
    [
        "lanequeue",
        "lanequeue.lanes",
        "lanequeue.aio",
        "lanequeue.queue",
        "lanequeue.keys",
        "lanequeue.replay",
        "lanequeue.replay.observe",
    ],
)
def test_the_public_modules_have_examples_that_run(name: str) -> None:
    attempted, reports = run_doctests(importlib.import_module(name))
    assert attempted > 0 and not reports


def test_a_failing_example_is_reported() -> None:
    module = ModuleType("lanequeue_doc_probe")
    module.__doc__ = ">>> 1 + 1\n3\n"
    attempted, reports = run_doctests(module)
    assert attempted == 1 and len(reports) == 1 and "Expected:\n    3" in reports[0]


# --------------------------------------------------------------------------------------
# The version


def test_version_is_the_installed_distributions() -> None:
    assert lanequeue.__version__ == importlib.metadata.version("lanequeue")


def test_version_without_the_distribution(monkeypatch: pytest.MonkeyPatch) -> None:
    def missing(name: str) -> str:
        raise importlib.metadata.PackageNotFoundError(name)

    monkeypatch.setattr(importlib.metadata, "version", missing)
    assert lanequeue._version() == "0+unknown"


# --------------------------------------------------------------------------------------
# The documentation site


@pytest.mark.timeout(120)
def test_the_site_builds_without_warnings(tmp_path: Path) -> None:
    # Fails, never skips, when the build tools are missing: they are in the test extra.
    assert importlib.util.find_spec("mkdocs") is not None, "pip install -e '.[docs]'"
    assert importlib.util.find_spec("mkdocstrings_handlers") is not None
    site = tmp_path / "site"
    done = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(site)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=110,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    api = (site / "api" / "index.html").read_text(encoding="utf-8")
    for name in ("SessionLane", "AsyncLaneQueue", "RedisSessionLane", "acquire_all"):
        assert name in api
    for page in ("threads", "asyncio", "redis", "contract"):
        assert (site / page / "index.html").is_file()
    shutil.rmtree(site)
