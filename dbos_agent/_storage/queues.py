"""Queues: handing ENQUEUED workflows to a worker as every limit allows."""

from __future__ import annotations

from .connector import Connection, Connector, Row
from .locks import QUEUE_LOCK_CLASS
from .rows import Runner, text_of
from .sql_files import query


class QueueStore:
    """Dequeues, each one transaction serialised per queue."""

    def __init__(self, db: Connector) -> None:
        self._db = db

    def dequeue(
        self,
        *,
        queue_name: str,
        runner: Runner,
        owner_key: int,
        executor_id: str,
        free_slots: int,
        concurrency: int | None,
        worker_concurrency: int | None,
        rate_limit: tuple[int, float] | None,
        count_suspended: bool = False,
        fair: bool = False,
        partitioned: bool = False,
    ) -> list[tuple[str, str, str]]:
        """Take ``(workflow_id, name, inputs)`` of queued workflows as the limits allow
        (``count_suspended``: suspended workflows of the queue count against its
        concurrency; ``fair``: take at most this session's share of ``concurrency``
        among the live sessions serving the queue; ``partitioned``: every limit holds per
        partition, and the partitions are served in turn)."""
        limit, period = rate_limit if rate_limit else (None, 1.0)
        params = {
            "queue_name": queue_name,
            **runner.params(),
            "owner_key": owner_key,
            "executor_id": executor_id,
            "free_slots": free_slots,
            "concurrency": concurrency,
            "worker_concurrency": worker_concurrency,
            "rate_limit": limit,
            "rate_period": period,
            "count_suspended": count_suspended,
            "fair": fair and concurrency is not None,
        }

        def body(conn: Connection) -> list[Row]:
            conn.execute(
                query("lock_queue"), {"lock_class": QUEUE_LOCK_CLASS, "queue_name": queue_name}
            )
            dequeue = query("dequeue_partitioned_workflows" if partitioned else "dequeue_workflows")
            return conn.execute(dequeue, params).fetchall()

        rows = self._db.run(f"dequeue from queue {queue_name!r}", body, transaction=True)
        return [(r["workflow_id"], r["name"], text_of(r["inputs"]) or "{}") for r in rows]
