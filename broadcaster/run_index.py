"""The run index: a summary of every run, and its envelopes, kept as long as its state.

Whoever runs an agent records the run where it stores the session's final state
(:class:`broadcaster.publishers.StateStore`): :meth:`RunRecorder.started` when the run
starts (status ``running``) and :meth:`RunRecorder.ended` once its final ``agent.status``
is published. At the end the recorder reads the run's envelopes from the channel's
history (once, off the publish path), folds them into a :class:`RunSummary` and keeps
them as the run's trace, bounded to :data:`TRACE_BYTES` (stream chunks dropped first,
then the oldest envelopes; ``trimmed`` says so), for as long as the state: a failed run
can be opened after the channel's history (600 s by default) is gone.

Where the index lives is the backend's business (:class:`RunIndex`): in memory, newest
:data:`RUN_INDEX_SIZE` runs per app; in Redis, keys that work on Redis Cluster
(:class:`broadcaster.backends._runs.RedisRunIndex`). The server reads it for
``GET /api/sessions``, ``/api/sessions/{id}/runs`` and ``/api/sessions/{id}/trace``
(:mod:`broadcaster.sessions`).
"""

from __future__ import annotations

import logging
import re
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field, replace
from datetime import datetime
from typing import Any, Literal, Protocol

import orjson

from broadcaster.envelope import ROUTING_PHASES, wire_int
from broadcaster.publication import Publication
from broadcaster.signing import LIST_CURSOR, seal, unseal

__all__ = [
    "MAX_CURSOR",
    "MAX_QUERY",
    "PREVIEW_CHARS",
    "RUN_INDEX_SIZE",
    "SESSION_RUNS",
    "TRACE_BYTES",
    "IndexedRun",
    "RunFilter",
    "RunIndex",
    "RunRecorder",
    "RunSummary",
    "Trace",
    "build_trace",
    "decode_cursor",
    "encode_cursor",
    "encode_trace",
    "run_member",
    "session_of",
    "summarize",
]

RUN_INDEX_SIZE = 10_000
"""Runs kept per app (the newest; older ones are dropped with their traces)."""
SESSION_RUNS = 200
"""Runs listed per session by ``GET /api/sessions/{id}/runs`` (the newest)."""
TRACE_BYTES = 2 * 1024 * 1024
"""The most envelope bytes kept per run's trace."""
PREVIEW_CHARS = 200
MESSAGE_CHARS = 500
MAX_QUERY = 200
"""The longest ``q`` a list request may search for."""

_START_STATUSES = frozenset(("pending", "in_progress"))
_CHUNK = "agent.stream.chunk"

log = logging.getLogger(__name__)

Status = Literal["running", "completed", "failed"]


def session_of(channel: str) -> tuple[str, bool]:
    """``(session id, private)`` of an ``agent.<id>`` / ``private-agent.<id>`` channel."""
    if channel.startswith("private-agent."):
        return channel[len("private-agent.") :], True
    if channel.startswith("agent."):
        return channel[len("agent.") :], False
    return channel, channel.startswith("private-")


def run_member(channel: str, execution_id: str) -> str:
    """The index's name of one run: its channel and execution id (channels hold no
    newline)."""
    return f"{channel}\n{execution_id}"


@dataclass(frozen=True, slots=True)
class RunSummary:
    """One run, as ``GET /api/sessions`` lists it (docs/protocol.md)."""

    session_id: str
    execution_id: str
    started_at: float
    ended_at: float | None = None
    status: Status = "running"
    stop_reason: str | None = None
    resolved_by: str | None = None
    steps: int = 0
    tool_calls: int = 0
    routing_phases: int = 0
    tokens: dict[str, int] = field(default_factory=lambda: {"input": 0, "output": 0, "total": 0})
    capability: str | None = None
    error: str | None = None
    input_preview: str = ""
    private: bool = False
    first_position: str | None = None
    last_position: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def to_json(self) -> bytes:
        return orjson.dumps(self.to_dict())

    @classmethod
    def from_json(cls, raw: bytes | str) -> RunSummary:
        """Read a stored summary.

        Raises:
            ValueError: it is not one.
        """
        try:
            data = orjson.loads(raw)
            return cls(**{k: data[k] for k in _FIELDS if k in data})
        except (orjson.JSONDecodeError, TypeError, KeyError) as exc:
            raise ValueError(f"not a run summary: {str(raw)[:80]!r}") from exc


_FIELDS = tuple(RunSummary.__dataclass_fields__)


