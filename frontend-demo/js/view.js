// Rendering: updates the DOM in place from the run model (cards are created once per
// step and tool, so focus, scrolling and open <details> survive live updates).

import { finalText, orderedSteps, stepText, TERMINAL, totals } from "./run-model.js";
import { explainContinuation } from "./explain.js";
import { renderRouting } from "./routing-view.js";
import { decisionOutcome, describe, stepState } from "./trace.js";

const $ = (id) => document.getElementById(id);

export function formatMs(ms) {
  if (ms === null || ms === undefined || Number.isNaN(ms)) return "—";
  if (ms < 1) return "<1 ms";
  if (ms < 1000) return `${Math.round(ms)} ms`;
  if (ms < 60_000) return `${(ms / 1000).toFixed(ms < 10_000 ? 2 : 1)} s`;
  const minutes = Math.floor(ms / 60_000);
  return `${minutes} min ${Math.round((ms % 60_000) / 1000)} s`;
}

const number = (value) => new Intl.NumberFormat("en").format(value ?? 0);
const plural = (count, word) => `${count} ${word}${count === 1 ? "" : "s"}`;

function setText(element, text) {
  const value = text ?? "";
  if (element.textContent !== value) element.textContent = value;
}

function show(element, visible) {
  element.hidden = !visible;
}

const STATUS_LABEL = {
  idle: "idle",
  pending: "pending",
  in_progress: "in progress",
  completed: "completed",
  failed: "failed",
  lost: "connection lost",
  gone: "server went away",
  unended: "never ended",
  waiting: "waiting",
  "no-run-yet": "no run yet",
  "no-such-session": "no such session",
  private: "private",
  expired: "expired",
};

/**
 * The status a run is drawn with: its own, unless it has not ended and the page cannot
 * know how it goes on: "lost" (the connection to its server dropped), "gone" (the server
 * went away: it did not come back, or came back without the run), "unended" (a later
 * run of the session started: this one's end was never published).
 */
export function shownStatus(run) {
  if (!run) return "idle";
  if (TERMINAL.has(run.status)) return run.status;
  return run.link === "live" || !run.link ? run.status : run.link;
}

export class DashboardView {
  constructor() {
    this.cards = new Map(); // step number -> {root, parts}
    this.template = $("step-template");
  }

  reset() {
    this.resetRun();
    $("event-log").replaceChildren();
    this.notice(null);
    this.runs([], null, false);
    this.render(null);
  }

  /** Forget the cards of the run shown (another run of the session is shown next). */
  resetRun() {
    this.cards.clear();
    $("timeline").replaceChildren();
    this.reconcile({ state: "waiting" });
  }

  /** Update every live view from `run` (null: nothing attached). */
  render(run) {
    this.renderSummary(run);
    if (!run) {
      show($("timeline-empty"), true);
      setText($("event-count"), "0 events");
      $("answer").replaceChildren(placeholder());
      return;
    }
    setText($("event-count"), plural(run.eventCount, "event"));
    const steps = orderedSteps(run);
    show($("timeline-empty"), steps.length === 0 && !$("session-notice").dataset.kind);
    for (const step of steps) this.renderStep(run, step);
    this.renderAnswer(run);
  }

  renderSummary(run) {
    const status = shownStatus(run);
    const badge = $("status-badge");
    badge.dataset.status = status;
    setText(badge, STATUS_LABEL[status] || status);
    setText($("session-id"), run ? run.sessionId : "—");
    setText($("channel-name"), run?.channel ?? "—");
    setText($("execution-id"), run?.executionId ?? "—");
    const payload = run?.statusPayload;
    setText($("stop-reason"), payload?.stop_reason ?? "—");
    const error = payload?.error_message;
    show($("run-error"), Boolean(error));
    setText($("run-error"), error ? `Error: ${error}` : "");
    const link = $("run-link");
    const linkShown = Boolean(run?.linkText) && !TERMINAL.has(run.status);
    show(link, linkShown);
    link.dataset.link = linkShown ? run.link : "live";
    setText(link, linkShown ? run.linkText : "");
    const sums = run ? totals(run) : { steps: 0, usage: { prompt: 0, completion: 0, total: 0 }, toolCalls: 0, elapsedMs: null };
    setText($("total-steps"), String(sums.steps));
    setText($("total-tokens"), number(sums.usage.total));
    setText($("total-tools"), String(sums.toolCalls));
    setText($("total-time"), formatMs(sums.elapsedMs));
    setText($("token-split"), run ? `${number(sums.usage.prompt)} prompt · ${number(sums.usage.completion)} completion tokens` : "");
    setFacts($("run-facts"), run ? {
      executionId: run.executionId ?? "",
      status: run.status,
      shownStatus: status,
      stopReason: payload?.stop_reason ?? "",
      error: error ?? "",
      steps: sums.steps,
      toolCalls: sums.toolCalls,
      tokens: sums.usage.total,
      finalText: finalText(run),
      link: run.link ?? "live",
    } : {});
  }

