"""Benchmark the opencl backend's searched schedules against its default ones, and write
bench/OPENCL.md and bench/opencl.json.

    .venv/bin/python bench/opencl.py            # matmul 1024², softmax 1024 x 4096, attention seq 512, sum 16M
    .venv/bin/python bench/opencl.py --quick    # smaller sizes

On the project machines the OpenCL device is the CPU, through PoCL: a correctness vehicle for
the GPU kernel forms, not a speed target, so only ratios between OpenCL schedules (timed
interleaved in the same run) are quoted. Cases:

- matmul N x N fp32: the default (work-groups of 8 x 8, 2 x 2 register tiles, 16 reduction
  steps staged in local memory) vs the searched schedule;
- softmax over rows: the default (a work-group of 64 per row, row values reduced in local
  memory) vs the searched work-group size;
- naive causal attention (softmax(q k^T / sqrt(d) + mask) v, 8 heads, head_dim 64): its three
  kernels with default schedules vs the searched program, where the search times the online-softmax
  (flash) GPU kernel against the three kernels with their searched schedules and keeps whichever
  is faster; the peer "searched, unfused" (the fusion taken away) checks that pick end to end;
- a sum of 16M floats to a scalar: the default (the reduction split across work-groups, split.py)
  vs the searched split, and the peer "one work-item" (the shared GPU rules' Grid form, which
  the opencl target used before splitting).

Each compile with search starts from an empty tuning cache. Every output is checked against
numpy (float64) before it is timed; the load other tenants put on the CPUs is reported.
"""
from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import machine  # noqa: E402
from timing import interleaved  # noqa: E402

import luminar as lm  # noqa: E402


def matmul_case(n):
    g = lm.Graph()
    a, b = g.tensor("a", (n, n)), g.tensor("b", (n, n))
    (a @ b).output("c")
    rng = np.random.default_rng(0)
    x, y = rng.standard_normal((n, n), np.float32), rng.standard_normal((n, n), np.float32)
    return g, {"a": x, "b": y}, "c", x.astype(np.float64) @ y


def softmax_case(rows, cols):
    g = lm.Graph()
    x = g.tensor("x", (rows, cols))
    x.softmax(-1).output("y")
    data = np.random.default_rng(1).standard_normal((rows, cols), np.float32) * 3
    e = np.exp(data.astype(np.float64) - data.max(-1, keepdims=True))
    return g, {"x": data}, "y", e / e.sum(-1, keepdims=True)


def attention_case(seq, heads=8, dim=64):
    g = lm.Graph()
    q, k, v = (g.tensor(name, (heads, seq, dim)) for name in "qkv")
    visible = g.arange(seq).unsqueeze(1) >= g.arange(seq).unsqueeze(0)
    scores = (q @ k.transpose(-1, -2)) * (1.0 / dim ** 0.5)
    (scores.masked_fill(1.0 - visible, -1e30).softmax(-1) @ v).output("o")
    rng = np.random.default_rng(2)
    arrays = {name: rng.standard_normal((heads, seq, dim), np.float32) for name in "qkv"}
    s = arrays["q"].astype(np.float64) @ arrays["k"].transpose(0, 2, 1) / dim ** 0.5
    s = s + np.triu(np.full((seq, seq), -1e30), 1)
    e = np.exp(s - s.max(-1, keepdims=True))
    return g, arrays, "o", (e / e.sum(-1, keepdims=True)) @ arrays["v"]


def sum_case(n):
    g = lm.Graph()
    g.tensor("a", (n,)).sum().output("s")
    data = np.random.default_rng(3).standard_normal(n, np.float32)
    return g, {"a": data}, "s", np.array(data.astype(np.float64).sum())


def compile_unsplit(g):
    """The program with the shared GPU rules' schedules (no split: the reduction on one work-item)."""
    from luminar.backends.opencl import schedules
    from luminar.backends.opencl.target import OpenCLTarget

    class Unsplit(OpenCLTarget):
        default_schedule = staticmethod(schedules.default_schedule)
    return g.compile("opencl", target=Unsplit())


