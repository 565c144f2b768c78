"""The worker's logging: its own INFO lines, dbos_agent's and the app's, but not those of
the libraries below them (httpx logs a line per HTTP request: each model call) unless
``--verbose``; logging the app configured is left alone. Each case in a fresh
interpreter (logging is process-wide)."""

from __future__ import annotations

import sys

import pytest

from tests.helpers import CHECKOUT
from tests.support import zygote

_PROBE = """
import logging, sys
from dbos_agent.worker import configure_logging
if sys.argv[1] == "app":  # the app configured logging while it was imported
    logging.basicConfig(level=logging.INFO, format="%(name)s: %(message)s")
configure_logging(quiet=False, verbose=sys.argv[1] == "verbose", app="my_app.worker:app")
for name in ("__main__", "dbos_agent.worker", "my_app.tools", "httpx", "httpx2", "mcp"):
    logging.getLogger(name).info("info")
logging.getLogger("httpx").warning("warning")
"""


@pytest.mark.parametrize(
    ("case", "libraries"), [("default", False), ("verbose", True), ("app", True)]
)
def test_other_libraries_info_lines_are_left_out_by_default(case: str, libraries: bool) -> None:
    done = zygote.run(
        [sys.executable, "-c", _PROBE, case],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=CHECKOUT,
    )
    assert done.returncode == 0, done.stderr
    lines = [" ".join(line.split()[-2:]) for line in done.stderr.splitlines()]  # name: message
    own = ["__main__: info", "dbos_agent.worker: info", "my_app.tools: info"]
    others = ["httpx: info", "httpx2: info", "mcp: info"] if libraries else []
    assert lines == [*own, *others, "httpx: warning"], done.stderr
