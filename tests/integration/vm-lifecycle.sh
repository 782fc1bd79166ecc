#!/bin/bash
# The lifecycle suite: two real agents (TCG) under one hostd, and what happens when their QEMU
# dies, when the guest powers off or reboots, when hostd and every QEMU are killed (a host that
# lost power), and when hostd stops with shutdown = save (a planned host reboot); then vmctl mcp
# through the official SDK client, vmctl set on the second agent (set-check.sh), and the users'
# own SSH keys on a third agent (authorize-check.sh). Output is TAP, with the figures as
# diagnostics. Needs root, HOSTD/VMCTL set; the debian-12 image is built into the suite's state
# dir, or taken from $VM_TEST_IMAGE_CACHE.
set -uo pipefail

: "${HOSTD:?}" "${VMCTL:?}"
# shellcheck source=lib.sh
. "$(dirname "$0")/lib.sh"
# shellcheck source=authorize-check.sh
. "$(dirname "$0")/authorize-check.sh"
# shellcheck source=forward-check.sh
. "$(dirname "$0")/forward-check.sh"
# shellcheck source=console-check.sh
. "$(dirname "$0")/console-check.sh"
# shellcheck source=set-check.sh
. "$(dirname "$0")/set-check.sh"
suite_init vml 43300 43389
# As under the service: SIGTERM saves the running agents.
echo "shutdown = save" >> "$CONF"

cleanup() {
  if [ -n "$HOSTD_PID" ] && kill -0 "$HOSTD_PID" 2>/dev/null; then
    for a in a1 a2 a3 r1; do vmctl rm --force "$a" >/dev/null 2>&1; done
    kill -9 "$HOSTD_PID" 2>/dev/null
    wait "$HOSTD_PID" 2>/dev/null
  fi
  destroy_leftover_domains
  if [ "$FAILED" -ne 0 ] || [ "$N" -eq 0 ]; then
    diag_err "hostd log:"; diag_err "$(tail -n 60 "$LOG" 2>/dev/null)"
  fi
  rm -rf "$S"
}
trap cleanup EXIT

boot_id() { vmctl exec "$1" -- cat /proc/sys/kernel/random/boot_id 2>/dev/null; }
state_of() { vmctl --json info "$1" 2>/dev/null | python3 -c 'import json,sys; print(json.load(sys.stdin)["state"])' 2>/dev/null; }
field_of() { vmctl --json info "$1" 2>/dev/null | python3 -c "import json,sys; print(json.load(sys.stdin).get('$2', ''))" 2>/dev/null; }
now_ms() { date +%s%3N; }

# wait_state AGENT STATE SECONDS: polls every 0.2 s; prints the milliseconds it took.
wait_state() {
  local start; start=$(now_ms)
  local deadline=$(( start + $3 * 1000 ))
  while [ "$(now_ms)" -lt "$deadline" ]; do
    if [ "$(state_of "$1")" = "$2" ]; then
      echo $(( $(now_ms) - start ))
      return 0
    fi
    sleep 0.2
  done
  return 1
}

# The PID of AGENT's QEMU, from the pid file the embedded driver keeps for it.
qemu_pid() {
  local f
  f=$(find "$S/libvirt" -name "$1.pid" 2>/dev/null | head -n 1)
  [ -n "$f" ] && cat "$f"
}

# Kills AGENT's QEMU with SIGKILL once it runs (its pid file names a live QEMU of that guest);
# fails when there is none within 10 s.
kill_qemu() {
  local pid
  for _ in $(seq 1 50); do
    pid=$(qemu_pid "$1")
    if [ -n "$pid" ] && tr '\0' ' ' < "/proc/$pid/cmdline" 2>/dev/null | grep -q "guest=$1"; then
      kill -9 "$pid" && return 0
    fi
    sleep 0.2
  done
  return 1
}

events_of() { python3 - "$S/events.log" "$1" "$2" <<'PY'
import json, sys
path, agent, event = sys.argv[1:]
n = 0
for line in open(path):
    e = json.loads(line)
    if e.get("agent") == agent and e.get("event") == event:
        n += 1
print(n)
PY
}

# wait_event AGENT EVENT COUNT SECONDS: until the event log holds COUNT such events; prints the
# milliseconds since $T0.
wait_event() {
  local deadline=$(( $(now_ms) + $4 * 1000 ))
  while [ "$(now_ms)" -lt "$deadline" ]; do
    if [ "$(events_of "$1" "$2")" -ge "$3" ]; then echo $(( $(now_ms) - T0 )); return 0; fi
    sleep 0.1
  done
  return 1
}

