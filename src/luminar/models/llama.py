"""Decoder-only transformers of the Llama family as one luminar graph, plus their KV cache.

Llama 2/3, SmolLM, Mistral, Qwen2/3, Phi-3 and Gemma 1/2/3 are one graph with features switched
on by LlamaConfig: biases, q/k norms, Gemma's four norms per layer, (1 + w) norm weights and
scaled embeddings, GELU or SiLU gates, soft-capping, and sliding-window layers. The config
readers (from config.json and from GGUF metadata) refuse any field they do not implement, and
Weights refuses a checkpoint with tensors the graph does not read.

One graph serves prefill and decode. Its inputs are

- ``tokens``  (s,) int32: the new tokens (the whole prompt at prefill, one token per decode step)
- ``k_cache`` / ``v_cache`` (t, layers, kv_heads, head_dim): keys and values of the tokens seen
  so far, position-major so a prefix of one preallocated buffer is passed without a copy.
  Slot 0 is a dummy that attention masks out: luminar's symbolic sizes are >= 1, so an empty
  cache is the one-slot cache, and the tokens seen so far are t - 1. The new tokens sit at
  absolute positions t - 1 .. t - 2 + s (RoPE angles are computed in the graph from t).
  With sliding-window layers, k_cache holds only the full-attention layers, and
- ``k_local`` / ``v_local`` (u, sliding layers, kv_heads, head_dim) hold the last window - 1
  tokens at most (slot 0 again masked), so the new tokens' positions come from the bound dim
  ``p`` (tokens seen + 1) instead of t; a query sees the keys less than `window` positions back.
- ``inv_freq`` (head_dim / 2,): RoPE inverse frequencies (a fixed input, set once like a weight,
  so Llama 3 / linear rope scaling is only a different array); ``inv_freq_local`` for sliding
  layers with their own RoPE base (Gemma 3)
- the weights, declared by the I/O layer (quantized GGUF blocks stay quantized; dequantization
  is primitives the compiler fuses into the matmuls)

and the symbolic dim ``r`` (how many of the last positions get logits: 1 when generating, s for
``logits()``), bound at call time. Outputs: ``logits`` (r, vocab) and, per layer l, the new
tokens' keys ``k{l}`` and values ``v{l}`` (s, kv_heads, head_dim), which the KV cache appends.

RoPE layouts: Hugging Face checkpoints rotate the two halves of each head (``rotate_half``);
GGUF files of the ``llama`` architecture store attn_q/attn_k rows permuted for llama.cpp, whose
rotation is on adjacent pairs. Instead of undoing the permutation on the weights, the graph
rotates adjacent pairs for those files (``LlamaConfig.rope_interleaved``): q and k then carry
the same permutation of each head's dims, and attention's dot products are unchanged.
"""
from __future__ import annotations

import math
import os
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass

import numpy as np

import luminar as lm

from ..errors import LuminarError, ShapeError, UnsupportedError, ValueDomainError, WeightFileError
from ..graph import Graph, parse_dim
from ..io.quant import INT8_FORMATS, QuantizedWeight, block_linear, int8_linear
from ..tensor import GraphTensor
from .generate import SamplingParams, Sampler, generate_ids, stop_at

MASKED = -1.0e30  # a finite "minus infinity" for masked attention scores (constants must be finite)


# -- configuration -------------------------------------------------------------------------------
FULL, SLIDING = "full", "sliding"  # layer kinds: attention over all earlier tokens, or the last `window`
_ACTIVATIONS = {"silu": "silu", "gelu_pytorch_tanh": "gelu_tanh", "gelu_new": "gelu_tanh", "gelu_tanh": "gelu_tanh",
                "gelu": "gelu"}
_ROPE_TYPES = ("default", "linear", "llama3")


@dataclass(frozen=True)
class LlamaConfig:
    """Everything about a checkpoint that changes the computation (the loaders refuse anything
    else that would). The defaults are Llama's; the other families switch features on."""
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    rms_norm_eps: float = 1e-5
    rope_theta: float = 10000.0
    rope_scaling: dict | None = None  # Hugging Face's rope_scaling / rope_parameters (llama3, linear)
    tie_word_embeddings: bool = False
    attention_bias: bool = False  # q/k/v projection biases (Qwen2; Llama's attention_bias)
    output_bias: bool = False  # an o_proj bias (Llama's attention_bias)
    mlp_bias: bool = False  # gate/up/down biases (Llama's mlp_bias)
    rope_interleaved: bool = False  # rotate adjacent pairs (GGUF llama layout) instead of halves
    max_position_embeddings: int = 2048
    architecture: str = "llama"
    hidden_act: str = "silu"  # silu, gelu_tanh or gelu (the gated MLP's activation)
    layer_types: tuple[str, ...] | None = None  # FULL / SLIDING per layer; None: all FULL
    sliding_window: int | None = None  # a SLIDING layer's query sees keys at distance < window
    rope_theta_local: float | None = None  # RoPE base of SLIDING layers (Gemma 3); None: rope_theta
    rope_scaling_local: dict | None = None  # and their scaling (None: no scaling when rope_theta_local is set)
    qk_norm: bool = False  # RMS norms of each head's q and k before RoPE (Qwen3, Gemma 3)
    sandwich_norms: bool = False  # Gemma 2/3: norms after attention and MLP too, pre_feedforward_layernorm
    norm_offset: float = 0.0  # RMS norm weight is (offset + w): Gemma checkpoints store w - 1
    embedding_scale: float | None = None  # token embeddings times this (Gemma: sqrt(hidden_size))
    query_scale: float | None = None  # attention scores scale; None: 1 / sqrt(head_dim)
    attn_softcap: float | None = None  # scores -> cap * tanh(scores / cap) (Gemma 2)
    final_softcap: float | None = None  # logits -> cap * tanh(logits / cap) (Gemma 2)

    def __post_init__(self):
        if self.num_attention_heads % self.num_key_value_heads:
            raise WeightFileError(f"llama config: {self.num_attention_heads} attention heads are not a multiple of "
                                  f"{self.num_key_value_heads} key/value heads")
        if self.head_dim % 2:
            raise WeightFileError(f"llama config: head_dim must be even for RoPE, got {self.head_dim}")
        if self.hidden_act not in ("silu", "gelu_tanh", "gelu"):
            raise UnsupportedError(f"{self.architecture} config: hidden activation {self.hidden_act!r} is not supported")
        for scaling in (self.rope_scaling, self.rope_scaling_local):
            kind = _rope_type(scaling)
            if kind not in _ROPE_TYPES:
                raise UnsupportedError(f"{self.architecture} config: rope scaling {kind!r} is not supported "
                                       f"({', '.join(_ROPE_TYPES)})")
        if self.layer_types is not None:
            if len(self.layer_types) != self.num_hidden_layers or set(self.layer_types) - {FULL, SLIDING}:
                raise WeightFileError(f"{self.architecture} config: layer_types {self.layer_types} do not give "
                                      f"{FULL!r} or {SLIDING!r} for each of the {self.num_hidden_layers} layers")
            if SLIDING in self.layer_types and not (isinstance(self.sliding_window, int) and self.sliding_window >= 1):
                raise WeightFileError(f"{self.architecture} config: sliding-window layers need a sliding_window "
                                      f">= 1, got {self.sliding_window!r}")

    @property
    def groups(self) -> int:
        """Query heads per key/value head (GQA)."""
        return self.num_attention_heads // self.num_key_value_heads

    def kinds(self) -> tuple[str, ...]:
        """FULL or SLIDING for each layer."""
        return self.layer_types or (FULL,) * self.num_hidden_layers

    @property
    def has_sliding(self) -> bool:
        return SLIDING in self.kinds()

    def layers_of(self, kind: str) -> list[int]:
        return [i for i, k in enumerate(self.kinds()) if k == kind]

    @classmethod
    def from_hf(cls, config: dict) -> LlamaConfig:
        """From a Hugging Face config.json: Llama, Mistral, Qwen2, Qwen3, Phi-3, Gemma, Gemma 2, Gemma 3
        (text). A field this reader does not know is refused unless it is null or false (see
        _HF_INERT for the fields known not to change the computation)."""
        return _config_from_hf(cls, config)

    @classmethod
    def from_gguf(cls, metadata: dict, tensors: dict) -> LlamaConfig:
        """From GGUF metadata (`{arch}.*` keys) and tensor names (tied when there is no output.weight):
        architectures llama, qwen2 and gemma3. An `{arch}.*` key this reader does not know is refused."""
        return _config_from_gguf(cls, metadata, tensors)


