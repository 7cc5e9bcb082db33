"""Issue 23's quotas and tenant boundaries through the real e2b Python SDK:
a tenant's volume quota (count and total size: run.sh makes tenants with
small ones) and another tenant deleting a snapshot. sandboxd mode only."""

import os
import secrets

import pytest

from e2b import Sandbox, Volume
from e2b.exceptions import VolumeException

from conftest import NO_VOLUMES, SANDBOXD

pytestmark = [
    pytest.mark.skipif(not SANDBOXD, reason="sandboxd mode only (COMPAT_TARGET=sandboxd)"),
    pytest.mark.timeout(120),
]

RUN = secrets.token_hex(4)


@pytest.mark.parametrize(
    "env, want",
    [
        ("COMPAT_QUOTA_API_KEY", r"volume quota exceeded: the tenant has 2 of 2 volumes"),
        ("COMPAT_QUOTA_MB_API_KEY", r"volume quota exceeded: .*above its limit of 40 MiB"),
    ],
    ids=["count", "size"],
)
@pytest.mark.skipif(NO_VOLUMES, reason="volumes are not supported on this backend (COMPAT_NO_VOLUMES)")
def test_volume_quota(env: str, want: str):
    api_key = os.environ.get(env)
    if not api_key:
        pytest.skip(f"no key of a tenant with a volume quota ({env})")
    made = {}

    def create(name: str) -> Volume:
        v = Volume.create(f"{name}-{RUN}", api_key=api_key)
        made[v.volume_id] = v
        return v

    def names():
        return sorted(v.name for v in Volume.list(api_key=api_key))

    try:
        first = create("q0")
        create("q1")
        with pytest.raises(VolumeException, match=want):
            Volume.create(f"over-{RUN}", api_key=api_key)
        assert names() == [f"q0-{RUN}", f"q1-{RUN}"], "the refused volume is not listed"

        assert Volume.destroy(first.volume_id, api_key=api_key) is True
        del made[first.volume_id]
        over = create("over")  # its name was never taken
        over.write_file("/f", "fits")
        assert over.read_file("/f") == "fits"
        assert names() == [f"over-{RUN}", f"q1-{RUN}"]
    finally:
        for vid in made:
            try:
                Volume.destroy(vid, api_key=api_key)
            except Exception:
                pass


def test_snapshot_other_tenant_cannot_delete():
    other = os.environ.get("COMPAT_OTHER_API_KEY")
    if not other:
        pytest.skip("no second API key (COMPAT_OTHER_API_KEY)")
    sbx = Sandbox.create(timeout=300, metadata={"compatRun": RUN})
    kept, snap_id = [sbx], None
    try:
        sbx.files.write("/home/user/kept.txt", "kept")
        snap_id = sbx.create_snapshot().snapshot_id
        assert Sandbox.delete_snapshot(snap_id, api_key=other) is False
        assert Sandbox.delete_snapshot(f"compatnosuchsnap{RUN}:default", api_key=other) is False
        listed = []
        paginator = Sandbox.list_snapshots(sandbox_id=sbx.sandbox_id)
        while paginator.has_next:
            listed += paginator.next_items()
        assert [s.snapshot_id for s in listed] == [snap_id], "the owner still lists it"

        from_snap = Sandbox.create(snap_id, timeout=120, metadata={"compatRun": RUN})
        kept.append(from_snap)
        assert from_snap.files.read("/home/user/kept.txt") == "kept"
        assert Sandbox.delete_snapshot(snap_id) is True, "its owner can"
        snap_id = None
    finally:
        for s in kept:
            try:
                s.kill()
            except Exception:
                pass
        if snap_id:
            try:
                Sandbox.delete_snapshot(snap_id)
            except Exception:
                pass
