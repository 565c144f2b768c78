-- Every statement dbos_agent sends, named. storage/sql_files.py loads this file;
-- each query starts at a "-- name: verb_noun" line and runs to the next one.
-- The line after the name says the query's scope, what rows it may touch (a unit
-- test holds every query to exactly one; a sharded design starts from them):
--   -- scope: one workflow   rows keyed by one workflow id (its row, steps, the
--                            messages sent to it, events, streams, approvals)
--   -- scope: a family       one workflow and those linked to it: its parent and
--                            children, the workflow it waits on, a fork's original
--   -- scope: many           anything else: a scan, a set of unrelated workflows,
--                            or no workflow at all (sessions, queues, schedules)
-- Parameters use psycopg's %(name)s style. JSON travels as text and is cast
-- to jsonb here, so Python never parses a checkpoint twice.

-- name: insert_workflow
-- scope: a family
-- Record a new workflow (PENDING and owned by the caller's session, or
-- ENQUEUED and owned by nobody), with its deadline if it has a timeout; a child
-- inherits its parent's deadline (the earlier one of the two), as in DBOS. No row
-- back: the id is taken, and find_workflow_call reads what holds it (idempotent
-- start: the first start's deadline stays). The common case is this one statement.
-- A delayed call has wake_at (SUSPENDED 'sleep' until then, or ENQUEUED and not
-- dequeued before); an enqueue's dedup_id taken by an unfinished workflow of the
-- queue fails on workflows_queue_dedup.
INSERT INTO dbos_agent.workflows
    (workflow_id, name, status, inputs, executor_id, app_version, max_recovery_attempts,
     owner_key, queue_name, priority, parent_id, deadline_at, dedup_id, wait_kind, wake_at,
     partition_key)
VALUES
    (%(workflow_id)s, %(name)s, %(status)s, %(inputs)s::json, %(executor_id)s,
     %(app_version)s, %(max_recovery_attempts)s, %(owner_key)s, %(queue_name)s,
     %(priority)s, %(parent_id)s,
     least(dbos_agent.now() + make_interval(secs => %(timeout)s::float8),
           (SELECT p.deadline_at FROM dbos_agent.workflows AS p
            WHERE p.workflow_id = %(parent_id)s)),
     %(dedup_id)s, %(wait_kind)s,
     dbos_agent.now() + make_interval(secs => %(delay)s::float8), %(partition_key)s)
ON CONFLICT (workflow_id) DO NOTHING
RETURNING true AS inserted;

-- name: find_workflow_call
-- scope: one workflow
-- The workflow holding an id that insert_workflow found taken, with whether its
-- owner is alive (no row: it was deleted since, and the insert is tried again).
SELECT name, status, inputs::text, output::text, error::text, owner_key,
       NOT dbos_agent.session_is_dead(owner_key) AS owner_live
FROM dbos_agent.workflows
WHERE workflow_id = %(workflow_id)s;

-- name: append_step
-- scope: one workflow
-- The checkpoint in its common case and cheapest form: a plain insert,
-- guarded on the workflow being PENDING and owned by the caller's session.
-- No row back (the guard failed, or the position is taken) sends the caller to
-- record_step, which says why and adopts.
INSERT INTO dbos_agent.steps
    (workflow_id, seq, name, status, output, error, attempts, started_at)
SELECT %(workflow_id)s, %(seq)s, %(name)s, %(status)s, %(output)s::jsonb, %(error)s::jsonb,
       %(attempts)s, %(started_at)s
WHERE EXISTS (
    SELECT 1 FROM dbos_agent.workflows
    WHERE workflow_id = %(workflow_id)s AND status = 'PENDING' AND owner_key = %(owner_key)s)
ON CONFLICT (workflow_id, seq) DO NOTHING
RETURNING workflow_id, seq;

-- name: append_steps
-- scope: many
-- append_step for a group commit of several steps (storage/group_commit.py), given as
-- one JSON array of rows: each insert guarded on its own workflow.
INSERT INTO dbos_agent.steps
    (workflow_id, seq, name, status, output, error, attempts, started_at)
SELECT s.workflow_id, s.seq, s.name, s.status, s.output::jsonb, s.error::jsonb, s.attempts,
       s.started_at
FROM json_to_recordset(%(rows)s::json)
     AS s(workflow_id text, seq integer, name text, status text, output text, error text,
          attempts integer, started_at timestamptz, owner_key integer)
WHERE EXISTS (
    SELECT 1 FROM dbos_agent.workflows AS w
    WHERE w.workflow_id = s.workflow_id AND w.status = 'PENDING' AND w.owner_key = s.owner_key)
ON CONFLICT (workflow_id, seq) DO NOTHING
RETURNING workflow_id, seq;

-- name: write_checkpoints
-- scope: many
-- A group commit (storage/log_writes.py) holding more than steps: the happy path's
-- three writes, each guarded as its own statement guards it, in one statement and one
-- commit. Rows of kind 'start' are insert_workflow's (a new workflow; no dedup_id,
-- whose refusal would fail the whole batch), 'step' append_steps' (a checkpoint), and
-- 'finish' finish_workflow's update (an outcome). A workflow appears at most once: its
-- steps come after its start has returned, its outcome after its last step.
-- Returns (kind, workflow_id, seq) of each row written (seq only for steps); a row
-- missing sends its writer to the statement that explains.
WITH given AS (
    SELECT *
    FROM json_to_recordset(%(rows)s::json)
         AS r(kind text, workflow_id text, seq integer, name text, status text,
              output text, error text, attempts integer, started_at timestamptz,
              owner_key integer, inputs text, executor_id text, app_version text,
              max_recovery_attempts integer, queue_name text, priority integer,
              parent_id text, timeout float8, wait_kind text, delay float8,
              partition_key text)
), started AS (
    INSERT INTO dbos_agent.workflows
        (workflow_id, name, status, inputs, executor_id, app_version,
         max_recovery_attempts, owner_key, queue_name, priority, parent_id, deadline_at,
         wait_kind, wake_at, partition_key)
    SELECT n.workflow_id, n.name, n.status, n.inputs::json, n.executor_id, n.app_version,
           n.max_recovery_attempts, n.owner_key, n.queue_name, n.priority, n.parent_id,
           least(dbos_agent.now() + make_interval(secs => n.timeout),
                 (SELECT p.deadline_at FROM dbos_agent.workflows AS p
                  WHERE p.workflow_id = n.parent_id)),
           n.wait_kind, dbos_agent.now() + make_interval(secs => n.delay), n.partition_key
    FROM given AS n
    WHERE n.kind = 'start'
    ON CONFLICT (workflow_id) DO NOTHING
    RETURNING workflow_id
), steps_written AS (
    INSERT INTO dbos_agent.steps
        (workflow_id, seq, name, status, output, error, attempts, started_at)
    SELECT s.workflow_id, s.seq, s.name, s.status, s.output::jsonb, s.error::jsonb,
           s.attempts, s.started_at
    FROM given AS s
    WHERE s.kind = 'step' AND EXISTS (
        SELECT 1 FROM dbos_agent.workflows AS w
        WHERE w.workflow_id = s.workflow_id AND w.status = 'PENDING'
          AND w.owner_key = s.owner_key)
    ON CONFLICT (workflow_id, seq) DO NOTHING
    RETURNING workflow_id, seq
), finished AS (
    UPDATE dbos_agent.workflows AS w
    SET status = f.status, output = f.output::jsonb, error = f.error::jsonb,
        owner_key = NULL, updated_at = now(), finished_at = now()
    FROM given AS f
    WHERE f.kind = 'finish' AND w.workflow_id = f.workflow_id AND w.status = 'PENDING'
      AND w.owner_key IS NOT DISTINCT FROM f.owner_key
    RETURNING w.workflow_id
)
SELECT 'start', workflow_id, NULL::integer FROM started
UNION ALL
SELECT 'step', workflow_id, seq FROM steps_written
UNION ALL
SELECT 'finish', workflow_id, NULL FROM finished;

-- name: record_step
-- scope: one workflow
-- Record step `seq`'s result: the checkpoint. Only while the workflow is
-- PENDING and owned by the caller's session (else its status reads NOT_OWNER),
-- and only if that position holds nothing, this step's own intent, or its own
-- RETRYING row (a result is written once, never overwritten; a step that waited
-- for retries keeps the start of its first attempt). `events`: the events a success
-- set inside the step (NULL: none), which the caller sets in the same transaction
-- (put_event). Returns whether this call wrote, the workflow's status, and the row
-- that was there before: the loser of a race adopts the recorded result.
WITH workflow AS (
    SELECT dbos_agent.write_status(%(workflow_id)s, %(owner_key)s) AS status
), written AS (
    INSERT INTO dbos_agent.steps
        (workflow_id, seq, name, status, inputs, output, error, attempts, started_at,
         events)
    SELECT %(workflow_id)s, %(seq)s, %(name)s, %(status)s, %(inputs)s::jsonb,
           %(output)s::jsonb, %(error)s::jsonb, %(attempts)s, %(started_at)s,
           %(events)s::jsonb
    WHERE (SELECT status FROM workflow) = 'PENDING'
    ON CONFLICT (workflow_id, seq) DO UPDATE
        SET status = EXCLUDED.status, output = EXCLUDED.output, error = EXCLUDED.error,
            attempts = EXCLUDED.attempts, retry = NULL, events = EXCLUDED.events,
            started_at = least(steps.started_at, EXCLUDED.started_at), finished_at = now()
        WHERE steps.status IN ('PENDING', 'RETRYING') AND steps.name = EXCLUDED.name
    RETURNING seq
)
SELECT (SELECT count(*) FROM written) = 1 AS written,
       (SELECT status FROM workflow) AS workflow_status,
       s.name, s.status, s.output::text, s.error::text, s.attempts
FROM (SELECT 1) AS one
LEFT JOIN dbos_agent.steps AS s ON s.workflow_id = %(workflow_id)s AND s.seq = %(seq)s;

-- name: record_step_intent
-- scope: one workflow
-- Before a non-idempotent step runs: durably say "about to run step `seq`
-- with these inputs". Returns whether the intent was written and whatever
-- already held the position (a concurrent run's intent or result). The same
-- intent again (a retry whose first reply was lost) counts as written.
WITH workflow AS (
    SELECT dbos_agent.write_status(%(workflow_id)s, %(owner_key)s) AS status
), written AS (
    INSERT INTO dbos_agent.steps
        (workflow_id, seq, name, status, inputs, attempts, started_at, finished_at)
    SELECT %(workflow_id)s, %(seq)s, %(name)s, 'PENDING', %(inputs)s::jsonb, 1, now(), NULL
    WHERE (SELECT status FROM workflow) = 'PENDING'
    ON CONFLICT (workflow_id, seq) DO UPDATE SET inputs = EXCLUDED.inputs
        WHERE steps.status = 'PENDING' AND steps.name = EXCLUDED.name
          AND steps.inputs = EXCLUDED.inputs
    RETURNING seq
)
SELECT (SELECT count(*) FROM written) = 1 AS written,
       (SELECT status FROM workflow) AS workflow_status,
       s.name, s.status, s.output::text, s.error::text, s.attempts
FROM (SELECT 1) AS one
LEFT JOIN dbos_agent.steps AS s ON s.workflow_id = %(workflow_id)s AND s.seq = %(seq)s;

-- name: resolve_step_intent
-- scope: one workflow
-- An operator resolves an in-doubt step by giving it the result it had.
UPDATE dbos_agent.steps
SET status = 'SUCCESS', output = %(output)s::jsonb, finished_at = now()
WHERE workflow_id = %(workflow_id)s AND seq = %(seq)s AND status = 'PENDING'
RETURNING seq;

-- name: delete_step_intent
-- scope: one workflow
-- An operator allows an in-doubt step to run again: its intent is removed
-- (a recorded result is never removed).
DELETE FROM dbos_agent.steps
WHERE workflow_id = %(workflow_id)s AND seq = %(seq)s AND status = 'PENDING'
RETURNING seq;

-- name: reopen_in_doubt_workflow
-- scope: one workflow
-- After its in-doubt step is resolved the workflow is PENDING again, owned by
-- the caller's session when it can run it (else by nobody, for recovery).
UPDATE dbos_agent.workflows
SET status = 'PENDING', error = NULL, finished_at = NULL, updated_at = now(),
    owner_key = %(owner_key)s, run_started_at = now()
WHERE workflow_id = %(workflow_id)s AND status = 'IN_DOUBT'
RETURNING name, inputs::text;

-- name: retry_step_later
-- scope: one workflow
-- An attempt of step `seq` failed with a transient error and its next attempt is
-- `delay` seconds away (database clock): the step's row becomes RETRYING (made, or
-- its intent or earlier RETRYING row updated) with the last error, the attempts so
-- far and `retry` {since, next_at, waiting_for}; `since` (its first attempt) is kept
-- from an earlier RETRYING row, else it is now minus `elapsed`. With `suspend` the
-- workflow is given up in the same statement: SUSPENDED 'retry' until next_at, owned
-- by nobody. Guarded on the workflow being PENDING and the caller's, like every log
-- write; returns, as record_step does, what held the position before, and the times.
WITH workflow AS (
    SELECT dbos_agent.write_status(%(workflow_id)s, %(owner_key)s) AS status,
           extract(epoch FROM dbos_agent.now())::float8 AS now
), planned AS (
    SELECT coalesce(
               (SELECT (s.retry ->> 'since')::float8 FROM dbos_agent.steps AS s
                WHERE s.workflow_id = %(workflow_id)s AND s.seq = %(seq)s
                  AND s.status = 'RETRYING' AND s.name = %(name)s),
               w.now - %(elapsed)s::float8) AS since,
           w.now + %(delay)s::float8 AS next_at, w.now
    FROM workflow AS w
), written AS (
    INSERT INTO dbos_agent.steps
        (workflow_id, seq, name, status, error, attempts, started_at, finished_at, retry)
    SELECT %(workflow_id)s, %(seq)s, %(name)s, 'RETRYING', %(error)s::jsonb, %(attempts)s,
           %(started_at)s, NULL,
           jsonb_build_object('since', p.since, 'next_at', p.next_at,
                              'waiting_for', %(waiting_for)s::text)
    FROM planned AS p
    WHERE (SELECT status FROM workflow) = 'PENDING'
    ON CONFLICT (workflow_id, seq) DO UPDATE
        SET status = 'RETRYING', error = EXCLUDED.error, attempts = EXCLUDED.attempts,
            retry = EXCLUDED.retry
        WHERE steps.status IN ('PENDING', 'RETRYING') AND steps.name = EXCLUDED.name
    RETURNING seq
), suspended AS (
    UPDATE dbos_agent.workflows AS w
    SET status = 'SUSPENDED', owner_key = NULL, wait_kind = 'retry', wait_target = NULL,
        wait_name = %(name)s, wake_at = to_timestamp((SELECT next_at FROM planned)),
        updated_at = now()
    WHERE %(suspend)s AND w.workflow_id = %(workflow_id)s AND w.status = 'PENDING'
      AND w.owner_key IS NOT DISTINCT FROM %(owner_key)s
      AND EXISTS (SELECT 1 FROM written)
    RETURNING w.workflow_id
)
SELECT (SELECT count(*) FROM written) = 1 AS written,
       (SELECT status FROM workflow) AS workflow_status,
       s.name, s.status, s.output::text, s.error::text, s.attempts,
       p.since, p.next_at, p.now, (SELECT count(*) FROM suspended) = 1 AS suspended
FROM planned AS p
LEFT JOIN dbos_agent.steps AS s ON s.workflow_id = %(workflow_id)s AND s.seq = %(seq)s;

-- name: reopen_step_intent
-- scope: one workflow
-- A non-idempotent step that waited for a retry is about to try again: its RETRYING
-- row becomes its intent again (PENDING, inputs kept), so that a crash during the
-- attempt leaves it in doubt as any intent. Guarded on the caller owning the
-- PENDING workflow.
UPDATE dbos_agent.steps
SET status = 'PENDING', error = NULL, retry = NULL
WHERE workflow_id = %(workflow_id)s AND seq = %(seq)s AND status = 'RETRYING'
  AND name = %(name)s
  AND dbos_agent.write_status(%(workflow_id)s, %(owner_key)s) = 'PENDING'
RETURNING seq;

-- name: retry_workflow_now
-- scope: one workflow
-- An operator's "try again now" (dbos-agent retry ID): the workflow's RETRYING steps
-- are due now, a workflow SUSPENDED for its retry wakes (any waker may take it at
-- once), and the NOTIFY on dbos_agent_retry ends the wait of a run that waits in a
-- process. Returns the workflow's status and how many steps were waiting (no row:
-- no such workflow).
WITH due AS (
    UPDATE dbos_agent.steps
    SET retry = jsonb_set(retry, '{next_at}',
                          to_jsonb(extract(epoch FROM dbos_agent.now())::float8))
    WHERE workflow_id = %(workflow_id)s AND status = 'RETRYING'
    RETURNING seq
), woken AS (
    UPDATE dbos_agent.workflows
    SET wake_at = dbos_agent.now(), updated_at = now()
    WHERE workflow_id = %(workflow_id)s AND status = 'SUSPENDED' AND wait_kind = 'retry'
    RETURNING workflow_id
), told AS (
    SELECT pg_notify('dbos_agent_retry',
                     CASE WHEN octet_length(%(workflow_id)s) < 7000
                          THEN %(workflow_id)s ELSE '' END) AS sent
    WHERE EXISTS (SELECT 1 FROM due)
)
SELECT w.status, (SELECT count(*) FROM due) AS retrying,
       (SELECT count(*) FROM told) AS told, (SELECT count(*) FROM woken) AS woken
FROM dbos_agent.workflows AS w
WHERE w.workflow_id = %(workflow_id)s;

