"""A URL declared pooled (``?pooler=transaction``): read, kept where the URL is handed on,
taken out before libpq reads it; and what needs a direct connection refused on it before
anything connects.

No Postgres here (``pytest tests/unit``)."""

from __future__ import annotations

import pytest

from dbos_agent._storage.database import SystemDatabase
from dbos_agent._storage.dsn import postgres_url, split_pooler
from dbos_agent.errors import InvalidDatabaseUrlError, PoolerError

POOLED = "postgresql://app:s3cret@pooler.example:6543/postgres?pooler=transaction"
DIRECT = "postgresql://app:s3cret@db.example:5432/postgres"


@pytest.mark.parametrize(
    ("given", "bare"),
    [
        (POOLED, "postgresql://app:s3cret@pooler.example:6543/postgres"),
        (
            "postgresql://h/db?sslmode=require&pooler=Transaction&application_name=a",
            "postgresql://h/db?sslmode=require&application_name=a",
        ),
        ("host=h pooler=transaction dbname=db", "host=h dbname=db"),
        ("host=h dbname=db pooler='transaction'", "host=h dbname=db"),
    ],
)
def test_the_pooler_parameter_is_read_and_taken_out(given: str, bare: str) -> None:
    assert split_pooler(given) == (bare, "transaction")
    assert postgres_url(given) == given.strip()  # checked, and handed on as it is


def test_a_url_without_it_is_direct() -> None:
    assert split_pooler(DIRECT) == (DIRECT, None)


def test_another_mode_is_refused_saying_what_is_known() -> None:
    with pytest.raises(InvalidDatabaseUrlError, match="only pooler=transaction is known"):
        postgres_url("postgresql://h/db?pooler=session")


def test_a_pooled_database_has_no_direct_connection_and_refuses_to_migrate() -> None:
    db = SystemDatabase(POOLED, pool_size=1)
    assert db.pooled and db.direct is None
    assert db.url == POOLED  # what another process of the library is handed
    with pytest.raises(PoolerError, match="migrations need a direct connection") as refused:
        db.migrate()
    assert "dbos-agent migrate --database-url DIRECT_URL" in str(refused.value)
    assert "s3cret" not in str(refused.value)


def test_a_session_url_gives_it_one() -> None:
    db = SystemDatabase(POOLED, pool_size=1, session_url=DIRECT)
    assert db.direct is not None and not db.direct.pooled
    assert SystemDatabase(DIRECT, pool_size=1).direct is not None


def test_a_pooled_session_url_is_refused_naming_the_fix() -> None:
    with pytest.raises(PoolerError, match="give the server's direct URL") as refused:
        SystemDatabase(POOLED, pool_size=1, session_url=POOLED)
    assert "s3cret" not in str(refused.value)
