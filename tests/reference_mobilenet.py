"""torchvision's MobileNetV2 layout written out in torch: the reference for luminar's MobileNetV2.

torchvision's wheels do not load against the local CPU torch here (their compiled ops are
missing), so this module re-states the architecture (torchvision.models.mobilenetv2) with the same
module tree, so that the same checkpoint loads into it with torch.load + load_state_dict. Used by
tests/test_mobilenet.py and bench/zoo.py.
"""
import torch
from torch import nn

# (expansion, output channels, repeats, first stride) per stage, as torchvision's inverted_residual_setting
STAGES = [(1, 16, 1, 1), (6, 24, 2, 2), (6, 32, 3, 2), (6, 64, 4, 2), (6, 96, 3, 1), (6, 160, 3, 2), (6, 320, 1, 1)]


def conv_bn_relu6(in_channels, out_channels, kernel_size=3, stride=1, groups=1):
    return nn.Sequential(nn.Conv2d(in_channels, out_channels, kernel_size, stride, (kernel_size - 1) // 2,
                                   groups=groups, bias=False),
                         nn.BatchNorm2d(out_channels), nn.ReLU6(inplace=True))


class InvertedResidual(nn.Module):
    def __init__(self, in_channels, out_channels, stride, expansion):
        super().__init__()
        hidden = in_channels * expansion
        self.use_residual = stride == 1 and in_channels == out_channels
        layers = [conv_bn_relu6(in_channels, hidden, kernel_size=1)] if expansion != 1 else []
        layers += [conv_bn_relu6(hidden, hidden, stride=stride, groups=hidden),
                   nn.Conv2d(hidden, out_channels, 1, bias=False), nn.BatchNorm2d(out_channels)]
        self.conv = nn.Sequential(*layers)

    def forward(self, x):
        return x + self.conv(x) if self.use_residual else self.conv(x)


class TorchMobileNetV2(nn.Module):
    def __init__(self, num_classes=1000):
        super().__init__()
        channels = 32
        blocks = [conv_bn_relu6(3, channels, stride=2)]
        for expansion, out_channels, repeats, stride in STAGES:
            for i in range(repeats):
                blocks.append(InvertedResidual(channels, out_channels, stride if i == 0 else 1, expansion))
                channels = out_channels
        blocks.append(conv_bn_relu6(channels, 1280, kernel_size=1))
        self.features = nn.Sequential(*blocks)
        self.classifier = nn.Sequential(nn.Dropout(0.2), nn.Linear(1280, num_classes))

    def forward(self, x):
        x = nn.functional.adaptive_avg_pool2d(self.features(x), (1, 1))
        return self.classifier(torch.flatten(x, 1))


def load_torch_mobilenet_v2(path):
    """The torch reference in eval mode with the checkpoint at `path` (strict load)."""
    model = TorchMobileNetV2()
    model.load_state_dict(torch.load(path, weights_only=True))
    return model.eval()
