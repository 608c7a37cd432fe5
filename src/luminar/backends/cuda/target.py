"""CUDA as a compiler target: the GPU kernel forms of the opencl target as CUDA C, plus tensor cores.

Everything the compiler and the search know about this backend goes through `CUDATarget`
(compiler/target.py). The kernel forms (Grid, Rows, Tiled, and Online: the flash-attention form of a fused softmax
region, which the search times against the unfused kernels), their renderer and their schedule
space are the opencl target's, written against a dialect table: here rendered with `CUDA`
(dialect.py), compiled by NVRTC to a cubin (nvrtc.py). The target adds the tensor-core form
(mma.py) to the space, and a reduction split across blocks (split.py) as the default for long
reductions to few outputs (a sum to a scalar): a "tensor" stage turns a nest's shared-memory staging mark into an mma
mark (one per precision the kernel may use), and `to_schedule` maps such a nest to the Mma form
with the same block of outputs, when whole warps can cover it.

On a Hopper device (sm_90) the stage also offers Hopper's warpgroup instruction (wgmma.py,
wgmma.mma_async, for 64-row-per-warpgroup tiles); a program using it is compiled for sm_90a.

Precision: float32 stays float32 unless the user passes allow_tf32=True (PyTorch's convention):
then matmul-shaped kernels default to TF32 tensor cores, and the search may pick them. BF16
tensor cores are offered for every matmul-shaped kernel, but only run where both operands are
bfloat16 values (exact): the bench, which sees the program's dtypes, refuses the others.

Building needs no GPU: the tests compile every kernel for sm_90 here. A target made by the
runtime (program.py) knows its device (architecture, SMs, limits); the default one stands for
an H200.
"""
from __future__ import annotations

from typing import NamedTuple

from ...compiler.analysis import plan_tiles
from ...compiler.target import Target
from ..opencl import schedules, space
from ..opencl.render import Call, launch as work_sizes, render_program
from ..opencl.schedules import Tiled
from . import mma
from .dialect import CUDA
from . import wgmma
from .mma import Mma, TensorTiles
from .nvrtc import Cubin, compile_cubin, version
from .split import Split, applies as splits
from .wgmma import Wgmma

MMA_MARKS = {"tf32": "mma-tf32", "bf16": "mma-bf16"}  # nest marks: stage in shared memory, compute on tensor cores
WGMMA_MARKS = {"tf32": "wgmma-tf32", "bf16": "wgmma-bf16"}  # the same on Hopper's warpgroup instructions (sm_90a)
TENSOR_MARKS = {**{m: (Mma, p) for p, m in MMA_MARKS.items()}, **{m: (Wgmma, p) for p, m in WGMMA_MARKS.items()}}


class Built(NamedTuple):
    source: str  # the program's CUDA C
    cubin: Cubin  # compiled for the target's architecture
    calls: list[Call]  # the kernels in order (a schedule per shape bucket: search.nearest_bucket picks)


class Device(NamedTuple):
    """What the target needs to know about the GPU it compiles for."""
    name: str
    arch: str  # "sm_90"
    sms: int  # streaming multiprocessors
    max_threads: int  # per block
    shared_bytes: int  # static shared memory per block


H200 = Device("NVIDIA H200 (assumed: no device)", "sm_90", 132, 1024, 48 * 1024)


