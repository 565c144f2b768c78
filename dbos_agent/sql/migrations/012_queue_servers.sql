-- dbos_agent schema, version 12: sessions say which queues they dequeue from.
--
-- A queue with a global concurrency limit is shared fairly: each live session that
-- serves it takes at most its share of the limit (dequeue_workflows), instead of the
-- first to look taking every free slot again and again.

ALTER TABLE dbos_agent.executors ADD COLUMN queues text[] NOT NULL DEFAULT '{}';
