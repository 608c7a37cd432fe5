"""Silero VAD (voice activity detection, 16 kHz) from the silero-vad package's safetensors file.

    from luminar.models.silero import load_silero_vad, read_wav
    vad = load_silero_vad()                              # silero_vad_16k.safetensors, located, not imported
    probabilities = vad.probabilities(read_wav("speech.wav"))   # one speech probability per 512 samples (32 ms)

The architecture, read off the package's ONNX graph (``silero_vad_16k_op15.onnx``: its node list
and initializer names) and matched to the safetensors keys:

1. each 512-sample chunk is prefixed with the 64 samples before it (zeros before the first) and
   reflect-padded by 64 on the right: 640 samples (ONNX ``Pad`` mode reflect);
2. STFT as a convolution: ``stft_conv.weight`` (258, 1, 256), stride 128, no bias (ONNX ``Conv`` with
   ``model.stft.forward_basis_buffer``) -> 4 frames of 129 real and 129 imaginary parts; the
   magnitude sqrt(re^2 + im^2) (``Slice``, ``Pow``, ``Add``, ``Sqrt``);
3. encoder: four Conv1d, kernel 3, padding 1, strides 1, 2, 2, 1, channels 129 -> 128 -> 64 -> 64
   -> 128, each followed by ReLU (``model.encoder.{0..3}.reparam_conv``): 4 frames -> 1;
4. an LSTM cell of 128 (``lstm_cell.*``; ONNX ``LSTM`` hidden_size 128) whose state (h, c) carries
   from chunk to chunk (the ONNX ``state`` input, (2, batch, 128): h then c);
5. decoder: ReLU, a 1x1 convolution to one channel (``final_conv``), sigmoid, mean over the single
   frame (``ReduceMean``): the chunk's speech probability.

How it runs: steps 1-3 are one graph over all chunks of a clip at once (the chunk count is a
symbolic dim: every clip length uses the same program); step 4 is the recurrence, an `nn.LSTM`
run by `nn.SequenceRunner` over the chunks (compiled once, any number of steps); step 5 is one more
graph over all chunks. The result equals the package's ONNX model run chunk by chunk under
onnxruntime (``OnnxWrapper.audio_forward``: the clip zero-padded to a multiple of 512).
"""
from __future__ import annotations

import importlib.metadata
import os
import wave

import numpy as np

from .. import nn
from ..errors import InputError, WeightFileError
from ..graph import Graph
from ..library.elementwise import relu, sigmoid
from ..library.indexing import cat
from ..library.linalg import linear
from ..library.nn_ops import conv1d
from ..io.safetensors import load_safetensors

SAMPLE_RATE = 16000
CHUNK = 512  # samples per probability
CONTEXT = 64  # samples of the previous chunk prefixed to each
REFLECT = 64  # reflect padding on the right, before the STFT
FREQUENCIES = 129  # n_fft 256 / 2 + 1
ENCODER = (("conv1", 1), ("conv2", 2), ("conv3", 2), ("conv4", 1))  # (name, stride); kernel 3, padding 1
SHAPES = {"stft_conv.weight": (258, 1, 256), "conv1.weight": (128, 129, 3), "conv1.bias": (128,),
          "conv2.weight": (64, 128, 3), "conv2.bias": (64,), "conv3.weight": (64, 64, 3), "conv3.bias": (64,),
          "conv4.weight": (128, 64, 3), "conv4.bias": (128,), "lstm_cell.weight_ih": (512, 128),
          "lstm_cell.weight_hh": (512, 128), "lstm_cell.bias_ih": (512,), "lstm_cell.bias_hh": (512,),
          "final_conv.weight": (1, 128, 1), "final_conv.bias": (1,)}


def default_weights() -> str:
    """silero_vad_16k.safetensors inside the installed silero-vad package (not imported: it imports torch)."""
    try:
        return str(importlib.metadata.distribution("silero-vad").locate_file("silero_vad/data/silero_vad_16k.safetensors"))
    except importlib.metadata.PackageNotFoundError:
        raise WeightFileError("the silero-vad package is not installed (pip install --no-deps silero-vad), "
                              "or pass the path of silero_vad_16k.safetensors") from None


