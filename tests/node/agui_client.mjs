// Runs the scripted agent through POST /ag-ui with the official AG-UI client
// (@ag-ui/client's HttpAgent, which checks every event against the protocol's schemas
// and sequence rules) and prints one JSON line: the events received, the messages and
// state the client built from them, and any warning the client printed.
//
// Usage: node agui_client.mjs <url> <threadId> <runId> <user text> [pace_ms] [forwardedProps JSON]
// (the JSON's fields are added to forwardedProps, e.g. {"mode": "route", "max_steps": 2})
import { HttpAgent } from "@ag-ui/client";

const [url, threadId, runId, text, paceMs = "0", props = "{}"] = process.argv.slice(2);
const warnings = [];
console.warn = (...parts) => warnings.push(parts.map(String).join(" "));
console.error = (...parts) => warnings.push(parts.map(String).join(" "));

const agent = new HttpAgent({
  url,
  threadId,
  initialMessages: [{ id: `${runId}-user`, role: "user", content: text }],
});
const events = [];
const report = (fields) => process.stdout.write(JSON.stringify({ ...fields, events, warnings }) + "\n");

try {
  const result = await agent.runAgent(
    { runId, forwardedProps: { pace_ms: Number(paceMs), trace: true, ...JSON.parse(props) } },
    { onEvent: ({ event }) => { events.push(event); } },
  );
  report({ ok: true, messages: agent.messages, state: agent.state, newMessages: result.newMessages });
} catch (error) {
  report({ ok: false, error: String(error?.message ?? error) });
  process.exitCode = 1;
}
