#!/bin/bash
# The soak: SOAK_AGENTS agents (default 20) kept busy for SOAK_MINUTES (default 60) as their
# users keep them: execs at random that write a file from the host and read it back, checkpoints
# (some with memory) under a periodic policy whose thinning drops some, idle pauses and saves
# and the wakes an exec makes, a live fork and a removal every few minutes (the count stays),
# restores of checkpoints, and hostd stopped by its PID and started again half-way. Every vmctl
# call is checked. Every SOAK_SAMPLE_EVERY seconds (30) it samples hostd's RSS, threads and
# descriptors, each of its workers' RSS and descriptors, disk used per agent and in all, and the
# event log; it fails on growth beyond the bounds below and on any `qemu-img check` finding at
# the end. Real guests under TCG. Output is TAP, then a table of the samples and the figures.
# Needs root, HOSTD and VMCTL set; docs/TESTING.md ("The soak") says why each bound is what it is.
#
#   vm-soak.sh [--minutes N] [--agents N] [--seed N]    (or SOAK_MINUTES, SOAK_AGENTS, SOAK_SEED)
#
# Bounds (each hostd process, from its own mark; the marks and the end are taken with every
# agent saved, so that a running QEMU's descriptors do not count):
#   hostd RSS: at the end at most SOAK_RSS_PCT (10) % over the mark's, and every sample between
#   at most SOAK_RSS_PEAK_PCT (20) % over it;
#   hostd descriptors: at the end of its life at most SOAK_FD_SLACK (8) over the mark's;
#   a worker's RSS: at most max(SOAK_WORKER_RSS_PCT (25) %, SOAK_WORKER_RSS_KIB (4096)) over its
#   second sample (the first may catch its start-up).
set -uo pipefail

: "${HOSTD:?}" "${VMCTL:?}"
HERE=$(cd "$(dirname "$0")" && pwd)

SOAK_MINUTES=${SOAK_MINUTES:-60}
SOAK_AGENTS=${SOAK_AGENTS:-20}
SOAK_SEED=${SOAK_SEED:-}
while [ $# -gt 0 ]; do
  case $1 in
    --minutes) SOAK_MINUTES=${2:-}; shift 2 ;;
    --agents) SOAK_AGENTS=${2:-}; shift 2 ;;
    --seed) SOAK_SEED=${2:-}; shift 2 ;;
    -h | --help) sed -n '2,/^set -uo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    *) echo "vm-soak.sh: unknown argument '$1' (--minutes N, --agents N, --seed N)" >&2; exit 2 ;;
  esac
done
for v in SOAK_MINUTES SOAK_AGENTS; do
  case ${!v} in
    '' | *[!0-9]*) echo "vm-soak.sh: $v must be a whole number, not '${!v}'" >&2; exit 2 ;;
  esac
done
[ "$SOAK_AGENTS" -ge 3 ] || { echo "vm-soak.sh: at least 3 agents (a fork needs a source and a removal another)" >&2; exit 2; }
[ "$SOAK_MINUTES" -ge 3 ] || { echo "vm-soak.sh: at least 3 minutes" >&2; exit 2; }
[ -n "$SOAK_SEED" ] || SOAK_SEED=$(od -An -N2 -tu2 /dev/urandom | tr -d ' ')
case $SOAK_SEED in '' | *[!0-9]*) echo "vm-soak.sh: SOAK_SEED must be a number" >&2; exit 2 ;; esac
SAMPLE_EVERY=${SOAK_SAMPLE_EVERY:-30}
FORK_EVERY=${SOAK_FORK_EVERY:-180}
RESTORE_EVERY=${SOAK_RESTORE_EVERY:-240}
RSS_PCT=${SOAK_RSS_PCT:-10}
RSS_PEAK_PCT=${SOAK_RSS_PEAK_PCT:-20}
FD_SLACK=${SOAK_FD_SLACK:-8}
WORKER_RSS_PCT=${SOAK_WORKER_RSS_PCT:-25}
WORKER_RSS_KIB=${SOAK_WORKER_RSS_KIB:-4096}
# The agents' policies: short, so that a soak of minutes sees many idle pauses, saves and wakes,
# and thinning at work (at most KEEP periodic checkpoints each, no hourly or daily ones).
PAUSE_AFTER=${SOAK_PAUSE_AFTER:-30s}
SAVE_AFTER=${SOAK_SAVE_AFTER:-75s}
CHECKPOINT_EVERY=${SOAK_CHECKPOINT_EVERY:-45s}
KEEP=2

