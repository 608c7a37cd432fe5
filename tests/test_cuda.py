"""The cuda backend: every kernel it writes compiles with NVRTC for sm_90, with or without a GPU.

Without a GPU (CI), `g.compile("cuda")` is a DeviceError naming the missing driver, so the
conformance cases (tests/conformance.py: the op tests of other files the opencl backend runs)
and a random Llama run on the reference backend while every graph they build is also compiled
for the cuda target: rendered as CUDA C, compiled by NVRTC to an sm_90 cubin, and checked for
compiler errors and register spills (ptxas's report). So are a sample of each search space's
candidates, the tensor-core forms among them. With a GPU (the GPU check, bench/gpu.py), the
same cases run on it against their torch references, and the runtime's own tests run.
Skipped, with the reason, where NVRTC cannot be loaded (pip install luminar[cuda]).
"""
import json

import numpy as np
import pytest

import luminar as lm
from luminar.compiler.target import CompilerError

try:
    from luminar.backends.cuda import nvrtc
    NVRTC = nvrtc.version()
except CompilerError as e:
    pytest.skip(f"NVRTC is not available: {e}", allow_module_level=True)

from conformance import CONFORMANCE, small_llama_matches_transformers  # noqa: E402
from conformance import kv_cache_stays_on_the_device, train_step_keeps_its_state_on_the_device  # noqa: E402
from conformance import updated_state_stays_on_the_device  # noqa: E402
from conftest import rand  # noqa: E402
from luminar.backends.cuda import CUDATarget, DeviceError  # noqa: E402
from luminar.backends.cuda import driver  # noqa: E402
from luminar.backends.cuda.mma import Mma, from_tile, precisions  # noqa: E402
from luminar.backends.cuda.wgmma import Wgmma  # noqa: E402
from luminar.backends.cuda.mma import operands as _operands  # noqa: E402
from luminar.compiler.analysis import plan_tiles  # noqa: E402
from luminar.backends.opencl.schedules import Grid, Rows, Tiled  # noqa: E402
from luminar.compiler import search  # noqa: E402
from luminar.compiler.kernels import lower  # noqa: E402
from luminar.compiler.passes import optimize  # noqa: E402
from luminar.compiler.pipeline import compile_graph  # noqa: E402

try:
    GPU = driver.device()
except DeviceError as e:
    GPU, NO_GPU = None, str(e)
else:
    NO_GPU = ""
needs_gpu = pytest.mark.skipif(GPU is None, reason=f"no CUDA GPU ({NO_GPU})")


def _checked(built, graph_name: str) -> None:
    """Every function of a built program compiled, none spilling registers (ptxas's report)."""
    usage = built.cubin.usage
    functions = {f for call in built.calls for f in call.functions}
    assert functions <= set(usage), f"{graph_name}: ptxas reported no usage for {sorted(functions - set(usage))}"
    spilled = {f: u for f, u in usage.items() if u.spills}
    assert not spilled, f"{graph_name}: register spills in {spilled}"


@pytest.fixture
def cuda_kernels(monkeypatch, tmp_path):
    """backend="cuda" as the cases call it: on a GPU, the real backend; without one, every graph
    compiled (and checked) for the cuda target, then run on the reference backend so the case's
    comparison with torch still runs. Yields the list of programs built for cuda."""
    monkeypatch.setenv("LUMINAR_CACHE", str(tmp_path))
    built = []
    if GPU is None:
        original = lm.Graph.compile

        def compile(self, backend="reference", **options):
            if backend != "cuda":
                return original(self, backend, **options)
            passes = {k: options.pop(k) for k in ("passes",) if k in options}
            compiled = compile_graph(optimize(self, **passes), CUDATarget(allow_tf32=options.get("allow_tf32", False)))
            _checked(compiled.built, "graph")
            built.append(compiled.built)
            return original(self, "reference", **passes)
        monkeypatch.setattr(lm.Graph, "compile", compile)
    return built


def _case_id(case) -> str:
    fn, params = case
    return fn.__name__.removeprefix("test_")[:40] + "".join(f"-{v}" for v in params.values())


@pytest.mark.parametrize("case", CONFORMANCE, ids=[_case_id(c) for c in CONFORMANCE])
def test_op_conformance_kernels_compile_for_sm_90(case, cuda_kernels):
    fn, params = case
    fn(backend="cuda", **params)
    assert GPU is not None or cuda_kernels, "the case built no graph for cuda"
    for built in cuda_kernels:
        assert built.cubin.arch == "sm_90" and built.cubin.image[:4] == b"\x7fELF"  # a cubin, not PTX


@pytest.mark.slow
def test_small_llama_kernels_compile_and_logits_match_transformers(tmp_path, cuda_kernels):
    """A 2-layer random Llama (test_llama's): every kernel of its graph compiles for sm_90 without
    spills; the logits (on the GPU when there is one) match transformers, also through the KV cache."""
    model, ids = small_llama_matches_transformers("cuda", tmp_path)
    assert GPU is not None or len(cuda_kernels) == 1  # (the model's one graph)
    if GPU is not None:
        kv_cache_stays_on_the_device(model, ids)


# -- the schedule space, its tensor-core forms, and their compilation -----------------------------
def _program(build):
    g = lm.Graph()
    build(g)
    return lower(optimize(g))


def _matmul(g, dtype="float32"):
    a, b = g.tensor("a", (256, 192), dtype=dtype), g.tensor("b", (320, 192), dtype=dtype)
    (a @ b.transpose(0, 1) + 1.0).output("c")


