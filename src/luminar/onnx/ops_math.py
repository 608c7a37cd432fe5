"""ONNX elementwise math, activations, comparisons, reductions, softmax and matrix products.

Each op is a composition of luminar GraphTensor ops (which are compositions of the primitives).
Integer ONNX tensors compute in float32 like everything else; where integer semantics differ
from float ones (Div truncates, Mod follows the divisor's sign) the composition says so, and
results keep the ONNX dtype through `Traced`, so the model returns them as integers.
"""
from __future__ import annotations

import math

import numpy as np

from .. import tensor as lt
from ..errors import ShapeError, UnsupportedError
from .registry import dtype_of, is_float, known_dims, op, shape_of

BOOL = np.dtype(np.bool_)


# -- helpers -----------------------------------------------------------------------------------------
def _same(ctx, x, tensor):
    """A result with the dtype of input x."""
    return ctx.traced(tensor, dtype_of(x))


def _unary(name, fn, result_dtype=None):
    def build(ctx, x):
        return ctx.traced(fn(ctx.tensor(x)), result_dtype or dtype_of(x))
    op(name)(build)


def _binary(name, fn, result_dtype=None):
    def build(ctx, a, b):
        return ctx.traced(fn(ctx.tensor(a), ctx.tensor(b)), result_dtype or dtype_of(a))
    op(name)(build)


def _integer_valued(dtype) -> bool:
    return np.dtype(dtype).kind in "iub"


# -- arithmetic --------------------------------------------------------------------------------------
_binary("Add", lambda a, b: a + b)
_binary("Sub", lambda a, b: a - b)
_binary("Mul", lambda a, b: a * b)


@op("Div")
def div(ctx, a, b):
    quotient = ctx.tensor(a) / ctx.tensor(b)
    if _integer_valued(dtype_of(a)):
        quotient = quotient.trunc()  # C integer division truncates toward zero
    return _same(ctx, a, quotient)


@op("Pow")
def pow_(ctx, base, exponent):
    if not isinstance(exponent, np.ndarray) or exponent.size != 1:
        return _same(ctx, base, ctx.tensor(base).pow(ctx.tensor(exponent)))
    # a known single exponent: luminar's power picks sqrt or repeated products where it can
    out = ctx.tensor(base).pow(float(exponent.reshape(-1)[0]))
    if exponent.ndim > out.ndim:  # a one-element exponent of higher rank still broadcasts
        out = out.reshape(*([1] * (exponent.ndim - out.ndim)), *out.dims)
    return _same(ctx, base, out)


@op("Mod")
def mod(ctx, a, b):
    x, y = ctx.tensor(a), ctx.tensor(b)
    if ctx.attr("fmod", 0):
        return _same(ctx, a, x.fmod(y))  # C fmod: the sign of the dividend
    if is_float(dtype_of(a)):
        raise UnsupportedError("Mod with fmod=0 is only defined for integers")
    return _same(ctx, a, x.remainder(y))  # Python's %: the sign of the divisor


def _variadic(name, combine, finish=None):
    def build(ctx, *values):
        values = [v for v in values if v is not None]
        if not values:
            raise ShapeError(f"{name} needs at least one input")
        out = ctx.tensor(values[0])
        for v in values[1:]:
            out = combine(out, ctx.tensor(v))
        if finish is not None:
            out = finish(out, len(values))
        if len(values) == 1:
            out = out + 0.0
        return _same(ctx, values[0], out)
    op(name)(build)


_variadic("Sum", lambda a, b: a + b)
_variadic("Mean", lambda a, b: a + b, lambda out, n: out * (1.0 / n))
_variadic("Max", lambda a, b: a.maximum(b))
_variadic("Min", lambda a, b: a.minimum(b))

