// Built from clients/js (@agent-broadcaster/client) by `npm run build && npm run vendor`; do not edit.
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
import { formatPosition, isReplay, parsePosition } from "./position.js";
export const RESUME_EVENT = "broadcaster:resume";
const PROBE_EPOCH = "start";
/**
 * Call `listener` with every raw server frame, parsed, before it loses the fields
 * pusher-js does not know (our `position` is one): it listens on the socket transport
 * of each connection pusher-js makes.
 */
export function tapPusher(pusher, listener) {
    let bound = null;
    const onMessage = (event) => {
        if (typeof event.data !== "string")
            return;
        let message;
        try {
            message = JSON.parse(event.data);
        }
        catch {
            return;
        }
        if (!message || typeof message !== "object")
            return;
        if (typeof message.data === "string") {
            try {
                message.data = JSON.parse(message.data);
            }
            catch {
                // data that is not JSON stays a string
            }
        }
        listener(message);
    };
    const attach = () => {
        const manager = pusher.connection;
        const transport = manager.connection?.transport ?? null;
        if (!transport || transport === bound)
            return;
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
export class ChannelFeed {
    pusher;
    channelName;
    handlers;
    last;
    resumes = [];
    fromStart;
    accepting = false;
    missed = 0;
    closed = false;
    untap;
    original;
    wrapped;
    /**
     * @param pusher a connected or connecting pusher-js client.
     * @param channelName e.g. "agent.<session>" or "private-agent.<session>".
     * @param from a position to start after (POST /run answers the channel's position
     *   before the run's first event); null: replay whatever the channel keeps.
     */
    constructor(pusher, channelName, handlers, from = null) {
        this.pusher = pusher;
        this.channelName = channelName;
        this.handlers = handlers;
        this.last = parsePosition(from);
        this.fromStart = this.last !== null;
        this.original = pusher.send_event;
        const send = pusher.send_event.bind(pusher);
        this.wrapped = (name, data, channel) => {
            const payload = data;
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
    get position() {
        return this.last ? formatPosition(this.last) : null;
    }
    close() {
        if (this.closed)
            return;
        this.closed = true;
        this.untap();
        this.pusher.unsubscribe(this.channelName);
        if (this.pusher.send_event === this.wrapped)
            this.pusher.send_event = this.original;
    }
    subscribe() {
        const channel = this.pusher.subscribe(this.channelName);
        channel.bind("pusher:subscription_error", (status) => {
            const detail = status?.error ?? status?.status;
            this.handlers.onProblem?.(`subscription to ${this.channelName} refused${detail ? `: ${detail}` : ""}`);
        });
    }
    message(message) {
        if (this.closed || message.channel !== this.channelName)
            return;
        const event = message.event;
        if (event === "pusher_internal:subscription_succeeded") {
            this.accepting = true;
            return;
        }
        if (event === RESUME_EVENT) {
            this.resume((message.data ?? {}));
            return;
        }
        if (!this.accepting || typeof event !== "string" || !event.startsWith("agent."))
            return;
        const at = typeof message.position === "string" ? message.position : null;
        if (isReplay(this.position, at))
            return; // already applied (a replay overlapping what we had)
        const parsed = parsePosition(at);
        if (parsed)
            this.last = parsed;
        this.missed += 1;
        this.handlers.onEnvelope(message.data, at);
    }
    resume(answer) {
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
            if (current)
                this.last = current;
            this.report({ recovered: true, missed: 0, initial: true, reason: null, position, empty: current === null });
            return;
        }
        const initial = this.fromStart;
        this.fromStart = false;
        // A gap that cannot be filled: continue from the channel's current position.
        if (!answer.recovered && current)
            this.last = current;
        this.report({
            recovered: Boolean(answer.recovered),
            missed: this.missed,
            initial,
            reason: answer.reason ?? null,
            position,
            empty: false,
        });
    }
    report(result) {
        this.resumes.push(result);
        this.handlers.onResume?.(result);
    }
}
