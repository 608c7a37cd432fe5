"""TrainStep: one compiled program that computes the loss, its gradients and the optimizer update.

    g = lm.Graph()
    x, y = g.tensor("x", ("n", 3)), g.tensor("y", ("n", 1))
    w = g.tensor("w", (3, 1))
    loss = ((x @ w - y) ** 2).mean()
    grad_w = (x.T @ (x @ w - y)) * (2 / n)          # or grads=None: luminar.grad derives it
    train = TrainStep(loss, {"w": w}, AdamW(lr=1e-2), init={"w": w0}, grads=[grad_w],
                      schedule=warmup_cosine(...))
    for batch in batches:
        train.step({"x": xb, "y": yb})              # -> the loss, a float
    train.save("run.safetensors")                  # params, optimizer state and step

Parameters and optimizer state are inputs the graph updates (`Graph.update`), so they live in
the Program between calls and are never copied; the learning rate is an input fed per step from
the schedule, so nothing recompiles as it changes.
"""
from __future__ import annotations

import math
import os
import tempfile
from typing import Callable

import numpy as np

from ..errors import DTypeError, InputError, ShapeError, UnsupportedError, WeightFileError
from .clip import clip_grad_norm
from .optimizers import Optimizer, _grads_list, _params_dict

FILE_FORMAT = "luminar.optim.TrainStep"


