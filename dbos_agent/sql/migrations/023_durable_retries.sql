-- dbos_agent schema, version 23: a step waits out a failing dependency durably.
--
-- An attempt that fails with a transient error (the model API overloaded, an MCP
-- server that is down, an error the step's retry_on/retry_if retry) and whose next
-- attempt is further away than a moment does not record the error: the step's row
-- says RETRYING, with the last error, the attempts so far and `retry`
--   {"since": epoch seconds (database clock) of its first attempt,
--    "next_at": epoch seconds of its next attempt,
--    "waiting_for": what it waits for, as operators read it ("the model API")},
-- and the workflow, when its run may give it up, is SUSPENDED 'retry' (wait_name:
-- the step's name) until next_at: no thread, no session, woken by any process that
-- can run it, as a sleep is. The step is recorded (SUCCESS, or the ERROR past its
-- horizon) over that row, once. A RETRYING row is not an intent: no attempt runs
-- while it says RETRYING, so a crash then is never in doubt.

ALTER TABLE dbos_agent.steps
    ADD COLUMN retry jsonb,
    DROP CONSTRAINT steps_status_check,
    ADD CONSTRAINT steps_status_check
        CHECK (status IN ('PENDING', 'SUCCESS', 'ERROR', 'RETRYING')),
    DROP CONSTRAINT steps_outcome_matches_status,
    ADD CONSTRAINT steps_outcome_matches_status CHECK (
        (status = 'SUCCESS' AND error IS NULL AND finished_at IS NOT NULL)
        OR (status = 'ERROR' AND error IS NOT NULL AND output IS NULL
            AND finished_at IS NOT NULL)
        OR (status = 'PENDING' AND output IS NULL AND error IS NULL AND finished_at IS NULL)
        OR (status = 'RETRYING' AND output IS NULL AND error IS NOT NULL
            AND finished_at IS NULL)
    ),
    ADD CONSTRAINT steps_retry_when_retrying CHECK (
        (status = 'RETRYING') = (retry IS NOT NULL)
        AND (retry IS NULL OR (jsonb_typeof(retry -> 'since') = 'number'
                               AND jsonb_typeof(retry -> 'next_at') = 'number'))
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

ALTER TABLE dbos_agent.workflows
    DROP CONSTRAINT workflows_wait_kind_check,
    ADD CONSTRAINT workflows_wait_kind_check
        CHECK (wait_kind IN ('sleep', 'recv', 'event', 'child', 'retry')),
    DROP CONSTRAINT workflows_suspended_waits,
    ADD CONSTRAINT workflows_suspended_waits CHECK (
        (status = 'SUSPENDED') = (wait_kind IS NOT NULL)
        AND (wait_kind NOT IN ('sleep', 'retry') OR wake_at IS NOT NULL)
        AND (wait_kind NOT IN ('recv', 'event', 'retry') OR wait_name IS NOT NULL)
        AND (wait_kind NOT IN ('event', 'child') OR wait_target IS NOT NULL)
    );
