"""The step log: where a step is checkpointed, where an intent is written, how a log is read.

Every write is guarded on the workflow being PENDING and owned by the writing
session (``write_status`` in the schema): a run that lost its workflow cannot write.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Generic, TypeVar

import psycopg

from ..records import StepInfo, StepStatus, WorkflowStatus
from . import jsonb
from .connector import Connection, Connector
from .log_writes import LogWrites
from .rows import StepEffect, StepRow, StepWrite, retry_info, step_row, step_write, text_of
from .sql_files import query

T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class ModelUsage:
    """The model replies of a family recorded under one model, and their tokens."""

    model: str
    replies: int
    input_tokens: int
    output_tokens: int
    cache_creation_input_tokens: int
    cache_read_input_tokens: int


def _apply(
    conn: Connection, effect: StepEffect, workflow_id: str, seq: int, owner_key: int | None
) -> None:
    if effect.kind == "event":
        conn.execute(
            query("put_event"),
            {"workflow_id": workflow_id, "key": effect.key, "value": effect.value},
        )
        return
    # a stream closed already (-1) stays closed: what the step asked for holds
    conn.execute(
        query("append_stream_item"),
        {
            "workflow_id": workflow_id,
            "key": effect.key,
            "kind": "close",
            "value": None,
            "seq": seq,
            "attempt": effect.attempt,
            "attempt_id": effect.attempt_id,
            "owner_key": owner_key,
        },
    )


def _events_set(effects: Sequence[StepEffect]) -> str | None:
    """The events among ``effects`` as the step's row records them: one JSON object,
    the last value of each key (None: the step set none)."""
    last = {e.key: e.value for e in effects if e.kind == "event"}
    if not last:
        return None
    return "{" + ",".join(f"{json.dumps(k, ensure_ascii=False)}:{v}" for k, v in last.items()) + "}"


class StepStore:
    """The ``steps`` table: one row per position, written once."""

    def __init__(self, db: Connector, log: LogWrites) -> None:
        self._db = db
        #: Checkpoints of idempotent steps that arrive together share a commit.
        self._log = log

    def family_model_usage(self, workflow_id: str, names: list[str]) -> list[ModelUsage]:
        """What the recorded model replies (steps named in ``names``) of the workflow's
        family (its root ancestor and all below it) spent, per model: its running total."""
        rows = self._db.all(
            "get_family_model_usage",
            f"read the model usage of workflow {workflow_id!r} and its family",
            workflow_id=workflow_id,
            names=names,
        )
        return [
            ModelUsage(
                str(r["model"]),
                int(r["replies"]),
                int(r["input_tokens"]),
                int(r["output_tokens"]),
                int(r["cache_creation_input_tokens"]),
                int(r["cache_read_input_tokens"]),
            )
            for r in rows
        ]

    def record(
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
        effects: Sequence[StepEffect] = (),
    ) -> StepWrite:
        """Append one step to the log: the checkpoint. One round trip, one commit.

        ``fresh`` says no intent row can hold the position (an idempotent step),
        which allows the cheap plain insert; every other case, and every
        surprise, goes through the statement that explains and adopts. ``effects``
        (writes the step asked for) are made in the same transaction, only if the step
        row is written: a step with some takes that path, one more round trip. The
        events among them are recorded on the row too, for a fork and a rewind.
        """
        where = f"workflow {workflow_id!r} step {seq} ({name}) output"
        with self._db.log_write(workflow_id, seq):
            params = {
                "owner_key": owner_key,
                "workflow_id": workflow_id,
                "seq": seq,
                "name": name,
                "status": status,
                "inputs": None,
                "output": self._db.json_in_optional(output, where),
                "error": jsonb.to_db_optional(error),  # clipped when recorded
                "attempts": attempts,
                "started_at": started_at,
            }

            # the position taken (a retry, a race), the guard refusing, a failed batch:
            # record_step explains and adopts
            if fresh and not effects and self._log.append_step(params):
                return StepWrite(True, WorkflowStatus.PENDING, None)

            recorded = {**params, "events": _events_set(effects)}

            def body(conn: Connection) -> StepWrite:
                write = step_write(seq, conn.execute(query("record_step"), recorded).fetchone())
                if write.written:
                    for effect in effects:
                        _apply(conn, effect, workflow_id, seq, owner_key)
                return write

            return self._db.run(
                f"write step {seq} of workflow {workflow_id!r}",
                body,
                where=where,
                transaction=bool(effects),
            )

    def record_intent(
        self, *, workflow_id: str, seq: int, name: str, inputs: str, owner_key: int | None
    ) -> StepWrite:
        """Durably note that a non-idempotent step is about to run (one round trip)."""
        where = f"workflow {workflow_id!r} step {seq} ({name}) inputs"
        with self._db.log_write(workflow_id, seq):
            row = self._db.one(
                "record_step_intent",
                f"write the intent of step {seq} of workflow {workflow_id!r}",
                where=where,
                workflow_id=workflow_id,
                seq=seq,
                name=name,
                inputs=self._db.json_in(inputs, where),
                owner_key=owner_key,
            )
        return step_write(seq, row)

    def retry_later(self, later: RetryLater) -> RetryWrite:
        """Record that step ``later.seq`` waits for its next attempt (RETRYING), and give
        its workflow up to wait (SUSPENDED 'retry') when ``later.suspend``: one guarded
        statement (``retry_step_later``)."""
        where = f"workflow {later.workflow_id!r} step {later.seq} ({later.name}) retry"
        with self._db.log_write(later.workflow_id, later.seq):
            row = self._db.one(
                "retry_step_later",
                f"note the retry of step {later.seq} of workflow {later.workflow_id!r}",
                where=where,
                workflow_id=later.workflow_id,
                seq=later.seq,
                name=later.name,
                error=jsonb.to_db(later.error),
                attempts=later.attempts,
                started_at=later.started_at,
                owner_key=later.owner_key,
                elapsed=later.elapsed,
                delay=later.delay,
                waiting_for=later.waiting_for,
                suspend=later.suspend,
            )
        assert row is not None
        return RetryWrite(
            write=step_write(later.seq, row),
            since=float(row["since"]),
            next_at=float(row["next_at"]),
            now=float(row["now"]),
            suspended=bool(row["suspended"]),
        )

    def reopen_intent(self, workflow_id: str, seq: int, name: str, owner_key: int | None) -> bool:
        """Make a non-idempotent step's RETRYING row its intent again before it is tried
        again (a crash during the attempt then leaves it in doubt); False when the row is
        not that, or the workflow is no longer the caller's."""
        row = self._db.one(
            "reopen_step_intent",
            f"reopen the intent of step {seq} of workflow {workflow_id!r}",
            workflow_id=workflow_id,
            seq=seq,
            name=name,
            owner_key=owner_key,
        )
        return row is not None

    def resolve_in_doubt(
        self, workflow_id: str, seq: int, output: str | None, owner_key: int | None
    ) -> tuple[str, str] | None:
        """Resolve step ``seq``'s intent (fill it with ``output``, or delete it when None)
        and make the IN_DOUBT workflow PENDING again, in one transaction.

        Returns the workflow's ``(name, inputs)``, or None if there was nothing to resolve.
        """
        where = f"workflow {workflow_id!r} step {seq} result"
        params = {
            "workflow_id": workflow_id,
            "seq": seq,
            "output": self._db.json_in_optional(output, where),
            "owner_key": owner_key,
        }
        resolve = query("delete_step_intent" if output is None else "resolve_step_intent")

        def body(conn: Connection) -> tuple[str, str] | None:
            step = conn.execute(resolve, params).fetchone()
            reopened = conn.execute(query("reopen_in_doubt_workflow"), params).fetchone()
            if step is None or reopened is None:
                raise psycopg.Rollback()
            return reopened["name"], text_of(reopened["inputs"]) or "{}"

        result: tuple[str, str] | None = self._db.run(
            f"resolve step {seq} of workflow {workflow_id!r}",
            body,
            where=where,
            resend=False,
            transaction=True,
        )
        return result

    def load(self, workflow_id: str) -> dict[int, StepRow]:
        """One workflow's whole log, keyed by position."""
        rows = self._db.all(
            "load_steps", f"read the log of workflow {workflow_id!r}", workflow_id=workflow_id
        )
        return {row["seq"]: step_row(row) for row in rows}

    def load_many(self, workflow_ids: list[str]) -> dict[str, dict[int, StepRow]]:
        """The logs of many workflows in one query."""
        logs: dict[str, dict[int, StepRow]] = {wid: {} for wid in workflow_ids}
        for row in self._db.all(
            "load_steps_of_many", "read workflow logs", workflow_ids=workflow_ids
        ):
            logs[row["workflow_id"]][row["seq"]] = step_row(row)
        return logs

    def load_owned(
        self, workflow_ids: list[str], owner_key: int | None
    ) -> dict[str, dict[int, StepRow]]:
        """The logs of those of ``workflow_ids`` that are PENDING and owned by
        ``owner_key``, read with their state in one query (the others are left out)."""
        logs: dict[str, dict[int, StepRow]] = {}
        for row in self._db.all(
            "load_owned_logs",
            "read the logs of claimed workflows",
            workflow_ids=workflow_ids,
            owner_key=owner_key,
        ):
            steps = logs.setdefault(row["workflow_id"], {})
            if row["seq"] is not None:
                steps[row["seq"]] = step_row(row)
        return logs

    def list(self, workflow_id: str) -> list[StepInfo]:
        """Every recorded step of a workflow, in order, for people and tools."""
        rows = self._db.all(
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
                retry=retry_info(
                    row["seq"], row["name"], row["attempts"], row["error"], row["retry"]
                ),
            )
            for row in rows
        ]

    def inputs(self, workflow_id: str, seq: int) -> str | None:
        """The inputs JSON of step ``seq`` (None when the row or its inputs are missing)."""
        row = self._db.one(
            "get_step_inputs",
            f"read step {seq} of workflow {workflow_id!r}",
            workflow_id=workflow_id,
            seq=seq,
        )
        return None if row is None else text_of(row["inputs"])


