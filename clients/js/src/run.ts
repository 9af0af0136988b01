// The run as a client knows it, folded from agent envelopes only: a pure reducer over
// plain JSON data. The same RunView, field for field, is built by the Python reducer
// (broadcaster/client.py, reduce_run); tests/fixtures/runs/ holds runs both must
// reproduce exactly. Ported from the dashboard's frontend-demo/js/run-model.js.

import type {
  AgentEventEnvelope,
  ContinuationPayload,
  StatusPayload,
  ToolCompletedPayload,
  ToolStartedPayload,
} from "./envelope.js";
import { isReplay } from "./position.js";

export const TERMINAL: ReadonlySet<string> = new Set(["completed", "failed"]);

/** The reserved tool names of a routed run's phases (agent_core's orchestration adapter). */
export const STAGES: ReadonlySet<string> = new Set([
  "reference_resolver",
  "intent_classifier",
  "continuation_decider",
  "session_memory",
]);

export interface Usage {
  prompt: number;
  completion: number;
  total: number;
}

export interface ToolView {
  id: string;
  name: string | null;
  args_summary: string | null;
  arguments: Record<string, unknown> | null;
  /** "listed": named by step.completed only; "running"; "done". */
  state: "listed" | "running" | "done";
  success: boolean | null;
  error: string | null;
  duration_ms: number | null;
  result_summary: string | null;
  started_at: string | null;
}

export interface StageView {
  id: string;
  arguments: Record<string, unknown> | null;
  args_summary: string;
  state: "running" | "done";
  success: boolean | null;
  error: string | null;
  duration_ms: number | null;
  result_summary: string | null;
}

export interface CompletedView {
  finish_reason: string | null;
  usage: Usage;
  duration_ms: number;
  has_tool_calls: boolean;
  errors: number;
  continuation: { should_continue: boolean; stop_reason: string | null; resolved_by: string } | null;
}

export interface StepView {
  number: number;
  started_at: string | null;
  available_tools: string[];
  /** A routed step's capability (agent.step.started actor). */
  actor: string | null;
  /** Streamed text by chunk index (JSON object keys are strings). */
  chunks: Record<string, string>;
  /** The chunks joined in index order. */
  text: string;
  stream_complete: boolean;
  tools: ToolView[];
  completed: CompletedView | null;
  /** The full continuation decision after this step (every criterion's evaluation). */
  continuation: ContinuationPayload | null;
  routing: Record<string, StageView> | null;
  /** Filled from the state snapshot because its events were lost. */
  from_snapshot: boolean;
}

export interface RunView {
  session_id: string | null;
  execution_id: string | null;
  status: string;
  stop_reason: string | null;
  /** The criterion that resolved the last continuation decision. */
  resolved_by: string | null;
  error: string | null;
  last_response: string | null;
  state_url: string | null;
  /** Token usage summed over the completed steps. */
  usage: Usage;
  /** The session's usage as the terminal agent.status reported it. */
  reported_usage: Usage | null;
  started_at: string | null;
  ended_at: string | null;
  steps: StepView[];
  event_count: number;
  /** The position of the last envelope applied (the resume point). */
  position: string | null;
  from_snapshot: boolean;
  /**
   * Runs nested in this one (a routed capability's inner agent), by the tool call they
   * serve, then by execution id; present only once one arrives.
   */
  nested?: Record<string, Record<string, RunView>>;
}

/** A new, empty run. */
export function createRunView(sessionId: string | null = null): RunView {
  return {
    session_id: sessionId,
    execution_id: null,
    status: "pending",
    stop_reason: null,
    resolved_by: null,
    error: null,
    last_response: null,
    state_url: null,
    usage: zeroUsage(),
    reported_usage: null,
    started_at: null,
    ended_at: null,
    steps: [],
    event_count: 0,
    position: null,
    from_snapshot: false,
  };
}

/**
 * The record's own value at `key`, never an inherited one: a key an envelope chose
 * ("__proto__", "constructor") reads nothing from Object.prototype.
 */
function own<T>(record: Record<string, T>, key: string): T | undefined {
  return Object.hasOwn(record, key) ? record[key] : undefined;
}

