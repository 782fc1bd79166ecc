#!/bin/bash
# shellcheck disable=SC2016 # the single-quoted scripts are expanded in the guest
# bench/checkpoint: how long `vmctl checkpoint` takes on a running agent with 1 GiB and with
# 8 GiB written to its disk (goal: ratio <= 1.2, the time must not grow with the data), against
# libvirt's internal snapshot (`virsh snapshot-create-as`, RAM included) of the same VM at the
# same points (goal: ours >= 20x faster), and how long the guest sees its filesystem frozen
# (goal: < 100 ms).
#
# The freeze is measured inside the guest: a loop appends a timestamp to a file on the root
# filesystem about every millisecond, so while the filesystem is frozen its writes block and
# the stamps stop. The largest gap between stamps in a window holding a checkpoint is compared
# with the largest gap in an equal window without one. The guest's clock stands still while
# QEMU has its vCPUs stopped, so such a stop would not show there; a disk-only snapshot does not
# stop them. libvirt's internal snapshot does (savevm): its stall is shown as how far the
# guest's clock fell behind the host's across it.
#
# hostd holds the embedded libvirt root and only one process may, so hostd is stopped for the
# internal snapshot (agents keep running without it) and started again afterwards.
#
# Usage: bench/checkpoint.sh [N] [--freeze-only]   (as root, after `meson setup build && ninja -C build`)
# --freeze-only skips the writes and libvirt's snapshots: the freeze, its trace and its floor,
# in a few minutes rather than most of an hour under TCG.
set -euo pipefail
cd "$(dirname "$0")/.."
N=${1:-5}
FREEZE_ONLY=0
[ "${2:-}" = --freeze-only ] && FREEZE_ONLY=1
VMCTL=${VMCTL:-./build/vmctl/vmctl}
HOSTD=${HOSTD:-./build/hostd/hostd}
A=ckbench
W=4 # seconds per window of the freeze measurement

S=$(mktemp -d -t vmc.XXXXXX); chmod 711 "$S"
IMAGES=${VM_TEST_IMAGE_CACHE:-$S/images}
URI="qemu:///embed?root=$S/libvirt"
printf '[hostd]\nimages-dir=%s\nssh-port-min=43600\nssh-port-max=43699\n' "$IMAGES" \
  > "$S/hostd.conf"
export VMCTL_SOCKET=$S/hostd.sock
HOSTD_PID=

start_hostd() {
  # --debug: a trace of each checkpoint's phases, the freeze among them, summed up at the end.
  "$HOSTD" --config "$S/hostd.conf" --state-dir "$S" --debug >> "$S/hostd.log" 2>&1 &
  HOSTD_PID=$!
  for _ in $(seq 1 150); do "$VMCTL" list >/dev/null 2>&1 && return 0; sleep 0.2; done
  echo "hostd did not answer:" >&2; tail -5 "$S/hostd.log" >&2; return 1
}
stop_hostd() { kill "$HOSTD_PID"; wait "$HOSTD_PID" 2>/dev/null || true; HOSTD_PID=; }
cleanup() {
  if [ -n "$HOSTD_PID" ]; then
    "$VMCTL" rm --force "$A" >/dev/null 2>&1 || true
    stop_hostd
  else
    virsh -c "$URI" destroy "$A" >/dev/null 2>&1 || true
  fi
  # whatever QEMU still runs on this state directory (a failure while hostd was stopped)
  for pid in $(ps -eo pid=,args= | awk -v s="$S/" 'index($0, s) && /qemu-system/ {print $1}'); do
    kill "$pid" 2>/dev/null || true
  done
  rm -rf "$S"
}
trap cleanup EXIT

now() { date +%s%N; }
median() { sort -n | awk '{a[NR]=$1} END {print (NR%2)?a[(NR+1)/2]:(a[NR/2]+a[NR/2+1])/2}'; }
note() { echo "# $*" >&2; }
sleep_until() { # NS since the epoch
  local d=$(( ($1 - $(now)) / 1000000 ))
  if (( d > 0 )); then sleep "$(awk -v d="$d" 'BEGIN {print d / 1000}')"; fi
}
checkpoint_ms() {
  local t0; t0=$(now)
  "$VMCTL" -q checkpoint "$A" >/dev/null
  echo $(( ($(now) - t0) / 1000000 ))
}
guest_offset_s() { # the guest's clock minus the host's, give or take half an exec
  local h0 g h1
  h0=$(now); g=$("$VMCTL" exec "$A" -- bash -c 'echo $EPOCHREALTIME'); h1=$(now)
  awk -v g="$g" -v h0="$h0" -v h1="$h1" 'BEGIN {printf "%.2f\n", g - (h0 + h1) / 2e9}'
}

