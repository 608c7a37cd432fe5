"""The CPU backend's own contracts: fusion, one compile per graph, the disk cache, the arena.

(Numerical agreement with PyTorch for every op runs on this backend through the `backend`
fixture in the other test files.)
"""
import os
import re
import shutil
import subprocess
import sys

import numpy as np
import pytest
import torch

import luminar as lm
from luminar.backends.cpu import cc
from luminar.compiler.analysis import PRECOMPUTED
from luminar.compiler.kernels import lower
from luminar.compiler.passes import optimize
from conftest import Q4Tensor, rand

pytestmark = pytest.mark.skipif(not (shutil.which("gcc") or shutil.which("cc")), reason="needs a C compiler")


@pytest.fixture
def fresh_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("LUMINAR_CACHE", str(tmp_path))
    return tmp_path


def kernels_of(g):
    return lower(optimize(g)).kernels


def test_elementwise_chain_is_one_kernel():
    g = lm.Graph()
    a, b, c = (g.tensor(n, (64,)) for n in "abc")
    (a * b + c).relu().exp().output("y")
    assert len(kernels_of(g)) == 1


def test_matmul_with_epilogue_is_one_kernel():
    g = lm.Graph()
    x, w = g.tensor("x", (8, 16)), g.tensor("w", (16, 4))
    ((x @ w) * 2 + 1).output("y")
    (kernel,) = kernels_of(g)
    xa, wa = rand(8, 16), rand(16, 4, seed=1)
    np.testing.assert_allclose(g.compile("cpu")(x=xa, w=wa)["y"], (xa @ wa) * 2 + 1, rtol=1e-5, atol=1e-5)


def test_fused_reduction_chain_matches_numpy():
    g = lm.Graph()
    a, b, c = (g.tensor(n, (1000,)) for n in "abc")
    (a * b + c).relu().sum().output("y")
    assert len(kernels_of(g)) == 1
    A, B, C = rand(1000), rand(1000, seed=1), rand(1000, seed=2)
    np.testing.assert_allclose(g.compile("cpu")(a=A, b=B, c=C)["y"], np.maximum(A * B + C, 0).sum(), rtol=1e-5)


@pytest.mark.parametrize("n,k,m", [(1, 7, 5), (5, 3, 33), (9, 64, 40), (70, 70, 70), (16, 16, 64)])
def test_tiled_matmul_edges(n, k, m):
    """Sizes that are not multiples of the register tile exercise the clamped edges."""
    g = lm.Graph()
    (g.tensor("a", (n, k)) @ g.tensor("b", (k, m))).output("c")
    a, b = rand(n, k), rand(k, m, seed=1)
    np.testing.assert_allclose(g.compile("cpu")(a=a, b=b)["c"], a @ b, rtol=1e-5, atol=1e-5)


# 48 x 48: whole 6 x 16 register tiles only; 53 x 37: edge tiles in both directions too
@pytest.mark.parametrize("rows,cols", [(48, 48), (53, 37)])
def test_a_tiled_matmuls_epilogue_is_applied_in_whole_and_edge_tiles(rows, cols):
    """The epilogue (here a SiLU gate and a causal position mask, as in a transformer's prefill)
    runs in the tiles wholly inside the output, written without bounds tests, and in the edge
    tiles that are; both agree with numpy."""
    g = lm.Graph()
    a, b, gate = g.tensor("a", ("s", 40)), g.tensor("b", (40, cols)), g.tensor("gate", ("s", cols))
    later = g.arange("s").unsqueeze(-1) < g.arange(cols).unsqueeze(0)  # (column after the row)
    ((a @ b) * (gate * gate.sigmoid()) * (1.0 - later) + later * -1e30).output("y")
    A, B, G = rand(rows, 40), rand(40, cols, seed=1), rand(rows, cols, seed=2)
    got = g.compile("cpu")(a=A, b=B, gate=G)["y"]
    mask = np.arange(rows)[:, None] < np.arange(cols)[None, :]
    expected = np.where(mask, -1e30, (A @ B) * (G / (1 + np.exp(-G))))
    np.testing.assert_allclose(got, expected, rtol=1e-4, atol=1e-4)


