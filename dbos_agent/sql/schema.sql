-- The dbos_agent schema as the numbered migrations leave it, in one file to read.
--
-- Databases are built by the migrations (migrations/NNN_*.sql, applied in order
-- under an advisory lock, see storage/migrations.py); tests/test_schema.py builds
-- one from this file and one from the migrations and checks they are the same.
-- Correctness lives here, as constraints and single guarded statements: the
-- Python side never reads a row to decide what to write.

CREATE SCHEMA IF NOT EXISTS dbos_agent;

-- == the clock =========================================================================

-- The database clock, which tests can move: the statement's time plus the session
-- setting dbos_agent.clock_offset (an interval; unset means none). Leases, the grace
-- of a lost lock, durable timers, rate limits and retention read time through it;
-- records (created_at, finished_at, ...) keep the real time.
CREATE FUNCTION dbos_agent.now() RETURNS timestamptz
LANGUAGE sql STABLE AS $$
    SELECT now()
           + coalesce(nullif(current_setting('dbos_agent.clock_offset', true), '')::interval,
                      interval '0')
$$;

-- == workflows =========================================================================

-- One row per workflow: its call, who runs it, how it ended.
CREATE TABLE dbos_agent.workflows (
    workflow_id           text        PRIMARY KEY CHECK (workflow_id <> ''),
    name                  text        NOT NULL,
    -- SUSPENDED: waiting without a thread or a session, see wait_kind below.
    status                text        NOT NULL,
    -- {"param": value, ...}: the bound arguments, JSON through pydantic; json, not jsonb:
    -- the text as the caller wrote it, so a dict argument keeps the order of its keys.
    inputs                json        NOT NULL,
    output                jsonb,
    -- {"type": "module.Class", "message": "...", "args": [...], "traceback": "..."}
    error                 jsonb,
    executor_id           text        NOT NULL,
    app_version           text,
    recovery_attempts     integer     NOT NULL DEFAULT 0 CHECK (recovery_attempts >= 0),
    max_recovery_attempts integer     NOT NULL CHECK (max_recovery_attempts >= 0),
    created_at            timestamptz NOT NULL DEFAULT now(),
    updated_at            timestamptz NOT NULL DEFAULT now(),
    finished_at           timestamptz,
    -- The executor session running a PENDING workflow; every log write is guarded on it.
    owner_key             integer,
    -- Queues: an ENQUEUED workflow waits for a worker; dequeuing sets dequeued_at.
    queue_name            text,
    priority              integer     NOT NULL DEFAULT 0,
    dequeued_at           timestamptz,
    -- A fork: the workflow and step it was copied from (no foreign key: the
    -- original may be deleted by retention).
    forked_from           text,
    forked_from_step      integer     CHECK (forked_from_step >= 0),
    -- What wakes a SUSPENDED workflow: 'sleep' at wake_at; 'recv' a message to it
    -- (wait_target, itself) on topic wait_name, or its deadline wake_at; 'event'
    -- workflow wait_target publishing event wait_name, or the deadline; 'child'
    -- workflow wait_target finishing; 'retry' the next attempt, at wake_at, of its
    -- RETRYING step named wait_name (a failing dependency waited out, migration 023).
    -- A delayed start is SUSPENDED 'sleep' until wake_at; a delayed enqueue is
    -- ENQUEUED with wake_at, not dequeued before then.
    wait_kind             text
        CHECK (wait_kind IN ('sleep', 'recv', 'event', 'child', 'retry')),
    wait_target           text,
    wait_name             text,
    wake_at               timestamptz,
    -- The workflow that started this one (da.start in a workflow): a cancel of the
    -- parent cancels it too. No foreign key: retention may delete the parent first.
    parent_id             text,
    -- Past this time (database clock) an unfinished workflow is cancelled, with the
    -- workflows it started (da.workflow_timeout; set once, at its first start).
    deadline_at           timestamptz,
    -- When the latest run began (set by every statement that gives the workflow to a
    -- session): steps recorded before it were replayed by that run, the others ran live.
    run_started_at        timestamptz NOT NULL DEFAULT now(),
    -- DIVERGED: the code called another step than the log recorded at a position (a
    -- code change). The workflow is held, unfinished and owned by nobody: `diverged`
    -- says where and how ({"position", "recorded", "called", "app_version",
    -- "code_version", "at"}); processes whose code version is in `diverged_versions`
    -- leave it alone, any other that may run it takes it and continues it.
    diverged              jsonb,
    diverged_versions     text[]      NOT NULL DEFAULT '{}',
    -- Application versions besides app_version whose processes may run it: recorded
    -- by `dbos-agent check-deploy --adopt` once its log was checked to fit their code.
    accepted_versions     text[]      NOT NULL DEFAULT '{}',
    -- Queue.enqueue(..., dedup_id=): unique among the queue's unfinished workflows
    -- (workflows_queue_dedup); a finished one frees it.
    dedup_id              text        CHECK (dedup_id <> ''),
    -- What operators changed in its log, oldest first (migration 027): a rewind, an
    -- edited fork's inputs and replaced step outputs; [{"kind", "by", "at", ...}].
    edits                 jsonb,
    -- Queue.enqueue(..., partition_key=) on a partitioned queue: the tenant whose
    -- limits it counts against (migration 028); NULL on every other workflow.
    partition_key         text        CHECK (partition_key <> ''),
    CONSTRAINT workflows_fork_origin_complete
        CHECK ((forked_from IS NULL) = (forked_from_step IS NULL)),
    CONSTRAINT workflows_status_check CHECK (status IN (
        'PENDING', 'SUSPENDED', 'SUCCESS', 'ERROR', 'CANCELLED', 'ENQUEUED',
        'MAX_RECOVERY_ATTEMPTS_EXCEEDED', 'IN_DOUBT', 'DIVERGED')),
    -- A finished workflow carries exactly the outcome its status says.
    CONSTRAINT workflows_outcome_matches_status CHECK (
        (status = 'SUCCESS' AND error IS NULL AND finished_at IS NOT NULL)
        OR (status IN ('ERROR', 'CANCELLED', 'MAX_RECOVERY_ATTEMPTS_EXCEEDED', 'IN_DOUBT')
            AND output IS NULL)
        OR (status IN ('PENDING', 'ENQUEUED', 'SUSPENDED', 'DIVERGED')
            AND output IS NULL AND error IS NULL)
    ),
    CONSTRAINT workflows_diverged_says_why CHECK (status <> 'DIVERGED' OR diverged IS NOT NULL),
    -- Exactly the SUSPENDED workflows say what wakes them, and say it whole.
    CONSTRAINT workflows_suspended_waits CHECK (
        (status = 'SUSPENDED') = (wait_kind IS NOT NULL)
        AND (wait_kind NOT IN ('sleep', 'retry') OR wake_at IS NOT NULL)
        AND (wait_kind NOT IN ('recv', 'event', 'retry') OR wait_name IS NOT NULL)
        AND (wait_kind NOT IN ('event', 'child') OR wait_target IS NOT NULL)
    )
);

