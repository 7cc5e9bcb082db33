# Jupyter Server's configuration in sandboxd's code-interpreter-v1 (start.sh
# passes it with --config).
#
# The code-interpreter server restarts a kernel that died (it sees its
# ZeroMQ connections close) before the context's next execution; Jupyter
# restarting it too, on its own poll, would race that restart.
c.KernelManager.autorestart = False