/**
 * Set the record's own property `key` (a data property, whatever the key: assigning
 * "__proto__" would set the record's prototype instead). Returns `value`.
 */
function setOwn<T>(record: Record<string, T>, key: string, value: T): T {
  Object.defineProperty(record, key, { value, writable: true, enumerable: true, configurable: true });
  return value;
}

function zeroUsage(): Usage {
  return { prompt: 0, completion: 0, total: 0 };
}

function usageOf(raw: { prompt?: number; completion?: number; total?: number } | null | undefined): Usage {
  return { prompt: raw?.prompt ?? 0, completion: raw?.completion ?? 0, total: raw?.total ?? 0 };
}

function newStep(number: number): StepView {
  return {
    number,
    started_at: null,
    available_tools: [],
    actor: null,
    chunks: {},
    text: "",
    stream_complete: false,
    tools: [],
    completed: null,
    continuation: null,
    routing: null,
    from_snapshot: false,
  };
}

function stepOf(run: RunView, number: number): StepView {
  let step = run.steps.find((candidate) => candidate.number === number);
  if (!step) {
    step = newStep(number);
    run.steps.push(step);
    run.steps.sort((a, b) => a.number - b.number);
  }
  return step;
}

/** The step a step-less event (tool, chunk) belongs to: the latest one started. */
function currentStepNumber(run: RunView): number {
  return run.steps.at(-1)?.number ?? 1;
}

function toolOf(step: StepView, id: string): ToolView {
  let tool = step.tools.find((candidate) => candidate.id === id);
  if (!tool) {
    tool = {
      id,
      name: null,
      args_summary: null,
      arguments: null,
      state: "listed",
      success: null,
      error: null,
      duration_ms: null,
      result_summary: null,
      started_at: null,
    };
    step.tools.push(tool);
  }
  return tool;
}

function recomputeUsage(run: RunView): void {
  const usage = zeroUsage();
  for (const step of run.steps) {
    if (!step.completed) continue;
    usage.prompt += step.completed.usage.prompt;
    usage.completion += step.completed.usage.completion;
    usage.total += step.completed.usage.total;
  }
  run.usage = usage;
}

function applyStatus(run: RunView, payload: StatusPayload, at: string | null): void {
  run.status = payload.status;
  if (payload.state_url) run.state_url = payload.state_url;
  if (TERMINAL.has(payload.status)) {
    run.ended_at = at;
    run.stop_reason = payload.stop_reason ?? null;
    run.error = payload.error_message ?? null;
    run.last_response = payload.last_response ?? null;
    run.reported_usage = payload.usage ? usageOf(payload.usage) : null;
  } else {
    // A later run of the session (in_progress again) keeps the clock going, and the
    // last run's outcome no longer applies.
    run.ended_at = null;
    run.stop_reason = null;
    run.error = null;
    run.last_response = null;
    run.reported_usage = null;
  }
}

function applyStage(step: StepView, started: boolean, payload: ToolStartedPayload | ToolCompletedPayload): void {
  step.routing ??= {};
  const stage: StageView = step.routing[payload.tool_name] ?? {
    id: payload.tool_call_id,
    arguments: null,
    args_summary: "",
    state: "running",
    success: null,
    error: null,
    duration_ms: null,
    result_summary: null,
  };
  stage.id = payload.tool_call_id;
  step.routing[payload.tool_name] = stage;
  if (started) {
    const started = payload as ToolStartedPayload;
    stage.arguments = started.arguments ?? null;
    stage.args_summary = started.args_summary ?? "";
    return;
  }
  const done = payload as ToolCompletedPayload;
  stage.state = "done";
  stage.success = done.success;
  stage.error = done.error ?? null;
  stage.duration_ms = done.duration_ms ?? null;
  stage.result_summary = done.result_summary ?? null;
}

