# Users' own SSH keys on a real agent (vmctl new --ssh-key, vmctl authorize); sourced by a VM
# suite after lib.sh, not run. authorize_check AGENT creates AGENT with a key the check generates
# (ssh-keygen into $S/authorize), logs in with plain ssh and that key alone (ssh-config
# --identity: hostd's key is not offered), authorizes a second key live, lists both by
# fingerprint, removes one (ssh with it is refused from then on, also after a restore to a
# checkpoint that still had it), and removes AGENT. TAP through lib.sh's check/ok/not_ok; the
# caller's cleanup should remove AGENT too, in case the check stops halfway.

# authorize_ssh AGENT KEY CMD...: plain ssh to AGENT with the private KEY as the only identity.
authorize_ssh() {
  local agent=$1 key=$2
  shift 2
  vmctl ssh-config "$agent" --identity "$key" > "$S/authorize/$agent.config" &&
    ssh -F "$S/authorize/$agent.config" -o BatchMode=yes -o ConnectTimeout=60 \
      "vmctl-$agent" "$@" < /dev/null
}

# authorize_refused AGENT KEY: ssh with KEY alone does not get in.
authorize_refused() { ! authorize_ssh "$1" "$2" true 2>/dev/null; }

# The fingerprint of the public KEY file, as ssh-keygen shows it.
authorize_fingerprint() { ssh-keygen -l -f "$1" | awk '{ print $2 }'; }

# The fingerprints the agent lists, space-separated, from --json.
authorize_listed() {
  vmctl --json authorize "$1" --list | python3 -c \
    'import json, sys; print(" ".join(k["fingerprint"] for k in json.load(sys.stdin)))'
}

authorize_check() {
  local agent=$1 dir=$S/authorize k1 k2 fp1 fp2 out rc ck
  mkdir -p "$dir"
  k1=$dir/id_ed25519
  k2=$dir/id_rsa
  if ! ssh-keygen -q -t ed25519 -N "" -C "check@one" -f "$k1" ||
    ! ssh-keygen -q -t rsa -b 3072 -N "" -C "check@two" -f "$k2"; then
    not_ok "ssh-keygen makes the check's keys"
    return 1
  fi
  fp1=$(authorize_fingerprint "$k1.pub")
  fp2=$(authorize_fingerprint "$k2.pub")

  out=$(vmctl -q new "$agent" --ssh-key "$k1.pub" 2>&1); rc=$?
  check "new --ssh-key boots $agent" test "$rc" = 0
  [ "$rc" = 0 ] || { diag "$out"; return 1; }
  check "plain ssh with the user's own key (and no key of hostd's) logs in to $agent" \
    test "$(authorize_ssh "$agent" "$k1" whoami)" = "$(vmctl --json info "$agent" |
      python3 -c 'import json, sys; print(json.load(sys.stdin)["user"])')"
  check "a key $agent was not given is refused" authorize_refused "$agent" "$k2"
  check "--list shows the key given to new, by fingerprint" \
    test "$(authorize_listed "$agent")" = "$fp1"

  out=$(vmctl authorize "$agent" "$k2.pub" 2>&1); rc=$?
  check "authorize adds a second key to the running $agent" test "$rc" = 0
  check "... which logs in at once" test "$(authorize_ssh "$agent" "$k2" echo in)" = in
  out=$(vmctl authorize "$agent" "$k2.pub" 2>&1); rc=$?
  check "authorizing it again adds nothing (exit $rc: $out)" grep -q 'authorized 0 new keys' <<< "$out"
  check "... and the guest holds it once, in a private file" \
    test "$(vmctl exec "$agent" -- sh -c "grep -cF '$(awk '{ print $2 }' "$k2.pub")' \
      ~/.ssh/authorized_keys; stat -c %a ~/.ssh/authorized_keys" | tr '\n' ' ')" = "1 600 "
  check "--list shows both fingerprints" test "$(authorize_listed "$agent")" = "$fp1 $fp2"
  vmctl authorize "$agent" --list > "$S/authorize/list.out"
  check "--list as a table names them with their comments" \
    grep -qF -e "$fp1  ssh-ed25519  256   check@one" "$S/authorize/list.out"

  ck=$(vmctl checkpoint "$agent" --label with-both 2>/dev/null)
  out=$(vmctl authorize "$agent" --rm "$fp2" 2>&1); rc=$?
  check "--rm takes the second key out" test "$rc" = 0
  check "... ssh with it is refused from then on" authorize_refused "$agent" "$k2"
  check "... the first key still logs in" test "$(authorize_ssh "$agent" "$k1" echo in)" = in
  check "... and hostd's own key too (exec)" test "$(vmctl exec "$agent" -- echo in)" = in
  check "--list shows the first key only" test "$(authorize_listed "$agent")" = "$fp1"

  if [ -n "$ck" ]; then
    out=$(vmctl -q restore "$agent" "$ck" 2>&1); rc=$?
    check "restore to the checkpoint taken with both keys" test "$rc" = 0
    check "... brings the removed key back on disk, and hostd takes it out again: ssh refused" \
      authorize_refused "$agent" "$k2"
    check "... the first key logs in" test "$(authorize_ssh "$agent" "$k1" echo in)" = in
  else
    not_ok "checkpoint of $agent before --rm"
  fi

  printf 'command="true" %s\n' "$(cat "$k2.pub")" > "$dir/options.pub"
  vmctl authorize "$agent" "$dir/options.pub" > "$dir/options.out" 2>&1; rc=$?
  check "a key with options is refused: exit $rc, $(wc -l < "$dir/options.out") line" \
    test "$rc $(wc -l < "$dir/options.out") $(grep -c 'key options' "$dir/options.out")" = "2 1 1"
  vmctl authorize "$agent" --rm "SHA256:unknown" > /dev/null 2>&1; rc=$?
  check "--rm of an unknown fingerprint is exit 3" test "$rc" = 3

  check "rm --force $agent" vmctl rm --force "$agent"
}
