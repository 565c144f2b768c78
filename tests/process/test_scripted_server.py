"""ScriptedServer over real HTTP with the official anthropic client: no mocks.

These pin down that the offline model behaves like the Messages API where the library and its
users depend on it: typed messages, SSE streaming, errors and retries, timeouts, request logs
readable from outside the process, and the demo coding conversation.
"""

from __future__ import annotations

import http.client
import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import anthropic
import pytest
from anthropic.types import Message, MessageParam

import dbos_agent
from dbos_agent.agent.scripted_server import (
    CHANGELOG_LINE,
    CODING_TASK_TOOLS,
    Delay,
    Fail,
    Reply,
    ScriptedServer,
    ScriptItem,
    coding_task_script,
    dump_script,
    item_from_json,
    item_to_json,
    load_script,
    seed_coding_task,
    text,
    tool_use,
)
from tests.helpers import wait_until
from tests.support import zygote

MODEL = "claude-scripted-1"
HELLO: list[MessageParam] = [{"role": "user", "content": "Say hello."}]


def make_client(server: ScriptedServer, **kwargs: Any) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=server.url, api_key="scripted", **kwargs)


def ask(client: anthropic.Anthropic, messages: list[MessageParam] = HELLO) -> Message:
    return client.messages.create(model=MODEL, max_tokens=256, messages=messages)


def test_create_returns_typed_message_with_scripted_content_and_usage() -> None:
    with ScriptedServer([Reply([text("Hello, world!")], usage=(12, 4))]) as server:
        message = ask(make_client(server))

        assert isinstance(message, Message)
        assert message.id.startswith("msg_")
        assert message.model == MODEL
        assert message.role == "assistant"
        assert message.stop_reason == "end_turn"
        assert message.stop_sequence is None
        assert [b.type for b in message.content] == ["text"]
        assert message.content[0].type == "text" and message.content[0].text == "Hello, world!"
        assert (message.usage.input_tokens, message.usage.output_tokens) == (12, 4)

        (record,) = server.requests
        assert record.status == 200 and record.paid and not record.stream
        assert record.body["messages"] == HELLO
        assert record.script_index == 0 and record.usage == (12, 4)
        assert server.paid_calls == 1 and server.remaining == 0


def test_usage_is_computed_from_sizes_when_not_scripted() -> None:
    short_reply, long_reply = Reply([text("ok")]), Reply([text("word " * 200)])
    with ScriptedServer([short_reply, long_reply]) as server:
        client = make_client(server)
        small = ask(client)
        big_prompt: list[MessageParam] = [{"role": "user", "content": "x" * 4000}]
        big = ask(client, big_prompt)

        assert 1 <= small.usage.input_tokens < big.usage.input_tokens
        assert big.usage.input_tokens >= 1000
        assert 1 <= small.usage.output_tokens < big.usage.output_tokens
        total_in = small.usage.input_tokens + big.usage.input_tokens
        total_out = small.usage.output_tokens + big.usage.output_tokens
        assert server.usage_total == (total_in, total_out)


def test_stream_yields_text_deltas_and_final_message_equals_create() -> None:
    reply = Reply(
        [
            text("Let me look at the failing test first."),
            tool_use("read_file", {"path": "calc.py", "opts": {"lines": [1, 2], "raw": True}}),
        ]
    )
    with ScriptedServer([reply, reply, reply]) as server:
        client = make_client(server)
        plain = ask(client)
        with client.messages.stream(model=MODEL, max_tokens=256, messages=HELLO) as stream:
            deltas = list(stream.text_stream)
            final = stream.get_final_message()

        assert len(deltas) > 1
        assert "".join(deltas) == "Let me look at the failing test first."
        # Ids are per call, like the real API; everything else must be identical.
        assert final.id != plain.id
        assert final.model_dump(exclude={"id"}) == plain.model_dump(exclude={"id"})

        raw = client.messages.create(model=MODEL, max_tokens=256, messages=HELLO, stream=True)
        kinds = [event.type for event in raw]
        assert kinds[0] == "message_start" and kinds[-2:] == ["message_delta", "message_stop"]
        assert kinds.count("content_block_start") == kinds.count("content_block_stop") == 2
        assert [r.stream for r in server.requests] == [False, True, True]
        assert server.paid_calls == 3


