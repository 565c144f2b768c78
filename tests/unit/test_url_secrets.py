"""A connection string's secrets never show, whatever its form: the parts that read,
check, show and scrub it (no database; ``tests/process/test_url_secrets.py`` runs the library,
the CLI and the server on the same forms)."""

from __future__ import annotations

import psycopg
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from psycopg.conninfo import conninfo_to_dict

import dbos_agent as da
from dbos_agent._storage.dsn import postgres_url, redact_url, scrub
from dbos_agent._storage.redaction import secrets_of
from tests.support.secret_forms import FORMS, Secret, leaks, secrets, texts_of

FAST = settings(max_examples=250, deadline=None, database=None)


def _libpq_error(dsn: str) -> str:
    """What psycopg says of ``dsn`` when it cannot parse it (it quotes pieces of it)."""
    try:
        conninfo_to_dict(dsn)
    except psycopg.Error as exc:
        return f"{exc!r} {exc.__context__!r}"
    return ""


@FAST
@given(secret=secrets(), form=st.sampled_from(sorted(FORMS)))
def test_no_piece_of_a_password_is_shown_or_left_in_a_scrubbed_text(
    secret: Secret, form: str
) -> None:
    dsn = FORMS[form](secret.text)
    assert not leaks(secret, redact_url(dsn)), redact_url(dsn)
    said = f"cannot connect to {dsn}: {_libpq_error(dsn)} ({dsn.strip()!r})"
    assert not leaks(secret, scrub(said, dsn)), scrub(said, dsn)
    try:
        read = postgres_url(dsn)
    except (da.errors.InvalidDatabaseUrlError, da.errors.UnsupportedDatabaseError) as exc:
        assert not leaks(secret, texts_of(exc)), texts_of(exc)
        assert exc.__context__ is None and exc.__cause__ is None
        return
    # Read as meant: its secret is where libpq reads one, and scrub() finds it there.
    settings_read = conninfo_to_dict(read)
    assert not leaks(secret, *(str(v) for k, v in settings_read.items() if "password" not in k))
    assert form != "PGPASSWORD" or "password" not in settings_read
    assert not leaks(secret, scrub(" ".join(map(str, settings_read.values())), dsn))


@pytest.mark.parametrize(
    ("dsn", "shown"),
    [
        ("postgresql://app:Zq9Secret?M15@127.0.0.1:1/app", "postgresql://app:***@127.0.0.1:1/app"),
        ("POSTGRESQL://app:pw@h:1,h2:2/db", "POSTGRESQL://app:***@h:1,h2:2/db"),
        ("postgresql://app:pw@h/db?application_name=x@y", "postgresql://app:***@h/db?application_name=x@y"),
        # the password's rest may be the query's secret: '@Qz0000?password=' masked whole
        ("postgresql://app:@Qz0000?password=@[::1:1/app", "postgresql://app:***"),
        ("postgresql://app@h/db password=pw x", "postgresql://app@h/db password=***"),
        ("postgresql://h/db?password=a&b&sslmode=require", "postgresql://h/db?password=***&sslmode=require"),
        ("host=h password='a b' port=5432", "host=h password=*** port=5432"),
        ("host=h password=a b port=5432", "host=h password=*** port=5432"),
        ("host=h dbname=postgresql://u:pw@h/db", "host=h dbname=postgresql://u:***@h/db"),
        ("host=h password=a\\ b sslpassword='c' oauth_client_secret=d",
         "host=h password=*** sslpassword=*** oauth_client_secret=***"),
    ],
)  # fmt: skip
def test_what_is_shown_of_a_connection_string(dsn: str, shown: str) -> None:
    assert redact_url(dsn) == shown


@pytest.mark.parametrize(
    ("dsn", "problem"),
    [
        ("postgresql://app:Zq9 Secret@127.0.0.1:1/app", "a space that is not percent-encoded"),
        ("postgresql://app:Zq9Secret%zz@127.0.0.1:1/app", "a '%' that starts no %XX escape"),
        ("postgresql://app@127.0.0.1:1/app password=Zq9Secret", "a space"),
        ("postgresql://app:Zq9Secret@[::1:1/app", "an IPv6 address without its ']'"),
        ("postgresql://app:Zq9/Secret@127.0.0.1:1/app", "a port that is not a number"),
        ("postgresql://app:12/Zq9Secret@127.0.0.1:1/app", "an '@' after its user info"),
        ("postgresql://app:Zq9@Secret@127.0.0.1:1/app", "an '@' in a host name"),
        ("host=127.0.0.1 password=Zq9 Secret", "a word that is not key=value"),
    ],
)
def test_a_string_libpq_cannot_read_as_meant_is_refused_unshown(dsn: str, problem: str) -> None:
    with pytest.raises(da.errors.InvalidDatabaseUrlError) as refused:
        postgres_url(dsn)
    said = str(refused.value)
    assert problem in said and "PGPASSFILE" in said, said
    assert "Zq9" not in texts_of(refused.value) and "Secret" not in said
    assert refused.value.__context__ is None
    assert isinstance(refused.value, da.errors.ConfigurationError | ValueError)


@pytest.mark.parametrize(
    ("dsn", "read"),
    [
        ("  POSTGRESQL://app:pw@h/db\n", "postgresql://app:pw@h/db"),
        ("Postgres+Psycopg2://app:pw@h/db", "postgres://app:pw@h/db"),
        ("postgresql://app:a?b#c:d@h:1/db", "postgresql://app:a?b#c:d@h:1/db"),
        ("postgresql://h:5432/db?user=me@corp", "postgresql://h:5432/db?user=me@corp"),
        ("host=h password='a b'", "host=h password='a b'"),
    ],
)
def test_what_libpq_reads_as_meant_is_taken_as_it_is(dsn: str, read: str) -> None:
    assert postgres_url(dsn) == read


def test_the_secrets_of_a_string_include_each_reading_and_its_decoded_form() -> None:
    found = secrets_of("postgresql://app:a%40b@c@h/db?password=x&y&sslmode=require")
    assert {"a%40b", "a@b", "a%40b@c", "a@b@c", "x&y"} <= set(found)
    assert found == sorted(found, key=len, reverse=True)
