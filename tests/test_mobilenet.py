"""MobileNetV2 from torchvision's checkpoint against a torch module of torchvision's layout
(tests/reference_mobilenet.py), its pieces against torch.nn.functional, and the classify command."""
import os
import sys

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from PIL import Image

import luminar as lm
from luminar import nn
from luminar.backends.cpu import cc
from luminar.errors import InputError, ValueDomainError, WeightFileError
from luminar.models import mobilenet
from luminar.models.mobilenet import (ConvBNReLU6, conv2d_channels_last, flush_subnormals, fold_batch_norms,
                                      imagenet_classes, load_classifier, load_mobilenet_v2, preprocess)

sys.path.insert(0, os.path.dirname(__file__))
from reference_mobilenet import load_torch_mobilenet_v2  # noqa: E402

skimage_data = pytest.importorskip("skimage.data")


def torch_conv(x_nhwc, conv):
    weight = torch.from_numpy(conv.weight)
    bias = None if conv.bias is None else torch.from_numpy(conv.bias)
    out = F.conv2d(torch.from_numpy(x_nhwc).permute(0, 3, 1, 2), weight, bias, conv.stride, conv.padding,
                   groups=conv.groups)
    return out.permute(0, 2, 3, 1).numpy()


@pytest.mark.parametrize("backend", ["reference", "cpu"])
@pytest.mark.parametrize("in_ch, out_ch, kernel, stride, groups, bias", [
    (3, 8, 3, 2, 1, False),   # the stem
    (6, 10, 1, 1, 1, True),   # pointwise
    (12, 12, 3, 1, 12, True),  # depthwise
    (12, 12, 3, 2, 12, False),  # depthwise, strided
])
def test_channels_last_convolution_matches_torch(backend, in_ch, out_ch, kernel, stride, groups, bias):
    conv = nn.Conv2d(in_ch, out_ch, kernel, stride, (kernel - 1) // 2, groups=groups, bias=bias, rng=1)
    x = np.random.default_rng(0).standard_normal((2, 9, 11, in_ch)).astype(np.float32)
    g = lm.Graph()
    conv2d_channels_last(g.tensor("x", ("n", 9, 11, in_ch)), conv).output("out")
    program = g.compile(backend).set_inputs(conv.inputs(g))
    np.testing.assert_allclose(program(x=x)["out"], torch_conv(x, conv), rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(program(x=x[:1])["out"], torch_conv(x[:1], conv), rtol=1e-4, atol=1e-5)


def test_folding_batch_norm_keeps_the_output_and_flushes_subnormals():
    rng = np.random.default_rng(0)
    block = ConvBNReLU6(4, 6)
    norm = block[1]
    norm.weight, norm.bias = rng.standard_normal(6).astype(np.float32), rng.standard_normal(6).astype(np.float32)
    norm.running_mean = rng.standard_normal(6).astype(np.float32)
    norm.running_var = rng.uniform(0.5, 2, 6).astype(np.float32)
    norm.running_mean[0] = norm.running_var[1] = 1e-40  # subnormal statistics, as in the checkpoint
    block[0].weight[2] = 1e-39
    x = rng.standard_normal((2, 7, 7, 4)).astype(np.float32)

    def forward(module):
        g = lm.Graph()
        module(g.tensor("x", ("n", 7, 7, 4))).output("out")
        return g.compile("reference").set_inputs(module.inputs(g))(x=x)["out"]

    expected = F.relu6(F.batch_norm(torch.from_numpy(torch_conv(x, block[0])).permute(0, 3, 1, 2),
                                    torch.from_numpy(norm.running_mean), torch.from_numpy(norm.running_var),
                                    torch.from_numpy(norm.weight), torch.from_numpy(norm.bias), eps=norm.eps))
    expected = expected.permute(0, 2, 3, 1).numpy()
    np.testing.assert_allclose(forward(block), expected, rtol=1e-4, atol=1e-5)
    assert fold_batch_norms(block) == 1
    assert isinstance(block[1], nn.Identity) and block[0].bias is not None
    np.testing.assert_allclose(forward(block), expected, rtol=1e-4, atol=1e-5)
    tiny = np.finfo(np.float32).tiny
    for array in (block[0].weight, block[0].bias):
        assert not np.any((array != 0) & (np.abs(array) < tiny))
    np.testing.assert_array_equal(flush_subnormals([1e-40, -1e-39, 1.0, tiny]), [0.0, 0.0, 1.0, tiny])


def test_preprocess_is_torchvisions_eval_transform(tmp_path):
    rng = np.random.default_rng(0)
    pixels = rng.integers(0, 256, (300, 400, 3), dtype=np.uint8)  # landscape: the height becomes 256
    out = preprocess(Image.fromarray(pixels))
    assert out.shape == (3, 224, 224) and out.dtype == np.float32
    resized = np.asarray(Image.fromarray(pixels).resize((341, 256), Image.BILINEAR), np.float32)
    crop = resized[16:240, 58:282] / 255.0  # round((256 - 224) / 2) = 16, round((341 - 224) / 2) = 58
    expected = ((crop - mobilenet.IMAGENET_MEAN) / mobilenet.IMAGENET_STD).transpose(2, 0, 1)
    np.testing.assert_allclose(out, expected, rtol=1e-6, atol=1e-6)
    gray = Image.fromarray(np.full((256, 256), 128, np.uint8), mode="L")  # grayscale becomes RGB
    np.testing.assert_allclose(preprocess(gray)[:, 0, 0], (128 / 255 - mobilenet.IMAGENET_MEAN) / mobilenet.IMAGENET_STD,
                               rtol=1e-6)
    path = tmp_path / "image.png"
    Image.fromarray(pixels).save(path)
    np.testing.assert_array_equal(preprocess(path), out)


def test_bad_images_and_checkpoints(tmp_path):
    (tmp_path / "text.jpg").write_text("this is not an image")
    with pytest.raises(InputError, match="not a readable image"):
        preprocess(tmp_path / "text.jpg")
    with pytest.raises(InputError, match="no such image"):
        preprocess(tmp_path / "missing.png")
    data = open(mobilenet.default_weights_path(), "rb").read()
    (tmp_path / "cut.pth").write_bytes(data[: len(data) // 3])
    with pytest.raises(WeightFileError, match="truncated"):
        load_mobilenet_v2(tmp_path / "cut.pth")
    torch.save({"features.0.0.weight": torch.zeros(1)}, tmp_path / "other.pth")
    with pytest.raises(WeightFileError, match="not a torchvision MobileNetV2 checkpoint"):
        load_mobilenet_v2(tmp_path / "other.pth")


def test_class_names_ship_with_the_package():
    names = imagenet_classes()
    assert len(names) == len(set(names)) == 1000
    assert (names[0], names[285], names[967], names[999]) == ("tench", "Egyptian cat", "espresso", "toilet tissue")


@pytest.fixture(scope="module")
def classifier():
    return load_classifier()


@pytest.fixture(scope="module")
def sample_images():
    return [Image.fromarray(skimage_data.chelsea()), Image.fromarray(skimage_data.coffee())]


@pytest.mark.slow
def test_logits_match_torch_and_labels(classifier, sample_images):
    reference = load_torch_mobilenet_v2(mobilenet.default_weights_path())
    rng = np.random.default_rng(0)
    batch = np.stack([preprocess(image) for image in sample_images] +
                     [rng.standard_normal((3, 224, 224)).astype(np.float32)])
    with torch.no_grad():
        expected = reference(torch.from_numpy(batch)).numpy()
    np.testing.assert_allclose(classifier.logits(batch), expected, rtol=0, atol=1e-4)
    builds = []
    original = cc.build_many
    cc.build_many = lambda sources: builds.append(len(sources)) or original(sources)
    try:  # other batch sizes run the same compiled program: nothing is built again
        np.testing.assert_allclose(classifier.logits(batch[:1]), expected[:1], rtol=0, atol=1e-4)
    finally:
        cc.build_many = original
    assert builds == []
    (cat, *_), (coffee, *_) = classifier.classify(sample_images)
    torch_labels = [imagenet_classes()[k] for k in expected[:2].argmax(1)]
    assert [cat[0], coffee[0]] == torch_labels == ["Egyptian cat", "espresso"]
    top = classifier.classify(sample_images[:1], top=5)[0]
    assert len(top) == 5 and all(a[1] >= b[1] for a, b in zip(top, top[1:])) and 0.5 < top[0][1] <= 1
    with pytest.raises(ValueDomainError):
        classifier.classify(sample_images, top=0)
    with pytest.raises(lm.ShapeError):
        classifier.logits(np.zeros((1, 3, 100, 100), np.float32))
    tiny = np.finfo(np.float32).tiny
    assert all(not np.any((a != 0) & (np.abs(a) < tiny)) for a in classifier.model.parameters())


@pytest.mark.slow
def test_classify_command(tmp_path, sample_images, capsys, classifier):
    from luminar.cli import main
    sample_images[0].save(tmp_path / "chelsea.jpg")
    assert main(["classify", str(tmp_path / "chelsea.jpg"), "--top", "3", "--quiet"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].endswith("chelsea.jpg") and len(lines) == 4 and lines[1].split(None, 1)[1] == "Egyptian cat"
    (tmp_path / "bad.jpg").write_bytes(b"\x89PNG but not really")
    assert main(["classify", str(tmp_path / "bad.jpg"), "--quiet"]) == 1
    assert "not a readable image" in capsys.readouterr().err
