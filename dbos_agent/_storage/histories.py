"""Histories: workflows with their logs, as a deploy check replays them and as
``dbos-agent export``/``import`` move them between databases (queries.sql "histories").

An exported history is one JSON document per workflow (``dbos_agent.history/1``): the
workflow's row but its owner, its steps, the messages sent to it, its events, streams
and approvals, values exactly as stored. The same document is what a check reads from a
file; either way it is held to the rules of :mod:`.history_checks` first.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import psycopg

from .._limits import DEFAULT_MAX_CHECKPOINT_BYTES
from ..errors import DbosAgentError, InvalidHistoryError
from ..records import StepStatus, WorkflowStatus
from .connector import Connection, Connector
from .history_checks import load_history
from .outages import describe, is_transient
from .rows import StepRow, step_row, text_of
from .sql_files import query

_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)

#: What an import clashes with here, by the constraint Postgres names (rows of a file are
#: checked alone before; these need the database's).
_CLASHES = {
    "workflows_queue_dedup": "an unfinished workflow of its queue holds its dedup id here",
    "messages_idempotency_key": "a message to it with one of its idempotency keys is here",
}


@dataclass(frozen=True, slots=True)
class History:
    """One workflow as a replay check needs it: its call and its log (JSON as text)."""

    workflow_id: str
    name: str
    status: WorkflowStatus
    app_version: str | None
    inputs: str
    steps: dict[int, StepRow]
    created_at: datetime | None = None

    @property
    def last_seq(self) -> int:
        """The last recorded position (-1 for an empty log)."""
        return max(self.steps, default=-1)


class HistoryStore:
    """Reading histories to check, exporting and importing them, adopting versions."""

    def __init__(self, db: Connector) -> None:
        self._db = db

    def to_check(
        self, names: list[str], after: tuple[datetime, str] | None, limit: int
    ) -> list[History]:
        """The next page of unfinished workflows of ``names`` with their logs (two
        statements: the page, then its logs)."""
        after_created_at, after_id = after if after else (_EPOCH, "")
        rows = self._db.all(
            "list_workflows_to_check",
            "list the workflows to check",
            names=names,
            after_created_at=after_created_at,
            after_workflow_id=after_id,
            limit=limit,
        )
        logs: dict[str, dict[int, StepRow]] = {row["workflow_id"]: {} for row in rows}
        if logs:
            for step in self._db.all(
                "load_steps_of_many", "read workflow logs", workflow_ids=list(logs)
            ):
                logs[step["workflow_id"]][step["seq"]] = step_row(step)
        return [
            History(
                row["workflow_id"],
                row["name"],
                WorkflowStatus(row["status"]),
                row["app_version"],
                text_of(row["inputs"]) or "{}",
                logs[row["workflow_id"]],
                row["created_at"],
            )
            for row in rows
        ]

    def export(self, workflow_ids: list[str]) -> list[tuple[str, str]]:
        """``(workflow id, history document)`` (JSON text, one line each) of the
        workflows that exist among ``workflow_ids``, oldest first."""
        rows = self._db.all("export_workflows", "export workflows", workflow_ids=workflow_ids)
        return [(str(row["workflow_id"]), str(row["history"])) for row in rows]

    def unfinished_ids(
        self,
        statuses: list[WorkflowStatus],
        name: str | None,
        after: tuple[datetime, str] | None,
        limit: int,
    ) -> list[tuple[str, datetime]]:
        """``(workflow id, created at)`` of the next page of workflows in ``statuses``
        (of ``name``), oldest first after ``after``."""
        after_created_at, after_id = after if after else (_EPOCH, "")
        rows = self._db.all(
            "list_unfinished_ids",
            "list unfinished workflows",
            statuses=[str(s) for s in statuses],
            name=name,
            after_created_at=after_created_at,
            after_workflow_id=after_id,
            limit=limit,
        )
        return [(row["workflow_id"], row["created_at"]) for row in rows]

    def import_all(
        self, documents: Sequence[tuple[str, str, str]]
    ) -> list[tuple[str, int, int] | None]:
        """Load history documents ``(where, workflow id, document)``, checked first (see
        :func:`read_histories`), in one transaction: all of them or none. For each,
        ``(workflow id, steps, messages)`` imported, or None when the id exists here
        already (nothing of it is written then). A document Postgres still refuses (one
        that clashes with a row here, e.g. an unfinished workflow of its queue with its
        dedup id) raises InvalidHistoryError naming ``where``; nothing is written."""
        statement = query("import_workflow")

        def body(conn: Connection) -> list[tuple[str, int, int] | None]:
            done: list[tuple[str, int, int] | None] = []
            for where, workflow_id, document in documents:
                try:
                    row = conn.execute(statement, {"history": document}).fetchone()
                except psycopg.Error as exc:
                    if is_transient(exc):
                        raise
                    why = _CLASHES.get(exc.diag.constraint_name or "") or describe(exc)
                    detail = exc.diag.message_detail
                    raise InvalidHistoryError(
                        f"{where}: workflow {workflow_id[:60]!r} cannot be imported here: "
                        f"{why}{f' ({detail})' if detail else ''}; nothing of the file was "
                        "written"
                    ) from None
                done.append(
                    None
                    if row is None
                    else (str(row["workflow_id"]), int(row["steps"]), int(row["messages"]))
                )
            return done

        result: list[tuple[str, int, int] | None] = self._db.run(
            "import workflows", body, transaction=True, resend=False
        )
        return result

    def adopt_version(self, workflow_id: str, version: str, *, steps: int, last_seq: int) -> bool:
        """Let processes of application ``version`` run the workflow, if its log is still
        the one checked (``steps`` rows, the last at ``last_seq``): one guarded statement."""
        row = self._db.one(
            "adopt_workflow_version",
            f"adopt workflow {workflow_id!r} for version {version!r}",
            workflow_id=workflow_id,
            version=version,
            steps=steps,
            last_seq=last_seq,
        )
        return row is not None


def parse_history(
    document: str, where: str, max_checkpoint_bytes: int = DEFAULT_MAX_CHECKPOINT_BYTES
) -> History:
    """A history document (one line of an export) as a :class:`History`, checked by the
    rules of :mod:`.history_checks`; InvalidHistoryError naming ``where`` and the field
    when it breaks one."""
    doc = load_history(document, where, max_checkpoint_bytes)
    workflow: dict[str, Any] = doc["workflow"]
    steps = {
        s["seq"]: StepRow(
            s["seq"],
            s["name"],
            StepStatus(s["status"]),
            _stored_text(s.get("output")),
            _stored_text(s.get("error")),
            s["attempts"],
            _stored_text(s.get("inputs")) if s["status"] == StepStatus.PENDING else None,
            _stored_text(s.get("retry")) if s["status"] == StepStatus.RETRYING else None,
        )
        for s in doc.get("steps", [])
    }
    created = workflow.get("created_at")
    return History(
        workflow["workflow_id"],
        workflow["name"],
        WorkflowStatus(workflow["status"]),
        workflow.get("app_version"),
        _stored_text(workflow["inputs"]) or "{}",
        steps,
        datetime.fromisoformat(created) if isinstance(created, str) else None,
    )


def read_export(
    path: str, max_checkpoint_bytes: int = DEFAULT_MAX_CHECKPOINT_BYTES
) -> Iterator[tuple[str, str, History]]:
    """:func:`read_histories` of the file at ``path`` (``-``: stdin); DbosAgentError
    naming it when it cannot be read."""
    try:
        if path == "-":
            yield from read_histories(sys.stdin.buffer, "stdin", max_checkpoint_bytes)
            return
        with Path(path).open("rb") as source:
            yield from read_histories(source, path, max_checkpoint_bytes)
    except OSError as exc:
        raise DbosAgentError(f"cannot read {path}: {exc.strerror or exc}") from None


def read_histories(
    lines: Iterable[str | bytes],
    source: str,
    max_checkpoint_bytes: int = DEFAULT_MAX_CHECKPOINT_BYTES,
) -> Iterator[tuple[str, str, History]]:
    """``(where, document, history)`` of each non-blank line (bytes must be UTF-8), where
    names the source and the line; an InvalidHistoryError naming them and the field for a
    line that breaks a rule, or that holds a workflow an earlier line held (one file
    holds each workflow once: which one would be meant?)."""
    seen: dict[str, int] = {}
    for number, line in enumerate(lines, 1):
        where = f"{source}, line {number}"
        if isinstance(line, bytes):
            try:
                line = line.decode("utf-8")
            except UnicodeDecodeError as exc:
                raise InvalidHistoryError(
                    f"{where}: not UTF-8 text (byte 0x{line[exc.start]:02x} at column "
                    f"{exc.start + 1})"
                ) from None
        if not line.strip():
            continue
        history = parse_history(line, where, max_checkpoint_bytes)
        first = seen.setdefault(history.workflow_id, number)
        if first != number:
            raise InvalidHistoryError(
                f"{where}, workflow.workflow_id: workflow {history.workflow_id[:60]!r} is "
                f"on line {first} too: one file holds each workflow once"
            )
        yield where, line.strip(), history


def _stored_text(value: Any) -> str | None:
    """A JSON value of a document, as the text the caller stored (NULs unwrapped)."""
    return None if value is None else text_of(json.dumps(value, separators=(",", ":")))
