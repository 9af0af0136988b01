"""The optional extras (``pyproject.toml``), and a Python process without some of them.

The test environment has every extra installed (``scripts/test``). To run the server as
it runs with only the runtime and one extra, without a virtual environment per extra,
:func:`without` names the modules that the other extras alone bring in (every
distribution that their requirements reach and the runtime's plus the kept extra's do
not, found from the installed metadata), and ``python -m tests.support.extras ARGS``
runs ``python -m broadcaster ARGS`` behind an import hook that refuses those modules
(``ModuleNotFoundError``, as an absent package would; stricter than absence for a
``find_spec`` of a submodule, which then raises instead of answering None).

The runtime-only install itself is real in tests/e2e/install/test_fresh_clone.py.

This module's top level uses the standard library only: it runs before anything is
imported, and refuses to start when a refused module is imported already.
"""

from __future__ import annotations

import functools
import importlib.abc
import importlib.machinery
import importlib.metadata
import os
import runpy
import sys
from collections.abc import Iterable, Sequence
from types import ModuleType

__all__ = ["BLOCKED_ENV", "FEATURE_EXTRAS", "PROJECT", "requirements_of", "without"]

PROJECT = "agent-broadcaster"
BLOCKED_ENV = "TESTS_BLOCKED_MODULES"
"""Comma-separated modules the child refuses (a module refused refuses its submodules)."""
AGGREGATES = frozenset({"dev", "all-frameworks"})
"""Extras that only gather others (and test tools): not a feature of their own."""


def _extras() -> tuple[str, ...]:
    provided = importlib.metadata.distribution(PROJECT).metadata.get_all("Provides-Extra")
    return tuple(sorted(set(provided or ()) - AGGREGATES))


FEATURE_EXTRAS = _extras()
"""The extras that each serve a feature (a framework adapter, OpenTelemetry)."""


def requirements_of(extra: str | None) -> set[str]:
    """The requirement lines of the project that ``extra`` adds (None: the runtime's)."""
    from packaging.requirements import Requirement

    found = set()
    for line in importlib.metadata.distribution(PROJECT).requires or ():
        marker = Requirement(line).marker
        if marker is None:
            if extra is None:
                found.add(line)
        elif extra is not None and marker.evaluate({"extra": extra}):
            found.add(line)
    return found


def _closure(requirements: Iterable[str]) -> set[str]:
    """The installed distributions (canonical names) that ``requirements`` reach."""
    from packaging.requirements import Requirement
    from packaging.utils import canonicalize_name

    todo = [Requirement(line) for line in requirements]
    seen: set[tuple[str, str]] = set()
    names: set[str] = set()
    while todo:
        requirement = todo.pop()
        name = canonicalize_name(requirement.name)
        extras = {"", *requirement.extras}
        if all((name, extra) in seen for extra in extras):
            continue
        seen |= {(name, extra) for extra in extras}
        try:
            dist = importlib.metadata.distribution(name)
        except importlib.metadata.PackageNotFoundError:
            continue  # not for this platform or Python: nothing to import either
        names.add(name)
        for line in dist.requires or ():
            nested = Requirement(line)
            marker = nested.marker
            if marker is None or any(marker.evaluate({"extra": e}) for e in extras):
                todo.append(nested)
    return names


def _owners() -> dict[str, set[str]]:
    """Module name (and every package above it) -> the distributions with files there."""
    from packaging.utils import canonicalize_name

    owners: dict[str, set[str]] = {}
    for dist in importlib.metadata.distributions():
        name = canonicalize_name(dist.metadata["Name"])
        for path in dist.files or ():
            parts = path.parts
            if not parts or ".." in parts or parts[0].endswith((".dist-info", ".data")):
                continue
            if len(parts) == 1 and not parts[0].endswith((".py", ".so", ".pyd")):
                continue  # a .pth file, a licence
            *packages, leaf = parts
            if leaf.endswith((".py", ".so", ".pyd")) and leaf.split(".")[0] != "__init__":
                packages.append(leaf.split(".")[0])
            for depth in range(1, len(packages) + 1):
                owners.setdefault(".".join(packages[:depth]), set()).add(name)
    return owners


@functools.cache
def without(kept: tuple[str, ...] = ()) -> frozenset[str]:
    """The modules to refuse so that, of the feature extras, only ``kept`` is there:
    the outermost ones whose every distribution comes with another extra only."""
    unknown = set(kept) - set(FEATURE_EXTRAS)
    assert not unknown, f"no such extra: {unknown}"
    features = _closure(line for extra in FEATURE_EXTRAS for line in requirements_of(extra))
    wanted = [*requirements_of(None), *(line for e in kept for line in requirements_of(e))]
    gone = features - _closure(wanted)
    owners = _owners()
    refused = {module for module, dists in owners.items() if dists <= gone}
    return frozenset(m for m in refused if not _refused(m.rpartition(".")[0], refused))


def _refused(module: str, refused: frozenset[str] | set[str]) -> bool:
    parts = module.split(".")
    return any(".".join(parts[:depth]) in refused for depth in range(1, len(parts) + 1))


class _Refuser(importlib.abc.MetaPathFinder):
    def __init__(self, refused: frozenset[str]) -> None:
        self.refused = refused

    def find_spec(
        self,
        fullname: str,
        path: Sequence[str] | None,
        target: ModuleType | None = None,
    ) -> importlib.machinery.ModuleSpec | None:
        if _refused(fullname, self.refused):
            raise ModuleNotFoundError(f"No module named {fullname!r}", name=fullname)
        return None


def main(argv: Sequence[str]) -> None:
    """``python -m broadcaster ARGV`` (or ``python -c CODE`` for ``-c CODE``) without the
    modules named in :data:`BLOCKED_ENV`."""
    refused = frozenset(filter(None, os.environ.get(BLOCKED_ENV, "").split(",")))
    early = sorted(m for m in sys.modules if _refused(m, refused))
    if early:
        sys.exit(f"tests.support.extras: already imported, cannot refuse: {early}")
    sys.meta_path.insert(0, _Refuser(refused))
    if argv[:1] == ["-c"]:
        exec(compile(argv[1], "<string>", "exec"), {"__name__": "__main__"})
        return
    sys.argv = ["python -m broadcaster", *argv]
    runpy.run_module("broadcaster", run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    main(sys.argv[1:])
