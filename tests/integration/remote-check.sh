#!/bin/bash
# vmctl --host ssh:// through a real OpenSSH server: the script starts its own sshd on a free
# 127.0.0.1 port, with a throwaway host key and a throwaway user key authorized for root, and
# drives the hostd whose socket is $HOSTD_SOCKET through it as a remote host: list, new, exec
# with stdin and exit status (and a MiB both ways), ssh-config then plain ssh through the
# ProxyJump, vmctl ssh, the errors of an unreachable host and of a missing socket, rm. TAP.
#
#   sudo VMCTL=build/vmctl/vmctl HOSTD_SOCKET=$S/hostd.sock tests/integration/remote-check.sh
#
# Needs root (sshd's privilege separation), openssh-server and openssh-client, python3 (a free
# port). The "remote" is this host, so the key and known_hosts files that ssh-config names are
# readable here too. Knobs:
#   REMOTE_AGENT=NAME       the agent created and removed (default remote-check)
#   REMOTE_TEMPLATE=NAME    its template (default: hostd's)
#   REMOTE_EXISTING=NAME    use this agent instead: no new, no rm
#   REMOTE_SKIP_AGENT_SSH=1 skip the checks that log in to the agent (plain ssh, vmctl ssh)
# The user's ~/.ssh is not touched: vmctl runs ssh through a wrapper first on PATH that adds this
# check's own client configuration (-F).
set -u
: "${VMCTL:?VMCTL must name the vmctl to test}" "${HOSTD_SOCKET:?HOSTD_SOCKET must name the socket of hostd}"
VMCTL=$(realpath "$VMCTL")
HOSTD_SOCKET=$(realpath "$HOSTD_SOCKET")
here=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=../tap.sh
. "$here/../tap.sh"
# shellcheck source=loopback-sshd.sh
. "$here/loopback-sshd.sh"

tmp=$(mktemp -d -t remote-check.XXXXXX)
chmod 755 "$tmp"
agent=${REMOTE_EXISTING:-${REMOTE_AGENT:-remote-check}}
created=
SSHD_PID=
cleanup() {
    if [ -n "$created" ]; then
        "$VMCTL" --socket "$HOSTD_SOCKET" rm --force "$agent" >/dev/null 2>&1
    fi
    loopback_sshd_stop
    rm -rf "$tmp"
}
trap cleanup EXIT

# ---- sshd on 127.0.0.1, its own keys; the client side: the ssh vmctl runs, with this check's
# key and pinned host key
if ! loopback_sshd_start "$tmp" "$VMCTL"; then
    not_ok "sshd listens on 127.0.0.1:$SSHD_PORT"
    sed 's/^/# /' "$tmp/sshd.log"
    tap_end
    exit 1
fi
ok "sshd listens on 127.0.0.1:$SSHD_PORT"
port=$SSHD_PORT
unset VMCTL_SOCKET VMCTL_HOST
url="ssh://root@127.0.0.1:$port$HOSTD_SOCKET"
local_vmctl() { "$VMCTL" --socket "$HOSTD_SOCKET" "$@"; }
remote() { "$VMCTL" --host "$url" "$@"; }

# ---- what a local vmctl sees, a remote one sees
remote list >"$tmp/remote-list" 2>"$tmp/err"
check "list through ssh" test $? -eq 0
sed 's/^/# /' "$tmp/err"
local_vmctl list >"$tmp/local-list"
# SINCE and CREATED are "N seconds ago": compare the names and states only.
check "it is the local list" cmp -s <(awk '{print $1, $2}' "$tmp/remote-list") \
    <(awk '{print $1, $2}' "$tmp/local-list")
remote list --json >"$tmp/remote.json" && local_vmctl list --json >"$tmp/local.json"
check "list --json names the same agents" cmp -s <(grep '"name"' "$tmp/remote.json") \
    <(grep '"name"' "$tmp/local.json")