-- Recovery at start: "pending workflows of executor X", oldest first.
CREATE INDEX workflows_pending_by_executor
    ON dbos_agent.workflows (executor_id, created_at) WHERE status = 'PENDING';
-- Listing by status, by name, and by time (retention walks these too).
CREATE INDEX workflows_by_status ON dbos_agent.workflows (status, created_at);
CREATE INDEX workflows_by_name ON dbos_agent.workflows (name, created_at);
CREATE INDEX workflows_by_created ON dbos_agent.workflows (created_at);
-- Suspended workflows: due timers earliest first, and who waits on a workflow's events.
CREATE INDEX workflows_suspended_until
    ON dbos_agent.workflows (wake_at) WHERE status = 'SUSPENDED';
CREATE INDEX workflows_suspended_on
    ON dbos_agent.workflows (wait_kind, wait_target) WHERE status = 'SUSPENDED';
-- The children of a workflow (a cancel walks them).
CREATE INDEX workflows_children
    ON dbos_agent.workflows (parent_id) WHERE parent_id IS NOT NULL;
CREATE INDEX workflows_deadlines ON dbos_agent.workflows (deadline_at)
    WHERE deadline_at IS NOT NULL AND status IN ('PENDING', 'SUSPENDED', 'ENQUEUED', 'DIVERGED');
-- An enqueue's deduplication id: one unfinished workflow per queue holds it.
CREATE UNIQUE INDEX workflows_queue_dedup
    ON dbos_agent.workflows (queue_name, dedup_id)
    WHERE dedup_id IS NOT NULL AND status IN ('PENDING', 'ENQUEUED', 'SUSPENDED', 'DIVERGED');
-- Diverged workflows, for the processes whose code may fit them.
CREATE INDEX workflows_diverged ON dbos_agent.workflows (created_at)
    WHERE status = 'DIVERGED';
-- Claims: the PENDING workflows of dead sessions, each session's oldest first.
CREATE INDEX workflows_pending_by_owner
    ON dbos_agent.workflows (owner_key, created_at, workflow_id) WHERE status = 'PENDING';
-- Queues: what waits, what runs, what started within a rate-limit period.
CREATE INDEX workflows_enqueued
    ON dbos_agent.workflows (queue_name, priority, created_at) WHERE status = 'ENQUEUED';
CREATE INDEX workflows_in_flight_by_queue
    ON dbos_agent.workflows (queue_name, owner_key)
    WHERE status = 'PENDING' AND queue_name IS NOT NULL;
CREATE INDEX workflows_dequeued_by_queue
    ON dbos_agent.workflows (queue_name, dequeued_at) WHERE dequeued_at IS NOT NULL;
-- Partitioned queues: each partition's waiting workflows in order, and its dequeues.
CREATE INDEX workflows_enqueued_by_partition
    ON dbos_agent.workflows (queue_name, partition_key, priority, created_at, workflow_id)
    WHERE status = 'ENQUEUED' AND partition_key IS NOT NULL;
CREATE INDEX workflows_dequeued_by_partition
    ON dbos_agent.workflows (queue_name, partition_key, dequeued_at)
    WHERE dequeued_at IS NOT NULL AND partition_key IS NOT NULL;

-- == queues ============================================================================

