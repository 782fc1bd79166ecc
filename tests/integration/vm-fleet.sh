#!/bin/bash
# The fleet on one machine, as a lab of three hosts (docs/CLUSTER.md; fleet-lab.sh): three etcd
# members on loopback ports, three hostds, each reached through a real OpenSSH server as its
# address in the fleet. Real guests under TCG: agents placed by the rule, the one view from each
# host, a move of a running agent with a counting process (same boot, the count goes on), hostd
# killed at each step of a move (one owner and one runnable copy after, images intact), a
# drain, a host lost with its QEMUs (its agents host-down) and one of its agents recovered on
# the host that keeps its replica (its files as of its last checkpoint; the lost host, back,
# fences its copy), etcd losing a member and then its quorum. Output is TAP. Needs root, etcd, sshd, HOSTD and VMCTL set.
set -uo pipefail

: "${HOSTD:?}" "${VMCTL:?}"
HERE=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=lib.sh
. "$HERE/lib.sh"

if [ "$(id -u)" != 0 ] || ! command -v etcd >/dev/null || ! [ -x /usr/sbin/sshd ]; then
  echo "1..0 # SKIP needs root, etcd and sshd"
  exit 0
fi

suite_init vmf 43900 43989
LAB=$S
LAB_PORT_MIN=${VM_TEST_PORT_MIN:-43900}
LAB_ETCD_BASE=${VM_FLEET_ETCD_BASE:-27300}
LAB_TTL=3
# Each checkpoint of an agent is copied to one other host (docs/CLUSTER.md, "Replicas").
LAB_REPLICATE=1
LAB_IMAGES=$S/images
mkdir -p "$LAB_IMAGES"
if [ -f "$IMAGES/debian-12/image.ini" ] && [ "$IMAGES" != "$LAB_IMAGES" ]; then
  cp -al "$IMAGES/debian-12" "$LAB_IMAGES/"
  rm -rf "$LAB_IMAGES/debian-12/warm" # the suite's warm image is its own (vm-warm.sh's note)
fi
# shellcheck source=fleet-lab.sh
. "$HERE/fleet-lab.sh"

cleanup() {
  lab_cleanup
  rm -rf "$S"
}
trap cleanup EXIT

lab_init 3 || { echo "Bail out! the lab's etcd or sshd did not start"; exit 1; }
for h in 1 2 3; do
  lab_host_start "$h" || { echo "Bail out! hostd h$h did not start"; tail -20 "$S/h$h/hostd.log"; exit 1; }
done