def _rope_type(scaling: dict | None) -> str:
    scaling = scaling or {}
    return scaling.get("rope_type", scaling.get("type", "default"))


# -- Hugging Face config.json --------------------------------------------------------------------
_HF_KINDS = ("llama", "mistral", "qwen2", "qwen3", "phi3", "gemma", "gemma2", "gemma3_text")
_GEMMAS = ("gemma", "gemma2", "gemma3_text")
# Fields that do not change inference: ids, bookkeeping, dropout (off at inference), the default
# initialisation, and the inputs of derived fields read below (use_sliding_window ...).
_HF_INERT = {"architectures", "model_type", "transformers_version", "torch_dtype", "dtype", "bos_token_id",
             "eos_token_id", "pad_token_id", "unk_token_id", "use_cache", "initializer_range", "attention_dropout",
             "embd_pdrop", "resid_pdrop", "_name_or_path", "name_or_path", "tokenizer_class", "output_attentions",
             "output_hidden_states", "return_dict", "id2label", "label2id", "problem_type", "max_position_embeddings",
             "pretraining_tp", "use_sliding_window", "max_window_layers", "sliding_window_pattern",
             "_sliding_window_pattern", "original_max_position_embeddings", "chunk_size_feed_forward",
             "cache_implementation", "keys_to_ignore_at_inference",
             "tie_word_embeddings", "head_dim", "rms_norm_eps", "vocab_size", "hidden_size", "intermediate_size",
             "num_hidden_layers", "num_attention_heads", "num_key_value_heads", "rope_theta", "rope_scaling",
             "rope_parameters", "rope_local_base_freq", "attention_bias", "mlp_bias", "hidden_act",
             "hidden_activation", "sliding_window", "layer_types", "query_pre_attn_scalar",
             "attn_logit_softcapping", "final_logit_softcapping", "use_bidirectional_attention",
             "partial_rotary_factor"}


def _config_from_hf(cls, config: dict) -> LlamaConfig:
    kind = config.get("model_type", "llama")
    if kind not in _HF_KINDS:
        raise UnsupportedError(f"config.json: architecture {kind!r} is not supported "
                               f"(supported model_type: {', '.join(_HF_KINDS)})")
    for key, value in config.items():
        if key not in _HF_INERT and value not in (None, False):
            raise UnsupportedError(f"config.json: {kind} field {key!r} = {value!r} is not understood by luminar "
                                   f"and may change the computation")
    if config.get("use_bidirectional_attention"):
        raise UnsupportedError(f"config.json: {kind} use_bidirectional_attention=true is not supported")
    gemma = kind in _GEMMAS
    try:
        heads, layers, hidden = config["num_attention_heads"], config["num_hidden_layers"], config["hidden_size"]
        global_rope, local_rope = _hf_rope(config, kind)
        if float(global_rope.get("partial_rotary_factor", config.get("partial_rotary_factor") or 1.0)) != 1.0:
            raise UnsupportedError(f"config.json: {kind} partial_rotary_factor != 1 (partial RoPE) is not supported")
        head_dim = config.get("head_dim") or hidden // heads
        act = config.get("hidden_activation") or config.get("hidden_act") or "silu"
        if act not in _ACTIVATIONS:
            raise UnsupportedError(f"config.json: {kind} hidden activation {act!r} is not supported "
                                   f"({', '.join(_ACTIVATIONS)})")
        bias = bool(config.get("attention_bias", kind == "qwen2"))
        types = _hf_layer_types(config, kind, layers)
        query_scale = config["query_pre_attn_scalar"] ** -0.5 if gemma and kind != "gemma" else None
        return cls(vocab_size=config["vocab_size"], hidden_size=hidden, intermediate_size=config["intermediate_size"],
                   num_hidden_layers=layers, num_attention_heads=heads,
                   num_key_value_heads=config.get("num_key_value_heads") or heads, head_dim=head_dim,
                   rms_norm_eps=config.get("rms_norm_eps", 1e-6),
                   rope_theta=float(global_rope.get("rope_theta", 10000.0)), rope_scaling=_scaling(global_rope),
                   rope_theta_local=None if local_rope is None else float(local_rope.get("rope_theta", 10000.0)),
                   rope_scaling_local=None if local_rope is None else _scaling(local_rope),
                   tie_word_embeddings=config.get("tie_word_embeddings", gemma), attention_bias=bias,
                   output_bias=bias and kind in ("llama", "qwen3", "gemma", "gemma2", "gemma3_text"),
                   mlp_bias=bool(config.get("mlp_bias")),
                   max_position_embeddings=config.get("max_position_embeddings", 2048), architecture=kind,
                   hidden_act=_ACTIVATIONS[act], layer_types=types,
                   sliding_window=config.get("sliding_window") if types else None,
                   qk_norm=kind in ("qwen3", "gemma3_text"), sandwich_norms=kind in ("gemma2", "gemma3_text"),
                   norm_offset=1.0 if gemma else 0.0, embedding_scale=math.sqrt(hidden) if gemma else None,
                   query_scale=query_scale, attn_softcap=config.get("attn_logit_softcapping"),
                   final_softcap=config.get("final_logit_softcapping"))
    except KeyError as e:
        raise WeightFileError(f"config.json: missing key {e.args[0]!r}") from None


def _hf_rope(config: dict, kind: str) -> tuple[dict, dict | None]:
    """(rope settings of full-attention layers, of sliding layers or None when they are the same).

    transformers >= 5 writes `rope_parameters` (nested per layer type for Gemma 3); older files
    have rope_theta and rope_scaling at the top level (and Gemma 3 a rope_local_base_freq)."""
    params = config.get("rope_parameters") or {}
    if "full_attention" in params or "sliding_attention" in params:
        return params.get("full_attention", {}), params.get("sliding_attention", params.get("full_attention", {}))
    merged = {"rope_theta": config.get("rope_theta", 10000.0), **(config.get("rope_scaling") or {}), **params}
    if kind == "gemma3_text":
        return merged, {"rope_theta": config.get("rope_local_base_freq", 10000.0)}
    return merged, None


def _scaling(rope: dict) -> dict | None:
    return None if _rope_type(rope) == "default" else dict(rope)


def _hf_layer_types(config: dict, kind: str, layers: int) -> tuple[str, ...] | None:
    """Which layers attend through a sliding window, or None when none does."""
    names = {"full_attention": FULL, "sliding_attention": SLIDING}
    given = config.get("layer_types")
    window = config.get("sliding_window")
    if given is not None:
        unknown = sorted(set(given) - set(names))
        if unknown:
            raise UnsupportedError(f"config.json: {kind} layer type {unknown[0]!r} is not supported "
                                   f"(full_attention, sliding_attention)")
        types = tuple(names[t] for t in given)
    elif kind in ("mistral", "phi3"):
        types = (SLIDING,) * layers if window else None
    elif kind in ("qwen2", "qwen3"):
        first = config.get("max_window_layers", layers)
        types = tuple(SLIDING if config.get("use_sliding_window") and i >= first else FULL for i in range(layers))
    elif kind == "gemma2":
        types = tuple(SLIDING if i % 2 == 0 else FULL for i in range(layers))
    elif kind == "gemma3_text":
        pattern = config.get("sliding_window_pattern", config.get("_sliding_window_pattern", 6))
        types = tuple(FULL if (i + 1) % pattern == 0 else SLIDING for i in range(layers))
    else:
        types = None
    if types is None or SLIDING not in types:
        return None
    return types


