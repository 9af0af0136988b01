"use strict";
// HTTP publish load for scripts/bench: signed Pusher HTTP API requests, as the official
// server SDKs send them.
//
//   node httpload.js '{"url":"http://127.0.0.1:PORT","app_id":..,"key":..,"secret":..,
//                      "channels":[...], "batch":0|10, "duration":5}'
//
// One worker per channel sends requests back to back on a keep-alive connection: with
// batch=0, POST /apps/{id}/events with one event; with batch=N, POST /apps/{id}/batch_events
// with N events. Each channel's envelopes carry their own sequence (1, 2, 3...), so the
// WebSocket load generator can count lost and reordered ones. Prints one JSON line:
// {"type":"done","requests","events","errors","seconds","latency_ms":{p50,p99,max},
//  "published":{channel:count}}.

const crypto = require("crypto");
const http = require("http");
const { EVENT, envelope, sessionOf } = require("./envelope.js");

const cfg = JSON.parse(process.argv[2]);
const base = new URL(cfg.url);
const agent = new http.Agent({ keepAlive: true, maxSockets: cfg.channels.length });

function signedPath(path, body) {
  const params = {
    auth_key: cfg.key,
    auth_timestamp: String(Math.floor(Date.now() / 1000)),
    auth_version: "1.0",
    body_md5: crypto.createHash("md5").update(body).digest("hex"),
  };
  const query = Object.keys(params)
    .sort()
    .map((k) => `${k}=${params[k]}`)
    .join("&");
  const signature = crypto
    .createHmac("sha256", cfg.secret)
    .update(`POST\n${path}\n${query}`)
    .digest("hex");
  return `${path}?${query}&auth_signature=${signature}`;
}

function post(path, body) {
  return new Promise((resolve, reject) => {
    const req = http.request(
      {
        host: base.hostname,
        port: base.port,
        method: "POST",
        path: signedPath(path, body),
        agent,
        headers: { "Content-Type": "application/json", "Content-Length": Buffer.byteLength(body) },
      },
      (res) => {
        const chunks = [];
        res.on("data", (c) => chunks.push(c));
        res.on("end", () => resolve({ status: res.statusCode, body: Buffer.concat(chunks) }));
      },
    );
    req.on("error", reject);
    req.end(body);
  });
}

async function main() {
  const batch = cfg.batch || 0;
  const published = {};
  const latencies = [];
  let requests = 0;
  let events = 0;
  let errors = 0;
  const samples = [];
  const started = performance.now();
  const deadline = started + cfg.duration * 1000;

  async function worker(channel) {
    const session = sessionOf(channel);
    let seq = 0;
    while (performance.now() < deadline) {
      let path;
      let body;
      const first = seq;
      if (batch > 0) {
        const items = [];
        for (let k = 0; k < batch; k++) {
          seq += 1;
          items.push({ name: EVENT, channel, data: envelope(session, seq) });
        }
        path = `/apps/${cfg.app_id}/batch_events`;
        body = JSON.stringify({ batch: items });
      } else {
        seq += 1;
        path = `/apps/${cfg.app_id}/events`;
        body = JSON.stringify({ name: EVENT, channel, data: envelope(session, seq) });
      }
      const t0 = performance.now();
      let res;
      try {
        res = await post(path, body);
      } catch (err) {
        res = { status: 0, body: Buffer.from(String(err)) };
      }
      latencies.push(performance.now() - t0);
      requests += 1;
      if (res.status === 200) {
        events += seq - first;
        published[channel] = seq;
      } else {
        // An event of a failed request may or may not be out: do not count it as sent,
        // and restart the sequence where the server's last accepted one ended.
        errors += 1;
        seq = first;
        if (samples.length < 5) samples.push(`${res.status} ${res.body.toString().slice(0, 200)}`);
      }
    }
  }

  await Promise.all(cfg.channels.map(worker));
  const seconds = (performance.now() - started) / 1000;
  latencies.sort((a, b) => a - b);
  const pick = (p) => latencies[Math.min(latencies.length - 1, Math.floor(p * latencies.length))];
  process.stdout.write(
    JSON.stringify({
      type: "done",
      requests,
      events,
      errors,
      error_samples: samples,
      seconds,
      cpu_seconds: (process.cpuUsage().user + process.cpuUsage().system) / 1e6,
      latency_ms: latencies.length
        ? { p50: pick(0.5), p99: pick(0.99), max: latencies[latencies.length - 1] }
        : null,
      published,
    }) + "\n",
  );
  agent.destroy();
}

main().catch((err) => {
  process.stdout.write(JSON.stringify({ type: "fatal", error: String(err.stack || err) }) + "\n");
  process.exit(1);
});
