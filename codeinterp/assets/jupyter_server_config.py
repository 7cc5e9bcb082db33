# Jupyter Server's configuration in sandboxd's code-interpreter-v1 (start.sh
# passes it with --config).
#
# The kernel websocket without Nagle's algorithm: the kernel's replies to
# one execution are several small frames (status busy, execute_input,
# execute_result, execute_reply, status idle) written one after the other,
# and with Nagle each one after the first waited for the client's delayed
# ACK, 40 ms a run_code('1+1') (48 ms p50 before, 9 ms after, measured
# against the code-interpreter server on loopback). Tornado leaves
# TCP_NODELAY to the handler, which jupyter_server's does not set.
try:
    from jupyter_server.services.kernels.websocket import KernelWebsocketHandler as _Handler

    _open = _Handler.open

    async def _open_nodelay(self, *args, **kwargs):
        self.set_nodelay(True)
        return await _open(self, *args, **kwargs)

    _Handler.open = _open_nodelay
except Exception as e:  # a Jupyter without that handler still starts, only slower
    print(f"sandboxd: kernel websocket keeps Nagle's algorithm: {e!r}")
