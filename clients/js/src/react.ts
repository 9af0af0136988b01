// useAgentSession: a React hook over watchSession (or watchSessionSse).

import { useEffect, useState } from "react";
import { createRunView } from "./run.js";
import { createSessionView } from "./session.js";
import {
  watchSession,
  watchSessionSse,
  type SessionWatch,
  type SseWatchOptions,
  type WatchOptions,
  type WatchStatus,
} from "./watch.js";

export interface AgentSessionOptions extends Omit<WatchOptions, "sessionId"> {
  /** "pusher" (default) or "sse". */
  transport?: "pusher" | "sse";
  EventSource?: SseWatchOptions["EventSource"];
}

function idle(sessionId: string | null): WatchStatus {
  return { view: createRunView(sessionId), session: createSessionView(sessionId), state: "connecting", error: null, resumes: [], snapshot: null, differences: null };
}

/**
 * The live run of `sessionId`: `{view, state, error, resumes, snapshot, differences}`,
 * re-rendered on every envelope. A null `sessionId` watches nothing. The watch is
 * closed on unmount and restarted when the session, url, since or token change.
 */
export function useAgentSession(sessionId: string | null, options: AgentSessionOptions): WatchStatus {
  const [status, setStatus] = useState<WatchStatus>(() => idle(sessionId));
  const { url, key, since, token, transport, pusher } = options;
  useEffect(() => {
    if (!sessionId) {
      setStatus(idle(null));
      return undefined;
    }
    let watch: SessionWatch;
    try {
      watch =
        transport === "sse"
          ? watchSessionSse({ ...options, url: url ?? "", sessionId })
          : watchSession({ ...options, sessionId });
    } catch (error) {
      setStatus({ ...idle(sessionId), state: "failed", error: (error as Error).message });
      return undefined;
    }
    setStatus(watch.current);
    const unsubscribe = watch.subscribe(setStatus);
    return () => {
      unsubscribe();
      watch.close();
    };
    // options other than these are read when the watch starts
    // eslint-disable-next-line react-hooks/exhaustive-deps
  }, [sessionId, url, key, since, token, transport, pusher]);
  return status;
}

export type { WatchStatus } from "./watch.js";
