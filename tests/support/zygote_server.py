"""The zygote of :mod:`tests.support.zygote`: ``python -m tests.support.zygote_server
SOCKET`` imports what the suite's processes import, then forks one child per request on
``SOCKET`` and tells each requester its child's pid, then its wait status.

A request is one message: JSON (the arguments after the interpreter's options, the
environment, the working directory, whether the streams are unbuffered, whether to start a
new session) with the child's stdin, stdout and stderr attached (``SCM_RIGHTS``). The child
then becomes that process (:func:`_child`) the way the interpreter would have made it.
"""

from __future__ import annotations

import array
import atexit
import builtins
import contextlib
import io
import json
import os
import runpy
import select
import signal
import socket
import sys
import threading
import traceback
import types
from importlib.machinery import BuiltinImporter, SourceFileLoader
from pathlib import Path
from typing import Any

from tests.support.zygote import MESSAGE, SIGNALS

#: What the zygote imports before it forks: what most test processes import first.
PREIMPORTED = (
    "dbos_agent",
    "dbos_agent.agent",
    "dbos_agent.cli",
    "dbos_agent.testing",
    "anthropic",
    "pydantic_ai",
    "mcp",
)


def _serve(path: str) -> None:
    for name in PREIMPORTED:
        with contextlib.suppress(ImportError):
            __import__(name)
    if threading.active_count() != 1:
        raise SystemExit(f"the zygote's imports started threads: {threading.enumerate()}")
    base_path = sys.path[1:]
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    listener.bind(path)
    listener.listen(64)
    wake_read, wake_write = os.pipe()
    os.set_blocking(wake_write, False)
    signal.set_wakeup_fd(wake_write)
    signal.signal(signal.SIGCHLD, lambda *_: None)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    parent = os.getppid()
    children: dict[int, socket.socket] = {}
    print("ready", flush=True)
    while os.getppid() == parent:
        waited: list[Any] = [listener, wake_read]
        ready = select.select(waited, [], [], 1.0)[0]
        if wake_read in ready:
            os.read(wake_read, 4096)
        _reap(children)
        if listener in ready:
            conn, _ = listener.accept()
            pid = _fork(conn, listener, children, (wake_read, wake_write), base_path)
            if pid is not None:
                children[pid] = conn
            else:
                conn.close()


def _reap(children: dict[int, socket.socket]) -> None:
    while children:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        conn = children.pop(pid, None)
        if conn is not None:
            with contextlib.suppress(OSError):
                conn.send(json.dumps({"status": status}).encode())
            conn.close()


def _fork(
    conn: socket.socket,
    listener: socket.socket,
    children: dict[int, socket.socket],
    wake: tuple[int, int],
    base_path: list[str],
) -> int | None:
    """Fork the child ``conn`` asks for; its pid (told to the caller too), or None."""
    fds = array.array("i")
    try:
        data, ancillary, _, _ = conn.recvmsg(MESSAGE, socket.CMSG_SPACE(3 * fds.itemsize))
        for level, kind, payload in ancillary:
            if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
                fds.frombytes(payload[: len(payload) - len(payload) % fds.itemsize])
        request = json.loads(data)
    except (OSError, ValueError):
        for fd in fds:
            os.close(fd)
        return None
    sys.stdout.flush()
    sys.stderr.flush()
    pid = os.fork()
    if pid == 0:
        try:
            listener.close()
            conn.close()
            for other in children.values():
                other.close()
            signal.set_wakeup_fd(-1)
            for fd in wake:
                os.close(fd)
            _child(request, list(fds), base_path)
        finally:
            os._exit(70)
    for fd in fds:
        os.close(fd)
    with contextlib.suppress(OSError):
        conn.send(json.dumps({"pid": pid}).encode())
    return pid


