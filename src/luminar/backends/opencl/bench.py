"""The OpenCL target's bench: candidate schedules of one kernel built as one program, validated
against the plain form on the device, and timed there.

The plain loop body (an output element per work-item, reductions serial), evaluated at sampled
output positions, is the semantics a candidate must match; the first candidate (the default),
once right, is compared with the others everywhere. Inputs are random (normal floats, small
integers: never all zero), drawn with the search's seed.
"""
from __future__ import annotations


import numpy as np

from ...compiler.kernels import loads, numel
from ...compiler.target import time_interleaved
from .device import device, opencl
from .render import launch, render_kernel, render_sampled
from .schedules import Split

RTOL = 1e-3  # a candidate's output must match the plain form's within this (relative to the output's scale)
SAMPLE_S = 0.002  # a timing sample repeats the call until it lasts about this long


def random_buffers(program, buffers, env, seed) -> dict[int, np.ndarray]:
    """Random contents, in each buffer's storage dtype, for `buffers` (ids)."""
    rng = np.random.default_rng(seed)
    arrays = {}
    for b in sorted(buffers):
        buf, n = program.buffers[b], int(program.buffers[b].numel.evaluate(env))
        if buf.dtype in ("float32", "float16"):
            arrays[b] = rng.standard_normal(n).astype(buf.dtype)
        elif buf.dtype == "bfloat16":
            arrays[b] = (rng.standard_normal(n).astype(np.float32).view(np.uint32) >> 16).astype(np.uint16)
        else:
            info = np.iinfo(buf.dtype)
            arrays[b] = rng.integers(max(info.min, -128), min(info.max, 127) + 1, n).astype(buf.dtype)
    return arrays


class Kernels:
    """Kernel functions of one built program run over one set of device buffers (by buffer id)."""

    def __init__(self, program, arrays: dict, env: dict, sources: list, extra: str = ""):
        """`sources`: (function name, kernel, schedule) rendered into one program, after `extra`."""
        cl, self.dev = opencl(), device()
        dialect = self.dev.dialect  # (OPENCL, with sub-group shuffles where the device has them)
        text = "\n\n".join([dialect.prelude, extra] + [render_kernel(program, k, s, dialect, n) for n, k, s in sources])
        self.built = self.dev.build(text)
        self.program, self.env, self.arrays = program, env, arrays
        self.buffers = {b: self.dev.allocate(a.nbytes) for b, a in arrays.items()}
        for b, a in arrays.items():
            if a.nbytes:
                cl.enqueue_copy(self.dev.queue, self.buffers[b], a)
        self.calls, self.scratch_buffers = [], []
        for name, kernel, schedule in sources:
            function = cl.Kernel(self.built, name)
            function.set_args(*self.args(kernel), *self.scratch(kernel, schedule))
            self.calls.append((function, launch(kernel, schedule, env)))

    def args(self, kernel) -> list:
        """A kernel function's arguments: a buffer and offset 0 per buffer it touches, then the dims."""
        used = sorted({ld.buffer for ld in loads(kernel.value)} | {kernel.out})
        return [x for b in used for x in (self.buffers[b], np.int64(0))] + \
            [np.int64(self.env[d]) for d in self.program.dims]

    def scratch(self, kernel, schedule) -> list:
        """A split form's scratch arguments: its own zero-filled buffer at offset 0 (split.py)."""
        if not isinstance(schedule, Split):
            return []
        words = np.zeros(schedule.scratch(numel(kernel.shape).value), np.int32)
        buffer = self.dev.allocate(words.nbytes)
        opencl().enqueue_copy(self.dev.queue, buffer, words)
        self.scratch_buffers.append(buffer)  # (kept alive here: a kernel argument holds no reference)
        return [buffer, np.int64(0)]

    def run(self, k: int) -> None:
        function, sizes = self.calls[k]
        if sizes is not None:
            opencl().enqueue_nd_range_kernel(self.dev.queue, function, *sizes)

    def read(self, b: int) -> np.ndarray:
        out = np.empty_like(self.arrays[b])
        if out.nbytes:
            opencl().enqueue_copy(self.dev.queue, out, self.buffers[b])
        return out

    def fill(self, b: int, value: float) -> None:
        if self.arrays[b].nbytes:
            opencl().enqueue_copy(self.dev.queue, self.buffers[b], np.full_like(self.arrays[b], value))


