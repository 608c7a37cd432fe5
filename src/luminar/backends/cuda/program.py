"""The cuda target's runtime: a compiled graph's cubin, its arena, and each call as one CUDA graph.

What the opencl runtime does (OpenCLProgram: memory plans per dim bucket placing every
temporary in one arena, device buffers for inputs and outputs, weights copied once) is
inherited, with its device-resident inputs: the new value of a `Graph.update` input (training
parameters, optimizer state) stays on the device as the next call's input and is copied to the
host only when read through `state`; an `append_only` input (a KV cache passed as a growing
prefix `cache[:length]`) keeps its device copy and a call copies only the bytes past what is
there (a decode step: the new token's rows); `transfers` counts the bytes each way. Only the
copies are this runtime's (cuMemcpy*Async on its stream), and the call itself: the kernels a
call runs are one CUDA graph, built once per shape bucket and set of non-empty kernels,
instantiated, and replayed with one cuGraphLaunch per call (`graph_launches` counts them): a
decode step is one launch, not one per kernel.
The kernels read the call's dims from one small device array (copied in before the replay) and
are launched for the dims rounded up to powers of two, so the calls of a bucket (every decode
step from 65 to 128 tokens) replay the graph unchanged. A call whose launches do differ (a new
bucket, a buffer that moved) updates only the nodes whose arguments or grid changed, in place
(cuGraphExecKernelNodeSetParams), before the replay: a state's buffers swap each call (its
nodes change), a KV cache's moves only when the host cache is reallocated larger. Copies are
only the inputs' (host to device, before the replay) and the outputs' (back, after it).

Every device buffer the program allocates is freed when it is replaced by a larger one, and
all of them (with the graphs) when the program is garbage-collected.
"""
from __future__ import annotations

import math
import weakref

import numpy as np

from ...compiler import pipeline
from ...compiler.memory import sizing_dims
from ...compiler.search import nearest_bucket
from ...errors import UnsupportedError
from ...program import Program
from ...symbolic import Const, FloorDiv, Min, Mul, Sum, Var
from ..opencl.program import Mirror, OpenCLProgram, Transfers
from .driver import Args, check, device, driver
from .target import CUDATarget, launch

MAX_GRAPHS = 16  # instantiated graphs kept per program (shape buckets x which kernels are non-empty)


class Replay:
    """One instantiated CUDA graph: the call's kernels in order, each node's current arguments."""

    def __init__(self, launches: list):
        cu = driver()
        self.graph = check(cu.cuGraphCreate(0), "cuGraphCreate")
        self.nodes = []
        for function, grid, block, args in launches:
            after = self.nodes[-1:]
            self.nodes.append(check(cu.cuGraphAddKernelNode(self.graph, after, len(after),
                                                            _node_params(function, grid, block, args)),
                                    "cuGraphAddKernelNode"))
        self.exec = check(cu.cuGraphInstantiate(self.graph, 0), "cuGraphInstantiate")
        self.applied = launches  # what the nodes hold now
        # (from, to) launch lists -> the nodes that differ: a state's buffers swap every call, so a
        # decode step goes back and forth between two lists (kept here with their diff, so alive)
        self._diffs: dict[tuple[int, int], tuple[list, list, list[int]]] = {}

    def update(self, launches: list) -> int:
        """Set the nodes whose grid or arguments differ from `launches`; returns how many changed."""
        if launches is self.applied:
            return 0
        known = self._diffs.get((id(self.applied), id(launches)))
        if known is not None and known[0] is self.applied and known[1] is launches:
            changed = known[2]
        else:
            changed = [k for k, (old, new) in enumerate(zip(self.applied, launches))
                       if old[1:3] != new[1:3] or old[3].values != new[3].values]
            if len(self._diffs) >= 16:
                self._diffs.clear()
            self._diffs[id(self.applied), id(launches)] = (self.applied, launches, changed)
        cu = driver()
        for k in changed:
            check(cu.cuGraphExecKernelNodeSetParams(self.exec, self.nodes[k], _node_params(*launches[k])),
                  "cuGraphExecKernelNodeSetParams")
        self.applied = launches
        return len(changed)

    def destroy(self) -> None:
        cu = driver()
        cu.cuGraphExecDestroy(self.exec)
        cu.cuGraphDestroy(self.graph)


def growing(e) -> bool:
    """Whether a dim expression never decreases as any dim (>= 0) grows: sums with positive
    coefficients, products, floor division by a positive constant, min and max of such."""
    if isinstance(e, (Const, Var)):
        return True
    if isinstance(e, Sum):
        return all(c > 0 and growing(t) for t, c in e.terms)
    if isinstance(e, Mul):
        return all(map(growing, e.children))
    if isinstance(e, FloorDiv):
        return growing(e.a) and isinstance(e.b, Const) and e.b.value > 0
    if isinstance(e, Min):  # (and Max, its subclass)
        return growing(e.a) and growing(e.b)
    return False


