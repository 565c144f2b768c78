"""``check-deploy`` in a child process: the app imported and replayed apart from the command.

Importing the new code runs its module-level code, which may do anything: exit
(``sys.exit``, ``os._exit``), hang, crash, start a thread that never ends, launch a
runtime. Run in the command's own process, any of these could end the check with exit
status 0 and nothing checked, hang it, or have it write. So the command (:func:`run_check`)
starts a Python process that runs :func:`main` here and reads what it reports on a pipe
of its own, one JSON document a line:

* ``{"event": "importing"}``, then ``{"event": "imported", "names": [...]}`` within
  ``--timeout`` seconds, or the child is killed and the check fails;
* ``{"event": "report", ...}``: the verdicts; or ``{"event": "error", ...}``.

A child that ends without reporting, is killed by a signal, or does not import the app in
time fails the check with :class:`DeployCheckError` (exit status 2), as does an import that
raises, exits, leaves a non-daemon thread running or launches a runtime.

Nothing the child does can write: ``launch()`` is refused in it, every connector made in
it (a ``Client`` the app makes too) is read-only, and so is every other connection it, or
a process it starts, opens through libpq (``PGOPTIONS``: ``default_transaction_read_only``).
What the app prints goes to stderr, so that ``--json`` stays one document on stdout.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import select
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from typing import Any

import psycopg

from .._engine import deploy_check
from .._engine.extending import workflow_names
from .._engine.launch import refuse_launch
from .._storage.connector import refuse_writes
from .._storage.database import SystemDatabase
from .._storage.dsn import URL_ENV
from .._storage.histories import History, read_export
from ..errors import (
    DatabaseUnavailableError,
    DbosAgentError,
    DeployCheckError,
    InvalidHistoryError,
    WriteRefusedError,
)
from ..worker import import_app

#: Seconds the child may take to start Python and dbos_agent, before it imports the app.
STARTUP_TIMEOUT_S = 60.0
#: The errors the child reports that keep their type here (the others: DbosAgentError).
_ERRORS: dict[str, type[DbosAgentError]] = {
    cls.__name__: cls
    for cls in (DeployCheckError, InvalidHistoryError, DatabaseUnavailableError, WriteRefusedError)
}
#: Seconds between looks at whether a silent child is still there.
_POLL_S = 1.0
#: Seconds the child may take to exit once it reported.
EXIT_TIMEOUT_S = 10.0
_READ_ONLY = "-c default_transaction_read_only=on"
#: The child's program (not ``-m`` of this module, which the CLI has imported already).
_MAIN = f"from {__name__} import main; main()"


def run_check(
    url: str, app: str, *, app_version: str | None, timeout: float, histories: str | None
) -> tuple[list[str], deploy_check.DeployCheck]:
    """The workflow names the app registers and the check of its code, from a child process
    (see the module's doc); DeployCheckError when the app could not be checked, and
    DbosAgentError for an operational failure the child reports (no database, a bad
    export)."""
    module = app.partition(":")[0]
    read_end, write_end = os.pipe()
    argv = [sys.executable, "-c", _MAIN, "--report-fd", str(write_end), "--app", app]
    argv += ["--timeout", repr(timeout)]
    if app_version is not None:
        argv += ["--app-version", app_version]
    if histories is not None:
        argv += ["--histories", histories]
    env = {**os.environ, URL_ENV: url}
    env["PGOPTIONS"] = f"{env.get('PGOPTIONS', '')} {_READ_ONLY}".strip()
    try:
        child = subprocess.Popen(
            argv,
            env=env,
            stdin=None if histories == "-" else subprocess.DEVNULL,
            stdout=_stderr_fd(),
            pass_fds=[write_end],
            start_new_session=True,  # its group: what it starts goes with it
        )
    finally:
        os.close(write_end)
    reports = _Reports(read_end, child, module)
    try:
        imported, report = _converse(reports, module, timeout)
    finally:
        _end(child, EXIT_TIMEOUT_S if reports.answered else 0)
        os.close(read_end)
    check = deploy_check.DeployCheck(report["code_version"], report["app_version"])
    check.verdicts = [deploy_check.verdict_from_document(v) for v in report["verdicts"]]
    return list(imported["names"]), check


def _converse(
    reports: _Reports, module: str, timeout: float
) -> tuple[dict[str, Any], dict[str, Any]]:
    """What the child reports: the import within ``timeout``, then the check."""
    try:
        reports.expect("importing", time.monotonic() + STARTUP_TIMEOUT_S)
    except TimeoutError:
        raise DeployCheckError(
            f"the check's process did not start within {STARTUP_TIMEOUT_S:g}s"
        ) from None
    try:
        imported = reports.expect("imported", time.monotonic() + timeout)
    except TimeoutError:
        raise DeployCheckError(
            f"the app module {module!r} was not imported within {timeout:g}s (--timeout): "
            "its import blocks (on a lock, the network, input()?); nothing was checked"
        ) from None
    return imported, reports.expect("report", None)


def _stderr_fd() -> int | None:
    """Where the child's stdout goes: this process's stderr (None: wherever it is)."""
    try:
        return sys.stderr.fileno()
    except (AttributeError, OSError, ValueError):  # replaced by something without one
        return None


class _Reports:
    """The child's JSON lines, read against a deadline."""

    def __init__(self, fd: int, child: subprocess.Popen[bytes], module: str) -> None:
        self._fd = fd
        self._child = child
        self._module = module
        self._buffer = b""
        #: Whether the child reported how it ended (it exits at once then).
        self.answered = False

    def expect(self, event: str, deadline: float | None) -> dict[str, Any]:
        """The next report, which must be ``event`` (an error report is raised as it says);
        TimeoutError past ``deadline``; DeployCheckError when the child ends first."""
        line = self._line(deadline)
        if line is None:
            raise DeployCheckError(_ended(self._child, self._module, before=event))
        found: dict[str, Any] = json.loads(line)
        if found["event"] == "error":
            self.answered = True
            raise _ERRORS.get(found["type"], DbosAgentError)(found["message"])
        if found["event"] != event:  # pragma: no cover - the two sides are one module
            raise DeployCheckError(f"the check's process reported {found['event']!r}")
        self.answered = event == "report"
        return found

    def _line(self, deadline: float | None) -> bytes | None:
        """The next line; None once the child ended without one (its pipe closed, or it
        exited: a process it forked may hold the pipe open)."""
        while b"\n" not in self._buffer:
            wait = _POLL_S if deadline is None else min(_POLL_S, deadline - time.monotonic())
            ready, _, _ = select.select([self._fd], [], [], max(0.0, wait))
            if ready:
                chunk = os.read(self._fd, 1 << 16)
                if not chunk:
                    return None
                self._buffer += chunk
            elif deadline is not None and time.monotonic() >= deadline:
                raise TimeoutError
            elif self._child.poll() is not None and not select.select([self._fd], [], [], 0)[0]:
                return None
        line, _, self._buffer = self._buffer.partition(b"\n")
        return line


def _ended(child: subprocess.Popen[bytes], module: str, *, before: str) -> str:
    """What became of a child that stopped reporting before ``before``."""
    _end(child, EXIT_TIMEOUT_S)  # it closed its pipe: it is ending, or it is ended
    status = child.returncode
    try:
        how = f"was killed by {signal.Signals(-status).name}" if status < 0 else ""
    except ValueError:  # pragma: no cover - a signal Python has no name for
        how = f"was killed by signal {-status}"
    how = how or f"exited with status {status}"
    if before in ("importing", "imported"):
        return (
            f"the check's process {how} while it imported the app module {module!r} (the "
            "module exits or crashes its process when imported: os._exit, a signal, a "
            "crash in native code?); nothing was checked"
        )
    return (
        f"the check's process {how} while it replayed workflows against the app module "
        f"{module!r}, before it reported (the new code ends or crashes its process); "
        "nothing was checked"
    )


def _end(child: subprocess.Popen[bytes], grace: float) -> None:
    """The child gone (killed past ``grace`` seconds), and whatever it started with it:
    its process group (the group outlives the child while one of them lives)."""
    with contextlib.suppress(subprocess.TimeoutExpired):
        child.wait(grace)
    with contextlib.suppress(ProcessLookupError):  # nothing of the group is left
        os.killpg(child.pid, signal.SIGKILL)
    child.wait()


# -- the child -------------------------------------------------------------------------


class _Reporter:
    def __init__(self, fd: int) -> None:
        self._out = os.fdopen(fd, "w", encoding="utf-8")

    def send(self, event: str, **fields: Any) -> None:
        self._out.write(json.dumps({"event": event, **fields}) + "\n")
        self._out.flush()

    def fail(self, exc: DbosAgentError) -> None:
        self.send("error", message=str(exc), type=type(exc).__name__)


def _stray_threads(grace: float) -> list[str]:
    """Non-daemon threads besides the main one still alive after ``grace`` seconds: they
    would keep every process of the app from exiting (one that ends by then does not)."""
    main = threading.main_thread()
    deadline = time.monotonic() + grace
    stray = [t for t in threading.enumerate() if t is not main and not t.daemon]
    for thread in stray:
        thread.join(max(0.0, deadline - time.monotonic()))
    return [t.name for t in stray if t.is_alive()]


def _import(app: str, reporter: _Reporter) -> list[str] | None:
    """Import the app; the names it registers, or None once a failure is reported."""
    module = app.partition(":")[0]
    refuse_writes()
    refuse_launch(
        f"launch() is refused while check-deploy imports the app module {module!r}: the "
        "check replays its code and runs nothing live. Launch from a function or under "
        "`if __name__ == '__main__':` (dbos-agent worker --app imports, then launches)"
    )
    reporter.send("importing")
    try:
        import_app(app)
    except SystemExit as exc:
        reporter.fail(
            DeployCheckError(
                f"the app module {module!r} called sys.exit({exc.code!r}) while it was "
                "imported; nothing was checked"
            )
        )
        return None
    except DbosAgentError as exc:
        reporter.fail(DeployCheckError(str(exc)))
        return None
    except BaseException as exc:  # KeyboardInterrupt, GeneratorExit, ...
        reporter.fail(
            DeployCheckError(
                f"cannot import the app module {module!r}: {type(exc).__name__}: {exc}"
            )
        )
        return None
    names = sorted(workflow_names())
    if not names:
        reporter.fail(DeployCheckError(f"the app module {app!r} registers no durable workflow"))
        return None
    return names


def _check(args: argparse.Namespace, names: list[str]) -> deploy_check.DeployCheck:
    db = SystemDatabase(os.environ[URL_ENV], pool_size=2, read_only=True, outage_timeout=10.0)
    db.open()
    try:
        histories = (
            _file_histories(args.histories, set(names))
            if args.histories is not None
            else deploy_check.stored_histories(db, names)
        )
        return deploy_check.check(histories, db, app_version=args.app_version, timeout=args.timeout)
    finally:
        db.close()


def _file_histories(path: str, names: set[str]) -> Iterator[History]:
    """The histories of an export file (``-``: stdin) whose workflows the app registers."""
    for _, _, history in read_export(path):
        if history.name in names:
            yield history


def main() -> None:
    """The child: import, check, report; then end at once (a thread the checked code left
    behind does not keep it)."""
    parser = argparse.ArgumentParser(prog="dbos-agent check-deploy (its child process)")
    parser.add_argument("--report-fd", type=int, required=True)
    parser.add_argument("--app", required=True)
    parser.add_argument("--app-version")
    parser.add_argument("--timeout", type=float, required=True)
    parser.add_argument("--histories")
    args = parser.parse_args()
    _run(args, _Reporter(args.report_fd))
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def _run(args: argparse.Namespace, reporter: _Reporter) -> None:
    names = _import(args.app, reporter)
    if names is None:
        return
    reporter.send("imported", names=names)
    stray = _stray_threads(args.timeout)
    if stray:
        module = args.app.partition(":")[0]
        reporter.fail(
            DeployCheckError(
                f"the app module {module!r} started {len(stray)} non-daemon thread(s) when it "
                f"was imported that did not end within {args.timeout:g}s (--timeout) "
                f"({', '.join(stray)}): they would keep every process of it from exiting; "
                "start them from a function, or as daemon threads; nothing was checked"
            )
        )
        return
    try:
        report = _check(args, names)
    except DbosAgentError as exc:
        reporter.fail(exc)
    except psycopg.Error as exc:
        reporter.fail(DbosAgentError(f"database error: {' '.join(str(exc).split())}"))
    else:
        reporter.send(
            "report",
            code_version=report.code_version,
            app_version=report.app_version,
            verdicts=[deploy_check.verdict_document(v) for v in report.verdicts],
        )
