// A session's envelopes as runs: pure data and functions (no DOM), for the run page.
//
// Everything here is computed from the envelopes themselves ({envelope, position}
// records, in channel order), so it works the same on a trace download
// (GET /api/sessions/{id}/trace) and on envelopes followed live. Each run is folded by
// the client kit's reducer (reduceRun); this file keeps no reducer of its own, only
// the time axis (start offsets from envelope timestamps), the continuation verdict's
// explanation and the alignment of two runs.

import { STAGES, createRunView, reduceRunAll } from "../vendor/agent-broadcaster-client/run.js";

function time(timestamp) {
  const value = timestamp ? Date.parse(timestamp) : Number.NaN;
  return Number.isNaN(value) ? null : value;
}

/**
 * Split a session's records into runs by execution_id (a new id starts a new run;
 * records without one stay with the run before them; a nested run's records, those
 * with payload.parent_execution_id, stay with the run they are nested in). Returns
 * [{executionId, records, view}] in order of first appearance, `view` being the kit's
 * RunView of that run alone, so two runs on one session never merge.
 */
export function splitRuns(records, sessionId = null) {
  const runs = [];
  const byId = new Map();
  const roots = new Map(); // a nested run's execution id -> the top-level run's
  let current = null;
  for (const record of records) {
    const parent = record.envelope?.payload?.parent_execution_id;
    let id;
    if (parent) {
      // A nested run (a routed capability's inner agent) belongs to its parent's run.
      id = roots.get(parent) ?? parent;
      if (record.envelope.execution_id) roots.set(record.envelope.execution_id, id);
    } else {
      id = record.envelope?.execution_id || current?.executionId || null;
    }
    let run = byId.get(id);
    if (!run) {
      run = { executionId: id, records: [], view: null };
      byId.set(id, run);
      runs.push(run);
    }
    run.records.push(record);
    current = run;
  }
  for (const run of runs) run.view = foldRun(run.records, sessionId ?? run.records[0]?.envelope?.session_id ?? null);
  return runs;
}

/** One run's RunView from its records, in order (the kit's reducer, one copy). */
export function foldRun(records, sessionId = null) {
  return reduceRunAll(createRunView(sessionId), records);
}

/**
 * A RunSummary (the shape GET /api/sessions answers) made from a RunView, for runs known
 * only from their envelopes (the run page following a channel).
 */
export function summaryOf(view, records = []) {
  const seconds = (timestamp) => {
    const ms = time(timestamp);
    return ms === null ? null : ms / 1000;
  };
  const sums = runTotals(view);
  const status = view.status === "completed" || view.status === "failed" ? view.status : "running";
  const actor = view.steps.find((step) => step.actor)?.actor ?? null;
  return {
    session_id: view.session_id,
    execution_id: view.execution_id,
    started_at: seconds(view.started_at),
    ended_at: status === "running" ? null : seconds(view.ended_at),
    status,
    stop_reason: view.stop_reason,
    resolved_by: view.resolved_by,
    steps: sums.steps,
    tool_calls: sums.toolCalls,
    tokens: { input: view.usage.prompt, output: view.usage.completion, total: view.usage.total },
    capability: actor,
    error: view.error,
    input_preview: "",
    private: false,
    first_position: records[0]?.position ?? null,
    last_position: records.at(-1)?.position ?? null,
  };
}

/** Totals of one RunView: steps completed, tool calls, tokens, duration in ms. */
export function runTotals(view) {
  let completed = 0;
  let toolCalls = 0;
  for (const step of view.steps) {
    toolCalls += step.tools.length;
    if (step.completed) completed += 1;
  }
  const start = time(view.started_at);
  const end = time(view.ended_at);
  return {
    steps: completed,
    toolCalls,
    tokens: { ...view.usage },
    durationMs: start !== null && end !== null ? Math.max(0, end - start) : null,
  };
}

function stepNumberOf(payload, fallback) {
  const number = payload?.step_number;
  return Number.isInteger(number) ? Math.max(number, 1) : fallback;
}

