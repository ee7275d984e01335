#!/usr/bin/env bash
# The main job on the built-in default model: installs what is missing, builds, writes
# resnet101 (random weights), prints its model info table, packs it into a swap image, checks
# the image, and runs it swapped within a budget of a third of its weights (60 MiB), compared
# with direct in-memory inference and the naive swapping path, outputs checked bit for bit.
# MODEL=NAME SHAPE=1,3,H,W BUDGET=SIZE choose another model from models/export.py.
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
model=${MODEL:-resnet101}
shape=${SHAPE:-1,3,224,224}
budget=${BUDGET:-60MiB}
bash "$repo/scripts/build.sh"
bash "$repo/scripts/models.sh" "$model"
pt=${SWAPNET_MODELS:-$repo/.cache/models}/$model.pt
cli="${BUILD_DIR:-$repo/build}/swapnet"
echo "== swapnet inspect $pt"
"$cli" inspect "$pt" --input-shape "$shape"
img=${pt%.pt}.swapnet
echo "== swapnet pack $pt -o $img"
"$cli" pack "$pt" -o "$img" --input-shape "$shape"
echo "== swapnet check $img"
"$cli" check "$img"
echo "== swapnet profile $img   (this device's cost model, once)"
"$cli" profile "$img"
echo "== swapnet plan $img --budget $budget"
"$cli" plan "$img" --budget "$budget"
echo "== swapnet run $img --budget $budget --compare --check"
"$cli" run "$img" --budget "$budget" --compare --check
