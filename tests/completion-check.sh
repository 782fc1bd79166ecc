#!/bin/bash
# vmctl's bash completion (dist/vmctl.bash-completion), in TAP: the script is sourced and its
# function driven as bash does (COMP_WORDS, COMP_CWORD, then _vmctl; it fills COMPREPLY with
# compgen). A fake vmctl first on PATH answers what completion asks hostd (list, checkpoints,
# template list, with --json) with canned replies in vmctl's own format, and hands everything
# else (--help of vmctl and of its commands) to the built vmctl, so commands and options are the
# real ones.
set -u
vmctl=${VMCTL:?} source=${VM_SOURCE_DIR:?}

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
mkdir "$tmp/bin"
cat >"$tmp/bin/vmctl" <<EOF
#!/bin/bash
echo "\$*" >>"$tmp/calls"
args=" \$* "
if [ -n "\${FAKE_HOSTD_DOWN:-}" ] && [[ \$args == *" --json "* ]]; then
    printf '{\n  "error" : {\n    "code" : "not-running",\n    "message" : "x"\n  }\n}\n'
    echo "vmctl: hostd is not running" >&2
    exit 12
fi
case \$args in
*" template list --json "*) cat "$tmp/templates.json" ;;
*" secret list --json "*) cat "$tmp/secrets.json" ;;
*" hosts --json "*) cat "$tmp/hosts.json" ;;
*" egress presets --json "*) cat "$tmp/presets.json" ;;
*" list --json "*) cat "$tmp/agents.json" ;;
*" checkpoints a1 --json "*) cat "$tmp/checkpoints-a1.json" ;;
*" checkpoints web-2 --json "*) cat "$tmp/checkpoints-web-2.json" ;;
*" --json "*) echo "fake vmctl: unexpected \$*" >&2; exit 1 ;;
*) exec "$vmctl" "\$@" ;;
esac
EOF
chmod +x "$tmp/bin/vmctl"
cat >"$tmp/agents.json" <<'EOF'
[
  {
    "name" : "a1",
    "state" : "running",
    "template" : "debian-12",
    "user" : "agent"
  },
  {
    "name" : "web-2",
    "state" : "saved",
    "template" : "ubuntu-24.04",
    "forked_from" : "a1",
    "fork_checkpoint" : "c2"
  }
]
EOF
# A label that spells a key must not be taken for one.
cat >"$tmp/checkpoints-a1.json" <<'EOF'
[
  {
    "id" : "c1",
    "kind" : "disk",
    "label" : "before \"id\" : \"c7\""
  },
  {
    "id" : "c2",
    "kind" : "memory"
  }
]
EOF
printf '[\n  {\n    "id" : "c9"\n  }\n]\n' >"$tmp/checkpoints-web-2.json"
# A host's address is no host id.
printf '[\n  {\n    "id" : "h1",\n    "address" : "ssh://root@h9"\n  },\n  {\n    "id" : "h2"\n  }\n]\n' \
    >"$tmp/hosts.json"
# A secret's agents and hosts are no secret names.
cat >"$tmp/secrets.json" <<'EOF'
[
  {
    "name" : "example-api",
    "hosts" : [
      "api.example.com"
    ],
    "env" : "EXAMPLE_API",
    "agents" : [
      "a1"
    ]
  },
  {
    "name" : "gh",
    "hosts" : [],
    "env" : "GH",
    "agents" : []
  }
]
EOF
# A preset's rules and source are no preset names.
cat >"$tmp/presets.json" <<'EOF'
[
  {
    "name" : "@debian",
    "source" : "built-in",
    "rules" : [
      "deb.debian.org"
    ]
  },
  {
    "name" : "@pypi",
    "source" : "/etc/hostd/presets.d/pypi.conf",
    "rules" : [
      "pypi.org",
      "files.pythonhosted.org"
    ]
  },
  {
    "name" : "@pypi-mirror",
    "source" : "/etc/hostd/presets.d/pypi-mirror.conf",
    "rules" : [
      "pypi.example.com"
    ]
  }
]
EOF
printf '[\n  {\n    "name" : "debian-12"\n  },\n  {\n    "name" : "ubuntu-24.04"\n  }\n]\n' \
    >"$tmp/templates.json"

export PATH="$tmp/bin:$PATH"
# shellcheck source=../dist/vmctl.bash-completion
source "$source/dist/vmctl.bash-completion"

