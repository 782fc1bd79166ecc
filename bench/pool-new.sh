#!/bin/bash
# bench/pool-new: `vmctl new` to the first command's answer from the template's warm pool
# (hostd.conf `pool = 1`: a machine restored from the warm image waits, paused) against the same
# from the warm image with no pool, and one cold `vmctl new --cold`, all in the same run; medians
# of N (3). Rounds alternate: hostd runs with pool = 0 for the warm new, then with pool = 1,
# waiting for its machine, for the pooled one; every agent is removed once measured, so no agent
# runs beside a new one but the first of a pair. Goals: pooled new <= 0.01x of a cold new; a new
# with no machine waiting no slower than a warm new without a pool: each round also times a second
# new right after the first, with the pool just emptied by the first and without a pool. Also
# hostd's log line of each (its phases), and what a waiting machine holds (its QEMU's RSS). KSM is
# off (hostd.conf ksm): its scans would take CPU from both sides.
#
# Usage: bench/pool-new.sh [N]   (as root, after `meson setup build && ninja -C build`; the
# debian-12 image and its warm image from $VM_TEST_IMAGE_CACHE are hard-linked into a private
# images dir, or built; SSH ports 44900-44999; ~5 min under TCG with the warm image built)
set -euo pipefail
cd "$(dirname "$0")/.."
N=${1:-3}
VMCTL=${VMCTL:-./build/vmctl/vmctl}
HOSTD=${HOSTD:-./build/hostd/hostd}

S=$(mktemp -d -t vmp.XXXXXX); chmod 711 "$S"
mkdir -p "$S/images"
CACHE=${VM_TEST_IMAGE_CACHE:-}
if [ -n "$CACHE" ] && [ -f "$CACHE/debian-12/image.ini" ]; then cp -al "$CACHE/debian-12" "$S/images/"; fi
# write_conf POOL: hostd.conf with the warm pool's size; ids of their own (another hostd on this
# host takes agent and worker ids from the defaults).
write_conf() {
  cat > "$S/hostd.conf" <<CONF
[hostd]
images-dir=$S/images
ssh-port-min=44900
ssh-port-max=44999
metrics-listen=off
agent-ids=1881008000-1881008999
worker-ids=1881009000-1881011999
pool=$1
ksm=off
CONF
}
export VMCTL_SOCKET=$S/hostd.sock
HOSTD_PID=
AGENTS=()

