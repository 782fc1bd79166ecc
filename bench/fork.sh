#!/bin/bash
# bench/fork: `vmctl fork SRC NEW --no-wait` (to a defined, started domain) with 1 GiB and with
# 4 GiB of data written in SRC's disk, against a virt-clone of the same stopped VM at each size;
# and a fork to SSH against a cold `vmctl new` to SSH, all in the same run. Goals: fork 4G/1G
# <= 1.2; virt-clone/fork >= 50x.
#
# Usage: bench/fork.sh [N]   (as root, after `meson setup build && ninja -C build`; needs
# virt-clone from the virtinst package and about 12 GiB free under $TMPDIR; takes ~45 min)
#
# virt-clone cannot run as such against hostd's embedded libvirt (qemu:///embed): that driver
# has no storage pools, and virt-clone finds, copies and creates disks only through the storage
# pool API (its disk lookup returns no path: "Device type 'disk' requires a path"); it also
# needs an event loop, which its CLI does not register. So the baseline runs virt-clone's own
# code (virtinst, with an event loop) for the new definition (new name, UUID, MAC), the full
# disk copy libvirt's storage driver makes for it (`qemu-img convert` of the qcow2 chain to a
# standalone qcow2, sparse as virt-clone's default), and `virsh define`: timed together.
set -euo pipefail
cd "$(dirname "$0")/.."
N=${1:-3}
VMCTL=${VMCTL:-./build/vmctl/vmctl}
HOSTD=${HOSTD:-./build/hostd/hostd}
PY=/usr/bin/python3   # the interpreter virtinst and the libvirt bindings are installed for
command -v virt-clone >/dev/null || { echo "fork.sh: needs virt-clone (virtinst)" >&2; exit 1; }

S=$(mktemp -d -t vmf.XXXXXX); chmod 711 "$S"
IMAGES=${VM_TEST_IMAGE_CACHE:-$S/images}
U="qemu:///embed?root=$S/libvirt"
printf '[hostd]\nimages-dir=%s\nssh-port-min=44300\nssh-port-max=44399\n' "$IMAGES" \
  > "$S/hostd.conf"
export VMCTL_SOCKET=$S/hostd.sock
HOSTD_PID=
FORKS=()   # removed before the source: hostd refuses to remove a source with forks
OTHERS=()

start_hostd() {
  "$HOSTD" --config "$S/hostd.conf" --state-dir "$S" >> "$S/hostd.log" 2>&1 &
  HOSTD_PID=$!
  for _ in $(seq 1 150); do "$VMCTL" list >/dev/null 2>&1 && return; sleep 0.2; done
  echo "fork.sh: hostd did not answer" >&2; return 1
}
stop_hostd() { # frees the embedded libvirt root: only one process may hold it
  [ -n "$HOSTD_PID" ] || return 0
  kill "$HOSTD_PID"; wait "$HOSTD_PID" 2>/dev/null || true; HOSTD_PID=
}
cleanup() {
  local rc=$? n
  set +e
  [ "$rc" -ne 0 ] && tail -n 20 "$S/hostd.log" >&2
  [ -n "$HOSTD_PID" ] || start_hostd
  for n in "${FORKS[@]}" "${OTHERS[@]}"; do "$VMCTL" rm --force "$n" >/dev/null 2>&1; done
  stop_hostd
  # Whatever hostd could not remove (a clone defined while it was down, a VM left running).
  for n in $(virsh -q -c "$U" list --all --name 2>/dev/null); do
    virsh -q -c "$U" destroy "$n" >/dev/null 2>&1
    virsh -q -c "$U" undefine "$n" >/dev/null 2>&1
  done
  rm -rf "$S"
  exit "$rc"
}
trap cleanup EXIT

