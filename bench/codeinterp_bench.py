"""Code-interpreter timings with E2B's Python SDK (e2b_code_interpreter)
against sandboxd.

Driven by `go run ./bench -scenario codeinterp`, which sets E2B_API_URL,
E2B_SANDBOX_URL and E2B_API_KEY to its own sandboxd on loopback, with the
template code-interpreter-v1 built. Prints one JSON object per line:

  create MODE N        MODE cold or warm: N times Sandbox.create(), the
                       first run_code("1+1") result, kill()
      {"kind": "create", "warmup": bool, "create_ms": .., "first_ms": .., "kill_ms": ..}
      warm waits before each create until sandboxd's /metrics shows a
      ready code-interpreter-v1 member (the refill of the one claimed before)
  rtt N IDLE_S         one sandbox: N run_code("1+1") round trips through
                       the SDK, then the same request without the SDK
                       (httpx, the SDK's headers and body), then from
                       inside the sandbox straight to the server on :49999
                       and envd's GET /envs (what the server asks per
                       execution); then IDLE_S seconds idle and getMetrics
      {"kind": "rtt", "sdk_ms": [..], "raw_ms": [..], "inside_ms": [..], "envs_ms": [..]}
      {"kind": "mem", "mem_used": bytes, "mem_total": bytes, "idle_s": ..}
      {"kind": "jupyter", "jupyter_ms": [..], "zmq_ms": [..]}: then 1+1
      straight over Jupyter's kernel websocket, on a kernel of its own,
      inside the sandbox, and on the same kernel straight over ZeroMQ
  {"kind": "error", "error": "..."} for any failure

usage: codeinterp_bench.py create cold|warm N | rtt N IDLE_S
"""

import json
import os
import re
import sys
import time

from benchutil import ms  # noqa: E402  (first: it checks the environment)

import httpx  # noqa: E402
from e2b_code_interpreter import Sandbox  # noqa: E402


def emit(obj) -> None:
    print(json.dumps(obj), flush=True)


def pool_ready(within: float = 120) -> None:
    """Waits until sandboxd holds a ready code-interpreter-v1 member, in a
    tenant's pool or in the host-wide spare pool (issue 24), where its
    members are kept since the spare pool came. The metrics name a built
    template by its build id; this sandboxd has no other template than
    base."""
    url = os.environ["E2B_SANDBOX_URL"] + "/metrics"
    pat = re.compile(r'^sandboxd_(?:pool|spare)_members\{([^}]*)\} (\S+)$', re.M)
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        text = httpx.get(url).text
        n = sum(float(v) for labels, v in pat.findall(text)
                if 'template="base"' not in labels and 'state="ready"' in labels)
        if n >= 1:
            return
        time.sleep(0.05)
    raise TimeoutError(f"no ready code-interpreter-v1 member within {within} s")


def create(mode: str, n: int) -> None:
    for i in range(n + 1):  # the first warms imports, connections and (warm) the pool's growth
        out = {"kind": "create", "warmup": i == 0}
        sbx = None
        try:
            if mode == "warm" and i > 0:
                pool_ready()
            t0 = time.perf_counter()
            sbx = Sandbox.create(timeout=600)
            out["create_ms"] = ms(t0)
            t0 = time.perf_counter()
            ex = sbx.run_code("1+1")
            out["first_ms"] = ms(t0)
            if ex.text != "2":
                raise RuntimeError(f"run_code('1+1'): text {ex.text!r}, error {ex.error}")
            t0 = time.perf_counter()
            sbx.kill()
            out["kill_ms"] = ms(t0)
            sbx = None
        except Exception as e:  # report and go on: the Go side counts errors
            out = {"kind": "error", "error": f"{type(e).__name__}: {e}"}
            if sbx is not None:
                try:
                    sbx.kill()
                except Exception:
                    pass
        emit(out)


# INSIDE runs in the sandbox: N POSTs of /execute to the server on
# loopback (what the proxy forwards to), and N GETs of envd's /envs with
# the sandbox's access token, over kept-alive connections.
INSIDE = r"""
import http.client, json, os, sys, time
n = int(sys.argv[1])
def loop(port, method, path, body, headers):
    c = http.client.HTTPConnection("127.0.0.1", port)
    out = []
    for _ in range(n + 5):
        t0 = time.perf_counter()
        c.request(method, path, body=body, headers=headers)
        r = c.getresponse()
        data = r.read()
        assert r.status == 200, (r.status, data[:200])
        out.append((time.perf_counter() - t0) * 1000)
    return out[5:]
tok = {"X-Access-Token": os.environ["TOKEN"]} if os.environ.get("TOKEN") else {}
ex = loop(49999, "POST", "/execute", json.dumps({"code": "1+1"}), dict(tok, **{"Content-Type": "application/json"}))
envs = loop(49983, "GET", "/envs", None, tok)
print(json.dumps({"inside_ms": ex, "envs_ms": envs}))
"""


