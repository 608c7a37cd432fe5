"""luminar: models as static graphs of twelve primitive ops, compiled by search.

    import luminar as lm
    g = lm.Graph()
    x = g.tensor("x", (2, "s", 64))
    y = x.softmax(-1).output("y")
    out = g.compile("reference")(x=np.zeros((2, 7, 64), np.float32))
"""
from . import dtypes
from .autograd import grad
from .dtypes import bfloat16, float16, float32, int8, int32, uint8
from .errors import (DimensionError, DTypeError, InputError, LuminarError, ShapeError, UnsupportedError,
                     ValueDomainError, WeightFileError)
from .graph import Graph
from .ops import PRIMITIVES
from .program import Program
from .symbolic import Expr, Var, sym
from .tensor import FUNCTIONS as _FUNCTIONS, GraphTensor

globals().update(_FUNCTIONS)
from . import nn, optim  # noqa: E402  (modules and optimizers build on the tensor library above)
from .serve import load_artifact  # noqa: E402  (an exported model file; the import is lazy, see serve/artifact.py)

__version__ = "0.1.0"
__all__ = ["grad", "nn", "optim", "Graph", "GraphTensor", "Program", "PRIMITIVES", "Expr", "Var", "sym", "dtypes",
           "float32", "float16", "bfloat16", "int8", "uint8", "int32", "load_artifact",
           "LuminarError", "ShapeError", "DimensionError", "DTypeError", "InputError", "ValueDomainError",
           "UnsupportedError", "WeightFileError", *_FUNCTIONS]
