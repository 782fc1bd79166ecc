# shellcheck shell=bash
# vmctl cp against a real agent. Sourced, not run, after lib.sh (vmctl, check, diag, S);
# vm-suite.sh calls these on its shared agent and its fork:
#
#   cp_check AGENT         a tree (modes, times, a symlink, names with a space and a newline, a
#                          200 MB file) into the agent and back, checksums and modes compared;
#                          into an existing directory; the exit statuses of a missing agent,
#                          guest path and local path
#   cp_check_saved AGENT   with AGENT saved to disk: a copy into it wakes it
#   cp_check_agents A B    a tree from agent A straight to agent B
#
# Each removes what it copied into a guest.

# Prints a manifest of the tree at $1: each entry's relative name (escaped), type, mode, mtime
# (seconds; not for symlinks) and sha256 or link target, sorted.
cp_manifest() {
  python3 - "$1" <<'PY'
import hashlib, os, stat, sys
root = sys.argv[1]
rows = []
for d, dirs, files in os.walk(root):
    for n in dirs + files:
        p = os.path.join(d, n)
        st = os.lstat(p)
        rel = os.path.relpath(p, root).encode("unicode_escape").decode()
        if stat.S_ISLNK(st.st_mode):
            rows.append("%s l %s" % (rel, os.readlink(p)))
            continue
        extra = ""
        if stat.S_ISREG(st.st_mode):
            h = hashlib.sha256()
            with open(p, "rb") as f:
                for block in iter(lambda: f.read(1 << 20), b""):
                    h.update(block)
            extra = h.hexdigest()
        rows.append("%s %o %d %s" % (rel, st.st_mode, int(st.st_mtime), extra))
print("\n".join(sorted(rows)))
PY
}

# A comment with what a failed check saw (none after a check that passed).
cp_diag() { [ "$TAP_FAILING" = 0 ] || diag "$@"; }

# Whether the trees at $1 and $2 have the same manifest; the difference goes to stderr.
cp_same_tree() {
  local diff
  diff=$(diff <(cp_manifest "$1") <(cp_manifest "$2")) && return 0
  echo "$diff" | head -n 10 | sed 's/^/# /' >&2
  return 1
}

# Makes the test tree at $1.
cp_make_tree() {
  local t=$1
  mkdir -p "$t/sub/dir" "$t/private"
  printf '#!/bin/sh\necho run\n' > "$t/tool.sh"; chmod 755 "$t/tool.sh"
  echo secret > "$t/secret"; chmod 600 "$t/secret"
  echo deep > "$t/sub/dir/deep.txt"
  touch -d '2001-02-03 04:05:06 UTC' "$t/sub/dir/deep.txt"
  echo spaced > "$t/with space.txt"
  echo newline > "$t/new"$'\n'"line"
  echo colon > "$t/a:b"
  ln -s sub/dir/deep.txt "$t/link"
  ln -s /etc/passwd "$t/abs-link"
  chmod 750 "$t/private"
  head -c 200M /dev/urandom > "$t/big.bin"
  touch -d '2002-03-04 05:06:07 UTC' "$t/sub"
}

