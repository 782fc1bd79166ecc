# Ports and the first commands after `new` on real agents; sourced, not run. Defines
# ports_check, which a VM suite calls after sourcing lib.sh and starting hostd (its range is the
# suite's, $CONF):
#
#   # shellcheck source=ports-check.sh
#   . "$(dirname "$0")/ports-check.sh"
#   ports_check
#
# Another program (a python3 listener, ended by its PID) holds the lowest free ports of the
# range; a second hostd (a state dir of its own, the same range and images) starts; both make an
# agent at the same moment, the first from its disk (--cold: its first boot, the path where hostd
# starts its SSH worker anew before new returns), the second from the warm image. Every `new`
# succeeds, on ports that differ and that the other program does not hold. Right after the first
# `new` returns, 10 execs go to it at once, one with 100 MB on stdin: all succeed, the checksum
# as sent. TAP through lib.sh's check and diag; uses $S, $CONF, $IMAGES, $HOSTD, $VMCTL. Removes
# both agents, the second hostd and the listener.

# _ports_hold CONF COUNT OUT: holds the COUNT lowest ports of CONF's range nothing listens on,
# listening, writes them (one line) to OUT, then sleeps until killed. Run in the background:
# exec, so that $! is python's own PID and the kill ends it (a python left behind would keep
# the suite's output open, and run-tests.sh's lane waiting).
_ports_hold() {
  exec python3 - "$@" <<'PY'
import socket, sys, time
conf, count, out = sys.argv[1], int(sys.argv[2]), sys.argv[3]
kv = dict(l.strip().split("=", 1) for l in open(conf) if "=" in l)
held = []
for port in range(int(kv["ssh-port-min"]), int(kv["ssh-port-max"]) + 1):
    s = socket.socket()
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        s.bind(("127.0.0.1", port))
        s.listen(1)
    except OSError:
        s.close()
        continue
    held.append(s)
    if len(held) == count:
        break
open(out, "w").write(" ".join(str(s.getsockname()[1]) for s in held) + "\n")
time.sleep(100000)
PY
}

ports_check() {
  local s2 hold_pid hostd2_pid held p1 p2 rc1 rc2 i
  s2=$(mktemp -d -t pc2.XXXXXX)
  chmod 711 "$s2"
  sed "s|^images-dir=.*|images-dir=$IMAGES|" "$CONF" > "$s2/hostd.conf"
  _ports_hold "$CONF" 4 "$s2/held" &
  hold_pid=$!
  for _ in $(seq 1 50); do [ -s "$s2/held" ] && break; sleep 0.1; done
  held=$(cat "$s2/held" 2>/dev/null)
  diag "another program holds ports $held"

  "$HOSTD" --config "$s2/hostd.conf" --state-dir "$s2" --socket "$s2/hostd.sock" \
    >> "$s2/hostd.log" 2>&1 &
  hostd2_pid=$!
  for _ in $(seq 1 100); do
    "$VMCTL" --socket "$s2/hostd.sock" list >/dev/null 2>&1 && break
    sleep 0.2
  done

  vmctl -q new p1 --cold > "$s2/new-p1.out" 2>&1 &
  p1=$!
  "$VMCTL" --socket "$s2/hostd.sock" -q new p2 > "$s2/new-p2.out" 2>&1 &
  p2=$!
  wait "$p1"; rc1=$?
  # Right after new returns: ten commands at once, one with 100 MB of stdin.
  head -c 100000000 /dev/urandom > "$s2/big"
  local want pids=()
  want=$(sha256sum < "$s2/big" | cut -d' ' -f1)
  if [ "$rc1" = 0 ]; then
    (vmctl exec p1 -- sha256sum < "$s2/big" > "$s2/exec-big.out" 2>&1) &
    pids+=($!)
    for i in $(seq 1 9); do
      (vmctl exec p1 -- sh -c "echo n$i" > "$s2/exec-$i.out" 2>&1; echo $? > "$s2/exec-$i.rc") &
      pids+=($!)
    done
    wait "${pids[@]}"
  fi
  wait "$p2"; rc2=$?
  check "two hostds on one range, ports held by another program: both agents made at once" \
    test "$rc1$rc2" = 00
  [ "$rc1$rc2" = 00 ] || diag "$(cat "$s2"/new-p*.out)"
  local port1 port2
  port1=$(vmctl --json info p1 2>/dev/null | python3 -c 'import json,sys; print(json.load(sys.stdin)["ssh_port"])')
  port2=$("$VMCTL" --socket "$s2/hostd.sock" --json info p2 2>/dev/null |
    python3 -c 'import json,sys; print(json.load(sys.stdin)["ssh_port"])')
  diag "p1 on $port1, p2 on $port2"
  check "their ports differ, and are none of the other program's" \
    bash -c "[ -n '$port1' ] && [ -n '$port2' ] && [ '$port1' != '$port2' ] &&
             ! grep -qw -e '$port1' -e '$port2' <<< '$held'"
  check "ten execs at once right after new: the one with 100 MB of stdin gets it whole" \
    test "$(cut -d' ' -f1 "$s2/exec-big.out" 2>/dev/null)" = "$want"
  [ "$(cut -d' ' -f1 "$s2/exec-big.out" 2>/dev/null)" = "$want" ] || diag "$(head -c 500 "$s2/exec-big.out")"
  local bad=0
  for i in $(seq 1 9); do
    if [ "$(cat "$s2/exec-$i.rc" 2>/dev/null)" != 0 ] || [ "$(cat "$s2/exec-$i.out")" != "n$i" ]; then
      bad=$((bad + 1))
      diag "exec $i: $(head -c 300 "$s2/exec-$i.out" 2>/dev/null)"
    fi
  done
  check "ten execs at once right after new: the nine others succeed" test "$bad" = 0

  vmctl rm --force p1 >/dev/null 2>&1
  "$VMCTL" --socket "$s2/hostd.sock" rm --force p2 >/dev/null 2>&1
  kill "$hostd2_pid" 2>/dev/null
  wait "$hostd2_pid" 2>/dev/null
  kill "$hold_pid" 2>/dev/null
  wait "$hold_pid" 2>/dev/null
  local d
  for d in $(virsh -c "qemu:///embed?root=$s2/libvirt" list --name 2>/dev/null); do
    virsh -c "qemu:///embed?root=$s2/libvirt" destroy "$d" >/dev/null 2>&1
  done
  rm -rf "$s2"
}
