# TAP output for the test scripts; sourced, not run. ok, not_ok, check and skip number the
# tests in N and count failures in FAILED; diag writes a comment; tap_end prints the plan and
# fails when a test did. A result that came 20 s or more after the one before is followed by a
# comment with that time, so a slow suite shows where its minutes go.
N=0
FAILED=0
TAP_LAST=$SECONDS
tap_took() {
  local took=$((SECONDS - TAP_LAST))
  TAP_LAST=$SECONDS
  [ "$took" -lt 20 ] || echo "# ($took s)"
}
ok() { N=$((N + 1)); echo "ok $N - $*"; tap_took; }
not_ok() { N=$((N + 1)); FAILED=$((FAILED + 1)); echo "not ok $N - $*"; tap_took; }
check() { # check DESCRIPTION COMMAND...: ok when COMMAND succeeds
  local desc=$1; shift
  if "$@"; then ok "$desc"; else not_ok "$desc"; fi
}
skip() { N=$((N + 1)); echo "ok $N - $1 # SKIP $2"; tap_took; }
diag() { sed 's/^/# /' <<< "$*"; }
tap_end() { echo "1..$N"; [ "$FAILED" -eq 0 ]; }
