"""``python -m bench`` (what ``scripts/bench`` runs): every scenario against our server and
the references, in sequence, one JSON line per run, then tables and the targets.

Examples::

    scripts/bench                                  # everything (about 20 minutes)
    scripts/bench --quick                          # smaller and shorter (about 2 minutes)
    scripts/bench --scenarios fanout --servers broadcaster,websockets
    scripts/bench --scenarios fanout --clients 5 --messages 200   # the smoke test's run
    scripts/bench --scenarios agents --agent-sessions 50,100 --servers broadcaster
    scripts/bench --scenarios nodes,nodes-cluster --servers socketio,broadcaster \
        --nodes-connections 60000 --nodes 4
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import platform
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from bench import report
from bench._proc import REPO, ChildFailed, machine_busy_seconds, raise_fd_limit
from bench.profile import summary
from bench.scenarios import FULL, QUICK, SCENARIO_NAMES, Sizes, run_scenario
from bench.servers import SERVERS

RESULTS = REPO / "bench" / "results"


def _parse(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="scripts/bench",
        description="Measure agent-broadcaster against the plain-websockets and Node "
        "socket.io references (issue 8).",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog=__doc__.split("::", 1)[1] if __doc__ else None,
    )
    parser.add_argument("--quick", action="store_true", help="smaller, shorter scenarios")
    parser.add_argument(
        "--scenarios",
        default=",".join(SCENARIO_NAMES),
        help=f"comma-separated, from {','.join(SCENARIO_NAMES)} [all]",
    )
    parser.add_argument(
        "--servers",
        default="websockets,socketio,uvicorn,broadcaster",
        help=f"comma-separated, from {','.join(SERVERS)} [all]",
    )
    parser.add_argument("--clients", type=int, help="subscribers in fanout/latency [100]")
    parser.add_argument("--messages", type=int, help="publish exactly N (fanout/channels)")
    parser.add_argument("--duration", type=float, help="seconds of publishing [5]")
    parser.add_argument("--channels", type=int, help="channels (and clients) in 'channels'")
    parser.add_argument(
        "--channels-rate",
        type=int,
        help="publications/s in 'channels', equal for every server; 0: maximum rate [4000]",
    )
    parser.add_argument("--window", type=int, help="messages in flight at maximum rate [20000]")
    parser.add_argument("--idle", type=int, help="connections in 'idle' [50000]")
    parser.add_argument(
        "--agent-sessions",
        help="comma-separated session counts stepped in 'agents' [50,100,200,400,800,1600]",
    )
    parser.add_argument(
        "--agent-duration", type=float, help="seconds each agent session streams [5]"
    )
    parser.add_argument(
        "--agentside-sessions", type=int, help="sessions in 'agentside' (each side) [50]"
    )
    parser.add_argument(
        "--agentside-duration", type=float, help="seconds each 'agentside' session streams [5]"
    )
    parser.add_argument(
        "--nodes-connections",
        type=int,
        help="connections over all nodes in 'nodes' and 'nodes-cluster' [60000]",
    )
    parser.add_argument("--nodes", type=int, help="server nodes in 'nodes', 'nodes-cluster' [4]")
    parser.add_argument("--out", type=Path, help="results file [bench/results/<time>.json]")
    parser.add_argument(
        "--profile",
        action="store_true",
        help="sample the Python servers with py-spy (bench/results/profile-*.txt); "
        "profiled figures are not comparable",
    )
    parser.add_argument("--no-save", action="store_true", help="do not write a results file")
    args = parser.parse_args(argv)
    for name, known in (("scenarios", SCENARIO_NAMES), ("servers", SERVERS)):
        chosen = [s for s in getattr(args, name).split(",") if s]
        unknown = [s for s in chosen if s not in known]
        if unknown or not chosen:
            parser.error(f"--{name}: unknown {unknown or 'empty'}; choose from {','.join(known)}")
        setattr(args, name, chosen)
    if args.agent_sessions is not None:
        try:
            args.agent_sessions = tuple(int(n) for n in args.agent_sessions.split(","))
        except ValueError:
            args.agent_sessions = ()
        if not args.agent_sessions or min(args.agent_sessions) < 1:
            parser.error("--agent-sessions: comma-separated positive counts, e.g. 50,100,200")
    return args


def _sizes(args: argparse.Namespace) -> Sizes:
    sizes = QUICK if args.quick else FULL
    changes = {
        "clients": args.clients,
        "messages": args.messages,
        "duration": args.duration,
        "channels": args.channels,
        "channels_rate": args.channels_rate,
        "idle": args.idle,
        "window": args.window,
        "agents": args.agent_sessions,
        "agents_duration": args.agent_duration,
        "agentside": args.agentside_sessions,
        "agentside_duration": args.agentside_duration,
        "nodes_connections": args.nodes_connections,
        "nodes": args.nodes,
    }
    return dataclasses.replace(sizes, **{k: v for k, v in changes.items() if v is not None})


def _busy_now(seconds: float = 1) -> float:
    """Percent of all CPUs busy over the next ``seconds``."""
    import os

    before = machine_busy_seconds()
    time.sleep(seconds)
    return 100 * (machine_busy_seconds() - before) / seconds / (os.cpu_count() or 1)


def _version(argv: list[str]) -> str:
    try:
        out = subprocess.run(argv, capture_output=True, text=True, timeout=10, check=False)
    except OSError:
        return "missing"
    return (out.stdout or out.stderr).strip().splitlines()[0] if (out.stdout or out.stderr) else "?"


def _node_version(package: str) -> str:
    path = REPO / "bench" / "node" / "node_modules" / package / "package.json"
    try:
        return str(json.loads(path.read_text())["version"])
    except (OSError, ValueError, KeyError):
        return "missing"


def machine() -> dict[str, Any]:
    """What the figures were measured on."""
    import os
    from importlib.metadata import version

    model = "?"
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            model = line.split(":", 1)[1].strip()
            break
    mem_kb = int(Path("/proc/meminfo").read_text().split()[1])
    return {
        "cpus": os.cpu_count(),
        "cpu_model": model,
        "memory_gb": round(mem_kb / 1024 / 1024, 1),
        "kernel": platform.release(),
        "python": platform.python_version(),
        "node": _version(["node", "--version"]),
        "redis": _version(["redis-server", "--version"]),
        "packages": {
            name: version(name) for name in ("uvicorn", "websockets", "redis", "starlette")
        }
        | {
            "socket.io": _node_version("socket.io"),
            "@socket.io/redis-adapter": _node_version("@socket.io/redis-adapter"),
            "ws": _node_version("ws"),
        },
    }


async def _run(args: argparse.Namespace, sizes: Sizes) -> list[dict[str, Any]]:
    results: list[dict[str, Any]] = []
    for scenario in args.scenarios:
        for name in args.servers:
            started = time.monotonic()
            try:
                profile_dir = RESULTS if args.profile else None
                result = await run_scenario(SERVERS[name], scenario, sizes, profile_dir)
            except ChildFailed as exc:
                result = {"server": name, "scenario": scenario, "error": str(exc)}
            if result is None:
                continue
            result["run_seconds"] = round(time.monotonic() - started, 1)
            results.append(result)
            print(json.dumps(result), flush=True)
    return results


def main(argv: list[str] | None = None) -> int:
    """Run the bench; 0 when every run completed, 1 when one failed."""
    argv = sys.argv[1:] if argv is None else argv
    if "--run-index" in argv:  # the run index's list in server time (bench/run_index.py)
        from bench import run_index

        return run_index.main([a for a in argv if a != "--run-index"])
    if "--list-pollers" in argv:  # /up with and without run-list pollers (bench/list_pollers.py)
        from bench import list_pollers

        return list_pollers.main([a for a in argv if a != "--list-pollers"])
    if "--shards" in argv:  # 1 vs 3 Redis Cluster shards, our server only (bench/shards.py)
        from bench import shards

        return shards.main([a for a in argv if a != "--shards"])
    args = _parse(argv)
    for tool in ("node", "redis-server"):
        if shutil.which(tool) is None:
            sys.exit(f"scripts/bench: {tool} is missing (scripts/install --test installs it)")
    if not (REPO / "bench" / "node" / "node_modules").is_dir():
        sys.exit("scripts/bench: bench/node/node_modules is missing: run scripts/install --test")
    sizes = _sizes(args)
    raise_fd_limit(2 * sizes.idle + 1024)
    busy = _busy_now()
    if busy > 20:
        print(f"warning: the machine is {busy:.0f}% busy before the bench starts", file=sys.stderr)
    started = time.monotonic()
    results = asyncio.run(_run(args, sizes))
    checked = report.targets(results)
    print()
    print(report.table(results))
    for target in checked:
        print(target.line())
    for warning in report.noise(results):
        print(warning)
    for result in results:
        if "profile" in result:
            print()
            print(summary(REPO / result["profile"]))
    print(f"\n{len(results)} runs in {time.monotonic() - started:.0f} s")
    if not args.no_save:
        out = args.out or RESULTS / time.strftime("bench-%Y%m%d-%H%M%S.json")
        out.parent.mkdir(parents=True, exist_ok=True)
        document = {
            "machine": machine(),
            "sizes": dataclasses.asdict(sizes),
            "results": results,
            "targets": [dataclasses.asdict(t) for t in checked],
        }
        out.write_text(json.dumps(document, indent=2) + "\n")
        print(f"results: {out.relative_to(REPO) if out.is_relative_to(REPO) else out}")
    return 1 if any("error" in r for r in results) else 0


if __name__ == "__main__":
    sys.exit(main())