# Writes GIB GiB of incompressible data to a new file FILE in the guest; prints seconds.
# O_DIRECT from a file in RAM: through a pipe and the page cache the same data took ten times
# as long under TCG.
write_gib() { # GIB FILE
  local t0; t0=$(now)
  "$VMCTL" exec "$A" -- bash -c 'head -c 64M /dev/urandom > /dev/shm/chunk
    for _ in $(seq $((16 * $1))); do
      dd if=/dev/shm/chunk of="$2" bs=16M oflag=direct,append conv=notrunc,fsync status=none
    done
    rm /dev/shm/chunk' write "$1" "$2"
  echo $(( ($(now) - t0) / 1000000000 ))
}

# libvirt's internal snapshot with RAM, taken and deleted with hostd stopped. Appends to INT_MS
# (or "refused", with libvirt's reason on stderr), INT_STALL and INT_RAM (the RAM it wrote).
# Not in a subshell: it restarts hostd, whose PID the cleanup needs.
INT_MS=(); INT_STALL=(); INT_RAM=()
internal_snapshot() {
  local before after t0 err top
  before=$(guest_offset_s)
  stop_hostd
  t0=$(now)
  if ! err=$(virsh -c "$URI" snapshot-create-as "$A" bench-internal 2>&1 >/dev/null); then
    start_hostd
    echo "libvirt refused the internal snapshot: $err" >&2
    INT_MS+=(refused); INT_STALL+=(0); INT_RAM+=(0)
    return
  fi
  INT_MS+=($(( ($(now) - t0) / 1000000 )))
  top=$(virsh -c "$URI" domblklist "$A" | awk '$1 == "vda" {print $2}')
  INT_RAM+=("$(qemu-img snapshot -U -l "$top" | awk '$2 == "bench-internal" {print $3 $4}')")
  virsh -c "$URI" snapshot-delete "$A" bench-internal >/dev/null
  start_hostd
  after=$(guest_offset_s)
  INT_STALL+=("$(awk -v b="$before" -v a="$after" 'BEGIN {printf "%.1f", b - a}')")
}

round() { # N timed checkpoints; prints the times in ms
  local t=()
  for _ in $(seq 1 "$N"); do t+=("$(checkpoint_ms)"); done
  echo "${t[@]}"
}

start_hostd
"$VMCTL" -q template build debian-12 >/dev/null
t0=$(now)
"$VMCTL" -q new --disk 16 "$A" >/dev/null
boot_s=$(( ($(now) - t0) / 1000000000 ))
"$VMCTL" idle "$A" --never >/dev/null
"$VMCTL" autocheckpoint "$A" --never >/dev/null

if (( ! FREEZE_ONLY )); then
  note "booted in ${boot_s}s; writing 1 GiB"
  w1=$(write_gib 1 fill-1)
  note "wrote 1 GiB in ${w1}s; internal snapshot"
  internal_snapshot
  note "checkpoints at 1 GiB"
  r1=$(round)

  note "writing 7 GiB more"
  w2=$(write_gib 7 fill-2)
  note "wrote 7 GiB in ${w2}s; internal snapshot"
  internal_snapshot
  note "checkpoints at 8 GiB"
  r2=$(round)
fi

# The freeze: a stamp loop over 2N windows of W s; checkpoint k is taken a quarter into
# window 2k+1, so the even windows are the baseline. The host knows when the loop started to
# within one exec, which the quarter window covers.
note "freeze: $N checkpoints over $((2 * N * W))s of guest writes"
LOOP='f=$HOME/stamps; : > "$f"; exec 3<> <(:)
end=$(( ${EPOCHREALTIME/./} + $1 * 1000000 ))
while (( ${EPOCHREALTIME/./} < end )); do echo "$EPOCHREALTIME" >> "$f"; read -t 0.001 -u 3; done'
h0=$(now)
"$VMCTL" exec "$A" -- bash -c 'setsid bash -c "$1" loop "$2" </dev/null >/dev/null 2>&1 &' \
  start "$LOOP" $((2 * N * W))
hm=$(( (h0 + $(now)) / 2 ))
r3=()
for k in $(seq 0 $((N - 1))); do
  sleep_until $(( hm + ((2 * k + 1) * W * 1000 + W * 250) * 1000000 ))
  r3+=("$(checkpoint_ms)")
