"""The HTTP API and the dashboard, over real HTTP (uvicorn on a free port) and in a real
headless browser (Debian's chromium driven by Playwright): auth, JSON errors with the
right codes, operator actions, SSE streams resumed with Last-Event-ID, and an agent's
stream watched and its approval sent from the page."""

from __future__ import annotations

import json
import os
import re
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING

import anthropic
import httpx
import pytest

import dbos_agent as da
from dbos_agent.agent import Model
from dbos_agent.agent.scripted_server import Reply, ScriptedServer, text
from tests.apps.diverging import hold_diverged
from tests.helpers import new_id, wait_until
from tests.support import zygote
from tests.support.web import NEEDS_CHROMIUM, Server, dashboard, screenshot

pytestmark = pytest.mark.long  # a minute or more in the suite: started first

if TYPE_CHECKING:
    from playwright.sync_api import Page


@da.durable_workflow(name="web_waiter")
def waiter(words: int) -> str:
    speak(words)
    approval = da.recv("approval", timeout=60)
    da.write_stream("output", f" [approved: {approval}]")
    return f"done after {approval}"


@da.step
def speak(words: int) -> int:
    for i in range(words):
        da.write_stream("output", f"word{i} ")
        time.sleep(0.05)
    return words


@da.durable_workflow(name="web_quick")
def quick(x: int) -> int:
    return x + 1


def test_every_api_call_needs_the_token_and_errors_are_json(
    server: Server, api: httpx.Client, dbos_agent_database_url: str
) -> None:
    bare = httpx.get(server.base + "/api/workflows")
    assert bare.status_code == 401 and bare.json()["type"] == "Unauthorized"
    wrong = httpx.get(server.base + "/api/workflows", headers={"Authorization": "Bearer nope"})
    assert wrong.status_code == 401
    missing = api.get("/api/workflows/no-such-workflow")
    assert missing.status_code == 404 and "no-such-workflow" in missing.json()["error"]
    bad_body = api.post("/api/workflows/x/fork", json={"from_step": -1})
    assert bad_body.status_code == 422 and "from_step" in bad_body.json()["error"]
    bad_status = api.get("/api/workflows", params={"status": "NOPE"})
    assert bad_status.status_code == 422
    password_free = json.dumps([missing.json(), bad_body.json()])
    assert "password" not in password_free.lower()
    openapi = api.get("/api/openapi.json")
    assert openapi.status_code == 200 and "/api/workflows/{workflow_id}/fork" in openapi.text


def test_the_api_is_documented_by_what_its_routes_act_on(api: httpx.Client) -> None:
    paths = api.get("/api/openapi.json").json()["paths"]
    tags = {
        path: {t for op in ops.values() for t in op.get("tags", [])} for path, ops in paths.items()
    }
    assert tags["/api/workflows"] == {"workflows"}
    assert tags["/api/workflows/{workflow_id}/fork"] == {"workflows"}
    assert tags["/api/approvals"] == {"approvals"}
    assert tags["/api/workflows/{workflow_id}/approvals/{seq}"] == {"approvals"}
    assert tags["/api/workflows/{workflow_id}/streams/{key}"] == {"streams"}
    assert tags["/api/workflows/{workflow_id}/streams"] == {"streams"}
    assert "/" not in paths  # the dashboard's page is not part of the API


