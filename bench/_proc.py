"""Child processes of the bench, and what /proc says about them.

CPU time is ``utime + stime`` of one process (``/proc/<pid>/stat``), RSS is ``VmRSS``
(``/proc/<pid>/status``): the server's own figures, nothing of its clients.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import resource
import signal
import socket
from collections import deque
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

__all__ = [
    "REPO",
    "Child",
    "ChildFailed",
    "cpu_seconds",
    "free_port",
    "machine_busy_seconds",
    "machine_cpu_seconds",
    "open_file_limit",
    "raise_fd_limit",
    "rss_bytes",
]

REPO = Path(__file__).resolve().parent.parent
_TICKS = os.sysconf("SC_CLK_TCK")


class ChildFailed(RuntimeError):
    """A child process exited, said it failed, or did not answer in time."""


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds used so far by process ``pid`` (not its children)."""
    stat = Path(f"/proc/{pid}/stat").read_text()
    fields = stat[stat.rindex(")") + 2 :].split()
    return (int(fields[11]) + int(fields[12])) / _TICKS


def machine_busy_seconds() -> float:
    """CPU seconds spent busy (not idle or waiting for I/O) by all CPUs since boot."""
    return sum(machine_cpu_seconds().values())


def machine_cpu_seconds() -> dict[str, float]:
    """CPU seconds of all CPUs since boot: ``tasks`` (user and system time of processes),
    ``irq`` (interrupts and softirqs, e.g. loopback TCP, charged to no process) and
    ``steal`` (taken by the hypervisor)."""
    v = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    return {
        "tasks": (v[0] + v[1] + v[2]) / _TICKS,
        "irq": (v[5] + v[6]) / _TICKS,
        "steal": v[7] / _TICKS,
    }