def test_tool_use_blocks_round_trip_with_stable_generated_ids() -> None:
    tool_input = {"command": "python -m pytest -q", "env": {"CI": "1"}, "args": [1, None, "x"]}
    reply = Reply([tool_use("run_bash", tool_input), tool_use("read_file", {"path": "a.py"})])
    with ScriptedServer([reply, reply, Reply([tool_use("x", {}, id="toolu_fixed")])]) as server:
        client = make_client(server)
        first = ask(client)
        again = ask(client)
        fixed = ask(client)

    assert first.stop_reason == "tool_use"
    blocks = [b for b in first.content if b.type == "tool_use"]
    assert [b.name for b in blocks] == ["run_bash", "read_file"]
    assert blocks[0].input == tool_input
    assert all(re.fullmatch(r"toolu_[0-9a-f]{24}", b.id) for b in blocks)
    assert blocks[0].id != blocks[1].id
    # Same conversation, same ids: a resumed client sees the tool ids it checkpointed.
    assert [b.id for b in again.content if b.type == "tool_use"] == [b.id for b in blocks]
    assert fixed.content[0].type == "tool_use" and fixed.content[0].id == "toolu_fixed"


def test_overloaded_raises_without_retries_and_default_retries_recover() -> None:
    with ScriptedServer([Fail(529), Reply([text("recovered")])]) as server:
        with pytest.raises(anthropic.InternalServerError) as info:
            ask(make_client(server, max_retries=0))
        assert isinstance(info.value, anthropic.OverloadedError)
        assert info.value.status_code == 529
        assert info.value.body == {
            "type": "error",
            "error": {"type": "overloaded_error", "message": info.value.api_message},
            "request_id": info.value.request_id,
        }
        assert info.value.type == "overloaded_error"

    with ScriptedServer([Fail(529, message="busy"), Reply([text("recovered")])]) as server:
        message = ask(make_client(server))  # default max_retries=2

        assert message.content[0].type == "text" and message.content[0].text == "recovered"
        assert [r.status for r in server.requests] == [529, 200]
        assert [r.retry_count for r in server.requests] == [0, 1]
        assert len(server.requests) == 2 and server.paid_calls == 1


def test_rate_limit_sends_retry_after_and_client_waits_for_it() -> None:
    script: list[ScriptItem] = [Fail(429, retry_after=1), Fail(429, retry_after=1), Reply()]
    with ScriptedServer(script) as server:
        with pytest.raises(anthropic.RateLimitError) as info:
            ask(make_client(server, max_retries=0))
        assert info.value.response.headers["retry-after"] == "1"
        assert info.value.type == "rate_limit_error"

        started = time.monotonic()
        message = ask(make_client(server))
        waited = time.monotonic() - started

    assert message.content == [] and message.stop_reason == "end_turn"
    assert 0.9 <= waited < 3
    assert [r.status for r in server.requests] == [429, 429, 200]


def test_should_retry_header_overrides_status() -> None:
    with ScriptedServer([Fail(500, should_retry=False), Reply()]) as server:
        with pytest.raises(anthropic.InternalServerError):
            ask(make_client(server))  # retries allowed, but x-should-retry: false
        assert len(server.requests) == 1


def test_missing_required_field_is_a_400_and_does_not_consume_the_script() -> None:
    with ScriptedServer([Reply([text("still here")])]) as server:
        client = make_client(server, max_retries=0)
        with pytest.raises(anthropic.BadRequestError) as info:
            client.post("/v1/messages", cast_to=Message, body={"model": MODEL, "messages": HELLO})
        assert info.value.status_code == 400
        assert info.value.type == "invalid_request_error"
        assert info.value.api_message == "max_tokens: Field required"

        orphan: list[MessageParam] = [
            {"role": "user", "content": "go"},
            {"role": "assistant", "content": [tool_use_param("toolu_1")]},
            {"role": "user", "content": "no tool result here"},
        ]
        with pytest.raises(anthropic.BadRequestError, match="without `tool_result`"):
            ask(client, orphan)

        assert server.next_index == 0
        assert ask(client).content[0].type == "text"
        assert [r.status for r in server.requests] == [400, 400, 200]
        assert server.paid_calls == 1


