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
    predicate: Callable[[], object], timeout: float = 30.0, message: str = "condition"
) -> None:
    """Poll ``predicate`` until it is true; fail the test naming ``message`` after ``timeout``."""
    deadline = time.monotonic() + timeout
    delay = 0.01
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for: {message}")
        time.sleep(delay)
        delay = min(delay * 1.5, 0.2)
