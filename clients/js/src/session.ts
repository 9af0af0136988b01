// A session's runs kept apart: one RunView per run, in the order the runs started.
//
// A session runs one run at a time, each with its own execution id; the channel
// agent.<session> carries them one after another. reduceRun folds whatever it is given
// into one RunView (a later run's steps numbered on after the earlier ones'); a page
// that follows the session across runs folds with reduceSession instead, so each run
// has its own status, steps, totals and verdict. The same SessionView, field for field,
// is built by the Python kit (broadcaster/client.py, reduce_session).

import type { AgentEventEnvelope } from "./envelope.js";
import { isReplay } from "./position.js";
import { applySnapshot, createRunView, isRunEnvelope, reduceRun, type RunView, type StateSnapshot } from "./run.js";

export interface SessionView {
  session_id: string | null;
  /** The session's top-level runs, oldest first (a nested run stays in its parent's `nested`). */
  runs: RunView[];
  /** The position of the last envelope applied (the resume point). */
  position: string | null;
}

/** A new session with no run yet. */
export function createSessionView(sessionId: string | null = null): SessionView {
  return { session_id: sessionId, runs: [], position: null };
}

/** Whether `run` (or a run nested in it, at any depth) has the execution id `id`. */
function holds(run: RunView, id: string): boolean {
  if (run.execution_id === id) return true;
  return Object.values(run.nested ?? {}).some((runs) => Object.values(runs).some((child) => holds(child, id)));
}

/**
 * The index in `runs` of the run `envelope` belongs to; -1: it starts a new run.
 *
 * A nested run's envelope (payload.parent_execution_id) goes to the top-level run that
 * holds its parent; an envelope of an execution id not seen yet starts a run; one with
 * no execution id stays with the latest run.
 */
function runIndexOf(runs: RunView[], envelope: AgentEventEnvelope): number {
  const payload = envelope.payload as unknown as Record<string, unknown>;
  const parent = payload.parent_execution_id;
  if (parent !== undefined && parent !== null) {
    const index = runs.findIndex((run) => holds(run, String(parent)));
    return index >= 0 ? index : runs.length - 1;
  }
  const id = envelope.execution_id;
  if (!id) return runs.length - 1;
  const index = runs.findIndex((run) => run.execution_id === id);
  if (index >= 0) return index;
  // A run known so far only from envelopes without its id (nested ones, say) is this one.
  return runs.at(-1)?.execution_id === null ? runs.length - 1 : -1;
}

/**
 * Fold one envelope into the session `view`, returning a new SessionView (`view` is not
 * changed; the runs the envelope does not touch are the same objects).
 *
 * With its `position`, an envelope the session already holds is left out, as reduceRun
 * does; unknown envelope types are ignored.
 */
export function reduceSession(view: SessionView, envelope: AgentEventEnvelope, position: string | null = null): SessionView {
  if (!isRunEnvelope(envelope) || isReplay(view.position, position)) return view;
  const runs = [...view.runs];
  let index = runIndexOf(runs, envelope);
  if (index < 0) {
    runs.push(createRunView(view.session_id));
    index = runs.length - 1;
  }
  runs[index] = reduceRun(runs[index] as RunView, envelope, position);
  return { session_id: view.session_id, runs, position: position ?? view.position };
}

/** The latest run of the session (the one started last), or null before any. */
export function latestRun(view: SessionView): RunView | null {
  return view.runs.at(-1) ?? null;
}

/** The run `executionId` of the session (a top-level run), or null. */
export function runOf(view: SessionView, executionId: string | null): RunView | null {
  if (executionId === null) return null;
  return view.runs.find((run) => run.execution_id === executionId) ?? null;
}

/**
 * The stored state applied to the session's latest run (applySnapshot: the steps whose
 * events were lost, marked from_snapshot); a session with no run yet gets one. Returns
 * a new SessionView.
 */
export function applySessionSnapshot(view: SessionView, snapshot: StateSnapshot): SessionView {
  const runs = [...view.runs];
  const last = runs.pop() ?? createRunView(view.session_id);
  runs.push(applySnapshot(last, snapshot));
  return { ...view, runs };
}
