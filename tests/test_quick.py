"""The quick tier's guard (tests/support/quick.py): inside it a test cannot open a
connection, start a server or a process, and an event loop still works."""

from __future__ import annotations

import asyncio
import socket
import subprocess
import sys

import pytest

from tests.support.quick import IOInQuickRun, no_io


def test_a_socket_cannot_connect_or_bind() -> None:
    with no_io():
        with socket.socket() as sock, pytest.raises(IOInQuickRun, match="mark the test"):
            sock.connect(("127.0.0.1", 9))
        with socket.socket() as sock, pytest.raises(IOInQuickRun, match="bind a socket"):
            sock.bind(("127.0.0.1", 0))


def test_a_process_cannot_start() -> None:
    with no_io(), pytest.raises(IOInQuickRun, match="start a process"):
        subprocess.run([sys.executable, "-c", "pass"], check=True)


def test_an_event_loop_still_runs_and_the_guard_is_undone() -> None:
    before = (socket.socket.connect, socket.socket.bind, subprocess.Popen._execute_child)  # type: ignore[attr-defined]
    with no_io():
        assert asyncio.run(asyncio.sleep(0, "ran")) == "ran"
    after = (socket.socket.connect, socket.socket.bind, subprocess.Popen._execute_child)  # type: ignore[attr-defined]
    assert after == before
