"""The high-level op library, composed only of primitives (through GraphTensor's methods).

Each module lists what it contributes:
- ``METHODS``: name -> function(tensor, ...), attached to GraphTensor (x.softmax(-1))
- ``FUNCTIONS``: name -> function, exported as luminar.NAME (lm.where, lm.cat)
- ``GRAPH_METHODS``: name -> function(graph, ...), attached to Graph (g.arange(5))
Every method is also exported as a function (lm.softmax(x, -1)), as in PyTorch.
"""
from importlib import import_module

MODULES = ("elementwise", "reduce", "linalg", "nn_ops", "indexing", "losses")


def attach(tensor_cls) -> dict:
    """Attach every module's methods to GraphTensor/Graph; return the top-level functions."""
    from ..graph import Graph
    functions, owner = {}, {}
    for name in MODULES:
        module = import_module(f"{__name__}.{name}")
        for method, fn in getattr(module, "METHODS", {}).items():
            if method in owner or method in vars(tensor_cls):  # one place per op: never shadow silently
                raise RuntimeError(f"library.{name} redefines {method!r} (from {owner.get(method, 'tensor.py')})")
            owner[method] = name
            setattr(tensor_cls, method, fn)
            if not method.startswith("__"):  # operators stay methods, not luminar.__pow__
                functions.setdefault(method, fn)
        for method, fn in getattr(module, "GRAPH_METHODS", {}).items():
            setattr(Graph, method, fn)
        functions.update(getattr(module, "FUNCTIONS", {}))
    return functions
