"""A pydantic-ai agent (FunctionModel, streamed) drives the live dashboard: the page
attaches to the session, the run is published through the server's HTTP API, and the
page shows its steps, tool call, answer and final state in sync (Debian's chromium):
with a Redis state store next to a Redis-backed server; and a pydantic-ai, an Agents
SDK and a LangGraph run on the default in-memory server with nothing but the publisher,
which stores the final state over the HTTP API."""

from __future__ import annotations

import asyncio
import re
import uuid
from collections.abc import Coroutine, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest
from playwright.sync_api import Browser, Page, expect
from redis.asyncio import Redis

from agent_core.integrations.pydantic_ai import broadcast_pydantic_ai
from broadcaster.publishers import PusherHTTPPublisher, RedisStateStore
from tests.e2e.frontend.conftest import artifacts, browser  # noqa: F401
from tests.support.framework_runs import ANSWER, QUESTION, RUNS, pydantic_agent
from tests.support.processes import RedisServer, ServerFactory, ServerProcess

pytestmark = pytest.mark.browser
WAIT_MS = 20_000


@pytest.fixture
def page(browser: Browser) -> Iterator[Page]:  # noqa: F811
    context = browser.new_context(viewport={"width": 1280, "height": 800})
    page = context.new_page()
    errors: list[str] = []
    page.on("pageerror", lambda error: errors.append(str(error)))
    yield page
    context.close()
    assert not errors, f"JavaScript errors on the page: {errors}"


async def publish_run(server_url: str, redis_url: str, session: str) -> None:
    publisher = PusherHTTPPublisher(server_url, "1", "agent-key", "agent-secret")
    client = Redis.from_url(redis_url)
    try:
        store = RedisStateStore(client, "1")
        await broadcast_pydantic_ai(
            pydantic_agent(), QUESTION, publisher, session, state_store=store
        )
        assert await publisher.flush(10)
    finally:
        await publisher.aclose()
        await client.aclose()


async def publish_alone(framework: str, server_url: str, session: str) -> None:
    """As the README says: the publisher, and nothing else."""
    async with PusherHTTPPublisher(server_url, "1", "agent-key", "agent-secret") as publisher:
        await RUNS[framework](publisher, session)


def attach(page: Page, url: str, session: str) -> None:
    page.goto(url + "/")
    expect(page.locator("body")).to_have_attribute("data-ready", "true", timeout=WAIT_MS)
    page.get_by_label("attach to a session id").fill(session)
    page.get_by_role("button", name="Attach").press("Enter")
    expect(page.locator("#session-id")).to_have_text(session, timeout=WAIT_MS)


def run_aside(run: Coroutine[Any, Any, None]) -> None:
    # playwright's sync API keeps an event loop in this thread: the run gets its own.
    with ThreadPoolExecutor(1) as pool:
        pool.submit(asyncio.run, run).result(30)


def test_a_pydantic_ai_run_is_shown_live_on_the_dashboard_and_in_sync(
    page: Page,
    server_factory: ServerFactory,
    redis_server: RedisServer,
    artifacts,  # noqa: F811
) -> None:
    server = server_factory("--demo", "--backend", redis_server.url, "--log-level", "warning")
    session = f"pai-{uuid.uuid4().hex[:12]}"
    attach(page, server.url, session)
    run_aside(publish_run(server.url, redis_server.url, session))

    expect(page.get_by_label("Run status")).to_have_text("completed", timeout=WAIT_MS)
    expect(page.locator("#timeline > li.step")).to_have_count(2)
    tool = page.locator('#step-1 li.tool[data-tool-call-id="call_p1"]')
    expect(tool).to_have_attribute("data-state", "ok")
    expect(tool.locator(".tool-name")).to_have_text("weather")
    expect(tool.locator(".tool-args")).to_contain_text("Oslo")
    expect(page.locator("#step-1 .finish")).to_have_text("tool_calls")
    expect(page.locator("#step-2 .finish")).to_have_text("stop")
    expect(page.locator("#answer")).to_contain_text(ANSWER)
    expect(page.locator("#total-tokens")).not_to_have_text("0")
    expect(page.locator("#reconcile")).to_have_attribute("data-state", "in_sync", timeout=WAIT_MS)
    expect(page.get_by_role("status").filter(has_text=re.compile("In sync"))).to_be_visible()
    page.screenshot(path=artifacts / "pydantic-ai-run-1280x800.png")


@pytest.fixture(scope="module")
def memory_server() -> Iterator[ServerProcess]:
    """One demo server on the default in-memory backend, for the three frameworks."""
    server = ServerProcess(("--demo", "--log-level", "warning")).start()
    yield server
    server.stop()


@pytest.mark.parametrize("framework", sorted(RUNS))
def test_an_outside_run_is_in_sync_on_the_default_in_memory_server(
    framework: str,
    page: Page,
    memory_server: ServerProcess,
    artifacts,  # noqa: F811
) -> None:
    server = memory_server
    session = f"mem-{uuid.uuid4().hex[:12]}"
    attach(page, server.url, session)
    run_aside(publish_alone(framework, server.url, session))

    expect(page.get_by_label("Run status")).to_have_text("completed", timeout=WAIT_MS)
    expect(page.locator("#answer")).to_contain_text(ANSWER)
    expect(page.locator("#reconcile")).to_have_attribute("data-state", "in_sync", timeout=WAIT_MS)
    expect(page.get_by_role("status").filter(has_text=re.compile("In sync"))).to_be_visible()
    page.screenshot(path=artifacts / f"{framework}-in-memory-in-sync-1280x800.png")
