#!/bin/bash
# Runs the whole test suite on a Debian 12 machine, as root: installs what is missing, builds
# with warnings as errors, runs the unit and style suites, the unit suite again under
# AddressSanitizer + UBSan, then the VM suites (boot real guests under TCG), in two lanes side by
# side. Set VM_SKIP_VM_SUITE=1 to skip the VM suites. They share one image cache,
# $VM_TEST_IMAGE_CACHE (default build/vm-images): vm-image.sh builds the debian-12 image and its
# warm image there first, the suites take it, instead of each building its own (about 8 minutes
# a build under TCG). The soak runs its short form (SOAK_MINUTES, default 10).
set -euo pipefail
cd "$(dirname "$0")"

./scripts/install-deps.sh

start=$(date +%s)
meson setup build --werror --wipe >/dev/null 2>&1 || meson setup build --werror >/dev/null
ninja -C build
# The official MCP SDK from the npm registry, for the MCP test's real client (pinned by
# package-lock.json; nothing when it is there already).
tests/integration/mcp/install.sh || echo "run-tests: the MCP SDK could not be installed; its check will not run" >&2
# A TAP test's own words on a failure (which assertion, on which line) are in its stdout, which
# meson keeps in its log and does not print.
unit_failures() {
  grep -a -A8 -e '^not ok' -e '^Bail out' "$1/meson-logs/testlog.txt" >&2 || true
}
meson test -C build --suite unit --suite style --print-errorlogs || { unit_failures build; exit 1; }

meson setup build-asan --werror -Db_sanitize=address,undefined -Db_lundef=false \
  >/dev/null 2>&1 || true
ninja -C build-asan
ASAN_OPTIONS=detect_leaks=1 UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1 \
  meson test -C build-asan --suite unit --print-errorlogs || { unit_failures build-asan; exit 1; }

if [ "${VM_SKIP_VM_SUITE:-0}" != 1 ]; then
  export VM_TEST_IMAGE_CACHE=${VM_TEST_IMAGE_CACHE:-$PWD/build/vm-images}
  export HOSTD=build/hostd/hostd VMCTL=build/vmctl/vmctl
  mkdir -p "$VM_TEST_IMAGE_CACHE"
  tests/integration/vm-image.sh
  # Two lanes side by side, each a guest or two at a time on its own ports and state dir; every
  # suite runs even when one before it failed, each line prefixed with its lane.
  # Each suite's output also goes to its own log under build/test-logs, and a summary closes the
  # run: the lanes interleave, and a CI log often keeps only its tail.
  logs=$PWD/build/test-logs
  rm -rf "$logs"; mkdir -p "$logs"
  run_lane() {
    local rc=0 t suite log
    for suite in "$@"; do
      t=$(date +%s)
      log=$logs/$(echo "$suite" | tr -c 'A-Za-z0-9.\n-' '_' | cut -c1-80).log
      if (set -o pipefail; bash -c "$suite" 2>&1 | tee "$log"); then
        echo "ok $(( $(date +%s) - t )) s: $suite" >> "$logs/summary"
      else
        rc=1
        echo "FAILED: $suite"
        echo "FAILED $(( $(date +%s) - t )) s: $suite (log: $log)" >> "$logs/summary"
      fi
      echo "$suite: $(( $(date +%s) - t )) s"
    done
    return $rc
  }
  (set -o pipefail
   run_lane "meson test -C build --suite vm --print-errorlogs --verbose" \
     tests/integration/vm-warm.sh \
     "SOAK_MINUTES=${SOAK_MINUTES:-10} SOAK_AGENTS=${SOAK_AGENTS:-8} tests/integration/vm-soak.sh" \
     2>&1 | sed -u 's/^/[a] /') &
  lane_a=$!
  (set -o pipefail
   run_lane tests/integration/vm-egress.sh tests/integration/vm-secrets.sh \
     tests/integration/vm-lifecycle.sh tests/integration/vm-fleet.sh 2>&1 | sed -u 's/^/[b] /') &
  lane_b=$!
  vm_rc=0
  wait "$lane_a" || vm_rc=1
  wait "$lane_b" || vm_rc=1
  echo "run-tests: VM suites:"
  sed 's/^/  /' "$logs/summary"
  if [ "$vm_rc" != 0 ]; then
    # What failed, from each failed suite's log: TAP's "not ok" lines and meson's failures.
    grep -h -E '^(not ok|.*[0-9]+/[0-9]+ .* (FAIL|TIMEOUT|ERROR) )' "$logs"/*.log | head -40 || true
    echo "run-tests: a VM suite failed (the FAILED lines above say which)"
    echo "test suite took $(( $(date +%s) - start )) s"
    exit 1
  fi
fi
echo "test suite took $(( $(date +%s) - start )) s"
