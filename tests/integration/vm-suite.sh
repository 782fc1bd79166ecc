#!/bin/bash
# The VM suite: drives the real vmctl against a real hostd that boots real guests (TCG).
# One agent is booted and shared by most checks, since each boot costs about a minute.
# Output is TAP. Needs root, the packages of scripts/install-deps.sh, and HOSTD/VMCTL set
# (meson does that). The debian-12 image is built into the suite's state dir, or taken from
# $VM_TEST_IMAGE_CACHE when set (a directory kept between runs).
set -uo pipefail

: "${HOSTD:?}" "${VMCTL:?}"
# shellcheck source=lib.sh
. "$(dirname "$0")/lib.sh"
# shellcheck source=guest-api-check.sh
. "$(dirname "$0")/guest-api-check.sh"
# shellcheck source=confine-check.sh
. "$(dirname "$0")/confine-check.sh"
# shellcheck source=cp-check.sh
. "$(dirname "$0")/cp-check.sh"
# shellcheck source=observe-check.sh
. "$(dirname "$0")/observe-check.sh"
suite_init vmt 43100 43199
# Under TCG a guest gets about 5 calls a second through its API forward (a helper spawned per
# connection), which the default rate refills: the suite's hostd allows 2 a second, bursts of
# 10, so that 100 calls at once reach the limiter here as they would on a fast host.
printf 'guest-api-rate=2\nguest-api-burst=10\n' >> "$CONF"
WEBPID=

cleanup() {
  if [ -n "$HOSTD_PID" ] && kill -0 "$HOSTD_PID" 2>/dev/null; then
    # Forks first: an agent that forks stand on cannot be removed before them.
    for a in $(vmctl list --json 2>/dev/null | python3 -c 'import json,sys; [print(a["name"]) for a in sorted(json.load(sys.stdin), key=lambda a: "forked_from" not in a)]' 2>/dev/null); do
      vmctl rm --force "$a" >/dev/null 2>&1
    done
    kill "$HOSTD_PID" 2>/dev/null; wait "$HOSTD_PID" 2>/dev/null
  fi
  destroy_leftover_domains
  [ -n "$WEBPID" ] && kill "$WEBPID" 2>/dev/null
  if [ "$FAILED" -ne 0 ] || [ "$N" -eq 0 ]; then
    diag_err "hostd log:"; diag_err "$(tail -n 40 "$LOG" 2>/dev/null)"
  fi
  rm -rf "$S"
}
trap cleanup EXIT

# Every image of agent a1 passes `qemu-img check`: checkpoint images with no finding at all; the
# active overlay, which the running guest may be writing while it is read (-U), with no
# corruption: leaked clusters (exit 3) there are writes in flight, since QEMU writes a cluster's
# refcount before the table that points to it, and vanish at the guest's next flush.
images_clean() {
  local active f rc
  active=$(sed -n 's/^active=//p' "$S/agents/a1/checkpoints.ini" 2>/dev/null)
  for f in "$S"/agents/a1/*.qcow2; do
    qemu-img check -q -U "$f" >/dev/null 2>&1; rc=$?
    [ "$rc" = 0 ] || { [ "$rc" = 3 ] && [ "${f##*/}" = "${active:-disk.qcow2}" ]; } || return 1
  done
}
export -f images_clean
export S

# Restarts hostd with the fault hook at STEP, runs the vmctl command that reaches it (hostd dies
# there, SIGKILL), and waits until hostd is gone.
die_at() { # die_at STEP VMCTL-ARGS...
  local step=$1; shift
  kill "$HOSTD_PID"; wait "$HOSTD_PID" 2>/dev/null
  HOSTD_TEST_CRASH_AT=$step start_hostd
  vmctl "$@" >/dev/null 2>&1
  wait "$HOSTD_PID" 2>/dev/null
}

# --- hostd start-up and bad input that needs no VM -------------------------------------------
out=$("$VMCTL" --socket "$S/nope.sock" list 2>&1); rc=$?
check "vmctl without hostd: one line naming the socket, exit 12" \
  test "$rc" = 12 -a "$out" = "vmctl: hostd is not running at $S/nope.sock"

check "hostd starts on the embedded driver" start_hostd
grep -q 'accelerator:' "$LOG" && ok "hostd logs which accelerator it uses" || not_ok "accelerator logged"
check "socket is mode 0600" test "$(stat -c %a "$SOCK")" = 600

"$HOSTD" --config "$CONF" --state-dir "$S" --socket "$S/second.sock" > "$S/second.log" 2>&1; rc=$?
check "a second hostd on the same state dir refuses to start (exit 16)" \
  test "$rc" = 16 -a ! -e "$S/second.sock"

for bad in '../x' 'A' 'a b' '-a' '' "$(printf 'a%.0s' $(seq 1 64))"; do
  out=$(vmctl new "$bad" 2>&1); rc=$?
  check "new rejects name '${bad:0:12}' with exit 2 and one line" \
    test "$rc" = 2 -a "$(wc -l <<< "$out")" = 1
done
out=$(vmctl new t1 --template nosuch 2>&1); rc=$?
check "unknown template: exit 3" test "$rc" = 3
out=$(vmctl new t1 --cpus 999 2>&1); rc=$?
check "more CPUs than the host: exit 7, nothing left" test "$rc" = 7 -a ! -e "$S/agents/t1"
out=$(vmctl info nosuch 2>&1); rc=$?
check "info of an unknown agent: exit 3" test "$rc" = 3

# --- the image ------------------------------------------------------------------------------
t0=$(date +%s)
vmctl template build debian-12 > "$S/build.log" 2>&1; rc=$?
check "template build debian-12 ($(( $(date +%s) - t0 )) s)" test "$rc" = 0
[ "$rc" = 0 ] || diag "$(tail -n 20 "$S/build.log")"
check "template list shows debian-12 ready" \
  bash -c "'$VMCTL' --socket '$SOCK' template list | grep -E '^debian-12 +yes'"

# --- one agent, shared by the checks below --------------------------------------------------
t0=$(date +%s)
vmctl new a1 > "$S/new.log" 2>&1; rc=$?
BOOT=$(( $(date +%s) - t0 ))
check "new a1 returns once SSH answers (${BOOT} s)" test "$rc" = 0
if [ "$rc" != 0 ]; then
  diag "$(tail -n 30 "$S/new.log")"
  echo "Bail out! no agent to test"
  exit 1
fi
echo "# boot-to-ssh seconds: $BOOT"

