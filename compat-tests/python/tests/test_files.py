"""sandbox.files through the real e2b Python SDK (sync Sandbox): GET/POST /files
and the filesystem.Filesystem RPCs (Stat, ListDir, MakeDir, Move, Remove)."""

import datetime
import hashlib
import io
import json
import secrets
import urllib.error
import urllib.parse
import urllib.request

import pytest

from e2b import (
    FileNotFoundException,
    FileType,
    InvalidArgumentException,
    NotFoundException,
    Sandbox,
)

from conftest import HOME, all_bytes, envd_headers


def test_write_read_text(sandbox: Sandbox, scratch: str):
    path = f"{scratch}/hello.txt"
    info = sandbox.files.write(path, "Hello, world! ✓\n")
    assert info.name == "hello.txt"
    assert info.path == path
    assert info.type == FileType.FILE
    assert sandbox.files.read(path) == "Hello, world! ✓\n"
    r = sandbox.commands.run(f"cat {path}; stat -c '%U:%G %a' {path}")
    assert r.stdout == "Hello, world! ✓\nuser:user 644\n"


def test_write_overwrites(sandbox: Sandbox, scratch: str):
    path = f"{scratch}/overwrite.txt"
    sandbox.files.write(path, "a much longer first content")
    sandbox.files.write(path, "short")
    assert sandbox.files.read(path) == "short"


def test_relative_paths_resolve_to_home(sandbox: Sandbox):
    name = f"compat-py-rel-{secrets.token_hex(4)}.txt"
    try:
        info = sandbox.files.write(name, "relative")
        assert info.path == f"{HOME}/{name}"
        assert sandbox.files.read(f"{HOME}/{name}") == "relative"
        assert sandbox.files.read(f"~/{name}") == "relative"
    finally:
        sandbox.files.remove(f"{HOME}/{name}")


def test_all_256_byte_values(sandbox: Sandbox, scratch: str):
    path = f"{scratch}/bytes.bin"
    data = all_bytes()
    sandbox.files.write(path, data)
    back = sandbox.files.read(path, format="bytes")
    assert bytes(back) == data
    digest = sandbox.commands.run(f"sha256sum {path} | cut -d' ' -f1").stdout.strip()
    assert digest == hashlib.sha256(data).hexdigest()


def test_octet_stream_gzip_and_stream_read(sandbox: Sandbox, scratch: str):
    data = all_bytes()
    sandbox.files.write(f"{scratch}/octet.bin", io.BytesIO(data))
    assert bytes(sandbox.files.read(f"{scratch}/octet.bin", format="bytes")) == data
    sandbox.files.write(f"{scratch}/gzip.bin", data, gzip=True)
    assert bytes(sandbox.files.read(f"{scratch}/gzip.bin", format="bytes", gzip=True)) == data
    big = "Streamed read content. " * 10_000
    sandbox.files.write(f"{scratch}/stream.txt", big)
    stream = sandbox.files.read(f"{scratch}/stream.txt", format="stream")
    assert b"".join(stream).decode() == big


def test_big_random_file(sandbox: Sandbox, scratch: str):
    data = secrets.token_bytes(8 * 1024 * 1024)
    path = f"{scratch}/big.bin"
    sandbox.files.write(path, data)
    assert bytes(sandbox.files.read(path, format="bytes")) == data
    digest = sandbox.commands.run(f"sha256sum {path} | cut -d' ' -f1").stdout.strip()
    assert digest == hashlib.sha256(data).hexdigest()


def test_metadata(sandbox: Sandbox, scratch: str):
    path = f"{scratch}/meta.txt"
    info = sandbox.files.write(path, "m", metadata={"Owner": "compat", "kind": "test-file"})
    assert info.metadata == {"owner": "compat", "kind": "test-file"}
    assert sandbox.files.get_info(path).metadata == {"owner": "compat", "kind": "test-file"}
    sandbox.files.write(path, "m2")
    assert not sandbox.files.get_info(path).metadata