cp_check() {
  local a=$1 d=$S/cp t0 rc out secs
  rm -rf "$d"; mkdir -p "$d"
  cp_make_tree "$d/src"
  t0=$(date +%s.%N)
  out=$(vmctl cp "$d/src" "$a:cp-in" 2>&1); rc=$?
  secs=$(echo "$(date +%s.%N) - $t0" | bc)
  check "cp of a tree with a 200 MB file into $a (${secs} s)" test "$rc" = 0
  cp_diag "$out"
  check "the 200 MB file's checksum in the guest is the host's" \
    test "$(vmctl exec "$a" -- sha256sum cp-in/big.bin | cut -d' ' -f1)" = \
      "$(sha256sum "$d/src/big.bin" | cut -d' ' -f1)"
  # shellcheck disable=SC2016 # expanded by the guest's shell
  check "in the guest: modes, a time, symlinks as symlinks, names with a space, a newline, a colon" \
    vmctl exec "$a" -- sh -c 'cd cp-in &&
      [ "$(stat -c %a tool.sh secret private)" = "755
600
750" ] && [ "$(stat -c %Y sub/dir/deep.txt)" = 981173106 ] &&
      [ "$(readlink link)" = sub/dir/deep.txt ] && [ "$(readlink abs-link)" = /etc/passwd ] &&
      [ "$(cat "with space.txt")" = spaced ] && [ "$(cat "new
line")" = newline ] && [ "$(cat a:b)" = colon ] && [ "$(stat -c %U tool.sh)" = "$(id -un)" ]'
  t0=$(date +%s.%N)
  out=$(vmctl cp "$a:cp-in" "$d/back" 2>&1); rc=$?
  secs=$(echo "$(date +%s.%N) - $t0" | bc)
  check "cp of the tree back from $a (${secs} s)" test "$rc" = 0
  cp_diag "$out"
  check "the tree back is the tree sent: names, types, modes, times, contents, link targets" \
    cp_same_tree "$d/src" "$d/back"

  check "cp of a file into an existing guest directory lands under its own name" \
    bash -c "'$VMCTL' --socket '$SOCK' cp '$d/src/tool.sh' '$a:cp-in/sub/' &&
      [ \"\$('$VMCTL' --socket '$SOCK' exec '$a' -- cp-in/sub/tool.sh)\" = run ]"
  check "cp of a guest file into a local directory, and a local name with ':' (./)" \
    bash -c "cd '$d' && '$VMCTL' --socket '$SOCK' cp '$a:/etc/hostname' . &&
      [ \"\$(cat hostname)\" = '$a' ] && '$VMCTL' --socket '$SOCK' cp ./src/a:b '$a:cp-in/c:d' &&
      [ \"\$('$VMCTL' --socket '$SOCK' exec '$a' -- cat cp-in/c:d)\" = colon ]"

  out=$(vmctl cp "$d/src/secret" nosuch:x 2>&1); rc=$?
  check "cp to an unknown agent: exit 3" test "$rc" = 3
  cp_diag "$rc: $out"
  out=$(vmctl cp "$a:no/such/file" "$d/x" 2>&1); rc=$?
  check "cp of a missing guest path: exit 18, one line naming it" \
    bash -c "[ $rc = 18 ] && [ \$(wc -l <<< \"\$1\") = 1 ] && grep -q 'no/such/file' <<< \"\$1\"" _ "$out"
  cp_diag "$rc: $out"
  out=$(vmctl cp "$d/src/secret" "$a:/no/such/dir/x" 2>&1); rc=$?
  check "cp into a missing guest directory: exit 18" test "$rc" = 18
  cp_diag "$rc: $out"
  out=$(vmctl cp "$d/no-such" "$a:x" 2>&1); rc=$?
  check "cp of a missing local path: exit 13" test "$rc" = 13
  cp_diag "$rc: $out"
  out=$(vmctl cp "$a:cp-in/secret" "$d/no/such/dir/x" 2>&1); rc=$?
  check "cp into a missing local directory: exit 13, nothing written" \
    test "$rc" = 13 -a ! -e "$d/no"
  cp_diag "$rc: $out"
  vmctl exec "$a" -- rm -rf cp-in >/dev/null
  rm -rf "$d"
}

cp_check_saved() {
  local a=$1 state out rc
  state=$(vmctl list --json | python3 -c 'import json,sys; print([x["state"] for x in json.load(sys.stdin) if x["name"] == sys.argv[1]][0])' "$a")
  echo to-saved > "$S/cp-saved.txt"
  out=$(vmctl cp "$S/cp-saved.txt" "$a:" 2>&1); rc=$?
  check "cp into a saved agent wakes it and lands in the home directory" \
    bash -c "[ '$state' = saved ] && [ $rc = 0 ] &&
      [ \"\$('$VMCTL' --socket '$SOCK' exec '$a' -- cat cp-saved.txt)\" = to-saved ]"
  cp_diag "state before: $state, $rc: $out"
  vmctl exec "$a" -- rm -f cp-saved.txt >/dev/null
  rm -f "$S/cp-saved.txt"
}

cp_check_agents() {
  local a=$1 b=$2 out rc
  # shellcheck disable=SC2016 # expanded by the guest's shell
  vmctl exec "$a" -- sh -c 'mkdir -p x2a/sub && echo hi > "x2a/sub/a b" && chmod 640 "x2a/sub/a b" &&
    ln -s sub x2a/l && head -c 5M /dev/urandom > x2a/blob' >/dev/null
  out=$(vmctl cp "$a:x2a" "$b:x2b" 2>&1); rc=$?
  check "cp from agent $a to agent $b: contents, a mode, a symlink" \
    bash -c "[ $rc = 0 ] &&
      [ \"\$('$VMCTL' --socket '$SOCK' exec '$b' -- sh -c 'cat \"x2b/sub/a b\"; stat -c %a \"x2b/sub/a b\"; readlink x2b/l; sha256sum < x2b/blob')\" = \
        \"\$('$VMCTL' --socket '$SOCK' exec '$a' -- sh -c 'cat \"x2a/sub/a b\"; stat -c %a \"x2a/sub/a b\"; readlink x2a/l; sha256sum < x2a/blob')\" ]"
  cp_diag "$rc: $out"
  vmctl exec "$a" -- rm -rf x2a >/dev/null
  vmctl exec "$b" -- rm -rf x2b >/dev/null
}
