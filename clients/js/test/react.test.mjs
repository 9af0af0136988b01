// useAgentSession under jsdom with Testing Library, following a real run.
import assert from "node:assert/strict";
import { after, before, test } from "node:test";
import { JSDOM } from "jsdom";
import { startRun, startServer } from "./helpers.mjs";

const dom = new JSDOM("<!doctype html><html><body></body></html>", { url: "http://localhost/" });
globalThis.window = dom.window;
globalThis.document = dom.window.document;
globalThis.navigator ??= dom.window.navigator;
globalThis.HTMLElement = dom.window.HTMLElement;
globalThis.IS_REACT_ACT_ENVIRONMENT = true;

const { renderHook, waitFor, cleanup } = await import("@testing-library/react");
const { useAgentSession } = await import("../dist/react.js");

let server;
before(async () => {
  server = await startServer(["--demo"]);
});
after(async () => {
  cleanup();
  await server?.stop();
});

test("useAgentSession renders the run live and its reconcile verdict at the end", async () => {
  // Paced so that the run (about 27 deltas) lasts some seconds: the hook, subscribing
  // after the start, still sees most events arrive one by one on a loaded machine
  // (at 5 ms a run could end before the subscription and arrive as one replayed batch).
  const run = await startRun(server.url, { input: "What is the weather in Oslo?", pace_ms: 100 });
  const seen = [];
  const { result, unmount } = renderHook(() => {
    const status = useAgentSession(run.session_id, { url: server.url, since: run.position });
    seen.push(status.view.event_count);
    return status;
  });
  await waitFor(() => assert.equal(result.current.state, "ended", result.current.error ?? ""), { timeout: 20000 });
  assert.equal(result.current.view.status, "completed");
  assert.deepEqual(result.current.differences, []);
  assert.ok(new Set(seen).size > 2, "the hook re-rendered as events arrived");
  unmount();
});

test("useAgentSession reports a bad since as failed without connecting", () => {
  const { result, unmount } = renderHook(() => useAgentSession("s-1", { url: server.url, since: "bad" }));
  assert.equal(result.current.state, "failed");
  assert.match(result.current.error, /not a position/);
  unmount();
});

test("useAgentSession with no session id watches nothing", () => {
  const { result, unmount } = renderHook(() => useAgentSession(null, { url: server.url }));
  assert.equal(result.current.state, "connecting");
  assert.equal(result.current.view.event_count, 0);
  unmount();
});
