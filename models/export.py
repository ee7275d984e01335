#!/usr/bin/python3
"""Writes swapnet's evaluation and test models as TorchScript files with deterministic random
weights (no downloads): `export.py --out DIR SET_OR_NAME...`.

Sets: small (CI: resnet18, mobilenet_v2, synthetic, typed-input models, gpt_small), llm
(gpt_350m, for the generation bench), paper (resnet101, vgg19, fcn_resnet101,
yolov3), zoo (other architecture families, at small sizes, to test generality), bad (files that
must be refused with a clear error). Files already present with the same recipe are kept.
Each model is exported with torch.jit.script in eval mode; batch-norm statistics are
randomised too so that buffers matter to the output. DIR/manifest.json lists name -> input shape.
Run with Debian's /usr/bin/python3 (python3-torch, python3-torchvision).
"""
import argparse
import hashlib
import json
import os
import sys
import tempfile
from typing import Optional

import torch
from torch import nn

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import gpt  # noqa: E402
import synthetic  # noqa: E402
import textgen  # noqa: E402
import yolov3  # noqa: E402

RECIPE_VERSION = 1


def tv():
    import torchvision.models as m
    return m


def small_vit():
    from torchvision.models.vision_transformer import VisionTransformer
    return VisionTransformer(image_size=32, patch_size=8, num_layers=2, num_heads=2,
                             hidden_dim=64, mlp_dim=128, num_classes=10)


def small_swin():
    from torchvision.models.swin_transformer import SwinTransformer
    return SwinTransformer(patch_size=[4, 4], embed_dim=24, depths=[2, 2], num_heads=[2, 4],
                           window_size=[4, 4], num_classes=10)


class Stateful(nn.Module):
    """Counts its calls in an attribute: forward changes module state (prim::SetAttr)."""

    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4, 4)
        self.calls = 0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.calls += 1
        return self.fc(x)


class InplaceWeight(nn.Module):
    """Scales its own weight in place during forward: weights would change between runs."""

    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.fc.weight.mul_(1.0)
        return self.fc(x)


class TokenClassifier(nn.Module):
    """Token ids in (int64) and an optional mask: a model random float inputs cannot run
    (typed inputs: --input int64[2,16]:0..1000 --input none, or a bool mask)."""

    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(1000, 64)
        self.fc1 = nn.Linear(64, 256)
        self.fc2 = nn.Linear(256, 256)
        self.out = nn.Linear(256, 10)

    def forward(self, tokens: torch.Tensor, mask: Optional[torch.Tensor] = None) -> torch.Tensor:
        h = self.emb(tokens)
        if mask is not None:
            h = h * mask.unsqueeze(-1).to(h.dtype)
        h = torch.relu(self.fc1(h.mean(dim=1)))
        return self.out(torch.relu(self.fc2(h)))


class MaskedEncoder(nn.Module):
    """nn.TransformerEncoder with its optional masks as forward arguments (typed inputs: a float
    attention mask, a bool padding mask, or none for either)."""

    def __init__(self):
        super().__init__()
        layer = nn.TransformerEncoderLayer(d_model=64, nhead=4, dim_feedforward=128, batch_first=True)
        self.enc = nn.TransformerEncoder(layer, num_layers=3, enable_nested_tensor=False)

    def forward(self, x: torch.Tensor, mask: Optional[torch.Tensor] = None,
                padding: Optional[torch.Tensor] = None) -> torch.Tensor:
        return self.enc(x, mask=mask, src_key_padding_mask=padding)


