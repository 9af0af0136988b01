// Mounts the README's useAgentSession example (src/readme-example.tsx, written from
// README.md by tests/e2e/clients/test_react_page.py) for ?session=<id>&since=<position>.
import { createRoot } from "react-dom/client";
import { RunStatus } from "./readme-example";

const query = new URLSearchParams(location.search);
const root = document.getElementById("root");
if (!root) throw new Error("no #root");
createRoot(root).render(
  <RunStatus sessionId={query.get("session") ?? ""} since={query.get("since") ?? undefined} />,
);