def test_operator_actions_over_http(api: httpx.Client) -> None:
    wid = new_id("web")
    with da.workflow_id(wid):
        assert quick(1) == 2
    listed = api.get("/api/workflows", params={"name": "web_quick", "status": "SUCCESS"}).json()
    assert wid in [w["workflow_id"] for w in listed]
    [mine] = [w for w in listed if w["workflow_id"] == wid]
    assert mine["inputs"] is not None and mine["output"] == 2
    # the dashboard's list reads neither value (each may be megabytes)
    bare: dict[str, str | int] = {
        "name": "web_quick",
        "load_input": "false",
        "load_output": "false",
        "limit": 10_000,
    }
    [lean] = [w for w in api.get("/api/workflows", params=bare).json() if w["workflow_id"] == wid]
    assert lean == {**mine, "inputs": None, "output": None}
    shown = api.get(f"/api/workflows/{wid}").json()
    assert shown["status"] == "SUCCESS" and shown["output"] == 2 and shown["steps"] == []
    assert api.get(f"/api/workflows/{wid}/steps").json() == []
    finished = api.post(f"/api/workflows/{wid}/cancel", json={})
    assert finished.status_code == 409  # a finished workflow keeps its outcome

    handle = da.start(waiter, 2)
    wait_until(
        lambda: (
            api.get(f"/api/workflows/{handle.workflow_id}").json()["status"]
            in ("PENDING", "SUSPENDED")
        ),
        10,
        "waiting",
    )
    sent = api.post(
        f"/api/workflows/{handle.workflow_id}/send", json={"topic": "approval", "message": "yes"}
    )
    assert sent.status_code == 200 and sent.json()["sent"] is True
    assert handle.result(timeout=30) == "done after yes"
    forked = api.post(f"/api/workflows/{handle.workflow_id}/fork", json={"from_step": 1})
    assert forked.status_code == 200
    new_id_ = forked.json()["workflow_id"]
    assert api.get(f"/api/workflows/{new_id_}").json()["forked_from"] == handle.workflow_id
    cancelled = api.post(f"/api/workflows/{new_id_}/cancel", json={})
    assert cancelled.status_code == 200
    resumed = api.post(f"/api/workflows/{new_id_}/resume", json={})
    assert resumed.status_code == 200 and resumed.json()["previous_status"] == "CANCELLED"
    api.post(f"/api/workflows/{new_id_}/cancel", json={})


def test_a_workflow_resumed_through_the_api_is_run_at_once_by_the_live_process(
    api: httpx.Client,
) -> None:
    """The API has no workflow code: it leaves the resumed workflow PENDING without an
    owner, and the application process beside it (its take-over hears the NOTIFY) runs it
    at once, not at its next restart."""
    handle = da.start(waiter, 1)
    wid = handle.workflow_id
    wait_until(
        lambda: da.operations.list_steps(wid) and da.operations.list_steps(wid)[0].name,
        10,
        "the first step",
    )
    assert api.post(f"/api/workflows/{wid}/cancel", json={}).status_code == 200
    resumed = api.post(f"/api/workflows/{wid}/resume", json={})
    assert resumed.status_code == 200 and resumed.json()["previous_status"] == "CANCELLED"
    assert api.post(
        f"/api/workflows/{wid}/send", json={"topic": "approval", "message": "again"}
    ).json()["sent"]
    assert da.retrieve(wid).result(timeout=10) == "done after again"


def test_a_stream_as_server_sent_events_resumes_from_last_event_id(api: httpx.Client) -> None:
    handle = da.start(waiter, 4)
    wait_until(
        lambda: "speak" in [s.name for s in da.operations.list_steps(handle.workflow_id)],
        20,
        "four words written",
    )
    da.send(handle.workflow_id, "ok", topic="approval")
    handle.result(timeout=30)

    def events(headers: dict[str, str]) -> list[tuple[str, str, dict[str, object]]]:
        out = []
        with api.stream(
            "GET", f"/api/workflows/{handle.workflow_id}/streams/output", headers=headers
        ) as response:
            assert response.status_code == 200
            assert response.headers["content-type"].startswith("text/event-stream")
            block: dict[str, str] = {}
            for line in response.iter_lines():
                if not line:
                    out.append((block.get("id", ""), block["event"], json.loads(block["data"])))
                    block = {}
                    continue
                field, _, value = line.partition(": ")
                block[field] = value
        return out

    everything = events({})
    assert everything[-1][1] == "end"
    values = [e for e in everything if e[1] == "value"]
    assert [e[2]["value"] for e in values] == [
        "word0 ",
        "word1 ",
        "word2 ",
        "word3 ",
        " [approved: ok]",
    ]
    resumed = events({"Last-Event-ID": values[1][0]})
    assert [e[2]["offset"] for e in resumed if e[1] == "value"] == [2, 3, 4]


@da.durable_workflow(name="web_two_streams")
def two_streams() -> int:
    da.write_stream("output", "a")
    da.write_stream("progress", {"done": 1})
    da.close_stream("progress")
    return 1


