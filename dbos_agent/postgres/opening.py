"""Opening the system database: the one way every front end does it, under one policy.

Only the application changes the schema: ``launch()`` (and so ``dbos-agent worker``)
and ``dbos-agent migrate`` open with ``migrate=True``. Every operator front end
(``Client`` unless ``Client(url, migrate=True)``, the CLI's other commands,
``dbos-agent serve``) opens with ``migrate=False``: it alters nothing, and a missing or
older schema is a :class:`~dbos_agent.errors.SchemaNotMigratedError` that names the
command to run; a newer one is a :class:`~dbos_agent.errors.SchemaVersionError` for
everyone (upgrade dbos_agent). Likewise only what may migrate may ``create`` the
embedded database: anything else run in the wrong folder would start an empty server
and then report that nothing is there.
"""

from __future__ import annotations

from pathlib import Path
from typing import TypedDict, Unpack

from .._storage.database import MIGRATE_DIRECTLY, SystemDatabase
from .._storage.dsn import URL_ENV, configured_session_url, configured_url
from .._storage.sql_files import migrations
from ..errors import NoDatabaseError, PoolerError, SchemaNotMigratedError, SchemaVersionError
from .embedded import DEFAULT_DIRECTORY, embedded_database_url

__all__ = ["DatabaseOptions", "connect_system_database", "open_system_database"]

#: How operators are told to bring a schema up to date.
MIGRATE_COMMAND = "dbos-agent migrate"


class DatabaseOptions(TypedDict, total=False):
    """The connection options of :class:`SystemDatabase` a front end may choose."""

    pool_size: int
    outage_timeout: float
    max_checkpoint_bytes: int
    application_name: str
    warn_on_outage: bool
    #: A direct URL beside a pooled database URL (default: ``$DBOS_AGENT_SESSION_URL`` when
    #: migrating, else none); see ``SystemDatabase``.
    session_url: str | None


def open_system_database(
    database_url: str | None = None,
    *,
    create: bool,
    migrate: bool,
    **options: Unpack[DatabaseOptions],
) -> SystemDatabase:
    """The system database, open, its schema the one this library uses.

    ``database_url`` is the URL given, else ``$DBOS_AGENT_DATABASE_URL``, else the
    embedded Postgres under ``./.dbos_agent/`` (started if need be; initialised only when
    ``create``, else NoDatabaseError). With ``migrate`` the missing migrations are
    applied; without, the schema is only checked (SchemaNotMigratedError naming
    ``dbos-agent migrate``). Closed again if anything fails.
    """
    db, named = _connect(database_url, create, options, migrating=migrate)
    try:
        if migrate and db.direct is not None:
            db.migrate()
        else:
            _require_current_schema(db, named=named, migrating=migrate)
    except BaseException:
        db.close()
        raise
    return db


def connect_system_database(
    database_url: str | None = None, *, create: bool, **options: Unpack[DatabaseOptions]
) -> SystemDatabase:
    """The system database, open, its schema not looked at: the first half of
    :func:`open_system_database`, for ``dbos-agent migrate``, which reports the version
    it found before migrating."""
    return _connect(database_url, create, options, migrating=True)[0]


def _connect(
    database_url: str | None, create: bool, options: DatabaseOptions, *, migrating: bool
) -> tuple[SystemDatabase, bool]:
    """The database open, and whether its URL was named (else it is the embedded one).
    What migrates reads ``$DBOS_AGENT_SESSION_URL`` when no session URL is given."""
    named = configured_url(database_url)
    if migrating:
        options["session_url"] = configured_session_url(options.get("session_url"))
    db = SystemDatabase(named or _embedded_url(create=create), **options)
    try:
        db.open()
    except BaseException:
        db.close()
        raise
    return db, named is not None


def _embedded_directory() -> Path:
    return Path(DEFAULT_DIRECTORY).expanduser().resolve()


def _embedded_url(*, create: bool) -> str:
    """The embedded database's URL, its server started if need be (and its folder
    initialised, when ``create``)."""
    directory = _embedded_directory()
    if not create and not directory.is_dir():
        raise NoDatabaseError(
            f"no database: there is no embedded Postgres in {directory}/ (the first launch() "
            f"or `{MIGRATE_COMMAND}` in a folder makes one there); run this where your app "
            f"runs, or pass --database-url URL or set ${URL_ENV}"
        )
    try:
        return embedded_database_url(directory)
    except Exception as exc:  # no server binaries, a broken data directory, ...
        raise NoDatabaseError(f"cannot start the embedded Postgres in {directory}/: {exc}") from exc


def _require_current_schema(db: SystemDatabase, *, named: bool, migrating: bool = False) -> None:
    """Refuse a schema this version does not match, saying what to run (``migrating``:
    the caller would have migrated, but its URL goes through a pooler)."""
    known = migrations()[-1][0]
    found = db.schema_version()
    if found == known:
        return
    if found > known:
        raise SchemaVersionError(
            f"the database at {db.redacted_url} has dbos_agent schema version {found}, "
            f"newer than this dbos_agent knows ({known}); upgrade dbos_agent"
        )
    if db.pooled:
        has = f"dbos_agent schema version {found}" if found else "no dbos_agent schema"
        error = PoolerError if migrating else SchemaNotMigratedError
        raise error(
            f"the database at {db.redacted_url} has {has}, this dbos_agent needs {known}, "
            f"and migrations do not go through a pooler. {MIGRATE_DIRECTLY}"
        )
    if named:
        command = f"`{MIGRATE_COMMAND} --database-url {db.redacted_url}`"
    else:
        command = f"`{MIGRATE_COMMAND}` in {_embedded_directory().parent}"
    if found == 0:
        has, then = "no dbos_agent schema", "to create it"
    else:
        has, then = f"dbos_agent schema version {found}, this dbos_agent needs {known}", "first"
    password = " (the password in place of ***, or in $PGPASSWORD)" if "***" in command else ""
    raise SchemaNotMigratedError(
        f"the database at {db.redacted_url} has {has}; run {command} {then}{password}: only "
        f"the application's launch() and {MIGRATE_COMMAND} change the schema"
    )
