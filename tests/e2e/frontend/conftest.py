"""Browser fixtures: Debian's chromium driven by the Python playwright package (never a
downloaded browser), a demo server, and the artifacts folder for screenshots."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from playwright.sync_api import Browser, Page, sync_playwright

from tests.support.pages import CHROMIUM_ARGS, require_chromium
from tests.support.processes import REPO, ServerFactory, ServerProcess

ARTIFACTS = REPO / "artifacts" / "frontend"


@pytest.fixture(scope="module")
def browser() -> Iterator[Browser]:
    """A headless chromium for the module's tests."""
    executable = require_chromium()
    with sync_playwright() as playwright:
        chromium = playwright.chromium.launch(
            executable_path=executable, args=CHROMIUM_ARGS, headless=True
        )
        yield chromium
        chromium.close()


@pytest.fixture
def demo_server(server_factory: ServerFactory) -> ServerProcess:
    """A server with the demo (dashboard, /run with the scripted agent) on memory."""
    return server_factory("--demo")


@pytest.fixture(scope="session")
def artifacts() -> Path:
    """Where screenshots go (git-ignored)."""
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    return ARTIFACTS


@pytest.fixture
def page(browser: Browser) -> Iterator[Page]:
    context = browser.new_context(viewport={"width": 1280, "height": 800})
    page = context.new_page()
    errors: list[str] = []
    page.on("pageerror", lambda error: errors.append(str(error)))
    yield page
    context.close()
    assert not errors, f"JavaScript errors on the page: {errors}"