class Recurrent(nn.Module):
    """A 2-layer LSTM (or bidirectional GRU) and a linear head: the fused kernels take the
    module's _flat_weights, a list of tensors (Note [Tensor lists] in assembly/src/skeleton_lift.cpp)."""

    def __init__(self, kind: str):
        super().__init__()
        if kind == "lstm":
            self.rnn = nn.LSTM(32, 64, num_layers=2, batch_first=True)
            self.head = nn.Linear(64, 8)
        else:
            self.rnn = nn.GRU(32, 64, num_layers=2, batch_first=True, bidirectional=True)
            self.head = nn.Linear(128, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y, _ = self.rnn(x)
        return self.head(torch.relu(y))


class SmallConvBN(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3)
        self.bn = nn.BatchNorm2d(4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(self.bn(self.conv(x)))


# name -> (constructor, input shape, how to export: script | trace | script-train)
MODELS = {
    # small: run in CI
    "resnet18": (lambda: tv().resnet18(weights=None), [1, 3, 224, 224], "script"),
    "mobilenet_v2": (lambda: tv().mobilenet_v2(weights=None), [1, 3, 224, 224], "script"),
    "synthetic": (synthetic.Branchy, [2, 3, 16, 16], "script"),
    "resnet18_traced": (lambda: tv().resnet18(weights=None), [1, 3, 64, 64], "trace"),
    # typed inputs (int64 token ids, an optional mask): its "shape" is the input specs
    "token_classifier": (TokenClassifier, ["int64[2,16]:0..1000", "none"], "script"),
    "transformer_encoder": (MaskedEncoder, ["float32[2,10,64]", "float32[10,10]", "none"], "script"),
    "lstm": (lambda: Recurrent("lstm"), [2, 12, 32], "script"),
    "gru": (lambda: Recurrent("gru"), [2, 12, 32], "script"),
    # decoder-only transformers, forward(tokens, cache) -> (logits, cache) (swapnet generate):
    # the prompt with an empty KV cache
    "gpt_small": (gpt.small, ["int64[1,16]:0..1000", "float32[4,2,1,4,0,32]"], "script"),
    "gpt_350m": (gpt.medium, ["int64[1,32]:0..50257", "float32[24,2,1,16,0,64]"], "script"),
    # trained decoder pairs for speculative decoding (models/textgen.py): target and draft
    **{name: (ctor, [f"int64[1,16]:0..{textgen.vocab_size()}", textgen.cache_spec(pair, which)], "script")
       for pair in textgen.SIZES
       for name, ctor, which in ((pair, (lambda p=pair: textgen.target(p)), "target"),
                                 (pair + "_draft", (lambda p=pair: textgen.draft(p)), "draft"))},
    # paper: the four models the design is evaluated on
    "resnet101": (lambda: tv().resnet101(weights=None), [1, 3, 224, 224], "script"),
    "vgg19": (lambda: tv().vgg19(weights=None), [1, 3, 224, 224], "script"),
    "fcn_resnet101": (lambda: tv().segmentation.fcn_resnet101(weights=None, weights_backbone=None,
                                                              aux_loss=True),
                      [1, 3, 224, 224], "script"),
    "yolov3": (yolov3.YOLOv3, [1, 3, 416, 416], "script"),
    # zoo: other families, small inputs
    "densenet121": (lambda: tv().densenet121(weights=None), [1, 3, 64, 64], "script"),
    "googlenet": (lambda: tv().googlenet(weights=None, aux_logits=False, init_weights=True),
                  [1, 3, 64, 64], "script"),
    "inception_v3": (lambda: tv().inception_v3(weights=None, aux_logits=False, init_weights=True),
                     [1, 3, 96, 96], "script"),
    "squeezenet1_1": (lambda: tv().squeezenet1_1(weights=None), [1, 3, 64, 64], "script"),
    "shufflenet_v2": (lambda: tv().shufflenet_v2_x0_5(weights=None), [1, 3, 64, 64], "script"),
    "mnasnet0_5": (lambda: tv().mnasnet0_5(weights=None), [1, 3, 64, 64], "script"),
    "mobilenet_v3_small": (lambda: tv().mobilenet_v3_small(weights=None), [1, 3, 64, 64], "script"),
    "efficientnet_b0": (lambda: tv().efficientnet_b0(weights=None), [1, 3, 64, 64], "script"),
    "regnet_y_400mf": (lambda: tv().regnet_y_400mf(weights=None), [1, 3, 64, 64], "script"),
    "convnext_tiny": (lambda: tv().convnext_tiny(weights=None), [1, 3, 64, 64], "script"),
    "vit_small": (small_vit, [2, 3, 32, 32], "script"),
    "swin_small": (small_swin, [1, 3, 32, 32], "script"),
    "lraspp_mobilenet_v3": (lambda: tv().segmentation.lraspp_mobilenet_v3_large(
        weights=None, weights_backbone=None), [1, 3, 64, 64], "script"),
    "deeplabv3_mobilenet_v3": (lambda: tv().segmentation.deeplabv3_mobilenet_v3_large(
        weights=None, weights_backbone=None, aux_loss=True), [1, 3, 64, 64], "script"),
    # bad: must be refused
    "bad_stateful": (Stateful, [1, 4], "script"),
    "bad_inplace_weight": (InplaceWeight, [1, 4], "script"),
    # saved in training mode: swapnet runs it in eval mode and says so
    "train_mode": (SmallConvBN, [1, 3, 8, 8], "script-train"),
}

SETS = {
    "small": ["resnet18", "mobilenet_v2", "synthetic", "resnet18_traced", "token_classifier",
              "transformer_encoder", "lstm", "gru", "gpt_small", "textgen_small", "textgen_small_draft"],
    "llm": ["gpt_350m", "textgen", "textgen_draft"],
    "paper": ["resnet101", "vgg19", "fcn_resnet101", "yolov3"],
    "zoo": ["densenet121", "googlenet", "inception_v3", "squeezenet1_1", "shufflenet_v2",
            "mnasnet0_5", "mobilenet_v3_small", "efficientnet_b0", "regnet_y_400mf",
            "convnext_tiny", "vit_small", "swin_small", "lraspp_mobilenet_v3",
            "deeplabv3_mobilenet_v3"],
    "bad": ["bad_stateful", "bad_inplace_weight", "bad_noforward", "bad_notscript", "train_mode"],
}


def seed_for(name: str) -> int:
    return int(hashlib.sha256(name.encode()).hexdigest()[:8], 16)


def randomise_buffers(model: nn.Module, gen: torch.Generator) -> None:
    for mod in model.modules():
        if isinstance(mod, nn.modules.batchnorm._BatchNorm) and mod.running_mean is not None:
            mod.running_mean.copy_(torch.randn(mod.running_mean.shape, generator=gen) * 0.1)
            mod.running_var.copy_(torch.rand(mod.running_var.shape, generator=gen) + 0.5)


def atomic_save(write, path: str) -> None:
    fd, tmp = tempfile.mkstemp(dir=os.path.dirname(path), prefix="tmp-", suffix=".partial")
    os.close(fd)
    try:
        write(tmp)
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    except BaseException:
        os.unlink(tmp)
        raise


def export(name: str, out: str) -> dict:
    path = os.path.join(out, name + ".pt")
    if name == "bad_noforward":
        atomic_save(lambda p: torch.jit.ScriptModule().save(p), path)
        return {"input_shape": [1, 4]}
    if name == "bad_notscript":
        atomic_save(lambda p: open(p, "wb").write(b"this is not a TorchScript archive\n" * 8), path)
        return {"input_shape": [1, 4]}
    ctor, shape, how = MODELS[name]
    torch.manual_seed(seed_for(name))
    model = ctor().eval()
    randomise_buffers(model, torch.Generator().manual_seed(seed_for(name) + 1))
    with torch.no_grad():
        if how == "trace":
            scripted = torch.jit.trace(model, torch.randn(shape))
        else:
            scripted = torch.jit.script(model)
    scripted.eval()
    if how == "script-train":
        scripted.train()
    atomic_save(lambda p: scripted.save(p), path)
    if name in textgen.SIZES:  # the ids' text, for a reader of generated tokens
        atomic_save(lambda p: open(p, "w").write(json.dumps(textgen.vocab_strings()) + "\n"),
                    os.path.join(out, name + "_vocab.json"))
    params = sum(p.numel() for p in model.parameters())
    state_bytes = sum(t.numel() * t.element_size() for t in model.state_dict().values())
    return {"input_shape": shape, "parameters": params, "state_bytes": state_bytes}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", required=True, help="cache directory for the .pt files")
    ap.add_argument("names", nargs="+", help="set names (small, paper, zoo, bad) or model names")
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    names = []
    for n in args.names:
        names += SETS.get(n, [n])
    unknown = [n for n in names if n not in MODELS and not n.startswith("bad_")]
    if unknown:
        print(f"export.py: unknown model(s): {', '.join(unknown)}; known: "
              f"{', '.join(sorted(MODELS))}", file=sys.stderr)
        return 2
    manifest_path = os.path.join(args.out, "manifest.json")
    manifest = {}
    if os.path.exists(manifest_path):
        with open(manifest_path) as f:
            manifest = json.load(f)
    # One intra-op thread: on the 2-core VM textgen_small's 40 training steps took 6.0 s at two
    # threads and 2.6 s at one (small ops; the threads' hand-offs cost more than they share), and
    # the test sets (small bad zoo) 62 s -> 40 s, 109 -> 61 CPU-s. It also makes the trained
    # models the same on machines with other core counts.
    torch.set_num_threads(1)
    textgen.teacher_dir = args.out
    for n in names:
        path = os.path.join(args.out, n + ".pt")
        entry = manifest.get(n)
        recipe = textgen.recipe(n, RECIPE_VERSION)
        if entry and entry.get("recipe") == recipe and os.path.exists(path):
            continue
        print(f"export.py: writing {path}", file=sys.stderr, flush=True)
        entry = export(n, args.out)
        entry["recipe"] = recipe
        manifest[n] = entry
        atomic_save(lambda p: open(p, "w").write(json.dumps(manifest, indent=1) + "\n"),
                    manifest_path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
