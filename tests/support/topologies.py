"""Real Redis topologies for tests: a 3-primary/3-replica Redis Cluster and a primary +
replica watched by 3 Sentinels, on free ports, waited for by readiness signals."""

from __future__ import annotations

import random
import socket
import subprocess
import time
from pathlib import Path

from tests.support.processes import RedisServer, _wait, free_port, require_binary


class ConfiguredRedis(RedisServer):
    """A private ``redis-server`` started with extra arguments (cluster mode,
    replication, or ``--sentinel`` with a generated config file)."""

    def __init__(
        self, extra: list[str], *, sentinel: bool = False, port: int | None = None
    ) -> None:
        super().__init__(port)
        self.extra = extra
        self.sentinel = sentinel

    def start(self) -> ConfiguredRedis:
        args = [self.binary]
        if self.sentinel:
            conf = Path(self.dir) / "sentinel.conf"
            conf.write_text("\n".join(self.extra) + "\n")
            args += [str(conf), "--sentinel", "--port", str(self.port), "--bind", "127.0.0.1"]
            args += ["--dir", self.dir, "--logfile", ""]
        else:
            args += ["--port", str(self.port), "--bind", "127.0.0.1", "--save", ""]
            args += ["--appendonly", "no", "--dir", self.dir, "--logfile", "", *self.extra]
        self.proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        _wait(self._answers, 10, f"redis-server on port {self.port}")
        return self


def command(port: int, *args: str) -> str:
    """One command through ``redis-cli`` (for set-up and inspection only)."""
    cli = require_binary("redis-cli")
    out = subprocess.run(
        [cli, "-h", "127.0.0.1", "-p", str(port), *args],
        capture_output=True,
        text=True,
        timeout=30,
        check=True,
    )
    return out.stdout


def cluster_port() -> int:
    """A free port P below 55536 whose cluster bus port P + 10000 is free too."""
    for _ in range(1000):
        port = random.randrange(20000, 55000)
        if all(_free(p) for p in (port, port + 10000)):
            return port
    raise RuntimeError("no free port pair for a cluster node")


def _free(port: int) -> bool:
    with socket.socket() as sock:
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


class ClusterTopology:
    """Six ``redis-server --cluster-enabled yes`` joined by ``redis-cli --cluster create
    --cluster-replicas 1``: three primaries, each with one replica."""

    def __init__(self, node_timeout_ms: int = 1000) -> None:
        self.node_timeout_ms = node_timeout_ms
        self.nodes: list[ConfiguredRedis] = []

    @property
    def url(self) -> str:
        seeds = ",".join(f"127.0.0.1:{n.port}" for n in self.nodes[:3])
        return f"redis-cluster://{seeds}/"

    def start(self) -> ClusterTopology:
        for _ in range(6):
            extra = ["--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf"]
            extra += ["--cluster-node-timeout", str(self.node_timeout_ms)]
            extra += ["--cluster-replica-validity-factor", "0"]
            self.nodes.append(ConfiguredRedis(extra, port=cluster_port()).start())
        cli = require_binary("redis-cli")
        addresses = [f"127.0.0.1:{n.port}" for n in self.nodes]
        subprocess.run(
            [cli, "--cluster", "create", *addresses, "--cluster-replicas", "1", "--cluster-yes"],
            capture_output=True,
            timeout=60,
            check=True,
        )
        _wait(self._converged, 30, "the Redis Cluster to be ok on every node")
        return self

    def _converged(self) -> bool:
        for node in self.nodes:
            if node.proc is None or node.proc.poll() is not None:
                continue
            info = command(node.port, "cluster", "info")
            if "cluster_state:ok" not in info or "cluster_slots_ok:16384" not in info:
                return False
            replication = command(node.port, "info", "replication")
            if "role:slave" in replication and "master_link_status:up" not in replication:
                return False
        return True

    def primaries(self) -> list[ConfiguredRedis]:
        """The nodes that are primaries now."""
        alive = [n for n in self.nodes if n.proc is not None and n.proc.poll() is None]
        return [n for n in alive if "role:master" in command(n.port, "info", "replication")]

    def owner(self, slot: int) -> ConfiguredRedis:
        """The primary serving ``slot`` now."""
        for node in self.primaries():
            for line in command(node.port, "cluster", "nodes").splitlines():
                fields = line.split()
                if "myself" not in fields[2]:
                    continue
                for part in fields[8:]:
                    low, _, high = part.partition("-")
                    if low.isdigit() and int(low) <= slot <= int(high or low):
                        return node
        raise LookupError(f"no primary serves slot {slot}")

    def move_slot(self, slot: int, target: ConfiguredRedis) -> None:
        """Migrate ``slot`` (and its keys) to the primary ``target``, as
        ``redis-cli --cluster reshard`` does."""
        source = self.owner(slot)
        src_id = command(source.port, "cluster", "myid").strip()
        dst_id = command(target.port, "cluster", "myid").strip()
        command(target.port, "cluster", "setslot", str(slot), "importing", src_id)
        command(source.port, "cluster", "setslot", str(slot), "migrating", dst_id)
        while keys := command(source.port, "cluster", "getkeysinslot", str(slot), "100").split():
            port = str(target.port)
            command(source.port, "migrate", "127.0.0.1", port, "", "0", "5000", "keys", *keys)
        for node in (target, source, *self.primaries()):
            command(node.port, "cluster", "setslot", str(slot), "node", dst_id)

    def wait_ok(self, timeout: float = 30) -> None:
        _wait(self._converged, timeout, "the Redis Cluster to be ok again")

    def stop(self) -> None:
        for node in self.nodes:
            node.stop()


