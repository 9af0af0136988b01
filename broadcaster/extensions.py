"""Extensions: code that adds routes and lifespan hooks to the server.

The server looks extensions up by name in the ``agent_broadcaster.extensions`` entry-point
group (or takes a ``module:attribute`` import string), so that ``broadcaster`` never
imports the packages that extend it; the demo (``agent_core.app.demo``) is one.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass, field
from importlib.metadata import entry_points
from typing import TYPE_CHECKING, Any

from starlette.routing import BaseRoute

from broadcaster.settings import Settings

if TYPE_CHECKING:
    from broadcaster.node import Node

__all__ = ["ExtensionContext", "ExtensionError", "load_extension"]

Lifespan = Callable[[], AbstractAsyncContextManager[None]]
ENTRY_POINT_GROUP = "agent_broadcaster.extensions"


class ExtensionError(Exception):
    """An extension could not be found or loaded."""


@dataclass
class ExtensionContext:
    """What an extension may touch while it installs itself.

    ``node`` is the running server's :class:`~broadcaster.node.Node` (publish into it
    in-process with ``await node.publish(app_id, [channel], event, data)``); it is
    started by the time the extension's lifespan hooks run.
    """

    settings: Settings
    node: Node | None = None
    routes: list[BaseRoute] = field(default_factory=list)
    lifespans: list[Lifespan] = field(default_factory=list)
    state: dict[str, Any] = field(default_factory=dict)


Installer = Callable[[ExtensionContext], None]


def load_extension(name: str) -> Installer:
    """Resolve ``name`` (an entry-point name or ``module:attr``) to its installer.

    Raises:
        ExtensionError: if nothing by that name can be imported.
    """
    if ":" in name:
        module_name, _, attr = name.partition(":")
        try:
            installer: Installer = getattr(importlib.import_module(module_name), attr)
        except (ImportError, AttributeError) as exc:
            raise ExtensionError(f"cannot load extension {name!r}: {exc}") from exc
        return installer
    found = entry_points(group=ENTRY_POINT_GROUP, name=name)
    if not found:
        raise ExtensionError(
            f"no extension named {name!r} in entry-point group {ENTRY_POINT_GROUP!r}"
        )
    loaded: Installer = next(iter(found)).load()
    return loaded