-- A queue's limits as every process serving it applies them (migration 029): recorded by
-- each launch from the code (source 'code'), or set by an operator (source 'operator',
-- which wins over the code's until reset). Processes read it every second or so.
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

-- == the step log ======================================================================

-- One row per step position. A result is written once and never changed: the
-- primary key makes "two runs both record step N" impossible. A non-idempotent
-- step first writes an intent (status PENDING, with its inputs); its result then
-- fills that row, once. An intent without a result after a crash is in doubt.
-- A step waiting out a failing dependency (migration 023) is RETRYING: the last
-- error, the attempts so far, and `retry` {"since", "next_at": epoch seconds on the
-- database clock, "waiting_for": what it waits for}; no attempt runs while the row
-- says so (a non-idempotent step makes it its intent again first), and its outcome
-- is recorded over it, once.
-- No foreign key to workflows: every insert is guarded by the workflow's status
-- and owner in the same statement, and a foreign key would lock the parent row
-- on every step.
CREATE TABLE dbos_agent.steps (
    workflow_id text        NOT NULL,
    seq         integer     NOT NULL CHECK (seq >= 0),
    name        text        NOT NULL,
    status      text        NOT NULL
        CHECK (status IN ('PENDING', 'SUCCESS', 'ERROR', 'RETRYING')),
    inputs      jsonb,
    output      jsonb,
    error       jsonb,
    attempts    integer     NOT NULL DEFAULT 1 CHECK (attempts >= 1),
    started_at  timestamptz NOT NULL,
    finished_at timestamptz DEFAULT now(),
    PRIMARY KEY (workflow_id, seq),
    CONSTRAINT steps_outcome_matches_status CHECK (
        (status = 'SUCCESS' AND error IS NULL AND finished_at IS NOT NULL)
        OR (status = 'ERROR' AND error IS NOT NULL AND output IS NULL
            AND finished_at IS NOT NULL)
        OR (status = 'PENDING' AND output IS NULL AND error IS NULL AND finished_at IS NULL)
        OR (status = 'RETRYING' AND output IS NULL AND error IS NOT NULL
            AND finished_at IS NULL)
    ),
    retry       jsonb,
    CONSTRAINT steps_retry_when_retrying CHECK (
        (status = 'RETRYING') = (retry IS NOT NULL)
        AND (retry IS NULL OR (jsonb_typeof(retry -> 'since') = 'number'
                               AND jsonb_typeof(retry -> 'next_at') = 'number'))
    ),
    -- The events the step set inside it (migration 031): {"key": value, ...}, the last
    -- value of each key, written with the row (record_step) as the events are set in
    -- its transaction; NULL: none. A fork and a rewind read them (event_sets).
    events      jsonb,
    CONSTRAINT steps_events_of_a_success CHECK (
        events IS NULL OR (status = 'SUCCESS' AND jsonb_typeof(events) = 'object')
    )
);
-- The steps waiting for their next attempt (operators list them; few at any time).
CREATE INDEX steps_retrying ON dbos_agent.steps (workflow_id, seq) WHERE status = 'RETRYING';

-- The first step of a workflow that waits for its next attempt (at most one row): what
-- `workflows list/show` say it waits for, whether it is SUSPENDED meanwhile or waits in
-- the process that runs it.
CREATE FUNCTION dbos_agent.retrying_step(wid text)
RETURNS TABLE (retry_seq integer, retry_step text, retry_attempts integer,
               retry_error text, retry_state text)
LANGUAGE sql STABLE AS $$
    SELECT s.seq, s.name, s.attempts, s.error::text, s.retry::text
    FROM dbos_agent.steps AS s
    WHERE s.workflow_id = wid AND s.status = 'RETRYING'
    ORDER BY s.seq
    LIMIT 1
$$;

-- The status a session may write under: the workflow's status, or NOT_OWNER
-- when it is PENDING under another session (NULL when there is no such
-- workflow). Every statement that appends to the log guards on it.
CREATE FUNCTION dbos_agent.write_status(wid text, session integer) RETURNS text
LANGUAGE sql STABLE AS $$
    SELECT CASE WHEN owner_key IS DISTINCT FROM session AND status = 'PENDING'
                THEN 'NOT_OWNER' ELSE status END
    FROM dbos_agent.workflows
    WHERE workflow_id = wid
$$;

-- Whether a process may run a workflow: its application version is the workflow's
-- (or one accepted for it), or it runs every version (NULL); and its code has not
-- diverged on it. Every statement that gives a workflow to a process asks this.
CREATE FUNCTION dbos_agent.may_run(
    workflow_version text, accepted text[], diverged text[],
    process_version text, process_code text
) RETURNS boolean LANGUAGE sql IMMUTABLE AS $$
    SELECT (process_version IS NULL OR workflow_version = process_version
            OR process_version = ANY(accepted))
           AND NOT coalesce(process_code = ANY(diverged), false)
$$;

-- == model usage per family ============================================================

-- A running total of the model replies of each workflow family (its root ancestor and
-- every workflow below it), per step name and model, kept by trigger in the statement
-- that records each reply: a model budget reads a few rows here instead of summing the
-- family's log before every call (see migration 020).
CREATE TABLE dbos_agent.family_usage (
    workflow_id                 text   NOT NULL,
    step_name                   text   NOT NULL,
    model                       text   NOT NULL,
    replies                     bigint NOT NULL,
    input_tokens                bigint NOT NULL,
    output_tokens               bigint NOT NULL,
    cache_creation_input_tokens bigint NOT NULL,
    cache_read_input_tokens     bigint NOT NULL,
    PRIMARY KEY (workflow_id, step_name, model)
);

-- The root of a workflow's family: its topmost ancestor still recorded (itself without a
-- parent; NULL for an unknown id). A loop of primary-key lookups, planned once per
-- session: the trigger below runs it for every model reply.
CREATE FUNCTION dbos_agent.family_root(id text) RETURNS text
LANGUAGE plpgsql STABLE AS $$
DECLARE
    root text;
    parent text;
    next_root text;
    next_parent text;