cleanup() {
  local rc=$? i
  set +e
  [ "$rc" -ne 0 ] && tail -n 20 "$S/hostd.log" >&2
  for ((i = ${#AGENTS[@]} - 1; i >= 0; i--)); do "$VMCTL" rm --force "${AGENTS[$i]}" >/dev/null 2>&1; done
  [ -n "$HOSTD_PID" ] && { kill "$HOSTD_PID"; wait "$HOSTD_PID" 2>/dev/null; }
  rm -rf "$S"
  exit "$rc"
}
trap cleanup EXIT

# start_hostd POOL: (re)starts hostd with that pool; with a pool, waits until its machine waits.
start_hostd() {
  if [ -n "$HOSTD_PID" ]; then kill "$HOSTD_PID"; wait "$HOSTD_PID" 2>/dev/null || true; fi
  write_conf "$1"
  "$HOSTD" --config "$S/hostd.conf" --state-dir "$S" >> "$S/hostd.log" 2>&1 &
  HOSTD_PID=$!
  for _ in $(seq 1 150); do "$VMCTL" list >/dev/null 2>&1 && break; sleep 0.2; done
  [ "$1" = 0 ] && return 0
  for _ in $(seq 1 300); do
    "$VMCTL" template list | grep -qE "^debian-12 +yes +yes +$1/$1 " && return 0
    sleep 0.2
  done
  echo "the pool did not fill in 60 s" >&2
  return 1
}

now() { date +%s%N; }
ms_since() { echo $(( ($(now) - $1) / 1000000 )); }
median() { sort -n | awk '{a[NR]=$1} END {print (NR%2)?a[(NR+1)/2]:(a[NR/2]+a[NR/2+1])/2}'; }
# new_then_exec NAME [NEW-OPTIONS...]: prints the ms from `vmctl new` to `vmctl exec NAME true`
# (run in $(...): the caller adds NAME to AGENTS first, for the cleanup to find it).
new_then_exec() {
  local name=$1 t0
  shift
  t0=$(now)
  "$VMCTL" new "$name" "$@" >/dev/null 2>"$S/new.err" || { cat "$S/new.err" >&2; return 1; }
  "$VMCTL" exec "$name" -- true
  ms_since "$t0"
}

start_hostd 0
echo "building the warm image"
"$VMCTL" template build debian-12 | tail -n 1
AGENTS+=(c1)
cold=$(new_then_exec c1 --cold)
"$VMCTL" rm --force c1 >/dev/null
echo "  cold new + first exec $cold ms"

warm=() warm2=() pooled=() empty=()
for i in $(seq 1 "$N"); do
  start_hostd 0
  AGENTS+=("w$i" "v$i" "p$i" "e$i")
  warm+=("$(new_then_exec "w$i")")
  # The second of two news in a row, as eK below is: the first agent's guest still settles.
  warm2+=("$(new_then_exec "v$i")")
  "$VMCTL" rm --force "w$i" >/dev/null
  "$VMCTL" rm --force "v$i" >/dev/null
  start_hostd 1
  if [ "$i" = 1 ]; then
    # What a waiting machine holds: its paused QEMU's resident memory.
    pid=$(pgrep -f "guest=pool\." | head -n 1 || true)
    rss=$([ -n "$pid" ] && awk '/^VmRSS:/ {print int($2 / 1024)}' "/proc/$pid/status" || echo "?")
  fi
  pooled+=("$(new_then_exec "p$i")")
  grep -q "agent 'p$i': made from the warm pool's machine" "$S/hostd.log" ||
    { echo "p$i was not made from the pool" >&2; exit 1; }
  [ "$("$VMCTL" exec "p$i" -- hostname)" = "p$i" ] || { echo "p$i has another hostname" >&2; exit 1; }
  # The pool is empty until p$i is made and its machine restored again: a new now restores.
  empty+=("$(new_then_exec "e$i")")
  "$VMCTL" rm --force "p$i" >/dev/null
  "$VMCTL" rm --force "e$i" >/dev/null
  echo "  run $i: warm new ${warm[-1]} ms, from the pool ${pooled[-1]} ms; right after another: warm ${warm2[-1]} ms, with the pool emptied ${empty[-1]} ms"
done

mw=$(printf '%s\n' "${warm[@]}" | median)
mv=$(printf '%s\n' "${warm2[@]}" | median)
mp=$(printf '%s\n' "${pooled[@]}" | median)
me=$(printf '%s\n' "${empty[@]}" | median)
ratio() { awk -v a="$1" -v b="$2" 'BEGIN {printf "%.3f", a / b}'; }
echo "new to first command (median of $N): cold $cold ms, warm $mw ms ($(ratio "$mw" "$cold")x), from the pool $mp ms ($(ratio "$mp" "$cold")x of cold, $(ratio "$mp" "$mw")x of warm; goal <= 0.01x of cold: $(awk -v a="$mp" -v b="$cold" 'BEGIN {print (a <= 0.01 * b) ? "PASS" : "MISS"}'))"
echo "right after another new: with the pool just emptied $me ms, warm without a pool $mv ms ($(ratio "$me" "$mv")x; goal: no slower)"
echo "a waiting machine's QEMU RSS: $rss MiB"
echo "phases (hostd's log):"
grep -E "restored from|made from the warm pool" "$S/hostd.log" |
  sed -E "s/^.*agent .([a-z0-9]*).: (restored from [^ ]*|made from the warm pool's machine [^ ]*) in /  \1: /"
grep "pool debian-12: machine" "$S/hostd.log" | sed -E 's/^.*(machine pool\.[0-9a-f]* waits)/  \1/'