@dataclass(frozen=True, slots=True)
class RetryLater:
    """What :meth:`StepStore.retry_later` writes: a failed attempt's error (JSON), the
    attempts so far, how long ago the first one started (``elapsed``, used when no earlier
    RETRYING row says it), the wait before the next one, what it waits for, and whether
    the workflow is given up meanwhile."""

    workflow_id: str
    seq: int
    name: str
    error: str
    attempts: int
    started_at: datetime
    owner_key: int | None
    elapsed: float
    delay: float
    waiting_for: str
    suspend: bool


@dataclass(frozen=True, slots=True)
class RetryWrite:
    """What :meth:`StepStore.retry_later` did: the write (as a checkpoint's), the first
    attempt's and the next attempt's times and the time of the write (epoch seconds,
    database clock), and whether the workflow is SUSPENDED now."""

    write: StepWrite
    since: float
    next_at: float
    #: The database clock when it was written.
    now: float
    suspended: bool


@dataclass(frozen=True, slots=True)
class Checkpointed(Generic[T]):
    """What :func:`write_with_checkpoint` did: the checkpoint, and the write's own result
    (None when the checkpoint was refused and the write rolled back)."""

    write: StepWrite
    result: T | None


class _Refused(Exception):
    def __init__(self, write: StepWrite) -> None:
        super().__init__("the checkpoint was refused")
        self.write = write


