"""The Llama family (Llama 2/3, SmolLM, Mistral, Qwen2) as one luminar graph, plus its KV cache.

One graph serves prefill and decode. Its inputs are

- ``tokens``  (s,) int32: the new tokens (the whole prompt at prefill, one token per decode step)
- ``k_cache`` / ``v_cache`` (t, layers, kv_heads, head_dim): keys and values of the tokens seen
  so far, position-major so a prefix of one preallocated buffer is passed without a copy.
  Slot 0 is a dummy that attention masks out: luminar's symbolic sizes are >= 1, so an empty
  cache is the one-slot cache, and the tokens seen so far are t - 1. The new tokens sit at
  absolute positions t - 1 .. t - 2 + s (RoPE angles are computed in the graph from t).
- ``inv_freq`` (head_dim / 2,): RoPE inverse frequencies (a fixed input, set once like a weight,
  so Llama 3 / linear rope scaling is only a different array)
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
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass

import numpy as np

import luminar as lm

from ..errors import LuminarError, ShapeError, UnsupportedError, WeightFileError
from ..graph import Graph, parse_dim
from ..tensor import GraphTensor
from .generate import SamplingParams, Sampler, generate_ids, stop_at

MASKED = -1.0e30  # a finite "minus infinity" for masked attention scores (constants must be finite)


# -- configuration -------------------------------------------------------------------------------
@dataclass(frozen=True)
class LlamaConfig:
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
    attention_bias: bool = False  # q/k/v projection biases (Qwen2)
    rope_interleaved: bool = False  # rotate adjacent pairs (GGUF llama layout) instead of halves
    max_position_embeddings: int = 2048
    architecture: str = "llama"

    def __post_init__(self):
        if self.num_attention_heads % self.num_key_value_heads:
            raise WeightFileError(f"llama config: {self.num_attention_heads} attention heads are not a multiple of "
                                  f"{self.num_key_value_heads} key/value heads")
        if self.head_dim % 2:
            raise WeightFileError(f"llama config: head_dim must be even for RoPE, got {self.head_dim}")

    @property
    def groups(self) -> int:
        """Query heads per key/value head (GQA)."""
        return self.num_attention_heads // self.num_key_value_heads

    @classmethod
    def from_hf(cls, config: dict) -> LlamaConfig:
        """From a Hugging Face config.json (LlamaForCausalLM, MistralForCausalLM, Qwen2ForCausalLM)."""
        kind = config.get("model_type", "llama")
        if kind not in ("llama", "mistral", "qwen2"):
            raise UnsupportedError(f"config.json: model_type {kind!r} is not supported (llama, mistral, qwen2)")
        if config.get("mlp_bias"):
            raise UnsupportedError("config.json: mlp_bias=true is not supported")
        if config.get("hidden_act", "silu") != "silu":
            raise UnsupportedError(f"config.json: hidden_act {config['hidden_act']!r} is not supported (silu)")
        try:
            heads = config["num_attention_heads"]
            rope = config.get("rope_parameters") or {}  # transformers >= 5 nests rope settings here
            scaling = config.get("rope_scaling") or (rope if rope.get("rope_type", "default") != "default" else None)
            return cls(vocab_size=config["vocab_size"], hidden_size=config["hidden_size"],
                       intermediate_size=config["intermediate_size"], num_hidden_layers=config["num_hidden_layers"],
                       num_attention_heads=heads, num_key_value_heads=config.get("num_key_value_heads") or heads,
                       head_dim=config.get("head_dim") or config["hidden_size"] // heads,
                       rms_norm_eps=config.get("rms_norm_eps", 1e-6),
                       rope_theta=rope.get("rope_theta", config.get("rope_theta", 10000.0)), rope_scaling=scaling,
                       tie_word_embeddings=config.get("tie_word_embeddings", False),
                       attention_bias=config.get("attention_bias", kind == "qwen2"),
                       max_position_embeddings=config.get("max_position_embeddings", 2048), architecture=kind)
        except KeyError as e:
            raise WeightFileError(f"config.json: missing key {e.args[0]!r}") from None

    @classmethod
    def from_gguf(cls, metadata: dict, tensors: dict) -> LlamaConfig:
        """From GGUF metadata (`{arch}.*` keys) and tensor names (tied when there is no output.weight)."""
        arch = metadata.get("general.architecture", "llama")
        if arch not in ("llama", "qwen2"):
            raise UnsupportedError(f"GGUF architecture {arch!r} is not supported (llama, qwen2)")

        def key(name, default=None):
            value = metadata.get(f"{arch}.{name}", default)
            if value is None:
                raise WeightFileError(f"GGUF metadata: missing {arch}.{name}")
            return value

        heads = int(key("attention.head_count"))
        hidden = int(key("embedding_length"))
        if "token_embd.weight" not in tensors:
            raise WeightFileError("GGUF file has no token_embd.weight tensor")
        vocab = int(tensors["token_embd.weight"].shape[0])
        return cls(vocab_size=vocab, hidden_size=hidden, intermediate_size=int(key("feed_forward_length")),
                   num_hidden_layers=int(key("block_count")), num_attention_heads=heads,
                   num_key_value_heads=int(key("attention.head_count_kv", heads)),
                   head_dim=int(key("attention.key_length", hidden // heads)),
                   rms_norm_eps=float(key("attention.layer_norm_rms_epsilon", 1e-5)),
                   rope_theta=float(key("rope.freq_base", 10000.0)),
                   tie_word_embeddings="output.weight" not in tensors,
                   attention_bias="blk.0.attn_q.bias" in tensors,
                   rope_interleaved=arch == "llama",  # llama.cpp's convert permutes q/k rows for llama only
                   max_position_embeddings=int(key("context_length", 2048)), architecture=arch)


def rope_inv_freq(config: LlamaConfig) -> np.ndarray:
    """RoPE inverse frequencies theta^(-2i/d), with Hugging Face's llama3 or linear scaling."""
    d = config.head_dim
    inv = 1.0 / (config.rope_theta ** (np.arange(0, d, 2, dtype=np.float64) / d))
    scaling = config.rope_scaling or {}
    kind = scaling.get("rope_type", scaling.get("type", "default"))
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
    elif kind != "default":
        raise UnsupportedError(f"rope scaling {kind!r} is not supported (default, linear, llama3)")
    return inv.astype(np.float32)


