"""A client: enqueue, inspect and operate workflows from a process that only holds a
database URL.

A web handler or a script can enqueue work for the workers without importing
the workflow functions; arguments are stored unbound and bound to the
signature by the worker that runs them. The operator's actions (cancel, resume,
fork, list, retrieve, approve, garbage-collect, and pause, resume or backfill a
schedule) are here too, so that the CLI, the HTTP API
and a web handler of the user's own reach the database one way: each action is
one guarded statement (``operations.py``) and leaves the run to a process that
has the workflow's function.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Iterable, Iterator, Mapping
from datetime import datetime, timedelta
from types import TracebackType
from typing import Any, Unpack

from .._limits import DEFAULT_MAX_CHECKPOINT_BYTES, check_delay, check_identifier, check_priority
from .._serialization import InputsCodec, codec_for
from .._storage.database import SystemDatabase
from .._storage.outages import DEFAULT_OUTAGE_TIMEOUT_S
from .._storage.rows import ForkResult, NewWorkflow, ResumeResult, RewindResult
from .._storage.streams import StreamKey
from ..errors import WorkflowNotFoundError
from ..postgres.opening import open_system_database
from ..records import QueueInfo, ScheduleInfo, StepInfo, WorkflowInfo, WorkflowStatus
from .approvals import ApprovalRequest, decide
from .bulk import BulkOptions, BulkReport, act_on_workflows
from .edits import Replacements, check_edits, rewind_workflow
from .messaging import BulkMessage, poll_event, send_bulk_plain, send_plain
from .operations import (
    cancel_workflow,
    fork_workflow,
    resolve_in_doubt_step,
    resume_workflow,
    retry_workflow,
)
from .queues import check_partition_key, check_queue_limits
from .retention import DEFAULT_BATCH_SIZE, DEFAULT_STATUSES, GcReport, collect_garbage
from .runtime.context import current_workflow_timeout, take_workflow_id
from .runtime.plans import run_plan, run_plan_async
from .runtime.waiting import finished_outcome
from .schedules import (
    BackfillReport,
    backfill_schedule_slots,
    read_schedule,
    read_schedules,
    set_schedule_paused,
)
from .streams import StreamItem, follow, follow_async
from .waits import check_seconds

_ANY = codec_for(Any)
#: ``result=`` not given (None is a result).
_UNSET: Any = object()


class ClientHandle:
    """A workflow seen from a client: its result comes back as plain JSON data.

    A handle returned by :meth:`Client.resume` or :meth:`Client.fork` keeps in
    ``report`` what that action found and did (the status before, the executor, the
    steps a fork reused).
    """

    def __init__(
        self,
        db: SystemDatabase,
        workflow_id: str,
        report: ResumeResult | ForkResult | RewindResult | None = None,
    ) -> None:
        self._db = db
        self.workflow_id = workflow_id
        self.report = report

    def __repr__(self) -> str:
        return f"ClientHandle({self.workflow_id!r})"

    def result(self, timeout: float | None = None) -> Any:
        """Wait for the workflow's result (or raise its error)."""
        return run_plan(finished_outcome(self._db, self.workflow_id, timeout)).unwrap()

    async def result_async(self, timeout: float | None = None) -> Any:
        """:meth:`result` for an event loop (polls without blocking it)."""
        outcome = await run_plan_async(finished_outcome(self._db, self.workflow_id, timeout))
        return outcome.unwrap()

    def get_info(self) -> WorkflowInfo:
        info = self._db.workflows.describe(self.workflow_id)
        if info is None:
            raise WorkflowNotFoundError(self.workflow_id)
        return info

    def status(self) -> WorkflowStatus:
        found = self._db.workflows.owner(self.workflow_id)
        if found is None:
            raise WorkflowNotFoundError(self.workflow_id)
        return found[0]

    def steps(self) -> list[StepInfo]:
        return self._db.steps.list(self.workflow_id)