done
sleep_until $(( hm + (2 * N * W + 2) * 1000000000 ))
"$VMCTL" exec "$A" -- cat stamps > "$S/stamps"
gaps=$(awk -v w="$W" -v n=$((2 * N)) '
  NR == 1 {first = $1}
  NR > 1 {j = int((p - first) / w); if (j < n && $1 - p > mx[j]) mx[j] = $1 - p}
  {p = $1}
  END {for (j = 0; j < n; j++) printf "%d %.1f\n", j % 2, mx[j] * 1000}' "$S/stamps")
frozen=$(awk '$1 == 1 {print $2}' <<< "$gaps" | tr '\n' ' ')
idle=$(awk '$1 == 0 {print $2}' <<< "$gaps" | tr '\n' ' ')
stamps=$(wc -l < "$S/stamps")

# The floor under the freeze: the guest's journal commit inside it ends in a flush of the disk,
# which is an fdatasync of the overlay on the host; libvirt's switch writes the domain's status
# with fsync too. Both measured alone: the host's flush of 4 KiB in the state directory, and a
# guest `sync` with nothing left to write (medians of 10).
host_flush=$(python3 - "$S" <<'PY'
import os, statistics, sys, time
path = os.path.join(sys.argv[1], "flush-probe")
fd = os.open(path, os.O_WRONLY | os.O_CREAT, 0o600)
times = []
for _ in range(10):
    os.pwrite(fd, b"x" * 4096, 0)
    t0 = time.monotonic()
    os.fdatasync(fd)
    times.append((time.monotonic() - t0) * 1000)
os.close(fd)
os.unlink(path)
print("%.1f" % statistics.median(times))
PY
)
guest_sync=$("$VMCTL" exec "$A" -- bash -c 'sync; for i in 1 2 3 4 5 6 7 8 9 10; do
  t0=$EPOCHREALTIME; sync; t1=$EPOCHREALTIME; echo "$t0 $t1"; done' |
  awk '{print ($2 - $1) * 1000}' | sort -n | awk '{a[NR] = $1} END {printf "%.1f", (a[5] + a[6]) / 2}')

json=$("$VMCTL" checkpoints --json "$A")
total=$(grep -c '"quiesced"' <<< "$json" || true)
unfrozen=$(grep -c '"quiesced" : false' <<< "$json" || true)
held=$(awk -F: '/"bytes"/ {b += $2} END {printf "%.1f", b / 2^30}' <<< "$json")

m3=$(printf '%s\n' "${r3[@]}" | median)
f=$(tr ' ' '\n' <<< "$frozen" | grep . | median)
b=$(tr ' ' '\n' <<< "$idle" | grep . | median)
fmax=$(tr ' ' '\n' <<< "$frozen" | grep . | sort -n | tail -1)

if (( ! FREEZE_ONLY )); then
  m1=$(tr ' ' '\n' <<< "$r1" | median)
  m2=$(tr ' ' '\n' <<< "$r2" | median)
  echo "agent: 2 vCPUs, 1 GiB RAM, 16 GiB disk; booted in ${boot_s}s;" \
    "wrote 1 GiB in ${w1}s, 7 GiB more in ${w2}s"
  echo "vmctl checkpoint (median of $N, ms): 1 GiB written $m1 [$r1] | 8 GiB written $m2 [$r2]"
  awk -v a="$m1" -v b="$m2" 'BEGIN {printf "ratio 8 GiB/1 GiB %.2fx (goal <= 1.2)\n", b / a}'
  for i in 0 1; do
    if (( i )); then gib=8; ours=$m2; else gib=1; ours=$m1; fi
    if [ "${INT_MS[i]}" = refused ]; then
      echo "libvirt internal snapshot at $gib GiB: refused (reason above)"
      continue
    fi
    awk -v g="$gib" -v i="${INT_MS[i]}" -v s="${INT_STALL[i]}" -v r="${INT_RAM[i]}" \
      -v o="$ours" 'BEGIN {
      printf "libvirt internal snapshot at %d GiB: %d ms (RAM %s), ", g, i, r
      printf "guest stopped ~%.1f s; ", s
      printf "ours is %.1fx faster (goal >= 20)\n", i / o }'
  done
fi
echo "guest-visible freeze, largest gap between ~1 ms stamps per ${W}s window" \
  "(ms; $stamps stamps):"
echo "  with a checkpoint: $frozen(median $f, max $fmax) | without: $idle(median $b)"
echo "  checkpoint times meanwhile (ms): ${r3[*]} (median $m3)"
awk -v f="$f" -v b="$b" \
  'BEGIN {printf "freeze median %.0f ms, baseline %.0f ms (goal < 100)\n", f, b}'
echo "  the floor: the host disk's flush $host_flush ms, a guest sync with nothing to write" \
  "$guest_sync ms (median of 10 each)"
echo "checkpoints taken: $total, not frozen (crash-consistent): $unfrozen;" \
  "their images hold $held GiB"
# Where a checkpoint's time goes (hostd --debug traces): medians per phase, the freeze being
# "filesystems frozen" (the guest agent's freeze, its sync included), "disk switched" and "thawed".
python3 bench/trace-summary.py "checkpoint phases, freeze windows" "trace: checkpoint $A:" \
  "$N" < "$S/hostd.log"
