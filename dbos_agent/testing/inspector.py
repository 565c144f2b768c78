"""An inspector for test assertions: what a system database holds, read by name.

Tests of code built on dbos_agent (and dbos_agent's own) assert on outcomes that
live in the database: a workflow's status and recovery attempts, its step log, its
mailbox, its events, who owns it now, what retention left of it. The inspector
answers those questions through the storage layer's named queries, so tests neither
write SQL against internal tables nor poke at a runtime's private parts::

    with Inspector(url) as db:
        assert db.status("order-42") == WorkflowStatus.SUCCESS
        assert db.step_names("order-42") == ["charge", "ship"]

The ``dbos_agent_inspector`` fixture gives one on the session database.
"""

from __future__ import annotations

from collections.abc import Iterable
from types import TracebackType
from typing import Any

from .._storage.database import SystemDatabase
from .._storage.inspection import RowCounts, SentMessage
from ..records import StepInfo, WorkflowInfo, WorkflowStatus

__all__ = ["Inspector", "RowCounts", "SentMessage"]

_MISSING: Any = object()


class Inspector:
    """Read-only questions about a system database.

    It has its own two connections, named ``dbos_agent_inspector`` (so that a test
    killing the library's connections by name leaves them alone), and notes outages
    at DEBUG level only: a test's own restarts are not the library's warnings.
    """

    def __init__(self, database_url: str) -> None:
        self._db = SystemDatabase(
            database_url,
            pool_size=2,
            application_name="dbos_agent_inspector",
            warn_on_outage=False,
        )
        self._db.open()

    def close(self) -> None:
        """Close the inspector's connections."""
        self._db.close()

    def __enter__(self) -> Inspector:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    # -- workflows ------------------------------------------------------------------

    def workflow(self, workflow_id: str) -> WorkflowInfo | None:
        """The stored workflow, or None if there is none by that id."""
        return self._db.workflows.describe(workflow_id)

    def workflows(
        self,
        *,
        status: WorkflowStatus | None = None,
        name: str | None = None,
        executor_id: str | None = None,
        limit: int = 10_000,
    ) -> list[WorkflowInfo]:
        """The stored workflows matching every given filter, newest first."""
        return self._db.workflows.list(
            status=status, name=name, executor_id=executor_id, limit=limit
        )

    def status(self, workflow_id: str) -> WorkflowStatus | None:
        """The workflow's status, or None if there is none by that id."""
        return self.statuses([workflow_id])[workflow_id]

    def statuses(self, workflow_ids: Iterable[str]) -> dict[str, WorkflowStatus | None]:
        """The status of each workflow (None for an id that has no workflow), read in one
        statement: what a test polls while it waits for hundreds of workflows."""
        ids = list(workflow_ids)
        found = self._db.inspection.statuses(ids)
        return {wid: found.get(wid) for wid in ids}

    def all_finished(self, workflow_ids: Iterable[str]) -> bool:
        """Whether every one of the workflows exists and has finished (any outcome)."""
        return all(s is not None and s.finished for s in self.statuses(workflow_ids).values())

    def recovery_attempts(self, workflow_ids: Iterable[str] | None = None) -> dict[str, int]:
        """Recovery attempts by workflow id (of every workflow without ``workflow_ids``)."""
        ids = None if workflow_ids is None else list(workflow_ids)
        return self._db.inspection.recovery_attempts(ids)

    def owner_pid(self, workflow_id: str) -> int | None:
        """The pid of the process whose executor session owns the workflow now."""
        return self._db.inspection.owner_pid(workflow_id)

    def rows_of(self, workflow_id: str) -> RowCounts:
        """How many rows the workflow has in each table (all 0 once it is deleted)."""
        return self._db.inspection.rows_of(workflow_id)

    # -- the step log, messages, events -------------------------------------------

    def steps(self, workflow_id: str) -> list[StepInfo]:
        """The workflow's recorded steps, in order."""
        return self._db.steps.list(workflow_id)

    def step_names(self, workflow_id: str) -> list[str]:
        """The names of the workflow's recorded steps, in order."""
        return [step.name for step in self.steps(workflow_id)]

    def messages(self, workflow_id: str) -> list[SentMessage]:
        """Every message sent to the workflow, oldest first, consumed or not."""
        return self._db.inspection.messages(workflow_id)

    def event(self, workflow_id: str, key: str, default: Any = _MISSING) -> Any:
        """The value the workflow published under ``key``; ``default`` (else KeyError)
        if it published none."""
        found, value = self._db.inspection.event(workflow_id, key)
        if found:
            return value
        if default is _MISSING:
            raise KeyError(f"workflow {workflow_id!r} published no event {key!r}")
        return default

    # -- sessions and time ----------------------------------------------------------

    def locked_sessions(self) -> set[int]:
        """The executor sessions whose connection holds its advisory lock now."""
        return self._db.inspection.locked_sessions()

    def database_time(self) -> float:
        """The database clock (``dbos_agent.now()``) in epoch seconds."""
        return self._db.messages.database_time()
