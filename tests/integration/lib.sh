# The harness the VM suites share; sourced, not run. suite_init makes the state dir and hostd's
# config; then TAP output (ok, not_ok, check, diag), vmctl against this suite's hostd,
# start_hostd/stop_hostd, destroy_leftover_domains for the cleanup, and netns_add/netns_del for
# a suite's test network.

# suite_init PREFIX PORT_MIN PORT_MAX: sets S (a short path: the embedded libvirt root and Unix
# sockets live below it), IMAGES (the state dir's, or $VM_TEST_IMAGE_CACHE kept between runs),
# SOCK, CONF, LOG, and writes CONF with the SSH port range ($VM_TEST_PORT_MIN/MAX win) and the
# metrics endpoint on $S/metrics.sock (no TCP port that suites running side by side share).
suite_init() {
  # Absolute: checks run vmctl from directories of their own.
  HOSTD=$(readlink -f "$HOSTD")
  VMCTL=$(readlink -f "$VMCTL")
  S=$(mktemp -d -t "$1.XXXXXX")
  chmod 711 "$S"
  IMAGES=${VM_TEST_IMAGE_CACHE:-$S/images}
  SOCK=$S/hostd.sock
  CONF=$S/hostd.conf
  LOG=$S/hostd.log
  HOSTD_PID=
  HOSTD_WRAPPER=()
  N=0
  FAILED=0
  cat > "$CONF" <<CONF
[hostd]
images-dir=$IMAGES
ssh-port-min=${VM_TEST_PORT_MIN:-$2}
ssh-port-max=${VM_TEST_PORT_MAX:-$3}
boot-timeout=360
metrics-listen=$S/metrics.sock
CONF
}

# shellcheck source=../tap.sh
. "$(dirname "${BASH_SOURCE[0]}")/../tap.sh"
vmctl() { "$VMCTL" --socket "$SOCK" "$@"; }

# Starts hostd in the background (HOSTD_PID) and waits until it answers; fails when it dies or
# does not answer within 20 s. Arguments are added to hostd's command line. HOSTD_WRAPPER (an
# array, empty after suite_init) is a command hostd runs under, e.g. hosts_file_wrapper's; it
# must exec hostd in the same process, so that HOSTD_PID is hostd's.
start_hostd() {
  "${HOSTD_WRAPPER[@]}" "$HOSTD" --config "$CONF" --state-dir "$S" --socket "$SOCK" "$@" \
    >> "$LOG" 2>&1 &
  HOSTD_PID=$!
  for _ in $(seq 1 100); do
    [ -S "$SOCK" ] && vmctl list >/dev/null 2>&1 && return 0
    kill -0 "$HOSTD_PID" 2>/dev/null || return 1
    sleep 0.2
  done
  return 1
}

# wait_ssh AGENT SECONDS: until exec answers.
wait_ssh() {
  local deadline=$(( $(date +%s) + $2 ))
  while [ "$(date +%s)" -lt "$deadline" ]; do
    vmctl exec "$1" -- true >/dev/null 2>&1 && return 0
    sleep 2
  done
  return 1
}

# trace_hostd FILE COMMAND...: runs COMMAND (its output dropped) with strace following hostd and
# every process it starts, each openat, execve and clone written to FILE; the trace ends with the
# command (keep it short: a QEMU it starts is traced too, and slowed).
trace_hostd() {
  local out=$1 tracer rc
  shift
  strace -f -qq -e trace=openat,execve,clone,clone3 -o "$out" -p "$HOSTD_PID" 2>/dev/null &
  tracer=$!
  sleep 1 # attached to every thread before the command starts
  "$@" >/dev/null
  rc=$?
  kill "$tracer" 2>/dev/null
  wait "$tracer" 2>/dev/null
  return $rc
}

