"""sandboxd's MCP server at /mcp, through the official Python `mcp` SDK as an
independent client (streamable HTTP, the API key as a bearer, which sandboxd's
native auth accepts with every scope; COMPAT_READ_TOKEN, a native-API JWT of
the same tenant with sandboxes:read only, made by run.sh with `sandboxd token
create`). sandboxd mode only: E2B has no such endpoint."""

import asyncio
import base64
import os
from contextlib import asynccontextmanager

import pytest
from mcp import ClientSession
from mcp.client.streamable_http import streamable_http_client
from mcp.shared._httpx_utils import create_mcp_http_client

from conftest import API_URL, BACKEND, SANDBOXD_ONLY

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
    "sandbox_export",
    "sandbox_publish",
    "template_versions",
}


def mcp_url() -> str:
    # /mcp is at the root of sandboxd's API host: in domain mode API_URL is
    # that host; otherwise it is E2B_API_URL, with the E2B API's prefix.
    return API_URL.rstrip("/").removesuffix("/v1/sandboxes/e2b") + "/mcp"


def client(token: str):
    return create_mcp_http_client(headers={"Authorization": f"Bearer {token}"})


def read_token() -> str:
    tok = os.environ.get("COMPAT_READ_TOKEN")
    assert tok, "COMPAT_READ_TOKEN (a sandboxes:read JWT of E2B_API_KEY's tenant) is not set: run the suite with run.sh"
    return tok


@asynccontextmanager
async def session_of(token: str):
    async with client(token) as http, streamable_http_client(mcp_url(), http_client=http) as (
        read,
        write,
    ), ClientSession(read, write) as session:
        await session.initialize()
        yield session


async def call(session: ClientSession, name: str, args: dict) -> dict:
    res = await session.call_tool(name, args)
    assert not res.is_error, f"{name}: {res.content}"
    return res.structured_content


# What the workspace tools answer on a backend without workspaces (Incus).
NO_WORKSPACE = "not_implemented: this backend cannot tell a sandbox's changes"


async def refused(session: ClientSession, name: str, args: dict) -> str:
    res = await session.call_tool(name, args)
    assert res.is_error, f"{name}: not refused: {res.structured_content}"
    return res.content[0].text


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


async def test_mcp_workspace_and_scopes():
    """A file written with sandbox_write_file is in sandbox_changes; a
    sandboxes:read JWT of the same tenant sees the sandbox and its changes,
    and every write tool refuses it, doing nothing."""
    async with session_of(os.environ["E2B_API_KEY"]) as full:
        sb = await call(full, "sandbox_create", {"metadata": {"suite": "py-mcp-ws"}})
        sid = sb["sandbox_id"]
        try:
            w = await call(full, "sandbox_write_file", {"sandbox_id": sid, "path": "ws/notes.txt", "content": "one\ntwo\n"})
            assert w["path"] == "/home/user/ws/notes.txt"
            if BACKEND == "incus":
                # Workspaces are not built on Incus (README): the tools say so.
                for name in ("sandbox_changes", "sandbox_diff"):
                    assert await refused(full, name, {"sandbox_id": sid}) == NO_WORKSPACE, name
                ch = None
            else:
                ch = await call(full, "sandbox_changes", {"sandbox_id": sid})
                mine = [c for c in ch["changes"] if c["path"] == w["path"]]
                assert mine == [{"path": w["path"], "kind": "added", "type": "file", "size": 8}], ch
                d = await call(full, "sandbox_diff", {"sandbox_id": sid})
                assert "+++ b/home/user/ws/notes.txt\n@@ -0,0 +1,2 @@\n+one\n+two\n" in d["patch"]

            async with session_of(read_token()) as ro:
                listed = await call(ro, "sandbox_list", {"metadata": {"suite": "py-mcp-ws"}})
                assert [s["sandbox_id"] for s in listed["sandboxes"]] == [sid]
                if ch is None:
                    assert await refused(ro, "sandbox_changes", {"sandbox_id": sid}) == NO_WORKSPACE
                else:
                    ch_ro = await call(ro, "sandbox_changes", {"sandbox_id": sid})
                    assert ch_ro["changes"] == ch["changes"]
                for name, args in {
                    "sandbox_create": {},
                    "sandbox_exec": {"sandbox_id": sid, "command": "touch /tmp/ran"},
                    "sandbox_write_file": {"sandbox_id": sid, "path": "ws/ro.txt", "content": "x"},
                    "sandbox_export": {"sandbox_id": sid, "finalize": True},
                    "sandbox_publish": {"sandbox_id": sid, "template": "py-mcp-ro"},
                    "sandbox_kill": {"sandbox_id": sid},
                }.items():
                    assert await refused(ro, name, args) == "permission_denied: missing scope sandboxes:write", name

            # Nothing the refused calls asked for happened.
            listed = await call(full, "sandbox_list", {"metadata": {"suite": "py-mcp-ws"}})
            assert [s["sandbox_id"] for s in listed["sandboxes"]] == [sid]
            out = await call(full, "sandbox_exec", {"sandbox_id": sid, "command": "test -e /tmp/ran || test -e ~/ws/ro.txt; echo $?"})
            assert out["stdout"] == "1\n"
        finally:
            await call(full, "sandbox_kill", {"sandbox_id": sid})


