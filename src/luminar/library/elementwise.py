"""Elementwise ops: arithmetic, powers, rounding, logic, transcendental functions and activations.

Everything here is composed of the primitives through GraphTensor's methods, with PyTorch's
names and semantics. Three ideas recur:

- ``maximum(a, b)`` is a ``max_reduce`` over the pair stacked on a new axis. It is exact for
  every value, infinities included; an arithmetic blend built on ``less_than`` is not, because
  the branch not taken is multiplied by 0 and ``0 * inf = NaN`` (``relu(-inf)`` would be NaN,
  ``clamp(inf, max=1e4)`` too).
- Branchy formulas select with ``_select`` (a 0/1 blend). For the same reason the branch not
  taken must stay finite, so each branch's input is clamped into the range where it is used.
- Where cancellation would cost accuracy near 0 (expm1, log1p, tanh, erf), a series takes over
  for |x| < 0.5, so relative accuracy holds for tiny arguments too. Series, unlike rounding
  tricks such as ``(1 + x) - 1``, survive algebraic rewriting by the compiler.
"""
import math

import numpy as np

from ..errors import UnsupportedError, ValueDomainError
from ..tensor import GraphTensor, broadcast_shapes, is_int


def _number(value) -> float | None:
    """`value` as a float when it is a Python/numpy number (or a 0-d array), else None."""
    if isinstance(value, (bool, int, float, np.number)) or (isinstance(value, np.ndarray) and value.ndim == 0):
        return float(value)
    return None


def _select(condition, if_true, if_false):
    """`if_true` where `condition` (0/1 floats) is 1, else `if_false`.

    An infinity in the branch taken survives (1 * inf + 0 * finite); the branch not taken must be
    finite. (Core `where` is the same blend, after turning its condition into 0/1 with ne(0).)
    """
    return condition * if_true + (1.0 - condition) * if_false


def _polynomial(x, coefficients):
    """sum(c * x**k) by Horner's rule; `coefficients` from the highest power down."""
    result = x * coefficients[0] + coefficients[1]
    for c in coefficients[2:]:
        result = result * x + c
    return result


# -- signs, extremes, clamping -------------------------------------------------------------------
def sign(input):
    """torch.sign: -1, 0 or 1."""
    return input.gt(0.0) - input.lt(0.0)


def absolute(input):
    """torch.abs: x * sign(x), exact for infinities and NaN-propagating, all elementwise."""
    return input * sign(input)


def maximum(input, other):
    """torch.maximum (broadcasting): a max_reduce over the pair, exact for every value; NaN
    propagates (as max_reduce's does), like torch."""
    other = input._lift(other)
    shape = broadcast_shapes(input.dims, other.dims)
    # [a, 0] + [0, b] stacks the pair on a new last axis without copying either operand
    pair = input.broadcast_to(shape).unsqueeze(-1).pad((0, 1)) + other.broadcast_to(shape).unsqueeze(-1).pad((1, 0))
    return pair.amax(-1)


def minimum(input, other):
    """torch.minimum (broadcasting): -maximum(-a, -b), exact because negation is."""
    return -maximum(-input, -input._lift(other))


def clamp(input, min=None, max=None):
    """torch.clamp / clip: min and max are numbers or tensors (broadcast); where min > max the
    result is max, as in PyTorch."""
    if min is None and max is None:
        raise ValueDomainError("clamp: at least one of min and max must be given, got min=None and max=None")
    out = input if min is None else maximum(input, min)
    return out if max is None else minimum(out, max)


def clamp_min(input, min): return maximum(input, min)
def clamp_max(input, max): return minimum(input, max)


# -- arithmetic --------------------------------------------------------------------------------------
def sub(input, other, alpha=1):
    """torch.sub: input - alpha * other."""
    return input - (other if alpha == 1 else input._lift(other) * alpha)


def rsub(input, other, alpha=1):
    """torch.rsub: other - alpha * input."""
    return sub(input._lift(other), input, alpha)


