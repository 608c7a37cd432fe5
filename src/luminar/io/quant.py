"""Storage formats of weights, and their dequantization as luminar primitives.

A GGUF block format (ggml's Q8_0, Q4_0, Q4_1) packs 32 consecutive elements of a row into one
block: a float16 scale (and for Q4_1 a float16 minimum) followed by the quantized values. The
loader splits the blocks into plain arrays -- *parts* -- that luminar inputs can store as they
are, still quantized (DESIGN §3):

    format  part    dtype    shape (rows = every axis but the last)   element
    Q8_0    scale   float16  (rows, nblocks)                          w = quants * scale
            quants  int8     (rows, nblocks, 32)
    Q4_0    scale   float16  (rows, nblocks)                          w = (nibble - 8) * scale
            quants  uint8    (rows, nblocks, 16)
    Q4_1    scale   float16  (rows, nblocks)                          w = nibble * scale + min
            min     float16  (rows, nblocks)
            quants  uint8    (rows, nblocks, 16)

A 4-bit byte j of a block holds element j in its low nibble and element j + 16 in its high
nibble (ggml's layout). `weight` declares one graph input per part and rebuilds the float32
weight from primitives -- the nibbles come from `fmod`, not from bit operations, because the
primitive set has none -- so the compiler can fuse the dequantization into the kernel that
consumes the weight, and the weight stays quantized in memory.

Each format's numpy dequantization sits next to its graph version: the numpy one is the
reference for tests (it matches `gguf.quants.dequantize` bit for bit) and for `dequantize()`.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Callable

import numpy as np

from .. import dtypes
from ..errors import DTypeError, UnsupportedError
from ..graph import Graph
from ..symbolic import Var
from ..tensor import GraphTensor


@dataclass(frozen=True)
class BlockFormat:
    """One ggml block layout: `fields` are (part, numpy dtype, count per block) in storage order."""
    name: str
    block_size: int
    fields: tuple[tuple[str, type, int], ...]
    numpy: Callable[[dict], np.ndarray]      # float32 parts -> (..., nblocks, block_size) values
    graph: Callable[[dict], GraphTensor]      # GraphTensor parts -> the same, from primitives

    @property
    def type_size(self) -> int:
        """Bytes per block."""
        return sum(np.dtype(dtype).itemsize * count for _, dtype, count in self.fields)

    def split(self, blocks: np.ndarray) -> dict[str, np.ndarray]:
        """Views of uint8 `blocks` (..., nblocks, type_size) as the parts (no copy).

        A single-value field (a scale) comes back without its trailing axis of one."""
        parts, offset = {}, 0
        for part, dtype, count in self.fields:
            size = np.dtype(dtype).itemsize * count
            view = blocks[..., offset:offset + size].view(dtype)
            parts[part] = view[..., 0] if count == 1 else view
            offset += size
        return parts


def _nibbles_numpy(quants: np.ndarray) -> np.ndarray:
    """(..., 16) bytes -> (..., 32) values: low nibbles are elements 0..15, high nibbles 16..31."""
    return np.concatenate([quants & 15, quants >> 4], axis=-1).astype(np.float32)


def _nibbles_graph(quants: GraphTensor) -> GraphTensor:
    """The same from primitives, without a concatenation: the bytes are broadcast over a new
    (low, high) axis h, and nibble h of byte q is floor(q / 16^h) fmod 16, exact in float32.

    A concatenation (pad + add) would leave padding tests and div/mod in the consumer's index
    math; this way the (..., 2, 16) result merges into rows by plain reshapes, so a matmul reads
    each byte with simple indices and the compiler unpacks nibbles inside its loop.
    """
    pair = quants.unsqueeze(-2).expand(*quants.dims[:-1], 2, quants.dims[-1])  # (..., 2, 16), no copy
    h = quants.graph.constant(Var(f"_d{pair.ndim - 2}", 0, 1), pair.dims)  # 0 for low, 1 for high
    shifted = pair * (1.0 - h * (15.0 / 16.0))  # q, or q / 16
    whole = shifted - shifted.fmod(1.0)  # floor (values are >= 0)
    return whole.fmod(16.0).flatten(-2)
def _f32(array: np.ndarray) -> np.ndarray:
    return array.astype(np.float32)


FORMATS: dict[str, BlockFormat] = {f.name: f for f in (
    BlockFormat("Q8_0", 32, (("scale", np.float16, 1), ("quants", np.int8, 32)),
                numpy=lambda p: _f32(p["quants"]) * _f32(p["scale"])[..., None],
                graph=lambda p: p["quants"] * p["scale"].unsqueeze(-1)),
    BlockFormat("Q4_0", 32, (("scale", np.float16, 1), ("quants", np.uint8, 16)),
                numpy=lambda p: (_nibbles_numpy(p["quants"]) - 8.0) * _f32(p["scale"])[..., None],
                graph=lambda p: (_nibbles_graph(p["quants"]) - 8.0) * p["scale"].unsqueeze(-1)),
    BlockFormat("Q4_1", 32, (("scale", np.float16, 1), ("min", np.float16, 1), ("quants", np.uint8, 16)),
                numpy=lambda p: _nibbles_numpy(p["quants"]) * _f32(p["scale"])[..., None] + _f32(p["min"])[..., None],
                graph=lambda p: _nibbles_graph(p["quants"]) * p["scale"].unsqueeze(-1) + p["min"].unsqueeze(-1)),
)}

# Plain (unblocked) storage: the whole tensor is one part, "data".
PLAIN = {"F32": np.float32, "F16": np.float16, "BF16": np.uint16}  # BF16 as its uint16 bit patterns
SUPPORTED = (*PLAIN, *FORMATS)

# numpy dtype of a part -> luminar storage dtype (uint16 only ever holds bfloat16 bits here)
_STORAGE = {np.dtype(np.float32): dtypes.float32, np.dtype(np.float16): dtypes.float16,
            np.dtype(np.uint16): dtypes.bfloat16, np.dtype(np.int8): dtypes.int8, np.dtype(np.uint8): dtypes.uint8}


def dequantize_parts(qtype: str, parts: dict[str, np.ndarray], shape: tuple[int, ...]) -> np.ndarray:
    """The float32 values of a tensor stored as `parts` in format `qtype`, with numpy."""
    if qtype in PLAIN:
        data = parts["data"]
        return dtypes.to_compute(data, dtypes.bfloat16) if qtype == "BF16" else data.astype(np.float32)
    if qtype not in FORMATS:
        raise UnsupportedError(f"dequantize: format {qtype} is not supported (supported: {', '.join(SUPPORTED)})")
    return FORMATS[qtype].numpy(parts).reshape(shape)


# -- graph inputs -----------------------------------------------------------------------------
def input_name(name: str, part: str | None = None) -> str:
    """The graph input name for a weight (and one of its parts): every character that cannot be
    in an identifier becomes '_', e.g. ("blk.0.attn_q.weight", "scale") -> "blk_0_attn_q_weight_scale".
    A name that would start with a digit gets a leading '_'."""
    full = name if part is None else f"{name}.{part}"
    ident = re.sub(r"\W", "_", full)
    return ident if ident.isidentifier() else f"_{ident}"


def weight(g: Graph, name: str, tensor) -> tuple[GraphTensor, dict[str, np.ndarray]]:
    """A GGUF tensor as a float32 GraphTensor of `tensor.shape`, plus the arrays to feed.

    Declares one input per storage part, named `input_name(name, part)` with the part's storage
    dtype, and composes the dequantization from primitives. Returns (weight, {input name: array}).
    """
    if tensor.qtype not in SUPPORTED:
        raise UnsupportedError(f"weight {name!r}: GGUF format {tensor.qtype} is not supported in graphs "
                               f"(supported: {', '.join(SUPPORTED)}); feed dense(g, name, tensor.dequantize()) instead")
    inputs, feeds = {}, {}
    for part, array in tensor.parts.items():
        key = input_name(name, part)
        inputs[part] = g.tensor(key, array.shape, _STORAGE[array.dtype])
        feeds[key] = array
    if tensor.qtype in PLAIN:
        return inputs["data"], feeds
    return FORMATS[tensor.qtype].graph(inputs).reshape(*tensor.shape), feeds


def dense(g: Graph, name: str, array) -> tuple[GraphTensor, dict[str, np.ndarray]]:
    """A plain float array as a graph input named `input_name(name)`, plus the feed dict.

    float32 and float16 are stored as they are; uint16 and `ml_dtypes.bfloat16` arrays are read
    as bfloat16 bit patterns; float64 is converted to float32 (luminar computes in float32).
    """
    array = np.asarray(array)
    if array.dtype.name == "bfloat16":
        array = array.view(np.uint16)
    elif array.dtype == np.float64:
        array = array.astype(np.float32)
    if array.dtype not in (np.float32, np.float16, np.uint16):
        raise DTypeError(f"dense {name!r}: expected a float32, float16 or bfloat16 (uint16 bits) array, "
                         f"got {array.dtype}")
    key = input_name(name)
    return g.tensor(key, array.shape, _STORAGE[array.dtype]), {key: array}
