"""Moving the database clock of the launched runtime, so that tests need not sleep.

Leases, the grace of a lost session lock, durable timers, rate-limit periods and
retention read time through ``dbos_agent.now()``: the database's time plus an offset
that the library sets on its own connections. Moving that offset makes them behave as
if the time had passed, for this process's connections only.
"""

from __future__ import annotations

from ..engine.runtime.engine import current_engine


def advance_clock(seconds: float) -> None:
    """Move the launched runtime's database clock ``seconds`` forward (or back, if
    negative): leases run out, timers come due, rate-limit periods pass. Workflows
    sleeping or waiting with a timeout in this process look at the clock again now."""
    current_engine().advance_clock(seconds)


def clock_offset() -> float:
    """How far the launched runtime's database clock is moved now, in seconds."""
    return current_engine().db.clock_offset
