"""Random-graph fuzzing: random chains of library ops, run by luminar, checked against numpy.

Hypothesis draws 1-3 input arrays (ranks 0-4, sizes 1-5, shapes related so they broadcast,
sometimes with symbolic dims, stored as float32, float16, bfloat16 or int8) and a chain of 1-8
ops from OPS, a table of (luminar op, numpy model of it, when it applies). Each op takes its
operands from everything computed so far. On the reference runtime the graph is
compiled twice, with no passes and with the default passes; compiled backends (cpu) get fewer
examples, because each graph is a fresh C compile. Every result must match the numpy model
(computed in float64) within rtol 1e-4, atol 1e-5.

Ops join the table as soon as the library has them (`needs` is checked against GraphTensor and
the luminar namespace), so the fuzzer grows with the library. A failure prints the op chain.

With symbolic dims an op luminar rejects (s0 cannot be proven to equal 5) is skipped, not failed.
Values are kept within +-BOUND (an op whose result would leave it is skipped) and divisors and
square roots away from 0, so float32 rounding stays well below the tolerance.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import pytest
from hypothesis import HealthCheck, event, given, note, settings
from hypothesis import strategies as st

import luminar as lm
from conftest import BACKENDS
from luminar import GraphTensor

BOUND = 16.0
MAX_ELEMENTS = 2000
RTOL, ATOL = 1e-4, 1e-5


@dataclass(frozen=True, repr=False)
class FuzzOp:
    """One row of the table: how luminar and numpy spell an op, and when it may be drawn."""
    name: str
    arity: int
    lum: Callable  # (*GraphTensors, **params) -> GraphTensor
    ref: Callable  # (*float64 arrays, **params) -> array
    fits: Callable = lambda *arrays: True  # may the op take these operands?
    params: Callable = lambda draw, *arrays: {}  # draws the op's arguments with hypothesis
    needs: tuple = ()  # GraphTensor methods the op uses; "lm.name" for luminar functions
    # the result depends on which dims are 1, which luminar only knows for constant dims
    # (squeeze keeps a symbolic dim even when it is 1 at run time)
    needs_known_ones: bool = False

    def __repr__(self):
        return self.name

    def _repr_pretty_(self, printer, cycle):  # how hypothesis prints a drawn op in a failure report
        printer.text(self.name)

    def available(self) -> bool:
        return all(hasattr(lm, n[3:]) if n.startswith("lm.") else hasattr(GraphTensor, n) for n in self.needs)


# -- numpy models and argument drawing -----------------------------------------------------------
def broadcastable(a, b) -> bool:
    try:
        np.broadcast_shapes(a.shape, b.shape)
        return True
    except ValueError:
        return False


def matmul_fits(a, b) -> bool:
    if a.ndim == 0 or b.ndim == 0:
        return False
    try:
        np.matmul(a, b)
        return True
    except ValueError:
        return False


def dim_in(draw, ndim: int, extra: int = 0) -> int:
    """A dim index for a tensor of rank `ndim` (+extra positions), maybe negative."""
    n = max(ndim + extra, 1)
    return draw(st.integers(-n, n - 1))


def reduce_params(draw, x):
    dims = [None] + list(range(-max(x.ndim, 1), max(x.ndim, 1)))
    return {"dim": draw(st.sampled_from(dims)), "keepdim": draw(st.booleans())}


def np_reduce(fn):
    def model(x, dim, keepdim):
        return x if x.ndim == 0 else fn(x, axis=dim, keepdims=keepdim)
    return model


def np_softmax(x, dim):
    e = np.exp(x - x.max(axis=dim, keepdims=True))
    return e / e.sum(axis=dim, keepdims=True)


def clamp(t: GraphTensor, lo: float, hi: float) -> GraphTensor:
    if hasattr(GraphTensor, "clamp"):
        return t.clamp(lo, hi)
    return lm.where(t < lo, lo, lm.where(t > hi, hi, t))


def reshape_params(draw, x):
    """A random shape with x's element count, maybe with one -1."""
    rest, shape = x.size, []
    for _ in range(draw(st.integers(0 if x.size == 1 else 1, 4)) - 1):
        d = draw(st.sampled_from([d for d in range(1, rest + 1) if rest % d == 0]))
        shape.append(d)
        rest //= d
    if x.size > 1 or shape or draw(st.booleans()):
        shape.append(rest)
    if shape and draw(st.booleans()):
        shape[draw(st.integers(0, len(shape) - 1))] = -1
    return {"shape": tuple(shape)}


