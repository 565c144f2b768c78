"""The coding agent finished by a worker daemon: the module configures its model on import.

A run of ``examples/coding_agent.py`` killed -9 half way is taken over by
``dbos-agent worker --app examples.coding_agent``, as docs/index.md suggests: the worker
imports the module, which picks its model client (here the offline scripted model), and
the tools work in the run's own work directory (a workflow input), not the worker's cwd.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import dbos_agent as da
from dbos_agent.agent.scripted_server import CHANGELOG_LINE
from tests.helpers import new_id, wait_until
from tests.processes import ROOT, start_worker, stop_workers
from tests.support import zygote

EXAMPLE = ROOT / "examples" / "coding_agent.py"


def test_a_worker_finishes_a_crashed_agent_run_in_its_work_directory(
    dbos_agent_database_url: str, tmp_path: Path
) -> None:
    url, task, workdir = dbos_agent_database_url, new_id("worker-agent"), tmp_path / "work"
    env = {k: v for k, v in os.environ.items() if k != "ANTHROPIC_API_KEY"}
    env.update(DBOS_AGENT_DATABASE_URL=url, PYTHONPATH=str(ROOT))
    crashed = zygote.run(
        [
            sys.executable,
            str(EXAMPLE),
            "--task-id",
            task,
            "--workdir",
            str(workdir),
            "--crash-after-turn",
            "2",
        ],
        env=env,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert crashed.returncode == -9, crashed.stdout + crashed.stderr

    worker = start_worker(url, "examples.coding_agent", env={"ANTHROPIC_API_KEY": ""})
    client = da.Client(url)
    try:
        wait_until(
            lambda: client.retrieve(task).status().finished or worker.poll() is not None,
            90,
            "the worker to finish the agent's run",
        )
        info = client.retrieve(task).get_info()
        answer = client.retrieve(task).result(timeout=0)
        steps = client.retrieve(task).steps()
    finally:
        logs = stop_workers([worker])
        client.close()
    assert info.status == da.WorkflowStatus.SUCCESS, logs
    assert info.recovery_attempts == 1  # taken over once, by the worker
    assert "all tests pass now" in answer
    assert [s.name for s in steps].count("anthropic.messages") == 6
    changelog = (workdir / "CHANGELOG.md").read_text()
    assert changelog.count(CHANGELOG_LINE) == 1  # appended in the run's work directory
    assert not (ROOT / "CHANGELOG.md").exists()  # not in the worker's cwd
    assert "Traceback" not in logs
    # its own lines, but not the HTTP client's line per model call (INFO, left out)
    assert " INFO __main__: worker " in logs and " started (session " in logs, logs
    assert "httpx" not in logs and "HTTP Request" not in logs, logs
