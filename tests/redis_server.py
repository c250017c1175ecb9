"""A real redis-server for the Redis tests: started on 127.0.0.1 on a free port, without
persistence, in a temporary directory; stoppable and restartable on the same port.

Never a mock: the lanes' guarantees live in Lua scripts and server time, which only a real
server runs. If ``redis-server`` is missing the fixture FAILS (a skipped Redis test would
hide a broken backend), naming the binary it looked for.
"""

from __future__ import annotations

import os
import random
import shutil
import signal
import socket
import subprocess
import time
from pathlib import Path

import pytest

#: Override with the environment variable ``REDIS_SERVER``.
REDIS_SERVER_BIN = os.environ.get("REDIS_SERVER", "redis-server")


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _is_free(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
        return True


def free_cluster_port() -> int:
    """A free port N <= 55535 whose cluster bus port N + 10000 is free too."""
    rng = random.Random()
    for _ in range(1000):
        port = rng.randrange(20000, 55536)
        if _is_free(port) and _is_free(port + 10000):
            return port
    pytest.fail("no free port pair for a Redis Cluster node", pytrace=False)


class RedisServer:
    """One redis-server process. ``start()``, ``stop()``, ``restart()`` (same port)."""

    def __init__(self, workdir: Path, port: int | None = None, *, cluster: bool = False) -> None:
        binary = shutil.which(REDIS_SERVER_BIN) or (
            REDIS_SERVER_BIN if os.path.isfile(REDIS_SERVER_BIN) else None
        )
        if binary is None:
            pytest.fail(
                f"redis-server not found ({REDIS_SERVER_BIN!r} is not on PATH): the Redis "
                "tests need a real server. Install it (apt-get install redis-server) or set "
                "REDIS_SERVER to its path.",
                pytrace=False,
            )
        self.binary = binary
        self.workdir = workdir
        self.port = port or (free_cluster_port() if cluster else free_port())
        self.host = "127.0.0.1"
        self.cluster = cluster
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://{self.host}:{self.port}/0"

    def start(self, timeout: float = 10.0) -> None:
        assert self.proc is None, "already running"
        log = open(self.workdir / f"redis-{self.port}.log", "ab")  # noqa: SIM115
        self.proc = subprocess.Popen(
            [
                self.binary,
                "--port", str(self.port),
                "--bind", self.host,
                "--save", "",
                "--appendonly", "no",
                "--dir", str(self.workdir),
                "--protected-mode", "no",
                "--maxclients", "2000",
                *(
                    ["--cluster-enabled", "yes",
                     "--cluster-config-file", f"nodes-{self.port}.conf"]
                    if self.cluster else []
                ),
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
            cwd=self.workdir,
        )
        log.close()
        deadline = time.monotonic() + timeout
        while True:
            if self.proc.poll() is not None:
                text = (self.workdir / f"redis-{self.port}.log").read_text(errors="replace")
                self.proc = None
                pytest.fail(f"redis-server exited at start:\n{text[-2000:]}", pytrace=False)
            if self.ping():
                if self.cluster:
                    self._own_all_slots(deadline)
                return
            if time.monotonic() > deadline:
                self.stop()
                pytest.fail(f"redis-server did not answer on port {self.port}", pytrace=False)
            time.sleep(0.02)

    def _command(self, *args: str) -> bytes:
        payload = f"*{len(args)}\r\n".encode() + b"".join(
            f"${len(a)}\r\n{a}\r\n".encode() for a in args
        )
        with socket.create_connection((self.host, self.port), timeout=2) as s:
            s.sendall(payload)
            time.sleep(0.01)
            return s.recv(65536)

    def _own_all_slots(self, deadline: float) -> None:
        """A one-node cluster: this node serves all 16384 slots."""
        self._command("CLUSTER", "ADDSLOTSRANGE", "0", "16383")
        while b"cluster_state:ok" not in self._command("CLUSTER", "INFO"):
            if time.monotonic() > deadline:
                pytest.fail("the one-node Redis Cluster did not reach state ok", pytrace=False)
            time.sleep(0.05)

    def ping(self) -> bool:
        try:
            with socket.create_connection((self.host, self.port), timeout=0.5) as s:
                s.sendall(b"PING\r\n")
                return s.recv(16).startswith(b"+PONG")
        except OSError:
            return False

    def stop(self) -> None:
        proc, self.proc = self.proc, None
        if proc is None:
            return
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=10)

    def restart(self) -> None:
        self.stop()
        self.start()

    def freeze(self) -> None:
        """Stop the server process (SIGSTOP): connections stay open, nothing answers."""
        assert self.proc is not None
        self.proc.send_signal(signal.SIGSTOP)

    def thaw(self) -> None:
        """Resume a frozen server (SIGCONT); harmless on one that runs."""
        if self.proc is not None:
            self.proc.send_signal(signal.SIGCONT)
