// The run page (/demo/run.html?session=<id>[&execution=<id>][&compare=<id>][#token=<t>]):
// the runs of one session apart (GET /api/sessions/{id}/runs), and for the chosen run
// its envelopes (GET /api/sessions/{id}/trace?execution_id=…) as a waterfall, the
// continuation decisions explained, a raw envelope inspector, a comparison with another
// run, and export links. Every view is computed from the envelopes (js/trace.js, the
// client kit's reducer); model and tool text is only ever set as textContent.

import { alignRuns, COMPARED, describe, explainContinuation, foldRun, runTotals, stepOfEnvelope, waterfall } from "./trace.js";
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
  compare: params.get("compare") || null,
  inspector: { page: 0, type: "", step: "", tool: "" },
  timings: {},
};

// Read-only hooks for tests and the benchmark.
window.runPage = {
  get runs() { return page.runs.map((run) => ({ executionId: run.executionId, loaded: Boolean(run.records), envelopes: run.records?.length ?? 0 })); },
  get selected() { return page.selected; },
  get timings() { return { ...page.timings }; },
};

function api(path) {
  const headers = { Accept: "application/json" };
  if (page.token) headers.Authorization = `Bearer ${page.token}`;
  return fetch(path, { headers }).then(async (response) => {
    const body = await response.json().catch(() => null);
    if (!response.ok) {
      const reason = body?.error || `HTTP ${response.status}`;
      throw new Error(`${reason} (GET ${path.split("?")[0]} answered ${response.status})`);
    }
    return body;
  });
}

function sessionPath(suffix) {
  return `/api/sessions/${encodeURIComponent(page.sessionId)}/${suffix}`;
}

function tracePath(executionId, format) {
  const query = new URLSearchParams({ execution_id: executionId, format });
  if (page.token) query.set("token", page.token);
  return `${sessionPath("trace")}?${query}`;
}

function problem(message) {
  const box = $("page-error");
  box.hidden = !message;
  setText(box, message || "");
}

// --- loading -------------------------------------------------------------------------------

async function loadRuns() {
  const body = await api(sessionPath("runs"));
  page.runs = (body.runs || []).map((summary) => ({
    executionId: summary.execution_id,
    summary,
    records: null,
    view: null,
    trimmed: false,
  }));
}

