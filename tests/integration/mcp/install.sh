#!/bin/sh
# Installs the MCP SDK that ../mcp-client.mjs uses into node_modules here, as package-lock.json
# pins it (npm ci), unless it is there already. Needs node >= 18 and npm (Debian 12: apt-get
# install nodejs npm) and the npm registry. Prints nothing when all is in place.
set -eu
cd "$(dirname "$0")"
if [ -f node_modules/.package-lock.json ] && [ node_modules/.package-lock.json -nt package-lock.json ]; then
    exit 0
fi
command -v npm >/dev/null || { echo "install.sh: npm is missing (apt-get install npm)" >&2; exit 1; }
npm ci --no-audit --no-fund --loglevel=error >&2
