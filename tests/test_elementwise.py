"""Elementwise ops (library/elementwise.py) against PyTorch: same lambda, same arguments, same results.

PyTorch returns bool tensors from comparisons and logical ops; luminar returns 0.0 / 1.0 floats,
so those tests compare against the torch result cast with .float().
"""
import operator

import numpy as np
import pytest
import torch
import torch.nn.functional as F

import luminar as lm
from conftest import check, rand, run_luminar

X = rand(3, 5, seed=1, low=-3.0, high=3.0)
WIDE = rand(3, 5, seed=2, low=-8.0, high=8.0)
POSITIVE = rand(3, 5, seed=3, low=0.05, high=4.0)
ABOVE_MINUS_ONE = rand(3, 5, seed=4, low=-0.95, high=3.0)
HALF_PI = rand(3, 5, seed=5, low=-1.45, high=1.45)
STEPS = np.round(rand(3, 5, seed=6, low=-3.0, high=3.0) * 2) / 2  # multiples of 0.5: ties and zeros
SPECIAL = np.array([np.nan, np.inf, -np.inf, 0.0, -0.0, 1.0, -2.5, 3.0e38, -3.0e38, 1e-30], np.float32)
EDGES = np.array([-100, -50, -20, -5, -1e-6, 0, 1e-6, 5, 20, 50, 100], np.float32)
TINY = np.array([-0.4, -0.1, -1e-3, -1e-5, -1e-7, 1e-7, 1e-5, 1e-3, 0.1, 0.4], np.float32)


def method(name, *args, **kwargs):
    """The same method call on a GraphTensor and on a torch tensor (other tensors come first)."""
    return lambda t, *others: getattr(t, name)(*others, *args, **kwargs)


def functional(name, *args, **kwargs):
    """torch.nn.functional.NAME: a method in luminar."""
    return lambda t: getattr(F, name)(t, *args, **kwargs)


def as_float(fn):
    return lambda *t: fn(*t).float()


# name -> (luminar fn, torch fn (None: the same lambda), input, rtol)
UNARY = {
    "neg": (method("neg"), None, X, 1e-5),
    "negative": (method("negative"), None, X, 1e-5),
    "positive": (method("positive"), None, X, 1e-5),
    "unary_plus": (lambda t: +t, None, X, 1e-5),
    "abs": (method("abs"), None, X, 1e-5),
    "absolute": (method("absolute"), None, X, 1e-5),
    "abs_builtin": (abs, None, X, 1e-5),
    "sign": (method("sign"), None, STEPS, 1e-5),
    "square": (method("square"), None, X, 1e-5),
    "rsqrt": (method("rsqrt"), None, POSITIVE, 1e-5),
    "log10": (method("log10"), None, POSITIVE, 1e-5),
    "log1p": (method("log1p"), None, ABOVE_MINUS_ONE, 1e-5),
    "expm1": (method("expm1"), None, X, 1e-5),
    "cos": (method("cos"), None, WIDE, 1e-4),
    "tan": (method("tan"), None, HALF_PI, 1e-4),
    "tanh": (method("tanh"), None, X, 1e-5),
    "sigmoid": (method("sigmoid"), None, WIDE, 1e-5),
    "erf": (method("erf"), None, X, 1e-5),
    "erfc": (method("erfc"), None, X, 1e-4),
    "relu": (method("relu"), None, X, 1e-5),
    "relu6": (method("relu6"), functional("relu6"), WIDE, 1e-5),
    "leaky_relu": (method("leaky_relu"), functional("leaky_relu"), X, 1e-5),
    "leaky_relu_0.2": (method("leaky_relu", 0.2), functional("leaky_relu", 0.2), X, 1e-5),
    "elu": (method("elu"), functional("elu"), X, 1e-5),
    "elu_alpha": (method("elu", alpha=0.5), functional("elu", alpha=0.5), X, 1e-5),
    "selu": (method("selu"), functional("selu"), X, 1e-5),
    "celu": (method("celu", alpha=2.0), functional("celu", alpha=2.0), X, 1e-5),
    "gelu": (method("gelu"), functional("gelu"), X, 1e-4),
    "gelu_tanh": (method("gelu", approximate="tanh"), functional("gelu", approximate="tanh"), X, 1e-4),
    "silu": (method("silu"), functional("silu"), X, 1e-5),
    "softplus": (method("softplus"), functional("softplus"), X, 1e-5),
    "softplus_beta": (method("softplus", beta=2.0, threshold=5.0), functional("softplus", beta=2.0, threshold=5.0),
                      X, 1e-5),
    "logsigmoid": (method("logsigmoid"), functional("logsigmoid"), X, 1e-5),
    "mish": (method("mish"), functional("mish"), X, 1e-5),
    "softsign": (method("softsign"), functional("softsign"), X, 1e-5),
    "hardtanh": (method("hardtanh"), functional("hardtanh"), X, 1e-5),
    "hardtanh_range": (method("hardtanh", -2.0, 0.5), functional("hardtanh", -2.0, 0.5), X, 1e-5),
    "hardsigmoid": (method("hardsigmoid"), functional("hardsigmoid"), WIDE, 1e-5),
    "hardswish": (method("hardswish"), functional("hardswish"), WIDE, 1e-5),
    "floor": (method("floor"), None, WIDE, 1e-5),
    "ceil": (method("ceil"), None, WIDE, 1e-5),
    "trunc": (method("trunc"), None, WIDE, 1e-5),
    "fix": (method("fix"), None, WIDE, 1e-5),
    "frac": (method("frac"), None, WIDE, 1e-5),
    "round": (method("round"), None, WIDE, 1e-5),
    "round_decimals": (method("round", decimals=2), None, X, 1e-5),
    "round_negative_decimals": (method("round", decimals=-1), None, WIDE * 10, 1e-5),
    "logical_not": (method("logical_not"), as_float(method("logical_not")), STEPS, 1e-5),
    "isnan": (method("isnan"), as_float(method("isnan")), SPECIAL, 1e-5),
    "isinf": (method("isinf"), as_float(method("isinf")), SPECIAL, 1e-5),
    "isfinite": (method("isfinite"), as_float(method("isfinite")), SPECIAL, 1e-5),
}