def test_read_empty_file(sandbox: Sandbox, scratch: str):
    sandbox.commands.run(f"mkdir -p {scratch} && : > {scratch}/empty.txt")
    assert sandbox.files.read(f"{scratch}/empty.txt") == ""
    assert len(sandbox.files.read(f"{scratch}/empty.txt", format="bytes")) == 0


def test_odd_file_names(sandbox: Sandbox, scratch: str):
    names = ["žluťoučký kůň 🐎.txt", "a b&c=d?e#f%20.txt", "quote'd \"x\".txt"]
    for n in names:
        info = sandbox.files.write(f"{scratch}/odd/{n}", f"content of {n}")
        assert info.name == n
        assert info.path == f"{scratch}/odd/{n}"
        assert sandbox.files.read(f"{scratch}/odd/{n}") == f"content of {n}"
        assert sandbox.files.get_info(f"{scratch}/odd/{n}").name == n
    assert sorted(e.name for e in sandbox.files.list(f"{scratch}/odd")) == sorted(names)


def test_write_onto_dir_and_make_dir_onto_file(sandbox: Sandbox, scratch: str):
    sandbox.files.write(f"{scratch}/isfile.txt", "x")
    sandbox.files.make_dir(f"{scratch}/isdir")
    with pytest.raises(InvalidArgumentException):
        sandbox.files.write(f"{scratch}/isdir", "x")
    with pytest.raises(InvalidArgumentException):
        sandbox.files.make_dir(f"{scratch}/isfile.txt")
    assert sandbox.files.read(f"{scratch}/isfile.txt") == "x"


def test_write_files_multi(sandbox: Sandbox, scratch: str):
    files = [
        {"path": f"{scratch}/multi/a.txt", "data": "file a"},
        {"path": f"{scratch}/multi/sub/b.txt", "data": "file b"},
        {"path": f"{scratch}/multi/c.bin", "data": all_bytes()},
    ]
    infos = sandbox.files.write_files(files)
    assert sorted(i.path for i in infos) == sorted(f["path"] for f in files)
    for i in infos:
        assert i.name == i.path.rsplit("/", 1)[1]
    assert sandbox.files.read(files[0]["path"]) == "file a"
    assert sandbox.files.read(files[1]["path"]) == "file b"
    assert bytes(sandbox.files.read(files[2]["path"], format="bytes")) == all_bytes()


def test_list_depth(sandbox: Sandbox, scratch: str):
    p = f"{scratch}/tree"
    for d in ("subdir1/subdir1_1", "subdir1/subdir1_2", "subdir2/subdir2_1", "subdir2/subdir2_2"):
        sandbox.files.make_dir(f"{p}/{d}")
    sandbox.files.write(f"{p}/file1.txt", "Hello, world!")
    shallow = ["file1.txt", "subdir1", "subdir2"]
    deep = [
        "file1.txt",
        "subdir1",
        "subdir1/subdir1_1",
        "subdir1/subdir1_2",
        "subdir2",
        "subdir2/subdir2_1",
        "subdir2/subdir2_2",
    ]
    for kwargs, want in (({}, shallow), ({"depth": 1}, shallow), ({"depth": 2}, deep), ({"depth": 3}, deep)):
        entries = sandbox.files.list(p, **kwargs)
        assert [e.path for e in entries] == [f"{p}/{w}" for w in want], kwargs
        assert [e.name for e in entries] == [w.rsplit("/", 1)[-1] for w in want]
        assert [e.type for e in entries] == [FileType.FILE if w.endswith(".txt") else FileType.DIR for w in want]


