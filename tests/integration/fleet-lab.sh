# A fleet lab on one machine (docs/CLUSTER.md), for vm-fleet.sh and bench/move.sh; sourced, not
# run. etcd members on loopback ports, hostds each with its own state dir, socket, SSH port range
# and ids, all sharing one images dir, each reached as `ssh://root@127.0.0.1:PORT/<its socket>`
# through one real OpenSSH server on a loopback port (loopback-sshd.sh): its address in the
# fleet, which vmctl follows for moves and redirects.
#
# Set before lab_init: LAB (a directory), HOSTD, VMCTL, LAB_IMAGES, LAB_PORT_MIN (30 SSH ports a
# host from there), LAB_ETCD_BASE (two ports a member from there + 1), LAB_TTL (the hosts' lease).

# shellcheck source=loopback-sshd.sh
. "$(dirname "${BASH_SOURCE[0]}")/loopback-sshd.sh"

LAB_ETCD_PIDS=(0 0 0 0)
LAB_HOST_PIDS=(0 0 0 0 0 0)

# The client URLs of members 1-3, as hostd.conf's endpoints take them.
lab_endpoints() {
  echo "http://127.0.0.1:$((LAB_ETCD_BASE + 1));http://127.0.0.1:$((LAB_ETCD_BASE + 3));http://127.0.0.1:$((LAB_ETCD_BASE + 5))"
}

# lab_etcd_start N MEMBERS: starts member N of a cluster of MEMBERS (1 or 3) in the background.
lab_etcd_start() {
  local n=$1 members=$2 client=$((LAB_ETCD_BASE + 2 * $1 - 1)) peer=$((LAB_ETCD_BASE + 2 * $1))
  local cluster="e1=http://127.0.0.1:$((LAB_ETCD_BASE + 2))" m
  for ((m = 2; m <= members; m++)); do
    cluster+=",e$m=http://127.0.0.1:$((LAB_ETCD_BASE + 2 * m))"
  done
  etcd --name "e$n" --data-dir "$LAB/etcd$n" \
    --listen-client-urls "http://127.0.0.1:$client" --advertise-client-urls "http://127.0.0.1:$client" \
    --listen-peer-urls "http://127.0.0.1:$peer" --initial-advertise-peer-urls "http://127.0.0.1:$peer" \
    --initial-cluster "$cluster" --initial-cluster-state new --initial-cluster-token vm-lab \
    --heartbeat-interval 100 --election-timeout 1000 >>"$LAB/etcd$n.log" 2>&1 &
  LAB_ETCD_PIDS[$n]=$!
}

# lab_etcd_stop N: kills member N (SIGKILL: a member lost, not one leaving).
lab_etcd_stop() {
  [ "${LAB_ETCD_PIDS[$1]}" != 0 ] || return 0
  kill -9 "${LAB_ETCD_PIDS[$1]}" 2>/dev/null
  wait "${LAB_ETCD_PIDS[$1]}" 2>/dev/null
  LAB_ETCD_PIDS[$1]=0
}

# lab_etcd_healthy: whether the cluster answers (quorum).
lab_etcd_healthy() {
  local e
  e=$(lab_endpoints)
  ETCDCTL_API=3 etcdctl --endpoints="${e//;/,}" --command-timeout=2s put /vmctl-lab/ping x >/dev/null 2>&1
}

# lab_init MEMBERS: the etcd cluster (waits for it) and the sshd; 1 on failure.
lab_init() {
  local m _
  for ((m = 1; m <= $1; m++)); do lab_etcd_start "$m" "$1"; done
  for _ in $(seq 1 60); do lab_etcd_healthy && break; sleep 0.5; done
  lab_etcd_healthy || { tail -5 "$LAB"/etcd*.log; return 1; }
  mkdir -p "$LAB/sshd"
  loopback_sshd_start "$LAB/sshd" "$VMCTL" || { cat "$LAB/sshd/sshd.log"; return 1; }
}

# hv N ARGS: vmctl asked of host N's hostd through its socket.
hv() {
  local h=$1
  shift
  "$VMCTL" --socket "$LAB/h$h/hostd.sock" "$@"
}

