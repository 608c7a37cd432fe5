"""Benchmark luminar on real LLMs against transformers eager fp32 and llama.cpp on the same
files, and write bench/LLM.md and bench/llm.json.

    make bench-llm                          # the full run (~10 minutes, plus llama.cpp's first build)
    .venv/bin/python bench/llm.py --quick   # smoke run: prints the report, writes nothing
    .venv/bin/python bench/llm.py --peer-only [--quick]   # only the llama.cpp comparison

What is measured (issue 5's goals), in one process except the start-up times:

- cold start: `import luminar` + `luminar.models.load()` in a fresh subprocess with an empty
  LUMINAR_CACHE (so every kernel is compiled); warm start: the same with the cache filled.
- decode: batch 1, greedy, 128 new tokens after a short chat prompt. Decode tokens/s counts the
  127 tokens after the first (the first comes from the prefill pass, which is excluded). Both
  sides run the same loop: one forward pass per token with a KV cache, argmax in between.
- prefill: a 512-token prompt from an empty cache, the forward pass that yields the first token
  (logits for the last position only on both sides; transformers' logits_to_keep=1).

luminar and transformers take turns (interleaved rounds, each call started on a quiet process,
see timing.settle), after waiting (bounded) for an idle machine; medians and bests are reported.

llama.cpp, in the same run: bench/llama_cpp.py builds `llama-bench` once from the llama.cpp that
the llama-cpp-python sdist vendors (into ~/.cache/luminar-peers; skipped, with the reason, when
that is impossible). For SmolLM2-135M-Instruct (Q4_1) and Gemma 3 270M (Q4_K_M), rounds alternate
`llama-bench -p P -n N -t T -r 1` with luminar's decode of N tokens and prefill of P tokens on the
same file and thread count T (luminar's OpenMP team: OMP_NUM_THREADS, else one per CPU).
llama-bench decodes from an empty context, luminar after a short prompt; both prefill P tokens
into an empty cache. The same section reports each side's bandwidth fraction per token (the
weights read per token times tokens/s, over this run's bandwidth probe) and the one-thread CPU
time per decode token of both (a ratio that other tenants of a shared machine distort less).
"""
from __future__ import annotations

import argparse
import contextlib
import datetime
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

# llama.cpp on the same Q4_1 file, two threads (FACTS.md: "Models and references"): the goal
# table's fallback when llama.cpp cannot be built in this run
LLAMA_CPP = {"decode_tok_s": (86.0, 92.0), "prefill_512_s": 1.6}
FACTS_TRANSFORMERS = {"decode_tok_s": 25.6, "prefill_512_s": 0.58}
FACTS_CPU = "Xeon (Sapphire Rapids class, 2 vCPUs)"
CHAT_MESSAGE = "Write a short story about a robot who learns to paint."
PROSE = ("The history of the lighthouse is a history of people who chose to stay awake so that "
         "others could sleep. Keepers trimmed wicks, wound clockwork and polished lenses through "
         "storms that shook the towers, and they wrote down the weather every four hours. ")


# -- the start-up child: `python bench/llm.py --child-start` -------------------------------------
def child_start() -> None:
    """Import luminar and load the default model; print the timings as one JSON line."""
    started = time.perf_counter()
    import luminar.models
    imported = time.perf_counter()
    stages = []
    model = luminar.models.load(progress=lambda msg: stages.append((round(time.perf_counter() - imported, 3), msg)))
    loaded = time.perf_counter()
    ids = model.tokenizer.encode(model.tokenizer.apply_chat_template(
        [{"role": "user", "content": "What is the capital of France?"}], add_generation_prompt=True))
    first = int(model.forward(ids, model.new_cache(len(ids) + 1))[-1].argmax())
    done = time.perf_counter()
    print(json.dumps({"import_s": imported - started, "load_s": loaded - imported,
                      "ready_s": loaded - started, "first_token_s": done - loaded,
                      "first_token": model.tokenizer.decode([first]), "stages": stages}))


# -- one-thread CPU time per token: `python bench/llm.py --child-cpu NAME TOKENS` ---------------------
def child_cpu(name: str, tokens: int, activations: str = "float") -> None:
    """Load a model (OMP_NUM_THREADS=1 in the environment) and print, as one JSON line, the
    process CPU seconds per decode token (median of 3 rounds of `tokens` steps) and the bytes of
    weights a decode step reads (every stored weight; the embedding table is the tied output
    head on both models)."""
    lum = Luminar(None if name == "default" else name, activations)
    ids = [int(i) for i in lum.tokenizer.encode(PROSE[:80])]
    lum.decode(ids, 4)  # warm-up
    rounds, m = [], lum.model
    for _ in range(3):
        cache = m.new_cache(len(ids) + tokens + 1)
        token = int(m.forward(ids, cache)[-1].argmax())
        started = time.process_time()
        for _ in range(tokens):
            token = int(m.forward([token], cache)[-1].argmax())
        rounds.append((time.process_time() - started) / tokens)
    weights = sum(a.nbytes for a in lum.model.program.fixed.values())
    print(json.dumps({"cpu_s_per_token": statistics.median(rounds), "rounds": rounds, "weight_bytes": weights}))


def measure_cpu_time(binary, path: str, name: str, tokens: int) -> dict:
    """One thread each, CPU time per decode token (what other tenants of a shared machine cannot
    inflate as they inflate wall time): luminar in a child with OMP_NUM_THREADS=1, and
    llama-bench -t 1 as the difference of the CPU time of its runs with 4 + tokens and 4 tokens
    (load and warm-up cancel), three rounds each, medians."""
    import resource
    import llama_cpp
    env = dict(os.environ, OMP_NUM_THREADS="1")
    lum = {}
    for activations in ("float", "int8"):
        proc = subprocess.run([sys.executable, str(Path(__file__).resolve()), "--child-cpu", name or "default",
                               str(tokens), activations], env=env, capture_output=True, text=True, timeout=1800)
        if proc.returncode != 0:
            raise RuntimeError(f"the --child-cpu run failed: {proc.stderr[-2000:]}")
        lum[activations] = json.loads(proc.stdout.strip().splitlines()[-1])
    lum, int8 = lum["float"], lum["int8"]

    def children_cpu() -> float:
        usage = resource.getrusage(resource.RUSAGE_CHILDREN)
        return usage.ru_utime + usage.ru_stime
    peer = []
    for _ in range(3):
        spans = []
        for n in (4, 4 + tokens):
            before = children_cpu()
            llama_cpp.run_llama_bench(binary, path, 0, n, 1)
            spans.append(children_cpu() - before)
        peer.append((spans[1] - spans[0]) / tokens)
    return {"luminar_cpu_s_per_token": lum["cpu_s_per_token"], "luminar_rounds": lum["rounds"],
            "luminar_int8_cpu_s_per_token": int8["cpu_s_per_token"], "luminar_int8_rounds": int8["rounds"],
            "llama_cpp_cpu_s_per_token": statistics.median(peer), "llama_cpp_rounds": peer,
            "weight_bytes": lum["weight_bytes"]}


