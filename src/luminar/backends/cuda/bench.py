"""The cuda target's bench: candidate schedules of one kernel built as one cubin, validated against
the plain form on the device, and timed there.

The checks are the opencl bench's (backends/opencl/bench.Bench.validate: the plain loop body at
sampled positions, then the first valid candidate everywhere), over the same random inputs; the
device side (buffers, launches, copies) goes through the driver. A tensor-core candidate in a
precision the kernel may not use (target.legal: bf16 on float32 operands, tf32 not allowed)
never runs and counts as failed.
"""
from __future__ import annotations

import weakref

import numpy as np

from ...compiler.kernels import loads
from ...compiler.target import time_interleaved
from ..opencl import bench as opencl_bench
from ..opencl.render import render_kernel, render_sampled
from .dialect import CUDA
from .driver import Args, DeviceError, device
from .mma import TensorTiles
from .nvrtc import compile_cubin
from .target import launch

TF32_RTOL = 2e-2  # a TF32 output's error: ~2^-11 sqrt(steps) of its terms' scale, ~1e-3 of the output's


class Kernels:
    """Kernel functions of one cubin run over one set of device buffers (by buffer id)."""

    def __init__(self, target, program, arrays: dict, env: dict, sources: list, extra: str = "", extra_names=()):
        """`sources`: (function name, kernel, schedule) rendered into one program, after `extra`
        (which defines the functions `extra_names`)."""
        self.dev = device()
        self.dev.make_current()
        text = "\n\n".join([CUDA.prelude, extra] + [render_kernel(program, k, s, CUDA, n) for n, k, s in sources])
        self.functions = self.dev.load(compile_cubin(text, target.arch([s for _, _, s in sources])).image,
                                       [n for n, _, _ in sources] + list(extra_names))
        self.program, self.env, self.arrays = program, env, arrays
        self.pointers: list[int] = []
        weakref.finalize(self, _free_all, self.dev, self.pointers)
        self.buffers = {b: self.allocate(a.nbytes) for b, a in arrays.items()}
        self.dims = np.array([env[d] for d in program.dims] or [0], np.int64)
        self.dims_buffer = self.allocate(self.dims.nbytes)  # (the kernels read the dims from device memory)
        self.dev.upload(self.dims_buffer, self.dims)
        for b, a in arrays.items():
            self.dev.upload(self.buffers[b], a)
        self.dev.synchronize("copying the bench's inputs")
        self.calls = [(self.functions[name], launch(kernel, schedule, env), Args(self.args(kernel)), name)
                      for name, kernel, schedule in sources]

    def allocate(self, nbytes: int) -> int:
        self.pointers.append(self.dev.allocate(nbytes))
        return self.pointers[-1]

    def args(self, kernel) -> list[int]:
        """A kernel function's arguments: a buffer and offset 0 per buffer it touches, then the dims' array."""
        used = sorted({ld.buffer for ld in loads(kernel.value)} | {kernel.out})
        return [x for b in used for x in (self.buffers[b], 0)] + [self.dims_buffer]

    def run(self, k: int) -> None:
        function, sizes, args, name = self.calls[k]
        if sizes is not None:
            self.dev.launch(function, *sizes, args, name)

    def read(self, b: int) -> np.ndarray:
        out = np.empty_like(self.arrays[b])
        self.dev.download(out, self.buffers[b])
        self.dev.synchronize("reading a bench output")
        return out

    def fill(self, b: int, value: float) -> None:
        host = np.full_like(self.arrays[b], value)
        self.dev.upload(self.buffers[b], host)
        self.dev.synchronize("filling a bench output")


def _free_all(dev, pointers: list) -> None:
    try:
        for ptr in pointers:
            dev.free(ptr)
    except Exception:  # (the driver may be shut down at interpreter exit)
        pass
    pointers.clear()


