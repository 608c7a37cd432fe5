"""The recurrent rows of the model-zoo benchmark: an LSTM of 2 layers x 256 hidden over 128 steps,
batch 16 (input size 256), forward and forward + backward.

    python bench/zoo_rnn.py            # prints the rows (and the compile times) as JSON lines
    from zoo_rnn import run_rnn_rows   # bench/zoo.py: [{"case", "luminar_ms", "torch_ms", "onnxruntime_ms", "note"}]

luminar runs the LSTM with `nn.SequenceRunner` (the design for run-time lengths, see
luminar/nn/rnn.py): one input-projection matmul per layer over all steps and a compiled program of
8 unrolled steps called per 8 steps from Python (chunk=8); forward + backward adds the step's
backward per step and the weight gradients as two matmuls over the sequence. The step programs are compiled with the search
(`search_dims` at this batch and length), since the default schedule of a 16-row matmul is slow on
a CPU without AVX-512. Peers in the same run: torch eager (`torch.nn.LSTM`, its default threads)
and, for the forward pass, onnxruntime on the torch.onnx export of the same module. Outputs and
gradients are checked against torch before anything is timed; the timing is bench/timing.py's
interleaved medians after waiting (bounded) for an idle machine.
"""
from __future__ import annotations

import json
import os
import sys
import tempfile
import time
import warnings
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent / "src"))

LAYERS, HIDDEN, STEPS, BATCH, FEATURES = 2, 256, 128, 16, 256
SEARCH_S = 20  # the search budget for each step program (cached on disk afterwards)
CHUNK = 8  # forward steps per program call (SequenceRunner's chunk)
CASE = f"LSTM {LAYERS} layers x {HIDDEN} hidden x {STEPS} steps, batch {BATCH}"


def _models(seed: int = 0):
    import torch
    import luminar.nn as nn
    torch.manual_seed(seed)
    theirs = torch.nn.LSTM(FEATURES, HIDDEN, num_layers=LAYERS)
    ours = nn.LSTM(FEATURES, HIDDEN, num_layers=LAYERS)
    ours.load_state_dict(theirs.state_dict())
    return ours.eval(), theirs


def _import_onnx_package():
    """Import the onnx package itself: bench/onnx.py (the ONNX importer's bench) shadows it whenever
    bench/ is on sys.path, as it is for every script in this folder. Once imported, torch.onnx finds
    the package in sys.modules."""
    shadow = sys.modules.get("onnx")
    if shadow is not None and Path(getattr(shadow, "__file__", "") or "").resolve().parent == HERE:
        del sys.modules["onnx"]
    saved = sys.path[:]
    sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != HERE]
    try:
        import onnx  # noqa: F401
    finally:
        sys.path[:] = saved


def _onnxruntime_session(theirs, x):
    """onnxruntime on torch.onnx's (TorchScript-based) export of the same module, or None if unavailable."""
    try:
        _import_onnx_package()
        import onnxruntime
        import torch
    except ImportError:
        return None
    path = os.path.join(tempfile.mkdtemp(prefix="zoo_rnn_"), "lstm.onnx")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(theirs, (torch.from_numpy(x),), path, input_names=["x"],
                          output_names=["output", "h_n", "c_n"], dynamo=False)
    return onnxruntime.InferenceSession(path, providers=["CPUExecutionProvider"])


def _compile_seconds(ours) -> dict:
    """Build + compile: the runner (any length) and the unrolled graph at a few lengths (one layer, small)."""
    import luminar as lm
    import luminar.nn as nn
    seconds = {}
    start = time.perf_counter()
    nn.SequenceRunner(nn.LSTM(FEATURES, HIDDEN, num_layers=LAYERS).eval(), "cpu")
    seconds["runner, default schedules (any length)"] = time.perf_counter() - start
    for steps in (8, 32):
        model = nn.LSTM(16, 32)
        start = time.perf_counter()
        g = lm.Graph()
        out, _ = model(g.tensor("x", (steps, 4, 16)))
        out.output("out")
        g.compile("cpu")
        seconds[f"unrolled LSTM(16, 32), {steps} steps"] = time.perf_counter() - start
    return {k: round(v, 2) for k, v in seconds.items()}


