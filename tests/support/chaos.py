"""The chaos scenario: two workers and an application process under every fault at once.

Run by tests/process/test_chaos.py at a size that fits the suite, and from the command line at
any size (``python -m tests.support.chaos --workflows 60 --steps 80``), against a throwaway
local server of its own. The faults, in order, each once the work has moved on:
Postgres restarted ``-m immediate``, every session connection killed, every pooled
connection killed, another restart, one worker paused (SIGSTOP) past its lease and
woken, the other worker killed -9 (and a new one started), a last restart.

What it checks, from the database and from the side-effect log of fault_app.py:
every workflow SUCCESS with the right output; every step recorded exactly once;
two processes never run steps of one workflow at overlapping times (but for the
step a paused or a killed process was in); and every step that ran twice was in
flight in the killed or the paused worker when that happened.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter, defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import psycopg

import dbos_agent as da
from dbos_agent.testing import Inspector, RestartablePostgres
from tests.apps.fault_app import expected, read_log
from tests.helpers import wait_until
from tests.processes import ROOT, kill9, start_worker
from tests.support import zygote


@dataclass
class ChaosReport:
    """What happened, for the assertions and for people."""

    workflows: int = 0
    steps_recorded: int = 0
    step_starts: int = 0
    rerun_steps: int = 0
    faults: list[str] = field(default_factory=list)
    seconds: float = 0.0
    max_recovery_attempts: int = 0
    problems: list[str] = field(default_factory=list)

    def as_json(self) -> str:
        return json.dumps(self.__dict__)


def _env(url: str, log: Path, step_seconds: float, per_process: int) -> dict[str, str]:
    return dict(
        os.environ,
        DBOS_AGENT_DATABASE_URL=url,
        FAULT_APP_LOG=str(log),
        FAULT_APP_STEP_SECONDS=str(step_seconds),
        CHAOS_PER_PROCESS=str(per_process),
        PYTHONPATH=str(ROOT),
    )


def _worker(env: dict[str, str], lease: float) -> subprocess.Popen[str]:
    args = ("--quiet", "--poll", "0.3", "--lease", str(lease), "--workers", "32")
    return start_worker(env["DBOS_AGENT_DATABASE_URL"], "tests.apps.fault_app", *args, env=env)


_log_lines = read_log


def run_chaos(
    server: RestartablePostgres,
    *,
    workflows: int = 12,
    steps: int = 40,
    app_workflows: int = 4,
    step_seconds: float = 0.05,
    lease: float = 3.0,
    work_dir: Path,
) -> ChaosReport:
    """Run the scenario on a fresh database of ``server``; the report lists any problem."""
    report = ChaosReport()
    started = time.monotonic()
    log = work_dir / "chaos-steps.log"
    log.write_text("")
    with server.database() as url:
        # a third of the queue per process: both workers and the application get some
        env = _env(url, log, step_seconds, per_process=max(1, -(-workflows // 3)))
        queued = [f"chaos-{i}" for i in range(workflows)]
        with da.Client(url) as client:
            for i, wid in enumerate(queued):
                name = "chain" if i % 2 == 0 else "paced"
                client.enqueue("chaos", name, wid, steps, workflow_id=wid)
        first, second = _worker(env, lease), _worker(env, lease)
        app = zygote.popen(
            [sys.executable, "-m", "tests.apps.fault_app", "app", str(app_workflows), str(steps)],
            env=env,
            cwd=ROOT,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        app_ids = [f"app-{i}" for i in range(app_workflows)]
        procs = [first, second]
        total = (workflows + app_workflows) * steps

        def progressed(share: float) -> Callable[[], bool]:
            return lambda: sum(1 for r in _log_lines(log) if r[0] == "S") >= share * total

        def fault(name: str, at: float, action: Callable[[], object]) -> None:
            wait_until(progressed(at), 120, f"{at:.0%} of the steps before: {name}")
            action()
            report.faults.append(f"{name} at {sum(1 for r in _log_lines(log) if r[0] == 'S')}")

        paused_at = woke_at = killed_at = 0.0
        try:
            fault("restart", 0.05, server.restart)
            fault(
                "kill session connections",
                0.10,
                lambda: server.terminate(url, "dbos_agent_session"),
            )
            fault("kill pooled connections", 0.15, lambda: server.terminate(url, "dbos_agent"))
            fault("restart", 0.20, server.restart)

            def pause() -> None:
                nonlocal paused_at, woke_at
                second.send_signal(signal.SIGSTOP)
                wait_until(lambda: _stopped(second.pid), 10, "the worker to stop")
                paused_at = time.time()  # its threads may run a moment after the signal
                # Paused until its lease ran out (in the database's time: the other
                # processes' clock, which no test hook moves) and its workflows were
                # taken over: what it meets when it wakes.
                wait_until(lambda: _taken_over(url, second.pid), 60, "its workflows taken over")
                second.send_signal(signal.SIGCONT)
                woke_at = time.time()

            fault("pause a worker past its lease", 0.30, pause)

            def kill() -> None:
                nonlocal killed_at
                killed_at = kill9(first)
                procs.append(_worker(env, lease))

            # the paused worker is back (its session alive again); the other one holds
            # most work now
            wait_until(lambda: _alive(url, second.pid), 30, "the woken worker's session back")
            fault("kill -9 a worker", 0.0, kill)
            wait_until(lambda: _taken_over(url, first.pid), 60, "the killed one's work taken over")
            fault("restart", 0.0, server.restart)
            out, err = app.communicate(timeout=300)
            if app.returncode != 0:
                report.problems.append(f"the application process failed: {err[-2000:]}")
            else:
                results = json.loads(out.strip().splitlines()[-1])
                if results != {wid: expected(steps) for wid in app_ids}:
                    report.problems.append(f"wrong application results: {results}")
            ids = queued + app_ids
            wait_until(lambda: _finished(url, ids), 300, "every workflow to finish")
        finally:
            if app.poll() is None:
                app.kill()
            for p in procs:
                if p.poll() is None:
                    p.send_signal(signal.SIGCONT)
                    p.send_signal(signal.SIGTERM)
            for p in procs:
                try:
                    p.communicate(timeout=60)
                except subprocess.TimeoutExpired:
                    p.kill()
        _check(url, ids, steps, log, report, first.pid, killed_at, second.pid, paused_at)
    report.seconds = round(time.monotonic() - started, 1)
    return report


def _stopped(pid: int) -> bool:
    """Whether every thread of ``pid`` is stopped (state T in /proc)."""
    tasks = Path(f"/proc/{pid}/task")
    states = []
    for task in tasks.iterdir():
        stat = (task / "stat").read_text()
        states.append(stat[stat.rfind(")") + 2])
    return bool(states) and all(state in "tT" for state in states)


def _session(url: str, pid: int) -> tuple[bool, int]:
    """The session of the worker ``pid``: whether it is alive by the database's rules
    (not past its lease, nor without its lock past its grace), and how many PENDING
    workflows it owns."""
    with psycopg.connect(url) as conn:
        row = conn.execute(
            "SELECT EXISTS (SELECT 1 FROM dbos_agent.executors WHERE pid = %(pid)s"
            "               AND session_key NOT IN (SELECT dbos_agent.dead_sessions())),"
            " (SELECT count(*) FROM dbos_agent.workflows AS w"
            "  JOIN dbos_agent.executors AS e ON e.session_key = w.owner_key"
            "  WHERE e.pid = %(pid)s AND w.status = 'PENDING')",
            {"pid": pid},
        ).fetchone()
    assert row is not None
    return bool(row[0]), int(str(row[1]))


def _alive(url: str, pid: int) -> bool:
    """Whether the worker ``pid`` heartbeats again (its session is alive)."""
    return _session(url, pid)[0]


def _taken_over(url: str, pid: int) -> bool:
    """Whether the session of the worker ``pid`` is dead and owns no PENDING workflow any
    more: others took over what it ran."""
    return _session(url, pid) == (False, 0)


def _finished(url: str, ids: list[str]) -> bool:
    with Inspector(url) as db:
        return db.all_finished(ids)


def _check(
    url: str,
    ids: list[str],
    steps: int,
    log: Path,
    report: ChaosReport,
    killed_pid: int,
    killed_at: float,
    paused_pid: int,
    paused_at: float,
) -> None:
    with Inspector(url) as db:
        found = {wid: (info, db.steps(wid)) for wid in ids if (info := db.workflow(wid))}
    report.workflows = len(found)
    for wid, (info, recorded) in found.items():
        seqs = [s.seq for s in recorded]
        report.steps_recorded += len(seqs)
        report.max_recovery_attempts = max(report.max_recovery_attempts, info.recovery_attempts)
        if (info.status, info.output) != (da.WorkflowStatus.SUCCESS, expected(steps)):
            report.problems.append(f"{wid}: {info.status} {info.output}")
        if seqs != list(range(steps)):
            report.problems.append(f"{wid}: recorded steps {seqs}")
    if len(found) != len(ids):
        report.problems.append(f"{len(ids) - len(found)} workflows are missing")
    lines = _log_lines(log)
    starts = [r for r in lines if r[0] == "S"]
    report.step_starts = len(starts)
    by_step: dict[tuple[str, int], list[tuple[float, int]]] = defaultdict(list)
    for _, pid, wid, seq, at in starts:
        by_step[(wid, seq)].append((at, pid))
    for (wid, seq), runs in by_step.items():
        runs.sort()
        for at, pid in runs[:-1]:  # every run but the last was cut off by a fault
            report.rerun_steps += 1
            cut_by_kill = pid == killed_pid and at < killed_at
            cut_by_pause = pid == paused_pid and at < paused_at
            if not (cut_by_kill or cut_by_pause):
                report.problems.append(
                    f"{wid} step {seq} ran again although it was not in flight at a "
                    f"kill or a pause (pid {pid} at {at:.3f})"
                )
    # No two processes ran one workflow at once: step executions of a workflow by
    # different processes never overlap, but for the step a process was in when it was
    # paused (it resumes into a step another process redid) or killed.
    ended = {(pid, wid, seq): at for kind, pid, wid, seq, at in lines if kind == "E"}
    spans: dict[str, list[tuple[float, float, int]]] = defaultdict(list)
    for _, pid, wid, seq, at in starts:
        end = ended.get((pid, wid, seq), killed_at if pid == killed_pid else at)
        spans[wid].append((at, end, pid))
    for wid, executions in spans.items():
        executions.sort()
        for (start_a, end_a, pid_a), (start_b, _, pid_b) in itertools.pairwise(executions):
            overlap = pid_a != pid_b and start_b < end_a
            frozen = pid_a == paused_pid and start_a < paused_at
            if overlap and not frozen:
                report.problems.append(
                    f"{wid} ran in two processes at once: {pid_a} from {start_a:.3f} to "
                    f"{end_a:.3f}, {pid_b} from {start_b:.3f}"
                )
    counts = Counter(pid for _, pid, _, _, _ in starts)
    if len(counts) < 3:
        report.problems.append(f"expected the work spread over 3+ processes: {dict(counts)}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workflows", type=int, default=40)
    parser.add_argument("--steps", type=int, default=150)
    parser.add_argument("--app-workflows", type=int, default=8)
    parser.add_argument("--step-seconds", type=float, default=0.1)
    parser.add_argument("--lease", type=float, default=3.0)
    args = parser.parse_args()
    from dbos_agent.postgres.throwaway import LocalCluster

    cluster = LocalCluster.start()
    try:
        with tempfile.TemporaryDirectory() as work:
            report = run_chaos(
                RestartablePostgres(cluster),
                workflows=args.workflows,
                steps=args.steps,
                app_workflows=args.app_workflows,
                step_seconds=args.step_seconds,
                lease=args.lease,
                work_dir=Path(work),
            )
    finally:
        cluster.stop()
    print(report.as_json())
    return 1 if report.problems else 0


if __name__ == "__main__":
    raise SystemExit(main())
