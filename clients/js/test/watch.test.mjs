// watchSession / watchSessionSse follow a real run on a real server (a child process).
import assert from "node:assert/strict";
import { after, before, test } from "node:test";
import { EventSource } from "eventsource";
import { WatchError, watchSession, watchSessionSse } from "../dist/index.js";
import { startRun, startServer } from "./helpers.mjs";

let server;
before(async () => {
  server = await startServer(["--demo"]);
});
after(async () => {
  await server?.stop();
});

function positions(view) {
  return view.event_count;
}

test("watchSession follows a run to its end and reconciles it with the stored state", async () => {
  const run = await startRun(server.url, { input: "What is the weather in Oslo?", pace_ms: 5 });
  const watch = watchSession({ url: server.url, sessionId: run.session_id, since: run.position });
  const states = [];
  watch.subscribe((status) => states.push(status.state));
  const end = await watch.done;
  assert.equal(end.state, "ended", end.error ?? "");
  assert.equal(end.view.status, "completed");
  assert.ok(end.view.steps.length >= 2);
  assert.ok(end.view.steps.some((step) => step.tools.length > 0), "the weather run calls a tool");
  assert.ok(end.view.steps.some((step) => step.continuation), "the demo publishes the continuation trace");
  assert.deepEqual(end.differences, []);
  assert.ok(states.includes("live"));
});

test("watchSession without since replays the whole channel of a finished run", async () => {
  const run = await startRun(server.url, { input: "What is the weather in Oslo?" });
  const first = await watchSession({ url: server.url, sessionId: run.session_id, since: run.position }).done;
  const again = await watchSession({ url: server.url, sessionId: run.session_id }).done;
  assert.equal(again.state, "ended");
  assert.deepEqual(again.view, first.view);
  // The whole run came as a replay; the server's answer (nothing lost) is still reported.
  assert.equal(again.resumes.at(-1).recovered, true);
  assert.equal(again.resumes.at(-1).missed, again.view.event_count);
  assert.deepEqual(again.differences, []);
});

test("after a dropped connection the watch resumes from its position: recovered, nothing twice", async () => {
  const run = await startRun(server.url, { input: "What is the weather in Oslo?", pace_ms: 60 });
  const { default: Pusher } = await import("pusher-js");
  const config = await (await fetch(`${server.url}/api/demo/config`)).json();
  const { hostname, port } = new URL(server.url);
  const pusher = new Pusher(config.app_key, {
    cluster: "local", wsHost: hostname, wsPort: Number(port), forceTLS: false,
    enabledTransports: ["ws"], disableStats: true,
  });
  const watch = watchSession({ pusher, url: server.url, sessionId: run.session_id, since: run.position });
  let dropped = false;
  const states = [];
  watch.subscribe((status) => {
    if (states.at(-1) !== status.state) states.push(status.state);
    if (!dropped && status.view.event_count >= 3) {
      dropped = true;
      pusher.connection.disconnect(); // the socket goes; pusher-js keeps the channel
      setTimeout(() => pusher.connection.connect(), 100); // and resubscribes on connect
    }
  });
  const end = await watch.done;
  pusher.disconnect();
  assert.ok(dropped);
  assert.equal(end.state, "ended", end.error ?? "");
  assert.equal(end.resumes.length, 2);
  assert.equal(end.resumes[1].recovered, true);
  assert.deepEqual(states.filter((s) => s !== "connecting").slice(0, 3), ["live", "reconnecting", "recovered"]);
  assert.deepEqual(end.differences, []);
  const whole = await watchSession({ url: server.url, sessionId: run.session_id, since: run.position }).done;
  assert.equal(positions(end.view), positions(whole.view));
  assert.deepEqual(end.view.steps, whole.view.steps);
});

test("watchSessionSse follows the same run over server-sent events", async () => {
  const run = await startRun(server.url, { input: "What is the weather in Oslo?", pace_ms: 5 });
  const end = await watchSessionSse({ url: server.url, sessionId: run.session_id, since: run.position, EventSource }).done;
  assert.equal(end.state, "ended", end.error ?? "");
  assert.equal(end.view.status, "completed");
  assert.deepEqual(end.differences, []);
  const pusher = await watchSession({ url: server.url, sessionId: run.session_id, since: run.position }).done;
  assert.deepEqual(end.view.steps, pusher.view.steps);
});

test("a bad since or session id is refused at once", () => {
  assert.throws(() => watchSession({ url: server.url, sessionId: "s-1", since: "nonsense" }), WatchError);
  assert.throws(() => watchSession({ url: server.url, sessionId: "no spaces" }), WatchError);
  assert.throws(() => watchSessionSse({ url: server.url, sessionId: "s-1", since: "x:-1", EventSource }), WatchError);
});

test("an unknown session ends the watch failed, with a message", async () => {
  const end = await watchSession({ url: server.url, sessionId: "never-ran-here" }).done;
  assert.equal(end.state, "failed");
  assert.match(end.error, /unknown session/);
});

test("a refused token ends the watch failed, with a message", async () => {
  const run = await startRun(server.url, { input: "What is the weather in Oslo?" });
  const end = await watchSession({ url: server.url, sessionId: run.session_id, token: "wrong" }).done;
  assert.equal(end.state, "failed");
  assert.match(end.error, /refused/);
});

test("a server that is not there ends the watch failed", async () => {
  const end = await watchSession({ url: "http://127.0.0.1:9", sessionId: "s-1" }).done;
  assert.equal(end.state, "failed");
  assert.match(end.error, /cannot connect/);
});

test("a private session is followed with its token, and refused without it", async () => {
  const privateServer = await startServer(["--demo"], { AGENT_DEMO_PRIVATE_SESSIONS: "true" });
  try {
    const run = await startRun(privateServer.url, { input: "What is the weather in Oslo?" });
    assert.ok(run.channel.startsWith("private-"));
    const end = await watchSession({ url: privateServer.url, sessionId: run.session_id, since: run.position, token: run.auth.token }).done;
    assert.equal(end.state, "ended", end.error ?? "");
    assert.equal(end.view.status, "completed");
    assert.deepEqual(end.differences, []);
    const refused = await watchSession({ url: privateServer.url, sessionId: run.session_id }).done;
    assert.equal(refused.state, "failed");
    assert.match(refused.error, /private/);
  } finally {
    await privateServer.stop();
  }
});

test("a gap the server cannot fill is told: reloaded from the stored state, steps marked", async () => {
  const run = await startRun(server.url, { input: "What is the weather in Oslo?" });
  await watchSession({ url: server.url, sessionId: run.session_id, since: run.position }).done;
  const watch = watchSession({ url: server.url, sessionId: run.session_id, since: "another-epoch:3" });
  const states = [];
  watch.subscribe((status) => states.push(status.state));
  const end = await watch.done;
  assert.deepEqual(end.resumes.map((r) => r.recovered), [false]);
  assert.ok(states.includes("reloaded"), states.join(" "));
  assert.equal(end.view.from_snapshot, true);
  assert.ok(end.view.steps.every((step) => step.from_snapshot));
  assert.equal(end.view.status, "completed");
});
