"""One failover under publishing load, with accounting: SIGKILL the Redis primary that
serves a channel (a Redis Cluster primary, or the primary Sentinel names) while two
server processes deliver the channel to live WebSocket clients and a publisher keeps
publishing through the nodes' HTTP API.

Used by ``test_redis_failover.py`` (one trial per topology, asserting) and by
``scripts/failover-trials`` (many trials, figures for docs/reliability.md):
``python -m tests.reliability.failover --topology cluster --trials 20``.

What a trial checks (``Trial.silent_gaps`` lists every violation):

* each live client either stays connected and gets every accepted publication exactly
  once and in order (a retried one may repeat: at-least-once for retries), or is closed
  with 4100 and resumes from its last position (as pusher-js does): what it got before
  is in order, and its resume is ``recovered: true`` with everything, or
  ``recovered: false`` (told: it reloads its state) and it reads on in order. A primary
  that dies may have acknowledged a publication it never wrote to a node's pub/sub
  connection (Redis writes the two separately), so a node that lost its primary cannot
  vouch for the end of the old epoch: once it sees that the store changed, it closes
  the channel's clients;
* a client that left just before the kill and resumes after the failover gets every
  accepted publication it missed (``recovered: true``), or is told ``recovered: false``;
  never ``recovered: true`` with a publication missing.

It also counts what asynchronous replication lost: accepted publications from before
the kill that the promoted replica's history does not hold (read on the replica right
after the kill, before its promotion: the first publication after it starts a new
epoch and drops that history). With ``cut=True`` the
victim's replica is frozen (SIGSTOP) and its replication link cut (``CLIENT KILL TYPE
replica``) 0.3 s before the kill, and thawed right after it, so that it misses what was
accepted meanwhile: a replication lag made to happen, not waited for. With
``wait_replicas`` the nodes run the durable mode (``--redis-wait-replicas``): an
acknowledged publication must then never be lost, and those the cut replica could not
confirm are refused (``refused_unreplicated``) rather than acknowledged. The promoted
replica has no replica of its own until the killed primary comes back as one, and
until then every publication is refused: such a trial restarts the victim as soon as
the nodes are ready (``replica_back_s``), and publishing resumes after it.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import signal
import statistics
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any, Protocol

from redis.asyncio import Redis
from redis.crc import key_slot

from broadcaster.backends.redis import channel_key, decode_publication
from tests.support.live import APP_ID
from tests.support.processes import ServerProcess, _wait
from tests.support.reliability import (
    Publisher,
    Reader,
    alive,
    becomes,
    deduplicated,
    eventually,
    resume_the_closed,
    silent_gaps,
    subscribed,
)
from tests.support.topologies import ClusterTopology, ConfiguredRedis, SentinelTopology, command

__all__ = ["ClusterFaults", "Faults", "SentinelFaults", "Trial", "failover_trial"]

PREFIX = "failover"
SERVE_ARGS = ("--redis-prefix", PREFIX, "--log-level", "warning", "--history-size", "5000")


class Faults(Protocol):
    """A topology a trial can fail over and heal."""

    url: str

    def victim(self, channel: str) -> ConfiguredRedis: ...
    def replica_of(self, primary: ConfiguredRedis) -> ConfiguredRedis: ...
    async def history_on(self, replica: ConfiguredRedis, channel: str) -> list[int]: ...
    def heal(self, victim: ConfiguredRedis) -> None: ...


class ClusterFaults:
    """Fails over the primary that owns a channel's slot (``cluster-replica-validity-
    factor 0``: the replica is promoted however long its link was down)."""

    def __init__(self, cluster: ClusterTopology) -> None:
        self.cluster = cluster
        self.url = cluster.url

    def victim(self, channel: str) -> ConfiguredRedis:
        return self.cluster.owner(key_slot(channel_key(PREFIX, APP_ID, channel, "pub").encode()))

    def replica_of(self, primary: ConfiguredRedis) -> ConfiguredRedis:
        for node in self.cluster.nodes:
            if node is primary or node.proc is None or node.proc.poll() is not None:
                continue
            lines = command(node.port, "info", "replication").splitlines()
            if f"master_port:{primary.port}" in lines:
                return node
        raise LookupError(f"no replica of {primary.port}")

    async def history_on(self, replica: ConfiguredRedis, channel: str) -> list[int]:
        """The channel's history as ``replica`` holds it (a cluster replica answers
        reads after ``READONLY``)."""
        return await _history_on(replica, channel_key(PREFIX, APP_ID, channel, "stream"), True)

    def heal(self, victim: ConfiguredRedis) -> None:
        """Restart the killed node: it rejoins as the replica of the promoted one (until
        then it may still claim its old slots)."""
        victim.start()

        def replicating() -> bool:
            try:
                info = command(victim.port, "info", "replication")
            except subprocess.CalledProcessError:  # not answering yet
                return False
            return "role:slave" in info and "master_link_status:up" in info

        _wait(replicating, 60, "the killed primary to come back as a replica")
        self.cluster.wait_ok(60)


class SentinelFaults:
    """Fails over the primary Sentinel names."""

    def __init__(self, topology: SentinelTopology) -> None:
        self.topology = topology
        self.url = topology.url

    def victim(self, channel: str) -> ConfiguredRedis:
        port = self.topology.primary_port()
        nodes = (self.topology.primary, self.topology.replica)
        return next(n for n in nodes if n is not None and n.port == port)

    def replica_of(self, primary: ConfiguredRedis) -> ConfiguredRedis:
        nodes = (self.topology.primary, self.topology.replica)
        return next(n for n in nodes if n is not None and n is not primary)

    async def history_on(self, replica: ConfiguredRedis, channel: str) -> list[int]:
        """The channel's history as ``replica`` holds it."""
        return await _history_on(replica, channel_key(PREFIX, APP_ID, channel, "stream"), False)

    def heal(self, victim: ConfiguredRedis) -> None:
        """Restart the killed node (empty); Sentinel makes it a replica of the promoted
        one. Healed when it replicates and every Sentinel sees it up."""
        victim.start()
        service = self.topology.service

        def healed() -> bool:
            try:
                info = command(victim.port, "info", "replication")
                if "role:slave" not in info or "master_link_status:up" not in info:
                    return False
                for sentinel in self.topology.sentinels:
                    replicas = command(sentinel.port, "sentinel", "replicas", service)
                    if any(s in replicas for s in ("s_down", "o_down", "disconnected")):
                        return False
            except subprocess.CalledProcessError:  # not answering yet (still starting)
                return False
            return True

        _wait(healed, 60, "the killed primary to come back as a replica")


