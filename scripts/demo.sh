#!/usr/bin/env bash
# The main job on the built-in default model: installs what is missing, builds, writes
# resnet101 (random weights), prints its model info table and verifies that the layer-by-layer
# run is bit-identical to forward. MODEL=NAME SHAPE=1,3,H,W choose another model from
# models/export.py.
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
echo "== swapnet verify $pt"
"$cli" verify "$pt" --input-shape "$shape" --runs 3
