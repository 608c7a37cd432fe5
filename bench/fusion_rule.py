"""The CPU's online-softmax rule (CPUTarget.default_fusion) against the stored attention kernels, on
real models in one process: the same model loaded twice, once with the rule off (the three
stored kernels per attention: scores, softmax, probs @ v), timed in interleaved rounds, medians.

    .venv/bin/python bench/fusion_rule.py [--model smollm2|gemma] [--rounds 7]

For each round and model: a 512-token prefill from an empty cache, and at contexts 40, 160 and
400 the median of 24 one-token decode steps (greedy). Two OpenMP threads throughout (the thread
chooser's one-thread trials are switched off, so every call is a two-thread call). Also the
largest difference of the two models' last-position prefill logits. Prints; writes nothing.
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

CONTEXTS = (40, 160, 400)
STEPS = 24
PREFILL = list(range(100, 612))  # 512 token ids


def load(path, rule: bool):
    """The model as models.load() gives it, or with the fusion rule off; every call on 2 threads."""
    import luminar.models
    from luminar.backends.cpu.target import CPUTarget
    saved = CPUTarget.default_fusion
    if not rule:
        CPUTarget.default_fusion = lambda self, kernel, forms: None
    try:
        model = luminar.models.load(path)
    finally:
        CPUTarget.default_fusion = saved
    program = model.program
    program.threads.run = lambda key, call: (program.threads._set(2), call())
    return model


def prefill(model) -> tuple[float, np.ndarray]:
    cache = model.new_cache(len(PREFILL))
    started = time.perf_counter()
    logits = model.forward(PREFILL, cache)
    return time.perf_counter() - started, logits[-1]


def decode_step(model, context: int) -> float:
    """Median seconds of STEPS one-token steps after a `context`-token prompt."""
    cache = model.new_cache(context + STEPS + 2)
    token = int(model.forward(list(range(200, 200 + context)), cache)[-1].argmax())
    times = []
    for _ in range(STEPS):
        started = time.perf_counter()
        token = int(model.forward([token], cache)[-1].argmax())
        times.append(time.perf_counter() - started)
    return statistics.median(times)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", choices=["smollm2", "gemma"], action="append")
    ap.add_argument("--rounds", type=int, default=7)
    args = ap.parse_args()
    from luminar.io.gguf import default_model_path, gemma3_model_path
    paths = {"smollm2": default_model_path, "gemma": gemma3_model_path}
    import machine
    print(f"{machine.cpu_model()}, luminar {machine.git_revision()}; idle before: {machine.wait_for_idle(30)}")
    for name in args.model or ["smollm2", "gemma"]:
        stored, fused = load(str(paths[name]()), rule=False), load(str(paths[name]()), rule=True)
        print(f"{name}: {len(stored.program.kernels.kernels)} kernels stored, {len(fused.program.kernels.kernels)} "
              f"with the rule")
        (_, a), (_, b) = prefill(stored), prefill(fused)
        print(f"  last-position prefill logits differ by at most {float(np.abs(a - b).max()):.2e}; "
              f"argmax {'agrees' if a.argmax() == b.argmax() else 'DIFFERS'}")
        times = {}
        for _ in range(args.rounds):
            for label, model in (("stored", stored), ("online", fused)):
                times.setdefault(("prefill 512", label), []).append(prefill(model)[0])
                for context in CONTEXTS:
                    times.setdefault((f"decode step, context {context}", label), []).append(decode_step(model, context))
        for what in dict.fromkeys(w for w, _ in times):
            s, o = statistics.median(times[what, "stored"]), statistics.median(times[what, "online"])
            print(f"  {what}: stored {s * 1e3:.2f} ms, online {o * 1e3:.2f} ms, {s / o:.3f}x faster "
                  f"({args.rounds} rounds, medians)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
