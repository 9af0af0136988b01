"""Node clients as child processes: the scripts in ``tests/node`` (pusher-js, the
AG-UI client, the ``ai`` package's reader), each run with ``node`` from that folder.

:class:`NodeLines` is a long-lived script whose JSON lines arrive in a queue (pusher-js
following channels); :func:`run_node_script` runs a script to its end and returns its
last JSON line. A missing ``node`` or npm package skips the test (fails it in CI).
"""

from __future__ import annotations

import asyncio
import json
import os
import queue
import subprocess
import threading
import time
from collections.abc import Callable
from typing import Any
from urllib.parse import urlsplit

import pytest

from tests.support.live import KEY, SECRET
from tests.support.processes import IN_CI, REPO, ServerProcess, require_binary

NODE_DIR = REPO / "tests" / "node"
"""The npm project of the Node test clients (installed by ``scripts/install --test``)."""

Record = dict[str, Any]


def node_with(package: str, what: str | None = None) -> str:
    """The ``node`` binary, once ``package`` is installed in :data:`NODE_DIR` (else the
    test is skipped, or failed in CI)."""
    node = require_binary("node")
    if not (NODE_DIR / "node_modules" / package).is_dir():
        message = f"{what or package} is not installed: run scripts/install --test"
        if IN_CI:
            pytest.fail(message)
        pytest.skip(message)
    return node


class NodeLines:
    """``tests/node/<script>`` as a child process, its JSON lines in a queue (other
    output as ``{"type": "output", "text": line}``); stopped by closing its stdin."""

    def __init__(
        self, script: str, args: list[str], *, package: str, env: dict[str, str] | None = None
    ) -> None:
        node = node_with(package)
        self.script = script
        self.proc = subprocess.Popen(
            [node, script, *args],
            cwd=NODE_DIR,
            env={**os.environ, **(env or {})},
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        self.lines: queue.Queue[Record] = queue.Queue()
        self.seen: list[Record] = []
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            try:
                self.lines.put(json.loads(line))
            except ValueError:
                self.lines.put({"type": "output", "text": line})

    def _timeout(self, what: str) -> TimeoutError:
        return TimeoutError(f"pusher-js never reported {what}; it said: {self.seen}")

    def wait_for(self, match: Callable[[Record], bool], what: str, within: float = 20) -> Record:
        """The first record ``match`` accepts (blocking: for sync tests)."""
        deadline = time.monotonic() + within
        while time.monotonic() < deadline:
            try:
                record = self.lines.get(timeout=0.1)
            except queue.Empty:
                continue
            self.seen.append(record)
            if match(record):
                return record
        raise self._timeout(what)

    async def until(self, match: Callable[[Record], bool], what: str, within: float = 20) -> Record:
        """The first record ``match`` accepts, without blocking the event loop."""
        deadline = time.monotonic() + within
        while time.monotonic() < deadline:
            try:
                record = self.lines.get_nowait()
            except queue.Empty:
                await asyncio.sleep(0.02)
                continue
            self.seen.append(record)
            if match(record):
                return record
        raise self._timeout(what)

    def stop(self) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.close()
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(10)
        self.reader.join(10)
        assert self.proc.stdout is not None
        self.proc.stdout.close()


class NodeClient(NodeLines):
    """``tests/node/pusher_client.mjs``: pusher-js subscribed to ``channels``."""

    def __init__(
        self,
        server: ServerProcess,
        channels: tuple[str, ...],
        *,
        url: str | None = None,
        env: dict[str, str] | None = None,
    ) -> None:
        """Connects to ``server``, or to ``url`` (``https://``: over wss), with ``env``
        added to the environment."""
        target = urlsplit(url or server.url)
        args = [str(target.hostname), str(target.port), KEY, SECRET, *channels]
        tls = {"PUSHER_TLS": "1"} if target.scheme == "https" else {}
        super().__init__("pusher_client.mjs", args, package="pusher-js", env={**tls, **(env or {})})


async def run_node_script(
    script: str, *args: str, package: str, what: str | None = None, within: float = 30
) -> tuple[Record, str]:
    """Run ``tests/node/<script>`` to its end (within ``within`` seconds): its last output
    line, as JSON, and what it wrote to stderr."""
    node = node_with(package, what)
    proc = await asyncio.create_subprocess_exec(
        node,
        script,
        *args,
        cwd=NODE_DIR,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    try:
        out, err = await asyncio.wait_for(proc.communicate(), within)
    finally:
        if proc.returncode is None:  # timed out: not left running
            proc.kill()
            await proc.wait()
    assert out, f"no output from {script} (exit {proc.returncode}): {err.decode()}"
    result: Record = json.loads(out.decode().strip().splitlines()[-1])
    return result, err.decode()
