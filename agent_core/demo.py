"""The demo extension: serves the dashboard in ``frontend-demo/`` at ``/``.

Loaded by the server through the ``agent_broadcaster.extensions`` entry point named
``demo`` (``agent-broadcaster serve --demo``); this module is the composition root that
wires ``agent_core`` into ``broadcaster``.
"""

from __future__ import annotations

from pathlib import Path

from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles

from broadcaster.extensions import ExtensionContext

__all__ = ["FRONTEND_DIR", "install"]

FRONTEND_DIR = Path(__file__).resolve().parent.parent / "frontend-demo"


def install(ctx: ExtensionContext) -> None:
    """Add the dashboard routes to the server."""
    if not (FRONTEND_DIR / "index.html").is_file():
        raise RuntimeError(f"demo dashboard not found: {FRONTEND_DIR / 'index.html'} is missing")
    static = StaticFiles(directory=FRONTEND_DIR, html=True)
    ctx.routes.append(Route("/", static, name="dashboard"))
    ctx.routes.append(Mount("/demo", static, name="demo-assets"))
