// The run as the page knows it, built only from agent envelopes (and, when history was
// lost, from the state snapshot). Pure data and functions: no DOM, no network, so the
// same code can be checked outside a browser.
//
// Envelope: {type, session_id, execution_id, timestamp, payload}
// (schemas/agent-envelope.v1.schema.json).

import { applyStage, isStage } from "./routing.js";

export const TERMINAL = new Set(["completed", "failed"]);

/** A new, empty run for `sessionId`. */
export function createRun(sessionId, channel = null) {
  return {
    sessionId,
    channel,
    executionId: null,
    status: "pending",
    statusPayload: null,
    startedAt: null, // ms since epoch, from the first envelope
    endedAt: null, // ms since epoch, from the terminal agent.status
    steps: new Map(), // step number -> step (see newStep)
    eventCount: 0,
    fromSnapshot: false, // some steps were filled from the snapshot, not from events
    stateUrl: null,
  };
}

function newStep(number) {
  return {
    number,
    startedAt: null,
    availableTools: [],
    chunks: new Map(), // chunk_index -> text
    streamComplete: false,
    tools: new Map(), // tool_call_id -> tool (see applyTool*)
    completed: null, // agent.step.completed payload
    continuation: null, // agent.continuation payload (full trace)
    actor: null, // agent.step.started actor (a routed step's capability)
    routing: null, // routing phases of the step (routing.js applyStage)
    fromSnapshot: false,
  };
}

function stepOf(run, number) {
  let step = run.steps.get(number);
  if (!step) {
    step = newStep(number);
    run.steps.set(number, step);
  }
  return step;
}

/** The step a step-less event (tool, chunk) belongs to: the latest one started. */
function currentStepNumber(run) {
  let latest = 0;
  for (const number of run.steps.keys()) latest = Math.max(latest, number);
  return latest || 1;
}

function time(timestamp) {
  const value = Date.parse(timestamp);
  return Number.isNaN(value) ? null : value;
}

const HANDLERS = {
  "agent.status"(run, payload, at) {
    run.status = payload.status;
    run.statusPayload = payload;
    if (payload.state_url) run.stateUrl = payload.state_url;
    // A later run of the session (in_progress again) keeps the clock going.
    run.endedAt = TERMINAL.has(payload.status) ? at : null;
  },
  "agent.step.started"(run, payload, at) {
    const step = stepOf(run, payload.step_number);
    step.startedAt = at;
    step.availableTools = payload.available_tools || [];
    step.actor = payload.actor ?? null; // a routed step's capability (routing.js)
    if (run.status === "pending") run.status = "in_progress";
  },
  "agent.step.completed"(run, payload) {
    const step = stepOf(run, payload.step_number);
    step.completed = payload;
    for (const ref of payload.tool_calls || []) {
      if (!step.tools.has(ref.id)) step.tools.set(ref.id, { id: ref.id, name: ref.name });
    }
  },
  "agent.tool.started"(run, payload, at) {
    const step = stepOf(run, payload.step_number ?? currentStepNumber(run));
    if (isStage(payload.tool_name)) return applyStage(step, "agent.tool.started", payload);
    const tool = step.tools.get(payload.tool_call_id) || { id: payload.tool_call_id };
    Object.assign(tool, {
      name: payload.tool_name,
      argsSummary: payload.args_summary,
      startedAt: at,
      state: tool.state === "done" ? "done" : "running",
    });
    step.tools.set(tool.id, tool);
  },
  "agent.tool.completed"(run, payload) {
    const step = stepOf(run, payload.step_number ?? currentStepNumber(run));
    if (isStage(payload.tool_name)) return applyStage(step, "agent.tool.completed", payload);
    const tool = step.tools.get(payload.tool_call_id) || { id: payload.tool_call_id };
    Object.assign(tool, {
      name: payload.tool_name,
      state: "done",
      success: payload.success,
      error: payload.error ?? null,
      durationMs: payload.duration_ms,
      resultSummary: payload.result_summary ?? null,
    });
    step.tools.set(tool.id, tool);
  },
  "agent.stream.chunk"(run, payload) {
    const step = stepOf(run, payload.step_number ?? currentStepNumber(run));
    step.chunks.set(payload.chunk_index ?? step.chunks.size, payload.chunk);
    if (payload.is_complete) step.streamComplete = true;
  },
  "agent.continuation"(run, payload) {
    // Step 0 is the decision before the first step; keep it with step 1's start.
    stepOf(run, Math.max(payload.step_number, 1)).continuation = payload;
  },
};

/**
 * Apply one envelope to `run` (mutates it).
 * @returns {boolean} whether the envelope was understood (unknown types are ignored).
 */
