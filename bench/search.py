"""Benchmark the search-based compiler (compiler/search.py) and write bench/SEARCH.md and
bench/search.json.

    .venv/bin/python bench/search.py            # the full run (~5 minutes)
    .venv/bin/python bench/search.py --quick    # smaller sizes, no start-up children (~1 minute)

Cases (issue 4's goals):

- matmul N x N fp32 (1024, 2048): luminar without search (the rule-chosen schedule), luminar
  with search, numpy (OpenBLAS), timed interleaved. Goal: searched >= 0.9x numpy.
- Q4_1 linear over 512 rows (SmolLM2's 1536 x 576 gate projection, prefill-shaped): the kernel
  alone under the plain schedule (what every linear layer ran before packing), the new default
  (dequantized weight panel packed once per column block) and the searched one; numpy on the
  dequantized float32 weight for scale.
- attention (8 heads, head_dim 64, seq 1024 / 2048 / 4096, causal) from the naive graph: luminar
  without search (three kernels, seq x seq buffers), luminar with search (which fuses it into one
  online-softmax kernel if that measures faster), PyTorch's scaled_dot_product_attention with
  is_causal=True. Goals: fused, no seq x seq buffer (arena), faster than unfused, >= 0.7x sdpa.
- Llama-style decoder, 4 layers with SmolLM2-135M's shapes and random Q4_1 weights: compile with
  search in a fresh process with an empty cache (goal < 60 s) and again from the tuning cache
  (goal < 3 s); then a 128-token prefill and a one-token decode step, default vs searched.

Every luminar output is checked against a reference before it is timed. Timings wait (bounded)
for an idle machine; the load other tenants put on the CPUs while timing is reported.
"""
from __future__ import annotations

import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import run  # noqa: E402,F401 - restarts this script once with the benchmark's thread settings

import argparse  # noqa: E402
import json  # noqa: E402
import os  # noqa: E402
import subprocess  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402

import numpy as np  # noqa: E402

import machine  # noqa: E402
from timing import interleaved  # noqa: E402

CHILD = "--child-llama"


# -- graphs ------------------------------------------------------------------------------------------
class _Tensor:
    """What the GGUF reader hands to quant.weight: a format name, a shape and the stored parts."""

    def __init__(self, qtype, shape, parts):
        self.qtype, self.shape, self.parts = qtype, shape, parts


def q4_1(shape, rng) -> _Tensor:
    rows, blocks = int(np.prod(shape[:-1])), shape[-1] // 32
    return _Tensor("Q4_1", shape, {"scale": (rng.standard_normal((rows, blocks)) * 0.02).astype(np.float16),
                                   "min": (rng.standard_normal((rows, blocks)) * 0.02).astype(np.float16),
                                   "quants": rng.integers(0, 256, (rows, blocks, 16), dtype=np.uint8)})


