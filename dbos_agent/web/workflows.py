"""The workflow routes: list, show, steps, and the operator's actions (cancel, resume,
fork, rewind, retry now, send, resolve an in-doubt step), each through the app's
:class:`Client`."""

from __future__ import annotations

import dataclasses
import json
from typing import Annotated, Any

from fastapi import APIRouter, Query, Response
from pydantic import BaseModel, Field

from .. import _documents as documents
from .._durations import parse_duration, parse_moment
from .._engine.bulk import DEFAULT_BULK_BATCH, Action
from .._engine.client import Client
from .._engine.operations import CANCELLABLE, RESUMABLE, REWINDABLE
from .._limits import check_identifier
from .._storage.rows import ForkResult, ResumeResult, RewindResult
from ..records import WorkflowFilter, WorkflowStatus, describe_step
from .common import CHECKED, ONE, ClientOf, json_response, workflow_document

router = APIRouter(tags=["workflows"], dependencies=CHECKED)


class ForkBody(BaseModel):
    from_step: int = Field(ge=0, description="the first step to run live")
    new_id: str | None = Field(default=None, description="id of the new workflow")
    inputs: dict[str, Any] | None = Field(
        default=None, description='edited inputs: {"param": value} replaces those arguments'
    )
    replace: dict[str, Any] | None = Field(
        default=None,
        description='replayed steps\' outputs replaced: {"3": value} or {"3:name": value}',
    )
    by: str | None = Field(default=None, description="who the edits are recorded as")


class RewindBody(BaseModel):
    to_step: int = Field(ge=0, description="the first step to run again")
    by: str | None = Field(default=None, description="who the rewind is recorded as")


class SendBody(BaseModel):
    message: Any = Field(description="any JSON value")
    topic: str | None = None
    idempotency_key: str | None = None


class ResolveBody(BaseModel):
    result: Any = Field(default=None, description="the result the step had (it happened)")
    rerun: bool = Field(default=False, description="it did not happen: run it again")


class BulkBody(BaseModel):
    """Which workflows a bulk action is about: ``workflow_ids``, or the filters, or both
    (the ids that match the filters); with neither, ``all`` must say so."""

    workflow_ids: list[str] | None = Field(default=None, description="the ids")
    status: WorkflowStatus | None = None
    name: str | None = Field(default=None, description="workflow (function) name")
    queue: str | None = None
    partition: str | None = Field(
        default=None, description="partition key (of a partitioned queue)"
    )
    older_than: str | None = Field(default=None, description="created more than 1h, 7d... ago")
    all: bool = Field(default=False, description="every workflow (no ids nor filter)")
    dry_run: bool = Field(default=False, description="count what would change")
    batch_size: int = Field(default=DEFAULT_BULK_BATCH, ge=1, le=10_000)


class BulkMessage(BaseModel):
    workflow_id: str
    message: Any = Field(description="any JSON value")
    topic: str | None = None
    idempotency_key: str | None = None


class SendBulkBody(BaseModel):
    messages: list[BulkMessage]


def _bulk(action: Action, body: BulkBody, client: Client) -> Response:
    """``action`` on what ``body`` chooses, in batches (``dbos-agent workflows ACTION``)."""
    where = WorkflowFilter(
        status=body.status,
        name=body.name,
        queue_name=body.queue,
        partition_key=body.partition,
        older_than=None if body.older_than is None else parse_duration(body.older_than),
    )
    act = {
        "cancel": client.cancel_workflows,
        "resume": client.resume_workflows,
        "delete": client.delete_workflows,
    }[action]
    report = act(
        body.workflow_ids,
        where=where,
        all_workflows=body.all,
        dry_run=body.dry_run,
        batch_size=body.batch_size,
    )
    return json_response({**dataclasses.asdict(report), "skipped": report.skipped})


@router.post("/api/workflows/cancel")
def cancel_many(body: BulkBody, client: ClientOf) -> Response:
    """Cancel many workflows, each as its own cancel would; the others are counted."""
    return _bulk("cancel", body, client)


@router.post("/api/workflows/resume")
def resume_many(body: BulkBody, client: ClientOf) -> Response:
    """Resume many workflows, each as its own resume would; the others are counted."""
    return _bulk("resume", body, client)


@router.post("/api/workflows/delete")
def delete_many(body: BulkBody, client: ClientOf) -> Response:
    """Delete many finished workflows with their rows; unfinished and in-doubt ones are
    counted, not deleted."""
    return _bulk("delete", body, client)


@router.post("/api/workflows/send")
def send_many(body: SendBulkBody, client: ClientOf) -> Response:
    """Send many messages in one statement: all, or none (404 for a missing workflow)."""
    sent = client.send_bulk(
        (m.workflow_id, m.message, m.topic, m.idempotency_key) for m in body.messages
    )
    return json_response({"messages": len(body.messages), "sent": sent})


@router.get("/api/workflows")
def list_workflows(
    client: ClientOf,
    status: WorkflowStatus | None = None,
    name: str | None = None,
    queue: str | None = None,
    partition: str | None = None,
    executor: str | None = None,
    since: Annotated[str | None, Query(description="ISO time or 30m, 2h, 7d ago")] = None,
    until: Annotated[str | None, Query(description="ISO time or 30m, 2h, 7d ago")] = None,
    limit: Annotated[int, Query(ge=1, le=10_000)] = 100,
    load_input: bool = True,
    load_output: bool = True,
) -> Response:
    """Workflows matching every given filter, newest first (the CLI's filters);
    ``load_input=false``/``load_output=false`` leave ``inputs``/``output`` null, unread
    (the dashboard's list shows neither)."""
    found = client.list_workflows(
        load_input=load_input,
        load_output=load_output,
        status=status,
        name=None if name is None else check_identifier(name, "workflow name"),
        queue=None if queue is None else check_identifier(queue, "queue name"),
        partition_key=None if partition is None else check_identifier(partition, "partition key"),
        executor_id=None if executor is None else check_identifier(executor, "executor id"),
        created_after=None if since is None else parse_moment(since),
        created_before=None if until is None else parse_moment(until),
        limit=limit,
    )
    return json_response([workflow_document(info) for info in found])


