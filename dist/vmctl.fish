# fish completion for vmctl(1): commands, options, agent names, checkpoint ids, template names,
# secret names. Installed in fish's vendor_completions.d, where fish finds it by itself.
#
# As the bash and zsh ones, it asks the vmctl being completed: its commands and what their
# arguments are (`vmctl __complete`), each command's options (`vmctl COMMAND --help`), and
# through the same --socket or --host, hostd's agents, checkpoints, templates and secrets
# (`vmctl list --json` ...); when hostd does not answer they complete to nothing.

# The string values of key $argv[1] in what the command $argv[2..] prints with --json.
function __vmctl_ask
    $argv[2..-1] --json 2>/dev/null </dev/null |
        string match -r -a -g '"'$argv[1]'" *: *"([A-Za-z0-9._-]+)"'
end

# The options of command $argv[2] ("stop", "checkpoint rm") of vmctl $argv[1]: "--name\tsummary",
# and "--name=" for one that takes a value.
function __vmctl_options
    set -l command (string split ' ' -- $argv[2])
    set -l inside 0
    $argv[1] $command --help 2>/dev/null | while read -l line
        if test "$line" = "Options:"
            set inside 1
        else if test $inside = 1; and string match -q -r '^ +-' -- $line
            set -l spec (string replace -r '^ +' '' -- $line | string replace -r '  .*' '')
            set -l summary (string replace -r '^ +\S.*?  +' '' -- $line)
            set -l value ''
            string match -q '*=*' -- $spec; and set value '='
            for name in (string split ', ' -- $spec)
                printf '%s%s\t%s\n' (string replace -r '=.*' '' -- $name) $value $summary
            end
        end
    end
end

