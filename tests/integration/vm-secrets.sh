#!/bin/bash
# The credential broker's suite (docs/SECRETS.md): one real agent (TCG) holds placeholders and
# never a secret; hostd's proxy puts the real value into requests to the secret's hosts and
# nowhere else. Test APIs live in a network namespace this script creates and removes
# (198.18.0.0/29: the host side 198.18.0.1; api 198.18.0.2, other 198.18.0.3, an upstream with a
# certificate hostd must not trust 198.18.0.4, a plain-HTTP sink 198.18.0.5, a stand-in for
# api.anthropic.com 198.18.0.6), each recording every request it gets
# (tests/integration/https-recorder.py). Their names resolve for hostd
# alone, through a hosts file bind-mounted in hostd's own mount namespace (hosts_file_wrapper in
# lib.sh); hostd trusts the test CA that signed them through --egress-upstream-ca-file.
# Output is TAP. Needs root, iproute2, util-linux (unshare), openssl, python3, HOSTD and VMCTL
# set; the debian-12 image is built into the suite's state dir, or taken from
# $VM_TEST_IMAGE_CACHE. Node.js in the guest: the host's own `node` binary is copied in
# (VM_TEST_GUEST_NODE=host, the default, no network), or installed with apt in the guest through
# its egress proxy from deb.debian.org (VM_TEST_GUEST_NODE=apt; needs the internet), or not at
# all (VM_TEST_GUEST_NODE=none: that check is skipped). The Anthropic TypeScript SDK
# (@anthropic-ai/sdk@$VM_TEST_ANTHROPIC_SDK, 1.17.0 by default) is installed with npm on the
# host from the npm registry and copied in; without the registry its check is skipped.
# VM_TEST_SECRETS_STOP_AFTER_NODE=1 ends the suite after the Node.js checks (a quick try of them).
set -uo pipefail

: "${HOSTD:?}" "${VMCTL:?}"
HERE=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=lib.sh
. "$HERE/lib.sh"
suite_init vms 43500 43589
NS=vmsecrets$$
VH=vsc$$h
VN=vsc$$n
HOST_IP=198.18.0.1
API_IP=198.18.0.2
OTHER_IP=198.18.0.3
ROGUE_IP=198.18.0.4
SINK_IP=198.18.0.5
SINK_PORT=8080
ANTHROPIC_IP=198.18.0.6
ANTHROPIC=api.anthropic.com
API=api.vmtest.example
OTHER=other.vmtest.example
ROGUE=eu.alt.vmtest.example # matches the secret's '*.alt.vmtest.example'
SECRET=example-api-key
ENV_VAR=EXAMPLE_API_KEY
OTHER_SECRET=other-key
VALUE=sk-test-$(openssl rand -hex 24)
VALUE2=sk-test-$(openssl rand -hex 24) # the rotated value
OTHER_VALUE=sk-other-$(openssl rand -hex 24)
MULTI_SECRET=multi-key # one secret, two headers (x-api-key and Authorization)
MULTI_ENV=MULTI_KEY
MULTI_VALUE=sk-multi-$(openssl rand -hex 24)
ANTHROPIC_SECRET=anthropic-key
ANTHROPIC_VALUE=sk-ant-test-$(openssl rand -hex 24)
SDK_VERSION=${VM_TEST_ANTHROPIC_SDK:-1.17.0}
NODE_FROM=${VM_TEST_GUEST_NODE:-host}
AGENTS=()
PIDS=()

guest() { vmctl exec "${2:-a1}" -- bash -c "$1"; }
# oneline TEXT: TEXT on one line, at most 160 characters, for a TAP description
oneline() { tr '\n' ' ' <<< "$1" | cut -c 1-160; }

