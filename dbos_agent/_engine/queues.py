"""Durable queues: workflows recorded ENQUEUED and run by whichever worker has room.

Limits hold across every worker sharing the database: ``concurrency`` (in
flight over all workers), ``worker_concurrency`` (in flight on one worker)
and ``rate_limit`` (starts per period). A dequeue counts and applies them in
one transaction serialised per queue (see ``dequeue_workflows`` in queries.sql); the
dispatcher that dequeues is the engine's (``runtime/dispatcher.py``), given these queues.
A queue with ``concurrency`` is shared fairly: each live worker serving it takes at
most its share (``fair_share``; workers say which queues they serve with their
heartbeat).

A partitioned queue (``partitioned=True``) applies every limit to each partition on its
own: ``enqueue(..., partition_key=K)`` names the partition (a tenant, a user), and the
dequeue serves the partitions in turn, least recently served first, so one tenant's
burst does not delay another's (see ``dequeue_partitioned_workflows``).
"""

from __future__ import annotations

import sys
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from .._limits import check_delay, check_identifier, check_priority
from ..errors import DuplicateEnqueueError, PartitionKeyError, QueueConflictError
from .handle import WorkflowHandle
from .runtime.admission import admit
from .runtime.current import current_engine
from .runtime.dispatcher import dispatch_once as dispatch_once

_lock = threading.Lock()
#: ``Queue`` objects by queue name: one definition per name (see ``Queue``).
_queues: dict[str, Queue] = {}


class Queue:
    """A named queue of workflows. Create it at import time, like the workflows it runs."""

    def __init__(
        self,
        name: str,
        concurrency: int | None = None,
        worker_concurrency: int | None = None,
        rate_limit: tuple[int, float] | None = None,
        *,
        count_suspended: bool = False,
        fair_share: bool = True,
        partitioned: bool = False,
    ) -> None:
        check_identifier(name, "queue name")
        check_queue_limits(
            name,
            concurrency=concurrency,
            worker_concurrency=worker_concurrency,
            rate_limit=rate_limit,
        )
        self.name = name
        self.concurrency = concurrency
        self.worker_concurrency = worker_concurrency
        self.rate_limit = rate_limit
        #: Suspended workflows of the queue count against ``concurrency`` (they hold
        #: something while they wait: a licence, a sandbox). By default they do not:
        #: a suspended workflow holds no resources, and its slot goes to the next one;
        #: one waiting for a step's next attempt (a dependency down) always counts.
        self.count_suspended = count_suspended
        #: With ``concurrency`` and no ``worker_concurrency``: each live worker serving
        #: the queue takes at most its share of ``concurrency`` (rounded up), so that
        #: one worker does not take all of it while others have room.
        self.fair_share = fair_share
        #: Every enqueue names a partition (``partition_key``), and ``concurrency``,
        #: ``worker_concurrency`` and ``rate_limit`` hold for each partition on its own
        #: (as DBOS's ``partition_queue=True``); the partitions are served in turn.
        self.partitioned = partitioned
        caller = sys._getframe(1)
        #: Where the queue is defined: the same definition run again (a module imported
        #: twice) is the same queue; another definition of the name is a conflict.
        self.origin = f"{caller.f_code.co_filename}:{caller.f_lineno}"
        with _lock:
            known = _queues.get(name)
            if known is not None and (known.origin != self.origin or repr(known) != repr(self)):
                raise QueueConflictError(
                    f"queue {name!r} is defined twice: {known!r} at {known.origin} and "
                    f"{self!r} at {self.origin}; one name is one queue"
                )
            _queues[name] = self

    def __repr__(self) -> str:
        return (
            f"Queue({self.name!r}, concurrency={self.concurrency}, "
            f"worker_concurrency={self.worker_concurrency}, rate_limit={self.rate_limit}, "
            f"count_suspended={self.count_suspended}, fair_share={self.fair_share}, "
            f"partitioned={self.partitioned})"
        )

    def enqueue(
        self,
        workflow: Callable[..., Any],
        /,
        *args: Any,
        workflow_id: str | None = None,
        priority: int | None = None,
        dedup_id: str | None = None,
        delay: float | None = None,
        partition_key: str | None = None,
        **kwargs: Any,
    ) -> WorkflowHandle[Any]:
        """Record ``workflow(*args, **kwargs)`` as ENQUEUED and return its handle.

        An id that exists already is not enqueued again: the existing
        workflow's handle comes back (deduplication). Lower ``priority`` runs first.
        With ``dedup_id``, the enqueue is refused with DuplicateEnqueueError while
        another unfinished workflow of this queue holds that id. With ``delay``
        (seconds) it is not dequeued before that long from now (database clock).
        ``partition_key`` names the partition of a partitioned queue, and only of one:
        PartitionKeyError otherwise. A ``dedup_id`` is unique across the whole queue.
        """
        from .children import raise_recorded_refusal, record_refusal, workflow_id_for_start
        from .workflow import definition_of

        definition = definition_of(workflow)
        check_priority(priority, self.name)
        key = check_partition_key(self.name, self.partitioned, partition_key)
        engine = current_engine()
        wid, recorded = workflow_id_for_start(workflow_id, enqueue=True)
        raise_recorded_refusal()
        try:
            admission = admit(
                engine,
                definition,
                wid,
                args,
                kwargs,
                queue_name=self.name,
                priority=priority or 0,
                dedup_id=None if dedup_id is None else check_identifier(dedup_id, "dedup id"),
                delay=check_delay(delay),
                recorded_start=recorded,
                partition_key=key,
            )
        except DuplicateEnqueueError as refused:
            record_refusal(refused)
            raise
        engine.wake_dispatcher()
        return WorkflowHandle(engine, wid, admission.future())


def check_queue_limits(
    name: str,
    *,
    concurrency: int | None = None,
    worker_concurrency: int | None = None,
    rate_limit: tuple[int, float] | None = None,
) -> None:
    """ValueError for a limit no queue can have (in code, or set while running)."""
    for label, value in (
        ("concurrency", concurrency),
        ("worker_concurrency", worker_concurrency),
    ):
        if value is not None and value < 1:
            raise ValueError(f"queue {name!r}: {label} must be >= 1, got {value}")
    if rate_limit is not None:
        limit, period = rate_limit
        if limit < 1 or period <= 0:
            raise ValueError(
                f"queue {name!r}: rate_limit is (max starts, period in seconds), got {rate_limit!r}"
            )


def check_partition_key(queue_name: str, partitioned: bool, key: str | None) -> str | None:
    """``key`` checked as the partition of an enqueue on a queue that is (or is not)
    partitioned: PartitionKeyError when one is missing or not wanted."""
    if partitioned != (key is not None):
        raise PartitionKeyError(queue_name, key)
    return None if key is None else check_identifier(key, "partition key")


def registered_queues() -> list[Queue]:
    """Every queue created in this process."""
    with _lock:
        return list(_queues.values())


def find_queue(name: str) -> Queue | None:
    return _queues.get(name)


@contextmanager
def isolated_queues() -> Iterator[None]:
    """Within the block, only the queues defined in it exist; on leaving, the queues
    defined before (at import time, by other modules) are back.

    For tests that each define their own queues: clearing the registry for good would
    lose a queue another module defined once at import, and that queue's enqueued
    workflows would then never be dequeued.
    """
    with _lock:
        saved = dict(_queues)
        _queues.clear()
    try:
        yield
    finally:
        with _lock:
            _queues.clear()
            _queues.update(saved)
