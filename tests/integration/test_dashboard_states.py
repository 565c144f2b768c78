"""The dashboard in every state a workflow can be in, in a real browser (Debian's chromium
driven by Playwright) against the real app: empty, long ids, waiting for each kind of
thing (a message, a human's approval, a timer, a child, an event, a failing dependency,
code that fits a held log, a live owner, a queue's turn), finished, failed, cancelled;
and each action acknowledged at once. Screenshots of each state go to the test's
temporary folder (and $DBOS_AGENT_SCREENSHOTS, to look at)."""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

import dbos_agent as da
from tests.apps.diverging import hold_diverged
from tests.helpers import new_id, per_test, wait_until
from tests.support.web import CHROMIUM, NEEDS_CHROMIUM, TOKEN, Server, dashboard, screenshot

pytestmark = pytest.mark.long  # a minute or more in the suite: started first

if TYPE_CHECKING:
    from playwright.sync_api import Locator, Page, Route

DOWN: set[str] = per_test(set())
LONG = "customer-order-with-a-rather-long-reference-number-0123456789-abcdefghij"
#: A name as Pydantic AI's tools make them: long, and without a space to break at.
LONG_STEP = "shopper__function:lookup_price_of_every_item_in_the_basket"
TIME = r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d"


@da.step(name=LONG_STEP)
def lookup(key: str) -> dict[str, str]:
    return {"key": key, "value": f"the value of {key}"}


@da.durable_workflow(name="dash_message")
def on_message(key: str) -> str:
    found = lookup(key)
    return str(da.recv("go", timeout=3600)) + found["value"]


@da.durable_workflow(name="dash_approval")
def on_approval(branch: str) -> str:
    decision = da.request_approval("delete_branch", {"name": branch, "force": True})
    return "deleted" if decision.approved else f"kept: {decision.reason}"


@da.durable_workflow(name="dash_timer")
def on_timer() -> str:
    da.sleep(3600)
    return "woke"


@da.durable_workflow(name="dash_parent")
def on_child(key: str) -> str:
    return str(da.start(on_message, key, workflow_id=f"{da.current_workflow_id()}-child").result())


@da.durable_workflow(name="dash_event")
def on_event(publisher: str) -> object:
    return da.get_event(publisher, "ready", timeout=3600)


@da.step(retry_on=(ConnectionError,), give_up_after=3600, waits_for="the payments API")
def charge(order: str) -> str:
    if order in DOWN:
        raise ConnectionError("payments API refused the connection")
    return f"charged {order}"


@da.durable_workflow(name="dash_dependency")
def on_dependency(order: str) -> str:
    return charge(order)


@da.durable_workflow(name="dash_shopper__function:lookup_price_of_every_item")
def shopper(key: str) -> dict[str, str]:
    da.write_stream("output", "looking up ")
    found = lookup(key)
    da.write_stream("output", f"{found['value']}.")
    da.write_stream("progress", {"looked_up": [key], "of": 1})
    if da.patched("dash.price_in_cents"):
        found["unit"] = "cents"
    return found


@da.durable_workflow(name="dash_failing")
def failing(key: str) -> None:
    lookup(key)
    detail = {"item": key, "answer": {"price": "n/a", "currency": None, "note": "x" * 90}}
    raise ValueError(f"the price of {key!r} is not a number: {detail}")


def _kind(row: Locator) -> str | None:
    return row.get_by_test_id("wait-badge").get_attribute("data-kind")


def _style(locator: Locator, prop: str) -> str:
    return str(locator.evaluate(f"e => getComputedStyle(e).{prop}"))


def _fits(locator: Locator) -> bool:
    """Nothing of it is cut or runs out of its box."""
    return bool(locator.evaluate("e => e.scrollWidth <= e.clientWidth + 1"))


