#!/usr/bin/env bash
# The main job on the built-in default model: installs what is missing, builds, writes
# resnet101 (random weights), prints its model info table, packs it into a swap image, checks
# the image, verifies that the layers run with weights fetched from the image are bit-identical
# to forward, and measures block fetch against the disk's raw rate. MODEL=NAME SHAPE=1,3,H,W
# choose another model from models/export.py.
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
model=${MODEL:-resnet101}
shape=${SHAPE:-1,3,224,224}
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
echo "== swapnet verify $pt --image $img"
"$cli" verify "$pt" --image "$img" --input-shape "$shape" --runs 3
echo "== swapnet bench io $img"
"$cli" bench io "$img"