function applyTool(run: RunView, started: boolean, payload: ToolStartedPayload | ToolCompletedPayload, at: string | null): void {
  const step = stepOf(run, payload.step_number ?? currentStepNumber(run));
  if (STAGES.has(payload.tool_name)) {
    applyStage(step, started, payload);
    return;
  }
  const tool = toolOf(step, payload.tool_call_id);
  tool.name = payload.tool_name;
  if (started) {
    const begun = payload as ToolStartedPayload;
    tool.args_summary = begun.args_summary ?? null;
    tool.arguments = begun.arguments ?? null;
    tool.started_at = at;
    if (tool.state !== "done") tool.state = "running";
    return;
  }
  const done = payload as ToolCompletedPayload;
  tool.state = "done";
  tool.success = done.success;
  tool.error = done.error ?? null;
  tool.duration_ms = done.duration_ms ?? null;
  tool.result_summary = done.result_summary ?? null;
}

function joinChunks(chunks: Record<string, string>): string {
  return Object.keys(chunks)
    .map(Number)
    .sort((a, b) => a - b)
    .map((index) => chunks[String(index)])
    .join("");
}

function apply(run: RunView, envelope: AgentEventEnvelope, at: string | null): void {
  switch (envelope.type) {
    case "agent.status":
      applyStatus(run, envelope.payload, at);
      return;
    case "agent.step.started": {
      const payload = envelope.payload;
      const step = stepOf(run, payload.step_number);
      step.started_at = at;
      step.available_tools = [...(payload.available_tools ?? [])];
      step.actor = payload.actor ?? null;
      if (run.status === "pending") run.status = "in_progress";
      return;
    }
    case "agent.step.completed": {
      const payload = envelope.payload;
      const step = stepOf(run, payload.step_number);
      const summary = payload.continuation ?? null;
      step.completed = {
        finish_reason: payload.finish_reason ?? null,
        usage: usageOf(payload.usage),
        duration_ms: payload.duration_ms ?? 0,
        has_tool_calls: payload.has_tool_calls ?? false,
        errors: payload.errors ?? 0,
        continuation: summary
          ? { should_continue: summary.should_continue, stop_reason: summary.stop_reason ?? null, resolved_by: summary.resolved_by }
          : null,
      };
      if (summary) run.resolved_by = summary.resolved_by;
      for (const ref of payload.tool_calls ?? []) {
        const tool = toolOf(step, ref.id);
        tool.name ??= ref.name;
      }
      recomputeUsage(run);
      return;
    }
    case "agent.tool.started":
      applyTool(run, true, envelope.payload, at);
      return;
    case "agent.tool.completed":
      applyTool(run, false, envelope.payload, at);
      return;
    case "agent.stream.chunk": {
      const payload = envelope.payload;
      const step = stepOf(run, payload.step_number ?? currentStepNumber(run));
      const index = payload.chunk_index ?? Object.keys(step.chunks).length;
      setOwn(step.chunks, String(index), payload.chunk);
      step.text = joinChunks(step.chunks);
      if (payload.is_complete) step.stream_complete = true;
      return;
    }
    case "agent.continuation": {
      const payload = envelope.payload;
      // Step 0 is the decision before the first step; keep it with step 1.
      stepOf(run, Math.max(payload.step_number, 1)).continuation = structuredClone(payload);
      run.resolved_by = payload.resolved_by;
      return;
    }
    default:
      return;
  }
}

const KNOWN = new Set([
  "agent.status",
  "agent.step.started",
  "agent.step.completed",
  "agent.tool.started",
  "agent.tool.completed",
  "agent.stream.chunk",
  "agent.continuation",
]);

/** Whether `envelope` is one the run reducer folds (a known agent.* type with a payload). */
export function isRunEnvelope(envelope: AgentEventEnvelope): boolean {
  return Boolean(envelope && typeof envelope === "object" && KNOWN.has(String(envelope.type)) && envelope.payload);
}

/** The run `executionId` among `run` and the runs nested in it (any depth). */
function owner(run: RunView, executionId: string): RunView | null {
  if (run.execution_id === executionId) return run;
  for (const runs of Object.values(run.nested ?? {})) {
    for (const child of Object.values(runs)) {
      const found = owner(child, executionId);
      if (found) return found;
    }
  }
  return null;
}

/**
 * A nested run's envelope (a routed capability's inner agent): folded into its own
 * RunView, kept as `nested[<parent tool call id>][<execution id>]` of the run it runs
 * in, never into that run's steps, status or usage.
 */
