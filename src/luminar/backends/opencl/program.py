"""The OpenCL target's runtime: a compiled graph's device program, its arena and its calls.

compiler/pipeline.py does everything up to a built program; an OpenCLProgram keeps what a call
needs: the kernels' functions, memory plans per dim bucket (compiler/memory.py) placing every
temporary in one device arena, and device buffers for inputs and outputs. A call copies its
inputs to the device, enqueues every kernel in order on one in-order queue (symbolic dims are
kernel arguments: a new sequence length needs no rebuild), and copies the outputs back.

Device-resident inputs: an input set with `set_inputs` (weights) is copied once and kept while
it is the same array; the new value of a `Graph.update` input stays on the device (its output
buffer becomes the input's), so a training step or a cache update does not copy it back in.
Such an array, changed in place on the host, is not copied again: pass a new array instead.
"""
from __future__ import annotations

import math

import numpy as np

from ...compiler import pipeline
from ...compiler.memory import MemoryPlan, plan_memory
from ...compiler.search import nearest_bucket
from ...program import Program
from .device import DeviceError, device, opencl
from .render import launch


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
        self._plans: dict[tuple, MemoryPlan] = {}
        self._arena, self._arena_bytes = None, 0
        self._inputs: dict[str, tuple] = {}  # input name -> (the resident host array or None, device buffer, bytes)
        self._outputs: dict[str, tuple] = {}  # output name -> (device buffer, bytes)

    def explain(self) -> str:
        """Text: each kernel's schedule and where it came from; with search, the candidates."""
        return self.compiled.explain()

    def memory_plan(self, env: dict[str, int], exact: bool = False) -> MemoryPlan:
        """The arena layout for these dim values (rounded up to powers of two unless `exact`)."""
        bucket = dict(env) if exact else {d: 1 << max(int(v) - 1, 0).bit_length() for d, v in env.items()}
        key = (exact, *(bucket.get(d, 0) for d in self.kernels.dims))
        if key not in self._plans:
            self._plans[key] = plan_memory(self.kernels, bucket, life=self.compiled.lifetimes)
        return self._plans[key]

    def _room(self, held: tuple | None, nbytes: int) -> tuple:
        """(device buffer, its bytes): `held`'s when it is large enough, else a new one."""
        return held if held is not None and held[1] >= nbytes else (self.device.allocate(nbytes), nbytes)

    def execute(self, arrays, env):
        cl, queue, kp = opencl(), self.device.queue, self.kernels
        plan = self.memory_plan(env)
        if self._arena is None or self._arena_bytes < plan.arena_bytes:
            self._arena, self._arena_bytes = self.device.allocate(plan.arena_bytes), plan.arena_bytes
        where = {b: (self._arena, offset // 4) for b, offset in plan.offsets.items()}
        for name, buf in kp.inputs.items():
            given, held = arrays[name], self._inputs.get(name)
            resident = given is self.fixed.get(name)  # a weight or state: kept while it is the same array
            if resident and held is not None and held[0] is given:
                where[buf] = (held[1], 0)
                continue
            host = np.ascontiguousarray(given)
            room = self._room(held[1:] if held is not None else None, host.nbytes)
            if host.nbytes:
                cl.enqueue_copy(queue, room[0], host, is_blocking=False)
            self._inputs[name] = (given if resident else None, *room)
            where[buf] = (room[0], 0)
        shapes = {name: tuple(int(d.evaluate(env)) for d in kp.output_shapes[name]) for name in kp.outputs}
        for name, buf in kp.outputs.items():
            self._outputs[name] = self._room(self._outputs.get(name), 4 * math.prod(shapes[name]))
            where[buf] = (self._outputs[name][0], 0)
        dims = [np.int64(env[d]) for d in kp.dims]
        bucket = nearest_bucket(self.search, env)
        for call, functions in self._calls:
            which = bucket if len(functions) > 1 else 0
            sizes = launch(call.kernel, call.schedules[which], env)
            if sizes is None:
                continue
            function = functions[which]
            function.set_args(*[x for b in call.buffers for x in (where[b][0], np.int64(where[b][1]))], *dims)
            try:
                cl.enqueue_nd_range_kernel(queue, function, *sizes)
            except cl.Error as e:  # (out of resources: a work-group too large for this device's registers)
                raise DeviceError(f"{self.device.device.name!r} refused to run kernel {call.kernel.name} "
                                  f"({call.schedules[which].describe()}, global {sizes[0]}, local {sizes[1]}): {e}") from None
        results = {}
        for name, buf in kp.outputs.items():
            results[name] = np.empty(shapes[name], np.float32)
            if results[name].nbytes:
                cl.enqueue_copy(queue, results[name], where[buf][0], is_blocking=False)
        queue.finish()
        self._keep_state(results)
        return results

    def _keep_state(self, results) -> None:
        """The new value of each updated float32 input stays on the device as that input's buffer
        (Program.run makes the returned array the next call's input); the old buffer takes the
        next output."""
        for name, output in self.graph.updates.items():
            if self.graph.inputs[name].dtype != "float32" or output not in self._outputs:
                continue
            out_buf, out_bytes = self._outputs[output]
            old = self._inputs.get(name)
            self._inputs[name] = (results[output], out_buf, out_bytes)
            if old is not None:
                self._outputs[output] = (old[1], old[2])
            else:
                del self._outputs[output]
