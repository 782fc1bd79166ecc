#!/bin/bash
# The style suite: every tracked C file matches .clang-format (clang-format 14).
cd "${VM_SOURCE_DIR:?}" || exit 1
command -v clang-format >/dev/null || { echo "1..0 # SKIP clang-format not installed"; exit 0; }
files=$(git ls-files '*.c' '*.h' 2>/dev/null || find . -name '*.[ch]' -not -path './build*')
n=0; bad=0
for f in $files; do
  n=$((n + 1))
  if clang-format --dry-run --Werror "$f" >/dev/null 2>&1; then
    echo "ok $n - $f"
  else
    bad=$((bad + 1)); echo "not ok $n - $f (run: clang-format -i $f)"
  fi
done
echo "1..$n"
[ "$bad" -eq 0 ]
