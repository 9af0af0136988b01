// Built from clients/js (@agent-broadcaster/client) by `npm run build && npm run vendor`; do not edit.
// @agent-broadcaster/client: follow agent runs published by agent-broadcaster.
export { formatPosition, isReplay, parsePosition } from "./position.js";
export { STAGES, TERMINAL, applySnapshot, createRunView, finalText, isRunEnvelope, reconcile, reduceRun, reduceRunAll, } from "./run.js";
export { applySessionSnapshot, createSessionView, latestRun, reduceSession, runOf, } from "./session.js";
export { ChannelFeed, RESUME_EVENT, tapPusher, } from "./feed.js";
export { WatchError, watchSession, watchSessionSse, } from "./watch.js";
