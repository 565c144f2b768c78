"""The chaos scenario of tests/support/chaos.py at the size of the suite: every fault at once."""

from __future__ import annotations

from pathlib import Path

import pytest

from dbos_agent.testing import RestartablePostgres
from tests.support.chaos import run_chaos

pytestmark = pytest.mark.long  # many processes, a minute or more: started first


def test_two_workers_and_an_application_survive_every_fault_at_once(
    dbos_agent_restartable_postgres: RestartablePostgres, tmp_path: Path
) -> None:
    report = run_chaos(
        dbos_agent_restartable_postgres,
        workflows=12,
        steps=150,
        app_workflows=4,
        step_seconds=0.1,
        lease=3.0,
        work_dir=tmp_path,
    )
    print(report.as_json())
    assert report.problems == []
    assert report.workflows == 16 and report.steps_recorded == 16 * 150
    assert len(report.faults) == 7
