"""check-deploy cannot be fooled by the code it checks: an app module that exits, hangs,
crashes, leaves a thread running, launches a runtime or writes when it is imported fails
the check (exit 2, one line, a JSON error document with --json), and nothing is written.

Each case is a real ``dbos-agent check-deploy`` process against one database that holds
an agent waiting in ``recv``; they run side by side, and the database is compared row by
row before and after them all.
"""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from tests.helpers import cli, dbos_agent_rows, migrated_database
from tests.processes import output

HEAD = """\
import os, signal, sys, threading
import dbos_agent as da

@da.durable_workflow(name="isolation.flow")
def flow() -> str:
    return str(da.recv("go", timeout=None))
"""

#: app module -> (its module-level code after HEAD, the line check-deploy must print)
CASES = {
    "exits": ("sys.exit(0)", "the app module 'exits' called sys.exit(0) while it was imported"),
    "hard_exit": (
        "os._exit(0)",
        "the check's process exited with status 0 while it imported the app module 'hard_exit'",
    ),
    "hangs": (
        "threading.Event().wait()",
        "the app module 'hangs' was not imported within 1s (--timeout)",
    ),
    "stray_thread": (
        "threading.Thread(target=threading.Event().wait, name='poller').start()",
        "the app module 'stray_thread' started 1 non-daemon thread(s) when it was imported "
        "that did not end within 1s (--timeout) (poller)",
    ),
    "launches": (
        "da.launch()",
        "launch() is refused while check-deploy imports the app module 'launches'",
    ),
    "launches_anyway": (  # refused, it goes on with a client: the database only reads
        "try:\n    da.launch()\nexcept da.DbosAgentError:\n    pass\n"
        "da.Client().enqueue('q', 'isolation.flow')",
        "cannot import the app module 'launches_anyway': WriteRefusedError: refused to ",
    ),
    "writes": (
        "import psycopg\n"
        "with psycopg.connect(os.environ['DBOS_AGENT_DATABASE_URL'], autocommit=True) as c:\n"
        "    c.execute(\"INSERT INTO dbos_agent.events VALUES ('x', 'k', '1')\")",
        "ReadOnlySqlTransaction: cannot execute INSERT in a read-only transaction",
    ),
    "crashes": (
        "import resource\nresource.setrlimit(resource.RLIMIT_CORE, (0, 0))\n"
        "os.kill(os.getpid(), signal.SIGSEGV)",
        "the check's process was killed by SIGSEGV while it imported the app module 'crashes'",
    ),
    "fits": (  # the control: the same setup passes (a thread that ends is no matter)
        "threading.Thread(target=lambda: None).start()",
        None,
    ),
}


@pytest.fixture(scope="module")
def checked(
    dbos_agent_postgres_url: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[dict[str, subprocess.CompletedProcess[str]], bool]]:
    """Every case's check, run side by side; and whether the database was left as it was."""
    folder = tmp_path_factory.mktemp("apps")
    for name, (body, _) in CASES.items():
        (folder / f"{name}.py").write_text(HEAD + body + "\n")
    with migrated_database(dbos_agent_postgres_url) as url:
        with __import__("psycopg").connect(url, autocommit=True) as conn:
            conn.execute(
                "INSERT INTO dbos_agent.workflows (workflow_id, name, status, inputs, "
                "executor_id, max_recovery_attempts, wait_kind, wait_target, wait_name) "
                "VALUES ('waiting', 'isolation.flow', 'SUSPENDED', '{}', 'elsewhere', 5, "
                "'recv', 'waiting', 'go')"
            )
            conn.execute(
                "INSERT INTO dbos_agent.steps (workflow_id, seq, name, status, inputs, "
                "started_at, finished_at) VALUES ('waiting', 0, 'dbos_agent.recv', 'PENDING',"
                ' \'{"topic": "go", "deadline": null}\', now(), NULL)'
            )
        before = dbos_agent_rows(url)

        def run(name: str) -> subprocess.CompletedProcess[str]:
            timeout = ["--timeout", "1"] if name in ("hangs", "stray_thread") else []
            return cli(url, "check-deploy", "--app", name, "--json", *timeout, cwd=folder,
                       timeout=30)  # fmt: skip

        with ThreadPoolExecutor(3) as pool:
            results = dict(zip(CASES, pool.map(run, CASES), strict=True))
        yield results, dbos_agent_rows(url) == before


@pytest.mark.parametrize("name", [n for n, (_, line) in CASES.items() if line is not None])
def test_an_app_that_misbehaves_at_import_fails_the_check(
    checked: tuple[dict[str, subprocess.CompletedProcess[str]], bool], name: str
) -> None:
    result = checked[0][name]
    shown = (result.returncode, result.stdout, result.stderr)
    assert result.returncode == 2, shown
    error = json.loads(result.stdout)
    assert sorted(error) == ["error", "type"] and error["type"] == "DeployCheckError", shown
    line = CASES[name][1]
    assert line is not None and line in error["error"], shown
    assert result.stderr.endswith(f"dbos-agent: error: {error['error']}\n"), shown
    assert "Traceback" not in result.stderr, shown


def test_the_same_check_passes_for_an_app_that_behaves(
    checked: tuple[dict[str, subprocess.CompletedProcess[str]], bool],
) -> None:
    result = checked[0]["fits"]
    assert result.returncode == 0, output(result)
    report = json.loads(result.stdout)
    assert (report["fits"], report["checked"]) == (True, 1), report


def test_no_check_wrote_anything(
    checked: tuple[dict[str, subprocess.CompletedProcess[str]], bool],
) -> None:
    assert checked[1], "the dbos_agent schema changed during the checks"


def test_a_bad_histories_file_is_named_by_line_from_the_check(
    dbos_agent_postgres_url: str, tmp_path: Path
) -> None:
    (tmp_path / "app.py").write_text(HEAD)
    bad = tmp_path / "histories.jsonl"
    bad.write_bytes(b'{"format": "dbos_agent.history/1", "workflow": {"name": "\xff"}}\n')
    with migrated_database(dbos_agent_postgres_url) as url:
        result = cli(url, "check-deploy", "--app", "app", "--histories", str(bad), cwd=tmp_path)
    assert result.returncode == 1, output(result)
    assert result.stderr == (
        f"dbos-agent: error: {bad}, line 1: not UTF-8 text (byte 0xff at column 58)\n"
    )
