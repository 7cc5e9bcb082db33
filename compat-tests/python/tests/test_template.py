"""Templates built through the Python SDK's Template builder (build system
v2) against sandboxd: every step kind, COPY uploads, a Dockerfile, start and
ready commands, cache hits, failures, tags, exists, background builds."""

import os
import secrets
import time

import pytest

from conftest import SANDBOXD_ONLY
from e2b import BuildException, Sandbox, Template, wait_for_file, wait_for_port

pytestmark = [SANDBOXD_ONLY, pytest.mark.timeout(300)]


def unique(prefix: str) -> str:
    return f"{prefix}-{secrets.token_hex(4)}"


@pytest.fixture(scope="module")
def context_dir(tmp_path_factory):
    d = tmp_path_factory.mktemp("compat-template")
    (d / "app").mkdir()
    (d / "app" / "main.py").write_text('print("hello from the template")\n')
    (d / "config.json").write_text('{"mode":"test"}\n')
    (d / "run.sh").write_text("#!/bin/sh\necho run\n")
    os.chmod(d / "run.sh", 0o755)
    return str(d)


def app_template(context_dir):
    return (
        Template(file_context_path=context_dir)
        .from_base_image()
        .set_envs({"APP_MODE": "compat", "GREETING": "hi"})
        .set_workdir("/home/user/app")
        .copy("app", "./")
        .copy("config.json", "/home/user/config/config.json")
        .copy("run.sh", "/home/user/bin/", mode=0o755)
        .run_cmd('echo "$GREETING from $(id -un)" > built.txt')
        .run_cmd("touch /opt/root-was-here", user="root")
        .set_start_cmd("sleep 1 && python3 -m http.server 8123 --bind 127.0.0.1", wait_for_port(8123))
    )


@pytest.fixture(scope="module")
def built(context_dir):
    name = unique("py-app")
    logs = []
    info = Template.build(app_template(context_dir), f"{name}:v1", on_build_logs=lambda e: logs.append(e.message))
    return name, info, logs


@pytest.fixture
def sandboxes():
    made = []

    def make(template: str) -> Sandbox:
        sbx = Sandbox.create(template, timeout=600)
        made.append(sbx)
        return sbx

    yield make
    for s in made:
        try:
            s.kill()
        except Exception:
            pass


def test_build_and_sandbox(built, sandboxes):
    name, info, logs = built
    assert info.name.startswith(name) and info.template_id and info.build_id
    assert any("RUN" in l for l in logs), logs
    assert Template.exists(name)
    sbx = sandboxes(name)
    assert sbx.get_info().template_id == info.template_id
    r = sbx.commands.run(
        "cat built.txt && python3 main.py && cat ../config/config.json && ls -l ../bin/run.sh | cut -c1-10"
        " && echo $APP_MODE && pwd && stat -c %U /opt/root-was-here"
    )
    assert r.stdout == 'hi from user\nhello from the template\n{"mode":"test"}\n-rwxr-xr-x\ncompat\n/home/user/app\nroot\n'
    # The start command was ready before create returned.
    assert sbx.commands.run("ss -Htln sport = :8123 | wc -l").stdout.strip() == "1"
    assert sandboxes(f"{name}:v1").files.read("/home/user/app/built.txt").strip() == "hi from user"


def test_rebuild_is_cached(built, context_dir):
    name, _, _ = built
    logs = []
    Template.build(app_template(context_dir), name, on_build_logs=lambda e: logs.append(e.message))
    assert len([l for l in logs if l.startswith("CACHED")]) >= 5, logs


def test_tags(built, sandboxes):
    name, _, _ = built
    Template.assign_tags(f"{name}:v1", ["stable"])
    tags = sorted(t.tag for t in Template.get_tags(name))
    assert "stable" in tags and "v1" in tags, tags
    assert sandboxes(f"{name}:stable").files.read("/home/user/app/built.txt").strip() == "hi from user"
    Template.remove_tags(name, "stable")
    with pytest.raises(Exception):
        Sandbox.create(f"{name}:stable")


def test_failing_step():
    bad = Template().from_template("base").run_cmd("echo fine").run_cmd("echo broken-step >&2; exit 7")
    with pytest.raises(BuildException) as e:
        Template.build(bad, unique("py-bad"))
    assert "exit code 7" in str(e.value) and "broken-step" in str(e.value)


def test_dockerfile(sandboxes, tmp_path):
    (tmp_path / "hello.txt").write_text("from a Dockerfile\n")
    df = "FROM e2bdev/base\nENV WHO=docker\nWORKDIR /home/user/df\nCOPY hello.txt .\nRUN echo $WHO > who.txt\n"
    name = unique("py-df")
    Template.build(Template(file_context_path=str(tmp_path)).from_dockerfile(df), name)
    r = sandboxes(name).commands.run("cat /home/user/df/hello.txt /home/user/df/who.txt")
    assert r.stdout == "from a Dockerfile\ndocker\n"


def test_background_build(sandboxes):
    name = unique("py-bg")
    t = Template().from_template("base").run_cmd("echo bg > /tmp/bg.txt").set_start_cmd(
        "touch /tmp/ready && sleep 100000", wait_for_file("/tmp/ready"))
    info = Template.build_in_background(t, name)
    deadline = time.monotonic() + 240
    while True:
        st = Template.get_build_status(info)
        if st.status.value in ("ready", "error") or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    assert st.status.value == "ready", st.reason
    assert sandboxes(name).files.read("/tmp/bg.txt").strip() == "bg"


def test_exists_false():
    assert Template.exists(unique("never")) is False


def test_from_image(sandboxes):
    reg, priv = os.environ.get("COMPAT_REGISTRY"), os.environ.get("COMPAT_PRIVATE_REGISTRY")
    assert reg and priv, "run.sh sets COMPAT_REGISTRY and COMPAT_PRIVATE_REGISTRY"
    name = unique("py-img")
    Template.build(Template().from_image(f"{reg}/sandboxd-test/busybox:1").run_cmd('echo "$FROM_IMAGE" > /home/user/from.txt'), name)
    r = sandboxes(name).commands.run("cat /home/user/from.txt; id -un; echo $FROM_IMAGE")
    assert r.stdout == "yes\nuser\nyes\n"
    user, password = os.environ["COMPAT_REGISTRY_USER"], os.environ["COMPAT_REGISTRY_PASS"]
    Template.build(Template().from_image(f"{priv}/sandboxd-test/busybox:1", username=user, password=password).run_cmd("true"), unique("py-priv"))
    with pytest.raises(BuildException) as e:
        Template.build(Template().from_image(f"{priv}/sandboxd-test/busybox:1", username=user, password="wrong"), unique("py-priv-bad"))
    assert "refused" in str(e.value)
