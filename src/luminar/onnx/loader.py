"""`luminar.onnx.load`: an ONNX model as a luminar Graph, and the model object that runs it.

The loader walks the ONNX graph once, in order. Initializers and Constant nodes are numpy
arrays; a node whose inputs are all known is folded at load time (folding.py), so shape
computations disappear; every other node is built from luminar GraphTensor ops by its entry in
the op registry (ops_*.py). Known arrays a built op reads become weights: graph inputs whose
values the compiled program holds (`Program.set_inputs`), or scalar constants. Graph inputs with
`dim_param`s get symbolic dims, bound at each call from the arrays' shapes.

luminar computes in float32; the model object converts at its edges: integer inputs are stored
as int32 (int64 values must fit), float64 as float32, and each output is returned with the
dtype the ONNX graph declares (integers rounded, booleans as value != 0).

Everything that cannot be built (an unknown op or domain, an output whose shape depends on the
data, a shape that must be known but is computed at run time) fails here, at load time, with an
error naming the model, the node, its op and opset.
"""
from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..errors import DTypeError, InputError, LuminarError, ShapeError, UnsupportedError, WeightFileError
from ..graph import Graph
from .folding import constant_node_value, fold
from .registry import NARROW_INTS, OPS, NeedsConstant, NodeContext, Traced, dtype_of, integer_kind

# How each ONNX element type is stored in a luminar input (computing is always float32)
_STORAGE = {"float32": "float32", "float16": "float16", "bfloat16": "bfloat16", "float64": "float32",
            "int8": "int8", "uint8": "uint8", "int32": "int32", "int16": "int32", "uint16": "int32",
            "int64": "int32", "uint32": "int32", "uint64": "int32", "bool": "uint8",
            # sub-byte and 8-bit float formats (ml_dtypes) are widened on the way in, rounded on the way out
            "int4": "int8", "uint4": "uint8", "int2": "int8", "uint2": "uint8",
            **{name: "float32" for name in ("float8_e4m3fn", "float8_e4m3fnuz", "float8_e5m2", "float8_e5m2fnuz",
                                            "float8_e8m0fnu", "float4_e2m1fn")}}
_INT32 = np.iinfo(np.int32)


@dataclass(frozen=True)
class TensorInfo:
    """An ONNX graph input or output: its name, element dtype and shape (ints, or dim names)."""
    name: str
    dtype: np.dtype
    shape: tuple | None

    def __str__(self):
        shape = "?" if self.shape is None else "[" + ", ".join(str(d) for d in self.shape) + "]"
        return f"{self.name}: {self.dtype} {shape}"


def _np_dtype(elem_type: int) -> np.dtype:
    from onnx import helper
    return np.dtype(helper.tensor_dtype_to_np_dtype(elem_type))


def _identifier(name: str, taken: set) -> str:
    """A luminar name (an identifier not starting with '_') for an ONNX name, unique in `taken`."""
    base = re.sub(r"\W", "_", name) or "t"
    if not base[0].isalpha():
        base = "t" + base
    out, k = base, 1
    while out in taken:
        out, k = f"{base}_{k}", k + 1
    taken.add(out)
    return out


def _read_model(source):
    """A ModelProto from a path, bytes or a ModelProto; WeightFileError for anything unreadable."""
    import onnx
    if isinstance(source, onnx.ModelProto):
        return source, "model"
    if isinstance(source, (bytes, bytearray)):
        try:
            return onnx.load_from_string(bytes(source)), "model"
        except Exception as e:  # noqa: BLE001  (protobuf raises its own DecodeError)
            raise WeightFileError(f"ONNX model bytes are malformed or truncated: {e}") from None
    path = Path(os.fspath(source))
    if not path.is_file():
        raise WeightFileError(f"ONNX model {str(path)!r} does not exist")
    try:
        model = onnx.load(str(path), load_external_data=False)
    except Exception as e:  # noqa: BLE001
        raise WeightFileError(f"ONNX model {str(path)!r} is malformed or truncated: {type(e).__name__}: {e}") from None
    _load_external_data(model, path)
    return model, path.name