BEGIN
    SELECT w.workflow_id, w.parent_id INTO root, parent
    FROM dbos_agent.workflows AS w WHERE w.workflow_id = id;
    FOR depth IN 1..1000 LOOP
        EXIT WHEN parent IS NULL;
        SELECT w.workflow_id, w.parent_id INTO next_root, next_parent
        FROM dbos_agent.workflows AS w WHERE w.workflow_id = parent;
        EXIT WHEN NOT FOUND;
        root := next_root;
        parent := next_parent;
    END LOOP;
    RETURN root;
END
$$;

-- One token count of a reply's usage object, as usage_of_reply reads it; clamped, so that
-- a reply with an absurd count can never fail the checkpoint that records it.
CREATE FUNCTION dbos_agent.usage_tokens(usage jsonb, key text) RETURNS bigint
LANGUAGE sql IMMUTABLE AS $$
    SELECT CASE jsonb_typeof(usage -> key)
               WHEN 'number' THEN least(greatest(trunc((usage ->> key)::numeric),
                                                 -1e18), 1e18)::bigint
               WHEN 'boolean' THEN (usage ->> key)::boolean::integer
               ELSE 0
           END
$$;

CREATE FUNCTION dbos_agent.count_family_usage() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO dbos_agent.family_usage AS f
        (workflow_id, step_name, model, replies, input_tokens, output_tokens,
         cache_creation_input_tokens, cache_read_input_tokens)
    VALUES (coalesce(dbos_agent.family_root(NEW.workflow_id), NEW.workflow_id), NEW.name,
            coalesce(nullif(NEW.output ->> 'model', ''), 'unknown'), 1,
            dbos_agent.usage_tokens(NEW.output -> 'usage', 'input_tokens'),
            dbos_agent.usage_tokens(NEW.output -> 'usage', 'output_tokens'),
            dbos_agent.usage_tokens(NEW.output -> 'usage', 'cache_creation_input_tokens'),
            dbos_agent.usage_tokens(NEW.output -> 'usage', 'cache_read_input_tokens'))
    ON CONFLICT (workflow_id, step_name, model) DO UPDATE
        SET replies = f.replies + 1,
            input_tokens = f.input_tokens + EXCLUDED.input_tokens,
            output_tokens = f.output_tokens + EXCLUDED.output_tokens,
            cache_creation_input_tokens
                = f.cache_creation_input_tokens + EXCLUDED.cache_creation_input_tokens,
            cache_read_input_tokens
                = f.cache_read_input_tokens + EXCLUDED.cache_read_input_tokens;
    RETURN NULL;
END
$$;

-- The WHEN clauses keep every other step (no usage object, or not a success) from
-- running the function at all.
CREATE TRIGGER steps_count_family_usage AFTER INSERT ON dbos_agent.steps
    FOR EACH ROW
    WHEN (NEW.status = 'SUCCESS' AND jsonb_typeof(NEW.output -> 'usage') = 'object')
    EXECUTE FUNCTION dbos_agent.count_family_usage();
CREATE TRIGGER steps_count_family_usage_on_success AFTER UPDATE OF status ON dbos_agent.steps
    FOR EACH ROW
    WHEN (OLD.status <> 'SUCCESS' AND NEW.status = 'SUCCESS'
          AND jsonb_typeof(NEW.output -> 'usage') = 'object')
    EXECUTE FUNCTION dbos_agent.count_family_usage();

-- == executor sessions =================================================================

-- Every launched process registers a session and holds the session-level
-- advisory lock (classid 233710, objid = session_key) on a connection of its
-- own. Postgres releases the lock when that connection dies: when the process
-- died, but also when only the connection did (a restart, a killed backend),
-- and a live process takes its own key back within moments. So others declare
-- a session dead only when
--   * it is gone from this table, or its lease ran out (a hung or partitioned
--     process; a clean exit sets heartbeat_at to -infinity), or
--   * its lock has been free for longer than its grace, counted from the first
--     time someone saw it free (lock_lost_at) and from its last heartbeat, so
--     that after a Postgres restart every live process has the grace to
--     reconnect.
-- Both count from when the session was last seen (last_seen): its last heartbeat,
-- or when the server began accepting writes if later (its start, or its promotion
-- from standby, see server_epochs), so a restart or a failover that took as long as a
-- lease does not make every session dead before any could reconnect.
-- A process on the same host (same boot and pid namespace, see process_key)
-- may also see at once that the pid is gone and end the session itself. The
-- owner keeps a fence that mirrors these rules (storage/session.py).
CREATE TABLE dbos_agent.executors (
    session_key   integer     PRIMARY KEY,
    executor_id   text        NOT NULL,
    app_version   text,
    hostname      text        NOT NULL,
    pid           integer     NOT NULL,
    lease_seconds double precision NOT NULL CHECK (lease_seconds > 0),
    started_at    timestamptz NOT NULL DEFAULT now(),
    heartbeat_at  timestamptz NOT NULL DEFAULT now(),
    grace_seconds double precision NOT NULL DEFAULT 3 CHECK (grace_seconds > 0),
    lock_lost_at  timestamptz,
    -- 'boot id/pid namespace/pid/start time', NULL where the platform cannot say.
    process_key   text,
    -- The queues this session dequeues from (a limited queue is shared among them).
    queues        text[]      NOT NULL DEFAULT '{}',
    -- The code version of its process (registry.code_version), beside app_version.
    code_version  text,
    -- A session that holds no lock (its process reaches the server only through a
    -- transaction pooler): judged by its lease alone, see locked_sessions().
    lease_only    boolean     NOT NULL DEFAULT false
);
CREATE INDEX executors_by_id ON dbos_agent.executors (executor_id);

