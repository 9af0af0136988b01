"""The quick tier (``scripts/test --quick``, ``pytest --quick``): the I/O-free unit tests,
for the edit loop; CI runs everything.

A quick test is a unit test (``tests/broadcaster``, ``tests/agent_core``, ``tests/bench``
or a file directly under ``tests/``) without a marker that says it needs the outside
(``io``, ``redis``, ``node``, ``browser``, ``slow``, ``multi_node``). During a quick run,
opening a network connection, binding a socket or starting a process raises
:class:`IOInQuickRun`: a test that does is marked ``io`` or moved to ``tests/e2e``, it
cannot slip into the tier unnoticed.
"""

from __future__ import annotations

import os
import socket
import subprocess
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

TESTS = Path(__file__).resolve().parent.parent

UNIT_TREES = frozenset({"broadcaster", "agent_core", "bench"})
"""The folders under ``tests/`` that mirror a package (their tests may be quick)."""

IO_MARKERS = frozenset({"io", "redis", "node", "browser", "slow", "multi_node"})
"""Markers that keep a test out of the quick tier."""


class IOInQuickRun(RuntimeError):
    """A test of the quick tier tried to open a socket or start a process."""


def is_quick(item: pytest.Item) -> bool:
    """Whether ``item`` belongs to the quick tier (by where it lives and its markers)."""
    try:
        parts = Path(str(item.path)).resolve().relative_to(TESTS).parts
    except ValueError:
        return False
    in_tree = len(parts) == 1 or parts[0] in UNIT_TREES
    return in_tree and not any(item.get_closest_marker(name) for name in IO_MARKERS)


def outside_the_tier(path: Path) -> bool:
    """Whether ``path`` is a folder under ``tests/`` that holds no quick test (a quick
    run does not even import it)."""
    try:
        parts = path.resolve().relative_to(TESTS).parts
    except ValueError:
        return False
    return len(parts) == 1 and path.is_dir() and parts[0] not in UNIT_TREES


def select(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Keep only the quick tier in ``items`` (the others are reported as deselected)."""
    kept = [item for item in items if is_quick(item)]
    dropped = [item for item in items if not is_quick(item)]
    if dropped:
        config.hook.pytest_deselected(items=dropped)
    items[:] = kept


def _refuse(what: str) -> Callable[..., Any]:
    def refuse(*args: Any, **kwargs: Any) -> Any:
        raise IOInQuickRun(
            f"a --quick test tried to {what}: quick tests are I/O-free; mark the test "
            "@pytest.mark.io (or move it to tests/e2e) if it needs a server or a process"
        )

    return refuse


@contextmanager
def no_io() -> Iterator[None]:
    """Within: connecting or binding any socket, or starting a process, raises
    :class:`IOInQuickRun` (socket pairs, as asyncio's event loop makes, still work)."""
    patched: list[tuple[Any, str, Any]] = [
        (socket.socket, "connect", _refuse("connect a socket")),
        (socket.socket, "connect_ex", _refuse("connect a socket")),
        (socket.socket, "bind", _refuse("bind a socket (start a server)")),
        (subprocess.Popen, "_execute_child", _refuse("start a process")),
        (os, "fork", _refuse("fork a process")),
    ]
    saved = [(owner, name, getattr(owner, name)) for owner, name, _ in patched]
    try:
        for owner, name, replacement in patched:
            setattr(owner, name, replacement)
        yield
    finally:
        for owner, name, original in saved:
            setattr(owner, name, original)
