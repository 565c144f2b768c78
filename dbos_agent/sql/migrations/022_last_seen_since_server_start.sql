-- dbos_agent schema, version 22: a session's lease and grace count from the server's start.
--
-- No session can heartbeat while Postgres is down. Counted from its last heartbeat
-- alone, a restart that took about as long as the lease (crash recovery on a loaded
-- machine) made every session look dead the moment the server came back, before any
-- could reconnect: processes that were only cut off took each other's workflows (fenced,
-- so nothing ran twice at once, but steps that had finished without their checkpoint ran
-- again). A session is now last seen at its last heartbeat or the server's start,
-- whichever is later, so after a restart each has its whole lease (and grace) to come
-- back. A clean exit's -infinity stays as it is: that session is gone at once.

CREATE FUNCTION dbos_agent.last_seen(heartbeat_at timestamptz) RETURNS timestamptz
LANGUAGE sql STABLE AS $$
    SELECT CASE WHEN heartbeat_at = '-infinity' THEN heartbeat_at
                ELSE greatest(heartbeat_at, pg_postmaster_start_time()) END
$$;

-- Whether a session's row says it is dead: its lease ran out, or its lock has been free
-- (``unlocked`` now, and seen free since lock_lost_at) for longer than its grace; both
-- counted from when it was last seen. The one statement of the rules: dead_sessions(),
-- the take-overs (which lock the row they judge) and the heartbeat use it.
CREATE FUNCTION dbos_agent.session_row_dead(
    heartbeat_at timestamptz, lease_seconds double precision, lock_lost_at timestamptz,
    grace_seconds double precision, unlocked boolean
) RETURNS boolean
LANGUAGE sql STABLE AS $$
    SELECT dbos_agent.last_seen(heartbeat_at)
               < dbos_agent.now() - make_interval(secs => lease_seconds)
        OR (lock_lost_at < dbos_agent.now() - make_interval(secs => grace_seconds)
            AND dbos_agent.last_seen(heartbeat_at)
                < dbos_agent.now() - make_interval(secs => grace_seconds)
            AND unlocked)
$$;

CREATE OR REPLACE FUNCTION dbos_agent.dead_sessions() RETURNS SETOF integer
LANGUAGE sql STABLE AS $$
    SELECT e.session_key
    FROM dbos_agent.executors AS e
    WHERE dbos_agent.session_row_dead(
        e.heartbeat_at, e.lease_seconds, e.lock_lost_at, e.grace_seconds,
        e.session_key NOT IN (SELECT dbos_agent.locked_sessions()))
$$;