def tool_use_param(tool_id: str) -> Any:
    return {"type": "tool_use", "id": tool_id, "name": "run_bash", "input": {"command": "ls"}}


def test_delay_past_client_timeout_raises_api_timeout_error() -> None:
    with (
        ScriptedServer([Delay(1.0, then=Reply([text("too late")]))]) as server,
        pytest.raises(anthropic.APITimeoutError),
    ):
        ask(make_client(server, max_retries=0, timeout=0.2))


def test_timed_out_request_is_retried_and_both_replies_are_paid() -> None:
    """The client retries timeouts on its own; the abandoned generation still completes."""
    script: list[ScriptItem] = [Delay(0.6, then=Reply([text("slow")])), Reply([text("fast")])]
    with ScriptedServer(script) as server:
        message = ask(make_client(server, timeout=0.2))
        assert message.content[0].type == "text" and message.content[0].text == "fast"

        records = server.wait_for_requests(2, timeout=3)
        assert sorted(r.script_index or 0 for r in records) == [0, 1]
        assert server.paid_calls == 2


def test_exhausted_script_is_a_clear_error_the_client_does_not_retry() -> None:
    with ScriptedServer([Reply()]) as server:
        client = make_client(server)
        ask(client)
        with pytest.raises(anthropic.InternalServerError, match="script ran out") as info:
            ask(client)
        assert info.value.type == "api_error"
        assert len(server.requests) == 2 and server.paid_calls == 1

    with ScriptedServer() as empty, pytest.raises(anthropic.InternalServerError):
        ask(make_client(empty))


def test_callable_script_sees_the_conversation() -> None:
    def script(body: dict[str, Any]) -> ScriptItem:
        last = body["messages"][-1]["content"]
        if isinstance(last, list) and last[0]["type"] == "tool_result":
            return Reply([text(f"The tool said: {last[0]['content']}")])
        return Reply([tool_use("run_bash", {"command": "echo hi"})])

    with ScriptedServer(script) as server:
        client = make_client(server)
        first = ask(client)
        call = first.content[0]
        assert call.type == "tool_use"
        messages: list[MessageParam] = [
            *HELLO,
            first.to_param(),
            {
                "role": "user",
                "content": [{"type": "tool_result", "tool_use_id": call.id, "content": "hi"}],
            },
        ]
        second = ask(client, messages)

    assert second.content[0].type == "text"
    assert second.content[0].text == "The tool said: hi"
    assert [r.script_index for r in server.requests] == [0, 1]


def test_json_script_format_round_trips(tmp_path: Path) -> None:
    items: list[ScriptItem] = [
        Reply([text("a"), tool_use("read_file", {"path": "x"}, id="toolu_1")], "tool_use", (3, 2)),
        Fail(429, "rate_limit_error", "slow down", retry_after=2.5),
        Delay(0.5, then=Fail(529)),
        Reply(chunk_delay=0.1),
    ]
    assert [item_from_json(item_to_json(i)) for i in items] == items
    path = tmp_path / "script.json"
    dump_script(items, path)
    assert load_script(path) == items

    shorthand = load_script(
        [
            {"reply": {"text": "hi", "usage": {"input_tokens": 1, "output_tokens": 2}}},
            {"fail": 529},
            {"delay": 1},
        ]
    )
    assert shorthand[0] == Reply([text("hi")], usage=(1, 2))
    assert shorthand[1] == Fail(529) and isinstance(shorthand[2], Delay)
    with pytest.raises(ValueError, match="unknown keys"):
        load_script([{"reply": {"txt": "typo"}}])


def test_log_path_writes_one_flushed_json_line_per_request(tmp_path: Path) -> None:
    log = tmp_path / "calls.jsonl"
    with ScriptedServer([Fail(529), Reply([text("hi")], usage=(7, 3))], log_path=log) as server:
        client = make_client(server)
        ask(client)
        with pytest.raises(anthropic.BadRequestError):
            client.post("/v1/messages", cast_to=Message, body={"max_tokens": 5})
        lines = [json.loads(line) for line in log.read_text().splitlines()]

    assert [(x["status"], x["paid"], x["item"]) for x in lines] == [
        (529, False, "fail"),
        (200, True, "reply"),
        (400, False, None),
    ]
    assert lines[1]["usage"] == {"input_tokens": 7, "output_tokens": 3}
    assert lines[1]["model"] == MODEL and lines[1]["messages"] == 1
    assert lines[1]["stream"] is False and lines[1]["pid"] == os.getpid()


