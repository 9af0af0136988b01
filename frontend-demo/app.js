// The live agent dashboard: start a run (POST /run) or attach to a session, follow its
// envelopes on agent.<session> with pusher-js, resume after drops, reconcile at the end.
//
// A session's runs are kept apart (the kit's reduceSession: one RunView per execution
// id): the page shows the latest run and lists the earlier ones, each reconciled on its
// own; a run that starts while the page follows the session is shown as it starts.
// What the page cannot know is said, never drawn as a run going on: an unknown session
// ("no such session"), a connection lost (the run's clock stops), a server that went
// away or came back without the run ("server went away").
//
// No framework and no build step: ES modules served as they are, pusher-js and the
// client kit (@agent-broadcaster/client: the feed with resume by position, the run
// reducer, reconcile) vendored in vendor/ (see vendor/README.md).

import {
  ChannelFeed,
  applySessionSnapshot,
  createRunView,
  createSessionView,
  latestRun,
  reconcile,
  reduceSession,
  runOf,
} from "./vendor/agent-broadcaster-client/index.js";
import { driverNote, renderStepLimit } from "./js/controls.js";
import { pageRun, TERMINAL } from "./js/run-model.js";
import { DashboardView, shownStatus } from "./js/view.js";

const view = new DashboardView();
const SESSION_HASH = /(?:^#|&)session=([^&]+)/;
/** A connection down this long (retried all along) means the server went away. */
const GONE_AFTER_MS = 8000;
/** No event this long from a run going on: ask the run index whether anything runs it. */
const SILENCE_MS = 5000;
const LIVE = { link: "live", text: "", haltedAt: null };

const app = {
  config: null,
  pusher: null,
  everConnected: false,
  feed: null,
  follow: null, // the session followed now (see follow())
  run: null, // what the page renders: pageRun() of the run shown
  auth: null, // {endpoint, token} for a private session, from POST /run
  reconcileResult: null, // the verdict of the run shown
  positions: [], // positions of the envelopes applied, in order (for debugging)
  resumes: [],
};

// A small read-only hook for debugging in the console (and for tests' diagnostics).
window.dashboard = {
  get run() { return app.run; },
  get view() { return app.follow ? shownRun(app.follow) : null; },
  get session() { return app.follow?.session ?? null; },
  get shown() { return app.follow?.shownId ?? null; },
  get position() { return app.feed?.position ?? null; },
  get positions() { return [...app.positions]; },
  get resumes() { return [...app.resumes]; },
  get reconcile() { return app.reconcileResult; },
  get verdicts() { return Object.fromEntries(app.follow?.verdicts ?? []); },
  get connection() { return app.pusher?.connection.state ?? "idle"; },
  get pusher() { return app.pusher; },
};

// --- rendering ----------------------------------------------------------------------

let renderPending = false;
function scheduleRender() {
  if (renderPending) return;
  renderPending = true;
  setTimeout(() => {
    renderPending = false;
    view.render(app.run);
    if (app.follow) renderRuns(app.follow);
  }, 16);
}
setInterval(() => {
  if (app.run && !TERMINAL.has(app.run.status) && app.run.startedAt !== null) view.renderSummary(app.run);
  const followed = app.follow;
  if (followed && !followed.replaying && followed.link.link === "live" && Date.now() - followed.heardAt > SILENCE_MS) {
    askIndex(followed);
  }
}, 500);

// --- server configuration and connection -----------------------------------------------

async function loadConfig() {
  const response = await fetch("/api/demo/config", { headers: { Accept: "application/json" } });
  if (!response.ok) throw new Error(`GET /api/demo/config answered ${response.status}`);
  const config = await response.json();
  const override = new URLSearchParams(location.search).get("key");
  if (override) config.app_key = override;
  if (!config.app_key) throw new Error("GET /api/demo/config gave no app_key");
  return config;
}

function authorize({ socketId, channelName }, callback) {
  const endpoint = app.auth?.endpoint || app.config.auth_endpoint || "/broadcasting/auth";
  const body = new URLSearchParams({ socket_id: socketId, channel_name: channelName });
  if (app.auth?.token) body.set("session_token", app.auth.token);
  fetch(endpoint, { method: "POST", body })
    .then(async (response) => {
      const data = await response.json().catch(() => ({}));
      if (!response.ok) throw new Error(data.error || `auth answered ${response.status}`);
      callback(null, data);
    })
    .catch((error) => callback(error, null));
}

function connect() {
  if (app.pusher) return app.pusher;
  const secure = location.protocol === "https:";
  const port = Number(location.port) || (secure ? 443 : 80);
  const pusher = new window.Pusher(app.config.app_key, {
    cluster: "local", // required by pusher-js; unused with wsHost
    wsHost: location.hostname,
    wsPort: port,
    wssPort: port,
    forceTLS: secure,
    enabledTransports: [secure ? "wss" : "ws"],
    disableStats: true,
    channelAuthorization: { customHandler: authorize },
  });
  pusher.connection.bind("state_change", ({ current }) => {
    showConnection(current);
    watchConnection(current);
    watchLink(current);
  });
  window.addEventListener("online", () => retryNow());
  app.pusher = pusher;
  return pusher;
}

// After a failed attempt pusher-js waits out a 15 s (then 30 s, 60 s) attempt timeout
// before it tries again, so a page whose server came back would sit idle for that long.
// While a connection that once worked is down, retry sooner: after 1 s, growing to 5 s.
const retry = { timer: null, attempt: 0, forcing: false };

function watchConnection(state) {
  if (state === "connected") {
    clearTimeout(retry.timer);
    retry.timer = null;
    retry.attempt = 0;
  } else if (app.everConnected && !retry.timer && !retry.forcing) {
    scheduleRetry();
  }
}

function scheduleRetry() {
  const delay = Math.min(1000 * 1.5 ** retry.attempt, 5000) + Math.random() * 250;
  retry.timer = setTimeout(() => {
    retry.timer = null;
    retryNow();
  }, delay);
}

function retryNow() {
  const connection = app.pusher?.connection;
  if (!connection || connection.state === "connected" || !app.everConnected) return;
  clearTimeout(retry.timer);
  retry.attempt += 1;
  retry.forcing = true;
  try {
    connection.disconnect(); // abort the waiting attempt; channels are kept
    connection.connect(); // and start a fresh one now (it re-subscribes when connected)
  } finally {
    retry.forcing = false;
  }
  scheduleRetry();
}

const CONNECTION_TEXT = {
  initialized: ["connecting", "Connecting…"],
  connecting: ["connecting", "Connecting…"],
  connected: ["connected", "Live"],
  unavailable: ["offline", "Offline — retrying"],
  failed: ["offline", "WebSockets unavailable"],
  disconnected: ["offline", "Disconnected"],
};

function showConnection(state) {
  if (state === "connected") app.everConnected = true;
  if (retry.forcing && state === "disconnected") return; // a retry, not a user disconnect
  let [kind, text] = CONNECTION_TEXT[state] || ["offline", state];
  if (state === "connecting" && app.everConnected) [kind, text] = ["reconnecting", "Reconnecting…"];
  view.connection(kind, text);
  if (kind !== "connected" && app.feed?.position) {
    view.history("pending", `will resume after event ${app.feed.last.offset}`);
  }
}

// --- following a session ---------------------------------------------------------------

function follow(sessionId, channelName, from = null) {
  if (app.feed) app.feed.close();
  if (app.follow) clearTimeout(app.follow.goneTimer);
  const followed = {
    sessionId,
    channel: channelName,
    session: createSessionView(sessionId), // the kit's SessionView: the runs apart
    pinned: null, // an earlier run shown on purpose (its execution id); null: the latest
    shownId: undefined, // the run the timeline shows now
    verdicts: new Map(), // execution id -> its reconcile result
    tickets: new Map(), // execution id -> its latest reconcile (an older answer is dropped)
    replaying: true, // until the first resume answer: ends seen are reconciled after it
    pendingEnds: [], // [{executionId, url}] of runs that ended within that replay
    link: LIVE, // what the page knows of the server of the latest run
    goneTimer: null,
    heardAt: Date.now(), // when the page last heard of the session (an event, the index)
    lastEventAt: null, // the timestamp (ms) of the session's last event
    asking: false, // a run index request is on its way
    notice: null, // what is said of the session itself (see notify())
  };
  app.follow = followed;
  app.positions = [];
  app.resumes = [];
  app.reconcileResult = null;
  view.reset();
  view.history("none", "");
  history.replaceState(null, "", `#session=${encodeURIComponent(sessionId)}`); // reload re-attaches
  // The run page shows the session's runs apart (and follows the channel if no index).
  const runLink = document.getElementById("run-page-link");
  runLink.href = `/demo/run.html?${new URLSearchParams({ session: sessionId })}${app.auth?.token ? `#token=${encodeURIComponent(app.auth.token)}` : ""}`;
  runLink.hidden = false;
  refresh(followed);
  const pusher = connect();
  app.feed = new ChannelFeed(pusher, channelName, {
    onEnvelope: (envelope, position) => onEnvelope(followed, envelope, position),
    onResume: (result) => onResume(followed, result),
    // A (re)subscribe: its replay comes before the answer; ends seen in it wait for it.
    onSubscribe: () => { followed.replaying = true; },
    onProblem: (message) => view.formError(message),
  }, from);
}

/** The run the page shows: the one chosen in the list, else the session's latest. */
function shownRun(followed) {
  return (followed.pinned && runOf(followed.session, followed.pinned)) || latestRun(followed.session);
}

function isLatest(followed, run) {
  return latestRun(followed.session) === run;
}

/** What the page knows of `run`'s server, for a run that has not ended (see pageRun). */
function linkOf(followed, run) {
  if (TERMINAL.has(run.status)) return LIVE;
  if (!isLatest(followed, run)) {
    // One run at a time per session: a later run began, so this one is over, unended.
    const runs = followed.session.runs;
    const next = runs[runs.indexOf(run) + 1];
    const haltedAt = Date.parse(next?.started_at ?? "");
    return {
      link: "unended",
      text: "A later run of this session started before this run's end was published: this run never ended.",
      haltedAt: Number.isNaN(haltedAt) ? Date.now() : haltedAt,
    };
  }
  return followed.link;
}

/** Say `text` about the session itself (`kind`: no-such-session, no-run-yet, private, expired; null: nothing). */
function notify(followed, kind, text = "") {
  if (followed !== app.follow) return;
  followed.notice = kind;
  view.notice(kind, text);
  refresh(followed);
}

/** What the summary says while the session has no run: waiting for the server's answer, or the notice. */
function noRun(followed) {
  return { link: followed.notice ?? (followed.replaying ? "waiting" : "no-run-yet"), text: "", haltedAt: null };
}

/** Render what changed: the run shown (switching to a new one), the list of runs. */
function refresh(followed) {
  if (followed !== app.follow) return;
  const run = shownRun(followed);
  const id = run ? run.execution_id : undefined;
  app.run = pageRun(run ?? createRunView(followed.sessionId), followed.channel, run ? linkOf(followed, run) : noRun(followed));
  if (id !== followed.shownId) {
    followed.shownId = id;
    view.resetRun(); // another run's steps: the cards start again
    showVerdict(followed, followed.verdicts.get(id) ?? { state: "waiting" });
  }
  scheduleRender(); // the run shown and the list of runs, at most once a frame
}

function renderRuns(followed) {
  const list = followed.session.runs.map((run, index) => ({
    executionId: run.execution_id,
    number: index + 1,
    status: shownStatus(pageRun(run, followed.channel, linkOf(followed, run))),
    verdict: followed.verdicts.get(run.execution_id)?.state ?? null,
    steps: run.steps.filter((step) => step.completed).length,
  }));
  view.runs(list, followed.shownId ?? null, Boolean(followed.pinned), (executionId) => choose(followed, executionId));
}

/** Show run `executionId` of the session (the latest: follow the latest again). */
function choose(followed, executionId) {
  const latest = latestRun(followed.session);
  followed.pinned = !executionId || latest?.execution_id === executionId ? null : executionId;
  refresh(followed);
}

function onEnvelope(followed, envelope, position) {
  if (followed !== app.follow) return;
  const next = reduceSession(followed.session, envelope, position);
  if (next === followed.session) return; // not an agent envelope, or one already applied
  if (next.runs.length > followed.session.runs.length && followed.link.link !== "live" && app.pusher?.connection.state === "connected") {
    setLink(followed, LIVE); // a new run: what was said of the last one's server is not about it
  }
  followed.session = next;
  followed.heardAt = Date.now();
  const at = Date.parse(envelope.timestamp ?? "");
  if (!Number.isNaN(at)) followed.lastEventAt = at;
  app.positions.push(position);
  view.logEvent(envelope, position);
  if (followed.notice) notify(followed, null); // a run: the session exists
  const payload = envelope.payload;
  if (envelope.type === "agent.status" && payload.parent_execution_id == null && TERMINAL.has(payload.status)) {
    const run = runOf(next, envelope.execution_id) ?? latestRun(next);
    const end = { executionId: run.execution_id, url: payload.state_url ?? null };
    if (followed.replaying) followed.pendingEnds.push(end);
    else endRun(followed, end);
  }
  refresh(followed);
}

function onResume(followed, result) {
  if (followed !== app.follow) return;
  app.resumes.push(result);
  followed.replaying = false;
  refresh(followed);
  const missed = `${result.missed} ${result.missed === 1 ? "event" : "events"}`;
  if (result.recovered && result.initial) {
    view.history(result.missed ? "replayed" : "none", result.missed ? `history replayed (${missed})` : "");
  } else if (result.recovered) {
    view.history("recovered", `history recovered (${missed} missed)`);
  } else {
    view.history("lost", "history not recovered — loading the snapshot");
  }
  const ends = followed.pendingEnds.splice(0);
  for (const end of ends) endRun(followed, end);
  if (!result.recovered) {
    recoverFromSnapshot(followed);
  } else {
    setLink(followed, LIVE);
    askIndex(followed); // a run that looks unended: is anything still running it?
    if (result.initial && result.empty) checkSession(followed);
    else if (result.initial && !followed.session.runs.length) {
      notify(followed, "no-run-yet", `Session ${followed.sessionId} has no run yet: its channel has events, none of a run. The page shows the first one as it starts.`);
    }
  }
}

// --- what the page knows of the server ------------------------------------------------------

function setLink(followed, link) {
  if (followed.link === link) return;
  if (link.link === "live" || link.link === "gone") clearTimeout(followed.goneTimer);
  followed.link = link;
  refresh(followed);
}

const clock = (ms) => new Date(ms).toLocaleTimeString("en-GB");

/**
 * The connection dropped: the run's progress is unknown from now on (its clock stops);
 * not back within GONE_AFTER_MS, the server went away. A reconnect's resume answer says
 * whether the run goes on (onResume, recoverFromSnapshot).
 */
function watchLink(state) {
  const followed = app.follow;
  if (!followed || state === "connected" || !app.everConnected || followed.link.link !== "live") return;
  const haltedAt = Date.now();
  setLink(followed, {
    link: "lost",
    text: `The connection to the server was lost at ${clock(haltedAt)}: what this run did since is unknown until it comes back (reconnecting…).`,
    haltedAt,
  });
  clearTimeout(followed.goneTimer);
  followed.goneTimer = setTimeout(() => {
    if (app.pusher?.connection.state === "connected" || followed.link.link !== "lost") return;
    setLink(followed, {
      link: "gone",
      text: `The server went away at ${clock(haltedAt)} and has not come back: this run's end will not be received here, and its clock is stopped. The page keeps trying to reconnect.`,
      haltedAt,
    });
  }, GONE_AFTER_MS);
}

// --- reconcile, each run on its own ------------------------------------------------------------

/** The verdict of run `executionId` (shown in the reconcile box if it is the run shown). */
function setVerdict(followed, executionId, result) {
  if (followed !== app.follow) return;
  followed.verdicts.set(executionId, result);
  if (executionId === followed.shownId) showVerdict(followed, result);
  scheduleRender();
}

function showVerdict(followed, result) {
  app.reconcileResult = result.state === "waiting" ? null : result;
  view.render(app.run);
  view.reconcile(result);
}

/** The runs of the session after run `executionId`. */
function laterRuns(followed, executionId) {
  const runs = followed.session.runs;
  const index = runs.findIndex((run) => run.execution_id === executionId);
  return index < 0 ? [] : runs.slice(index + 1);
}

/** A run ended: compare it with the stored state, if that state can still be its own. */
function endRun(followed, { executionId, url }) {
  if (!url) {
    // Nothing was stored for this run: the session's state is an earlier run's.
    setVerdict(followed, executionId, { state: "error", message: "this run stored no final state" });
  } else if (laterRuns(followed, executionId).some((run) => TERMINAL.has(run.status))) {
    setVerdict(followed, executionId, { state: "superseded" });
  } else {
    reconcileRun(followed, executionId, url);
  }
}

async function getJson(followed, url) {
  const target = url || `/api/sessions/${encodeURIComponent(followed.sessionId)}/state`;
  const headers = { Accept: "application/json" };
  // A private session's state is served only to the holder of its token.
  if (app.auth?.token) headers.Authorization = `Bearer ${app.auth.token}`;
  const response = await fetch(target, { headers });
  const body = await response.json().catch(() => null);
  return { target, status: response.status, ok: response.ok, body };
}

async function fetchSnapshot(followed, url) {
  const { target, ok, status, body } = await getJson(followed, url);
  if (!ok) {
    const error = new Error(`GET ${target}: ${body?.error || body?.message || `HTTP ${status}`}`);
    error.status = status;
    throw error;
  }
  return body;
}

async function reconcileRun(followed, executionId, url) {
  const ticket = (followed.tickets.get(executionId) ?? 0) + 1;
  followed.tickets.set(executionId, ticket);
  const current = () => followed === app.follow && followed.tickets.get(executionId) === ticket;
  setVerdict(followed, executionId, { state: "checking" });
  try {
    const snapshot = await fetchSnapshot(followed, url);
    if (current()) judge(followed, executionId, snapshot);
  } catch (error) {
    if (current()) setVerdict(followed, executionId, { state: "error", message: error.message });
  }
}

/** Compare run `executionId` with `snapshot`, unless the snapshot is a later run's. */
function judge(followed, executionId, snapshot) {
  const run = runOf(followed.session, executionId) ?? latestRun(followed.session);
  if (!run) return;
  const later = laterRuns(followed, run.execution_id);
  const lastStep = run.steps.at(-1)?.number ?? 0;
  // The session stores its latest run's state: once a later run ended (or its steps are
  // in the state), this run's is gone.
  if (later.length && (later.some((other) => TERMINAL.has(other.status)) || snapshot.step_count > lastStep)) {
    setVerdict(followed, run.execution_id, { state: "superseded" });
    return;
  }
  const differences = reconcile(run, snapshot);
  const note = run.from_snapshot ? "Some steps were filled from the snapshot because their events were lost." : undefined;
  setVerdict(followed, run.execution_id, differences.length
    ? { state: "differs", differences, snapshot }
    : { state: "in_sync", note, snapshot });
}

/**
 * A gap the server could not fill (a restarted server, an expired history): fill the
 * latest run from the stored state; a run the server no longer knows never ends here.
 */
async function recoverFromSnapshot(followed) {
  let snapshot = null;
  try {
    snapshot = await fetchSnapshot(followed, null);
  } catch (error) {
    if (followed !== app.follow) return;
    view.history("lost", "history not recovered, no snapshot", error.message);
  }
  if (followed !== app.follow) return;
  if (snapshot) {
    followed.session = applySessionSnapshot(followed.session, snapshot);
    view.history("lost", "history not recovered — filled from the snapshot");
    refresh(followed);
    const run = latestRun(followed.session);
    if (TERMINAL.has(snapshot.status) && run) judge(followed, run.execution_id, snapshot);
  }
  const run = latestRun(followed.session);
  if (!run || TERMINAL.has(run.status)) {
    setLink(followed, LIVE);
    return;
  }
  // The run did not end as far as the page knows: does the server still know it?
  const runs = await getJson(followed, `/api/sessions/${encodeURIComponent(followed.sessionId)}/runs`).catch(() => null);
  if (followed !== app.follow) return;
  const summary = runs?.ok ? (runs.body?.runs ?? []).find((row) => row.execution_id === run.execution_id) : null;
  if (summary?.abandoned) {
    abandoned(followed);
    return;
  }
  if (summary) {
    setLink(followed, LIVE);
    return;
  }
  const haltedAt = followed.link.haltedAt ?? Date.now();
  setLink(followed, {
    link: "gone",
    text: `The server went away at ${clock(haltedAt)} and came back without this run (no events, no state, not in its run index): the run never ended, and its clock is stopped.`,
    haltedAt,
  });
}

/**
 * The latest run has not ended and nothing was heard of it for a while (or the page
 * just attached to it): the run index says whether anything still runs it (a run whose
 * server died is listed "abandoned" once its claim lapsed). At most one request at a
 * time, and one per SILENCE_MS of silence.
 */
async function askIndex(followed) {
  const run = latestRun(followed.session);
  followed.heardAt = Date.now();
  if (!run || TERMINAL.has(run.status) || followed.asking) return;
  followed.asking = true;
  try {
    const runs = await getJson(followed, `/api/sessions/${encodeURIComponent(followed.sessionId)}/runs`).catch(() => null);
    if (followed !== app.follow || latestRun(followed.session) !== run || followed.link.link !== "live") return;
    const summary = runs?.ok ? (runs.body?.runs ?? []).find((row) => row.execution_id === run.execution_id) : null;
    if (summary?.abandoned) abandoned(followed);
  } finally {
    followed.asking = false;
  }
}

function abandoned(followed) {
  const haltedAt = followed.link.haltedAt ?? followed.lastEventAt ?? Date.now();
  setLink(followed, {
    link: "gone",
    text: `The server running this run went away: the run index lists it as running, but nothing runs it any more (its last event at ${clock(haltedAt)}). It never ended, and its clock is stopped.`,
    haltedAt,
  });
}

/**
 * The channel has never been published to: say whether the session exists at all, from
 * the server (its stored state, its run index): a session id never seen is "no such
 * session", never an empty page.
 */
async function checkSession(followed) {
  const base = `/api/sessions/${encodeURIComponent(followed.sessionId)}`;
  try {
    const state = await getJson(followed, `${base}/state`);
    if (followed !== app.follow || followed.session.runs.length) return;
    if (state.status === 403) {
      notify(followed, "private", `Session ${followed.sessionId} is private: open it with its session token (the page that started its run has it).`);
      return;
    }
    if (state.ok) {
      followed.session = applySessionSnapshot(followed.session, state.body);
      view.history("lost", "the channel's history has expired — filled from the stored state");
      refresh(followed);
      const run = latestRun(followed.session);
      if (run && TERMINAL.has(state.body.status)) judge(followed, run.execution_id, state.body);
      return;
    }
    const runs = await getJson(followed, `${base}/runs`);
    if (followed !== app.follow || followed.session.runs.length) return;
    if (runs.ok && runs.body?.runs?.length) {
      notify(followed, "expired", `Session ${followed.sessionId} had ${runs.body.runs.length} run(s), but their events and state have expired here; the run page may still show their traces.`);
      return;
    }
    notify(followed, "no-such-session", `No such session: nothing was ever published on ${followed.channel}, and the server keeps no state and no runs of session ${followed.sessionId}. The page keeps listening in case a run starts.`);
  } catch (error) {
    if (followed === app.follow) notify(followed, "no-such-session", `Nothing was ever published on ${followed.channel}, and the server could not be asked about the session: ${error.message}`);
  }
}

// --- controls --------------------------------------------------------------------------

function channelFor(sessionId) {
  return `${app.config.private_sessions ? "private-" : ""}agent.${sessionId}`;
}

function busy(form, isBusy) {
  for (const control of form.querySelectorAll("input, button, select")) control.disabled = isBusy;
}

async function startRun(event) {
  event.preventDefault();
  const form = event.currentTarget;
  const input = form.elements.input.value.trim();
  const pace = Number(form.elements.pace.value);
  const trace = form.elements.trace.checked;
  const maxSteps = form.elements.max_steps.value;
  const mode = form.elements.mode.value;
  if (!input) {
    view.formError("Type a question for the agent first.");
    return;
  }
  view.formError("");
  busy(form, true);
  try {
    const response = await fetch("/run", {
      method: "POST",
      headers: { "Content-Type": "application/json", Accept: "application/json" },
      body: JSON.stringify({ input, trace, pace_ms: pace, mode, ...(maxSteps ? { max_steps: Number(maxSteps) } : {}) }),
    });
    const body = await response.json().catch(() => ({}));
    if (!response.ok) {
      const reason = body.error || body.detail || body.message || `HTTP ${response.status}`;
      view.formError(`Could not start the run: ${reason}`);
      return;
    }
    app.auth = body.auth || null;
    follow(body.session_id, body.channel || channelFor(body.session_id), body.position ?? null);
    document.getElementById("attach-input").value = body.session_id;
  } catch (error) {
    view.formError(`Could not start the run: ${error.message}`);
  } finally {
    busy(form, false);
  }
}

function attach(event) {
  event.preventDefault();
  const sessionId = event.currentTarget.elements.session.value.trim();
  if (!/^[A-Za-z0-9_\-=@,.;]{1,128}$/.test(sessionId)) {
    view.formError("A session id is 1–128 characters of letters, digits and _ - = @ , . ;");
    return;
  }
  view.formError("");
  app.auth = null;
  follow(sessionId, channelFor(sessionId));
}

async function main() {
  view.render(null);
  try {
    app.config = await loadConfig();
  } catch (error) {
    view.formError(`The demo server is not answering: ${error.message}`);
    view.connection("offline", "No server configuration");
    return;
  }
  if (!window.Pusher) {
    view.formError("pusher-js did not load (/demo/vendor/pusher.min.js).");
    return;
  }
  if (app.config.run_default_mode) document.getElementById("mode-select").value = app.config.run_default_mode;
  const form = document.getElementById("run-form");
  renderStepLimit(form, app.config);
  form.elements.mode.addEventListener("change", () => renderStepLimit(form, app.config));
  document.getElementById("driver-note").textContent = driverNote(app.config);
  document.getElementById("run-form").addEventListener("submit", startRun);
  document.getElementById("attach-form").addEventListener("submit", attach);
  document.getElementById("follow-latest").addEventListener("click", () => app.follow && choose(app.follow, null));
  document.body.dataset.ready = "true";
  const match = SESSION_HASH.exec(location.hash);
  if (match) {
    const sessionId = decodeURIComponent(match[1]);
    document.getElementById("attach-input").value = sessionId;
    follow(sessionId, channelFor(sessionId));
  } else {
    connect();
  }
}

main();
