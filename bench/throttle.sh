#!/usr/bin/env bash
# Runs a command with the block device under PATH throttled to a read rate: emulated
# Jetson-class storage on a machine whose disk is faster (cgroup v1 blkio,
# blkio.throttle.read_bps_device; it throttles O_DIRECT reads, not reads served by the page
# cache, so every benchmark mode must read from the device: swapnet and direct use O_DIRECT,
# naive drops each block's pages after reading it).
#
#   bench/throttle.sh RATE [--path PATH] [--stats FILE] -- COMMAND [ARGS...]
#
# RATE: host (no throttle), a rate such as 2GB/s, 1GB/s, 400MB/s, 1.5GiB/s, or bytes per second.
# PATH: a file or directory on the device to throttle (default: the model cache).
# --stats FILE: writes {"rate", "device", "bytes_read_from_device"} as JSON once the command
# ends (bytes the command's cgroup read from that device, from blkio.throttle.io_service_bytes).
# Exits with the command's status; 77 when the throttle cannot be set, saying why (not root,
# no cgroup v1 blkio controller, PATH on a filesystem without a block device such as tmpfs).
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
usage() { echo "usage: bench/throttle.sh host|RATE [--path PATH] [--stats FILE] -- COMMAND..." >&2; exit 2; }
[ $# -ge 1 ] || usage
rate_text=$1; shift
path=${SWAPNET_MODELS:-$repo/.cache/models} stats=""
while [ $# -gt 0 ]; do
  case "$1" in
    --path) path=$2; shift 2 ;;
    --stats) stats=$2; shift 2 ;;
    --) shift; break ;;
    *) usage ;;
  esac
done
[ $# -ge 1 ] || usage
cannot() { echo "bench/throttle.sh: cannot throttle reads at $rate_text: $*" >&2; exit 77; }

# Bytes per second: decimal units (GB = 1e9), binary ones (GiB = 2^30), or plain bytes.
bps=$(/usr/bin/python3 - "$rate_text" <<'PY'
import re, sys
t = sys.argv[1].strip()
if t == "host":
    print(0); sys.exit()
m = re.fullmatch(r"([0-9]+(?:\.[0-9]+)?)\s*([KMGT]i?B)?(?:/s)?", t)
if not m:
    sys.exit(f"bench/throttle.sh: rate '{t}' is not 'host', a rate like 1GB/s or 400MB/s, or bytes per second")
unit = m.group(2) or "B"
mult = {"B": 1, "KB": 1e3, "MB": 1e6, "GB": 1e9, "TB": 1e12,
        "KiB": 1024, "MiB": 1024**2, "GiB": 1024**3, "TiB": 1024**4}[unit]
v = int(float(m.group(1)) * mult)
if v < 1 << 20:
    sys.exit(f"bench/throttle.sh: rate '{t}' = {v} B/s is below 1 MiB/s")
print(v)
PY
) || exit 2

[ -e "$path" ] || cannot "'$path' does not exist (give --path on the device to throttle)"
read -r majmin fstype source < <(findmnt -no MAJ:MIN,FSTYPE,SOURCE -T "$path")
dev=""
if [ -e "/sys/dev/block/$majmin" ]; then
  # A partition is throttled at its disk, where the kernel's throttle sits.
  if [ -e "/sys/dev/block/$majmin/partition" ]; then
    dev=$(cat "$(readlink -f "/sys/dev/block/$majmin")/../dev")
  else
    dev=$majmin
  fi
fi

if [ "$bps" = 0 ]; then
  [ -z "$stats" ] || echo "{\"rate\": \"host\", \"device\": \"${dev:-none}\", \"bytes_read_from_device\": null}" > "$stats"
  exec "$@"
fi
[ -n "$dev" ] || cannot "'$path' is on $fstype ($source), which has no block device to throttle"
[ "$(id -u)" = 0 ] || cannot "setting a blkio throttle needs root"
root=/sys/fs/cgroup/blkio
[ -w "$root/blkio.throttle.read_bps_device" ] || [ -d "$root" ] ||
  cannot "no cgroup v1 blkio controller at $root"
cg=$root/swapnet-throttle-$$
mkdir "$cg" 2>/dev/null || cannot "cannot create the cgroup $cg"
cleanup() {
  # Processes left in the cgroup (none normally) go back to the root before it is removed.
  if [ -f "$cg/cgroup.procs" ]; then
    while read -r p; do echo "$p" > "$root/cgroup.procs" 2>/dev/null || true; done < "$cg/cgroup.procs"
  fi
  rmdir "$cg" 2>/dev/null || true
}
trap cleanup EXIT
# The kernel sets a disk's throttle slice once (Linux >= 6.10: when a throttle is first configured
# on the disk; before: at boot): 20 ms for a non-rotational disk, 100 ms for a rotational one,
# and a slice's credit is what a burst after idle reads at full speed (100 MB at 1 GB/s with
# 100 ms; measured here, 60 MB after 1 s idle at 400 MB/s: 117-121 ms with the 20 ms slice). Virtual disks often report
# rotational; the flash we emulate is not, so the disk is marked non-rotational before the first
# throttle (the mark lasts until reboot; a throttle set earlier keeps its 100 ms slice).
sysdisk=$(readlink -f "/sys/dev/block/$dev")
rotational=$(cat "$sysdisk/queue/rotational" 2>/dev/null || echo unknown)
if [ "$rotational" = 1 ] && [ -z "${SWAPNET_THROTTLE_KEEP_ROTATIONAL:-}" ]; then
  echo 0 > "$sysdisk/queue/rotational" 2>/dev/null && rotational=0 ||
    echo "bench/throttle.sh: could not mark $dev non-rotational; its throttle may allow 100 ms bursts" >&2
fi
echo "$dev $bps" > "$cg/blkio.throttle.read_bps_device" 2>/dev/null ||
  cannot "the kernel refused '$dev $bps' in $cg/blkio.throttle.read_bps_device"
echo "bench/throttle.sh: reads from $source ($dev, $fstype) throttled to $bps B/s" >&2
rc=0
bash -c 'echo $$ > "$1/cgroup.procs"; shift; exec "$@"' _ "$cg" "$@" || rc=$?
if [ -n "$stats" ]; then
  read_bytes=$(awk -v d="$dev" '$1 == d && $2 == "Read" {print $3}' "$cg/blkio.throttle.io_service_bytes")
  echo "{\"rate\": \"$rate_text\", \"bytes_per_s\": $bps, \"device\": \"$dev\", \"bytes_read_from_device\": ${read_bytes:-0}, \"rotational\": \"$rotational\"}" > "$stats"
fi
exit $rc
