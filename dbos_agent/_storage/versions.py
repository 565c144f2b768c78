"""Application versions: what each has unfinished, and which live sessions serve it.

A deploy is judged by this: the workflows an older version left unfinished, whether any
process of a version that may run them is still alive, and which builds (code versions)
those processes run. A session is live when the database's rules do not call it dead
(``dbos_agent.dead_sessions()``) and, seen from this host, its process has not gone with
its lock free (``processes.session_gone_here``): a process killed -9 here drops out at
once, not when its lease runs out.
"""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from .._processes import session_gone_here
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
    #: The code version of its process (``registry.code_version``: a digest of its
    #: durable code); None for a session registered before migration 025.
    code_version: str | None = None


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

    @property
    def code_versions(self) -> dict[str | None, int]:
        """How many of its live sessions run each code version, the most common first:
        more than one means two builds serve this application version (a rollout under
        way, or a drift), and either may recover the other's workflows."""
        counts = Counter(session.code_version for session in self.sessions)
        return dict(sorted(counts.items(), key=lambda item: (-item[1], item[0] or "")))


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
        found = []
        for row in rows:
            sessions = [
                _live_session(s)
                for s in json.loads(row["sessions"])
                if not session_gone_here(s["process_key"], s["lock_free"])
            ]
            unfinished = {status: int(row[status.lower()]) for status in UNFINISHED}
            if not sessions and not any(unfinished.values()):
                continue  # only sessions of processes gone from this host
            found.append(
                AppVersionSummary(
                    app_version=row["app_version"],
                    unfinished=unfinished,
                    accepted_elsewhere=int(row["accepted_elsewhere"]),
                    accepted_by=list(row["accepted_by"]),
                    sessions=sessions,
                )
            )
        return found


def _live_session(document: dict[str, Any]) -> LiveSession:
    return LiveSession(
        session_key=int(document["session_key"]),
        executor_id=document["executor_id"],
        hostname=document["hostname"],
        pid=int(document["pid"]),
        started_at=datetime.fromisoformat(document["started_at"]),
        heartbeat_at=datetime.fromisoformat(document["heartbeat_at"]),
        code_version=document["code_version"],
    )