# A background counter in AGENT's guest, one increment a second, in ~/counter.
start_counter() {
  vmctl exec "$1" -- sh -c 'nohup sh -c "i=0; while :; do i=\$((i+1)); echo \$i > ~/counter; sleep 1; done" >/dev/null 2>&1 & echo $! > ~/counter.pid'
}
counter() { vmctl exec "$1" -- cat counter 2>/dev/null; }

echo "TAP version 13"
start_hostd || { not_ok "hostd starts"; exit 1; }
ok "hostd starts"

# --- two agents -------------------------------------------------------------------------------
vmctl -q new a1 > "$S/new-a1.out" 2>&1 &
NEW1=$!
vmctl -q new a2 > "$S/new-a2.out" 2>&1 &
NEW2=$!
wait $NEW1; R1=$?
wait $NEW2; R2=$?
check "two agents boot" test "$R1$R2" = 00
[ "$R1$R2" = 00 ] || { diag "$(cat "$S"/new-a*.out)"; exit 1; }
check "a new agent is wanted running, restart on-crash" \
  test "$(field_of a1 wanted) $(field_of a1 restart)" = "running on-crash"

# --- QEMU killed: restarted ---------------------------------------------------------------------
vmctl exec a1 -- sh -c 'echo precious > ~/kept.txt; sync'
BOOT1=$(boot_id a1)
"$VMCTL" --socket "$SOCK" events a1 --follow --json -n 0 > "$S/follow.out" 2>&1 &
FOLLOW=$!
sleep 1
T0=$(now_ms)
kill_qemu a1
check "a1's QEMU is killed" test $? = 0
# Right after the kill libvirt may still say running: wait for the crash to be seen first.
if SEEN=$(wait_event a1 crashed 1 30) && UP=$(wait_event a1 restarted 1 30) &&
  wait_state a1 running 30 >/dev/null; then
  ok "a1 is running again within 30 s of kill -9 of its QEMU"
  # hostd's own times, from the event log (the polling above only bounds them).
  diag "figure: $(python3 - "$S/events.log" "$T0" <<'PY'
import datetime, json, sys
t0 = int(sys.argv[2])
at = {}
for line in open(sys.argv[1]):
    e = json.loads(line)
    if e.get("agent") == "a1" and e.get("event") in ("crashed", "restarted") and e["event"] not in at:
        t = datetime.datetime.fromisoformat(e["time"].replace("Z", "+00:00")).timestamp()
        at[e["event"]] = int(t * 1000) - t0
print("hostd saw the crash %d ms after the kill and had a1 booting again %d ms after it"
      % (at["crashed"], at["restarted"]))
PY
)"
else
  not_ok "a1 is running again within 30 s of kill -9 of its QEMU"
fi
check "the crash and the restart are in the event log" \
  test "$(events_of a1 crashed) $(events_of a1 restarted)" = "1 1"
sleep 1
kill "$FOLLOW" 2>/dev/null; wait "$FOLLOW" 2>/dev/null
check "vmctl events --follow saw the crash and the restart as they happened" \
  bash -c "grep -q '\"event\":\"crashed\"' '$S/follow.out' && grep -q '\"event\":\"restarted\"' '$S/follow.out'"
check "hostd's log says why" grep -q "a1.*without a shutdown" "$LOG"
check "info counts the crash" test "$(field_of a1 crashes)" = 1

# --- crashed again and again: given up past the limit, then vmctl start ------------------------
for i in 2 3 4; do
  wait_state a1 running 30 >/dev/null || break
  kill_qemu a1 || break
  for _ in $(seq 1 50); do
    [ "$(events_of a1 crashed)" -ge "$i" ] && break
    sleep 0.2
  done
done
diag "$(grep '"crashed"' "$S/events.log" | tail -n 1)"
if T=$(wait_state a1 crashed 30); then ok "after 4 crashes within the window a1 is crashed"; else not_ok "after 4 crashes within the window a1 is crashed"; fi
sleep 6
check "a crashed agent is not restarted" test "$(state_of a1)" = crashed
check "info says why it is crashed" bash -c "'$VMCTL' --socket '$SOCK' info a1 | grep -q 'crash reason:.*4 crashes within'"
check "list shows it crashed" bash -c "'$VMCTL' --socket '$SOCK' list | grep -q 'a1.*crashed'"
vmctl -q start --no-wait a1 >/dev/null
check "vmctl start clears crashed" test "$(state_of a1) $(field_of a1 crashes)" = "running 0"
check "the start is in the event log with the caller's uid" \
  bash -c "'$VMCTL' --socket '$SOCK' events a1 --json -n 1 | grep -q '\"event\":\"agent-start\".*\"uid\":$(id -u)'"