# wait_for SECONDS CMD...: until CMD succeeds.
wait_for() {
  local deadline=$(($(date +%s) + $1))
  shift
  while [ "$(date +%s)" -lt "$deadline" ]; do
    "$@" && return 0
    sleep 1
  done
  return 1
}
boot_id() { hv "$1" exec "$2" -- cat /proc/sys/kernel/random/boot_id 2>/dev/null; }
count() { hv "$1" exec "$2" -- cat /tmp/count 2>/dev/null; }
start_counter() {
  hv "$1" exec "$2" -- sh -c 'nohup sh -c "i=0; while :; do i=\$((i+1)); echo \$i > /tmp/count.new && mv /tmp/count.new /tmp/count; sleep 1; done" >/dev/null 2>&1 &'
}
all_live() {
  local h x
  for h in 1 2 3; do
    for x in 1 2 3; do [ "$(lab_liveness "h$x" "$h")" = live ] || return 1; done
  done
}
# on HOST: the agents the fleet's record puts on HOST.
on() {
  hv 1 list --fleet --json 2>/dev/null |
    python3 -c 'import json,sys; [print(a["name"]) for a in json.load(sys.stdin) if a["host"] == sys.argv[1]]' "$1"
}
# local_state HOST AGENT: the agent's state on that host alone ("" when it has no copy).
local_state() {
  hv "$1" list --json 2>/dev/null |
    python3 -c 'import json,sys
for a in json.load(sys.stdin):
    if a["name"] == sys.argv[1]: print("fenced" if a.get("fenced") else a.get("state", ""))' "$2"
}
# images_intact HOST AGENT: qemu-img check of every image of the agent's copy on HOST.
# The agent runs meanwhile: its active overlay may show clusters its QEMU allocated and has not
# counted yet (exit 3, leaks only: space, not data); anything else fails, said.
images_intact() {
  local f out rc
  for f in "$S/h$1/agents/$2"/*.qcow2; do
    out=$(qemu-img check -U "$f" 2>&1)
    rc=$?
    [ "$rc" = 0 ] || [ "$rc" = 3 ] || { echo "# qemu-img check failed ($rc): $f: $out" | head -5; return 1; }
  done
}

check "three hosts are live in the fleet, as each sees it" wait_for 20 all_live

# ---- the warm image (the three hosts share the images dir: one build serves them all)
out=$(hv 1 template build debian-12 2>&1)
check "the template's warm image is built" grep -q "(warm: yes)" <<<"$out" || diag "$out"

# ---- placement: six agents asked of one host, each placed by the rule
for i in 1 2 3 4 5 6; do
  out=$(hv 1 new "a$i" 2>&1) || diag "new a$i: $out"
done
placed=$(for i in 1 2 3 4 5 6; do lab_fleet_field "a$i" host; done | grep -c '^h[123]$')
check "six agents asked of h1 are placed, each on a live host" test "$placed" = 6
diag "placed: $(for h in 1 2 3; do echo -n "h$h: $(on "h$h" | tr '\n' ' ') "; done)"
for h in 1 2 3; do
  n=$(hv "$h" list --fleet --json | python3 -c 'import json,sys; print(len(json.load(sys.stdin)))')
  check "the fleet's list asked of h$h shows the six" test "$n" = 6
done

# ---- a move: a running agent with a counting process, asked of a third host
A=$(on h1 | head -1)
if [ -z "$A" ]; then
  hv 1 new am --on h1 >/dev/null 2>&1
  A=am
fi
start_counter 1 "$A"
BOOT=$(boot_id 1 "$A")
sleep 3
C0=$(count 1 "$A")
out=$(hv 3 move "$A" --to h2 2>&1)
check "move of $A from h1 to h2, asked of h3" test $? = 0 || diag "$out"
diag "$(tail -1 <<<"$out")"
check "the fleet's record says $A is h2's with epoch 2" test "$(lab_fleet_field "$A" host)/$(lab_fleet_field "$A" epoch)" = "h2/2"
check "$A runs on h2 with the same boot id (its processes moved)" test "$(boot_id 2 "$A")" = "$BOOT"
sleep 2
C1=$(count 2 "$A")
check "its counting process went on ($C0 -> $C1)" test -n "$C1" -a "${C1:-0}" -gt "${C0:-0}"
check "h1 has no copy of $A left" test ! -e "$S/h1/agents/$A"
check "$A's images on h2 pass qemu-img check" images_intact 2 "$A"
check "asked of h1, exec on $A goes to h2" test "$(boot_id 1 "$A")" = "$BOOT"
out=$(hv 1 logs "$A" --lines 3 2>&1)
check "asked of h1, the console log of $A comes from h2" test $? = 0 || diag "$out"
echo "copied through the fleet" >"$S/cp-in"
out=$(hv 1 cp "$S/cp-in" "$A:/tmp/" 2>&1 && hv 1 cp "$A:/tmp/cp-in" "$S/cp-out" 2>&1)
check "asked of h1, cp into and out of $A goes to h2" cmp -s "$S/cp-in" "$S/cp-out" || diag "$out"
# An MCP client of h1: its exec tool on $A goes to h2 too.
out=$(printf '%s\n' \
  '{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"lab","version":"1"}}}' \
  '{"jsonrpc":"2.0","method":"notifications/initialized"}' \
  "{\"jsonrpc\":\"2.0\",\"id\":2,\"method\":\"tools/call\",\"params\":{\"name\":\"exec\",\"arguments\":{\"name\":\"$A\",\"command\":[\"cat\",\"/proc/sys/kernel/random/boot_id\"]}}}" |
  timeout 120 "$VMCTL" --socket "$S/h1/hostd.sock" mcp 2>&1)
check "asked of h1, vmctl mcp's exec on $A goes to h2" grep -q "$BOOT" <<<"$out" || diag "$out"
out=$(hv 2 move "$A" --to h2 2>&1)
check "a move to the host it is on is refused" grep -q "is on host 'h2' already" <<<"$out" || diag "$out"

# ---- hostd killed at each step of a move: one owner, one runnable copy, images intact
# crash_case STEP WHO: moves $A from its host to the other of h1/h2 with the source (WHO=src) or
# the target (WHO=dst) killed at STEP, then restarts it and checks the outcome.
crash_case() {
  local step=$1 who=$2 src dst victim owner other st_owner st_other
  src=$(lab_fleet_field "$A" host | tr -d h)
  dst=$((3 - src))
  victim=$([ "$who" = src ] && echo "$src" || echo "$dst")
  hv "$victim" list >/dev/null 2>&1
  kill "${LAB_HOST_PIDS[$victim]}" && wait "${LAB_HOST_PIDS[$victim]}" 2>/dev/null
  LAB_HOST_PIDS[$victim]=0
  HOSTD_TEST_CRASH_AT=$step lab_host_start "$victim" || diag "h$victim did not start"
  hv 1 move "$A" --to "h$dst" >"$S/move-$step.out" 2>&1
  # The move ends when the victim dies there; one that failed before it, or went past it, ends
  # without: that case has not tested its step.
  local reached=yes
  for _ in $(seq 1 50); do kill -0 "${LAB_HOST_PIDS[$victim]}" 2>/dev/null || break; sleep 0.2; done
  if kill -0 "${LAB_HOST_PIDS[$victim]}" 2>/dev/null; then
    reached=no
    kill -9 "${LAB_HOST_PIDS[$victim]}"
  fi
  wait "${LAB_HOST_PIDS[$victim]}" 2>/dev/null
  LAB_HOST_PIDS[$victim]=0
  check "the move reached $step, where h$victim was killed" test "$reached" = yes ||
    diag "$(cat "$S/move-$step.out")"
  lab_host_start "$victim" || diag "h$victim did not start again"
  # Settled once exactly one of the two serves it: the record's owner runs it, the other has
  # no copy or a fenced one.
  settled() {
    owner=$(lab_fleet_field "$A" host | tr -d h)
    [ "$owner" = 1 ] || [ "$owner" = 2 ] || return 1
    other=$((3 - owner))
    st_owner=$(local_state "$owner" "$A")
    st_other=$(local_state "$other" "$A")
    [ -n "$st_owner" ] && [ "$st_owner" != fenced ] && { [ -z "$st_other" ] || [ "$st_other" = fenced ]; }
  }
  if ! wait_for 60 settled; then
    not_ok "h$victim killed at $step: one owner and one runnable copy (owner h$owner: '$st_owner', h$other: '$st_other')"
    diag "$(cat "$S/move-$step.out")"
    return
  fi
  ok "h$victim killed at $step: one owner (h$owner, epoch $(lab_fleet_field "$A" epoch)), one runnable copy (h$other: ${st_other:-none})"
  check "after $step, $A answers on its owner h$owner with the boot id it had" test "$(boot_id "$owner" "$A")" = "$BOOT"
  check "after $step, $A's images on h$owner pass qemu-img check" images_intact "$owner" "$A"
  [ "$st_other" = fenced ] && hv "$other" rm --force "$A" >/dev/null 2>&1
}
crash_case move-saved src
crash_case move-reading src
crash_case move-installed dst
crash_case move-restored dst
crash_case move-taken dst
crash_case move-done src

# ---- drain: a host's agents move away, new ones keep off
out=$(hv 1 drain h3 2>&1)
check "drain h3 moves its agents away" test $? = 0 || diag "$out"
diag "$(tail -1 <<<"$out")"
check "h3 holds no agent after its drain" test -z "$(on h3)"
check "h3 shows drained" test "$(lab_liveness h3)" = drained
out=$(hv 1 new ad --on h3 2>&1)
check "no new agent goes on a drained host" test $? != 0 || diag "$out"
out=$(hv 1 undrain h3 2>&1)
check "undrain h3" test "$(lab_liveness h3)" = live

# ---- replicas: a checkpoint of an agent of h2 is copied to another host by itself
LOST=$(on h2 | head -1)
hv 2 exec "$LOST" -- sh -c 'echo kept > /home/agent/kept; sync'
out=$(hv 2 checkpoint "$LOST" --label before-loss 2>&1)
check "checkpoint of h2's agent $LOST" test $? = 0 || diag "$out"
CKPT=$(hv 2 checkpoints "$LOST" --json 2>/dev/null | python3 -c 'import json,sys; print(json.load(sys.stdin)[-1]["id"])')
replica_of() { hv 2 info "$LOST" --json 2>/dev/null | python3 -c 'import json,sys; print(json.load(sys.stdin).get("replica", ""))'; }
replicated() { [ "$(replica_of | cut -d' ' -f1)" = "$CKPT" ]; }
t0=$(date +%s)
check "h2 copies the new checkpoint $CKPT of $LOST to another host by itself" wait_for 90 replicated ||
  diag "$(grep -i replica "$S/h2/hostd.log" | tail -5)"
KEEPER=$(replica_of | sed -E 's/.* on (h[0-9]).*/\1/')
diag "replica of $LOST: $(replica_of), $(($(date +%s) - t0)) s after the checkpoint"
check "the keeper h${KEEPER#h} holds the replica whole (its manifest)" \
  test -f "$S/$KEEPER/replicas/$LOST/replica.ini"
out=$(hv 1 recover "$LOST" --to "$KEEPER" 2>&1)
rc=$?
check "no recovery while its host is live (exit 5)" test "$rc" = 5 || diag "$rc: $out"
hv 2 exec "$LOST" -- sh -c 'echo lost > /home/agent/after; sync'
EPOCH=$(lab_fleet_field "$LOST" epoch)

# ---- a host lost: its hostd and its QEMUs killed
lab_host_kill 2
lab_host_qemus_kill 2
down() { [ "$(lab_liveness h2)" = down ]; }
t0=$(date +%s)
check "h2 is down within its lease's TTL ($LAB_TTL s) and a refresh" wait_for $((LAB_TTL + 10)) down
diag "h2 down after $(($(date +%s) - t0)) s"
check "h2's agent $LOST shows host-down" test "$(lab_fleet_field "$LOST" state)" = host-down
out=$(hv 1 exec "$LOST" -- true 2>&1)
check "exec on $LOST says its host is down" grep -q "which is down" <<<"$out" || diag "$out"

# ---- recovered on the host that keeps its replica, asked of another
t0=$(date +%s)
out=$(hv 1 recover "$LOST" --to "$KEEPER" 2>&1)
check "recover $LOST on $KEEPER" test $? = 0 || diag "$out"
diag "$(tail -1 <<<"$out") ($(($(date +%s) - t0)) s)"
check "recover says it is as of checkpoint $CKPT and that the rest is lost" \
  grep -q "from checkpoint $CKPT, .*what it did after that is lost" <<<"$out"
check "the fleet's record names $KEEPER with the epoch raised" \
  test "$(lab_fleet_field "$LOST" host)/$(lab_fleet_field "$LOST" epoch)" = "$KEEPER/$((EPOCH + 1))"
kept=$(hv "${KEEPER#h}" exec "$LOST" -- cat /home/agent/kept 2>&1)
check "$LOST has its files as of the checkpoint on $KEEPER" test "$kept" = kept || diag "$kept"
check "and not what it wrote after the checkpoint" \
  hv "${KEEPER#h}" exec "$LOST" -- test ! -e /home/agent/after
check "the replica is the agent now: no replica left on $KEEPER" \
  test ! -e "$S/$KEEPER/replicas/$LOST"
out=$(hv 1 recover "$LOST" --to "$KEEPER" 2>&1)
check "a second recover is refused: it is on $KEEPER already" grep -q "already" <<<"$out" ||
  diag "$out"

# ---- the lost host comes back: its copy of the recovered agent is fenced, never started
lab_host_start 2 || diag "h2 did not start again"
check "h2 is live again once its hostd is back" wait_for 20 all_live
check "h2's old copy of $LOST is fenced" test "$(local_state 2 "$LOST")" = fenced
check "and not running there (no QEMU)" test "$(hv 2 info "$LOST" --json 2>/dev/null | python3 -c 'import json,sys; print(json.load(sys.stdin).get("qemu_pid", "none"))')" = none
check "$LOST still answers on $KEEPER" hv "${KEEPER#h}" exec "$LOST" -- true
hv 2 rm --force "$LOST" >/dev/null 2>&1
for a in $(on h2); do hv 2 rm --force "$a" >/dev/null 2>&1; done

# ---- etcd: one member lost, then the quorum
lab_etcd_stop 3
# The member lost may be the leader: the other two elect one (etcd's election timeout here is
# 1 s), and the fleet answers again within it and a try or two.
fleet_answers() { hv 2 list --fleet >/dev/null 2>&1; }
t0=$(date +%s%3N)
check "with one of three etcd members gone the fleet's view answers (within an election)" \
  wait_for 15 fleet_answers || diag "$(hv 2 list --fleet 2>&1)"
diag "the fleet answered again after $(($(date +%s%3N) - t0)) ms"
out=$(hv 1 hosts 2>&1)
check "and hosts answers" test $? = 0 || diag "$out"
lab_etcd_stop 1
lab_etcd_stop 2
out=$(hv 1 list --fleet 2>&1)
rc=$?
check "without quorum the fleet's view fails clearly (exit 12)" test "$rc" = 12 || diag "$rc: $out"
OWN=
for h in 1 3; do
  a=$(hv "$h" list --json | python3 -c 'import json,sys; l = [a["name"] for a in json.load(sys.stdin)]; print(l[0] if l else "")')
  if [ -n "$a" ]; then
    check "without quorum h$h serves its own agent $a (exec)" hv "$h" exec "$a" -- true
    OWN=${OWN:-$h:$a}
  fi
done
if [ -n "$OWN" ]; then
  out=$(hv "${OWN%%:*}" move "${OWN#*:}" --to h2 2>&1)
  check "without quorum a move fails and says why" grep -q "etcd" <<<"$out" || diag "$out"
  check "and the agent still answers where it was" hv "${OWN%%:*}" exec "${OWN#*:}" -- true
fi

tap_end
