#!/bin/bash
# bench/ksm: host memory per idle warm agent with the kernel's same-page merging off, then on, in
# the same run: N agents (6) of the template's size from its warm image, idle (no idle policy:
# they keep running), first with hostd.conf `ksm = off` for a settle time, then hostd restarted
# with `ksm = on` (the agents keep running) and KSM given its scans. Each agent's proportional
# share of memory (Pss of its QEMU, /proc/PID/smaps_rollup: a page N processes share counts 1/N
# in each) and RSS, what KSM merged of it (`vmctl info --json`), and the host-wide saving.
# Goal: Pss per idle agent of 1 GiB <= 250 MiB with sharing on.
#
# Usage: bench/ksm.sh [N] [MINUTES]   (as root, after `meson setup build && ninja -C build`; the
# debian-12 image and its warm image from $VM_TEST_IMAGE_CACHE are hard-linked into a private
# images dir, or built; KSM at the kernel's pace is given MINUTES (8) to merge; SSH ports
# 45500-45599; ~N/2 + 3 + MINUTES min under TCG)
set -euo pipefail
cd "$(dirname "$0")/.."
N=${1:-6}
MINUTES=${2:-8}
VMCTL=${VMCTL:-./build/vmctl/vmctl}
HOSTD=${HOSTD:-./build/hostd/hostd}
KSM=/sys/kernel/mm/ksm
[ -w "$KSM/run" ] || { echo "no KSM here ($KSM/run not writable)" >&2; exit 1; }
KSM_RUN_BEFORE=$(cat "$KSM/run")

S=$(mktemp -d -t vmk.XXXXXX); chmod 711 "$S"
mkdir -p "$S/images"
CACHE=${VM_TEST_IMAGE_CACHE:-}
if [ -n "$CACHE" ] && [ -f "$CACHE/debian-12/image.ini" ]; then cp -al "$CACHE/debian-12" "$S/images/"; fi
write_conf() {
  cat > "$S/hostd.conf" <<CONF
[hostd]
images-dir=$S/images
ssh-port-min=45500
ssh-port-max=45599
metrics-listen=off
agent-ids=1881012000-1881012999
worker-ids=1881013000-1881015999
shutdown=keep
ksm=$1
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
  echo "$KSM_RUN_BEFORE" > "$KSM/run"
  rm -rf "$S"
  exit "$rc"
}
trap cleanup EXIT

start_hostd() {
  if [ -n "$HOSTD_PID" ]; then kill "$HOSTD_PID"; wait "$HOSTD_PID" 2>/dev/null || true; fi
  write_conf "$1"
  "$HOSTD" --config "$S/hostd.conf" --state-dir "$S" >> "$S/hostd.log" 2>&1 &
  HOSTD_PID=$!
  for _ in $(seq 1 150); do "$VMCTL" list >/dev/null 2>&1 && break; sleep 0.2; done
}

# sample LABEL: one line per agent and their mean: Pss, RSS, KSM merged (MiB).
sample() {
  local name pid pss rss merged tp=0 tr=0 tm=0
  for name in "${AGENTS[@]}"; do
    read -r pid merged < <("$VMCTL" info "$name" --json |
      python3 -c 'import json,sys; d=json.load(sys.stdin); print(d.get("qemu_pid", 0), d.get("ksm_merged_bytes", 0) >> 20)')
    pss=$(awk '/^Pss:/ {print int($2 / 1024)}' "/proc/$pid/smaps_rollup")
    rss=$(awk '/^Rss:/ {print int($2 / 1024)}' "/proc/$pid/smaps_rollup")
    tp=$((tp + pss)) tr=$((tr + rss)) tm=$((tm + merged))
  done
  echo "  $1: per agent (mean of $N) Pss $((tp / N)) MiB, RSS $((tr / N)) MiB, KSM merged $((tm / N)) MiB; host: pages_sharing $(( $(cat "$KSM/pages_sharing") * 4 / 1024 )) MiB"
}

start_hostd off
echo "0" > "$KSM/run"
echo "building the warm image"
"$VMCTL" template build debian-12 | tail -n 1
for i in $(seq 1 "$N"); do
  AGENTS+=("k$i")
  "$VMCTL" new "k$i" >/dev/null 2>&1
  "$VMCTL" idle "k$i" --never >/dev/null
done
"$VMCTL" info k1 --json | python3 -c 'import json,sys; d=json.load(sys.stdin); sys.exit(0 if d.get("qemu_pid") else 1)' ||
  { echo "vmctl info gives no qemu_pid" >&2; exit 1; }
sleep 150
sample "ksm = off, 150 s after the last new"
start_hostd on
for m in $(seq 1 "$MINUTES"); do
  sleep 60
  [ $((m % 4)) = 0 ] || [ "$m" = "$MINUTES" ] && sample "ksm = on, $m min"
done
echo "goal: Pss <= 250 MiB per idle agent with sharing on (the last line)"