def run_start(cache_dir: str) -> dict:
    """One start-up in a fresh interpreter with LUMINAR_CACHE=cache_dir; the child's timings plus
    the process's wall time (interpreter start-up and exit included)."""
    env = dict(os.environ, LUMINAR_CACHE=cache_dir)
    env.pop("LUMINAR_DEBUG", None)
    started = time.perf_counter()
    proc = subprocess.run([sys.executable, str(Path(__file__).resolve()), "--child-start"], env=env,
                          capture_output=True, text=True, timeout=900)
    wall = time.perf_counter() - started
    if proc.returncode != 0:
        raise RuntimeError(f"start-up child failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    result["process_wall_s"] = wall
    return result


def measure_starts(cold_repeats: int, warm_repeats: int) -> dict:
    """Cold starts, each into its own new empty cache, each followed by warm starts on that cache."""
    cold, warm = [], []
    if cold_repeats == 0:  # quick: warm starts on the user's cache (filled by any earlier load)
        from luminar.compiler.target import cache_dir
        for _ in range(warm_repeats):
            warm.append(run_start(str(cache_dir())))
            say(f"  warm start (default cache): ready in {warm[-1]['ready_s']:.2f} s")
        return {"cold": cold, "warm": warm, "cache": "default"}
    root = tempfile.mkdtemp(prefix="luminar-llm-bench-")
    try:
        for i in range(cold_repeats):
            cache = os.path.join(root, f"cache{i}")
            os.makedirs(cache)
            cold.append(run_start(cache))
            say(f"  cold start {i + 1}: ready in {cold[-1]['ready_s']:.1f} s")
            for _ in range(warm_repeats - cold_repeats + 1 if i == 0 else 1):
                warm.append(run_start(cache))
                say(f"  warm start: ready in {warm[-1]['ready_s']:.2f} s")
    finally:
        shutil.rmtree(root, ignore_errors=True)
    return {"cold": cold, "warm": warm, "cache": "new temporary"}


# -- the contenders ---------------------------------------------------------------------------------
class Luminar:
    def __init__(self, path=None, activations: str = "float"):
        """`activations` "int8": the model with int8-quantized activations (models.load's option)."""
        import luminar.models
        self.name = "luminar" if activations == "float" else f"luminar {activations}"
        started = time.perf_counter()
        self.model = luminar.models.load(path, activations=activations)
        self.load_s = time.perf_counter() - started
        self.tokenizer = self.model.tokenizer

    def decode(self, ids: list[int], new_tokens: int) -> tuple[list[int], list[float]]:
        """Greedy: prefill `ids`, then new_tokens - 1 one-token steps; (tokens, per-step seconds)."""
        m = self.model
        cache = m.new_cache(len(ids) + new_tokens + 1)
        token = int(m.forward(ids, cache)[-1].argmax())
        tokens, steps = [token], []
        for _ in range(new_tokens - 1):
            started = time.perf_counter()
            token = int(m.forward([token], cache)[-1].argmax())
            steps.append(time.perf_counter() - started)
            tokens.append(token)
        return tokens, steps

    def prefill(self, ids: list[int]):
        """Seconds for the forward pass over `ids` from an empty cache, and the last position's logits."""
        cache = self.model.new_cache(len(ids))
        started = time.perf_counter()
        logits = self.model.forward(ids, cache)
        return time.perf_counter() - started, logits[-1]


class Transformers:
    name = "transformers"

    def __init__(self, gguf_path: str):
        os.environ["HF_HUB_OFFLINE"] = "1"
        import inspect

        import torch
        import transformers.utils.logging
        from transformers import AutoModelForCausalLM
        transformers.utils.logging.disable_progress_bar()
        torch.set_num_threads(2)
        self.torch = torch
        started = time.perf_counter()
        self.model = AutoModelForCausalLM.from_pretrained(os.path.dirname(gguf_path),
                                                          gguf_file=os.path.basename(gguf_path),
                                                          dtype=torch.float32).eval()
        self.load_s = time.perf_counter() - started
        self.attn_implementation = getattr(self.model.config, "_attn_implementation", "?")
        # transformers >= 5.2x calls the KV cache `cache` (`past_key_values` before, now deprecated)
        self.cache_arg = "cache" if "cache" in inspect.signature(self.model.forward).parameters else "past_key_values"

    def decode(self, ids: list[int], new_tokens: int) -> tuple[list[int], list[float]]:
        """The same loop as Luminar.decode, with transformers' KV cache (past_key_values)."""
        torch = self.torch
        with torch.no_grad():
            out = self.model(input_ids=torch.tensor([ids]), use_cache=True, logits_to_keep=1)
            past, token = out[self.cache_arg], int(out.logits[0, -1].argmax())
            tokens, steps = [token], []
            for _ in range(new_tokens - 1):
                started = time.perf_counter()
                out = self.model(input_ids=torch.tensor([[token]]), use_cache=True, **{self.cache_arg: past})
                past, token = out[self.cache_arg], int(out.logits[0, -1].argmax())
                steps.append(time.perf_counter() - started)
                tokens.append(token)
        return tokens, steps

    def generate_seconds(self, ids: list[int], new_tokens: int) -> float:
        """Wall time of model.generate (greedy, use_cache, no early stop) for new_tokens tokens."""
        torch = self.torch
        with torch.no_grad():
            started = time.perf_counter()
            self.model.generate(torch.tensor([ids]), attention_mask=torch.ones(1, len(ids), dtype=torch.long),
                                max_new_tokens=new_tokens, min_new_tokens=new_tokens, do_sample=False,
                                use_cache=True, pad_token_id=0)
            return time.perf_counter() - started

    def prefill(self, ids: list[int]):
        torch = self.torch
        with torch.no_grad():
            started = time.perf_counter()
            out = self.model(input_ids=torch.tensor([ids]), use_cache=True, logits_to_keep=1)
            seconds = time.perf_counter() - started
        return seconds, out.logits[0, -1].numpy()


# -- measurements -------------------------------------------------------------------------------------
def say(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def summary(values: list[float]) -> dict:
    return {"median": statistics.median(values), "best": min(values), "worst": max(values), "n": len(values),
            "all": [round(v, 6) for v in values]}


def rotated(items: list, round_index: int) -> list:
    k = round_index % len(items)
    return items[k:] + items[:k]


def measure_decode(contenders: list, ids: list[int], new_tokens: int, rounds: int) -> dict:
    """Interleaved greedy decode rounds; tokens/s from each round's summed step times."""
    from timing import settle
    results = {c.name: {"rounds_tok_s": [], "step_ms": []} for c in contenders}
    for c in contenders:  # warm-up: memory plans, thread pools, lazy allocations
        c.decode(ids, min(new_tokens, 4))
    for r in range(rounds):
        for c in rotated(contenders, r):
            settle()
            tokens, steps = c.decode(ids, new_tokens)
            res = results[c.name]
            res["rounds_tok_s"].append(len(steps) / sum(steps))
            res["step_ms"].extend(s * 1e3 for s in steps)
            res["tokens"] = tokens
            say(f"  decode round {r + 1}: {c.name} {res['rounds_tok_s'][-1]:.1f} tok/s")
    for res in results.values():
        tok_s = res.pop("rounds_tok_s")
        steps = res.pop("step_ms")
        res["tok_s"] = {"median": statistics.median(tok_s), "best": max(tok_s), "worst": min(tok_s),
                        "n": len(tok_s), "all": [round(v, 3) for v in tok_s]}
        res["step_ms"] = {"median": statistics.median(steps), "best": min(steps), "p90": sorted(steps)[int(0.9 * len(steps))]}
    return results


def measure_generate(hf: Transformers, ids: list[int], new_tokens: int, rounds: int) -> dict:
    """transformers' own generate(): decode tok/s = (n - 1) / (t(n) - t(1))."""
    from timing import settle
    hf.generate_seconds(ids, 2)
    rates, longs, shorts = [], [], []
    for _ in range(rounds):
        settle()
        shorts.append(hf.generate_seconds(ids, 1))
        settle()
        longs.append(hf.generate_seconds(ids, new_tokens))
        rates.append((new_tokens - 1) / (longs[-1] - shorts[-1]))
    return {"tok_s": {"median": statistics.median(rates), "best": max(rates), "all": [round(v, 3) for v in rates]},
            "generate_1_s": summary(shorts), f"generate_{new_tokens}_s": summary(longs)}


# luminar's ThreadChooser (backends/cpu/program.py) tries one thread on the third call of each kind
# of call, and after a trial that loses by far only every 32nd: three warm-up prefills keep that
# trial out of the timed rounds (in the 20:35 run of 2026-12-01 it was one of three rounds).
WARM_UP_PREFILLS = 3


def measure_prefill(contenders: list, ids: list[int], rounds: int, budget_s: float = 60.0) -> dict:
    """Interleaved prefill rounds; a contender stops after 2 rounds once it has spent budget_s."""
    from timing import settle
    results, last_logits = {}, {}
    for c in contenders:
        for _ in range(WARM_UP_PREFILLS):
            c.prefill(ids)
    times = {c.name: [] for c in contenders}
    for r in range(rounds):
        for c in rotated(contenders, r):
            if len(times[c.name]) >= 2 and sum(times[c.name]) >= budget_s:
                continue
            settle()
            seconds, last_logits[c.name] = c.prefill(ids)
            times[c.name].append(seconds)
            say(f"  prefill round {r + 1}: {c.name} {seconds:.3f} s")
    for name, t in times.items():
        results[name] = {"seconds": summary(t), "tok_s_median": len(ids) / statistics.median(t)}
    return results, last_logits


# -- llama.cpp in the same run --------------------------------------------------------------------
def luminar_threads() -> int:
    return int(os.environ.get("OMP_NUM_THREADS") or os.cpu_count() or 1)


def peer_models() -> dict:
    """The GGUF files both sides run: label -> (path, luminar.models.load name)."""
    from luminar.io.gguf import default_model_path, gemma3_model_path
    return {"SmolLM2-135M-Instruct Q4_1": (str(default_model_path()), None),
            "Gemma 3 270M Q4_K_M": (str(gemma3_model_path()), "gemma")}


def measure_peer(cfg: dict, loaded: dict, build: bool = True) -> dict:
    """Interleaved rounds of llama-bench and luminar (decode N, prefill P) per model."""
    import llama_cpp
    from timing import settle
    from machine import measure_limits
    binary, why_not = llama_cpp.llama_bench(build=build, log=say)
    if binary is None:
        say(f"llama.cpp skipped: {why_not}")
        return {"skipped": why_not}
    n, p, threads = cfg["decode_tokens"], cfg["prefill_tokens"], luminar_threads()
    say("bandwidth probe (sum and copy, best of 5)...")
    limits = measure_limits(threads=(1, threads), repeats=5)
    out = {"binary": str(binary), "threads": threads, "models": {}, "bandwidth_gbs": limits["bandwidth_gbs"]}
    for label, (path, name) in peer_models().items():
        # luminar as loaded (float32 activations) and with int8 activations (extra rows)
        ours = {"luminar": loaded.get(name) or Luminar(name), "luminar int8": loaded.get((name, "int8")) or Luminar(name, "int8")}
        lum = ours["luminar"]
        ids = [int(i) for i in lum.tokenizer.encode(PROSE[:80])]
        long_ids = prefill_ids(lum.tokenizer, p)
        for model in ours.values():
            model.decode(ids, 4)  # warm-up
            for _ in range(WARM_UP_PREFILLS):
                model.prefill(long_ids)
        runs, tokens = {"luminar": [], "luminar int8": [], "llama.cpp": []}, {}
        for r in range(cfg["peer_rounds"]):
            for side in rotated(list(runs), r):
                settle()
                if side == "llama.cpp":
                    runs[side].append(llama_cpp.run_llama_bench(binary, path, p, n, threads))
                else:
                    tokens[side], steps = ours[side].decode(ids, n)
                    settle()
                    seconds, _ = ours[side].prefill(long_ids)
                    runs[side].append({"decode_tok_s": len(steps) / sum(steps), "prefill_s": seconds,
                                       "prefill_tok_s": p / seconds})
                last = runs[side][-1]
                say(f"  {label} round {r + 1}: {side} decode {last['decode_tok_s']:.1f} tok/s, "
                    f"prefill {p} {last['prefill_s']:.3f} s")
        medians = {side: {key: statistics.median(run[key] for run in rs) for key in ("decode_tok_s", "prefill_s")}
                   for side, rs in runs.items()}
        say(f"  {label}: one-thread CPU time per token...")
        cpu = measure_cpu_time(binary, path, name, n)
        out["models"][label] = {
            "path": path, "prompt_tokens": len(ids), "runs": runs, "median": medians, "cpu_time": cpu,
            "llama_cpp_build": runs["llama.cpp"][0].get("build", "?"),
            "decode_ratio": medians["luminar"]["decode_tok_s"] / medians["llama.cpp"]["decode_tok_s"],
            "prefill_ratio": medians["llama.cpp"]["prefill_s"] / medians["luminar"]["prefill_s"],
            "int8_decode_ratio": medians["luminar int8"]["decode_tok_s"] / medians["llama.cpp"]["decode_tok_s"],
            "int8_prefill_ratio": medians["llama.cpp"]["prefill_s"] / medians["luminar int8"]["prefill_s"],
            "int8_tokens_agree": _agreeing(tokens["luminar"], tokens["luminar int8"])}
    return out


def _repack_note(peer: dict) -> str:
    """A sentence when llama-bench's default crashed and a part was measured with --repack 0
    (llama_cpp.run_llama_bench), naming which figures come from which mode."""
    crashed = {label: run for label, m in peer["models"].items() for run in m["runs"]["llama.cpp"] if run.get("crash")}
    if not crashed:
        return ""
    modes = "; ".join(f"{label}: prefill {'default' if run['repack'].get('prefill') else '--repack 0'}, "
                      f"decode {'default' if run['repack'].get('decode') else '--repack 0'}" for label, run in crashed.items())
    return (f" **llama-bench's default crashed here** ({next(iter(crashed.values()))['crash']}; its default "
            f"repacks the weights for the CPU's extra buffer types, such as AMX), so each part was run alone, "
            f"in the default where that ran, else with `--repack 0` ({modes}).")


def _agreeing(a: list[int], b: list[int]) -> int:
    """How many leading tokens two greedy decodes share."""
    return next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))


