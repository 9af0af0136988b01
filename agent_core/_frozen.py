"""Read-only JSON-like data: what the state's mappings and lists are made of.

:func:`freeze` turns dicts into :class:`FrozenDict` and lists into :class:`FrozenList`,
all the way down (tuples stay tuples, of frozen items). Both are subclasses of the
built-ins, so they compare equal to plain dicts and lists and serialize as they do
(``json``, ``orjson``, pydantic), but every method that would change them in place
raises ``TypeError``. :func:`thaw` makes a plain, mutable deep copy (e.g. for a tool
function that may change its arguments).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, NoReturn

__all__ = ["FrozenDict", "FrozenList", "freeze", "freeze_mapping", "thaw"]


def _refuse(self: object, *args: Any, **kwargs: Any) -> NoReturn:
    raise TypeError(
        f"{type(self).__name__} is read-only: state data is immutable; build a new value "
        "(e.g. with dict(...) or a with_* method) instead of changing it in place"
    )


class FrozenDict(dict[str, Any]):
    """A dict that cannot be changed in place."""

    __slots__ = ()

    __setitem__ = _refuse
    __delitem__ = _refuse
    __ior__ = _refuse
    clear = _refuse
    pop = _refuse
    popitem = _refuse
    setdefault = _refuse
    update = _refuse

    def __reduce__(self) -> tuple[Any, ...]:
        return (FrozenDict, (dict(self),))

    def __copy__(self) -> FrozenDict:
        return self

    def __deepcopy__(self, memo: dict[int, Any]) -> FrozenDict:
        return self


class FrozenList(list[Any]):
    """A list that cannot be changed in place."""

    __slots__ = ()

    __setitem__ = _refuse
    __delitem__ = _refuse
    __iadd__ = _refuse
    __imul__ = _refuse
    append = _refuse
    extend = _refuse
    insert = _refuse
    pop = _refuse
    remove = _refuse
    clear = _refuse
    sort = _refuse
    reverse = _refuse

    def __reduce__(self) -> tuple[Any, ...]:
        return (FrozenList, (list(self),))

    def __copy__(self) -> FrozenList:
        return self

    def __deepcopy__(self, memo: dict[int, Any]) -> FrozenList:
        return self


def freeze(value: Any) -> Any:
    """``value`` with every mapping and list made read-only, recursively."""
    if isinstance(value, FrozenDict | FrozenList):
        return value
    if isinstance(value, Mapping):
        return FrozenDict({str(k): freeze(v) for k, v in value.items()})
    if isinstance(value, tuple):
        return tuple(freeze(v) for v in value)
    if isinstance(value, list):
        return FrozenList(freeze(v) for v in value)
    return value


def freeze_mapping(value: Mapping[str, Any]) -> FrozenDict:
    """:func:`freeze` for a mapping (typed for pydantic validators and dataclasses)."""
    frozen = freeze(value)
    assert isinstance(frozen, FrozenDict), "freeze() keeps a mapping a mapping"
    return frozen


def thaw(value: Any) -> Any:
    """A plain, mutable deep copy of (frozen) JSON-like data."""
    if isinstance(value, Mapping):
        return {k: thaw(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [thaw(v) for v in value]
    return value
