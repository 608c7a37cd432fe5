"""Rendering bench results (the dict run.py builds, also saved as results.json) as Markdown."""
from __future__ import annotations

CONTENDERS = ("luminar", "numpy", "torch")
ARENA_GOAL = "arena <= lower bound + 64 B"
NOISY_CPUS = 0.2  # other tenants' average CPU use above which a row's timings are flagged


def _ms(row, name) -> str:
    t = row.get("times", {}).get(name)
    if t is None:
        return "error" if name in row.get("errors", {}) else "—"
    return f"{t['median_ms']:.3g}" if t["median_ms"] < 100 else f"{t['median_ms']:.0f}"


def _ratio(value) -> str:
    return "—" if value is None else f"{value:.2f}x"


def _status(met) -> str:
    return {True: "met", False: "**MISSED**", None: "n/a"}[met]


def _bytes(n) -> str:
    for unit, size in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if n >= size:
            return f"{n / size:.2f} {unit}"
    return f"{n} B"


def _goal_cells(row) -> tuple[str, str]:
    if not row["goals"]:
        return "—", "—"
    goals = "; ".join(g["goal"] for g in row["goals"])
    status = "; ".join(_status(g["met"]) + ("" if g["value"] is None else f" ({g['value']:.2f})")
                       for g in row["goals"])
    return goals, status


def one_line(row) -> str:
    parts = [f"{name} {_ms(row, name)} ms" for name in CONTENDERS]
    rate = row.get("rates", {}).get("luminar")
    if rate is not None:
        parts.append(f"luminar {rate:.3g} {row['unit']}")
    parts += [f"vs {k} {v:.2f}x" for k, v in row.get("speed_vs", {}).items()]
    parts += [f"{g['goal']}: {_status(g['met'])}" for g in row["goals"]]
    memory = row.get("memory") or {}
    if "met" in memory:
        parts.append(f"arena {_bytes(memory['arena_bytes'])} (lower bound {_bytes(memory['lower_bound_bytes'])}): "
                     f"{_status(memory['met'])}")
    parts += [f"{k}: {v}" for k, v in {**row.get("errors", {}), **row.get("accuracy", {})}.items()]
    return ", ".join(parts)


def results_table(results) -> list[str]:
    lines = ["| benchmark | size | luminar ms | numpy ms | torch ms | luminar rate | of limit "
             "| vs numpy | vs torch | goal | status |",
             "|---|---|---:|---:|---:|---:|---:|---:|---:|---|---|"]
    for row in results["rows"]:
        rate = row.get("rates", {}).get("luminar")
        rate_text = "—" if rate is None else f"{rate:.3g} {row['unit']}"
        frac = row.get("fraction_of_limit")
        goal, status = _goal_cells(row)
        if "luminar" in row.get("errors", {}):
            status = "n/a: luminar " + row["errors"]["luminar"].split(":")[0]
        lines.append(f"| {row['name']} | {row['size']} | {_ms(row, 'luminar')} | {_ms(row, 'numpy')} "
                     f"| {_ms(row, 'torch')} | {rate_text} "
                     f"| {'—' if frac is None else f'{frac:.0%}'} | {_ratio(row.get('speed_vs', {}).get('numpy'))} "
                     f"| {_ratio(row.get('speed_vs', {}).get('torch'))} | {goal} | {status} |")
    return lines


def best_table(results) -> list[str]:
    lines = ["| benchmark | luminar best ms | numpy best ms | torch best ms | vs numpy (best) | vs torch (best) |",
             "|---|---:|---:|---:|---:|---:|"]
    for row in results["rows"]:
        times = row.get("times", {})
        best = [f"{times[n]['best_ms']:.3g}" if n in times else "—" for n in CONTENDERS]
        vs = row.get("speed_vs_best", {})
        lines.append(f"| {row['name']} | {' | '.join(best)} | {_ratio(vs.get('numpy'))} | {_ratio(vs.get('torch'))} |")
    return lines


def limits_table(limits) -> list[str]:
    lines = ["| kernel | threads | median | best |", "|---|---:|---:|---:|"]
    for r in limits["rows"]:
        unit = r["unit"]
        lines.append(f"| {r['kernel']} | {r['threads']} | {r['median']:.1f} {unit} | {r['best']:.1f} {unit} |")
    return lines


def memory_table(results) -> list[str]:
    lines = ["| benchmark | temps | arena | liveness lower bound | one buffer each | goal | status |",
             "|---|---:|---:|---:|---:|---|---|"]
    for row in results["rows"]:
        m = row.get("memory")
        if not m:
            continue
        if "error" in m:
            lines.append(f"| {row['name']} | — | — | — | — | {ARENA_GOAL} | error: {m['error']} |")
            continue
        lines.append(f"| {row['name']} | {m['temps']} | {_bytes(m['arena_bytes'])} | {_bytes(m['lower_bound_bytes'])} "
                     f"| {_bytes(m['unshared_bytes'])} | {ARENA_GOAL} | {_status(m['met'])} |")
    return lines


def compile_table(results) -> list[str]:
    lines = ["| benchmark | first compile (cold cache) | cached compile | generated C lines |",
             "|---|---:|---:|---:|"]
    for row in results["rows"]:
        if "compile_first_s" not in row:
            continue
        first, cached = row["compile_first_s"] * 1e3, row["compile_cached_s"] * 1e3
        lines.append(f"| {row['name']} | {first:.0f} ms | {cached:.1f} ms | {row.get('source_lines') or '—'} |")
    return lines


