"""The engine's machinery: admitting, running and finishing workflow runs, their context,
plans and waits, suspension and waking, recovery, the process's engine and its
registry. Only the API modules of ``dbos_agent._engine`` import it; it imports none of
them (import-linter checks it, type imports included)."""
