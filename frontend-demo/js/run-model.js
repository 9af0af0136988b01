// The run as the page shows it. The envelopes are folded by the client kit
// (@agent-broadcaster/client, built into vendor/agent-broadcaster-client/ from
// clients/js): this file keeps no reducer. pageRun() projects the kit's RunView (plain
// JSON, snake_case) into the shape view.js renders (Maps by step number, chunk index and
// tool call id; times in ms), and the helpers below read that shape.

import { TERMINAL } from "../vendor/agent-broadcaster-client/index.js";

export { TERMINAL };

function time(timestamp) {
  const value = timestamp ? Date.parse(timestamp) : Number.NaN;
  return Number.isNaN(value) ? null : value;
}

function pageTool(tool) {
  return {
    id: tool.id,
    name: tool.name,
    argsSummary: tool.args_summary ?? undefined,
    arguments: tool.arguments,
    startedAt: time(tool.started_at),
    state: tool.state === "listed" ? undefined : tool.state, // named by step.completed only
    success: tool.success ?? undefined,
    error: tool.error,
    durationMs: tool.duration_ms ?? undefined,
    resultSummary: tool.result_summary,
  };
}

function pageStage(stage) {
  return {
    id: stage.id,
    arguments: stage.arguments,
    argsSummary: stage.args_summary,
    state: stage.state,
    success: stage.success ?? undefined,
    error: stage.error,
    durationMs: stage.duration_ms ?? undefined,
    resultSummary: stage.result_summary,
  };
}

function pageStep(step) {
  const routing = step.routing
    ? Object.fromEntries(Object.entries(step.routing).map(([name, stage]) => [name, pageStage(stage)]))
    : null;
  return {
    number: step.number,
    startedAt: time(step.started_at),
    availableTools: step.available_tools,
    chunks: new Map(Object.entries(step.chunks).map(([index, text]) => [Number(index), text])),
    streamComplete: step.stream_complete,
    tools: new Map(step.tools.map((tool) => [tool.id, pageTool(tool)])),
    completed: step.completed,
    continuation: step.continuation,
    actor: step.actor,
    routing,
    fromSnapshot: step.from_snapshot,
  };
}

/**
 * The page's run for the kit's RunView `view` followed on `channel`. `link` says what
 * the page knows of the run's server while the run has not ended: {link: "live" | "lost"
 * | "gone" | "unended", text (what to tell), haltedAt (ms: since when nothing can be
 * known; the clock stops there)}.
 */
export function pageRun(view, channel = null, link = null) {
  const ended = TERMINAL.has(view.status);
  return {
    link: link?.link ?? "live",
    linkText: link?.text ?? "",
    haltedAt: ended ? null : (link?.haltedAt ?? null),
    sessionId: view.session_id,
    channel,
    executionId: view.execution_id,
    status: view.status,
    statusPayload: {
      status: view.status,
      stop_reason: view.stop_reason,
      error_message: view.error,
      last_response: view.last_response,
      usage: view.reported_usage,
      state_url: view.state_url,
    },
    startedAt: time(view.started_at),
    endedAt: ended ? time(view.ended_at) : null,
    steps: new Map(view.steps.map((step) => [step.number, pageStep(step)])),
    eventCount: view.event_count,
    fromSnapshot: view.from_snapshot,
    stateUrl: view.state_url,
  };
}

/** The text streamed in `step`, chunks in index order. */
export function stepText(step) {
  return [...step.chunks.entries()]
    .sort((a, b) => a[0] - b[0])
    .map(([, chunk]) => chunk)
    .join("");
}

/** Steps in step-number order. */
export function orderedSteps(run) {
  return [...run.steps.values()].sort((a, b) => a.number - b.number);
}

/** The assistant's final answer: the last step's streamed text (or last_response). */
export function finalText(run) {
  const steps = orderedSteps(run).filter((step) => step.chunks.size > 0);
  if (steps.length) return stepText(steps[steps.length - 1]);
  return run.statusPayload?.last_response ?? "";
}

/** Totals built from the events: completed steps, token usage, run time. */
export function totals(run, now = Date.now()) {
  const usage = { prompt: 0, completion: 0, total: 0 };
  let completed = 0;
  let toolCalls = 0;
  for (const step of run.steps.values()) {
    toolCalls += step.tools.size;
    if (!step.completed) continue;
    completed += 1;
    for (const key of Object.keys(usage)) usage[key] += step.completed.usage?.[key] ?? 0;
  }
  // A run whose end will not come here (its server went away) stops its clock.
  const end = run.endedAt ?? (TERMINAL.has(run.status) ? null : (run.haltedAt ?? now));
  const elapsedMs = run.startedAt !== null && end !== null ? Math.max(0, end - run.startedAt) : null;
  return { steps: completed, usage, toolCalls, elapsedMs };
}
