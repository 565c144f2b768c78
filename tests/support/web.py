"""The web app as the tests run it: uvicorn in a thread of this process on a free port,
the dashboard in Debian's chromium, and the token they log in with."""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
import uvicorn

from dbos_agent.web import create_app
from dbos_agent.web.connections import ConnectionLimits, server_config
from tests.helpers import wait_until

if TYPE_CHECKING:
    from playwright.sync_api import Page, Playwright

TOKEN = "s3cret-token"
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
#: The browser tests; DBOS_AGENT_REQUIRE_BROWSER=1 makes a missing chromium a failure.
NEEDS_CHROMIUM = pytest.mark.skipif(
    CHROMIUM is None and not os.environ.get("DBOS_AGENT_REQUIRE_BROWSER"),
    reason="needs Debian's chromium (.ci/run installs it)",
)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class Server:
    """The app on uvicorn in a thread of this process, on a free port, on connections
    with ``limits`` as ``dbos-agent serve`` runs it."""

    def __init__(
        self,
        url: str,
        token: str | None = None,
        limits: ConnectionLimits | None = None,
        **options: Any,
    ) -> None:
        self.port = free_port()
        config = server_config(
            create_app(url, token=token, **options),
            limits or ConnectionLimits(),
            host="127.0.0.1",
            port=self.port,
        )
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(target=self.server.run, daemon=True)

    @property
    def base(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def __enter__(self) -> Server:
        self.thread.start()
        wait_until(lambda: self.server.started, 30, "uvicorn started")
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.should_exit = True
        self.thread.join(10)


@contextlib.contextmanager
def dashboard(pw: Playwright, server: Server) -> Iterator[Page]:
    """The dashboard in Debian's chromium, logged in with the token."""
    assert CHROMIUM is not None, "chromium is not installed (apt-get install chromium)"
    browser = pw.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
    try:
        page = browser.new_page(viewport={"width": 1400, "height": 900})
        page.goto(server.base + "/")
        page.fill("#token", TOKEN)
        page.dispatch_event("#token", "change")
        yield page
    finally:
        browser.close()


def screenshot(page: Page, path: Path) -> None:
    """A screenshot in ``path`` (and in $DBOS_AGENT_SCREENSHOTS, to look at)."""
    page.screenshot(path=str(path), full_page=True)
    if folder := os.environ.get("DBOS_AGENT_SCREENSHOTS"):
        shutil.copy(path, Path(folder) / path.name)
    data = path.read_bytes()
    assert data.startswith(b"\x89PNG") and len(data) > 5_000, path
