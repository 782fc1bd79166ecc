#!/bin/bash
# Instant agents (docs/INSTANT.md): a template's warm image, agents restored from it with their
# own identity, a live fork with its source's processes, and the cold boot every path falls back
# to, logged. Real guests under TCG. The suite keeps its own images dir (the base image
# hard-linked from $VM_TEST_IMAGE_CACHE when it is there), so its warm image touches no other
# suite. Output is TAP. Needs root, HOSTD and VMCTL set.
set -uo pipefail

: "${HOSTD:?}" "${VMCTL:?}"
HERE=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=lib.sh
. "$HERE/lib.sh"
suite_init vmw 43600 43689
CACHE=$IMAGES
IMAGES=$S/images
sed -i "s|^images-dir=.*|images-dir=$IMAGES|" "$CONF"
mkdir -p "$IMAGES"
if [ -f "$CACHE/debian-12/image.ini" ] && [ "$CACHE" != "$IMAGES" ]; then
  cp -al "$CACHE/debian-12" "$IMAGES/"
fi
AGENTS=()
WARM=$IMAGES/debian-12/warm

cleanup() {
  if [ -n "$HOSTD_PID" ] && kill -0 "$HOSTD_PID" 2>/dev/null; then
    local i
    for ((i = ${#AGENTS[@]} - 1; i >= 0; i--)); do
      vmctl rm --force "${AGENTS[$i]}" >/dev/null 2>&1
    done
    stop_hostd
  fi
  destroy_leftover_domains
  rm -rf "$S"
}
trap cleanup EXIT

start_hostd || { echo "Bail out! hostd did not start"; cat "$LOG"; exit 1; }

ms() { date +%s%3N; }
# ssh_as AGENT KEY CMD: OpenSSH to AGENT's port with its pinned host key, as KEY
ssh_as() {
  ssh -F /dev/null -i "$2" -o IdentitiesOnly=yes -o StrictHostKeyChecking=yes \
    -o UserKnownHostsFile="$S/agents/$1/known_hosts" -o BatchMode=yes -o ConnectTimeout=20 \
    -p "$(vmctl info "$1" --json | python3 -c 'import json,sys; print(json.load(sys.stdin)["ssh_port"])')" \
    "agent@127.0.0.1" "$3"
}

# ---- the warm image
out=$(vmctl template build debian-12 2>&1)
check "template build makes the warm image" grep -q "(warm: yes)" <<< "$out" || diag "$out"
check "template list says the template is warm" \
  bash -c "\"$VMCTL\" --socket '$SOCK' template list | grep -E '^debian-12 +yes +yes '"
BUILD=$(readlink "$WARM/current")
check "the warm image has its disk layer, memory and record" \
  test -f "$WARM/$BUILD/disk.qcow2" -a -f "$WARM/$BUILD/memory.save" -a -f "$WARM/$BUILD/warm.ini"
check "the warm disk layer and memory are read-only" \
  bash -c "[ \"\$(stat -c %a '$WARM/$BUILD/disk.qcow2')\" = 444 ] && [ \"\$(stat -c %a '$WARM/$BUILD/memory.save')\" = 400 ]"

# ---- two agents from it, at once
t0=$(ms)
vmctl new a > "$S/new-a.out" 2>&1 &
pa=$!
vmctl new b > "$S/new-b.out" 2>&1
rb=$?
wait $pa
ra=$?
t1=$(ms)
AGENTS+=(a b)
check "two agents made from the warm image at once" test "$ra" = 0 -a "$rb" = 0 \
  || diag "$(cat "$S/new-a.out" "$S/new-b.out")"
diag "two warm agents ready in $((t1 - t0)) ms"
check "hostd logged both as restored from the warm image" \
  bash -c "grep -q \"agent 'a': restored from $WARM/$BUILD/memory.save\" '$LOG' && grep -q \"agent 'b': restored from $WARM/$BUILD/memory.save\" '$LOG'"
check "neither was booted cold" bash -c "! grep -q \"agent '[ab]': booting cold\" '$LOG'"

ida=$(vmctl exec a -- sh -c 'hostname; cat /etc/machine-id; head -c 32 /dev/urandom | od -An -tx1 | tr -d " \n"')
idb=$(vmctl exec b -- sh -c 'hostname; cat /etc/machine-id; head -c 32 /dev/urandom | od -An -tx1 | tr -d " \n"')
check "agent a answers exec with its own hostname" test "$(sed -n 1p <<< "$ida")" = a
check "agent b answers exec with its own hostname" test "$(sed -n 1p <<< "$idb")" = b
# The login message's uname line is written again for the agent (in the background: a few
# seconds at most), not the warm machine's.
check "agent a's login message names it, not the warm machine" vmctl exec a -- sh -c \
  'for i in $(seq 1 30); do grep -q "^Linux a " /run/motd.dynamic && exit 0; sleep 1; done; exit 1'
check "each has its own machine-id" test "$(sed -n 2p <<< "$ida")" != "$(sed -n 2p <<< "$idb")"
check "a's machine-id is the one hostd chose (its UUID)" \
  test "$(sed -n 2p <<< "$ida")" = "$(vmctl info a --json | python3 -c 'import json,sys; print(json.load(sys.stdin)["uuid"].replace("-",""))')"
check "their kernel RNGs give different output (reseeded after the restore)" \
  test "$(sed -n 3p <<< "$ida")" != "$(sed -n 3p <<< "$idb")"
check "the guest's vmgenid driver is bound (it reseeds the RNG when the generation ID changes)" \
  vmctl exec a -- sh -c 'ls /sys/bus/acpi/drivers/vmgenid/ | grep -q QEMUVGID'
check "OpenSSH with strict host key checking logs in to a with hostd's pinned key" \
  ssh_as a "$S/agents/a/id_ed25519" true
check "a's host key is its own (b's pinned key does not match a)" \
  bash -c "! cmp -s '$S/agents/a/ssh_host_ed25519_key.pub' '$S/agents/b/ssh_host_ed25519_key.pub'"
check "the clock of a warm agent is the host's (within 5 s)" \
  bash -c "g=\$(\"$VMCTL\" --socket '$SOCK' exec a -- date +%s); h=\$(date +%s); [ \$((h - g)) -le 5 ] && [ \$((g - h)) -le 5 ]"
check "cloud-init is done in a warm agent" bash -c "\"$VMCTL\" --socket '$SOCK' exec a -- cloud-init status | grep -q done"
check "a warm agent reaches its egress proxy (a denied host gets 403)" \
  bash -c "\"$VMCTL\" --socket '$SOCK' exec a -- curl -s -o /dev/null -w '%{http_code}' http://example.invalid/ | grep -q 403"

# ---- the warm image holds no agent's key
leaks=0
for agent in a b; do
  for f in id_ed25519.pub ssh_host_ed25519_key.pub; do
    body=$(cut -d' ' -f2 "$S/agents/$agent/$f")
    for img in "$WARM/$BUILD/memory.save" "$WARM/$BUILD/disk.qcow2"; do
      n=$(grep -c -a -F "$body" "$img")
      [ "$n" = 0 ] || { leaks=$((leaks + 1)); diag "$agent's $f found in $img"; }
    done
  done
done
check "no agent's key or host key is in the warm image's memory or disk" test "$leaks" = 0

# ---- a live fork
vmctl exec a -- sh -c 'echo from-a > ~/mark; nohup sh -c "while sleep 1; do date +%s > /tmp/tick.new && mv /tmp/tick.new /tmp/tick; done" >/dev/null 2>&1 &'
pid_a=$(vmctl exec a -- pgrep -f "while sleep 1")
t0=$(ms)
out=$(vmctl fork a f --live 2>&1)
rc=$?
t1=$(ms)
AGENTS+=(f)
check "fork --live of a running agent" test "$rc" = 0 || diag "$out"
diag "live fork ready in $((t1 - t0)) ms"
check "hostd logged the fork as restored from the source's memory" \
  grep -q "agent 'f': restored from $S/agents/a/memory-" "$LOG"
check "the fork runs the source's background process (same pid, still ticking)" \
  bash -c "[ \"\$(\"$VMCTL\" --socket '$SOCK' exec f -- pgrep -f 'while sleep 1')\" = '$pid_a' ] && t1=\$(\"$VMCTL\" --socket '$SOCK' exec f -- cat /tmp/tick) && sleep 2.5 && [ \"\$(\"$VMCTL\" --socket '$SOCK' exec f -- cat /tmp/tick)\" -gt \"\$t1\" ]"
check "the fork has the source's files" test "$(vmctl exec f -- cat mark)" = from-a
check "the fork has its own hostname" test "$(vmctl exec f -- hostname)" = f
check "the fork has its own machine-id" \
  test "$(vmctl exec f -- cat /etc/machine-id)" != "$(vmctl exec a -- cat /etc/machine-id)"
check "the fork's host key is not the source's" \
  bash -c "! cmp -s '$S/agents/a/ssh_host_ed25519_key.pub' '$S/agents/f/ssh_host_ed25519_key.pub'"
check "the fork refuses the source's agent key" \
  bash -c "! ssh -F /dev/null -i '$S/agents/a/id_ed25519' -o IdentitiesOnly=yes -o StrictHostKeyChecking=yes -o UserKnownHostsFile='$S/agents/f/known_hosts' -o BatchMode=yes -o ConnectTimeout=20 -p \$(\"$VMCTL\" --socket '$SOCK' info f --json | python3 -c 'import json,sys; print(json.load(sys.stdin)[\"ssh_port\"])') agent@127.0.0.1 true 2>/dev/null"
check "the fork takes its own agent key" ssh_as f "$S/agents/f/id_ed25519" true
check "the source goes on running" test "$(vmctl exec a -- hostname)" = a

# ---- what cannot be warm boots cold, logged
sed -i 's/^qemu=.*/qemu=1/' "$WARM/$BUILD/warm.ini"
check "a stale warm image shows in template list" \
  bash -c "\"$VMCTL\" --socket '$SOCK' template list | grep -q 'stale (QEMU changed'"
vmctl new c --no-wait > "$S/new-c.out" 2>&1
AGENTS+=(c)
check "new from a stale warm image boots cold, logged" \
  grep -q "agent 'c': booting cold: the warm image is stale (QEMU changed since it was made)" "$LOG"
check "--cold boots cold, logged" \
  bash -c "vmctl() { \"$VMCTL\" --socket '$SOCK' \"\$@\"; }; vmctl new d --cold --no-wait >/dev/null 2>&1; grep -q \"agent 'd': booting cold: --cold\" '$LOG'"
AGENTS+=(d)
vmctl rm --force c >/dev/null 2>&1
vmctl rm --force d >/dev/null 2>&1
vmctl template build debian-12 > /dev/null 2>&1 # stale: makes a new build
NEWBUILD=$(readlink "$WARM/current")
check "template build replaces a stale warm image" test "$NEWBUILD" != "$BUILD"
check "the old build stays while agents stand on it" test -d "$WARM/$BUILD"

# A warm image whose memory does not load: the agent boots cold on the template's image.
chmod 600 "$WARM/$NEWBUILD/memory.save"
mv "$WARM/$NEWBUILD/memory.save" "$S/memory.save.good"
head -c 200000 "$S/memory.save.good" > "$WARM/$NEWBUILD/memory.save"
out=$(vmctl new e 2>&1)
rc=$?
AGENTS+=(e)
check "new from a warm image that does not restore still makes the agent" test "$rc" = 0 || diag "$out"
check "hostd logged why and booted cold" grep -q "agent 'e': .* did not start (.*); booting cold" "$LOG"
check "that agent answers exec, on the template's image" \
  bash -c "[ \"\$(\"$VMCTL\" --socket '$SOCK' exec e -- hostname)\" = e ] && ! grep -q '^warm-base' '$S/agents/e/agent.ini'"
mv "$S/memory.save.good" "$WARM/$NEWBUILD/memory.save"
vmctl rm --force e >/dev/null 2>&1

# ---- the warm pool (hostd.conf pool = 1): a machine restored and paused, taken by `new`
echo "pool=1" >> "$CONF"
stop_hostd
start_hostd || { echo "Bail out! hostd did not start with pool=1"; exit 1; }
wait_pool() {
  local i
  for i in $(seq 1 120); do
    vmctl template list | grep -qE "^debian-12 +yes +yes +1/1 " && return 0
    sleep 1
  done
  return 1
}
check "with pool = 1 a machine of the warm image waits (template list: 1/1)" wait_pool
machine=$(ls "$S/pool" 2>/dev/null | head -n 1)
check "hostd logged it waiting, paused" grep -q "pool debian-12: machine $machine waits, paused" "$LOG"
t0=$(ms)
out=$(vmctl new p 2>&1)
rc=$?
t1=$(ms)
AGENTS+=(p)
check "new from the pool" test "$rc" = 0 || diag "$out"
diag "new from the pool in $((t1 - t0)) ms"
check "hostd logged the agent as made from the pool's machine" \
  grep -q "agent 'p': made from the warm pool's machine $machine in" "$LOG"
check "the agent's name in agents/ is a link to the machine's dir" \
  test "$(readlink "$S/agents/p")" = "$S/pool/$machine"
idp=$(vmctl exec p -- sh -c 'hostname; cat /etc/machine-id')
check "the pooled agent answers exec with its own hostname" test "$(sed -n 1p <<< "$idp")" = p
check "its machine-id is its UUID" \
  test "$(sed -n 2p <<< "$idp")" = "$(vmctl info p --json | python3 -c 'import json,sys; print(json.load(sys.stdin)["uuid"].replace("-",""))')"
check "OpenSSH with strict host key checking logs in to it with hostd's pinned key" \
  ssh_as p "$S/agents/p/id_ed25519" true
check "it reaches its own egress proxy (a denied host gets 403)" \
  bash -c "\"$VMCTL\" --socket '$SOCK' exec p -- curl -s -o /dev/null -w '%{http_code}' http://example.invalid/ | grep -q 403"
# shellcheck disable=SC2016 # expanded in the guest
check "its seed drive holds the agent's seed (cloud-init finds its name at a reboot)" \
  vmctl exec p -- sudo sh -c 'mount -o ro /dev/sr0 /mnt && grep -q "local-hostname: \"p\"" /mnt/meta-data; r=$?; umount /mnt; exit $r'
check "the pool fills again" wait_pool
check "with another machine" bash -c "ls '$S/pool' | grep -qv '^$machine\$'"
check "a checkpoint of the pooled agent" vmctl checkpoint p --label pooled
check "suspend --save of the pooled agent" vmctl suspend --save p
bad=0
for img in "$S/pool/$machine"/*.qcow2; do qemu-img check -q "$img" || bad=$((bad + 1)); done
check "qemu-img check finds nothing in its images" test "$bad" = 0
check "exec wakes it, with its name" test "$(vmctl exec p -- hostname)" = p
# A killed hostd's waiting machine goes at the next start; the agent made of one stays.
waiting=$(ls "$S/pool" | grep -v "^$machine\$" | head -n 1)
kill -9 "$HOSTD_PID"
wait "$HOSTD_PID" 2>/dev/null
start_hostd || { echo "Bail out! hostd did not start again"; exit 1; }
check "hostd removed the machine a killed hostd left waiting" \
  grep -q "pool: removed machine $waiting left by an earlier run" "$LOG"
check "the pooled agent is there after the restart" test "$(vmctl exec p -- hostname)" = p
check "rm of the pooled agent" vmctl rm --force p
check "rm removed its dir in pool/ and its link" test ! -e "$S/pool/$machine" -a ! -L "$S/agents/p"

[ "$FAILED" = 0 ] || diag_err "hostd log: $(tail -30 "$LOG")"
echo "1..$N"
exit $((FAILED > 0))