def test_list_entry_details(sandbox: Sandbox, scratch: str):
    p = f"{scratch}/details"
    sandbox.files.write(f"{p}/test.txt", "Hello, World!")
    sandbox.files.make_dir(f"{p}/subdir")
    sandbox.commands.run(f"ln -s test.txt {p}/link.txt")
    by_name = {e.name: e for e in sandbox.files.list(p)}
    assert sorted(by_name) == ["link.txt", "subdir", "test.txt"]
    f = by_name["test.txt"]
    assert f.type == FileType.FILE
    assert f.size == 13
    assert f.mode == 0o644
    assert f.permissions == "-rw-r--r--"
    assert f.owner == "user"
    assert f.group == "user"
    assert isinstance(f.modified_time, datetime.datetime)
    now = datetime.datetime.now(datetime.timezone.utc)
    assert abs((f.modified_time - now).total_seconds()) < 120
    assert f.symlink_target is None
    d = by_name["subdir"]
    assert d.type == FileType.DIR
    assert d.mode == 0o755
    assert d.permissions == "drwxr-xr-x"
    link = by_name["link.txt"]
    assert link.type == FileType.FILE  # like upstream envd: the target's type
    assert link.symlink_target == f"{p}/test.txt"


def test_get_info(sandbox: Sandbox, scratch: str):
    sandbox.files.write(f"{scratch}/test_file.txt", "test")
    fi = sandbox.files.get_info(f"{scratch}/test_file.txt")
    assert fi.name == "test_file.txt"
    assert fi.type == FileType.FILE
    assert fi.path == f"{scratch}/test_file.txt"
    assert fi.size == 4
    assert fi.mode == 0o644
    assert fi.permissions == "-rw-r--r--"
    assert fi.owner == "user"
    assert fi.group == "user"
    assert isinstance(fi.modified_time, datetime.datetime)
    di = sandbox.files.get_info(scratch)
    assert di.type == FileType.DIR
    assert di.name == scratch.rsplit("/", 1)[1]
    assert di.path == scratch
    assert di.size > 0
    assert di.mode == 0o755
    assert di.permissions == "drwxr-xr-x"
    sandbox.commands.run(f"ln -s test_file.txt {scratch}/link.txt")
    li = sandbox.files.get_info(f"{scratch}/link.txt")
    assert li.name == "link.txt"
    assert li.symlink_target == f"{scratch}/test_file.txt"
    assert sandbox.files.get_info("/etc/hostname").owner == "root"


def test_exists(sandbox: Sandbox, scratch: str):
    sandbox.files.write(f"{scratch}/exists.txt", "x")
    assert sandbox.files.exists(f"{scratch}/exists.txt") is True
    assert sandbox.files.exists(scratch) is True
    assert sandbox.files.exists(f"{scratch}/nope.txt") is False
    assert sandbox.files.exists(f"{scratch}/nope/deeper") is False


def test_rename(sandbox: Sandbox, scratch: str):
    sandbox.files.write(f"{scratch}/old.txt", "moving")
    info = sandbox.files.rename(f"{scratch}/old.txt", f"{scratch}/new.txt")
    assert info.name == "new.txt"
    assert info.path == f"{scratch}/new.txt"
    assert info.type == FileType.FILE
    assert sandbox.files.exists(f"{scratch}/old.txt") is False
    assert sandbox.files.read(f"{scratch}/new.txt") == "moving"
    with pytest.raises(FileNotFoundException):
        sandbox.files.rename(f"{scratch}/missing", f"{scratch}/x")


def test_remove(sandbox: Sandbox, scratch: str):
    sandbox.files.write(f"{scratch}/rm.txt", "bye")
    sandbox.files.remove(f"{scratch}/rm.txt")
    assert sandbox.files.exists(f"{scratch}/rm.txt") is False
    sandbox.files.write(f"{scratch}/rmdir/a/b.txt", "bye")
    sandbox.files.remove(f"{scratch}/rmdir")
    assert sandbox.files.exists(f"{scratch}/rmdir") is False
    sandbox.files.remove(f"{scratch}/never-existed.txt")


def test_make_dir(sandbox: Sandbox, scratch: str):
    assert sandbox.files.make_dir(f"{scratch}/mk/nested/deeper") is True
    info = sandbox.files.get_info(f"{scratch}/mk/nested/deeper")
    assert info.type == FileType.DIR
    assert info.owner == "user"
    assert sandbox.files.make_dir(f"{scratch}/mk/nested/deeper") is False
    assert sandbox.files.make_dir(f"{scratch}/mk") is False