# -- GGUF metadata ---------------------------------------------------------------------------------
_GGUF_ARCHS = ("llama", "qwen2", "gemma3")
# {arch}.* keys read below or known not to change the computation; any other is refused
_GGUF_KNOWN = {"context_length", "embedding_length", "block_count", "feed_forward_length", "attention.head_count",
               "attention.head_count_kv", "attention.key_length", "attention.value_length",
               "attention.layer_norm_rms_epsilon", "rope.freq_base", "rope.dimension_count", "vocab_size",
               "attention.sliding_window", "rope.scaling.type", "rope.scaling.factor",
               "rope.scaling.original_context_length", "expert_count", "expert_used_count"}


def _config_from_gguf(cls, metadata: dict, tensors: dict) -> LlamaConfig:
    arch = metadata.get("general.architecture", "llama")
    if arch not in _GGUF_ARCHS:
        raise UnsupportedError(f"GGUF architecture {arch!r} is not supported ({', '.join(_GGUF_ARCHS)})")
    for name in metadata:
        if name.startswith(f"{arch}.") and name[len(arch) + 1:] not in _GGUF_KNOWN:
            raise UnsupportedError(f"GGUF metadata {name} = {metadata[name]!r} is not understood by luminar "
                                   f"and may change the computation")

    def key(name, default=None):
        value = metadata.get(f"{arch}.{name}", default)
        if value is None:
            raise WeightFileError(f"GGUF metadata: missing {arch}.{name}")
        return value

    if int(key("expert_count", 0)):
        raise UnsupportedError(f"GGUF {arch}: mixture-of-experts models ({arch}.expert_count) are not supported")
    heads = int(key("attention.head_count"))
    hidden = int(key("embedding_length"))
    layers = int(key("block_count"))
    if "token_embd.weight" not in tensors:
        raise WeightFileError("GGUF file has no token_embd.weight tensor")
    vocab = int(tensors["token_embd.weight"].shape[0])
    head_dim = int(key("attention.key_length", hidden // heads))
    if int(key("attention.value_length", head_dim)) != head_dim:
        raise UnsupportedError(f"GGUF {arch}: value heads of another size than key heads are not supported")
    if int(key("rope.dimension_count", head_dim)) != head_dim:
        raise UnsupportedError(f"GGUF {arch}: partial RoPE ({arch}.rope.dimension_count "
                               f"{key('rope.dimension_count')} of head size {head_dim}) is not supported")
    scaling = _gguf_rope_scaling(arch, metadata)
    options = {}
    if arch == "gemma3":
        if layers == 62:  # llama.cpp scales the 27B model's queries by hidden/heads, a fact not in the file
            raise UnsupportedError("GGUF gemma3: the 27B model's attention scale is not supported")
        window = int(key("attention.sliding_window"))
        options = dict(layer_types=tuple(FULL if (i + 1) % 6 == 0 else SLIDING for i in range(layers)),
                       sliding_window=window, rope_theta_local=10000.0, hidden_act="gelu_tanh", qk_norm=True,
                       sandwich_norms=True, embedding_scale=math.sqrt(hidden))  # llama.cpp's gemma3 constants
    elif f"{arch}.attention.sliding_window" in metadata:
        raise UnsupportedError(f"GGUF {arch}: {arch}.attention.sliding_window is not supported for this architecture")
    return cls(vocab_size=vocab, hidden_size=hidden, intermediate_size=int(key("feed_forward_length")),
               num_hidden_layers=layers, num_attention_heads=heads,
               num_key_value_heads=int(key("attention.head_count_kv", heads)), head_dim=head_dim,
               rms_norm_eps=float(key("attention.layer_norm_rms_epsilon", 1e-5)),
               rope_theta=float(key("rope.freq_base", 10000.0)), rope_scaling=scaling,
               tie_word_embeddings="output.weight" not in tensors,
               attention_bias="blk.0.attn_q.bias" in tensors, output_bias="blk.0.attn_output.bias" in tensors,
               rope_interleaved=arch == "llama",  # llama.cpp's convert permutes q/k rows for llama only
               max_position_embeddings=int(key("context_length", 2048)), architecture=arch, **options)


def _gguf_rope_scaling(arch: str, metadata: dict) -> dict | None:
    kind = metadata.get(f"{arch}.rope.scaling.type", "none")
    if kind == "none":
        return None
    if kind != "linear":
        raise UnsupportedError(f"GGUF {arch}: rope scaling {kind!r} is not supported (none, linear)")
    return {"rope_type": "linear", "factor": float(metadata[f"{arch}.rope.scaling.factor"])}


def rope_inv_freq(config: LlamaConfig, local: bool = False, factors: np.ndarray | None = None) -> np.ndarray:
    """RoPE inverse frequencies theta^(-2i/d), with Hugging Face's llama3 or linear scaling, for
    full-attention layers or (local) sliding ones; `factors` (a GGUF's rope_freqs.weight) divide them."""
    d = config.head_dim
    theta, scaling = config.rope_theta, config.rope_scaling
    if local and config.rope_theta_local is not None:
        theta, scaling = config.rope_theta_local, config.rope_scaling_local
    inv = 1.0 / (theta ** (np.arange(0, d, 2, dtype=np.float64) / d))
    scaling = scaling or {}
    kind = _rope_type(scaling)
    if kind == "linear":
        inv = inv / scaling["factor"]
    elif kind == "llama3":
        factor, low, high = scaling["factor"], scaling["low_freq_factor"], scaling["high_freq_factor"]
        old = scaling["original_max_position_embeddings"]
        wavelen = 2 * math.pi / inv
        scaled = np.where(wavelen > old / low, inv / factor, inv)
        smooth = (old / wavelen - low) / (high - low)
        medium = (wavelen >= old / high) & (wavelen <= old / low)
        inv = np.where(medium, (1 - smooth) * scaled / factor + smooth * scaled, scaled)
    if factors is not None:
        inv = inv / factors.astype(np.float64)
    return inv.astype(np.float32)


def rope_inputs(config: LlamaConfig, weights: Weights, graph: Graph) -> dict[str, np.ndarray]:
    """The RoPE frequency inputs `graph` declares (inv_freq, and inv_freq_local for Gemma 3's sliding layers)."""
    rope = {"inv_freq": rope_inv_freq(config, factors=weights.rope_factors)}
    if "inv_freq_local" in graph.inputs:
        rope["inv_freq_local"] = rope_inv_freq(config, local=True)
    return rope


# -- weights ---------------------------------------------------------------------------------------
# Hugging Face parameter names (the canonical names here) and their GGUF counterparts.
_LAYER_GGUF = {"input_layernorm.weight": "attn_norm.weight", "post_attention_layernorm.weight": "ffn_norm.weight",
               "self_attn.q_proj.weight": "attn_q.weight", "self_attn.k_proj.weight": "attn_k.weight",
               "self_attn.v_proj.weight": "attn_v.weight", "self_attn.o_proj.weight": "attn_output.weight",
               "self_attn.q_proj.bias": "attn_q.bias", "self_attn.k_proj.bias": "attn_k.bias",
               "self_attn.v_proj.bias": "attn_v.bias", "self_attn.o_proj.bias": "attn_output.bias",
               "mlp.gate_proj.weight": "ffn_gate.weight", "mlp.up_proj.weight": "ffn_up.weight",
               "mlp.down_proj.weight": "ffn_down.weight", "self_attn.q_norm.weight": "attn_q_norm.weight",
               "self_attn.k_norm.weight": "attn_k_norm.weight"}
# Gemma 2/3 have four norms per layer; GGUF's ffn_norm is the one before the MLP
_SANDWICH_GGUF = {**_LAYER_GGUF, "post_attention_layernorm.weight": "post_attention_norm.weight",
                  "pre_feedforward_layernorm.weight": "ffn_norm.weight",
                  "post_feedforward_layernorm.weight": "post_ffw_norm.weight"}
_GLOBAL_GGUF = {"model.embed_tokens.weight": "token_embd.weight", "model.norm.weight": "output_norm.weight",
                "lm_head.weight": "output.weight"}


def gguf_name(hf_name: str, sandwich: bool = False) -> str:
    """The GGUF tensor name of a Hugging Face parameter name (model.layers.3.mlp.up_proj.weight -> blk.3.ffn_up.weight)."""
    if hf_name in _GLOBAL_GGUF:
        return _GLOBAL_GGUF[hf_name]
    _, _, layer, rest = hf_name.split(".", 3)  # model.layers.{i}.rest
    return f"blk.{layer}.{(_SANDWICH_GGUF if sandwich else _LAYER_GGUF)[rest]}"


class Weights:
    """Declares weights as graph inputs by their Hugging Face names and collects their arrays.

    `declare(g, name)` returns (GraphTensor, {input name: array}) for one weight: the I/O layer's
    `dense` for float arrays, `quant.weight` for GGUF tensors (which stay quantized). `stored`
    lists the checkpoint's own names and `source(name)` maps a canonical name to one of them, so
    `check_all_used()` can refuse a checkpoint with tensors the model never read (as torch's
    strict load_state_dict does): such a tensor means a feature this loader does not implement.
    `linears` stacks the weights of layers that share an input (q/k/v, gate/up) into one matmul.
    """

    def __init__(self, has: Callable[[str], bool], declare: Callable, shape_of: Callable[[str], tuple],
                 stored: Sequence[str] = (), source: Callable[[str], str] = lambda name: name,
                 storage: Callable[[str], object] = lambda name: None, stack: Callable | None = None):
        self.has, self._declare, self.shape_of = has, declare, shape_of
        # storage(name): what must match for weights to stack by rows (format, dtype, row shape);
        # stack(g, names, joined): declares the stacked weight like declare (see `linears`)
        self.storage, self._stack = storage, stack
        self.stored, self._source = list(stored), source
        self.stacked: dict[str, list[str]] = {}  # a stacked weight's name -> the names it stacks
        self.arrays: dict[str, np.ndarray] = {}
        self.declared: dict[tuple, GraphTensor] = {}  # a tied weight is declared once
        self.used: set[str] = set()  # stored names consumed, by the graph or by the loader
        self.rope_factors: np.ndarray | None = None  # a GGUF's rope_freqs.weight (llama 3 frequency factors)
        self.activations = "float"  # or "int8": linear layers quantize their input per block (int8_linear)
        # float linear layers of block-quantized weights as block dots (quant.block_linear): the
        # faster matvec of a one-token step; a prompt's tiled matmuls need the dequantized weight
        self.block_dots = False
        # ids of the graphs with a linear layer in a block form (block or int8 dots): graphs for
        # one-token steps, whose prompts need the plain graph (LlamaModel compiles both)
        self.block_graphs: set[int] = set()
        self.quantized: dict[tuple, QuantizedWeight] = {}  # block-quantized GGUF weights, by (id(graph), name)
        self.quantized_inputs: dict[int, tuple] = {}  # id(x) -> (x, its quantizations for int8_linear) (x kept: ids stay unique)

    def __call__(self, g: Graph, name: str, shape: tuple) -> GraphTensor:
        """The weight `name` as a graph tensor of `shape` (declared once per graph)."""
        if (id(g), name) not in self.declared:
            self._check(name, shape)
            self._register(g, name, *self._declare(g, name))
            self.used.add(self.source(name))
        return self.declared[id(g), name]

    def source(self, name: str) -> str:
        """The checkpoint's name for `name` (a stacked weight: its parts' names joined, see `linears`)."""
        if name in self.stacked:
            return _joined_name([self._source(n) for n in self.stacked[name]])
        return self._source(name)

    def _check(self, name: str, shape: tuple):
        stored = self.source(name)
        called = repr(name) if stored == name else f"{stored!r} ({name})"
        if not self.has(name):
            raise WeightFileError(f"weights: missing tensor {called}")
        if tuple(self.shape_of(name)) != tuple(shape):
            raise WeightFileError(f"weights: tensor {called} has shape {tuple(self.shape_of(name))}, "
                                  f"the config expects {tuple(shape)}")

    def _register(self, g: Graph, name: str, tensor, arrays: dict[str, np.ndarray]):
        if isinstance(tensor, QuantizedWeight):
            self.quantized[id(g), name], tensor = tensor, tensor.dequantized()
        self.arrays.update(arrays)
        self.declared[id(g), name] = tensor

    def linears(self, g: Graph, x: GraphTensor, layers: Sequence[tuple[str, int]], n_in: int,
                bias: bool = False) -> list[GraphTensor]:
        """The linear layers `layers` ((name, n_out) each: weight name + ".weight", bias name +
        ".bias") of one input x, as few matmuls as the storage allows: consecutive weights stored
        alike are stacked by rows into one weight (copied once, at graph building) and the product
        split back by columns. Each output row is the same dot as before, so results are unchanged;
        a decode step runs one matvec per stack (q, k and v: one kernel, one parallel region and
        one pass over x, where there were three)."""
        for name, n_out in layers:  # (each weight checked by its own name first)
            self._check(name + ".weight", (n_out, n_in))
        outputs, group = [], []
        for i, (name, n_out) in enumerate(layers):
            group.append((name, n_out))
            if i + 1 < len(layers) and self._stack is not None and \
                    self.storage(name + ".weight") == self.storage(layers[i + 1][0] + ".weight"):
                continue
            outputs += self._stacked_linear(g, x, group, n_in)
            group = []
        return [y + self(g, name + ".bias", (n_out,)) if bias else y for y, (name, n_out) in zip(outputs, layers)]

    def _stacked_linear(self, g: Graph, x: GraphTensor, group: list[tuple[str, int]], n_in: int) -> list[GraphTensor]:
        names = [name + ".weight" for name, _ in group]
        if len(group) == 1:
            return [self.linear(g, x, names[0], (group[0][1], n_in), None)]
        joined = _joined_name(names)
        if (id(g), joined) not in self.declared:
            self._register(g, joined, *self._stack(g, names, joined))
            self.stacked[joined] = names
            self.used.update(map(self.source, names))
        rows = sum(n_out for _, n_out in group)
        y, begin = self.linear(g, x, joined, (rows, n_in), None), 0
        outputs = []
        for _, n_out in group:
            outputs.append(y.narrow(-1, begin, n_out))
            begin += n_out
        return outputs

    def linear(self, g: Graph, x: GraphTensor, name: str, shape: tuple, bias: GraphTensor | None) -> GraphTensor:
        """x @ weight.T (+ bias) for the weight `name` of `shape` (n_out, n_in): in float32 (with
        `block_dots`, a Q4_0 / Q4_1 weight as float block dots: io/quant.block_linear), or with
        `activations` "int8" by integer dots on the int8-quantized rows of x (io/quant.int8_linear:
        llama.cpp's Q8_1 activations), which needs a block-quantized GGUF weight."""
        weight = self(g, name, shape)
        quantized = self.quantized.get((id(g), name))
        # (not for an x made by a Contiguous, a reshaped permuted view: it reaches the kernel through
        # its source's index, whose divisions split the loop over blocks; _attention's rows_first
        # gives the attention output without one)
        if self.activations == "float" and self.block_dots and quantized is not None and \
                quantized.qtype in ("Q4_0", "Q4_1") and x.node.op != "contiguous":
            self.block_graphs.add(id(g))
            y = block_linear(x, quantized)
            return y if bias is None else y + bias
        if self.activations == "float":
            return lm.linear(x, weight, bias)
        if quantized is None or quantized.qtype not in INT8_FORMATS:
            stored = f"as {quantized.qtype}" if quantized else "as float (not block-quantized)"
            raise UnsupportedError(f"int8 activations: weight {self.source(name)!r} is stored {stored}; the int8 "
                                   f"dot needs a GGUF block format ({', '.join(INT8_FORMATS)}, or Q5_0 / Q4_K / "
                                   f"Q6_K, which repack into them)")
        # (q, k and v, gate and up read one input: quantized once per layout)
        self.block_graphs.add(id(g))
        y = int8_linear(x, quantized, self.quantized_inputs.setdefault(id(x), (x, {}))[1])
        return y if bias is None else y + bias

    def check_all_used(self, ignored: Callable[[str], bool] = lambda name: False):
        unused = [n for n in self.stored if n not in self.used and not ignored(n)]
        if unused:
            more = f" (and {len(unused) - 3} more)" if len(unused) > 3 else ""
            raise WeightFileError(f"weights: the checkpoint has tensors this model does not use: "
                                  f"{', '.join(map(repr, unused[:3]))}{more}; luminar does not implement what "
                                  f"they are for, so the model would compute something else")

    @classmethod
    def from_state_dict(cls, state: dict[str, np.ndarray], config: LlamaConfig | None = None) -> Weights:
        """A Hugging Face state dict; Phi-3's fused qkv_proj / gate_up_proj are split into views."""
        from ..io.quant import dense
        stored = list(state)
        state, origin = _unfused(state, config) if config is not None else (state, {})
        stacks = {}  # joined name -> the stacked array (made once for all the model's graphs)

        def stack(g, names, joined):
            if joined not in stacks:
                stacks[joined] = np.concatenate([np.asarray(state[n]) for n in names])
            return dense(g, joined, stacks[joined])

        weights = cls(lambda n: n in state, lambda g, n: dense(g, n, state[n]), lambda n: state[n].shape,
                      stored=stored, source=lambda n: origin.get(n, n),
                      storage=lambda n: (np.asarray(state[n]).dtype, tuple(state[n].shape[1:])), stack=stack)
        # transformers never reads a saved rotary_emb.inv_freq buffer (it recomputes it), nor a tied
        # lm_head that equals the embeddings; a tied one that differs is left unused: an error
        weights.used.update(n for n in stored if n.endswith("rotary_emb.inv_freq"))
        embedding, head = state.get("model.embed_tokens.weight"), state.get("lm_head.weight")
        if config is not None and config.tie_word_embeddings and head is not None and embedding is not None \
                and np.array_equal(head, embedding):
            weights.used.add("lm_head.weight")
        return weights

    @classmethod
    def from_gguf(cls, tensors: dict, config: LlamaConfig | None = None) -> Weights:
        from ..io.gguf import GGUFTensor
        from ..io.quant import quantized_weight
        sandwich = config is not None and config.sandwich_norms
        name = lambda n: gguf_name(n, sandwich)  # noqa: E731
        stacks = {}  # joined name -> the stacked GGUFTensor (made once for all the model's graphs)

        def stack(g, names, joined):
            if joined not in stacks:
                parts = [tensors[name(n)] for n in names]
                stacks[joined] = GGUFTensor(_joined_name([name(n) for n in names]),
                                            (sum(t.shape[0] for t in parts), *parts[0].shape[1:]), parts[0].qtype,
                                            {p: np.concatenate([t.parts[p] for t in parts]) for p in parts[0].parts})
            return quantized_weight(g, stacks[joined].name, stacks[joined])

        weights = cls(lambda n: name(n) in tensors, lambda g, n: quantized_weight(g, name(n), tensors[name(n)]),
                      lambda n: tuple(tensors[name(n)].shape), stored=list(tensors), source=name,
                      storage=lambda n: (tensors[name(n)].qtype, tuple(tensors[name(n)].shape[1:])), stack=stack)
        if "rope_freqs.weight" in tensors:  # llama 3 GGUFs: per-frequency divisors of the RoPE frequencies
            weights.rope_factors = tensors["rope_freqs.weight"].dequantize()
            weights.used.add("rope_freqs.weight")
        return weights


def _joined_name(names: Sequence[str]) -> str:
    """One name for weights stacked together: the shared prefix and suffix around their parts,
    joined by '+' ("model.layers.0.mlp.gate_proj.weight" and "...up_proj.weight" ->
    "model.layers.0.mlp.gate_proj+up_proj.weight")."""
    split = [n.split(".") for n in names]
    head = len(os.path.commonprefix(split))  # (of lists: the leading parts all names share)
    tail = min(len(os.path.commonprefix([p[::-1] for p in split])), min(map(len, split)) - head - 1)
    middles = [".".join(p[head:len(p) - tail]) for p in split]
    return ".".join(split[0][:head] + ["+".join(middles)] + split[0][len(split[0]) - tail:])


def _unfused(state: dict, config: LlamaConfig) -> tuple[dict, dict]:
    """Phi-3 stores q/k/v as one qkv_proj (rows q, then k, then v) and gate/up as one gate_up_proj:
    (the state with row views under Llama's names, {new name: fused name})."""
    kv_rows = config.num_key_value_heads * config.head_dim
    layouts = {"self_attn.qkv_proj.": [("self_attn.q_proj.", config.num_attention_heads * config.head_dim),
                                       ("self_attn.k_proj.", kv_rows), ("self_attn.v_proj.", kv_rows)],
               "mlp.gate_up_proj.": [("mlp.gate_proj.", config.intermediate_size),
                                     ("mlp.up_proj.", config.intermediate_size)]}
    out, origin = dict(state), {}
    for name, array in state.items():
        for fused, parts in layouts.items():
            if fused not in name:
                continue
            prefix, rest = name.split(fused, 1)
            if array.shape[0] != sum(rows for _, rows in parts):
                raise WeightFileError(f"weights: fused tensor {name!r} has {array.shape[0]} rows, the config "
                                      f"expects {sum(rows for _, rows in parts)}")
            del out[name]
            begin = 0
            for part, rows in parts:
                out[prefix + part + rest] = array[begin:begin + rows]
                origin[prefix + part + rest] = name
                begin += rows
    return out, origin


# -- the graph -------------------------------------------------------------------------------------
def build_graph(config: LlamaConfig, weights: Weights) -> Graph:
    """The prefill/decode graph described in the module docstring."""
    c = config
    g = Graph()
    kv, hd = c.num_key_value_heads, c.head_dim
    tokens = g.tensor("tokens", ("s",), "int32")
    s = tokens.dims[0]
    full, sliding = c.layers_of(FULL), c.layers_of(SLIDING)
    caches = {}  # layer -> (keys, values, visible) inputs of that layer's cache
    if full:
        count = len(full) if sliding else c.num_hidden_layers
        k_cache, v_cache = g.tensor("k_cache", ("t", count, kv, hd)), g.tensor("v_cache", ("t", count, kv, hd))
        t = k_cache.dims[0]
        slot = g.arange(t + s)  # key slot j holds absolute position j - 1; slot 0 is the dummy
        visible = slot.ge(1.0) * slot.le(g.arange(t, t + s).unsqueeze(-1))  # (s, t+s): causal, dummy hidden
        for i, layer in enumerate(full):
            caches[layer] = (k_cache[:, i], v_cache[:, i], visible)
    if sliding:
        k_local, v_local = g.tensor("k_local", ("u", len(sliding), kv, hd)), g.tensor("v_local", ("u", len(sliding), kv, hd))
        u = k_local.dims[0]
        # slot j of [cache, new] is u - j positions before the first new token's slot u (slot 0: dummy)
        slot = g.arange(u + s)
        newest = g.arange(u, u + s).unsqueeze(-1)  # the slot of each query's own key
        window = slot.ge(1.0) * slot.le(newest) * slot.gt(newest - c.sliding_window)
        for i, layer in enumerate(sliding):
            caches[layer] = (k_local[:, i], v_local[:, i], window)
    # RoPE positions: the tokens seen so far are t - 1, or (with sliding layers) the bound dim p - 1
    first = parse_dim("p") - 1 if sliding else t - 1
    positions = g.arange(first, first + s).unsqueeze(-1)
    rotations = {False: _angles(g.tensor("inv_freq", (hd // 2,)), positions)}
    if sliding and c.rope_theta_local is not None:
        rotations[True] = _angles(g.tensor("inv_freq_local", (hd // 2,)), positions)

    def attend(layer, q, k, v):
        k_past, v_past, visible = caches[layer]
        keys = lm.cat([k_past, k], 0)  # (past + s, kv_heads, head_dim)
        values = lm.cat([v_past, v], 0)
        # (a CPU step graph: its layers so far took block forms)
        return _attention(q, keys, values, visible, c, rows_first=weights.block_dots and id(g) in weights.block_graphs)

    r = parse_dim("r")
    decoder_stack(g, c, weights, tokens, lambda layer: rotations.get(layer in sliding, rotations[False]), attend,
                  last_rows=lambda x: x.narrow(0, s - r, r))  # only the last r positions get logits
    return g


def decoder_stack(g: Graph, c: LlamaConfig, weights: Weights, tokens: GraphTensor,
                  rotation: Callable[[int], tuple[GraphTensor, GraphTensor]],
                  attend: Callable[[int, GraphTensor, GraphTensor, GraphTensor], GraphTensor],
                  last_rows: Callable[[GraphTensor], GraphTensor] = lambda x: x) -> GraphTensor:
    """The layers every Llama-family graph shares, over one row per token in `tokens`: embedding,
    per layer norms, q/k/v (RoPE'd with `rotation(layer)` = (cos, sin) per row; k and v are the
    outputs k{layer} / v{layer}), `attend(layer, q, k, v)` -> (rows, heads * head_dim), the MLP;
    then the final norm and the logits output of `last_rows(x)`. The graphs differ only in where
    the rows' positions and earlier keys come from (a single sequence's cache, or one cache slot
    per row in the batched decode graph, models/batched.py)."""
    d, heads, kv, hd = c.hidden_size, c.num_attention_heads, c.num_key_value_heads, c.head_dim
    s = tokens.dims[0]

    def w(name, *shape):
        return weights(g, name, shape)

    def linear(x, name, n_out, n_in, bias=False):
        return weights.linear(g, x, name + ".weight", (n_out, n_in), w(name + ".bias", n_out) if bias else None)

    def norm(x, name, size=d):
        scale = w(name + ".weight", size)
        return lm.rms_norm(x, (size,), scale + c.norm_offset if c.norm_offset else scale, c.rms_norm_eps)

    x = lm.embedding(tokens, w("model.embed_tokens.weight", c.vocab_size, d))
    if c.embedding_scale is not None:
        x = x * float(np.float32(c.embedding_scale))  # transformers rounds the scale to the weights' dtype
    for layer in range(c.num_hidden_layers):
        p = f"model.layers.{layer}."
        h = norm(x, p + "input_layernorm")
        q, k, v = weights.linears(g, h, [(p + "self_attn.q_proj", heads * hd), (p + "self_attn.k_proj", kv * hd),
                                         (p + "self_attn.v_proj", kv * hd)], d, c.attention_bias)
        q, k, v = q.reshape(s, heads, hd), k.reshape(s, kv, hd), v.reshape(s, kv, hd)
        if c.qk_norm:
            q, k = norm(q, p + "self_attn.q_norm", hd), norm(k, p + "self_attn.k_norm", hd)
        cos, sin = rotation(layer)
        q = _rope(q, cos, sin, c.rope_interleaved)
        k = _rope(k, cos, sin, c.rope_interleaved).output(f"k{layer}")
        v = v.output(f"v{layer}")
        attended = linear(attend(layer, q, k, v), p + "self_attn.o_proj", d, heads * hd, c.output_bias)
        if c.sandwich_norms:
            x = x + norm(attended, p + "post_attention_layernorm")
            h = norm(x, p + "pre_feedforward_layernorm")
        else:
            x = x + attended
            h = norm(x, p + "post_attention_layernorm")
        gate, up = weights.linears(g, h, [(p + "mlp.gate_proj", c.intermediate_size),
                                          (p + "mlp.up_proj", c.intermediate_size)], d, c.mlp_bias)
        out = linear(_activation(gate, c.hidden_act) * up, p + "mlp.down_proj", d, c.intermediate_size, c.mlp_bias)
        x = x + (norm(out, p + "post_feedforward_layernorm") if c.sandwich_norms else out)
    x = norm(x, "model.norm")
    head = "model.embed_tokens" if c.tie_word_embeddings else "lm_head"
    logits = linear(last_rows(x), head, c.vocab_size, d)
    if c.final_softcap:
        logits = _softcap(logits, c.final_softcap)
    return logits.output("logits")


def _angles(inv_freq: GraphTensor, positions: GraphTensor) -> tuple[GraphTensor, GraphTensor]:
    angles = positions * inv_freq  # (s, head_dim/2) at absolute positions
    return angles.cos(), angles.sin()


def _activation(x: GraphTensor, kind: str) -> GraphTensor:
    if kind == "silu":
        return x.silu()
    return lm.gelu(x, approximate="tanh" if kind == "gelu_tanh" else "none")


def _softcap(x: GraphTensor, cap: float) -> GraphTensor:
    """cap * tanh(x / cap): Gemma 2's soft bound on attention scores and logits."""
    return lm.tanh(x * (1.0 / cap)) * cap


def _rope(x: GraphTensor, cos: GraphTensor, sin: GraphTensor, interleaved: bool) -> GraphTensor:
    """Rotate each head's (x_a, x_b) pairs by the position's angles: (a cos - b sin, b cos + a sin).

    x is (s, heads, head_dim). The pairs are the two halves of the head (transformers'
    rotate_half) or adjacent elements (interleaved, llama.cpp). Viewing x with a pair axis of
    size 2, flipping that axis swaps a and b, so the whole rotation is two multiplies and an add.
    """
    s, heads, dim = x.dims
    half = dim // 2
    if interleaved:
        pairs, pair_axis = x.reshape(s, heads, half, 2), -1
        cos, sin = cos.reshape(s, 1, half, 1), sin.reshape(s, 1, half, 1)
        sign = x.graph.arange(-1, 3, 2)  # [-1, 1] along the pair axis
    else:
        pairs, pair_axis = x.reshape(s, heads, 2, half), -2
        cos, sin = cos.reshape(s, 1, 1, half), sin.reshape(s, 1, 1, half)
        sign = x.graph.arange(-1, 3, 2).unsqueeze(-1)
    return (pairs * cos + pairs.flip(pair_axis) * (sin * sign)).reshape(s, heads, dim)


def _attention(q: GraphTensor, keys: GraphTensor, values: GraphTensor, visible: GraphTensor,
               c: LlamaConfig, rows_first: bool = False) -> GraphTensor:
    """Grouped-query attention: q (s, heads, d), keys/values (T, kv_heads, d), visible (s, T) 0/1.

    Each key/value head serves `groups` query heads by broadcasting (no copy), as
    transformers' repeat_kv does. Returns (s, heads * d). `rows_first` computes the output as
    (s, kv, groups, d), so (s, heads * d) is a view of it, not a reshape of a permuted one: the
    output projection's block dots (Weights.linear: float or int8) then read x's blocks at affine
    indices (SmolLM2's o_proj 0.49 -> 0.35 ms a float step); a prompt's fused attention is faster
    the other way (a 512-token prefill took 1.8 s this way, 0.9 s the other)."""
    s = q.dims[0]
    kv, groups, d = c.num_key_value_heads, c.groups, c.head_dim
    q = q.reshape(s, kv, groups, d).permute(1, 2, 0, 3)  # (kv, groups, s, d)
    scale = c.query_scale if c.query_scale is not None else 1.0 / math.sqrt(d)
    scores = (q @ keys.permute(1, 2, 0).unsqueeze(1)) * scale  # (kv, groups, s, T)
    if c.attn_softcap:
        scores = _softcap(scores, c.attn_softcap)
    # (visible is 0 or 1: blending by it is masked_fill's value, without the != 0 test masked_fill
    # needs for other masks, which cost a prefill's score tiles ~20 float ops per score)
    probs = (scores * visible + (1.0 - visible) * MASKED).softmax(-1)
    if rows_first:
        return (probs.permute(2, 0, 1, 3) @ values.permute(1, 0, 2).unsqueeze(0)).reshape(s, kv * groups * d)
    out = probs @ values.permute(1, 0, 2).unsqueeze(1)  # (kv, groups, s, d)
    return out.permute(2, 0, 1, 3).reshape(s, kv * groups * d)


# -- running it ------------------------------------------------------------------------------------
class KVCache:
    """Keys and values of the tokens seen so far.

    Full-attention layers share one growing position-major buffer: `k[:length]` is what the
    graph's k_cache input receives (a contiguous prefix, no copy); slot 0 is the dummy the graph
    masks out, so `length` is one more than the tokens seen. Sliding-window layers (when the
    model has them) keep only the last window - 1 tokens, in a buffer of twice that: the graph's
    k_local input is the held tokens plus the slot before them (masked out like the dummy), and
    when the buffer's end is reached the held tokens move back to its start, once per window.
    So their memory does not grow with the sequence.
    """

    def __init__(self, config: LlamaConfig, capacity: int = 256):
        self.config = config
        self.full, self.sliding = config.layers_of(FULL), config.layers_of(SLIDING)
        self.seen = 0
        # (cache slot, output names) per layer, made once: formatting 60 names a step cost ~40 us
        self._outputs = [(i, f"k{layer}", f"v{layer}") for i, layer in enumerate(self.full)]
        self._local_outputs = [(i, f"k{layer}", f"v{layer}") for i, layer in enumerate(self.sliding)]
        per_token = (config.num_key_value_heads, config.head_dim)
        self.k = self.v = None
        if self.full:
            shape = (capacity + 1, len(self.full), *per_token)
            self.k, self.v = np.zeros(shape, np.float32), np.zeros(shape, np.float32)
        if self.sliding:
            self.keep = config.sliding_window - 1  # what the next query can still see
            shape = (1 + 2 * max(self.keep, 1), len(self.sliding), *per_token)
            self.k_local, self.v_local = np.zeros(shape, np.float32), np.zeros(shape, np.float32)
            self.start, self.held = 1, 0  # the held tokens are k_local[start:start + held]

    @property
    def tokens(self) -> int:
        """How many tokens the cache has seen."""
        return self.seen

    @property
    def length(self) -> int:
        return self.seen + 1

    def inputs(self) -> dict[str, np.ndarray]:
        out = {}
        if self.full:
            out.update(k_cache=self.k[:self.length], v_cache=self.v[:self.length])
        if self.sliding:
            window = slice(self.start - 1, self.start + self.held)
            out.update(k_local=self.k_local[window], v_local=self.v_local[window])
        return out

    def dims(self) -> dict[str, int]:
        """Symbolic dims the inputs do not determine: p (tokens seen + 1) for sliding-window models."""
        return {"p": self.length} if self.sliding else {}

    def append(self, outputs: dict[str, np.ndarray], count: int):
        """Store the graph's per-layer k{l}/v{l} outputs for `count` new tokens."""
        if self.full:
            end = self.length + count
            if end > len(self.k):
                grow = max(end, 2 * len(self.k))
                extra = np.zeros((grow - len(self.k), *self.k.shape[1:]), np.float32)
                self.k, self.v = np.concatenate([self.k, extra]), np.concatenate([self.v, extra])
            new = slice(self.length, end)
            for i, k_name, v_name in self._outputs:
                self.k[new, i], self.v[new, i] = outputs[k_name], outputs[v_name]
        if self.sliding:
            self._append_local(outputs, count)
        self.seen += count

    def _append_local(self, outputs: dict[str, np.ndarray], count: int):
        take = min(count, self.keep)  # older new tokens fall out of every later window
        if self.start + self.held + take > len(self.k_local):  # move the still-visible tokens back
            kept = min(self.held, self.keep - take)
            source = slice(self.start + self.held - kept, self.start + self.held)
            self.k_local[1:1 + kept] = self.k_local[source]
            self.v_local[1:1 + kept] = self.v_local[source]
            self.start, self.held = 1, kept
        end = self.start + self.held + take
        new = slice(end - take, end)
        for i, k_name, v_name in self._local_outputs:
            self.k_local[new, i], self.v_local[new, i] = outputs[k_name][count - take:], outputs[v_name][count - take:]
        self.held += take
        if self.held > self.keep:
            self.start, self.held = self.start + self.held - self.keep, self.keep


@dataclass
class GenerationStats:
    """Timings of the last generate() call (seconds), for the CLI's summary line."""
    prompt_tokens: int = 0
    new_tokens: int = 0
    time_to_first_token: float = 0.0
    decode_seconds: float = 0.0  # after the first token

    @property
    def tokens_per_second(self) -> float:
        return (self.new_tokens - 1) / self.decode_seconds if self.new_tokens > 1 and self.decode_seconds > 0 else 0.0


# The shape buckets the search times (search_dims): one new token (a decode step) and a 128-token
# prefill, each keeping only the last row's logits (r = 1), as generation does.
SEARCH_BUCKETS = {"s": [1, 128], "r": 1}


class LlamaModel:
    """A compiled Llama-family model with its tokenizer: `logits`, `generate`, `chat`."""

    def __init__(self, config: LlamaConfig, weights: Weights, tokenizer=None, backend: str = "cpu",
                 progress: Callable[[str], None] | None = None, activations: str = "float", **compile_options):
        """`activations` "int8" quantizes each linear layer's input rows to int8 per block of 32 and
        multiplies by integer dots (Weights.linear; faster decode on some CPUs, not exact: logits move by about
        1e-2) in one-token steps, while prompts (more than one token) run a float32 program; the
        default "float" computes everything in float32, on the CPU backend with Q4_0 / Q4_1 weights
        as block dots in one-token steps (quant.block_linear: the same products summed in another
        order) and the dequantizing tiled matmuls for prompts, again two programs."""
        if activations not in ("float", "int8"):
            raise ValueDomainError(f"LlamaModel: activations must be 'float' or 'int8', got {activations!r}")
        self.config, self.tokenizer, self.backend = config, tokenizer, backend
        say = progress or (lambda message: None)
        started = time.perf_counter()
        # (block dots on the CPU backend, whose renderer scales a block's float lanes once; the GPU
        # renderers have no such form, and nothing was measured there: they keep one program)
        weights.activations, weights.block_dots = activations, backend == "cpu"
        graph = build_graph(config, weights)
        weights.check_all_used()
        say(f"built the graph ({len(graph.nodes):,} nodes) in {time.perf_counter() - started:.1f} s; "
            f"compiling for {backend}...")
        self.prefill_program = None  # (block dots or int8 activations: the program that runs prompts)
        if id(graph) in weights.block_graphs:
            # A prompt runs the plain float32 graph: its tiled matmuls reuse each dequantized weight
            # across the rows, which dots row by row do not (a 512-token prefill took several times
            # as long with integer dots); the programs share the weights' arrays and the cache
            # layout, so decode steps continue its cache.
            weights.activations, weights.block_dots = "float", False
            prompts = build_graph(config, weights)
            # (one after the other: compiling them in two threads halved a cold start's gcc time,
            # but egglog's e-graphs, made by the fusion rules, must be freed by the thread that
            # made them, and a garbage collection in the other thread dropped them)
            self.prefill_program = self._compile(prompts, {**weights.arrays, **rope_inputs(config, weights, prompts)},
                                                 say, dict(compile_options))
        self.program = self._compile(graph, {**weights.arrays, **rope_inputs(config, weights, graph)}, say,
                                     compile_options)
        self.stats = GenerationStats()

    @classmethod
    def from_graph(cls, config: LlamaConfig, graph: Graph, arrays: dict[str, np.ndarray], tokenizer=None,
                   backend: str = "cpu", progress: Callable[[str], None] | None = None,
                   **compile_options) -> LlamaModel:
        """A model from a prefill/decode graph built before (an exported artifact's, see
        luminar.serve.artifact) and its fixed inputs by name (weights as stored, RoPE frequencies)."""
        model = cls.__new__(cls)
        model.config, model.tokenizer, model.backend, model.prefill_program = config, tokenizer, backend, None
        model.program = model._compile(graph, arrays, progress or (lambda message: None), compile_options)
        model.stats = GenerationStats()
        return model

    def _compile(self, graph: Graph, arrays: dict[str, np.ndarray], say, compile_options: dict):
        started = time.perf_counter()
        if self.backend in ("cpu", "opencl", "cuda"):  # with search on: a decode step and a prefill get their own schedules
            compile_options.setdefault("search_dims", {d: v for d, v in SEARCH_BUCKETS.items() if d in graph.dims()})
        program = graph.compile(self.backend, **compile_options)
        program.set_inputs(arrays)
        if hasattr(program, "append_only"):  # a device backend: the cache's rows already there stay there
            program.append_only(*(name for name in ("k_cache", "v_cache") if name in graph.inputs))
        say(f"compiled in {time.perf_counter() - started:.1f} s")
        return program

    # -- raw forward passes ----------------------------------------------------------------------
    def forward(self, token_ids: Sequence[int], cache: KVCache, last_only: bool = True) -> np.ndarray:
        """Run the new `token_ids` after what `cache` holds; append their keys/values to it.

        Returns logits (1, vocab) for the last position, or (len(token_ids), vocab) for all.
        """
        ids = self._check_ids(token_ids)
        if cache.tokens + len(ids) > self.config.max_position_embeddings:
            raise ShapeError(f"sequence of {cache.tokens + len(ids)} tokens exceeds the model's context of "
                             f"{self.config.max_position_embeddings}")
        program = self.prefill_program if self.prefill_program is not None and len(ids) > 1 else self.program
        out = program.run({"tokens": ids, **cache.inputs()}, dims={"r": 1 if last_only else len(ids), **cache.dims()})
        cache.append(out, len(ids))
        return out["logits"]

    def logits(self, token_ids: Sequence[int]) -> np.ndarray:
        """Logits (seq, vocab) for every position of `token_ids`, from an empty cache."""
        return self.forward(token_ids, self.new_cache(len(token_ids)), last_only=False)

    def new_cache(self, capacity: int = 256) -> KVCache:
        return KVCache(self.config, capacity)

    def _check_ids(self, token_ids) -> np.ndarray:
        if type(token_ids) in (list, tuple) and len(token_ids) == 1 and type(token_ids[0]) is int \
                and 0 <= token_ids[0] < self.config.vocab_size:  # a decode step's token: no numpy reductions
            return np.array(token_ids, np.int32)
        ids = np.asarray(token_ids)
        if ids.ndim != 1 or len(ids) == 0 or ids.dtype.kind not in "iu":
            raise ShapeError(f"token ids must be a non-empty 1-D sequence of ints, got {ids.dtype} shape {ids.shape}")
        if ids.min() < 0 or ids.max() >= self.config.vocab_size:
            raise ShapeError(f"token ids must be in 0..{self.config.vocab_size - 1}, got {ids.min()}..{ids.max()}")
        return ids.astype(np.int32)

    # -- generation ------------------------------------------------------------------------------
    def generate(self, prompt: str | Sequence[int], max_new_tokens: int = 128, temperature: float = 0.0,
                 top_k: int = 0, top_p: float = 1.0, repetition_penalty: float = 1.0, stop=(),
                 seed: int | None = None, stream: bool = False):
        """Continue `prompt` (text, or token ids); the new text as a string, or an iterator of text
        pieces with stream=True. Stops at the tokenizer's stop tokens, at `stop` (strings or ids),
        or after max_new_tokens. temperature 0 is greedy; see generate.SamplingParams."""
        pieces = self._generate(prompt, max_new_tokens, SamplingParams(temperature, top_k, top_p,
                                                                        repetition_penalty, seed), stop)
        return pieces if stream else "".join(pieces)

    def chat(self, messages, **generate_options):
        """Answer a user message (a string) or a conversation ([{"role": ..., "content": ...}, ...])
        through the tokenizer's chat template; options as for generate()."""
        if isinstance(messages, str):
            messages = [{"role": "user", "content": messages}]
        return self.generate(self._tokenizer().apply_chat_template(messages, add_generation_prompt=True),
                             **generate_options)

    def _generate(self, prompt, max_new_tokens: int, params: SamplingParams, stop) -> Iterator[str]:
        tokenizer = self._tokenizer()
        if not isinstance(max_new_tokens, int) or max_new_tokens < 0:
            raise ShapeError(f"max_new_tokens must be an int >= 0, got {max_new_tokens!r}")
        stop = [stop] if isinstance(stop, (str, int)) else list(stop or ())
        stop_ids = set(getattr(tokenizer, "stop_ids", ()) or ()) | {s for s in stop if isinstance(s, int)}
        stop_text = [s for s in stop if isinstance(s, str)]
        ids = tokenizer.encode(prompt) if isinstance(prompt, str) else list(prompt)
        ids = [int(i) for i in self._check_ids(ids)]
        budget = self.config.max_position_embeddings - len(ids)
        cache = self.new_cache(len(ids) + max_new_tokens)
        stats = self.stats = GenerationStats(prompt_tokens=len(ids))
        started = time.perf_counter()

        def next_logits(new_ids):
            return self.forward(new_ids, cache)[-1]

        def timed(tokens):
            for token in tokens:
                stats.new_tokens += 1
                now = time.perf_counter()
                if stats.new_tokens == 1:
                    stats.time_to_first_token = now - started
                else:
                    stats.decode_seconds = now - started - stats.time_to_first_token
                yield token

        tokens = generate_ids(next_logits, ids, min(max_new_tokens, budget), Sampler(params), stop_ids)
        return stop_at(tokenizer.decode_stream(timed(tokens)), stop_text)

    def _tokenizer(self):
        if self.tokenizer is None:
            raise LuminarError("this model has no tokenizer: pass token ids, or load it with one")
        return self.tokenizer
