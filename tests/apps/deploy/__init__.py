"""Three versions of one application, deployed one after another in tests/process/test_deploys.py.

Each module registers the workflow ``deploy_flow`` and its steps under the same names, as
successive deploys of one code base would; every live step run is appended to
$DEPLOY_LOG (``version step workflow_id``), counted from outside the processes.

    python -m tests.apps.deploy.v1 start WORKFLOW_ID   # start it, exit once it waits (SUSPENDED)

($DEPLOY_APP_VERSION: the application version it is started under.)

Run a version as a process that serves the workflows with the worker:
``python -m dbos_agent.worker --app tests.apps.deploy.v2``.
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable

import dbos_agent as da
from dbos_agent.testing import Inspector


def note(version: str, step: str) -> None:
    """One line per live step run."""
    with open(os.environ.get("DEPLOY_LOG", "deploy.log"), "a", encoding="utf-8") as log:
        log.write(f"{version} {step} {da.current_workflow_id()}\n")


def start_and_wait_until_suspended(flow: Callable[[], object]) -> int:
    """``python -m tests.apps.deploy.vN start ID``: start the flow, exit once it is SUSPENDED."""
    _, command, workflow_id = sys.argv
    assert command == "start"
    url = os.environ["DBOS_AGENT_DATABASE_URL"]
    version = os.environ.get("DEPLOY_APP_VERSION") or None
    with da.launch(url, executor_id=f"deploy-{os.getpid()}", suspend_after=0, app_version=version):
        da.start(flow, workflow_id=workflow_id)
        with Inspector(url) as db:
            while db.status(workflow_id) != da.WorkflowStatus.SUSPENDED:
                time.sleep(0.02)
    return 0
