"""The ONNX backend node suite run on luminar (and on onnxruntime, for comparison).

The `onnx` package (1.22.0's wheel) ships each node test as model.onnx plus input/output
protobufs. A case *passes* when every output has the expected dtype, shape and values (the
suite's own tolerance: rtol 1e-3, atol 1e-7, NaNs equal). A case is *unsupported* when the
loader refuses it (an op, attribute or dtype luminar does not build: UnsupportedError), or its
inputs/outputs are not tensors (sequences, optionals); it *fails* otherwise (wrong values, or any
other error, which is a bug).

Inputs that an op needs at load time (a shape, axes, pads given as a graph input in the test)
are bound as constants (`load(..., constants=...)`) when the loader asks for them
(NeedsConstant): the graph inputs the needed tensor is computed from, or, when it lives inside a
function body, the integer inputs; the result records which, so the table can say so. A case whose outputs were
all folded at load time records that as well ("folded").
"""
from __future__ import annotations

import glob
import os
import time
from dataclasses import dataclass, field

import numpy as np

from ..errors import LuminarError, UnsupportedError
from .loader import load
from .registry import NeedsConstant

FLOAT = 1  # onnx.TensorProto.FLOAT


@dataclass
class Case:
    name: str
    directory: str
    rtol: float = 1e-3
    atol: float = 1e-7


@dataclass
class Result:
    name: str
    status: str  # "pass" | "fail" | "unsupported"
    reason: str = ""
    float_case: bool = False
    constants: list = field(default_factory=list)
    folded: bool = False
    seconds: float = 0.0


def cases(data_dir: str | None = None) -> list[Case]:
    """Every node case of the installed onnx package's backend test data."""
    from onnx.backend.test import loader
    kwargs = {} if data_dir is None else {"data_dir": data_dir}
    return [Case(c.name, c.model_dir, c.rtol, c.atol) for c in loader.load_model_tests(kind="node", **kwargs)]


def _read_protos(directory: str, prefix: str, graph_values):
    """The test data set's inputs or outputs by graph name; None if one is not a plain tensor."""
    import onnx
    from onnx import numpy_helper
    files = sorted(glob.glob(os.path.join(directory, "test_data_set_0", f"{prefix}_*.pb")),
                   key=lambda p: int(p.rsplit("_", 1)[1].split(".")[0]))
    out = {}
    for path, value in zip(files, graph_values):
        if not value.type.HasField("tensor_type"):
            return None
        proto = onnx.TensorProto()
        with open(path, "rb") as f:
            proto.ParseFromString(f.read())
        out[value.name] = numpy_helper.to_array(proto)
    return out


def read_case(case: Case):
    """(model proto, inputs, expected outputs), inputs/outputs None if they are not tensors."""
    import onnx
    model = onnx.load(os.path.join(case.directory, "model.onnx"))
    initialized = {i.name for i in model.graph.initializer}
    graph_inputs = [v for v in model.graph.input if v.name not in initialized]
    return model, _read_protos(case.directory, "input", graph_inputs), \
        _read_protos(case.directory, "output", list(model.graph.output))


def is_float_case(model) -> bool:
    values = list(model.graph.input) + list(model.graph.output)
    return all(v.type.HasField("tensor_type") and v.type.tensor_type.elem_type == FLOAT for v in values)


def compare(expected: dict, actual: dict, rtol: float, atol: float) -> str:
    """'' when every output matches, else the first mismatch in words."""
    for name, want in expected.items():
        got = actual.get(name)
        if got is None:
            return f"output {name!r} missing"
        got = np.asarray(got)
        if got.dtype != want.dtype:
            return f"output {name!r}: dtype {got.dtype}, expected {want.dtype}"
        if got.shape != want.shape:
            return f"output {name!r}: shape {got.shape}, expected {want.shape}"
        if want.dtype == object:
            if not np.array_equal(got, want):
                return f"output {name!r}: values differ"
            continue
        try:
            np.testing.assert_allclose(got, want, rtol=rtol, atol=atol, equal_nan=True)
        except AssertionError:
            g, w = got.astype(np.float64), want.astype(np.float64)
            with np.errstate(invalid="ignore"):
                diff = np.abs(g - w)
            err = float(np.max(np.where(np.isnan(diff), np.inf, diff))) if g.size else 0.0
            return f"output {name!r}: values differ (max abs error {err:.3g})"
    return ""


