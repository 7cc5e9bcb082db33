"""Metrics history and sandbox logs through the real e2b Python SDK against a
real sandboxd: get_metrics(start, end) answers the samples sandboxd took
periodically (run.sh starts it with --metrics-interval 1s), and the logs
routes answer through the SDK's own generated API client (the SDK has no
Sandbox method for them), parsed by its models. sandboxd mode only."""

import json
import time
from datetime import datetime, timedelta, timezone

import pytest

from e2b import CommandExitException, NotFoundException, Sandbox
from e2b.api.client.api.sandboxes import (
    get_sandboxes_sandbox_id_logs,
    get_v_2_sandboxes_sandbox_id_logs,
)
from e2b.api.client.models import LogLevel, LogsDirection, SandboxLogs, SandboxLogsV2Response
from e2b.connection_config import ConnectionConfig
from e2b.sandbox_sync.paginator import get_api_client

from conftest import SANDBOXD, wait_for

pytestmark = pytest.mark.skipif(not SANDBOXD, reason="sandboxd mode only (COMPAT_TARGET=sandboxd)")


@pytest.fixture(scope="module")
def sbx():
    created = datetime.now(timezone.utc)
    s = Sandbox.create(timeout=300)
    s.created_at = created
    yield s
    s.kill()


@pytest.mark.timeout(60)
def test_get_metrics_history_in_range(sbx: Sandbox):
    start = sbx.created_at - timedelta(seconds=1)
    ms = wait_for(
        lambda: (lambda got: got if len(got) >= 3 else None)(sbx.get_metrics(start=start, end=datetime.now(timezone.utc))),
        "3 metrics samples",
        timeout=20,
        interval=0.2,
    )
    lo = sbx.created_at - timedelta(seconds=2)
    hi = datetime.now(timezone.utc) + timedelta(seconds=1)
    for i, m in enumerate(ms):
        assert lo <= m.timestamp <= hi, (i, m.timestamp, lo, hi)
        if i:
            assert m.timestamp >= ms[i - 1].timestamp, "not oldest first"
        for k in ("cpu_used_pct", "cpu_count", "mem_used", "mem_total", "mem_cache", "disk_used", "disk_total"):
            assert isinstance(getattr(m, k), (int, float)), (k, m)
    assert len({m.timestamp for m in ms}) >= 3, "one sample repeated, not a history"

    before = sbx.get_metrics(start=sbx.created_at - timedelta(hours=1), end=sbx.created_at - timedelta(minutes=1))
    assert before == [], before

    # Sampled every second (run.sh): a new sample comes within a few
    # passes, however slow the backend's stats are under load.
    n = len(sbx.get_metrics())
    wait_for(lambda: len(sbx.get_metrics()) >= n + 1, f"a sample after the {n} there were", timeout=20, interval=0.2)


def test_get_metrics_of_a_killed_sandbox():
    s = Sandbox.create(timeout=60)
    s.kill()
    with pytest.raises(NotFoundException):
        Sandbox.get_metrics(s.sandbox_id)


def test_logs_through_the_sdk_client(sbx: Sandbox):
    sbx.set_timeout(240)
    client = get_api_client(ConnectionConfig())

    res = get_v_2_sandboxes_sandbox_id_logs.sync_detailed(sbx.sandbox_id, client=client)
    assert res.status_code == 200, res.content
    assert isinstance(res.parsed, SandboxLogsV2Response), res.parsed
    msgs = [e.message for e in res.parsed.logs]
    assert "sandbox created" in msgs and "sandbox timeout set" in msgs, msgs
    assert msgs[0] == "sandbox timeout set", "v2 is newest first by default"
    timeout_set = res.parsed.logs[0]
    assert timeout_set.level == LogLevel.INFO
    assert timeout_set.fields["action"] == "set_timeout" and timeout_set.fields["timeout_s"] == "240", timeout_set.fields.to_dict()

    # envd's own lines of the create come first; sandboxd's first is the create.
    fwd = get_v_2_sandboxes_sandbox_id_logs.sync_detailed(
        sbx.sandbox_id, client=client, direction=LogsDirection.FORWARD, limit=1, search="sandbox"
    ).parsed
    assert [e.message for e in fwd.logs] == ["sandbox created"]
    found = get_v_2_sandboxes_sandbox_id_logs.sync_detailed(sbx.sandbox_id, client=client, search="timeout").parsed
    assert [e.message for e in found.logs] == ["sandbox timeout set"]
    errors = get_v_2_sandboxes_sandbox_id_logs.sync_detailed(sbx.sandbox_id, client=client, level=LogLevel.ERROR).parsed
    assert errors.logs == []

    v1 = get_sandboxes_sandbox_id_logs.sync_detailed(sbx.sandbox_id, client=client)
    assert v1.status_code == 200 and isinstance(v1.parsed, SandboxLogs), v1.content
    # Each line is the raw JSON record (E2B's log pipeline's), as the e2b CLI parses it.
    records = [json.loads(line.line) for line in v1.parsed.logs]
    assert [r["message"] for r in records] == [e.message for e in v1.parsed.log_entries]
    assert [r["level"] for r in records] == [str(e.level.value) for e in v1.parsed.log_entries]
    first = next(r for r in records if r.get("source") == "sandboxd")
    assert first["message"] == "sandbox created" and first["action"] == "create", first

    missing = get_v_2_sandboxes_sandbox_id_logs.sync_detailed("compatnosuchsandbox0", client=client)
    assert missing.status_code == 404


def test_envd_lines_in_the_logs(sbx: Sandbox):
    """envd's own lines about a command (started, ended with its exit code),
    with envd's fields, through both routes."""
    client = get_api_client(ConnectionConfig())
    with pytest.raises(CommandExitException) as exc:
        sbx.commands.run("echo compat-envd-log-py; exit 5")
    assert exc.value.exit_code == 5

    # There at once: envd logs a command's end before it sends it, and a logs
    # request reads envd's new lines.
    got = get_v_2_sandboxes_sandbox_id_logs.sync_detailed(
        sbx.sandbox_id, client=client, search="process", direction=LogsDirection.FORWARD
    ).parsed.logs
    envd = [e for e in got if e.fields.to_dict().get("source") == "envd"]
    started = next((e for e in envd if e.message == "process started" and "compat-envd-log-py" in e.fields["args"]), None)
    assert started is not None, [e.to_dict() for e in envd]
    ended = next((e for e in envd if e.message == "process ended" and e.fields["pid"] == started.fields["pid"]), None)
    assert ended is not None, [e.to_dict() for e in envd]
    assert started.level == LogLevel.INFO and started.fields["cmd"] == "/bin/bash", started.fields.to_dict()
    assert started.fields["user"] == "user" and started.fields["cwd"], started.fields.to_dict()
    assert ended.fields["exit_code"] == "5" and ended.timestamp >= started.timestamp, ended.fields.to_dict()

    # v1 from the start line's millisecond on: both, as raw records of logger envd.
    start_ms = int(started.timestamp.timestamp() * 1000)
    v1 = get_sandboxes_sandbox_id_logs.sync_detailed(sbx.sandbox_id, client=client, start=start_ms).parsed
    records = [json.loads(line.line) for line in v1.logs]
    pid = started.fields["pid"]
    assert any(r["message"] == "process started" and r["pid"] == pid and r["logger"] == "envd" for r in records), records
    assert any(r["message"] == "process ended" and r["pid"] == pid and r["exit_code"] == "5" for r in records), records
