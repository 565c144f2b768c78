-- Every statement dbos_agent sends, named. storage/queries.py loads this file;
-- each query starts at a "-- name: verb_noun" line and runs to the next one.
-- Parameters use psycopg's %(name)s style. JSON travels as text and is cast
-- to jsonb here, so Python never parses a checkpoint twice.

-- name: insert_workflow
-- Record a new PENDING workflow; if the id exists already, return that row
-- instead (idempotent start). One round trip either way.
WITH inserted AS (
    INSERT INTO dbos_agent.workflows
        (workflow_id, name, status, inputs, executor_id, app_version, max_recovery_attempts)
    VALUES
        (%(workflow_id)s, %(name)s, 'PENDING', %(inputs)s::jsonb, %(executor_id)s,
         %(app_version)s, %(max_recovery_attempts)s)
    ON CONFLICT (workflow_id) DO NOTHING
    RETURNING workflow_id
)
SELECT (SELECT count(*) FROM inserted) = 1 AS inserted,
       w.name, w.status, w.inputs::text, w.output::text, w.error::text
FROM (SELECT 1) AS one
LEFT JOIN dbos_agent.workflows AS w ON w.workflow_id = %(workflow_id)s;

-- name: record_step
-- Record step `seq`'s result: the checkpoint. Only while the workflow is
-- PENDING, and only if that position holds nothing or this step's own intent
-- (a result is written once, never overwritten). Returns whether this call
-- wrote, the workflow's status, and the row that was there before: the loser
-- of a race adopts the recorded result.
WITH workflow AS (
    SELECT status FROM dbos_agent.workflows WHERE workflow_id = %(workflow_id)s
), written AS (
    INSERT INTO dbos_agent.steps
        (workflow_id, seq, name, status, output, error, attempts, started_at)
    SELECT %(workflow_id)s, %(seq)s, %(name)s, %(status)s, %(output)s::jsonb,
           %(error)s::jsonb, %(attempts)s, %(started_at)s
    WHERE (SELECT status FROM workflow) = 'PENDING'
    ON CONFLICT (workflow_id, seq) DO UPDATE
        SET status = EXCLUDED.status, output = EXCLUDED.output, error = EXCLUDED.error,
            attempts = EXCLUDED.attempts, started_at = EXCLUDED.started_at,
            finished_at = now()
        WHERE steps.status = 'PENDING' AND steps.name = EXCLUDED.name
    RETURNING seq
)
SELECT (SELECT count(*) FROM written) = 1 AS written,
       (SELECT status FROM workflow) AS workflow_status,
       s.name, s.status, s.output::text, s.error::text, s.attempts
FROM (SELECT 1) AS one
LEFT JOIN dbos_agent.steps AS s ON s.workflow_id = %(workflow_id)s AND s.seq = %(seq)s;

