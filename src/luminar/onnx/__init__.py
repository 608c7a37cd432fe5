"""ONNX import: any ONNX model as a luminar graph.

    import luminar.onnx
    model = luminar.onnx.load("model.onnx")          # or bytes, or an onnx.ModelProto
    print(model.inputs, model.outputs)               # names, dtypes, shapes (dim_params as names)
    model.compile("cpu")                              # or "reference"; Graph.compile's options
    outputs = model({"input": array})                # a dict by ONNX output name

Needs the `onnx` package (parsing, and numpy evaluation of folded nodes at load time).
"""
from .loader import OnnxModel, TensorInfo, load
from .registry import OPS, NeedsConstant
from . import control, ops_math, ops_nn, ops_rnn, ops_tensor  # noqa: F401,E402  (they register the ops)


def supported_ops() -> list[str]:
    """The ONNX op types (default domain) luminar builds."""
    return sorted(name for domain, name in OPS if domain == "")


__all__ = ["load", "OnnxModel", "TensorInfo", "NeedsConstant", "supported_ops"]
