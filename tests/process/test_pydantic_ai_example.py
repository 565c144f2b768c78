"""kill -9 the Pydantic AI example (examples/pydantic_ai_agent.py), twice, and run it again.

The example runs as a subprocess against the session database, its model requests going
over real HTTP to a scripted Messages API server in this process (its request log is what
was paid for) and its tools in the example's MCP server (examples/fs_mcp_server.py, a
grandchild process). The same workflow id runs three times: killed (SIGKILL) after turn 2,
continued and killed inside the non-idempotent append of turn 4 (after it acted, before
its result was recorded), continued to the end. Then, from outside the processes (the
server's log, the files, the step log), the tests check that no model request was paid
twice, the task's files are right, the append is in CHANGELOG.md once, and each continued
run printed its replay report.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from dbos_agent.agent.scripted_server import CHANGELOG_LINE, ScriptedServer, coding_task_script
from dbos_agent.records import StepStatus
from dbos_agent.testing import Inspector
from tests.support import zygote

pytest.importorskip("pydantic_ai")
pytest.importorskip("mcp")

pytestmark = pytest.mark.long  # many processes, a minute or more: started first

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "pydantic_ai_agent.py"
TURNS = 6  # the scripted coding task: 5 tool turns and a final answer
RUN_TIMEOUT = 180.0  # a deadline for a failure, not a measure: generous on a busy machine
REPORT = re.compile(
    r"replayed (\d+) steps from the log in [\d.]+ ms: (\d+) model calls and (\d+) tool calls "
    r"not run again, [\d,]+ input \+ [\d,]+ output tokens not re-paid"
)
MODEL = "coder__model.request"
TOOL = "coder__mcp_server__fs.call_tool"
LISTING = "coder__mcp_server__fs.get_tools"


@dataclass
class Attempt:
    """One run of the command: the crash flag it is killed by (none: it finishes), and
    the steps it replays from the log."""

    crash: list[str]
    replayed: int | None  # None: a fresh run


#: The same workflow id three times over.
ATTEMPTS = [
    # turns 0-2 live, killed once turn 2 (its reply and its tool call) is recorded
    Attempt(["--crash-after-turn", "2"], replayed=None),
    # replays the listing, 3 requests and 3 tool calls; turns 3 and 4 live, killed inside
    # turn 4's run_bash after its append, before its result is recorded: in doubt
    Attempt(["--crash-in-tool", "4"], replayed=7),
    # replays 10 steps; the guard finds the line in CHANGELOG.md, so the append is not
    # made again; turn 5 (the answer) live
    Attempt([], replayed=10),
]


@dataclass
class Run:
    returncode: int
    output: str
    changelog: list[str]  # CHANGELOG.md's lines once the run ended


@dataclass
class Result:
    dir: Path
    server: ScriptedServer
    task_id: str = "pai-example"
    runs: list[Run] = field(default_factory=list)

    @property
    def work(self) -> Path:
        return self.dir / "work"


def run_example(result: Result, flags: list[str], db_url: str) -> Run:
    env = {k: v for k, v in os.environ.items() if k != "ANTHROPIC_API_KEY"}
    # this checkout's dbos_agent (the script's own folder comes first on its path)
    env |= {"DBOS_AGENT_DATABASE_URL": db_url, "PYTHONUNBUFFERED": "1", "PYTHONPATH": str(ROOT)}
    cmd = [
        sys.executable,
        str(EXAMPLE),
        "--task-id",
        result.task_id,
        "--workdir",
        str(result.work),
        "--base-url",
        result.server.url,
        *flags,
    ]
    try:
        done = zygote.run(
            cmd,
            env=env,
            cwd=result.dir,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            timeout=RUN_TIMEOUT,
        )
        returncode, output = done.returncode, done.stdout
    except subprocess.TimeoutExpired as slow:
        returncode, output = -999, f"timed out: {slow.output!r}"
    changelog = result.work / "CHANGELOG.md"
    # a run that failed before the task began errs every test of the module: say why
    assert changelog.exists(), (
        f"{' '.join(cmd)}\nexit status {returncode}, no CHANGELOG.md:\n{output}"
    )
    return Run(returncode, output, changelog.read_text().splitlines())


@pytest.fixture(scope="module")
def result(
    dbos_agent_database_url: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Result]:
    """The three runs, one after the other."""
    with ScriptedServer(coding_task_script()) as server:
        done = Result(tmp_path_factory.mktemp("pai-example"), server)
        for attempt in ATTEMPTS:
            done.runs.append(run_example(done, attempt.crash, dbos_agent_database_url))
        yield done


def paid_turns(server: ScriptedServer) -> Counter[int]:
    """How many times each turn's request was answered (a turn: the assistant messages
    the request carries)."""
    return Counter(
        sum(1 for m in r.body["messages"] if m.get("role") == "assistant")
        for r in server.requests
        if r.paid
    )


def test_each_killed_run_dies_and_the_last_finishes(result: Result) -> None:
    *killed, finished = result.runs
    for run in killed:
        assert run.returncode == -signal.SIGKILL, run.output
    assert "💥 kill -9 after turn 2" in killed[0].output
    assert "💥 kill -9 inside the tool call of turn 4" in killed[1].output
    assert finished.returncode == 0, finished.output
    assert "=== final answer ===" in finished.output


def test_each_continued_run_prints_what_it_replayed(result: Result) -> None:
    for attempt, run in zip(ATTEMPTS, result.runs, strict=True):
        match = REPORT.search(run.output)
        if attempt.replayed is None:
            assert match is None, run.output
            continue
        assert match is not None, run.output
        replayed, model_calls, tool_calls = (int(g) for g in match.groups())
        # the MCP listing, then a model request and its tool call per turn
        assert (replayed, model_calls, tool_calls) == (
            attempt.replayed,
            attempt.replayed // 2,
            attempt.replayed - 1 - attempt.replayed // 2,
        )
        assert re.search(r"that is about \$\d+\.\d{4} not paid twice", run.output)


def test_no_model_request_is_paid_twice(result: Result) -> None:
    """Counted by the server across the three processes: each turn's request once."""
    assert all(r.status == 200 for r in result.server.requests)
    assert paid_turns(result.server) == Counter(range(TURNS))


