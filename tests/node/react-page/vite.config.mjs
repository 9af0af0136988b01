// The page of tests/e2e/clients/test_react_page.py: built where the test copies this
// folder (its node_modules a link to tests/node's). The client kit resolves as a
// user's install of it would: through clients/js's package.json exports, to its dist/.
import { readFileSync } from "node:fs";
import { join } from "node:path";
import { fileURLToPath } from "node:url";
import { defineConfig } from "vite";

const kit = process.env.AGENT_BROADCASTER_CLIENT;
if (!kit) throw new Error("set AGENT_BROADCASTER_CLIENT to the clients/js folder");
const manifest = JSON.parse(readFileSync(join(kit, "package.json"), "utf8"));
const alias = Object.entries(manifest.exports).map(([entry, targets]) => ({
  find: manifest.name + entry.slice(1), // "." -> the name, "./react" -> name + "/react"
  replacement: join(kit, targets.import),
}));

export default defineConfig({
  root: fileURLToPath(new URL(".", import.meta.url)),
  logLevel: "warn",
  resolve: {
    // Longest first: "@agent-broadcaster/client/react" before "@agent-broadcaster/client".
    alias: alias.sort((a, b) => b.find.length - a.find.length),
    // One React: the kit's own development copy must not be bundled a second time.
    dedupe: ["react", "react-dom"],
  },
  build: { outDir: process.env.PAGE_OUT ?? "dist", emptyOutDir: true },
});
