// The run page (/demo/run.html?session=<id>[&execution=<id>][&compare=<id>
// [&compare_session=<id>]][&source=live][#token=<t>]): the runs of one session apart
// (GET /api/sessions/{id}/runs), and for the chosen run its envelopes (GET /api/sessions/{id}/trace?execution_id=…) as a waterfall,
// the continuation decisions explained, a raw envelope inspector, a comparison with
// another run, and export links. Every view is computed from the envelopes (js/trace.js,
// the client kit's reducer), so when the server keeps no index of the session (404, or
// `source=live`) the page follows the session's channel instead (its history, then live)
// and splits the runs by execution id itself. Model and tool text is only textContent.

import { finalText, TERMINAL } from "../vendor/agent-broadcaster-client/run.js";
import { alignRuns, COMPARED, decisionOutcome, decisionText, describe, explainContinuation, foldRun, runTotals, splitRuns, stepOfEnvelope, summaryOf, waterfall } from "./trace.js";
import { formatDuration, formatNumber, formatTime, setText, element } from "./format.js";

const $ = (id) => document.getElementById(id);
const PAGE_SIZE = 100;

const params = new URLSearchParams(location.search);
const hash = new URLSearchParams(location.hash.slice(1));
const page = {
  sessionId: params.get("session") || "",
  token: hash.get("token") || null, // a private session's token (kept out of the query string)
  runs: [], // [{executionId, summary, records, view, trimmed, loading}]
  selected: null,
  pinned: Boolean(params.get("execution")), // false: follow the latest run as runs start
  compare: params.get("compare") || null,
  compareSession: params.get("compare_session") || null, // another session's run to compare
  others: [], // the runs of compareSession
  source: "index", // or "channel": the envelopes followed live, no index on the server
  live: null, // {records, pending, feed} while following the channel
  inspector: { page: 0, type: "", step: "", tool: "" },
  timings: {},
};

// Read-only hooks for tests and the benchmark.
window.runPage = {
  get runs() { return page.runs.map((run) => ({ executionId: run.executionId, loaded: Boolean(run.records), envelopes: run.records?.length ?? 0 })); },
  get selected() { return page.selected; },
  get source() { return page.source; },
  get timings() { return { ...page.timings }; },
};

function api(path) {
  const headers = { Accept: "application/json" };
  if (page.token) headers.Authorization = `Bearer ${page.token}`;
  return fetch(path, { headers }).then(async (response) => {
    const body = await response.json().catch(() => null);
    if (!response.ok) {
      const reason = body?.error || `HTTP ${response.status}`;
      const error = new Error(`${reason} (GET ${path.split("?")[0]} answered ${response.status})`);
      error.status = response.status;
      throw error;
    }
    return body;
  });
}

function sessionPath(suffix, sessionId = page.sessionId) {
  return `/api/sessions/${encodeURIComponent(sessionId)}/${suffix}`;
}

function tracePath(executionId, format, sessionId = page.sessionId) {
  const query = new URLSearchParams({ execution_id: executionId, format });
  if (page.token && sessionId === page.sessionId) query.set("token", page.token);
  return `${sessionPath("trace", sessionId)}?${query}`;
}

/** Show `message` (null: hide it); `kind` names it for tools and tests (data-kind). */
function problem(message, kind = "error") {
  const box = $("page-error");
  box.hidden = !message;
  box.dataset.kind = message ? kind : "";
  setText(box, message || "");
}

/**
 * The session's channel holds nothing: whether the session exists at all, from its
 * stored state (the run index answered 404 already): never an empty page.
 */
async function explainEmpty() {
  try {
    await api(sessionPath("state"));
    problem(`The history of session ${page.sessionId} has expired: only its final state is kept (GET ${sessionPath("state")}).`, "expired");
  } catch (error) {
    if (page.runs.length) return;
    if (error.status === 403) problem(`Session ${page.sessionId} is private: open it with its session token (#token=…).`, "private");
    else if (error.status === 404) problem(`No such session: the server keeps no runs, no state and no events of session ${page.sessionId}. The page keeps listening in case a run starts.`, "no-such-session");
    else problem(`Nothing was ever published on this session's channel, and its state could not be read: ${error.message}`);
  }
}