def render_peer(peer: dict, cfg: dict) -> str:
    """The report section of measure_peer's results."""
    head = ["", "## Against llama.cpp, same run", ""]
    if "skipped" in peer:
        return "\n".join(head + [f"llama.cpp was not run: {peer['skipped']}", ""])
    n, p = cfg["decode_tokens"], cfg["prefill_tokens"]
    rows = []
    for label, m in peer["models"].items():
        ref = m["median"]["llama.cpp"]
        for side, key, name in (("luminar", "", label), ("luminar int8", "int8_", f"{label}, int8 activations")):
            lum = m["median"][side]
            rows.append([name, f"{lum['decode_tok_s']:.1f}", f"{ref['decode_tok_s']:.1f}", f"{m[key + 'decode_ratio']:.2f}×",
                         f"{lum['prefill_s']:.3f}", f"{ref['prefill_s']:.3f}", f"{m[key + 'prefill_ratio']:.2f}×"])
    return "\n".join(head + [
        f"`llama-bench -p {p} -n {n} -t {peer['threads']} -r 1` (llama.cpp from llama-cpp-python "
        f"{__import__('llama_cpp').VERSION}, native build: `{peer['binary']}`) and luminar ({peer['threads']} "
        f"OpenMP threads) on the same GGUF files, {cfg['peer_rounds']} interleaved rounds, medians. "
        f"Ratios: luminar's decode tok/s over llama.cpp's, llama.cpp's prefill time over luminar's "
        f"(above 1: luminar faster). llama-bench decodes from an empty context, luminar after a "
        f"{next(iter(peer['models'].values()))['prompt_tokens']}-token prompt. The int8 rows: "
        f"`load(activations=\"int8\")`, each linear layer's input quantized per block of 32 (llama.cpp's Q8_1) "
        f"and multiplied by integer dots; its {n} greedy tokens equal the float32 model's for the first "
        + ", ".join(f"{m['int8_tokens_agree']} ({label})" for label, m in peer["models"].items()) + "."
        + _repack_note(peer), "",
        table(["model", f"luminar decode tok/s", "llama.cpp decode tok/s", "decode ratio",
               f"luminar prefill {p} s", f"llama.cpp prefill {p} s", "prefill ratio"], rows), "",
        f"Bandwidth fraction: the weights a decode step reads (all of them) times the decode rate, over "
        f"the best read/copy bandwidth this run's probe measured ({peer['bandwidth_gbs']:.1f} GB/s). "
        f"One-thread CPU time per decode token (OMP_NUM_THREADS=1 in a child; llama-bench -t 1, the "
        f"CPU time of -n {4 + n} minus -n 4), three rounds each, medians: a ratio that other tenants "
        f"of a shared machine inflate less than wall time.", "",
        table(["model", "weights per token MB (luminar / GGUF file)", "luminar GB/s (fraction)", "llama.cpp GB/s (fraction)",
               "luminar CPU ms/token, 1 thread", "llama.cpp CPU ms/token, 1 thread", "CPU-time ratio",
               "int8 activations: CPU ms/token, ratio"],
              [_cpu_row(label, m, peer["bandwidth_gbs"]) for label, m in peer["models"].items()]), ""])


