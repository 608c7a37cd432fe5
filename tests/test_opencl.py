"""The opencl backend, run on whatever OpenCL device there is (in CI: the CPU, through PoCL).

Conformance: a representative set of the op tests other files run on "reference" and "cpu",
called here with backend="opencl" (same cases, same torch references), compiled autograd
cases, and a small random Llama's logits against transformers. Then what is the opencl
backend's own: every kernel form against the plain one, the search on the device, device-
resident state, symbolic dims, errors. PoCL compiles slowly (a program ~0.5 s, each kernel's
first launch ~0.3 s on an idle machine), so cases are chosen to cover each form once or twice.
Skipped, with the reason, where no OpenCL device is found.
"""
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
    small_llama_matches_transformers("opencl", tmp_path)


# -- the kernel forms ---------------------------------------------------------------------------------
from luminar.backends.opencl.bench import Bench  # noqa: E402
from luminar.backends.opencl.schedules import Grid, Rows, Tiled  # noqa: E402
from luminar.compiler.analysis import plan_tiles  # noqa: E402
from luminar.compiler.kernels import Load, lower  # noqa: E402
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

    def off_by_one(program, kernel, schedule=None, name=None):  # the second variant adds 1 to every output
        source = render(program, kernel, schedule, name=name)
        return source.replace(f"b{kernel.out}[lm_flat] = ", f"b{kernel.out}[lm_flat] = 1.0f + ") \
            if name == "lm_variant1" else source
    monkeypatch.setattr(bench_module, "render_kernel", off_by_one)
    program, kernel = _kernel(lambda g: (g.tensor("x", (300, 40)).exp() * 2.0).output("y"))  # sampled: > 4096 outputs
    assert Bench(program, kernel, [Grid(), Grid(local=32), Grid(local=128)], {}, seed=0).validate() == [True, False, True]


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
    g = lm.Graph()
    w, x = g.tensor("w", (4,)), g.tensor("x", (4,))
    g.update(w, w - x * 0.5)
    (w * 1.0).sum().output("total")
    program = g.compile("opencl").set_inputs(w=np.ones(4, np.float32))
    step = np.array([1, 2, 3, 4], np.float32)
    for k in range(1, 4):
        out = program(x=step)
        np.testing.assert_allclose(program.state["w"], 1 - 0.5 * k * step)
        np.testing.assert_allclose(out["total"], (1 - 0.5 * (k - 1) * step).sum())
    held = program._inputs["w"]
    assert held[0] is program.state["w"]  # the device buffer holds the host array's value: no upload next call


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
