"""The Python package (python/swapnet) on real architectures: pack, run within a budget
bit-identically to the module's own forward, change the budget, read plan and stats, serve
several models in a Runtime, and fail with Python exceptions that name the file and the value.
Run by ctest (python.module) with SWAPNET_LIB and SWAPNET_MODELS set."""
import json
import os
import threading
import time

import pytest
import torch

import swapnet

MODELS = os.environ.get("SWAPNET_MODELS", os.path.join(os.path.dirname(__file__), "..", "..", ".cache", "models"))


def model_path(name):
    p = os.path.join(MODELS, name + ".pt")
    if not os.path.isfile(p):
        pytest.fail("%s is missing: bash scripts/models.sh small writes the test models" % p)
    return p


@pytest.fixture(scope="module")
def packed(tmp_path_factory):
    """resnet18 and mobilenet_v2 packed once, with their reference outputs."""
    torch.manual_seed(0)
    out = {}
    for name in ("resnet18", "mobilenet_v2"):
        x = torch.randn(1, 3, 224, 224)
        image = str(tmp_path_factory.mktemp(name) / (name + ".swapnet"))
        info = swapnet.pack(model_path(name), image, [x])
        with torch.no_grad():
            ref = torch.jit.load(model_path(name)).eval()(x)
        out[name] = (image, x, ref, info)
    return out


