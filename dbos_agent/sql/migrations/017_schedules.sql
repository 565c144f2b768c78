-- dbos_agent schema, version 17: cron schedules (@da.scheduled).
--
-- One row per schedule. Every process that defines it writes its description at
-- launch; the CLI reads it without the code, so the row holds what firing a slot from
-- the database alone needs: the workflow's name, the parameter that receives the slot,
-- its recovery limit, the cron text and the time zone.
--
-- handled_through is the schedule's cursor: every slot at or before it was dealt with
-- (fired, skipped, buffered, or passed over by the catch-up policy or a pause). A slot
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
    CONSTRAINT schedules_last_run_whole CHECK ((last_slot IS NULL) = (last_workflow_id IS NULL))
);