cleanup() {
  if [ -n "$HOSTD_PID" ] && kill -0 "$HOSTD_PID" 2>/dev/null; then
    # forks first: an agent that forks stand on cannot be removed before them
    local i
    for ((i = ${#AGENTS[@]} - 1; i >= 0; i--)); do
      [ -n "${AGENTS[$i]:-}" ] && vmctl rm --force "${AGENTS[$i]}" >/dev/null 2>&1
    done
    stop_hostd
  fi
  netns_suite_cleanup
}
trap cleanup EXIT

# --- counting what the upstreams recorded -----------------------------------------------------
# count STRING FILE...: how many lines of the FILEs hold STRING (0 when none, or no file)
count() {
  local s=$1; shift
  cat -- "$@" 2>/dev/null | grep -a -c -F -e "$s"
}
# values FILE...: how many lines of the FILEs hold either real value (or the other secret's)
values() {
  cat -- "$@" 2>/dev/null |
    grep -a -c -F -e "$VALUE" -e "$VALUE2" -e "$OTHER_VALUE" -e "$MULTI_VALUE" -e "$ANTHROPIC_VALUE"
}
# last_auth NAME: the Authorization header of the last request upstream NAME recorded
last_auth() {
  python3 -c '
import json, sys
reqs = [json.loads(l) for l in open(sys.argv[1]) if "\"method\"" in l]
print(dict((k.lower(), v) for k, v in reqs[-1]["headers"]).get("authorization", "") if reqs else "")
' "$S/$1.jsonl"
}
requests() { grep -c '"method"' "$S/$1.jsonl"; }
# last_header NAME HEADER [BACK]: header HEADER of the last request upstream NAME recorded, or of
# the BACK-th from the end (1: the last)
last_header() {
  python3 -c '
import json, sys
reqs = [json.loads(l) for l in open(sys.argv[1]) if "\"method\"" in l]
back = int(sys.argv[3])
print(dict((k.lower(), v) for k, v in reqs[-back]["headers"]).get(sys.argv[2], "") if len(reqs) >= back else "")
' "$S/$1.jsonl" "$2" "${3:-1}"
}

# --- the test CAs, the upstreams and the namespace ----------------------------------------------
# make_ca NAME CN: $S/NAME.pem and .key, a self-signed CA
make_ca() {
  openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -days 2 \
    -keyout "$S/$1.key" -out "$S/$1.pem" -subj "/CN=$2" \
    -addext basicConstraints=critical,CA:TRUE -addext keyUsage=critical,keyCertSign,cRLSign \
    2>/dev/null
}
# make_leaf NAME CA HOST: $S/NAME.pem and .key, a server certificate for HOST signed by CA
make_leaf() {
  openssl req -new -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -keyout "$S/$1.key" \
    -subj "/CN=$3" 2>/dev/null |
    openssl x509 -req -CA "$S/$2.pem" -CAkey "$S/$2.key" -CAcreateserial -days 2 \
      -out "$S/$1.pem" -extfile <(printf '%s\n' "subjectAltName=DNS:$3" basicConstraints=CA:FALSE \
        extendedKeyUsage=serverAuth keyUsage=digitalSignature) 2>/dev/null
}
make_certs() {
  make_ca testca "vmtest upstream CA" && make_ca rogueca "vmtest rogue CA" &&
    make_leaf api testca "$API" && make_leaf other testca "$OTHER" &&
    make_leaf rogue rogueca "$ROGUE" && make_leaf anthropic testca "$ANTHROPIC" &&
    openssl verify -CAfile "$S/testca.pem" "$S/api.pem" "$S/other.pem" "$S/anthropic.pem" >/dev/null &&
    ! openssl verify -CAfile "$S/testca.pem" "$S/rogue.pem" >/dev/null 2>&1
}

setup_namespace() {
  netns_add "$NS" "$VH" "$VN" "$HOST_IP" "$API_IP" "$OTHER_IP" "$ROGUE_IP" "$SINK_IP" \
    "$ANTHROPIC_IP" || return 1
  # recorder NAME ADDRESS PORT [CERT]: one upstream in the namespace, recording into $S/NAME.*
  recorder() {
    local tls=()
    [ -n "${4:-}" ] && tls=("$S/$4.pem" "$S/$4.key")
    ip netns exec "$NS" python3 "$HERE/https-recorder.py" "$2" "$3" "$S/$1" "${tls[@]}" \
      2>> "$S/recorders.log" &
    PIDS+=("$!")
  }
  recorder api "$API_IP" 443 api
  recorder other "$OTHER_IP" 443 other
  recorder rogue "$ROGUE_IP" 443 rogue
  recorder sink "$SINK_IP" "$SINK_PORT"
  recorder anthropic "$ANTHROPIC_IP" 443 anthropic
  for _ in $(seq 1 50); do
    [ -e "$S/api.ready" ] && [ -e "$S/other.ready" ] && [ -e "$S/rogue.ready" ] &&
      [ -e "$S/sink.ready" ] && [ -e "$S/anthropic.ready" ] && return 0
    sleep 0.2
  done
  return 1
}

check "test CA, a rogue CA and certificates for $API, $OTHER, $ROGUE and $ANTHROPIC" make_certs
check "test network namespace with the recording upstreams" setup_namespace
# From the host itself the upstreams answer and the CAs are what they should be, so what fails
# below fails because of hostd.
host_curl() { # host_curl NAME IP CAFILE ARGS...: status code of https://NAME/echo from the host
  local name=$1 ip=$2 ca=$3; shift 3
  curl -s -o /dev/null -w '%{http_code}' -m 10 --cacert "$S/$ca.pem" \
    --resolve "$name:443:$ip" "$@" "https://$name/echo"
}
check "from the host, $API and $OTHER answer 200 with the test CA, and recorded the requests" \
  bash -c "[ \"\$1\" = 200 ] && [ \"\$2\" = 200 ] && [ \$(grep -c '\"method\"' '$S/api.jsonl') = 1 ]" _ \
  "$(host_curl "$API" "$API_IP" testca)" "$(host_curl "$OTHER" "$OTHER_IP" testca)"
check "from the host, $ROGUE fails against the test CA" \
  test "$(host_curl "$ROGUE" "$ROGUE_IP" testca)" = 000
check "from the host, the plain-HTTP sink answers" \
  test "$(curl -s -m 10 "http://$SINK_IP:$SINK_PORT/echo")" = ok

# hostd, and only hostd, resolves the test names
cat /etc/hosts > "$S/hosts"
printf '%s %s\n' "$API_IP" "$API" "$OTHER_IP" "$OTHER" "$ROGUE_IP" "$ROGUE" \
  "$ANTHROPIC_IP" "$ANTHROPIC" >> "$S/hosts"
hosts_file_wrapper "$S/hosts"
check "the hosts wrapper resolves $API for what runs under it" \
  bash -c "[ \"\$(\"\$@\" getent hosts $API | awk '{print \$1}')\" = $API_IP ]" _ "${HOSTD_WRAPPER[@]}"
check "the host itself does not resolve $API" bash -c "! getent hosts $API"

# --- hostd and one agent ------------------------------------------------------------------------
check "hostd starts (--egress-upstream-ca-file, --debug)" \
  start_hostd --egress-upstream-ca-file "$S/testca.pem" --debug
t0=$(date +%s)
vmctl new a1 > "$S/new.log" 2>&1; rc=$?
check "new a1 ($(( $(date +%s) - t0 )) s)" test "$rc" = 0
if [ "$rc" != 0 ]; then
  diag "$(tail -n 30 "$S/new.log")"
  echo "Bail out! no agent to test"
  exit 1
fi
AGENTS+=(a1)
vmctl idle a1 --never > /dev/null
# Names never open the test network's addresses (benchmarking range): these CIDR rules do, at
# the ports used; other.vmtest.example is allowed by a plain name rule, without a grant.
vmctl egress a1 --allow "$API_IP/32:443" --allow "$OTHER_IP/32:443" --allow "$ROGUE_IP/32:443" \
  --allow "$SINK_IP/32:$SINK_PORT" --allow "$ANTHROPIC_IP/32:443" --allow "$OTHER" \
  > "$S/egress.out" 2>&1
check "egress rules for the test network" bash -c "grep -q '$OTHER' '$S/egress.out'"

# Node.js in the guest, for a third kind of client
case "$NODE_FROM" in
  host)
    if NODE_BIN=$(command -v node); then
      vmctl exec a1 -- sudo sh -c 'cat > /usr/local/bin/node && chmod 755 /usr/local/bin/node' \
        < "$NODE_BIN"
    fi
    ;;
  apt)
    vmctl egress a1 --allow deb.debian.org > /dev/null
    guest "sudo apt-get update -qq && sudo DEBIAN_FRONTEND=noninteractive apt-get install -y -qq nodejs" \
      > "$S/apt.log" 2>&1
    vmctl egress a1 --remove deb.debian.org > /dev/null
    ;;
esac
vmctl exec a1 -- sh -c 'cat > /tmp/client.js' < "$HERE/secrets-node-client.js"
NODE_VERSION=$(guest 'node --version' 2>/dev/null)

# --- secrets: create, list, bad input -------------------------------------------------------------
out=$(printf '%s\n' "$VALUE" | vmctl secret create "$SECRET" --host "$API" --host '*.alt.vmtest.example' 2>&1); rc=$?
check "secret create $SECRET (value on stdin) prints nothing" test "$rc" = 0 -a -z "$out"
printf '%s\n' "$OTHER_VALUE" > "$S/other-value"
out=$(vmctl secret create "$OTHER_SECRET" --host "$OTHER" --from-file "$S/other-value" 2>&1); rc=$?
check "secret create $OTHER_SECRET --from-file prints nothing" test "$rc" = 0 -a -z "$out"
rm -f "$S/other-value"
vmctl secret list > "$S/list.txt" 2>&1
vmctl secret list --json > "$S/list.json" 2>&1
check "secret list shows both secrets and never a value" \
  bash -c "grep -q '$SECRET' '$S/list.txt' && grep -q '$OTHER_SECRET' '$S/list.txt' &&
           [ \$(cat '$S/list.txt' '$S/list.json' | grep -a -c -F -e '$VALUE' -e '$OTHER_VALUE') = 0 ]"
check "secret list --json: hosts, header, format and env defaults, no agents yet" python3 -c '
import json, sys
s = {x["name"]: x for x in json.load(open(sys.argv[1]))}
e = s["example-api-key"]
assert e["hosts"] == ["api.vmtest.example", "*.alt.vmtest.example"], e
assert e["header"] == "Authorization" and e["format"] == "Bearer {}" and e["env"] == "EXAMPLE_API_KEY", e
assert e["agents"] == [] and s["other-key"]["env"] == "OTHER_KEY", s
assert not any(k in x for x in s.values() for k in ("value", "secret")), s
' "$S/list.json"
check "the secret store is 0700 with 0600 files" \
  bash -c "[ \$(stat -c %a '$S/secrets') = 700 ] && [ -z \"\$(find '$S/secrets' -type f ! -perm 600)\" ] &&
           [ -n \"\$(find '$S/secrets' -type f)\" ]"

# bad_input DESCRIPTION STATUS STDIN ARGS...: vmctl ARGS with STDIN exits STATUS with a one-line
# error that holds no value, and the secrets and their grants are as before
bad_input() {
  local desc=$1 want=$2 input=$3 before after out rc
  shift 3
  before=$(vmctl secret list --json 2>&1)
  out=$(printf '%s' "$input" | vmctl "$@" 2>&1); rc=$?
  after=$(vmctl secret list --json 2>&1)
  check "bad input: $desc: exit $want (got $rc), one line ($(oneline "$out")), nothing stored" \
    bash -c "[ $rc = $want ] && [ \$(printf '%s\n' \"\$1\" | wc -l) = 1 ] && [ -n \"\$1\" ] &&
             [ \"\$2\" = \"\$3\" ] && ! grep -qF -e '$VALUE' -e '$VALUE2' <<< \"\$1\"" _ \
    "$out" "$before" "$after"
}
bad_input "empty value" 2 $'\n' secret create empty-one --host "$API"
bad_input "duplicate name" 4 "$VALUE2"$'\n' secret create "$SECRET" --host "$API"
bad_input "bad host pattern (scheme)" 2 "$VALUE2"$'\n' secret create bad-host --host "https://$API"
bad_input "bad host pattern (inner *)" 2 "$VALUE2"$'\n' secret create bad-host --host 'api.*.example'
bad_input "bad header" 2 "$VALUE2"$'\n' secret create bad-header --host "$API" --header 'Bad Header:'
bad_input "format without {}" 2 "$VALUE2"$'\n' secret create bad-format --host "$API" --format Bearer
bad_input "grant of an unknown secret" 3 "" secret grant a1 no-such-secret
bad_input "grant to an unknown agent" 3 "" secret grant no-such-agent "$SECRET"
bad_input "set of an unknown secret" 3 "$VALUE2"$'\n' secret set no-such-secret
bad_input "rm of an unknown secret" 3 "" secret rm no-such-secret

# --- grant to the running agent -------------------------------------------------------------------
code=$(guest "curl -s -o /dev/null -w '%{http_connect}' -m 20 https://$API/echo")
check "before a grant, $API is closed to the agent (CONNECT $code)" test "$code" = 403
out=$(vmctl secret grant a1 "$SECRET" 2>&1); rc=$?
check "secret grant a1 $SECRET ($(oneline "$out"))" test "$rc" = 0
PH=$(vmctl exec a1 -- printenv "$ENV_VAR")
PH=${PH:-vmph_missing} # never empty: an empty string would match every line below
check "the guest's env has a placeholder in $ENV_VAR, live, not the value ($PH)" \
  bash -c "[[ '$PH' =~ ^vmph_[A-Za-z0-9]{40}$ ]] && [ '$PH' != '$VALUE' ]"
# shellcheck disable=SC2016 # expanded in the guest
check "the env names the trust store for Node, requests and OpenSSL" \
  test "$(guest 'echo "$NODE_EXTRA_CA_CERTS $REQUESTS_CA_BUNDLE $SSL_CERT_FILE"')" = \
  "/usr/local/share/ca-certificates/vmctl-egress.crt /etc/ssl/certs/ca-certificates.crt /etc/ssl/certs/ca-certificates.crt"
guest 'cat /usr/local/share/ca-certificates/vmctl-egress.crt' > "$S/guest-ca.pem" 2>/dev/null
check "the guest trusts the agent's own CA (\$STATE/egress-ca/a1.crt), in its bundle too" \
  bash -c "cmp -s '$S/guest-ca.pem' '$S/egress-ca/a1.crt' &&
           '$VMCTL' --socket '$SOCK' exec a1 -- openssl verify -CAfile /etc/ssl/certs/ca-certificates.crt /usr/local/share/ca-certificates/vmctl-egress.crt >/dev/null"
check "the agent's CA key is hostd's alone (dir 0700, key 0600), not in the agent's directory" \
  bash -c "[ \$(stat -c %a '$S/egress-ca') = 700 ] && [ \$(stat -c %a '$S/egress-ca/a1.key') = 600 ] &&
           ! grep -rqF -- \"\$(sed -n 2p '$S/egress-ca/a1.key')\" '$S/agents/a1'"
vmctl --json info a1 > "$S/info.json" 2>&1
check "info a1 lists the grant (name and env)" \
  bash -c "python3 -c 'import json,sys; a=json.load(open(sys.argv[1])); assert a[\"secrets\"]==[{\"name\":\"$SECRET\",\"env\":\"$ENV_VAR\"}], a' '$S/info.json' &&
           '$VMCTL' --socket '$SOCK' info a1 | grep -q '^secrets: *$SECRET (env $ENV_VAR)'"
check "secret list names a1 as holding $SECRET" \
  bash -c "'$VMCTL' --socket '$SOCK' secret list --json | python3 -c 'import json,sys; s={x[\"name\"]:x for x in json.load(sys.stdin)}; assert s[\"$SECRET\"][\"agents\"]==[\"a1\"], s'"

# --- three clients get the real value substituted ---------------------------------------------
# client_check DESCRIPTION GUEST_COMMAND: the command prints 200 (and "ok"), and the API
# recorded exactly one more request, whose Authorization carries the real value
client_check() {
  local before out
  before=$(count "$VALUE" "$S/api.jsonl")
  out=$(guest "$2" 2>&1)
  check "$1: 200 from $API, which got 'Bearer <value>' ($(oneline "$out"))" \
    bash -c "[[ \"\$1\" == *200* ]] && [ \$(grep -a -c -F '$VALUE' '$S/api.jsonl') = $((before + 1)) ] &&
             [ \"\$2\" = 'Bearer $VALUE' ]" _ "$out" "$(last_auth api)"
}
client_check "curl" \
  "curl -sS -m 30 -w ' %{http_code}' -H \"Authorization: Bearer \$$ENV_VAR\" https://$API/echo"
client_check "python3 urllib" \
  "python3 -c 'import os, urllib.request as u; r = u.urlopen(u.Request(\"https://$API/echo\", headers={\"Authorization\": \"Bearer \" + os.environ[\"$ENV_VAR\"]}), timeout=30); print(r.status, r.read().decode())'"
if [ -n "$NODE_VERSION" ]; then
  client_check "Node.js $NODE_VERSION https (NODE_EXTRA_CA_CERTS)" "node /tmp/client.js $API /echo"
  # Node's own fetch with no proxy settings: the name through the proxy's resolver, the
  # connection through the guest's redirect (docs/EGRESS.md), the key substituted all the same.
  client_check "Node.js $NODE_VERSION fetch with no proxy settings" \
    "env -u https_proxy -u HTTPS_PROXY -u http_proxy -u HTTP_PROXY node -e 'fetch(\"https://$API/echo\", {headers: {authorization: \"Bearer \" + process.env.$ENV_VAR}}).then(async r => console.log(r.status, await r.text()), e => console.log(\"error\", e.cause ?? e))'"
else
  skip "Node.js https and fetch" "no node in the guest (VM_TEST_GUEST_NODE=$NODE_FROM)"
fi
check "the API never saw the placeholder" test "$(count "$PH" "$S/api.raw")" = 0

# --- the Anthropic TypeScript SDK with its defaults, no proxy settings --------------------------
# The SDK from the npm registry (installed on the host, copied in), its key from
# ANTHROPIC_API_KEY and its default base URL https://api.anthropic.com, which hostd alone
# resolves to the recorder 'anthropic'; the guest resolves it through the proxy's resolver and
# its connection goes through the redirect. The secret names both headers the SDK's versions send
# (0.x x-api-key, 1.x Authorization: Bearer).
if [ -z "$NODE_VERSION" ]; then
  skip "Anthropic TypeScript SDK" "no node in the guest (VM_TEST_GUEST_NODE=$NODE_FROM)"
elif ! timeout 300 npm install --prefix "$S/sdk" --cache "$S/npm-cache" --no-audit --no-fund \
  --no-update-notifier "@anthropic-ai/sdk@$SDK_VERSION" > "$S/npm.log" 2>&1; then
  skip "Anthropic TypeScript SDK" "npm install @anthropic-ai/sdk@$SDK_VERSION failed on the host: $(oneline "$(tail -n 1 "$S/npm.log")")"
else
  tar -C "$S/sdk" -cf - node_modules |
    vmctl exec a1 -- sh -c 'mkdir -p /tmp/sdk && tar -C /tmp/sdk -xf -'
  vmctl exec a1 -- sh -c 'cat > /tmp/sdk/sdk.mjs' < "$HERE/secrets-anthropic-sdk.mjs"
  rm -rf "$S/sdk" "$S/npm-cache" # not part of hostd's state, searched for values below
  out=$(printf '%s\n' "$ANTHROPIC_VALUE" | vmctl secret create "$ANTHROPIC_SECRET" \
    --host "$ANTHROPIC" --header x-api-key --header Authorization --env ANTHROPIC_API_KEY 2>&1) &&
    out=$(vmctl secret grant a1 "$ANTHROPIC_SECRET" 2>&1)
  rc=$?
  ANTHROPIC_PH=$(vmctl exec a1 -- printenv ANTHROPIC_API_KEY)
  ANTHROPIC_PH=${ANTHROPIC_PH:-vmph_missing}
  check "secret create $ANTHROPIC_SECRET (x-api-key, Authorization), grant: ANTHROPIC_API_KEY a placeholder ($(oneline "$out"))" \
    bash -c "[ $rc = 0 ] && [[ '$ANTHROPIC_PH' =~ ^vmph_[A-Za-z0-9]{40}$ ]]"
  before=$(count "$ANTHROPIC_VALUE" "$S/anthropic.jsonl")
  out=$(guest "cd /tmp/sdk && env -u https_proxy -u HTTPS_PROXY -u http_proxy -u HTTP_PROXY timeout 120 node sdk.mjs" 2>&1)
  check "Anthropic SDK $SDK_VERSION with its defaults, no proxy settings: the answer from $ANTHROPIC, which got the value in $(last_header anthropic x-api-key | grep -q . && echo x-api-key || echo Authorization) ($(oneline "$out"))" \
    bash -c "[ \"\$1\" = 'answer: canned answer' ] &&
             [ \$(grep -a -c -F '$ANTHROPIC_VALUE' '$S/anthropic.jsonl') = $((before + 1)) ] &&
             { [ \"\$2\" = '$ANTHROPIC_VALUE' ] || [ \"\$3\" = 'Bearer $ANTHROPIC_VALUE' ]; }" \
    _ "$out" "$(last_header anthropic x-api-key)" "$(last_header anthropic authorization)"
  check "$ANTHROPIC never saw the placeholder ($(count "$ANTHROPIC_VALUE" "$S/anthropic.raw") lines with the value)" \
    bash -c "[ $(count "$ANTHROPIC_PH" "$S/anthropic.raw") = 0 ] && [ $(count "$ANTHROPIC_VALUE" "$S/anthropic.raw") -gt 0 ]"
  check "the egress log has the SDK's request to $ANTHROPIC, allowed, naming $ANTHROPIC_SECRET" \
    bash -c "'$VMCTL' --socket '$SOCK' --json egress-log a1 | python3 -c '
import json, sys
recs = [json.loads(l) for l in sys.stdin]
assert [r for r in recs if r[\"event\"] == \"allowed\" and r[\"host\"] == \"$ANTHROPIC\" and
        r.get(\"secret\") == \"$ANTHROPIC_SECRET\"], recs[-3:]
'"
  vmctl secret rm --force "$ANTHROPIC_SECRET" > /dev/null 2>&1
fi
if [ -n "${VM_TEST_SECRETS_STOP_AFTER_NODE:-}" ]; then
  tap_end
  exit
fi

# keep-alive: curl reuses its connection for the second URL; both requests are substituted
before=$(count "$VALUE" "$S/api.jsonl")
out=$(guest "curl -sS -m 30 -o /dev/null -o /dev/null -w '%{num_connects} %{http_code}\n' -H \"Authorization: Bearer \$$ENV_VAR\" https://$API/echo https://$API/echo?second" 2>&1)
check "keep-alive: two requests on one connection, both substituted ($(echo "$out" | tr '\n' ','))" \
  bash -c "[ \"\$1\" = \$'1 200\n0 200' ] && [ \$(grep -a -c -F '$VALUE' '$S/api.jsonl') = $((before + 2)) ]" _ "$out"

# streaming: the events reach the guest as they are sent, not at the end
out=$(guest "python3 -c '
import os, time, urllib.request as u
r = u.urlopen(u.Request(\"https://$API/stream\", headers={\"Authorization\": \"Bearer \" + os.environ[\"$ENV_VAR\"]}), timeout=30)
t = [time.monotonic() for line in r if line.startswith(b\"data:\")]
print(len(t), int((t[-1] - t[0]) * 1000) if t else -1)
'" 2>&1)
read -r events spread <<< "$out"
check "streaming: 3 server-sent events, the first ${spread:-?} ms before the last in the guest (>= 1500)" \
  bash -c "[ '${events:-0}' = 3 ] && [ '${spread:-0}' -ge 1500 ]"

vmctl --json egress-log a1 > "$S/egress-log.json"
check "the egress log names the secret of substituted requests, and holds no value" python3 -c '
import json, sys
recs = [json.loads(l) for l in open(sys.argv[1])]
sub = [r for r in recs if r["event"] == "allowed" and r["host"] == "api.vmtest.example"]
assert sub and all(r.get("secret") == "example-api-key" for r in sub), sub
assert all(v not in l for l in open(sys.argv[1]) for v in sys.argv[2:]), "value in log"
' "$S/egress-log.json" "$VALUE"

# --- the value does not come back: an upstream that echoes the request --------------------------
out=$(guest "curl -sS -m 30 -D - -H \"Authorization: Bearer \$$ENV_VAR\" https://$API/headers" 2>&1)
check "an echo of the request (header and body) gives the guest the placeholder's start, no byte of the value ($(oneline "$out"))" \
  bash -c "[[ \"\$1\" == *' 200'* && \"\$1\" != *'$VALUE'* && \"\$1\" == *'X-Echo-Authorization: Bearer $PH'* &&
             \"\$1\" == *'GET /headers HTTP/1.1'*'Authorization: Bearer $PH'* &&
             \"\$1\" == *'Accept-Encoding: identity'* ]] &&
           [ \"\$2\" = 'Bearer $VALUE' ]" _ "$out" "$(last_auth api)"
before=$(requests api)
out=$(guest "curl -s -o /dev/null -w '%{http_code}' -m 30 -X TRACE -H \"Authorization: Bearer \$$ENV_VAR\" https://$API/" 2>&1)
check "TRACE is refused inside the interception (HTTP $out), nothing of it reached $API" \
  bash -c "[ '$out' = 405 ] && [ \$(grep -c '\"method\"' '$S/api.jsonl') = $before ]"
sleep 0.5
check "the egress log has the redaction and the TRACE, denied" python3 -c '
import json, subprocess, sys
recs = [json.loads(l) for l in subprocess.run(sys.argv[1:], capture_output=True, text=True).stdout.splitlines()]
denied = [r["reason"] for r in recs if r["event"] == "denied"]
assert "redacted: value of example-api-key in response" in denied, denied
assert "method not allowed: TRACE" in denied, denied
' "$VMCTL" --socket "$SOCK" --json egress-log a1

# --- leaks: the placeholder where it does not belong ----------------------------------------------
# leak_check DESCRIPTION UPSTREAM REASON GUEST_COMMAND: the command does not get a 200, UPSTREAM
# records neither the placeholder nor a value, and a new denied record's reason starts with
# "leak: placeholder of example-api-key" and holds REASON
leak_records() {
  vmctl --json egress-log a1 | python3 -c '
import json, sys
print(sum(1 for l in sys.stdin if (r := json.loads(l))["event"] == "denied"
          and r["reason"].startswith("leak: placeholder of " + sys.argv[1]) and sys.argv[2] in r["reason"]))
' "$SECRET" "$1"
}
leak_check() {
  local desc=$1 up=$2 reason=$3 ph_before val_before logged out
  ph_before=$(count "$PH" "$S/$up.raw")
  val_before=$(values "$S/$up.raw")
  logged=$(leak_records "$reason")
  out=$(guest "$4" 2>&1)
  sleep 0.5
  check "leak blocked: $desc ($(oneline "$out"))" \
    bash -c "[[ \"\$1\" != *200* ]] && [ \$(grep -a -c -F '$PH' '$S/$up.raw') = $ph_before ] &&
             [ \$(cat '$S/$up.raw' | grep -a -c -F -e '$VALUE' -e '$VALUE2' -e '$OTHER_VALUE') = $val_before ]" _ "$out"
  check "leak logged: $desc: denied, 'leak: placeholder of $SECRET ...$reason'" \
    test "$(leak_records "$reason")" -gt "$logged"
}
CURL="curl -s -o /dev/null -w '%{http_code}' -m 30"
sink_before=$(stat -c %s "$S/sink.raw")
leak_check "over plain HTTP to the sink" sink "plain HTTP" \
  "$CURL -H \"Authorization: Bearer \$$ENV_VAR\" http://$SINK_IP:$SINK_PORT/echo"
leak_check "in a URL query to $API" api "in URL" \
  "$CURL \"https://$API/echo?key=\$$ENV_VAR\""
leak_check "in a request body to $API" api "in body" \
  "$CURL --data \"key=\$$ENV_VAR\" https://$API/echo"
leak_check "in a header it does not belong to (X-Api-Key) to $API" api "" \
  "$CURL -H \"X-Api-Key: \$$ENV_VAR\" https://$API/echo"
check "the sink received no byte of the refused request" \
  test "$(stat -c %s "$S/sink.raw")" = "$sink_before"

# a host no grant names, allowed by a plain rule: the proxy only tunnels there (it cannot read
# the guest's TLS), so it has no value to put in: even a client that skips verification (-k)
# and sends the placeholder gets no value there
before=$(values "$S/other.raw")
out=$(guest "$CURL -k -H \"Authorization: Bearer \$$ENV_VAR\" https://$OTHER/echo" 2>&1)
check "no grant for $OTHER: no value reaches it (a tunnel; the placeholder is worthless there)" \
  test "$(values "$S/other.raw")" = "$before"
diag "$OTHER (tunnelled, -k): HTTP $out; placeholder seen there $(count "$PH" "$S/other.raw") times"

# a host another grant names is intercepted: this secret's placeholder sent there is a leak
out=$(vmctl secret grant a1 "$OTHER_SECRET" 2>&1); rc=$?
check "secret grant a1 $OTHER_SECRET ($(oneline "$out"))" test "$rc" = 0
before=$(count "$OTHER_VALUE" "$S/other.jsonl")
out=$(guest "curl -sS -m 30 -w ' %{http_code}' -H \"Authorization: Bearer \$OTHER_KEY\" https://$OTHER/echo" 2>&1)
check "the second grant substitutes its own value at its own host ($(oneline "$out"))" \
  bash -c "[[ \"\$1\" == *200* ]] && [ \$(grep -a -c -F '$OTHER_VALUE' '$S/other.jsonl') = $((before + 1)) ]" _ "$out"
leak_check "sent to $OTHER, which only $OTHER_SECRET's grant names" other "sent to $OTHER" \
  "$CURL -H \"Authorization: Bearer \$$ENV_VAR\" https://$OTHER/echo"

# --- one secret, several headers (docs/SECRETS.md): the Anthropic SDKs send x-api-key or
# Authorization: Bearer; one grant serves both, the placeholder replaced where it stands
out=$(printf '%s\n' "$MULTI_VALUE" | vmctl secret create "$MULTI_SECRET" --host "$API" \
  --header x-api-key --header Authorization --env "$MULTI_ENV" 2>&1); rc=$?
out2=$(vmctl secret grant a1 "$MULTI_SECRET" 2>&1); rc2=$?
check "secret create $MULTI_SECRET --header x-api-key --header Authorization, grant ($(oneline "$out$out2"))" \
  test "$rc" = 0 -a "$rc2" = 0
before=$(count "$MULTI_VALUE" "$S/api.jsonl")
out=$(guest "curl -sS -m 30 -o /dev/null -w '%{http_code} ' -H \"x-api-key: \$$MULTI_ENV\" https://$API/echo &&
             curl -sS -m 30 -o /dev/null -w '%{http_code}' -H \"Authorization: Bearer \$$MULTI_ENV\" https://$API/echo" 2>&1)
check "one grant, two headers: $API got x-api-key '<value>', then Authorization 'Bearer <value>' ($(oneline "$out"))" \
  bash -c "[ \"\$1\" = '200 200' ] && [ \$(grep -a -c -F '$MULTI_VALUE' '$S/api.jsonl') = $((before + 2)) ] &&
           [ \"\$2\" = '$MULTI_VALUE' ] && [ \"\$3\" = 'Bearer $MULTI_VALUE' ]" \
  _ "$out" "$(last_header api x-api-key 2)" "$(last_header api authorization 1)"
before=$(count "$MULTI_VALUE" "$S/api.raw")
out=$(guest "$CURL -H \"X-Other: \$$MULTI_ENV\" https://$API/echo" 2>&1)
sleep 0.5
check "$MULTI_SECRET's placeholder in a header it does not name (X-Other): refused, logged as a leak ($(oneline "$out"))" \
  bash -c "[[ \"\$1\" != *200* ]] && [ \$(grep -a -c -F '$MULTI_VALUE' '$S/api.raw') = $before ] &&
           '$VMCTL' --socket '$SOCK' --json egress-log a1 | grep -q 'leak: placeholder of $MULTI_SECRET sent to $API'" _ "$out"
vmctl secret rm --force "$MULTI_SECRET" > /dev/null 2>&1

# --- an upstream hostd does not trust ---------------------------------------------------------
before=$(grep -c tls-failed "$S/rogue.jsonl")
out=$(guest "$CURL -H \"Authorization: Bearer \$$ENV_VAR\" https://$ROGUE/echo" 2>&1)
sleep 0.5
check "untrusted upstream $ROGUE (its CA is not hostd's): the request fails ($(oneline "$out"))" \
  bash -c "[[ \"\$1\" != *200* ]]" _ "$out"
check "untrusted upstream: hostd refused its certificate in the handshake, sent no request" \
  bash -c "[ \$(grep -c tls-failed '$S/rogue.jsonl') -gt $before ] && [ \$(grep -c '\"method\"' '$S/rogue.jsonl') = 0 ] &&
           [ \$(cat '$S/rogue.raw' | grep -a -c -F -e '$VALUE' -e '$PH') = 0 ]"
check "untrusted upstream: logged as denied for its certificate" \
  bash -c "'$VMCTL' --socket '$SOCK' --json egress-log a1 | grep '\"host\":\"$ROGUE\"' | grep '\"event\":\"denied\"' | grep -qi 'certif\\|trust'"

# --- rotation, revoke, grant again ----------------------------------------------------------------
out=$(printf '%s\n' "$VALUE2" | vmctl secret set "$SECRET" 2>&1); rc=$?
check "secret set $SECRET (rotation) prints nothing" test "$rc" = 0 -a -z "$out"
before=$(count "$VALUE" "$S/api.jsonl")
out=$(guest "curl -sS -m 30 -w ' %{http_code}' -H \"Authorization: Bearer \$$ENV_VAR\" https://$API/echo" 2>&1)
check "after rotation the next request carries the new value, same placeholder ($(oneline "$out"))" \
  bash -c "[[ \"\$1\" == *200* ]] && [ \"\$2\" = 'Bearer $VALUE2' ] && [ \$(grep -a -c -F '$VALUE' '$S/api.jsonl') = $before ] &&
           [ \"\$3\" = '$PH' ]" _ "$out" "$(last_auth api)" "$(vmctl exec a1 -- printenv "$ENV_VAR")"

out=$(vmctl secret revoke a1 "$SECRET" 2>&1); rc=$?
check "secret revoke a1 $SECRET ($(oneline "$out"))" test "$rc" = 0
check "after revoke the guest's env has no $ENV_VAR" \
  bash -c "! '$VMCTL' --socket '$SOCK' exec a1 -- printenv $ENV_VAR"
before=$(values "$S/api.raw")
out=$(guest "$CURL -H 'Authorization: Bearer $PH' https://$API/echo" 2>&1)
check "after revoke the old placeholder gets no value anywhere (HTTP $(oneline "$out"))" \
  bash -c "[[ \"\$1\" != *200* ]] && [ \"\$2\" = $before ]" _ "$out" "$(values "$S/api.raw")"
out=$(vmctl secret grant a1 "$SECRET" 2>&1); rc=$?
PH=$(vmctl exec a1 -- printenv "$ENV_VAR")
PH=${PH:-vmph_missing} # never empty: an empty string would match every line below
client_check_value() { # like client_check, for the rotated value
  local before out
  before=$(count "$VALUE2" "$S/api.jsonl")
  out=$(guest "curl -sS -m 30 -w ' %{http_code}' -H \"Authorization: Bearer \$$ENV_VAR\" https://$API/echo" 2>&1)
  check "$1 ($(oneline "$out"))" \
    bash -c "[[ \"\$1\" == *200* ]] && [ \$(grep -a -c -F '$VALUE2' '$S/api.jsonl') = $((before + 1)) ] &&
             [ \"\$2\" = 'Bearer $VALUE2' ]" _ "$out" "$(last_auth api)"
}
check "grant again: rc $rc, a placeholder in the env again" \
  bash -c "[ $rc = 0 ] && [[ '$PH' =~ ^vmph_[A-Za-z0-9]{40}$ ]]"
client_check_value "grant again: requests get the value again"

# --- forks ------------------------------------------------------------------------------------
t0=$(date +%s)
out=$(vmctl fork a1 f1 --grants 2>&1); rc=$?
[ "$rc" = 0 ] && AGENTS+=(f1)
check "fork a1 f1 --grants ($(( $(date +%s) - t0 )) s)" test "$rc" = 0 || diag "$out"
if [ "$rc" = 0 ]; then
  F1_PH=$(vmctl exec f1 -- printenv "$ENV_VAR")
  check "f1 holds the grant under a placeholder of its own ($F1_PH)" \
    bash -c "[[ '$F1_PH' =~ ^vmph_[A-Za-z0-9]{40}$ ]] && [ '$F1_PH' != '$PH' ] &&
             '$VMCTL' --socket '$SOCK' --json info f1 | grep -q '\"$SECRET\"'"
  before=$(count "$VALUE2" "$S/api.jsonl")
  out=$(guest "curl -sS -m 30 -w ' %{http_code}' -H \"Authorization: Bearer \$$ENV_VAR\" https://$API/echo" f1 2>&1)
  check "f1's requests get the value ($(oneline "$out"))" \
    bash -c "[[ \"\$1\" == *200* ]] && [ \$(grep -a -c -F '$VALUE2' '$S/api.jsonl') = $((before + 1)) ]" _ "$out"
  before=$(values "$S/api.raw")
  out=$(guest "$CURL -H 'Authorization: Bearer $PH' https://$API/echo" f1 2>&1)
  check "a1's placeholder sent from f1 gets no value (HTTP $(oneline "$out"))" \
    test "$(values "$S/api.raw")" = "$before"
  vmctl rm --force f1 > /dev/null 2>&1 && unset 'AGENTS[-1]'
fi
t0=$(date +%s)
out=$(vmctl fork a1 f2 2>&1); rc=$?
[ "$rc" = 0 ] && AGENTS+=(f2)
check "fork a1 f2, without --grants ($(( $(date +%s) - t0 )) s)" test "$rc" = 0 || diag "$out"
if [ "$rc" = 0 ]; then
  check "f2 holds no grant: no $ENV_VAR, no placeholder of a1's in its /etc/environment, none in info" \
    bash -c "! '$VMCTL' --socket '$SOCK' exec f2 -- printenv $ENV_VAR &&
             ! '$VMCTL' --socket '$SOCK' exec f2 -- grep -q vmph_ /etc/environment &&
             '$VMCTL' --socket '$SOCK' --json info f2 | python3 -c 'import json,sys; assert not json.load(sys.stdin).get(\"secrets\")'"
  before=$(values "$S/api.raw")
  out=$(guest "$CURL -H 'Authorization: Bearer $PH' https://$API/echo" f2 2>&1)
  check "f2's requests with a1's placeholder carry no value (HTTP $(oneline "$out"))" \
    bash -c "[[ \"\$1\" != *200* ]] && [ \"\$2\" = $before ]" _ "$out" "$(values "$S/api.raw")"
  vmctl rm --force f2 > /dev/null 2>&1 && unset 'AGENTS[-1]'
fi

# --- the value is nowhere but in hostd's store and upstream -------------------------------------
guest sync
CK=$(vmctl checkpoint a1 --memory 2>&1); rc=$?
check "memory checkpoint of a1 ($CK)" test "$rc" = 0
mapfile -t LAYERS < <(find "$S/agents/a1" -name '*.qcow2')
mapfile -t MEMORY < <(find "$S/agents/a1" -name 'memory-*.save')
# nowhere WHAT COUNT_OF_VALUES [SANITY]: 0 lines with either value (old or rotated) or the other
# secret's; SANITY, when given, is a condition showing the search read real data
nowhere() {
  check "no value in $1 (grep -a -c -F: $2)" bash -c "[ '$2' = 0 ] && ${3:-true}"
}
nowhere "the agent's disk layers (${#LAYERS[@]} qcow2, placeholder found $(count "$PH" "${LAYERS[@]}") times)" \
  "$(values "${LAYERS[@]}")" "[ ${#LAYERS[@]} -gt 0 ]"
nowhere "the memory checkpoint file (${MEMORY[*]##*/})" "$(values "${MEMORY[@]}")" "[ ${#MEMORY[@]} = 1 ]"
nowhere "the seed" "$(values "$S/agents/a1/seed.iso")" "[ -s '$S/agents/a1/seed.iso' ]"
mapfile -t AGENT_FILES < <(find "$S/agents/a1" -type f)
nowhere "any file under the agent's directory (${#AGENT_FILES[@]} files)" "$(values "${AGENT_FILES[@]}")"
vmctl exec a1 -- sudo tar -C / -cf - etc > "$S/guest-etc.tar" 2>/dev/null
nowhere "the guest's /etc" "$(values "$S/guest-etc.tar")" \
  "[ \$(grep -a -c -F '$PH' '$S/guest-etc.tar') -gt 0 ]"
vmctl exec a1 -- sudo tar -C / -cf - var/lib/cloud > "$S/guest-cloud.tar" 2>/dev/null
nowhere "the guest's /var/lib/cloud" "$(values "$S/guest-cloud.tar")" "[ -s '$S/guest-cloud.tar' ]"
vmctl exec a1 -- sudo sh -c 'cat /proc/[0-9]*/environ 2>/dev/null' | tr '\0' '\n' > "$S/guest-environ"
nowhere "/proc/*/environ in the guest" "$(values "$S/guest-environ")" \
  "grep -q '^$ENV_VAR=$PH' '$S/guest-environ'"
nowhere "hostd's log (--debug)" "$(values "$LOG")" "[ -s '$LOG' ]"
nowhere "the egress log" "$(values "$S/agents/a1/egress.log"*)" \
  "grep -q '\"secret\":\"$SECRET\"' '$S/agents/a1/egress.log'"
mapfile -t STATE_FILES < <(find "$S" -path "$S/secrets" -prune -o -type f \
  ! -name '*.raw' ! -name '*.jsonl' -print)
nowhere "any file of hostd's state outside its secret store (${#STATE_FILES[@]} files)" \
  "$(values "${STATE_FILES[@]}")"

# --- rm -------------------------------------------------------------------------------------------
before=$(vmctl secret list --json)
out=$(vmctl secret rm "$SECRET" 2>&1); rc=$?
check "secret rm of a granted secret is refused (exit 5: $out), nothing changes" \
  bash -c "[ $rc = 5 ] && [ \"\$1\" = \"\$('$VMCTL' --socket '$SOCK' secret list --json)\" ]" _ "$before"
out=$(vmctl secret rm "$SECRET" --force 2>&1); rc=$?
check "secret rm --force revokes and removes it ($(oneline "$out"))" \
  bash -c "[ $rc = 0 ] && ! '$VMCTL' --socket '$SOCK' secret list | grep -q '$SECRET' &&
           ! '$VMCTL' --socket '$SOCK' exec a1 -- printenv $ENV_VAR"
check "after rm --force the value is gone from the host's disk" \
  bash -c "! grep -rqF -e '$VALUE' -e '$VALUE2' '$S/secrets'"
vmctl rm --force a1 > /dev/null; rc=$?
[ "$rc" = 0 ] && unset 'AGENTS[0]'
check "rm a1 removes its CA" test "$rc" = 0 -a ! -e "$S/egress-ca/a1.crt" -a ! -e "$S/egress-ca/a1.key"

echo "1..$N"
[ "$FAILED" -eq 0 ]
