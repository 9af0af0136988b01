"use strict";
// Publishes benchmark envelopes through Redis with @socket.io/redis-emitter, the path
// the socket.io reference's redis-adapter listens on. Same control protocol as
// bench/publisher.py (one JSON command per stdin line, JSON lines on stdout):
//
//   node publisher.js '{"redis_url":..., "channels":[...], "mode":"credit"|"paced",
//                       "rate":200, "duration":5, "limit":null}'
//
// credit mode: {"cmd":"credit","n":N} allows publishing up to N publications in total;
//              {"cmd":"stop"} ends and prints {"type":"done","published":{channel:count}}.
// paced mode:  {"cmd":"start"} publishes `rate` publications per second (round robin over
//              the channels) for `duration` seconds, then prints "done" with "seconds"
//              (first publication to last) and "lag_ms" (the most one was late).
// Each channel has its own sequence, 1, 2, 3...

const readline = require("readline");
const { createClient } = require("redis");
const { Emitter } = require("@socket.io/redis-emitter");
const { EVENT, envelope, sessionOf } = require("./envelope.js");

const cfg = JSON.parse(process.argv[2]);
const channels = cfg.channels;
const sessions = channels.map(sessionOf);
const seqs = new Array(channels.length).fill(0);
let next = 0;
let published = 0;
let credit = 0;
let stopped = false;
let pumping = false;

function out(obj) {
  process.stdout.write(JSON.stringify(obj) + "\n");
}

async function main() {
  const client = createClient({ url: cfg.redis_url });
  await client.connect();
  const emitter = new Emitter(client);

  function publishOne() {
    const i = next;
    next = (next + 1) % channels.length;
    seqs[i] += 1;
    emitter.to(channels[i]).emit(EVENT, envelope(sessions[i], seqs[i]));
    published += 1;
  }

  function done(extra = {}) {
    const counts = {};
    channels.forEach((ch, i) => {
      if (seqs[i]) counts[ch] = seqs[i];
    });
    out({ type: "done", published: counts, total: published, ...extra });
  }

  async function pump() {
    if (pumping) return;
    pumping = true;
    const limit = cfg.limit || Infinity;
    while (!stopped && published < credit && published < limit) {
      const batch = Math.min(credit, limit) - published;
      for (let k = 0; k < Math.min(batch, 64); k++) publishOne();
      await client.ping(); // ordered after the publishes: bounds what is queued
    }
    pumping = false;
  }

  async function paced() {
    // Every wake-up publishes all that are due (a timer per publication cannot keep
    // thousands per second); "done" reports the achieved span and the worst lag.
    const count = Math.round(cfg.rate * cfg.duration);
    const start = performance.now();
    let lag = 0;
    while (published < count) {
      const now = performance.now();
      const due = Math.min(count, Math.floor(((now - start) * cfg.rate) / 1000) + 1);
      if (due > published) {
        lag = Math.max(lag, now - (start + (published * 1000) / cfg.rate));
        // The envelope is stamped when it is built, so timer jitter does not skew latency.
        while (published < due) publishOne();
        await client.ping(); // ordered after the publishes: bounds what is queued
        continue;
      }
      const wait = start + (published * 1000) / cfg.rate - now;
      await new Promise((r) => setTimeout(r, wait));
    }
    const seconds = (performance.now() - start) / 1000;
    done({ seconds, lag_ms: Math.round(lag * 100) / 100 });
  }
  const rl = readline.createInterface({ input: process.stdin });
  rl.on("line", async (line) => {
    if (!line.trim()) return;
    const cmd = JSON.parse(line);
    if (cmd.cmd === "credit") {
      credit = Math.max(credit, cmd.n);
      pump();
    } else if (cmd.cmd === "start") {
      paced();
    } else if (cmd.cmd === "stop") {
      stopped = true;
      while (pumping) await new Promise((r) => setImmediate(r));
      await client.ping();
      done();
    } else if (cmd.cmd === "close") {
      client.quit().finally(() => process.exit(0));
    }
  });
  rl.on("close", () => process.exit(0));
  out({ type: "ready" });
}

main().catch((err) => {
  out({ type: "fatal", error: String(err && err.stack ? err.stack : err) });
  process.exit(1);
});
