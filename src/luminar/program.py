"""What every backend's compiled graph shares: checking the caller's arrays and binding dims.

A Program is called with arrays by input name and returns a dict of float32 arrays by output
name. Symbolic dimensions are bound from the inputs' shapes at each call (no recompiling);
every mistake is reported as a luminar error naming the input, the axis, and both values.
"""
from __future__ import annotations

import numpy as np

from . import dtypes
from .errors import DimensionError, InputError, ShapeError
from .graph import Graph, show_shape


class Program:
    backend = "abstract"

    def __init__(self, graph: Graph):
        self.graph = graph
        self.fixed: dict[str, np.ndarray] = {}  # inputs set once (weights), converted to storage
        self._dims = graph.dims()
        # inputs whose shapes mention a symbolic dim: only these bind dims at each call
        self._symbolic_inputs = {name: n for name, n in graph.inputs.items() if any(not d.is_const for d in n.shape)}

    def __call__(self, inputs: dict | None = None, /, **named) -> dict[str, np.ndarray]:
        return self.run({**(inputs or {}), **named})

    def set_inputs(self, inputs: dict | None = None, /, **named) -> "Program":
        """Inputs that stay the same across calls (weights): checked and converted once, then
        used by every call that does not pass them. Returns self."""
        for name, value in {**(inputs or {}), **named}.items():
            node = self.graph.inputs.get(name)
            if node is None:
                raise InputError(f"unknown input {name!r}; the graph's inputs are {sorted(self.graph.inputs)}")
            arr = dtypes.to_storage(value, node.dtype, f"input {name!r}")
            if arr.ndim != len(node.shape) or any(d.is_const and d.value != n for d, n in zip(node.shape, arr.shape)):
                raise ShapeError(f"input {name!r}: expected shape {show_shape(node.shape)}, got {arr.shape}")
            self.fixed[name] = arr
        return self

    def run(self, inputs: dict, dims: dict | None = None) -> dict[str, np.ndarray]:
        """Run with `inputs` (name -> array); `dims` binds symbolic dims no input shape determines."""
        arrays, env = self.bind(inputs, dims or {})
        results = self.execute(arrays, env)
        for name, output in self.graph.updates.items():  # state: the new value is the next input
            self.fixed[name] = results.pop(output)
        return results

    @property
    def state(self) -> dict[str, np.ndarray]:
        """The current values of the inputs the graph updates (see `Graph.update`), by name."""
        return {name: self.fixed[name] for name in self.graph.updates if name in self.fixed}

    def execute(self, arrays: dict[str, np.ndarray], env: dict[str, int]) -> dict[str, np.ndarray]:
        raise NotImplementedError

    def bind(self, inputs: dict, dims: dict) -> tuple[dict[str, np.ndarray], dict[str, int]]:
        """Validate the inputs against the declared ones; return storage arrays (the fixed inputs
        for those not passed) and the dim values. Only what the call passes is checked: a model
        has a thousand weights and a decode step a few milliseconds."""
        declared = self.graph.inputs
        unknown = sorted(name for name in inputs if name not in declared)
        if unknown:
            raise InputError(f"unknown input {unknown[0]!r}; the graph's inputs are {sorted(declared)}")
        # (counted first: the set difference over a model's ~400 weights took ~50 us a decode step)
        if len(self.fixed) + sum(name not in self.fixed for name in inputs) < len(declared):
            missing = sorted(declared.keys() - inputs.keys() - self.fixed.keys())
            raise InputError(f"missing input {missing[0]!r}; the graph's inputs are {sorted(declared)}")
        env = {}
        for name, value in dims.items():
            if not isinstance(value, (int, np.integer)) or value < 0:
                raise DimensionError(f"dimension {name!r} must be bound to an int >= 0, got {value!r}")
            env[name] = int(value)
        arrays, given = dict(self.fixed), {}
        for name, value in inputs.items():
            if value is self.fixed.get(name):  # checked by set_inputs already
                continue
            node = declared[name]
            arr = dtypes.to_storage(value, node.dtype, f"input {name!r}")
            if arr.ndim != len(node.shape):
                raise ShapeError(f"input {name!r}: expected rank {len(node.shape)} with shape {show_shape(node.shape)}, "
                                 f"got rank {arr.ndim} with shape {arr.shape}")
            arrays[name] = given[name] = arr
        self._bind_dims(arrays, {**self._symbolic_inputs, **{name: declared[name] for name in given}}, env)
        for name, value in env.items():
            if value < 1:
                raise DimensionError(f"symbolic dimension {name!r} is bound to {value}; symbolic sizes must be >= 1")
        unbound = sorted(self._dims - set(env))
        if unbound:
            raise DimensionError(f"symbolic dimension {unbound[0]!r} is not bound by any input's shape; "
                                 f"pass it with run(inputs, dims={{{unbound[0]!r}: ...}})")
        return arrays, env

    def _bind_dims(self, arrays, declared, env):
        """Bind the dims that some input's shape names bare (`s`), then check the shapes of the
        `declared` inputs (those with symbolic dims, and those passed) against them (`s + 1` is
        checked, not solved: a dim no input names bare is passed in `dims`)."""
        origin = {}
        for name, node in declared.items():
            for axis, (dim, actual) in enumerate(zip(node.shape, arrays[name].shape)):
                if not dim.is_const and dim.vars() == {str(dim)} and str(dim) not in env:
                    env[str(dim)], origin[str(dim)] = actual, (name, axis)
        for name, node in declared.items():
            for axis, (dim, actual) in enumerate(zip(node.shape, arrays[name].shape)):
                if dim.vars() - set(env):
                    continue  # reported as unbound by the caller
                expected = dim.evaluate(env)
                if expected == actual:
                    continue
                if dim.is_const:
                    raise ShapeError(f"input {name!r}: expected shape {show_shape(node.shape)}, "
                                     f"got {arrays[name].shape} (axis {axis}: expected {expected}, got {actual})")
                where = "".join(f"; {v}={env[v]} was bound by input {origin[v][0]!r} axis {origin[v][1]}"
                                for v in sorted(dim.vars()) if v in origin)
                raise DimensionError(f"input {name!r} axis {axis}: expected {dim} = {expected}, got {actual}"
                                     f" (shape {arrays[name].shape}){where}")
