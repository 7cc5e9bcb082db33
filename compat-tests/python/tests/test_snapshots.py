"""Snapshots and forks through the real e2b Python SDK against a real
sandboxd: create_snapshot / Sandbox.create(snapshot_id) / list_snapshots /
delete_snapshot, and fork(). sandboxd keeps a sandbox's files (not its
processes). sandboxd mode only (COMPAT_TARGET=sandboxd)."""

import secrets
import time

import pytest

from e2b import Sandbox

from conftest import SANDBOXD

pytestmark = [
    pytest.mark.skipif(not SANDBOXD, reason="sandboxd mode only (COMPAT_TARGET=sandboxd)"),
    pytest.mark.timeout(120),
]

RUN = secrets.token_hex(4)
UNKNOWN_ID = "compatnosuchsandbox0"


@pytest.fixture
def made():
    """Sandboxes and snapshots a test made, removed afterwards."""
    sandboxes, snapshots = [], []
    yield sandboxes, snapshots
    for s in sandboxes:
        try:
            Sandbox.kill(s.sandbox_id)
        except Exception:
            pass
    for sid in snapshots:
        try:
            Sandbox.delete_snapshot(sid)
        except Exception:
            pass


def _create(made, template=None, **kw):
    md = {"compatRun": RUN, **kw.pop("metadata", {})}
    if template:
        sbx = Sandbox.create(template, timeout=300, metadata=md, **kw)
    else:
        sbx = Sandbox.create(timeout=300, metadata=md, **kw)
    made[0].append(sbx)
    return sbx


def _list(**kw):
    p = Sandbox.list_snapshots(**kw)
    out = []
    while p.has_next:
        out += p.next_items()
    return out


def test_snapshot_create_from_list_delete(made):
    sbx = _create(made, envs={"SNAP_ENV": "kept"})
    sbx.files.write("/home/user/state.txt", "v1")
    sbx.commands.run("mkdir -p ~/dir && echo deep > ~/dir/f")
    snap = sbx.create_snapshot()
    made[1].append(snap.snapshot_id)
    assert snap.snapshot_id.endswith(":default") and snap.names == []

    sbx.files.write("/home/user/state.txt", "v2")
    name = f"compat-snap-py-{RUN}"
    named = sbx.create_snapshot(name=name, mode="filesystem")
    made[1].append(named.snapshot_id)
    assert named.snapshot_id == f"{name}:default" and named.names == [name]

    listed = _list(sandbox_id=sbx.sandbox_id)
    assert [s.snapshot_id for s in listed] == [named.snapshot_id, snap.snapshot_id]

    a = _create(made, snap.snapshot_id)
    assert a.files.read("/home/user/state.txt") == "v1"
    r = a.commands.run("cat ~/dir/f; echo $SNAP_ENV")
    assert r.stdout == "deep\nkept\n"
    b = _create(made, name)
    assert b.files.read("/home/user/state.txt") == "v2"

    assert Sandbox.delete_snapshot(named.snapshot_id) is True
    assert Sandbox.delete_snapshot(named.snapshot_id) is False
    with pytest.raises(Exception):
        _create(made, name)


def test_snapshot_full_memory_is_refused(made):
    sbx = _create(made)
    with pytest.raises(Exception, match="filesystem only"):
        sbx.create_snapshot(mode="full")


def test_fork(made):
    sbx = _create(made, metadata={"role": "forked"}, envs={"FORK_ENV": "yes"})
    sbx.files.write("/home/user/f.txt", "before")
    forks = sbx.fork(count=2, timeout=120)
    assert len(forks) == 2
    for f in forks:
        assert isinstance(f, Sandbox), f"a fork failed: {f!r}"
        made[0].append(f)
        assert f.sandbox_id != sbx.sandbox_id
        assert f.files.read("/home/user/f.txt") == "before"
        assert f.commands.run("echo $FORK_ENV").stdout == "yes\n"
        info = f.get_info()
        assert info.metadata.get("role") == "forked"
        left = info.end_at.timestamp() - time.time()
        assert 60 < left <= 125, f"fork ends in {left} s, want its own 120 s"
        f.files.write("/home/user/f.txt", "fork")
    assert sbx.files.read("/home/user/f.txt") == "before"


def test_fork_and_snapshot_refused(made):
    with pytest.raises(Exception):
        Sandbox.fork(UNKNOWN_ID)
    with pytest.raises(Exception):
        Sandbox.create_snapshot(UNKNOWN_ID)
    sbx = _create(made)
    sbx.pause()
    with pytest.raises(Exception, match="paused"):
        sbx.fork()
    with pytest.raises(Exception, match="paused"):
        sbx.create_snapshot()
