"""Module: PyTorch's nn.Module for static graphs. Parameters live in numpy; graphs read them as inputs.

A module holds its parameters and buffers as numpy float32 arrays (``linear.weight`` is an
ndarray) and discovers submodules, parameters and buffers from its attributes, as torch does:
``named_parameters()``, ``state_dict()`` and ``load_state_dict()`` use torch's dotted names and
shapes, so a torch module's ``state_dict()`` loads as it is.

Calling a module on a GraphTensor builds its forward pass into that tensor's graph. Every
parameter or buffer the forward pass reads becomes a graph input, declared once per graph and
named after its dotted path:

    input name = (prefix + "." + dotted path) with each "." replaced by "__",
                 and "_" put in front when that would start with a digit

so ``Linear``'s weight is ``weight``, ``Sequential(Linear(...))``'s is ``_0__weight`` and, with
``prefix="enc"``, ``enc__0__weight``. The prefix is a constructor keyword (or the ``prefix``
attribute); the outermost module applied in a graph names everything below it (a submodule's own
prefix only counts when it is applied on its own). Give two separate models in one graph
different prefixes. Afterwards:

- ``module.inputs(graph)``             {input name: current array}, for ``program.set_inputs(...)``
- ``module.parameter_tensors(graph)``  {dotted name: GraphTensor} of the parameters the graph reads
                                        (what autograd differentiates and optimizers update)
- ``module.graph_tensor(graph, name)`` one parameter's or buffer's GraphTensor (declared if needed)
- ``module.load_program_state(program, graph)`` copies the values a compiled program updated
                                        (``Graph.update``: trained weights, running statistics) back

``train()`` / ``eval()`` choose what forward builds (batch or running statistics, dropout or
not); a graph is fixed once built, so build one graph per mode.
"""
from __future__ import annotations

from collections import namedtuple
from collections.abc import Iterator

import numpy as np

from ..errors import DTypeError, InputError, ShapeError, UnsupportedError
from ..graph import Graph
from ..tensor import GraphTensor

IncompatibleKeys = namedtuple("IncompatibleKeys", ["missing_keys", "unexpected_keys"])


class Parameter:
    """torch.nn.Parameter: assign one to a Module attribute to register a trainable array.

    The module stores the float32 array itself: ``module.name`` reads back an ndarray.
    """

    def __init__(self, data):
        self.data = as_float32(data.data if isinstance(data, Parameter) else data, "Parameter")


def as_float32(value, what: str) -> np.ndarray:
    """A fresh C-contiguous float32 copy of an array, a number or a (CPU) torch tensor."""
    if hasattr(value, "detach"):  # torch tensors, parameters included
        value = value.detach().cpu().numpy()
    try:
        array = np.array(value, dtype=np.float32)
    except (TypeError, ValueError) as e:
        raise DTypeError(f"{what}: cannot read {type(value).__name__} as a float32 array: {e}") from None
    if array.dtype.kind != "f":
        raise DTypeError(f"{what}: expected numbers, got {array.dtype}")
    return array


def input_name(prefix: str, dotted: str) -> str:
    """The graph input name of the parameter or buffer at `dotted` under `prefix` (see the module docstring)."""
    name = (f"{prefix}.{dotted}" if prefix else dotted).replace(".", "__")
    return "_" + name if name[:1].isdigit() else name


class _GraphSlots:
    """What one graph knows about modules: assigned input names and the tensors declared for them.

    Keys are (id(module), local name); `owners` keeps those modules alive so ids stay unique.
    It lives on the Graph instance (attribute ``_nn_slots``), so it goes away with the graph.
    """

    def __init__(self):
        self.names: dict[tuple[int, str], str] = {}
        self.tensors: dict[tuple[int, str], GraphTensor] = {}
        self.owners: dict[int, Module] = {}
        self.named: set[int] = set()  # modules whose subtree has been given names
        self.applications: dict[int, int] = {}  # how often a module's forward ran in this graph

    @staticmethod
    def of(graph: Graph) -> _GraphSlots:
        slots = graph.__dict__.get("_nn_slots")
        if slots is None:
            slots = graph._nn_slots = _GraphSlots()
        return slots


def _graph_of(args, kwargs) -> Graph | None:
    for value in (*args, *kwargs.values()):
        if isinstance(value, GraphTensor):
            return value.graph
    return None