def test_a_workflows_stream_keys_are_listed(api: httpx.Client) -> None:
    """What the dashboard's stream picker offers: the keys written, in order, with their
    length and whether they are closed; none for a workflow that never streamed."""
    handle = da.start(two_streams)
    assert handle.result(timeout=30) == 1
    assert api.get(f"/api/workflows/{handle.workflow_id}/streams").json() == [
        {"key": "output", "next_offset": 1, "closed": False},
        {"key": "progress", "next_offset": 2, "closed": True},
    ]
    quiet = new_id("web")
    with da.workflow_id(quiet):
        assert quick(1) == 2
    assert api.get(f"/api/workflows/{quiet}/streams").json() == []
    missing = api.get("/api/workflows/no-such-workflow/streams")
    assert missing.status_code == 404 and missing.json()["type"] == "WorkflowNotFoundError"


def test_serve_refuses_a_public_address_without_a_token() -> None:
    env = {k: v for k, v in os.environ.items() if k != "DBOS_AGENT_HTTP_TOKEN"}
    refused = zygote.run(
        [sys.executable, "-m", "dbos_agent", "serve", "--host", "0.0.0.0", "--no-token"],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
    )
    assert refused.returncode == 2 and "without a token" in refused.stderr


@NEEDS_CHROMIUM
def test_the_dashboard_shows_an_agents_stream_and_sends_its_approval(
    server: Server, tmp_path: Path
) -> None:
    from playwright.sync_api import expect, sync_playwright

    handle = da.start(waiter, 30)
    with sync_playwright() as pw, dashboard(pw, server) as page:
        row = page.locator(f'tr[data-id="{handle.workflow_id}"]')
        expect(row).to_be_visible(timeout=15_000)
        row.click()
        stream = page.get_by_test_id("stream")
        expect(stream).to_contain_text("word3", timeout=15_000)  # live, while it speaks
        page.screenshot(path=str(tmp_path / "streaming.png"))
        expect(stream).to_contain_text("word29", timeout=30_000)
        page.get_by_test_id("send-topic").fill("approval")
        page.get_by_test_id("send-message").fill('"from the page"')
        page.get_by_test_id("send").click()
        expect(page.get_by_test_id("detail-status")).to_contain_text("SUCCESS", timeout=30_000)
        expect(stream).to_contain_text("[approved: from the page]", timeout=15_000)
        page.screenshot(path=str(tmp_path / "approved.png"), full_page=True)
    assert handle.result(timeout=10) == "done after from the page"
    for shot in ("streaming.png", "approved.png"):
        data = (tmp_path / shot).read_bytes()
        assert data.startswith(b"\x89PNG") and len(data) > 10_000, shot


@da.durable_workflow(name="web_guarded")
def guarded(branch: str) -> str:
    decision = da.request_approval("delete_branch", {"name": branch})
    return "deleted" if decision.approved else f"kept: {decision.reason}"


@NEEDS_CHROMIUM
def test_the_dashboard_approves_the_exact_tool_call_it_shows(
    server: Server, tmp_path: Path
) -> None:
    from playwright.sync_api import expect, sync_playwright

    handle = da.start(guarded, "old-feature")
    wait_until(lambda: da.operations.list_approvals(handle.workflow_id), 15, "the approval request")
    with sync_playwright() as pw, dashboard(pw, server) as page:
        page.locator(f'tr[data-id="{handle.workflow_id}"]').click()
        request = page.get_by_test_id("approval-0")
        expect(request).to_contain_text("delete_branch", timeout=15_000)
        expect(request).to_contain_text('{"name": "old-feature"}')
        page.screenshot(path=str(tmp_path / "asking.png"))
        page.get_by_test_id("approve-0").click()
        expect(page.get_by_test_id("detail-status")).to_contain_text("SUCCESS", timeout=30_000)
        expect(page.get_by_test_id("approvals")).to_have_count(0)
        page.screenshot(path=str(tmp_path / "approved-call.png"))
    assert handle.result(timeout=10) == "deleted"
    (decided,) = da.operations.list_approvals(handle.workflow_id)
    assert decided.status == "APPROVED"
    for shot in ("asking.png", "approved-call.png"):
        data = (tmp_path / shot).read_bytes()
        assert data.startswith(b"\x89PNG") and len(data) > 10_000, shot


@da.step
def numbered(i: int) -> int:
    return i


