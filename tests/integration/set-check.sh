# shellcheck shell=bash
# vmctl set on a real agent; sourced, not run. Defines set_check, which a VM suite calls after
# sourcing lib.sh and starting hostd, with a running debian-12 agent (2 CPUs) whose user may sudo:
#
#   # shellcheck source=set-check.sh
#   . "$(dirname "$0")/set-check.sh"
#   set_check a2
#
# --disk +1G on the running agent: the root filesystem inside grows at once (df). --cpus 1 and
# --memory +256M on it: said to come at the next start, and after vmctl stop and vmctl start the
# guest has them (nproc, MemTotal). --disk +1G on the stopped agent: its filesystem has grown when
# it has started again. TAP through lib.sh's check and diag. Boots the agent once more and leaves
# it running, with one CPU fewer, 256 MiB and 2 GiB more.

# _set_root_bytes AGENT: the size of the guest's root filesystem in bytes.
_set_root_bytes() {
  vmctl exec "$1" -- df -B1 --output=size / 2>/dev/null | tail -n 1 | tr -d ' '
}

# _set_memtotal AGENT: MemTotal of the guest, in kB.
_set_memtotal() {
  vmctl exec "$1" -- cat /proc/meminfo 2>/dev/null | sed -n 's/^MemTotal: *\([0-9]*\) kB$/\1/p'
}

# _set_says TEXT PART...: TEXT holds every PART.
_set_says() {
  local text=$1 part
  shift
  for part in "$@"; do [[ $text == *"$part"* ]] || return 1; done
}

set_check() {
  local agent=$1 before after out mem_before mem_after t0
  local gib=$((1024 * 1024 * 1024))

  before=$(_set_root_bytes "$agent")
  t0=$(date +%s%N)
  out=$(vmctl set "$agent" --disk +1G 2>&1)
  diag "figure: vmctl set --disk +1G on a running agent took $((($(date +%s%N) - t0) / 1000000)) ms"
  after=$(_set_root_bytes "$agent")
  check "set --disk +1G on running $agent says it grew live, filesystem too ($out)" \
    _set_says "$out" "$agent: disk 9G: grown live, its root filesystem too"
  # ext4's own metadata takes a little of the new GiB.
  check "set --disk +1G: df inside shows the root filesystem grown ($before -> $after bytes)" \
    test "$((after - before))" -gt "$((gib * 9 / 10))" -a "$((after - before))" -le "$gib"

  mem_before=$(_set_memtotal "$agent")
  out=$(vmctl set "$agent" --cpus 1 --memory +256M 2>&1)
  check "set --cpus 1 --memory +256M on running $agent: at the next start, said ($out)" \
    _set_says "$out" "cpus 1: at the next start (vmctl stop $agent, then vmctl start $agent)" \
      "memory 1280M: at the next start"
  check "... and not yet in the running guest" test "$(vmctl exec "$agent" -- nproc)" = 2
  vmctl stop "$agent" >/dev/null 2>&1
  before=$after
  out=$(vmctl set "$agent" --disk +1G 2>&1)
  check "set --disk +1G on stopped $agent: its filesystem grows at its next start ($out)" \
    _set_says "$out" "disk 10G: grown; its root filesystem grows when the agent next starts"
  vmctl start "$agent" >/dev/null 2>&1
  wait_ssh "$agent" 600
  check "after stop and start $agent has 1 CPU (nproc)" test "$(vmctl exec "$agent" -- nproc)" = 1
  mem_after=$(_set_memtotal "$agent")
  check "after stop and start $agent has 256 MiB more (MemTotal $mem_before -> $mem_after kB)" \
    test "$((mem_after - mem_before))" -gt 250000 -a "$((mem_after - mem_before))" -le 262144
  after=$(_set_root_bytes "$agent")
  check "after the start the root filesystem has grown by the stopped agent's GiB ($before -> $after)" \
    test "$((after - before))" -gt "$((gib * 9 / 10))" -a "$((after - before))" -le "$gib"
  out=$(vmctl --json info "$agent" 2>/dev/null | python3 -c '
import json, sys
a = json.load(sys.stdin)
print(a["cpus"], a["memory_mib"], a["disk_gib"])' 2>/dev/null)
  check "info says 1 CPU, 1280 MiB, 10 GiB ($out)" test "$out" = "1 1280 10"
}