def _load_external_data(model, path: Path):
    """Read the initializers stored in side files, naming the missing or short file on failure."""
    from onnx.external_data_helper import _get_all_tensors, load_external_data_for_tensor, uses_external_data
    for tensor in _get_all_tensors(model):
        if not uses_external_data(tensor):
            continue
        info = {e.key: e.value for e in tensor.external_data}
        location = path.parent / info.get("location", "")
        if not location.is_file():
            raise WeightFileError(f"ONNX model {path.name!r}: tensor {tensor.name!r} is stored in external file "
                                  f"{str(location)!r}, which does not exist")
        need = int(info.get("offset", 0)) + int(info.get("length", 0))
        if location.stat().st_size < need:
            raise WeightFileError(f"ONNX model {path.name!r}: external file {str(location)!r} is truncated "
                                  f"(tensor {tensor.name!r} needs {need} bytes, the file has {location.stat().st_size})")
        try:
            load_external_data_for_tensor(tensor, str(path.parent))
        except Exception as e:  # noqa: BLE001
            raise WeightFileError(f"ONNX model {path.name!r}: cannot read tensor {tensor.name!r} from "
                                  f"{str(location)!r}: {e}") from None
        del tensor.external_data[:]
        tensor.data_location = 0  # DEFAULT: the data now lives in the proto


