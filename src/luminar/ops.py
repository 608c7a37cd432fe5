"""The primitive registry: the twelve compute ops every luminar model is built from.

Each primitive is defined exactly once, here: its name, its arity/kind, its numpy reference
implementation (the semantics), its gradient rule and how the C backend spells it. Everything else (the graph,
the interpreters, the compilers) looks a primitive up in `PRIMITIVES` instead of switching on
names. Data nodes (Input, Constant, Contiguous) are not computations and live in graph.py.

All primitives compute in float32. `mod` is C's fmod (the result has the dividend's sign);
`less_than` yields 1.0 or 0.0. Reductions run over one axis and remove it.

Gradient rules (used by autograd.py) receive GraphTensors: the inputs as the op reads them, the
output and the upstream gradient `g` (reductions also get `axis`), and return one gradient per
input, shaped like that input, or None where no gradient flows. They are compositions of
GraphTensor methods, so the backward graph is made of the same primitives. `less_than` has no
gradient (it is piecewise constant). `mod` follows torch.fmod rather than passing none: d/da = 1
and d/db = -trunc(a / b); with it, compositions such as trunc (x - fmod(x, 1)), floor, round and
remainder get torch's gradients (0 for the rounding ops) instead of wrong ones.
"""
import math
from dataclasses import dataclass
from typing import Callable

import numpy as np


@dataclass(frozen=True)
class Primitive:
    name: str
    kind: str  # "unary" | "binary" | "reduce"
    reference: Callable  # numpy implementation: (*float32 arrays[, axis]) -> float32 array
    c: str  # C spelling; {0}, {1} are the operands (for reductions: the combine of acc {0} and value {1})
    identity: float | None = None  # reductions: the accumulator's starting value
    grad: Callable | None = None  # (*inputs, out, g[, axis]) -> [gradient or None per input]

    @property
    def arity(self) -> int:
        return 2 if self.kind == "binary" else 1

    def __repr__(self):
        return f"Primitive({self.name})"


def _f32(fn):
    """Run a numpy function with IEEE semantics (no warnings) and a float32 result."""
    def run(*args, **kw):
        with np.errstate(all="ignore"):
            return np.asarray(fn(*args, **kw), dtype=np.float32)
    return run


LN2 = math.log(2.0)


def _mod_grad(a, b, out, g):
    quotient = a / b
    return [g, -g * (quotient - quotient.fmod(1.0))]  # torch.fmod: 1 and -trunc(a / b)


def _max_grad(x, out, g, axis):
    """torch.amax's rule: the gradient goes to every position equal to the max, split evenly."""
    hit = x.eq(out.unsqueeze(axis))
    return [hit * (g / hit.sum(axis)).unsqueeze(axis)]


EXP2 = Primitive("exp2", "unary", _f32(np.exp2), "exp2f({0})",
                 grad=lambda x, out, g: [g * out * LN2])
LOG2 = Primitive("log2", "unary", _f32(np.log2), "log2f({0})",
                 grad=lambda x, out, g: [g / (x * LN2)])
SIN = Primitive("sin", "unary", _f32(np.sin), "sinf({0})",
                grad=lambda x, out, g: [g * x.cos()])
SQRT = Primitive("sqrt", "unary", _f32(np.sqrt), "sqrtf({0})",
                 grad=lambda x, out, g: [g / (out * 2.0)])
RECIP = Primitive("recip", "unary", _f32(np.reciprocal), "(1.0f / ({0}))",
                  grad=lambda x, out, g: [-(g * out * out)])
ADD = Primitive("add", "binary", _f32(np.add), "({0} + {1})", grad=lambda a, b, out, g: [g, g])
MUL = Primitive("mul", "binary", _f32(np.multiply), "({0} * {1})",
                grad=lambda a, b, out, g: [g * b, g * a])
MOD = Primitive("mod", "binary", _f32(np.fmod), "fmodf({0}, {1})", grad=_mod_grad)
LESS_THAN = Primitive("less_than", "binary", _f32(np.less), "(float)({0} < {1})",
                      grad=lambda a, b, out, g: [None, None])
SUM_REDUCE = Primitive("sum_reduce", "reduce", _f32(lambda x, axis: np.sum(x, axis=axis, dtype=np.float32)),
                       "({0} + {1})", identity=0.0,
                       grad=lambda x, out, g, axis: [g.unsqueeze(axis).broadcast_to(x.dims)])
MAX_REDUCE = Primitive("max_reduce", "reduce", _f32(lambda x, axis: np.max(x, axis=axis, initial=-np.inf)),
                       # not fmaxf: it drops NaN, and it blocks vectorization without -ffinite-math-only;
                       # NaN is tested with non-short-circuit `|` (a NaN operand gives {0} + {1} = NaN),
                       # which gcc turns into vector compares and blends, ~3x faster than `||`
                       "((({0} != {0}) | ({1} != {1})) ? ({0} + {1}) : ({0} > {1} ? {0} : {1}))", identity=float("-inf"), grad=_max_grad)

PRIMITIVES: dict[str, Primitive] = {p.name: p for p in (
    EXP2, LOG2, SIN, SQRT, RECIP, ADD, MUL, MOD, LESS_THAN, SUM_REDUCE, MAX_REDUCE)}
