#!/bin/bash
# hostd.service as systemd reads it, in TAP: `systemd-analyze verify` of the unit this build
# made, and the lines the design depends on. verify wants ExecStart's program to exist, so a copy
# names the built hostd; its man page check is off (the pages are not installed here:
# install-check.sh finds them in the install tree). verify exits 0 on unknown keys and bad
# values, so anything it says about the unit fails the check; a broken copy must be caught.
set -u
unit=${HOSTD_UNIT:?} hostd=${HOSTD:?} sbindir=${SBINDIR:?} config=${HOSTD_CONFIG:?}

if ! command -v systemd-analyze >/dev/null; then
    echo "1..0 # SKIP systemd-analyze not installed (Debian package systemd)"
    exit 0
fi
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
# shellcheck source=tap.sh
. "$(dirname "$0")/tap.sh"

# What systemd-analyze says about unit file $1 (a copy running the built hostd), if anything.
complaints() {
    mkdir -p "$tmp/v"
    sed "s|^ExecStart=$sbindir/hostd |ExecStart=$hostd |" "$1" >"$tmp/v/hostd.service"
    local out status
    out=$(systemd-analyze verify --man=no "$tmp/v/hostd.service" 2>&1)
    status=$?
    # Lines about other units come from this host's own unit files, not from ours.
    out=$(grep -E 'hostd\.service' <<<"$out")
    [ "$status" -eq 0 ] && [ -z "$out" ] && return 0
    echo "$out" | sed 's/^/# /'
    [ -n "$out" ] || echo "# systemd-analyze exited $status"
    return 1
}
no_complaints() { complaints "$1"; }
has_complaints() { ! complaints "$1" >/dev/null; }
has_line() { grep -qxF -- "$1" "$unit" || { echo "# missing: $1"; return 1; }; }

check "systemd-analyze verify has nothing to say about hostd.service" no_complaints "$unit"

sed -e 's/^KillMode=process$/KillMode=bogus/' -e '/^\[Service\]$/a Bogus=1' "$unit" >"$tmp/broken"
check "and it complains about a broken copy (bad value, unknown key)" has_complaints "$tmp/broken"

check "ExecStart runs the installed hostd with the installed configuration" \
    has_line "ExecStart=$sbindir/hostd --config $config"
check "Type=notify: hostd says when its socket answers" has_line "Type=notify"
check "KillMode=process: agents outlive hostd" has_line "KillMode=process"
check "Restart=on-failure" has_line "Restart=on-failure"
check "StateDirectory=hostd, hostd's default state directory" has_line "StateDirectory=hostd"
check "installed for multi-user.target" has_line "WantedBy=multi-user.target"
check "no ProtectSystem (virt-aa-helper writes /etc)" \
    bash -c '! grep -q "^ProtectSystem=" "$0"' "$unit"

tap_end