def _cpu_row(label: str, m: dict, bandwidth_gbs: float) -> list[str]:
    # luminar's stored weights (Q5_0 / Q4_K / Q6_K repacked at load: more bytes) and the GGUF's (llama.cpp's)
    cpu, mb, file_mb = m["cpu_time"], m["cpu_time"]["weight_bytes"] / 1e6, os.path.getsize(m["path"]) / 1e6
    rates = [size / 1e3 * m["median"][side]["decode_tok_s"] for size, side in ((mb, "luminar"), (file_mb, "llama.cpp"))]
    return [label, f"{mb:.0f} / {file_mb:.0f}", *(f"{r:.1f} ({r / bandwidth_gbs:.0%})" for r in rates),
            f"{cpu['luminar_cpu_s_per_token'] * 1e3:.2f}", f"{cpu['llama_cpp_cpu_s_per_token'] * 1e3:.2f}",
            f"{cpu['llama_cpp_cpu_s_per_token'] / cpu['luminar_cpu_s_per_token']:.2f}×",
            f"{cpu['luminar_int8_cpu_s_per_token'] * 1e3:.2f}, "
            f"{cpu['llama_cpp_cpu_s_per_token'] / cpu['luminar_int8_cpu_s_per_token']:.2f}×"]


# -- luminar's per-kernel profile ---------------------------------------------------------------------
PROFILE_LINE = re.compile(r"^\[luminar\]\s+([0-9.]+) ms\s+(\S+)")