class Bench(opencl_bench.Bench):
    """Variants of one kernel plus the plain form at sampled positions, built as one cubin."""

    def __init__(self, target, program, kernel, schedules: list, env: dict, seed: int):
        self.target, self.kernel, self.schedules, self.seed = target, kernel, list(schedules), seed
        self.legal = [target.legal(program, kernel, s) for s in self.schedules]
        reads = {ld.buffer for ld in loads(kernel.value)}
        self.arrays = opencl_bench.random_buffers(program, reads, env, seed)
        self.arrays[kernel.out] = np.zeros(int(program.buffers[kernel.out].numel.evaluate(env)), np.float32)
        sources = [(f"lm_variant{k}", kernel, s) for k, s in enumerate(self.schedules) if self.legal[k]]
        self.index = {int(name.removeprefix("lm_variant")): n for n, (name, _, _) in enumerate(sources)}
        self.kernels = Kernels(target, program, self.arrays, env, sources,
                               render_sampled(program, kernel, CUDA, "lm_plain"), ["lm_plain"])

    def output(self, k: int) -> np.ndarray | None:
        """Variant k's output, or None when it may not run here or the device refuses to launch it."""
        if k not in self.index:
            return None
        self.kernels.fill(self.kernel.out, np.nan)  # an element a variant fails to write shows up as a mismatch
        try:
            self.kernels.run(self.index[k])
            return self.kernels.read(self.kernel.out)
        except DeviceError:  # (too many registers or threads for a block: legal to write, not to launch)
            return None

    def validate(self, expected: np.ndarray | None = None) -> list[bool]:
        """The opencl bench's checks (backends/opencl/bench.Bench.validate) for the exact forms; a
        TF32 tensor-core form rounds its operands to 10-bit mantissas, so it is checked against the
        plain form at the same kind of sampled positions within TF32_RTOL of the output's scale."""
        tf32 = {k for k in self.index
                if isinstance(self.schedules[k], TensorTiles) and self.schedules[k].precision == "tf32"}
        index, self.index = self.index, {k: n for k, n in self.index.items() if k not in tf32}
        try:
            ok = super().validate(expected)
        finally:
            self.index = index
        if tf32:
            n = self.arrays[self.kernel.out].size
            rng = np.random.default_rng(self.seed)
            which = np.arange(n) if n <= 4096 else np.unique(np.concatenate(
                [rng.integers(0, n, 2048), np.arange(64), np.arange(n - 64, n)]))
            which = np.ascontiguousarray(which, dtype=np.int64)
            truth = expected[which] if expected is not None else self.plain(which)
            finite = np.abs(truth[np.isfinite(truth)])
            atol = TF32_RTOL * (float(finite.max()) if finite.size else 1.0) + 1e-6
            for k in tf32:
                out = self.output(k)
                ok[k] = out is not None and bool(np.isclose(out[which], truth, rtol=TF32_RTOL, atol=atol,
                                                            equal_nan=True).all())
        return ok

    def plain(self, which: np.ndarray) -> np.ndarray:
        """The plain loop body's values at flat output positions `which`."""
        kernels, dev = self.kernels, self.kernels.dev
        samples = np.empty(len(which), np.float32)
        positions, out = kernels.allocate(which.nbytes), kernels.allocate(samples.nbytes)
        dev.upload(positions, which)
        args = Args(kernels.args(self.kernel) + [positions, len(which), out])
        dev.launch(kernels.functions["lm_plain"], (-(-len(which) // 64), 1, 1), (64, 1, 1), args, "the plain form")
        dev.download(samples, out)
        dev.synchronize("the plain form")
        return samples

    def time(self, which: list[int], budget_s: float) -> dict[int, float]:
        """Median seconds per call of each variant in `which` (compiler.target.time_interleaved),
        each sample waiting for the stream to drain before and after."""
        dev = self.kernels.dev

        def run(k: int, reps: int) -> None:
            dev.synchronize()
            for _ in range(reps):
                self.kernels.run(self.index[k])
            dev.synchronize()
        return time_interleaved(run, [k for k in which if k in self.index], budget_s, opencl_bench.SAMPLE_S)


def run_chain(target, program, kernels: list, arrays: dict, env: dict) -> None:
    """Run `kernels` in order with the target's default schedules over `arrays` (buffer id ->
    array, every buffer they touch); the arrays the kernels write hold the results afterwards."""
    chain = Kernels(target, program, arrays, env,
                    [(f"lm_chain{n}", k, target.default_schedule(k)) for n, k in enumerate(kernels)])
    for n in range(len(kernels)):
        chain.run(n)
    for k in kernels:
        arrays[k.out][...] = chain.read(k.out)
