"""Optimizers as graph updates: SGD, Adam and AdamW with torch.optim's update formulas.

An optimizer does not run anything itself. `optimizer.apply(params, grads)` adds the update to
the graph that holds the parameters: for each (parameter, gradient) pair it declares the state
inputs the method needs (momentum buffer, exp_avg, exp_avg_sq, ...) and registers, with
`Graph.update`, the new parameter and the new state as the values those inputs hold after each
run. One compiled program then does forward, backward and update, and the state lives in the
Program between calls with no copies.

    g = lm.Graph()
    w, gw = g.tensor("w", (3, 4)), g.tensor("gw", (3, 4))     # gw: any gradient expression
    opt = Adam(lr=1e-3)
    opt.apply({"w": w}, [gw])
    program = g.compile("cpu").set_inputs({"w": w0, **opt.initial_state()})
    program(gw=grad, **opt.feed(1e-3))                         # one step; program.state holds w

Two scalars are inputs too: the learning rate (`<name>__lr`, fed per call by `feed`, so a
schedule changes it without recompiling) and the step counter (`<name>__step`, state counted
in-graph, used by Adam's bias correction and by SGD's first-step momentum initialisation).
One counter serves every parameter: torch keeps one per parameter, but all of them advance
together when every parameter gets a gradient at every step, as here.

Differences from torch.optim: the arithmetic is float32 throughout (torch computes the bias
corrections and step sizes in double before applying them to float32 tensors), so trajectories
agree to about 1e-6 relative per step rather than bit for bit. Sparse gradients, complex
parameters, closures and parameter groups are not supported (use one optimizer per group, each
with its own `name`).
"""
from __future__ import annotations

import math

import numpy as np

from ..errors import DTypeError, InputError, ShapeError, UnsupportedError, ValueDomainError
from ..graph import show_shape
from ..library.elementwise import maximum


class Optimizer:
    """The machinery every optimizer shares: hyperparameter checks, the lr and step inputs, the
    per-parameter state inputs and the `Graph.update` calls. Subclasses say which state a
    parameter has (`state_kinds`) and how one parameter updates (`_update`)."""

    def __init__(self, lr: float, name: str = "optim"):
        self.lr = _check_number(self, "lr", lr, low=0.0)
        if not isinstance(name, str) or not name.isidentifier():
            raise ValueDomainError(f"{type(self).__name__}: name must be an identifier, got {name!r}")
        self.name = name
        self.graph = None
        # file/state-dict key -> input name, e.g. "optim.w.exp_avg" -> "optim__w__exp_avg"
        self.state_names: dict[str, str] = {}
        self._state_shapes: dict[str, tuple[int, ...]] = {}

    # -- what subclasses provide -----------------------------------------------------------------
    def state_kinds(self) -> tuple[str, ...]:
        """Names of the per-parameter state tensors (torch's optimizer.state[p] keys)."""
        raise NotImplementedError

    def _scalars(self, lr, step, next_step) -> dict:
        """Scalar graph expressions shared by every parameter (built once per apply)."""
        return {"lr": lr, "step": step, "next_step": next_step}

    def _update(self, param, grad, state: dict, scalars: dict):
        """(new param, {kind: new state}) for one parameter, as graph expressions."""
        raise NotImplementedError

    # -- building the update -----------------------------------------------------------------------
    @property
    def lr_input(self) -> str:
        """The name of the scalar learning-rate input."""
        return f"{self.name}__lr"

    @property
    def step_input(self) -> str:
        """The name of the scalar step-counter input (state: steps taken so far)."""
        return f"{self.name}__step"

    def apply(self, params, grads) -> dict:
        """Add the update of `params` by `grads` to their graph; returns {key: new param tensor}.

        `params` is a dict {key: input GraphTensor} (keys name the parameters in state dicts and
        files) or a list of input GraphTensors (keyed by input name). `grads` is a list in the
        same order, or a dict with the same keys; each gradient has its parameter's shape.
        """
        params = _params_dict(self, params)
        grads = _grads_list(self, params, grads)
        if self.graph is not None:
            raise UnsupportedError(f"{type(self).__name__} {self.name!r} is already applied to a graph; "
                                   f"create one optimizer per graph (or per parameter group, with distinct names)")
        graph = next(iter(params.values())).graph
        lr = graph.tensor(self.lr_input, ())
        step = graph.tensor(self.step_input, ())
        next_step = step + 1.0
        graph.update(step, next_step)
        self.graph = graph
        self.state_names[f"{self.name}.step"] = self.step_input
        self._state_shapes[self.step_input] = ()
        scalars = self._scalars(lr, step, next_step)
        new_params = {}
        for (key, param), grad in zip(params.items(), grads):
            state = {}
            for kind in self.state_kinds():
                input_name = f"{self.name}__{param.node.name}__{kind}"
                state[kind] = graph.tensor(input_name, param.shape)
                self.state_names[f"{self.name}.{key}.{kind}"] = input_name
                self._state_shapes[input_name] = param.shape
            new_param, new_state = self._update(param, grad, state, scalars)
            graph.update(param, new_param)
            for kind, value in new_state.items():
                graph.update(state[kind], value)
            new_params[key] = new_param
        return new_params

    def initial_state(self) -> dict[str, np.ndarray]:
        """Initial values of the state inputs, by input name (zeros, step 0), for set_inputs."""
        if self.graph is None:
            raise UnsupportedError(f"{type(self).__name__}.initial_state: call apply(params, grads) first")
        return {name: np.zeros(shape, np.float32) for name, shape in self._state_shapes.items()}

    def feed(self, lr: float | None = None) -> dict[str, np.ndarray]:
        """The learning-rate input for one call: {lr_input: lr} (default: the constructor's lr)."""
        lr = self.lr if lr is None else _check_number(self, "lr", lr, low=0.0)
        return {self.lr_input: np.asarray(lr, np.float32)}

    def __repr__(self):
        args = ", ".join(f"{k}={v!r}" for k, v in vars(self).items()
                         if k not in ("graph", "state_names", "_state_shapes"))
        return f"{type(self).__name__}({args})"


