"""How MCP sources are named and what their errors may say (no server needed)."""

from __future__ import annotations

import pytest
from mcp import StdioServerParameters

from dbos_agent.agent.mcp_sources import McpHttpServer, default_name, shown_url, transport_for

URL = "https://alice:pw-sekrit@tools.example.com:8443/fs/mcp?token=tok-sekrit&x=1#frag-sekrit"
SECRETS = ("pw-sekrit", "tok-sekrit", "frag-sekrit", "hdr-sekrit", "alice")


def test_a_url_is_shown_without_its_user_password_query_or_fragment() -> None:
    assert shown_url(URL) == "https://tools.example.com:8443/fs/mcp?***"
    assert shown_url("http://127.0.0.1:9/mcp") == "http://127.0.0.1:9/mcp"
    server = McpHttpServer(URL, headers={"Authorization": "Bearer hdr-sekrit"})
    assert not any(secret in repr(server) for secret in SECRETS)
    assert "Authorization" in repr(server)


def test_every_secret_is_scrubbed_from_a_text_and_the_url_shown_redacted() -> None:
    transport = transport_for(
        McpHttpServer(URL, headers={"Authorization": "Bearer hdr-sekrit"}), None
    )
    text = (
        f"Client error '401 Unauthorized' for url '{URL}'; sent Authorization: Bearer "
        "hdr-sekrit; token=tok-sekrit; password pw-sekrit"
    )
    scrubbed = transport.scrub(text)
    assert not any(secret in scrubbed for secret in SECRETS), scrubbed
    assert "https://tools.example.com:8443/fs/mcp?***" in scrubbed
    assert "the MCP server at https://tools.example.com:8443/fs/mcp?***" == transport.describe


@pytest.mark.parametrize(
    "url", ["ftp://host/mcp", "tools.example.com/mcp", "http:///mcp", "file:///tmp/x"]
)
def test_a_url_that_is_not_http_is_refused_without_its_secrets(url: str) -> None:
    with pytest.raises(ValueError, match="http"):
        McpHttpServer(url)
    with pytest.raises(ValueError) as refused:
        McpHttpServer(url.replace("//", "//u:pw-sekrit@", 1) + "?token=tok-sekrit")
    assert not any(secret in str(refused.value) for secret in SECRETS)


@pytest.mark.parametrize(
    ("source", "name"),
    [
        (URL, "fs"),
        ("http://127.0.0.1:8000/mcp", "127_0_0_1"),
        ("http://127.0.0.1:9999/mcp", "127_0_0_1"),  # the port is not part of it
        (McpHttpServer("https://tools.example.com/sse"), "tools_example_com"),
        (StdioServerParameters(command="python", args=["-u", "servers/files.py"]), "files"),
        (["npx", "-y", "@scope/server-git"], "server-git"),
    ],
)
def test_default_names(source: object, name: str) -> None:
    assert default_name(source) == name  # type: ignore[arg-type]
