"""Recurrent networks: torch.nn's RNN, LSTM and GRU and their cells, with torch's parameter names,
gate orders and results, plus `SequenceRunner`, which runs them over sequences of run-time length.

Each layer's update, with x_t its input and h its state (torch's formulas; W_i* rows of weight_ih,
W_h* rows of weight_hh, b_i*/b_h* of bias_ih/bias_hh, in this order):

- RNN   h' = act(W_i x + b_i + W_h h + b_h), act tanh or relu
- LSTM  i, f, g, o = chunks of (W_i x + b_i + W_h h + b_h);  c' = sigmoid(f) c + sigmoid(i) tanh(g),
        h' = sigmoid(o) tanh(c')
- GRU   r, z, n: r = sigmoid(W_ir x + b_ir + W_hr h + b_hr), z likewise,
        n = tanh(W_in x + b_in + r (W_hn h + b_hn)),  h' = (1 - z) n + z h

How a recurrence compiles (the decision, and why)
---------------------------------------------------
A luminar graph is static and has no loop primitive, so there are two ways to run T steps:

1. **Unrolled, in the graph** (``module(x)`` on a GraphTensor). The time axis must be a concrete
   int; the graph holds one copy of the cell per step. Everything that does not depend on the
   state is computed for all steps at once (the input projection ``x W_ih^T + b_ih`` is one
   matmul over T * batch rows), so each step adds one ``h W_hh^T`` and the gate arithmetic. It
   composes with everything else in a graph: `lm.grad` differentiates through time, `TrainStep`
   trains it, and the compiled program runs all steps in one call with no Python in between.
   The price is compile time linear in T (the graph and its C grow with the steps; repeated
   steps share one C function, but lowering still visits every node), one program per length,
   and the output: the steps' states are joined by `stack` (padded views added up), whose
   generated loop tests every step's range for each element, O(T^2) work in all.
   Use it for fixed, short lengths (tens of steps) and for training inside larger graphs.
2. **Stepped, from Python** (`SequenceRunner`). A handful of small programs are compiled once,
   with the number of steps ``s`` and the batch ``b`` symbolic: per layer input size, the input
   projection for all steps (one matmul), one cell step (the state is an input and an output,
   ``Graph.update``-style, fed back by the runner), and for training the step's backward (built by
   `lm.grad` from the step's gate arithmetic; ``W_hh h + b_hh`` is kept from the forward step, so
   only ``d_gh W_hh`` is a matmul) and the weight gradients of the whole sequence (two matmuls over
   s * b rows). Python calls the step program T times per layer and direction. Compile time does
   not depend on the length at all, and any length runs without recompiling; the price is one
   program call per step (Python and binding overhead, tens of microseconds) and no fusion across
   steps. Gradients through time come from `SequenceRunner.backward` (truncation-free BPTT).
   ``SequenceRunner(..., chunk=K)`` mixes the two: a K-step unrolled program runs K steps per
   call, so the call overhead falls K-fold for a compile time that grows with K, not with T.

Measured (``tests/test_rnn.py -s`` and ``bench/zoo_rnn.py`` print these; a shared 2-core machine
under load): an unrolled LSTM(16, 32) has ~210 primitive nodes per step and builds + compiles in
3.5 s at 10 steps, 19 s at 50 (5.9 s / 15.9 s at 8 / 32 in another run): linear in T, so 1,000
unrolled steps would take minutes. The runner compiles before it knows the length (an LSTM(8, 16):
0.3 s with the C cached, 3.2 s cold) and then runs 10 or 1,000 steps on the same programs; its
per-step overhead is ~70 us on the cpu backend. With chunk=8, a bidirectional LSTM(8, 16) over
1,003 steps (batch 2) ran in 134 ms instead of 339 ms (its 8-step program: 9.7 s to compile cold,
1.7 s with the C cached; chunk=32 compiled in 50 s and was no faster). So: unroll for short fixed
lengths and for training inside a larger graph; step (in chunks of ~8) for long or run-time lengths.

Deviations from torch: ``proj_size`` (LSTM projections) is unsupported; packed sequences are not
supported (pad and mask instead); dropout between layers uses luminar's seeded counter-based
masks (nn.Dropout), so the masks differ from torch's; `SequenceRunner` refuses training-mode
dropout (use the unrolled graph, or ``eval()``).
"""
from __future__ import annotations

import numpy as np

from ..autograd import grad
from ..errors import DTypeError, ShapeError, UnsupportedError, ValueDomainError
from ..graph import Graph, show_shape
from ..library.elementwise import relu, sigmoid, tanh
from ..library.indexing import cat, stack
from ..library.linalg import linear
from ..tensor import GraphTensor
from . import init
from .dropout import Dropout
from .layers import linear_rows, positive_int
from .module import Module, Parameter

GATES = {"RNN_TANH": 1, "RNN_RELU": 1, "LSTM": 4, "GRU": 3}
PUBLIC_NAME = {"RNN_TANH": "RNN", "RNN_RELU": "RNN", "LSTM": "LSTM", "GRU": "GRU"}


