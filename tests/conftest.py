"""Shared helpers for the thread-face tests: a fake clock and a hook on the point where a
waiting thread parks (``_ThreadWaiter.park``), so interleavings are driven by events."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import threading
from collections.abc import Callable
from typing import Any

import pytest

from lanequeue.lanes import _ThreadWaiter

#: Tests of ``asyncio.wait`` over tickets as they are (README, "Dispatcher"): Python 3.10's
#: ``asyncio.wait`` puts tasks of its own, each awaiting one ticket, in its done and pending
#: sets instead (the README says so), which those tests do not expect.
asyncio_wait_takes_objects = pytest.mark.skipif(
    sys.version_info < (3, 11),
    reason="Python 3.10's asyncio.wait wraps each ticket in a task of its own (README)")


def run_cli(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    """The exit status, stdout and stderr of ``lanequeue ARGV`` (argparse's refusals,
    which exit, too)."""
    from lanequeue.cli import main

    try:
        code = main(argv)
    except SystemExit as exc:
        code = int(exc.code or 0)
    captured = capsys.readouterr()
    return code, captured.out, captured.err


class FakeClock:
    """A monotonic clock that moves only when told to."""

    def __init__(self, start: float = 1000.0) -> None:
        self.now = start

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


class FakeClockLoop(asyncio.SelectorEventLoop):
    """An event loop whose ``time()`` moves only when told to, run one iteration at a
    time. In one iteration the callbacks already ready run first, then the timers that
    came due (asyncio's ``_run_once`` order)."""

    def __init__(self) -> None:
        super().__init__()
        self.fake_now = 1000.0

    def time(self) -> float:
        return self.fake_now

    def run_once(self) -> None:
        """Run exactly one iteration: the callbacks ready now and the timers now due."""
        self.call_soon(self.stop)
        self.run_forever()

    def settle(self, limit: int = 10_000) -> None:
        """Run iterations until nothing is ready (timers in the future stay pending)."""
        for _ in range(limit):
            self.run_once()
            if not self._ready:  # type: ignore[attr-defined]
                return
        raise AssertionError("the loop did not settle")

    def advance(self, seconds: float) -> None:
        """Move the clock by ``seconds`` and run until the loop settles."""
        self.fake_now += seconds
        self.settle()

    def shutdown(self) -> None:
        """Cancel what is left, let it unwind, and close the loop."""
        for task in asyncio.all_tasks(self):
            task.cancel()
        self.settle()
        self.close()


class ParkHooks:
    """Run a per-thread function just before a waiting thread blocks.

    ``parked(name)`` is an Event set when the thread called ``name`` reaches ``park`` (it
    is then in line: joining the line happens before parking). ``on(name, fn)`` runs
    ``fn(waiter, timeout)`` in that thread before it blocks; ``fn`` may wait on events or
    raise (KeyboardInterrupt) to stand for a signal arriving in the wait.
    """

    def __init__(self, original: Callable[[Any, float | None], bool]) -> None:
        self._original = original
        self._hooks: dict[str, Callable[[Any, float | None], None]] = {}
        self._parked: dict[str, threading.Event] = {}
        self._lock = threading.Lock()

    def parked(self, name: str) -> threading.Event:
        with self._lock:
            return self._parked.setdefault(name, threading.Event())

    def on(self, name: str, fn: Callable[[Any, float | None], None]) -> None:
        self._hooks[name] = fn

    def park(self, waiter: Any, timeout: float | None) -> bool:
        name = threading.current_thread().name
        self.parked(name).set()
        hook = self._hooks.get(name)
        if hook is not None:
            hook(waiter, timeout)
        return self._original(waiter, timeout)


@pytest.fixture
def park_hooks(monkeypatch: pytest.MonkeyPatch) -> ParkHooks:
    hooks = ParkHooks(_ThreadWaiter.park)
    monkeypatch.setattr(_ThreadWaiter, "park", lambda self, timeout: hooks.park(self, timeout))
    return hooks


@pytest.fixture
def fake_clock() -> FakeClock:
    return FakeClock()


def run_thread(name: str, target: Callable[[], object], box: dict[str, Any]) -> threading.Thread:
    """Start ``target`` in a daemon thread called ``name``; its result or the exception it
    raised (BaseException included) lands in ``box[name]``."""

    def body() -> None:
        try:
            box[name] = target()
        except BaseException as exc:  # KeyboardInterrupt included: the tests look at it
            box[name] = exc

    t = threading.Thread(target=body, name=name, daemon=True)
    t.start()
    return t


# =====================================================================================
# Redis fixtures (for tests/test_redis_*.py). Appended as a separate block; the helper
# lives in tests/redis_server.py. A real redis-server, never a mock: if the binary is
# missing, these fixtures FAIL (pytest.fail), they never skip.
# =====================================================================================

import uuid as _uuid  # noqa: E402
from collections.abc import Iterator as _Iterator  # noqa: E402
from pathlib import Path as _Path  # noqa: E402

from redis_server import RedisServer  # noqa: E402


@pytest.fixture(scope="session")
def redis_server(tmp_path_factory: pytest.TempPathFactory) -> _Iterator[RedisServer]:
    """One redis-server for the whole session (127.0.0.1, free port, no persistence)."""
    server = RedisServer(tmp_path_factory.mktemp("redis"))
    server.start()
    yield server
    server.stop()


@pytest.fixture
def own_server(tmp_path: _Path) -> _Iterator[RedisServer]:
    """A redis-server of this test alone: freezing it (SIGSTOP), reconfiguring or
    flushing it disturbs no other test. Thawed before it stops."""
    server = RedisServer(tmp_path)
    server.start()
    yield server
    server.thaw()
    server.stop()


@pytest.fixture
def redis_prefix() -> str:
    """A key prefix of its own for each test, so tests never see each other's keys."""
    return "t" + _uuid.uuid4().hex[:12]


@pytest.fixture
def redis_client(redis_server: RedisServer) -> _Iterator[Any]:
    """A ``redis.Redis`` client of the session server (closed after the test)."""
    import redis

    client = redis.Redis(host=redis_server.host, port=redis_server.port)
    yield client
    client.close()


def spawn_status_watch(url: str, prefix: str) -> subprocess.Popen[bytes]:
    """``python -m lanequeue status --watch --interval 0.1`` for ``url`` and ``prefix``
    as a process whose output is a pipe (no terminal variables inherited), stdin
    closed, stdout and stderr piped."""
    env = {k: v for k, v in os.environ.items()
           if k not in ("COLUMNS", "LINES", "FORCE_COLOR", "TTY_COMPATIBLE")}
    return subprocess.Popen(
        [sys.executable, "-m", "lanequeue", "status", "--backend", url,
         "--prefix", prefix, "--watch", "--interval", "0.1"],
        stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env,
    )