def _attention(g, seq=256, dim=64):
    """Naive causal attention over 8 heads (bench/opencl.py's)."""
    q, k, v = (g.tensor(n, (8, seq, dim)) for n in "qkv")
    visible = g.arange(seq).unsqueeze(1) >= g.arange(seq).unsqueeze(0)
    scores = (q @ k.transpose(-1, -2)) * (1.0 / dim ** 0.5)
    (scores.masked_fill(1.0 - visible, -1e30).softmax(-1) @ v).output("o")


SPACES = {"matmul": _matmul, "bf16 matmul": lambda g: _matmul(g, "bfloat16"), "attention": _attention,
          "softmax": lambda g: g.tensor("x", (64, 1000)).softmax(-1).output("y")}


@pytest.mark.parametrize("allow_tf32", [False, True], ids=["fp32", "tf32"])
@pytest.mark.parametrize("name", list(SPACES))
def test_a_sample_of_the_search_space_compiles_without_spills(name, allow_tf32, tmp_path, monkeypatch):
    """The candidates the search would time for each kernel (sampled from the saturated e-graph,
    ranked, spread over families), all rendered into one source, compile for sm_90 without a
    spill; the tensor-core forms are among them where they apply."""
    monkeypatch.setenv("LUMINAR_CACHE", str(tmp_path))
    program, target = _program(SPACES[name]), CUDATarget(allow_tf32=allow_tf32)
    env, kinds = {"s": 256}, set()
    for kernel in program.kernels:
        sp = target.space(kernel, env)
        if sp is None:
            continue
        nests = search.sample(search.saturate(target, sp), 200, 0, target.viable(kernel, sp),
                              lambda nest: target.to_schedule(nest, kernel, sp) is not None)
        found = {target.to_schedule(n, kernel, sp) for n in nests}
        ranked = sorted(found, key=lambda s: target.estimate(program, kernel, s, env))
        picked = [target.default_schedule(kernel)] + search.pick(target, ranked, 11)
        kinds |= {(s.kind, getattr(s, "precision", None)) for s in picked}
        legal = [s for s in picked if target.legal(program, kernel, s)]
        built = target.build(program, {kernel.name: legal})
        _checked(built, f"{name}: {kernel.name}")
        assert len({f for call in built.calls for f in call.functions}) >= len(set(legal))
    if name == "bf16 matmul":
        assert ("mma", "bf16") in kinds
    if name in ("matmul", "bf16 matmul"):
        assert (("mma", "tf32") in kinds) == allow_tf32 and ("tiled", None) in kinds


def test_tensor_core_precision_follows_the_user_and_the_operands():
    """float32 stays float32: TF32 only with allow_tf32=True (PyTorch's convention); BF16 only
    where both operands are bfloat16 values, so it is exact."""
    fp32, bf16 = _program(_matmul), _program(lambda g: _matmul(g, "bfloat16"))
    k32, k16 = fp32.kernels[0], bf16.kernels[0]
    assert precisions(fp32, k32, allow_tf32=False) == [] and precisions(fp32, k32, allow_tf32=True) == ["tf32"]
    assert precisions(bf16, k16, allow_tf32=False) == ["bf16"]
    assert isinstance(CUDATarget().default_schedule(k32), Tiled)
    assert CUDATarget(allow_tf32=True).default_schedule(k32) == Mma(precision="tf32")
    assert not CUDATarget().legal(fp32, k32, Mma(precision="bf16")) and CUDATarget().legal(bf16, k16, Mma(precision="bf16"))
    softmax = _program(SPACES["softmax"])
    assert precisions(softmax, softmax.kernels[-1], allow_tf32=True) == []  # not matmul-shaped
    # a cached choice in a precision the program may not use is never built: the default is
    built = CUDATarget().build(fp32, {k32.name: [Mma(precision="bf16")]})
    assert "mma.sync" not in built.source.split("#endif", 1)[1] and built.calls[0].schedules == [Tiled()]
    built = CUDATarget(allow_tf32=True).build(fp32, {})
    assert "lm_mma_tf32(lm_acc" in built.source and isinstance(built.calls[0].schedules[0], Mma)


def test_tensor_core_tiles_cover_a_block_with_whole_warps():
    mma = from_tile(wi=8, wj=8, ri=4, rj=2, kt=16, precision="bf16")  # 64 threads over 32x16 outputs
    assert mma == Mma(wm=2, wn=1, tm=1, tn=2, kt=16, precision="bf16") and mma.block == (32, 16)
    assert mma.threads == 64
    assert from_tile(4, 4, 2, 2, 16, "tf32") is None  # 16 threads: not a warp
    assert from_tile(8, 8, 2, 2, 8, "bf16") is None  # bf16 steps by 16
    assert from_tile(8, 4, 1, 4, 16, "tf32") is None  # 8 rows: not a 16-row tile
    assert not Mma(4, 4, 4, 4, 64, "tf32").legal()  # 256x128 block at 64 steps: over 48 KB of shared memory


def test_wgmma_forms_compile_for_sm_90a_without_spills_and_other_programs_stay_sm_90(tmp_path, monkeypatch):
    """A program with a wgmma kernel is compiled for sm_90a (the helpers exist only there), each
    width and precision without a register spill; without one, for sm_90 as before."""
    monkeypatch.setenv("LUMINAR_CACHE", str(tmp_path))
    for build, precision in ((_matmul, "tf32"), (lambda g: _matmul(g, "bfloat16"), "bf16")):
        program = _program(build)
        forms = [Wgmma(1, 32, 16, precision), Wgmma(1, 64, 32, precision), Wgmma(2, 128, 16, precision)]
        built = CUDATarget(allow_tf32=True).build(program, {program.kernels[0].name: forms})
        _checked(built, f"wgmma {precision}")
        assert built.cubin.arch == "sm_90a" and built.calls[0].schedules == forms
        assert built.source.count(f"lm_wgmma_{precision}_n") >= 3 + len(forms)  # (the helpers, then each kernel's call)
    plain = CUDATarget(allow_tf32=True).build(program, {})
    assert plain.cubin.arch == "sm_90" and "wgmma" not in plain.calls[0].schedules[0].describe()


