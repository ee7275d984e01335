#!/usr/bin/python3
"""swapnet generate --draft (Note [Speculative decoding] in assembly/src/speculate.cpp) with the
trained CI pair of models/textgen.py (textgen_small and its distilled draft):

- at half of the target's weights, the draft held in memory: token ids identical to plain greedy
  generation by the target in memory, the draft's proposals partly kept, more than one token per
  pass of the target, fewer bytes read per token than plain swapped generation, and the peak
  (target's weights, the draft, activations and both caches) within the one budget;
- a fixed --speculate K never proposes more than K; a TorchScript draft (with --draft-state)
  gives the same tokens; --prompt-text and --vocab-file turn text into ids and back;
- refused with clear errors: a budget the draft alone fills, --speculate without --draft or out
  of range, a TorchScript draft without its state, a draft of another vocabulary.

  speculate_cli_test.py SWAPNET_CLI MODEL_DIR WORKDIR
"""
import json
import os
import sys

from cli_test_util import Checks, run

TARGET_CACHE = "float32[2,2,1,4,0,32]"  # textgen_small: 2 layers, 4 heads of 32
DRAFT_CACHE = "float32[1,2,1,2,0,32]"   # its draft: 1 layer, 2 heads of 32
PROMPT = "This License applies to any program or other work"


def main() -> int:
    cli, models, work = sys.argv[1:4]
    os.makedirs(work, exist_ok=True)
    checks = Checks()
    expect = checks.expect
    vocab_file = os.path.join(models, "textgen_small_vocab.json")
    with open(vocab_file) as f:
        vocab = len(json.load(f))
    target = os.path.join(work, "target.swapnet")
    draft = os.path.join(work, "draft.swapnet")
    for pt, img, cache in [("textgen_small.pt", target, TARGET_CACHE), ("textgen_small_draft.pt", draft, DRAFT_CACHE)]:
        rc, _, err = run(cli, "pack", os.path.join(models, pt), "-o", img, "--input", f"int64[1,16]:0..{vocab}",
                         "--input", cache)
        expect(rc == 0, f"pack {pt}: exit {rc}: {err[-300:]}")
    if checks.failures:
        return checks.exit_status("speculate")
    data = json.loads(run(cli, "inspect", target, "--json")[1])["data_bytes"]
    draft_bytes = json.loads(run(cli, "inspect", draft, "--json")[1])["data_bytes"]
    budget = data // 2 + 2 * draft_bytes  # about half the target, once the draft's share is taken out
    gen = ["--new-tokens", "48", "--vocab-file", vocab_file, "--prompt-text", PROMPT, "--json"]

    def generate(*extra, budget=budget):
        rc, out, err = run(cli, "generate", target, "--budget", str(budget), *gen, *extra)
        return rc, (json.loads(out) if rc == 0 and out else {}), err

    rc, j, err = generate("--draft", draft)
    # Plain generation with the target's share of the budget: what the draft's bytes buy instead.
    target_budget = j.get("target_budget_bytes", budget)
    expect(target_budget < data, f"the target's share {target_budget} holds all of it ({data})")
    rc_plain, plain, err_plain = generate(budget=target_budget)
    expect(rc_plain == 0 and plain.get("equal") is True, f"plain generation: exit {rc_plain}: {err_plain[-300:]}")
    expect(rc == 0 and j.get("equal") is True and j.get("first_difference") == -1,
           f"speculative: exit {rc}, equal {j.get('equal')}, first difference {j.get('first_difference')}: {err[-300:]}")
    expect(j.get("tokens") == plain.get("tokens") and j.get("text") == plain.get("text") and j.get("text"),
           f"speculative tokens {j.get('tokens')} vs plain {plain.get('tokens')}")
    expect(0 < j.get("accepted", 0) <= j.get("proposed", 0), f"proposals kept: {j.get('accepted')} of {j.get('proposed')}")
    expect(j.get("tokens_per_pass", 0) > 1, f"tokens per pass {j.get('tokens_per_pass')}")
    expect(0 < j.get("bytes_read_per_token", 0) < plain.get("bytes_read_per_token", 0),
           f"bytes read per token: {j.get('bytes_read_per_token')} speculative vs {plain.get('bytes_read_per_token')} plain")
    expect(0 < j.get("peak_model_bytes", 1 << 62) <= budget,
           f"peak {j.get('peak_model_bytes')} (draft {j.get('draft_bytes')}) > budget {budget}")
    expect(j.get("draft_bytes") == draft_bytes and j.get("target_budget_bytes", budget) < budget,
           f"the draft's share: draft {j.get('draft_bytes')}, target's budget {j.get('target_budget_bytes')} of {budget}")

    rc, j, err = generate("--draft", draft, "--speculate", "3")
    expect(rc == 0 and j.get("equal") is True and max(j.get("pass_k", [9])) <= 3 and j.get("speculate") == "3",
           f"--speculate 3: exit {rc}, k {j.get('pass_k')}: {err[-300:]}")
    pt_draft = os.path.join(models, "textgen_small_draft.pt")
    rc, j, err = generate("--draft", pt_draft, "--draft-state", DRAFT_CACHE)
    expect(rc == 0 and j.get("tokens") == plain.get("tokens") and j.get("accepted", 0) > 0,
           f"a TorchScript draft: exit {rc}: {err[-300:]}")

    refusals = [
        (["--draft", draft, "--budget", str(draft_bytes)], "nothing is left for the target"),
        (["--speculate", "4", "--budget", str(budget)], "--speculate 4 needs --draft"),
        (["--draft", draft, "--speculate", "0", "--budget", str(budget)], "give auto or a number of tokens from 1 to 64"),
        (["--draft", pt_draft, "--budget", str(budget)], "--draft-state"),
    ]
    gpt_small = os.path.join(models, "gpt_small.pt")
    if os.path.exists(gpt_small):  # another vocabulary (1000)
        refusals.append((["--draft", gpt_small, "--draft-state", "float32[4,2,1,4,0,32]", "--budget", "64MiB"],
                         "the draft's vocabulary"))
    for extra, words in refusals:
        rc, out, err = run(cli, "generate", target, *gen[:-1], *extra)
        expect(rc == 2 and words in err, f"{' '.join(extra)}: exit {rc}, expected '{words}': {err[-300:]}")
    return checks.exit_status("speculate")


if __name__ == "__main__":
    sys.exit(main())
