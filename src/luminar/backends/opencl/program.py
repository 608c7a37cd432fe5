"""The OpenCL target's runtime: a compiled graph's device program, its arena and its calls.

compiler/pipeline.py does everything up to a built program; an OpenCLProgram keeps what a call
needs: the kernels' functions, memory plans per dim bucket (compiler/memory.py) placing every
temporary in one device arena, and device buffers for inputs and outputs. A call copies its
inputs to the device, enqueues every kernel in order on one in-order queue (symbolic dims are
kernel arguments: a new sequence length needs no rebuild), and copies the outputs back. A call
of a split reduction (split.py) also gets its own range of one zero-filled scratch buffer, kept
for the program's life.

Device-resident inputs: an input set with `set_inputs` (weights) is copied once and kept while
it is the same array. The new value of a `Graph.update` input stays on the device (its output
buffer becomes the input's) and is not copied to the host at all until it is read through
`state` (a training step moves only its loss and outputs). Such an array, changed in place on the
host, is not copied again: pass a new array instead.

Append-only inputs (`append_only(names)`: a KV cache): an input passed as a leading prefix of
the same host array as before (`cache[:length]`) keeps its device copy, and only the bytes past
what is already there are copied in; the rows copied before must not change on the host (a KV
cache only appends). A new array, or a view at another offset, is copied whole. So a decode step
copies the new token's keys, not the whole cache. `transfers` counts the bytes each way.
"""
from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np

from ...compiler import pipeline
from ...compiler.memory import MemoryPlan, sizing_dims
from ...compiler.search import nearest_bucket
from ...program import Program
from ...errors import InputError
from ..cpu.program import CPUProgram
from .device import DeviceError, device, opencl
from .render import launch
from .schedules import Split


@dataclass
class Transfers:
    """Bytes copied between host and device by calls so far (weights included)."""
    to_device: int = 0
    to_host: int = 0


@dataclass
class Mirror:
    """An append-only input's device copy: of `host` (the whole array the inputs are prefixes
    of), its first `synced` bytes are on the device in `buffer` (of `capacity` bytes)."""
    host: np.ndarray
    buffer: object
    capacity: int
    synced: int


def prefix_of(view: np.ndarray) -> np.ndarray | None:
    """The C-contiguous array `view` is a leading prefix of (its base, starting at the same byte), or None."""
    base = view.base
    if not isinstance(base, np.ndarray) or not (view.flags.c_contiguous and base.flags.c_contiguous):
        return None
    if view.__array_interface__["data"][0] != base.__array_interface__["data"][0] or view.nbytes > base.nbytes:
        return None
    return base


class DeviceState(Mapping):
    """`OpenCLProgram.state`: each updated input's value, copied from the device when first read."""

    def __init__(self, program: "OpenCLProgram"):
        self.program = program
        self.names = [name for name in program.graph.updates if name in program.fixed]

    def __getitem__(self, name: str) -> np.ndarray:
        if name not in self.names:
            raise KeyError(name)
        return self.program._synced(name)

    def __iter__(self):
        return iter(self.names)

    def __len__(self) -> int:
        return len(self.names)


