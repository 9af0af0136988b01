// Follows runs with the TypeScript client kit (clients/js, built into dist/): for each
// run, watchSession over pusher-js from the position before it, to its end and the
// reconcile against the stored state, as a page using the kit would. Prints one JSON
// line: per run, the kit's RunView, its finalText, connection state, error and the
// reconcile differences.
//
// Usage: node kit_watch.mjs <server url> <app key> <JSON [[sessionId, since], ...]>
import { finalText, watchSession } from "../../clients/js/dist/index.js";

const [url, key, runs] = process.argv.slice(2);

async function follow([sessionId, since]) {
  const watch = watchSession({ url, key, sessionId, since });
  const timer = setTimeout(() => watch.close(), 20_000);
  try {
    const status = await watch.done;
    return {
      sessionId, since, state: status.state, error: status.error, view: status.view,
      finalText: finalText(status.view), differences: status.differences,
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
