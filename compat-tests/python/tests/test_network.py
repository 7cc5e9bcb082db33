"""E2B's network policy through the real e2b Python SDK against a real
sandboxd: Sandbox.create(network={"allow_out", "deny_out"}),
get_info().network, update_network() and the API's errors for bad or
unsupported input. Reachability is tested from inside the sandbox (python3)
against the fake internet run.sh starts (compat-tests/fakeinet): servers ONE
and TWO on COMPAT_INET_ONE / COMPAT_INET_TWO with HTTP on 80 and HTTPS on
443, and a DNS server on ONE (sandboxd's --egress-dns) that knows
allowed.sbx.test, denied.sbx.test and a.wild.sbx.test (ONE) and
evil.sbx.test (TWO). sandboxd mode only; the module skips without the fake
internet."""

import os
import secrets

import pytest

from e2b import ALL_TRAFFIC, CommandExitException, Sandbox, SandboxException

from conftest import SANDBOXD

ONE = os.environ.get("COMPAT_INET_ONE", "")
TWO = os.environ.get("COMPAT_INET_TWO", "")

pytestmark = [
    pytest.mark.skipif(not SANDBOXD, reason="sandboxd mode only (COMPAT_TARGET=sandboxd)"),
    pytest.mark.skipif(
        not (ONE and TWO),
        reason="no fake internet: COMPAT_INET_ONE / COMPAT_INET_TWO are unset "
        "(run.sh starts compat-tests/fakeinet in the sandboxd and incus modes)",
    ),
    pytest.mark.timeout(180),
]

RUN = secrets.token_hex(4)  # this module's metadata tag
REPLY = "from-inet "  # how the fake servers' answers start

# get.py HOST PORT tls|http [CONNECT_ADDR [SNI]]: GET / with Host: HOST on
# CONNECT_ADDR (default HOST), over TLS (no verification) with SNI (default
# HOST); prints the answer. A refused, dropped or unresolvable connection
# exits non-zero.
GET_PY = r"""import socket, ssl, sys
host, port, tls = sys.argv[1], int(sys.argv[2]), sys.argv[3] == "tls"
addr = sys.argv[4] if len(sys.argv) > 4 else host
sni = sys.argv[5] if len(sys.argv) > 5 else host
s = socket.create_connection((addr, port), timeout=3)
if tls:
    ctx = ssl.create_default_context()
    ctx.check_hostname, ctx.verify_mode = False, ssl.CERT_NONE
    s = ctx.wrap_socket(s, server_hostname=sni)
s.sendall(("GET / HTTP/1.0\r\nHost: %s\r\n\r\n" % host).encode())
data = b""
while True:
    d = s.recv(4096)
    if not d:
        break
    data += d
print(data.decode(errors="replace"))
"""


@pytest.fixture
def create():
    """create(network=None, **kw): a sandbox with get.py, killed in teardown."""
    made = []

    def make(network=None, **kw):
        if network is not None:
            kw["network"] = network
        sbx = Sandbox.create(timeout=300, metadata={"compatRun": RUN}, **kw)
        made.append(sbx.sandbox_id)
        sbx.files.write("/tmp/get.py", GET_PY)
        return sbx

    yield make
    for sid in made:
        try:
            Sandbox.kill(sid)
        except Exception:
            pass


def get(sbx: Sandbox, *args):
    """(ok, output) of get.py: ok when it exited 0 with a fake server's answer."""
    cmd = "python3 /tmp/get.py " + " ".join(str(a) for a in args)
    try:
        r = sbx.commands.run(cmd, timeout=30)
    except CommandExitException as e:
        return False, f"{cmd}: exit {e.exit_code}: {e.stdout}{e.stderr}"
    return REPLY in r.stdout, f"{cmd}: {r.stdout}{r.stderr}"


def answers(sbx: Sandbox, want, *args):
    ok, out = get(sbx, *args)
    assert ok, f"want an answer: {out}"
    if want:
        assert want in out, f"want {want!r} in the answer: {out}"


def refused(sbx: Sandbox, *args):
    ok, out = get(sbx, *args)
    assert not ok, f"want no answer: {out}"


def policy(sbx: Sandbox) -> dict:
    """get_info's allow_out / deny_out, [] for a missing list."""
    n = sbx.get_info().network or {}
    return {"allow_out": n.get("allow_out") or [], "deny_out": n.get("deny_out") or []}


def api_error(fn, status: int, what: str):
    """Asserts that fn() raises the API's error of status (a SandboxException
    "<status>: <message>") naming what."""
    with pytest.raises(SandboxException) as ei:
        fn()
    msg = str(ei.value)
    assert msg.startswith(f"{status}:"), f"want status {status}: {type(ei.value).__name__}: {msg}"
    assert what in msg, f"want {what} in the message: {msg}"


def test_no_policy(create):
    sbx = create()
    answers(sbx, f"host={ONE}", ONE, 80, "http")
    answers(sbx, f"host={TWO}", TWO, 80, "http")
    assert policy(sbx) == {"allow_out": [], "deny_out": []}