// --- loading -------------------------------------------------------------------------------

async function loadRuns(sessionId = page.sessionId) {
  const body = await api(sessionPath("runs", sessionId));
  return (body.runs || []).map((summary) => ({
    sessionId,
    executionId: summary.execution_id,
    summary,
    records: null,
    view: null,
    trimmed: false,
  }));
}

const prefetched = new Map(); // execution id -> a trace request begun early

async function loadTrace(run) {
  if (run.records) return run;
  run.loading ??= (async () => {
    const started = performance.now();
    const early = prefetched.get(run.executionId);
    prefetched.delete(run.executionId);
    const body = (early && (await early)) || (await api(tracePath(run.executionId, "json", run.sessionId)));
    const fetched = performance.now();
    const records = (body.envelopes || []).filter((record) => record?.envelope?.execution_id === run.executionId || !record?.envelope?.execution_id || Boolean(record?.envelope?.payload?.parent_execution_id));
    run.view = foldRun(records, run.sessionId);
    run.records = records;
    run.trimmed = Boolean(body.trimmed);
    page.timings = { fetchMs: fetched - started, foldMs: performance.now() - fetched };
    return run;
  })();
  try {
    return await run.loading;
  } finally {
    run.loading = null;
  }
}

function runNamed(executionId) {
  return page.runs.find((run) => run.executionId === executionId) ?? null;
}

/** The run to compare with: of this session, or of compare_session. */
function compareRun() {
  if (!page.compare) return null;
  return runNamed(page.compare) ?? page.others.find((run) => run.executionId === page.compare) ?? null;
}

async function select(executionId, chosen = false) {
  const run = runNamed(executionId);
  if (!run) {
    problem(`No run ${executionId} in session ${page.sessionId}.`);
    return;
  }
  page.selected = executionId;
  if (chosen) page.pinned = true;
  page.inspector = { page: 0, type: "", step: "", tool: "" };
  updateUrl();
  renderRunList();
  try {
    await loadTrace(run);
  } catch (error) {
    problem(`Could not load the run's envelopes: ${error.message}`);
    return;
  }
  if (page.selected !== executionId) return;
  const begun = performance.now();
  renderRun(run);
  await renderCompare();
  page.timings.renderMs = performance.now() - begun;
  page.timings.startAt = page.startAt;
  page.timings.readyAt = performance.now();
  document.body.dataset.rendered = executionId;
}

function updateUrl() {
  const query = new URLSearchParams({ session: page.sessionId });
  // Following a channel, an execution is named only once chosen (else: the latest run).
  if (page.selected && (page.pinned || page.source === "index")) query.set("execution", page.selected);
  if (page.source === "channel" && params.get("source") === "live") query.set("source", "live");
  if (page.compare) query.set("compare", page.compare);
  const other = compareRun();
  if (other && other.sessionId !== page.sessionId) query.set("compare_session", other.sessionId);
  else if (!other && page.compareSession) query.set("compare_session", page.compareSession);
  history.replaceState(null, "", `?${query}${location.hash}`);
}

// --- the run list ----------------------------------------------------------------------------