class Module:
    """Base class of all modules (torch.nn.Module): subclasses set attributes in __init__ and define forward."""

    def __init__(self, *, prefix: str = ""):
        object.__setattr__(self, "_parameters", {})
        object.__setattr__(self, "_buffers", {})
        object.__setattr__(self, "_non_persistent", set())
        object.__setattr__(self, "_modules", {})
        object.__setattr__(self, "training", True)
        self.prefix = prefix

    # -- attributes -------------------------------------------------------------------------------
    def __setattr__(self, name: str, value):
        if "_parameters" not in self.__dict__:
            raise UnsupportedError(f"{type(self).__name__}: call super().__init__() before assigning attributes")
        if name == "prefix":
            _check_prefix(value)
        if isinstance(value, Parameter):
            self._forget(name)
            self._parameters[name] = value.data
        elif isinstance(value, Module):
            self._forget(name)
            self._modules[name] = value
        elif name in self._parameters or name in self._buffers:
            table = self._parameters if name in self._parameters else self._buffers
            table[name] = None if value is None else self._replacement(name, table[name], value)
        elif name in self._modules and value is None:
            self._modules[name] = None
        else:
            object.__setattr__(self, name, value)

    def _replacement(self, name: str, old, value) -> np.ndarray:
        """A new value for an existing parameter/buffer: same shape, so graphs built earlier stay valid."""
        array = as_float32(value, f"{type(self).__name__}.{name}")
        if old is not None and array.shape != old.shape:
            raise ShapeError(f"{type(self).__name__}.{name}: expected shape {old.shape}, got {array.shape} "
                             f"(assign a Parameter to change a parameter's shape)")
        return array

    def _forget(self, name: str):
        for table in (self._parameters, self._buffers, self._modules):
            table.pop(name, None)
        self._non_persistent.discard(name)
        self.__dict__.pop(name, None)

    def __getattr__(self, name: str):
        for table in ("_parameters", "_buffers", "_modules"):
            values = self.__dict__.get(table)
            if values is not None and name in values:
                return values[name]
        raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")

    def __delattr__(self, name: str):
        if name in self._parameters or name in self._buffers or name in self._modules:
            self._forget(name)
        else:
            object.__delattr__(self, name)

    def register_parameter(self, name: str, value) -> None:
        """torch's register_parameter: an array (or None, e.g. a disabled bias) as a trainable parameter."""
        self._forget(name)
        self._parameters[name] = None if value is None else as_float32(value, f"{type(self).__name__}.{name}")

    def register_buffer(self, name: str, value, persistent: bool = True) -> None:
        """torch's register_buffer: state that is not trained (running statistics, RNG seeds).

        Non-persistent buffers are left out of state_dict() but are graph inputs like the others.
        """
        self._forget(name)
        self._buffers[name] = None if value is None else as_float32(value, f"{type(self).__name__}.{name}")
        if not persistent:
            self._non_persistent.add(name)

    def add_module(self, name: str, module: Module | None) -> None:
        if module is not None and not isinstance(module, Module):
            raise UnsupportedError(f"add_module: {name!r} must be a Module, got {type(module).__name__}")
        self._forget(name)
        self._modules[name] = module

    # -- traversal --------------------------------------------------------------------------------
    def named_children(self) -> Iterator[tuple[str, Module]]:
        return ((name, m) for name, m in self._modules.items() if m is not None)

    def children(self) -> Iterator[Module]:
        return (m for _, m in self.named_children())

    def named_modules(self, prefix: str = "") -> Iterator[tuple[str, Module]]:
        """(dotted name, module) for self and every submodule, each module once (as torch)."""
        seen = set()

        def walk(module, path):
            if id(module) in seen:
                return
            seen.add(id(module))
            yield path, module
            for name, child in module.named_children():
                yield from walk(child, f"{path}.{name}" if path else name)

        return walk(self, prefix)

    def modules(self) -> Iterator[Module]:
        return (m for _, m in self.named_modules())

    def _slots(self, kinds=("parameter", "buffer"), persistent_only=False):
        """(dotted name, owning module, local name, kind) for every parameter/buffer that is not None,
        in torch's order: a module's parameters, then its buffers, then its children's."""
        for path, module in self.named_modules():
            entries = []
            if "parameter" in kinds:
                entries += [(n, v, "parameter") for n, v in module._parameters.items()]
            if "buffer" in kinds:
                entries += [(n, v, "buffer") for n, v in module._buffers.items()
                            if not (persistent_only and n in module._non_persistent)]
            for local, value, kind in entries:
                if value is not None:
                    yield (f"{path}.{local}" if path else local), module, local, kind

    def named_parameters(self) -> Iterator[tuple[str, np.ndarray]]:
        return ((dotted, m._parameters[local]) for dotted, m, local, _ in self._slots(("parameter",)))

    def parameters(self) -> Iterator[np.ndarray]:
        return (array for _, array in self.named_parameters())

    def named_buffers(self) -> Iterator[tuple[str, np.ndarray]]:
        return ((dotted, m._buffers[local]) for dotted, m, local, _ in self._slots(("buffer",)))

    def buffers(self) -> Iterator[np.ndarray]:
        return (array for _, array in self.named_buffers())

    def apply(self, fn) -> Module:
        """torch's apply: fn(module) for every submodule, then self."""
        for child in self.children():
            child.apply(fn)
        fn(self)
        return self

    # -- state ----------------------------------------------------------------------------------
    def _array(self, local: str) -> np.ndarray:
        table = self._parameters if local in self._parameters else self._buffers
        return table[local]

    def _set_array(self, local: str, array: np.ndarray) -> None:
        table = self._parameters if local in self._parameters else self._buffers
        table[local] = array

    def state_dict(self) -> dict[str, np.ndarray]:
        """{dotted name: copy of the array} for parameters and persistent buffers, as torch names them."""
        return {dotted: m._array(local).copy() for dotted, m, local, _ in self._slots(persistent_only=True)}

    def load_state_dict(self, state_dict, strict: bool = True) -> IncompatibleKeys:
        """Load arrays by torch's dotted names (numpy arrays, numbers or CPU torch tensors).

        Shapes must match (ShapeError otherwise). With strict, a missing or unexpected key raises
        InputError. Nothing is changed unless every check passes. Returns torch's
        (missing_keys, unexpected_keys).
        """
        slots = {dotted: (m, local) for dotted, m, local, _ in self._slots(persistent_only=True)}
        missing = [k for k in slots if k not in state_dict]
        unexpected = [k for k in state_dict if k not in slots]
        where = f"load_state_dict for {type(self).__name__}"
        if strict and (missing or unexpected):
            detail = [f"unexpected key(s) {unexpected}" if unexpected else "", f"missing key(s) {missing}" if missing else ""]
            raise InputError(f"{where}: {'; '.join(d for d in detail if d)}")
        loaded = {}
        for dotted, value in state_dict.items():
            if dotted not in slots:
                continue
            module, local = slots[dotted]
            array = as_float32(value, f"{where}: {dotted!r}")
            expected = module._array(local).shape
            if array.shape != expected:
                raise ShapeError(f"{where}: {dotted!r} has shape {array.shape}, the module expects {expected}")
            loaded[dotted] = array
        for dotted, array in loaded.items():
            module, local = slots[dotted]
            module._set_array(local, array)
        return IncompatibleKeys(missing, unexpected)

    def train(self, mode: bool = True) -> Module:
        """torch's train(): set training mode on self and every submodule (read when forward builds a graph)."""
        for module in self.modules():
            object.__setattr__(module, "training", bool(mode))
        return self

    def eval(self) -> Module:
        return self.train(False)

    # -- graphs -----------------------------------------------------------------------------------
    def __call__(self, *args, **kwargs):
        graph = _graph_of(args, kwargs)
        if graph is None:
            raise UnsupportedError(f"{type(self).__name__}: apply modules to GraphTensors (declare inputs with "
                                   f"g.tensor(...)); got {', '.join(type(a).__name__ for a in args) or 'no arguments'}")
        slots = _GraphSlots.of(graph)
        if id(self) not in slots.named:  # the outermost module applied names its whole subtree
            for dotted, module, local, _ in self._slots():
                slots.names.setdefault((id(module), local), input_name(self.prefix, dotted))
                slots.owners[id(module)] = module
            slots.named.update(id(m) for m in self.modules())
        slots.applications[id(self)] = slots.applications.get(id(self), 0) + 1
        slots.owners[id(self)] = self
        return self.forward(*args, **kwargs)

    def forward(self, *args, **kwargs):
        raise UnsupportedError(f"{type(self).__name__} does not define forward()")

    def _resolve(self, dotted: str) -> tuple[Module, str]:
        *path, local = dotted.split(".")
        module = self
        for name in path:
            child = module._modules.get(name)
            if child is None:
                raise InputError(f"{type(self).__name__} has no submodule {name!r} (in {dotted!r})")
            module = child
        if module._parameters.get(local) is None and module._buffers.get(local) is None:
            raise InputError(f"{type(self).__name__} has no parameter or buffer {dotted!r}; it has "
                             f"{[d for d, *_ in self._slots()]}")
        return module, local

    def graph_tensor(self, graph: Graph, name: str) -> GraphTensor:
        """The GraphTensor of parameter or buffer `name` (dotted) in `graph`, declared as an input on first use."""
        module, local = self._resolve(name)
        slots = _GraphSlots.of(graph)
        key = (id(module), local)
        tensor = slots.tensors.get(key)
        if tensor is None:
            input = slots.names.get(key) or input_name(module.prefix, local)
            try:
                tensor = graph.tensor(input, module._array(local).shape)
            except InputError:
                raise InputError(f"{type(module).__name__}.{local}: graph input {input!r} is already declared; give "
                                 f"separate models in one graph different prefixes (Module(prefix=...))") from None
            slots.tensors[key] = tensor
            slots.owners[id(module)] = module
        return tensor

    def _optional_tensor(self, graph: Graph, name: str) -> GraphTensor | None:
        """graph_tensor for a parameter that may be disabled (None), such as a bias."""
        return None if self._parameters.get(name) is None else self.graph_tensor(graph, name)

    def _declared(self, graph: Graph, kinds=("parameter", "buffer")):
        """(dotted, module, local, tensor) of the slots `graph` has declared as inputs."""
        tensors = _GraphSlots.of(graph).tensors
        for dotted, module, local, _ in self._slots(kinds):
            tensor = tensors.get((id(module), local))
            if tensor is not None:
                yield dotted, module, local, tensor

    def inputs(self, graph: Graph) -> dict[str, np.ndarray]:
        """{input name: current array} of this module's parameters and buffers in `graph`, for program.set_inputs."""
        return {t.node.name: m._array(local) for _, m, local, t in self._declared(graph)}

    def input_names(self, graph: Graph) -> dict[str, str]:
        """{dotted name: graph input name} of the parameters and buffers `graph` reads."""
        return {dotted: t.node.name for dotted, _, _, t in self._declared(graph)}

    def parameter_tensors(self, graph: Graph) -> dict[str, GraphTensor]:
        """{dotted name: GraphTensor} of the parameters `graph` reads: what to differentiate and update.

        Parameters the forward pass never read are left out, as torch's optimizers skip
        parameters without a gradient.
        """
        return {dotted: t for dotted, _, _, t in self._declared(graph, ("parameter",))}

    def load_program_state(self, program, graph: Graph) -> list[str]:
        """Copy back the values a program compiled from `graph` holds for this module's inputs.

        `program` is a Program (its `state`: the inputs the graph updates, see Graph.update) or
        a dict {input name: array}. Returns the dotted names that were loaded.
        """
        values = program.state if hasattr(program, "state") else program
        loaded = []
        for dotted, module, local, tensor in self._declared(graph):
            value = values.get(tensor.node.name)
            if value is None:
                continue
            array = as_float32(value, f"load_program_state: {dotted!r}")
            if array.shape != module._array(local).shape:
                raise ShapeError(f"load_program_state: {dotted!r} has shape {array.shape}, "
                                 f"expected {module._array(local).shape}")
            module._set_array(local, array)
            loaded.append(dotted)
        return loaded

    def _application(self, graph: Graph) -> int:
        """How many times this module's forward has run in `graph`, this call included (1 first)."""
        return _GraphSlots.of(graph).applications.get(id(self), 1)

    # -- printing ---------------------------------------------------------------------------------
    def extra_repr(self) -> str:
        return ""

    def __repr__(self):
        lines = [f"({name}): {repr(m)}".replace("\n", "\n  ") for name, m in self.named_children()]
        if not lines:
            return f"{type(self).__name__}({self.extra_repr()})"
        lines = ([self.extra_repr()] if self.extra_repr() else []) + lines
        return f"{type(self).__name__}(\n  " + "\n  ".join(lines) + "\n)"