def run_rnn_rows(idle_wait_s: float = 30.0, budget_s: float = 4.0) -> list[dict]:
    """The two LSTM rows: forward (luminar, torch eager, onnxruntime) and forward + backward (luminar, torch)."""
    import torch
    import luminar.nn as nn
    import machine
    from timing import interleaved

    ours, theirs = _models()
    rng = np.random.default_rng(0)
    x = rng.standard_normal((STEPS, BATCH, FEATURES)).astype(np.float32)
    d_out = rng.standard_normal((STEPS, BATCH, HIDDEN)).astype(np.float32)
    start = time.perf_counter()
    runner = nn.SequenceRunner(ours, "cpu", chunk=CHUNK, search=SEARCH_S, search_dims={"b": BATCH, "s": STEPS})
    runner_compile_s = time.perf_counter() - start
    session = _onnxruntime_session(theirs, x)
    x_torch, d_torch = torch.from_numpy(x), torch.from_numpy(d_out)

    def torch_forward():
        with torch.no_grad():
            return theirs(x_torch)[0]

    def torch_training():
        theirs.zero_grad()
        inputs = x_torch.clone().requires_grad_()
        (theirs(inputs)[0] * d_torch).sum().backward()
        return inputs.grad

    def luminar_training():
        runner(x)
        return runner.backward(d_out)

    # correctness first: the timed calls compute what torch computes
    expected = torch_forward().numpy()
    forward_error = float(np.abs(runner(x)[0] - expected).max())
    gradients = luminar_training()
    expected_dx = torch_training().numpy()
    gradient_error = max(float(np.abs(gradients["input"] - expected_dx).max()),
                         *(float(np.abs(gradients[n] - p.grad.numpy()).max() / (np.abs(p.grad.numpy()).max() + 1e-12))
                           for n, p in theirs.named_parameters()))
    ort_error = None
    if session is not None:
        ort_error = float(np.abs(session.run(None, {"x": x})[0] - expected).max())

    idle = machine.wait_for_idle(idle_wait_s)
    forward = {"luminar": lambda: runner(x), "torch": torch_forward}
    if session is not None:
        forward["onnxruntime"] = lambda: session.run(None, {"x": x})
    timed = interleaved(forward, max_rounds=15, min_rounds=3, budget_s=budget_s)
    training = interleaved({"luminar": luminar_training, "torch": torch_training}, max_rounds=15, min_rounds=3,
                           budget_s=budget_s)
    load = "idle machine" if idle["idle"] else f"machine busy (idle fractions {idle['idle_fractions']})"
    common = (f"{load}; luminar: SequenceRunner chunk={CHUNK}, programs searched "
              f"({runner_compile_s:.1f} s compile)")
    rows = [
        {"case": f"{CASE}, forward", "luminar_ms": timed["luminar"]["median_ms"],
         "torch_ms": timed["torch"]["median_ms"],
         "onnxruntime_ms": timed["onnxruntime"]["median_ms"] if session is not None else None,
         "note": f"{common}; max |error| vs torch: luminar {forward_error:.1e}"
                 + (f", onnxruntime {ort_error:.1e}" if ort_error is not None else "")},
        {"case": f"{CASE}, forward + backward", "luminar_ms": training["luminar"]["median_ms"],
         "torch_ms": training["torch"]["median_ms"], "onnxruntime_ms": None,
         "note": f"{common}; gradients vs torch: max relative error {gradient_error:.1e}"},
    ]
    return rows


def main() -> int:
    rows = run_rnn_rows()
    for row in rows:
        print(json.dumps(row))
        ratios = [f"{row['torch_ms'] / row['luminar_ms']:.2f}x torch eager"]
        if row["onnxruntime_ms"] is not None:
            ratios.append(f"{row['onnxruntime_ms'] / row['luminar_ms']:.2f}x onnxruntime")
        print(f"  speed of luminar: {', '.join(ratios)} (> 1: luminar faster)")
    ours, _ = _models()
    print(json.dumps({"compile_s": _compile_seconds(ours)}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
