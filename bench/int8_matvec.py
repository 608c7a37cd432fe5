"""One matvec three ways: the CPU kernel times (LUMINAR_DEBUG's per-kernel profile, summed over the
program's kernels: the activation quantization or x's block sums included) of the float fused
dequantize-matmul (`x @ w.dequantized().T`, what prompts run), of `quant.block_linear` (float
block dots, what a decode step runs for Q4 weights) and of `quant.int8_linear` (int8 activations)
on the same synthetic Q4_1 / Q8_0 weights, five interleaved rounds of 50 calls, medians; and the
largest relative difference of the block and int8 outputs from the dequantizing one (float
rounding, and the int8 rounding of x).

    OMP_NUM_THREADS=1 PYTHONPATH=src python bench/int8_matvec.py

Prints; writes nothing. The shapes are SmolLM2's (576x1536, 1536x576, the 49152x576 output head)
and a repacked Q6_K one of Gemma (640x2048 in blocks of 16). Hot cache for the small ones: their
weights stay in L2 from call to call, so these are compute figures, not the bandwidth-bound
decode step (bench/llm.py has that).
"""
import collections
import contextlib
import io
import statistics
import subprocess

import numpy as np

from luminar.graph import Graph
from luminar.io import quant

SHAPES = [("Q4_1", 3072, 576, 32), ("Q4_1", 576, 1536, 32), ("Q4_1", 1536, 576, 32), ("Q8_0", 49152, 576, 32),
          ("Q8_0", 640, 2048, 16)]
MODES = ("float", "block", "int8")
ROUNDS, CALLS = 5, 50


def synthetic_parts(rng, qtype: str, n: int, k: int, size: int) -> dict[str, np.ndarray]:
    """Random storage parts of an (n, k) weight: Q4_1 nibbles, or Q8_0 int8s in blocks of `size`."""
    blocks = k // size
    parts = {"scale": (rng.random((n, blocks)) * 0.01).astype(np.float16)}
    if qtype == "Q4_1":
        parts["min"] = (-rng.random((n, blocks)) * 0.1).astype(np.float16)
        parts["quants"] = rng.integers(0, 256, (n, blocks, 16)).astype(np.uint8)
    else:
        parts["quants"] = rng.integers(-127, 128, (n, blocks, size)).astype(np.int8)
    return parts


def compiled(mode: str, qtype: str, parts: dict, x: np.ndarray):
    """(program, feeds) of y = x @ w.T: `mode` one of MODES."""
    n, k = parts["scale"].shape[0], x.shape[1]
    g = Graph()
    xs = g.tensor("x", x.shape)
    inputs = {name: g.tensor(f"w_{name}", a.shape, quant._STORAGE[a.dtype]) for name, a in parts.items()}
    weight = quant.QuantizedWeight(qtype, inputs, (n, k))
    products = {"int8": quant.int8_linear, "block": quant.block_linear}
    (products[mode](xs, weight) if mode in products else xs @ weight.dequantized().T).output("y")
    return g.compile("cpu"), {"x": x, **{f"w_{name}": a for name, a in parts.items()}}


def kernel_microseconds(program, feeds) -> float:
    """The program's kernels' time per call: per kernel the median over CALLS profiled calls, summed."""
    program.debug, err = 1, io.StringIO()
    with contextlib.redirect_stderr(err):
        for _ in range(CALLS):
            program.run(feeds)
    program.debug = 0
    per_kernel = collections.defaultdict(list)
    for line in err.getvalue().splitlines():  # "[luminar]   0.084 ms  k4_add (...)"
        fields = line.split()
        if len(fields) > 3 and fields[2] == "ms" and fields[3].startswith("k"):
            per_kernel[fields[3]].append(float(fields[1]) * 1e3)
    return sum(statistics.median(times) for times in per_kernel.values())


def main():
    macros = subprocess.run("cc -march=native -dM -E - </dev/null", shell=True, capture_output=True, text=True).stdout
    print("compiler targets:", [m for m in ("__AVX2__", "__AVX512F__", "__AVX512VNNI__") if m in macros])
    rng = np.random.default_rng(0)
    for qtype, n, k, size in SHAPES:
        parts, x = synthetic_parts(rng, qtype, n, k, size), rng.standard_normal((1, k)).astype(np.float32)
        programs = {mode: compiled(mode, qtype, parts, x) for mode in MODES}
        outputs = {mode: program.run(feeds)["y"] for mode, (program, feeds) in programs.items()}
        times = {mode: [] for mode in programs}
        for _ in range(ROUNDS):
            for mode, (program, feeds) in programs.items():
                times[mode].append(kernel_microseconds(program, feeds))
        median = {mode: statistics.median(t) for mode, t in times.items()}
        diff = {mode: float(np.abs(outputs[mode] - outputs["float"]).max() / np.abs(outputs["float"]).max())
                for mode in ("block", "int8")}
        print(f"{qtype} {n}x{k} (blocks of {size}): float {median['float']:.0f} us, block {median['block']:.0f} us "
              f"({median['float'] / median['block']:.2f}x), int8 {median['int8']:.0f} us "
              f"({median['float'] / median['int8']:.2f}x); largest difference from float: block {diff['block']:.1e}, "
              f"int8 {diff['int8']:.4f} of max |y|")


if __name__ == "__main__":
    main()
