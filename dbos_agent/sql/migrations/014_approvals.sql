-- dbos_agent schema, version 14: approvals bound to the exact tool call.
--
-- A workflow asking a human (da.request_approval) records what it asks at the
-- position of its request step: the tool, its arguments and their digest. A
-- decision names the workflow, that position and the digest, and is taken once:
-- decide_approval changes a PENDING request of a waiting workflow whose digest
-- matches, and in the same statement sends the decision to the workflow (a message
-- on the request's own topic, received exactly once by its recv step).

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