class OpenCLProgram(Program):
    """A graph compiled to one OpenCL program; a call enqueues every kernel in order. `source` is
    the generated OpenCL C, `kernels` the kernel IR. Memory plans are kept per dims rounded up to
    powers of two, so their number stays small."""
    backend = "opencl"

    def __init__(self, graph, search=None, search_dims=None, seed=0, target=None):
        """Options: `search`, `search_dims`, `seed` (see compiler/pipeline.compile_graph); `target`
        an OpenCLTarget (default: the device's). Graph.compile refuses any other option."""
        super().__init__(graph)
        from .target import OPENCL
        self.device = device()  # (first: no device is a DeviceError before any compiling)
        self.compiled = pipeline.compile_graph(graph, target or OPENCL, search, search_dims, seed)
        self.kernels, self.search = self.compiled.kernels, self.compiled.search
        self.choices, self.fusions = self.compiled.choices, self.compiled.fusions
        built = self.compiled.built
        self.source = built.source
        self.compile_seconds = self.compiled.build_seconds
        cl = opencl()
        functions = {name: cl.Kernel(built.program, name) for call in built.calls for name in call.functions}
        self._calls = [(call, [functions[n] for n in call.functions]) for call in built.calls]
        self._scratch = self._split_scratch(built.calls)
        self._plans: dict[tuple, MemoryPlan] = {}
        self._sizing_dims = sizing_dims(self.kernels, self.compiled.lifetimes)
        self._arena, self._arena_bytes = None, 0
        self._inputs: dict[str, tuple] = {}  # input name -> (the resident host array or None, device buffer, bytes)
        self._outputs: dict[str, tuple] = {}  # output name -> (device buffer, bytes)
        self._appended: set[str] = set()  # append-only inputs (see the module doc)
        self._mirrors: dict[str, Mirror] = {}
        self._stale: dict[str, np.ndarray] = {}  # updated input -> its host array, not yet copied from the device
        self.transfers = Transfers()

    def _split_scratch(self, calls) -> list:
        """Per call, the scratch arguments of its split forms (split.py): each call's own range of
        one zero-filled buffer, kept for the program's life (the counters are zero between calls)."""
        offsets, words = [], 0
        for call in calls:
            offsets.append(words)
            words += call.scratch
        if not words:
            return [()] * len(calls)
        buffer = self.device.allocate(4 * words)
        opencl().enqueue_copy(self.device.queue, buffer, np.zeros(words, np.int32))
        return [(buffer, np.int64(offset)) if call.scratch else () for call, offset in zip(calls, offsets)]

    def append_only(self, *names: str) -> "OpenCLProgram":
        """Declare inputs that only grow at the end between calls (see the module doc). Returns self."""
        unknown = sorted(set(names) - set(self.graph.inputs))
        if unknown:
            raise InputError(f"append_only: unknown input {unknown[0]!r}; the graph's inputs are {sorted(self.graph.inputs)}")
        self._appended |= set(names)
        return self

    @property
    def state(self) -> Mapping:
        """The current values of the inputs the graph updates, by name; each copied from the
        device when read (and kept until the next call changes it)."""
        return DeviceState(self)

    def _synced(self, name: str) -> np.ndarray:
        """fixed[name], first copied from the device when a call left it there."""
        host = self.fixed[name]
        if self._stale.get(name) is host:
            self._copy_to_host(host, self._inputs[name][1])
            self._finish()
            del self._stale[name]
        return host

    # -- the device's copies: what another GPU runtime (the cuda program) replaces
    def _copy_to_device(self, buffer, host: np.ndarray, offset: int = 0) -> None:
        """Copy the contiguous `host` into `buffer` at byte `offset`, in queue order (the host
        array must stay alive and unchanged until the call finishes); counted in `transfers`."""
        if host.nbytes:
            opencl().enqueue_copy(self.device.queue, buffer, host, dst_offset=offset, is_blocking=False)
            self.transfers.to_device += host.nbytes

    def _copy_to_host(self, host: np.ndarray, buffer) -> None:
        """Copy `buffer` into `host`, in queue order (done at the next `_finish`); counted."""
        if host.nbytes:
            opencl().enqueue_copy(self.device.queue, host, buffer, is_blocking=False)
            self.transfers.to_host += host.nbytes

    def _finish(self) -> None:
        """Wait for everything queued."""
        self.device.queue.finish()

    def _upload(self, name: str, host: np.ndarray, held: tuple | None):
        """The device buffer holding input `name` = `host`, copying only what is not there yet."""
        base = prefix_of(host) if name in self._appended else None
        if base is not None:
            mirror = self._mirrors.get(name)
            if mirror is None or mirror.host is not base:  # (a new array: its buffer, or the old one if large enough)
                old = (mirror.buffer, mirror.capacity) if mirror is not None else None
                mirror = self._mirrors[name] = Mirror(base, *self._room(old, base.nbytes), synced=0)
            if host.nbytes > mirror.synced:
                self._copy_to_device(mirror.buffer, host.reshape(-1).view(np.uint8)[mirror.synced:], mirror.synced)
                mirror.synced = host.nbytes
            return mirror.buffer, None
        room = self._room(held, host.nbytes)
        self._copy_to_device(room[0], host)
        return room[0], room

    def explain(self) -> str:
        """Text: each kernel's schedule and where it came from; with search, the candidates."""
        return self.compiled.explain()

    # the arena layout for these dim values, kept per value of the dims that size temps (rounded up
    # to powers of two unless `exact`), as the cpu backend keeps them
    memory_plan = CPUProgram.memory_plan

    def _room(self, held: tuple | None, nbytes: int) -> tuple:
        """(device buffer, its bytes): `held`'s when it is large enough, else a new one."""
        return held if held is not None and held[1] >= nbytes else (self.device.allocate(nbytes), nbytes)

    def _place_inputs(self, arrays: dict, where: dict) -> None:
        """Each input's device buffer into `where` (buffer -> (device buffer, offset)): a weight or
        state stays while it is the same array; anything else goes through `_upload`."""
        for name, buf in self.kernels.inputs.items():
            given, held = arrays[name], self._inputs.get(name)
            resident = given is self.fixed.get(name)  # a weight or state: kept while it is the same array
            if resident and held is not None and held[0] is given:
                where[buf] = (held[1], 0)
                continue
            buffer, room = self._upload(name, np.ascontiguousarray(given), held[1:] if held is not None else None)
            if room is not None:
                self._inputs[name] = (given if resident else None, *room)
            where[buf] = (buffer, 0)

    def execute(self, arrays, env):
        cl, queue, kp = opencl(), self.device.queue, self.kernels
        plan = self.memory_plan(env)
        if self._arena is None or self._arena_bytes < plan.arena_bytes:
            self._arena, self._arena_bytes = self.device.allocate(plan.arena_bytes), plan.arena_bytes
        where = {b: (self._arena, offset // 4) for b, offset in plan.offsets.items()}
        self._place_inputs(arrays, where)
        shapes = {name: tuple(int(d.evaluate(env)) for d in kp.output_shapes[name]) for name in kp.outputs}
        for name, buf in kp.outputs.items():
            self._outputs[name] = self._room(self._outputs.get(name), 4 * math.prod(shapes[name]))
            where[buf] = (self._outputs[name][0], 0)
        dims = [np.int64(env[d]) for d in kp.dims]
        bucket = nearest_bucket(self.search, env)
        for (call, functions), scratch in zip(self._calls, self._scratch):
            which = call.pick(env, bucket)
            sizes = launch(call.kernel, call.schedules[which], env)
            if sizes is None:
                continue
            function = functions[which]
            function.set_args(*[x for b in call.buffers for x in (where[b][0], np.int64(where[b][1]))], *dims,
                              *(scratch if isinstance(call.schedules[which], Split) else ()))
            try:
                cl.enqueue_nd_range_kernel(queue, function, *sizes)
            except cl.Error as e:  # (out of resources: a work-group too large for this device's registers)
                raise DeviceError(f"{self.device.device.name!r} refused to run kernel {call.kernel.name} "
                                  f"({call.schedules[which].describe()}, global {sizes[0]}, local {sizes[1]}): {e}") from None
        return self._collect(shapes, where)

    def _collect(self, shapes: dict, where: dict) -> dict:
        """The call's outputs copied to the host (after its kernels, in queue order), but the new
        value of an updated float32 input: that one stays on the device (see `_keep_state`)."""
        results = {}
        resident = {output: name for name, output in self.graph.updates.items()
                    if self.graph.inputs[name].dtype == "float32" and output in self._outputs}
        for name, buf in self.kernels.outputs.items():
            results[name] = np.empty(shapes[name], np.float32)
            if name not in resident:  # (new state is copied when read: see `state`)
                self._copy_to_host(results[name], where[buf][0])
        self._finish()
        self._keep_state(results, resident)
        return results

    def _keep_state(self, results, resident: dict) -> None:
        """The new value of each updated float32 input stays on the device as that input's buffer
        (Program.run makes the returned array, not yet filled, the next call's input); the old
        buffer takes the next output."""
        for output, name in resident.items():
            out_buf, out_bytes = self._outputs[output]
            old = self._inputs.get(name)
            self._inputs[name] = (results[output], out_buf, out_bytes)
            self._stale[name] = results[output]
            if old is not None:
                self._outputs[output] = (old[1], old[2])
            else:
                del self._outputs[output]
