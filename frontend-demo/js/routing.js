// Capability routing as the page knows it: which capability ran in a step
// and why. Pure data and functions (no DOM), like run-model.js; the client kit keeps
// the phases of each step apart from its tools (RunView step.routing).
//
// A routed run's phases arrive as tool pairs with reserved names (see
// agent_core/adapters/orchestration_broadcasting.py); they explain the step rather than being
// tools of it, so they are kept apart from the step's tool calls (which the snapshot
// lists and reconcile compares):
//   reference_resolver    args {input}, result = the rewritten request
//   intent_classifier     args {message}, result "<capability> · confidence <c> · <reason>"
//   continuation_decider  args {capability, success, duration_ms, session_id},
//                         result "done[ · final output: …]" | "continue → <cap>(<args>)",
//                         success false with the decider's error
//   session_memory        args {session_id, capability, success}, result
//                         "turn remembered · <n> kept" (after the request's last step)
// The capability itself is the step's actor (agent.step.started) and a tool pair.

/** {capability, confidence, reason} from the classifier's result summary. */
export function parseIntent(summary) {
  const parts = String(summary ?? "").split(" · ");
  const intent = { capability: parts.shift() || null, confidence: null, reason: "" };
  const match = /^confidence (\d+(?:\.\d+)?)$/.exec(parts[0] ?? "");
  if (match) {
    intent.confidence = Number(match[1]);
    parts.shift();
  }
  intent.reason = parts.join(" · ");
  return intent;
}

/** {verdict: "done"|"continue"|"failed"|"running", text} from the decider's pair. */
export function parseVerdict(decider) {
  if (decider.state !== "done") return { verdict: "running", text: "deciding…" };
  if (!decider.success) {
    return { verdict: "failed", text: `failed: ${decider.error ?? "unknown error"} — the capability's output stands` };
  }
  const text = decider.resultSummary ?? "";
  return { verdict: text.startsWith("continue") ? "continue" : "done", text };
}

/**
 * What the page shows for a routed step (null for an agent step):
 * {capability, intent, resolution, decider, memory}.
 */
export function routingOf(step) {
  if (!step.routing && !step.actor) return null;
  const stages = step.routing ?? {};
  const classifier = stages.intent_classifier;
  const resolver = stages.reference_resolver;
  const decider = stages.continuation_decider;
  const memory = stages.session_memory;
  return {
    capability: step.actor ?? null,
    intent: classifier?.state === "done" ? parseIntent(classifier.resultSummary) : null,
    resolution: resolver?.state === "done"
      ? { input: resolver.arguments?.input ?? null, output: resolver.resultSummary ?? "" }
      : null,
    decider: decider ? parseVerdict(decider) : null,
    memory: memory?.state === "done" ? memory.resultSummary ?? "" : null,
  };
}