function foldNested(run: RunView, envelope: AgentEventEnvelope, payload: Record<string, unknown>): void {
  const target = owner(run, String(payload.parent_execution_id)) ?? run;
  const call = String(payload.parent_tool_call_id ?? "");
  const execution = String(envelope.execution_id ?? "");
  // Keys an envelope chose: read and set as own properties only (see own, setOwn).
  target.nested ??= {};
  const runs = own(target.nested, call) ?? setOwn(target.nested, call, {});
  const child = own(runs, execution) ?? setOwn(runs, execution, createRunView(envelope.session_id ?? null));
  const { parent_execution_id: _parent, parent_tool_call_id: _call, ...inner } = payload;
  fold(child, { ...envelope, payload: inner } as unknown as AgentEventEnvelope, null);
}

/** Fold `envelope` into `run` in place; false when it leaves the run as it was. */
function fold(run: RunView, envelope: AgentEventEnvelope, position: string | null): boolean {
  if (!isRunEnvelope(envelope)) return false;
  if (isReplay(run.position, position)) return false;
  const payload = envelope.payload as unknown as Record<string, unknown>;
  if (payload.parent_execution_id !== undefined && payload.parent_execution_id !== null) {
    foldNested(run, envelope, payload);
    if (position !== null) run.position = position;
    return true;
  }
  const at = envelope.timestamp ?? null;
  if (run.started_at === null && at !== null) run.started_at = at;
  if (run.session_id === null && envelope.session_id) run.session_id = envelope.session_id;
  if (envelope.execution_id) run.execution_id = envelope.execution_id;
  apply(run, envelope, at);
  run.event_count += 1;
  if (position !== null) run.position = position;
  return true;
}

/**
 * Fold one envelope into `view`, returning a new RunView (`view` is not changed).
 *
 * With its `position`, an envelope the view already holds (same epoch, not after the
 * view's position: a duplicate or an overlapping replay) leaves the view as it was.
 * Unknown envelope types are ignored.
 */
export function reduceRun(view: RunView, envelope: AgentEventEnvelope, position: string | null = null): RunView {
  if (!isRunEnvelope(envelope)) return view;
  if (isReplay(view.position, position)) return view;
  const run = structuredClone(view);
  fold(run, envelope, position);
  return run;
}

/** An envelope with the position it was received at (a trace download's entries). */
export interface PositionedEnvelope {
  envelope: AgentEventEnvelope;
  position?: string | null;
}

/**
 * Fold many envelopes into `view` at once, in order: the same RunView as reduceRun over
 * each in turn, with one copy of the view instead of one per envelope (a stored trace
 * of thousands of envelopes). `view` is not changed.
 */
export function reduceRunAll(view: RunView, records: Iterable<PositionedEnvelope>): RunView {
  const run = structuredClone(view);
  for (const record of records) fold(run, record.envelope, record.position ?? null);
  return run;
}

/** The assistant's final answer: the last step's streamed text (else last_response). */
export function finalText(run: RunView, completedOnly = false): string {
  // completedOnly: the text a stored state holds, as reconcile compares it (a step cut
  // off mid-stream, as by a run's maximum duration, is in no state).
  const steps = run.steps.filter((step) => Object.keys(step.chunks).length > 0 && (!completedOnly || step.completed));
  const last = steps.at(-1);
  if (last) return last.text;
  return run.last_response ?? "";
}

/** The stored state of a session, as GET /api/sessions/{id}/state answers (the parts compared). */
export interface StateSnapshot {
  status: string;
  step_count: number;
  usage?: { total?: number; prompt?: number; completion?: number } | null;
  steps?: {
    step_number: number;
    tool_calls?: { id: string; name: string }[];
    finish_reason?: string | null;
    has_tool_calls?: boolean;
    errors?: number;
    duration_ms?: number;
    usage?: { total?: number } | null;
    actor?: string | null;
  }[];
  messages?: { role: string; content?: string | null }[];
  [key: string]: unknown;
}

export interface Difference {
  field: string;
  step?: number;
  events: string;
  snapshot: string;
}

