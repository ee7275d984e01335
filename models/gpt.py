"""A GPT-2-shaped decoder-only transformer with random weights, for token generation.

forward(tokens, cache) -> (logits, cache), the convention `swapnet generate` runs:
  tokens  int64 [B, T]: the new tokens (the prompt, then one token per call);
  cache   float32 [n_layer, 2, B, n_head, S, head_dim]: keys and values of the S tokens before
          (S = 0 at the start: an empty cache);
  logits  float32 [B, T, vocab]; the cache returned holds S + T tokens.
Pre-LayerNorm blocks (attention with a causal mask over cache + new tokens, then a GELU MLP),
learned positions, a final LayerNorm and an output projection not tied to the embedding (as in
LLaMA-style decoders; tied weights would stay resident as a shared slot).
Sizes: "gpt_small" (CI: 4 layers, d 128, about 1.6 M parameters) and "gpt_350m" (GPT-2 medium's
shape: 24 layers, d 1024, 16 heads, vocab 50257, context 1024, about 406 M parameters untied).
"""
import math
from typing import List, Tuple

import torch
from torch import nn


class Block(nn.Module):
    def __init__(self, d: int, heads: int):
        super().__init__()
        self.heads = heads
        self.ln1 = nn.LayerNorm(d)
        self.qkv = nn.Linear(d, 3 * d)
        self.proj = nn.Linear(d, d)
        self.ln2 = nn.LayerNorm(d)
        self.fc = nn.Linear(d, 4 * d)
        self.out = nn.Linear(4 * d, d)

    def forward(self, x: torch.Tensor, k_past: torch.Tensor, v_past: torch.Tensor
                ) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        b, t, d = x.shape
        hd = d // self.heads
        q, k, v = self.qkv(self.ln1(x)).split(d, dim=2)
        q = q.view(b, t, self.heads, hd).transpose(1, 2)
        k = torch.cat([k_past, k.view(b, t, self.heads, hd).transpose(1, 2)], dim=2)
        v = torch.cat([v_past, v.view(b, t, self.heads, hd).transpose(1, 2)], dim=2)
        s = k.size(2)
        att = torch.matmul(q, k.transpose(2, 3)) / math.sqrt(hd)
        # causal: new token i (at position s - t + i) sees positions up to its own
        mask = torch.ones(t, s, dtype=torch.bool, device=x.device).triu(s - t + 1)
        att = att.masked_fill(mask, float("-inf")).softmax(dim=-1)
        y = torch.matmul(att, v).transpose(1, 2).reshape(b, t, d)
        x = x + self.proj(y)
        x = x + self.out(torch.nn.functional.gelu(self.fc(self.ln2(x))))
        return x, k, v


class GPT(nn.Module):
    def __init__(self, vocab: int = 1000, context: int = 128, d: int = 128, layers: int = 4,
                 heads: int = 4):
        super().__init__()
        self.wte = nn.Embedding(vocab, d)
        self.wpe = nn.Embedding(context, d)
        self.blocks = nn.ModuleList([Block(d, heads) for _ in range(layers)])
        self.ln_f = nn.LayerNorm(d)
        self.head = nn.Linear(d, vocab, bias=False)
        for m in self.modules():  # GPT-2's initialisation scale, so logits are not flat
            if isinstance(m, (nn.Linear, nn.Embedding)):
                nn.init.normal_(m.weight, std=0.02)

    def forward(self, tokens: torch.Tensor, cache: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
        past = cache.size(4)
        pos = torch.arange(past, past + tokens.size(1), dtype=torch.long, device=tokens.device)
        x = self.wte(tokens) + self.wpe(pos).unsqueeze(0)
        ks: List[torch.Tensor] = []
        vs: List[torch.Tensor] = []
        i = 0
        for blk in self.blocks:
            x, k, v = blk(x, cache[i, 0], cache[i, 1])
            ks.append(k)
            vs.append(v)
            i += 1
        logits = self.head(self.ln_f(x))
        return logits, torch.stack([torch.stack(ks), torch.stack(vs)], dim=1)


def small() -> GPT:
    return GPT(vocab=1000, context=128, d=128, layers=4, heads=4)


def medium() -> GPT:
    return GPT(vocab=50257, context=1024, d=1024, layers=24, heads=16)
