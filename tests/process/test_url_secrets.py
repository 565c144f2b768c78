"""No secret of a connection string or of the server's token ever shows: not in an
exception (its str, repr, cause and context, its traceback), not in a log line, not on
stdout or stderr, whatever the form of the string (``tests/support/secret_forms.py``).

In this process: ``da.launch``, ``da.Client``, and the CLI's ``main`` on the paths its
commands take: every command but ``worker`` and ``serve`` opens its database in one
place (``workflows list`` and ``migrate --json`` stand for them), ``serve`` in another.
As users run them (subprocesses): those, ``worker`` (it launches), and ``serve`` with
its token given in a file, on the command line and in the environment, with the
password in $PGPASSWORD or a password file ($PGPASSFILE).
"""

from __future__ import annotations

import contextlib
import io
import logging
import os
import re
import signal
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import dbos_agent as da
from dbos_agent import cli
from dbos_agent._storage.dsn import URL_ENV
from tests.processes import ROOT, output
from tests.support import zygote
from tests.support.secret_forms import FORMS, Secret, leaks, secrets, texts_of
from tests.support.web import free_port

# What each attempt runs: the library's two entry points and the CLI's two paths.
CLI_COMMANDS = [["workflows", "list"], ["migrate", "--json"], ["serve", "--port", "0"]]


def _set_environment(values: dict[str, str | None]) -> None:
    for name, value in values.items():
        if value is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = value


@contextlib.contextmanager
def _environment(**values: str | None) -> Iterator[None]:
    """``os.environ`` with ``values`` set (None: unset), restored afterwards."""
    saved = {name: os.environ.get(name) for name in values}
    try:
        _set_environment(values)
        yield
    finally:
        _set_environment(saved)


@contextlib.contextmanager
def _everything_logged() -> Iterator[io.StringIO]:
    """Every log record of every logger, DEBUG included, formatted with its traceback."""
    logged = io.StringIO()
    handler = logging.StreamHandler(logged)
    handler.setFormatter(logging.Formatter("%(name)s %(levelname)s %(message)s"))
    root = logging.getLogger()
    level = root.level
    root.addHandler(handler)
    root.setLevel(logging.DEBUG)
    try:
        yield logged
    finally:
        root.removeHandler(handler)
        root.setLevel(level)


def _failure_of(attempt: Callable[[], object]) -> BaseException:
    try:
        attempt()
    except BaseException as exc:
        return exc
    raise AssertionError("connected to 127.0.0.1:1?")


@st.composite
def _hostile(draw: st.DrawFn) -> tuple[Secret, str, str]:
    """A password, the name of a form and the connection string of that form."""
    secret, form = draw(secrets()), draw(st.sampled_from(sorted(FORMS)))
    return secret, form, FORMS[form](secret.text)


@contextlib.contextmanager
def _watched(secret: Secret, form: str) -> Iterator[None]:
    """The password in $PGPASSWORD for that form, no $DBOS_AGENT_DATABASE_URL, and no
    piece of the password in any log record."""
    with (
        _environment(
            PGPASSWORD=secret.text if form == "PGPASSWORD" else None,
            DBOS_AGENT_DATABASE_URL=None,
        ),
        _everything_logged() as logged,
    ):
        yield
    assert not leaks(secret, logged.getvalue()), logged.getvalue()


@settings(max_examples=60, deadline=None, database=None)
@given(_hostile())
def test_launch_and_client_never_show_a_password(case: tuple[Secret, str, str]) -> None:
    secret, form, url = case
    with _watched(secret, form):
        for attempt in (lambda: da.launch(url), lambda: da.Client(url)):
            exc = _failure_of(attempt)
            assert isinstance(exc, da.DbosAgentError), texts_of(exc)
            assert not leaks(secret, texts_of(exc)), texts_of(exc)


@settings(max_examples=25, deadline=None, database=None)
@given(_hostile())
def test_the_cli_never_shows_a_password(case: tuple[Secret, str, str]) -> None:
    secret, form, url = case
    with _watched(secret, form):
        for command in CLI_COMMANDS:
            out, err = io.StringIO(), io.StringIO()
            with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
                status = cli.main(["--database-url", url, *command])
            shown = out.getvalue() + err.getvalue()
            assert status == 1 and "error: " in err.getvalue(), (command, shown)
            assert not leaks(secret, shown), (command, shown)


# -- as users run it ---------------------------------------------------------------------

PASSWORD = "QzPass1 ?QzPass2%zz#QzPass3@QzPass4"
ENCODABLE = "QzPass5?#:'\"é\\QzPass6"
IN_ENVIRONMENT = "QzPass7 'QzPass8"
TOKEN = "QzToken1-QzToken2"