# JUPYTER runs in the sandbox too: N executions of 1+1 on a kernel of its
# own, straight over Jupyter's kernel websocket (what the server does per
# execution, without the server): execute_request, then the replies until
# both the execute_reply and the idle status are in.
JUPYTER = r"""
import json, sys, time, urllib.request, uuid
import websocket
n = int(sys.argv[1])
base = "127.0.0.1:8888"
def call(method, path, body=None):
    req = urllib.request.Request("http://" + base + path, method=method, data=json.dumps(body).encode() if body is not None else None,
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=60) as r:
        raw = r.read()
        return json.loads(raw) if raw else None
kid = call("POST", "/api/kernels", {"name": "python3"})["id"]
try:
    ws = websocket.create_connection("ws://" + base + "/api/kernels/" + kid + "/channels", timeout=60)
    session = uuid.uuid4().hex
    def run():
        mid = uuid.uuid4().hex
        ws.send(json.dumps({"header": {"msg_id": mid, "msg_type": "execute_request", "session": session, "username": "", "version": "5.3", "date": ""},
                            "parent_header": {}, "metadata": {}, "channel": "shell", "buffers": [],
                            "content": {"code": "1+1", "silent": False, "store_history": True, "user_expressions": {}, "allow_stdin": False}}))
        reply = idle = False
        while not (reply and idle):
            m = json.loads(ws.recv())
            if m.get("parent_header", {}).get("msg_id") != mid:
                continue
            t = m["header"]["msg_type"]
            reply = reply or t == "execute_reply"
            idle = idle or (t == "status" and m["content"].get("execution_state") == "idle")
    def timed(run):
        out = []
        for i in range(n + 5):
            t0 = time.perf_counter()
            run()
            if i >= 5:
                out.append((time.perf_counter() - t0) * 1000)
        return out
    res = {"jupyter_ms": timed(run)}
    # The same kernel straight over ZeroMQ (jupyter_client, pyzmq), as the
    # server talks to it: the kernel's own share. The connection file is in
    # Jupyter's runtime dir: the template's, or Jupyter's default.
    import glob, os
    from jupyter_client import BlockingKernelClient
    files = [f for d in ("/opt/sandboxd/code-interpreter/runtime", os.path.expanduser("~/.local/share/jupyter/runtime"), "/root/.local/share/jupyter/runtime")
             for f in glob.glob(os.path.join(d, "kernel-" + kid + ".json"))]
    if files:
        kc = BlockingKernelClient(connection_file=files[0])
        kc.load_connection_file()
        kc.start_channels(hb=False)  # no heartbeat: wait_for_ready took a silent one for dead
        kc.wait_for_ready(timeout=60)
        def zrun():
            mid = kc.execute("1+1")
            reply = idle = False
            while not idle:
                m = kc.get_iopub_msg(timeout=60)
                idle = m["parent_header"].get("msg_id") == mid and m["msg_type"] == "status" and m["content"]["execution_state"] == "idle"
            while not reply:
                reply = kc.get_shell_msg(timeout=60)["parent_header"].get("msg_id") == mid
        res["zmq_ms"] = timed(zrun)
        kc.stop_channels()
    print(json.dumps(res))
finally:
    call("DELETE", "/api/kernels/" + kid)
"""


def rtt(n: int, idle_s: float) -> None:
    sbx = Sandbox.create(timeout=600)
    try:
        for _ in range(5):
            sbx.run_code("1+1")
        out = {"kind": "rtt", "sdk_ms": [], "raw_ms": []}
        for _ in range(n):
            t0 = time.perf_counter()
            ex = sbx.run_code("1+1")
            out["sdk_ms"].append(ms(t0))
            if ex.text != "2":
                raise RuntimeError(f"run_code('1+1'): text {ex.text!r}")
        # The SDK's request without the SDK: its URL, headers and body on
        # one kept-alive HTTP/1.1 connection, the NDJSON read whole.
        headers = {"Content-Type": "application/json", "E2b-Sandbox-Id": sbx.sandbox_id, "E2b-Sandbox-Port": "49999"}
        if sbx._envd_access_token:
            headers["X-Access-Token"] = sbx._envd_access_token
        body = {"code": "1+1", "context_id": None, "language": None, "env_vars": None}
        with httpx.Client(trust_env=False) as hc:
            url = sbx._jupyter_url + "/execute"
            for i in range(n + 5):
                t0 = time.perf_counter()
                r = hc.post(url, json=body, headers=headers)
                took = ms(t0)
                if r.status_code != 200 or '"text": "2"' not in r.text and '"text":"2"' not in r.text:
                    raise RuntimeError(f"raw execute: {r.status_code} {r.text[:200]}")
                if i >= 5:
                    out["raw_ms"].append(took)
        py = "/opt/sandboxd/code-interpreter/venv/bin/python"
        sbx.files.write("/tmp/inside_bench.py", INSIDE)
        res = sbx.commands.run(f"{py} /tmp/inside_bench.py {n}", envs={"TOKEN": sbx._envd_access_token or ""}, timeout=300)
        out.update(json.loads(res.stdout.strip().splitlines()[-1]))
        emit(out)

        # Idle: nothing runs; Jupyter, the kernel (it ran the calls above),
        # the server and envd hold what they hold.
        time.sleep(idle_s)
        m = sbx.get_metrics()
        if not m:
            raise RuntimeError("getMetrics returned nothing")
        emit({"kind": "mem", "mem_used": m[-1].mem_used, "mem_total": m[-1].mem_total, "idle_s": idle_s})

        # After the memory: a second kernel would count in it.
        sbx.files.write("/tmp/jupyter_bench.py", JUPYTER)
        # As root: the kernels' connection files are root's.
        res = sbx.commands.run(f"{py} /tmp/jupyter_bench.py {n}", timeout=300, user="root")
        emit(dict({"kind": "jupyter"}, **json.loads(res.stdout.strip().splitlines()[-1])))
    except Exception as e:
        emit({"kind": "error", "error": f"{type(e).__name__}: {e}"})
    finally:
        try:
            sbx.kill()
        except Exception:
            pass


def main() -> None:
    if sys.argv[1] == "create":
        create(sys.argv[2], int(sys.argv[3]))
    elif sys.argv[1] == "rtt":
        rtt(int(sys.argv[2]), float(sys.argv[3]))
    else:
        sys.exit(f"unknown mode {sys.argv[1]!r}")


if __name__ == "__main__":
    main()
