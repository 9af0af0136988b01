"use strict";
// WebSocket load generator for scripts/bench.
//
//   node loadgen.js '<json config>'
//
// Config: {url, protocol: "pusher" | "socketio", channels: [one channel per client],
//          subscribe: bool, concurrency: int, progressMs: int, latency: bool}
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

const cfg = JSON.parse(process.argv[2]);
const protocol = cfg.protocol;
const concurrency = cfg.concurrency || 100;
const progressMs = cfg.progressMs || 10;
const keepLatency = cfg.latency !== false;

const SEQ = Buffer.from("chunk_index");
const TS = Buffer.from("ts=");

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
  constructor(channel) {
    this.channel = channel;
    this.marker = Buffer.from(`\\"session_id\\":\\"${sessionOf(channel)}\\"`);
    this.last = 0;
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
      const ws = new WebSocket(cfg.url, { perMessageDeflate: false });
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
      const ts = buf.indexOf(TS);
      if (ts >= 0) recordLatency(nowMicros() - digitsAfter(buf, ts + TS.length));
    }
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
  for (const channel of cfg.channels) clients.push(new Client(channel));
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
