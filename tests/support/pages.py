"""Helpers of the Chromium page tests (``page`` is a fixture in
tests/e2e/frontend/conftest.py)."""

from __future__ import annotations

import contextlib
import functools
import os
import threading
from collections.abc import Iterator
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
from playwright.sync_api import Page, expect

from tests.support.processes import IN_CI

WAIT_MS = 20_000

CHROMIUM = "/usr/bin/chromium"
"""Debian's chromium: the only browser the tests drive (never a downloaded one)."""
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]

if not os.environ.get("PLAYWRIGHT_BROWSERS_PATH"):
    # Never let playwright look for (or fetch) a browser of its own.
    os.environ["PLAYWRIGHT_SKIP_BROWSER_DOWNLOAD"] = "1"


def require_chromium() -> str:
    """The chromium binary (else the test is skipped, or failed in CI)."""
    if not os.access(CHROMIUM, os.X_OK):
        message = f"{CHROMIUM} is not installed (scripts/install --test installs it)"
        if IN_CI:
            pytest.fail(message)
        pytest.skip(message)
    return CHROMIUM


def screenshot(page: Page, folder: Path, name: str) -> None:
    """Save the page at 1280x800 and at 390 px wide (full page) as artifacts."""
    page.set_viewport_size({"width": 1280, "height": 800})
    page.screenshot(path=folder / f"{name}-1280x800.png")
    page.set_viewport_size({"width": 390, "height": 844})
    page.screenshot(path=folder / f"{name}-390.png", full_page=True)
    page.set_viewport_size({"width": 1280, "height": 800})


def start_run(
    page: Page, url: str, question: str, pace: str = "40", max_steps: str | None = None
) -> str:
    """Open the dashboard, start a run from the input box; returns the session id."""
    page.goto(url + "/")
    expect(page.locator("body")).to_have_attribute("data-ready", "true", timeout=WAIT_MS)
    page.get_by_label("Ask the agent").fill(question)
    page.get_by_label("Pace").select_option(pace)
    if max_steps is not None:
        page.get_by_label("Step limit").select_option(max_steps)
    page.get_by_role("button", name="Start run").click()
    session = page.locator("#session-id")
    expect(session).not_to_have_text("—", timeout=WAIT_MS)
    return session.inner_text().strip()


class _Quiet(SimpleHTTPRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:
        pass


@contextlib.contextmanager
def static_sites(root: Path, count: int = 2) -> Iterator[list[str]]:
    """``count`` static HTTP servers on loopback, each on its own port (so each its own
    origin), serving the files under ``root``; yields their origins."""
    handler = functools.partial(_Quiet, directory=str(root))
    servers = [ThreadingHTTPServer(("127.0.0.1", 0), handler) for _ in range(count)]
    for server in servers:
        threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield [f"http://127.0.0.1:{server.server_address[1]}" for server in servers]
    finally:
        for server in servers:
            server.shutdown()
            server.server_close()