async def _history_on(replica: ConfiguredRedis, key: str, readonly: bool) -> list[int]:
    """Read a stream on ``replica`` itself; it must still be a replica (not promoted:
    then its history would no longer be the one it had at the kill)."""
    client = Redis(port=replica.port)
    try:
        if readonly:
            await client.execute_command("READONLY")  # type: ignore[no-untyped-call]
        entries: list[Any] = await client.xrange(key)  # type: ignore[assignment]
        role = (await client.info("replication"))["role"]
    finally:
        await client.aclose()
    assert role == "slave", f"the replica on port {replica.port} was promoted before it was read"
    return _seqs(entries)


def _seqs(entries: list[Any]) -> list[int]:
    return [int(str(decode_publication(fields[b"p"]).data)) for _, fields in entries]


@dataclass
class Trial:
    """The figures of one failover."""

    topology: str
    cut: bool
    wait_replicas: int = 0
    accepted: int = 0
    refused_attempts: int = 0
    refused_unreplicated: int = 0  # refused by the durable mode: no replica confirmed
    accepted_before_kill: int = 0
    lost_by_replication: int = 0  # accepted before the kill, missing from the history
    resumed_recovered: bool | None = None
    outage_s: float = 0.0  # kill -> both nodes' /ready 200 again
    replica_back_s: float = 0.0  # kill -> the victim replicates the promoted one (durable)
    receive_again_s: float = 0.0  # kill -> a publication sent after it reached every live client
    live_clients: int = 0
    closed_with_4100: int = 0  # live clients closed to resume (the store changed)
    closed_resumed_recovered: int = 0  # ... whose resume was answered recovered: true
    silent_gaps: list[str] = field(default_factory=list)


