"""sandboxd's MCP server at /mcp, through the official Python `mcp` SDK as an
independent client (streamable HTTP, the API key as a bearer, which sandboxd's
native auth accepts with every scope). sandboxd mode only: E2B has no such
endpoint."""

import base64
import os

import pytest
from mcp import ClientSession
from mcp.client.streamable_http import streamable_http_client
from mcp.shared._httpx_utils import create_mcp_http_client

from conftest import API_URL, SANDBOXD_ONLY

pytestmark = SANDBOXD_ONLY

TOOLS = {
    "sandbox_create",
    "sandbox_exec",
    "sandbox_kill",
    "sandbox_list",
    "sandbox_list_files",
    "sandbox_read_file",
    "sandbox_write_file",
    "sandbox_changes",
    "sandbox_diff",
    "sandbox_publish",
}


def mcp_url() -> str:
    return API_URL.rstrip("/") + "/mcp"


def client(token: str):
    return create_mcp_http_client(headers={"Authorization": f"Bearer {token}"})


async def call(session: ClientSession, name: str, args: dict) -> dict:
    res = await session.call_tool(name, args)
    assert not res.is_error, f"{name}: {res.content}"
    return res.structured_content


async def test_mcp_tools():
    async with client(os.environ["E2B_API_KEY"]) as http, streamable_http_client(
        mcp_url(), http_client=http
    ) as (read, write), ClientSession(read, write) as session:
        init = await session.initialize()
        assert init.server_info.name == "sandboxd"
        tools = await session.list_tools()
        assert {t.name for t in tools.tools} == TOOLS
        for t in tools.tools:
            assert t.description and t.input_schema.get("type") == "object"

        sb = await call(session, "sandbox_create", {"metadata": {"suite": "py-mcp"}})
        sid = sb["sandbox_id"]
        try:
            assert sb["state"] == "running"
            listed = await call(session, "sandbox_list", {"metadata": {"suite": "py-mcp"}})
            assert [s["sandbox_id"] for s in listed["sandboxes"]] == [sid]

            out = await call(session, "sandbox_exec", {"sandbox_id": sid, "command": "echo hi $((6*7)); echo err >&2; exit 2"})
            assert (out["stdout"], out["stderr"], out["exit_code"]) == ("hi 42\n", "err\n", 2)

            w = await call(session, "sandbox_write_file", {"sandbox_id": sid, "path": "py.txt", "content": "from python\n"})
            assert w["path"] == "/home/user/py.txt"
            r = await call(session, "sandbox_read_file", {"sandbox_id": sid, "path": w["path"]})
            assert (r["encoding"], r["content"]) == ("text", "from python\n")

            blob = bytes(range(256))
            await call(session, "sandbox_write_file", {"sandbox_id": sid, "path": "b.bin", "content": base64.b64encode(blob).decode(), "encoding": "base64"})
            r = await call(session, "sandbox_read_file", {"sandbox_id": sid, "path": "b.bin"})
            assert r["encoding"] == "base64" and base64.b64decode(r["content"]) == blob

            ls = await call(session, "sandbox_list_files", {"sandbox_id": sid, "path": "/home/user"})
            assert {"py.txt", "b.bin"} <= {e["name"] for e in ls["entries"]}
        finally:
            k = await call(session, "sandbox_kill", {"sandbox_id": sid})
        assert k["killed"] is True
        res = await session.call_tool("sandbox_exec", {"sandbox_id": sid, "command": "true"})
        assert res.is_error and res.content[0].text.startswith("not_found:")


async def test_mcp_unauthenticated():
    async with client("e2b_" + "0" * 40) as http:
        resp = await http.post(
            mcp_url(),
            json={"jsonrpc": "2.0", "id": 1, "method": "ping"},
            headers={"Accept": "application/json, text/event-stream"},
        )
    assert resp.status_code == 401
