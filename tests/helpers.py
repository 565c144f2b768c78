"""Small helpers shared by tests."""

from __future__ import annotations

import uuid


def new_id(prefix: str = "wf") -> str:
    """A unique workflow id for one test."""
    return f"{prefix}-{uuid.uuid4().hex[:12]}"


class SimulatedCrash(BaseException):
    """Raised inside a workflow to stop it the way a dying process would: no outcome."""