def run_luminar(case: Case, backend: str = "reference", model=None, inputs=None, expected=None) -> Result:
    start = time.perf_counter()
    if model is None:
        model, inputs, expected = read_case(case)
    result = Result(case.name, "fail", float_case=is_float_case(model))
    if inputs is None or expected is None:
        result.status, result.reason = "unsupported", "inputs or outputs are not tensors (sequence/optional)"
        return result
    constants = {}
    try:
        for _ in range(len(inputs) + 1):
            try:
                loaded = load(model, constants=constants)
                break
            except NeedsConstant as e:
                needed = [name for name in _source_inputs(model, e.tensor) if name in inputs and name not in constants]
                if not needed:  # a tensor inside a function body: bind the integer (shape-like) inputs
                    needed = [name for name, v in inputs.items() if v.dtype.kind in "iu" and name not in constants]
                if not needed:
                    raise
                constants.update({name: inputs[name] for name in needed})
        loaded.compile(backend)
        result.folded = not loaded.graph.outputs
        feeds = {k: v for k, v in inputs.items() if k not in constants}
        actual = loaded(feeds)
        mismatch = compare(expected, actual, case.rtol, case.atol)
        result.status, result.reason = ("pass", "") if not mismatch else ("fail", mismatch)
    except UnsupportedError as e:
        result.status, result.reason = "unsupported", _short(e)
    except LuminarError as e:
        result.status, result.reason = "fail", f"{type(e).__name__}: {_short(e)}"
    except Exception as e:  # noqa: BLE001  (anything else is a luminar bug; recorded, not hidden)
        result.status, result.reason = "fail", f"crash {type(e).__name__}: {_short(e)}"
    result.constants = sorted(constants)
    result.seconds = time.perf_counter() - start
    return result


def _source_inputs(model, tensor: str) -> list[str]:
    """The graph inputs whose values `tensor` is computed from (itself, if it is one); the input of a
    Shape or Size node does not count (its shape is known at load time), nor CastLike's second."""
    producer = {out: node for node in model.graph.node for out in node.output}
    seen, stack, found = set(), [tensor], []
    while stack:
        name = stack.pop()
        if name in seen:
            continue
        seen.add(name)
        if name in producer:
            node = producer[name]
            if node.op_type == "CastLike":  # only the dtype of its second input matters
                stack.append(node.input[0])
            elif node.op_type not in ("Shape", "Size"):
                stack.extend(i for i in node.input if i)
        else:
            found.append(name)
    return found


def run_onnxruntime(case: Case, model=None, inputs=None, expected=None) -> Result:
    """The same case on onnxruntime's CPU provider (its load failures count as unsupported)."""
    import onnxruntime as ort
    if model is None:
        model, inputs, expected = read_case(case)
    result = Result(case.name, "fail", float_case=is_float_case(model))
    if inputs is None or expected is None:
        result.status, result.reason = "unsupported", "inputs or outputs are not tensors"
        return result
    options = ort.SessionOptions()
    options.intra_op_num_threads, options.inter_op_num_threads = 1, 1
    options.log_severity_level = 4
    try:
        session = ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
    except Exception as e:  # noqa: BLE001
        result.status, result.reason = "unsupported", _short(e)
        return result
    try:
        names = [o.name for o in session.get_outputs()]
        actual = dict(zip(names, session.run(None, inputs)))
        mismatch = compare(expected, actual, case.rtol, case.atol)
        result.status, result.reason = ("pass", "") if not mismatch else ("fail", mismatch)
    except Exception as e:  # noqa: BLE001
        result.status, result.reason = "fail", _short(e)
    return result


def _short(e: Exception, limit: int = 160) -> str:
    text = " ".join(str(e).split())
    return text if len(text) <= limit else text[:limit - 3] + "..."
