#!/bin/bash
# bench/secret-new: `vmctl new` to the first command's answer with a secret granted from the
# start (`vmctl new NAME --secret S`) against the same without one, both from the template's
# warm image, rounds alternating, medians of N (3), same run. Goal: <= 1.2x: the grant (the
# agent's CA trusted in the guest, the placeholder in its environment) costs no boot-time work.
# Also `new` and the first exec apart, hostd's log line of each restore (its phases) and, with
# --debug, each agent_up hook's time (`trace: agent up NAME`): where a slower secret new spends it.
# Each agent is removed once measured, the one with the secret after a check (the placeholder in
# the exec's environment, the CA in the guest's bundle): no agent runs beside a new one.
#
# The secret's value is a dummy and its host (api.bench.example) need not resolve: nothing is
# sent to it.
#
# Usage: bench/secret-new.sh [N]   (as root, after `meson setup build && ninja -C build`; the
# debian-12 image and its warm image from $VM_TEST_IMAGE_CACHE are hard-linked into a private
# images dir, or built; SSH ports $VM_TEST_PORT_MIN-$VM_TEST_PORT_MAX, default 44800-44899;
# ~2 min under TCG with the warm image built)
set -euo pipefail
cd "$(dirname "$0")/.."
N=${1:-3}
VMCTL=${VMCTL:-./build/vmctl/vmctl}
HOSTD=${HOSTD:-./build/hostd/hostd}

S=$(mktemp -d -t vms.XXXXXX); chmod 711 "$S"
mkdir -p "$S/images"
CACHE=${VM_TEST_IMAGE_CACHE:-}
if [ -n "$CACHE" ] && [ -f "$CACHE/debian-12/image.ini" ]; then cp -al "$CACHE/debian-12" "$S/images/"; fi
# Ids of their own: another hostd on this host takes agent and worker ids from the defaults.
cat > "$S/hostd.conf" <<CONF
[hostd]
images-dir=$S/images
ssh-port-min=${VM_TEST_PORT_MIN:-44800}
ssh-port-max=${VM_TEST_PORT_MAX:-44899}
metrics-listen=off
agent-ids=1881004000-1881004999
worker-ids=1881005000-1881007999
CONF
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
"$HOSTD" --config "$S/hostd.conf" --state-dir "$S" --debug >> "$S/hostd.log" 2>&1 &
HOSTD_PID=$!
for _ in $(seq 1 150); do "$VMCTL" list >/dev/null 2>&1 && break; sleep 0.2; done

now() { date +%s%N; }
ms_since() { echo $(( ($(now) - $1) / 1000000 )); }
median() { sort -n | awk '{a[NR]=$1} END {print (NR%2)?a[(NR+1)/2]:(a[NR/2]+a[NR/2+1])/2}'; }
# new_then_exec PREFIX NAME [NEW-OPTIONS...]: `vmctl new NAME OPTIONS` then `vmctl exec NAME
# true`; appends the whole, the new and the exec (ms) to PREFIX_all, PREFIX_new, PREFIX_exec.
new_then_exec() {
  local -n all=$1_all new=$1_new ex=$1_exec
  local name=$2 t0 t1
  shift 2
  AGENTS+=("$name")
  t0=$(now)
  "$VMCTL" new "$name" "$@" >/dev/null
  t1=$(now)
  "$VMCTL" exec "$name" -- true
  all+=("$(ms_since "$t0")")
  new+=($(( (t1 - t0) / 1000000 )))
  ex+=("$(ms_since "$t1")")
}

echo "building the warm image"
"$VMCTL" template build debian-12 | tail -n 1
printf 'sk-bench-dummy-value\n' | "$VMCTL" secret create bench-key --host api.bench.example

plain_all=() plain_new=() plain_exec=() secret_all=() secret_new=() secret_exec=()
for i in $(seq 1 "$N"); do
  # Each new with no other agent running: one just restored is still busy settling (under TCG
  # its guest's work slows the next restore by as much as the grant costs).
  new_then_exec plain "p$i"
  "$VMCTL" rm --force "p$i" >/dev/null
  new_then_exec secret "s$i" --secret bench-key
  echo "  run $i: new + first exec ${plain_all[-1]} ms (${plain_new[-1]} + ${plain_exec[-1]}); with --secret ${secret_all[-1]} ms (${secret_new[-1]} + ${secret_exec[-1]})"
  # The grant took effect: its placeholder in the exec's environment, the CA in the bundle.
  ph=$("$VMCTL" exec "s$i" -- printenv BENCH_KEY || true)
  case $ph in vmph_*) ;; *) echo "s$i: no placeholder in BENCH_KEY ('$ph')" >&2; exit 1 ;; esac
  # shellcheck disable=SC2016 # expanded in the guest
  "$VMCTL" exec "s$i" -- sh -c 'cmp -s /usr/local/share/ca-certificates/vmctl-egress.crt /etc/ssl/certs/vmctl-egress.pem && grep -qF "$(sed -n 2p /etc/ssl/certs/vmctl-egress.pem)" /etc/ssl/certs/ca-certificates.crt' ||
    { echo "s$i: the agent's CA is not in the guest's bundle" >&2; exit 1; }
  "$VMCTL" rm --force "s$i" >/dev/null
done

mp=$(printf '%s\n' "${plain_all[@]}" | median)
ms=$(printf '%s\n' "${secret_all[@]}" | median)
echo "new to first command (median of $N): without a secret $mp ms (new $(printf '%s\n' "${plain_new[@]}" | median) + exec $(printf '%s\n' "${plain_exec[@]}" | median)), with --secret $ms ms (new $(printf '%s\n' "${secret_new[@]}" | median) + exec $(printf '%s\n' "${secret_exec[@]}" | median))"
echo "ratio secret/plain $(awk -v a="$ms" -v b="$mp" 'BEGIN {printf "%.2f", a / b}')x (goal <= 1.2x): $(awk -v a="$ms" -v b="$mp" 'BEGIN {print (a <= 1.2 * b) ? "PASS" : "MISS"}')"
echo "restore phases (hostd's log):"
grep "restored from" "$S/hostd.log" | sed 's/^.*agent .\([a-z0-9]*\).: restored from [^ ]* in /  \1: /'
python3 bench/trace-summary.py "agent up, without a secret" "trace: agent up p[0-9]+:" < "$S/hostd.log"
python3 bench/trace-summary.py "agent up, with --secret" "trace: agent up s[0-9]+:" < "$S/hostd.log"
# The first exec of each agent (the checks after it exec too).
first_execs() { grep -E "trace: exec $1[0-9]+:" "$S/hostd.log" | awk '{ n = $0; sub(/^.*trace: exec /, "", n); sub(/:.*$/, "", n) } !seen[n]++'; }
first_execs p | python3 bench/trace-summary.py "first exec, without a secret" "trace: exec"
first_execs s | python3 bench/trace-summary.py "first exec, with --secret" "trace: exec"