def test_wgmma_is_legal_on_hopper_in_the_precisions_the_user_allows():
    from luminar.backends.cuda.target import H200, Device
    from luminar.backends.cuda.wgmma import from_tile as wgmma_from_tile
    fp32, bf16 = _program(_matmul), _program(lambda g: _matmul(g, "bfloat16"))
    ampere = Device("an A100", "sm_80", 108, 1024, 48 * 1024)
    assert CUDATarget(H200, allow_tf32=True).legal(fp32, fp32.kernels[0], Wgmma(precision="tf32"))
    assert not CUDATarget(H200).legal(fp32, fp32.kernels[0], Wgmma(precision="tf32"))  # TF32 not allowed
    assert not CUDATarget(H200).legal(fp32, fp32.kernels[0], Wgmma(precision="bf16"))  # float32 operands
    assert CUDATarget(H200).legal(bf16, bf16.kernels[0], Wgmma(precision="bf16"))
    assert not CUDATarget(ampere).legal(bf16, bf16.kernels[0], Wgmma(precision="bf16"))  # no sm_90a there
    assert CUDATarget(ampere).arch([Wgmma()]) == "sm_90a" and CUDATarget(ampere).arch([Tiled()]) == "sm_80"
    marks = lambda target: {f[1] for f in target.space(bf16.kernels[0], {}).facts if f[0] == "mma"}  # noqa: E731
    assert marks(CUDATarget(H200)) == {"mma-bf16", "wgmma-bf16"} and marks(CUDATarget(ampere)) == {"mma-bf16"}
    # the search's tiles that are one warpgroup per 64 rows: 16 x 8 threads of 4 x 4 outputs
    assert wgmma_from_tile(16, 8, 4, 4, 16, "bf16") == Wgmma(1, 32, 16, "bf16")
    assert wgmma_from_tile(8, 16, 4, 4, 16, "bf16") is None and wgmma_from_tile(16, 8, 4, 4, 12, "bf16") is None
    assert not Wgmma(1, 48, 16, "tf32").legal() and not Wgmma(8, 128, 32, "tf32").legal()  # (a width not offered; too much shared memory)


def test_schedules_round_trip_through_the_tuning_cache_json():
    target = CUDATarget()
    for schedule in (Grid(128), Rows(256), Tiled(wi=4, wj=16, ri=2, rj=4, kt=8), Mma(1, 2, 2, 2, 32, "bf16"),
                     Wgmma(2, 64, 16, "tf32")):
        data = json.loads(json.dumps(target.schedule_to_json(schedule)))
        assert target.schedule_from_json(data) == schedule


# -- the cuda-only forms, emulated on the CPU ---------------------------------------------------------
import cuda_emulate  # noqa: E402

needs_gxx = pytest.mark.skipif(not cuda_emulate.available(), reason="no g++ with C++20 <barrier> for the CUDA emulation")


def _ragged_matmul(dtype: str, batch: int | None):
    """(program, kernel, inputs, float64 reference): 37 x 29 outputs over 45 steps (no tile
    divides them), an epilogue, and for float32 computed operands (staged as the IR computes them)."""
    g = lm.Graph()
    lead = (batch,) if batch else ()
    x, w = g.tensor("x", (*lead, 37, 45), dtype=dtype), g.tensor("w", (*lead, 29, 45), dtype=dtype)
    rng = np.random.default_rng(4)
    xs, ws = rng.standard_normal((*lead, 37, 45)).astype(np.float32), rng.standard_normal((*lead, 29, 45)).astype(np.float32)
    if dtype == "bfloat16":
        (x @ w.transpose(-1, -2) + 1.0).output("y")
        bits = [(a.view(np.uint32) >> 16).astype(np.uint16) for a in (xs, ws)]
        xs, ws = [(b.astype(np.uint32) << 16).view(np.float32) for b in bits]
        inputs = dict(zip("xw", bits))
        want = xs.astype(np.float64) @ np.swapaxes(ws, -1, -2) + 1.0
    else:
        ((x * 2.0 + 1.0) @ (w.transpose(-1, -2) * 0.5) + 1.0).output("y")
        inputs = {"x": xs, "w": ws}
        want = (xs.astype(np.float64) * 2 + 1) @ (np.swapaxes(ws, -1, -2) * 0.5) + 1.0
    program = lower(optimize(g))
    ids = {program.buffers[b].name: b for b in range(len(program.buffers)) if program.buffers[b].name in inputs}
    return program, program.kernels[0], {ids[n]: a.ravel() for n, a in inputs.items()}, want


@needs_gxx
@pytest.mark.parametrize("schedule, dtype, batch", [
    (Mma(2, 2, 2, 4, 32, "tf32"), "float32", None), (Mma(1, 2, 1, 4, 8, "tf32"), "float32", 3),
    (Mma(2, 1, 1, 2, 16, "bf16"), "bfloat16", None), (Mma(1, 1, 2, 1, 32, "bf16"), "bfloat16", 2),
    (Wgmma(1, 32, 16, "tf32"), "float32", None), (Wgmma(2, 64, 8, "tf32"), "float32", 3),
    (Wgmma(1, 64, 16, "bf16"), "bfloat16", None), (Wgmma(1, 32, 32, "bf16"), "bfloat16", 2)],
    ids=["tf32-64x64", "tf32-16x64-batched", "bf16-32x16", "bf16-32x8-batched",
         "wgmma-tf32-64x32", "wgmma-tf32-128x64-batched", "wgmma-bf16-64x64", "wgmma-bf16-64x32-batched"])
