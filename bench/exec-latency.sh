#!/bin/bash
# bench/exec-latency: `vmctl exec A true` against OpenSSH `ssh true` to the same VM, cold (a new
# connection each time) and multiplexed (ControlMaster), medians of N runs, as ratios measured
# in the same run. Goals: <= 0.1x cold OpenSSH, <= 0.8x multiplexed OpenSSH.
# Each is measured twice: commands $PAUSE s apart (0.4 by default), as an agent's commands come
# (each one finds the spare shell the one before left ready), and back to back (each waits for
# the spare the one before started: sshd's fork and bash's start in the guest). `/bin/true` is
# measured too: `true` is a bash builtin, so a spare runs it without starting any program.
#
# Usage: bench/exec-latency.sh [N]   (as root, after `meson setup build && ninja -C build`)
# SSH_WORKER=off runs the hostd it starts with its SSH client inside hostd (ssh-worker = off), to
# compare against the default, each agent's client in its confined worker.
# Uses an existing hostd when $VMCTL_SOCKET answers and $BENCH_AGENT names a running agent;
# otherwise starts its own hostd in a temp state dir and boots an agent (about a minute).
set -euo pipefail
cd "$(dirname "$0")/.."
N=${1:-20}
PAUSE=${PAUSE:-0.4}
VMCTL=${VMCTL:-./build/vmctl/vmctl}
HOSTD=${HOSTD:-./build/hostd/hostd}
OWN=
S=

if [ -n "${BENCH_AGENT:-}" ] && "$VMCTL" info "$BENCH_AGENT" >/dev/null 2>&1; then
  A=$BENCH_AGENT
else
  S=$(mktemp -d -t vmb.XXXXXX); chmod 711 "$S"
  IMAGES=${VM_TEST_IMAGE_CACHE:-$S/images}
  printf '[hostd]\nimages-dir=%s\nssh-port-min=43300\nssh-port-max=43399\nssh-worker=%s\n' \
    "$IMAGES" "${SSH_WORKER:-on}" > "$S/hostd.conf"
  # --debug: one trace line per exec, summed up below.
  "$HOSTD" --config "$S/hostd.conf" --state-dir "$S" --debug > "$S/hostd.log" 2>&1 &
  OWN=$!
  export VMCTL_SOCKET=$S/hostd.sock
  for _ in $(seq 1 100); do "$VMCTL" list >/dev/null 2>&1 && break; sleep 0.2; done
  trap '"$VMCTL" rm --force bench >/dev/null 2>&1; kill $OWN; wait $OWN 2>/dev/null; rm -rf "$S"' EXIT
  "$VMCTL" template build debian-12 >/dev/null
  "$VMCTL" new bench >/dev/null
  A=bench
fi

CFG=$(mktemp); CTL=$(mktemp -u -t vmb-ctl.XXXXXX)
"$VMCTL" ssh-config "$A" > "$CFG"
HOST=vmctl-$A

now() { date +%s%N; }
measure() { # measure PAUSE COMMAND... -> prints N durations in us, PAUSE s before each
  local t0 t1 pause=$1
  shift
  for _ in $(seq 1 "$N"); do
    sleep "$pause"
    t0=$(now); "$@" >/dev/null; t1=$(now)
    echo $(( (t1 - t0) / 1000 ))
  done
}
median() { sort -n | awk '{a[NR]=$1} END {m=(NR%2)?a[(NR+1)/2]:(a[NR/2]+a[NR/2+1])/2; printf "%.1f", m/1000}'; }

"$VMCTL" exec "$A" true  # warm hostd's pooled session, as a long-running hostd has it
vmctl_ms=$(measure "$PAUSE" "$VMCTL" exec "$A" true | median)
vmctl_prog_ms=$(measure "$PAUSE" "$VMCTL" exec "$A" /bin/true | median)
vmctl_b2b_ms=$(measure 0 "$VMCTL" exec "$A" true | median)
cold_ms=$(measure "$PAUSE" ssh -F "$CFG" -o BatchMode=yes -o ControlPath=none "$HOST" true | median)
ssh -F "$CFG" -o BatchMode=yes -o ControlMaster=yes -o ControlPath="$CTL" -o ControlPersist=60 -fN "$HOST"
mux=(ssh -F "$CFG" -o BatchMode=yes -o ControlPath="$CTL" "$HOST")
mux_ms=$(measure "$PAUSE" "${mux[@]}" true | median)
mux_prog_ms=$(measure "$PAUSE" "${mux[@]}" /bin/true | median)
mux_b2b_ms=$(measure 0 "${mux[@]}" true | median)
ssh -F "$CFG" -o ControlPath="$CTL" -O exit "$HOST" 2>/dev/null || true
rm -f "$CFG"

echo "exec-latency (median of $N, ms, $PAUSE s apart): vmctl exec $vmctl_ms | ssh cold $cold_ms | ssh multiplexed $mux_ms"
echo "  /bin/true: vmctl exec $vmctl_prog_ms | ssh multiplexed $mux_prog_ms"
echo "  back to back: vmctl exec $vmctl_b2b_ms | ssh multiplexed $mux_b2b_ms"
awk -v v="$vmctl_ms" -v c="$cold_ms" -v m="$mux_ms" -v vp="$vmctl_prog_ms" -v mp="$mux_prog_ms" \
    -v vb="$vmctl_b2b_ms" -v mb="$mux_b2b_ms" 'BEGIN {
  printf "ratio vmctl/ssh-cold        %.2fx (goal <= 0.10); back to back %.2fx\n", v / c, vb / c
  printf "ratio vmctl/ssh-multiplexed %.2fx (goal <= 0.80); back to back %.2fx; /bin/true %.2fx\n", v / m, vb / mb, vp / mp
}'
# Where hostd's part of an exec went (hostd --debug traces): the median of each phase.
if [ -n "$S" ]; then
  # The first N traces are the `true` runs $PAUSE s apart, the last N those back to back.
  python3 bench/trace-summary.py "hostd trace, $PAUSE s apart" "trace: exec $A:" "$N" < <(grep "trace: exec $A:" "$S/hostd.log" | head -n $((N + 1)) | tail -n "$N")
  python3 bench/trace-summary.py "hostd trace, back to back" "trace: exec $A:" "$N" < <(grep "trace: exec $A:" "$S/hostd.log" | tail -n "$N")
fi
