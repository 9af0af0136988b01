"""The contract between the fast path / the connection guard and the installed uvicorn.

:mod:`broadcaster._compat` lists every uvicorn (and websockets) method and attribute the
two subclasses rely on. These tests check that the installed packages have each of
them, and that the lists are complete: every ``self.<name>`` the subclasses use and do
not define themselves is named in the contract.
"""

from __future__ import annotations

import ast
import inspect
import textwrap

import pytest
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from broadcaster import _compat, _guard, _uvicorn
from broadcaster._compat import GUARD, WEBSOCKET, Contract


def _names(contracts: tuple[Contract, ...], cls: str) -> set[str]:
    return {
        name
        for contract in contracts
        if contract.cls == cls
        for name in (*contract.methods, *contract.attributes)
    }


def _relied_on(cls: type, via: str = "self") -> set[str]:
    """Names used as ``self.<name>`` (or ``self.<via>.<name>``) in ``cls``'s own source,
    plus ``super().<name>`` calls."""
    tree = ast.parse(textwrap.dedent(inspect.getsource(cls)))
    used: set[str] = set()
    for node in ast.walk(tree):
        if not isinstance(node, ast.Attribute):
            continue
        value = node.value
        if (via == "self" and isinstance(value, ast.Name) and value.id == "self") or (
            via != "self"
            and isinstance(value, ast.Attribute)
            and value.attr == via
            and isinstance(value.value, ast.Name)
            and value.value.id == "self"
        ):
            used.add(node.attr)
        elif via == "self" and isinstance(value, ast.Call):
            func = value.func
            if isinstance(func, ast.Name) and func.id == "super":
                used.add(node.attr)
    return used


def _own(cls: type) -> set[str]:
    """What ``cls`` defines itself: its class body and what its ``__init__`` assigns."""
    own = set(vars(cls))
    if "__init__" in vars(cls):
        tree = ast.parse(textwrap.dedent(inspect.getsource(vars(cls)["__init__"])))
        own |= {
            node.attr
            for node in ast.walk(tree)
            if isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store)
        }
    return own


def test_the_installed_uvicorn_has_everything_the_fast_path_relies_on() -> None:
    assert _compat.fast_path_problems() == []


def test_the_installed_uvicorn_has_everything_the_guard_relies_on() -> None:
    assert _compat.guard_problems() == []


def test_the_websocket_contract_names_every_inherited_name_the_fast_path_uses() -> None:
    cls = _uvicorn.FastWebSocketProtocol
    inherited = _relied_on(cls) - _own(cls)
    assert inherited - _names(WEBSOCKET, "WebSocketsSansIOProtocol") == set()
    assert _relied_on(cls, via="conn") - _names(WEBSOCKET, "ServerProtocol") == set()


def test_the_guard_contract_names_every_inherited_name_the_guard_uses() -> None:
    cls = _guard.GuardedHttpProtocol
    inherited = _relied_on(cls) - _own(cls)
    assert inherited - _names(GUARD, "HttpToolsProtocol") == set()
    assert _relied_on(cls, via="cycle") - _names(GUARD, "RequestResponseCycle") == set()


def test_the_contract_lists_are_read_as_claimed() -> None:
    """The check itself can fail: a missing method, attribute, class or module."""
    contract = Contract(
        module="uvicorn.protocols.websockets.websockets_sansio_impl",
        cls="WebSocketsSansIOProtocol",
        methods=("handle_connect", "no_such_method"),
        attributes=("conn", "no_such_attribute"),
    )
    prefix = "uvicorn.protocols.websockets.websockets_sansio_impl.WebSocketsSansIOProtocol"
    assert contract.problems() == [f"{prefix}.no_such_method()", f"{prefix}.no_such_attribute"]
    gone = Contract(module="uvicorn.protocols.no_such_module", cls="X", methods=())
    assert gone.problems()[0].startswith("uvicorn.protocols.no_such_module.X cannot be imported")
    renamed = Contract(module="uvicorn.config", cls="NoSuchClass", methods=())
    assert renamed.problems()[0].startswith("uvicorn.config.NoSuchClass cannot be imported")


def test_instance_attributes_are_read_from_every_base() -> None:
    names = _compat.instance_attributes(_uvicorn.FastWebSocketProtocol)
    assert {"conn", "transport", "shutdown_abort_after", "on_lost"} <= names


def test_a_spurious_ast_system_error_is_tried_again(monkeypatch: pytest.MonkeyPatch) -> None:
    """CPython 3.11's 'AST constructor recursion depth mismatch' (python/cpython#106905)
    once failed a server start in a test run: one such error is parsed again."""
    calls = 0
    source = _compat._source

    def flaky(klass: type) -> str:
        nonlocal calls
        calls += 1
        if calls == 1 or calls > 2:
            raise SystemError("AST constructor recursion depth mismatch (before=1, after=2)")
        return source(klass)

    monkeypatch.setattr(_compat, "_source", flaky)
    assert isinstance(_compat._parsed(_uvicorn.FastWebSocketProtocol), ast.Module)
    assert calls == 2
    with pytest.raises(SystemError, match="recursion depth mismatch"):  # it keeps failing
        _compat._parsed(_uvicorn.FastWebSocketProtocol)
    assert calls == 4


@pytest.mark.parametrize("contract", [*WEBSOCKET, *GUARD], ids=lambda c: c.cls)
def test_every_named_method_is_callable_on_the_installed_class(contract: Contract) -> None:
    assert contract.problems() == []


def test_a_native_cycle_has_everything_uvicorn_reads_of_the_protocols_cycle() -> None:
    """A natively served request stands in as the protocol's ``cycle``: every name that
    uvicorn's protocol reads or writes there (but in ``on_body`` and
    ``on_message_complete``, which the guard keeps from native cycles) exists on it, and
    the contract names them."""
    base = HttpToolsProtocol
    tree = ast.parse(textwrap.dedent(inspect.getsource(base)))
    used: set[str] = set()
    for function in ast.walk(tree):
        if not isinstance(function, ast.FunctionDef) or function.name in (
            "on_body",
            "on_message_complete",
        ):
            continue
        for node in ast.walk(function):
            if isinstance(node, ast.Attribute) and _is_cycle(node.value):
                used.add(node.attr)
    assert "response_complete" in used  # the walk finds them
    native = set(_guard._NativeCycle.__slots__) | set(vars(_guard._NativeCycle))
    assert used - native == set()
    assert used - _names(GUARD, "RequestResponseCycle") == set()


def _is_cycle(node: ast.expr) -> bool:
    """``self.cycle`` or ``existing_cycle`` (what uvicorn calls the previous one)."""
    if isinstance(node, ast.Name):
        return node.id == "existing_cycle"
    return (
        isinstance(node, ast.Attribute)
        and node.attr == "cycle"
        and isinstance(node.value, ast.Name)
        and node.value.id == "self"
    )
