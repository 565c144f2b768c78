"""``python -S zygote_launch.py SOCKET ARGS...``: run ``python ARGS...`` forked from the
zygote listening on ``SOCKET``, for a process the tests do not start themselves (an MCP
client starts its server): the import-free interpreter running this stands in for the
child. It hands the child its stdin, stdout and stderr (and keeps no copy, so that the
child's end of a pipe is the only one), its environment and working directory; passes on
every signal it can catch; and ends as the child ends (its exit status, or killed by the
same signal). Killed itself with SIGKILL, it leaves the child to end with its stdin.

Where the zygote is gone, or the environment asks for what a fork cannot reproduce
(:func:`tests.support.zygote.differs`), it execs ``python ARGS...`` instead.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import sys
from pathlib import Path


def main(path: str, args: list[str]) -> None:
    sys.path[0] = str(Path(__file__).parents[2])  # the checkout, not this folder
    from tests.support import zygote

    plan = zygote.plan_of([sys.executable, *args], None, {})
    env = dict(os.environ)
    try:
        with open(os.path.join(os.path.dirname(path), zygote.ENV_FILE)) as written:
            zygote_env = json.load(written)
        conn = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        conn.connect(path)
    except OSError:
        plan = None
    else:
        for name in zygote.SUITE_VARIABLES:
            if name in zygote_env:
                env.setdefault(name, zygote_env[name])
    if plan is None or zygote.differs(env, zygote_env):
        os.execv(sys.executable, [sys.executable, *args])
    reply = zygote.ask(conn, plan, env, None, False, [0, 1, 2])
    if "pid" not in reply:
        sys.exit(f"the zygote did not start {args!r}: {reply.get('error', 'no reply')}")
    child = int(reply["pid"])
    null = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1, 2):
        os.dup2(null, fd)
    for passed in zygote.SIGNALS:
        if passed != signal.SIGCHLD and signal.getsignal(passed) != signal.SIG_IGN:
            signal.signal(passed, lambda sig, _frame: os.kill(child, sig))
    status = zygote.wait_status(conn)
    if os.WIFSIGNALED(status):
        number = os.WTERMSIG(status)
        if number not in (signal.SIGKILL, signal.SIGSTOP):  # which no handler catches
            signal.signal(number, signal.SIG_DFL)
        os.kill(os.getpid(), number)
    os._exit(os.waitstatus_to_exitcode(status) if os.WIFEXITED(status) else 1)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2:])
