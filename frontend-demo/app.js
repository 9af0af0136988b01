// The live agent dashboard: start a run (POST /run) or attach to a session, follow its
// envelopes on agent.<session> with pusher-js, resume after drops, reconcile at the end.
//
// No framework and no build step: ES modules served as they are, pusher-js and the
// client kit (@agent-broadcaster/client: the feed with resume by position, the run
// reducer, reconcile) vendored in vendor/ (see vendor/README.md).

import {
  ChannelFeed,
  applySnapshot,
  createRunView,
  reconcile,
  reduceRun,
} from "./vendor/agent-broadcaster-client/index.js";
import { driverNote, renderStepLimit } from "./js/controls.js";
import { pageRun, TERMINAL } from "./js/run-model.js";
import { DashboardView } from "./js/view.js";

const view = new DashboardView();
const SESSION_HASH = /(?:^#|&)session=([^&]+)/;

const app = {
  config: null,
  pusher: null,
  everConnected: false,
  feed: null,
  follow: null, // the session followed now: {sessionId, channel, view} (view: the kit's RunView)
  run: null, // what the page renders: pageRun(follow.view)
  auth: null, // {endpoint, token} for a private session, from POST /run
  reconcileResult: null,
  reconcileTicket: 0, // the latest reconcile; an older snapshot answer is dropped
  positions: [], // positions of the envelopes applied, in order (for debugging)
  resumes: [],
};

// A small read-only hook for debugging in the console (and for tests' diagnostics).
window.dashboard = {
  get run() { return app.run; },
  get view() { return app.follow?.view ?? null; },
  get position() { return app.feed?.position ?? null; },
  get positions() { return [...app.positions]; },
  get resumes() { return [...app.resumes]; },
  get reconcile() { return app.reconcileResult; },
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
  }, 16);
}
setInterval(() => {
  if (app.run && !TERMINAL.has(app.run.status) && app.run.startedAt !== null) view.renderSummary(app.run);
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
  const followed = { sessionId, channel: channelName, view: createRunView(sessionId) };
  app.follow = followed;
  app.run = pageRun(followed.view, channelName);
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
  const pusher = connect();
  app.feed = new ChannelFeed(pusher, channelName, {
    onEnvelope: (envelope, position) => onEnvelope(followed, envelope, position),
    onResume: (result) => onResume(followed, result),
    onProblem: (message) => view.formError(message),
  }, from);
  scheduleRender();
}

/** Replace the followed run's view (and the page's run built from it). */
function setView(followed, next) {
  followed.view = next;
  if (followed === app.follow) app.run = pageRun(next, followed.channel);
}

function onEnvelope(followed, envelope, position) {
  if (followed !== app.follow) return;
  const next = reduceRun(followed.view, envelope, position);
  if (next === followed.view) return; // not an agent envelope, or one already applied
  setView(followed, next);
  app.positions.push(position);
  view.logEvent(envelope, position);
  scheduleRender();
  if (envelope.type !== "agent.status") return;
  if (TERMINAL.has(envelope.payload.status)) {
    if (envelope.payload.state_url) {
      reconcileWithSnapshot(followed, envelope.payload.state_url);
    } else {
      // Nothing was stored for this run: the session's state is an earlier run's.
      app.reconcileTicket += 1;
      app.reconcileResult = { state: "error", message: "this run stored no final state" };
      view.reconcile(app.reconcileResult);
    }
  } else if (app.reconcileResult) {
    // Another run of the session started: the last verdict was about the one before.
    app.reconcileTicket += 1;
    app.reconcileResult = null;
    view.reconcile({ state: "waiting" });
  }
}

function onResume(followed, result) {
  if (followed !== app.follow) return;
  app.resumes.push(result);
  const missed = `${result.missed} ${result.missed === 1 ? "event" : "events"}`;
  if (result.recovered && result.initial) {
    view.history(result.missed ? "replayed" : "none", result.missed ? `history replayed (${missed})` : "");
  } else if (result.recovered) {
    view.history("recovered", `history recovered (${missed} missed)`);
  } else {
    view.history("lost", "history not recovered — loading the snapshot");
    recoverFromSnapshot(followed);
  }
}

async function fetchSnapshot(followed, url) {
  const target = url || `/api/sessions/${encodeURIComponent(followed.sessionId)}/state`;
  const headers = { Accept: "application/json" };
  // A private session's state is served only to the holder of its token.
  if (app.auth?.token) headers.Authorization = `Bearer ${app.auth.token}`;
  const response = await fetch(target, { headers });
  const body = await response.json().catch(() => null);
  if (!response.ok) {
    const reason = body?.error || body?.message || `HTTP ${response.status}`;
    throw new Error(`GET ${target}: ${reason}`);
  }
  return body;
}

async function recoverFromSnapshot(followed) {
  try {
    const snapshot = await fetchSnapshot(followed, followed.view.state_url);
    if (followed !== app.follow) return;
    setView(followed, applySnapshot(followed.view, snapshot));
    view.history("lost", "history not recovered — filled from the snapshot");
    scheduleRender();
    if (TERMINAL.has(snapshot.status)) showReconcile(followed, snapshot);
  } catch (error) {
    if (followed === app.follow) view.history("lost", "history not recovered, no snapshot", error.message);
  }
}

async function reconcileWithSnapshot(followed, url) {
  const ticket = ++app.reconcileTicket;
  const current = () => followed === app.follow && ticket === app.reconcileTicket;
  app.reconcileResult = { state: "checking" };
  view.reconcile(app.reconcileResult);
  try {
    const snapshot = await fetchSnapshot(followed, url);
    if (current()) showReconcile(followed, snapshot);
  } catch (error) {
    if (!current()) return;
    app.reconcileResult = { state: "error", message: error.message };
    view.reconcile(app.reconcileResult);
  }
}

function showReconcile(followed, snapshot) {
  view.render(app.run);
  const differences = reconcile(followed.view, snapshot);
  const note = followed.view.from_snapshot
    ? "Some steps were filled from the snapshot because their events were lost."
    : undefined;
  app.reconcileResult = differences.length
    ? { state: "differs", differences, snapshot }
    : { state: "in_sync", note, snapshot };
  view.reconcile(app.reconcileResult);
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
    if (body.state_url) setView(app.follow, { ...app.follow.view, state_url: body.state_url });
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
