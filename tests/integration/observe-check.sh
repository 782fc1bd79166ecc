# shellcheck shell=bash
# Watching a real agent (docs/OBSERVE.md). Sourced, not run, after lib.sh (vmctl, check, ok,
# not_ok, skip, diag, start_hostd, stop_hostd, $S with hostd's metrics-listen at $S/metrics.sock
# as suite_init writes it); vm-suite.sh calls it on its shared agent:
#
#   observe_check AGENT   its console shows the boot (a cold boot's) and what the guest writes
#                         to it, escaped; --lines; --cloud-init shows cloud-init's final line;
#                         stats --json against /proc (QEMU's VmRSS, its CPU time) and libvirt
#                         (virsh through the embedded URI, while hostd is stopped: the embedded
#                         driver is one process's at a time; agents run on); a CPU burn in the
#                         guest raises its CPU %; info's memory figures (QEMU's RSS, the
#                         balloon); an exec counted; the metrics endpoint fetched
#                         with curl and read by Debian's prometheus_client parser
#
# It leaves the agent as it found it (running, no process of its own left) and hostd running.

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

# The CPU time of process $1 (all its threads), in ns, from /proc/$1/stat.
observe_proc_cpu_ns() {
  awk -v hz="$(getconf CLK_TCK)" '{ sub(/^.*\) /, ""); printf "%.0f\n", ($12 + $13) * 1000000000 / hz }' \
    "/proc/$1/stat"
}

