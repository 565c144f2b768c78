"""`dbos-agent serve` against the attacks a local web server meets, over real HTTP: a page
of another origin posting to it (in real Chromium too), DNS rebinding (a foreign
``Host``), an unauthenticated body too large to hold, paths that escaped the token, ids
the API could not take; and the server process itself (token by default, a port in use,
SIGTERM)."""

from __future__ import annotations

import contextlib
import http.server
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import httpx
import pytest

import dbos_agent as da
from tests.helpers import new_id, wait_until
from tests.processes import ROOT, output
from tests.support import zygote
from tests.support.web import CHROMIUM, NEEDS_CHROMIUM, Server, free_port

if TYPE_CHECKING:
    from playwright.sync_api import Browser

TOKEN = "sec-token"


@pytest.fixture
def open_server(runtime: da.Runtime, dbos_agent_database_url: str) -> Iterator[Server]:
    """The server as `serve --no-token` runs it: no token, on loopback."""
    with Server(dbos_agent_database_url, token=None) as running:
        yield running


@pytest.fixture
def server(runtime: da.Runtime, dbos_agent_database_url: str) -> Iterator[Server]:
    with Server(dbos_agent_database_url, token=TOKEN) as running:
        yield running


AUTH = {"Authorization": f"Bearer {TOKEN}"}


@da.durable_workflow(name="sec_waiter")
def waiter() -> str:
    return str(da.recv("go", timeout=3600))


@da.durable_workflow(name="sec_quick")
def quick(x: int) -> int:
    return x + 1


def _waiting() -> str:
    handle = da.start(waiter)
    wait_until(lambda: handle.status() is da.WorkflowStatus.SUSPENDED, 30, "suspended")
    return handle.workflow_id


def test_a_post_from_a_foreign_origin_is_refused(open_server: Server) -> None:
    wid = _waiting()
    cancel = f"{open_server.base}/api/workflows/{wid}/cancel"
    foreign = httpx.post(cancel, json={}, headers={"Origin": "http://evil.example"})
    assert foreign.status_code == 403, foreign.text
    assert foreign.json()["type"] == "CrossOriginRequest"
    assert "evil.example" in foreign.json()["error"]
    cross_site = httpx.post(cancel, json={}, headers={"Sec-Fetch-Site": "cross-site"})
    assert cross_site.status_code == 403
    other_port = httpx.post(cancel, json={}, headers={"Origin": "http://127.0.0.1:1"})
    assert other_port.status_code == 403
    assert da.retrieve(wid).status() is da.WorkflowStatus.SUSPENDED
    own = httpx.post(cancel, json={}, headers={"Origin": open_server.base})
    assert own.status_code == 200 and own.json()["previous_status"] == "SUSPENDED"


def test_a_change_needs_a_json_body(open_server: Server) -> None:
    """A page of another origin can send text/plain (or nothing) without a preflight;
    it cannot send application/json."""
    wid = _waiting()
    cancel = f"{open_server.base}/api/workflows/{wid}/cancel"
    plain = httpx.post(cancel, content=b"{}", headers={"Content-Type": "text/plain"})
    assert plain.status_code == 415, plain.text
    assert plain.json()["type"] == "UnsupportedMediaType"
    bare = httpx.post(cancel)
    assert bare.status_code == 415
    form = httpx.post(f"{open_server.base}/api/workflows/{wid}/send", data={"message": "x"})
    assert form.status_code == 415
    assert da.retrieve(wid).status() is da.WorkflowStatus.SUSPENDED
    assert httpx.post(cancel, json={}).status_code == 200


