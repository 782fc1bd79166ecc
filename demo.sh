#!/bin/bash
# The demo, on a fresh Debian 12 machine, as root: installs dependencies, builds, starts hostd
# on the embedded libvirt driver (no libvirtd needed), builds the debian-12 image from the
# Debian mirror (first time only, ~4 min), creates an agent and runs a command in it.
set -euo pipefail
cd "$(dirname "$0")"

./scripts/install-deps.sh
[ -d build ] || meson setup build >/dev/null
ninja -C build >/dev/null

STATE=${HOSTD_STATE_DIR:-/var/lib/hostd}
export VMCTL_SOCKET=$STATE/hostd.sock
vmctl=./build/vmctl/vmctl
if ! $vmctl list >/dev/null 2>&1; then
  mkdir -p "$STATE"
  nohup ./build/hostd/hostd --state-dir "$STATE" >> "$STATE/hostd.log" 2>&1 &
  echo "hostd started (pid $!, log $STATE/hostd.log)"
  for _ in $(seq 1 100); do $vmctl list >/dev/null 2>&1 && break; sleep 0.2; done
fi

$vmctl template build debian-12
$vmctl info demo >/dev/null 2>&1 || $vmctl new demo
$vmctl exec demo -- sh -c 'echo "hello from $(hostname): $(uname -sr), $(nproc) CPUs"'
echo
echo "Next: $vmctl ssh demo    |    $vmctl list    |    $vmctl rm --force demo"