def test_tensor_core_forms_compute_the_matmul_in_an_emulation_of_cuda(schedule, dtype, batch, tmp_path):
    """Fragments, staging (zeros past the reduction's end; wgmma's panel in the tensor cores'
    core-matrix layout, read through its descriptor), bounds, batches and the epilogue: the mma
    and wgmma forms' CUDA C run by tests/cuda_emulate.py against float64 numpy. TF32 rounds
    operands to 10-bit mantissas; BF16 on bfloat16 values is exact up to float32 sums."""
    program, kernel, inputs, want = _ragged_matmul(dtype, batch)
    assert _operands(kernel, plan_tiles(kernel)) is not None
    got = cuda_emulate.run(program, kernel, schedule, inputs, {}, tmp_path).reshape(want.shape)
    scale = np.abs(want).max()
    tolerance = 2e-3 if schedule.precision == "tf32" else 1e-6
    assert np.abs(got - want).max() <= tolerance * scale, np.abs(got - want).max() / scale


@needs_gxx
def test_the_split_reduction_combines_every_block_in_an_emulation_of_cuda(tmp_path):
    """A sum to a scalar and a max to 4 outputs (symbolic length, an epilogue), each over more
    steps than the blocks' threads cover in one pass; launched twice (the counters reset)."""
    from luminar.backends.cuda.split import Split
    g = lm.Graph()
    a = g.tensor("a", (70_001,))
    (a * a + 1.0).sum().output("s")
    x = g.tensor("x", (4, "n"))
    (x.amax(-1) * 2.0).output("m")
    program = lower(optimize(g))
    rng = np.random.default_rng(5)
    arrays = {0: rng.standard_normal(70_001).astype(np.float32)}
    got = [cuda_emulate.run(program, program.kernels[0], Split(8, 64), arrays, {"n": 70_003}, tmp_path) for _ in range(2)]
    want = (arrays[0].astype(np.float64) ** 2 + 1).sum()
    assert abs(got[0][0] - want) <= 1e-5 * want and got[0][0] == got[1][0]  # deterministic
    xs = rng.standard_normal((4, 70_003)).astype(np.float32)
    x_id = next(b for b in range(len(program.buffers)) if program.buffers[b].name == "x")
    out = cuda_emulate.run(program, program.kernels[1], Split(4, 32), {x_id: xs.ravel()}, {"n": 70_003}, tmp_path)
    np.testing.assert_array_equal(out, xs.max(-1) * 2)


# -- the online-softmax (flash) attention form ------------------------------------------------------
from conformance import fused_attention, search_fuses_attention_into_the_online_form  # noqa: E402
from luminar.backends.opencl.schedules import Online  # noqa: E402
from luminar.backends.opencl.space import ONLINE_FORMS  # noqa: E402
from test_fusion import attention_inputs, causal_attention_of_any_length, fuse  # noqa: E402,F401  (fuse: a fixture)


@pytest.mark.parametrize("shape", [dict(heads=8, rows=4096, keys=4096, dim=64, mask="causal"),  # the GPU check's
                                   dict(heads=1, rows=1, keys=200, dim=64, mask=None),  # a decode step
                                   dict(heads=2, rows=40, keys=40, dim=128, mask="input")],  # a wide head
                         ids=["causal-4096", "one-row", "head-128"])
def test_the_cuda_target_offers_the_online_attention_forms_and_they_compile_without_spills(shape, tmp_path, monkeypatch):
    """A fused softmax region gets the opencl target's flash blocks that fit the device's blocks
    and 48 KB of shared memory, the others pruned with the reason; each compiles for sm_90
    (NVRTC) without a register spill."""
    monkeypatch.setenv("LUMINAR_CACHE", str(tmp_path))
    program, kernel = fused_attention(**shape)
    target = CUDATarget()
    runnable, pruned = target.fused_schedules(kernel, ["online"], {})
    assert runnable and set(runnable) | {p[0] for p in pruned} <= set(ONLINE_FORMS) | {s.describe() for s in ONLINE_FORMS}
    assert len(runnable) + len(pruned) == len(ONLINE_FORMS) and all("pruned" in p[2] for p in pruned)
    assert target.fused_schedules(kernel, ["inlined"], {}) == ([], [])  # (only the online form is a GPU kernel)
    built = target.build(program, {kernel.name: runnable})
    _checked(built, f"online attention {shape}")
    (call,) = [c for c in built.calls if c.kernel.name == kernel.name]
    assert call.schedules == runnable and len(set(call.functions)) == len(runnable)
    assert "__shared__ float lm_q[" in built.source and "__syncthreads();" in built.source


def _attention_reference(arrays: dict, mask: str | None) -> np.ndarray:
    """softmax(q k^T / sqrt(d) masked) v in float64 (a 0/1 mask input: 1 = masked; causal: the last rows')."""
    q, k, v = (arrays[n].astype(np.float64) for n in "qkv")
    rows, keys = q.shape[1], k.shape[1]
    scores = q @ k.transpose(0, 2, 1) / np.sqrt(q.shape[-1])
    if mask == "causal":
        scores = np.where(np.arange(keys)[None, :] > np.arange(rows)[:, None] + keys - rows, -1e30, scores)
    elif mask == "input":
        scores = np.where(arrays["m"] > 0, -1e30, scores)
    e = np.exp(scores - scores.max(-1, keepdims=True))
    return (e / e.sum(-1, keepdims=True)) @ v