_unary("Neg", lambda x: -x)
_unary("Abs", lambda x: x.abs())
_unary("Sign", lambda x: x.sign())
_unary("Reciprocal", lambda x: x.reciprocal())
_unary("Sqrt", lambda x: x.sqrt())
_unary("Exp", lambda x: x.exp())
_unary("Log", lambda x: x.log())
_unary("Floor", lambda x: x.floor())
_unary("Ceil", lambda x: x.ceil())
_unary("Round", lambda x: x.round())  # ties to even, as ONNX says
_unary("Erf", lambda x: x.erf())
_unary("Identity", lambda x: x)


# -- trigonometry and hyperbolic functions -------------------------------------------------------------
def _atan(x):
    """arctan by Cephes' atanf: reduce |x| to [0, tan(pi/8)] around 0, pi/4 or pi/2, then a polynomial.

    Each branch's argument is clamped into its own range, so the branches not taken stay finite
    (selection is arithmetic: 0 * inf would be NaN)."""
    a = x.abs()
    big = a.gt(2.414213562373095)
    mid = a.gt(0.4142135623730950) * (1.0 - big)
    small = 1.0 - big - mid
    r_big = -1.0 / a.maximum(2.414213562373095)
    am = a.minimum(2.5)
    r_mid = (am - 1.0) / (am + 1.0)
    r = big * r_big + mid * r_mid + small * a.minimum(0.5)
    z = r * r
    poly = (((8.05374449538e-2 * z - 1.38776856032e-1) * z + 1.99777106478e-1) * z - 3.33329491539e-1) * z * r + r
    return x.sign() * (big * (math.pi / 2) + mid * (math.pi / 4) + poly)


def _asin(x):
    # 2 atan(x / (1 + sqrt(1 - x^2))): the denominator is >= 1, so no division blows up at |x| = 1
    return 2.0 * _atan(x / (1.0 + (1.0 - x * x).sqrt()))


_unary("Sin", lambda x: x.sin())
_unary("Cos", lambda x: x.cos())
_unary("Tan", lambda x: x.tan())
_unary("Atan", _atan)
_unary("Asin", _asin)
_unary("Acos", lambda x: (math.pi / 2) - _asin(x))
_unary("Sinh", lambda x: (x.expm1() - (-x).expm1()) * 0.5)
_unary("Cosh", lambda x: (x.exp() + (-x).exp()) * 0.5)
_unary("Tanh", lambda x: x.tanh())
_unary("Asinh", lambda x: x.sign() * (x.abs() + x * x / (1.0 + (x * x + 1.0).sqrt())).log1p())
_unary("Acosh", lambda x: (x + (x * x - 1.0).sqrt()).log())
_unary("Atanh", lambda x: 0.5 * (2.0 * x / (1.0 - x)).log1p())


# -- activations --------------------------------------------------------------------------------------
_unary("Relu", lambda x: x.relu())
_unary("Sigmoid", lambda x: x.sigmoid())
_unary("Softsign", lambda x: x.softsign())
_unary("Mish", lambda x: x * x.softplus().tanh())
_unary("HardSwish", lambda x: x * (x * (1.0 / 6.0) + 0.5).clamp(0.0, 1.0))


@op("Softplus")
def softplus(ctx, x):
    t = ctx.tensor(x)
    # log(1 + exp(x)) = max(x, 0) + log1p(exp(-|x|)): no overflow for large x
    return _same(ctx, x, t.relu() + (-t.abs()).exp().log1p())


@op("LeakyRelu")
def leaky_relu(ctx, x):
    return _same(ctx, x, ctx.tensor(x).leaky_relu(ctx.attr("alpha", 0.01)))


@op("PRelu")
def prelu(ctx, x, slope):
    t, s = ctx.tensor(x), ctx.tensor(slope)
    return _same(ctx, x, t.relu() + s * t.minimum(0.0))


@op("Elu")
def elu(ctx, x):
    return _same(ctx, x, ctx.tensor(x).elu(ctx.attr("alpha", 1.0)))