function renderRunList() {
  const list = $("run-list");
  setText($("runs-count"), `${page.runs.length} run${page.runs.length === 1 ? "" : "s"}`);
  const items = page.runs.map((run, index) => {
    const s = run.summary;
    const item = element("li", "run-item");
    item.dataset.executionId = run.executionId;
    const button = element("button", "run-button");
    button.type = "button";
    if (run.executionId === page.selected) button.setAttribute("aria-current", "true");
    const badge = element("span", "badge", s.abandoned ? "server went away" : s.status);
    badge.dataset.status = s.abandoned ? "gone" : s.status === "running" ? "in_progress" : s.status;
    const duration = s.ended_at != null ? (s.ended_at - s.started_at) * 1000 : null;
    button.append(
      element("strong", "", `Run ${index + 1}`),
      badge,
      element("span", "mono muted", s.execution_id),
      element("span", "muted", formatTime(s.started_at)),
      element("span", "run-item-totals", `${s.steps} steps · ${s.tool_calls} tool calls · ${formatNumber(s.tokens?.total)} tokens · ${formatDuration(duration)}`),
    );
    if (s.stop_reason) button.append(element("span", "muted", `stop: ${s.stop_reason}${s.resolved_by ? ` by ${s.resolved_by}` : ""}`));
    if (s.first_position || s.last_position) {
      button.append(element("span", "run-positions mono muted", `positions ${s.first_position ?? "?"} – ${s.last_position ?? "…"}`));
    }
    button.addEventListener("click", () => select(run.executionId, true));
    item.append(button);
    return item;
  });
  list.replaceChildren(...items);
  const options = page.runs.map((run, index) => {
    const option = element("option", "", `Run ${index + 1} · ${run.executionId}`);
    option.value = run.executionId;
    return option;
  });
  const others = page.others.map((run, index) => {
    const option = element("option", "", `${run.sessionId} · Run ${index + 1} · ${run.executionId}`);
    option.value = run.executionId;
    return option;
  });
  const compare = $("compare-select");
  compare.replaceChildren(element("option", "", "—"), ...options, ...others);
  compare.firstElementChild.value = "";
  compare.value = compareRun() ? page.compare : "";
}

// --- the selected run ------------------------------------------------------------------------

function renderRun(run) {
  const view = run.view;
  const sums = runTotals(view);
  setText($("execution-id"), run.executionId);
  const badge = $("run-status");
  // The index lists it running, but nothing runs it: its server went away before its end.
  const gone = Boolean(run.summary?.abandoned) && !TERMINAL.has(view.status);
  badge.dataset.status = gone ? "gone" : view.status;
  setText(badge, gone ? "server went away" : view.status === "in_progress" ? "in progress" : view.status);
  $("trimmed").hidden = !run.trimmed;
  setText($("run-steps"), String(sums.steps));
  setText($("run-tools"), String(sums.toolCalls));
  setText($("run-tokens"), formatNumber(sums.tokens.total));
  setText($("run-duration"), formatDuration(sums.durationMs));
  setText($("run-stop"), view.stop_reason ?? "—");
  setText($("run-resolved"), view.resolved_by ?? "—");
  setText($("run-envelopes"), formatNumber(run.records.length));
  $("run-error").hidden = !view.error;
  setText($("run-error"), view.error ? `Error: ${view.error}` : "");
  setExports(run);
  const stale = page.source === "index" && !TERMINAL.has(view.status) && !gone;
  $("run-running").hidden = !stale;
  $("run-gone").hidden = !gone;
  if (stale) {
    const query = new URLSearchParams({ session: page.sessionId, execution: run.executionId, source: "live" });
    $("follow-live").href = `?${query}${location.hash}`;
  }
  setFacts($("run-facts"), {
    executionId: run.executionId,
    status: view.status,
    stopReason: view.stop_reason ?? "",
    error: view.error ?? "",
    steps: sums.steps,
    toolCalls: sums.toolCalls,
    tokens: sums.tokens.total,
    finalText: finalText(view),
    runs: page.runs.length,
    source: page.source,
    link: gone ? "gone" : "live",
  });
  renderWaterfall(run);
  renderContinuations(run);
  fillFilters(run);
  renderInspector(run);
}

/** The facts of the run shown, as data-* attributes (for tools and tests; docs/operations.md, "The live dashboard"). */
function setFacts(node, facts) {
  for (const [name, value] of Object.entries(facts)) node.dataset[name] = String(value);
}

let exportUrl = null;

function setExports(run) {
  const json = $("export-json");
  const otlp = $("export-otlp");
  json.download = `${page.sessionId}-${run.executionId}.json`;
  otlp.download = `${page.sessionId}-${run.executionId}.otlp.json`;
  if (page.source === "index") {
    json.href = tracePath(run.executionId, "json");
    otlp.href = tracePath(run.executionId, "otlp");
    $("export-otlp-part").hidden = false;
    return;
  }
  // Followed live: the envelopes received, in the trace endpoint's shape; OTLP needs
  // the server's trace endpoint.
  if (exportUrl) URL.revokeObjectURL(exportUrl);
  const body = { session_id: page.sessionId, execution_id: run.executionId, trimmed: false, summary: run.summary, envelopes: run.records };
  exportUrl = URL.createObjectURL(new Blob([JSON.stringify(body, null, 1)], { type: "application/json" }));
  json.href = exportUrl;
  $("export-otlp-part").hidden = true;
  otlp.removeAttribute("href");
}