class Dashboard:
    """The page and how the test moves around it."""

    def __init__(self, page: Page, shots: Path) -> None:
        from playwright.sync_api import expect

        self.page = page
        self.shots = shots
        self.expect = expect

    def row(self, wid: str) -> Locator:
        return self.page.locator(f'tr[data-id="{wid}"]')

    def open(self, wid: str) -> None:
        """Click the row of ``wid`` until its detail shows: the list refreshes every few
        seconds, and a refresh between finding the row and clicking it (on a busy machine)
        can put another row under the click."""
        detail = self.page.get_by_test_id("detail-id")
        for _ in range(3):
            self.row(wid).click()
            try:
                self.expect(detail).to_have_text(wid, timeout=5_000)
                return
            except AssertionError:
                continue
        self.row(wid).click()
        self.expect(detail).to_have_text(wid, timeout=15_000)

    def waits_for(self, wid: str, kind: str, *words: str) -> None:
        """The list and the detail both say it waits for ``kind``, in these words."""
        row = self.row(wid)
        self.expect(row.get_by_test_id("wait-badge")).to_have_attribute(
            "data-kind", kind, timeout=15_000
        )
        self.open(wid)
        waiting = self.page.get_by_test_id("waiting-for")
        self.expect(waiting.get_by_test_id("wait-badge")).to_have_attribute(
            "data-kind", kind, timeout=15_000
        )
        for word in words:
            self.expect(waiting).to_contain_text(word)

    def buttons(self, label: str) -> Locator:
        return self.page.locator("#detail button:visible", has_text=re.compile(f"^{label}$"))

    def shot(self, name: str) -> None:
        screenshot(self.page, self.shots / f"{name}.png")


@pytest.fixture
def states(runtime: da.Runtime, dbos_agent_database_url: str) -> Iterator[dict[str, str]]:
    """A workflow in each state (ids by state); the unfinished ones cancelled after."""
    ids = {
        "message": new_id(f"{LONG}-waiting"),
        "approval": new_id("dash-approval"),
        "denied": new_id("dash-approval"),
        "timer": new_id("dash-timer"),
        "child": new_id("dash-parent"),
        "event": new_id("dash-event"),
        "dependency": new_id("dash-order"),
        "divergence": new_id("dash-held"),
        "finished": new_id(f"{LONG}-done"),
        "error": new_id("dash-failing"),
    }
    DOWN.add(ids["dependency"])
    starts: dict[str, tuple[Callable[..., Any], tuple[Any, ...]]] = {
        "message": (on_message, ("k1",)),
        "approval": (on_approval, ("old-feature",)),
        "denied": (on_approval, ("main",)),
        "timer": (on_timer, ()),
        "child": (on_child, ("k2",)),
        "event": (on_event, (ids["message"],)),
        "dependency": (on_dependency, (ids["dependency"],)),
        "finished": (shopper, ("k3",)),
        "error": (failing, ("k4",)),
    }
    for state, (function, args) in starts.items():
        da.start(function, *args, workflow_id=ids[state])
    hold_diverged(ids["divergence"])
    with da.Client(dbos_agent_database_url) as client:
        # Nobody serves this queue (and it may not start for an hour); its fork is PENDING
        # with no live owner, and no live process has its code: an orphan.
        queued = client.enqueue("dash-unserved", "dash_gone_app", 1, delay=3600)
        ids["queue"] = queued.workflow_id
        ids["orphan"] = client.fork(queued.workflow_id, 0).workflow_id
    assert da.retrieve(ids["finished"]).result(timeout=30)["unit"] == "cents"
    with pytest.raises(ValueError):
        da.retrieve(ids["error"]).result(timeout=30)
    try:
        yield ids
    finally:
        for wid in ids.values():
            if not da.retrieve(wid).status().finished:
                da.operations.cancel(wid)