def compile_unfused(g, budget_s):
    """The program searched with the fusion decision taken away (every region stays as stored
    kernels): the peer that shows what the online-softmax kernel is worth against searched
    schedules, where the search itself compares it with the default ones."""
    from luminar.compiler import search
    real = search.search_fusion
    search.search_fusion = lambda target, lowering, program, opts: (program, [], {})
    try:
        return g.compile("opencl", search=budget_s)
    finally:
        search.search_fusion = real


def pick(program) -> str:
    """The search's pick in words: the fusion decision, else the (last) kernel's schedule."""
    for f in program.fusions:
        return ("fused: " + f.schedule.describe()) if f.chosen else \
            f"unfused: {len(f.replaced)} kernels with their searched schedules"
    kernel = program.kernels.kernels[-1]
    return program.choices[kernel.name][0].schedule.describe()


def run_case(name, case, budget_s, tolerance, unfused_peer=False, unsplit_peer=False):
    g, inputs, output, expected = case
    programs, compile_s = {}, {}
    for label, options in (("default", {}), ("searched", {"search": budget_s})):
        started = time.perf_counter()
        programs[label] = g.compile("opencl", **options)
        compile_s[label] = round(time.perf_counter() - started, 2)
    if unfused_peer:
        programs["searched, unfused"] = compile_unfused(g, budget_s)
    if unsplit_peer:
        programs["one work-item"] = compile_unsplit(g)
    for label, program in programs.items():
        got = program(**inputs)[output]
        error = float(np.abs(got - expected).max() / max(np.abs(expected).max(), 1e-30))
        if not error < tolerance:
            raise AssertionError(f"{name}: the {label} program is wrong (max relative error {error:.2e})")
    before = machine.cpu_times()
    times = interleaved({label: (lambda p=p: p(**inputs)) for label, p in programs.items()},
                        max_rounds=15, min_rounds=5, budget_s=3.0)
    load = machine.idle_fractions(before, machine.cpu_times())
    ratio = times["default"]["median_ms"] / times["searched"]["median_ms"]
    chosen = programs["searched"].explain().splitlines()  # (with the search's own kernel timings)
    print(f"{name}: default {times['default']['median_ms']:.2f} ms, searched {times['searched']['median_ms']:.2f} ms "
          f"({ratio:.2f}x)", flush=True)
    peer = {"searched_unfused_ms": round(times["searched, unfused"]["median_ms"], 3)} if unfused_peer else {}
    peer.update({"one_work_item_ms": round(times["one work-item"]["median_ms"], 3)} if unsplit_peer else {})
    return {"case": name, **peer, "pick": pick(programs["searched"]), "default_ms": round(times["default"]["median_ms"], 3),
            "searched_ms": round(times["searched"]["median_ms"], 3), "speedup": round(ratio, 3),
            "compile_s": compile_s, "idle_fractions": {k: round(v, 2) for k, v in load.items()},
            "default_schedules": programs["default"].explain().splitlines()[1:], "searched_explain": chosen,
            "fusions": [{"kernels": f.replaced, "chosen": f.chosen, "unfused_ms": round(f.unfused_s * 1e3, 3),
                         "fused_ms": {c[0]: round(c[1] * 1e3, 3) for c in f.candidates if c[1] is not None}}
                        for f in programs["searched"].fusions]}


