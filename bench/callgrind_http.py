"""Instructions per signed HTTP publish, counted by callgrind: ours against bare uvicorn.

A deterministic counterpart of the ``http`` scenario's single half (issue 33, part 2),
which on a shared machine varies from run to run: for each server, a private
``redis-server`` on a free port, the server under ``valgrind --tool=callgrind`` with
instrumentation off while it starts, then

1. for our server, one WebSocket subscriber on the channel (every event is delivered
   to it, as in the bench);
2. ``--warmup`` signed single-event publishes (``POST /apps/bench/events``, signed as
   the Pusher server SDKs sign, a 300-byte ``agent.stream.chunk`` envelope each) over
   one keep-alive HTTP connection, one at a time;
3. instrumentation on (``callgrind_control -i on``), then ``--rounds`` rounds of
   ``--requests`` more publishes in the same way, each counted on its own (counters
   zeroed with ``callgrind_control -z`` before, dumped with ``-d`` after): the least
   round's instructions divided by its requests (the backend's heartbeat, every 10 s,
   falls in one round or none).

Each request waits for its answer, and for ours for the delivery to the subscriber,
before the next one is sent: every request is alone in its wake-ups, the worst case for
per-request fixed costs (the bench's slower runs). ``PYTHONHASHSEED`` is fixed.

What runs by the clock meanwhile (uvicorn's ticks, the node's sweeps, the backend's
readiness probe every second) is counted too, and under valgrind a request takes
milliseconds: as many rounds of ``--idle`` seconds at rest after them give the server's
instructions per second with nothing to do (the least), and
``net_instructions_per_request`` takes them out (the requests' own cost, which is what
a busy server pays per request).

The bare uvicorn reference (``bench/ref_uvicorn.py``) gets the same requests and has no
subscriber. The dumps are kept in ``--out`` for ``callgrind_annotate``.

Run from the repository (``valgrind`` installed)::

    .venv/bin/python -m bench.callgrind_http [--requests 200] [--rounds 3] [--warmup 200]
        [--idle 1] [--servers broadcaster,uvicorn] [--out /tmp/callgrind-http]

It prints one JSON line per server, then the ratios.
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import hmac
import json
import os
import shutil
import subprocess
import time
from collections.abc import Awaitable
from pathlib import Path
from typing import Any

from websockets.asyncio.client import ClientConnection, connect

from bench._redis import PrivateRedis
from bench.envelope import EVENT, envelope, session_of
from bench.servers import APP, SERVERS, start_server

__all__ = ["main", "measure"]

CHANNEL = "agent.callgrind-0"


def _signed_request(host: str, seq: int) -> bytes:
    """One signed ``POST /apps/{id}/events`` request, as the bench's load generator
    (``bench/node/httpload.js``) sends it."""
    path = f"/apps/{APP['id']}/events"
    body = json.dumps(
        {"name": EVENT, "channel": CHANNEL, "data": envelope(session_of(CHANNEL), seq)},
        separators=(",", ":"),
    ).encode()
    params = {
        "auth_key": APP["key"],
        "auth_timestamp": str(int(time.time())),
        "auth_version": "1.0",
        "body_md5": hashlib.md5(body).hexdigest(),  # the protocol's choice
    }
    query = "&".join(f"{k}={params[k]}" for k in sorted(params))
    signature = hmac.new(
        APP["secret"].encode(), f"POST\n{path}\n{query}".encode(), hashlib.sha256
    ).hexdigest()
    head = (
        f"POST {path}?{query}&auth_signature={signature} HTTP/1.1\r\n"
        f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n"
        f"Host: {host}\r\nConnection: keep-alive\r\n\r\n"
    )
    return head.encode() + body


async def _read_answer(reader: asyncio.StreamReader) -> tuple[int, bytes]:
    head = await reader.readuntil(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    status = int(lines[0].split()[1])
    length = 0
    for line in lines[1:]:
        name, _, value = line.partition(":")
        if name.strip().lower() == "content-length":
            length = int(value)
    return status, await reader.readexactly(length)


async def _subscribe(url: str) -> ClientConnection:
    ws = await connect(url, max_size=None, compression=None, ping_interval=None)
    established = json.loads(await ws.recv())
    assert established["event"] == "pusher:connection_established", established
    await ws.send(json.dumps({"event": "pusher:subscribe", "data": {"channel": CHANNEL}}))
    while True:
        message = json.loads(await ws.recv())
        if message["event"] == "pusher_internal:subscription_succeeded":
            return ws


async def _publish(
    reader: asyncio.StreamReader,
    writer: asyncio.StreamWriter,
    ws: ClientConnection | None,
    host: str,
    seqs: range,
) -> None:
    for seq in seqs:
        writer.write(_signed_request(host, seq))
        status, body = await _read_answer(reader)
        if status != 200:
            raise RuntimeError(f"publish {seq}: {status} {body[:200]!r}")
        if ws is not None:
            event = json.loads(await ws.recv())
            if event["event"] != EVENT:
                raise RuntimeError(f"publish {seq}: unexpected delivery {event!r:.200}")


def _control(pid: int, *args: str) -> None:
    subprocess.run(["callgrind_control", *args, str(pid)], check=True, capture_output=True)


def _dumps(out: Path, pid: int) -> set[Path]:
    return set(out.glob(f"callgrind.*.{pid}*"))


def _dumped_total(out: Path, pid: int, before: set[Path]) -> int:
    """The instructions of the dump that appeared in ``out`` since ``before``."""
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        new = _dumps(out, pid) - before
        for path in new:
            for line in path.read_text(errors="replace").splitlines():
                if line.startswith(("summary:", "totals:")):
                    return int(line.split()[1])
        time.sleep(0.2)
    raise RuntimeError(f"no callgrind dump of {pid} in {out}")


async def _counted(pid: int, out: Path, work: Awaitable[None]) -> tuple[int, float]:
    """The instructions of process ``pid`` while ``work`` runs, and its seconds."""
    _control(pid, "-z")
    before = _dumps(out, pid)
    started = time.monotonic()
    await work
    seconds = time.monotonic() - started
    _control(pid, "-d")
    return _dumped_total(out, pid, before), seconds


async def measure(
    name: str,
    requests: int,
    warmup: int,
    out: Path,
    rounds: int = 3,
    idle_seconds: float = 1.0,
) -> dict[str, Any]:
    """Instructions per request of server ``name`` (see the module doc): ``rounds``
    rounds of ``requests`` each, and as many of ``idle_seconds`` at rest."""
    spec = SERVERS[name]
    redis = await PrivateRedis().start()
    server = None
    counted: list[tuple[int, float]] = []
    idle: list[float] = []
    try:
        wrapper = [
            "valgrind",
            "--tool=callgrind",
            "--instr-atstart=no",
            f"--callgrind-out-file={out}/callgrind.{name}.%p",
        ]
        server = await start_server(
            spec, redis.url, within=300, wrapper=wrapper, env={"PYTHONHASHSEED": "0"}
        )
        host = server.url.removeprefix("http://")
        ws = await _subscribe(server.ws_url) if spec.subscribers else None
        reader, writer = await asyncio.open_connection(*host.rsplit(":", 1))
        try:
            await _publish(reader, writer, ws, host, range(1, warmup + 1))
            _control(server.pid, "-i", "on")
            seq = warmup
            for _ in range(rounds):
                seqs = range(seq + 1, seq + requests + 1)
                seq += requests
                work = _publish(reader, writer, ws, host, seqs)
                counted.append(await _counted(server.pid, out, work))
            for _ in range(rounds if idle_seconds else 0):
                total, seconds = await _counted(server.pid, out, asyncio.sleep(idle_seconds))
                idle.append(total / seconds)
        finally:
            writer.close()
            if ws is not None:
                await ws.close()
    finally:
        if server is not None:
            await server.child.stop(grace=60, sig=2)  # SIGINT: uvicorn's own shutdown
        await redis.stop()
    # The least of the rounds: the one that no burst by the clock (the backend's
    # heartbeat every 10 s) fell in.
    per_request = [total / requests for total, _ in counted]
    result: dict[str, Any] = {
        "server": name,
        "requests": requests * rounds,
        "instructions_per_request": round(min(per_request)),
        "rounds": [round(x) for x in per_request],
        "seconds_per_round": [round(seconds, 2) for _, seconds in counted],
    }
    if idle:
        # What the server does at rest (timers, probes), by the second: taken out, what
        # is left is the requests' own cost at any rate.
        rest = min(idle)
        net = [(total - rest * seconds) / requests for total, seconds in counted]
        result["idle_instructions_per_s"] = round(rest)
        result["net_instructions_per_request"] = round(min(net))
    return result


async def _main(args: argparse.Namespace, out: Path) -> None:
    results = {}
    for name in args.servers.split(","):
        result = await measure(name, args.requests, args.warmup, out, args.rounds, args.idle)
        results[name] = result
        print(json.dumps(result), flush=True)
    if "broadcaster" in results and "uvicorn" in results:
        for key in ("instructions_per_request", "net_instructions_per_request"):
            if key in results["uvicorn"]:
                ratio = results["broadcaster"][key] / results["uvicorn"][key]
                print(f"{key}: broadcaster / uvicorn = {ratio:.2f} (target: at most 2)")
    print(f"dumps (for callgrind_annotate): {out}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--requests", type=int, default=200, help="requests per round [200]")
    parser.add_argument("--rounds", type=int, default=3, help="measured rounds [3]")
    parser.add_argument("--warmup", type=int, default=200, help="requests before [200]")
    parser.add_argument("--servers", default="broadcaster,uvicorn")
    parser.add_argument(
        "--idle", type=float, default=1.0, help="seconds per idle round after [1; 0: none]"
    )
    parser.add_argument("--out", default="/tmp/callgrind-http", help="where the dumps go")
    args = parser.parse_args()
    if shutil.which("valgrind") is None or shutil.which("callgrind_control") is None:
        raise SystemExit("valgrind (with callgrind_control) is not installed")
    os.environ.setdefault("PYTHONHASHSEED", "0")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    asyncio.run(_main(args, out))


if __name__ == "__main__":
    main()