@NEEDS_CHROMIUM
def test_the_dashboard_in_each_state(
    states: dict[str, str], server: Server, dbos_agent_postgres_url: str, tmp_path: Path
) -> None:
    """What each workflow waits for, by kind, in the list and in its detail; the actions
    that apply and no others; names, durations, streams and JSON as people read them."""
    from playwright.sync_api import sync_playwright

    from dbos_agent._storage.database import SystemDatabase
    from dbos_agent.testing.databases import fresh_database

    with sync_playwright() as pw:
        assert CHROMIUM is not None
        browser = pw.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
        try:
            page = browser.new_page(viewport={"width": 1400, "height": 900})
            ui = Dashboard(page, tmp_path)
            with fresh_database(dbos_agent_postgres_url) as empty_url:
                empty_db = SystemDatabase(empty_url, pool_size=1)
                empty_db.open()
                empty_db.migrate()
                empty_db.close()
                with Server(empty_url, TOKEN) as empty:
                    page.goto(f"{empty.base}/?token={TOKEN}")
                    ui.expect(page.get_by_test_id("workflows")).to_contain_text(
                        "no workflows yet", timeout=15_000
                    )
                    assert "token=" not in page.url  # not left in the history
                    ui.shot("01-empty")

            page.goto(f"{server.base}/?token={TOKEN}")
            _the_list(ui, states)
            _waiting_for_each_kind(ui, states)
            _approval(ui, states)
            _held(ui, states)
            _finished_and_failed(ui, states)
            _cancelled(ui, states)
        finally:
            browser.close()


def _the_list(ui: Dashboard, ids: dict[str, str]) -> None:
    """Each workflow's row says what it waits for, by kind; a workflow that waits for a
    human does not look like one that nobody runs; long ids keep both their ends."""
    expected = {
        state: kind
        for state, kind in [
            ("message", "message"),
            ("approval", "approval"),
            ("timer", "timer"),
            ("child", "child"),
            ("event", "event"),
            ("dependency", "dependency"),
            ("divergence", "divergence"),
            ("orphan", "orphan"),
            ("queue", "queue"),
        ]
    }
    for state, kind in expected.items():
        badge = ui.row(ids[state]).get_by_test_id("wait-badge")
        ui.expect(badge).to_have_attribute("data-kind", kind, timeout=30_000)
    for state in ("finished", "error"):
        ui.expect(ui.row(ids[state]).get_by_test_id("wait-badge")).to_have_count(0)
    human, orphan = ui.row(ids["approval"]), ui.row(ids["orphan"])
    human_badge, orphan_badge = (
        human.get_by_test_id("wait-badge"),
        orphan.get_by_test_id("wait-badge"),
    )
    assert _style(human_badge, "backgroundColor") != _style(orphan_badge, "backgroundColor")
    assert human_badge.inner_text() != orphan_badge.inner_text()
    orphan_status = orphan.get_by_test_id("row-status").locator(".badge")
    ui.expect(orphan_status).to_have_text("PENDING")
    assert _style(orphan_status, "borderTopStyle") == "dashed"
    assert _style(orphan_status, "backgroundColor") == "rgb(255, 255, 255)"

    long_row = ui.row(ids["message"])
    ui.expect(long_row.locator(".id")).to_have_text(f"customer…{ids['message'][-12:]}")
    ui.expect(long_row.locator(".id")).to_have_attribute("title", ids["message"])
    created = long_row.locator("td").nth(3)
    ui.expect(created).to_have_text(re.compile(f"^{TIME}$"))
    box = created.bounding_box()
    table = ui.page.locator("main section").first.bounding_box()
    assert box is not None and table is not None
    assert box["x"] + box["width"] <= table["x"] + table["width"], "Created is clipped"
    assert _fits(created), "Created is cut"
    ui.shot("02-list")


