"""ONNX control flow and the ops whose output shape depends on the data.

`If` with a condition known at load time is replaced by the branch it takes (exported models
often test a constant, such as a sample rate bound with `load(..., constants=...)`). With a
runtime condition both branches are built and the result is selected elementwise, which is
only possible when both give the same shapes; otherwise it is unsupported.

`Scan` and `Loop` are unrolled: the body graph is built once per iteration, which needs the
number of iterations at load time (a Scan's sequence length; a Loop's trip count, and a loop
condition that every iteration computes from known values).

A static graph cannot hold ops whose output shape depends on input values (NonZero, Unique,
NonMaxSuppression, a Loop whose trip count or condition is only known at run time...): they raise
UnsupportedError at load time, naming the node, its op and opset. (Compress is built when its
condition is known at load time.)
"""
from __future__ import annotations

import numpy as np

from .. import tensor as lt
from ..errors import ShapeError, UnsupportedError
from ..library.indexing import stack
from .registry import dtype_of, known_dims, op, shape_of


def _run_body(ctx, graph, bound: dict) -> list:
    """Build subgraph `graph` with its inputs bound to values; returns its outputs' values."""
    env = dict(ctx.builder.env_stack[-1])  # a subgraph sees every value of its enclosing scopes
    env.update(bound)
    ctx.builder.run_graph(graph, env)
    return [env[o.name] for o in graph.output]


def _branch(ctx, name):
    return _run_body(ctx, ctx.attr(name), {})


def _take(ctx, value, axis: int, index: int):
    """value[index] along axis (the axis removed)."""
    if isinstance(value, np.ndarray):
        return np.take(value, index, axis=axis)
    return ctx.traced(ctx.tensor(value).narrow(axis, index, 1).squeeze(axis), dtype_of(value))


def _stack(ctx, values, axis: int):
    if all(isinstance(v, np.ndarray) for v in values):
        return np.stack(values, axis=axis)
    return ctx.traced(stack([ctx.tensor(v) for v in values], axis), dtype_of(values[0]))


_MAX_UNROLL = 4096


@op("Scan")
def scan(ctx, *inputs):
    body = ctx.attr("body")
    m = ctx.attr("num_scan_inputs")
    if ctx.opset < 9:  # Scan-8: a leading sequence_lens input and a batch axis 0 on everything
        lens, inputs = inputs[0], inputs[1:]
        if lens is not None:
            raise UnsupportedError("Scan-8 with sequence_lens")
        batch = known_dims(ctx.tensor(inputs[0]).dims[:1], "Scan-8's batch")[0]
        per_batch = [_scan(ctx, body, [_take(ctx, v, 0, b) for v in inputs], m) for b in range(batch)]
        return tuple(_stack(ctx, [outs[k] for outs in per_batch], 0) for k in range(len(per_batch[0])))
    return tuple(_scan(ctx, body, list(inputs), m))


def _scan(ctx, body, inputs, m):
    n = len(inputs) - m
    states, sequences = inputs[:n], inputs[n:]
    in_axes = list(ctx.attr("scan_input_axes", [0] * m)) if ctx.opset >= 9 else [0] * m
    in_dirs = list(ctx.attr("scan_input_directions", ctx.attr("directions", [0] * m)))
    k = len(body.output) - n
    out_axes = list(ctx.attr("scan_output_axes", [0] * k))
    out_dirs = list(ctx.attr("scan_output_directions", [0] * k))
    ranks = [len(shape_of(v)) for v in sequences]
    in_axes = [a % r for a, r in zip(in_axes, ranks)]
    lengths = {known_dims([shape_of(v)[a]], "a Scan's sequence length")[0] for v, a in zip(sequences, in_axes)}
    if len(lengths) != 1:
        raise ShapeError(f"Scan inputs have different sequence lengths {sorted(lengths)}")
    steps = lengths.pop()
    if steps > _MAX_UNROLL:
        raise UnsupportedError(f"Scan over {steps} steps (luminar unrolls at most {_MAX_UNROLL})")
    names = [v.name for v in body.input]
    collected = [[] for _ in range(k)]
    for t in range(steps):
        slices = [_take(ctx, v, a, steps - 1 - t if d else t) for v, a, d in zip(sequences, in_axes, in_dirs)]
        outs = _run_body(ctx, body, dict(zip(names, states + slices)))
        states = outs[:n]
        for j in range(k):
            collected[j].append(outs[n + j])
    results = list(states)
    for j in range(k):
        items = collected[j][::-1] if out_dirs[j] else collected[j]
        rank = len(shape_of(items[0])) + 1
        results.append(_stack(ctx, items, out_axes[j] % rank))
    return results


@op("Loop")
def loop(ctx, trip_count=None, condition=None, *carried):
    body = ctx.attr("body")
    if trip_count is None:
        raise UnsupportedError("Loop without a trip count (it runs until a runtime condition fails)")
    count = int(np.asarray(ctx.const(trip_count, "the trip count", 0)).reshape(-1)[0])
    if count > _MAX_UNROLL:
        raise UnsupportedError(f"Loop of {count} iterations (luminar unrolls at most {_MAX_UNROLL})")
    keep_going = True if condition is None else bool(np.asarray(ctx.const(condition, "the loop condition", 1)).reshape(-1)[0])
    names = [v.name for v in body.input]
    n = len(carried)
    state = list(carried)
    collected = [[] for _ in range(len(body.output) - 1 - n)]
    for i in range(count):
        if not keep_going:
            break
        outs = _run_body(ctx, body, dict(zip(names, [np.array(i, np.int64), np.array(keep_going)] + state)))
        keep_going = bool(np.asarray(ctx.const(outs[0], "the loop condition", None)).reshape(-1)[0])
        state = outs[1:1 + n]
        for j, value in enumerate(outs[1 + n:]):
            collected[j].append(value)
    if any(not items for items in collected):
        raise UnsupportedError("Loop with scan outputs that ran zero iterations (their shape is unknown)")
    return tuple(state) + tuple(_stack(ctx, items, 0) for items in collected)


@op("If")
def if_(ctx, condition):
    if isinstance(condition, np.ndarray):
        return tuple(_branch(ctx, "then_branch" if bool(condition.reshape(-1)[0]) else "else_branch"))
    then, other = _branch(ctx, "then_branch"), _branch(ctx, "else_branch")
    cond = ctx.tensor(condition).reshape()
    out = []
    for k, (a, b) in enumerate(zip(then, other)):
        ta, tb = ctx.tensor(a), ctx.tensor(b)
        if tuple(ta.dims) != tuple(tb.dims):
            raise UnsupportedError(f"If with a runtime condition whose branches give different shapes for output "
                                   f"{k} ({ta.shape} vs {tb.shape})")
        out.append(ctx.traced(lt.where(cond, ta, tb), dtype_of(a)))
    return tuple(out)


def _data_dependent(name, why):
    def build(ctx, *inputs):
        raise UnsupportedError(f"{name}: {why}; a static graph cannot hold it")
    op(name)(build)


_data_dependent("NonZero", "the number of non-zero elements decides the output shape")
_data_dependent("Unique", "the number of distinct values decides the output shape")
_data_dependent("NonMaxSuppression", "the number of boxes kept decides the output shape")
_data_dependent("StringNormalizer", "string tensors are not supported")


