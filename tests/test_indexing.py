"""Creation, masking, indexing, joining and splitting ops (luminar.library.indexing) vs PyTorch.

Each test runs one lambda through luminar and torch (see conftest.check). Index tensors are
graph inputs of dtype int32; torch wants int64 indices, so its lambdas convert with `.long()`.
"""
import numpy as np
import pytest
import torch

import luminar as lm
from conftest import check, rand, run_luminar


def ints(*shape, high, low=0, seed=0):
    """Random int32 indices in [low, high)."""
    return np.random.default_rng(seed).integers(low, high, size=shape).astype(np.int32)


# -- arange -----------------------------------------------------------------------------------
@pytest.mark.parametrize("args", [(5,), (2, 7), (1, 10, 3), (10, 1, -2), (-3, 4, 2), (4, 4),
                                  (0, 1, 0.1), (-1.5, 2.0, 0.5), (2.5,), (1, 2.2, 0.3)])
def test_arange_matches_torch(args, backend):
    check(lambda x: x.graph.arange(*args), rand(1), backend=backend,
          torch_fn=lambda x: torch.arange(*args).float())


def test_arange_bound_by_a_symbolic_dim(backend):
    # 1-argument form with a dim name: the values exist once "s" is bound at run time
    check(lambda x: x + x.graph.arange("s"), rand(6), backend=backend, symbolic={0: ("s",)},
          torch_fn=lambda x: x + torch.arange(6))


def test_arange_with_symbolic_end_start_and_step(backend):
    check(lambda x: x.graph.arange(2, x.shape[0], 3), rand(10), backend=backend, symbolic={0: ("s",)},
          torch_fn=lambda x: torch.arange(2, 10, 3).float())


@pytest.mark.parametrize("args, error", [((0, 5, 0), lm.ValueDomainError), ((5, 0), lm.ValueDomainError),
                                         ((0, 1, -0.5), lm.ValueDomainError), ((0, "s", 0.5), lm.UnsupportedError),
                                         ((0, [3]), lm.ValueDomainError)])
def test_arange_rejects_bad_arguments(args, error):
    with pytest.raises(error, match="arange"):
        lm.Graph().arange(*args)


# -- constant tensors ---------------------------------------------------------------------------
@pytest.mark.parametrize("make, expected", [
    (lambda g: g.zeros(2, 3), np.zeros((2, 3))),
    (lambda g: g.zeros((2, 3)), np.zeros((2, 3))),
    (lambda g: g.ones(4), np.ones(4)),
    (lambda g: g.full((2, 2), -1.5), np.full((2, 2), -1.5)),
    (lambda g: g.full(3, 7), np.full(3, 7.0)),
    (lambda g: g.eye(3), np.eye(3)),
    (lambda g: g.eye(2, 4), np.eye(2, 4)),
])
def test_constant_tensors(make, expected, backend):
    out = run_luminar(lambda x: make(x.graph), rand(1), backend=backend)
    np.testing.assert_array_equal(out, expected.astype(np.float32))


def test_constant_tensors_with_symbolic_shape(backend):
    check(lambda x: x + x.graph.ones("s", 3) + x.graph.eye("s", 3), rand(4, 3), backend=backend,
          symbolic={0: ("s", None)}, torch_fn=lambda x: x + 1 + torch.eye(4, 3))


@pytest.mark.parametrize("name, args, torch_fn", [
    ("zeros_like", (), torch.zeros_like), ("ones_like", (), torch.ones_like),
    ("full_like", (2.5,), lambda x, v: torch.full_like(x, v)),
])
def test_like_functions_follow_the_view(name, args, torch_fn, backend):
    check(lambda x: getattr(lm, name)(x.mT[:, ::2], *args), rand(3, 2, 5), backend=backend,
          torch_fn=lambda x: torch_fn(x.mT[:, ::2], *args))


def test_full_rejects_infinity():
    with pytest.raises(lm.ValueDomainError, match="not finite"):
        lm.Graph().full((2,), float("-inf"))


# -- tril / triu --------------------------------------------------------------------------------
@pytest.mark.parametrize("op", ["tril", "triu"])
@pytest.mark.parametrize("diagonal", [-1, 0, 2])
@pytest.mark.parametrize("shape", [(4, 4), (3, 5), (2, 5, 3)])
def test_tril_triu(op, diagonal, shape, backend):
    check(lambda x: getattr(x, op)(diagonal), rand(*shape), backend=backend)


@pytest.mark.parametrize("op", ["tril", "triu"])
def test_tril_triu_on_a_transposed_view(op, backend):
    check(lambda x: getattr(x.transpose(-1, -2), op)(1), rand(2, 3, 4), backend=backend)


