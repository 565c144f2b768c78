"""Test helpers for code built on dbos_agent: throwaway Postgres servers and databases,
and an inspector for assertions.

The fixtures in `dbos_agent.testing.plugin` are registered automatically with pytest.
"""

from .._engine.passes import (
    advance_clock,
    clock_offset,
    dispatch_once,
    fire_due,
    run_passes_every,
    sweep_once,
    take_over_once,
)
from .databases import fresh_database
from .faults import RestartablePostgres
from .inspector import Inspector, RowCounts, SentMessage
from .plugin import postgres_server
from .replay import check_replay

__all__ = [
    "Inspector",
    "RestartablePostgres",
    "RowCounts",
    "SentMessage",
    "advance_clock",
    "check_replay",
    "clock_offset",
    "dispatch_once",
    "fire_due",
    "fresh_database",
    "postgres_server",
    "run_passes_every",
    "sweep_once",
    "take_over_once",
]
