"""The CPU target's bench: candidate schedules of one kernel compiled together, validated and timed.

Candidates build as two translation units compiled concurrently, run on random inputs sized
for the shape bucket, and are checked against the oracle: the kernel's plain loop body
evaluated at chosen output positions (render.render_oracle), which any output size affords.
"""
from __future__ import annotations

import ctypes
import dataclasses
import functools
import json
import platform

import numpy as np

from ...compiler.kernels import loads
from ...compiler.target import time_interleaved
from . import cc
from .render import PRELUDE, render_kernel, render_oracle

RTOL = 1e-3  # a candidate's output must match the oracle's within this (relative to the output's scale)




class Bench:
    """Variants of one kernel compiled together (two translation units built concurrently) and run
    on random inputs sized for concrete dims, plus the oracle: the kernel's plain loop body
    evaluated at chosen output positions (render.render_oracle), which any output size affords."""

    def __init__(self, program, kernel, schedules: list, env: dict, seed: int):
        self.kernel, self.env, self.schedules, self.seed = kernel, env, list(schedules), seed
        halves = [list(range(len(schedules)))[k::2] for k in range(2)]
        oracle = render_oracle(program, kernel)
        libs = cc.load_many(["\n\n".join([PRELUDE, oracle] + [_exported(program, kernel, f"lm_variant{k}", schedules[k])
                                                              for k in half]) for half in halves])
        self.calls = [cc.function(libs[k % 2], f"lm_variant{k}", [ctypes.c_void_p] * 2)  # (halves[k % 2] holds k)
                      for k in range(len(schedules))]
        self.oracle = cc.function(libs[0], "lm_oracle", [ctypes.c_void_p] * 3 + [ctypes.c_longlong, ctypes.c_void_p])
        self.arrays = _random_buffers(program, kernel, env, seed)
        self.pointers, self.dims = _c_arguments(program, self.arrays, env)

    def validate(self, expected: np.ndarray | None = None) -> list[bool]:
        """Whether each variant is right: its output matches the oracle at sampled positions (all
        of them for small outputs; else random ones, the first and the last) -- or `expected`
        everywhere when given -- and, where the first variant is right, its output everywhere."""
        n = self.arrays[self.kernel.out].size
        rng = np.random.default_rng(self.seed)
        which = np.arange(n) if n <= 4096 or expected is not None else np.unique(np.concatenate(
            [rng.integers(0, n, 2048), np.arange(64), np.arange(n - 64, n)]))
        which = np.ascontiguousarray(which, dtype=np.int64)
        truth = np.empty(len(which), np.float32) if expected is None else expected[which]
        if expected is None:
            self.oracle(self.pointers, self.dims, which.ctypes.data, len(which), truth.ctypes.data)
        finite = np.abs(truth[np.isfinite(truth)])
        atol = RTOL * (float(finite.max()) if finite.size else 1.0) + 1e-6
        close = lambda a, b: bool(np.isclose(a, b, rtol=RTOL, atol=atol, equal_nan=True).all())  # noqa: E731
        reference, ok = None, []
        for k in range(len(self.schedules)):
            self.arrays[self.kernel.out].fill(np.nan)  # an element a variant fails to write shows up as a mismatch
            self.calls[k](self.pointers, self.dims)
            out = self.arrays[self.kernel.out].copy()
            good = close(out[which], truth) and (reference is None or close(out, reference))
            reference = out if k == 0 and good else reference
            ok.append(good)
        return ok

    def time(self, which: list[int], budget_s: float) -> dict[int, float]:
        """Median seconds per call of each variant in `which` (compiler.target.time_interleaved)."""
        def run(k: int, reps: int) -> None:
            for _ in range(reps):
                self.calls[k](self.pointers, self.dims)
        return time_interleaved(run, which, budget_s)


def _exported(program, kernel, name: str, schedule=None) -> str:
    """The kernel's C function under `name`, callable from outside its shared object."""
    return render_kernel(program, dataclasses.replace(kernel, name=name), schedule).replace("static void", "void", 1)


def _c_arguments(program, arrays: dict, env: dict) -> tuple:
    """A kernel function's two arguments: the buffers' addresses (buffer id -> array) and the dims."""
    pointers = (ctypes.c_void_p * len(program.buffers))()
    for b, arr in arrays.items():
        pointers[b] = arr.ctypes.data
    return pointers, (ctypes.c_longlong * max(len(program.dims), 1))(*[env[d] for d in program.dims])


def _random_buffers(program, kernel, env, seed) -> dict[int, np.ndarray]:
    """Random contents for every buffer the kernel reads (in its storage dtype) and its output."""
    rng = np.random.default_rng(seed)
    arrays = {}
    for b in sorted({ld.buffer for ld in loads(kernel.value)} | {kernel.out}):
        buf, n = program.buffers[b], int(program.buffers[b].numel.evaluate(env))
        if buf.dtype in ("float32", "float16"):
            arrays[b] = rng.standard_normal(n).astype(buf.dtype)
        elif buf.dtype == "bfloat16":
            arrays[b] = (rng.standard_normal(n).astype(np.float32).view(np.uint32) >> 16).astype(np.uint16)
        else:
            info = np.iinfo(buf.dtype)
            arrays[b] = rng.integers(max(info.min, -128), min(info.max, 127) + 1, n).astype(buf.dtype)
    arrays[kernel.out] = np.zeros(int(program.buffers[kernel.out].numel.evaluate(env)), np.float32)
    return arrays


@functools.cache
def machine(threads: int) -> str:
    """What a measured schedule depends on besides the kernel: CPU model and features, thread
    count, C compiler and flags."""
    info = cc.cpuinfo()
    named = [line.split(":", 1)[1].strip() for line in info.splitlines() if line.startswith(("model name", "flags"))]
    cpu = " ".join(named)[:4000] if info else platform.processor()  # (no /proc/cpuinfo: not Linux)
    return json.dumps([platform.machine(), cpu, threads, cc.compiler(), cc.FLAGS])


def run_chain(program, kernels: list, arrays: dict, env: dict) -> None:
    """Run `kernels` in order, each with its default schedule, over `arrays` (buffer id -> array)."""
    lib = cc.load("\n\n".join([PRELUDE] + [_exported(program, k, f"lm_chain{n}") for n, k in enumerate(kernels)]))
    pointers, dims = _c_arguments(program, arrays, env)
    for n in range(len(kernels)):
        cc.function(lib, f"lm_chain{n}", [ctypes.c_void_p] * 2)(pointers, dims)
