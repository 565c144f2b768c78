"""The application of the partitioned-queue worker test, run by
`python -m dbos_agent.worker --app tests.apps.partition_app`.

Each workflow's step records its stay in the table ``partition_entries`` of the same
database (entered when it starts, left when it ends, both on the database's clock), so
the test counts from outside how many of a tenant's workflows ran at once, and where.
"""

from __future__ import annotations

import os
import time

import psycopg

import dbos_agent as da

STEP_SECONDS = float(os.environ.get("PARTITION_APP_STEP_SECONDS", "0.1"))

#: Per tenant: two at once over all workers, one at once on each worker.
tenants = da.Queue("partition-tests", concurrency=2, worker_concurrency=1, partitioned=True)


@da.step
def work(tenant: str) -> str:
    url = os.environ["DBOS_AGENT_DATABASE_URL"]
    wid = da.current_workflow_id()
    with psycopg.connect(url, autocommit=True) as conn:
        row = conn.execute(
            "INSERT INTO partition_entries (workflow_id, tenant, pid, entered_at)"
            " VALUES (%s, %s, %s, clock_timestamp()) RETURNING id",
            (wid, tenant, os.getpid()),
        ).fetchone()
        assert row is not None
        time.sleep(STEP_SECONDS)
        conn.execute(
            "UPDATE partition_entries SET left_at = clock_timestamp() WHERE id = %s", (row[0],)
        )
    return tenant


@da.durable_workflow
def tenant_job(tenant: str) -> str:
    return work(tenant)
