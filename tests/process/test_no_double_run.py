"""No workflow runs twice at once in one process: a stress test of the passes that pick
workflows up (the waker, the take-back of what the process owns but does not run), made to
run every few milliseconds against thousands of wake-ups, counted from outside."""

from __future__ import annotations

import os
import subprocess
import sys
from collections import Counter
from pathlib import Path

import dbos_agent as da
from dbos_agent.testing import Inspector
from tests.helpers import new_id, wait_until
from tests.processes import output
from tests.support import zygote

ROOT = Path(__file__).resolve().parents[2]

WORKFLOWS = 500
ROUNDS = 6


def test_thousands_of_wakes_with_every_pass_running_every_few_ms_run_each_step_once(
    dbos_agent_database_url: str, tmp_path: Path
) -> None:
    url, log = dbos_agent_database_url, tmp_path / "race.log"
    prefix = new_id("race")
    ids = [f"{prefix}-{i}" for i in range(WORKFLOWS)]
    app = zygote.popen(
        [sys.executable, "-m", "tests.apps.race_app", prefix, str(WORKFLOWS), str(ROUNDS)],
        env={
            **os.environ,
            "DBOS_AGENT_DATABASE_URL": url,
            "RACE_LOG": str(log),
            "PYTHONPATH": str(ROOT),
        },
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        with Inspector(url) as db, da.Client(url) as client:
            for round_ in range(ROUNDS):
                # every workflow has done this round's step and waits, suspended
                wait_until(
                    lambda: set(db.statuses(ids).values()) == {da.WorkflowStatus.SUSPENDED},
                    120,
                    f"all {WORKFLOWS} workflows to suspend in round {round_}",
                )
                for wid in ids:
                    client.send(wid, round_, topic="go")
            wait_until(lambda: db.all_finished(ids), 120, "every workflow to finish")
            assert set(db.statuses(ids).values()) == {da.WorkflowStatus.SUCCESS}
        _out, err = app.communicate(timeout=60)
        assert app.returncode == 0, output(app, _out, err)
    finally:
        if app.poll() is None:
            app.kill()
            app.communicate()
    runs = Counter(tuple(line.split()[1:]) for line in log.read_text().splitlines())
    twice = {key: count for key, count in runs.items() if count > 1}
    assert not twice, f"{len(twice)} steps ran more than once: {sorted(twice.items())[:10]}"
    assert len(runs) == WORKFLOWS * ROUNDS
