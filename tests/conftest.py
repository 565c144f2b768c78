"""Shared fixtures: every test talks to the throwaway Postgres of dbos_agent.testing."""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import pytest

import dbos_agent as da


@pytest.fixture
def executor_id() -> str:
    """A fresh executor id per test, so recovery only sees that test's workflows."""
    return f"test-{uuid.uuid4().hex[:12]}"


@pytest.fixture
def runtime(dbos_agent_database_url: str, executor_id: str) -> Iterator[da.Runtime]:
    """A launched runtime on the session database, shut down after the test."""
    rt = da.launch(dbos_agent_database_url, executor_id=executor_id, workers=8)
    try:
        yield rt
    finally:
        rt.shutdown(grace=5)
