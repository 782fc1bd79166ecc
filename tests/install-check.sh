#!/bin/bash
# What `meson install` puts in place, in TAP: `meson install --destdir` of this build into a
# temporary tree, then the programs, the egress helper, the templates, the systemd unit, the
# default configuration (kept on a second install once edited), the man pages and the bash, zsh
# and fish completions, each where this build's options say, and nothing else.
set -u
build=${VM_BUILD_DIR:?} source=${VM_SOURCE_DIR:?}
bindir=${BINDIR:?} sbindir=${SBINDIR:?} libexecdir=${LIBEXECDIR:?} templates=${TEMPLATES_DIR:?}
config=${HOSTD_CONFIG:?} unitdir=${UNIT_DIR:?} completiondir=${COMPLETION_DIR:?}
zshdir=${ZSH_COMPLETION_DIR:?} fishdir=${FISH_COMPLETION_DIR:?}
mandir=${MANDIR:?} man=${MAN_PAGES:?}

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
dest=$tmp/dest
# shellcheck source=tap.sh
. "$(dirname "$0")/tap.sh"
executable() {
    [ -f "$dest$1" ] && [ -x "$dest$1" ] || { echo "# not an executable: $1"; return 1; }
}
same() { cmp -s "$1" "$dest$2" || { echo "# $2 differs from $1, or is missing"; return 1; }; }
install_tree() {
    local out
    out=$(meson install -C "$build" --destdir "$dest" --no-rebuild 2>&1) && return 0
    echo "$out" | tail -20 | sed 's/^/# /'
    return 1
}

check "meson install --destdir" install_tree
# Nothing below can be checked without the install tree.
[ "$FAILED" -eq 0 ] || { tap_end; exit 1; }

check "hostd in sbindir" executable "$sbindir/hostd"
check "vmctl in bindir" executable "$bindir/vmctl"
check "installed vmctl runs and names its protocol" grep -q "^vmctl .* (protocol [0-9]*)$" <("$dest$bindir/vmctl" --version)
check "egress helper in libexecdir" executable "$libexecdir/vm-egress-connect"
check "egress worker in libexecdir" executable "$libexecdir/vm-egress-worker"
check "guestfs helper in libexecdir" executable "$libexecdir/vm-guestfs-helper"
check "SSH worker in libexecdir" executable "$libexecdir/vm-ssh-worker"
check "in-guest API worker in libexecdir" executable "$libexecdir/vm-guest-api-worker"

# The installed hostd names only installed paths, though the source and build trees it was made
# from are still here; the same binary run from the build tree uses them. --print-paths, with
# none of the variables that point elsewhere set.
paths_of() {
    env -u VM_TEMPLATES_DIR -u VM_EGRESS_CONNECT -u VM_GUESTFS_HELPER -u VM_SSH_WORKER \
        -u VM_GUEST_API_WORKER -u VM_USE_BUILD_TREE "$1" \
        --print-paths
}
installed_paths() {
    local out
    out=$(paths_of "$dest$sbindir/hostd") || return 1
    grep -qxF "build-tree no" <<<"$out" && grep -qxF "templates $templates" <<<"$out" &&
        grep "^image-script" <<<"$out" | grep -qF "$templates" &&
        grep -qxF "egress-helper $libexecdir/vm-egress-connect" <<<"$out" &&
        grep -qxF "guestfs-helper $libexecdir/vm-guestfs-helper" <<<"$out" &&
        grep -qxF "ssh-worker $libexecdir/vm-ssh-worker" <<<"$out" &&
        grep -qxF "guest-api-worker $libexecdir/vm-guest-api-worker" <<<"$out" &&
        ! grep -qF -e "$source" -e "$build" <<<"$out" && return 0
    echo "$out" | sed 's/^/# /'
    return 1
}
check "installed hostd uses only installed paths" installed_paths
build_paths() {
    local out
    out=$(paths_of "$build/hostd/hostd") || return 1
    grep -qxF "build-tree yes" <<<"$out" && grep -qxF "templates $source/templates" <<<"$out" &&
        grep -qxF "egress-helper $build/egress/vm-egress-connect" <<<"$out" &&
        grep -qxF "guestfs-helper $build/checkpoint/vm-guestfs-helper" <<<"$out" &&
        grep -qxF "ssh-worker $build/hostd/vm-ssh-worker" <<<"$out" &&
        grep -qxF "guest-api-worker $build/hostd/vm-guest-api-worker" <<<"$out" && return 0
    echo "$out" | sed 's/^/# /'
    return 1
}
check "hostd run from the build tree uses its trees" build_paths

expected=("$sbindir/hostd" "$bindir/vmctl" "$libexecdir/vm-egress-connect"
    "$libexecdir/vm-egress-worker" "$libexecdir/vm-guestfs-helper" "$libexecdir/vm-ssh-worker"
    "$libexecdir/vm-guest-api-worker")