function renderWaterfall(run) {
  const { spans, totalMs } = waterfall(run.records);
  const scale = Math.max(totalMs, 1);
  setText($("waterfall-scale"), `0 – ${formatDuration(totalMs)}`);
  const rows = spans.map((span) => {
    const row = element("li", "span-row");
    row.dataset.kind = span.kind;
    row.dataset.state = span.state;
    row.dataset.depth = String(span.depth);
    row.dataset.step = String(span.step);
    if (span.toolCallId) row.dataset.toolCallId = span.toolCallId;
    if (span.nested) row.dataset.nested = span.nested;
    const label = element("div", "span-label");
    label.style.paddingLeft = `${span.depth * 1.1}rem`;
    label.append(element("span", "span-name mono", span.label));
    if (span.detail) label.append(element("span", "span-detail muted", span.detail));
    const end = span.endMs ?? totalMs;
    const track = element("div", "span-track");
    const bar = element("span", "span-bar");
    bar.style.left = `${(Math.max(span.startMs, 0) / scale) * 100}%`;
    bar.style.width = `max(2px, ${(Math.max(end - span.startMs, 0) / scale) * 100}%)`;
    track.append(bar);
    const timing = element("span", "span-time muted", `+${formatDuration(span.startMs)} · ${span.endMs === null ? "open" : formatDuration(end - span.startMs)}`);
    row.append(label, track, timing);
    return row;
  });
  $("waterfall").replaceChildren(...rows);
}

function renderContinuations(run) {
  const blocks = decisionBlocks(run.view);
  if (!blocks.length) blocks.push(element("p", "muted", "No continuation decisions in this run's envelopes."));
  $("continuations").replaceChildren(...blocks);
}

/**
 * One block per step of `view` with a continuation decision or a run nested under one
 * of its calls: the decision explained, its evaluations, and under the call that ran
 * it, each nested run's own decisions (collapsible; any depth).
 */
function decisionBlocks(view) {
  const blocks = [];
  for (const step of view.steps) {
    const cont = step.continuation ?? step.completed?.continuation;
    const nested = nestedDecisions(view, step);
    if (!cont && !nested.length) continue;
    const block = element("article", "cont-block");
    block.dataset.step = String(step.number);
    if (cont) {
      const why = explainContinuation(cont);
      block.dataset.decision = why.decision;
      block.dataset.outcome = decisionOutcome(cont);
      const title = element("h3", "", `Step ${step.number}: `);
      title.append(element("span", "outcome", decisionText(cont)));
      block.append(title, decisionFacts(cont, why));
    } else {
      block.append(element("h3", "", `Step ${step.number}`), element("p", "muted", "No continuation decision of this step in the envelopes."));
    }
    block.append(...nested);
    blocks.push(block);
  }
  return blocks;
}

function decisionFacts(cont, why) {
  const part = document.createDocumentFragment();
  const facts = element("dl", "why");
  const fact = (name, value, cls) => {
    const wrap = element("div", cls);
    wrap.append(element("dt", "", name), element("dd", "", value));
    facts.append(wrap);
  };
  fact("Forbade", why.forbade.join(", ") || "none", "why-forbade");
  fact("Requested", why.requested.join(", ") || "none", "why-requested");
  fact("Won", why.winner ?? "no single criterion (aggregate)", "why-winner");
  fact("Rule", why.rule || "summary only: the evaluations arrive with agent.continuation (trace on)", "why-rule");
  part.append(facts);
  if (cont.evaluations?.length) {
    const table = element("table", "evaluations");
    const head = element("tr");
    for (const name of ["Criterion", "Decision", "Reason", "Stop reason"]) head.append(element("th", "", name));
    const thead = element("thead");
    thead.append(head);
    const body = element("tbody");
    for (const evaluation of cont.evaluations) {
      const row = element("tr");
      row.dataset.decision = evaluation.decision;
      if (evaluation.stop_reason) row.dataset.stopReason = evaluation.stop_reason;
      if (evaluation.criterion === why.winner) row.classList.add("winner");
      row.append(
        element("td", "mono", evaluation.criterion),
        element("td", "decision-cell", evaluation.decision),
        element("td", "", evaluation.reason ?? ""),
        element("td", "", evaluation.stop_reason ?? "—"),
      );
      body.append(row);
    }
    table.append(thead, body);
    const wrap = element("div", "table-wrap");
    wrap.append(table);
    part.append(wrap);
  }
  return part;
}

