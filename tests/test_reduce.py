"""Reductions (library/reduce.py) against PyTorch: same lambda, same arguments, same results."""
import math

import numpy as np
import pytest
import torch

import luminar as lm
from conftest import check, rand, run_luminar

X = rand(3, 4, 5, seed=1)
TIES = np.array([[1, 3, 3, 0], [2, 2, 2, 2], [0, -1, 5, 5]], np.float32)  # repeated maxima and minima


# -- the dim / keepdim grid for reductions that take either an int, a tuple or None ---------
GRID_OPS = {  # name -> rtol
    "sum": 1e-5, "mean": 1e-5, "amax": 1e-5, "amin": 1e-5, "var": 1e-5, "std": 1e-5,
    "norm": 1e-5, "logsumexp": 1e-4,
}


@pytest.mark.parametrize("keepdim", [False, True])
@pytest.mark.parametrize("dim", [-1, (0, 2), (-1, 1), None], ids=str)
@pytest.mark.parametrize("name", GRID_OPS)
def test_reduction_over_dims(backend, name, dim, keepdim):
    if name == "logsumexp" and dim is None:
        pytest.skip("torch.logsumexp requires dim")
    check(lambda t: getattr(t, name)(dim=dim, keepdim=keepdim), X, backend=backend, rtol=GRID_OPS[name])


@pytest.mark.parametrize("name", ["sum", "mean", "var", "amin", "norm", "logsumexp"])
@pytest.mark.parametrize("view", ["transpose", "strided"])
def test_reduction_of_non_contiguous_view(backend, name, view):
    def fn(t):
        t = t.transpose(0, 2) if view == "transpose" else t[:, ::2]
        return getattr(t, name)(dim=(0, -1))
    check(fn, X, backend=backend, rtol=1e-4)


@pytest.mark.parametrize("fn", [
    lambda t: t.sum(0), lambda t: t.mean(0), lambda t: t.mean(), lambda t: t.mean((0, 1), keepdim=True),
    lambda t: t.var(0), lambda t: t.std(), lambda t: t.amin(0), lambda t: t.norm(dim=0),
    lambda t: t.logsumexp(0),
], ids=["sum", "mean", "mean_all", "mean_keepdim", "var", "std_all", "amin", "norm", "logsumexp"])
def test_reduction_over_symbolic_dim(backend, fn):
    check(fn, X, backend=backend, rtol=1e-4, symbolic={0: ("s", None, None)})


ZERO_DIM_OPS = {
    "sum": lambda t: t.sum(), "sum_dim": lambda t: t.sum(0), "mean": lambda t: t.mean(),
    "mean_keepdim": lambda t: t.mean(-1, keepdim=True), "amax": lambda t: t.amax(), "amin": lambda t: t.amin(0),
    "max": lambda t: t.max(), "max_dim": lambda t: t.max(0), "min_dim": lambda t: t.min(-1),
    "argmax": lambda t: t.argmax(), "argmin_dim": lambda t: t.argmin(0), "var": lambda t: t.var(),
    "std_dim": lambda t: t.std(0), "logsumexp": lambda t: t.logsumexp(0), "softmax": lambda t: t.softmax(0),
    "log_softmax": lambda t: t.log_softmax(-1), "cumsum": lambda t: t.cumsum(0), "norm": lambda t: t.norm(),
    "all": lambda t: t.all(), "any": lambda t: t.any(0), "count_nonzero": lambda t: t.count_nonzero(),
}


@pytest.mark.filterwarnings("ignore:.*degrees of freedom")
@pytest.mark.parametrize("name", ZERO_DIM_OPS)
def test_zero_dim_tensor(backend, name):
    # torch reduces a 0-d tensor to itself (var/std: NaN, since N - 1 = 0 degrees of freedom)
    check(ZERO_DIM_OPS[name], np.array(0.75, np.float32), backend=backend)


@pytest.mark.parametrize("name", ["sum", "mean"])
def test_reduction_over_empty_dim(backend, name):
    check(lambda t: getattr(t, name)(0), rand(0, 3), backend=backend)  # sum: 0, mean: NaN


# -- mean / var details ------------------------------------------------------------------------
@pytest.mark.parametrize("fn", [
    lambda t: t.var(1, unbiased=False), lambda t: t.var(1, unbiased=True), lambda t: t.var(False),
    lambda t: t.var(1, correction=0), lambda t: t.var(1, correction=2), lambda t: t.var((0, 2), correction=0.5),
    lambda t: t.std(-1, correction=0, keepdim=True), lambda t: t.var(1, False, True),
], ids=["unbiased_false", "unbiased_true", "positional_unbiased", "correction0", "correction2",
        "fractional_correction", "std_correction", "positional_keepdim"])
