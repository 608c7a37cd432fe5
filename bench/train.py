"""Training step time: luminar's compiled TrainStep against PyTorch eager on the same model, the same
batch and the same optimizer; writes bench/TRAIN.md and bench/train.json.

    .venv/bin/python bench/train.py              # 1 and 2 threads, every case (a few minutes)
    .venv/bin/python bench/train.py --quick      # smoke run: prints the table, writes nothing
    .venv/bin/python bench/train.py --threads 1 --only cnn

The models are the examples' own (examples/train_digits.py, examples/train_charlm.py), built
once with luminar.nn and once with torch.nn from the same initial weights:

- digits MLP and CNN, batch 32, Adam (lr 3e-3): the example's training step;
- the character transformer (1 layer, width 64, 4 heads, 128 positions), AdamW with gradient
  clipping and the example's warm-up + cosine schedule (fed to torch's optimizer step by step),
  at the example's batch (1 window) and at a batch of 8 windows.

Per thread count the bench restarts itself (OpenMP and torch read their thread count once), with
an empty compile cache, so the first compile of each TrainStep is cold. Per case: compile, run
three steps on both sides from the same weights and compare the losses (a case whose losses
disagree is flagged), wait (bounded) for an idle machine, time the steps interleaved (median,
after warm-up, see timing.py; timed again, up to twice, when other processes took the CPUs the
threads needed, keeping the quietest attempt), then profile luminar's step with LUMINAR_DEBUG=1 (per-kernel
times, median of several steps) and describe the kernels that dominate.
"""
from __future__ import annotations

import argparse
import contextlib
import datetime
import importlib.util
import io
import json
import os
import platform
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
THREAD_VARS = ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS")
LOSS_RTOL = 1e-3  # first-steps losses of the two sides must agree this well (float32, different op order)
CHECK_STEPS = 3
PROFILE_STEPS = 7
TOP_KERNELS = 6


# -- the cases --------------------------------------------------------------------------------------
def example(name: str):
    """Import examples/<name>.py (examples/ is not a package)."""
    spec = importlib.util.spec_from_file_location(f"example_{name}", ROOT / "examples" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


class Case:
    """One model at one batch size: `luminar()` builds a TrainStep, `torch_step()` the same step in torch.

    Subclasses set `inputs` (numpy, by graph input name) and implement the builders."""

    name = size = optimizer = ""

    def luminar(self):
        """A fresh compiled TrainStep from the initial weights (called again to profile)."""
        raise NotImplementedError

    def torch_step(self):
        """A zero-argument function running one torch training step; returns the loss as a float."""
        raise NotImplementedError


class DigitsCase(Case):
    def __init__(self, model: str, batch: int = 32, lr: float = 3e-3):
        import numpy as np

        import luminar.nn as lnn
        self.digits = example("train_digits")
        self.model_name, self.batch, self.lr = model, batch, lr
        self.name, self.size = f"digits {model}", f"batch {batch} x 1x8x8"
        self.optimizer = f"Adam(lr={lr})"
        x_train, y_train, _, _ = self.digits.load_data()
        self.inputs = {"images": x_train[:batch], "labels": y_train[:batch]}
        self.model = self.digits.MODELS[model](lnn, rng=np.random.default_rng(0))
        self.parameters = sum(p.size for p in self.model.parameters())

    def luminar(self):
        from luminar.optim import Adam
        step, _ = self.digits.train_step(self.model, self.batch, Adam(lr=self.lr))
        return step

    def torch_step(self):
        import torch
        twin = self.digits.MODELS[self.model_name](torch.nn)
        twin.load_state_dict({k: torch.from_numpy(v) for k, v in self.model.state_dict().items()})
        twin.train()
        optimizer = torch.optim.Adam(twin.parameters(), lr=self.lr)
        images, labels = torch.from_numpy(self.inputs["images"]), torch.from_numpy(self.inputs["labels"]).long()

        def step():
            optimizer.zero_grad(set_to_none=True)
            loss = torch.nn.functional.cross_entropy(twin(images), labels)
            loss.backward()
            optimizer.step()
            return loss.item()
        return step


class CharLMCase(Case):
    STEPS = 8000  # the example's schedule length (only its first steps run here)

    def __init__(self, batch: int, context: int = 128, width: int = 64, layers: int = 1, lr: float = 2e-3):
        import numpy as np
        self.charlm = example("train_charlm")
        self.batch, self.lr = batch, lr
        self.name = f"char transformer ({layers} layer{'s' if layers > 1 else ''}, width {width})"
        self.size = f"batch {batch} x {context} characters"
        self.optimizer = f"AdamW(lr={lr}, betas=(0.9, 0.99), wd 0.01), warm-up + cosine, clip 1.0"
        text = self.charlm.grammar_corpus()
        self.vocab = self.charlm.Vocabulary(text)
        data = self.vocab.encode(text)
        starts = np.random.default_rng(0).integers(0, len(data) - context - 1, batch)
        ids, targets = self.charlm.windows(data, starts, context)
        self.inputs = {"ids": ids, "targets": targets}
        self.model = self.charlm.CharTransformer(len(self.vocab), context, width, layers=layers, rng=0)
        self.layers, self.width, self.context = layers, width, context
        self.parameters = sum(p.size for p in self.model.parameters())

    def luminar(self):
        step, _ = self.charlm.build_trainer(self.model, self.batch, self.STEPS, self.lr)
        self.schedule = step.schedule
        return step

    def torch_step(self):
        import torch
        twin = torch_char_transformer(len(self.vocab), self.context, self.width, self.layers)
        twin.load_state_dict({k: torch.from_numpy(v) for k, v in self.model.state_dict().items()})
        twin.train()
        optimizer = torch.optim.AdamW(twin.parameters(), lr=self.lr, betas=(0.9, 0.99), weight_decay=0.01)
        ids, targets = torch.from_numpy(self.inputs["ids"]), torch.from_numpy(self.inputs["targets"]).long()
        schedule, steps_done = self.schedule, [0]  # set by luminar(), which run_case calls first

        def step():
            for group in optimizer.param_groups:  # the same schedule luminar's TrainStep feeds
                group["lr"] = schedule(steps_done[0])
            optimizer.zero_grad(set_to_none=True)
            logits = twin(ids)
            loss = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))
            loss.backward()
            torch.nn.utils.clip_grad_norm_(twin.parameters(), 1.0)
            optimizer.step()
            steps_done[0] += 1
            return loss.item()
        return step