/** The runs nested under the calls of `step` (a routed capability's inner agent), as collapsible blocks of their decisions. */
function nestedDecisions(view, step) {
  const found = [];
  for (const tool of step.tools) {
    for (const [executionId, child] of Object.entries(view.nested?.[tool.id] ?? {})) {
      const box = element("details", "nested-decisions");
      box.open = true;
      box.dataset.executionId = executionId;
      box.dataset.parentExecutionId = view.execution_id ?? "";
      box.dataset.parentToolCallId = tool.id;
      box.dataset.status = child.status;
      const decisions = decisionBlocks(child);
      const count = child.steps.filter((inner) => inner.continuation ?? inner.completed?.continuation).length;
      const summary = element("summary", "");
      summary.append(
        element("span", "mono", tool.name ?? "call"), ` (${tool.id}) ran `,
        element("span", "mono", executionId),
        `: ${child.status === "in_progress" ? "in progress" : child.status}, ${count} continuation decision${count === 1 ? "" : "s"}`,
      );
      const inner = element("div", "continuations");
      inner.append(...(decisions.length ? decisions : [element("p", "muted", "No continuation decisions in this nested run's envelopes.")]));
      box.append(summary, inner);
      found.push(box);
    }
  }
  return found;
}

// --- the envelope inspector (paginated: only one page of rows is in the DOM) -------------------

function indexRecords(run) {
  if (run.index) return run.index;
  let step = null;
  const callSteps = new Map(); // tool_call_id -> the step it was called in
  run.index = run.records.map((record, i) => {
    const envelope = record.envelope;
    const payload = envelope?.payload ?? {};
    if (payload.parent_tool_call_id) {
      // A nested run's envelope (a capability's inner agent): in the step of the call it
      // serves, and found by that call as well as by its own tool calls.
      const tool = payload.tool_call_id ?? payload.parent_tool_call_id;
      return { i, record, type: String(envelope?.type ?? ""), step: callSteps.get(payload.parent_tool_call_id) ?? step, tool };
    }
    const own = stepOfEnvelope(envelope, step);
    if (envelope?.type === "agent.step.started" && own !== null) step = own;
    if (payload.tool_call_id && own !== null) callSteps.set(payload.tool_call_id, own);
    return { i, record, type: String(envelope?.type ?? ""), step: own, tool: payload.tool_call_id ?? null };
  });
  return run.index;
}

function fillFilters(run) {
  const index = indexRecords(run);
  const fill = (select, values, label) => {
    const options = [...values].map((value) => {
      const option = element("option", "", label(value));
      option.value = String(value);
      return option;
    });
    const all = element("option", "", "all");
    all.value = "";
    select.replaceChildren(all, ...options);
    select.value = "";
  };
  fill($("filter-type"), new Set(index.map((row) => row.type)), (value) => value);
  fill($("filter-step"), new Set(index.map((row) => row.step).filter((step) => step !== null).sort((a, b) => a - b)), (value) => `step ${value}`);
  fill($("filter-tool"), new Set(index.map((row) => row.tool).filter(Boolean)), (value) => value);
}

