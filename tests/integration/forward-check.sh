# `vmctl forward` on a real agent; sourced, not run. Defines forward_check, which a VM suite
# calls after sourcing lib.sh and starting hostd, with a running agent whose guest has python3
# (debian-12 has it):
#
#   # shellcheck source=forward-check.sh
#   . "$(dirname "$0")/forward-check.sh"
#   forward_check a1
#
# It serves a web page from inside the agent (python3 -m http.server on the guest's 127.0.0.1,
# started through vmctl exec) and fetches it through `vmctl forward` from the host: while the
# agent runs, after `vmctl suspend` (paused) and after `vmctl suspend --save` (the request wakes
# it), after a hostd restart (stop_hostd, start_hostd: with `shutdown = save` the agent comes
# back saved, and the request wakes it); `--list` shows the forward, a guest port nobody listens
# on closes the connection and is logged once, `--rm` stops it. TAP through lib.sh's check, ok,
# not_ok and diag; uses $S (the state dir) and $LOG (hostd's log). Leaves the agent running, its
# forwards removed and its web server stopped. Guest ports 8123 and 8124 must be free in it.

# _forward_get PORT SECONDS: prints the page the guest serves, fetched through 127.0.0.1:PORT
# within SECONDS (the wake of a saved agent included); fails, saying why on stderr, when none
# comes. No proxy from the environment: the request must go to the forward itself.
_forward_get() {
  python3 - "$1" "$2" <<'PY'
import sys
import urllib.request

port, timeout = sys.argv[1], float(sys.argv[2])
opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
try:
    with opener.open(f"http://127.0.0.1:{port}/forward-check.txt", timeout=timeout) as reply:
        sys.stdout.write(reply.read().decode())
except Exception as e:
    sys.stderr.write(f"{type(e).__name__}: {e}\n")
    sys.exit(1)
PY
}

# _forward_silent PORT: a request to 127.0.0.1:PORT is accepted, then the connection ends
# without a byte of answer, and without a reset.
_forward_silent() {
  python3 - "$1" <<'PY'
import socket
import sys

s = socket.create_connection(("127.0.0.1", int(sys.argv[1])), 30)
s.settimeout(60)
s.sendall(b"GET / HTTP/1.0\r\n\r\n")
sys.exit(1 if s.recv(1) else 0)
PY
}

# _forward_closed PORT: nothing listens on 127.0.0.1:PORT.
_forward_closed() {
  ! python3 -c 'import socket, sys; socket.create_connection(("127.0.0.1", int(sys.argv[1])), 5)' \
    "$1" 2>/dev/null
}

# _forward_entry AGENT GUEST_PORT: "HOST_PORT LISTENING CONNECTIONS" of that forward as
# `vmctl forward --list --json` has it ("True"/"False"), or nothing.
_forward_entry() {
  vmctl --json forward --list "$1" 2>/dev/null | python3 -c '
import json, sys
for f in json.load(sys.stdin):
    if f["agent"] == sys.argv[1] and f["guest_port"] == int(sys.argv[2]):
        print(f["host_port"], f["listening"], f["connections"])
' "$1" "$2" 2>/dev/null
}

# _forward_state AGENT: running, paused, saved...
_forward_state() {
  vmctl --json info "$1" 2>/dev/null |
    python3 -c 'import json, sys; print(json.load(sys.stdin)["state"])' 2>/dev/null
}

# _forward_fetch DESCRIPTION PORT SECONDS TOKEN: one check that the page is TOKEN; the time it
# took goes to a diagnostic.
_forward_fetch() {
  local desc=$1 port=$2 seconds=$3 token=$4 body start ms
  start=$(date +%s%3N)
  if body=$(_forward_get "$port" "$seconds" 2>&1) && [ "$body" = "$token" ]; then
    ms=$(($(date +%s%3N) - start))
    ok "$desc (${ms} ms)"
  else
    not_ok "$desc"
    diag "got: $body"
  fi
}

