"""One behaviour, two languages: the Python reducer reproduces every golden run in
tests/fixtures/runs/ exactly (clients/js/test/fixtures.test.mjs holds TypeScript to the
same), and what the events build agrees with the state the server stored."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from broadcaster.client import (
    RunView,
    apply_snapshot,
    create_run_view,
    create_session_view,
    final_text,
    latest_run,
    reconcile,
    reduce_run,
    reduce_run_all,
    reduce_session,
)

FOLDER = Path(__file__).resolve().parents[2] / "fixtures" / "runs"
FIXTURES = {
    path.stem: json.loads(path.read_text("utf-8")) for path in sorted(FOLDER.glob("*.json"))
}


def replay(fixture: dict[str, Any], ops: list[dict[str, Any]] | None = None) -> RunView:
    view = create_run_view(fixture["session_id"])
    for op in fixture["ops"] if ops is None else ops:
        if op.get("snapshot"):
            view = apply_snapshot(view, fixture["snapshot"])
        else:
            view = reduce_run(view, op["envelope"], op["position"])
    return view


def test_every_kind_of_run_is_recorded() -> None:
    assert {
        "completed",
        "failed-last-step",
        "second-run",
        "routed",
        "resumed-across-gap",
        "replay-overlap",
        "framework-pydantic-ai",
        "framework-openai-agents",
        "framework-langgraph",
    } <= set(FIXTURES)


@pytest.mark.parametrize("name", sorted(FIXTURES))
def test_reduce_run_all_folds_a_golden_run_as_reduce_run_does(name: str) -> None:
    fixture = FIXTURES[name]
    start = create_run_view(fixture["session_id"])
    frozen = json.dumps(start)
    view, batch = start, []
    for op in fixture["ops"]:
        if op.get("snapshot"):
            view = apply_snapshot(reduce_run_all(view, batch), fixture["snapshot"])
            batch = []
        else:
            batch.append(op)
    view = reduce_run_all(view, batch)
    assert view == fixture["expected"]["view"]
    assert json.dumps(start) == frozen  # the view given is unchanged


@pytest.mark.parametrize("name", sorted(FIXTURES))
def test_the_python_reducer_reproduces_the_golden_run(name: str) -> None:
    fixture = FIXTURES[name]
    view = replay(fixture)
    assert view == fixture["expected"]["view"]
    differences = reconcile(view, fixture["snapshot"]) if fixture["snapshot"] else None
    assert differences == fixture["expected"]["differences"]


def _last_assistant(snapshot: dict[str, Any]) -> str:
    texts = [m.get("content") for m in snapshot.get("messages", []) if m.get("role") == "assistant"]
    return next((text for text in reversed(texts) if text), "")


@pytest.mark.parametrize(
    "name", sorted(n for n, f in FIXTURES.items() if not any(op.get("snapshot") for op in f["ops"]))
)
def test_every_envelope_of_a_run_gives_the_stored_state(name: str) -> None:
    """Reduced from its envelopes alone, a run has the stored snapshot's status, steps,
    tool calls, usage and final text."""
    fixture = FIXTURES[name]
    view, snapshot = replay(fixture), fixture["snapshot"]
    completed = [step for step in view["steps"] if step["completed"]]
    assert view["status"] == snapshot["status"]
    assert len(completed) == snapshot["step_count"]
    assert [s["number"] for s in completed][-len(snapshot["steps"]) :] == [
        s["step_number"] for s in snapshot["steps"]
    ]
    by_number = {step["number"]: step for step in completed}
    for stored in snapshot["steps"]:
        mine = sorted(tool["id"] for tool in by_number[stored["step_number"]]["tools"])
        assert mine == sorted(call["id"] for call in stored.get("tool_calls") or [])
    assert view["usage"]["total"] == snapshot["usage"]["total"]
    assert final_text(view, completed_only=True) == _last_assistant(snapshot)


POSITIONED = [name for name, f in FIXTURES.items() if all(op.get("position") for op in f["ops"])]


@pytest.mark.parametrize("name", POSITIONED)
@settings(max_examples=40, deadline=None)
@given(data=st.data())
def test_duplicates_and_replays_fold_idempotently_by_position(
    name: str, data: st.DataObject
) -> None:
    """Any replay of envelopes already applied (each at its position), anywhere, leaves
    the view the run builds unchanged."""
    fixture = FIXTURES[name]
    ops = list(fixture["ops"])
    for _ in range(data.draw(st.integers(0, 4))):
        cut = data.draw(st.integers(1, len(ops)))
        start = data.draw(st.integers(0, cut - 1))
        ops[cut:cut] = ops[start:cut]
    assert replay(fixture, ops) == fixture["expected"]["view"]


def test_a_nested_run_is_kept_out_of_its_parent_and_exposed_under_the_call() -> None:
    """The routed run with its capability's inner agent nested: the parent's steps,
    status and usage are what its own envelopes build (the nested ones taken out, the
    view is the same but for ``nested`` and the position), the inner run is the view
    of its envelopes under ``nested[<call>][<execution>]``, and the parent still
    reconciles with the stored state (In sync)."""
    fixture = FIXTURES["routed-nested"]
    ops = fixture["ops"]
    parent = fixture["expected"]["view"]
    is_nested = [bool(op["envelope"]["payload"].get("parent_execution_id")) for op in ops]
    assert 10 <= sum(is_nested) < len(ops)
    own = replay(fixture, [op for op, n in zip(ops, is_nested, strict=True) if not n])
    assert {k: v for k, v in parent.items() if k not in ("nested", "position")} == {
        k: v for k, v in own.items() if k != "position"
    }
    assert parent["position"] == ops[-1]["position"]
    [(call, runs)] = parent["nested"].items()
    capability = next(t for t in parent["steps"][0]["tools"] if t["id"] == call)
    assert capability["name"] == "weather_agent"
    [(execution, inner)] = runs.items()
    assert execution != parent["execution_id"]
    assert inner["execution_id"] == execution
    assert (inner["status"], len(inner["steps"])) == ("completed", 3)
    assert [t["name"] for s in inner["steps"] for t in s["tools"]] == ["get_weather", "calculator"]
    assert reconcile(parent, fixture["snapshot"]) == []


# --- a session's runs apart (clients/js/test/session.test.mjs holds TypeScript to the same)

UNSNAPSHOTTED = sorted(
    name
    for name, fixture in FIXTURES.items()
    if not any(op.get("snapshot") for op in fixture["ops"])
)


def _by_run(ops: list[dict[str, Any]]) -> list[list[dict[str, Any]]]:
    """``ops`` grouped by top-level run (a nested run's with its parent's), in order."""
    runs: dict[str | None, list[dict[str, Any]]] = {}
    root: dict[str, str | None] = {}
    last: str | None = None
    for op in ops:
        envelope = op["envelope"]
        own, parent = envelope.get("execution_id"), envelope["payload"].get("parent_execution_id")
        key = root.get(parent, parent) if parent else (own or last)
        if parent and own:
            root[own] = key
        runs.setdefault(key, []).append(op)
        last = key
    return list(runs.values())


@pytest.mark.parametrize("name", UNSNAPSHOTTED)
def test_reduce_session_keeps_each_run_as_reduce_run_builds_it_alone(name: str) -> None:
    fixture = FIXTURES[name]
    session = create_session_view(fixture["session_id"])
    for op in fixture["ops"]:
        session = reduce_session(session, op["envelope"], op["position"])
    expected = [replay(fixture, ops) for ops in _by_run(fixture["ops"])]
    assert session["runs"] == expected
    assert session["position"] == fixture["ops"][-1]["position"]
    if len(expected) == 1:
        assert latest_run(session) == fixture["expected"]["view"]


def test_reduce_session_keeps_a_failed_first_run_apart_from_the_second() -> None:
    fixture = FIXTURES["second-run"]
    session = create_session_view(fixture["session_id"])
    for op in fixture["ops"]:
        before = session
        session = reduce_session(session, op["envelope"], op["position"])
        if len(before["runs"]) == len(session["runs"]) == 2:
            assert session["runs"][0] is before["runs"][0]  # untouched: the same object
    first, second = session["runs"]
    assert (first["status"], second["status"]) == ("failed", "completed")
    assert "failed on purpose" in first["error"]
    assert second["error"] is None
    assert second["steps"][0]["number"] == first["steps"][-1]["number"] + 1
    last = fixture["ops"][-1]
    assert reduce_session(session, last["envelope"], last["position"]) is session
    assert reduce_session(session, {"type": "client-typing", "payload": {}}) is session
    assert latest_run(create_session_view("s")) is None