check "list shows a1 running" bash -c "'$VMCTL' --socket '$SOCK' list | grep -E '^a1 +running'"
info=$(vmctl --json info a1)
check "info --json has state, port, template, resources" python3 -c '
import json, sys
a = json.loads(sys.argv[1])
assert a["state"] == "running" and a["template"] == "debian-12"
assert a["cpus"] == 2 and a["memory_mib"] == 1024
assert int(sys.argv[2]) <= a["ssh_port"] <= int(sys.argv[3])
assert a["disk_bytes"] > 0 and a["created"] > 0
' "$info" "${VM_TEST_PORT_MIN:-43100}" "${VM_TEST_PORT_MAX:-43199}"
PORT=$(python3 -c 'import json,sys; print(json.loads(sys.argv[1])["ssh_port"])' "$info")
check "SSH is forwarded on 127.0.0.1 only" \
  bash -c "ss -ltnH | awk '{print \$4}' | grep -qx '127.0.0.1:$PORT' && ! ss -ltnH | awk '{print \$4}' | grep -q '0.0.0.0:$PORT'"

vmctl exec a1 -- sh -c 'echo out; echo err >&2; exit 7' > "$S/o" 2> "$S/e"; rc=$?
check "exec: exit status is the command's" test "$rc" = 7
check "exec: stdout and stderr arrive apart" \
  bash -c "[ \"\$(cat '$S/o')\" = out ] && [ \"\$(cat '$S/e')\" = err ]"
check "exec: stdin is forwarded" test "$(echo hello | vmctl exec a1 -- cat)" = hello
head -c 3000000 /dev/urandom > "$S/big"
check "exec: 3 MB through stdin and stdout unchanged" \
  bash -c "'$VMCTL' --socket '$SOCK' exec a1 -- cat < '$S/big' | cmp -s - '$S/big'"
check "exec -e and -w" test "$(vmctl exec a1 -e FOO='a b' -w /etc -- sh -c 'echo "$FOO $(pwd)"')" = "a b /etc"
check "exec runs as the agent user with passwordless sudo" \
  test "$(vmctl exec a1 -- sudo -n id -u)" = 0
out=$(vmctl exec nosuch -- true 2>&1); rc=$?
check "exec on an unknown agent exits 125" test "$rc" = 125
check "guest hostname is the agent name" test "$(vmctl exec a1 -- hostname)" = a1

# vmctl cp: a tree with a 200 MB file both ways, exit statuses
cp_check a1
# --- logs, stats, metrics of the shared agent --------------------------------------------------
observe_check a1

# ssh-config with the real OpenSSH client
vmctl ssh-config a1 > "$S/ssh_config"
check "ssh-config + ssh -F: plain OpenSSH works with strict host key checking" \
  test "$(ssh -F "$S/ssh_config" -o BatchMode=yes vmctl-a1 echo hi)" = hi
# A new SSH session runs no per-login scripts (update-motd's, three process starts each under
# TCG): the motd's dynamic part was written once at boot and a connection leaves it alone.
motd_before=$(vmctl exec a1 -- stat -c %Y.%s /run/motd.dynamic 2>&1)
sleep 1.1
ssh -F "$S/ssh_config" -o BatchMode=yes vmctl-a1 true
check "a new SSH session leaves the boot's motd alone ($motd_before)" \
  test "$(vmctl exec a1 -- stat -c %Y.%s /run/motd.dynamic 2>&1)" = "$motd_before"
echo "payload $RANDOM" > "$S/in.txt"
if scp -q -F "$S/ssh_config" "$S/in.txt" vmctl-a1:in.txt > "$S/scp.log" 2>&1 &&
   scp -q -F "$S/ssh_config" vmctl-a1:in.txt "$S/back.txt" >> "$S/scp.log" 2>&1 &&
   cmp -s "$S/in.txt" "$S/back.txt"; then
  ok "scp a file in and out"
else
  not_ok "scp a file in and out"; diag "$(cat "$S/scp.log")"
fi
sed "s#UserKnownHostsFile .*#UserKnownHostsFile \"$S/wrong_known_hosts\"#" "$S/ssh_config" > "$S/ssh_config_wrong"
ssh-keygen -q -t ed25519 -N '' -f "$S/otherkey" >/dev/null
echo "[127.0.0.1]:$PORT $(cut -d' ' -f1,2 "$S/otherkey.pub")" > "$S/wrong_known_hosts"
check "a different pinned host key is refused (no trust on first use)" \
  bash -c "! ssh -F '$S/ssh_config_wrong' -o BatchMode=yes vmctl-a1 true 2>/dev/null"
check "the guest offers only the host key hostd generated" \
  bash -c "[ \"\$('$VMCTL' --socket '$SOCK' exec a1 -- sh -c 'ls /etc/ssh/ssh_host_*_key.pub | wc -l')\" = 1 ]"

# restricted user networking: the host's loopback services are unreachable from the guest
WEBPORT=$((PORT + 50))
python3 -m http.server --bind 127.0.0.1 "$WEBPORT" --directory "$S" > "$S/web.log" 2>&1 &
WEBPID=$!
sleep 1
# Direct connections only (--noproxy): the egress proxy's own checks are in vm-egress.sh.
vmctl exec a1 -- sh -c "curl --noproxy '*' -s -m 5 -o /dev/null http://10.0.2.2:$WEBPORT/" >/dev/null 2>&1; rc=$?
check "guest cannot reach a server on the host's 127.0.0.1 via 10.0.2.2" \
  bash -c "[ $rc != 0 ] && ! grep -q 'GET /' '$S/web.log'"
vmctl exec a1 -- curl --noproxy '*' -s -m 5 -o /dev/null http://deb.debian.org/ >/dev/null 2>&1; rc=$?
check "guest has no way out to the internet" test "$rc" != 0
kill "$WEBPID" 2>/dev/null; WEBPID=

# hostd SIGKILLed while the agent runs: the agent keeps running and is reachable after restart
BOOT_ID=$(vmctl exec a1 -- cat /proc/sys/kernel/random/boot_id)
kill -9 "$HOSTD_PID"; wait "$HOSTD_PID" 2>/dev/null
check "hostd restarts after SIGKILL" start_hostd
check "agent still running after the restart" bash -c "'$VMCTL' --socket '$SOCK' list | grep -E '^a1 +running'"
check "same boot id: the VM was never restarted" \
  test "$(vmctl exec a1 -- cat /proc/sys/kernel/random/boot_id)" = "$BOOT_ID"

# checkpoints: the story of an agent that breaks its machine
vmctl exec a1 -- sh -c 'mkdir -p ~/proj && head -c 2000000 /dev/urandom > ~/proj/data.bin && echo v1 > ~/proj/notes.txt && cd ~/proj && sha256sum data.bin notes.txt > ~/sums && sync'
t0=$(date +%s%N)
CK=$(vmctl checkpoint a1 --label before-break 2> "$S/ck.err"); rc=$?
CK_MS=$(( ($(date +%s%N) - t0) / 1000000 ))
check "checkpoint of the running agent prints its id (${CK_MS} ms)" \
  bash -c "[ $rc = 0 ] && [ '$CK' = c1 ] && [ ! -s '$S/ck.err' ]"