function renderInspector(run) {
  const filter = page.inspector;
  const rows = indexRecords(run).filter((row) =>
    (!filter.type || row.type === filter.type)
    && (!filter.step || String(row.step) === filter.step)
    && (!filter.tool || row.tool === filter.tool));
  const pages = Math.max(1, Math.ceil(rows.length / PAGE_SIZE));
  filter.page = Math.min(filter.page, pages - 1);
  const shown = rows.slice(filter.page * PAGE_SIZE, (filter.page + 1) * PAGE_SIZE);
  const total = run.records.length;
  setText($("inspector-count"), rows.length === total ? `${formatNumber(total)} envelopes` : `${formatNumber(rows.length)} of ${formatNumber(total)} envelopes`);
  setText($("page-info"), `page ${filter.page + 1} of ${pages}`);
  $("page-prev").disabled = $("page-first").disabled = filter.page === 0;
  $("page-next").disabled = $("page-last").disabled = filter.page >= pages - 1;
  $("inspector").replaceChildren(...shown.map(inspectorRow));
}

function inspectorRow(row) {
  const { record } = row;
  const item = element("li", "envelope");
  item.dataset.index = String(row.i);
  item.dataset.type = row.type;
  const line = element("button", "envelope-line");
  line.type = "button";
  line.setAttribute("aria-expanded", "false");
  line.append(
    element("span", "envelope-index muted", `#${row.i + 1}`),
    element("code", "envelope-position", record.position ?? "—"),
    element("strong", "envelope-type", row.type),
    element("span", "envelope-summary", describe(record.envelope)),
  );
  line.addEventListener("click", () => {
    const open = line.getAttribute("aria-expanded") === "true";
    line.setAttribute("aria-expanded", String(!open));
    const detail = item.querySelector(".envelope-detail");
    if (open) {
      detail?.remove();
      return;
    }
    const json = JSON.stringify(record.envelope, null, 2);
    const box = element("div", "envelope-detail");
    const copy = element("button", "copy", "Copy");
    copy.type = "button";
    copy.addEventListener("click", () => copyText(json, copy));
    box.append(copy, element("pre", "json", json)); // textContent: never parsed as HTML
    item.append(box);
  });
  item.append(line);
  return item;
}

async function copyText(text, button) {
  try {
    await navigator.clipboard.writeText(text);
    setText(button, "Copied");
  } catch {
    // No clipboard permission (e.g. an insecure origin): select the text to copy by hand.
    const pre = button.nextElementSibling;
    const range = document.createRange();
    range.selectNodeContents(pre);
    getSelection().removeAllRanges();
    getSelection().addRange(range);
    setText(button, "Selected: press Ctrl+C");
  }
}

// --- compare ---------------------------------------------------------------------------------

async function renderCompare() {
  const table = $("compare");
  const verdict = $("compare-verdict");
  const current = runNamed(page.selected);
  const other = compareRun();
  if (!current?.view || !other || other === current) {
    table.hidden = true;
    setText(verdict, page.compare && !other ? `No run ${page.compare} in ${page.compareSession ? `session ${page.compareSession}` : "this session"}.` : "Choose another run to compare with.");
    verdict.dataset.state = "none";
    return;
  }
  try {
    await loadTrace(other);
  } catch (error) {
    setText(verdict, `Could not load the other run: ${error.message}`);
    verdict.dataset.state = "error";
    return;
  }
  const { rows, first } = alignRuns(current.view, other.view);
  setText($("compare-left-head"), `This run (${current.executionId})`);
  setText($("compare-right-head"), `Other run (${other.sessionId === page.sessionId ? "" : `${other.sessionId} · `}${other.executionId})`);
  const cells = (facts, row) => {
    const cell = element("td", "compare-cell");
    if (!facts) {
      cell.append(element("span", "muted", "no such step"));
      return cell;
    }
    for (const field of COMPARED) {
      const value = field === "tools" ? facts.tools.join(", ") || "no tool calls"
        : field === "arguments" ? facts.arguments.join(", ") || "—"
        : field === "tokens" ? (facts.tokens === null ? "—" : `${facts.tokens} tokens`)
        : facts.decision;
      const part = element("div", `fact fact-${field}`);
      part.dataset.field = field;
      if (row.differs.includes(field)) part.classList.add("differs");
      if (first && first.index === row.index && (first.field === field || first.field === "step")) part.classList.add("first-divergence");
      part.append(element("span", "muted", `${field}: `), element("span", "mono", value));
      cell.append(part);
    }
    return cell;
  };
  const body = rows.map((row) => {
    const tr = element("tr");
    tr.dataset.index = String(row.index + 1);
    if (row.differs.length) tr.dataset.differs = row.differs.join(" ");
    if (first?.index === row.index) tr.classList.add("first-divergence");
    const numbers = row.leftNumber === row.rightNumber || row.rightNumber === null ? `Step ${row.leftNumber}`
      : row.leftNumber === null ? `Step ${row.rightNumber}` : `Steps ${row.leftNumber} / ${row.rightNumber}`;
    tr.append(element("th", "", `#${row.index + 1} · ${numbers}`), cells(row.left, row), cells(row.right, row));
    return tr;
  });
  table.querySelector("tbody").replaceChildren(...body);
  table.hidden = false;
  verdict.dataset.state = first ? "differs" : "same";
  setText(verdict, first
    ? `First divergence: step #${first.index + 1} of each run, ${first.field === "step" ? "present in one run only" : first.field === "decision" ? "the continuation decision" : first.field === "tools" ? "the tool calls" : first.field}.`
    : "No divergence: the same tool calls, arguments, decisions and tokens at every step.");
}