def start_subprocess(tmp_path: Path, *args: str) -> tuple[subprocess.Popen[bytes], int]:
    port_file = tmp_path / f"port-{time.monotonic_ns()}"
    env = dict(os.environ)
    repo_root = str(Path(dbos_agent.__file__).resolve().parents[1])
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [repo_root, env.get("PYTHONPATH")]))
    proc = zygote.popen(
        [
            *(sys.executable, "-m", "dbos_agent.agent.scripted_server"),
            *("--port", "0", "--port-file", str(port_file), *args),
        ],
        env=env,
        stderr=subprocess.PIPE,
    )
    try:
        wait_until(lambda: port_file.exists() or proc.poll() is not None, 10, "the server")
        assert port_file.exists()
    except AssertionError:
        proc.kill()
        raise AssertionError(f"server did not start: {proc.communicate()[1].decode()}") from None
    return proc, int(port_file.read_text())


def stop_subprocess(proc: subprocess.Popen[bytes]) -> int:
    proc.send_signal(signal.SIGTERM)
    return proc.wait(timeout=10)


def test_subprocess_server_writes_port_file_log_and_resumes_state(tmp_path: Path) -> None:
    script, log, state = tmp_path / "script.json", tmp_path / "log.jsonl", tmp_path / "state.json"
    dump_script([Reply([text("one")]), Reply([text("two")], usage=(5, 1))], script)
    common = ["--script", str(script), "--log", str(log), "--state", str(state)]

    proc, port = start_subprocess(tmp_path, *common)
    try:
        client = anthropic.Anthropic(base_url=f"http://127.0.0.1:{port}", api_key="scripted")
        with client.messages.stream(model=MODEL, max_tokens=10, messages=HELLO) as stream:
            assert stream.get_final_text() == "one"
    finally:
        assert stop_subprocess(proc) == 0

    # A restarted server process carries on with the next script item.
    proc, port = start_subprocess(tmp_path, *common)
    try:
        client = anthropic.Anthropic(base_url=f"http://127.0.0.1:{port}", api_key="scripted")
        message = ask(client)
        assert message.content[0].type == "text" and message.content[0].text == "two"
    finally:
        assert stop_subprocess(proc) == 0

    lines = [json.loads(line) for line in log.read_text().splitlines()]
    assert [(x["status"], x["stream"], x["script_index"]) for x in lines] == [
        (200, True, 0),
        (200, False, 1),
    ]
    assert lines[1]["usage"] == {"input_tokens": 5, "output_tokens": 1}
    assert lines[0]["pid"] != lines[1]["pid"]
    assert json.loads(state.read_text()) == {"next_index": 2}


def run_tool(name: str, tool_input: dict[str, Any]) -> tuple[str, bool]:
    if name == "read_file":
        return Path(tool_input["path"]).read_text(), False
    if name == "write_file":
        Path(tool_input["path"]).write_text(tool_input["content"])
        return "ok", False
    assert name == "run_bash"
    done = zygote.run(tool_input["command"], shell=True, capture_output=True, text=True, timeout=30)
    return f"exit code {done.returncode}\n{done.stdout}{done.stderr}", done.returncode != 0


