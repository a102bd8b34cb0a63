"""A real browser for the integration tests: Debian's Chromium, driven by Playwright.

``make setup-test`` installs Debian's ``chromium`` (``/usr/bin/chromium``) and the dev
extra's ``playwright``; Playwright never downloads a browser of its own here. A missing
Chromium fails the test, saying to run ``make setup-test``: it never skips.

Use :func:`browser` as a fixture (import it into the test module) or
:func:`launch_chromium` as a context manager, and :func:`new_page` for a page::

    from tests.integration.browser import browser, new_page  # noqa: F401 (a fixture)

    def test_page(browser: Browser) -> None:
        page = new_page(browser, "http://127.0.0.1:8000")
        page.goto("/")

Playwright's sync API cannot run inside a running asyncio event loop, so a test that
uses it must be a plain ``def`` test, not an ``async def`` one (nor an anyio test).

The browser talks to loopback only: background networking, component updates, sync
and the like are off; every host name but ``localhost`` resolves to nothing; and
every request to a non-loopback address goes to a proxy on a loopback port that
refuses connections, so it fails at once without leaving the machine.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import socket
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from playwright.sync_api import Browser, Page, sync_playwright

# Generous, for every wait and navigation: a bound on a hang, never on machine speed.
DEFAULT_TIMEOUT_MS = 60_000

DEBIAN_CHROMIUM = Path("/usr/bin/chromium")

# Flags that keep Chromium from calling home or anywhere else.
QUIET_ARGS = (
    "--disable-background-networking",
    "--no-first-run",
    "--disable-component-update",
    "--disable-sync",
    "--disable-default-apps",
    "--disable-domain-reliability",
    "--disable-breakpad",
    "--no-pings",
    "--disable-quic",
    "--disable-gpu",
    "--metrics-recording-only",
    # Every name but loopback resolves to nothing, so no DNS query leaves the machine.
    "--host-resolver-rules=MAP * ~NOTFOUND, EXCLUDE localhost, EXCLUDE 127.0.0.1, EXCLUDE [::1]",
)


def chromium_executable() -> str:
    """Debian's Chromium, or a failed test saying how to install it."""
    found = shutil.which("chromium")
    if found is None and os.access(DEBIAN_CHROMIUM, os.X_OK):
        found = str(DEBIAN_CHROMIUM)
    if found is None:
        pytest.fail(
            "Chromium is missing (no `chromium` on PATH, no /usr/bin/chromium): "
            "run `make setup-test`, which installs Debian's chromium package",
            pytrace=False,
        )
    return found


def _refuse_outside_loop() -> None:
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return
    pytest.fail(
        "Playwright's sync API cannot run inside a running asyncio loop: "
        "make this a plain (sync) test",
        pytrace=False,
    )


@contextmanager
def _dead_loopback_port() -> Iterator[int]:
    """A loopback port held bound but not listening: connecting to it is refused."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as held:
        held.bind(("127.0.0.1", 0))
        yield int(held.getsockname()[1])


@contextmanager
def launch_chromium() -> Iterator[Browser]:
    """Debian's Chromium, headless, closed (with Playwright's driver) on leaving."""
    _refuse_outside_loop()
    executable = chromium_executable()
    with _dead_loopback_port() as dead, sync_playwright() as playwright:
        args = [
            *QUIET_ARGS,
            # Loopback bypasses the proxy (Chromium's implicit rule); everything else
            # goes to a port that refuses it.
            f"--proxy-server=http://127.0.0.1:{dead}",
        ]
        browser = playwright.chromium.launch(
            executable_path=executable,
            headless=True,
            # The sandbox cannot start as root in a container: --no-sandbox then only.
            chromium_sandbox=os.geteuid() != 0,
            args=args,
            timeout=DEFAULT_TIMEOUT_MS,
        )
        try:
            yield browser
        finally:
            browser.close()


@pytest.fixture
def browser() -> Iterator[Browser]:
    """A headless Debian Chromium for one test, closed after it (see the module)."""
    with launch_chromium() as launched:
        yield launched


def new_page(browser: Browser, base_url: str) -> Page:
    """A page in a fresh context of ``browser``, relative URLs against ``base_url``,
    waiting up to :data:`DEFAULT_TIMEOUT_MS` for anything. It is closed with the browser.
    """
    context = browser.new_context(base_url=base_url)
    context.set_default_timeout(DEFAULT_TIMEOUT_MS)
    context.set_default_navigation_timeout(DEFAULT_TIMEOUT_MS)
    return context.new_page()
