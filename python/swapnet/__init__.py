"""swapnet for Python: run TorchScript models whose weights do not fit a memory budget.

    import torch, swapnet
    swapnet.pack("resnet101.pt", "resnet101.swapnet", [torch.randn(1, 3, 224, 224)])
    model = swapnet.Executor("resnet101.swapnet", budget="60MiB")
    y = model(x)                  # bit-identical to torch.jit.load("resnet101.pt")(x)
    model.budget = "40MiB"        # re-planned now; the next inference runs the new plan
    model.plan, model.stats       # blocks, resident blocks, bytes read, weights held, read wait

    rt = swapnet.Runtime({"det": "yolov3.swapnet", "seg": "fcn.swapnet"}, budget="300MiB")
    out = rt("det", x)            # from any thread; each model has its own worker
    rt.budget = "200MiB"          # every model moves between two blocks

The classes are TorchScript custom classes in libswapnet_torch.so ($SWAPNET_LIB, where
cmake --install put it, or the source tree's build/), loaded with torch.ops.load_library into the
process's libtorch: the same swapnet library the C++ programs and the CLI use.
"""
import glob
import json
import os
import re
import tempfile

import torch

__all__ = ["Error", "pack", "image_info", "Executor", "Runtime", "generate", "parse_size", "library_path"]


class Error(RuntimeError):
    """A swapnet error: the message names the file, the value and the limit."""


def _find_library():
    env = os.environ.get("SWAPNET_LIB")
    here = os.path.dirname(os.path.abspath(__file__))
    candidates = [env] if env else []
    try:  # installed by cmake --install, which records where the library went
        from ._installed import LIB as installed
        candidates.append(installed)
    except ImportError:
        pass
    # Installed under another prefix than configured (cmake --install --prefix): the libdir
    # above lib/python3.X/dist-packages/swapnet.
    candidates += glob.glob(os.path.join(here, "..", "..", "..", "libswapnet_torch.so"))
    candidates += glob.glob(os.path.join(here, "..", "..", "..", "*", "libswapnet_torch.so"))
    candidates.append(os.path.join(here, "..", "..", "build", "libswapnet_torch.so"))  # source tree
    for c in candidates:
        if c and os.path.isfile(c):
            return os.path.realpath(c)
    raise ImportError(
        "swapnet: libswapnet_torch.so not found (looked at %s); build it (bash scripts/build.sh) "
        "or set SWAPNET_LIB" % ", ".join(c for c in candidates if c))


library_path = _find_library()
torch.ops.load_library(library_path)

