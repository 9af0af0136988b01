// The envelope types are generated from the schema; this fails when they drift apart.
import assert from "node:assert/strict";
import { readFile } from "node:fs/promises";
import { test } from "node:test";
import { generate } from "../scripts/generate-types.mjs";

test("src/envelope.ts is what the schema generates today", async () => {
  const current = await readFile(new URL("../src/envelope.ts", import.meta.url), "utf8");
  assert.equal(current, await generate(), "src/envelope.ts is stale: run `npm run generate` in clients/js");
});