def kernel_labels(program) -> dict[str, str]:
    """A readable kind per kernel name: the weight it reads (layer number dropped), else what it does."""
    from luminar.compiler.kernels import Reduce, loads, walk
    kp = program.kernels
    labels = {}
    for k in kp.kernels:
        op = re.sub(r"^k\d+_", "", k.name)
        op = re.sub(r"\d+$", "", op)  # out_k17 -> out_k
        shape = "(" + ", ".join(str(d) for d in k.shape) + ")"
        inputs = sorted({kp.buffers[ld.buffer].name for ld in loads(k.value) if kp.buffers[ld.buffer].kind == "input"})
        weights = sorted({re.sub(r"^blk_\d+_|_weight_\w+$|_weight$", "", n) for n in inputs
                          if n.startswith(("blk_", "token_embd", "output"))})
        extents = [str(e.extent) for e in walk(k.value) if isinstance(e, Reduce)]
        reduced = f" Σ{len(extents)} loops" if len(extents) > 3 else (" Σ" + "×".join(extents) if extents else "")
        if "token_embd" in weights:  # (a tied head reads the embedding's weights too: a reduction)
            label = "lm_head matmul (tied embedding)" if extents else "embedding lookup"
        elif any(w.endswith("_norm") for w in weights):
            label = "rms_norm scale (" + ", ".join(weights) + ")"
        elif weights:
            label = "matmul " + "+".join(weights) + f" {shape}"
        elif "k_cache" in inputs:
            label = "attention scores q·K (+RoPE)"
        elif "k_local" in inputs:
            label = "sliding-window attention (+RoPE)"
        elif "v_cache" in inputs:
            label = "attention probs·V"
        else:
            label = f"{op} {shape}{reduced}"
        labels[k.name] = label
    return labels


def profile(program, call, calls: int = 1) -> dict:
    """Run `call` `calls` times with the CPU program's per-kernel timer on; ms per call by kernel kind."""
    labels = kernel_labels(program)
    captured = io.StringIO()
    program.debug = 1
    try:
        with contextlib.redirect_stderr(captured):
            started = time.perf_counter()
            for _ in range(calls):
                call()
            wall = (time.perf_counter() - started) / calls
    finally:
        program.debug = 0
    kinds: dict[str, dict] = {}
    for line in captured.getvalue().splitlines():
        found = PROFILE_LINE.match(line)
        if found:
            kind = kinds.setdefault(labels.get(found.group(2), found.group(2)), {"ms": 0.0, "kernels": 0})
            kind["ms"] += float(found.group(1)) / calls
            kind["kernels"] += 1
    for kind in kinds.values():
        kind["kernels"] //= calls
    kernel_ms = sum(k["ms"] for k in kinds.values())
    ordered = dict(sorted(kinds.items(), key=lambda kv: -kv[1]["ms"]))
    return {"calls": calls, "wall_ms_per_call": wall * 1e3, "kernel_ms_per_call": kernel_ms,
            "kernels_per_call": sum(k["kernels"] for k in kinds.values()), "kinds": ordered}


def profile_luminar(lum: Luminar, chat_ids: list[int], prefill_ids: list[int], steps: int) -> dict:
    m = lum.model
    cache = m.new_cache(len(chat_ids) + 64 + steps + 1)
    token = int(m.forward(chat_ids, cache)[-1].argmax())
    for _ in range(64):  # a context in the middle of the 128-token run
        token = int(m.forward([token], cache)[-1].argmax())
    state = {"token": token}

    def step():
        state["token"] = int(m.forward([state["token"]], cache)[-1].argmax())

    decode = profile(m.program, step, steps)
    decode["context_tokens"] = cache.tokens - steps
    prefill = profile(m.prefill_program or m.program, lambda: lum.prefill(prefill_ids))  # (prompts: their own program)
    return {"decode_step": decode, f"prefill_{len(prefill_ids)}": prefill}