-- name: load_steps
-- scope: one workflow
-- The whole log of one workflow, for replay: one query, not one per step. An
-- intent (PENDING) comes with its inputs: a waiting recv keeps its deadline there;
-- a RETRYING step with its retry state (migration 023).
SELECT workflow_id, seq, name, status, output::text, error::text, attempts,
       CASE WHEN status = 'PENDING' THEN inputs::text END AS inputs, retry::text
FROM dbos_agent.steps
WHERE workflow_id = %(workflow_id)s
ORDER BY seq;

-- name: load_steps_of_many
-- scope: many
-- The logs of a batch of workflows being recovered or woken, in one query (as
-- load_steps).
SELECT workflow_id, seq, name, status, output::text, error::text, attempts,
       CASE WHEN status = 'PENDING' THEN inputs::text END AS inputs, retry::text
FROM dbos_agent.steps
WHERE workflow_id = ANY(%(workflow_ids)s)
ORDER BY workflow_id, seq;

-- name: load_owned_logs
-- scope: many
-- The logs of workflows a statement just gave the caller's session (a wake, a
-- claim, a dequeue, a take-back), read after this process registered their runs:
-- only those still PENDING and the caller's (another run of this process may have
-- run one meanwhile, and suspended or finished it), each with every step, in one
-- statement so that the state and the log are one snapshot. A workflow with an
-- empty log comes back as one row without a step.
SELECT w.workflow_id, s.seq, s.name, s.status, s.output::text, s.error::text, s.attempts,
       CASE WHEN s.status = 'PENDING' THEN s.inputs::text END AS inputs, s.retry::text
FROM dbos_agent.workflows AS w
LEFT JOIN dbos_agent.steps AS s ON s.workflow_id = w.workflow_id
WHERE w.workflow_id = ANY(%(workflow_ids)s) AND w.status = 'PENDING'
  AND w.owner_key = %(owner_key)s
ORDER BY w.workflow_id, s.seq;

-- name: finish_workflow
-- scope: one workflow
-- Record a PENDING workflow's outcome. Guarded on status and owner: a
-- workflow that another session took over, finished, or that an operator
-- cancelled keeps its state, and the caller gets that state back instead.
WITH updated AS (
    UPDATE dbos_agent.workflows
    SET status = %(status)s, output = %(output)s::jsonb, error = %(error)s::jsonb,
        owner_key = NULL, updated_at = now(), finished_at = now()
    WHERE workflow_id = %(workflow_id)s AND status = 'PENDING'
      AND owner_key IS NOT DISTINCT FROM %(owner_key)s
    RETURNING status, output, error
)
SELECT true AS updated, status, output::text, error::text FROM updated
UNION ALL
SELECT false, status, output::text, error::text
FROM dbos_agent.workflows
WHERE workflow_id = %(workflow_id)s AND NOT EXISTS (SELECT 1 FROM updated);

-- name: get_workflow
-- scope: one workflow
SELECT workflow_id, name, status, inputs::text, output::text, error::text, executor_id,
       app_version, recovery_attempts, max_recovery_attempts, created_at, updated_at,
       finished_at, wait_kind, wait_target, wait_name, wake_at, run_started_at, diverged,
       priority, dequeued_at, dedup_id, forked_from, forked_from_step, parent_id,
       partition_key
FROM dbos_agent.workflows
WHERE workflow_id = %(workflow_id)s;

-- name: list_workflows
-- scope: many
-- Newest first, matching every given filter: the reads for people and tools (the
-- CLI, the web API, the Client's and a handle's, by id with the filter workflow_id).
-- storage/workflows.py puts the filters given, and only those, in place of {filters}
-- (each a fixed fragment there, joined with AND): each combination is its own
-- statement with its own plan, which walks the index of its filter (workflows_by_status,
-- workflows_by_name, workflows_by_created) instead of a generic plan for "the parameter
-- is NULL or matches" that can use none.
-- Each one found comes with what tells what it waits for (storage/waiting.py), in the
-- same snapshot and a few index probes each, never a scan: an unfinished one's first
-- step waiting for a retry (a dependency waited out, migration 023: retrying_step,
-- through the small steps_retrying index) and its last step (a recv or get_event
-- intent is a wait in progress, a sleep's output its wake-up time, a start_child's the
-- child's id), the tool of the approval such a recv waits for, whether that child is
-- finished, and a PENDING one's owner: its session, whether it is dead
-- (dead_sessions(), read once for the statement) and what tells, on the caller's host,
-- whether its process is gone (its process key, its lock free).
-- Its inputs and output only when asked (`load_input`, `load_output`): a list for a
-- table or the dashboard shows neither, and each may be megabytes.
WITH found AS (
    SELECT *
    FROM dbos_agent.workflows
    WHERE {filters}
    ORDER BY created_at DESC, workflow_id DESC
    LIMIT %(limit)s
)
SELECT w.workflow_id, w.name, w.status,
       CASE WHEN %(load_input)s THEN w.inputs::text END AS inputs,
       CASE WHEN %(load_output)s THEN w.output::text END AS output, w.error::text,
       w.executor_id, w.app_version, w.recovery_attempts, w.max_recovery_attempts,
       w.created_at, w.updated_at, w.finished_at, w.wait_kind, w.wait_target, w.wait_name,
       w.wake_at, w.run_started_at, w.diverged, w.queue_name, w.partition_key, w.priority,
       w.dequeued_at, w.dedup_id, w.forked_from, w.forked_from_step, w.parent_id, r.*,
       last.seq AS last_seq, last.name AS last_name, last.status AS last_status,
       last.inputs::text AS last_inputs, last.output::text AS last_output,
       a.tool AS approval_tool, c.status AS child_status,
       w.owner_key, e.executor_id AS owner_executor, e.hostname AS owner_host,
       e.pid AS owner_pid, e.process_key AS owner_process_key,
       w.status = 'PENDING'
           AND (e.session_key IS NULL
                OR e.session_key IN (SELECT dbos_agent.dead_sessions())) AS owner_dead,
       e.session_key IS NOT NULL
           AND e.session_key NOT IN (SELECT dbos_agent.locked_sessions()) AS owner_lock_free,
       extract(epoch FROM dbos_agent.now())::float8 AS db_now
FROM found AS w
LEFT JOIN LATERAL dbos_agent.retrying_step(w.workflow_id) AS r
    ON w.status IN ('PENDING', 'SUSPENDED')
LEFT JOIN LATERAL (
    SELECT s.seq, s.name, s.status,
           CASE WHEN s.status = 'PENDING' THEN s.inputs END AS inputs,
           CASE WHEN s.name IN ('dbos_agent.sleep', 'dbos_agent.start_child')
                THEN s.output END AS output
    FROM dbos_agent.steps AS s
    WHERE s.workflow_id = w.workflow_id AND w.status IN ('PENDING', 'SUSPENDED')
    ORDER BY s.seq DESC
    LIMIT 1
) AS last ON true
LEFT JOIN dbos_agent.approvals AS a
    ON last.name = 'dbos_agent.recv' AND a.workflow_id = w.workflow_id
   AND a.seq = CASE WHEN last.inputs ->> 'topic' ~ '^dbos_agent\.approval:[0-9]{1,9}$'
                    THEN substr(last.inputs ->> 'topic', 21)::integer END
LEFT JOIN dbos_agent.workflows AS c
    ON last.name = 'dbos_agent.start_child' AND c.workflow_id = last.output #>> '{}'
LEFT JOIN dbos_agent.executors AS e
    ON w.status = 'PENDING' AND e.session_key = w.owner_key
ORDER BY w.created_at DESC, w.workflow_id DESC;

-- name: list_workflow_ids
-- scope: many
-- The ids a bulk action given a filter acts on (see storage/filters.py for {filters}),
-- in id order: the batches then lock their rows in one order, as every bulk statement
-- does, so that two of them never wait for each other crosswise.
SELECT workflow_id FROM dbos_agent.workflows WHERE {filters} ORDER BY workflow_id;

-- name: first_finished_workflow
-- scope: many
-- Of the given workflows, the one that finished first (earliest finished_at, then
-- the earliest in the given order), or no row while none has (da.wait_first).
SELECT w.workflow_id
FROM unnest(%(workflow_ids)s::text[]) WITH ORDINALITY AS given(workflow_id, n)
JOIN dbos_agent.workflows AS w USING (workflow_id)
WHERE w.status NOT IN ('PENDING', 'ENQUEUED', 'SUSPENDED', 'DIVERGED')
ORDER BY w.finished_at NULLS LAST, given.n
LIMIT 1;

-- name: list_steps
-- scope: one workflow
SELECT workflow_id, seq, name, status, output::text, error::text, attempts, started_at,
       finished_at, inputs::text, retry::text
FROM dbos_agent.steps
WHERE workflow_id = %(workflow_id)s
ORDER BY seq;

-- name: claim_workflows
-- scope: many
-- Take over the next page of PENDING workflows whose session is dead (see
-- migrations 006, 022 and 024 for when a session counts as dead), for the caller's
-- session, counting one recovery attempt on each; a workflow that has used up its
-- attempts is dead-lettered here instead, in the same statement. When the server
-- began accepting writes (`server`, which the rules count from) is looked up once,
-- not once a session. Sessions seen
-- without their lock for the first time are stamped (lock_lost_at): their grace
-- starts now, and a later claim may take their workflows if they do not come
-- back. Without `orphans` only the caller's own executor id is looked at (a
-- restart recovering what its previous process left). SKIP LOCKED: two
-- claimers never take the same row.
-- The candidates are each dead session's first page (and that of the PENDING
-- workflows owned by nobody), read in order from workflows_pending_by_owner
-- (migration 021): the PENDING workflows of live sessions, however many, are not
-- walked. The owner is pinned by a range (>= and <=), not =, and the order names it
-- first: only that index gives the order, so the plan cannot be a walk of every
-- PENDING row in created_at order, which a planner that cannot know that the dead
-- own few would otherwise pick. The page is locked on the table, re-checking the
-- status and the owner.
WITH locked AS (
    SELECT dbos_agent.locked_sessions() AS session_key
), server AS (
    SELECT dbos_agent.server_began_at() AS began_at
), stamped AS (
    UPDATE dbos_agent.executors AS e
    SET lock_lost_at = dbos_agent.now()
    FROM server
    WHERE e.lock_lost_at IS NULL AND e.session_key NOT IN (SELECT session_key FROM locked)
      AND dbos_agent.last_seen(e.heartbeat_at, server.began_at)
          >= dbos_agent.now() - make_interval(secs => e.lease_seconds)
    RETURNING e.session_key
), dead AS (
    -- dead_sessions()'s rules (session_row_dead) on the row, the row locked (no row of
    -- `stamped`: those are not dead yet): a session that registers again meanwhile
    -- (back after a Postgres restart) either waits for this claim to commit, and then
    -- reads its workflows' new owner before its next live step, or has committed its
    -- new heartbeat first, which the re-check of the locked row sees: then it is not
    -- dead and nothing of it is claimed. Without the lock, a claim that judged it
    -- dead could commit after it had confirmed its ownership and started a step.
    SELECT e.session_key AS owner_key
    FROM dbos_agent.executors AS e, server
    WHERE dbos_agent.session_row_dead(
        e.heartbeat_at, e.lease_seconds, e.lock_lost_at, e.grace_seconds,
        e.session_key NOT IN (SELECT session_key FROM locked), server.began_at)
    FOR SHARE OF e
), candidates AS (
    (SELECT c.workflow_id, c.owner_key, c.created_at
     FROM dead AS d
     CROSS JOIN LATERAL (
         SELECT w.workflow_id, w.owner_key, w.created_at
         FROM dbos_agent.workflows AS w
         WHERE w.status = 'PENDING'
           AND w.owner_key >= d.owner_key AND w.owner_key <= d.owner_key
           AND w.owner_key IS DISTINCT FROM %(owner_key)s
           AND (%(orphans)s OR w.executor_id = %(executor_id)s)
           AND w.name = ANY(%(names)s)
           AND NOT (w.workflow_id = ANY(%(skip_ids)s))
           AND dbos_agent.may_run(w.app_version, w.accepted_versions, w.diverged_versions,
                                  %(app_version)s, %(code_version)s)
           AND (w.created_at, w.workflow_id) > (%(after_created_at)s, %(after_workflow_id)s)
         ORDER BY w.owner_key, w.created_at, w.workflow_id
         LIMIT %(limit)s
     ) AS c)
    UNION ALL
    (SELECT w.workflow_id, w.owner_key, w.created_at
     FROM dbos_agent.workflows AS w
     WHERE w.status = 'PENDING' AND w.owner_key IS NULL
       AND (%(orphans)s OR w.executor_id = %(executor_id)s)
       AND w.name = ANY(%(names)s)
       AND NOT (w.workflow_id = ANY(%(skip_ids)s))
       AND dbos_agent.may_run(w.app_version, w.accepted_versions, w.diverged_versions,
                              %(app_version)s, %(code_version)s)
       AND (w.created_at, w.workflow_id) > (%(after_created_at)s, %(after_workflow_id)s)
     ORDER BY w.owner_key, w.created_at, w.workflow_id
     LIMIT %(limit)s)
    ORDER BY created_at, workflow_id
    LIMIT %(limit)s
), page AS (
    SELECT w.workflow_id
    FROM candidates AS c
    JOIN dbos_agent.workflows AS w USING (workflow_id)
    WHERE w.status = 'PENDING' AND w.owner_key IS NOT DISTINCT FROM c.owner_key
    ORDER BY w.created_at, w.workflow_id
    LIMIT %(limit)s
    FOR UPDATE OF w SKIP LOCKED
)
UPDATE dbos_agent.workflows AS w
SET recovery_attempts = w.recovery_attempts + 1,
    executor_id = %(executor_id)s,
    run_started_at = now(),
    owner_key = CASE WHEN w.recovery_attempts + 1 > w.max_recovery_attempts
                     THEN NULL ELSE %(owner_key)s END,
    status = CASE WHEN w.recovery_attempts + 1 > w.max_recovery_attempts
                  THEN 'MAX_RECOVERY_ATTEMPTS_EXCEEDED' ELSE w.status END,
    error = CASE WHEN w.recovery_attempts + 1 > w.max_recovery_attempts
                 THEN jsonb_build_object(
                     'type', 'dbos_agent.errors.MaxRecoveryAttemptsExceededError',
                     'message', format('workflow %%s (%%s) was recovered %%s times without '
                                       'finishing; the limit is %%s',
                                       w.workflow_id, w.name, w.recovery_attempts,
                                       w.max_recovery_attempts),
                     'args', jsonb_build_array())
                 ELSE NULL END,
    updated_at = now()
FROM page
WHERE w.workflow_id = page.workflow_id
RETURNING w.workflow_id, w.name, w.status, w.inputs::text, w.created_at,
          w.recovery_attempts, w.max_recovery_attempts;

-- name: probe_orphans
-- scope: many
-- A take-over pass's one look while nothing is wrong: the sessions whose lock is
-- free and that are not yet known dead (with what tells whether their process
-- still runs, for a caller on the same host), stamping those seen free for the
-- first time (their grace starts now, as in claim_workflows), and whether any
-- workflow the caller could run waits to be taken over. An idle process pays
-- this one statement per pass; claim_workflows runs only when there is work.
-- It reads the dead sessions' PENDING workflows as claim_workflows does (see there).
WITH locked AS (
    SELECT dbos_agent.locked_sessions() AS session_key
), stamped AS (
    UPDATE dbos_agent.executors AS e
    SET lock_lost_at = dbos_agent.now()
    WHERE e.lock_lost_at IS NULL AND e.session_key NOT IN (SELECT session_key FROM locked)
    RETURNING e.session_key
)
SELECT EXISTS (
           SELECT 1
           FROM dbos_agent.dead_sessions() AS d(owner_key)
           CROSS JOIN LATERAL (
               SELECT 1
               FROM dbos_agent.workflows AS w
               WHERE w.status = 'PENDING'
                 AND w.owner_key >= d.owner_key AND w.owner_key <= d.owner_key
                 AND w.owner_key IS DISTINCT FROM %(owner_key)s
                 AND w.name = ANY(%(names)s)
                 AND dbos_agent.may_run(w.app_version, w.accepted_versions,
                                        w.diverged_versions, %(app_version)s,
                                        %(code_version)s)
               ORDER BY w.owner_key, w.created_at, w.workflow_id
               LIMIT 1
           ) AS found
       ) OR EXISTS (
           SELECT 1
           FROM dbos_agent.workflows AS w
           WHERE w.status = 'PENDING' AND w.owner_key IS NULL
             AND w.name = ANY(%(names)s)
             AND dbos_agent.may_run(w.app_version, w.accepted_versions, w.diverged_versions,
                                    %(app_version)s, %(code_version)s)
           ORDER BY w.owner_key, w.created_at, w.workflow_id
           LIMIT 1
       ) OR EXISTS (
           SELECT 1
           FROM dbos_agent.workflows AS w
           WHERE w.status = 'DIVERGED' AND w.name = ANY(%(names)s)
             AND dbos_agent.may_run(w.app_version, w.accepted_versions, w.diverged_versions,
                                    %(app_version)s, %(code_version)s)
       ) AS claimable,
       coalesce((SELECT json_agg(json_build_object('session_key', e.session_key,
                                                   'pid', e.pid,
                                                   'process_key', e.process_key))
                 FROM dbos_agent.executors AS e
                 WHERE e.heartbeat_at > '-infinity'
                   AND (e.lease_only OR e.session_key NOT IN (SELECT session_key FROM locked))),
                '[]'::json) AS unlocked;

