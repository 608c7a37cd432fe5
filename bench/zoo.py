"""The model-zoo benchmark: luminar against torch eager and onnxruntime, in the same run, on the models
luminar loads from real weights; writes bench/ZOO.md and bench/zoo.json.

    .venv/bin/python bench/zoo.py              # every row (a few minutes; the first run also compiles)
    .venv/bin/python bench/zoo.py --search     # also luminar with compile(search=...) (slower the first time)
    .venv/bin/python bench/zoo.py --quick      # fewer samples; prints the table, writes nothing

Rows (inference):
- MiniLM (all-MiniLM-L6-v2), batch 8 x 128 tokens: the sentence embeddings (encoder + mean pooling
  + L2 norm). torch eager is transformers' BertModel + the same pooling; onnxruntime runs the
  torch.onnx export of that module.
- MobileNetV2, batch 1 and batch 32 (224 x 224): the logits. torch eager is torchvision's layout
  (tests/reference_mobilenet.py) on the checkpoint as it is, and again with the batch norms folded
  and subnormal weights flushed exactly as luminar does (the checkpoint's subnormal batch-norm
  statistics slow torch down; the second row shows torch on the same arithmetic). onnxruntime
  runs the export of the folded module.

Every contender's output is checked against torch before anything is timed. Timing is
bench/timing.py's interleaved medians (all contenders of a row take turns), after waiting
(bounded) for an idle machine; the note says how busy it was.

Contract with bench/zoo_rnn.py (the recurrent rows, written separately): when that file exists,
this bench imports it and calls ``run_rnn_rows(idle_wait_s=..., budget_s=...)``, which returns a
list of dict rows ``{"case": str, "luminar_ms": float, "torch_ms": float, "onnxruntime_ms":
float | None, "note": str (optional)}``; they are appended to the table as they are.
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import sys
import tempfile
import time
import warnings
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
# bench/ goes last on sys.path (a script's own folder comes first): bench/onnx.py, the ONNX importer's
# bench, would otherwise shadow the onnx package that torch.onnx imports.
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != HERE] + [str(HERE)]
sys.path.insert(0, str(ROOT / "src"))
sys.path.insert(0, str(ROOT / "tests"))  # reference_mobilenet.py: the torch reference module

import machine  # noqa: E402
from timing import interleaved  # noqa: E402

BERT_BATCH, BERT_TOKENS = 8, 128


# -- sentence embeddings ----------------------------------------------------------------------------------
def minilm_contenders(search) -> tuple[str, dict, dict, str]:
    import torch
    import transformers
    from luminar.models.bert import default_model_directory, load_embedder

    rng = np.random.default_rng(0)
    ids = rng.integers(1000, 29000, (BERT_BATCH, BERT_TOKENS)).astype(np.int32)
    ids[:, 0], ids[:, -1] = 101, 102  # [CLS] ... [SEP]
    mask = np.ones((BERT_BATCH, BERT_TOKENS), np.float32)

    class Pooled(torch.nn.Module):
        """BertModel + sentence-transformers' mean pooling and normalization."""

        def __init__(self):
            super().__init__()
            self.bert = transformers.BertModel.from_pretrained(default_model_directory()).eval()

        def forward(self, input_ids, attention_mask):
            tokens = self.bert(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state
            weights = attention_mask.unsqueeze(-1)
            mean = (tokens * weights).sum(1) / weights.sum(1).clamp(min=1e-9)
            return torch.nn.functional.normalize(mean, dim=-1)

    reference = Pooled().eval()
    ids_t, mask_t = torch.from_numpy(ids).long(), torch.from_numpy(mask)

    def torch_eager():
        with torch.no_grad():
            return reference(ids_t, mask_t).numpy()

    contenders = {"torch eager": torch_eager}
    compile_s = {}
    for name, options in [("luminar", {})] + ([("luminar search", {"search": search,
                                                "search_dims": {"b": BERT_BATCH, "s": BERT_TOKENS}})]
                                              if search else []):
        started = time.perf_counter()
        embedder = load_embedder(**options)
        compile_s[name] = time.perf_counter() - started
        contenders[name] = (lambda program: lambda: program(input_ids=ids, attention_mask=mask)["embeddings"])(
            embedder.program)
    session, note = _onnx_session(reference, (ids_t, mask_t), ["input_ids", "attention_mask"])
    if session is not None:
        feeds = {"input_ids": ids.astype(np.int64), "attention_mask": mask}
        contenders["onnxruntime"] = lambda: session.run(None, feeds)[0]
    return f"MiniLM-L6 embeddings, batch {BERT_BATCH} x {BERT_TOKENS} tokens", contenders, compile_s, note


# -- image classification ----------------------------------------------------------------------------------
def torch_folded_copy(module):
    """A copy of the torch reference with each Conv2d + BatchNorm2d folded as luminar folds them."""
    import copy

    import torch
    from luminar.models.mobilenet import flush_subnormals
    folded = copy.deepcopy(module)
    for sequential in [m for m in folded.modules() if isinstance(m, torch.nn.Sequential)]:
        names = list(sequential._modules)
        for conv_name, norm_name in zip(names, names[1:]):
            conv, norm = sequential._modules[conv_name], sequential._modules[norm_name]
            if not (isinstance(conv, torch.nn.Conv2d) and isinstance(norm, torch.nn.BatchNorm2d)):
                continue
            scale = norm.weight.double() / torch.sqrt(norm.running_var.double() + norm.eps)
            bias = norm.bias.double() - norm.running_mean.double() * scale
            weight = conv.weight.double() * scale.reshape(-1, 1, 1, 1)
            conv.weight = torch.nn.Parameter(torch.from_numpy(flush_subnormals(weight.detach().numpy())))
            conv.bias = torch.nn.Parameter(torch.from_numpy(flush_subnormals(bias.detach().numpy())))
            sequential._modules[norm_name] = torch.nn.Identity()
    return folded.eval()


def mobilenet_contenders(batch: int, search, shared: dict) -> tuple[str, dict, dict, str]:
    import torch
    from luminar.models.mobilenet import default_weights_path, load_classifier
    from reference_mobilenet import load_torch_mobilenet_v2

    if "reference" not in shared:
        shared["reference"] = load_torch_mobilenet_v2(default_weights_path())
        shared["folded"] = torch_folded_copy(shared["reference"])
    reference, folded = shared["reference"], shared["folded"]
    x = np.random.default_rng(batch).standard_normal((batch, 3, 224, 224)).astype(np.float32)
    x_t = torch.from_numpy(x)

    def eager(module):
        def run():
            with torch.no_grad():
                return module(x_t).numpy()
        return run

    contenders = {"torch eager": eager(reference), "torch eager (folded)": eager(folded)}
    compile_s = {}
    for name, options in [("luminar", {})] + ([("luminar search", {"search": search,
                                                "search_dims": {"batch": batch}})] if search else []):
        key = (name, batch if search else None) if name != "luminar" else name
        if key not in shared:  # the default program serves every batch size (batch is symbolic)
            started = time.perf_counter()
            shared[key] = load_classifier(**options)
            compile_s[name] = time.perf_counter() - started
        contenders[name] = (lambda classifier: lambda: classifier.logits(x))(shared[key])
    session, note = _onnx_session(folded, (x_t,), ["images"])
    if session is not None:
        contenders["onnxruntime"] = lambda: session.run(None, {"images": x})[0]
    return f"MobileNetV2 logits, batch {batch}", contenders, compile_s, note


def _onnx_session(module, example_inputs, names):
    """onnxruntime on torch.onnx's (TorchScript-based) export of `module`, or (None, why not)."""
    try:
        import onnxruntime
        import torch
    except ImportError as e:
        return None, f"onnxruntime unavailable ({e})"
    path = os.path.join(tempfile.mkdtemp(prefix="zoo_"), "model.onnx")
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            torch.onnx.export(module, example_inputs, path, input_names=names, output_names=["out"],
                              dynamo=False, dynamic_axes={n: {0: "batch"} for n in names})
        return onnxruntime.InferenceSession(path, providers=["CPUExecutionProvider"]), ""
    except Exception as e:  # an exporter failure is a missing peer, not a failed bench
        return None, f"onnx export failed: {type(e).__name__}: {str(e)[:120]}"


# -- running ---------------------------------------------------------------------------------------------------
def check(contenders: dict) -> tuple[dict, dict]:
    """Run each contender once; the max |difference| of each from torch eager, and the seconds of that call."""
    results, seconds = {}, {}
    for name, fn in contenders.items():
        started = time.perf_counter()
        results[name] = np.asarray(fn())
        seconds[name] = time.perf_counter() - started
    expected = results["torch eager"]
    return {name: float(np.abs(out - expected).max()) for name, out in results.items()}, seconds


def run_row(case, contenders, compile_s, note, args) -> dict:
    errors, first_call = check(contenders)
    bad = {name: e for name, e in errors.items() if e > args.tolerance and name != "torch eager"}
    idle = machine.wait_for_idle(args.idle_wait)
    with machine.LoadMonitor() as load:
        timed = interleaved(contenders, max_rounds=args.rounds, min_rounds=3, budget_s=args.budget,
                            warm_calls=first_call)
    row = {"case": case, "ms": {name: t["median_ms"] for name, t in timed.items()},
           "samples": {name: t["samples"] for name, t in timed.items()},
           "max_abs_error_vs_torch": errors, "compile_s": compile_s, "idle": idle,
           "foreign_cpus": round(load.foreign_cpus, 2), "note": note, "wrong": bad}
    row["luminar_ms"] = min(row["ms"][n] for n in row["ms"] if n.startswith("luminar"))
    row["torch_ms"] = min(row["ms"][n] for n in row["ms"] if n.startswith("torch"))
    row["onnxruntime_ms"] = row["ms"].get("onnxruntime")
    print(f"{case}: " + ", ".join(f"{n} {ms:.2f} ms" for n, ms in row["ms"].items()), flush=True)
    return row


def rnn_rows(args) -> list[dict]:
    if not (HERE / "zoo_rnn.py").exists():
        return []
    try:  # the recurrent rows are another module's: a failure there must not lose the rows measured here
        import zoo_rnn
        rows = zoo_rnn.run_rnn_rows(idle_wait_s=args.idle_wait, budget_s=args.budget)
    except Exception as e:
        print(f"bench/zoo_rnn.py failed: {type(e).__name__}: {e}", file=sys.stderr)
        return [{"case": "LSTM rows (bench/zoo_rnn.py)", "note": f"not measured: {type(e).__name__}: {str(e)[:200]}"}]
    for row in rows:
        print(f"{row['case']}: luminar {row['luminar_ms']:.2f} ms, torch {row['torch_ms']:.2f} ms", flush=True)
    return rows


def ratio(peer_ms, luminar_ms) -> str:
    if peer_ms is None:
        return "-"
    value = peer_ms / luminar_ms
    return f"**{value:.2f}x**" if value >= 1 else f"{value:.2f}x (miss)"


def markdown(rows: list[dict], info: dict) -> str:
    lines = ["# Model zoo: luminar vs torch eager and onnxruntime", "",
             f"Written by `make bench-zoo` (bench/zoo.py) on {info['date']}, {info['git']}; "
             f"{info['cpu']}, {info['threads']} threads available. Medians of interleaved rounds "
             "(bench/timing.py). A ratio is the peer's time / luminar's time: above 1, luminar is faster "
             "(bold); below 1 it is a miss. Where luminar ran with and without the search, its best is used "
             "for the ratio (the per-contender times are in the second table).", "",
             "| case | luminar ms | torch eager ms | onnxruntime ms | vs torch eager | vs onnxruntime |",
             "|---|---:|---:|---:|---:|---:|"]
    for row in rows:
        if "luminar_ms" not in row:
            continue
        ort = row.get("onnxruntime_ms")
        lines.append(f"| {row['case']} | {row['luminar_ms']:.2f} | {row['torch_ms']:.2f} | "
                     f"{'-' if ort is None else f'{ort:.2f}'} | {ratio(row['torch_ms'], row['luminar_ms'])} | "
                     f"{ratio(ort, row['luminar_ms'])} |")
    lines += ["", "Every contender (ms; max |difference| from torch eager's output):", ""]
    for row in rows:
        if "ms" not in row:  # a row of bench/zoo_rnn.py (its own note), or one that failed
            lines.append(f"- {row['case']}: {row.get('note', '')}")
            continue
        parts = [f"{n} {ms:.2f} ({row['max_abs_error_vs_torch'][n]:.1e})" for n, ms in row["ms"].items()]
        load = "idle" if row["idle"]["idle"] else f"busy: others used {row['foreign_cpus']} CPUs while timing"
        compiled = ", ".join(f"{n} compiled in {s:.1f} s" for n, s in row["compile_s"].items())
        extra = "; ".join(p for p in (load, compiled, row["note"],
                                      f"WRONG OUTPUT: {row['wrong']}" if row["wrong"] else "") if p)
        lines.append(f"- {row['case']}: {', '.join(parts)}. {extra}")
    lines += ["", "torch eager runs the checkpoint as it is; \"torch eager (folded)\" runs it with the batch "
              "norms folded into the convolutions and subnormal weights flushed, as luminar prepares them. The "
              "slower of the two is not used for the ratio (the faster torch time is).", ""]
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--search", nargs="?", const=60.0, type=float, default=None, metavar="SECONDS",
                        help="also time luminar compiled with search (budget per program, default 60 s)")
    parser.add_argument("--quick", action="store_true", help="fewer samples, print only")
    parser.add_argument("--no-rnn", action="store_true", help="skip bench/zoo_rnn.py's rows")
    args = parser.parse_args()
    args.budget, args.rounds, args.idle_wait = (1.0, 3, 5.0) if args.quick else (4.0, 15, 30.0)
    args.tolerance = 1e-3
    rows, shared = [], {}
    rows.append(run_row(*minilm_contenders(args.search), args))
    for batch in (1, 32):
        rows.append(run_row(*mobilenet_contenders(batch, args.search, shared), args))
    if not args.no_rnn:
        rows += rnn_rows(args)
    info = {"date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
            "git": machine.git_revision(), "cpu": machine.cpu_model(), "threads": os.cpu_count()}
    text = markdown(rows, info)
    print(text)
    if not args.quick:
        for name, content in (("ZOO.md", text), ("zoo.json", json.dumps({"info": info, "rows": rows}, indent=1))):
            temporary = HERE / f".{name}.tmp"
            temporary.write_text(content)
            os.replace(temporary, HERE / name)
    return 1 if any(row.get("wrong") for row in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