# --- poweroff from inside: stopped, not restarted ----------------------------------------------
timeout 20 "$VMCTL" --socket "$SOCK" exec a2 -- sudo systemctl poweroff >/dev/null 2>&1
if T=$(wait_state a2 stopped 120); then ok "poweroff inside a2: it stops"; else not_ok "poweroff inside a2: it stops"; fi
sleep 7
check "poweroff inside a2: it stays stopped, wanted stopped" \
  test "$(state_of a2) $(field_of a2 wanted)" = "stopped stopped"
check "the poweroff is in the event log" test "$(events_of a2 poweroff)" = 1
vmctl -q start --no-wait a2 >/dev/null
START=$(date +%s)
wait_ssh a1 300
diag "figure: a1 answers on SSH $(( $(date +%s) - START )) s after its start (a TCG boot, two guests booting)"
wait_ssh a2 300
# Five crashes later (SIGKILL each time, mid-boot too), the disk holds what was synced.
check "after its crashes a1 booted anew (new boot id)" test "$(boot_id a1)" != "$BOOT1"
check "after its crashes a1 has its files" test "$(vmctl exec a1 -- cat kept.txt)" = precious

# --- reboot from inside: a reboot ---------------------------------------------------------------
BOOT1=$(boot_id a1)
timeout 20 "$VMCTL" --socket "$SOCK" exec a1 -- sudo systemctl reboot >/dev/null 2>&1
sleep 10
wait_ssh a1 300
check "reboot inside a1: it runs again with a new boot id" \
  test "$(state_of a1)" = running -a "$(boot_id a1)" != "$BOOT1"
check "the reboot is in the event log, no crash" test "$(events_of a1 reboot) $(field_of a1 crashes)" = "1 0"

# --- planned shutdown: SIGTERM with shutdown = save; processes survive ---------------------------
start_counter a1
start_counter a2
sleep 3
B1=$(boot_id a1); B2=$(boot_id a2)
C1=$(counter a1); C2=$(counter a2)
START=$(now_ms)
stop_hostd
diag "figure: hostd saved 2 running agents and exited in $(( $(now_ms) - START )) ms"
diag "$(grep 'saved .* running agents in' "$LOG" | tail -n 1)"
check "SIGTERM with shutdown = save saved both agents" grep -q "saved 2 of 2 running agents" "$LOG"
start_hostd
check "after the restart both are saved (shutdown-resume lazy)" \
  test "$(state_of a1) $(state_of a2)" = "saved saved"
START=$(now_ms)
check "a saved agent wakes on exec with the same boot id" test "$(boot_id a1)" = "$B1"
diag "figure: first exec into a1 after the shutdown took $(( $(now_ms) - START )) ms (restore included)"
check "a2 wakes on SSH with the same boot id" test "$(boot_id a2)" = "$B2"
sleep 2
N1=$(counter a1); N2=$(counter a2)
check "the counters went on from where they were (a1 $C1 -> $N1, a2 $C2 -> $N2)" \
  test "$N1" -ge "$C1" -a "$N1" -lt $(( C1 + 60 )) -a "$N2" -ge "$C2" -a "$N2" -lt $(( C2 + 60 ))
sleep 2
check "the counters still count" test "$(counter a1)" -gt "$N1"

echo "shutdown-resume = eager" >> "$CONF"
stop_hostd
START=$(now_ms)
start_hostd
diag "figure: hostd started and resumed 2 agents in $(( $(now_ms) - START )) ms (shutdown-resume = eager)"
check "with shutdown-resume = eager both run at once after the restart" \
  test "$(state_of a1) $(state_of a2)" = "running running"
check "... with the same boot ids" test "$(boot_id a1) $(boot_id a2)" = "$B1 $B2"

# --- host lost power: hostd and every QEMU killed ------------------------------------------------
sed -i '/^shutdown-resume/d' "$CONF"
# Host maintenance without stopping hostd: every running agent saved; a1 woken again after.
vmctl stop-host-agents > "$S/stop-host-agents.out" 2>&1
check "stop-host-agents saves both running agents" \
  bash -c "grep -q '2 of 2 running agents saved' '$S/stop-host-agents.out' && test \"\$('$VMCTL' --socket '$SOCK' list | grep -c saved)\" = 2"