def positive(input): return input


def square(input): return input * input


def _signs_differ(remainder, divisor):
    """1 where the remainder is non-zero and its sign differs from the divisor's."""
    return remainder.lt(0.0) * divisor.gt(0.0) + remainder.gt(0.0) * divisor.lt(0.0)


def remainder(input, other):
    """torch.remainder and %: Python's modulo, the result takes the divisor's sign."""
    other = input._lift(other)
    mod = input.fmod(other)
    return mod + _signs_differ(mod, other) * other


def _nearest_integer(x):
    """Round a value known to be within an ulp or so of an integer (PyTorch's floor + 0.5 test)."""
    down = floor(x)
    return down + (x - down).gt(0.5)


def _divide_by_nonzero(input, other, quotient):
    """quotient(a, b) where b != 0; a / b (±inf, NaN for 0 / 0) where b == 0, as PyTorch gives."""
    b = _number(other)
    other = input._lift(other)
    if b is not None and b != 0:
        return quotient(input, other)
    zero = other.eq(0.0)
    # the mask multiplies recip(b) before a does, so a large a/b elsewhere cannot become 0 * inf
    at_zero = input * (zero * other.reciprocal())
    return at_zero + (1.0 - zero) * quotient(input, other + zero)


def _floor_quotient(a, b):
    mod = a.fmod(b)  # exact, so (a - mod) / b is an integer up to the division's rounding
    return _nearest_integer((a - mod) / b) - _signs_differ(mod, b)


def _trunc_quotient(a, b):
    return _nearest_integer((a - a.fmod(b)) / b)


def floor_divide(input, other):
    """torch.floor_divide and //: the quotient rounded down, from the exact remainder as PyTorch does."""
    return _divide_by_nonzero(input, other, _floor_quotient)


def div(input, other, rounding_mode=None):
    """torch.div: true division, or the quotient rounded toward zero ('trunc') or down ('floor').

    Deviation: 'trunc' truncates the exact quotient; PyTorch truncates the rounded a / b, which
    differs only when a / b rounds up to an integer (|a / b| within half an ulp below it).
    """
    if rounding_mode is None:
        return input / other
    if rounding_mode == "trunc":
        return _divide_by_nonzero(input, other, _trunc_quotient)
    if rounding_mode == "floor":
        return floor_divide(input, other)
    raise ValueDomainError(f"div: rounding_mode must be None, 'trunc' or 'floor', got {rounding_mode!r}")


def true_divide(input, other): return input / other


def lerp(input, end, weight):
    """torch.lerp: input + weight * (end - input), from the nearer end like PyTorch for accuracy."""
    end = input._lift(end)
    diff = end - input
    w = _number(weight)
    if w is not None:
        return input + w * diff if abs(w) < 0.5 else end - diff * (1.0 - w)
    weight = input._lift(weight)
    return _select(absolute(weight).lt(0.5), input + weight * diff, end - diff * (1.0 - weight))


# -- powers ------------------------------------------------------------------------------------------
def _integer_power(input, n: int):
    """x ** n by repeated squaring (x * x * x for 3, as PyTorch); 1 / x ** |n| for negative n."""
    if n == 0:
        return input.graph.constant(1.0, input.dims)  # x ** 0 is 1 everywhere, NaN included
    result, square_k, k = None, input, abs(n)
    while k:
        if k & 1:
            result = square_k if result is None else result * square_k
        k >>= 1
        if k:  # a higher bit is left
            square_k = square_k * square_k
    return result.reciprocal() if n < 0 else result