class SGD(Optimizer):
    """torch.optim.SGD: stochastic gradient descent with optional (Nesterov) momentum.

    Per step, with g the gradient (negated when `maximize`):
        g = g + weight_decay * p
        buf = g                                   on the first step
        buf = momentum * buf + (1 - dampening) * g   afterwards
        g = g + momentum * buf if nesterov else buf   (when momentum != 0)
        p = p - lr * g
    """

    def __init__(self, lr: float = 1e-3, momentum: float = 0.0, dampening: float = 0.0, nesterov: bool = False,
                 weight_decay: float = 0.0, maximize: bool = False, *, name: str = "optim"):
        super().__init__(lr, name)
        self.momentum = _check_number(self, "momentum", momentum, low=0.0)
        self.dampening = _check_number(self, "dampening", dampening)
        self.weight_decay = _check_number(self, "weight_decay", weight_decay, low=0.0)
        self.nesterov, self.maximize = bool(nesterov), bool(maximize)
        if self.nesterov and (self.momentum <= 0 or self.dampening != 0):
            raise ValueDomainError(f"SGD: Nesterov momentum requires a momentum > 0 and zero dampening, "
                                   f"got momentum={momentum}, dampening={dampening}")

    def state_kinds(self):
        return ("momentum_buffer",) if self.momentum != 0 else ()

    def _update(self, param, grad, state, scalars):
        grad = _regularized(self, param, grad)
        new_state = {}
        if self.momentum != 0:
            # torch starts the buffer at the first gradient, undamped. The buffer input starts at
            # zero, so momentum * 0 + coefficient * g with coefficient 1 on step 0 is exactly g.
            coefficient = 1.0 - self.dampening
            if self.dampening != 0:
                coefficient = 1.0 - self.dampening * scalars["step"].gt(0.5)
            buf = state["momentum_buffer"] * self.momentum + grad * coefficient
            new_state["momentum_buffer"] = buf
            grad = grad + buf * self.momentum if self.nesterov else buf
        return param - scalars["lr"] * grad, new_state


