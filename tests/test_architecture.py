"""The dependency rules between the packages, checked on every module's imports (ast).

- ``broadcaster`` never imports ``agent_core``.
- In ``agent_core``, only the composition root ``agent_core.app`` may import the
  broadcaster's server modules; the engine, the orchestrators and the adapters use only
  its client-side pieces (:data:`CLIENT_SIDE`).
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

CLIENT_SIDE = frozenset(
    {
        "broadcaster.codes",
        "broadcaster.envelope",
        "broadcaster.publication",
        "broadcaster.publishers",
    }
)
"""The broadcaster modules every part of ``agent_core`` may import."""

COMPOSITION_ROOT = "agent_core.app"


def imported(source: str, module: str) -> Iterator[str]:
    """Every module ``source`` (the text of ``module``) imports, as a dotted name; for
    ``from package import name`` both ``package`` and ``package.name`` (name may be a
    module). Imports inside functions and ``if TYPE_CHECKING:`` blocks count too."""
    package = module.rsplit(".", 1)[0]
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            yield from (alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*parts, base] if base else parts)
            yield base
            yield from (f"{base}.{alias.name}" for alias in node.names)


def modules(package: str) -> Iterator[tuple[str, str]]:
    """``(dotted name, source)`` of every module in ``package``."""
    for path in sorted((ROOT / package).rglob("*.py")):
        parts = path.relative_to(ROOT).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        yield name, path.read_text(encoding="utf-8")


def _is_server_module(name: str) -> bool:
    if name == "broadcaster":
        return False  # ``from broadcaster import x`` also yields broadcaster.x, judged alone
    if not name.startswith("broadcaster."):
        return False
    return not any(name == m or name.startswith(m + ".") for m in CLIENT_SIDE)


def violations(package: str) -> list[str]:
    """Every import in ``package`` that breaks a rule, as ``module -> imported``."""
    found = []
    for module, source in modules(package):
        in_root = module == COMPOSITION_ROOT or module.startswith(COMPOSITION_ROOT + ".")
        for name in imported(source, module):
            if (module.startswith("broadcaster") and name.split(".")[0] == "agent_core") or (
                module.startswith("agent_core") and not in_root and _is_server_module(name)
            ):
                found.append(f"{module} -> {name}")
    return sorted(set(found))


def test_broadcaster_never_imports_agent_core() -> None:
    assert violations("broadcaster") == []


def test_only_the_composition_root_imports_server_modules() -> None:
    assert violations("agent_core") == []


def test_the_walk_sees_every_kind_of_import() -> None:
    """The checker itself: plain, from, relative, nested and TYPE_CHECKING imports."""
    source = (
        "import broadcaster.node\n"
        "from broadcaster import envelope, sessions\n"
        "from . import loop\n"
        "from ..app import runs\n"
        "if TYPE_CHECKING:\n    from broadcaster.settings import AppConfig\n"
        "def f():\n    from broadcaster.hub import Hub\n"
    )
    names = set(imported(source, "agent_core.orchestrators.chat"))
    assert {
        "broadcaster.node",
        "broadcaster.envelope",
        "broadcaster.sessions",
        "agent_core.orchestrators.loop",
        "agent_core.app.runs",
        "broadcaster.settings.AppConfig",
        "broadcaster.hub.Hub",
    } <= names
    server = {name for name in names if _is_server_module(name)}
    assert "broadcaster.envelope" not in server
    assert {"broadcaster.node", "broadcaster.sessions", "broadcaster.hub.Hub"} <= server


def test_the_rule_covers_the_whole_tree() -> None:
    """Every subpackage is walked (a module missed would escape the rule)."""
    names = {name for name, _ in modules("agent_core")}
    assert {
        "agent_core.loop",
        "agent_core.drivers.openai",
        "agent_core.orchestrators.routing.router",
        "agent_core.adapters.broadcasting",
        "agent_core.app.agui",
    } <= names


CLIENT_MODULES = ("broadcaster.client", "broadcaster._tail")
"""What a frontend's or a script's Python uses to follow a run (no server parts)."""

SERVER_CORE = ("broadcaster.node", "broadcaster.hub", "broadcaster.connection", "starlette")


def test_the_python_client_imports_none_of_the_server() -> None:
    """broadcaster.client and the tail command run where no server is: they may use
    websockets' client and httpx, never the node, hub, connections or Starlette."""
    found = [
        f"{module} -> {name}"
        for module, source in modules("broadcaster")
        if module in CLIENT_MODULES
        for name in imported(source, module)
        if any(name == core or name.startswith(core + ".") for core in SERVER_CORE)
    ]
    assert found == []
