"""The suite's forked processes (tests.support.zygote) look, from inside and outside, like
the exec'd ones they stand in for: the same argv, path, directory, environment, streams,
open files, exit statuses and signals. Each case runs the same command both ways."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from tests.processes import ROOT, output
from tests.support import zygote

_PROBE = textwrap.dedent(
    """
    names = sorted(globals())
    import atexit, json, os, signal, sys, threading, time

    def later():
        time.sleep(0.2)
        print("thread joined", flush=True)

    threading.Thread(target=later).start()  # not a daemon: the exit waits for it
    atexit.register(lambda: print("atexit ran", flush=True))
    print(json.dumps({
        "name": __name__,
        "globals": names,
        "spec": str(__spec__ and __spec__.name),
        "builtins": type(__builtins__).__name__,
        "loader": type(__loader__).__name__,
        "cached": repr(globals().get("__cached__")),
        "file": globals().get("__file__"),
        "argv": sys.argv,
        "path": sys.path[:3],
        "cwd": os.getcwd(),
        "env": os.environ.get("PROBE_VALUE"),
        "lc_ctype": os.environ.get("LC_CTYPE"),
        "fds": sorted(int(fd) for fd in os.listdir("/proc/self/fd"))[:4],
        "stdin": sys.stdin.read(),
        "threads": threading.active_count(),
        "bytecode": sys.dont_write_bytecode,
        "tty": sys.stdout.isatty(),
        "sigint": repr(signal.getsignal(signal.SIGINT)),
        "signals": [line for line in open("/proc/self/status").read().splitlines()
                    if line.startswith(("SigBlk", "SigIgn"))],
    }))
    print("to stderr", file=sys.stderr)
    how = os.environ.get("PROBE_EXIT", "")
    if how == "int":
        sys.exit(3)
    if how == "text":
        sys.exit("bad input")
    if how == "raise":
        raise ValueError("raised by the probe")
    """
)


def _both(command: list[str], **kwargs: Any) -> tuple[subprocess.CompletedProcess[str], ...]:
    """``command`` forked from the zygote, then exec'd, each to its end."""
    env = dict(kwargs.pop("env", os.environ))
    runs = []
    for way in ("0", "1"):
        runs.append(
            zygote.run(
                command,
                env={**env, zygote.EXEC_ENV: way},
                capture_output=True,
                text=True,
                timeout=60,
                **kwargs,
            )
        )
    return tuple(runs)


def test_a_zygote_starts_for_the_suite_and_forks() -> None:
    process = zygote.popen([sys.executable, "-c", "pass"])
    assert isinstance(process, zygote.ForkedPopen), zygote._ZYGOTE.failure
    assert process.wait(timeout=60) == 0


@pytest.mark.parametrize("form", ["script", "-c", "-m"])
@pytest.mark.parametrize("exit_how", ["", "int", "text", "raise"])
def test_a_forked_process_is_what_an_execd_one_is(tmp_path: Path, form: str, exit_how: str) -> None:
    package = tmp_path / "probe_pkg"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "probe.py").write_text(_PROBE)
    target = {
        "script": [str(package / "probe.py")],
        "-c": ["-c", _PROBE],
        "-m": ["-m", "probe_pkg.probe"],
    }[form]
    env = {
        **os.environ,
        "PYTHONPATH": str(tmp_path),
        "PROBE_VALUE": "given",
        "PROBE_EXIT": exit_how,
        "PYTHONDONTWRITEBYTECODE": "1",
    }
    forked, execd = _both(
        [sys.executable, *target, "one", "two"], env=env, cwd=tmp_path, input="fed in"
    )
    for done in (forked, execd):
        assert done.returncode == {"": 0, "int": 3, "text": 1, "raise": 1}[exit_how], output(done)
        lines = done.stdout.splitlines()
        assert lines[1:] == ["thread joined", "atexit ran"], output(done)
    seen_forked, seen_execd = (json.loads(d.stdout.splitlines()[0]) for d in (forked, execd))
    assert seen_forked == seen_execd
    assert seen_forked["argv"][1:] == ["one", "two"]
    assert seen_forked["fds"] == [0, 1, 2, 3]  # 3: the listing's own; nothing inherited
    assert seen_forked["stdin"] == "fed in"
    assert forked.stderr.startswith("to stderr\n")
    if exit_how == "raise":
        assert "ValueError: raised by the probe" in forked.stderr
        assert "zygote" not in forked.stderr, forked.stderr  # the traceback is the program's
        assert forked.stderr.count("File ") == execd.stderr.count("File ")
    if exit_how == "text":
        assert forked.stderr == execd.stderr == "to stderr\nbad input\n"