# shellcheck source=lib.sh
. "$HERE/lib.sh"
suite_init vms 44700 44799
# The suite's own images dir (its warm image touches no other suite's), the cached base and
# warm image hard-linked in when there are.
CACHE=$IMAGES
IMAGES=$S/images
sed -i "s|^images-dir=.*|images-dir=$IMAGES|" "$CONF"
mkdir -p "$IMAGES"
if [ -f "$CACHE/debian-12/image.ini" ] && [ "$CACHE" != "$IMAGES" ]; then
  cp -al "$CACHE/debian-12" "$IMAGES/"
fi
# The restart half-way is a takeover: the agents keep running without hostd.
echo "shutdown = keep" >> "$CONF"

AGENTS=()                 # the agents now, in the order made
declare -A LOGN=()        # lines the agent's ~/soak/log holds (-1: unknown after a failure)
declare -A SOURCE_OF=()   # a fork's source
declare -A MANUAL=()      # the soak's own checkpoints of an agent, oldest first
declare -A CKN=()         # AGENT:ID -> LOGN when that checkpoint was taken
declare -A OPS=() OPMS=() OPMAX=() FAILS=()
NEXT=1                    # the next agent's number
SAMPLER=
T0=$(date +%s)

cleanup() {
  [ -z "$SAMPLER" ] || { kill "$SAMPLER" 2>/dev/null; wait "$SAMPLER" 2>/dev/null; }
  if [ -n "$HOSTD_PID" ] && kill -0 "$HOSTD_PID" 2>/dev/null; then
    local i
    for ((i = ${#AGENTS[@]} - 1; i >= 0; i--)); do
      vmctl rm --force "${AGENTS[$i]}" >/dev/null 2>&1
    done
    stop_hostd
  fi
  destroy_leftover_domains
  if [ "$FAILED" -ne 0 ] || [ "$N" -eq 0 ]; then
    diag_err "hostd log:"; diag_err "$(grep -v ' ok (uid' "$LOG" 2>/dev/null | tail -n 60)"
  fi
  if [ -n "${SOAK_KEEP_DIR:-}" ]; then
    mkdir -p "$SOAK_KEEP_DIR" && cp "$S"/*.tsv "$S"/*.log "$SOAK_KEEP_DIR"/ 2>/dev/null
  fi
  rm -rf "$S"
}
trap cleanup EXIT

now() { date +%s; }
ms() { date +%s%3N; }
clock() { local t=$(($(now) - T0)); printf '%02d:%02d' $((t / 60)) $((t % 60)); }
# rnd N: R is a number from 0 to N-1. The one source of choices, read in this shell only (a
# subshell's draws would not advance it), so that SOAK_SEED replays the same choices.
rnd() { R=$((RANDOM % $1)); }

# op KIND VMCTL-ARGS...: one vmctl call, timed and counted under KIND; its stdout in OUT. A
# failure is a TAP failure with the command and its stderr. Input comes from OP_IN (a file) when
# set.
OP_IN=
op() {
  local kind=$1 t rc
  shift
  t=$(ms)
  OUT=$(vmctl "$@" < "${OP_IN:-/dev/null}" 2> "$S/op.err")
  rc=$?
  t=$(($(ms) - t))
  OPS[$kind]=$((${OPS[$kind]:-0} + 1))
  OPMS[$kind]=$((${OPMS[$kind]:-0} + t))
  [ "$t" -le "${OPMAX[$kind]:-0}" ] || OPMAX[$kind]=$t
  echo "# $(clock) $kind ${*:1:3} -> $rc (${t} ms)"
  if [ "$rc" -ne 0 ]; then
    FAILS[$kind]=$((${FAILS[$kind]:-0} + 1))
    not_ok "vmctl $* (exit $rc, at $(clock))"
    diag "$(cat "$S/op.err")"
    return 1
  fi
  return 0
}

# states: "NAME STATE" a line, every agent hostd has.
states() {
  vmctl --json list 2>/dev/null | python3 -c '
import json, sys
d = json.load(sys.stdin)
for a in (d["agents"] if isinstance(d, dict) else d):
    print(a["name"], a["state"])'
}

# ---- samples
# One line of samples.tsv: seconds since the loop began, a label (empty for the periodic ones),
# hostd's PID, VmRSS (KiB), threads, descriptors (the least of three reads 0.2 s apart: a sample
# may catch a request's own connection), KiB under agents/ and in the state dir without the
# images, event log lines, agents running/paused/saved, the 1-minute load. Each hostd worker
# (a child named vm-*) adds a line to workers.tsv; each periodic checkpoint seen one to
# periodic.seen; each agent's directory one to disk.tsv.
take_sample() {
  local label=${1:--} pid rss anon file thr fd f1 f2 ag all ev run pau sav t
  t=$(($(now) - LOOP0))
  pid=$(cat "$S/hostd.pid" 2>/dev/null)
  if [ -n "$pid" ] && [ -r "/proc/$pid/status" ]; then
    rss=$(awk '/^VmRSS:/ { print $2 }' "/proc/$pid/status")
    anon=$(awk '/^RssAnon:/ { print $2 }' "/proc/$pid/status")
    file=$(awk '/^RssFile:/ { print $2 }' "/proc/$pid/status")
    thr=$(awk '/^Threads:/ { print $2 }' "/proc/$pid/status")
    fd=$(ls "/proc/$pid/fd" 2>/dev/null | wc -l); sleep 0.2
    f1=$(ls "/proc/$pid/fd" 2>/dev/null | wc -l); sleep 0.2
    f2=$(ls "/proc/$pid/fd" 2>/dev/null | wc -l)
    [ "$f1" -ge "$fd" ] || fd=$f1
    [ "$f2" -ge "$fd" ] || fd=$f2
    local w wc wr wf
    for w in $(ps -o pid= --ppid "$pid" 2>/dev/null); do
      wc=$(cat "/proc/$w/comm" 2>/dev/null) || continue
      case $wc in vm-*) ;; *) continue ;; esac
      wr=$(awk '/^VmRSS:/ { print $2 }' "/proc/$w/status" 2>/dev/null)
      wf=$(ls "/proc/$w/fd" 2>/dev/null | wc -l)
      [ -z "$wr" ] || printf '%s\t%s\t%s\t%s\t%s\n' "$t" "$w" "$wc" "$wr" "$wf" >> "$S/workers.tsv"
    done
  else
    pid=- rss=- anon=- file=- thr=- fd=-
  fi
  ag=$(du -sk "$S/agents" 2>/dev/null | cut -f1)
  all=$(du -sk --exclude=images "$S" 2>/dev/null | cut -f1)
  du -sk "$S"/agents/*/ 2>/dev/null | awk -v t="$t" '{ n = $2; sub(/\/$/, "", n); sub(/.*\//, "", n); print t "\t" n "\t" $1 }' >> "$S/disk.tsv"
  ev=$(vmctl events 2>/dev/null | wc -l)
  local st
  st=$(states)
  run=$(grep -c ' running$' <<< "$st")
  pau=$(grep -c ' paused$' <<< "$st")
  sav=$(grep -c ' saved$' <<< "$st")
  local a
  for a in $(cut -d' ' -f1 <<< "$st"); do
    vmctl --json checkpoints "$a" 2>/dev/null | python3 -c '
import json, sys
d = json.load(sys.stdin)
for c in (d["checkpoints"] if isinstance(d, dict) else d):
    if c.get("label") == "periodic":
        print(sys.argv[1], c["id"])' "$a" >> "$S/periodic.seen" 2>/dev/null
  done
  printf '%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n' "$t" "$label" "$pid" \
    "$rss" "$thr" "$fd" "$ag" "$all" "$ev" "$run" "$pau" "$sav" "$(cut -d' ' -f1 /proc/loadavg)" \
    "$anon" "$file" >> "$S/samples.tsv"
}

sampler() {
  take_sample start
  while :; do
    sleep "$SAMPLE_EVERY"
    take_sample
  done
}

# ---- what users do
# pick: A is an agent; half the picks go to the first quarter of the agents (the busy ones), so
# that the others go idle long enough to be paused and saved between their users' calls.
pick() {
  local n=${#AGENTS[@]} hot
  hot=$(((n + 3) / 4))
  rnd 2
  if [ "$R" = 0 ]; then rnd "$hot"; else rnd "$n"; fi
  A=${AGENTS[$R]}
}

# exec_check AGENT: writes a random file of 4 KiB to 2 MiB from the host into the agent, reads
# back its checksum, and appends a line to ~/soak/log, whose line count must be what the soak
# wrote there (through saves, wakes, restarts, restores and forks). It syncs: a checkpoint of an
# agent the idle policy paused is crash-consistent (its guest agent cannot freeze it), and must
# still hold every line the soak counts.
exec_check() {
  local a=$1 size want got n
  rnd 512
  size=$(((R + 1) * 4096))
  head -c "$size" /dev/urandom > "$S/blob"
  want=$(sha256sum < "$S/blob" | cut -d' ' -f1)
  OP_IN=$S/blob
  op exec exec "$a" -- sh -c 'mkdir -p ~/soak && cat > ~/soak/blob && echo line >> ~/soak/log &&
    sha256sum < ~/soak/blob | cut -d" " -f1 && wc -l < ~/soak/log && sync'
  local rc=$?
  OP_IN=
  if [ "$rc" -ne 0 ]; then LOGN[$a]=-1; return 1; fi
  got=$(sed -n 1p <<< "$OUT")
  n=$(sed -n 2p <<< "$OUT")
  if [ "$got" != "$want" ]; then
    not_ok "$a read back the $size bytes it was given (at $(clock))"
    diag "sha256 $got, not $want"
  fi
  if [ "${LOGN[$a]}" != -1 ] && [ "$n" != $((LOGN[$a] + 1)) ]; then
    not_ok "$a's ~/soak/log holds the lines written to it (at $(clock))"
    diag "$n lines, not $((LOGN[$a] + 1))"
    FAILS[data]=$((${FAILS[data]:-0} + 1))
  fi
  LOGN[$a]=$n
}

# checkpoint_op AGENT: a checkpoint of its own, one in three with memory (after an exec, as its
# user would: a memory checkpoint needs the agent awake); past 3 of them the oldest is removed.
# A removal hostd refuses because a fork or a newer branch stands on it is its documented answer
# (exit 5), counted, not a failure; that checkpoint stays.
checkpoint_op() {
  local a=$1 mem=() id
  rnd 3
  if [ "$R" = 0 ]; then
    exec_check "$a" || return 1
    mem=(--memory)
  fi
  op checkpoint checkpoint "$a" --label soak "${mem[@]}" || return 1
  id=$(grep -o 'c[0-9][0-9]*' <<< "$OUT" | head -n 1)
  [ -n "$id" ] || { not_ok "checkpoint of $a printed its id"; diag "$OUT"; return 1; }
  CKN[$a:$id]=${LOGN[$a]}
  MANUAL[$a]="${MANUAL[$a]:-} $id"
  local list
  read -ra list <<< "${MANUAL[$a]}"
  if [ "${#list[@]}" -gt 3 ]; then
    local oldest=${list[0]} t rc
    t=$(ms)
    vmctl checkpoint rm "$a" "$oldest" > /dev/null 2> "$S/op.err"
    rc=$?
    t=$(($(ms) - t))
    OPS[checkpoint-rm]=$((${OPS[checkpoint-rm]:-0} + 1))
    OPMS[checkpoint-rm]=$((${OPMS[checkpoint-rm]:-0} + t))
    [ "$t" -le "${OPMAX[checkpoint-rm]:-0}" ] || OPMAX[checkpoint-rm]=$t
    echo "# $(clock) checkpoint-rm $a $oldest -> $rc (${t} ms)"
    if [ "$rc" = 0 ]; then
      MANUAL[$a]=${MANUAL[$a]# "$oldest"}
      unset "CKN[$a:$oldest]"
    elif [ "$rc" = 5 ] && grep -q 'stand\(s\)\{0,1\} on' "$S/op.err"; then
      OPS[checkpoint-rm-refused]=$((${OPS[checkpoint-rm-refused]:-0} + 1))
      echo "# refused as documented: $(cat "$S/op.err")"
      MANUAL[$a]=${MANUAL[$a]# "$oldest"} # kept by hostd; not tried again
      MANUAL_KEPT[$a]="${MANUAL_KEPT[$a]:-} $oldest"
    else
      FAILS[checkpoint-rm]=$((${FAILS[checkpoint-rm]:-0} + 1))
      not_ok "vmctl checkpoint rm $a $oldest (exit $rc, at $(clock))"
      diag "$(cat "$S/op.err")"
    fi
  fi
}
declare -A MANUAL_KEPT=()

# restore_op: an agent that has checkpoints of its own back to one of them, at random; its log
# then holds what it held then.
restore_op() {
  local cands=() a list
  for a in "${AGENTS[@]}"; do
    [ -z "${MANUAL[$a]:-}${MANUAL_KEPT[$a]:-}" ] || cands+=("$a")
  done
  [ "${#cands[@]}" -gt 0 ] || return 0
  rnd "${#cands[@]}"
  a=${cands[$R]}
  read -ra list <<< "${MANUAL[$a]:-} ${MANUAL_KEPT[$a]:-}"
  rnd "${#list[@]}"
  local id=${list[$R]}
  if op restore restore "$a" "$id"; then
    LOGN[$a]=${CKN[$a:$id]:--1}
    exec_check "$a"
  fi
}

# fork_rm: a live fork of an agent, then the removal of another (not the fork, not a source of
# any agent now: hostd refuses that), so the count stays.
fork_rm() {
  pick
  local src=$A name="s$NEXT"
  NEXT=$((NEXT + 1))
  exec_check "$src" # its user works in it, then forks it
  if op fork fork "$src" "$name" --live; then
    AGENTS+=("$name")
    SOURCE_OF[$name]=$src
    LOGN[$name]=${LOGN[$src]}
    exec_check "$name"
  fi
  local cands=() a b src_of_some
  for a in "${AGENTS[@]}"; do
    [ "$a" != "$name" ] || continue
    src_of_some=0
    for b in "${AGENTS[@]}"; do [ "${SOURCE_OF[$b]:-}" != "$a" ] || src_of_some=1; done
    [ "$src_of_some" = 1 ] || cands+=("$a")
  done
  [ "${#cands[@]}" -gt 0 ] || return 0
  rnd "${#cands[@]}"
  local victim=${cands[$R]}
  if op rm rm --force "$victim"; then
    local keep=()
    for a in "${AGENTS[@]}"; do [ "$a" = "$victim" ] || keep+=("$a"); done
    AGENTS=("${keep[@]}")
    unset "SOURCE_OF[$victim]" "LOGN[$victim]" "MANUAL[$victim]" "MANUAL_KEPT[$victim]"
  fi
}

# quiesce LABEL: every agent saved (stop-host-agents), then a sample with LABEL: the marks and
# the ends compare hostd with the same agents holding no QEMU.
quiesce() {
  op save-all stop-host-agents
  local st
  st=$(states)
  if grep -qv ' saved$' <<< "$st"; then
    not_ok "every agent is saved for the '$1' sample (at $(clock))"
    diag "$st"
  fi
  sleep 3
  take_sample "$1"
}

# ---- set up
start_hostd || { echo "Bail out! hostd did not start"; cat "$LOG"; exit 1; }
echo "$HOSTD_PID" > "$S/hostd.pid"
diag "soak: $SOAK_MINUTES min, $SOAK_AGENTS agents, seed $SOAK_SEED (SOAK_SEED=$SOAK_SEED replays its choices)"
RANDOM=$SOAK_SEED

op template template build debian-12
check "the template has its warm image" \
  bash -c "\"$VMCTL\" --socket '$SOCK' template list | grep -qE '^debian-12 +yes +yes '"
SETUP0=$(now)
made=0
for ((i = 1; i <= SOAK_AGENTS; i++)); do
  name="s$NEXT"
  NEXT=$((NEXT + 1))
  op new new "$name" || continue
  AGENTS+=("$name")
  LOGN[$name]=0
  op policy idle "$name" --pause-after "$PAUSE_AFTER" --save-after "$SAVE_AFTER"
  op policy autocheckpoint "$name" --every "$CHECKPOINT_EVERY" --keep "$KEEP" --hourly 0 --daily 0
  exec_check "$name" && made=$((made + 1))
done
check "$SOAK_AGENTS agents made from the warm image, each answering" test "$made" = "$SOAK_AGENTS"
diag "agents made in $(($(now) - SETUP0)) s"

# ---- the soak
D=$((SOAK_MINUTES * 60))
M=$((D / 3 < 600 ? D / 3 : 600)) # the mark: 10 minutes in, a third of a shorter run
LOOP0=$(now)
T0=$LOOP0
END=$((LOOP0 + D))
MARK1=$((LOOP0 + M))
RESTART=$((LOOP0 + D / 2))
MARK2=
NEXT_FORK=$((LOOP0 + FORK_EVERY / 2))
NEXT_RESTORE=$((LOOP0 + RESTORE_EVERY / 2))
sampler &
SAMPLER=$!
marked1=0 restarted=0 marked2=0
while [ "$(now)" -lt "$END" ]; do
  t=$(now)
  if [ "$marked1" = 0 ] && [ "$t" -ge "$MARK1" ]; then
    quiesce mark1
    marked1=1
    continue
  fi
  if [ "$restarted" = 0 ] && [ "$t" -ge "$RESTART" ]; then
    quiesce end1
    # Half of the agents running again, so that the new hostd takes over running QEMUs too.
    for ((i = 0; i < ${#AGENTS[@]}; i += 2)); do exec_check "${AGENTS[$i]}"; done
    t=$(ms)
    stop_hostd
    diag "hostd stopped in $(($(ms) - t)) ms"
    t=$(ms)
    if start_hostd; then
      ok "hostd starts again on the same state dir"
    else
      # start_hostd gives up after 20 s; taking over many agents may take longer.
      for _ in $(seq 1 200); do vmctl list > /dev/null 2>&1 && break; sleep 0.5; done
      check "hostd starts again on the same state dir" vmctl list
    fi
    diag "hostd answered in $(($(ms) - t)) ms after its start"
    echo "$HOSTD_PID" > "$S/hostd.pid"
    RESTART_AT=$(($(now) - LOOP0))
    st=$(states)
    missing=0
    for a in "${AGENTS[@]}"; do grep -q "^$a " <<< "$st" || { missing=1; diag "$a missing"; }; done
    check "every agent is still there after the restart (${#AGENTS[@]})" test "$missing" = 0 \
      && check "no other agent appeared" test "$(wc -l <<< "$st")" = "${#AGENTS[@]}"
    fails_before=$FAILED
    for a in "${AGENTS[@]}"; do exec_check "$a"; done
    check "every agent answers after the restart, its files as they were" test "$FAILED" = "$fails_before"
    restarted=1
    # The new hostd forks and restores before its mark, as the first did: the first use of a
    # code path maps library pages and fills caches once, which is no growth.
    NEXT_FORK=$(now)
    NEXT_RESTORE=$(now)
    left=$((END - $(now)))
    MARK2=$(($(now) + (M < left / 2 ? M : left / 2)))
    continue
  fi
  if [ "$restarted" = 1 ] && [ "$marked2" = 0 ] && [ "$t" -ge "$MARK2" ]; then
    quiesce mark2
    marked2=1
    continue
  fi
  if [ "$t" -ge "$NEXT_FORK" ]; then
    fork_rm
    NEXT_FORK=$((NEXT_FORK + FORK_EVERY))
    continue
  fi
  if [ "$t" -ge "$NEXT_RESTORE" ]; then
    restore_op
    NEXT_RESTORE=$((NEXT_RESTORE + RESTORE_EVERY))
    continue
  fi
  rnd 100
  if [ "$R" -lt 60 ]; then
    pick; exec_check "$A"
  elif [ "$R" -lt 75 ]; then
    pick; checkpoint_op "$A"
  else
    # Nobody calls for a while: the idle policy pauses and saves whoever it may.
    rnd 20
    s=$((R + 5))
    [ $(($(now) + s)) -le "$END" ] || s=$((END - $(now)))
    [ "$s" -le 0 ] || { echo "# $(clock) idle ${s}s"; sleep "$s"; }
    OPS[idle-wait]=$((${OPS[idle-wait]:-0} + 1))
  fi
done
quiesce end2
kill "$SAMPLER" 2>/dev/null
wait "$SAMPLER" 2>/dev/null
SAMPLER=
LOOP_S=$(($(now) - LOOP0))

# ---- the images: every agent saved, so none is open
bad=0 checked=0
while read -r img; do
  checked=$((checked + 1))
  out=$(qemu-img check "$img" 2>&1) || { bad=$((bad + 1)); diag "$img: $out"; }
done < <(find "$S/agents" -name '*.qcow2')
check "qemu-img check finds nothing in any of the $checked images of the agents and their checkpoints" \
  test "$bad" = 0

# ---- the bounds
# hostd's own log: what the idle loop and the periodic checkpoints did, and what failed there
# (no vmctl call sees that).
pauses=$(grep -c "' paused: " "$LOG")
saves=$(grep -c "' saved to disk: " "$LOG")
bg_fail=$(grep -E "periodic checkpoint failed|no checkpoint before saving|cannot save|did not restore|connection refused:" "$LOG")
check "the idle loop and the periodic checkpoints failed nowhere (hostd's log)" test -z "$bg_fail" \
  || diag "$bg_fail"

# bound SEGMENT MARK-LABEL END-LABEL: that hostd's RSS at its end within RSS_PCT % of its
# mark's, every sample between within RSS_PEAK_PCT %, its descriptors at the end within FD_SLACK
# of the mark's. The mark and the end are alike: every agent saved and hostd quiet for 3 s, so
# its heap was trimmed (hostd does that once requests stop); the samples between hold running
# agents' state and what the heap has not given back yet, hence the wider bound.
bound() {
  local seg=$1 from=$2 to=$3 rss0= rss1= anon0= anon1= fd0= fd1= worst
  # The columns of samples.tsv, as take_sample writes them.
  IFS=$'\t' read -r _ _ _ rss0 _ fd0 _ _ _ _ _ _ _ anon0 _ < <(awk -F'\t' -v l="$from" '$2 == l' "$S/samples.tsv")
  IFS=$'\t' read -r _ _ _ rss1 _ fd1 _ _ _ _ _ _ _ anon1 _ < <(awk -F'\t' -v l="$to" '$2 == l' "$S/samples.tsv")
  if [ -z "$rss0" ] || [ -z "$rss1" ] || [ "$rss1" = - ] || [ -z "$fd1" ]; then
    not_ok "hostd $seg: samples at its mark and its end"
    return
  fi
  worst=$(awk -F'\t' -v a="$from" -v b="$to" '
    $2 == a { on = 1 } on && $4 != "-" && $4 > m { m = $4 } $2 == b { on = 0 } END { print m }' \
    "$S/samples.tsv")
  check "hostd $seg: RSS at its end within +$RSS_PCT% of its mark's ($((rss0 / 1024)) -> $((rss1 / 1024)) MiB)" \
    test "$((rss1 * 100))" -le "$((rss0 * (100 + RSS_PCT)))"
  check "hostd $seg: RSS of every sample between within +$RSS_PEAK_PCT% of the mark's (at most $((worst / 1024)) MiB)" \
    test "$((worst * 100))" -le "$((rss0 * (100 + RSS_PEAK_PCT)))"
  check "hostd $seg: descriptors at its end within +$FD_SLACK of its mark's ($fd0 -> $fd1)" \
    test "$fd1" -le "$((fd0 + FD_SLACK))"
  FIG+=("hostd $seg: RSS mark $((rss0 / 1024)) MiB (heap $((anon0 / 1024))), end $((rss1 / 1024)) MiB (heap $((anon1 / 1024)); $(((rss1 - rss0) * 100 / rss0))%), max between $((worst / 1024)) MiB ($(((worst - rss0) * 100 / rss0))%); fds $fd0 -> $fd1")
}
FIG=()
bound "before the restart" mark1 end1
bound "after the restart" mark2 end2

# Workers: each PID's RSS against its second sample.
wbad=$(awk -F'\t' -v pct="$WORKER_RSS_PCT" -v kib="$WORKER_RSS_KIB" '
  { n[$2]++; c[$2] = $3; if (n[$2] == 2) base[$2] = $4; if (n[$2] >= 2 && $4 > mx[$2]) mx[$2] = $4 }
  END {
    for (p in base) {
      slack = base[p] * pct / 100; if (slack < kib) slack = kib
      if (mx[p] > base[p] + slack) print c[p] " " p ": " base[p] " KiB -> " mx[p] " KiB"
    }
  }' "$S/workers.tsv" 2>/dev/null)
check "no worker's RSS grew past max(+$WORKER_RSS_PCT%, +$WORKER_RSS_KIB KiB) of its second sample" \
  test -z "$wbad" || diag "$wbad"
FIG+=("$(awk -F'\t' '
  { n[$2]++; c[$2] = $3; if (n[$2] == 2) base[$2] = $4; if (n[$2] >= 2 && $4 > mx[$2]) mx[$2] = $4
    if (n[$2] == 2) fb[$2] = $5; if (n[$2] >= 2 && $5 > fm[$2]) fm[$2] = $5 }
  END {
    for (p in base) { k = c[p]; cnt[k]++; g = mx[p] - base[p]; if (g > gm[k]) gm[k] = g
      if (mx[p] > rm[k]) rm[k] = mx[p]; f = fm[p] - fb[p]; if (f > fg[k]) fg[k] = f }
    for (k in cnt) printf "workers %s: %d seen twice or more, RSS at most %d KiB, grew at most %d KiB, fds grew at most %d; ", k, cnt[k], rm[k], gm[k], fg[k]
  }' "$S/workers.tsv" 2>/dev/null)")

# Thinning: periodic checkpoints seen in the samples that are gone at the end (of agents that
# are still there).
st=$(states)
present=0 seen=0 most=0
for a in $(cut -d' ' -f1 <<< "$st"); do
  n=$(vmctl --json checkpoints "$a" | python3 -c '
import json, sys
d = json.load(sys.stdin)
print(sum(1 for c in (d["checkpoints"] if isinstance(d, dict) else d) if c.get("label") == "periodic"))')
  present=$((present + n))
  [ "$n" -le "$most" ] || most=$n
  seen=$((seen + $(sort -u "$S/periodic.seen" | grep -c "^$a ")))
done
check "thinning dropped periodic checkpoints ($seen seen in the samples, $present left, at most $most on one agent)" \
  test "$((seen - present))" -gt 0

# ---- the table and the figures
echo "# samples (t s, label, hostd pid, RSS KiB (anon + file), threads, fds, agents KiB, state dir KiB, events, running/paused/saved, load):"
while IFS=$'\t' read -r t l p r th f ag all ev ru pa sa lo an fi; do
  printf '# %5s %-6s %7s %8s (%6s + %6s) %4s %4s %9s %9s %6s %2s/%2s/%2s %5s\n' "$t" "$l" "$p" "$r" "$an" "$fi" "$th" "$f" "$ag" "$all" "$ev" "$ru" "$pa" "$sa" "$lo"
done < "$S/samples.tsv"
echo "# disk per agent at the end (KiB):"
last=$(tail -n 1 "$S/disk.tsv" | cut -f1)
awk -F'\t' -v t="$last" '$1 == t { printf "#   %s %s\n", $2, $3 }' "$S/disk.tsv"
echo "# largest agent dir at any sample: $(sort -t$'\t' -k3 -n "$S/disk.tsv" | tail -n 1 | cut -f2,3 | tr '\t' ' ') KiB"
echo "# ops (count, failures, mean ms, max ms):"
for k in $(printf '%s\n' "${!OPS[@]}" | sort); do
  printf '#   %-22s %5s %3s %7s %7s\n' "$k" "${OPS[$k]}" "${FAILS[$k]:-0}" \
    "$(( ${OPMS[$k]:-0} / ${OPS[$k]} ))" "${OPMAX[$k]:--}"
done
echo "#   idle pauses (hostd log) $pauses, idle saves $saves, hostd restart at ${RESTART_AT:-?} s"
for f in "${FIG[@]}"; do echo "# $f"; done
echo "# seed $SOAK_SEED, loop $LOOP_S s, whole run $(($(now) - SETUP0)) s after hostd's start"
check "no vmctl call failed, every agent held its files" test "${#FAILS[@]}" = 0 || diag "failures by kind: $(for k in "${!FAILS[@]}"; do printf '%s %s ' "$k" "${FAILS[$k]}"; done)"
tap_end
