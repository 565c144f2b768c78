"""A fork asks again for an approval at or after its fork point: forked between a request
and its decision it can be approved (it is not stuck), and forked at or just after the
decision it does not run the approved tool again on the original's decision. The tool
runs exactly as often as approvals are granted."""

from __future__ import annotations

import json
from collections import Counter

import dbos_agent as da
from dbos_agent.testing import Inspector
from tests.helpers import cli, new_id, ok, wait_until

DEPLOYS: Counter[str] = Counter()


@da.step
def deploy(key: str) -> str:
    DEPLOYS[key] += 1
    return f"deployed {key}"


@da.step
def note(key: str) -> str:
    return f"noted {key}"


@da.durable_workflow(name="fork_approvals_guarded")
def guarded(key: str) -> str:
    decision = da.request_approval("deploy", {"key": key})  # steps 0 (request), 1 (decision)
    if not decision.approved:
        return "not deployed"
    return deploy(key)  # step 2


@da.durable_workflow(name="fork_approvals_asked_then_waited")
def asked_then_waited(key: str) -> str:
    ticket = da.ask_approval("deploy", {"key": key})  # step 0
    note(key)  # step 1
    decision = da.wait_for_approval(ticket)  # step 2
    return deploy(key) if decision.approved else "not deployed"  # step 3


def pending(workflow_id: str) -> da.operations.ApprovalRequest:
    """The PENDING request of a workflow, once there is one."""

    def found() -> list[da.operations.ApprovalRequest]:
        return [a for a in da.operations.list_approvals(workflow_id) if a.status == "PENDING"]

    wait_until(found, 15, f"an approval request of {workflow_id}")
    return found()[0]


def test_a_fork_between_the_request_and_the_decision_asks_again_and_can_be_approved(
    runtime: da.Runtime, inspector: Inspector
) -> None:
    key = new_id("between")
    original = da.start(guarded, key, workflow_id=key)
    request = pending(key)
    wait_until(lambda: inspector.status(key) == "SUSPENDED", 15, "the original suspended")

    fork = da.operations.fork(key, 1)  # after the request, before the decision
    assert fork.from_step == 0  # moved back to the request: asked again
    again = pending(fork.workflow_id)
    assert (again.seq, again.digest) == (request.seq, request.digest)
    da.operations.approve(fork.workflow_id, again.seq, again.digest)
    assert fork.result(timeout=30) == f"deployed {key}"
    assert DEPLOYS[key] == 1

    da.operations.approve(key, request.seq, request.digest)  # the original still waits for its own
    assert original.result(timeout=30) == f"deployed {key}"
    assert DEPLOYS[key] == 2  # two approvals granted, two deploys


def test_a_fork_at_or_just_after_the_decision_asks_again(runtime: da.Runtime) -> None:
    key = new_id("after")
    original = da.start(guarded, key, workflow_id=key)
    request = pending(key)
    da.operations.approve(key, request.seq, request.digest)
    assert original.result(timeout=30) == f"deployed {key}"
    assert DEPLOYS[key] == 1

    for approvals, from_step in enumerate((1, 2), start=1):  # at the decision; the tool
        fork = da.operations.fork(key, from_step)
        assert fork.from_step == 0
        again = pending(fork.workflow_id)
        assert DEPLOYS[key] == approvals  # not run on the original's decision
        da.operations.approve(fork.workflow_id, again.seq, again.digest)
        assert fork.result(timeout=30) == f"deployed {key}"
    assert DEPLOYS[key] == 3  # three approvals, three deploys

    replayed = da.operations.fork(key, 3)  # past the tool: everything replays, nothing is asked
    assert replayed.from_step == 3
    assert replayed.result(timeout=30) == f"deployed {key}"
    assert DEPLOYS[key] == 3
    (copied,) = da.operations.list_approvals(replayed.workflow_id)
    assert copied.status == "APPROVED"  # its decision, as recorded


def test_a_request_with_other_steps_before_its_decision_is_asked_again_in_place(
    runtime: da.Runtime, dbos_agent_database_url: str
) -> None:
    """The fork point stays (a step that is not an approval step is below it); the
    copied request is PENDING in the fork, so the fork can be approved."""
    key = new_id("apart")
    original = da.start(asked_then_waited, key, workflow_id=key)
    request = pending(key)
    da.operations.approve(key, request.seq, request.digest)
    assert original.result(timeout=30) == f"deployed {key}"

    forked = ok(
        cli(dbos_agent_database_url, "workflows", "fork", key, "--from-step", "3", "--json")
    )
    document = json.loads(forked)  # moved back over the decision only, not over note()
    assert (document["forked_from_step"], document["requested_from_step"]) == (2, 3)
    fid = document["workflow_id"]
    again = pending(fid)
    assert again.seq == 0
    da.operations.approve(fid, again.seq, again.digest)
    assert da.retrieve(fid).result(timeout=30) == f"deployed {key}"
    assert DEPLOYS[key] == 2