# -- the cell update: one time step, shared by the unrolled graph, the cells and the runner ----------
def cell_update(mode: str, gx: GraphTensor, gh: GraphTensor, h: GraphTensor, c: GraphTensor | None):
    """(h', c') of one step from the projections gx = W_ih x + b_ih and gh = W_hh h + b_hh.

    c is the LSTM's cell state (None for the others; c' is then None too); h is read by the GRU only.
    """
    if mode in ("RNN_TANH", "RNN_RELU"):
        total = gx + gh
        return (tanh(total) if mode == "RNN_TANH" else relu(total)), None
    size = gh.shape[-1] // GATES[mode]
    if mode == "LSTM":
        gates = gx + gh
        i, f, g, o = (gates[..., k * size:(k + 1) * size] for k in range(4))
        c_next = sigmoid(f) * c + sigmoid(i) * tanh(g)
        return sigmoid(o) * tanh(c_next), c_next
    # GRU: the hidden projection of n is gated by r before it is added (torch's formula)
    r = sigmoid(gx[..., :size] + gh[..., :size])
    z = sigmoid(gx[..., size:2 * size] + gh[..., size:2 * size])
    n = tanh(gx[..., 2 * size:] + r * gh[..., 2 * size:])
    return (1.0 - z) * n + z * h, None


def _mode(name: str, nonlinearity: str) -> str:
    if name != "RNN":
        return name
    if nonlinearity not in ("tanh", "relu"):
        raise ValueDomainError(f"RNN: unknown nonlinearity {nonlinearity!r} (expected 'tanh' or 'relu')")
    return "RNN_TANH" if nonlinearity == "tanh" else "RNN_RELU"


def _check_input(op: str, input, batched_rank: int, input_size: int) -> bool:
    """Check a layer's or cell's input (a GraphTensor of the batched rank or one less); True if unbatched."""
    if not isinstance(input, GraphTensor):
        raise UnsupportedError(f"{op}: input must be a GraphTensor, got {type(input).__name__}")
    if input.ndim not in (batched_rank, batched_rank - 1):
        raise ShapeError(f"{op}: expected a {batched_rank}-D (batched) or {batched_rank - 1}-D (unbatched) input, "
                         f"got shape {show_shape(input.dims)}")
    if input.dims[-1] != input_size:
        raise ShapeError(f"{op}: input has {input.dims[-1]} features (last dim of shape {show_shape(input.dims)}), "
                         f"expected input_size={input_size}")
    return input.ndim == batched_rank - 1


def _check_state(op: str, what: str, state, expected: tuple) -> None:
    if not isinstance(state, GraphTensor):
        raise UnsupportedError(f"{op}: {what} must be a GraphTensor, got {type(state).__name__}")
    if tuple(state.dims) != tuple(expected):
        raise ShapeError(f"{op}: expected {what} of shape {show_shape(expected)}, got {show_shape(state.dims)}")


