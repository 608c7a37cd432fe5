"""The ONNX op registry and what an op implementation sees while the loader builds the graph.

Every ONNX value the loader tracks is one of two things:

- a numpy array: known at load time (an initializer, a Constant node, or anything computed only
  from those, folded by folding.py). Shape values with symbolic dims are object arrays holding
  luminar `Expr`s for the unknown sizes;
- a `Traced`: a luminar GraphTensor (which always computes in float32) together with the ONNX
  element type it stands for, so integer and boolean results round-trip to the right dtype.

An op implementation is a function `fn(ctx, *inputs) -> value or tuple of values`, registered
with `@op("Name")`. `ctx` (a NodeContext) gives it the node's attributes, its opset version, the
graph, and the conversions it needs: `ctx.tensor(v)` (any value as a GraphTensor: constants
become weights or scalar constants), `ctx.const(v, what)` (a value the op needs at load time:
a shape, axes, pads...; a runtime tensor there raises NeedsConstant).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..errors import UnsupportedError
from ..symbolic import Expr
from ..tensor import GraphTensor

OPS: dict[tuple[str, str], callable] = {}


def op(*names: str, domain: str = ""):
    """Register the decorated function as the implementation of ONNX ops `names` in `domain`."""
    def register(fn):
        for name in names:
            if (domain, name) in OPS:
                raise RuntimeError(f"ONNX op {domain or 'ai.onnx'}::{name} is registered twice")
            OPS[(domain, name)] = fn
        return fn
    return register


@dataclass
class Traced:
    """A runtime value: a GraphTensor and the ONNX numpy dtype it represents."""
    tensor: GraphTensor
    dtype: np.dtype

    @property
    def shape(self):
        return self.tensor.dims


class NeedsConstant(UnsupportedError):
    """An op needs a value at load time (a shape, axes, pads) but got a runtime tensor.

    `tensor` names the ONNX value; binding the graph input it comes from with
    `load(..., constants={name: array})` makes it foldable.
    """

    def __init__(self, message: str, tensor: str):
        super().__init__(message)
        self.tensor = tensor


def is_const(value) -> bool:
    return isinstance(value, np.ndarray)


def dtype_of(value) -> np.dtype:
    if isinstance(value, Traced):
        return value.dtype
    if value.dtype == object:
        return np.dtype(np.int64)  # symbolic shape values
    return value.dtype


def shape_of(value) -> tuple:
    return tuple(value.tensor.dims) if isinstance(value, Traced) else value.shape


NARROW_INTS = {"int4": (-8, 7), "uint4": (0, 15), "int2": (-2, 1), "uint2": (0, 3)}  # ml_dtypes' sub-byte ints


def is_float(dtype) -> bool:
    """float16/32/64, bfloat16 and the float8/float4 formats (ml_dtypes' numpy kind is 'V' for most)."""
    return np.dtype(dtype).kind == "f" or str(dtype).startswith(("bfloat", "float"))


def integer_kind(dtype) -> str | None:
    """'i' or 'u' for integer dtypes (sub-byte ones included), 'b' for bool, else None."""
    name = str(dtype)
    if name in NARROW_INTS:
        return "u" if name.startswith("u") else "i"
    kind = np.dtype(dtype).kind
    return kind if kind in "iub" else None


def to_int(v):
    """A load-time integer (Python/numpy int, or an Expr that is constant) as an int; Exprs stay."""
    if isinstance(v, Expr):
        return v.value if v.is_const else v
    return int(v)


def known_dims(dims, what: str) -> list[int]:
    """Dims this op needs as ints at load time; UnsupportedError if one is symbolic."""
    out = [to_int(d) for d in dims]
    if any(isinstance(d, Expr) for d in out):
        raise UnsupportedError(f"{what} needs known sizes, got {out}")
    return out


class NodeContext:
    """One node being built: attributes, opset, and conversions between values."""

    def __init__(self, builder, node, opset: int):
        self.builder, self.node, self.opset = builder, node, opset
        self.graph = builder.graph
        self.attrs = builder.attributes(node)
        self.input_names = list(node.input)

    @property
    def where(self) -> str:
        return self.builder.current

    def attr(self, name: str, default=None):
        return self.attrs.get(name, default)

    def tensor(self, value) -> GraphTensor:
        """Any value as a GraphTensor (a constant array becomes a weight or a scalar constant)."""
        if isinstance(value, Traced):
            return value.tensor
        return self.builder.constant_tensor(value)

    def const(self, value, what: str, index: int | None = None) -> np.ndarray:
        """A value this op needs at load time; NeedsConstant if it is only known at run time."""
        if isinstance(value, np.ndarray):
            return value
        name = self.input_names[index] if index is not None and index < len(self.input_names) else what
        raise NeedsConstant(f"{what} must be known at load time (a constant or computed from constants), "
                            f"but tensor {name!r} is computed at run time; bind the graph input it comes "
                            f"from with load(..., constants={{...}})", name)

    def ints(self, value, what: str, index: int | None = None) -> list:
        """A load-time 1-D (or scalar) integer value as a list of ints (Exprs for symbolic sizes)."""
        arr = self.const(value, what, index)
        return [to_int(v) for v in np.asarray(arr).reshape(-1)]

    def traced(self, tensor: GraphTensor, dtype) -> Traced:
        return Traced(tensor, np.dtype(dtype))
