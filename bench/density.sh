#!/bin/bash
# bench/density: N agents on this host (default 50) from the template's warm image: N-1 under
# the idle policy, which pauses and then saves them, and one, the baseline, kept running. Once
# every idle agent is saved, an exec in each in turn (`vmctl exec NAME -- true`, waking it), twice:
# the second round finds the agents of the first running, paused or saved again, as the policy
# left them. Each exec's time by the state it found (min/median/p95/max), against the same exec
# on the baseline agent, timed after each; the host's used memory (MemTotal - MemAvailable)
# before, at its peak, once settled and at the end, per agent; the sum of the agents' QEMU RSS;
# `vmctl list` and `vmctl list --json` (medians of 10). Goals: every exec within 5 s (wakes
# included), `vmctl list` < 100 ms.
#
# The idle policy is the template's, shortened for the bench (pause after 30 s, save after 2 m:
# the default 5 m / 30 m would hold most agents paused, RAM and all, for the hour the bench
# would take) through a copy of the templates with the `idle` key changed: `--idle PAUSE,SAVE`
# sets others, `--idle template` keeps the template's own.
#
# Usage: bench/density.sh [N] [--idle PAUSE,SAVE|template]   (as root, after
# `meson setup build && ninja -C build`; the debian-12 image and its warm image from
# $VM_TEST_IMAGE_CACHE are hard-linked into a private images dir, or built; each agent takes two
# SSH ports, so N is at most half the range, $VM_TEST_PORT_MIN-$VM_TEST_PORT_MAX, default
# 44800-44899, and a port of it that another program's connection holds (the range lies among
# Linux's ephemeral ports) costs one agent; ~13 min for 50 under TCG)
set -euo pipefail
cd "$(dirname "$0")/.."
N=50
IDLE=30s,2m
while [ $# -gt 0 ]; do
  case $1 in
    --idle) IDLE=$2; shift 2 ;;
    [0-9]*) N=$1; shift ;;
    *) echo "usage: bench/density.sh [N] [--idle PAUSE,SAVE|template]" >&2; exit 2 ;;
  esac
done
VMCTL=${VMCTL:-./build/vmctl/vmctl}
HOSTD=${HOSTD:-./build/hostd/hostd}
PORT_MIN=${VM_TEST_PORT_MIN:-44800}
PORT_MAX=${VM_TEST_PORT_MAX:-44899}
FLOOR_MIB=${DENSITY_FLOOR_MIB:-2048}
if [ "$N" -lt 2 ] || [ $((N * 2)) -gt $((PORT_MAX - PORT_MIN + 1)) ]; then
  echo "N must be 2 to $(((PORT_MAX - PORT_MIN + 1) / 2)) (two SSH ports an agent)" >&2
  exit 2
fi

S=$(mktemp -d -t vmd.XXXXXX); chmod 711 "$S"
mkdir -p "$S/images" "$S/templates"
CACHE=${VM_TEST_IMAGE_CACHE:-}
if [ -n "$CACHE" ] && [ -f "$CACHE/debian-12/image.ini" ]; then cp -al "$CACHE/debian-12" "$S/images/"; fi
# The shipped templates, the idle policy changed (it is not part of what makes a warm image
# stale, so the cached one serves).
for t in templates/*.yaml; do
  if [ "$IDLE" = template ]; then cp "$t" "$S/templates/"; continue; fi
  awk -v p="${IDLE%,*}" -v s="${IDLE#*,}" '
    /^idle:/ { print "idle: {pause_after: " p ", save_after: " s "}"; skip = 1; next }
    skip && /^[ \t]/ { next }
    { skip = 0; print }' "$t" > "$S/templates/${t##*/}"
done
# Ids of their own: another hostd on this host (a suite, another bench) takes agent and worker
# ids from the default ranges.
cat > "$S/hostd.conf" <<CONF
[hostd]
images-dir=$S/images
templates-dir=$S/templates
ssh-port-min=$PORT_MIN
ssh-port-max=$PORT_MAX
metrics-listen=off
agent-ids=1881000000-1881000999
worker-ids=1881001000-1881003999
CONF
export VMCTL_SOCKET=$S/hostd.sock
HOSTD_PID=
SAMPLER_PID=
AGENTS=()

