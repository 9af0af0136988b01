"""``python -m bench.run_page``: how long the run page takes to show a run of 2,000
envelopes in Chromium (issue 31's figure: within 1 s).

A real demo server serves the page, the client kit and the run index: the run's
envelopes are published to it through the signed HTTP API and its state stored, so the
server's own ``GET /api/sessions/{id}/runs`` and ``.../trace`` answer the page
(``tests/frontend/recorded.py``). The run is the golden ``completed`` run's first step
repeated to 2,000 envelopes (180 steps, 180 tool calls, continuation decisions, text
chunks). Each repetition opens the page in a fresh tab, at the address
the sessions page links (session and execution), and reads from the page's own clock
(``performance.now()``, 0 at navigation start):

- ``ready_ms``: navigation start until the run is rendered (runs list, waterfall,
  continuation panel, first inspector page): what the person waits for;
- ``script_start_ms``: navigation start until the page's script runs (HTML, CSS and
  the ES modules loaded);
- ``fetch_ms`` / ``fold_ms`` / ``render_ms``: waiting for the trace once the runs are
  listed (its download begins with the listing's), folding the envelopes with the
  client kit's reducer, building the DOM.

Examples::

    .venv/bin/python -m bench.run_page                    # 2,000 envelopes, 7 runs
    .venv/bin/python -m bench.run_page --envelopes 5000 --repeat 3
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time

from playwright.sync_api import sync_playwright

from tests.e2e.frontend.conftest import CHROMIUM, CHROMIUM_ARGS
from tests.e2e.frontend.recorded import long_run, publish_run
from tests.support.processes import ServerProcess

TARGET_MS = 1000.0


def measure(envelopes: int, repeat: int) -> dict[str, object]:
    history = str(max(envelopes + 100, 1000))
    server = ServerProcess(["--demo", "--history-size", history]).start()
    samples: list[dict[str, float]] = []
    try:
        trace = publish_run(server.url, long_run(envelopes, "s-bench-run-page"), "bench")
        summary = trace["summary"]
        assert len(trace["envelopes"]) == envelopes, "the trace lost envelopes"
        assert not trace["trimmed"], "the trace was trimmed"
        with sync_playwright() as pw:
            browser = pw.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
            context = browser.new_context(viewport={"width": 1280, "height": 900})
            # As the sessions page links a run: the session and the execution.
            execution = summary["execution_id"]
            query = f"session={summary['session_id']}&execution={execution}"
            url = f"{server.url}/demo/run.html?{query}"
            for index in range(repeat + 1):  # the first warms the server and the cache
                page = context.new_page()
                page.goto(url)
                page.wait_for_selector(f'body[data-rendered="{execution}"]', timeout=60_000)
                page.wait_for_function("window.runPage.timings.readyAt > 0")
                timings = page.evaluate("window.runPage.timings")
                shown = page.locator("#inspector-count").inner_text()
                assert shown == f"{envelopes:,} envelopes", shown
                page.close()
                if index:
                    samples.append(timings)
            browser.close()
    finally:
        server.stop()

    def stat(key: str) -> dict[str, float]:
        values = [sample[key] for sample in samples]
        return {
            "median": round(statistics.median(values), 1),
            "min": round(min(values), 1),
            "max": round(max(values), 1),
        }

    return {
        "bench": "run_page",
        "envelopes": envelopes,
        "steps": summary["steps"],
        "repeat": repeat,
        "ready_ms": stat("readyAt"),
        "script_start_ms": stat("startAt"),
        "fetch_ms": stat("fetchMs"),
        "fold_ms": stat("foldMs"),
        "render_ms": stat("renderMs"),
        "target_ms": TARGET_MS,
        "at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.run_page", description=__doc__)
    parser.add_argument("--envelopes", type=int, default=2000, help="envelopes in the run")
    parser.add_argument("--repeat", type=int, default=7, help="measured page loads")
    args = parser.parse_args(argv)
    result = measure(args.envelopes, args.repeat)
    print(json.dumps(result))
    ready = result["ready_ms"]
    assert isinstance(ready, dict)
    verdict = "within" if ready["median"] <= TARGET_MS else "OVER"
    print(
        f"{args.envelopes} envelopes rendered in {ready['median']} ms (median of "
        f"{args.repeat}; min {ready['min']}, max {ready['max']}): {verdict} the "
        f"{TARGET_MS:.0f} ms target",
        file=sys.stderr,
    )
    return 0 if verdict == "within" else 1


if __name__ == "__main__":
    sys.exit(main())
