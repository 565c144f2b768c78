-- dbos_agent schema, version 15: when the workflow's latest run began.
--
-- Every statement that gives a workflow to a session to run (a start, a take-over,
-- recovery, a wake-up, a dequeue, a resume, a resolved doubt) sets run_started_at.
-- A step recorded before it was replayed by that run (or will be); one recorded
-- after it ran live in it: the dashboard and the API tell them apart this way.

ALTER TABLE dbos_agent.workflows
    ADD COLUMN run_started_at timestamptz NOT NULL DEFAULT now();