def torch_char_transformer(vocab: int, context: int, width: int, layers: int):
    """examples/train_charlm.py's CharTransformer in torch.nn: same layers, same state-dict keys."""
    import torch
    nn = torch.nn

    class CharTransformer(nn.Module):
        def __init__(self):
            super().__init__()
            self.tok, self.pos = nn.Embedding(vocab, width), nn.Embedding(context, width)
            self.layers = nn.ModuleList([
                nn.TransformerEncoderLayer(width, 4, 4 * width, dropout=0.0, activation="gelu", batch_first=True,
                                           norm_first=True) for _ in range(layers)])
            self.norm, self.head = nn.LayerNorm(width), nn.Linear(width, vocab)

        def forward(self, ids):
            length = ids.shape[1]
            x = self.tok(ids) + self.pos(torch.arange(length))
            mask = nn.Transformer.generate_square_subsequent_mask(length)
            for layer in self.layers:
                x = layer(x, src_mask=mask, is_causal=True)
            return self.head(self.norm(x))
    return CharTransformer()


def all_cases(quick: bool) -> list:
    cases = [lambda: DigitsCase("cnn"), lambda: DigitsCase("mlp"), lambda: CharLMCase(batch=1)]
    if not quick:
        cases.append(lambda: CharLMCase(batch=8))
    return cases


# -- one case, in the child process ----------------------------------------------------------------
def run_case(case: Case, cfg: dict) -> dict:
    import numpy as np
    import machine
    from timing import interleaved, settle
    row = {"name": case.name, "size": case.size, "optimizer": case.optimizer, "parameters": case.parameters}
    started = time.perf_counter()
    trainer = case.luminar()
    row["compile_cold_s"] = round(time.perf_counter() - started, 2)
    torch_step = case.torch_step()
    luminar_losses = [trainer.step(case.inputs) for _ in range(CHECK_STEPS)]
    torch_losses = [torch_step() for _ in range(CHECK_STEPS)]
    difference = float(np.max(np.abs(np.subtract(luminar_losses, torch_losses)) / np.abs(torch_losses)))
    row["losses"] = {"luminar": luminar_losses, "torch": torch_losses, "max_rel_diff": difference,
                     "agree": difference <= LOSS_RTOL}
    contenders = {"luminar": lambda: trainer.step(case.inputs), "torch": torch_step}
    row["attempts"] = 0
    for _ in range(1 + cfg["retries"]):  # other tenants' bursts: time again, keep the quietest attempt
        settle()
        idle = machine.wait_for_idle(cfg["idle_wait_s"])
        with machine.LoadMonitor() as load:
            times = interleaved(contenders, max_rounds=cfg["max_rounds"], min_rounds=cfg["min_rounds"],
                                budget_s=cfg["budget_s"])
        row["attempts"] += 1
        if "foreign_cpus" not in row or load.foreign_cpus < row["foreign_cpus"]:
            row.update(idle_before=idle, times=times, foreign_cpus=round(load.foreign_cpus, 3))
        if not disturbed(row, cfg["threads"], os.cpu_count()):
            break
    luminar_ms, torch_ms = row["times"]["luminar"]["median_ms"], row["times"]["torch"]["median_ms"]
    row["speed_vs_torch"] = torch_ms / luminar_ms
    row["profile"] = profile(case)
    return row