/**
 * The waterfall of one run: spans on one time axis, offsets in ms from the run's first
 * envelope. Each span: {id, kind: "step"|"model"|"tool"|"stage"|"capability", label,
 * step, depth, startMs, endMs (null while open), state, detail, parent}. Steps are at
 * depth 0; a step's model call, tools and routing stages at depth 1; in a routed step
 * the capability call holds the work it did: the steps of the run nested under it (its
 * inner agent, records with payload.parent_tool_call_id; kind "step" with `nested`,
 * depth 2 and below) and the stages after the call (depth 2).
 */
export function waterfall(records) {
  const { roots, totalMs } = build(records, null, "", null);
  const ordered = [];
  const walk = (span) => {
    ordered.push(span);
    for (const child of span.children ?? []) walk(child);
  };
  for (const step of roots) walk(step);
  for (const span of ordered) {
    if (span.startMs === null) span.startMs = 0;
    if (span.endMs === null) span.openEnd = true;
  }
  return { spans: ordered, totalMs };
}

/** Move a span and its children `by` levels deeper. */
function deepen(span, by) {
  span.depth += by;
  for (const child of span.children ?? []) deepen(child, by);
}

/**
 * The step spans of `records`: run `own` (null: the top-level run) and the runs nested
 * in it, offsets from `origin0` when given.
 */
function build(records, origin0, prefix, own) {
  const spans = [];
  let origin = origin0;
  const nested = new Map(); // parent tool_call_id -> the records of runs nested under it
  const steps = new Map(); // step number -> step span
  const open = new Map(); // tool_call_id -> span
  const models = new Map(); // step number -> model span
  let currentStep = 1;
  let lastAt = null;

  const offset = (at) => (at === null || origin === null ? null : at - origin);
  const stepSpan = (number, at) => {
    let span = steps.get(number);
    if (!span) {
      span = { id: `${prefix}step-${number}`, kind: "step", label: `Step ${number}`, step: number, depth: 0,
        startMs: offset(at), endMs: null, state: "running", detail: "", parent: null, children: [] };
      steps.set(number, span);
      spans.push(span);
    }
    return span;
  };
  const closeModel = (number, at) => {
    const model = models.get(number);
    if (model && model.endMs === null) {
      model.endMs = offset(at);
      model.state = "done";
    }
  };

  for (const { envelope } of records) {
    if (!envelope || typeof envelope !== "object") continue;
    const at = time(envelope.timestamp);
    if (origin === null && at !== null) origin = at;
    if (at !== null) lastAt = at;
    const payload = envelope.payload || {};
    if (payload.parent_tool_call_id && envelope.execution_id !== own) {
      const list = nested.get(payload.parent_tool_call_id) ?? [];
      list.push({ envelope });
      nested.set(payload.parent_tool_call_id, list);
      continue;
    }
    switch (envelope.type) {
      case "agent.step.started": {
        const number = stepNumberOf(payload, currentStep);
        currentStep = number;
        const step = stepSpan(number, at);
        step.startMs = offset(at);
        if (payload.actor) step.detail = `actor ${payload.actor}`;
        const model = { id: `${prefix}model-${number}`, kind: "model", label: payload.actor ? `${payload.actor}` : "model call",
          step: number, depth: 1, startMs: offset(at), endMs: null, state: "running", detail: "", parent: step };
        models.set(number, model);
        step.children.push(model);
        break;
      }
      case "agent.tool.started": {
        const number = stepNumberOf(payload, currentStep);
        const step = stepSpan(number, at);
        const name = payload.tool_name || "tool";
        const stage = STAGES.has(name);
        const capability = !stage && step.detail.startsWith("actor ") && step.detail.slice(6) === name;
        if (!stage) closeModel(number, at);
        const span = { id: `${prefix}tool-${payload.tool_call_id}`, kind: stage ? "stage" : capability ? "capability" : "tool",
          label: name, step: number, depth: 1, startMs: offset(at), endMs: null, state: "running",
          detail: payload.args_summary || "", parent: step, toolCallId: payload.tool_call_id, children: [] };
        if (capability) {
          // In a routed step the model span is the capability itself: drop the placeholder.
          const model = models.get(number);
          if (model) step.children.splice(step.children.indexOf(model), 1);
          models.delete(number);
        }
        step.children.push(span);
        open.set(payload.tool_call_id, span);
        break;
      }
      case "agent.tool.completed": {
        const span = open.get(payload.tool_call_id);
        if (!span) break;
        const end = offset(at);
        span.endMs = end;
        if (typeof payload.duration_ms === "number" && end !== null) span.startMs = Math.min(span.startMs ?? end, end - payload.duration_ms);
        span.state = payload.success === false ? "error" : "done";
        const outcome = payload.success === false ? payload.error : payload.result_summary;
        if (outcome) span.detail = span.detail ? `${span.detail} → ${outcome}` : `→ ${outcome}`;
        break;
      }
      case "agent.stream.chunk": {
        const number = stepNumberOf(payload, currentStep);
        if (payload.is_complete) closeModel(number, at);
        break;
      }
      case "agent.step.completed": {
        const number = stepNumberOf(payload, currentStep);
        const step = stepSpan(number, at);
        closeModel(number, at);
        step.endMs = offset(at);
        if (step.startMs === null && step.endMs !== null) step.startMs = step.endMs - (payload.duration_ms ?? 0);
        step.state = payload.errors ? "error" : "done";
        const total = payload.usage?.total;
        const parts = [step.detail, payload.finish_reason ? `finish ${payload.finish_reason}` : "", total !== undefined ? `${total} tokens` : ""];
        step.detail = parts.filter(Boolean).join(" · ");
        break;
      }
      default:
        break;
    }
  }
  // The runs nested under a call (a capability's inner agent): their steps, on the same
  // time axis, under the call.
  for (const [callId, inner] of nested) {
    const call = open.get(callId);
    if (!call) continue;
    const execution = inner[0].envelope.execution_id;
    const built = build(inner, origin, `${prefix}nested-${execution}-`, execution);
    for (const step of built.roots) {
      step.nested = execution;
      step.parent = call;
      deepen(step, call.depth + 1);
      call.children.push(step);
    }
  }
  // In a routed step the continuation decider judges the capability's work: nest the
  // stages that come after the capability call under it.
  for (const step of steps.values()) {
    const capability = step.children.find((child) => child.kind === "capability");
    if (!capability) continue;
    const after = step.children.filter((child) => child.kind === "stage" && child.label === "continuation_decider");
    for (const child of after) {
      step.children.splice(step.children.indexOf(child), 1);
      child.depth = 2;
      child.parent = capability;
      capability.children.push(child);
    }
  }
  const totalMs = origin !== null && lastAt !== null ? lastAt - origin : 0;
  return { roots: [...steps.values()].sort((a, b) => a.step - b.step), totalMs };
}

