"""A durable app whose step sets an event and closes a stream, run as a subprocess and
SIGKILLed inside that step, after both calls and before its checkpoint.

    python tests/apps/step_effects_app.py run WORKFLOW_ID      # run publish() under that id
    python tests/apps/step_effects_app.py recover WORKFLOW_ID  # launch (recovering), result

Environment: DBOS_AGENT_DATABASE_URL, EFFECTS_EXECUTOR (executor id), EFFECTS_RUN (the
value the step sets: which process ran it), EFFECTS_KILL ("1": SIGKILL inside the step).
"""

from __future__ import annotations

import json
import os
import signal
import sys

import dbos_agent as da

RUN = os.environ.get("EFFECTS_RUN", "")


@da.step
def publish_and_close() -> str:
    da.write_stream("out", RUN)  # live: out at once, voided when the step runs again
    da.set_event("ran", RUN)
    da.close_stream("out")
    if os.environ.get("EFFECTS_KILL") == "1":  # both asked for, the checkpoint not written
        os.kill(os.getpid(), signal.SIGKILL)
    return RUN


@da.durable_workflow
def publish() -> str:
    return publish_and_close()


def main() -> None:
    mode, wid = sys.argv[1], sys.argv[2]
    executor = os.environ.get("EFFECTS_EXECUTOR", "local")
    runtime = da.launch(executor_id=executor, recover=(mode == "recover"), take_over=False)
    try:
        with da.workflow_id(wid):
            result = publish() if mode == "run" else da.retrieve(wid).result(timeout=60)
        print(json.dumps(result), flush=True)
    finally:
        runtime.shutdown()


if __name__ == "__main__":
    main()