def noise_table(results) -> list[str]:
    lines = ["| benchmark | idle before timing (waited) | other tenants' load while timing | steal "
             "| samples luminar / numpy / torch | luminar spread (q1–q3 ms) |",
             "|---|---|---:|---:|---:|---:|"]
    for row in results["rows"]:
        idle = row.get("idle_before", {})
        times = row.get("times", {})
        samples = " / ".join(str(times[n]["samples"]) if n in times else "—" for n in CONTENDERS)
        lum = times.get("luminar")
        spread = f"{lum['q1_ms']:.3g}–{lum['q3_ms']:.3g}" if lum else "—"
        lines.append(f"| {row['name']} | {'yes' if idle.get('idle') else 'NO'} ({idle.get('waited_s', 0):.1f} s) "
                     f"| {row.get('foreign_cpus', 0):.2f} CPUs | {row.get('steal_cpus', 0):.2f} CPUs | {samples} "
                     f"| {spread} |")
    return lines


def errors_list(results) -> list[str]:
    lines = []
    for row in results["rows"]:
        for kind in ("errors", "accuracy"):
            for name, message in row.get(kind, {}).items():
                lines.append(f"- {row['name']} / {name}: {message}")
    return lines


def markdown(results) -> str:
    info, limits = results["info"], results["limits"]
    idle = limits["idle_before"]
    unset = ", ".join(f"{k}={v}" for k, v in info["unset_env"].items())
    out = [
        "# luminar benchmarks",
        "",
        f"Generated by `{info['command']}` ({info['mode']} run, {info['duration_s']:.0f} s) on {info['date']}.",
        "",
        f"- Machine: {info['cpu']}, {info['cpus']} CPUs, {info['memory_gib']} GiB",
        f"- Versions: luminar {info['luminar']}; numpy {info['numpy']} ({info['blas']}); "
        f"PyTorch {info['torch']} ({info['torch_threads']} threads, eager, no_grad); {info['compiler']}; "
        f"Python {info['python']}",
        f"- Threads per contender: {info['threads']} (OMP_NUM_THREADS, OPENBLAS_NUM_THREADS, torch.set_num_threads)",
        f"- Idle at start: {'yes' if idle['idle'] else 'NO'} (waited {idle['waited_s']:.1f} s, "
        f"idle fractions {idle['idle_fractions']}); other tenants' load while measuring limits: "
        f"{limits['foreign_cpus']:.2f} CPUs",
    ]
    busy = [row["name"] for row in results["rows"] if row.get("foreign_cpus", 0) > NOISY_CPUS]
    if busy:
        out.append(f"- **Warning: other processes used more than {NOISY_CPUS} CPUs while timing {len(busy)} of "
                   f"{len(results['rows'])} benchmarks** (see Noise): multi-threaded timings are unreliable there; "
                   f"rerun on an idle machine or compare with `--threads 1`.")
    if unset:
        out.append(f"- Unset for this run (numpy benchmarked with its default kernels): {unset}")
    out += [
        "",
        "## Machine limits (measured)",
        "",
        f"Peak: 12 independent SIMD-register FMA accumulators in C (compiled like luminar's kernels). Bandwidth: "
        f"{limits['array_mb']} MiB arrays; copy counts bytes read + written. A limit is the best run of any row "
        f"(other work only ever lowers a measurement); goals and *of limit* compare luminar's median with it: "
        f"**{limits['peak_gflops']:.1f} GFLOP/s** and **{limits['bandwidth_gbs']:.1f} GB/s**.",
        "",
        *limits_table(limits),
        "",
        "## Results",
        "",
        "Median time per call (interleaved rounds). *vs numpy* / *vs torch* are speed ratios: the other's median "
        "time / luminar's (> 1 means luminar is faster). *of limit*: luminar's rate as a fraction of the measured "
        "peak (GFLOP/s) or bandwidth (GB/s). Every contender's output was checked against a float64 numpy "
        "reference before timing.",
        "",
        *results_table(results),
        "",
        *[f"- {row['name']}: {row['note']}" for row in results["rows"] if row.get("note")],
        "",
        "Best (fastest) sample of each contender: less sensitive to other tenants' load than the median, "
        "but optimistic.",
        "",
        *best_table(results),
        "",
        "## Memory plans (luminar arena for temporaries)",
        "",
        *memory_table(results),
        "",
        "## Compile times",
        "",
        "First compile: graph -> C -> gcc -> .so with an empty LUMINAR_CACHE. Cached: the same graph compiled "
        "again (lowering, C rendering, cache hit, dlopen).",
        "",
        *compile_table(results),
        "",
        "## Noise",
        "",
        "Each benchmark waits (bounded) until both CPUs are >= 90% idle. 'Other tenants' load' is CPU time used "
        "by other processes during the timed rounds (from /proc/stat minus this process's own CPU time).",
        "",
        *noise_table(results),
    ]
    errors = errors_list(results)
    if errors:
        out += ["", "## Errors and accuracy notes", "", *errors]
    out += ["", "## Reproduce", "", "```",
            "make bench                              # full run, writes bench/RESULTS.md",
            ".venv/bin/python bench/run.py --quick   # smoke run, writes bench/quick/",
            ".venv/bin/python bench/run.py --only matmul   # a subset", "```", ""]
    return "\n".join(out)


def summary(results) -> str:
    return "\n".join(results_table(results))
