"""Every Postgres advisory lock dbos_agent takes, in one place.

Advisory locks share one key space per database with the application's own, so the
library keeps to two classes of two-part keys and one single key, all listed here:

* ``(SESSION_LOCK_CLASS, session_key)``, held by an executor session on its dedicated
  connection for as long as it lives (session.py). Other processes read it from
  ``pg_locks``: the SQL function ``dbos_agent.locked_sessions()`` (migration 006) names
  the same class, and ``tests/unit/test_locks.py`` keeps the two equal.
* ``(QUEUE_LOCK_CLASS, hashtext(queue_name))``, taken for one dequeue transaction, so
  that a queue's limits are counted and applied atomically across workers (queues.py).
* ``MIGRATION_LOCK_KEY``, taken for the transaction that applies migrations, so that
  processes starting together apply them once (migrations.py).
"""

from __future__ import annotations

SESSION_LOCK_CLASS = 233710
QUEUE_LOCK_CLASS = 233711
#: hashtext-style single key for the migration lock ("dbos_agent.migrate").
MIGRATION_LOCK_KEY = 0x0DB05A6E