def test_var_correction(backend, fn):
    check(fn, X, backend=backend)


@pytest.mark.parametrize("keepdim", [False, True])
@pytest.mark.parametrize("name", ["var_mean", "std_mean"])
def test_var_mean_and_std_mean_return_pairs(backend, name, keepdim):
    check(lambda t: getattr(lm, name)(t, (0, 2), keepdim=keepdim), X, backend=backend,
          torch_fn=lambda t: getattr(torch, name)(t, (0, 2), keepdim=keepdim))


@pytest.mark.parametrize("correction", [2, 0.5])
def test_var_with_symbolic_count(backend, correction):
    check(lambda t: t.var(0, correction=correction), X, backend=backend, symbolic={0: ("s", None, None)})


@pytest.mark.filterwarnings("ignore:.*degrees of freedom")
def test_var_clamps_degrees_of_freedom_at_zero(backend):
    # N = 3, correction = 5: torch divides by max(0, N - correction) = 0, giving inf
    check(lambda t: t.var(0, correction=5), X, backend=backend)


# -- max / min / argmax / argmin -------------------------------------------------------------
@pytest.mark.parametrize("keepdim", [False, True])
@pytest.mark.parametrize("dim", [0, 1, -1])
@pytest.mark.parametrize("name", ["max", "min"])
def test_max_min_with_dim_return_values_and_first_indices(backend, name, dim, keepdim):
    result = check(lambda t: getattr(t, name)(dim, keepdim=keepdim), TIES, backend=backend)
    assert len(result) == 2


def test_max_result_is_a_named_tuple():
    g = lm.Graph()
    result = g.tensor("x", (3, 4)).max(1)
    assert result.values.shape == (3,) and result.indices.shape == (3,)
    values, indices = result
    assert values is result.values and indices is result.indices


@pytest.mark.parametrize("keepdim", [False, True])
@pytest.mark.parametrize("dim", [None, 0, 1, -1], ids=str)
@pytest.mark.parametrize("name", ["argmax", "argmin"])
def test_argmax_argmin_return_first_index_on_ties(backend, name, dim, keepdim):
    check(lambda t: getattr(t, name)(dim, keepdim=keepdim), TIES, backend=backend)


@pytest.mark.parametrize("fn", [lambda t: t.argmax(1), lambda t: t.argmin(), lambda t: t.max(0)])
def test_argmax_over_non_contiguous_view(backend, fn):
    check(lambda t: fn(t.transpose(0, 2)), X, backend=backend)


@pytest.mark.parametrize("fn", [lambda t: t.argmax(0), lambda t: t.argmin(0), lambda t: t.max(0, keepdim=True)])
def test_argmax_over_symbolic_dim(backend, fn):
    check(fn, np.tile(TIES, (2, 1)), backend=backend, symbolic={0: ("s", None)})


@pytest.mark.parametrize("name", ["max", "min"])
def test_max_min_of_two_tensors_is_elementwise_and_broadcasts(backend, name):
    check(lambda a, b: getattr(a, name)(b), rand(3, 4, seed=2), rand(4, seed=3), backend=backend)


@pytest.mark.parametrize("name", ["max", "min"])
def test_elementwise_max_min_are_exact_for_infinities(backend, name):
    a = np.array([-np.inf, 1.0, np.inf, -2.0], np.float32)
    b = np.array([0.0, np.inf, -np.inf, -np.inf], np.float32)
    check(lambda a, b: getattr(a, name)(b), a, b, backend=backend)


@pytest.mark.parametrize("name", ["max", "min"])
def test_max_min_without_dim_is_the_overall_extreme(backend, name):
    check(lambda t: getattr(t, name)(), X.transpose(1, 0, 2), backend=backend)


# -- logsumexp / softmax / log_softmax ----------------------------------------------------------
@pytest.mark.parametrize("dim", [0, 1, -1])
@pytest.mark.parametrize("name", ["softmax", "log_softmax"])
def test_softmax_family(backend, name, dim):
    check(lambda t: getattr(t, name)(dim), X, backend=backend, rtol=1e-4)


