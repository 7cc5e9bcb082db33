"""E2B volumes through the real e2b Python SDK: the control API (/volumes),
the content API (/volumecontent with the volume's token, at
E2B_VOLUME_API_URL) and volume_mounts on create."""

import os
import secrets

import pytest

from e2b import Sandbox, Volume
from e2b.exceptions import VolumeException, VolumeNotFoundException, VolumePathNotFoundException

from conftest import NO_VOLUMES, SANDBOXD

pytestmark = [
    pytest.mark.skipif(not SANDBOXD, reason="sandboxd mode only"),
    pytest.mark.skipif(NO_VOLUMES, reason="volumes are not supported on this backend (COMPAT_NO_VOLUMES)"),
]


def _name(p: str) -> str:
    return f"{p}-py-{secrets.token_hex(4)}"


@pytest.fixture
def volume():
    vol = Volume.create(_name("data"))
    yield vol
    Volume.destroy(vol.volume_id)


def test_volume_lifecycle_and_content(volume: Volume):
    assert volume.token
    info = Volume.get_info(volume.volume_id)
    assert info.name == volume.name and info.token == volume.token
    assert any(v.volume_id == volume.volume_id for v in Volume.list())

    st = volume.write_file("/hello.txt", "from the api\n")
    assert st.name == "hello.txt" and st.size == 13 and st.uid == 1000
    assert volume.read_file("/hello.txt") == "from the api\n"
    volume.make_dir("/sub/deep", force=True)
    names = {e.path for e in volume.list("/", depth=3)}
    assert {"/hello.txt", "/sub", "/sub/deep"} <= names
    assert volume.exists("/sub/deep")
    assert not volume.exists("/nope")
    with pytest.raises(VolumePathNotFoundException):
        volume.read_file("/nope")
    st = volume.update_metadata("/hello.txt", mode=0o600)
    assert st.mode == 0o600
    volume.remove("/sub")
    assert not volume.exists("/sub")


def test_volume_mounted_in_two_sandboxes(volume: Volume):
    volume.write_file("/hello.txt", "from the api\n")
    a = Sandbox.create(timeout=300, volume_mounts={"/mnt/data": volume})
    try:
        b = Sandbox.create(timeout=300, volume_mounts={"/mnt/data": volume.name})
        try:
            assert a.get_info().volume_mounts == [{"name": volume.name, "path": "/mnt/data"}]
            r = a.commands.run("cat /mnt/data/hello.txt && id -u")
            assert r.stdout == "from the api\n1000\n"
            a.commands.run("echo from a > /mnt/data/a.txt")
            assert b.commands.run("cat /mnt/data/a.txt").stdout == "from a\n"
            assert volume.read_file("/a.txt") == "from a\n"
            # Mounted: the volume cannot be deleted.
            with pytest.raises(VolumeException):
                Volume.destroy(volume.volume_id)
        finally:
            b.kill()
    finally:
        a.kill()


def test_volume_mount_over_system_path_refused(volume: Volume):
    with pytest.raises(Exception, match="system path"):
        Sandbox.create(timeout=60, volume_mounts={"/etc": volume})


def test_volume_other_tenant_404(volume: Volume):
    other = os.environ.get("COMPAT_OTHER_API_KEY")
    if not other:
        pytest.skip("no second API key (COMPAT_OTHER_API_KEY)")
    with pytest.raises(VolumeNotFoundException):
        Volume.get_info(volume.volume_id, api_key=other)
    assert Volume.destroy(volume.volume_id, api_key=other) is False


def test_volume_delete():
    vol = Volume.create(_name("gone"))
    assert Volume.destroy(vol.volume_id) is True
    with pytest.raises(VolumeNotFoundException):
        Volume.get_info(vol.volume_id)