@needs_gxx
@pytest.mark.parametrize("shape", [dict(heads=2, rows=40, keys=40, dim=32, mask="causal"),
                                   dict(heads=3, rows=70, keys=130, dim=16, mask="input"),  # ragged blocks, a row all masked
                                   dict(heads=1, rows=1, keys=200, dim=64, mask=None)],  # a decode step
                         ids=["causal", "ragged-masked", "one-row"])
def test_the_online_form_computes_attention_in_an_emulation_of_cuda(shape, tmp_path):
    """The flash form's CUDA C (shared-memory staging, the lanes of a row combining their max and
    sum, the skipped masked blocks, the epilogue) run by the emulation, two block shapes, against
    float64 numpy attention."""
    program, kernel = fused_attention(**shape)
    arrays = attention_inputs(**shape)
    ids = {program.buffers[b].name: b for b in range(len(program.buffers))}
    inputs = {ids[n]: a.ravel() for n, a in arrays.items()}
    for before in program.kernels[:program.kernels.index(kernel)]:  # (the mask's kernel, in its default form)
        inputs[before.out] = cuda_emulate.run(program, before, CUDATarget().default_schedule(before), inputs, {}, tmp_path)
    want = _attention_reference(arrays, shape["mask"]).reshape(-1)
    for schedule in (Online(16, 32, 4), Online(8, 64, 8)):
        got = cuda_emulate.run(program, kernel, schedule, inputs, {}, tmp_path)
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5, err_msg=schedule.describe())


@needs_gxx
def test_the_online_form_with_a_symbolic_length_launched_for_a_rounded_length_in_an_emulation(tmp_path):
    """As the runtime launches it (the grid sized for the length rounded up to a power of two,
    the kernel reading the real one from the dims array): the extra row blocks store nothing."""
    g = causal_attention_of_any_length(heads=2, dim=32)
    from luminar.compiler.kernels import Lowering
    from luminar.compiler.online import fusion_regions, online_plan
    lowering = Lowering(optimize(g))
    lowering.run()
    program = Lowering(lowering.graph, frozenset().union(*(r for _, r in fusion_regions(lowering)))).run()
    (kernel,) = [kk for kk in program.kernels if online_plan(kk) is not None]
    arrays = attention_inputs(heads=2, rows=37, keys=37, dim=32, seed=3)
    ids = {program.buffers[b].name: b for b in range(len(program.buffers))}
    got = cuda_emulate.run(program, kernel, Online(16, 32, 4), {ids[x]: arrays[x].ravel() for x in "qkv"},
                           {"s": 37}, tmp_path, launched={"s": 64})
    np.testing.assert_allclose(got, _attention_reference(arrays, "causal").reshape(-1), rtol=1e-4, atol=1e-5)


@needs_gxx
def test_vector_load_forms_compile_and_compute_the_matvec_in_an_emulation_of_cuda(tmp_path, monkeypatch):
    """The opencl forms' vector loads in the CUDA dialect's spelling (a float4 read through a cast
    of a 16-byte aligned address): they compile for sm_90 without a spill, and the emulated kernel
    is the plain form's result, bit for bit (each step computed from its lane in the serial order)."""
    monkeypatch.setenv("LUMINAR_CACHE", str(tmp_path))
    g = lm.Graph()
    (g.tensor("x", (3, 256)) @ g.tensor("w", (48, 256)).transpose(0, 1)).output("y")
    program = lower(optimize(g))
    kernel = program.kernels[0]
    built = CUDATarget().build(program, {kernel.name: [Grid(64, 4)]})
    assert "(const float4 *)" in built.source
    _checked(built, "matvec")
    rng = np.random.default_rng(4)
    arrays = {b.id: rng.standard_normal(int(b.numel.value)).astype(np.float32) for b in program.buffers
              if b.name in ("x", "w")}
    vector, plain = (cuda_emulate.run(program, kernel, s, arrays, {}, tmp_path) for s in (Grid(64, 4), Grid(64)))
    x, w = (arrays[b.id].reshape(-1, 256) for b in program.buffers if b.name in ("x", "w"))
    np.testing.assert_allclose(vector.reshape(3, 48), x @ w.T, rtol=1e-4, atol=1e-4)
    assert np.array_equal(vector, plain)


@needs_gxx
def test_sub_group_reductions_compile_and_compute_the_softmax_in_an_emulation_of_cuda(tmp_path, monkeypatch):
    """The Rows form combining row values by warp shuffles (__shfl_xor_sync butterflies, then the
    warps' values in order): it compiles for sm_90 without a spill, and the emulated softmax
    matches numpy and the local-memory form (work-groups of one warp and of several)."""
    monkeypatch.setenv("LUMINAR_CACHE", str(tmp_path))
    g = lm.Graph()
    g.tensor("x", (5, 300)).softmax(-1).output("y")
    program = lower(optimize(g))
    kernel = program.kernels[0]
    forms = [Rows(32, subgroups=True), Rows(128, 4, subgroups=True)]
    built = CUDATarget().build(program, {kernel.name: forms})
    assert "__shfl_xor_sync" in built.source
    _checked(built, "softmax")
    x = np.random.default_rng(6).standard_normal((5, 300)).astype(np.float32) * 3
    e = np.exp(x.astype(np.float64) - x.max(-1, keepdims=True))
    plain = cuda_emulate.run(program, kernel, Rows(64), {0: x.ravel()}, {}, tmp_path)
    for form in forms:
        got = cuda_emulate.run(program, kernel, form, {0: x.ravel()}, {}, tmp_path)
        np.testing.assert_allclose(got.reshape(5, 300), e / e.sum(-1, keepdims=True), rtol=1e-5, atol=1e-7)
        np.testing.assert_allclose(got, plain, rtol=1e-6, atol=1e-8)


