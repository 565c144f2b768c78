-- dbos_agent schema, version 24: a promoted standby is a restart, not a death sentence.
--
-- Since migration 022 a session is last seen at the later of its last heartbeat and the
-- server's start (pg_postmaster_start_time()). A promoted standby's postmaster started
-- long before the outage that its promotion ends, so after a failover longer than a
-- lease every live session was dead by that rule until its first heartbeat on the new
-- primary: a process a little late to reconnect (a GC pause, a starved CPU) lost its
-- workflows to a peer, which ran their in-flight steps again. A session is now last seen
-- no earlier than when the server began accepting writes: its start, or, if it was
-- promoted since, when the library first saw it writing on its new timeline.
--
-- Every promotion (and every end of a point-in-time recovery) starts a new timeline,
-- and from the moment a server accepts writes pg_walfile_name(pg_current_wal_lsn())
-- names the timeline it writes on (its first 8 hex digits: the insert timeline on
-- PostgreSQL 15 and later). pg_control_checkpoint() would lag: it says the new timeline
-- only once the checkpoint that follows the promotion is done, which may be spread out.
-- A server in recovery (a read-only standby) has no write timeline; nothing is judged
-- there, and the functions below answer there without an error.

-- When the library first saw each timeline accepting writes, on the server's own clock
-- (like pg_postmaster_start_time(); dbos_agent.now()'s test offset does not apply).
CREATE TABLE dbos_agent.server_epochs (
    timeline bigint      PRIMARY KEY,
    began_at timestamptz NOT NULL DEFAULT now()
);

-- The timeline this server writes WAL on; NULL on a server in recovery.
CREATE FUNCTION dbos_agent.write_timeline() RETURNS bigint
LANGUAGE sql STABLE AS $$
    SELECT CASE WHEN pg_is_in_recovery() THEN NULL
                ELSE ('x' || left(pg_walfile_name(pg_current_wal_lsn()), 8))::bit(32)::bigint
           END
$$;

-- When this server began accepting writes, as far as the library can know: the later of
-- its start and the moment its write timeline was first seen. A timeline not recorded
-- yet began now (the most lenient answer), and so does a server in recovery.
CREATE FUNCTION dbos_agent.server_began_at() RETURNS timestamptz
LANGUAGE sql STABLE AS $$
    SELECT greatest(pg_postmaster_start_time(),
                    coalesce((SELECT e.began_at FROM dbos_agent.server_epochs AS e
                              WHERE e.timeline = dbos_agent.write_timeline()),
                             now()))
$$;

-- Every statement that writes a session's row (a registration, a heartbeat, a take-over
-- pass stamping a lost lock) records the server's timeline the first time it is seen,
-- so that by the next statement that judges sessions the epoch has its start. Rows of
-- later timelines go: they come from another history (a copy of the schema restored
-- into another cluster), never from this server's own past, and this server's own
-- promotion to such a timeline must be dated by itself.
CREATE FUNCTION dbos_agent.note_server_epoch() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    current_timeline bigint := dbos_agent.write_timeline();
BEGIN
    IF current_timeline IS NOT NULL THEN
        DELETE FROM dbos_agent.server_epochs WHERE timeline > current_timeline;
        INSERT INTO dbos_agent.server_epochs (timeline) VALUES (current_timeline)
            ON CONFLICT (timeline) DO NOTHING;
    END IF;
    RETURN NULL;
END
$$;

CREATE TRIGGER executors_note_server_epoch AFTER INSERT OR UPDATE ON dbos_agent.executors
    FOR EACH STATEMENT EXECUTE FUNCTION dbos_agent.note_server_epoch();

-- The rules of migration 022, with when the server began (server_began_at()) given:
-- the statements that judge many sessions look it up once (a function in their FROM
-- list) instead of once a row. The one-argument last_seen and the five-argument
-- session_row_dead stay, looking it up themselves, for a single row and for the
-- statements of processes of an older version during a rolling deploy.
CREATE FUNCTION dbos_agent.last_seen(heartbeat_at timestamptz, began_at timestamptz)
RETURNS timestamptz
LANGUAGE sql STABLE AS $$
    SELECT CASE WHEN heartbeat_at = '-infinity' THEN heartbeat_at
                ELSE greatest(heartbeat_at, began_at) END
$$;

CREATE OR REPLACE FUNCTION dbos_agent.last_seen(heartbeat_at timestamptz) RETURNS timestamptz
LANGUAGE sql STABLE AS $$
    SELECT dbos_agent.last_seen(heartbeat_at, dbos_agent.server_began_at())
$$;

CREATE FUNCTION dbos_agent.session_row_dead(
    heartbeat_at timestamptz, lease_seconds double precision, lock_lost_at timestamptz,
    grace_seconds double precision, unlocked boolean, began_at timestamptz
) RETURNS boolean
LANGUAGE sql STABLE AS $$
    SELECT dbos_agent.last_seen(heartbeat_at, began_at)
               < dbos_agent.now() - make_interval(secs => lease_seconds)
        OR (lock_lost_at < dbos_agent.now() - make_interval(secs => grace_seconds)
            AND dbos_agent.last_seen(heartbeat_at, began_at)
                < dbos_agent.now() - make_interval(secs => grace_seconds)
            AND unlocked)
$$;

CREATE OR REPLACE FUNCTION dbos_agent.session_row_dead(
    heartbeat_at timestamptz, lease_seconds double precision, lock_lost_at timestamptz,
    grace_seconds double precision, unlocked boolean
) RETURNS boolean
LANGUAGE sql STABLE AS $$
    SELECT dbos_agent.session_row_dead(heartbeat_at, lease_seconds, lock_lost_at,
                                       grace_seconds, unlocked, dbos_agent.server_began_at())
$$;

CREATE OR REPLACE FUNCTION dbos_agent.dead_sessions() RETURNS SETOF integer
LANGUAGE sql STABLE AS $$
    SELECT e.session_key
    FROM dbos_agent.executors AS e, dbos_agent.server_began_at() AS s(began_at)
    WHERE dbos_agent.session_row_dead(
        e.heartbeat_at, e.lease_seconds, e.lock_lost_at, e.grace_seconds,
        e.session_key NOT IN (SELECT dbos_agent.locked_sessions()), s.began_at)
$$;