@pytest.mark.parametrize("op", ["tril", "triu"])
def test_tril_triu_with_symbolic_square(op, backend):
    check(lambda x: getattr(x, op)(), rand(5, 5), backend=backend, symbolic={0: ("s", "s")})


def test_tril_needs_two_dims():
    with pytest.raises(lm.ShapeError, match="tril: expected a tensor with at least 2 dims"):
        lm.Graph().tensor("x", (3,)).tril()


# -- masked_fill and where ---------------------------------------------------------------------
def test_masked_fill_broadcasts_mask(backend):
    mask = (rand(5, seed=1) > 0).astype(np.float32)
    check(lambda x, m: x.masked_fill(m, -1e30), rand(2, 5), mask, backend=backend,
          torch_fn=lambda x, m: x.masked_fill(m.bool(), -1e30))


def test_masked_fill_broadcasts_input_and_accepts_uint8_mask(backend):
    mask = (rand(3, 1, 4, seed=2) > 0).astype(np.uint8)
    check(lambda x, m: lm.masked_fill(x[::2], m, 0.5), rand(8, 4), mask, backend=backend,
          torch_fn=lambda x, m: torch.masked_fill(x[::2], m.bool(), 0.5))


def test_masked_fill_with_a_symbolic_causal_mask(backend):
    check(lambda x: x.masked_fill(x.graph.ones("s", "s").triu(1), -1e30), rand(4, 4), backend=backend,
          symbolic={0: ("s", "s")}, torch_fn=lambda x: x.masked_fill(torch.ones(4, 4).triu(1).bool(), -1e30))


def test_masked_fill_rejects_infinity():
    x = lm.Graph().tensor("x", (2,))
    with pytest.raises(lm.ValueDomainError, match="masked_fill: value -inf is not finite.*-1e30"):
        x.masked_fill(x > 0, float("-inf"))


@pytest.mark.parametrize("branches", ["tensors", "scalar_other", "scalar_input"])
def test_where_broadcasts_and_takes_scalars(branches, backend):
    cond, x, y = (rand(3, 1, seed=3) > 0).astype(np.float32), rand(4), rand(2, 3, 4, seed=4)
    pick = {"tensors": lambda c, a, b: (c, a, b), "scalar_other": lambda c, a, b: (c, a, -2.0),
            "scalar_input": lambda c, a, b: (c, 3.0, b)}[branches]
    check(lambda c, a, b: lm.where(*pick(c, a, b)), cond, x, y, backend=backend,
          torch_fn=lambda c, a, b: torch.where(*pick(c.bool(), a, b)))


# -- one_hot, gather, index_select, embedding --------------------------------------------------
@pytest.mark.parametrize("dtype", [np.int32, np.float32])
@pytest.mark.parametrize("shape", [(5,), (2, 3)])
def test_one_hot(dtype, shape, backend):
    check(lambda i: lm.one_hot(i, 4), ints(*shape, high=4).astype(dtype), backend=backend,
          torch_fn=lambda i: torch.nn.functional.one_hot(i.long(), 4))


def test_one_hot_gives_zeros_for_out_of_range_indices(backend):
    # torch raises here; a one-hot made of comparisons cannot, so the row is all zeros
    out = run_luminar(lambda i: lm.one_hot(i, 3), np.array([0, 3, -1, 2], np.int32), backend=backend)
    np.testing.assert_array_equal(out, [[1, 0, 0], [0, 0, 0], [0, 0, 0], [0, 0, 1]])


def test_one_hot_with_symbolic_batch(backend):
    check(lambda i: lm.one_hot(i, 6), ints(7, high=6), backend=backend, symbolic={0: ("s",)},
          torch_fn=lambda i: torch.nn.functional.one_hot(i.long(), 6))


def test_one_hot_needs_num_classes():
    with pytest.raises(lm.UnsupportedError, match="one_hot: num_classes=-1"):
        lm.one_hot(lm.Graph().tensor("i", (3,), "int32"))


@pytest.mark.parametrize("dim, x_shape, index_shape", [
    (0, (4, 3), (5, 3)), (1, (4, 3), (4, 6)), (-1, (2, 3, 5), (2, 3, 2)), (1, (3, 4, 2), (2, 7, 1)),
])
def test_gather(dim, x_shape, index_shape, backend):
    index = ints(*index_shape, high=x_shape[dim])
    check(lambda x, i: x.gather(dim, i), rand(*x_shape), index, backend=backend,
          torch_fn=lambda x, i: x.gather(dim, i.long()))


