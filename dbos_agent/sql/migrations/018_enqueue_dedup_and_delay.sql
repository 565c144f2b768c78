-- dbos_agent schema, version 18: deduplication ids of enqueues, and delayed starts.
--
-- Queue.enqueue(..., dedup_id=) records dedup_id: while a workflow of the queue with
-- that id is unfinished (PENDING, ENQUEUED, SUSPENDED, DIVERGED), another enqueue with
-- it is refused (DuplicateEnqueueError) by this partial unique index; once the
-- workflow finishes its row leaves the index, and the id may be used again.
--
-- A delayed start (da.start(..., delay=), Queue.enqueue(..., delay=)) needs no new
-- column: a started workflow is recorded SUSPENDED with wait_kind 'sleep' until
-- wake_at (the waker starts it, as it wakes any due timer); an enqueued one is
-- ENQUEUED with wake_at, and is not dequeued before then.

ALTER TABLE dbos_agent.workflows ADD COLUMN dedup_id text CHECK (dedup_id <> '');

CREATE UNIQUE INDEX workflows_queue_dedup
    ON dbos_agent.workflows (queue_name, dedup_id)
    WHERE dedup_id IS NOT NULL AND status IN ('PENDING', 'ENQUEUED', 'SUSPENDED', 'DIVERGED');
