"""Load-time evaluation of nodes whose inputs are all known: the folding of Constant nodes and of
the shape computations exported models carry (Shape -> Gather -> Concat -> Reshape ...).

Numeric constants are evaluated by the `onnx` package's reference implementation of the op
(numpy code, run once at load time; the compiled graph never sees these nodes). Shape values
that hold symbolic dims (object arrays of luminar `Expr`s, made by the Shape op when a dim is a
`dim_param`) are evaluated here with numpy's object arithmetic, for the ops shape computations
use; the result is again a shape value, so `Reshape(x, Concat(Shape(x)[0], 64))` becomes a
static reshape to (batch, 64).
"""
from __future__ import annotations

import numpy as np

from ..symbolic import Expr
from .registry import to_int

# ops that must never be folded: their value is not a function of their inputs alone
NOT_FOLDABLE = {"RandomNormal", "RandomUniform", "RandomNormalLike", "RandomUniformLike", "Multinomial",
                "Bernoulli", "If", "Loop", "Scan", "Constant"}


def normalize(value: np.ndarray) -> np.ndarray:
    """An object array whose entries are all known ints becomes int64 again."""
    if value.dtype == object:
        ints = [to_int(v) for v in value.reshape(-1)]
        if not any(isinstance(v, Expr) for v in ints):
            return np.array(ints, dtype=np.int64).reshape(value.shape)
        return np.array(ints, dtype=object).reshape(value.shape)
    return value


def fold(node, inputs: list, attrs: dict, opsets: dict) -> list | None:
    """The outputs of `node` computed at load time, or None when this node cannot be folded."""
    if node.op_type in NOT_FOLDABLE or node.domain not in ("", "ai.onnx"):
        return None
    if any(isinstance(v, np.ndarray) and v.dtype == object for v in inputs if v is not None):
        fn = SYMBOLIC.get(node.op_type)
        if fn is None:
            return None
        out = fn(attrs, *inputs)
        if out is None:
            return None
        return [normalize(np.asarray(o, dtype=object) if not isinstance(o, np.ndarray) else o)
                for o in (out if isinstance(out, tuple) else (out,))]
    return _reference(node, inputs, opsets)


def _reference(node, inputs, opsets) -> list | None:
    """Evaluate one node with the onnx reference implementation of the model's opset version."""
    from onnx import ValueInfoProto, helper
    from onnx.reference import ReferenceEvaluator
    feeds = {name: v for name, v in zip(node.input, inputs) if name and v is not None}
    try:
        values = [helper.make_tensor_value_info(name, helper.np_dtype_to_tensor_dtype(v.dtype), None)
                  for name, v in feeds.items()]
        outputs = [ValueInfoProto(name=name) for name in node.output if name]
        graph = helper.make_graph([node], "fold", values, outputs)
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid(d, v) for d, v in opsets.items()])
        out = ReferenceEvaluator(model).run(None, feeds)
    except Exception:  # noqa: BLE001  (an op the reference cannot evaluate is built into the graph instead)
        return None
    results = iter(out)
    return [np.asarray(next(results)) if name else None for name in node.output]


# -- symbolic shape arithmetic --------------------------------------------------------------------
def _axis_list(attrs, axes):
    if axes is not None:
        return [int(a) for a in np.asarray(axes).reshape(-1)]
    return list(attrs.get("axes", []))


def _gather(attrs, data, indices):
    return np.take(data, indices.astype(np.int64), axis=attrs.get("axis", 0))


def _concat(attrs, *values):
    return np.concatenate([np.asarray(v, dtype=object).reshape(v.shape) for v in values], axis=attrs["axis"])


def _unsqueeze(attrs, data, axes=None):
    out = data
    rank = data.ndim + len(_axis_list(attrs, axes))
    for a in sorted(a % rank for a in _axis_list(attrs, axes)):
        out = np.expand_dims(out, a)
    return out


def _squeeze(attrs, data, axes=None):
    axes = _axis_list(attrs, axes)
    return np.squeeze(data, axis=tuple(a % data.ndim for a in axes) if axes else None)


def _slice(attrs, data, starts=None, ends=None, axes=None, steps=None):
    starts = attrs.get("starts") if starts is None else starts
    ends = attrs.get("ends") if ends is None else ends
    axes = list(range(len(np.asarray(starts).reshape(-1)))) if axes is None and "axes" not in attrs \
        else _axis_list(attrs, axes)
    steps = [1] * len(axes) if steps is None else [int(s) for s in np.asarray(steps).reshape(-1)]
    index = [slice(None)] * data.ndim
    for a, s, e, st in zip(axes, np.asarray(starts).reshape(-1), np.asarray(ends).reshape(-1), steps):
        index[a % data.ndim] = slice(int(s), int(e), st)
    return data[tuple(index)]


def _reshape(attrs, data, shape):
    shape = [int(s) for s in np.asarray(shape).reshape(-1)]
    shape = [data.shape[k] if s == 0 and not attrs.get("allowzero", 0) else s for k, s in enumerate(shape)]
    return data.reshape(shape)


def _binary(fn):
    return lambda attrs, a, b: np.vectorize(fn, otypes=[object])(a.astype(object), b.astype(object))


def _integer_type(elem_type) -> bool:
    from onnx import helper
    try:
        return np.dtype(helper.tensor_dtype_to_np_dtype(elem_type)).kind in "iu"
    except (KeyError, TypeError, ValueError):
        return False


def _div(a, b):
    return a // b  # integer shape arithmetic: sizes are non-negative, so floor = truncation


SYMBOLIC = {
    "Identity": lambda attrs, x: x,
    "Gather": _gather,
    "Concat": _concat,
    "Unsqueeze": _unsqueeze,
    "Squeeze": _squeeze,
    "Slice": _slice,
    "Reshape": _reshape,
    "Flatten": lambda attrs, x: x.reshape(1, -1) if x.ndim else x.reshape(1, 1),
    "Cast": lambda attrs, x: x if _integer_type(attrs.get("to")) else None,  # to a float: built in the graph
    "Add": _binary(lambda a, b: a + b),
    "Sub": _binary(lambda a, b: a - b),
    "Mul": _binary(lambda a, b: a * b),
    "Div": _binary(_div),
}


def constant_node_value(node, attrs) -> np.ndarray:
    """The value of a Constant node (any of its value attributes, whatever their declared type)."""
    from onnx import AttributeProto, helper, numpy_helper
    for a in node.attribute:
        if a.type == AttributeProto.TENSOR:
            return numpy_helper.to_array(a.t)
        if a.type == AttributeProto.SPARSE_TENSOR:
            from onnx.reference import ReferenceEvaluator
            return ReferenceEvaluator(node).run(None, {})[0]
        value = helper.get_attribute_value(a)
        if a.type in (AttributeProto.INT, AttributeProto.INTS):
            return np.array(value, dtype=np.int64)
        if a.type in (AttributeProto.FLOAT, AttributeProto.FLOATS):
            return np.array(value, dtype=np.float32)
        if a.type in (AttributeProto.STRING, AttributeProto.STRINGS):
            return np.array(value, dtype=object)
    raise ValueError(f"Constant node {node.name!r} has no value attribute")
