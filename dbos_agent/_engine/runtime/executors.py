"""Where workflows run besides the caller's thread: a bounded pool of daemon threads for
sync background and recovered workflows, and the one event loop for async ones.

Daemon threads (unlike ``ThreadPoolExecutor``'s) never keep a dying process alive: a
workflow cut off at exit stays PENDING and is recovered later.

A background async run (``da.start`` of an ``async def`` workflow, recovery, a queue,
a wake-up) is a task on this loop, not a thread of the worker pool: thousands of
async agents make their model calls concurrently while a handful of threads serve
them. The loop runs in one daemon thread, started on first use. Its default executor
(what ``asyncio.to_thread`` uses: the database round trips of steps and waits) has
as many threads as the engine has database connections, so blocking calls queue for
a connection there instead of piling up threads.

A blocking wait (``da.sleep``, ``da.recv`` without ``_async``, ``handle.result()``)
called on this loop would stop every other task of it: :func:`refuse_blocking_wait`
turns that into a clear error naming the ``_async`` twin.
"""

from __future__ import annotations

import asyncio
import logging
import queue
import threading
from collections.abc import Callable, Coroutine
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

from ...errors import DbosAgentError

log = logging.getLogger(__name__)

_on_loop = threading.local()


def refuse_blocking_wait(what: str) -> None:
    """Raise if this thread is a shared event loop's: a blocking wait would stall it."""
    if getattr(_on_loop, "loop", False):
        raise DbosAgentError(
            f"{what} blocks, and this async workflow runs on the process's shared event "
            f"loop: use its async form (await ... _async) so the other workflows keep running"
        )


def _nobody() -> None:
    pass


class RoomWatch:
    """Tells those who asked when a run of the worker pool or the event loop ends.

    A pass that stopped claiming for want of room (the take-over) arms it, then reads the
    room again: a run that ended before the arming is seen by that read, one that ends
    after it calls the hooks, once per arming. So the pass looks again as soon as there is
    room, not a whole period later, and a process whose runs end by the thousand pays one
    flag test per run while nobody waits.
    """

    def __init__(self) -> None:
        self._armed = False
        self._hooks: list[Callable[[], None]] = []

    def on_freed(self, hook: Callable[[], None]) -> None:
        """Call ``hook`` (it must not block) when a run ends while the watch is armed."""
        self._hooks.append(hook)

    def arm(self) -> None:
        """The next run to end calls the hooks."""
        self._armed = True

    def freed(self) -> None:
        """A run ended (called by the pool and the loop)."""
        if self._armed:
            self._armed = False
            for hook in self._hooks:
                hook()


class Wanted:
    """A pass's wake-up that may be urgent, set and taken under one lock: a waiter takes
    both the wake-up and its urgency at once, so an urgent ``set`` is never lost between
    them (the take-back: urgent means look now, without letting stopping runs settle)."""

    def __init__(self) -> None:
        self._changed = threading.Condition(threading.Lock())
        self._set = False
        self._urgent = False

    def set(self, *, urgent: bool = False) -> None:
        with self._changed:
            self._set = True
            self._urgent = self._urgent or urgent
            self._changed.notify_all()

    def take(self, timeout: float) -> tuple[bool, bool]:
        """Wait up to ``timeout`` seconds to be set; ``(woken, urgent)``, both cleared."""
        with self._changed:
            woken = self._changed.wait_for(lambda: self._set, timeout)
            urgent = self._urgent
            self._set = self._urgent = False
            return woken, urgent