class TrainStep:
    """Compile forward + backward + update of `loss` once; `step(batch)` runs one training step.

    loss       a scalar GraphTensor (0-d, or one element)
    params     {key: input GraphTensor}: the trained parameters (keys name them in files)
    optimizer  an Optimizer (SGD, Adam, AdamW, ...) not yet applied to a graph
    init       {key: array}: initial parameter values (any float array; stored as float32)
    grads      gradients of loss w.r.t. params (a list in params order, or a dict by key), as graph
               expressions; None derives them with luminar.grad (autograd)
    schedule   a callable step -> lr (an lr_scheduler object); None keeps optimizer.lr
    max_grad_norm  clip the gradients' global 2-norm first (clip_grad_norm); the norm before
               clipping is output "grad_norm"
    outputs    extra {name: tensor} to compute each step (see `last_outputs`)
    buffers    {key: input GraphTensor} of state that is carried but not trained (BatchNorm
               running statistics, dropout seeds: inputs the graph updates itself); their initial
               values come from `init` too, and they are part of state_dict/save/load.
               `TrainStep.for_module` fills params, buffers and init from an nn.Module.
    backend, compile_options   passed to Graph.compile
    """

    def __init__(self, loss, params: dict, optimizer: Optimizer, init: dict, *, grads=None,
                 schedule: Callable[[int], float] | None = None, max_grad_norm: float | None = None,
                 outputs: dict | None = None, buffers: dict | None = None, backend: str = "cpu",
                 **compile_options):
        if not isinstance(optimizer, Optimizer):
            raise UnsupportedError(f"TrainStep: optimizer must be a luminar.optim optimizer, got {optimizer!r}")
        if not isinstance(params, dict) or not params:
            raise InputError(f"TrainStep: params must be a non-empty dict {{key: input tensor}}, got {params!r}")
        _check_loss(loss)
        if schedule is not None and not callable(schedule):
            raise UnsupportedError(f"TrainStep: schedule must be callable (step -> lr), got {schedule!r}")
        self.loss, self.optimizer, self.schedule = loss, optimizer, schedule
        params = _params_dict(optimizer, params)
        if next(iter(params.values())).graph is not loss.graph:
            raise InputError("TrainStep: the parameters must be inputs of the loss's graph")
        self.param_inputs = {key: p.node.name for key, p in params.items()}
        buffers = dict(buffers or {})
        for key, tensor in buffers.items():
            if getattr(tensor, "graph", None) is not loss.graph or tensor.node.op != "input" or key in params:
                raise InputError(f"TrainStep: buffer {key!r} must be an input of the loss's graph that is not a parameter")
        self.buffer_inputs = {key: t.node.name for key, t in buffers.items()}
        initial = _initial_values(init, {**params, **buffers})  # checked before the (slower) compile
        grads = _grads_list(optimizer, params, _autograd(loss, params) if grads is None else grads)
        if max_grad_norm is not None:
            grads, grad_norm = clip_grad_norm(grads, max_grad_norm)
            grad_norm.output("grad_norm")
        optimizer.apply(params, grads)
        loss.output("loss")
        for name, tensor in (outputs or {}).items():
            if name in ("loss", "grad_norm") or name.endswith("__next"):
                raise InputError(f"TrainStep: output name {name!r} is reserved")
            tensor.output(name)
        self.program = loss.graph.compile(backend, **compile_options)
        self.program.set_inputs({**initial, **optimizer.initial_state()})
        self.last_outputs: dict[str, np.ndarray] = {}
        self.last_lr: float | None = None

    @classmethod
    def for_module(cls, module, loss, optimizer: Optimizer, **options) -> "TrainStep":
        """The TrainStep of an nn.Module applied in `loss`'s graph: its parameters are trained, its
        buffers (running statistics, dropout seeds) carried as state, all starting from the
        module's current values; keys are the module's dotted names."""
        graph = loss.graph
        params = module.parameter_tensors(graph)
        names, arrays = module.input_names(graph), module.inputs(graph)
        buffers = {key: module.graph_tensor(graph, key) for key in names if key not in params}
        init = {key: arrays[name] for key, name in names.items()}
        return cls(loss, params, optimizer, init, buffers=buffers, **options)

    # -- running ----------------------------------------------------------------------------------
    @property
    def step_count(self) -> int:
        """Optimizer steps taken so far (the in-graph step counter)."""
        return int(self.program.state[self.optimizer.step_input])

    def lr(self, step: int | None = None) -> float:
        """The learning rate of optimizer step `step` (default: the next one)."""
        step = self.step_count if step is None else step
        return float(self.schedule(step)) if self.schedule is not None else self.optimizer.lr

    def step(self, inputs: dict | None = None, dims: dict | None = None) -> float:
        """One training step on the batch `inputs` (name -> array); returns the loss as a float.

        Every output of the call (loss, grad_norm, extra outputs) is kept in `last_outputs`."""
        inputs = dict(inputs or {})
        reserved = set(self.program.graph.updates) | {self.optimizer.lr_input}
        clash = sorted(reserved & set(inputs))
        if clash:
            raise InputError(f"TrainStep.step: {clash[0]!r} is a parameter or optimizer input the step manages; "
                             f"pass only batch inputs (use load_state_dict to change parameters)")
        lr = self.lr()
        outputs = self.program.run({**inputs, **self.optimizer.feed(lr)}, dims)
        self.last_outputs, self.last_lr = outputs, lr
        return float(outputs["loss"].reshape(-1)[0])

    # -- reading and writing the state ------------------------------------------------------------
    def params(self) -> dict[str, np.ndarray]:
        """The current parameter values by key (read-only views of the arrays the program holds)."""
        state = self.program.state
        return {key: _read_only(state[name]) for key, name in self.param_inputs.items()}

    def state_dict(self) -> dict[str, np.ndarray]:
        """Parameters and buffers (by key) and optimizer state ("optim.step", "optim.<key>.exp_avg", ...)."""
        state = {**self.program.fixed, **self.program.state}  # (a device backend copies updated state when read)
        return {key: _read_only(state[name]) for key, name in self._names().items()}

    def load_state_dict(self, tensors: dict, source: str = "state dict") -> None:
        """Replace parameters and optimizer state with `tensors` (as `state_dict` returns them).

        Every tensor is checked before anything changes: a missing or unexpected name, a
        non-float32 array or a bad step count raises WeightFileError, a wrong shape ShapeError,
        each naming the tensor and `source`."""
        names = self._names()
        missing = [k for k in names if k not in tensors]
        if missing:
            raise WeightFileError(f"{source}: tensor {missing[0]!r} is missing (expected {sorted(names)})")
        unexpected = [k for k in tensors if k not in names]
        if unexpected:
            raise WeightFileError(f"{source}: unexpected tensor {unexpected[0]!r} (expected {sorted(names)})")
        arrays = {}
        for key, name in names.items():
            array = np.asarray(tensors[key])
            expected = self.program.graph.inputs[name].shape
            if array.dtype != np.float32:
                raise WeightFileError(f"{source}: tensor {key!r} has dtype {array.dtype}, expected float32")
            if array.shape != tuple(d.value for d in expected):
                raise ShapeError(f"{source}: tensor {key!r} has shape {array.shape}, "
                                 f"expected {tuple(d.value for d in expected)}")
            arrays[name] = np.array(array, np.float32)  # an owned, writable copy (files are mapped)
        step = arrays[self.optimizer.step_input]
        if not (math.isfinite(step) and step >= 0 and step == int(step)):
            raise WeightFileError(f"{source}: tensor {self.optimizer.name + '.step'!r} must hold a step count "
                                  f"(an integer >= 0), got {float(step)}")
        self.program.set_inputs(arrays)

    def save(self, path) -> None:
        """Write parameters, optimizer state and step to a safetensors file, atomically (a
        temporary file in the same directory, then os.replace): a crash never leaves a torn file."""
        from safetensors.numpy import save_file
        path = os.fspath(path)
        directory = os.path.dirname(os.path.abspath(path))
        fd, tmp = tempfile.mkstemp(dir=directory, prefix=".tmp-", suffix=".safetensors")
        os.close(fd)
        try:
            save_file(self.state_dict(), tmp,
                      metadata={"format": FILE_FORMAT, "optimizer": repr(self.optimizer)})
            os.replace(tmp, path)
        except BaseException:
            os.unlink(tmp)
            raise

    def load(self, path) -> None:
        """Read a file written by `save` (into a TrainStep built the same way) and continue from it."""
        from safetensors import SafetensorError
        from safetensors.numpy import load_file
        path = os.fspath(path)
        if not os.path.isfile(path):
            raise WeightFileError(f"{path}: no such file")
        try:
            tensors = load_file(path)
        except (SafetensorError, OSError, ValueError) as e:
            raise WeightFileError(f"{path}: not a readable safetensors file ({e})") from None
        self.load_state_dict(tensors, source=path)

    # -- helpers ----------------------------------------------------------------------------------
    def _names(self) -> dict[str, str]:
        """State-dict key -> input name, parameters and buffers first."""
        names = {**self.param_inputs, **self.buffer_inputs}
        for key, name in self.optimizer.state_names.items():
            if key in names:
                raise InputError(f"TrainStep: parameter key {key!r} collides with an optimizer state name")
            names[key] = name
        return names


