// Following one session's run: over the Pusher protocol (pusher-js) or server-sent
// events, with resume by position (docs/protocol.md, "Resume") and, when the run ends,
// reconcile against the stored state (GET /api/sessions/{id}/state).
//
// What resume guarantees, and this module never hides: after a reconnect the server
// replays every missed event and then answers broadcaster:resume {recovered, position}.
// recovered: false means a gap it could not fill; the watcher then reloads the stored
// state and says so (state "reloaded"), rather than showing a run with a hole.

import * as PusherModule from "pusher-js";
import type { AgentEventEnvelope } from "./envelope.js";
import { ChannelFeed, RESUME_EVENT, type Pusher } from "./feed.js";
import { parsePosition } from "./position.js";
import {
  TERMINAL,
  createRunView,
  reconcile,
  type Difference,
  type RunView,
  type StateSnapshot,
} from "./run.js";
import { applySessionSnapshot, createSessionView, latestRun, reduceSession, type SessionView } from "./session.js";

type PusherConstructor = new (key: string, options: Record<string, unknown>) => Pusher;
const PusherClass = ((PusherModule as unknown as { default?: PusherConstructor }).default ??
  PusherModule) as unknown as PusherConstructor;


/**
 * "connecting": not yet subscribed. "live": following the run. "reconnecting": the
 * connection dropped; it resumes from `position`. "recovered": resumed after a drop with
 * nothing lost. "reloaded": the server could not fill a gap; the view was reloaded from
 * the stored state (steps marked from_snapshot). "ended": the run ended and was
 * reconciled. "failed": see `error`. "closed": close() was called.
 */
export type ConnectionState =
  | "connecting"
  | "live"
  | "reconnecting"
  | "recovered"
  | "reloaded"
  | "ended"
  | "failed"
  | "closed";

export interface ResumeAnswer {
  recovered: boolean;
  position: string | null;
  reason: string | null;
  /** Events replayed before the answer. */
  missed: number;
}

export interface WatchStatus {
  /** The run followed: the session's latest run (an empty view before any). */
  view: RunView;
  /** Every run the watch saw on the session, apart, oldest first (`view` is the last). */
  session: SessionView;
  state: ConnectionState;
  error: string | null;
  resumes: ResumeAnswer[];
  /** The stored state fetched when the run ended (or when a gap was reloaded). */
  snapshot: StateSnapshot | null;
  /** reconcile(view, snapshot) when the run ended; null before. */
  differences: Difference[] | null;
}

export interface SessionWatch {
  /** The latest status (a new object after every change). */
  readonly current: WatchStatus;
  /** Call `listener` after every change; returns the unsubscribe function. */
  subscribe(listener: (status: WatchStatus) => void): () => void;
  /** Resolves when the run ended and was reconciled, or the watch failed or closed. */
  readonly done: Promise<WatchStatus>;
  close(): void;
}

export class WatchError extends Error {
  override name = "WatchError";
}

export interface WatchOptions {
  sessionId: string;
  /** The server's base URL (http[s]://host:port): state endpoint, auth, and the socket. */
  url?: string;
  /** An existing pusher-js client (its host is used as is); else one is made from url + key. */
  pusher?: Pusher;
  /** The app key; with only `url`, read from GET /api/demo/config. */
  key?: string;
  /** The position to start after (POST /run answers it); else the whole channel history. */
  since?: string | null;
  /** A private session's token: subscribes to private-agent.<id>. */
  token?: string | null;
  /** Where private channels are authorized (default `${url}/broadcasting/auth`). */
  authEndpoint?: string;
  /** Reconcile when the run ends (default true; needs `url`). */
  reconcile?: boolean;
  fetch?: typeof fetch;
}

/** The state every transport shares: the view, the connection state, reconcile. */
class Watch implements SessionWatch {
  current: WatchStatus;
  readonly done: Promise<WatchStatus>;
  private listeners = new Set<(status: WatchStatus) => void>();
  private resolve!: (status: WatchStatus) => void;
  private finished = false;
  private reconciling = false;
  /** A subscribe was sent and its broadcaster:resume has not come yet. */
  awaitingAnswer = false;
  private endPending = false;
  onClose: () => void = () => {};