// --- start -----------------------------------------------------------------------------------

function wire() {
  for (const [id, key] of [["filter-type", "type"], ["filter-step", "step"], ["filter-tool", "tool"]]) {
    $(id).addEventListener("change", (event) => {
      page.inspector[key] = event.target.value;
      page.inspector.page = 0;
      const run = runNamed(page.selected);
      if (run?.records) renderInspector(run);
    });
  }
  $("page-first").addEventListener("click", () => turn(-Infinity));
  $("page-prev").addEventListener("click", () => turn(-1));
  $("page-next").addEventListener("click", () => turn(1));
  $("page-last").addEventListener("click", () => turn(Infinity)); // renderInspector clamps
  $("compare-select").addEventListener("change", async (event) => {
    page.compare = event.target.value || null;
    updateUrl();
    await renderCompare();
  });
}

// --- following the session's channel (no index) ------------------------------------------------

async function followChannel() {
  page.source = "channel";
  const badge = $("source");
  badge.hidden = false;
  setText(badge, "live from the channel");
  try {
    const response = await fetch("/api/demo/config", { headers: { Accept: "application/json" } });
    if (!response.ok) throw new Error(`GET /api/demo/config answered ${response.status}`);
    const config = await response.json();
    await loadPusher();
    const { ChannelFeed } = await import("../vendor/agent-broadcaster-client/index.js");
    const channel = `${config.private_sessions ? "private-" : ""}agent.${page.sessionId}`;
    page.live = { records: [], pending: false, feed: null };
    page.live.feed = new ChannelFeed(connect(config), channel, {
      onEnvelope: (envelope, position) => {
        page.live.records.push({ envelope, position });
        if (["no-such-session", "no-run-yet"].includes($("page-error").dataset.kind)) problem(null); // a run started
        scheduleLive();
      },
      onResume: (result) => {
        if (result.initial && !page.live.records.length) {
          if (result.empty) explainEmpty();
          else problem(`Session ${page.sessionId} has no run yet: its channel has events, none of a run. The page shows the first one as it starts.`, "no-run-yet");
        }
        scheduleLive();
      },
      onProblem: (message) => problem(message),
    }, null);
    document.body.dataset.ready = "true";
  } catch (error) {
    problem(`Could not follow the session's channel: ${error.message}`);
  }
}

/** pusher-js (the vendored browser build), loaded only when the page follows a channel. */
function loadPusher() {
  if (window.Pusher) return Promise.resolve();
  return new Promise((resolve, reject) => {
    const script = document.createElement("script");
    script.src = "/demo/vendor/pusher.min.js";
    script.onload = () => (window.Pusher ? resolve() : reject(new Error("pusher-js did not load")));
    script.onerror = () => reject(new Error("pusher-js did not load (/demo/vendor/pusher.min.js)"));
    document.head.append(script);
  });
}