def _tensor_power(base, exponent):
    """base ** exponent as exp2(exponent * log2|base|), with PyTorch's signs and special cases:
    a negative base gives a real result for an integer exponent (negative when it is odd) and
    NaN for a fractional one; 0 ** 0 = 1; 0 ** positive = 0; 0 ** negative = inf."""
    integer = exponent.fmod(1.0).eq(0.0)
    odd = absolute(exponent.fmod(2.0)).eq(1.0)
    negative = base.lt(0.0)
    # |base| for integer exponents; with a fractional one a negative base stays negative so log2 gives NaN
    magnitude = base * (1.0 - 2.0 * negative * integer)
    magnitude = magnitude + magnitude.eq(0.0) * exponent.eq(0.0)  # 0 ** 0: log2(1) * 0 = 0, not 0 * -inf
    return (exponent * magnitude.log2()).exp2() * (1.0 - 2.0 * negative * odd)


def power(input, exponent):
    """torch.pow and **, with the sign rules of `_tensor_power`. A number exponent uses sqrt/rsqrt
    for ±0.5 and repeated multiplication for integers up to 64 (PyTorch's rounding for 2 and 3);
    other numbers go through exp2(e * log2 x), with |x| and a sign fix for large integers."""
    e = _number(exponent)
    if e is None:
        return _tensor_power(input, input._lift(exponent))
    if e == 0.5:
        return input.sqrt()
    if e == -0.5:
        return rsqrt(input)
    if e.is_integer() and abs(e) <= 64:
        return _integer_power(input, int(e))
    if e.is_integer():
        magnitude = (absolute(input).log2() * e).exp2()
        return magnitude * (1.0 - 2.0 * input.lt(0.0)) if e % 2 else magnitude
    return (input.log2() * e).exp2()  # log2 of a negative base is NaN, as torch gives


def _reflected_power(exponent, base):
    """number ** tensor; a positive base is exp2(e * log2(base)) with log2(base) computed exactly."""
    b = _number(base)
    if b is not None and b > 0:
        return (exponent * math.log2(b)).exp2()
    return _tensor_power(exponent._lift(base), exponent)


# -- exponentials and logarithms -------------------------------------------------------------------
def rsqrt(input): return input.sqrt().reciprocal()


def log10(input): return input.log2() * math.log10(2.0)


# Maclaurin series for |x| < 0.5, where exp(x) - 1 and log(1 + x) would cancel. (The classic
# rounding tricks, Kahan's (u - 1) * x / log(u) and Goldberg's, do not survive compilers that
# re-associate (1 + x) - 1 into x, as the constant-folding pass and -ffast-math both do.)
_SERIES_LIMIT = 0.5
_EXPM1_SERIES = tuple(1 / math.factorial(k) for k in reversed(range(1, 11)))  # expm1(x) = x * sum x^(k-1) / k!
_LOG1P_SERIES = tuple(2 / (2 * k + 1) for k in reversed(range(8)))  # log1p(x) = sum 2 s^(2k+1) / (2k+1), s = x / (2 + x)


def _near_zero(input):
    """(use, x): 1 where |x| < 0.5, and x clamped there, so a series on it is finite everywhere."""
    return absolute(input).lt(_SERIES_LIMIT), clamp(input, -_SERIES_LIMIT, _SERIES_LIMIT)


def expm1(input):
    """torch.expm1: exp(x) - 1, from its series near 0 (relative accuracy for tiny x)."""
    use, x = _near_zero(input)
    return _select(use, x * _polynomial(x, _EXPM1_SERIES), input.exp() - 1.0)


def log1p(input):
    """torch.log1p: log(1 + x), near 0 as 2 atanh(x / (2 + x)) by its series (relative accuracy)."""
    use, x = _near_zero(input)
    s = x / (x + 2.0)
    return _select(use, s * _polynomial(s * s, _LOG1P_SERIES), (input + 1.0).log())


# -- trigonometric and hyperbolic ------------------------------------------------------------------
def cos(input):
    """torch.cos as 1 - 2 sin²(x/2): no rounding of the argument (sin(x + pi/2) loses ~ulp(x),
    which matters for large angles such as rotary position embeddings)."""
    s = (input * 0.5).sin()
    return 1.0 - 2.0 * s * s


