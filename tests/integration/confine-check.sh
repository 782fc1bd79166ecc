# shellcheck shell=bash disable=SC2016 # the inner bash -c expands its own arguments
# One agent's QEMU cannot reach another agent (docs/SECURITY.md, "one agent's QEMU -> another
# agent"). Sourced, not run, after lib.sh (check, ok, not_ok, diag, $S); vm-suite.sh calls it
# with two running agents (a source and its fork: the fork may read the checkpoint images it
# stands on, and nothing else of its source's):
#
#   confine_check A B   from /proc of the real QEMUs: each runs as its agent's own id (as
#                       recorded), with no capabilities, no_new_privs and a seccomp filter; as
#                       A's id, B's disk, seed, console log, sockets and directory listing are
#                       refused, ptrace of B's QEMU and a read of its memory too, and the other
#                       way round; as A's id its own disk opens and its own socket answers (the
#                       checks can pass only because the other agent's files are shut), its
#                       QEMU's memory reads and a process of its id can be traced; each agent's
#                       SSH worker (hostd's SSH client to its guest) and egress worker run as
#                       ids of their own (three uids per agent, none another agent's), confined
#                       as its QEMU is, cannot be traced even by its QEMU's id, and the SSH
#                       worker holds the SSH connection to the guest where hostd holds none; as
#                       each worker's id, the memory of its QEMU and of its other worker does not
#                       open, and neither they nor the other agent's workers can be signalled

# The system's Python: run as an agent's id, it must be a path that id can execute (not a shim
# under root's home).
CONFINE_PYTHON=/usr/bin/python3
export CONFINE_PYTHON

# The agent-id of agent $1's record.
confine_id() { sed -n 's/^agent-id=//p' "$S/agents/$1/agent.ini"; }

# The PID of agent $1's QEMU, from the embedded driver's pid file.
confine_pid() { cat "$S/libvirt/run/qemu/$1.pid" 2>/dev/null; }

# The active overlay of agent $1.
confine_active() {
  local a
  a=$(sed -n 's/^active=//p' "$S/agents/$1/checkpoints.ini" 2>/dev/null)
  echo "$S/agents/$1/${a:-disk.qcow2}"
}

# Runs "$@" as id $1 (uid and gid, no supplementary groups).
confine_as() { local id=$1; shift; setpriv --reuid="$id" --regid="$id" --clear-groups "$@"; }

# Field $2 of /proc/$1/status.
confine_status() { awk -v k="$2:" '$1 == k { $1 = ""; print substr($0, 2) }' "/proc/$1/status"; }

# The PID of agent $1's SSH worker: the child of hostd that runs vm-ssh-worker for it.
confine_ssh_worker() { pgrep -P "$HOSTD_PID" -fx ".*/vm-ssh-worker $1" | head -n 1; }
# The pid of agent $1's in-guest API worker.
confine_guest_api_worker() { pgrep -P "$HOSTD_PID" -fx ".*/vm-guest-api-worker $1" | head -n 1; }

# The PID of agent $1's egress worker: the child of hostd that runs vm-egress-worker for it.
confine_egress_worker() { pgrep -P "$HOSTD_PID" -fx ".*/vm-egress-worker $1" | head -n 1; }

# The real uid of PID $1.
confine_uid() { awk '$1 == "Uid:" { print $2 }' "/proc/$1/status" 2>/dev/null; }

# The real, effective, saved and fs uids and gids of PID $1, one line when they are all one id.
confine_ids() { awk '$1 == "Uid:" || $1 == "Gid:" { print $2, $3, $4, $5 }' "/proc/$1/status" 2>/dev/null | sort -u; }

# The peers (ADDRESS:PORT) of the established TCP connections of PID $1.
confine_tcp_peers() { ss -tnpH state established | awk -v p="pid=$1," 'index($0, p) { print $4 }' | sort -u; }

# The inodes of the sockets connected to the Unix socket at path $1 (QEMU's ends name the path).
confine_unix_peers() { ss -xH state established | awk -v p="$1" '$4 == p { print $7 }' | sort -u; }

# The inodes of the sockets process $1 holds.
confine_socket_inodes() { ls -l "/proc/$1/fd" 2>/dev/null | sed -n 's/.*socket:\[\([0-9]*\)\]$/\1/p' | sort -u; }

