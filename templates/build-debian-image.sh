#!/bin/bash
# Builds a bootable Debian guest image from a Debian mirror with mmdebstrap, without the
# libguestfs appliance: rootfs -> ext4 (mkfs.ext4 -d) -> qcow2.
#
# usage: build-debian-image.sh OUTDIR SUITE MIRROR [PACKAGE...]
#
#   OUTDIR   receives base.qcow2, vmlinuz and initrd.img (created if missing)
#   SUITE    a Debian suite, e.g. bookworm
#   MIRROR   "host" (the host's apt mirror) or an http(s) URL of a Debian mirror
#   PACKAGE  extra packages baked into the image
#
# stdout carries only "PROGRESS <0-100> <message>" lines; everything else goes to
# $VM_BUILD_LOG (default OUTDIR/build.log). Environment knobs: VM_IMAGE_SIZE (default 4G),
# VM_SECURITY_MIRROR (security mirror when MIRROR is a URL), VM_APT_DIR (where "host" finds
# the apt sources, default /etc/apt). Needs root (mmdebstrap --mode=root).
#
# Everything runs from main(), called on the last line, so bash has parsed the whole file
# before it starts: replacing the script during a build cannot derail the build.

set -euo pipefail

BASE_PACKAGES=systemd-sysv,udev,dbus,kmod,iproute2,netbase,e2fsprogs,sudo,procps
BASE_PACKAGES+=,linux-image-amd64,initramfs-tools,zstd,openssh-server,cloud-init
BASE_PACKAGES+=,qemu-guest-agent
# The redirect that carries programs without proxy settings to the egress proxy
# (docs/EGRESS.md, "Programs without proxy settings").
BASE_PACKAGES+=,nftables,redsocks
VIRTIO_MODULES=(virtio_pci virtio_blk virtio_net virtio_scsi virtio_console virtio_rng)

OUTDIR=""
WORK=""

progress() {
    local percent=$1
    shift
    echo "PROGRESS $percent $*" >&3
    echo "== $(date -u +%H:%M:%S) [$percent%] $*"
}

die() {
    echo "error: $*"
    exit 1
}

# mmdebstrap essential hook, before the kernel and initramfs-tools are installed: $1 is the
# rootfs.
essential() {
    local root=$1

    # modules.d rather than /etc/initramfs-tools/modules, a conffile of a package that is not
    # installed yet; the kernel's postinst then builds the initramfs with them.
    mkdir -p "$root/usr/share/initramfs-tools/modules.d"
    printf '%s\n' "${VIRTIO_MODULES[@]}" \
        >"$root/usr/share/initramfs-tools/modules.d/vmctl-virtio.conf"
}