  renderAnswer(run) {
    const box = $("answer");
    const text = finalText(run);
    const streaming = shownStatus(run) === "in_progress";
    box.setAttribute("aria-busy", String(streaming));
    if (!text) {
      if (!box.querySelector(".placeholder")) box.replaceChildren(placeholder());
      return;
    }
    let span = box.querySelector(".text");
    if (!span) {
      span = document.createElement("span");
      span.className = "text";
      box.replaceChildren(span);
    }
    setText(span, text);
    box.classList.toggle("streaming", streaming);
  }

  card(step) {
    let card = this.cards.get(step.number);
    if (card) return card;
    const root = this.template.content.firstElementChild.cloneNode(true);
    const part = (selector) => root.querySelector(selector);
    card = {
      root,
      number: part(".step-number"),
      finish: part(".finish"),
      snapshot: part(".snapshot"),
      diff: part(".diff"),
      meta: part(".step-meta"),
      text: part(".step-text"),
      tools: part(".tools"),
      toolItems: new Map(),
      continuation: part(".continuation"),
      continuationShown: null,
    };
    root.id = `step-${step.number}`;
    root.dataset.step = String(step.number);
    root.querySelector("article").setAttribute("aria-labelledby", `step-${step.number}-title`);
    part(".step-title").id = `step-${step.number}-title`;
    setText(card.number, String(step.number));
    // Keep the timeline in step order even if a step arrives late (snapshot fill).
    const timeline = $("timeline");
    const after = [...this.cards.entries()].filter(([n]) => n > step.number).sort((a, b) => a[0] - b[0])[0];
    timeline.insertBefore(root, after ? after[1].root : null);
    this.cards.set(step.number, card);
    return card;
  }

  renderStep(run, step) {
    const card = this.card(step);
    const done = Boolean(step.completed);
    const ended = TERMINAL.has(run.status) || shownStatus(run) !== run.status; // a step not done by then was cut off
    const state = stepState(step, ended);
    card.root.dataset.state = state;
    const finish = step.completed?.finish_reason;
    setText(card.finish, done ? finish || "no finish reason" : ended ? "stopped" : "running…");
    card.finish.dataset.reason = done ? finish || (state === "failed" ? "error" : "none") : state;
    show(card.snapshot, step.fromSnapshot);
    const meta = [];
    if (done) {
      meta.push(formatMs(step.completed.duration_ms));
      meta.push(`${number(step.completed.usage?.total)} tokens`);
      if (step.completed.errors) meta.push(plural(step.completed.errors, "error"));
    }
    meta.push(plural(step.tools.size, "tool call"));
    setText(card.meta, meta.join(" · "));
    const text = stepText(step);
    show(card.text, Boolean(text));
    setText(card.text, text);
    card.text.classList.toggle("streaming", Boolean(text) && !step.streamComplete && state === "running");
    this.renderTools(card, step, ended);
    renderRouting(card.root, step);
    this.renderContinuation(card, step);
  }

  renderTools(card, step, ended) {
    show(card.tools, step.tools.size > 0);
    for (const tool of step.tools.values()) {
      let item = card.toolItems.get(tool.id);
      if (!item) {
        item = toolItem();
        item.root.dataset.toolCallId = tool.id;
        card.tools.append(item.root);
        card.toolItems.set(tool.id, item);
      }
      let state = tool.state !== "done" ? (tool.state || "unknown") : tool.success ? "ok" : "error";
      if (state === "running" && ended) state = "stopped"; // the run ended before the tool
      item.root.dataset.state = state;
      setText(item.name, tool.name || "tool");
      setText(item.args, tool.argsSummary ? `(${tool.argsSummary})` : "");
      const label = { ok: "ok", error: "error", running: "running…", stopped: "stopped", unknown: "no events" }[state];
      setText(item.outcome, label);
      setText(item.duration, tool.durationMs !== undefined ? formatMs(tool.durationMs) : "");
      setText(item.id, tool.id);
      const detail = state === "error" ? tool.error : tool.resultSummary;
      show(item.detail, Boolean(detail));
      setText(item.detail, detail ? (state === "error" ? detail : `→ ${detail}`) : "");
    }
  }