def write_with_checkpoint(
    db: Connector,
    what: str,
    write: Callable[[Connection], T],
    output: Callable[[T], str],
    *,
    workflow_id: str,
    seq: int,
    name: str,
    owner_key: int | None,
    started_at: datetime,
    where: str | None = None,
    inputs: str | None = None,
) -> Checkpointed[T]:
    """``write(conn)`` and the checkpoint of step ``seq`` (SUCCESS, with ``output`` of the
    write's result, and ``inputs`` when given) in one transaction: a write from the
    workflow body happens exactly once. When the checkpoint is refused (not the owner,
    the position taken) the write is rolled back and the refusal returned, for the
    caller to explain or adopt."""

    def body(conn: Connection) -> Checkpointed[T]:
        with db.transaction(conn):
            result = write(conn)
            checkpoint = step_write(
                seq,
                conn.execute(
                    query("record_step"),
                    {
                        "workflow_id": workflow_id,
                        "seq": seq,
                        "name": name,
                        "status": StepStatus.SUCCESS,
                        "inputs": inputs,
                        "output": output(result),
                        "error": None,
                        "attempts": 1,
                        "started_at": started_at,
                        "owner_key": owner_key,
                        "events": None,
                    },
                ).fetchone(),
            )
            if not checkpoint.written:  # raising out of the block rolls the write back
                raise _Refused(checkpoint)
            return Checkpointed(checkpoint, result)

    try:
        return db.run(what, body, where=where)
    except _Refused as refused:
        return Checkpointed(refused.write, None)
