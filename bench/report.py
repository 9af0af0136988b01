"""The readable part of a bench run: tables with ratios to the references, and the
issue's targets checked against one run's figures."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

__all__ = ["Target", "noise", "ratio", "table", "targets"]

Result = dict[str, Any]
REFS = ("websockets", "socketio")
OURS = "broadcaster"
# Scenarios compared with other references than REFS.
_SCENARIO_REFS: dict[str, tuple[str, ...]] = {"http": ("uvicorn",), "agentside": ()}


def _find(results: Sequence[Result], server: str, scenario: str) -> Result | None:
    for r in results:
        if r.get("server") == server and r.get("scenario") == scenario and "error" not in r:
            return r
    return None


def _get(result: Result | None, key: str) -> Any:
    if result is None:
        return None
    value: Any = result
    for part in key.split("."):
        value = value.get(part) if isinstance(value, dict) else None
    return value


def ratio(results: Sequence[Result], scenario: str, key: str, ref: str) -> float | None:
    """Our ``key`` divided by reference ``ref``'s, in ``scenario``; None if either is missing."""
    ours, theirs = (
        _get(_find(results, OURS, scenario), key),
        _get(_find(results, ref, scenario), key),
    )
    if not isinstance(ours, int | float) or not isinstance(theirs, int | float) or not theirs:
        return None
    return round(ours / theirs, 2)


# Per scenario: the columns shown, as (heading, key); the first is the one compared.
_COLUMNS: dict[str, list[tuple[str, str]]] = {
    "fanout": [
        ("CPU us/msg", "server_cpu_us_per_msg"),
        ("msgs/s", "msgs_per_s"),
        ("server CPU%", "server_cpu_pct"),
        ("loadgen CPU%", "loadgen_cpu_pct"),
        ("lost", "lost"),
        ("reordered", "out_of_order"),
    ],
    "latency": [
        ("p99 ms", "latency_ms.p99"),
        ("p50 ms", "latency_ms.p50"),
        ("max ms", "latency_ms.max"),
        ("CPU us/msg", "server_cpu_us_per_msg"),
        ("loadgen CPU%", "loadgen_cpu_pct"),
        ("lost", "lost"),
        ("reordered", "out_of_order"),
    ],
    "channels": [
        ("CPU us/msg", "server_cpu_us_per_msg"),
        ("msgs/s", "msgs_per_s"),
        ("published/s", "publish_rate_achieved"),
        ("p50 ms", "latency_ms.p50"),
        ("p99 ms", "latency_ms.p99"),
        ("server CPU%", "server_cpu_pct"),
        ("publisher CPU%", "publisher_cpu_pct"),
        ("lost", "lost"),
        ("reordered", "out_of_order"),
    ],
    "idle": [
        ("KB/conn", "rss_kb_per_conn"),
        ("connections", "connections"),
        ("KB/conn subscribed", "rss_kb_per_conn_subscribed"),
        ("connects/s", "connect_per_s"),
        ("CPU us/connect", "server_cpu_us_per_connect"),
        ("CPU us/subscribe", "server_cpu_us_per_subscribe"),
    ],
    "agents": [
        ("CPU us/envelope", "server_cpu_us_per_envelope"),
        ("sessions/core", "sessions_per_core"),
        ("sessions/worker core", "sessions_per_worker_core"),
        ("capacity", "capacity_sessions"),
        ("at sessions", "at_sessions"),
        ("p50 ms", "latency_ms.p50"),
        ("p99 ms", "latency_ms.p99"),
        ("publish-side p99", "publish_side_ms.p99"),
        ("publisher us/envelope", "publisher_cpu_us_per_envelope"),
        ("server CPU%", "server_cpu_pct"),
        ("lost", "lost"),
    ],
    "agentside": [
        ("worker CPU us/envelope", "cpu_us_per_envelope"),
        ("floor us/envelope", "floor_cpu_us_per_envelope"),
        ("x floor", "floor_ratio"),
        ("sessions/worker core", "sessions_per_worker_core"),
        ("floor sessions/worker core", "floor_sessions_per_worker_core"),
        ("envelopes/round trip", "envelopes_per_round_trip"),
        ("sessions", "sessions"),
        ("lost", "lost"),
    ],
    "http": [
        ("CPU us/req", "single_server_cpu_us_per_request"),
        ("single req/s", "single_requests_per_s"),
        ("p99 ms", "single_request_ms.p99"),
        ("batch events/s", "batch_events_per_s"),
        ("CPU us/event", "batch_server_cpu_us_per_event"),
        ("batch CPU us/req", "batch_server_cpu_us_per_request"),
        ("client CPU%", "single_client_cpu_pct"),
        ("lost", "lost"),
        ("reordered", "out_of_order"),
    ],
}
_LABELS = {"broadcaster": "agent-broadcaster", "websockets": "websockets (ref)"}
_LABELS["socketio"] = "socket.io (ref)"
_LABELS["uvicorn"] = "bare uvicorn (ref)"
_SHORT = {"websockets": "websockets", "socketio": "socket.io", "uvicorn": "uvicorn"}


