"""Group commit: concurrent writers share one statement and one commit.

While a few batches are being written, the writes other threads hand in wait in a
queue; when one is done, a waiting writer takes the whole queue and writes it as the
next batch. Below that many batches a writer writes at once (with whatever is
queued): nothing waits for company. Under
load, N threads checkpointing at the same time pay for about one commit between them
instead of N, which is where a 2-core machine spends its time.

A batch that fails as a whole (an outage, a value Postgres refuses) answers every
writer in it with :data:`ALONE`: each then writes by itself, on the ordinary path that
explains refusals and rides out outages, so one writer's bad value or a connection lost
mid-commit never becomes another writer's error.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Sequence
from typing import Generic, TypeVar

log = logging.getLogger(__name__)

T = TypeVar("T")
R = TypeVar("R")


class _Alone:
    def __repr__(self) -> str:
        return "ALONE"


#: The answer to a writer whose write the batch did not make: write it alone.
ALONE = _Alone()


class _Entry(Generic[T, R]):
    __slots__ = ("done", "item", "result", "taken")

    def __init__(self, item: T) -> None:
        self.item = item
        self.result: R | _Alone = ALONE
        #: In a batch being written (by this thread or another): never written again.
        self.taken = False
        self.done = False


class GroupCommit(Generic[T, R]):
    """Writes items in batches of at most ``max_batch`` with ``write(items)``, which
    returns one result per item, in order; at most ``max_writers`` batches at a time
    (below that, a writer writes at once, with whatever is queued)."""

    def __init__(
        self,
        write: Callable[[Sequence[T]], Sequence[R]],
        *,
        max_writers: int = 2,
        max_batch: int = 64,
    ) -> None:
        if max_batch < 1 or max_writers < 1:
            raise ValueError(
                f"max_writers and max_batch must be >= 1, got {max_writers} and {max_batch}"
            )
        self._write = write
        self._max_writers = max_writers
        self._max_batch = max_batch
        self._queue: list[_Entry[T, R]] = []
        self._writing = 0
        self._changed = threading.Condition()

    def submit(self, item: T) -> R | _Alone:
        """Write ``item`` in the next batch; its result, or :data:`ALONE`."""
        entry: _Entry[T, R] = _Entry(item)
        with self._changed:
            self._queue.append(entry)
            # an entry another writer took waits for that batch, even if a slot is free
            while not entry.done and (entry.taken or self._writing >= self._max_writers):
                self._changed.wait()
            if entry.done:
                return entry.result
            self._writing += 1  # this thread writes the next batch, its own entry first
            others = [e for e in self._queue if e is not entry]
            batch = [entry, *others[: self._max_batch - 1]]
            self._queue = others[self._max_batch - 1 :]
            for e in batch:
                e.taken = True
        results: Sequence[R] | None = None
        try:
            results = self._write([e.item for e in batch])
        except Exception as exc:  # everyone writes alone, and learns why there
            log.debug(
                "a group commit of %d writes failed; each is written alone: %s", len(batch), exc
            )
        finally:
            with self._changed:
                for i, e in enumerate(batch):
                    e.result = ALONE if results is None else results[i]
                    e.done = True
                self._writing -= 1
                self._changed.notify_all()
        return entry.result