def test_coding_task_script_drives_a_full_conversation(tmp_path: Path) -> None:
    seed_coding_task(tmp_path)
    assert zygote.run([sys.executable, "test_calc.py"], cwd=tmp_path).returncode != 0

    replies: list[Message] = []
    messages: list[MessageParam] = [
        {"role": "user", "content": "Fix the failing tests in calc.py and note it in CHANGELOG."}
    ]
    script = coding_task_script(str(tmp_path), python=sys.executable)
    with ScriptedServer(script) as server:
        client = make_client(server)
        while True:
            reply = client.messages.create(
                model=MODEL, max_tokens=1024, tools=CODING_TASK_TOOLS, messages=messages
            )
            replies.append(reply)
            messages.append(reply.to_param())
            if reply.stop_reason == "end_turn":
                break
            assert len(replies) < 10
            results: list[Any] = []
            for block in reply.content:
                if block.type == "tool_use":
                    output, failed = run_tool(block.name, block.input)
                    results.append(
                        {
                            "type": "tool_result",
                            "tool_use_id": block.id,
                            "content": output,
                            "is_error": failed,
                        }
                    )
            messages.append({"role": "user", "content": results})

        # Resuming from a checkpointed prefix gets the same next reply (turn from the request).
        resumed = client.messages.create(
            model=MODEL, max_tokens=1024, tools=CODING_TASK_TOOLS, messages=messages[:7]
        )

    calls = [(b.name, b.input) for r in replies for b in r.content if b.type == "tool_use"]
    assert [name for name, _ in calls] == [
        "read_file",
        "run_bash",
        "write_file",
        "run_bash",
        "run_bash",
    ]
    assert ">> CHANGELOG.md" in str(calls[4][1]["command"])
    assert len(replies) == 6 and replies[-1].stop_reason == "end_turn"
    final = replies[-1].content[0]
    assert final.type == "text" and "all tests pass" in final.text
    assert (tmp_path / "CHANGELOG.md").read_text().count(CHANGELOG_LINE) == 1
    assert zygote.run([sys.executable, "test_calc.py"], cwd=tmp_path).returncode == 0
    assert resumed.model_dump(exclude={"id"}) == replies[3].model_dump(exclude={"id"})
    assert server.paid_calls == 7


def raw_post(server: ScriptedServer, headers: dict[str, str], body: bytes) -> tuple[int, Any]:
    """POST /v1/messages with exactly these headers (no client filling any in)."""
    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=10)
    try:
        conn.putrequest("POST", "/v1/messages", skip_host=True, skip_accept_encoding=True)
        for name, value in headers.items():
            conn.putheader(name, value)
        conn.endheaders()
        if body:
            conn.send(body)
        response = conn.getresponse()
        return response.status, json.loads(response.read() or b"null")
    finally:
        conn.close()


@pytest.mark.parametrize(
    ("change", "status", "error"),
    [
        ({"Origin": "https://evil.example"}, 403, "permission_error"),  # a web page
        ({"Origin": "null"}, 403, "permission_error"),  # a sandboxed page or a file
        ({"Host": "evil.example:80"}, 403, "permission_error"),  # DNS rebinding
        ({"Content-Type": "text/plain"}, 400, "invalid_request_error"),  # a "simple" request
        ({"Content-Type": "application/x-www-form-urlencoded"}, 400, "invalid_request_error"),
        ({"Content-Length": str(64 * 1024 * 1024)}, 413, "request_too_large"),  # not read
        ({"Content-Length": "-1"}, 400, "invalid_request_error"),
    ],
)
def test_cross_site_odd_and_oversized_requests_are_refused_before_the_script(
    change: dict[str, str], status: int, error: str
) -> None:
    """The server listens on a local port every page of the user's browser can reach: a
    request a page could make, or one too large to read, never consumes a reply."""
    body = json.dumps({"model": MODEL, "max_tokens": 16, "messages": HELLO}).encode()
    with ScriptedServer([Reply([text("for the real client")])]) as server:
        headers = {
            "Host": f"127.0.0.1:{server.port}",
            "Content-Type": "application/json",
            "Content-Length": str(len(body)),
            **change,
        }
        sent = body if "Content-Length" not in change else b""
        got, answer = raw_post(server, headers, sent)
        assert (got, answer["error"]["type"]) == (status, error)
        assert server.next_index == 0 and server.paid_calls == 0
        # the real client, which sends none of that, is served
        assert ask(make_client(server, max_retries=0)).content[0].type == "text"
        assert server.next_index == 1


def test_the_server_answers_to_its_loopback_names() -> None:
    body = json.dumps({"model": MODEL, "max_tokens": 16, "messages": HELLO}).encode()
    with ScriptedServer([Reply([text("one")]), Reply([text("two")])]) as server:
        for host in (f"localhost:{server.port}", f"127.0.0.1:{server.port}"):
            headers = {
                "Host": host,
                "Content-Type": "application/json; charset=utf-8",
                "Content-Length": str(len(body)),
            }
            assert raw_post(server, headers, body)[0] == 200
        assert server.paid_calls == 2
