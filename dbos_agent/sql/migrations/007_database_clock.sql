-- dbos_agent schema, version 7: a database clock that tests can move.
--
-- dbos_agent.now() is the statement's time plus the session setting
-- dbos_agent.clock_offset (an interval; unset means none). Leases, the grace of
-- a lost lock, durable timers, rate limits and retention read time through it,
-- so a test moves time for everything the library's connections do (the
-- library sets the offset on them, see storage/connector.py) instead of
-- sleeping. Records (created_at, finished_at, ...) keep the real time.

CREATE FUNCTION dbos_agent.now() RETURNS timestamptz
LANGUAGE sql STABLE AS $$
    SELECT now()
           + coalesce(nullif(current_setting('dbos_agent.clock_offset', true), '')::interval,
                      interval '0')
$$;

CREATE OR REPLACE FUNCTION dbos_agent.dead_sessions() RETURNS SETOF integer
LANGUAGE sql STABLE AS $$
    SELECT e.session_key
    FROM dbos_agent.executors AS e
    WHERE e.heartbeat_at < dbos_agent.now() - make_interval(secs => e.lease_seconds)
       OR (e.lock_lost_at < dbos_agent.now() - make_interval(secs => e.grace_seconds)
           AND e.heartbeat_at < dbos_agent.now() - make_interval(secs => e.grace_seconds)
           AND e.session_key NOT IN (SELECT dbos_agent.locked_sessions()))
$$;