@op("Celu")
def celu(ctx, x):
    return _same(ctx, x, ctx.tensor(x).celu(ctx.attr("alpha", 1.0)))


@op("Selu")
def selu(ctx, x):
    alpha = ctx.attr("alpha", 1.67326319217681884765625)
    gamma = ctx.attr("gamma", 1.05070102214813232421875)
    return _same(ctx, x, gamma * ctx.tensor(x).elu(alpha))


@op("HardSigmoid")
def hard_sigmoid(ctx, x):
    alpha, beta = ctx.attr("alpha", 0.2), ctx.attr("beta", 0.5)
    return _same(ctx, x, (ctx.tensor(x) * alpha + beta).clamp(0.0, 1.0))


@op("ThresholdedRelu")
def thresholded_relu(ctx, x):
    t = ctx.tensor(x)
    return _same(ctx, x, t * t.gt(ctx.attr("alpha", 1.0)))


@op("Shrink")
def shrink(ctx, x):
    t, bias, lambd = ctx.tensor(x), ctx.attr("bias", 0.0), ctx.attr("lambd", 0.5)
    return _same(ctx, x, t.lt(-lambd) * (t + bias) + t.gt(lambd) * (t - bias))


@op("Gelu")
def gelu(ctx, x):
    approximate = ctx.attr("approximate", "none")
    return _same(ctx, x, ctx.tensor(x).gelu(approximate=approximate))


@op("Clip")
def clip(ctx, x, low=None, high=None):
    if ctx.opset < 11:
        low, high = ctx.attr("min"), ctx.attr("max")
        low = None if low is None or low <= -3.4e38 else low
        high = None if high is None or high >= 3.4e38 else high
    t = ctx.tensor(x)
    if low is not None:
        t = t.maximum(ctx.tensor(low) if not isinstance(low, float) else low)
    if high is not None:
        t = t.minimum(ctx.tensor(high) if not isinstance(high, float) else high)
    return _same(ctx, x, t + 0.0 if low is None and high is None else t)


# -- comparisons and logic ---------------------------------------------------------------------------
_binary("Equal", lambda a, b: a.eq(b), BOOL)
_binary("Less", lambda a, b: a.lt(b), BOOL)
_binary("Greater", lambda a, b: a.gt(b), BOOL)
_binary("LessOrEqual", lambda a, b: a.le(b), BOOL)
_binary("GreaterOrEqual", lambda a, b: a.ge(b), BOOL)
_binary("And", lambda a, b: a.logical_and(b), BOOL)
_binary("Or", lambda a, b: a.logical_or(b), BOOL)
_binary("Xor", lambda a, b: a.logical_xor(b), BOOL)
_unary("Not", lambda x: x.logical_not(), BOOL)
_unary("IsNaN", lambda x: x.isnan(), BOOL)


@op("IsInf")
def is_inf(ctx, x):
    t = ctx.tensor(x)
    inf = t.isinf()
    if not ctx.attr("detect_negative", 1):
        inf = inf * t.gt(0.0)
    if not ctx.attr("detect_positive", 1):
        inf = inf * t.lt(0.0)
    return ctx.traced(inf, BOOL)


def _all_infinite(value, sign) -> bool:
    return isinstance(value, np.ndarray) and value.size > 0 and value.dtype.kind == "f" and \
        bool(np.all(np.isinf(value) & (np.sign(value) == sign)))


@op("Where")
def where(ctx, condition, a, b):
    cond = ctx.tensor(condition).ne(0.0)
    # Selection is arithmetic (c * a + (1 - c) * b), so an infinite branch would give 0 * inf = NaN;
    # masks that select -inf or +inf are common, and log2 of the 0/1 condition selects them exactly.
    shape = lt.broadcast_shapes(cond.dims, tuple(shape_of(a)), tuple(shape_of(b)))
    for sign in (-1, 1):
        if _all_infinite(b, sign):
            return ctx.traced((ctx.tensor(a) + (-sign) * cond.log2()).broadcast_to(shape), dtype_of(a))
        if _all_infinite(a, sign):
            return ctx.traced((ctx.tensor(b) + (-sign) * (1.0 - cond).log2()).broadcast_to(shape), dtype_of(b))
    return ctx.traced(lt.where(cond, ctx.tensor(a), ctx.tensor(b)), dtype_of(a))


