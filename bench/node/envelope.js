"use strict";
// The benchmark payload: a valid agent.stream.chunk envelope of exactly ENVELOPE_BYTES
// bytes whose payload.chunk_index is the per-channel sequence number and whose chunk text
// starts with "ts=<send time in microseconds since the epoch>". Same bytes as
// bench/envelope.py builds in Python.

const ENVELOPE_BYTES = 300;
const EVENT = "agent.stream.chunk";
const FILLER = "lorem ipsum dolor sit amet consectetur adipiscing elit ".repeat(8);

function nowMicros() {
  return Math.round((performance.timeOrigin + performance.now()) * 1000);
}

function envelope(session, seq, tsMicros = nowMicros()) {
  const stamp = new Date(Math.floor(tsMicros / 1000)).toISOString();
  const head =
    `{"type":"${EVENT}","session_id":"${session}","execution_id":"exec-bench",` +
    `"timestamp":"${stamp}","payload":{"chunk":"ts=${tsMicros} `;
  const tail = `","is_complete":false,"tokens_delta":1,"chunk_index":${seq},"step_number":1}}`;
  const pad = Math.max(0, ENVELOPE_BYTES - head.length - tail.length);
  return head + FILLER.slice(0, pad) + tail;
}

/** "agent.bench-7" -> "bench-7" (the session id of an agent channel). */
function sessionOf(channel) {
  return channel.startsWith("agent.") ? channel.slice("agent.".length) : channel;
}

module.exports = { ENVELOPE_BYTES, EVENT, envelope, nowMicros, sessionOf };