def tan(input): return input.sin() / cos(input)


def tanh(input):
    """torch.tanh: sign(x) * -m / (2 + m) with m = expm1(-2|x|) in (-1, 0]: no overflow for any x
    and accurate near 0."""
    m = expm1(absolute(input) * -2.0)
    return sign(input) * (-m / (m + 2.0))


def sigmoid(input):
    """torch.sigmoid: 1 / (1 + exp(-x)); exp overflowing to inf gives exactly 0, never NaN."""
    return (1.0 + (-input).exp()).reciprocal()


# -- error function --------------------------------------------------------------------------------
# Numerical Recipes' erfcc: erfc(a) = t * exp(-a² + P(t)), t = 1 / (1 + a/2), a >= 0,
# fractional error below 1.2e-7 everywhere.
_ERFC_COEFFICIENTS = (0.17087277, -0.82215223, 1.48851587, -1.13520398, 0.27886807,
                      -0.18628806, 0.09678418, 0.37409196, 1.00002368, -1.26551223)
# Maclaurin series erf(x) = 2/sqrt(pi) * sum (-1)^n x^(2n+1) / (n! (2n+1)), in powers of x², for |x| < 0.5
_ERF_SERIES = tuple(2 / math.sqrt(math.pi) * (-1) ** n / (math.factorial(n) * (2 * n + 1)) for n in reversed(range(8)))


def _erfc_nonnegative(a):
    t = 1.0 / (1.0 + 0.5 * a)
    return t * (_polynomial(t, _ERFC_COEFFICIENTS) - a * a).exp()


def _erf_near_zero(input):
    """(use, series): 1 where |x| < 0.5, and erf's series there (finite everywhere)."""
    use, x = _near_zero(input)
    return use, x * _polynomial(x * x, _ERF_SERIES)


def erf(input):
    """torch.erf: a series near 0 (relative accuracy), 1 - erfc elsewhere; max abs error ~1e-7."""
    use, series = _erf_near_zero(input)
    return _select(use, series, sign(input) * (1.0 - _erfc_nonnegative(absolute(input))))


def _erfc_everywhere(input):
    """erfc from the tail formula alone (erfc(-a) = 2 - erfc(a)): fractional error ~1.2e-7 for every
    x, but near 0 that is an absolute error in erf, hence erf's and erfc's series there. GELU needs
    erfc only near 1 and beyond, where this is as accurate, at half the ops (and half the backward)."""
    tail = _erfc_nonnegative(absolute(input))
    return tail + input.lt(0.0) * (2.0 - 2.0 * tail)


def erfc(input):
    """torch.erfc: relative accuracy in the tail too (erfc(5) = 1.5e-12 is not 1 - erf(5))."""
    use, series = _erf_near_zero(input)
    return _select(use, 1.0 - series, _erfc_everywhere(input))


# -- activations -----------------------------------------------------------------------------------
def relu(input): return maximum(input, 0.0)


def relu6(input): return hardtanh(input, 0.0, 6.0)


def leaky_relu(input, negative_slope=0.01):
    """F.leaky_relu: x for x > 0, negative_slope * x otherwise."""
    return maximum(input, 0.0) + negative_slope * minimum(input, 0.0)


def elu(input, alpha=1.0):
    """F.elu: x for x > 0, alpha * (exp(x) - 1) otherwise."""
    return maximum(input, 0.0) + alpha * expm1(minimum(input, 0.0))


_SELU_ALPHA = 1.6732632423543772848170429916717
_SELU_SCALE = 1.0507009873554804934193349852946


def selu(input): return _SELU_SCALE * elu(input, _SELU_ALPHA)


def celu(input, alpha=1.0):
    """F.celu: max(0, x) + min(0, alpha * (exp(x / alpha) - 1))."""
    return maximum(input, 0.0) + alpha * expm1(minimum(input, 0.0) / alpha)


