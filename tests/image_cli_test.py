#!/usr/bin/python3
"""End-to-end swap image test through the CLI, for one model:
pack -> check -> inspect (tables add up) -> verify --image (bit-identical to forward) ->
one flipped data byte: check fails naming the layer, verify --image refuses -> truncated copy:
check and inspect fail with "truncated" -> packing into a missing directory fails clearly.

The damaged copies test the image format and its checks, the same code for every model: they
run for the small models (convolutions, a traced module, recurrent layers), and the other
families get pack, check, inspect and verify --image (docs/testing.md).

  image_cli_test.py SWAPNET_CLI MODEL.pt INPUT_SHAPE WORKDIR
"""
DAMAGED_COPIES = {"synthetic", "resnet18", "mobilenet_v2", "resnet18_traced", "lstm", "gru"}
import json
import os
import shutil
import sys

from cli_test_util import prepare, run


def main() -> int:
    cli, model, shape, work, name, img, checks = prepare(sys.argv)
    expect = checks.expect

    rc, out, err = run(cli, "pack", model, "-o", img, "--input-shape", shape, "--json")
    expect(rc == 0, f"pack exit {rc}: {err}")
    if rc != 0:
        return 1
    packed = json.loads(out)
    print("pack:", packed)
    rc, out, err = run(cli, "check", img)
    expect(rc == 0, f"check of a fresh image exit {rc}: {err}")

    rc, out, err = run(cli, "inspect", img, "--json")
    expect(rc == 0, f"inspect image exit {rc}: {err}")
    ij = json.loads(out)
    rc, out, err = run(cli, "inspect", model, "--input-shape", shape, "--json", "--iters", "1")
    mj = json.loads(out)
    expect(ij["num_layers"] == mj["num_layers"], f"layers {ij['num_layers']} vs model {mj['num_layers']}")
    expect(ij["total_bytes"] == mj["module_bytes"], f"bytes {ij['total_bytes']} vs model {mj['module_bytes']}")
    expect(ij["total_tensors"] == mj["total_tensors"], "tensor counts differ")
    expect(ij["skeleton_bytes"] < 256 * 1024, f"skeleton is {ij['skeleton_bytes']} bytes")
    expect(all(l["offset"] % 4096 == 0 and l["size"] % 4096 == 0 for l in ij["layers"]), "unaligned layer")

    rc, out, err = run(cli, "verify", model, "--image", img, "--input-shape", shape, "--json")
    expect(rc == 0 and json.loads(out)["equal"] is True, f"verify --image: {out} {err}")

    if name not in DAMAGED_COPIES:
        return checks.exit_status(name)

    # Flip one byte in the middle of the largest layer.
    big = max(ij["layers"], key=lambda l: l["size"])
    bad = os.path.join(work, name + ".flipped.swapnet")
    shutil.copyfile(img, bad)
    with open(bad, "r+b") as f:
        f.seek(big["offset"] + big["size"] // 3)
        b = f.read(1)
        f.seek(-1, 1)
        f.write(bytes([b[0] ^ 0x10]))
    rc, out, err = run(cli, "check", bad)
    want = f"checksum mismatch in layer {big['index']} ({big['name']})"
    expect(rc == 1 and want in err, f"check of flipped copy: exit {rc}, stderr {err!r}, wanted {want!r}")
    rc, out, err = run(cli, "verify", model, "--image", bad, "--input-shape", shape)
    expect(rc == 2 and want in err, f"verify --image of flipped copy: exit {rc}, stderr {err!r}")

    trunc = os.path.join(work, name + ".truncated.swapnet")
    shutil.copyfile(img, trunc)
    os.truncate(trunc, os.path.getsize(img) - 4096)
    for cmd in (["check", trunc], ["inspect", trunc]):
        rc, out, err = run(cli, *cmd)
        expect(rc == 2 and "truncated" in err and trunc in err, f"{cmd[0]} of truncated copy: exit {rc}, {err!r}")

    rc, out, err = run(cli, "pack", model, "-o", os.path.join(work, "no", "such", "dir.swapnet"),
                       "--input-shape", shape)
    expect(rc == 2 and "cannot create a temporary file" in err, f"pack into missing dir: exit {rc}, {err!r}")

    for p in (bad, trunc):
        os.unlink(p)
    return checks.exit_status(name)


if __name__ == "__main__":
    sys.exit(main())