# -- the recurrent layers ------------------------------------------------------------------------------
class RNNBase(Module):
    """What RNN, LSTM and GRU share: the parameters (torch's names and order) and the unrolled forward."""

    def __init__(self, mode: str, input_size: int, hidden_size: int, num_layers: int = 1, bias: bool = True,
                 batch_first: bool = False, dropout: float = 0.0, bidirectional: bool = False, proj_size: int = 0,
                 *, rng=None, prefix: str = ""):
        super().__init__(prefix=prefix)
        name = PUBLIC_NAME[mode]
        self.mode = mode
        self.input_size = positive_int(name, "input_size", input_size)
        self.hidden_size = positive_int(name, "hidden_size", hidden_size)
        self.num_layers = positive_int(name, "num_layers", num_layers)
        if proj_size:
            raise UnsupportedError(f"{name}: proj_size (LSTM projections) is not supported")
        if isinstance(dropout, bool) or not isinstance(dropout, (int, float)) or not 0.0 <= dropout <= 1.0:
            raise ValueDomainError(f"{name}: dropout must be a number in [0, 1], got {dropout!r}")
        self.bias, self.batch_first, self.bidirectional = bool(bias), bool(batch_first), bool(bidirectional)
        self.dropout, self.proj_size = float(dropout), 0
        self.num_directions = 2 if bidirectional else 1
        rng, bound = init.generator(rng), init.fan_in_bound(hidden_size)  # torch: U(-1/sqrt(H), 1/sqrt(H)) for all
        rows = GATES[mode] * hidden_size
        for layer in range(num_layers):
            layer_input = input_size if layer == 0 else hidden_size * self.num_directions
            for suffix in self._suffixes():
                self.register_parameter(f"weight_ih_l{layer}{suffix}", init.uniform(rng, (rows, layer_input), bound))
                self.register_parameter(f"weight_hh_l{layer}{suffix}", init.uniform(rng, (rows, hidden_size), bound))
                if bias:
                    self.register_parameter(f"bias_ih_l{layer}{suffix}", init.uniform(rng, (rows,), bound))
                    self.register_parameter(f"bias_hh_l{layer}{suffix}", init.uniform(rng, (rows,), bound))
        # between layers only; its seed is a non-persistent buffer, so state_dict stays torch's
        self.between_layers = Dropout(self.dropout, rng=rng) if self.dropout and num_layers > 1 else None

    def _suffixes(self) -> tuple[str, ...]:
        return ("", "_reverse") if self.bidirectional else ("",)

    def layer_parameters(self, graph: Graph, layer: int, suffix: str):
        """(weight_ih, weight_hh, bias_ih, bias_hh) of one layer and direction as graph tensors (biases may be None)."""
        names = [f"{kind}_l{layer}{suffix}" for kind in ("weight_ih", "weight_hh", "bias_ih", "bias_hh")]
        return tuple(self._optional_tensor(graph, n) for n in names)

    @property
    def _name(self) -> str:
        return PUBLIC_NAME[self.mode]

    def _initial_states(self, hx, batch, unbatched: bool):
        """hx as a list of per-(layer, direction) states [(h0, c0 or None), ...] (None where not given)."""
        count, hidden = self.num_layers * self.num_directions, self.hidden_size
        expected = (count, hidden) if unbatched else (count, batch, hidden)
        lstm = self.mode == "LSTM"
        if hx is None:
            return [(None, None)] * count
        if lstm:
            if not isinstance(hx, (tuple, list)) or len(hx) != 2:
                raise UnsupportedError(f"LSTM: hx must be a tuple (h0, c0), got {type(hx).__name__}")
            states = [("h0", hx[0]), ("c0", hx[1])]
        else:
            states = [("h0", hx)]
        for what, state in states:
            _check_state(self._name, what, state, expected)
        h0 = [states[0][1][k] for k in range(count)]
        c0 = [states[1][1][k] for k in range(count)] if lstm else [None] * count
        if unbatched:  # the steps run on (1, hidden) rows
            h0 = [h.unsqueeze(0) for h in h0]
            c0 = [c.unsqueeze(0) if c is not None else None for c in c0]
        return list(zip(h0, c0))

    def forward(self, input: GraphTensor, hx=None):
        """(output, h_n) as torch returns them ((output, (h_n, c_n)) for LSTM), the steps unrolled.

        input is (T, B, input_size) ((B, T, input_size) with batch_first) or unbatched (T, input_size);
        T must be a concrete int (see the module docstring; SequenceRunner runs run-time lengths).
        """
        name = self._name
        unbatched = _check_input(name, input, 3, self.input_size)
        x = input.unsqueeze(1) if unbatched else (input.transpose(0, 1) if self.batch_first else input)
        steps = x.dims[0]
        if not steps.is_const:
            raise UnsupportedError(f"{name}: the time axis of shape {show_shape(input.dims)} is symbolic ({steps}); "
                                   f"an unrolled graph needs a concrete length: use nn.SequenceRunner for "
                                   f"run-time lengths")
        if steps.value < 1:
            raise ShapeError(f"{name}: the input has no time steps (shape {show_shape(input.dims)})")
        states = self._initial_states(hx, x.dims[1], unbatched)
        graph, finals = input.graph, []
        for layer in range(self.num_layers):
            outputs = []
            for direction, suffix in enumerate(self._suffixes()):
                h0, c0 = states[layer * self.num_directions + direction]
                sequence, h, c = self._unrolled_layer(graph, x, layer, suffix, reverse=direction == 1, h0=h0, c0=c0)
                outputs.append(sequence)
                finals.append((h, c))
            x = outputs[0] if len(outputs) == 1 else cat(outputs, -1)
            if self.between_layers is not None and layer < self.num_layers - 1:
                x = self.between_layers(x)
        output = x[:, 0] if unbatched else (x.transpose(0, 1) if self.batch_first else x)
        h_n = stack([h[0] if unbatched else h for h, _ in finals], 0)
        if self.mode != "LSTM":
            return output, h_n
        return output, (h_n, stack([c[0] if unbatched else c for _, c in finals], 0))

    def _unrolled_layer(self, graph, x, layer, suffix, reverse, h0, c0):
        """One layer and direction over all steps of x (T, B, F): (outputs (T, B, H), h_T, c_T)."""
        w_ih, w_hh, b_ih, b_hh = self.layer_parameters(graph, layer, suffix)
        steps, batch = x.dims[0].value, x.dims[1]
        gx_all = linear_rows(x, w_ih, b_ih)  # every step's input projection in one matmul
        zeros = graph.constant(0.0, (batch, self.hidden_size))
        h = h0 if h0 is not None else zeros
        c = (c0 if c0 is not None else zeros) if self.mode == "LSTM" else None
        outputs = [None] * steps
        for t in (reversed(range(steps)) if reverse else range(steps)):
            h, c = cell_update(self.mode, gx_all[t], linear(h, w_hh, b_hh), h, c)
            outputs[t] = h
        return stack(outputs, 0), h, c

    def extra_repr(self) -> str:
        extra = [f"{self.input_size}, {self.hidden_size}"]
        if self.num_layers != 1:
            extra.append(f"num_layers={self.num_layers}")
        if self.mode == "RNN_RELU":
            extra.append("nonlinearity='relu'")
        for flag, default in (("bias", True), ("batch_first", False), ("bidirectional", False)):
            if getattr(self, flag) != default:
                extra.append(f"{flag}={getattr(self, flag)}")
        if self.dropout:
            extra.append(f"dropout={self.dropout}")
        return ", ".join(extra)