class Bench:
    """Variants of one kernel plus the plain form at sampled positions, built as one program."""

    def __init__(self, program, kernel, schedules: list, env: dict, seed: int):
        self.kernel, self.schedules, self.seed = kernel, list(schedules), seed
        reads = {ld.buffer for ld in loads(kernel.value)}
        self.arrays = random_buffers(program, reads, env, seed)
        self.arrays[kernel.out] = np.zeros(int(program.buffers[kernel.out].numel.evaluate(env)), np.float32)
        sources = [(f"lm_variant{k}", kernel, s) for k, s in enumerate(self.schedules)]
        self.kernels = Kernels(program, self.arrays, env, sources, render_sampled(program, kernel, device().dialect, "lm_plain"))

    def output(self, k: int) -> np.ndarray | None:
        """Variant k's output, or None when the device refuses to run it (too many registers or
        too much local memory for a work-group: legal to write, not to launch)."""
        self.kernels.fill(self.kernel.out, np.nan)  # an element a variant fails to write shows up as a mismatch
        try:
            self.kernels.run(k)
            return self.kernels.read(self.kernel.out)
        except opencl().Error:
            return None

    def plain(self, which: np.ndarray) -> np.ndarray:
        """The plain loop body's values at flat output positions `which`."""
        cl, dev = opencl(), self.kernels.dev
        samples = np.empty(len(which), np.float32)
        positions, out = dev.allocate(which.nbytes), dev.allocate(samples.nbytes)
        cl.enqueue_copy(dev.queue, positions, which)
        function = cl.Kernel(self.kernels.built, "lm_plain")
        function.set_args(*self.kernels.args(self.kernel), positions, np.int64(len(which)), out)
        cl.enqueue_nd_range_kernel(dev.queue, function, (-(-len(which) // 64) * 64,), (64,))
        cl.enqueue_copy(dev.queue, samples, out)
        return samples

    def validate(self, expected: np.ndarray | None = None) -> list[bool]:
        """Whether each variant is right: its output matches the plain loop body at sampled
        positions (every position of small outputs; else random ones, the first and the last) --
        or `expected` everywhere when given -- and, where the first variant is right, its output
        everywhere."""
        n = self.arrays[self.kernel.out].size
        rng = np.random.default_rng(self.seed)
        which = np.arange(n) if n <= 4096 or expected is not None else np.unique(np.concatenate(
            [rng.integers(0, n, 2048), np.arange(64), np.arange(n - 64, n)]))
        which = np.ascontiguousarray(which, dtype=np.int64)
        truth = expected[which] if expected is not None else self.plain(which)
        finite = np.abs(truth[np.isfinite(truth)])
        atol = RTOL * (float(finite.max()) if finite.size else 1.0) + 1e-6
        close = lambda a, b: bool(np.isclose(a, b, rtol=RTOL, atol=atol, equal_nan=True).all())  # noqa: E731
        reference, ok = None, []
        for k in range(len(self.schedules)):
            out = self.output(k)
            good = out is not None and close(out[which], truth) and (reference is None or close(out, reference))
            reference = out if k == 0 and good else reference
            ok.append(good)
        if reference is not None:
            self.arrays[self.kernel.out][...] = reference
        return ok

    def time(self, which: list[int], budget_s: float) -> dict[int, float]:
        """Median seconds per call of each variant in `which` (compiler.target.time_interleaved),
        each sample waiting for the device queue to drain before and after."""
        queue = self.kernels.dev.queue

        def run(k: int, reps: int) -> None:
            queue.finish()
            for _ in range(reps):
                self.kernels.run(k)
            queue.finish()
        return time_interleaved(run, which, budget_s, SAMPLE_S)


def run_chain(program, kernels: list, arrays: dict, env: dict) -> None:
    """Run `kernels` in order with their default schedules over `arrays` (buffer id -> array, every
    buffer they touch); the arrays the kernels write hold the results afterwards."""
    from .schedules import default_schedule
    chain = Kernels(program, arrays, env, [(f"lm_chain{n}", k, default_schedule(k)) for n, k in enumerate(kernels)])
    for n in range(len(kernels)):
        chain.run(n)
    for k in kernels:
        arrays[k.out][...] = chain.read(k.out)
