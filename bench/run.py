"""Benchmark luminar's CPU backend against numpy and PyTorch eager, in one process, and write
bench/RESULTS.md and bench/results.json.

    make bench                         # the full run (< 10 minutes)
    .venv/bin/python bench/run.py --quick   # small sizes, few rounds (< 1 minute)

Per benchmark: build the luminar graph, compile it twice (a cold compile into an empty
LUMINAR_CACHE, then the cached path), check every contender's output against a float64
numpy reference (a wrong kernel is never timed), wait briefly for an idle machine, then time
luminar / numpy / torch interleaved and report medians, speed ratios and the goal's status.
The machine's own limits (peak FMA FLOP/s, memory bandwidth) are measured first.
"""
from __future__ import annotations

import argparse
import json
import os
import sys

BLAS_OVERRIDES = ("OPENBLAS_CORETYPE", "OPENBLAS_L2_SIZE")
THREAD_VARS = ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS")


def _threads_arg(argv) -> int:
    pre = argparse.ArgumentParser(add_help=False)
    pre.add_argument("--threads", type=int, default=2)
    return max(1, pre.parse_known_args(argv)[0].threads)


def _reexec_with_bench_environment():
    """Libraries read their environment when they load, so the bench restarts itself once with it set:
    every contender gets the same thread count, and numpy runs its default OpenBLAS kernels (kernel
    overrides are dropped for this process only)."""
    env = dict(os.environ)
    unset = {k: env.pop(k) for k in BLAS_OVERRIDES if k in env}
    env.update({k: str(_threads_arg(sys.argv[1:])) for k in THREAD_VARS})
    if unset:
        env["LUMINAR_BENCH_UNSET"] = json.dumps(unset)
    if env != dict(os.environ):
        os.execve(sys.executable, [sys.executable, *sys.argv], env)


_reexec_with_bench_environment()  # before numpy, torch or any luminar kernel is loaded

import datetime  # noqa: E402
import platform  # noqa: E402
import shutil  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402

import numpy as np  # noqa: E402

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import cases  # noqa: E402
import machine  # noqa: E402
import report  # noqa: E402
from timing import interleaved, settle  # noqa: E402

ARENA_SLACK = 64  # bytes: the goal allows one alignment unit above the liveness lower bound
WRONG_FACTOR = 20  # an output off by more than 20x a case's tolerance is a wrong kernel, not rounding


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true", help="small sizes and few rounds: a smoke run (< 1 min)")
    p.add_argument("--only", default="", help="run only benchmarks whose name contains this text")
    p.add_argument("--out", type=Path, default=None,
                   help="output folder (default bench/, or bench/quick/ with --quick)")
    p.add_argument("--threads", type=int, default=2, help="threads for every contender (OpenMP, OpenBLAS, "
                   "torch); 1 gives steadier ratios on a machine shared with other work (default 2)")
    p.add_argument("--idle-wait", type=float, default=None, help="max seconds to wait for an idle machine "
                   "before each benchmark (default 20 first, then 10; 2 then 1 with --quick)")
    return p.parse_args(argv)


def settings(args) -> dict:
    if args.quick:
        cfg = {"max_rounds": 5, "min_rounds": 2, "budget_s": 0.3, "first_idle_wait_s": 2, "idle_wait_s": 1,
               "limits": {"bandwidth_mb": 64, "repeats": 3, "fma_seconds": 0.03}}
    else:
        cfg = {"max_rounds": 40, "min_rounds": 5, "budget_s": 3.0, "first_idle_wait_s": 20, "idle_wait_s": 10,
               "limits": {"bandwidth_mb": 256, "repeats": 11, "fma_seconds": 0.1}}
    if args.idle_wait is not None:
        cfg["first_idle_wait_s"] = cfg["idle_wait_s"] = args.idle_wait
    return cfg


def main(argv=None) -> int:
    args = parse_args(argv)
    cfg = settings(args)
    out_dir = args.out or (HERE / "quick" if args.quick else HERE)
    cache = tempfile.mkdtemp(prefix="luminar-bench-cache-")
    os.environ["LUMINAR_CACHE"] = cache  # every first compile is cold; the user's cache is untouched
    try:
        import torch
        torch.set_num_threads(args.threads)
        with torch.no_grad():
            results = run_all(args, cfg)
    finally:
        shutil.rmtree(cache, ignore_errors=True)
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "results.json").write_text(json.dumps(results, indent=1, default=float) + "\n")
    text = report.markdown(results)
    (out_dir / "RESULTS.md").write_text(text)
    print(report.summary(results))
    print(f"\nwrote {out_dir / 'RESULTS.md'} and {out_dir / 'results.json'}")
    return 0


