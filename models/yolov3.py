"""YOLOv3 with a Darknet-53 backbone (Redmon & Farhadi, 2018), written out in plain PyTorch.

torchvision has no YOLOv3, so swapnet ships its own. It follows the original darknet cfg:
Darknet-53 (52 conv layers + residual shortcuts), then three detection heads at strides
32/16/8, joined by the usual 1x1 conv + 2x nearest upsample + channel concat routes.
With 80 classes and 3 anchors per scale each head outputs 3*(5+80) = 255 channels.
About 62.0 M parameters. forward returns a tuple of the three raw detection maps.
"""
from typing import List, Tuple

import torch
from torch import nn


class ConvBNLeaky(nn.Module):
    def __init__(self, cin: int, cout: int, k: int, stride: int = 1):
        super().__init__()
        self.conv = nn.Conv2d(cin, cout, k, stride, (k - 1) // 2, bias=False)
        self.bn = nn.BatchNorm2d(cout)
        self.act = nn.LeakyReLU(0.1, inplace=True)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.act(self.bn(self.conv(x)))


class Residual(nn.Module):
    def __init__(self, c: int):
        super().__init__()
        self.reduce = ConvBNLeaky(c, c // 2, 1)
        self.expand = ConvBNLeaky(c // 2, c, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.expand(self.reduce(x))


def stage(cin: int, cout: int, repeats: int) -> nn.Sequential:
    layers: List[nn.Module] = [ConvBNLeaky(cin, cout, 3, 2)]
    layers += [Residual(cout) for _ in range(repeats)]
    return nn.Sequential(*layers)


class Darknet53(nn.Module):
    def __init__(self):
        super().__init__()
        self.stem = ConvBNLeaky(3, 32, 3)
        self.stage1 = stage(32, 64, 1)
        self.stage2 = stage(64, 128, 2)
        self.stage3 = stage(128, 256, 8)   # stride 8 route
        self.stage4 = stage(256, 512, 8)   # stride 16 route
        self.stage5 = stage(512, 1024, 4)  # stride 32

    def forward(self, x: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        x = self.stage2(self.stage1(self.stem(x)))
        c3 = self.stage3(x)
        c4 = self.stage4(c3)
        c5 = self.stage5(c4)
        return c3, c4, c5


def head_convs(cin: int, c: int) -> nn.Sequential:
    """The five alternating 1x1 / 3x3 convolutions before each detection output."""
    return nn.Sequential(
        ConvBNLeaky(cin, c, 1), ConvBNLeaky(c, 2 * c, 3),
        ConvBNLeaky(2 * c, c, 1), ConvBNLeaky(c, 2 * c, 3),
        ConvBNLeaky(2 * c, c, 1))


class Detect(nn.Module):
    def __init__(self, c: int, out_channels: int):
        super().__init__()
        self.conv = ConvBNLeaky(c, 2 * c, 3)
        self.out = nn.Conv2d(2 * c, out_channels, 1, bias=True)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.out(self.conv(x))


class YOLOv3(nn.Module):
    def __init__(self, num_classes: int = 80, anchors_per_scale: int = 3):
        super().__init__()
        out = anchors_per_scale * (5 + num_classes)
        self.backbone = Darknet53()
        self.head5 = head_convs(1024, 512)
        self.detect5 = Detect(512, out)
        self.route5 = ConvBNLeaky(512, 256, 1)
        self.head4 = head_convs(256 + 512, 256)
        self.detect4 = Detect(256, out)
        self.route4 = ConvBNLeaky(256, 128, 1)
        self.head3 = head_convs(128 + 256, 128)
        self.detect3 = Detect(128, out)
        self.upsample = nn.Upsample(scale_factor=2.0, mode="nearest")

    def forward(self, x: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        c3, c4, c5 = self.backbone(x)
        p5 = self.head5(c5)
        y5 = self.detect5(p5)
        p4 = self.head4(torch.cat([self.upsample(self.route5(p5)), c4], 1))
        y4 = self.detect4(p4)
        p3 = self.head3(torch.cat([self.upsample(self.route4(p4)), c3], 1))
        y3 = self.detect3(p3)
        return y5, y4, y3
