"""Small helpers shared by tests."""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable


def new_id(prefix: str = "wf") -> str:
    """A unique workflow id for one test."""
    return f"{prefix}-{uuid.uuid4().hex[:12]}"


class SimulatedCrash(BaseException):
    """Raised inside a workflow to stop it the way a dying process would: no outcome."""


def wait_until(
    predicate: Callable[[], object],
    timeout: float = 30.0,
    message: str = "condition",
    *,
    every: float = 0.2,
) -> None:
    """Poll ``predicate`` until it is true; fail the test naming ``message`` after ``timeout``.

    Polls quickly at first, then at most ``every`` seconds apart: lower it where the
    moment matters (a kill that must land between two steps).
    """
    deadline = time.monotonic() + timeout
    delay = min(0.01, every)
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for: {message}")
        time.sleep(delay)
        delay = min(delay * 1.5, every)