@pytest.mark.parametrize("name", UNARY)
def test_unary_op_matches_torch(backend, name):
    fn, torch_fn, x, rtol = UNARY[name]
    check(fn, x, backend=backend, torch_fn=torch_fn, rtol=rtol)


@pytest.mark.parametrize("name", ["abs", "tanh", "gelu", "erf", "round", "hardswish"])
@pytest.mark.parametrize("view", ["transpose", "strided"])
def test_unary_op_on_non_contiguous_view(backend, name, view):
    fn, torch_fn, x, rtol = UNARY[name]
    reshape = (lambda t: t.transpose(0, 1)) if view == "transpose" else (lambda t: t[:, ::2])
    check(lambda t: fn(reshape(t)), x, backend=backend, torch_fn=lambda t: (torch_fn or fn)(reshape(t)), rtol=rtol)


@pytest.mark.parametrize("name", ["sigmoid", "gelu", "round", "expm1"])
def test_unary_op_over_symbolic_dim(backend, name):
    fn, torch_fn, x, rtol = UNARY[name]
    check(fn, x, backend=backend, torch_fn=torch_fn, rtol=rtol, symbolic={0: ("s", None)})


# Large |x| must neither overflow nor turn into NaN: exp(100) is inf in float32, and a formula
# like exp(x) / (1 + exp(x)) would give inf / inf there.
EDGE_OPS = ["sigmoid", "tanh", "softplus", "softplus_beta", "silu", "gelu", "gelu_tanh", "mish", "elu", "selu",
            "celu", "logsigmoid", "erf", "erfc", "expm1", "relu", "leaky_relu", "abs", "sign", "softsign",
            "hardswish", "hardsigmoid", "floor", "round"]


@pytest.mark.parametrize("name", EDGE_OPS)
def test_unary_op_at_large_and_tiny_values(backend, name):
    fn, torch_fn, _, rtol = UNARY[name]
    check(fn, EDGES, backend=backend, torch_fn=torch_fn, rtol=max(rtol, 1e-4))


@pytest.mark.parametrize("name", ["expm1", "log1p", "tanh", "erf", "sigmoid", "silu"])
def test_unary_op_keeps_relative_accuracy_near_zero(backend, name):
    fn, torch_fn, _, _ = UNARY[name]
    check(fn, TINY, backend=backend, torch_fn=torch_fn, rtol=2e-6, atol=0)


