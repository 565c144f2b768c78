"""The process tier's fixtures for the fault tests: the test module's own Postgres, which
they crash and restart, a fresh database on it, and the steps' side-effect log
(tests/apps/fault_app.py) that this process and the workers append to. A module that
means something else by ``server`` (a scripted model server) defines its own."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from dbos_agent.testing import Inspector, RestartablePostgres
from tests.apps import fault_app


@pytest.fixture
def server(dbos_agent_restartable_postgres: RestartablePostgres) -> RestartablePostgres:
    """This module's own server, which the tests crash, stop and restart."""
    return dbos_agent_restartable_postgres


@pytest.fixture
def url(restartable_url: str) -> str:
    """A fresh database on ``server``."""
    return restartable_url


@pytest.fixture
def db(url: str) -> Iterator[Inspector]:
    with Inspector(url) as inspector:
        yield inspector


@pytest.fixture
def step_log(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The side-effect log, for this process's steps and the workers'."""
    path = tmp_path / "steps.log"
    path.touch()
    monkeypatch.setattr(fault_app, "LOG", str(path))
    return path