-- name: record_step_intent
-- Before a non-idempotent step runs: durably say "about to run step `seq`
-- with these inputs". Returns whether the intent was written and whatever
-- already held the position (a concurrent run's intent or result).
WITH workflow AS (
    SELECT status FROM dbos_agent.workflows WHERE workflow_id = %(workflow_id)s
), written AS (
    INSERT INTO dbos_agent.steps
        (workflow_id, seq, name, status, inputs, attempts, started_at, finished_at)
    SELECT %(workflow_id)s, %(seq)s, %(name)s, 'PENDING', %(inputs)s::jsonb, 1, now(), NULL
    WHERE (SELECT status FROM workflow) = 'PENDING'
    ON CONFLICT (workflow_id, seq) DO NOTHING
    RETURNING seq
)
SELECT (SELECT count(*) FROM written) = 1 AS written,
       (SELECT status FROM workflow) AS workflow_status,
       s.name, s.status, s.output::text, s.error::text, s.attempts
FROM (SELECT 1) AS one
LEFT JOIN dbos_agent.steps AS s ON s.workflow_id = %(workflow_id)s AND s.seq = %(seq)s;

-- name: resolve_step_intent
-- An operator settles an in-doubt step by giving it the result it had.
UPDATE dbos_agent.steps
SET status = 'SUCCESS', output = %(output)s::jsonb, finished_at = now()
WHERE workflow_id = %(workflow_id)s AND seq = %(seq)s AND status = 'PENDING'
RETURNING seq;

-- name: delete_step_intent
-- An operator allows an in-doubt step to run again: its intent is removed
-- (a recorded result is never removed).
DELETE FROM dbos_agent.steps
WHERE workflow_id = %(workflow_id)s AND seq = %(seq)s AND status = 'PENDING'
RETURNING seq;

-- name: reopen_in_doubt_workflow
-- After its in-doubt step is settled the workflow is PENDING again.
UPDATE dbos_agent.workflows
SET status = 'PENDING', error = NULL, finished_at = NULL, updated_at = now()
WHERE workflow_id = %(workflow_id)s AND status = 'IN_DOUBT'
RETURNING name, inputs::text;

-- name: load_steps
-- The whole log of one workflow, for replay: one query, not one per step.
SELECT workflow_id, seq, name, status, output::text, error::text, attempts
FROM dbos_agent.steps
WHERE workflow_id = %(workflow_id)s
ORDER BY seq;

-- name: load_steps_of_many
-- The logs of a batch of workflows being recovered, in one query.
SELECT workflow_id, seq, name, status, output::text, error::text, attempts
FROM dbos_agent.steps
WHERE workflow_id = ANY(%(workflow_ids)s)
ORDER BY workflow_id, seq;

-- name: finish_workflow
-- Record a PENDING workflow's outcome. Guarded: a workflow that some other
-- run finished (or an operator cancelled) keeps its outcome, and the caller
-- gets that outcome back instead.
WITH updated AS (
    UPDATE dbos_agent.workflows
    SET status = %(status)s, output = %(output)s::jsonb, error = %(error)s::jsonb,
        updated_at = now(), finished_at = now()
    WHERE workflow_id = %(workflow_id)s AND status = 'PENDING'
    RETURNING status, output, error
)
SELECT true AS updated, status, output::text, error::text FROM updated
UNION ALL
SELECT false, status, output::text, error::text
FROM dbos_agent.workflows
WHERE workflow_id = %(workflow_id)s AND NOT EXISTS (SELECT 1 FROM updated);

-- name: get_workflow
SELECT workflow_id, name, status, inputs::text, output::text, error::text, executor_id,
       app_version, recovery_attempts, max_recovery_attempts, created_at, updated_at,
       finished_at
FROM dbos_agent.workflows
WHERE workflow_id = %(workflow_id)s;

-- name: list_workflows
-- Newest first. A NULL filter matches everything.
SELECT workflow_id, name, status, inputs::text, output::text, error::text, executor_id,
       app_version, recovery_attempts, max_recovery_attempts, created_at, updated_at,
       finished_at
FROM dbos_agent.workflows
WHERE (%(status)s::text IS NULL OR status = %(status)s::text)
  AND (%(name)s::text IS NULL OR name = %(name)s::text)
  AND (%(executor_id)s::text IS NULL OR executor_id = %(executor_id)s::text)
  AND (%(created_after)s::timestamptz IS NULL OR created_at >= %(created_after)s::timestamptz)
  AND (%(created_before)s::timestamptz IS NULL OR created_at < %(created_before)s::timestamptz)
ORDER BY created_at DESC, workflow_id DESC
LIMIT %(limit)s;

-- name: list_steps
SELECT workflow_id, seq, name, status, output::text, error::text, attempts, started_at,
       finished_at, inputs::text
FROM dbos_agent.steps
WHERE workflow_id = %(workflow_id)s
ORDER BY seq;

-- name: claim_pending_for_recovery
-- Take the next page of this executor's PENDING workflows whose functions
-- this process knows, counting one recovery attempt on each. A workflow that
-- has used up its attempts is dead-lettered here, in the same statement,
-- instead of being handed back. Pages by (created_at, workflow_id).
WITH page AS (
    SELECT workflow_id
    FROM dbos_agent.workflows
    WHERE status = 'PENDING'
      AND executor_id = %(executor_id)s
      AND name = ANY(%(names)s)
      AND NOT (workflow_id = ANY(%(skip_ids)s))
      AND (created_at, workflow_id) > (%(after_created_at)s, %(after_workflow_id)s)
    ORDER BY created_at, workflow_id
    LIMIT %(limit)s
    FOR UPDATE SKIP LOCKED
)
UPDATE dbos_agent.workflows AS w
SET recovery_attempts = w.recovery_attempts + 1,
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

-- name: count_unrecoverable_pending
-- PENDING workflows of this executor whose function this process does not
-- know (renamed, deleted, or not imported): left alone, reported by name.
SELECT name, count(*) AS pending
FROM dbos_agent.workflows
WHERE status = 'PENDING'
  AND executor_id = %(executor_id)s
  AND NOT (name = ANY(%(names)s))
GROUP BY name
ORDER BY name;
