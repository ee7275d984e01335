"""A decoder pair trained on real text, for speculative decoding (`swapnet generate --draft`).

Random weights make a draft agree with its target by chance only (1 in the vocabulary), so the
pair is trained: the target on text, the draft distilled from the target (trained to match the
target's next-token distribution), which is what makes their greedy choices agree.

Text: the GPL-3 that Debian's base-files package ships in /usr/share/common-licenses (on every
Debian 12 machine), whitespace collapsed: 6,639 tokens of English, 1,287 distinct. Tokens are
word pieces (a word with its leading space, a single other character; models/textgen.py's
_PIECE); export.py writes the vocabulary beside each target (NAME_vocab.json, id = index), which
`swapnet generate --vocab-file ... --prompt-text ...` reads.

Models are models/gpt.py's GPT (forward(tokens, cache) -> (logits, cache), the cache's sequence
dimension is 4). Training is deterministic for a seed and a thread count: windows drawn from a
seeded generator, AdamW with a linear decay, a fixed number of steps.

Pairs (name: target / draft):
  textgen_small  (CI):    2 layers d 128 (0.7 M parameters, 2.9 MB) / 1 layer d 64;
                          ~25 s of training on 2 cores;
  textgen        (bench): 6 layers d 384 (11.6 M parameters, 46 MB) / 2 layers d 128 (0.8 M);
                          ~16 minutes on 2 cores.
"""
import os
import re
from collections import Counter
from typing import Dict, List, Optional, Tuple

import torch
from torch import nn
from torch.nn import functional as F

import gpt

LICENSES = "/usr/share/common-licenses"


def text(directory: str = LICENSES, names: Tuple[str, ...] = ("GPL-3",)) -> bytes:
    """The training text: the files `names` of `directory` (all its files if empty), in order."""
    parts = []
    for name in names or sorted(os.listdir(directory)):
        path = os.path.join(directory, name)
        if os.path.islink(path) or not os.path.isfile(path):
            continue
        with open(path, "rb") as f:
            parts.append(f.read())
    if not parts:
        raise RuntimeError(f"textgen: no text in {directory} (Debian's base-files ships it)")
    data = b"\n\n".join(parts)
    # Layout is not language: line breaks, indentation and blank lines all become one space
    # (a greedy decoder of a little text otherwise falls into runs of blank lines).
    return re.sub(rb"\s+", b" ", data)


# Words with their leading space, digits runs, newlines, single other characters (GPT-2's
# pieces, roughly): 57 K tokens, 3,379 distinct, for the licences.
_PIECE = re.compile(rb" ?[A-Za-z0-9]+|\n|\s|[^\sA-Za-z0-9]")


def vocabulary(data: bytes) -> List[bytes]:
    """The pieces of `data`, most frequent first (ties in byte order): id = index."""
    counts = Counter(_PIECE.findall(data))
    return [p for p, _ in sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))]


def corpus() -> Tuple[torch.Tensor, List[bytes]]:
    """The training text as token ids (int64), and the vocabulary."""
    data = text()
    vocab = vocabulary(data)
    index = {p: i for i, p in enumerate(vocab)}
    return torch.tensor([index[p] for p in _PIECE.findall(data)], dtype=torch.long), vocab


# Windows as long as the generations they serve: positions are learned, and a position never
# trained on has a random embedding (the tests generate ~60 tokens, the bench ~90).
SIZES: Dict[str, dict] = {
    # name: target shape, draft shape, training steps (target, draft), batch, window
    "textgen_small": dict(target=dict(d=128, layers=2, heads=4), draft=dict(d=64, layers=1, heads=2),
                          steps=(200, 150), batch=8, window=64, lr=3e-3),
    "textgen": dict(target=dict(d=384, layers=6, heads=6), draft=dict(d=128, layers=2, heads=4),
                    steps=(600, 600), batch=8, window=128, lr=3e-3),
}
# Bumped when a target's or a draft's training changes: export.py writes those models again
# (5/6: trained on one intra-op thread, export.py, which changes their last bits).
RECIPE = {"target": 5, "draft": 6}
# Where export.py writes the models: a draft is distilled from the target written there.
teacher_dir = ""


def recipe(name: str, base: int):
    """export.py's recipe stamp for model `name`: the pairs' own version beside the base one."""
    which = "draft" if name.endswith("_draft") else "target"
    pair = name[:-len("_draft")] if which == "draft" else name
    if pair not in SIZES:
        return base
    # A draft is distilled from its target: it is written again when either changes.
    return f"{base}.textgen{RECIPE['target']}" + (f".{RECIPE['draft']}" if which == "draft" else "")
CONTEXT = 512


def vocab_size() -> int:
    return len(corpus()[1])