@da.durable_workflow(name="web_resumed")
def resumed() -> int:
    total = numbered(1) + numbered(2)
    da.recv("go", timeout=3600)  # suspends: the woken run replays the two steps
    return total + numbered(3)


def test_each_step_says_whether_the_latest_run_replayed_it(api: httpx.Client) -> None:
    handle = da.start(resumed)
    wait_until(
        lambda: api.get(f"/api/workflows/{handle.workflow_id}").json()["status"] == "SUSPENDED",
        15,
        "suspended",
    )
    da.send(handle.workflow_id, "now", topic="go")
    assert handle.result(timeout=30) == 6
    steps = api.get(f"/api/workflows/{handle.workflow_id}").json()["steps"]
    assert [(s["name"], s["replayed"]) for s in steps] == [
        ("numbered", True),
        ("numbered", True),
        ("dbos_agent.recv", False),
        ("numbered", False),
    ]


@da.durable_workflow(name="web_spender")
def spender(calls: int) -> int:
    for _ in range(calls):
        MODELS["model"].create([{"role": "user", "content": "hi"}])
    return calls


MODELS: dict[str, Model] = {}


@NEEDS_CHROMIUM
def test_the_dashboard_charts_tokens_and_cost_over_time(
    server: Server, api: httpx.Client, tmp_path: Path
) -> None:
    from playwright.sync_api import expect, sync_playwright

    with ScriptedServer(lambda body: Reply((text("ok"),), usage=(1000, 500))) as model:
        MODELS["model"] = Model(
            anthropic.Anthropic(base_url=model.url, api_key="x"), model="claude-haiku-4-5"
        )
        handle = da.start(spender, 3)
        assert handle.result(timeout=30) == 3
    shown = api.get(f"/api/workflows/{handle.workflow_id}").json()
    assert [s["cost_usd"] for s in shown["steps"]] == [pytest.approx(0.0035)] * 3
    with sync_playwright() as pw, dashboard(pw, server) as page:
        page.locator(f'tr[data-id="{handle.workflow_id}"]').click()
        chart = page.get_by_test_id("spend-chart")
        expect(chart).to_contain_text("4500 tokens", timeout=15_000)
        expect(chart).to_contain_text("$0.0105")
        expect(page.get_by_test_id("usage")).to_contain_text("3000 in, 1500 out")
        ticks = chart.get_by_test_id("time-tick")
        expect(ticks.first.locator("text")).to_have_text(re.compile(r"^\d\d:\d\d(:\d\d)?$"))
        assert ticks.count() >= 2, "the time axis has one tick or none"
        expect(chart).to_contain_text("UTC")
        screenshot(page, tmp_path / "chart.png")


def test_a_diverged_workflow_over_http(api: httpx.Client) -> None:
    """Listed and shown with why it is held; resume (every process tries it again: this
    one's code still does not fit, so it is held again), fork and cancel, the operator's
    choices, work."""
    wid = new_id("web-diverged")
    hold_diverged(wid)
    listed = api.get("/api/workflows", params={"status": "DIVERGED", "limit": 10_000}).json()
    (found,) = (w for w in listed if w["workflow_id"] == wid)
    assert found["status"] == "DIVERGED"
    assert found["diverged"]["summary"] == "step 0: log 'prepare', code 'audit'"
    shown = api.get(f"/api/workflows/{wid}").json()
    assert shown["diverged"] == found["diverged"]
    assert (shown["diverged"]["position"], shown["diverged"]["called"]) == (0, "audit")
    assert shown["diverged"]["why"].startswith("at step 0 the log recorded 'prepare' but the code")
    assert [s["name"] for s in shown["steps"]] == ["prepare"]

    resumed = api.post(f"/api/workflows/{wid}/resume", json={})
    assert resumed.status_code == 200 and resumed.json()["previous_status"] == "DIVERGED"
    wait_until(
        lambda: api.get(f"/api/workflows/{wid}").json()["status"] == "DIVERGED", 30, "held again"
    )
    forked = api.post(f"/api/workflows/{wid}/fork", json={"from_step": 0})
    assert forked.status_code == 200
    fork_id = forked.json()["workflow_id"]
    assert da.retrieve(fork_id).result(timeout=30) == [f"audited {wid}", f"applied {wid}"]
    assert api.get(f"/api/workflows/{fork_id}").json()["diverged"] is None

    cancelled = api.post(f"/api/workflows/{wid}/cancel", json={})
    assert cancelled.status_code == 200 and cancelled.json()["previous_status"] == "DIVERGED"
    after = api.get(f"/api/workflows/{wid}").json()
    assert after["status"] == "CANCELLED"
    assert {**after["diverged"], "at": None} == {**found["diverged"], "at": None}  # its history


