-- dbos_agent schema, version 30: sessions that hold no lock, behind a transaction pooler.
--
-- A process whose only URL goes through a transaction pooler (pgbouncer in transaction
-- mode, the pooled URLs of Supabase, Neon and RDS Proxy) has no session of its own to hold
-- the advisory lock on: each transaction may run on another server connection, and a lock
-- taken there would stay with that connection, for whoever gets it next. Such a session
-- registers as lease_only and is judged by its lease alone: locked_sessions() names it, so
-- that no one stamps its lock as lost or waits out a grace for it, and it is dead only
-- once its lease has run out (or, seen from its own host, once its process is gone: the
-- statements that list sessions without a lock for that check list it too).

ALTER TABLE dbos_agent.executors ADD COLUMN lease_only boolean NOT NULL DEFAULT false;

CREATE OR REPLACE FUNCTION dbos_agent.locked_sessions() RETURNS SETOF integer
LANGUAGE sql STABLE AS $$
    SELECT l.objid::bigint::integer
    FROM pg_locks AS l
    WHERE l.locktype = 'advisory' AND l.classid = 233710 AND l.objsubid = 2 AND l.granted
      AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database())
    UNION ALL
    SELECT e.session_key FROM dbos_agent.executors AS e WHERE e.lease_only
$$;
