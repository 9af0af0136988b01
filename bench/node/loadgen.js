"use strict";
// WebSocket load generator for scripts/bench.
//
//   node loadgen.js '<json config>'     (or @file: the config in a file)
//
// Config: {url, protocol: "pusher" | "socketio", channels: [one channel per client],
//          subscribe: bool, concurrency: int, progressMs: int, latency: bool,
//          sources: [local addresses, e.g. "127.0.0.2"; client i connects from i % n],
//          stamp: "ts" | "timestamp", firstSeq: 1}
//
// stamp "ts" (default) reads the bench envelope's "ts=<microseconds>" chunk text;
// "timestamp" reads the envelope's own "timestamp" (UTC, milliseconds: the moment the
// agent adapter built it, just before publishing), for real agent envelopes. firstSeq is
// the first sequence number (chunk_index) of a channel: 1 for the bench envelope, 0 for
// the adapter's. Channel events without a chunk_index (other envelope types) are counted
// as received, without order or latency.
//
// It opens one connection per entry of `channels` (at most `concurrency` handshakes at a
// time), subscribes each to its channel, prints {"type":"ready"} and then counts channel
// events per client: received, out-of-order (a sequence number not above the last one),
// wrong channel (an envelope for another session), and publish-to-receive latency from
// the "ts=" stamp in the envelope. It prints {"type":"progress","received":N} every
// progressMs while the count changes, and answers JSON commands on stdin, one per line:
//   {"cmd":"subscribe"}                     subscribe now (when started with subscribe=false)
//   {"cmd":"reset"}                         zero the counters and latency samples
//   {"cmd":"stats","expected":{channel:n}}  print {"type":"stats",...}; lost = expected - received
//   {"cmd":"close"}                         close every connection and exit
// Messages are scanned as bytes (no JSON parse, no UTF-8 decode) on the hot path so that
// the generator stays far cheaper per message than the servers it measures.

const WebSocket = require("ws");
const readline = require("readline");
const { monitorEventLoopDelay } = require("perf_hooks");
const { nowMicros, sessionOf } = require("./envelope.js");

// A long configuration comes in a file ("@path"): one argument may not exceed 128 KB.
const arg = process.argv[2];
const cfg = JSON.parse(arg.startsWith("@") ? require("fs").readFileSync(arg.slice(1)) : arg);
const protocol = cfg.protocol;
const concurrency = cfg.concurrency || 100;
const progressMs = cfg.progressMs || 10;
const keepLatency = cfg.latency !== false;
const sources = cfg.sources || [];
const byTimestamp = cfg.stamp === "timestamp";
const firstSeq = cfg.firstSeq === undefined ? 1 : cfg.firstSeq;

const SEQ = Buffer.from("chunk_index");
const TS = Buffer.from("ts=");
// Inside the event's data string the envelope's quotes are escaped: \"timestamp\":\"
const TIMESTAMP = Buffer.from('timestamp\\":\\"');
const TIMESTAMP_LENGTH = "2026-01-16T10:05:00.123Z".length;

function out(obj) {
  process.stdout.write(JSON.stringify(obj) + "\n");
}

function digitsAfter(buf, index) {
  let i = index;
  const n = buf.length;
  while (i < n && (buf[i] < 48 || buf[i] > 57)) i++;
  let value = 0;
  while (i < n && buf[i] >= 48 && buf[i] <= 57) {
    value = value * 10 + (buf[i] - 48);
    i++;
  }
  return value;
}

let latencies = new Float64Array(1 << 16);
let latencyCount = 0;
function recordLatency(us) {
  if (latencyCount === latencies.length) {
    const bigger = new Float64Array(latencies.length * 2);
    bigger.set(latencies);
    latencies = bigger;
  }
  latencies[latencyCount++] = us;
}

// How long this process's own event loop was blocked: a client-side stall shows here.
const loopDelay = monitorEventLoopDelay({ resolution: 1 });
loopDelay.enable();

