"""The system database: the only module that talks to Postgres.

Every statement comes from ``sql/queries.sql`` by name. Each method is one
round trip on an autocommit connection from a pool, so a checkpoint is
durable when the method returns.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, LiteralString

import psycopg
from psycopg.rows import TupleRow
from psycopg_pool import ConnectionPool, PoolTimeout

from ..errors import CheckpointError, DatabaseUnavailableError, SchemaVersionError
from ..records import StepInfo, StepStatus, WorkflowInfo, WorkflowStatus
from .dsn import redact_url
from .sql_files import migrations, queries

log = logging.getLogger("dbos_agent.storage")

# pg_advisory_xact_lock key for schema migrations: hashtext('dbos_agent.migrate').
_MIGRATION_LOCK_KEY = 0x0DB05A6E
_CONNECT_TIMEOUT_S = 10
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


@dataclass(frozen=True, slots=True)
class WorkflowRow:
    """What the engine needs of a workflow row; JSON columns stay text."""

    workflow_id: str
    name: str
    status: WorkflowStatus
    inputs: str
    output: str | None
    error: str | None
    owner_key: int | None = None
    owner_live: bool = False


@dataclass(frozen=True, slots=True)
class StepRow:
    """One recorded step as the engine replays it; JSON columns stay text."""

    seq: int
    name: str
    status: StepStatus
    output: str | None
    error: str | None
    attempts: int


@dataclass(frozen=True, slots=True)
class StepWrite:
    """The outcome of :meth:`SystemDatabase.record_step` or ``record_step_intent``."""

    written: bool
    workflow_status: WorkflowStatus | None
    existing: StepRow | None
    #: False when another session owns the workflow now (it was taken over).
    owned: bool = True


@dataclass(frozen=True, slots=True)
class RecoveryClaim:
    """A PENDING workflow taken for recovery (or dead-lettered by the claim)."""

    workflow_id: str
    name: str
    status: WorkflowStatus
    inputs: str
    created_at: datetime
    recovery_attempts: int
    max_recovery_attempts: int


@dataclass(frozen=True, slots=True)
class CancelResult:
    """What :meth:`SystemDatabase.cancel_workflow` found and did."""

    cancelled: bool
    previous: WorkflowStatus


@dataclass(frozen=True, slots=True)
class ResumeResult:
    """What :meth:`SystemDatabase.resume_workflow` found and did, and what a runner needs."""

    resumed: bool
    previous: WorkflowStatus
    #: PENDING, or ENQUEUED for a queued workflow that had not left its queue (None: refused).
    now: WorkflowStatus | None
    #: The first step whose intent has no result (why an IN_DOUBT workflow was refused).
    open_intent: int | None
    name: str
    inputs: str
    executor_id: str


@dataclass(frozen=True, slots=True)
class ForkResult:
    """What :meth:`SystemDatabase.fork_workflow` found and did, and what a runner needs."""

    forked: bool
    copied_steps: int
    name: str
    inputs: str
    executor_id: str
    last_seq: int | None
    #: The first in-doubt step below ``from_step`` (why a fork was refused).
    open_intent: int | None

def _q(name: str) -> LiteralString:
    # The named queries are static text shipped with the package, never user input.
    query: LiteralString = queries()[name]
    return query


def _json(text: str | None) -> Any:
    return None if text is None else json.loads(text)


def _workflow_info(row: Sequence[Any]) -> WorkflowInfo:
    return WorkflowInfo(
        workflow_id=row[0],
        name=row[1],
        status=WorkflowStatus(row[2]),
        inputs=_json(row[3]),
        output=_json(row[4]),
        error=_json(row[5]),
        executor_id=row[6],
        app_version=row[7],
        recovery_attempts=row[8],
        max_recovery_attempts=row[9],
        created_at=row[10],
        updated_at=row[11],
        finished_at=row[12],
    )


def _step_row(row: Sequence[Any]) -> StepRow:
    return StepRow(row[1], row[2], StepStatus(row[3]), row[4], row[5], row[6])


class SystemDatabase:
    """A connection pool on the system database plus the named queries on it."""

    def __init__(self, url: str, *, pool_size: int = 20) -> None:
        self.url = url
        self.redacted_url = redact_url(url)
        self._pool: ConnectionPool[psycopg.Connection[TupleRow]] = ConnectionPool(
            url,
            min_size=1,
            max_size=max(1, pool_size),
            kwargs={
                "autocommit": True,
                "connect_timeout": _CONNECT_TIMEOUT_S,
                "application_name": "dbos_agent",
                # Notice a dead server or a partition instead of hanging forever.
                "keepalives": 1,
                "keepalives_idle": 30,
                "keepalives_interval": 10,
                "keepalives_count": 3,
            },
            open=False,
            name="dbos_agent",
        )

    # -- lifecycle -----------------------------------------------------------------

    def open(self) -> None:
        """Check the server answers (a clear error within ~10 s), then open the pool."""
        try:
            with psycopg.connect(self.url, connect_timeout=_CONNECT_TIMEOUT_S):
                pass
        except psycopg.Error as exc:
            reason = str(exc).strip()
            password = psycopg.conninfo.conninfo_to_dict(self.url).get("password")
            if password:
                reason = reason.replace(str(password), "***")
            raise DatabaseUnavailableError(
                f"cannot connect to the dbos_agent database at {self.redacted_url}: {reason}"
            ) from None
        self._pool.open(wait=True, timeout=_CONNECT_TIMEOUT_S)

    def close(self) -> None:
        """Close every pooled connection."""
        self._pool.close()

    @contextmanager
    def connection(self) -> Iterator[psycopg.Connection[TupleRow]]:
        """A pooled autocommit connection (for the few callers outside this class)."""
        with self._pool.connection() as conn:
            yield conn

    def migrate(self) -> int:
        """Apply the numbered migrations in ``sql/migrations`` that are missing.

        Safe when several processes start at once: a transaction-scoped advisory
        lock serialises them, and the loser finds everything applied.
        Returns the schema version now in force.
        """
        known = migrations()
        newest_known = known[-1][0] if known else 0
        with self._pool.connection() as conn, conn.transaction():
            conn.execute("SELECT pg_advisory_xact_lock(%s)", (_MIGRATION_LOCK_KEY,))
            conn.execute("CREATE SCHEMA IF NOT EXISTS dbos_agent")
            conn.execute(
                "CREATE TABLE IF NOT EXISTS dbos_agent.schema_migrations ("
                " version integer PRIMARY KEY, name text NOT NULL,"
                " applied_at timestamptz NOT NULL DEFAULT now())"
            )
            applied = {
                row[0] for row in conn.execute("SELECT version FROM dbos_agent.schema_migrations")
            }
            newest_applied = max(applied, default=0)
            if newest_applied > newest_known:
                raise SchemaVersionError(
                    f"the database at {self.redacted_url} has dbos_agent schema version "
                    f"{newest_applied}, newer than this library knows ({newest_known}); "
                    f"upgrade dbos_agent"
                )
            for version, name, sql in known:
                if version in applied:
                    continue
                log.info("applying dbos_agent migration %s", name)
                migration: LiteralString = sql
                conn.execute(migration)
                conn.execute(
                    "INSERT INTO dbos_agent.schema_migrations (version, name) VALUES (%s, %s)",
                    (version, name),
                )
        return newest_known

    # -- workflows -------------------------------------------------------------------

    def insert_workflow(
        self,
        *,
        workflow_id: str,
        name: str,
        inputs: str,
        executor_id: str,
        app_version: str | None,
        max_recovery_attempts: int,
        owner_key: int | None,
        queue_name: str | None = None,
        priority: int = 0,
    ) -> tuple[bool, WorkflowRow]:
        """Record a new workflow; ``(False, existing)`` when the id is taken.

        It is PENDING and owned by ``owner_key``, or ENQUEUED when a queue is given.
        """
        status = WorkflowStatus.PENDING if queue_name is None else WorkflowStatus.ENQUEUED
        with self._pool.connection() as conn:
            row = conn.execute(
                _q("insert_workflow"),
                {
                    "workflow_id": workflow_id,
                    "name": name,
                    "status": status,
                    "inputs": inputs,
                    "executor_id": executor_id,
                    "app_version": app_version,
                    "max_recovery_attempts": max_recovery_attempts,
                    "owner_key": None if queue_name is not None else owner_key,
                    "queue_name": queue_name,
                    "priority": priority,
                },
            ).fetchone()
        assert row is not None
        inserted, wf_name, stored_status, stored_inputs, output, error, owner, live = row
        if inserted:  # the statement's snapshot cannot see its own insert
            return True, WorkflowRow(workflow_id, name, status, inputs, None, None, owner_key)
        return False, WorkflowRow(
            workflow_id, wf_name, WorkflowStatus(stored_status), stored_inputs, output, error,
            owner, bool(live),
        )

    def take_over_workflow(
        self, workflow_id: str, old_owner_key: int | None, owner_key: int, executor_id: str
    ) -> bool:
        """Compare-and-set the owner of a PENDING workflow whose session is not alive."""
        with self._pool.connection() as conn:
            row = conn.execute(
                _q("take_over_workflow"),
                {
                    "workflow_id": workflow_id,
                    "old_owner_key": old_owner_key,
                    "owner_key": owner_key,
                    "executor_id": executor_id,
                },
            ).fetchone()
        return row is not None

    def finish_workflow(
        self,
        workflow_id: str,
        status: WorkflowStatus,
        output: str | None,
        error: str | None,
        owner_key: int | None,
    ) -> tuple[bool, WorkflowStatus, str | None, str | None]:
        """Record a PENDING workflow's outcome; if it was finished already, return that one."""
        with self._pool.connection() as conn:
            row = conn.execute(
                _q("finish_workflow"),
                {
                    "workflow_id": workflow_id,
                    "status": status,
                    "output": output,
                    "error": error,
                    "owner_key": owner_key,
                },
            ).fetchone()
        if row is None:
            raise LookupError(workflow_id)
        return row[0], WorkflowStatus(row[1]), row[2], row[3]

    def get_workflow(self, workflow_id: str) -> WorkflowInfo | None:
        """The stored workflow, or None."""
        with self._pool.connection() as conn:
            row = conn.execute(_q("get_workflow"), {"workflow_id": workflow_id}).fetchone()
        return None if row is None else _workflow_info(row)

    def list_workflows(
        self,
        *,
        status: str | None = None,
        name: str | None = None,
        executor_id: str | None = None,
        created_after: datetime | None = None,
        created_before: datetime | None = None,
        limit: int = 100,
    ) -> list[WorkflowInfo]:
        """Workflows matching every given filter, newest first."""
        with self._pool.connection() as conn:
            rows = conn.execute(
                _q("list_workflows"),
                {
                    "status": status,
                    "name": name,
                    "executor_id": executor_id,
                    "created_after": created_after,
                    "created_before": created_before,
                    "limit": limit,
                },
            ).fetchall()
        return [_workflow_info(row) for row in rows]

    # -- steps -----------------------------------------------------------------------

    def record_step(
        self,
        *,
        workflow_id: str,
        seq: int,
        name: str,
        status: StepStatus,
        output: str | None,
        error: str | None,
        attempts: int,
        started_at: datetime,
        owner_key: int | None,
        fresh: bool = False,
    ) -> StepWrite:
        """Append one step to the log: the checkpoint. One round trip, one commit.

        ``fresh`` says no intent row can hold the position (an idempotent step),
        which allows the cheap plain insert; every other case, and every
        surprise, goes through the statement that explains and adopts.
        """
        params = {
            "owner_key": owner_key,
            "workflow_id": workflow_id,
            "seq": seq,
            "name": name,
            "status": status,
            "output": output,
            "error": error,
            "attempts": attempts,
            "started_at": started_at,
        }
        with self._checkpoint_errors(workflow_id, seq), self._pool.connection() as conn:
            if fresh:
                try:
                    if conn.execute(_q("append_step"), params).fetchone() is not None:
                        return StepWrite(True, WorkflowStatus.PENDING, None)
                except psycopg.errors.UniqueViolation:
                    pass  # a concurrent run recorded this position: adopt it below
            row = conn.execute(_q("record_step"), params).fetchone()
        return self._step_write(seq, row)

    @contextmanager
    def _checkpoint_errors(self, workflow_id: str, seq: int) -> Iterator[None]:
        """Database failures while writing the log become CheckpointError, so that no
        caller mistakes them for the step's own error."""
        try:
            yield
        except (psycopg.Error, PoolTimeout) as exc:
            raise CheckpointError(
                f"could not write step {seq} of workflow {workflow_id!r} to the log at "
                f"{self.redacted_url}: {type(exc).__name__}: {str(exc).strip()}"
            ) from exc

    def record_step_intent(
        self, *, workflow_id: str, seq: int, name: str, inputs: str, owner_key: int | None
    ) -> StepWrite:
        """Durably note that a non-idempotent step is about to run (one round trip)."""
        with self._checkpoint_errors(workflow_id, seq), self._pool.connection() as conn:
            row = conn.execute(
                _q("record_step_intent"),
                {
                    "workflow_id": workflow_id,
                    "seq": seq,
                    "name": name,
                    "inputs": inputs,
                    "owner_key": owner_key,
                },
            ).fetchone()
        return self._step_write(seq, row)

    @staticmethod
    def _step_write(seq: int, row: Sequence[Any] | None) -> StepWrite:
        assert row is not None
        written, wf_status, s_name, s_status, s_output, s_error, s_attempts = row
        existing = (
            None
            if s_name is None
            else StepRow(seq, s_name, StepStatus(s_status), s_output, s_error, s_attempts)
        )
        if wf_status == "NOT_OWNER":
            return StepWrite(written, WorkflowStatus.PENDING, existing, owned=False)
        return StepWrite(
            written, None if wf_status is None else WorkflowStatus(wf_status), existing
        )

    def settle_in_doubt_step(
        self, workflow_id: str, seq: int, output: str | None, owner_key: int | None
    ) -> tuple[str, str] | None:
        """Settle step ``seq``'s intent (fill it with ``output``, or delete it when None)
        and make the IN_DOUBT workflow PENDING again, in one transaction.

        Returns the workflow's ``(name, inputs)``, or None if there was nothing to settle.
        """
        params = {"workflow_id": workflow_id, "seq": seq, "output": output, "owner_key": owner_key}
        query = _q("delete_step_intent" if output is None else "resolve_step_intent")
        with self._pool.connection() as conn, conn.transaction():
            step = conn.execute(query, params).fetchone()
            reopened = conn.execute(_q("reopen_in_doubt_workflow"), params).fetchone()
            if step is None or reopened is None:
                raise psycopg.Rollback()
            return reopened[0], reopened[1]
        return None

    def load_steps(self, workflow_id: str) -> dict[int, StepRow]:
        """One workflow's whole log, keyed by position."""
        with self._pool.connection() as conn:
            rows = conn.execute(_q("load_steps"), {"workflow_id": workflow_id}).fetchall()
        return {row[1]: _step_row(row) for row in rows}

    def load_steps_of_many(self, workflow_ids: list[str]) -> dict[str, dict[int, StepRow]]:
        """The logs of many workflows in one query."""
        logs: dict[str, dict[int, StepRow]] = {wid: {} for wid in workflow_ids}
        with self._pool.connection() as conn:
            for row in conn.execute(_q("load_steps_of_many"), {"workflow_ids": workflow_ids}):
                logs[row[0]][row[1]] = _step_row(row)
        return logs

    def list_steps(self, workflow_id: str) -> list[StepInfo]:
        """Every recorded step of a workflow, in order, for people and tools."""
        with self._pool.connection() as conn:
            rows = conn.execute(_q("list_steps"), {"workflow_id": workflow_id}).fetchall()
        return [
            StepInfo(
                workflow_id=row[0],
                seq=row[1],
                name=row[2],
                status=StepStatus(row[3]),
                output=_json(row[4]),
                error=_json(row[5]),
                attempts=row[6],
                started_at=row[7],
                finished_at=row[8],
                inputs=_json(row[9]),
            )
            for row in rows
        ]

    # -- recovery --------------------------------------------------------------------

    def claim_workflows(
        self,
        *,
        executor_id: str,
        owner_key: int,
        app_version: str | None,
        names: list[str],
        skip_ids: list[str],
        orphans: bool,
        after: tuple[datetime, str] | None,
        limit: int,
    ) -> list[RecoveryClaim]:
        """Take over the next page of PENDING workflows whose session is gone (queries.sql)."""
        after_created_at, after_id = after if after else (_EPOCH, "")
        with self._pool.connection() as conn:
            rows = conn.execute(
                _q("claim_workflows"),
                {
                    "executor_id": executor_id,
                    "owner_key": owner_key,
                    "app_version": app_version,
                    "names": names,
                    "skip_ids": skip_ids,
                    "orphans": orphans,
                    "after_created_at": after_created_at,
                    "after_workflow_id": after_id,
                    "limit": limit,
                },
            ).fetchall()
        claims = [
            RecoveryClaim(r[0], r[1], WorkflowStatus(r[2]), r[3], r[4], r[5], r[6]) for r in rows
        ]
        claims.sort(key=lambda c: (c.created_at, c.workflow_id))
        return claims

    def delete_dead_executors(self) -> None:
        """Forget executor sessions that are gone for good and own nothing."""
        with self._pool.connection() as conn:
            conn.execute(_q("delete_dead_executors"))

    def dequeue_workflows(
        self,
        *,
        queue_name: str,
        names: list[str],
        owner_key: int,
        executor_id: str,
        app_version: str | None,
        free_slots: int,
        concurrency: int | None,
        worker_concurrency: int | None,
        rate_limit: tuple[int, float] | None,
    ) -> list[tuple[str, str, str]]:
        """Take ``(workflow_id, name, inputs)`` of queued workflows as the limits allow."""
        limit, period = rate_limit if rate_limit else (None, 1.0)
        with self._pool.connection() as conn, conn.transaction():
            conn.execute(_q("lock_queue"), {"queue_name": queue_name})
            rows = conn.execute(
                _q("dequeue_workflows"),
                {
                    "queue_name": queue_name,
                    "names": names,
                    "owner_key": owner_key,
                    "executor_id": executor_id,
                    "app_version": app_version,
                    "free_slots": free_slots,
                    "concurrency": concurrency,
                    "worker_concurrency": worker_concurrency,
                    "rate_limit": limit,
                    "rate_period": period,
                },
            ).fetchall()
        return [(r[0], r[1], r[2]) for r in rows]

    def count_unrecoverable_pending(self, executor_id: str, names: list[str]) -> dict[str, int]:
        """``{workflow name: count}`` of PENDING workflows no registered function can run."""
        with self._pool.connection() as conn:
            rows = conn.execute(
                _q("count_unrecoverable_pending"), {"executor_id": executor_id, "names": names}
            ).fetchall()
        return {name: count for name, count in rows}

    # -- messages, events and timers --

    def database_time(self) -> float:
        """The database's clock in epoch seconds: the one clock every executor shares."""
        with self._pool.connection() as conn:
            row = conn.execute(_q("get_database_time")).fetchone()
        assert row is not None
        return float(row[0])

    def insert_message(
        self, *, destination_id: str, topic: str, message: str, idempotency_key: str | None
    ) -> tuple[bool, bool]:
        """Send a message; ``(destination exists, inserted)`` (a known key inserts nothing)."""
        with self._pool.connection() as conn:
            row = conn.execute(
                _q("insert_message"),
                {
                    "destination_id": destination_id,
                    "topic": topic,
                    "message": message,
                    "idempotency_key": idempotency_key,
                },
            ).fetchone()
        assert row is not None
        return bool(row[0]), bool(row[1])

    def receive_message(
        self,
        *,
        workflow_id: str,
        seq: int,
        name: str,
        topic: str,
        inputs: str,
        started_at: datetime,
        owner_key: int | None,
    ) -> tuple[StepWrite, str | None]:
        """Consume the oldest message and record it as step ``seq``, atomically.

        Returns the write (``written`` when a message was taken) and the message's JSON.
        """
        with self._checkpoint_errors(workflow_id, seq), self._pool.connection() as conn:
            row = conn.execute(
                _q("receive_message"),
                {
                    "workflow_id": workflow_id,
                    "seq": seq,
                    "name": name,
                    "topic": topic,
                    "inputs": inputs,
                    "started_at": started_at,
                    "owner_key": owner_key,
                },
            ).fetchone()
        assert row is not None
        return self._step_write(seq, row[:7]), row[7]

    def set_event(
        self,
        *,
        workflow_id: str,
        seq: int,
        name: str,
        key: str,
        value: str,
        inputs: str,
        started_at: datetime,
        owner_key: int | None,
    ) -> StepWrite:
        """Record step ``seq`` and set the event in one statement (neither without the other)."""
        with self._checkpoint_errors(workflow_id, seq), self._pool.connection() as conn:
            row = conn.execute(
                _q("set_event"),
                {
                    "workflow_id": workflow_id,
                    "seq": seq,
                    "name": name,
                    "key": key,
                    "value": value,
                    "inputs": inputs,
                    "started_at": started_at,
                    "owner_key": owner_key,
                },
            ).fetchone()
        return self._step_write(seq, row)

    def get_event(self, workflow_id: str, key: str) -> str | None:
        """The event's JSON, or None when it was never set."""
        with self._pool.connection() as conn:
            row = conn.execute(
                _q("get_event"), {"workflow_id": workflow_id, "key": key}
            ).fetchone()
        return None if row is None else str(row[0])

    def get_step_inputs(self, workflow_id: str, seq: int) -> str | None:
        """The inputs JSON of step ``seq`` (None when the row or its inputs are missing)."""
        with self._pool.connection() as conn:
            row = conn.execute(
                _q("get_step_inputs"), {"workflow_id": workflow_id, "seq": seq}
            ).fetchone()
        return None if row is None else row[0]

    def connect_listener(self) -> psycopg.Connection[TupleRow]:
        """A dedicated (unpooled) autocommit connection for LISTEN."""
        return psycopg.connect(
            self.url,
            autocommit=True,
            connect_timeout=_CONNECT_TIMEOUT_S,
            application_name="dbos_agent_listener",
            keepalives=1,
            keepalives_idle=30,
            keepalives_interval=10,
            keepalives_count=3,
        )

    @staticmethod
    def listen(conn: psycopg.Connection[TupleRow], channel: str) -> None:
        """``LISTEN channel`` on a listener connection (the name is quoted, not trusted)."""
        conn.execute(psycopg.sql.SQL("LISTEN {}").format(psycopg.sql.Identifier(channel)))

    # -- operator actions --

    def cancel_workflow(self, workflow_id: str) -> CancelResult | None:
        """Cancel an unfinished (or stuck) workflow and notify its runner; None if unknown."""
        with self._pool.connection() as conn:
            row = conn.execute(_q("cancel_workflow"), {"workflow_id": workflow_id}).fetchone()
        return None if row is None else CancelResult(bool(row[0]), WorkflowStatus(row[1]))

    def resume_workflow(
        self, workflow_id: str, *, executor_id: str | None, owner_key: int | None
    ) -> ResumeResult | None:
        """Make a cancelled, dead-lettered or settled in-doubt workflow PENDING; None if unknown.

        ``owner_key`` is the session that will run it now (None: whoever claims it);
        ``executor_id`` None keeps the workflow's executor.
        """
        with self._pool.connection() as conn:
            row = conn.execute(
                _q("resume_workflow"),
                {"workflow_id": workflow_id, "executor_id": executor_id, "owner_key": owner_key},
            ).fetchone()
        if row is None:
            return None
        resumed, previous, now, open_intent, name, inputs, executor = row
        return ResumeResult(
            bool(resumed),
            WorkflowStatus(previous),
            None if now is None else WorkflowStatus(now),
            open_intent,
            name,
            inputs,
            executor,
        )

    def fork_workflow(
        self,
        workflow_id: str,
        *,
        new_workflow_id: str,
        from_step: int,
        executor_id: str | None,
        owner_key: int | None,
    ) -> ForkResult | None:
        """Copy a workflow and its recorded steps below ``from_step`` under a new id, PENDING.

        One statement: nothing is written unless everything is. None if the original is unknown.
        """
        with self._pool.connection() as conn:
            row = conn.execute(
                _q("fork_workflow"),
                {
                    "workflow_id": workflow_id,
                    "new_workflow_id": new_workflow_id,
                    "from_step": from_step,
                    "executor_id": executor_id,
                    "owner_key": owner_key,
                },
            ).fetchone()
        if row is None:
            return None
        forked, copied, name, inputs, executor, last_seq, open_intent = row
        return ForkResult(bool(forked), copied, name, inputs, executor, last_seq, open_intent)

    def fork_origin(self, workflow_id: str) -> tuple[str, int] | None:
        """``(original id, from_step)`` of a forked workflow, else None."""
        with self._pool.connection() as conn:
            row = conn.execute(_q("get_fork_origin"), {"workflow_id": workflow_id}).fetchone()
        return None if row is None or row[0] is None else (row[0], row[1])

    def schema_version(self) -> int:
        """The newest migration applied to this database (0 before the first ``migrate``)."""
        with self._pool.connection() as conn:
            exists = conn.execute(_q("has_schema")).fetchone()
            if exists is None or not exists[0]:
                return 0
            row = conn.execute(_q("get_schema_version")).fetchone()
        return 0 if row is None else int(row[0])
