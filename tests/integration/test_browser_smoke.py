"""The browser stack works: Debian's Chromium, driven by Playwright, loads a loopback
page, runs its script, takes a click and a screenshot, and reaches nothing else.

A plain sync test: Playwright's sync API cannot run inside an asyncio loop.
"""

from __future__ import annotations

import http.server
import threading
from collections.abc import Iterator
from functools import partial
from pathlib import Path

import pytest
from playwright.sync_api import Browser
from playwright.sync_api import Error as PlaywrightError

from tests.integration.browser import browser, new_page  # noqa: F401 (a fixture)

pytestmark = pytest.mark.integration

PAGE = """<!doctype html>
<html><head><meta charset="utf-8"><title>capgate browser smoke</title>
<script src="/app.js" defer></script></head>
<body><p id="status">not clicked</p><button id="go">Click</button></body></html>
"""
# An external script, not an inline one: the page's script must be fetched and run.
SCRIPT = """document.getElementById("go").addEventListener("click", () => {
  document.getElementById("status").textContent = "clicked";
});
"""
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


class _QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, format: str, *args: object) -> None:
        pass


@pytest.fixture
def site(tmp_path: Path) -> Iterator[str]:
    """A loopback HTTP server for the page and its script; its base URL."""
    root = tmp_path / "site"
    root.mkdir()
    (root / "index.html").write_text(PAGE, encoding="utf-8")
    (root / "app.js").write_text(SCRIPT, encoding="utf-8")
    server = http.server.ThreadingHTTPServer(
        ("127.0.0.1", 0), partial(_QuietHandler, directory=str(root))
    )
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        host, port = server.server_address[:2]
        yield f"http://{host!s}:{port}"
    finally:
        server.shutdown()
        server.server_close()
        thread.join()


def test_a_click_runs_the_pages_script_and_a_screenshot_is_a_png(
    browser: Browser,  # noqa: F811 (the fixture imported above)
    site: str,
    tmp_path: Path,
) -> None:
    page = new_page(browser, site)
    response = page.goto("/")
    assert response is not None
    assert response.ok
    status = page.locator("#status")
    assert status.text_content() == "not clicked"

    page.click("#go")
    page.wait_for_function(
        "document.getElementById('status').textContent === 'clicked'",
    )
    assert status.text_content() == "clicked"

    shot = tmp_path / "page.png"
    page.screenshot(path=str(shot))
    assert shot.read_bytes().startswith(PNG_SIGNATURE)


def test_a_name_outside_loopback_is_never_reached(
    browser: Browser,  # noqa: F811 (the fixture imported above)
) -> None:
    # .invalid never resolves (RFC 6761); the browser resolves no name but localhost
    # and sends anything not on loopback to a proxy port that refuses it.
    page = new_page(browser, "http://capgate-browser-smoke.invalid")
    with pytest.raises(PlaywrightError, match=r"net::ERR_"):
        page.goto("/")
