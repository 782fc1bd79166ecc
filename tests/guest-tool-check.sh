#!/bin/bash
# vmctl-guest (cloud-init/vmctl-guest) runs inside every agent, where nobody sees it break: it must
# parse, and pass shellcheck where shellcheck is installed. Its behaviour is tested against a
# real server in tests/unit/test-hostd-guest-api.c.
# shellcheck source=tap.sh
. "$(dirname "$0")/tap.sh"
tool=${VM_SOURCE_DIR:?}/cloud-init/vmctl-guest
check "vmctl-guest parses (bash -n)" bash -n "$tool"
check "vmctl-guest is a bash script" bash -c "head -n 1 '$tool' | grep -qx '#!/bin/bash'"
if command -v shellcheck >/dev/null; then
  out=$(shellcheck "$tool" 2>&1); rc=$?
  check "shellcheck finds nothing in vmctl-guest" test "$rc" = 0
  [ "$rc" = 0 ] || diag "$out"
else
  skip "shellcheck finds nothing in vmctl-guest" "shellcheck not installed"
fi
tap_end
