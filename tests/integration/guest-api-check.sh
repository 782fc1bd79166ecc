# shellcheck shell=bash
# The in-guest API from inside a real agent (docs/GUEST-API.md). Sourced, not run, after lib.sh
# (vmctl, check, ok, not_ok, diag); vm-suite.sh calls the two functions on its shared agent:
#
#   guest_api_check AGENT             a checkpoint from inside, listed inside and on the host;
#                                     a policy change and another agent's name refused; 100
#                                     calls at once rate-limited, the agent working on
#   guest_api_keep_awake_check AGENT  with the agent's idle policy pausing it after a few
#                                     seconds: a keep-awake from inside holds it running, and
#                                     once it ran out the agent pauses; leaves it running
#
# Both leave the agent as they found it (running, no checkpoint of theirs, no keep-awake).

# The state of agent $1 as `vmctl list` shows it.
guest_api_state() {
  vmctl list --json | python3 -c 'import json,sys; print([a["state"] for a in json.load(sys.stdin) if a["name"] == sys.argv[1]][0])' "$1"
}

# One raw HTTP/1.0 request from inside agent $1 with bash's /dev/tcp: METHOD PATH [BODY]; prints
# the status code. What vmctl-guest does, without it, so that requests it never sends are tried.
guest_api_raw() {
  local a=$1; shift
  # shellcheck disable=SC2016 # expanded by the guest's bash
  vmctl exec "$a" -- bash -c '
    exec 3<>/dev/tcp/10.0.2.100/80 || exit 1
    printf "%s %s HTTP/1.0\r\nHost: 10.0.2.100\r\nContent-Type: application/json\r\nContent-Length: %s\r\n\r\n%s" \
      "$1" "$2" "${#3}" "$3" >&3
    IFS=" " read -r _ code _ <&3
    echo "$code"' _ "$@"
}