class RNN(RNNBase):
    """torch.nn.RNN(input_size, hidden_size, num_layers=1, nonlinearity='tanh', bias=True, batch_first=False,
    dropout=0.0, bidirectional=False): returns (output, h_n)."""

    def __init__(self, input_size: int, hidden_size: int, num_layers: int = 1, nonlinearity: str = "tanh",
                 bias: bool = True, batch_first: bool = False, dropout: float = 0.0, bidirectional: bool = False,
                 *, rng=None, prefix: str = ""):
        super().__init__(_mode("RNN", nonlinearity), input_size, hidden_size, num_layers, bias, batch_first,
                         dropout, bidirectional, rng=rng, prefix=prefix)
        self.nonlinearity = nonlinearity


class LSTM(RNNBase):
    """torch.nn.LSTM(input_size, hidden_size, num_layers=1, bias=True, batch_first=False, dropout=0.0,
    bidirectional=False): returns (output, (h_n, c_n)); hx is (h0, c0). Gate order i, f, g, o."""

    def __init__(self, input_size: int, hidden_size: int, num_layers: int = 1, bias: bool = True,
                 batch_first: bool = False, dropout: float = 0.0, bidirectional: bool = False, proj_size: int = 0,
                 *, rng=None, prefix: str = ""):
        super().__init__("LSTM", input_size, hidden_size, num_layers, bias, batch_first, dropout, bidirectional,
                         proj_size, rng=rng, prefix=prefix)


class GRU(RNNBase):
    """torch.nn.GRU(input_size, hidden_size, num_layers=1, bias=True, batch_first=False, dropout=0.0,
    bidirectional=False): returns (output, h_n). Gate order r, z, n."""

    def __init__(self, input_size: int, hidden_size: int, num_layers: int = 1, bias: bool = True,
                 batch_first: bool = False, dropout: float = 0.0, bidirectional: bool = False,
                 *, rng=None, prefix: str = ""):
        super().__init__("GRU", input_size, hidden_size, num_layers, bias, batch_first, dropout, bidirectional,
                         rng=rng, prefix=prefix)


# -- the cells -----------------------------------------------------------------------------------------
class RNNCellBase(Module):
    """What RNNCell, LSTMCell and GRUCell share: weight_ih, weight_hh, bias_ih, bias_hh as torch names them."""

    def __init__(self, mode: str, input_size: int, hidden_size: int, bias: bool = True, *, rng=None,
                 prefix: str = ""):
        super().__init__(prefix=prefix)
        name = PUBLIC_NAME[mode] + "Cell"
        self.mode = mode
        self.input_size = positive_int(name, "input_size", input_size)
        self.hidden_size = positive_int(name, "hidden_size", hidden_size)
        self.bias = bool(bias)
        rng, bound = init.generator(rng), init.fan_in_bound(hidden_size)
        rows = GATES[mode] * hidden_size
        self.weight_ih = Parameter(init.uniform(rng, (rows, input_size), bound))
        self.weight_hh = Parameter(init.uniform(rng, (rows, hidden_size), bound))
        self.register_parameter("bias_ih", init.uniform(rng, (rows,), bound) if bias else None)
        self.register_parameter("bias_hh", init.uniform(rng, (rows,), bound) if bias else None)

    def forward(self, input: GraphTensor, hx=None):
        """h' (RNNCell, GRUCell) or (h', c') (LSTMCell, hx = (h, c)); input (B, input_size) or unbatched (input_size,)."""
        name = PUBLIC_NAME[self.mode] + "Cell"
        unbatched = _check_input(name, input, 2, self.input_size)
        graph = input.graph
        x = input.unsqueeze(0) if unbatched else input
        expected = (self.hidden_size,) if unbatched else (x.dims[0], self.hidden_size)
        zeros = graph.constant(0.0, (x.dims[0], self.hidden_size))
        lstm = self.mode == "LSTM"
        if hx is None:
            h, c = zeros, (zeros if lstm else None)
        else:
            if lstm and (not isinstance(hx, (tuple, list)) or len(hx) != 2):
                raise UnsupportedError(f"LSTMCell: hx must be a tuple (h, c), got {type(hx).__name__}")
            given = list(zip(("h", "c"), hx)) if lstm else [("h", hx)]
            for what, state in given:
                _check_state(name, what, state, expected)
            states = [s.unsqueeze(0) if unbatched else s for _, s in given]
            h, c = states[0], (states[1] if lstm else None)
        w_ih, w_hh = self.graph_tensor(graph, "weight_ih"), self.graph_tensor(graph, "weight_hh")
        b_ih, b_hh = self._optional_tensor(graph, "bias_ih"), self._optional_tensor(graph, "bias_hh")
        h, c = cell_update(self.mode, linear(x, w_ih, b_ih), linear(h, w_hh, b_hh), h, c)
        if unbatched:
            h, c = h[0], (c[0] if c is not None else None)
        return (h, c) if lstm else h

    def extra_repr(self) -> str:
        extra = f"{self.input_size}, {self.hidden_size}" + ("" if self.bias else ", bias=False")
        return extra + (", nonlinearity='relu'" if self.mode == "RNN_RELU" else "")