now() { date +%s%N; }
ms_since() { echo $(( ($(now) - $1) / 1000000 )); }
median() { sort -n | awk '{a[NR]=$1} END {print (NR%2)?a[(NR+1)/2]:(a[NR/2]+a[NR/2+1])/2}'; }
fill_to() { # fill_to GIB: the data files in SRC's home reach GIB GiB, 64 MiB files, fsynced
  # One random file (urandom is slow under TCG), copied: every block is written for real.
  "$VMCTL" exec src -- sh -ec 'cd
    [ -f fill.1 ] || dd if=/dev/urandom of=fill.1 bs=1M count=64 conv=fsync status=none
    for i in $(seq 2 $(($1 * 16))); do
      [ -f fill.$i ] || dd if=fill.1 of=fill.$i bs=1M conv=fsync status=none
    done' fill "$1"
}
report_size() {
  local used chain
  used=$("$VMCTL" exec src -- df -BM --output=used / | tail -n 1 | tr -dc 0-9)
  chain=$(du -cm "$S/agents/src" | tail -n 1 | cut -f 1)
  echo "  source disk: ${used} MiB used in the guest, ${chain} MiB of images on the host"
}
time_forks() { # time_forks TAG ARRAY: N forks to a started domain, each removed again
  local -n out=$2
  local i t0
  for i in $(seq 1 "$N"); do
    FORKS+=("f$1-$i")
    # Progress lines (stderr, not a terminal) stamped with ms since the start: the stages.
    t0=$(now)
    "$VMCTL" fork src "f$1-$i" --no-wait 2>&1 >/dev/null |
      while IFS= read -r line; do echo "$(ms_since "$t0") $line"; done >> "$S/stages-$1"
    out+=("$(ms_since "$t0")")
    echo "${out[-1]} done" >> "$S/stages-$1"
    "$VMCTL" -q rm --force "f$1-$i" >/dev/null
  done
}
stages() { # stages TAG: the median time from the start at which each stage began
  awk '{t = $1; $1 = ""; sub(/^ /, ""); if (!($0 in n)) order[++k] = $0; v[$0, ++n[$0]] = t}
       END {for (i = 1; i <= k; i++) {m = order[i]; c = n[m]
              for (a = 1; a <= c; a++) for (b = a + 1; b <= c; b++)
                if (v[m, b] < v[m, a]) {x = v[m, a]; v[m, a] = v[m, b]; v[m, b] = x}
              med = (c % 2) ? v[m, (c + 1) / 2] : (v[m, c / 2] + v[m, c / 2 + 1]) / 2
              printf "%s%s %s", (i > 1 ? " | " : ""), m, med}
            print ""}' "$S/stages-$1"
}
virt_clone() { # virt_clone TAG ARRAY: SRC stopped, hostd down; one clone to a defined domain
  local -n out=$2
  local src_disk t0
  src_disk=$(virsh -q -c "$U" domblklist src --details | awk '$2 == "disk" {print $4}')
  t0=$(now)
  "$PY" - --connect "$U" --original src --name vcclone --auto-clone --skip-copy=vda \
    --print-xml > "$S/vcclone.xml" <<'EOF'
import sys, threading, libvirt
sys.path.insert(0, "/usr/share/virt-manager")

def run_events():
    while True:
        libvirt.virEventRunDefaultImpl()

libvirt.virEventRegisterDefaultImpl()  # the embedded driver needs one; virt-clone has none
threading.Thread(target=run_events, daemon=True).start()
sys.argv[0] = "virt-clone"
from virtinst import virtclone
virtclone.runcli()
EOF
  "$PY" - "$S/vcclone.xml" "$src_disk" "$S/vcclone.qcow2" <<'EOF'
import sys, xml.etree.ElementTree as ET
xml, old, new = sys.argv[1:]
ET.register_namespace("qemu", "http://libvirt.org/schemas/domain/qemu/1.0")
tree = ET.parse(xml)
for disk in tree.iter("disk"):
    src = disk.find("source")
    if src is not None and src.get("file") == old:
        src.set("file", new)
        for b in disk.findall("backingStore"):  # else libvirt keeps the stale chain
            disk.remove(b)
tree.write(xml)
EOF
  echo "$(ms_since "$t0") virtinst" >> "$S/stages-vc$1"
  qemu-img convert -f qcow2 -O qcow2 -o compat=1.1 "$src_disk" "$S/vcclone.qcow2"
  echo "$(ms_since "$t0") qemu-img convert" >> "$S/stages-vc$1"
  virsh -q -c "$U" define "$S/vcclone.xml" >/dev/null
  out+=("$(ms_since "$t0")")
  echo "${out[-1]} virsh define" >> "$S/stages-vc$1"
  virsh -q -c "$U" undefine vcclone >/dev/null
  rm -f "$S/vcclone.qcow2" "$S/vcclone.xml"
}
time_virt_clones() { # time_virt_clones TAG ARRAY: stops SRC and hostd, N clones, both run again
  local i
  "$VMCTL" -q stop src >/dev/null
  stop_hostd
  for i in $(seq 1 "$N"); do virt_clone "$1" "$2"; done
  start_hostd
  "$VMCTL" -q start src >/dev/null
}

