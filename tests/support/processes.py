"""Real processes for tests: a private redis-server and the broadcaster server.

Both start on free ports and are waited for by a readiness signal (a PING answer, the
server's "listening" line followed by ``GET /up``), never by a sleep.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import httpx
import pytest

IN_CI = os.environ.get("CI", "").lower() in ("1", "true", "yes")
REPO = Path(__file__).resolve().parents[2]


def require_binary(name: str) -> str:
    """Path of ``name``; skips the test when it is missing, fails instead under CI."""
    # Debian puts daemons (nginx) in /usr/sbin, which a user's PATH may lack.
    path = shutil.which(name) or shutil.which(name, path="/usr/sbin:/sbin")
    if path is None:
        message = f"{name} is not installed (scripts/install --test installs it)"
        if IN_CI:
            pytest.fail(message)
        pytest.skip(message)
    return path


def require_bench_packages() -> None:
    """What the bench's runs need (Node, redis-server, bench/node's npm packages); skips
    the test when something is missing, fails instead under CI."""
    require_binary("node")
    require_binary("redis-server")
    if not (REPO / "bench" / "node" / "node_modules").is_dir():
        message = "bench/node/node_modules is missing (scripts/install --test installs it)"
        if IN_CI:
            pytest.fail(message)
        pytest.skip(message)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def _wait(predicate: object, timeout: float, what: str) -> None:
    assert callable(predicate)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.02)
    raise TimeoutError(f"timed out after {timeout}s waiting for {what}")


class RedisServer:
    """A private ``redis-server`` that keeps nothing on disk and can be killed and
    restarted on the same port."""

    def __init__(self, port: int | None = None) -> None:
        self.binary = require_binary("redis-server")
        self.port = port or free_port()
        self.dir = tempfile.mkdtemp(prefix="redis-test-")
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> RedisServer:
        args = [self.binary, "--port", str(self.port), "--bind", "127.0.0.1", "--save", ""]
        args += ["--appendonly", "no", "--dir", self.dir, "--logfile", ""]
        self.proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        _wait(self._answers, 10, f"redis-server on port {self.port}")
        return self

    def _answers(self) -> bool:
        assert self.proc is not None
        if self.proc.poll() is not None:
            raise RuntimeError(f"redis-server exited with {self.proc.returncode}")
        return self.ping()

    def ping(self) -> bool:
        """True when a PING on a fresh connection answers PONG."""
        try:
            with socket.create_connection(("127.0.0.1", self.port), timeout=0.5) as sock:
                sock.sendall(b"PING\r\n")
                return sock.recv(16).startswith(b"+PONG")
        except OSError:
            return False

    def kill(self) -> None:
        """SIGKILL, as a crash would."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(10)

    def restart(self) -> None:
        self.kill()
        self.start()

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        shutil.rmtree(self.dir, ignore_errors=True)


_LISTENING = re.compile(r"listening on (http://\S+?)/?$")


SERVE = (sys.executable, "-m", "broadcaster", "serve", "--port", "0")
"""This checkout's server on a free port."""


class ServerProcess:
    """``python -m broadcaster serve`` in a child process on a free port, or another
    ``command`` that prints the same "listening on" line (such as ``./scripts/demo``,
    given its port by ``BROADCASTER_PORT=0``), run in ``cwd``.

    ``REDIS_URL`` is not passed on from this process unless ``env`` names it: ``serve``
    takes it as its backend, and a developer's shell may hold one."""

    def __init__(
        self,
        args: Sequence[str] = (),
        env: dict[str, str] | None = None,
        *,
        command: Sequence[str] = SERVE,
        cwd: Path = REPO,
    ) -> None:
        self.command = [*command]
        self.args = [*args]
        self.cwd = cwd
        inherited = {k: v for k, v in os.environ.items() if k != "REDIS_URL"}
        self.env = {**inherited, "PYTHONUNBUFFERED": "1", **(env or {})}
        self.proc: subprocess.Popen[str] | None = None
        self.output: list[str] = []
        self.url = ""
        self._listening = threading.Event()
        self._drainer: threading.Thread | None = None

    def start(self, timeout: float = 20) -> ServerProcess:
        self.proc = subprocess.Popen(
            [*self.command, *self.args],
            cwd=self.cwd,
            env=self.env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        self._drainer = threading.Thread(target=self._drain, daemon=True)
        self._drainer.start()
        exited = self.proc.poll
        _wait(lambda: self._listening.is_set() or exited() is not None, timeout, "the server")
        if not self._listening.is_set():
            self.stop()
            raise RuntimeError(f"server exited with {self.proc.returncode}:\n{self.log}")
        try:
            _wait(self._up, timeout, f"GET {self.url}/up")
        except BaseException:
            self.stop()
            raise
        return self

    def _drain(self) -> None:
        assert self.proc is not None
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.output.append(line)
            match = _LISTENING.search(line.strip())
            if match and not self.url:
                self.url = match.group(1)
                self._listening.set()

    def _up(self) -> bool:
        assert self.proc is not None
        if self.proc.poll() is not None:
            raise RuntimeError(f"server exited with {self.proc.returncode}:\n{self.log}")
        try:
            return httpx.get(f"{self.url}/up", timeout=1).status_code == 200
        except httpx.HTTPError:
            return False

    @property
    def log(self) -> str:
        return "".join(self.output)

    @property
    def ws_url(self) -> str:
        return self.url.replace("http://", "ws://", 1)

    def wait_ready(self, timeout: float = 20) -> None:
        def ready() -> bool:
            try:
                return httpx.get(f"{self.url}/ready", timeout=1).status_code == 200
            except httpx.HTTPError:
                return False

        _wait(ready, timeout, f"GET {self.url}/ready")

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(10)
        self._close()

    def _close(self) -> None:
        if self._drainer is not None:
            self._drainer.join(10)
        if self.proc is not None and self.proc.stdout is not None:
            self.proc.stdout.close()

    def stop(self, timeout: float = 15) -> int | None:
        if self.proc is None:
            return None
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        self._close()
        return self.proc.returncode


ServerFactory = Callable[..., ServerProcess]
"""Starts a ``python -m broadcaster serve`` process (the ``server_factory`` fixture)."""
