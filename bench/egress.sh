#!/bin/bash
# bench/egress: bulk throughput through the egress proxy (CONNECT tunnel, reached as a guest
# reaches it: its connection handed to the proxy's Unix socket) against a direct loopback
# transfer in the same run, and the latency a proxied connection adds, with and without spawning
# the guestfwd helper per connection (medians). Goal: throughput >= 0.8x direct.
#
# Usage: bench/egress.sh [MIB] [CONNECTIONS]   (after `meson setup build && ninja -C build`)
# Runs entirely on 127.0.0.1; needs no VM and no root.
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD=${EGRESS_BUILD:-./build}
BENCH=${EGRESS_BENCH:-$BUILD/bench/egress-bench}
HELPER=${EGRESS_CONNECT:-$BUILD/egress/vm-egress-connect}
for f in "$BENCH" "$HELPER"; do
  [ -x "$f" ] || { echo "bench/egress: build $f first (ninja -C $BUILD)" >&2; exit 1; }
done
exec "$BENCH" "${1:-512}" "${2:-200}" "$HELPER"