# Whether the lines of $1 and $2 (sorted, unique) have none in common.
confine_none_shared() { ! comm -12 <(printf '%s\n' "$1" | sed '/^$/d') <(printf '%s\n' "$2" | sed '/^$/d') | grep -q .; }
export -f confine_none_shared

# As id $1: opens file $2 for reading (exit 0 when it could).
confine_open() { confine_as "$1" "$CONFINE_PYTHON" -c 'import sys; open(sys.argv[1], "rb").read(1)' "$2" 2>/dev/null; }

# As id $1: connects to Unix socket $2 (exit 0 when it could).
confine_connect() {
  confine_as "$1" "$CONFINE_PYTHON" -c '
import socket, sys
s = socket.socket(socket.AF_UNIX)
s.connect(sys.argv[1])' "$2" 2>/dev/null
}

# As id $1: PTRACE_ATTACH to PID $2 (exit 0 when it attached).
confine_ptrace() {
  confine_as "$1" "$CONFINE_PYTHON" -c '
import ctypes, os, sys
libc = ctypes.CDLL(None, use_errno=True)
pid = int(sys.argv[1])
if libc.ptrace(16, pid, None, None) != 0:
    sys.exit(1)
os.waitpid(pid, 0)
libc.ptrace(17, pid, None, None)' "$2" 2>/dev/null
}

# As id $1: reads a page of /proc/$2/mem at the first mapping (exit 0 when it could).
confine_mem() {
  confine_as "$1" "$CONFINE_PYTHON" -c '
import sys
pid = sys.argv[1]
start = int(open("/proc/%s/maps" % pid).readline().split("-")[0], 16)
with open("/proc/%s/mem" % pid, "rb") as f:
    f.seek(start)
    f.read(4096)' "$2" 2>/dev/null
}

# As id $1: opens /proc/$2/mem (exit 0 when it could).
confine_mem_open() {
  confine_as "$1" "$CONFINE_PYTHON" -c 'import sys; open("/proc/%s/mem" % sys.argv[1], "rb")' "$2" 2>/dev/null
}

# As id $1: kill -0 of PID $2 (exit 0 when it could).
confine_signal() {
  confine_as "$1" "$CONFINE_PYTHON" -c 'import os, sys; os.kill(int(sys.argv[1]), 0)' "$2" 2>/dev/null
}

