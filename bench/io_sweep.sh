#!/usr/bin/env bash
# Chooses the block reader's defaults by measurement: runs `swapnet bench io` on an image for
# several reader configurations (queue depth x request size) and prints, per configuration,
# the raw baseline measured in the same run, the fetch rate with and without checksums, and
# the ratios. Usage: bench/io_sweep.sh IMAGE.swapnet [RUNS] [> results.jsonl]
set -euo pipefail
img=$1 runs=${2:-3}
cli=${SWAPNET_CLI:-$(dirname "$0")/../build/swapnet}
for cfg in "8 262144" "16 262144" "32 262144" "8 1048576" "16 1048576" "32 1048576"; do
  set -- $cfg
  "$cli" bench io "$img" --runs "$runs" --queue-depth "$1" --request-size "$2" --json
done | /usr/bin/python3 "$(dirname "$0")/io_table.py"
