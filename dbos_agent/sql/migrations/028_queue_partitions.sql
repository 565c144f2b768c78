-- dbos_agent schema, version 28: partitioned queues.
--
-- Queue(..., partitioned=True) takes Queue.enqueue(..., partition_key=K): every limit of
-- the queue (concurrency, worker_concurrency, rate_limit) applies to each partition (a
-- tenant) on its own, and a dequeue serves the partitions in turn, least recently served
-- first (dequeue_partitioned_workflows in queries.sql). partition_key is NULL on every
-- other workflow. Two indexes serve that dequeue: the ENQUEUED workflows of each
-- partition in their order (the distinct partitions are walked on it too, one probe
-- each), and each partition's dequeue times (when it was last served, and how many it
-- started within a rate-limit period).

ALTER TABLE dbos_agent.workflows ADD COLUMN partition_key text CHECK (partition_key <> '');

CREATE INDEX workflows_enqueued_by_partition
    ON dbos_agent.workflows (queue_name, partition_key, priority, created_at, workflow_id)
    WHERE status = 'ENQUEUED' AND partition_key IS NOT NULL;
CREATE INDEX workflows_dequeued_by_partition
    ON dbos_agent.workflows (queue_name, partition_key, dequeued_at)
    WHERE dequeued_at IS NOT NULL AND partition_key IS NOT NULL;
