// The sessions page (/demo/sessions.html): every recorded run, newest first
// (GET /api/sessions), with filters and search, kept live by polling the first page every
// 2 s with If-None-Match (an idle poll is a 304). A row opens the run page.

import { element, formatDuration, formatNumber, formatTime, setText } from "./format.js";

const $ = (id) => document.getElementById(id);
const POLL_MS = 2000;

const list = {
  query: new URLSearchParams(), // the filters applied
  etag: null, // of the first page under `query`
  first: [], // the first page (polled)
  more: [], // later pages ("Load more"), not polled
  cursor: null, // next_cursor after the last page loaded
  ticket: 0, // the latest request; an older answer is dropped
  polls: 0,
  notModified: 0,
  chosen: [], // up to two runs ticked to compare: [{session_id, execution_id}]
};

// Read-only hooks for tests' diagnostics.
window.sessionsPage = {
  get polls() { return list.polls; },
  get notModified() { return list.notModified; },
  get etag() { return list.etag; },
};

function toUnix(value) {
  if (!value) return null;
  const ms = Date.parse(value); // datetime-local: local time
  return Number.isNaN(ms) ? Number.NaN : Math.floor(ms / 1000);
}

function queryFromForm() {
  const form = $("filters");
  const query = new URLSearchParams();
  const q = form.elements.q.value.trim();
  if (q) query.set("q", q);
  for (const name of ["status", "stop_reason", "resolved_by"]) {
    const value = form.elements[name].value.trim();
    if (value) query.set(name, value);
  }
  for (const name of ["from", "to"]) {
    const value = toUnix(form.elements[name].value);
    if (value === null) continue;
    if (Number.isNaN(value)) throw new Error(`"${name}" is not a date and time`);
    query.set(name, String(value));
  }
  return query;
}

function formFromQuery(query) {
  const form = $("filters");
  form.elements.q.value = query.get("q") ?? "";
  form.elements.status.value = query.get("status") ?? "";
  form.elements.stop_reason.value = query.get("stop_reason") ?? "";
  form.elements.resolved_by.value = query.get("resolved_by") ?? "";
  for (const name of ["from", "to"]) {
    const seconds = Number(query.get(name));
    form.elements[name].value = query.get(name) && Number.isFinite(seconds) ? localInput(seconds) : "";
  }
}

function localInput(seconds) {
  const date = new Date(seconds * 1000);
  const pad = (n) => String(n).padStart(2, "0");
  return `${date.getFullYear()}-${pad(date.getMonth() + 1)}-${pad(date.getDate())}T${pad(date.getHours())}:${pad(date.getMinutes())}:${pad(date.getSeconds())}`;
}

function problem(message) {
  const box = $("list-error");
  box.hidden = !message;
  setText(box, message || "");
}

async function request(query, { cursor = null, etag = null } = {}) {
  const params = new URLSearchParams(query);
  if (cursor) params.set("cursor", cursor);
  const headers = { Accept: "application/json" };
  if (etag) headers["If-None-Match"] = etag;
  const response = await fetch(`/api/sessions?${params}`, { headers, cache: "no-store" });
  if (response.status === 304) return { notModified: true };
  const body = await response.json().catch(() => null);
  if (!response.ok) throw new Error(body?.error || `GET /api/sessions answered ${response.status}`);
  return { body, etag: response.headers.get("ETag") };
}

/** Fetch the first page under the current filters (`poll`: with If-None-Match). */
async function refresh(poll = false) {
  const ticket = ++list.ticket;
  try {
    const answer = await request(list.query, { etag: poll ? list.etag : null });
    if (ticket !== list.ticket) return;
    list.polls += 1;
    problem("");
    if (answer.notModified) {
      list.notModified += 1;
      renderRows(); // running rows' durations move on
      return;
    }
    list.etag = answer.etag;
    list.first = answer.body.runs || [];
    if (!poll) {
      list.more = [];
      list.cursor = answer.body.next_cursor ?? null;
    } else if (!list.more.length) {
      list.cursor = answer.body.next_cursor ?? null;
    }
    renderRows();
  } catch (error) {
    if (ticket === list.ticket) problem(error.message);
  }
}

async function loadMore() {
  if (!list.cursor) return;
  const ticket = ++list.ticket;
  try {
    const answer = await request(list.query, { cursor: list.cursor });
    if (ticket !== list.ticket) return;
    list.more.push(...(answer.body.runs || []));
    list.cursor = answer.body.next_cursor ?? null;
    renderRows();
  } catch (error) {
    if (ticket === list.ticket) problem(error.message);
  }
}