def test_the_task_is_done_once(result: Result, dbos_agent_database_url: str) -> None:
    calc = (result.work / "calc.py").read_text()
    assert "/ len(values)\n" in calc and "len(values) - 1" not in calc
    with Inspector(dbos_agent_database_url) as db:
        info = db.workflow(result.task_id)
        steps = db.steps(result.task_id)
    assert info is not None and info.status == "SUCCESS"
    assert "all tests pass now" in str(info.output)
    # one listing, then each turn's request and its tool call, each recorded once
    assert [s.name for s in steps] == [LISTING] + [MODEL, TOOL] * (TURNS - 1) + [MODEL]
    # A step may have taken more than one attempt: a busy machine can time out the MCP
    # server's handshake, which is waited out (nothing sent). What is paid and done once
    # is counted from outside, in the tests above and below.
    outcomes = [(s.seq, s.name, str(s.status), s.attempts, s.error) for s in steps]
    assert all(s.status is StepStatus.SUCCESS for s in steps), outcomes


def test_the_append_in_doubt_is_not_made_again(
    result: Result, dbos_agent_database_url: str
) -> None:
    """The killed run appended the line; the guard of run_bash (in its metadata) found it,
    so the run that continued did not append it again."""
    _, killed, finished = result.runs
    assert killed.changelog.count(CHANGELOG_LINE) == 1
    assert finished.changelog == killed.changelog
    # only run_bash, marked non-idempotent, recorded its intent (its arguments) first
    with Inspector(dbos_agent_database_url) as db:
        steps = db.steps(result.task_id)
    intents = [s.inputs["arguments"]["command"] for s in steps if s.inputs is not None]
    assert len(intents) == 3 and intents[2].endswith(">> CHANGELOG.md")
    # and the run that continued says the guard answered, not that the command ran
    [line] = [line for line in finished.output.splitlines() if ">> CHANGELOG.md" in line]
    assert "↩ not run again: its guard found it done (exit code 0)" in line, finished.output
