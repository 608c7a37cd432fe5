"""The reference runtime: runs a primitive graph with numpy, one primitive at a time.

Slow and obviously correct; it is the oracle every compiled kernel is checked against. Views
are applied literally: the tracker's index and validity expressions are evaluated over the
index grid and used to gather from the flat buffer.
"""
import numpy as np

from .. import dtypes
from ..program import Program
from ..shape import ShapeTracker


def materialize(buffer: np.ndarray, tracker: ShapeTracker, env: dict) -> np.ndarray:
    """The view `tracker` of the flat `buffer`, as a new float32 array (padding reads as 0)."""
    shape = tuple(int(d.evaluate(env)) for d in tracker.shape)
    if 0 in shape:
        return np.zeros(shape, np.float32)
    grid = {f"_d{k}": g for k, g in enumerate(np.indices(shape, sparse=True))}
    index = np.broadcast_to(tracker.index_expr().evaluate({**env, **grid}), shape)
    valid = np.broadcast_to(tracker.valid.evaluate({**env, **grid}), shape).astype(bool)
    flat = buffer.reshape(-1) if buffer.size else np.zeros(1, np.float32)
    return np.where(valid, flat[np.where(valid, index, 0)], np.float32(0)).astype(np.float32, copy=False)


def evaluate_constant(node, env: dict) -> np.ndarray:
    shape = tuple(int(d.evaluate(env)) for d in node.shape)
    if not isinstance(node.value, float):  # an integer expression over the index variables
        grid = {f"_d{k}": g for k, g in enumerate(np.indices(shape, sparse=True))}
        return np.broadcast_to(np.asarray(node.value.evaluate({**env, **grid}), np.float32), shape).copy()
    return np.full(shape, node.value, np.float32)


class ReferenceProgram(Program):
    backend = "reference"

    def execute(self, arrays, env):
        values = {}
        for node in self.graph.nodes:
            if node.op == "input":
                values[node.id] = dtypes.to_compute(arrays[node.name], node.dtype)
            elif node.op == "constant":
                values[node.id] = evaluate_constant(node, env)
            else:
                srcs = [materialize(values[src.id], st, env) for src, st in node.srcs]
                if node.op == "contiguous":
                    values[node.id] = srcs[0]
                elif node.primitive.kind == "reduce":
                    values[node.id] = node.primitive.reference(srcs[0], axis=node.axis)
                else:
                    values[node.id] = node.primitive.reference(*srcs)
        return {name: materialize(values[node.id], st, env) for name, (node, st) in self.graph.outputs.items()}