class Adam(Optimizer):
    """torch.optim.Adam (and, with decoupled weight decay, AdamW).

    Per step t = 1, 2, ..., with g the gradient (negated when `maximize`):
        g = g + weight_decay * p                  (Adam; AdamW instead p = p * (1 - lr * weight_decay))
        m = m + (1 - beta1) * (g - m)             (torch's lerp)
        v = beta2 * v + (1 - beta2) * g * g
        v_max = max(v_max, v)                     (amsgrad; v_max replaces v below)
        p = p - lr / (1 - beta1^t) * m / (sqrt(v) / sqrt(1 - beta2^t) + eps)
    The bias corrections 1 - beta^t are computed in-graph from the step counter as
    -expm1(t * ln(beta)), which keeps their relative accuracy when t * ln(beta) is tiny (beta2 =
    0.999 on the first steps), where 1 - exp2(t * log2(beta)) would lose digits to cancellation.
    """

    decoupled_weight_decay = False

    def __init__(self, lr: float = 1e-3, betas: tuple[float, float] = (0.9, 0.999), eps: float = 1e-8,
                 weight_decay: float = 0.0, amsgrad: bool = False, *, maximize: bool = False, name: str = "optim"):
        super().__init__(lr, name)
        if not isinstance(betas, (tuple, list)) or len(betas) != 2:
            raise ValueDomainError(f"{type(self).__name__}: betas must be a pair (beta1, beta2), got {betas!r}")
        self.betas = tuple(_check_number(self, f"beta parameter at index {k}", b, low=0.0, below=1.0)
                           for k, b in enumerate(betas))
        self.eps = _check_number(self, "epsilon value", eps, low=0.0)
        self.weight_decay = _check_number(self, "weight_decay", weight_decay, low=0.0)
        self.amsgrad, self.maximize = bool(amsgrad), bool(maximize)

    def state_kinds(self):
        return ("exp_avg", "exp_avg_sq") + (("max_exp_avg_sq",) if self.amsgrad else ())

    def _scalars(self, lr, step, next_step):
        beta1, beta2 = self.betas
        bias_correction1 = _bias_correction(next_step, beta1)
        bias_correction2 = _bias_correction(next_step, beta2)
        return {"lr": lr, "step_size": lr / bias_correction1, "bias_correction2_sqrt": bias_correction2.sqrt()}

    def _update(self, param, grad, state, scalars):
        beta1, beta2 = self.betas
        if self.decoupled_weight_decay:
            param = param * (1.0 - scalars["lr"] * self.weight_decay) if self.weight_decay != 0 else param
            grad = -grad if self.maximize else grad
        else:
            grad = _regularized(self, param, grad)
        exp_avg = state["exp_avg"] + (grad - state["exp_avg"]) * (1.0 - beta1)
        exp_avg_sq = state["exp_avg_sq"] * beta2 + grad * grad * (1.0 - beta2)
        new_state = {"exp_avg": exp_avg, "exp_avg_sq": exp_avg_sq}
        second_moment = exp_avg_sq
        if self.amsgrad:
            second_moment = new_state["max_exp_avg_sq"] = maximum(state["max_exp_avg_sq"], exp_avg_sq)
        denom = second_moment.sqrt() / scalars["bias_correction2_sqrt"] + self.eps
        return param - scalars["step_size"] * exp_avg / denom, new_state


class AdamW(Adam):
    """torch.optim.AdamW: Adam with decoupled weight decay (p = p * (1 - lr * weight_decay)
    before the Adam step), and torch's default weight_decay of 1e-2."""

    decoupled_weight_decay = True

    def __init__(self, lr: float = 1e-3, betas: tuple[float, float] = (0.9, 0.999), eps: float = 1e-8,
                 weight_decay: float = 1e-2, amsgrad: bool = False, *, maximize: bool = False, name: str = "optim"):
        super().__init__(lr, betas, eps, weight_decay, amsgrad, maximize=maximize, name=name)