let total = 0;
let unexpectedCloses = 0;
const closeCodes = {};
const errors = [];
const clients = [];

class Client {
  constructor(channel, source) {
    this.channel = channel;
    this.source = source;
    this.marker = Buffer.from(`\\"session_id\\":\\"${sessionOf(channel)}\\"`);
    this.last = firstSeq - 1;
    this.received = 0;
    this.outOfOrder = 0;
    this.wrongChannel = 0;
    this.open = false;
    this.closing = false;
    this.onEstablished = null;
    this.onSubscribed = null;
  }

  connect() {
    return new Promise((resolve, reject) => {
      this.onEstablished = resolve;
      const options = { perMessageDeflate: false };
      if (this.source) options.localAddress = this.source;
      const ws = new WebSocket(cfg.url, options);
      this.ws = ws;
      ws.on("message", (data) => this.message(data));
      ws.on("error", (err) => {
        if (!this.open) reject(err);
        else if (errors.length < 10) errors.push(String(err));
      });
      ws.on("close", (code) => {
        if (!this.open) reject(new Error(`closed with ${code} before the handshake`));
        if (!this.closing) {
          unexpectedCloses++;
          closeCodes[code] = (closeCodes[code] || 0) + 1;
        }
      });
    });
  }

  subscribe() {
    return new Promise((resolve) => {
      this.onSubscribed = resolve;
      if (protocol === "pusher") {
        this.ws.send(JSON.stringify({ event: "pusher:subscribe", data: { channel: this.channel } }));
      } else {
        this.ws.send(`42${JSON.stringify(["subscribe", this.channel])}`);
      }
    });
  }

  message(buf) {
    const at = buf.indexOf(SEQ);
    if (at >= 0) {
      this.event(buf, at);
      return;
    }
    const text = buf.toString();
    if (protocol === "pusher") this.pusherControl(text);
    else this.socketioControl(text);
  }

  event(buf, at) {
    const seq = digitsAfter(buf, at + SEQ.length);
    if (seq <= this.last) this.outOfOrder++;
    else this.last = seq;
    if (buf.indexOf(this.marker) < 0) this.wrongChannel++;
    this.received++;
    total++;
    if (keepLatency) {
      if (byTimestamp) {
        const at = buf.indexOf(TIMESTAMP);
        if (at >= 0) {
          const start = at + TIMESTAMP.length;
          const text = buf.toString("latin1", start, start + TIMESTAMP_LENGTH);
          // Sent somewhere within that millisecond: count from its middle.
          recordLatency(nowMicros() - (Date.parse(text) * 1000 + 500));
        }
      } else {
        const ts = buf.indexOf(TS);
        if (ts >= 0) recordLatency(nowMicros() - digitsAfter(buf, ts + TS.length));
      }
    }
  }
  other() {
    // An envelope without a chunk_index (agent.status, agent.step.started, ...).
    this.received++;
    total++;
  }

  pusherControl(text) {
    const msg = JSON.parse(text);
    if (msg.event === "pusher:connection_established") {
      this.open = true;
      this.onEstablished();
    } else if (msg.event === "pusher_internal:subscription_succeeded") {
      if (this.onSubscribed) this.onSubscribed();
    } else if (msg.event === "pusher:ping") {
      this.ws.send('{"event":"pusher:pong","data":{}}');
    } else if (msg.event === "pusher:error" && errors.length < 10) {
      errors.push(text);
    } else if (msg.channel === this.channel && !msg.event.startsWith("pusher")) {
      this.other();
    }
  }

  socketioControl(text) {
    // engine.io: 0 open, 2 ping, 4 message; socket.io inside: 0 connect, 2 event.
    if (text === "2") {
      this.ws.send("3");
    } else if (text.startsWith("0")) {
      this.ws.send("40");
    } else if (text.startsWith("40")) {
      this.open = true;
      this.onEstablished();
    } else if (text.startsWith('42["subscribed"')) {
      if (this.onSubscribed) this.onSubscribed();
    } else if (text.startsWith('42["agent.')) {
      this.other();
    } else if (errors.length < 10) {
      errors.push(text.slice(0, 200));
    }
  }
}