# -- reductions ---------------------------------------------------------------------------------------
def _reduce_axes(ctx, x, axes_input, axes_from_input: bool):
    """The axes to reduce (a list; every axis when empty and noop_with_empty_axes is 0), or None for no-op."""
    rank = ctx.tensor(x).ndim
    if axes_from_input:
        axes = [] if axes_input is None else ctx.ints(axes_input, "axes", 1)
    else:
        axes = list(ctx.attr("axes", []))
    if not axes:
        if ctx.attr("noop_with_empty_axes", 0):
            return None
        return list(range(rank))
    return sorted({int(a) % max(rank, 1) for a in axes})


def _reduction(name, fn, empty=0.0, axes_input_since=18):
    def build(ctx, x, axes=None):
        t = ctx.tensor(x)
        axes = _reduce_axes(ctx, x, axes, ctx.opset >= axes_input_since)
        keep = bool(ctx.attr("keepdims", 1))
        if axes is None:
            return _same(ctx, x, t + 0.0)
        if t.ndim == 0:
            return _same(ctx, x, fn(t.reshape(1), [0], False))
        if any(t.dims[a].is_const and t.dims[a].value == 0 for a in axes):
            # an empty reduction is the operation's identity (0 for sums, -inf for max, ...)
            shape = [1 if k in axes else d for k, d in enumerate(known_dims(t.dims, name))]
            if not keep:
                shape = [d for k, d in enumerate(shape) if k not in axes]
            return _same(ctx, x, ctx.tensor(np.full(shape, empty, dtype=np.float32)))
        return _same(ctx, x, fn(t, axes, keep))
    op(name)(build)


def _logsumexp(t, axes, keep):
    m = t.amax(axes, keepdim=True)
    out = (t - m).exp().sum(axes, keepdim=True).log() + m
    return out if keep else out.squeeze(axes)


def _product(t, axes, keep):
    """prod(x) = (-1)^(negatives) * 2^(sum log2 |x|), and 0 if any factor is 0."""
    zero = t.eq(0.0).amax(axes, keepdim=keep)
    negatives = t.lt(0.0).sum(axes, keepdim=keep)
    sign = 1.0 - 2.0 * negatives.fmod(2.0)
    magnitude = (t.abs() + t.eq(0.0)).log2().sum(axes, keepdim=keep).exp2()
    return sign * magnitude * (1.0 - zero)


_reduction("ReduceSum", lambda t, axes, keep: t.sum(axes, keepdim=keep), axes_input_since=13)
_reduction("ReduceMean", lambda t, axes, keep: t.mean(axes, keepdim=keep))
_reduction("ReduceMax", lambda t, axes, keep: t.amax(axes, keepdim=keep), -np.inf)
_reduction("ReduceMin", lambda t, axes, keep: t.amin(axes, keepdim=keep), np.inf)
_reduction("ReduceProd", _product, 1.0)
_reduction("ReduceL1", lambda t, axes, keep: t.abs().sum(axes, keepdim=keep))
_reduction("ReduceL2", lambda t, axes, keep: (t * t).sum(axes, keepdim=keep).sqrt())
_reduction("ReduceSumSquare", lambda t, axes, keep: (t * t).sum(axes, keepdim=keep))
_reduction("ReduceLogSum", lambda t, axes, keep: t.sum(axes, keepdim=keep).log(), -np.inf)
_reduction("ReduceLogSumExp", _logsumexp, -np.inf)