def _scenario_layout(scenario: str) -> tuple[list[tuple[str, str]], tuple[str, ...]]:
    """A scenario's columns and references (those of bench/nodes.py live there)."""
    from bench import nodes  # bench.nodes imports this module's Target (lazily)

    if scenario in nodes.SCENARIOS:
        return nodes.COLUMNS[scenario], nodes.REFS[scenario]
    return _COLUMNS.get(scenario, []), _SCENARIO_REFS.get(scenario, REFS)


def _label(server: str) -> str:
    return _LABELS.get(server, server)


def _fmt(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.3g}" if abs(value) < 100 else f"{value:,.0f}"
    if isinstance(value, int):
        return f"{value:,}"
    return str(value)


def table(results: Sequence[Result]) -> str:
    """Plain-text tables, one per scenario, with our figure as a ratio to each reference."""
    out: list[str] = []
    scenarios = list(dict.fromkeys(r["scenario"] for r in results))
    for scenario in scenarios:
        columns, refs = _scenario_layout(scenario)
        rows = [r for r in results if r["scenario"] == scenario]
        head = ["server", *(h for h, _ in columns), *(f"x {_SHORT[ref]}" for ref in refs)]
        body: list[list[str]] = []
        for r in rows:
            if "error" in r:
                body.append([_label(r["server"]), f"FAILED: {r['error'][:60]}"])
                continue
            cells = [_label(r["server"])]
            cells += [_fmt(_get(r, key)) for _, key in columns]
            if r["server"] == OURS and columns:
                key = columns[0][1]
                cells += [_fmt(ratio(results, scenario, key, ref)) for ref in refs]
            else:
                cells += [""] * len(refs)
            body.append(cells)
        widths = [
            max(len(row[i]) for row in [head, *body] if i < len(row)) for i in range(len(head))
        ]
        out.append(f"== {scenario}")
        for row in [head, *body]:
            out.append(
                "  ".join(
                    c.rjust(w) if i else c.ljust(w)
                    for i, (c, w) in enumerate(zip(row, widths, strict=False))
                )
            )
        out.append("")
    return "\n".join(out)


@dataclass(frozen=True)
class Target:
    name: str
    passed: bool | None  # None: not measured in this run
    detail: str

    def line(self) -> str:
        mark = {True: "PASS", False: "FAIL", None: "n/a "}[self.passed]
        return f"[{mark}] {self.name}: {self.detail}"


def _check(name: str, values: Sequence[Any], test: Callable[..., bool], detail: str) -> Target:
    if any(v is None for v in values):
        return Target(name, None, "not measured in this run")
    return Target(name, test(*values), detail.format(*values))


def targets(results: Sequence[Result]) -> list[Target]:
    """Issue 8's targets and issue 17's HTTP publish targets, each from this run's
    figures."""
    cpu = "server_cpu_us_per_msg"
    found = []
    found.append(
        _check(
            "(a) fan-out CPU <= 0.5x plain websockets",
            [ratio(results, "fanout", cpu, "websockets")],
            lambda r: r <= 0.5,
            "{}x",
        )
    )
    found.append(
        _check(
            "(a) fan-out CPU below Node socket.io",
            [ratio(results, "fanout", cpu, "socketio")],
            lambda r: r < 1,
            "{}x",
        )
    )
    ours_p99 = _get(_find(results, OURS, "latency"), "latency_ms.p99")
    refs_p99 = [_get(_find(results, ref, "latency"), "latency_ms.p99") for ref in REFS]
    refs_p99 = [p for p in refs_p99 if p is not None]
    found.append(
        _check(
            "(b) p99 latency at 100 x 200 msg/s <= 10 ms and no worse than the references",
            [ours_p99, min(refs_p99) if refs_p99 else None],
            lambda ours, best: ours <= 10 and ours <= best,
            "{} ms (best reference {} ms)",
        )
    )
    found.append(
        _check(
            "(c) RSS per idle connection <= 12 KB",
            [_get(_find(results, OURS, "idle"), "rss_kb_per_conn")],
            lambda kb: kb <= 12,
            "{} KB",
        )
    )
    found += _channels_targets(results)
    found.append(_scale_target(results))
    found.append(
        _check(
            "(e) signed HTTP publish CPU per request <= 2x a bare uvicorn endpoint",
            [ratio(results, "http", "single_server_cpu_us_per_request", "uvicorn")],
            lambda r: r <= 2,
            "{}x",
        )
    )
    found.append(
        _check(
            "(e) HTTP batch of 10: server CPU per event <= 40 us",
            [_get(_find(results, OURS, "http"), "batch_server_cpu_us_per_event")],
            lambda us: us <= 40,
            "{} us",
        )
    )
    found += _agentside_targets(results)
    from bench.nodes import targets as nodes_targets

    found += nodes_targets(results)
    bad = [
        f"{r['server']}/{r['scenario']}: lost {r.get('lost')}, reordered {r.get('out_of_order')}"
        for r in results
        if "error" not in r and (r.get("lost") or r.get("out_of_order") or r.get("wrong_channel"))
    ]
    measured = [r for r in results if "error" not in r]
    found.append(
        Target(
            "(d) no lost or reordered message in any scenario",
            (not bad) if measured else None,
            "; ".join(bad) if bad else f"{len(measured)} runs clean",
        )
    )
    return found