def _waiting_for_each_kind(ui: Dashboard, ids: dict[str, str]) -> None:
    page = ui.page
    ui.waits_for(ids["message"], "message", "'go'")
    ui.expect(page.get_by_test_id("detail-status")).to_have_text("SUSPENDED")
    ui.expect(ui.buttons("Cancel")).to_have_count(1)
    ui.expect(page.get_by_test_id("resume")).to_be_hidden()
    ui.expect(page.get_by_test_id("stream-box")).to_be_hidden()  # it never streamed
    name = page.get_by_test_id("step-0").get_by_test_id("step-name")
    ui.expect(name).to_have_text(LONG_STEP)  # whole, wrapped
    assert _fits(name), "a step's name is cut"
    ui.expect(page.get_by_test_id("step-0").get_by_test_id("step-result")).to_contain_text(
        '{"key": "k1", "value": "the value of k1"}'
    )
    ui.expect(page.get_by_test_id("step-1")).to_contain_text("dbos_agent.recv")  # it waits
    ui.expect(page.get_by_test_id("created")).to_have_text(re.compile(f"^{TIME} UTC$"))
    ui.expect(page.get_by_test_id("executor")).to_be_visible()
    ui.shot("03-waiting-message")

    ui.waits_for(ids["timer"], "timer")
    ui.expect(page.get_by_test_id("waiting-for")).to_contain_text("(in ")
    ui.shot("04-waiting-timer")

    ui.waits_for(ids["child"], "child", f"{ids['child']}-child")
    ui.shot("05-waiting-child")

    ui.waits_for(ids["event"], "event", "'ready'", ids["message"])
    ui.shot("06-waiting-event")

    ui.waits_for(ids["dependency"], "dependency", "the payments API")
    ui.expect(page.get_by_test_id("retry")).to_be_visible()
    ui.expect(page.get_by_test_id("step-0").get_by_test_id("step-result")).to_contain_text(
        "last error: ConnectionError"
    )
    ui.shot("07-waiting-dependency")

    ui.waits_for(ids["orphan"], "orphan")
    ui.expect(page.get_by_test_id("waiting-for")).to_contain_text("takes it over")
    ui.expect(page.get_by_test_id("executor")).to_contain_text("not live")
    ui.expect(ui.buttons("Cancel")).to_have_count(1)
    ui.shot("08-orphan")

    ui.waits_for(ids["queue"], "queue")
    ui.expect(page.get_by_test_id("detail-status")).to_have_text("ENQUEUED")
    ui.expect(page.get_by_test_id("executor")).to_have_count(0)  # nobody owns it yet
    ui.shot("09-queued")


def _approval(ui: Dashboard, ids: dict[str, str]) -> None:
    """The header names the step that waits (the recv after the request); Approve is
    acknowledged before the server has answered."""
    page, wid = ui.page, ids["approval"]
    ui.waits_for(wid, "approval", "delete_branch", "waits at step 1", "asked at step 0")
    request = page.get_by_test_id("approval-0")
    ui.expect(request).to_contain_text('{"name": "old-feature", "force": true}')
    ui.expect(request).to_contain_text("the workflow waits at step 1")
    ui.expect(page.get_by_test_id("step-1")).to_contain_text("dbos_agent.recv")
    ui.expect(page.get_by_test_id("step-0")).to_have_count(0)  # the request: a library step
    page.get_by_test_id("library-toggle").click()
    ui.expect(page.get_by_test_id("step-0")).to_contain_text("dbos_agent.request_approval")
    page.get_by_test_id("library-toggle").click()
    ui.expect(page.get_by_test_id("step-0")).to_have_count(0)
    ui.shot("10-approval")

    held: list[Route] = []
    page.route(re.compile(r"/approvals/\d+$"), lambda route: held.append(route))
    page.get_by_test_id("approve-0").click()
    ui.expect(page.get_by_test_id("ack")).to_have_text("Approving delete_branch (step 0)…")
    ui.expect(page.get_by_test_id("approve-0")).to_be_disabled()
    for _ in range(200):  # the request is held here: the page did not wait for an answer
        if held:
            break
        page.wait_for_timeout(50)
    assert held, "the approval was not sent"
    ui.shot("11-approving")
    held[0].continue_()
    page.unroute(re.compile(r"/approvals/\d+$"))
    ui.expect(page.get_by_test_id("ack")).to_have_text(
        "Approved delete_branch (step 0): the workflow continues.", timeout=15_000
    )
    ui.expect(page.get_by_test_id("detail-status")).to_have_text("SUCCESS", timeout=30_000)
    ui.expect(page.get_by_test_id("approvals")).to_have_count(0)
    ui.shot("12-approved")
    assert da.retrieve(wid).result(timeout=10) == "deleted"

    ui.waits_for(ids["denied"], "approval", "delete_branch")
    page.get_by_test_id("reason-0").fill("main stays")
    page.get_by_test_id("deny-0").click()
    ui.expect(page.get_by_test_id("ack")).to_have_text(
        re.compile(r"^Denying delete_branch \(step 0\)…$|^Denied ")
    )
    ui.expect(page.get_by_test_id("ack")).to_have_text(
        "Denied delete_branch (step 0): the workflow gets the answer and the reason.",
        timeout=15_000,
    )
    ui.expect(page.get_by_test_id("output")).to_have_text("kept: main stays", timeout=30_000)