async function loadTrace(run) {
  if (run.records) return run;
  run.loading ??= (async () => {
    const started = performance.now();
    const body = await api(tracePath(run.executionId, "json"));
    const fetched = performance.now();
    const records = (body.envelopes || []).filter((record) => record?.envelope?.execution_id === run.executionId || !record?.envelope?.execution_id);
    run.view = foldRun(records, page.sessionId);
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

async function select(executionId) {
  const run = runNamed(executionId);
  if (!run) {
    problem(`No run ${executionId} in session ${page.sessionId}.`);
    return;
  }
  page.selected = executionId;
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
  page.timings.readyAt = performance.now();
  document.body.dataset.rendered = executionId;
}

function updateUrl() {
  const query = new URLSearchParams({ session: page.sessionId });
  if (page.selected) query.set("execution", page.selected);
  if (page.compare) query.set("compare", page.compare);
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
    const badge = element("span", "badge", s.status);
    badge.dataset.status = s.status === "running" ? "in_progress" : s.status;
    const duration = s.ended_at != null ? (s.ended_at - s.started_at) * 1000 : null;
    button.append(
      element("strong", "", `Run ${index + 1}`),
      badge,
      element("span", "mono muted", s.execution_id),
      element("span", "muted", formatTime(s.started_at)),
      element("span", "run-item-totals", `${s.steps} steps · ${s.tool_calls} tool calls · ${formatNumber(s.tokens?.total)} tokens · ${formatDuration(duration)}`),
    );
    if (s.stop_reason) button.append(element("span", "muted", `stop: ${s.stop_reason}${s.resolved_by ? ` by ${s.resolved_by}` : ""}`));
    button.addEventListener("click", () => select(run.executionId));
    item.append(button);
    return item;
  });
  list.replaceChildren(...items);
  const options = page.runs.map((run, index) => {
    const option = element("option", "", `Run ${index + 1} · ${run.executionId}`);
    option.value = run.executionId;
    return option;
  });
  const compare = $("compare-select");
  compare.replaceChildren(element("option", "", "—"), ...options);
  compare.firstElementChild.value = "";
  compare.value = page.compare && runNamed(page.compare) ? page.compare : "";
}

// --- the selected run ------------------------------------------------------------------------

function renderRun(run) {
  const view = run.view;
  const sums = runTotals(view);
  setText($("execution-id"), run.executionId);
  const badge = $("run-status");
  badge.dataset.status = view.status;
  setText(badge, view.status === "in_progress" ? "in progress" : view.status);
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
  $("export-json").href = tracePath(run.executionId, "json");
  $("export-json").download = `${page.sessionId}-${run.executionId}.json`;
  $("export-otlp").href = tracePath(run.executionId, "otlp");
  $("export-otlp").download = `${page.sessionId}-${run.executionId}.otlp.json`;
  renderWaterfall(run);
  renderContinuations(run);
  fillFilters(run);
  renderInspector(run);
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
  const blocks = [];
  for (const step of run.view.steps) {
    const cont = step.continuation ?? step.completed?.continuation;
    if (!cont) continue;
    const why = explainContinuation(cont);
    const block = element("article", "cont-block");
    block.dataset.step = String(step.number);
    block.dataset.decision = why.decision;
    block.append(element("h3", "", `Step ${step.number}: ${why.decision}${cont.stop_reason ? ` (${cont.stop_reason})` : ""}`));
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
    block.append(facts);
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
      block.append(wrap);
    }
    blocks.push(block);
  }
  if (!blocks.length) blocks.push(element("p", "muted", "No continuation decisions in this run's envelopes."));
  $("continuations").replaceChildren(...blocks);
}

// --- the envelope inspector (paginated: only one page of rows is in the DOM) -------------------

function indexRecords(run) {
  if (run.index) return run.index;
  let step = null;
  run.index = run.records.map((record, i) => {
    const envelope = record.envelope;
    const own = stepOfEnvelope(envelope, step);
    if (envelope?.type === "agent.step.started" && own !== null) step = own;
    return { i, record, type: String(envelope?.type ?? ""), step: own, tool: envelope?.payload?.tool_call_id ?? null };
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
  $("page-prev").disabled = filter.page === 0;
  $("page-next").disabled = filter.page >= pages - 1;
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
  const other = page.compare ? runNamed(page.compare) : null;
  if (!current?.view || !other || other === current) {
    table.hidden = true;
    setText(verdict, page.compare && !other ? `No run ${page.compare} in this session.` : "Choose another run to compare with.");
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
  setText($("compare-right-head"), `Other run (${other.executionId})`);
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
  $("page-prev").addEventListener("click", () => turn(-1));
  $("page-next").addEventListener("click", () => turn(1));
  $("compare-select").addEventListener("change", async (event) => {
    page.compare = event.target.value || null;
    updateUrl();
    await renderCompare();
  });
}

function turn(delta) {
  const run = runNamed(page.selected);
  if (!run?.records) return;
  page.inspector.page = Math.max(0, page.inspector.page + delta);
  renderInspector(run);
}

async function main() {
  wire();
  setText($("session-id"), page.sessionId || "—");
  if (!/^[A-Za-z0-9_\-=@,.;]{1,128}$/.test(page.sessionId)) {
    problem("Open a run from the sessions page (this address names no valid session id).");
    return;
  }
  try {
    await loadRuns();
  } catch (error) {
    problem(`Could not list this session's runs: ${error.message}`);
    return;
  }
  if (!page.runs.length) {
    problem("This session has no recorded runs.");
    return;
  }
  document.body.dataset.ready = "true";
  const wanted = params.get("execution");
  await select(wanted && runNamed(wanted) ? wanted : page.runs.at(-1).executionId);
  if (wanted && !runNamed(wanted)) problem(`No run ${wanted} in session ${page.sessionId}; showing the latest.`);
}

main();
