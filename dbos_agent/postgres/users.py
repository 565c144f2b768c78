"""The unprivileged user PostgreSQL runs as when this process is root (it refuses to run as
root), and how server commands run as that user."""

from __future__ import annotations

import logging
import os
import pwd
import stat
import subprocess
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

logger = logging.getLogger(__name__)

_SERVICE_USERS = ("postgres", "nobody")


@dataclass(frozen=True)
class ServiceUser:
    """Unprivileged account the server runs as when we are root."""

    name: str
    uid: int
    gid: int
    groups: frozenset[int]


def service_user() -> ServiceUser | None:
    """The user to run server commands as: None (ourselves) unless we are root."""
    if os.geteuid() != 0:
        return None
    for name in _SERVICE_USERS:
        try:
            entry = pwd.getpwnam(name)
        except KeyError:
            continue
        groups = frozenset([entry.pw_gid, *os.getgrouplist(name, entry.pw_gid)])
        return ServiceUser(name, entry.pw_uid, entry.pw_gid, groups)
    raise RuntimeError(
        "running as root, but PostgreSQL refuses to run as root and neither a 'postgres' nor "
        "a 'nobody' user exists to run it as; create a 'postgres' user or run as non-root"
    )


def class_bits(st: os.stat_result, user: ServiceUser) -> tuple[int, int]:
    """(rwx bits that apply to `user`, mode bit granting x to that class): owner/group/other."""
    if st.st_uid == user.uid:
        return (st.st_mode >> 6) & 0o7, stat.S_IXUSR
    if st.st_gid in user.groups:
        return (st.st_mode >> 3) & 0o7, stat.S_IXGRP
    return st.st_mode & 0o7, stat.S_IXOTH


def blocked_dirs(path: Path, user: ServiceUser) -> list[Path]:
    """Directories on the way from / to `path` (inclusive) that `user` cannot traverse."""
    path = path.resolve()
    return [d for d in (*reversed(path.parents), path) if not class_bits(d.stat(), user)[0] & 1]


def make_traversable(path: Path, user: ServiceUser) -> None:
    """Add only the search (x) bit where `user` is blocked; never read, so listings stay private."""
    for d in blocked_dirs(path, user):
        st = d.stat()
        bit = class_bits(st, user)[1]
        logger.warning(
            "making %s traversable (chmod +x, no read) so PostgreSQL can run as user %r",
            d,
            user.name,
        )
        d.chmod(stat.S_IMODE(st.st_mode) | bit)


def _as_user(user: ServiceUser | None) -> dict[str, Any]:
    """The `subprocess` arguments that run a command as `user` (None: as ourselves)."""
    if user is None:
        return {}
    return {
        "user": user.uid,
        "group": user.gid,
        "extra_groups": sorted(user.groups - {user.gid}),
    }


def run_as(
    args: Sequence[str | Path],
    user: ServiceUser | None,
    *,
    timeout: float,
    new_session: bool = False,
    env: Mapping[str, str] | None = None,
) -> subprocess.CompletedProcess[str]:
    """Run a server command (as the service user under root) and return its captured output;
    `env` replaces the environment."""
    return subprocess.run(
        [str(a) for a in args],
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
        cwd="/",  # the caller's cwd (e.g. /root) may be unreadable for the service user
        start_new_session=new_session,
        env=env,
        **_as_user(user),
    )


def start_as(
    args: Sequence[str | Path], user: ServiceUser | None, *, log: IO[str], env: Mapping[str, str]
) -> subprocess.Popen[str]:
    """Start a long-running server command (as the service user under root) in a session and
    process group of its own, which it leads, its output appended to `log`: a test can then
    signal the command and every process it started (``os.killpg(proc.pid, ...)``)."""
    return subprocess.Popen(
        [str(a) for a in args],
        stdin=subprocess.DEVNULL,
        stdout=log,
        stderr=subprocess.STDOUT,
        text=True,
        cwd="/",
        start_new_session=True,
        env=env,
        **_as_user(user),
    )
