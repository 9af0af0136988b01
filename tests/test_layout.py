"""Tests mirror the code (docs/development.md, "Where tests live"): a unit-test file
``tests/<package>/<path>/test_<module>[_<aspect>].py`` tests ``<package>/<path>/<module>``,
so the module must exist (a private ``_module`` is tested as ``test_module``).
Cross-cutting suites live in ``tests/e2e/`` and ``tests/reliability/``, helpers in
``tests/support/``."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
TESTS = ROOT / "tests"

MIRRORED = ("broadcaster", "agent_core", "bench")
"""The packages whose unit tests mirror them under ``tests/<package>/``."""

HOMES = frozenset({*MIRRORED, "e2e", "reliability", "support", "fixtures", "node", "backends"})
"""Every folder allowed directly under ``tests/`` (``backends`` moves with the Redis
backend's package)."""


def modules_in(folder: Path) -> set[str]:
    """The names a test file in the mirror of ``folder`` may start with: its modules and
    subpackages, a leading underscore dropped."""
    names = {p.stem for p in folder.glob("*.py") if p.stem != "__init__"}
    names |= {p.name for p in folder.iterdir() if (p / "__init__.py").is_file()}
    return {name.lstrip("_") for name in names} | names


def layout_problem(test_file: Path, code: Path) -> str | None:
    """Why ``test_file`` (under ``tests/<package>/``) does not mirror ``code`` (the
    package's folder), or None when it does."""
    relative = test_file.relative_to(TESTS / code.name)
    folder = code.joinpath(*relative.parts[:-1])
    if not (folder / "__init__.py").is_file():
        return f"{test_file.relative_to(ROOT)}: no package {folder.relative_to(ROOT)}"
    name = test_file.stem.removeprefix("test_")
    if any(name == m or name.startswith(m + "_") for m in modules_in(folder)):
        return None
    return f"{test_file.relative_to(ROOT)}: no module {name!r} in {folder.relative_to(ROOT)}"


def mismatches(package: str) -> list[str]:
    code = ROOT / package
    found = []
    for test_file in sorted((TESTS / package).rglob("test_*.py")):
        problem = layout_problem(test_file, code)
        if problem:
            found.append(problem)
    return found


@pytest.mark.parametrize("package", MIRRORED)
def test_every_unit_test_file_names_a_module_that_exists(package: str) -> None:
    assert mismatches(package) == []


def test_test_modules_import_no_other_test_module() -> None:
    """Helpers live in tests/support: a test module imported by another drags its
    tests and fixtures along and hides the helper from the next reader."""
    found = []
    for path in sorted(TESTS.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            names = []
            if isinstance(node, ast.ImportFrom) and node.module:
                names = [node.module]
            elif isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            found += [
                f"{path.relative_to(ROOT)} -> {name}"
                for name in names
                if name.startswith("tests.") and name.rsplit(".", 1)[-1].startswith("test_")
            ]
    assert found == []


def test_tests_has_only_the_known_homes() -> None:
    folders = {p.name for p in TESTS.iterdir() if p.is_dir() and not p.name.startswith((".", "_"))}
    assert folders <= HOMES, f"a test folder outside the layout: {sorted(folders - HOMES)}"


def test_the_check_tells_a_missing_module() -> None:
    """The checker itself: a test file whose module was renamed or never existed is
    reported, one whose name only starts like a module is not mistaken for it."""
    code = TESTS.parent / "broadcaster"
    assert layout_problem(TESTS / "broadcaster" / "test_hub.py", code) is None
    assert layout_problem(TESTS / "broadcaster" / "test_hub_fanout.py", code) is None
    assert layout_problem(TESTS / "broadcaster" / "test_guard.py", code) is None  # _guard
    assert layout_problem(TESTS / "broadcaster" / "test_hubs.py", code) is not None
    assert layout_problem(TESTS / "broadcaster" / "test_nowhere.py", code) is not None
    assert layout_problem(TESTS / "broadcaster" / "no" / "test_hub.py", code) is not None