diag "figure: $(tail -n 1 "$S/stop-host-agents.out")"
vmctl resume a1 >/dev/null
P1=$(qemu_pid a1)
kill -9 "$HOSTD_PID"; wait "$HOSTD_PID" 2>/dev/null; HOSTD_PID=
[ -n "$P1" ] && kill -9 "$P1"
sleep 1
clean=1
for disk in "$S"/agents/*/*.qcow2; do
  out=$(qemu-img check -U "$disk" 2>&1); rc=$?
  if [ $rc -ne 0 ] && [ $rc -ne 3 ]; then clean=0; diag "$disk: $out"; fi
done
check "every qcow2 is consistent after the power loss (qemu-img check)" test $clean = 1
start_hostd
check "hostd says a1's RAM is lost" grep -q "a1.*what was in its RAM is lost" "$LOG"
if wait_state a1 running 30 >/dev/null; then ok "a running agent boots again when hostd starts"; else not_ok "a running agent boots again when hostd starts"; fi
check "a saved agent stays saved" test "$(state_of a2)" = saved
wait_ssh a1 300
check "a1 booted anew" test "$(boot_id a1)" != "$B1"
check "a2 wakes on exec with its processes" test "$(boot_id a2)" = "$B2"

# --- vmctl mcp driven by the official MCP SDK client, on a real agent --------------------------
VMCTL="$VMCTL" HOSTD_SOCKET="$SOCK" MCP_AGENT=a1 "$(dirname "$0")/mcp-check.sh" > "$S/mcp.out" 2>&1
rc=$?
check "vmctl mcp with the official SDK client on a1: $(grep -c '^ok' "$S/mcp.out") checks pass" \
  bash -c "[ $rc = 0 ] && ! grep -q '^not ok' '$S/mcp.out'"
[ $rc = 0 ] || diag "$(tail -n 20 "$S/mcp.out")"

# --- 100 vmctl exec at once on one agent: each its own output and status ---------------------
mkdir "$S/many"
t0=$(date +%s%N)
seq 0 99 | xargs -P 100 -I{} sh -c '"$1" --socket "$2" exec a1 -- sh -c "echo run-{}; exit \$(({} % 7))" > "$3/{}.out" 2>&1; echo $? > "$3/{}.rc"' _ "$VMCTL" "$SOCK" "$S/many"
MANY_MS=$(( ($(date +%s%N) - t0) / 1000000 ))
bad=0
for i in $(seq 0 99); do
  if [ "$(cat "$S/many/$i.out")" != "run-$i" ] || [ "$(cat "$S/many/$i.rc")" != $((i % 7)) ]; then
    bad=$((bad + 1)); [ $bad -le 3 ] && diag "exec $i: status $(cat "$S/many/$i.rc"): $(head -c 300 "$S/many/$i.out")"
  fi
done
check "100 concurrent vmctl exec on a1: each its own output and status (${MANY_MS} ms in all)" test $bad = 0

# --- the serial console's cap: a1 floods its console, the host keeps at most two capped files
console_check a1

# --- vmctl forward: a web server in a1 through the forward, running, paused, saved, restarts
forward_check a1

# --- vmctl --host ssh:// through a real sshd on 127.0.0.1 -------------------------------------
VMCTL="$VMCTL" HOSTD_SOCKET="$SOCK" REMOTE_AGENT=r1 "$(dirname "$0")/remote-check.sh" > "$S/remote.out" 2>&1
rc=$?
check "vmctl --host ssh:// through a real sshd: $(grep -c '^ok' "$S/remote.out") checks pass" \
  bash -c "[ $rc = 0 ] && ! grep -q '^not ok' '$S/remote.out'"
[ $rc = 0 ] || diag "$(grep -A3 '^not ok' "$S/remote.out" | head -n 20)"

# --- vmctl set: a2's disk grown live and stopped, fewer CPUs and more memory at its next start
wait_ssh a2 300
set_check a2

# --- the users' own SSH keys: new --ssh-key, authorize live, --rm, a restore (authorize-check.sh)
# a2 is not needed any more: its RAM goes back to the host for a3.
vmctl stop --force a2 >/dev/null 2>&1
authorize_check a3

tap_end