def profile(case: Case) -> dict:
    """Per-kernel times of luminar's step (LUMINAR_DEBUG=1 on a freshly built copy; median per
    kernel over PROFILE_STEPS steps) and what the slowest kernels compute."""
    os.environ["LUMINAR_DEBUG"] = "1"  # read when a program is built
    try:
        with contextlib.redirect_stderr(io.StringIO()):
            started = time.perf_counter()
            trainer = case.luminar()
            warm_compile = time.perf_counter() - started
    finally:
        del os.environ["LUMINAR_DEBUG"]
    per_kernel: dict[str, list[float]] = {}
    totals = []
    for _ in range(PROFILE_STEPS):
        captured = io.StringIO()
        with contextlib.redirect_stderr(captured):
            trainer.step(case.inputs)
        for line in captured.getvalue().splitlines():
            total = re.match(r"\[luminar\] cpu call: ([\d.]+) ms", line)
            kernel = re.match(r"\[luminar\]\s+([\d.]+) ms\s+(\S+)", line)
            if total:
                totals.append(float(total[1]))
            elif kernel:
                per_kernel.setdefault(kernel[2], []).append(float(kernel[1]))
    medians = {name: statistics.median(times) for name, times in per_kernel.items()}
    kernels = {k.name: k for k in trainer.program.kernels.kernels}
    top = sorted(medians.items(), key=lambda item: -item[1])[:TOP_KERNELS]
    kernel_sum = sum(medians.values())
    nested = sum(ms for name, ms in medians.items() if "(nested)" in describe_kernel(kernels[name]))
    return {"kernels": len(medians), "compile_warm_s": round(warm_compile, 2),
            "nested_share": nested / kernel_sum if kernel_sum else 0.0,
            "kernel_ms_median_call": statistics.median(totals) if totals else None,
            "top": [{"kernel": name, "ms": ms, "share": ms / kernel_sum if kernel_sum else 0.0,
                     "shape": "x".join(str(d) for d in kernels[name].shape),
                     "computes": describe_kernel(kernels[name])} for name, ms in top]}


def describe_kernel(kernel) -> str:
    """What a kernel computes, read from its IR: its reduction loops ('sum over 8 x 128 (nested)',
    '3 sums over 64' for several fused side by side), short reductions the lowering unrolled
    (relu's 2-element max, a 3x3 window) and its count of arithmetic ops per output element."""
    from luminar.compiler.kernels import Apply, Reduce, walk

    def top_level_reduces(expr):
        if isinstance(expr, Reduce):
            return [expr]
        if isinstance(expr, Apply):
            return [r for a in expr.args for r in top_level_reduces(a)]
        body = getattr(expr, "body", None) or getattr(expr, "value", None)
        return top_level_reduces(body) if body is not None and not isinstance(body, (int, float)) else []

    nodes = list(walk(kernel.value))
    ops = sum(isinstance(n, Apply) for n in nodes)
    unrolled = [n.op for n in nodes if isinstance(n, Apply) and n.op.endswith("_reduce")]
    parts = []
    reduces = top_level_reduces(kernel.value)
    if reduces:
        chain, node = [], reduces[0]
        while isinstance(node, Reduce):
            chain.append(str(node.extent))
            node = node.body
        kind = reduces[0].op.replace("_reduce", "")
        count = f"{len(reduces)} {kind}s" if len(reduces) > 1 else kind
        parts.append(f"{count} over {' x '.join(chain)}" + (" (nested)" if len(chain) > 1 else ""))
    if unrolled:
        kinds = sorted(set(unrolled))
        parts.append(f"{len(unrolled)} unrolled {'/'.join(k.replace('_reduce', '') for k in kinds)}")
    parts.append(f"{ops} IR ops")
    return ", ".join(parts) if reduces or unrolled else f"elementwise, {ops} IR ops"


