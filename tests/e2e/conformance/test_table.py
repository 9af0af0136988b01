"""The table of the conformance matrix in docs/protocol.md is the matrix the suite runs
(rewrite it with ``python -m tests.e2e.conformance.table``)."""

from __future__ import annotations

from tests.support.conformance import BEGIN, DOC, END, render_table


def test_the_table_in_the_protocol_doc_is_current() -> None:
    text = DOC.read_text()
    assert BEGIN in text, f"{DOC} has no conformance matrix: add its two markers"
    written = text[text.index(BEGIN) : text.index(END) + len(END)]
    assert written == render_table(), (
        f"the conformance matrix in {DOC.name} is stale: run python -m tests.e2e.conformance.table"
    )