def test_gather_from_a_transposed_view(backend):
    check(lambda x, i: lm.gather(x.T, 0, i), rand(3, 4), ints(2, 3, high=4), backend=backend,
          torch_fn=lambda x, i: torch.gather(x.T, 0, i.long()))


def test_gather_with_symbolic_dims(backend):
    check(lambda x, i: x.gather(1, i), rand(5, 4), ints(5, 2, high=4), backend=backend,
          symbolic={0: ("s", None), 1: ("s", None)}, torch_fn=lambda x, i: x.gather(1, i.long()))


@pytest.mark.parametrize("index_shape, match", [((2,), "index must have the input's rank 2"),
                                                ((5, 2), "index size 5 exceeds the input size 3 at dim 0")])
def test_gather_rejects_bad_index_shapes(index_shape, match):
    g = lm.Graph()
    with pytest.raises(lm.ShapeError, match=match):
        g.tensor("x", (3, 4)).gather(1, g.tensor("i", index_shape, "int32"))


@pytest.mark.parametrize("dim", [0, 1, -1])
def test_index_select(dim, backend):
    x = rand(3, 4, 5)
    index = ints(6, high=x.shape[dim])  # repeats some rows
    check(lambda x, i: x.index_select(dim, i), x, index, backend=backend,
          torch_fn=lambda x, i: x.index_select(dim, i.long()))


def test_index_select_with_symbolic_dims(backend):
    check(lambda x, i: x[:, ::2].index_select(0, i), rand(5, 6), ints(3, high=5), backend=backend,
          symbolic={0: ("s", None), 1: ("k",)}, torch_fn=lambda x, i: x[:, ::2].index_select(0, i.long()))


def test_index_select_needs_a_vector():
    g = lm.Graph()
    with pytest.raises(lm.ShapeError, match="index_select: index must be 1-D"):
        g.tensor("x", (3, 4)).index_select(0, g.tensor("i", (2, 2), "int32"))


@pytest.mark.parametrize("index_shape", [(5,), (2, 3)])
def test_embedding(index_shape, backend):
    check(lambda i, w: lm.embedding(i, w), ints(*index_shape, high=10), rand(10, 4), backend=backend,
          torch_fn=lambda i, w: torch.nn.functional.embedding(i.long(), w))


def test_embedding_with_symbolic_sequence(backend):
    check(lambda i, w: lm.embedding(i, w), ints(2, 7, high=10), rand(10, 4), backend=backend,
          symbolic={0: (None, "s")}, torch_fn=lambda i, w: torch.nn.functional.embedding(i.long(), w))


def test_embedding_rejects_max_norm():
    g = lm.Graph()
    with pytest.raises(lm.UnsupportedError, match="embedding: max_norm"):
        lm.embedding(g.tensor("i", (3,), "int32"), g.tensor("w", (5, 2)), max_norm=1.0)


# -- repeat, repeat_interleave, roll -----------------------------------------------------------
@pytest.mark.parametrize("shape, sizes", [((2, 3), (2, 3)), ((3,), (2, 1, 2)), ((2, 1, 3), (1, 4, 1)),
                                          ((2, 3), (1, 1))])
def test_repeat(shape, sizes, backend):
    check(lambda x: x.repeat(*sizes), rand(*shape), backend=backend)


def test_repeat_a_transposed_view_with_symbolic_dim(backend):
    check(lambda x: x.T.repeat((2, 3)), rand(4, 3), backend=backend, symbolic={0: ("s", None)})


def test_repeat_needs_a_size_per_dim():
    with pytest.raises(lm.ShapeError, match="repeat: 1 sizes given for a tensor of rank 2"):
        lm.Graph().tensor("x", (2, 3)).repeat(2)


@pytest.mark.parametrize("repeats, dim", [(2, None), (3, 0), (2, -1)])
def test_repeat_interleave(repeats, dim, backend):
    check(lambda x: x.repeat_interleave(repeats, dim), rand(2, 3), backend=backend)


@pytest.mark.parametrize("shifts, dims", [(2, None), (-1, 0), ((1, -2), (0, 1)), (7, -1)])
def test_roll(shifts, dims, backend):
    check(lambda x: x.roll(shifts, dims), rand(3, 4), backend=backend)


def test_roll_symbolic_dim(backend):
    check(lambda x: x.roll(2, 0), rand(5, 3), backend=backend, symbolic={0: ("s", None)})