def _background(page: Page, selector: str) -> str:
    return str(page.locator(selector).first.evaluate("e => getComputedStyle(e).backgroundColor"))


@NEEDS_CHROMIUM
def test_the_dashboard_says_why_a_workflow_is_held_and_offers_fork_and_cancel(
    server: Server, tmp_path: Path
) -> None:
    from playwright.sync_api import expect, sync_playwright

    long = "order-for-a-customer-with-a-rather-long-name-and-a-longer-reference-number"
    held, finished = new_id(f"{long}-held"), new_id(f"{long}-done")
    why = hold_diverged(held).diverged
    assert why is not None
    with da.workflow_id(finished):
        assert quick(1) == 2
    waiting = da.start(waiter, 0)  # suspended: its line says what it waits for
    with sync_playwright() as pw, dashboard(pw, server) as page:
        row = page.locator(f'tr[data-id="{held}"]')
        expect(row.get_by_test_id("row-status")).to_have_text("DIVERGED", timeout=15_000)
        expect(row.get_by_test_id("wait-badge")).to_have_text("held")
        expect(row.get_by_test_id("row-waiting")).to_contain_text(
            "step 0: log 'prepare', code 'audit'"
        )
        expect(page.locator(f'tr[data-id="{finished}"]')).to_contain_text("SUCCESS")
        waiting_row = page.locator(f'tr[data-id="{waiting.workflow_id}"]')
        expect(waiting_row.get_by_test_id("row-waiting")).to_contain_text(
            "'approval'", timeout=15_000
        )
        diverged_colour = _background(page, f'tr[data-id="{held}"] .badge')
        assert diverged_colour == "rgb(255, 220, 194)"
        assert diverged_colour != _background(page, f'tr[data-id="{finished}"] .badge')
        page.screenshot(path=str(tmp_path / "list.png"))

        row.click()
        expect(page.get_by_test_id("diverged-why")).to_have_text(
            why.why().replace("at", "At", 1), timeout=15_000
        )
        expect(page.get_by_test_id("step-diverged")).to_have_text("code calls 'audit'")
        expect(page.get_by_test_id("detail-status")).to_have_text("DIVERGED")
        expect(page.get_by_test_id("diverged")).to_contain_text("What now: deploy code that fits")
        expect(page.locator("#fork-step")).to_have_value("0")
        page.screenshot(path=str(tmp_path / "held.png"))

        page.locator(f'tr[data-id="{finished}"]').click()
        expect(page.get_by_test_id("detail-status")).to_have_text("SUCCESS", timeout=15_000)
        expect(page.get_by_test_id("diverged")).to_have_count(0)
        page.screenshot(path=str(tmp_path / "finished.png"))

        row.click()
        page.get_by_test_id("diverged-fork").click()  # shows the fork, which runs here
        expect(page.locator("#detail h2.id")).not_to_have_text(held, timeout=15_000)
        expect(page.get_by_test_id("detail-status")).to_have_text("SUCCESS", timeout=30_000)
        page.screenshot(path=str(tmp_path / "forked.png"))

        row.click()
        expect(page.get_by_test_id("diverged-why")).to_be_visible(timeout=15_000)
        page.get_by_test_id("cancel").click()
        expect(page.get_by_test_id("detail-status")).to_have_text("CANCELLED", timeout=15_000)
        expect(page.get_by_test_id("diverged-earlier")).to_contain_text(why.why())
        page.screenshot(path=str(tmp_path / "cancelled.png"))
    assert da.retrieve(held).status() == da.WorkflowStatus.CANCELLED
    da.send(waiting.workflow_id, "yes", topic="approval")
    assert waiting.result(timeout=30) == "done after yes"
    for shot in ("list.png", "held.png", "finished.png", "forked.png", "cancelled.png"):
        assert (tmp_path / shot).read_bytes().startswith(b"\x89PNG"), shot
