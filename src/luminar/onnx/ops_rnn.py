"""ONNX RNN, LSTM and GRU, unrolled over their (static) sequence length.

The input projection of every time step is one matmul up front (X @ W^T + Wb + Rb); each step
then adds H_{t-1} @ R^T and applies the gates, exactly as the ONNX operator spec writes them
(gate orders: LSTM i, o, f, c; GRU z, r, h). Reverse directions walk the steps backwards and
write their outputs at the original positions. Variable `sequence_lens` (some sequences shorter
than the tensor) are unsupported; lengths all equal to the sequence length are accepted.
"""
from __future__ import annotations

import numpy as np

from ..errors import ShapeError, UnsupportedError
from ..library.indexing import stack
from .registry import dtype_of, known_dims, op


def _activation(name: str, alpha, beta):
    name = name.lower()
    table = {
        "sigmoid": lambda x: x.sigmoid(),
        "tanh": lambda x: x.tanh(),
        "relu": lambda x: x.relu(),
        "affine": lambda x: x * alpha + beta,
        "leakyrelu": lambda x: x.leaky_relu(alpha),
        "thresholdedrelu": lambda x: x * x.gt(alpha),
        "scaledtanh": lambda x: (x * beta).tanh() * alpha,
        "hardsigmoid": lambda x: (x * alpha + beta).clamp(0.0, 1.0),
        "elu": lambda x: x.elu(alpha),
        "softsign": lambda x: x.softsign(),
        "softplus": lambda x: x.relu() + (-x.abs()).exp().log1p(),
    }
    if name not in table:
        raise UnsupportedError(f"RNN activation {name!r}")
    return table[name]


_NEEDS_ALPHA = {"affine": 1.0, "leakyrelu": 0.01, "thresholdedrelu": 1.0, "scaledtanh": 1.0, "hardsigmoid": 0.2,
                "elu": 1.0}
_NEEDS_BETA = {"affine": 0.0, "scaledtanh": 1.0, "hardsigmoid": 0.5}


def _activations(ctx, defaults: list[str], directions: int):
    names = list(ctx.attr("activations", [])) or defaults * directions
    if len(names) == len(defaults):
        names = names * directions
    alphas, betas = list(ctx.attr("activation_alpha", [])), list(ctx.attr("activation_beta", []))
    out = []
    for name in names:
        key = name.lower()
        alpha = alphas.pop(0) if key in _NEEDS_ALPHA and alphas else _NEEDS_ALPHA.get(key, 0.0)
        beta = betas.pop(0) if key in _NEEDS_BETA and betas else _NEEDS_BETA.get(key, 0.0)
        out.append(_activation(name, alpha, beta))
    k = len(defaults)
    return [out[d * k:(d + 1) * k] for d in range(directions)]


class _Recurrence:
    """The inputs every recurrent op shares, checked and laid out time-major."""

    def __init__(self, ctx, x, w, r, b, sequence_lens, initial_h, gates: int):
        self.ctx = ctx
        self.layout = ctx.attr("layout", 0)
        xt = ctx.tensor(x)
        if xt.ndim != 3:
            raise ShapeError(f"X must be 3-D, got shape {xt.shape}")
        self.x = xt.transpose(0, 1) if self.layout else xt  # (seq, batch, input)
        self.seq = known_dims(self.x.dims[:1], "the sequence length of an unrolled RNN")[0]
        self.batch = self.x.dims[1]
        self.w, self.r = ctx.tensor(w), ctx.tensor(r)
        self.directions = known_dims(self.w.dims[:1], "num_directions")[0]
        self.hidden = ctx.attr("hidden_size") or known_dims(self.r.dims[2:], "hidden_size")[0]
        direction = ctx.attr("direction", "forward")
        expected = 2 if direction == "bidirectional" else 1
        if self.directions != expected:
            raise ShapeError(f"direction {direction!r} needs {expected} directions in W, got {self.directions}")
        self.reverse = [False, True] if direction == "bidirectional" else [direction == "reverse"]
        self.gates, self.clip = gates, ctx.attr("clip")
        self.b = None if b is None else ctx.tensor(b)
        if sequence_lens is not None:
            lens = ctx.const(sequence_lens, "sequence_lens", 4)
            if not np.all(lens == self.seq):
                raise UnsupportedError("sequence_lens shorter than the sequence (variable lengths)")
        self.h0 = None if initial_h is None else ctx.tensor(initial_h)
        if self.h0 is not None and self.layout:
            self.h0 = self.h0.transpose(0, 1)

    def initial(self, state, d):
        if state is None:
            return self.ctx.graph.constant(0.0, (self.batch, self.hidden))
        return state.narrow(0, d, 1).squeeze(0)

    def projected_inputs(self, d):
        """X @ W^T + Wb + Rb for every step: (seq, batch, gates * hidden)."""
        out = self.x @ self.w.narrow(0, d, 1).squeeze(0).mT
        if self.b is not None:
            size = self.gates * self.hidden
            bias = self.b.narrow(0, d, 1).squeeze(0)
            out = out + (bias.narrow(0, 0, size) + bias.narrow(0, size, size))
        return out

    def recurrent(self, d):
        return self.r.narrow(0, d, 1).squeeze(0).mT  # (hidden, gates * hidden)

    def gate(self, values, k):
        g = values.narrow(-1, k * self.hidden, self.hidden)
        return g.clamp(-self.clip, self.clip) if self.clip is not None else g

    def steps(self, d):
        return range(self.seq - 1, -1, -1) if self.reverse[d] else range(self.seq)

    def outputs(self, per_direction, finals, dtype, extra_finals=()):
        """Y (seq, dirs, batch, hidden) from each direction's per-step states, and Y_h (dirs, batch, hidden)."""
        ctx = self.ctx
        ys = [stack(states, 0) for states in per_direction]  # (seq, batch, hidden) each
        y = stack(ys, 1)
        y_h = stack(finals, 0)
        rest = [stack(f, 0) for f in extra_finals]
        if self.layout:
            y = y.permute(2, 0, 1, 3)
            y_h = y_h.transpose(0, 1)
            rest = [t.transpose(0, 1) for t in rest]
        return (ctx.traced(y, dtype), ctx.traced(y_h, dtype), *[ctx.traced(t, dtype) for t in rest])


