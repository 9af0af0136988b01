// Follows runs with the TypeScript client kit (clients/js, built into dist/): for each
// run, watchSession over pusher-js from the position before it, to the end of the
// session's latest run and the reconcile against the stored state, as a page using the
// kit would. Prints one JSON line: per run, the RunView of that execution in the
// watch's SessionView (each run apart) and its finalText, the execution ids of the
// session's runs, the connection state and error.
//
// Usage: node kit_watch.mjs <server url> <app key> <JSON [[sessionId, since, executionId], ...]>
import { finalText, watchSession } from "../../clients/js/dist/index.js";

const [url, key, runs] = process.argv.slice(2);

async function follow([sessionId, since, executionId]) {
  const watch = watchSession({ url, key, sessionId, since });
  const timer = setTimeout(() => watch.close(), 60_000);
  try {
    const status = await watch.done;
    const runs = status.session.runs;
    const found = runs.filter((run) => run.execution_id === executionId);
    const run = found.length === 1 ? found[0] : null;
    return {
      sessionId, since, state: status.state, error: status.error, run,
      finalText: run === null ? null : finalText(run), runs: runs.map((r) => r.execution_id),
    };
  } finally {
    clearTimeout(timer);
    watch.close();
  }
}

try {
  const results = await Promise.all(JSON.parse(runs).map(follow));
  process.stdout.write(JSON.stringify({ ok: true, results }) + "\n");
} catch (error) {
  process.stdout.write(JSON.stringify({ ok: false, error: String(error?.stack ?? error) }) + "\n");
  process.exitCode = 1;
}