def launch(kernel, schedule, env: dict) -> tuple[tuple, tuple] | None:
    """(grid in blocks, block in threads), three dims each, of a call at these dim values; None:
    nothing to compute (cuLaunchKernel's units; the opencl forms count work-items)."""
    if isinstance(schedule, (TensorTiles, Split)):
        return schedule.launch(kernel, env)
    sizes = work_sizes(kernel, schedule, env)
    if sizes is None:
        return None
    (total, block) = (tuple(x) + (1,) * (3 - len(x)) for x in sizes)
    return tuple(t // b for t, b in zip(total, block)), block


class CUDATarget(Target):
    name = "cuda"
    package = __package__

    def __init__(self, device: Device = H200, allow_tf32: bool = False):
        self.device, self.allow_tf32 = device, bool(allow_tf32)

    # -- schedules
    def default_schedule(self, kernel):
        """The opencl target's rules, but a long reduction to few outputs split across blocks;
        with TF32 allowed, tensor cores for a matmul's tiles."""
        if splits(kernel):
            return Split()
        chosen = schedules.default_schedule(kernel)
        if self.allow_tf32 and isinstance(chosen, Tiled) and mma.operands(kernel, plan_tiles(kernel)):
            return Mma()
        return chosen

    def schedule_to_json(self, schedule) -> dict:
        return schedules.to_json(schedule)

    def schedule_from_json(self, data: dict):
        own = {cls.kind: cls for cls in (Mma, Wgmma, Split)}.get(data.get("kind"))
        return own(**{k: v for k, v in data.items() if k != "kind"}) if own else schedules.from_json(data)

    # -- the schedule space
    def space(self, kernel, env: dict):
        sp = space.space(kernel, env, self.device.max_threads)
        if sp is not None and mma.operands(kernel, plan_tiles(kernel)):
            sp.facts.extend(("mma", MMA_MARKS[p]) for p in self._precisions())
            if self.device.arch in wgmma.SM90A:
                sp.facts.extend(("mma", WGMMA_MARKS[p]) for p in self._precisions())
        return sp

    def _precisions(self) -> list[str]:
        return ["tf32", "bf16"] if self.allow_tf32 else ["bf16"]

    def rules(self, language):
        """The opencl target's stages, then "tensor": a staged nest may run on tensor cores."""
        from egglog import String, relation, rewrite, ruleset, var, vars_
        from ...compiler.search import PACK
        fact, stages = space.rules(language)
        fact = {**fact, "mma": relation("cuda_mma", String)}
        (mark,), x = vars_("mark", String), var("x", language.Nest)
        tensor = ruleset(rewrite(language.Nest.mark(PACK.what, x)).to(language.Nest.mark(mark, x), fact["mma"](mark)),
                         name="cuda_tensor")
        return fact, [*stages, tensor]

    def viable(self, kernel, sp):
        test = space.viable(kernel, sp)
        return lambda prefix, item: test(tuple(map(_as_pack, prefix)), _as_pack(item))

    def to_schedule(self, nest: tuple, kernel, sp=None):
        marks = [it.what for it in nest if getattr(it, "what", None) in TENSOR_MARKS]
        tiled = space.to_schedule(tuple(map(_as_pack, nest)), kernel, self.device.max_threads, self.device.shared_bytes)
        if not marks:
            return tiled
        if not isinstance(tiled, Tiled):
            return None
        form, precision = TENSOR_MARKS[marks[0]]
        return (mma if form is Mma else wgmma).from_tile(tiled.wi, tiled.wj, tiled.ri, tiled.rj, tiled.kt, precision)

    def family(self, schedule):
        if isinstance(schedule, Mma):
            return (schedule.kind, schedule.precision, schedule.tm, schedule.tn)
        if isinstance(schedule, Wgmma):
            return (schedule.kind, schedule.precision, schedule.n)
        return space.family(schedule)

    def estimate(self, program, kernel, schedule, env: dict) -> float:
        """The opencl roofline; a tensor-core tile as the SIMT tile of the same block, its
        arithmetic 4x (TF32) or 8x (BF16) faster. A form the kernel may not use ranks last (the
        space offers BF16 tiles for every matmul: only here are the operands' dtypes known)."""
        if not self.legal(program, kernel, schedule):
            return float("inf")
        if isinstance(schedule, Mma):
            same = Tiled(wi=schedule.wm * 8, wj=schedule.wn * 4, ri=schedule.tm * 2, rj=schedule.tn * 2,
                         kt=schedule.kt, local=True)
        elif isinstance(schedule, Wgmma):  # (ranked as the mma tiles: it has never been measured)
            same = Tiled(wi=schedule.groups * 8, wj=16, ri=8, rj=schedule.n // 16, kt=schedule.kt, local=True)
        else:
            return space.estimate(program, kernel, schedule, env, self.device.sms)
        return space.estimate(program, kernel, same, env, self.device.sms) / (4 if schedule.precision == "tf32" else 8)

    def fused_schedules(self, kernel, forms: list[str], env: dict) -> tuple[list, list]:
        """The opencl target's online-softmax (flash) blocks that fit this device's blocks and
        shared memory (rendered as CUDA C through the dialect), for the search to time against
        the unfused kernels."""
        return space.fused_schedules(kernel, forms, self.device.max_threads, self.device.shared_bytes)

    # -- measuring and building
    def bench(self, program, kernel, candidates: list, env: dict, seed: int):
        from .bench import Bench
        return Bench(self, program, kernel, candidates, env, seed)

    def run_chain(self, program, kernels: list, arrays: dict, env: dict):
        from .bench import run_chain
        run_chain(self, program, kernels, arrays, env)

    def legal(self, program, kernel, schedule) -> bool:
        """Whether the schedule computes what the user asked for: a tensor-core form's precision
        must be one this kernel may use (bf16 only on bfloat16 operands, tf32 only if allowed); a
        wgmma form needs a Hopper device (sm_90a)."""
        if isinstance(schedule, Wgmma) and self.device.arch not in wgmma.SM90A:
            return False
        return not isinstance(schedule, TensorTiles) or schedule.precision in mma.precisions(program, kernel, self.allow_tf32)

    def build(self, program, chosen: dict) -> Built:
        """Every kernel rendered in its schedule (the default for a kernel not chosen, or chosen in
        a precision it may not use: a tuning-cache entry of another program), compiled to a cubin."""
        picked = {}
        for kernel in program.kernels:
            per = chosen.get(kernel.name) or [self.default_schedule(kernel)]
            picked[kernel.name] = [s if self.legal(program, kernel, s) else schedules.default_schedule(kernel) for s in per]
        source, calls = render_program(program, picked, CUDA)
        return Built(source, compile_cubin(source, self.arch([s for per in picked.values() for s in per])), calls)

    def arch(self, schedules) -> str:
        """The architecture to compile a program of these schedules for: the device's, but sm_90a
        (Hopper's own features) when a wgmma form is among them."""
        return "sm_90a" if any(isinstance(s, Wgmma) for s in schedules) else self.device.arch

    # -- identity
    def machine(self) -> str:
        major, minor = version()
        d = self.device
        return f"{d.name} | {d.arch} | {d.sms} SMs | NVRTC {major}.{minor} | tf32 {'allowed' if self.allow_tf32 else 'off'}"


def _as_pack(item):
    """A nest item with the tensor-core marks read as the staging mark they replace."""
    from ...compiler.search import PACK
    return PACK if getattr(item, "what", None) in TENSOR_MARKS else item


CUDA_TARGET = CUDATarget()