def test_index_values_are_the_nearest_floats_far_beyond_int32():
    """An index used as a value (an arange, a position) converts as (float) of the 64-bit integer
    would, also where it does not fit 32 bits and for negative values."""
    g = lm.Graph()
    g.arange(-2**40 + 5, 2**40, 2**33 + 12345).output("big")
    g.arange(2**24 - 70, 2**31 + 10**9, 7777777).output("near")
    got = g.compile("cpu")()
    np.testing.assert_array_equal(got["big"], np.arange(-2**40 + 5, 2**40, 2**33 + 12345).astype(np.float32))
    np.testing.assert_array_equal(got["near"], np.arange(2**24 - 70, 2**31 + 10**9, 7777777).astype(np.float32))


def test_symbolic_dims_need_no_recompile(fresh_cache):
    g = lm.Graph()
    x, w = g.tensor("x", ("s", 32)), g.tensor("w", (32, 8))
    (x @ w).softmax(-1).output("y")
    model = g.compile("cpu")
    objects = sorted(os.listdir(fresh_cache))
    wa = rand(32, 8)
    for s in (1, 5, 77):
        xa = rand(s, 32, seed=s)
        e = np.exp(xa @ wa - (xa @ wa).max(-1, keepdims=True))
        np.testing.assert_allclose(model(x=xa, w=wa)["y"], e / e.sum(-1, keepdims=True), rtol=1e-5, atol=1e-6)
    assert sorted(os.listdir(fresh_cache)) == objects  # no new shared objects


def test_second_compile_hits_the_disk_cache(fresh_cache, monkeypatch):
    def graph():
        g = lm.Graph()
        (g.tensor("x", (4,)) * 3).output("y")
        return g
    graph().compile("cpu")
    assert len(list(fresh_cache.glob("*.so"))) == 1
    calls = []
    monkeypatch.setattr(cc.subprocess, "Popen", lambda *a, **k: calls.append(a))
    np.testing.assert_array_equal(graph().compile("cpu")(x=np.ones(4, np.float32))["y"], [3, 3, 3, 3])
    assert calls == []  # served from the cache, the compiler never ran


def test_corrupt_cache_entry_is_rebuilt(fresh_cache):
    # A separate process: this one may already have the library mapped, and the dynamic loader
    # reuses a loaded library by path.
    script = ("import numpy as np, luminar as lm\n"
              "g = lm.Graph(); (g.tensor('x', (2,)) + 1).output('y')\n"
              "print(g.compile('cpu')(x=np.zeros(2, np.float32))['y'].tolist())\n")
    run = lambda: subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                                 env={**os.environ, "LUMINAR_CACHE": str(fresh_cache)})
    assert run().stdout.strip() == "[1.0, 1.0]"
    (entry,) = fresh_cache.glob("*.so")
    entry.unlink()
    entry.write_bytes(b"not an ELF file")  # e.g. a disk error or a truncated copy
    result = run()
    assert result.stdout.strip() == "[1.0, 1.0]", result.stderr
    assert entry.read_bytes()[:4] == b"\x7fELF"


def test_no_half_written_files_are_left(fresh_cache):
    g = lm.Graph()
    (g.tensor("x", (2,)) - 1).output("y")
    g.compile("cpu")
    assert [p.suffix for p in fresh_cache.iterdir()] == [".so"]  # temp dirs are gone


def test_missing_compiler_is_a_clear_error(fresh_cache, monkeypatch):
    monkeypatch.setenv("CC", "/nonexistent/cc")
    monkeypatch.setattr(cc.shutil, "which", lambda name: None)
    g = lm.Graph()
    (g.tensor("x", (2,)) * 5).output("y")
    with pytest.raises(cc.CompilerError, match="no C compiler found.*backend='reference'"):
        g.compile("cpu")


