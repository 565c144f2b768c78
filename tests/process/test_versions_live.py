"""``dbos-agent versions`` lists live sessions only, each with its code version, with
real worker processes: three builds of one application launched without an application
version are told apart, and a process killed -9 drops out at once, although no process is
left to end its session and its lease has ten minutes to run."""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import psycopg

from tests.helpers import cli, migrated_database, ok, wait_until
from tests.processes import ROOT, output, start_worker, stop_workers
from tests.support import zygote

#: One build of the application: the builds differ in their source, so in code version.
APP = '''"""A build of the application the versions test runs (build {build})."""

import dbos_agent as da


@da.durable_workflow
def report(n: int) -> str:
    return f"build {build}: {{n}}"
'''


def start_build(url: str, tmp_path: Path, build: int) -> subprocess.Popen[str]:
    """A worker running build ``build`` of ``versions_app``, with a ten-minute lease."""
    folder = tmp_path / f"build{build}"
    folder.mkdir()
    (folder / "versions_app.py").write_text(APP.format(build=build))
    path = f"{folder}{os.pathsep}{ROOT}"
    return start_worker(url, "versions_app", "--lease", "600", env={"PYTHONPATH": path})


def code_version_of(url: str, tmp_path: Path, build: int) -> str:
    """The code version ``check-deploy`` reports for a build: what an operator compares
    with the sessions ``versions`` lists."""
    env = {**os.environ, "DBOS_AGENT_DATABASE_URL": url}
    env["PYTHONPATH"] = f"{tmp_path / f'build{build}'}{os.pathsep}{ROOT}"
    result = zygote.run(
        [sys.executable, "-m", "dbos_agent", "check-deploy", "--app", "versions_app", "--json"],
        capture_output=True,
        text=True,
        env=env,
        cwd=ROOT,
        timeout=60,
    )
    assert result.returncode == 0, output(result)
    return str(json.loads(result.stdout)["code_version"])


def versions(url: str) -> list[dict[str, Any]]:
    document: list[dict[str, Any]] = json.loads(ok(cli(url, "versions", "--json")))
    return document


def cells(codes: list[str]) -> list[str]:
    """The words of a CODE VERSIONS cell where each code version has one session."""
    return ", ".join(f"{code} (1)" for code in sorted(codes)).split()


def live_pids(url: str) -> set[int]:
    return {s["pid"] for v in versions(url) for s in v["sessions"]}


def test_versions_tells_builds_apart_and_leaves_out_a_process_killed_9(
    dbos_agent_postgres_url: str, tmp_path: Path
) -> None:
    host = socket.gethostname()
    with migrated_database(dbos_agent_postgres_url) as url:  # the CLI reads it at once
        workers = [start_build(url, tmp_path, build) for build in (1, 2, 3)]
        try:
            pids = [w.pid for w in workers]
            wait_until(lambda: live_pids(url) == set(pids), 60, "three workers' sessions")
            codes = [code_version_of(url, tmp_path, build) for build in (1, 2, 3)]
            assert len(set(codes)) == 3 and all(re.fullmatch("[0-9a-f]{16}", c) for c in codes)

            [row] = versions(url)
            assert (row["app_version"], row["live_sessions"]) == (None, 3)
            assert {s["pid"]: s["code_version"] for s in row["sessions"]} == dict(
                zip(pids, codes, strict=True)
            )
            assert row["code_versions"] == [
                {"code_version": code, "sessions": 1} for code in sorted(codes)
            ]
            table = ok(cli(url, "versions")).splitlines()
            assert table[0].split()[-4:] == ["LIVE", "SESSIONS", "CODE", "VERSIONS"]
            assert table[1].split() == ["(none)", "0", "0", "0", "0", "0", "3", *cells(codes)]
            assert table[2] == (
                "note: application version (none) is served by 3 code versions; any of them "
                "may recover its workflows (one whose code does not fit a workflow's log "
                "holds it DIVERGED)"
            )
            wide = ok(cli(url, "versions", "--wide")).splitlines()
            assert wide[0].split()[-2:] == ["EXECUTOR@HOST:PID", "CODE"]
            for pid, code in zip(pids, codes, strict=True):
                assert f"@{host}:{pid} {code}" in wide[1]

            # The first two pause (their sessions hold their locks: live); the third is
            # killed -9, and no process is left running to end its session.
            for paused in workers[:2]:
                paused.send_signal(signal.SIGSTOP)
            victim = workers[2]
            victim.kill()
            victim.wait(10)
            wait_until(lambda: live_pids(url) == set(pids[:2]), 30, "the killed one to drop out")
            with psycopg.connect(url) as conn:  # by the database's rules alone, still live
                dead = conn.execute(
                    "SELECT session_key IN (SELECT dbos_agent.dead_sessions())"
                    " FROM dbos_agent.executors WHERE pid = %s",
                    (victim.pid,),
                ).fetchone()
            assert dead == (False,)
            [row] = versions(url)
            assert row["code_versions"] == [
                {"code_version": code, "sessions": 1} for code in sorted(codes[:2])
            ]
            table = ok(cli(url, "versions")).splitlines()
            assert table[1].split()[6:] == ["2", *cells(codes[:2])]
            assert codes[2] not in "\n".join(table)
        finally:
            stderr = stop_workers(workers)
            print(f"the workers' stderr:\n{stderr}")  # shown when the test fails
        assert "Traceback" not in stderr, stderr
