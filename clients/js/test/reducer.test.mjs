// reduceRun: a pure fold of envelopes into a RunView.
import assert from "node:assert/strict";
import { test } from "node:test";
import { createRunView, reconcile, reduceRun, applySnapshot, finalText } from "../dist/index.js";

const T = "2026-01-16T10:05:00.123Z";
const env = (type, payload) => ({ type, session_id: "s-1", execution_id: "x-1", timestamp: T, payload });
const fold = (envelopes, start = createRunView("s-1")) =>
  envelopes.reduce((view, [envelope, position]) => reduceRun(view, envelope, position ?? null), start);

const RUN = [
  [env("agent.status", { status: "in_progress" }), "e:1"],
  [env("agent.continuation", { step_number: 0, should_continue: true, resolved_by: "max_steps", stop_reason: null,
    evaluations: [{ criterion: "max_steps", decision: "allow", reason: "0 < 4", stop_reason: null }] }), "e:2"],
  [env("agent.step.started", { step_number: 1, available_tools: ["weather"], message_count: 1 }), "e:3"],
  [env("agent.tool.started", { step_number: 1, tool_call_id: "c1", tool_name: "weather", args_summary: "city: 'Oslo'", arguments: { city: "Oslo" } }), "e:4"],
  [env("agent.tool.completed", { step_number: 1, tool_call_id: "c1", tool_name: "weather", success: true, duration_ms: 12, result_summary: "sunny" }), "e:5"],
  [env("agent.step.completed", { step_number: 1, has_tool_calls: true, errors: 0, finish_reason: "tool_calls", duration_ms: 30,
    usage: { prompt: 10, completion: 5, total: 15 }, tool_calls: [{ id: "c1", name: "weather" }],
    continuation: { should_continue: true, stop_reason: null, resolved_by: "tool_calls" } }), "e:6"],
  [env("agent.step.started", { step_number: 2, available_tools: ["weather"], message_count: 3 }), "e:7"],
  [env("agent.stream.chunk", { step_number: 2, chunk: "Sunny ", chunk_index: 0, is_complete: false }), "e:8"],
  [env("agent.stream.chunk", { step_number: 2, chunk: "in Oslo.", chunk_index: 1, is_complete: true }), "e:9"],
  [env("agent.step.completed", { step_number: 2, has_tool_calls: false, errors: 0, finish_reason: "stop", duration_ms: 20,
    usage: { prompt: 20, completion: 6, total: 26 }, tool_calls: [],
    continuation: { should_continue: false, stop_reason: "final_answer", resolved_by: "final_answer" } }), "e:10"],
  [env("agent.continuation", { step_number: 2, should_continue: false, resolved_by: "final_answer", stop_reason: "final_answer",
    evaluations: [{ criterion: "max_steps", decision: "allow", reason: "2 < 4", stop_reason: null },
                  { criterion: "final_answer", decision: "stop", reason: "no tool calls", stop_reason: "final_answer" }] }), "e:11"],
  [env("agent.status", { status: "completed", stop_reason: "final_answer", step_count: 2, usage: { prompt: 30, completion: 11, total: 41 },
    last_response: "Sunny in Oslo.", state_url: "/api/sessions/s-1/state" }), "e:12"],
];

test("a run folds into steps, tools, text, decisions, usage and status", () => {
  const view = fold(RUN);
  assert.equal(view.status, "completed");
  assert.equal(view.stop_reason, "final_answer");
  assert.equal(view.resolved_by, "final_answer");
  assert.deepEqual(view.usage, { prompt: 30, completion: 11, total: 41 });
  assert.deepEqual(view.reported_usage, { prompt: 30, completion: 11, total: 41 });
  assert.deepEqual(view.steps.map((s) => s.number), [1, 2]);
  const [tool] = view.steps[0].tools;
  assert.deepEqual([tool.id, tool.name, tool.state, tool.success, tool.duration_ms, tool.arguments],
    ["c1", "weather", "done", true, 12, { city: "Oslo" }]);
  assert.equal(view.steps[1].text, "Sunny in Oslo.");
  assert.equal(view.steps[0].continuation.evaluations[0].criterion, "max_steps");
  assert.equal(view.steps[1].continuation.evaluations.length, 2);
  assert.equal(finalText(view), "Sunny in Oslo.");
  assert.equal(view.position, "e:12");
  assert.equal(view.event_count, 12);
});

test("reduceRun never changes the view it is given", () => {
  const before = fold(RUN.slice(0, 5));
  const frozen = JSON.stringify(before);
  reduceRun(before, RUN[5][0], RUN[5][1]);
  assert.equal(JSON.stringify(before), frozen);
});

test("duplicates and overlapping replays fold idempotently by position", () => {
  const once = fold(RUN);
  const replayed = fold([...RUN.slice(0, 8), ...RUN.slice(3, 8), [RUN[7][0], "e:8"], ...RUN.slice(8)]);
  assert.deepEqual(replayed, once);
});

test("chunks arriving out of order join in index order", () => {
  const view = fold([RUN[6], RUN[8], RUN[7]].map(([e]) => [e]));
  assert.equal(view.steps[0].text, "Sunny in Oslo.");
});

test("routing phases are kept apart from the step's tools", () => {
  const view = fold([
    [env("agent.step.started", { step_number: 1, actor: "weather", available_tools: [], message_count: 1 })],
    [env("agent.tool.started", { step_number: 1, tool_call_id: "r1", tool_name: "intent_classifier", args_summary: "message: 'hi'", arguments: { message: "hi" } })],
    [env("agent.tool.completed", { step_number: 1, tool_call_id: "r1", tool_name: "intent_classifier", success: true, duration_ms: 1, result_summary: "weather · confidence 0.9 · asks" })],
  ]);
  assert.equal(view.steps[0].actor, "weather");
  assert.deepEqual(view.steps[0].tools, []);
  assert.equal(view.steps[0].routing.intent_classifier.result_summary, "weather · confidence 0.9 · asks");
});

test("unknown envelope types and envelopes without payload are ignored", () => {
  const start = createRunView("s-1");
  assert.equal(reduceRun(start, { type: "agent.other", payload: {} }), start);
  assert.equal(reduceRun(start, { type: "agent.status" }), start);
});

test("reconcile finds nothing on a faithful run and names each difference", () => {
  const view = fold(RUN);
  const snapshot = {
    status: "completed", step_count: 2, usage: { total: 41 },
    steps: [{ step_number: 1, tool_calls: [{ id: "c1", name: "weather" }], finish_reason: "tool_calls" },
            { step_number: 2, tool_calls: [], finish_reason: "stop" }],
    messages: [{ role: "assistant", content: "Sunny in Oslo." }],
  };
  assert.deepEqual(reconcile(view, snapshot), []);
  const lost = fold(RUN.filter((_, i) => i !== 5));
  assert.deepEqual(reconcile(lost, snapshot).map((d) => d.field), ["step count", "total tokens", "step"]);
  const filled = applySnapshot(lost, snapshot);
  assert.equal(filled.from_snapshot, true);
  assert.equal(filled.steps[0].from_snapshot, true);
});

test("a later run of the session clears the last run's outcome", () => {
  const next = fold([[env("agent.status", { status: "in_progress" }), "e:13"]], fold(RUN));
  assert.equal(next.status, "in_progress");
  assert.deepEqual([next.stop_reason, next.error, next.last_response, next.reported_usage, next.ended_at], [null, null, null, null, null]);
  assert.equal(next.steps.length, 2, "the earlier steps stay");
});