def _agentside_targets(results: Sequence[Result]) -> list[Target]:
    """Issue 33's agent side: the product's publishing processes against the minimal
    publisher written in the bench, same envelopes at the same pace, in one run."""
    ours = _find(results, OURS, "agentside")
    return [
        _check(
            "(33) agent side: worker CPU per envelope <= 2x a hand-written publisher",
            [_get(ours, "floor_ratio"), _get(ours, "cpu_us_per_envelope")],
            lambda r, _us: r <= 2,
            "{}x ({} us per envelope)",
        ),
        _check(
            "(33) agent side: every envelope in its channel's history",
            [_get(ours, "lost"), _get(ours, "product.in_history"), _get(ours, "floor.in_history")],
            lambda lost, _p, _f: lost == 0,
            "lost {}; {} (product) and {} (floor) history entries",
        ),
    ]


def _channels_targets(results: Sequence[Result]) -> list[Target]:
    """Issue 17's many-channels targets, at the same paced rate for every server."""
    ours = _find(results, OURS, "channels")
    paced = ours is not None and ours.get("publish_rate") is not None
    rate = f"{ours['publish_rate']:,} msg/s" if ours is not None and paced else "equal rate"
    name = f"(17) 1,000 channels at {rate}"
    cpu = ratio(results, "channels", "server_cpu_us_per_msg", "socketio") if paced else None
    history = _get(ours, "history_len") if paced else None
    return [
        _check(
            f"{name}: CPU per delivered msg <= 0.5x socket.io (issue 33)",
            [cpu],
            lambda r: r <= 0.5,
            "{}x",
        ),
        _check(
            f"{name}: p99 <= 10 ms",
            [_get(ours, "latency_ms.p99") if paced else None],
            lambda p99: p99 <= 10,
            "{} ms",
        ),
        _check(
            f"{name}: nothing lost, history and positions on",
            [_get(ours, "lost") if paced else None, history],
            lambda lost, entries: lost == 0 and entries > 0,
            "lost {}, {} history entries in one channel",
        ),
    ]


def _scale_target(results: Sequence[Result]) -> Target:
    """Issue 17's scale figure: 50,000 idle connections on one node, against socket.io."""
    ours = _find(results, OURS, "idle")
    name = "(17) 50,000 idle connections on one node"
    if ours is None or ours.get("connections_wanted", 0) < 50_000:
        return Target(name, None, "not measured in this run (fewer connections asked for)")
    kb = ratio(results, "idle", "rss_kb_per_conn", "socketio")
    rate = ratio(results, "idle", "connect_per_s", "socketio")
    detail = (
        f"{ours['connections']:,} connected, {ours['rss_kb_per_conn']} KB each "
        f"({kb}x socket.io), {ours['connect_per_s']:,} connects/s ({rate}x socket.io)"
    )
    if ours.get("connections", 0) < ours.get("connections_wanted", 0):
        detail += f"; the open-file limit ({ours.get('server_fd_limit')}) allowed no more"
    clean = not ours.get("subscribe_failed") and not ours.get("unexpected_closes")
    return Target(name, ours["connections"] >= 50_000 and clean, detail)


def noise(results: Sequence[Result], limit: float = 25) -> list[str]:
    """Warnings for runs during which other processes used more than ``limit`` % CPU."""
    return [
        f"warning: {r['server']}/{r['scenario']}: other processes used {r['other_cpu_pct']}% "
        "CPU meanwhile; its figures are skewed (rerun on a quiet machine)"
        for r in results
        if (r.get("other_cpu_pct") or 0) > limit
    ]