def test_a_host_header_naming_another_server_is_refused(
    runtime: da.Runtime, dbos_agent_database_url: str
) -> None:
    """DNS rebinding: a page whose own domain now resolves to 127.0.0.1 sends its domain
    in Host. Loopback names and --allow-host names are this server's."""
    with Server(dbos_agent_database_url, token=None, allow_hosts=["dash.internal"]) as s:
        listing = f"{s.base}/api/workflows"
        rebound = httpx.get(listing, headers={"Host": f"attacker.example:{s.port}"})
        assert rebound.status_code == 421, rebound.text
        assert rebound.json()["type"] == "MisdirectedRequest"
        assert "attacker.example" in rebound.json()["error"]
        for name in (f"localhost:{s.port}", f"127.0.0.1:{s.port}", "dash.internal"):
            assert httpx.get(listing, headers={"Host": name}).status_code == 200, name
        page = httpx.get(s.base + "/", headers={"Host": "attacker.example"})
        assert page.status_code == 421


def _raw_request(port: int, head: str, body: bytes = b"") -> bytes:
    """Send a request as written, and read the answer until the server closes."""
    with socket.create_connection(("127.0.0.1", port), timeout=60) as sock:
        sock.sendall(head.replace("\n", "\r\n").encode() + b"\r\n" + body)
        answer = b""
        while chunk := sock.recv(65536):
            answer += chunk
    return answer


def test_a_body_too_large_is_refused_before_it_is_read(
    runtime: da.Runtime, dbos_agent_database_url: str
) -> None:
    """A huge Content-Length is answered at once, with only a few bytes sent (the server
    would otherwise wait for the rest); a chunked body is read only up to the limit; and
    without the token nothing is read at all."""
    with Server(dbos_agent_database_url, token=TOKEN, max_body_bytes=1000) as s:
        head = (
            "POST /api/workflows/x/send HTTP/1.1\nHost: 127.0.0.1\n"
            "Content-Type: application/json\nContent-Length: 100000000000\n"
        )
        answer = _raw_request(s.port, head + f"Authorization: Bearer {TOKEN}\n", b'{"message"')
        assert answer.startswith(b"HTTP/1.1 413"), answer[:200]
        assert b'"PayloadTooLarge"' in answer
        anonymous = _raw_request(s.port, head, b'{"message"')
        assert anonymous.startswith(b"HTTP/1.1 401"), anonymous[:200]

        def chunks() -> Iterator[bytes]:
            yield b'{"message": "'
            for _ in range(10):
                yield b"x" * 500
            yield b'"}'

        chunked = httpx.post(
            f"{s.base}/api/workflows/x/send",
            content=chunks(),
            headers={**AUTH, "Content-Type": "application/json"},
        )
        assert chunked.status_code == 413, chunked.text
        small = httpx.post(f"{s.base}/api/workflows/x/send", json={"message": "x"}, headers=AUTH)
        assert small.status_code == 404  # read, parsed, and answered: no such workflow


def test_every_path_but_the_dashboard_page_needs_the_token(server: Server) -> None:
    for path in ("/api/openapi.json", "/api/docs", "/api/workflows", "/api/nothing", "/docs"):
        bare = httpx.get(server.base + path)
        assert bare.status_code == 401, path
        assert bare.json() == {
            "error": "a bearer token is required: Authorization: Bearer <token>",
            "type": "Unauthorized",
        }
        assert bare.headers["www-authenticate"] == "Bearer"
    assert httpx.get(server.base + "/api/openapi.json", headers=AUTH).status_code == 200
    # no docs page: it would load Swagger UI's scripts from a CDN onto this origin
    assert httpx.get(server.base + "/api/docs", headers=AUTH).status_code == 404
    page = httpx.get(server.base + "/")
    assert page.status_code == 200 and "<html" in page.text