-- name: claim_diverged_workflows
-- scope: many
-- Take the next page of DIVERGED workflows this process's code may fit (its code
-- version is not among those that diverged on them, see may_run) for the caller's
-- session: each becomes PENDING and the caller's, and is run from its log. Not a
-- recovery: no attempt is counted. Without `orphans` only the caller's executor
-- id. SKIP LOCKED: two claimers never take the same row.
WITH page AS (
    SELECT w.workflow_id
    FROM dbos_agent.workflows AS w
    WHERE w.status = 'DIVERGED'
      AND (%(orphans)s OR w.executor_id = %(executor_id)s)
      AND w.name = ANY(%(names)s)
      AND dbos_agent.may_run(w.app_version, w.accepted_versions, w.diverged_versions,
                             %(app_version)s, %(code_version)s)
    ORDER BY w.created_at, w.workflow_id
    LIMIT %(limit)s
    FOR UPDATE OF w SKIP LOCKED
)
UPDATE dbos_agent.workflows AS w
SET status = 'PENDING', owner_key = %(owner_key)s, executor_id = %(executor_id)s,
    run_started_at = now(), updated_at = now()
FROM page
WHERE w.workflow_id = page.workflow_id
RETURNING w.workflow_id, w.name, w.inputs::text;

-- name: take_diverged_workflow
-- scope: one workflow
-- A direct call of a DIVERGED workflow this process's code may fit: the caller's
-- session takes it (compare-and-set on the status) and runs it from its log.
UPDATE dbos_agent.workflows AS w
SET status = 'PENDING', owner_key = %(owner_key)s, executor_id = %(executor_id)s,
    run_started_at = now(), updated_at = now()
WHERE w.workflow_id = %(workflow_id)s AND w.status = 'DIVERGED'
  AND dbos_agent.may_run(w.app_version, w.accepted_versions, w.diverged_versions,
                         %(app_version)s, %(code_version)s)
RETURNING w.workflow_id;

-- name: hold_diverged_workflow
-- scope: one workflow
-- The run's code called another step than the log recorded at a position (a code
-- change, see WorkflowDivergedError): the workflow is held DIVERGED, unfinished and
-- owned by nobody, saying where and how (`detail`), and the caller's code version
-- joins those that leave it alone. Guarded on status and owner like every write.
-- Returns whether that code version is new to it (its warning is logged once per
-- workflow and version); no row when the run no longer owned it.
WITH before AS (
    SELECT workflow_id,
           coalesce(%(code_version)s = ANY(diverged_versions), false) AS known
    FROM dbos_agent.workflows
    WHERE workflow_id = %(workflow_id)s AND status = 'PENDING'
      AND owner_key = %(owner_key)s
    FOR UPDATE
)
UPDATE dbos_agent.workflows AS w
SET status = 'DIVERGED', owner_key = NULL, diverged = %(detail)s::jsonb,
    diverged_versions = CASE WHEN before.known THEN w.diverged_versions
                             ELSE array_append(w.diverged_versions, %(code_version)s) END,
    updated_at = now()
FROM before
WHERE w.workflow_id = before.workflow_id
RETURNING NOT before.known AS first_time;