class Builder:
    """Builds one luminar Graph from an ONNX model: the environment of values, weights, naming."""

    def __init__(self, model, model_name: str, constants: dict, dims: dict):
        self.model, self.model_name = model, model_name
        self.graph = Graph()
        self.opsets = {("" if o.domain == "ai.onnx" else o.domain): o.version for o in model.opset_import}
        self.opsets.setdefault("", 1)
        self.constants, self.fixed_dims = constants, dims
        self.weights: dict[str, np.ndarray] = {}
        self._weight_of: dict[int, tuple] = {}  # id(array) -> (array, tensor): one weight per array
        self._names: set[str] = set()
        self.input_names: dict[str, str] = {}  # ONNX input name -> luminar input name
        self.env_stack: list[dict] = []

    # -- naming and description -------------------------------------------------------------------
    def describe(self, node, opset, index=None) -> str:
        label = node.name or f"#{index if index is not None else '?'}"
        domain = f"{node.domain}::" if node.domain not in ("", "ai.onnx") else ""
        return f"{self.model_name}: node {label!r} ({domain}{node.op_type}, opset {opset})"

    def attributes(self, node) -> dict:
        from onnx import helper, numpy_helper
        out = {}
        for a in node.attribute:
            v = helper.get_attribute_value(a)
            if isinstance(v, bytes):
                v = v.decode("utf-8", "replace")
            elif a.type == a.TENSOR:
                v = numpy_helper.to_array(a.t)
            elif isinstance(v, list) and v and isinstance(v[0], bytes):
                v = [s.decode("utf-8", "replace") for s in v]
            out[a.name] = v
        return out

    # -- constants as graph tensors ---------------------------------------------------------------
    def constant_tensor(self, array: np.ndarray):
        """A known array as a GraphTensor: a scalar constant if it has one finite value, else a weight."""
        array = np.asarray(array)
        if array.dtype == object:
            return self._symbolic_vector(array)
        if array.dtype.name in NARROW_INTS or (array.dtype.name.startswith("float") and array.dtype.kind != "f"):
            array = array.astype(np.float32)  # sub-byte ints and float8 formats: widened, exactly
        if array.dtype.kind not in "biuf" and array.dtype.name != "bfloat16":
            raise UnsupportedError(f"tensors of dtype {array.dtype} are not supported")
        if array.size == 1:
            value = float(array.reshape(-1)[0].astype(np.float64))
            if np.isfinite(value):
                return self.graph.constant(value, array.shape)
        cached = self._weight_of.get(id(array))
        if cached is not None and cached[0] is array:
            return cached[1]
        stored = self._storage(array)
        name = _identifier(f"w{len(self.weights)}", self._names)
        tensor = self.graph.tensor(name, stored.shape, dtype=stored.dtype.name if stored.dtype.name != "uint16"
                                   else "bfloat16")
        self.weights[name] = stored
        self._weight_of[id(array)] = (array, tensor)
        return tensor

    @staticmethod
    def _storage(array: np.ndarray) -> np.ndarray:
        if array.dtype.name == "bfloat16":
            return np.ascontiguousarray(array).view(np.uint16)
        if array.dtype in (np.float32, np.float16, np.int8, np.uint8, np.int32):
            return np.ascontiguousarray(array)
        if array.dtype.kind == "b":
            return array.astype(np.uint8)
        if array.dtype.kind in "iu" and (array.size == 0 or (array.min() >= _INT32.min and array.max() <= _INT32.max)):
            return array.astype(np.int32)
        return array.astype(np.float32)

    def _symbolic_vector(self, array: np.ndarray):
        """A small array of symbolic sizes as an integer-expression constant over the element index."""
        from ..shape import index_var
        from ..symbolic import sym
        flat = [sym(v) for v in array.reshape(-1)]
        i = index_var(0, len(flat))
        expr = sym(0)
        for k, v in enumerate(flat):
            expr = expr + (i.ge(k) & i.lt(k + 1)) * v
        return self.graph.constant(expr, (len(flat),)).reshape(*array.shape)

    # -- building ---------------------------------------------------------------------------------
    def build(self):
        g = self.model.graph
        from onnx import numpy_helper
        env = {}
        for init in g.initializer:
            env[init.name] = numpy_helper.to_array(init)
        for init in g.sparse_initializer:
            raise UnsupportedError(f"{self.model_name}: sparse initializer {init.values.name!r} is not supported")
        inputs = []
        for vi in g.input:
            if vi.name in env and vi.name not in self.constants:
                continue  # an initializer listed as an input (older exporters): a weight
            info = self._info(vi)
            if vi.name in self.constants:
                env[vi.name] = np.asarray(self.constants[vi.name], dtype=info.dtype)
                continue
            env[vi.name] = self._graph_input(vi, info)
            inputs.append(info)
        unknown = sorted(set(self.constants) - {vi.name for vi in g.input})
        if unknown:
            raise InputError(f"{self.model_name}: constants given for {unknown[0]!r}, which is not an input of the "
                             f"model (inputs: {[vi.name for vi in g.input]})")
        self.run_graph(g, env)
        outputs = [self._info(vi) for vi in g.output]
        return inputs, outputs, env

    def _info(self, vi) -> TensorInfo:
        t = vi.type
        if not t.HasField("tensor_type"):
            raise UnsupportedError(f"{self.model_name}: tensor {vi.name!r} is a {t.WhichOneof('value')}, "
                                   f"only tensors are supported")
        try:
            dtype = _np_dtype(t.tensor_type.elem_type)
        except (KeyError, TypeError, ValueError):
            raise UnsupportedError(f"{self.model_name}: tensor {vi.name!r} has unsupported element type "
                                   f"{t.tensor_type.elem_type}") from None
        if not t.tensor_type.HasField("shape"):
            return TensorInfo(vi.name, dtype, None)
        # a negative dim_value or a "?" dim_param (some exporters) means: unknown, unnamed
        shape = tuple((d.dim_value if d.dim_value >= 0 else None) if d.HasField("dim_value")
                      else (d.dim_param if d.dim_param not in ("", "?") else None)
                      for d in t.tensor_type.shape.dim)
        return TensorInfo(vi.name, dtype, shape)

    def _graph_input(self, vi, info: TensorInfo) -> Traced:
        storage = _STORAGE.get(info.dtype.name)
        if storage is None:
            raise UnsupportedError(f"{self.model_name}: input {vi.name!r} has dtype {info.dtype}, which luminar "
                                   f"cannot store (supported: {', '.join(_STORAGE)})")
        if info.shape is None:
            raise UnsupportedError(f"{self.model_name}: input {vi.name!r} has no declared shape; a static graph needs "
                                   f"its rank (bind it with load(..., constants=...) or fix the model)")
        name = _identifier(vi.name, self._names)
        dims = []
        for axis, d in enumerate(info.shape):
            if isinstance(d, int):
                dims.append(d)
            else:
                key = d if d is not None else f"{vi.name}_dim{axis}"
                dims.append(self.fixed_dims.get(key, _identifier(key, set()).lstrip("_") or "d"))
        self.input_names[vi.name] = name
        tensor = self.graph.tensor(name, tuple(dims), dtype=storage)
        return Traced(tensor, info.dtype)

    def run_graph(self, graph_proto, env: dict) -> None:
        """Build every node of `graph_proto` into `env` (name -> value), in order."""
        self.env_stack.append(env)
        try:
            for index, node in enumerate(graph_proto.node):
                self.run_node(node, env, index)
        finally:
            self.env_stack.pop()

    def run_node(self, node, env: dict, index: int) -> None:
        domain = "" if node.domain == "ai.onnx" else node.domain
        opset = self.opsets.get(domain)
        if opset is None:
            raise UnsupportedError(f"{self.describe(node, '?', index)}: domain {domain!r} is not imported by the model "
                                   f"(imports: {sorted(self.opsets)})")
        where = self.describe(node, opset, index)
        self.current = where
        inputs = []
        for name in node.input:
            if not name:
                inputs.append(None)
            elif name not in env:
                raise ShapeError(f"{where}: input tensor {name!r} is produced by no earlier node, initializer "
                                 f"or graph input")
            else:
                inputs.append(env[name])
        try:
            outputs = self._evaluate(node, domain, opset, inputs)
        except NeedsConstant as e:
            raise NeedsConstant(f"{where}: {e}", e.tensor) from None
        except LuminarError as e:
            raise type(e)(f"{where}: {e}") from e
        named = [n for n in node.output]
        if len(outputs) < len([n for n in named if n]):
            missing = [n for n, _ in zip(named[len(outputs):], range(99)) if n]
            if missing:
                raise UnsupportedError(f"{where}: output {missing[0]!r} (output {named.index(missing[0])}) is not "
                                       f"supported by luminar's {node.op_type}")
        for name, value in zip(named, outputs):
            if name:
                env[name] = value

    def _evaluate(self, node, domain, opset, inputs) -> list:
        if node.op_type == "Constant" and domain == "":
            return [constant_node_value(node, self.attributes(node))]
        if all(v is None or isinstance(v, np.ndarray) for v in inputs):
            folded = fold(node, inputs, self.attributes(node), self.opsets)
            if folded is not None:
                return folded
        fn = OPS.get((domain, node.op_type))
        if fn is None:
            function = self._function(node, domain, opset, inputs)
            if function is None:
                raise UnsupportedError(f"op {node.op_type!r} of domain {domain or 'ai.onnx'!r} is not supported by "
                                       f"luminar")
            return self._inline(node, function, inputs)
        out = fn(NodeContext(self, node, opset), *inputs)
        return list(out) if isinstance(out, (tuple, list)) else [out]

    # -- functions: ops defined as a graph of other ops ---------------------------------------------
    def _function(self, node, domain, opset, inputs):
        """The FunctionProto defining `node`: a model-local function, or the op's function body in the
        ONNX schema (context-dependent ones are specialized to the input types); None if neither."""
        from onnx import FunctionProto, defs, helper
        self._schema_defaults = {}
        for f in self.model.functions:
            if f.name == node.op_type and (f.domain or "") == domain:
                return f
        try:
            schema = defs.get_schema(node.op_type, opset, domain)
        except Exception:  # noqa: BLE001  (no such op in the schema registry)
            return None
        proto = FunctionProto()
        self._schema_defaults = {name: a.default_value for name, a in schema.attributes.items()
                                 if a.default_value.type != 0}  # (0: UNDEFINED, no default)
        if schema.has_function:
            proto.ParseFromString(schema.get_function_with_opset_version(opset) if schema.function_opset_versions
                                  else schema.function_body.SerializeToString())
            return proto
        if schema.has_context_dependent_function:
            types = []
            for value in inputs:
                if value is None:
                    types.append(b"")
                    continue
                dims = [d if isinstance(d, int) else str(d) for d in
                        ([int(v) if getattr(v, "is_const", True) else str(v) for v in value.shape]
                         if isinstance(value, Traced) else value.shape)]
                types.append(helper.make_tensor_type_proto(helper.np_dtype_to_tensor_dtype(dtype_of(value)), dims)
                             .SerializeToString())
            try:
                proto.ParseFromString(schema.get_context_dependent_function(node.SerializeToString(), types))
            except Exception:  # noqa: BLE001  (the schema could not specialize the function)
                return None
            return proto if proto.node else None
        return None

    def _inline(self, node, function, inputs) -> list:
        """Build a function's body in its own scope: formal inputs bound to the node's values,
        attribute references replaced by the node's attributes (or the function's defaults)."""
        from onnx import NodeProto
        actual = {a.name: a for a in node.attribute}
        defaults = {**self._schema_defaults, **{a.name: a for a in function.attribute_proto}}
        scope = {formal: value for formal, value in zip(function.input, inputs) if value is not None}
        saved = dict(self.opsets)
        self.opsets.update({("" if o.domain == "ai.onnx" else o.domain): o.version for o in function.opset_import})
        self.env_stack.append(scope)  # subgraphs inside the body see the function's scope
        try:
            for index, inner in enumerate(function.node):
                bound = NodeProto()
                bound.CopyFrom(inner)
                del bound.attribute[:]
                for a in inner.attribute:
                    if not a.ref_attr_name:
                        bound.attribute.append(a)
                        continue
                    source = actual.get(a.ref_attr_name) or defaults.get(a.ref_attr_name)
                    if source is not None:
                        copy = bound.attribute.add()
                        copy.CopyFrom(source)
                        copy.name = a.name
                self.run_node(bound, scope, index)
        finally:
            self.opsets = saved
            self.env_stack.pop()
        return [scope.get(name) for name in function.output]


