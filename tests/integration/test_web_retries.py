"""A workflow waiting out a failing dependency, over HTTP and in the dashboard: what it
waits for, since when, its attempts and its last error; "Retry now" tries at once."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import httpx

import dbos_agent as da
from tests.helpers import new_id, per_test, wait_until
from tests.support.web import NEEDS_CHROMIUM, Server, dashboard, screenshot

CALLS: Counter[str] = per_test(Counter())
DOWN: set[str] = per_test(set())


@da.step(retry_on=(ConnectionError,), give_up_after=3600, waits_for="the payments API")
def charge(order: str) -> str:
    CALLS[order] += 1
    if order in DOWN:
        raise ConnectionError(f"payments API refused the connection (attempt {CALLS[order]})")
    return f"charged {order}"


@da.durable_workflow(name="web_pay")
def pay(order: str) -> str:
    return charge(order)


def _retrying(wid: str) -> bool:
    return da.retrieve(wid).get_info().retrying is not None


def test_a_retrying_workflow_over_http(api: httpx.Client) -> None:
    order = new_id("order")
    DOWN.add(order)
    handle = da.start(pay, order, workflow_id=order)
    wait_until(lambda: _retrying(order), 30, "the charge to wait")
    shown = api.get(f"/api/workflows/{order}").json()
    assert shown["actions"]["retry"] is True
    assert shown["waiting_for"].startswith("the payments API since ")
    assert "ConnectionError: payments API refused the connection" in shown["waiting_for"]
    assert shown["retrying"]["attempts"] >= 1 and shown["retrying"]["step"] == "charge"
    [step] = shown["steps"]
    assert step["status"] == "RETRYING" and step["retry"]["waiting_for"] == "the payments API"
    [listed] = [w for w in api.get("/api/workflows").json() if w["workflow_id"] == order]
    assert listed["waiting_for"] == shown["waiting_for"]

    DOWN.discard(order)
    assert api.post(f"/api/workflows/{order}/retry", json={}).json() == {
        "workflow_id": order,
        "retrying": 1,
    }
    assert handle.result(timeout=30) == f"charged {order}"
    refused = api.post(f"/api/workflows/{order}/retry", json={})
    assert refused.status_code == 409 and "already finished" in refused.json()["error"]
    assert api.post("/api/workflows/no-such-id/retry", json={}).status_code == 404


@NEEDS_CHROMIUM
def test_the_dashboard_says_what_a_workflow_waits_for_and_retries_it_now(
    server: Server, tmp_path: Path
) -> None:
    from playwright.sync_api import expect, sync_playwright

    order = new_id("order")
    DOWN.add(order)
    handle = da.start(pay, order, workflow_id=order)
    wait_until(lambda: _retrying(order), 30, "the charge to wait")
    with sync_playwright() as pw, dashboard(pw, server) as page:
        row = page.locator(f'tr[data-id="{order}"]')
        expect(row.get_by_test_id("wait-badge")).to_have_text("dependency", timeout=15_000)
        expect(row.get_by_test_id("row-waiting")).to_contain_text("the payments API")
        screenshot(page, tmp_path / "retrying-list.png")
        page.locator(f'tr[data-id="{order}"]').click()
        expect(page.get_by_test_id("waiting-for")).to_contain_text(
            "the payments API", timeout=15_000
        )
        expect(page.get_by_test_id("step-0")).to_contain_text("RETRYING")
        expect(page.get_by_test_id("step-0")).to_contain_text("last error: ConnectionError")
        expect(page.get_by_test_id("retry")).to_be_visible()
        screenshot(page, tmp_path / "retrying-detail.png")
        DOWN.discard(order)
        page.get_by_test_id("retry").click()
        expect(page.get_by_test_id("ack")).to_contain_text("Retrying now")
        expect(page.get_by_test_id("detail-status")).to_have_text("SUCCESS", timeout=30_000)
        expect(page.get_by_test_id("retry")).to_be_hidden()
        screenshot(page, tmp_path / "retried.png")
    assert handle.result(timeout=30) == f"charged {order}"
