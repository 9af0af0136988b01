"""Identifiers for agents, executions and steps."""

from __future__ import annotations

import uuid

__all__ = ["new_id"]


def new_id() -> str:
    """A fresh random identifier (a UUID4 as text)."""
    return str(uuid.uuid4())