const RULES = {
  forbid: "a forbid always stops (rule 1: any forbid → stop)",
  error: "errors win over other forbids judged in the same evaluation (rule 1, error first)",
  request: "a request continues the run even against a stop (rule 2: request beats stop)",
  stop: "with no forbid and no request, a stop ends the run (rule 2: allow only without a stop)",
  allow: "only allows: the run continues on them (rule 2), no single criterion decided",
  none: "no evaluations at all: the run stops (rule 3)",
};

/**
 * Why a continuation decision came out as it did, from its evaluations (agent.continuation)
 * following agent_core/continuation.py: {forbade, requested, stopped, allowed (criterion
 * names), winner (criterion or null), rule (text), decision}.
 */
export function explainContinuation(cont) {
  const evaluations = cont?.evaluations ?? [];
  const named = (decision) => evaluations.filter((e) => e.decision === decision).map((e) => e.criterion);
  const forbade = named("forbid");
  const requested = named("request");
  const stopped = named("stop");
  const allowed = named("allow");
  let winner = cont?.resolved_by ?? null;
  let rule;
  if (!evaluations.length) {
    rule = cont ? RULES.none : "";
  } else if (forbade.length) {
    const error = evaluations.find((e) => e.stop_reason === "error" && (e.decision === "forbid" || e.decision === "request"));
    rule = error && error.criterion === winner && forbade[0] !== winner ? RULES.error : RULES.forbid;
  } else if (requested.length) {
    rule = RULES.request;
  } else if (stopped.length) {
    rule = RULES.stop;
  } else {
    rule = RULES.allow;
  }
  if (winner === "aggregate") winner = null;
  return { forbade, requested, stopped, allowed, winner, rule, decision: cont?.should_continue ? "continue" : "stop" };
}