echo "# checkpoint-ms: $CK_MS"
check "the agent kept running through the checkpoint" test "$(vmctl exec a1 -- cat /proc/sys/kernel/random/boot_id)" = "$BOOT_ID"
# The checkpoint turns expedited RCU grace periods on for its freeze only.
check "the guest's RCU grace periods are back to normal after it" \
  test "$(vmctl exec a1 -- cat /sys/kernel/rcu_expedited)" = 0
check "checkpoints lists it, frozen (quiesced), with its label" \
  bash -c "'$VMCTL' --socket '$SOCK' --json checkpoints a1 | python3 -c '
import json, sys
c = json.load(sys.stdin)
assert len(c) == 1 and c[0][\"id\"] == \"c1\" and c[0][\"quiesced\"] and c[0][\"label\"] == \"before-break\"
assert not c[0][\"automatic\"] and c[0][\"kind\"] == \"disk\" and c[0][\"bytes\"] > 0'"
vmctl exec a1 -- sh -c 'echo v2 > ~/proj/notes.txt; rm -f ~/proj/data.bin; echo new > ~/proj/after.txt; sync'
# Fill the disk (fallocate: the filesystem is full at once, without writing 7 GiB under TCG).
vmctl exec a1 -- sh -c 'sudo fallocate -l $(df -B1 --output=avail / | tail -n 1) /fill; sudo fallocate -l $(df -B1 --output=avail / | tail -n 1) /fill2; sync' 2>/dev/null
check "the agent filled its disk" test "$(vmctl exec a1 -- df -B1M --output=avail / | tail -n 1 | tr -d ' ')" -le 1
vmctl exec a1 -- sh -c 'sudo rm -rf /usr/bin /etc/ssh 2>/dev/null; true' 2>/dev/null
check "the agent broke its machine (no /usr/bin)" bash -c "! '$VMCTL' --socket '$SOCK' exec a1 -- ls / >/dev/null 2>&1"
out=$(vmctl restore a1 c9 2>&1); rc=$?
check "restore of an unknown checkpoint: exit 3, nothing changed" test "$rc" = 3 -a "$(vmctl --json checkpoints a1 | python3 -c 'import json,sys; print(len(json.load(sys.stdin)))')" = 1
out=$(vmctl checkpoint nosuch 2>&1); rc=$?
check "checkpoint of an unknown agent: exit 3" test "$rc" = 3
t0=$(date +%s)
UNDO=$(vmctl -q restore a1 c1 | sed -n 's/.*undo with: vmctl restore a1 \(c[0-9]*\).*/\1/p')
check "restore a1 c1 boots the agent back ($(( $(date +%s) - t0 )) s)" test -n "$UNDO"
check "the disk has its room back after the restore" \
  bash -c "[ \$('$VMCTL' --socket '$SOCK' exec a1 -- df -B1M --output=avail / | tail -n 1) -gt 1000 ]"
check "every file is byte-identical after the restore" \
  bash -c "'$VMCTL' --socket '$SOCK' exec a1 -- sh -c 'cd ~/proj && sha256sum -c --quiet ~/sums && test ! -e after.txt'"
check "SSH with the pinned host key works again after the restore" \
  test "$(ssh -F "$S/ssh_config" -o BatchMode=yes vmctl-a1 echo back)" = back
check "the state before the restore was kept as an automatic checkpoint" \
  bash -c "'$VMCTL' --socket '$SOCK' --json checkpoints a1 | python3 -c '
import json, sys
c = {x[\"id\"]: x for x in json.load(sys.stdin)}
assert c[\"$UNDO\"][\"automatic\"] and \"before restore\" in c[\"$UNDO\"][\"label\"] and c[\"c1\"][\"current\"]'"
out=$(vmctl checkpoint rm a1 c1 2>&1); rc=$?
check "checkpoint rm of a checkpoint others stand on is refused (exit 5)" test "$rc" = 5
check "checkpoint rm of a leaf" vmctl checkpoint rm a1 "$UNDO"
check "checkpoint rm merges the last checkpoint into the running disk" vmctl checkpoint rm a1 c1
check "files intact after the merge, chain back to one overlay" \
  bash -c "'$VMCTL' --socket '$SOCK' exec a1 -- sh -c 'cd ~/proj && sha256sum -c --quiet ~/sums' && [ \$(ls '$S/agents/a1/'*.qcow2 | wc -l) = 1 ]"

# memory checkpoints: a restore resumes the processes instead of booting
vmctl exec a1 -- sh -c 'nohup sleep 100000 >/dev/null 2>&1 & echo $! > ~/sleeper.pid; echo kept > ~/mem.txt; sync'
SLEEPER=$(vmctl exec a1 -- cat sleeper.pid)
t0=$(date +%s%N)
MCK=$(vmctl checkpoint a1 --memory --label with-ram 2> "$S/mck.err"); rc=$?
MCK_MS=$(( ($(date +%s%N) - t0) / 1000000 ))
check "checkpoint --memory of the running agent (${MCK_MS} ms)" test "$rc" = 0 -a -n "$MCK" || diag "$(cat "$S/mck.err")"
check "checkpoints shows it as a memory checkpoint holding the RAM's bytes" \
  bash -c "'$VMCTL' --socket '$SOCK' --json checkpoints a1 | python3 -c '
import json, sys
c = {x[\"id\"]: x for x in json.load(sys.stdin)}[\"$MCK\"]
assert c[\"kind\"] == \"memory\" and c[\"bytes\"] > 50 * 2**20, c'"
vmctl exec a1 -- sh -c 'kill $(cat ~/sleeper.pid); rm -f ~/mem.txt; sync'
sleep 3
t0=$(date +%s%N)
out=$(vmctl restore a1 "$MCK" 2>&1); rc=$?
MRS_MS=$(( ($(date +%s%N) - t0) / 1000000 ))
MUNDO=$(sed -n 's/.*undo with: vmctl restore a1 \(c[0-9]*\).*/\1/p' <<< "$out")
check "restore of a memory checkpoint resumes (${MRS_MS} ms)" bash -c "[ $rc = 0 ] && grep -q 'resuming the saved processes' <<< \"\$1\"" _ "$out" || diag "$out"
echo "# memory-checkpoint-ms: $MCK_MS memory-restore-ms: $MRS_MS"
check "a process started before the memory checkpoint is running after the restore" \
  vmctl exec a1 -- sh -c "kill -0 $SLEEPER && grep -q sleep /proc/$SLEEPER/cmdline"
check "the file deleted after it is back" test "$(vmctl exec a1 -- cat mem.txt)" = kept
check "the guest clock was set after the resume (within 3 s of the host's)" \
  bash -c "g=\$('$VMCTL' --socket '$SOCK' exec a1 -- date +%s); h=\$(date +%s); [ \$((h - g)) -le 3 ] && [ \$((g - h)) -le 3 ]"
vmctl exec a1 -- sh -c 'kill $(cat ~/sleeper.pid)'
# hostd killed after a restore's journal is written: the next start rolls the restore back
MBOOT=$(vmctl exec a1 -- cat /proc/sys/kernel/random/boot_id)
files_before=$(ls "$S/agents/a1/" | grep -c qcow2)
die_at restore-journaled restore a1 "$MUNDO"
check "hostd restarts after dying at restore-journaled" start_hostd
check "killed at restore-journaled: rolled back (agent running the same boot, only the undo checkpoint's overlay added)" \
  bash -c "[ \"\$('$VMCTL' --socket '$SOCK' exec a1 -- cat /proc/sys/kernel/random/boot_id)\" = '$MBOOT' ] && [ \$(ls '$S/agents/a1/' | grep -c qcow2) = $((files_before + 1)) ]"
check "killed at restore-journaled: qemu-img check is clean on every image" \
  images_clean
XUNDO=$(vmctl --json checkpoints a1 | python3 -c 'import json,sys; print(json.load(sys.stdin)[-1]["id"])')
# A memory checkpoint restored after that interrupted restore and both hostd restarts: the
# processes resume (same boot) on the disk of that instant.
vmctl exec a1 -- rm -f mem.txt
out=$(vmctl restore a1 "$MCK" 2>&1); rc=$?
M2UNDO=$(sed -n 's/.*undo with: vmctl restore a1 \(c[0-9]*\).*/\1/p' <<< "$out")
check "after the interrupted restore and restarts, the memory checkpoint resumes (same boot, its files)" \
  bash -c "[ $rc = 0 ] && grep -q 'resuming the saved processes' <<< \"\$1\" &&
    [ \"\$('$VMCTL' --socket '$SOCK' exec a1 -- cat /proc/sys/kernel/random/boot_id)\" = '$MBOOT' ] &&
    [ \"\$('$VMCTL' --socket '$SOCK' exec a1 -- cat mem.txt)\" = kept ]" _ "$out" || diag "$out"
# hostd killed after a restore stopped the agent, then after it defined the new disk: the first
# rolls back (the agent keeps its disk and, wanted running, is booted again at the start), the
# second finishes (it boots on the checkpoint's disk; a memory checkpoint's processes are lost,
# its disk is not).
vmctl exec a1 -- sh -c 'echo later > ~/marker; sync'
files_before=$(ls "$S/agents/a1/" | grep -c qcow2)
die_at restore-stopped restore a1 "$MCK"
check "hostd restarts after dying at restore-stopped" start_hostd
# Booted by hostd itself: starting until its guest answers, then running.
check "killed at restore-stopped: rolled back (booted again on its own disk, only the undo checkpoint's overlay added, qemu-img check clean)" \
  bash -c "[[ \"\$('$VMCTL' --socket '$SOCK' --json info a1 | python3 -c 'import json,sys; print(json.load(sys.stdin)[\"state\"])')\" =~ ^(starting|running)$ ]] &&
    [ \$(ls '$S/agents/a1/' | grep -c qcow2) = $((files_before + 1)) ] &&
    [ \$(grep -c 'rolled back an unfinished restore' '$LOG') = 2 ] &&
    images_clean"
die_at restore-defined restore a1 "$MCK"
check "hostd restarts after dying at restore-defined" start_hostd
check "killed at restore-defined: finished (qemu-img check clean, the replaced overlay deleted)" \
  bash -c "grep -q 'finished an interrupted restore' '$LOG' &&
    [ \$(ls '$S/agents/a1/' | grep -c qcow2) = $((files_before + 2)) ] &&
    images_clean"
vmctl start a1 >/dev/null 2>&1
check "killed at restore-defined: the agent then boots on the checkpoint's disk" \
  test "$(vmctl exec a1 -- sh -c 'cat mem.txt; ls marker 2>&1 >/dev/null | wc -l')" = "$(printf 'kept\n1')"
for c in $(vmctl --json checkpoints a1 | python3 -c 'import json,sys; print(" ".join(c["id"] for c in reversed(json.load(sys.stdin)) if c["id"] not in ("'"$MCK"'", "'"$MUNDO"'")))'); do
  vmctl checkpoint rm a1 "$c" >/dev/null
done
vmctl checkpoint rm a1 "$MUNDO" >/dev/null
check "checkpoint rm of a memory checkpoint removes its state file" \
  bash -c "'$VMCTL' --socket '$SOCK' checkpoint rm a1 '$MCK' && ! ls '$S/agents/a1/' | grep -q '^memory-'"

# diff and partial restore: what the agent changed, and one tree put back with the rest left alone
H=$(vmctl exec a1 -- sh -c 'echo $HOME')
BOOT_ID=$(vmctl exec a1 -- cat /proc/sys/kernel/random/boot_id)
vmctl exec a1 -- sh -c 'mkdir -p ~/dt/tree/sub && echo 1 > ~/dt/changed && echo x > ~/dt/tree/sub/f && echo gone > ~/dt/deleted && echo same > ~/dt/touched && sync'
DCK=$(vmctl checkpoint a1 --label diff-base)
vmctl exec a1 -- sh -c 'echo 2 > ~/dt/changed; rm ~/dt/deleted; rm -rf ~/dt/tree; echo new > ~/dt/added; touch ~/dt/touched; sync'
printf '%s\n' "A $H/dt/added" "M $H/dt/changed" "D $H/dt/deleted" "D $H/dt/tree" "D $H/dt/tree/sub" "D $H/dt/tree/sub/f" > "$S/diff.expected"
t0=$(date +%s)
# Who reads the images: the helper and its appliance's QEMU, sampled from /proc while the diff
# runs (uid, no_new_privs, program). Only this hostd's: both name the appliance under $S, and
# the suites beside this one run diffs of their own. A process that ended between the reads of
# its cmdline and its status is skipped, not counted as one with no uid.
(
  while :; do
    for p in /proc/[0-9]*; do
      c=$(tr '\0' ' ' < "$p/cmdline" 2>/dev/null) || continue
      case $c in *"$S/"*) ;; *) continue ;; esac
      case $c in
        *vm-guestfs-helper\ diff*|*qemu-system*guestfs*)
          id=$(awk '$1 == "Uid:" { u = $2 } $1 == "NoNewPrivs:" { n = $2 }
                    END { if (u != "" && n != "") print u, n }' "$p/status" 2>/dev/null)
          [ -z "$id" ] || echo "$id ${c%% *}" ;;
      esac
    done
    sleep 0.5
  done > "$S/diff-readers" 2>/dev/null
) &
sampler=$!
vmctl diff a1 "$DCK" --path "$H/dt" > "$S/diff.out" 2> "$S/diff.err"; rc=$?
kill "$sampler"; wait "$sampler" 2>/dev/null
A1_ID=$(confine_id a1)
check "diff's helper and its appliance ran as a1's own id ($A1_ID) with no_new_privs, never as root" \
  bash -c "grep -q vm-guestfs-helper '$S/diff-readers' && grep -q '^[0-9]* [01] .*qemu-system' '$S/diff-readers' &&
           ! awk '\$1 != \"$A1_ID\" || \$2 != 1' '$S/diff-readers' | grep -q ." || diag "$(sort -u "$S/diff-readers")"
check "diff against the running agent lists exactly what was added, changed and deleted ($(( $(date +%s) - t0 )) s)" \
  bash -c "[ $rc = 0 ] && diff -u '$S/diff.expected' '$S/diff.out'" || diag "$(cat "$S/diff.out" "$S/diff.err")"
check "diff of the running agent left no checkpoint behind" \
  test "$(vmctl --json checkpoints a1 | python3 -c 'import json,sys; print(len(json.load(sys.stdin)))')" = 1
DCK2=$(vmctl checkpoint a1 --label diff-after)
check "diff --json between two checkpoints gives the same list" bash -c "
  '$VMCTL' --socket '$SOCK' --json diff a1 '$DCK' '$DCK2' --path '$H/dt' |
  python3 -c 'import json,sys; [print(c[\"kind\"], c[\"path\"]) for c in json.load(sys.stdin)]' | diff -u '$S/diff.expected' -"
# A file named by the guest with an escape sequence and a newline: the name reaches the terminal
# escaped, one line, no raw control byte.
vmctl exec a1 -- sh -c 'touch "$HOME/dt/$(printf "evil\033[2J\nforged")"; sync'
vmctl diff a1 "$DCK2" --path "$H/dt" > "$S/diff-escaped.out" 2> "$S/diff-escaped.err"
check "diff shows a guest file named with an escape sequence and a newline escaped, on one line" \
  bash -c "grep -qxF 'A $H/dt/evil\\x1b[2J\\nforged' '$S/diff-escaped.out' && [ \$(wc -l < '$S/diff-escaped.out') = 1 ] &&
           ! LC_ALL=C grep -q \$'\\033' '$S/diff-escaped.out'" || diag "$(cat -v "$S/diff-escaped.out" "$S/diff-escaped.err")"
vmctl exec a1 -- sh -c 'rm -f "$HOME"/dt/evil*; sync'
n_before=$(vmctl --json checkpoints a1 | python3 -c 'import json,sys; print(len(json.load(sys.stdin)))')
out=$(vmctl restore a1 "$DCK" --path "$H/../etc" 2>&1); rc=$?
check "restore --path with '..': exit 2, one line" bash -c "[ $rc = 2 ] && [ \$(wc -l <<< \"\$1\") = 1 ]" _ "$out"
out=$(vmctl restore a1 "$DCK" --path relative/dir 2>&1); rc=$?
check "restore --path outside the guest root (not absolute): exit 2" test "$rc" = 2
out=$(vmctl restore a1 "$DCK" --path /no/such/path 2>&1); rc=$?
check "restore --path of a path the checkpoint lacks: exit 3, names it, nothing changed" \
  bash -c "[ $rc = 3 ] && grep -q '/no/such/path' <<< \"\$1\" && [ \$('$VMCTL' --socket '$SOCK' --json checkpoints a1 | python3 -c 'import json,sys; print(len(json.load(sys.stdin)))') = $n_before ]" _ "$out"
t0=$(date +%s)
out=$(vmctl restore a1 "$DCK" --path "$H/dt/tree" 2>&1); rc=$?
PUNDO=$(sed -n 's/.*undo with: vmctl restore a1 \(c[0-9]*\).*/\1/p' <<< "$out")
check "restore --path puts one deleted tree back ($(( $(date +%s) - t0 )) s), owned by the user" \
  bash -c "[ $rc = 0 ] && [ \"\$('$VMCTL' --socket '$SOCK' exec a1 -- sh -c 'cat ~/dt/tree/sub/f; stat -c %U ~/dt/tree/sub/f')\" = \"\$(printf 'x\nagent')\" ]" || diag "$out"
check "and leaves the rest as it was (a file made after the checkpoint stays, a changed one too)" \
  test "$(vmctl exec a1 -- sh -c 'cat ~/dt/added ~/dt/changed; [ ! -e ~/dt/deleted ] && echo ok')" = "$(printf 'new\n2\nok')"
check "the agent kept running through the partial restore" \
  test "$(vmctl exec a1 -- cat /proc/sys/kernel/random/boot_id)" = "$BOOT_ID"
for c in "$PUNDO" "$DCK2" "$DCK"; do vmctl checkpoint rm a1 "$c" >/dev/null; done

# a checkpoint refuses to start, before touching the chain, when the disk lacks room (the test
# hook counts all but 100 MiB of the free space as taken)
files_before=$(ls "$S/agents/a1/" | tr '\n' ' ')
kill "$HOSTD_PID"; wait "$HOSTD_PID" 2>/dev/null
HOSTD_TEST_RESERVE_BYTES=$(( $(df -B1 --output=avail "$S" | tail -n 1) - 100 * 1024 * 1024 )) start_hostd
out=$(vmctl checkpoint a1 2>&1); rc=$?
check "checkpoint with too little room on the host: exit 7, one line naming the need, nothing changed" \
  bash -c "[ $rc = 7 ] && grep -q 'needs at least 256 MiB' <<< \"\$1\" && [ \$(wc -l <<< \"\$1\") = 1 ] &&
    [ \"\$(ls '$S/agents/a1/' | tr '\n' ' ')\" = '$files_before' ] && ! grep -q '^\[pending\]' '$S/agents/a1/checkpoints.ini' 2>/dev/null" _ "$out" || diag "$out"
kill "$HOSTD_PID"; wait "$HOSTD_PID" 2>/dev/null
start_hostd

# crash safety: hostd killed at a named step of a checkpoint; the next start repairs the record
BOOT_ID=$(vmctl exec a1 -- cat /proc/sys/kernel/random/boot_id)
for step in checkpoint-journaled checkpoint-switched; do
  before=$(ls "$S/agents/a1/" | grep -c qcow2)
  die_at "$step" checkpoint a1
  check "hostd restarts after dying at $step" start_hostd
  n=$(vmctl --json checkpoints a1 | python3 -c 'import json,sys; print(len(json.load(sys.stdin)))')
  files=$(ls "$S/agents/a1/" | grep -c qcow2)
  if [ "$step" = checkpoint-journaled ]; then
    check "killed at $step: rolled back (no checkpoint, no orphan overlay)" test "$n" = 0 -a "$files" = "$before"
  else
    check "killed at $step: finished (one checkpoint, its overlay in use)" test "$n" = 1 -a "$files" = $((before + 1))
  fi
  check "killed at $step: qemu-img check is clean on every image" \
    images_clean
  check "killed at $step: the agent kept running and answers" \
    test "$(vmctl exec a1 -- cat /proc/sys/kernel/random/boot_id)" = "$BOOT_ID"
done
CKS=$(vmctl --json checkpoints a1 | python3 -c 'import json,sys; print(" ".join(c["id"] for c in json.load(sys.stdin)))')
for c in $CKS; do vmctl checkpoint rm a1 "$c" >/dev/null; done

# ... and at a named step of a merge: removing K1 under K2 while the agent runs commits K2's
# image down into K1's file, which from then on no longer holds K1; the next start finishes it.
MERGES=0
for step in merge-journaled merge-committed; do
  MERGES=$((MERGES + 1))
  vmctl exec a1 -- sh -c "rm -rf ~/mg; mkdir ~/mg; echo 1 > ~/mg/k1; sync"
  K1=$(vmctl checkpoint a1)
  vmctl exec a1 -- sh -c "echo 2 > ~/mg/k2; sync"
  K2=$(vmctl checkpoint a1)
  vmctl exec a1 -- sh -c "echo 3 > ~/mg/after; sync"
  before=$(ls "$S/agents/a1/" | grep -c qcow2)
  die_at "$step" checkpoint rm a1 "$K1"
  check "hostd restarts after dying at $step" start_hostd
  check "killed at $step: the merge was finished ($K1 gone, $K2 kept, one file fewer)" bash -c "
    [ \"\$('$VMCTL' --socket '$SOCK' --json checkpoints a1 | python3 -c 'import json,sys; print(\" \".join(c[\"id\"] for c in json.load(sys.stdin)))')\" = '$K2' ] &&
    [ \$(ls '$S/agents/a1/' | grep -c qcow2) = $((before - 1)) ] && [ \$(grep -c 'finished an interrupted merge' '$LOG') = $MERGES ]"
  check "killed at $step: qemu-img check is clean on every image" \
    images_clean
  vmctl diff a1 "$K2" --path "$H/mg" > "$S/mg.out" 2> "$S/mg.err"
  check "killed at $step: $K2 still holds exactly its files (diff to now: only the later one added)" \
    test "$(cat "$S/mg.out")" = "A $H/mg/after" || diag "$(cat "$S/mg.out")"
  check "killed at $step: the agent kept running and answers" \
    test "$(vmctl exec a1 -- cat /proc/sys/kernel/random/boot_id)" = "$BOOT_ID"
  vmctl checkpoint rm a1 "$K2" >/dev/null
done

# the in-guest API from inside the agent: checkpoint itself, refusals, rate limit
guest_api_check a1

# idle: running -> paused -> saved by itself, and any way in wakes it
state_of() { vmctl list --json | python3 -c 'import json,sys; print([a["state"] for a in json.load(sys.stdin) if a["name"] == "a1"][0])'; }
wait_state() { # wait_state STATE SECONDS
  for _ in $(seq 1 "$2"); do [ "$(state_of)" = "$1" ] && return 0; sleep 1; done; return 1
}
clock_skew() { # seconds between the guest's clock and the host's, read through $1
  local g; g=$("$@" date +%s); echo $(( g > $(date +%s) ? g - $(date +%s) : $(date +%s) - g ))
}
vmctl exec a1 -- sh -c 'nohup sleep 100000 >/dev/null 2>&1 & echo $! > ~/bg.pid'
# The guest's sshd processes of hostd's session over the virtio port (joined to sshd over
# loopback in the guest): what a command after a saved wake runs under when the session carried
# over.
held_session_pids() {
  vmctl exec a1 -- sudo ss -Htnp state established '( sport = :22 )' |
    grep -F ' 127.0.0.1:' | grep -o 'pid=[0-9]*' | cut -d= -f2 | sort -u
}
for _ in $(seq 1 60); do HELD_PIDS=$(held_session_pids); [ -n "$HELD_PIDS" ] && break; sleep 1; done
check "hostd holds an SSH session over the virtio port" test -n "$HELD_PIDS"
check "idle policy set per agent" vmctl idle a1 --pause-after 6s --save-after 20s
vmctl exec a1 -- sleep 14 < /dev/null &
EXEC_PID=$!
sleep 11
check "an open vmctl exec keeps the agent running past the threshold" test "$(state_of)" = running
wait "$EXEC_PID"
check "the idle agent pauses by itself" wait_state paused 40
sleep 3
t0=$(date +%s%N)
skew=$(clock_skew ssh -F "$S/ssh_config" -o BatchMode=yes vmctl-a1)
WAKE_PAUSED_MS=$(( ($(date +%s%N) - t0) / 1000000 ))
check "plain OpenSSH wakes a paused agent (${WAKE_PAUSED_MS} ms), clock right within 2 s" \
  test -n "$skew" -a "${skew:-9}" -le 2
check "a background process survived the pause" vmctl exec a1 -- sh -c 'kill -0 $(cat ~/bg.pid)'
check "the idle agent is saved to disk by itself" wait_state saved 90
# This suite's a1 only: another suite on the host may run an a1 of its own.
check "a saved agent has no QEMU process" \
  bash -c "! ps -C qemu-system-x86_64 -o args= | grep 'guest=a1,' | grep -q '$S/agents/a1/'"
sleep 3
t0=$(date +%s%N)
skew=$(clock_skew vmctl exec a1 --)
WAKE_SAVED_MS=$(( ($(date +%s%N) - t0) / 1000000 ))
check "vmctl exec wakes a saved agent (${WAKE_SAVED_MS} ms), clock right within 2 s" \
  test -n "$skew" -a "${skew:-9}" -le 2
check "a background process survived the save" vmctl exec a1 -- sh -c 'kill -0 $(cat ~/bg.pid)'
AFTER_PPID=$(vmctl exec a1 -- sh -c 'echo $PPID')
check "commands after the saved wake run on the session held across the save (no handshake)" \
  grep -qx "$AFTER_PPID" <<< "$HELD_PIDS" || diag "ran under $AFTER_PPID, held: $HELD_PIDS"
echo "# wake-ms paused: $WAKE_PAUSED_MS saved: $WAKE_SAVED_MS"
before_save_count() {
  vmctl --json checkpoints a1 | python3 -c 'import json,sys; print(sum(1 for c in json.load(sys.stdin) if c.get("label") == "before idle save" and c["automatic"]))'
}
check "the idle save took one automatic checkpoint first" test "$(before_save_count)" = 1
check "idle again: saved again by itself" wait_state saved 90
check "still exactly one before-save checkpoint: the older one was merged away" \
  test "$(before_save_count)" = 1
check "qemu-img check is clean on every image after the merge" \
  images_clean
kill "$HOSTD_PID"; wait "$HOSTD_PID" 2>/dev/null
check "hostd restarts while the agent is saved" start_hostd
check "the agent stays saved across the restart" test "$(state_of)" = saved
SCK=$(vmctl checkpoint a1 --label while-saved 2>/dev/null)
SCK_IMAGE=$(sed -n "/^\[checkpoint $SCK\]/,/^\[/s/^image=//p" "$S/agents/a1/checkpoints.ini")
SCK_SUM=$(sha256sum "$S/agents/a1/$SCK_IMAGE" | cut -d' ' -f1)
check "a checkpoint of the saved agent leaves it saved" \
  test -n "$SCK" -a -n "$SCK_IMAGE" -a "$(state_of)" = saved
check "a plain SSH connection wakes it after the restart" \
  test "$(ssh -F "$S/ssh_config" -o BatchMode=yes vmctl-a1 'kill -0 $(cat ~/bg.pid) && echo alive')" = alive
check "files written before the saves are intact" \
  bash -c "'$VMCTL' --socket '$SOCK' exec a1 -- sh -c 'cd ~/proj && sha256sum -c --quiet ~/sums'"
vmctl exec a1 -- sh -c 'echo after-wake > ~/after-wake.txt && sync'
check "the woken agent writes to the new overlay: the checkpoint taken while saved is unchanged" \
  test "$(sha256sum "$S/agents/a1/$SCK_IMAGE" | cut -d' ' -f1)" = "$SCK_SUM"
vmctl checkpoint rm a1 "$SCK" >/dev/null
check "keep-awake holds the agent" vmctl keep-awake a1
sleep 10
check "a kept-awake agent stays running" test "$(state_of)" = running
check "suspend --save by hand" bash -c "'$VMCTL' --socket '$SOCK' suspend --save a1 >/dev/null"
check "then resume" trace_hostd "$S/wake.trace" vmctl resume a1
check "it answers after the resume" test "$(vmctl exec a1 -- echo up)" = up
opened=$(hostd_opened "$S/wake.trace" | grep "^$S/agents/a1/.*\.qcow2")
check "no image of a1 opened by hostd itself while libvirt restored it" test -z "$opened" ||
  diag "opened by hostd: $opened"
# vmctl cp into a saved agent wakes it
vmctl suspend --save a1 >/dev/null
cp_check_saved a1
# a keep-awake asked from inside holds the agent under the same short idle policy
guest_api_keep_awake_check a1
vmctl idle a1 --never >/dev/null

# periodic automatic checkpoints with retention: the chain stays short however many are taken
FIRST=$(sed -n 's/^next=//p' "$S/agents/a1/checkpoints.ini")
check "periodic checkpoints set per agent" vmctl autocheckpoint a1 --every 5s --keep 2 --hourly 0 --daily 0
sleep 24
vmctl autocheckpoint a1 --never >/dev/null
# Let a checkpoint or merge in flight finish (a block commit writes into the image below, which a
# check would see half-written): no journal, and the same record and files, for 3 s in a row
# (60 s at most).
settle_checkpoints() {
  local prev="" now stable=0
  for _ in $(seq 1 60); do
    now=$(cat "$S/agents/a1/checkpoints.ini"; ls "$S"/agents/a1/*.qcow2)
    if [ "$now" = "$prev" ] && ! grep -q '^\[pending\]' "$S/agents/a1/checkpoints.ini"; then
      stable=$((stable + 1))
      [ "$stable" -ge 3 ] && return 0
    else
      stable=0
    fi
    prev=$now
    sleep 1
  done
}
settle_checkpoints
KEPT=$(vmctl --json checkpoints a1 | python3 -c 'import json,sys; print(" ".join(c["id"][1:] for c in json.load(sys.stdin) if c.get("label") == "periodic"))')
check "periodic checkpoints kept coming and only the newest 2 are kept (of c$FIRST on: ${KEPT// /, })" \
  bash -c "set -- $KEPT; [ \$# = 2 ] && [ \$1 -gt $FIRST ] && [ \$2 -gt \$1 ]"
check "the chain stays short: at most 4 images after 4+ periodic checkpoints" \
  test "$(ls "$S"/agents/a1/*.qcow2 | wc -l)" -le 4
check "qemu-img check is clean on every checkpoint image after the merges" images_clean
check "files intact after the periodic merges" \
  bash -c "'$VMCTL' --socket '$SOCK' exec a1 -- sh -c 'cd ~/proj && sha256sum -c --quiet ~/sums'"

# fork: a second, independent machine from the running agent, with its own identity
vmctl exec a1 -- sh -c 'echo from-source > ~/before-fork.txt && sync'
t0=$(date +%s)
out=$(vmctl fork a1 f1 2>&1); rc=$?
FORK_S=$(( $(date +%s) - t0 ))
check "fork a1 f1 returns once the fork answers SSH (${FORK_S} s)" test "$rc" = 0 || diag "$out"
echo "# fork-to-ssh seconds: $FORK_S"
FORK_CK=$(vmctl --json info f1 | python3 -c 'import json,sys; a = json.load(sys.stdin); print(a.get("fork_checkpoint", ""))')
check "info shows what f1 was forked from" \
  bash -c "'$VMCTL' --socket '$SOCK' info f1 | grep -Eq '^forked from: +a1$' && [ -n '$FORK_CK' ]"
check "the source kept running through the fork (same boot)" \
  test "$(vmctl exec a1 -- cat /proc/sys/kernel/random/boot_id)" = "$BOOT_ID"
check "both run at once" \
  test "$(vmctl list | grep -cE '^(a1|f1) +running')" = 2
check "a file written in the source before the fork is in the fork" \
  test "$(vmctl exec f1 -- cat before-fork.txt 2>&1)" = from-source
cp_check_agents a1 f1
vmctl exec a1 -- sh -c 'echo a > ~/only-source.txt && sync'
vmctl exec f1 -- sh -c 'echo f > ~/only-fork.txt && echo changed > ~/before-fork.txt && sync'
check "writes after the fork stay in their own machine" bash -c "
  '$VMCTL' --socket '$SOCK' exec a1 -- sh -c '[ ! -e only-fork.txt ] && [ \"\$(cat before-fork.txt)\" = from-source ]' &&
  '$VMCTL' --socket '$SOCK' exec f1 -- sh -c '[ ! -e only-source.txt ] && [ \"\$(cat before-fork.txt)\" = changed ]'"
ident() { # machine-id, hostname, host key, MAC, instance-id of an agent, one per line
  vmctl exec "$1" -- sh -c 'cat /etc/machine-id; hostname; sudo cat /etc/ssh/ssh_host_ed25519_key.pub | cut -d" " -f2;
    cat /sys/class/net/e*/address; sudo cat /var/lib/cloud/data/instance-id'
}
ident a1 > "$S/ident-a1"; ident f1 > "$S/ident-f1"
check "machine-id, hostname, host key, MAC and instance-id all differ" python3 -c '
import sys
a = open(sys.argv[1]).read().split(); f = open(sys.argv[2]).read().split()
assert len(a) == 5 and len(f) == 5, (a, f)
assert all(x != y for x, y in zip(a, f)), (a, f)
assert f[1] == "f1"
' "$S/ident-a1" "$S/ident-f1" || diag "$(paste "$S/ident-a1" "$S/ident-f1")"
vmctl ssh-config f1 > "$S/ssh_config_f1"
check "plain OpenSSH with strict host key checking reaches the fork" \
  ssh -F "$S/ssh_config_f1" -o BatchMode=yes vmctl-f1 true
check "the source's agent key is no longer authorized in the fork" \
  bash -c "! '$VMCTL' --socket '$SOCK' exec f1 -- cat .ssh/authorized_keys | grep -q ' vmctl-a1\$'"
# Two agents' QEMUs, each under its own id: neither reaches the other.
confine_check a1 f1
# The port's socket swapped for a link by the agent's id: hostd refuses it.
confine_port_swap f1
# A hung (SIGSTOPped) SSH worker and egress worker of f1: a1 goes on, f1's are replaced.
stopped_workers_check a1 f1
agents_before=$(ls "$S/agents")
out=$(vmctl fork a1 f1 2>&1); rc=$?
check "fork onto an existing name: exit 4" test "$rc" = 4
out=$(vmctl fork nosuch f2 2>&1); rc=$?
check "fork of an unknown agent: exit 3" test "$rc" = 3
out=$(vmctl fork a1 f2 --from c999 2>&1); rc=$?
check "fork from an unknown checkpoint: exit 3" test "$rc" = 3
out=$(vmctl fork a1 F2 2>&1); rc=$?
check "fork to a bad name: exit 2" test "$rc" = 2
check "failed forks left nothing" test "$(ls "$S/agents")" = "$agents_before"
out=$(vmctl restore f1 "$FORK_CK" 2>&1); rc=$?
check "restore of another agent's checkpoint (the source's, from the fork): exit 3, nothing changed" \
  bash -c "[ $rc = 3 ] && [ \"\$('$VMCTL' --socket '$SOCK' --json checkpoints f1 | python3 -c 'import json,sys; print(len(json.load(sys.stdin)))')\" = 0 ]"
out=$(vmctl checkpoint rm a1 "$FORK_CK" 2>&1); rc=$?
check "the checkpoint a fork stands on cannot be removed (exit 5, names the fork)" \
  bash -c "[ $rc = 5 ] && grep -q \"fork 'f1'\" <<< \"\$1\"" _ "$out"
out=$(vmctl rm --force a1 2>&1); rc=$?
check "rm of a source with forks is refused (exit 5), the fork keeps working" \
  bash -c "[ $rc = 5 ] && grep -q 'f1' <<< \"\$1\" && '$VMCTL' --socket '$SOCK' exec f1 -- true" _ "$out"
check "rm --force f1" vmctl rm --force f1
check "then the checkpoint it stood on can go" vmctl checkpoint rm a1 "$FORK_CK"

# stop/start keeps files
vmctl exec a1 -- sh -c 'echo keep-me > ~/kept.txt && sync'
out=$(vmctl rm a1 2>&1); rc=$?
check "rm of a running agent is refused (exit 5)" test "$rc" = 5 -a -d "$S/agents/a1"
t0=$(date +%s)
check "stop a1" vmctl stop a1
check "list shows a1 stopped ($(( $(date +%s) - t0 )) s)" bash -c "'$VMCTL' --socket '$SOCK' list | grep -E '^a1 +stopped'"
out=$(vmctl exec a1 -- true 2>&1); rc=$?
check "exec on a stopped agent: 125 and a hint" bash -c "[ $rc = 125 ] && grep -q 'vmctl start a1' <<< '$out'"
t0=$(date +%s)
# libvirt runs in hostd, as root: it is given a1's whole chain (checkpoints included) from
# hostd's records, so none of hostd's own threads opens an image a1's guest wrote; QEMU and the
# header check do, as a1's id.
check "start a1" trace_hostd "$S/start.trace" vmctl start --no-wait a1
check "a1 answers after its start" wait_ssh a1 360
diag "start-to-ssh seconds: $(( $(date +%s) - t0 ))"
check "the trace of the start saw QEMU open a1's disk" grep -q "openat(.*$S/agents/a1/disk.*qcow2" "$S/start.trace"
opened=$(hostd_opened "$S/start.trace" | grep "^$S/agents/a1/.*\.qcow2")
check "no image of a1 opened by hostd itself during its start" test -z "$opened" ||
  diag "opened by hostd: $opened"
check "a file written before stop survives" test "$(vmctl exec a1 -- cat kept.txt)" = keep-me
check "new with an existing name: exit 4" bash -c "'$VMCTL' --socket '$SOCK' new a1 >/dev/null 2>&1; [ \$? = 4 ]"

# rm leaves nothing
check "rm --force a1" vmctl rm --force a1
check "rm leaves no files" test ! -e "$S/agents/a1"
check "rm leaves no domain" bash -c "[ -z \"\$('$VMCTL' --socket '$SOCK' list --json | python3 -c 'import json,sys; print(\" \".join(a[\"name\"] for a in json.load(sys.stdin)))')\" ]"

# a guest that never answers SSH in time: one clear error with the console's last lines, and
# a complete rollback
kill "$HOSTD_PID"; wait "$HOSTD_PID" 2>/dev/null
sed -i 's/^boot-timeout=.*/boot-timeout=3/' "$CONF"
check "hostd restarts with a 3 s boot timeout" start_hostd
out=$(vmctl new t2 --cold 2>&1); rc=$? # a first boot: a warm agent answers within the 3 s
check "new that times out: exit 8, names the timeout, shows the console" \
  bash -c "[ $rc = 8 ] && grep -q 'did not answer SSH within 3 s' <<< \"\$1\" && grep -q 'console:' <<< \"\$1\"" _ "$out" ||
  diag "exit $rc: $out"
check "the timed-out new left no files" test ! -e "$S/agents/t2"
check "the timed-out new left no agent behind" \
  test "$(vmctl list --json | python3 -c 'import json,sys; print(len(json.load(sys.stdin)))')" = 0

echo "1..$N"
[ "$FAILED" -eq 0 ]
