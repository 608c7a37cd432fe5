"""Silero VAD in luminar against onnxruntime running the silero-vad package's ONNX graph, through the
package's own OnnxWrapper.audio_forward (chunking, context and state handling are theirs), on a real clip
(beckett.wav from useful-moonshine-onnx).

The package's safetensors file holds another release of the weights than its ONNX files (see
luminar/models/silero.py), so the safetensors model is checked against the ONNX graph run with those
same weights swapped into its initializers, and the ONNX release against the shipped ONNX file as is.
"""
import importlib.metadata
import warnings

import numpy as np
import pytest

import luminar as lm
from luminar.models.silero import ONNX_NAMES, SileroVAD, load_silero_vad, read_onnx_weights, read_wav, read_weights

onnx = pytest.importorskip("onnx")
pytest.importorskip("onnxruntime")
torch = pytest.importorskip("torch")
pytestmark = pytest.mark.slow


def package_file(distribution, path):
    return str(importlib.metadata.distribution(distribution).locate_file(path))


ONNX_FILE = package_file("silero-vad", "silero_vad/data/silero_vad_16k_op15.onnx")
CLIP = package_file("useful-moonshine-onnx", "moonshine_onnx/assets/beckett.wav")


def onnxruntime_probabilities(path, audio):
    from silero_vad.utils_vad import OnnxWrapper
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "This model support only 16000 sampling rate!"
        wrapper = OnnxWrapper(str(path), force_onnx_cpu=True)
    return wrapper.audio_forward(torch.from_numpy(audio), 16000).numpy()[0]


@pytest.fixture(scope="module")
def audio():
    samples = read_wav(CLIP)
    assert samples.shape == (159414,) and np.abs(samples).max() > 0.1  # ~10 s of real speech
    return samples


def test_safetensors_model_matches_the_onnx_graph_run_with_the_same_weights(audio, tmp_path):
    model = onnx.load(ONNX_FILE)
    weights = read_weights(package_file("silero-vad", "silero_vad/data/silero_vad_16k.safetensors"))
    for tensor in model.graph.initializer:
        ours = next((k for k, v in ONNX_NAMES.items() if v == tensor.name), None)
        if ours is not None:
            tensor.CopyFrom(onnx.numpy_helper.from_array(weights[ours].astype(np.float32), tensor.name))
    onnx.save(model, tmp_path / "safetensors_weights.onnx")
    expected = onnxruntime_probabilities(tmp_path / "safetensors_weights.onnx", audio)
    got = load_silero_vad().probabilities(audio)
    assert got.shape == expected.shape == (312,)
    np.testing.assert_allclose(got, expected, atol=1e-5)
    assert 0.3 < (got > 0.5).mean() < 0.7  # speech and pauses both present: the comparison means something


def test_onnx_release_matches_the_shipped_onnx_file(audio):
    expected = onnxruntime_probabilities(ONNX_FILE, audio)
    got = SileroVAD(read_onnx_weights(ONNX_FILE)).probabilities(audio)
    np.testing.assert_allclose(got, expected, atol=1e-5)
    default = onnxruntime_probabilities(package_file("silero-vad", "silero_vad/data/silero_vad.onnx"), audio)
    np.testing.assert_allclose(got, default, atol=1e-5)  # the default ONNX (8 + 16 kHz) is the same release
    # the safetensors release differs, but it hears the same speech
    other = load_silero_vad().probabilities(audio)
    assert ((other > 0.5) == (expected > 0.5)).mean() > 0.95


def test_reference_backend_agrees_on_a_short_piece(audio):
    piece = audio[40000:40000 + 8 * 512]
    np.testing.assert_allclose(load_silero_vad(backend="reference").probabilities(piece),
                               load_silero_vad().probabilities(piece), atol=1e-5)


def test_bad_files_and_audio_raise_luminar_errors(tmp_path):
    good = package_file("silero-vad", "silero_vad/data/silero_vad_16k.safetensors")
    truncated = tmp_path / "truncated.safetensors"
    truncated.write_bytes(open(good, "rb").read()[:5000])
    with pytest.raises(lm.WeightFileError):
        read_weights(truncated)
    with pytest.raises(lm.WeightFileError, match="no such file"):
        read_weights(tmp_path / "missing.safetensors")
    from safetensors.numpy import save_file
    extra = tmp_path / "extra.safetensors"  # a tensor the model would silently drop
    save_file({**read_weights(good), "decoder.extra.weight": np.zeros(4, np.float32)}, str(extra))
    with pytest.raises(lm.WeightFileError, match="does not use: 'decoder.extra.weight'"):
        read_weights(extra)
    (tmp_path / "junk.onnx").write_bytes(b"\x08\x07not an onnx model")
    with pytest.raises(lm.WeightFileError, match="not a readable ONNX model|no initializer"):
        read_onnx_weights(tmp_path / "junk.onnx")
    (tmp_path / "noise.wav").write_bytes(b"RIFF not really")
    with pytest.raises(lm.InputError, match="not a readable .wav"):
        read_wav(tmp_path / "noise.wav")
    import wave
    with wave.open(str(tmp_path / "8k.wav"), "wb") as file:
        file.setnchannels(1), file.setsampwidth(2), file.setframerate(8000)
        file.writeframes(np.zeros(800, np.int16).tobytes())
    with pytest.raises(lm.InputError, match="8000 Hz; the VAD model needs 16000 Hz"):
        read_wav(tmp_path / "8k.wav")
    vad = load_silero_vad(backend="reference")
    with pytest.raises(lm.InputError, match="non-empty 1-D array"):
        vad.probabilities(np.zeros((2, 512), np.float32))
    with pytest.raises(lm.InputError, match="NaN"):
        vad.probabilities(np.full(512, np.nan, np.float32))
