# TAP output for the test scripts; sourced, not run. ok, not_ok, check and skip number the
# tests in N and count failures in FAILED; diag writes a comment; tap_end prints the plan and
# fails when a test did. A result that came 20 s or more after the one before is followed by a
# comment with that time, so a slow suite shows where its minutes go.
# A failure, and the comments that follow it, go to stderr too: a runner that shows only the
# end of a long suite's output (meson shows its stderr last) still shows what failed and why.
N=0
FAILED=0
TAP_LAST=$SECONDS
TAP_FAILING=0
tap_took() {
  local took=$((SECONDS - TAP_LAST))
  TAP_LAST=$SECONDS
  [ "$took" -lt 20 ] || echo "# ($took s)"
}
ok() { N=$((N + 1)); TAP_FAILING=0; echo "ok $N - $*"; tap_took; }
not_ok() {
  N=$((N + 1)); FAILED=$((FAILED + 1)); TAP_FAILING=1
  echo "not ok $N - $*"; echo "not ok $N - $*" >&2
  tap_took
}
check() { # check DESCRIPTION COMMAND...: ok when COMMAND succeeds; fails as it did, so that
  local desc=$1; shift # `check ... || diag "$out"` says why
  if "$@"; then ok "$desc"; else not_ok "$desc"; return 1; fi
}
skip() { N=$((N + 1)); TAP_FAILING=0; echo "ok $N - $1 # SKIP $2"; tap_took; }
diag() {
  sed 's/^/# /' <<< "$*"
  [ "$TAP_FAILING" = 0 ] || sed 's/^/# /' <<< "$*" | head -n 40 >&2
}
diag_err() { sed 's/^/# /' <<< "$*"; sed 's/^/# /' <<< "$*" >&2; } # a comment on stderr too
tap_end() { echo "1..$N"; [ "$FAILED" -eq 0 ]; }