async def failover_trial(
    faults: Faults,
    nodes: Sequence[ServerProcess],
    channel: str,
    name: str,
    *,
    cut: bool = False,
    wait_replicas: int = 0,
) -> Trial:
    """Run one failover (see the module's docstring); the caller heals the topology.
    ``wait_replicas``: what the nodes were started with (for the record)."""
    trial = Trial(name, cut, wait_replicas)
    live: list[tuple[ServerProcess, Reader]] = []
    for node in nodes:
        for _ in range(2):
            live.append((node, Reader(await subscribed(node, channel)).start()))
    leaver = Reader(await subscribed(nodes[0], channel)).start()
    back: Reader | None = None
    resumed: dict[int, Reader] = {}  # live client -> its resume after a 4100
    stop = False
    publisher = Publisher([n.url for n in nodes], channel)
    pub_task = asyncio.create_task(publisher.run(lambda: stop))
    try:
        await eventually(lambda: len(publisher.accepted) >= 40, "publishing to start")
        await eventually(lambda: len(leaver.seqs) >= 20, "the leaver to read")
        await leaver.stop()
        victim = faults.victim(channel)
        replica = faults.replica_of(victim)
        if cut:  # the replica, frozen, cannot reconnect and catch up from the backlog
            assert replica.proc is not None
            replica.proc.send_signal(signal.SIGSTOP)
            command(victim.port, "client", "kill", "type", "replica")
            await asyncio.sleep(0.3)
        trial.accepted_before_kill = len(publisher.accepted)
        killed_at = time.monotonic()
        victim.kill()
        if cut:
            assert replica.proc is not None
            replica.proc.send_signal(signal.SIGCONT)
        kept = set(await faults.history_on(replica, channel))
        for node in nodes:
            await becomes(node, 503, within=20)
        for node in nodes:
            await becomes(node, 200, within=40)
        trial.outage_s = round(time.monotonic() - killed_at, 2)
        if wait_replicas:  # nothing can confirm a publication until a replica is back
            await asyncio.to_thread(faults.heal, victim)
            trial.replica_back_s = round(time.monotonic() - killed_at, 2)
        mark = len(publisher.accepted)
        await eventually(lambda: len(publisher.accepted) >= mark + 20, "publishing to resume")
        # The dead primary may have acknowledged a publication it never wrote to a node
        # (see Backend.breaks): its nodes close the channel's clients with 4100 once they
        # see that the store changed. A client closed so resumes, as pusher-js would.
        resumed = await resume_the_closed(live, channel, mark)
        back = Reader(await subscribed(nodes[1], channel, leaver.positions[-1])).start()
        await eventually(lambda: back is not None and back.resumes, "the resume's answer")
        await eventually(lambda: len(publisher.accepted) >= mark + 60, "more publications")
    finally:
        stop = True
        with contextlib.suppress(Exception):
            await pub_task
    assert back is not None
    accepted = publisher.accepted
    last = accepted[-1]
    current = [resumed.get(i, reader) for i, (_, reader) in enumerate(live)]
    with contextlib.suppress(AssertionError):  # a reader short of it is a gap, below
        await eventually(lambda: all(r.seqs and r.seqs[-1] >= last for r in [*current, back]), "")
    trial.accepted = len(accepted)
    trial.refused_attempts = publisher.refused
    trial.refused_unreplicated = publisher.unreplicated
    trial.live_clients = len(live)
    trial.closed_with_4100 = len(resumed)
    trial.closed_resumed_recovered = sum(
        1 for r in resumed.values() if r.resumes and r.resumes[0]["recovered"]
    )
    gaps = trial.silent_gaps
    for node in nodes:
        if not alive(node):
            gaps.append(f"node {node.url} exited")
    for i, (_, reader) in enumerate(live):
        again = resumed.get(i)
        found = silent_gaps(reader, again, accepted, publisher.retried)
        gaps += [f"live client {i}: {gap}" for gap in found]
        if again is not None and again.ended is not None:
            gaps.append(f"live client {i} was closed again after its resume: {again.ended}")

    answer = back.resumes[0]
    trial.resumed_recovered = bool(answer["recovered"])
    tail = deduplicated(back.seqs, publisher.retried)
    if answer["recovered"]:
        seen = deduplicated(leaver.seqs + back.seqs, publisher.retried)
        if seen != accepted:
            missing = sorted(set(accepted) - set(seen))
            gaps.append(f"resume said recovered: true but missed {missing[:10]}")
    elif not tail or tail != accepted[accepted.index(tail[0]) :]:
        gaps.append(f"after recovered: false the resumed client did not read on: {tail[:5]}")

    before = accepted[: trial.accepted_before_kill]
    trial.lost_by_replication = sum(1 for seq in before if seq not in kept)

    after_kill = [t > killed_at for t in publisher.sent_at]
    firsts = [_first_after(r, after_kill) for r in current]
    if all(t is not None for t in firsts):
        trial.receive_again_s = round(max(t for t in firsts if t is not None) - killed_at, 2)
    for reader in [*(r for _, r in live), *resumed.values(), back]:
        await reader.stop()
    return trial