-- Keys are never handed out twice (until 2^31 registrations), so a process
-- that reconnects can always take its own key back.
CREATE SEQUENCE dbos_agent.session_keys AS integer MINVALUE 1 CYCLE;

-- The sessions whose advisory lock is held now (their connection is open), and those
-- that hold none (lease_only): no one stamps their lock as lost or waits out a grace for
-- them; they are dead once their lease has run out (or, seen from their own host, once
-- their process is gone: the statements that list sessions for that check list them too).
CREATE FUNCTION dbos_agent.locked_sessions() RETURNS SETOF integer
LANGUAGE sql STABLE AS $$
    SELECT l.objid::bigint::integer
    FROM pg_locks AS l
    WHERE l.locktype = 'advisory' AND l.classid = 233710 AND l.objsubid = 2 AND l.granted
      AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database())
    UNION ALL
    SELECT e.session_key FROM dbos_agent.executors AS e WHERE e.lease_only
$$;

-- The timeline a server writes on changes at every promotion of a standby (and at the
-- end of a point-in-time recovery): pg_walfile_name(pg_current_wal_lsn()) names it, in
-- its first 8 hex digits, from the moment the server accepts writes (PostgreSQL 15 and
-- later; pg_control_checkpoint() lags until the next checkpoint is done). A server in
-- recovery (a read-only standby) has none; nothing is judged there, and these
-- functions answer there without an error. server_epochs holds when the library first
-- saw each timeline accepting writes, on the server's own clock (like
-- pg_postmaster_start_time(); dbos_agent.now()'s test offset does not apply).
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

-- When a session was last known alive: its last heartbeat, or when the server began
-- accepting writes (``began_at``, from server_began_at()) if that is later: no session
-- can heartbeat while the server is down or not yet promoted, so after a restart or a
-- failover each has its whole lease and grace to come back. A clean exit's -infinity
-- stays. Statements that judge many sessions look server_began_at() up once (a function
-- in their FROM list) and give it; the one-argument form looks it up itself.
CREATE FUNCTION dbos_agent.last_seen(heartbeat_at timestamptz, began_at timestamptz)
RETURNS timestamptz
LANGUAGE sql STABLE AS $$
    SELECT CASE WHEN heartbeat_at = '-infinity' THEN heartbeat_at
                ELSE greatest(heartbeat_at, began_at) END
$$;

CREATE FUNCTION dbos_agent.last_seen(heartbeat_at timestamptz) RETURNS timestamptz
LANGUAGE sql STABLE AS $$
    SELECT dbos_agent.last_seen(heartbeat_at, dbos_agent.server_began_at())
$$;

-- Whether a session's row says it is dead (the rules above): ``unlocked`` says its
-- lock is free now, ``began_at`` when the server began (see last_seen). The one
-- statement of the rules: dead_sessions(), the take-overs (which lock the row they
-- judge) and the heartbeat use it; the five-argument form (for one row, and for the
-- statements of processes of an older version) looks ``began_at`` up itself.
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

CREATE FUNCTION dbos_agent.session_row_dead(
    heartbeat_at timestamptz, lease_seconds double precision, lock_lost_at timestamptz,
    grace_seconds double precision, unlocked boolean
) RETURNS boolean
LANGUAGE sql STABLE AS $$
    SELECT dbos_agent.session_row_dead(heartbeat_at, lease_seconds, lock_lost_at,
                                       grace_seconds, unlocked, dbos_agent.server_began_at())
$$;

-- The sessions whose PENDING workflows others may take over (see the rules above).
CREATE FUNCTION dbos_agent.dead_sessions() RETURNS SETOF integer
LANGUAGE sql STABLE AS $$
    SELECT e.session_key
    FROM dbos_agent.executors AS e, dbos_agent.server_began_at() AS s(began_at)
    WHERE dbos_agent.session_row_dead(
        e.heartbeat_at, e.lease_seconds, e.lock_lost_at, e.grace_seconds,
        e.session_key NOT IN (SELECT dbos_agent.locked_sessions()), s.began_at)
$$;

-- A workflow PENDING without an owner (resumed or forked by a process that cannot
-- run it, a doubt resolved from the CLI) or DIVERGED, and a session ended while it
-- owns PENDING workflows, are claimable at once: a NOTIFY on dbos_agent_claimable (payload '')
-- makes the take-over pass of every live process look now instead of at its next
-- round.
CREATE FUNCTION dbos_agent.notify_claimable() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_notify('dbos_agent_claimable', '');
    RETURN NULL;
END
$$;

CREATE TRIGGER executors_notify_claimable AFTER UPDATE OF heartbeat_at
    ON dbos_agent.executors
    FOR EACH ROW WHEN (NEW.heartbeat_at = '-infinity' AND OLD.heartbeat_at <> '-infinity')
    EXECUTE FUNCTION dbos_agent.notify_claimable();