cleanup() {
  local rc=$? i
  set +e
  [ "$rc" -ne 0 ] && tail -n 20 "$S/hostd.log" >&2
  [ -n "$SAMPLER_PID" ] && { kill "$SAMPLER_PID"; wait "$SAMPLER_PID" 2>/dev/null; }
  for ((i = ${#AGENTS[@]} - 1; i >= 0; i--)); do "$VMCTL" rm --force "${AGENTS[$i]}" >/dev/null 2>&1; done
  [ -n "$HOSTD_PID" ] && { kill "$HOSTD_PID"; wait "$HOSTD_PID" 2>/dev/null; }
  rm -rf "$S"
  exit "$rc"
}
trap cleanup EXIT
# --debug: a trace of each exec's phases, the wakes among them, summed up at the end.
"$HOSTD" --config "$S/hostd.conf" --state-dir "$S" --debug >> "$S/hostd.log" 2>&1 &
HOSTD_PID=$!
for _ in $(seq 1 150); do "$VMCTL" list >/dev/null 2>&1 && break; sleep 0.2; done

now() { date +%s%N; }
ms_since() { echo $(( ($(now) - $1) / 1000000 )); }
median() { sort -n | awk '{a[NR]=$1} END {print (NR%2)?a[(NR+1)/2]:(a[NR/2]+a[NR/2+1])/2}'; }
# min/median/p95/max of the numbers on stdin (p95: the nearest rank), or "none"
stats() {
  sort -n | awk '{a[NR]=$1} END {
    if (NR == 0) { print "none"; exit }
    m = (NR%2) ? a[(NR+1)/2] : (a[NR/2]+a[NR/2+1])/2
    r = int(0.95 * NR); if (r < 0.95 * NR) r++
    printf "%d | %d | %.0f | %d | %d\n", NR, a[1], m, a[r], a[NR] }'
}
avail_mib() { awk '/^MemAvailable:/ {print int($2 / 1024)}' /proc/meminfo; }
used_mib() { awk '/^MemTotal:/ {t = $2} /^MemAvailable:/ {a = $2} END {print int((t - a) / 1024)}' /proc/meminfo; }
# The sum of the VmRSS of this hostd's QEMU processes (their pid files in its libvirt root), MiB;
# and how many there are.
qemu_rss() {
  local f pid kib=0 n=0
  for f in "$S"/libvirt/run/qemu/*.pid; do
    [ "${f##*/}" = driver.pid ] && continue
    pid=$(cat "$f" 2>/dev/null) || continue
    [ -r "/proc/$pid/status" ] || continue
    kib=$((kib + $(awk '/^VmRSS:/ {print $2}' "/proc/$pid/status" 2>/dev/null || echo 0)))
    n=$((n + 1))
  done
  echo "$((kib / 1024)) MiB in $n QEMU processes ($((kib / 1024 / (n > 0 ? n : 1))) MiB each)"
}
proc_figures() { # PID: RSS, threads, open descriptors
  echo "RSS $(awk '/^VmRSS:/ {print int($2 / 1024)}' "/proc/$1/status") MiB, $(awk '/^Threads:/ {print $2}' "/proc/$1/status") threads, $(find "/proc/$1/fd" -mindepth 1 | wc -l) fds"
}
states() { "$VMCTL" list --json | jq -r '.[] | "\(.name) \(.state)"'; }
state_counts() { states | awk '{c[$2]++} END {for (s in c) printf "%s %d  ", s, c[s]; print ""}'; }
list_ms() { # ARGS...: median of 10 `vmctl list ARGS`
  local t0 i out=()
  for i in $(seq 1 10); do t0=$(now); "$VMCTL" list "$@" >/dev/null; out+=("$(ms_since "$t0")"); done
  printf '%s\n' "${out[@]}" | median
}
goal() { awk -v v="$1" -v g="$2" 'BEGIN {print (v < g) ? "PASS" : "MISS"}'; }

echo "building the warm image"
"$VMCTL" template build debian-12 | tail -n 1
"$VMCTL" template list

used0=$(used_mib)
hostd0=$(proc_figures "$HOSTD_PID")
# Host memory once a second, for the peak.
(while sleep 1; do used_mib; done > "$S/used.txt") &
SAMPLER_PID=$!

echo "making $N agents: base (idle never, the baseline) and d1..d$((N - 1)) (idle: $IDLE)"
t0=$(now)
AGENTS+=(base)
"$VMCTL" -q new base >/dev/null
"$VMCTL" idle base --never >/dev/null
new_ms=() MADE=() new_failed=0
for i in $(seq 1 $((N - 1))); do
  # Another's guests on this host may hold the memory: wait for it (our idle agents saving),
  # 5 minutes at most, rather than drive the host into the OOM killer.
  for _ in $(seq 1 60); do [ "$(avail_mib)" -ge "$FLOOR_MIB" ] && break; sleep 5; done
  if [ "$(avail_mib)" -lt "$FLOOR_MIB" ]; then
    echo "  stopped at $((i - 1)) idle agents: $(avail_mib) MiB available (floor $FLOOR_MIB MiB)"
    break
  fi
  AGENTS+=("d$i")
  t1=$(now)
  if "$VMCTL" -q new "d$i" >/dev/null; then
    new_ms+=("$(ms_since "$t1")")
    MADE+=("d$i")
  else
    new_failed=$((new_failed + 1))
  fi
  if ((i % 10 == 0)); then echo "  $i made, $(($(ms_since "$t0") / 1000)) s; used memory $(used_mib) MiB; load $(cut -d' ' -f1-3 /proc/loadavg); $(state_counts)"; fi
done
NA=$((${#MADE[@]} + 1))
made_s=$(($(ms_since "$t0") / 1000))
echo "  $NA agents made in $made_s s, $new_failed new failed; vmctl new (warm) min | median | max: $(printf '%s\n' "${new_ms[@]}" | stats | cut -d'|' -f2,3,5)"

# Settled: no idle agent running or paused any more (bounded: $DENSITY_SETTLE_S, 15 minutes).
deadline=$(($(date +%s) + ${DENSITY_SETTLE_S:-900}))
while [ "$(states | awk '$1 != "base" && ($2 == "running" || $2 == "paused" || $2 == "starting")' | wc -l)" -gt 0 ]; do
  if [ "$(date +%s)" -gt "$deadline" ]; then echo "  not settled in time: $(state_counts)"; break; fi
  sleep 5
done
settled_s=$(($(ms_since "$t0") / 1000))
used_settled=$(used_mib)
rss_settled=$(qemu_rss)
list_settled=$(list_ms)
listj_settled=$(list_ms --json)
disk_settled=$(du -sm --exclude=images "$S" | cut -f1)
hostd_settled=$(proc_figures "$HOSTD_PID")
echo "  settled $settled_s s after the first new: $(state_counts)"

# Execs in turn, each followed by the baseline's.
declare -A by_state=()
base_ms=() all_ms=() failed=0
exec_round() {
  local name state t1 ms
  for name in "${MADE[@]}"; do
    state=$(states | awk -v n="$name" '$1 == n {print $2}')
    state=${state:-unknown}
    t1=$(now)
    if ! "$VMCTL" exec "$name" -- true; then failed=$((failed + 1)); echo "  exec $name ($state) failed" >&2; fi
    ms=$(ms_since "$t1")
    by_state[$state]+="$ms "
    all_ms+=("$ms")
    t1=$(now)
    "$VMCTL" exec base -- true || { failed=$((failed + 1)); echo "  exec base failed" >&2; }
    base_ms+=("$(ms_since "$t1")")
  done
}
echo "round 1: an exec in each (all saved)"
exec_round
echo "  $(state_counts)"
echo "round 2: an exec in each again"
exec_round
used_end=$(used_mib)
rss_end=$(qemu_rss)
list_end=$(list_ms)
listj_end=$(list_ms --json)
kill "$SAMPLER_PID"; wait "$SAMPLER_PID" 2>/dev/null || true; SAMPLER_PID=
peak=$(sort -n "$S/used.txt" | tail -n 1)
echo "  at the end (after round 2): $(state_counts)"

echo
echo "== $NA agents of 1 GiB (idle: $IDLE), $(nproc) cores, $(awk '/^MemTotal:/ {print int($2 / 1048576 + 0.5)}' /proc/meminfo) GiB =="
echo "exec -- true, ms, by the state the agent was in | execs | min | median | p95 | max"
for s in saved paused running; do echo "  $s | $(printf '%s' "${by_state[$s]:-}" | tr ' ' '\n' | grep . | stats)"; done
for s in "${!by_state[@]}"; do
  case $s in saved | paused | running) ;; *) echo "  $s | $(printf '%s' "${by_state[$s]}" | tr ' ' '\n' | grep . | stats)" ;; esac
done
echo "  all | $(printf '%s\n' "${all_ms[@]}" | stats)"
echo "  baseline (base, running) | $(printf '%s\n' "${base_ms[@]}" | stats)"
mb=$(printf '%s\n' "${base_ms[@]}" | median)
for s in saved paused running; do
  [ -n "${by_state[$s]:-}" ] || continue
  m=$(printf '%s' "${by_state[$s]}" | tr ' ' '\n' | grep . | median)
  echo "ratio $s/running-baseline exec (medians): $(awk -v a="$m" -v b="$mb" 'BEGIN {printf "%.1f", a / b}')x"
done
max=$(printf '%s\n' "${all_ms[@]}" | sort -n | tail -n 1)
echo "every exec within 5 s: slowest $max ms, $failed failed: $([ "$failed" -eq 0 ] && goal "$max" 5000 || echo MISS)"
echo "load average at the end: $(cut -d' ' -f1-3 /proc/loadavg)"
echo "vmctl list: $list_settled ms settled, $list_end ms at the end (median of 10; goal < 100 ms: $(goal "$list_end" 100)); --json: $listj_settled / $listj_end ms"
echo "host used memory (MemTotal - MemAvailable): before $used0 MiB, peak $peak MiB, settled $used_settled MiB, end $used_end MiB"
echo "  per agent: settled $(( (used_settled - used0) / NA )) MiB, end $(( (used_end - used0) / NA )) MiB"
echo "QEMU RSS: settled $rss_settled; end $rss_end"
echo "state dir (agents' disks, saved images, checkpoints) once settled: $disk_settled MiB, $((disk_settled / NA)) MiB an agent"
echo "hostd: before $hostd0; settled $hostd_settled; end $(proc_figures "$HOSTD_PID")"
python3 bench/trace-summary.py "wake from saved" "trace: exec d[0-9]+: .*restore saved image" < "$S/hostd.log"
python3 bench/trace-summary.py "wake from paused" "trace: exec d[0-9]+: .*, resume " < "$S/hostd.log"