@contextmanager
def _signals(sigint: Any, blocked: set[int]) -> Iterator[None]:
    """This thread's SIGINT handler and signal mask set for the block (an exec keeps an
    ignored signal and the mask; a shell starts a background job with SIGINT ignored)."""
    handler = signal.signal(signal.SIGINT, sigint)
    mask = signal.pthread_sigmask(signal.SIG_SETMASK, blocked)
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, mask)
        signal.signal(signal.SIGINT, handler)


@pytest.mark.parametrize("ignored", [False, True])
def test_a_forked_process_keeps_the_callers_ignored_signals_and_mask(
    tmp_path: Path, ignored: bool
) -> None:
    script = tmp_path / "probe.py"
    script.write_text(_PROBE)
    sigint = signal.SIG_IGN if ignored else signal.default_int_handler
    with _signals(sigint, {signal.SIGUSR1} if ignored else set()):
        forked, execd = _both([sys.executable, str(script)], cwd=tmp_path)
    seen = [json.loads(done.stdout.splitlines()[0]) for done in (forked, execd)]
    assert seen[0] == seen[1]
    assert ("SIG_IGN" in seen[0]["sigint"]) is ignored


@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGTERM, signal.SIGINT])
@_signals(signal.default_int_handler, set())  # as the shell running the suite may not
def test_signals_end_a_forked_process_as_an_execd_one(sig: int) -> None:
    # Short sleeps: a signal that lands between the print and the sleep's system call is
    # handled only when the interpreter next looks, which one long sleep would put off.
    code = "import time\nprint('up', flush=True)\nwhile True: time.sleep(0.05)"
    statuses = []
    for way in ("0", "1"):
        process = zygote.popen(
            [sys.executable, "-c", code],
            env={**os.environ, zygote.EXEC_ENV: way},
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        assert process.stdout is not None
        assert process.stdout.readline() == "up\n"
        assert process.poll() is None
        with pytest.raises(subprocess.TimeoutExpired):
            process.wait(timeout=0.01)
        process.send_signal(sig)
        try:
            statuses.append(process.wait(timeout=60))
        except subprocess.TimeoutExpired:
            raise AssertionError(f"{way=}: still running\n{_state(process.pid)}") from None
        process.communicate()
    assert statuses[0] == statuses[1] == -sig


def _state(pid: int) -> str:
    """What the kernel (and py-spy, where installed) says process ``pid`` is doing."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
        stack = Path(f"/proc/{pid}/wchan").read_text()
    except OSError as exc:
        return f"(no /proc entry: {exc})"
    lines = [line for line in status.splitlines() if line.startswith(("State", "Sig", "Shd"))]
    if shutil.which("py-spy") is not None:
        spy = subprocess.run(["py-spy", "dump", "--pid", str(pid)], capture_output=True, text=True)
        lines += [spy.stdout, spy.stderr]
    return "\n".join([*lines, f"wchan: {stack}"])


def test_what_it_cannot_reproduce_is_execd() -> None:
    cases: list[tuple[list[str], dict[str, Any]]] = [
        ([sys.executable, "-X", "dev", "-c", "pass"], {}),
        ([sys.executable, "-B", "-c", "pass"], {}),
        (["python3", "-c", "pass"], {}),
        ([sys.executable, "-c", "pass"], {"env": {**os.environ, "PYTHONHASHSEED": "7"}}),
        ([sys.executable, "-c", "pass"], {"pass_fds": (0,)}),
    ]
    for command, kwargs in cases:
        process = zygote.popen(command, **kwargs)
        assert type(process) is subprocess.Popen, command
        assert process.wait(timeout=60) == 0


def test_a_forked_process_runs_the_checkouts_library(tmp_path: Path) -> None:
    forked, execd = _both(
        [sys.executable, "-c", "import dbos_agent, sys; print(dbos_agent.__file__)"],
        cwd=tmp_path,
    )
    assert forked.stdout == execd.stdout == f"{ROOT / 'dbos_agent' / '__init__.py'}\n"


def test_a_refused_command_leaves_the_zygote_serving(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError):
        zygote.popen([sys.executable, "-c", "pass"], cwd=tmp_path / "missing")
    with pytest.raises(subprocess.SubprocessError):
        zygote.popen([sys.executable, "-c", "pass"], text=True, universal_newlines=False)
    process = zygote.popen([sys.executable, "-c", "print('next')"], stdout=subprocess.PIPE)
    assert isinstance(process, zygote.ForkedPopen)
    assert process.communicate(timeout=30)[0] == b"next\n"


@pytest.mark.parametrize("exit_how", ["", "int", "raise"])
def test_a_process_another_program_starts_through_the_launcher_is_what_an_execd_one_is(
    tmp_path: Path, exit_how: str
) -> None:
    # As an MCP client starts its server: plain subprocess, a new session, a small
    # environment (no locale variable: the interpreter coerces the C locale to C.UTF-8).
    script = tmp_path / "probe.py"
    script.write_text(_PROBE)
    env = {"PATH": os.environ["PATH"], "PROBE_VALUE": "given", "PROBE_EXIT": exit_how}
    runs = []
    for args in (zygote.through([str(script), "one"]), [str(script), "one"]):
        runs.append(
            subprocess.run(
                [sys.executable, *args],
                env=env,
                cwd=tmp_path,
                input="fed in",
                capture_output=True,
                text=True,
                timeout=60,
                start_new_session=True,
            )
        )
    launched, execd = runs
    assert launched.args[2] == str(zygote.LAUNCHER)  # it went through the launcher...
    parent = subprocess.run(
        [sys.executable, *zygote.through(["-c", "import os; print(os.getppid())"])],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert int(parent.stdout) != os.getpid(), output(parent)  # ...forked, not exec'd
    assert launched.returncode == execd.returncode, output(launched)
    seen_launched, seen_execd = (json.loads(d.stdout.splitlines()[0]) for d in runs)
    assert seen_launched == seen_execd
    assert launched.stdout == execd.stdout


@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGTERM])
def test_the_launcher_passes_signals_on_and_ends_as_its_child_ends(sig: int) -> None:
    code = (
        "import os, time\nprint(os.getpid(), flush=True)\nos.close(1)\nwhile True: time.sleep(0.05)"
    )
    process = subprocess.Popen(
        [sys.executable, *zygote.through(["-c", code])],
        stdout=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    assert process.stdout is not None
    child = int(process.stdout.readline())
    assert child != process.pid  # the zygote's child, not the launcher
    # the child closed its stdout: the end of the pipe, though the launcher still runs
    # (it kept no copy of the child's streams)
    assert process.stdout.read() == ""
    assert process.poll() is None
    # SIGTERM to the launcher's group reaches the child through it; SIGKILL (which no
    # launcher can pass on) to the child itself, as a test kills a server by its pid
    os.kill(child, sig) if sig == signal.SIGKILL else os.killpg(process.pid, sig)
    assert process.wait(timeout=60) == -sig
    process.stdout.close()
