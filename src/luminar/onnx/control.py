"""ONNX control flow and the ops whose output shape depends on the data.

`If` with a condition known at load time is replaced by the branch it takes (exported models
often test a constant, such as a sample rate bound with `load(..., constants=...)`). With a
runtime condition both branches are built and the result is selected elementwise, which is
only possible when both give the same shapes; otherwise it is unsupported.

A static graph cannot hold ops whose output shape depends on input values (NonZero, Unique, a
Loop whose trip count or carried shapes are only known at run time...): they raise
UnsupportedError at load time, naming the node, its op and opset.
"""
from __future__ import annotations

import numpy as np

from .. import tensor as lt
from ..errors import UnsupportedError
from .registry import dtype_of, op


def _branch(ctx, name):
    graph = ctx.attr(name)
    env = dict(ctx.builder.env_stack[-1])  # a subgraph sees every value of its enclosing scopes
    ctx.builder.run_graph(graph, env)
    return [env[o.name] for o in graph.output]


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
_data_dependent("Compress", "the condition's values decide the output shape")
_data_dependent("Loop", "a loop's trip count and carried shapes are decided at run time")
_data_dependent("Scan", "scan bodies are not supported")
_data_dependent("NonMaxSuppression", "the number of boxes kept decides the output shape")
_data_dependent("StringNormalizer", "string tensors are not supported")


