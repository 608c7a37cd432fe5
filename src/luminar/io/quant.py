"""Storage formats of weights, and their dequantization as luminar primitives.

A GGUF block format (ggml's Q8_0, Q4_0, Q4_1, Q5_0, Q5_1) packs 32 consecutive elements of a
row into one block: a float16 scale (and for Q4_1 / Q5_1 a float16 minimum) followed by the
quantized values. The
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
    Q5_0    scale, high (4 bytes: bit i is element i's fifth bit), quants    w = (q5 - 16) * scale
    Q5_1    scale, min, high, quants                                   w = q5 * scale + min

K-quants pack 256 elements per block in sub-blocks with their own scales (see the comments at
_k_scales_numpy and _q6k_numpy for the bit layouts):

    Q4_K    scale, min (float16), sub_scales (12 bytes: 8 six-bit scales and 8 six-bit minimums),
            quants (128 bytes of nibbles)    w = scale * sub_scale * q4 - min * sub_min (8 sub-blocks of 32)
    Q5_K    as Q4_K plus high (32 bytes: bit u of byte j is the fifth bit of element j of sub-block u)
    Q6_K    quants (128 bytes of low nibbles), high (64 bytes of 2-bit fields), sub_scales (16 int8),
            scale (float16)                  w = scale * sub_scale * (q6 - 32) (16 sub-blocks of 16)

A 4-bit byte j of a block holds element j in its low nibble and element j + 16 in its high
nibble (ggml's layout). `weight` declares one graph input per part and rebuilds the float32
weight from primitives -- bit fields come from `fmod` and multiplies by powers of two, not from
bit operations, because the primitive set has none -- so the compiler can fuse the
dequantization into the kernel that consumes the weight, and the weight stays quantized in
memory. Q5_0, Q4_K and Q6_K are repacked first, exactly, into Q8_0 / Q4_1 blocks (their bit
layouts keep the fused kernel from vectorizing; see `weight`).

Each format's numpy dequantization sits next to its graph version: the numpy one is the
reference for tests (it matches `gguf.quants.dequantize` bit for bit) and for `dequantize()`.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Callable

import numpy as np

from .. import dtypes
from ..errors import DTypeError, ShapeError, UnsupportedError
from ..graph import Graph
from ..library.elementwise import absolute, sign, trunc
from ..symbolic import Var
from ..tensor import GraphTensor


@dataclass(frozen=True)
class BlockFormat:
    """One ggml block layout: `fields` are (part, numpy dtype, count per block) in storage order."""
    name: str
    block_size: int
    fields: tuple[tuple[str, type, int], ...]
    numpy: Callable[[dict], np.ndarray]      # float32 parts -> (..., nblocks, block_size) values
    graph: Callable[[dict], GraphTensor] | None = None  # GraphTensor parts -> the same, from primitives
    repack: Callable[[dict], tuple[str, dict]] | None = None  # or: parts -> (format, parts), the same values

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
    """(..., n) bytes -> (..., 2n) values: low nibbles are elements 0..n-1, high nibbles n..2n-1."""
    return np.concatenate([quants & 15, quants >> 4], axis=-1).astype(np.float32)


def _bits_numpy(quants: np.ndarray, count: int, bits: int, inner: bool = False) -> np.ndarray:
    """`count` fields of `bits` bits from each byte (field h = bits h*bits .. h*bits+bits-1), as
    float32 on a new axis: before the byte axis ((..., count, n): element h*n + j), or after it
    with `inner` ((..., n, count): element j*count + h)."""
    shifts = np.arange(count, dtype=np.uint8) * bits
    axis = -1 if inner else -2
    fields = (np.expand_dims(quants, axis) >> np.expand_dims(shifts, -1 - axis)) & ((1 << bits) - 1)
    return fields.astype(np.float32)


def _bit_fields(quants: GraphTensor, count: int, bits: int, inner: bool = False) -> GraphTensor:
    """The same from primitives, without a concatenation. `count` (a power of two) fields are
    split off in halves: the bytes are broadcast over a new axis h of size 2, and half h of
    value q (halves of w bits) is floor(q * 2^-(w h)) fmod 2^w -- exact in float32, with a
    multiplier 1 or 2^-w that is affine in h, so no division per element -- then each half is
    split again until the fields have `bits` bits.

    A concatenation (pad + add) would leave padding tests and div/mod in the consumer's index
    math; this way the fields merge into rows by plain reshapes, so a matmul reads each byte
    with simple indices and the compiler unpacks the bits inside its loop.
    """
    half, width = count // 2, count // 2 * bits
    axis = quants.ndim if inner else quants.ndim - 1  # where the new axis goes (counted from 0)
    shape = list(quants.dims)
    shape.insert(axis, 2)
    spread = quants.unsqueeze(axis).expand(*shape)  # no copy
    multiplier = 1.0 - quants.graph.constant(Var(f"_d{axis}", 0, 1), spread.dims) * (1.0 - 1.0 / (1 << width))
    shifted = spread * multiplier
    whole = shifted - shifted.fmod(1.0)  # floor (values are >= 0)
    halves = whole.fmod(float(1 << width))  # (..., 2, n) or (..., n, 2)
    if half == 1:
        return halves
    fields = _bit_fields(halves, half, bits, inner)  # (..., 2, half, n) or (..., n, 2, half)
    return fields.flatten(-2, -1) if inner else fields.flatten(-3, -2)


def _nibbles_graph(quants: GraphTensor) -> GraphTensor:
    """(..., n) bytes -> (..., 2n) nibbles as in _nibbles_numpy."""
    return _bit_fields(quants, 2, 4).flatten(-2)


def _f32(array: np.ndarray) -> np.ndarray:
    return array.astype(np.float32)


def _col(x):
    """A per-block (or per-sub-block) value broadcast over the elements of its block."""
    return x[..., None] if isinstance(x, np.ndarray) else x.unsqueeze(-1)


# -- the 5-bit formats: a fifth bit per element in a 32-bit word --------------------------------
def _q5_numpy(p: dict) -> np.ndarray:
    """Q5_0 / Q5_1 values before scaling: nibble + 16 * high bit (high bit of element i is bit i
    of the little-endian 4-byte word, i.e. bit i % 8 of byte i // 8)."""
    high = _bits_numpy(p["high"], 8, 1, inner=True).reshape(*p["high"].shape[:-1], 32)
    return _nibbles_numpy(p["quants"]) + 16.0 * high


def _q5_graph(p: dict) -> GraphTensor:
    return _nibbles_graph(p["quants"]) + 16.0 * _bit_fields(p["high"], 8, 1, inner=True).flatten(-2)


# -- K-quants: 256-element super-blocks of 8 (or 16) sub-blocks with their own 6-bit (or 8-bit)
# scales. Q4_K / Q5_K pack 8 scales and 8 minimums in 12 bytes: bytes 0-3 hold scales 0-3 in
# their low 6 bits, bytes 4-7 minimums 0-3; scales / minimums 4-7 are the low / high nibbles of
# bytes 8-11, with their top two bits in the top two bits of bytes 0-3 / 4-7.
def _k_scales_numpy(packed: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(..., 12) bytes -> the sub-blocks' (scales, minimums), each (..., 8) float32."""
    rows = packed.reshape(*packed.shape[:-1], 3, 4).astype(np.int32)
    low, mid, top = rows[..., 0, :], rows[..., 1, :], rows[..., 2, :]
    scales = np.concatenate([low & 63, (top & 15) | ((low >> 6) << 4)], axis=-1)
    mins = np.concatenate([mid & 63, (top >> 4) | ((mid >> 6) << 4)], axis=-1)
    return scales.astype(np.float32), mins.astype(np.float32)


def _k_scales_graph(packed: GraphTensor) -> tuple[GraphTensor, GraphTensor]:
    """The same from primitives: fields of the three 4-byte rows, and sub-blocks 0-3 or 4-7
    chosen by arithmetic with the index constant of a new axis (no concatenation)."""
    rows = packed.reshape(*packed.dims[:-1], 3, 4)
    low, mid, top = rows[..., 0, :], rows[..., 1, :], rows[..., 2, :]
    top_fields = _bit_fields(top, 2, 4)  # (..., 2, 4): low and high nibbles
    # x & 63 = x - 64 * floor(x / 64), and floor(x / 64) is the top two bits
    low_top, mid_top = _bit_fields(low, 2, 6)[..., 1, :], _bit_fields(mid, 2, 6)[..., 1, :]
    low6, mid6 = low - 64.0 * low_top, mid - 64.0 * mid_top
    second = packed.graph.constant(Var(f"_d{packed.ndim - 1}", 0, 1), (*packed.dims[:-1], 2, 4))  # 1 for 4-7

    def halves(first: GraphTensor, last: GraphTensor) -> GraphTensor:
        """(..., 8): sub-blocks 0-3 from `first`, 4-7 from `last` (each (..., 4))."""
        return (first.unsqueeze(-2) * (1.0 - second) + last.unsqueeze(-2) * second).flatten(-2)
    return (halves(low6, top_fields[..., 0, :] + 16.0 * low_top),
            halves(mid6, top_fields[..., 1, :] + 16.0 * mid_top))


def _q4k_numpy(p: dict) -> np.ndarray:
    """Q4_K: 4 groups of 32 bytes; group g's low nibbles are sub-block 2g, its high ones 2g + 1."""
    scales, mins = _k_scales_numpy(p["sub_scales"])
    quants = _nibbles_numpy(p["quants"].reshape(*p["quants"].shape[:-1], 4, 32))  # (..., 4, 64)
    values = _col(_f32(p["scale"])[..., None] * scales) * quants.reshape(*quants.shape[:-2], 8, 32) \
        - _col(_f32(p["min"])[..., None] * mins)
    return values.reshape(*values.shape[:-2], 256)


def _q4k_as_q4_1(p: dict) -> tuple[str, dict]:
    """Q4_K as Q4_1 blocks of 32 with float32 scales and minimums: the same values (scale *
    sub_scale and min * sub_min are exact float32 products, and Q4_1's nibble * scale + min
    rounds as Q4_K's nibble * scale - min does), in the layout the compiler vectorizes."""
    scales, mins = _k_scales_numpy(p["sub_scales"])
    nibbles = _nibbles_numpy(p["quants"].reshape(*p["quants"].shape[:-1], 4, 32))  # (..., 4, 64)
    values = nibbles.reshape(*nibbles.shape[:-2], 8, 32)
    rows = p["scale"].shape[:-1]
    return "Q4_1", {"scale": (_f32(p["scale"])[..., None] * scales).reshape(*rows, -1),
                    "min": -(_f32(p["min"])[..., None] * mins).reshape(*rows, -1),
                    "quants": (values[..., :16] + 16.0 * values[..., 16:]).astype(np.uint8).reshape(*rows, -1, 16)}


def _q5k_numpy(p: dict) -> np.ndarray:
    """Q5_K: Q4_K's nibbles plus a fifth bit: bit u of high byte j belongs to element j of sub-block u."""
    scales, mins = _k_scales_numpy(p["sub_scales"])
    low = _nibbles_numpy(p["quants"].reshape(*p["quants"].shape[:-1], 4, 32))
    quants = low.reshape(*low.shape[:-2], 8, 32) + 16.0 * _bits_numpy(p["high"], 8, 1)
    values = _col(_f32(p["scale"])[..., None] * scales) * quants - _col(_f32(p["min"])[..., None] * mins)
    return values.reshape(*values.shape[:-2], 256)


def _q5k_graph(p: dict) -> GraphTensor:
    scales, mins = _k_scales_graph(p["sub_scales"])
    low = _nibbles_graph(p["quants"].reshape(*p["quants"].dims[:-1], 4, 32))  # (..., 4, 64)
    quants = low.reshape(*low.dims[:-2], 8, 32) + 16.0 * _bit_fields(p["high"], 8, 1)
    values = _col(p["scale"].unsqueeze(-1) * scales) * quants - _col(p["min"].unsqueeze(-1) * mins)
    return values.flatten(-2)


# Q6_K: each half of the block (128 elements) takes 64 bytes of low nibbles (element o of the
# half: nibble o // 64 of byte o % 64) and 32 bytes of 2-bit high fields (field o // 32 of byte
# o % 32); the 6-bit value minus 32 is scaled per sub-block of 16 by an int8 times the block's scale.
def _q6k_numpy(p: dict) -> np.ndarray:
    low = _nibbles_numpy(p["quants"].reshape(*p["quants"].shape[:-1], 2, 64))
    high = _bits_numpy(p["high"].reshape(*p["high"].shape[:-1], 2, 32), 4, 2)  # (..., 2, 4, 32)
    quants = low + 16.0 * high.reshape(*high.shape[:-2], 128) - 32.0  # (..., 2, 128)
    scales = _f32(p["scale"])[..., None] * _f32(p["sub_scales"])  # (..., 16)
    values = _col(scales) * quants.reshape(*quants.shape[:-2], 16, 16)
    return values.reshape(*values.shape[:-2], 256)


def _q6k_as_q8(p: dict) -> tuple[str, dict]:
    """Q6_K as Q8_0-style blocks of 16: the 6-bit value minus 32 as an int8, times a float32
    scale (the block's float16 scale times the sub-block's int8: an exact product), as Q6_K's
    dequantization multiplies them."""
    low = _nibbles_numpy(p["quants"].reshape(*p["quants"].shape[:-1], 2, 64))
    high = _bits_numpy(p["high"].reshape(*p["high"].shape[:-1], 2, 32), 4, 2)  # (..., 2, 4, 32)
    quants = low + 16.0 * high.reshape(*high.shape[:-2], 128) - 32.0
    rows = p["scale"].shape[:-1]
    return "Q8_0", {"scale": (_f32(p["scale"])[..., None] * _f32(p["sub_scales"])).reshape(*rows, -1),
                    "quants": quants.astype(np.int8).reshape(*rows, -1, 16)}


def _q5_0_as_q8_0(p: dict) -> tuple[str, dict]:
    """Q5_0 as Q8_0 (the 5-bit value minus 16 fits an int8; the scale is the same): a fifth bit
    per element in a 32-bit word keeps the compiler from vectorizing the fused dequantization
    (each element's bit is its own expression), while Q8_0's int8s vectorize."""
    return "Q8_0", {"scale": p["scale"], "quants": (_q5_numpy(p) - 16.0).astype(np.int8)}


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
    BlockFormat("Q5_0", 32, (("scale", np.float16, 1), ("high", np.uint8, 4), ("quants", np.uint8, 16)),
                numpy=lambda p: _f32(p["scale"])[..., None] * (_q5_numpy(p) - 16.0), repack=_q5_0_as_q8_0),
    BlockFormat("Q5_1", 32, (("scale", np.float16, 1), ("min", np.float16, 1), ("high", np.uint8, 4),
                             ("quants", np.uint8, 16)),
                numpy=lambda p: _f32(p["scale"])[..., None] * _q5_numpy(p) + _f32(p["min"])[..., None],
                graph=lambda p: p["scale"].unsqueeze(-1) * _q5_graph(p) + p["min"].unsqueeze(-1)),
    BlockFormat("Q4_K", 256, (("scale", np.float16, 1), ("min", np.float16, 1), ("sub_scales", np.uint8, 12),
                              ("quants", np.uint8, 128)), numpy=_q4k_numpy, repack=_q4k_as_q4_1),
    BlockFormat("Q5_K", 256, (("scale", np.float16, 1), ("min", np.float16, 1), ("sub_scales", np.uint8, 12),
                              ("high", np.uint8, 32), ("quants", np.uint8, 128)), numpy=_q5k_numpy, graph=_q5k_graph),
    BlockFormat("Q6_K", 256, (("quants", np.uint8, 128), ("high", np.uint8, 64), ("sub_scales", np.int8, 16),
                              ("scale", np.float16, 1)), numpy=_q6k_numpy, repack=_q6k_as_q8),
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


@dataclass(frozen=True)
class QuantizedWeight:
    """A block-quantized weight as graph inputs: its format (after any repacking), its parts
    (GraphTensors, one per storage part) and its shape."""
    qtype: str
    parts: dict
    shape: tuple

    def dequantized(self) -> GraphTensor:
        """The float32 weight, composed from primitives (fused into its consumer)."""
        return FORMATS[self.qtype].graph(self.parts).reshape(*self.shape)


def weight(g: Graph, name: str, tensor) -> tuple[GraphTensor, dict[str, np.ndarray]]:
    """A GGUF tensor as a float32 GraphTensor of `tensor.shape`, plus the arrays to feed.

    Declares one input per storage part, named `input_name(name, part)` with the part's storage
    dtype, and composes the dequantization from primitives. Q5_0, Q4_K and Q6_K are first
    repacked, exactly, as Q8_0 / Q4_1 blocks (see their `repack`): more bytes per weight (Q5_0
    22 -> 34 per 32, Q4_K 144 -> 192 per 256, Q6_K 210 -> 320 per 256), but the fused matvec
    vectorizes (the Q5_0 one ran as scalar code, 10x slower than Q8_0's). Returns (weight,
    {input name: array}).
    """
    declared, feeds = quantized_weight(g, name, tensor)
    return (declared.dequantized() if isinstance(declared, QuantizedWeight) else declared), feeds


def quantized_weight(g: Graph, name: str, tensor) -> tuple[QuantizedWeight | GraphTensor, dict[str, np.ndarray]]:
    """As `weight`, but a block format stays a QuantizedWeight (its parts as inputs), for
    `int8_linear`; a plain one is its GraphTensor."""
    if tensor.qtype not in SUPPORTED:
        raise UnsupportedError(f"weight {name!r}: GGUF format {tensor.qtype} is not supported in graphs "
                               f"(supported: {', '.join(SUPPORTED)}); feed dense(g, name, tensor.dequantize()) instead")
    qtype, parts = tensor.qtype, tensor.parts
    if qtype in FORMATS and FORMATS[qtype].repack:  # (once, at load: the graph sees the other format)
        qtype, parts = FORMATS[qtype].repack(parts)
    inputs, feeds = {}, {}
    for part, array in parts.items():
        key = input_name(name, part)
        inputs[part] = g.tensor(key, array.shape, _STORAGE[array.dtype])
        feeds[key] = array
    if qtype in PLAIN:
        return inputs["data"], feeds
    return QuantizedWeight(qtype, inputs, tuple(tensor.shape)), feeds


# -- int8 activations ---------------------------------------------------------------------------
INT8_FORMATS = ("Q8_0", "Q4_0", "Q4_1")  # (the graph's formats: Q5_0, Q4_K and Q6_K repack into them)


@dataclass(frozen=True)
class Int8Rows:
    """Rows of activations quantized per block of 32 (quantize_activations): `values` the int8
    integers, `scales` (..., K / 32) the per-block d. With `halves` the values are stored as
    (..., 2, K / 32, 16): every block's first 16 elements, then every block's last 16 -- the
    halves a 4-bit weight's low and high nibbles meet -- else as (..., K / 32, 32)."""
    values: GraphTensor
    scales: GraphTensor
    halves: bool


def quantize_activations(x: GraphTensor, halves: bool = False) -> Int8Rows:
    """`x` (..., K) quantized per block of 32 as llama.cpp's Q8_1 does -- d = amax / 127,
    q = x / d rounded half away from zero, integers in [-127, 127]. q is spelled
    trunc(fmod(y, 128)), which the compiler proves is an int8 (kernels.int8_valued): it is stored
    once as bytes and read by the matmul's integer dots.

    `halves` stores the values half-major (Int8Rows): a 4-bit weight's dot then reads the halves
    of 4 consecutive blocks as one 64-byte load, where the block-major layout takes a 16-byte
    insert per block and row (a Q4_1 576-wide matvec: 15-20% faster, in a C microbenchmark on
    two Sapphire Rapids threads, weights streamed from memory)."""
    lead, k = x.dims[:-1], x.dims[-1]
    blocks = x.reshape(*lead, k // 32, 32)
    amax = absolute(blocks).amax(-1)
    inverse = amax.gt(0.0) * (127.0 / (amax + amax.le(0.0)))  # 0 for a block of zeros
    if halves:  # (..., 2, K/32, 16), each element times its block's inverse
        scaled = x.reshape(*lead, k // 32, 2, 16).transpose(-3, -2) * inverse.unsqueeze(-2).unsqueeze(-1)
    else:
        scaled = blocks * inverse.unsqueeze(-1)
    rounded = scaled + sign(scaled) * 0.5  # (its trunc rounds half away from zero)
    return Int8Rows(trunc(rounded.fmod(128.0)), amax * (1.0 / 127.0), halves)


def block_linear(x: GraphTensor, w: QuantizedWeight) -> GraphTensor:
    """x @ w.T in float32 for a Q8_0, Q4_0 or Q4_1 weight (N, K), a block at a time: the dot of x's
    block with the block's integers, times the block's scale, plus for Q4_0 / Q4_1 the block's
    minimum times the sum of x's block. The same sum as `x @ w.dequantized().T`, in another order
    (rounding differs by about 1e-7 relative); the CPU backend renders it as float lanes scaled
    once per block, without dequantizing each weight: Q4_1 matvecs 1.3-1.5x as fast as the
    dequantizing form (bench/int8_matvec.py, one thread; Q8_0 gains ~4%, so models use it for Q4
    weights only). For matrix-vector products: a tiled matmul reuses the dequantized weight
    across rows, which this form has no place for."""
    _check_block_operands("block_linear", x, w)
    lead, k, scale = x.dims[:-1], w.shape[1], w.parts["scale"]
    if w.qtype == "Q8_0":
        size = w.parts["quants"].dims[-1]  # (32; 16 for a repacked Q6_K)
        return ((w.parts["quants"] * x.reshape(*lead, 1, k // size, size)).sum(-1) * scale).sum(-1)
    halves = x.reshape(*lead, 1, k // 32, 2, 16)  # against the nibbles (N, K/32, 2, 16)
    blockwise = (_bit_fields(w.parts["quants"], 2, 4) * halves).sum(-1).sum(-1) * scale
    minimum = w.parts["min"] if w.qtype == "Q4_1" else scale * -8.0
    return (blockwise + minimum * x.reshape(*lead, 1, k // 32, 32).sum(-1)).sum(-1)


def _check_block_operands(caller: str, x: GraphTensor, w: QuantizedWeight):
    """A clear error unless w has a block dot and x's last axis meets w's rows in whole blocks."""
    if w.qtype not in INT8_FORMATS:
        raise UnsupportedError(f"{caller}: weight format {w.qtype} has no block dot "
                               f"(supported: {', '.join(INT8_FORMATS)} and the formats repacked into them)")
    k = w.shape[1]
    if k % 32 or x.dims[-1] != k:
        raise ShapeError(f"{caller}: input {tuple(x.dims)} against weight {w.shape}: the inner size must "
                         f"match and be a multiple of 32")


def int8_linear(x: GraphTensor, w: QuantizedWeight, quantized: dict | None = None) -> GraphTensor:
    """x @ w.T with x's rows quantized to int8 (quantize_activations) and w a Q8_0, Q4_0 or Q4_1
    weight (N, K): per block, the sum of integer products (exact in float32) times both scales,
    plus for Q4_0 / Q4_1 the block's minimum times d * sum(q) -- what llama.cpp's Q4 x Q8 dot
    computes, and what the CPU backend renders as integer dot products. Not exact: x is rounded
    to 8 bits per block (a relative error of about 1/254 of the block's largest value).
    `quantized`: x's quantizations made before, by layout (halves: Int8Rows), which this call
    uses or adds to (q, k and v read one input: it is quantized once)."""
    _check_block_operands("int8_linear", x, w)
    k = w.shape[1]
    quantized = {} if quantized is None else quantized
    halves = w.qtype != "Q8_0"  # (a Q8_0 block's 32 bytes meet x's 32 of the block-major layout whole)
    if halves not in quantized:
        quantized[halves] = quantize_activations(x, halves)
    rows = quantized[halves]
    lead = x.dims[:-1]
    scale, d = w.parts["scale"], rows.scales
    if w.qtype == "Q8_0":
        weights, size = w.parts["quants"], w.parts["quants"].dims[-1]  # blocks of 32 (16 for a repacked Q6_K)
        blocks = k // size
        q = rows.values.reshape(*lead, 1, blocks, size)
        d_per = d.unsqueeze(-1).expand(*lead, k // 32, 32 // size).reshape(*lead, 1, blocks)
        return ((weights * q).sum(-1) * (scale * d_per)).sum(-1)
    q = rows.values.transpose(-3, -2).unsqueeze(-4)  # (..., 1, K/32, 2, 16) against the nibbles (N, K/32, 2, 16)
    blockwise = (_bit_fields(w.parts["quants"], 2, 4) * q).sum(-1).sum(-1) * (scale * d.unsqueeze(-2))
    # (in the same sum over blocks: one loop, where a second one cost a third of the time)
    minimum = w.parts["min"] if w.qtype == "Q4_1" else scale * -8.0
    return (blockwise + minimum * (d * rows.values.sum(-1).sum(-2)).unsqueeze(-2)).sum(-1)


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