# mmdebstrap customize hook: $1 is the rootfs, with /proc, /sys and /dev mounted.
customize() {
    local root=$1 initrd contents

    cat >"$root/etc/fstab" <<'FSTAB'
LABEL=root / ext4 defaults,discard,errors=remount-ro 0 1
FSTAB

    mkdir -p "$root/etc/systemd/network"
    cat >"$root/etc/systemd/network/20-wired.network" <<'NETWORK'
[Match]
Name=en*

[Network]
DHCP=yes

# QEMU's restricted network hands out no router: without a route, a connection that names no
# proxy fails before the redirect to redsocks below sees it. What goes to the gateway itself is
# dropped by QEMU.
[Route]
Gateway=10.0.2.2
GatewayOnLink=yes
NETWORK

    mkdir -p "$root/etc/cloud/cloud.cfg.d"
    # locale: without the locales package cloud-init ends in error on any other locale;
    # manage_etc_hosts: sudo needs to resolve the hostname cloud-init sets.
    cat >"$root/etc/cloud/cloud.cfg.d/90-vmctl.cfg" <<'CLOUD'
datasource_list: [ NoCloud, None ]
network: {config: disabled}
locale: C.UTF-8
manage_etc_hosts: true
CLOUD

    # mmdebstrap copied the build host's name and resolver in. The resolver is the agent's
    # egress proxy, over TCP only (QEMU's restrict=on drops the guest's UDP); the seed writes
    # the same file.
    echo debian >"$root/etc/hostname"
    printf '127.0.0.1\tlocalhost\n::1\t\tlocalhost ip6-localhost ip6-loopback\n' \
        >"$root/etc/hosts"
    printf 'nameserver 10.0.2.100\noptions use-vc\n' >"$root/etc/resolv.conf"

    # Outgoing TCP to anything but loopback and QEMU's network goes to redsocks, which opens a
    # CONNECT to the proxy for the address the program asked for: the addresses the proxy's
    # resolver hands out stand for names there. Convenience only; the proxy decides.
    cat >"$root/etc/redsocks.conf" <<'REDSOCKS'
base {
    log_debug = off;
    log_info = off;
    log = "syslog:daemon";
    daemon = on;
    user = redsocks;
    group = redsocks;
    redirector = iptables;
}
redsocks {
    local_ip = 127.0.0.1;
    local_port = 12345;
    ip = 10.0.2.100;
    port = 3128;
    type = http-connect;
}
REDSOCKS
    cat >"$root/etc/nftables.conf" <<'NFT'
#!/usr/sbin/nft -f
flush ruleset
table ip vmctl_egress {
    chain output {
        type nat hook output priority -100; policy accept;
        ip daddr { 127.0.0.0/8, 10.0.2.0/24 } return
        meta l4proto tcp redirect to :12345
    }
}
NFT
    chroot "$root" systemctl enable nftables.service redsocks.service

    # Rebuild the initramfs only if the kernel's postinst did not pick up the virtio modules.
    for initrd in "$root"/boot/initrd.img-*; do
        contents=$(chroot "$root" lsinitramfs "${initrd#"$root"}")
        if ! grep -q '/virtio_blk\.ko$' <<<"$contents"; then
            chroot "$root" update-initramfs -u -k all
            break
        fi
    done

    # The kernel boots from a copy outside the image: keep its modules installed.
    chroot "$root" sh -c 'apt-mark hold linux-image-amd64 $(dpkg-query -W -f "\${Package}\n" \
        "linux-image-[0-9]*")'

    # Every agent must get its own host keys and machine id on first boot.
    rm -f "$root"/etc/ssh/ssh_host_*
    : >"$root/etc/machine-id"

    # pam_motd runs /etc/update-motd.d's scripts at the start of every SSH session, a
    # command's included: three process starts, 0.25-0.37 s of each new connection under TCG.
    # What they print (uname) changes only with a boot, so it is written once a boot instead.
    sed -i -E 's|^(session[[:space:]]+optional[[:space:]]+pam_motd\.so[[:space:]]+motd=/run/motd\.dynamic)[[:space:]]*$|\1 noupdate|' \
        "$root/etc/pam.d/sshd"
    cat >"$root/etc/systemd/system/vmctl-motd.service" <<'UNIT'
[Unit]
Description=The dynamic part of the message of the day, once a boot
Before=ssh.service

[Service]
Type=oneshot
ExecStart=/bin/sh -c 'run-parts --lsbsysinit /etc/update-motd.d > /run/motd.dynamic'

[Install]
WantedBy=multi-user.target
UNIT
    chroot "$root" systemctl enable vmctl-motd.service

    # e2scrub_reap alone burns ~22 s of CPU per boot under TCG; the timers wake idle guests.
    chroot "$root" systemctl mask e2scrub_reap.service e2scrub_all.timer apt-daily.timer \
        apt-daily-upgrade.timer fstrim.timer
    chroot "$root" systemctl enable systemd-networkd.service ssh.service
    # qemu-guest-agent has no [Install] section (udev starts it when its port appears), so
    # this only warns; it stays for images whose unit does have one.
    chroot "$root" systemctl enable qemu-guest-agent.service || true
}

