// Prototype keys in envelopes ("__proto__", "constructor", "prototype", ...) as the tool
// call, execution, parent call and chunk ids a reducer keys objects by: they stay the
// run's own keys and never set anything on Object.prototype or another shared object.
import assert from "node:assert/strict";
import { test } from "node:test";
import { createRunView, createSessionView, latestRun, reduceRun, reduceRunAll, reduceSession } from "../dist/index.js";

const KEYS = ["__proto__", "constructor", "prototype", "toString", "hasOwnProperty", "__defineGetter__"];
const T = "2026-01-16T10:05:00.123Z";
const SHARED = { Object, "Object.prototype": Object.prototype, Function, "Function.prototype": Function.prototype, Array, "Array.prototype": Array.prototype };

/** The own property names of every shared object, to compare before and after. */
function shared() {
  return Object.fromEntries(Object.entries(SHARED).map(([name, object]) => [name, Object.getOwnPropertyNames(object).sort()]));
}

/** A run whose nested run, tool call, execution and chunk ids are all `key`. */
function records(key) {
  const env = (type, payload, execution = "x-1") => ({ type, session_id: "s-1", execution_id: execution, timestamp: T, payload });
  const inner = (type, payload) => env(type, { parent_execution_id: "x-1", parent_tool_call_id: key, ...payload }, key);
  return [
    env("agent.status", { status: "in_progress" }),
    env("agent.step.started", { step_number: 1, available_tools: [key] }),
    env("agent.tool.started", { step_number: 1, tool_call_id: key, tool_name: key, args_summary: "" }),
    inner("agent.status", { status: "in_progress" }),
    inner("agent.step.started", { step_number: 1 }),
    inner("agent.tool.started", { step_number: 1, tool_call_id: key, tool_name: key }),
    inner("agent.stream.chunk", { step_number: 1, chunk: "inner", chunk_index: key }),
    inner("agent.status", { status: "completed", last_response: "inner" }),
    env("agent.tool.completed", { step_number: 1, tool_call_id: key, tool_name: key, success: true, duration_ms: 1 }),
    env("agent.stream.chunk", { step_number: 1, chunk: "outer", chunk_index: key }),
    env("agent.status", { status: "completed" }),
  ].map((envelope, i) => ({ envelope, position: `e:${i + 1}` }));
}

for (const key of KEYS) {
  test(`a nested run keyed "${key}" stays the run's own and pollutes nothing`, () => {
    const before = shared();
    let view = createRunView("s-1");
    for (const { envelope, position } of records(key)) view = reduceRun(view, envelope, position);
    const all = reduceRunAll(createRunView("s-1"), records(key));
    let session = createSessionView("s-1");
    for (const { envelope, position } of records(key)) session = reduceSession(session, envelope, position);
    assert.deepEqual(shared(), before);
    assert.equal({}.status, undefined);
    assert.equal(typeof Object.prototype.execution_id, "undefined");
    assert.equal(session.runs.length, 1);
    for (const run of [view, all, latestRun(session)]) {
      assert.equal(run.status, "completed");
      assert.ok(Object.hasOwn(run.nested, key), "the nested run is under its own key");
      assert.ok(Object.hasOwn(run.nested[key], key));
      const child = run.nested[key][key];
      assert.equal(child.status, "completed");
      assert.equal(child.steps[0].tools[0].id, key);
      assert.ok(Object.hasOwn(child.steps[0].chunks, key));
      assert.equal(run.steps[0].tools[0].id, key);
      assert.ok(Object.hasOwn(run.steps[0].chunks, key));
    }
    // Plain JSON still: the same view after a round trip (as the Python reducer's).
    assert.deepEqual(JSON.parse(JSON.stringify(view)), JSON.parse(JSON.stringify(all)));
  });
}