CREATE TRIGGER workflows_notify_claimable AFTER INSERT OR UPDATE OF status, owner_key
    ON dbos_agent.workflows
    FOR EACH ROW
    WHEN ((NEW.status = 'PENDING' AND NEW.owner_key IS NULL) OR NEW.status = 'DIVERGED')
    EXECUTE FUNCTION dbos_agent.notify_claimable();

-- One session, for single-row checks (a direct call of a workflow someone owns).
CREATE FUNCTION dbos_agent.session_is_dead(key integer) RETURNS boolean
LANGUAGE sql STABLE AS $$
    SELECT key IS NULL
        OR NOT EXISTS (SELECT 1 FROM dbos_agent.executors WHERE session_key = key)
        OR key IN (SELECT dbos_agent.dead_sessions())
$$;

-- == messages and events ===============================================================

-- A message is consumed by marking it with the step position of the recv that
-- took it, in the statement that records that step: it is never deleted while
-- its workflow lives, so an idempotency key keeps deduplicating after the
-- message was consumed. Inserting a message or setting an event NOTIFYs (by
-- trigger, in the inserting transaction); waiters also poll, so a lost
-- notification only delays them.
CREATE TABLE dbos_agent.messages (
    message_id      bigint      GENERATED ALWAYS AS IDENTITY,
    destination_id  text        NOT NULL,
    -- '' is the default topic (topic=None).
    topic           text        NOT NULL DEFAULT '',
    message         jsonb       NOT NULL,
    idempotency_key text,
    created_at      timestamptz NOT NULL DEFAULT now(),
    -- The position of the destination's recv step that consumed it.
    consumed_seq    integer     CHECK (consumed_seq >= 0),
    consumed_at     timestamptz,
    CONSTRAINT messages_consumed_together CHECK ((consumed_seq IS NULL) = (consumed_at IS NULL)),
    -- Same key, same destination: one message. NULL keys never collide. Its
    -- index (destination_id first) also serves retention.
    CONSTRAINT messages_idempotency_key UNIQUE (destination_id, idempotency_key),
    -- Keyed by the workflow it belongs to, as every workflow's table is (see
    -- docs/operating/scale-out.md: a table distributed by workflow id needs it in every key).
    CONSTRAINT messages_pkey PRIMARY KEY (destination_id, message_id)
);
-- recv: the oldest unconsumed message of (workflow, topic).
CREATE INDEX messages_unconsumed
    ON dbos_agent.messages (destination_id, topic, message_id) WHERE consumed_seq IS NULL;

-- Events published by a workflow: the last value per key wins.
CREATE TABLE dbos_agent.events (
    workflow_id text        NOT NULL,
    key         text        NOT NULL,
    value       jsonb       NOT NULL,
    updated_at  timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (workflow_id, key)
);

-- The payload is the workflow id; an id too long for a NOTIFY payload sends ''
-- instead, which wakes every waiter on the channel.
CREATE FUNCTION dbos_agent.notify_message() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_notify('dbos_agent_messages',
                      CASE WHEN octet_length(NEW.destination_id) < 7000
                           THEN NEW.destination_id ELSE '' END);
    RETURN NULL;
END
$$;

CREATE FUNCTION dbos_agent.notify_event() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_notify('dbos_agent_events',
                      CASE WHEN octet_length(NEW.workflow_id) < 7000
                           THEN NEW.workflow_id ELSE '' END);
    RETURN NULL;
END
$$;

CREATE TRIGGER messages_notify AFTER INSERT ON dbos_agent.messages
    FOR EACH ROW EXECUTE FUNCTION dbos_agent.notify_message();
CREATE TRIGGER events_notify AFTER INSERT OR UPDATE ON dbos_agent.events
    FOR EACH ROW EXECUTE FUNCTION dbos_agent.notify_event();

-- A workflow finishing while another is suspended on its result: the payload is
-- its id ('' when too long), on the channel dbos_agent_finished.
CREATE FUNCTION dbos_agent.notify_finished() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF EXISTS (SELECT 1 FROM dbos_agent.workflows
               WHERE status = 'SUSPENDED' AND wait_kind = 'child'
                 AND wait_target = NEW.workflow_id) THEN
        PERFORM pg_notify('dbos_agent_finished',
                          CASE WHEN octet_length(NEW.workflow_id) < 7000
                               THEN NEW.workflow_id ELSE '' END);
    END IF;
    RETURN NULL;
END
$$;

CREATE TRIGGER workflows_notify_finished AFTER UPDATE OF status ON dbos_agent.workflows
    FOR EACH ROW
    WHEN (NEW.status NOT IN ('PENDING', 'ENQUEUED', 'SUSPENDED', 'DIVERGED')
          AND OLD.status IN ('PENDING', 'ENQUEUED', 'SUSPENDED', 'DIVERGED'))
    EXECUTE FUNCTION dbos_agent.notify_finished();

-- == streams ===========================================================================

-- Ordered JSON items a workflow publishes under a key, one row each, offsets dense
-- from 0 per (workflow, key). Values written from the workflow body are checkpointed
-- with a step (exactly once); values written from inside a step go out live, tagged
-- with the step's position and attempt, and a 'reset' item voids a step's earlier
-- items when another attempt of it writes (or an attempt fails). 'close' ends it.
CREATE TABLE dbos_agent.streams (
    workflow_id text        NOT NULL,
    key         text        NOT NULL,
    "offset"    integer     NOT NULL CHECK ("offset" >= 0),
    kind        text        NOT NULL CHECK (kind IN ('value', 'reset', 'close')),
    value       jsonb,
    step_seq    integer,
    attempt     integer,
    attempt_id  text,
    created_at  timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (workflow_id, key, "offset"),
    CONSTRAINT streams_value_only_on_values CHECK ((kind = 'value') = (value IS NOT NULL))
);