def test_user_root_files(sandbox: Sandbox, scratch: str):
    sandbox.files.make_dir(scratch)
    sandbox.files.write(f"{scratch}/rootfile.txt", "root was here", user="root")
    assert sandbox.files.get_info(f"{scratch}/rootfile.txt").owner == "root"
    assert sandbox.files.read(f"{scratch}/rootfile.txt", user="user") == "root was here"
    rel = sandbox.files.write("compat-py-root-rel.txt", "r", user="root")
    assert rel.path == "/root/compat-py-root-rel.txt"
    sandbox.files.remove("/root/compat-py-root-rel.txt", user="root")


def test_read_missing_file(sandbox: Sandbox, scratch: str):
    with pytest.raises(FileNotFoundException):
        sandbox.files.read(f"{scratch}/does-not-exist.txt")
    with pytest.raises(NotFoundException):
        sandbox.files.read(f"{scratch}/does-not-exist.txt", format="bytes")


def test_missing_path_info_and_list(sandbox: Sandbox, scratch: str):
    with pytest.raises(FileNotFoundException):
        sandbox.files.get_info(f"{scratch}/missing-info")
    with pytest.raises(FileNotFoundException):
        sandbox.files.list(f"{scratch}/missing-dir")


def test_read_dir_and_list_file_are_invalid(sandbox: Sandbox, scratch: str):
    sandbox.files.write(f"{scratch}/plain.txt", "x")
    with pytest.raises(InvalidArgumentException):
        sandbox.files.read(scratch)
    with pytest.raises(InvalidArgumentException):
        sandbox.files.list(f"{scratch}/plain.txt")


def _multipart(field: str, filename: str, data: bytes):
    boundary = "compat" + secrets.token_hex(8)
    body = (
        f'--{boundary}\r\nContent-Disposition: form-data; name="{field}"; filename="{filename}"\r\n'
        "Content-Type: application/octet-stream\r\n\r\n"
    ).encode() + data + f"\r\n--{boundary}--\r\n".encode()
    return body, f"multipart/form-data; boundary={boundary}"


def test_upload_and_download_urls_with_plain_http(sandbox: Sandbox, scratch: str):
    path = f"{scratch}/via-url.bin"
    data = all_bytes()
    # sandboxd mode: the signed URL carries no sandbox id, so the plain client
    # adds the routing headers (no access token). That the URL alone does not
    # route through E2B_SANDBOX_URL is tested in test_lifecycle.py.
    route = envd_headers(sandbox, token=False)
    up = sandbox.upload_url(path)
    u = urllib.parse.urlsplit(up)
    assert u.path == "/files"
    assert urllib.parse.parse_qs(u.query)["path"] == [path]
    body, ctype = _multipart("file", "via-url.bin", data)
    req = urllib.request.Request(up, data=body, method="POST", headers={**route, "Content-Type": ctype})
    with urllib.request.urlopen(req, timeout=30) as res:
        assert res.status == 200
        written = json.loads(res.read())
    assert isinstance(written, list) and len(written) == 1, written
    assert written[0]["path"] == path
    assert written[0]["name"] == "via-url.bin"
    assert written[0]["type"] == "file"

    with urllib.request.urlopen(urllib.request.Request(sandbox.download_url(path), headers=route), timeout=30) as res:
        assert res.status == 200
        assert res.read() == data
    ranged = urllib.request.Request(sandbox.download_url(path), headers={**route, "Range": "bytes=10-19"})
    with urllib.request.urlopen(ranged, timeout=30) as res:
        assert res.status == 206
        assert res.read() == data[10:20]
    with urllib.request.urlopen(urllib.request.Request(sandbox.download_url(path, user="root"), headers=route), timeout=30) as res:
        assert res.read() == data
    with pytest.raises(urllib.error.HTTPError) as ei:
        urllib.request.urlopen(urllib.request.Request(sandbox.download_url(f"{scratch}/nope.bin"), headers=route), timeout=30)
    assert ei.value.code == 404
    err = json.loads(ei.value.read())
    assert err["code"] == 404
    assert isinstance(err["message"], str)