_UNITS = {"": 1, "b": 1, "kib": 1 << 10, "mib": 1 << 20, "gib": 1 << 30, "tib": 1 << 40,
          "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30}


def parse_size(value, *, whole=None, what="size"):
    """Bytes from an int, '600MiB', '1.5GB', or (with `whole`) a percentage such as '33%'."""
    if isinstance(value, bool):
        raise TypeError("%s: %r is not a size" % (what, value))
    if isinstance(value, int):
        if value < 0:
            raise ValueError("%s: %d bytes is negative" % (what, value))
        return value
    if not isinstance(value, str):
        raise TypeError("%s: %r is not a size (bytes, or text such as '600MiB')" % (what, value))
    m = re.fullmatch(r"\s*([0-9]+(?:\.[0-9]*)?)\s*(%|[A-Za-z]*)\s*", value)
    if not m or (m.group(2).lower() not in _UNITS and m.group(2) != "%"):
        raise ValueError("%s: '%s' is not a size (bytes, KiB/MiB/GiB, KB/MB/GB, or a percentage)" % (what, value))
    number = float(m.group(1))
    if m.group(2) == "%":
        if whole is None:
            raise ValueError("%s: '%s' is a percentage, but of nothing known here" % (what, value))
        if not 0 < number <= 100:
            raise ValueError("%s: '%s' is not a percentage in (0, 100]" % (what, value))
        return int(whole * number / 100)
    return int(number * _UNITS[m.group(2).lower()])


def _call(f, *args):
    try:
        return f(*args)
    except RuntimeError as e:
        raise Error(_message(e)) from None


def _message(e):
    # torch prefixes custom class errors with a C++ trace on some builds: keep swapnet's line.
    text = str(e).strip()
    return text.splitlines()[0] if text else "swapnet: unknown error"


def pack(model, image, example_inputs):
    """Writes the swap image of `model` (a TorchScript file, or a scripted / traced module) to
    `image`, cut into layers and profiled with `example_inputs` (a list of forward's arguments).
    Returns what was written (layers, tensors, data_bytes, activation_bytes)."""
    if isinstance(example_inputs, torch.Tensor):
        example_inputs = [example_inputs]
    tmp = None
    try:
        if isinstance(model, torch.jit.ScriptModule):
            fd, tmp = tempfile.mkstemp(suffix=".pt", dir=os.path.dirname(os.path.abspath(image)) or None)
            os.close(fd)
            model.save(tmp)
            path = tmp
        elif isinstance(model, (str, os.PathLike)):
            path = os.fspath(model)
            if not os.path.isfile(path):
                raise FileNotFoundError("swapnet.pack: model file '%s' does not exist" % path)
        elif isinstance(model, torch.nn.Module):
            raise TypeError("swapnet.pack: %s is an eager nn.Module; pass torch.jit.script(module) or "
                            "torch.jit.trace(module, inputs), or a saved TorchScript file" % type(model).__name__)
        else:
            raise TypeError("swapnet.pack: model %r is not a TorchScript module or file" % (model,))
        return json.loads(_call(torch.ops.swapnet.pack, path, os.fspath(image), list(example_inputs)))
    finally:
        if tmp:
            os.unlink(tmp)


def _options(plan, read_ahead, verify, device, profile, learn=3, learn_store=None):
    if isinstance(learn, bool) or not isinstance(learn, int) or not (learn == 0 or 3 <= learn <= 1000):
        raise ValueError("swapnet: learn=%r is not 0 (never) or a number of inferences in 3..1000" % (learn,))
    return json.dumps({"plan": plan, "read_ahead": read_ahead, "verify": verify, "device": device,
                       "profile": os.fspath(profile) if profile else "", "learn": learn,
                       "learn_store": os.fspath(learn_store) if learn_store else ""})


def image_info(image):
    """What a swap image holds: layers, tensors, data_bytes (weights), activation_bytes,
    full_bytes (weights + activations: the budget that keeps everything resident), min_budget."""
    image = os.fspath(image)
    if not os.path.isfile(image):
        raise FileNotFoundError("swapnet: image '%s' does not exist (swapnet.pack writes one)" % image)
    return json.loads(_call(torch.ops.swapnet.image_info, image))


class Executor:
    """A swap image run within a memory budget (weights + activations), one inference at a time.
    Calling it runs forward: outputs bit-identical to the module's own forward.

    learn=N (default 3): every N inferences the layer times and disk read rate measured in them
    are compared with the image's and the device profile's, and the blocks re-planned with them
    when the plan's predicted time is more than 10 % off (stats['learn_replans']); the plan in force
    stays unless another is predicted more than 2 % faster with those costs
    (stats['learn_kept_plans']); 0: never.
    learn_store=PATH: what is learned is kept there, and the next Executor of this image (in any
    process, same thread count) plans with it from its first inference (stats['learn_loaded'],
    stats['learn_stored'])."""

    def __init__(self, image, budget, *, plan="auto", read_ahead="ring", verify="first", device="cpu",
                 profile=None, learn=3, learn_store=None):
        self.image = os.fspath(image)
        # A percentage is of the model's full demand: weights and activations ("100%": all resident).
        self.info = image_info(self.image)
        b = parse_size(budget, whole=self.info["full_bytes"], what="budget")
        self._ex = _call(torch.classes.swapnet.Executor, self.image, b,
                         _options(plan, read_ahead, verify, device, profile, learn, learn_store))
        self._budget = b

    def __call__(self, *inputs):
        return _call(self._ex.forward, list(inputs))

    forward = __call__

    @property
    def budget(self):
        return self._budget

    @budget.setter
    def budget(self, value):
        b = parse_size(value, whole=self.info["full_bytes"], what="budget")
        _call(self._ex.set_budget, b)
        self._budget = b

    @property
    def plan(self):
        return json.loads(self._ex.plan_json())

    @property
    def stats(self):
        return json.loads(self._ex.stats_json())

    def __repr__(self):
        p = self.plan
        return "swapnet.Executor(%r, budget=%d: %d blocks, %d resident, predicted %.1f ms)" % (
            self.image, self._budget, len(p["blocks"]), sum(p["resident"]), p["predicted_ms"])


def generate(target, prompt, state=(), *, new_tokens=16, draft=None, draft_state=(), speculate="auto",
             max_k=8):
    """Greedy token generation with a decoder Executor, forward(tokens, *state) -> (logits, *state)
    (swapnet generate's convention), `prompt` int64 [1, T]. With `draft` (an Executor of a small
    model of the same vocabulary, e.g. budget="100%" to hold it whole), speculative decoding: the
    draft proposes tokens, the target checks them in one pass (one read of its swapped weights for
    several tokens); the tokens are those greedy decoding by the target alone gives. `speculate`:
    tokens proposed per pass, or "auto" (chosen per pass from the measured acceptance and costs,
    up to max_k). Returns a dict: tokens, pass_ms, pass_tokens, pass_k, proposed, accepted,
    draft_ms. Raises Error for a state that does not grow along one dimension by the tokens of a
    call (it could not be cut back to the tokens kept), or a draft of another vocabulary."""
    if speculate == "auto":
        k = 0
    elif isinstance(speculate, int) and 1 <= speculate <= 64:
        k = speculate
    else:
        raise Error("generate: speculate=%r: give 'auto' or a number of tokens from 1 to 64" % (speculate,))
    if draft is None and speculate != "auto":
        raise Error("generate: speculate=%r needs a draft" % (speculate,))
    drafts = [] if draft is None else [draft._ex]
    out = _call(torch.ops.swapnet.generate, target._ex, drafts, prompt, list(state), list(draft_state),
                int(new_tokens), k, int(max_k))
    return json.loads(out)


class Runtime:
    """Several models served at once within one total budget (weights and activations of all of
    them), split by a policy ('paper', 'equal', 'minmax'); each model has a worker thread."""

    def __init__(self, models, budget, *, policy="paper"):
        if isinstance(models, dict):
            models = [{"name": n, "image": os.fspath(i)} for n, i in models.items()]
        specs = []
        for m in models:
            m = dict(m)
            if "name" not in m or "image" not in m:
                raise ValueError("swapnet.Runtime: model %r needs a 'name' and an 'image'" % (m,))
            image_info(m["image"])
            m["image"] = os.fspath(m["image"])
            specs.append(m)
        self.names = [m["name"] for m in specs]
        self._rt = _call(torch.classes.swapnet.Runtime, json.dumps(specs),
                         parse_size(budget, what="total budget"), policy)

    def __call__(self, model, *inputs):
        if model not in self.names:
            raise KeyError("swapnet.Runtime: no model named %r (models: %s)" % (model, ", ".join(self.names)))
        return _call(self._rt.forward, model, list(inputs))

    @property
    def budget(self):
        return self.status()["total_budget"]

    @budget.setter
    def budget(self, value):
        _call(self._rt.set_budget, parse_size(value, what="total budget"))

    def wait_adapted(self, timeout_s=10.0):
        return self._rt.wait_adapted(int(timeout_s * 1000))

    def status(self):
        return json.loads(self._rt.status_json())
