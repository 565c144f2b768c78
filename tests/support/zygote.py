"""Python processes for the tests, forked from a warm parent instead of exec'd.

The suite starts about four hundred Python processes (apps, workers, CLI calls), and on
2 cores most of their cost is the interpreter's start-up and the imports of
``dbos_agent``, ``anthropic`` and ``pydantic_ai`` (0.4 to 1.7 s of CPU each), paid again by
every one. A *zygote* pays it once per test process: a server process that imports them,
starts no thread and opens no connection, then forks one child per request. Each child
is a new process to everything the tests look at: its own pid, no connection and no
thread of anyone else's, its own stdin/stdout/stderr (the caller's pipes, passed over the
socket), environment, working directory, ``sys.argv`` and ``sys.path``; killing it with
SIGKILL is a real crash. What it does not redo is only the import of modules that do
nothing at import but define things.

:func:`popen` is a drop-in ``subprocess.Popen`` for ``[sys.executable, ...]`` commands:
what the zygote cannot reproduce exactly (interpreter options other than ``-u``, another
Python, a changed ``PYTHON*`` or locale variable, ``preexec_fn``, ``pass_fds``, a shell,
``DBOS_AGENT_TEST_EXEC=1`` in the environment) is exec'd as before.

A process another program starts (an MCP client its server) is forked too where the test
gives that program the command :func:`through` makes: a small launcher that stands in
for the child (:mod:`tests.support.zygote_launch`).

The server is :mod:`tests.support.zygote_server`.
"""

from __future__ import annotations

import array
import atexit
import errno
import json
import os
import select
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
from pathlib import Path
from typing import Any

ROOT = Path(__file__).parent.parent.parent

#: The signals whose disposition a child takes from its caller (ignored, or the default).
SIGNALS = (
    signal.SIGINT,
    signal.SIGTERM,
    signal.SIGHUP,
    signal.SIGQUIT,
    signal.SIGUSR1,
    signal.SIGUSR2,
    signal.SIGALRM,
    signal.SIGCHLD,
)

#: Set (to anything but 0) in the environment, every process is exec'd.
EXEC_ENV = "DBOS_AGENT_TEST_EXEC"

_HANDLED_VARIABLES = frozenset({"PYTHONPATH", "PYTHONUNBUFFERED", "PYTHONDONTWRITEBYTECODE"})

#: Set for every test process by tests/conftest.py (why: there), so for its zygote: a
#: process the launcher starts takes it too, where the program starting it left it out.
SUITE_VARIABLES = ("PYTHONNODEBUGRANGES",)

#: The largest request or reply (a request carries the child's whole environment).
MESSAGE = 1 << 20

#: Where a test process's zygote listens, set in its environment (so its children's too)
#: once it started: :func:`through` in an app the tests started uses that same zygote.
SOCKET_ENV = "DBOS_AGENT_TEST_ZYGOTE"

#: The file, beside the socket, holding the environment the zygote started with.
ENV_FILE = "env.json"

#: The script :func:`through` puts in front of a command (see tests.support.zygote_launch).
LAUNCHER = Path(__file__).with_name("zygote_launch.py")


# --- the client: used by the test process -------------------------------------------


class _Zygote:
    """This test process's zygote, started on first use and stopped at exit."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._process: subprocess.Popen[bytes] | None = None
        self._path = ""
        self._env: dict[str, str] = {}
        self._folder = ""
        #: Why the zygote could not start (what it wrote), once it could not.
        self.failure: str | None = None

    def connect(self) -> tuple[socket.socket, dict[str, str]] | None:
        """A connection to the zygote and the environment it started with; None where it
        cannot be started (then the caller execs)."""
        with self._lock:
            if not self._running():
                return None
            conn = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
            try:
                conn.connect(self._path)
            except OSError:
                conn.close()
                return None
            return conn, self._env

    def socket_path(self) -> str | None:
        """The zygote's socket (started on first use), or None where it cannot start."""
        with self._lock:
            return self._path if self._running() else None

    def _running(self) -> bool:
        """Whether the zygote runs, started here on first use (the lock held)."""
        if self._process is None and self.failure is None:
            self._start()
        return self._process is not None and self._process.poll() is None

    def _start(self) -> None:
        self._folder = folder = tempfile.mkdtemp(prefix="zygote-")
        self._path = os.path.join(folder, "socket")
        self._env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
        with open(os.path.join(folder, ENV_FILE), "w") as written:  # for the launcher
            json.dump(self._env, written)
        log = open(os.path.join(folder, "log"), "wb")  # noqa: SIM115 (the zygote's stderr)
        process = subprocess.Popen(
            [sys.executable, "-m", "tests.support.zygote_server", self._path],
            cwd=ROOT,
            env=self._env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=log,
        )
        log.close()
        assert process.stdout is not None
        ready = process.stdout.readline()
        process.stdout.close()
        atexit.register(self.stop)
        if ready.strip() != b"ready":
            process.kill()
            process.wait()
            with open(os.path.join(folder, "log"), errors="replace") as written:
                self.failure = f"the zygote did not start:\n{written.read()[-4000:]}"
            return
        self._process = process
        os.environ[SOCKET_ENV] = self._path

    def stop(self) -> None:
        """Stop the zygote (its children, if any still run, are left to run) and remove
        its folder."""
        with self._lock:
            if self._process is not None and self._process.poll() is None:
                self._process.terminate()
                self._process.wait()
            if self._folder:
                shutil.rmtree(self._folder, ignore_errors=True)