function lastAssistantText(snapshot: StateSnapshot): string {
  const messages = Array.isArray(snapshot.messages) ? snapshot.messages : [];
  for (let i = messages.length - 1; i >= 0; i -= 1) {
    const message = messages[i];
    if (message && message.role === "assistant" && message.content) return message.content;
  }
  return "";
}

/**
 * Compare what the events built with the final state snapshot.
 *
 * @returns one entry per difference; empty when in sync.
 */
export function reconcile(run: RunView, snapshot: StateSnapshot): Difference[] {
  const differences: Difference[] = [];
  const differ = (field: string, events: unknown, snap: unknown, step?: number): void => {
    const a = String(events);
    const b = String(snap);
    if (a === b) return;
    differences.push(step === undefined ? { field, events: a, snapshot: b } : { field, step, events: a, snapshot: b });
  };
  const completed = run.steps.filter((step) => step.completed);
  // A later run of a session numbers its steps after the earlier runs' steps, and the
  // snapshot counts them all (and their tokens): compare with the run's share of them.
  const earlier = run.steps.length ? Math.max(0, (run.steps[0]?.number ?? 1) - 1) : 0;
  differ("status", run.status, snapshot.status);
  differ("step count", completed.length + earlier, snapshot.step_count);
  const tokens = earlier === 0 ? run.usage.total : TERMINAL.has(run.status) && run.reported_usage ? run.reported_usage.total : null;
  if (tokens !== null) differ("total tokens", tokens, snapshot.usage?.total ?? 0);
  const theirs = new Map((snapshot.steps ?? []).map((step) => [step.step_number, step]));
  const numbers = new Set([...theirs.keys(), ...completed.map((step) => step.number)]);
  for (const number of [...numbers].sort((a, b) => a - b)) {
    const mine = run.steps.find((step) => step.number === number);
    const their = theirs.get(number);
    if (!mine || !mine.completed) {
      differences.push({ field: "step", step: number, events: "missing", snapshot: "present" });
      continue;
    }
    if (!their) {
      // The snapshot may keep only the last steps; only a step beyond its count differs.
      if (number > snapshot.step_count) differences.push({ field: "step", step: number, events: "present", snapshot: "missing" });
      continue;
    }
    const myIds = mine.tools.map((tool) => tool.id).sort();
    const theirIds = (their.tool_calls ?? []).map((call) => call.id).sort();
    differ("tool call ids", myIds.join(", ") || "none", theirIds.join(", ") || "none", number);
    differ("finish reason", mine.completed.finish_reason ?? "none", their.finish_reason ?? "none", number);
  }
  differ("final assistant text", finalText(run, true), lastAssistantText(snapshot));
  return differences;
}

/**
 * Fill the steps whose events were lost (a gap the server could not fill) from the
 * snapshot, marked `from_snapshot`; steps known from events are kept. Returns a new view.
 */
export function applySnapshot(view: RunView, snapshot: StateSnapshot): RunView {
  const run = structuredClone(view);
  for (const summary of snapshot.steps ?? []) {
    const existing = run.steps.find((step) => step.number === summary.step_number);
    if (existing?.completed) continue;
    const step = stepOf(run, summary.step_number);
    step.from_snapshot = true;
    step.actor ??= summary.actor ?? null;
    step.completed = {
      finish_reason: summary.finish_reason ?? null,
      usage: { prompt: 0, completion: 0, total: summary.usage?.total ?? 0 },
      duration_ms: summary.duration_ms ?? 0,
      has_tool_calls: summary.has_tool_calls ?? false,
      errors: summary.errors ?? 0,
      continuation: null,
    };
    for (const ref of summary.tool_calls ?? []) toolOf(step, ref.id).name ??= ref.name;
    run.from_snapshot = true;
  }
  if (TERMINAL.has(snapshot.status) && !TERMINAL.has(run.status)) run.status = snapshot.status;
  const text = lastAssistantText(snapshot);
  const last = run.steps.at(-1);
  if (text && last && Object.keys(last.chunks).length === 0 && TERMINAL.has(snapshot.status)) {
    last.chunks = { "0": text };
    last.text = text;
    last.stream_complete = true;
  }
  recomputeUsage(run);
  return run;
}