observe_check() {
  local a=$1 out rc pid idle busy before after marker
  out=$(vmctl logs "$a" 2>&1); rc=$?
  if grep -q '^warm-base=' "$S/agents/$a/agent.ini" 2>/dev/null; then
    skip "logs $a shows the guest's boot" "$a was restored from a warm image: no boot on its console"
  else
    check "logs $a shows the guest's boot (kernel and systemd)" \
      bash -c '[ "$1" = 0 ] && grep -q "Linux version" <<< "$2" && grep -qE "systemd|login:" <<< "$2"' \
      _ "$rc" "$out" || diag "$(head -n 5 <<< "$out")"
  fi
  # What a hostile guest prints on its console reaches the user escaped: a screen clear, a title,
  # a bell, invalid UTF-8, a right-to-left override.
  marker="obs-$RANDOM"
  vmctl exec "$a" -- sudo -n sh -c "printf '$marker \\033[2J\\033]0;pwned\\007 \\377 \\342\\200\\256 end\\r\\n' > /dev/ttyS0"
  sleep 2
  # Counted as sent, by awk: an empty last line too (which $(...) would drop), and a last line
  # the guest has not ended yet ("a1 login: "), which comes without its newline.
  lines=$(vmctl logs -n 3 "$a" | awk 'END { print NR }')
  # At most 3, and some: an agent restored from the warm image has a console of its own that
  # holds only what its guest wrote since the restore, which may be fewer than 3 lines.
  check "logs -n 3 $a: at most 3 lines, and not none ($lines)" \
    bash -c '[ "$1" -ge 1 ] && [ "$1" -le 3 ]' _ "$lines" || diag "$(vmctl logs -n 3 "$a" | cat -A)"
  # Found anywhere, not only last: a guest still booting goes on writing to its console.
  out=$(vmctl logs "$a")
  check "logs $a: the guest's escape sequences shown escaped" \
    grep -qF "$marker \\x1b[2J\\x1b]0;pwned\\x07 \\xff \\u202e end" <<< "$out" ||
    diag "$(grep -F "$marker" <<< "$out")"
  check "logs $a shows no control byte but newlines" \
    bash -c '! LC_ALL=C grep -q "[[:cntrl:]]" <<< "$1"' _ "$(tr -d '\n' <<< "$out")"
  out=$(vmctl logs --cloud-init "$a" 2>&1); rc=$?
  check "logs --cloud-init $a shows cloud-init's final line" \
    bash -c '[ "$1" = 0 ] && grep -qE "^Cloud-init v\. .* finished at " <<< "$2"' _ "$rc" "$out" ||
    diag "$(tail -n 5 <<< "$out")"

  # Figures against /proc, read around them.
  pid=$(cat "$S/libvirt/run/qemu/$a.pid" 2>/dev/null)
  local cpu_before cpu_after rss
  cpu_before=$(observe_proc_cpu_ns "$pid")
  out=$(vmctl stats --json "$a"); rc=$?
  cpu_after=$(observe_proc_cpu_ns "$pid")
  rss=$(awk '/^VmRSS:/ { printf "%.0f\n", $2 * 1024 }' "/proc/$pid/status" 2>/dev/null)
  check "stats --json $a: QEMU's pid and RSS (within 10% of /proc/$pid/status), CPU time (/proc/$pid/stat)" \
    "$OBSERVE_PY" -c '
import json, sys
a = json.loads(sys.argv[1])[0]
rss, pid, lo, hi = int(sys.argv[2]), int(sys.argv[3]), float(sys.argv[4]), float(sys.argv[5])
assert a["qemu_pid"] == pid, (a["qemu_pid"], pid)
assert abs(a["qemu_rss_bytes"] - rss) <= rss / 10, (a["qemu_rss_bytes"], rss)
# The vCPUs are most of what QEMU runs; libvirt may count its cgroup rather than the process.
assert 0.5 * lo <= a["cpu_time_ns"] <= 1.1 * hi + 1e8, (lo, a["cpu_time_ns"], hi)
assert a["state"] == "running" and a["vcpus"] == 2 and a["memory_bytes"] == 1024 << 20, a
assert a["disk_allocated_bytes"] > 0 and "execs" in a and "egress_bytes_up" in a, a
' "$out" "${rss:-0}" "${pid:-0}" "${cpu_before:-0}" "${cpu_after:-0}" ||
    diag "$out rss=$rss pid=$pid cpu=$cpu_before..$cpu_after"

  # What its memory costs the host, in info: QEMU's RSS and the balloon's size (1 GiB given; the
  # guest has it all unless something inflated the balloon), as text in human units too.
  out=$(vmctl info --json "$a"); rc=$?
  check "info --json $a: a positive QEMU RSS and the balloon's size" \
    "$OBSERVE_PY" -c '
import json, sys
a = json.loads(sys.argv[1])
assert a["qemu_rss_bytes"] > 0 and a["qemu_pid"] == int(sys.argv[2]), a
assert 0 < a["balloon_actual_bytes"] <= 1024 << 20, a
' "$out" "${pid:-0}" || diag "info rc=$rc: $out"
  out=$(vmctl info "$a")
  check "info $a: QEMU RSS and balloon in human units" \
    bash -c 'grep -qE "^qemu rss: +[0-9.]+ (MiB|GiB)$" <<< "$1" && grep -qE "^balloon: +[0-9.]+ (MiB|GiB)$" <<< "$1"' \
    _ "$out" || diag "$out"

  # A CPU burn on both vCPUs: its figure rises (by how much depends on the host's load).
  observe_figure "$a" cpu_percent >/dev/null
  sleep 3
  idle=$(observe_figure "$a" cpu_percent)
  vmctl exec "$a" -- sh -c 'for i in 1 2; do timeout 15 sh -c "while :; do :; done" >/dev/null 2>&1 & done'
  sleep 3
  observe_figure "$a" cpu_percent >/dev/null
  sleep 4
  busy=$(observe_figure "$a" cpu_percent)
  check "a CPU burn in $a raises its CPU % ($idle% before, $busy% during)" \
    "$OBSERVE_PY" -c '
import sys
idle, busy = float(sys.argv[1] or 0), float(sys.argv[2] or 0)
assert busy >= idle + 3 and busy >= 1.5 * idle' "$idle" "$busy"
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

  # libvirt's own figures: virsh on the embedded driver, which only one process may hold, so
  # with hostd stopped (the agent runs on); the guest's memory as its balloon reports it (asked
  # for by the first stats) and the disk's size do not move, the CPU time only grows.
  sleep 3
  out=$(vmctl stats --json "$a")
  stop_hostd
  local virsh_cpu avail capacity
  virsh_cpu=$(virsh -r -c "qemu:///embed?root=$S/libvirt" domstats --cpu-total "$a" 2>/dev/null |
    sed -n 's/^ *cpu.time=//p')
  avail=$(virsh -r -c "qemu:///embed?root=$S/libvirt" dommemstat "$a" 2>/dev/null |
    awk '$1 == "available" { printf "%.0f\n", $2 * 1024 }')
  capacity=$(virsh -r -c "qemu:///embed?root=$S/libvirt" domblkinfo "$a" vda 2>/dev/null |
    awk '/^Capacity:/ { print $2 }')
  check "hostd comes back after the libvirt reads" start_hostd
  check "stats --json $a against libvirt: CPU time, the guest's memory, the disk's size" \
    "$OBSERVE_PY" -c '
import json, sys
a = json.loads(sys.argv[1])[0]
cpu, avail, cap = int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
assert 0 < a["cpu_time_ns"] <= cpu, (a["cpu_time_ns"], cpu)
assert a["memory_available_bytes"] == avail, (a.get("memory_available_bytes"), avail)
assert 0 < a["memory_used_bytes"] < avail, a
assert a["disk_capacity_bytes"] == cap, (a["disk_capacity_bytes"], cap)
' "$out" "${virsh_cpu:-0}" "${avail:-0}" "${capacity:-0}" ||
    diag "virsh: cpu.time=$virsh_cpu available=$avail capacity=$capacity; stats: $out"
}
