"""The error an integration raises when its optional extra is not installed.

The frameworks and OpenTelemetry are extras (``pyproject.toml``), so the runtime install
has none of them. Importing an integration without its extra raises
``ModuleNotFoundError`` as Python would, with a message that names the extra and how to
install it, instead of only "No module named 'agents'".
"""

from __future__ import annotations

__all__ = ["missing_extra"]


def missing_extra(exc: ModuleNotFoundError, extra: str, needed_by: str) -> ModuleNotFoundError:
    """The error to raise, from ``except ModuleNotFoundError as exc``, when ``needed_by``
    (a module or a feature) cannot import what extra ``extra`` installs."""
    return ModuleNotFoundError(
        f"{needed_by} needs the optional extra [{extra}], which is not installed here "
        f"(no module {exc.name!r}): install it with .venv/bin/pip install -e '.[{extra}]' "
        f"in a checkout, or pip install '/path/to/agent-broadcaster[{extra}]'",
        name=exc.name,
    )
