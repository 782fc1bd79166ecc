#!/bin/sh
# Run by `meson install`: installs the default configuration $1 as $2 (under $DESTDIR), unless a
# file is there already, which stays as it is.
set -eu
dest="${DESTDIR:-}$2"
if [ -e "$dest" ]; then
    echo "Keeping $dest"
    exit 0
fi
mkdir -p "$(dirname "$dest")"
cp "$1" "$dest.tmp"
chmod 0644 "$dest.tmp"
mv "$dest.tmp" "$dest"
echo "Installing $1 to $dest"
