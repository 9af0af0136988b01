// The dashboard imports the built kit from frontend-demo/vendor/: it must be this build.
import assert from "node:assert/strict";
import { test } from "node:test";
import { present, wanted } from "../scripts/vendor.mjs";

test("frontend-demo/vendor/agent-broadcaster-client is the kit as built now", () => {
  assert.deepEqual(present(), wanted(), "stale: run `npm run build && npm run vendor` in clients/js");
});
