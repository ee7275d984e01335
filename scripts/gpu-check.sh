#!/usr/bin/env bash
# The GPU checks of issue #6, on a machine with an NVIDIA GPU, a pip PyTorch (with its libtorch),
# nvcc, CMake and ninja, but no package registry. Run scripts/gpu-deps.sh here first (it fetches
# the few Debian packages swapnet needs into .gpu-deps/), then there, from the repository root:
#   bash scripts/gpu-check.sh            (device tool: carry .gpu-deps; results land in $OUT)
# It builds swapnet against the pip libtorch (python3 -c 'import torch; print(torch.utils.cmake_prefix_path)')
# with the .deb files unpacked by dpkg -x into a prefix, exports test models with that python3,
# and runs, each reported as PASS or FAIL (nothing is skipped):
#  1. the unit and CLI tests (ctest -LE "model|zoo") with SWAPNET_EXPECT_GPU=1: the preload test then
#     expects managed memory and an aliased .to(cuda); run tests expect --device cuda to be
#     bit-identical to direct GPU inference; the gpu.* tests (tests/gpu/gpu_test.cpp);
#  2. host-to-device copies (tests/gpu/cuda_copy_count.c, an LD_PRELOAD hook on cudaMemcpy*):
#     swapped GPU inference must add none per inference; the positive control (direct GPU
#     inference, which copies every weight) must show copies, or the hook saw nothing;
#     the unmodified torch program under the preload: .to(cuda) of a managed tensor adds none;
#  3. latency at 1/3 of the model: swapnet run --device cuda --compare --check (direct GPU
#     inference and swapped, each in its own process, interleaved), for resnet101 and vgg19.
# Results: $OUT (or .gpu-out/) gpu-check.log, gpu-check.md, ctest.log, MODEL-compare.json.
# SWAPNET_GPU_CHECK_BUILD_ONLY=1 stops after the build (to try the build on any machine).
set -uo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
cd "$repo"
out=${OUT:-$repo/.gpu-out}
mkdir -p "$out"
exec > >(tee "$out/gpu-check.log") 2>&1
py=${SWAPNET_PYTHON:-python3}
status=0
results=()
verdict() {  # NAME OK(0/1) DETAIL
  local word=PASS
  if [ "$2" -ne 0 ]; then word=FAIL; status=1; fi
  echo "== $word: $1 ${3:-}"
  results+=("| $1 | $word | ${3:-} |")
}

echo "== machine"
nvidia-smi -L || true
"$py" -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda, "available", torch.cuda.is_available())'

