"""``dbos-agent import`` holds what it reads to the engine's rules: each bad line is refused
by file, line and field (exit 1, one line, a JSON error document with --json), never by a
Postgres error or a traceback, and nothing of the file is written.

Each bad file has a good workflow on line 1 and the bad one on line 2; the cases run side
by side as real processes against one database, compared row by row before and after.
"""

from __future__ import annotations

import copy
import json
import re
import subprocess
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import psycopg
import pytest

from dbos_agent._storage.history_checks import COLUMNS, OMITTED
from tests.helpers import cli, dbos_agent_rows, migrated_database, ok

T = "2026-12-05T10:11:12.5+00:00"


def history(workflow_id: str) -> dict[str, Any]:
    """A workflow waiting in recv, with a step of every kind of row besides."""
    return {
        "format": "dbos_agent.history/1",
        "workflow": {
            "workflow_id": workflow_id, "name": "agent", "status": "SUSPENDED",
            "inputs": {"task": "t"}, "output": None, "error": None, "executor_id": "host:1",
            "max_recovery_attempts": 5, "wait_kind": "recv", "wait_target": workflow_id,
            "wait_name": "go", "created_at": T, "queue_name": None, "dedup_id": None,
        },
        "steps": [
            {"seq": 0, "name": "tool", "status": "SUCCESS", "inputs": None, "output": {"n": 1},
             "error": None, "attempts": 1, "started_at": T, "finished_at": T, "retry": None,
             "events": {"state": {"a": 1}}},
            {"seq": 1, "name": "dbos_agent.recv", "status": "PENDING",
             "inputs": {"topic": "go", "deadline": None}, "output": None, "error": None,
             "attempts": 1, "started_at": T, "finished_at": None, "retry": None},
        ],
        "messages": [{"topic": "", "message": "hi", "idempotency_key": "k1", "created_at": T,
                      "consumed_seq": None, "consumed_at": None}],
        "events": [{"key": "state", "value": {"a": 1}, "updated_at": T}],
        "streams": [{"key": "log", "offset": 0, "kind": "value", "value": "x", "step_seq": None,
                     "attempt": None, "attempt_id": None, "created_at": T}],
        "approvals": [{"seq": 0, "tool": "t", "arguments": {}, "digest": "d",
                       "status": "PENDING", "reason": None, "requested_at": T,
                       "decided_at": None}],
    }  # fmt: skip


def nested(depth: int) -> str:
    """A stand-in for ``depth`` nested arrays, made into them once the document is text
    (too deep for json.dumps)."""
    return f"@nested:{depth}@"


def text_of(doc: dict[str, Any]) -> str:
    return re.sub(r'"@nested:(\d+)@"', lambda m: "[" * int(m[1]) + "]" * int(m[1]), json.dumps(doc))


def _set(path: str, value: Any) -> Callable[[dict[str, Any]], None]:
    """Set ``a.b[0].c`` in a document."""

    def change(doc: dict[str, Any]) -> None:
        *parents, last = path.replace("[", ".").replace("]", "").split(".")
        node: Any = doc
        for part in parents:
            node = node[int(part)] if part.isdigit() else node[part]
        node[int(last) if last.isdigit() else last] = value

    return change


def _retrying(doc: dict[str, Any]) -> None:
    doc["steps"][0].update(status="RETRYING", output=None, finished_at=None,
                           error={"type": "builtins.OSError", "message": "down"})  # fmt: skip


def _queued(dedup: str) -> Callable[[dict[str, Any]], None]:
    def change(doc: dict[str, Any]) -> None:
        doc["workflow"].update(status="ENQUEUED", wait_kind=None, wait_target=None,
                               wait_name=None, queue_name="q", dedup_id=dedup)  # fmt: skip

    return change


