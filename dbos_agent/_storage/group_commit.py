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
    __slots__ = ("done", "item", "result", "wake")

    def __init__(self, item: T) -> None:
        self.item = item
        self.result: R | _Alone = ALONE
        self.done = False
        #: Held while the entry waits in the queue; released exactly once, by the writer
        #: that wrote it (``done``) or that hands it the writer's slot (not ``done``).
        self.wake: threading.Lock | None = None


class GroupCommit(Generic[T, R]):
    """Writes items in batches of at most ``max_batch`` with ``write(items)``, which
    returns one result per item, in order; at most ``max_writers`` batches at a time
    (below that, a writer writes at once, with whatever is queued).

    A queued writer sleeps on a lock of its own and is woken once: when its item is
    written, or when a finished writer hands it its slot (it then writes the queue).
    Nobody is woken only to find there is nothing for it yet: under load that herd of
    wake-ups costs more of the interpreter's one lock than the writes themselves.
    """

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
        self._lock = threading.Lock()

    def submit(self, item: T) -> R | _Alone:
        """Write ``item`` in the next batch; its result, or :data:`ALONE`."""
        entry: _Entry[T, R] = _Entry(item)
        with self._lock:
            if self._writing < self._max_writers:
                self._writing += 1
                batch = self._take(entry)
            else:
                entry.wake = wake = threading.Lock()
                wake.acquire()
                self._queue.append(entry)
                batch = None
        if batch is None:
            wake.acquire()  # written by another, or handed a writer's slot
            if entry.done:
                return entry.result
            with self._lock:
                batch = self._take(entry)
        self._write_batch(batch)
        return entry.result

    def _take(self, entry: _Entry[T, R]) -> list[_Entry[T, R]]:
        """The next batch: ``entry`` first, then the oldest queued (under the lock)."""
        room = self._max_batch - 1
        batch = [entry, *self._queue[:room]]
        del self._queue[:room]
        return batch

    def _write_batch(self, batch: list[_Entry[T, R]]) -> None:
        results: Sequence[R] | None = None
        try:
            results = self._write([e.item for e in batch])
        except Exception as exc:  # everyone writes alone, and learns why there
            log.debug(
                "a group commit of %d writes failed; each is written alone: %s", len(batch), exc
            )
        finally:
            for i, e in enumerate(batch):
                e.result = ALONE if results is None else results[i]
                e.done = True
            with self._lock:
                # the slot goes to the oldest waiting writer, or is given up
                heir = self._queue.pop(0) if self._queue else None
                if heir is None:
                    self._writing -= 1
            for e in batch[1:]:
                assert e.wake is not None
                e.wake.release()
            if heir is not None:
                assert heir.wake is not None
                heir.wake.release()
