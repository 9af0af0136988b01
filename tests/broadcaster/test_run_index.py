"""The run index's pure parts: traces bounded in bytes, summaries of envelopes anyone may
have published."""

from __future__ import annotations

import json
from typing import Any

import pytest

from broadcaster.publication import Position, Publication
from broadcaster.run_index import RunSummary, build_trace, summarize


def publication(offset: int, kind: str, payload: dict[str, Any]) -> Publication:
    data = {
        "type": kind,
        "session_id": "s",
        "execution_id": "x-1",
        "timestamp": "2026-01-16T10:05:00.000Z",
        "payload": payload,
    }
    return Publication(
        "1",
        "agent.s",
        kind,
        json.dumps(data, ensure_ascii=False),
        None,
        None,
        Position(offset, "e"),
    )


@pytest.mark.parametrize("unit", ["a", "é", "€", "😀"], ids=["1 byte", "2", "3", "4 bytes"])
def test_the_trace_bound_counts_bytes_not_characters(unit: str) -> None:
    """4-byte UTF-8 kept 7.74 MB of a run against the promised 2 MiB."""
    kept = [publication(1, "agent.status", {"status": "in_progress"})]
    kept += [
        publication(n, "agent.stream.chunk", {"chunk": unit * 1000, "chunk_index": n})
        for n in range(2, 40)
    ]
    kept.append(publication(40, "agent.status", {"status": "completed"}))
    trace = build_trace(kept, "x-1", max_bytes=10_000)
    size = sum(len(data.encode()) for _, data in trace.entries)
    assert size <= 10_000
    assert trace.trimmed
    assert [json.loads(data)["type"] for _, data in trace.entries][-1] == "agent.status"


@pytest.mark.parametrize(
    "hostile",
    [10**20, -5, "lots", 1e300, float("inf"), float("nan"), -1e300, None, True, [1], {"n": 1}],
)
def test_hostile_counts_in_envelopes_are_summarized_bounded(hostile: Any) -> None:
    """Anyone with the app's secret publishes what they like: a count orjson cannot
    write (or one that is not a number) kept the run from being indexed at all."""
    envelopes = [
        {
            "type": "agent.step.completed",
            "payload": {
                "step_number": hostile,
                "usage": {"prompt": hostile, "completion": 2, "total": hostile},
            },
        },
        {
            "type": "agent.status",
            "payload": {
                "status": "completed",
                "step_count": hostile,
                "usage": {"prompt": hostile, "completion": hostile, "total": hostile},
            },
        },
        {"type": "agent.status", "payload": {"status": "completed", "usage": hostile}},
    ]
    summary = summarize(RunSummary("s", "x-1", 0.0), envelopes)
    assert summary.status == "completed"
    for count in (summary.steps, *summary.tokens.values()):
        assert 0 <= count <= 2**53 - 1
    summary.to_json()  # it can be stored
