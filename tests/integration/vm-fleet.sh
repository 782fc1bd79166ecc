#!/bin/bash
# The fleet on one machine, as a lab of three hosts (docs/CLUSTER.md): three etcd members on
# loopback ports, three hostds (each its own state dir, socket, port range and ids), each
# reached through a real OpenSSH server on a loopback port as `ssh://root@127.0.0.1:PORT/<its
# socket>`, its address in the fleet. Real guests under TCG: agents placed by the rule, the one
# view from each host, a move of a running agent with a counting process (same boot, the count
# goes on), a drain, a hostd killed mid-move, a host lost with its QEMUs (its agents host-down),
# etcd losing a member and then its quorum. Output is TAP. Needs root, etcd, sshd, HOSTD and
# VMCTL set.
set -uo pipefail

: "${HOSTD:?}" "${VMCTL:?}"
HERE=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=lib.sh
. "$HERE/lib.sh"
# shellcheck source=loopback-sshd.sh
. "$HERE/loopback-sshd.sh"

if [ "$(id -u)" != 0 ] || ! command -v etcd >/dev/null || ! [ -x /usr/sbin/sshd ]; then
  echo "1..0 # SKIP needs root, etcd and sshd"
  exit 0
fi

suite_init vmf "${VM_FLEET_PORT_MIN:-43900}" "${VM_FLEET_PORT_MAX:-43989}"
PORT_MIN=${VM_TEST_PORT_MIN:-${VM_FLEET_PORT_MIN:-43900}}
CACHE=$IMAGES
IMAGES=$S/images
mkdir -p "$IMAGES"
if [ -f "$CACHE/debian-12/image.ini" ] && [ "$CACHE" != "$IMAGES" ]; then
  cp -al "$CACHE/debian-12" "$IMAGES/"
  rm -rf "$IMAGES/debian-12/warm" # each suite's warm image is its own (vm-warm.sh's note)
fi
# etcd's ports: below Linux's ephemeral range, apart from the unit tests' (27020-27209).
ETCD_BASE=${VM_FLEET_ETCD_BASE:-27300}
ENDPOINTS="http://127.0.0.1:$((ETCD_BASE + 1));http://127.0.0.1:$((ETCD_BASE + 3));http://127.0.0.1:$((ETCD_BASE + 5))"
ETCD_PIDS=()
HOST_PIDS=(0 0 0 0)
AGENTS=()
TTL=3

cleanup() {
  local h a
  for h in 1 2 3; do
    if [ "${HOST_PIDS[$h]}" != 0 ] && kill -0 "${HOST_PIDS[$h]}" 2>/dev/null; then
      for a in $(hv "$h" list --json 2>/dev/null | python3 -c 'import json,sys; [print(a["name"]) for a in json.load(sys.stdin)]' 2>/dev/null); do
        hv "$h" rm --force "$a" >/dev/null 2>&1
      done
      kill "${HOST_PIDS[$h]}" 2>/dev/null
      wait "${HOST_PIDS[$h]}" 2>/dev/null
    fi
  done
  for h in 1 2 3; do S=$S/h$h destroy_leftover_domains; done
  for pid in "${ETCD_PIDS[@]}"; do kill "$pid" 2>/dev/null; wait "$pid" 2>/dev/null; done
  [ -n "${SSHD_PID:-}" ] && kill "$SSHD_PID" 2>/dev/null
  rm -rf "$S"
}
trap cleanup EXIT

# ---- etcd: three members
etcd_member() { # N: starts member N (1-3) in the background
  local n=$1 client=$((ETCD_BASE + 2 * $1 - 1)) peer=$((ETCD_BASE + 2 * $1))
  etcd --name "e$n" --data-dir "$S/etcd$n" \
    --listen-client-urls "http://127.0.0.1:$client" --advertise-client-urls "http://127.0.0.1:$client" \
    --listen-peer-urls "http://127.0.0.1:$peer" --initial-advertise-peer-urls "http://127.0.0.1:$peer" \
    --initial-cluster "e1=http://127.0.0.1:$((ETCD_BASE + 2)),e2=http://127.0.0.1:$((ETCD_BASE + 4)),e3=http://127.0.0.1:$((ETCD_BASE + 6))" \
    --initial-cluster-state new --initial-cluster-token vmf-lab \
    --heartbeat-interval 100 --election-timeout 1000 >"$S/etcd$n.log" 2>&1 &
  ETCD_PIDS[$n]=$!
}
for n in 1 2 3; do etcd_member "$n"; done
etcd_ok() { ETCDCTL_API=3 etcdctl --endpoints="${ENDPOINTS//;/,}" --command-timeout=2s endpoint health >/dev/null 2>&1; }
for _ in $(seq 1 60); do etcd_ok && break; sleep 0.5; done
etcd_ok || { echo "Bail out! etcd did not come up"; tail -5 "$S"/etcd*.log; exit 1; }

# ---- sshd: every host's address
mkdir -p "$S/sshd"
loopback_sshd_start "$S/sshd" "$VMCTL" || { echo "Bail out! sshd did not start"; cat "$S/sshd/sshd.log"; exit 1; }

