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


# -- the client side: what agent processes import --------------------------------------

AGENT_SIDE = (
    "broadcaster.envelope",
    "broadcaster.publishers",
    "broadcaster.signing",
    "broadcaster.protocol",
    "broadcaster.publication",
    "broadcaster.client",
    "broadcaster.backends.redis.publish",
    "broadcaster.backends.redis.clients",
)
"""What agent processes (workers, scripts, frontends' Python) import: envelopes,
publishers, signing, the client-side Redis publish and store, the Python watcher. (The
package ``broadcaster.backends.redis`` is loaded with them: its top level is checked
too; it names ``RedisBackend`` only lazily.)"""

SERVER = (
    "broadcaster.node",
    "broadcaster.hub",
    "broadcaster.connection",
    "broadcaster.settings",
    "broadcaster.server",
    "broadcaster.app",
    "broadcaster.websocket",
    "broadcaster.http_api",
    "broadcaster._uvicorn",
    "broadcaster.backends.memory",
    "broadcaster.backends.redis.backend",
    "broadcaster.backends.redis.core",
    "broadcaster.backends.redis.pubsub",
    "broadcaster.backends.redis.batching",
    "broadcaster.backends.redis.presence",
    "broadcaster.backends.redis.liveness",
    "broadcaster.backends.redis.cluster",
    "broadcaster.backends.redis.topology",
    "starlette",
    "uvicorn",
)
"""The server: the node, hub and connections, its settings, the backends themselves."""


def _top_level(source: str, module: str) -> Iterator[str]:
    """The imports a module runs when imported (not those inside functions)."""
    tree = ast.parse(source)
    body = ast.Module(
        body=[n for n in tree.body if isinstance(n, ast.Import | ast.ImportFrom)], type_ignores=[]
    )
    yield from imported(ast.unparse(body), module)


def _without_lazy(source: str) -> str:
    """``source`` without a module ``__getattr__`` (names loaded only when asked for)."""
    tree = ast.parse(source)
    tree.body = [
        n for n in tree.body if not (isinstance(n, ast.FunctionDef) and n.name == "__getattr__")
    ]
    return ast.unparse(tree)


def _loads(module: str, known: dict[str, str]) -> set[str]:
    """Every broadcaster module importing ``module`` (and calling what it imports) can
    load: its own imports, anywhere in it, then, transitively, those of every module and
    package ``__init__`` they load at import time."""
    found: set[str] = set()

    def resolve(name: str) -> str | None:
        while name and name not in known:
            name = name.rpartition(".")[0]
        return name or None

    def visit(name: str, everything: bool) -> None:
        parts = name.split(".")
        for i in range(1, len(parts) + 1):
            step = ".".join(parts[:i])
            if step not in known or step in found:
                continue
            found.add(step)
            source = known[step]
            whole = everything and step == name  # the packages above: their top level
            names = imported(_without_lazy(source), step) if whole else _top_level(source, step)
            for imported_name in names:
                if not imported_name.startswith("broadcaster"):
                    found.add(imported_name)
                elif (target := resolve(imported_name)) is not None:
                    visit(target, everything=False)

    visit(module, everything=True)
    return found


def test_the_agent_side_loads_none_of_the_server() -> None:
    """Envelopes, publishers, signing, the protocol's frames, the client-side Redis
    publish and store and the Python watcher never load the node, hub, connections,
    the server's settings or a backend (what they import, and so on)."""
    known = dict(modules("broadcaster"))
    found = sorted(
        f"{module} loads {name}"
        for module in AGENT_SIDE
        for name in _loads(module, known)
        if any(name == server or name.startswith(server + ".") for server in SERVER)
    )
    assert found == []


def test_the_agent_side_check_sees_a_server_import() -> None:
    """The walk above follows imports through modules (a module that loads the node
    through another is caught)."""
    known = {
        "broadcaster.a": "from broadcaster import b\n",
        "broadcaster.b": "import broadcaster.node\ndef f():\n    import broadcaster.hub\n",
        "broadcaster.node": "",
        "broadcaster.hub": "",
        "broadcaster": "",
    }
    loads = _loads("broadcaster.a", known)
    assert "broadcaster.node" in loads
    assert "broadcaster.hub" not in loads  # only when b's function runs


def test_backends_do_not_speak_the_protocol() -> None:
    """A backend moves publications; the frames are the protocol's: no backend imports
    ``broadcaster.protocol``, and the channel event's layout has one home
    (``broadcaster.publication``), from which the Redis codec and publish script take
    their pieces."""
    found = [
        f"{module} -> {name}"
        for module, source in modules("broadcaster")
        if module.startswith("broadcaster.backends")
        for name in imported(source, module)
        if name == "broadcaster.protocol" or name.startswith("broadcaster.protocol.")
    ]
    assert found == []
    layout = [module for module, source in modules("broadcaster") if ',"position":"' in source]
    assert layout == ["broadcaster.publication"]
    from broadcaster.backends.redis import scripts

    assert '"}' not in scripts.PUBLISH.source  # the frame's end is an argument