def run_all(args, cfg) -> dict:
    started = time.time()
    info = describe(args)
    print(f"{info['cpu']}, {info['cpus']} CPUs; waiting up to {cfg['first_idle_wait_s']} s for an idle machine")
    idle = machine.wait_for_idle(cfg["first_idle_wait_s"])
    with machine.LoadMonitor() as load:
        limits = machine.measure_limits(**cfg["limits"])
    limits.update(idle_before=idle, foreign_cpus=round(load.foreign_cpus, 3), steal_cpus=round(load.steal_cpus, 3))
    for row in limits["rows"]:
        print(f"  {row['kernel']:32s} {row['threads']} thread(s): {row['median']:7.1f} {row['unit']}")
    rows = []
    for case in cases.all_cases(args.quick):
        if args.only and args.only.lower() not in case.name.lower():
            continue
        print(f"{case.name} [{case.size}] ...", flush=True)
        try:
            row = run_case(case, cfg, limits)
        except Exception as e:  # noqa: BLE001 - one broken benchmark must not lose the others' results
            row = {"name": case.name, "size": case.size, "unit": case.unit, "goals": [], "accuracy": {},
                   "errors": {"bench": f"{type(e).__name__}: {e}"[:500]}}
        print("  " + report.one_line(row), flush=True)
        rows.append(row)
    info["duration_s"] = round(time.time() - started, 1)
    return {"info": info, "settings": cfg, "limits": limits, "rows": rows}


def describe(args) -> dict:
    import torch

    import luminar
    return {"date": datetime.datetime.now().astimezone().isoformat(timespec="seconds"),
            "mode": "quick" if args.quick else "full", "cpu": machine.cpu_model(), "cpus": os.cpu_count(),
            "memory_gib": round(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30, 1),
            "python": platform.python_version(), "luminar": f"{luminar.__version__} ({machine.git_revision()})",
            "numpy": np.__version__, "blas": machine.openblas_info(), "torch": torch.__version__,
            "threads": args.threads, "torch_threads": torch.get_num_threads(), "compiler": machine.compiler_version(),
            "unset_env": json.loads(os.environ.get("LUMINAR_BENCH_UNSET", "{}")),
            "command": " ".join(["python bench/run.py", *sys.argv[1:]]) if sys.argv[1:] else "make bench"}


# -- one benchmark ------------------------------------------------------------------------------------
def run_case(case: cases.Case, cfg: dict, limits: dict) -> dict:
    import torch
    row = {"name": case.name, "size": case.size, "unit": case.unit, "flops": case.flops, "bytes": case.bytes,
           "note": case.note, "goals": [], "errors": {}, "accuracy": {}}
    arrays = case.inputs()
    reference = as_arrays(case.numpy_fn(**{k: v.astype(np.float64) for k, v in arrays.items()}))
    tensors = {k: torch.from_numpy(v) for k, v in arrays.items()}
    contenders = {"numpy": lambda: case.numpy_fn(**arrays), "torch": lambda: case.torch_fn(**tensors)}
    program = compile_luminar(case, row)
    if program is not None:
        contenders = {"luminar": lambda: program(**arrays), **contenders}
    checked, first_call = {}, {}
    for name, fn in contenders.items():
        start = time.perf_counter()
        try:
            out = as_arrays(fn())
        except Exception as e:  # noqa: BLE001 - a failing contender is reported, the others still run
            row["errors"][name] = f"run failed: {type(e).__name__}: {e}"[:500]
            continue
        first_call[name] = time.perf_counter() - start
        wrong, imprecise = check(out, reference, case.rtol)
        if wrong:
            row["errors"][name] = f"wrong result, not timed: {wrong}"
        else:
            checked[name] = fn
            if imprecise:
                row["accuracy"][name] = f"imprecise (timed anyway): {imprecise}"
    if program is not None:
        row["memory"] = memory_plan(program, case.dims)
    settle()  # our own pools stop spinning first: they must not count as someone else's load
    row["idle_before"] = machine.wait_for_idle(cfg["idle_wait_s"])
    with machine.LoadMonitor() as load:
        row["times"] = interleaved(checked, max_rounds=cfg["max_rounds"], min_rounds=cfg["min_rounds"],
                                   budget_s=cfg["budget_s"], warm_calls=first_call)
    row["foreign_cpus"], row["steal_cpus"] = round(load.foreign_cpus, 3), round(load.steal_cpus, 3)
    score(row, case, limits)
    return row


def compile_luminar(case, row):
    """Compile cold (empty cache) then again (cached); record both times. None if it fails."""
    try:
        graph = case.graph()
        start = time.perf_counter()
        program = graph.compile("cpu")
        row["compile_first_s"] = time.perf_counter() - start
        start = time.perf_counter()
        graph.compile("cpu")
        row["compile_cached_s"] = time.perf_counter() - start
        row["source_lines"] = program.source.count("\n") + 1 if hasattr(program, "source") else None
        return program
    except Exception as e:  # noqa: BLE001 - the backend is under construction: report, keep going
        row["errors"]["luminar"] = f"compile failed: {type(e).__name__}: {e}"[:500]
        return None