function runHref(run) {
  return `/demo/run.html?${new URLSearchParams({ session: run.session_id, execution: run.execution_id })}`;
}

function renderRows() {
  const seen = new Set();
  const runs = [...list.first, ...list.more].filter((run) => {
    const key = `${run.session_id}\u0000${run.execution_id}`;
    if (seen.has(key)) return false;
    seen.add(key);
    return true;
  });
  const now = Date.now() / 1000;
  const rows = runs.map((run) => {
    const row = element("tr", "session-row");
    row.dataset.sessionId = run.session_id;
    row.dataset.executionId = run.execution_id;
    row.dataset.status = run.status;
    const badge = element("span", "badge", run.status);
    badge.dataset.status = run.status === "running" ? "in_progress" : run.status;
    const status = element("td");
    status.append(badge);
    const pick = element("td", "pick");
    const box = element("input");
    box.type = "checkbox";
    box.setAttribute("aria-label", `Compare ${run.execution_id}`);
    box.checked = list.chosen.some((c) => c.execution_id === run.execution_id && c.session_id === run.session_id);
    box.addEventListener("change", () => choose(run, box.checked));
    pick.append(box);
    const session = element("td", "mono");
    const link = element("a", "run-link", run.session_id);
    link.href = runHref(run);
    session.append(link, element("span", "muted execution", run.execution_id));
    if (run.private) session.append(element("span", "chip", "private"));
    if (run.capability) session.append(element("span", "chip", run.capability));
    const input = element("td", "preview", run.input_preview || "—");
    if (run.error) input.append(element("span", "row-error", run.error));
    const end = run.ended_at ?? now;
    const duration = element("td", "", formatDuration(Math.max(0, end - run.started_at) * 1000));
    if (run.ended_at == null) duration.classList.add("live");
    row.append(
      pick,
      status,
      session,
      input,
      element("td", "", formatTime(run.started_at)),
      duration,
      element("td", "num", String(run.steps)),
      element("td", "num", String(run.tool_calls)),
      element("td", "num", formatNumber(run.tokens?.total)),
      element("td", "", run.stop_reason ?? "—"),
      element("td", "mono", run.resolved_by ?? "—"),
    );
    row.addEventListener("click", (event) => {
      if (event.target.closest("a, input, .pick")) return;
      location.href = runHref(run);
    });
    return row;
  });
  $("sessions").querySelector("tbody").replaceChildren(...rows);
  $("list-empty").hidden = rows.length > 0;
  $("load-more").hidden = !list.cursor;
  showCompare();
  setText($("list-state"), `${rows.length} run${rows.length === 1 ? "" : "s"}${list.cursor ? " (more available)" : ""} · live`);
}

/** Tick or untick a run to compare; a third tick drops the oldest. */
function choose(run, chosen) {
  const same = (c) => c.execution_id === run.execution_id && c.session_id === run.session_id;
  list.chosen = list.chosen.filter((c) => !same(c));
  if (chosen) list.chosen.push({ session_id: run.session_id, execution_id: run.execution_id });
  list.chosen = list.chosen.slice(-2);
  renderRows();
}

function showCompare() {
  const link = $("compare-link");
  link.hidden = list.chosen.length !== 2;
  if (link.hidden) return;
  const [a, b] = list.chosen;
  const query = new URLSearchParams({ session: a.session_id, execution: a.execution_id, compare: b.execution_id });
  if (b.session_id !== a.session_id) query.set("compare_session", b.session_id);
  link.href = `/demo/run.html?${query}`;
}

function apply(event, given = null) {
  event?.preventDefault();
  let query = given;
  try {
    query ??= queryFromForm();
  } catch (error) {
    problem(error.message);
    return;
  }
  list.query = query;
  list.etag = null;
  history.replaceState(null, "", query.size ? `?${query}` : location.pathname);
  refresh(false);
}

function main() {
  const form = $("filters");
  form.addEventListener("submit", apply);
  form.addEventListener("reset", () => setTimeout(apply, 0));
  for (const name of ["status", "stop_reason"]) form.elements[name].addEventListener("change", apply);
  $("load-more").addEventListener("click", loadMore);
  const initial = new URLSearchParams(location.search); // as given: the server judges it
  formFromQuery(initial);
  apply(null, initial);
  setInterval(() => {
    if (document.visibilityState === "visible") refresh(true);
  }, POLL_MS);
  document.addEventListener("visibilitychange", () => {
    if (document.visibilityState === "visible") refresh(true);
  });
  document.body.dataset.ready = "true";
}

main();
