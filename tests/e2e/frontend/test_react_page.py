"""The README's ``useAgentSession`` example, in a page built with Vite and served from a
second origin, follows a run to "in sync" in Chromium (issue 38).

The example is taken from README.md as it stands (its one ``tsx`` block that uses the
hook), only its server URL replaced by the test server's, and mounted by a two-line
harness (tests/node/react-page/). The kit resolves through clients/js's package exports
to its build, as a user's install of the package does. The server allows the page's
origin with ``--allowed-origins``: the page reads the demo's config, subscribes, and
fetches the stored state to reconcile. The same page from an origin that is not
allowed fails, and says so.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

import httpx
import pytest
from playwright.sync_api import Browser, expect

from tests.support.node import NODE_DIR, node_with
from tests.support.pages import WAIT_MS, static_sites
from tests.support.processes import IN_CI, REPO, ServerFactory

pytestmark = [pytest.mark.browser, pytest.mark.node, pytest.mark.slow]

DOC_URL = "http://127.0.0.1:8080"
HARNESS = NODE_DIR / "react-page"
KIT = REPO / "clients" / "js"
TSX = re.compile(r"^```tsx\n(.*?)^```", re.S | re.M)


def readme_example() -> str:
    """The README's React example, as written."""
    blocks = [b for b in TSX.findall((REPO / "README.md").read_text()) if "useAgentSession" in b]
    assert len(blocks) == 1, "README.md has one tsx example of useAgentSession"
    assert "export function RunStatus(" in blocks[0], "the harness mounts <RunStatus>"
    assert DOC_URL in blocks[0], f"the example names the server as {DOC_URL}"
    return blocks[0]


def build_page(work: Path, server_url: str, out: Path) -> None:
    """Vite-build the harness with the README's example into ``out``."""
    node = node_with("vite", "vite (tests/node)")
    if not (KIT / "dist" / "react.js").is_file():
        message = "the client kit is not built: run scripts/install --test"
        if IN_CI:
            pytest.fail(message)
        pytest.skip(message)
    page = work / "react-page"
    shutil.copytree(HARNESS, page, ignore=shutil.ignore_patterns("node_modules", "dist"))
    (page / "node_modules").symlink_to(NODE_DIR / "node_modules")
    (page / "src" / "readme-example.tsx").write_text(readme_example().replace(DOC_URL, server_url))
    vite = str(NODE_DIR / "node_modules" / "vite" / "bin" / "vite.js")
    env = {**os.environ, "AGENT_BROADCASTER_CLIENT": str(KIT), "PAGE_OUT": str(out)}
    done = subprocess.run(
        [node, vite, "build", "--config", "vite.config.mjs"],
        cwd=page,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert (out / "index.html").is_file(), done.stdout


def test_the_readme_react_example_reaches_in_sync_from_another_origin(
    browser: Browser, server_factory: ServerFactory, tmp_path: Path
) -> None:
    site = tmp_path / "site"
    site.mkdir()
    with static_sites(site) as (allowed, foreign):
        server = server_factory("--demo", "--allowed-origins", allowed)
        build_page(tmp_path, server.url, site)
        run = httpx.post(f"{server.url}/run", json={"input": "What is 6 * 7?"}, timeout=30)
        assert run.status_code == 202, run.text
        session, since = run.json()["session_id"], run.json()["position"]
        context = browser.new_context()
        try:
            page = context.new_page()
            page.goto(f"{allowed}/?session={session}&since={since}")
            shown = page.locator("#root p")
            expect(shown).to_have_text("completed: 6 * 7 = 42. (ended, in sync)", timeout=WAIT_MS)
            # A session token travels as a header: the browser's preflight lets it through,
            # and the refusal of a wrong one is readable.
            asked = page.evaluate(
                """async (url) => {
                    const answer = await fetch(url, { headers: { Authorization: "Bearer nope" } });
                    return [answer.status, (await answer.json()).error];
                }""",
                f"{server.url}/api/sessions/{session}/state",
            )
            assert asked[0] == 403, asked
            assert "does not grant" in asked[1], asked

            page.goto(f"{foreign}/?session={session}&since={since}")
            expect(page.locator("#root p")).to_contain_text("(failed", timeout=WAIT_MS)
        finally:
            context.close()