@dataclass(frozen=True, slots=True)
class IndexedRun:
    """One entry of an index page: its sort key and its stored summary."""

    started_ms: int
    member: str
    summary: bytes


class RunIndex(Protocol):
    """Where runs and their traces are kept (a backend's, or a worker's Redis)."""

    async def put_run(
        self,
        app_id: str,
        channel: str,
        execution_id: str,
        started_ms: int,
        summary: bytes,
        ttl: float,
    ) -> None:
        """Keep (replace) one run's summary for ``ttl`` seconds, sorted by its start."""
        ...

    async def page(
        self,
        app_id: str,
        *,
        before: tuple[int, str] | None,
        start_min: int | None,
        start_max: int | None,
        count: int,
    ) -> tuple[list[IndexedRun], tuple[int, str] | None]:
        """Up to ``count`` index entries, newest start first, strictly before
        ``before`` (a ``(started_ms, member)``), started within the bounds (ms,
        inclusive); and the key of the last entry examined when more may follow."""
        ...

    async def session_runs(self, app_id: str, channel: str) -> list[bytes]:
        """The stored summaries of the channel's runs, oldest first (the newest
        :data:`SESSION_RUNS`)."""
        ...

    async def load_run(self, app_id: str, channel: str, execution_id: str) -> bytes | None: ...

    async def put_trace(
        self, app_id: str, channel: str, execution_id: str, trace: bytes, ttl: float
    ) -> None: ...

    async def load_trace(self, app_id: str, channel: str, execution_id: str) -> bytes | None: ...

    async def kept(self, app_id: str, channel: str) -> list[Publication]:
        """Every publication the channel's history still holds, oldest first."""
        ...


# -- cursors and filters ------------------------------------------------------------------


MAX_CURSOR = 1024
"""The longest cursor read (ours are at most about 450 characters)."""
_BAD_CURSOR = "invalid cursor: pass next_cursor from a previous answer, unchanged"


def encode_cursor(key: tuple[int, str], secret: str) -> str:
    """The list's cursor of index key ``key`` (``(started_ms, member)``), sealed with the
    app's ``secret`` (:func:`broadcaster.signing.seal`): it names the last run examined,
    which may be a run the reader cannot see (a private one), so the reader gets it
    opaque and cannot change it."""
    return seal(secret, LIST_CURSOR, orjson.dumps(list(key)))


def decode_cursor(text: str, secret: str) -> tuple[int, str]:
    """Raises ValueError for anything :func:`encode_cursor` did not write with ``secret``."""
    if len(text) > MAX_CURSOR:
        raise ValueError(f"{_BAD_CURSOR} (this one is over {MAX_CURSOR} characters)")
    try:
        started, member = orjson.loads(unseal(secret, LIST_CURSOR, text))
    except (ValueError, TypeError) as exc:  # orjson.JSONDecodeError is a ValueError
        raise ValueError(_BAD_CURSOR) from exc
    if type(started) is not int or not isinstance(member, str):
        raise ValueError(_BAD_CURSOR)
    return started, member


@dataclass(frozen=True, slots=True)
class RunFilter:
    """What a list request asks for (all optional); ``private`` lets private runs in."""

    status: str | None = None
    stop_reason: str | None = None
    resolved_by: str | None = None
    q: str | None = None
    private: bool = False

    def accepts(self, raw: bytes) -> bool:
        """Whether the stored summary ``raw`` matches. Most entries are turned down by a
        look at the bytes (summaries are compact JSON, where ``"key":value`` cannot
        occur inside a string: its quotes would be escaped) before any is decoded."""
        if not self.private and b'"private":true' in raw:
            return False
        if self.status is not None and b'"status":' + orjson.dumps(self.status) not in raw:
            return False
        needle = self.q.casefold() if self.q else None
        if needle and _PLAIN.fullmatch(needle) and needle not in raw.decode().casefold():
            return False
        if self.stop_reason is None and self.resolved_by is None and not needle:
            return True
        try:
            run = orjson.loads(raw)
        except orjson.JSONDecodeError:
            return False
        if not isinstance(run, dict):
            return False
        if self.stop_reason is not None and run.get("stop_reason") != self.stop_reason:
            return False
        if self.resolved_by is not None and run.get("resolved_by") != self.resolved_by:
            return False
        if needle:
            fields = (run.get("input_preview"), run.get("session_id"), run.get("execution_id"))
            return any(isinstance(text, str) and needle in text.casefold() for text in fields)
        return True