  renderContinuation(card, step) {
    const cont = step.continuation || step.completed?.continuation;
    show(card.continuation, Boolean(cont));
    if (!cont || card.continuationShown === cont) return;
    card.continuationShown = cont;
    const box = card.continuation;
    const decision = cont.should_continue ? "continue" : `stop${cont.stop_reason ? ` (${cont.stop_reason})` : ""}`;
    setText(box.querySelector(".decision"), decision);
    box.dataset.decision = cont.should_continue ? "continue" : "stop";
    box.dataset.outcome = decisionOutcome(cont);
    setText(box.querySelector(".should-continue"), String(cont.should_continue));
    setText(box.querySelector(".cont-stop"), cont.stop_reason ?? "—");
    setText(box.querySelector(".cont-resolved"), cont.resolved_by ?? "—");
    const why = explainContinuation(cont);
    const explanation = box.querySelector(".cont-why");
    explanation.dataset.rule = why.rule;
    setText(explanation, why.text);
    const rows = (cont.evaluations || []).map((evaluation) => {
      const row = document.createElement("tr");
      row.dataset.decision = evaluation.decision;
      if (evaluation.stop_reason) row.dataset.stopReason = evaluation.stop_reason;
      for (const [value, cls] of [
        [evaluation.criterion, "mono"],
        [evaluation.decision, "decision-cell"],
        [evaluation.reason, ""],
        [evaluation.stop_reason ?? "—", ""],
      ]) {
        const cell = document.createElement("td");
        if (cls) cell.className = cls;
        cell.textContent = value;
        row.append(cell);
      }
      return row;
    });
    const body = box.querySelector("tbody");
    if (rows.length) body.replaceChildren(...rows);
    else body.replaceChildren(emptyRow("Summary only: the full evaluations table arrives with agent.continuation (trace on)."));
  }

  /**
   * The session's runs, oldest first: [{executionId, number, status (as drawn), verdict
   * (a reconcile state or null), steps}], `shownId` the run shown; `pinned`: an earlier
   * run is shown on purpose (offer to follow the latest again). `open(executionId)` is
   * called when one is chosen.
   */
  runs(list, shownId, pinned, open = null) {
    const panel = $("runs-panel");
    show(panel, list.length > 1);
    $("run-facts").dataset.runs = String(list.length);
    show($("follow-latest"), pinned && list.length > 1);
    const items = [...list].reverse().map((run) => {
      const item = document.createElement("li");
      item.dataset.executionId = run.executionId ?? "";
      item.dataset.status = run.status;
      item.dataset.reconcile = run.verdict ?? "none";
      const button = document.createElement("button");
      button.type = "button";
      if (run.executionId === shownId) button.setAttribute("aria-current", "true");
      const badge = document.createElement("span");
      badge.className = "badge";
      badge.dataset.status = run.status;
      badge.textContent = STATUS_LABEL[run.status] || run.status;
      const verdict = document.createElement("span");
      verdict.className = "run-verdict";
      verdict.textContent = VERDICT_LABEL[run.verdict] ?? "";
      button.append(strong(`Run ${run.number}`), badge, code(run.executionId ?? "—"), ` ${plural(run.steps, "step")}`, verdict);
      if (open) button.addEventListener("click", () => open(run.executionId));
      item.append(button);
      return item;
    });
    $("session-runs").replaceChildren(...items);
  }

  /** A message about the session itself (unknown, private, no run yet); null hides it. */
  notice(kind, text = "") {
    const box = $("session-notice");
    show(box, Boolean(kind));
    box.dataset.kind = kind ?? "";
    setText(box, kind ? text : "");
    show($("timeline-empty"), !kind && this.cards.size === 0);
  }