def _child(request: dict[str, Any], fds: list[int], base_path: list[str]) -> None:
    """In the forked child: become the process ``request`` describes, run it, exit as the
    interpreter would (non-daemon threads joined, ``atexit`` run, streams flushed)."""
    for number in SIGNALS:  # as an exec leaves them: ignored where the caller ignores them
        default = signal.default_int_handler if number == signal.SIGINT else signal.SIG_DFL
        signal.signal(number, signal.SIG_IGN if number in request["ignored"] else default)
    signal.pthread_sigmask(signal.SIG_SETMASK, request["mask"])
    for target, fd in enumerate(fds):
        os.dup2(fd, target)
    for fd in set(fds) - {0, 1, 2}:
        os.close(fd)
    if request["new_session"]:
        os.setsid()
    os.chdir(request["cwd"])
    env: dict[str, str] = request["env"]
    os.environ.clear()
    os.environ.update(env)
    sys.dont_write_bytecode = env.get("PYTHONDONTWRITEBYTECODE", "") != ""
    _stdio(request["unbuffered"])
    argv: list[str] = request["argv"]
    entries = [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
    if argv[0] == "-m":
        first = os.getcwd()
    elif argv[0] == "-c":
        first = ""
    else:
        first = os.path.dirname(os.path.realpath(argv[0]))
    sys.path[:] = [first, *entries, *base_path]
    status = 0
    interrupted = False
    try:
        _run(argv)
    except SystemExit as exc:
        status = _exit_status(exc)
    except KeyboardInterrupt:
        traceback.print_exc()
        interrupted = True
    except BaseException as exc:
        shown = exc.with_traceback(_user_frames(exc.__traceback__))
        sys.excepthook(type(shown), shown, shown.__traceback__)
        status = 1
    try:
        threading._shutdown()  # type: ignore[attr-defined]  # join non-daemon threads
    except BaseException:
        traceback.print_exc()
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except Exception:
            status = status or 120
    if interrupted:
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGINT)
    os._exit(status)


def _run(argv: list[str]) -> None:
    main = types.ModuleType("__main__")  # a fresh one: the zygote's is its own namespace
    main.__dict__.update(__builtins__=builtins, __annotations__={}, __loader__=BuiltinImporter)
    sys.modules["__main__"] = main
    if argv[0] == "-m":
        sys.argv = ["-m", *argv[2:]]
        sys.modules.pop(argv[1], None)
        runpy._run_module_as_main(argv[1], alter_argv=True)  # type: ignore[attr-defined]
        return
    if argv[0] == "-c":
        sys.argv = ["-c", *argv[2:]]
        code = compile(argv[1], "<string>", "exec")
    else:
        sys.argv = list(argv)
        main.__dict__.update(
            __file__=argv[0], __cached__=None, __loader__=SourceFileLoader("__main__", argv[0])
        )
        source = Path(argv[0]).read_bytes()
        code = compile(source, argv[0], "exec")
    exec(code, main.__dict__)


def _user_frames(tb: types.TracebackType | None) -> types.TracebackType | None:
    """``tb`` without the zygote's own frames, as the interpreter would print it."""
    here = _user_frames.__code__.co_filename
    while tb is not None and tb.tb_frame.f_code.co_filename == here:
        tb = tb.tb_next
    return tb


def _exit_status(exc: SystemExit) -> int:
    code = exc.code
    if code is None:
        return 0
    if isinstance(code, int):
        return code & 0xFF
    print(code, file=sys.stderr)
    return 1


def _stdio(unbuffered: bool) -> None:
    """New standard streams over fds 0-2, made as the interpreter makes them."""
    made = []
    for fd, name in ((0, "stdin"), (1, "stdout"), (2, "stderr")):
        old = getattr(sys, name)
        raw = io.FileIO(fd, "rb" if fd == 0 else "wb", closefd=False)
        buffered: Any = raw
        if fd == 0:
            buffered = io.BufferedReader(raw)
        elif not unbuffered:
            buffered = io.BufferedWriter(raw)
        stream = io.TextIOWrapper(
            buffered,
            encoding=old.encoding,
            errors=old.errors,
            line_buffering=fd == 2 or (fd == 1 and raw.isatty()),
            write_through=unbuffered and fd != 0,
        )
        made.append(stream)
    sys.stdin, sys.stdout, sys.stderr = made
    for name, stream in zip(("__stdin__", "__stdout__", "__stderr__"), made, strict=True):
        setattr(sys, name, stream)


if __name__ == "__main__":
    _serve(sys.argv[1])
