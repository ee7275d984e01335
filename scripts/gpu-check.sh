#!/usr/bin/env bash
# The GPU checks (issue 19), on a machine with an NVIDIA GPU, a pip PyTorch (with its libtorch),
# nvcc, CMake and ninja, but no package registry. Run scripts/gpu-deps.sh here first (it fetches
# the few Debian packages swapnet needs into .gpu-deps/), then there, from the repository root:
#   bash scripts/gpu-check.sh            (device tool: carry .gpu-deps; results land in $OUT)
# Device time is short, so everything runs in one command against one deadline
# (SWAPNET_GPU_CHECK_SECONDS, default 520), the most important first, each step bounded;
# SWAPNET_GPU_CHECK_FOCUS=arch runs only issue 47's table: seven architectures at 1/3 and 1/2 on
# the machine's disk and emulated at 2 and 1 GB/s (after the build; several calls: see below).
# SWAPNET_GPU_READ_AHEAD=two-ended runs every latency cell in the two-block ring the GPU used
# before its ring was deep (2026-11-29), for comparison; the rows say so. In the arch table,
# SWAPNET_GPU_ARCH_PIPELINES="ring two-ended" measures both, side by side.
# SWAPNET_GPU_LEARN=N adds --learn N to every latency cell (Note [Timing layers on the GPU]: plans
# made with the GPU's layer times, learned in a warm-up window, instead of the image's CPU times);
# the rows say so and carry what was learned.
# SWAPNET_GPU_CHECK_FOCUS=1 runs a shorter set (the GPU, preload, run, python and serve.small tests; copies
# and latency of resnet101 and yolov3), for a second try in what is left of a session's time.
#  0. the machine: GPU, driver, CUDA, torch, compilers;
#  1. the build against the pip libtorch (ninja -k 0: every compile error comes back at once);
#  2. one gtest binary alone (a crash prints its stack: tests/crash_trace.cpp), then ctest
#     -LE "model|package" with SWAPNET_EXPECT_GPU=1 in two passes, what a GPU changes first
#     (gpu.*, the preload's managed memory and aliased .to(cuda), python, run, serve, Executor),
#     then the rest, while the paper models are exported;
#     preload.transparent runs the unmodified C++ and Python programs with the model loaded onto
#     the GPU (map_location) and moved there (.to): outputs, host RSS and GPU memory with and
#     without swapnet, into the rows and a table;
#  3. host-to-device copies (tests/gpu/cuda_copy_count.c, an LD_PRELOAD hook on cudaMemcpy*):
#     swapped GPU inference must add none per inference; the positive control (direct GPU
#     inference, which copies every weight) must show copies, or the hook saw nothing; the
#     unmodified C++ and Python programs under the preload: .to(cuda) of a managed tensor adds none;
#  4. the deadline scheduler with two GPU models (serve, lst, a budget cut), then latency at 1/3
#     and 1/2 of resnet101, yolov3 and vgg19 (a budget below the GPU's minimum raised to it):
#     swapnet run --device cuda --compare --check (direct GPU inference and swapped, each in its
#     own process, interleaved, bit-checked), with the raw O_DIRECT rate and the ratio to
#     max(direct, io_bound); then serve with the threads scheduler, and the other hand-over
#     policies of managed blocks to a discrete GPU (SWAPNET_GPU_PREFETCH advise | prefetch | none).
# With time left after it, a second call on the same warm machine (it keeps build-gpu/ and the
# models; the machine goes back after 30 s idle) can rerun what failed: see bench/results/gpu.
# Results in $OUT (or .gpu-out/): gpu-check.log, gpu-check.md (the tables), gpu-check.json
# (every measured row), build-errors.txt (if any), detail.tar.gz (logs and the runs' JSON).
set -uo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
cd "$repo"
out=${OUT:-$repo/.gpu-out}
mkdir -p "$out"
detail=$(mktemp -d /tmp/gpu-check.XXXX)   # logs and JSON: detail.tar.gz
images=$repo/.cache/gpu-images  # swap images, read with O_DIRECT (not on a tmpfs), not brought back
mkdir -p "$images"
exec > >(tee "$out/gpu-check.log") 2>&1
py=${SWAPNET_PYTHON:-python3}
focus=${SWAPNET_GPU_CHECK_FOCUS:-}
reserve=240; [ -z "$focus" ] || reserve=150  # seconds kept for what follows the build
start=$(date +%s)
deadline=$((start + ${SWAPNET_GPU_CHECK_SECONDS:-520}))
left() { echo $((deadline - $(date +%s))); }
stamp() { echo "== [$(($(date +%s) - start)) s] $*"; }
status=0
results=()
verdict() {  # NAME OK(0/1) DETAIL
  local word=PASS
  if [ "$2" -ne 0 ]; then word=FAIL; status=1; fi
  echo "== $word: $1 ${3:-}"
  results+=("| $1 | $word | ${3:-} |")
}
rows=$detail/rows.jsonl
: > "$rows"
table=""
finish() {
  {
    echo "# gpu-check $(date -u +%F) on $(nvidia-smi -L 2>/dev/null | head -n 1)"
    echo
    echo "$machine"
    echo; echo "| check | result | detail |"; echo "|---|---|---|"; printf '%s\n' "${results[@]}"
    echo; printf '%b\n' "$table"
    # Transparent swapping on the GPU (preload.transparent writes these rows: SWAPNET_GPU_ROWS).
    "$py" - "$rows" <<'PY' || true
import json, sys
rows = []
for l in open(sys.argv[1]):
    try:
        rows.append(json.loads(l))
    except ValueError:
        pass
t = [r for r in rows if r.get("kind") == "transparent_gpu"]
if t:
    print("\n| unmodified program | model on the GPU by | equal | host peak RSS KiB without / with | GPU MiB in use without / with "
          "| peak allocated by PyTorch MiB without / with | swapnet-model |\n|---|---|---|---|---|---|---|")
    for r in t:
        print(f"| {r['program']} | {r['how']} | {r['equal']} | {r['rss_kb_without']} / {r['rss_kb_with']} | "
              f"{r['gpu_used_mb_without']} / {r['gpu_used_mb_with']} | {r['gpu_peak_allocated_mb_without']} / "
              f"{r['gpu_peak_allocated_mb_with']} | {r['stats']} |")
PY
  } > "$out/gpu-check.md"
  "$py" - "$rows" "$out/gpu-check.json" "$machine" <<'PY' || true
import json, sys
rows = []
for l in open(sys.argv[1]):
    try:
        rows.append(json.loads(l))
    except ValueError:
        if l.strip():
            rows.append({"kind": "unreadable_row", "text": l.strip()})
json.dump({"machine": sys.argv[3], "rows": rows}, open(sys.argv[2], "w"), indent=1)
PY
  tar -czf "$out/detail.tar.gz" -C "$detail" . 2>/dev/null
  cat "$out/gpu-check.md"
  exit $status
}