class SentinelTopology:
    """A primary, one replica, and 3 Sentinels watching them as service ``service``."""

    def __init__(self, service: str = "mymaster") -> None:
        self.service = service
        self.primary: ConfiguredRedis | None = None
        self.replica: ConfiguredRedis | None = None
        self.sentinels: list[ConfiguredRedis] = []

    @property
    def url(self) -> str:
        seeds = ",".join(f"127.0.0.1:{s.port}" for s in self.sentinels)
        return f"redis-sentinel://{seeds}/{self.service}/0"

    def start(self) -> SentinelTopology:
        self.primary = ConfiguredRedis([]).start()
        self.replica = ConfiguredRedis(["--replicaof", "127.0.0.1", str(self.primary.port)])
        self.replica.start()
        _wait(self._replicating, 15, "the replica to sync")
        for _ in range(3):
            conf = [
                f"sentinel monitor {self.service} 127.0.0.1 {self.primary.port} 2",
                f"sentinel down-after-milliseconds {self.service} 1000",
                f"sentinel failover-timeout {self.service} 5000",
                f"sentinel parallel-syncs {self.service} 1",
            ]
            self.sentinels.append(ConfiguredRedis(conf, sentinel=True).start())
        _wait(self._watched, 15, "the Sentinels to see the replica and each other")
        return self

    def _replicating(self) -> bool:
        assert self.replica is not None
        return "master_link_status:up" in command(self.replica.port, "info", "replication")

    def _watched(self) -> bool:
        for sentinel in self.sentinels:
            info = command(sentinel.port, "sentinel", "master", self.service)
            fields = info.split("\n")
            values = dict(zip(fields[::2], fields[1::2], strict=False))
            if values.get("num-slaves") != "1" or values.get("num-other-sentinels") != "2":
                return False
        return True

    def primary_port(self) -> int:
        """The port Sentinel names as the primary now."""
        reply = command(self.sentinels[0].port, "sentinel", "get-master-addr-by-name", self.service)
        return int(reply.split()[1])

    def stop(self) -> None:
        for node in [*self.sentinels, self.replica, self.primary]:
            if node is not None:
                node.stop()


def wait_port_closed(port: int, timeout: float = 10) -> None:
    """Wait until nothing listens on ``port`` any more."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with socket.socket() as sock:
            if sock.connect_ex(("127.0.0.1", port)) != 0:
                return
        time.sleep(0.02)


__all__ = ["ClusterTopology", "ConfiguredRedis", "SentinelTopology", "command", "free_port"]