# -- NVRTC ---------------------------------------------------------------------------------------
def test_compiled_cubins_are_cached_by_source_options_and_nvrtc_version(tmp_path, monkeypatch):
    monkeypatch.setenv("LUMINAR_CACHE", str(tmp_path))
    source = 'extern "C" __global__ void k(float *a) { a[threadIdx.x] *= 2.0f; }\n'
    first = nvrtc.compile_cubin(source)
    assert not first.cached and first.usage["k"].registers > 0 and not first.usage["k"].spills
    again = nvrtc.compile_cubin(source)
    assert again.cached and again.image == first.image and again.usage == first.usage
    assert not nvrtc.compile_cubin(source, "sm_80").cached  # another architecture, another entry
    assert len(list((tmp_path / "cuda").glob("*.cubin"))) == 2 and not list((tmp_path / "cuda").glob("*.tmp"))


def test_a_rejected_source_is_a_compiler_error_quoting_its_numbered_lines(tmp_path, monkeypatch):
    monkeypatch.setenv("LUMINAR_CACHE", str(tmp_path))
    program = _program(lambda g: g.tensor("x", (4, 8)).exp().output("y"))
    broken = render_source(program, Grid()).replace("exp2f(", "exp2_typo(")
    with pytest.raises(CompilerError) as error:
        nvrtc.compile_cubin(broken)
    message = str(error.value)
    line = next(n for n, text in enumerate(broken.splitlines(), 1) if "exp2_typo" in text)
    assert f"{line:5d}> " in message and "exp2_typo" in message and "identifier" in message and "sm_90" in message
    assert list((tmp_path / "cuda").glob("*.failed.cu"))  # the source kept for a bug report


def test_a_register_spill_is_reported():
    """The spill check can fail: the tensor-core form capped at 32 registers spills."""
    source = render_source(_program(_matmul), Mma(2, 2, 2, 4, 32, "tf32"))
    usage = nvrtc.compile_cubin(source, options=("--maxrregcount=32",)).usage
    assert any(u.spills for u in usage.values())
    assert not any(u.spills for u in nvrtc.compile_cubin(source).usage.values())


def render_source(program, schedule) -> str:
    from luminar.backends.cuda.dialect import CUDA
    from luminar.backends.opencl.render import render_program
    return render_program(program, {program.kernels[0].name: schedule}, CUDA)[0]


# -- without a GPU ------------------------------------------------------------------------------------
@pytest.mark.skipif(GPU is not None, reason="a CUDA GPU is present")
def test_no_gpu_is_a_device_error_naming_the_missing_driver():
    g = lm.Graph()
    (g.tensor("x", (3,)) * 2.0).output("y")
    with pytest.raises(DeviceError, match="libcuda|driver|CUDA device"):
        g.compile("cuda")
    with pytest.raises(DeviceError):
        driver.device()


def test_unknown_options_are_refused():
    g = lm.Graph()
    (g.tensor("x", (3,)) * 2.0).output("y")
    with pytest.raises(lm.errors.UnsupportedError, match="allow_tf32"):
        g.compile("cuda", allow_tf33=True)


# -- the runtime on a stand-in driver ---------------------------------------------------------------
STUB_RUN = r"""
import ctypes, gc, json, sys
import numpy as np
import luminar as lm
from luminar.backends.cuda import DeviceError
from luminar.backends.cuda.bench import Bench
stub = ctypes.CDLL("libcuda.so.1")  # (the stand-in: the same library cuda-bindings loaded)
count = lambda name: ctypes.c_long.in_dll(stub, name).value
g = lm.Graph()
x, w, p = g.tensor("x", ("s", 64)), g.tensor("w", (64, 32)), g.tensor("p", (32,))
y = (x @ w).softmax(-1)
y.output("y")
g.update(p, p + y.sum(0))
program = g.compile("cuda").set_inputs(w=np.ones((64, 32), np.float32), p=np.zeros(32, np.float32))
report = {"arch": program.device.target.arch, "sms": program.device.target.sms}
for s in (5, 6, 9):  # (5 and 6: one bucket, launched alike; 9: the next)
    report.setdefault("shapes", []).append(program(x=np.full((s, 64), s, np.float32))["y"].shape)
    report.setdefault("updates", []).append(program.graph_updates)
    report.setdefault("dims", []).append(ctypes.c_longlong.from_address(program._dims_buffer).value)  # (host memory here)
kp, state_out = program.kernels, program.graph.updates["p"]
report["state_nodes"] = sum(kp.inputs["p"] in call.buffers or kp.outputs[state_out] in call.buffers for call, _ in program._calls)
last = program._calls[-1][0]  # (the state update: its node was the last one updated)
args = (ctypes.c_ulonglong * 32).in_dll(stub, "stub_last_args")
report["last_args"] = list(args[:ctypes.c_int.in_dll(stub, "stub_last_nargs").value])
report["expected_args"] = 2 * len(last.buffers) + 1, program._dims_buffer
report.update({name: count("stub_" + name) for name in ("graphs", "nodes", "node_updates", "replays", "launches")})
report["graph_updates"], report["replays_kept"] = program.graph_updates, len(program._replays)
held = list(program._pointers)
try:
    program._allocate(1 << 40)
except DeviceError as e:
    report["oom"] = str(e)
report["leaked_on_oom"] = program._pointers != held
program.replay(2)
report["replays_after"] = count("stub_replays")
kernel = program.kernels.kernels[0]
from luminar.backends.cuda import CUDATarget
from luminar.backends.cuda.mma import Mma
target = CUDATarget(program.device.target, allow_tf32=True)
bench = Bench(target, program.kernels, kernel, [target.default_schedule(kernel), Mma(1, 1, 1, 4, 8, "tf32")], {"s": 8}, 0)
report["validated"] = bench.validate()  # (nothing runs on the stand-in: the NaN-filled outputs fail)
report["timed"] = sorted(bench.time([0, 1], 0.01))
del program, bench
gc.collect()
report["live_bytes"], report["frees"], report["allocations"] = count("stub_live_bytes"), count("stub_frees"), count("stub_allocations")
print(json.dumps(report))
"""