async def post_ping(token: str):
    async with client(token) as http:
        return await http.post(
            mcp_url(),
            json={"jsonrpc": "2.0", "id": 1, "method": "ping"},
            headers={"Accept": "application/json, text/event-stream"},
        )


async def test_mcp_unauthenticated():
    """An unknown API key, and a JWT whose signature is not sandboxd's, are
    401 before any MCP message is read."""
    assert (await post_ping("e2b_" + "0" * 40)).status_code == 401
    head, claims, sig = read_token().split(".")
    forged = base64.urlsafe_b64encode(bytes(b ^ 1 for b in base64.urlsafe_b64decode(sig + "=" * (-len(sig) % 4)))).rstrip(b"=").decode()
    assert forged != sig
    assert (await post_ping(f"{head}.{claims}.{forged}")).status_code == 401


async def test_mcp_exec_progress_and_cancel():
    """A long sandbox_exec sends progress notifications carrying its output
    as it runs; cancelling the call ends the command in the sandbox."""
    async with session_of(os.environ["E2B_API_KEY"]) as session:
        sb = await call(session, "sandbox_create", {"metadata": {"suite": "py-mcp-progress"}})
        sid = sb["sandbox_id"]
        try:
            seen: list[tuple[float, float | None, str | None]] = []

            async def on_progress(progress: float, total: float | None, message: str | None) -> None:
                seen.append((progress, total, message))

            res = await session.call_tool(
                "sandbox_exec",
                {"sandbox_id": sid, "command": "for i in 1 2 3 4 5 6 7 8; do echo tick $i; sleep 0.5; done", "timeout": 60},
                progress_callback=on_progress,
            )
            assert not res.is_error, res.content
            assert res.structured_content["stdout"] == "".join(f"tick {i}\n" for i in range(1, 9))
            # Output arrives while it runs, in more than one notification,
            # each saying how long it has run of its timeout.
            assert len(seen) >= 2, seen
            assert "tick 1" in "".join(m or "" for _, _, m in seen), seen
            assert [p for p, _, _ in seen] == sorted(p for p, _, _ in seen), seen
            assert all(total == 60 for _, total, _ in seen), seen

            # Cancelled once it has started: the process is gone.
            started = asyncio.Event()

            async def on_start(progress: float, total: float | None, message: str | None) -> None:
                if message and "started" in message:
                    started.set()

            task = asyncio.create_task(
                session.call_tool(
                    "sandbox_exec",
                    {"sandbox_id": sid, "command": "echo $$ > /tmp/long.pid; echo started; while :; do date >> /tmp/long.out; sleep 0.2; done", "timeout": 600},
                    progress_callback=on_start,
                )
            )
            await asyncio.wait_for(started.wait(), 60)
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
            # The server kills it once it sees the cancellation: wait for that
            # (bounded), then check the loop writes no more.
            out = await call(
                session,
                "sandbox_exec",
                {
                    "sandbox_id": sid,
                    "command": "pid=$(cat /tmp/long.pid); for i in $(seq 100); do kill -0 $pid 2>/dev/null || break; sleep 0.1; done; "
                    "kill -0 $pid 2>/dev/null && echo alive || echo gone; n=$(wc -l < /tmp/long.out); sleep 1; "
                    'test "$(wc -l < /tmp/long.out)" = "$n" && echo stopped || echo writing',
                },
            )
            assert out["stdout"] == "gone\nstopped\n", out
        finally:
            await call(session, "sandbox_kill", {"sandbox_id": sid})