def test_a_bad_id_is_a_json_400(server: Server) -> None:
    for path in (
        "/api/workflows/a%00b",
        "/api/workflows/a%00b/steps",
        "/api/workflows/" + "x" * 1001,
        "/api/workflows/ok/streams/a%00b",
    ):
        answer = httpx.get(server.base + path, headers=AUTH)
        assert answer.status_code == 400, (path, answer.text)
        assert answer.json()["type"] == "InvalidIdentifierError", path
    posted = httpx.post(server.base + "/api/workflows/a%00b/cancel", json={}, headers=AUTH)
    assert posted.status_code == 400
    listed = httpx.get(server.base + "/api/workflows", params={"name": "a\x00b"}, headers=AUTH)
    assert listed.status_code == 400 and listed.json()["type"] == "InvalidIdentifierError"


def test_an_id_with_a_slash_works_through_the_api(server: Server) -> None:
    finished = f"team/{uuid.uuid4().hex[:8]}/report"
    with da.workflow_id(finished):
        assert quick(1) == 2
    waiting = f"team/{uuid.uuid4().hex[:8]}/wait%2Fing"  # a literal %2F too
    with da.workflow_id(waiting):
        da.start(waiter)
    wait_until(lambda: da.retrieve(waiting).status() is da.WorkflowStatus.SUSPENDED, 30, "wait")
    with httpx.Client(base_url=server.base, headers=AUTH) as api:
        encoded = finished.replace("/", "%2F")
        shown = api.get(f"/api/workflows/{encoded}")
        assert shown.status_code == 200, shown.text
        assert shown.json()["workflow_id"] == finished and shown.json()["output"] == 2
        assert api.get(f"/api/workflows/{encoded}/steps").json() == []
        assert api.get(f"/api/workflows/{encoded}/approvals").json() == []
        encoded = waiting.replace("%", "%25").replace("/", "%2F")
        sent = api.post(f"/api/workflows/{encoded}/send", json={"topic": "go", "message": "on"})
        assert sent.status_code == 200 and sent.json()["workflow_id"] == waiting
    assert da.retrieve(waiting).result(timeout=30) == "on"


def test_the_api_takes_the_clis_times_and_fork_says_what_it_made(server: Server) -> None:
    wid = new_id("sec-since")
    with da.workflow_id(wid):
        assert quick(1) == 2
    with httpx.Client(base_url=server.base, headers=AUTH) as api:
        for since in ("2h", "90m", "2020-01-01", "2020-01-01T10:00Z"):
            listed = api.get("/api/workflows", params={"since": since, "name": "sec_quick"})
            assert listed.status_code == 200, listed.text
            assert wid in [w["workflow_id"] for w in listed.json()], since
        later = api.get("/api/workflows", params={"until": "2h", "name": "sec_quick"}).json()
        assert wid not in [w["workflow_id"] for w in later]
        bad = api.get("/api/workflows", params={"since": "yesterday"})
        assert bad.status_code == 400 and "yesterday" in bad.json()["error"]
        forked = api.post(f"/api/workflows/{wid}/fork", json={"from_step": 0})
        assert forked.status_code == 200, forked.text
        document = forked.json()
        assert document == {
            "workflow_id": document["workflow_id"],
            "status": "PENDING",
            "forked_from": wid,
            "forked_from_step": 0,
            "requested_from_step": 0,
            "copied_steps": 0,
            "executor_id": document["executor_id"],
        }
        assert document["workflow_id"] != wid
    assert da.retrieve(document["workflow_id"]).result(timeout=30) == 2


class _Page(http.server.BaseHTTPRequestHandler):
    """Serves ``html`` at every path."""

    html = ""

    def do_GET(self) -> None:
        body = self.html.encode()
        self.send_response(200)
        self.send_header("Content-Type", "text/html")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


@contextlib.contextmanager
def _elsewhere(html: str) -> Iterator[str]:
    """A page of another origin (another port) serving ``html``: its URL."""
    page = type("Page", (_Page,), {"html": html})
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), page)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://localhost:{server.server_address[1]}/"
    finally:
        server.shutdown()
        server.server_close()


@contextlib.contextmanager
def _chromium() -> Iterator[Browser]:
    from playwright.sync_api import sync_playwright

    assert CHROMIUM is not None
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
        try:
            yield browser
        finally:
            browser.close()


