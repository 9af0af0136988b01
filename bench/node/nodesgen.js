"use strict";
// Load generator of the bench's `nodes` scenario (bench/nodes.py): many connections over
// several server nodes, each subscribed to one shared channel and one private channel of
// its own, signed as a Pusher auth endpoint signs it.
//
//   node nodesgen.js '<json config>'
//
// Config: {protocol: "pusher" | "socketio", urls: [one WebSocket URL per node],
//          first: global index of this process's first client, count: clients here,
//          shared: "nodes-shared", privatePrefix: "private-nodes-p", key, secret,
//          sources: [local addresses], concurrency: handshakes at a time}
//
// Client i (global index) connects to urls[i % urls.length] from sources[i % n] and, on
// {"cmd":"subscribe"}, subscribes to `shared` and to `${privatePrefix}${i}`. The private
// subscription carries auth "<key>:<hex HMAC-SHA256 of '<socket id>:<channel>' under the
// secret>": for Pusher exactly what an auth endpoint returns (the socket id is the one of
// pusher:connection_established); the socket.io reference checks the same signature over
// its socket id (bench/node/socketio_server.js).
//
// Broadcasts on the shared channel carry session "nodes-shared" and chunk_index = the
// broadcast's number (1, 2, ...); a private channel's publication carries session
// "nodes-p<i>". Per client it records which broadcasts arrived (duplicates counted) and
// the latency of each from the "ts=" stamp the publisher put in at publish time.
//
// Output (JSON lines): {"type":"ready",connected,failed,connect_seconds,errors},
// {"type":"subscribed",failed,seconds}, {"type":"progress",received} every 10 ms while
// the count changes, and on {"cmd":"stats","broadcasts":B,"privates":bool}:
// {"type":"stats", lost, duplicates, latencies_us: {seq: [per-client µs]}, private_*,
// close_codes, unexpected_closes, ...}. {"cmd":"close"} closes everything and exits.

const crypto = require("crypto");
const readline = require("readline");
const WebSocket = require("ws");
const { monitorEventLoopDelay } = require("perf_hooks");
const { nowMicros } = require("./envelope.js");

const cfg = JSON.parse(process.argv[2]);
const protocol = cfg.protocol;
const sources = cfg.sources || [];
const concurrency = cfg.concurrency || 100;
const MAX_BROADCASTS = 64;

const SEQ = Buffer.from("chunk_index");
const TS = Buffer.from("ts=");
const SHARED = Buffer.from(`\\"session_id\\":\\"nodes-shared\\"`);

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

function sign(socketId, channel) {
  const hex = crypto.createHmac("sha256", cfg.secret).update(`${socketId}:${channel}`).digest("hex");
  return `${cfg.key}:${hex}`;
}

const loopDelay = monitorEventLoopDelay({ resolution: 1 });
loopDelay.enable();

// Per broadcast number: every client's latency in µs.
const latencies = Array.from({ length: MAX_BROADCASTS + 1 }, () => []);
let total = 0;
let unexpectedCloses = 0;
const closeCodes = {};
const errors = [];
const clients = [];

function note(text) {
  if (errors.length < 10) errors.push(String(text).slice(0, 300));
}

class Client {
  constructor(index) {
    this.index = index;
    this.url = cfg.urls[index % cfg.urls.length];
    this.source = sources.length ? sources[index % sources.length] : null;
    this.private = `${cfg.privatePrefix}${index}`;
    this.marker = Buffer.from(`\\"session_id\\":\\"nodes-p${index}\\"`);
    this.got = new Uint8Array(MAX_BROADCASTS + 1);
    this.duplicates = 0;
    this.privateGot = 0;
    this.wrong = 0;
    this.socketId = null;
    this.open = false;
    this.closing = false;
    this.pending = 0;
    this.onEstablished = null;
    this.onSubscribed = null;
    this.onRefused = null;
  }

  connect() {
    return new Promise((resolve, reject) => {
      this.onEstablished = resolve;
      const options = { perMessageDeflate: false };
      if (this.source) options.localAddress = this.source;
      const ws = new WebSocket(this.url, options);
      this.ws = ws;
      ws.on("message", (data) => this.message(data));
      ws.on("error", (err) => {
        if (!this.open) reject(err);
        else note(err);
      });
      ws.on("close", (code) => {
        if (!this.open) {
          reject(new Error(`closed with ${code} before the handshake`));
          return;
        }
        if (!this.closing) {
          unexpectedCloses++;
          closeCodes[code] = (closeCodes[code] || 0) + 1;
          if (this.onRefused) this.onRefused(new Error(`closed with ${code}`));
        }
      });
    });
  }

  subscribe() {
    return new Promise((resolve, reject) => {
      this.pending = 2;
      this.onSubscribed = resolve;
      this.onRefused = reject;
      const auth = sign(this.socketId, this.private);
      if (protocol === "pusher") {
        this.ws.send(JSON.stringify({ event: "pusher:subscribe", data: { channel: cfg.shared } }));
        this.ws.send(
          JSON.stringify({ event: "pusher:subscribe", data: { channel: this.private, auth } }),
        );
      } else {
        this.ws.send(`42${JSON.stringify(["subscribe", cfg.shared])}`);
        this.ws.send(`42${JSON.stringify(["subscribe", this.private, auth])}`);
      }
    });
  }

