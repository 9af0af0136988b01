"""Run facts: what every surface must agree on about one run (the conformance matrix,
tests/e2e/conformance/).

A surface reader (tests/support/surfaces.py) turns what its surface shows into a
:class:`RunFacts`; :func:`differences` compares it with the run's expected facts, field
by field, over the facts the surface carries. The expected facts come from
:func:`facts_from_envelopes`, an independent fold of the run's envelopes as the
channel carried them (not the kits' reducers, which are surfaces under test).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, fields
from typing import Any

from broadcaster.envelope import ROUTING_PHASES

__all__ = [
    "FACTS",
    "NestedFacts",
    "Record",
    "RunFacts",
    "differences",
    "facts_from_envelopes",
    "facts_from_view",
]

Record = tuple[str | None, Mapping[str, Any]]
"""``(position, envelope)`` as a channel delivered it (position None when unknown)."""

FINAL = ("completed", "failed")


@dataclass(frozen=True)
class NestedFacts:
    """A run nested in the run (a routed capability's inner agent)."""

    execution_id: str
    parent_tool_call_id: str
    status: str
    stop_reason: str | None
    steps: int
    tool_calls: int


@dataclass(frozen=True)
class RunFacts:
    """One run as a surface shows it. None: the surface did not say (each surface
    declares which facts it carries; a carried fact that is None is a difference)."""

    execution_id: str | None = None
    status: str | None = None
    """completed, failed, or what it shows short of an end (in_progress)."""
    stop_reason: str | None = None
    final_text: str | None = None
    """A completed run's answer: its last step's streamed text, else its last response."""
    error: str | None = None
    """A failed run's error message (None for a completed run)."""
    steps: int | None = None
    """The run's own steps (not a nested run's, not an earlier run's of the session)."""
    tool_calls: int | None = None
    """The agent's tool calls (a routed run's capability calls), not routing phases."""
    routing_phases: int | None = None
    """A routed run's phases (classifier, decider, memory), counted apart."""
    input_tokens: int | None = None
    output_tokens: int | None = None
    total_tokens: int | None = None
    """The run's own tokens: the sum of its steps' usage."""
    start: str | None = None
    """Run boundaries: the position of the run's first envelope (its in_progress)..."""
    end: str | None = None
    """... and of its final status."""
    nested: tuple[NestedFacts, ...] | None = None
    """The runs nested in it, by parent call (sorted by execution id)."""


FACTS: tuple[str, ...] = tuple(f.name for f in fields(RunFacts))


def differences(
    expected: RunFacts,
    actual: RunFacts,
    carries: Iterable[str],
    clip: Mapping[str, tuple[int, str]] | None = None,
) -> list[str]:
    """One line per carried fact where ``actual`` differs from ``expected``. A completed
    run's final text is compared, not a failed run's (it has no answer, it has an
    error); ``clip`` names facts a surface keeps only the first characters of, and what
    it puts after a text it cut (``(2000, "...")``)."""
    found: list[str] = []
    for name in carries:
        if name == "final_text" and expected.status != "completed":
            continue
        want, got = getattr(expected, name), getattr(actual, name)
        limit, mark = (clip or {}).get(name, (None, ""))
        if limit is not None and isinstance(want, str) and len(want) > limit:
            want = want[:limit] + mark
        if want != got:
            found.append(f"{name}: expected {_short(want)}, the surface shows {_short(got)}")
    return found


def _short(value: object) -> str:
    text = repr(value)
    return text if len(text) <= 300 else f"{text[:200]}…({len(text)} chars)…{text[-60:]}"


# -- the reference fold -----------------------------------------------------------------


@dataclass
class _Fold:
    execution_id: str
    parent_call: str = ""
    start: str | None = None
    end: str | None = None
    status: str = "pending"
    final: Mapping[str, Any] = field(default_factory=dict)
    steps: set[int] = field(default_factory=set)
    chunks: dict[int, dict[int, str]] = field(default_factory=dict)
    tools: set[str] = field(default_factory=set)
    phases: set[str] = field(default_factory=set)
    usage: list[Mapping[str, Any]] = field(default_factory=list)

    def feed(self, position: str | None, kind: str, payload: Mapping[str, Any]) -> None:
        if self.start is None:
            self.start = position
        number = payload.get("step_number")
        if kind == "agent.status":
            self.status = str(payload.get("status"))
            if self.status in FINAL:
                self.final, self.end = payload, position
        elif kind in ("agent.step.started", "agent.step.completed"):
            self.steps.add(int(number or 0))
            if kind == "agent.step.completed":
                self.usage.append(payload.get("usage") or {})
        elif kind in ("agent.tool.started", "agent.tool.completed"):
            calls = self.phases if payload.get("tool_name") in ROUTING_PHASES else self.tools
            calls.add(str(payload.get("tool_call_id")))
        elif kind == "agent.stream.chunk":
            step = self.chunks.setdefault(int(number or 0), {})
            step[int(payload.get("chunk_index") or 0)] = str(payload.get("chunk") or "")

    def text(self) -> str:
        streamed = [n for n in sorted(self.chunks) if "".join(self.chunks[n].values())]
        if streamed:
            last = self.chunks[streamed[-1]]
            return "".join(last[i] for i in sorted(last))
        return str(self.final.get("last_response") or "")

    def tokens(self) -> dict[str, int]:
        names = {"input": "prompt", "output": "completion", "total": "total"}
        summed = {
            ours: sum(int(u.get(theirs) or 0) for u in self.usage) for ours, theirs in names.items()
        }
        if any(summed.values()):
            return summed
        reported = self.final.get("usage") or {}
        return {ours: int(reported.get(theirs) or 0) for ours, theirs in names.items()}

    def facts(self, nested: tuple[NestedFacts, ...] | None) -> RunFacts:
        final = self.final
        tokens = self.tokens()
        return RunFacts(
            execution_id=self.execution_id,
            status=self.status,
            stop_reason=final.get("stop_reason"),
            final_text=self.text() if self.status == "completed" else None,
            error=final.get("error_message"),
            steps=len(self.steps),
            tool_calls=len(self.tools),
            routing_phases=len(self.phases),
            input_tokens=tokens["input"],
            output_tokens=tokens["output"],
            total_tokens=tokens["total"],
            start=self.start,
            end=self.end,
            nested=nested,
        )

    def nested_facts(self) -> NestedFacts:
        return NestedFacts(
            self.execution_id,
            self.parent_call,
            self.status,
            self.final.get("stop_reason"),
            len(self.steps),
            len(self.tools),
        )


def facts_from_envelopes(records: Sequence[Record], execution_id: str | None = None) -> RunFacts:
    """The facts of run ``execution_id`` (default: the first run, not nested, that
    ``records`` hold) from its envelopes and those of the runs nested in it; the
    envelopes of other runs are left out, as a surface must leave them out."""
    own: _Fold | None = None
    inner: dict[str, _Fold] = {}
    for position, envelope in records:
        payload = envelope.get("payload")
        if not isinstance(payload, Mapping):
            continue
        kind, execution = str(envelope.get("type")), str(envelope.get("execution_id"))
        parent = payload.get("parent_execution_id")
        if parent is None:
            if execution_id is None:
                execution_id = execution
            if execution == execution_id:
                own = own or _Fold(execution)
                own.feed(position, kind, payload)
        elif parent == execution_id or parent in inner:
            fold = inner.get(execution)
            if fold is None:
                call = str(payload.get("parent_tool_call_id"))
                fold = inner[execution] = _Fold(execution, call)
            fold.feed(position, kind, payload)
    if own is None:
        return RunFacts(execution_id=execution_id, nested=())
    return own.facts(tuple(inner[k].nested_facts() for k in sorted(inner)))


# -- a kit's RunView ----------------------------------------------------------------------


def facts_from_view(view: Mapping[str, Any], final_text: str) -> RunFacts:
    """The facts of a ``RunView`` either kit built (``final_text``: what the kit's own
    ``final_text`` / ``finalText`` says of it)."""
    steps = view.get("steps") or []
    usage = view.get("usage") or {}
    nested = tuple(
        sorted(
            (
                _nested_of_view(execution, call, child)
                for call, runs in (view.get("nested") or {}).items()
                for execution, child in runs.items()
            ),
            key=lambda n: n.execution_id,
        )
    )
    status = view.get("status")
    return RunFacts(
        execution_id=view.get("execution_id"),
        status=status,
        stop_reason=view.get("stop_reason"),
        final_text=final_text if status == "completed" else None,
        error=view.get("error"),
        steps=len(steps),
        tool_calls=sum(len(step.get("tools") or []) for step in steps),
        routing_phases=sum(len(step.get("routing") or {}) for step in steps),
        input_tokens=usage.get("prompt"),
        output_tokens=usage.get("completion"),
        total_tokens=usage.get("total"),
        end=view.get("position"),
        nested=nested,
    )


def _nested_of_view(execution: str, call: str, view: Mapping[str, Any]) -> NestedFacts:
    steps = view.get("steps") or []
    return NestedFacts(
        execution,
        call,
        str(view.get("status")),
        view.get("stop_reason"),
        len(steps),
        sum(len(step.get("tools") or []) for step in steps),
    )