def _node_params(function, grid: tuple, block: tuple, args: Args):
    params = driver().CUDA_KERNEL_NODE_PARAMS()
    params.func = function
    params.gridDimX, params.gridDimY, params.gridDimZ = grid
    params.blockDimX, params.blockDimY, params.blockDimZ = block
    params.sharedMemBytes = 0
    params.kernelParams = args.address  # (the driver copies the arguments into the node)
    return params


def _release(dev, pointers: list, replays: dict) -> None:
    """Free a program's device buffers and graphs (at garbage collection; errors at exit ignored)."""
    try:
        dev.make_current()
        for replay in replays.values():
            replay.destroy()
        for ptr in pointers:
            dev.free(ptr)
    except Exception:  # (the driver may already be shut down when the interpreter exits)
        pass
    pointers.clear()
    replays.clear()


class CUDAProgram(OpenCLProgram):
    """A graph compiled to one cubin; a call replays one CUDA graph. `source` is the generated
    CUDA C, `cubin` NVRTC's output (with ptxas's register and spill report), `kernels` the IR."""
    backend = "cuda"

    def __init__(self, graph, search=None, search_dims=None, seed=0, target=None, allow_tf32=False):
        """Options: `search`, `search_dims`, `seed` (see compiler/pipeline.compile_graph);
        `allow_tf32` (default False): matmuls may round their operands to TF32 on tensor cores;
        `target` a CUDATarget (default: the device's, with allow_tf32)."""
        Program.__init__(self, graph)
        self.device = device()  # (first: no device is a DeviceError before any compiling)
        target = target or CUDATarget(self.device.target, allow_tf32)
        self.compiled = pipeline.compile_graph(graph, target, search, search_dims, seed)
        self.kernels, self.search = self.compiled.kernels, self.compiled.search
        self.choices, self.fusions = self.compiled.choices, self.compiled.fusions
        built = self.compiled.built
        self.source, self.cubin, self.compile_seconds = built.source, built.cubin, self.compiled.build_seconds
        functions = self.device.load(built.cubin.image, sorted({n for call in built.calls for n in call.functions}))
        self._calls = [(call, [functions[n] for n in call.functions]) for call in built.calls]
        self._plans, self._arena, self._arena_bytes = {}, None, 0
        self._sizing_dims = sizing_dims(self.kernels, self.compiled.lifetimes)
        self._inputs: dict[str, tuple] = {}  # input name -> (the resident host array or None, device address, bytes)
        self._outputs: dict[str, tuple] = {}  # output name -> (device address, bytes)
        self._pointers: list[int] = []  # every live device buffer
        self._allocations = 0  # buffers allocated so far (a new one: inputs' and outputs' buffers may have moved)
        self._appended: set[str] = set()  # append-only inputs (opencl/program.py's module doc)
        self._mirrors: dict[str, Mirror] = {}
        self._stale: dict[str, np.ndarray] = {}  # updated input -> its host array, not yet copied from the device
        self._staged: list[np.ndarray] = []  # host arrays the stream reads until the next synchronize
        self.transfers = Transfers()
        self._replays: dict[tuple, Replay] = {}
        self._dims_buffer = self._allocate(8 * max(len(self.kernels.dims), 1))  # the call's dims, read by every kernel
        self._launch_cache: dict[tuple, tuple] = {}  # (bucket, dims rounded up, buffer addresses) -> launches, graph
        self._state_buffers = [b for name, output in graph.updates.items()  # (those swap at each call)
                               for b in (self.kernels.inputs.get(name), self.kernels.outputs.get(output)) if b is not None]
        self._placed: dict[tuple, dict] = {}  # (plan, arena) -> where each temporary is
        self._shapes: dict[tuple, dict] = {}  # dims -> the outputs' shapes
        # launches may be sized for dims rounded up only if no output shape shrinks as a dim grows (t - s)
        self._round_dims = all(growing(d) for call, _ in self._calls for d in call.kernel.shape)
        self.graph_updates = 0  # graph nodes updated in place so far (a new dims bucket, a buffer moved)
        self.graph_launches = 0  # cuGraphLaunch calls so far (one per call; `replay` adds its own)
        self._last: Replay | None = None  # the graph the last call replayed
        weakref.finalize(self, _release, self.device, self._pointers, self._replays)

    def _allocate(self, nbytes: int) -> int:
        ptr = self.device.allocate(nbytes)
        self._pointers.append(ptr)
        self._allocations += 1
        return ptr

    def _free(self, ptr: int) -> None:
        self._pointers.remove(ptr)
        self.device.free(ptr)

    # -- the copies the opencl program's placement of inputs and state makes (_upload, _collect, _synced)
    def _copy_to_device(self, buffer: int, host: np.ndarray, offset: int = 0) -> None:
        """In stream order; `host` is kept alive until the stream synchronizes."""
        if host.nbytes:
            self.device.upload(buffer + offset, host)
            self._staged.append(host)
            self.transfers.to_device += host.nbytes

    def _copy_to_host(self, host: np.ndarray, buffer: int) -> None:
        if host.nbytes:
            self.device.download(host, buffer)
            self.transfers.to_host += host.nbytes

    def _finish(self) -> None:
        self.device.make_current()  # (a state read may come from another thread)
        self.device.synchronize("the program's CUDA graph")
        self._staged = []

    def _room(self, held: tuple | None, nbytes: int) -> tuple:
        """(device address, its bytes): `held`'s when it is large enough, else a new buffer of the
        next power of two (an input growing by a token a call, a KV cache, moves rarely, and with
        it the graph's arguments); the old one freed: nothing else refers to it, and no call is
        in flight between calls."""
        if held is not None and held[1] >= nbytes:
            return held
        if held is not None:
            self._free(held[0])
        room = 1 << max(int(nbytes) - 1, 0).bit_length()
        return self._allocate(room), room

    def execute(self, arrays, env):
        dev, kp = self.device, self.kernels
        dev.make_current()
        plan = self.memory_plan(env)
        if self._arena is None or self._arena_bytes < plan.arena_bytes:
            self._arena, self._arena_bytes = self._room((self._arena, self._arena_bytes) if self._arena else None,
                                                        plan.arena_bytes)
        # (a decode step's host work is most of its time: what a call of the same plan and dims
        # computed before is kept)
        placed = self._placed.get((id(plan), self._arena))
        if placed is None:
            placed = self._placed[id(plan), self._arena] = {b: (self._arena, o // 4) for b, o in plan.offsets.items()}
        where = dict(placed)
        self._place_inputs(arrays, where)
        dims_key = tuple(env[d] for d in kp.dims)
        shapes = self._shapes.get(dims_key)
        if shapes is None:
            if len(self._shapes) >= 64:
                self._shapes.clear()
            shapes = self._shapes[dims_key] = {name: tuple(int(d.evaluate(env)) for d in kp.output_shapes[name])
                                               for name in kp.outputs}
        for name, buf in kp.outputs.items():
            self._outputs[name] = self._room(self._outputs.get(name), 4 * math.prod(shapes[name]))
            where[buf] = (self._outputs[name][0], 0)
        dims = np.array([env[d] for d in kp.dims] or [0], np.int64)
        dev.upload(self._dims_buffer, dims)  # (in stream order: before the replay reads them; not in
        self._staged.append(dims)           # `transfers`: the kernels' arguments, as opencl's are)
        self._replay(*self._launches(where, env, plan))
        return self._collect(shapes, where)

    def _launches(self, where: dict, env: dict, plan) -> tuple[list, tuple]:
        """(function, grid, block, Args) of each kernel with something to compute, in order, sized
        for the dims rounded up to powers of two (the kernels read the real ones from memory and
        leave where past them): every call of a bucket launches alike, so its graph stays as it is.
        With them, the functions in order: which graph they make."""
        bucket = nearest_bucket(self.search, env)
        rounded = {d: 1 << max(int(v) - 1, 0).bit_length() for d, v in env.items()} if self._round_dims else env
        # (the inputs' and outputs' buffers move when one is allocated, a state's at each call, an
        # append-only input's when it is passed as a prefix or not: the key says which buffers are which)
        moving = [self.kernels.inputs[n] for n in self._appended] + self._state_buffers
        key = (bucket, *(rounded[d] for d in self.kernels.dims), id(plan), self._arena, self._allocations,
               *map(where.__getitem__, moving))
        if key not in self._launch_cache:
            if len(self._launch_cache) >= 4 * MAX_GRAPHS:
                self._launch_cache.clear()
            out = []
            for call, functions in self._calls:
                which = call.pick(rounded, bucket)  # (the launch key holds the rounded dims: pick by them)
                sizes = launch(call.kernel, call.schedules[which], rounded)
                if sizes is not None:
                    out.append((functions[which], *sizes, Args([x for b in call.buffers for x in where[b]] + [self._dims_buffer])))
            graph = tuple(int(function) if hasattr(function, "__int__") else id(function) for function, *_ in out)
            self._launch_cache[key] = out, graph
        return self._launch_cache[key]

    def _replay(self, launches: list, key: tuple) -> None:
        """Launch the graph of these kernels (`key`: which functions, in order): built on first use,
        its changed nodes updated after."""
        if not launches:
            return
        replay = self._replays.get(key)
        if replay is None:
            if len(self._replays) >= MAX_GRAPHS:
                self._replays.pop(next(iter(self._replays))).destroy()
            replay = self._replays[key] = Replay(launches)
        else:
            self.graph_updates += replay.update(launches)
        self._last = replay
        check(driver().cuGraphLaunch(replay.exec, self.device.stream), "cuGraphLaunch")
        self.graph_launches += 1

    def replay(self, reps: int = 1) -> None:
        """Replay the last call's CUDA graph `reps` times and wait: the device's work of a call
        alone, without the copies and checks around it (what benchmarks against other GPU
        libraries time). The outputs' buffers hold the result; nothing is copied back."""
        if self._last is None:
            raise UnsupportedError("replay() needs a call first: it repeats the last call's graph")
        self.device.make_current()
        for _ in range(reps):
            check(driver().cuGraphLaunch(self._last.exec, self.device.stream), "cuGraphLaunch")
        self.graph_launches += reps
        self.device.synchronize("replaying the program's CUDA graph")
