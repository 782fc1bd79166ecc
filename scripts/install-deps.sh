#!/bin/bash
# Installs every Debian 12 package vmctl/hostd needs to build, test and run agents.
set -euo pipefail

# One package a line in packages.txt; .ci/run installs the same list.
mapfile -t packages < <(grep -v '^#' "$(dirname "$0")/packages.txt" | grep -v '^$')

missing=()
for p in "${packages[@]}"; do
  dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p")
done
if ((${#missing[@]})); then
  echo "installing: ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi
