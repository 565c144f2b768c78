"""Queues: handing ENQUEUED workflows to a worker as every limit allows, and the queues
recorded in the database (migration 029)."""

from __future__ import annotations

import json
from typing import Any

from ..records import QueueInfo
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

    def register(self, queues: list[dict[str, Any]]) -> None:
        """Record the queues this process defines in code (their limits, as
        ``register_queues`` takes them); an operator's setting of one is kept."""
        self._db.run(
            "record the queues defined in code",
            lambda c: c.execute(query("register_queues"), {"rows": json.dumps(queues)}),
        )

    def list(self) -> list[QueueInfo]:
        """Every queue recorded in the database, by name."""
        return [queue_info(row) for row in self._db.all("list_queues", "list queues", name=None)]

    def get(self, name: str) -> QueueInfo | None:
        """Queue ``name`` as recorded in the database; None where it is not recorded."""
        row = self._db.one("list_queues", f"read queue {name!r}", name=name)
        return None if row is None else queue_info(row)

    def set(self, name: str, changes: dict[str, Any], *, reset: bool = False) -> QueueInfo:
        """Change the given limits of queue ``name`` (keys ``concurrency``,
        ``worker_concurrency``, ``rate_limit``), making it the operator's; ``reset`` gives
        it back to its code."""
        rate = changes.get("rate_limit")
        params: dict[str, Any] = {
            "name": name,
            "reset": reset,
            "concurrency": changes.get("concurrency"),
            "worker_concurrency": changes.get("worker_concurrency"),
            "rate_limit": None if rate is None else rate[0],
            "rate_period": None if rate is None else rate[1],
            **{f"set_{key}": key in changes for key in QUEUE_LIMITS},
        }
        row = self._db.one("set_queue", f"set queue {name!r}", **params)
        assert row is not None, "set_queue returns the row it wrote"
        return queue_info(row)


#: The limits an operator may change while processes run (``QueueStore.set``).
QUEUE_LIMITS = ("concurrency", "worker_concurrency", "rate_limit")


def queue_info(row: Row) -> QueueInfo:
    rate = None if row["rate_limit"] is None else (row["rate_limit"], row["rate_period"])
    return QueueInfo(
        name=row["name"],
        concurrency=row["concurrency"],
        worker_concurrency=row["worker_concurrency"],
        rate_limit=rate,
        count_suspended=row["count_suspended"],
        fair_share=row["fair_share"],
        partitioned=row["partitioned"],
        source=row["source"],
        updated_at=row["updated_at"],
    )