_ZYGOTE = _Zygote()


def plan_of(
    args: Any, env: dict[str, str] | None, kwargs: dict[str, Any]
) -> tuple[list[str], bool] | None:
    """What the child runs (the arguments after the interpreter's options) and whether it
    is unbuffered, or None where only an exec reproduces the command."""
    if isinstance(args, (str, bytes)) or not args or str(args[0]) != sys.executable:
        return None
    if os.environ.get(EXEC_ENV, "0") != "0" or (env or os.environ).get(EXEC_ENV, "0") != "0":
        return None
    unsupported = ("preexec_fn", "pass_fds", "shell", "user", "group", "extra_groups", "umask")
    if any(kwargs.get(name) not in (None, False, (), -1) for name in unsupported):
        return None
    if kwargs.get("process_group") is not None or kwargs.get("executable") is not None:
        return None
    rest, unbuffered = [str(a) for a in args[1:]], False
    while rest and rest[0] == "-u":
        unbuffered = bool(rest.pop(0))
    if not rest or (rest[0].startswith("-") and rest[0] not in ("-m", "-c")):
        return None
    if rest[0] in ("-m", "-c") and len(rest) < 2:
        return None
    return rest, unbuffered


class ForkedPopen(subprocess.Popen[Any]):
    """A ``subprocess.Popen`` whose child the zygote forks: the same object to its user
    (pipes, ``wait``, ``poll``, ``communicate``, ``send_signal``, ``returncode``), its exit
    status told by the zygote, which is the child's parent."""

    def __init__(
        self, args: Any, *, plan: tuple[list[str], bool], connection: Any, **kwargs: Any
    ) -> None:
        self._plan = plan
        self._conn: socket.socket = connection[0]
        self._zygote_env: dict[str, str] = connection[1]
        super().__init__(args, **kwargs)

    def _execute_child(
        self,
        args: Any,
        executable: Any,
        preexec_fn: Any,
        close_fds: Any,
        pass_fds: Any,
        cwd: Any,
        env: Any,
        startupinfo: Any,
        creationflags: Any,
        shell: Any,
        p2cread: int,
        p2cwrite: int,
        c2pread: int,
        c2pwrite: int,
        errread: int,
        errwrite: int,
        restore_signals: Any,
        *rest: Any,
    ) -> None:
        start_new_session = bool(rest[-2]) if len(rest) >= 2 else False
        if cwd is not None and not os.path.isdir(cwd):
            raise FileNotFoundError(errno.ENOENT, os.strerror(errno.ENOENT), cwd)
        given = dict(os.environ if env is None else env)
        fds = [p2cread, c2pwrite, errwrite]
        try:
            reply = ask(self._conn, self._plan, given, cwd, start_new_session, fds)
        finally:
            popen: Any = self  # the standard library's private helpers, typeshed omits
            popen._close_pipe_fds(p2cread, p2cwrite, c2pread, c2pwrite, errread, errwrite)
        if "pid" not in reply:
            raise OSError(f"the zygote did not start {args!r}: {reply.get('error', 'no reply')}")
        self.pid = reply["pid"]
        self._child_created = True

    def _status(self, block: bool) -> int | None:
        """The child's wait status, once the zygote reaped it; None while it runs."""
        if not block and not select.select([self._conn], [], [], 0)[0]:
            return None
        return wait_status(self._conn)

    def _internal_poll(self, _deadstate: Any = None, **_: Any) -> int | None:
        popen: Any = self
        if self.returncode is None and popen._waitpid_lock.acquire(False):
            try:
                if self.returncode is None and self._conn.fileno() != -1:
                    status = self._status(block=False)
                    if status is not None:
                        popen._handle_exitstatus(status)
            except OSError:
                if _deadstate is not None:
                    self.returncode = _deadstate
            finally:
                popen._waitpid_lock.release()
        return self.returncode

    def _try_wait(self, wait_flags: int) -> tuple[int, int]:
        status = self._status(block=not wait_flags & os.WNOHANG)
        return (0, 0) if status is None else (self.pid, status)