class RNNCell(RNNCellBase):
    """torch.nn.RNNCell(input_size, hidden_size, bias=True, nonlinearity='tanh')."""

    def __init__(self, input_size: int, hidden_size: int, bias: bool = True, nonlinearity: str = "tanh",
                 *, rng=None, prefix: str = ""):
        super().__init__(_mode("RNN", nonlinearity), input_size, hidden_size, bias, rng=rng, prefix=prefix)
        self.nonlinearity = nonlinearity


class LSTMCell(RNNCellBase):
    """torch.nn.LSTMCell(input_size, hidden_size, bias=True): returns (h', c')."""

    def __init__(self, input_size: int, hidden_size: int, bias: bool = True, *, rng=None, prefix: str = ""):
        super().__init__("LSTM", input_size, hidden_size, bias, rng=rng, prefix=prefix)


class GRUCell(RNNCellBase):
    """torch.nn.GRUCell(input_size, hidden_size, bias=True)."""

    def __init__(self, input_size: int, hidden_size: int, bias: bool = True, *, rng=None, prefix: str = ""):
        super().__init__("GRU", input_size, hidden_size, bias, rng=rng, prefix=prefix)


# -- run-time lengths: compiled once, stepped from Python -----------------------------------------------
def _float32(value, what: str) -> np.ndarray:
    """A caller's array (numpy, a CPU torch tensor, nested lists) as float32, or a DTypeError naming it."""
    if hasattr(value, "detach"):
        value = value.detach().cpu().numpy()
    try:
        return np.asarray(value, dtype=np.float32)
    except (TypeError, ValueError) as e:
        raise DTypeError(f"{what}: cannot read {type(value).__name__} as a float32 array ({e})") from None


class _Steps:
    """Calls one compiled step program many times with arrays of the same shapes.

    The first call goes through Program.run (every input checked, dims bound); the following
    ones only swap the per-step arrays into the checked set and call the backend's execute,
    which halves the per-step overhead (~150 -> ~70 us on the cpu backend). The runner builds
    every per-step array itself (float32, C-contiguous, the first call's shapes), so the checks
    would only repeat.
    """

    def __init__(self, program, fixed: dict[str, np.ndarray]):
        self.program, self.fixed, self.bound = program, fixed, None

    def __call__(self, **arrays) -> dict[str, np.ndarray]:
        if self.bound is None:
            self.bound = self.program.bind({**self.fixed, **arrays}, {})
            return self.program.execute(*self.bound)
        checked, env = self.bound
        checked.update(arrays)
        return self.program.execute(checked, env)


