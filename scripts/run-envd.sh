#!/usr/bin/env bash
# Serves envd standalone on 127.0.0.1:49983 and prints what an E2B SDK needs to
# reach it in debug mode (no control plane involved).
set -euo pipefail
cd "$(dirname "$0")/.."
id user >/dev/null 2>&1 || useradd -m -s /bin/bash user
cat <<MSG
envd $(./bin/envd --version) on http://127.0.0.1:49983. In another shell:

  export E2B_DEBUG=true
  export E2B_API_KEY=e2b_$(printf '0%.0s' {1..40})

then Sandbox.create() / Sandbox() in the e2b SDKs talks to this envd.
MSG
exec ./bin/envd --listen 127.0.0.1:49983
