#!/bin/bash
# bench/egress: bulk throughput through the egress proxy (CONNECT tunnel) against a direct
# loopback transfer in the same run, and the latency a proxied connection adds (connect, CONNECT
# round trip, one byte echoed; medians). Goal: throughput >= 0.8x direct.
#
# Usage: bench/egress.sh [MIB] [CONNECTIONS]   (after `meson setup build && ninja -C build`)
# Runs entirely on 127.0.0.1; needs no VM and no root.
set -euo pipefail
cd "$(dirname "$0")/.."
BENCH=${EGRESS_BENCH:-./build/bench/egress-bench}
[ -x "$BENCH" ] || { echo "bench/egress: build $BENCH first (ninja -C build bench/egress-bench)" >&2; exit 1; }
exec "$BENCH" "${1:-512}" "${2:-200}"