def _held(ui: Dashboard, ids: dict[str, str]) -> None:
    """A DIVERGED workflow: why, what now, one Cancel, a Resume that says what it does,
    no executor (nobody owns it)."""
    page = ui.page
    ui.waits_for(ids["divergence"], "divergence")
    ui.expect(page.get_by_test_id("diverged")).to_contain_text("What now: deploy code that fits")
    ui.expect(page.get_by_test_id("step-diverged")).to_have_text("code calls 'audit'")
    ui.expect(ui.buttons("Cancel")).to_have_count(1)
    ui.expect(ui.buttons("Resume")).to_have_count(1)
    ui.expect(page.get_by_test_id("resume-why")).to_contain_text("every process try it again")
    ui.expect(page.get_by_test_id("executor")).to_have_count(0)
    ui.expect(page.locator("#fork-step")).to_have_value("0")
    ui.shot("13-diverged")


def _finished_and_failed(ui: Dashboard, ids: dict[str, str]) -> None:
    page = ui.page
    ui.open(ids["finished"])
    ui.expect(page.get_by_test_id("detail-status")).to_have_text("SUCCESS")
    ui.expect(page.get_by_test_id("waiting-for")).to_have_text("-")
    ui.expect(ui.buttons("Cancel")).to_have_count(0)
    ui.expect(ui.buttons("Resume")).to_have_count(0)
    ui.expect(page.get_by_test_id("finished")).to_have_text(re.compile(f"^{TIME} UTC$"))
    ui.expect(page.get_by_test_id("output")).to_have_text(
        '{"key": "k3", "unit": "cents", "value": "the value of k3"}'  # as jsonb keeps it
    )
    picker = page.get_by_test_id("stream-key")
    ui.expect(picker.locator("option")).to_have_text(["output", "progress"], timeout=15_000)
    ui.expect(picker).to_have_value("output")
    ui.expect(page.get_by_test_id("stream")).to_have_text("looking up the value of k3.")
    # the stream writes and the patch marker are the library's: folded until asked for
    steps = page.get_by_test_id("steps")
    ui.expect(steps.locator("tbody tr")).to_have_count(1)
    ui.expect(steps).not_to_contain_text("dbos_agent.write_stream")
    page.get_by_test_id("library-toggle").click()
    ui.expect(steps.locator("tbody tr")).to_have_count(5)
    ui.expect(steps).to_contain_text("dbos_agent.patch:dash.price_in_cents")
    picker.select_option("progress")
    ui.expect(page.get_by_test_id("stream")).to_have_text('{"of": 1, "looked_up": ["k3"]}')
    ui.shot("14-finished")
    page.get_by_test_id("library-toggle").click()
    picker.select_option("output")
    # a server without the `waiting` document: what its status and `waiting_for` say
    older = """[{status: "DIVERGED", diverged: {summary: "step 0"}, waiting_for: null},
                {status: "ENQUEUED", waiting_for: null},
                {status: "SUSPENDED", waiting_for: "recv 'go'", retrying: null},
                {status: "PENDING", waiting_for: "the model API since ...", retrying: {}},
                {status: "SUCCESS", waiting_for: null}].map(waitOf)"""
    assert page.evaluate(older) == [
        {"kind": "divergence", "text": "code that fits its log (step 0)"},
        {"kind": "queue", "text": "its turn in its queue"},
        {"kind": None, "text": "recv 'go'"},
        {"kind": "dependency", "text": "the model API since ..."},
        None,
    ]
    durations = "[840.2, 4200, 63510, 7_500_000].map((ms) => duration(ms))"
    assert page.evaluate(durations) == ["840 ms", "4.20 s", "1 min 4 s", "2 h 5 min"]

    ui.open(ids["error"])
    ui.expect(page.get_by_test_id("detail-status")).to_have_text("ERROR")
    output = page.get_by_test_id("output")
    ui.expect(output).to_contain_text("ValueError: the price of 'k4' is not a number")
    assert _fits(output), "the error runs out of its box"
    ui.expect(ui.buttons("Cancel")).to_have_count(0)
    ui.expect(ui.buttons("Resume")).to_have_count(0)
    ui.shot("15-error")


