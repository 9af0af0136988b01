// One channel, followed with pusher-js, with resume by position (docs/protocol.md,
// "Resume"). The lower layer of watchSession, for a client that follows a session
// across several runs (the dashboard does).
//
// pusher-js keeps the connection (reconnects, re-subscribes, authorizes private
// channels); the events themselves are read from the raw frames (tapPusher), because
// pusher-js drops the "position" field they carry. Wrapping pusher.send_event adds our
// last position to every pusher:subscribe of the channel, the re-subscribes pusher-js
// makes after a reconnect included.
//
// The first subscribe without a start position carries one that cannot match (epoch
// "start"): the answer tells the channel's current position, and if events were
// already published the feed re-subscribes from offset 0 of that epoch to replay them.

import type { AgentEventEnvelope } from "./envelope.js";
import { formatPosition, isReplay, parsePosition, type Position } from "./position.js";

export const RESUME_EVENT = "broadcaster:resume";
const PROBE_EPOCH = "start";

/** The part of a pusher-js client the kit uses. */
export interface Pusher {
  connection: {
    state: string;
    bind(event: string, callback: (data: any) => void): void;
    unbind(event: string, callback?: (data: any) => void): void;
  };
  subscribe(channel: string): { bind(event: string, callback: (data: any) => void): void };
  unsubscribe(channel: string): void;
  send_event(name: string, data: unknown, channel?: string): boolean;
  disconnect(): void;
}

export interface RawMessage {
  event?: unknown;
  channel?: unknown;
  data?: unknown;
  position?: unknown;
}

interface Transport {
  bind(event: string, callback: (message: { data?: unknown }) => void): void;
  unbind(event: string, callback: (message: { data?: unknown }) => void): void;
}

/**
 * Call `listener` with every raw server frame, parsed, before it loses the fields
 * pusher-js does not know (our `position` is one): it listens on the socket transport
 * of each connection pusher-js makes.
 */
export function tapPusher(pusher: Pusher, listener: (message: RawMessage) => void): () => void {
  let bound: Transport | null = null;
  const onMessage = (event: { data?: unknown }): void => {
    if (typeof event.data !== "string") return;
    let message: RawMessage;
    try {
      message = JSON.parse(event.data) as RawMessage;
    } catch {
      return;
    }
    if (!message || typeof message !== "object") return;
    if (typeof message.data === "string") {
      try {
        message.data = JSON.parse(message.data);
      } catch {
        // data that is not JSON stays a string
      }
    }
    listener(message);
  };
  const attach = (): void => {
    const manager = pusher.connection as unknown as { connection?: { transport?: Transport } | null };
    const transport = manager.connection?.transport ?? null;
    if (!transport || transport === bound) return;
    bound?.unbind("message", onMessage);
    transport.bind("message", onMessage);
    bound = transport;
  };
  pusher.connection.bind("connected", attach);
  attach();
  return () => {
    pusher.connection.unbind("connected", attach);
    bound?.unbind("message", onMessage);
  };
}

/** A resume answer as the feed reports it. */
export interface FeedResume {
  recovered: boolean;
  /** Events replayed since the subscribe. */
  missed: number;
  /** The answer to the first subscribe (not to a resubscribe after a drop). */
  initial: boolean;
  reason: string | null;
  position: string | null;
  /** The channel has never been published to (the answer to a probe). */
  empty: boolean;
}

export interface FeedHandlers {
  /** An agent event: each position at most once, in order. */
  onEnvelope(envelope: AgentEventEnvelope, position: string | null): void;
  onResume?(result: FeedResume): void;
  /** A subscribe (first, or after a reconnect) was sent; its answer will follow. */
  onSubscribe?(): void;
  /** Something the user should see (a subscription refused...). */
  onProblem?(message: string): void;
}

export class ChannelFeed {
  last: Position | null;
  readonly resumes: FeedResume[] = [];
  private fromStart: boolean;
  private accepting = false;
  private missed = 0;
  private closed = false;
  private readonly untap: () => void;
  private readonly original: Pusher["send_event"];
  private readonly wrapped: Pusher["send_event"];