def gelu(input, approximate="none"):
    """F.gelu: x * Phi(x) with the exact normal CDF ('none'), or the tanh approximation ('tanh').

    'none' uses 0.5 * x * erfc(-x / sqrt(2)), accurate in the far negative tail too; erfc comes from
    its tail formula alone (no series branch, so a cheaper forward and backward: _erfc_everywhere).
    'tanh' uses 0.5 * (1 + tanh(z)) = sigmoid(2z), the same function without cancellation.
    """
    if approximate == "none":
        return 0.5 * input * _erfc_everywhere(input * -math.sqrt(0.5))
    if approximate == "tanh":
        inner = math.sqrt(2.0 / math.pi) * (input + 0.044715 * input * input * input)
        return input * sigmoid(2.0 * inner)
    raise ValueDomainError(f"gelu: approximate must be 'none' or 'tanh', got {approximate!r}")


def silu(input): return input * sigmoid(input)


def softplus(input, beta=1.0, threshold=20.0):
    """F.softplus: log(1 + exp(beta * x)) / beta, and x itself where beta * x > threshold.

    The smooth part is computed as (max(z, 0) + log1p(exp(-|z|))) / beta, finite for every x.
    """
    z = input * beta
    smooth = (maximum(z, 0.0) + log1p((-absolute(z)).exp())) / beta
    return _select(z.gt(threshold), input, smooth)


def logsigmoid(input):
    """F.logsigmoid: min(x, 0) - log1p(exp(-|x|)), as PyTorch computes it."""
    return minimum(input, 0.0) - log1p((-absolute(input)).exp())


def mish(input): return input * tanh(softplus(input))


def softsign(input): return input / (1.0 + absolute(input))


def hardtanh(input, min_val=-1.0, max_val=1.0): return clamp(input, min_val, max_val)


def hardsigmoid(input):
    """F.hardsigmoid: min(max(x + 3, 0), 6) / 6."""
    return clamp(input + 3.0, 0.0, 6.0) / 6.0


def hardswish(input):
    """F.hardswish: x * min(max(x + 3, 0), 6) / 6."""
    return input * clamp(input + 3.0, 0.0, 6.0) / 6.0


# -- rounding ----------------------------------------------------------------------------------------
def frac(input):
    """torch.frac: x - trunc(x), which is exactly fmod(x, 1)."""
    return input.fmod(1.0)


def trunc(input):
    """torch.trunc: x - fmod(x, 1) (exact: the difference is an integer that is representable)."""
    return input - input.fmod(1.0)


def floor(input):
    t = trunc(input)
    return t - t.gt(input)  # negative non-integers truncate up


def ceil(input):
    t = trunc(input)
    return t + t.lt(input)  # positive non-integers truncate down


def round_half_even(input, decimals=0):
    """torch.round: to the nearest integer, ties to even; with `decimals`, round(x * 10^d) / 10^d.

    Decided from the exact fraction fmod(x, 1), so no x + 0.5 rounding can mislead it.
    """
    if not is_int(decimals):
        raise ValueDomainError(f"round: decimals must be an int, got {decimals!r}")
    if decimals > 0:
        return round_half_even(input * 10.0 ** decimals) / 10.0 ** decimals
    if decimals < 0:
        return round_half_even(input / 10.0 ** -decimals) * 10.0 ** -decimals
    fraction = input.fmod(1.0)
    whole = input - fraction
    size = absolute(fraction)
    away = size.gt(0.5) + size.eq(0.5) * whole.fmod(2.0).ne(0.0)  # a tie moves off an odd integer
    return whole + sign(fraction) * away


# -- logic and classification (0.0 / 1.0 floats; PyTorch returns bool) --------------------------------
def logical_not(input): return input.eq(0.0)
def logical_and(input, other): return input.ne(0.0) * input._lift(other).ne(0.0)
def logical_or(input, other): return 1.0 - input.eq(0.0) * input._lift(other).eq(0.0)
def logical_xor(input, other): return input.ne(0.0).ne(input._lift(other).ne(0.0))


