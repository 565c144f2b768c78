"""The workload of the failover tests (tests/process/test_standby_failover.py, whose test promotes a
standby itself, and tests/process/test_auto_failover.py, where pg_auto_failover does): two worker
processes on a multi-host URL with ``target_session_attrs=read-write`` share workflows of
fault_app, whose steps log to a file; one of the workers is paused (SIGSTOP) across the
promotion, the way a GC pause or a starved CPU holds a process, and goes on after its
peer's take-over passes began to judge it on the new primary.

What the tests assert, counted from outside (the step log) and in the database: no
workflow is taken over or changes process, no step runs twice, every workflow finishes.
"""

from __future__ import annotations

import signal
import subprocess
import time
from collections import Counter, defaultdict
from pathlib import Path
from types import TracebackType
from typing import Self

import psycopg

import dbos_agent as da
from dbos_agent.testing import Inspector
from tests.apps.fault_app import expected, read_log
from tests.helpers import migrate, new_id, wait_until
from tests.processes import start_worker, stop_workers

#: The workers' lease and grace: the outage lasts longer than this.
LEASE_S = 3.0
#: The paused worker goes on this long after its peer's take-over passes began to judge it.
PAUSED_AFTER_S = 1.0
#: Each worker dequeues at most this many of the queue's workflows (fault_app's chaos
#: queue), so the work is split between the two, and each has room to take over the
#: other's (16 worker slots): a take-over is bounded by the taker's room.
PER_WORKER = 6
STEPS = 20


def _runners(log: Path) -> dict[str, set[int]]:
    """The processes that started steps of each workflow."""
    runners: dict[str, set[int]] = defaultdict(set)
    for kind, pid, wid, _, _ in read_log(log):
        if kind == "S":
            runners[wid].add(pid)
    return runners


def _starts(log: Path) -> Counter[str]:
    """How many steps of each workflow started."""
    return Counter(wid for kind, _, wid, _, _ in read_log(log) if kind == "S")


def write_timeline(url: str) -> int:
    """The timeline the server writes on (1 until a promotion), asked without the schema."""
    with psycopg.connect(url, autocommit=True) as conn:
        row = conn.execute("SELECT left(pg_walfile_name(pg_current_wal_lsn()), 8)").fetchone()
    assert row is not None
    return int(row[0], 16)


class FailoverWorkload:
    """Entered: the schema on ``url``, two workers up, each running its share of the
    workflows, every workflow a few steps in. Left: the workers stopped (their output
    printed, which pytest shows if the test fails); then :meth:`assert_nothing_moved`."""

    def __init__(self, url: str, log: Path, *, outage_timeout: float | None = None) -> None:
        self.url = url
        self.log = log
        self.ids = [new_id("failover") for _ in range(2 * PER_WORKER)]
        self._outage_timeout = outage_timeout
        self._workers: list[subprocess.Popen[str]] = []
        self._runners: dict[str, set[int]] = {}
        self._attempts: dict[str, int] | None = None
        self._logs = ""
        self._db: Inspector | None = None

    @property
    def db(self) -> Inspector:
        """What the database holds (the Inspector's connections follow the failover)."""
        assert self._db is not None, "enter the workload first"
        return self._db

    @property
    def paused(self) -> subprocess.Popen[str]:
        """The worker to pause; its peer runs on through the failover."""
        return self._workers[0]

    def __enter__(self) -> Self:
        self.log.touch()
        migrate(self.url)
        self._workers = [self._worker(), self._worker()]
        try:
            self._db = Inspector(self.url)
            wait_until(lambda: len(self.db.locked_sessions()) == 2, 30, "both workers up")
            with da.Client(self.url) as client:
                for wid in self.ids:
                    client.enqueue("chaos", "chain", wid, STEPS, workflow_id=wid)
            wait_until(
                lambda: all(_starts(self.log)[wid] >= 3 for wid in self.ids),
                30,
                "every workflow under way",
            )
            self._runners = _runners(self.log)
            mine = [wid for wid in self.ids if self._runners[wid] == {self.paused.pid}]
            assert len(mine) == PER_WORKER, self._runners  # the paused worker has its share
        except BaseException:
            self.__exit__(None, None, None)
            raise
        return self

    def _worker(self) -> subprocess.Popen[str]:
        lease = str(LEASE_S)
        extra = ["--lease", lease, "--session-grace", lease, "--workers", "16"]
        if self._outage_timeout is not None:
            extra += ["--outage-timeout", str(self._outage_timeout)]
        return start_worker(
            self.url,
            "tests.apps.fault_app",
            *extra,
            env={
                "FAULT_APP_LOG": str(self.log),
                "FAULT_APP_STEP_SECONDS": "0.1",
                "CHAOS_PER_PROCESS": str(PER_WORKER),
            },
        )

    def resume_once_judged(self) -> None:
        """Once the peer is back on the new primary and its take-over passes judged the
        paused worker, let more of them judge it (every 0.2 s), then SIGCONT it."""
        wait_until(lambda: len(self.db.locked_sessions()) == 1, 60, "the peer back on a primary")
        wait_until(lambda: self._judged(self.paused.pid), 30, "the peer judging it")
        # The pause goes on: more of the peer's take-over passes judge it.
        time.sleep(PAUSED_AFTER_S)
        self.paused.send_signal(signal.SIGCONT)

    def _judged(self, pid: int) -> bool:
        """Whether a take-over pass judged the session of process ``pid``: the pass stamps
        lock_lost_at on a session it sees without its lock (or, once it took everything the
        session owned, forgets the session if it is dead)."""
        with psycopg.connect(self.url, autocommit=True) as conn:
            row = conn.execute(
                "SELECT lock_lost_at IS NOT NULL FROM dbos_agent.executors WHERE pid = %s", (pid,)
            ).fetchone()
        return row is None or bool(row[0])

    def wait_finished(self) -> None:
        """Every workflow finished with its result, every step recorded once."""
        wait_until(lambda: self.db.all_finished(self.ids), 60, "every workflow finished")
        for wid in self.ids:
            info = self.db.workflow(wid)
            assert info is not None
            assert (info.status, info.output) == (da.WorkflowStatus.SUCCESS, expected(STEPS))
            assert [s.seq for s in self.db.steps(wid)] == list(range(STEPS)), wid
        self._attempts = self.db.recovery_attempts(self.ids)

    def assert_nothing_moved(self) -> None:
        """No workflow was taken over or changed process, no step ran twice."""
        assert "Traceback" not in self._logs
        assert self._attempts == dict.fromkeys(self.ids, 0), "a workflow was taken over"
        assert _runners(self.log) == self._runners, "a workflow changed process"
        starts = Counter((wid, seq) for kind, _, wid, seq, _ in read_log(self.log) if kind == "S")
        assert set(starts.values()) == {1}, "a step ran twice"

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        try:
            if self._db is not None:
                self._db.close()
        finally:
            self._logs = stop_workers(self._workers)
            print(self._logs)  # pytest shows it if the test fails
