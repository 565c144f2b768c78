-- dbos_agent schema, version 6: sessions that come back, and prompt, safe take-over.
--
-- A session's advisory lock is released the moment its connection dies: when the
-- process died, but also when only the connection did (a Postgres restart, a
-- pg_terminate_backend). A live process re-opens its connection and takes its own
-- lock back within moments, so a lost lock alone proves nothing. Others declare a
-- session dead only when it is
--   * gone from this table, or its lease ran out (a hung or partitioned process;
--     a clean exit sets heartbeat_at to -infinity), or
--   * without its lock for longer than its grace, counted from the first time
--     someone saw the lock free (lock_lost_at) and from its last heartbeat, so
--     that after a Postgres restart every live process has the grace to reconnect.
-- A process on the same host (same boot and pid namespace, see process_key) may
-- also see at once that the pid is gone and end the session itself.
--
-- The owner keeps a fence that mirrors these rules: it starts a live step only
-- within min(grace, lease) of its last successful heartbeat, so no one can have
-- taken its workflow by then (see storage/session.py).

-- Keys are never handed out twice (until 2^31 registrations), so a process that
-- reconnects can always take its own key back.
CREATE SEQUENCE dbos_agent.session_keys AS integer MINVALUE 1 CYCLE;

ALTER TABLE dbos_agent.executors
    ADD COLUMN grace_seconds double precision NOT NULL DEFAULT 3 CHECK (grace_seconds > 0),
    ADD COLUMN lock_lost_at timestamptz,
    -- 'boot id/pid namespace/pid/start time': lets a process on the same host tell
    -- a dead pid from a live one. NULL where the platform cannot say.
    ADD COLUMN process_key text;

-- The sessions whose advisory lock is held now (their connection is open).
CREATE FUNCTION dbos_agent.locked_sessions() RETURNS SETOF integer
LANGUAGE sql STABLE AS $$
    SELECT l.objid::bigint::integer
    FROM pg_locks AS l
    WHERE l.locktype = 'advisory' AND l.classid = 233710 AND l.objsubid = 2 AND l.granted
      AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database())
$$;

-- The sessions whose PENDING workflows others may take over (see the rules above).
CREATE FUNCTION dbos_agent.dead_sessions() RETURNS SETOF integer
LANGUAGE sql STABLE AS $$
    SELECT e.session_key
    FROM dbos_agent.executors AS e
    WHERE e.heartbeat_at < now() - make_interval(secs => e.lease_seconds)
       OR (e.lock_lost_at < now() - make_interval(secs => e.grace_seconds)
           AND e.heartbeat_at < now() - make_interval(secs => e.grace_seconds)
           AND e.session_key NOT IN (SELECT dbos_agent.locked_sessions()))
$$;

-- One session, for single-row checks (a direct call of a workflow someone owns).
CREATE FUNCTION dbos_agent.session_is_dead(key integer) RETURNS boolean
LANGUAGE sql STABLE AS $$
    SELECT key IS NULL
        OR NOT EXISTS (SELECT 1 FROM dbos_agent.executors WHERE session_key = key)
        OR key IN (SELECT dbos_agent.dead_sessions())
$$;

DROP FUNCTION dbos_agent.session_is_live(integer);
DROP FUNCTION dbos_agent.session_lease_expired(integer);
