"""ShapeTracker: every view op agrees with numpy on random shapes and random chains of views.

The oracle: apply the same chain to a numpy array of distinct values (np.arange) and compare
with materializing the tracker over the flat buffer. Padding is modelled with np.pad (zeros)
and windows with sliding_window_view, so a wrong index or validity expression shows up as a
wrong value.
"""
import numpy as np
import pytest
from hypothesis import given, note, settings, strategies as st
from numpy.lib.stride_tricks import sliding_window_view

from luminar.backends.reference import materialize
from luminar.shape import ShapeTracker
from luminar.symbolic import Var, sym


def view(tracker, buffer, env=None):
    return materialize(buffer, tracker, env or {})


@st.composite
def view_chains(draw):
    shape = draw(st.lists(st.integers(1, 5), min_size=1, max_size=4))
    data = np.arange(1, int(np.prod(shape)) + 1, dtype=np.float32)  # distinct and non-zero
    arr, tracker = data.reshape(shape), ShapeTracker.contiguous(shape)
    steps = []
    for _ in range(draw(st.integers(1, 6))):
        op = draw(st.sampled_from(["permute", "reshape", "expand", "slice", "flip", "pad", "window"]))
        nd = arr.ndim
        if op == "permute" and nd:
            order = draw(st.permutations(range(nd)))
            arr, tracker = arr.transpose(order), tracker.permute(order)
            steps.append(f"permute{tuple(order)}")
        elif op == "reshape":
            new = _random_factorization(draw, arr.shape)
            new_tracker = tracker.reshape(new)
            if new_tracker is None:  # not expressible as a view: the tensor layer would copy
                new_tracker = ShapeTracker.contiguous(arr.shape).reshape(new)
                data = np.ascontiguousarray(arr).reshape(-1)
            arr, tracker = arr.reshape(new), new_tracker
            steps.append(f"reshape{new}")
        elif op == "expand" and 1 in arr.shape:
            new = tuple(draw(st.integers(1, 3)) if d == 1 else d for d in arr.shape)
            arr, tracker = np.broadcast_to(arr, new), tracker.expand(new)
            steps.append(f"expand{new}")
        elif op == "slice" and nd:
            d = draw(st.integers(0, nd - 1))
            n = arr.shape[d]
            start = draw(st.integers(0, n - 1))
            stop = draw(st.integers(start + 1, n))
            step = draw(st.integers(1, 3))
            idx = [slice(None)] * nd
            idx[d] = slice(start, stop, step)
            arr, tracker = arr[tuple(idx)], tracker.slice(d, start, stop, step)
            steps.append(f"slice(dim={d}, {start}:{stop}:{step})")
        elif op == "flip" and nd:
            d = draw(st.integers(0, nd - 1))
            arr, tracker = np.flip(arr, d), tracker.flip(d)
            steps.append(f"flip({d})")
        elif op == "pad" and nd:
            d, lo, hi = draw(st.integers(0, nd - 1)), draw(st.integers(0, 2)), draw(st.integers(0, 2))
            widths = [(0, 0)] * nd
            widths[d] = (lo, hi)
            arr, tracker = np.pad(arr, widths), tracker.pad(d, lo, hi)
            steps.append(f"pad(dim={d}, {lo}, {hi})")
        elif op == "window" and nd:
            d = draw(st.integers(0, nd - 1))
            n = arr.shape[d]
            dilation = draw(st.integers(1, 2))
            size = draw(st.integers(1, max(1, (n - 1) // dilation + 1)))
            stride = draw(st.integers(1, 2))
            win = sliding_window_view(arr, (size - 1) * dilation + 1, axis=d)[..., ::dilation]
            win = np.moveaxis(win, -1, d + 1)  # (.., out_all, size, ..)
            idx = [slice(None)] * win.ndim
            idx[d] = slice(None, None, stride)
            arr, tracker = win[tuple(idx)], tracker.window(d, size, stride, dilation)
            steps.append(f"window(dim={d}, size={size}, stride={stride}, dilation={dilation})")
    return data, arr, tracker, steps


def _random_factorization(draw, shape):
    """A random shape with the same element count (splitting and merging factors)."""
    factors = []
    for d in shape:
        f = 2
        while d > 1:
            while d % f == 0:
                factors.append(f)
                d //= f
            f += 1
    factors = draw(st.permutations(factors)) if draw(st.booleans()) else factors
    new, i = [], 0
    while i < len(factors):
        k = draw(st.integers(1, len(factors) - i))
        new.append(int(np.prod(factors[i:i + k])))
        i += k
    if draw(st.booleans()):
        new.insert(draw(st.integers(0, len(new))), 1)
    return tuple(new)


@settings(max_examples=400, deadline=None, derandomize=True)
@given(view_chains())
def test_random_view_chains_match_numpy(case):
    data, expected, tracker, steps = case
    note(" -> ".join(steps))
    got = view(tracker, data)
    assert got.shape == expected.shape
    np.testing.assert_array_equal(got, expected)


def test_contiguous_tracker_is_row_major():
    t = ShapeTracker.contiguous((2, 3, 4))
    assert t.is_contiguous()
    assert [s.value for s in t.strides] == [12, 4, 1]
    assert str(t.index_expr()) == str(sym("_d0") * 0 + t.index_expr())  # stable printing


def test_permute_is_not_contiguous_but_reshape_of_permute_copies():
    t = ShapeTracker.contiguous((2, 3)).permute((1, 0))
    assert not t.is_contiguous()
    assert t.reshape((6,)) is None  # transposed data cannot be flattened as a view
    assert t.reshape((3, 2, 1)) is not None  # adding a unit dim can


def test_split_and_merge_of_contiguous_dims_are_views():
    t = ShapeTracker.contiguous((4, 6)).slice(1, 0, 6, 2)  # strides (6, 2)
    assert t.reshape((2, 2, 3)) is not None  # splitting a dim is always a view
    merged = ShapeTracker.contiguous((2, 3, 4)).reshape((6, 4))
    assert merged.is_contiguous()


def test_padding_reads_zero_and_validity_is_an_expression():
    t = ShapeTracker.contiguous((3,)).pad(0, 2, 1)
    np.testing.assert_array_equal(view(t, np.array([1, 2, 3], np.float32)), [0, 0, 1, 2, 3, 0])
    assert t.valid_expr([0]).value == 0 and t.valid_expr([2]).value == 1


def test_symbolic_dims_flow_through_views():
    s = Var("s", 1, None)
    t = ShapeTracker.contiguous((s, 4)).permute((1, 0)).slice(1, 1, s)
    assert t.shape[1] == s - 1  # the simplifier knows s >= 1, so no clamping remains
    data = np.arange(20, dtype=np.float32)
    np.testing.assert_array_equal(view(t, data, {"s": 5}), data.reshape(5, 4).T[:, 1:])


def test_symbolic_reshape_merges_with_symbolic_product():
    s = Var("s", 1, None)
    t = ShapeTracker.contiguous((2, s, 3)).reshape((2 * s, 3))
    assert t is not None and t.is_contiguous()
    back = t.reshape((2, s, 3))
    data = np.arange(2 * 4 * 3, dtype=np.float32)
    np.testing.assert_array_equal(view(back, data, {"s": 4}), data.reshape(2, 4, 3))


@pytest.mark.parametrize("shape,new", [((2, 3), (3, 2)), ((4,), (2, 2)), ((1, 5), (5,)), ((2, 1, 3), (6,))])
def test_reshape_of_contiguous_always_succeeds(shape, new):
    data = np.arange(np.prod(shape), dtype=np.float32)
    t = ShapeTracker.contiguous(shape).reshape(new)
    np.testing.assert_array_equal(view(t, data), data.reshape(new))


@pytest.mark.parametrize("make, expected", [
    (lambda x: x.flatten(1, 2), "(b, 8)"),
    (lambda x: x.reshape(-1), "(b * 8,)"),
    (lambda x: x.reshape("b", -1, 4), "(b, 2, 4)"),
])
def test_inferred_dim_next_to_a_symbolic_dim(make, expected):
    """-1 is numel divided by the other dims, which must cancel the symbolic factor exactly."""
    import luminar as lm
    from luminar.graph import show_shape
    x = lm.Graph().tensor("x", ("b", 4, 2))
    assert show_shape(make(x).dims) == expected
