# shellcheck shell=bash
# Watching a real agent (docs/OBSERVE.md). Sourced, not run, after lib.sh (vmctl, check, ok,
# not_ok, diag, $S with hostd's metrics-listen at $S/metrics.sock as suite_init writes it);
# vm-suite.sh calls it on its shared agent:
#
#   observe_check AGENT   its console shows the boot, escaped; --cloud-init shows cloud-init's
#                         final line; stats --json against /proc (QEMU's VmRSS) and libvirt
#                         (virsh domstats through the embedded URI); a CPU burn in the guest
#                         raises its CPU %; an exec counted; the metrics endpoint fetched with
#                         curl and read by Debian's prometheus_client parser
#
# It leaves the agent as it found it (running, no process of its own left).

# Debian's Python, which has python3-prometheus-client, whatever python3 is first on PATH.
OBSERVE_PY=$(command -v /usr/bin/python3 || command -v python3)

# The figure $2 of agent $1 in `vmctl stats --json`, or "" when it has none.
observe_figure() {
  vmctl stats --json "$1" | "$OBSERVE_PY" -c '
import json, sys
a = json.load(sys.stdin)[0]
v = a.get(sys.argv[1])
print("" if v is None else v)' "$2"
}

# virsh on hostd's embedded driver, read-only.
observe_virsh() {
  virsh -r -c "qemu:///embed?root=$S/libvirt" "$@"
}