def _arg_extreme(name, sign):
    def build(ctx, x):
        t = ctx.tensor(x) * sign
        axis = ctx.attr("axis", 0) % max(t.ndim, 1)
        keep = bool(ctx.attr("keepdims", 1))
        if ctx.attr("select_last_index", 0):
            n = t.dims[axis]
            if not n.is_const:
                raise UnsupportedError(f"{name} with select_last_index needs a known axis size")
            index = float(n.value - 1) - t.flip(axis).argmax(axis, keepdim=keep)
        else:
            index = t.argmax(axis, keepdim=keep)
        return ctx.traced(index, np.int64)
    op(name)(build)


_arg_extreme("ArgMax", 1.0)
_arg_extreme("ArgMin", -1.0)


@op("CumSum")
def cumsum(ctx, x, axis):
    t = ctx.tensor(x)
    a = ctx.ints(axis, "axis", 1)[0] % t.ndim
    if ctx.attr("reverse", 0):
        t = t.flip(a)
    out = t.cumsum(a)
    if ctx.attr("exclusive", 0):
        out = out - t
    if ctx.attr("reverse", 0):
        out = out.flip(a)
    return _same(ctx, x, out)


# -- softmax family -----------------------------------------------------------------------------------
def _softmax_like(name, fn):
    def build(ctx, x):
        t = ctx.tensor(x)
        if ctx.opset >= 13:
            return _same(ctx, x, fn(t, ctx.attr("axis", -1) % max(t.ndim, 1)))
        axis = ctx.attr("axis", 1) % max(t.ndim, 1)  # older opsets: flatten to 2-D at axis
        flat = t.reshape(math.prod(t.dims[:axis]) if axis else 1, -1)
        return _same(ctx, x, fn(flat, 1).reshape(*t.dims))
    op(name)(build)


def _hardmax(t, axis):
    """1 at the first maximum along axis, 0 elsewhere."""
    n = t.dims[axis]
    positions = t.graph.arange(n).reshape(*[n if k == axis else 1 for k in range(t.ndim)])
    return t.argmax(axis, keepdim=True).eq(positions)


_softmax_like("Softmax", lambda t, axis: t.softmax(axis))
_softmax_like("LogSoftmax", lambda t, axis: t.log_softmax(axis))
_softmax_like("Hardmax", _hardmax)


# -- matrix products ----------------------------------------------------------------------------------
@op("MatMul")
def matmul(ctx, a, b):
    return _same(ctx, a, ctx.tensor(a) @ ctx.tensor(b))


@op("Gemm")
def gemm(ctx, a, b, c=None):
    x, y = ctx.tensor(a), ctx.tensor(b)
    if ctx.attr("transA", 0):
        x = x.mT
    if ctx.attr("transB", 0):
        y = y.mT
    out = x @ y
    alpha, beta = ctx.attr("alpha", 1.0), ctx.attr("beta", 1.0)
    if alpha != 1.0:
        out = out * alpha
    if c is not None and beta != 0.0:
        bias = ctx.tensor(c)
        out = out + (bias * beta if beta != 1.0 else bias)
    return _same(ctx, a, out)


@op("Einsum")
def einsum(ctx, *operands):
    equation = ctx.attr("equation").replace(" ", "")
    tensors = [ctx.tensor(v) for v in operands]
    return _same(ctx, operands[0], einsum_tensors(equation, tensors))


