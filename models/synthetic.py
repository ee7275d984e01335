"""A tiny model that exercises every construct the layered skeleton must handle, in < 1 MiB.

Branches and skip connections, a parameter shared by two layers, batch-norm buffers, a plain
tensor attribute, non-tensor attributes (float, int, bool, list), a data-dependent `if`
(prim::If), a loop (prim::Loop), in-place ops on activations, and an output that is a tuple
holding a tensor and a dict of tensors.
"""
from typing import Dict, List, Tuple

import torch
from torch import nn


class Branchy(nn.Module):
    def __init__(self):
        super().__init__()
        self.stem = nn.Conv2d(3, 8, 3, padding=1)
        self.bn = nn.BatchNorm2d(8)
        self.left = nn.Conv2d(8, 8, 3, padding=1)
        self.right = nn.Conv2d(8, 8, 1)
        self.shared = nn.Linear(8, 8)          # used twice: a shared parameter
        self.head_a = nn.Linear(8, 4)
        self.head_b = nn.Linear(8, 3)
        self.register_buffer("offset", torch.linspace(-1.0, 1.0, 8))
        self.scale = 0.5                        # float attribute
        self.repeats = 2                        # int attribute, drives a loop
        self.use_right = True                   # bool attribute
        self.pool_sizes: List[int] = [1, 1]     # list attribute

    def forward(self, x: torch.Tensor) -> Tuple[torch.Tensor, Dict[str, torch.Tensor]]:
        x = torch.relu_(self.bn(self.stem(x)))  # in-place on an activation
        skip = x
        a = self.left(x)
        if self.use_right:
            a = a + self.right(x)
        x = a + skip                            # skip connection
        x = nn.functional.adaptive_avg_pool2d(x, self.pool_sizes).flatten(1)
        x = x + self.offset
        for _ in range(self.repeats):          # prim::Loop reusing one parameter
            x = torch.tanh(self.shared(x)) * self.scale + x
        if bool(x.sum() > 0):                   # data-dependent branch: prim::If
            y = self.head_a(x)
        else:
            y = -self.head_a(x)
        z = self.head_b(self.shared(x))         # the shared layer used once more
        return y, {"logits": z, "features": x}
