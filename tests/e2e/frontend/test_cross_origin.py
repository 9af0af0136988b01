"""A page on a second origin starts and follows a run (issue 29, point 2), in Chromium.

The server restricts ``allowed_origins`` to one origin; a second local HTTP server, on
another port (another origin), serves a page that subscribes with pusher-js, POSTs
``/run`` (JSON: the browser sends a CORS preflight first) and waits for the run's
final status. The same page served from a third origin, not allowed, cannot start a
run: its preflight is refused. HTTP-level checks: tests/reliability/test_cross_site_runs.py.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from playwright.sync_api import Browser

from tests.support.live import APP_ID, KEY, SECRET, write_apps
from tests.support.pages import static_sites
from tests.support.processes import REPO, ServerFactory, ServerProcess

pytestmark = pytest.mark.browser

WAIT_MS = 20_000
PAGE = """<!doctype html>
<meta charset="utf-8">
<title>another origin</title>
<script src="pusher.min.js"></script>
<script>
window.start = async (server, session) => {
  try {
    const answer = await fetch(`${server}/run`, {
      method: "POST",
      headers: { "Content-Type": "application/json" },
      body: JSON.stringify({ input: "What is the weather in Oslo?", session_id: session }),
    });
    return { status: answer.status, run: await answer.json() };
  } catch (error) {
    return { refused: String(error) };
  }
};
window.follow = async (server, key, session) => {
  const url = new URL(server);
  const pusher = new Pusher(key, {
    cluster: "local", wsHost: url.hostname, wsPort: Number(url.port), forceTLS: false,
    enabledTransports: ["ws"], disableStats: true,
  });
  const channel = pusher.subscribe(`agent.${session}`);
  const statuses = [];
  const done = new Promise((resolve) => {
    channel.bind("agent.status", (envelope) => {
      statuses.push(envelope.payload.status);
      if (["completed", "failed"].includes(envelope.payload.status)) resolve();
    });
  });
  await new Promise((resolve) => channel.bind("pusher:subscription_succeeded", resolve));
  const started = await window.start(server, session);
  if (started.status === 202) await done;
  pusher.disconnect();
  return { ...started, statuses };
};
</script>
"""


@pytest.fixture
def pages(tmp_path: Path) -> Iterator[list[str]]:
    """Two static servers on loopback (two origins) serving the page and pusher-js."""
    root = tmp_path / "site"
    root.mkdir()
    (root / "index.html").write_text(PAGE)
    (root / "pusher.min.js").write_bytes((REPO / "frontend-demo/vendor/pusher.min.js").read_bytes())
    with static_sites(root) as origins:
        yield origins


def restricted_server(factory: ServerFactory, tmp_path: Path, origin: str) -> ServerProcess:
    app = {"id": APP_ID, "key": KEY, "secret": SECRET, "allowed_origins": [origin]}
    return factory("--demo", "--apps-file", str(write_apps(tmp_path / "apps.json", app)))


def test_a_dashboard_on_another_allowed_origin_starts_and_follows_a_run(
    browser: Browser, server_factory: ServerFactory, pages: list[str], tmp_path: Path
) -> None:
    allowed, foreign = pages
    server = restricted_server(server_factory, tmp_path, allowed)
    base = server.ws_url.replace("ws://", "http://", 1)
    context = browser.new_context()
    try:
        page = context.new_page()
        page.set_default_timeout(WAIT_MS)
        page.goto(f"{allowed}/index.html")
        result = page.evaluate("([s, k, id]) => follow(s, k, id)", [base, KEY, "s-cross-1"])
        assert result["status"] == 202, result
        assert result["run"]["session_id"] == "s-cross-1"  # the page read the answer
        assert result["statuses"][-1] == "completed", result

        page.goto(f"{foreign}/index.html")
        refused = page.evaluate("([s, id]) => start(s, id)", [base, "s-cross-2"])
        assert "Failed to fetch" in refused["refused"], refused  # its preflight got 403
    finally:
        context.close()
