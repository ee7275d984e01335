#!/usr/bin/env bash
# Writes TorchScript models with deterministic random weights into the model cache
# (default .cache/models, or $SWAPNET_MODELS). Arguments: sets (small, paper, zoo, bad) or
# model names; files already there are kept. See models/export.py.
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
out=${SWAPNET_MODELS:-$repo/.cache/models}
# Debian's interpreter has python3-torch; another python3 may come first on PATH (SWAPNET_PYTHON
# overrides it: the GPU machine's python3 holds PyTorch and torchvision).
"${SWAPNET_PYTHON:-/usr/bin/python3}" -W ignore "$repo/models/export.py" --out "$out" "$@"