def flatten_params(draw, x):
    if x.ndim == 0:
        return {"start_dim": 0, "end_dim": -1}
    start = draw(st.integers(0, x.ndim - 1))
    end = draw(st.integers(start, x.ndim - 1))
    return {"start_dim": start - draw(st.sampled_from([0, x.ndim])), "end_dim": end - draw(st.sampled_from([0, x.ndim]))}


def np_flatten(x, start_dim, end_dim):
    if x.ndim == 0:
        return x.reshape(1)
    s, e = start_dim % x.ndim, end_dim % x.ndim
    return x.reshape(x.shape[:s] + (-1,) + x.shape[e + 1:])


def np_squeeze(x, dim):
    if dim is None:
        return np.squeeze(x)
    return np.squeeze(x, dim) if x.shape[dim] == 1 else x


def draw_slice(draw, n: int) -> slice:
    """A non-empty slice of range(n), spelled with None, negative or out-of-range bounds."""
    start = draw(st.integers(0, n - 1))
    stop = draw(st.integers(start + 1, n))
    step = draw(st.integers(1, 3))
    start_spelled = draw(st.sampled_from([start, start - n] + ([None, -n - 3] if start == 0 else [])))
    stop_spelled = draw(st.sampled_from([stop] + ([None, n + 2] if stop == n else [stop - n])))
    return slice(start_spelled, stop_spelled, None if step == 1 and draw(st.booleans()) else step)


def index_params(draw, x):
    """Basic indexing: slices and ints on leading (or, after an Ellipsis, trailing) dims, maybe a None."""
    count = draw(st.integers(0, x.ndim))
    use_ellipsis = draw(st.booleans())
    dims = x.shape[x.ndim - count:] if use_ellipsis else x.shape[:count]
    items = [draw_slice(draw, n) if draw(st.booleans()) else draw(st.integers(-n, n - 1)) for n in dims]
    if x.ndim < 4 and draw(st.booleans()):
        items.insert(draw(st.integers(0, len(items))), None)
    return {"index": tuple(([Ellipsis] if use_ellipsis else []) + items)}


def pad_params(draw, x):
    dims = draw(st.integers(1, x.ndim))
    amounts = tuple(draw(st.integers(0, 2)) for _ in range(2 * dims))
    return {"pad": amounts, "value": draw(st.sampled_from([0.0, 1.5]))}


