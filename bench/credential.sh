#!/bin/bash
# bench/credential: what the credential broker's TLS interception costs, against a plain CONNECT
# tunnel through the same egress proxy and a direct connection to the same loopback HTTPS
# upstream, in one run: requests/s on a keep-alive connection and the time each takes, the time
# to a new connection's first answer, and a download of MIB MiB (medians; the intercepted
# download as a ratio to the tunnel's, goal >= 0.8x). The upstream's certificate comes from a
# test CA made here with openssl, which the proxy trusts as its upstream CA file; the agent's CA
# is made by the egress library itself (vm_egress_ca_generate()). See bench/README.md.
#
# Usage: bench/credential.sh [MIB] [REQUESTS] [CONNECTIONS]   (defaults 100, 2000, 100; after
# `meson setup build && ninja -C build`). Runs entirely on 127.0.0.1; needs no VM and no root.
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD=${EGRESS_BUILD:-./build}
BENCH=${CREDENTIAL_BENCH:-$BUILD/bench/credential-bench}
[ -x "$BENCH" ] || { echo "bench/credential: build $BENCH first (ninja -C $BUILD)" >&2; exit 1; }
command -v openssl >/dev/null || { echo "bench/credential: needs openssl" >&2; exit 1; }
D=$(mktemp -d -t credential-bench.XXXXXX)
trap 'rm -rf "$D"' EXIT
openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -days 2 \
  -keyout "$D/ca.key" -out "$D/ca.pem" -subj "/CN=credential bench upstream CA" \
  -addext basicConstraints=critical,CA:TRUE -addext keyUsage=critical,keyCertSign,cRLSign \
  2>/dev/null
openssl req -new -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -keyout "$D/server.key" \
  -subj "/CN=api.bench.example" 2>/dev/null |
  openssl x509 -req -CA "$D/ca.pem" -CAkey "$D/ca.key" -CAcreateserial -days 2 \
    -out "$D/server.pem" 2>/dev/null -extfile <(printf '%s\n' \
      "subjectAltName=DNS:api.bench.example,DNS:tunnel.bench.example" basicConstraints=CA:FALSE \
      extendedKeyUsage=serverAuth keyUsage=digitalSignature)
"$BENCH" "$D/ca.pem" "$D/server.pem" "$D/server.key" "${1:-100}" "${2:-2000}" "${3:-100}"