  /**
   * @param pusher a connected or connecting pusher-js client.
   * @param channelName e.g. "agent.<session>" or "private-agent.<session>".
   * @param from a position to start after (POST /run answers the channel's position
   *   before the run's first event); null: replay whatever the channel keeps.
   */
  constructor(
    readonly pusher: Pusher,
    readonly channelName: string,
    private readonly handlers: FeedHandlers,
    from: string | null = null,
  ) {
    this.last = parsePosition(from);
    this.fromStart = this.last !== null;
    this.original = pusher.send_event;
    const send = pusher.send_event.bind(pusher);
    this.wrapped = (name: string, data: unknown, channel?: string): boolean => {
      const payload = data as { channel?: string } | null;
      if (name === "pusher:subscribe" && payload && payload.channel === this.channelName && !this.closed) {
        data = { ...payload, position: this.position ?? `${PROBE_EPOCH}:0` };
        this.accepting = false; // until pusher_internal:subscription_succeeded
        this.missed = 0;
        this.handlers.onSubscribe?.();
      }
      return send(name, data, channel);
    };
    pusher.send_event = this.wrapped;
    this.untap = tapPusher(pusher, (message) => this.message(message));
    this.subscribe();
  }

  /** The position to resume from, as sent on the wire. */
  get position(): string | null {
    return this.last ? formatPosition(this.last) : null;
  }

  close(): void {
    if (this.closed) return;
    this.closed = true;
    this.untap();
    this.pusher.unsubscribe(this.channelName);
    if (this.pusher.send_event === this.wrapped) this.pusher.send_event = this.original;
  }

  private subscribe(): void {
    const channel = this.pusher.subscribe(this.channelName);
    channel.bind("pusher:subscription_error", (status: { error?: string; status?: number } | undefined) => {
      const detail = status?.error ?? status?.status;
      this.handlers.onProblem?.(`subscription to ${this.channelName} refused${detail ? `: ${detail}` : ""}`);
    });
  }

  private message(message: RawMessage): void {
    if (this.closed || message.channel !== this.channelName) return;
    const event = message.event;
    if (event === "pusher_internal:subscription_succeeded") {
      this.accepting = true;
      return;
    }
    if (event === RESUME_EVENT) {
      this.resume((message.data ?? {}) as { recovered?: boolean; position?: string | null; reason?: string });
      return;
    }
    if (!this.accepting || typeof event !== "string" || !event.startsWith("agent.")) return;
    const at = typeof message.position === "string" ? message.position : null;
    if (isReplay(this.position, at)) return; // already applied (a replay overlapping what we had)
    const parsed = parsePosition(at);
    if (parsed) this.last = parsed;
    this.missed += 1;
    this.handlers.onEnvelope(message.data as AgentEventEnvelope, at);
  }

  private resume(answer: { recovered?: boolean; position?: string | null; reason?: string }): void {
    const current = parsePosition(answer.position ?? null);
    const position = answer.position ?? null;
    if (!this.last) {
      // The answer to a subscribe that knew nothing (the probe).
      if (current && current.offset > 0) {
        // Events were published before we subscribed: replay them from the start.
        this.last = { epoch: current.epoch, offset: 0 };
        this.fromStart = true;
        this.accepting = false;
        this.pusher.unsubscribe(this.channelName);
        this.subscribe();
        return;
      }
      if (current) this.last = current;
      this.report({ recovered: true, missed: 0, initial: true, reason: null, position, empty: current === null });
      return;
    }
    const initial = this.fromStart;
    this.fromStart = false;
    // A gap that cannot be filled: continue from the channel's current position.
    if (!answer.recovered && current) this.last = current;
    this.report({
      recovered: Boolean(answer.recovered),
      missed: this.missed,
      initial,
      reason: answer.reason ?? null,
      position,
      empty: false,
    });
  }

  private report(result: FeedResume): void {
    this.resumes.push(result);
    this.handlers.onResume?.(result);
  }
}