confine_check() {
  local a=$1 b=$2 ida idb pida pidb x y idx pidy f
  ida=$(confine_id "$a"); idb=$(confine_id "$b")
  pida=$(confine_pid "$a"); pidb=$(confine_pid "$b")
  check "agents $a and $b have ids of their own from agent-ids ($ida, $idb)" \
    bash -c "[ -n '$ida' ] && [ -n '$idb' ] && [ '$ida' != '$idb' ] && [ '$ida' -ge 1879048192 ] && [ '$idb' -ge 1879048192 ]"
  for x in "$a:$ida:$pida" "$b:$idb:$pidb"; do
    IFS=: read -r y idx pidy <<< "$x"
    check "$y's QEMU (pid $pidy) runs as its id: real, effective, saved and fs uid and gid" \
      bash -c "[ -n '$pidy' ] && [ \"\$(awk '\$1 == \"Uid:\" || \$1 == \"Gid:\" { print \$2, \$3, \$4, \$5 }' /proc/$pidy/status | sort -u)\" = '$idx $idx $idx $idx' ]"
    check "$y's QEMU has no capabilities, no_new_privs and a seccomp filter" \
      bash -c "[ '$(confine_status "$pidy" CapEff)' = 0000000000000000 ] &&
               [ '$(confine_status "$pidy" CapPrm)' = 0000000000000000 ] &&
               [ '$(confine_status "$pidy" NoNewPrivs)' = 1 ] && [ '$(confine_status "$pidy" Seccomp)' = 2 ]"
  done

  check "hostd writes no core file" grep -Eq '^Max core file size +0 +0 ' "/proc/$HOSTD_PID/limits"
  for x in "$a:$ida" "$b:$idb"; do
    local wpid peers port held
    IFS=: read -r y idx <<< "$x"
    vmctl exec "$y" true >/dev/null
    wpid=$(confine_ssh_worker "$y")
    local wid
    wid=$(confine_uid "$wpid")
    check "$y's SSH worker (pid $wpid) runs as an id of its own ($wid, not its QEMU's $idx), with no capabilities, no_new_privs and a seccomp filter" \
      bash -c "[ -n '$wpid' ] && [ -n '$wid' ] && [ '$wid' != '$idx' ] && [ '$(confine_ids "$wpid")' = '$wid $wid $wid $wid' ] &&
               [ '$(confine_status "$wpid" CapEff)' = 0000000000000000 ] &&
               [ '$(confine_status "$wpid" NoNewPrivs)' = 1 ] && [ '$(confine_status "$wpid" Seccomp)' = 2 ]"
    check "$y's SSH worker is not dumpable (its /proc files are root's) and writes no core file; its output goes to a pipe" \
      bash -c "[ -n '$wpid' ] && [ \"\$(stat -c %u /proc/$wpid/environ)\" = 0 ] &&
               grep -Eq '^Max core file size +0 +0 ' /proc/$wpid/limits &&
               readlink /proc/$wpid/fd/2 | grep -q '^pipe:'"
    peers=$(confine_tcp_peers "$wpid")
    # Its session over the virtio port: the worker's end of a connection to QEMU's socket.
    port=$(ls "$S"/libvirt/lib/qemu/channel/target/domain-*-"$y"/org.vmctl.ssh.0 2>/dev/null | head -1)
    held=$(comm -12 <(confine_unix_peers "$port") <(confine_socket_inodes "$wpid"))
    check "$y's SSH worker holds the SSH connections to its guest (TCP or its virtio port), and hostd holds none of them" \
      bash -c '[ -n "$1$3" ] && confine_none_shared "$1" "$2" && confine_none_shared "$3" "$4"' _ \
      "$peers" "$(confine_tcp_peers "$HOSTD_PID")" "$held" "$(confine_socket_inodes "$HOSTD_PID")"
    # It may make no socket: hostd connects and hands each connection over (ss -e shows the
    # socket's owner, the uid that made it, when it is not root).
    check "$y's SSH worker made none of its TCP connections (hostd made them, as root)" \
      bash -c "! ss -tnpeH state established | grep 'pid=$wpid,' | grep -q 'uid:$idx '"
    wpid=$(confine_guest_api_worker "$y")
    check "$y's in-guest API worker (pid $wpid) is not root, with no capabilities, no_new_privs and a seccomp filter" \
      bash -c "[ -n '$wpid' ] && ! awk '\$1 == \"Uid:\" { print \$2, \$3, \$4, \$5 }' /proc/$wpid/status | grep -qw 0 &&
               [ '$(confine_status "$wpid" CapEff)' = 0000000000000000 ] &&
               [ '$(confine_status "$wpid" NoNewPrivs)' = 1 ] && [ '$(confine_status "$wpid" Seccomp)' = 2 ]"
    local aid eid
    aid=$(confine_uid "$wpid"); eid=$(confine_uid "$(confine_egress_worker "$y")")
    check "$y's in-guest API worker runs as an id of its own ($aid, not its QEMU's $idx, its SSH worker's $wid or its egress worker's $eid)" \
      bash -c "[ -n '$aid' ] && [ -n '$eid' ] && [ '$aid' != '$idx' ] && [ '$aid' != '$wid' ] && [ '$aid' != '$eid' ] &&
               [ '$(confine_ids "$wpid")' = '$aid $aid $aid $aid' ]"
  done

  export -f confine_as confine_open confine_connect confine_ptrace confine_mem confine_mem_open confine_signal

  # Each agent's QEMU, SSH worker and egress worker: three ids; as each worker's, the others are
  # out of reach. Workers are not dumpable, so their memory is shut to every id; QEMU's is open
  # to its own id (checked below), so the QEMU rows can fail.
  local wpa="" wpb="" epa="" epb=""
  for x in "$a:$ida:$pida" "$b:$idb:$pidb"; do
    local wpid epid wid eid
    IFS=: read -r y idx pidy <<< "$x"
    wpid=$(confine_ssh_worker "$y"); epid=$(confine_egress_worker "$y")
    wid=$(confine_uid "$wpid"); eid=$(confine_uid "$epid")
    check "$y's egress worker (pid $epid) runs as an id of its own ($eid): not its QEMU's ($idx) nor its SSH worker's ($wid)" \
      bash -c "[ -n '$epid' ] && [ -n '$eid' ] && [ -n '$wid' ] && [ '$(confine_ids "$epid")' = '$eid $eid $eid $eid' ] &&
               [ '$eid' != '$idx' ] && [ '$eid' != '$wid' ] && [ '$wid' != '$idx' ]"
    # Its filter refuses it a TCP socket: hostd makes each connection out and hands it over.
    check "$y's egress worker made none of its TCP sockets (hostd made them, as root)" \
      bash -c "[ -n '$eid' ] && ! ss -tanpeH | grep 'pid=$epid,' | grep -q 'uid:$eid '"
    check "as $y's SSH worker's id, /proc/PID/mem of its QEMU and of its egress worker does not open" \
      bash -c '[ -n "$1" ] && ! confine_mem_open "$1" "$2" && ! confine_mem_open "$1" "$3"' _ "$wid" "$pidy" "$epid"
    check "as $y's egress worker's id, /proc/PID/mem of its QEMU and of its SSH worker does not open" \
      bash -c '[ -n "$1" ] && ! confine_mem_open "$1" "$2" && ! confine_mem_open "$1" "$3"' _ "$eid" "$pidy" "$wpid"
    check "as $y's SSH worker's id, kill -0 of its QEMU and its egress worker fails (of itself it works)" \
      bash -c 'confine_signal "$1" "$4" && ! confine_signal "$1" "$2" && ! confine_signal "$1" "$3"' _ "$wid" "$pidy" "$epid" "$wpid"
    check "as $y's egress worker's id, kill -0 of its QEMU and its SSH worker fails (of itself it works)" \
      bash -c 'confine_signal "$1" "$4" && ! confine_signal "$1" "$2" && ! confine_signal "$1" "$3"' _ "$eid" "$pidy" "$wpid" "$epid"
    if [ "$y" = "$a" ]; then wpa=$wpid; epa=$epid; else wpb=$wpid; epb=$epid; fi
  done
  check "$a's and $b's workers run as four different ids" \
    bash -c '[ "$(printf "%s\n" "$@" | sort -u | wc -l)" = 4 ]' _ "$(confine_uid "$wpa")" "$(confine_uid "$epa")" "$(confine_uid "$wpb")" "$(confine_uid "$epb")"
  check "as $a's egress worker's id, kill -0 of $b's egress and SSH workers fails" \
    bash -c '[ -n "$1" ] && ! confine_signal "$1" "$2" && ! confine_signal "$1" "$3"' _ "$(confine_uid "$epa")" "$epb" "$wpb"
  # What shows that the checks below can pass: as its own id an agent's QEMU reaches its own.
  check "as $a's id, its own disk opens and its own egress socket answers" \
    bash -c 'confine_open "$1" "$2" && confine_connect "$1" "$3"' _ "$ida" "$(confine_active "$a")" "$S/agents/$a/egress.sock"
  check "as $a's id, its own QEMU's memory can be read (the memory check can fail)" \
    confine_mem "$ida" "$pida"
  setpriv --reuid="$ida" --regid="$ida" --clear-groups sleep 60 &
  local sleeper=$!
  sleep 0.5
  check "as $a's id, ptrace of a process of that id works (the ptrace check can fail)" \
    confine_ptrace "$ida" "$sleeper"
  kill "$sleeper" 2>/dev/null; wait "$sleeper" 2>/dev/null

  for x in "$a:$ida:$b:$pidb" "$b:$idb:$a:$pida"; do
    local from to id pid
    IFS=: read -r from id to pid <<< "$x"
    for f in "$(confine_active "$to")" "$S/agents/$to/seed.iso" "$S/agents/$to/console.log" \
             "$S/agents/$to/id_ed25519" "$S/agents/$to/agent.ini"; do
      check "as $from's id, $to's ${f##*/} does not open" \
        bash -c '[ -e "$2" ] && ! confine_open "$1" "$2"' _ "$id" "$f"
    done
    for f in egress.sock api.sock serial.sock; do
      check "as $from's id, $to's $f refuses the connection" \
        bash -c '[ -S "$2" ] && ! confine_connect "$1" "$2"' _ "$id" "$S/agents/$to/$f"
    done
    check "as $from's id, $to's directory cannot be listed" \
      bash -c "! setpriv --reuid='$id' --regid='$id' --clear-groups ls '$S/agents/$to' >/dev/null 2>&1"
    check "as $from's id, ptrace of $to's QEMU fails" \
      bash -c '[ -n "$2" ] && ! confine_ptrace "$1" "$2"' _ "$id" "$pid"
    check "as $from's id, $to's QEMU memory cannot be read" \
      bash -c '[ -n "$2" ] && ! confine_mem "$1" "$2"' _ "$id" "$pid"
    check "as $from's id, $to's QEMU still runs" kill -0 "$pid"
    check "as $from's id, neither its own SSH worker nor $to's can be traced" \
      bash -c '[ -n "$2" ] && [ -n "$3" ] && ! confine_ptrace "$1" "$2" && ! confine_ptrace "$1" "$3"' _ "$id" "$(confine_ssh_worker "$from")" "$(confine_ssh_worker "$to")"
  done
}

