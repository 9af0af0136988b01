// Copies the built kit (dist/*.js) into frontend-demo/vendor/agent-broadcaster-client/,
// which the dashboard imports (it is served as it is, with no build step at run time).
// Usage: node scripts/vendor.mjs [--check]; with --check, exit 1 when the copy differs.
import { existsSync, mkdirSync, readFileSync, readdirSync, rmSync, writeFileSync } from "node:fs";
import { fileURLToPath } from "node:url";

const DIST = fileURLToPath(new URL("../dist/", import.meta.url));
const TARGET = fileURLToPath(new URL("../../../frontend-demo/vendor/agent-broadcaster-client/", import.meta.url));
const BANNER = "// Built from clients/js (@agent-broadcaster/client) by `npm run build && npm run vendor`; do not edit.\n";

/** {file name: text} of what the vendored folder should hold. */
export function wanted() {
  const files = {};
  for (const name of readdirSync(DIST).filter((n) => n.endsWith(".js") && n !== "react.js").sort()) {
    files[name] = BANNER + readFileSync(DIST + name, "utf8");
  }
  return files;
}

/** {file name: text} of what it holds. */
export function present() {
  if (!existsSync(TARGET)) return {};
  const files = {};
  for (const name of readdirSync(TARGET).filter((n) => n.endsWith(".js")).sort()) {
    files[name] = readFileSync(TARGET + name, "utf8");
  }
  return files;
}

if (process.argv[1] === fileURLToPath(import.meta.url)) {
  const files = wanted();
  if (process.argv.includes("--check")) {
    if (JSON.stringify(files) !== JSON.stringify(present())) {
      console.error("frontend-demo/vendor/agent-broadcaster-client is stale: run `npm run build && npm run vendor` in clients/js");
      process.exit(1);
    }
  } else {
    rmSync(TARGET, { recursive: true, force: true });
    mkdirSync(TARGET, { recursive: true });
    for (const [name, text] of Object.entries(files)) writeFileSync(TARGET + name, text);
  }
}