start_hostd
"$VMCTL" -q template build debian-12 >/dev/null
OTHERS+=(src)
"$VMCTL" -q new src --disk 12 >/dev/null
"$VMCTL" idle src --never >/dev/null

echo "fork benchmark, medians of $N (ms)"
fill_to 1
report_size
fork1=(); clone1=(); time_forks 1g fork1; time_virt_clones 1g clone1
echo "  1 GiB: fork ${fork1[*]} | virt-clone ${clone1[*]}"
echo "  1 GiB fork stages, median ms from the start: $(stages 1g)"
echo "  1 GiB virt-clone steps, median ms from the start to the end of: $(stages vc1g)"

fssh=(); cold=()
for i in $(seq 1 "$N"); do   # interleaved, so both see the same host load
  FORKS+=("fs-$i")
  t0=$(now); "$VMCTL" -q fork src "fs-$i" >/dev/null; "$VMCTL" exec "fs-$i" -- true
  fssh+=("$(ms_since "$t0")")
  "$VMCTL" -q rm --force "fs-$i" >/dev/null
  OTHERS+=("cold-$i")
  t0=$(now); "$VMCTL" -q new "cold-$i" --disk 12 >/dev/null; "$VMCTL" exec "cold-$i" -- true
  cold+=("$(ms_since "$t0")")
  "$VMCTL" -q rm --force "cold-$i" >/dev/null
done
echo "  to SSH: fork ${fssh[*]} | cold new ${cold[*]}"

fill_to 4
report_size
fork4=(); clone4=(); time_forks 4g fork4; time_virt_clones 4g clone4
echo "  4 GiB: fork ${fork4[*]} | virt-clone ${clone4[*]}"
echo "  4 GiB fork stages, median ms from the start: $(stages 4g)"
echo "  4 GiB virt-clone steps, median ms from the start to the end of: $(stages vc4g)"

f1=$(printf '%s\n' "${fork1[@]}" | median); f4=$(printf '%s\n' "${fork4[@]}" | median)
c1=$(printf '%s\n' "${clone1[@]}" | median); c4=$(printf '%s\n' "${clone4[@]}" | median)
s=$(printf '%s\n' "${fssh[@]}" | median); n=$(printf '%s\n' "${cold[@]}" | median)
# hostd defines and starts the domain in one step: the stamp of "starting the VM" is when that
# step begins, a lower bound of the time to a defined (not yet started) domain.
d1=$(awk '/ starting the VM$/ {print $1}' "$S/stages-1g" | median)
d4=$(awk '/ starting the VM$/ {print $1}' "$S/stages-4g" | median)
echo "fork to a defined and started domain: 1 GiB $f1 | 4 GiB $f4"
echo "fork until the define+start step begins: 1 GiB $d1 | 4 GiB $d4"
echo "virt-clone (virtinst + qemu-img convert + define) to a defined domain: 1 GiB $c1 | 4 GiB $c4"
echo "to SSH + first command: fork $s | cold new $n"
awk -v f1="$f1" -v f4="$f4" -v c1="$c1" -v c4="$c4" -v s="$s" -v n="$n" -v d1="$d1" \
    -v d4="$d4" 'BEGIN {
  printf "ratio fork 4G/1G          %.2fx (goal <= 1.2)\n", f4 / f1
  printf "ratio virt-clone/fork 1G  %.1fx (goal >= 50)\n", c1 / f1
  printf "ratio virt-clone/fork 4G  %.1fx (goal >= 50)\n", c4 / f4
  printf "ratio virt-clone/fork until define+start, 1G %.1fx | 4G %.1fx\n", c1 / d1, c4 / d4
  printf "ratio fork/cold new, SSH  %.2fx\n", s / n
}'