def child(args) -> None:
    """Measure every case at this process's thread count; print one JSON line at the end."""
    sys.path.insert(0, str(HERE))
    import torch
    torch.set_num_threads(args.threads)
    cfg = settings(args)
    rows = []
    for make_case in all_cases(args.quick):
        case = make_case()
        if args.only and args.only.lower() not in f"{case.name} {case.size}".lower():
            continue
        try:
            row = run_case(case, cfg)
        except Exception as e:  # noqa: BLE001 - one broken case must not lose the others' results
            row = {"name": case.name, "size": case.size, "error": f"{type(e).__name__}: {e}"[:500]}
        rows.append(row)
        print(f"  [{args.threads} thread{'s' if args.threads > 1 else ''}] {one_line(row)}", file=sys.stderr,
              flush=True)
    print("RESULT " + json.dumps({"threads": args.threads, "torch_threads": torch.get_num_threads(), "rows": rows}))


def settings(args) -> dict:
    if args.quick:
        return {"max_rounds": 5, "min_rounds": 3, "budget_s": 0.5, "idle_wait_s": 1, "retries": 0,
                "threads": args.threads}
    return {"max_rounds": 30, "min_rounds": 7, "budget_s": 3.0, "retries": 2, "threads": args.threads,
            "idle_wait_s": 10 if args.idle_wait is None else args.idle_wait}


# -- the parent: one child per thread count, then the report ----------------------------------------
def run_child(threads: int, args) -> dict:
    env = dict(os.environ)
    env.update({k: str(threads) for k in THREAD_VARS})
    cache = tempfile.mkdtemp(prefix="luminar-train-bench-")
    env["LUMINAR_CACHE"] = cache  # cold first compiles; the user's cache is untouched
    env.pop("LUMINAR_DEBUG", None)
    command = [sys.executable, str(Path(__file__).resolve()), "--child", "--threads", str(threads)]
    command += (["--quick"] if args.quick else []) + (["--only", args.only] if args.only else [])
    command += ["--idle-wait", str(args.idle_wait)] if args.idle_wait is not None else []
    try:
        result = subprocess.run(command, env=env, stdout=subprocess.PIPE, text=True, timeout=3600)
    finally:
        shutil.rmtree(cache, ignore_errors=True)
    lines = [line for line in result.stdout.splitlines() if line.startswith("RESULT ")]
    if result.returncode != 0 or not lines:
        raise SystemExit(f"bench child ({threads} threads) failed with exit code {result.returncode}")
    return json.loads(lines[-1][len("RESULT "):])


def one_line(row: dict) -> str:
    if "error" in row:
        return f"{row['name']}: ERROR {row['error']}"
    t = row["times"]
    return (f"{row['name']} [{row['size']}]: luminar {t['luminar']['median_ms']:.3g} ms, "
            f"torch {t['torch']['median_ms']:.3g} ms, {row['speed_vs_torch']:.2f}x; "
            f"losses agree: {row['losses']['agree']} ({row['losses']['max_rel_diff']:.1e})")


