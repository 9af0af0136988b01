// One behaviour, two languages: the TypeScript reducer reproduces every golden run in
// tests/fixtures/runs/ exactly (tests/e2e/clients/test_fixtures.py holds Python to the same).
import assert from "node:assert/strict";
import { readdirSync, readFileSync } from "node:fs";
import { test } from "node:test";
import { applySnapshot, createRunView, reconcile, reduceRun, reduceRunAll } from "../dist/index.js";

const FOLDER = new URL("../../../tests/fixtures/runs/", import.meta.url);
const names = readdirSync(FOLDER).filter((name) => name.endsWith(".json")).sort();

test("the golden runs are there", () => {
  assert.ok(names.length >= 8, names.join(", "));
});

for (const name of names) {
  const fixture = JSON.parse(readFileSync(new URL(name, FOLDER), "utf8"));
  test(`${fixture.name}: ${fixture.description}`, () => {
    let view = createRunView(fixture.session_id);
    for (const op of fixture.ops) {
      view = op.snapshot ? applySnapshot(view, fixture.snapshot) : reduceRun(view, op.envelope, op.position);
    }
    assert.deepEqual(view, fixture.expected.view);
    const differences = fixture.snapshot ? reconcile(view, fixture.snapshot) : null;
    assert.deepEqual(differences, fixture.expected.differences);
  });
}

// reduceRunAll (a whole trace at once, one copy) builds the same view as reduceRun in turn.
for (const name of names) {
  const fixture = JSON.parse(readFileSync(new URL(name, FOLDER), "utf8"));
  test(`${fixture.name}: reduceRunAll folds it as reduceRun does`, () => {
    const start = createRunView(fixture.session_id);
    const frozen = JSON.stringify(start);
    let view = start;
    let batch = [];
    for (const op of fixture.ops) {
      if (op.snapshot) {
        view = applySnapshot(reduceRunAll(view, batch), fixture.snapshot);
        batch = [];
      } else {
        batch.push(op);
      }
    }
    view = reduceRunAll(view, batch);
    assert.deepEqual(view, fixture.expected.view);
    assert.equal(JSON.stringify(start), frozen); // the view given is not changed
  });
}

// A nested run (a routed capability's inner agent) stays out of its parent's steps,
// status and usage, and is exposed as nested[<call>][<execution>].
test("routed-nested: the inner run is nested under the capability's call", () => {
  const fixture = JSON.parse(readFileSync(new URL("routed-nested.json", FOLDER), "utf8"));
  const nested = (op) => Boolean(op.envelope.payload.parent_execution_id);
  const fold = (ops) => ops.reduce((view, op) => reduceRun(view, op.envelope, op.position), createRunView(fixture.session_id));
  const parent = fold(fixture.ops);
  const own = fold(fixture.ops.filter((op) => !nested(op)));
  const { nested: inner, position, ...rest } = parent;
  const { position: _ownPosition, ...ownRest } = own;
  assert.deepEqual(rest, ownRest);
  assert.equal(position, fixture.ops.at(-1).position);
  const [[call, runs]] = Object.entries(inner);
  assert.equal(parent.steps[0].tools.find((tool) => tool.id === call).name, "weather_agent");
  const [[execution, run]] = Object.entries(runs);
  assert.notEqual(execution, parent.execution_id);
  assert.equal(run.status, "completed");
  assert.deepEqual(run.steps.flatMap((step) => step.tools.map((tool) => tool.name)), ["get_weather", "calculator"]);
  assert.deepEqual(reconcile(parent, fixture.snapshot), []);
});