/**
 * How a continuation decision came out, for drawing it: "continue"; "completed" (a stop
 * because the work is done); "error" (a stop for an error: the run fails); "limit" (a
 * stop at a limit or guard: steps, time, budget...). The live page and the run page
 * colour a decision by this alone, so "stop (error)" is never drawn as a success.
 */
export function decisionOutcome(cont) {
  if (!cont) return null;
  if (cont.should_continue) return "continue";
  const reason = cont.stop_reason ?? null;
  if (reason === "error") return "error";
  return reason === null || reason === "completed" ? "completed" : "limit";
}

/**
 * A step's state, for drawing it: "running", "stopped" (the run ended before the step
 * did), "failed" (an error in the step, or it finished for an error) or "done".
 */
export function stepState(step, runEnded) {
  const completed = step.completed;
  if (!completed) return runEnded ? "stopped" : "running";
  return completed.errors > 0 || completed.finish_reason === "error" ? "failed" : "done";
}

/** "continue", or "stop (<stop reason>)": a stop reason is only named for a stop. */
export function decisionText(cont) {
  if (cont.should_continue) return "continue";
  return cont.stop_reason ? `stop (${cont.stop_reason})` : "stop";
}

/** What a step did, for comparing runs: tool calls with arguments, decision, tokens. */
function stepFacts(step) {
  const cont = step?.continuation ?? step?.completed?.continuation ?? null;
  return {
    tools: (step?.tools ?? []).map((tool) => tool.name ?? "?"),
    arguments: (step?.tools ?? []).map((tool) => JSON.stringify(tool.arguments ?? tool.args_summary ?? null)),
    decision: cont ? `${decisionText(cont)} by ${cont.resolved_by ?? "?"}` : "—",
    tokens: step?.completed?.usage?.total ?? null,
  };
}

export const COMPARED = ["tools", "arguments", "decision", "tokens"];

/**
 * Two RunViews side by side, steps aligned in order (the i-th step of each: a later run
 * of a session numbers its steps on): {rows: [{index, left, right, leftNumber,
 * rightNumber, differs: [field...]}], first: {index, field} | null} where `first` is the
 * first divergence in step order (tool calls, then their arguments, the decision,
 * tokens; "step" when one run has no such step).
 */
export function alignRuns(left, right) {
  const a = [...left.steps].sort((x, y) => x.number - y.number);
  const b = [...right.steps].sort((x, y) => x.number - y.number);
  let first = null;
  const rows = [];
  for (let index = 0; index < Math.max(a.length, b.length); index += 1) {
    const stepA = a[index] ?? null;
    const stepB = b[index] ?? null;
    const factsA = stepA ? stepFacts(stepA) : null;
    const factsB = stepB ? stepFacts(stepB) : null;
    const differs = !factsA || !factsB
      ? [...COMPARED]
      : COMPARED.filter((field) => JSON.stringify(factsA[field]) !== JSON.stringify(factsB[field]));
    if (!first && differs.length) first = { index, field: !factsA || !factsB ? "step" : differs[0] };
    rows.push({ index, left: factsA, right: factsB, leftNumber: stepA?.number ?? null, rightNumber: stepB?.number ?? null, differs });
  }
  return { rows, first };
}

/** Short text of an envelope for one line of the inspector. */
export function describe(envelope) {
  const p = envelope?.payload || {};
  switch (envelope?.type) {
    case "agent.status":
      return `${p.status ?? ""}${p.stop_reason ? ` (${p.stop_reason})` : ""}`;
    case "agent.step.started":
    case "agent.step.completed":
    case "agent.continuation":
      return `step ${p.step_number}`;
    case "agent.tool.started":
    case "agent.tool.completed":
      return `${p.tool_name} ${p.tool_call_id}`;
    case "agent.stream.chunk":
      return `#${p.chunk_index} ${JSON.stringify(p.chunk)}`;
    default:
      return "";
  }
}

/** The step an envelope belongs to (null for run-level ones such as agent.status). */
export function stepOfEnvelope(envelope, fallback = null) {
  const number = envelope?.payload?.step_number;
  if (Number.isInteger(number)) return Math.max(number, 1);
  return envelope?.type === "agent.stream.chunk" ? fallback : null;
}
