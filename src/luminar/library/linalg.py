"""Linear algebra beyond `matmul`/`@` (which lives in tensor.py): mm, bmm, mv, dot, outer, linear.

Each is torch's function with torch's strict rank rules (torch.mm refuses batches, torch.bmm
refuses broadcasting); the arithmetic is always `matmul`, i.e. a broadcast multiply and a sum
over the shared axis, which the compiler turns into a tiled kernel.
"""
from __future__ import annotations

from ..errors import ShapeError
from ..graph import show_shape


def _require_rank(op: str, ranks: tuple[int, ...], **tensors):
    """Raise a ShapeError unless each of `tensors` (by argument name, checked in order) has one of
    `ranks` dimensions (torch's strict checks)."""
    for name, t in tensors.items():
        if not hasattr(t, "ndim"):
            raise ShapeError(f"{op}: {name} must be a tensor, got {type(t).__name__}")
        if t.ndim not in ranks:
            want = " or ".join(f"{r}-D" for r in ranks)
            raise ShapeError(f"{op}: {name} must be {want}, got {t.ndim}-D with shape {show_shape(t.dims)}")


def _require_equal(op: str, what: str, a, b, a_dim, b_dim):
    if a_dim != b_dim:
        raise ShapeError(f"{op}: {what} must match, got {a_dim} (shape {show_shape(a.dims)}) and {b_dim} "
                         f"(shape {show_shape(b.dims)})")


def mm(input, mat2):
    """torch.mm: (n, k) @ (k, m) -> (n, m); both operands must be matrices (no broadcasting)."""
    _require_rank("mm", (2,), input=input, mat2=mat2)
    _require_equal("mm", "input's columns and mat2's rows", input, mat2, input.dims[1], mat2.dims[0])
    return input.matmul(mat2)


def bmm(input, mat2):
    """torch.bmm: (b, n, k) @ (b, k, m) -> (b, n, m); batch sizes must be equal (no broadcasting)."""
    _require_rank("bmm", (3,), input=input, mat2=mat2)
    _require_equal("bmm", "batch sizes", input, mat2, input.dims[0], mat2.dims[0])
    _require_equal("bmm", "input's columns and mat2's rows", input, mat2, input.dims[2], mat2.dims[1])
    return input.matmul(mat2)


def mv(input, vec):
    """torch.mv: (n, k) @ (k,) -> (n,)."""
    _require_rank("mv", (2,), input=input)
    _require_rank("mv", (1,), vec=vec)
    _require_equal("mv", "input's columns and vec's size", input, vec, input.dims[1], vec.dims[0])
    return input.matmul(vec)


def dot(input, tensor):
    """torch.dot: the 0-d sum of products of two 1-D tensors of equal size."""
    _require_rank("dot", (1,), input=input, tensor=tensor)
    _require_equal("dot", "sizes", input, tensor, input.dims[0], tensor.dims[0])
    return (input * tensor).sum()


def outer(input, vec2):
    """torch.outer: (n,) and (m,) -> (n, m) with out[i, j] = input[i] * vec2[j]."""
    _require_rank("outer", (1,), input=input, vec2=vec2)
    return input.unsqueeze(-1) * vec2.unsqueeze(0)


def linear(input, weight, bias=None):
    """torch.nn.functional.linear: input @ weight.T + bias.

    `weight` is (out_features, in_features), or (in_features,) which drops the feature axis;
    `input` is (..., in_features) with any number of leading dims; `bias` broadcasts against
    the result (normally (out_features,)). Deviation: torch refuses most biases with a 1-D
    weight (its addmm path wants a matrix); here any bias that broadcasts is added.
    """
    _require_rank("linear", (1, 2), weight=weight)
    if not hasattr(input, "ndim") or input.ndim == 0:
        raise ShapeError(f"linear: input must have at least 1 dimension (..., in_features), "
                         f"got {show_shape(input.dims) if hasattr(input, 'dims') else type(input).__name__}")
    if input.dims[-1] != weight.dims[-1]:
        raise ShapeError(f"linear: input has {input.dims[-1]} features (last dim of shape {show_shape(input.dims)}) "
                         f"but weight expects {weight.dims[-1]} (weight shape {show_shape(weight.dims)})")
    out = input.matmul(weight.mT if weight.ndim == 2 else weight)
    return out if bias is None else out + bias


METHODS = {"mm": mm, "bmm": bmm, "mv": mv, "dot": dot, "outer": outer}
FUNCTIONS = {"linear": linear}
