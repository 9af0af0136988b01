// Built from clients/js (@agent-broadcaster/client) by `npm run build && npm run vendor`; do not edit.
// Following one session's run: over the Pusher protocol (pusher-js) or server-sent
// events, with resume by position (docs/protocol.md, "Resume") and, when the run ends,
// reconcile against the stored state (GET /api/sessions/{id}/state).
//
// What resume guarantees, and this module never hides: after a reconnect the server
// replays every missed event and then answers broadcaster:resume {recovered, position}.
// recovered: false means a gap it could not fill; the watcher then reloads the stored
// state and says so (state "reloaded"), rather than showing a run with a hole.
import * as PusherModule from "pusher-js";
import { ChannelFeed, RESUME_EVENT } from "./feed.js";
import { parsePosition } from "./position.js";
import { TERMINAL, createRunView, reconcile, } from "./run.js";
import { applySessionSnapshot, createSessionView, latestRun, reduceSession } from "./session.js";
const PusherClass = (PusherModule.default ??
    PusherModule);
export class WatchError extends Error {
    name = "WatchError";
}
/** The state every transport shares: the view, the connection state, reconcile. */
class Watch {
    sessionId;
    stateUrl;
    headers;
    fetcher;
    current;
    done;
    listeners = new Set();
    resolve;
    finished = false;
    reconciling = false;
    /** A subscribe was sent and its broadcaster:resume has not come yet. */
    awaitingAnswer = false;
    endPending = false;
    onClose = () => { };
    constructor(sessionId, stateUrl, headers, fetcher) {
        this.sessionId = sessionId;
        this.stateUrl = stateUrl;
        this.headers = headers;
        this.fetcher = fetcher;
        this.current = {
            view: createRunView(sessionId),
            session: createSessionView(sessionId),
            state: "connecting",
            error: null,
            resumes: [],
            snapshot: null,
            differences: null,
        };
        this.done = new Promise((resolve) => (this.resolve = resolve));
    }
    subscribe(listener) {
        this.listeners.add(listener);
        return () => this.listeners.delete(listener);
    }
    update(change) {
        if (this.finished && change.state === undefined && change.view === undefined)
            return;
        this.current = { ...this.current, ...change };
        for (const listener of this.listeners)
            listener(this.current);
    }
    envelope(envelope, position) {
        if (this.finished)
            return;
        const session = reduceSession(this.current.session, envelope, position);
        if (session === this.current.session)
            return;
        this.update({ session, view: latestRun(session) ?? this.current.view });
        if (envelope.type !== "agent.status")
            return;
        if (envelope.payload.parent_execution_id != null)
            return; // a nested run's end is not the run's
        if (!TERMINAL.has(envelope.payload.status)) {
            // A later run of the session began (in a replay, after an earlier run's end):
            // the watch follows it to its own end.
            this.endPending = false;
            return;
        }
        // A run that ends within a replay ends once the resume answer came, so the answer
        // (recovered or not) is always reported.
        if (this.awaitingAnswer)
            this.endPending = true;
        else
            void this.end();
    }
    resumed(answer, afterDrop) {
        this.awaitingAnswer = false;
        this.update({ resumes: [...this.current.resumes, answer] });
        if (!answer.recovered) {
            void this.reload(answer).then(() => {
                if (this.endPending)
                    void this.end();
            });
            return;
        }
        if (this.current.state === "connecting" || this.current.state === "reconnecting") {
            this.update({ state: afterDrop ? "recovered" : "live" });
        }
        if (this.endPending)
            void this.end();
    }
    live() {
        if (this.current.state === "connecting")
            this.update({ state: "live" });
    }
    dropped() {
        if (this.finished)
            return;
        if (this.current.state !== "connecting")
            this.update({ state: "reconnecting" });
    }
    fail(message) {
        if (this.finished)
            return;
        this.finished = true;
        this.update({ state: "failed", error: message });
        this.onClose();
        this.resolve(this.current);
    }
    close() {
        if (this.finished)
            return;
        this.finished = true;
        this.onClose();
        this.update({ state: "closed" });
        this.resolve(this.current);
    }
    async fetchState() {
        if (!this.stateUrl || !this.fetcher)
            return null;
        const response = await this.fetcher(this.stateUrl, { headers: { Accept: "application/json", ...this.headers } });
        const body = (await response.json().catch(() => null));
        if (response.status === 404)
            return null;
        if (!response.ok) {
            throw new WatchError(`GET ${this.stateUrl} answered ${response.status}: ${String(body?.error ?? "")}`);
        }
        return body;
    }
    /** A gap the server could not fill: reload the view from the stored state, and say so. */
    async reload(answer) {
        try {
            const snapshot = await this.fetchState();
            if (this.finished)
                return;
            if (snapshot === null) {
                if (answer.position === null && this.current.view.event_count === 0) {
                    this.fail(`unknown session ${JSON.stringify(this.sessionId)}: no events and no stored state`);
                    return;
                }
                // Nothing stored yet (the run is in progress): the gap stays, and is told.
                this.update({ state: "reloaded", error: `history not recovered (${answer.reason ?? "gap"}) and no state stored yet` });
                return;
            }
            const session = applySessionSnapshot(this.current.session, snapshot);
            this.update({ session, view: latestRun(session) ?? this.current.view, snapshot, state: "reloaded" });
            if (TERMINAL.has(snapshot.status))
                this.finish(snapshot);
        }
        catch (error) {
            this.fail(`history not recovered and the state could not be read: ${error.message}`);
        }
    }
    async end() {
        if (this.reconciling)
            return;
        this.reconciling = true;
        try {
            const snapshot = this.stateUrl && this.fetcher ? await this.fetchState() : null;
            if (snapshot === null) {
                this.finish(null);
                return;
            }
            this.finish(snapshot);
        }
        catch (error) {
            this.update({ error: error.message });
            this.finish(null);
        }
    }
    finish(snapshot) {
        if (this.finished)
            return;
        this.finished = true;
        const differences = snapshot ? reconcile(this.current.view, snapshot) : null;
        this.update({ snapshot, differences, state: "ended" });
        this.onClose();
        this.resolve(this.current);
    }
}
function checkOptions(options) {
    if (!options.sessionId || !/^[A-Za-z0-9_\-=@,.;]{1,128}$/.test(options.sessionId)) {
        throw new WatchError(`invalid session id ${JSON.stringify(options.sessionId)}: 1-128 of A-Z a-z 0-9 _ - = @ , . ;`);
    }
    if (options.since != null && parsePosition(options.since) === null) {
        throw new WatchError(`since ${JSON.stringify(options.since)} is not a position "<epoch>:<offset>"`);
    }
}
function baseUrl(url) {
    return url ? url.replace(/\/+$/, "") : null;
}
function stateUrlOf(options) {
    const base = baseUrl(options.url);
    if (!base || options.reconcile === false)
        return null;
    return `${base}/api/sessions/${encodeURIComponent(options.sessionId)}/state`;
}
function tokenHeaders(token) {
    return token ? { Authorization: `Bearer ${token}` } : {};
}
async function appKey(options, fetcher) {
    if (options.key)
        return options.key;
    const base = baseUrl(options.url);
    const response = await fetcher(`${base}/api/demo/config`, { headers: { Accept: "application/json" } });
    if (!response.ok)
        throw new WatchError(`no key given and GET ${base}/api/demo/config answered ${response.status}`);
    const config = (await response.json());
    if (!config.app_key)
        throw new WatchError(`no key given and ${base}/api/demo/config names none`);
    return config.app_key;
}
function makePusher(options, key, fetcher) {
    const target = new URL(baseUrl(options.url) ?? "");
    const secure = target.protocol === "https:";
    const port = Number(target.port) || (secure ? 443 : 80);
    const endpoint = options.authEndpoint ?? `${baseUrl(options.url)}/broadcasting/auth`;
    return new PusherClass(key, {
        cluster: "local", // required by pusher-js; unused with wsHost
        wsHost: target.hostname,
        wsPort: port,
        wssPort: port,
        forceTLS: secure,
        enabledTransports: secure ? ["wss"] : ["ws"],
        disableStats: true,
        channelAuthorization: {
            endpoint,
            transport: "ajax",
            customHandler: ({ socketId, channelName }, callback) => {
                const body = new URLSearchParams({ socket_id: socketId, channel_name: channelName });
                if (options.token)
                    body.set("session_token", options.token);
                fetcher(endpoint, { method: "POST", body })
                    .then(async (response) => {
                    const data = (await response.json().catch(() => ({})));
                    if (!response.ok || !data.auth)
                        throw new WatchError(data.error ?? `auth answered ${response.status}`);
                    callback(null, { auth: data.auth });
                })
                    .catch((error) => callback(error, null));
            },
        },
    });
}
/**
 * Follow a session's run over the Pusher protocol, resuming by position.
 *
 * Raises WatchError at once for an invalid session id or `since`; an unknown session,
 * a refused token or an unreachable server end the watch with state "failed" and an
 * `error` that says why (never a hang).
 */
