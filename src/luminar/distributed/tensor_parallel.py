"""Tensor-parallel Llama inference: each rank holds 1/N of every large weight.

    comm = Communicator.world()
    model = TensorParallelLlama("model_dir", comm)     # a Hugging Face directory, or a GGUF file
    logits = model.logits(ids)                         # (seq, vocab): identical on every rank
    new_ids = model.generate_greedy(ids, 16)

The split (Megatron-LM's): in attention, rank r owns query heads [r H/N, (r+1) H/N) and the key /
value heads they read (GQA groups stay whole), i.e. rows of q/k/v_proj (column-parallel) and the
matching columns of o_proj (row-parallel); in the MLP it owns 1/N of the intermediate columns:
rows of gate/up_proj, columns of down_proj. Each rank's o_proj / down_proj product is a partial
sum of the full one, so each attention and each MLP ends in one all-reduce (two per layer).
Embedding and output layer are split by vocabulary: rank r's rows of the table embed the tokens
in its range (the others give zero rows, then an all-reduce), and its rows of lm_head give its
slice of the logits (an all-gather). Norms are small and replicated. Biases of row-parallel
layers are added once, after the all-reduce. The KV cache is split the same way as the heads:
each rank caches only its own key/value heads (llama.KVCache of the rank's local config).

The graph is built here from llama.py's public pieces (LlamaConfig, rope_inv_freq, KVCache) and its
RoPE / attention / activation helpers, on a CollectiveGraph: the collectives cut it into
segments, each compiled normally (see collective.py). Weights are read from the memory-mapped
checkpoint one shard at a time, so a rank never loads the rest; GGUF blocks stay quantized (a
row block is whole rows; a column block must fall on quantization-block boundaries, e.g. 32
columns for Q4_1). Supported: the Llama, Mistral (without sliding windows), Qwen2 and SmolLM
layouts (biases, tied embeddings, GQA, rope scaling, GGUF's interleaved RoPE).
Refused with UnsupportedError: sliding-window layers, q/k norms, Gemma's sandwich norms, and head
or vocabulary counts that do not divide by the number of ranks.
"""
from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence

import numpy as np

import luminar as lm

from ..errors import ShapeError, UnsupportedError, WeightFileError
from ..graph import parse_dim
from ..models.llama import KVCache, LlamaConfig, gguf_name, rope_inv_freq
from ..models.llama import _activation, _angles, _attention, _rope  # the single-process model's own math
from .collective import CollectiveGraph
from .comm import Communicator


# -- reading a checkpoint one shard at a time -------------------------------------------------
class ShardReader:
    """A model's config and memory-mapped tensors, from which `declare` takes one block at a time
    (only those bytes are read): a Hugging Face directory (safetensors; copied out as float32) or
    a GGUF file (quantized blocks stay quantized: a row block is whole rows, a column block whole
    quantization blocks). `names` are the checkpoint's own names; `source(name)` maps a Hugging
    Face name to one of them."""

    def __init__(self, path):
        import os
        self.path = str(path)
        self.rope_factors = None
        if os.path.isdir(self.path):
            from ..io.safetensors import load_safetensors, read_config
            self.config = LlamaConfig.from_hf(read_config(self.path))
            self.tensors = load_safetensors(self.path)  # memory-mapped views: nothing is read yet
            self.gguf = False
        else:
            from ..io.gguf import read_gguf
            model = read_gguf(self.path)
            self.config = LlamaConfig.from_gguf(model.metadata, model.tensors)
            self.tensors, self.gguf = model.tensors, True
            self.gguf_model = model  # its tokenizer, for the command line
            if "rope_freqs.weight" in self.tensors:  # llama 3 GGUFs: divisors of the RoPE frequencies
                self.rope_factors = self.tensors["rope_freqs.weight"].dequantize()

    @property
    def names(self) -> set[str]:
        return set(self.tensors)

    def source(self, name: str) -> str:
        return gguf_name(name, self.config.sandwich_norms) if self.gguf else name

    def declare(self, g, name: str, shape: tuple, block: tuple[int, int, int] | None = None):
        """Weight `name` (Hugging Face naming) of full `shape` as a tensor of graph `g`, restricted
        to `block` = (axis, start, stop) when given. Returns (tensor, {input name: array})."""
        from ..io.quant import FORMATS, dense, weight
        stored = self.source(name)
        if stored not in self.tensors:
            raise WeightFileError(f"{self.path}: missing tensor {stored!r}")
        tensor = self.tensors[stored]
        if tuple(tensor.shape) != tuple(shape):
            raise WeightFileError(f"{self.path}: tensor {stored!r} has shape {tuple(tensor.shape)}, "
                                  f"the config expects {tuple(shape)}")
        axis, start, stop = block if block is not None else (0, 0, shape[0])
        if not self.gguf:
            index = (slice(None),) * axis + (slice(start, stop),)
            return dense(g, stored, np.ascontiguousarray(tensor[index], np.float32))
        if axis == 1 and tensor.qtype in FORMATS:  # the parts are (rows, blocks, ...): cut whole blocks
            size = FORMATS[tensor.qtype].block_size
            if start % size or stop % size:
                raise UnsupportedError(f"tensor parallel: {stored!r} ({tensor.qtype}) cannot be split at columns "
                                       f"{start}..{stop}: its quantization blocks are {size} wide")
            start, stop = start // size, stop // size
        index = (slice(None),) * axis + (slice(start, stop),)
        parts = {part: np.ascontiguousarray(array[index]) for part, array in tensor.parts.items()}
        new_shape = list(shape)
        new_shape[axis] = block[2] - block[1] if block is not None else shape[axis]
        return weight(g, stored, type(tensor)(stored, tuple(new_shape), tensor.qtype, parts))


