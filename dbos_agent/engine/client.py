"""A client: enqueue and inspect workflows from a process that only holds a database URL.

A web handler or a script can enqueue work for the workers without importing
the workflow functions; arguments are stored unbound and bound to the
signature by the worker that runs them.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import AsyncIterator, Iterator
from types import TracebackType
from typing import Any

from ..errors import WorkflowNotFoundError
from ..limits import DEFAULT_MAX_CHECKPOINT_BYTES, check_delay, check_identifier
from ..records import StepInfo, WorkflowInfo, WorkflowStatus
from ..serialization import codec_for
from ..storage.database import SystemDatabase
from ..storage.embedded import resolve_url
from ..storage.outages import DEFAULT_OUTAGE_TIMEOUT_S
from .approvals import ApprovalRequest, decide
from .messaging import send_plain
from .plans import run_plan, run_plan_async
from .streams import StreamItem, follow, follow_async
from .waiting import finished_outcome


class ClientHandle:
    """A workflow seen from a client: its result comes back as plain JSON data."""

    def __init__(self, db: SystemDatabase, workflow_id: str) -> None:
        self._db = db
        self.workflow_id = workflow_id

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
        info = self._db.workflows.get(self.workflow_id)
        if info is None:
            raise WorkflowNotFoundError(self.workflow_id)
        return info

    def status(self) -> WorkflowStatus:
        return self.get_info().status

    def steps(self) -> list[StepInfo]:
        return self._db.steps.list(self.workflow_id)


class Client:
    """Connects to the system database without running workflows."""

    def __init__(
        self,
        database_url: str | None = None,
        *,
        pool_size: int = 4,
        outage_timeout: float = DEFAULT_OUTAGE_TIMEOUT_S,
        max_checkpoint_bytes: int = DEFAULT_MAX_CHECKPOINT_BYTES,
    ) -> None:
        self.db = SystemDatabase(
            resolve_url(database_url),
            pool_size=pool_size,
            outage_timeout=outage_timeout,
            max_checkpoint_bytes=max_checkpoint_bytes,
        )
        self.db.open()
        try:
            self.db.migrate()
        except BaseException:
            self.db.close()
            raise

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
        **kwargs: Any,
    ) -> ClientHandle:
        """Enqueue ``workflow_name(*args, **kwargs)`` on ``queue``; an existing id is kept.

        The id, queue and name are checked (an empty id is refused, not replaced);
        arguments over the checkpoint limit raise CheckpointTooLargeError. ``dedup_id``
        and ``delay`` are those of ``Queue.enqueue`` (DuplicateEnqueueError while an
        unfinished workflow of the queue holds the id; not dequeued before ``delay``
        seconds from now).
        """
        check_identifier(queue, "queue name")
        check_identifier(workflow_name, "workflow name")
        wid = (
            str(uuid.uuid4())
            if workflow_id is None
            else check_identifier(workflow_id, "workflow id")
        )
        codec = codec_for(Any)
        inputs = json.dumps(
            {
                "$args": codec.to_jsonable(list(args), f"enqueue of {workflow_name!r}"),
                "$kwargs": codec.to_jsonable(kwargs, f"enqueue of {workflow_name!r}"),
            }
        )
        self.db.workflows.insert(
            workflow_id=wid,
            name=workflow_name,
            inputs=inputs,
            executor_id="client",
            app_version=app_version,
            max_recovery_attempts=max_recovery_attempts,
            owner_key=None,
            queue_name=queue,
            priority=priority,
            dedup_id=None if dedup_id is None else check_identifier(dedup_id, "dedup id"),
            delay=check_delay(delay),
        )
        return ClientHandle(self.db, wid)

    def send(
        self,
        workflow_id: str,
        message: Any,
        topic: str | None = None,
        idempotency_key: str | None = None,
    ) -> None:
        """Send ``message`` (JSON) to workflow ``workflow_id`` on ``topic``, as ``da.send``
        does: it waits in the database until the workflow receives it, and wakes the
        workflow if it is suspended in ``recv``. Messages with the same idempotency key
        are delivered once (without a key, one is made, so that a send retried through
        an outage is delivered once). Raises WorkflowNotFoundError for an unknown id."""
        send_plain(self.db, workflow_id, message, topic, idempotency_key)

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

    def approvals(self, workflow_id: str | None = None) -> list[ApprovalRequest]:
        """A workflow's approval requests, or every PENDING one (see da.list_approvals)."""
        return self.db.approvals.list(workflow_id)

    def approve(self, workflow_id: str, seq: int, digest: str, reason: str | None = None) -> None:
        """Approve the tool call asked about at step ``seq`` (bound to its ``digest``)."""
        decide(self.db, workflow_id, seq, digest, approved=True, reason=reason)

    def reject(self, workflow_id: str, seq: int, digest: str, reason: str | None = None) -> None:
        """Reject it; the workflow gets the reason."""
        decide(self.db, workflow_id, seq, digest, approved=False, reason=reason)

    def retrieve(self, workflow_id: str) -> ClientHandle:
        handle = ClientHandle(self.db, check_identifier(workflow_id, "workflow id"))
        handle.get_info()
        return handle

    def list_workflows(self, **filters: Any) -> list[WorkflowInfo]:
        return self.db.workflows.list(**filters)

    def close(self) -> None:
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