# -- helpers --------------------------------------------------------------------------------------
def _regularized(optimizer, param, grad):
    """The gradient after `maximize` and L2 weight decay, as torch applies them."""
    grad = -grad if optimizer.maximize else grad
    return grad + param * optimizer.weight_decay if optimizer.weight_decay != 0 else grad


def _bias_correction(step, beta: float):
    """1 - beta**step as a graph expression: -expm1(step * ln(beta)); 1 when beta is 0 (step >= 1)."""
    if beta == 0.0:
        return step * 0.0 + 1.0
    return -(step * math.log(beta)).expm1()


def _check_number(optimizer, what: str, value, low: float | None = None, below: float | None = None) -> float:
    """`value` as a finite float in [low, below), else a ValueDomainError naming the optimizer."""
    owner = type(optimizer).__name__
    if isinstance(value, bool) or not isinstance(value, (int, float, np.number)) or not math.isfinite(value):
        raise ValueDomainError(f"{owner}: invalid {what}: {value!r} (expected a finite number)")
    if (low is not None and value < low) or (below is not None and value >= below):
        bounds = f"[{low}, {below})" if below is not None else f">= {low}"
        raise ValueDomainError(f"{owner}: invalid {what}: {value} (must be {bounds})")
    return float(value)


def _params_dict(optimizer, params) -> dict:
    """Parameters as {key: input tensor}, checked: float32 graph inputs of one graph, fixed shapes."""
    owner = type(optimizer).__name__
    if isinstance(params, dict):
        items = list(params.items())
    elif isinstance(params, (list, tuple)):
        items = [(getattr(getattr(p, "node", None), "name", None), p) for p in params]
    else:
        raise InputError(f"{owner}.apply: params must be a dict {{name: input tensor}} or a list of input tensors, "
                         f"got {type(params).__name__}")
    if not items:
        raise InputError(f"{owner}.apply: no parameters given")
    graph = getattr(items[0][1], "graph", None)
    for key, p in items:
        node = getattr(p, "node", None)
        if node is None or node.op != "input" or p.graph is not graph:
            raise InputError(f"{owner}.apply: parameter {key!r} must be an input of the same graph "
                             f"(declared with g.tensor), got {p!r}")
        if node.dtype != "float32":
            raise DTypeError(f"{owner}.apply: parameter {key!r} must be float32 (it is updated in place), "
                             f"got {node.dtype}")
        if not all(d.is_const for d in p.dims):
            raise ShapeError(f"{owner}.apply: parameter {key!r} has symbolic shape {show_shape(p.dims)}; "
                             f"parameters need fixed shapes")
        if tuple(p.dims) != node.shape:
            raise InputError(f"{owner}.apply: parameter {key!r} must be the input itself, not a view of it")
    return dict(items)


def _grads_list(optimizer, params: dict, grads) -> list:
    """Gradients in parameter order, each checked against its parameter's shape and graph."""
    owner = type(optimizer).__name__
    if isinstance(grads, dict):
        missing = [k for k in params if k not in grads]
        extra = [k for k in grads if k not in params]
        if missing or extra:
            raise InputError(f"{owner}.apply: grads must have the params' keys; missing {missing}, unexpected {extra}")
        grads = [grads[k] for k in params]
    grads = list(grads)
    if len(grads) != len(params):
        raise InputError(f"{owner}.apply: {len(params)} parameters but {len(grads)} gradients")
    for (key, p), g in zip(params.items(), grads):
        if getattr(g, "graph", None) is not p.graph:
            raise InputError(f"{owner}.apply: the gradient of {key!r} must be a tensor of the parameter's graph, "
                             f"got {g!r}")
        if tuple(g.dims) != tuple(p.dims):
            raise ShapeError(f"{owner}.apply: the gradient of {key!r} has shape {show_shape(g.dims)}, "
                             f"the parameter has shape {show_shape(p.dims)}")
    return grads
