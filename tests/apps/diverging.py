"""A workflow made DIVERGED on purpose, for the tests of what operators see of it.

As tests/integration/test_workflows.py does: run it until it dies after its first step, rename that
step in the log (as if an older version of the code had recorded it), and call it again:
the engine holds it DIVERGED at step 0, log 'prepare', code 'audit'.
"""

from __future__ import annotations

import pytest

import dbos_agent as da
from dbos_agent._engine.runtime.current import current_engine
from tests.helpers import SimulatedCrash

CRASH: set[str] = set()


@da.step
def audit(key: str) -> str:
    return f"audited {key}"


@da.step
def apply_change(key: str) -> str:
    return f"applied {key}"


@da.durable_workflow(name="diverging_order")
def diverging_order(key: str) -> list[str]:
    done = [audit(key)]
    if key in CRASH:
        raise SimulatedCrash()
    return [*done, apply_change(key)]


def hold_diverged(workflow_id: str) -> da.WorkflowInfo:
    """Make ``workflow_id`` a DIVERGED ``diverging_order`` in the launched runtime's
    database, and return it as stored."""
    CRASH.add(workflow_id)
    with pytest.raises(SimulatedCrash), da.workflow_id(workflow_id):
        diverging_order(workflow_id)
    CRASH.discard(workflow_id)
    with current_engine().db.connection() as conn:  # a log from an older version
        conn.execute(
            "UPDATE dbos_agent.steps SET name = 'prepare' WHERE workflow_id = %s AND seq = 0",
            (workflow_id,),
        )
    with pytest.raises(da.errors.WorkflowDivergedError), da.workflow_id(workflow_id):
        diverging_order(workflow_id)
    info = da.retrieve(workflow_id).get_info()
    assert info.status == da.WorkflowStatus.DIVERGED, info
    return info
