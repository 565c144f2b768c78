-- dbos_agent schema, version 29: queues defined in the database.
--
-- One row per queue: its limits, as every process that serves it applies them (each reads
-- this table every second or so, see runtime/queue_settings.py). A queue defined in code
-- (da.Queue) is recorded by every process that launches with it (source 'code': the
-- code's values, rewritten by each launch); `dbos-agent queues set` and Client.set_queue
-- change a queue (source 'operator') and then its values win over the code's, in every
-- process, until `queues set NAME --reset` gives the queue back to its code. A queue set
-- here and defined in no code is served by every process all the same.

CREATE TABLE dbos_agent.queues (
    name               text        PRIMARY KEY CHECK (name <> ''),
    concurrency        integer     CHECK (concurrency >= 1),
    worker_concurrency integer     CHECK (worker_concurrency >= 1),
    rate_limit         integer     CHECK (rate_limit >= 1),
    rate_period        float8      CHECK (rate_period > 0),
    count_suspended    boolean     NOT NULL DEFAULT false,
    fair_share         boolean     NOT NULL DEFAULT true,
    partitioned        boolean     NOT NULL DEFAULT false,
    source             text        NOT NULL DEFAULT 'code' CHECK (source IN ('code', 'operator')),
    updated_at         timestamptz NOT NULL DEFAULT now(),
    CONSTRAINT queues_rate_limit_whole CHECK ((rate_limit IS NULL) = (rate_period IS NULL))
);