export function watchSession(options) {
    checkOptions(options);
    if (!options.pusher && !options.url)
        throw new WatchError("watchSession needs `pusher` or `url`");
    const fetcher = options.fetch ?? (globalThis.fetch ? globalThis.fetch.bind(globalThis) : null);
    const watch = new Watch(options.sessionId, stateUrlOf(options), tokenHeaders(options.token), fetcher);
    const channelName = `${options.token ? "private-" : ""}agent.${options.sessionId}`;
    let feed = null;
    let everLive = false;
    let owned = null;
    const start = (client) => {
        feed = new ChannelFeed(client, channelName, {
            onEnvelope: (envelope, position) => watch.envelope(envelope, position),
            onSubscribe: () => {
                watch.awaitingAnswer = true;
            },
            onResume: (result) => {
                everLive = true;
                // A channel never published to is an unknown session, unless a state is stored.
                const recovered = result.recovered && !result.empty;
                watch.resumed({ recovered, position: result.position, reason: result.reason, missed: result.missed }, !result.initial);
            },
            onProblem: (message) => watch.fail(message),
        }, options.since ?? null);
        client.connection.bind("state_change", ({ current }) => {
            if (current === "connected")
                return;
            if (current === "failed")
                watch.fail("the server cannot be reached over WebSockets");
            else
                watch.dropped();
        });
    };
    watch.onClose = () => {
        feed?.close();
        owned?.disconnect();
    };
    if (options.pusher) {
        start(options.pusher);
    }
    else {
        const fetcher2 = fetcher ?? (() => Promise.reject(new WatchError("no fetch available")));
        appKey(options, fetcher2)
            .then((key) => {
            if (watch.current.state !== "connecting")
                return;
            const client = makePusher(options, key, fetcher2);
            owned = client;
            // A server that never answers is "unavailable" after pusher-js' timeouts.
            client.connection.bind("unavailable", () => {
                if (!everLive)
                    watch.fail(`cannot connect to ${options.url}`);
            });
            start(client);
        })
            .catch((error) => watch.fail(`cannot connect to ${options.url}: ${error.message}`));
    }
    return watch;
}
const ENVELOPE_TYPES = [
    "agent.status",
    "agent.step.started",
    "agent.step.completed",
    "agent.tool.started",
    "agent.tool.completed",
    "agent.stream.chunk",
    "agent.continuation",
];
/**
 * Follow a session over server-sent events (GET /api/sessions/{id}/events), where
 * WebSockets are not available. EventSource resumes with Last-Event-ID by itself; the
 * server's broadcaster:resume event tells whether the history reached back.
 */
