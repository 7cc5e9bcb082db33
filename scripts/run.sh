#!/usr/bin/env bash
# `make run`: serve sandboxd on the local backend at 127.0.0.1:3000 with
# ./data, mint an API key on first start, and print what an E2B SDK needs.
set -euo pipefail
cd "$(dirname "$0")/.."
listen=${SANDBOXD_LISTEN:-127.0.0.1:3000}
data=${SANDBOXD_DATA_DIR:-./data}
mkdir -p "$data"
keyfile="$data/default-tenant.key"
if [ ! -s "$keyfile" ]; then
  (umask 077; ./bin/sandboxd keys create --data-dir "$data" --tenant default > "$keyfile")
fi
cat <<MSG
sandboxd on http://$listen (local backend, data in $data). In the shell that runs your agent:

  export E2B_API_URL=http://$listen/v1/sandboxes/e2b
  export E2B_SANDBOX_URL=http://$listen
  export E2B_VOLUME_API_URL=http://$listen/v1/sandboxes/e2b
  export E2B_API_KEY=$(cat "$keyfile")

MSG
exec ./bin/sandboxd serve --listen "$listen" --data-dir "$data"
