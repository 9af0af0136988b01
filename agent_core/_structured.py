"""Structured answers from a model: a JSON object (optionally in a code fence)
validated by a pydantic model."""

from __future__ import annotations

import re
from typing import TypeVar

import pydantic

from agent_core.errors import ValidationError

__all__ = ["parse_structured"]

M = TypeVar("M", bound=pydantic.BaseModel)

_FENCE = re.compile(r"^```(?:json)?\s*(.*?)\s*```$", re.DOTALL)


def parse_structured(text: str, model: type[M], what: str) -> M:
    """``text`` as ``model``.

    Raises:
        agent_core.errors.ValidationError: naming ``what`` and what is wrong with it.
    """
    body = text.strip()
    fenced = _FENCE.match(body)
    if fenced:
        body = fenced.group(1)
    try:
        return model.model_validate_json(body)
    except pydantic.ValidationError as exc:
        problems = "; ".join(
            f"{'.'.join(str(p) for p in err['loc']) or 'answer'}: {err['msg']}"
            for err in exc.errors()
        )
        shown = body if len(body) <= 200 else body[:197] + "..."
        raise ValidationError(f"{what} is not valid ({problems}); the model said: {shown}") from exc