# -- cat / stack ---------------------------------------------------------------------------------
@pytest.mark.parametrize("dim", [0, 1, -1])
def test_cat(dim, backend):
    shapes = [[2, 3, 4]] * 3
    for k, s in enumerate(shapes):
        shapes[k] = [k + 1 if j == dim % 3 else n for j, n in enumerate(s)]
    check(lambda a, b, c: lm.cat([a, b, c], dim), *(rand(*s, seed=k) for k, s in enumerate(shapes)),
          backend=backend, torch_fn=lambda a, b, c: torch.cat([a, b, c], dim))


def test_cat_of_views_and_alias(backend):
    check(lambda a, b: lm.concat((a.T, b[:, ::2]), dim=1), rand(4, 3), rand(3, 6), backend=backend,
          torch_fn=lambda a, b: torch.concat((a.T, b[:, ::2]), dim=1))


def test_cat_along_symbolic_dims(backend):
    check(lambda a, b: lm.cat([a, b, a], 0), rand(3, 2), rand(5, 2, seed=1), backend=backend,
          symbolic={0: ("s", None), 1: ("t", None)}, torch_fn=lambda a, b: torch.cat([a, b, a], 0))


@pytest.mark.parametrize("shapes, match", [
    ([(2, 3), (2, 3, 1)], "cat: tensors must have the same rank; .* tensor 1 has shape \\(2, 3, 1\\)"),
    ([(2, 3), (2, 3), (2, 4)], "cat: sizes must match except in dim 0; tensor 2 has size 4 at dim 1, expected 3"),
    ([()], "cat: tensor 0 is 0-d"),
    ([], "cat: expected a non-empty list"),
])
def test_cat_rejects_bad_inputs(shapes, match):
    g = lm.Graph()
    with pytest.raises(lm.ShapeError, match=match):
        lm.cat([g.tensor(f"x{k}", s) for k, s in enumerate(shapes)])


@pytest.mark.parametrize("dim", [0, 1, -1])
def test_stack(dim, backend):
    check(lambda a, b: lm.stack([a, b.T], dim), rand(2, 3), rand(3, 2, seed=1), backend=backend,
          torch_fn=lambda a, b: torch.stack([a, b.T], dim))


def test_stack_needs_equal_shapes():
    g = lm.Graph()
    with pytest.raises(lm.ShapeError, match="stack: all tensors must have the same shape; .*tensor 1 has shape"):
        lm.stack([g.tensor("a", (2, 3)), g.tensor("b", (3, 2))])


# -- split / chunk / unbind -------------------------------------------------------------------
@pytest.mark.parametrize("size_or_sections, dim", [(2, 0), (3, -1), ([1, 4], 0), ((2, 2, 1), 1), (5, 0)])
def test_split(size_or_sections, dim, backend):
    check(lambda x: x.split(size_or_sections, dim), rand(5, 5), backend=backend)


def test_split_symbolic_dim_by_sections(backend):
    check(lambda x: lm.split(x, [2, x.shape[0] - 2]), rand(6, 3), backend=backend, symbolic={0: ("s", None)},
          torch_fn=lambda x: torch.split(x, [2, 4]))


@pytest.mark.parametrize("sections, error, match", [
    ([2, 2], lm.ShapeError, "split: sections \\('2', '2'\\) must add up to 5"),
    (2, None, None),
])
def test_split_rejects_bad_sections(sections, error, match):
    x = lm.Graph().tensor("x", (5, "s"))
    if error is None:  # splitting by size along a symbolic dim needs the size at build time
        with pytest.raises(lm.UnsupportedError, match="split: needs a known size for dim 1"):
            x.split(sections, 1)
    else:
        with pytest.raises(error, match=match):
            x.split(sections)


@pytest.mark.parametrize("chunks, dim", [(3, 0), (2, -1), (5, 1), (1, 0)])
def test_chunk(chunks, dim, backend):
    check(lambda x: x.chunk(chunks, dim), rand(5, 4), backend=backend)


@pytest.mark.parametrize("dim", [0, -1])
def test_unbind(dim, backend):
    check(lambda x: x.unbind(dim), rand(3, 2), backend=backend)


def test_narrow_is_a_view(backend):
    check(lambda x: x.narrow(1, 1, 2), rand(3, 4), backend=backend)


def test_indexing_with_a_tensor_points_to_index_select_and_gather():
    """`x[t]` with a GraphTensor t is not basic indexing: the error names what to use instead
    (rather than failing inside the ellipsis test, which compared t with ...)."""
    g = lm.Graph()
    x, t = g.tensor("x", (4, 3)), g.tensor("t", (2,), "int32")
    with pytest.raises(lm.UnsupportedError, match="index_select/gather"):
        x[t]
    with pytest.raises(lm.UnsupportedError, match="index_select/gather"):
        x[..., t]