  constructor(
    readonly sessionId: string,
    private readonly stateUrl: string | null,
    private readonly headers: Record<string, string>,
    private readonly fetcher: typeof fetch | null,
  ) {
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

  subscribe(listener: (status: WatchStatus) => void): () => void {
    this.listeners.add(listener);
    return () => this.listeners.delete(listener);
  }

  update(change: Partial<WatchStatus>): void {
    if (this.finished && change.state === undefined && change.view === undefined) return;
    this.current = { ...this.current, ...change };
    for (const listener of this.listeners) listener(this.current);
  }

  envelope(envelope: AgentEventEnvelope, position: string | null): void {
    if (this.finished) return;
    const session = reduceSession(this.current.session, envelope, position);
    if (session === this.current.session) return;
    this.update({ session, view: latestRun(session) ?? this.current.view });
    if (envelope.type !== "agent.status") return;
    if (envelope.payload.parent_execution_id != null) return; // a nested run's end is not the run's
    if (!TERMINAL.has(envelope.payload.status)) {
      // A later run of the session began (in a replay, after an earlier run's end):
      // the watch follows it to its own end.
      this.endPending = false;
      return;
    }
    // A run that ends within a replay ends once the resume answer came, so the answer
    // (recovered or not) is always reported.
    if (this.awaitingAnswer) this.endPending = true;
    else void this.end();
  }

  resumed(answer: ResumeAnswer, afterDrop: boolean): void {
    this.awaitingAnswer = false;
    this.update({ resumes: [...this.current.resumes, answer] });
    if (!answer.recovered) {
      void this.reload(answer).then(() => {
        if (this.endPending) void this.end();
      });
      return;
    }
    if (this.current.state === "connecting" || this.current.state === "reconnecting") {
      this.update({ state: afterDrop ? "recovered" : "live" });
    }
    if (this.endPending) void this.end();
  }

  live(): void {
    if (this.current.state === "connecting") this.update({ state: "live" });
  }

  dropped(): void {
    if (this.finished) return;
    if (this.current.state !== "connecting") this.update({ state: "reconnecting" });
  }

  fail(message: string): void {
    if (this.finished) return;
    this.finished = true;
    this.update({ state: "failed", error: message });
    this.onClose();
    this.resolve(this.current);
  }

  close(): void {
    if (this.finished) return;
    this.finished = true;
    this.onClose();
    this.update({ state: "closed" });
    this.resolve(this.current);
  }

  async fetchState(): Promise<StateSnapshot | null> {
    if (!this.stateUrl || !this.fetcher) return null;
    const response = await this.fetcher(this.stateUrl, { headers: { Accept: "application/json", ...this.headers } });
    const body = (await response.json().catch(() => null)) as Record<string, unknown> | null;
    if (response.status === 404) return null;
    if (!response.ok) {
      throw new WatchError(`GET ${this.stateUrl} answered ${response.status}: ${String(body?.error ?? "")}`);
    }
    return body as StateSnapshot;
  }

  /** A gap the server could not fill: reload the view from the stored state, and say so. */
  private async reload(answer: ResumeAnswer): Promise<void> {
    try {
      const snapshot = await this.fetchState();
      if (this.finished) return;
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
      if (TERMINAL.has(snapshot.status)) this.finish(snapshot);
    } catch (error) {
      this.fail(`history not recovered and the state could not be read: ${(error as Error).message}`);
    }
  }

  private async end(): Promise<void> {
    if (this.reconciling) return;
    this.reconciling = true;
    try {
      const snapshot = this.stateUrl && this.fetcher ? await this.fetchState() : null;
      if (snapshot === null) {
        this.finish(null);
        return;
      }
      this.finish(snapshot);
    } catch (error) {
      this.update({ error: (error as Error).message });
      this.finish(null);
    }
  }

  private finish(snapshot: StateSnapshot | null): void {
    if (this.finished) return;
    this.finished = true;
    const differences = snapshot ? reconcile(this.current.view, snapshot) : null;
    this.update({ snapshot, differences, state: "ended" });
    this.onClose();
    this.resolve(this.current);
  }
}

function checkOptions(options: WatchOptions): void {
  if (!options.sessionId || !/^[A-Za-z0-9_\-=@,.;]{1,128}$/.test(options.sessionId)) {
    throw new WatchError(`invalid session id ${JSON.stringify(options.sessionId)}: 1-128 of A-Z a-z 0-9 _ - = @ , . ;`);
  }
  if (options.since != null && parsePosition(options.since) === null) {
    throw new WatchError(`since ${JSON.stringify(options.since)} is not a position "<epoch>:<offset>"`);
  }
}

function baseUrl(url: string | undefined): string | null {
  return url ? url.replace(/\/+$/, "") : null;
}

function stateUrlOf(options: WatchOptions): string | null {
  const base = baseUrl(options.url);
  if (!base || options.reconcile === false) return null;
  return `${base}/api/sessions/${encodeURIComponent(options.sessionId)}/state`;
}

function tokenHeaders(token: string | null | undefined): Record<string, string> {
  return token ? { Authorization: `Bearer ${token}` } : {};
}

async function appKey(options: WatchOptions, fetcher: typeof fetch): Promise<string> {
  if (options.key) return options.key;
  const base = baseUrl(options.url);
  const response = await fetcher(`${base}/api/demo/config`, { headers: { Accept: "application/json" } });
  if (!response.ok) throw new WatchError(`no key given and GET ${base}/api/demo/config answered ${response.status}`);
  const config = (await response.json()) as { app_key?: string };
  if (!config.app_key) throw new WatchError(`no key given and ${base}/api/demo/config names none`);
  return config.app_key;
}

function makePusher(options: WatchOptions, key: string, fetcher: typeof fetch): Pusher {
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
      customHandler: (
        { socketId, channelName }: { socketId: string; channelName: string },
        callback: (error: Error | null, data: { auth: string } | null) => void,
      ) => {
        const body = new URLSearchParams({ socket_id: socketId, channel_name: channelName });
        if (options.token) body.set("session_token", options.token);
        fetcher(endpoint, { method: "POST", body })
          .then(async (response) => {
            const data = (await response.json().catch(() => ({}))) as { auth?: string; error?: string };
            if (!response.ok || !data.auth) throw new WatchError(data.error ?? `auth answered ${response.status}`);
            callback(null, { auth: data.auth });
          })
          .catch((error: Error) => callback(error, null));
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
export function watchSession(options: WatchOptions): SessionWatch {
  checkOptions(options);
  if (!options.pusher && !options.url) throw new WatchError("watchSession needs `pusher` or `url`");
  const fetcher = options.fetch ?? (globalThis.fetch ? globalThis.fetch.bind(globalThis) : null);
  const watch = new Watch(options.sessionId, stateUrlOf(options), tokenHeaders(options.token), fetcher);
  const channelName = `${options.token ? "private-" : ""}agent.${options.sessionId}`;
  let feed: ChannelFeed | null = null;
  let everLive = false;
  let owned: Pusher | null = null;

  const start = (client: Pusher): void => {
    feed = new ChannelFeed(
      client,
      channelName,
      {
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
      },
      options.since ?? null,
    );
    client.connection.bind("state_change", ({ current }: { current: string }) => {
      if (current === "connected") return;
      if (current === "failed") watch.fail("the server cannot be reached over WebSockets");
      else watch.dropped();
    });
  };

  watch.onClose = () => {
    feed?.close();
    owned?.disconnect();
  };

  if (options.pusher) {
    start(options.pusher);
  } else {
    const fetcher2 = fetcher ?? ((() => Promise.reject(new WatchError("no fetch available"))) as unknown as typeof fetch);
    appKey(options, fetcher2)
      .then((key) => {
        if (watch.current.state !== "connecting") return;
        const client = makePusher(options, key, fetcher2);
        owned = client;
        // A server that never answers is "unavailable" after pusher-js' timeouts.
        client.connection.bind("unavailable", () => {
          if (!everLive) watch.fail(`cannot connect to ${options.url}`);
        });
        start(client);
      })
      .catch((error: Error) => watch.fail(`cannot connect to ${options.url}: ${error.message}`));
  }
  return watch;
}

/** The EventSource a runtime offers (a browser's, or a package's under Node). */
export interface EventSourceLike {
  readyState: number;
  addEventListener(type: string, listener: (event: { data?: string; lastEventId?: string }) => void): void;
  close(): void;
  onerror: ((event: unknown) => void) | null;
  onopen: ((event: unknown) => void) | null;
}

export interface SseWatchOptions extends Omit<WatchOptions, "pusher" | "key" | "authEndpoint"> {
  url: string;
  EventSource?: new (url: string) => EventSourceLike;
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
export function watchSessionSse(options: SseWatchOptions): SessionWatch {
  checkOptions(options);
  const Source = options.EventSource ?? (globalThis as { EventSource?: new (url: string) => EventSourceLike }).EventSource;
  if (!Source) throw new WatchError("no EventSource in this runtime: pass options.EventSource");
  const fetcher = options.fetch ?? (globalThis.fetch ? globalThis.fetch.bind(globalThis) : null);
  const watch = new Watch(options.sessionId, stateUrlOf(options), tokenHeaders(options.token), fetcher);
  const query = new URLSearchParams();
  if (options.since) query.set("since", options.since);
  if (options.token) query.set("token", options.token);
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
    if (!options.since && !dropped) watch.live();
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
      watch.envelope(JSON.parse(event.data ?? "null") as AgentEventEnvelope, event.lastEventId || null);
    });
  }
  source.addEventListener(RESUME_EVENT, (event) => {
    const answer = JSON.parse(event.data ?? "{}") as { recovered?: boolean; position?: string | null; reason?: string };
    watch.resumed(
      { recovered: Boolean(answer.recovered), position: answer.position ?? null, reason: answer.reason ?? null, missed },
      dropped,
    );
  });
  watch.onClose = () => source.close();
  return watch;
}
