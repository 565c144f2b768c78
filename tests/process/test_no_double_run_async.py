"""No workflow runs twice at once, in one process or in two, when a fresh process recovers
a killed one's workflows while it starts, retrieves or calls the same ids itself.

The app (tests/apps/double_app.py) is SIGKILLed half-way through N workflows; a fresh process
under the same executor id launches (recovery at launch picks them up in the background,
every other pass looks every few milliseconds) and at once asks for every id again, several
rounds over: ``da.start``, ``da.retrieve(...).result()`` or a direct call. Some of those
processes are killed half-way too. From the app's log (one ``O_APPEND`` line per event) the
test checks that no body ever started while another run of it was still in its body, and
that no step recorded before a process started ran again in it, nor twice in it.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path

import pytest

import dbos_agent as da
from dbos_agent.testing import Inspector
from tests.helpers import new_id, wait_until
from tests.processes import output
from tests.support import zygote

ROOT = Path(__file__).resolve().parents[2]

#: How many workflows and rounds of asking; a stress run raises them from the environment.
WORKFLOWS = int(os.environ.get("DOUBLE_WORKFLOWS", "40"))
ROUNDS = int(os.environ.get("DOUBLE_ROUNDS", "2"))


@dataclass
class Stress:
    """One database, one log, one executor id: the processes of one test, in turn."""

    url: str
    log: Path
    kind: str
    prefix: str = field(default_factory=lambda: new_id("dbl"))
    executor: str = field(default_factory=lambda: new_id("executor"))
    #: Per process (pid): the steps recorded before it started, which it must not run.
    recorded_before: dict[int, set[tuple[str, int]]] = field(default_factory=dict)

    @property
    def ids(self) -> list[str]:
        return [f"{self.prefix}-{i}" for i in range(WORKFLOWS)]

    def spawn(self, *args: str) -> subprocess.Popen[str]:
        recorded = self.recorded_steps() if self.recorded_before else set()  # none yet
        app = zygote.popen(
            [sys.executable, "-m", "tests.apps.double_app", *args],
            env={
                **os.environ,
                "DBOS_AGENT_DATABASE_URL": self.url,
                "DOUBLE_LOG": str(self.log),
                "DOUBLE_EXECUTOR": self.executor,
                "PYTHONPATH": str(ROOT),
            },
            cwd=ROOT,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        self.recorded_before[app.pid] = recorded
        return app

    def run(self) -> subprocess.Popen[str]:
        """The first process: it has started (recorded) every workflow when this returns."""
        app = self.spawn("run", self.kind, self.prefix, str(WORKFLOWS))
        assert app.stdout is not None
        assert app.stdout.readline() == "started\n", app.communicate()
        return app

    def recover(self, how: str) -> subprocess.Popen[str]:
        return self.spawn("recover", self.kind, how, self.prefix, str(WORKFLOWS), str(ROUNDS))

    def recorded_steps(self) -> set[tuple[str, int]]:
        with Inspector(self.url) as db:
            return {(wid, step.seq) for wid in self.ids for step in db.steps(wid)}

    def steps_run_by(self, pid: int) -> int:
        if not self.log.exists():
            return 0
        prefix = f"{pid} "
        return sum(
            1
            for line in self.log.read_text().splitlines()
            if line.startswith(prefix) and " step " in line
        )

    def kill_half_way(self, app: subprocess.Popen[str]) -> None:
        """SIGKILL ``app`` mid-flight: once it has run as many steps as there are workflows
        (a fifth of them all), or at once if it has ended by itself."""
        wait_until(
            lambda: self.steps_run_by(app.pid) >= WORKFLOWS or app.poll() is not None,
            60,
            "the app to run a share of the steps",
            every=0.01,
        )
        app.kill()
        app.communicate(timeout=30)
        with self.log.open("a") as log:  # its bodies ended here, without a line of their own
            log.write(f"{app.pid} - killed\n")

    def finish(self, *apps: subprocess.Popen[str]) -> None:
        """Every app ends well, and every workflow with SUCCESS."""
        for app in apps:
            try:
                out, err = app.communicate(timeout=120)
            finally:
                if app.poll() is None:
                    app.kill()
                    app.communicate()
            assert app.returncode == 0, output(app, out, err)
            assert "done" in out
        with Inspector(self.url) as db:
            assert set(db.statuses(self.ids).values()) == {da.WorkflowStatus.SUCCESS}


def check_log(stress: Stress) -> dict[str, int]:
    """Assert one run at a time and each recorded step run never again; return counts."""
    live: dict[tuple[int, str], int] = defaultdict(int)
    running_in: dict[str, set[int]] = defaultdict(set)
    step_runs: dict[tuple[int, str, int], int] = defaultdict(int)
    bodies = again = 0
    ran_in: dict[str, set[int]] = defaultdict(set)
    ended: set[tuple[int, str]] = set()
    for line in stress.log.read_text().splitlines():
        pid_text, wid, event, *rest = line.split()
        pid = int(pid_text)
        if event == "killed":
            for key in [key for key in live if key[0] == pid]:
                running_in[key[1]].discard(pid)
                del live[key]
        elif event == "body-start":
            bodies += 1
            again += (pid, wid) in ended
            assert live[pid, wid] == 0, f"{wid} started again in process {pid} while running there"
            assert not running_in[wid], f"{wid} started in {pid} while running in {running_in[wid]}"
            live[pid, wid] += 1
            running_in[wid].add(pid)
            ran_in[wid].add(pid)
        elif event == "body-end":
            live[pid, wid] -= 1
            assert live[pid, wid] == 0, f"{wid} ended in {pid} more often than it started"
            running_in[wid].discard(pid)
            ended.add((pid, wid))
        else:
            seq = int(rest[0])
            assert (wid, seq) not in stress.recorded_before[pid], (
                f"step {seq} of {wid} ran again in {pid} after it was recorded"
            )
            step_runs[pid, wid, seq] += 1
            assert step_runs[pid, wid, seq] == 1, f"step {seq} of {wid} ran twice in {pid}"
    return {
        "bodies": bodies,
        "again_in_one_process": again,
        "continued_elsewhere": sum(len(pids) > 1 for pids in ran_in.values()),
        "step_runs": len(step_runs),
    }


#: (workflow kind, how the recovering process asks for the ids, how many recover at once:
#: with two, the killed one before them recovered alone)
CASES = [
    ("async", "start", 1),
    ("async", "retrieve", 1),
    ("async", "call", 1),
    ("async", "start", 2),
    ("sync", "call", 1),
    ("sync", "start", 2),
]


@pytest.mark.parametrize(("kind", "how", "processes"), CASES)
def test_a_recovering_process_that_asks_for_the_same_ids_runs_each_body_once_at_a_time(
    kind: str, how: str, processes: int, dbos_agent_database_url: str, tmp_path: Path
) -> None:
    stress = Stress(dbos_agent_database_url, tmp_path / "double.log", kind)
    stress.kill_half_way(stress.run())
    stress.kill_half_way(stress.recover(how))  # a recovering process dies half-way too
    stress.finish(*(stress.recover(how) for _ in range(processes)))
    counts = check_log(stress)
    assert counts["continued_elsewhere"] > 0, counts  # the kills did cut workflows off