for f in "$source"/templates/*.yaml "$source/templates/build-debian-image.sh"; do
    check "template file $(basename "$f")" same "$f" "$templates/$(basename "$f")"
    expected+=("$templates/$(basename "$f")")
done

unit=$unitdir/hostd.service
expected+=("$unit")
check "hostd.service in $unitdir" same "$build/dist/hostd.service" "$unit"
exec_line() {
    grep -qxF "ExecStart=$sbindir/hostd --config $config" "$dest$unit" &&
        [ -x "$dest$sbindir/hostd" ] && [ -f "$dest$config" ]
}
check "the unit runs the installed hostd with the installed configuration" exec_line

expected+=("$config")
check "default configuration at $config" same "$build/dist/hostd.conf" "$config"
echo "# edited by the administrator" >>"$dest$config"
kept() {
    install_tree && [ "$(tail -n 1 "$dest$config")" = "# edited by the administrator" ]
}
check "a second install keeps an edited configuration" kept

completion=$completiondir/vmctl
expected+=("$completion")
check "bash completion at $completion" same "$source/dist/vmctl.bash-completion" "$completion"
registers() {
    [ "$(bash -c 'source "$0" && complete -p vmctl' "$dest$completion")" = \
        "complete -F _vmctl vmctl" ]
}
check "sourcing it completes vmctl" registers

expected+=("$zshdir/_vmctl" "$fishdir/vmctl.fish")
check "zsh completion at $zshdir/_vmctl" same "$source/dist/_vmctl" "$zshdir/_vmctl"
check "fish completion at $fishdir/vmctl.fish" same "$source/dist/vmctl.fish" "$fishdir/vmctl.fish"
if command -v zsh >/dev/null; then
    # compinit takes it for vmctl's completion from the installed directory.
    zsh_registers() {
        [ "$(zsh -f -c 'fpath=($0 $fpath); autoload -Uz compinit; compinit -u -D;
            print -r -- $_comps[vmctl]' "$dest$zshdir")" = _vmctl ]
    }
    check "compinit finds it for vmctl" zsh_registers
else
    skip "compinit finds it for vmctl" "zsh is not installed"
fi
if command -v fish >/dev/null; then
    fish_registers() {
        mkdir -p "$tmp/fish-config" "$tmp/fish-data"
        XDG_CONFIG_HOME=$tmp/fish-config XDG_DATA_HOME=$tmp/fish-data fish -N -c \
            'source $argv[1]; complete -c vmctl' "$dest$fishdir/vmctl.fish" |
            grep -qF "__vmctl_complete"
    }
    check "sourcing it in fish completes vmctl" fish_registers
else
    skip "sourcing it in fish completes vmctl" "fish is not installed"
fi

# The commands vmctl --help lists, one a line ("template list" as two words).
commands_of='/^Commands:/ { c = 1; next }
    c && !/^  [a-z]/ { exit }
    c { sub(/^  /, ""); sub(/  .*/, ""); print }'

if [ "$man" = enabled ]; then
    vmctl1=$dest$mandir/man1/vmctl.1 hostd8=$dest$mandir/man8/hostd.8
    expected+=("$mandir/man1/vmctl.1" "$mandir/man8/hostd.8")
    check "vmctl(1) is a man page" grep -q '^\.TH "vmctl" "1"' "$vmctl1"
    check "hostd(8) is a man page" grep -q '^\.TH "hostd" "8"' "$hostd8"
    # scdoc writes "hostd.conf" as "hostd.\&conf".
    names_paths() {
        local text
        text=$(sed 's/\\&//g' "$hostd8")
        ! grep -n "@[A-Z_]*@" <<<"$text" && grep -qF "$config" <<<"$text" &&
            grep -qF "$unitdir" <<<"$text" && grep -qF "$templates" <<<"$text"
    }
    check "hostd(8) names this installation's paths" names_paths
    documented() {
        local page section
        for page in $(sed -n 's/^Documentation=//p' "$dest$unit"); do
            section=${page#*(}
            section=${section%)}
            page=${page#man:}
            page=${page%(*}
            [ -f "$dest$mandir/man$section/$page.$section" ] || {
                echo "# the unit names $page($section), which is not installed"
                return 1
            }
        done
    }
    check "the man pages the unit names are installed" documented
    every_command() {
        local missing=0 command
        while read -r command; do
            [ -n "$command" ] || continue
            grep -qE "^\.SS \"?vmctl $command( |\"|$)" "$vmctl1" || {
                echo "# vmctl(1) has no section for '$command'"
                missing=1
            }
        done < <("$dest$bindir/vmctl" --help | awk "$commands_of")
        [ "$missing" -eq 0 ]
    }
    check "vmctl(1) has a section for every command of vmctl --help" every_command
    if command -v groff >/dev/null; then
        renders() {
            local out
            out=$(groff -man -Tutf8 -ww -z "$1" 2>&1)
            [ -z "$out" ] || { echo "$out" | sed 's/^/# /'; return 1; }
        }
        check "vmctl(1) renders without a warning" renders "$vmctl1"
        check "hostd(8) renders without a warning" renders "$hostd8"
    else
        skip "the man pages render" "groff not installed"
    fi
else
    skip "man pages" "built with -Dman=disabled"
fi

nothing_else() {
    local got want
    got=$(cd "$dest" && find . -type f -o -type l | sed 's|^\.||' | sort)
    want=$(printf '%s\n' "${expected[@]}" | sort)
    [ "$got" = "$want" ] && return 0
    diff <(echo "$want") <(echo "$got") | sed 's/^/# /'
    return 1
}
check "nothing else is installed" nothing_else

tap_end
