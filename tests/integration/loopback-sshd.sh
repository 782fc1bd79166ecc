# A throwaway OpenSSH server on a free 127.0.0.1 port, for the checks and benches that drive a
# hostd through `vmctl --host ssh://`; sourced, not run. Needs root (sshd's privilege
# separation), openssh-server and openssh-client, python3 (a free port).
#
# loopback_sshd_start DIR VMCTL: host and user keys, sshd_config and the client's ssh_config in
# DIR; an sshd whose sessions find VMCTL first on PATH as `vmctl` (what `vmctl bridge` runs);
# `ssh` first on this shell's PATH is a wrapper adding the client configuration, so the user's
# ~/.ssh is not touched. SHLVL=1 keeps bash from sourcing the host's ~/.bashrc for each command
# (a top-level shell under sshd does), so its cost is not counted as the remote path's. Sets
# SSHD_PORT and SSHD_PID; returns 1 (sshd.log in DIR says why) when the server does not listen
# within 10 s. loopback_sshd_stop ends it.
loopback_sshd_start() {
    local dir=$1 vmctl=$2
    SSHD_PORT=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
    ssh-keygen -q -t ed25519 -N '' -C loopback-sshd-host -f "$dir/host_key"
    ssh-keygen -q -t ed25519 -N '' -C loopback-sshd-user -f "$dir/user_key"
    cp "$dir/user_key.pub" "$dir/authorized_keys"
    mkdir -p "$dir/remote-bin" "$dir/client-bin"
    ln -sf "$vmctl" "$dir/remote-bin/vmctl"
    cat >"$dir/sshd_config" <<CONF
ListenAddress 127.0.0.1
Port $SSHD_PORT
HostKey $dir/host_key
AuthorizedKeysFile $dir/authorized_keys
PidFile none
UsePAM no
StrictModes no
PermitRootLogin prohibit-password
PasswordAuthentication no
KbdInteractiveAuthentication no
AllowTcpForwarding yes
SetEnv SHLVL=1 PATH=$dir/remote-bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
CONF
    mkdir -p /run/sshd
    /usr/sbin/sshd -D -e -f "$dir/sshd_config" 2>"$dir/sshd.log" &
    SSHD_PID=$!
    for _ in $(seq 1 100); do
        (exec 3<>"/dev/tcp/127.0.0.1/$SSHD_PORT") 2>/dev/null && break
        kill -0 "$SSHD_PID" 2>/dev/null || break
        sleep 0.1
    done
    (exec 3<>"/dev/tcp/127.0.0.1/$SSHD_PORT") 2>/dev/null || return 1

    echo "[127.0.0.1]:$SSHD_PORT $(cut -d' ' -f1-2 "$dir/host_key.pub")" >"$dir/known_hosts"
    cat >"$dir/ssh_config" <<CONF
Host 127.0.0.1
  IdentityFile $dir/user_key
  IdentitiesOnly yes
  UserKnownHostsFile $dir/known_hosts
  GlobalKnownHostsFile /dev/null
  StrictHostKeyChecking yes
CONF
    cat >"$dir/client-bin/ssh" <<CONF
#!/bin/sh
exec /usr/bin/ssh -F "$dir/ssh_config" "\$@"
CONF
    chmod +x "$dir/client-bin/ssh"
    export PATH="$dir/client-bin:$PATH"
}

loopback_sshd_stop() {
    [ -n "${SSHD_PID:-}" ] || return 0
    kill "$SSHD_PID" 2>/dev/null
    wait "$SSHD_PID" 2>/dev/null
    SSHD_PID=
}