# -- weights ---------------------------------------------------------------------------------------
# Hugging Face parameter names (the canonical names here) and their GGUF counterparts.
_LAYER_GGUF = {"input_layernorm.weight": "attn_norm.weight", "post_attention_layernorm.weight": "ffn_norm.weight",
               "self_attn.q_proj.weight": "attn_q.weight", "self_attn.k_proj.weight": "attn_k.weight",
               "self_attn.v_proj.weight": "attn_v.weight", "self_attn.o_proj.weight": "attn_output.weight",
               "self_attn.q_proj.bias": "attn_q.bias", "self_attn.k_proj.bias": "attn_k.bias",
               "self_attn.v_proj.bias": "attn_v.bias", "mlp.gate_proj.weight": "ffn_gate.weight",
               "mlp.up_proj.weight": "ffn_up.weight", "mlp.down_proj.weight": "ffn_down.weight"}
_GLOBAL_GGUF = {"model.embed_tokens.weight": "token_embd.weight", "model.norm.weight": "output_norm.weight",
                "lm_head.weight": "output.weight"}


def gguf_name(hf_name: str) -> str:
    """The GGUF tensor name of a Hugging Face parameter name (model.layers.3.mlp.up_proj.weight -> blk.3.ffn_up.weight)."""
    if hf_name in _GLOBAL_GGUF:
        return _GLOBAL_GGUF[hf_name]
    _, _, layer, rest = hf_name.split(".", 3)  # model.layers.{i}.rest
    return f"blk.{layer}.{_LAYER_GGUF[rest]}"


class Weights:
    """Declares weights as graph inputs by their Hugging Face names and collects their arrays.

    `declare(g, name)` returns (GraphTensor, {input name: array}) for one weight: the I/O layer's
    `dense` for float arrays, `quant.weight` for GGUF tensors (which stay quantized).
    """

    def __init__(self, has: Callable[[str], bool], declare: Callable, shape_of: Callable[[str], tuple]):
        self.has, self._declare, self.shape_of = has, declare, shape_of
        self.arrays: dict[str, np.ndarray] = {}
        self.declared: dict[tuple, GraphTensor] = {}  # a tied weight is declared once

    def __call__(self, g: Graph, name: str, shape: tuple) -> GraphTensor:
        """The weight `name` as a graph tensor of `shape` (declared once per graph)."""
        if (id(g), name) not in self.declared:
            if not self.has(name):
                raise WeightFileError(f"weights: missing tensor {name!r}")
            if tuple(self.shape_of(name)) != tuple(shape):
                raise WeightFileError(f"weights: tensor {name!r} has shape {tuple(self.shape_of(name))}, "
                                      f"the config expects {tuple(shape)}")
            tensor, arrays = self._declare(g, name)
            self.arrays.update(arrays)
            self.declared[id(g), name] = tensor
        return self.declared[id(g), name]

    @classmethod
    def from_state_dict(cls, state: dict[str, np.ndarray]) -> Weights:
        from ..io.quant import dense
        return cls(lambda n: n in state, lambda g, n: dense(g, n, state[n]), lambda n: state[n].shape)

    @classmethod
    def from_gguf(cls, tensors: dict) -> Weights:
        from ..io.quant import weight
        return cls(lambda n: gguf_name(n) in tensors,
                   lambda g, n: weight(g, gguf_name(n), tensors[gguf_name(n)]),
                   lambda n: tuple(tensors[gguf_name(n)].shape))


