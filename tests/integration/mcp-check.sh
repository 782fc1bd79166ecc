#!/bin/bash
# `vmctl mcp` against a real hostd and agent, through the official MCP TypeScript SDK: installs
# the SDK (mcp/install.sh, npm ci of the pinned lock), then runs mcp-client.mjs. TAP on stdout.
#
#   VMCTL=build/vmctl/vmctl HOSTD_SOCKET=$S/hostd.sock MCP_AGENT=a1 tests/integration/mcp-check.sh
#
# MCP_NEW_AGENT and MCP_FORK_NAME (agents the check creates; the caller removes them) and
# MCP_EXPECT_PROGRESS=1 are passed on; see mcp-client.mjs. Skips without node.
set -euo pipefail
here=$(dirname "$0")
if ! command -v node >/dev/null; then
    echo "1..0 # SKIP node is missing (apt-get install nodejs npm)"
    exit 0
fi
"$here/mcp/install.sh"
exec node "$here/mcp-client.mjs"
