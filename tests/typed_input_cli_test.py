#!/usr/bin/python3
"""Typed inputs end to end (--input SPEC, Note [Input specs] in assembly/src/inputs.cpp) on a model
random float tensors cannot run: token_classifier (int64 token ids into an embedding, an
optional mask). verify is bit-identical with int64 ids and None, with a bool mask, with a
zero-size batch and with inputs from files (torch.save and .npy); pack records the specs and run
--check uses them; bad specs are refused naming the spec and what is wrong.

With a second model, transformer_encoder (nn.TransformerEncoder taking its attention mask and
padding mask as optional arguments): verify with both masks and with none, pack with a float
mask, run --check, bit-identical.

  typed_input_cli_test.py SWAPNET_CLI token_classifier.pt WORKDIR [transformer_encoder.pt]
"""
import json
import os
import sys

import numpy as np
import torch

from cli_test_util import Checks, run


def main() -> int:
    cli, model, work = sys.argv[1:4]
    os.makedirs(work, exist_ok=True)
    checks = Checks()
    expect = checks.expect
    tokens = ["--input", "int64[2,16]:0..1000"]

    def verify(*inputs, what):
        rc, out, err = run(cli, "verify", model, *inputs, "--json")
        j = json.loads(out) if rc == 0 and out else {}
        expect(rc == 0 and j.get("equal") is True and j.get("max_abs_diff") == 0, f"verify {what}: exit {rc}, {err[-400:]}")

    verify(*tokens, "--input", "none", what="int64 ids and None")
    verify(*tokens, "--input", "bool[2,16]", what="a bool mask")
    verify("--input", "int64[0,16]:0..1000", "--input", "none", what="a zero-size batch")
    ids = os.path.join(work, "tokens.pt")
    mask = os.path.join(work, "mask.npy")
    torch.save(torch.randint(0, 1000, (3, 7)), ids)
    np.save(mask, np.ones((3, 7), dtype=np.float32))
    verify("--input", "@" + ids, "--input", "@" + mask, what="inputs from torch.save and .npy files")
    # The float shorthand cannot feed an embedding: a clear error, not a crash.
    rc, out, err = run(cli, "verify", model, "--input-shape", "2,16")
    expect(rc == 2 and "swapnet: error:" in err, f"float ids: exit {rc}, {err[-300:]}")

    # pack records the specs; run uses them, bit-identical to direct inference.
    img = os.path.join(work, "token_classifier.swapnet")
    rc, out, err = run(cli, "pack", model, "-o", img, *tokens, "--input", "none")
    expect(rc == 0, f"pack: exit {rc}: {err[-300:]}")
    if rc == 0:
        info = json.loads(run(cli, "inspect", img, "--json")[1])
        expect(info.get("input_shapes") == "int64[2,16]:0..1000 none", f"recorded specs: {info.get('input_shapes')!r}")
        budget = max(info["data_bytes"] // 3, 1)
        rc, out, err = run(cli, "run", img, "--budget", str(budget), "--iters", "1")
        if rc == 2 and "below the minimum" in err:
            budget = int(err.split("the minimum for this model is ")[1].split()[0])
        rc, out, err = run(cli, "run", img, "--budget", str(budget), "--check", "--iters", "2", "--json")
        j = json.loads(out) if rc == 0 and out else {}
        expect(rc == 0 and j.get("equal") is True, f"run --check: exit {rc}: {err[-300:]}")
        expect(j.get("num_blocks", 0) >= 2, f"swapped in blocks: {j.get('num_blocks')}")
        expect(j.get("peak_model_bytes", 1 << 62) <= budget, f"peak {j.get('peak_model_bytes')} > budget {budget}")

    spaced = os.path.join(work, "with space.pt")
    torch.save(torch.randint(0, 1000, (2, 16)), spaced)
    rc, out, err = run(cli, "pack", model, "-o", os.path.join(work, "x.swapnet"), "--input", "@" + spaced, "--input", "none")
    expect(rc == 2 and "may not contain one" in err and not os.path.exists(os.path.join(work, "x.swapnet")),
           f"pack with a spaced path: exit {rc}, {err[-300:]}")

    # Bad specs: the spec named, and what is wrong with it.
    for spec, says in [("int65[2,16]", "dtype 'int65' is not one of"),
                       ("float32[2,16]:0..5", "a range is for integer and bool dtypes"),
                       ("int64[2,16]:5..5", "is empty"),
                       ("int64[2,16]:a..5", "'a' is not an integer"),
                       ("int64[2,16", "no ']'"),
                       ("int64[2,-1]", "'-1' is not a non-negative integer"),
                       ("@" + os.path.join(work, "missing.pt"), "cannot open"),
                       ("@" + model, "neither a .npy array nor a file torch.save wrote")]:
        rc, out, err = run(cli, "verify", model, "--input", spec, "--input", "none")
        expect(rc == 2 and f"input '{spec}'" in err and says in err, f"spec {spec!r}: exit {rc}, {err[-300:]}")
    rc, out, err = run(cli, "verify", model, "--input", "int64[2,16]", "--input-shape", "2,16")
    expect(rc == 2, f"--input with --input-shape: exit {rc}")

    if len(sys.argv) > 4:
        enc = sys.argv[4]
        x = ["--input", "float32[2,10,64]"]
        for inputs, what in [(x + ["--input", "none", "--input", "none"], "no masks"),
                             (x + ["--input", "float32[10,10]", "--input", "none"], "an attention mask"),
                             (x + ["--input", "none", "--input", "bool[2,10]:0..1"], "a padding mask of False"),
                             (x + ["--input", "float32[10,10]", "--input", "bool[2,10]:0..1"], "both masks")]:
            rc, out, err = run(cli, "verify", enc, *inputs, "--json")
            j = json.loads(out) if rc == 0 and out else {}
            expect(rc == 0 and j.get("equal") is True, f"encoder verify, {what}: exit {rc}, {err[-300:]}")
        eimg = os.path.join(work, "transformer_encoder.swapnet")
        rc, out, err = run(cli, "pack", enc, "-o", eimg, *x, "--input", "float32[10,10]", "--input", "none")
        expect(rc == 0, f"encoder pack: exit {rc}: {err[-300:]}")
        if rc == 0:
            rc, out, err = run(cli, "run", eimg, "--budget", "4096", "--iters", "1")
            least = int(err.split("the minimum for this model is ")[1].split()[0]) if "minimum for this model" in err else 0
            expect(least > 0, f"encoder minimum: {err[-300:]}")
            rc, out, err = run(cli, "run", eimg, "--budget", str(least), "--check", "--iters", "2", "--json")
            j = json.loads(out) if rc == 0 and out else {}
            expect(rc == 0 and j.get("equal") is True, f"encoder run --check: exit {rc}: {err[-300:]}")
    return checks.exit_status("typed inputs")


if __name__ == "__main__":
    sys.exit(main())
