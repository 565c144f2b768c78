-- dbos_agent schema, version 1: the workflow table and the append-only step log.
--
-- Everything lives in its own schema so that it never collides with the
-- application's tables. Correctness rules live here as constraints; the
-- Python side only ever issues single guarded statements against them.

CREATE SCHEMA IF NOT EXISTS dbos_agent;

CREATE TABLE dbos_agent.workflows (
    workflow_id           text        PRIMARY KEY CHECK (workflow_id <> ''),
    name                  text        NOT NULL,
    status                text        NOT NULL CHECK (status IN (
                              'PENDING', 'SUCCESS', 'ERROR', 'CANCELLED', 'ENQUEUED',
                              'MAX_RECOVERY_ATTEMPTS_EXCEEDED', 'IN_DOUBT')),
    -- {"param": value, ...}: the bound arguments, JSON through pydantic.
    inputs                jsonb       NOT NULL,
    output                jsonb,
    -- {"type": "module.Class", "message": "...", "args": [...]}
    error                 jsonb,
    executor_id           text        NOT NULL,
    app_version           text,
    recovery_attempts     integer     NOT NULL DEFAULT 0 CHECK (recovery_attempts >= 0),
    max_recovery_attempts integer     NOT NULL CHECK (max_recovery_attempts >= 0),
    created_at            timestamptz NOT NULL DEFAULT now(),
    updated_at            timestamptz NOT NULL DEFAULT now(),
    finished_at           timestamptz,
    -- A finished workflow carries exactly the outcome its status says.
    CONSTRAINT workflows_outcome_matches_status CHECK (
        (status = 'SUCCESS' AND error IS NULL AND finished_at IS NOT NULL)
        OR (status IN ('ERROR', 'CANCELLED', 'MAX_RECOVERY_ATTEMPTS_EXCEEDED', 'IN_DOUBT')
            AND output IS NULL)
        OR (status IN ('PENDING', 'ENQUEUED') AND output IS NULL AND error IS NULL)
    )
);

-- Recovery at start: "pending workflows of executor X", oldest first.
CREATE INDEX workflows_pending_by_executor
    ON dbos_agent.workflows (executor_id, created_at)
    WHERE status = 'PENDING';
-- Listing by status, by name, and by time.
CREATE INDEX workflows_by_status ON dbos_agent.workflows (status, created_at);
CREATE INDEX workflows_by_name ON dbos_agent.workflows (name, created_at);
CREATE INDEX workflows_by_created ON dbos_agent.workflows (created_at);

-- The step log. One row per step position, and a result is written once and
-- never changed: the primary key makes "two processes both record step N"
-- impossible. A non-idempotent step first writes an intent row (status
-- PENDING, with its inputs) before it runs; its result then fills that row,
-- once. An intent without a result after a crash means the step is in doubt.
-- No foreign key to workflows: the insert is guarded by the workflow's
-- status in the same statement (see record_step in queries.sql), which also
-- checks existence, and an FK would lock the parent row on every step.
CREATE TABLE dbos_agent.steps (
    workflow_id text        NOT NULL,
    seq         integer     NOT NULL CHECK (seq >= 0),
    name        text        NOT NULL,
    status      text        NOT NULL CHECK (status IN ('PENDING', 'SUCCESS', 'ERROR')),
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
    )
);