# -- environment --------------------------------------------------------------------------------------
def versions() -> dict:
    from importlib import metadata
    out = {"python": platform.python_version()}
    for name in ("numpy", "torch", "transformers", "accelerate", "gguf", "tokenizers"):
        try:
            out[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            out[name] = "not installed"
    import machine
    out["luminar"] = machine.git_revision()
    return out


def machine_description() -> dict:
    import machine
    mem = "unknown"
    with contextlib.suppress(OSError):
        kb = int(re.search(r"MemTotal:\s+(\d+)", open("/proc/meminfo").read()).group(1))
        mem = f"{kb / 2**20:.0f} GiB"
    return {"cpu": machine.cpu_model(), "cpus": os.cpu_count(), "memory": mem, "compiler": machine.compiler_version(),
            "kernel": platform.release(),
            "thread_env": {k: os.environ[k] for k in ("OMP_NUM_THREADS", "MKL_NUM_THREADS") if k in os.environ}}


@contextlib.contextmanager
def foreign_load(data: dict, phase: str):
    """Record how many CPUs others kept busy during the block (our subprocesses count as ours)."""
    import machine
    before, started = os.times(), time.perf_counter()
    with machine.LoadMonitor() as load:
        yield
    after, wall = os.times(), time.perf_counter() - started
    children = (after.children_user + after.children_system - before.children_user - before.children_system)
    data["foreign_cpus"][phase] = max(load.foreign_cpus - children / wall, 0.0) if wall else 0.0


def wait_idle(label: str, max_wait_s: float) -> dict:
    import machine
    state = machine.wait_for_idle(max_wait_s)
    state["before"] = label
    say(f"idle check before {label}: {'idle' if state['idle'] else 'NOT idle'} after {state['waited_s']} s "
        f"{state['idle_fractions']}")
    return state


# -- the report -----------------------------------------------------------------------------------------
def verdict(ok: bool, text: str) -> str:
    return f"{'met' if ok else 'missed'} ({text})"


def goal_rows(data: dict) -> list[list[str]]:
    decode, prefill, starts = data["decode"], data["prefill"], data.get("starts")
    n, p = data["config"]["decode_tokens"], data["config"]["prefill_tokens"]
    lum_tok = decode["luminar"]["tok_s"]["median"]
    hf_tok = decode["transformers"]["tok_s"]["median"]
    lo, hi = LLAMA_CPP["decode_tok_s"]
    measured = data.get("peer", {}).get("models", {}).get("SmolLM2-135M-Instruct Q4_1")
    if measured:  # this run's llama-bench median replaces the quoted range
        lo = hi = measured["median"]["llama.cpp"]["decode_tok_s"]
    lum_pf = prefill["luminar"]["seconds"]["median"]
    hf_pf = prefill["transformers"]["seconds"]["median"]
    rows = [
        [f"decode tok/s (batch 1, greedy, {n} new tokens; median, best)",
         f"{lum_tok:.1f} ({decode['luminar']['tok_s']['best']:.1f})",
         f"{hf_tok:.1f} ({decode['transformers']['tok_s']['best']:.1f})", (f"{hi:.1f}" if lo == hi else f"{lo:.0f}–{hi:.0f}"),
         "≥ 4× transformers", verdict(lum_tok >= 4 * hf_tok, f"{lum_tok / hf_tok:.2f}× transformers")],
        ["", "", "", "", "≥ llama.cpp",
         verdict(lum_tok >= hi, f"{lum_tok / hi:.2f}× llama.cpp" if lo == hi else
                 f"{lum_tok / hi:.2f}–{lum_tok / lo:.2f}× llama.cpp")],
        [f"prefill {p} tokens, s (median, best)",
         f"{lum_pf:.3f} ({prefill['luminar']['seconds']['best']:.3f})",
         f"{hf_pf:.3f} ({prefill['transformers']['seconds']['best']:.3f})",
         f"{measured['median']['llama.cpp']['prefill_s']:.3f}" if measured else
         (f"~{LLAMA_CPP['prefill_512_s']}" if p == 512 else "—"),
         "≤ transformers", verdict(lum_pf <= hf_pf, f"{lum_pf / hf_pf:.2f}× transformers' time")],
    ]
    if starts and starts["cold"]:
        cold = [s["ready_s"] for s in starts["cold"]]
        rows.append(["cold start: import + load + compile, empty cache, s (median, worst)",
                     f"{statistics.median(cold):.1f} ({max(cold):.1f})", "—", "—", "< 60 s",
                     verdict(max(cold) < 60, f"{max(cold) / 60:.2f}× the limit")])
    if starts and starts["warm"]:
        warm = [s["ready_s"] for s in starts["warm"]]
        rows.append(["warm start: import + load, cache filled, s (median, worst)",
                     f"{statistics.median(warm):.2f} ({max(warm):.2f})", "—", "—", "< 5 s",
                     verdict(statistics.median(warm) < 5, f"{statistics.median(warm) / 5:.2f}× the limit")])
    return rows


def table(header: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    lines += ["| " + " | ".join(r) + " |" for r in rows]
    return "\n".join(lines)


def kernel_table(prof: dict, top: int = 8) -> str:
    rows = []
    for label, k in list(prof["kinds"].items())[:top]:
        rows.append([label, str(k["kernels"]), f"{k['ms']:.3f}", f"{100 * k['ms'] / prof['kernel_ms_per_call']:.1f}%"])
    rest = list(prof["kinds"].values())[top:]
    if rest:
        ms = sum(k["ms"] for k in rest)
        rows.append([f"everything else ({len(rest)} kinds)", str(sum(k["kernels"] for k in rest)), f"{ms:.3f}",
                     f"{100 * ms / prof['kernel_ms_per_call']:.1f}%"])
    return table(["kernel kind", "kernels", "ms per call", "share"], rows)


def _without_top(prof: dict) -> str:
    """What a decode step would cost if its most expensive kernel kind cost nothing."""
    top, k = next(iter(prof["kinds"].items()))
    rest = prof["wall_ms_per_call"] - k["ms"]
    return (f"Without the top kind ({top}, {k['ms']:.1f} ms) a step would take ~{rest:.1f} ms wall, "
            f"~{1e3 / rest:.0f} tok/s.")


def render(data: dict) -> str:
    c, mach, v = data["config"], data["machine"], data["versions"]
    decode, prefill = data["decode"], data["prefill"]
    out = [f"# LLM benchmark: SmolLM2-135M-Instruct (GGUF Q4_1){' — QUICK smoke run' if c['quick'] else ''}",
           "",
           f"Run {data['date']} on {mach['cpu']}, {mach['cpus']} CPUs, {mach['memory']} "
           f"({mach['compiler']}; Linux {mach['kernel']}).",
           "Versions: " + ", ".join(f"{k} {val}" for k, val in v.items()) + ".",
           f"Model file: `{c['model_path']}`.",
           "",
           "Machine state: " + "; ".join(
               f"before {s['before']}: {'idle' if s['idle'] else 'NOT idle'} after {s['waited_s']} s "
               f"(idle fractions {s['idle_fractions']})" for s in data["idle"]) + ".",
           f"Other tenants' CPU use while timing (CPUs busy outside this process, average): "
           + ", ".join(f"{k} {val:.2f}" for k, val in data["foreign_cpus"].items()) + ".",
           "",
           "## Goals (issue 5)",
           "",
           table(["metric", "luminar", "transformers eager fp32",
                  "llama.cpp (this run)" if data.get("peer", {}).get("models") else "llama.cpp (FACTS.md, not run)",
                  "goal", "result"], goal_rows(data)),
           "",
           f"- Decode: prompt = SmolLM2's chat template around \"{CHAT_MESSAGE}\" ({c['chat_prompt_tokens']} tokens); "
           f"greedy, {c['decode_tokens']} new tokens, no stop token. Tokens/s = {c['decode_tokens'] - 1} / (time of the "
           f"{c['decode_tokens'] - 1} one-token forward passes after the first token); prefill excluded. Same loop for both "
           f"(forward with KV cache, argmax). {c['decode_rounds']} interleaved rounds. Median step: luminar "
           f"{decode['luminar']['step_ms']['median']:.2f} ms, transformers {decode['transformers']['step_ms']['median']:.2f} ms.",
           f"- Greedy tokens identical for the first {data['checks']['decode_tokens_agree']} of {c['decode_tokens']} "
           f"new tokens (luminar: the Q4_1 weights as stored, multiplied in float32 by block dots in decode steps, "
           f"dequantized in the tiled matmuls of the prompt; transformers: the same weights dequantized to float32).",
           f"- With int8 activations (`load(activations=\"int8\")`, not the default): "
           f"{decode['luminar int8']['tok_s']['median']:.1f} tok/s decode in the same rounds (median step "
           f"{decode['luminar int8']['step_ms']['median']:.2f} ms); its greedy tokens equal transformers' for the first "
           f"{data['checks']['int8_decode_tokens_agree']} of {c['decode_tokens']}.",
           f"- Prefill: {c['prefill_tokens']} tokens of repeated prose from an empty cache, one forward pass, logits for "
           f"the last position (transformers: `logits_to_keep=1`, `use_cache=True`). Interleaved rounds: luminar "
           f"{prefill['luminar']['seconds']['n']}, transformers {prefill['transformers']['seconds']['n']} (a contender "
           f"stops after 2 once it has spent 60 s). Last-position logits differ by at most {data['checks']['prefill_max_abs_logit_diff']:.2e}; "
           f"argmax {'agrees' if data['checks']['prefill_argmax_agrees'] else 'DIFFERS'}.",
           f"- transformers' own `generate()` (greedy, `min_new_tokens` so it never stops early): "
           f"{data['transformers_generate']['tok_s']['median']:.1f} tok/s decode, from (t({c['decode_tokens']}) − t(1)). "
           f"transformers {v.get('transformers')}, attention `{data['transformers_attn']}`, torch "
           f"{data['torch_threads']} threads, `torch.no_grad()`.",
           ("- llama.cpp column: this run's llama-bench median on the same file (next section)."
            if data.get("peer", {}).get("models") else
            "- llama.cpp could not be run; its column quotes /work/shared/FACTS.md (llama.cpp on the same "
            "Q4_1 file, two threads, measured earlier on the project's machine class). The decode goal is "
            "judged against the top of its range."),
           f"- FACTS.md's figures (transformers ~{FACTS_TRANSFORMERS['decode_tok_s']} tok/s decode, "
           f"~{FACTS_TRANSFORMERS['prefill_512_s']} s prefill 512"
           f"{'' if data.get('peer', {}).get('models') else '; llama.cpp above'}) come from a {FACTS_CPU}; "
           f"this run's CPU is {mach['cpu']}"
           + (": the same class." if "Xeon" in mach["cpu"] else ", a different one, so only ratios within this "
              "run are like for like" + ("." if data.get("peer", {}).get("models") else
                                         "; the llama.cpp column is indicative.")),
           ]
    if "peer" in data:
        out.append(render_peer(data["peer"], c))
    if data.get("starts"):
        s = data["starts"]
        out += ["", "## Start-up", "",
                "Each start is a fresh `python bench/llm.py --child-start`: `import luminar`, `luminar.models.load()` "
                "(read the GGUF, build the graph, lower, compile the C or load it from LUMINAR_CACHE), then one "
                "prefill of a chat prompt (reported separately). Cold = a new empty LUMINAR_CACHE; warm = the cache "
                "the cold run filled" + (" (this run: the user's default cache, no cold start)" if s.get("cache") == "default"
                                        else "") + ". The GGUF file itself stays in the OS page cache in both cases.", ""]
        rows = []
        for kind in ("cold", "warm"):
            for i, r in enumerate(s[kind]):
                stages = "; ".join(f"{t:.1f} s {msg}" for t, msg in r["stages"])
                rows.append([f"{kind} {i + 1}", f"{r['import_s']:.2f}", f"{r['load_s']:.2f}", f"{r['ready_s']:.2f}",
                             f"{r['first_token_s']:.2f}", f"{r['process_wall_s']:.2f}", stages])
        out.append(table(["run", "import s", "load s", "ready s", "first prefill s", "process wall s",
                          "stages (time since import: message)"], rows))
    prof = data["profile"]
    d = prof["decode_step"]
    pf_key = next(k for k in prof if k.startswith("prefill"))
    pf = prof[pf_key]
    out += ["", "## Where luminar's time goes", "",
            f"Per-kernel timer (`program.debug = 1`, the runtime's `lm_run_profiled`), top 8 kinds. Kernels are grouped "
            f"by the weight they read (layer number dropped) or by what they compute.",
            "",
            f"### One decode step (context {d['context_tokens']} tokens; mean of {d['calls']} steps)",
            "",
            f"{d['kernels_per_call']} kernels, {d['kernel_ms_per_call']:.2f} ms in kernels, "
            f"{d['wall_ms_per_call']:.2f} ms wall per step with the profiler on "
            f"(the rest is Python: inputs, KV-cache append, argmax, profiling).",
            "",
            kernel_table(d),
            "",
            _without_top(d),
            "",
            f"### {pf_key.replace('_', ' ')} tokens",
            "",
            f"{pf['kernels_per_call']} kernels, {pf['kernel_ms_per_call']:.1f} ms in kernels, "
            f"{pf['wall_ms_per_call']:.1f} ms wall.",
            "",
            kernel_table(pf),
            "",
            "## Reproduce",
            "",
            "```",
            "make bench-llm            # = .venv/bin/python bench/llm.py   (writes bench/LLM.md, bench/llm.json)",
            ".venv/bin/python bench/llm.py --quick   # smoke run, prints this report, writes nothing",
            "```",
            "",
            f"Command of this run: `{data['command']}`; took {data['total_s']:.0f} s. Raw numbers: "
            f"{data.get('raw', 'bench/llm.json')}.",
            ""]
    return "\n".join(out)


# -- main -------------------------------------------------------------------------------------------------
def prefill_ids(tokenizer, n: int) -> list[int]:
    text, ids = PROSE, tokenizer.encode(PROSE)
    while len(ids) < n:
        text += PROSE
        ids = tokenizer.encode(text)
    return [int(i) for i in ids[:n]]


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="smoke run: 16 decode tokens, 64-token prefill, "
                                                             "one warm start, no cold start; writes nothing")
    parser.add_argument("--out-dir", help="where to write LLM.md and llm.json (default: bench/, or nothing with --quick)")
    parser.add_argument("--idle-wait", type=float, default=20.0, help="seconds to wait for an idle machine per phase")
    parser.add_argument("--peer-only", action="store_true", help="only the llama.cpp comparison (prints it, "
                                                                 "writes nothing)")
    parser.add_argument("--no-build", action="store_true", help="skip llama.cpp unless it is already built")
    parser.add_argument("--child-start", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--child-cpu", nargs=3, metavar=("MODEL", "TOKENS", "ACTIVATIONS"), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child_start:
        child_start()
        return 0
    if args.child_cpu:
        child_cpu(args.child_cpu[0], int(args.child_cpu[1]), args.child_cpu[2])
        return 0
    sys.path.insert(0, str(HERE))  # machine.py, timing.py and llama_cpp.py
    import numpy as np

    quick = args.quick
    cfg = {"quick": quick, "decode_tokens": 16 if quick else 128, "prefill_tokens": 64 if quick else 512,
           "decode_rounds": 2 if quick else 3, "prefill_rounds": 2 if quick else 5,
           "generate_rounds": 1 if quick else 2, "cold_starts": 0 if quick else 2,
           "warm_starts": 1 if quick else 3, "profile_steps": 4 if quick else 16, "peer_rounds": 1 if quick else 3}
    out_dir = Path(args.out_dir) if args.out_dir else (None if quick else HERE)
    started = time.perf_counter()
    data = {"date": datetime.datetime.now().astimezone().strftime("%Y-%m-%d %H:%M %Z"),
            "command": " ".join([Path(sys.executable).name, "bench/llm.py", *(argv if argv is not None else sys.argv[1:])]),
            "machine": machine_description(), "versions": versions(), "config": cfg, "idle": [],
            "foreign_cpus": {}}
    from luminar.io.gguf import default_model_path
    cfg["model_path"] = str(default_model_path())
    if args.peer_only:
        data["idle"].append(wait_idle("llama.cpp comparison", args.idle_wait))
        with foreign_load(data, "llama.cpp comparison"):
            peer = measure_peer(cfg, {}, build=not args.no_build)
        print(f"{data['date']}, {data['machine']['cpu']}; other tenants kept "
              f"{data['foreign_cpus']['llama.cpp comparison']:.2f} CPUs busy" + render_peer(peer, cfg))
        return 0

    say("start-up times (subprocesses)...")
    data["idle"].append(wait_idle("start-up", args.idle_wait))
    with foreign_load(data, "start-up"):
        data["starts"] = measure_starts(cfg["cold_starts"], cfg["warm_starts"])

    say("loading both models in this process...")
    lum, lum8 = Luminar(), Luminar(activations="int8")
    hf = Transformers(cfg["model_path"])
    data["load_in_process_s"] = {"luminar": lum.load_s, "transformers": hf.load_s}
    data["transformers_attn"] = hf.attn_implementation
    data["torch_threads"] = hf.torch.get_num_threads()
    tok = lum.tokenizer
    chat_ids = [int(i) for i in tok.encode(tok.apply_chat_template([{"role": "user", "content": CHAT_MESSAGE}],
                                                                     add_generation_prompt=True))]
    long_ids = prefill_ids(tok, cfg["prefill_tokens"])
    cfg["chat_prompt_tokens"] = len(chat_ids)

    data["idle"].append(wait_idle("decode and prefill", args.idle_wait))
    with foreign_load(data, "decode and prefill"):
        say("decode...")
        data["decode"] = measure_decode([lum, hf, lum8], chat_ids, cfg["decode_tokens"], cfg["decode_rounds"])
        say("prefill...")
        data["prefill"], last = measure_prefill([lum, hf], long_ids, cfg["prefill_rounds"])

    data["idle"].append(wait_idle("the llama.cpp comparison", args.idle_wait))
    with foreign_load(data, "llama.cpp comparison"):
        say("llama.cpp in the same run...")
        data["peer"] = measure_peer(cfg, {None: lum, (None, "int8"): lum8}, build=not args.no_build)

    with foreign_load(data, "generate() and profile"):
        say("transformers generate()...")
        data["transformers_generate"] = measure_generate(hf, chat_ids, cfg["decode_tokens"], cfg["generate_rounds"])
        say("luminar per-kernel profile...")
        data["profile"] = profile_luminar(lum, chat_ids, long_ids, cfg["profile_steps"])

    a, b = data["decode"]["luminar"].pop("tokens"), data["decode"]["transformers"].pop("tokens")
    int8_tokens = data["decode"]["luminar int8"].pop("tokens")
    data["checks"] = {"decode_tokens_agree": _agreeing(a, b), "int8_decode_tokens_agree": _agreeing(int8_tokens, b), "luminar_text": tok.decode(a), "transformers_text": tok.decode(b),
                      "prefill_max_abs_logit_diff": float(np.abs(last["luminar"] - last["transformers"]).max()),
                      "prefill_argmax_agrees": bool(last["luminar"].argmax() == last["transformers"].argmax())}
    data["total_s"] = time.perf_counter() - started
    data["raw"] = str(out_dir / "llm.json") if out_dir is not None else "not written (--quick)"
    report = render(data)
    if out_dir is not None:
        out_dir.mkdir(parents=True, exist_ok=True)
        (out_dir / "LLM.md").write_text(report)
        (out_dir / "llm.json").write_text(json.dumps(data, indent=1, ensure_ascii=False) + "\n")
        say(f"wrote {out_dir / 'LLM.md'} and {out_dir / 'llm.json'}")
    print(report)
    return 0


if __name__ == "__main__":
    sys.exit(main())
