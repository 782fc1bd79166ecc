#!/bin/bash
# bench/remote: `vmctl exec A true` through `--host ssh://` against the same exec local, and an
# MCP `exec` tool call in one `vmctl mcp` session against a local `vmctl exec`; medians of N runs,
# as ratios measured in the same run.
#
# Usage: bench/remote.sh [N]   (as root, after `meson setup build && ninja -C build`; N = 15)
# Uses an existing hostd when $VMCTL_SOCKET answers and $BENCH_AGENT names a running agent;
# otherwise starts its own hostd in a temp state dir and boots an agent (about a minute). The
# remote is this host, reached through a throwaway sshd on 127.0.0.1 (as remote-check.sh does):
# what the ratio shows is ssh's connection and `vmctl bridge`, not a network.
set -euo pipefail
cd "$(dirname "$0")/.."
N=${1:-15}
VMCTL=$(realpath "${VMCTL:-./build/vmctl/vmctl}")
HOSTD=${HOSTD:-./build/hostd/hostd}
OWN=
S=
T=$(mktemp -d -t vmb-remote.XXXXXX)
chmod 755 "$T"
# shellcheck source=../tests/integration/loopback-sshd.sh
. tests/integration/loopback-sshd.sh

cleanup() {
  loopback_sshd_stop
  if [ -n "$OWN" ]; then
    "$VMCTL" rm --force bench >/dev/null 2>&1 || true
    kill "$OWN"; wait "$OWN" 2>/dev/null || true
    rm -rf "$S"
  fi
  rm -rf "$T"
}
trap cleanup EXIT

if [ -n "${BENCH_AGENT:-}" ] && "$VMCTL" info "$BENCH_AGENT" >/dev/null 2>&1; then
  A=$BENCH_AGENT
else
  S=$(mktemp -d -t vmb.XXXXXX); chmod 711 "$S"
  IMAGES=${VM_TEST_IMAGE_CACHE:-$S/images}
  printf '[hostd]\nimages-dir=%s\nssh-port-min=43300\nssh-port-max=43399\n' "$IMAGES" > "$S/hostd.conf"
  "$HOSTD" --config "$S/hostd.conf" --state-dir "$S" > "$S/hostd.log" 2>&1 &
  OWN=$!
  export VMCTL_SOCKET=$S/hostd.sock
  for _ in $(seq 1 100); do "$VMCTL" list >/dev/null 2>&1 && break; sleep 0.2; done
  "$VMCTL" template build debian-12 >/dev/null
  "$VMCTL" new bench >/dev/null
  A=bench
fi
SOCK=${VMCTL_SOCKET:-/var/lib/hostd/hostd.sock}
SOCK=$(realpath "$SOCK")

loopback_sshd_start "$T" "$VMCTL" || { sed 's/^/# /' "$T/sshd.log"; exit 1; }
URL="ssh://root@127.0.0.1:$SSHD_PORT$SOCK"

now() { date +%s%N; }
measure() { # measure COMMAND... -> prints N durations in us
  local t0 t1
  for _ in $(seq 1 "$N"); do
    t0=$(now); "$@" >/dev/null; t1=$(now)
    echo $(( (t1 - t0) / 1000 ))
  done
}
median() { sort -n | awk '{a[NR]=$1} END {m=(NR%2)?a[(NR+1)/2]:(a[NR/2]+a[NR/2+1])/2; printf "%.1f", m/1000}'; }

"$VMCTL" exec "$A" true  # warm hostd's pooled session, as a long-running hostd has it
local_ms=$(measure "$VMCTL" exec "$A" true | median)
remote_ms=$(measure "$VMCTL" --host "$URL" exec "$A" true | median)

# One MCP session, N exec calls: the time from each request written to its answer read.
mcp_ms=$(python3 - "$VMCTL" "$SOCK" "$A" "$N" <<'PY'
import json, subprocess, sys, time
vmctl, sock, agent, n = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
p = subprocess.Popen([vmctl, "--socket", sock, "mcp"], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                     text=True, bufsize=1)
def call(i, method, params):
    p.stdin.write(json.dumps({"jsonrpc": "2.0", "id": i, "method": method, "params": params}) + "\n")
    p.stdin.flush()
    while True:
        msg = json.loads(p.stdout.readline())
        if msg.get("id") == i:
            return msg
call(1, "initialize", {"protocolVersion": "2025-06-18", "capabilities": {},
                       "clientInfo": {"name": "bench-remote", "version": "1"}})
p.stdin.write(json.dumps({"jsonrpc": "2.0", "method": "notifications/initialized"}) + "\n")
times = []
for i in range(n):
    t0 = time.monotonic()
    r = call(100 + i, "tools/call", {"name": "exec", "arguments": {"name": agent, "command": ["true"]}})
    times.append((time.monotonic() - t0) * 1000)
    res = r.get("result", {})
    if res.get("isError") or res.get("structuredContent", {}).get("exit_status") != 0:
        sys.exit("mcp exec failed: %s" % json.dumps(r)[:300])
p.stdin.close()
p.wait()
times.sort()
m = times[n // 2] if n % 2 else (times[n // 2 - 1] + times[n // 2]) / 2
print("%.1f" % m)
PY
)

ratio() { awk -v a="$1" -v b="$2" 'BEGIN { printf "%.2f", a / b }'; }
echo "remote: N=$N agent=$A (medians, ms)"
echo "vmctl exec local:              $local_ms"
echo "vmctl --host ssh:// exec:      $remote_ms  ($(ratio "$remote_ms" "$local_ms")x local)"
echo "MCP exec call (one session):   $mcp_ms  ($(ratio "$mcp_ms" "$local_ms")x vmctl exec)"
