"""The system database: the only module that talks to Postgres.

Every statement comes from ``sql/queries.sql`` by name and its rows are read by
column name. Each method is one round trip on an autocommit connection from a
pool (or one short transaction), so a checkpoint is durable when the method
returns. Every method rides out an outage (see ``outages.py``): a call is
retried with backoff until the outage bound, and a statement is re-sent only
where the query makes a second run harmless (a guarded insert, a claim whose
workflows the owner takes back later).

What goes in is checked here, once for every caller: the size of each JSON value
against the checkpoint limit, NUL characters made storable (``jsonb.py``), and a
value Postgres still refuses reported as the caller's :class:`SerializationError`.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, LiteralString, TypeVar

import psycopg
from psycopg.rows import DictRow, dict_row

from ..errors import (
    CheckpointError,
    CheckpointTooLargeError,
    DatabaseUnavailableError,
    SchemaVersionError,
    SerializationError,
)
from ..limits import DEFAULT_MAX_CHECKPOINT_BYTES
from ..records import StepInfo, StepStatus, WorkflowInfo, WorkflowStatus
from . import jsonb
from .dsn import redact_url
from .outages import (
    DEFAULT_OUTAGE_TIMEOUT_S,
    OutageMonitor,
    Retrier,
    describe,
    is_transient,
    is_value_error,
)
from .pool import ConnectionPool
from .sql_files import migrations, queries

log = logging.getLogger(__name__)

T = TypeVar("T")
Row = dict[str, Any]

# pg_advisory_xact_lock key for schema migrations: hashtext('dbos_agent.migrate').
_MIGRATION_LOCK_KEY = 0x0DB05A6E
_CONNECT_TIMEOUT_S = 10
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_WEED_EVERY_S = 0.5


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
    """The outcome of a log write: whether it wrote, and what the workflow and the
    position held instead when it did not."""

    written: bool
    workflow_status: WorkflowStatus | None
    existing: StepRow | None
    #: False when the workflow is PENDING under another session (it was taken over).
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


@dataclass(frozen=True, slots=True)
class UnlockedSession:
    """An executor session whose lock is free and which is not yet known dead."""

    session_key: int
    pid: int
    process_key: str | None


class _OutcomeUnknown(Exception):
    """A statement that must not run twice lost its connection after it was sent."""


def _q(name: str) -> LiteralString:
    # The named queries are static text shipped with the package, never user input.
    query: LiteralString = queries()[name]
    return query


def _text(value: Any) -> str | None:
    """A JSON column read as text, as the caller stored it."""
    return jsonb.from_db(value)


def _workflow_info(row: Row) -> WorkflowInfo:
    return WorkflowInfo(
        workflow_id=row["workflow_id"],
        name=row["name"],
        status=WorkflowStatus(row["status"]),
        inputs=jsonb.parse(row["inputs"]),
        output=jsonb.parse(row["output"]),
        error=jsonb.parse(row["error"]),
        executor_id=row["executor_id"],
        app_version=row["app_version"],
        recovery_attempts=row["recovery_attempts"],
        max_recovery_attempts=row["max_recovery_attempts"],
        created_at=row["created_at"],
        updated_at=row["updated_at"],
        finished_at=row["finished_at"],
    )


def _step_row(row: Row, seq: int | None = None) -> StepRow:
    return StepRow(
        row["seq"] if seq is None else seq,
        row["name"],
        StepStatus(row["status"]),
        _text(row["output"]),
        _text(row["error"]),
        row["attempts"],
    )


def _step_write(seq: int, row: Row | None) -> StepWrite:
    assert row is not None
    existing = None if row["name"] is None else _step_row(row, seq)
    status = row["workflow_status"]
    if status == "NOT_OWNER":
        return StepWrite(bool(row["written"]), WorkflowStatus.PENDING, existing, owned=False)
    return StepWrite(
        bool(row["written"]), None if status is None else WorkflowStatus(status), existing
    )


class SystemDatabase:
    """A connection pool on the system database plus the named queries on it.

    ``outage_timeout`` bounds how long each call retries through an outage;
    ``max_checkpoint_bytes`` is the largest JSON value one write may carry.
    """

    def __init__(
        self,
        url: str,
        *,
        pool_size: int = 20,
        outage_timeout: float = DEFAULT_OUTAGE_TIMEOUT_S,
        max_checkpoint_bytes: int = DEFAULT_MAX_CHECKPOINT_BYTES,
    ) -> None:
        if max_checkpoint_bytes < 1:
            raise ValueError(f"max_checkpoint_bytes must be >= 1, got {max_checkpoint_bytes}")
        self.url = url
        self.redacted_url = redact_url(url)
        self.max_checkpoint_bytes = max_checkpoint_bytes
        self.monitor = OutageMonitor(self.redacted_url)
        self.retrier = Retrier(self.monitor, outage_timeout)
        self._weeded_at = 0.0
        self._weed_lock = threading.Lock()
        self._pool = ConnectionPool(self._connect_pooled, max(1, pool_size))

    def _connect_pooled(self) -> psycopg.Connection[DictRow]:
        return psycopg.connect(
            self.url,
            autocommit=True,
            row_factory=dict_row,
            **self._connection_options("dbos_agent"),
        )

    @staticmethod
    def _connection_options(application_name: str, keepalives_idle: int = 30) -> dict[str, Any]:
        """The options of every connection: bounded connect, and dead peers noticed."""
        return {
            "connect_timeout": _CONNECT_TIMEOUT_S,
            "application_name": application_name,
            "keepalives": 1,
            "keepalives_idle": keepalives_idle,
            "keepalives_interval": max(1, keepalives_idle // 3),
            "keepalives_count": 3,
        }

    # -- lifecycle -----------------------------------------------------------------

    def open(self) -> None:
        """Check the server answers: a clear error within ~10 s, not retries for minutes."""
        try:
            with self._pool.connection(timeout=_CONNECT_TIMEOUT_S):
                pass
        except psycopg.Error as exc:
            raise DatabaseUnavailableError(
                f"cannot connect to the dbos_agent database at {self.redacted_url}: {describe(exc)}"
            ) from None

    def close(self) -> None:
        """Close every pooled connection."""
        self._pool.close()

    @contextmanager
    def connection(self) -> Iterator[psycopg.Connection[DictRow]]:
        """A pooled autocommit connection, rows as dicts (for tests and tools)."""
        with self._pool.connection(timeout=_CONNECT_TIMEOUT_S) as conn:
            yield conn

    def connect_dedicated(
        self, application_name: str, *, keepalives_idle: int = 30
    ) -> psycopg.Connection[tuple[Any, ...]]:
        """A connection of its own (not pooled, autocommit): the session's, the listener's."""
        return psycopg.connect(
            self.url,
            autocommit=True,
            **self._connection_options(application_name, keepalives_idle),
        )

    # -- the one way statements run --------------------------------------------------

    def _weed(self, exc: BaseException) -> None:
        """After a connection failure, drop the idle connections in one go (they died with
        it, most likely), so that the retry does not walk through them one by one."""
        now = time.monotonic()
        with self._weed_lock:
            if now - self._weeded_at < _WEED_EVERY_S:
                return
            self._weeded_at = now
        self._pool.drop_idle()

    def _attempt_wait(self) -> float:
        """How long one attempt waits for a pooled connection."""
        return max(0.1, min(5.0, self.retrier.timeout))

    def run(
        self,
        what: str,
        body: Callable[[psycopg.Connection[DictRow]], T],
        *,
        where: str | None = None,
        resend: bool = True,
        transaction: bool = False,
    ) -> T:
        """``body(conn)`` on a pooled connection, through outages.

        ``what`` completes "could not ..." in errors. ``where`` names the value being
        written: a value Postgres refuses then raises SerializationError naming it.
        With ``resend=False`` the statement is not sent again once it may have run.
        """

        def once(conn: psycopg.Connection[DictRow]) -> T:
            if not transaction:
                return body(conn)
            with conn.transaction():
                return body(conn)

        def attempt() -> T:
            with self._pool.connection(timeout=self._attempt_wait()) as conn:
                try:
                    if resend:
                        return once(conn)
                    conn.execute("SELECT 1")  # a dead pooled connection fails here, harmlessly
                    try:
                        return once(conn)
                    except psycopg.Error as exc:
                        if is_transient(exc):
                            raise _OutcomeUnknown(describe(exc)) from exc
                        raise
                except psycopg.Error as exc:
                    if is_transient(exc):  # e.g. read-only after a failover: never reuse it
                        conn.close()
                    raise

        try:
            return self.retrier.call(attempt, what, on_failure=self._weed)
        except _OutcomeUnknown as exc:
            raise DatabaseUnavailableError(
                f"could not {what}: the connection to the database was lost while it ran "
                f"({exc}); check whether it took effect before trying again"
            ) from None
        except psycopg.Error as exc:
            if where is not None and is_value_error(exc):
                raise SerializationError(
                    f"{where}: Postgres refused the value ({describe(exc)})"
                ) from None
            raise

    def one(self, query: str, what: str, *, where: str | None = None, **params: Any) -> Row | None:
        """The first row of a named query (None when it returns none)."""
        return self.run(what, lambda c: c.execute(_q(query), params).fetchone(), where=where)

    def all(self, query: str, what: str, **params: Any) -> list[Row]:
        """Every row of a named query."""
        return self.run(what, lambda c: c.execute(_q(query), params).fetchall())

    def _json_in(self, text: str, where: str) -> str:
        """A JSON value ready to be written: within the size limit, NUL characters storable."""
        limit = self.max_checkpoint_bytes
        if len(text) * 4 > limit:  # only then can it be over the limit: count the bytes
            size = len(text.encode("utf-8", "surrogatepass"))
            if size > limit:
                raise CheckpointTooLargeError(where, size, limit)
        return jsonb.to_db(text)

    def _json_in_optional(self, text: str | None, where: str) -> str | None:
        return None if text is None else self._json_in(text, where)

    @contextmanager
    def _log_write(self, workflow_id: str, seq: int) -> Iterator[None]:
        """Failures while writing the log are CheckpointError, so that no caller mistakes
        them for the step's own error. A refused value stays a SerializationError."""
        try:
            yield
        except (SerializationError, CheckpointError):
            raise
        except DatabaseUnavailableError as exc:
            raise CheckpointError(
                f"could not write step {seq} of workflow {workflow_id!r}: {exc}"
            ) from None
        except psycopg.Error as exc:
            raise CheckpointError(
                f"could not write step {seq} of workflow {workflow_id!r} to the log at "
                f"{self.redacted_url}: {describe(exc)}",
                retryable=False,
            ) from exc

    # -- schema ----------------------------------------------------------------------

    def migrate(self) -> int:
        """Apply the numbered migrations in ``sql/migrations`` that are missing.

        Safe when several processes start at once: a transaction-scoped advisory
        lock serialises them, and the loser finds everything applied.
        Returns the schema version now in force.
        """
        known = migrations()
        newest_known = known[-1][0] if known else 0

        def body(conn: psycopg.Connection[DictRow]) -> None:
            conn.execute("SELECT pg_advisory_xact_lock(%s)", (_MIGRATION_LOCK_KEY,))
            conn.execute("CREATE SCHEMA IF NOT EXISTS dbos_agent")
            conn.execute(
                "CREATE TABLE IF NOT EXISTS dbos_agent.schema_migrations ("
                " version integer PRIMARY KEY, name text NOT NULL,"
                " applied_at timestamptz NOT NULL DEFAULT now())"
            )
            rows = conn.execute("SELECT version FROM dbos_agent.schema_migrations").fetchall()
            applied = {row["version"] for row in rows}
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

        self.run("apply the dbos_agent schema", body, transaction=True)
        return newest_known

    def schema_version(self) -> int:
        """The newest migration applied to this database (0 before the first ``migrate``)."""

        def body(conn: psycopg.Connection[DictRow]) -> int:
            present = conn.execute(_q("has_schema")).fetchone()
            if present is None or not present["present"]:
                return 0
            row = conn.execute(_q("get_schema_version")).fetchone()
            return 0 if row is None else int(row["version"])

        return self.run("read the schema version", body)

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
        where = f"the inputs of workflow {workflow_id!r} ({name})"
        row = self.one(
            "insert_workflow",
            f"record workflow {workflow_id!r}",
            where=where,
            workflow_id=workflow_id,
            name=name,
            status=status,
            inputs=self._json_in(inputs, where),
            executor_id=executor_id,
            app_version=app_version,
            max_recovery_attempts=max_recovery_attempts,
            owner_key=None if queue_name is not None else owner_key,
            queue_name=queue_name,
            priority=priority,
        )
        assert row is not None
        if row["inserted"]:  # the statement's snapshot cannot see its own insert
            return True, WorkflowRow(workflow_id, name, status, inputs, None, None, owner_key)
        return False, WorkflowRow(
            workflow_id,
            row["name"],
            WorkflowStatus(row["status"]),
            _text(row["inputs"]) or "{}",
            _text(row["output"]),
            _text(row["error"]),
            row["owner_key"],
            bool(row["owner_live"]),
        )

    def take_over_workflow(
        self, workflow_id: str, old_owner_key: int | None, owner_key: int, executor_id: str
    ) -> bool:
        """Compare-and-set the owner of a PENDING workflow whose session is dead."""
        row = self.one(
            "take_over_workflow",
            f"take over workflow {workflow_id!r}",
            workflow_id=workflow_id,
            old_owner_key=old_owner_key,
            owner_key=owner_key,
            executor_id=executor_id,
        )
        return row is not None

    def workflow_owner(self, workflow_id: str) -> tuple[WorkflowStatus, int | None] | None:
        """``(status, owning session)`` of a workflow, or None when there is no such one."""
        row = self.one(
            "get_workflow_owner",
            f"read the owner of workflow {workflow_id!r}",
            workflow_id=workflow_id,
        )
        return None if row is None else (WorkflowStatus(row["status"]), row["owner_key"])

    def finish_workflow(
        self,
        workflow_id: str,
        status: WorkflowStatus,
        output: str | None,
        error: str | None,
        owner_key: int | None,
    ) -> tuple[bool, WorkflowStatus, str | None, str | None]:
        """Record a PENDING workflow's outcome; if it was finished already, return that one.

        Raises CheckpointTooLargeError (writing nothing) for an output over the limit.
        """
        where = f"the output of workflow {workflow_id!r}"
        row = self.one(
            "finish_workflow",
            f"record the outcome of workflow {workflow_id!r}",
            where=where,
            workflow_id=workflow_id,
            status=status,
            output=self._json_in_optional(output, where),
            error=jsonb.to_db_optional(error),  # clipped when recorded: never over the limit
            owner_key=owner_key,
        )
        if row is None:
            raise LookupError(workflow_id)
        return (
            bool(row["updated"]),
            WorkflowStatus(row["status"]),
            _text(row["output"]),
            _text(row["error"]),
        )

    def get_workflow(self, workflow_id: str) -> WorkflowInfo | None:
        """The stored workflow, or None."""
        row = self.one("get_workflow", f"read workflow {workflow_id!r}", workflow_id=workflow_id)
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
        rows = self.all(
            "list_workflows",
            "list workflows",
            status=status,
            name=name,
            executor_id=executor_id,
            created_after=created_after,
            created_before=created_before,
            limit=limit,
        )
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
        where = f"workflow {workflow_id!r} step {seq} ({name}) output"
        with self._log_write(workflow_id, seq):
            params = {
                "owner_key": owner_key,
                "workflow_id": workflow_id,
                "seq": seq,
                "name": name,
                "status": status,
                "output": self._json_in_optional(output, where),
                "error": jsonb.to_db_optional(error),  # clipped when recorded
                "attempts": attempts,
                "started_at": started_at,
            }

            def body(conn: psycopg.Connection[DictRow]) -> StepWrite:
                if fresh:
                    try:
                        if conn.execute(_q("append_step"), params).fetchone() is not None:
                            return StepWrite(True, WorkflowStatus.PENDING, None)
                    except psycopg.errors.UniqueViolation:
                        pass  # the position is taken (a retry, a race): explain and adopt below
                return _step_write(seq, conn.execute(_q("record_step"), params).fetchone())

            return self.run(f"write step {seq} of workflow {workflow_id!r}", body, where=where)

    def record_step_intent(
        self, *, workflow_id: str, seq: int, name: str, inputs: str, owner_key: int | None
    ) -> StepWrite:
        """Durably note that a non-idempotent step is about to run (one round trip)."""
        where = f"workflow {workflow_id!r} step {seq} ({name}) inputs"
        with self._log_write(workflow_id, seq):
            row = self.one(
                "record_step_intent",
                f"write the intent of step {seq} of workflow {workflow_id!r}",
                where=where,
                workflow_id=workflow_id,
                seq=seq,
                name=name,
                inputs=self._json_in(inputs, where),
                owner_key=owner_key,
            )
        return _step_write(seq, row)

    def settle_in_doubt_step(
        self, workflow_id: str, seq: int, output: str | None, owner_key: int | None
    ) -> tuple[str, str] | None:
        """Settle step ``seq``'s intent (fill it with ``output``, or delete it when None)
        and make the IN_DOUBT workflow PENDING again, in one transaction.

        Returns the workflow's ``(name, inputs)``, or None if there was nothing to settle.
        """
        where = f"workflow {workflow_id!r} step {seq} result"
        params = {
            "workflow_id": workflow_id,
            "seq": seq,
            "output": self._json_in_optional(output, where),
            "owner_key": owner_key,
        }
        query = _q("delete_step_intent" if output is None else "resolve_step_intent")

        def body(conn: psycopg.Connection[DictRow]) -> tuple[str, str] | None:
            step = conn.execute(query, params).fetchone()
            reopened = conn.execute(_q("reopen_in_doubt_workflow"), params).fetchone()
            if step is None or reopened is None:
                raise psycopg.Rollback()
            return reopened["name"], _text(reopened["inputs"]) or "{}"

        result: tuple[str, str] | None = self.run(
            f"settle step {seq} of workflow {workflow_id!r}",
            body,
            where=where,
            resend=False,
            transaction=True,
        )
        return result

    def load_steps(self, workflow_id: str) -> dict[int, StepRow]:
        """One workflow's whole log, keyed by position."""
        rows = self.all(
            "load_steps", f"read the log of workflow {workflow_id!r}", workflow_id=workflow_id
        )
        return {row["seq"]: _step_row(row) for row in rows}

    def load_steps_of_many(self, workflow_ids: list[str]) -> dict[str, dict[int, StepRow]]:
        """The logs of many workflows in one query."""
        logs: dict[str, dict[int, StepRow]] = {wid: {} for wid in workflow_ids}
        for row in self.all("load_steps_of_many", "read workflow logs", workflow_ids=workflow_ids):
            logs[row["workflow_id"]][row["seq"]] = _step_row(row)
        return logs

    def list_steps(self, workflow_id: str) -> list[StepInfo]:
        """Every recorded step of a workflow, in order, for people and tools."""
        rows = self.all(
            "list_steps", f"list the steps of workflow {workflow_id!r}", workflow_id=workflow_id
        )
        return [
            StepInfo(
                workflow_id=row["workflow_id"],
                seq=row["seq"],
                name=row["name"],
                status=StepStatus(row["status"]),
                output=jsonb.parse(row["output"]),
                error=jsonb.parse(row["error"]),
                attempts=row["attempts"],
                started_at=row["started_at"],
                finished_at=row["finished_at"],
                inputs=jsonb.parse(row["inputs"]),
            )
            for row in rows
        ]

    def get_step_inputs(self, workflow_id: str, seq: int) -> str | None:
        """The inputs JSON of step ``seq`` (None when the row or its inputs are missing)."""
        row = self.one(
            "get_step_inputs",
            f"read step {seq} of workflow {workflow_id!r}",
            workflow_id=workflow_id,
            seq=seq,
        )
        return None if row is None else _text(row["inputs"])

    # -- recovery and sessions ------------------------------------------------------------

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
        """Take over the next page of PENDING workflows whose session is dead (queries.sql)."""
        after_created_at, after_id = after if after else (_EPOCH, "")
        rows = self.all(
            "claim_workflows",
            "claim workflows for recovery",
            executor_id=executor_id,
            owner_key=owner_key,
            app_version=app_version,
            names=names,
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
                _text(r["inputs"]) or "{}",
                r["created_at"],
                r["recovery_attempts"],
                r["max_recovery_attempts"],
            )
            for r in rows
        ]
        claims.sort(key=lambda c: (c.created_at, c.workflow_id))
        return claims

    def count_claimable_soon(self, executor_id: str, owner_key: int, names: list[str]) -> int:
        """PENDING workflows of ``executor_id`` whose session lost its lock, within its grace."""
        row = self.one(
            "count_claimable_soon",
            "count workflows awaiting their session's grace",
            executor_id=executor_id,
            owner_key=owner_key,
            names=names,
        )
        return 0 if row is None else int(row["count"])

    def list_owned_idle(
        self, owner_key: int, skip_ids: list[str], limit: int
    ) -> list[tuple[str, str, str]]:
        """``(workflow_id, name, inputs)`` of PENDING workflows this session owns but does
        not run (``skip_ids`` are the ones it runs)."""
        rows = self.all(
            "list_owned_idle",
            "list this session's workflows",
            owner_key=owner_key,
            skip_ids=skip_ids,
            limit=limit,
        )
        return [(r["workflow_id"], r["name"], _text(r["inputs"]) or "{}") for r in rows]

    def list_unlocked_sessions(self) -> list[UnlockedSession]:
        """Sessions whose lock is free and which are not yet known dead."""
        return [
            UnlockedSession(r["session_key"], r["pid"], r["process_key"])
            for r in self.all("list_unlocked_sessions", "list executor sessions")
        ]

    def end_dead_session(self, session_key: int, process_key: str) -> bool:
        """Declare a session dead whose process is known gone (its lock still free)."""
        row = self.one(
            "end_dead_session",
            f"end executor session {session_key}",
            session_key=session_key,
            process_key=process_key,
        )
        return row is not None

    def delete_dead_executors(self) -> None:
        """Forget executor sessions that are dead and own nothing."""
        self.run("forget dead executor sessions", lambda c: c.execute(_q("delete_dead_executors")))

    def count_unrecoverable_pending(self, executor_id: str, names: list[str]) -> dict[str, int]:
        """``{workflow name: count}`` of PENDING workflows no registered function can run."""
        rows = self.all(
            "count_unrecoverable_pending",
            "count unrecoverable workflows",
            executor_id=executor_id,
            names=names,
        )
        return {row["name"]: row["pending"] for row in rows}

    # -- queues ----------------------------------------------------------------------

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
        params = {
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
        }

        def body(conn: psycopg.Connection[DictRow]) -> list[Row]:
            conn.execute(_q("lock_queue"), {"queue_name": queue_name})
            return conn.execute(_q("dequeue_workflows"), params).fetchall()

        rows = self.run(f"dequeue from queue {queue_name!r}", body, transaction=True)
        return [(r["workflow_id"], r["name"], _text(r["inputs"]) or "{}") for r in rows]

    # -- messages, events and timers --

    def database_time(self) -> float:
        """The database's clock in epoch seconds: the one clock every executor shares."""
        row = self.one("get_database_time", "read the database clock")
        assert row is not None
        return float(row["now"])

    def insert_message(
        self, *, destination_id: str, topic: str, message: str, idempotency_key: str | None
    ) -> tuple[bool, bool]:
        """Send a message; ``(destination exists, inserted)`` (a known key inserts nothing)."""
        where = f"message to workflow {destination_id!r}"
        row = self.one(
            "insert_message",
            f"send a message to workflow {destination_id!r}",
            where=where,
            destination_id=destination_id,
            topic=topic,
            message=self._json_in(message, where),
            idempotency_key=idempotency_key,
        )
        assert row is not None
        return bool(row["destination_exists"]), bool(row["inserted"])

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
        with self._log_write(workflow_id, seq):
            row = self.one(
                "receive_message",
                f"receive a message in workflow {workflow_id!r}",
                workflow_id=workflow_id,
                seq=seq,
                name=name,
                topic=topic,
                inputs=jsonb.to_db(inputs),
                started_at=started_at,
                owner_key=owner_key,
            )
        assert row is not None
        return _step_write(seq, row), _text(row["message"])

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
        where = f"workflow {workflow_id!r} event {key!r}"
        with self._log_write(workflow_id, seq):
            row = self.one(
                "set_event",
                f"set event {key!r} of workflow {workflow_id!r}",
                where=where,
                workflow_id=workflow_id,
                seq=seq,
                name=name,
                key=key,
                value=self._json_in(value, where),
                inputs=jsonb.to_db(inputs),
                started_at=started_at,
                owner_key=owner_key,
            )
        return _step_write(seq, row)

    def get_event(self, workflow_id: str, key: str) -> str | None:
        """The event's JSON, or None when it was never set."""
        row = self.one(
            "get_event",
            f"read event {key!r} of workflow {workflow_id!r}",
            workflow_id=workflow_id,
            key=key,
        )
        return None if row is None else _text(row["value"])

    @staticmethod
    def listen(conn: psycopg.Connection[Any], channel: str) -> None:
        """``LISTEN channel`` on a listener connection (the name is quoted, not trusted)."""
        conn.execute(psycopg.sql.SQL("LISTEN {}").format(psycopg.sql.Identifier(channel)))

    # -- operator actions --

    def cancel_workflow(self, workflow_id: str) -> CancelResult | None:
        """Cancel an unfinished (or stuck) workflow and notify its runner; None if unknown."""
        row = self.one(
            "cancel_workflow", f"cancel workflow {workflow_id!r}", workflow_id=workflow_id
        )
        if row is None:
            return None
        return CancelResult(bool(row["cancelled"]), WorkflowStatus(row["status"]))

    def resume_workflow(
        self, workflow_id: str, *, executor_id: str | None, owner_key: int | None
    ) -> ResumeResult | None:
        """Make a cancelled, dead-lettered or settled in-doubt workflow PENDING; None if unknown.

        ``owner_key`` is the session that will run it now (None: whoever claims it);
        ``executor_id`` None keeps the workflow's executor.
        """
        params = {"workflow_id": workflow_id, "executor_id": executor_id, "owner_key": owner_key}
        row = self.run(
            f"resume workflow {workflow_id!r}",
            lambda c: c.execute(_q("resume_workflow"), params).fetchone(),
            resend=False,
        )
        if row is None:
            return None
        return ResumeResult(
            bool(row["resumed"]),
            WorkflowStatus(row["status"]),
            None if row["status_now"] is None else WorkflowStatus(row["status_now"]),
            row["open_intent"],
            row["name"],
            _text(row["inputs"]) or "{}",
            row["executor_id"],
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
        params = {
            "workflow_id": workflow_id,
            "new_workflow_id": new_workflow_id,
            "from_step": from_step,
            "executor_id": executor_id,
            "owner_key": owner_key,
        }
        row = self.run(
            f"fork workflow {workflow_id!r}",
            lambda c: c.execute(_q("fork_workflow"), params).fetchone(),
            resend=False,
        )
        if row is None:
            return None
        return ForkResult(
            bool(row["forked"]),
            row["copied"],
            row["name"],
            _text(row["inputs"]) or "{}",
            row["executor_id"],
            row["last_seq"],
            row["open_intent"],
        )

    def fork_origin(self, workflow_id: str) -> tuple[str, int] | None:
        """``(original id, from_step)`` of a forked workflow, else None."""
        row = self.one("get_fork_origin", f"read workflow {workflow_id!r}", workflow_id=workflow_id)
        if row is None or row["forked_from"] is None:
            return None
        return row["forked_from"], row["forked_from_step"]