def write_report(results, device, quick):
    (HERE / "opencl.json").write_text(json.dumps({"device": device, "quick": quick, "results": results}, indent=1) + "\n")
    lines = ["# The opencl backend: searched vs default schedules", "",
             "Written by `bench/opencl.py`" + (" --quick" if quick else "") + f". Device: {device}.", "",
             "PoCL runs the OpenCL kernels on this machine's CPU: it is how the GPU kernel forms are executed",
             "and checked without a GPU, not a speed target. The figures are ratios between OpenCL schedules",
             "timed interleaved in one run (medians), on a machine shared with other busy processes (the",
             "idle fraction of each CPU while timing is given); every output was checked against numpy first.", "",
             "| case | default (ms) | searched (ms) | searched speed-up | the search's pick | compile with search (s) "
             "| CPU idle while timing |",
             "|---|---|---|---|---|---|---|"]
    for r in results:
        idle = ", ".join(f"{v:.0%}" for v in r["idle_fractions"].values())
        lines.append(f"| {r['case']} | {r['default_ms']:.2f} | {r['searched_ms']:.2f} | {r['speedup']:.2f}x | "
                     f"{r['pick']} | {r['compile_s']['searched']} | {idle} |")
    for r in results:
        for f in r["fusions"]:
            best = min(f["fused_ms"].items(), key=lambda kv: kv[1], default=None)
            if best is not None:
                lines += ["", f"{r['case']}: the search timed the unfused kernels ({' + '.join(f['kernels'])}), "
                          "with their searched schedules, at "
                          f"{f['unfused_ms']:.2f} ms and the fastest online-softmax (flash) kernel at {best[1]:.2f} ms "
                          f"({f['unfused_ms'] / best[1]:.2f}x; {best[0]}): "
                          + ("fused." if f["chosen"] else "kept unfused.")]
        if "searched_unfused_ms" in r:
            lines += ["", f"{r['case']}, end to end in the same interleaved rounds: default {r['default_ms']:.2f} ms, searched "
                      f"with the fusion taken away {r['searched_unfused_ms']:.2f} ms, searched {r['searched_ms']:.2f} ms "
                      f"({r['searched_unfused_ms'] / r['searched_ms']:.2f}x over the searched unfused kernels)."]
        if "one_work_item_ms" in r:
            lines += ["", f"{r['case']}, in the same interleaved rounds: the reduction on one work-item (the Grid "
                      f"form, no split) {r['one_work_item_ms']:.2f} ms, split by default {r['default_ms']:.2f} ms "
                      f"({r['one_work_item_ms'] / r['default_ms']:.2f}x), searched {r['searched_ms']:.2f} ms "
                      f"({r['one_work_item_ms'] / r['searched_ms']:.2f}x)."]
    lines += ["", "What the search chose and the kernel times it measured (`explain()` of the searched program;",
              "the whole-program times above also hold the host copies of inputs and outputs):", ""]
    for r in results:
        lines += [f"**{r['case']}**", "", "```", *r["searched_explain"], "```", ""]
    (HERE / "OPENCL.md").write_text("\n".join(lines))


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="smaller sizes")
    parser.add_argument("--budget", type=float, default=60.0, help="search seconds per case")
    args = parser.parse_args(argv)
    import os
    os.environ["LUMINAR_CACHE"] = tempfile.mkdtemp(prefix="luminar-opencl-bench-")  # a fresh tuning cache
    from luminar.backends.opencl.device import device
    dev = device()
    sizes = dict(n=256, rows=256, cols=1024, seq=128, sum=1 << 20) if args.quick else \
        dict(n=1024, rows=1024, cols=4096, seq=512, sum=16 << 20)
    cases = [(f"matmul {sizes['n']}x{sizes['n']}", lambda: matmul_case(sizes["n"]), 1e-4),
             (f"softmax {sizes['rows']}x{sizes['cols']}", lambda: softmax_case(sizes["rows"], sizes["cols"]), 1e-5),
             (f"naive causal attention, 8 heads x 64, seq {sizes['seq']}", lambda: attention_case(sizes["seq"]), 1e-4),
             (f"sum of {sizes['sum'] >> 20}M floats", lambda: sum_case(sizes["sum"]), 1e-3)]  # (float32 sums)
    results = [run_case(name, make(), args.budget, tol, unfused_peer="attention" in name, unsplit_peer="sum" in name)
               for name, make, tol in cases]
    write_report(results, dev.identity, args.quick)
    return 0


if __name__ == "__main__":
    sys.exit(main())
