#!/bin/bash
# Installs every Debian 12 package vmctl/hostd needs to build, test and run agents.
set -euo pipefail

packages=(
  build-essential meson ninja-build pkg-config clang-format
  libglib2.0-dev libjson-glib-dev libvirt-dev libyaml-dev libssh-dev libcurl4-openssl-dev
  libguestfs-dev libcmocka-dev
  libvirt-daemon-system libvirt-clients qemu-system-x86 qemu-utils
  mmdebstrap genisoimage linux-image-amd64 openssh-client openssh-server python3
)

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