# hostd_opened FILE: the files hostd's own threads opened in trace_hostd's FILE, one a line; not
# those of the programs it started (QEMU, qemu-img), which run as the agent's id: each of them
# execs, and is left out from its start, with every thread it makes after.
hostd_opened() {
  awk '{ pid[NR] = $1; line[NR] = $0 }
       / execve\(/ { child[$1] = 1 }
       /(clone3?\(|<\.\.\. clone3? resumed>).* = [0-9]+$/ { n++; from[n] = $1; to[n] = $NF }
       END {
         do {
           grew = 0
           for (k = 1; k <= n; k++)
             if ((from[k] in child) && !(to[k] in child)) { child[to[k]] = 1; grew = 1 }
         } while (grew)
         for (i = 1; i <= NR; i++) {
           if (pid[i] in child || !match(line[i], /openat\([^"]*"[^"]*"/)) continue
           s = substr(line[i], RSTART, RLENGTH); sub(/^openat\([^"]*"/, "", s); sub(/"$/, "", s)
           print s
         }
       }' "$1"
}

# hosts_file_wrapper FILE: sets HOSTD_WRAPPER so that hostd (and only hostd: the host keeps its
# own) sees FILE as /etc/hosts, bind-mounted in a mount namespace of its own (unshare's default
# propagation is private, so the mount never reaches the host's namespace). This is how a suite
# gives test names to the egress proxy, which resolves names itself with getaddrinfo().
hosts_file_wrapper() {
  # shellcheck disable=SC2016 # expanded by the inner sh
  HOSTD_WRAPPER=(unshare --mount --propagation private
    sh -c 'mount --bind "$0" /etc/hosts && exec "$@"' "$1")
}

stop_hostd() {
  kill "$HOSTD_PID" 2>/dev/null
  wait "$HOSTD_PID" 2>/dev/null
  HOSTD_PID=
}

# Whatever hostd could not remove: destroyed through the same embedded root, so no guest
# outlives the suite and eats the next run's CPU.
destroy_leftover_domains() {
  [ -d "$S/libvirt" ] || return 0
  local d
  for d in $(virsh -c "qemu:///embed?root=$S/libvirt" list --name 2>/dev/null); do
    virsh -c "qemu:///embed?root=$S/libvirt" destroy "$d" >/dev/null 2>&1
  done
}

# netns_add NS VH VN HOST_IP ADDRESS...: a network namespace NS joined to the host by a veth
# pair, VH on the host with HOST_IP/29 and VN in NS with every ADDRESS/29, both ends and NS's
# loopback up. The suite's test network, which reaches nothing but itself; netns_del removes it.
netns_add() {
  local ns=$1 vh=$2 vn=$3 host_ip=$4 a
  shift 4
  ip netns add "$ns" &&
    ip link add "$vh" type veth peer name "$vn" &&
    ip link set "$vn" netns "$ns" &&
    ip addr add "$host_ip/29" dev "$vh" &&
    ip link set "$vh" up || return 1
  for a in "$@"; do
    ip -n "$ns" addr add "$a/29" dev "$vn" || return 1
  done
  ip -n "$ns" link set "$vn" up &&
    ip -n "$ns" link set lo up
}

# netns_del NS VH: removes what netns_add made (deleting the host end removes its peer too);
# quiet when none of it is there, for the cleanup.
netns_del() {
  ip netns del "$1" 2>/dev/null
  ip link del "$2" 2>/dev/null
}

# netns_suite_cleanup: the end of the cleanup of a suite with a test network, once its agents are
# removed and hostd stopped: no domain, process of PIDS or test network (NS, VH) outlives the
# suite; after a failure, or when no test ran, the tail of hostd's log; then the state dir goes.
netns_suite_cleanup() {
  local p
  destroy_leftover_domains
  for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null; done
  for p in "${PIDS[@]}"; do wait "$p" 2>/dev/null; done
  netns_del "$NS" "$VH"
  if [ "$FAILED" -ne 0 ] || [ "$N" -eq 0 ]; then
    diag_err "hostd log:"; diag_err "$(tail -n 40 "$LOG" 2>/dev/null)"
  fi
  rm -rf "$S"
}
