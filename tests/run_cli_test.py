#!/usr/bin/python3
"""`swapnet run` end to end for one model: pack, then run at a third of the model's bytes (or
its minimum budget, if larger) with --check: outputs bit-identical to direct inference, peak
model memory within the budget, no page-cache growth beyond 1 MiB, more than one block; a
budget below the minimum is refused with the minimum stated; --mode naive and direct work;
for resnet18, --compare reports the ratios and both bounds (physical <= reserve, reserve >= least reads);
--device cuda says what is missing where there is no CUDA libtorch or GPU (SWAPNET_EXPECT_GPU=1,
as scripts/gpu-check.sh sets: it runs, bit-identical to direct GPU inference, within the budget).

The checks of the modes and options themselves (naive's and the paper read-ahead's minimums,
direct, --device) are the same code for every model: they run for synthetic and resnet18, and
--device cuda for every model where a GPU is expected. Every model gets pack, the minimum, and
run --check at a third (docs/testing.md).

  run_cli_test.py SWAPNET_CLI MODEL.pt INPUT_SHAPE WORKDIR
"""
import json
import os
import re
import sys

from cli_test_util import prepare, run


def main() -> int:
    cli, model, shape, work, name, img, checks = prepare(sys.argv)
    expect = checks.expect

    rc, out, err = run(cli, "pack", model, "-o", img, "--input-shape", shape)
    if rc != 0:
        print(err, file=sys.stderr)
        return 1
    info = json.loads(run(cli, "inspect", img, "--json")[1])
    # Ask for a budget that is surely too small to learn the minimum from the message.
    rc, out, err = run(cli, "run", img, "--budget", "4096", "--iters", "1")
    m = re.search(r"the minimum for this model is (\d+) bytes", err)
    expect(rc == 2 and m is not None, f"tiny budget: exit {rc}, {err!r}")
    minimum = int(m.group(1)) if m else 0
    budget = max(info["data_bytes"] // 3, minimum)
    rc, out, err = run(cli, "run", img, "--budget", str(budget), "--check", "--iters", "2", "--json")
    expect(rc == 0, f"run --check exit {rc}: {err}")
    if rc == 0:
        j = json.loads(out)
        print(json.dumps({k: j[k] for k in ("budget_bytes", "num_blocks", "peak_model_bytes", "latency_ms",
                                             "page_cache_growth_bytes", "bytes_read_per_inference", "equal")}))
        expect(j["equal"] is True, "outputs differ from direct inference")
        expect(j["peak_model_bytes"] <= budget, f"peak {j['peak_model_bytes']} > budget {budget}")
        expect(j["page_cache_growth_bytes"] < (1 << 20), f"page cache grew {j['page_cache_growth_bytes']}")
        expect(j["num_blocks"] >= 2 or budget >= info["data_bytes"], "expected swapping at a third")
        # The command shortens OpenBLAS's idle poll unless the user set it (Note [OpenBLAS's idle
        # spin] in cli/launcher.cpp).
        user = os.environ.get("OPENBLAS_THREAD_TIMEOUT")
        if user is not None or "GOTO_THREAD_TIMEOUT" not in os.environ:
            want = user if user is not None else "4"
            expect(j.get("openblas_thread_timeout") == want,
                   f"openblas_thread_timeout {j.get('openblas_thread_timeout')!r}, expected {want!r}")
    if name == "resnet18":
        # --learn-store (Note [Learned costs kept]): needs --learn; the JSON says what was read
        # and written; a file that is not a store is said and the run goes on.
        store = os.path.join(work, "learned.json")
        rc, out, err = run(cli, "run", img, "--budget", str(budget), "--iters", "1", "--learn-store", store)
        expect(rc == 2 and "--learn-store" in err and "needs --learn" in err, f"--learn-store alone: exit {rc}, {err!r}")
        with open(store, "w") as f:
            f.write("[1, 2")
        rc, out, err = run(cli, "run", img, "--budget", str(budget), "--iters", "1", "--learn", "3", "--learn-store",
                           store, "--json")
        expect(rc == 0, f"--learn 3 --learn-store: exit {rc}: {err}")
        if rc == 0:
            lj = json.loads(out)["learning"]
            expect(lj["loaded_times"] is False and lj["loaded_rate"] is False and lj["stored"] == lj["replans"]
                   and 0 <= lj["kept_plans"] <= lj["replans"], f"--learn-store learning: {lj}")
            expect("not used" in err and store in err, f"a store that is not one is said: {err[-400:]!r}")
        # A user's own OPENBLAS_THREAD_TIMEOUT is left as it is.
        rc, out, err = run(cli, "run", img, "--mode", "direct", "--iters", "1", "--json",
                           env={"OPENBLAS_THREAD_TIMEOUT": "28"})
        expect(rc == 0 and json.loads(out).get("openblas_thread_timeout") == "28",
               f"the user's OPENBLAS_THREAD_TIMEOUT=28: exit {rc}, {out[:200]!r} {err[-300:]!r}")
        # The benchmark path: every mode in its own process, the ratios and the two bounds.
        rc, out, err = run(cli, "run", img, "--budget", str(budget), "--compare", "--rounds", "1", "--iters", "1",
                           "--check", "--json")
        expect(rc == 0, f"run --compare exit {rc}: {err}")
        if rc == 0:
            j = json.loads(out)
            pb, rb = j["physical_bound_ms"], j["reserve_bound_ms"]
            least = j["min_read_bytes"] / (j["raw_io_mb_s"] * 1e3)
            print(json.dumps({k: j[k] for k in ("io_bound_ms", "physical_bound_ms", "reserve_bound_ms", "ratio_vs_bound",
                                                 "ratio_vs_reserve_bound")}))
            expect(j["equal"] is True and j["peak_model_bytes"] <= budget, "--compare: outputs or peak")
            expect(pb >= j["direct"]["latency_ms"]["median"] - 1e-6 and rb >= pb - 1e-6 and rb >= least - 1e-6,
                   f"bounds: physical {pb}, reserve {rb}, least reads {least}, direct {j['direct']['latency_ms']}")
            expect(abs(j["ratio_vs_reserve_bound"] * rb - j["latency_ms"]["median"]) < 1e-6 * rb,
                   "ratio_vs_reserve_bound is swapnet / reserve_bound")
            # The rate the disk gave swapnet's reads while in flight (a bursting disk beats the raw rate).
            busy = j["pipeline"]["disk_mb_s_while_busy"]
            expect(isinstance(busy, (int, float)) and busy > 0, f"pipeline.disk_mb_s_while_busy: {busy!r}")
            for mode in ("direct", "naive"):
                if "page_cache_growth_bytes" in j[mode]:
                    expect(j[mode]["page_cache_growth_bytes"] < (1 << 20), f"{mode} left page cache behind")
        # --trace writes the timed inferences' timeline; bench/trace_summary.py reads it.
        trace = os.path.join(work, "trace.json")
        rc, out, err = run(cli, "run", img, "--budget", str(budget), "--iters", "2", "--trace", trace, "--json")
        expect(rc == 0 and os.path.getsize(trace) > 0, f"run --trace exit {rc}: {err[-300:]}")
        summary = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "bench", "trace_summary.py")
        rc, out, err = run(sys.executable, summary, trace, "--json")
        expect(rc == 0, f"trace_summary.py exit {rc}: {err[-300:]}")
        if rc == 0:
            s = json.loads(out)[0]
            expect(len(s["inferences"]) == 2 and s["mean"]["compute_ms"] > 0 and s["mean"]["disk_busy_ms"] > 0,
                   f"trace summary: {s['mean']}, {len(s['inferences'])} inferences")
        rc, out, err = run(cli, "run", img, "--mode", "direct", "--iters", "1", "--trace", trace)
        expect(rc == 2 and "mode swapnet only" in err, f"--trace with direct: exit {rc}, {err!r}")
        # The CUDA backend's pipeline on the CPU (Note [The CUDA backend's host twin]): the GPU's
        # ring (deep, its blocks handed back once their kernels are done), layers timed and costs
        # learned through the backend: bit-identical, within the budget, costs learned.
        twin = {"SWAPNET_DEVICE_TWIN": "cuda"}
        rc, out, err = run(cli, "run", img, "--budget", "4096", "--iters", "1", env=twin)
        m = re.search(r"the minimum for this model is (\d+) bytes", err)
        expect(rc == 2 and m is not None and "the largest layer" in err, f"twin, tiny budget: exit {rc}, {err!r}")
        tb = max(budget, int(m.group(1)) if m else 0)
        rc, out, err = run(cli, "run", img, "--budget", str(tb), "--check", "--iters", "4", "--learn", "3", "--json",
                           env=twin)
        expect(rc == 0, f"twin: run --check exit {rc}: {err[-400:]}")
        if rc == 0:
            j = json.loads(out)
            print("twin:", json.dumps({k: j.get(k) for k in ("read_ahead", "num_blocks", "peak_model_bytes", "equal")}),
                  json.dumps({k: j["learning"].get(k) for k in ("windows", "replans", "measured_layers_ms")}))
            expect(j["equal"] is True and 0 < j["peak_model_bytes"] <= tb, f"twin: outputs or peak {j['peak_model_bytes']} > {tb}")
            expect(j.get("read_ahead") == "ring" and j["num_blocks"] >= 2, f"twin: {j.get('read_ahead')}, {j['num_blocks']} blocks")
            expect(j["learning"]["windows"] >= 1 and j["learning"]["measured_layers_ms"] > 0, f"twin learning: {j['learning']}")
            expect("SWAPNET_DEVICE_TWIN=cuda" in err, "twin: said")
        # On a disk slower than the CPU's compute (Note [Layer by layer]): layers start before their
        # block has landed whole, the ring gets a block's first layers' bytes back behind their
        # "kernels" (Note [Ring space behind the kernels]; the two-block ring gives nothing back
        # early), and the activation reserve is not lent (not metered on a GPU); and the two-block
        # ring asked for by name (for comparison) runs layer by layer too.
        # (40 MB/s: reads well behind the layers also under ASan, where at 150 MB/s every piece
        # had landed by the time its layer ran.)
        slow = dict(twin, SWAPNET_EMULATE_READ="40MB/s")
        rc, out, err = run(cli, "run", img, "--budget", "4096", "--read-ahead", "two-ended", "--iters", "1", env=twin)
        m = re.search(r"the minimum for this model is (\d+) bytes \([^:]*: the two largest adjacent layers", err)
        expect(rc == 2 and m is not None, f"twin, two-ended, tiny budget: exit {rc}, {err!r}")
        # Four equal blocks (each far above a 2 MiB piece, whatever the layer times measured at
        # pack: under ASan the optimal plan's blocks were too small to be read in pieces) in
        # three quarters of the model.
        for ra in ("ring", "two-ended"):
            b = max(tb, info["data_bytes"] * 3 // 4, int(m.group(1)) if m and ra == "two-ended" else 0)
            rc, out, err = run(cli, "run", img, "--budget", str(b), "--blocks", "4", "--check", "--iters", "2",
                               "--read-ahead", ra, "--json", env=slow)
            expect(rc == 0, f"twin, slow disk, {ra}: run --check exit {rc}: {err[-400:]}")
            if rc == 0:
                j = json.loads(out)
                p = j["pipeline"]
                print(f"twin, slow disk, {ra}:", json.dumps({k: p.get(k) for k in ("layers_started_early", "released_early_bytes",
                                                                                   "zone_bytes", "read_wait_ms")}))
                # (Asked for the ring, the planner may still take two blocks at its two ends where
                # they are predicted faster; the ring itself is checked above.)
                expect(j["equal"] is True and 0 < j["peak_model_bytes"] <= b and
                       j["read_ahead"] in ((ra, "two-ended") if ra == "ring" else (ra,)),
                       f"twin, slow disk, {ra}: outputs, peak {j['peak_model_bytes']} > {b} or {j['read_ahead']}")
                early = p["released_early_bytes"] > 0 if j["read_ahead"] == "ring" else p["released_early_bytes"] == 0
                expect(p["layers_started_early"] > 0 and early and p["zone_bytes"] == 0, f"twin, slow disk, {ra}: {p}")
    gpu = bool(os.environ.get("SWAPNET_EXPECT_GPU"))
    if name not in ("synthetic", "resnet18") and not gpu:
        print(f"{name}: budget {budget}, minimum {minimum}")
        return checks.exit_status(name)
    # naive holds a block twice (its read buffer and its copy): its minimum is twice the largest
    # layer + activations, above the ring's (the largest layer); below it, it is refused with its
    # own minimum, and at it, its buffer + copies + activations stay within the budget.
    rc, out, err = run(cli, "run", img, "--budget", "4096", "--mode", "naive", "--iters", "1")
    m = re.search(r"below naive's minimum (\d+) bytes \([^:]*: twice the largest layer", err)
    expect(rc == 2 and m is not None, f"naive, tiny budget: exit {rc}, {err!r}")
    naive_minimum = int(m.group(1)) if m else 0
    # (Also with a GPU: CPU runs read into host memory through the ring; on the H100 they had
    # used managed memory read two ahead, whose minimum equalled naive's.)
    expect(naive_minimum > minimum, f"naive's minimum {naive_minimum} not above the ring's {minimum}")
    for mode in ("naive", "direct"):
        b = max(budget, naive_minimum) if mode == "naive" else budget
        rc, out, err = run(cli, "run", img, "--budget", str(b), "--mode", mode, "--iters", "1", "--json")
        expect(rc == 0, f"--mode {mode}: exit {rc}: {err}")
        if rc == 0 and mode == "naive":
            j = json.loads(out)
            expect(0 < j["peak_model_bytes"] <= b, f"naive's peak {j['peak_model_bytes']} (buffer + copy) > budget {b}")
    # The paper's two-block pipeline needs the two largest adjacent layers.
    rc, out, err = run(cli, "run", img, "--budget", "4096", "--read-ahead", "paper", "--iters", "1")
    m = re.search(r"the minimum for this model is (\d+) bytes \([^:]*: the two largest adjacent layers", err)
    expect(rc == 2 and m is not None, f"paper read-ahead, tiny budget: exit {rc}, {err!r}")
    pair_minimum = int(m.group(1)) if m else 0
    budget = max(budget, pair_minimum)
    rc, out, err = run(cli, "run", img, "--budget", str(budget), "--device", "cuda", "--check", "--iters", "2", "--json")
    if gpu:
        expect(rc == 0, f"--device cuda: exit {rc}: {err}")
        if rc == 0:
            j = json.loads(out)
            print(json.dumps({k: j[k] for k in ("device", "memory", "num_blocks", "peak_model_bytes", "latency_ms", "equal")}))
            expect(j["equal"] is True and j["device"] == "cuda", "GPU outputs differ from direct GPU inference")
            expect(j["memory"] in ("managed", "registered"), f"GPU blocks in {j['memory']} memory")
            expect(j["peak_model_bytes"] <= budget, f"GPU peak {j['peak_model_bytes']} > budget {budget}")
    else:
        expect(rc == 2 and "--device cuda:" in err and ("no CUDA support" in err or "no usable CUDA device" in err),
               f"--device cuda without a GPU: exit {rc}, {err!r}")
    rc, out, err = run(cli, "run", img, "--budget", str(budget), "--device", "tpu")
    expect(rc == 2 and "--device 'tpu' is not one of cpu|cuda" in err, f"--device tpu: exit {rc}, {err!r}")
    print(f"{name}: budget {budget}, minimum {minimum}")
    return checks.exit_status(name)


if __name__ == "__main__":
    sys.exit(main())