def vocab_strings() -> List[str]:
    """The vocabulary as text (id = index), for decoding generated ids."""
    return [p.decode("utf-8", "replace") for p in corpus()[1]]


def _model(shape: dict) -> gpt.GPT:
    return gpt.GPT(vocab=vocab_size(), context=CONTEXT, **shape)


def _windows(data: torch.Tensor, gen: torch.Generator, batch: int, window: int) -> torch.Tensor:
    starts = torch.randint(0, data.numel() - window - 1, (batch,), generator=gen)
    return torch.stack([data[s:s + window + 1] for s in starts.tolist()])


def _empty_cache(shape: dict, batch: int) -> torch.Tensor:
    return torch.zeros(shape["layers"], 2, batch, shape["heads"], 0, shape["d"] // shape["heads"])


@torch.no_grad()
def _greedy_text(teacher: nn.Module, shape: dict, data: torch.Tensor, gen: torch.Generator, n: int,
                 window: int) -> torch.Tensor:
    """`n` sequences of `window` + 1 tokens: 8 tokens of the corpus, then the teacher's greedy
    continuation (what a draft is asked to predict when the target generates)."""
    starts = torch.randint(0, data.numel() - 8, (n,), generator=gen)
    x = torch.stack([data[s:s + 8] for s in starts.tolist()])
    seq, cache = x, _empty_cache(shape, n)
    while seq.size(1) < window + 1:
        logits, cache = teacher(x, cache)
        x = logits[:, -1:].argmax(-1)
        seq = torch.cat([seq, x], 1)
    return seq


def _train(model: gpt.GPT, shape: dict, steps: int, lr: float, batch: int, window: int, seed: int,
           teacher: Optional[nn.Module] = None, teacher_shape: Optional[dict] = None) -> gpt.GPT:
    """`steps` of AdamW on windows of the corpus: cross-entropy with the next token, or, given a
    `teacher`, the KL divergence from the teacher's next-token distribution (distillation), on
    windows of the corpus and, every other step, of the teacher's own greedy text (sequence-level
    distillation: the draft learns what the target says, not only what the text says)."""
    data, vocab = corpus()
    v = len(vocab)
    own = _greedy_text(teacher, teacher_shape, data, torch.Generator().manual_seed(seed + 1), 8 * batch, window) \
        if teacher is not None else None
    gen = torch.Generator().manual_seed(seed)
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.01)
    # A short warm-up, then a linear decay to 0.
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda i: min(1.0, (i + 1) / 50) * (1.0 - i / max(steps, 1)))
    model.train()
    for step in range(steps):
        if own is not None and step % 2 == 1:
            w = own[torch.randint(0, own.size(0), (batch,), generator=gen)]
        else:
            w = _windows(data, gen, batch, window)
        x, y = w[:, :-1], w[:, 1:]
        logits, _ = model(x, _empty_cache(shape, batch))
        if teacher is None:
            loss = F.cross_entropy(logits.reshape(-1, v), y.reshape(-1))
        else:
            with torch.no_grad():
                t_logits, _ = teacher(x, _empty_cache(teacher_shape, batch))
            loss = F.kl_div(F.log_softmax(logits, -1).reshape(-1, v),
                            F.log_softmax(t_logits, -1).reshape(-1, v),
                            log_target=True, reduction="batchmean")
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        sched.step()
    return model.eval()


_trained: Dict[str, gpt.GPT] = {}


def target(pair: str) -> gpt.GPT:
    """The pair's target, trained on the corpus (kept for the draft's distillation)."""
    if pair not in _trained:
        s = SIZES[pair]
        torch.manual_seed(1000 + len(pair))
        _trained[pair] = _train(_model(s["target"]), s["target"], s["steps"][0], s["lr"], s["batch"], s["window"],
                                seed=2000 + len(pair))
    return _trained[pair]


def draft(pair: str) -> gpt.GPT:
    """The pair's draft, distilled from its target."""
    s = SIZES[pair]
    written = os.path.join(teacher_dir, pair + ".pt") if teacher_dir else ""
    # The target export.py wrote (the same recipe: it writes the target first), else trained here.
    teacher = target(pair) if pair in _trained or not os.path.isfile(written) else torch.jit.load(written).eval()
    torch.manual_seed(3000 + len(pair))
    return _train(_model(s["draft"]), s["draft"], s["steps"][1], s["lr"], s["batch"], s["window"],
                  seed=4000 + len(pair), teacher=teacher, teacher_shape=s["target"])


def cache_spec(pair: str, which: str) -> str:
    """The empty cache's input spec for `swapnet pack --input`."""
    sh = SIZES[pair][which]
    return f"float32[{sh['layers']},2,1,{sh['heads']},0,{sh['d'] // sh['heads']}]"
