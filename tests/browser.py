"""Headless Chromium (Debian's /usr/bin/chromium) driven by Playwright, logged in by session cookie."""

from __future__ import annotations

import os
import shutil
import tempfile
from contextlib import contextmanager
from urllib.parse import urlparse

from playwright.sync_api import sync_playwright

CHROMIUM = os.environ.get("LOCKSTEP_CHROMIUM", shutil.which("chromium") or "/usr/bin/chromium")
FLAGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--disable-dev-shm-usage",
]


@contextmanager
def chromium_page(base_url: str, session: str | None = None):
    profile = tempfile.mkdtemp(prefix="lockstep-chromium-")
    with sync_playwright() as pw:
        context = pw.chromium.launch_persistent_context(profile, executable_path=CHROMIUM, headless=True, args=FLAGS)
        try:
            if session:
                host = urlparse(base_url).hostname
                context.add_cookies([{"name": "sessionid", "value": session, "domain": host, "path": "/"}])
            page = context.new_page()
            yield page
        finally:
            context.close()
            shutil.rmtree(profile, ignore_errors=True)
