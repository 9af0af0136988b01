// One agent channel, followed with pusher-js, with resume by position.
//
// pusher-js keeps the connection (reconnects, re-subscribes, authorizes private
// channels); the events themselves are read from the raw frames (wire-tap.js), because
// pusher-js drops the "position" field they carry.
//
// The server (our extension of the Pusher protocol) stamps each channel event with
// "position": "<epoch>:<offset>" and, when a pusher:subscribe carries data.position,
// replays every missed event in order and then sends broadcaster:resume
// {recovered, position, reason?}. pusher-js re-subscribes by itself after a reconnect;
// wrapping pusher.send_event adds our last position to that subscribe.
//
// The first subscribe carries a position that cannot match (epoch "start"): the answer
// tells the channel's current position, and if events were already published (the run
// started before we subscribed, or we attach to an existing session) the feed
// re-subscribes from offset 0 of that epoch to replay them all.

import { onRawMessage } from "./wire-tap.js";

export const RESUME_EVENT = "broadcaster:resume";
const PROBE_EPOCH = "start";

/** Parse "<epoch>:<offset>" (the epoch may itself contain ":"). */
export function parsePosition(text) {
  if (typeof text !== "string") return null;
  const cut = text.lastIndexOf(":");
  const offset = Number(text.slice(cut + 1));
  if (cut <= 0 || !Number.isInteger(offset) || offset < 0) return null;
  return { epoch: text.slice(0, cut), offset };
}

export class ChannelFeed {
  /**
   * @param {object} pusher a connected or connecting Pusher instance.
   * @param {string} channelName e.g. "agent.<session>" or "private-agent.<session>".
   * @param {object} handlers
   *   onEnvelope(envelope, position): an agent event, each position at most once, in order.
   *   onResume({recovered, missed, reason, position, initial}): a resume answer.
   *   onProblem(message): something the user should see (subscription refused...).
   * @param {string|null} from a position to start after (POST /run gives the channel's
   *   position before the run's first event); null: replay whatever the channel keeps.
   */
  constructor(pusher, channelName, handlers, from = null) {
    this.pusher = pusher;
    this.channelName = channelName;
    this.handlers = handlers;
    this.last = parsePosition(from); // {epoch, offset} of the last event applied
    this.fromStart = this.last !== null; // the first answer replays from the start
    this.accepting = false; // false between an unsubscribe and the next subscription
    this.missed = 0; // events replayed since the last subscribe
    this.resumes = [];
    this.closed = false;
    this._wrapSendEvent();
    this._untap = onRawMessage((message) => this._message(message));
    this._subscribe();
  }

  /** The position to resume from, as sent on the wire. */
  get position() {
    return this.last ? `${this.last.epoch}:${this.last.offset}` : null;
  }

  close() {
    this.closed = true;
    this._untap();
    this.pusher.unsubscribe(this.channelName);
    if (this.pusher.send_event === this._wrapped) this.pusher.send_event = this._original;
  }

  _wrapSendEvent() {
    const original = this.pusher.send_event.bind(this.pusher);
    this._original = this.pusher.send_event;
    this._wrapped = (name, data, channel) => {
      if (name === "pusher:subscribe" && data && data.channel === this.channelName && !this.closed) {
        data = { ...data, position: this.position || `${PROBE_EPOCH}:0` };
        this.accepting = false; // until pusher_internal:subscription_succeeded
        this.missed = 0;
      }
      return original(name, data, channel);
    };
    this.pusher.send_event = this._wrapped;
  }

  _subscribe() {
    const channel = this.pusher.subscribe(this.channelName);
    channel.bind("pusher:subscription_error", (status) => {
      const detail = status && (status.error || status.status);
      this.handlers.onProblem?.(`subscription to ${this.channelName} refused${detail ? `: ${detail}` : ""}`);
    });
    return channel;
  }

  _message(message) {
    if (this.closed || !message || message.channel !== this.channelName) return;
    const event = message.event;
    if (event === "pusher_internal:subscription_succeeded") {
      this.accepting = true;
      return;
    }
    if (event === RESUME_EVENT) {
      this._resume(message.data || {});
      return;
    }
    if (!this.accepting || typeof event !== "string" || !event.startsWith("agent.")) return;
    const position = parsePosition(message.position);
    if (position && this.last && position.epoch === this.last.epoch && position.offset <= this.last.offset) {
      return; // already applied (a replay overlapping what we had)
    }
    if (position) this.last = position;
    this.missed += 1;
    const envelope = typeof message.data === "string" ? JSON.parse(message.data) : message.data;
    this.handlers.onEnvelope(envelope, message.position ?? null);
  }

  _resume(answer) {
    const current = parsePosition(answer.position);
    if (!this.last) {
      // The answer to a subscribe that knew nothing (the probe).
      if (current && current.offset > 0) {
        // Events were published before we subscribed: replay them from the start.
        this.last = { epoch: current.epoch, offset: 0 };
        this.fromStart = true;
        this._resubscribe();
        return;
      }
      if (current) this.last = current;
      this._report({ recovered: true, missed: 0, initial: true, reason: null, position: answer.position });
      return;
    }
    const initial = this.fromStart;
    this.fromStart = false;
    if (!answer.recovered && current) {
      // The gap cannot be filled: continue from the channel's current position; the
      // page reloads the state snapshot for what was lost.
      this.last = current;
    }
    this._report({
      recovered: Boolean(answer.recovered),
      missed: this.missed,
      initial,
      reason: answer.reason ?? null,
      position: answer.position,
    });
  }

  _report(result) {
    this.resumes.push(result);
    this.handlers.onResume?.(result);
  }

  _resubscribe() {
    this.accepting = false;
    this.pusher.unsubscribe(this.channelName);
    this._subscribe();
  }
}
