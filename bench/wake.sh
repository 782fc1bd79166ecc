#!/bin/bash
# bench/wake: time from "wake me" to the first command's output, for a paused and for a saved
# agent, against a cold boot of the same agent in the same run; and the host RAM (QEMU RSS) of a
# running, a paused and a saved agent. Goals: paused < 0.01x, saved < 0.05x of a cold boot; saved
# RSS 0.
#
# Usage: bench/wake.sh [N]   (as root, after `meson setup build && ninja -C build`)
set -euo pipefail
cd "$(dirname "$0")/.."
N=${1:-3}
VMCTL=${VMCTL:-./build/vmctl/vmctl}
HOSTD=${HOSTD:-./build/hostd/hostd}

S=$(mktemp -d -t vmw.XXXXXX); chmod 711 "$S"
IMAGES=${VM_TEST_IMAGE_CACHE:-$S/images}
printf '[hostd]\nimages-dir=%s\nssh-port-min=43400\nssh-port-max=43499\n' "$IMAGES" > "$S/hostd.conf"
# --debug: a trace of each exec's phases, the wake among them, summed up at the end.
"$HOSTD" --config "$S/hostd.conf" --state-dir "$S" --debug > "$S/hostd.log" 2>&1 &
HOSTD_PID=$!
export VMCTL_SOCKET=$S/hostd.sock
trap '"$VMCTL" rm --force wake >/dev/null 2>&1; kill $HOSTD_PID; wait $HOSTD_PID 2>/dev/null; rm -rf "$S"' EXIT
for _ in $(seq 1 100); do "$VMCTL" list >/dev/null 2>&1 && break; sleep 0.2; done
"$VMCTL" -q template build debian-12 >/dev/null
"$VMCTL" -q new wake >/dev/null
"$VMCTL" idle wake --never >/dev/null

now() { date +%s%N; }
rss_kib() { # QEMU's resident memory for the agent, 0 when it has no process
  local pid; pid=$(ps -C qemu-system-x86_64 -o pid=,args= | awk '/guest=wake,/ {print $1}')
  [ -n "$pid" ] && awk '/VmRSS/ {print $2}' "/proc/$pid/status" || echo 0
}
median() { sort -n | awk '{a[NR]=$1} END {print (NR%2)?a[(NR+1)/2]:(a[NR/2]+a[NR/2+1])/2}'; }
first_command_ms() { local t0; t0=$(now); "$VMCTL" exec wake -- true; echo $(( ($(now) - t0) / 1000000 )); }

"$VMCTL" exec wake -- true
rss_running=$(rss_kib)
paused=(); saved=(); cold=(); read_ms=(); direct_ms=()
for _ in $(seq 1 "$N"); do
  # An agent is paused or saved once idle: what the exec before started in it (the spare shell
  # of its session) has long settled.
  sleep 2
  "$VMCTL" suspend wake >/dev/null; rss_paused=$(rss_kib)
  paused+=("$(first_command_ms)")
  sleep 2
  "$VMCTL" suspend --save wake >/dev/null; rss_saved=$(rss_kib)
  # The disk's part of a restore: reading the saved image once, as the restore will.
  image=$(find "$S" -name 'wake.save' -print -quit)
  t0=$(now); cat "$image" > /dev/null; read_ms+=($(( ($(now) - t0) / 1000000 )))
  # The same from the disk itself, past the page cache.
  t0=$(now); dd if="$image" of=/dev/null bs=4M iflag=direct 2>/dev/null
  direct_ms+=($(( ($(now) - t0) / 1000000 )))
  image_mib=$(( $(stat -c %s "$image") / 1048576 ))
  saved+=("$(first_command_ms)")
  "$VMCTL" stop wake >/dev/null
  t0=$(now); "$VMCTL" -q start wake >/dev/null; "$VMCTL" exec wake -- true
  cold+=($(( ($(now) - t0) / 1000000 )))
done
p=$(printf '%s\n' "${paused[@]}" | median)
s=$(printf '%s\n' "${saved[@]}" | median)
c=$(printf '%s\n' "${cold[@]}" | median)
echo "wake to first command (median of $N, ms): paused $p | saved $s | cold boot $c"
awk -v p="$p" -v s="$s" -v c="$c" 'BEGIN {
  printf "ratio paused/cold %.4fx (goal < 0.01)\n", p / c
  printf "ratio saved/cold  %.4fx (goal < 0.05)\n", s / c
}'
r=$(printf '%s\n' "${read_ms[@]}" | median)
d=$(printf '%s\n' "${direct_ms[@]}" | median)
echo "saved image: $image_mib MiB, read in $r ms from the page cache ($(( image_mib * 1000 / (r > 0 ? r : 1) )) MiB/s), $d ms from the disk (O_DIRECT, $(( image_mib * 1000 / (d > 0 ? d : 1) )) MiB/s): what the disk allows a restore"
echo "QEMU RSS: running $((rss_running / 1024)) MiB | paused $((rss_paused / 1024)) MiB | saved $((rss_saved / 1024)) MiB (goal 0)"
# Where the time of a wake goes (hostd --debug traces of the waking execs): medians per phase.
python3 bench/trace-summary.py "wake from paused" "trace: exec wake: .*, resume " < "$S/hostd.log"
python3 bench/trace-summary.py "wake from saved" "trace: exec wake: .*restore saved image" < "$S/hostd.log"
