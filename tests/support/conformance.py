"""The conformance matrix, run kinds by surfaces (tests/e2e/conformance/): the runs of
one backend with what each surface showed of them, the check of one cell, and the
table of the matrix in docs/protocol.md (``python -m tests.e2e.conformance.table``
writes it; a test fails when it is stale)."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.facts import FACTS, RunFacts, differences
from tests.support.matrix import BACKENDS, KINDS, Kind, ProducedRun, kind_named
from tests.support.processes import REPO
from tests.support.surfaces import SURFACES, Reading, Surface, surface_named

__all__ = [
    "BEGIN",
    "DOC",
    "END",
    "Matrix",
    "cells",
    "check_cell",
    "check_kind",
    "render_table",
    "write_table",
]

DOC = REPO / "docs" / "protocol.md"
BEGIN = "<!-- conformance matrix: written by `python -m tests.e2e.conformance.table` -->"
END = "<!-- end of the conformance matrix -->"


class Matrix:
    """The runs of one backend (:func:`tests.support.matrix.produce`), and what each
    surface showed of them, read once per surface (on first use) for all of them."""

    def __init__(self, backend: str, runs: dict[str, ProducedRun]) -> None:
        self.backend = backend
        self.runs = runs
        self._readings: dict[str, Reading] = {}

    def facts(self, surface: Surface, kind: str) -> RunFacts:
        """What ``surface`` showed of ``kind``'s run (raises what reading it raised)."""
        if surface.name not in self._readings:
            runs = [run for run in self.runs.values() if surface.not_for(run.kind) is None]
            self._readings[surface.name] = asyncio.run(surface.read(runs))
        found = self._readings[surface.name][self.runs[kind].execution_id]
        if isinstance(found, BaseException):
            raise found
        return found


def cells(backend: str) -> Iterator[object]:
    """The cells of ``backend``'s matrix: a ``pytest.param(kind, surface)`` each."""
    for kind in KINDS:
        if backend not in kind.backends:
            continue
        for surface in SURFACES:
            if surface.not_for(kind) is None:
                yield pytest.param(kind.name, surface.name, id=f"{kind.name}-{surface.name}")


def check_kind(matrix: Matrix, kind_name: str) -> None:
    """The row is what it claims: its run's expected facts (from the channel)."""
    kind = kind_named(kind_name)
    expected = matrix.runs[kind_name].expected
    for name, wanted in kind.expect.items():
        got = len(expected.nested or ()) if name == "nested" else getattr(expected, name)
        assert got == wanted, f"{kind_name}: {name} is {got!r}, the kind says {wanted!r}"
    assert expected.end is not None, f"{kind_name}: no final status on the channel"


def check_cell(matrix: Matrix, kind_name: str, surface_name: str) -> None:
    """``surface`` shows ``kind``'s run as the channel carried it: each fact it carries."""
    surface = surface_named(surface_name)
    expected = matrix.runs[kind_name].expected
    actual = matrix.facts(surface, kind_name)
    found = differences(expected, actual, surface.facts_for(expected.status), surface.clip)
    assert not found, (
        f"{surface.title} disagrees about the run of kind {kind_name!r} "
        f"({matrix.backend}):\n  " + "\n  ".join(found)
    )


# -- the table in docs/protocol.md -----------------------------------------------------------


def _cell(kind: Kind, surface: Surface, notes: list[str]) -> str:
    why = surface.not_for(kind)
    if why is not None:
        if why not in notes:
            notes.append(why)
        return f"n/a ({notes.index(why) + 1})"
    return " + ".join(b for b in BACKENDS if b in kind.backends)


def render_table() -> str:
    """The matrix as Markdown: kinds by surfaces (the backends each cell runs on), then
    the facts each surface carries."""
    notes: list[str] = []
    head = "| kind | " + " | ".join(s.title for s in SURFACES) + " |"
    rule = "|---" * (len(SURFACES) + 1) + "|"
    rows = [
        f"| {k.title} | " + " | ".join(_cell(k, s, notes) for s in SURFACES) + " |" for k in KINDS
    ]
    facts = "| surface | " + " | ".join(f"`{name}`" for name in FACTS) + " |"
    facts_rule = "|---" * (len(FACTS) + 1) + "|"
    carried = []
    for surface in SURFACES:
        marks = []
        for name in FACTS:
            mark = "✓" if name in surface.carries else ""
            if name in surface.clip:
                mark = f"first {surface.clip[name][0]:,} chars"
            if name in surface.when_failed:
                mark += " (not when failed)"
            marks.append(mark)
        carried.append(f"| {surface.title} | " + " | ".join(marks) + " |")
    legend = "Each cell names the backends its run is produced and checked on."
    lines = [BEGIN, "", legend, "", head, rule, *rows, ""]
    lines += [f"({n}) {note}." for n, note in enumerate(notes, 1)]
    lines += ["", "What each surface shows, and so is compared:", "", facts, facts_rule, *carried]
    lines += ["", END]
    return "\n".join(lines)


def write_table(doc: Path = DOC) -> bool:
    """Write the table into ``doc`` between its markers; whether it changed."""
    text = doc.read_text()
    start, end = text.index(BEGIN), text.index(END) + len(END)
    updated = text[:start] + render_table() + text[end:]
    if updated == text:
        return False
    doc.write_text(updated)
    return True
