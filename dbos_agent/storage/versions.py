"""Application versions: what each has unfinished, and which live sessions serve it.

A deploy is judged by this: the workflows an older version left unfinished, and
whether any process of a version that may run them is still alive.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import datetime

from ..records import WorkflowStatus
from .connector import Connector


@dataclass(frozen=True, slots=True)
class LiveSession:
    """An executor session that is not dead (see ``dbos_agent.dead_sessions()``)."""

    session_key: int
    executor_id: str
    hostname: str
    pid: int
    started_at: datetime
    heartbeat_at: datetime


@dataclass(frozen=True, slots=True)
class AppVersionSummary:
    """One application version (None: workflows and sessions without one)."""

    app_version: str | None
    #: Its unfinished workflows by status (PENDING, ENQUEUED, SUSPENDED, DIVERGED).
    unfinished: dict[WorkflowStatus, int]
    #: How many of them processes of other versions may run too (``accepted_versions``).
    accepted_elsewhere: int
    #: Those other versions.
    accepted_by: list[str]
    #: The live sessions of processes launched with this version.
    sessions: list[LiveSession]


#: The statuses counted, in the order they are shown.
UNFINISHED = (
    WorkflowStatus.PENDING,
    WorkflowStatus.ENQUEUED,
    WorkflowStatus.SUSPENDED,
    WorkflowStatus.DIVERGED,
)


class VersionStore:
    """Reads only: the workflows and executor sessions, grouped by application version."""

    def __init__(self, db: Connector) -> None:
        self._db = db

    def summary(self) -> list[AppVersionSummary]:
        """Every version with unfinished workflows or live sessions (None first, then by
        name), read in one snapshot."""
        rows = self._db.all("summarize_app_versions", "summarize application versions")
        return [
            AppVersionSummary(
                app_version=row["app_version"],
                unfinished={status: int(row[status.lower()]) for status in UNFINISHED},
                accepted_elsewhere=int(row["accepted_elsewhere"]),
                accepted_by=list(row["accepted_by"]),
                sessions=[
                    LiveSession(
                        session_key=int(s["session_key"]),
                        executor_id=s["executor_id"],
                        hostname=s["hostname"],
                        pid=int(s["pid"]),
                        started_at=datetime.fromisoformat(s["started_at"]),
                        heartbeat_at=datetime.fromisoformat(s["heartbeat_at"]),
                    )
                    for s in json.loads(row["sessions"])
                ],
            )
            for row in rows
        ]