# ---- three hostds
# hv N ARGS: vmctl asked of host N's hostd through its socket.
hv() { local h=$1; shift; "$VMCTL" --socket "$S/h$h/hostd.sock" "$@"; }
host_conf() {
  local h=$1 d=$S/h$1
  mkdir -p "$d"
  chmod 711 "$d"
  cat >"$d/hostd.conf" <<CONF
[hostd]
images-dir=$IMAGES
ssh-port-min=$((PORT_MIN + 30 * (h - 1)))
ssh-port-max=$((PORT_MIN + 30 * h - 1))
boot-timeout=360
metrics-listen=$d/metrics.sock
agent-ids=$((1879048192 + 1000000 * (h + 3)))-$((1879048192 + 1000000 * (h + 3) + 999))

[cluster]
endpoints=$ENDPOINTS
host-id=h$h
address=ssh://root@127.0.0.1:$SSHD_PORT$d/hostd.sock
lease-ttl=$TTL
CONF
}
start_host() {
  local h=$1 d=$S/h$1
  "$HOSTD" --config "$d/hostd.conf" --state-dir "$d" --socket "$d/hostd.sock" >>"$d/hostd.log" 2>&1 &
  HOST_PIDS[$h]=$!
  for _ in $(seq 1 100); do
    [ -S "$d/hostd.sock" ] && hv "$h" list >/dev/null 2>&1 && return 0
    kill -0 "${HOST_PIDS[$h]}" 2>/dev/null || return 1
    sleep 0.2
  done
  return 1
}
for h in 1 2 3; do
  host_conf "$h"
  start_host "$h" || { echo "Bail out! hostd h$h did not start"; tail -20 "$S/h$h/hostd.log"; exit 1; }
done

# fleet_field AGENT FIELD [HOST]: the fleet's view of AGENT (asked of host HOST, default 1).
fleet_field() {
  hv "${3:-1}" list --fleet --json 2>/dev/null |
    python3 -c 'import json,sys
for a in json.load(sys.stdin):
    if a["name"] == sys.argv[1]: print(a.get(sys.argv[2], ""))' "$1" "$2"
}
host_liveness() {
  hv 1 hosts --json 2>/dev/null |
    python3 -c 'import json,sys
for h in json.load(sys.stdin):
    if h["id"] == sys.argv[1]:
        print("down" if not h.get("live") else "drained" if h.get("drained") else "live")' "$1"
}
# wait_for SECONDS CMD...: until CMD succeeds.
wait_for() {
  local deadline=$(( $(date +%s) + $1 ))
  shift
  while [ "$(date +%s)" -lt "$deadline" ]; do "$@" && return 0; sleep 1; done
  return 1
}
boot_id() { hv "$1" exec "$2" -- cat /proc/sys/kernel/random/boot_id 2>/dev/null; }
count() { hv "$1" exec "$2" -- cat /tmp/count 2>/dev/null; }
start_counter() {
  hv "$1" exec "$2" -- sh -c 'nohup sh -c "i=0; while :; do i=\$((i+1)); echo \$i > /tmp/count.new && mv /tmp/count.new /tmp/count; sleep 1; done" >/dev/null 2>&1 &'
}

all_live() {
  local h n
  for h in 1 2 3; do
    n=$(hv "$h" hosts --json 2>/dev/null | python3 -c 'import json,sys; print(sum(1 for h in json.load(sys.stdin) if h["live"]))' 2>/dev/null)
    [ "$n" = 3 ] || return 1
  done
}
check "three hosts are live in the fleet, seen from each" wait_for 20 all_live

# ---- the warm image (the three hosts share the images dir, so one build serves them all)
out=$(hv 1 template build debian-12 2>&1)
check "the template's warm image is built" grep -q "(warm: yes)" <<<"$out" || diag "$out"

# ---- placement: six agents asked of host 1 spread by the rule
for i in 1 2 3 4 5 6; do
  out=$(hv 1 new "a$i" 2>&1) || diag "new a$i: $out"
  AGENTS+=("a$i")
done
spread=$(for i in 1 2 3 4 5 6; do fleet_field "a$i" host; done | sort | uniq -c | awk '{print $1}' | sort | tr '\n' ' ')
check "six agents asked of one host are spread over the three (2 each)" test "$spread" = "2 2 2 "
for h in 1 2 3; do
  n=$(hv "$h" list --fleet --json | python3 -c 'import json,sys; print(len(json.load(sys.stdin)))')
  check "the fleet's list asked of h$h shows the six" test "$n" = 6
done

# ---- a move: a running agent with a counting process
A=$(for i in 1 2 3 4 5 6; do [ "$(fleet_field "a$i" host)" = h1 ] && echo "a$i"; done | head -1)
start_counter 1 "$A"
BOOT=$(boot_id 1 "$A")
sleep 3
C0=$(count 1 "$A")
out=$(hv 3 move "$A" --to h2 2>&1)
rc=$?
check "move of $A to h2, asked of h3, works" test "$rc" = 0 || diag "$out"
diag "$out"
check "the fleet's record says $A is h2's at epoch 2" test "$(fleet_field "$A" host)/$(fleet_field "$A" epoch)" = "h2/2"
check "$A runs on h2 with the same boot (its processes moved)" test "$(boot_id 2 "$A")" = "$BOOT"
sleep 2
C1=$(count 2 "$A")
check "its counting process went on ($C0 -> $C1)" test -n "$C1" -a "${C1:-0}" -gt "${C0:-0}"
check "h1 has no copy of $A left" bash -c "! test -e '$S/h1/agents/$A'"
check "asked of h1, exec on $A is sent on to h2" test "$(boot_id 1 "$A")" = "$BOOT"

echo "1..$N"
[ "$FAILED" = 0 ]