def llama_model(layers: int):
    """(config, Weights) for a SmolLM2-135M-shaped decoder with random weights stored as the GGUF
    file stores them: Q4_1 matrices, a Q8_0 tied embedding, float32 norms."""
    from luminar.io import quant
    from luminar.models.llama import LlamaConfig, Weights
    vocab, d, mlp = 49152, 576, 1536
    config = LlamaConfig(vocab_size=vocab, hidden_size=d, intermediate_size=mlp, num_hidden_layers=layers,
                         num_attention_heads=9, num_key_value_heads=3, head_dim=64, rope_theta=1e5,
                         tie_word_embeddings=True)
    rng = np.random.default_rng(0)
    tensors = {"model.embed_tokens.weight": _Tensor("Q8_0", (vocab, d), {
        "scale": (rng.standard_normal((vocab, d // 32)) * 0.02).astype(np.float16),
        "quants": rng.integers(-127, 128, (vocab, d // 32, 32), dtype=np.int8)}),
        "model.norm.weight": _Tensor("F32", (d,), {"data": np.ones(d, np.float32)})}
    shapes = {"self_attn.q_proj": (d, d), "self_attn.k_proj": (192, d), "self_attn.v_proj": (192, d),
              "self_attn.o_proj": (d, d), "mlp.gate_proj": (mlp, d), "mlp.up_proj": (mlp, d), "mlp.down_proj": (d, mlp)}
    for layer in range(layers):
        p = f"model.layers.{layer}."
        tensors.update({f"{p}{name}.weight": q4_1(shape, rng) for name, shape in shapes.items()})
        for norm in ("input_layernorm", "post_attention_layernorm"):
            tensors[f"{p}{norm}.weight"] = _Tensor("F32", (d,), {"data": (1 + 0.1 * rng.standard_normal(d)).astype(np.float32)})
    weights = Weights(lambda n: n in tensors, lambda g, n: quant.weight(g, quant.input_name(n), tensors[n]),
                      lambda n: tensors[n].shape)
    return config, weights


# the decoder's shape buckets: a decode step (s = 1) and a 128-token prefill, keeping the last row's logits
LLAMA_BUCKETS = {"s": [1, 128], "r": 1}


def llama_program(layers: int, **options):
    from luminar.models.llama import build_graph, rope_inv_freq
    config, weights = llama_model(layers)
    graph = build_graph(config, weights)
    started = time.perf_counter()
    program = graph.compile("cpu", **options)
    seconds = time.perf_counter() - started
    program.set_inputs(weights.arrays, inv_freq=rope_inv_freq(config))
    return config, program, seconds


def child_llama(layers: int) -> None:
    """Compile the decoder with search (cache from the environment) and print the timing as JSON."""
    _, program, seconds = llama_program(layers, search=True, search_dims=LLAMA_BUCKETS)
    sources = {}
    for choice in (c for per in program.choices.values() for c in per):
        sources[choice.source] = sources.get(choice.source, 0) + 1
    fusions = [f"{'fused' if f.chosen else 'kept unfused'} ({f.source}): unfused {f.unfused_s * 1e3:.3f} ms, fused "
               f"{min((t for _, t, _ in f.candidates if t is not None), default=float('nan')) * 1e3:.3f} ms" if f.unfused_s else
               f"kept unfused ({f.source}): forms {', '.join(f.forms)}, no fused form timed" for f in program.fusions]
    print(json.dumps({"compile_s": seconds, "kernels": len(program.kernels.kernels), "sources": sources,
                      "structures": len({id(c) for per in program.choices.values() for c in per}),
                      "attention": sorted(set(fusions))}))


# -- cases -------------------------------------------------------------------------------------------
def timed(contenders: dict, quick: bool, idle_wait: float) -> tuple[dict, dict]:
    idle = machine.wait_for_idle(idle_wait)
    with machine.LoadMonitor() as load:
        times = interleaved(contenders, max_rounds=5 if quick else 30, min_rounds=2 if quick else 5,
                            budget_s=0.5 if quick else 3.0)
    return times, {"idle_before": idle, "foreign_cpus": round(load.foreign_cpus, 3)}


def matmul_case(n: int, quick: bool, idle_wait: float) -> dict:
    import luminar as lm
    rng = np.random.default_rng(n)
    a, b = rng.standard_normal((n, n), dtype=np.float32), rng.standard_normal((n, n), dtype=np.float32)

    def graph():
        g = lm.Graph()
        (g.tensor("a", (n, n)) @ g.tensor("b", (n, n))).output("c")
        return g
    started = time.perf_counter()
    searched = graph().compile("cpu", search=True)
    search_s = time.perf_counter() - started
    default = graph().compile("cpu")
    expected = a.astype(np.float64) @ b
    for program in (default, searched):
        np.testing.assert_allclose(program(a=a, b=b)["c"], expected, rtol=1e-3, atol=1e-3 * np.abs(expected).max())
    times, load = timed({"luminar default": lambda: default(a=a, b=b), "luminar searched": lambda: searched(a=a, b=b),
                         "numpy": lambda: a @ b}, quick, idle_wait)
    gflops = {name: 2 * n ** 3 / t["median_ms"] / 1e6 for name, t in times.items()}
    ratio = times["numpy"]["median_ms"] / times["luminar searched"]["median_ms"]
    return {"name": f"matmul {n}", "gflops": gflops, "times": times, **load, "search_s": search_s,
            "ratio_vs_numpy": ratio, "goal": "searched >= 0.9x numpy", "met": ratio >= 0.9,
            "explain": searched.explain()}


def q4_linear_case(rows: int, quick: bool, idle_wait: float) -> dict:
    import luminar as lm
    from luminar.backends.cpu import CPU
    from luminar.backends.cpu.schedules import default_loops, default_schedule
    from luminar.compiler import search
    from luminar.compiler.kernels import lower
    from luminar.compiler.passes import optimize
    from luminar.io import quant
    out_f, in_f = 1536, 576
    tensor = q4_1((out_f, in_f), np.random.default_rng(1))
    g = lm.Graph()
    w, feeds = quant.weight(g, "w", tensor)
    lm.linear(g.tensor("x", ("s", in_f)), w).output("y")
    program = lower(optimize(g))
    (kernel,) = program.kernels
    env = {"s": rows}
    started = time.perf_counter()
    choice = search.search_kernel(CPU, program, kernel, env, seed=0, budget_s=1.0)
    search_s = time.perf_counter() - started
    schedules = {"plain (before)": default_loops(kernel), "packed default": default_schedule(kernel),
                 "searched": choice.schedule}
    bench = CPU.bench(program, kernel, list(schedules.values()), env, seed=0)
    if not all(bench.validate()):
        raise AssertionError("a Q4_1 linear schedule disagrees with the oracle")
    dense = quant.dequantize_parts("Q4_1", tensor.parts, tensor.shape)
    x = np.random.default_rng(2).standard_normal((rows, in_f), dtype=np.float32)
    contenders = {name: (lambda k=k: bench.calls[k](bench.pointers, bench.dims)) for k, name in enumerate(schedules)}
    contenders["numpy (float32 W)"] = lambda: x @ dense.T
    times, load = timed(contenders, quick, idle_wait)
    flops = 2 * rows * in_f * out_f
    return {"name": f"Q4_1 linear {out_f}x{in_f}, {rows} rows", "times": times, **load, "search_s": search_s,
            "gflops": {name: flops / t["median_ms"] / 1e6 for name, t in times.items()},
            "schedules": {name: s.describe() for name, s in schedules.items()},
            "speedup_vs_plain": times["plain (before)"]["median_ms"] / times["packed default"]["median_ms"]}


def attention_case(seq: int, quick: bool, idle_wait: float, heads: int = 8, dim: int = 64) -> dict:
    """The naive graph (q @ k^T, scale, causal mask, softmax, @ v) compiled without search (three
    kernels, two heads x seq x seq buffers) and with search (which may fuse it into one online-softmax
    kernel, if that measures faster), against PyTorch's scaled_dot_product_attention(is_causal=True)."""
    import math

    import torch

    import luminar as lm

    def graph():
        g = lm.Graph()
        q, k, v = (g.tensor(n, (heads, seq, dim)) for n in "qkv")
        visible = g.arange(seq).unsqueeze(1) >= g.arange(seq).unsqueeze(0)
        scores = (q @ k.transpose(-1, -2)) * (1 / math.sqrt(dim))
        (scores.masked_fill(1.0 - visible, -1e30).softmax(-1) @ v).output("o")
        return g
    rng = np.random.default_rng(seq)
    arrays = {n: rng.standard_normal((heads, seq, dim), dtype=np.float32) for n in "qkv"}
    tq, tk, tv = (torch.from_numpy(arrays[n]).unsqueeze(0) for n in "qkv")  # (1, heads, seq, dim): the flash path
    sdpa = lambda: torch.nn.functional.scaled_dot_product_attention(tq, tk, tv, is_causal=True)  # noqa: E731
    started = time.perf_counter()
    searched = graph().compile("cpu", search=True)
    search_s = time.perf_counter() - started
    default = graph().compile("cpu")
    expected = sdpa()[0].numpy()
    for program in (default, searched):
        np.testing.assert_allclose(program(**arrays)["o"], expected, rtol=1e-3, atol=1e-4)
    times, load = timed({"luminar default (unfused)": lambda: default(**arrays),
                         "luminar searched": lambda: searched(**arrays), "torch sdpa (causal)": sdpa}, quick, idle_wait)
    flops = 4 * heads * seq * seq * dim  # as dense: a causal kernel needs about half
    ratio = times["torch sdpa (causal)"]["median_ms"] / times["luminar searched"]["median_ms"]
    vs_unfused = times["luminar default (unfused)"]["median_ms"] / times["luminar searched"]["median_ms"]
    fused = bool(searched.fusions) and all(f.chosen for f in searched.fusions)
    return {"name": f"attention {heads} heads x {seq} x {dim}, causal", "times": times, **load, "search_s": search_s,
            "gflops": {name: flops / t["median_ms"] / 1e6 for name, t in times.items()},
            "arena_mb": {"default": default.memory_plan({}).arena_bytes / 1e6,
                         "searched": searched.memory_plan({}).arena_bytes / 1e6},
            "ratio_vs_torch": ratio, "speedup_vs_unfused": vs_unfused,
            "goal": "one online-softmax kernel, no seq x seq buffer, faster than unfused, >= 0.7x torch sdpa",
            "met": fused and searched.memory_plan({}).arena_bytes == 0 and vs_unfused > 1 and ratio >= 0.7,
            "explain": searched.explain()}


def llama_case(layers: int, tokens: int, quick: bool, idle_wait: float) -> dict:
    row = {"name": f"Llama-style decoder, {layers} layers (SmolLM2-135M shapes, Q4_1)"}
    with tempfile.TemporaryDirectory(prefix="luminar-search-bench-") as cache:
        env = {**os.environ, "LUMINAR_CACHE": cache}
        for start in ("cold", "cached"):
            proc = subprocess.run([sys.executable, __file__, CHILD, str(layers)], env=env, capture_output=True,
                                  text=True, timeout=900)
            if proc.returncode != 0:
                raise RuntimeError(f"{start} compile failed: {proc.stderr[-2000:]}")
            row[start] = json.loads(proc.stdout.strip().splitlines()[-1])
        os.environ["LUMINAR_CACHE"] = cache
        config, searched, _ = llama_program(layers, search=True, search_dims=LLAMA_BUCKETS)
        _, default, _ = llama_program(layers)
        ids = np.random.default_rng(3).integers(0, config.vocab_size, tokens).astype(np.int32)
        shape = (1, layers, config.num_key_value_heads, config.head_dim)
        inputs = {"tokens": ids, "k_cache": np.zeros(shape, np.float32), "v_cache": np.zeros(shape, np.float32)}
        prefill = lambda p: p.run(inputs, dims={"r": 1})["logits"]  # noqa: E731
        np.testing.assert_allclose(prefill(searched), prefill(default), rtol=2e-3, atol=2e-3)
        # one decode step after `tokens` cached ones: the search timed its kernels at s = 128, not 1
        cached = (tokens, layers, config.num_key_value_heads, config.head_dim)
        step = {"tokens": ids[:1], "k_cache": np.random.default_rng(4).standard_normal(cached).astype(np.float32),
                "v_cache": np.random.default_rng(5).standard_normal(cached).astype(np.float32)}
        decode = lambda p: p.run(step, dims={"r": 1})["logits"]  # noqa: E731
        np.testing.assert_allclose(decode(searched), decode(default), rtol=2e-3, atol=2e-3)
        times, load = timed({"default": lambda: prefill(default), "searched": lambda: prefill(searched),
                             "default, decode step": lambda: decode(default),
                             "searched, decode step": lambda: decode(searched)}, quick, idle_wait)
    row.update(times=times, **load, prefill_tokens=tokens,
               goals={"cold < 60 s": row["cold"]["compile_s"] < 60, "cached < 3 s": row["cached"]["compile_s"] < 3})
    return row


# -- report ------------------------------------------------------------------------------------------
def markdown(results: dict) -> str:
    lines = ["# Search benchmark", "", f"Run {results['date']} on {results['cpu']}, {results['threads']} threads. "
             f"Command: `{results['command']}`.", ""]
    for row in results["rows"]:
        lines += [f"## {row['name']}", ""]
        if "error" in row:
            lines += [f"failed: {row['error']}", ""]
            continue
        if "cold" in row:
            for start in ("cold", "cached"):
                r = row[start]
                lines.append(f"- compile with search, {start}: {r['compile_s']:.1f} s ({r['kernels']} kernels in "
                             f"{r['structures']} distinct structures; kernels by schedule source: {r['sources']}; "
                             f"attention: {r.get('attention')})")
            lines.append(f"- goals: {row['goals']}")
        if "gflops" in row:
            lines += ["", "| contender | median ms | GFLOP/s |", "|---|---|---|"]
            lines += [f"| {name} | {t['median_ms']:.3f} | {row['gflops'][name]:.1f} |" for name, t in row["times"].items()]
        elif "times" in row:
            lines += ["", f"prefill of {row['prefill_tokens']} tokens, and one decode step after as many cached "
                      "(the search's shape bucket is s = 128):", "", "| program | median ms |", "|---|---|"]
            lines += [f"| {name} | {t['median_ms']:.2f} |" for name, t in row["times"].items()]
        if "arena_mb" in row:
            lines.append("\nGFLOP/s count the dense 4 x heads x seq^2 x dim (a causal kernel does about half). "
                         f"Arena (temporaries): default {row['arena_mb']['default']:.1f} MB, searched "
                         f"{row['arena_mb']['searched']:.1f} MB.")
        for key in ("ratio_vs_numpy", "speedup_vs_plain", "ratio_vs_torch", "speedup_vs_unfused"):
            if key in row:
                lines.append(f"\n{key.replace('_', ' ')}: {row[key]:.2f}" + (f" (goal: {row['goal']}: "
                             f"{'met' if row['met'] else 'missed'})" if key in ("ratio_vs_numpy", "ratio_vs_torch")
                             else ""))
        if "schedules" in row:
            lines += [""] + [f"- {name}: `{s}`" for name, s in row["schedules"].items()]
        lines.append(f"\nmachine: idle before timing: {row['idle_before']['idle']}, other tenants' CPU use while "
                     f"timing: {row['foreign_cpus']} CPUs")
        if "explain" in row:
            lines += ["", "```", row["explain"], "```"]
        lines.append("")
    return "\n".join(lines)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true", help="smaller sizes, no start-up children; writes nothing")
    p.add_argument("--threads", type=int, default=2, help="threads for every contender (default 2)")
    p.add_argument("--idle-wait", type=float, default=20.0, help="max seconds to wait for an idle machine per case")
    p.add_argument("--only", default="", help="run only cases whose key contains this text: matmul, q4_1, "
                   "attention, llama")
    args = p.parse_args()
    os.environ.setdefault("LUMINAR_CACHE", tempfile.mkdtemp(prefix="luminar-search-bench-"))
    small = args.quick
    cases = {"matmul 1": lambda: matmul_case(256 if small else 1024, small, args.idle_wait),
             "matmul 2": lambda: matmul_case(512 if small else 2048, small, args.idle_wait),
             "q4_1 linear": lambda: q4_linear_case(128 if small else 512, small, args.idle_wait)}
    for seq in ((256,) if small else (1024, 2048, 4096)):
        cases[f"attention {seq}"] = lambda seq=seq: attention_case(seq, small, args.idle_wait)
    if not small:
        cases["llama"] = lambda: llama_case(4, 128, small, args.idle_wait)
    rows = []
    for name, case in cases.items():
        if args.only.lower() not in name:
            continue
        print(f"{name} ...", flush=True)
        try:
            row = case()
        except Exception as e:  # noqa: BLE001 - one failing case must not lose the others
            row = {"name": name, "error": f"{type(e).__name__}: {e}"[:1000]}
        rows.append(row)
    results = {"date": time.strftime("%Y-%m-%d %H:%M %Z"), "cpu": machine.cpu_model(), "threads": args.threads,
               "command": " ".join(["python bench/search.py", *sys.argv[1:]]), "rows": rows}
    text = markdown(results)
    print(text)
    if not args.quick:
        (HERE / "search.json").write_text(json.dumps(results, indent=1, default=str) + "\n")
        (HERE / "SEARCH.md").write_text(text)
    return 0


if __name__ == "__main__":
    if len(sys.argv) > 2 and sys.argv[1] == CHILD:
        child_llama(int(sys.argv[2]))
    else:
        sys.exit(main())