def read_weights(path) -> dict[str, np.ndarray]:
    """The fifteen float32 arrays of silero_vad_16k.safetensors, checked by name and shape."""
    path = os.fspath(path)
    if not os.path.isfile(path):
        raise WeightFileError(f"{path}: no such file")
    weights = load_safetensors(path)
    for name, shape in SHAPES.items():
        if name not in weights:
            raise WeightFileError(f"{path}: missing tensor {name!r} (has {sorted(weights)})")
        if tuple(weights[name].shape) != shape:
            raise WeightFileError(f"{path}: tensor {name!r} has shape {tuple(weights[name].shape)}, expected {shape}")
    extra = sorted(set(weights) - set(SHAPES))  # (as torch's strict load_state_dict: nothing silently dropped)
    if extra:
        raise WeightFileError(f"{path}: tensors this model does not use: {', '.join(map(repr, extra[:3]))}")
    return {name: np.asarray(weights[name], np.float32) for name in SHAPES}


# the same tensors in the package's ONNX graphs (silero_vad_16k_op15.onnx names them as initializers)
ONNX_NAMES = {"stft_conv.weight": "model.stft.forward_basis_buffer",
              **{f"conv{k + 1}.{part}": f"model.encoder.{k}.reparam_conv.{part}" for k in range(4)
                 for part in ("weight", "bias")},
              **{f"lstm_cell.{kind}": f"model.decoder.rnn.{kind}" for kind in ("weight_ih", "weight_hh", "bias_ih",
                                                                               "bias_hh")},
              "final_conv.weight": "model.decoder.decoder.2.weight", "final_conv.bias": "model.decoder.decoder.2.bias"}


def read_onnx_weights(path) -> dict[str, np.ndarray]:
    """The model's tensors from one of the package's ONNX files whose weights are initializers
    (silero_vad_16k_op15.onnx), under the safetensors names. Needs the `onnx` package."""
    try:
        import onnx
        from onnx import numpy_helper
    except ImportError:
        raise WeightFileError("reading ONNX weights needs the onnx package (pip install onnx)") from None
    path = os.fspath(path)
    try:
        model = onnx.load(path)
    except FileNotFoundError:
        raise WeightFileError(f"{path}: no such file") from None
    except Exception as e:  # onnx raises protobuf's DecodeError and others for corrupt files
        raise WeightFileError(f"{path}: not a readable ONNX model ({type(e).__name__}: {e})") from None
    initializers = {t.name: t for t in model.graph.initializer}
    missing = [name for name in ONNX_NAMES.values() if name not in initializers]
    if missing:
        raise WeightFileError(f"{path}: no initializer {missing[0]!r} (this reader takes silero_vad_16k_op15.onnx)")
    weights = {ours: numpy_helper.to_array(initializers[theirs]).astype(np.float32) for ours, theirs in ONNX_NAMES.items()}
    for name, shape in SHAPES.items():
        if weights[name].shape != shape:
            raise WeightFileError(f"{path}: {ONNX_NAMES[name]!r} has shape {weights[name].shape}, expected {shape}")
    return weights


def read_wav(path) -> np.ndarray:
    """A 16-bit PCM .wav file at 16 kHz as float32 samples in [-1, 1) (channels averaged)."""
    path = os.fspath(path)
    try:
        with wave.open(path, "rb") as file:
            rate, channels, width = file.getframerate(), file.getnchannels(), file.getsampwidth()
            frames = file.readframes(file.getnframes())
    except FileNotFoundError:
        raise InputError(f"{path}: no such file") from None
    except (wave.Error, EOFError) as e:
        raise InputError(f"{path}: not a readable .wav file ({e})") from None
    if width != 2:
        raise InputError(f"{path}: {8 * width}-bit samples; only 16-bit PCM is supported")
    if rate != SAMPLE_RATE:
        raise InputError(f"{path}: sampled at {rate} Hz; the VAD model needs {SAMPLE_RATE} Hz (resample it first)")
    samples = np.frombuffer(frames, "<i2").astype(np.float32) / 32768.0
    return samples.reshape(-1, channels).mean(axis=1)


