# Jupyter Server's configuration in sandboxd's code-interpreter-v1 (start.sh
# passes it with --config).
#
# The code-interpreter server restarts a kernel that died (it sees its
# ZeroMQ connections close) before the context's next execution; Jupyter
# restarting it too, on its own poll, would race that restart.
c.KernelManager.autorestart = False

# The kernel websocket without Nagle's algorithm. The code-interpreter
# server talks to the kernels over ZeroMQ, not through it; this is for
# other clients of Jupyter's (the benchmark's comparison): the kernel's
# replies to one execution are several small frames written one after the
# other, and with Nagle each one after the first waited for the client's
# delayed ACK, 40 ms a `1+1`. Tornado leaves TCP_NODELAY to the handler,
# which jupyter_server's does not set.
try:
    from jupyter_server.services.kernels.websocket import KernelWebsocketHandler as _Handler

    _open = _Handler.open

    async def _open_nodelay(self, *args, **kwargs):
        self.set_nodelay(True)
        return await _open(self, *args, **kwargs)

    _Handler.open = _open_nodelay
except Exception as e:  # a Jupyter without that handler still starts, only slower
    print(f"sandboxd: kernel websocket keeps Nagle's algorithm: {e!r}")
