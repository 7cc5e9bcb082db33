#!/bin/sh
# The start command of sandboxd's code-interpreter-v1 template: a Jupyter
# Server on loopback without a token (nothing outside the sandbox reaches
# it), which starts, restarts and interrupts the kernels, and the
# code-interpreter server on :49999 that E2B's SDKs talk to, which talks to
# the kernels over ZeroMQ with the connection files Jupyter writes into
# JUPYTER_RUNTIME_DIR. The server's /health says OK once the default
# Python kernel runs: the template's ready command waits for that.
dir=$(dirname "$0")
export IPYTHONDIR="$dir/ipython" JUPYTER_PLATFORM_DIRS=1 MPLBACKEND=module://matplotlib_inline.backend_inline \
	JUPYTER_RUNTIME_DIR="$dir/runtime"
mkdir -p /home/user 2>/dev/null
cd /home/user 2>/dev/null || cd /
"$dir/venv/bin/jupyter" server --config="$dir/jupyter_server_config.py" --ServerApp.ip=127.0.0.1 --ServerApp.port=8888 --ServerApp.port_retries=0 \
	--IdentityProvider.token= --ServerApp.password= --ServerApp.disable_check_xsrf=True \
	--ServerApp.root_dir=/ --ServerApp.open_browser=False --allow-root \
	>/tmp/jupyter.log 2>&1 &
exec "$dir/code-interpreter" --listen 0.0.0.0:49999 --jupyter http://127.0.0.1:8888 >/tmp/code-interpreter.log 2>&1
