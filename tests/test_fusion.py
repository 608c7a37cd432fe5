"""Fusion across reductions: row values (a norm's mean, a softmax's max and sum) computed once per
row inside the kernel that uses them, and the search's fuse / un-fuse choice for attention.

(Every op is also checked against PyTorch on this backend through the `backend` fixture of the
other test files; these tests pin down how many kernels the fused forms take and that results
are unchanged where fusing would be wrong.)
"""
import shutil

import numpy as np
import pytest
import torch

import luminar as lm
from luminar.compiler.kernels import Reduce, depends_on, lower, walk
from luminar.compiler.passes import optimize
from conftest import rand

pytestmark = pytest.mark.skipif(not (shutil.which("gcc") or shutil.which("cc")), reason="needs a C compiler")
F = torch.nn.functional

ROW_OPS = {
    "softmax": (lambda x: x.softmax(-1), lambda t: t.softmax(-1)),
    "log_softmax": (lambda x: x.log_softmax(-1), lambda t: t.log_softmax(-1)),
    "layer_norm": (lambda x: lm.layer_norm(x, (x.shape[-1],)), lambda t: F.layer_norm(t, (t.shape[-1],))),
    "rms_norm": (lambda x: lm.rms_norm(x, (x.shape[-1],)), lambda t: F.rms_norm(t, (t.shape[-1],))),
}


def kernels_of(g):
    return lower(optimize(g)).kernels


def recomputes_a_row_value(kernel) -> bool:
    """A reduction that varies with the innermost output index but not with some other output
    index is computed again for each value of that other index."""
    loop_vars = [v.name for v, n in zip(kernel.loop_vars, kernel.shape) if n != 1]
    return any(isinstance(n, Reduce) and loop_vars and loop_vars[-1] in depends_on(n)
               and not set(loop_vars) <= depends_on(n) for n in walk(kernel.value))


@pytest.mark.parametrize("name", sorted(ROW_OPS))
@pytest.mark.parametrize("shape", [(1000,), (64, 256), (3, 5, 77)])
def test_row_ops_are_one_kernel_and_match_torch(name, shape):
    ours, theirs = ROW_OPS[name]
    g = lm.Graph()
    ours(g.tensor("x", shape)).output("y")
    assert len(kernels_of(g)) == 1
    xa = rand(*shape) * 4
    np.testing.assert_allclose(g.compile("cpu")(x=xa)["y"], theirs(torch.from_numpy(xa)).numpy(), rtol=1e-5, atol=2e-6)


def test_layer_norm_with_affine_and_symbolic_rows_is_one_kernel():
    g = lm.Graph()
    x, w, b = g.tensor("x", ("s", 96)), g.tensor("w", (96,)), g.tensor("b", (96,))
    lm.layer_norm(x, (96,), w, b, eps=1e-3).output("y")
    assert len(kernels_of(g)) == 1
    model = g.compile("cpu")
    wa, ba = rand(96, seed=1), rand(96, seed=2)
    for s in (1, 7, 33):
        xa = rand(s, 96, seed=s)
        want = F.layer_norm(*map(torch.from_numpy, (xa,)), (96,), torch.from_numpy(wa), torch.from_numpy(ba), 1e-3)
        np.testing.assert_allclose(model(x=xa, w=wa, b=ba)["y"], want.numpy(), rtol=1e-5, atol=2e-6)


def test_softmax_computes_each_exponential_once():
    """The row sum's loop stores exp(x - max) into the output row; the output loop rescales those
    instead of computing them again (two lm_exp2 calls in the source: the sum's vector loop and
    its remainder)."""
    g = lm.Graph()
    g.tensor("x", (4, 100)).softmax(-1).output("y")
    assert g.compile("cpu").source.count("lm_exp2(") - 1 == 2  # (minus the definition)


@pytest.mark.parametrize("build", [
    lambda x: lm.layer_norm(x, (48,)).transpose(0, 1) + 1,   # read transposed: rows not innermost
    lambda x: lm.layer_norm(x, (48,)).sum(0),                # reduced over the rows
    lambda x: x.softmax(0) * 2,                              # normalized along the outer axis
    lambda x: x.softmax(-1) @ x.transpose(0, 1),             # read by a matmul
], ids=["transposed", "reduced-over-rows", "softmax-dim-0", "matmul"])
def test_row_values_get_a_buffer_where_rows_would_not_stay_innermost(build):
    """Inlining a row value into a consumer that does not walk rows innermost would recompute
    the row's reduction per element; such consumers read a buffer instead, with equal results."""
    xa = rand(40, 48) * 3
    g = lm.Graph()
    build(g.tensor("x", (40, 48))).output("y")
    assert not any(recomputes_a_row_value(k) for k in kernels_of(g))
    want = g.compile("reference")(x=xa)["y"]
    np.testing.assert_allclose(g.compile("cpu")(x=xa)["y"], want, rtol=1e-5, atol=1e-5)


def test_norm_feeding_a_linear_layer_is_computed_once_per_row():
    """rms_norm(x) @ W.T: the norm is its own one-kernel pass, the product reads plain rows."""
    g = lm.Graph()
    x, gain, w = g.tensor("x", ("s", 64)), g.tensor("g", (64,)), g.tensor("w", (300, 64))
    lm.linear(lm.rms_norm(x, (64,), gain), w).output("y")
    assert len(kernels_of(g)) == 2
    model = g.compile("cpu")
    ga, wa = rand(64, seed=1), rand(300, 64, seed=2)
    for s in (1, 5, 40):
        xa = rand(s, 64, seed=s)
        normed = xa / np.sqrt((xa * xa).mean(-1, keepdims=True) + np.finfo(np.float32).eps) * ga
        np.testing.assert_allclose(model(x=xa, g=ga, w=wa)["y"], normed @ wa.T, rtol=1e-4, atol=1e-4)


def test_output_arrays_the_caller_keeps_are_never_overwritten():
    """A program reuses the memory of an output array the caller dropped (fresh pages cost a
    fault on first write), but never one still referenced."""
    g = lm.Graph()
    (g.tensor("x", (256,)) * 2).output("y")
    model = g.compile("cpu")
    a, b = rand(256, seed=1), rand(256, seed=2)
    kept = model(x=a)["y"]
    second = model(x=b)["y"]
    assert second is not kept
    np.testing.assert_array_equal(kept, a * 2)
    view = second[10:]
    del second
    third = model(x=a)["y"]
    np.testing.assert_array_equal(view, (b * 2)[10:])  # a view keeps its base alive
    address = third.ctypes.data
    del third
    assert model(x=b)["y"].ctypes.data == address  # dropped: its memory serves the next call
