#!/bin/bash
# Runs the whole test suite on a Debian 12 machine, as root: installs what is missing, builds
# with warnings as errors, runs the unit and style suites, the unit suite again under
# AddressSanitizer + UBSan, then the VM suites (boot real guests under TCG). Set
# VM_SKIP_VM_SUITE=1 to skip the VM suites. They share one image cache, $VM_TEST_IMAGE_CACHE
# (default build/vm-images): the first suite builds the debian-12 image and its warm image, the
# others take it, instead of each building its own (about 8 minutes a build under TCG).
set -euo pipefail
cd "$(dirname "$0")"

./scripts/install-deps.sh

start=$(date +%s)
meson setup build --werror --wipe >/dev/null 2>&1 || meson setup build --werror >/dev/null
ninja -C build
# The official MCP SDK from the npm registry, for the MCP test's real client (pinned by
# package-lock.json; nothing when it is there already).
tests/integration/mcp/install.sh || echo "run-tests: the MCP SDK could not be installed; its check will not run" >&2
meson test -C build --suite unit --suite style --print-errorlogs

meson setup build-asan --werror -Db_sanitize=address,undefined -Db_lundef=false \
  >/dev/null 2>&1 || true
ninja -C build-asan
ASAN_OPTIONS=detect_leaks=1 UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1 \
  meson test -C build-asan --suite unit --print-errorlogs

if [ "${VM_SKIP_VM_SUITE:-0}" != 1 ]; then
  export VM_TEST_IMAGE_CACHE=${VM_TEST_IMAGE_CACHE:-$PWD/build/vm-images}
  mkdir -p "$VM_TEST_IMAGE_CACHE"
  meson test -C build --suite vm --print-errorlogs --verbose
  HOSTD=build/hostd/hostd VMCTL=build/vmctl/vmctl tests/integration/vm-egress.sh
  HOSTD=build/hostd/hostd VMCTL=build/vmctl/vmctl tests/integration/vm-secrets.sh
  HOSTD=build/hostd/hostd VMCTL=build/vmctl/vmctl tests/integration/vm-lifecycle.sh
  HOSTD=build/hostd/hostd VMCTL=build/vmctl/vmctl tests/integration/vm-warm.sh
fi
echo "test suite took $(( $(date +%s) - start )) s"
