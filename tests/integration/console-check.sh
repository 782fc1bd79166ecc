# shellcheck shell=bash
# The serial console's cap on a real agent; sourced, not run. Defines console_check, which a VM
# suite calls after sourcing lib.sh and starting hostd, with a running agent whose user may sudo
# (debian-12's may):
#
#   # shellcheck source=console-check.sh
#   . "$(dirname "$0")/console-check.sh"
#   console_check a1
#
# The guest writes 12 MiB, three times the cap, to its serial console (/dev/ttyS0, as root, at most
# 10 minutes; a TCG guest gets about 80 KiB/s through its emulated UART here, so a GiB would take
# hours: the unit test test-console pushes 50 MiB through the copier) while
# the host samples its console files every second: console.log and console.log.1 each stay within
# the cap (HOSTD_CONSOLE_MAX_BYTES, 4 MiB) all along, more than the cap went through (the log
# rotated), the newest bytes are the guest's, and the agent still answers. TAP through lib.sh's
# check and diag; uses $S (the state dir). Leaves the agent running.

CONSOLE_CAP=$((4 * 1024 * 1024))

# _console_size FILE: its size in bytes, 0 when it does not exist.
_console_size() {
  if [ -f "$1" ]; then stat -c %s "$1"; else echo 0; fi
}

# _console_newest_is_guests FILE: its last 4 KiB are all "x", what the guest wrote last.
_console_newest_is_guests() {
  [ "$(tail -c 4096 "$1" | tr -d x | wc -c)" -eq 0 ]
}

console_check() {
  local agent=$1 dir=$S/agents/$1 writer started current old max_current=0 max_old=0
  local log=$S/agents/$1/console.log

  started=$(date +%s)
  vmctl exec "$agent" -- sudo timeout 600 sh -c \
    'head -c 12M /dev/zero | tr "\\0" x > /dev/ttyS0' >/dev/null 2>&1 &
  writer=$!
  while kill -0 "$writer" 2>/dev/null; do
    current=$(_console_size "$log")
    old=$(_console_size "$log.1")
    [ "$current" -gt "$max_current" ] && max_current=$current
    [ "$old" -gt "$max_old" ] && max_old=$old
    sleep 1
  done
  wait "$writer"
  diag "the guest wrote to its console for $(($(date +%s) - started)) s;" \
    "largest console.log $max_current, console.log.1 $max_old bytes"

  check "console.log stayed within $CONSOLE_CAP bytes while the guest wrote" \
    test "$max_current" -le "$CONSOLE_CAP"
  check "console.log.1 stayed within $CONSOLE_CAP bytes while the guest wrote" \
    test "$max_old" -le "$CONSOLE_CAP"
  check "more than the cap reached the host: the console log rotated" \
    test "$(_console_size "$log.1")" -gt 0
  check "the agent keeps nothing else of its console" \
    test "$(find "$dir" -maxdepth 1 -name 'console.log*' | wc -l)" -le 2
  check "the newest console bytes are what the guest wrote last" _console_newest_is_guests "$log"
  check "the agent still answers after flooding its console" \
    vmctl exec "$agent" -- true
}