def _on_stand_in(script: str, tmp_path, *args: str) -> dict:
    """Run `script` in a process whose libcuda.so.1 is the stand-in (tests/cuda_stub.c); its last
    line of output, as JSON."""
    import os
    import shutil
    import subprocess
    import sys
    compiler = shutil.which("gcc") or shutil.which("cc")
    if compiler is None:
        pytest.skip("no C compiler for the stand-in driver")
    here = os.path.dirname(os.path.abspath(__file__))
    subprocess.run([compiler, "-shared", "-fPIC", "-O1", "-o", str(tmp_path / "libcuda.so.1"),
                    os.path.join(here, "cuda_stub.c")], check=True)
    env = {**os.environ, "LD_LIBRARY_PATH": str(tmp_path), "LUMINAR_CACHE": str(tmp_path / "cache"),
           "PYTHONPATH": os.pathsep.join([os.path.join(here, "..", "src"), here, os.environ.get("PYTHONPATH", "")])}
    done = subprocess.run([sys.executable, "-c", script, *args], env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.splitlines()[-1])


def test_the_runtime_runs_end_to_end_on_a_stand_in_driver(tmp_path):
    """tests/cuda_stub.c is a libcuda.so.1 over host memory whose launches run nothing (here): with
    it, the runtime's driver calls (context, arena, copies, one CUDA graph per call updated in
    place when dims change, device-resident state, out of memory, freeing) run here, checked
    by what the stand-in recorded."""
    report = _on_stand_in(STUB_RUN, tmp_path)
    assert report["arch"] == "sm_90" and report["sms"] == 132  # from the device's attributes
    assert report["shapes"] == [[5, 32], [6, 32], [9, 32]] and report["dims"] == [5, 6, 9]  # (the dims array)
    assert report["graphs"] == 1 and report["replays_kept"] == 1  # one graph, built once
    assert report["replays"] == 3 and report["launches"] == 0  # one replay per call, no separate launches
    # s = 6 launches as s = 5 did: only the nodes of the state, whose buffers swap each call, change
    assert report["updates"][:2] == [0, report["state_nodes"]] and report["state_nodes"] == 1
    assert report["node_updates"] == report["graph_updates"] == report["updates"][2] > 1  # s = 9: resized nodes
    count, dims = report["expected_args"]
    assert len(report["last_args"]) == count and report["last_args"][-1] == dims  # buffers, offsets, the dims array
    assert "out of device memory" in report["oom"] and not report["leaked_on_oom"]
    assert report["replays_after"] == 5
    assert report["validated"] == [False, False] and report["timed"] == [0, 1]
    assert report["live_bytes"] == 0 and report["frees"] == report["allocations"]  # nothing leaked


# the stand-in running every kernel in the C++ emulation: the runtime's calls compute
STUB_EMULATED = r"""
import ctypes, json, sys
from pathlib import Path
import numpy as np
import cuda_emulate
from conformance import kv_cache_stays_on_the_device, small_llama_matches_transformers, train_step_keeps_its_state_on_the_device
from luminar.backends.cuda.program import CUDAProgram
stub, folder = ctypes.CDLL("libcuda.so.1"), Path(sys.argv[1])
built = CUDAProgram.__init__
def emulated(self, *args, **options):  # every program's kernels, as built, run by the emulation
    built(self, *args, **options)
    assert stub.stub_emulate(str(cuda_emulate.library(self.source, folder)).encode()) == 0
CUDAProgram.__init__ = emulated
model, ids = small_llama_matches_transformers("cuda", folder)
kv_cache_stays_on_the_device(model, ids)
replays, launches = ctypes.c_long.in_dll(stub, "stub_replays").value, model.program.graph_launches
model.forward(ids[:1], model.new_cache(4))
report = {"replays_per_call": ctypes.c_long.in_dll(stub, "stub_replays").value - replays,
          "counted": model.program.graph_launches - launches,
          "graphs": len(model.program._replays), "emulated": ctypes.c_long.in_dll(stub, "stub_emulated").value}
train_step_keeps_its_state_on_the_device("cuda")
print(json.dumps(report))
"""


@needs_gxx
@pytest.mark.slow
def test_on_the_stand_in_a_llama_decodes_with_its_kv_cache_and_a_train_step_its_state_on_the_device(tmp_path):
    """With the stand-in running the kernels in the C++ emulation (tests/cuda_emulate.py), the
    cuda runtime computes: the small Llama's logits match transformers, also decoding through
    the KV cache, whose rows stay on the device (a step copies in the new token's keys and
    values, not the cache; logits bit for bit those of the host path); Adam's parameters and
    moments stay on the device between steps and read back equal to the reference backend's.
    (The checks are the opencl runtime's: tests/conformance.py.) Each call is one graph replay."""
    pytest.importorskip("transformers", reason="the small Llama's reference (the GPU machine's image has no transformers)")
    report = _on_stand_in(STUB_EMULATED, tmp_path, str(tmp_path))
    assert report["replays_per_call"] == report["counted"] == 1 and report["emulated"] > 0