class SequenceRunner:
    """Runs an nn.RNN / LSTM / GRU over numpy sequences of any length, compiled once (see the module docstring).

        runner = nn.SequenceRunner(lstm, backend="cpu")
        output, (h_n, c_n) = runner(x)                 # x: numpy, torch's layout and conventions
        grads = runner.backward(d_output, d_h_n, d_c_n)  # {"input": ..., "h0": ..., "weight_ih_l0": ...}

    The programs have the step count ``s`` and the batch ``b`` symbolic, so new lengths and batch
    sizes never recompile. ``chunk=K`` (> 1) also compiles K steps unrolled into one program and
    runs the steps K at a time while K are left (then single steps): K times fewer calls for a
    K-step program's compile time (the mix of unrolling and stepping; forward only, the backward
    still steps one at a time). `compile_options` go to every `Graph.compile` (e.g. ``search=30,
    search_dims={"b": 16, "s": 128}`` to pick the step's matmul schedule by measurement). Weights are read from the module at each call (so training it between
    calls works). `backward` differentiates the last call (backpropagation through time over the
    whole sequence), returning the gradients of sum(output * d_output) + sum(h_n * d_h_n) (+ c_n's),
    torch's `backward(...)` semantics, under torch's parameter names.
    """

    def __init__(self, module: RNNBase, backend: str = "cpu", *, chunk: int = 1, **compile_options):
        if not isinstance(module, RNNBase):
            raise UnsupportedError(f"SequenceRunner runs nn.RNN, nn.LSTM or nn.GRU, got {type(module).__name__}")
        self.module, self.backend, self.compile_options = module, backend, compile_options
        self.chunk = positive_int("SequenceRunner", "chunk", chunk)
        self._programs: dict[tuple, object] = {}
        self._saved = None
        # compile what forward needs now: the step (the same for every layer), the chunk of steps if
        # asked for, and each input size's projection
        self._program("step")
        if self.chunk > 1:
            self._program("chunk", self.chunk)
        for size in {self._layer_input(layer) for layer in range(module.num_layers)}:
            self._program("projection", size)

    # -- the compiled pieces --------------------------------------------------------------------------
    def _layer_input(self, layer: int) -> int:
        m = self.module
        return m.input_size if layer == 0 else m.hidden_size * m.num_directions

    def _program(self, kind: str, size: int = 0):
        key = (kind, size)
        if key not in self._programs:
            graph = Graph()
            getattr(self, f"_build_{kind}")(graph, size)
            options = dict(self.compile_options)
            if "search_dims" in options:  # the step graphs have no `s`: give each graph only its own dims
                options["search_dims"] = {d: v for d, v in options["search_dims"].items() if d in graph.dims()}
            self._programs[key] = graph.compile(self.backend, **options)
        return self._programs[key]

    def _weights(self, graph: Graph, which: str, size: int):
        rows = GATES[self.module.mode] * self.module.hidden_size
        weight = graph.tensor(f"weight_{which}", (rows, size))
        return weight, (graph.tensor(f"bias_{which}", (rows,)) if self.module.bias else None)

    def _state_inputs(self, graph: Graph):
        hidden, lstm = self.module.hidden_size, self.module.mode == "LSTM"
        rows = GATES[self.module.mode] * hidden
        gx, h = graph.tensor("gx", ("b", rows)), graph.tensor("h", ("b", hidden))
        c = graph.tensor("c", ("b", hidden)) if lstm else None
        weight, bias = self._weights(graph, "hh", hidden)
        gh = linear(h, weight, bias)
        return gx, gh, h, c

    def _build_step(self, graph: Graph, size: int) -> None:
        gx, gh, h, c = self._state_inputs(graph)
        h_next, c_next = cell_update(self.module.mode, gx, gh, h, c)
        h_next.output("h_next")
        if c_next is not None:
            c_next.output("c_next")
        gh.output("gh")  # kept for the backward step, which then needs no second matmul

    def _build_chunk(self, graph: Graph, size: int) -> None:
        """`size` steps unrolled in one program (the mix of both ways): one call instead of `size`.

        Inputs gx (size, b, rows) in the order the steps run, h (and c); outputs every step's h
        ("hs"), c ("cs") and W_hh h + b_hh ("gh"), stacked in that order."""
        m = self.module
        rows = GATES[m.mode] * m.hidden_size
        gx = graph.tensor("gx", (size, "b", rows))
        h = graph.tensor("h", ("b", m.hidden_size))
        c = graph.tensor("c", ("b", m.hidden_size)) if m.mode == "LSTM" else None
        weight, bias = self._weights(graph, "hh", m.hidden_size)
        hs, cs, ghs = [], [], []
        for t in range(size):
            gh = linear(h, weight, bias)
            h, c = cell_update(m.mode, gx[t], gh, h, c)
            hs.append(h), cs.append(c), ghs.append(gh)
        stack(hs, 0).output("hs")
        stack(ghs, 0).output("gh")
        if c is not None:
            stack(cs, 0).output("cs")

    def _build_step_backward(self, graph: Graph, size: int) -> None:
        """One step's vector-Jacobian product: from d h_next (and d c_next) to d gx, d gh, d h, d c.

        gh (W_hh h + b_hh) comes from the forward step, so the gates are recomputed without the
        matmul; d h is what flows through gh (d_gh W_hh) plus what the update uses h for directly
        (the GRU's z h).
        """
        hidden, mode = self.module.hidden_size, self.module.mode
        rows = GATES[mode] * hidden
        gx, gh = graph.tensor("gx", ("b", rows)), graph.tensor("gh", ("b", rows))
        h = graph.tensor("h", ("b", hidden)) if mode == "GRU" else None  # the others read h only through gh
        c = graph.tensor("c", ("b", hidden)) if mode == "LSTM" else None
        h_next, c_next = cell_update(mode, gx, gh, h, c)
        loss = (h_next * graph.tensor("d_h_next", ("b", hidden))).sum()
        if c_next is not None:
            loss = loss + (c_next * graph.tensor("d_c_next", ("b", hidden))).sum()
        wanted = [gx, gh] + ([h] if mode == "GRU" else []) + ([c] if c is not None else [])
        grads = dict(zip(["d_gx", "d_gh"] + (["d_h"] if mode == "GRU" else []) + (["d_c"] if c is not None else []),
                         grad(loss, wanted)))
        through_gh = grads["d_gh"] @ graph.tensor("weight_hh", (rows, hidden))
        grads["d_h"] = grads["d_h"] + through_gh if "d_h" in grads else through_gh
        for name, value in grads.items():
            value.output(name)

    def _build_projection(self, graph: Graph, size: int) -> None:
        weight, bias = self._weights(graph, "ih", size)
        linear_rows(graph.tensor("x", ("s", "b", size)), weight, bias).output("gx")

    def _build_projection_backward(self, graph: Graph, size: int, which: str = "ih") -> None:
        """The gradients of a projection over the whole sequence: its weight, bias (and input, for ih)."""
        weight, bias = self._weights(graph, which, size)
        x = graph.tensor("x", ("s", "b", size))
        rows = GATES[self.module.mode] * self.module.hidden_size
        loss = (linear_rows(x, weight, bias) * graph.tensor("d_g", ("s", "b", rows))).sum()
        wanted = ([x] if which == "ih" else []) + [weight] + ([bias] if bias is not None else [])
        names = (["d_x"] if which == "ih" else []) + ["d_weight", "d_bias"]
        for name, value in zip(names, grad(loss, wanted)):
            value.output(name)

    def _build_hidden_backward(self, graph: Graph, size: int) -> None:
        self._build_projection_backward(graph, size, which="hh")

    def _parameters(self, layer: int, suffix: str) -> dict[str, np.ndarray]:
        m = self.module
        arrays = {"weight_ih": m._parameters[f"weight_ih_l{layer}{suffix}"],
                  "weight_hh": m._parameters[f"weight_hh_l{layer}{suffix}"]}
        if m.bias:
            arrays["bias_ih"] = m._parameters[f"bias_ih_l{layer}{suffix}"]
            arrays["bias_hh"] = m._parameters[f"bias_hh_l{layer}{suffix}"]
        return arrays

    # -- checking the caller's arrays ----------------------------------------------------------------
    def _time_major(self, input) -> tuple[np.ndarray, bool]:
        m, name = self.module, self.module._name
        x = _float32(input, f"{name}: input")
        if x.ndim not in (2, 3):
            raise ShapeError(f"{name}: expected a 3-D (batched) or 2-D (unbatched) input, got shape {x.shape}")
        if x.shape[-1] != m.input_size:
            raise ShapeError(f"{name}: input has {x.shape[-1]} features (last dim of shape {x.shape}), "
                             f"expected input_size={m.input_size}")
        unbatched = x.ndim == 2
        x = x[:, None] if unbatched else (x.transpose(1, 0, 2) if m.batch_first else x)
        if x.shape[0] < 1 or x.shape[1] < 1:
            raise ShapeError(f"{name}: the input has no time steps or no batch (shape {input.shape})")
        return np.ascontiguousarray(x), unbatched

    def _states(self, what: str, value, batch: int, unbatched: bool) -> np.ndarray:
        m = self.module
        count = m.num_layers * m.num_directions
        if value is None:
            return np.zeros((count, batch, m.hidden_size), np.float32)
        state = _float32(value, f"{m._name}: {what}")
        expected = (count, m.hidden_size) if unbatched else (count, batch, m.hidden_size)
        if state.shape != expected:
            raise ShapeError(f"{m._name}: expected {what} of shape {expected}, got {state.shape}")
        return state[:, None] if unbatched else state

    def _split_hx(self, hx):
        if self.module.mode != "LSTM":
            return hx, None
        if hx is None:
            return None, None
        if not isinstance(hx, (tuple, list)) or len(hx) != 2:
            raise UnsupportedError(f"LSTM: hx must be a tuple (h0, c0), got {type(hx).__name__}")
        return hx

    # -- running -------------------------------------------------------------------------------------
    def __call__(self, input, hx=None):
        """(output, h_n), or (output, (h_n, c_n)) for an LSTM, as numpy arrays in torch's layout."""
        m = self.module
        if m.training and m.between_layers is not None:
            raise UnsupportedError(f"SequenceRunner: {m._name} has dropout between layers in training mode; "
                                   f"call .eval() or use the unrolled graph (module(x) on a GraphTensor)")
        x, unbatched = self._time_major(input)
        steps, batch = x.shape[:2]
        h0_given, c0_given = self._split_hx(hx)
        h0 = self._states("h0", h0_given, batch, unbatched)
        c0 = self._states("c0", c0_given, batch, unbatched) if m.mode == "LSTM" else None
        lstm = m.mode == "LSTM"
        saved, h_n, c_n = [], [], []
        for layer in range(m.num_layers):
            outputs = []
            for direction, suffix in enumerate(m._suffixes()):
                k = layer * m.num_directions + direction
                params = self._parameters(layer, suffix)
                projection = self._program("projection", self._layer_input(layer))
                gx = projection(x=x, weight_ih=params["weight_ih"],
                                **({"bias_ih": params["bias_ih"]} if m.bias else {}))["gx"]
                hidden_params = {"weight_hh": params["weight_hh"],
                                 **({"bias_hh": params["bias_hh"]} if m.bias else {})}
                h, c = np.ascontiguousarray(h0[k]), (np.ascontiguousarray(c0[k]) if lstm else None)
                out, gh, h_prev, c_prev, h, c = self._recurrence(gx, h, c, hidden_params, reverse=direction == 1)
                outputs.append(out)
                h_n.append(h)
                c_n.append(c)
                saved.append((x, gx, gh, h_prev, c_prev))
            x = outputs[0] if len(outputs) == 1 else np.concatenate(outputs, -1)
        self._saved = (saved, unbatched, steps, batch)
        output = x[:, 0] if unbatched else (x.transpose(1, 0, 2) if m.batch_first else x)
        h_n = np.stack(h_n)[:, 0] if unbatched else np.stack(h_n)
        if not lstm:
            return np.ascontiguousarray(output), h_n
        c_n = np.stack(c_n)[:, 0] if unbatched else np.stack(c_n)
        return np.ascontiguousarray(output), (h_n, c_n)

    def _recurrence(self, gx, h, c, hidden_params, reverse: bool):
        """One layer and direction over all steps: (outputs, gh, h before each step, c before each step, h, c).

        Runs `chunk` steps per program call while that many are left, then single steps."""
        steps, lstm = gx.shape[0], self.module.mode == "LSTM"
        gh, h_prev = np.empty_like(gx), np.empty(gx.shape[:2] + (h.shape[-1],), np.float32)
        out, c_prev = np.empty_like(h_prev), (np.empty_like(h_prev) if lstm else None)
        order = list(range(steps - 1, -1, -1) if reverse else range(steps))
        single = _Steps(self._program("step"), hidden_params)
        chunked = _Steps(self._program("chunk", self.chunk), hidden_params) if self.chunk > 1 else None
        position = 0
        while position < steps:
            if chunked is not None and steps - position >= self.chunk:
                ts = order[position:position + self.chunk]  # in the order they run
                state = {"h": h, "c": c} if lstm else {"h": h}
                result = chunked(gx=np.ascontiguousarray(gx[ts]), **state)
                hs = result["hs"]
                h_prev[ts] = np.concatenate([h[None], hs[:-1]])
                out[ts], gh[ts], h = hs, result["gh"], np.ascontiguousarray(hs[-1])
                if lstm:
                    c_prev[ts] = np.concatenate([c[None], result["cs"][:-1]])
                    c = np.ascontiguousarray(result["cs"][-1])
                position += self.chunk
                continue
            t = order[position]
            h_prev[t] = h
            if lstm:
                c_prev[t] = c
                result = single(gx=gx[t], h=h, c=c)
                c = result["c_next"]
            else:
                result = single(gx=gx[t], h=h)
            h = result["h_next"]
            out[t], gh[t] = h, result["gh"]
            position += 1
        return out, gh, h_prev, c_prev, h, c

    def backward(self, grad_output, grad_h_n=None, grad_c_n=None) -> dict[str, np.ndarray]:
        """Gradients of the last call: {"input", "h0", ("c0"), and every parameter by torch's name}."""
        m = self.module
        if self._saved is None:
            raise UnsupportedError("SequenceRunner.backward: run the sequence forward first")
        saved, unbatched, steps, batch = self._saved
        lstm, hidden = m.mode == "LSTM", m.hidden_size
        d_out = _float32(grad_output, f"{m._name}.backward: grad_output")
        width = hidden * m.num_directions
        expected = (steps, width) if unbatched else ((batch, steps, width) if m.batch_first else (steps, batch, width))
        if d_out.shape != expected:
            raise ShapeError(f"{m._name}.backward: expected grad_output of shape {expected}, got {d_out.shape}")
        d_out = d_out[:, None] if unbatched else (d_out.transpose(1, 0, 2) if m.batch_first else d_out)
        d_hn = self._states("grad_h_n", grad_h_n, batch, unbatched)
        d_cn = self._states("grad_c_n", grad_c_n, batch, unbatched) if lstm else None
        step_backward = self._program("step_backward")
        grads: dict[str, np.ndarray] = {}
        d_h0, d_c0 = np.empty_like(d_hn), (np.empty_like(d_cn) if lstm else None)
        for layer in reversed(range(m.num_layers)):
            d_input = None
            for direction, suffix in enumerate(m._suffixes()):
                k = layer * m.num_directions + direction
                x, gx, gh, h_prev, c_prev = saved[k]
                params = self._parameters(layer, suffix)
                hidden_params = {"weight_hh": params["weight_hh"],
                                 **({"bias_hh": params["bias_hh"]} if m.bias else {})}
                d_gx, d_gh = np.empty_like(gx), np.empty_like(gx)
                dh, dc = d_hn[k], (d_cn[k] if lstm else None)
                columns = slice(direction * hidden, (direction + 1) * hidden)
                call = _Steps(step_backward, {"weight_hh": params["weight_hh"]})
                for t in (range(steps) if direction else range(steps - 1, -1, -1)):  # forward order reversed
                    inputs = dict(gx=gx[t], gh=gh[t], d_h_next=np.ascontiguousarray(dh + d_out[t][:, columns]))
                    if m.mode == "GRU":
                        inputs["h"] = h_prev[t]
                    if lstm:
                        inputs.update(c=c_prev[t], d_c_next=np.ascontiguousarray(dc))
                    result = call(**inputs)
                    d_gx[t], d_gh[t], dh = result["d_gx"], result["d_gh"], result["d_h"]
                    dc = result["d_c"] if lstm else None
                d_h0[k] = dh
                if lstm:
                    d_c0[k] = dc
                size = self._layer_input(layer)
                ih = self._program("projection_backward", size)(
                    x=x, d_g=d_gx, weight_ih=params["weight_ih"], **({"bias_ih": params["bias_ih"]} if m.bias else {}))
                hh = self._program("hidden_backward", hidden)(x=h_prev, d_g=d_gh, **hidden_params)
                grads[f"weight_ih_l{layer}{suffix}"] = ih["d_weight"]
                grads[f"weight_hh_l{layer}{suffix}"] = hh["d_weight"]
                if m.bias:
                    grads[f"bias_ih_l{layer}{suffix}"] = ih["d_bias"]
                    grads[f"bias_hh_l{layer}{suffix}"] = hh["d_bias"]
                d_input = ih["d_x"] if d_input is None else d_input + ih["d_x"]
            d_out = d_input
        d_x = d_out[:, 0] if unbatched else (d_out.transpose(1, 0, 2) if m.batch_first else d_out)
        result = {"input": np.ascontiguousarray(d_x), "h0": d_h0[:, 0] if unbatched else d_h0}
        if lstm:
            result["c0"] = d_c0[:, 0] if unbatched else d_c0
        order = [name for name, _ in m.named_parameters()]
        return {**result, **{name: grads[name] for name in order}}
