"""Audio in for speech models: reading wav files, resampling, and Whisper's log-mel spectrogram.

    samples = load_audio("speech.wav")           # float32 in [-1, 1], mono, 16 kHz
    features = log_mel_spectrogram(samples)      # (80, frames): one frame per 10 ms

Wav files are read with the standard library's `wave` module (integer PCM, 8/16/24/32 bits, any
channel count: channels are averaged). Other sample rates are resampled to 16 kHz with a
windowed-sinc (band-limited) interpolator, so nothing above the new Nyquist frequency aliases.

The spectrogram follows Whisper's recipe (and faster-whisper's numpy port of it): a 400-sample
(25 ms) periodic Hann window every 160 samples (10 ms), frames centred by reflect-padding 200
samples on each side, the power spectrum of each frame, 80 Slaney-style mel filters (computed
here; they equal openai-whisper's mel_filters.npz), log10 clamped at 1e-10, everything below
the loudest value minus 8 raised to it (the maximum over the whole recording, as faster-whisper
does), then (x + 4) / 4.

It is computed in numpy, not in a luminar graph, deliberately: it is input preparation, like
tokenizing text, done once per recording over the whole file (the clamp needs the global
maximum before any 30 s window is cut), and np.fft's FFT is O(n log n) and exact to float32
where a graph would spell the transform as a 400 x 201 DFT matmul.
"""
from __future__ import annotations

import math
import os
import wave

import numpy as np

from ..errors import InputError, ShapeError

SAMPLE_RATE = 16_000
N_FFT = 400          # 25 ms window
HOP_LENGTH = 160     # 10 ms hop
N_MELS = 80
CHUNK_SECONDS = 30
CHUNK_FRAMES = CHUNK_SECONDS * SAMPLE_RATE // HOP_LENGTH  # 3000 frames in a window


# -- reading ---------------------------------------------------------------------------------------
def read_wav(path) -> tuple[np.ndarray, int]:
    """(samples float32 mono in [-1, 1], sample rate) of an integer-PCM wav file."""
    path = os.fspath(path)
    if not os.path.isfile(path):
        raise InputError(f"{path}: no such file")
    try:
        with wave.open(path, "rb") as w:
            channels, width, rate, count = w.getnchannels(), w.getsampwidth(), w.getframerate(), w.getnframes()
            raw = w.readframes(count)
    except (wave.Error, EOFError) as e:
        raise InputError(f"{path}: not a readable PCM wav file ({e}); convert it to 16-bit PCM wav, "
                         f"e.g. ffmpeg -i IN -ar 16000 -ac 1 OUT.wav") from None
    if rate <= 0 or channels <= 0:
        raise InputError(f"{path}: wav header has {channels} channels at {rate} Hz")
    frames = len(raw) // (width * channels)  # a truncated file yields the complete frames it has
    raw = raw[:frames * width * channels]
    if width == 1:  # 8-bit wav is unsigned
        values = (np.frombuffer(raw, np.uint8).astype(np.float32) - 128.0) / 128.0
    elif width == 2:
        values = np.frombuffer(raw, "<i2").astype(np.float32) / 32768.0
    elif width == 3:  # 24-bit: widen each little-endian triple to the top of an int32
        triples = np.frombuffer(raw, np.uint8).reshape(-1, 3).astype(np.int32)
        values = ((triples[:, 0] << 8 | triples[:, 1] << 16 | triples[:, 2] << 24) >> 8).astype(np.float32) / 8388608.0
    elif width == 4:
        values = (np.frombuffer(raw, "<i4").astype(np.float64) / 2147483648.0).astype(np.float32)
    else:
        raise InputError(f"{path}: {8 * width}-bit wav samples are not supported (8, 16, 24 or 32-bit PCM)")
    return values.reshape(frames, channels).mean(axis=1, dtype=np.float32), rate