def einsum_tensors(equation: str, tensors):
    """Einstein summation as a broadcast product over every letter, then a sum over the letters the
    output lacks. Each operand is permuted into the common letter order and unsqueezed where it
    lacks a letter; '...' stands for the same leading batch letters in every operand."""
    inputs, explicit, output = equation.partition("->")
    terms = inputs.split(",")
    if len(terms) != len(tensors):
        raise ShapeError(f"Einsum: equation {equation!r} has {len(terms)} operands, got {len(tensors)}")
    ellipsis_rank = max((t.ndim - len(term.replace("...", "")) for term, t in zip(terms, tensors)
                         if "..." in term), default=0)
    batch = [chr(0x100 + k) for k in range(ellipsis_rank)]  # letters no equation uses

    def letters(term, rank):
        if "..." not in term:
            return list(term)
        head, tail = term.split("...")
        own = rank - len(head) - len(tail)
        return list(head) + batch[ellipsis_rank - own:] + list(tail)

    spelled = [letters(term, t.ndim) for term, t in zip(terms, tensors)]
    for term, t in zip(spelled, tensors):
        if len(term) != t.ndim:
            raise ShapeError(f"Einsum: operand {''.join(term)!r} of equation {equation!r} has rank {t.ndim}")
        if len(set(term)) != len(term):
            raise UnsupportedError(f"Einsum: repeated index within one operand ({equation!r}) is not supported")
    if not explicit:
        counts = {}
        for term in spelled:
            for c in term:
                counts[c] = counts.get(c, 0) + 1
        out_letters = [c for c in batch] + sorted(c for c, n in counts.items() if n == 1 and c not in batch)
    else:
        out_letters = letters(output, len(batch) + len(output.replace("...", "")))
    every = list(out_letters) + [c for term in spelled for c in term if c not in out_letters]
    every = list(dict.fromkeys(every))
    product = None
    for term, t in zip(spelled, tensors):
        order = [term.index(c) for c in every if c in term]
        v = t.permute(*order) if order else t
        shape, k = [], 0
        for c in every:
            if c in term:
                shape.append(v.dims[k])
                k += 1
            else:
                shape.append(1)
        v = v.reshape(*shape)
        product = v if product is None else product * v
    reduced = [k for k, c in enumerate(every) if c not in out_letters]
    return product.sum(reduced) if reduced else product + 0.0


@op("CumProd")
def cumprod(ctx, x, axis):
    t = ctx.tensor(x)
    a = ctx.ints(axis, "axis", 1)[0] % t.ndim
    n = known_dims(t.dims[a:a + 1], "CumProd")[0]
    moved = t.transpose(a, -1)
    if ctx.attr("reverse", 0):
        moved = moved.flip(-1)
    if ctx.attr("exclusive", 0):  # shift right by one, a 1 in front
        moved = moved.narrow(-1, 0, n - 1).pad((1, 0), value=1.0)
    windows = moved.pad((n - 1, 0), value=1.0).unfold(-1, n, 1)  # (..., n, n): the prefix ending at each i
    out = _product(windows, [windows.ndim - 1], False)
    if ctx.attr("reverse", 0):
        out = out.flip(-1)
    return _same(ctx, x, out.transpose(a, -1))


@op("TopK")
def top_k(ctx, x, k):
    t = ctx.tensor(x)
    count = ctx.ints(k, "k", 1)[0]
    axis = ctx.attr("axis", -1) % t.ndim
    n = known_dims(t.dims[axis:axis + 1], "TopK")[0]
    sign = 1.0 if ctx.attr("largest", 1) else -1.0
    work = t * sign
    positions = ctx.graph.arange(n).reshape(*[n if d == axis else 1 for d in range(t.ndim)])
    values, indices = [], []
    for _ in range(count):  # pick the extreme (the lowest index among ties), then rule it out
        index = work.argmax(axis, keepdim=True)
        hot = positions.eq(index)
        values.append((hot * t).sum(axis, keepdim=True))
        indices.append(index)
        work = work * (1.0 - hot) + hot * -3.0e38
    from ..library.indexing import cat
    return _same(ctx, x, cat(values, axis)), ctx.traced(cat(indices, axis), np.int64)


@op("NegativeLogLikelihoodLoss")
def nll_loss(ctx, log_probs, target, weight=None):
    from ..library.losses import nll_loss as nll
    w = None if weight is None else ctx.tensor(weight)
    loss = nll(ctx.tensor(log_probs), ctx.tensor(target), weight=w, ignore_index=ctx.attr("ignore_index", -100),
               reduction=ctx.attr("reduction", "mean"))
    return _same(ctx, log_probs, loss)