-- Append one item at the next offset and NOTIFY readers (payload: the workflow id).
-- Returns the offset, -1 when the stream is closed, or -2 when a step's item comes
-- from a session that no longer owns the PENDING workflow (a process paused past
-- its lease: its output is void, and nothing is written). The
-- first value of a step attempt after items of another attempt of that step (a
-- retry, a re-run after a crash) is preceded by a reset naming the step. Offsets
-- come from the primary key: a writer that loses a race takes the next one, after
-- the winner commits, so readers never see a later offset before an earlier one.
CREATE FUNCTION dbos_agent.append_stream(
    wid text, skey text, item_kind text, item jsonb,
    seq integer, attempt_no integer, attempt_tag text, session integer
) RETURNS integer LANGUAGE plpgsql AS $$
DECLARE
    next_offset integer;
BEGIN
    IF seq IS NOT NULL AND NOT EXISTS (
        SELECT 1 FROM dbos_agent.workflows
        WHERE workflow_id = wid AND status = 'PENDING' AND owner_key = session) THEN
        RETURN -2;
    END IF;
    IF EXISTS (SELECT 1 FROM dbos_agent.streams
               WHERE workflow_id = wid AND key = skey AND kind = 'close') THEN
        RETURN -1;
    END IF;
    IF item_kind = 'value' AND seq IS NOT NULL
       AND NOT EXISTS (SELECT 1 FROM dbos_agent.streams
                       WHERE workflow_id = wid AND key = skey AND step_seq = seq
                         AND attempt_id = attempt_tag)
       AND EXISTS (SELECT 1 FROM dbos_agent.streams AS s
                   WHERE s.workflow_id = wid AND s.key = skey AND s.step_seq = seq
                     AND s.kind = 'value'
                     AND s."offset" > COALESCE(
                         (SELECT max(r."offset") FROM dbos_agent.streams AS r
                          WHERE r.workflow_id = wid AND r.key = skey AND r.step_seq = seq
                            AND r.kind = 'reset'), -1)) THEN
        PERFORM dbos_agent.append_stream(wid, skey, 'reset', NULL, seq, attempt_no, attempt_tag,
                                         session);
    END IF;
    LOOP
        SELECT COALESCE(max("offset") + 1, 0) INTO next_offset
        FROM dbos_agent.streams WHERE workflow_id = wid AND key = skey;
        BEGIN
            INSERT INTO dbos_agent.streams
                (workflow_id, key, "offset", kind, value, step_seq, attempt, attempt_id)
            VALUES (wid, skey, next_offset, item_kind, item, seq, attempt_no, attempt_tag);
            EXIT;
        EXCEPTION WHEN unique_violation THEN
            -- another writer took this offset (and has committed): take the next
        END;
    END LOOP;
    PERFORM pg_notify('dbos_agent_streams',
                      CASE WHEN octet_length(wid) < 7000 THEN wid ELSE '' END);
    RETURN next_offset;
END
$$;

