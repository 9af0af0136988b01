// reduceSession keeps a session's runs apart: one RunView per top-level run, each the
// view reduceRun builds from that run's envelopes alone (tests/e2e/clients/
// test_fixtures.py holds the Python kit's reduce_session to the same).
import assert from "node:assert/strict";
import { readdirSync, readFileSync } from "node:fs";
import { test } from "node:test";
import {
  applySessionSnapshot,
  createRunView,
  createSessionView,
  latestRun,
  reduceRun,
  reduceSession,
  runOf,
} from "../dist/index.js";

const FOLDER = new URL("../../../tests/fixtures/runs/", import.meta.url);
const fixtures = readdirSync(FOLDER)
  .filter((name) => name.endsWith(".json"))
  .sort()
  .map((name) => JSON.parse(readFileSync(new URL(name, FOLDER), "utf8")))
  .filter((fixture) => !fixture.ops.some((op) => op.snapshot));

/** The fixture's ops grouped by top-level run (a nested run's ops with its parent's). */
function byRun(fixture) {
  const runs = new Map();
  const root = new Map();
  let last = null;
  for (const op of fixture.ops) {
    const { execution_id: id, payload } = op.envelope;
    const parent = payload.parent_execution_id;
    const key = parent ? (root.get(parent) ?? parent) : (id ?? last);
    if (parent && id) root.set(id, key);
    if (!runs.has(key)) runs.set(key, []);
    runs.get(key).push(op);
    last = key;
  }
  return [...runs.values()];
}

for (const fixture of fixtures) {
  test(`${fixture.name}: reduceSession keeps each run as reduceRun builds it alone`, () => {
    let session = createSessionView(fixture.session_id);
    for (const op of fixture.ops) session = reduceSession(session, op.envelope, op.position);
    const expected = byRun(fixture).map((ops) =>
      ops.reduce((view, op) => reduceRun(view, op.envelope, op.position), createRunView(fixture.session_id)));
    assert.deepEqual(session.runs, expected);
    assert.equal(session.position, fixture.ops.at(-1).position);
    if (expected.length === 1) assert.deepEqual(latestRun(session), fixture.expected.view);
  });
}

test("second-run: the session's two runs are apart, each with its own steps, status and error", () => {
  const fixture = JSON.parse(readFileSync(new URL("second-run.json", FOLDER), "utf8"));
  let session = createSessionView(fixture.session_id);
  const seen = [];
  for (const op of fixture.ops) {
    const before = session;
    session = reduceSession(session, op.envelope, op.position);
    if (session.runs.length === 2 && before.runs.length === 2) {
      assert.equal(session.runs[0], before.runs[0], "a run the envelope does not touch is the same object");
    }
    seen.push(session.runs.length);
  }
  assert.deepEqual([...new Set(seen)], [1, 2]);
  const [first, second] = session.runs;
  assert.notEqual(first.execution_id, second.execution_id);
  // The first run failed (its error stays with it); the second completed.
  assert.equal(first.status, "failed");
  assert.match(first.error, /failed on purpose/);
  assert.equal(second.status, "completed");
  assert.equal(second.error, null);
  const numbers = (run) => run.steps.map((step) => step.number);
  assert.equal(numbers(second)[0], numbers(first).at(-1) + 1);
  assert.equal(runOf(session, first.execution_id), first);
  assert.equal(runOf(session, "x-none"), null);
  // An envelope already applied (a replay) and a non-agent event leave the session as it was.
  const last = fixture.ops.at(-1);
  assert.equal(reduceSession(session, last.envelope, last.position), session);
  assert.equal(reduceSession(session, { type: "client-typing", payload: {} }, null), session);
});

test("a nested run's envelopes seen before its parent's stay with the run their parent starts", () => {
  const fixture = JSON.parse(readFileSync(new URL("routed-nested.json", FOLDER), "utf8"));
  const nested = fixture.ops.filter((op) => op.envelope.payload.parent_execution_id);
  const own = fixture.ops.filter((op) => !op.envelope.payload.parent_execution_id);
  let session = createSessionView(fixture.session_id);
  for (const op of [...nested, ...own]) session = reduceSession(session, op.envelope, null);
  assert.equal(session.runs.length, 1);
  assert.equal(session.runs[0].execution_id, own[0].envelope.execution_id);
  assert.deepEqual(Object.keys(session.runs[0].nested), [nested[0].envelope.payload.parent_tool_call_id]);
});

test("applySessionSnapshot fills the latest run, and gives a session with no run one", () => {
  const snapshot = { status: "completed", step_count: 1, steps: [{ step_number: 1, finish_reason: "stop" }], messages: [{ role: "assistant", content: "hi" }] };
  const filled = applySessionSnapshot(createSessionView("s-1"), snapshot);
  assert.equal(filled.runs.length, 1);
  assert.equal(filled.runs[0].status, "completed");
  assert.equal(filled.runs[0].steps[0].from_snapshot, true);
});