def _check_loss(loss) -> None:
    if getattr(loss, "graph", None) is None or not hasattr(loss, "dims"):
        raise UnsupportedError(f"TrainStep: loss must be a GraphTensor, got {loss!r}")
    if not all(d.is_const for d in loss.dims) or math.prod(d.value for d in loss.dims) != 1:
        raise ShapeError(f"TrainStep: loss must be a scalar (one element), got shape {tuple(map(str, loss.dims))}")


def _initial_values(init, params: dict) -> dict[str, np.ndarray]:
    """Initial parameter values by input name, checked against the parameters."""
    if not isinstance(init, dict):
        raise InputError(f"TrainStep: init must be a dict {{key: array}}, got {type(init).__name__}")
    missing = [k for k in params if k not in init]
    unexpected = [k for k in init if k not in params]
    if missing or unexpected:
        raise InputError(f"TrainStep: init must give every parameter and buffer; missing {missing}, "
                         f"unexpected {unexpected}")
    arrays = {}
    for key, param in params.items():
        try:
            array = np.asarray(init[key], np.float32)
        except (TypeError, ValueError) as e:
            raise DTypeError(f"TrainStep: init of parameter {key!r} is not a float array: {e}") from None
        if array.shape != param.shape:
            raise ShapeError(f"TrainStep: init of parameter {key!r} has shape {array.shape}, expected {param.shape}")
        arrays[param.node.name] = array
    return arrays


def _autograd(loss, params: dict) -> list:
    """luminar.grad(loss, params), when the autograd module is part of this build."""
    try:
        from ..autograd import grad
    except ModuleNotFoundError as e:
        if e.name != "luminar.autograd":
            raise
        raise UnsupportedError("TrainStep: grads=None needs luminar.grad (autograd), which this build lacks; "
                               "pass the gradients explicitly with grads=[...]") from None
    return list(grad(loss, list(params.values())))


def _read_only(array: np.ndarray) -> np.ndarray:
    view = array.view()
    view.flags.writeable = False
    return view
