-- dbos_agent schema, version 25: what catch_up = 'all' passed over, and each session's
-- code version.
--
-- With catch_up = 'all' every missed slot within the catch-up window runs (in order, one
-- after the previous run ended, unless overlap = 'allow'); a slot that falls out of the
-- window before its turn (or beyond the 10,000 latest of it) is passed over without a
-- run. Those are counted here, next to the slots the overlap policy skipped, so that no
-- slot is dropped silently.
--
-- A session records the code version of its process (a digest of the durable code, see
-- registry.code_version) beside its application version: processes launched without an
-- application version, or several builds of one version, are told apart by
-- `dbos-agent versions`. NULL: a session registered before this migration.

ALTER TABLE dbos_agent.schedules
    ADD COLUMN passed_slots     bigint NOT NULL DEFAULT 0 CHECK (passed_slots >= 0),
    ADD COLUMN last_passed_slot timestamptz;

ALTER TABLE dbos_agent.executors ADD COLUMN code_version text;
