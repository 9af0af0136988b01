"""Write the conformance matrix's table into docs/protocol.md:
``python -m tests.e2e.conformance.table`` (test_table.py fails when it is stale)."""

from __future__ import annotations

from tests.support.conformance import DOC, write_table

if __name__ == "__main__":
    print(f"{DOC}: {'updated' if write_table() else 'already current'}")