def as_arrays(out) -> dict[str, np.ndarray]:
    result = {}
    for name, value in out.items():
        if hasattr(value, "detach"):
            value = value.detach().numpy()
        result[name] = np.asarray(value)
    return result


def mismatch(out: dict, reference: dict, rtol: float) -> str | None:
    """None if `out` matches the float64 reference within rtol (scaled by each value and the output's magnitude)."""
    for name, ref in reference.items():
        if name not in out:
            return f"output {name!r} missing"
        got = np.asarray(out[name], np.float64)
        if got.shape != ref.shape:
            return f"{name}: shape {got.shape}, expected {ref.shape}"
        if not np.isfinite(got).all():
            return f"{name}: {int((~np.isfinite(got)).sum())} non-finite values"
        scale = float(np.abs(ref).max()) if ref.size else 0.0
        err = np.abs(got - ref)
        bad = err > rtol * (np.abs(ref) + scale)
        if bad.any():
            worst = np.unravel_index(int(np.argmax(err)), err.shape) if err.ndim else ()
            return (f"{name}: {int(bad.sum())} of {ref.size} values off by more than rtol {rtol:g}; worst at "
                    f"{tuple(int(i) for i in worst)}: {float(got[worst]):.6g} vs {float(ref[worst]):.6g} "
                    f"(output scale {scale:.3g})")
    return None


def check(out: dict, reference: dict, rtol: float) -> tuple[str | None, str | None]:
    """(wrong, imprecise): wrong beyond WRONG_FACTOR x rtol (not timed), or merely outside rtol (noted)."""
    imprecise = mismatch(out, reference, rtol)
    if imprecise is None:
        return None, None
    return mismatch(out, reference, WRONG_FACTOR * rtol), imprecise


def memory_plan(program, dims: dict) -> dict | None:
    if not hasattr(program, "memory_plan"):
        return None
    try:
        plan = program.memory_plan(dict(dims))
        plan = plan[0] if isinstance(plan, tuple) else plan  # older backends returned (plan, arena)
    except Exception as e:  # noqa: BLE001
        return {"error": f"{type(e).__name__}: {e}"[:300]}
    unshared, bound = liveness(program, dims)
    return {"arena_bytes": plan.arena_bytes, "lower_bound_bytes": bound, "unshared_bytes": unshared,
            "temps": len(plan.offsets), "met": plan.arena_bytes <= bound + ARENA_SLACK}


def liveness(program, dims: dict) -> tuple[int, int]:
    """(bytes the temporaries would take with a buffer each, the most bytes alive during any one
    kernel: no plan can use less), from the kernels' buffer lifetimes, sizes aligned as planned."""
    from luminar.compiler.memory import ALIGN, lifetimes
    life = lifetimes(program.kernels)
    size = {b.id: -(-int(b.numel.evaluate(dims)) * 4 // ALIGN) * ALIGN for b in program.kernels.buffers if b.id in life}
    alive = [sum(n for b, n in size.items() if life[b][0] <= k <= life[b][1]) for k in range(len(program.kernels.kernels))]
    return sum(size.values()), max(alive, default=0)


def score(row: dict, case: cases.Case, limits: dict):
    """Rates, speed ratios (other's median / luminar's: > 1 means luminar is faster) and goals."""
    times = row["times"]
    work = case.flops if case.unit == "GFLOP/s" else case.bytes
    row["rates"] = {name: work / (t["median_ms"] * 1e-3) / 1e9 for name, t in times.items()}
    limit = limits["peak_gflops"] if case.unit == "GFLOP/s" else limits["bandwidth_gbs"]
    row["fraction_of_limit"] = row["rates"]["luminar"] / limit if "luminar" in times else None
    lum = times.get("luminar")
    row["speed_vs"] = {name: t["median_ms"] / lum["median_ms"] for name, t in times.items()
                       if lum and name != "luminar"}
    row["speed_vs_best"] = {name: t["best_ms"] / lum["best_ms"] for name, t in times.items()
                            if lum and name != "luminar"}
    for goal in case.goals:
        if lum is None:
            met, value = None, None
        elif goal.vs == "bandwidth":
            value = row["rates"]["luminar"] / limits["bandwidth_gbs"]
            met = value >= goal.ratio
        else:
            value = row["speed_vs"].get(goal.vs)
            met = None if value is None else value >= goal.ratio
        row["goals"].append({"goal": goal.text, "value": value, "met": met})


if __name__ == "__main__":
    sys.exit(main())