# lab_host_start N [MEMBERS]: writes host hN's hostd.conf (the first time) and starts its hostd;
# waits until it answers.
lab_host_start() {
  local h=$1 d=$LAB/h$1 _
  local base=$((1879048192 + 1000000 * (h + 3)))
  mkdir -p "$d"
  chmod 711 "$d"
  [ -f "$d/hostd.conf" ] || cat >"$d/hostd.conf" <<CONF
[hostd]
images-dir=$LAB_IMAGES
ssh-port-min=$((LAB_PORT_MIN + 30 * (h - 1)))
ssh-port-max=$((LAB_PORT_MIN + 30 * h - 1))
boot-timeout=360
metrics-listen=$d/metrics.sock
agent-ids=$base-$((base + 999))
worker-ids=$((base + 1000))-$((base + 3999))
ksm=off

[cluster]
endpoints=$(lab_endpoints)
host-id=h$h
address=ssh://root@127.0.0.1:$SSHD_PORT$d/hostd.sock
lease-ttl=$LAB_TTL
replicate=${LAB_REPLICATE:-0}
CONF
  "$HOSTD" --config "$d/hostd.conf" --state-dir "$d" --socket "$d/hostd.sock" >>"$d/hostd.log" 2>&1 &
  LAB_HOST_PIDS[$h]=$!
  for _ in $(seq 1 100); do
    [ -S "$d/hostd.sock" ] && hv "$h" list >/dev/null 2>&1 && return 0
    kill -0 "${LAB_HOST_PIDS[$h]}" 2>/dev/null || return 1
    sleep 0.2
  done
  return 1
}

# lab_host_kill N: kills host N's hostd with SIGKILL (its QEMUs go on, as after a crash).
lab_host_kill() {
  [ "${LAB_HOST_PIDS[$1]}" != 0 ] || return 0
  kill -9 "${LAB_HOST_PIDS[$1]}" 2>/dev/null
  wait "${LAB_HOST_PIDS[$1]}" 2>/dev/null
  LAB_HOST_PIDS[$1]=0
}

# lab_host_qemus_kill N: destroys what host N's embedded libvirt runs (a host lost whole).
lab_host_qemus_kill() {
  local root=$LAB/h$1/libvirt d
  [ -d "$root" ] || return 0
  for d in $(virsh -c "qemu:///embed?root=$root" list --name 2>/dev/null); do
    virsh -c "qemu:///embed?root=$root" destroy "$d" >/dev/null 2>&1
  done
}

# lab_cleanup: every agent removed, hostds stopped, QEMUs, etcd and sshd ended.
lab_cleanup() {
  local h a pid
  for h in "${!LAB_HOST_PIDS[@]}"; do
    pid=${LAB_HOST_PIDS[$h]}
    if [ "$pid" != 0 ] && kill -0 "$pid" 2>/dev/null; then
      for a in $(hv "$h" list --json 2>/dev/null | python3 -c 'import json,sys; [print(a["name"]) for a in json.load(sys.stdin)]' 2>/dev/null); do
        hv "$h" rm --force "$a" >/dev/null 2>&1
      done
      kill "$pid" 2>/dev/null
      wait "$pid" 2>/dev/null
    fi
    lab_host_qemus_kill "$h"
  done
  for pid in "${LAB_ETCD_PIDS[@]}"; do
    [ "$pid" != 0 ] && { kill "$pid" 2>/dev/null; wait "$pid" 2>/dev/null; }
  done
  [ -n "${SSHD_PID:-}" ] && kill "$SSHD_PID" 2>/dev/null
  return 0
}

# lab_fleet_field AGENT FIELD [HOST]: the fleet's view of AGENT, asked of host HOST (default 1).
lab_fleet_field() {
  hv "${3:-1}" list --fleet --json 2>/dev/null |
    python3 -c 'import json,sys
for a in json.load(sys.stdin):
    if a["name"] == sys.argv[1]: print(a.get(sys.argv[2], ""))' "$1" "$2"
}

# lab_liveness HOST [ASKED]: live, drained or down, as host ASKED (default 1) sees host HOST.
lab_liveness() {
  hv "${2:-1}" hosts --json 2>/dev/null |
    python3 -c 'import json,sys
for h in json.load(sys.stdin):
    if h["id"] == sys.argv[1]:
        print("down" if not h.get("live") else "drained" if h.get("drained") else "live")' "$1"
}