def test_erf_max_abs_error_is_below_1e_minus_6_on_minus_6_to_6(backend):
    grid = np.linspace(-6, 6, 24001, dtype=np.float32)
    ours = run_luminar(lambda t: t.erf(), grid, backend=backend)
    exact = torch.erf(torch.from_numpy(grid).double()).numpy()
    assert np.max(np.abs(ours - exact)) <= 1e-6


def test_erfc_keeps_relative_accuracy_in_the_tail(backend):
    grid = np.linspace(0.5, 9, 2001, dtype=np.float32)
    ours = run_luminar(lambda t: t.erfc(), grid, backend=backend)
    np.testing.assert_allclose(ours, torch.erfc(torch.from_numpy(grid).double()).numpy(), rtol=1e-4, atol=0)


def test_cos_is_accurate_for_large_angles(backend):
    angles = rand(64, seed=7, low=1e3, high=1e5)  # rotary embeddings reach such angles
    check(lambda t: t.cos(), angles, backend=backend, rtol=0, atol=2e-6)


def test_round_breaks_ties_to_even(backend):
    ties = np.array([-2.5, -1.5, -0.5, 0.5, 1.5, 2.5, 3.5, 0.49999997, 2.5000002, 8388607.5, -8388607.5], np.float32)
    check(lambda t: t.round(), ties, backend=backend)


def test_rounding_keeps_integers_and_large_values(backend):
    values = np.array([-3.0, -1.0, 0.0, 2.0, 16777216.0, -3.0e10, 1.0e30], np.float32)
    check(lambda t: (t.floor(), t.ceil(), t.trunc(), t.round()), values, backend=backend)


# -- binary ops: broadcasting (3, 1, 4) with (5, 4) -------------------------------------------------
A = rand(3, 1, 4, seed=10, low=-4.0, high=4.0)
B = rand(5, 4, seed=11, low=-3.0, high=3.0)
A_STEPS = np.round(A)  # integers, zeros and ties between A and B
B_STEPS = np.round(B)

# name -> (luminar fn, torch fn (None: the same lambda), a, b)
BINARY = {
    "maximum": (method("maximum"), None, A, B),
    "minimum": (method("minimum"), None, A, B),
    "maximum_ties": (lambda a, b: a.maximum(b), None, A_STEPS, B_STEPS),
    "sub": (lambda a, b: a.sub(b), None, A, B),
    "sub_alpha": (lambda a, b: a.sub(b, alpha=2.5), None, A, B),
    "subtract": (lambda a, b: a.subtract(b), None, A, B),
    "rsub": (lambda a, b: a.rsub(b), lambda a, b: torch.rsub(a, b), A, B),
    "rsub_alpha": (lambda a, b: a.rsub(b, alpha=-2), lambda a, b: torch.rsub(a, b, alpha=-2), A, B),
    "multiply": (lambda a, b: a.multiply(b), None, A, B),
    "div": (lambda a, b: a.div(b), None, A, B),
    "divide": (lambda a, b: a.divide(b), None, A, B),
    "true_divide": (lambda a, b: a.true_divide(b), None, A, B),
    "div_trunc": (lambda a, b: a.div(b, rounding_mode="trunc"), None, A, B),
    "div_floor": (lambda a, b: a.div(b, rounding_mode="floor"), None, A, B),
    "floor_divide": (lambda a, b: a.floor_divide(b), None, A, B),
    "floordiv_operator": (operator.floordiv, None, A, B),
    "remainder": (lambda a, b: a.remainder(b), None, A, B),
    "mod_operator": (operator.mod, None, A, B),
    "pow_operator": (operator.pow, None, A, B_STEPS),
    "lerp": (lambda a, b: a.lerp(b, 0.3), None, A, B),
    "lerp_far_end": (lambda a, b: a.lerp(b, 0.8), None, A, B),
    "lerp_tensor_weight": (lambda a, b: a.lerp(b, (b + 3.0) * 0.2), None, A, B),
    "clamp_min_tensor": (lambda a, b: a.clamp(min=b), None, A, B),
    "clamp_tensor_bounds": (lambda a, b: a.clamp(b - 1.0, b + 1.0), None, A, B),
    "logical_and": (method("logical_and"), as_float(method("logical_and")), A_STEPS, B_STEPS),
    "logical_or": (method("logical_or"), as_float(method("logical_or")), A_STEPS, B_STEPS),
    "logical_xor": (method("logical_xor"), as_float(method("logical_xor")), A_STEPS, B_STEPS),
    "lt": (operator.lt, as_float(operator.lt), A_STEPS, B_STEPS),
    "le": (operator.le, as_float(operator.le), A_STEPS, B_STEPS),
    "gt": (operator.gt, as_float(operator.gt), A_STEPS, B_STEPS),
    "ge": (operator.ge, as_float(operator.ge), A_STEPS, B_STEPS),
    "eq": (operator.eq, as_float(operator.eq), A_STEPS, B_STEPS),
    "ne": (operator.ne, as_float(operator.ne), A_STEPS, B_STEPS),
    "less": (method("less"), as_float(method("less")), A_STEPS, B_STEPS),
    "greater": (method("greater"), as_float(method("greater")), A_STEPS, B_STEPS),
    "less_equal": (method("less_equal"), as_float(method("less_equal")), A_STEPS, B_STEPS),
    "greater_equal": (method("greater_equal"), as_float(method("greater_equal")), A_STEPS, B_STEPS),
    "not_equal": (method("not_equal"), as_float(method("not_equal")), A_STEPS, B_STEPS),
    "where": (lambda a, b: lm.where(a > b, a, b * 2.0), lambda a, b: torch.where(a > b, a, b * 2.0), A, B),
}