#: case -> (how line 2 breaks the good document, what the one line says after "line 2")
CASES: dict[str, tuple[Callable[[dict[str, Any]], None] | bytes, str]] = {
    "long_id": (
        _set("workflow.workflow_id", "x" * 5000),
        ", workflow.workflow_id: a workflow id may be at most 1000 bytes (UTF-8), got 5000",
    ),
    "integer_id": (
        _set("workflow.workflow_id", 12345),
        ", workflow.workflow_id: a workflow id must be a string, got int",
    ),
    "empty_id": (
        _set("workflow.workflow_id", ""),
        ", workflow.workflow_id: a workflow id must not be empty",
    ),
    "over_the_checkpoint_limit": (
        _set("steps[0].output", "x" * (17 * 1024 * 1024)),
        ", steps[0].output: the value is 17,825,794 bytes of JSON, over the checkpoint limit "
        "of 16,777,216 bytes",
    ),
    "too_deep_to_parse": (
        _set("steps[0].output", nested(100_000)),
        ", steps[0].output: is nested deeper than 512 levels",
    ),
    "too_deep": (
        _set("workflow.inputs", {"x": nested(600)}),
        ", workflow.inputs: is nested deeper than 512 levels",
    ),
    "duplicate_step": (
        _set("steps[1].seq", 0),
        ", steps[1]: step number (seq) 0 again (as steps[0])",
    ),
    "negative_step": (
        _set("steps[0].seq", -1),
        ", steps[0].seq: must be between 0 and 2147483647, got -1",
    ),
    "null_topic": (
        _set("messages[0].topic", None),
        ", messages[0].topic: must be a string: the default topic is stored as '', not null",
    ),
    "retrying_without_retry": (
        _retrying,
        ", steps[0].retry: missing for a RETRYING step (since, next_at)",
    ),
    "events_of_an_intent": (
        _set("steps[1].events", {"state": 1}),
        ", steps[1].events: must be null for a PENDING step",
    ),
    "events_not_an_object": (
        _set("steps[0].events", ["state", 1]),
        ", steps[0].events: must be a JSON object of event values, got list",
    ),
    "output_while_waiting": (
        _set("workflow.output", 1),
        ", workflow.output: must be null for a SUSPENDED workflow (it has not finished)",
    ),
    "unknown_status": (
        _set("steps[0].status", "DONE"),
        ", steps[0].status: must be one of PENDING, SUCCESS, ERROR, RETRYING, got 'DONE'",
    ),
    "nul_in_a_value": (
        _set("events[0].value", "a\x00b"),
        ", events[0].value: holds a NUL character",
    ),
    "not_utf8": (b"not utf-8: \xff\n", ": not UTF-8 text (byte 0xff at column 12)"),
    "nan": (
        b'{"format": "dbos_agent.history/1", "workflow": NaN}\n',
        ": not JSON that can be stored (NaN is not JSON)",
    ),
    "same_id_twice": (
        _set("workflow.workflow_id", "line-1"),
        ", workflow.workflow_id: workflow 'line-1' is on line 1 too",
    ),
    "clashes_with_the_database": (  # only Postgres can tell: named all the same
        _queued("taken"),
        ": workflow 'line-2' cannot be imported here: an unfinished workflow of its queue "
        "holds its dedup id here (Key (queue_name, dedup_id)=(q, taken) already exists.)",
    ),
}


@pytest.fixture(scope="module")
def imported(
    dbos_agent_postgres_url: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[str, Path, dict[str, subprocess.CompletedProcess[str]], bool]]:
    """The database (holding one good import), the files' folder, each case's import,
    and whether the database was left as it was."""
    folder = tmp_path_factory.mktemp("imports")
    good = history("existing")
    _queued("taken")(good)
    (folder / "good.jsonl").write_text(json.dumps(good) + "\n")
    for name, (change, _) in CASES.items():
        line_1 = json.dumps(history("line-1")) + "\n"
        if isinstance(change, bytes):
            (folder / f"{name}.jsonl").write_bytes(line_1.encode() + change)
            continue
        doc = copy.deepcopy(history("line-2"))
        change(doc)
        (folder / f"{name}.jsonl").write_text(line_1 + text_of(doc) + "\n")
    with migrated_database(dbos_agent_postgres_url) as url:
        assert "imported 1 workflow(s) with 2 step(s)" in ok(
            cli(url, "import", str(folder / "good.jsonl"))
        )
        before = dbos_agent_rows(url)

        def run(name: str) -> subprocess.CompletedProcess[str]:
            return cli(url, "import", str(folder / f"{name}.jsonl"), "--json", timeout=60)

        with ThreadPoolExecutor(3) as pool:
            results = dict(zip(CASES, pool.map(run, CASES), strict=True))
        yield url, folder, results, dbos_agent_rows(url) == before


@pytest.mark.parametrize("name", CASES)
def test_a_bad_line_is_refused_by_file_line_and_field(
    imported: tuple[str, Path, dict[str, subprocess.CompletedProcess[str]], bool], name: str
) -> None:
    _, folder, results, _ = imported
    result = results[name]
    shown = (result.returncode, result.stdout[:2000], result.stderr[-2000:])
    assert result.returncode == 1, shown
    line = f"{folder / name}.jsonl, line 2{CASES[name][1]}"
    error = json.loads(result.stdout)
    assert sorted(error) == ["error", "type"] and error["error"].startswith(line), shown
    assert result.stderr == f"dbos-agent: error: {error['error']}\n", shown


def test_nothing_of_a_refused_file_is_written(
    imported: tuple[str, Path, dict[str, subprocess.CompletedProcess[str]], bool],
) -> None:
    assert imported[3], "the dbos_agent schema changed while bad files were imported"


def test_what_an_import_reads_is_every_column_an_export_writes(
    imported: tuple[str, Path, dict[str, subprocess.CompletedProcess[str]], bool],
) -> None:
    """A column added by a migration must be added to the import's rules too."""
    with psycopg.connect(imported[0]) as conn:
        for table, fields in COLUMNS.items():
            columns = {
                row[0]
                for row in conn.execute(
                    "SELECT column_name FROM information_schema.columns "
                    "WHERE table_schema = 'dbos_agent' AND table_name = %s",
                    (table,),
                )
            }
            assert columns == {*fields, *OMITTED[table]}, table