observe_check() {
  local a=$1 out rc pid idle busy before after
  out=$(vmctl logs "$a" 2>&1); rc=$?
  check "logs $a shows the guest's boot (kernel and systemd)" \
    bash -c '[ "$1" = 0 ] && grep -q "Linux version" <<< "$2" && grep -qE "systemd|login:" <<< "$2"' \
    _ "$rc" "$out"
  check "logs $a shows no control byte but newlines (escaped)" \
    bash -c '! LC_ALL=C grep -q "[[:cntrl:]]" <<< "$1"' _ "$(tr -d '\n' <<< "$out")"
  out=$(vmctl logs -n 3 "$a"); rc=$?
  check "logs -n 3 shows the last 3 lines" test "$rc" = 0 -a "$(wc -l <<< "$out")" = 3
  out=$(vmctl logs --cloud-init "$a" 2>&1); rc=$?
  check "logs --cloud-init $a shows cloud-init's final line" \
    bash -c '[ "$1" = 0 ] && grep -qE "^Cloud-init v\. .* finished at " <<< "$2"' _ "$rc" "$out" ||
    diag "$(tail -n 5 <<< "$out")"

  # Figures against /proc and libvirt, read around them.
  pid=$(cat "$S/libvirt/run/qemu/$a.pid" 2>/dev/null)
  local cpu_before cpu_after
  cpu_before=$(observe_virsh domstats --cpu-total "$a" 2>/dev/null | sed -n 's/^ *cpu.time=//p')
  out=$(vmctl stats --json "$a"); rc=$?
  cpu_after=$(observe_virsh domstats --cpu-total "$a" 2>/dev/null | sed -n 's/^ *cpu.time=//p')
  local rss capacity
  rss=$(awk '/^VmRSS:/ { print $2 * 1024 }' "/proc/$pid/status" 2>/dev/null)
  capacity=$(observe_virsh domblkinfo "$a" vda 2>/dev/null | awk '/^Capacity:/ { print $2 }')
  check "stats --json $a: QEMU's RSS within 10% of /proc/$pid/status, its pid libvirt's" \
    "$OBSERVE_PY" -c '
import json, sys
a = json.loads(sys.argv[1])[0]
rss, pid = int(sys.argv[2]), int(sys.argv[3])
assert a["qemu_pid"] == pid, (a["qemu_pid"], pid)
assert abs(a["qemu_rss_bytes"] - rss) <= rss / 10, (a["qemu_rss_bytes"], rss)
assert a["state"] == "running" and a["vcpus"] == 2 and a["memory_bytes"] == 1024 << 20, a
assert a["disk_allocated_bytes"] > 0 and "execs" in a and "egress_bytes_up" in a, a
' "$out" "${rss:-0}" "${pid:-0}" || diag "$out rss=$rss pid=$pid"
  check "stats --json $a: CPU time between libvirt's before and after, disk size libvirt's" \
    "$OBSERVE_PY" -c '
import json, sys
a = json.loads(sys.argv[1])[0]
lo, hi, cap = int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
assert lo <= a["cpu_time_ns"] <= hi, (lo, a["cpu_time_ns"], hi)
assert a["disk_capacity_bytes"] == cap, (a["disk_capacity_bytes"], cap)
' "$out" "${cpu_before:-0}" "${cpu_after:-0}" "${capacity:-0}" ||
    diag "cpu.time $cpu_before..$cpu_after capacity $capacity: $out"
  # The balloon reports once asked (by the first stats): a few seconds later.
  sleep 5
  out=$(vmctl stats --json "$a")
  local avail
  avail=$(observe_virsh dommemstat "$a" 2>/dev/null | awk '$1 == "available" { print $2 * 1024 }')
  check "stats --json $a: the guest's memory as its balloon reports it (libvirt: $avail)" \
    "$OBSERVE_PY" -c '
import json, sys
a = json.loads(sys.argv[1])[0]
avail = int(sys.argv[2])
assert a["memory_available_bytes"] == avail, (a.get("memory_available_bytes"), avail)
assert 0 < a["memory_used_bytes"] < avail, a
' "$out" "${avail:-0}" || diag "$out"

  # A CPU burn in the guest: its figure rises.
  idle=$(observe_figure "$a" cpu_percent)
  sleep 2
  idle=$(observe_figure "$a" cpu_percent)
  vmctl exec "$a" -- sh -c 'timeout 12 sh -c "while :; do :; done" >/dev/null 2>&1 &'
  sleep 4
  observe_figure "$a" cpu_percent >/dev/null
  sleep 3
  busy=$(observe_figure "$a" cpu_percent)
  check "a CPU burn in $a raises its CPU % ($idle% idle, $busy% busy)" \
    "$OBSERVE_PY" -c 'import sys; assert float(sys.argv[2]) >= float(sys.argv[1]) + 40' \
    "${idle:-0}" "${busy:-0}"
  vmctl exec "$a" -- sh -c 'pkill -f "while :; do :; done"; true' >/dev/null 2>&1

  before=$(observe_figure "$a" execs)
  vmctl exec "$a" -- true
  after=$(observe_figure "$a" execs)
  check "an exec in $a is counted ($before, then $after)" test "$after" = "$((before + 1))"

  # The endpoint, as Prometheus would scrape it.
  out=$(curl -sf --unix-socket "$S/metrics.sock" http://localhost/metrics); rc=$?
  check "the metrics endpoint serves $a's figures, read by prometheus_client" \
    "$OBSERVE_PY" -c '
import sys
from prometheus_client.parser import text_string_to_metric_families
agent = sys.argv[2]
seen = {}
for fam in text_string_to_metric_families(sys.argv[1]):
    for s in fam.samples:
        seen[(s.name, tuple(sorted(s.labels.items())))] = s.value
assert seen[("hostd_agent_info", (("agent", agent), ("state", "running")))] == 1
assert seen[("hostd_agent_qemu_rss_bytes", (("agent", agent),))] > 0
assert seen[("hostd_agent_cpu_seconds_total", (("agent", agent),))] > 0
assert seen[("hostd_agents", (("state", "running"),))] >= 1
assert seen[("hostd_request_duration_seconds_count", (("request", "agent-stats"),))] >= 1
assert seen[("hostd_uptime_seconds", ())] > 0
' "$out" "$a" || diag "curl $rc: $(head -c 2000 <<< "$out")"
}