# Prints the URI of the first enabled deb822 stanza (or one-line entry) serving suite $1.
host_mirror_for() {
    local want=$1 found="" f apt_dir=${VM_APT_DIR:-/etc/apt}

    for f in "$apt_dir"/sources.list.d/*.sources; do
        [ -e "$f" ] || continue
        found=$(awk -v want="$want" '
            BEGIN { RS = ""; FS = "\n" }
            {
                uris = ""; suites = ""; types = ""; enabled = "yes"
                for (i = 1; i <= NF; i++) {
                    line = $i
                    if (line ~ /^[ \t]*#/) continue
                    key = tolower(line); sub(/:.*/, "", key)
                    val = line; sub(/^[^:]*:[ \t]*/, "", val)
                    if (key == "uris") uris = val
                    else if (key == "suites") suites = val
                    else if (key == "types") types = val
                    else if (key == "enabled") enabled = tolower(val)
                }
                if (enabled == "no" || types !~ /(^|[ \t])deb([ \t]|$)/) next
                n = split(suites, s, /[ \t]+/)
                for (j = 1; j <= n; j++)
                    if (s[j] == want) { split(uris, u, /[ \t]+/); print u[1]; exit }
            }' "$f")
        [ -z "$found" ] || break
    done
    if [ -z "$found" ]; then
        for f in "$apt_dir"/sources.list "$apt_dir"/sources.list.d/*.list; do
            [ -e "$f" ] || continue
            found=$(awk -v want="$want" '
                $1 == "deb" {
                    i = 2
                    if ($i ~ /^\[/) { while (i <= NF && $i !~ /\]$/) i++; i++ }
                    if ($(i + 1) == want) { print $i; exit }
                }' "$f")
            [ -z "$found" ] || break
        done
    fi
    printf '%s' "$found"
}

# Fills the global array SOURCES with apt lines for suite $1 from mirror $2.
resolve_sources() {
    local suite=$1 mirror=$2 main updates security uri

    if [ "$mirror" = host ]; then
        main=$(host_mirror_for "$suite")
        [ -n "$main" ] || die "no apt source for suite '$suite' on this host"
        updates=$(host_mirror_for "$suite-updates")
        security=$(host_mirror_for "$suite-security")
        : "${updates:=$main}"
    else
        main=$mirror
        updates=$mirror
        security=${VM_SECURITY_MIRROR:-}
        if [ -z "$security" ] && [[ "$main" == */debian || "$main" == */debian/ ]]; then
            security=${main%/}-security
        fi
    fi
    for uri in "$main" "$updates" "$security"; do
        [ -z "$uri" ] || [[ "$uri" =~ ^https?://[^[:space:]]+$ ]] ||
            die "invalid mirror URI '$uri'"
    done

    SOURCES=("deb $main $suite main")
    case "$suite" in
    sid | unstable | experimental) return 0 ;;
    esac
    SOURCES+=("deb $updates $suite-updates main")
    if [ -n "$security" ]; then
        SOURCES+=("deb $security $suite-security main")
    else
        echo "warning: no security mirror known for $main, building without $suite-security"
    fi
}

cleanup() {
    local status=$? mnt

    set +e
    if [ -n "$WORK" ] && [ -d "$WORK" ]; then
        # mmdebstrap unmounts on its own, but not when it is killed: never let rm descend
        # into a live /proc, /sys or /dev bind mount.
        for mnt in $(awk -v work="$WORK/" 'index($2, work) == 1 { print $2 }' /proc/self/mounts |
            sort -r); do
            umount -l "$mnt"
        done
        rm -rf --one-file-system "$WORK"
    fi
    if [ "$status" -ne 0 ] && [ -n "$OUTDIR" ]; then
        rm -f "$OUTDIR/base.qcow2" "$OUTDIR/base.qcow2.tmp" "$OUTDIR/vmlinuz" \
            "$OUTDIR/initrd.img"
        echo "build failed with status $status"
    fi
    exit "$status"
}

