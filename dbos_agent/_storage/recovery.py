"""Recovery and sessions as the database sees them: claiming the workflows of dead
sessions, finding what a session owns but does not run, forgetting dead sessions.
"""

from __future__ import annotations

from datetime import UTC, datetime

from ..records import WorkflowStatus
from .connector import Connector
from .rows import RecoveryClaim, Runner, UnlockedSession, text_of
from .sql_files import query

_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


class RecoveryStore:
    """Claims and the executors table (the session itself is in session.py)."""

    def __init__(self, db: Connector) -> None:
        self._db = db

    def claim(
        self,
        *,
        executor_id: str,
        owner_key: int,
        runner: Runner,
        skip_ids: list[str],
        orphans: bool,
        after: tuple[datetime, str] | None,
        limit: int,
    ) -> list[RecoveryClaim]:
        """Take over the next page of PENDING workflows whose session is dead (queries.sql)."""
        after_created_at, after_id = after if after else (_EPOCH, "")
        rows = self._db.all(
            "claim_workflows",
            "claim workflows for recovery",
            executor_id=executor_id,
            owner_key=owner_key,
            **runner.params(),
            skip_ids=skip_ids,
            orphans=orphans,
            after_created_at=after_created_at,
            after_workflow_id=after_id,
            limit=limit,
        )
        claims = [
            RecoveryClaim(
                r["workflow_id"],
                r["name"],
                WorkflowStatus(r["status"]),
                text_of(r["inputs"]) or "{}",
                r["created_at"],
                r["recovery_attempts"],
                r["max_recovery_attempts"],
            )
            for r in rows
        ]
        claims.sort(key=lambda c: (c.created_at, c.workflow_id))
        return claims

    def probe_orphans(
        self, *, owner_key: int, runner: Runner
    ) -> tuple[bool, list[UnlockedSession]]:
        """Whether workflows the caller could take over wait, and which sessions have
        lost their lock without being known dead yet (one statement, see queries.sql)."""
        row = self._db.one(
            "probe_orphans",
            "look for orphaned workflows",
            owner_key=owner_key,
            **runner.params(),
        )
        if row is None:
            return False, []
        unlocked = [
            UnlockedSession(s["session_key"], s["pid"], s["process_key"]) for s in row["unlocked"]
        ]
        return bool(row["claimable"]), unlocked

    def claim_diverged(
        self, *, executor_id: str, owner_key: int, runner: Runner, orphans: bool, limit: int
    ) -> list[tuple[str, str, str]]:
        """Take ``(workflow_id, name, inputs)`` of the next page of DIVERGED workflows the
        runner's code may fit: PENDING and the caller's now (queries.sql)."""
        rows = self._db.all(
            "claim_diverged_workflows",
            "claim diverged workflows",
            executor_id=executor_id,
            owner_key=owner_key,
            orphans=orphans,
            limit=limit,
            **runner.params(),
        )
        return [(r["workflow_id"], r["name"], text_of(r["inputs"]) or "{}") for r in rows]

    def count_claimable_soon(self, executor_id: str, owner_key: int, names: list[str]) -> int:
        """PENDING workflows of ``executor_id`` whose session lost its lock, within its grace."""
        row = self._db.one(
            "count_claimable_soon",
            "count workflows awaiting their session's grace",
            executor_id=executor_id,
            owner_key=owner_key,
            names=names,
        )
        return 0 if row is None else int(row["count"])

    def owned_idle(
        self, owner_key: int, skip_ids: list[str], limit: int
    ) -> list[tuple[str, str, str]]:
        """``(workflow_id, name, inputs)`` of PENDING workflows this session owns but does
        not run (``skip_ids`` are the ones it runs)."""
        rows = self._db.all(
            "list_owned_idle",
            "list this session's workflows",
            owner_key=owner_key,
            skip_ids=skip_ids,
            limit=limit,
        )
        return [(r["workflow_id"], r["name"], text_of(r["inputs"]) or "{}") for r in rows]

    def count_unrecoverable(self, executor_id: str, names: list[str]) -> dict[str, int]:
        """``{workflow name: count}`` of PENDING workflows no registered function can run."""
        rows = self._db.all(
            "count_unrecoverable_pending",
            "count unrecoverable workflows",
            executor_id=executor_id,
            names=names,
        )
        return {row["name"]: row["pending"] for row in rows}

    def unlocked_sessions(self) -> list[UnlockedSession]:
        """Sessions whose lock is free and which are not yet known dead."""
        return [
            UnlockedSession(r["session_key"], r["pid"], r["process_key"])
            for r in self._db.all("list_unlocked_sessions", "list executor sessions")
        ]

    def end_dead_session(self, session_key: int, process_key: str) -> bool:
        """Declare a session dead whose process is known gone (its lock still free)."""
        row = self._db.one(
            "end_dead_session",
            f"end executor session {session_key}",
            session_key=session_key,
            process_key=process_key,
        )
        return row is not None

    def delete_dead_executors(self) -> None:
        """Forget executor sessions that are dead and own nothing."""
        self._db.run(
            "forget dead executor sessions", lambda c: c.execute(query("delete_dead_executors"))
        )