@op("SoftmaxCrossEntropyLoss")
def softmax_cross_entropy(ctx, scores, labels, weight=None):
    from ..library.losses import nll_loss as nll
    log_probs = ctx.tensor(scores).log_softmax(1)
    w = None if weight is None else ctx.tensor(weight)
    loss = nll(log_probs, ctx.tensor(labels), weight=w, ignore_index=ctx.attr("ignore_index", -100),
               reduction=ctx.attr("reduction", "mean"))
    return _same(ctx, scores, loss), _same(ctx, scores, log_probs)


def _determinant(t, rows: list[int], cols: list[int]):
    """det of the sub-matrix (rows x cols) of t's last two dims by cofactor expansion along the first row."""
    if len(rows) == 1:
        return t.narrow(-2, rows[0], 1).narrow(-1, cols[0], 1).squeeze(-1).squeeze(-1)
    total = None
    for k, col in enumerate(cols):
        entry = t.narrow(-2, rows[0], 1).narrow(-1, col, 1).squeeze(-1).squeeze(-1)
        term = entry * _determinant(t, rows[1:], cols[:k] + cols[k + 1:])
        total = term if total is None else (total + term if k % 2 == 0 else total - term)
    return total


@op("Det")
def det(ctx, x):
    t = ctx.tensor(x)
    n = known_dims(t.dims[-1:], "Det")[0]
    if n > 5:
        raise UnsupportedError(f"Det of {n}x{n} matrices (cofactor expansion is built up to 5x5)")
    return _same(ctx, x, _determinant(t, list(range(n)), list(range(n))))


@op("Binarizer", domain="ai.onnx.ml")
def binarizer(ctx, x):
    return _same(ctx, x, ctx.tensor(x).gt(ctx.attr("threshold", 0.0)))


# -- bitwise integer ops -----------------------------------------------------------------------------
# Integers are float32 values here, exact below 2^24. A signed value is split into its low 23 bits
# (x mod 2^23, as digits) and its sign, which stands for every higher bit of the two's complement
# (true while |x| < 2^23); unsigned values use 24 digits and no sign.
_LOW_BITS = 23


def _bits(t, count):
    return [(t * (1.0 / 2 ** k)).floor().fmod(2.0) for k in range(count)]


def _bitwise(name, combine):
    def build(ctx, a, b=None):
        dtype = dtype_of(a)
        signed = dtype.kind == "i"
        count = _LOW_BITS if signed else min(dtype.itemsize * 8, 24)
        x = ctx.tensor(a)
        y = None if b is None else ctx.tensor(b)
        low = lambda t: t.remainder(float(2 ** count)) if signed else t  # noqa: E731  (floor mod: >= 0)
        xs = _bits(low(x), count)
        ys = None if y is None else _bits(low(y), count)
        out = None
        for k in range(count):
            bit = combine(xs[k], None if ys is None else ys[k])
            out = bit * float(2 ** k) if out is None else out + bit * float(2 ** k)
        if signed:
            sign = combine(x.lt(0.0), None if y is None else y.lt(0.0))
            out = out - sign * float(2 ** count)
        elif dtype.itemsize * 8 > count and b is None:  # NOT of a wide unsigned value: the high bits are set too
            raise UnsupportedError(f"{name} of {dtype} values (exact only below 2^24)")
        return _same(ctx, a, out)
    op(name)(build)


_bitwise("BitwiseAnd", lambda p, q: p * q)
_bitwise("BitwiseOr", lambda p, q: p + q - p * q)
_bitwise("BitwiseXor", lambda p, q: p + q - 2.0 * p * q)
_bitwise("BitwiseNot", lambda p, q: 1.0 - p)