# confine_port_swap A: A's id owns the directory of its virtio port's socket (libvirt's channel
# directory), so it swaps the socket for a symbolic link to hostd's own socket; A's SSH worker
# is then replaced and an exec makes hostd connect to the port anew: hostd refuses the link and
# logs it, and the new worker holds no connection to hostd's socket. The socket is put back and
# the session over the port comes again.
confine_port_swap() {
  local a=$1 id port wpid lines held
  id=$(confine_id "$a")
  port=$(ls "$S"/libvirt/lib/qemu/channel/target/domain-*-"$a"/org.vmctl.ssh.0 2>/dev/null | head -1)
  check "as $a's id, its port's socket is swapped for a symbolic link to hostd's socket" \
    bash -c '[ -S "$2" ] && setpriv --reuid="$1" --regid="$1" --clear-groups sh -c "mv \"\$1\" \"\$1.real\" && ln -s \"\$2\" \"\$1\"" _ "$2" "$3"' _ "$id" "$port" "$SOCK"
  lines=$(wc -l < "$LOG")
  kill "$(confine_ssh_worker "$a")" 2>/dev/null
  # Once more if the first exec met the worker on its way out: the session is tried after one.
  vmctl exec "$a" true >/dev/null 2>&1 || vmctl exec "$a" true >/dev/null
  check "hostd refuses to connect to the link in $a's port directory, and logs it" \
    bash -c 'for i in $(seq 60); do tail -n +"$2" "$1" | grep -q "agent .$3.: no SSH session over the virtio port (.*symbolic link" && exit 0; sleep 1; done; exit 1' _ "$LOG" "$((lines + 1))" "$a"
  wpid=$(confine_ssh_worker "$a")
  check "$a's new SSH worker holds no connection to hostd's socket" \
    bash -c '[ -n "$1" ] && confine_none_shared "$2" "$3"' _ "$wpid" "$(confine_unix_peers "$SOCK")" "$(confine_socket_inodes "$wpid")"
  setpriv --reuid="$id" --regid="$id" --clear-groups sh -c 'rm -f "$1" && mv "$1.real" "$1"' _ "$port"
  kill "$wpid" 2>/dev/null
  vmctl exec "$a" true >/dev/null 2>&1 || vmctl exec "$a" true >/dev/null
  for _ in $(seq 60); do
    wpid=$(confine_ssh_worker "$a")
    held=$(comm -12 <(confine_unix_peers "$port") <(confine_socket_inodes "$wpid"))
    [ -n "$held" ] && break
    sleep 1
  done
  check "with the socket back, $a's SSH worker holds its session over the port again" test -n "$held"
}

