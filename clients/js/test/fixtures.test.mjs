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
