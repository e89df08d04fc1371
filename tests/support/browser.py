"""Debian's Chromium, driven headless by Playwright, for the trace viewer's tests and benchmark.

Playwright cannot download its own browsers here; it drives the system's `chromium` (apt), found on
PATH or at $LOOPTRACE_CHROMIUM. The flags keep it off the network it could not reach anyway.
"""

from __future__ import annotations

import os
import shutil
from contextlib import contextmanager
from typing import Iterator

FLAGS = ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run", "--disable-background-networking",
         "--disable-component-update", "--disable-sync", "--disable-default-apps"]


class MissingChromium(RuntimeError):
    pass


def chromium_path() -> str:
    path = os.environ.get("LOOPTRACE_CHROMIUM") or shutil.which("chromium") or shutil.which("chromium-browser")
    if not path:
        raise MissingChromium("Chromium is not installed: `apt-get install chromium` (tests/run.sh does)")
    return path


@contextmanager
def chromium() -> Iterator[object]:
    """A headless Chromium (a Playwright Browser)."""
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=chromium_path(), args=FLAGS, headless=True)
        try:
            yield browser
        finally:
            browser.close()


class Page:
    """A page with the JavaScript errors and the requests it made kept, for the test to look at."""

    def __init__(self, browser, *, width: int = 1400, height: int = 900) -> None:
        self.context = browser.new_context(viewport={"width": width, "height": height})
        self.page = self.context.new_page()
        self.errors: list[str] = []  # uncaught exceptions in the page's scripts
        self.console: list[str] = []  # console errors (a refused request logs one)
        self.requests: list[str] = []
        self.page.on("pageerror", lambda error: self.errors.append(str(error)))
        self.page.on("console", lambda m: self.console.append(m.text) if m.type == "error" else None)
        self.page.on("request", lambda request: self.requests.append(request.url))

    def close(self) -> None:
        self.context.close()