  /** Show the reconcile result: {state: waiting|checking|in_sync|differs|error|superseded, differences?, message?}. */
  reconcile(result) {
    const box = $("reconcile");
    box.dataset.state = result.state;
    $("run-facts").dataset.reconcile = result.state;
    for (const card of this.cards.values()) show(card.diff, false);
    const parts = [];
    if (result.state === "waiting") {
      parts.push(paragraph("When the run ends, the page fetches the final snapshot and compares it with what it built from events.", "muted"));
    } else if (result.state === "checking") {
      parts.push(paragraph("Fetching the final snapshot…", "muted"));
    } else if (result.state === "in_sync") {
      parts.push(paragraph("✓ In sync", "verdict"));
      parts.push(paragraph(result.note || "Status, steps, tokens, tool calls and the final text match the snapshot.", "muted"));
    } else if (result.state === "differs") {
      parts.push(paragraph(`✗ ${plural(result.differences.length, "difference")} from the snapshot`, "verdict"));
      const list = document.createElement("ul");
      list.className = "differences";
      for (const diff of result.differences) {
        const item = document.createElement("li");
        const where = diff.step ? `step ${diff.step}: ` : "";
        item.append(strong(`${where}${diff.field}`), ` — events: `, code(diff.events), `, snapshot: `, code(diff.snapshot));
        list.append(item);
        const card = diff.step ? this.cards.get(diff.step) : null;
        if (card) show(card.diff, true);
      }
      parts.push(list);
    } else if (result.state === "superseded") {
      parts.push(paragraph("Not checked against the stored state", "verdict"));
      parts.push(paragraph("The session stores the state of its latest run only, and a later run of the session has replaced this run's.", "muted"));
    } else {
      parts.push(paragraph(`Could not reconcile: ${result.message}`, "verdict"));
    }
    box.replaceChildren(...parts);
  }

  /** Append one line to the raw event log (kept short). */
  logEvent(envelope, position) {
    const log = $("event-log");
    const item = document.createElement("li");
    const summary = describe(envelope);
    item.append(code(position ?? "—"), " ", strong(envelope.type), summary ? ` ${summary}` : "");
    log.append(item);
    while (log.children.length > 300) log.firstElementChild.remove();
  }

  connection(state, text) {
    const box = $("connection");
    box.dataset.state = state;
    setText($("connection-text"), text);
  }

  /** The history indicator next to the connection state; `detail` goes in its tooltip. */
  history(state, text, detail = "") {
    const element = $("history-text");
    element.dataset.state = state;
    setText(element, text);
    if (detail) element.title = detail;
    else element.removeAttribute("title");
  }

  formError(message) {
    const element = $("form-error");
    show(element, Boolean(message));
    setText(element, message || "");
  }
}

const VERDICT_LABEL = {
  in_sync: "✓ in sync",
  differs: "✗ differs",
  error: "not reconciled",
  superseded: "not checked",
  checking: "checking…",
};

/** The facts of the run shown, as data-* attributes of `element` (for tools and tests). */
function setFacts(element, facts) {
  const names = ["executionId", "status", "shownStatus", "stopReason", "error", "steps", "toolCalls", "tokens", "finalText", "link", "reconcile", "runs"];
  for (const name of names) {
    if (name in facts) element.dataset[name] = String(facts[name]);
    else if (name !== "reconcile" && name !== "runs") delete element.dataset[name];
  }
}

function toolItem() {
  const root = document.createElement("li");
  root.className = "tool";
  const line = document.createElement("div");
  line.className = "tool-line";
  const name = document.createElement("span");
  name.className = "tool-name mono";
  const args = document.createElement("span");
  args.className = "tool-args mono";
  const outcome = document.createElement("span");
  outcome.className = "tool-outcome";
  const duration = document.createElement("span");
  duration.className = "tool-duration muted";
  const id = document.createElement("span");
  id.className = "tool-id mono muted";
  const call = document.createElement("span");
  call.className = "tool-call";
  call.append(name, args);
  line.append(call, outcome, duration, id);
  const detail = document.createElement("p");
  detail.className = "tool-detail mono";
  root.append(line, detail);
  return { root, name, args, outcome, duration, id, detail };
}

function placeholder() {
  const span = document.createElement("span");
  span.className = "placeholder";
  span.textContent = "The assistant's text appears here as it streams.";
  return span;
}

function paragraph(text, cls) {
  const p = document.createElement("p");
  if (cls) p.className = cls;
  p.textContent = text;
  return p;
}

function strong(text) {
  const element = document.createElement("strong");
  element.textContent = text;
  return element;
}

function code(text) {
  const element = document.createElement("code");
  element.textContent = text;
  return element;
}

function emptyRow(text) {
  const row = document.createElement("tr");
  const cell = document.createElement("td");
  cell.colSpan = 4;
  cell.className = "muted";
  cell.textContent = text;
  row.append(cell);
  return row;
}
