// Test helpers: a real server (python -m broadcaster serve --demo) in a child process on
// a free port, and runs started with POST /run.
import { spawn } from "node:child_process";
import { existsSync } from "node:fs";
import { fileURLToPath } from "node:url";

export const REPO = fileURLToPath(new URL("../../../", import.meta.url));

function python() {
  if (process.env.BROADCASTER_PYTHON) return process.env.BROADCASTER_PYTHON;
  const venv = `${REPO}.venv/bin/python`;
  if (existsSync(venv)) return venv;
  throw new Error("no .venv/bin/python: run scripts/install --test (or set BROADCASTER_PYTHON)");
}

/** Start a demo server; resolves {url, stop, kill} once it answers GET /up. */
export async function startServer(args = ["--demo"], env = {}) {
  const child = spawn(python(), ["-m", "broadcaster", "serve", "--port", "0", ...args], {
    cwd: REPO,
    env: { ...process.env, PYTHONUNBUFFERED: "1", ...env },
    stdio: ["ignore", "pipe", "pipe"],
  });
  let log = "";
  const url = await new Promise((resolve, reject) => {
    const onData = (chunk) => {
      log += chunk;
      const match = /listening on (http:\/\/\S+?)\/?$/m.exec(log);
      if (match) resolve(match[1]);
    };
    child.stdout.on("data", onData);
    child.stderr.on("data", onData);
    child.on("exit", (code) => reject(new Error(`server exited with ${code}:\n${log}`)));
  });
  for (;;) {
    const up = await fetch(`${url}/up`).then((r) => r.ok, () => false);
    if (up) break;
    await new Promise((resolve) => setTimeout(resolve, 50));
  }
  const stop = () =>
    new Promise((resolve) => {
      if (child.exitCode !== null) return resolve();
      child.on("exit", resolve);
      child.kill("SIGTERM");
    });
  return { url, stop, get log() { return log; } };
}

/** POST /run; resolves the answer ({session_id, position, state_url, ...}). */
export async function startRun(url, body) {
  const response = await fetch(`${url}/run`, {
    method: "POST",
    headers: { "Content-Type": "application/json" },
    body: JSON.stringify(body),
  });
  const answer = await response.json();
  if (response.status !== 202) throw new Error(`POST /run answered ${response.status}: ${JSON.stringify(answer)}`);
  return answer;
}