class SileroVAD:
    """Silero VAD compiled for `backend`; `probabilities(audio)` gives one speech probability per 512 samples."""

    def __init__(self, weights: dict[str, np.ndarray], backend: str = "cpu"):
        g = Graph()  # front end and encoder, every chunk at once: (n, 64 + 512) -> (n, 128)
        chunks = g.tensor("chunks", ("n", CONTEXT + CHUNK))
        padded = cat([chunks, chunks[:, -REFLECT - 1:-1].flip(-1)], -1)  # reflect: the edge sample is not repeated
        spectrum = conv1d(padded.unsqueeze(1), g.tensor("stft_conv__weight", SHAPES["stft_conv.weight"]), stride=128)
        real, imaginary = spectrum[:, :FREQUENCIES], spectrum[:, FREQUENCIES:]
        x = (real * real + imaginary * imaginary).sqrt()
        for name, stride in ENCODER:
            weight = g.tensor(f"{name}__weight", SHAPES[f"{name}.weight"])
            x = relu(conv1d(x, weight, g.tensor(f"{name}__bias", SHAPES[f"{name}.bias"]), stride=stride, padding=1))
        x.reshape(x.dims[0], x.dims[1]).output("features")  # one frame left
        self.encoder = g.compile(backend).set_inputs(
            {name.replace(".", "__"): weights[name] for name in SHAPES if not name.startswith(("lstm", "final"))})

        self.lstm = nn.LSTM(128, 128)  # the cell, stepped over chunks (time) with batch 1
        self.lstm.load_state_dict({f"{kind}_l0": weights[f"lstm_cell.{kind}"]
                                   for kind in ("weight_ih", "weight_hh", "bias_ih", "bias_hh")})
        self.runner = nn.SequenceRunner(self.lstm.eval(), backend)

        g = Graph()  # decoder, every chunk at once: (n, 128) -> (n,)
        h = g.tensor("h", ("n", 128))
        weight = g.tensor("final_conv__weight", (1, 128))  # a 1x1 convolution over one frame is a linear layer
        sigmoid(linear(relu(h), weight, g.tensor("final_conv__bias", (1,)))).reshape(h.dims[0]).output("speech")
        self.decoder = g.compile(backend).set_inputs(final_conv__weight=weights["final_conv.weight"].reshape(1, 128),
                                                     final_conv__bias=weights["final_conv.bias"])

    @staticmethod
    def chunks(audio) -> np.ndarray:
        """(n, 576): each 512-sample chunk after the 64 samples before it (the clip zero-padded to a multiple of 512)."""
        samples = np.asarray(audio, dtype=np.float32)
        if samples.ndim != 1 or samples.size == 0:
            raise InputError(f"silero VAD: expected a non-empty 1-D array of 16 kHz samples, got shape {samples.shape}")
        if not np.all(np.isfinite(samples)):
            raise InputError("silero VAD: the audio holds NaN or infinite samples")
        count = -(-samples.size // CHUNK)
        padded = np.zeros(CONTEXT + count * CHUNK, np.float32)
        padded[CONTEXT:CONTEXT + samples.size] = samples
        starts = np.arange(count)[:, None] * CHUNK + np.arange(CONTEXT + CHUNK)[None, :]
        return padded[starts]

    def probabilities(self, audio) -> np.ndarray:
        """Speech probability of each 32 ms chunk of `audio` (float samples at 16 kHz), from a fresh state."""
        features = self.encoder(chunks=self.chunks(audio))["features"]
        hidden, _ = self.runner(features[:, None, :])  # (chunks, batch 1, 128)
        return self.decoder(h=np.ascontiguousarray(hidden[:, 0]))["speech"]


def load_silero_vad(path=None, backend: str = "cpu") -> SileroVAD:
    """Silero VAD from `path` (default: the silero-vad package's silero_vad_16k.safetensors)."""
    return SileroVAD(read_weights(default_weights() if path is None else path), backend)