VMCTL_HOST=$url "$VMCTL" list >/dev/null 2>&1
check "\$VMCTL_HOST does as --host" test $? -eq 0

if [ -z "${REMOTE_EXISTING:-}" ]; then
    template=()
    [ -n "${REMOTE_TEMPLATE:-}" ] && template=(--template "$REMOTE_TEMPLATE")
    remote new "$agent" "${template[@]}" >"$tmp/new" 2>"$tmp/err"
    status=$?
    [ $status -eq 0 ] && created=1
    check "new $agent through ssh" test $status -eq 0
    sed 's/^/# /' "$tmp/new" "$tmp/err"
fi

# ---- exec: stdin in, both streams and the status out
out=$(printf 'hello\n' | remote exec "$agent" -- sh -c 'cat; echo to-stderr >&2; exit 7' 2>"$tmp/err")
status=$?
check "exec: stdin reaches the command, stdout comes back" test "$out" = hello
check "exec: stderr comes back apart" grep -qx to-stderr "$tmp/err"
check "exec: the exit status is the command's (7)" test $status -eq 7
head -c 1048576 /dev/urandom >"$tmp/mib"
sum=$(remote exec "$agent" -- cat <"$tmp/mib" | sha256sum | cut -d' ' -f1)
check "exec: a MiB through cat and back, unchanged" test "$sum" = "$(sha256sum <"$tmp/mib" | cut -d' ' -f1)"
remote exec "$agent" -- false
check "exec: a failing command's status (1)" test $? -eq 1

# ---- ssh-config, then plain ssh through the ProxyJump; vmctl ssh on the remote
remote ssh-config "$agent" >"$tmp/agent_config"
check "ssh-config names the jump" grep -qx "  ProxyJump root@127.0.0.1:$port" "$tmp/agent_config"
if [ "${REMOTE_SKIP_AGENT_SSH:-0}" != 1 ]; then
    # ssh hands -F to the jump's own ssh: the jump host's stanza goes in the same file.
    cat "$tmp/ssh_config" >>"$tmp/agent_config"
    out=$(/usr/bin/ssh -F "$tmp/agent_config" "vmctl-$agent" -- echo through-the-jump 2>"$tmp/err")
    check "plain ssh to the agent through the remote host" test "$out" = through-the-jump
    sed 's/^/# /' "$tmp/err"
    out=$(remote ssh "$agent" -- echo by-vmctl-ssh </dev/null 2>"$tmp/err")
    check "vmctl ssh runs ssh on the remote host" test "$out" = by-vmctl-ssh
    sed 's/^/# /' "$tmp/err"
fi

# ---- failures: one line each, with vmctl's statuses
err=$("$VMCTL" --host "ssh://root@127.0.0.1:$port/nonexistent/hostd.sock" list 2>&1 >/dev/null)
status=$?
check "a missing remote socket: exit 12" test $status -eq 12
check "and hostd's own message" test "$err" = "vmctl: hostd is not running at /nonexistent/hostd.sock"
dead=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
err=$("$VMCTL" --host "ssh://root@127.0.0.1:$dead" list 2>&1 >/dev/null)
status=$?
check "an unreachable host: exit 12" test $status -eq 12
check "and ssh's reason" grep -q "^vmctl: cannot reach hostd on 127.0.0.1: .*refused" <<<"$err"
diag "$err"
err=$("$VMCTL" --host "ssh://root@127.0.0.1:0" list 2>&1 >/dev/null)
check "a bad URL: a usage error" test $? -eq 2
diag "$err"

# ---- rm
if [ -n "$created" ]; then
    remote rm --force "$agent" >/dev/null 2>"$tmp/err"
    check "rm through ssh" test $? -eq 0
    sed 's/^/# /' "$tmp/err"
    remote list --json >"$tmp/after.json"
    check "and it is gone" test -z "$(grep "\"name\" : \"$agent\"" "$tmp/after.json")"
    created=
fi

tap_end