# shellcheck source=tap.sh
. "$(dirname "$0")/tap.sh"
# Completes the words given, the last being the one under the cursor, and prints the candidates
# sorted, one space apart.
comp() {
    COMP_WORDS=("$@")
    COMP_CWORD=$(($# - 1))
    COMP_LINE="$*"
    COMP_POINT=${#COMP_LINE}
    COMPREPLY=()
    _vmctl
    printf '%s\n' "${COMPREPLY[@]}" | sed '/^$/d' | sort | tr '\n' ' ' | sed 's/ $//'
}
# expect WANT WORD...: completing WORD... offers exactly WANT.
expect() {
    local want=$1 got
    shift
    got=$(comp "$@" 2>"$tmp/stderr")
    if [ "$got" = "$want" ] && [ ! -s "$tmp/stderr" ]; then
        ok "'$*' offers '$want'"
    else
        not_ok "'$*' offers '$want'"
        echo "# got: '$got'"
        sed 's/^/# stderr: /' "$tmp/stderr"
    fi
}
# status DESCRIPTION STATUS: ok when STATUS is 0.
status() { if [ "$2" -eq 0 ]; then ok "$1"; else not_ok "$1"; fi; }

# The commands of the built vmctl, as its --help lists them ("template list" as two words).
commands_of='/^Commands:/ { c = 1; next }
    c && !/^  [a-z]/ { exit }
    c { sub(/^  /, ""); sub(/  .*/, ""); print }'
mapfile -t commands < <("$vmctl" --help | awk "$commands_of")
[ "${#commands[@]}" -gt 20 ]
status "vmctl --help lists the commands (${#commands[@]})" $?
first_words=$(printf '%s\n' "${commands[@]}" | cut -d' ' -f1 | sort -u | tr '\n' ' ' | sed 's/ $//')

# ---- commands and global options
expect "$(echo "$first_words help" | tr ' ' '\n' | sort | tr '\n' ' ' | sed 's/ $//')" vmctl ""
expect "start stats stop stop-host-agents" vmctl st
expect "checkpoint checkpoints" vmctl checkpoint
expect "--help --host --json --quiet --socket --version" vmctl --
expect "$first_words" vmctl help ""
expect "build list" vmctl help template ""
expect "build list" vmctl template ""

# ---- every command's options are those its --help lists
for command in "${commands[@]}"; do
    read -r -a words <<<"$command"
    want=$("$vmctl" "${words[@]}" --help | sed -n '/^Options:/,$p' |
        grep -oE '^ +(-[a-z], )?--[a-z-]+' | grep -oE -- '-[a-z]|--[a-z-]+' |
        sort | tr '\n' ' ' | sed 's/ $//')
    case $want in
    *--help*--socket* | *--socket*--help*) ;;
    *) want="(no options found in vmctl $command --help)" ;;
    esac
    expect "$want" vmctl "${words[@]}" -
done
expect "--force" vmctl stop --f
expect "--force" vmctl stop a1 --f

# ---- what the first argument of each command is: agents, templates or nothing. A command
# missing here fails, so a new one gets its completion decided.
agents="a1 web-2"
secrets="example-api gh"
hosts="h1 h2"
declare -A first=(
    [new]="" [list]="" [hosts]="" [drain]=$hosts [undrain]=$hosts [move]=$agents [replicate]=$agents [recover]=$agents [info]=$agents [exec]=$agents [ssh]=$agents [ssh-config]=$agents
    [start]=$agents [stop]=$agents [rm]=$agents [suspend]=$agents [resume]=$agents
    [keep-awake]=$agents [idle]=$agents ["checkpoint rm"]=$agents
    [checkpoint]="a1 rm web-2" [checkpoints]=$agents [autocheckpoint]=$agents [restore]=$agents
    [diff]=$agents [fork]=$agents [egress]="a1 presets web-2" ["egress presets"]=""
    [egress-log]=$agents [events]=$agents
    [forward]=$agents [set]=$agents [logs]=$agents [stats]=$agents [top]=$agents
    ["template list"]=""
    ["template build"]="debian-12 ubuntu-24.04" [autorestart]=$agents [stop-host-agents]=""
    [bridge]="" [mcp]="" [authorize]=$agents [cp]="a1: web-2:"
    ["secret create"]="" ["secret list"]="" ["secret set"]=$secrets ["secret rm"]=$secrets
    ["secret grant"]=$agents ["secret revoke"]=$agents
)
# cp's arguments are local files too: completed where there are none.
mkdir "$tmp/nothing"
cd "$tmp/nothing" || exit 1
for command in "${commands[@]}"; do
    if [ -z "${first[$command]+set}" ]; then
        status "the test knows what 'vmctl $command' takes first" 1
        continue
    fi
    read -r -a words <<<"$command"
    expect "${first[$command]}" vmctl "${words[@]}" ""
done
expect "a1:" vmctl cp a
expect "a1: web-2:" vmctl cp a1 : /tmp/x ""
expect "" vmctl cp a1 : /tm
expect "a1: web-2:" vmctl cp --quiet ""
cd - >/dev/null || exit 1
touch "$tmp/cp-local"
expect "$tmp/cp-local" vmctl cp "$tmp/cp-l"
expect "$tmp/cp-local" vmctl mcp --copy-dir "$tmp/cp-l"
expect "a1" vmctl info a
# Commands that take several agents: each argument is one.
expect "$agents" vmctl rm a1 ""
expect "web-2" vmctl stop --force a1 w
expect "$agents" vmctl resume a1 web-2 ""
expect "" vmctl info a1 ""
expect "web-2" vmctl ssh-config w

# ---- secrets: the subcommands, secret names after an agent, --secret, --from-file
expect "create grant list revoke rm set" vmctl secret ""
expect "$secrets" vmctl secret grant a1 ""
expect "gh" vmctl secret revoke web-2 g
# ---- hosts of the fleet: drain's argument, new's --on
expect "h1 h2" vmctl drain ""
expect "h2" vmctl new a9 --on h2
expect "h1 h2" vmctl move a1 --to ""
expect "h1 h2" vmctl recover a1 --to ""
expect "" vmctl secret grant a1 gh ""
expect "$secrets" vmctl new x --secret ""
expect "$secrets" vmctl new x --secret a1 --secret ""
expect "--grants" vmctl fork a1 b1 --gr
touch "$tmp/value.txt"
expect "$tmp/value.txt" vmctl secret set gh --from-file "$tmp/val"

# ---- egress presets after --allow @, --deny @, --remove @ and new's --egress @; '@' breaks
# words by default, so bash gives "@" and the rest as two words
expect "debian pypi pypi-mirror" vmctl egress a1 --allow @ ""
expect "pypi pypi-mirror" vmctl egress a1 --deny @ py
expect "pypi-mirror" vmctl egress a1 --remove @ pypi-
expect "debian pypi pypi-mirror" vmctl new x --egress @ ""
expect "" vmctl egress a1 --allow ""
expect "" vmctl egress a1 --allow py
expect "" vmctl egress presets ""
COMP_WORDBREAKS=${COMP_WORDBREAKS//@/}
expect "@pypi @pypi-mirror" vmctl egress a1 --allow @p
expect "@debian" vmctl new x --egress=@d
COMP_WORDBREAKS+="@"

# ---- checkpoints: of the agent named before them
expect "c1 c2" vmctl restore a1 ""
expect "c9" vmctl restore web-2 ""
expect "c1 c2" vmctl checkpoint rm a1 ""
expect "c1 c2" vmctl diff a1 ""
expect "c1 c2" vmctl diff a1 c1 ""
expect "c2" vmctl diff a1 c1 c2
expect "" vmctl diff a1 c1 c2 ""
expect "c1 c2" vmctl fork a1 --from ""
expect "" vmctl checkpoints a1 ""
expect "always never on-crash" vmctl autorestart a1 ""
expect "on-crash" vmctl autorestart a1 on

# ---- options and their values are not arguments
expect "c1 c2" vmctl restore --path /etc a1 ""
expect "c1 c2" vmctl restore --path=/etc a1 ""
expect "c1 c2" vmctl restore --path = /etc a1 ""
expect "$agents" vmctl stop --timeout 5m ""
expect "$agents" vmctl set --disk +5G ""
expect "--cpus --disk --help --host --json --memory --quiet --socket" vmctl set a1 --
expect "$agents" vmctl egress-log -n 5 ""
expect "$agents" vmctl events --since 10m ""
expect "$agents" vmctl logs -n 20 ""
expect "" vmctl logs a1 ""
expect "$agents" vmctl stats a1 ""
expect "$agents" vmctl top --interval 5 ""
expect "" vmctl events --since ""
expect "" vmctl events a1 ""
expect "$agents" vmctl forward --list ""
expect "$agents" vmctl forward --rm ""
expect "" vmctl forward a1 ""
expect "" vmctl forward --host-port ""
expect "$agents" vmctl --json -q info ""
expect "" vmctl stop --timeout ""
expect "" vmctl fork a1 ""

# ---- option values: templates, files; '=' as a word break (bash's default) or not
expect "debian-12 ubuntu-24.04" vmctl new x --template ""
expect "$agents" vmctl mcp --agent ""
expect "web-2" vmctl mcp --read-only --agent a1 --agent w
expect "debian-12" vmctl new x --template deb
expect "debian-12" vmctl new x --template = deb
expect "debian-12 ubuntu-24.04" vmctl new x --template =
COMP_WORDBREAKS=${COMP_WORDBREAKS//=/}
expect "--template=debian-12" vmctl new x --template=deb
COMP_WORDBREAKS+="="
touch "$tmp/user-data.yaml"
expect "$tmp/user-data.yaml" vmctl new x --user-data "$tmp/user-"
expect "$tmp/user-data.yaml" vmctl --socket "$tmp/user-"
expect "$tmp/user-data.yaml" vmctl authorize a1 "$tmp/user-"
expect "" vmctl authorize a1 "$tmp/user-data.yaml" ""
expect "$tmp/user-data.yaml" vmctl new x --ssh-key "$tmp/user-"
expect "$tmp/user-data.yaml" vmctl ssh-config a1 --identity "$tmp/user-"
expect "a1 web-2" vmctl authorize --list ""
expect "" vmctl authorize a1 --rm ""

# ---- what a command runs, a new name: nothing
expect "" vmctl new ""
expect "" vmctl exec a1 ""
expect "" vmctl exec a1 -
expect "" vmctl exec -t a1 ""
expect "$agents" vmctl exec -t -e K=V ""
expect "" vmctl ssh a1 -- ""

# ---- hostd: asked through the same --socket or --host; not answering gives nothing, quietly
: >"$tmp/calls"
expect "$agents" vmctl --socket /run/other.sock info ""
grep -qxF -- "--socket /run/other.sock list --json" "$tmp/calls"
status "hostd is asked through the --socket given" $?
: >"$tmp/calls"
expect "c1 c2" vmctl restore --socket /run/third.sock a1 ""
grep -qxF -- "--socket /run/third.sock checkpoints a1 --json" "$tmp/calls"
status "and through a --socket given after the command" $?
: >"$tmp/calls"
expect "$agents" vmctl --host ssh://box info ""
grep -qxF -- "--host ssh://box list --json" "$tmp/calls"
status "hostd is asked through the --host given" $?
: >"$tmp/calls"
expect "c1 c2" vmctl restore --host=ssh://box a1 ""
grep -qxF -- "--host=ssh://box checkpoints a1 --json" "$tmp/calls"
status "and through a --host given after the command" $?
expect "ssh://" vmctl --host ""
FAKE_HOSTD_DOWN=1 expect "" vmctl info ""
export FAKE_HOSTD_DOWN=1
expect "" vmctl restore a1 ""
unset FAKE_HOSTD_DOWN

# ---- safe under `set -u`, as some users' shells run
(
    set -u
    comp vmctl "" >/dev/null && comp vmctl diff a1 c1 c2 "" >/dev/null &&
        comp vmctl new x --template = >/dev/null && comp vmctl exec a1 -- "" >/dev/null
) 2>"$tmp/stderr"
status=$?
[ "$status" -eq 0 ] && [ ! -s "$tmp/stderr" ]
status "completion works under set -u" $?
sed 's/^/# /' "$tmp/stderr"

# ---- zsh and fish: the same commands, options and hostd's names, from the same vmctl. fish is
# run for real (`complete -C LINE` prints what fish would offer); zsh's _vmctl is called with
# words and CURRENT as compsys sets them, with compadd, _describe, _files and compset stood in
# for (a real compsys needs a terminal).
cat >"$tmp/zsh-driver.zsh" <<'ZSH'
fpath=($1 $fpath)
shift
typeset -ga offered
typeset -g current
compset() { [[ $1 == -P && $current == *=* ]] && current=${current#*=}; return 0 }
compadd() {
    while (( $# )) && [[ $1 != -- ]]; do shift; done
    shift
    offered+=("$@")
}
_describe() { offered+=("${(@)${(@P)4}%%:*}") }
_files() { offered+=($current*(N)) }
autoload -Uz _vmctl
words=("$@")
CURRENT=$#
current=${words[CURRENT]}
_vmctl
for w in "${offered[@]}"; do
    [[ $w == ${current}* ]] && print -r -- "$w"
done
ZSH
mkdir "$tmp/config" "$tmp/data"
# shell_comp SHELL WORD...: what SHELL offers for WORD..., sorted, one space apart.
shell_comp() {
    local shell=$1
    shift
    case $shell in
    zsh) zsh -f "$tmp/zsh-driver.zsh" "$source/dist" "$@" ;;
    fish)
        # shellcheck disable=SC2016 # $argv is fish's
        XDG_CONFIG_HOME=$tmp/config XDG_DATA_HOME=$tmp/data fish -N -c \
            'source $argv[1]; complete -C $argv[2]' "$source/dist/vmctl.fish" "$*" | cut -f 1
        ;;
    esac | sort -u | tr '\n' ' ' | sed 's/ $//'
}
# shell_expect SHELL WANT WORD...: completing WORD... in SHELL offers exactly WANT.
shell_expect() {
    local shell=$1 want=$2 got
    shift 2
    got=$(shell_comp "$shell" "$@" 2>"$tmp/stderr")
    if [ "$got" = "$want" ] && [ ! -s "$tmp/stderr" ]; then
        ok "$shell: '$*' offers '$want'"
    else
        not_ok "$shell: '$*' offers '$want'"
        echo "# got: '$got'"
        sed 's/^/# stderr: /' "$tmp/stderr"
    fi
}
for shell in zsh fish; do
    if ! command -v "$shell" >/dev/null; then
        skip "$shell completion" "$shell is not installed"
        continue
    fi
    if [ "$shell" = zsh ]; then
        zsh -n "$source/dist/_vmctl"
    else
        fish -n "$source/dist/vmctl.fish"
    fi
    status "$shell: the completion parses" $?
    # Every command, and every option of each, as vmctl --help lists them.
    got=" $(shell_comp "$shell" vmctl "") "
    missing=
    for word in $first_words help; do
        [[ $got == *" $word "* ]] || missing+=" $word"
    done
    [ -z "$missing" ]
    status "$shell: 'vmctl ' offers every command${missing:+ (missing:$missing)}" $?
    for command in "${commands[@]}"; do
        read -r -a words <<<"$command"
        want=$("$vmctl" "${words[@]}" --help | sed -n '/^Options:/,$p' |
            grep -oE '^ +(-[a-z], )?--[a-z-]+' | grep -oE -- '-[a-z]|--[a-z-]+' |
            sort | tr '\n' ' ' | sed 's/ $//')
        shell_expect "$shell" "$want" vmctl "${words[@]}" -
    done
    shell_expect "$shell" "start stats stop stop-host-agents" vmctl st
    shell_expect "$shell" "build list" vmctl template ""
    shell_expect "$shell" "a1 rm web-2" vmctl checkpoint ""
    shell_expect "$shell" "build list" vmctl help template ""
    shell_expect "$shell" "$agents" vmctl rm a1 ""
    shell_expect "$shell" "web-2" vmctl stop --force a1 w
    shell_expect "$shell" "" vmctl info a1 ""
    shell_expect "$shell" "c1 c2" vmctl restore a1 ""
    shell_expect "$shell" "c9" vmctl diff web-2 c9 ""
    shell_expect "$shell" "c1 c2" vmctl fork a1 --from ""
    shell_expect "$shell" "on-crash" vmctl autorestart a1 on
    shell_expect "$shell" "$secrets" vmctl secret grant a1 ""
    shell_expect "$shell" "debian-12 ubuntu-24.04" vmctl new x --template ""
    shell_expect "$shell" "$agents" vmctl exec -t -e K=V ""
    shell_expect "$shell" "" vmctl exec a1 ""
    shell_expect "$shell" "$tmp/user-data.yaml" vmctl new x --user-data "$tmp/user-"
    # fish replaces the whole word; zsh only what follows '='.
    if [ "$shell" = fish ]; then
        shell_expect "$shell" "--template=debian-12" vmctl new x --template=deb
    else
        shell_expect "$shell" "debian-12" vmctl new x --template=deb
    fi
    : >"$tmp/calls"
    shell_expect "$shell" "$agents" vmctl --socket /run/other.sock info ""
    grep -qxF -- "--socket /run/other.sock list --json" "$tmp/calls"
    status "$shell: hostd is asked through the --socket given" $?
    FAKE_HOSTD_DOWN=1 shell_expect "$shell" "" vmctl info ""
done

tap_end