@op("RNN")
def rnn(ctx, x, w, r, b=None, sequence_lens=None, initial_h=None):
    rec = _Recurrence(ctx, x, w, r, b, sequence_lens, initial_h, gates=1)
    acts = _activations(ctx, ["Tanh"], rec.directions)
    per_direction, finals = [], []
    for d in range(rec.directions):
        xw, rt = rec.projected_inputs(d), rec.recurrent(d)
        h = rec.initial(rec.h0, d)
        states = [None] * rec.seq
        for t in rec.steps(d):
            h = acts[d][0](rec.gate(xw.narrow(0, t, 1).squeeze(0) + h @ rt, 0))
            states[t] = h
        per_direction.append(states)
        finals.append(h)
    return rec.outputs(per_direction, finals, dtype_of(x))


@op("LSTM")
def lstm(ctx, x, w, r, b=None, sequence_lens=None, initial_h=None, initial_c=None, p=None):
    if ctx.attr("input_forget", 0):
        raise UnsupportedError("LSTM with input_forget=1")
    rec = _Recurrence(ctx, x, w, r, b, sequence_lens, initial_h, gates=4)
    c0 = None if initial_c is None else ctx.tensor(initial_c)
    if c0 is not None and rec.layout:
        c0 = c0.transpose(0, 1)
    peep = None if p is None else ctx.tensor(p)
    acts = _activations(ctx, ["Sigmoid", "Tanh", "Tanh"], rec.directions)
    per_direction, finals, cells = [], [], []
    n = rec.hidden
    for d in range(rec.directions):
        f, g, hact = acts[d]
        xw, rt = rec.projected_inputs(d), rec.recurrent(d)
        h, c = rec.initial(rec.h0, d), rec.initial(c0, d)
        pi = po = pf = None
        if peep is not None:
            pd = peep.narrow(0, d, 1).squeeze(0)
            pi, po, pf = pd.narrow(0, 0, n), pd.narrow(0, n, n), pd.narrow(0, 2 * n, n)
        states = [None] * rec.seq
        for t in rec.steps(d):
            z = xw.narrow(0, t, 1).squeeze(0) + h @ rt
            zi, zo, zf, zc = (z.narrow(-1, k * n, n) for k in range(4))
            if pi is not None:
                zi, zf = zi + pi * c, zf + pf * c
            clip = (lambda v: v.clamp(-rec.clip, rec.clip)) if rec.clip is not None else (lambda v: v)
            i_gate, f_gate, candidate = f(clip(zi)), f(clip(zf)), g(clip(zc))
            c = f_gate * c + i_gate * candidate
            if po is not None:
                zo = zo + po * c
            h = f(clip(zo)) * hact(c)
            states[t] = h
        per_direction.append(states)
        finals.append(h)
        cells.append(c)
    return rec.outputs(per_direction, finals, dtype_of(x), extra_finals=(cells,))


@op("GRU")
def gru(ctx, x, w, r, b=None, sequence_lens=None, initial_h=None):
    rec = _Recurrence(ctx, x, w, r, b, sequence_lens, initial_h, gates=3)
    acts = _activations(ctx, ["Sigmoid", "Tanh"], rec.directions)
    linear_before_reset = ctx.attr("linear_before_reset", 0)
    n = rec.hidden
    per_direction, finals = [], []
    for d in range(rec.directions):
        f, g = acts[d]
        x_only = rec.x @ rec.w.narrow(0, d, 1).squeeze(0).mT  # (seq, batch, 3n)
        rd = rec.r.narrow(0, d, 1).squeeze(0)  # (3n, hidden)
        if rec.b is not None:
            bias = rec.b.narrow(0, d, 1).squeeze(0)
            wb, rb = bias.narrow(0, 0, 3 * n), bias.narrow(0, 3 * n, 3 * n)
        else:
            wb = rb = ctx.graph.constant(0.0, (3 * n,))
        r_zr, r_h = rd.narrow(0, 0, 2 * n).mT, rd.narrow(0, 2 * n, n).mT
        h = rec.initial(rec.h0, d)
        states = [None] * rec.seq
        for t in rec.steps(d):
            xt = x_only.narrow(0, t, 1).squeeze(0) + wb
            zr = xt.narrow(-1, 0, 2 * n) + h @ r_zr + rb.narrow(0, 0, 2 * n)
            clip = (lambda v: v.clamp(-rec.clip, rec.clip)) if rec.clip is not None else (lambda v: v)
            z_gate, r_gate = f(clip(zr.narrow(-1, 0, n))), f(clip(zr.narrow(-1, n, n)))
            if linear_before_reset:
                hh = xt.narrow(-1, 2 * n, n) + r_gate * (h @ r_h + rb.narrow(0, 2 * n, n))
            else:
                hh = xt.narrow(-1, 2 * n, n) + (r_gate * h) @ r_h + rb.narrow(0, 2 * n, n)
            candidate = g(clip(hh))
            h = (1.0 - z_gate) * candidate + z_gate * h
            states[t] = h
        per_direction.append(states)
        finals.append(h)
    return rec.outputs(per_direction, finals, dtype_of(x))