# -- the split ------------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class Shard:
    """Which part of every weight rank `rank` of `size` holds."""
    config: LlamaConfig
    rank: int
    size: int

    def __post_init__(self):
        c, n = self.config, self.size
        unsupported = [what for what, on in (("sliding-window layers", c.has_sliding), ("q/k norms", c.qk_norm),
                                             ("sandwich norms", c.sandwich_norms)) if on]
        if unsupported:
            raise UnsupportedError(f"tensor parallel {c.architecture}: {unsupported[0]} are not supported")
        for what, count in (("key/value heads", c.num_key_value_heads), ("MLP columns", c.intermediate_size),
                            ("vocabulary rows", c.vocab_size)):
            if count % n:
                raise UnsupportedError(f"tensor parallel: {count} {what} do not split evenly over {n} ranks "
                                       f"(run with a number of ranks that divides {count})")

    @property
    def local(self) -> LlamaConfig:
        """The config of one rank's slice: its heads (the cache and attention use it)."""
        c = self.config
        return dataclasses.replace(c, num_attention_heads=c.num_attention_heads // self.size,
                                   num_key_value_heads=c.num_key_value_heads // self.size)

    def span(self, total: int) -> tuple[int, int]:
        per = total // self.size
        return self.rank * per, (self.rank + 1) * per


def _reduce_over(cg: CollectiveGraph | None, tp_size: int):
    """all_reduce(partial, carry) on the tensor-parallel group, or nothing when it has one rank."""
    def reduce(partial, carry):
        if tp_size == 1:
            return (partial, *carry)
        return cg.all_reduce(partial, carry=carry)
    return reduce


def build_layers(cg: CollectiveGraph, shard: Shard, reader: ShardReader, weights: dict, used: set,
                 layers: Sequence[int], x=None, embed: bool = True, head: bool = True):
    """Add Llama layers `layers` (and the embedding first / the norm and lm_head last) to `cg`,
    split by `shard` (a one-rank shard: no split). Weights read go into `weights` (input name ->
    array) and their stored names into `used`. `x` is the hidden state to start from when embed
    is False. Returns the hidden state (when head is False) or the logits tensor, marked as
    output "logits"."""
    c, local = shard.config, shard.local
    d, hd = c.hidden_size, c.head_dim
    heads, kv = local.num_attention_heads, local.num_key_value_heads
    reduce = _reduce_over(cg, shard.size)

    def w(name, full_shape, split=None):
        """Weight `name` of the checkpoint; split "rows" / "columns" takes this rank's block."""
        block = None
        if split is not None:
            axis = 0 if split == "rows" else 1
            block = (axis, *shard.span(full_shape[axis]))
        tensor, feeds = reader.declare(cg.graph, name, full_shape, block)
        weights.update(feeds)
        used.add(reader.source(name))
        return tensor

    def norm(x, name):
        scale = w(name + ".weight", (d,))
        return lm.rms_norm(x, (d,), scale + c.norm_offset if c.norm_offset else scale, c.rms_norm_eps)

    def column(x, name, n_out, bias):
        return lm.linear(x, w(name + ".weight", (n_out, d), "rows"), w(name + ".bias", (n_out,), "rows") if bias else None)

    def row(x, name, n_in):
        return x @ w(name + ".weight", (d, n_in), "columns").T

    def bias_after_reduce(x, name, on):
        return x + w(name + ".bias", (d,)) if on else x

    vocab_start, vocab_stop = shard.span(c.vocab_size)
    if embed:
        tokens = cg.tensor("tokens", ("s",), "int32")
        table = w("model.embed_tokens.weight", (c.vocab_size, d), "rows")
        x = lm.one_hot(tokens - float(vocab_start), vocab_stop - vocab_start) @ table  # zero rows off this shard
        if shard.size > 1:
            x = cg.all_reduce(x)
        if c.embedding_scale is not None:
            x = x * float(np.float32(c.embedding_scale))
    for i, layer in enumerate(layers):
        p = f"model.layers.{layer}."
        k_cache, v_cache = cg.tensor("k_cache", ("t", len(layers), kv, hd)), cg.tensor("v_cache", ("t", len(layers), kv, hd))
        s, t = x.dims[0], k_cache.dims[0]
        slot = cg.graph.arange(t + s)  # as in llama.build_graph: slot 0 is the masked dummy
        visible = slot.ge(1.0) * slot.le(cg.graph.arange(t, t + s).unsqueeze(-1))
        cos, sin = _angles(cg.tensor("inv_freq", (hd // 2,)), cg.graph.arange(t - 1, t - 1 + s).unsqueeze(-1))
        h = norm(x, p + "input_layernorm")
        q = column(h, p + "self_attn.q_proj", c.num_attention_heads * hd, c.attention_bias).reshape(s, heads, hd)
        k = column(h, p + "self_attn.k_proj", c.num_key_value_heads * hd, c.attention_bias).reshape(s, kv, hd)
        v = column(h, p + "self_attn.v_proj", c.num_key_value_heads * hd, c.attention_bias).reshape(s, kv, hd)
        q = _rope(q, cos, sin, c.rope_interleaved)
        k = _rope(k, cos, sin, c.rope_interleaved).output(f"k{i}")
        v = v.output(f"v{i}")
        keys, values = lm.cat([k_cache[:, i], k], 0), lm.cat([v_cache[:, i], v], 0)
        attended = row(_attention(q, keys, values, visible, local), p + "self_attn.o_proj", c.num_attention_heads * hd)
        attended, x = reduce(attended, [x])
        x = x + bias_after_reduce(attended, p + "self_attn.o_proj", c.output_bias)
        h = norm(x, p + "post_attention_layernorm")
        gate = column(h, p + "mlp.gate_proj", c.intermediate_size, c.mlp_bias)
        up = column(h, p + "mlp.up_proj", c.intermediate_size, c.mlp_bias)
        out = row(_activation(gate, c.hidden_act) * up, p + "mlp.down_proj", c.intermediate_size)
        out, x = reduce(out, [x])
        x = x + bias_after_reduce(out, p + "mlp.down_proj", c.mlp_bias)
    if not head:
        return x
    x = norm(x, "model.norm")
    r = parse_dim("r")
    name = "model.embed_tokens.weight" if c.tie_word_embeddings else "lm_head.weight"
    logits = x.narrow(0, x.dims[0] - r, r) @ w(name, (c.vocab_size, d), "rows").T  # this rank's vocabulary slice
    if shard.size > 1:
        logits = cg.all_gather(logits, axis=1)
    if c.final_softcap:
        logits = lm.tanh(logits * (1.0 / c.final_softcap)) * c.final_softcap
    return logits.output("logits")


def compile_model(cg: CollectiveGraph, reader: ShardReader, weights: dict, backend: str, **options):
    """Compile `cg` and give it its weights and the RoPE frequencies: the CollectiveProgram."""
    program = cg.compile(backend, **options)
    program.set_inputs(weights, inv_freq=rope_inv_freq(reader.config, factors=reader.rope_factors))
    return program


class TensorParallelLlama:
    """A Llama-family checkpoint split over the ranks of `comm` (see the module docstring)."""

    def __init__(self, directory, comm: Communicator | None = None, backend: str = "cpu",
                 progress: Callable[[str], None] | None = None, **compile_options):
        self.comm = comm or Communicator.world()
        reader = ShardReader(directory)
        self.config = reader.config
        self.shard = Shard(self.config, self.comm.rank, self.comm.size)
        self.comm.agree((self.config, self.comm.size), "the model and the number of ranks")
        say = progress or (lambda message: None)
        cg = CollectiveGraph(self.comm)
        weights, used = {}, set()
        build_layers(cg, self.shard, reader, weights, used, range(self.config.num_hidden_layers))
        unused = sorted(reader.names - used - _ignorable(reader))
        if unused:
            raise WeightFileError(f"{directory}: tensors this model does not use: {unused[:3]}; luminar does not "
                                  f"implement what they are for")
        say(f"rank {self.comm.rank}: {len(cg.segments)} segments, compiling for {backend}...")
        self.program = compile_model(cg, reader, weights, backend, **compile_options)
        self.resident_weight_bytes = self.program.resident_bytes()

    def new_cache(self, capacity: int = 256) -> KVCache:
        """This rank's KV cache: only its own key/value heads."""
        return KVCache(self.shard.local, capacity)

    def forward(self, token_ids: Sequence[int], cache: KVCache, last_only: bool = True) -> np.ndarray:
        ids = _check_ids(token_ids, self.config)
        if cache.tokens + len(ids) > self.config.max_position_embeddings:
            raise ShapeError(f"sequence of {cache.tokens + len(ids)} tokens exceeds the model's context of "
                             f"{self.config.max_position_embeddings}")
        out = self.program.run({"tokens": ids, **cache.inputs()}, dims={"r": 1 if last_only else len(ids)})
        cache.append(out, len(ids))
        return out["logits"]

    def logits(self, token_ids: Sequence[int]) -> np.ndarray:
        """Logits (seq, vocab) for every position, the same bits on every rank."""
        return self.forward(token_ids, self.new_cache(len(token_ids)), last_only=False)

    def generate_greedy(self, token_ids: Sequence[int], max_new_tokens: int, stop_ids=()) -> list[int]:
        """Greedy continuation: every rank computes the same logits, so every rank picks the same
        token without a broadcast."""
        cache = self.new_cache(len(token_ids) + max_new_tokens)
        return greedy(lambda ids: self.forward(ids, cache), token_ids, max_new_tokens, stop_ids)


def _ignorable(reader: ShardReader) -> set[str]:
    """Stored tensors a model legitimately does not read (as llama.Weights allows): a saved
    rotary_emb.inv_freq, a tied lm_head (transformers writes it; it is the embedding), a GGUF's
    rope_freqs (read into reader.rope_factors)."""
    names = {n for n in reader.names if n.endswith("rotary_emb.inv_freq") or n == "rope_freqs.weight"}
    if reader.config.tie_word_embeddings and "lm_head.weight" in reader.names:
        names.add("lm_head.weight")
    return names


def _check_ids(token_ids, config: LlamaConfig) -> np.ndarray:
    ids = np.asarray(token_ids)
    if ids.ndim != 1 or len(ids) == 0 or ids.dtype.kind not in "iu":
        raise ShapeError(f"token ids must be a non-empty 1-D sequence of ints, got {ids.dtype} shape {ids.shape}")
    if ids.min() < 0 or ids.max() >= config.vocab_size:
        raise ShapeError(f"token ids must be in 0..{config.vocab_size - 1}, got {ids.min()}..{ids.max()}")
    return ids.astype(np.int32)


def greedy(forward: Callable, token_ids: Sequence[int], max_new_tokens: int, stop_ids=()) -> list[int]:
    """Up to `max_new_tokens` argmax tokens after `token_ids`, stopping before a stop token;
    `forward(ids)` runs the model on new ids (with its cache) and returns their logits."""
    new, logits = [], forward(token_ids)
    for _ in range(max_new_tokens):
        token = int(np.argmax(logits[-1]))
        if token in stop_ids:  # the turn ends before its stop token
            break
        new.append(token)
        if len(new) == max_new_tokens:
            break
        logits = forward([token])
    return new