  subscribed() {
    this.pending--;
    if (this.pending === 0 && this.onSubscribed) {
      this.onSubscribed();
      this.onSubscribed = null;
      this.onRefused = null;
    }
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
    total++;
    if (buf.indexOf(SHARED) >= 0) {
      const seq = digitsAfter(buf, at + SEQ.length);
      if (seq < 1 || seq > MAX_BROADCASTS) {
        this.wrong++;
        return;
      }
      if (this.got[seq]) {
        this.duplicates++;
        return;
      }
      this.got[seq] = 1;
      const ts = buf.indexOf(TS);
      if (ts >= 0) latencies[seq].push(nowMicros() - digitsAfter(buf, ts + TS.length));
    } else if (buf.indexOf(this.marker) >= 0) {
      this.privateGot++;
    } else {
      this.wrong++;
    }
  }

  pusherControl(text) {
    const msg = JSON.parse(text);
    if (msg.event === "pusher:connection_established") {
      this.socketId = JSON.parse(msg.data).socket_id;
      this.open = true;
      this.onEstablished();
    } else if (msg.event === "pusher_internal:subscription_succeeded") {
      this.subscribed();
    } else if (msg.event === "pusher:ping") {
      this.ws.send('{"event":"pusher:pong","data":{}}');
    } else if (msg.event === "pusher:subscription_error" || msg.event === "pusher:error") {
      note(text);
      if (this.onRefused) this.onRefused(new Error(text.slice(0, 200)));
    }
  }

  socketioControl(text) {
    // engine.io: 0 open, 2 ping, 4 message; socket.io inside: 0 connect, 2 event.
    if (text === "2") {
      this.ws.send("3");
    } else if (text.startsWith("40")) {
      this.socketId = JSON.parse(text.slice(2)).sid;
      this.open = true;
      this.onEstablished();
    } else if (text.startsWith("0")) {
      this.ws.send("40");
    } else if (text.startsWith('42["subscribed"')) {
      this.subscribed();
    } else {
      note(text.slice(0, 200));
      if (text.startsWith('42["subscribe_error"') && this.onRefused) {
        this.onRefused(new Error(text.slice(0, 200)));
      }
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
        note(err);
      }
    }
  }
  await Promise.all(Array.from({ length: Math.min(limit, items.length) }, worker));
  return failed;
}

function percentile(sorted, p) {
  return sorted.length ? sorted[Math.min(sorted.length - 1, Math.floor(p * sorted.length))] : null;
}

function stats(broadcasts, privates) {
  let lost = 0;
  let duplicates = 0;
  let wrong = 0;
  let privateReceived = 0;
  let privateLost = 0;
  let shared = 0;
  for (const c of clients) {
    if (!c.open) continue; // never connected: counted as failed connections
    for (let seq = 1; seq <= broadcasts; seq++) {
      if (c.got[seq]) shared++;
      else lost++;
    }
    duplicates += c.duplicates;
    wrong += c.wrong;
    privateReceived += c.privateGot;
    if (privates) privateLost += Math.max(0, 1 - c.privateGot);
    duplicates += privates ? Math.max(0, c.privateGot - 1) : 0;
  }
  const perBroadcast = {};
  for (let seq = 1; seq <= broadcasts; seq++) perBroadcast[seq] = latencies[seq].map(Math.round);
  return {
    type: "stats",
    clients: clients.length,
    shared_received: shared,
    lost,
    duplicates,
    wrong_channel: wrong,
    private_received: privateReceived,
    private_lost: privateLost,
    latencies_us: perBroadcast,
    unexpected_closes: unexpectedCloses,
    close_codes: closeCodes,
    loop_delay_ms: { p99: loopDelay.percentile(99) / 1e6, max: loopDelay.max / 1e6 },
    errors,
  };
}

async function main() {
  for (let k = 0; k < cfg.count; k++) clients.push(new Client(cfg.first + k));
  const started = performance.now();
  const failed = await pool(clients, concurrency, (c) => c.connect());
  out({
    type: "ready",
    connected: clients.length - failed,
    failed,
    connect_seconds: (performance.now() - started) / 1000,
    errors,
  });

  let reported = -1;
  setInterval(() => {
    if (total !== reported) {
      reported = total;
      out({ type: "progress", received: total });
    }
  }, 10);

  const rl = readline.createInterface({ input: process.stdin });
  rl.on("line", async (line) => {
    if (!line.trim()) return;
    const cmd = JSON.parse(line);
    if (cmd.cmd === "subscribe") {
      const t0 = performance.now();
      const open = clients.filter((c) => c.open);
      const failedSubs = await pool(open, concurrency, (c) => c.subscribe());
      out({ type: "subscribed", failed: failedSubs, seconds: (performance.now() - t0) / 1000 });
    } else if (cmd.cmd === "stats") {
      out(stats(cmd.broadcasts, cmd.privates));
    } else if (cmd.cmd === "close") {
      for (const c of clients) {
        c.closing = true;
        if (c.ws) c.ws.terminate();
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
