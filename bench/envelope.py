"""The benchmark payload, byte for byte the same as ``bench/node/envelope.js`` builds.

A valid ``agent.stream.chunk`` envelope of exactly :data:`ENVELOPE_BYTES` bytes: its
``payload.chunk_index`` is the per-channel sequence number (for loss and order counting)
and its chunk text starts with ``ts=<send time in microseconds since the epoch>`` (for
publish-to-receive latency).
"""

from __future__ import annotations

import time
from datetime import UTC, datetime

__all__ = ["ENVELOPE_BYTES", "EVENT", "envelope", "session_of"]

ENVELOPE_BYTES = 300
EVENT = "agent.stream.chunk"
_FILLER = "lorem ipsum dolor sit amet consectetur adipiscing elit " * 8


def envelope(session: str, seq: int, ts_micros: int | None = None) -> str:
    """The envelope JSON text for publication ``seq`` of ``session``, stamped now.

    Args:
        session: the session id (the channel is ``agent.<session>``).
        seq: the per-channel sequence number, from 1.
        ts_micros: the send time to stamp; now when omitted.

    Returns:
        JSON text of :data:`ENVELOPE_BYTES` bytes.
    """
    ts = time.time_ns() // 1000 if ts_micros is None else ts_micros
    moment = datetime.fromtimestamp(ts // 1000 / 1000, UTC)
    stamp = moment.strftime("%Y-%m-%dT%H:%M:%S.") + f"{moment.microsecond // 1000:03d}Z"
    head = (
        f'{{"type":"{EVENT}","session_id":"{session}","execution_id":"exec-bench",'
        f'"timestamp":"{stamp}","payload":{{"chunk":"ts={ts} '
    )
    tail = f'","is_complete":false,"tokens_delta":1,"chunk_index":{seq},"step_number":1}}}}'
    pad = max(0, ENVELOPE_BYTES - len(head) - len(tail))
    return head + _FILLER[:pad] + tail


def session_of(channel: str) -> str:
    """``"agent.bench-7"`` -> ``"bench-7"``."""
    return channel.removeprefix("agent.")
