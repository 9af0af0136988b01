"""The dashboard's files: served offline by the demo, pusher-js vendored from npm."""

from __future__ import annotations

import json
import re

import httpx
import pytest

from tests.support.processes import REPO, ServerProcess

FRONTEND = REPO / "frontend-demo"
VENDORED = FRONTEND / "vendor" / "pusher.min.js"
KIT = FRONTEND / "vendor" / "agent-broadcaster-client"


def _pinned_version() -> str:
    package = json.loads((FRONTEND / "package.json").read_text())
    version: str = package["dependencies"]["pusher-js"]
    assert re.fullmatch(r"\d+\.\d+\.\d+", version), f"pusher-js must be pinned, got {version}"
    return version


def test_the_vendored_pusher_js_is_the_version_pinned_in_package_json_and_lock() -> None:
    version = _pinned_version()
    banner = VENDORED.read_text()[:400]
    assert f"Pusher JavaScript Library v{version}" in (
        (FRONTEND / "vendor" / "pusher.min.js.LICENSE.txt").read_text()
    )
    assert "pusher.min.js.LICENSE.txt" in banner
    lock = json.loads((FRONTEND / "package-lock.json").read_text())
    assert lock["packages"]["node_modules/pusher-js"]["version"] == version
    assert (FRONTEND / "vendor" / "pusher-js.LICENCE").read_text().startswith("Copyright")


def test_the_vendored_copy_is_byte_for_byte_the_npm_package_file() -> None:
    installed = FRONTEND / "node_modules" / "pusher-js"
    if not installed.is_dir():
        pytest.skip("frontend-demo/node_modules is missing (scripts/install --test runs npm ci)")
    assert json.loads((installed / "package.json").read_text())["version"] == _pinned_version()
    shipped = installed / "dist" / "web" / "pusher.min.js"
    assert VENDORED.read_bytes() == shipped.read_bytes(), (
        "frontend-demo/vendor/pusher.min.js differs from the npm package: copy "
        "node_modules/pusher-js/dist/web/pusher.min.js{,.LICENSE.txt} into vendor/"
    )


def test_the_page_loads_nothing_from_other_hosts() -> None:
    pages = [*FRONTEND.glob("*.html"), FRONTEND / "app.js", *FRONTEND.glob("js/*.js")]
    for path in [*pages, *KIT.glob("*.js")]:
        text = path.read_text()
        remote = re.findall(r"""(?:src|href|import[^"']*from)\s*=?\s*["'](?:https?:)?//""", text)
        assert not remote, f"{path.name} loads from another host: {remote}"


def test_the_demo_serves_the_page_and_every_asset_it_references(
    demo_server: ServerProcess,
) -> None:
    index = httpx.get(f"{demo_server.url}/", timeout=5)
    assert index.status_code == 200
    assets = re.findall(r'(?:src|href)="(/demo/[^"]+)"', index.text)
    assert "/demo/app.js" in assets, assets
    assert "/demo/vendor/pusher.min.js" in assets, assets
    modules = [
        "/demo/js/run-model.js",
        "/demo/js/view.js",
        "/demo/js/pusher-global.js",
        *(f"/demo/vendor/agent-broadcaster-client/{p.name}" for p in KIT.glob("*.js")),
    ]
    assert "/demo/vendor/agent-broadcaster-client/index.js" in modules
    for path in [*assets, *modules]:
        response = httpx.get(f"{demo_server.url}{path}", timeout=5)
        assert response.status_code == 200, path
        if path.endswith(".js"):
            assert "javascript" in response.headers["content-type"], path


@pytest.mark.parametrize("page", ["sessions.html", "run.html"])
def test_the_demo_serves_the_explorer_pages_and_every_asset_they_reference(
    demo_server: ServerProcess, page: str
) -> None:
    answer = httpx.get(f"{demo_server.url}/demo/{page}", timeout=5)
    assert answer.status_code == 200
    assets = re.findall(r'(?:src|href)="(/demo/[^"]+)"', answer.text)
    assert "/demo/explorer.css" in assets, assets
    assert any(path.endswith("-page.js") for path in assets), assets
    for path in assets:
        response = httpx.get(f"{demo_server.url}{path}", timeout=5)
        assert response.status_code == 200, path