# ---- build ---------------------------------------------------------------------------------
prefix=/tmp/swapnet-deps
if ! ls .gpu-deps/*.deb >/dev/null 2>&1; then
  echo "no .gpu-deps/*.deb: run scripts/gpu-deps.sh where apt works and carry .gpu-deps"; exit 2
fi
for f in .gpu-deps/*.deb; do dpkg -x "$f" "$prefix"; done
arch_lib=$(ls -d "$prefix"/usr/lib/*-linux-gnu | head -n 1)
torch_prefix=$("$py" -c 'import torch; print(torch.utils.cmake_prefix_path)')
torch_lib=$("$py" -c 'import torch, os; print(os.path.join(os.path.dirname(torch.__file__), "lib"))')
export LD_LIBRARY_PATH="$arch_lib:$torch_lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
models=$repo/.cache/models-gpu
build=$repo/build-gpu
cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DSWAPNET_WITH_CUDA=ON -DSWAPNET_GPU_TESTS=ON \
  -DCMAKE_PREFIX_PATH="$torch_prefix;$prefix/usr" -DSWAPNET_MODEL_DIR="$models" || { echo "configure failed"; exit 2; }
cmake --build "$build" -j "$(nproc)" || { echo "build failed"; exit 2; }
cli=$build/swapnet
if [ -n "${SWAPNET_GPU_CHECK_BUILD_ONLY:-}" ]; then echo "built $cli"; exit 0; fi

# ---- models --------------------------------------------------------------------------------
SWAPNET_PYTHON=$py SWAPNET_MODELS=$models bash scripts/models.sh small resnet101 vgg19 || { echo "model export failed"; exit 2; }
export SWAPNET_PROFILE=$out/device.json

# ---- 1. tests ------------------------------------------------------------------------------
SWAPNET_EXPECT_GPU=1 ctest --test-dir "$build" -LE "model|zoo" -j 8 --output-on-failure --timeout 600 \
  --output-junit "$out/ctest.xml" > "$out/ctest.log" 2>&1
rc=$?
tail -n 30 "$out/ctest.log"
verdict "ctest -LE model|zoo with SWAPNET_EXPECT_GPU=1 (gpu.*, preload.*, run.*)" $rc "$(grep -E 'tests passed|tests failed' "$out/ctest.log" | tail -n 1)"

# ---- 2. host-to-device copies --------------------------------------------------------------
hook=$build/tests/libcuda_copy_count.so
h2d() { grep -o 'cuda-copies: h2d=[0-9]*' | tail -n 1 | sed 's/.*=//'; }  # from stderr
img=$out/resnet101.swapnet
"$cli" pack "$models/resnet101.pt" -o "$img" --input-shape 1,3,224,224 >/dev/null
data=$("$cli" inspect "$img" --json | "$py" -c 'import json,sys; print(json.load(sys.stdin)["data_bytes"])')
third=$((data / 3))
copies() { LD_PRELOAD=$hook "$cli" run "$img" --budget "$third" --device cuda "$@" 2>&1 >/dev/null | h2d; }
s1=$(copies --mode swapnet --iters 1); s11=$(copies --mode swapnet --iters 11)
d1=$(copies --mode direct --iters 1)
echo "h2d copies: swapnet 1 inference $s1, 11 inferences $s11; direct (control) $d1"
verdict "positive control: direct GPU inference shows its weight copies" $([ "${d1:-0}" -gt 100 ]; echo $?) "h2d=$d1"
verdict "swapped GPU inference adds no host-to-device copies (10 more inferences)" \
  $([ -n "$s1" ] && [ "$s1" = "$s11" ]; echo $?) "h2d: $s1 after 1, $s11 after 11"
prog=$build/tests/torch_program
p0=$(LD_PRELOAD=$hook "$prog" "$models/resnet18.pt" --to-cuda 2>&1 >/dev/null | h2d)
p1=$(LD_PRELOAD="$build/libswapnet_preload.so $hook" "$prog" "$models/resnet18.pt" --to-cuda 2>&1 >/dev/null | h2d)
verdict "unmodified program: .to(cuda) of a managed tensor copies nothing" \
  $([ -n "$p0" ] && [ -n "$p1" ] && [ "$p1" -eq $((p0 - 1)) ]; echo $?) "h2d without preload $p0, with $p1 (the fp16 one stays)"

# ---- 3. latency at 1/3 -------------------------------------------------------------------
table="| model | budget | direct GPU ms | swapnet GPU ms | ratio | blocks | memory | equal |\n|---|---:|---:|---:|---:|---:|---|---|"
for name in resnet101 vgg19; do
  im=$out/$name.swapnet
  [ -f "$im" ] || "$cli" pack "$models/$name.pt" -o "$im" --input-shape 1,3,224,224 >/dev/null
  b=$(( $("$cli" inspect "$im" --json | "$py" -c 'import json,sys; print(json.load(sys.stdin)["data_bytes"])') / 3 ))
  j=$("$cli" run "$im" --budget "$b" --device cuda --compare --check --rounds 3 --iters 10 --json)
  rc=$?
  echo "$j" > "$out/$name-compare.json"
  row=$("$py" - "$name" "$b" "$out/$name-compare.json" <<'PY'
import json, sys
j = json.load(open(sys.argv[3]))
print(f"| {sys.argv[1]} | {int(sys.argv[2]) / 2**20:.1f} MiB | {j['direct']['latency_ms']['median']:.2f} | "
      f"{j['latency_ms']['median']:.2f} | {j['ratio_vs_direct']:.3f} | {j['num_blocks']} | {j['memory']} | {j.get('equal')} |")
PY
)
  table="$table\n$row"
  verdict "$name --device cuda at 1/3: bit-identical to direct GPU inference" $rc "$row"
done
{
  echo "# gpu-check $(date -u +%F) on $(nvidia-smi -L | head -n 1)"
  echo; echo "| check | result | detail |"; echo "|---|---|---|"; printf '%s\n' "${results[@]}"
  echo; echo -e "$table"
} > "$out/gpu-check.md"
cat "$out/gpu-check.md"
exit $status
