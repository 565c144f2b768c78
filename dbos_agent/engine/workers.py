"""A bounded pool of daemon threads that run background and recovered workflows.

Daemon threads (unlike ``ThreadPoolExecutor``'s) never keep a dying process
alive: a workflow cut off at exit stays PENDING and is recovered later.
"""

from __future__ import annotations

import logging
import queue
import threading
from collections.abc import Callable

log = logging.getLogger(__name__)

_STOP = object()


class WorkerPool:
    """At most ``size`` threads, started lazily, fed from one FIFO queue."""

    def __init__(self, size: int) -> None:
        if size < 1:
            raise ValueError(f"the worker pool needs at least one thread, got {size}")
        self.size = size
        self._queue: queue.SimpleQueue[Callable[[], None] | object] = queue.SimpleQueue()
        self._threads: list[threading.Thread] = []
        self._lock = threading.Lock()
        self._idle = 0
        self._queued = 0
        self._room = threading.Condition(self._lock)

    def submit(self, job: Callable[[], None]) -> None:
        """Queue ``job``; start another thread if none is idle and the pool has room."""
        with self._lock:
            self._queued += 1
            if self._idle < self._queued and len(self._threads) < self.size:
                thread = threading.Thread(
                    target=self._work, name=f"dbos-agent-worker-{len(self._threads)}", daemon=True
                )
                self._threads.append(thread)
                thread.start()
        self._queue.put(job)

    def wait_for_room(self, backlog: int) -> None:
        """Block while more than ``backlog`` jobs wait for a thread (keeps memory flat)."""
        with self._room:
            while self._queued > backlog:
                self._room.wait(0.5)

    def _work(self) -> None:
        while True:
            with self._lock:
                self._idle += 1
            job = self._queue.get()
            with self._room:
                self._idle -= 1
                self._queued -= 1
                self._room.notify_all()
            if job is _STOP:
                return
            try:
                job()  # type: ignore[operator]
            except BaseException:  # a job's failure must not kill the worker
                log.exception("a dbos_agent background job failed")

    def stop(self) -> None:
        """Ask every thread to exit once the jobs queued before this call are done."""
        with self._lock:
            threads = list(self._threads)
            self._queued += len(threads)
        for _ in threads:
            self._queue.put(_STOP)
