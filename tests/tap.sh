# TAP output for the test scripts; sourced, not run. ok, not_ok, check and skip number the
# tests in N and count failures in FAILED; diag writes a comment; tap_end prints the plan and
# fails when a test did.
N=0
FAILED=0
ok() { N=$((N + 1)); echo "ok $N - $*"; }
not_ok() { N=$((N + 1)); FAILED=$((FAILED + 1)); echo "not ok $N - $*"; }
check() { # check DESCRIPTION COMMAND...: ok when COMMAND succeeds
  local desc=$1; shift
  if "$@"; then ok "$desc"; else not_ok "$desc"; fi
}
skip() { N=$((N + 1)); echo "ok $N - $1 # SKIP $2"; }
diag() { sed 's/^/# /' <<< "$*"; }
tap_end() { echo "1..$N"; [ "$FAILED" -eq 0 ]; }