-- The stream items a workflow's body wrote below step `before`: its write_stream and
-- close_stream steps record the item's offset, and their inputs its key (an older log
-- has no key there: matched on any key). A fork copies them; a rewind keeps them.
CREATE FUNCTION dbos_agent.body_stream_writes(wid text, before integer)
RETURNS TABLE (seq integer, key text, "offset" integer)
LANGUAGE sql STABLE AS $$
    SELECT k.seq, i.key, i."offset"
    FROM dbos_agent.steps AS k
    JOIN dbos_agent.streams AS i
      ON i.workflow_id = wid AND i.step_seq IS NULL
     AND jsonb_typeof(k.output) = 'number'
     AND i."offset" = (k.output #>> '{}')::integer
     AND i.kind = CASE k.name WHEN 'dbos_agent.close_stream' THEN 'close' ELSE 'value' END
     AND (k.inputs ->> 'key' IS NULL OR i.key = k.inputs ->> 'key')
    WHERE k.workflow_id = wid AND k.seq < before
      AND k.name IN ('dbos_agent.write_stream', 'dbos_agent.close_stream')
      AND k.status = 'SUCCESS'
$$;

-- The events a workflow set below step `before`, one row per setter and key (seq: the
-- setter's position, for the caller to order by): its body's set_event steps (value NULL in logs of older versions,
-- without the value in the step's inputs: not known) and the events its steps set
-- (their `events`). The last setter of a key below a position is what the event held
-- there: a fork copies it, a rewind restores it.
CREATE FUNCTION dbos_agent.event_sets(wid text, before integer)
RETURNS TABLE (seq integer, key text, value jsonb)
LANGUAGE sql STABLE AS $$
    SELECT s.seq, s.inputs ->> 'key',
           CASE WHEN s.inputs ? 'value' THEN s.inputs -> 'value' END
    FROM dbos_agent.steps AS s
    WHERE s.workflow_id = wid AND s.seq < before
      AND s.name = 'dbos_agent.set_event' AND s.status = 'SUCCESS'
      AND s.inputs ->> 'key' IS NOT NULL
    UNION ALL
    SELECT s.seq, e.key, e.value
    FROM dbos_agent.steps AS s, jsonb_each(s.events) AS e
    WHERE s.workflow_id = wid AND s.seq < before AND s.events IS NOT NULL
$$;

-- == approvals =========================================================================

-- What a workflow asks a human (da.request_approval), at the position of its request
-- step: the tool, its arguments and their digest. A decision must name all three and is
-- taken once, with the message that tells the workflow (decide_approval).
CREATE TABLE dbos_agent.approvals (
    workflow_id  text        NOT NULL,
    seq          integer     NOT NULL CHECK (seq >= 0),
    tool         text        NOT NULL,
    arguments    jsonb       NOT NULL,
    digest       text        NOT NULL,
    status       text        NOT NULL DEFAULT 'PENDING'
                             CHECK (status IN ('PENDING', 'APPROVED', 'REJECTED')),
    reason       text,
    requested_at timestamptz NOT NULL DEFAULT now(),
    decided_at   timestamptz,
    PRIMARY KEY (workflow_id, seq),
    CONSTRAINT approvals_decided_when_not_pending
        CHECK ((status = 'PENDING') = (decided_at IS NULL))
);

CREATE INDEX approvals_pending ON dbos_agent.approvals (requested_at)
    WHERE status = 'PENDING';

-- == schedules =========================================================================

-- One row per cron schedule (@da.scheduled). Every process that defines it writes its
-- description at launch; the CLI reads it without the code, so the row holds what firing
-- a slot from the database alone needs: the workflow's name, the parameter that
-- receives the slot, its recovery limit, the cron text and the time zone.
-- handled_through is the schedule's cursor: every slot at or before it was dealt with
-- (fired, skipped, buffered, or passed over by the catch-up policy or a pause); with
-- catch_up = 'all' and overlap 'skip' or 'buffer_one' it stays behind while due slots
-- wait their turn (each fires once the previous run ended). A slot
-- is fired in one transaction that locks this row, moves the cursor past the slot and
-- inserts the slot's workflow (its id is name@slot): two processes never both fire a
-- slot, and no crash can separate the two writes.
CREATE TABLE dbos_agent.schedules (
    name                  text        PRIMARY KEY CHECK (name <> ''),
    workflow_name         text        NOT NULL,
    -- The workflow's one parameter, which receives the slot: inputs are {slot_param: slot}.
    slot_param            text        NOT NULL,
    max_recovery_attempts integer     NOT NULL CHECK (max_recovery_attempts >= 0),
    cron                  text        NOT NULL,
    timezone              text        NOT NULL,
    catch_up              text        NOT NULL CHECK (catch_up IN ('latest', 'all', 'none')),
    catch_up_window       interval    NOT NULL CHECK (catch_up_window > interval '0'),
    overlap               text        NOT NULL CHECK (overlap IN ('skip', 'allow', 'buffer_one')),
    -- The executor and version of the process that last registered it: a backfill from
    -- the CLI records the slots' workflows under them.
    executor_id           text        NOT NULL,
    app_version           text,
    paused                boolean     NOT NULL DEFAULT false,
    handled_through       timestamptz NOT NULL,
    -- The latest slot whose workflow was started, and that workflow.
    last_slot             timestamptz,
    last_workflow_id      text,
    -- overlap = 'buffer_one': the slot that starts when the unfinished run ends.
    buffered_slot         timestamptz,
    -- Slots the overlap policy did not run.
    skipped_slots         bigint      NOT NULL DEFAULT 0 CHECK (skipped_slots >= 0),
    last_skipped_slot     timestamptz,
    created_at            timestamptz NOT NULL DEFAULT now(),
    updated_at            timestamptz NOT NULL DEFAULT now(),
    -- catch_up = 'all': slots passed over without a run because they fell out of the
    -- catch-up window (or beyond its 10,000 latest) before their turn.
    passed_slots          bigint      NOT NULL DEFAULT 0 CHECK (passed_slots >= 0),
    last_passed_slot      timestamptz,
    CONSTRAINT schedules_last_run_whole CHECK ((last_slot IS NULL) = (last_workflow_id IS NULL))
);

-- == deleting ==========================================================================

-- What hangs off a workflow, deleted with it (retention's batches, `dbos-agent workflows
-- delete`): steps, the messages sent to it, events, stream items, approval requests and
-- the model usage of the family it was the root of. Returns the counts retention reports.
CREATE FUNCTION dbos_agent.delete_logs(ids text[])
RETURNS TABLE (steps bigint, messages bigint, events bigint)
LANGUAGE sql VOLATILE AS $$
    WITH steps AS (
        DELETE FROM dbos_agent.steps WHERE workflow_id = ANY(ids) RETURNING 1
    ), messages AS (
        DELETE FROM dbos_agent.messages WHERE destination_id = ANY(ids) RETURNING 1
    ), events AS (
        DELETE FROM dbos_agent.events WHERE workflow_id = ANY(ids) RETURNING 1
    ), streams AS (
        DELETE FROM dbos_agent.streams WHERE workflow_id = ANY(ids)
    ), approvals AS (
        DELETE FROM dbos_agent.approvals WHERE workflow_id = ANY(ids)
    ), usage AS (
        DELETE FROM dbos_agent.family_usage WHERE workflow_id = ANY(ids)
    )
    SELECT (SELECT count(*) FROM steps), (SELECT count(*) FROM messages),
           (SELECT count(*) FROM events)
$$;