class EventLoop:
    """A daemon thread running one asyncio loop; ``max_runs`` bounds live runs on it."""

    def __init__(
        self, io_threads: int, max_runs: int, on_room: Callable[[], None] = _nobody
    ) -> None:
        if io_threads < 1 or max_runs < 1:
            raise ValueError(
                f"the event loop needs io_threads >= 1 and max_runs >= 1, got "
                f"{io_threads} and {max_runs}"
            )
        self.max_runs = max_runs
        self._io_threads = io_threads
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._executor: ThreadPoolExecutor | None = None
        self._lock = threading.Lock()
        self._room = threading.Condition(self._lock)
        self._live = 0
        self._stopped = False
        #: Called (from the loop's thread) each time a run ends and frees a slot.
        self._on_room = on_room

    @property
    def live(self) -> int:
        """Runs submitted and not yet ended."""
        return self._live

    def free(self) -> int:
        """Runs this loop would take now without anyone waiting for room."""
        return self.max_runs - self._live

    def _started(self) -> asyncio.AbstractEventLoop:
        """The loop, started on first use (a process without async workflows never starts it)."""
        if self._loop is not None:
            return self._loop
        if self._stopped:
            raise DbosAgentError("the dbos_agent event loop has stopped (the runtime shut down)")
        loop = asyncio.new_event_loop()
        executor = ThreadPoolExecutor(self._io_threads, thread_name_prefix="dbos-agent-io")
        loop.set_default_executor(executor)
        ready = threading.Event()

        def serve() -> None:
            _on_loop.loop = True
            asyncio.set_event_loop(loop)
            loop.call_soon(ready.set)
            try:
                loop.run_forever()
            finally:
                loop.close()

        thread = threading.Thread(target=serve, name="dbos-agent-event-loop", daemon=True)
        thread.start()
        ready.wait()
        self._loop, self._thread, self._executor = loop, thread, executor
        return loop

    def submit(self, coro: Coroutine[Any, Any, Any]) -> Future[Any]:
        """Run ``coro`` as a task on the loop; the future resolves with its result."""
        with self._lock:
            try:
                loop = self._started()
            except BaseException:
                coro.close()
                raise
            self._live += 1
        future = asyncio.run_coroutine_threadsafe(coro, loop)
        future.add_done_callback(self._ended)
        return future

    def _ended(self, _: Future[Any]) -> None:
        with self._room:
            self._live -= 1
            self._room.notify_all()
        self._on_room()

    def wait_for_room(self) -> None:
        """Block while ``max_runs`` runs are live (recovery and wake-ups keep memory flat)."""
        with self._room:
            while self._live >= self.max_runs and not self._stopped:
                self._room.wait(0.5)

    def stop(self, timeout: float = 2.0) -> None:
        """Cancel what still runs, stop the loop and its thread (waits up to ``timeout``)."""
        with self._room:
            self._stopped = True
            self._room.notify_all()
            loop, thread, executor = self._loop, self._thread, self._executor
        if loop is None or thread is None:
            return

        async def drain() -> None:
            tasks = [task for task in asyncio.all_tasks() if task is not asyncio.current_task()]
            for task in tasks:
                task.cancel()
            if tasks:
                await asyncio.wait(tasks, timeout=timeout)
            loop.stop()

        if not loop.is_closed():
            asyncio.run_coroutine_threadsafe(drain(), loop)
        thread.join(timeout)
        if thread.is_alive():
            log.warning("the dbos_agent event loop did not stop within %.1fs", timeout)
        if executor is not None:
            executor.shutdown(wait=False, cancel_futures=True)


_STOP = object()


class WorkerPool:
    """At most ``size`` threads, started lazily, fed from one FIFO queue."""

    def __init__(self, size: int, on_room: Callable[[], None] = _nobody) -> None:
        if size < 1:
            raise ValueError(f"the worker pool needs at least one thread, got {size}")
        self.size = size
        self._queue: queue.SimpleQueue[Callable[[], None] | object] = queue.SimpleQueue()
        self._threads: list[threading.Thread] = []
        self._lock = threading.Lock()
        self._idle = 0
        self._queued = 0
        self._running = 0
        self._room = threading.Condition(self._lock)
        #: Called (from the worker thread) each time a job ends and frees its thread.
        self._on_room = on_room

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

    def free(self) -> int:
        """Jobs that would start at once if submitted now: the threads neither running
        a job nor promised to one already waiting (negative while jobs wait)."""
        with self._lock:
            return self.size - self._running - self._queued

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
                self._running += job is not _STOP
                self._room.notify_all()
            if job is _STOP:
                return
            try:
                job()  # type: ignore[operator]
            except BaseException:  # a job's failure must not kill the worker
                log.exception("a dbos_agent background job failed")
            with self._lock:
                self._running -= 1
            self._on_room()

    def stop(self) -> None:
        """Ask every thread to exit once the jobs queued before this call are done."""
        with self._lock:
            threads = list(self._threads)
            self._queued += len(threads)
        for _ in threads:
            self._queue.put(_STOP)