def rss_bytes(pid: int) -> int:
    """Resident set size of process ``pid`` in bytes."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise ChildFailed(f"no VmRSS in /proc/{pid}/status (process gone?)")


def open_file_limit(pid: int) -> int:
    """The soft open-file limit of process ``pid`` (``Max open files`` in /proc)."""
    for line in Path(f"/proc/{pid}/limits").read_text().splitlines():
        if line.startswith("Max open files"):
            soft = line.split()[3]
            return 1 << 30 if soft == "unlimited" else int(soft)
    raise ChildFailed(f"no 'Max open files' in /proc/{pid}/limits")


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def raise_fd_limit(wanted: int) -> int:
    """Raise this process's open-file limit (inherited by children) towards ``wanted``.

    Returns:
        The soft limit now in force.
    """
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = wanted if hard == resource.RLIM_INFINITY else min(wanted, hard)
    if soft < target:
        resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
        soft = target
    return soft


class Child:
    """A child process whose stdout is read line by line.

    JSON lines (``{...}``) are messages: ``progress`` messages only update
    :attr:`received`; others are queued for :meth:`expect`. Other lines are kept in a
    short log for error messages. stderr is merged into the log.
    """

    def __init__(
        self,
        name: str,
        argv: Sequence[str],
        env: dict[str, str] | None = None,
        cwd: Path = REPO,
    ) -> None:
        self.name = name
        self.argv = list(argv)
        self.env = {**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})}
        self.cwd = cwd
        self.proc: asyncio.subprocess.Process | None = None
        self.log: deque[str] = deque(maxlen=40)
        self.messages: asyncio.Queue[dict[str, Any]] = asyncio.Queue()
        self.lines: asyncio.Queue[str] = asyncio.Queue()
        self.received = 0
        self.progressed = asyncio.Event()
        self._readers: list[asyncio.Task[None]] = []

    @property
    def pid(self) -> int:
        assert self.proc is not None, f"{self.name} was not started"
        return self.proc.pid

    async def start(self) -> Child:
        self.proc = await asyncio.create_subprocess_exec(
            *self.argv,
            cwd=self.cwd,
            env=self.env,
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
            limit=1 << 24,
        )
        assert self.proc.stdout is not None
        assert self.proc.stderr is not None
        self._readers = [
            asyncio.create_task(self._read(self.proc.stdout, parse=True)),
            asyncio.create_task(self._read(self.proc.stderr, parse=False)),
        ]
        return self

    async def _read(self, stream: asyncio.StreamReader, parse: bool) -> None:
        while line := await stream.readline():
            text = line.decode(errors="replace").rstrip("\n")
            if parse and text.startswith("{"):
                msg = json.loads(text)
                if msg.get("type") == "progress":
                    self.received = int(msg["received"])
                    self.progressed.set()
                    continue
                self.messages.put_nowait(msg)
                if msg.get("type") == "fatal":
                    self.log.append(str(msg.get("error")))
                continue
            self.log.append(text)
            self.lines.put_nowait(text)

    def send(self, obj: dict[str, Any]) -> None:
        """Write one JSON command line to the child's stdin."""
        assert self.proc is not None
        assert self.proc.stdin is not None
        self.proc.stdin.write((json.dumps(obj) + "\n").encode())

    def failure(self, what: str) -> ChildFailed:
        tail = "\n".join(self.log) or "(no output)"
        return ChildFailed(f"{self.name}: {what}; its last output:\n{tail}")

    async def expect(self, kind: str, within: float) -> dict[str, Any]:
        """The next message of type ``kind`` (earlier ones of other types are dropped).

        Raises:
            ChildFailed: on a ``fatal`` message, an exit, or ``within`` seconds of silence.
        """
        assert self.proc is not None
        loop = asyncio.get_running_loop()
        deadline = loop.time() + within
        while True:
            remaining = deadline - loop.time()
            if remaining <= 0:
                raise self.failure(f"no {kind!r} message within {within}s")
            getter = asyncio.ensure_future(self.messages.get())
            exited = asyncio.ensure_future(self.proc.wait())
            done, _ = await asyncio.wait(
                {getter, exited}, timeout=remaining, return_when=asyncio.FIRST_COMPLETED
            )
            exited.cancel()
            if getter not in done:
                getter.cancel()
                if exited in done:
                    await asyncio.gather(*self._readers, return_exceptions=True)
                    raise self.failure(f"exited with {self.proc.returncode}")
                continue
            msg = getter.result()
            if msg.get("type") == "fatal":
                raise self.failure("failed")
            if msg.get("type") == kind:
                return msg

    async def expect_line(self, match: Callable[[str], bool], within: float) -> str:
        """The first plain output line for which ``match`` is true."""
        assert self.proc is not None
        try:
            async with asyncio.timeout(within):
                while True:
                    getter = asyncio.ensure_future(self.lines.get())
                    exited = asyncio.ensure_future(self.proc.wait())
                    done, _ = await asyncio.wait(
                        {getter, exited}, return_when=asyncio.FIRST_COMPLETED
                    )
                    exited.cancel()
                    if getter not in done:
                        getter.cancel()
                        await asyncio.gather(*self._readers, return_exceptions=True)
                        raise self.failure(f"exited with {self.proc.returncode}")
                    line = getter.result()
                    if match(line):
                        return line
        except TimeoutError:
            raise self.failure(f"not ready within {within}s") from None

    async def stop(self, grace: float = 10, sig: int = signal.SIGTERM) -> None:
        """``sig``, then SIGKILL after ``grace`` seconds; idempotent."""
        if self.proc is None:
            return
        if self.proc.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                self.proc.send_signal(sig)
            try:
                await asyncio.wait_for(self.proc.wait(), grace)
            except TimeoutError:
                with contextlib.suppress(ProcessLookupError):
                    self.proc.kill()
                await self.proc.wait()
        if self.proc.stdin is not None:
            self.proc.stdin.close()
        await asyncio.gather(*self._readers, return_exceptions=True)