@NEEDS_CHROMIUM
def test_a_page_of_another_origin_cannot_cancel_a_workflow_in_chromium(
    open_server: Server,
) -> None:
    """The page posts to the API as a page can without permission: ``no-cors``,
    ``text/plain``, and a bodiless POST."""
    wid = _waiting()
    script = f"""
        const target = {json.dumps(f"{open_server.base}/api/workflows/{wid}/cancel")};
        Promise.allSettled([
          fetch(target, {{method: "POST", mode: "no-cors",
                         headers: {{"Content-Type": "text/plain"}}, body: "{{}}"}}),
          fetch(target, {{method: "POST", mode: "no-cors"}}),
        ]).then(() => {{ document.title = "sent"; }});
    """
    attacker = f"<html><body><script>{script}</script></body></html>"
    with _elsewhere(attacker) as url, _chromium() as browser:
        page = browser.new_page()
        page.goto(url)
        page.wait_for_function("document.title === 'sent'", timeout=30_000)
    assert da.retrieve(wid).status() is da.WorkflowStatus.SUSPENDED


# -- the server process ------------------------------------------------------------------


def _serve(url: str, *args: str, cwd: Path = ROOT) -> subprocess.Popen[str]:
    env = {k: v for k, v in os.environ.items() if k != "DBOS_AGENT_HTTP_TOKEN"}
    return zygote.popen(
        [sys.executable, "-m", "dbos_agent", "--database-url", url, "serve", *args],
        env={**env, "PYTHONPATH": str(ROOT)},
        cwd=cwd,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def test_serve_makes_a_token_prints_its_url_and_stops_on_sigterm(
    dbos_agent_database_url: str,
) -> None:
    port = free_port()
    server = _serve(dbos_agent_database_url, "--port", str(port))
    try:
        assert server.stdout is not None
        first = server.stdout.readline()
        assert first.startswith("dbos_agent: serving postgresql://"), first
        second = server.stdout.readline()
        assert f"http://127.0.0.1:{port}/?token=" in second, second
        token = second.split("?token=")[1].split()[0]
        assert len(token) >= 24
        listing = f"http://127.0.0.1:{port}/api/workflows"
        assert httpx.get(listing).status_code == 401
        authorized = httpx.get(listing, headers={"Authorization": f"Bearer {token}"})
        assert authorized.status_code == 200
        server.send_signal(signal.SIGTERM)
        assert server.wait(30) == 0, server.stderr.read() if server.stderr else ""
    finally:
        server.kill()
        server.wait()


def test_serve_on_a_port_in_use_says_so_in_one_line_and_exits_1(
    dbos_agent_database_url: str,
) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen(1)
        port = taken.getsockname()[1]
        server = _serve(dbos_agent_database_url, "--port", str(port), "--no-token")
        out, err = server.communicate(timeout=60)
    assert server.returncode == 1, output(server, out, err)
    assert "dashboard at" not in out
    (line,) = err.splitlines()
    assert line.startswith(f"dbos-agent serve: error: cannot listen on 127.0.0.1:{port}: ")


def test_serve_without_a_token_only_on_loopback(dbos_agent_database_url: str) -> None:
    refused = _serve(dbos_agent_database_url, "--host", "0.0.0.0", "--no-token")
    out, err = refused.communicate(timeout=60)
    assert refused.returncode == 2 and "without a token" in err and out == ""
    port = free_port()
    server = _serve(dbos_agent_database_url, "--port", str(port), "--no-token")
    try:
        assert server.stdout is not None
        server.stdout.readline()
        assert "no token" in server.stdout.readline()
        assert httpx.get(f"http://127.0.0.1:{port}/api/workflows").status_code == 200
        server.send_signal(signal.SIGINT)
        assert server.wait(30) == 0
    finally:
        server.kill()
        server.wait()


def test_the_api_acts_through_the_client_and_filters_by_queue(server: Server) -> None:
    queue = da.Queue(f"sec-q-{uuid.uuid4().hex[:8]}")
    handle = queue.enqueue(quick, 2)
    assert handle.result(timeout=30) == 3
    with httpx.Client(base_url=server.base, headers=AUTH) as api:
        listed = api.get("/api/workflows", params={"queue": queue.name}).json()
        assert [w["workflow_id"] for w in listed] == [handle.workflow_id]
        assert api.get("/api/workflows", params={"queue": "no-such-queue"}).json() == []
        steps = api.get(f"/api/workflows/{handle.workflow_id}/steps")
        assert steps.status_code == 200 and steps.json() == []
        unknown = api.post("/api/workflows/nobody/send", json={"message": 1})
        assert unknown.status_code == 404 and unknown.json()["type"] == "WorkflowNotFoundError"


# -- headers: Host, repeated headers, other pages, framing (issue 29) --------------------


def _status_and_type(answer: bytes) -> tuple[int, str | None]:
    head, _, body = answer.partition(b"\r\n\r\n")
    kind = json.loads(body)["type"] if body.startswith(b"{") else None
    return int(head.split()[1]), kind


def test_a_host_header_that_is_not_only_a_host_and_port_is_refused(open_server: Server) -> None:
    """``localhost:80@evil.example`` was read as host ``localhost``: a strict parser takes
    a name or address and a port, nothing else."""
    port = open_server.port
    path = "/api/workflows?limit=1"
    for host in (
        "localhost:80@evil.example",
        "evil.example@localhost",
        f"127.0.0.1:{port} evil.example",
        f"127.0.0.1:{port}/x",
        "localhost:abc",
        "[::1]x",
        "::1",
        "",
    ):
        answer = _raw_request(port, f"GET {path} HTTP/1.1\nHost: {host}\nConnection: close\n")
        assert _status_and_type(answer) == (421, "MisdirectedRequest"), (host, answer[:300])
    for host in (f"localhost:{port}", "LOCALHOST", f"[::1]:{port}", "127.0.0.1", "localhost:"):
        answer = _raw_request(port, f"GET {path} HTTP/1.1\nHost: {host}\nConnection: close\n")
        assert _status_and_type(answer)[0] == 200, (host, answer[:300])


def test_a_request_with_a_header_twice_is_refused(server: Server) -> None:
    """Which of two ``Origin`` (or ``Authorization``...) headers would a proxy in front
    have checked? Neither is taken."""
    wid = _waiting()
    own = server.base
    twice: list[tuple[str, str]] = [("Origin", own), ("Origin", "http://evil.example")]
    for method, path in (("GET", "/api/workflows"), ("POST", f"/api/workflows/{wid}/cancel")):
        answer = httpx.request(method, server.base + path, json={}, headers=[*AUTH.items(), *twice])
        assert answer.status_code == 400, (method, answer.text)
        assert answer.json()["type"] == "DuplicateHeader" and "origin" in answer.json()["error"]
    tokens = [("Authorization", f"Bearer {TOKEN}"), ("Authorization", "Bearer other")]
    doubled = httpx.get(server.base + "/api/workflows", headers=tokens)
    assert doubled.status_code == 400 and doubled.json()["type"] == "DuplicateHeader"
    hosts = "GET /api/workflows HTTP/1.1\nHost: 127.0.0.1\nHost: evil.example\nConnection: close\n"
    assert _raw_request(server.port, hosts).startswith(b"HTTP/1.1 400 ")
    assert da.retrieve(wid).status() is da.WorkflowStatus.SUSPENDED


def test_no_page_of_another_origin_may_use_the_api_even_to_read(open_server: Server) -> None:
    """A page cannot read the answer to a cross-origin GET, but it could still hold a
    stream open or load the server: only the server's own pages (and requests no page
    sent) use the API; the dashboard's page opens from a link anywhere."""
    wid = _waiting()
    stream = f"{open_server.base}/api/workflows/{wid}/streams/s"
    for headers in (
        {"Origin": "http://evil.example"},
        {"Origin": "null"},
        {"Sec-Fetch-Site": "cross-site"},
        {"Sec-Fetch-Site": "same-site"},  # another port of localhost is the same site
    ):
        for url in (f"{open_server.base}/api/workflows", stream):
            answer = httpx.get(url, headers=headers)
            assert answer.status_code == 403, (headers, answer.text)
            assert answer.json()["type"] == "CrossOriginRequest"
    for headers in ({"Origin": open_server.base}, {"Sec-Fetch-Site": "same-origin"}, {}):
        assert httpx.get(f"{open_server.base}/api/workflows", headers=headers).status_code == 200
    page = httpx.get(open_server.base + "/", headers={"Sec-Fetch-Site": "cross-site"})
    assert page.status_code == 200 and "<html" in page.text


def test_every_answer_forbids_framing_and_the_page_runs_only_its_own_script(
    server: Server,
) -> None:
    answers = [
        httpx.get(server.base + "/api/workflows", headers=AUTH),
        httpx.get(server.base + "/api/workflows"),  # 401
        httpx.get(server.base + "/api/nothing", headers=AUTH),  # 404
        httpx.get(server.base + "/api/workflows", headers={"Host": "evil.example"}),  # 421
    ]
    assert [a.status_code for a in answers] == [200, 401, 404, 421]
    for answer in answers:
        assert answer.headers["x-frame-options"] == "DENY"
        assert answer.headers["content-security-policy"] == "frame-ancestors 'none'"
        assert answer.headers["x-content-type-options"] == "nosniff"
        assert answer.headers["referrer-policy"] == "no-referrer"
    page = httpx.get(server.base + "/")
    assert page.headers["x-frame-options"] == "DENY"
    policy = page.headers["content-security-policy"]
    assert policy.startswith("default-src 'none'; script-src 'sha256-"), policy
    assert "frame-ancestors 'none'" in policy and "connect-src 'self'" in policy
    assert "unsafe-inline" not in policy.split("script-src")[1].split(";")[0]


@NEEDS_CHROMIUM
def test_the_dashboard_is_not_framed_and_runs_no_injected_script_in_chromium(
    server: Server,
) -> None:
    from playwright.sync_api import expect

    wid = _waiting()
    framing = f'<html><body><iframe src="{server.base}/"></iframe></body></html>'
    with _elsewhere(framing) as url, _chromium() as browser:
        page = browser.new_page()
        violations: list[str] = []
        page.on(
            "console",
            lambda m: violations.append(m.text) if "Content Security" in m.text else None,
        )
        page.goto(f"{server.base}/?token={TOKEN}")
        expect(page.locator(f'tr[data-id="{wid}"]')).to_be_visible(timeout=15_000)
        assert violations == [], violations  # the page's own script and styles run
        page.evaluate(
            """() => {
              document.addEventListener("securitypolicyviolation",
                (e) => { window.blocked = e.effectiveDirective; });
              document.body.insertAdjacentHTML("beforeend",
                '<img id="x" src="x" onerror="document.title = \\'injected\\'">');
            }"""
        )
        # polled from here: wait_for_function's own polling evaluates a string in the page,
        # which the page's policy (no 'unsafe-eval') refuses when the first look is too early
        wait_until(
            lambda: page.evaluate(
                "() => Boolean(window.blocked) && document.getElementById('x').complete"
            ),
            15,
            "the injected image's error handler blocked",
        )
        assert page.evaluate("window.blocked").startswith("script-src")
        assert page.title() != "injected"

        framer = browser.new_page()
        framer.goto(url)
        framer.wait_for_load_state("load")
        (child,) = framer.main_frame.child_frames
        assert not child.url.startswith(server.base), child.url  # blocked: no document