# -- the graph -------------------------------------------------------------------------------------
def build_graph(config: LlamaConfig, weights: Weights) -> Graph:
    """The prefill/decode graph described in the module docstring."""
    c = config
    g = Graph()
    d, heads, kv, hd = c.hidden_size, c.num_attention_heads, c.num_key_value_heads, c.head_dim
    tokens = g.tensor("tokens", ("s",), "int32")
    k_cache = g.tensor("k_cache", ("t", c.num_hidden_layers, kv, hd))
    v_cache = g.tensor("v_cache", ("t", c.num_hidden_layers, kv, hd))
    inv_freq = g.tensor("inv_freq", (hd // 2,))
    s, t = tokens.dims[0], k_cache.dims[0]

    def w(name, *shape):
        return weights(g, name, shape)

    def linear(x, name, n_out, n_in, bias=False):
        return lm.linear(x, w(name + ".weight", n_out, n_in), w(name + ".bias", n_out) if bias else None)

    angles = g.arange(t - 1, t - 1 + s).unsqueeze(-1) * inv_freq  # (s, head_dim/2) at absolute positions
    cos, sin = angles.cos(), angles.sin()
    slot = g.arange(t + s)  # key slot j holds absolute position j - 1; slot 0 is the dummy
    visible = slot.ge(1.0) * slot.le(g.arange(t, t + s).unsqueeze(-1))  # (s, t+s): causal, dummy hidden

    x = lm.embedding(tokens, w("model.embed_tokens.weight", c.vocab_size, d))
    for layer in range(c.num_hidden_layers):
        p = f"model.layers.{layer}."
        h = lm.rms_norm(x, (d,), w(p + "input_layernorm.weight", d), c.rms_norm_eps)
        q = linear(h, p + "self_attn.q_proj", heads * hd, d, c.attention_bias).reshape(s, heads, hd)
        k = linear(h, p + "self_attn.k_proj", kv * hd, d, c.attention_bias).reshape(s, kv, hd)
        v = linear(h, p + "self_attn.v_proj", kv * hd, d, c.attention_bias).reshape(s, kv, hd)
        q = _rope(q, cos, sin, c.rope_interleaved)
        k = _rope(k, cos, sin, c.rope_interleaved).output(f"k{layer}")
        v = v.output(f"v{layer}")
        keys = lm.cat([k_cache[:, layer], k], 0)  # (t + s, kv_heads, head_dim)
        values = lm.cat([v_cache[:, layer], v], 0)
        x = x + linear(_attention(q, keys, values, visible, c), p + "self_attn.o_proj", d, heads * hd)
        h = lm.rms_norm(x, (d,), w(p + "post_attention_layernorm.weight", d), c.rms_norm_eps)
        gate = linear(h, p + "mlp.gate_proj", c.intermediate_size, d)
        up = linear(h, p + "mlp.up_proj", c.intermediate_size, d)
        x = x + linear(gate.silu() * up, p + "mlp.down_proj", d, c.intermediate_size)
    x = lm.rms_norm(x, (d,), w("model.norm.weight", d), c.rms_norm_eps)
    r = parse_dim("r")
    head = "model.embed_tokens" if c.tie_word_embeddings else "lm_head"
    linear(x.narrow(0, s - r, r), head, c.vocab_size, d).output("logits")  # only the last r positions
    return g


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
               c: LlamaConfig) -> GraphTensor:
    """Grouped-query attention: q (s, heads, d), keys/values (T, kv_heads, d), visible (s, T) 0/1.

    Each key/value head serves `groups` query heads by broadcasting (no copy), as
    transformers' repeat_kv does. Returns (s, heads * d).
    """
    s = q.dims[0]
    kv, groups, d = c.num_key_value_heads, c.groups, c.head_dim
    q = q.reshape(s, kv, groups, d).permute(1, 2, 0, 3)  # (kv, groups, s, d)
    scores = (q @ keys.permute(1, 2, 0).unsqueeze(1)) * (1.0 / math.sqrt(d))  # (kv, groups, s, T)
    probs = scores.masked_fill(1.0 - visible, MASKED).softmax(-1)
    out = probs @ values.permute(1, 0, 2).unsqueeze(1)  # (kv, groups, s, d)
    return out.permute(2, 0, 1, 3).reshape(s, kv * groups * d)


# -- running it ------------------------------------------------------------------------------------
class KVCache:
    """Keys and values of the tokens seen so far, in one growing position-major buffer.

    `k[:length]` is what the graph's k_cache input receives (a contiguous prefix, no copy);
    slot 0 is the dummy the graph masks out, so `length` is one more than the tokens seen.
    """

    def __init__(self, config: LlamaConfig, capacity: int = 256):
        self.config = config
        shape = (capacity + 1, config.num_hidden_layers, config.num_key_value_heads, config.head_dim)
        self.k, self.v = np.zeros(shape, np.float32), np.zeros(shape, np.float32)
        self.length = 1

    @property
    def tokens(self) -> int:
        """How many tokens the cache holds."""
        return self.length - 1

    def inputs(self) -> dict[str, np.ndarray]:
        return {"k_cache": self.k[:self.length], "v_cache": self.v[:self.length]}

    def append(self, outputs: dict[str, np.ndarray], count: int):
        """Store the graph's per-layer k{l}/v{l} outputs for `count` new tokens."""
        end = self.length + count
        if end > len(self.k):
            grow = max(end, 2 * len(self.k))
            self.k = np.concatenate([self.k, np.zeros((grow - len(self.k), *self.k.shape[1:]), np.float32)])
            self.v = np.concatenate([self.v, np.zeros((grow - len(self.v), *self.v.shape[1:]), np.float32)])
        for layer in range(self.config.num_hidden_layers):
            self.k[self.length:end, layer] = outputs[f"k{layer}"]
            self.v[self.length:end, layer] = outputs[f"v{layer}"]
        self.length = end


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


class LlamaModel:
    """A compiled Llama-family model with its tokenizer: `logits`, `generate`, `chat`."""

    def __init__(self, config: LlamaConfig, weights: Weights, tokenizer=None, backend: str = "cpu",
                 progress: Callable[[str], None] | None = None, **compile_options):
        self.config, self.tokenizer, self.backend = config, tokenizer, backend
        say = progress or (lambda message: None)
        started = time.perf_counter()
        graph = build_graph(config, weights)
        say(f"built the graph ({len(graph.nodes):,} nodes) in {time.perf_counter() - started:.1f} s; "
            f"compiling for {backend}...")
        started = time.perf_counter()
        self.program = graph.compile(backend, **compile_options)
        self.program.set_inputs(weights.arrays, inv_freq=rope_inv_freq(config))
        say(f"compiled in {time.perf_counter() - started:.1f} s")
        self.stats = GenerationStats()

    # -- raw forward passes ----------------------------------------------------------------------
    def forward(self, token_ids: Sequence[int], cache: KVCache, last_only: bool = True) -> np.ndarray:
        """Run the new `token_ids` after what `cache` holds; append their keys/values to it.

        Returns logits (1, vocab) for the last position, or (len(token_ids), vocab) for all.
        """
        ids = self._check_ids(token_ids)
        if cache.tokens + len(ids) > self.config.max_position_embeddings:
            raise ShapeError(f"sequence of {cache.tokens + len(ids)} tokens exceeds the model's context of "
                             f"{self.config.max_position_embeddings}")
        out = self.program.run({"tokens": ids, **cache.inputs()}, dims={"r": 1 if last_only else len(ids)})
        cache.append(out, len(ids))
        return out["logits"]

    def logits(self, token_ids: Sequence[int]) -> np.ndarray:
        """Logits (seq, vocab) for every position of `token_ids`, from an empty cache."""
        return self.forward(token_ids, self.new_cache(len(token_ids)), last_only=False)

    def new_cache(self, capacity: int = 256) -> KVCache:
        return KVCache(self.config, capacity)

    def _check_ids(self, token_ids) -> np.ndarray:
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
