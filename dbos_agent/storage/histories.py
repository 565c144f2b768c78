"""Histories: workflows with their logs, as a deploy check replays them and as
``dbos-agent export``/``import`` move them between databases (queries.sql "histories").

An exported history is one JSON document per workflow (``dbos_agent.history/1``): the
workflow's row but its owner, its steps, the messages sent to it, its events, streams
and approvals, values exactly as stored. The same document is what a check reads from a
file.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from ..records import StepStatus, WorkflowStatus
from .connector import Connector
from .rows import StepRow, step_row, text_of

#: The ``format`` of an exported history document.
HISTORY_FORMAT = "dbos_agent.history/1"

_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


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

    def import_(self, document: str) -> tuple[str, int, int] | None:
        """Load one history document: ``(workflow id, steps, messages)`` imported, or
        None when the id exists here already (nothing is written then)."""
        row = self._db.one(
            "import_workflow", "import a workflow", where="an imported history", history=document
        )
        if row is None:
            return None
        return str(row["workflow_id"]), int(row["steps"]), int(row["messages"])

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


def parse_history(document: str, where: str) -> History:
    """A history document (one line of an export) as a :class:`History`; ValueError
    naming ``where`` when it is not one."""
    try:
        doc = json.loads(document)
        if not isinstance(doc, dict) or doc.get("format") != HISTORY_FORMAT:
            raise ValueError(f"not a {HISTORY_FORMAT} document")
        workflow: dict[str, Any] = doc["workflow"]
        steps = {
            int(s["seq"]): StepRow(
                int(s["seq"]),
                str(s["name"]),
                StepStatus(s["status"]),
                _stored_text(s.get("output")),
                _stored_text(s.get("error")),
                int(s.get("attempts") or 1),
                _stored_text(s.get("inputs")) if s["status"] == StepStatus.PENDING else None,
                _stored_text(s.get("retry")) if s["status"] == StepStatus.RETRYING else None,
            )
            for s in doc.get("steps", [])
        }
        created = workflow.get("created_at")
        return History(
            str(workflow["workflow_id"]),
            str(workflow["name"]),
            WorkflowStatus(workflow["status"]),
            workflow.get("app_version"),
            _stored_text(workflow.get("inputs")) or "{}",
            steps,
            datetime.fromisoformat(created) if isinstance(created, str) else None,
        )
    except (KeyError, TypeError, ValueError) as exc:
        raise ValueError(f"{where}: not a workflow history ({exc})") from None


def read_histories(lines: Iterable[str], source: str) -> Iterator[tuple[str, History]]:
    """``(document, history)`` of each non-blank line; ValueError naming the line."""
    for number, line in enumerate(lines, 1):
        if line.strip():
            yield line.strip(), parse_history(line, f"{source}, line {number}")


def _stored_text(value: Any) -> str | None:
    """A JSON value of a document, as the text the caller stored (NULs unwrapped)."""
    return None if value is None else text_of(json.dumps(value, separators=(",", ":")))