_PLAIN = re.compile(r"[\w .,:;!?@=+*/()\[\]{}'#%&$-]*")
"""Text whose JSON encoding is itself, so it is found in a summary's bytes if at all."""


# -- folding envelopes into a summary and a trace -----------------------------------------


def _seconds(timestamp: object) -> float | None:
    if not isinstance(timestamp, str):
        return None
    try:
        return datetime.fromisoformat(timestamp.replace("Z", "+00:00")).timestamp()
    except ValueError:
        return None


def _clip(text: str | None, limit: int) -> str | None:
    return None if text is None else text[:limit]


def _count(value: object) -> int:
    """A count from an envelope anyone may have published: 0 unless it is a number,
    clamped to what the summary's JSON carries (:func:`~broadcaster.envelope.wire_int`),
    so a hostile count cannot keep a run from being indexed."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return 0
    if isinstance(value, float):  # NaN is not > 0; infinity is clamped before int()
        value = int(min(value, 2.0**53)) if value > 0 else 0
    return wire_int(value)


def summarize(base: RunSummary, envelopes: Iterable[dict[str, Any]]) -> RunSummary:
    """``base`` (the start record) with what the run's envelopes say: status, stop
    reason, deciding criterion, steps, tool calls, routing phases, tokens, error.

    ``tool_calls`` are the agent's (a routed run's: its capability calls); a routed
    run's phases (:data:`~broadcaster.envelope.ROUTING_PHASES`: classifier, decider,
    memory, ...) are counted apart as ``routing_phases``, as the kits keep them apart.

    ``steps`` and ``tokens`` are the run's own, as the client's reducer counts them:
    its completed steps and the sum of their usage. Step numbers go on across the runs
    of a session (a second run's steps are 4, 5, 6) and a final ``step_count`` and
    ``usage`` are the session's, so they are used only when no step said (a trace cut
    short, a framework that reports usage at the end)."""
    run = base
    tools: set[str] = set()
    phases: set[str] = set()
    steps: set[int] = set()
    spent = {"input": 0, "output": 0, "total": 0}
    names = {"input": "prompt", "output": "completion", "total": "total"}
    for envelope in envelopes:
        kind, payload = envelope.get("type"), envelope.get("payload")
        if not isinstance(payload, dict) or payload.get("parent_execution_id"):
            continue  # a nested run's envelopes are not the run's own (they are in its trace)
        if kind == "agent.status":
            status = payload.get("status")
            if status in ("completed", "failed"):
                usage = payload.get("usage")
                usage = usage if isinstance(usage, dict) else {}
                run = replace(
                    run,
                    status=status,
                    ended_at=_seconds(envelope.get("timestamp")) or time.time(),
                    stop_reason=payload.get("stop_reason"),
                    error=_clip(payload.get("error_message"), MESSAGE_CHARS),
                    steps=max(run.steps, _count(payload.get("step_count")))
                    if not steps
                    else run.steps,
                    tokens={
                        "input": _count(usage.get("prompt")),
                        "output": _count(usage.get("completion")),
                        "total": _count(usage.get("total")),
                    },
                )
        elif kind == "agent.step.completed":
            steps.add(_count(payload.get("step_number")))
            usage = payload.get("usage")
            if isinstance(usage, dict):
                for ours, theirs in names.items():
                    spent[ours] = wire_int(spent[ours] + _count(usage.get(theirs)))
            decision = payload.get("continuation")
            run = replace(run, steps=len(steps))
            if isinstance(decision, dict) and decision.get("resolved_by"):
                run = replace(run, resolved_by=str(decision["resolved_by"]))
        elif kind == "agent.continuation" and payload.get("resolved_by"):
            run = replace(run, resolved_by=str(payload["resolved_by"]))
        elif kind == "agent.tool.started" and payload.get("tool_call_id"):
            calls = phases if payload.get("tool_name") in ROUTING_PHASES else tools
            calls.add(str(payload["tool_call_id"]))
    run = replace(
        run,
        tool_calls=max(run.tool_calls, len(tools)),
        routing_phases=max(run.routing_phases, len(phases)),
    )
    return replace(run, tokens=spent) if spent["total"] else run


def from_snapshot(run: RunSummary, snapshot: Mapping[str, Any]) -> RunSummary:
    """``run`` with what a final slim snapshot says and no final ``agent.status`` said
    yet: stop reason, deciding criterion, steps (when none was seen) and tokens."""
    decision = snapshot.get("last_continuation")
    usage = snapshot.get("usage")
    if isinstance(decision, dict):
        stop_reason, resolved_by = decision.get("stop_reason"), decision.get("resolved_by")
        if isinstance(stop_reason, str):
            run = replace(run, stop_reason=stop_reason)
        if isinstance(resolved_by, str):
            run = replace(run, resolved_by=resolved_by)
    count = snapshot.get("step_count")
    if isinstance(count, int) and not isinstance(count, bool) and not run.steps:
        run = replace(run, steps=_count(count))
    if isinstance(usage, dict):
        names = {"input": "prompt", "output": "completion", "total": "total"}
        tokens = {ours: usage.get(theirs) for ours, theirs in names.items()}
        counts = {name: _count(n) for name, n in tokens.items() if type(n) is int}
        if len(counts) == len(names):
            run = replace(run, tokens=counts)
    return run


def _first_user_message(snapshot: Mapping[str, Any]) -> str:
    """The text of the snapshot's first user message ("" if none): the run's input,
    for the preview of a run indexed from its stored state alone."""
    messages = snapshot.get("messages")
    for message in messages if isinstance(messages, list) else ():
        if isinstance(message, dict) and message.get("role") == "user":
            content = message.get("content")
            return content if isinstance(content, str) else ""
    return ""


@dataclass(frozen=True, slots=True)
class Trace:
    """A run's envelopes found in its channel's history (see :func:`build_trace`)."""

    envelopes: list[dict[str, Any]]
    """Every envelope of the run, decoded, oldest first."""
    entries: list[tuple[str | None, str]]
    """The ``(position, envelope JSON)`` kept within the bound."""
    trimmed: bool
    """Some were lost: the history no longer reached the run's start, or the bound
    dropped some (stream chunks first, then the oldest)."""
    first_position: str | None = None
    last_position: str | None = None


def build_trace(
    kept: Sequence[Publication], execution_id: str, max_bytes: int = TRACE_BYTES
) -> Trace:
    """The run ``execution_id``'s envelopes among ``kept`` (a channel's history, oldest
    first), with those of the runs nested in it (``payload.parent_execution_id``: a
    routed capability's inner agent), bounded to ``max_bytes``."""
    mine: list[tuple[Publication, dict[str, Any]]] = []
    runs = {execution_id}  # the run and the runs nested in it, at any depth
    for publication in kept:
        if not any(run in publication.data for run in runs):  # cheap test before decoding
            continue
        try:
            envelope = orjson.loads(publication.data)
        except orjson.JSONDecodeError:
            continue
        if not isinstance(envelope, dict):
            continue
        payload = envelope.get("payload")
        parent = payload.get("parent_execution_id") if isinstance(payload, dict) else None
        if envelope.get("execution_id") == execution_id:
            mine.append((publication, envelope))
        elif parent in runs and isinstance(envelope.get("execution_id"), str):
            runs.add(envelope["execution_id"])
            mine.append((publication, envelope))
    trimmed = False
    if mine:
        first_publication, first = mine[0]
        starts = first.get("type") == "agent.status" and (
            (first.get("payload") or {}).get("status") in _START_STATUSES
        )
        position = first_publication.position
        if not starts and first_publication is kept[0] and position and position.offset > 1:
            trimmed = True  # the channel's history was cut inside this run
    entries = [(None if p.position is None else str(p.position), p.data) for p, _ in mine]
    span = (entries[0][0], entries[-1][0]) if entries else (None, None)
    sizes = [_utf8_size(data) for _, data in entries]
    size = sum(sizes)
    if size > max_bytes:
        trimmed = True
        keep = [True] * len(entries)
        for pass_chunks in (True, False):
            for i, (_, envelope) in enumerate(mine):
                if size <= max_bytes:
                    break
                if keep[i] and (not pass_chunks or envelope.get("type") == _CHUNK):
                    keep[i] = False
                    size -= sizes[i]
        entries = [entry for entry, kept_ in zip(entries, keep, strict=True) if kept_]
    return Trace([envelope for _, envelope in mine], entries, trimmed, *span)


def _utf8_size(text: str) -> int:
    """Bytes of ``text`` in UTF-8: what the bound counts (a character may take four)."""
    return len(text) if text.isascii() else len(text.encode("utf-8", "surrogatepass"))


def encode_trace(entries: Sequence[tuple[str | None, str]], trimmed: bool) -> bytes:
    """The stored trace: the envelopes' JSON as published (not decoded again)."""
    parts = [
        b'{"position":' + orjson.dumps(position) + b',"envelope":' + data.encode() + b"}"
        for position, data in entries
    ]
    return (
        b'{"trimmed":'
        + (b"true" if trimmed else b"false")
        + b',"envelopes":['
        + (b",".join(parts))
        + b"]}"
    )


class RunRecorder:
    """Records runs into a :class:`RunIndex`; never raises (a run must not fail because
    its summary could not be written: the failure is logged).

    Args:
        index: where runs are kept.
        app_id: the app the channels belong to.
        ttl: seconds a run is kept (the state's TTL).
        trace_bytes: the bound of each run's trace.
    """

    def __init__(
        self, index: RunIndex, app_id: str, ttl: float, *, trace_bytes: int = TRACE_BYTES
    ) -> None:
        self._index = index
        self._app_id = app_id
        self._ttl = ttl
        self._trace_bytes = trace_bytes

    async def recorded(self, channel: str, execution_id: str) -> bool:
        """Whether run ``execution_id`` of ``channel`` is in the index (running or
        ended).

        Raises:
            BackendUnavailable: the index cannot be read now.
        """
        return await self._index.load_run(self._app_id, channel, execution_id) is not None

    async def started(
        self,
        channel: str,
        execution_id: str,
        *,
        input_text: str = "",
        capability: str | None = None,
        started_at: float | None = None,
    ) -> None:
        """Record a run that starts now (status ``running``)."""
        session_id, private = session_of(channel)
        summary = RunSummary(
            session_id=session_id,
            execution_id=execution_id,
            started_at=time.time() if started_at is None else started_at,
            capability=capability,
            input_preview=input_text[:PREVIEW_CHARS],
            private=private,
        )
        await self._put(channel, summary)

    async def ended(
        self,
        channel: str,
        execution_id: str,
        *,
        status: str | None = None,
        capability: str | None = None,
        error: str | None = None,
        snapshot: Mapping[str, Any] | None = None,
    ) -> None:
        """Record the end of a run from its envelopes (the final ``agent.status`` says
        how it ended; ``status``/``error`` and the run's final slim ``snapshot`` when
        none was published yet: an outside agent stores its state before its final
        status), and keep them as its trace."""
        try:
            await self._end(channel, execution_id, status, capability, error, snapshot)
        except Exception:
            log.exception("cannot record the end of run %s on %s", execution_id, channel)

    async def _end(
        self,
        channel: str,
        execution_id: str,
        status: str | None,
        capability: str | None,
        error: str | None,
        snapshot: Mapping[str, Any] | None = None,
    ) -> None:
        index, app = self._index, self._app_id
        stored = await index.load_run(app, channel, execution_id)
        session_id, private = session_of(channel)
        base = RunSummary(session_id, execution_id, time.time(), private=private)
        if stored is not None:
            base = RunSummary.from_json(stored)
        found = build_trace(await index.kept(app, channel), execution_id, self._trace_bytes)
        envelopes, entries, trimmed = found.envelopes, found.entries, found.trimmed
        if stored is None and envelopes:
            begun = _seconds(envelopes[0].get("timestamp"))
            base = replace(base, started_at=begun or base.started_at)
        summary = summarize(base, envelopes)
        if summary.status == "running":
            if snapshot is not None:
                summary = from_snapshot(summary, snapshot)
            final: Status = "failed" if status == "failed" else "completed"
            summary = replace(
                summary, status=final, ended_at=time.time(), error=_clip(error, MESSAGE_CHARS)
            )
        if snapshot is not None and not summary.input_preview:
            # Indexed from its stored state alone (no start record): its input.
            preview = _first_user_message(snapshot)[:PREVIEW_CHARS]
            summary = replace(summary, input_preview=preview)
        if capability is not None:
            summary = replace(summary, capability=capability)
        if entries:
            summary = replace(
                summary, first_position=found.first_position, last_position=found.last_position
            )
        had_trace = await index.load_trace(app, channel, execution_id) is not None
        if entries or not had_trace:
            trace = encode_trace(entries, trimmed or (stored is not None and not entries))
            await index.put_trace(app, channel, execution_id, trace, self._ttl)
        await self._put(channel, summary)

    async def _put(self, channel: str, summary: RunSummary) -> None:
        try:
            await self._index.put_run(
                self._app_id,
                channel,
                summary.execution_id,
                int(summary.started_at * 1000),
                summary.to_json(),
                self._ttl,
            )
        except Exception:
            log.exception("cannot index run %s on %s", summary.execution_id, channel)