def _first_after(reader: Reader, after_kill: list[bool]) -> float | None:
    """When ``reader`` first got a publication accepted after the kill."""
    for seq, at in zip(reader.seqs, reader.times, strict=True):
        if seq < len(after_kill) and after_kill[seq]:
            return at
    return None


# -- scripts/failover-trials ------------------------------------------------------------


async def _trials(topology: str, count: int, cut: bool, wait_replicas: int = 0) -> list[Trial]:
    faults: ClusterFaults | SentinelFaults
    if topology == "cluster":
        cluster = ClusterTopology().start()
        stop_topology = cluster.stop
        faults = ClusterFaults(cluster)
    else:
        sentinel = SentinelTopology().start()
        stop_topology = sentinel.stop
        faults = SentinelFaults(sentinel)
    nodes: list[ServerProcess] = []
    trials: list[Trial] = []
    try:
        for _ in range(2):
            durable = ("--redis-wait-replicas", str(wait_replicas))
            nodes.append(ServerProcess(("--backend", faults.url, *SERVE_ARGS, *durable)).start())
        for node in nodes:
            node.wait_ready()
        for i in range(count):
            channel = f"agent.trial-{i}-{time.monotonic_ns()}"
            victim = faults.victim(channel)
            trial = await failover_trial(
                faults, nodes, channel, topology, cut=cut, wait_replicas=wait_replicas
            )
            trials.append(trial)
            print(json.dumps(asdict(trial)), flush=True)
            for node in nodes:  # what the nodes said about channels that missed something
                for line in node.output if trial.silent_gaps else ():
                    if "missed" in line:
                        print(f"{node.url}: {line.strip()}", file=sys.stderr)
                node.output.clear()
            if not wait_replicas:  # else healed during the trial
                faults.heal(victim)
            for node in nodes:
                await becomes(node, 200, within=40)
    finally:
        for node in nodes:
            node.stop()
        stop_topology()
    return trials


def summary(trials: Sequence[Trial]) -> dict[str, Any]:
    """The figures of a series of trials (docs/reliability.md)."""
    outages = [t.outage_s for t in trials]
    again = [t.receive_again_s for t in trials]
    return {
        "topology": trials[0].topology,
        "cut_replication": trials[0].cut,
        "wait_replicas": trials[0].wait_replicas,
        "trials": len(trials),
        "accepted": sum(t.accepted for t in trials),
        "refused_attempts": sum(t.refused_attempts for t in trials),
        "refused_unreplicated": sum(t.refused_unreplicated for t in trials),
        "lost_by_replication": sum(t.lost_by_replication for t in trials),
        "trials_with_loss": sum(1 for t in trials if t.lost_by_replication),
        "resumes_not_recovered": sum(1 for t in trials if t.resumed_recovered is False),
        "live_clients": sum(t.live_clients for t in trials),
        "closed_with_4100": sum(t.closed_with_4100 for t in trials),
        "closed_resumed_recovered": sum(t.closed_resumed_recovered for t in trials),
        "silent_gaps": sum(len(t.silent_gaps) for t in trials),
        "outage_s": {"median": statistics.median(outages), "max": max(outages)},
        "receive_again_s": {"median": statistics.median(again), "max": max(again)},
    }


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else "")
    parser.add_argument("--topology", choices=("cluster", "sentinel"), required=True)
    parser.add_argument("--trials", type=int, default=20)
    parser.add_argument(
        "--cut", action="store_true", help="cut the replication link 0.3 s before each kill"
    )
    parser.add_argument(
        "--wait-replicas",
        type=int,
        default=0,
        help="run the nodes in the durable mode (--redis-wait-replicas N)",
    )
    args = parser.parse_args(argv)
    trials = asyncio.run(_trials(args.topology, args.trials, args.cut, args.wait_replicas))
    result = summary(trials)
    print(json.dumps({"summary": result}), flush=True)
    for trial in trials:
        for gap in trial.silent_gaps:
            print(f"SILENT GAP ({trial.topology}): {gap}", file=sys.stderr)
    return 1 if result["silent_gaps"] else 0


if __name__ == "__main__":
    raise SystemExit(main())
