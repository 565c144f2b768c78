-- dbos_agent schema, version 2: live executors, workflow ownership, queues.
--
-- Every process that launches the runtime registers an executor session here
-- and holds the session-level advisory lock (classid 233710, objid =
-- session_key) on a dedicated connection for as long as it lives. The server
-- releases that lock the moment the process's connection dies, so a restart
-- after kill -9 knows at once that the old session is gone; the heartbeat
-- lease covers what the lock cannot see (a hung process, a partition).

CREATE TABLE dbos_agent.executors (
    session_key   integer     PRIMARY KEY,
    executor_id   text        NOT NULL,
    app_version   text,
    hostname      text        NOT NULL,
    pid           integer     NOT NULL,
    lease_seconds double precision NOT NULL CHECK (lease_seconds > 0),
    started_at    timestamptz NOT NULL DEFAULT now(),
    heartbeat_at  timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX executors_by_id ON dbos_agent.executors (executor_id);

-- The session running a PENDING workflow. Checkpoints are guarded on it, so
-- a session that lost its workflow to another one can no longer write to it.
ALTER TABLE dbos_agent.workflows ADD COLUMN owner_key integer;

-- Queues: an ENQUEUED workflow waits for a worker with room; dequeuing sets
-- dequeued_at (the rate limiter counts those) and makes it PENDING.
ALTER TABLE dbos_agent.workflows ADD COLUMN queue_name text;
ALTER TABLE dbos_agent.workflows ADD COLUMN priority integer NOT NULL DEFAULT 0;
ALTER TABLE dbos_agent.workflows ADD COLUMN dequeued_at timestamptz;

CREATE INDEX workflows_pending_by_owner
    ON dbos_agent.workflows (owner_key)
    WHERE status = 'PENDING';
CREATE INDEX workflows_enqueued
    ON dbos_agent.workflows (queue_name, priority, created_at)
    WHERE status = 'ENQUEUED';
CREATE INDEX workflows_in_flight_by_queue
    ON dbos_agent.workflows (queue_name, owner_key)
    WHERE status = 'PENDING' AND queue_name IS NOT NULL;
CREATE INDEX workflows_dequeued_by_queue
    ON dbos_agent.workflows (queue_name, dequeued_at)
    WHERE dequeued_at IS NOT NULL;

-- Is the session that owns a workflow certainly alive? Its advisory lock is
-- held (the process's connection is open) and its lease is fresh.
CREATE FUNCTION dbos_agent.session_is_live(key integer) RETURNS boolean
LANGUAGE sql STABLE AS $$
    SELECT EXISTS (
        SELECT 1
        FROM dbos_agent.executors AS e
        WHERE e.session_key = key
          AND e.heartbeat_at >= now() - make_interval(secs => e.lease_seconds)
          AND EXISTS (
              SELECT 1 FROM pg_locks AS l
              WHERE l.locktype = 'advisory' AND l.classid = 233710 AND l.objsubid = 2
                AND l.granted AND l.objid::bigint = key
                AND l.database = (SELECT oid FROM pg_database
                                  WHERE datname = current_database())))
$$;

-- Has the session's lease run out (or did it end cleanly, deleting its row)?
-- Other executors wait for this before taking its workflows over.
CREATE FUNCTION dbos_agent.session_lease_expired(key integer) RETURNS boolean
LANGUAGE sql STABLE AS $$
    SELECT NOT EXISTS (
        SELECT 1 FROM dbos_agent.executors AS e
        WHERE e.session_key = key
          AND e.heartbeat_at >= now() - make_interval(secs => e.lease_seconds))
$$;
