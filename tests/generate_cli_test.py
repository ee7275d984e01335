#!/usr/bin/python3
"""A GPT-style decoder end to end (models/gpt.py, gpt_small): forward(tokens, cache) ->
(logits, cache) with int64 token ids and a KV cache that starts empty.

- verify is bit-identical with an empty cache (a zero-size dimension) and with a full one;
- pack records the example input as the image's input profile (--input-profile adds more);
- run --check is bit-identical at the minimum budget;
- dynamic shapes (Note [Dynamic shapes] in assembly/src/input_meter.cpp): run with an input longer
  than the one packed measures it within the budget (remeasured_inputs 1), bit-identical, under
  budget; an input the budget cannot hold is refused with the numbers;
- swapnet generate (Note [Generation] in cli/cmd_generate.cpp) at half of the model: token
  ids identical to in-memory generation in every mode, weights read per token, peak within the
  budget; the final context measured before timing; a budget too small for the cache refused.

  generate_cli_test.py SWAPNET_CLI gpt_small.pt WORKDIR
"""
import json
import os
import sys

from cli_test_util import Checks, run

CACHE = "float32[4,2,1,4,{},32]"  # gpt_small: 4 layers, keys and values, batch 1, 4 heads, 32 per head


def main() -> int:
    cli, model, work = sys.argv[1:4]
    os.makedirs(work, exist_ok=True)
    checks = Checks()
    expect = checks.expect

    for inputs, what in [(["int64[1,16]:0..1000", CACHE.format(0)], "a prompt with an empty cache"),
                         (["int64[1,1]:0..1000", CACHE.format(23)], "one token with 23 cached")]:
        rc, out, err = run(cli, "verify", model, *sum((["--input", s] for s in inputs), []), "--json")
        j = json.loads(out) if rc == 0 and out else {}
        expect(rc == 0 and j.get("equal") is True, f"verify, {what}: exit {rc}, {err[-400:]}")

    img = os.path.join(work, "gpt_small.swapnet")
    rc, out, err = run(cli, "pack", model, "-o", img, "--input", "int64[1,16]:0..1000", "--input", CACHE.format(0))
    expect(rc == 0, f"pack: exit {rc}: {err[-300:]}")
    if rc != 0:
        return checks.exit_status("generate")
    info = json.loads(run(cli, "inspect", img, "--json")[1])
    profiles = info.get("input_profiles", [])
    expect(len(profiles) == 1 and profiles[0]["inputs"] == "int64[1,16] float32[4,2,1,4,0,32]"
           and profiles[0]["activation_bytes"] == info["activation_bytes"], f"recorded profile: {profiles}")
    data = info["data_bytes"]
    rc, out, err = run(cli, "run", img, "--budget", "4096", "--iters", "1")
    least = int(err.split("the minimum for this model is ")[1].split()[0]) if "minimum for this model" in err else 0
    expect(least > 0, f"minimum: {err[-300:]}")
    # Half the model: a quarter of this small one leaves too little for a 64-token prompt's
    # activations (the logits alone are 64 x 1000 floats).
    budget = max(data // 2, least)

    rc, out, err = run(cli, "run", img, "--budget", str(least), "--check", "--iters", "2", "--json")
    j = json.loads(out) if rc == 0 and out else {}
    expect(rc == 0 and j.get("equal") is True and j.get("remeasured_inputs") == 0,
           f"run --check at the minimum: exit {rc}, remeasured {j.get('remeasured_inputs')}: {err[-300:]}")

    # A longer prompt than packed: measured in the warm-up within the budget, then planned with.
    longer = ["--input", "int64[1,64]:0..1000", "--input", CACHE.format(0)]
    rc, out, err = run(cli, "run", img, "--budget", str(budget), *longer, "--check", "--iters", "2", "--json")
    j = json.loads(out) if rc == 0 and out else {}
    expect(rc == 0 and j.get("equal") is True, f"run a longer input: exit {rc}: {err[-300:]}")
    expect(j.get("remeasured_inputs") == 1 and j.get("activation_reserve_bytes", 0) > info["activation_bytes"],
           f"longer input measured: remeasured {j.get('remeasured_inputs')}, reserve {j.get('activation_reserve_bytes')} "
           f"vs packed {info['activation_bytes']}")
    expect(0 < j.get("peak_model_bytes", 1 << 62) <= budget, f"longer input peak {j.get('peak_model_bytes')} > {budget}")
    # One the budget cannot hold: refused, with the budget and what it leaves.
    rc, out, err = run(cli, "run", img, "--budget", str(least), "--input", "int64[64,127]:0..1000", "--input",
                       "float32[4,2,64,4,0,32]", "--iters", "1")
    expect(rc == 2 and "needs more activations than the budget " + str(least) in err and "after the least weights" in err,
           f"input too large for the budget: exit {rc}: {err[-400:]}")

    # Generation at half of the model, every mode: ids identical to in-memory generation.
    gen = ["--prompt-tokens", "8", "--new-tokens", "12", "--json"]
    for mode in ["swapnet", "naive", "direct"]:
        rc, out, err = run(cli, "generate", img, "--budget", str(budget), "--mode", mode, *gen)
        j = json.loads(out) if rc == 0 and out else {}
        expect(rc == 0 and j.get("equal") is True and len(j.get("tokens", [])) == 12,
               f"generate --mode {mode}: exit {rc}, equal {j.get('equal')}: {err[-400:]}")
        if mode == "direct":
            continue
        expect(j.get("tokens_per_s", 0) > 0 and j.get("time_to_first_token_ms", 0) > 0, f"{mode} rates: {j}")
        expect(j.get("bytes_read_per_token", 0) > 0, f"{mode} reads weights per token: {j.get('bytes_read_per_token')}")
        # Both within the budget: naive's buffer and copy of a block too (Note [An honest naive path]).
        expect(j.get("peak_model_bytes", 1 << 62) <= budget, f"generate --mode {mode} peak {j.get('peak_model_bytes')} > {budget}")
        if mode == "swapnet":
            expect(j.get("remeasured_inputs") == 1, f"the final context measured once: {j.get('remeasured_inputs')}")
            expect(j.get("bytes_read_per_token", 1 << 62) <= data, f"read per token {j.get('bytes_read_per_token')} > model")
    # The final context recorded when packing (--input-profile): nothing measured at run time.
    img2 = os.path.join(work, "gpt_small_profiles.swapnet")
    rc, out, err = run(cli, "pack", model, "-o", img2, "--input", "int64[1,16]:0..1000", "--input", CACHE.format(0),
                       "--input-profile", "int64[1,1]:0..1000 " + CACHE.format(64))
    expect(rc == 0, f"pack --input-profile: exit {rc}: {err[-300:]}")
    if rc == 0:
        info2 = json.loads(run(cli, "inspect", img2, "--json")[1])
        expect(len(info2.get("input_profiles", [])) == 2, f"two profiles: {info2.get('input_profiles')}")
        rc, out, err = run(cli, "generate", img2, "--budget", str(budget), *gen)
        j = json.loads(out) if rc == 0 and out else {}
        expect(rc == 0 and j.get("equal") is True and j.get("remeasured_inputs") == 0,
               f"generate with the final context packed: exit {rc}, remeasured {j.get('remeasured_inputs')}: {err[-300:]}")
    # A budget the growing cache cannot fit in: refused before any token, naming the cache.
    rc, out, err = run(cli, "generate", img, "--budget", str(least), "--prompt-tokens", "4", "--new-tokens", "124")
    expect(rc == 2 and "the KV cache of 127 tokens" in err and "does not fit" in err,
           f"cache too large: exit {rc}: {err[-400:]}")
    # Not a decoder: a clear error.
    rc, out, err = run(cli, "generate", img, "--budget", str(budget), "--new-tokens", "0")
    expect(rc == 2 and "--new-tokens 0" in err, f"--new-tokens 0: exit {rc}: {err[-300:]}")
    return checks.exit_status("generate")


if __name__ == "__main__":
    sys.exit(main())
