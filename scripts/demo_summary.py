#!/usr/bin/python3
"""The demo's last screen (scripts/demo.sh): what a newcomer came for, from the files the demo
wrote: the model's size, the budget, peak memory with and without swapnet, latency against direct
inference and against the physical bound, bit-identical or not. Where gnuplot is installed, also
a plot of the model's memory over an inference, swapped (from `swapnet run --trace`) against
direct (every weight held throughout), with the budget: DIR/memory.png.

  demo_summary.py DIR MODEL BUDGET_TEXT
DIR holds pack.json (swapnet pack --json), compare.json (swapnet run --compare --check --json)
and trace.json (swapnet run --trace).
"""
import json
import os
import shutil
import subprocess
import sys


def mib(b):
    return b / (1 << 20)


def weights_over_time(trace_path):
    """[(ms, bytes)] of the 'weights held' counter, and the span of the inferences, from the trace."""
    with open(trace_path) as f:
        events = json.load(f)["traceEvents"]
    points = [(e["ts"] / 1e3, e["args"]["value"]) for e in events if e.get("ph") == "C" and e.get("name") == "weights held"]
    points.sort()
    return points


def plot(out_dir, points, direct_bytes, budget_bytes):
    """DIR/memory.png by gnuplot; returns its path, or why not."""
    if not points:
        return None, "the trace has no 'weights held' counter"
    if shutil.which("gnuplot") is None:
        return None, "gnuplot is not installed (apt-get install gnuplot-nox draws it)"
    t0 = points[0][0]
    data = os.path.join(out_dir, "memory.dat")
    with open(data, "w") as f:
        for t, v in points:
            f.write(f"{t - t0:.3f} {mib(v):.3f}\n")
    png = os.path.join(out_dir, "memory.png")
    end = points[-1][0] - t0
    script = f"""
set terminal pngcairo size 900,420 font ",10"
set output "{png}"
set title "Model memory over two inferences: swapped vs direct"
set xlabel "time (ms)"
set ylabel "MiB"
set key outside right
set yrange [0:{mib(max(direct_bytes, budget_bytes)) * 1.15:.1f}]
set xrange [0:{max(end, 1):.1f}]
plot "{data}" using 1:2 with steps lw 2 title "swapnet: weights held", \\
     {mib(direct_bytes):.3f} with lines lw 2 dt 2 title "direct: every weight held", \\
     {mib(budget_bytes):.3f} with lines lw 1 lc rgb "red" title "budget (weights + activations)"
"""
    p = subprocess.run(["gnuplot"], input=script, capture_output=True, text=True)
    if p.returncode != 0:
        return None, f"gnuplot failed: {p.stderr.strip()[:200]}"
    return png, None


def main() -> int:
    out_dir, model, budget_text = sys.argv[1:4]
    with open(os.path.join(out_dir, "pack.json")) as f:
        pack = json.load(f)
    with open(os.path.join(out_dir, "compare.json")) as f:
        c = json.load(f)
    weights = pack["data_bytes"]
    budget = c["budget_bytes"]
    direct, swapped = c["direct"], c
    bound = c.get("physical_bound_ms")
    ms, direct_ms = c["latency_ms"]["median"], direct["latency_ms"]["median"]
    lines = [
        f"model        {model}: {mib(weights):.1f} MiB of weights in {pack['layers']} layers",
        f"budget       {budget_text} ({mib(budget):.1f} MiB, {100 * budget / weights:.0f} % of the weights)",
        f"peak memory  model {mib(swapped['peak_model_bytes']):.1f} MiB swapped vs {mib(direct['peak_model_bytes']):.1f} MiB direct"
        f" (weights + activations); process RSS {mib(swapped['peak_rss_bytes']):.0f} vs {mib(direct['peak_rss_bytes']):.0f} MiB",
        f"latency      {ms:.1f} ms swapped vs {direct_ms:.1f} ms direct = {ms / direct_ms:.2f}x"
        + (f"; the physical bound in this budget is {bound:.1f} ms ({ms / bound:.2f}x of it)" if bound else
           "; no physical bound (a layer does not fit the budget)"),
        f"outputs      {'bit-identical to direct inference: yes' if c.get('equal') is True else 'bit-identical: NO'}",
    ]
    try:
        png, why = plot(out_dir, weights_over_time(os.path.join(out_dir, "trace.json")), weights, budget)
    except (OSError, ValueError, KeyError) as e:
        png, why = None, f"the trace could not be read: {e}"
    lines.append(f"plot         {png}" if png else f"plot         none: {why}")
    width = max(len(l) for l in lines)
    print("=" * min(width, 100))
    print("\n".join(lines))
    print("=" * min(width, 100))
    return 0 if c.get("equal") is True and swapped["peak_model_bytes"] <= budget else 1


if __name__ == "__main__":
    sys.exit(main())
