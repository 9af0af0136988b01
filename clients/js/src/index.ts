// @agent-broadcaster/client: follow agent runs published by agent-broadcaster.

export type * from "./envelope.js";
export { formatPosition, isReplay, parsePosition, type Position } from "./position.js";
export {
  STAGES,
  TERMINAL,
  applySnapshot,
  createRunView,
  finalText,
  isRunEnvelope,
  reconcile,
  reduceRun,
  reduceRunAll,
  type CompletedView,
  type PositionedEnvelope,
  type Difference,
  type RunView,
  type StageView,
  type StateSnapshot,
  type StepView,
  type ToolView,
  type Usage,
} from "./run.js";
export {
  applySessionSnapshot,
  createSessionView,
  latestRun,
  reduceSession,
  runOf,
  type SessionView,
} from "./session.js";
export {
  ChannelFeed,
  RESUME_EVENT,
  tapPusher,
  type FeedHandlers,
  type FeedResume,
  type Pusher,
  type RawMessage,
} from "./feed.js";
export {
  WatchError,
  watchSession,
  watchSessionSse,
  type ConnectionState,
  type EventSourceLike,
  type ResumeAnswer,
  type SessionWatch,
  type SseWatchOptions,
  type WatchOptions,
  type WatchStatus,
} from "./watch.js";