def np_pad(x, pad, value):
    widths = [(0, 0)] * x.ndim
    for i in range(len(pad) // 2):
        widths[x.ndim - 1 - i] = (pad[2 * i], pad[2 * i + 1])
    return np.pad(x, widths, constant_values=value)


def expand_params(draw, x):
    sizes = [draw(st.integers(1, 4)) if n == 1 else draw(st.sampled_from([n, -1])) for n in x.shape]
    lead = [draw(st.integers(1, 3)) for _ in range(draw(st.integers(0, 1 if x.ndim < 4 else 0)))]
    return {"sizes": tuple(lead + sizes)}


def np_expand(x, sizes):
    lead = len(sizes) - x.ndim
    shape = [x.shape[k - lead] if s == -1 else s for k, s in enumerate(sizes)]
    return np.broadcast_to(x, shape)


def cat_dims(a, b) -> list[int]:
    """The dims along which a and b can be concatenated."""
    if a.ndim != b.ndim or a.ndim == 0:
        return []
    return [d for d in range(a.ndim) if all(a.shape[k] == b.shape[k] for k in range(a.ndim) if k != d)]


def cat_params(draw, a, b):
    d = draw(st.sampled_from(cat_dims(a, b)))
    return {"dim": d - draw(st.sampled_from([0, a.ndim]))}


def np_logsumexp(x, dim, keepdim):
    m = x.max(axis=dim, keepdims=True)
    out = m + np.log(np.exp(x - m).sum(axis=dim, keepdims=True))
    return out if keepdim else np.squeeze(out, dim)


def narrow_params(draw, x):
    dim = dim_in(draw, x.ndim)
    n = x.shape[dim]
    start = draw(st.integers(-n, n - 1))  # negative starts count from the end, like torch
    return {"dim": dim, "start": start, "length": draw(st.integers(1, n - start % n))}


def unfold_params(draw, x):
    dim = dim_in(draw, x.ndim)
    return {"dimension": dim, "size": draw(st.integers(1, x.shape[dim])), "step": draw(st.integers(1, 3))}


def np_unfold(x, dimension, size, step):
    """torch.unfold: windows of `size` every `step` along `dimension`, appended as the last dim."""
    d = dimension % x.ndim
    starts = range(0, x.shape[d] - size + 1, step)
    windows = [np.moveaxis(np.take(x, range(s, s + size), d), d, -1) for s in starts]
    return np.stack(windows, d)


def binary(name, lum, ref, fits=broadcastable, needs=()):
    return FuzzOp(name, 2, lum, ref, fits, needs=needs)


def unary(name, lum, ref, fits=lambda x: True, needs=None):
    return FuzzOp(name, 1, lum, ref, fits, needs=(name,) if needs is None else needs)


OPS = [
    # elementwise with broadcasting
    binary("add", lambda a, b: a + b, np.add),
    binary("sub", lambda a, b: a - b, np.subtract),
    binary("mul", lambda a, b: a * b, np.multiply),
    binary("div", lambda a, b: a / b, np.divide, lambda a, b: broadcastable(a, b) and np.abs(b).min() >= 0.25),
    binary("maximum", lambda a, b: lm.maximum(a, b), np.maximum, needs=("lm.maximum",)),
    # unary
    unary("exp", lambda x: clamp(x, -3.0, 2.0).exp(), lambda x: np.exp(np.clip(x, -3.0, 2.0))),
    unary("log1p_abs", lambda x: (x.abs() + 1.0).log(), lambda x: np.log(np.abs(x) + 1.0), needs=("abs",)),
    unary("sin", lambda x: x.sin(), np.sin),
    unary("sqrt_abs", lambda x: x.abs().sqrt(), lambda x: np.sqrt(np.abs(x)),
          fits=lambda x: np.abs(x).min() >= 0.01, needs=("abs",)),  # sqrt magnifies rounding near 0
    unary("tanh", lambda x: x.tanh(), np.tanh),
    unary("relu", lambda x: x.relu(), lambda x: np.maximum(x, 0.0)),
    unary("sigmoid", lambda x: x.sigmoid(), lambda x: 1.0 / (1.0 + np.exp(-x))),
    unary("abs", lambda x: x.abs(), np.abs),
    unary("neg", lambda x: -x, np.negative, needs=()),
    unary("reciprocal", lambda x: x.reciprocal(), np.reciprocal, lambda x: np.abs(x).min() >= 0.25),
    # a constant tensor shaped like x (a chain the passes fold), for later ops to view and combine
    FuzzOp("constant", 1, lambda x, a, b: x.graph.constant(a, x.dims) * b + a, lambda x, a, b: np.full(x.shape, a * b + a),
           params=lambda draw, x: {"a": draw(st.sampled_from([0.5, -1.25])), "b": draw(st.sampled_from([3.0, -0.5]))}),
    # reductions
    FuzzOp("sum", 1, lambda x, **p: x.sum(**p), np_reduce(np.sum), params=reduce_params),
    FuzzOp("amax", 1, lambda x, **p: x.amax(**p), np_reduce(np.max), params=reduce_params),
    FuzzOp("mean", 1, lambda x, **p: x.mean(**p), np_reduce(np.mean), params=reduce_params, needs=("mean",)),
    FuzzOp("softmax", 1, lambda x, dim: x.softmax(dim), np_softmax, lambda x: x.ndim >= 1,
           lambda draw, x: {"dim": dim_in(draw, x.ndim)}, needs=("softmax",)),
    # matmul: any aligned pair, and x @ x.mT which always aligns
    binary("matmul", lambda a, b: a @ b, np.matmul, matmul_fits),
    unary("gram", lambda x: x @ x.mT, lambda x: x @ np.swapaxes(x, -1, -2), lambda x: x.ndim >= 2, needs=()),
    # views
    FuzzOp("permute", 1, lambda x, dims: x.permute(*dims), lambda x, dims: np.transpose(x, dims),
           params=lambda draw, x: {"dims": tuple(d - draw(st.sampled_from([0, x.ndim])) if x.ndim else d
                                                 for d in draw(st.permutations(range(x.ndim))))}),
    FuzzOp("transpose", 1, lambda x, a, b: x.transpose(a, b), lambda x, a, b: np.swapaxes(x, a, b),
           lambda x: x.ndim >= 1, lambda draw, x: {"a": dim_in(draw, x.ndim), "b": dim_in(draw, x.ndim)}),
    FuzzOp("reshape", 1, lambda x, shape: x.reshape(shape), lambda x, shape: x.reshape(shape), params=reshape_params),
    FuzzOp("flatten", 1, lambda x, **p: x.flatten(**p), np_flatten, params=flatten_params),
    FuzzOp("unsqueeze", 1, lambda x, dim: x.unsqueeze(dim), lambda x, dim: np.expand_dims(x, dim),
           lambda x: x.ndim < 4, lambda draw, x: {"dim": dim_in(draw, x.ndim, extra=1)}),
    FuzzOp("squeeze", 1, lambda x, dim: x.squeeze(dim), np_squeeze,
           params=lambda draw, x: {"dim": draw(st.sampled_from([None] + list(range(-x.ndim, x.ndim))))},
           needs_known_ones=True),
    FuzzOp("index", 1, lambda x, index: x[index], lambda x, index: x[index], params=index_params),
    FuzzOp("flip", 1, lambda x, dims: x.flip(dims), lambda x, dims: np.flip(x, dims), lambda x: x.ndim >= 1,
           lambda draw, x: {"dims": tuple(d - draw(st.sampled_from([0, x.ndim])) for d in draw(
               st.lists(st.integers(0, x.ndim - 1), min_size=1, max_size=x.ndim, unique=True)))}),
    FuzzOp("pad", 1, lambda x, pad, value: x.pad(pad, value=value), np_pad, lambda x: x.ndim >= 1, pad_params),
    FuzzOp("expand", 1, lambda x, sizes: x.expand(*sizes), np_expand, params=expand_params),
    FuzzOp("contiguous", 1, lambda x: x.contiguous(), lambda x: x),
    # more of the library, where numpy has a direct model
    binary("minimum", lambda a, b: lm.minimum(a, b), np.minimum, needs=("lm.minimum",)),
    unary("cos", lambda x: x.cos(), np.cos),
    unary("square", lambda x: x.square(), np.square),
    unary("silu", lambda x: x.silu(), lambda x: x / (1.0 + np.exp(-x))),
    FuzzOp("cumsum", 1, lambda x, dim: x.cumsum(dim), lambda x, dim: np.cumsum(x, dim), lambda x: x.ndim >= 1,
           lambda draw, x: {"dim": dim_in(draw, x.ndim)}, needs=("cumsum",)),
    FuzzOp("logsumexp", 1, lambda x, dim, keepdim: x.logsumexp(dim, keepdim), np_logsumexp, lambda x: x.ndim >= 1,
           lambda draw, x: {"dim": dim_in(draw, x.ndim), "keepdim": draw(st.booleans())}, needs=("logsumexp",)),
    FuzzOp("log_softmax", 1, lambda x, dim: x.log_softmax(dim), lambda x, dim: x - np_logsumexp(x, dim, True),
           lambda x: x.ndim >= 1, lambda draw, x: {"dim": dim_in(draw, x.ndim)}, needs=("log_softmax",)),
    FuzzOp("roll", 1, lambda x, shifts, dims: x.roll(shifts, dims), lambda x, shifts, dims: np.roll(x, shifts, dims),
           lambda x: x.ndim >= 1, lambda draw, x: {"shifts": draw(st.integers(-6, 6)),
                                                   "dims": draw(st.sampled_from([None, *range(-x.ndim, x.ndim)]))},
           needs=("roll",)),
    FuzzOp("narrow", 1, lambda x, **p: x.narrow(**p), lambda x, dim, start, length: np.take(
        x, range(start % x.shape[dim], start % x.shape[dim] + length), dim), lambda x: x.ndim >= 1, narrow_params),
    FuzzOp("unfold", 1, lambda x, **p: x.unfold(**p), np_unfold, lambda x: x.ndim >= 1, unfold_params),
    FuzzOp("tril", 1, lambda x, diagonal: x.tril(diagonal), lambda x, diagonal: np.tril(x, diagonal),
           lambda x: x.ndim >= 2, lambda draw, x: {"diagonal": draw(st.integers(-2, 2))}, needs=("tril",)),
    FuzzOp("stack", 2, lambda a, b, dim: lm.stack([a, b], dim), lambda a, b, dim: np.stack([a, b], dim),
           lambda a, b: a.shape == b.shape and a.ndim < 4, lambda draw, a, b: {"dim": dim_in(draw, a.ndim, extra=1)},
           needs=("lm.stack",)),
    FuzzOp("cat", 2, lambda a, b, dim: lm.cat([a, b], dim), lambda a, b, dim: np.concatenate([a, b], dim),
           lambda a, b: bool(cat_dims(a, b)), cat_params, needs=("lm.cat",)),
]


# -- drawing a graph -----------------------------------------------------------------------------
@st.composite
def input_specs(draw):
    """1-3 inputs as (declared shape, concrete shape, dtype), built from one base shape: suffixes of
    it with some dims set to 1, so they broadcast. In some graphs base dims of size >= 2 are
    declared symbolic (s0, s1...), shared by every input that has them."""
    # hypothesis favours the first choice; start from rank 2, the most telling small case
    base = [draw(st.integers(1, 5)) for _ in range(draw(st.sampled_from([2, 3, 4, 1, 0])))]
    symbolic = draw(st.booleans())
    names = [f"s{k}" if symbolic and n >= 2 and draw(st.booleans()) else n for k, n in enumerate(base)]
    specs = []
    for k in range(draw(st.integers(1, 3))):
        rank = len(base) if k == 0 else draw(st.integers(0, len(base)))
        ones = [draw(st.integers(0, 3)) == 0 for _ in range(rank)]
        declared = tuple(1 if one else d for one, d in zip(ones, names[len(names) - rank:]))
        concrete = tuple(1 if one else n for one, n in zip(ones, base[len(base) - rank:]))
        specs.append((declared, concrete, draw(st.sampled_from(["float32", "float16", "int8", "bfloat16"]))))
    return specs


def random_input(shape, dtype: str, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """An array stored as `dtype` and the float64 values luminar computes with. Magnitudes are
    0.5..2 with random signs: safe divisors and square roots to start from."""
    rng = np.random.default_rng(seed)
    signs = rng.choice([-1.0, 1.0], shape)
    if dtype == "int8":
        stored = (rng.integers(1, 3, shape) * signs).astype(np.int8)
        return stored, stored.astype(np.float64)
    values = (rng.uniform(0.5, 2.0, shape) * signs).astype(np.float32)
    if dtype == "bfloat16":  # raw bit patterns: the top halves of float32 values
        stored = np.asarray(values.view(np.uint32) >> 16, np.uint16)  # (0-d arithmetic gives scalars)
        return stored, (stored.astype(np.uint32) << 16).view(np.float32).astype(np.float64)
    stored = values.astype(dtype)
    return stored, stored.astype(np.float64)


def candidates(op: FuzzOp, pool: list) -> list[tuple[int, ...]]:
    """Operand positions in `pool` the op can take."""
    if op.arity == 1:
        return [(i,) for i, (_, arr) in enumerate(pool) if op.fits(arr)]
    return [(i, j) for i in range(len(pool)) for j in range(len(pool)) if op.fits(pool[i][1], pool[j][1])]


def describe(value) -> str:
    return repr(value).replace("Ellipsis", "...")


def apply_random_op(data, pool: list, names: list[str]) -> None:
    """Draw an applicable op and operands, check the model result stays in range, apply both."""
    choices = [op for op in AVAILABLE if candidates(op, pool)]
    op = data.draw(st.sampled_from(choices), label="op")
    operands = data.draw(st.sampled_from(candidates(op, pool)), label="operands")
    arrays = [pool[i][1] for i in operands]
    params = op.params(data.draw, *arrays)
    with np.errstate(all="ignore"):
        expected = np.asarray(op.ref(*arrays, **params), np.float64)
    args = ", ".join([names[i] for i in operands] + [f"{k}={describe(v)}" for k, v in params.items()])
    if not np.all(np.isfinite(expected)) or np.abs(expected).max(initial=0) > BOUND or expected.size > MAX_ELEMENTS:
        note(f"  (skipped {op.name}({args}): result out of range)")
        event(f"skipped {op.name}")
        return
    tensors = [pool[i][0] for i in operands]
    if op.needs_known_ones and any(not d.is_const and n == 1 for t, a in zip(tensors, arrays)
                                   for d, n in zip(t.dims, a.shape)):
        note(f"  (skipped {op.name}({args}): a symbolic dim is 1 at run time)")
        return
    try:
        result = op.lum(*tensors, **params)
    except lm.LuminarError:
        if all(d.is_const for t in tensors for d in t.dims):
            raise
        # symbolic dims may not be provably compatible (s0 against 5, reshape s0*3 to 6): not a bug
        note(f"  (skipped {op.name}({args}): not expressible with symbolic dims)")
        event(f"symbolic-skipped {op.name}")
        return
    event(f"op {op.name}")  # pytest --hypothesis-show-statistics shows how often each op ran
    names.append(f"v{len(pool)}")
    note(f"{names[-1]} = {op.name}({args})  # shape {expected.shape}")
    pool.append((result, expected))


AVAILABLE = [op for op in OPS if op.available()]


def draw_graph(data) -> tuple[lm.Graph, dict, dict]:
    """A random graph, its inputs and its expected outputs (every computed value, or the last one
    and one other)."""
    g = lm.Graph()
    specs = data.draw(input_specs(), label="inputs")
    seed = data.draw(st.integers(0, 2**16), label="seed")
    inputs, pool, names = {}, [], []
    for k, (declared, concrete, dtype) in enumerate(specs):
        names.append(f"x{k}")
        inputs[names[-1]], values = random_input(concrete, dtype, seed + k)
        pool.append((g.tensor(names[-1], declared, dtype=dtype), values))
        note(f"{names[-1]} = g.tensor({names[-1]!r}, {declared}, dtype={dtype!r})  # run with shape {concrete}")
    event(f"rank {len(specs[0][1])}")
    if any(isinstance(d, str) for declared, _, _ in specs for d in declared):
        event("symbolic dims")
    for step in range(8):
        apply_random_op(data, pool, names)
        if step < 7 and data.draw(st.integers(0, 9), label="stop if 0") == 0:
            break  # an explicit stop shrinks better than a drawn op count
    if data.draw(st.booleans(), label="output every value"):  # checks each op, even if later ops hide it
        outputs = {names[k]: k for k in range(min(len(specs), len(pool) - 1), len(pool))}
    else:  # leaves the backend free to fuse the whole chain
        outputs = {"last": len(pool) - 1, "other": data.draw(st.integers(0, len(pool) - 1), label="other output")}
    note(f"outputs: {', '.join(f'{name}={names[k]}' for name, k in outputs.items())}")
    for name, k in outputs.items():
        pool[k][0].output(name)
    return g, inputs, {name: pool[k][1] for name, k in outputs.items()}


def assert_matches(program, inputs: dict, expected: dict, label: str):
    result = program(**inputs)
    for name, value in expected.items():
        assert result[name].shape == value.shape, f"output {name} has the wrong shape ({label})"
        np.testing.assert_allclose(result[name], value, rtol=RTOL, atol=ATOL, err_msg=f"output {name} ({label})")


@settings(max_examples=300, deadline=None, derandomize=True, suppress_health_check=list(HealthCheck))
@given(data=st.data())
def test_reference_runtime_matches_numpy_with_and_without_passes(data):
    g, inputs, expected = draw_graph(data)
    for passes in ([], None):
        assert_matches(g.compile("reference", passes=passes), inputs, expected, f"reference, passes={passes}")


# Each random graph is a fresh C compile (~0.2 s), so compiled backends get fewer examples.
@pytest.mark.parametrize("backend", [b for b in BACKENDS if b != "reference"])
@settings(max_examples=40, deadline=None, derandomize=True, suppress_health_check=list(HealthCheck))
@given(data=st.data())
def test_compiled_backends_match_numpy(backend, data):
    g, inputs, expected = draw_graph(data)
    assert_matches(g.compile(backend), inputs, expected, backend)


def test_the_op_table_only_uses_what_the_library_has():
    assert {"add", "sum", "permute", "index", "pad"} <= {op.name for op in AVAILABLE}
    assert all(op.available() for op in AVAILABLE)
