#!/bin/bash
# bench/instant: `vmctl new` to the first command's answer from the template's warm image
# against a cold `vmctl new --cold`, and `vmctl fork --live` against a cold fork, all in the
# same run, medians of N (3). Then the host memory of 5 warm agents (QEMU's RSS, summed, and the
# host's used memory before and after). Goals: warm new <= 0.1x cold new, live fork <= 0.1x cold
# fork. hostd's log line for each restore gives its phases (copy, restore, guest agent, identity).
#
# Usage: bench/instant.sh [N]   (as root, after `meson setup build && ninja -C build`; the
# debian-12 image from $VM_TEST_IMAGE_CACHE is hard-linked into a private images dir, or built;
# takes ~15 min under TCG)
set -euo pipefail
cd "$(dirname "$0")/.."
N=${1:-3}
VMCTL=${VMCTL:-./build/vmctl/vmctl}
HOSTD=${HOSTD:-./build/hostd/hostd}

S=$(mktemp -d -t vmi.XXXXXX); chmod 711 "$S"
mkdir -p "$S/images"
CACHE=${VM_TEST_IMAGE_CACHE:-}
if [ -n "$CACHE" ] && [ -f "$CACHE/debian-12/image.ini" ]; then cp -al "$CACHE/debian-12" "$S/images/"; fi
printf '[hostd]\nimages-dir=%s\nssh-port-min=44400\nssh-port-max=44499\n' "$S/images" \
  > "$S/hostd.conf"
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
"$HOSTD" --config "$S/hostd.conf" --state-dir "$S" >> "$S/hostd.log" 2>&1 &
HOSTD_PID=$!
for _ in $(seq 1 150); do "$VMCTL" list >/dev/null 2>&1 && break; sleep 0.2; done

now() { date +%s%N; }
ms_since() { echo $(( ($(now) - $1) / 1000000 )); }
median() { sort -n | awk '{a[NR]=$1} END {print (NR%2)?a[(NR+1)/2]:(a[NR/2]+a[NR/2+1])/2}'; }
# to_first_command ARRAY CMD...: CMD (which makes agent $NAME), then `vmctl exec $NAME true`
to_first_command() {
  local -n out=$1
  shift
  local t0
  t0=$(now)
  "$@" >/dev/null 2>&1
  "$VMCTL" exec "$NAME" -- true
  out+=("$(ms_since "$t0")")
}

echo "building the warm image"
"$VMCTL" template build debian-12 | tail -n 1

cold=() warm=() coldfork=() livefork=()
for i in $(seq 1 "$N"); do
  NAME=c$i; AGENTS+=("$NAME"); to_first_command cold "$VMCTL" new "$NAME" --cold
  NAME=w$i; AGENTS+=("$NAME"); to_first_command warm "$VMCTL" new "$NAME"
  echo "  run $i: cold new ${cold[-1]} ms, warm new ${warm[-1]} ms"
done
# Forks of the first warm agent, a background process running in it.
"$VMCTL" exec w1 -- sh -c 'nohup sh -c "while sleep 1; do :; done" >/dev/null 2>&1 &'
for i in $(seq 1 "$N"); do
  NAME=fc$i; AGENTS+=("$NAME"); to_first_command coldfork "$VMCTL" fork w1 "$NAME"
  "$VMCTL" rm --force "$NAME" >/dev/null
  NAME=fl$i; AGENTS+=("$NAME"); to_first_command livefork "$VMCTL" fork w1 "$NAME" --live
  "$VMCTL" rm --force "$NAME" >/dev/null
  echo "  run $i: cold fork ${coldfork[-1]} ms, live fork ${livefork[-1]} ms"
done

mc=$(printf '%s\n' "${cold[@]}" | median)
mw=$(printf '%s\n' "${warm[@]}" | median)
mfc=$(printf '%s\n' "${coldfork[@]}" | median)
mfl=$(printf '%s\n' "${livefork[@]}" | median)
echo "new to first command (median of $N): cold $mc ms, warm $mw ms = $(awk -v a="$mw" -v b="$mc" 'BEGIN {printf "%.3f", a / b}')x (goal <= 0.1x)"
echo "fork to first command (median of $N): cold $mfc ms, live $mfl ms = $(awk -v a="$mfl" -v b="$mfc" 'BEGIN {printf "%.3f", a / b}')x (goal <= 0.1x)"
echo "restore phases (hostd's log):"
grep "restored from" "$S/hostd.log" | sed 's/^.*: restored from [^ ]* in /  /'

# Memory: only warm agents running.
for n in "${AGENTS[@]}"; do "$VMCTL" rm --force "$n" >/dev/null 2>&1 || true; done
AGENTS=()
used0=$(free -m | awk '/^Mem:/ {print $3}')
for i in 1 2 3 4 5; do AGENTS+=("m$i"); "$VMCTL" new "m$i" >/dev/null; done
sleep 5
used1=$(free -m | awk '/^Mem:/ {print $3}')
rss=0
for pid in $(pgrep -f "guest=m[1-5],"); do
  rss=$((rss + $(awk '/^VmRSS:/ {print $2}' "/proc/$pid/status")))
done
echo "5 warm agents (1 GiB each): QEMU RSS $((rss / 1024)) MiB in all ($((rss / 5120)) MiB each); host used memory +$((used1 - used0)) MiB"