-- name: count_claimable_soon
-- scope: many
-- PENDING workflows of this executor id (other than the caller's) whose session
-- lost its lock but is still within its grace: a restart waits for them a little.
SELECT count(*)
FROM dbos_agent.workflows AS w
JOIN dbos_agent.executors AS e ON e.session_key = w.owner_key
WHERE w.status = 'PENDING' AND w.executor_id = %(executor_id)s
  AND w.owner_key <> %(owner_key)s
  AND w.name = ANY(%(names)s)
  AND e.lock_lost_at IS NOT NULL
  AND e.session_key NOT IN (SELECT dbos_agent.locked_sessions())
  AND e.session_key NOT IN (SELECT dbos_agent.dead_sessions());

-- name: list_owned_idle
-- scope: many
-- PENDING workflows this session owns but does not run (a run cut off by an
-- outage, a claim whose reply was lost): it takes them back.
SELECT workflow_id, name, inputs::text
FROM dbos_agent.workflows
WHERE status = 'PENDING' AND owner_key = %(owner_key)s
  AND NOT (workflow_id = ANY(%(skip_ids)s))
ORDER BY created_at, workflow_id
LIMIT %(limit)s;

-- name: get_workflow_owner
-- scope: one workflow
-- Who may run a workflow now: a run checks this before its next live step
-- whenever its session's fence lapsed (see storage/session.py).
SELECT status, owner_key FROM dbos_agent.workflows WHERE workflow_id = %(workflow_id)s;

-- name: take_over_workflow
-- scope: one workflow
-- A direct call of a PENDING workflow whose session is not certainly alive:
-- the caller's session takes it over (compare-and-set on the old owner). A session
-- that still has its row is judged dead on that row, locked (see claim_workflows:
-- one registering again meanwhile is either seen alive or reads the new owner).
UPDATE dbos_agent.workflows AS w
SET run_started_at = now(),
    owner_key = %(owner_key)s, executor_id = %(executor_id)s,
    recovery_attempts = w.recovery_attempts + 1, updated_at = now()
WHERE w.workflow_id = %(workflow_id)s AND w.status = 'PENDING'
  AND w.owner_key IS NOT DISTINCT FROM %(old_owner_key)s
  AND (w.owner_key IS NULL
       OR NOT EXISTS (SELECT 1 FROM dbos_agent.executors WHERE session_key = w.owner_key)
       OR EXISTS (
           SELECT 1 FROM dbos_agent.executors AS e
           WHERE e.session_key = w.owner_key
             AND dbos_agent.session_row_dead(
                 e.heartbeat_at, e.lease_seconds, e.lock_lost_at, e.grace_seconds,
                 e.session_key NOT IN (SELECT dbos_agent.locked_sessions()))
           FOR SHARE OF e))
RETURNING w.workflow_id;

-- name: count_unrecoverable_pending
-- scope: many
-- PENDING workflows of this executor whose function this process does not
-- know (renamed, deleted, or not imported): left alone, reported by name.
SELECT name, count(*) AS pending
FROM dbos_agent.workflows
WHERE status = 'PENDING'
  AND executor_id = %(executor_id)s
  AND dbos_agent.session_is_dead(owner_key)
  AND NOT (name = ANY(%(names)s))
GROUP BY name
ORDER BY name;

-- == suspension ==

-- name: suspend_workflow
-- scope: a family
-- A background run whose wait cannot be met now gives its workflow up: it
-- becomes SUSPENDED, owned by no session, with what would wake it (see
-- migration 008). Guarded on status and owner like every write, and on the
-- wait itself: if it can be met already (the message arrived, the event was
-- published, the time has come between the run's check and this statement)
-- nothing changes and the run goes on waiting in memory. Returns a row only
-- when it suspended the workflow.
UPDATE dbos_agent.workflows AS w
SET status = 'SUSPENDED', owner_key = NULL, wait_kind = %(wait_kind)s,
    wait_target = %(wait_target)s, wait_name = %(wait_name)s, wake_at = %(wake_at)s,
    updated_at = now()
WHERE w.workflow_id = %(workflow_id)s AND w.status = 'PENDING'
  AND w.owner_key IS NOT DISTINCT FROM %(owner_key)s
  AND NOT (
      coalesce(%(wake_at)s::timestamptz <= dbos_agent.now(), false)
      OR (%(wait_kind)s = 'recv' AND EXISTS (
          SELECT 1 FROM dbos_agent.messages AS m
          WHERE m.destination_id = %(wait_target)s AND m.topic = %(wait_name)s
            AND m.consumed_seq IS NULL))
      OR (%(wait_kind)s = 'event' AND EXISTS (
          SELECT 1 FROM dbos_agent.events AS e
          WHERE e.workflow_id = %(wait_target)s AND e.key = %(wait_name)s))
      OR (%(wait_kind)s = 'child' AND EXISTS (
          SELECT 1 FROM dbos_agent.workflows AS c
          WHERE c.workflow_id = %(wait_target)s
            AND c.status NOT IN ('PENDING', 'ENQUEUED', 'SUSPENDED', 'DIVERGED')))
  )
RETURNING w.workflow_id;

-- name: wake_notified
-- scope: many
-- Wake the SUSPENDED workflows waiting on `targets` (the payloads of NOTIFYs: a
-- message's destination, an event's publisher, a finished workflow; or what the
-- sweep's list_wake_targets found) whose wait can be met now: an unconsumed
-- message on the awaited topic, the published event, the finished workflow, or a
-- due time.
-- Each becomes PENDING and owned by the caller's session, which runs it from its
-- log; the caller must know its function (`names`) and run its application
-- version. Waking is not a recovery: no attempt is counted. SKIP LOCKED: two
-- wakers never take the same workflow.
-- A workflow woken for a message also receives it here, as receive_message would:
-- the oldest unconsumed message on its topic becomes the result of the recv it
-- waits in (its PENDING intent) and is consumed, in this statement, so the run
-- replays that recv instead of asking again. (Anything not received here, the
-- run receives itself.)
WITH ready AS (
    SELECT m.destination_id AS workflow_id
    FROM dbos_agent.messages AS m
    JOIN dbos_agent.workflows AS w
      ON w.workflow_id = m.destination_id AND w.wait_name = m.topic
    WHERE m.destination_id = ANY(%(targets)s::text[]) AND m.consumed_seq IS NULL
      AND w.status = 'SUSPENDED' AND w.wait_kind = 'recv'
    UNION
    SELECT w.workflow_id
    FROM dbos_agent.workflows AS w
    JOIN dbos_agent.events AS e ON e.workflow_id = w.wait_target AND e.key = w.wait_name
    WHERE w.status = 'SUSPENDED' AND w.wait_kind = 'event'
      AND w.wait_target = ANY(%(targets)s::text[])
    UNION
    SELECT w.workflow_id
    FROM dbos_agent.workflows AS w
    JOIN dbos_agent.workflows AS c ON c.workflow_id = w.wait_target
    WHERE w.status = 'SUSPENDED' AND w.wait_kind = 'child'
      AND w.wait_target = ANY(%(targets)s::text[])
      AND c.status NOT IN ('PENDING', 'ENQUEUED', 'SUSPENDED', 'DIVERGED')
    UNION
    SELECT w.workflow_id
    FROM dbos_agent.workflows AS w
    WHERE w.workflow_id = ANY(%(targets)s::text[]) AND w.status = 'SUSPENDED'
      AND w.wake_at <= dbos_agent.now()
), page AS (
    SELECT w.workflow_id, w.wait_kind, w.wait_name
    FROM dbos_agent.workflows AS w
    JOIN ready USING (workflow_id)
    WHERE w.status = 'SUSPENDED'
      AND w.name = ANY(%(names)s)
      AND dbos_agent.may_run(w.app_version, w.accepted_versions, w.diverged_versions,
                             %(app_version)s, %(code_version)s)
    LIMIT %(limit)s
    FOR UPDATE OF w SKIP LOCKED
), woken AS (
    UPDATE dbos_agent.workflows AS w
    SET run_started_at = now(),
        status = 'PENDING', owner_key = %(owner_key)s, executor_id = %(executor_id)s,
        wait_kind = NULL, wait_target = NULL, wait_name = NULL, wake_at = NULL,
        updated_at = now()
    FROM page
    WHERE w.workflow_id = page.workflow_id
    RETURNING w.workflow_id, w.name, w.inputs, page.wait_kind, page.wait_name
), delivery AS (
    SELECT k.workflow_id, s.seq, m.message_id, m.message
    FROM woken AS k
    CROSS JOIN LATERAL (
        SELECT seq FROM dbos_agent.steps
        WHERE workflow_id = k.workflow_id AND status = 'PENDING' AND name = 'dbos_agent.recv'
        ORDER BY seq DESC
        LIMIT 1
    ) AS s
    CROSS JOIN LATERAL (
        SELECT message_id, message FROM dbos_agent.messages
        WHERE destination_id = k.workflow_id AND topic = k.wait_name AND consumed_seq IS NULL
        ORDER BY message_id
        LIMIT 1
        FOR UPDATE SKIP LOCKED
    ) AS m
    WHERE k.wait_kind = 'recv'
), received AS (
    UPDATE dbos_agent.steps AS s
    SET status = 'SUCCESS', output = d.message, finished_at = now()
    FROM delivery AS d
    WHERE s.workflow_id = d.workflow_id AND s.seq = d.seq AND s.status = 'PENDING'
    RETURNING s.workflow_id, s.seq
), consumed AS (
    UPDATE dbos_agent.messages AS m
    SET consumed_seq = r.seq, consumed_at = now()
    FROM received AS r
    JOIN delivery AS d USING (workflow_id)
    WHERE m.destination_id = d.workflow_id AND m.message_id = d.message_id
    RETURNING m.message_id
)
SELECT workflow_id, name, inputs::text FROM woken;

-- name: list_wake_targets
-- scope: many
-- The sweep: what can wake SUSPENDED workflows the caller could run, whatever woke
-- them (a due timer, a message or an event whose NOTIFY was lost or went to a
-- process that could not wake it), named as NOTIFY payloads name it: a timer's or
-- a recv's own workflow, an event's publisher, an awaited child. wake_notified
-- then wakes what waits on them. Each branch stops at a page, so a backlog of
-- messages costs a page, not a scan; `runnable` is inlined into each branch (NOT
-- MATERIALIZED), so every branch filters before its page is cut.
WITH runnable AS NOT MATERIALIZED (
    SELECT workflow_id, wait_kind, wait_target, wait_name, wake_at
    FROM dbos_agent.workflows
    WHERE status = 'SUSPENDED' AND name = ANY(%(names)s)
      AND dbos_agent.may_run(app_version, accepted_versions, diverged_versions,
                             %(app_version)s, %(code_version)s)
)
(SELECT w.workflow_id AS target
 FROM runnable AS w
 WHERE w.wake_at <= dbos_agent.now()
 ORDER BY w.wake_at
 LIMIT %(limit)s)
UNION
(SELECT m.destination_id
 FROM dbos_agent.messages AS m
 JOIN runnable AS w ON w.workflow_id = m.destination_id AND w.wait_name = m.topic
 WHERE m.consumed_seq IS NULL AND w.wait_kind = 'recv'
 LIMIT %(limit)s)
UNION
(SELECT w.wait_target
 FROM runnable AS w
 JOIN dbos_agent.events AS e ON e.workflow_id = w.wait_target AND e.key = w.wait_name
 WHERE w.wait_kind = 'event'
 LIMIT %(limit)s)
UNION
(SELECT w.wait_target
 FROM runnable AS w
 JOIN dbos_agent.workflows AS c ON c.workflow_id = w.wait_target
 WHERE w.wait_kind = 'child' AND c.status NOT IN ('PENDING', 'ENQUEUED', 'SUSPENDED', 'DIVERGED')
 LIMIT %(limit)s);

-- name: next_wake_at
-- scope: many
-- When the earliest timer of a SUSPENDED workflow the caller could wake is due
-- (NULL: none), in seconds from now on the database clock: a waker sleeps
-- until then.
SELECT extract(epoch FROM min(wake_at) - dbos_agent.now())::float8 AS seconds
FROM dbos_agent.workflows
WHERE status = 'SUSPENDED' AND name = ANY(%(names)s)
  AND dbos_agent.may_run(app_version, accepted_versions, diverged_versions,
                         %(app_version)s, %(code_version)s);

-- == executors ==

-- name: next_session_key
-- scope: many
SELECT nextval('dbos_agent.session_keys')::integer AS session_key;

-- name: register_executor
-- scope: many
-- A new session, or its own key taken back after a reconnect (the lock is held
-- by then): the lease starts over and the lock is no longer missing.
INSERT INTO dbos_agent.executors
    (session_key, executor_id, app_version, code_version, hostname, pid, process_key,
     lease_seconds, grace_seconds, heartbeat_at, queues, lease_only)
VALUES (%(session_key)s, %(executor_id)s, %(app_version)s, %(code_version)s, %(hostname)s,
        %(pid)s, %(process_key)s, %(lease_seconds)s, %(grace_seconds)s, dbos_agent.now(),
        %(queues)s::text[], %(lease_only)s)
ON CONFLICT (session_key) DO UPDATE
    SET executor_id = EXCLUDED.executor_id, app_version = EXCLUDED.app_version,
        code_version = EXCLUDED.code_version, hostname = EXCLUDED.hostname, pid = EXCLUDED.pid, process_key = EXCLUDED.process_key,
        lease_seconds = EXCLUDED.lease_seconds, grace_seconds = EXCLUDED.grace_seconds,
        heartbeat_at = dbos_agent.now(), lock_lost_at = NULL, queues = EXCLUDED.queues,
        lease_only = EXCLUDED.lease_only;

-- name: heartbeat_executor
-- scope: many
-- Renew the lease (on the connection that holds the lock), and say again which
-- queues the session serves. Returns whether the
-- session could have been declared dead before this renewal: then its
-- workflows may have been taken over, and each run must check before going on.
-- No row: the session was forgotten (it looked dead) and must register again.
WITH before AS (
    SELECT session_key,
           coalesce(dbos_agent.session_row_dead(
               heartbeat_at, lease_seconds, lock_lost_at, grace_seconds, true), false)
           AS was_dead
    FROM dbos_agent.executors
    WHERE session_key = %(session_key)s
    FOR UPDATE
)
UPDATE dbos_agent.executors AS e
SET heartbeat_at = dbos_agent.now(), lock_lost_at = NULL, queues = %(queues)s::text[]
FROM before
WHERE e.session_key = before.session_key
RETURNING before.was_dead;

-- name: forget_idle_executor
-- scope: many
-- A clean exit that owns nothing: the row goes.
DELETE FROM dbos_agent.executors AS e
WHERE e.session_key = %(session_key)s
  AND NOT EXISTS (SELECT 1 FROM dbos_agent.workflows AS w
                  WHERE w.status = 'PENDING' AND w.owner_key = e.session_key);

-- name: end_executor
-- scope: many
-- A clean exit that leaves PENDING workflows: the session is dead at once, so
-- they are claimable without waiting for its lease.
UPDATE dbos_agent.executors SET heartbeat_at = '-infinity'
WHERE session_key = %(session_key)s;

-- name: list_unlocked_sessions
-- scope: many
-- Sessions without their lock (or without any: lease_only) and not yet known dead,
-- with what tells whether their process still runs (when it ran on the caller's host).
SELECT session_key, pid, process_key
FROM dbos_agent.executors
WHERE heartbeat_at > '-infinity'
  AND (lease_only OR session_key NOT IN (SELECT dbos_agent.locked_sessions()));

-- name: end_dead_session
-- scope: many
-- The caller saw that a session's process is gone (same host, pid not running):
-- the session is dead at once. Guarded on the lock still being free (a lease_only
-- session holds none).
UPDATE dbos_agent.executors SET heartbeat_at = '-infinity'
WHERE session_key = %(session_key)s AND process_key = %(process_key)s
  AND (lease_only OR session_key NOT IN (SELECT dbos_agent.locked_sessions()))
RETURNING session_key;

-- name: delete_dead_executors
-- scope: many
-- Forget dead sessions that own nothing any more. A PENDING workflow whose
-- owner has no row at all (deleted by hand) gets a dead one back, so that it
-- can be claimed.
WITH restored AS (
    INSERT INTO dbos_agent.executors
        (session_key, executor_id, hostname, pid, lease_seconds, heartbeat_at)
    SELECT DISTINCT ON (w.owner_key) w.owner_key, w.executor_id, 'unknown', 0, 1, '-infinity'
    FROM dbos_agent.workflows AS w
    WHERE w.status = 'PENDING' AND w.owner_key IS NOT NULL
      AND NOT EXISTS (SELECT 1 FROM dbos_agent.executors AS e
                      WHERE e.session_key = w.owner_key)
    ON CONFLICT (session_key) DO NOTHING
    RETURNING session_key
)
DELETE FROM dbos_agent.executors AS e
WHERE e.session_key IN (SELECT dbos_agent.dead_sessions())
  AND NOT EXISTS (SELECT 1 FROM dbos_agent.workflows AS w
                  WHERE w.status = 'PENDING' AND w.owner_key = e.session_key);

-- == queues ==

-- name: lock_queue
-- scope: many
-- Serialises dequeues of one queue for the rest of the transaction, so the
-- limits below are counted and applied atomically across all workers (the
-- lock class: storage/locks.py).
SELECT pg_advisory_xact_lock(%(lock_class)s, hashtext(%(queue_name)s));

-- name: dequeue_workflows
-- scope: many
-- Hand the caller's session as many ENQUEUED workflows of a queue as every
-- limit allows: global concurrency (PENDING across all sessions, SUSPENDED ones
-- waiting for a step's retry, since a queue often bounds the load on the very
-- dependency they wait for, and any SUSPENDED ones when the queue counts them), this
-- worker's concurrency, the rate limit
-- (dequeues within the period), the caller's free slots, and, for a queue
-- shared fairly, the caller's share of the global limit among the live sessions
-- serving the queue. Highest priority (lowest number) first, then oldest; a delayed
-- one not before its wake_at.
WITH servers AS (
    SELECT GREATEST(1, count(*)) AS n
    FROM dbos_agent.executors AS e
    WHERE %(queue_name)s = ANY(e.queues)
      AND e.session_key NOT IN (SELECT dbos_agent.dead_sessions())
), in_flight AS (
    SELECT count(*) AS total,
           count(*) FILTER (WHERE owner_key = %(owner_key)s) AS mine
    FROM dbos_agent.workflows
    WHERE queue_name = %(queue_name)s
      AND (status = 'PENDING'
           OR (status = 'SUSPENDED' AND (wait_kind = 'retry' OR %(count_suspended)s)))
), recent AS (
    SELECT count(*) AS started
    FROM dbos_agent.workflows
    WHERE queue_name = %(queue_name)s
      AND dequeued_at > dbos_agent.now() - make_interval(secs => %(rate_period)s)
), room AS (
    SELECT GREATEST(0, LEAST(
               %(free_slots)s,
               COALESCE(%(concurrency)s - in_flight.total, %(free_slots)s),
               COALESCE(%(worker_concurrency)s - in_flight.mine, %(free_slots)s),
               COALESCE(%(rate_limit)s - recent.started, %(free_slots)s),
               CASE WHEN %(fair)s
                    THEN ceil(%(concurrency)s::float8 / servers.n)::int - in_flight.mine
               END)) AS n
    FROM in_flight, recent, servers
), picked AS (
    SELECT w.workflow_id
    FROM dbos_agent.workflows AS w
    WHERE w.queue_name = %(queue_name)s AND w.status = 'ENQUEUED'
      AND (w.wake_at IS NULL OR w.wake_at <= dbos_agent.now())
      AND w.name = ANY(%(names)s)
      AND dbos_agent.may_run(w.app_version, w.accepted_versions, w.diverged_versions,
                             %(app_version)s, %(code_version)s)
    ORDER BY w.priority, w.created_at, w.workflow_id
    LIMIT (SELECT n FROM room)
    FOR UPDATE OF w SKIP LOCKED
)
UPDATE dbos_agent.workflows AS w
SET run_started_at = now(),
    status = 'PENDING', owner_key = %(owner_key)s, executor_id = %(executor_id)s,
    dequeued_at = dbos_agent.now(), wake_at = NULL, updated_at = now()
FROM picked
WHERE w.workflow_id = picked.workflow_id
RETURNING w.workflow_id, w.name, w.inputs::text;

-- name: dequeue_partitioned_workflows
-- scope: many
-- dequeue_workflows for a partitioned queue (migration 028): every limit (global
-- concurrency, this worker's, the rate limit, the fair share) is counted and applied per
-- partition; only the caller's free slots are shared. Fair among the partitions: the
-- ones with waiting workflows are walked on workflows_enqueued_by_partition (one probe
-- per partition, however long a partition's backlog), each offers its first workflows
-- (priority, then oldest) up to its own room, and the first of every partition goes
-- before the second of any; within a turn, the partition served least recently first
-- (its latest dequeued_at, on workflows_dequeued_by_partition). The picked rows are
-- locked SKIP LOCKED and re-checked ENQUEUED before they change.
WITH RECURSIVE parts AS (
    (SELECT w.partition_key AS pk
     FROM dbos_agent.workflows AS w
     WHERE w.queue_name = %(queue_name)s AND w.status = 'ENQUEUED'
       AND w.partition_key IS NOT NULL
     ORDER BY w.partition_key
     LIMIT 1)
    UNION ALL
    SELECT (SELECT w.partition_key
            FROM dbos_agent.workflows AS w
            WHERE w.queue_name = %(queue_name)s AND w.status = 'ENQUEUED'
              AND w.partition_key IS NOT NULL AND w.partition_key > parts.pk
            ORDER BY w.partition_key
            LIMIT 1)
    FROM parts
    WHERE parts.pk IS NOT NULL
), servers AS (
    SELECT GREATEST(1, count(*)) AS n
    FROM dbos_agent.executors AS e
    WHERE %(queue_name)s = ANY(e.queues)
      AND e.session_key NOT IN (SELECT dbos_agent.dead_sessions())
), in_flight AS (
    SELECT partition_key AS pk, count(*) AS total,
           count(*) FILTER (WHERE owner_key = %(owner_key)s) AS mine
    FROM dbos_agent.workflows
    WHERE queue_name = %(queue_name)s AND partition_key IS NOT NULL
      AND (status = 'PENDING'
           OR (status = 'SUSPENDED' AND (wait_kind = 'retry' OR %(count_suspended)s)))
    GROUP BY partition_key
), room AS (
    SELECT p.pk,
           (SELECT max(d.dequeued_at)
            FROM dbos_agent.workflows AS d
            WHERE d.queue_name = %(queue_name)s AND d.partition_key = p.pk
              AND d.dequeued_at IS NOT NULL) AS last_served,
           GREATEST(0, LEAST(
               %(free_slots)s,
               COALESCE(%(concurrency)s - COALESCE(f.total, 0), %(free_slots)s),
               COALESCE(%(worker_concurrency)s - COALESCE(f.mine, 0), %(free_slots)s),
               CASE WHEN %(rate_limit)s::int IS NOT NULL
                    THEN %(rate_limit)s - (
                        SELECT count(*)
                        FROM dbos_agent.workflows AS d
                        WHERE d.queue_name = %(queue_name)s AND d.partition_key = p.pk
                          AND d.dequeued_at > dbos_agent.now()
                                              - make_interval(secs => %(rate_period)s))
               END,
               CASE WHEN %(fair)s
                    THEN ceil(%(concurrency)s::float8 / servers.n)::int - COALESCE(f.mine, 0)
               END)) AS n
    FROM parts AS p
    CROSS JOIN servers
    LEFT JOIN in_flight AS f ON f.pk = p.pk
    WHERE p.pk IS NOT NULL
), offered AS (
    SELECT c.workflow_id, c.turn, r.last_served, r.pk
    FROM room AS r
    CROSS JOIN LATERAL (
        SELECT w.workflow_id,
               row_number() OVER (ORDER BY w.priority, w.created_at, w.workflow_id) AS turn
        FROM dbos_agent.workflows AS w
        WHERE w.queue_name = %(queue_name)s AND w.partition_key = r.pk
          AND w.status = 'ENQUEUED'
          AND (w.wake_at IS NULL OR w.wake_at <= dbos_agent.now())
          AND w.name = ANY(%(names)s)
          AND dbos_agent.may_run(w.app_version, w.accepted_versions, w.diverged_versions,
                                 %(app_version)s, %(code_version)s)
        ORDER BY w.priority, w.created_at, w.workflow_id
        LIMIT r.n
    ) AS c
    WHERE r.n > 0
), picked AS (
    SELECT w.workflow_id
    FROM dbos_agent.workflows AS w
    JOIN (SELECT workflow_id
          FROM offered
          ORDER BY turn, last_served NULLS FIRST, pk
          LIMIT %(free_slots)s) AS o USING (workflow_id)
    WHERE w.status = 'ENQUEUED'
    FOR UPDATE OF w SKIP LOCKED
)
UPDATE dbos_agent.workflows AS w
SET run_started_at = now(),
    status = 'PENDING', owner_key = %(owner_key)s, executor_id = %(executor_id)s,
    dequeued_at = dbos_agent.now(), wake_at = NULL, updated_at = now()
FROM picked
WHERE w.workflow_id = picked.workflow_id
RETURNING w.workflow_id, w.name, w.inputs::text;

-- name: register_queues
-- scope: many
-- Record the queues this process defines in code (one JSON array of rows): a new one is
-- inserted, one still the code's (source 'code') takes this code's values, one an
-- operator set keeps the operator's.
INSERT INTO dbos_agent.queues AS q
    (name, concurrency, worker_concurrency, rate_limit, rate_period, count_suspended,
     fair_share, partitioned)
SELECT r.name, r.concurrency, r.worker_concurrency, r.rate_limit, r.rate_period,
       r.count_suspended, r.fair_share, r.partitioned
FROM json_to_recordset(%(rows)s::json)
     AS r(name text, concurrency integer, worker_concurrency integer, rate_limit integer,
          rate_period float8, count_suspended boolean, fair_share boolean, partitioned boolean)
ON CONFLICT (name) DO UPDATE
SET concurrency = EXCLUDED.concurrency, worker_concurrency = EXCLUDED.worker_concurrency,
    rate_limit = EXCLUDED.rate_limit, rate_period = EXCLUDED.rate_period,
    count_suspended = EXCLUDED.count_suspended, fair_share = EXCLUDED.fair_share,
    partitioned = EXCLUDED.partitioned, updated_at = now()
WHERE q.source = 'code'
  AND (q.concurrency, q.worker_concurrency, q.rate_limit, q.rate_period, q.count_suspended,
       q.fair_share, q.partitioned)
      IS DISTINCT FROM
      (EXCLUDED.concurrency, EXCLUDED.worker_concurrency, EXCLUDED.rate_limit,
       EXCLUDED.rate_period, EXCLUDED.count_suspended, EXCLUDED.fair_share,
       EXCLUDED.partitioned);

-- name: list_queues
-- scope: many
-- Every recorded queue, or with `name` only that one (what Client.enqueue checks a
-- partition key against).
SELECT name, concurrency, worker_concurrency, rate_limit, rate_period, count_suspended,
       fair_share, partitioned, source, updated_at
FROM dbos_agent.queues
WHERE %(name)s::text IS NULL OR name = %(name)s
ORDER BY name;

-- name: set_queue
-- scope: many
-- An operator's change of a queue's limits (only the fields flagged given change; a
-- queue not recorded yet is created with them): the queue becomes the operator's, whose
-- values win over the code's (register_queues leaves it alone). With reset, the queue
-- goes back to its code: the next launch (or process refresh) records the code's values.
INSERT INTO dbos_agent.queues AS q
    (name, concurrency, worker_concurrency, rate_limit, rate_period, source)
VALUES (%(name)s, %(concurrency)s, %(worker_concurrency)s, %(rate_limit)s, %(rate_period)s,
        CASE WHEN %(reset)s THEN 'code' ELSE 'operator' END)
ON CONFLICT (name) DO UPDATE
SET concurrency = CASE WHEN %(set_concurrency)s THEN EXCLUDED.concurrency
                       ELSE q.concurrency END,
    worker_concurrency = CASE WHEN %(set_worker_concurrency)s
                              THEN EXCLUDED.worker_concurrency
                              ELSE q.worker_concurrency END,
    rate_limit = CASE WHEN %(set_rate_limit)s THEN EXCLUDED.rate_limit ELSE q.rate_limit END,
    rate_period = CASE WHEN %(set_rate_limit)s THEN EXCLUDED.rate_period
                       ELSE q.rate_period END,
    source = EXCLUDED.source, updated_at = now()
RETURNING name, concurrency, worker_concurrency, rate_limit, rate_period, count_suspended,
          fair_share, partitioned, source, updated_at;

-- == operator actions ==
-- Cancel, resume, fork and inspect, for dbos_agent.engine.operations and the
-- CLI. Each action is one statement (one transaction): the status check and
-- the change cannot be separated by a concurrent run or another operator.
-- A workflow made PENDING here is owned by the caller's session when the
-- caller runs it at once (owner_key), else by nobody: its executor's next
-- recovery, or any worker daemon, claims it.

-- name: cancel_overdue_workflows
-- scope: many
-- Cancel a page of unfinished workflows past their deadline, with every
-- unfinished workflow they started (and theirs), as cancel_workflows does; rows
-- another caller is cancelling are skipped. Returns the ids cancelled.
WITH RECURSIVE overdue AS (
    SELECT workflow_id
    FROM dbos_agent.workflows
    WHERE deadline_at <= dbos_agent.now() AND deadline_at IS NOT NULL
      AND status IN ('PENDING', 'SUSPENDED', 'ENQUEUED', 'DIVERGED')
    ORDER BY deadline_at
    LIMIT %(limit)s
    FOR UPDATE SKIP LOCKED
), tree AS (
    SELECT workflow_id, workflow_id AS root, 0 AS depth FROM overdue
    UNION
    SELECT c.workflow_id, t.root, t.depth + 1
    FROM dbos_agent.workflows AS c
    JOIN tree AS t ON c.parent_id = t.workflow_id
    WHERE t.depth < 1000
), target AS (
    SELECT DISTINCT ON (workflow_id) workflow_id, root
    FROM tree
    ORDER BY workflow_id, depth
)
UPDATE dbos_agent.workflows AS w
SET status = 'CANCELLED', output = NULL, owner_key = NULL,
    wait_kind = NULL, wait_target = NULL, wait_name = NULL, wake_at = NULL,
    error = CASE WHEN w.workflow_id = target.root THEN jsonb_build_object(
                'type', 'dbos_agent.errors.WorkflowTimeoutError',
                'message', format('workflow %%s passed its deadline (%%s) and was cancelled',
                                  w.workflow_id, w.deadline_at),
                'args', jsonb_build_array())
            ELSE jsonb_build_object(
                'type', 'dbos_agent.errors.WorkflowCancelledError',
                'message', format('workflow %%s was cancelled with %%s, which started it '
                                  'and passed its deadline', w.workflow_id, target.root),
                'args', jsonb_build_array()) END,
    updated_at = now(), finished_at = now()
FROM target
WHERE w.workflow_id = target.workflow_id
  AND w.status IN ('PENDING', 'SUSPENDED', 'ENQUEUED', 'DIVERGED')
RETURNING w.workflow_id, pg_notify('dbos_agent_cancel', w.workflow_id);

-- name: resume_workflow
-- scope: one workflow
-- Make a CANCELLED or dead-lettered workflow (or an IN_DOUBT one whose intents
-- are all resolved, or a DIVERGED one) PENDING again, so that it continues from
-- its log. A dead letter gets its recovery attempts back; a diverged one forgets
-- which code versions diverged on it, so that every process may try it again (a
-- fix whose code version the digest did not change, see registry.code_version). A NULL executor_id keeps its
-- executor. A queued workflow that never left its queue goes back to it
-- (ENQUEUED, owned by nobody), so that the queue's limits still hold. An ENQUEUED
-- workflow, or one whose delayed start has not come (SUSPENDED on a timer, no step
-- recorded), starts now, as DBOS does: PENDING for the caller's session (or nobody).
-- Returns whether it was resumed, the status before and after, the first
-- open intent (why an IN_DOUBT one was refused), and what a runner needs.
WITH target AS (
    SELECT w.workflow_id, w.status,
           (SELECT min(s.seq) FROM dbos_agent.steps AS s
            WHERE s.workflow_id = w.workflow_id AND s.status = 'PENDING') AS open_intent,
           (w.status = 'ENQUEUED'
            OR (w.status = 'SUSPENDED' AND w.wait_kind = 'sleep'
                AND NOT EXISTS (SELECT 1 FROM dbos_agent.steps AS s
                                WHERE s.workflow_id = w.workflow_id))) AS not_started
    FROM dbos_agent.workflows AS w
    WHERE w.workflow_id = %(workflow_id)s
    FOR UPDATE OF w
), resumed AS (
    UPDATE dbos_agent.workflows AS w
    SET status = CASE WHEN w.queue_name IS NOT NULL AND w.dequeued_at IS NULL
                           AND NOT target.not_started
                      THEN 'ENQUEUED' ELSE 'PENDING' END,
        output = NULL, error = NULL, finished_at = NULL, updated_at = now(),
        recovery_attempts = CASE WHEN target.status = 'MAX_RECOVERY_ATTEMPTS_EXCEEDED'
                                 THEN 0 ELSE w.recovery_attempts END,
        diverged_versions = CASE WHEN target.status = 'DIVERGED'
                                 THEN '{}' ELSE w.diverged_versions END,
        executor_id = COALESCE(%(executor_id)s::text, w.executor_id),
        run_started_at = now(),
        owner_key = CASE WHEN w.queue_name IS NOT NULL AND w.dequeued_at IS NULL
                              AND NOT target.not_started
                         THEN NULL ELSE %(owner_key)s::integer END,
        dequeued_at = CASE WHEN target.status = 'ENQUEUED' THEN now() ELSE w.dequeued_at END,
        wait_kind = CASE WHEN target.not_started THEN NULL ELSE w.wait_kind END,
        wake_at = CASE WHEN target.not_started THEN NULL ELSE w.wake_at END
    FROM target
    WHERE w.workflow_id = target.workflow_id
      AND (target.status IN ('CANCELLED', 'MAX_RECOVERY_ATTEMPTS_EXCEEDED', 'DIVERGED')
           OR target.not_started
           OR (target.status = 'IN_DOUBT' AND target.open_intent IS NULL))
    RETURNING w.workflow_id, w.status
)
SELECT (SELECT count(*) FROM resumed) = 1 AS resumed, target.status,
       (SELECT status FROM resumed) AS status_now, target.open_intent,
       w.name, w.inputs::text, COALESCE(%(executor_id)s::text, w.executor_id) AS executor_id
FROM target
JOIN dbos_agent.workflows AS w ON w.workflow_id = target.workflow_id;

-- name: cancel_workflows
-- scope: many
-- Stop workflows that have not finished, or drop ones that are stuck (IN_DOUBT,
-- dead-lettered), and with each every unfinished workflow it started, and theirs
-- (parent_id, walked in this statement): the given ids (workflow_ids) that also match
-- {filters} (see storage/filters.py); one id is the one-workflow cancel. A running
-- process stops at its next step boundary: its checkpoints are guarded on PENDING,
-- and the notification (delivered at commit) lets a listening runtime stop before
-- the next step even starts; a SUSPENDED one simply ends. One already CANCELLED or
-- finished is left as it is (the unfinished workflows it started are cancelled).
-- Rows are locked in id order (every bulk statement's order). Returns how many of
-- the ids matched, how many of those were cancelled, how many workflows they had
-- started were cancelled with them, and the status before of the first id matched
-- (the one-workflow cancel's answer).
WITH RECURSIVE picked AS (
    SELECT workflow_id, status
    FROM dbos_agent.workflows
    WHERE workflow_id = ANY(%(workflow_ids)s) AND {filters}
    ORDER BY workflow_id
    FOR UPDATE
), tree AS (
    SELECT workflow_id, workflow_id AS root, 0 AS depth FROM picked
    UNION
    SELECT c.workflow_id, t.root, t.depth + 1
    FROM dbos_agent.workflows AS c
    JOIN tree AS t ON c.parent_id = t.workflow_id
    WHERE t.depth < 1000
), target AS (
    SELECT w.workflow_id, w.status, t.root, t.depth = 0 AS is_root
    FROM (SELECT DISTINCT ON (workflow_id) workflow_id, root, depth
          FROM tree ORDER BY workflow_id, depth) AS t
    JOIN dbos_agent.workflows AS w USING (workflow_id)
    ORDER BY w.workflow_id
    FOR UPDATE OF w
), cancelled AS (
    UPDATE dbos_agent.workflows AS w
    SET status = 'CANCELLED', output = NULL, owner_key = NULL,
        wait_kind = NULL, wait_target = NULL, wait_name = NULL, wake_at = NULL,
        error = jsonb_build_object(
            'type', 'dbos_agent.errors.WorkflowCancelledError',
            'message', format('workflow %%s was cancelled (it was %%s)%%s',
                              w.workflow_id, target.status,
                              CASE WHEN target.is_root THEN ''
                                   ELSE format(' with %%s, which started it',
                                               target.root) END),
            'args', jsonb_build_array()),
        updated_at = now(), finished_at = now()
    FROM target
    WHERE w.workflow_id = target.workflow_id
      AND (target.status IN ('PENDING', 'SUSPENDED', 'ENQUEUED', 'DIVERGED')
           OR (target.is_root AND target.status IN ('IN_DOUBT',
                                                     'MAX_RECOVERY_ATTEMPTS_EXCEEDED')))
    RETURNING w.workflow_id, target.is_root, pg_notify('dbos_agent_cancel', w.workflow_id)
)
SELECT (SELECT count(*) FROM picked) AS matched,
       (SELECT count(*) FROM cancelled WHERE is_root) AS changed,
       (SELECT count(*) FROM cancelled WHERE NOT is_root) AS children,
       (SELECT status FROM picked ORDER BY workflow_id LIMIT 1) AS status;

-- name: resume_workflows
-- scope: many
-- resume_workflow for a batch of ids that also match {filters}, as Client.resume
-- does it (no owner, each keeps its executor): CANCELLED, dead-lettered, DIVERGED
-- and resolved IN_DOUBT workflows continue from their logs; any other is left as it
-- is. A workflow whose deduplication id another unfinished workflow of its queue
-- holds now is left too (resume_workflow refuses it). Returns how many of the ids
-- matched and how many were resumed.
WITH picked AS (
    SELECT w.workflow_id, w.status,
           (SELECT min(s.seq) FROM dbos_agent.steps AS s
            WHERE s.workflow_id = w.workflow_id AND s.status = 'PENDING') AS open_intent
    FROM dbos_agent.workflows AS w
    WHERE w.workflow_id = ANY(%(workflow_ids)s) AND {filters}
    ORDER BY w.workflow_id
    FOR UPDATE OF w
), resumed AS (
    UPDATE dbos_agent.workflows AS w
    SET status = CASE WHEN w.queue_name IS NOT NULL AND w.dequeued_at IS NULL
                      THEN 'ENQUEUED' ELSE 'PENDING' END,
        output = NULL, error = NULL, finished_at = NULL, updated_at = now(),
        recovery_attempts = CASE WHEN picked.status = 'MAX_RECOVERY_ATTEMPTS_EXCEEDED'
                                 THEN 0 ELSE w.recovery_attempts END,
        diverged_versions = CASE WHEN picked.status = 'DIVERGED'
                                 THEN '{}' ELSE w.diverged_versions END,
        run_started_at = now(), owner_key = NULL
    FROM picked
    WHERE w.workflow_id = picked.workflow_id
      AND (picked.status IN ('CANCELLED', 'MAX_RECOVERY_ATTEMPTS_EXCEEDED', 'DIVERGED')
           OR (picked.status = 'IN_DOUBT' AND picked.open_intent IS NULL))
      AND NOT (w.dedup_id IS NOT NULL AND picked.status <> 'DIVERGED' AND EXISTS (
          SELECT 1 FROM dbos_agent.workflows AS o
          WHERE o.queue_name = w.queue_name AND o.dedup_id = w.dedup_id
            AND o.status IN ('PENDING', 'ENQUEUED', 'SUSPENDED', 'DIVERGED')))
    RETURNING w.workflow_id
)
SELECT (SELECT count(*) FROM picked) AS matched, (SELECT count(*) FROM resumed) AS changed;

-- name: delete_workflows
-- scope: many
-- Delete a batch of ids that also match {filters}, each with its steps, messages,
-- events, stream items, approval requests and model usage (as retention does), if
-- it finished and waits for nobody (not PENDING, ENQUEUED, SUSPENDED, DIVERGED, nor
-- IN_DOUBT, which waits for a person: a cancel first makes those deletable). The
-- workflows it started are not deleted. Returns how many of the ids matched and how
-- many were deleted.
WITH picked AS (
    SELECT workflow_id, status
    FROM dbos_agent.workflows
    WHERE workflow_id = ANY(%(workflow_ids)s) AND {filters}
    ORDER BY workflow_id
    FOR UPDATE
), deleted AS (
    DELETE FROM dbos_agent.workflows
    WHERE workflow_id = ANY(ARRAY(
        SELECT workflow_id FROM picked
        WHERE status NOT IN ('PENDING', 'ENQUEUED', 'SUSPENDED', 'DIVERGED', 'IN_DOUBT')))
    RETURNING workflow_id
), logs AS (
    SELECT * FROM dbos_agent.delete_logs(ARRAY(SELECT workflow_id FROM deleted))
)
SELECT (SELECT count(*) FROM picked) AS matched, (SELECT count(*) FROM deleted) AS changed
FROM logs;  -- FROM logs: a plain WITH query runs only where it is read

-- name: count_workflows_to_act_on
-- scope: many
-- A bulk action's dry run: of a batch of ids that also match {filters}, how many
-- matched, and how many the action (cancel, resume or delete) would change now, by
-- the status checks of its statement (a resume whose deduplication id is held is
-- counted: it would be left, and the dry run does not look that far).
SELECT count(*) AS matched,
       count(*) FILTER (WHERE CASE %(action)s
           WHEN 'cancel' THEN status IN ('PENDING', 'SUSPENDED', 'ENQUEUED', 'DIVERGED',
                                         'IN_DOUBT', 'MAX_RECOVERY_ATTEMPTS_EXCEEDED')
           WHEN 'resume' THEN status IN ('CANCELLED', 'MAX_RECOVERY_ATTEMPTS_EXCEEDED',
                                         'DIVERGED')
                OR (status = 'IN_DOUBT' AND NOT EXISTS (
                    SELECT 1 FROM dbos_agent.steps AS s
                    WHERE s.workflow_id = w.workflow_id AND s.status = 'PENDING'))
           ELSE status NOT IN ('PENDING', 'ENQUEUED', 'SUSPENDED', 'DIVERGED', 'IN_DOUBT') END)
           AS changed
FROM dbos_agent.workflows AS w
WHERE workflow_id = ANY(%(workflow_ids)s) AND {filters};

-- name: get_workflow_dedup
-- scope: one workflow
-- The queue and deduplication id of a workflow whose resume the dedup index refused.
SELECT queue_name, dedup_id FROM dbos_agent.workflows WHERE workflow_id = %(workflow_id)s;

-- name: fork_workflow
-- scope: a family
-- A new PENDING workflow with the original's name and inputs whose log is a
-- copy of the original's recorded results below its fork point: it replays those
-- and runs live from there. One statement, so the checks, the insert and the
-- copies see one snapshot and commit together. Writes nothing when from_step is
-- past the end of the log, when an intent below the fork point is still in doubt
-- (the fork would repeat an effect that may have happened), or when the new id is
-- taken; the returned row says which. A wait in progress (a recv or get_event not met,
-- records.WAIT_STEPS) is not in doubt: it is not copied, and the fork waits again.
--
-- The fork point is from_step moved back over the approval steps just below it
-- (requests, and recvs of a decision): a fork asks again for an approval whose
-- decision it would otherwise wait for in vain, or whose tool it would run again on
-- the original's decision. The fork gets the original's approval requests below
-- its fork point: decided as in the original when the decision is below it too,
-- else PENDING (asked again). And what the original published below its fork
-- point: per event key the value its last setter there set, a set_event step or a step
-- that set it inside (event_sets; logs of older versions, without the value in a
-- set_event step's inputs: the original's current value),
-- and the stream items its body wrote there (named by the step's output, the
-- offset, and its inputs' key; an older log has no key there: matched on any key)
-- with the items written from its copied steps, renumbered densely from 0 (the
-- copied steps' outputs say the new offsets).
--
-- An edited fork (edits not NULL) gets inputs instead of the original's (when not NULL),
-- and each step named in replace ({"seq": {"name", "output"}}) copied with that output,
-- as a success; it is refused (bad_edit: the first such step) unless every one is a
-- recorded result below the fork point under that name. The edits are recorded on it,
-- each with the time.
WITH original AS (
    SELECT w.workflow_id, w.name, w.inputs, w.executor_id, w.app_version,
           w.max_recovery_attempts,
           (SELECT max(s.seq) FROM dbos_agent.steps AS s
            WHERE s.workflow_id = w.workflow_id) AS last_seq
    FROM dbos_agent.workflows AS w
    WHERE w.workflow_id = %(workflow_id)s
), approval_steps AS (
    SELECT s.seq,
           s.name = 'dbos_agent.request_approval'
           OR (s.name = 'dbos_agent.recv'
               AND s.inputs ->> 'topic' LIKE 'dbos_agent.approval:%%') AS approval
    FROM dbos_agent.steps AS s
    WHERE s.workflow_id = %(workflow_id)s AND s.seq < %(from_step)s
), point AS (
    SELECT CASE
               WHEN (SELECT approval FROM approval_steps WHERE seq = %(from_step)s - 1)
               THEN coalesce((SELECT max(seq) + 1 FROM approval_steps WHERE NOT approval), 0)
               ELSE %(from_step)s
           END AS from_step
), checked AS (
    SELECT o.*, p.from_step,
           (SELECT min(s.seq) FROM dbos_agent.steps AS s
            WHERE s.workflow_id = o.workflow_id AND s.status = 'PENDING'
              AND s.name NOT IN ('dbos_agent.recv', 'dbos_agent.get_event')
              AND s.seq < p.from_step) AS open_intent,
           (SELECT min(r.key::integer)
            FROM jsonb_each(coalesce(%(replace)s::jsonb, '{}')) AS r
            WHERE NOT EXISTS (
                SELECT 1 FROM dbos_agent.steps AS s
                WHERE s.workflow_id = o.workflow_id AND s.seq = r.key::integer
                  AND s.seq < p.from_step AND s.name = r.value ->> 'name'
                  AND s.status IN ('SUCCESS', 'ERROR'))) AS bad_edit
    FROM original AS o, point AS p
), inserted AS (
    INSERT INTO dbos_agent.workflows
        (workflow_id, name, status, inputs, executor_id, app_version, max_recovery_attempts,
         owner_key, forked_from, forked_from_step, edits)
    SELECT %(new_workflow_id)s, c.name, 'PENDING', coalesce(%(inputs)s::json, c.inputs),
           COALESCE(%(executor_id)s::text, c.executor_id), c.app_version,
           c.max_recovery_attempts, %(owner_key)s::integer, c.workflow_id, c.from_step,
           (SELECT jsonb_agg(e || jsonb_build_object('at', now()) ORDER BY n)
            FROM jsonb_array_elements(%(edits)s::jsonb) WITH ORDINALITY AS x(e, n))
    FROM checked AS c
    WHERE %(from_step)s <= coalesce(c.last_seq + 1, 0) AND c.open_intent IS NULL
      AND c.bad_edit IS NULL
    ON CONFLICT (workflow_id) DO NOTHING
    RETURNING workflow_id
), kept AS (  -- the original's recorded results below the fork point
    SELECT s.*
    FROM dbos_agent.steps AS s, point AS p
    WHERE s.workflow_id = %(workflow_id)s AND s.seq < p.from_step
      AND s.status IN ('SUCCESS', 'ERROR')
      AND EXISTS (SELECT 1 FROM inserted)
), body_writes AS (  -- the stream item each kept write_stream/close_stream step wrote
    SELECT b.*
    FROM point AS p, dbos_agent.body_stream_writes(%(workflow_id)s, p.from_step) AS b
    WHERE EXISTS (SELECT 1 FROM inserted)
), published AS (
    SELECT i.*,
           row_number() OVER (PARTITION BY i.key ORDER BY i."offset") - 1 AS new_offset
    FROM dbos_agent.streams AS i
    WHERE i.workflow_id = %(workflow_id)s
      AND (i.step_seq IN (SELECT seq FROM kept)
           OR (i.step_seq IS NULL
               AND EXISTS (SELECT 1 FROM body_writes AS b
                           WHERE b.key = i.key AND b."offset" = i."offset")))
), streamed AS (
    INSERT INTO dbos_agent.streams
        (workflow_id, key, "offset", kind, value, step_seq, attempt, attempt_id, created_at)
    SELECT %(new_workflow_id)s, i.key, i.new_offset, i.kind, i.value, i.step_seq, i.attempt,
           i.attempt_id, i.created_at
    FROM published AS i
    RETURNING "offset"
), copied AS (
    INSERT INTO dbos_agent.steps
        (workflow_id, seq, name, status, inputs, output, error, attempts, started_at,
         finished_at, events)
    SELECT %(new_workflow_id)s, k.seq, k.name,
           CASE WHEN r.value IS NULL THEN k.status ELSE 'SUCCESS' END, k.inputs,
           CASE WHEN r.value IS NOT NULL THEN r.value -> 'output'
                ELSE coalesce((SELECT to_jsonb(p.new_offset)
                               FROM body_writes AS b
                               JOIN published AS p ON p.key = b.key AND p."offset" = b."offset"
                               WHERE b.seq = k.seq
                               ORDER BY b.key LIMIT 1), k.output) END,
           CASE WHEN r.value IS NULL THEN k.error END, k.attempts, k.started_at,
           k.finished_at, k.events
    FROM kept AS k
    LEFT JOIN LATERAL (SELECT %(replace)s::jsonb -> k.seq::text AS value) AS r ON true
    RETURNING seq
), evented AS (
    INSERT INTO dbos_agent.events (workflow_id, key, value)
    SELECT %(new_workflow_id)s, last.key, last.value
    FROM (
        SELECT DISTINCT ON (k.key) k.key, coalesce(k.value, e.value) AS value
        FROM point AS p
        CROSS JOIN LATERAL dbos_agent.event_sets(%(workflow_id)s, p.from_step) AS k
        LEFT JOIN dbos_agent.events AS e
               ON e.workflow_id = %(workflow_id)s AND e.key = k.key
        WHERE EXISTS (SELECT 1 FROM inserted)
        ORDER BY k.key, k.seq DESC
    ) AS last
    WHERE last.value IS NOT NULL
    RETURNING key
), asked AS (
    INSERT INTO dbos_agent.approvals
        (workflow_id, seq, tool, arguments, digest, status, reason, requested_at, decided_at)
    SELECT %(new_workflow_id)s, a.seq, a.tool, a.arguments, a.digest,
           CASE WHEN d.decided THEN a.status ELSE 'PENDING' END,
           CASE WHEN d.decided THEN a.reason END,
           CASE WHEN d.decided THEN a.requested_at ELSE now() END,
           CASE WHEN d.decided THEN a.decided_at END
    FROM dbos_agent.approvals AS a
    CROSS JOIN LATERAL (
        SELECT EXISTS (SELECT 1 FROM kept AS k
                       WHERE k.name = 'dbos_agent.recv' AND k.status = 'SUCCESS'
                         AND k.inputs ->> 'topic' = 'dbos_agent.approval:' || a.seq)
               AS decided
    ) AS d
    WHERE a.workflow_id = %(workflow_id)s AND a.seq IN (SELECT seq FROM kept)
    RETURNING seq
)
SELECT (SELECT count(*) FROM inserted) = 1 AS forked,
       (SELECT count(*) FROM copied) AS copied,
       c.name, coalesce(%(inputs)s::json, c.inputs)::text AS inputs, COALESCE(%(executor_id)s::text, c.executor_id) AS executor_id,
       c.last_seq, c.open_intent, c.from_step, c.bad_edit,
       (SELECT count(*) FROM streamed) AS stream_items,
       (SELECT count(*) FROM evented) AS events,
       (SELECT count(*) FROM asked) AS approvals
FROM checked AS c;

-- name: get_fork_origin
-- scope: one workflow
-- Where a forked workflow came from (NULLs for one that was not forked).
SELECT forked_from, forked_from_step
FROM dbos_agent.workflows
WHERE workflow_id = %(workflow_id)s;

-- name: rewind_workflow
-- scope: a family
-- Run a stopped workflow again in place from step to_step: its steps at and after
-- to_step are deleted, and what they did to its own rows undone in the same statement
-- (one transaction, so a refusal or a failure leaves everything as it was):
-- messages they received are unconsumed (a later recv takes them again); the stream
-- items they wrote are deleted, a close among them with them (the stream is open again
-- unless a kept step closed it); each event a deleted step set (a set_event step, or a
-- step inside it) goes back to the value its last kept setter set (event_sets), or is
-- deleted when no kept step set it; their approval requests are deleted with the
-- decisions sent for them (the re-run asks again); their model replies leave the
-- family's running totals. The workflow
-- becomes PENDING (ENQUEUED when it never left its queue) owned by owner_key (NULL:
-- whoever claims it), with its recovery attempts back, and the rewind is appended to
-- its edits. Refused, writing nothing, unless it is stopped (finished, cancelled,
-- dead-lettered, DIVERGED, IN_DOUBT or SUSPENDED: no process runs it), when to_step is
-- past the end of its log, or when a kept step is in doubt. Messages it sent, and
-- workflows it started, from deleted steps stay: a re-run's send at the same position
-- is deduplicated by its key, and a child started again under its id is the same
-- child. The row says which refusal, and what a runner needs.
WITH target AS (
    SELECT w.workflow_id, w.status, w.name, w.inputs, w.executor_id,
           coalesce(dbos_agent.family_root(w.workflow_id), w.workflow_id) AS root,
           (SELECT max(s.seq) FROM dbos_agent.steps AS s
            WHERE s.workflow_id = w.workflow_id) AS last_seq,
           (SELECT min(s.seq) FROM dbos_agent.steps AS s
            WHERE s.workflow_id = w.workflow_id AND s.status = 'PENDING'
              AND s.name NOT IN ('dbos_agent.recv', 'dbos_agent.get_event')
              AND s.seq < %(to_step)s) AS open_intent
    FROM dbos_agent.workflows AS w
    WHERE w.workflow_id = %(workflow_id)s
    FOR UPDATE OF w
), allowed AS (
    SELECT t.* FROM target AS t
    WHERE t.status IN ('SUCCESS', 'ERROR', 'CANCELLED', 'MAX_RECOVERY_ATTEMPTS_EXCEEDED',
                       'DIVERGED', 'IN_DOUBT', 'SUSPENDED')
      AND %(to_step)s <= coalesce(t.last_seq + 1, 0)
      AND t.open_intent IS NULL
), kept_sets AS (  -- the events the kept steps set, with their positions
    SELECT k.* FROM dbos_agent.event_sets(%(workflow_id)s, %(to_step)s) AS k
    WHERE EXISTS (SELECT 1 FROM allowed)
), deleted AS (
    DELETE FROM dbos_agent.steps AS s
    USING allowed AS a
    WHERE s.workflow_id = a.workflow_id AND s.seq >= %(to_step)s
    RETURNING s.seq, s.name, s.status, s.inputs, s.output, s.events
), asked_again AS (  -- the topics of the decisions of requests the re-run makes again
    SELECT 'dbos_agent.approval:' || ap.seq AS topic
    FROM dbos_agent.approvals AS ap
    WHERE ap.workflow_id = %(workflow_id)s AND ap.seq >= %(to_step)s
), unconsumed AS (
    UPDATE dbos_agent.messages AS m
    SET consumed_seq = NULL, consumed_at = NULL
    FROM allowed AS a
    WHERE m.destination_id = a.workflow_id AND m.consumed_seq >= %(to_step)s
      AND m.topic NOT IN (SELECT topic FROM asked_again)
    RETURNING m.message_id
), withdrawn AS (
    DELETE FROM dbos_agent.messages AS m
    USING allowed AS a
    WHERE m.destination_id = a.workflow_id AND m.topic IN (SELECT topic FROM asked_again)
    RETURNING m.message_id
), unasked AS (
    DELETE FROM dbos_agent.approvals AS ap
    USING allowed AS a
    WHERE ap.workflow_id = a.workflow_id AND ap.seq >= %(to_step)s
    RETURNING ap.seq
), truncated AS (
    DELETE FROM dbos_agent.streams AS i
    USING allowed AS a
    WHERE i.workflow_id = a.workflow_id
      AND CASE WHEN i.step_seq IS NULL
               THEN NOT EXISTS (SELECT 1
                                FROM dbos_agent.body_stream_writes(a.workflow_id,
                                                                   %(to_step)s) AS b
                                WHERE b.key = i.key AND b."offset" = i."offset")
               ELSE i.step_seq >= %(to_step)s END
    RETURNING i."offset"
), restored AS (  -- per event key a deleted step set: the value its last kept setter set
    SELECT d.key,
           (SELECT k.value FROM kept_sets AS k WHERE k.key = d.key
            ORDER BY k.seq DESC LIMIT 1) AS value,
           EXISTS (SELECT 1 FROM kept_sets AS k WHERE k.key = d.key) AS kept_set
    FROM (SELECT inputs ->> 'key' AS key FROM deleted
          WHERE name = 'dbos_agent.set_event' AND inputs ->> 'key' IS NOT NULL
          UNION
          SELECT jsonb_object_keys(events) FROM deleted WHERE events IS NOT NULL) AS d
), reset_events AS (
    UPDATE dbos_agent.events AS e
    SET value = r.value, updated_at = now()
    FROM restored AS r
    WHERE e.workflow_id = %(workflow_id)s AND e.key = r.key AND r.value IS NOT NULL
    RETURNING e.key
), unset_events AS (
    DELETE FROM dbos_agent.events AS e
    USING restored AS r
    WHERE e.workflow_id = %(workflow_id)s AND e.key = r.key AND NOT r.kept_set
    RETURNING e.key
), uncounted AS (
    UPDATE dbos_agent.family_usage AS f
    SET replies = f.replies - u.replies,
        input_tokens = f.input_tokens - u.input_tokens,
        output_tokens = f.output_tokens - u.output_tokens,
        cache_creation_input_tokens
            = f.cache_creation_input_tokens - u.cache_creation_input_tokens,
        cache_read_input_tokens = f.cache_read_input_tokens - u.cache_read_input_tokens
    FROM allowed AS a, (
        SELECT d.name, coalesce(nullif(d.output ->> 'model', ''), 'unknown') AS model,
               count(*) AS replies,
               sum(dbos_agent.usage_tokens(d.output -> 'usage', 'input_tokens')) AS input_tokens,
               sum(dbos_agent.usage_tokens(d.output -> 'usage', 'output_tokens'))
                   AS output_tokens,
               sum(dbos_agent.usage_tokens(d.output -> 'usage', 'cache_creation_input_tokens'))
                   AS cache_creation_input_tokens,
               sum(dbos_agent.usage_tokens(d.output -> 'usage', 'cache_read_input_tokens'))
                   AS cache_read_input_tokens
        FROM deleted AS d
        WHERE d.status = 'SUCCESS' AND jsonb_typeof(d.output -> 'usage') = 'object'
        GROUP BY 1, 2
    ) AS u
    WHERE f.workflow_id = a.root AND f.step_name = u.name AND f.model = u.model
    RETURNING f.step_name
), rewound AS (
    UPDATE dbos_agent.workflows AS w
    SET status = CASE WHEN w.queue_name IS NOT NULL AND w.dequeued_at IS NULL
                      THEN 'ENQUEUED' ELSE 'PENDING' END,
        owner_key = CASE WHEN w.queue_name IS NOT NULL AND w.dequeued_at IS NULL
                         THEN NULL ELSE %(owner_key)s::integer END,
        executor_id = COALESCE(%(executor_id)s::text, w.executor_id),
        output = NULL, error = NULL, finished_at = NULL,
        wait_kind = NULL, wait_target = NULL, wait_name = NULL, wake_at = NULL,
        recovery_attempts = 0, diverged_versions = '{}',
        run_started_at = now(), updated_at = now(),
        edits = coalesce(w.edits, '[]'::jsonb) || jsonb_build_array(jsonb_build_object(
            'kind', 'rewind', 'to_step', %(to_step)s::integer, 'status', a.status,
            'deleted_steps', (SELECT count(*) FROM deleted), 'by', %(by)s::text,
            'at', now()))
    FROM allowed AS a
    WHERE w.workflow_id = a.workflow_id
    RETURNING w.status
)
SELECT (SELECT count(*) FROM rewound) = 1 AS rewound, t.status,
       (SELECT status FROM rewound) AS status_now, t.last_seq, t.open_intent, t.name,
       t.inputs::text, COALESCE(%(executor_id)s::text, t.executor_id) AS executor_id,
       (SELECT count(*) FROM deleted) AS deleted_steps,
       (SELECT count(*) FROM unconsumed) AS unconsumed_messages,
       (SELECT count(*) FROM truncated) AS stream_items,
       (SELECT count(*) FROM reset_events) + (SELECT count(*) FROM unset_events) AS events,
       (SELECT count(*) FROM unasked) AS approvals
FROM target AS t;

-- name: get_workflow_edits
-- scope: one workflow
-- What operators changed in a workflow's log (rewinds, an edited fork's edits), oldest
-- first; NULL when nothing was.
SELECT edits::text FROM dbos_agent.workflows WHERE workflow_id = %(workflow_id)s;

-- name: has_schema
-- scope: many
-- Whether `migrate` ever ran on this database.
SELECT to_regclass('dbos_agent.schema_migrations') IS NOT NULL AS present;

-- name: get_schema_version
-- scope: many
-- The newest applied migration (only after has_schema).
SELECT coalesce(max(version), 0) AS version FROM dbos_agent.schema_migrations;

-- == messages, events and timers ==

-- name: get_database_time
-- scope: many
-- The database's clock, in seconds since the epoch: durable timers and
-- deadlines use it, so every executor agrees on when a workflow wakes.
SELECT extract(epoch FROM dbos_agent.now())::float8 AS now;

-- name: insert_message
-- scope: one workflow
-- Send a message to a workflow (which must exist). A repeated idempotency
-- key for the same destination inserts nothing. The messages_notify trigger
-- NOTIFYs waiters in the same transaction. The destination row is share-locked,
-- so retention cannot delete it between the check and the insert (and leave
-- the message behind without its workflow).
WITH destination AS (
    SELECT workflow_id FROM dbos_agent.workflows WHERE workflow_id = %(destination_id)s
    FOR KEY SHARE
), inserted AS (
    INSERT INTO dbos_agent.messages (destination_id, topic, message, idempotency_key)
    SELECT workflow_id, %(topic)s, %(message)s::jsonb, %(idempotency_key)s FROM destination
    ON CONFLICT ON CONSTRAINT messages_idempotency_key DO NOTHING
    RETURNING message_id
)
SELECT EXISTS (SELECT 1 FROM destination) AS destination_exists,
       (SELECT count(*) FROM inserted) = 1 AS inserted;

-- name: insert_messages
-- scope: many
-- send_bulk: insert_message for many (destination, topic, message, key) at once, given
-- as parallel arrays, in one statement: all of them, or none when a destination does
-- not exist (missing names them). Keys sent before insert nothing, as one send's do;
-- the messages_notify trigger wakes each destination's waiters at commit. Returns one
-- row per message, in the given order.
WITH given AS (
    SELECT *
    FROM unnest(%(destination_ids)s::text[], %(topics)s::text[], %(messages)s::text[],
                %(idempotency_keys)s::text[]) WITH ORDINALITY
         AS g(destination_id, topic, message, idempotency_key, n)
), destination AS (
    SELECT workflow_id FROM dbos_agent.workflows
    WHERE workflow_id = ANY(ARRAY(SELECT DISTINCT destination_id FROM given))
    FOR KEY SHARE
), missing AS (
    SELECT DISTINCT g.destination_id FROM given AS g
    WHERE NOT EXISTS (SELECT 1 FROM destination AS d WHERE d.workflow_id = g.destination_id)
), inserted AS (
    INSERT INTO dbos_agent.messages (destination_id, topic, message, idempotency_key)
    SELECT destination_id, topic, message::jsonb, idempotency_key FROM given
    WHERE NOT EXISTS (SELECT 1 FROM missing)
    ORDER BY n
    ON CONFLICT ON CONSTRAINT messages_idempotency_key DO NOTHING
    RETURNING destination_id, idempotency_key
)
SELECT (SELECT count(*) FROM inserted) AS inserted,
       ARRAY(SELECT destination_id FROM missing ORDER BY destination_id) AS missing;

-- name: receive_message
-- scope: one workflow
-- recv: consume the oldest unconsumed message of (workflow, topic) and record
-- it as the result of step `seq`, in one statement, so a message is consumed
-- exactly when its step is recorded. The step row is new, or fills this
-- recv's own deadline intent; if another run recorded the position first the
-- insert does nothing, and then the message is not consumed either (the
-- UPDATE only runs when the INSERT returned a row). Same guard as
-- record_step: only while the workflow is PENDING and owned by the caller.
-- Returns whether a message was taken, the message, and the step row that
-- held the position before.
WITH workflow AS (
    SELECT dbos_agent.write_status(%(workflow_id)s, %(owner_key)s) AS status
), candidate AS (
    SELECT message_id, message
    FROM dbos_agent.messages
    WHERE destination_id = %(workflow_id)s AND topic = %(topic)s AND consumed_seq IS NULL
    ORDER BY message_id
    LIMIT 1
    FOR UPDATE SKIP LOCKED
), written AS (
    INSERT INTO dbos_agent.steps
        (workflow_id, seq, name, status, inputs, output, attempts, started_at)
    SELECT %(workflow_id)s, %(seq)s, %(name)s, 'SUCCESS', %(inputs)s::jsonb, c.message, 1,
           %(started_at)s
    FROM candidate AS c
    WHERE (SELECT status FROM workflow) = 'PENDING'
    ON CONFLICT (workflow_id, seq) DO UPDATE
        SET status = 'SUCCESS', output = EXCLUDED.output, finished_at = now()
        WHERE steps.status = 'PENDING' AND steps.name = EXCLUDED.name
    RETURNING output
), consumed AS (
    UPDATE dbos_agent.messages AS m
    SET consumed_seq = %(seq)s, consumed_at = now()
    FROM candidate AS c
    WHERE m.destination_id = %(workflow_id)s AND m.message_id = c.message_id
      AND EXISTS (SELECT 1 FROM written)
    RETURNING m.message_id
)
SELECT (SELECT count(*) FROM consumed) = 1 AS written,
       (SELECT status FROM workflow) AS workflow_status,
       s.name, s.status, s.output::text, s.error::text, s.attempts,
       (SELECT output::text FROM written) AS message
FROM (SELECT 1) AS one
LEFT JOIN dbos_agent.steps AS s ON s.workflow_id = %(workflow_id)s AND s.seq = %(seq)s;

-- name: set_event
-- scope: one workflow
-- set_event: record step `seq` and upsert the event in one statement; the
-- event is written only if the step was (a run that lost the position never
-- overwrites a newer value). Same guard as record_step. The events_notify
-- trigger NOTIFYs waiters. The step's inputs keep the value too: a fork takes
-- the value each key had at its fork point from there (fork_workflow).
WITH workflow AS (
    SELECT dbos_agent.write_status(%(workflow_id)s, %(owner_key)s) AS status
), written AS (
    INSERT INTO dbos_agent.steps
        (workflow_id, seq, name, status, inputs, output, attempts, started_at)
    SELECT %(workflow_id)s, %(seq)s, %(name)s, 'SUCCESS',
           %(inputs)s::jsonb || jsonb_build_object('value', %(value)s::jsonb), 'null'::jsonb, 1,
           %(started_at)s
    WHERE (SELECT status FROM workflow) = 'PENDING'
    ON CONFLICT (workflow_id, seq) DO NOTHING
    RETURNING seq
), upserted AS (
    INSERT INTO dbos_agent.events (workflow_id, key, value)
    SELECT %(workflow_id)s, %(key)s, %(value)s::jsonb FROM written
    ON CONFLICT (workflow_id, key) DO UPDATE SET value = EXCLUDED.value, updated_at = now()
    RETURNING key
)
SELECT (SELECT count(*) FROM upserted) = 1 AS written,
       (SELECT status FROM workflow) AS workflow_status,
       s.name, s.status, s.output::text, s.error::text, s.attempts
FROM (SELECT 1) AS one
LEFT JOIN dbos_agent.steps AS s ON s.workflow_id = %(workflow_id)s AND s.seq = %(seq)s;

-- name: put_event
-- scope: one workflow
-- Set an event asked for inside a step, in the transaction of that step's checkpoint
-- (storage/steps.py, after record_step wrote the step): the events_notify trigger
-- NOTIFYs waiters.
INSERT INTO dbos_agent.events (workflow_id, key, value)
VALUES (%(workflow_id)s, %(key)s, %(value)s::jsonb)
ON CONFLICT (workflow_id, key) DO UPDATE SET value = EXCLUDED.value, updated_at = now();

-- name: get_event
-- scope: one workflow
-- The current value of a workflow's event (NULL: never set; 'null': set to None).
SELECT value::text FROM dbos_agent.events
WHERE workflow_id = %(workflow_id)s AND key = %(key)s;

-- name: get_step_inputs
-- scope: one workflow
-- The inputs of one step row: a waiting recv/get_event keeps its durable
-- deadline in its intent's inputs.
SELECT inputs::text FROM dbos_agent.steps
WHERE workflow_id = %(workflow_id)s AND seq = %(seq)s;

-- == retention ==
-- Garbage collection of finished workflows (engine/retention.py). A workflow
-- goes with everything keyed by its id: its steps, the messages sent to it
-- and the events it set. Nothing else refers to a workflow (forked_from is no
-- foreign key: a fork outlives its original). Every batch is one statement,
-- so one short transaction that locks at most batch_size workflows: a long
-- purge never holds locks or a snapshot for long.

-- name: delete_finished_workflows
-- scope: many
-- Delete one batch: the oldest batch_size workflows with one of `statuses`
-- that finished more than older_than seconds ago, with their logs (delete_logs:
-- steps, messages, events, streams, approvals, model usage). created_at <= finished_at, so the redundant bound on created_at
-- lets the scan walk workflows_by_created (or workflows_by_status for one
-- status) in order and stop at the batch. SKIP LOCKED: a row that a run, an
-- operator or another collector holds waits for the next pass. The DELETE
-- re-checks the status and the other rows go only with a workflow that was
-- deleted, so a workflow resumed meanwhile keeps its log. The deletes look
-- their rows up with = ANY(array), which every plan (psycopg's prepared,
-- generic one too) serves from an index: workflows_pkey, steps_pkey, the
-- index of messages_idempotency_key (destination_id first), events_pkey.
-- Returns the four counts.
WITH picked AS (
    SELECT workflow_id
    FROM dbos_agent.workflows
    WHERE status = ANY(%(statuses)s)
      AND finished_at < dbos_agent.now() - make_interval(secs => %(older_than)s)
      AND created_at < dbos_agent.now() - make_interval(secs => %(older_than)s)
    ORDER BY created_at
    LIMIT %(batch_size)s
    FOR UPDATE SKIP LOCKED
), deleted AS (
    DELETE FROM dbos_agent.workflows
    WHERE workflow_id = ANY(ARRAY(SELECT workflow_id FROM picked))
      AND status = ANY(%(statuses)s)
    RETURNING workflow_id
), logs AS (
    SELECT * FROM dbos_agent.delete_logs(ARRAY(SELECT workflow_id FROM deleted))
)
SELECT (SELECT count(*) FROM deleted) AS workflows, logs.steps, logs.messages, logs.events
FROM logs;

-- name: count_finished_workflows
-- scope: many
-- What delete_finished_workflows would delete, batch after batch, if it ran
-- now (a dry run): the same workflows and their rows. Reads only. NOT
-- MATERIALIZED lets the planner join each table to the workflows it counts
-- (a hash join over a large backlog, index lookups over a small one).
WITH picked AS NOT MATERIALIZED (
    SELECT workflow_id
    FROM dbos_agent.workflows
    WHERE status = ANY(%(statuses)s)
      AND finished_at < dbos_agent.now() - make_interval(secs => %(older_than)s)
      AND created_at < dbos_agent.now() - make_interval(secs => %(older_than)s)
)
SELECT (SELECT count(*) FROM picked) AS workflows,
       (SELECT count(*) FROM dbos_agent.steps
        WHERE workflow_id IN (SELECT workflow_id FROM picked)) AS steps,
       (SELECT count(*) FROM dbos_agent.messages
        WHERE destination_id IN (SELECT workflow_id FROM picked)) AS messages,
       (SELECT count(*) FROM dbos_agent.events
        WHERE workflow_id IN (SELECT workflow_id FROM picked)) AS events;

-- ---------------------------------------------------------------- inspection
-- Read-only views for tests and tools (storage/inspection.py): what happened,
-- by column name, without reaching into the tables from outside the package.

-- name: inspect_messages
-- scope: one workflow
-- Every message sent to a workflow, oldest first, consumed or not.
SELECT topic, message::text AS message, idempotency_key, consumed_seq
FROM dbos_agent.messages
WHERE destination_id = %(workflow_id)s
ORDER BY message_id;

-- name: inspect_event
-- scope: one workflow
SELECT value::text AS value
FROM dbos_agent.events
WHERE workflow_id = %(workflow_id)s AND key = %(key)s;

-- name: inspect_owner_pid
-- scope: one workflow
-- The pid of the process whose session owns the workflow now (NULL: none).
SELECT e.pid
FROM dbos_agent.workflows AS w
JOIN dbos_agent.executors AS e ON e.session_key = w.owner_key
WHERE w.workflow_id = %(workflow_id)s;

-- name: inspect_rows_of
-- scope: one workflow
-- How many rows a workflow has in each table (0 everywhere once deleted).
SELECT (SELECT count(*) FROM dbos_agent.workflows WHERE workflow_id = %(workflow_id)s)
           AS workflows,
       (SELECT count(*) FROM dbos_agent.steps WHERE workflow_id = %(workflow_id)s) AS steps,
       (SELECT count(*) FROM dbos_agent.messages WHERE destination_id = %(workflow_id)s)
           AS messages,
       (SELECT count(*) FROM dbos_agent.events WHERE workflow_id = %(workflow_id)s) AS events;

-- name: inspect_recovery_attempts
-- scope: many
-- Recovery attempts of each workflow (of every workflow with a NULL list).
SELECT workflow_id, recovery_attempts
FROM dbos_agent.workflows
WHERE %(workflow_ids)s::text[] IS NULL OR workflow_id = ANY(%(workflow_ids)s::text[]);

-- name: inspect_statuses
-- scope: many
-- The status of each of the given workflows that exists: what a test polls while it
-- waits, one primary-key probe per id and nothing of what describe_workflow joins.
SELECT workflow_id, status
FROM dbos_agent.workflows
WHERE workflow_id = ANY(%(workflow_ids)s::text[]);

-- name: inspect_locked_sessions
-- scope: many
SELECT dbos_agent.locked_sessions() AS session_key;

-- == streams ==

-- name: append_stream_item
-- scope: one workflow
-- One item at the stream's next offset (see dbos_agent.append_stream): -1 when
-- the stream is closed, -2 when a step's writer no longer owns the workflow.
SELECT dbos_agent.append_stream(%(workflow_id)s, %(key)s, %(kind)s, %(value)s::jsonb,
                                %(seq)s, %(attempt)s, %(attempt_id)s, %(owner_key)s)
       AS "offset";

-- name: read_stream_items
-- scope: one workflow
-- Items of a stream from an offset on, in order: at most %(limit)s of them and at
-- most %(max_bytes)s bytes of value text (the first item always, however large), with
-- the workflow's status read in the same snapshot (a finished workflow with nothing
-- more to read ends it). The walk takes one item at a time by the primary key, so no
-- item past the page is read but the one that would not fit (measured, not returned).
WITH RECURSIVE page AS (
    SELECT first."offset", first.kind, first.value, first.step_seq, first.attempt,
           coalesce(octet_length(first.value), 0) AS bytes, 1 AS items
    FROM (SELECT "offset", kind, value::text AS value, step_seq, attempt
          FROM dbos_agent.streams
          WHERE workflow_id = %(workflow_id)s AND key = %(key)s AND "offset" >= %(offset)s
          ORDER BY "offset"
          LIMIT 1) AS first
    UNION ALL
    SELECT n."offset", n.kind, n.value, n.step_seq, n.attempt,
           page.bytes + coalesce(octet_length(n.value), 0), page.items + 1
    FROM page
    CROSS JOIN LATERAL (
        SELECT "offset", kind, value::text AS value, step_seq, attempt
        FROM dbos_agent.streams
        WHERE workflow_id = %(workflow_id)s AND key = %(key)s AND "offset" > page."offset"
        ORDER BY "offset"
        LIMIT 1
    ) AS n
    WHERE page.items < %(limit)s
      AND page.bytes + coalesce(octet_length(n.value), 0) <= %(max_bytes)s
)
SELECT s."offset", s.kind, s.value, s.step_seq, s.attempt,
       (SELECT status FROM dbos_agent.workflows WHERE workflow_id = %(workflow_id)s)
           AS workflow_status
FROM (SELECT 1) AS one
LEFT JOIN page AS s ON true
ORDER BY s."offset";

-- name: list_stream_keys
-- scope: one workflow
-- The keys a workflow has written streams under (at most %(limit)s, in order), each
-- with its next offset (how many items it holds: values, resets and its close) and
-- whether it is closed (its last item is the close). A walk by the primary key: one
-- index probe per key and one for its last item, however many items each holds.
WITH RECURSIVE keys AS (
    (SELECT key, 1 AS n FROM dbos_agent.streams
     WHERE workflow_id = %(workflow_id)s ORDER BY key LIMIT 1)
    UNION ALL
    SELECT next.key, keys.n + 1
    FROM keys
    CROSS JOIN LATERAL (
        SELECT s.key FROM dbos_agent.streams AS s
        WHERE s.workflow_id = %(workflow_id)s AND s.key > keys.key
        ORDER BY s.key LIMIT 1
    ) AS next
    WHERE keys.n < %(limit)s
)
SELECT keys.key, last."offset" + 1 AS next_offset, last.kind = 'close' AS closed
FROM keys
CROSS JOIN LATERAL (
    SELECT s."offset", s.kind FROM dbos_agent.streams AS s
    WHERE s.workflow_id = %(workflow_id)s AND s.key = keys.key
    ORDER BY s."offset" DESC LIMIT 1
) AS last
ORDER BY keys.key;

-- == approvals ==

-- name: request_approval
-- scope: one workflow
-- Record what step `seq` asks a human (the request is new; the same request again,
-- from a run that retries its write, changes nothing).
INSERT INTO dbos_agent.approvals (workflow_id, seq, tool, arguments, digest)
VALUES (%(workflow_id)s, %(seq)s, %(tool)s, %(arguments)s::jsonb, %(digest)s)
ON CONFLICT (workflow_id, seq) DO NOTHING;

-- name: decide_approval
-- scope: one workflow
-- Approve or reject the request at (workflow, seq), only if it is PENDING, its
-- digest is the one given and the workflow still waits (PENDING or SUSPENDED),
-- and send the decision to the workflow on the request's topic, in one
-- statement. Returns whether it decided, and what it found (to say why not).
WITH target AS (
    SELECT a.workflow_id, a.seq, a.digest, a.status, w.status AS workflow_status
    FROM dbos_agent.approvals AS a
    JOIN dbos_agent.workflows AS w USING (workflow_id)
    WHERE a.workflow_id = %(workflow_id)s AND a.seq = %(seq)s
    FOR UPDATE OF a
), decided AS (
    UPDATE dbos_agent.approvals AS a
    SET status = %(status)s, reason = %(reason)s, decided_at = now()
    FROM target AS t
    WHERE a.workflow_id = t.workflow_id AND a.seq = t.seq AND t.status = 'PENDING'
      AND t.digest = %(digest)s AND t.workflow_status IN ('PENDING', 'SUSPENDED', 'DIVERGED')
    RETURNING a.workflow_id
), sent AS (
    INSERT INTO dbos_agent.messages (destination_id, topic, message, idempotency_key)
    SELECT workflow_id, %(topic)s, %(message)s::jsonb, %(topic)s FROM decided
    RETURNING message_id
)
SELECT (SELECT count(*) FROM decided) = 1 AS decided,
       (SELECT count(*) FROM sent) AS sent,
       t.status, t.digest, t.workflow_status,
       (SELECT status FROM dbos_agent.workflows WHERE workflow_id = %(workflow_id)s)
           AS found_workflow
FROM (SELECT 1) AS one
LEFT JOIN target AS t ON true;

-- name: list_workflow_approvals
-- scope: one workflow
-- The approval requests of one workflow, newest first (its primary key).
SELECT workflow_id, seq, tool, arguments::text, digest, status, reason, requested_at,
       decided_at
FROM dbos_agent.approvals
WHERE workflow_id = %(workflow_id)s
ORDER BY requested_at DESC, seq DESC
LIMIT %(limit)s;

-- name: list_pending_approvals
-- scope: many
-- The PENDING approval requests of every workflow, newest first (approvals_pending).
-- Apart from list_workflow_approvals: one statement with an OR between the two shapes
-- gets one plan, which cannot use both indexes.
SELECT workflow_id, seq, tool, arguments::text, digest, status, reason, requested_at,
       decided_at
FROM dbos_agent.approvals
WHERE status = 'PENDING'
ORDER BY requested_at DESC, seq DESC
LIMIT %(limit)s;

-- == budgets ==

-- name: get_family_model_usage
-- scope: a family
-- What the model replies (steps named in `names`) of a workflow's family spent, per
-- model: its root ancestor (up parent_id) and every workflow started below that root,
-- so that neither a recovery, a fork (which copies the recorded steps) nor a child
-- workflow starts a budget over. The family's running total (family_usage, kept by
-- trigger as each reply is recorded, migration 020): a few rows, however long the log.
SELECT model, sum(replies)::bigint AS replies, sum(input_tokens)::bigint AS input_tokens,
       sum(output_tokens)::bigint AS output_tokens,
       sum(cache_creation_input_tokens)::bigint AS cache_creation_input_tokens,
       sum(cache_read_input_tokens)::bigint AS cache_read_input_tokens
FROM dbos_agent.family_usage
WHERE workflow_id = dbos_agent.family_root(%(workflow_id)s) AND step_name = ANY(%(names)s)
GROUP BY model
ORDER BY model;


-- == histories: deploy checks, export and import ==

-- name: list_workflows_to_check
-- scope: many
-- The next page of unfinished workflows of the given names whose logs a deploy
-- check replays: PENDING, SUSPENDED, DIVERGED, and ENQUEUED ones that have a log
-- (a resumed one back in its queue). Oldest first, after the cursor.
SELECT w.workflow_id, w.name, w.status, w.app_version, w.inputs::text, w.created_at
FROM dbos_agent.workflows AS w
WHERE w.name = ANY(%(names)s)
  AND (w.status IN ('PENDING', 'SUSPENDED', 'DIVERGED')
       OR (w.status = 'ENQUEUED'
           AND EXISTS (SELECT 1 FROM dbos_agent.steps AS s
                       WHERE s.workflow_id = w.workflow_id)))
  AND (w.created_at, w.workflow_id) > (%(after_created_at)s, %(after_workflow_id)s)
ORDER BY w.created_at, w.workflow_id
LIMIT %(limit)s;

-- name: export_workflows
-- scope: many
-- Workflows as self-contained JSON documents (one per row, oldest first): the row
-- (every column but its owner), its steps, the messages sent to it, its events,
-- streams and approvals, values as stored. import_workflow reads them back.
SELECT jsonb_build_object(
           'format', 'dbos_agent.history/1',
           'workflow', to_jsonb(w) - 'owner_key',
           'steps', coalesce((SELECT jsonb_agg(to_jsonb(s) - 'workflow_id' ORDER BY s.seq)
                              FROM dbos_agent.steps AS s
                              WHERE s.workflow_id = w.workflow_id), '[]'::jsonb),
           'messages', coalesce((SELECT jsonb_agg(to_jsonb(m) - 'message_id'
                                                  - 'destination_id' ORDER BY m.message_id)
                                 FROM dbos_agent.messages AS m
                                 WHERE m.destination_id = w.workflow_id), '[]'::jsonb),
           'events', coalesce((SELECT jsonb_agg(to_jsonb(e) - 'workflow_id' ORDER BY e.key)
                               FROM dbos_agent.events AS e
                               WHERE e.workflow_id = w.workflow_id), '[]'::jsonb),
           'streams', coalesce((SELECT jsonb_agg(to_jsonb(t) - 'workflow_id'
                                                 ORDER BY t.key, t."offset")
                                FROM dbos_agent.streams AS t
                                WHERE t.workflow_id = w.workflow_id), '[]'::jsonb),
           'approvals', coalesce((SELECT jsonb_agg(to_jsonb(a) - 'workflow_id' ORDER BY a.seq)
                                  FROM dbos_agent.approvals AS a
                                  WHERE a.workflow_id = w.workflow_id), '[]'::jsonb)
       )::text AS history, w.workflow_id
FROM dbos_agent.workflows AS w
WHERE w.workflow_id = ANY(%(workflow_ids)s)
ORDER BY w.created_at, w.workflow_id;

-- name: list_unfinished_ids
-- scope: many
-- The next page of unfinished workflows (of `name`, when given), oldest first after
-- the cursor, for `dbos-agent export --unfinished`.
SELECT workflow_id, created_at
FROM dbos_agent.workflows
WHERE status = ANY(%(statuses)s)
  AND (%(name)s::text IS NULL OR name = %(name)s::text)
  AND (created_at, workflow_id) > (%(after_created_at)s, %(after_workflow_id)s)
ORDER BY created_at, workflow_id
LIMIT %(limit)s;

-- name: import_workflow
-- scope: one workflow
-- One exported document into this database, whole or not at all: the workflow
-- (owned by nobody: an unfinished one is run by a process that has its code, as a
-- resumed one is; columns an older export lacks take their defaults), then its
-- steps, messages, events, streams and approvals. An id that exists here already
-- imports nothing (no row back). The document meets the rules of
-- storage/history_checks.py first, and `dbos-agent import` runs this for every line of
-- a file in one transaction: the file is imported whole or not at all.
WITH doc AS (
    SELECT %(history)s::jsonb AS d
), workflow AS (
    INSERT INTO dbos_agent.workflows
    SELECT (jsonb_populate_record(
               NULL::dbos_agent.workflows,
               jsonb_build_object('recovery_attempts', 0, 'priority', 0,
                                  'diverged_versions', '[]'::jsonb,
                                  'accepted_versions', '[]'::jsonb,
                                  'created_at', now(), 'updated_at', now(),
                                  'run_started_at', now())
               || (d -> 'workflow') || jsonb_build_object('owner_key', NULL))).*
    FROM doc
    ON CONFLICT (workflow_id) DO NOTHING
    RETURNING workflow_id
), steps AS (
    INSERT INTO dbos_agent.steps
    SELECT (jsonb_populate_record(NULL::dbos_agent.steps,
                                  s || jsonb_build_object('workflow_id', w.workflow_id))).*
    FROM workflow AS w, doc, jsonb_array_elements(d -> 'steps') AS s
    RETURNING seq
), messages AS (
    INSERT INTO dbos_agent.messages
        (destination_id, topic, message, idempotency_key, created_at, consumed_seq,
         consumed_at)
    SELECT w.workflow_id, r.topic, r.message, r.idempotency_key, r.created_at,
           r.consumed_seq, r.consumed_at
    FROM workflow AS w, doc,
         jsonb_populate_recordset(NULL::dbos_agent.messages, d -> 'messages') AS r
    RETURNING message_id
), events AS (
    INSERT INTO dbos_agent.events
    SELECT (jsonb_populate_record(NULL::dbos_agent.events,
                                  e || jsonb_build_object('workflow_id', w.workflow_id))).*
    FROM workflow AS w, doc, jsonb_array_elements(d -> 'events') AS e
    RETURNING key
), streams AS (
    INSERT INTO dbos_agent.streams
    SELECT (jsonb_populate_record(NULL::dbos_agent.streams,
                                  t || jsonb_build_object('workflow_id', w.workflow_id))).*
    FROM workflow AS w, doc, jsonb_array_elements(d -> 'streams') AS t
    RETURNING "offset"
), approvals AS (
    INSERT INTO dbos_agent.approvals
    SELECT (jsonb_populate_record(NULL::dbos_agent.approvals,
                                  a || jsonb_build_object('workflow_id', w.workflow_id))).*
    FROM workflow AS w, doc, jsonb_array_elements(d -> 'approvals') AS a
    RETURNING seq
)
SELECT workflow_id,
       (SELECT count(*) FROM steps) AS steps,
       (SELECT count(*) FROM messages) AS messages
FROM workflow;

-- name: adopt_workflow_version
-- scope: one workflow
-- check-deploy --adopt: processes of application version `version` may run this
-- workflow from now on, since its log was checked to fit their code. Guarded on the
-- log being the one checked (its number of steps and its last position) and on the
-- workflow being unfinished; a version that runs it already changes nothing.
UPDATE dbos_agent.workflows AS w
SET accepted_versions = array_append(w.accepted_versions, %(version)s), updated_at = now()
WHERE w.workflow_id = %(workflow_id)s
  AND w.status IN ('PENDING', 'SUSPENDED', 'ENQUEUED', 'DIVERGED')
  AND w.app_version IS DISTINCT FROM %(version)s
  AND NOT (%(version)s = ANY(w.accepted_versions))
  AND (SELECT count(*) FROM dbos_agent.steps AS s WHERE s.workflow_id = w.workflow_id)
      = %(steps)s
  AND coalesce((SELECT max(s.seq) FROM dbos_agent.steps AS s
                WHERE s.workflow_id = w.workflow_id), -1) = %(last_seq)s
RETURNING w.workflow_id;
-- == schedules ==

-- name: register_schedule
-- scope: many
-- A process that defines a schedule records it at launch, or brings the recorded
-- description up to date (the last process to launch describes it). A new schedule's
-- cursor starts at now: slots before its first registration run only by a backfill.
-- Whether it is paused, its cursor and its runs stay as they are.
INSERT INTO dbos_agent.schedules
    (name, workflow_name, slot_param, max_recovery_attempts, cron, timezone, catch_up,
     catch_up_window, overlap, executor_id, app_version, handled_through)
VALUES (%(name)s, %(workflow_name)s, %(slot_param)s, %(max_recovery_attempts)s, %(cron)s,
        %(timezone)s, %(catch_up)s, make_interval(secs => %(catch_up_window)s),
        %(overlap)s, %(executor_id)s, %(app_version)s, dbos_agent.now())
ON CONFLICT (name) DO UPDATE
    SET workflow_name = EXCLUDED.workflow_name, slot_param = EXCLUDED.slot_param,
        max_recovery_attempts = EXCLUDED.max_recovery_attempts, cron = EXCLUDED.cron,
        timezone = EXCLUDED.timezone, catch_up = EXCLUDED.catch_up,
        catch_up_window = EXCLUDED.catch_up_window, overlap = EXCLUDED.overlap,
        executor_id = EXCLUDED.executor_id, app_version = EXCLUDED.app_version,
        updated_at = now()
    WHERE (schedules.workflow_name, schedules.slot_param, schedules.max_recovery_attempts,
           schedules.cron, schedules.timezone, schedules.catch_up, schedules.catch_up_window,
           schedules.overlap, schedules.executor_id, schedules.app_version)
          IS DISTINCT FROM
          (EXCLUDED.workflow_name, EXCLUDED.slot_param, EXCLUDED.max_recovery_attempts,
           EXCLUDED.cron, EXCLUDED.timezone, EXCLUDED.catch_up, EXCLUDED.catch_up_window,
           EXCLUDED.overlap, EXCLUDED.executor_id, EXCLUDED.app_version);

-- name: list_schedule_cursors
-- scope: many
-- What the scheduler reads on each look at its schedules: the database clock, and per
-- schedule whether it is paused, its cursor and its buffered slot (a row with a NULL
-- name when none of them is recorded).
SELECT dbos_agent.now() AS now, s.name, s.paused, s.handled_through, s.buffered_slot
FROM (SELECT 1) AS one
LEFT JOIN dbos_agent.schedules AS s ON s.name = ANY(%(names)s);

-- name: lock_schedule
-- scope: many
-- The first statement of a slot's transaction: the schedule's row, locked, so that the
-- next statement (decide_schedule_slot) sees everything other processes committed
-- before it, their started workflows included.
SELECT name FROM dbos_agent.schedules WHERE name = %(name)s FOR UPDATE;

-- name: decide_schedule_slot
-- scope: many
-- Decide what becomes of one slot and record it, in lock_schedule's transaction:
-- 'fired' (the caller then inserts the slot's workflow, in the same transaction),
-- 'skipped' or 'buffered' (the overlap policy: an earlier run is unfinished, or a
-- slot already waits for it). Every one of these moves the cursor past the slot.
-- 'waiting' records nothing: with catch_up = 'all' and overlap 'skip' or
-- 'buffer_one' slots run in order, so while a run is unfinished the slot keeps its
-- turn behind the cursor and is decided again once the run ended. No row back:
-- nothing to do (the schedule is paused, or the slot was handled already). With
-- from_buffer the slot is the buffered one: it is fired once no run is unfinished,
-- and until then nothing changes.
WITH candidate AS (
    SELECT sc.name, sc.overlap, sc.buffered_slot,
           sc.catch_up = 'all' AND sc.overlap <> 'allow' AS in_order,
           sc.overlap <> 'allow' AND EXISTS (
               SELECT 1 FROM dbos_agent.workflows AS w
               WHERE w.workflow_id = sc.last_workflow_id
                 AND w.status IN ('PENDING', 'ENQUEUED', 'SUSPENDED')) AS busy
    FROM dbos_agent.schedules AS sc
    WHERE sc.name = %(name)s AND NOT sc.paused
      AND CASE WHEN %(from_buffer)s THEN sc.buffered_slot = %(slot)s
               ELSE sc.handled_through < %(slot)s END
), decision AS (
    SELECT name,
           CASE WHEN %(from_buffer)s THEN CASE WHEN busy THEN NULL ELSE 'fired' END
                WHEN overlap = 'allow' OR NOT (busy OR buffered_slot IS NOT NULL)
                    THEN 'fired'
                WHEN in_order THEN 'waiting'
                WHEN overlap = 'buffer_one' AND buffered_slot IS NULL THEN 'buffered'
                ELSE 'skipped' END AS outcome
    FROM candidate
), recorded AS (
    UPDATE dbos_agent.schedules AS sc
    SET handled_through = greatest(sc.handled_through, %(slot)s),
        last_slot = CASE WHEN d.outcome = 'fired' THEN %(slot)s ELSE sc.last_slot END,
        last_workflow_id = CASE WHEN d.outcome = 'fired' THEN %(workflow_id)s
                                ELSE sc.last_workflow_id END,
        buffered_slot = CASE WHEN d.outcome = 'buffered' THEN %(slot)s
                             WHEN %(from_buffer)s THEN NULL
                             ELSE sc.buffered_slot END,
        skipped_slots = sc.skipped_slots + CASE WHEN d.outcome = 'skipped' THEN 1 ELSE 0 END,
        last_skipped_slot = CASE WHEN d.outcome = 'skipped' THEN %(slot)s
                                 ELSE sc.last_skipped_slot END,
        updated_at = now()
    FROM decision AS d
    WHERE sc.name = d.name AND d.outcome IN ('fired', 'skipped', 'buffered')
)
SELECT outcome FROM decision WHERE outcome IS NOT NULL;

-- name: pass_schedule_slots
-- scope: many
-- The catch-up policy passes over the slots up to `slot` without running them (after
-- downtime: older than the window, or every missed one with catch_up = 'none'), from
-- the cursor the caller planned with (`after`): if another process moved it since,
-- nothing changes and the caller plans again. `passed` slots are counted (catch_up =
-- 'all', whose promise they fell out of). Returns a row when the cursor moved.
UPDATE dbos_agent.schedules
SET handled_through = %(slot)s,
    passed_slots = passed_slots + %(passed)s,
    last_passed_slot = CASE WHEN %(passed)s > 0 THEN %(slot)s ELSE last_passed_slot END,
    updated_at = now()
WHERE name = %(name)s AND NOT paused AND handled_through = %(after)s
  AND handled_through < %(slot)s
RETURNING true AS moved;

-- name: set_schedule_paused
-- scope: many
-- Pause or resume a schedule; returns whether it was paused before (no row: unknown).
-- Resuming moves the cursor to now: the slots that came due while it was paused are
-- not caught up.
WITH before AS (
    SELECT name, paused FROM dbos_agent.schedules WHERE name = %(name)s FOR UPDATE
)
UPDATE dbos_agent.schedules AS sc
SET paused = %(paused)s,
    handled_through = CASE WHEN before.paused AND NOT %(paused)s
                           THEN greatest(sc.handled_through, dbos_agent.now())
                           ELSE sc.handled_through END,
    updated_at = now()
FROM before
WHERE sc.name = before.name
RETURNING before.paused AS was_paused;

-- name: list_schedules
-- scope: many
-- Every schedule (or the one named), with the status of its latest run and the
-- database clock (for the next slot).
SELECT s.name, s.workflow_name, s.slot_param, s.max_recovery_attempts, s.cron, s.timezone,
       s.catch_up, extract(epoch FROM s.catch_up_window)::float8 AS catch_up_window,
       s.overlap, s.executor_id, s.app_version, s.paused, s.handled_through, s.last_slot,
       s.last_workflow_id, w.status AS last_status, s.buffered_slot, s.skipped_slots,
       s.last_skipped_slot, s.passed_slots, s.last_passed_slot, dbos_agent.now() AS now
FROM dbos_agent.schedules AS s
LEFT JOIN dbos_agent.workflows AS w ON w.workflow_id = s.last_workflow_id
WHERE %(name)s::text IS NULL OR s.name = %(name)s::text
ORDER BY s.name;

-- name: insert_slot_workflows
-- scope: many
-- A backfill: the workflows of many slots of one schedule in one statement, PENDING and
-- owned by the caller's session (which runs them) or by none (then any process that
-- takes over orphans runs them). A slot whose workflow exists is left alone: each
-- slot runs once. Returns the ids inserted.
INSERT INTO dbos_agent.workflows
    (workflow_id, name, status, inputs, executor_id, app_version, max_recovery_attempts,
     owner_key)
SELECT s.workflow_id, %(workflow_name)s, 'PENDING', s.inputs::json, %(executor_id)s,
       %(app_version)s, %(max_recovery_attempts)s, %(owner_key)s
FROM unnest(%(workflow_ids)s::text[], %(inputs)s::text[]) AS s(workflow_id, inputs)
ON CONFLICT (workflow_id) DO NOTHING
RETURNING workflow_id;

-- == application versions ==

-- name: summarize_app_versions
-- scope: many
-- Every application version (NULL: none) that has unfinished workflows or sessions
-- not dead: its unfinished workflows by status, how many of them other versions may
-- run too (accepted_versions, see may_run) and which versions those are, and its
-- sessions that are not among dead_sessions(), each with its code version, process
-- key and whether its lock is free (the caller also leaves out those whose process
-- it knows is gone: the database cannot see pids). One statement, so workflows and
-- sessions are read in one snapshot.
WITH unfinished AS (
    SELECT app_version, status, accepted_versions
    FROM dbos_agent.workflows
    WHERE status IN ('PENDING', 'ENQUEUED', 'SUSPENDED', 'DIVERGED')
), counts AS (
    SELECT u.app_version,
           count(*) FILTER (WHERE u.status = 'PENDING') AS pending,
           count(*) FILTER (WHERE u.status = 'ENQUEUED') AS enqueued,
           count(*) FILTER (WHERE u.status = 'SUSPENDED') AS suspended,
           count(*) FILTER (WHERE u.status = 'DIVERGED') AS diverged,
           count(*) FILTER (WHERE cardinality(u.accepted_versions) > 0) AS accepted_elsewhere,
           (SELECT coalesce(array_agg(DISTINCT a.version ORDER BY a.version), '{}')
            FROM unfinished AS o, unnest(o.accepted_versions) AS a(version)
            WHERE o.app_version IS NOT DISTINCT FROM u.app_version) AS accepted_by
    FROM unfinished AS u
    GROUP BY u.app_version
), live AS (
    SELECT e.app_version,
           json_agg(json_build_object('session_key', e.session_key,
                                      'executor_id', e.executor_id,
                                      'hostname', e.hostname,
                                      'pid', e.pid,
                                      'started_at', e.started_at,
                                      'heartbeat_at', e.heartbeat_at,
                                      'code_version', e.code_version,
                                      'process_key', e.process_key,
                                      'lock_free', e.lease_only OR e.session_key NOT IN (
                                          SELECT dbos_agent.locked_sessions()))
                    ORDER BY e.executor_id, e.session_key) AS sessions
    FROM dbos_agent.executors AS e
    WHERE e.session_key NOT IN (SELECT dbos_agent.dead_sessions())
    GROUP BY e.app_version
), versions AS (
    SELECT app_version FROM counts
    UNION
    SELECT app_version FROM live
)
SELECT v.app_version,
       coalesce(c.pending, 0) AS pending,
       coalesce(c.enqueued, 0) AS enqueued,
       coalesce(c.suspended, 0) AS suspended,
       coalesce(c.diverged, 0) AS diverged,
       coalesce(c.accepted_elsewhere, 0) AS accepted_elsewhere,
       coalesce(c.accepted_by, '{}') AS accepted_by,
       coalesce(l.sessions, '[]'::json)::text AS sessions
FROM versions AS v
LEFT JOIN counts AS c ON c.app_version IS NOT DISTINCT FROM v.app_version
LEFT JOIN live AS l ON l.app_version IS NOT DISTINCT FROM v.app_version
ORDER BY v.app_version NULLS FIRST;
