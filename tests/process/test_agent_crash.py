"""kill -9 the example coding agent at every turn boundary, mid-model-call and mid-tool-call.

Each case runs ``examples/coding_agent.py`` as a subprocess against the session database and
its own scripted server subprocess (``python -m dbos_agent.agent.scripted_server``), kills
it with SIGKILL, runs the same command again, and then checks, from the server's JSONL
request log and from the file system, that:

* no model call that had completed (checkpointed) was paid for twice;
* the final answer equals an uninterrupted run's;
* ``calc.py`` was fixed and the CHANGELOG line (the guarded, non-idempotent ``echo >>``)
  appears exactly once.

All cases run concurrently (first runs, then resumes) to keep the wall time down.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from dbos_agent.agent.scripted_server import CHANGELOG_LINE
from dbos_agent.testing import Inspector
from tests.helpers import wait_until
from tests.support import zygote

pytestmark = pytest.mark.long  # many processes, a minute or more: started first

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "coding_agent.py"
TURNS = 6  # the scripted coding task: 5 tool turns and a final answer
RUN_TIMEOUT = 60.0


@dataclass
class Attempt:
    """One run of the agent command: how it is cut short, and what it must replay."""

    flags: list[str] = field(default_factory=list)
    kill_when: Callable[[Path], bool] | None = None  # external kill -9 once true
    slow_tests: bool = False  # `python3 test_calc.py` takes 2 s (to kill during it)
    replayed: int | None = None  # steps this run must replay (None: a fresh run)

    @property
    def killed(self) -> bool:
        return bool(self.flags) or self.kill_when is not None


@dataclass
class Case:
    """Runs of the same command (same workflow id) until one finishes."""

    name: str
    attempts: list[Attempt]
    chunk_delay: float = 0.0
    paid_twice: int | None = None  # the turn whose in-flight call is paid again


def log_lines(log: Path) -> list[dict[str, Any]]:
    if not log.exists():
        return []
    return [json.loads(line) for line in log.read_text().splitlines() if line.strip()]


def model_call_streaming(turn: int) -> Callable[[Path], bool]:
    """True once the server has answered turn ``turn`` (200) and is still streaming it."""
    messages = 1 + 2 * turn

    def check(case_dir: Path) -> bool:
        return any(
            line["messages"] == messages and line["status"] == 200
            for line in log_lines(case_dir / "requests.jsonl")
        )

    return check


def calc_tests_started(case_dir: Path) -> bool:
    return (case_dir / "tests-started").exists()


def after_turn(n: int) -> list[str]:
    return ["--crash-after-turn", str(n)]


CASES = [
    Case("uninterrupted", [Attempt()]),
    # killed at every turn boundary in turn: each run resumes, goes live, dies again
    Case(
        "every-turn-boundary",
        [Attempt(after_turn(0))]
        + [Attempt(after_turn(n), replayed=2 * n) for n in range(1, TURNS)]
        + [Attempt(replayed=2 * TURNS - 1)],
    ),
    # killed while a tool runs (the tests, 2 s) and while turn 3's reply is streaming
    Case(
        "mid-tool-then-mid-model-call",
        [
            Attempt(kill_when=calc_tests_started, slow_tests=True),
            Attempt(kill_when=model_call_streaming(3), replayed=3),
            Attempt(replayed=6),
        ],
        chunk_delay=0.05,
        paid_twice=3,
    ),
    # killed inside a tool after it acted, before its checkpoint: the in-doubt window
    Case(
        "in-tool-after-effect",
        [
            Attempt(["--crash-in-tool", "1"]),  # after running the tests
            Attempt(["--crash-in-tool", "4"], replayed=3),  # after the CHANGELOG append
            Attempt(replayed=9),
        ],
    ),
]


@dataclass
class Run:
    returncode: int
    stdout: str


@dataclass
class Result:
    case: Case
    dir: Path
    runs: list[Run] = field(default_factory=list)

    @property
    def task_id(self) -> str:
        return f"crash-{self.case.name}-{self.dir.name}"


def start_server(case: Case, case_dir: Path) -> tuple[subprocess.Popen[bytes], str]:
    port_file = case_dir / "port"
    cmd = [
        sys.executable,
        "-m",
        "dbos_agent.agent.scripted_server",
        "--scenario",
        "coding_task",
        "--workdir",
        str(case_dir / "work"),
        "--seed",
        "--port",
        "0",
        "--port-file",
        str(port_file),
        "--log",
        str(case_dir / "requests.jsonl"),
    ]
    if case.chunk_delay:
        cmd += ["--chunk-delay", str(case.chunk_delay)]
    proc = zygote.popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_until(lambda: port_file.exists() or proc.poll() is not None, 30, "the server")
        assert port_file.exists()
    except AssertionError:
        proc.kill()
        raise RuntimeError(f"scripted server for {case.name} did not start") from None
    return proc, f"http://127.0.0.1:{port_file.read_text().strip()}"


def slow_python_dir(case_dir: Path) -> Path:
    """A ``python3`` first on PATH that marks its start and sleeps before the real one."""
    bin_dir = case_dir / "bin"
    bin_dir.mkdir(exist_ok=True)
    shim = bin_dir / "python3"
    shim.write_text(
        f'#!/bin/sh\ntouch {case_dir / "tests-started"}\nsleep 2\nexec {sys.executable} "$@"\n'
    )
    shim.chmod(0o755)
    return bin_dir


def run_agent(result: Result, attempt: Attempt, url: str, db_url: str) -> Run:
    case_dir = result.dir
    env = {k: v for k, v in os.environ.items() if k != "ANTHROPIC_API_KEY"}
    env["DBOS_AGENT_DATABASE_URL"] = db_url
    env["PYTHONUNBUFFERED"] = "1"
    env["PYTHONPATH"] = str(EXAMPLE.parents[1])  # this checkout's dbos_agent, not an install
    if attempt.slow_tests:
        env["PATH"] = f"{slow_python_dir(case_dir)}{os.pathsep}{env.get('PATH', '')}"
    cmd = [
        sys.executable,
        str(EXAMPLE),
        "--task-id",
        result.task_id,
        "--workdir",
        str(case_dir / "work"),
        "--base-url",
        url,
        *attempt.flags,
    ]
    proc = zygote.popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    assert proc.stdout is not None
    stream = proc.stdout
    output: list[str] = []
    reader = threading.Thread(target=lambda: output.append(stream.read()))
    reader.start()
    deadline = time.monotonic() + RUN_TIMEOUT
    kill_when = attempt.kill_when
    if kill_when is not None:  # kill it the moment the case says so (or let it end)
        with contextlib.suppress(AssertionError):  # too slow: killed below, and the case fails
            wait_until(
                lambda: proc.poll() is not None or kill_when(case_dir),
                RUN_TIMEOUT,
                result.task_id,
                every=0.01,  # the kill must land at its point, not a step later
            )
            if proc.poll() is None:
                os.kill(proc.pid, signal.SIGKILL)
    try:
        proc.wait(timeout=max(1.0, deadline - time.monotonic()))
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
    reader.join(10)
    return Run(proc.returncode, "".join(output))


def run_case(result: Result, url: str, db_url: str) -> Result:
    for attempt in result.case.attempts:
        result.runs.append(run_agent(result, attempt, url, db_url))
    return result


@pytest.fixture(scope="module")
def crash_results(
    dbos_agent_database_url: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[dict[str, Result]]:
    servers: list[subprocess.Popen[bytes]] = []
    try:
        jobs: list[tuple[Result, str]] = []
        for case in CASES:
            result = Result(case, tmp_path_factory.mktemp(case.name))
            proc, url = start_server(case, result.dir)
            servers.append(proc)
            jobs.append((result, url))
        with ThreadPoolExecutor(max_workers=len(jobs)) as pool:
            done = list(pool.map(lambda j: run_case(j[0], j[1], dbos_agent_database_url), jobs))
        yield {result.case.name: result for result in done}
    finally:
        for proc in servers:
            proc.terminate()
        for proc in servers:
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()


def workflow_row(db_url: str, workflow_id: str) -> tuple[str, Any]:
    with Inspector(db_url) as db:
        info = db.workflow(workflow_id)
    assert info is not None, workflow_id
    return str(info.status), info.output


def test_uninterrupted_run_is_the_reference(
    crash_results: dict[str, Result], dbos_agent_database_url: str
) -> None:
    ref = crash_results["uninterrupted"]
    (run,) = ref.runs
    assert run.returncode == 0, run.stdout
    assert "continued from its log" not in run.stdout
    status, answer = workflow_row(dbos_agent_database_url, ref.task_id)
    assert status == "SUCCESS" and "all tests pass now" in answer
    calc = (ref.dir / "work" / "calc.py").read_text()
    assert "/ len(values)\n" in calc and "len(values) - 1" not in calc
    paid = [line for line in log_lines(ref.dir / "requests.jsonl") if line["paid"]]
    assert len(paid) == TURNS


@pytest.mark.parametrize("name", [c.name for c in CASES if c.name != "uninterrupted"])
def test_killed_agent_resumes_without_paying_or_acting_twice(
    name: str, crash_results: dict[str, Result], dbos_agent_database_url: str
) -> None:
    result = crash_results[name]
    ref = crash_results["uninterrupted"]
    case, work = result.case, result.dir / "work"
    for attempt, run in zip(case.attempts, result.runs, strict=True):
        if attempt.killed:
            assert run.returncode == -signal.SIGKILL, run.stdout
        else:
            assert run.returncode == 0, run.stdout
        # each resumed run said what it replayed
        match = re.search(r"replayed (\d+) steps from the log", run.stdout)
        replayed = int(match.group(1)) if match else None
        assert replayed == attempt.replayed, run.stdout

    # the same final answer as the uninterrupted run, and the same files
    status, answer = workflow_row(dbos_agent_database_url, result.task_id)
    assert status == "SUCCESS"
    assert answer == workflow_row(dbos_agent_database_url, ref.task_id)[1]
    assert (work / "calc.py").read_text() == (ref.dir / "work" / "calc.py").read_text()
    changelog = (work / "CHANGELOG.md").read_text().splitlines()
    assert changelog.count(CHANGELOG_LINE) == 1, changelog
    if name == "in-tool-after-effect":  # the append in doubt: its guard answered, and says so
        last = result.runs[-1].stdout
        assert "↩ not run again: its guard found it done (exit code 0)" in last, last

    # from the server's log: every turn paid once; only a call cut off in flight twice
    lines = log_lines(result.dir / "requests.jsonl")
    assert all(line["status"] == 200 for line in lines), lines  # no 400: a valid resume
    paid = Counter((line["messages"] - 1) // 2 for line in lines if line["paid"])
    expected = Counter(range(TURNS))
    if case.paid_twice is not None:
        expected[case.paid_twice] += 1
    assert paid == expected
