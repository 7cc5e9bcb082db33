#!/usr/bin/env bash
# The deployment files against the real tools they are for (make test-deploy):
#   - docker-compose.yml loaded by compose-go, Docker Compose's own loader
#     (deploy/check), with and without the incus profile;
#   - deploy/systemd/sandboxd.service through systemd-analyze verify, any
#     warning a failure;
#   - the Grafana dashboard: every query run on a real Prometheus (Debian's)
#     scraping a real bin/sandboxd that has created, refused (429) and
#     proxied, each sandboxd metric it names present in /metrics.
# No container engine runs on the CI machines, so the image is not built
# here and `docker compose up` is not run (README, Deploying).
# Ends with `N passed, N failed`.
set -uo pipefail
cd "$(dirname "$0")/.."
root=$PWD
pass=0 fail=0
ok() { echo "ok   $*"; pass=$((pass + 1)); }
bad() { echo "FAIL $*"; fail=$((fail + 1)); }
work=$(mktemp -d -t deploy-check.XXXXXX)
pids=()
id='' api='' key=''
# The sandbox goes before sandboxd does (sandboxes outlive their sandboxd by
# design): a run cut short by a signal leaves no mount under $work behind.
destroy_sandbox() {
  [[ -n $id ]] || return 0
  curl -sS -m 10 -o /dev/null -X DELETE -H "X-API-Key: $key" "$api/v1/sandboxes/e2b/sandboxes/$id" || true
  id=''
}
cleanup() {
  destroy_sandbox
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null; done
  wait 2>/dev/null
  rm -rf "$work"
}
trap cleanup EXIT
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }
# counts CHECK-OUTPUT: adds deploy/check's closing line to ours.
counts() {
  local line; line=$(grep -E '^[0-9]+ passed, [0-9]+ failed$' <<<"$1" | tail -n1)
  if [[ -z $line ]]; then bad "deploy/check printed no summary"; return; fi
  read -r p _ f _ <<<"$line"; pass=$((pass + p)); fail=$((fail + f))
}

for b in prometheus systemd-analyze; do
  command -v "$b" >/dev/null || { echo "deploy-check: $b is missing (scripts/deps.sh installs it)" >&2; echo "0 passed, 1 failed"; exit 1; }
done
[[ -x bin/sandboxd ]] || { echo "deploy-check: bin/sandboxd is missing: make build" >&2; echo "0 passed, 1 failed"; exit 1; }
(cd deploy/check && go build -o "$work/check" .) || { echo "0 passed, 1 failed"; exit 1; }

out=$("$work/check" compose "$root/docker-compose.yml" 2>&1); echo "$out" | grep -v ' passed, '; counts "$out"

# systemd-analyze wants the binary the unit runs to exist.
sed "s#/usr/local/bin/sandboxd#$root/bin/sandboxd#" deploy/systemd/sandboxd.service >"$work/sandboxd.service"
if msg=$(systemd-analyze verify "$work/sandboxd.service" 2>&1) && [[ -z $msg ]]; then
  ok "systemd-analyze verify deploy/systemd/sandboxd.service"
else
  bad "systemd-analyze verify deploy/systemd/sandboxd.service: $msg"
fi

# A sandboxd with a host budget (its gauges), a create rate of one per five
# seconds (a 429 for the limiter's series) and one sandbox proxied to; no
# code-interpreter build, which nothing here looks at (pip in a sandbox).
port=$(free_port)
data=$work/data
./bin/sandboxd keys create --data-dir "$data" --tenant deploy >"$work/key" 2>/dev/null
key=$(head -n1 "$work/key")
./bin/sandboxd serve --listen "127.0.0.1:$port" --data-dir "$data" --run-dir "$work/run" \
  --egress-subnet "${DEPLOY_CHECK_EGRESS_SUBNET:-10.176.0.0/16}" --host-memory-mb 8192 \
  --create-rate 0.2 --create-burst 1 --code-interpreter off >"$work/sandboxd.log" 2>&1 &
pids+=($!)
api=http://127.0.0.1:$port
for _ in $(seq 100); do curl -fsS "$api/health" >/dev/null 2>&1 && break; sleep 0.1; done
create() { curl -sS -o "$work/create.json" -w '%{http_code}' -X POST -H "X-API-Key: $key" -H 'Content-Type: application/json' \
  "$api/v1/sandboxes/e2b/sandboxes" -d '{"templateID":"base","timeout":120}'; }
code=$(create)
id=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1])).get("sandboxID",""))' "$work/create.json" 2>/dev/null)
code2=$(create)
if [[ $code == 201 && -n $id && $code2 == 429 ]]; then
  ok "sandboxd: a create (201), one over the rate (429)"
else
  bad "sandboxd: creates answered $code and $code2; want 201 and 429 ($(tail -n3 "$work/sandboxd.log"))"
fi
curl -sS -o /dev/null -H "E2b-Sandbox-Id: $id" -H "E2b-Sandbox-Port: 49983" "$api/health" || true

# A Prometheus of the host's, scraping it every second.
pport=$(free_port)
cat >"$work/prometheus.yml" <<EOF2
global: {scrape_interval: 1s, evaluation_interval: 1s}
scrape_configs:
  - job_name: sandboxd
    static_configs: [{targets: ["127.0.0.1:$port"]}]
EOF2
if ! promtool check config "$work/prometheus.yml" >/dev/null; then bad "promtool check config"; fi
prometheus --config.file="$work/prometheus.yml" --storage.tsdb.path="$work/tsdb" \
  --web.listen-address="127.0.0.1:$pport" >"$work/prometheus.log" 2>&1 &
pids+=($!)
prom=http://127.0.0.1:$pport
# rate() needs two samples: wait for a few scrapes.
scraped=
for _ in $(seq 150); do
  n=$(curl -fsS "$prom/api/v1/query?query=count_over_time(up%7Bjob%3D%22sandboxd%22%7D%5B1m%5D)" 2>/dev/null |
    python3 -c 'import json,sys; r=json.load(sys.stdin)["data"]["result"]; print(r[0]["value"][1] if r else 0)' 2>/dev/null)
  if [[ ${n:-0} -ge 4 ]]; then scraped=1; break; fi
  sleep 0.2
done
if [[ -n $scraped ]]; then ok "Prometheus scrapes sandboxd"; else bad "Prometheus never scraped sandboxd ($(tail -n3 "$work/prometheus.log"))"; fi

out=$("$work/check" dashboard deploy/grafana/dashboards/sandboxd.json "$api/metrics" "$prom" 2>&1); echo "$out" | grep -v ' passed, '; counts "$out"

destroy_sandbox
echo "$pass passed, $fail failed"
((fail == 0 && pass > 0))