class Client:
    """Connects to the system database without running workflows.

    An operator's door: it never changes the schema unless told (``migrate=True``); on a
    database without the schema, or with an older one, it refuses with a
    SchemaNotMigratedError naming ``dbos-agent migrate`` and leaves it as it was (see
    :func:`~dbos_agent.postgres.opening.open_system_database`).
    """

    def __init__(
        self,
        database_url: str | None = None,
        *,
        migrate: bool = False,
        pool_size: int = 4,
        outage_timeout: float = DEFAULT_OUTAGE_TIMEOUT_S,
        max_checkpoint_bytes: int = DEFAULT_MAX_CHECKPOINT_BYTES,
    ) -> None:
        self.db = open_system_database(
            database_url,
            create=migrate,
            migrate=migrate,
            pool_size=pool_size,
            outage_timeout=outage_timeout,
            max_checkpoint_bytes=max_checkpoint_bytes,
        )
        self._owns_db = True

    @classmethod
    def over(cls, db: SystemDatabase) -> Client:
        """A client on a database that is open already and stays the caller's (the CLI's
        and ``serve``'s, opened by ``open_system_database``): :meth:`close` leaves it open."""
        client = cls.__new__(cls)
        client.db = db
        client._owns_db = False
        return client

    def enqueue(
        self,
        queue: str,
        workflow_name: str,
        /,
        *args: Any,
        workflow_id: str | None = None,
        priority: int = 0,
        app_version: str | None = None,
        max_recovery_attempts: int = 50,
        dedup_id: str | None = None,
        delay: float | None = None,
        partition_key: str | None = None,
        **kwargs: Any,
    ) -> ClientHandle:
        """Enqueue ``workflow_name(*args, **kwargs)`` on ``queue``; an existing id is kept.

        The id, queue and name are checked (an empty id is refused, not replaced);
        arguments over the checkpoint limit raise CheckpointTooLargeError. ``dedup_id``
        and ``delay`` are those of ``Queue.enqueue`` (DuplicateEnqueueError while an
        unfinished workflow of the queue holds the id; not dequeued before ``delay``
        seconds from now). ``partition_key`` names the partition of a partitioned queue:
        PartitionKeyError when the queue, as recorded in the database (by a launch that
        defines it, or ``set_queue``), says otherwise; a queue not recorded is not checked.
        """
        check_identifier(queue, "queue name")
        check_identifier(workflow_name, "workflow name")
        check_priority(priority, queue)
        recorded = self.db.queues.get(queue)
        if recorded is not None:
            check_partition_key(queue, recorded.partitioned, partition_key)
        wid = take_workflow_id(workflow_id)
        where = f"enqueue of {workflow_name!r}"
        self.db.workflows.insert(
            NewWorkflow(
                workflow_id=wid,
                name=workflow_name,
                inputs=InputsCodec.dumps_unbound(args, kwargs, where),
                executor_id="client",
                app_version=app_version,
                max_recovery_attempts=max_recovery_attempts,
                owner_key=None,
                queue_name=queue,
                priority=priority,
                timeout=current_workflow_timeout(),
                dedup_id=None if dedup_id is None else check_identifier(dedup_id, "dedup id"),
                delay=check_delay(delay),
                partition_key=(
                    None
                    if partition_key is None
                    else check_identifier(partition_key, "partition key")
                ),
            )
        )
        return ClientHandle(self.db, wid)

    def send(
        self,
        workflow_id: str,
        message: Any,
        topic: str | None = None,
        idempotency_key: str | None = None,
    ) -> bool:
        """Send ``message`` (JSON) to workflow ``workflow_id`` on ``topic``, as ``da.send``
        does: it waits in the database until the workflow receives it, and wakes the
        workflow if it is suspended in ``recv``. Messages with the same idempotency key
        are delivered once (without a key, one is made, so that a send retried through
        an outage is delivered once). Returns whether a message was stored (False: its
        key was sent before). Raises WorkflowNotFoundError for an unknown id."""
        return send_plain(self.db, workflow_id, message, topic, idempotency_key)

    def send_bulk(self, messages: Iterable[BulkMessage]) -> int:
        """Send many messages in one statement: ``(destination_id, message)`` tuples, each
        with a topic and an idempotency key after it if wanted (see ``da.send_bulk``).
        All are stored or none (WorkflowNotFoundError for a destination that does not
        exist); returns how many were stored (the others' keys were sent before)."""
        return send_bulk_plain(self.db, messages)

    def get_event(
        self, workflow_id: str, key: str, default: Any = None, *, timeout: float = 0.0
    ) -> Any:
        """The value workflow ``workflow_id`` published last under ``key`` (``da.set_event``),
        waiting up to ``timeout`` seconds for one (a client polls every 0.1 s); ``default``
        when none came. An id that does not exist yet is waited for like any event (as
        ``da.get_event`` and DBOS do): its workflow may be started a moment later."""
        check_identifier(workflow_id, "workflow id")
        check_identifier(key, "event key")
        seconds = check_seconds(timeout, "get_event timeout")
        return run_plan(poll_event(self.db, None, workflow_id, key, seconds, _ANY, default))

    def fork_origin(self, workflow_id: str) -> tuple[str, int] | None:
        """``(original id, fork point)`` of a forked workflow, else None."""
        return self.db.operations.fork_origin(check_identifier(workflow_id, "workflow id"))

    def resolve_in_doubt(
        self, workflow_id: str, seq: int, *, result: Any = _UNSET, rerun: bool = False
    ) -> ClientHandle:
        """Resolve the in-doubt step ``seq`` of an IN_DOUBT workflow (see
        ``da.operations.resolve_in_doubt``): ``result=`` when the effect happened (the step returns
        it), ``rerun=True`` when it did not. The workflow becomes PENDING for a process
        with its function; WorkflowStatusError when there is no such step in doubt."""
        if rerun == (result is not _UNSET):
            raise ValueError("give exactly one of result=... (it happened) or rerun=True")
        where = f"workflow {workflow_id!r} step {seq}"
        output = None if rerun else codec_for(Any).dumps(result, where)
        resolve_in_doubt_step(self.db, workflow_id, seq, output=output)
        return ClientHandle(self.db, workflow_id)

    def read_stream(
        self, workflow_id: str, key: str, offset: int = 0, *, timeout: float | None = None
    ) -> Iterator[StreamItem]:
        """Follow a workflow's stream ``key`` from ``offset`` (see ``da.read_stream``); a
        client polls (every 0.1 s while it waits) instead of listening."""
        return follow(self.db, None, workflow_id, key, offset, timeout)

    def read_stream_async(
        self, workflow_id: str, key: str, offset: int = 0, *, timeout: float | None = None
    ) -> AsyncIterator[StreamItem]:
        """:meth:`read_stream` as an async iterator, for a web handler."""
        return follow_async(self.db, None, workflow_id, key, offset, timeout)

    def stream_keys(self, workflow_id: str) -> list[StreamKey]:
        """The keys ``workflow_id`` has written streams under (what :meth:`read_stream`
        may follow), each with its length and whether it is closed; WorkflowNotFoundError
        for an unknown id."""
        self.get_workflow(workflow_id)
        return self.db.streams.keys(workflow_id)

    def approvals(self, workflow_id: str | None = None) -> list[ApprovalRequest]:
        """A workflow's approval requests, or every PENDING one (``operations.list_approvals``)."""
        return self.db.approvals.list(workflow_id)

    def approve(self, workflow_id: str, seq: int, digest: str, reason: str | None = None) -> None:
        """Approve the tool call asked about at step ``seq`` (bound to its ``digest``)."""
        decide(self.db, workflow_id, seq, digest, approved=True, reason=reason)

    def reject(self, workflow_id: str, seq: int, digest: str, reason: str | None = None) -> None:
        """Reject it; the workflow gets the reason."""
        decide(self.db, workflow_id, seq, digest, approved=False, reason=reason)

    def retrieve(self, workflow_id: str) -> ClientHandle:
        """A handle on a stored workflow; WorkflowNotFoundError for an unknown id."""
        handle = ClientHandle(self.db, check_identifier(workflow_id, "workflow id"))
        handle.status()  # it exists
        return handle

    def get_workflow(self, workflow_id: str) -> WorkflowInfo:
        """The stored workflow; WorkflowNotFoundError for an unknown id."""
        info = self.db.workflows.describe(check_identifier(workflow_id, "workflow id"))
        if info is None:
            raise WorkflowNotFoundError(workflow_id)
        return info

    def list_workflows(
        self,
        *,
        status: WorkflowStatus | str | None = None,
        name: str | None = None,
        queue: str | None = None,
        executor_id: str | None = None,
        created_after: datetime | None = None,
        created_before: datetime | None = None,
        limit: int = 100,
        partition_key: str | None = None,
        load_input: bool = True,
        load_output: bool = True,
    ) -> list[WorkflowInfo]:
        """Stored workflows matching every given filter, newest first (at most ``limit``):
        a status, a workflow name, a queue, a partition, an executor, created at or after
        ``created_after`` and before ``created_before``. An unknown status is a ValueError.

        As in DBOS Transact, ``load_input=False`` and ``load_output=False`` leave each
        workflow's ``inputs`` and ``output`` None, unread: a listing that shows neither
        reads no more than its rows, however large the values stored."""
        if limit < 1:
            raise ValueError(f"limit must be at least 1, got {limit}")
        return self.db.workflows.list(
            load_input=load_input,
            load_output=load_output,
            status=None if status is None else WorkflowStatus(status),
            name=name,
            queue_name=queue,
            partition_key=partition_key,
            executor_id=executor_id,
            created_after=created_after,
            created_before=created_before,
            limit=limit,
        )

    def list_steps(self, workflow_id: str) -> list[StepInfo]:
        """A workflow's recorded steps, in order; WorkflowNotFoundError for an unknown id."""
        self.get_workflow(workflow_id)
        return self.db.steps.list(workflow_id)

    def cancel(self, workflow_id: str) -> WorkflowStatus:
        """Cancel a workflow, and the unfinished workflows it started; return the status it
        had (cancelling a CANCELLED one changes nothing). A run of it stops at its next
        step boundary; a finished one raises WorkflowStatusError (see ``da.operations.cancel``)."""
        return cancel_workflow(self.db, workflow_id)

    def cancel_workflows(
        self, workflow_ids: Iterable[str] | None = None, **options: Unpack[BulkOptions]
    ) -> BulkReport:
        """Cancel many workflows, each as :meth:`cancel` would (with the unfinished ones it
        started): the given ids that match ``where``, or, without ids, every workflow
        ``where`` matches (with neither, ``all_workflows=True`` must say so). One statement
        per ``batch_size`` ids; finished and already cancelled ones are left, not an error
        (``report.skipped``). ``dry_run`` counts what it would cancel."""
        return act_on_workflows(self.db, "cancel", workflow_ids, **options)

    def resume_workflows(
        self, workflow_ids: Iterable[str] | None = None, **options: Unpack[BulkOptions]
    ) -> BulkReport:
        """Resume many workflows, each as :meth:`resume` would (chosen as
        :meth:`cancel_workflows` chooses); the ones that cannot be resumed (running,
        finished, in doubt, or whose deduplication id another workflow holds now) are left."""
        return act_on_workflows(self.db, "resume", workflow_ids, **options)

    def delete_workflows(
        self, workflow_ids: Iterable[str] | None = None, **options: Unpack[BulkOptions]
    ) -> BulkReport:
        """Delete many finished workflows (chosen as :meth:`cancel_workflows` chooses) with
        their steps, messages, events, streams and approvals; unfinished ones (PENDING,
        ENQUEUED, SUSPENDED, DIVERGED) and IN_DOUBT ones are left (cancel them first),
        and so are the workflows they started."""
        return act_on_workflows(self.db, "delete", workflow_ids, **options)

    def retry(self, workflow_id: str) -> int:
        """Try now the steps of a workflow that wait out a failing dependency (the model
        API, an MCP server: RETRYING, with a next attempt time): a suspended workflow
        wakes in whichever live process can run it, one waiting in a process tries at
        once. Returns how many steps were waiting; WorkflowNotFoundError for an unknown
        id, WorkflowStatusError for a finished one or one that waits for no retry."""
        return retry_workflow(self.db, workflow_id)

    def resume(self, workflow_id: str, *, executor_id: str | None = None) -> ClientHandle:
        """Make a cancelled, dead-lettered or diverged workflow PENDING (or ENQUEUED,
        back in its queue) without an owner: a live process with its function continues
        it from its log at once. ``executor_id`` moves it to another executor. Its
        handle's ``report`` says what it was (see ``da.operations.resume``)."""
        result = resume_workflow(self.db, workflow_id, executor_id=executor_id)
        return ClientHandle(self.db, workflow_id, result)

    def fork(
        self,
        workflow_id: str,
        from_step: int,
        *,
        new_workflow_id: str | None = None,
        executor_id: str | None = None,
        inputs: Mapping[str, Any] | None = None,
        replace: Replacements | None = None,
        by: str | None = None,
    ) -> ClientHandle:
        """Start a new workflow (same function and inputs) that reuses ``workflow_id``'s
        recorded steps below ``from_step`` and runs live from there, in whichever process
        with the function takes it; the new workflow's handle (``report`` says how many
        steps it reused). ``inputs`` and ``replace`` edit it (see ``da.operations.fork``):
        checked against the log always, and against the signature and return annotations
        when this process has imported the workflow's code (the edit record says
        ``checked``); ForkEditError names the edit that does not fit."""
        edits = check_edits(self.db, workflow_id, from_step, inputs=inputs, replace=replace, by=by)
        new_id, result = fork_workflow(
            self.db,
            workflow_id,
            from_step,
            new_workflow_id=new_workflow_id,
            executor_id=executor_id,
            edits=edits,
        )
        return ClientHandle(self.db, new_id, result)

    def rewind(
        self,
        workflow_id: str,
        to_step: int,
        *,
        executor_id: str | None = None,
        by: str | None = None,
    ) -> ClientHandle:
        """Run a stopped workflow again in place from ``to_step``, in whichever live
        process with its function takes it (see ``da.operations.rewind``: later steps
        deleted, the messages they received unconsumed, their stream items and events
        undone, one statement); its handle, whose ``report`` says what was undone. A
        PENDING workflow is refused (WorkflowStatusError): cancel it first."""
        result = rewind_workflow(self.db, workflow_id, to_step, by=by, executor_id=executor_id)
        return ClientHandle(self.db, workflow_id, result)

    def edits(self, workflow_id: str) -> list[dict[str, Any]]:
        """What operators changed in a workflow's log, oldest first: its rewinds, and an
        edited fork's edits (``{"kind", "by", "at", ...}``)."""
        self.get_workflow(workflow_id)
        return self.db.operations.edits(workflow_id)

    def garbage_collect(
        self,
        older_than: timedelta,
        *,
        statuses: Iterable[WorkflowStatus | str] = DEFAULT_STATUSES,
        batch_size: int = DEFAULT_BATCH_SIZE,
        dry_run: bool = False,
        progress: Callable[[GcReport], None] | None = None,
    ) -> GcReport:
        """Delete workflows that finished more than ``older_than`` ago, with their steps,
        messages and events, in batches (see ``da.operations.garbage_collect``)."""
        return collect_garbage(
            self.db,
            older_than,
            statuses=statuses,
            batch_size=batch_size,
            dry_run=dry_run,
            progress=progress,
        )

    def queues(self) -> list[QueueInfo]:
        """Every queue recorded in the database, with the limits its processes apply."""
        return self.db.queues.list()

    def set_queue(
        self,
        name: str,
        *,
        concurrency: int | None = _UNSET,
        worker_concurrency: int | None = _UNSET,
        rate_limit: tuple[int, float] | None = _UNSET,
        reset: bool = False,
    ) -> QueueInfo:
        """Change a queue's limits in every process serving it, within a second or two,
        without a restart: only the ones given change (None: no limit). The queue's
        settings are then the operator's, and win over its code's (``da.Queue``) in every
        launch after, until ``reset=True`` gives it back to its code (the next process
        that defines it records the code's values). A queue not defined in any code is
        created, and served by every process."""
        check_identifier(name, "queue name")
        changes: dict[str, Any] = {
            key: value
            for key, value in (
                ("concurrency", concurrency),
                ("worker_concurrency", worker_concurrency),
                ("rate_limit", rate_limit),
            )
            if value is not _UNSET
        }
        check_queue_limits(
            name,
            concurrency=changes.get("concurrency"),
            worker_concurrency=changes.get("worker_concurrency"),
            rate_limit=changes.get("rate_limit"),
        )
        return self.db.queues.set(name, changes, reset=reset)

    def list_schedules(self) -> list[ScheduleInfo]:
        """Every recorded schedule, by name, with its next and latest slots."""
        return read_schedules(self.db)

    def get_schedule(self, name: str) -> ScheduleInfo:
        """One recorded schedule; ScheduleNotFoundError if there is none of that name."""
        return read_schedule(self.db, name)

    def pause_schedule(self, name: str) -> bool:
        """Pause a schedule in every process (its slots pass without runs); whether it was
        running (False: already paused). See ``dbos_agent.operations.pause_schedule``."""
        return set_schedule_paused(self.db, name, True)

    def resume_schedule(self, name: str) -> bool:
        """Resume a paused schedule from its next slot (the paused ones are not caught
        up); whether it was paused."""
        return set_schedule_paused(self.db, name, False)

    def backfill_schedule(self, name: str, start: datetime, end: datetime) -> BackfillReport:
        """Record the workflow of every slot of ``name`` in ``[start, end]`` (up to now)
        that has none, once each: PENDING and owned by no process, the first live process
        with the workflow's code runs them. ScheduleError past 10,000 slots."""
        return backfill_schedule_slots(self.db, name, start, end)

    def close(self) -> None:
        """Close the database pool, if this client opened it."""
        if self._owns_db:
            self.db.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()
