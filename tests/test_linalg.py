"""matmul / @ and the strict linear-algebra functions (mm, bmm, mv, dot, outer, linear) against PyTorch."""
import itertools

import pytest
import torch
import torch.nn.functional as F

import luminar as lm
from luminar.graph import show_shape
from conftest import check, rand


def matmul_shapes(rank_a: int, rank_b: int):
    """Operand shapes of the given ranks with inner size 4; batch dims broadcast against each other."""
    a = (2, 1)[2 - max(rank_a - 2, 0):] + ((3, 4) if rank_a > 1 else (4,))
    b = (1, 5)[2 - max(rank_b - 2, 0):] + ((4, 6) if rank_b > 1 else (4,))
    return a, b


@pytest.mark.parametrize("rank_a, rank_b", list(itertools.product(range(1, 5), repeat=2)))
def test_matmul_every_rank_combination(rank_a, rank_b, backend):
    a, b = matmul_shapes(rank_a, rank_b)
    check(lambda x, y: x @ y, rand(*a), rand(*b, seed=1), backend=backend)


@pytest.mark.parametrize("a, b", [
    ((2, 1, 3, 4), (5, 4, 6)),  # batch (2, 1) against (5,)
    ((1, 3, 4), (2, 1, 4, 6)),
    ((7, 3, 4), (4,)),  # matrix-vector under a batch
    ((4,), (2, 3, 4, 6)),  # vector-matrix under a batch
    ((3, 1), (1, 5)),  # inner size 1: an outer product
])
def test_matmul_broadcasts_batches(a, b, backend):
    check(lambda x, y: x.matmul(y), rand(*a), rand(*b, seed=1), backend=backend)


def test_matmul_function_and_reflected_operator(backend):
    check(lambda x, y: lm.matmul(x, y) if isinstance(x, lm.GraphTensor) else torch.matmul(x, y),
          rand(3, 4), rand(4, 2, seed=1), backend=backend)
    check(lambda x, y: x.__rmatmul__(y), rand(4, 2), rand(3, 4, seed=1), backend=backend)


@pytest.mark.parametrize("fn", [
    lambda x, y: x.transpose(-1, -2) @ y,  # (2, 4, 3)^T @ (2, 4, 5)
    lambda x, y: x.mT @ y[:, :, ::2],  # strided columns
    lambda x, y: x.permute(2, 0, 1)[:, 0] @ y[1],  # a row of a permuted view
    lambda x, y: (y.mT @ x)[..., 1:],  # slice of the result
], ids=["transposed", "strided", "permuted", "sliced-result"])
def test_matmul_non_contiguous_operands(fn, backend):
    check(fn, rand(2, 4, 3), rand(2, 4, 5, seed=1), backend=backend)


@pytest.mark.parametrize("fn, shapes, symbolic", [
    (lambda x, w: x @ w, [(2, 5, 8), (8, 3)], {0: ("b", "s", None)}),  # a projection over (batch, seq)
    (lambda q, k: q @ k.mT, [(2, 5, 4), (2, 5, 4)], {0: ("b", "s", None), 1: ("b", "s", None)}),  # scores (s, s)
    (lambda p, v: p @ v, [(2, 5, 5), (2, 5, 4)], {0: (None, "s", "s"), 1: (None, "s", None)}),  # contract over s
    (lambda x, v: x @ v, [(3, 6), (6,)], {0: ("n", "k"), 1: ("k",)}),  # symbolic inner size
])
def test_matmul_symbolic_dims(fn, shapes, symbolic, backend):
    arrays = [rand(*s, seed=i) for i, s in enumerate(shapes)]
    check(fn, *arrays, backend=backend, symbolic=symbolic)


@pytest.mark.parametrize("a, b", [((3, 4), (5, 6)), ((2, 3, 4), (3,)), ((4,), (5,)), ((5,), (4, 3))])
def test_matmul_misaligned_inner_dims_name_both_shapes(a, b):
    g = lm.Graph()
    x, y = g.tensor("x", a), g.tensor("y", b)
    with pytest.raises(lm.ShapeError, match="matmul") as err:
        x @ y
    assert show_shape(a) in str(err.value) and show_shape(b) in str(err.value)


def test_matmul_batch_dims_that_do_not_broadcast_raise():
    g = lm.Graph()
    with pytest.raises(lm.ShapeError, match="broadcast"):
        g.tensor("x", (2, 3, 4)) @ g.tensor("y", (3, 4, 5))


@pytest.mark.parametrize("a, b", [((), (3,)), ((3, 4), ())])
def test_matmul_rejects_0d_operands(a, b):
    g = lm.Graph()
    with pytest.raises(lm.ShapeError, match="at least one dimension"):
        g.tensor("x", a) @ g.tensor("y", b)


# -- the strict functions ---------------------------------------------------------------------------
@pytest.mark.parametrize("fn, shapes", [
    (lambda a, b: a.mm(b), [(3, 4), (4, 5)]),
    (lambda a, b: a.mT.mm(b), [(4, 3), (4, 5)]),
    (lambda a, b: a.bmm(b), [(2, 3, 4), (2, 4, 5)]),
    (lambda a, b: a.bmm(b.transpose(1, 2)), [(2, 3, 4), (2, 5, 4)]),
    (lambda a, b: a.mv(b), [(3, 4), (4,)]),
    (lambda a, b: a.mT.mv(b[::2]), [(4, 3), (8,)]),
    (lambda a, b: a.dot(b), [(5,), (5,)]),
    (lambda a, b: a.outer(b), [(3,), (4,)]),
], ids=["mm", "mm-transposed", "bmm", "bmm-transposed", "mv", "mv-strided", "dot", "outer"])
def test_strict_products_match_torch(fn, shapes, backend):
    check(fn, *[rand(*s, seed=i) for i, s in enumerate(shapes)], backend=backend)