function __vmctl_complete
    set -l tokens (commandline -opc)
    set -l cur (commandline -ct)
    set -l vmctl $tokens[1]
    set -l ask $vmctl
    set -l table ($vmctl __complete 2>/dev/null)
    set -e tokens[1]

    # The value of an option given as --opt=VALUE: fish replaces the whole word.
    set -l opt
    set -l prefix
    set -l value $cur
    if string match -q -r '^--[a-z-]+=' -- $cur
        set opt (string replace -r '=.*' '' -- $cur)
        set value (string replace -r '^[^=]*=' '' -- $cur)
        set prefix $opt=
    else if set -q tokens[1]; and string match -q -r '^-' -- $tokens[-1]
        set opt $tokens[-1]
    end

    # Global options come before the command.
    while set -q tokens[1]
        switch $tokens[1]
            case --socket --host
                set ask $ask $tokens[1..2]
                set -e tokens[1..2]
            case '--socket=*' '--host=*'
                set ask $ask $tokens[1]
                set -e tokens[1]
            case '-*'
                set -e tokens[1]
            case '*'
                break
        end
    end
    if not set -q tokens[1]
        switch "$opt"
            case --socket
                __fish_complete_path $value | string replace -r '^' -- $prefix
            case --host
                echo $prefix'ssh://'
            case '*'
                if string match -q -- '-*' $cur
                    printf '%s\n' --socket --host --json -q --quiet --version -h --help
                else
                    for line in $table
                        set -l f (string split \t -- $line)
                        set -l words (string split ' ' -- $f[1])
                        set -q words[2]; and continue
                        printf '%s\t%s\n' $f[1] $f[3]
                    end
                    for line in $table
                        set -l f (string split \t -- $line)
                        set -l words (string split ' ' -- $f[1])
                        set -q words[2]; and printf '%s\tcommands\n' $words[1]
                    end | sort -u
                    printf 'help\tShow the usage of vmctl or of a command\n'
                end
        end
        return
    end

    set -l command $tokens[1]
    set -e tokens[1]
    if test "$command" = help
        if not set -q tokens[1]
            for line in $table
                string replace -r '[ \t].*' '' -- $line
            end | sort -u
        else if not set -q tokens[2]
            for line in $table
                string match -r -g '^'(string escape --style=regex -- $tokens[1])' (\S+)\t' -- $line
            end
        end
        return
    end
    # A group of subcommands ("template list"); "checkpoint" is a command of its own as well.
    set -l subcommands
    for line in $table
        set -a subcommands (string match -r -g '^'(string escape --style=regex -- $command)' (\S+)\t' -- $line)
    end
    if set -q subcommands[1]
        if not set -q tokens[1]; and not string match -q -- '-*' $cur
            for line in $table
                set -l f (string split \t -- $line)
                string match -q -- "$command *" $f[1]; and printf '%s\t%s\n' (string split ' ' -- $f[1])[2] $f[3]
            end
            for line in $table
                set -l f (string split \t -- $line)
                if test "$f[1]" = "$command"; and string match -q 'agent*' -- $f[2]
                    __vmctl_ask name $ask list
                end
            end
            return
        end
        if set -q tokens[1]; and contains -- $tokens[1] $subcommands
            set command "$command $tokens[1]"
            set -e tokens[1]
        end
    end

    set -l options (__vmctl_options $vmctl $command)
    set -l takes_value (string match -r -g '^(\S+)=\t' -- $options)
    # The arguments so far, without options and their values. `exec` ends its options at the
    # first word after NAME, and `--` ends them for every command.
    set -l positional
    set -l ended 0
    set -l skip 0
    for word in $tokens
        if test $skip = 1
            set skip 0
        else if test $ended = 1; or not string match -q -- '-*' $word
            set -a positional $word
            test "$command" = exec; and set ended 1
        else if test "$word" = --
            set ended 1
        else if contains -- $word $takes_value
            set skip 1
        end
        # After `secret create`, --host is where the secret may go, not where hostd is.
        if string match -q -r -- '^--socket=|^--host=' $word; and test "$command" != "secret create"
            set ask $vmctl $word
        end
    end
    # "--socket PATH" after the command: ask hostd there too.
    for i in (seq (count $tokens))
        if contains -- $tokens[$i] --socket --host; and test $i -lt (count $tokens)
            if test $tokens[$i] = --socket; or test "$command" != "secret create"
                set ask $vmctl $tokens[$i] $tokens[(math $i + 1)]
            end
        end
    end

    set -l kind
    if test -n "$opt"; and test $ended = 0; and begin
            test -n "$prefix"; or contains -- $opt $takes_value
        end
        switch $opt
            case --template
                set kind template
            case --from
                set kind checkpoint
            case --agent
                set kind agent
            case --secret
                set kind secret
            case --on --to
                set kind host
            case --user-data --socket --ssh-key --identity --from-file --copy-dir
                set kind file
            case '*'
                return
        end
    else if test $ended = 0; and string match -q -- '-*' $cur
        string replace -r '=\t' \t -- $options
        return
    else
        set -l kinds
        for line in $table
            set -l f (string split \t -- $line)
            test "$f[1]" = "$command"; and set kinds (string split ' ' -- $f[2])
        end
        set -l n (math (count $positional) + 1)
        if test $n -le (count $kinds)
            set kind $kinds[$n]
        else if set -q kinds[1]; and string match -q '*...' -- $kinds[-1]
            set kind $kinds[-1]
        end
        set kind (string replace '...' '' -- "$kind")
    end

    switch "$kind"
        case agent
            __vmctl_ask name $ask list
        case checkpoint
            set -q positional[1]; and __vmctl_ask id $ask checkpoints $positional[1]
        case template
            __vmctl_ask name $ask template list
        case secret
            __vmctl_ask name $ask secret list
        case host
            __vmctl_ask id $ask hosts
        case restart
            printf '%s\n' always never on-crash
        case file
            __fish_complete_path $value
        case location
            # A local path, or an agent's name and ':' (a path inside an agent is not completed:
            # that would take an exec per key press).
            if not string match -q '*:*' -- $value
                __fish_complete_path $value
                __vmctl_ask name $ask list | string replace -r '$' ':'
            end
    end | string replace -r '^' -- "$prefix"
end

complete -c vmctl -f -a '(__vmctl_complete)'