# Whether PID $1 is gone (or a zombie awaiting its reaping): a killed worker.
confine_gone() { ! [ -e "/proc/$1" ] || grep -q '^State:[[:space:]]*Z' "/proc/$1/status" 2>/dev/null; }
export -f confine_gone

# stopped_workers_check A B: B's SSH worker, then its egress worker, is SIGSTOPped (hung, as a
# worker a guest wedged would be). Meanwhile A's execs and a checkpoint of A go on; B's exec
# fails within the SSH worker's answer deadline (10 s) and the worker is killed and replaced,
# the next exec of B working through a new one; B's egress worker misses a ping (every 5 s,
# answered within 10 s) and hostd kills it and starts another, which serves B's egress socket.
# A stopped worker is always sent SIGCONT before returning, so nothing later meets one.
stopped_workers_check() {
  local a=$1 b=$2 wpid epid npid lines t0 secs out rc ck
  vmctl exec "$b" true >/dev/null
  wpid=$(confine_ssh_worker "$b")
  check "$b has an SSH worker to stop (pid $wpid)" test -n "$wpid"
  if [ -n "$wpid" ]; then
    lines=$(wc -l < "$LOG")
    kill -STOP "$wpid"
    check "with $b's SSH worker stopped, $a's exec works" vmctl exec "$a" -- true
    ck=$(vmctl checkpoint "$a" --label stopped-neighbour 2> "$S/stopped-ck.err"); rc=$?
    check "and a checkpoint of $a is made" test "$rc" = 0 -a -n "$ck"
    [ "$TAP_FAILING" = 0 ] || diag "$(cat "$S/stopped-ck.err")"
    [ "$rc" = 0 ] && [ -n "$ck" ] && vmctl checkpoint rm "$a" "$ck" >/dev/null
    t0=$(date +%s%N)
    out=$(vmctl exec "$b" -- true 2>&1); rc=$?
    secs=$((($(date +%s%N) - t0) / 1000000000))
    echo "# stopped-ssh-worker-s: $secs"
    check "$b's exec fails within its deadline (exit $rc after $secs s, under 30 s), naming the replaced worker" \
      bash -c '[ "$1" != 0 ] && [ "$2" -lt 30 ] && grep -q "did not answer within .*replaced" <<< "$3$(tail -n +"$4" "$5")"' _ \
      "$rc" "$secs" "$out" "$((lines + 1))" "$LOG"
    [ "$TAP_FAILING" = 0 ] || diag "$out"
    for _ in $(seq 10); do confine_gone "$wpid" && break; sleep 0.5; done
    check "the stopped SSH worker was killed" confine_gone "$wpid"
    kill -CONT "$wpid" 2>/dev/null
    vmctl exec "$b" -- true >/dev/null 2>&1 || vmctl exec "$b" -- true >/dev/null 2>&1
    npid=$(confine_ssh_worker "$b")
    check "$b's next exec works through a new SSH worker (pid $npid)" \
      bash -c '[ -n "$1" ] && [ "$1" != "$2" ] && "$3" --socket "$4" exec "$5" -- true' _ \
      "$npid" "$wpid" "$VMCTL" "$SOCK" "$b"
  fi

  epid=$(confine_egress_worker "$b")
  check "$b has an egress worker to stop (pid $epid)" test -n "$epid"
  [ -n "$epid" ] || return 0
  lines=$(wc -l < "$LOG")
  kill -STOP "$epid"
  t0=$(date +%s%N)
  check "with $b's egress worker stopped, $a's exec works" vmctl exec "$a" -- true
  for _ in $(seq 60); do
    npid=$(confine_egress_worker "$b")
    [ -n "$npid" ] && [ "$npid" != "$epid" ] && confine_gone "$epid" && break
    sleep 0.5
  done
  secs=$((($(date +%s%N) - t0) / 1000000000))
  kill -CONT "$epid" 2>/dev/null
  echo "# stopped-egress-worker-s: $secs"
  check "hostd kills $b's stopped egress worker and starts another (pid $npid) within 30 s ($secs s), and logs it" \
    bash -c '[ -n "$1" ] && [ "$1" != "$2" ] && confine_gone "$2" && [ "$3" -lt 30 ] &&
             tail -n +"$4" "$5" | grep -q "egress worker of .$6. did not answer within .*killed and replaced" &&
             tail -n +"$4" "$5" | grep -q "egress worker of .$6. restarted (pid $1)"' _ \
    "$npid" "$epid" "$secs" "$((lines + 1))" "$LOG" "$b"
  check "$b's new egress worker listens on its egress socket" \
    bash -c '[ -n "$1" ] && ss -xlpH | grep -F "$2" | grep -q "pid=$1,"' _ "$npid" "$S/agents/$b/egress.sock"
}
