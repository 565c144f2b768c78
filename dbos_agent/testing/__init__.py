"""Test helpers for code built on dbos_agent: throwaway Postgres servers and databases.

The fixtures in `dbos_agent.testing.plugin` are registered automatically with pytest.
"""

from .databases import fresh_database
from .faults import RestartablePostgres
from .plugin import postgres_server

__all__ = ["RestartablePostgres", "fresh_database", "postgres_server"]
