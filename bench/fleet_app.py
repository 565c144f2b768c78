"""The application the fleet benchmark's worker processes import (``--app bench.fleet_app``)."""

from __future__ import annotations

import os

import dbos_agent as da

fleet_queue = da.Queue("bench-fleet")


class Abandon(BaseException):
    """Leaves a workflow PENDING the way a dying process would (no outcome recorded)."""


@da.step
def noop(i: int) -> int:
    return i


@da.durable_workflow
def fleet_job(steps: int) -> int:
    """Step 0, then (in the victim process only) abandon; the rest runs after take-over."""
    total = noop(0)
    if os.environ.get("FLEET_ABANDON_AFTER_FIRST") == "1":
        raise Abandon()
    for i in range(1, steps):
        total += noop(i)
    return total