export function watchSessionSse(options) {
    checkOptions(options);
    const Source = options.EventSource ?? globalThis.EventSource;
    if (!Source)
        throw new WatchError("no EventSource in this runtime: pass options.EventSource");
    const fetcher = options.fetch ?? (globalThis.fetch ? globalThis.fetch.bind(globalThis) : null);
    const watch = new Watch(options.sessionId, stateUrlOf(options), tokenHeaders(options.token), fetcher);
    const query = new URLSearchParams();
    if (options.since)
        query.set("since", options.since);
    if (options.token)
        query.set("token", options.token);
    const base = baseUrl(options.url);
    const url = `${base}/api/sessions/${encodeURIComponent(options.sessionId)}/events${query.size ? `?${query}` : ""}`;
    const source = new Source(url);
    let opened = false;
    let dropped = false;
    let missed = 0;
    source.onopen = () => {
        opened = true;
        missed = 0;
        // Without `since` (and before any drop) the server sends no resume answer.
        if (!options.since && !dropped)
            watch.live();
    };
    source.onerror = () => {
        if (source.readyState === 2) {
            watch.fail(opened ? `the stream of ${options.sessionId} was closed by the server` : `GET ${url} was refused (bad since, unknown or private session, or server down)`);
            return;
        }
        dropped = opened;
        watch.dropped();
    };
    for (const type of ENVELOPE_TYPES) {
        source.addEventListener(type, (event) => {
            missed += 1;
            watch.envelope(JSON.parse(event.data ?? "null"), event.lastEventId || null);
        });
    }
    source.addEventListener(RESUME_EVENT, (event) => {
        const answer = JSON.parse(event.data ?? "{}");
        watch.resumed({ recovered: Boolean(answer.recovered), position: answer.position ?? null, reason: answer.reason ?? null, missed }, dropped);
    });
    watch.onClose = () => source.close();
    return watch;
}