def ask(
    conn: socket.socket,
    plan: tuple[list[str], bool],
    env: dict[str, str],
    cwd: str | os.PathLike[str] | None,
    new_session: bool,
    fds: list[int],
) -> dict[str, Any]:
    """Send the zygote the request for a child running ``plan`` with ``fds`` as its
    stdin, stdout and stderr (-1: the caller's own); its reply (the child's pid, or an
    error). The child's wait status comes later on ``conn``."""
    if _coerced(env):
        env = {**env, "LC_CTYPE": "C.UTF-8"}  # what the interpreter sets when it coerces
    request = {
        "argv": plan[0],
        "unbuffered": plan[1] or env.get("PYTHONUNBUFFERED", "") != "",
        "env": {os.fsdecode(k): os.fsdecode(v) for k, v in env.items()},
        "cwd": os.fsdecode(os.path.abspath(cwd if cwd is not None else os.getcwd())),
        "new_session": new_session,
        # What an exec keeps of the caller's signals: the ignored ones and the mask.
        "ignored": [int(n) for n in SIGNALS if signal.getsignal(n) == signal.SIG_IGN],
        "mask": sorted(int(n) for n in signal.pthread_sigmask(signal.SIG_BLOCK, [])),
    }
    given = array.array("i", [target if fd == -1 else fd for target, fd in enumerate(fds)])
    conn.sendmsg(
        [json.dumps(request).encode()],
        [(socket.SOL_SOCKET, socket.SCM_RIGHTS, given.tobytes())],
    )
    reply: dict[str, Any] = json.loads(conn.recv(MESSAGE) or b"{}")
    return reply


def wait_status(conn: socket.socket) -> int:
    """The wait status of the child ``conn`` asked for, once the zygote reaped it (255 if
    the zygote went away first); ``conn`` is closed."""
    data = conn.recv(MESSAGE)
    conn.close()
    return int(json.loads(data)["status"]) if data else 255 << 8


def differs(env: dict[str, str], zygote_env: dict[str, str]) -> bool:
    """Whether ``env`` changes what the interpreter read when the zygote started: a
    ``PYTHON*`` variable, or the locale of its streams (``LC_ALL``, else ``LC_CTYPE``,
    else ``LANG``; none, or C, is the C.UTF-8 the interpreter coerces it to)."""
    names = {n for n in (*env, *zygote_env) if n.startswith("PYTHON")} - _HANDLED_VARIABLES
    return _locale(env) != _locale(zygote_env) or any(
        env.get(n) != zygote_env.get(n) for n in names
    )


def _locale(env: dict[str, str]) -> str:
    """The locale of an interpreter's streams started with ``env``: a C locale not forced
    by ``LC_ALL`` is coerced to C.UTF-8 (PEP 538), which it then names in ``LC_CTYPE``."""
    if env.get("LC_ALL"):
        return env["LC_ALL"]
    return "C.UTF-8" if _coerced(env) else env.get("LC_CTYPE") or env["LANG"]


def _coerced(env: dict[str, str]) -> bool:
    """Whether an interpreter started with ``env`` coerces its C locale (PEP 538)."""
    named = env.get("LC_CTYPE") or env.get("LANG") or "C"
    return not env.get("LC_ALL") and named in ("C", "POSIX")


def through(args: list[str], *, start: bool = True) -> list[str]:
    """The arguments, after ``sys.executable``, of a command that runs ``args`` (a script
    or ``-m`` and its arguments) forked from this test process's zygote, for a process
    another program starts (an MCP client its server): a small launcher stands in for
    the child, passes it its streams, signals and environment, and ends as it ends
    (:mod:`tests.support.zygote_launch`). ``args`` unchanged where there is no zygote.

    In a test process the zygote starts if it has not; an app the tests started passes
    ``start=False`` and uses its test process's (``$DBOS_AGENT_TEST_ZYGOTE``), if any."""
    path = os.environ.get(SOCKET_ENV) or (_ZYGOTE.socket_path() if start else None)
    return list(args) if path is None else ["-S", str(LAUNCHER), path, *args]


def popen(args: Any, **kwargs: Any) -> subprocess.Popen[Any]:
    """``subprocess.Popen(args, **kwargs)``, forked from the zygote where it can be (see
    the module's docstring), exec'd otherwise."""
    plan = plan_of(args, kwargs.get("env"), kwargs)
    if plan is not None:
        connection = _ZYGOTE.connect()
        if connection is not None:
            if not differs(dict(kwargs.get("env") or os.environ), connection[1]):
                try:
                    return ForkedPopen(args, plan=plan, connection=connection, **kwargs)
                except BaseException:
                    # refused before its request was sent (a bad argument, a missing cwd):
                    # closed, the zygote stops waiting for that request at once
                    connection[0].close()
                    raise
            connection[0].close()
    return subprocess.Popen(args, **kwargs)


def run(
    args: Any, *, timeout: float | None = None, **kwargs: Any
) -> subprocess.CompletedProcess[str]:
    """``subprocess.run`` over :func:`popen` (``capture_output``, ``input``, ``timeout``
    and ``check`` as there; typed for ``text=True``, its most common use)."""
    if kwargs.pop("capture_output", False):
        kwargs["stdout"] = kwargs["stderr"] = subprocess.PIPE
    given = kwargs.pop("input", None)
    check = kwargs.pop("check", False)
    if given is not None:
        kwargs["stdin"] = subprocess.PIPE
    with popen(args, **kwargs) as process:
        try:
            out, err = process.communicate(given, timeout=timeout)
        except subprocess.TimeoutExpired as exc:
            process.kill()
            exc.stdout, exc.stderr = process.communicate()
            raise
        except BaseException:
            process.kill()
            raise
    done = subprocess.CompletedProcess(process.args, process.returncode, out, err)
    if check:
        done.check_returncode()
    return done
