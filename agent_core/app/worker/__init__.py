"""The scaled-out shape: ``web`` only fans out, ``worker`` processes run the agents.

With ``AGENT_DEMO_RUN_MODE=queue`` the demo's ``POST /run`` does not run the agent in
the web process: :class:`RunQueue` claims the session (one run at a time, across every
process), reads the channel's position and queues the job in Redis. ``agent-worker``
(:class:`Worker`) takes jobs off that queue and runs them with a
:class:`~broadcaster.publishers.RedisPublisher` and a
:class:`~broadcaster.publishers.RedisStateStore`, i.e. along the Redis backend's own
path, so any server node subscribed to the session's channel delivers the envelopes and
serves the final state.

Leases: every queued run has a deadline in ``run-leases``. While it waits, the deadline
is ``queue_timeout`` after it was queued; a worker that takes it sets it to ``lease``
seconds ahead and renews it (with the session's claim) every third of that. Any worker,
and the web node, look for runs past their deadline every third of their lease and end
them ``failed`` (:func:`agent_core.app.runs.end_abandoned`): a final state is stored, the
final ``agent.status`` is published and the session is free again. So a SIGKILLed
worker's run ends within ``lease`` plus a reap interval, and a run no worker takes ends
after ``queue_timeout``. A worker that finds its lease gone (it stalled past it) stops
that run. The queue is bounded (``queue_max``) and so are each client's queued and
running runs.

Redis keys (``P`` = prefix, ``A`` = app id, ``R`` = a run's id)::

    P:{A}:runs                  list of queued run ids, RPUSH by web, BLPOP by workers
    P:{A}:run-jobs              hash R -> the job (JSON)
    P:{A}:run-leases            sorted set R -> deadline (ms, Redis time)
    P:{A}:run-takers            hash R -> the worker that took it
    P:{A}:client-runs:<client>  sorted set R -> deadline: a client's queued/running runs
    P:{A}:claim:run:<session>   the session's claim (R), as local runs claim it
    P:A:value:state:<channel>   a session's final state (read apart, in any slot)

Every key one script touches carries the hash tag ``{A}``, on every topology: on Redis
Cluster all of them live in the app's slot, so each script is one atomic step on one
primary (Redis refuses a script whose keys span slots), and standalone Redis and
Sentinel use the very same names (to them the braces are plain characters). One layout
means one code path and no setting that could disagree between web nodes and workers;
the price is that one app's run queue is served by one primary of a cluster, which
holds for the rates of run starts (the publications of the runs spread over every
slot, one per channel). ``{A}`` is the tag the cluster backend already gives an app's
subscription counts and control channel.

The package: :mod:`._scripts` (keys, Lua scripts, job format), :mod:`.producer`
(:class:`RunQueue`), :mod:`.consumer` (:class:`Worker`), :mod:`.reaper`
(:class:`Reaper`) and :mod:`.cli` (``agent-worker``, also ``python -m
agent_core.app.worker``).
"""

from __future__ import annotations

from agent_core.app.worker._scripts import LEASE, QUEUE_TIMEOUT
from agent_core.app.worker.cli import WorkerSettings, event_loop_factory, main
from agent_core.app.worker.consumer import Worker
from agent_core.app.worker.producer import RunQueue
from agent_core.app.worker.reaper import Reaper

__all__ = [
    "LEASE",
    "QUEUE_TIMEOUT",
    "Reaper",
    "RunQueue",
    "Worker",
    "WorkerSettings",
    "event_loop_factory",
    "main",
]