class OnnxModel:
    """An ONNX model loaded as a luminar graph.

    `inputs` / `outputs`: TensorInfo lists (names, dtypes, shapes with dim names for dim_params).
    `compile(backend, **options)` compiles it (options as for Graph.compile); calling the model
    with arrays by ONNX input name returns a dict of arrays by ONNX output name (a model called
    before `compile` compiles itself for "cpu"). `graph` is the luminar Graph, `weights` the
    arrays its weight inputs hold, `op_histogram` the ONNX op counts.
    """

    def __init__(self, proto, name: str, constants: dict | None = None, dims: dict | None = None):
        self.proto, self.name = proto, name
        builder = Builder(proto, name, dict(constants or {}), dict(dims or {}))
        self.inputs, self.outputs, env = builder.build()
        self.graph, self.weights = builder.graph, builder.weights
        self.opsets = builder.opsets
        self._input_names = builder.input_names
        self._outputs = {}  # ONNX output name -> ("graph", luminar name, dtype) or ("const", array)
        taken = set()
        for info in self.outputs:
            value = env.get(info.name)
            if value is None:
                raise ShapeError(f"{name}: graph output {info.name!r} is produced by no node")
            if isinstance(value, np.ndarray) and value.dtype == object:
                # sizes that depend on symbolic dims: computed at run time, as integer expressions
                value = Traced(builder.constant_tensor(value), np.dtype(np.int64))
            if isinstance(value, np.ndarray):
                self._outputs[info.name] = ("const", value.astype(info.dtype, copy=False))
                continue
            out_name = _identifier(info.name, taken)
            tensor = value.tensor
            if tensor.node.op == "input":
                tensor = tensor + 0.0  # an output must be computed; an input passed through is a copy
            tensor.output(out_name)
            self._outputs[info.name] = ("graph", out_name, info.dtype)
        self.program = None
        self.backend = None

    @property
    def op_histogram(self) -> dict[str, int]:
        """How many nodes of each op type the model's main graph has (subgraphs not counted)."""
        counts: dict[str, int] = {}
        for node in self.proto.graph.node:
            counts[node.op_type] = counts.get(node.op_type, 0) + 1
        return dict(sorted(counts.items(), key=lambda kv: (-kv[1], kv[0])))

    def compile(self, backend: str = "cpu", **options) -> "OnnxModel":
        """Compile for `backend` ("reference" or "cpu"; options as for Graph.compile). Returns self."""
        if not self.graph.outputs:  # every output was folded: nothing to run
            self.program, self.backend = None, backend
            return self
        self.program = self.graph.compile(backend, **options)
        self.program.set_inputs(self.weights)
        self.backend = backend
        return self

    def __call__(self, inputs: dict | None = None, /, **named) -> dict[str, np.ndarray]:
        return self.run({**(inputs or {}), **named})

    def run(self, inputs: dict) -> dict[str, np.ndarray]:
        """Run with arrays by ONNX input name; returns arrays by ONNX output name (declared dtypes)."""
        if self.backend is None:
            self.compile("cpu")
        declared = {info.name: info for info in self.inputs}
        unknown = sorted(set(inputs) - set(declared))
        if unknown:
            raise InputError(f"{self.name}: unknown input {unknown[0]!r}; the model's inputs are {sorted(declared)}")
        missing = sorted(set(declared) - set(inputs))
        if missing:
            raise InputError(f"{self.name}: missing input {missing[0]!r}; the model's inputs are {sorted(declared)}")
        feeds = {self._input_names[name]: self._convert_input(declared[name], value) for name, value in inputs.items()}
        results = self.program.run(feeds) if self.program is not None else {}
        out = {}
        for name, spec in self._outputs.items():
            out[name] = spec[1] if spec[0] == "const" else _to_onnx_dtype(results[spec[1]], spec[2])
        return out

    def _convert_input(self, info: TensorInfo, value) -> np.ndarray:
        arr = np.asarray(value)
        if arr.dtype != info.dtype and not (arr.dtype.kind == info.dtype.kind == "f" and
                                            np.can_cast(arr.dtype, info.dtype, "safe")):
            raise DTypeError(f"{self.name}: input {info.name!r} must be {info.dtype}, got {arr.dtype}")
        if info.shape is not None:
            if arr.ndim != len(info.shape):
                raise ShapeError(f"{self.name}: input {info.name!r} must have rank {len(info.shape)} "
                                 f"(shape {list(info.shape)}), got shape {arr.shape}")
            for axis, (want, got) in enumerate(zip(info.shape, arr.shape)):
                if isinstance(want, int) and want != got:
                    raise ShapeError(f"{self.name}: input {info.name!r} must have shape {list(info.shape)}, "
                                     f"got {arr.shape} (axis {axis}: expected {want}, got {got})")
        storage = _STORAGE[info.dtype.name]
        if arr.dtype.name in NARROW_INTS or (storage == "float32" and arr.dtype.name.startswith("float")
                                             and arr.dtype.kind != "f"):
            return arr.astype(np.float32).astype(dtypes_storage(storage))
        if storage == "int32" and arr.dtype != np.int32:
            if arr.size and (arr.min() < _INT32.min or arr.max() > _INT32.max):
                raise DTypeError(f"{self.name}: input {info.name!r} ({arr.dtype}) holds values outside int32, "
                                 f"which luminar cannot represent")
            return arr.astype(np.int32)
        if storage == "uint8" and arr.dtype == np.bool_:
            return arr.astype(np.uint8)
        if storage == "float32" and arr.dtype != np.float32:
            return arr.astype(np.float32)
        if storage == "bfloat16":
            return np.ascontiguousarray(arr).view(np.uint16)
        return arr


def dtypes_storage(name: str) -> np.dtype:
    from ..dtypes import STORAGE
    return STORAGE[name]


def _to_onnx_dtype(result: np.ndarray, dtype: np.dtype) -> np.ndarray:
    """A float32 luminar result as the ONNX output's dtype."""
    kind = integer_kind(dtype)
    if kind == "b":
        return result != 0
    if kind in ("i", "u"):
        low, high = NARROW_INTS.get(dtype.name) or (np.iinfo(dtype).min, np.iinfo(dtype).max)
        return np.clip(np.rint(result), low, high).astype(dtype)
    return result.astype(dtype)


def load(source, *, constants: dict | None = None, dims: dict | None = None) -> OnnxModel:
    """Load an ONNX model (a path, bytes or an onnx.ModelProto) as a luminar graph.

    `constants` gives graph inputs fixed values at load time (they are folded, e.g. a sample rate
    or a shape); `dims` fixes named symbolic dims (dim_params) to sizes, e.g. {"batch": 1}.
    """
    proto, name = _read_model(source)
    return OnnxModel(proto, name, constants, dims)