function connect(config) {
  const secure = location.protocol === "https:";
  const port = Number(location.port) || (secure ? 443 : 80);
  const authorize = ({ socketId, channelName }, callback) => {
    const body = new URLSearchParams({ socket_id: socketId, channel_name: channelName });
    if (page.token) body.set("session_token", page.token);
    fetch(config.auth_endpoint || "/broadcasting/auth", { method: "POST", body })
      .then(async (response) => {
        const data = await response.json().catch(() => ({}));
        if (!response.ok) throw new Error(data.error || `auth answered ${response.status}`);
        callback(null, data);
      })
      .catch((error) => {
        problem(`This session's channel refused the page: ${error.message}`);
        callback(error, null);
      });
  };
  return new window.Pusher(config.app_key, {
    cluster: "local",
    wsHost: location.hostname,
    wsPort: port,
    wssPort: port,
    forceTLS: secure,
    enabledTransports: [secure ? "wss" : "ws"],
    disableStats: true,
    channelAuthorization: { customHandler: authorize },
  });
}

function scheduleLive() {
  if (page.live.pending) return;
  page.live.pending = true;
  setTimeout(() => {
    page.live.pending = false;
    refreshLive();
  }, 100);
}

/** Re-split the envelopes received into runs; re-render what changed. */
function refreshLive() {
  const previous = new Map(page.runs.map((run) => [run.executionId, run]));
  const changed = new Set();
  page.runs = splitRuns(page.live.records, page.sessionId).map((run) => {
    const old = previous.get(run.executionId);
    if (old && old.records.length === run.records.length) return old;
    changed.add(run.executionId);
    return { sessionId: page.sessionId, executionId: run.executionId, summary: summaryOf(run.view, run.records), records: run.records, view: run.view, trimmed: false };
  });
  if (!page.runs.length) return;
  const wanted = page.pinned ? (page.selected ?? params.get("execution")) : null;
  const target = wanted && runNamed(wanted) ? wanted : page.runs.at(-1).executionId;
  if (target !== page.selected) {
    select(target);
    return;
  }
  renderRunList();
  if (changed.has(target) || (page.compare && changed.has(page.compare))) {
    const run = runNamed(target);
    const inspector = { ...page.inspector };
    renderRun(run);
    restoreFilters(run, inspector);
    renderCompare();
  }
}

function restoreFilters(run, inspector) {
  for (const [id, key] of [["filter-type", "type"], ["filter-step", "step"], ["filter-tool", "tool"]]) {
    const select = $(id);
    if ([...select.options].some((option) => option.value === inspector[key])) select.value = inspector[key];
    else inspector[key] = "";
  }
  page.inspector = inspector;
  renderInspector(run);
}

function turn(delta) {
  const run = runNamed(page.selected);
  if (!run?.records) return;
  page.inspector.page = Math.max(0, Math.min(page.inspector.page + delta, Number.MAX_SAFE_INTEGER));
  renderInspector(run);
}

async function main() {
  page.startAt = performance.now(); // navigation start to the page's script running
  wire();
  setText($("session-id"), page.sessionId || "—");
  if (!/^[A-Za-z0-9_\-=@,.;]{1,128}$/.test(page.sessionId)) {
    problem("Open a run from the sessions page (this address names no valid session id).");
    return;
  }
  if (params.get("source") === "live") {
    await followChannel();
    return;
  }
  const wanted = params.get("execution");
  // The run named in the address is fetched while the runs are listed.
  const early = wanted ? api(tracePath(wanted, "json")).catch(() => null) : null;
  try {
    page.runs = await loadRuns();
  } catch (error) {
    if (error.status === 404) {
      await followChannel(); // no index of this session here: its channel's history
      return;
    }
    problem(`Could not list this session's runs: ${error.message}`);
    return;
  }
  if (!page.runs.length) {
    problem("This session has no recorded runs.", "no-run-yet");
    return;
  }
  if (page.compareSession && page.compareSession !== page.sessionId) {
    try {
      page.others = await loadRuns(page.compareSession);
    } catch (error) {
      problem(`Could not list the runs of session ${page.compareSession} to compare with: ${error.message}`);
    }
  }
  document.body.dataset.ready = "true";
  if (early) prefetched.set(wanted, early);
  await select(wanted && runNamed(wanted) ? wanted : page.runs.at(-1).executionId);
  if (wanted && !runNamed(wanted)) problem(`No run ${wanted} in session ${page.sessionId}; showing the latest.`);
}

main();