export function applyEnvelope(run, envelope) {
  const handler = HANDLERS[envelope && envelope.type];
  if (!handler || !envelope.payload) return false;
  const at = time(envelope.timestamp);
  if (run.startedAt === null && at !== null) run.startedAt = at;
  if (envelope.execution_id) run.executionId = envelope.execution_id;
  handler(run, envelope.payload, at);
  run.eventCount += 1;
  return true;
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
export function finalText(run, { completedOnly = false } = {}) {
  // completedOnly: the text a stored state holds, as reconcile compares it (a step cut
  // off mid-stream, as by a run's maximum duration, is in no state).
  const steps = orderedSteps(run).filter(
    (step) => step.chunks.size > 0 && (!completedOnly || step.completed),
  );
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
  const end = run.endedAt ?? (TERMINAL.has(run.status) ? null : now);
  const elapsedMs = run.startedAt !== null && end !== null ? Math.max(0, end - run.startedAt) : null;
  return { steps: completed, usage, toolCalls, elapsedMs };
}

/** Tool call ids of `step`, sorted (the order in which they ran is not compared). */
function toolIds(step) {
  return [...step.tools.keys()].sort();
}

function lastAssistantText(snapshot) {
  const messages = Array.isArray(snapshot.messages) ? snapshot.messages : [];
  for (let i = messages.length - 1; i >= 0; i -= 1) {
    const message = messages[i];
    if (message.role === "assistant" && message.content) return message.content;
  }
  return "";
}

/**
 * The session's total tokens as the events tell them: the steps' sum when the page saw
 * the session from step 1, else the final agent.status (it counts the whole session);
 * null when neither is known (the earlier runs' events and the final status were lost,
 * the steps came from the snapshot), as nothing independent of the snapshot is left.
 */
function sessionTokens(run, built, earlier) {
  if (earlier === 0) return built.usage.total;
  const final = run.statusPayload;
  return TERMINAL.has(final?.status) && final.usage ? final.usage.total : null;
}

/**
 * Compare what the page built from events with the final state snapshot
 * (GET /api/sessions/{id}/state).
 * @returns {{field: string, step?: number, events: string, snapshot: string}[]}
 *   one entry per difference; empty when in sync.
 */
export function reconcile(run, snapshot) {
  const differences = [];
  const differ = (field, events, snap, step) => {
    const a = String(events);
    const b = String(snap);
    if (a !== b) differences.push({ field, step, events: a, snapshot: b });
  };
  const built = totals(run);
  // A later run of a session numbers its steps after the earlier runs' steps, and the
  // snapshot counts them all (and their tokens): compare with the run's share of them.
  const stepNumbers = [...run.steps.keys()];
  const earlier = stepNumbers.length ? Math.max(0, Math.min(...stepNumbers) - 1) : 0;
  differ("status", run.status, snapshot.status);
  differ("step count", built.steps + earlier, snapshot.step_count);
  const tokens = sessionTokens(run, built, earlier);
  if (tokens !== null) differ("total tokens", tokens, snapshot.usage?.total ?? 0);
  const snapSteps = new Map((snapshot.steps || []).map((step) => [step.step_number, step]));
  const numbers = new Set([...snapSteps.keys(), ...[...run.steps.values()].filter((s) => s.completed).map((s) => s.number)]);
  for (const number of [...numbers].sort((a, b) => a - b)) {
    const mine = run.steps.get(number);
    const theirs = snapSteps.get(number);
    if (!mine || !mine.completed) {
      differences.push({ field: "step", step: number, events: "missing", snapshot: "present" });
      continue;
    }
    if (!theirs) {
      // The snapshot may keep only the last steps (maxSteps); only a step number beyond
      // the snapshot's count is a real difference.
      if (number > snapshot.step_count) {
        differences.push({ field: "step", step: number, events: "present", snapshot: "missing" });
      }
      continue;
    }
    const theirIds = (theirs.tool_calls || []).map((call) => call.id).sort();
    differ("tool call ids", toolIds(mine).join(", ") || "none", theirIds.join(", ") || "none", number);
    differ("finish reason", mine.completed.finish_reason ?? "none", theirs.finish_reason ?? "none", number);
  }
  differ("final assistant text", finalText(run, { completedOnly: true }), lastAssistantText(snapshot));
  return differences;
}

/**
 * Fill steps the events did not give (history lost) from the snapshot, marking them.
 * Steps already known from events are left alone.
 */
export function fillFromSnapshot(run, snapshot) {
  for (const summary of snapshot.steps || []) {
    const existing = run.steps.get(summary.step_number);
    if (existing && existing.completed) continue;
    const step = stepOf(run, summary.step_number);
    step.fromSnapshot = true;
    step.actor ??= summary.actor ?? null; // a routed run's capability (process snapshot)
    step.completed = {
      step_number: summary.step_number,
      has_tool_calls: summary.has_tool_calls,
      errors: summary.errors ?? 0,
      finish_reason: summary.finish_reason ?? null,
      usage: { prompt: 0, completion: 0, total: summary.usage?.total ?? 0 },
      duration_ms: summary.duration_ms ?? 0,
      tool_calls: summary.tool_calls || [],
      continuation: null,
    };
    for (const ref of summary.tool_calls || []) {
      if (!step.tools.has(ref.id)) step.tools.set(ref.id, { id: ref.id, name: ref.name });
    }
    run.fromSnapshot = true;
  }
  if (TERMINAL.has(snapshot.status) && !TERMINAL.has(run.status)) {
    run.status = snapshot.status;
  }
  const text = lastAssistantText(snapshot);
  const last = orderedSteps(run).at(-1);
  if (text && last && last.chunks.size === 0 && TERMINAL.has(snapshot.status)) {
    last.chunks.set(0, text);
    last.streamComplete = true;
  }
}