def test_compiler_failure_keeps_the_source(fresh_cache, monkeypatch):
    monkeypatch.setattr(cc, "FLAGS", cc.FLAGS + ["-DBROKEN=", "-include", "/nonexistent.h"])
    g = lm.Graph()
    (g.tensor("x", (2,)) * 7).output("y")
    with pytest.raises(cc.CompilerError, match="failed on generated source"):
        g.compile("cpu")
    assert list(fresh_cache.glob("*.failed.c"))


def test_unknown_option_is_rejected():
    g = lm.Graph()
    (g.tensor("x", (2,)) * 7).output("y")
    with pytest.raises(lm.UnsupportedError, match="unknown options"):
        g.compile("cpu", tiles=3)


# -- memory planning -------------------------------------------------------------------------

def _mlp(depth=6, width=256):
    g = lm.Graph()
    h = g.tensor("x", ("b", width))
    for i in range(depth):
        h = (h @ g.tensor(f"w{i}", (width, width))).relu().softmax(-1)
    h.output("y")
    return g


def liveness(model, dims) -> tuple[int, int]:
    """(bytes the temporaries take with a buffer each, the most bytes alive during one kernel):
    no plan can use less than the second."""
    from luminar.compiler.memory import lifetimes
    life = lifetimes(model.kernels)
    sizes = {b.id: -(-int(b.numel.evaluate(dims)) * 4 // 64) * 64 for b in model.kernels.buffers if b.id in life}
    return sum(sizes.values()), max(sum(n for b, n in sizes.items() if life[b][0] <= k <= life[b][1])
                                    for k in range(len(model.kernels.kernels)))


def test_arena_reuses_memory_of_dead_buffers_close_to_the_liveness_bound():
    model = _mlp().compile("cpu")
    plan = model.memory_plan({"b": 32}, exact=True)
    unshared, bound = liveness(model, {"b": 32})
    assert unshared > 2 * plan.arena_bytes  # buffers share space ...
    assert bound <= plan.arena_bytes <= bound + 64 * len(plan.offsets)  # ... close to the bound


def test_arena_never_overlaps_live_buffers():
    """Whatever the plan, results stay right (overlap would corrupt them) for several dims."""
    g = _mlp(depth=4, width=48)
    model, ref = g.compile("cpu"), g.compile("reference")
    for b in (1, 7, 33):
        inputs = {"x": rand(b, 48, seed=b), **{f"w{i}": rand(48, 48, seed=10 + i) for i in range(4)}}
        np.testing.assert_allclose(model(**inputs)["y"], ref(**inputs)["y"], rtol=1e-5, atol=1e-6)


def test_plans_for_rounded_up_dims_are_reused():
    model = _mlp(depth=2, width=16).compile("cpu")
    assert model.memory_plan({"b": 5}) is model.memory_plan({"b": 8})  # both plan for b = 8
    assert model.memory_plan({"b": 9}).arena_bytes > model.memory_plan({"b": 8}).arena_bytes


def test_a_dim_that_sizes_no_temp_never_makes_a_new_plan():
    """A KV cache's length: the cache is an input and no temporary grows with it, so a decode
    loop keeps one plan (and one thread-count history) however long the cache gets."""
    g = lm.Graph()
    x, w, cache = g.tensor("x", ("s", 8)), g.tensor("w", (8, 8)), g.tensor("cache", ("t", 8))
    h = x @ w  # read by two kernels: a temp of s * 8 floats
    ((h * cache.amax(0)).sum(-1) + h.amax(-1)).output("y")
    model = g.compile("cpu")
    sized = {str(v) for b in model.kernels.buffers if b.kind == "temp" for v in b.numel.vars()}
    assert sized == {"s"}
    first = model.memory_plan({"s": 1, "t": 3})
    assert model.memory_plan({"s": 1, "t": 300}) is first
    assert model.memory_plan({"s": 64, "t": 3}) is not first
    for s, t in ((1, 3), (1, 70), (5, 9)):  # and the results stay right across cache lengths
        xs, ws, cs = rand(s, 8, seed=t), rand(8, 8, seed=s), rand(t, 8, seed=t + 1)
        hs = xs @ ws
        np.testing.assert_allclose(model(x=xs, w=ws, cache=cs)["y"], (hs * cs.max(0)).sum(-1) + hs.max(-1), rtol=1e-5)


def test_debug_level_prints_kernel_times(monkeypatch, capsys):
    monkeypatch.setenv("LUMINAR_DEBUG", "1")
    g = lm.Graph()
    (g.tensor("x", (3,)).exp().sum()).output("y")
    g.compile("cpu")(x=np.zeros(3, np.float32))
    err = capsys.readouterr().err
    assert "kernels, shared object ready" in err and "cpu call:" in err and "k0_sum_reduce" in err


def test_one_hot_reduction_becomes_an_indexed_read():
    """embedding = one_hot(ids) @ table; the compiler reads one row instead of summing over all."""
    from luminar.compiler.kernels import Gather, Reduce, walk
    g = lm.Graph()
    ids, table = g.tensor("ids", ("s",), "int32"), g.tensor("table", (1000, 8))
    lm.embedding(ids, table).output("e")
    (kernel,) = kernels_of(g)
    nodes = list(walk(kernel.value))
    assert any(isinstance(n, Gather) for n in nodes) and not any(isinstance(n, Reduce) for n in nodes)
    t = rand(1000, 8)
    idx = np.array([5, 999, 0, 1000, -1], np.int32)  # the last two are out of range: zero rows, as one_hot gives
    expected = np.where(((idx >= 0) & (idx < 1000))[:, None], t[np.clip(idx, 0, 999)], 0)
    np.testing.assert_array_equal(g.compile("cpu")(ids=idx, table=t)["e"], expected)


# -- schedules chosen by rule ---------------------------------------------------------------------

@pytest.mark.parametrize("quantized", [False, True], ids=["float32 W", "Q4_1 W"])
def test_linear_packs_its_weight_from_four_rows(quantized):
    """x @ W.T reads both operands in order along the reduction; from 4 rows on (a runtime test on
    the symbolic dim) the weight -- dequantized once -- is packed and reused by every row."""
    from luminar.backends.cpu.schedules import default_schedule
    from luminar.io import quant
    g = lm.Graph()
    if quantized:
        tensor = Q4Tensor(40, 96)
        w, feeds = quant.weight(g, "w", tensor)
        dense_w = quant.dequantize_parts("Q4_1", tensor.parts, tensor.shape)
    else:
        dense_w = rand(40, 96, seed=3)
        w, feeds = g.tensor("w", (40, 96)), {"w": dense_w}
    lm.linear(g.tensor("x", ("s", 96)), w).output("y")
    (kernel,) = kernels_of(g)
    schedule = default_schedule(kernel)
    assert (schedule.kind, schedule.min_rows, schedule.vector) == ("tiled", 4, True)
    model = g.compile("cpu")
    for s in (1, 3, 4, 9, 77):
        x = rand(s, 96, seed=s)
        np.testing.assert_allclose(model(x=x, **feeds)["y"], x @ dense_w.T, rtol=1e-4, atol=1e-4)


def test_loop_invariant_reduction_is_computed_before_the_loop():
    """sum_r x[r] * (sum_q y[q]): the inner sum does not depend on r, so the renderer computes it
    once, before r's loop (loop-invariant code motion), instead of once per step."""
    from luminar.backends.cpu.render import render_kernel
    from luminar.compiler.kernels import Apply, Buffer, Kernel, KernelProgram, Load, Reduce
    from luminar.symbolic import Var, sym
    r, q = Var("_r0", 0, 63), Var("_r1", 0, 63)
    inner = Reduce("sum_reduce", q, sym(64), Load(1, q, sym(1)))
    kernel = Kernel("k0", 2, (), Reduce("sum_reduce", r, sym(64), Apply("mul", (Load(0, r, sym(1)), inner))))
    buffers = [Buffer(0, sym(64), "float32", "input", "x"), Buffer(1, sym(64), "float32", "input", "y"),
               Buffer(2, sym(1), "float32", "output", "s")]
    source = render_kernel(KernelProgram(buffers, [kernel], {"x": 0, "y": 1}, {"s": 2}, {"s": ()}), kernel)
    assert source.index("_r1 < 64") < source.index("_r0 < 64")


def test_computed_rows_are_packed_once_for_every_column_block():
    """linear(x * g + 1, W) with the row operand computed inside the product: the computed rows
    go into a buffer once, not once per column block, and the results are unchanged."""
    from luminar.backends.cpu.schedules import default_schedule
    g = lm.Graph()
    x, gain, w = g.tensor("x", ("s", 64)), g.tensor("g", (64,)), g.tensor("w", (300, 64))
    lm.linear(x * gain + 1, w).output("y")
    (kernel,) = kernels_of(g)
    assert default_schedule(kernel).pack_rows
    model = g.compile("cpu")
    assert model.source.count("*restrict rowbuf = ") == 2  # also below 4 rows, where loops replace tiles
    ga, wa = rand(64, seed=1), rand(300, 64, seed=2)
    for s in (1, 5, 40):
        xa = rand(s, 64, seed=s)
        np.testing.assert_allclose(model(x=xa, g=ga, w=wa)["y"], (xa * ga + 1) @ wa.T, rtol=1e-4, atol=1e-4)


def test_exp2_is_right_across_its_range_including_masked_scores():
    """exp2 renders as inline arithmetic (no slow library path for results below the normal
    floats, which masked softmax scores produce): within ~1 ulp of numpy, subnormal results,
    overflow, underflow, infinities and NaN included, elementwise and inside a reduction."""
    x = np.array([-1e30, -200, -150, -149.3, -130, -126.5, -3.7, -1, 0, 0.25, 1, 64.5, 127.7, 128, 200,
                  np.inf, -np.inf, np.nan], np.float32)
    scores = np.where(np.arange(64) % 3 == 0, -1e30, rand(64, seed=4) * 20).astype(np.float32)  # masked
    g = lm.Graph()
    g.tensor("x", (len(x),)).exp2().output("y")
    g.tensor("scores", (64,)).exp2().sum().output("total")
    out = g.compile("cpu")(x=x, scores=scores)
    with np.errstate(over="ignore"):
        expected = np.exp2(x.astype(np.float64)).astype(np.float32)
    np.testing.assert_allclose(out["y"], expected, rtol=2e-7, atol=1e-45)
    np.testing.assert_allclose(out["total"], np.exp2(scores.astype(np.float64)).sum(), rtol=1e-6)



@pytest.mark.parametrize("where", [None, 5, 130, 199])  # in the 64-lane part (first, third block) or the tail
@pytest.mark.parametrize("special", [np.nan, np.inf, -np.inf])
def test_row_max_propagates_nan_and_keeps_infinities(where, special):
    """A row max runs as 64 lanes of plain max with NaNs kept aside: a NaN anywhere in the row
    (lanes or the remainder after 3 x 64) makes it NaN, as torch.amax and numpy do; infinities
    are ordinary values. As a reduction, and as the row value of a division and of a softmax."""
    x = rand(3, 200, seed=7)
    if where is not None:
        x[1, where] = special
    for build in (lambda t: t.amax(-1), lambda t: t / t.amax(-1, keepdim=True), lambda t: t.softmax(-1)):
        g = lm.Graph()
        build(g.tensor("x", (3, 200))).output("y")
        program = g.compile("cpu")
        reference = build(torch.from_numpy(x))
        np.testing.assert_allclose(program(x=x)["y"], reference.numpy(), rtol=1e-5, atol=1e-7)


@pytest.mark.parametrize("where", [None, 0, 9, 15, 16, 31])  # first, middle and last lane of both 16-steps
@pytest.mark.parametrize("special", [np.nan, np.inf])
def test_block_absmax_combines_its_lanes_by_halving_and_keeps_a_nan(where, special):
    """The absmax of int8 quantization's blocks of 32 keeps 16 partial maxima (and NaNs aside),
    combined by halving them (log2 steps, vector ops) rather than one after another: the result
    is numpy's, a NaN in any lane included."""
    x = rand(3, 4, 32, seed=11) - 0.5
    if where is not None:
        x[1, 2, where] = special
    g = lm.Graph()
    lm.absolute(g.tensor("x", (3, 4, 32))).amax(-1).output("y")
    program = g.compile("cpu")
    assert "lanes=16" in program.explain() and "w -= w / 2" in program.source
    np.testing.assert_array_equal(program(x=x)["y"], np.abs(x).max(-1))


def test_a_convolution_packs_its_window_rows_once_looping_over_their_digits():
    """conv2d lowers to one reduction whose row operand is a padded window of the input (a
    validity test, and index math dividing the row by the width and the step by the kernel
    size). With more output channels than one column block it is computed once into a buffer
    before the tiles, looping over the window's digits (row = h*W + w, step = c*9 + kh*3 + kw),
    so no element costs a division. The result matches torch."""
    g = lm.Graph()
    lm.conv2d(g.tensor("x", (2, 8, 12, 12)), g.tensor("w", (64, 8, 3, 3)), padding=1).output("y")
    program = g.compile("cpu")
    assert "rows packed" in program.explain()
    pack = program.source[program.source.index("*restrict rowbuf = "):program.source.index("#pragma omp parallel if")]
    assert not any(op in pack for op in (" / ", " % ", "lm_floordiv", "lm_mod")), pack
    x, w = rand(2, 8, 12, 12, seed=1), rand(64, 8, 3, 3, seed=2)
    want = torch.nn.functional.conv2d(torch.from_numpy(x), torch.from_numpy(w), padding=1).numpy()
    np.testing.assert_allclose(program(x=x, w=w)["y"], want, rtol=1e-4, atol=1e-4)
    big = lm.Graph()  # a batch whose windows would take more than PRECOMPUTED floats packs per column block
    lm.conv2d(big.tensor("x", (16, 64, 56, 56)), big.tensor("w", (64, 64, 3, 3)), padding=1).output("y")
    assert 16 * 56 * 56 * 64 * 9 > PRECOMPUTED and "rowbuf" not in big.compile("cpu").source


def test_a_convolutions_weight_gradient_computes_its_input_windows_once():
    """The weight gradient sums grad_out x input window over (batch, positions): its panel operand
    is a window of the input (validity tests, index math dividing column and step by constants).
    It is computed once, over its digits, before the tiles (each column block's pack copies it),
    and both gradients match torch's. With search off, explain lists each kernel on its own."""
    from luminar.autograd import grad
    g = lm.Graph()
    x, w = g.tensor("x", (2, 8, 10, 10)), g.tensor("w", (16, 8, 3, 3))
    loss = (lm.conv2d(x, w, padding=1) * g.tensor("dy", (2, 16, 10, 10))).sum()
    for name, t in zip(("gx", "gw"), grad(loss, [x, w])):
        t.output(name)
    program = g.compile("cpu")
    source = program.source
    pack = source[source.index("*restrict panbuf = "):source.index("#pragma omp parallel if", source.index("*restrict panbuf = "))]
    assert not any(op in pack for op in (" / ", " % ", "lm_floordiv", "lm_mod")), pack
    assert "same structure" not in program.explain()
    arrays = {"x": rand(2, 8, 10, 10, seed=1), "w": rand(16, 8, 3, 3, seed=2), "dy": rand(2, 16, 10, 10, seed=3)}
    tx, tw = (torch.from_numpy(arrays[n]).requires_grad_() for n in "xw")
    torch.nn.functional.conv2d(tx, tw, padding=1).backward(torch.from_numpy(arrays["dy"]))
    out = program(**arrays)
    np.testing.assert_allclose(out["gw"], tw.grad.numpy(), rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(out["gx"], tx.grad.numpy(), rtol=1e-4, atol=1e-4)

# -- integer and vector rendering of quantized weights ---------------------------------------------

def _unpack_exprs(g, q):
    """Nibble extraction as quant.py spells it once the (low, high) index is a constant: floor(q /
    16^h) fmod 16, floor written x - fmod(x, 1); plus fmods the integer rules must not take."""
    outs = {}
    for h in (0, 1):
        shifted = q * (1.0 / 16.0) ** h
        outs[f"nibble{h}"] = (shifted - shifted.fmod(1.0)).fmod(16.0)
    outs["mod4"] = q.fmod(4.0)                        # int8: negative dividends keep fmod's sign
    outs["frac"] = (q * 0.25).fmod(1.0)              # a fraction, exact in both spellings
    outs["not_power_of_two"] = (q * 0.3).fmod(1.0)   # must stay float arithmetic
    return outs


@pytest.mark.parametrize("dtype", ["uint8", "int8"])
def test_fmod_of_bytes_renders_as_integer_ops_bit_exactly(dtype):
    """fmod by powers of two of values loaded from byte buffers (how quantized weights unpack their
    nibbles) renders as & on ints where that is provably exact; every byte value gives results
    bit-identical to the reference backend (equal for int8, which keeps the float path)."""
    g = lm.Graph()
    q = g.tensor("q", (256,), dtype)
    for name, value in _unpack_exprs(g, q).items():
        value.output(name)
    values = (np.arange(256) - (128 if dtype == "int8" else 0)).astype(dtype)
    program = g.compile("cpu")
    got, want = program(q=values), g.compile("reference")(q=values)
    for name in want:  # (int8: the float path's fmod may give +0 where C's gives -0; equal values)
        exact = (lambda a: a.view(np.uint32)) if dtype == "uint8" else (lambda a: a)
        np.testing.assert_array_equal(exact(got[name]), exact(want[name]), err_msg=name)
    assert ("& 15)" in program.source) == (dtype == "uint8")  # int8 may be negative: no integer path


@pytest.mark.parametrize("qtype", ["Q4_1", "Q8_0"])
@pytest.mark.parametrize("rows", [1, 2])
def test_quantized_matvec_accumulates_blocks_in_vector_lanes(qtype, rows):
    """A decode-sized (1-3 rows) product with a quantized weight: each block's elements go to one
    vector of partial sums (bytes staged as integers first: int with AVX-512, short with AVX2),
    summed once at the end; results match the dequantized product. With AVX-512, 16 contiguous
    bytes are widened to ints in one register and stored whole (gcc's own staging loop stored
    32-byte halves that the 64-byte loads after it could not take from the store buffer on Intel
    cores: a third of the speed); Q4_1's nibble bytes, read at stride 1 per half block, too."""
    from luminar.io import quant
    tensor = Q4Tensor(40, 96)
    if qtype == "Q8_0":
        rng = np.random.default_rng(1)
        tensor.qtype, tensor.parts = "Q8_0", {"scale": (rng.standard_normal((40, 3)) * 0.05).astype(np.float16),
                                              "quants": rng.integers(-128, 128, (40, 3, 32), dtype=np.int8)}
    g = lm.Graph()
    w, feeds = quant.weight(g, "w", tensor)
    lm.linear(g.tensor("x", ("s", 96)), w).output("y")
    program = g.compile("cpu")
    assert re.search(r"(int|short) stage\d+\[", program.source) and "#pragma omp simd" in program.source
    widened = re.findall(r"_mm512_cvtep([iu])8_epi32", program.source)
    assert set(widened) == ({"i" if qtype == "Q8_0" else "u"} if cc.VECTOR_LANES == 16 else set())
    x = rand(rows, 96, seed=rows)
    np.testing.assert_allclose(program(x=x, **feeds)["y"], x @ quant.dequantize_parts(qtype, tensor.parts, (40, 96)).T,
                               rtol=1e-4, atol=1e-4)


# -- threads per call ----------------------------------------------------------------------------

def _chooser_run(chooser, key, threads_used, seconds_for):
    """One call through `chooser` whose duration depends on the thread count it was given."""
    import luminar.backends.cpu.program as cpu
    clock = {"t": 0.0}
    real = cpu.time.perf_counter
    cpu.time.perf_counter = lambda: clock["t"]
    try:
        chooser.run(key, lambda: clock.__setitem__("t", clock["t"] + seconds_for(threads_used[-1])))
    finally:
        cpu.time.perf_counter = real


def test_thread_chooser_drops_to_one_thread_when_two_are_slower():
    """A busy machine parks one of two threads at every parallel region: measured, one thread wins,
    and all threads are retried less and less often while they keep losing."""
    from luminar.backends.cpu.program import ThreadChooser
    used = []
    chooser = ThreadChooser(2, used.append)
    for _ in range(40):
        _chooser_run(chooser, "decode", used, lambda n: 1.0 if n == 2 else 0.02)
    assert used[:3] == [2, 2, 1] and used[-1] == 1  # (the first call warms up: not a sample)
    assert used.count(2) <= 7  # the first two calls, then trials after 2, 4, 8, 16 ... calls


def test_thread_chooser_keeps_all_threads_when_they_are_faster():
    from luminar.backends.cpu.program import ThreadChooser
    used = []
    chooser = ThreadChooser(2, used.append)
    for _ in range(40):
        _chooser_run(chooser, "prefill", used, lambda n: 0.01 if n == 2 else 0.02)
    assert used.count(1) == 2 and used[-1] == 2  # trials after 2 calls, then (lost 2x) after 32


def test_thread_chooser_ignores_a_slow_first_call_and_small_differences():
    """The first call (page faults, cold caches) is no sample, and one thread must be 15% faster
    to take over: timing noise alone never makes the count flap."""
    from luminar.backends.cpu.program import ThreadChooser
    used, calls = [], []

    def seconds(n):
        calls.append(n)
        return 1.0 if len(calls) == 1 else 0.010 if n == 2 else 0.0095
    chooser = ThreadChooser(2, used.append)
    for _ in range(40):
        _chooser_run(chooser, "step", used, seconds)
    assert used[-1] == 2 and used.count(1) <= 5


def test_thread_chooser_with_one_thread_does_not_touch_openmp():
    from luminar.backends.cpu.program import ThreadChooser
    used, calls = [], []
    ThreadChooser(1, used.append).run("k", lambda: calls.append(1))
    assert calls == [1] and used == []


def test_openmp_threads_spin_longer_before_sleeping_unless_the_user_set_it():
    """GOMP_SPINCOUNT is set before libgomp loads (see backends/cpu/cc.py), and a value already in
    the environment wins."""
    code = "import os, luminar.backends.cpu.cc; print(os.environ['GOMP_SPINCOUNT'])"
    env = {k: v for k, v in os.environ.items() if k != "GOMP_SPINCOUNT"}
    ours = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    theirs = subprocess.run([sys.executable, "-c", code], env={**env, "GOMP_SPINCOUNT": "1000"},
                            capture_output=True, text=True, check=True)
    assert (ours.stdout.strip(), theirs.stdout.strip()) == ("3000000", "1000")


def test_a_kernel_with_one_thread_share_runs_unthreaded():
    """A row norm threads over its rows: with one row (a decode step's) the region would be a fork
    and a join for one iteration, so its `if` clause also asks for more than one share. The same
    compiled kernel threads a prompt's rows, and both match torch."""
    g = lm.Graph()
    x, w = g.tensor("x", ("s", 4096)), g.tensor("w", (4096,))
    (x * (x * x).mean(-1, keepdim=True).add(1e-6).rsqrt() * w).output("y")
    program = g.compile("cpu")
    pragma = next(line for line in program.source.splitlines() if "#pragma omp parallel for" in line)
    assert re.search(r"if\(.* >= \d+ && \(lm_dim_s\) > 1\)", pragma), pragma
    wa = rand(4096)
    for rows in (1, 16):
        xa = rand(rows, 4096)
        expected = torch.nn.functional.rms_norm(torch.from_numpy(xa), (4096,), torch.from_numpy(wa), eps=1e-6)
        np.testing.assert_allclose(program.run({"x": xa, "w": wa})["y"], expected.numpy(), rtol=1e-5, atol=1e-5)