forward_check() {
  local agent=$1 gport=8123 nobody=8124
  local token="forward-check $$ $RANDOM" entry hport listening out state i
  local dir=/tmp/forward-check

  # --- a web server in the guest, on its loopback --------------------------------------------
  # The server alone goes to the background, its standard streams off the exec's channel, so
  # that the exec returns. The guest's shell expands the script's parameters:
  # shellcheck disable=SC2016
  vmctl exec "$agent" -- sh -c 'mkdir -p "$1" && printf "%s" "$2" > "$1/forward-check.txt" &&
      cd "$1" || exit 1
      setsid python3 -m http.server "$3" --bind 127.0.0.1 </dev/null >/dev/null 2>&1 &' \
    sh "$dir" "$token" "$gport" >/dev/null 2>&1
  for i in $(seq 1 60); do
    vmctl exec "$agent" -- python3 -c \
      "import socket; socket.create_connection(('127.0.0.1', $gport), 2).close()" \
      >/dev/null 2>&1 && break
    sleep 0.5
  done
  check "a web server listens on 127.0.0.1:$gport inside $agent (after ${i} tries)" \
    vmctl exec "$agent" -- python3 -c \
    "import socket; socket.create_connection(('127.0.0.1', $gport), 2).close()"

  # --- forwarded while the agent runs --------------------------------------------------------
  out=$(vmctl forward "$agent" "$gport" 2>&1)
  entry=$(_forward_entry "$agent" "$gport")
  hport=${entry%% *}
  check "vmctl forward $agent $gport says where: $out" \
    test "$out" = "port $gport of $agent is served on 127.0.0.1:$hport"
  if [ -z "$hport" ]; then
    not_ok "the forward is listed, so the rest can run"
    return 1
  fi
  check "the forward is recorded in $agent's directory" \
    grep -q "^\[forward $gport\]" "$S/agents/$agent/forwards.ini"
  _forward_fetch "the guest's page comes through 127.0.0.1:$hport while $agent runs" \
    "$hport" 60 "$token"
  out=$(vmctl forward --list "$agent" 2>&1)
  if grep -qE "^$agent +$gport +127\.0\.0\.1:$hport +[0-9]+ +yes$" <<< "$out"; then
    ok "vmctl forward --list shows it, served"
  else
    not_ok "vmctl forward --list shows it, served"
    diag "$out"
  fi
  vmctl forward "$agent" "$gport" >/dev/null 2>&1
  check "a second forward of the same guest port is refused (exit 4)" test $? = 4

  # --- paused: the request resumes it ----------------------------------------------------------
  vmctl suspend "$agent" >/dev/null 2>&1
  state=$(_forward_state "$agent")
  check "$agent is paused by vmctl suspend" test "$state" = paused
  _forward_fetch "the page comes through the forward of the paused agent" "$hport" 60 "$token"
  state=$(_forward_state "$agent")
  check "the request woke $agent (running, was paused)" test "$state" = running

  # --- saved: the request restores it ----------------------------------------------------------
  vmctl suspend --save "$agent" >/dev/null 2>&1
  state=$(_forward_state "$agent")
  check "$agent is saved by vmctl suspend --save" test "$state" = saved
  _forward_fetch "the page comes through the forward of the saved agent (the request restores it)" \
    "$hport" 180 "$token"
  state=$(_forward_state "$agent")
  check "the request woke $agent (running, was saved)" test "$state" = running

  # --- a guest port nobody listens on ----------------------------------------------------------
  out=$(vmctl forward "$agent" "$nobody" 2>&1)
  entry=$(_forward_entry "$agent" "$nobody")
  if [ -n "$entry" ]; then
    check "a connection to a guest port nobody listens on ends without an answer" \
      _forward_silent "${entry%% *}"
    for i in $(seq 1 50); do
      grep -q "forwarded port $nobody: nothing took the connection" "$LOG" && break
      sleep 0.2
    done
    check "hostd logs it once" \
      test "$(grep -c "agent '$agent': forwarded port $nobody: nothing took the connection" "$LOG")" = 1
    vmctl forward --rm "$agent" "$nobody" >/dev/null 2>&1
  else
    not_ok "vmctl forward $agent $nobody: $out"
  fi

  # --- hostd restarts: the forward is served again ---------------------------------------------
  stop_hostd
  if start_hostd; then
    entry=$(_forward_entry "$agent" "$gport")
    listening=$(cut -d' ' -f2 <<< "$entry")
    check "after a hostd restart the forward is served again on the same port" \
      test "${entry%% *} $listening" = "$hport True"
    _forward_fetch "the page comes through the forward after the restart ($(_forward_state "$agent") before)" \
      "$hport" 180 "$token"
  else
    not_ok "hostd starts again"
    return 1
  fi

  # --- removed -------------------------------------------------------------------------------
  check "vmctl forward --rm stops it" vmctl forward --rm "$agent" "$gport"
  check "nothing listens on 127.0.0.1:$hport any more" _forward_closed "$hport"
  check "vmctl forward --list shows no forward of $agent" \
    test "$(vmctl --json forward --list "$agent" 2>&1)" = "[]"
  check "its record is gone" bash -c "! grep -q '^\[forward ' '$S/agents/$agent/forwards.ini'"
  vmctl exec "$agent" -- pkill -f "http.server $gport" >/dev/null 2>&1
  return 0
}