@pytest.mark.parametrize("name", ["softmax", "log_softmax", "logsumexp"])
def test_softmax_family_is_stable_for_large_inputs(backend, name):
    check(lambda t: getattr(t, name)(-1), rand(2, 6, low=500.0, high=900.0), backend=backend, rtol=1e-4)


@pytest.mark.parametrize("name", ["softmax", "log_softmax"])
def test_softmax_family_over_non_contiguous_view(backend, name):
    check(lambda t: getattr(t, name)(1)[:, ::2].transpose(0, 2), X, backend=backend, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("name", ["softmax", "log_softmax"])
def test_softmax_family_over_symbolic_dim(backend, name):
    check(lambda t: getattr(t, name)(1), X, backend=backend, rtol=1e-4, symbolic={0: (None, "s", None)})


def test_softmax_with_masked_entries(backend):
    x = rand(2, 5, seed=4)
    x[0, 1:3] = -np.inf
    check(lambda t: t.softmax(-1), x, backend=backend, rtol=1e-4)


def test_logsumexp_of_all_negative_infinity_is_negative_infinity(backend):
    x = np.full((2, 3), -np.inf, np.float32)
    x[1] = [0.5, -np.inf, 1.0]
    check(lambda t: t.logsumexp(1), x, backend=backend, rtol=1e-4)


# -- cumsum -------------------------------------------------------------------------------------
@pytest.mark.parametrize("dim", [0, 1, -1])
def test_cumsum(backend, dim):
    check(lambda t: t.cumsum(dim), X, backend=backend)


def test_cumsum_over_non_contiguous_view(backend):
    check(lambda t: t.transpose(0, 2)[::2].cumsum(1), X, backend=backend)


@pytest.mark.parametrize("dim", [0, 1])
def test_cumsum_over_symbolic_dim(backend, dim):
    check(lambda t: t.cumsum(dim), X, backend=backend, symbolic={0: ("s", None, None)})


def test_cumsum_keeps_infinities(backend):
    check(lambda t: t.cumsum(0), np.array([1.0, np.inf, 2.0, -3.0], np.float32), backend=backend)


# -- all / any / count_nonzero / norm ------------------------------------------------------------
SPARSE = np.array([[0, 1, 2], [0, 0, 0], [3, -1, 0.5], [2, 2, 2]], np.float32)


@pytest.mark.parametrize("dim", [None, 0, 1, (0, 1)], ids=str)
@pytest.mark.parametrize("name", ["all", "any", "count_nonzero"])
def test_logical_reductions_return_zero_one_floats(backend, name, dim):
    kwargs = {} if dim is None else {"dim": dim}  # torch.count_nonzero has no dim=None
    check(lambda t: getattr(t, name)(**kwargs), SPARSE, backend=backend)


@pytest.mark.parametrize("p", [1, 2, "fro", 3, 0.5, 0, math.inf, -math.inf], ids=str)
def test_norm_orders(backend, p):
    check(lambda t: t.norm(p, dim=1), SPARSE, backend=backend, rtol=1e-4)


def test_norm_over_symbolic_dim(backend):
    check(lambda t: t.norm(1, dim=0, keepdim=True), X, backend=backend, symbolic={0: ("s", None, None)})


# -- torch-style top-level functions --------------------------------------------------------------
@pytest.mark.parametrize("name, args", [
    ("sum", (1,)), ("amax", (1,)), ("mean", (1,)), ("amin", (0,)), ("var", (1,)), ("std", (1,)),
    ("max", (1,)), ("min", (0,)), ("argmax", (1,)), ("argmin", ()), ("logsumexp", (1,)),
    ("softmax", (1,)), ("log_softmax", (0,)), ("cumsum", (1,)), ("norm", ()), ("count_nonzero", (1,)),
])
def test_top_level_function(backend, name, args):
    check(lambda t: getattr(lm, name)(t, *args), X, backend=backend, rtol=1e-4,
          torch_fn=lambda t: getattr(torch, name)(t, *args))


def test_top_level_max_of_two_tensors(backend):
    check(lambda a, b: lm.max(a, b), rand(3, 4, seed=5), rand(3, 4, seed=6), backend=backend,
          torch_fn=torch.max)


def test_indices_are_float32_arrays():
    out = run_luminar(lambda t: t.argmax(1), TIES)
    assert out.dtype == np.float32
    np.testing.assert_array_equal(out, [1, 0, 2])


# -- errors ---------------------------------------------------------------------------------------
def _x():
    return lm.Graph().tensor("x", (3, 4))


@pytest.mark.parametrize("name", ["mean", "var", "std", "var_mean", "amin", "logsumexp", "norm", "all", "any",
                                  "count_nonzero", "argmax", "max", "min", "softmax", "log_softmax", "cumsum"])
def test_dim_out_of_range_names_op_dim_and_rank(name):
    with pytest.raises(lm.ShapeError, match=rf"{name}: dim 2 is out of range for a tensor of rank 2"):
        getattr(_x(), name)(dim=2)


@pytest.mark.parametrize("name", ["softmax", "log_softmax", "cumsum"])
def test_softmax_and_cumsum_require_dim(name):
    with pytest.raises(lm.ShapeError, match=rf"{name}: dim is required"):
        getattr(_x(), name)()


@pytest.mark.parametrize("name", ["softmax", "cumsum"])
def test_single_dim_ops_reject_tuples(name):
    with pytest.raises(lm.ShapeError, match=rf"{name}: dim must be a single int, got \(0, 1\)"):
        getattr(_x(), name)((0, 1))


def test_repeated_dim_is_rejected():
    with pytest.raises(lm.ShapeError, match=r"mean: a dim appears more than once in \(1, -1\)"):
        _x().mean((1, -1))


def test_non_integer_dim_is_rejected():
    with pytest.raises(lm.ShapeError, match=r"var: dim must be an int, got 0.5"):
        _x().var(0.5)


def test_var_rejects_unbiased_and_correction_together():
    with pytest.raises(lm.ValueDomainError, match="var: pass unbiased or correction, not both"):
        _x().var(1, unbiased=True, correction=1)


@pytest.mark.parametrize("name", ["max", "min"])
def test_max_min_keepdim_needs_dim(name):
    with pytest.raises(lm.ShapeError, match=rf"{name}: keepdim=True needs a dim"):
        getattr(_x(), name)(keepdim=True)


@pytest.mark.parametrize("fn", [lambda t: t.argmax(0), lambda t: t.max(0), lambda t: t.amin(0), lambda t: t.max()])
def test_max_like_reductions_over_an_empty_dim_are_rejected(fn):
    with pytest.raises(lm.ShapeError, match="expected reduction dim 0 to have non-zero size"):
        fn(lm.Graph().tensor("x", (0, 3)))


def test_norm_rejects_nuclear_norm():
    with pytest.raises(lm.UnsupportedError, match="norm: p must be 'fro' or a number, got 'nuc'"):
        _x().norm("nuc")


def test_adjacent_reduced_axes_become_one_reduction():
    """sum over adjacent axes of a contiguous tensor is one long reduction (a view merges them),
    not nested short ones; where a view cannot merge them (after a permute) each axis reduces alone."""
    g = lm.Graph()
    x = g.tensor("x", (2, 3, 4, 5))
    x.sum((0, 1)).output("a")
    x.permute(0, 2, 1, 3).sum((1, 2)).output("b")
    reductions = [n.shape for n in g.nodes if n.op == "sum_reduce"]
    assert reductions[0] == tuple(map(lm.sym, (4, 5)))  # (2*3, 4, 5) summed over its first axis
    assert len(reductions) == 3
    a = rand(2, 3, 4, 5)
    out = g.compile("reference")(x=a)
    np.testing.assert_allclose(out["a"], a.sum((0, 1)), rtol=1e-5)
    np.testing.assert_allclose(out["b"], a.transpose(0, 2, 1, 3).sum((1, 2)), rtol=1e-5)


def test_merged_axes_below_other_reduced_axes_keep_the_shape():
    """Merging two adjacent reduced axes shifts the reduced axes above them down by one (a sum
    over (1, 2, 4) of a 5-D tensor once reduced a stale axis 4 and kept the last dim)."""
    g = lm.Graph()
    x = g.tensor("x", (2, 3, 4, 5, 6))
    y = x.sum((1, 2, 4))
    assert y.shape == (2, 5)
    y.output("y")
    x.sum((0, 1, 3, 4), keepdim=True).output("k")
    a = rand(2, 3, 4, 5, 6)
    out = g.compile("reference")(x=a)
    np.testing.assert_allclose(out["y"], a.sum((1, 2, 4)), rtol=1e-5)
    np.testing.assert_allclose(out["k"], a.sum((0, 1, 3, 4), keepdims=True), rtol=1e-5)