main() {
    if [ "${1-}" = --essential ]; then
        essential "$2"
        return 0
    fi
    if [ "${1-}" = --customize ]; then
        customize "$2"
        return 0
    fi
    if [ "$#" -lt 3 ]; then
        echo "usage: $0 OUTDIR SUITE MIRROR [PACKAGE...]" >&2
        exit 2
    fi

    local suite=$2 mirror=$3 image_size=${VM_IMAGE_SIZE:-4G} pkg include dir line
    local self rootfs raw kernel initrd
    OUTDIR=$1
    shift 3

    mkdir -p "$OUTDIR"
    # fd 3 keeps the caller's stdout for progress lines; this script and every tool it runs
    # write the rest to the log.
    exec 3>&1 >>"${VM_BUILD_LOG:-$OUTDIR/build.log}" 2>&1
    trap cleanup EXIT
    trap 'exit 143' TERM
    trap 'exit 130' INT

    # Arguments end up in mmdebstrap options and apt sources lines: plain names only, so
    # nothing can smuggle in an option or another sources entry.
    [[ "$suite" =~ ^[a-z0-9][a-z0-9.-]*$ ]] || die "invalid suite '$suite'"
    [[ "$image_size" =~ ^[0-9]+[KMGT]?$ ]] || die "invalid VM_IMAGE_SIZE '$image_size'"
    include=$BASE_PACKAGES
    for pkg in "$@"; do
        [[ "$pkg" =~ ^[a-z0-9][a-z0-9.+-]+$ ]] || die "invalid package name '$pkg'"
        include+=",$pkg"
    done

    progress 1 "resolving mirrors for $suite"
    resolve_sources "$suite" "$mirror"
    printf 'source: %s\n' "${SOURCES[@]}"

    WORK=$(mktemp -d "$OUTDIR/.work.XXXXXX")
    rootfs=$WORK/rootfs
    raw=$WORK/base.raw

    # The hooks run while /proc, /sys and /dev are mounted in the chroot (update-initramfs
    # needs them); they call this script again in a mode of their own.
    self=$(readlink -f "$0")
    local excludes=(
        --dpkgopt='path-exclude=/usr/share/man/*'
        --dpkgopt='path-exclude=/usr/share/info/*'
        --dpkgopt='path-exclude=/usr/share/doc/*'
        --dpkgopt='path-include=/usr/share/doc/*/copyright'
        --dpkgopt='path-exclude=/usr/share/locale/*'
        --dpkgopt='path-include=/usr/share/locale/locale.alias'
    )
    for dir in /lib /usr/lib; do
        excludes+=(
            --dpkgopt="path-exclude=$dir/modules/*/kernel/drivers/gpu/*"
            --dpkgopt="path-exclude=$dir/modules/*/kernel/drivers/media/*"
            --dpkgopt="path-exclude=$dir/modules/*/kernel/drivers/net/wireless/*"
            --dpkgopt="path-exclude=$dir/modules/*/kernel/sound/*"
        )
    done

    progress 5 "bootstrapping $suite with mmdebstrap"
    mmdebstrap --mode=root --variant=apt \
        --aptopt='APT::Install-Recommends "false"' \
        --include="$include" \
        "${excludes[@]}" \
        --essential-hook="$(printf 'bash %q --essential "$1"' "$self")" \
        --customize-hook="$(printf 'bash %q --customize "$1"' "$self")" \
        "$suite" "$rootfs" "${SOURCES[@]}" 2>&1 |
        while IFS= read -r line; do
            printf '%s\n' "$line"
            case "$line" in
            "I: running apt-get update"*) progress 8 "updating package lists" ;;
            "I: downloading packages"*) progress 12 "downloading packages" ;;
            "I: extracting archives"*) progress 25 "extracting essential packages" ;;
            "I: installing essential packages"*) progress 30 "installing essential packages" ;;
            "I: installing remaining packages"*) progress 40 "installing packages" ;;
            "I: running --customize-hook"*) progress 75 "customizing the image" ;;
            "I: cleaning package lists"*) progress 80 "cleaning up" ;;
            esac
        done

    progress 82 "copying kernel and initramfs"
    kernel=$(find "$rootfs/boot" -maxdepth 1 -name 'vmlinuz-*' | sort -V | tail -n 1)
    [ -n "$kernel" ] || die "no kernel in the image"
    initrd=$rootfs/boot/initrd.img-${kernel##*/vmlinuz-}
    [ -f "$initrd" ] || die "no initramfs for ${kernel##*/}"
    cp --dereference "$kernel" "$OUTDIR/vmlinuz"
    cp --dereference "$initrd" "$OUTDIR/initrd.img"
    echo "kernel: ${kernel##*/}"
    du -sh --one-file-system "$rootfs"

    progress 85 "making the ext4 filesystem"
    truncate -s "$image_size" "$raw"
    mkfs.ext4 -q -F -L root -d "$rootfs" "$raw"

    progress 93 "converting to qcow2"
    qemu-img convert -f raw -O qcow2 "$raw" "$OUTDIR/base.qcow2.tmp"
    mv "$OUTDIR/base.qcow2.tmp" "$OUTDIR/base.qcow2"
    # QEMU runs as another user under libvirt: it must be able to read all three.
    chmod 0644 "$OUTDIR/base.qcow2" "$OUTDIR/vmlinuz" "$OUTDIR/initrd.img"
    qemu-img info "$OUTDIR/base.qcow2"

    progress 100 "image ready"
}

main "$@"
exit