guest_api_check() {
  local a=$1 out ck rc policy t0 ms
  check "vmctl-guest is installed in $a" vmctl exec "$a" -- test -x /usr/local/bin/vmctl-guest

  out=$(vmctl exec "$a" -- vmctl-guest --json info 2>&1)
  check "vmctl-guest info from inside answers for $a, with no host port or path" python3 -c '
import json, sys
a = json.loads(sys.argv[1])["agent"]
assert a["name"] == sys.argv[2] and a["state"] == "running", a
assert "ssh_port" not in a and "uuid" not in a and "/var/lib" not in sys.argv[1]
' "$out" "$a" || diag "$out"

  # --- a checkpoint of itself, seen inside and on the host
  ck=$(vmctl exec "$a" -- vmctl-guest checkpoint --label x 2> "$S/gapi-ck.err"); rc=$?
  check "vmctl-guest checkpoint --label x prints the new checkpoint's id (${ck:-none})" \
    bash -c "[ $rc = 0 ] && [[ '$ck' =~ ^c[0-9]+\$ ]]" || diag "$(cat "$S/gapi-ck.err")"
  out=$(vmctl exec "$a" -- vmctl-guest --json checkpoints)
  check "vmctl-guest checkpoints lists it, labelled x" python3 -c '
import json, sys
c = {c["id"]: c for c in json.loads(sys.argv[1])["checkpoints"]}
assert c[sys.argv[2]]["label"] == "x" and not c[sys.argv[2]]["automatic"]
' "$out" "$ck"
  out=$(vmctl --json checkpoints "$a")
  check "vmctl checkpoints on the host shows it" python3 -c '
import json, sys
assert any(c["id"] == sys.argv[2] and c.get("label") == "x" for c in json.loads(sys.argv[1]))
' "$out" "$ck"
  check "the event log has it, asked by the guest" \
    bash -c "'$VMCTL' --socket '$SOCK' events '$a' --json | grep '\"event\":\"checkpoint-create\"' | grep -q '\"caller\":\"guest\"'"
  check "vmctl events shows it as 'by guest'" \
    bash -c "'$VMCTL' --socket '$SOCK' events '$a' | grep checkpoint-create | grep -q 'by guest'"

  # --- what it may never do
  policy=$(vmctl --json egress "$a" | python3 -c 'import json,sys; e = json.load(sys.stdin); print(e["allow"], e["deny"])')
  check "a policy change from inside is refused: 405" \
    test "$(guest_api_raw "$a" POST /v1/egress '{"allow":["any"]}')" = 405
  check "PUT of the policy too: 405" \
    test "$(guest_api_raw "$a" PUT /v1/egress '{"allow":["any"]}')" = 405
  check "a path naming another agent is not found: 404" \
    test "$(guest_api_raw "$a" GET /v1/agents/other/info '')" = 404
  check "another agent's name in a body is refused: 400" \
    test "$(guest_api_raw "$a" POST /v1/checkpoints '{"name":"other"}')" = 400
  check "the egress policy is unchanged" \
    test "$(vmctl --json egress "$a" | python3 -c 'import json,sys; e = json.load(sys.stdin); print(e["allow"], e["deny"])')" = "$policy"
  out=$(vmctl exec "$a" -- vmctl-guest restore c999 2>&1); rc=$?
  check "vmctl-guest restore of an unknown checkpoint: exit 3, one line" \
    test "$rc" = 3 -a "$(wc -l <<< "$out")" = 1

  # --- 100 calls at once (8 at a time, the connections an agent may have)
  t0=$(date +%s%N)
  # shellcheck disable=SC2016 # expanded by the guest's bash
  out=$(vmctl exec "$a" -- bash -c '
    one() {
      exec 3<>/dev/tcp/10.0.2.100/80 || { echo none; return; }
      printf "GET /v1/info HTTP/1.0\r\nHost: 10.0.2.100\r\n\r\n" >&3
      IFS=" " read -r _ code _ <&3
      echo "${code:-none}"
    }
    export -f one
    seq 100 | xargs -P 8 -I{} bash -c one | sort | uniq -c')
  ms=$(( ($(date +%s%N) - t0) / 1000000 ))
  diag "100 calls from inside in $ms ms: ${out//$'\n'/, }"
  check "100 calls at once: the burst answered (200), the rest rate-limited (429)" python3 -c '
import sys
counts = {}
for line in sys.argv[1].splitlines():
    n, code = line.split()
    counts[code] = int(n)
assert counts.get("200", 0) >= 10 and counts.get("429", 0) >= 1, counts
assert sum(counts.values()) == 100, counts
' "$out"
  check "the agent keeps working after it: exec" test "$(vmctl exec "$a" -- echo alive)" = alive
  sleep 5
  check "and the API answers it again a moment later" \
    bash -c "'$VMCTL' --socket '$SOCK' exec '$a' -- vmctl-guest info >/dev/null"
  check "hostd logged the calls, the refused ones in a summary" \
    bash -c "grep -q \"guest api: agent '$a': GET /v1/info 200\" '$LOG' && grep -q 'refused for load' '$LOG'"

  [ -n "$ck" ] && vmctl checkpoint rm "$a" "$ck" >/dev/null
}

guest_api_keep_awake_check() {
  local a=$1 out
  # The host's own hold first goes: a keep-awake from inside never shortens one.
  vmctl keep-awake "$a" --off >/dev/null
  out=$(vmctl exec "$a" -- vmctl-guest --json keep-awake --for 25s)
  check "vmctl-guest keep-awake --for 25s: acknowledged with its deadline" python3 -c '
import json, sys
k = json.loads(sys.argv[1])["keep_awake"]
assert 20 <= k["seconds_left"] <= 25 and k["until"].endswith("Z"), k
' "$out" || diag "$out"
  sleep 15
  check "a keep-awake from inside holds the idle agent running past its pause time" \
    test "$(guest_api_state "$a")" = running
  out=none
  for _ in $(seq 1 40); do
    out=$(guest_api_state "$a")
    [ "$out" = paused ] || [ "$out" = saved ] && break
    sleep 1
  done
  check "once it ran out, the idle agent is suspended by itself ($out)" \
    bash -c "[ '$out' = paused ] || [ '$out' = saved ]"
  vmctl resume "$a" >/dev/null
}