@pytest.mark.parametrize("name", ["mm", "bmm", "mv", "dot", "outer"])
def test_strict_products_are_also_functions(name, backend):
    shapes = {"mm": [(3, 4), (4, 5)], "bmm": [(2, 3, 4), (2, 4, 5)], "mv": [(3, 4), (4,)],
              "dot": [(5,), (5,)], "outer": [(3,), (4,)]}[name]
    check(lambda a, b: getattr(lm if isinstance(a, lm.GraphTensor) else torch, name)(a, b),
          *[rand(*s, seed=i) for i, s in enumerate(shapes)], backend=backend)


def test_bmm_with_symbolic_batch_and_seq(backend):
    check(lambda a, b: a.bmm(b), rand(2, 5, 4), rand(2, 4, 5, seed=1), backend=backend,
          symbolic={0: ("b", "s", None), 1: ("b", None, "s")})


@pytest.mark.parametrize("fn, shapes, message", [
    (lambda a, b: a.mm(b), [(2, 3, 4), (4, 5)], r"mm: input must be 2-D, got 3-D with shape \(2, 3, 4\)"),
    (lambda a, b: a.mm(b), [(3, 4), (5, 6)], r"mm: .* must match, got 4 \(shape \(3, 4\)\) and 5 \(shape \(5, 6\)\)"),
    (lambda a, b: a.bmm(b), [(3, 4), (4, 5)], r"bmm: input must be 3-D, got 2-D"),
    (lambda a, b: a.bmm(b), [(2, 3, 4), (1, 4, 5)], r"bmm: batch sizes must match, got 2 .* and 1"),
    (lambda a, b: a.bmm(b), [(2, 3, 4), (2, 3, 5)], r"bmm: .* must match, got 4 .* and 3"),
    (lambda a, b: a.mv(b), [(3, 4), (4, 1)], r"mv: vec must be 1-D, got 2-D"),
    (lambda a, b: a.mv(b), [(3, 4), (3,)], r"mv: .* must match, got 4 .* and 3"),
    (lambda a, b: a.dot(b), [(3,), (4,)], r"dot: sizes must match, got 3 \(shape \(3,\)\) and 4 \(shape \(4,\)\)"),
    (lambda a, b: a.dot(b), [(3, 1), (3,)], r"dot: input must be 1-D, got 2-D"),
    (lambda a, b: a.outer(b), [(3,), (2, 2)], r"outer: vec2 must be 1-D, got 2-D"),
], ids=["mm-rank", "mm-inner", "bmm-rank", "bmm-batch", "bmm-inner", "mv-rank", "mv-inner", "dot-size",
        "dot-rank", "outer-rank"])
def test_strict_products_reject_bad_shapes(fn, shapes, message):
    g = lm.Graph()
    with pytest.raises(lm.ShapeError, match=message):
        fn(*[g.tensor(f"t{i}", s) for i, s in enumerate(shapes)])


# -- linear -----------------------------------------------------------------------------------------
def linear(*args):
    """The same call on both sides: lm.linear for GraphTensors, F.linear for torch tensors."""
    return (lm.linear if isinstance(args[0], lm.GraphTensor) else F.linear)(*args)


@pytest.mark.parametrize("shapes", [
    [(5,), (3, 5)],  # unbatched input
    [(4, 5), (3, 5)],
    [(2, 4, 5), (3, 5), (3,)],  # with bias
    [(2, 1, 4, 5), (3, 5), (1,)],  # a bias that broadcasts
    [(4, 5), (5,)],  # a 1-D weight drops the feature axis
])
def test_linear_matches_torch(shapes, backend):
    check(linear, *[rand(*s, seed=i) for i, s in enumerate(shapes)], backend=backend)


def test_linear_with_1d_weight_and_0d_bias(backend):
    # torch accepts this bias only for inputs of rank >= 3 (its 2-D path goes through addmm)
    check(linear, rand(2, 4, 5), rand(5, seed=1), rand(seed=2), backend=backend)


def test_linear_with_symbolic_batch_and_seq(backend):
    check(linear, rand(2, 6, 5), rand(3, 5, seed=1), rand(3, seed=2), backend=backend,
          symbolic={0: ("b", "s", None)})


def test_linear_on_a_transposed_input(backend):
    check(lambda x, w: linear(x.transpose(-1, -2), w), rand(2, 5, 4), rand(3, 5, seed=1), backend=backend)


@pytest.mark.parametrize("shapes, message", [
    ([(4, 5), (3, 6)], r"linear: input has 5 features .*\(4, 5\).* weight expects 6 .*\(3, 6\)"),
    ([(4, 5), (2, 3, 5)], r"linear: weight must be 1-D or 2-D, got 3-D"),
    ([(), (3, 5)], r"linear: input must have at least 1 dimension"),
    ([(4, 5), (3, 5), (4,)], r"broadcast"),
])
def test_linear_rejects_bad_shapes(shapes, message):
    g = lm.Graph()
    with pytest.raises(lm.ShapeError, match=message):
        lm.linear(*[g.tensor(f"t{i}", s) for i, s in enumerate(shapes)])