@pytest.mark.parametrize("name", BINARY)
def test_binary_op_broadcasts_like_torch(backend, name):
    fn, torch_fn, a, b = BINARY[name]
    check(fn, a, b, backend=backend, torch_fn=torch_fn)


@pytest.mark.parametrize("name", ["maximum", "remainder", "floor_divide", "pow_operator", "lt"])
def test_binary_op_on_non_contiguous_views(backend, name):
    fn, torch_fn, a, b = BINARY[name]
    views = lambda a, b: (a.transpose(0, 2), b[::2].T)  # (4, 1, 3) with (4, 3)  # noqa: E731
    check(lambda a, b: fn(*views(a, b)), a, b, backend=backend, torch_fn=lambda a, b: (torch_fn or fn)(*views(a, b)))


@pytest.mark.parametrize("name", ["minimum", "div_floor", "pow_operator", "where"])
def test_binary_op_over_symbolic_dims(backend, name):
    fn, torch_fn, a, b = BINARY[name]
    check(fn, a, b, backend=backend, torch_fn=torch_fn, symbolic={0: ("s", None, None), 1: ("t", None)})


def test_where_with_numbers_on_either_side(backend):
    check(lambda t: (lm.where(t > 0, t, 0.0), lm.where(t <= 0.5, -1.0, t), lm.where(t, 2.0, 3)), STEPS,
          backend=backend,
          torch_fn=lambda t: (torch.where(t > 0, t, 0.0), torch.where(t <= 0.5, -1.0, t),
                              torch.where(t != 0, 2.0, 3.0)))