@op("BitShift")
def bit_shift(ctx, x, y):
    t, amount = ctx.tensor(x), ctx.tensor(y)
    bits = dtype_of(x).itemsize * 8
    if ctx.attr("direction") == "LEFT":
        out = t * amount.exp2()
        if bits < 24:
            out = out.fmod(float(2 ** bits))  # the bits shifted out of the type are dropped
    else:
        out = (t * (-amount).exp2()).floor()
    return _same(ctx, x, out)


# -- one optimizer step (ai.onnx.preview.training), the reference's formulas -------------------------
def _groups(tensors, per_tensor: int):
    """The optimized tensors' inputs, grouped: (X1, X2, G1, G2, H1, H2) -> [(X1, G1, H1), (X2, G2, H2)]."""
    n = len(tensors) // per_tensor
    return [[tensors[k * n + i] for k in range(per_tensor)] for i in range(n)]


@op("Adagrad", domain="ai.onnx.preview.training")
def adagrad(ctx, r, t, *tensors):
    rate, step = ctx.tensor(r), ctx.tensor(t)
    norm, eps, decay = ctx.attr("norm_coefficient", 0.0), ctx.attr("epsilon", 1e-6), ctx.attr("decay_factor", 0.0)
    xs, hs = [], []
    for x, g, h in _groups(tensors, 3):
        gr = ctx.tensor(x) * norm + ctx.tensor(g)
        h_new = ctx.tensor(h) + gr * gr
        x_new = ctx.tensor(x) - rate / (1.0 + step * decay) * gr / (h_new.sqrt() + eps)
        xs.append(_same(ctx, x, x_new))
        hs.append(_same(ctx, h, h_new))
    return tuple(xs + hs)


@op("Momentum", domain="ai.onnx.preview.training")
def momentum(ctx, r, t, *tensors):
    rate, later = ctx.tensor(r), ctx.tensor(t).gt(0.0)
    norm, alpha, beta = ctx.attr("norm_coefficient"), ctx.attr("alpha"), ctx.attr("beta")
    xs, vs = [], []
    for x, g, v in _groups(tensors, 3):
        gr = ctx.tensor(x) * norm + ctx.tensor(g)
        v_new = ctx.tensor(v) * alpha + (later * beta + (1.0 - later)) * gr  # beta only after the first step
        step = gr + v_new * alpha if ctx.attr("mode") == "nesterov" else v_new
        xs.append(_same(ctx, x, ctx.tensor(x) - rate * step))
        vs.append(_same(ctx, v, v_new))
    return tuple(xs + vs)


@op("Adam", domain="ai.onnx.preview.training")
def adam(ctx, r, t, *tensors):
    rate, count = ctx.tensor(r), ctx.tensor(t)
    alpha, beta, eps = ctx.attr("alpha", 0.9), ctx.attr("beta", 0.999), ctx.attr("epsilon", 1e-6)
    norm, post = ctx.attr("norm_coefficient", 0.0), ctx.attr("norm_coefficient_post", 0.0)
    later = count.gt(0.0)
    # bias correction sqrt(1 - beta^t) / (1 - alpha^t) after the first step; t = 0 uses the rate as is
    t1 = count.maximum(1.0)
    corrected = rate * (1.0 - (t1 * math.log2(beta)).exp2()).sqrt() / (1.0 - (t1 * math.log2(alpha)).exp2())
    adjusted = later * corrected + (1.0 - later) * rate
    xs, vs, hs = [], [], []
    for x, g, v, h in _groups(tensors, 4):
        gr = ctx.tensor(x) * norm + ctx.tensor(g)
        v_new = ctx.tensor(v) * alpha + gr * (1.0 - alpha)
        h_new = ctx.tensor(h) * beta + gr * gr * (1.0 - beta)
        x_new = (ctx.tensor(x) - adjusted * (v_new / (h_new.sqrt() + eps))) * (1.0 - post)
        xs.append(_same(ctx, x, x_new))
        vs.append(_same(ctx, v, v_new))
        hs.append(_same(ctx, h, h_new))
    return tuple(xs + vs + hs)
