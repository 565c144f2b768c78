"""The queue dispatcher: the thread of a launched process that dequeues the workflows of
the queues it defined, as their limits and this process's free worker slots allow.

The queues are the API's (``dbos_agent.Queue``, ``_engine/queues.py``): the engine is given
them when built (``Engine(queues=...)``) and this pass reads them there at every round, so
a queue defined after launch is served too. Limits hold across every worker sharing the
database: a dequeue counts and applies them in one transaction serialised per queue (see
``dequeue_workflows`` in queries.sql).
"""

from __future__ import annotations

import logging

from ...errors import DbosAgentError
from .collaborators import BackgroundPass
from .core import Engine
from .registry import find_workflow
from .runs import Claim

log = logging.getLogger(__name__)

#: Seconds the dispatcher sleeps when nothing woke it (an enqueue, a run ending, a moved
#: clock wake it at once).
POLL_SECONDS = 0.5


def dispatch_once(engine: Engine) -> int:
    """Dequeue what the limits and this worker's free slots allow; return how many.

    Nothing is dequeued while this session's fence does not hold (a process back
    from a pause, a session reconnecting): it might no longer be alive to others.
    """
    started = 0
    runner = engine.runner()
    for queue in engine.queues():
        free = engine.pool.size - len(engine.active_ids())
        if free <= 0:
            break
        if engine.ownership_mark() < 0:  # the fence does not hold: dequeue nothing yet
            break
        assert engine.session_key is not None
        dequeued = engine.db.queues.dequeue(
            queue_name=queue.name,
            runner=runner,
            owner_key=engine.session_key,
            executor_id=engine.executor_id,
            free_slots=free,
            concurrency=queue.concurrency,
            worker_concurrency=queue.worker_concurrency,
            rate_limit=queue.rate_limit,
            count_suspended=queue.count_suspended,
            fair=queue.fair_share and queue.worker_concurrency is None,
            partitioned=queue.partitioned,
        )
        claims = []
        for workflow_id, name, inputs in dequeued:
            definition = find_workflow(name)
            if definition is None:  # filtered by name in the query; defensive
                raise DbosAgentError(f"dequeued unknown workflow {name!r}")
            claims.append(Claim(definition, workflow_id, inputs))
        engine.start_claimed(claims)
        started += len(claims)
    return started


class Dispatcher(BackgroundPass):
    """The dispatcher thread: dequeue whenever there may be room, until shutdown (the
    engine wakes it itself: an enqueue, a run ending, a moved clock)."""

    thread_name = "dbos-agent-dispatcher"

    def __init__(self, engine: Engine) -> None:
        self._engine = engine

    def run(self) -> None:
        engine = self._engine
        while not engine.stopping:
            try:
                started = dispatch_once(engine)
            except Exception as exc:
                if engine.stopping:
                    return
                log.error("queue dispatch failed (%s); retrying", exc)
                started = 0
            if not started:
                engine.wait_for_dispatch(POLL_SECONDS)