# ---- 0. the machine ------------------------------------------------------------------------
stamp machine
machine=$( {
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>&1 | sed 's/^/- GPU: /'
  "$py" -c 'import torch; print("- torch", torch.__version__, "CUDA", torch.version.cuda, "available", torch.cuda.is_available())' 2>&1
  echo "- $(nvcc --version 2>&1 | tail -n 2 | head -n 1)"
  echo "- $(cmake --version | head -n 1); $(c++ --version | head -n 1); kernel $(uname -r); $(nproc) CPUs"
  echo "- disk of $repo: $(df -h "$repo" | tail -n 1 | awk '{print $1, $2}')"
} )
echo "$machine"

# ---- 1. build ------------------------------------------------------------------------------
stamp build
prefix=/tmp/swapnet-deps
if ! ls .gpu-deps/*.deb >/dev/null 2>&1; then
  echo "no .gpu-deps/*.deb: run scripts/gpu-deps.sh where apt works and carry .gpu-deps"; exit 2
fi
for f in .gpu-deps/*.deb; do dpkg -x "$f" "$prefix"; done
arch_lib=$(ls -d "$prefix"/usr/lib/*-linux-gnu | head -n 1)
torch_prefix=$("$py" -c 'import torch; print(torch.utils.cmake_prefix_path)')
torch_lib=$("$py" -c 'import torch, os; print(os.path.join(os.path.dirname(torch.__file__), "lib"))')
export LD_LIBRARY_PATH="$arch_lib:$torch_lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
models=${SWAPNET_GPU_MODELS:-$repo/.cache/models-gpu}
build=${SWAPNET_GPU_BUILD:-$repo/build-gpu}
# SWAPNET_GPU_CHECK_DRY=1: the script's own dry run on any machine, with an existing build
# (SWAPNET_GPU_BUILD) and models (SWAPNET_GPU_MODELS), no ctest: every GPU check then fails.
dry=${SWAPNET_GPU_CHECK_DRY:-}
[ -n "$dry" ] || cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DSWAPNET_WITH_CUDA=ON -DSWAPNET_GPU_TESTS=ON \
  -DCMAKE_PREFIX_PATH="$torch_prefix;$prefix/usr" -DSWAPNET_MODEL_DIR="$models" \
  -DSWAPNET_TEST_PYTHON="$(command -v "$py")" > "$detail/configure.log" 2>&1
rc=$?
[ -n "$dry" ] || tail -n 15 "$detail/configure.log"
if [ $rc -ne 0 ]; then
  cp "$detail/configure.log" "$out/build-errors.txt"
  verdict "configure against the pip libtorch" 1 "see build-errors.txt"; finish
fi
[ -n "$dry" ] || timeout $(( $(left) - reserve )) cmake --build "$build" -j "$(nproc)" -- -k 0 > "$detail/build.log" 2>&1
rc=$?
touch "$detail/build.log"
grep -E ": error|^FAILED:" -A 4 "$detail/build.log" | head -n 400 > "$out/build-errors.txt"
[ -s "$out/build-errors.txt" ] || rm -f "$out/build-errors.txt"
tail -n 5 "$detail/build.log"
verdict "build against the pip libtorch (-DSWAPNET_WITH_CUDA=ON)" $rc "$(grep -c ': error' "$detail/build.log") errors"
cli=$build/swapnet
if [ ! -x "$build/swapnet-cli" ]; then finish; fi
if [ -n "${SWAPNET_GPU_CHECK_BUILD_ONLY:-}" ]; then finish; fi
export SWAPNET_PROFILE=$detail/device.json
shape() { case "$1" in yolov3) echo 1,3,416,416 ;; *) echo 1,3,224,224 ;; esac; }
pack() {  # NAME -> the image's path
  local im=$images/$1.swapnet
  [ -f "$im" ] || "$cli" pack "$models/$1.pt" -o "$im" --input-shape "$(shape "$1")" > "$detail/pack-$1.log" 2>&1
  echo "$im"
}
data_bytes() { "$cli" inspect "$1" --json | "$py" -c 'import json,sys; print(json.load(sys.stdin)["data_bytes"])'; }

# SWAPNET_GPU_CHECK_FOCUS=arch: only issue 47's latency table (after the cell() definition below).
if [ "$focus" != arch ]; then
# ---- 2. tests, while the paper models are exported -----------------------------------------
stamp models
# The tests need the small, bad and zoo sets, and gpu.* resnet101 (run 2 started them while it
# was still being exported): those first, the rest behind the tests (focus: no zoo tests).
first="small bad resnet101 zoo"; [ -z "$focus" ] || first="small bad resnet101"
SWAPNET_PYTHON=$py SWAPNET_MODELS=$models bash scripts/models.sh $first > "$detail/models-small.log" 2>&1 ||
  { tail -n 20 "$detail/models-small.log"; verdict "export the small models with the pip torch" 1; }
paper="yolov3 vgg19"; [ -z "$focus" ] || paper="yolov3"
(SWAPNET_PYTHON=$py SWAPNET_MODELS=$models bash scripts/models.sh $paper > "$detail/models-paper.log" 2>&1) &
export_pid=$!
# A crash prints its stack (tests/crash_trace.cpp): one gtest binary, alone.
"$build/tests/image_test" --gtest_filter='Image.RoundTripsTablesAndAlignment' > "$detail/crash.log" 2>&1
rc=$?
grep -A 40 '\*\*\* crash' "$detail/crash.log" | head -n 45
verdict "a gtest binary exits cleanly (image_test, one test)" $rc "exit status $rc"
stamp ctest
# Two threads per test, as on the 2-core CI machine: 8 tests at once with 16 OpenMP threads
# each made CPU tests time out (first run). Two passes: first the tests of what a GPU changes
# (gpu.*, the preload, Python, run, serve, the executor's), then the rest; run 3 ran one pass in
# number order, and its time ran out with the preload's and Python's tests not started.
gpu_first='^gpu\.|^preload\.|^python\.|^run\.|^serve\.small$|^Executor(/|$)'
ctest_pass() {  # NAME CAP ARGS...: one ctest pass, its log in $out/ctest-NAME.log
  local name=$1 cap=$2; shift 2
  [ "$cap" -gt 20 ] || { verdict "ctest $name" 1 "NOT RUN: out of device time"; return; }
  [ -n "$dry" ] || OMP_NUM_THREADS=2 SWAPNET_EXPECT_GPU=1 SWAPNET_GPU_ROWS=$rows timeout "$cap" ctest --test-dir "$build" "$@" -j 8 \
    --output-on-failure --timeout 150 --output-junit "$detail/ctest-$name.xml" > "$detail/ctest-$name.log" 2>&1
  local rc=$?
  touch "$detail/ctest-$name.log"
  grep -E "Failed|\*\*\*|Timeout|tests passed|tests failed" "$detail/ctest-$name.log" | tail -n 40
  cp "$detail/ctest-$name.log" "$out/ctest-$name.log"
  local done_n
  done_n=$(grep -cE 'Test +#[0-9]+: ' "$detail/ctest-$name.log")
  verdict "ctest $name pass with SWAPNET_EXPECT_GPU=1" $rc \
    "$(grep -E 'tests passed|tests failed' "$detail/ctest-$name.log" | tail -n 1)${done_n:+; $done_n finished}$([ -s "$detail/ctest-$name.log" ] && grep -q 'tests passed\|tests failed' "$detail/ctest-$name.log" || echo '; cut by the deadline')"
}
if [ -z "$focus" ]; then
  ctest_pass gpu-first $(( $(left) - 330 )) -LE "model|package" -R "$gpu_first"
  ctest_pass rest $(( $(left) - 170 )) -LE "model|package" -E "$gpu_first"
else
  ctest_pass gpu-first 150 -LE "model|zoo|package" -R '^gpu\.|^preload\.|^python\.|^run\.|^serve\.small$'
fi
stamp "waiting for the paper models"
wait $export_pid || { tail -n 20 "$detail/models-paper.log"; verdict "export resnet101, yolov3, vgg19" 1; }

# ---- 3. host-to-device copies ----------------------------------------------------------------
stamp copies
hook=$build/tests/libcuda_copy_count.so
h2d() { grep -o 'cuda-copies: h2d=[0-9]*' | tail -n 1 | sed 's/.*=//'; }  # from stderr
copies() { LD_PRELOAD=$hook timeout 60 "$cli" run "$@" 2>&1 >/dev/null | h2d; }
copy_models="resnet101 yolov3"; [ -z "$focus" ] || copy_models=resnet101
for name in $copy_models; do
  im=$(pack $name); third=$(( $(data_bytes "$im") / 3 ))
  s1=$(copies "$im" --budget "$third" --device cuda --mode swapnet --iters 1)
  s11=$(copies "$im" --budget "$third" --device cuda --mode swapnet --iters 11)
  d1=$(copies "$im" --budget "$third" --device cuda --mode direct --iters 1)
  echo "$name h2d copies: swapnet 1 inference $s1, 11 inferences $s11; direct (control) $d1"
  echo "{\"kind\": \"h2d\", \"model\": \"$name\", \"swapnet_1\": \"$s1\", \"swapnet_11\": \"$s11\", \"direct_1\": \"$d1\"}" >> "$rows"
  verdict "$name: positive control, direct GPU inference shows its weight copies" $([ "${d1:-0}" -gt 50 ]; echo $?) "h2d=$d1"
  verdict "$name: swapped GPU inference adds no host-to-device copies (10 more inferences)" \
    $([ -n "$s1" ] && [ "$s1" = "$s11" ]; echo $?) "h2d: $s1 after 1, $s11 after 11"
done
prog=$build/tests/torch_program
p0=$(LD_PRELOAD=$hook "$prog" "$models/resnet18.pt" --to-cuda 2>&1 >/dev/null | h2d)
p1=$(LD_PRELOAD="$build/libswapnet_preload.so $hook" "$prog" "$models/resnet18.pt" --to-cuda 2>&1 >/dev/null | h2d)
echo "{\"kind\": \"h2d_preload\", \"program\": \"torch_program --to-cuda\", \"without\": \"$p0\", \"with\": \"$p1\"}" >> "$rows"
verdict "unmodified C++ program: .to(cuda) of a managed tensor copies nothing" \
  $([ -n "$p0" ] && [ -n "$p1" ] && [ "$p1" -eq $((p0 - 1)) ]; echo $?) "h2d without preload $p0, with $p1 (the fp16 one stays)"
pyprog='import torch
m = torch.jit.load(__import__("sys").argv[1])
ps = [p.to("cuda") for p in m.parameters()]
x = torch.ones(1, 3, 64, 64)
print("max_abs_diff_gpu_vs_cpu", (m(x) - m.to("cuda")(x.to("cuda")).cpu()).abs().max().item())'
q0=$(LD_PRELOAD=$hook "$py" -c "$pyprog" "$models/resnet18.pt" 2>&1 | tee "$detail/py-nopreload.log" | h2d)
q1=$(LD_PRELOAD="$build/libswapnet_preload.so $hook" SWAPNET_ALLOC_STATS=1 "$py" -c "$pyprog" "$models/resnet18.pt" 2>&1 |
     tee "$detail/py-preload.log" | h2d)
echo "{\"kind\": \"h2d_preload\", \"program\": \"python .to(cuda) of resnet18's parameters\", \"without\": \"$q0\", \"with\": \"$q1\"}" >> "$rows"
verdict "unmodified Python program: .to(cuda) of resnet18's parameters under the preload" \
  $([ -n "$q1" ] && [ -n "$q0" ] && [ "$q1" -lt "$q0" ]; echo $?) "h2d without preload $q0, with $q1; $(grep -h '^max_abs\|backend=' "$detail/py-preload.log" | tr '\n' ' ')"

fi  # not arch

# ---- 4. latency at 1/2 and 1/3 -----------------------------------------------------------------
table="| model | budget | hand-over | direct GPU ms | swapnet GPU ms | ratio | raw MB/s | MB/s while busy | io_bound ms | vs max(direct, io_bound) | blocks | equal |\n|---|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---|"
cell() {  # NAME FRACTION [HANDOVER ROUNDS ITERS]
  local name=$1 frac=$2 how=${3:-host} rounds=${4:-3} iters=${5:-10} im b j rc
  # SWAPNET_EMULATE_READ set by the caller: a constant-rate disk (no bursts), in the row's name.
  local ra=${SWAPNET_GPU_READ_AHEAD:-ring}
  local tag=${SWAPNET_EMULATE_READ:+-emu${SWAPNET_EMULATE_READ//\//}}${SWAPNET_GPU_LEARN:+-learn$SWAPNET_GPU_LEARN}-$ra
  local label="$how${SWAPNET_EMULATE_READ:+, disk emulated at $SWAPNET_EMULATE_READ}${SWAPNET_GPU_LEARN:+, costs learned (--learn $SWAPNET_GPU_LEARN)}, read-ahead $ra"
  im=$(pack "$name"); b=$(( $(data_bytes "$im") / frac ))
  run_cell() {  # at $b, into $j and its .err; sets rc
    j=$detail/$name-1of$frac-$how$tag.json
    # shellcheck disable=SC2086
    SWAPNET_GPU_PREFETCH=$how timeout 120 "$cli" run "$im" --budget "$b" --device cuda --compare --check --rounds "$rounds" \
      --iters "$iters" --read-ahead "$ra" ${SWAPNET_GPU_LEARN:+--learn $SWAPNET_GPU_LEARN} --json > "$j" 2> "${j%.json}.err"
    rc=$?
  }
  run_cell
  # Below the model's minimum on the GPU (run 3: vgg19's 392 MiB fc6 stayed whole, its parts
  # differing on that machine's CPU, so its minimum was 438.5 MiB, 80 % of the model): once more
  # at 5 % above that minimum, and the row says so.
  local least
  least=$(grep -o 'the minimum for this model is [0-9]* bytes' "${j%.json}.err" | grep -o '[0-9][0-9]*' | head -n 1)
  if [ $rc -ne 0 ] && [[ $least =~ ^[0-9]+$ ]]; then
    b=$(( least * 105 / 100 )); frac="$frac-raised-to-min"
    run_cell
  fi
  row=$("$py" - "$name" "$b" "$frac" "$j" "$rows" "$label" <<'PY'
import json, sys
name, b, frac, path, rows, how = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4], sys.argv[5], sys.argv[6]
j = json.load(open(path))
d = j["direct"]["latency_ms"]["median"]
s = j["latency_ms"]["median"]
open(rows, "a").write(json.dumps({"kind": "latency", "model": name, "fraction": f"1/{frac}", "budget": b, "handover": how.split(",")[0],
    "read_ahead": j.get("read_ahead"),
    "disk": how.split("emulated at ")[-1].split(",")[0] if "emulated" in how else "the machine's",
    "direct_ms": d, "swapnet_ms": s, "ratio_vs_direct": j.get("ratio_vs_direct"), "raw_io_mb_s": j.get("raw_io_mb_s"),
    "io_bound_ms": j.get("io_bound_ms"), "ratio_vs_bound": j.get("ratio_vs_bound"), "blocks": j.get("num_blocks"),
    "equal": j.get("equal"), "memory": j.get("memory"), "bytes_read_per_inference": j.get("bytes_read_per_inference"),
    "disk_mb_s_while_busy": (j.get("pipeline") or {}).get("disk_mb_s_while_busy"), "learning": j.get("learning"),
    # Note [Ring space behind the kernels]: how busy the disk was, and the bytes given back by layer.
    "pipeline": {k: (j.get("pipeline") or {}).get(k) for k in ("disk_busy_fraction", "released_early_bytes", "layers_started_early")}}) + "\n")
busy = (j.get("pipeline") or {}).get("disk_mb_s_while_busy") or 0
print(f"| {name} | 1/{frac} ({b / 2**20:.1f} MiB) | {how} | {d:.2f} | {s:.2f} | {j.get('ratio_vs_direct', 0):.3f} | "
      f"{j.get('raw_io_mb_s', 0):.0f} | {busy:.0f} | {j.get('io_bound_ms', 0):.2f} | {j.get('ratio_vs_bound', 0):.3f} | {j.get('num_blocks')} | {j.get('equal')} |")
PY
2>/dev/null)
  [ -n "$row" ] || { tail -n 5 "${j%.json}.err"; row="| $name | 1/$frac | $label | run failed (rc $rc): $(grep -h error "${j%.json}.err" | head -n 1) |"; }
  table="$table\n$row"
  verdict "$name --device cuda at 1/$frac ($label): runs, bit-identical to direct GPU inference" $rc "$row"
}
# ---- SWAPNET_GPU_CHECK_FOCUS=arch: issue 47's table -----------------------------------------------
# Architectures of different shapes (many small layers, few big ones, depthwise, branches,
# attention-like blocks) at 1/3 and 1/2 of their weights, on the machine's disk and on a disk
# emulated at a constant rate, each cell bit-checked against direct GPU inference, the disk's
# rate while busy beside it. More cells than one call's time holds: the order is the rates, then
# the fractions, then the models; what the deadline cuts is listed as NOT RUN, so that the next
# call can start there (SWAPNET_GPU_ARCH_RATES, _FRACTIONS, _MODELS).
if [ "$focus" = arch ]; then
  arch_models=${SWAPNET_GPU_ARCH_MODELS:-"resnet101 vgg19 yolov3 convnext_tiny densenet121 efficientnet_b0 inception_v3"}
  stamp "models: $arch_models"
  # shellcheck disable=SC2086
  SWAPNET_PYTHON=$py SWAPNET_MODELS=$models bash scripts/models.sh $arch_models > "$detail/models-arch.log" 2>&1 ||
    { tail -n 20 "$detail/models-arch.log"; verdict "export $arch_models" 1; }
  for rate in ${SWAPNET_GPU_ARCH_RATES:-host 2GB/s 1GB/s}; do
    for frac in ${SWAPNET_GPU_ARCH_FRACTIONS:-3 2}; do
      for name in $arch_models; do
        for ra in ${SWAPNET_GPU_ARCH_PIPELINES:-ring}; do
          [ "$(left)" -gt 40 ] || { results+=("| $name 1/$frac, disk $rate, $ra | NOT RUN | out of device time |"); continue; }
          stamp "latency $name 1/$frac, disk $rate, read-ahead $ra"
          if [ "$rate" = host ]; then
            SWAPNET_GPU_READ_AHEAD=$ra cell "$name" "$frac" host 3 10
          else
            SWAPNET_GPU_READ_AHEAD=$ra SWAPNET_EMULATE_READ=$rate SWAPNET_PROFILE=$detail/device-${rate//\//}.json \
              cell "$name" "$frac" host 2 5
          fi
        done
      done
    done
  done
  stamp done
  finish
fi

# ---- 5. the deadline scheduler with GPU models (issue 16's dispatcher, a budget cut) ------------
serve_gpu() {  # SCHEDULER
  local sc=$detail/gpu_slo.json j=$detail/serve-gpu-$1.json
  cat > "$sc" <<JSON
{"name": "gpu-slo", "description": "resnet101 and yolov3 on the GPU at 40 % of their size, frames every 250 ms due by the next; the budget cut to 33 % at 10 s",
 "total_budget": "40%", "policy": "paper", "scheduler": "$1", "workers": 2, "duration_s": 20,
 "models": [
  {"name": "resnet101", "image": "$(pack resnet101)", "device": "cuda", "threads": 2, "period_ms": 250, "jitter_ms": 10, "slo_ms": 250},
  {"name": "yolov3", "image": "$(pack yolov3)", "device": "cuda", "threads": 2, "period_ms": 250, "jitter_ms": 10, "slo_ms": 250}],
 "schedule": [{"at_s": 10, "budget": "33%"}]}
JSON
  timeout 90 "$cli" serve "$sc" --socket none --json > "$j" 2> "$detail/serve-gpu-$1.err"
  local rc=$?
  local row
  row=$("$py" - "$j" "$rows" "$1" 2>&1 <<'PY'
import json, sys
try:
    j = json.load(open(sys.argv[1]))
except ValueError:
    print("no JSON (the error is in the log)")
    sys.exit(1)
ms = j.get("models", [])
open(sys.argv[2], "a").write(json.dumps({"kind": "serve", "scheduler": sys.argv[3], "slo_met": j.get("slo_met"),
    "models": [{k: m.get(k) for k in ("name", "device", "requests", "slo_met", "dropped", "latency_ms", "equal",
    "budget_bytes", "peak_model_bytes", "over_budget", "blocks")} for m in ms],
    "adaptations": j.get("adaptations"), "peak_model_bytes_sum": j.get("peak_model_bytes_sum")}) + "\n")
print(f"slo_met {j.get('slo_met')}; " + "; ".join(f"{m.get('name')}: {m.get('requests')} requests, median "
      f"{m.get('latency_ms', {}).get('median')} ms, met {m.get('slo_met')}, dropped {m.get('dropped')}, equal {m.get('equal')}" for m in ms))
sys.exit(0 if ms and all(m.get("equal") is True and (m.get("requests") or 0) > (m.get("dropped") or 0) for m in ms) else 1)
PY
)
  local eq=$?
  echo "serve $1 on the GPU: $row"
  tail -n 5 "$detail/serve-gpu-$1.err"
  verdict "serve: resnet101 + yolov3 on cuda, deadlines, budget cut ($1 scheduler)" \
    $([ $rc -eq 0 ] && [ $eq -eq 0 ]; echo $?) "rc $rc; $row"
}
for sched in lst; do
  [ -z "$focus" ] || break
  [ "$(left)" -gt 60 ] || { results+=("| serve $sched | NOT RUN | out of device time |"); continue; }
  stamp "serve $sched"; serve_gpu $sched
done

# The default hand-over (host) on every cell, each bit-checked against direct GPU inference;
# then the deadline scheduler with GPU models; then the other hand-over policies (Note [Managed
# memory on a discrete GPU]) on resnet101 at 1/3: run 2 measured them, and two lose data.
for spec in "resnet101 3" "yolov3 3" "vgg19 3" "resnet101 2" "yolov3 2"; do
  [ -z "$focus" ] || [ "${spec%% *}" != vgg19 ] || continue
  [ "$(left)" -gt 40 ] || { results+=("| $spec | NOT RUN | out of device time |"); continue; }
  stamp "latency $spec"; cell $spec
  # The two-block ring the GPU used before its ring was deep, beside it (Note [Swapping onto the GPU]).
  if [ "$spec" = "resnet101 3" ] && [ "$(left)" -gt 40 ]; then
    stamp "latency $spec, two-ended"; SWAPNET_GPU_READ_AHEAD=two-ended cell $spec
  fi
done

# A disk of constant rate, Jetson-class (SWAPNET_EMULATE_READ: the reader paces its reads; Note
# [An emulated disk] in swapcore/src/emulated_disk.cpp): the VM's disk bursts above the raw rate measured
# beside each run (run 3: 1.2-1.3x), which made the ratios to the bound read below 1. Planned
# with a profile measured at that rate.
for rate in 1GB/s 400MB/s; do
  [ -z "$focus" ] || break
  [ "$(left)" -gt 60 ] || { results+=("| resnet101 1/3 at $rate | NOT RUN | out of device time |"); continue; }
  stamp "latency resnet101 3, disk emulated at $rate"
  SWAPNET_EMULATE_READ=$rate SWAPNET_PROFILE=$detail/device-${rate//\//}.json cell resnet101 3 host 3 5
done

for sched in threads; do
  [ -z "$focus" ] || break
  [ "$(left)" -gt 60 ] || { results+=("| serve $sched | NOT RUN | out of device time |"); continue; }
  stamp "serve $sched"; serve_gpu $sched
done

for how in advise prefetch none; do
  [ "$(left)" -gt 40 ] || { results+=("| resnet101 1/3 $how | NOT RUN | out of device time |"); continue; }
  stamp "hand-over $how"; cell resnet101 3 "$how" 2 5
done
stamp done
finish