def resample(samples: np.ndarray, rate: int, new_rate: int = SAMPLE_RATE) -> np.ndarray:
    """Band-limited resampling: each output sample is a Hann-windowed sinc interpolation of the
    input around its position, with the cutoff at the lower of the two Nyquist frequencies."""
    samples = np.asarray(samples, np.float32)
    if rate == new_rate or len(samples) == 0:
        return samples
    if rate <= 0 or new_rate <= 0:
        raise InputError(f"resample: sample rates must be > 0, got {rate} -> {new_rate}")
    cutoff = min(1.0, new_rate / rate)  # in units of the input's Nyquist frequency
    half_width = int(math.ceil(16 / cutoff))  # 16 zero crossings of the sinc each side
    count = int(len(samples) * new_rate // rate)
    padded = np.pad(samples.astype(np.float64), (half_width, half_width + 1))
    out = np.empty(count, np.float32)
    taps = np.arange(-half_width, half_width + 1)
    for start in range(0, count, 8192):  # in blocks: a (block, taps) matrix at a time
        position = np.arange(start, min(count, start + 8192)) * (rate / new_rate)
        base = np.floor(position).astype(np.int64)
        offset = (base[:, None] + taps[None, :]) - position[:, None]  # distance to each input sample
        kernel = cutoff * np.sinc(cutoff * offset) * (0.5 + 0.5 * np.cos(np.pi * offset / (half_width + 1)))
        out[start:start + len(position)] = np.sum(kernel * padded[base[:, None] + taps[None, :] + half_width], axis=1)
    return out


def load_audio(path, sample_rate: int = SAMPLE_RATE) -> np.ndarray:
    """A wav file as float32 mono samples at `sample_rate` (resampled when it differs)."""
    samples, rate = read_wav(path)
    return resample(samples, rate, sample_rate)


# -- features --------------------------------------------------------------------------------------
def mel_filters(sample_rate: int = SAMPLE_RATE, n_fft: int = N_FFT, n_mels: int = N_MELS) -> np.ndarray:
    """(n_mels, n_fft // 2 + 1) triangular filters on the Slaney mel scale (linear below 1 kHz,
    logarithmic above), each normalized to unit area ("slaney" norm), as librosa and Whisper use."""
    def hz_to_mel(hz):
        hz = np.asarray(hz, np.float64)
        linear = hz / (200.0 / 3)
        return np.where(hz >= 1000.0, 15.0 + np.log(np.maximum(hz, 1e-10) / 1000.0) / (np.log(6.4) / 27.0), linear)

    def mel_to_hz(mel):
        return np.where(mel >= 15.0, 1000.0 * np.exp((np.log(6.4) / 27.0) * (mel - 15.0)), mel * (200.0 / 3))

    edges = mel_to_hz(np.linspace(0.0, hz_to_mel(sample_rate / 2), n_mels + 2))  # n_mels triangles' corners
    bins = np.fft.rfftfreq(n_fft, 1.0 / sample_rate)
    rising = (bins[None, :] - edges[:-2, None]) / (edges[1:-1] - edges[:-2])[:, None]
    falling = (edges[2:, None] - bins[None, :]) / (edges[2:] - edges[1:-1])[:, None]
    triangles = np.maximum(0.0, np.minimum(rising, falling))
    return (triangles * (2.0 / (edges[2:] - edges[:-2]))[:, None]).astype(np.float32)


_FILTERS = mel_filters()
_FRAMES_PER_BLOCK = 6000  # one minute


def log_mel_spectrogram(samples: np.ndarray, padding: int = HOP_LENGTH) -> np.ndarray:
    """(80, frames) Whisper log-mel features of 16 kHz mono `samples` (see the module docstring).

    `padding` zero samples are appended first (faster-whisper appends one hop). A recording
    shorter than the reflect padding (201 samples after padding) has no frame and is refused."""
    samples = np.asarray(samples, np.float32)
    if samples.ndim != 1:
        raise ShapeError(f"log_mel_spectrogram: expected mono samples (n,), got shape {samples.shape}")
    if not np.all(np.isfinite(samples)):
        raise InputError("log_mel_spectrogram: the audio contains NaN or infinite samples")
    samples = np.pad(samples, (0, padding))
    if len(samples) <= N_FFT // 2:
        raise InputError(f"audio too short: {len(samples) - padding} samples ({(len(samples) - padding) / SAMPLE_RATE * 1000:.1f} "
                         f"ms); a frame needs at least {N_FFT // 2 + 1 - padding} samples")
    padded = np.pad(samples, N_FFT // 2, mode="reflect")
    frames = np.lib.stride_tricks.sliding_window_view(padded, N_FFT)[::HOP_LENGTH][:-1]  # the last is dropped
    window = (0.5 - 0.5 * np.cos(2 * np.pi * np.arange(N_FFT) / N_FFT)).astype(np.float32)  # periodic Hann
    mel = np.empty((N_MELS, len(frames)), np.float32)
    for start in range(0, len(frames), _FRAMES_PER_BLOCK):  # blocks bound the memory of an hour of audio
        spectrum = np.fft.rfft(frames[start:start + _FRAMES_PER_BLOCK] * window, axis=-1)
        power = (spectrum.real ** 2 + spectrum.imag ** 2).astype(np.float32)
        mel[:, start:start + len(power)] = _FILTERS @ power.T
    log_spec = np.log10(np.maximum(mel, 1e-10))
    log_spec = np.maximum(log_spec, log_spec.max() - 8.0)
    return ((log_spec + 4.0) / 4.0).astype(np.float32)