def _run(args: list[str], env: dict[str, str]) -> subprocess.Popen[str]:
    return zygote.popen(
        [sys.executable, "-m", "dbos_agent", *args],
        env=env,
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def test_no_command_shows_a_password_or_the_token(tmp_path: Path) -> None:
    token_file = tmp_path / "token"
    token_file.write_text(TOKEN + "\n")
    passfile = tmp_path / "pgpass"
    passfile.write_text(f"127.0.0.1:1:*:app:{IN_ENVIRONMENT}\n")
    passfile.chmod(0o600)
    base = {k: v for k, v in os.environ.items() if not k.startswith(("DBOS_AGENT_", "PG"))}
    base.update(PYTHONPATH=str(ROOT), PGPASSWORD=IN_ENVIRONMENT, PGPASSFILE=str(passfile))
    runs = {
        "refused": (
            ["--database-url", f"postgresql://app:{PASSWORD}@127.0.0.1:1/app", "workflows", "list"],
            base,
            "the database URL postgresql://… cannot be read",
        ),
        "from the environment": (
            ["migrate", "--json"],
            {**base, URL_ENV: f"POSTGRESQL+psycopg://app:{ENCODABLE}@127.0.0.1:1/app"},
            "cannot connect to the dbos_agent database at postgresql://app:***@127.0.0.1:1/app",
        ),
        "worker": (
            ["--database-url", f"host=127.0.0.1 port=1 password = '{PASSWORD}'", "worker",
             "--app", "tests.apps.worker_app"],
            base,
            "cannot connect to the dbos_agent database at host=127.0.0.1 port=1 password = ***",
        ),
        "serve": (
            ["serve", "--port", "0", "--token-file", str(token_file)],
            {**base, URL_ENV: "postgresql://app@127.0.0.1:1/app"},
            "cannot connect to the dbos_agent database at postgresql://app@127.0.0.1:1/app",
        ),
    }  # fmt: skip
    procs = {name: _run(args, env) for name, (args, env, _) in runs.items()}
    pieces = re.findall(r"Qz(?:Pass|Token)\d", PASSWORD + ENCODABLE + IN_ENVIRONMENT + TOKEN)
    assert len(pieces) == 10
    for name, proc in procs.items():
        out, err = proc.communicate(timeout=60)
        shown = out + err  # also the password from $PGPASSWORD and the $PGPASSFILE
        assert proc.returncode == 1, output(proc, out, err)
        assert "Traceback" not in shown and runs[name][2] in shown, (name, shown)
        assert not [piece for piece in pieces if piece in shown], (name, shown)


def test_a_token_file_serves_with_that_token_and_never_shows_it(
    dbos_agent_database_url: str, tmp_path: Path
) -> None:
    token_file = tmp_path / "token"
    token_file.write_text(f"  {TOKEN}  \nignored\n")
    port = free_port()
    env = {k: v for k, v in os.environ.items() if k != "DBOS_AGENT_HTTP_TOKEN"}
    env["PYTHONPATH"] = str(ROOT)
    args = ["--database-url", dbos_agent_database_url, "serve", "--port", str(port)]
    server = _run([*args, "--token-file", str(token_file)], env)
    try:
        assert server.stdout is not None
        assert server.stdout.readline().startswith("dbos_agent: serving postgresql://")
        said = server.stdout.readline()
        assert said.endswith("(API under /api; your token)\n") and TOKEN not in said, said
        listing = f"http://127.0.0.1:{port}/api/workflows"
        assert httpx.get(listing).status_code == 401
        assert httpx.get(listing, headers={"Authorization": f"Bearer {TOKEN}"}).status_code == 200
        server.send_signal(signal.SIGTERM)
        out, err = server.communicate(timeout=30)
        assert server.returncode == 0 and TOKEN not in out + err, (out, err)
    finally:
        server.kill()
        server.wait()


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["--token-file", "{missing}"], "cannot read the token file {missing}: No such file"),
        (["--token-file", "{empty}"], "the token file {empty} is empty"),
        (["--token-file", "{empty}", "--token", TOKEN], "--token and --token-file contradict"),
        (["--token-file", "{empty}", "--no-token"], "--token-file and --no-token contradict"),
    ],
)
def test_a_token_file_that_cannot_serve_is_refused(
    args: list[str], says: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    paths = {"missing": str(tmp_path / "missing"), "empty": str(tmp_path / "empty")}
    (tmp_path / "empty").write_text("\n")
    status = cli.main(["serve", *(arg.format(**paths) for arg in args)])
    out, err = capsys.readouterr()
    assert status == 2 and out == "" and says.format(**paths) in err, err
    assert TOKEN not in err


def test_the_help_says_where_secrets_stay_off_the_command_line(
    capsys: pytest.CaptureFixture[str],
) -> None:
    from dbos_agent.cli.parser import build_parser

    with pytest.raises(SystemExit):
        build_parser().parse_args(["serve", "--help"])
    serve_help = " ".join(capsys.readouterr().out.split())
    for said in ("--token-file PATH", "$DBOS_AGENT_HTTP_TOKEN", "visible to other local users"):
        assert said in serve_help, serve_help
    top = " ".join(build_parser().format_help().split())
    assert "$PGPASSWORD" in top and "$PGPASSFILE" in top and "(ps)" in top, top