def test_allow_one_in_deny_all(create):
    assert ALL_TRAFFIC == "0.0.0.0/0"
    sbx = create({"allow_out": [ONE], "deny_out": [ALL_TRAFFIC]})
    answers(sbx, f"host={ONE}", ONE, 80, "http")
    answers(sbx, f"host={ONE}", ONE, 443, "tls")
    refused(sbx, TWO, 80, "http")
    refused(sbx, TWO, 443, "tls")
    assert policy(sbx) == {"allow_out": [ONE], "deny_out": [ALL_TRAFFIC]}
    # The callable form of the selectors sends the same.
    cb = create({"allow_out": lambda ctx: [ONE], "deny_out": lambda ctx: [ctx.all_traffic]})
    assert policy(cb) == {"allow_out": [ONE], "deny_out": [ALL_TRAFFIC]}
    refused(cb, TWO, 80, "http")


def test_deny_two(create):
    sbx = create({"deny_out": [f"{TWO}/32"]})
    answers(sbx, f"host={ONE}", ONE, 80, "http")
    refused(sbx, TWO, 80, "http")
    refused(sbx, TWO, 443, "tls")
    assert policy(sbx) == {"allow_out": [], "deny_out": [f"{TWO}/32"]}


def test_domains(create):
    sbx = create({"allow_out": ["allowed.sbx.test", "*.wild.sbx.test"], "deny_out": [ALL_TRAFFIC]})
    answers(sbx, "host=allowed.sbx.test", "allowed.sbx.test", 443, "tls")
    answers(sbx, "host=allowed.sbx.test", "allowed.sbx.test", 80, "http")
    answers(sbx, "host=a.wild.sbx.test", "a.wild.sbx.test", 443, "tls")
    refused(sbx, "denied.sbx.test", 443, "tls")  # NXDOMAIN
    refused(sbx, "denied.sbx.test", 443, "tls", ONE)  # by address: the proxy checks the SNI
    refused(sbx, ONE, 80, "http")  # a bare address in Host
    # A forged SNI: to TWO's address with an allowed name, the proxy dials
    # the name itself (ONE); with a name not allowed, nothing.
    answers(sbx, "host=allowed.sbx.test", "allowed.sbx.test", 443, "tls", TWO, "allowed.sbx.test")
    refused(sbx, "evil.sbx.test", 443, "tls", TWO, "evil.sbx.test")
    assert policy(sbx) == {"allow_out": ["allowed.sbx.test", "*.wild.sbx.test"], "deny_out": [ALL_TRAFFIC]}


def test_update_network_live(create):
    sbx = create({"allow_out": [ONE], "deny_out": [ALL_TRAFFIC]})
    answers(sbx, None, ONE, 80, "http")
    refused(sbx, TWO, 80, "http")

    sbx.update_network({"allow_out": [TWO], "deny_out": [ALL_TRAFFIC]})
    assert policy(sbx) == {"allow_out": [TWO], "deny_out": [ALL_TRAFFIC]}
    answers(sbx, f"host={TWO}", TWO, 80, "http")
    refused(sbx, ONE, 80, "http")

    sbx.update_network({})
    assert policy(sbx) == {"allow_out": [], "deny_out": []}
    answers(sbx, None, ONE, 80, "http")
    answers(sbx, None, TWO, 80, "http")

    # The static form, by id.
    Sandbox.update_network(sbx.sandbox_id, {"deny_out": [f"{ONE}/32"]})
    assert policy(sbx) == {"allow_out": [], "deny_out": [f"{ONE}/32"]}
    refused(sbx, ONE, 80, "http")
    answers(sbx, None, TWO, 80, "http")


def test_bad_input(create):
    # The SDK raises the API's 400 as its base SandboxException ("400: <message>").
    api_error(lambda: create({"deny_out": ["example.com"]}), 400, "network.denyOut")
    api_error(lambda: create({"allow_out": ["allowed.sbx.test"]}), 400, "network.allowOut")
    api_error(lambda: create({"allow_out": ["allowed.sbx.test"], "deny_out": [f"{TWO}/32"]}), 400, "network.allowOut")
    api_error(lambda: create({"deny_out": ["1.2.3.4:99999"]}), 400, "network.denyOut")

    sbx = create({"allow_out": [ONE], "deny_out": [ALL_TRAFFIC]})
    api_error(lambda: sbx.update_network({"deny_out": ["example.com"]}), 400, "network.denyOut")
    api_error(
        lambda: sbx.update_network(
            {
                "allow_out": ["allowed.sbx.test"],
                "rules": {"allowed.sbx.test": [{"transform": {"headers": {"X-Compat": "1"}}}]},
            }
        ),
        501,
        "network.rules",
    )
    # The failed updates left the policy as it was.
    assert policy(sbx) == {"allow_out": [ONE], "deny_out": [ALL_TRAFFIC]}
    refused(sbx, TWO, 80, "http")


def test_no_internet_access_cannot_get_rules(create):
    sbx = create(allow_internet_access=False)
    refused(sbx, ONE, 80, "http")
    api_error(lambda: sbx.update_network({"allow_out": [ONE], "deny_out": [ALL_TRAFFIC]}), 501, "network")
