"""Every optional extra is optional for real (issue 38): the demo starts and completes a
run with no extra and with each extra alone, and a feature whose extra is missing
answers a message naming it, never a crash: ``format=otlp`` gets 501, importing a
framework adapter raises ``ModuleNotFoundError`` saying what to install.

The other extras are taken away by an import hook (:mod:`tests.support.extras`), not by
an environment per extra; the runtime-only install itself is real in
test_fresh_clone.py.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator

import httpx
import pytest

from tests.support.extras import BLOCKED_ENV, FEATURE_EXTRAS, requirements_of, without
from tests.support.processes import REPO, ServerProcess
from tests.support.runs import complete_demo_run

pytestmark = pytest.mark.slow

CASES = [None, *FEATURE_EXTRAS]
"""No extra, then each extra alone."""

HIDDEN = f"{sys.executable} -m tests.support.extras".split()


def integration(extra: str) -> str:
    """The module an extra serves: ``agent_core.integrations.<extra, as a name>``."""
    return "agent_core.integrations." + extra.replace("-", "_")


def test_the_extras_are_the_ones_all_frameworks_gathers() -> None:
    gathered = requirements_of("all-frameworks")
    assert FEATURE_EXTRAS, "pyproject.toml names optional extras"
    for extra in FEATURE_EXTRAS:
        assert requirements_of(extra), extra
        assert {line.split(";")[0] for line in requirements_of(extra)} <= {
            line.split(";")[0] for line in gathered
        }, f"[all-frameworks] lacks [{extra}]"
        assert (REPO / (integration(extra).replace(".", "/") + ".py")).is_file(), extra


@pytest.fixture(params=CASES, ids=lambda kept: kept or "no-extras")
def kept(request: pytest.FixtureRequest) -> str | None:
    return request.param  # type: ignore[no-any-return]


@pytest.fixture
def hidden_env(kept: str | None) -> dict[str, str]:
    refused = without((kept,) if kept else ())
    assert refused, "with every extra installed here, something must be taken away"
    return {BLOCKED_ENV: ",".join(sorted(refused))}


@pytest.fixture
def demo(hidden_env: dict[str, str]) -> Iterator[ServerProcess]:
    server = ServerProcess(["--port", "0", "--demo"], env=hidden_env, command=[*HIDDEN, "serve"])
    server.start()
    try:
        yield server
    finally:
        server.stop()


def test_the_demo_runs_and_the_trace_formats_answer(kept: str | None, demo: ServerProcess) -> None:
    demo.wait_ready()
    run = complete_demo_run(demo.url)
    trace = f"{demo.url}/api/sessions/{run['session_id']}/trace"
    query = {"execution_id": run["execution_id"]}
    assert httpx.get(trace, params=query, timeout=30).status_code == 200
    otlp = httpx.get(trace, params={**query, "format": "otlp"}, timeout=30)
    if kept == "otel":
        assert otlp.status_code == 200, otlp.text
        assert otlp.json()["resourceSpans"]
    else:
        assert otlp.status_code == 501, otlp.text
        error = otlp.json()["error"]
        assert "format=otlp needs the optional extra [otel]" in error, error
        assert "pip install" in error, error
    assert "Traceback" not in demo.log, demo.log


def test_an_adapter_without_its_extra_says_what_to_install(
    kept: str | None, hidden_env: dict[str, str]
) -> None:
    code = f"""
import json
found = {{}}
for extra, module in {json.dumps({e: integration(e) for e in FEATURE_EXTRAS})}.items():
    try:
        __import__(module)
        found[extra] = "imported"
    except ModuleNotFoundError as exc:
        found[extra] = str(exc)
print(json.dumps(found))
"""
    done = subprocess.run(
        [*HIDDEN, "-c", code],
        cwd=REPO,
        env={**os.environ, **hidden_env},
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    found = json.loads(done.stdout.strip().splitlines()[-1])
    for extra in FEATURE_EXTRAS:
        if extra == kept:
            assert found[extra] == "imported", found[extra]
        else:
            assert f"needs the optional extra [{extra}]" in found[extra], found[extra]
            assert f"pip install -e '.[{extra}]'" in found[extra], found[extra]