_FLOAT32_MAX = float(np.finfo(np.float32).max)


def isinf(input):
    """torch.isinf: beyond the largest finite float32 on either side (NaN compares false)."""
    return input.gt(_FLOAT32_MAX) + input.lt(-_FLOAT32_MAX)


def isnan(input):
    """torch.isnan: every other value is < 1 or > 0; NaN compares false to everything."""
    return (input.lt(1.0) + input.gt(0.0)).lt(0.5)


def isfinite(input): return 1.0 - isinf(input) - isnan(input)


# -- registration -----------------------------------------------------------------------------------
def _number_first(name, method):
    """A top-level function that, like torch.add(2, x), also takes a number as its first argument."""
    def function(input, other, *args, **kwargs):
        if not isinstance(input, GraphTensor):
            if not isinstance(other, GraphTensor):
                raise UnsupportedError(f"{name}: at least one argument must be a GraphTensor, "
                                       f"got {type(input).__name__} and {type(other).__name__}")
            input = other._lift(input)
        return method(input, other, *args, **kwargs)
    function.__name__, function.__doc__ = name, method.__doc__
    return function


METHODS = {
    "neg": GraphTensor.__neg__, "negative": GraphTensor.__neg__, "positive": positive,
    "abs": absolute, "absolute": absolute, "sign": sign, "square": square,
    "maximum": maximum, "minimum": minimum,
    "clamp": clamp, "clip": clamp, "clamp_min": clamp_min, "clamp_max": clamp_max,
    "sub": sub, "subtract": sub, "rsub": rsub, "multiply": GraphTensor.mul,
    "div": div, "divide": div, "true_divide": true_divide, "floor_divide": floor_divide,
    "remainder": remainder, "lerp": lerp, "pow": power,
    "rsqrt": rsqrt, "log10": log10, "log1p": log1p, "expm1": expm1,
    "cos": cos, "tan": tan, "tanh": tanh, "sigmoid": sigmoid, "erf": erf, "erfc": erfc,
    "relu": relu, "relu6": relu6, "leaky_relu": leaky_relu, "elu": elu, "selu": selu, "celu": celu,
    "gelu": gelu, "silu": silu, "softplus": softplus, "logsigmoid": logsigmoid, "mish": mish,
    "softsign": softsign, "hardtanh": hardtanh, "hardsigmoid": hardsigmoid, "hardswish": hardswish,
    "floor": floor, "ceil": ceil, "trunc": trunc, "fix": trunc, "frac": frac, "round": round_half_even,
    "logical_not": logical_not, "logical_and": logical_and, "logical_or": logical_or,
    "logical_xor": logical_xor, "isfinite": isfinite, "isnan": isnan, "isinf": isinf,
    "less": GraphTensor.lt, "greater": GraphTensor.gt, "less_equal": GraphTensor.le,
    "greater_equal": GraphTensor.ge, "not_equal": GraphTensor.ne,
    "__abs__": absolute, "__pos__": positive,
    "__pow__": power, "__rpow__": _reflected_power,
    "__mod__": remainder, "__rmod__": lambda input, other: remainder(input._lift(other), input),
    "__floordiv__": floor_divide, "__rfloordiv__": lambda input, other: floor_divide(input._lift(other), input),
}

# The arithmetic that PyTorch also accepts with a number first (torch.pow(2, x), torch.sub(1, x)). (The
# primitive wrappers and comparisons of tensor.py, torch.exp, torch.lt ..., are its _CORE_FUNCTIONS.)
FUNCTIONS = {name: _number_first(name, fn) for name, fn in {
    "add": GraphTensor.add, "mul": GraphTensor.mul, "multiply": GraphTensor.mul, "sub": sub, "subtract": sub,
    "div": div, "divide": div, "true_divide": true_divide, "floor_divide": floor_divide,
    "remainder": remainder, "pow": power}.items()}