# -- on a GPU ----------------------------------------------------------------------------------------
@needs_gpu
def test_every_form_matches_the_plain_form_on_the_device():
    from luminar.backends.cuda.bench import Bench
    program = _program(_matmul)
    kernel = program.kernels[0]
    forms = [Tiled(), Tiled(wi=4, wj=16, ri=2, rj=4, kt=8), Tiled(local=False), Grid(), Mma(), Mma(1, 2, 1, 4, 8, "tf32")]
    assert Bench(CUDATarget(GPU.target, allow_tf32=True), program, kernel, forms, {}, seed=3).validate() == [True] * 6
    bf16 = _program(lambda g: _matmul(g, "bfloat16"))
    forms = [Tiled(), Mma(precision="bf16"), Mma(2, 1, 1, 2, 16, "bf16"), Mma(precision="tf32")]
    assert Bench(CUDATarget(GPU.target), bf16, bf16.kernels[0], forms, {}, seed=1).validate() == [True, True, True, False]


@needs_gpu
@pytest.mark.skipif(GPU is None or GPU.target.arch not in ("sm_90", "sm_90a"), reason="wgmma needs a Hopper GPU (sm_90a)")
def test_the_wgmma_forms_match_the_plain_form_on_a_hopper_gpu():
    """The first run of wgmma anywhere: the descriptor and fragment layouts as written (see
    backends/cuda/wgmma.py) against the plain loop body."""
    from luminar.backends.cuda.bench import Bench
    for build, precision, allow in ((_matmul, "tf32", True), (lambda g: _matmul(g, "bfloat16"), "bf16", False)):
        program = _program(build)
        forms = [Wgmma(1, 32, 16, precision), Wgmma(1, 64, 32, precision), Wgmma(2, 128, 16, precision)]
        assert Bench(CUDATarget(GPU.target, allow_tf32=allow), program, program.kernels[0], forms, {},
                     seed=5).validate() == [True] * 3, precision


@needs_gpu
def test_a_call_is_one_graph_replayed_with_its_changed_nodes_updated():
    g = lm.Graph()
    x, w = g.tensor("x", ("s", 64)), g.tensor("w", (64, 32))
    (x @ w).softmax(-1).output("y")
    program = g.compile("cuda").set_inputs(w=rand(64, 32, seed=1))
    for s in (5, 5, 9):
        xs = rand(s, 64, seed=s)
        expected = xs @ rand(64, 32, seed=1)
        expected = np.exp(expected - expected.max(-1, keepdims=True))
        np.testing.assert_allclose(program(x=xs)["y"], expected / expected.sum(-1, keepdims=True), rtol=1e-5, atol=1e-6)
    assert len(program._replays) == 1 and program.graph_updates > 0


@needs_gpu
def test_updated_state_stays_on_the_device():
    updated_state_stays_on_the_device("cuda")


@needs_gpu
def test_a_train_step_on_the_gpu_matches_the_reference_and_keeps_its_state_on_the_device():
    train_step_keeps_its_state_on_the_device("cuda")


@needs_gpu
def test_out_of_device_memory_is_a_device_error_and_leaks_nothing():
    g = lm.Graph()
    (g.tensor("x", (4,)) * 2.0).output("y")
    program = g.compile("cuda")
    held = list(program._pointers)
    with pytest.raises(DeviceError, match="out of device memory"):
        program._allocate(1 << 50)
    assert program._pointers == held
    np.testing.assert_allclose(program(x=np.arange(4, dtype=np.float32))["y"], [0, 2, 4, 6])


@needs_gpu
def test_search_validates_and_times_candidates_on_the_gpu(tmp_path, monkeypatch):
    monkeypatch.setenv("LUMINAR_CACHE", str(tmp_path))
    g = lm.Graph()
    a, b = g.tensor("a", (512, 384)), g.tensor("b", (384, 640))
    (a @ b).output("c")
    program = g.compile("cuda", search=10, allow_tf32=True)
    choice = program.choices[program.kernels.kernels[0].name][0]
    assert choice.source == "searched" and len([c for c in choice.candidates if c[1] is not None]) >= 3
    x, y = rand(512, 384), rand(384, 640, seed=1)
    np.testing.assert_allclose(program(a=x, b=y)["c"], x @ y, rtol=2e-2, atol=2e-2)  # (tf32 allowed)


@needs_gpu
def test_search_fuses_attention_into_the_online_form_on_the_gpu(fuse, monkeypatch):
    search_fuses_attention_into_the_online_form("cuda", fuse, monkeypatch)


def test_a_long_reduction_to_few_outputs_is_split_across_blocks(tmp_path, monkeypatch):
    """(a*b+c).relu().sum() over 64M floats: one thread per output would run 64M steps alone; the
    split form spreads each output's reduction over blocks and compiles without spills. Short
    reductions keep a thread per output."""
    from luminar.backends.cuda.split import Split
    monkeypatch.setenv("LUMINAR_CACHE", str(tmp_path))
    g = lm.Graph()
    a, b, c = (g.tensor(n, (1 << 26,)) for n in "abc")
    (a * b + c).relu().sum().output("s")
    x = g.tensor("x", (4, "n"))
    (x.amax(-1) * 2.0).output("m")  # symbolic length: split too
    (g.tensor("y", (3, 100)).sum(-1)).output("short")
    program, target = lower(optimize(g)), CUDATarget()
    chosen = [target.default_schedule(k) for k in program.kernels]
    assert chosen[:2] == [Split(), Split()] and not isinstance(chosen[2], Split)
    built = target.build(program, {})
    _checked(built, "split")
    assert "atomicAdd(&lm_done[lm_flat], 1u) == 511" in built.source
    assert built.calls[0].schedules[0].launch(program.kernels[0], {}) == ((512, 1, 1), (256, 1, 1))
