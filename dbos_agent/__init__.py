"""dbos_agent: durable execution for AI agents on Postgres."""