def _cancelled(ui: Dashboard, ids: dict[str, str]) -> None:
    """Cancel is acknowledged at once; a cancelled workflow offers Resume and says what
    it does."""
    page, wid = ui.page, ids["message"]
    ui.open(wid)
    page.get_by_test_id("cancel").click()
    ui.expect(page.get_by_test_id("ack")).to_have_text(
        re.compile(r"^(Cancelling…|Cancelled \(it was SUSPENDED\)\.)$")
    )
    ui.expect(page.get_by_test_id("detail-status")).to_have_text("CANCELLED", timeout=15_000)
    ui.expect(page.get_by_test_id("ack")).to_have_text("Cancelled (it was SUSPENDED).")
    ui.expect(page.get_by_test_id("resume")).to_be_visible()
    ui.expect(page.get_by_test_id("resume-why")).to_contain_text("Resume makes it PENDING again")
    ui.expect(page.get_by_test_id("cancel")).to_be_hidden()
    ui.expect(page.get_by_test_id("output")).to_have_text(
        re.compile(r"^WorkflowCancelledError: workflow .* was cancelled")
    )
    ui.expect(ui.row(ids["event"]).get_by_test_id("wait-badge")).to_have_attribute(
        "data-kind", "event"
    )
    ui.shot("16-cancelled")

    page.get_by_test_id("resume").click()
    ui.expect(page.get_by_test_id("ack")).to_have_text(
        re.compile(r"^(Resuming…|Resumed \(it was CANCELLED\): .*)$")
    )
    ui.expect(page.get_by_test_id("ack")).to_have_text(
        "Resumed (it was CANCELLED): a worker with its code continues it."
    )
    # this process has its code: it runs it again from its log, and it waits again
    ui.expect(page.get_by_test_id("detail-status")).to_have_text("SUSPENDED", timeout=30_000)
    ui.expect(page.get_by_test_id("step-0").get_by_test_id("step-run")).to_have_text("replayed")
    ui.expect(page.get_by_test_id("resume")).to_be_hidden()
    ui.shot("17-resumed")


@NEEDS_CHROMIUM
def test_the_dashboard_opens_a_workflow_whose_id_has_slashes(server: Server) -> None:
    from playwright.sync_api import expect, sync_playwright

    wid = f"tenant/{new_id('web')}/run"
    with da.workflow_id(wid):
        da.start(on_message, "k3")
    wait_until(lambda: da.retrieve(wid).status() is da.WorkflowStatus.SUSPENDED, 15, "suspended")
    with sync_playwright() as pw, dashboard(pw, server) as page:
        page.locator(f'tr[data-id="{wid}"]').click()
        expect(page.locator("#detail h2.id")).to_have_text(wid, timeout=15_000)
        expect(page.get_by_test_id("step-0")).to_contain_text(LONG_STEP)
        page.get_by_test_id("send-topic").fill("go")
        page.get_by_test_id("send-message").fill('"via the page "')
        page.get_by_test_id("send").click()
        expect(page.get_by_test_id("detail-status")).to_have_text("SUCCESS", timeout=30_000)
    assert da.retrieve(wid).result(timeout=10) == "via the page the value of k3"