@router.get(ONE)
def show(workflow_id: str, client: ClientOf) -> Response:
    """One workflow with its steps (timings, attempts, tokens) and its token usage."""
    info = client.get_workflow(workflow_id)
    steps = client.list_steps(workflow_id)
    digests = [describe_step(step) for step in steps]
    edits = client.edits(workflow_id)
    edited = documents.edited_steps(edits)
    document = workflow_document(info)
    document["edits"] = edits
    document["actions"] = {  # what the dashboard offers: what the status allows
        "cancel": info.status in CANCELLABLE,
        "resume": info.status in RESUMABLE,
        "retry": info.retrying is not None,
        "rewind": info.status in REWINDABLE and bool(steps),
    }
    document["steps"] = [
        {
            **documents.step_json(s, d),
            "summary": d.summary if d else None,
            "replayed": info.replayed(s),
            "edited": s.seq in edited,
        }
        for s, d in zip(steps, digests, strict=True)
    ]
    document["usage"] = documents.token_totals(digests)
    budget = client.get_event(workflow_id, documents.BUDGET_EVENT)
    document["budget"] = documents.budget_json(
        None if budget is None else json.dumps(budget), document["usage"]
    )
    return json_response(document)


@router.get(ONE + "/steps")
def steps(workflow_id: str, client: ClientOf) -> Response:
    """The recorded steps of a workflow, in order."""
    found = client.list_steps(workflow_id)
    return json_response([documents.step_json(s, describe_step(s)) for s in found])


@router.post(ONE + "/cancel")
def cancel(workflow_id: str, client: ClientOf) -> Response:
    """Cancel a workflow (and the ones it started); cancelling again changes nothing."""
    previous = client.cancel(workflow_id)
    return json_response({"workflow_id": workflow_id, "previous_status": previous})


@router.post(ONE + "/resume")
def resume(workflow_id: str, client: ClientOf) -> Response:
    """Make a cancelled or dead-lettered workflow PENDING again (a worker continues it)."""
    report = client.resume(workflow_id).report
    assert isinstance(report, ResumeResult)
    return json_response({"workflow_id": workflow_id, "previous_status": report.previous})


@router.post(ONE + "/fork")
def fork(workflow_id: str, body: ForkBody, client: ClientOf) -> Response:
    """A new workflow that reuses the steps before ``from_step`` and runs live from it."""
    handle = client.fork(
        workflow_id,
        body.from_step,
        new_workflow_id=body.new_id,
        inputs=body.inputs,
        replace=body.replace,
        by=body.by or "api",
    )
    result = handle.report
    assert isinstance(result, ForkResult)
    return json_response(
        {
            "workflow_id": handle.workflow_id,
            "status": WorkflowStatus.PENDING,
            "forked_from": workflow_id,
            "forked_from_step": result.from_step,
            "requested_from_step": body.from_step,
            "copied_steps": result.copied_steps,
            "executor_id": result.executor_id,
        }
    )


@router.post(ONE + "/retry")
def retry(workflow_id: str, client: ClientOf) -> Response:
    """Try now the steps that wait out a failing dependency (``dbos-agent retry``)."""
    waiting = client.retry(workflow_id)
    return json_response({"workflow_id": workflow_id, "retrying": waiting})


@router.post(ONE + "/send")
def send(workflow_id: str, body: SendBody, client: ClientOf) -> Response:
    """Send a message to the workflow (it receives it with ``recv(topic)``)."""
    sent = client.send(workflow_id, body.message, body.topic, body.idempotency_key)
    return json_response({"workflow_id": workflow_id, "topic": body.topic, "sent": sent})


@router.post(ONE + "/steps/{seq}/resolve")
def resolve(workflow_id: str, seq: int, body: ResolveBody, client: ClientOf) -> Response:
    """Resolve an in-doubt step: record the result it had, or let it run again."""
    if body.rerun == ("result" in body.model_fields_set):
        raise ValueError('give exactly one of "result" (it happened) or "rerun": true')
    if body.rerun:
        handle = client.resolve_in_doubt(workflow_id, seq, rerun=True)
    else:
        handle = client.resolve_in_doubt(workflow_id, seq, result=body.result)
    return json_response({"workflow_id": workflow_id, "seq": seq, "status": handle.status()})


@router.post(ONE + "/rewind")
def rewind(workflow_id: str, body: RewindBody, client: ClientOf) -> Response:
    """Run a stopped workflow again in place from ``to_step`` (a worker continues it)."""
    report = client.rewind(workflow_id, body.to_step, by=body.by or "api").report
    assert isinstance(report, RewindResult)
    return json_response(
        {"workflow_id": workflow_id, "status": report.now, "previous_status": report.previous}
        | {
            "to_step": body.to_step,
            "deleted_steps": report.deleted_steps,
            "unconsumed_messages": report.unconsumed_messages,
            "stream_items": report.stream_items,
            "events": report.events,
        }
    )