@pytest.mark.parametrize("name", ["resnet18", "mobilenet_v2"])
def test_executor_is_bit_identical_within_budgets(packed, name):
    image, x, ref, info = packed[name]
    assert info["layers"] > 10 and info["data_bytes"] > 1 << 20
    meta = swapnet.image_info(image)
    assert meta["full_bytes"] == info["data_bytes"] + info["activation_bytes"]
    ex = swapnet.Executor(image, budget="100%")
    assert ex.budget == meta["full_bytes"]
    # Every weight resident, halfway to the minimum, the minimum, and back up.
    lo, hi = meta["min_budget"], meta["full_bytes"]
    for budget in [hi, (lo + hi) // 2, lo, (lo + hi) // 2]:
        ex.budget = budget
        plan = ex.plan
        assert plan["total_bytes"] <= budget, plan
        for _ in range(2):
            y = ex(x)
            assert torch.equal(y, ref), "%s at %d bytes differs from forward" % (name, budget)
        if budget < hi:
            assert len(plan["blocks"]) > 1 and sum(plan["resident"]) < len(plan["blocks"]), plan
    stats = ex.stats
    assert stats["bytes_read"] >= info["data_bytes"]
    assert stats["weights_peak"] <= info["data_bytes"] + 4096


def test_layers_run_as_their_bytes_land(packed):
    """Note [Layer by layer]: at the minimum budget (a ring of the largest layer) the default
    read-ahead runs a block's layers while the rest of it lands and gives their bytes back as
    they end; ring-blocks does neither. Both bit-identical. plan="equal": blocks of several
    layers each whatever the layer times measured at pack (the optimal plan may cut every
    multi-piece layer into a block of its own, where there is nothing to start early)."""
    image, x, ref, _ = packed["resnet18"]
    lo = swapnet.image_info(image)["min_budget"]
    early = {}
    for mode in ("ring", "ring-blocks"):
        ex = swapnet.Executor(image, budget=lo, plan="equal", read_ahead=mode)
        for _ in range(3):  # the first inference reads whole, to verify checksums
            assert torch.equal(ex(x), ref), mode
        stats = ex.stats
        assert stats["read_wait_ms"] >= 0, stats
        early[mode] = (stats["layers_started_early"], stats["released_early_bytes"])
    assert early["ring"][0] > 0 and early["ring"][1] > 0, early
    assert early["ring-blocks"] == (0, 0), early


def test_the_activation_reserve_is_lent_to_blocks(packed):
    """Note [Lending the activation reserve]: at the minimum budget resnet18's last blocks are
    read into the bytes its activations leave (after one inference has measured them), outputs
    stay bit-identical (also those kept while later inferences run), and activations and lent
    blocks together stay within the budget; read_ahead="ring-reserved" lends nothing."""
    image, x, ref, _ = packed["resnet18"]
    lo = swapnet.image_info(image)["min_budget"]
    for mode in ("ring", "ring-reserved"):
        ex = swapnet.Executor(image, budget=lo, read_ahead=mode)
        kept = [ex(x) for _ in range(5)]
        assert all(torch.equal(y, ref) for y in kept), mode
        stats = ex.stats
        assert stats["peak_model_bytes"] <= lo, (mode, stats)
        if mode == "ring":
            assert stats["zone_bytes"] > 0 and stats["lent_peak_bytes"] > 0, stats
            assert stats["zone_peak_bytes"] <= stats["zone_bytes"] and stats["zone_misses"] == 0, stats
        else:
            assert stats["zone_bytes"] == 0 and stats["lent_peak_bytes"] == 0, stats


def test_executors_learn_their_costs_unless_told_not_to(packed):
    """Note [Learning the costs in service]: swapnet.Executor compares the costs it planned with
    against those it measured every `learn` inferences (default 3); learn=0 never does; a bad
    value is a ValueError naming it. Whether it re-plans depends on this machine's profile, so
    only the windows are counted here (tests/executor_test.cpp checks the re-plan)."""
    image, x, ref, _ = packed["resnet18"]
    budget = swapnet.image_info(image)["min_budget"] * 2
    default = swapnet.Executor(image, budget=budget)
    never = swapnet.Executor(image, budget=budget, learn=0)
    every4 = swapnet.Executor(image, budget=budget, learn=4)
    # A window is `learn` inferences and 1 s at least, longer where its inferences differ much
    # (Note [Noise in the window]): until both have decided one (30 s at most).
    n, until = 0, time.monotonic() + 30
    while n < 4 or (time.monotonic() < until and
                    min(default.stats["learn_windows"], every4.stats["learn_windows"]) == 0):
        for ex in (default, never, every4):
            assert torch.equal(ex(x), ref)
        n += 1
    # Decided from inference 3 (4) on at the soonest.
    assert 1 <= default.stats["learn_windows"] <= n - 2, (n, default.stats)
    assert never.stats["learn_windows"] == 0
    assert 1 <= every4.stats["learn_windows"] <= n - 3, (n, every4.stats)
    assert default.stats["learn_read_mb_s"] > 0
    for bad in (-1, 1, 2, 1001, "3", 2.5, True):
        with pytest.raises(ValueError, match="learn=%r" % (bad,)):
            swapnet.Executor(image, budget=budget, learn=bad)


def test_learned_costs_can_be_kept(packed, tmp_path):
    """Note [Learned costs kept]: learn_store=PATH reaches the executor: a file there that is not
    a store is not used (said) and the model runs; what is learned is written there
    (tests/executor_test.cpp checks that the next executor plans with it)."""
    image, x, ref, _ = packed["resnet18"]
    budget = swapnet.image_info(image)["min_budget"] * 2
    store = tmp_path / "resnet18.learned.json"
    store.write_text("{not json")
    ex = swapnet.Executor(image, budget=budget, learn_store=store)
    for _ in range(4):
        assert torch.equal(ex(x), ref)
    assert ex.stats["learn_loaded"] is False
    assert ex.stats["learn_stored"] == ex.stats["learn_replans"]
    assert 0 <= ex.stats["learn_kept_plans"] <= ex.stats["learn_replans"]
    if ex.stats["learn_stored"]:
        assert json.loads(store.read_text())["swapnet_learned"] == 1


def test_pack_a_scripted_module(tmp_path):
    torch.manual_seed(1)
    net = torch.nn.Sequential(torch.nn.Conv2d(3, 16, 3), torch.nn.ReLU(), torch.nn.Conv2d(16, 32, 3),
                              torch.nn.ReLU(), torch.nn.Flatten(), torch.nn.Linear(32 * 12 * 12, 10)).eval()
    scripted = torch.jit.script(net)
    x = torch.randn(2, 3, 16, 16)
    image = str(tmp_path / "small.swapnet")
    info = swapnet.pack(scripted, image, x)
    assert info["layers"] >= 3
    assert not [f for f in os.listdir(tmp_path) if f.endswith(".pt")], "the temporary .pt is left behind"
    ex = swapnet.Executor(image, budget="100%")
    with torch.no_grad():
        assert torch.equal(ex(x), scripted(x))


def test_runtime_serves_several_models_from_threads(packed):
    r18, x18, ref18, _ = packed["resnet18"]
    mb2, xmb, refmb, _ = packed["mobilenet_v2"]
    rt = swapnet.Runtime({"r18": r18, "mb2": mb2}, budget="80MiB")
    errors = []

    def client(name, x, ref):
        try:
            for _ in range(3):
                if not torch.equal(rt(name, x), ref):
                    errors.append(name + " differs")
        except Exception as e:  # noqa: BLE001 - reported below
            errors.append(repr(e))

    threads = [threading.Thread(target=client, args=a) for a in (("r18", x18, ref18), ("mb2", xmb, refmb))] * 1
    for t in threads:
        t.start()
    rt.budget = "60MiB"
    for t in threads:
        t.join()
    assert rt.wait_adapted(10)
    assert not errors, errors
    status = rt.status()
    assert status["total_budget"] == 60 << 20
    assert sum(m["budget"] for m in status["models"]) <= 60 << 20
    assert all(m["over_budget"] == 0 and m["failed"] == 0 for m in status["models"]), status
    # Threads from the machine, not torch's default (Note [A model's threads from the machine]).
    cores = len(os.sched_getaffinity(0))
    assert [m["threads"] for m in status["models"]] == [max(1, cores // 2)] * 2, status
    assert torch.equal(rt("r18", x18), ref18)
    with pytest.raises(KeyError, match="no model named 'nope'"):
        rt("nope", x18)


def test_errors_name_the_file_and_the_value(packed, tmp_path):
    image, x, _, _ = packed["resnet18"]
    with pytest.raises(swapnet.Error, match=r"r.*below the minimum.*minimum for this model is \d+ bytes"):
        swapnet.Executor(image, budget="1MiB")
    ex = swapnet.Executor(image, budget="100%")
    with pytest.raises(swapnet.Error, match="below the minimum"):
        ex.budget = 1 << 20
    assert torch.equal(ex(x), packed["resnet18"][2]), "a refused budget changed the executor"
    with pytest.raises(swapnet.Error, match="plan 'fastest' is not one of auto|optimal|equal"):
        swapnet.Executor(image, budget="100%", plan="fastest")
    with pytest.raises(FileNotFoundError, match="nope.swapnet"):
        swapnet.Executor(str(tmp_path / "nope.swapnet"), budget="10MiB")
    with pytest.raises(FileNotFoundError, match="nope.pt"):
        swapnet.pack(str(tmp_path / "nope.pt"), str(tmp_path / "x.swapnet"), [x])
    with pytest.raises(TypeError, match="eager nn.Module"):
        swapnet.pack(torch.nn.Linear(2, 2), str(tmp_path / "x.swapnet"), [torch.randn(1, 2)])
    with pytest.raises(ValueError, match="'12 parsecs' is not a size"):
        swapnet.Executor(image, budget="12 parsecs")
    bad = tmp_path / "bad.swapnet"
    bad.write_bytes(b"not an image" * 1000)
    with pytest.raises(swapnet.Error, match="bad.swapnet"):
        swapnet.Executor(str(bad), budget="10MiB")
    with pytest.raises(swapnet.Error, match="model.pt"):
        notscript = tmp_path / "model.pt"
        notscript.write_bytes(b"\x00" * 100)
        swapnet.pack(str(notscript), str(tmp_path / "y.swapnet"), [x])
    assert not os.path.exists(tmp_path / "y.swapnet")


def test_parse_size():
    assert swapnet.parse_size("600MiB") == 600 << 20
    assert swapnet.parse_size("1.5GB") == 1_500_000_000
    assert swapnet.parse_size(4096) == 4096
    assert swapnet.parse_size("25%", whole=400) == 100
    for bad in ["-1", "MiB", "12 parsecs", "150%"]:
        with pytest.raises(ValueError):
            swapnet.parse_size(bad, whole=100)
    with pytest.raises(ValueError):
        swapnet.parse_size("10%")
    with pytest.raises(ValueError):
        swapnet.parse_size(-5)
    with pytest.raises(TypeError):
        swapnet.parse_size(True)


def test_speculative_generation_gives_the_targets_greedy_tokens(tmp_path):
    """swapnet.generate with the trained CI pair (models/textgen.py): the target swapped at half
    of its weights, the draft held whole; tokens equal greedy decoding by torch.jit.load's target
    one token at a time, with and without the draft; the draft's proposals partly kept."""
    target_pt, draft_pt = model_path("textgen_small"), model_path("textgen_small_draft")
    prompt = torch.tensor([[5, 17, 3, 42, 8, 11, 2, 30]])
    t_cache, d_cache = torch.zeros(2, 2, 1, 4, 0, 32), torch.zeros(1, 2, 1, 2, 0, 32)
    images = []
    for pt, cache in ((target_pt, t_cache), (draft_pt, d_cache)):
        images.append(str(tmp_path / (os.path.basename(pt) + ".swapnet")))
        swapnet.pack(pt, images[-1], [prompt, cache])
    ref_model = torch.jit.load(target_pt).eval()
    ref, x, cache = [], prompt, t_cache
    with torch.no_grad():
        for _ in range(32):
            logits, cache = ref_model(x, cache)
            ref.append(int(logits[0, -1].argmax()))
            x = torch.tensor([[ref[-1]]])
    target = swapnet.Executor(images[0], budget=swapnet.image_info(images[0])["data_bytes"] // 2 + (1 << 20))
    draft = swapnet.Executor(images[1], budget="100%")
    plain = swapnet.generate(target, prompt, [t_cache], new_tokens=32)
    assert plain["tokens"] == ref and plain["proposed"] == 0
    spec = swapnet.generate(target, prompt, [t_cache], new_tokens=32, draft=draft, draft_state=[d_cache], speculate=4)
    assert spec["tokens"] == ref
    assert 0 < spec["accepted"] <= spec["proposed"] and max(spec["pass_k"]) <= 4
    auto = swapnet.generate(target, prompt, [t_cache], new_tokens=32, draft=draft, draft_state=[d_cache])
    assert auto["tokens"] == ref
    with pytest.raises(swapnet.Error, match="speculate=0"):
        swapnet.generate(target, prompt, [t_cache], draft=draft, draft_state=[d_cache], speculate=0)