def test_ops_on_a_zero_dim_tensor(backend):
    check(lambda t: (t.relu(), t.clamp(max=0.0), t ** 3, t.erf(), t.maximum(t * 2.0), t // 0.3),
          np.array(-0.7, np.float32), backend=backend)


# -- Python numbers on either side ----------------------------------------------------------------
OPERATORS = {"+": operator.add, "-": operator.sub, "*": operator.mul, "/": operator.truediv,
             "**": operator.pow, "%": operator.mod, "//": operator.floordiv}
COMPARISONS = {"<": operator.lt, "<=": operator.le, ">": operator.gt, ">=": operator.ge,
               "==": operator.eq, "!=": operator.ne}


@pytest.mark.parametrize("number", [-3.0, 2, 2.5], ids=str)
@pytest.mark.parametrize("op", OPERATORS)
def test_operator_with_number_on_the_right(backend, op, number):
    check(lambda t: OPERATORS[op](t, number), X, backend=backend)


@pytest.mark.parametrize("number", [2.5, -3.0, 0.0], ids=str)
@pytest.mark.parametrize("op", OPERATORS)
def test_operator_with_number_on_the_left(backend, op, number):
    check(lambda t: OPERATORS[op](number, t), X, backend=backend)


@pytest.mark.parametrize("side", ["left", "right"])
@pytest.mark.parametrize("op", COMPARISONS)
def test_comparison_with_number(backend, op, side):
    fn = (lambda t: COMPARISONS[op](t, 0.5)) if side == "right" else (lambda t: COMPARISONS[op](0.5, t))
    check(fn, STEPS, backend=backend, torch_fn=as_float(fn))


def test_numpy_scalar_on_the_left(backend):
    check(lambda t: np.float32(2.0) * t - np.float64(1.0), X, backend=backend,
          torch_fn=lambda t: 2.0 * t - 1.0)


# -- powers -------------------------------------------------------------------------------------------
BASES = np.array([[-2.0, -1.5, -1.0, -0.5, 0.0], [0.5, 1.0, 1.5, 2.0, 3.0]], np.float32)
EXPONENTS = np.array([-3.0, -2.0, -1.5, -1.0, -0.5, 0.0, 0.5, 1.0, 2.0, 2.5, 3.0], np.float32)


@pytest.mark.parametrize("exponent", [0, 1, 2, 3, 5, -1, -2, -3, 0.5, -0.5, 1.5, -2.5, 2.0, 64, 100], ids=str)
def test_pow_with_number_exponent_handles_negative_and_zero_bases(backend, exponent):
    check(lambda t: t ** exponent, BASES, backend=backend, rtol=2e-5)


def test_pow_with_tensor_exponent_gives_real_results_for_integer_exponents(backend):
    # negative bases: real for integer exponents (negative when odd), NaN for fractional ones
    check(lambda b, e: b.pow(e), BASES.reshape(10, 1), EXPONENTS, backend=backend)


@pytest.mark.parametrize("base", [2.0, 0.5, 10.0, 1.0, 0.0, -2.0, -0.5], ids=str)
def test_number_to_the_power_of_a_tensor(backend, base):
    check(lambda e: base ** e, EXPONENTS, backend=backend, rtol=2e-5)


def test_pow_zero_is_one_everywhere(backend):
    check(lambda t: (t ** 0, t.pow(0.0)), SPECIAL, backend=backend)


def test_pow_zero_base(backend):
    zeros = np.zeros(len(EXPONENTS), np.float32)
    check(lambda b, e: b ** e, zeros, EXPONENTS, backend=backend)


# -- clamp ------------------------------------------------------------------------------------------
@pytest.mark.parametrize("bounds", [dict(min=-1.0, max=0.5), dict(min=-1.0), dict(max=0.5), dict(min=1, max=-1)],
                         ids=["both", "min", "max", "min_above_max"])
@pytest.mark.parametrize("name", ["clamp", "clip"])
def test_clamp_with_number_bounds(backend, name, bounds):
    check(method(name, **bounds), X, backend=backend)


def test_clamp_min_and_clamp_max(backend):
    check(lambda t: (t.clamp_min(0.5), t.clamp_max(-0.5)), X, backend=backend)


def test_clamp_handles_infinities_exactly_and_propagates_nan(backend):
    check(lambda t: (t.clamp(-1.0, 1.0), t.relu(), t.maximum(t * 0.5), t.minimum(-t)), SPECIAL, backend=backend)


# -- division edge cases ------------------------------------------------------------------------------
NUMERATORS = np.arange(-7, 8, dtype=np.float32).reshape(15, 1)
DIVISORS = np.array([-3.0, -2.0, -0.5, 0.5, 2.0, 3.0, 7.0], np.float32)


@pytest.mark.parametrize("name", ["floor_divide", "div_trunc", "div_floor", "remainder"])
def test_integer_valued_division_is_exact(backend, name):
    fn, torch_fn, _, _ = BINARY[name]
    check(fn, NUMERATORS, DIVISORS, backend=backend, rtol=0, atol=0)


@pytest.mark.parametrize("name", ["floor_divide", "div_trunc", "div_floor", "remainder", "div"])
def test_division_by_zero_gives_torch_infinities_and_nan(backend, name):
    fn, torch_fn, _, _ = BINARY[name]
    check(fn, np.array([-2.0, 0.0, 3.0], np.float32), np.zeros(3, np.float32), backend=backend)


# -- top-level functions ------------------------------------------------------------------------------
# name -> args (tensors from X and B, or numbers); lm.NAME(*args) must equal torch.NAME(*args)
FUNCTION_CALLS = {
    "maximum": ("x", "y"), "minimum": ("x", "y"), "clamp": ("x", -0.5, 0.5), "clip": ("x", None, 0.5),
    "pow": ("x", 2), "pow_number_base": (2.0, "x"), "remainder": ("x", 1.5), "remainder_number_first": (5.0, "y"),
    "add": (2, "x"), "sub": (1.0, "x"), "mul": ("x", "y"), "div": ("x", "y"), "true_divide": ("x", 2.0),
    "floor_divide": ("x", "y"), "erf": ("x",), "erfc": ("x",), "expm1": ("x",), "log1p": ("y",), "exp": ("x",),
    "exp2": ("x",), "log": ("y",), "log2": ("y",), "log10": ("y",), "sqrt": ("y",), "rsqrt": ("y",), "sin": ("x",),
    "cos": ("x",), "tan": ("x",), "tanh": ("x",), "sigmoid": ("x",), "relu": ("x",), "abs": ("x",), "sign": ("x",),
    "neg": ("x",), "square": ("x",), "reciprocal": ("y",), "floor": ("x",), "ceil": ("x",), "trunc": ("x",),
    "round": ("x",), "frac": ("x",), "fmod": ("x", 1.5), "lerp": ("x", "y", 0.25),
}


@pytest.mark.parametrize("call", FUNCTION_CALLS)
def test_top_level_function_matches_torch(backend, call):
    name = call.removesuffix("_number_base").removesuffix("_number_first")
    args = FUNCTION_CALLS[call]
    arrays = [X[:, :4], POSITIVE[:, :4]]

    def bind(module, x, y):
        return getattr(module, name)(*[{"x": x, "y": y}.get(a, a) if isinstance(a, str) else a for a in args])
    check(lambda x, y: bind(lm, x, y), *arrays, backend=backend, torch_fn=lambda x, y: bind(torch, x, y))


@pytest.mark.parametrize("name, kwargs", [("gelu", dict(approximate="tanh")), ("silu", {}), ("softplus", dict(beta=2.0)),
                                          ("leaky_relu", dict(negative_slope=0.1)), ("hardswish", {})], ids=str)
def test_top_level_activation_matches_torch_functional(backend, name, kwargs):
    check(lambda t: getattr(lm, name)(t, **kwargs), X, backend=backend,
          torch_fn=lambda t: getattr(F, name)(t, **kwargs))


# -- errors -------------------------------------------------------------------------------------------
@pytest.fixture
def x():
    return lm.Graph().tensor("x", (3, 4))


@pytest.mark.parametrize("build, message", [
    (lambda x: x.clamp(), "clamp: at least one of min and max"),
    (lambda x: lm.clip(x, None, None), "clamp: at least one of min and max"),
    (lambda x: x.gelu(approximate="bogus"), "gelu: approximate must be 'none' or 'tanh', got 'bogus'"),
    (lambda x: x.div(2.0, rounding_mode="nearest"), "div: rounding_mode must be None, 'trunc' or 'floor'"),
    (lambda x: x.round(decimals=1.5), "round: decimals must be an int, got 1.5"),
], ids=["clamp", "clip", "gelu", "div", "round"])
def test_bad_argument_values_raise_value_domain_error(x, build, message):
    with pytest.raises(lm.ValueDomainError, match=message.replace("(", r"\(")):
        build(x)


@pytest.mark.parametrize("build", [
    lambda x: x + "a", lambda x: "a" - x, lambda x: x * [1, 2], lambda x: x ** "2", lambda x: "2" ** x,
    lambda x: x % "a", lambda x: None // x, lambda x: lm.maximum(x, "a"), lambda x: x.clamp(min="a"),
    lambda x: x.lerp("a", 0.5), lambda x: x.logical_and("a"),
], ids=["add", "rsub", "mul_list", "pow", "rpow", "mod", "rfloordiv", "maximum", "clamp", "lerp", "logical_and"])
def test_combining_with_a_non_number_raises_unsupported_error(x, build):
    with pytest.raises(lm.UnsupportedError, match="cannot combine a GraphTensor with"):
        build(x)


def test_top_level_function_needs_a_tensor():
    with pytest.raises(lm.UnsupportedError, match="pow: at least one argument must be a GraphTensor"):
        lm.pow(2.0, 3.0)


def test_binary_op_with_incompatible_shapes_raises_shape_error(x):
    y = x.graph.tensor("y", (5, 4))
    with pytest.raises(lm.ShapeError, match="cannot be broadcast"):
        x.maximum(y)
