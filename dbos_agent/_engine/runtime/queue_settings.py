"""The queues a process serves, as the database says them (migration 029): the ones its
code defines, recorded there at launch, with an operator's settings applied over them,
and the queues defined only in the database.

The dispatcher reads them at every round (``Engine.queues``); the table is read again at
most every ``REFRESH_SECONDS``, so a change made while processes run (``Client.set_queue``,
``dbos-agent queues set``) is taken up by each within about that long. A queue the code
defines after launch is recorded at the next read.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from ..._storage.database import SystemDatabase
from ...records import QueueInfo
from .collaborators import QueueSpec

log = logging.getLogger(__name__)

#: How often a process reads the queues table again (seconds).
REFRESH_SECONDS = 1.0


@dataclass(frozen=True, slots=True)
class Settings:
    """A queue's limits as the dispatcher applies them (a ``QueueSpec``)."""

    name: str
    concurrency: int | None
    worker_concurrency: int | None
    rate_limit: tuple[int, float] | None
    count_suspended: bool
    fair_share: bool
    partitioned: bool


def settings_of(queue: QueueSpec | QueueInfo) -> Settings:
    return Settings(
        queue.name,
        queue.concurrency,
        queue.worker_concurrency,
        queue.rate_limit,
        queue.count_suspended,
        queue.fair_share,
        queue.partitioned,
    )


class DatabaseQueues:
    """``Engine(queues=...)`` for a launched process: the code's queues, read through the
    database. While the table cannot be read, the latest settings read stay in force
    (the code's before the first read)."""

    def __init__(self, db: SystemDatabase, defined: Callable[[], Sequence[QueueSpec]]) -> None:
        self._db = db
        self._defined = defined
        self._lock = threading.Lock()
        self._recorded: dict[str, Settings] = {}
        self._stored: dict[str, Settings] = {}
        self._read_at = float("-inf")

    def __call__(self) -> list[Settings]:
        code = {q.name: settings_of(q) for q in self._defined()}
        with self._lock:
            if time.monotonic() - self._read_at >= REFRESH_SECONDS:
                self._refresh(code)
            stored = dict(self._stored)
        return [
            *(stored.get(name, s) for name, s in code.items()),
            *(s for name, s in stored.items() if name not in code),
        ]

    def _refresh(self, code: dict[str, Settings]) -> None:
        self._read_at = time.monotonic()
        try:
            new = [s for name, s in code.items() if self._recorded.get(name) != s]
            if new:
                self._db.queues.register([_row(s) for s in new])
                self._recorded.update((s.name, s) for s in new)
            self._stored = {q.name: settings_of(q) for q in self._db.queues.list()}
        except Exception as exc:  # the dispatcher's own reads will say the database is down
            log.warning("could not read the queues table (%s); keeping the settings read last", exc)


def _row(s: Settings) -> dict[str, object]:
    limit, period = s.rate_limit if s.rate_limit else (None, None)
    return {
        "name": s.name,
        "concurrency": s.concurrency,
        "worker_concurrency": s.worker_concurrency,
        "rate_limit": limit,
        "rate_period": period,
        "count_suspended": s.count_suspended,
        "fair_share": s.fair_share,
        "partitioned": s.partitioned,
    }