async function pool(items, limit, work) {
  let next = 0;
  let failed = 0;
  async function worker() {
    while (next < items.length) {
      const item = items[next++];
      try {
        await work(item);
      } catch (err) {
        failed++;
        if (errors.length < 10) errors.push(String(err));
      }
    }
  }
  await Promise.all(Array.from({ length: Math.min(limit, items.length) }, worker));
  return failed;
}

async function subscribeAll() {
  const started = performance.now();
  const failed = await pool(clients, concurrency, (c) => c.subscribe());
  return { failed, seconds: (performance.now() - started) / 1000 };
}

function percentile(sorted, p) {
  if (sorted.length === 0) return null;
  return sorted[Math.min(sorted.length - 1, Math.floor((p / 100) * sorted.length))];
}

function stats(expected) {
  let lost = 0;
  let outOfOrder = 0;
  let wrongChannel = 0;
  let received = 0;
  for (const c of clients) {
    received += c.received;
    outOfOrder += c.outOfOrder;
    wrongChannel += c.wrongChannel;
    const want = expected ? expected[c.channel] || 0 : c.received;
    lost += Math.max(0, want - c.received);
  }
  const sorted = latencies.slice(0, latencyCount).sort();
  const latency =
    latencyCount === 0
      ? null
      : {
          n: latencyCount,
          p50: percentile(sorted, 50),
          p99: percentile(sorted, 99),
          max: sorted[sorted.length - 1],
        };
  return {
    type: "stats",
    clients: clients.length,
    received,
    lost,
    out_of_order: outOfOrder,
    wrong_channel: wrongChannel,
    unexpected_closes: unexpectedCloses,
    close_codes: closeCodes,
    latency_us: latency,
    loop_delay_ms: {
      p99: loopDelay.percentile(99) / 1e6,
      max: loopDelay.max / 1e6,
    },
    errors,
  };
}

async function main() {
  cfg.channels.forEach((channel, i) => {
    clients.push(new Client(channel, sources.length ? sources[i % sources.length] : null));
  });
  const started = performance.now();
  const failed = await pool(clients, concurrency, (c) => c.connect());
  const connectSeconds = (performance.now() - started) / 1000;
  let subscribed = { failed: 0, seconds: 0 };
  if (cfg.subscribe !== false) subscribed = await subscribeAll();
  out({
    type: "ready",
    connected: clients.length - failed,
    failed: failed + subscribed.failed,
    connect_seconds: connectSeconds,
    subscribe_seconds: subscribed.seconds,
    errors,
  });

  let reported = -1;
  setInterval(() => {
    if (total !== reported) {
      reported = total;
      out({ type: "progress", received: total });
    }
  }, progressMs);

  const rl = readline.createInterface({ input: process.stdin });
  rl.on("line", async (line) => {
    if (!line.trim()) return;
    const cmd = JSON.parse(line);
    if (cmd.cmd === "subscribe") {
      const result = await subscribeAll();
      out({ type: "subscribed", ...result });
    } else if (cmd.cmd === "reset") {
      for (const c of clients) {
        c.received = 0;
        c.outOfOrder = 0;
        c.wrongChannel = 0;
      }
      total = 0;
      reported = -1;
      latencyCount = 0;
      loopDelay.reset();
      out({ type: "reset" });
    } else if (cmd.cmd === "stats") {
      out(stats(cmd.expected));
    } else if (cmd.cmd === "close") {
      for (const c of clients) {
        c.closing = true;
        c.ws.terminate();
      }
      process.exit(0);
    }
  });
  rl.on("close", () => process.exit(0));
}

main().catch((err) => {
  out({ type: "fatal", error: String(err && err.stack ? err.stack : err) });
  process.exit(1);
});