def _check_prefix(prefix) -> None:
    if not isinstance(prefix, str) or (prefix and not all(p and (p.replace("_", "a").isalnum() and p.isascii())
                                                           for p in prefix.split("."))):
        raise InputError(f"module prefix must be '' or dot-separated names of letters, digits and '_', got {prefix!r}")


class Sequential(Module):
    """torch.nn.Sequential: modules applied in order; built from modules or an OrderedDict of them."""

    def __init__(self, *args, prefix: str = ""):
        super().__init__(prefix=prefix)
        items = args[0].items() if len(args) == 1 and isinstance(args[0], dict) else \
            ((str(k), m) for k, m in enumerate(args))
        for name, module in items:
            self.add_module(name, module)

    def __len__(self):
        return len(self._modules)

    def __iter__(self):
        return iter(self._modules.values())

    def __getitem__(self, index):
        modules = list(self._modules.items())
        if isinstance(index, slice):
            return Sequential(dict(modules[index]))
        return modules[index][1]

    def append(self, module: Module) -> Sequential:
        self.add_module(str(len(self)), module)
        return self

    def forward(self, input):
        for module in self:
            input = module(input)
        return input


class ModuleList(Module):
    """torch.nn.ModuleList: a list whose modules are registered as submodules "0", "1", ..."""

    def __init__(self, modules=None, *, prefix: str = ""):
        super().__init__(prefix=prefix)
        for module in modules or ():
            self.append(module)

    def __len__(self):
        return len(self._modules)

    def __iter__(self):
        return iter(self._modules.values())

    def __getitem__(self, index):
        values = list(self._modules.values())
        return ModuleList(values[index]) if isinstance(index, slice) else values[index]

    def append(self, module: Module) -> ModuleList:
        self.add_module(str(len(self)), module)
        return self

    def extend(self, modules) -> ModuleList:
        for module in modules:
            self.append(module)
        return self