def markdown(result: dict) -> str:
    info = result["info"]
    lines = ["# Training step: luminar vs PyTorch eager", "",
             f"Generated by `{info['command']}` on {info['date']} ({info['duration_s']} s).", "",
             f"- Machine: {info['cpu']}, {info['cpus']} CPUs",
             f"- Versions: luminar {info['luminar']}; PyTorch {info['torch']} (eager, autograd); "
             f"numpy {info['numpy']}; Python {info['python']}",
             "- One training step = forward, loss, backward, optimizer update (luminar: one compiled "
             "`TrainStep` call; torch: zero_grad, forward, backward, [clip,] step, loss.item()). Same model, "
             "initial weights, batch and optimizer on both sides; the same batch every step.",
             "- Median time per step over interleaved rounds (luminar and torch take turns, each sample "
             "started on a quiet process; see bench/timing.py). *speed vs torch* = torch's median / "
             "luminar's (> 1: luminar is faster). Goal (issue 6): faster than eager.",
             f"- *losses agree*: the first {CHECK_STEPS} steps' losses from the same initial weights, max "
             f"relative difference (must be <= {LOSS_RTOL:g}).",
             "- *foreign CPUs*: CPUs' worth of time other processes used while the case was timed (0 = the "
             "machine was ours). A row is marked *unreliable* when they left fewer free CPUs than the row's "
             "threads (by more than a quarter CPU): a parallel region then waits for a descheduled thread, "
             "on both sides.", ""]
    lines += ["| model | batch | threads | luminar ms | torch ms | speed vs torch | goal: faster than eager | "
              "losses agree | cold compile | foreign CPUs |",
              "|---|---|---:|---:|---:|---:|---|---|---:|---:|"]
    for run in result["runs"]:
        for row in run["rows"]:
            if "error" in row:
                lines.append(f"| {row['name']} | | {run['threads']} | error: {row['error']} | | | | | | |")
                continue
            t, speed = row["times"], row["speed_vs_torch"]
            status = f"met ({speed:.2f}x)" if speed > 1 else f"**missed** ({speed:.2f}x)"
            if disturbed(row, run["threads"], result["info"]["cpus"]):
                status += "; machine busy: unreliable"
            agree = f"{'yes' if row['losses']['agree'] else '**no**'} ({row['losses']['max_rel_diff']:.0e})"
            lines.append(f"| {row['name']} | {row['size']} | {run['threads']} | {t['luminar']['median_ms']:.3g} | "
                         f"{t['torch']['median_ms']:.3g} | {speed:.2f}x | {status} | {agree} | "
                         f"{row['compile_cold_s']:.1f} s | {row['foreign_cpus']:.2f} |")
    lines += ["", "## Where luminar's step time goes", "",
              "Per-kernel times from `LUMINAR_DEBUG=1` (median per kernel over "
              f"{PROFILE_STEPS} steps, {result['runs'][0]['threads']} thread(s)); *computes* is read from "
              "the kernel IR: a *nested* sum reduces over two or more loop axes (e.g. a weight gradient "
              "summed over batch and position).", ""]
    for row in result["runs"][0]["rows"]:
        if "error" in row:
            continue
        p = row["profile"]
        kernel_ms = p["kernel_ms_median_call"]
        lines += [f"### {row['name']}, {row['size']}", "",
                  f"{p['kernels']} kernels; {kernel_ms:.3g} ms in kernels per step (median) of "
                  f"{row['times']['luminar']['median_ms']:.3g} ms per step; warm compile "
                  f"{p['compile_warm_s']:.2f} s; nested sums take {p['nested_share']:.0%} of the kernel time.", "",
                  "| kernel | shape | computes | ms | share of kernel time |", "|---|---|---|---:|---:|"]
        lines += [f"| {k['kernel']} | {k['shape']} | {k['computes']} | {k['ms']:.3g} | {k['share']:.0%} |"
                  for k in p["top"]]
        lines.append("")
    return "\n".join(lines) + "\n"


def disturbed(row: dict, threads: int, cpus: int) -> bool:
    """Whether other processes took CPUs this row's threads needed while it was timed."""
    return row["foreign_cpus"] > max(cpus - threads, 0) + 0.25


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--threads", default="1,2", help="comma-separated thread counts, one run each (default 1,2)")
    p.add_argument("--quick", action="store_true", help="few rounds, no batch-8 transformer; writes nothing")
    p.add_argument("--only", default="", help="only cases whose name or size contains this text")
    p.add_argument("--idle-wait", type=float, default=None, help="max seconds to wait for an idle machine per case")
    p.add_argument("--out", type=Path, default=HERE, help="folder for TRAIN.md and train.json (default bench/)")
    p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.child:
        args.threads = int(args.threads)
    else:
        args.threads = [int(t) for t in args.threads.split(",") if t.strip()]
        if not args.threads or min(args.threads) < 1:
            p.error("--threads: give thread counts >= 1, e.g. 1,2")
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.child:
        child(args)
        return 0
    started = time.time()
    runs = []
    for threads in args.threads:
        print(f"{threads} thread(s): compiling (cold cache), checking, timing, profiling ...", flush=True)
        runs.append(run_child(threads, args))
    result = {"info": describe(args, time.time() - started), "runs": runs}
    text = markdown(result)
    print(text)
    if not args.quick:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "TRAIN.md").write_text(text)
        (args.out / "train.json").write_text(json.dumps(result, indent=1) + "\n")
        print(f"wrote {args.out / 'TRAIN.md'} and {args.out / 'train.json'}")
    return 0


def describe(args, duration_s: float) -> dict:
    sys.path.insert(0, str(HERE))
    import machine
    import numpy as np
    import torch

    import luminar
    command = " ".join(["python bench/train.py", *sys.argv[1:]])
    return {"date": datetime.datetime.now().astimezone().isoformat(timespec="seconds"),
            "duration_s": round(duration_s, 1), "command": command, "cpu": machine.cpu_model(),
            "cpus": os.cpu_count(), "python": platform.python_version(),
            "luminar": f"{luminar.__version__} ({machine.git_revision()})", "torch": torch.__version__,
            "numpy": np.__version__}


if __name__ == "__main__":
    sys.exit(main())
